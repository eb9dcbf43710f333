/*
 * kprofctl start --job J [--ranks all|0,3-5] [--steps N | --duration 30s] [--activities LIST]
 *                [--metrics m1,m2] [--name NAME] [--deadline 10m] [--wait] [--json]:
 * starts a capture of a job (Control.StartCapture). collectord creates the run, picks the
 * common start step and arms every selected rank through its agent.
 *
 * The window: --steps N steps (1..100000; collectord's default is 5); --duration D alone is a
 * time window that begins at once; both: N steps, cut short after D. --deadline ends the
 * capture (ranks unfinished then FAILED) after that long; 0: collectord derives it from the
 * job's step rate. --ranks, --steps and --activities are checked here before the call;
 * collectord checks the ranks against the world size (exit 2).
 *
 * Output (stable; tests parse it):
 *   default    stdout: the run id alone and a newline (RUN=$(kprofctl start ...) works);
 *              stderr: "run 17: capturing job ddp-42, ranks 0-3 (4 on 2 hosts), steps
 *              120..124; follow with kprofctl status --run 17 --watch"
 *   --json     stdout: the capture as one JSON object (kp_capview_write_json in capview.h):
 *              run, job, name, run_state, start_step, steps, duration_ms, activities,
 *              created, ended, deadline, stopped, hosts, and ranks: [{rank, host, pid,
 *              state, records, dropped, steps, first_step, last_step, reason}]
 *   --wait     after starting, polls Control.CaptureStatus every 500ms until every rank
 *              is DONE or FAILED, then prints the status table as `kprofctl status` does
 *              (text, --csv, -c, -w); with --json, the final capture object instead.
 *              The summary line still goes to stderr, and a failed rank is named there.
 * --csv, -c and -w shape the --wait table only: without --wait they are a usage error.
 *
 * Exit status (kprofctl.h): 0 started (with --wait: every rank DONE); 1 with --wait a rank
 * FAILED, or collectord refused for another reason (UNIMPLEMENTED: --metrics); 2 bad usage
 * or a request collectord found invalid; 3 unknown job; 4 a selected rank is capturing
 * already; 5 collectord unreachable; 6 a selected rank has no agent attached; 130 ctrl-c
 * during --wait (the capture goes on: stop it with kprofctl stop --run R).
 */
#define KP_LOG_MODULE "start"
#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capview.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_wire.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

#define START_MAX_STEPS   100000
#define START_MAX_METRICS 64
#define START_POLL_MS     500

struct start_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    char *job;
    char *ranks;
    char *steps; /* text: "" is "not given", which an INT row cannot tell from 0 */
    long long duration_ms;
    char *activities;
    char *metrics;
    char *name;
    long long deadline_ms;
    bool wait;
    uint32_t n_steps;                      /* --steps, parsed (0: not given) */
    char *metric_names[START_MAX_METRICS]; /* --metrics, split in place */
    size_t n_metrics;
};

#define OFF(f) offsetof(struct start_config, f)
static const struct kp_config_def start_defs[] = {
    { "job", KP_CONFIG_STRING, "", 1, 4096, OFF(job), "the job to capture (see kprofctl jobs)",
      NULL, false },
    { "ranks", KP_CONFIG_STRING, "all", 1, 65536, OFF(ranks),
      "the ranks to capture: all, or a list such as 0,3-5", NULL, false },
    { "steps", KP_CONFIG_STRING, "", 0, 16, OFF(steps),
      "capture this many training steps, 1..100000 (default 5; with --duration, capped by it)",
      NULL, false },
    { "duration", KP_CONFIG_DURATION, "0", 0, 86400000, OFF(duration_ms),
      "alone: a time window of this long, from now; with --steps: a cap on the window", NULL,
      false },
    { "activities", KP_CONFIG_STRING, "", 0, 1024, OFF(activities),
      "what to record: kernel,memcpy,memset,runtime,nvtx,sync,overhead or all (default all)", NULL,
      false },
    { "metrics", KP_CONFIG_STRING, "", 0, 4096, OFF(metrics),
      "hardware counters m1,m2 (collectord refuses them for now)", NULL, false },
    { "name", KP_CONFIG_STRING, "", 0, 4096, OFF(name), "a name for the run", NULL, false },
    { "deadline", KP_CONFIG_DURATION, "0", 0, 604800000, OFF(deadline_ms),
      "end the capture after this long, ranks unfinished by then FAILED (0: derived from the "
      "job's step rate)",
      NULL, false },
    { "wait", KP_CONFIG_BOOL, "false", 0, 0, OFF(wait),
      "wait until every rank is done or failed, then print the status table", NULL, false },
};
#undef OFF
#define N_DEFS (sizeof(start_defs) / sizeof(start_defs[0]))

