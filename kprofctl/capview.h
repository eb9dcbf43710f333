/*
 * kp_capview: how kprofctl shows captures (start, stop and status share it): capview.c, and
 * the wait loop kp_capview_watch in capwatch.c.
 *
 * The status table: one row per rank of each capture, captures in collectord's order and
 * each capture's ranks by rank number, with the columns
 *   run (number), job, run_state (open|ended|failed), rank (number), host, pid (number;
 *   null when unknown), state (pending|capturing|flushing|done|failed|unknown), records,
 *   dropped (numbers), steps ("120-124", the rank's window; null until known), reason (why
 *   the rank failed; null when none).
 *
 * The capture object (start --json): see kp_capview_write_json.
 *
 * A capture is over when every rank is DONE or FAILED, or when its run has ended; it
 * failed when it is over and a rank is not DONE or the run FAILED.
 */
#ifndef KPROFCTL_CAPVIEW_H
#define KPROFCTL_CAPVIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kprof.pb-c.h"
#include "rpcverb.h"
#include "table.h"

#define KP_CAPVIEW_MAX_RANK ((1 << 20) - 1) /* collectord's largest world size, less one */

enum kp_capview_col {
    KP_CAPVIEW_COL_RUN,
    KP_CAPVIEW_COL_JOB,
    KP_CAPVIEW_COL_RUN_STATE,
    KP_CAPVIEW_COL_RANK,
    KP_CAPVIEW_COL_HOST,
    KP_CAPVIEW_COL_PID,
    KP_CAPVIEW_COL_STATE,
    KP_CAPVIEW_COL_RECORDS,
    KP_CAPVIEW_COL_DROPPED,
    KP_CAPVIEW_COL_STEPS,
    KP_CAPVIEW_COL_REASON,
    KP_CAPVIEW_N_COLS,
};

/* The status table's columns, for kp_rpcverb_spec.cols. */
extern const struct kp_table_col kp_capview_cols[KP_CAPVIEW_N_COLS];

enum kp_capview_progress {
    KP_CAPVIEW_RUNNING, /* a rank is still pending, capturing or flushing */
    KP_CAPVIEW_DONE,    /* over, every rank DONE */
    KP_CAPVIEW_FAILED,  /* over, a rank FAILED (or never finished) or the run FAILED */
};

/* A rank's state as kprofctl prints it: "pending", "capturing", "flushing", "done",
 * "failed", or "unknown". */
const char *kp_capview_rank_state_name(Kprof__V1__RankState s);

/* Where capture c stands (see the top of this file). */
enum kp_capview_progress kp_capview_progress(const Kprof__V1__Capture *c);

/* Appends one status-table row per rank of c (borrowed), by rank number, to t (a table of
 * kp_capview_cols). Returns 0, -EINVAL or -ENOMEM. */
int kp_capview_add_rows(struct kp_table *t, const Kprof__V1__Capture *c);

/* Appends the rows of every capture of r. Returns as kp_capview_add_rows. */
int kp_capview_add_response(struct kp_table *t, const Kprof__V1__CaptureStatusResponse *r);

/*
 * Writes c as one JSON object and a newline:
 *   {"run": 17, "job": "ddp-42", "name": null, "run_state": "open", "start_step": 120,
 *    "steps": 5, "duration_ms": 0, "activities": "all", "created": "2026-...Z",
 *    "ended": null, "deadline": "2026-...Z", "stopped": false, "hosts": 2,
 *    "ranks": [{"rank": 0, "host": "n1", "pid": 4242, "state": "pending", "records": 0,
 *               "dropped": 0, "steps": null, "first_step": null, "last_step": null,
 *               "reason": null}, ...]}
 * name, reason, host: null when empty; start_step: null for a time window; first_step,
 * last_step, steps (the rank's "120-124"): null until known; pid: null when 0; times
 * ISO-8601 UTC, null when unset; ranks by rank number. Returns 0 or -EIO.
 */
int kp_capview_write_json(const Kprof__V1__Capture *c, FILE *out);

/*
 * The one-line summary of a started capture into buf: "run 17: capturing job ddp-42, ranks
 * 0-3 (4 on 2 hosts), steps 120..124" (", at most 30s" when a duration caps the steps; "for
 * 30s" for a time window). Returns buf.
 */
char *kp_capview_summary(const Kprof__V1__Capture *c, char *buf, size_t cap);

/*
 * Checks a --ranks value: "all", or a comma-separated list of ranks and ranges "0,3-5"
 * (decimal, no blanks, lo <= hi, at most KP_CAPVIEW_MAX_RANK). Returns 0, or -EINVAL with
 * the reason in errbuf ("\"3-1\": a range must go up (e.g. 1-3)").
 */
int kp_capview_ranks_check(const char *s, char *errbuf, size_t errlen);

/* Writes ranks[0..n) (any order, repeats allowed) as a short sorted list ("0-3,5,7-9") into
 * buf, ending in "..." if it does not fit ("" for none). Returns buf. */
char *kp_capview_ranks_format(const int32_t *ranks, size_t n, char *buf, size_t cap);

/* Writes ms as a duration kprofctl also parses ("500ms", "30s", "1m30s", "2h", "1s500ms";
 * "0s" for 0). Returns buf. */
char *kp_capview_duration_format(uint64_t ms, char *buf, size_t cap);

/* 1 if a capture of r FAILED (see kp_capview_progress), else 0: the exit status of a wait
 * that ended. */
int kp_capview_exit_status(const Kprof__V1__CaptureStatusResponse *r);

/* For each capture of r that FAILED, prints "kprofctl VERB: run 17 failed: 1 of 4 ranks
 * did not finish: rank 3 (n2): <reason>" (the first such rank) to stderr. */
void kp_capview_report_failures(const struct kp_rpcverb *v,
                                const Kprof__V1__CaptureStatusResponse *r);

struct kp_capview_watch {
    uint64_t run_id; /* CaptureStatusRequest.run_id: 0 for the recent captures */
    uint32_t limit;  /* with run_id 0 */
    long long interval_ms;
    bool show;         /* print every poll's table (status --watch); else quiet (start --wait) */
    const char *title; /* the header above each redraw on a terminal */
};

/*
 * Polls Control.CaptureStatus every interval_ms until every capture it answers is over.
 * With show, each answer's status table is printed: on a terminal the screen is cleared
 * and redrawn in place (like watch(1)); otherwise the table is printed only when it
 * differs from the last one printed, tables separated by a blank line. SIGINT ends the
 * wait (a second one kills, as by default). Returns 0 and *last (the final answer, owned:
 * protobuf_c_message_free_unpacked) once every capture is over, 130 when interrupted, or
 * the exit status of a failed call or output (message printed). Blocks.
 */
int kp_capview_watch(struct kp_rpcverb *v, const struct kp_capview_watch *w,
                     Kprof__V1__CaptureStatusResponse **last);

#endif
