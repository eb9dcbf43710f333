/*
 * kp_compare: the cross-rank comparison of a run: which rank holds the job back, and why. What
 * it measures and how it decides (steps, matching of collectives, clock alignment, lateness,
 * excess, the straggler rule, HTA's metric) is docs/specs/compare.md.
 *
 * Memory: results are owned by the caller (kp_compare_result_destroy, kp_compare_hta_destroy).
 * Blocks on PostgreSQL; one caller per connection.
 */
#ifndef KP_COMPARE_H
#define KP_COMPARE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KP_COMPARE_DEFAULT_LATE_FRAC   0.02
#define KP_COMPARE_DEFAULT_EXCESS_FRAC 0.05
#define KP_COMPARE_DEFAULT_STEP_FRAC   0.5
#define KP_COMPARE_MAX_RANKS           65536
#define KP_COMPARE_DECISIVE_FRAC       0.01 /* see "Lateness" above */

struct kp_compare_opts {
    bool has_step;      /* compare only step `step` */
    int64_t step;       /* the N of ProfilerStep#N (or of the recorded step) */
    double late_frac;   /* lateness threshold, a fraction of the step's median step time */
    double excess_frac; /* excess threshold, the same */
    double step_frac;   /* fraction of the compared steps a straggler is late in */
    size_t max_rows;    /* refuse when the queries return more rows in all (0: no limit) */
};

/* Initializes o with the defaults above (every step). */
void kp_compare_opts_init(struct kp_compare_opts *o);

enum kp_compare_cause {
    KP_COMPARE_COMPUTE,
    KP_COMPARE_HOST,
    KP_COMPARE_LAUNCH,
    KP_COMPARE_CAUSE_COUNT,
};

/* "compute", "host", "launch". */
extern const char *const kp_compare_cause_names[KP_COMPARE_CAUSE_COUNT];

/* One rank in one step; times in ns. Absent (present false) when the rank lacks the step. */
struct kp_compare_cell {
    bool present;
    int64_t step_ns, coll_ns, compute_ns, host_ns, launch_ns, other_ns;
    uint32_t n_coll;    /* decisive collectives matched in the step */
    uint32_t n_last;    /* of which it was last */
    double late_ns;     /* sum of its lateness (after the median arrival) over the step */
    double max_late_ns; /* its largest lateness at one of them */
    double wait_ns;     /* the others' median collective time - its own */
    double excess_ns[KP_COMPARE_CAUSE_COUNT]; /* its time - the median rank's, per cause */
    bool late;                                /* late in this step by the rule above */
    int64_t last_start;   /* the start of its last collective of the step, on its own clock */
    uint32_t n_coll_seen; /* its collectives in the step (last_start is set when > 0) */
};

struct kp_compare_rank {
    int rank;
    int64_t clock_offset_ns; /* subtracted from its collective starts */
    bool has_offset;         /* it shares collectives with the reference (or is it) */
    /* medians over the compared steps it has (step, times) and means (lateness) */
    double step_ns, coll_ns, late_ns, compute_ns, host_ns, launch_ns, other_ns;
    double vs_median; /* step_ns / the median rank's - 1 */
    size_t n_late_steps;
    bool straggler, waits;
    bool late;               /* the rank the others wait for (waited_for), not a straggler */
    double offset_spread_ns; /* interquartile range of its end differences */
    size_t offset_n;         /* the collectives its offset comes from */
    char host[128];          /* "" when unknown */
    int node;                /* its host's index, hosts by lowest rank; -1: unknown */
    int local_rank;          /* -1: unknown */
};

struct kp_compare_step {
    int64_t step;
    size_t n_ranks;                                 /* ranks that have the step */
    size_t n_coll;                                  /* collectives compared (most on any rank) */
    double step_median_ns, step_max_ns, step_ratio; /* ratio = max / median (0: no median) */
    double coll_median_ns, coll_max_ns, coll_ratio;
    int last_rank; /* the rank last in most of the step's collectives; -1: none */
    int hta_rank;  /* the rank whose last collective starts latest (raw clocks); -1: none */
};

