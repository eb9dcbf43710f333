/*
 * Compare summaries: what the analyzer's compare reads from a run (analyzer/compare_load.c),
 * computed once when the run ends and stored in the tables of migration 0014
 * (sql/migrations/0014_compare_summaries.sql), so that comparing an ended run reads a few rows
 * per (rank, step) instead of its events. The analyzer reads them only when the run's
 * compare_runs row has its format version (KP_COMPARE_SUMMARY_VERSION), and compares from the
 * events otherwise; so a summary that fails, or that a late batch makes stale (the sink deletes
 * the compare_runs row in the batch's transaction), costs time, never a different answer.
 * The same transaction stores the dashboards' sums (migration 0016: kprof_dash's per-step and
 * per-kernel figures), which count while the run's dash_runs row, bound to its compare_runs
 * row, exists; the dashboards' views read the events otherwise.
 */
#ifndef KP_SUMMARY_H
#define KP_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

/* Counters since the process started, for /metrics. */
struct kp_summary_stats {
    uint64_t made;   /* summaries committed */
    uint64_t failed; /* summaries that failed (the run is then compared from its events) */
    double seconds;  /* time spent making the committed ones */
    uint64_t kernels_compacted; /* kernel rows moved into chunks (kp_compact_kernels) */
    double compact_seconds;     /* time spent moving them */
    uint64_t settled;           /* runs whose partitions kp_settle_run settled */
    double settle_seconds;      /* time spent settling them */
};

/*
 * Summarises run_id, which has ended (ENDED or FAILED), then moves its kernel rows into chunks.
 * The summary is one transaction that first locks the run row FOR NO KEY UPDATE, so that no
 * batch is stored into the run meanwhile (the sink locks it FOR SHARE): what is summarised is
 * every batch stored; it replaces a previous summary and is made while the kernels are still
 * rows (cheaper to read than chunks). The move (kp_compact_kernels, migration 0015; about 3 us
 * a kernel) follows in steps of about 1 M kernels, each its own transaction with the run
 * locked the same way; its failure is logged, and the rows then stay rows. An open run is left
 * alone, and one summarised already in this format (EndRun again) only has its kernel rows
 * moved (returns 0, *secs -1 for both). Blocks on PostgreSQL for about one scan of the run's
 * kernels, ops, API calls, copies and memsets and one sort of its kernel rows. c is borrowed
 * and idle (no transaction open). Returns 0 with the summary's time in *secs, or KP_ENOTFOUND,
 * KP_EPG, -ENOMEM with the reason in errbuf (the summary's transaction rolled back, nothing
 * moved). Last, whatever happened to the move, the run's partitions are settled (kp_settle_run,
 * migration 0017: indexed by rank where they are not, and their planner statistics gathered,
 * so that a read of one rank prunes the others; about one read of the run's events, its own
 * transaction); a failure there is logged and leaves reads correct, only slower. Counts in the
 * stats.
 */
int kp_summary_make(PGconn *c, uint64_t run_id, double *secs, char *errbuf, size_t errlen);

/*
 * The summariser: one worker thread with its own PostgreSQL connection (conninfo, copied;
 * reconnected on demand) that summarises the runs handed to kp_summary_after_end, one at a
 * time, so that a long summary (seconds at a thousand ranks) holds up neither EndRun nor the
 * control requests behind it. Process-wide: kp_summary_start once (kprof-collectord), then
 * kp_summary_stop at shutdown, after whatever calls kp_summary_after_end has stopped. The first
 * start also queues a sweep: every ended run whose kernels are not all in chunks, or that has
 * no summary in this format, is compacted and summarised, oldest first (what a collectord that
 * stopped with runs queued, or an upgrade, left undone).
 * Returns 0, or a negative code with errbuf.
 */
int kp_summary_start(const char *conninfo, char *errbuf, size_t errlen);

/* Stops the summariser: the summary running finishes and a move of kernels stops after its
 * current step; the queued ones are dropped (their runs are compared from the events, and their
 * kernels stay rows, until an EndRun or the next start's sweep does them). Accepts no
 * summariser. */
void kp_summary_stop(void);

/*
 * Summarises run_id, which was just ended, on the path that ended it (after EndRun's answer,
 * after a capture's end): handed to the summariser when one is started (returns at once),
 * else made here on c (idle, borrowed). A failure (a full queue included) is logged once,
 * here or on the summariser, and counted; it never reaches the caller, whose end stands.
 */
void kp_summary_after_end(PGconn *c, uint64_t run_id);

void kp_summary_get_stats(struct kp_summary_stats *out);

#endif
