/*
 * hta: Holistic Trace Analysis's per-rank analyses (docs/specs/hta-analyses.md §0, §2-§7, §11)
 * over one (run, rank) in PostgreSQL: temporal breakdown, idle time breakdown per stream,
 * comm/comp overlap, GPU kernel breakdown (kernel types and top kernels), CUDA kernel launch
 * statistics, queue length summary and memory bandwidth summary. The bandwidth of a memcpy or
 * memset is the trace's "memory bandwidth (GB/s)" (kept at import); a CUPTI capture has none,
 * so kprof uses bytes / the exact ns duration there and counts those events.
 *
 * HTA compatibility. By default the loader reproduces HTA's pipeline (§0): every time is
 * rounded as HTA rounds fractional-µs traces (start up, end down to whole µs, in float64 like
 * pandas) on the trace's own time base: an imported trace's ts are µs relative to its
 * baseTimeNanoseconds, which the import keeps per rank (ranks.time_base_ns), so the µs HTA
 * rounds are the stored ns minus it (a rank without one: the absolute µs, as HTA reads a
 * trace without a base); and when the run has two or more ProfilerStep names, the rank's CPU rows
 * from its last ProfilerStep's start on are dropped, and with them every GPU row whose correlation
 * has no kept runtime/driver call. kprof's deliberate departures are options: exact_ns keeps
 * kprof's exact ns, include_last_step keeps everything. Kernel classes follow §0 (ncclKernel_*
 * and ncclDevKernel_* are both COMMUNICATION). Gloo collectives run on the CPU and have no
 * GPU rows, so they never appear here.
 *
 * Thread-safety: a struct kp_hta is used by one thread at a time.
 */
#ifndef KP_HTA_H
#define KP_HTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <libpq-fe.h>

#define KP_HTA_CONSECUTIVE_KERNEL_DELAY_NS 30000 /* HTA's default: 30 trace units (µs) */
#define KP_HTA_DURATION_RATIO              0.8
#define KP_HTA_NUM_KERNELS                 10
#define KP_HTA_RUNTIME_CUTOFF_NS           50000
#define KP_HTA_LAUNCH_DELAY_CUTOFF_NS      100000
#define KP_HTA_MAX_QUEUE_LENGTH            1024

struct kp_hta_opts {
    bool exact_ns;          /* kprof: keep exact ns (HTA rounds to whole µs) */
    bool include_last_step; /* kprof: keep the last ProfilerStep (HTA drops it) */
    int64_t consecutive_kernel_delay_ns;
    double duration_ratio; /* kernel breakdown folding (§5) */
    int num_kernels;
};

/* HTA's defaults (HTA-compatible). */
void kp_hta_opts_init(struct kp_hta_opts *o);

enum kp_hta_ktype {
    KP_HTA_COMPUTATION,
    KP_HTA_COMMUNICATION,
    KP_HTA_MEMORY,
    KP_HTA_OTHER,
};

/* "COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER". */
extern const char *const kp_hta_ktype_names[4];

/* The class of a GPU event by its name (§0, first match wins). */
enum kp_hta_ktype kp_hta_kernel_type(const char *name);

enum kp_hta_idle_cat {
    KP_HTA_HOST_WAIT,
    KP_HTA_KERNEL_WAIT,
    KP_HTA_IDLE_OTHER,
};

/* describe() of a sample: count, mean, std (n-1), min, quartiles (linear), max; NaN where
 * pandas gives NaN. Times in ns. */
struct kp_hta_stats {
    size_t count;
    double mean, std, min, q25, q50, q75, max;
};

struct kp_hta_temporal {
    int64_t idle_ns, compute_ns, non_compute_ns, kernel_ns; /* kernel_ns: the window */
    double idle_pct, compute_pct, non_compute_pct;          /* unrounded */
};

struct kp_hta_idle_stream {
    int64_t stream;
    bool present[3];    /* the category occurs on the stream (HTA lists only those) */
    int64_t idle_ns[3]; /* summed gaps per category */
    double ratio[3];    /* share of the stream's idle, NaN when the stream has none */
    struct kp_hta_stats stats[3];
};