struct kp_compare_straggler {
    int rank;
    size_t n_steps;     /* steps it is late in */
    int64_t *steps;     /* their numbers */
    double late_ns;     /* mean over those steps of its summed lateness */
    double max_late_ns; /* its largest lateness at one collective in those steps */
    enum kp_compare_cause cause;
    double own_ns[KP_COMPARE_CAUSE_COUNT];    /* its mean per step, over those steps */
    double excess_ns[KP_COMPARE_CAUSE_COUNT]; /* its mean excess over the median rank, the same */
};

struct kp_compare_result {
    int64_t run;
    size_t n_ranks;
    struct kp_compare_rank *ranks; /* by rank number */
    size_t n_steps;
    struct kp_compare_step *steps; /* by step number */
    struct kp_compare_cell *cells; /* [rank index * n_steps + step index] */
    size_t n_stragglers;
    struct kp_compare_straggler *stragglers; /* latest first */
    double step_median_ns;                   /* median over ranks of kp_compare_rank.step_ns */
    int world_size;                          /* runs.world_size */
    size_t n_missing;
    int *missing;          /* the ranks of the world not in the run, ascending */
    int waited_for;        /* the rank the others wait for; -1: none */
    int hta_rank;          /* the rank HTA's metric names in most steps; -1: none */
    size_t hta_rank_steps; /* in how many steps */
    size_t n_groups;       /* matched collectives compared (in the compared steps) */
    size_t n_p2p;          /* of which point-to-point (SendRecv, send, recv) */
    size_t n_offset_colls; /* matched collectives the offsets come from (every step) */
    size_t n_no_offset;    /* ranks without an offset (their clocks taken as is) */
    char verdict[4096];
};

/*
 * Compares the ranks of run `run` over c. Returns 0 and *out (kp_compare_result_destroy), or
 * KP_ENOTFOUND (no such run, no ranks, or no such step: errbuf says which exist), KP_EPG,
 * KP_ETOOBIG, -ENOMEM, -EINVAL (bad opts), with a message in errbuf.
 */
int kp_compare_result_create(PGconn *c, int64_t run, const struct kp_compare_opts *o,
                             struct kp_compare_result **out, char *errbuf, size_t errlen);

/* Writes r's clock offsets to ranks.clock_offset_ns (the ranks with one: has_offset), in one
 * statement. Returns 0 and *n_saved, or KP_EPG / -ENOMEM with a message in errbuf. */
int kp_compare_save_offsets(PGconn *c, const struct kp_compare_result *r, size_t *n_saved,
                            char *errbuf, size_t errlen);

/* Frees a result; NULL is fine. */
void kp_compare_result_destroy(struct kp_compare_result *r);

/* Fills idx[0..n_ranks) with indices into r->ranks, flagged first (stragglers, latest first,
 * then the rank flagged "late"), then the others slowest step time first (ties by rank).
 * Returns 0 or -ENOMEM. */
int kp_compare_order(const struct kp_compare_result *r, size_t *idx);

/* A rank's flag: "straggler", "late" (the rank the others wait for), "waits" or "". */
const char *kp_compare_flag(const struct kp_compare_rank *rk);

/* Whether a rank holds the others back: flagged "straggler" or "late". */
bool kp_compare_flagged(const struct kp_compare_rank *rk);

/* The ranks shown: kp_compare_order's order, only the flagged ones if flagged, the first top
 * (0: all). Fills idx (n_ranks entries) and returns how many, or -ENOMEM. */
long kp_compare_select(const struct kp_compare_result *r, size_t top, bool flagged, size_t *idx);

/* The index into r->ranks of the rank whose median step time is nearest the median, among
 * the ranks not flagged (any rank when all are); -1 when r has no ranks. */
