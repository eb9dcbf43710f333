/*
 * kprofctl stop (--run R | --job J) [--json|--csv] [-c COLS] [-w WIDTH]: ends a capture's
 * window early on every rank (Control.StopCapture). Begun ranks flush what they captured,
 * and the run ends as usual once their rows are stored; follow it with kprofctl status.
 *
 * Output (stable; tests parse --json): the capture's status table, as `kprofctl status`
 * prints it (capview.h): one row per rank with the columns run, job, run_state, rank, host,
 * pid, state, records, dropped, steps, reason; as aligned text, CSV, or (--json) an array of
 * objects keyed by those names. stderr: "run 17: stop requested; ranks flush what they
 * captured (follow with kprofctl status --run 17 --watch)".
 *
 * Exit status (kprofctl.h): 0 stop requested, 2 bad usage (neither or both of --run and
 * --job), 3 no such capture in progress, 5 collectord unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "stop"
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "capview.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct stop_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    long long run;
    char *job;
};

#define OFF(f) offsetof(struct stop_config, f)
static const struct kp_config_def stop_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, LLONG_MAX, OFF(run), "the capture to stop (its run id)", NULL,
      false },
    { "job", KP_CONFIG_STRING, "", 0, 4096, OFF(job), "or: the job whose capture is in progress",
      NULL, false },
};
#undef OFF
#define N_DEFS (sizeof(stop_defs) / sizeof(stop_defs[0]))

static int stop_check(struct kp_rpcverb *v)
{
    const struct stop_config *cfg = v->cfg;

    if ((cfg->run == 0) == (cfg->job[0] == '\0')) {
        return kp_rpcverb_usage_error(v, cfg->run == 0 ? "which capture? give --run R or --job J"
                                                       : "give --run R or --job J, not both");
    }
    return KP_RPCVERB_RUN;
}

static int stop_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct stop_config *cfg = v->cfg;
    Kprof__V1__StopCaptureRequest *req = (Kprof__V1__StopCaptureRequest *) msg;

    req->run_id = (uint64_t) cfg->run;
    req->job = cfg->job;
    if (cfg->run > 0) {
        snprintf(v->subject, sizeof(v->subject), "run %lld", cfg->run);
    }
    else {
        snprintf(v->subject, sizeof(v->subject), "job %s", cfg->job);
    }
    return 0;
}

static int stop_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    (void) v;
    return kp_capview_add_rows(t, (const Kprof__V1__Capture *) msg);
}

/* The table, and on stderr how to follow the ranks' flush. */
static int stop_print(struct kp_rpcverb *v, const struct kp_table *t, const ProtobufCMessage *msg)
{
    const Kprof__V1__Capture *cap = (const Kprof__V1__Capture *) msg;
    uint64_t run = cap->run != NULL ? cap->run->id : 0;
    int rc = kp_rpcverb_print(v, t, stdout);

    if (rc == 0) {
        fprintf(stderr,
                "run %" PRIu64 ": stop requested; ranks flush what they captured (follow with "
                "kprofctl status --run %" PRIu64 " --watch)\n",
                run, run);
    }
    return rc;
}

static const struct kp_rpcverb_spec stop_spec = {
    .name = "stop",
    .synopsis = "kprofctl stop (--run R | --job J) [--json|--csv] [-c COLS] [-w WIDTH]\n"
                "  Ends a capture's window now on every rank (Control.StopCapture); the rows\n"
                "  captured so far are kept. Prints the capture's ranks as kprofctl status does.\n",
    .exit_ok = "stop requested (the ranks then flush; see kprofctl status)",
    .defs = stop_defs,
    .n_defs = N_DEFS,
    .cols = kp_capview_cols,
    .n_cols = KP_CAPVIEW_N_COLS,
    .method = "StopCapture",
    .req_desc = &kprof__v1__stop_capture_request__descriptor,
    .resp_desc = &kprof__v1__capture__descriptor,
    .check = stop_check,
    .request = stop_request,
    .rows = stop_rows,
    .print = stop_print,
};

int kprofctl_stop(int argc, char **argv)
{
    struct stop_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&stop_spec, &cfg, argc, argv);
}
