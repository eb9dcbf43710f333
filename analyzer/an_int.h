/*
 * an_int.h: what the analyzer core's files (an.c and an_*.c) share: the model's structs and
 * the helpers more than one of them uses. Private to those files.
 */
#ifndef KP_AN_INT_H
#define KP_AN_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "an.h"

/* OpKind (proto/kprof.proto). */
enum {
    OPK_CPU_OP = 1,
    OPK_USER_ANNOTATION = 2,
    OPK_GPU_USER_ANNOTATION = 3,
    OPK_PYTHON_FUNCTION = 4,
    OPK_NVTX = 5,
    OPK_PROFILER_STEP = 6,
};

enum dev_kind {
    DEV_KERNEL,
    DEV_MEMCPY,
    DEV_MEMSET
};

/* What a host node is (spec §2.4, §2.7). */
enum node_type {
    NODE_ROOT,
    NODE_OPERATOR,   /* an operator that the op tables list */
    NODE_OTHER_OP,   /* an Operator-category node the op tables leave out */
    NODE_DATALOADER, /* enumerate(DataLoader)#...__next__ */
    NODE_OPTIMIZER,  /* Optimizer.step... */
    NODE_STEP,       /* ProfilerStep#N */
    NODE_COMM,       /* user annotation named as a communication op */
};

struct an_op {
    int64_t start, end, tid, ext;
    int32_t name, shapes, dtypes; /* indexes into names, -1: none */
    uint8_t kind;
};

struct an_rt {
    int64_t start, end, tid, corr, ext;
    int32_t owner;     /* node, -1: dropped */
    int32_t next;      /* next runtime of the same owner */
    int32_t first_dev; /* device events it launched */
    int32_t step;      /* the step containing it, -1: none */
    int64_t dev_ns, tc_ns, kern_ns;
    bool dummy; /* the stand-in runtime of stale kernels */
};

struct an_dev {
    int64_t start, end, corr, ext;
    double bps, occ; /* blocks per SM, est. achieved occupancy %; NaN: unknown */
    int32_t name, rt, next;
    int32_t grid[3], block[3];
    int32_t regs, smem;
    int16_t device; /* -1: none */
    bool has_grid, has_block;
    uint8_t kind;
};

struct an_node {
    int64_t start, end;
    int32_t op; /* -1: root */
    int32_t parent, first_child, last_child, next_sib, n_child;
    int32_t first_rt, last_rt;
    int64_t host_self, dev_self, dev_total, tc_self, tc_total, kern_self;
    bool eligible, eligible_below, dead;
    uint8_t type;
};

struct kp__an_bdsums;

struct an_tid_root {
    int64_t tid;
    int32_t node;
};

struct kp_an {
    struct kp_an_dict names;
    /* per entry of names, for the kernels' names: 2 if kp_an_is_tc_kernel, 1 if not (0: not a
     * kernel's name), computed once a name instead of once a kernel (kp__an_dev_tc) */
    uint8_t *name_tc;
    struct an_op *ops;
    size_t n_ops;
    struct an_rt *rts; /* n_rts + 1 slots: the last may be the dummy runtime */
    size_t n_rts;
    struct an_dev *devs;
    size_t n_devs, n_kernels, n_memcpy, n_memset;
    struct kp_an_step *rec_steps; /* the steps table (a capture's step reports), by start */
    size_t n_rec_steps;
    int64_t prof_start, prof_end; /* the profiler's span (ranks.profiler_*); 0, 0: unknown */

    /* A window's model (kp_an_create_window) takes the whole rank's main thread, which its own
     * ops may not show; a windowed handle (kp_an_create_windowed) holds only its tables (and
     * bd_sums). */
    bool main_set, windowed;
    int64_t main_tid;
    size_t windows;             /* windowed: how many the rank was read in */
    struct kp_an_pool strs;     /* windowed: the tables' strings */
    struct kp_an_tc tc;         /* windowed: the Tensor Core statistics */
    struct kp_an_memory mem;    /* windowed with the memory view: its rows (names in strs) */
    bool mem_done, tables_done; /* windowed: what it was read for (KP_AN_WIN_*) */

    bool built;
    struct an_node *nodes;
    size_t n_nodes;
    struct an_tid_root *roots;
    size_t n_roots;