long kp_compare_median_rank(const struct kp_compare_result *r);

/* Writes r as one JSON object {run, world_size, missing_ranks, ranks: [...], steps: [...],
 * stragglers: [{rank, steps, late_ms, max_late_ms, cause, excess_ms, excess_ms_by_cause,
 * own_ms_by_cause, median_ms_by_cause}], waited_for, hta_rank, ..., next, verdict}, times in
 * ms (the unit in each name); each rank carries its host, node, local_rank, has_offset,
 * clock_offset_spread_ms, offset_collectives and its lateness per step (late_us_by_step, in
 * the order of steps; null where it lacks the step): the rank x step lateness map; next is
 * kp_compare_next's commands, one string each. Every rank, in kp_compare_order's order. */
void kp_compare_json(FILE *f, const struct kp_compare_result *r);

/* The same with only the ranks idx[0..n) (kp_compare_select). */
void kp_compare_json_sel(FILE *f, const struct kp_compare_result *r, const size_t *idx, size_t n);

/* Writes the ascending ranks v[0..n) to buf as ranges ("2..127", "3, 5..9"), truncated with
 * "... (N in all)" to fit cap. Returns 0, or -1 when truncated. */
int kp_compare_ranges(char *buf, size_t cap, const int *v, size_t n);

/* Writes one line on r's clock offsets: how many collectives they come from, their largest
 * spread, the ranks without one; nothing for a single rank. */
void kp_compare_offsets_line(FILE *f, const struct kp_compare_result *r);

/* Writes the next commands to run on r, each line prefixed by indent: the breakdown of its
 * first flagged rank, then on one line the export of that rank and of the median rank
 * (kp_compare_median_rank) joined by &&; nothing when no rank is flagged. */
void kp_compare_next(FILE *f, const struct kp_compare_result *r, const char *indent);

/* ---- HTA's straggler metric (get_potential_stragglers) --------------------------------- */

struct kp_compare_hta_row {
    int rank;
    int64_t step;
    int64_t start_ns, dur_ns; /* relative to t_min / absolute duration */
    double norm_start, norm_dur;
};

struct kp_compare_hta {
    char *collective; /* the chosen kernel name (owned); "" when note is set */
    char note[256];   /* why there is no call (no collectives, one rank); "" otherwise */
    int stream;
    double mean_step_ns;
    size_t n_rows;
    struct kp_compare_hta_row *rows; /* the metric: by step, then rank */
    size_t n_stragglers;
    int *stragglers; /* HTA's list, in its order */
};

/*
 * HTA's straggler call on run `run` with its semantics: steps are ProfilerStep#N ops, the last
 * step (by number, over all ranks) is dropped when there are 2 or more; step (if has_step)
 * restricts to one; CPU rows (ops, runtime calls) belong to the step holding their start,
 * kernels to their launching runtime call's step; candidates are kernels named ncclKernel*
 * (not ncclDevKernel, as HTA) lasting >= 1% of the mean step time; k = num_candidates.
 * Returns 0 and *out (kp_compare_hta_destroy), KP_ENOTFOUND (no run, or no step `step`), KP_EPG
 * or -ENOMEM, with a message in errbuf. A run HTA's metric cannot be computed on (fewer than 2
 * ranks with steps, no candidate ncclKernel) is an answer, not an error: *out has no rows and
 * its note says why ("HTA's straggler metric needs collectives; this run has none").
 */
int kp_compare_hta_create(PGconn *c, int64_t run, bool has_step, int64_t step, int num_candidates,
                          struct kp_compare_hta **out, char *errbuf, size_t errlen);

void kp_compare_hta_destroy(struct kp_compare_hta *h);

/* Writes h as one JSON object {collective, note, stream, mean_step_ms, metric: [...],
 * stragglers}. */
void kp_compare_hta_json(FILE *f, const struct kp_compare_hta *h);

#endif