/* --steps as a number: 0 when not given. Returns 0 or 2 (message printed). */
static int parse_steps(const struct kp_rpcverb *v, const char *s, uint32_t *out)
{
    unsigned long n = 0;

    *out = 0;
    if (s == NULL || s[0] == '\0') {
        return 0;
    }
    for (const char *p = s; *p != '\0'; p++) {
        if (!isdigit((unsigned char) *p)) {
            return kp_rpcverb_usage_error(v, "--steps=%s: not a number of steps (1..%d)", s,
                                          START_MAX_STEPS);
        }
        n = n * 10 + (unsigned long) (*p - '0');
        if (n > START_MAX_STEPS) {
            break;
        }
    }
    if (n < 1 || n > START_MAX_STEPS) {
        return kp_rpcverb_usage_error(v, "--steps=%s: out of range (1..%d)", s, START_MAX_STEPS);
    }
    *out = (uint32_t) n;
    return 0;
}

/* Splits --metrics (in place) into names. Returns 0 or 2 (message printed). */
static int split_metrics(const struct kp_rpcverb *v, char *s, char **names, size_t *n)
{
    char *p = s;

    *n = 0;
    if (s == NULL || s[0] == '\0') {
        return 0;
    }
    for (;;) {
        char *end = strchr(p, ',');

        if (end != NULL) {
            *end = '\0';
        }
        if (p[0] == '\0') {
            return kp_rpcverb_usage_error(v, "--metrics: an empty name (use m1,m2)");
        }
        if (*n >= START_MAX_METRICS) {
            return kp_rpcverb_usage_error(v, "--metrics: more than %d names", START_MAX_METRICS);
        }
        names[(*n)++] = p;
        if (end == NULL) {
            return 0;
        }
        p = end + 1;
    }
}

/* Checks the flags that kp_config cannot. Returns 0 or 2 (message printed). */
static int check_flags(const struct kp_rpcverb *v, const struct start_config *cfg)
{
    char err[256];
    const char *bad = NULL;
    uint32_t mask;

    if (kp_capview_ranks_check(cfg->ranks, err, sizeof(err)) != 0) {
        return kp_rpcverb_usage_error(v, "--ranks=%s: %s", cfg->ranks, err);
    }
    if (cfg->activities[0] != '\0' && kp_wire_parse_activities(cfg->activities, &mask, &bad) != 0) {
        return kp_rpcverb_usage_error(
            v,
            "--activities=%s: unknown activity \"%.*s\" (use kernel, memcpy, memset, runtime, "
            "nvtx, sync, overhead or all)",
            cfg->activities, bad != NULL ? (int) strcspn(bad, ",") : 0, bad != NULL ? bad : "");
    }
    if (!cfg->wait &&
        (cfg->common.csv || cfg->common.columns[0] != '\0' || cfg->common.width != 0)) {
        return kp_rpcverb_usage_error(v, "--csv, --columns and --width shape the table that "
                                         "--wait prints: add --wait or drop them");
    }
    return 0;
}

/* --wait: polls until the capture is over, then prints it. Returns the exit status. */
static int wait_and_print(struct kp_rpcverb *v, uint64_t run_id)
{
    struct kp_capview_watch w = { .run_id = run_id,
                                  .limit = 1,
                                  .interval_ms = START_POLL_MS,
                                  .show = false,
                                  .title = NULL };
    Kprof__V1__CaptureStatusResponse *last = NULL;
    struct kp_table *t = NULL;
    int rc, r;

    if ((rc = kp_capview_watch(v, &w, &last)) != 0) {
        if (rc == KPROFCTL_EXIT_INTERRUPTED) {
            kp_rpcverb_error(v,
                             "stopped waiting; run %" PRIu64
                             " goes on (kprofctl stop --run %" PRIu64 " ends it)",
                             run_id, run_id);
        }
        goto out;
    }
    if (v->format == KP_TABLE_FORMAT_JSON) {
        for (size_t i = 0; i < last->n_captures && rc == 0; i++) {
            if (kp_capview_write_json(last->captures[i], stdout) != 0) {
                kp_rpcverb_error(v, "writing the capture failed");
                rc = KPROFCTL_EXIT_FAILED;
            }
        }
    }
    else {
        if ((rc = kp_rpcverb_table(v, &t)) != 0) {
            goto out;
        }
        if ((r = kp_capview_add_response(t, last)) != 0) {
            kp_rpcverb_error(v, "%s", kp_strerror(r));
            rc = KPROFCTL_EXIT_FAILED;
            goto out;
        }
        rc = kp_rpcverb_print(v, t, stdout);
    }
    if (rc == 0) {
        kp_capview_report_failures(v, last);
        rc = kp_capview_exit_status(last);
    }
out:
    kp_table_destroy(t);
    if (last != NULL) {
        protobuf_c_message_free_unpacked(&last->base, NULL);
    }
    return rc;
}

