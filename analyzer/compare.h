/*
 * kp_cmp: the cross-rank comparison of a run (issue 7): which rank holds the job back, and why.
 *
 * Per rank and step (a rank's steps are its ProfilerStep#N ops, else its rows of the steps
 * table (captures), else one step 0 over its kernels):
 *  - step time (end - start);
 *  - collective time: the sum of the durations of the rank's collectives in the step, i.e. its
 *    NCCL kernels (names starting "nccl" that contain "Kernel": ncclKernel_* and
 *    ncclDevKernel_*) and its Gloo ops (op names starting "gloo:");
 *  - compute: the sum of the durations of its other kernels;
 *  - host: the sum of the durations of its data-loading ops (the plugin's DataLoader names:
 *    enumerate(DataLoader)#...__next__, enumerate(DataPipe)#...);
 *  - launch: the sum of the durations of its CUDA runtime calls, synchronizations and waits
 *    (cuda*Synchronize*, cuda*WaitEvent*, cuda*Query*) excluded: the host's cost of issuing
 *    the work;
 *  - other: the sum of the durations of its copies and memsets.
 * A row belongs to the step its row carries (kernels.step, ...; set by captures and
 * kprof-loadgen), else to the rank's step whose [start, end) holds its start (imports).
 * PostgreSQL computes these sums in one pass over each event table of the run (all ranks at
 * once); only the collectives and the step and data-loading ops come back as rows, so memory
 * is a few rows per rank and step, not the run.
 *
 * Matching: the i-th NCCL kernel of step S on one rank (by start time) is the same collective
 * as the i-th NCCL kernel of step S on every other rank; Gloo ops are matched the same way
 * among themselves (a Gloo op is the CPU-side collective: its start is the rank's arrival and
 * the waiting is inside it, as for an NCCL kernel). A collective only some ranks have (a rank
 * with fewer) is compared among the ranks that have it. This assumes every rank issues the
 * same collectives in the same order, which NCCL itself requires within a communicator; with
 * several communicators on separate streams the order by start can differ between ranks, and
 * lateness is then noisy.
 *
 * Clock alignment: every rank's kernel of one collective ends (about) when the last rank
 * arrives plus the transfer, so end times should coincide. A rank's clock offset (its clock
 * minus the reference's, as ranks.clock_offset_ns) is the median, over the collectives it
 * shares with the reference rank (the lowest rank), of (its end - the reference's end); it is
 * subtracted from the rank's collective starts before they are compared. Step times and
 * durations need no alignment. kp_cmp_save_offsets writes them to ranks.clock_offset_ns.
 *
 * Lateness: at collective k, rank r's lateness = its aligned start - the median aligned start
 * over the ranks that have k: how long the rank in the middle waits for r there. A rank's
 * lateness in a step (late_ns) is the sum of its positive lateness over the step's
 * collectives, with the largest one (max_late_ns). Against the median rather than the
 * earliest or the last arrival, it names every late rank: with two stragglers, the slower one
 * makes everyone, the other straggler included, wait inside the collectives, but the other
 * still arrives after the median rank (at least where its own delay is not hidden behind the
 * slower one's transfer), and healthy ranks, which wait, are at the median. Informative only:
 * a collective is decisive when its arrivals spread over KP_CMP_DECISIVE_FRAC (1%) of the
 * step's median step time, and the rank that arrives last, alone, is "last" in it.
 *
 * Excess: per step and cause (compute, host, launch), a rank's time minus the median over the
 * ranks of the same time (the median rank's).
 *
 * Straggler rule (thresholds in struct kp_cmp_opts; kprofctl compare --late-pct etc.):
 *  - rank r is late in step S when (1) its lateness in S exceeds late_frac (2%) of S's median
 *    step time: it does arrive late, and (2) its largest excess in S exceeds excess_frac (5%)
 *    of S's median step time: it spends that much longer than the median rank on compute, data
 *    loading or launches before the collectives. (1) alone does not do: on synthetic DDP runs
 *    the slowest healthy rank of a step (±1.5% compute jitter) arrives up to ~18% of a step
 *    after the median in all, being last at every bucket, while its excess stays under 2%; and
 *    a second, milder straggler behind a worse one arrives only ~6% late, hidden, while its
 *    excess (15% for 1.25x compute) shows. (2) alone does not do either: extra work that does
 *    not delay the collectives (it overlaps them) holds nobody back.
 *  - r is a straggler when it is late in at least step_frac (50%) of the steps it has.
 * A rank late for a reason outside the three causes (a slow link, Python overhead between
 * launches) is not named; its lateness shows in late_ms and the steps' last_rank.
 * Evidence: the steps, its mean lateness over them, its largest at one collective, and per
 * cause its mean time and its mean excess over those steps; the cause is the largest excess.
 * A rank that is not a straggler "waits" when there is a straggler and its median collective
 * time exceeds the latest straggler's by at least half that straggler's lateness.
 *
 * HTA's metric (kp_cmp_hta, spec §9 of docs/specs/hta-analyses.md) is computed apart, on
 * HTA's own terms, so that its call can be checked against HTA's output.
 *
 * Memory: results are owned by the caller (kp_cmp_result_destroy, kp_cmp_hta_destroy).
 * Blocks on PostgreSQL; one caller per connection.
 */
