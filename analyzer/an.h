/*
 * kp_an: the analyzer core. It loads one (run, rank) from PostgreSQL into compact
 * arrays and computes on them the PyTorch Profiler TensorBoard plugin's views, as
 * docs/specs/tbplugin-views.md describes them:
 *  - the model (§2-§3): device events ↔ runtime calls by correlation, runtime calls ↔ host
 *    ops by external id, one op tree per thread with duplicate merging, host/device self and
 *    total per node, steps moved to the device side and trimmed at the tail;
 *  - the step-time breakdown (§4) per step and on average, by the priority rule. kprof's
 *    own figure never double-counts; with plugin_compat the plugin's figure is computed
 *    instead: once the categories so far leave no step time free, the next one is taken
 *    unmasked and free time resets to all steps. With it, each GPU's utilization over the
 *    steps (§8) and the rank's computation/communication overlap per step (§9);
 *  - the operator view (§5, §7) grouped by name and by name + input shapes;
 *  - the kernel view (§6) grouped by kernel name and by kernel + launching op;
 *  - the Tensor Core statistics (§7): per-GPU TC kernel share, TC-eligible ops' share;
 *  - the rank's communication nodes (§9), which distributed.h matches across ranks.
 *
 * Steps: ProfilerStep#N ranges, as the plugin; a capture has none, so there the steps it
 * recorded (the `steps` table, from the step hook) are the host-side steps; with neither, one
 * step "0" over the CPU-side events. Blocks per SM and est. achieved occupancy come from the
 * trace (Kineto's figures, kept by import); a capture has none yet.
 *
 * Only runtime-domain API calls are read (the plugin drops cuda_driver), and python_function
 * rows are not host nodes (the rows do not say which are Modules).
 *
 * Memory: kp_an_create holds the rank's rows (about 80 bytes per row plus its names); results
 * are plain structs owned by the kp_an handle and freed with it.
 * Thread-safety: a handle is used by one thread at a time.
 */
#ifndef KP_AN_H
#define KP_AN_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ranges.h"

struct kp_an;

#define KP_AN_MAX_GPUS 64

/* Breakdown categories, in priority order. */
enum kp_an_cat {
    KP_AN_KERNEL,
    KP_AN_MEMCPY,
    KP_AN_MEMSET,
    KP_AN_COMMUNICATION,
    KP_AN_RUNTIME,
    KP_AN_DATALOADER,
    KP_AN_CPU_EXEC,
    KP_AN_OTHER,
    KP_AN_CAT_COUNT
};

/* JSON keys of enum kp_an_cat ("kernel_us", ...). */
extern const char *const kp_an_cat_keys[KP_AN_CAT_COUNT];

struct kp_an_step {
    char name[24];    /* the N of ProfilerStep#N, or "0" without steps */
    int64_t start_ns; /* after the device-side adjustment */
    int64_t end_ns;
    int64_t cost_ns[KP_AN_CAT_COUNT]; /* they sum to end_ns - start_ns */
    /* Computation/communication overlap in the step (spec §9), before priority masking:
     * computation = kernels but communication ones (CPU Exec sources without kernels). */
    int64_t computation_ns, communication_ns, overlap_ns;
};

struct kp_an_point {
    int64_t t_ns;
    double value; /* busy fraction of the bucket */
};

struct kp_an_sm_range {
    int64_t start_ns, end_ns;
    double value; /* min(running blocks per SM, 1) */
};

