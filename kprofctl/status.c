/*
 * kprofctl status [--run R] [--limit N] [--watch] [--interval 1s] [--json|--csv] [-c COLS]
 *                 [-w WIDTH]: captures and each rank's state (Control.CaptureStatus). With
 * --run R, that capture (from PostgreSQL once collectord no longer tracks it); without, the
 * captures in progress and the latest ended ones (at most --limit), in collectord's order.
 *
 * Output (stable; tests parse --json): the status table (capview.h): one row per rank of
 * each capture, by rank within a capture, with the columns
 *   run (number), job, run_state (open|ended|failed), rank (number), host, pid (number;
 *   null when unknown), state (pending|capturing|flushing|done|failed|unknown), records,
 *   dropped (numbers), steps ("120-124"; null until known), reason (null unless failed)
 * as aligned text, CSV, or (--json) an array of objects keyed by those names. With no
 * capture, text output is the header alone and a hint goes to stderr.
 *
 * --watch: polls every --interval until every capture shown is over (every rank done or
 * failed, or its run ended). On a terminal the screen is cleared and the table redrawn
 * each time, under a header line; otherwise a table is printed only when it differs from
 * the last, tables separated by one blank line (so --watch --json prints a sequence of
 * arrays). Each failed capture is named on stderr at the end. ctrl-c ends it (exit 130).
 *
 * Exit status (kprofctl.h): without --watch, 0 whenever the status was read, even if ranks
 * failed (read the state column); with --watch, 0 when every capture ended with all ranks
 * done, 1 when one failed, 130 on ctrl-c. 2 bad usage, 3 unknown run (or not a capture),
 * 5 collectord unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "status"
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

struct status_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    long long run;
    long long limit;
    bool watch;
    long long interval_ms;
};

#define OFF(f) offsetof(struct status_config, f)
static const struct kp_config_def status_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, LLONG_MAX, OFF(run),
      "only this capture (0: those in progress and the latest ended ones)", NULL, false },
    { "limit", KP_CONFIG_INT, "20", 1, 1000, OFF(limit),
      "without --run: at most this many captures", NULL, false },
    { "watch", KP_CONFIG_BOOL, "false", 0, 0, OFF(watch),
      "repeat every --interval until every capture shown is over", NULL, false },
    { "interval", KP_CONFIG_DURATION, "1s", 100, 3600000, OFF(interval_ms),
      "with --watch: time between polls", NULL, false },
};
#undef OFF
#define N_DEFS (sizeof(status_defs) / sizeof(status_defs[0]))

/* --watch: polls until every capture shown is over. Returns the exit status. */
static int status_watch(struct kp_rpcverb *v, const struct status_config *cfg)
{
    Kprof__V1__CaptureStatusResponse *last = NULL;
    struct kp_capview_watch w;
    char title[128];
    int rc;

    if (cfg->run > 0) {
        snprintf(title, sizeof(title), "kprofctl status --run %lld", cfg->run);
    }
    else {
        snprintf(title, sizeof(title), "kprofctl status");
    }
    memset(&w, 0, sizeof(w));
    w.run_id = (uint64_t) cfg->run;
    w.limit = (uint32_t) cfg->limit;
    w.interval_ms = cfg->interval_ms;
    w.show = true;
    w.title = title;
    if ((rc = kp_capview_watch(v, &w, &last)) == 0) {
        kp_capview_report_failures(v, last);
        rc = kp_capview_exit_status(last);
    }
    if (last != NULL) {
        protobuf_c_message_free_unpacked(&last->base, NULL);
    }
    return rc;
}

/* Names the run when refused; --watch does its own calls here. */
static int status_check(struct kp_rpcverb *v)
{
    const struct status_config *cfg = v->cfg;

    if (cfg->run > 0) {
        snprintf(v->subject, sizeof(v->subject), "run %lld", cfg->run);
    }
    return cfg->watch ? status_watch(v, cfg) : KP_RPCVERB_RUN;
}

static int status_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct status_config *cfg = v->cfg;
    Kprof__V1__CaptureStatusRequest *req = (Kprof__V1__CaptureStatusRequest *) msg;

    req->run_id = (uint64_t) cfg->run;
    req->limit = (uint32_t) cfg->limit;
    return 0;
}

static int status_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    (void) v;
    return kp_capview_add_response(t, (const Kprof__V1__CaptureStatusResponse *) msg);
}

/* The table; text says on stderr how to start a capture when there is none. */
static int status_print(struct kp_rpcverb *v, const struct kp_table *t, const ProtobufCMessage *msg)
{
    const Kprof__V1__CaptureStatusResponse *resp = (const Kprof__V1__CaptureStatusResponse *) msg;
    int rc = kp_rpcverb_print(v, t, stdout);

    if (rc == 0 && resp->n_captures == 0 && v->format == KP_TABLE_FORMAT_TEXT) {
        fprintf(stderr, "kprofctl status: no capture yet: start one with kprofctl start --job J "
                        "(kprofctl jobs lists the jobs)\n");
    }
    return rc;
}

static const struct kp_rpcverb_spec status_spec = {
    .name = "status",
    .synopsis =
        "kprofctl status [--run R] [--limit N] [--watch] [--interval 1s] [--json|--csv]\n"
        "                [-c COLS] [-w WIDTH]\n"
        "  Captures and each rank's state (Control.CaptureStatus), one row per rank: run,\n"
        "  job, run_state, rank, host, pid, state (pending|capturing|flushing|done|failed),\n"
        "  records, dropped, steps, reason. --watch repeats until every capture shown is over;\n"
        "  on a terminal it redraws in place, otherwise it prints each changed table.\n",
    .exit_ok = "the status was read, even if ranks failed; --watch: every capture over, none "
               "failed",
    .exit_failed = "failed: --watch: a capture shown failed; or collectord refused for another "
                   "reason, or the output failed",
    .interruptible = true,
    .defs = status_defs,
    .n_defs = N_DEFS,
    .cols = kp_capview_cols,
    .n_cols = KP_CAPVIEW_N_COLS,
    .method = "CaptureStatus",
    .req_desc = &kprof__v1__capture_status_request__descriptor,
    .resp_desc = &kprof__v1__capture_status_response__descriptor,
    .check = status_check,
    .request = status_request,
    .rows = status_rows,
    .print = status_print,
};

int kprofctl_status(int argc, char **argv)
{
    struct status_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&status_spec, &cfg, argc, argv);
}