#ifndef KP_COMPARE_H
#define KP_COMPARE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KP_CMP_DEFAULT_LATE_FRAC   0.02
#define KP_CMP_DEFAULT_EXCESS_FRAC 0.05
#define KP_CMP_DEFAULT_STEP_FRAC   0.5
#define KP_CMP_MAX_RANKS           65536
#define KP_CMP_DECISIVE_FRAC       0.01 /* see "Lateness" above */

struct kp_cmp_opts {
    bool has_step;      /* compare only step `step` */
    int64_t step;       /* the N of ProfilerStep#N (or of the recorded step) */
    double late_frac;   /* lateness threshold, a fraction of the step's median step time */
    double excess_frac; /* excess threshold, the same */
    double step_frac;   /* fraction of the compared steps a straggler is late in */
    size_t max_rows;    /* refuse when the queries return more rows in all (0: no limit) */
};

/* Initializes o with the defaults above (every step). */
void kp_cmp_opts_init(struct kp_cmp_opts *o);

enum kp_cmp_cause {
    KP_CMP_COMPUTE,
    KP_CMP_HOST,
    KP_CMP_LAUNCH,
    KP_CMP_CAUSE_COUNT,
};

/* "compute", "host", "launch". */
extern const char *const kp_cmp_cause_names[KP_CMP_CAUSE_COUNT];

/* One rank in one step; times in ns. Absent (present false) when the rank lacks the step. */
struct kp_cmp_cell {
    bool present;
    int64_t step_ns, coll_ns, compute_ns, host_ns, launch_ns, other_ns;
    uint32_t n_coll;    /* decisive collectives matched in the step */
    uint32_t n_last;    /* of which it was last */
    double late_ns;     /* sum of its lateness (after the median arrival) over the step */
    double max_late_ns; /* its largest lateness at one of them */
    double wait_ns;     /* the others' median collective time - its own */
    double excess_ns[KP_CMP_CAUSE_COUNT]; /* its time - the median rank's, per cause */
    bool late;                            /* late in this step by the rule above */
};

struct kp_cmp_rank {
    int rank;
    int64_t clock_offset_ns; /* subtracted from its collective starts */
    bool has_offset;         /* it shares collectives with the reference (or is it) */
    /* medians over the compared steps it has (step, times) and means (lateness) */
    double step_ns, coll_ns, late_ns, compute_ns, host_ns, launch_ns, other_ns;
    double vs_median; /* step_ns / the median rank's - 1 */
    size_t n_late_steps;
    bool straggler, waits;
};

struct kp_cmp_step {
    int64_t step;
    size_t n_ranks;                                 /* ranks that have the step */
    size_t n_coll;                                  /* collectives compared (most on any rank) */
    double step_median_ns, step_max_ns, step_ratio; /* ratio = max / median (0: no median) */
    double coll_median_ns, coll_max_ns, coll_ratio;
    int last_rank; /* the rank last in most of the step's collectives; -1: none */
};

struct kp_cmp_straggler {
    int rank;
    size_t n_steps;     /* steps it is late in */
    int64_t *steps;     /* their numbers */
    double late_ns;     /* mean over those steps of its summed lateness */
    double max_late_ns; /* its largest lateness at one collective in those steps */
    enum kp_cmp_cause cause;
    double own_ns[KP_CMP_CAUSE_COUNT];    /* its mean per step, over those steps */
    double excess_ns[KP_CMP_CAUSE_COUNT]; /* its mean excess over the median rank, the same */
};