struct kp_hta_overlap {
    int64_t comm_ns, overlap_ns;
    double pct; /* overlap ÷ comm × 100; NaN without communication */
};

/* One kernel breakdown row (§5 table 2); after folding, "others" rows describe per-name
 * totals as HTA's do. */
struct kp_hta_kernel_row {
    const char *name; /* borrowed from the struct kp_hta */
    enum kp_hta_ktype type;
    double sum_ns, max_ns, min_ns, mean_ns, std_ns;
};

struct kp_hta_launch_row {
    int64_t correlation, cpu_ns, gpu_ns, delay_ns;
};

struct kp_hta_launch_summary {
    size_t n;
    double cpu_mean_ns, gpu_mean_ns, delay_mean_ns, delay_p50_ns, delay_max_ns;
    size_t n_gpu_shorter;      /* cpu <= runtime cutoff and gpu < cpu */
    size_t n_runtime_outliers; /* cpu > runtime cutoff */
    size_t n_delay_outliers;   /* delay > launch delay cutoff */
};

struct kp_hta_queue_stream {
    int64_t stream;
    struct kp_hta_stats stats; /* queue length at the change points (not ns) */
    int64_t blocked_ns;        /* time at length >= KP_HTA_MAX_QUEUE_LENGTH */
    double blocked_rel;        /* blocked_ns ÷ the rank's trace duration */
};

/* §11: one memory operation kind (HTA's get_memory_kernel_type: "Memcpy DtoD", "Memset",
 * ...); HTA lists a kind only when it has a point > 0. */
struct kp_hta_membw_row {
    const char *name;          /* borrowed from the struct kp_hta */
    struct kp_hta_stats stats; /* of the kind's summed bandwidth at its change points, GB/s */
    size_t events;             /* GPU rows of the kind */
    size_t computed;           /* of them without the trace's figure: bytes / exact ns */
};

struct kp_hta;

/*
 * Loads what the analyses need of (run, rank) and computes them all. Returns 0 and *out
 * (owned: kp_hta_destroy); KP_ENOTFOUND for an unknown run or rank; KP_EPG; -ENOMEM; or
 * -ENODATA when the rank has no GPU events. Message in errbuf. Blocks on PG.
 */
int kp_hta_create(PGconn *c, int64_t run, int rank, const struct kp_hta_opts *opts,
                  struct kp_hta **out, char *errbuf, size_t errlen);

/* Frees h; accepts NULL. */
void kp_hta_destroy(struct kp_hta *h);

/* Results, borrowed from h (valid until kp_hta_destroy). */
const struct kp_hta_temporal *kp_hta_temporal(const struct kp_hta *h);
const struct kp_hta_idle_stream *kp_hta_idle(const struct kp_hta *h, size_t *n);
const struct kp_hta_overlap *kp_hta_overlap(const struct kp_hta *h);
/* Exclusive time per set of kernel types active, indexed by bitmask (1 COMPUTATION,
 * 2 COMMUNICATION, 4 MEMORY); [0] unused. */
const int64_t *kp_hta_type_time(const struct kp_hta *h);
const struct kp_hta_kernel_row *kp_hta_kernels(const struct kp_hta *h, size_t *n);
const struct kp_hta_launch_row *kp_hta_launches(const struct kp_hta *h, size_t *n);
const struct kp_hta_launch_summary *kp_hta_launch_summary(const struct kp_hta *h);
const struct kp_hta_queue_stream *kp_hta_queue(const struct kp_hta *h, size_t *n);
const struct kp_hta_membw_row *kp_hta_membw(const struct kp_hta *h, size_t *n);

/* Whether the rank's last ProfilerStep was dropped (HTA's pipeline, §0). */
bool kp_hta_last_step_dropped(const struct kp_hta *h);

/* The label of a type-time bitmask: "COMPUTATION overlapping COMMUNICATION", ... into buf. */
void kp_hta_type_label(unsigned mask, char *buf, size_t len);

/* Writes one analysis as JSON ("temporal", "idle", "overlap", "kernels", "launch", "queue",
 * "membw"), times in µs, bandwidths in GB/s. Returns 0 or -EINVAL for an unknown analysis. */
int kp_hta_write_json(const struct kp_hta *h, const char *analysis, FILE *f);

#endif