struct kp_an_breakdown {
    bool has_runtime, has_kernel, has_memcpy_or_memset, has_communication;
    size_t comm_node_count; /* host communication ops (0 when both NCCL and Gloo appear) */
    /* for the recommendations (spec §11, analyzer/an_recommend.h): an NCCL communication op was
     * seen; a DataParallel.forward / DistributedDataParallel.forward op was seen */
    bool comm_nccl, use_dp, use_ddp;
    size_t n_steps;                 /* after tail trimming */
    struct kp_an_step *steps;       /* owned by the handle */
    double avg_ns[KP_AN_CAT_COUNT]; /* mean over steps; 0 without steps */
    double avg_total_ns;
    size_t n_gpus; /* GPUs that ran kernels (kernels' device) */
    int gpu_ids[KP_AN_MAX_GPUS];
    double gpu_utilization[KP_AN_MAX_GPUS]; /* busy / [first step start, last step end] */
    /* spec §8: est. SM efficiency (0-1) and est. achieved occupancy (percent), each only
     * where defined (kernels with the figure inside the window) */
    double est_sm_efficiency[KP_AN_MAX_GPUS];
    bool est_sm_efficiency_defined[KP_AN_MAX_GPUS];
    double est_achieved_occupancy[KP_AN_MAX_GPUS];
    bool est_achieved_occupancy_defined[KP_AN_MAX_GPUS];
    /* spec §8 trace counters per GPU, owned by the handle: the utilization timeline (bucket
     * starts, then the range end with 0) and the SM-efficiency ranges, unclipped */
    struct kp_an_point *util_timeline[KP_AN_MAX_GPUS];
    size_t n_util_points[KP_AN_MAX_GPUS];
    struct kp_an_sm_range *sm_ranges[KP_AN_MAX_GPUS];
    size_t n_sm_ranges[KP_AN_MAX_GPUS];
};

/* The memory view's per-operator statistics (spec §10): one row per (device, op name) with
 * any allocation, by device (CPU, then GPU 0, 1, ...), then in the handle's name order. */
struct kp_an_mem_row {
    int slot;         /* 0: CPU, 1 + n: GPU n */
    const char *name; /* borrowed from the handle */
    int64_t id;       /* the name's (names.id): the rows' order within a slot */
    /* self increase, self alloc bytes, self alloc count, increase, alloc bytes, alloc count
     * (inclusive of the op's children), calls */
    int64_t v[7];
};

struct kp_an_memory {
    bool seen[KP_AN_MAX_GPUS + 1]; /* by slot: the device has memory events */
    struct kp_an_mem_row *rows;    /* owned: kp_an_memory_fini */
    size_t n_rows;
};

/* Computes the memory view of the loaded run and rank into *out, reading memory_events over c
 * (borrowed). Returns 0 or -errno/KP_E* with a message in errbuf (out is then empty). */
int kp_an_memory(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows,
                 struct kp_an_memory *out, char *errbuf, size_t errlen);
void kp_an_memory_fini(struct kp_an_memory *m);

/*
 * Prints the memory view's per-operator statistics (spec §10) of the loaded run and rank as a
 * JSON object {"device_count": n, "devices": {"CPU"|"GPU<n>": {op: {self_increase_bytes,
 * self_alloc_bytes, self_alloc_count, increase_bytes, alloc_bytes, alloc_count, calls}}}},
 * reading memory_events. Borrows c. May block on PG. Returns 0 or -errno/KP_E*.
 */
int kp_an_memory_json(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows, FILE *f,
                      char *errbuf, size_t errlen);

struct kp_an_op_row {
    const char *name;
    const char *input_shape; /* by name: the first op seen of that name */
    uint64_t calls;
    int64_t host_total_ns, host_self_ns, device_total_ns, device_self_ns;
    int64_t tc_self_ns, tc_total_ns; /* Tensor Core kernel time, self and total */
    bool tc_eligible;
    int64_t first_tid, first_start; /* the group's first op, in tree order (windows merge by it) */
};

struct kp_an_kernel_row {
    const char *name;
    const char *op_name;              /* by op only; "CallTreeRoot" for stale or root kernels */
    char grid[48], block[48];         /* by op only; "[x, y, z]" or "None" */
    int64_t registers, shared_memory; /* by op only */
    uint64_t calls;
    int64_t total_ns, min_ns, max_ns;
    bool tc_used, op_tc_eligible;
    /* duration-weighted means (spec §6; a kernel without the figure counts as 0) and the sums
     * they come from (Σ value × duration in ns) */
    double mean_blocks_per_sm, mean_est_achieved_occupancy;
    double wsum_blocks_per_sm, wsum_occupancy;
    int64_t first_start, first_end, first_corr; /* the group's first kernel, in device order */
};

struct kp_an_table {
    size_t n;
    void *rows; /* struct kp_an_op_row or struct kp_an_kernel_row */
};