    struct kp_an_breakdown bd;
    bool bd_done, bd_compat; /* bd holds a figure, and whether it is the plugin's */
    /* windowed with the breakdown: what both figures are made of (an_bdwin.c), owned */
    struct kp__an_bdsums *bd_sums;
    struct kp_an_step *steps;
    struct kp_an_table ops_tab[2], kern_tab[2];
};

/* an.c: loads window w of run `run`, rank `rank` (kp_an_create's contract, the rows restricted
 * to the window). */
int kp__an_create_window(PGconn *c, int64_t run, int rank, size_t max_rows,
                         const struct kp_an_window *w, struct kp_an **out, char *errbuf,
                         size_t errlen);

/* ---- the breakdown's intervals (an_breakdown.c), which the windowed breakdown shares ---- */

/* A list of ranges that grows as it is filled and stands for their union only (it merges
 * itself when full). pushed counts what was pushed, before any merging. Zero-initialised
 * empty; free(r) releases it. */
struct kp__an_rlist {
    struct kp_range *r;
    size_t n, cap, pushed;
};

/* Makes room for at least n ranges in l (its ranges kept); 0 or -ENOMEM. */
int kp__an_rl_reserve(struct kp__an_rlist *l, size_t n);
/* Adds [s, e) to l. 0 or -ENOMEM. */
int kp__an_rl_push(struct kp__an_rlist *l, int64_t s, int64_t e);

/* The breakdown's classes of a rank's (or a window's) intervals: cat[c] for each category c
 * but KP_AN_OTHER, whose list holds instead the kernels that only their name makes a
 * collective's (nccl*Kernel*, gloo*): the plugin counts them as Kernel, kprof as
 * Communication, so a figure decides. Zero-initialised empty; kp__an_bd_sets_fini. */
#define KP__AN_NAMED_COMM KP_AN_OTHER
struct kp__an_bd_sets {
    struct kp__an_rlist cat[KP_AN_CAT_COUNT];
    int64_t *comm_ext; /* the communication ops' external ids, sorted */
    size_t n_comm, n_nccl, n_gloo;
    bool use_dp, use_ddp;
};

/* Adds a's host ops, runtime calls and device events to s by class (a's model built: a
 * kernel's external id is its runtime call's). 0 or -ENOMEM. */
int kp__an_bd_collect(const struct kp_an *a, struct kp__an_bd_sets *s);
void kp__an_bd_sets_fini(struct kp__an_bd_sets *s);

/* A kernel's start or end in the SM efficiency's sweep; kp__an_cmp_sm_ev orders them by time,
 * starts before ends at equal times, then as they were added (which keeps the double sums
 * reproducible). */
struct kp__an_sm_ev {
    int64_t t;
    int start; /* 1: a kernel starts */
    double bps;
    size_t idx;
};
int kp__an_cmp_sm_ev(const void *pa, const void *pb);

/* ---- the breakdown of a rank read by windows (an_bdwin.c) ------------------------------ */

struct kp__an_bdwin;

/* Starts the breakdown of a rank whose host steps (kp__an_build_steps' before they meet the
 * device: the ProfilerStep ops, else the recorded steps) are steps[0..n), by start, each
 * ending before the next starts (the caller checks). 0 or -ENOMEM. */
int kp__an_bdwin_new(const struct kp_an_step *steps, size_t n, struct kp__an_bdwin **out);

/* Adds window a (its model built), whose host events start before t_hi (last: the rank's
 * last window, t_hi unused). Returns 0; 1 where the rank's breakdown cannot be made by these
 * windows (a device event starts before time already summed, a runtime call falls in a step
 * already closed, a device event outside the steps would move the first step's start after
 * it was used): read it whole; or -ENOMEM. */
int kp__an_bdwin_add(struct kp__an_bdwin *b, const struct kp_an *a, int64_t t_hi, bool last);

/* After the last window: moves the steps, the GPUs' figures and the sums into handle h
 * (kp_an_breakdown then answers both figures from them). 0 or -ENOMEM; b is freed either
 * way. */
int kp__an_bdwin_finish(struct kp__an_bdwin *b, struct kp_an *h);
void kp__an_bdwin_free(struct kp__an_bdwin *b);

/* ---- the memory view of a rank read by windows (an_memory.c) ------------------------------ */