/* The flags kp_config cannot check; --steps and --metrics parsed into cfg. */
static int start_check(struct kp_rpcverb *v)
{
    struct start_config *cfg = v->cfg;
    int rc;

    if ((rc = check_flags(v, cfg)) != 0 || (rc = parse_steps(v, cfg->steps, &cfg->n_steps)) != 0 ||
        (rc = split_metrics(v, cfg->metrics, cfg->metric_names, &cfg->n_metrics)) != 0) {
        return rc;
    }
    return KP_RPCVERB_RUN;
}

static int start_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    struct start_config *cfg = v->cfg;
    Kprof__V1__StartCaptureRequest *req = (Kprof__V1__StartCaptureRequest *) msg;

    req->job = cfg->job;
    req->ranks = cfg->ranks;
    req->steps = cfg->n_steps;
    req->duration_ms = (uint64_t) cfg->duration_ms;
    req->activities = cfg->activities;
    req->n_metrics = cfg->n_metrics;
    req->metrics = cfg->metric_names;
    req->name = cfg->name;
    req->deadline_ms = (uint64_t) cfg->deadline_ms;
    snprintf(v->subject, sizeof(v->subject), "job %s, ranks %s", cfg->job, cfg->ranks);
    return 0;
}

/* The run id (or --json the capture), a summary on stderr; --wait then waits and prints. */
static int start_print(struct kp_rpcverb *v, const struct kp_table *t, const ProtobufCMessage *msg)
{
    const struct start_config *cfg = v->cfg;
    const Kprof__V1__Capture *cap = (const Kprof__V1__Capture *) msg;
    char summary[1024];
    uint64_t run_id;

    (void) t;
    if (cap->run == NULL || cap->run->id == 0) {
        kp_rpcverb_error(v, "collectord at %s answered StartCapture without a run",
                         cfg->common.collector);
        return KPROFCTL_EXIT_FAILED;
    }
    run_id = cap->run->id;
    kp_capview_summary(cap, summary, sizeof(summary));
    if (cfg->wait) {
        fprintf(stderr, "%s; waiting for it to end (ctrl-c stops waiting, not the capture)\n",
                summary);
        return wait_and_print(v, run_id);
    }
    fprintf(stderr, "%s; follow with kprofctl status --run %" PRIu64 " --watch\n", summary, run_id);
    if (cfg->common.json) {
        if (kp_capview_write_json(cap, stdout) != 0) {
            kp_rpcverb_error(v, "writing the capture failed");
            return KPROFCTL_EXIT_FAILED;
        }
    }
    else if (printf("%" PRIu64 "\n", run_id) < 0 || fflush(stdout) != 0) {
        kp_rpcverb_error(v, "writing the run id failed");
        return KPROFCTL_EXIT_FAILED;
    }
    return 0;
}

static const struct kp_rpcverb_spec start_spec = {
    .name = "start",
    .synopsis =
        "kprofctl start --job J [--ranks all|0,3-5] [--steps N | --duration 30s]\n"
        "               [--activities kernel,memcpy,...] [--metrics m1,m2] [--name NAME]\n"
        "               [--deadline 10m] [--wait] [--json]\n"
        "  Starts a capture of job J (Control.StartCapture). Prints the run id on stdout\n"
        "  (RUN=$(kprofctl start ...)) and a summary on stderr; --json prints the capture as a\n"
        "  JSON object. --wait then waits for every rank to finish and prints the status table\n"
        "  (as kprofctl status; --csv, -c, -w shape it) or, with --json, the final capture.\n",
    .exit_ok = "started (with --wait: every rank done)",
    .exit_failed = "failed: with --wait a rank FAILED; or collectord refused for another reason "
                   "(e.g. UNIMPLEMENTED: --metrics)",
    .interruptible = true,
    .json_help = "print the capture as one JSON object (with --wait: once it is over)",
    .defs = start_defs,
    .n_defs = N_DEFS,
    .cols = kp_capview_cols,
    .n_cols = KP_CAPVIEW_N_COLS,
    .method = "StartCapture",
    .req_desc = &kprof__v1__start_capture_request__descriptor,
    .resp_desc = &kprof__v1__capture__descriptor,
    .check = start_check,
    .request = start_request,
    .print = start_print,
};

int kprofctl_start(int argc, char **argv)
{
    struct start_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&start_spec, &cfg, argc, argv);
}