/* Tensor Core statistics (spec §7). */
struct kp_an_tc {
    size_t n_gpus; /* GPUs that ran kernels (kernels' device) */
    int gpu_ids[KP_AN_MAX_GPUS];
    double tc_ratio[KP_AN_MAX_GPUS];  /* TC kernel time / kernel time, operators' kernels */
    bool tc_ratio_defined;            /* false when no operator launched a kernel */
    double eligible_ops_kernel_ratio; /* bottom TC-eligible ops' / all ops' self kernel time */
    /* the sums the ratios are made of (gpu_ids' order), which windows add up */
    int64_t op_kernel_ns[KP_AN_MAX_GPUS], op_tc_ns[KP_AN_MAX_GPUS];
    int64_t eligible_bottom_ns, eligible_all_ns;
};

/* Loads run `run`, rank `rank` over c. Returns 0 and *out (free with kp_an_destroy), or
 * KP_ENOTFOUND (no such run or rank: the message says which ranks exist), KP_EPG, -ENOMEM,
 * KP_ETOOBIG (over max_rows rows; 0: no limit), with a message in errbuf. */
int kp_an_create(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_an **out,
                 char *errbuf, size_t errlen);

/* What `what` asks (KP_AN_WIN_*, below) of run `run`, rank `rank`, read a window of about
 * window_events host events at a time (an_window.c): the operator and kernel views and the
 * Tensor Core statistics, the step-time breakdown (both figures, an_bdwin.c), the memory view.
 * *out then answers those (kp_an_ops, kp_an_kernels, kp_an_tensor_cores; kp_an_breakdown,
 * whose trace counters, util_timeline and sm_ranges, are then empty; kp_an_memory), and nothing
 * else, with what a whole load would, while no more than a window's rows, the results and a few
 * sums per step are held. Returns 0 with *out (free with kp_an_destroy), or 0 with *out NULL
 * where the rank cannot be read so (no quiet point in its host time, correlations out of launch
 * order, under two windows' worth of events, window_events 0; for the breakdown also: no steps,
 * steps that overlap, device events that start before their window): load it whole. Errors as
 * kp_an_create's. */
int kp_an_create_windowed(PGconn *c, int64_t run, int rank, size_t max_rows, size_t window_events,
                          unsigned what, struct kp_an **out, char *errbuf, size_t errlen);

/* What kp_an_create_windowed computes (what): */
#define KP_AN_WIN_TABLES    1u /* kp_an_ops, kp_an_kernels, kp_an_tensor_cores */
#define KP_AN_WIN_BREAKDOWN 2u /* kp_an_breakdown, both figures */
#define KP_AN_WIN_MEMORY    4u /* kp_an_memory */
#define KP_AN_WIN_ALL       7u

/*
 * A window of a rank (kp_an_plan_windows): its host rows (ops, runtime calls) are those that
 * start in [t_lo, t_hi), its device events those whose correlation is in (c_lo, c_hi]; the
 * first window has no lower bounds (and takes correlation 0), the last no upper ones (and takes
 * the device events without a correlation).
 */
struct kp_an_window {
    int64_t t_lo, t_hi, c_lo, c_hi;
    bool first, last;
    bool has_calls; /* runtime calls start in it */
    /* its API calls (by correlation, any domain) start in [calls_lo, calls_hi): bounds by time
     * that let a query of them read a few windows' pages (INT64_MIN, INT64_MAX: none) */
    int64_t calls_lo, calls_hi;
    int64_t main_tid; /* the rank's main thread (its first ProfilerStep's), if main_set */
    bool main_set;
};

/* Whether a device event of this correlation (null: none) belongs to window w. */
static inline bool kp_an_window_has(const struct kp_an_window *w, bool null, int64_t corr)
{
    if (null) {
        return w->last;
    }
    return (w->first || corr > w->c_lo) && (w->last || corr <= w->c_hi);
}

/* Window w as SQL conditions to append to a WHERE on (run, rank): host (start_ns of ops and API
 * calls), dev (correlation of kernel_rows, memcpys, memsets) and chunk (kernel_chunks: those
 * that may hold one of its kernels; the unnested kernels then go through kp_an_window_has).
 * Each buffer as sized; "" where w has no bound. */
void kp_an_window_sql(const struct kp_an_window *w, char host[static 96], char dev[static 128],
                      char chunk[static 192]);