struct kp_cmp_result {
    int64_t run;
    size_t n_ranks;
    struct kp_cmp_rank *ranks; /* by rank number */
    size_t n_steps;
    struct kp_cmp_step *steps; /* by step number */
    struct kp_cmp_cell *cells; /* [rank index * n_steps + step index] */
    size_t n_stragglers;
    struct kp_cmp_straggler *stragglers; /* latest first */
    double step_median_ns;               /* median over ranks of kp_cmp_rank.step_ns */
    char verdict[2048];
};

/*
 * Compares the ranks of run `run` over c. Returns 0 and *out (kp_cmp_result_destroy), or
 * KP_ENOTFOUND (no such run, no ranks, or no such step: errbuf says which exist), KP_EPG,
 * KP_ETOOBIG, -ENOMEM, -EINVAL (bad opts), with a message in errbuf.
 */
int kp_cmp_run(PGconn *c, int64_t run, const struct kp_cmp_opts *o, struct kp_cmp_result **out,
               char *errbuf, size_t errlen);

/* Writes r's clock offsets to ranks.clock_offset_ns (the ranks with one: has_offset), in one
 * statement. Returns 0 and *n_saved, or KP_EPG / -ENOMEM with a message in errbuf. */
int kp_cmp_save_offsets(PGconn *c, const struct kp_cmp_result *r, size_t *n_saved, char *errbuf,
                        size_t errlen);

/* Frees a result; NULL is fine. */
void kp_cmp_result_destroy(struct kp_cmp_result *r);

/* Fills idx[0..n_ranks) with indices into r->ranks, slowest step time first (ties by rank).
 * Returns 0 or -ENOMEM. */
int kp_cmp_order(const struct kp_cmp_result *r, size_t *idx);

/* A rank's flag: "straggler", "waits" or "". */
const char *kp_cmp_flag(const struct kp_cmp_rank *rk);

/* Writes r as one JSON object {run, ranks: [...], steps: [...], stragglers: [{rank, steps,
 * late_ms, max_late_ms, cause, excess_ms, excess_ms_by_cause, own_ms_by_cause,
 * median_ms_by_cause}], verdict}, times in ms. */
void kp_cmp_json(FILE *f, const struct kp_cmp_result *r);

/* ---- HTA's straggler metric (get_potential_stragglers) --------------------------------- */

struct kp_cmp_hta_row {
    int rank;
    int64_t step;
    int64_t start_ns, dur_ns; /* relative to t_min / absolute duration */
    double norm_start, norm_dur;
};

struct kp_cmp_hta {
    char *collective; /* the chosen kernel name (owned) */
    int stream;
    double mean_step_ns;
    size_t n_rows;
    struct kp_cmp_hta_row *rows; /* the metric: by step, then rank */
    size_t n_stragglers;
    int *stragglers; /* HTA's list, in its order */
};

/*
 * HTA's straggler call on run `run` with its semantics: steps are ProfilerStep#N ops, the last
 * step (by number, over all ranks) is dropped when there are 2 or more; step (if has_step)
 * restricts to one; CPU rows (ops, runtime calls) belong to the step holding their start,
 * kernels to their launching runtime call's step; candidates are kernels named ncclKernel*
 * (not ncclDevKernel, as HTA) lasting >= 1% of the mean step time; k = num_candidates.
 * Returns 0 and *out (kp_cmp_hta_destroy), KP_ENOTFOUND (no run, fewer than 2 ranks, no step
 * or no candidate kernel), KP_EPG or -ENOMEM, with a message in errbuf.
 */
int kp_cmp_hta(PGconn *c, int64_t run, bool has_step, int64_t step, int num_candidates,
               struct kp_cmp_hta **out, char *errbuf, size_t errlen);

void kp_cmp_hta_destroy(struct kp_cmp_hta *h);

/* Writes h as one JSON object {collective, stream, mean_step_ms, metric: [...], stragglers}. */
void kp_cmp_hta_json(FILE *f, const struct kp_cmp_hta *h);

#endif