struct kp__an_memfold;

/* Starts the memory view's sums for windowed handle h. 0 or -ENOMEM. */
int kp__an_memfold_new(struct kp_an *h, struct kp__an_memfold **out);
/* Adds window a (window w of run `run`, rank `rank`): its memory events' sums per (device,
 * operator name) and its operators' calls per name. 0 or kp_an_memory's errors. */
int kp__an_memfold_add(struct kp__an_memfold *f, struct kp_an *a, PGconn *c, int64_t run, int rank,
                       size_t max_rows, const struct kp_an_window *w, char *errbuf, size_t errlen);
/* After the last window: the view's rows into h->mem (kp_an_memory then answers them). 0 or
 * -ENOMEM. */
int kp__an_memfold_finish(struct kp__an_memfold *f);
void kp__an_memfold_free(struct kp__an_memfold *f);

/* The figure of a windowed handle's breakdown from its sums (kp_an_breakdown's contract). */
int kp__an_bdwin_figure(struct kp_an *a, bool plugin_compat, const struct kp_an_breakdown **out);
void kp__an_bdsums_free(struct kp__an_bdsums *s);

/* A query's filter on the (run, rank) of its parameters $1 and $2. */
#define WHERE_RR " WHERE run_id = $1 AND rank = $2"

struct key_idx {
    int64_t key;
    int32_t idx;
};

/* The name at index idx of a->names ("" for -1). */
static inline const char *kp__an_nm(const struct kp_an *a, int32_t idx)
{
    return idx >= 0 ? a->names.v[idx].s : "";
}

/* Whether device event d is a kernel that uses Tensor Cores by its name (spec §7). */
static inline bool kp__an_dev_tc(const struct kp_an *a, const struct an_dev *d)
{
    return d->kind == DEV_KERNEL &&
           (d->name >= 0 ? a->name_tc[d->name] == 2 : kp_an_is_tc_kernel(""));
}

/* an_names.c */
bool kp__an_is_comm_op(const struct an_op *o, const char *s);
bool kp__an_is_comm_kernel_name(const char *s);
bool kp__an_is_dataloader_name(const char *s);
/* Whether an op of this name is eligible for Tensor Cores (spec §7). */
bool kp__an_is_tc_eligible_op(const char *s);
/* The node type of an op, or -1 if it is not a host node (spec §2.4). */
int kp__an_host_type(const struct kp_an *a, const struct an_op *o);

/* an_tables.c: an operator table's order (by device self time when the rank has device
 * events, else by host self time; then name, shapes), and a kernel table's last step (its
 * means from their sums, tc_used, the order by total time). */
void kp__an_sort_op_rows(struct kp_an_op_row *rows, size_t n, bool by_device);
void kp__an_finish_kernel_rows(struct kp_an_kernel_row *rows, size_t n);

/* an_model.c */
int kp__an_cmp_key_idx(const void *pa, const void *pb);
/* The first entry of v[0..n) (sorted by key) with this key, or NULL. */
const struct key_idx *kp__an_find_key(const struct key_idx *v, size_t n, int64_t key);
/* The root node of thread tid, or -1. */
int32_t kp__an_root_of(const struct kp_an *a, int64_t tid);
int64_t kp__an_dev_ext(const struct kp_an *a, const struct an_dev *d);
/* A step's device events (those its runtime calls launched): their span and count. */
struct kp__an_step_dev {
    int64_t min_start, max_end;
    uint64_t count;
};
/* Stretches host step st over its device events sd, starting no earlier than prev_end (the
 * step before's end). */
void kp__an_step_fit(struct kp_an_step *st, const struct kp__an_step_dev *sd, int64_t prev_end);
/* How many of n fitted steps are left once the tail is trimmed (trailing steps without device
 * events, and a last one with under 0.8 of the one before's); some step has one. */
size_t kp__an_steps_trim(const struct kp__an_step_dev *sd, size_t n);
/* Builds the trees and the per-node statistics (spec §2); then a->built. 0 or -ENOMEM. */
int kp__an_build_model(struct kp_an *a);
/* The steps (spec §3) into a->steps and the breakdown's step list. 0 or -ENOMEM. */
int kp__an_build_steps(struct kp_an *a);

#endif