/* Its API calls of any domain (by correlation, with the time bounds that make the query cheap)
 * as conditions to append, into calls. */
void kp_an_window_calls_sql(const struct kp_an_window *w, char calls[static 256]);

/* Cuts run `run`, rank `rank` into windows of about window_events host events each, at quiet
 * points of its host time (an_window.c); with whole_steps only between steps: where no step of
 * the steps table spans the cut either (ProfilerStep ops are host events: no cut ever falls
 * inside one), and not at all in a rank with neither.
 * Returns 0 with *w (free) and *n >= 2, or 0 with *n 0 where the rank cannot be cut (no quiet
 * point after the first window_events, correlations not in launch order across a cut, no steps
 * with whole_steps); KP_EPG
 * or -ENOMEM with a message. */
int kp_an_plan_windows(PGconn *c, int64_t run, int rank, size_t window_events, bool whole_steps,
                       struct kp_an_window **w, size_t *n, char *errbuf, size_t errlen);

/* How many windows a was read in (1: loaded whole). */
size_t kp_an_windows(const struct kp_an *a);

/* Shared by the analyzer's loaders (kp_analyzer, pyprof, hta, counters, ...). */

/* The names a rank's rows refer to (names.id -> text), sorted by id. */
struct kp_an_name {
    int64_t id;
    char *s;
};
struct kp_an_dict {
    struct kp_an_name *v;
    size_t n;
};

/* Loads d from sql, which selects (id, name) ordered by id over params[0..1] (run, rank),
 * counting its rows against the budget like kp_an_query. Returns 0 or a kp_an_query error,
 * or -ENOMEM; d is then empty (kp_an_dict_fini still safe). */
int kp_an_dict_load(PGconn *c, const char *sql, const char *const *params, size_t *budget,
                    size_t max_rows, struct kp_an_dict *d, char *errbuf, size_t errlen);

/* Fills d with the names of ids[0..n) (any order, repeats; ids <= 0 skipped), sorted by id,
 * from the process's names cache (an.c: names rows are only ever added), reading over c only
 * the ids it has not seen yet. Ids without a names row are left out. Thread-safe. Returns 0,
 * KP_EPG or -ENOMEM (d then empty); free d with kp_an_dict_fini. */
int kp_an_names_for(PGconn *c, const int32_t *ids, size_t n, struct kp_an_dict *d, char *errbuf,
                    size_t errlen);

/* The index of id in d, or -1. */
int32_t kp_an_dict_find(const struct kp_an_dict *d, int64_t id);

void kp_an_dict_fini(struct kp_an_dict *d);

/* One snapshot for a rank's kernels, which come in two statements (kernel_rows' rows, then
 * kernel_chunks' arrays) while collectord may move them from one to the other (migration 0015):
 * kp_an_snapshot_begin opens a REPEATABLE READ, READ ONLY transaction on c unless one is open
 * already (*began says which; 0 or KP_EPG), kp_an_snapshot_end closes the one it opened
 * (COMMIT when rc is 0, else ROLLBACK; a failure of either leaves a broken connection, which
 * the service replaces). */
int kp_an_snapshot_begin(PGconn *c, bool *began, char *errbuf, size_t errlen);
void kp_an_snapshot_end(PGconn *c, bool began, int rc);

/* Runs sql with n_params text parameters and counts its rows against a budget: returns 0 and
 * *out (PQclear), KP_ETOOBIG past max_rows rows in all (0: no limit; the message says to raise
 * the limit), or KP_EPG. */
int kp_an_query(PGconn *c, int n_params, const char *sql, const char *const *params, size_t *budget,
                size_t max_rows, PGresult **out, char *errbuf, size_t errlen);

/* Checks that run params[0] has rank params[1] (run and rank as text, and as numbers for the
 * message): 0, KP_ENOTFOUND with a message that says what to do, or KP_EPG. */
int kp_an_check_rank(PGconn *c, const char *const *params, int64_t run, int rank, char *errbuf,
                     size_t errlen);

/* Frees a handle and every result it owns; NULL is fine. */
void kp_an_destroy(struct kp_an *a);

