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
     * ops may not show; a windowed handle (kp_an_create_windowed) holds only its tables. */
    bool main_set, windowed;
    int64_t main_tid;
    size_t windows;         /* windowed: how many the rank was read in */
    struct kp_an_pool strs; /* windowed: the tables' strings */
    struct kp_an_tc tc;     /* windowed: the Tensor Core statistics */

    bool built;
    struct an_node *nodes;
    size_t n_nodes;
    struct an_tid_root *roots;
    size_t n_roots;

    struct kp_an_breakdown bd;
    bool bd_done, bd_compat; /* bd holds a figure, and whether it is the plugin's */
    struct kp_an_step *steps;
    struct kp_an_table ops_tab[2], kern_tab[2];
};

/*
 * A window of a rank (an_window.c): its host rows (ops, runtime calls) are those that start in
 * [t_lo, t_hi), its device events those whose correlation is in (c_lo, c_hi]; the first window
 * has no lower bounds (and takes correlation 0), the last no upper ones (and takes the device
 * events without a correlation).
 */
struct kp_an_window {
    int64_t t_lo, t_hi, c_lo, c_hi;
    bool first, last;
    int64_t main_tid; /* the rank's main thread (its first ProfilerStep's), if main_set */
    bool main_set;
};

/* Whether a device event of this correlation (null: none) belongs to window w. */
static inline bool kp__an_window_has(const struct kp_an_window *w, bool null, int64_t corr)
{
    if (null) {
        return w->last;
    }
    return (w->first || corr > w->c_lo) && (w->last || corr <= w->c_hi);
}

/* an.c: loads window w of run `run`, rank `rank` (kp_an_create's contract, the rows restricted
 * to the window). */
int kp__an_create_window(PGconn *c, int64_t run, int rank, size_t max_rows,
                         const struct kp_an_window *w, struct kp_an **out, char *errbuf,
                         size_t errlen);

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
/* Builds the trees and the per-node statistics (spec §2); then a->built. 0 or -ENOMEM. */
int kp__an_build_model(struct kp_an *a);
/* The steps (spec §3) into a->steps and the breakdown's step list. 0 or -ENOMEM. */
int kp__an_build_steps(struct kp_an *a);

#endif