/* Builds the model (trees, steps) and the breakdown; plugin_compat picks the plugin's
 * double-counting figure and its classes: a kernel is Communication only when an nccl:* /
 * gloo:* op of its external id launched it. Without plugin_compat a kernel named as a
 * collective's (nccl*Kernel*, as compare counts them, or gloo*) is Communication too. Returns 0 or
 * -ENOMEM; the result stays valid until the next call for the other figure or kp_an_destroy (a
 * call for the figure it holds returns it as it is). */
int kp_an_breakdown(struct kp_an *a, bool plugin_compat, const struct kp_an_breakdown **out);

/* One communication node (spec §9): a communication op, keyed by its external id (an op
 * without one is a node of its own), with its intervals: the op's span and, for NCCL, the
 * spans of the kernels of the same external id, sorted by (start, end descending). */
struct kp_an_comm_node {
    const char *name;         /* nccl:all_reduce, ...; borrowed from the handle */
    const char *input_shapes; /* as stored ("[[53120]]"), NULL: none; borrowed */
    const char *input_dtypes; /* as stored ("['float']"), NULL: none; borrowed */
    int64_t ext;              /* external id, 0: none */
    int64_t start_ns, end_ns; /* the op's span */
    int32_t step;             /* index into the breakdown's steps; -1: in none */
    size_t first, n;          /* its intervals: ranges[first .. first + n) */
};

struct kp_an_comm {
    bool nccl, gloo; /* whose ops appear; both: no nodes (the plugin disables the view) */
    size_t n_nodes;
    struct kp_an_comm_node *nodes; /* by (start, end descending) */
    struct kp_range *ranges;
};

/* Fills *out (free with kp_an_comm_fini; strings borrowed from a) with the rank's
 * communication nodes, each assigned to the first step that contains it (the plugin's walk).
 * Call after kp_an_breakdown (either figure: the steps are the same). Returns 0, -EINVAL
 * before kp_an_breakdown, or -ENOMEM (out is then empty). */
int kp_an_comm_nodes(struct kp_an *a, struct kp_an_comm *out);
void kp_an_comm_fini(struct kp_an_comm *c);

/* The operator view, by name (by_shape false) or by name and input shapes, sorted as the
 * plugin sorts it. Returns 0 or -ENOMEM; rows are struct kp_an_op_row. */
int kp_an_ops(struct kp_an *a, bool by_shape, const struct kp_an_table **out);

/* The kernel view, by kernel name (by_op false) or by kernel and launching op, sorted by
 * total time. Returns 0 or -ENOMEM; rows are struct kp_an_kernel_row. */
int kp_an_kernels(struct kp_an *a, bool by_op, const struct kp_an_table **out);

/* Fills *out with the Tensor Core statistics. Returns 0 or -ENOMEM. */
int kp_an_tensor_cores(struct kp_an *a, struct kp_an_tc *out);

/* Writes a result as one JSON object, times in µs. */
void kp_an_breakdown_json(FILE *f, const struct kp_an_breakdown *b);
void kp_an_ops_json(FILE *f, const struct kp_an_table *t);
void kp_an_kernels_json(FILE *f, const struct kp_an_table *t, bool by_op);
void kp_an_tc_json(FILE *f, const struct kp_an_tc *t);

/* A JSON piece the analyzer's other writers share: a time in ns as µs (exact decimals).
 * Strings: kp_json_fputs() (kp_json.h). */
void kp_an_json_us(FILE *f, int64_t ns);

/* FNV-1a of a string: the analyzer's hash tables of text (PyProf's pool, the kernel table's
 * groups). */
static inline uint64_t kp_an_str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;

    for (; *s; s++) {
        h = (h ^ (uint8_t) *s) * 1099511628211ull;
    }
    return h;
}

/* A set of strings, each kept once (the analyzer's tables' text columns: PyProf's rows, the
 * windowed tables). Zero-initialised empty; owns its copies until kp_an_pool_fini. */
struct kp_an_pool {
    char **slot; /* open addressing over a power of two: a copy, or NULL */
    size_t cap, n;
};

/* s's copy in pl (made on first sight), or NULL without memory. */
const char *kp_an_pool_intern(struct kp_an_pool *pl, const char *s);
void kp_an_pool_fini(struct kp_an_pool *pl);

/* Returns whether a kernel name marks a Tensor Core kernel (spec §7). */
bool kp_an_is_tc_kernel(const char *name);

#endif
