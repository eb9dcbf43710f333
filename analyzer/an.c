/*
 * kp_analyzer: loader, model and views (see an.h).
 *
 * DESIGN. The loader reads each table of the (run, rank) with one ordered query into flat
 * arrays; names are resolved once to indexes into one id-sorted array. The model then links
 * the arrays by index: each device event to its runtime call (correlation, through a sorted
 * index), each runtime call to the host node that owns it (external id, through a sorted
 * index of the nodes in tree order), and every host node into its thread's tree (a stack
 * over the ops sorted by thread, start, end descending). Nodes are created parent first, so
 * walking them backwards is a post-order walk: the bottom-up statistics need no recursion.
 * Everything the views need is in struct kp_an; no view queries PostgreSQL again.
 */
#define _GNU_SOURCE /* qsort_r */
#include "an.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

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
    struct an_op *ops;
    size_t n_ops;
    struct an_rt *rts; /* n_rts + 1 slots: the last may be the dummy runtime */
    size_t n_rts;
    struct an_dev *devs;
    size_t n_devs, n_kernels, n_memcpy, n_memset;
    struct kp_an_step *rec_steps; /* the steps table (a capture's step reports), by start */
    size_t n_rec_steps;
    int64_t prof_start, prof_end; /* the profiler's span (ranks.profiler_*); 0, 0: unknown */

    bool built;
    struct an_node *nodes;
    size_t n_nodes;
    struct an_tid_root *roots;
    size_t n_roots;

    struct kp_an_breakdown bd;
    struct kp_an_step *steps;
    struct kp_an_table ops_tab[2], kern_tab[2];
};

const char *const kp_an_cat_keys[KP_AN_CAT_COUNT] = {
    "kernel_us",  "memcpy_us",     "memset_us",   "communication_us",
    "runtime_us", "dataloader_us", "cpu_exec_us", "other_us",
};

/* ---- loading ------------------------------------------------------------------------- */

static int cmp_name_id(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = ((const struct kp_an_name *) pb)->id;

    return a < b ? -1 : a > b;
}

int32_t kp_an_dict_find(const struct kp_an_dict *d, int64_t id)
{
    const struct kp_an_name *n = bsearch(&id, d->v, d->n, sizeof(*d->v), cmp_name_id);

    return n ? (int32_t) (n - d->v) : -1;
}

int kp_an_dict_load(PGconn *c, const char *sql, const char *const *params, size_t *budget,
                    size_t max_rows, struct kp_an_dict *d, char *errbuf, size_t errlen)
{
    PGresult *r = NULL;
    size_t n;
    int rc = kp_an_query(c, 2, sql, params, budget, max_rows, &r, errbuf, errlen);

    if (rc < 0) {
        return rc;
    }
    n = (size_t) PQntuples(r);
    d->v = calloc(n ? n : 1, sizeof(*d->v));
    if (!d->v) {
        PQclear(r);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        d->v[i].id = kp_pg_i64(r, (int) i, 0, 0);
        d->v[i].s = strdup(PQgetvalue(r, (int) i, 1));
        if (!d->v[i].s) {
            PQclear(r);
            kp_an_dict_fini(d);
            return -ENOMEM;
        }
        d->n++;
    }
    PQclear(r);
    return 0;
}

void kp_an_dict_fini(struct kp_an_dict *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->v[i].s);
    }
    free(d->v);
    d->v = NULL;
    d->n = 0;
}

/* The index of name id col in a->names, or -1 for NULL or an unknown id. */
static int32_t name_idx(const struct kp_an *a, const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? -1 : kp_an_dict_find(&a->names, kp_pg_i64(r, row, col, 0));
}

static const char *nm(const struct kp_an *a, int32_t idx)
{
    return idx >= 0 ? a->names.v[idx].s : "";
}

int kp_an_query(PGconn *c, int n_params, const char *sql, const char *const *params, size_t *budget,
                size_t max_rows, PGresult **out, char *errbuf, size_t errlen)
{
    size_t n;
    int rc;

    *out = NULL; /* a failed query leaves no stale result for the caller's cleanup */
    rc = kp_pg_query(c, sql, n_params, params, out, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    n = (size_t) PQntuples(*out);
    if (max_rows && n > max_rows - *budget) {
        kp_errbuf_set(errbuf, errlen, "the rank has more than %zu rows: raise the row limit",
                      max_rows);
        PQclear(*out);
        *out = NULL;
        return KP_ETOOBIG;
    }
    *budget += n;
    return 0;
}

int kp_an_check_rank(PGconn *c, const char *const *params, int64_t run, int rank, char *errbuf,
                     size_t errlen)
{
    PGresult *r = NULL;
    int rc;

    rc = kp_pg_query(c, "SELECT count(*) FROM runs WHERE id = $1", 1, params, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    if (kp_pg_i64(r, 0, 0, 0) == 0) {
        PQclear(r);
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " does not exist: `kprofctl runs` lists "
                      "the runs",
                      run);
        return KP_ENOTFOUND;
    }
    PQclear(r);
    rc = kp_pg_query(c,
                     "SELECT coalesce(string_agg(rank::text, ',' ORDER BY rank), ''), "
                     "count(*) FILTER (WHERE rank = $2) FROM ranks WHERE run_id = $1",
                     2, params, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    if (kp_pg_i64(r, 0, 1, 0) == 0) {
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " has no rank %d: pick one of its ranks (%s) with --rank", run,
                      rank, PQgetvalue(r, 0, 0)[0] ? PQgetvalue(r, 0, 0) : "none");
        PQclear(r);
        return KP_ENOTFOUND;
    }
    PQclear(r);
    return 0;
}

#define WHERE_RR " WHERE run_id = $1 AND rank = $2"

int kp_an_create(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_an **out,
                 char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    struct kp_an *a;
    PGresult *r = NULL;
    size_t budget = 0, n;
    int rc;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    rc = kp_an_check_rank(c, params, run, rank, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    a = calloc(1, sizeof(*a));
    if (!a) {
        return -ENOMEM;
    }

    rc = kp_an_dict_load(c,
                         "SELECT id, name FROM names WHERE id IN (SELECT name FROM kernels" WHERE_RR
                         " UNION SELECT name FROM ops" WHERE_RR
                         " UNION SELECT input_shapes FROM ops" WHERE_RR
                         " UNION SELECT input_dtypes FROM ops" WHERE_RR ") ORDER BY id",
                         params, &budget, max_rows, &a->names, errbuf, errlen);
    if (rc == -ENOMEM) {
        goto nomem;
    }
    if (rc < 0) {
        goto fail;
    }

    rc = kp_an_query(
        c, 2,
        "SELECT start_ns, dur_ns, tid, external_id, name, input_shapes, kind, input_dtypes "
        "FROM ops" WHERE_RR " ORDER BY tid, start_ns, dur_ns DESC",
        params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    n = (size_t) PQntuples(r);
    a->ops = calloc(n ? n : 1, sizeof(*a->ops));
    if (!a->ops) {
        goto nomem;
    }
    for (size_t i = 0; i < n; i++) {
        struct an_op *o = &a->ops[i];
        int row = (int) i;

        o->start = kp_pg_i64(r, row, 0, 0);
        o->end = o->start + kp_pg_i64(r, row, 1, 0);
        o->tid = kp_pg_i64(r, row, 2, 0);
        o->ext = kp_pg_i64(r, row, 3, 0);
        o->name = name_idx(a, r, row, 4);
        o->shapes = name_idx(a, r, row, 5);
        o->kind = (uint8_t) kp_pg_i64(r, row, 6, 0);
        o->dtypes = name_idx(a, r, row, 7);
    }
    a->n_ops = n;
    PQclear(r);

    /* Runtime calls only: the plugin drops cuda_driver (spec §1). */
    rc =
        kp_an_query(c, 2,
                    "SELECT start_ns, dur_ns, tid, correlation, external_id FROM api_calls" WHERE_RR
                    " AND domain = 1 ORDER BY start_ns, dur_ns DESC",
                    params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    n = (size_t) PQntuples(r);
    a->rts = calloc(n + 1, sizeof(*a->rts));
    if (!a->rts) {
        goto nomem;
    }
    for (size_t i = 0; i < n; i++) {
        struct an_rt *t = &a->rts[i];
        int row = (int) i;

        t->start = kp_pg_i64(r, row, 0, 0);
        t->end = t->start + kp_pg_i64(r, row, 1, 0);
        t->tid = kp_pg_i64(r, row, 2, 0);
        t->corr = kp_pg_i64(r, row, 3, 0);
        t->ext = kp_pg_i64(r, row, 4, 0);
    }
    a->n_rts = n;
    PQclear(r);

    /* The occupancy side table is joined by key. Right after an import PostgreSQL has no
     * statistics on the new partitions yet, estimates one row on each side and picks a nested
     * loop that re-aggregates the side table for every kernel: 25 s instead of 25 ms on a
     * resnet50 rank. A hash join is right at every size here, so say so (export does too). */
    rc = kp_pg_exec(c, "SET enable_nestloop = off", errbuf, errlen);
    if (rc != 0) {
        goto fail;
    }
    rc = kp_an_query(
        c, 2,
        "SELECT 0, start_ns, dur_ns, correlation, external_id, name, grid_x, grid_y, "
        "grid_z, block_x, block_y, block_z, registers, "
        "static_smem::bigint + coalesce(dynamic_smem, 0), device, o.blocks_per_sm, "
        "o.est_occupancy FROM kernels" KP_SQL_KERNEL_OCCUPANCY_JOIN("$1", "$2") WHERE_RR
        " UNION ALL SELECT 1, start_ns, dur_ns, correlation, external_id, NULL, NULL, "
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM memcpys" WHERE_RR
        " UNION ALL SELECT 2, start_ns, dur_ns, correlation, external_id, NULL, NULL, "
        "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM memsets" WHERE_RR
        " ORDER BY 2, 3 DESC",
        params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    {
        char ignored[128];

        (void) kp_pg_exec(c, "RESET enable_nestloop", ignored, sizeof(ignored));
    }
    n = (size_t) PQntuples(r);
    a->devs = calloc(n ? n : 1, sizeof(*a->devs));
    if (!a->devs) {
        goto nomem;
    }
    for (size_t i = 0; i < n; i++) {
        struct an_dev *d = &a->devs[i];
        int row = (int) i;

        d->kind = (uint8_t) kp_pg_i64(r, row, 0, 0);
        d->start = kp_pg_i64(r, row, 1, 0);
        d->end = d->start + kp_pg_i64(r, row, 2, 0);
        d->corr = kp_pg_i64(r, row, 3, 0);
        d->ext = kp_pg_i64(r, row, 4, 0);
        d->name = name_idx(a, r, row, 5);
        d->has_grid = !PQgetisnull(r, row, 6);
        d->has_block = !PQgetisnull(r, row, 9);
        for (int k = 0; k < 3; k++) {
            d->grid[k] = (int32_t) kp_pg_i64(r, row, 6 + k, 0);
            d->block[k] = (int32_t) kp_pg_i64(r, row, 9 + k, 0);
        }
        d->regs = (int32_t) kp_pg_i64(r, row, 12, 0);
        d->smem = (int32_t) kp_pg_i64(r, row, 13, 0);
        d->device = PQgetisnull(r, row, 14) ? -1 : (int16_t) kp_pg_i64(r, row, 14, 0);
        d->bps = PQgetisnull(r, row, 15) ? NAN : strtod(PQgetvalue(r, row, 15), NULL);
        d->occ = PQgetisnull(r, row, 16) ? NAN : strtod(PQgetvalue(r, row, 16), NULL);
        d->rt = -1;
        d->next = -1;
        if (d->kind == DEV_KERNEL) {
            a->n_kernels++;
        }
        else if (d->kind == DEV_MEMCPY) {
            a->n_memcpy++;
        }
        else {
            a->n_memset++;
        }
    }
    a->n_devs = n;
    PQclear(r);

    /* Recorded steps: a capture has no ProfilerStep ops but reports its steps (the hook) */
    rc = kp_an_query(c, 2, "SELECT step, start_ns, dur_ns FROM steps" WHERE_RR " ORDER BY start_ns",
                     params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    n = (size_t) PQntuples(r);
    a->rec_steps = calloc(n ? n : 1, sizeof(*a->rec_steps));
    if (!a->rec_steps) {
        goto nomem;
    }
    for (size_t i = 0; i < n; i++) {
        struct kp_an_step *st = &a->rec_steps[i];

        snprintf(st->name, sizeof(st->name), "%" PRId64, kp_pg_i64(r, (int) i, 0, 0));
        st->start_ns = kp_pg_i64(r, (int) i, 1, 0);
        st->end_ns = st->start_ns + kp_pg_i64(r, (int) i, 2, 0);
    }
    a->n_rec_steps = n;
    PQclear(r);

    /* The profiler's span ("PyTorch Profiler (0)", kept by import): the timeline's range */
    rc = kp_an_query(c, 2,
                     "SELECT profiler_start_ns, profiler_end_ns FROM ranks" WHERE_RR
                     " AND profiler_start_ns >= 0 AND profiler_end_ns > profiler_start_ns",
                     params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    if (PQntuples(r) == 1) {
        a->prof_start = kp_pg_i64(r, 0, 0, 0);
        a->prof_end = kp_pg_i64(r, 0, 1, 0);
    }
    PQclear(r);
    *out = a;
    return 0;

nomem:
    rc = -ENOMEM;
    kp_errbuf_set(errbuf, errlen, "out of memory loading run %" PRId64 " rank %d", run, rank);
fail:
    PQclear(r);
    kp_an_destroy(a);
    return rc;
}

void kp_an_destroy(struct kp_an *a)
{
    if (!a) {
        return;
    }
    kp_an_dict_fini(&a->names);
    free(a->ops);
    free(a->rts);
    free(a->devs);
    free(a->rec_steps);
    free(a->nodes);
    free(a->roots);
    free(a->steps);
    for (int i = 0; i < KP_AN_MAX_GPUS; i++) {
        free(a->bd.util_timeline[i]);
        free(a->bd.sm_ranges[i]);
    }
    for (int i = 0; i < 2; i++) {
        free(a->ops_tab[i].rows);
        free(a->kern_tab[i].rows);
    }
    free(a);
}

/* ---- names --------------------------------------------------------------------------- */

static bool is_comm_name(const char *s)
{
    static const char *const ops[] = { "broadcast", "reduce", "all_reduce", "all_gather",
                                       "reduce_scatter" };
    const char *rest;

    if (strncmp(s, "nccl:", 5) == 0 || strncmp(s, "gloo:", 5) == 0) {
        rest = s + 5;
    }
    else {
        return false;
    }
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (strcmp(rest, ops[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether op o (named s) is a communication op: a host op named as one, or in a capture
 * NCCL's own NVTX range (nccl:all_reduce, ...). */
static bool is_comm_op(const struct an_op *o, const char *s)
{
    return (o->kind == OPK_CPU_OP || o->kind == OPK_USER_ANNOTATION || o->kind == OPK_NVTX) &&
           is_comm_name(s);
}

/* A collective's kernel by its name alone: NCCL's ncclKernel_* and ncclDevKernel_* (the rule
 * compare uses, 'nccl%Kernel%'), and Gloo's. kprof's breakdown counts them as Communication
 * whether or not an nccl:* op launched them; the plugin (plugin_compat) does not. */
static bool is_comm_kernel_name(const char *s)
{
    return (strncmp(s, "nccl", 4) == 0 && strstr(s + 4, "Kernel") != NULL) ||
           strncmp(s, "gloo", 4) == 0;
}

static bool is_dataloader_name(const char *s)
{
    size_t n = strlen(s);

    if (strncmp(s, "enumerate(DataPipe)#", 20) == 0) {
        return true;
    }
    return strncmp(s, "enumerate(DataLoader)#", 22) == 0 && n >= 9 &&
           strcmp(s + n - 9, ".__next__") == 0;
}

static bool is_tc_eligible_op(const char *s)
{
    static const char *const ops[] = { "aten::_convolution",
                                       "aten::conv1d",
                                       "aten::conv2d",
                                       "aten::conv3d",
                                       "aten::conv_tbc",
                                       "aten::conv_transpose1d",
                                       "aten::conv_transpose2d",
                                       "aten::conv_transpose3d",
                                       "aten::convolution",
                                       "aten::cudnn_convolution",
                                       "aten::cudnn_convolution_transpose",
                                       "aten::prelu",
                                       "aten::addmm",
                                       "aten::addmv",
                                       "aten::addr",
                                       "aten::matmul",
                                       "aten::mm",
                                       "aten::mv",
                                       "aten::linear",
                                       "aten::addbmm",
                                       "aten::baddbmm",
                                       "aten::bmm",
                                       "aten::chain_matmul",
                                       "aten::linalg_multi_dot",
                                       "aten::_thnn_fused_lstm_cell",
                                       "aten::_thnn_fused_gru_cell",
                                       "aten::lstm_cell",
                                       "aten::gru_cell",
                                       "aten::rnn_tanh_cell",
                                       "aten::rnn_relu_cell",
                                       "CudnnConvolutionBackward",
                                       "BmmBackward0",
                                       "aten::cudnn_convolution_transpose_backward",
                                       "CudnnConvolutionTransposeBackward",
                                       "MmBackward",
                                       "aten::cudnn_convolution_backward_weight",
                                       "aten::addmm_",
                                       "AddmvBackward",
                                       "MvBackward",
                                       "aten::cudnn_convolution_transpose_backward_weight",
                                       "aten::cudnn_convolution_transpose_backward_input",
                                       "AddmmBackward",
                                       "aten::cudnn_convolution_backward_input",
                                       "AddbmmBackward",
                                       "aten::cudnn_convolution_backward" };

    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (strcmp(s, ops[i]) == 0) {
            return true;
        }
    }
    return false;
}

bool kp_an_is_tc_kernel(const char *name)
{
    /* The TensorBoard plugin's list (spec §7): Volta and Turing cuBLAS/cuDNN names, and
     * xmma. */
    static const char *const pats[] = { "h884",
                                        "s884",
                                        "h1688",
                                        "s1688",
                                        "hmma",
                                        "i8816",
                                        "16816",
                                        "dgrad_1x1_stride_2x2",
                                        "first_layer_wgrad_kernel",
                                        "conv1x1",
                                        "conv2d_c1_k1",
                                        "direct_group",
                                        "xmma_implicit_gemm",
                                        "xmma_sparse_conv",
                                        "xmma_warp_specialized_implicit_gemm",
                                        "xmma_gemm",
                                        "xmma_sparse_gemm",
                                        "c1688" };
    /* kprof's additions for Ampere and Hopper (none of them occurs in the plugin's peer
     * traces, so its figures stay the plugin's): cuDNN's sm80/sm90 xmma convolutions
     * (sm80_xmma_fprop_implicit_gemm_*, *_dgrad_*, *_wgrad_*); Hopper warpgroup MMA in
     * cuBLAS, CUTLASS 3 and cuDNN (sm90_*_gmma_*, *wgmma*); cuBLAS 12.8+'s nvjet_* GEMMs;
     * CUTLASS tensor-op kernels (cutlass_80_tensorop_*, cutlass3x_sm90_tensorop_*), which a
     * cutlass_*_simt_* kernel is not; int8/fp8/tf32 MMA shapes (i16832, s16816 above); and
     * attention kernels: FlashAttention 2 (flash_fwd_*, flash_bwd_dq_dk_dv_*) and 3
     * (FlashAttnFwdSm90), xformers/PyTorch memory-efficient and TensorRT fmha_* but their fp32
     * variants, and cuDNN's fused SDPA. */
    static const char *const modern[] = { "xmma_fprop",
                                          "xmma_dgrad",
                                          "xmma_wgrad",
                                          "gmma",
                                          "nvjet_",
                                          "tensorop",
                                          "i16832",
                                          "flash_fwd_kernel",
                                          "flash_fwd_splitkv_kernel",
                                          "flash_bwd_dq_dk_dv",
                                          "flash_bwd_kernel",
                                          "FlashAttnFwd",
                                          "FlashAttnBwd",
                                          "fmha_",
                                          "_sdpa_" };

    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        if (strstr(name, pats[i])) {
            return true;
        }
    }
    if (strstr(name, "_simt_") != NULL) {
        return false;
    }
    /* fmha's fp32 kernels (fmha_cutlassF_f32_aligned_*) run on CUDA cores */
    if (strstr(name, "fmha_") != NULL) {
        return strstr(name, "_f32_") == NULL;
    }
    for (size_t i = 0; i < sizeof(modern) / sizeof(modern[0]); i++) {
        if (strstr(name, modern[i])) {
            return true;
        }
    }
    return false;
}

/* The node type of an op, or -1 if it is not a host node (spec §2.4). */
static int host_type(const struct kp_an *a, const struct an_op *o)
{
    const char *s = nm(a, o->name);

    if (o->kind == OPK_PROFILER_STEP) {
        return NODE_STEP;
    }
    if (o->kind == OPK_USER_ANNOTATION) {
        return is_comm_name(s) ? NODE_COMM : -1;
    }
    if (o->kind != OPK_CPU_OP) {
        return -1;
    }
    if (is_dataloader_name(s)) {
        return NODE_DATALOADER;
    }
    if (strncmp(s, "Optimizer.", 10) == 0) {
        return NODE_OPTIMIZER;
    }
    if (strcmp(s, "DataParallel.forward") == 0 ||
        strcmp(s, "DistributedDataParallel.forward") == 0) {
        return NODE_OTHER_OP;
    }
    return NODE_OPERATOR;
}

/* ---- the model ------------------------------------------------------------------------ */

struct key_idx {
    int64_t key;
    int32_t idx;
};

static int cmp_key_idx(const void *pa, const void *pb)
{
    const struct key_idx *a = pa, *b = pb;

    if (a->key != b->key) {
        return a->key < b->key ? -1 : 1;
    }
    return (a->idx > b->idx) - (a->idx < b->idx);
}

static const struct key_idx *find_key(const struct key_idx *v, size_t n, int64_t key)
{
    size_t lo = 0, hi = n;

    while (lo < hi) { /* the first entry with this key */
        size_t mid = lo + (hi - lo) / 2;

        if (v[mid].key < key) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < n && v[lo].key == key ? &v[lo] : NULL;
}

static int32_t root_of(const struct kp_an *a, int64_t tid)
{
    size_t lo = 0, hi = a->n_roots;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (a->roots[mid].tid == tid) {
            return a->roots[mid].node;
        }
        if (a->roots[mid].tid < tid) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return -1;
}

static int32_t new_node(struct kp_an *a, int32_t op, int64_t start, int64_t end, uint8_t type)
{
    struct an_node *n = &a->nodes[a->n_nodes];

    memset(n, 0, sizeof(*n));
    n->op = op;
    n->start = start;
    n->end = end;
    n->type = type;
    n->parent = n->first_child = n->last_child = n->next_sib = -1;
    n->first_rt = n->last_rt = -1;
    return (int32_t) a->n_nodes++;
}

static void add_child(struct kp_an *a, int32_t parent, int32_t child)
{
    struct an_node *p = &a->nodes[parent];

    a->nodes[child].parent = parent;
    if (p->last_child >= 0) {
        a->nodes[p->last_child].next_sib = child;
    }
    else {
        p->first_child = child;
    }
    p->last_child = child;
    p->n_child++;
}

static void add_rt(struct kp_an *a, int32_t node, int32_t rt)
{
    struct an_node *n = &a->nodes[node];

    a->rts[rt].owner = node;
    a->rts[rt].next = -1;
    if (n->last_rt >= 0) {
        a->rts[n->last_rt].next = rt;
    }
    else {
        n->first_rt = rt;
    }
    n->last_rt = rt;
}

static int cmp_tid_root(const void *pa, const void *pb)
{
    const struct an_tid_root *a = pa, *b = pb;

    return (a->tid > b->tid) - (a->tid < b->tid);
}

/* The runtime's external id if the device event has none. */
static int64_t dev_ext(const struct kp_an *a, const struct an_dev *d)
{
    if (d->ext) {
        return d->ext;
    }
    return d->rt >= 0 ? a->rts[d->rt].ext : 0;
}

/* Builds the trees and the per-node statistics (spec §2). */
static int build_model(struct kp_an *a)
{
    size_t cap = 2 * a->n_ops + a->n_rts + 2; /* nodes, and one root per thread */
    int32_t *stack = NULL;
    struct key_idx *ext = NULL, *corr = NULL;
    size_t n_ext = 0, sp = 0;
    int64_t main_tid = 0;
    bool has_main = false;
    int rc = -ENOMEM;

    a->nodes = calloc(cap, sizeof(*a->nodes));
    a->roots = calloc(cap, sizeof(*a->roots));
    stack = calloc(a->n_ops + 2, sizeof(*stack));
    ext = calloc(a->n_ops + 1, sizeof(*ext));
    corr = calloc(a->n_rts + 1, sizeof(*corr));
    if (!a->nodes || !a->roots || !stack || !ext || !corr) {
        goto out;
    }

    /* 1. One tree per thread: ops come sorted by (tid, start, end descending). */
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        int type = host_type(a, o);
        int32_t node;

        if (type < 0) {
            continue;
        }
        if (o->kind == OPK_PROFILER_STEP && !has_main) {
            has_main = true;
            main_tid = o->tid;
        }
        if (sp == 0 || a->roots[a->n_roots - 1].tid != o->tid) {
            int32_t root = new_node(a, -1, INT64_MIN, INT64_MAX, NODE_ROOT);

            a->roots[a->n_roots++] = (struct an_tid_root){ o->tid, root };
            stack[0] = root;
            sp = 1;
        }
        for (;;) {
            const struct an_node *top = &a->nodes[stack[sp - 1]];

            if (o->start < top->end) {
                if (o->end <= top->end) {
                    node = new_node(a, (int32_t) i, o->start, o->end, (uint8_t) type);
                    add_child(a, stack[sp - 1], node);
                    stack[sp++] = node;
                    if (o->ext) {
                        ext[n_ext++] = (struct key_idx){ o->ext, node };
                    }
                }
                break; /* a partial overlap is dropped (spec §2.4) */
            }
            sp--;
        }
    }
    /* Threads with runtime calls but no host node get a root too. */
    for (size_t i = 0; i < a->n_rts; i++) {
        bool found = false;

        for (size_t k = 0; k < a->n_roots && !found; k++) {
            found = a->roots[k].tid == a->rts[i].tid;
        }
        if (!found && a->n_roots < cap) {
            int32_t root = new_node(a, -1, INT64_MIN, INT64_MAX, NODE_ROOT);

            a->roots[a->n_roots++] = (struct an_tid_root){ a->rts[i].tid, root };
        }
    }
    qsort(a->roots, a->n_roots, sizeof(*a->roots), cmp_tid_root);

    /* 2. Runtime calls to host nodes by external id (the first node in tree order). */
    qsort(ext, n_ext, sizeof(*ext), cmp_key_idx);
    for (size_t i = 0; i < a->n_rts; i++) {
        struct an_rt *t = &a->rts[i];
        const struct key_idx *k;

        t->owner = -1;
        t->first_dev = -1;
        t->next = -1;
        if (t->ext == 0) {
            add_rt(a, root_of(a, t->tid), (int32_t) i);
        }
        else if ((k = find_key(ext, n_ext, t->ext)) != NULL) {
            add_rt(a, k->idx, (int32_t) i);
        }
        corr[i] = (struct key_idx){ t->corr, (int32_t) i };
    }

    /* 3. Device events to runtime calls by correlation; stale kernels to a dummy runtime
     * under the main thread's root. */
    qsort(corr, a->n_rts, sizeof(*corr), cmp_key_idx);
    for (size_t i = a->n_devs; i-- > 0;) {
        struct an_dev *d = &a->devs[i];
        const struct key_idx *k = d->corr ? find_key(corr, a->n_rts, d->corr) : NULL;
        int32_t rt;

        if (k) {
            rt = k->idx;
        }
        else if (d->kind == DEV_KERNEL && has_main) {
            rt = (int32_t) a->n_rts;
            if (!a->rts[rt].dummy) {
                a->rts[rt].dummy = true;
                a->rts[rt].first_dev = -1;
                a->rts[rt].step = -1;
                a->rts[rt].tid = main_tid;
                add_rt(a, root_of(a, main_tid), rt);
            }
        }
        else {
            continue;
        }
        d->rt = rt;
        d->next = a->rts[rt].first_dev; /* walking backwards keeps start order */
        a->rts[rt].first_dev = (int32_t) i;
        a->rts[rt].dev_ns += d->end - d->start;
        if (d->kind == DEV_KERNEL) {
            a->rts[rt].kern_ns += d->end - d->start;
        }
        if (d->kind == DEV_KERNEL && kp_an_is_tc_kernel(nm(a, d->name))) {
            a->rts[rt].tc_ns += d->end - d->start;
        }
    }

    /* 4. Duplicate merging (spec §2.5), parents before children. */
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct an_node *n = &a->nodes[i];

        if (n->dead || n->op < 0 || a->ops[n->op].kind != OPK_CPU_OP) {
            continue;
        }
        while (n->n_child == 1) {
            struct an_node *c = &a->nodes[n->first_child];

            if (c->op < 0 || a->ops[c->op].kind != OPK_CPU_OP ||
                a->ops[c->op].name != a->ops[n->op].name) {
                break;
            }
            for (int32_t r = n->first_rt; r >= 0; r = a->rts[r].next) {
                a->rts[r].owner = -1;
            }
            n->first_rt = c->first_rt;
            n->last_rt = c->last_rt;
            for (int32_t r = n->first_rt; r >= 0; r = a->rts[r].next) {
                a->rts[r].owner = (int32_t) i;
            }
            n->first_child = c->first_child;
            n->last_child = c->last_child;
            n->n_child = c->n_child;
            for (int32_t k = n->first_child; k >= 0; k = a->nodes[k].next_sib) {
                a->nodes[k].parent = (int32_t) i;
            }
            c->dead = true;
        }
    }

    /* 5. Bottom-up statistics (spec §2.6, §7): children have higher indexes. */
    for (size_t i = a->n_nodes; i-- > 0;) {
        struct an_node *n = &a->nodes[i];
        bool host = n->op >= 0; /* roots have no host time */

        if (n->dead) {
            continue;
        }
        n->host_self = host ? n->end - n->start : 0;
        n->eligible = n->op >= 0 && is_tc_eligible_op(nm(a, a->ops[n->op].name));
        for (int32_t r = n->first_rt; r >= 0; r = a->rts[r].next) {
            if (host) {
                n->host_self -= a->rts[r].end - a->rts[r].start;
            }
            n->dev_self += a->rts[r].dev_ns;
            n->tc_self += a->rts[r].tc_ns;
            n->kern_self += a->rts[r].kern_ns;
            if (a->rts[r].tc_ns > 0) {
                n->eligible = true;
            }
        }
        n->dev_total += n->dev_self;
        n->tc_total += n->tc_self;
        for (int32_t k = n->first_child; k >= 0; k = a->nodes[k].next_sib) {
            const struct an_node *c = &a->nodes[k];

            if (host) {
                n->host_self -= c->end - c->start;
            }
            n->dev_total += c->dev_total;
            n->tc_total += c->tc_total;
            if (c->eligible && n->op >= 0 && a->ops[n->op].kind == OPK_CPU_OP) {
                n->eligible = true;
            }
            if (c->eligible || c->eligible_below) {
                n->eligible_below = true;
            }
        }
    }
    a->built = true;
    rc = 0;
out:
    free(stack);
    free(ext);
    free(corr);
    return rc;
}

/* ---- steps (spec §3) ----------------------------------------------------------------- */

struct step_dev {
    int64_t min_start, max_end;
    uint64_t count;
};

static int cmp_step(const void *pa, const void *pb)
{
    const struct kp_an_step *a = pa, *b = pb;

    return (a->start_ns > b->start_ns) - (a->start_ns < b->start_ns);
}

static int build_steps(struct kp_an *a)
{
    size_t n = 0;
    struct step_dev *sd = NULL;
    bool launched = false;

    free(a->steps);
    a->steps =
        calloc((a->n_ops > a->n_rec_steps ? a->n_ops : a->n_rec_steps) + 1, sizeof(*a->steps));
    if (!a->steps) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *s = nm(a, o->name);

        if (o->kind != OPK_PROFILER_STEP) {
            continue;
        }
        snprintf(a->steps[n].name, sizeof(a->steps[n].name), "%s",
                 strncmp(s, "ProfilerStep#", 13) == 0 ? s + 13 : s);
        a->steps[n].start_ns = o->start;
        a->steps[n].end_ns = o->end;
        n++;
    }
    if (n == 0 && a->n_rec_steps > 0) {
        /* no ProfilerStep ranges: the steps the capture recorded (kprof_step reports) */
        memcpy(a->steps, a->rec_steps, a->n_rec_steps * sizeof(*a->steps));
        n = a->n_rec_steps;
    }
    if (n == 0) { /* one step "0" over the CPU-side events */
        int64_t lo = INT64_MAX, hi = INT64_MIN;

        for (size_t i = 0; i < a->n_ops; i++) {
            if (a->ops[i].kind != OPK_CPU_OP) {
                continue;
            }
            lo = a->ops[i].start < lo ? a->ops[i].start : lo;
            hi = a->ops[i].end > hi ? a->ops[i].end : hi;
        }
        if (lo <= hi) {
            snprintf(a->steps[0].name, sizeof(a->steps[0].name), "0");
            a->steps[0].start_ns = lo;
            a->steps[0].end_ns = hi;
            n = 1;
        }
    }
    qsort(a->steps, n, sizeof(*a->steps), cmp_step);

    sd = calloc(n + 1, sizeof(*sd));
    if (!sd) {
        return -ENOMEM;
    }
    for (size_t s = 0; s < n; s++) {
        sd[s].min_start = INT64_MAX;
        sd[s].max_end = INT64_MIN;
    }
    /* A runtime call belongs to the last step starting at or before it, if inside it. */
    for (size_t i = 0; i <= a->n_rts; i++) {
        struct an_rt *t = &a->rts[i];
        size_t lo = 0, hi = n;

        t->step = -1;
        if (i == a->n_rts || t->dummy) {
            continue;
        }
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;

            if (a->steps[mid].start_ns <= t->start) {
                lo = mid + 1;
            }
            else {
                hi = mid;
            }
        }
        if (lo > 0 && t->end <= a->steps[lo - 1].end_ns) {
            t->step = (int32_t) (lo - 1);
        }
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int32_t s = d->rt >= 0 ? a->rts[d->rt].step : -1;

        if (s < 0) {
            continue;
        }
        sd[s].count++;
        sd[s].min_start = d->start < sd[s].min_start ? d->start : sd[s].min_start;
        sd[s].max_end = d->end > sd[s].max_end ? d->end : sd[s].max_end;
        launched = true;
    }
    if (launched) {
        int64_t prev_end = a->steps[0].start_ns;

        if (sd[0].count > 0) {
            for (size_t i = 0; i < a->n_devs; i++) {
                const struct an_dev *d = &a->devs[i];

                if (d->rt >= 0 && a->rts[d->rt].step >= 0) {
                    continue;
                }
                if (d->end < sd[0].min_start && d->end > prev_end) {
                    prev_end = d->end;
                }
            }
        }
        for (size_t s = 0; s < n; s++) {
            struct kp_an_step *st = &a->steps[s];
            int64_t start = prev_end > st->start_ns ? prev_end : st->start_ns;
            int64_t end;

            if (sd[s].count > 0) {
                end = st->end_ns > sd[s].max_end ? st->end_ns : sd[s].max_end;
            }
            else {
                end = st->end_ns > start ? st->end_ns : start;
            }
            if (end < start) {
                end = start;
            }
            st->start_ns = start;
            st->end_ns = end;
            prev_end = end;
        }
        if (n > 1) { /* tail trimming */
            size_t last = n - 1;

            while (sd[last].count == 0) {
                last--;
            }
            n = last + 1;
            if (last > 0 && (double) sd[last].count < 0.8 * (double) sd[last - 1].count) {
                n = last;
            }
        }
    }
    free(sd);
    a->bd.n_steps = n;
    a->bd.steps = a->steps;
    return 0;
}

/* ---- breakdown (spec §4) ------------------------------------------------------------- */

struct rlist {
    struct kp_range *r;
    size_t n;
};

static int rl_push(struct rlist *l, size_t cap, int64_t s, int64_t e)
{
    if (l->n >= cap) {
        return -ENOMEM;
    }
    l->r[l->n++] = (struct kp_range){ s, e };
    return 0;
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return (a > b) - (a < b);
}

/* Computation, communication and their overlap per step (spec §9); tmp holds comp->n +
 * comm->n ranges. */
static void overlap(struct kp_an *a, const struct rlist *comp, const struct rlist *comm,
                    struct kp_range *tmp)
{
    size_t n = kp_ranges_intersect(comp->r, comp->n, comm->r, comm->n, tmp);

    for (size_t s = 0; s < a->bd.n_steps; s++) {
        struct kp_an_step *st = &a->steps[s];

        st->computation_ns = kp_ranges_clip_length(comp->r, comp->n, st->start_ns, st->end_ns);
        st->communication_ns = kp_ranges_clip_length(comm->r, comm->n, st->start_ns, st->end_ns);
        st->overlap_ns = kp_ranges_clip_length(tmp, n, st->start_ns, st->end_ns);
    }
}

struct sm_ev {
    int64_t t;
    int start; /* 1: a kernel starts (sorted before ends at equal times) */
    double bps;
    size_t idx; /* insertion order, to keep the float sums reproducible */
};

static int cmp_sm_ev(const void *pa, const void *pb)
{
    const struct sm_ev *x = pa, *y = pb;

    if (x->t != y->t) {
        return x->t < y->t ? -1 : 1;
    }
    if (x->start != y->start) {
        return y->start - x->start;
    }
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Est. SM efficiency of GPU g over [w0, w1] (spec §8): a sweep over its kernels with blocks per
 * SM > 0 keeps the running sum; each stretch between consecutive distinct times with a sum > 0
 * counts min(sum, 1) over its part inside the window. Undefined when none falls inside. The
 * stretches, unclipped, go to b's SM-efficiency ranges of slot k. Returns 0 or -ENOMEM. */
static int sm_efficiency(struct kp_an *a, int g, size_t k, int64_t w0, int64_t w1)
{
    struct kp_an_breakdown *b = &a->bd;
    struct sm_ev *ev = calloc(2 * a->n_devs + 1, sizeof(*ev));
    struct kp_an_sm_range *seg = calloc(2 * a->n_devs + 1, sizeof(*seg));
    size_t n = 0, n_seg = 0;
    double sum = 0.0, acc = 0.0;
    bool any = false;

    b->est_sm_efficiency[k] = 0.0;
    b->est_sm_efficiency_defined[k] = false;
    if (!ev || !seg) {
        free(ev);
        free(seg);
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];

        if (d->kind != DEV_KERNEL || d->device != g || isnan(d->bps) || !(d->bps > 0)) {
            continue;
        }
        ev[n] = (struct sm_ev){ d->start, 1, d->bps, n };
        n++;
        ev[n] = (struct sm_ev){ d->end, 0, d->bps, n };
        n++;
    }
    qsort(ev, n, sizeof(*ev), cmp_sm_ev);
    for (size_t i = 0; i + 1 <= n; i++) {
        sum += ev[i].start ? ev[i].bps : -ev[i].bps;
        if (i + 1 < n && ev[i + 1].t > ev[i].t && sum > 0) {
            int64_t lo = ev[i].t > w0 ? ev[i].t : w0, hi = ev[i + 1].t < w1 ? ev[i + 1].t : w1;

            seg[n_seg++] = (struct kp_an_sm_range){ ev[i].t, ev[i + 1].t, sum < 1.0 ? sum : 1.0 };
            if (hi > lo) {
                acc += (sum < 1.0 ? sum : 1.0) * (double) (hi - lo);
                any = true;
            }
        }
    }
    free(ev);
    free(b->sm_ranges[k]);
    b->sm_ranges[k] = seg;
    b->n_sm_ranges[k] = n_seg;
    if (any && w1 > w0) {
        b->est_sm_efficiency[k] = acc / (double) (w1 - w0);
        b->est_sm_efficiency_defined[k] = true;
    }
    return 0;
}

/* The timeline's range (spec §8): the profiler's span ("PyTorch Profiler (0)", which import
 * keeps in ranks), or else the span of every loaded event (ops, runtimes, device events). */
static void event_span(const struct kp_an *a, int64_t *lo, int64_t *hi)
{
    int64_t l = INT64_MAX, h = INT64_MIN;

    if (a->prof_end > a->prof_start) {
        *lo = a->prof_start;
        *hi = a->prof_end;
        return;
    }

    for (size_t i = 0; i < a->n_ops; i++) {
        l = a->ops[i].start < l ? a->ops[i].start : l;
        h = a->ops[i].end > h ? a->ops[i].end : h;
    }
    for (size_t i = 0; i < a->n_rts; i++) {
        l = a->rts[i].start < l ? a->rts[i].start : l;
        h = a->rts[i].end > h ? a->rts[i].end : h;
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        l = a->devs[i].start < l ? a->devs[i].start : l;
        h = a->devs[i].end > h ? a->devs[i].end : h;
    }
    *lo = l <= h ? l : 0;
    *hi = l <= h ? h : 0;
}

/* The utilization timeline of slot k (spec §8) from the GPU's merged kernel ranges r[0..n):
 * buckets of the smallest power of ten µs giving at most 100 of them over [lo, hi], the last
 * one stretched to hi, each valued busy / length, then (hi, 0). Returns 0 or -ENOMEM. */
static int util_timeline(struct kp_an *a, size_t k, const struct kp_range *r, size_t n, int64_t lo,
                         int64_t hi)
{
    struct kp_an_breakdown *b = &a->bd;
    int64_t bucket = 1000, n_b;
    struct kp_an_point *p;

    while (hi - lo > 100 * bucket && bucket <= INT64_MAX / 1000) {
        bucket *= 10;
    }
    n_b = (hi - lo) / bucket;
    p = calloc((size_t) n_b + 1, sizeof(*p));
    if (!p) {
        return -ENOMEM;
    }
    for (int64_t i = 0; i < n_b; i++) {
        int64_t s = lo + i * bucket, e = i + 1 == n_b ? hi : s + bucket;

        p[i].t_ns = s;
        p[i].value = (double) kp_ranges_clip_length(r, n, s, e) / (double) (e - s);
    }
    p[n_b] = (struct kp_an_point){ hi, 0.0 };
    free(b->util_timeline[k]);
    b->util_timeline[k] = p;
    b->n_util_points[k] = (size_t) n_b + 1;
    return 0;
}

/* Est. achieved occupancy of GPU g (spec §8): its kernels with a known occupancy, each
 * clipped to [w0, w1], weighted by the clipped length. Undefined without kernel time in it. */
static void occupancy(const struct kp_an *a, int g, int64_t w0, int64_t w1, double *out,
                      bool *defined)
{
    double num = 0.0, den = 0.0;

    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int64_t lo, hi;

        if (d->kind != DEV_KERNEL || d->device != g || isnan(d->occ) || d->occ < 0) {
            continue;
        }
        lo = d->start > w0 ? d->start : w0;
        hi = d->end < w1 ? d->end : w1;
        if (hi > lo) {
            num += d->occ * (double) (hi - lo);
            den += (double) (hi - lo);
        }
    }
    *defined = den > 0;
    *out = den > 0 ? num / den : 0.0;
}

/* Each GPU's busy share of the steps' window (spec §8); tmp holds n_devs ranges. */
static int gpu_utilization(struct kp_an *a, struct kp_range *tmp)
{
    struct kp_an_breakdown *b = &a->bd;
    bool seen[KP_AN_MAX_GPUS] = { false };
    int64_t w0, w1, lo, hi;
    int rc;

    b->n_gpus = 0;
    event_span(a, &lo, &hi);
    for (size_t i = 0; i < a->n_devs; i++) {
        if (a->devs[i].kind == DEV_KERNEL && a->devs[i].device >= 0 &&
            a->devs[i].device < KP_AN_MAX_GPUS) {
            seen[a->devs[i].device] = true;
        }
    }
    w0 = b->n_steps ? a->steps[0].start_ns : 0;
    w1 = b->n_steps ? a->steps[b->n_steps - 1].end_ns : 0;
    for (int g = 0; g < KP_AN_MAX_GPUS; g++) {
        size_t n = 0;

        if (!seen[g]) {
            continue;
        }
        for (size_t i = 0; i < a->n_devs; i++) {
            if (a->devs[i].kind == DEV_KERNEL && a->devs[i].device == g) {
                tmp[n++] = (struct kp_range){ a->devs[i].start, a->devs[i].end };
            }
        }
        n = kp_ranges_merge(tmp, n);
        b->gpu_ids[b->n_gpus] = g;
        b->gpu_utilization[b->n_gpus] =
            w1 > w0 ? (double) kp_ranges_clip_length(tmp, n, w0, w1) / (double) (w1 - w0) : 0.0;
        rc = util_timeline(a, b->n_gpus, tmp, n, lo, hi);
        if (rc == 0) {
            rc = sm_efficiency(a, g, b->n_gpus, w0, w1);
        }
        if (rc < 0) {
            return rc;
        }
        occupancy(a, g, w0, w1, &b->est_achieved_occupancy[b->n_gpus],
                  &b->est_achieved_occupancy_defined[b->n_gpus]);
        b->n_gpus++;
    }
    return 0;
}

int kp_an_breakdown(struct kp_an *a, bool plugin_compat, const struct kp_an_breakdown **out)
{
    size_t cap = a->n_ops + a->n_rts + a->n_devs + 1, n_comm = 0, n_steps, n_nccl = 0, n_gloo = 0;
    struct rlist cat[KP_AN_CAT_COUNT] = { { 0 } }, share[KP_AN_CAT_COUNT] = { { 0 } };
    struct kp_range *free_r = NULL, *all_steps = NULL, *tmp = NULL;
    size_t n_free = 0, n_all = 0;
    int64_t *comm_ext = NULL;
    int rc = -ENOMEM;

    if (!a->built && (rc = build_model(a)) < 0) {
        return rc;
    }
    if ((rc = build_steps(a)) < 0) {
        return rc;
    }
    rc = -ENOMEM;
    n_steps = a->bd.n_steps;
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        cat[c].r = calloc(cap, sizeof(struct kp_range));
        share[c].r = calloc(2 * cap + n_steps + 1, sizeof(struct kp_range));
        if (!cat[c].r || !share[c].r) {
            goto out;
        }
    }
    free_r = calloc(2 * cap + n_steps + 1, sizeof(*free_r));
    all_steps = calloc(n_steps + 1, sizeof(*all_steps));
    tmp = calloc(2 * cap + n_steps + 1, sizeof(*tmp));
    comm_ext = calloc(a->n_ops + 1, sizeof(*comm_ext));
    if (!free_r || !all_steps || !tmp || !comm_ext) {
        goto out;
    }

    /* Each category's intervals, from all events. */
    a->bd.use_dp = a->bd.use_ddp = false;
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *s = nm(a, o->name);
        bool host = o->kind == OPK_CPU_OP || o->kind == OPK_USER_ANNOTATION;

        if (strcmp(s, "DataParallel.forward") == 0) {
            a->bd.use_dp = true;
        }
        else if (strcmp(s, "DistributedDataParallel.forward") == 0) {
            a->bd.use_ddp = true;
        }
        if (is_comm_op(o, s)) {
            rl_push(&cat[KP_AN_COMMUNICATION], cap, o->start, o->end);
            n_nccl += s[0] == 'n';
            n_gloo += s[0] == 'g';
            if (o->ext) {
                comm_ext[n_comm++] = o->ext;
            }
        }
        if (host && is_dataloader_name(s)) {
            rl_push(&cat[KP_AN_DATALOADER], cap, o->start, o->end);
        }
        else if (host || o->kind == OPK_GPU_USER_ANNOTATION || o->kind == OPK_NVTX) {
            rl_push(&cat[KP_AN_CPU_EXEC], cap, o->start, o->end);
        }
    }
    qsort(comm_ext, n_comm, sizeof(*comm_ext), cmp_i64);
    for (size_t i = 0; i < a->n_rts; i++) {
        rl_push(&cat[KP_AN_RUNTIME], cap, a->rts[i].start, a->rts[i].end);
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int c = d->kind == DEV_MEMCPY   ? KP_AN_MEMCPY
                : d->kind == DEV_MEMSET ? KP_AN_MEMSET
                                        : KP_AN_KERNEL;

        if (c == KP_AN_KERNEL) {
            int64_t e = dev_ext(a, d);

            if ((e && bsearch(&e, comm_ext, n_comm, sizeof(*comm_ext), cmp_i64)) ||
                (!plugin_compat && d->kind == DEV_KERNEL && is_comm_kernel_name(nm(a, d->name)))) {
                c = KP_AN_COMMUNICATION;
            }
        }
        rl_push(&cat[c], cap, d->start, d->end);
    }
    a->bd.has_runtime = a->n_rts > 0;
    a->bd.has_kernel = a->n_kernels > 0;
    a->bd.has_memcpy_or_memset = a->n_memcpy + a->n_memset > 0;
    a->bd.has_communication = cat[KP_AN_COMMUNICATION].n > 0;
    a->bd.comm_node_count = n_nccl && n_gloo ? 0 : n_nccl + n_gloo;
    a->bd.comm_nccl = n_nccl > 0;
    for (int c = 0; c < KP_AN_OTHER; c++) {
        cat[c].n = kp_ranges_merge(cat[c].r, cat[c].n);
    }
    for (size_t s = 0; s < n_steps; s++) {
        all_steps[s] = (struct kp_range){ a->steps[s].start_ns, a->steps[s].end_ns };
    }
    n_all = kp_ranges_merge(all_steps, n_steps);

    /* Priority masking. The plugin starts with no free time and resets it to all steps
     * whenever it is empty, taking that category unmasked: a double count once a category
     * covers every step. kprof keeps it empty. */
    if (!plugin_compat) {
        memcpy(free_r, all_steps, n_all * sizeof(*free_r));
        n_free = n_all;
    }
    for (int c = 0; c < KP_AN_OTHER; c++) {
        if (plugin_compat && n_free == 0) {
            memcpy(share[c].r, cat[c].r, cat[c].n * sizeof(*free_r));
            share[c].n = cat[c].n;
            memcpy(free_r, all_steps, n_all * sizeof(*free_r));
            n_free = n_all;
        }
        else {
            share[c].n = kp_ranges_intersect(cat[c].r, cat[c].n, free_r, n_free, share[c].r);
        }
        n_free = kp_ranges_subtract(free_r, n_free, share[c].r, share[c].n, tmp);
        memcpy(free_r, tmp, n_free * sizeof(*free_r));
    }
    memcpy(share[KP_AN_OTHER].r, free_r, n_free * sizeof(*free_r));
    share[KP_AN_OTHER].n = n_free;

    memset(a->bd.avg_ns, 0, sizeof(a->bd.avg_ns));
    a->bd.avg_total_ns = 0;
    for (size_t s = 0; s < n_steps; s++) {
        struct kp_an_step *st = &a->steps[s];

        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            st->cost_ns[c] =
                kp_ranges_clip_length(share[c].r, share[c].n, st->start_ns, st->end_ns);
            a->bd.avg_ns[c] += (double) st->cost_ns[c];
        }
        a->bd.avg_total_ns += (double) (st->end_ns - st->start_ns);
    }
    if (n_steps > 0) {
        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            a->bd.avg_ns[c] /= (double) n_steps;
        }
        a->bd.avg_total_ns /= (double) n_steps;
    }
    overlap(a, cat[KP_AN_KERNEL].n ? &cat[KP_AN_KERNEL] : &cat[KP_AN_CPU_EXEC],
            &cat[KP_AN_COMMUNICATION], tmp);
    rc = gpu_utilization(a, tmp);
    if (rc < 0) {
        goto out;
    }
    *out = &a->bd;
out:
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        free(cat[c].r);
        free(share[c].r);
    }
    free(free_r);
    free(all_steps);
    free(tmp);
    free(comm_ext);
    return rc;
}

/* ---- communication nodes (spec §9) --------------------------------------------------- */

struct comm_op {
    int64_t start, end;
    int32_t op;
};

static int cmp_comm_op(const void *pa, const void *pb)
{
    const struct comm_op *x = pa, *y = pb;

    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    if (x->end != y->end) {
        return x->end > y->end ? -1 : 1;
    }
    return (x->op > y->op) - (x->op < y->op);
}

static int cmp_range_start_end_desc(const void *pa, const void *pb)
{
    const struct kp_range *x = pa, *y = pb;

    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    return (x->end < y->end) - (x->end > y->end);
}

int kp_an_comm_nodes(struct kp_an *a, struct kp_an_comm *out)
{
    struct comm_op *v = NULL;
    struct key_idx *ext = NULL;
    size_t n = 0, n_ext = 0, n_ranges = 0, s = 0;
    int rc = -ENOMEM;

    memset(out, 0, sizeof(*out));
    if (!a->steps) {
        return -EINVAL;
    }
    v = calloc(a->n_ops + 1, sizeof(*v));
    ext = calloc(a->n_ops + 1, sizeof(*ext));
    if (!v || !ext) {
        goto out;
    }
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *nam = nm(a, o->name);

        if (!is_comm_op(o, nam)) {
            continue;
        }
        out->nccl |= nam[0] == 'n';
        out->gloo |= nam[0] == 'g';
        if (o->ext) {
            ext[n_ext++] = (struct key_idx){ o->ext, (int32_t) i };
        }
        else { /* no external id (an NVTX range): a node of its own */
            v[n++] = (struct comm_op){ o->start, o->end, (int32_t) i };
        }
    }
    rc = 0;
    if (out->nccl && out->gloo) { /* the plugin empties the node list then */
        goto out;
    }
    /* One node per external id, the last op with it (the plugin's dict keeps the last). */
    qsort(ext, n_ext, sizeof(*ext), cmp_key_idx);
    for (size_t k = 0; k < n_ext; k++) {
        const struct an_op *o = &a->ops[ext[k].idx];

        if (k + 1 == n_ext || ext[k + 1].key != ext[k].key) {
            v[n++] = (struct comm_op){ o->start, o->end, ext[k].idx };
        }
    }
    qsort(v, n, sizeof(*v), cmp_comm_op);
    rc = -ENOMEM;
    out->nodes = calloc(n + 1, sizeof(*out->nodes));
    if (!out->nodes) {
        goto out;
    }
    n_ext = 0;
    for (size_t j = 0; j < n; j++) {
        const struct an_op *o = &a->ops[v[j].op];
        struct kp_an_comm_node *cn = &out->nodes[j];

        cn->name = nm(a, o->name);
        cn->input_shapes = o->shapes >= 0 ? nm(a, o->shapes) : NULL;
        cn->input_dtypes = o->dtypes >= 0 ? nm(a, o->dtypes) : NULL;
        cn->ext = o->ext;
        cn->start_ns = o->start;
        cn->end_ns = o->end;
        cn->step = -1;
        cn->n = 1; /* its own span */
        if (o->ext) {
            ext[n_ext++] = (struct key_idx){ o->ext, (int32_t) j };
        }
    }
    out->n_nodes = n;
    /* NCCL: the kernels of a node's external id are its intervals too. */
    qsort(ext, n_ext, sizeof(*ext), cmp_key_idx);
    for (size_t i = 0; out->nccl && i < a->n_devs; i++) {
        const struct key_idx *k;

        if (a->devs[i].kind == DEV_KERNEL &&
            (k = find_key(ext, n_ext, dev_ext(a, &a->devs[i]))) != NULL) {
            out->nodes[k->idx].n++;
        }
    }
    for (size_t j = 0; j < n; j++) {
        out->nodes[j].first = n_ranges;
        n_ranges += out->nodes[j].n;
        out->nodes[j].n = 1;
    }
    out->ranges = calloc(n_ranges + 1, sizeof(*out->ranges));
    if (!out->ranges) {
        goto out;
    }
    for (size_t j = 0; j < n; j++) {
        out->ranges[out->nodes[j].first] =
            (struct kp_range){ out->nodes[j].start_ns, out->nodes[j].end_ns };
    }
    for (size_t i = 0; out->nccl && i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        const struct key_idx *k;

        if (d->kind == DEV_KERNEL && (k = find_key(ext, n_ext, dev_ext(a, d))) != NULL) {
            struct kp_an_comm_node *cn = &out->nodes[k->idx];

            out->ranges[cn->first + cn->n++] = (struct kp_range){ d->start, d->end };
        }
    }
    for (size_t j = 0; j < n; j++) {
        qsort(out->ranges + out->nodes[j].first, out->nodes[j].n, sizeof(*out->ranges),
              cmp_range_start_end_desc);
    }
    /* Each node goes to the first step that contains it, walking both in time order; a node
     * that straddles a step end gets none, and after the last step none do. */
    for (size_t j = 0; j < n && s < a->bd.n_steps; j++) {
        struct kp_an_comm_node *cn = &out->nodes[j];

        while (s < a->bd.n_steps) {
            if (cn->start_ns >= a->steps[s].start_ns && cn->end_ns <= a->steps[s].end_ns) {
                cn->step = (int32_t) s;
                break;
            }
            if (cn->start_ns < a->steps[s].end_ns) {
                break;
            }
            s++;
        }
    }
    rc = 0;
out:
    free(v);
    free(ext);
    if (rc < 0) {
        kp_an_comm_fini(out);
    }
    return rc;
}

void kp_an_comm_fini(struct kp_an_comm *c)
{
    free(c->nodes);
    free(c->ranges);
    c->nodes = NULL;
    c->ranges = NULL;
    c->n_nodes = 0;
}

/* ---- memory view (spec §10) ----------------------------------------------------------- */

#define MEM_SLOTS  (KP_AN_MAX_GPUS + 1) /* 0: CPU, 1 + n: GPU n */
#define MEM_FIELDS 7 /* self inc, self alloc, self count, inc, alloc, count, calls */

/* Adds node x's self figures and those of its live descendants into its inclusive ones. */
static void mem_inclusive(const struct kp_an *a, int64_t *st, int32_t x)
{
    for (int32_t ch = a->nodes[x].first_child; ch >= 0; ch = a->nodes[ch].next_sib) {
        mem_inclusive(a, st, ch);
        for (int s = 0; s < MEM_SLOTS; s++) {
            for (int k = 0; k < 3; k++) {
                st[((size_t) x * MEM_SLOTS + s) * 3 + k] +=
                    st[((size_t) ch * MEM_SLOTS + s) * 3 + k];
            }
        }
    }
}

int kp_an_memory(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows,
                 struct kp_an_memory *out, char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    PGresult *r = NULL;
    size_t budget = 0, n;
    int64_t *self = NULL, *incl = NULL, *by_name = NULL;
    bool seen[MEM_SLOTS] = { false };
    int rc;

    memset(out, 0, sizeof(*out));
    if (!a->built && (rc = build_model(a)) < 0) {
        return rc;
    }
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    rc = kp_an_query(c, 2,
                     "SELECT start_ns, bytes, tid, device_type, device FROM memory_events" WHERE_RR
                     " ORDER BY start_ns",
                     params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    self = calloc((a->n_nodes + 1) * MEM_SLOTS * 3, sizeof(*self));
    incl = calloc((a->n_nodes + 1) * MEM_SLOTS * 3, sizeof(*incl));
    by_name = calloc((a->names.n + 1) * MEM_SLOTS * MEM_FIELDS, sizeof(*by_name));
    if (!self || !incl || !by_name) {
        rc = -ENOMEM;
        goto out;
    }
    n = (size_t) PQntuples(r);
    for (size_t i = 0; i < n; i++) {
        int row = (int) i;
        int64_t ts = kp_pg_i64(r, row, 0, 0), bytes = kp_pg_i64(r, row, 1, 0),
                dtype = kp_pg_i64(r, row, 3, 0);
        int64_t dev = kp_pg_i64(r, row, 4, 0);
        int32_t x = root_of(a, kp_pg_i64(r, row, 2, 0)), in;
        int slot;
        int64_t *v;

        if (dtype == 0) {
            slot = 0;
        }
        else if (dtype == 1 && dev >= 0 && dev < KP_AN_MAX_GPUS) {
            slot = 1 + (int) dev;
        }
        else {
            continue;
        }
        seen[slot] = true;
        /* the innermost node with start <= ts < end */
        for (in = x; in >= 0;) {
            x = in;
            in = -1;
            for (int32_t ch = a->nodes[x].first_child; ch >= 0; ch = a->nodes[ch].next_sib) {
                if (!a->nodes[ch].dead && a->nodes[ch].start <= ts && ts < a->nodes[ch].end) {
                    in = ch;
                    break;
                }
            }
        }
        if (x < 0 || a->nodes[x].type != NODE_OPERATOR) {
            continue;
        }
        v = &self[((size_t) x * MEM_SLOTS + slot) * 3];
        v[0] += bytes;
        v[1] += bytes > 0 ? bytes : 0;
        v[2] += bytes > 0;
    }
    memcpy(incl, self, (a->n_nodes + 1) * MEM_SLOTS * 3 * sizeof(*incl));
    for (size_t i = 0; i < a->n_roots; i++) {
        mem_inclusive(a, incl, a->roots[i].node);
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        const struct an_node *x = &a->nodes[i];
        int32_t name;

        if (x->dead || x->type != NODE_OPERATOR || a->ops[x->op].name < 0) {
            continue;
        }
        name = a->ops[x->op].name;
        for (int s = 0; s < MEM_SLOTS; s++) {
            int64_t *v = &by_name[((size_t) name * MEM_SLOTS + s) * MEM_FIELDS];

            for (int k = 0; k < 3; k++) {
                v[k] += self[(i * MEM_SLOTS + s) * 3 + k];
                v[3 + k] += incl[(i * MEM_SLOTS + s) * 3 + k];
            }
            v[6]++;
        }
    }
    for (int s = 0; s < MEM_SLOTS; s++) {
        for (size_t m = 0; m < a->names.n; m++) {
            const int64_t *v = &by_name[(m * MEM_SLOTS + (size_t) s) * MEM_FIELDS];

            out->n_rows += seen[s] && (v[0] || v[1] || v[2] || v[3] || v[4] || v[5]);
        }
    }
    out->rows = calloc(out->n_rows + 1, sizeof(*out->rows));
    if (!out->rows) {
        rc = -ENOMEM;
        goto out;
    }
    out->n_rows = 0;
    for (int s = 0; s < MEM_SLOTS; s++) {
        out->seen[s] = seen[s];
        if (!seen[s]) {
            continue;
        }
        for (size_t m = 0; m < a->names.n; m++) {
            const int64_t *v = &by_name[(m * MEM_SLOTS + (size_t) s) * MEM_FIELDS];
            struct kp_an_mem_row *o = &out->rows[out->n_rows];

            if (!v[0] && !v[1] && !v[2] && !v[3] && !v[4] && !v[5]) {
                continue;
            }
            o->slot = s;
            o->name = a->names.v[m].s;
            memcpy(o->v, v, sizeof(o->v));
            out->n_rows++;
        }
    }
    rc = 0;
out:
    PQclear(r);
    free(self);
    free(incl);
    free(by_name);
    return rc;
}

void kp_an_memory_fini(struct kp_an_memory *m)
{
    free(m->rows);
    memset(m, 0, sizeof(*m));
}

int kp_an_memory_json(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows, FILE *f,
                      char *errbuf, size_t errlen)
{
    struct kp_an_memory m;
    int n_dev = 0, rc, first_dev = 1;
    size_t i = 0;

    if ((rc = kp_an_memory(a, c, run, rank, max_rows, &m, errbuf, errlen)) < 0) {
        return rc;
    }
    for (int s = 0; s < MEM_SLOTS; s++) {
        n_dev += m.seen[s];
    }
    fprintf(f, "{\"device_count\": %d, \"devices\": {", n_dev);
    for (int s = 0; s < MEM_SLOTS; s++) {
        int first = 1;

        if (!m.seen[s]) {
            continue;
        }
        if (s == 0) {
            fprintf(f, "%s\"CPU\": {", first_dev ? "" : ", ");
        }
        else {
            fprintf(f, "%s\"GPU%d\": {", first_dev ? "" : ", ", s - 1);
        }
        first_dev = 0;
        for (; i < m.n_rows && m.rows[i].slot == s; i++) {
            const int64_t *v = m.rows[i].v;

            fprintf(f, "%s", first ? "" : ", ");
            first = 0;
            kp_json_fputs(f, m.rows[i].name);
            fprintf(f,
                    ": {\"self_increase_bytes\": %" PRId64 ", \"self_alloc_bytes\": %" PRId64
                    ", \"self_alloc_count\": %" PRId64 ", \"increase_bytes\": %" PRId64
                    ", \"alloc_bytes\": %" PRId64 ", \"alloc_count\": %" PRId64
                    ", \"calls\": %" PRId64 "}",
                    v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
        }
        fputc('}', f);
    }
    fprintf(f, "}}");
    kp_an_memory_fini(&m);
    return 0;
}

/* ---- operator view (spec §5) ---------------------------------------------------------- */

struct op_sort {
    const struct kp_an *a;
    bool by_shape;
};

/* An op's input shapes as the operator view keys and shows them: "[]" when none were recorded,
 * so that every op of a name without shapes falls into one group, as the plugin's do. */
static const char *op_shapes(const struct kp_an *a, const struct an_op *o)
{
    return o->shapes >= 0 ? nm(a, o->shapes) : "[]";
}

static int cmp_op_nodes(const void *pa, const void *pb, void *ctx)
{
    const struct kp_an *sort_an = ((const struct op_sort *) ctx)->a;
    bool sort_by_shape = ((const struct op_sort *) ctx)->by_shape;
    const struct an_node *x = &sort_an->nodes[*(const int32_t *) pa];
    const struct an_node *y = &sort_an->nodes[*(const int32_t *) pb];
    const struct an_op *ox = &sort_an->ops[x->op], *oy = &sort_an->ops[y->op];
    int c = strcmp(nm(sort_an, ox->name), nm(sort_an, oy->name));

    if (c == 0 && sort_by_shape) {
        c = strcmp(op_shapes(sort_an, ox), op_shapes(sort_an, oy));
    }
    if (c == 0) {
        c = (*(const int32_t *) pa > *(const int32_t *) pb) -
            (*(const int32_t *) pa < *(const int32_t *) pb);
    }
    return c;
}

static int cmp_op_rows(const void *pa, const void *pb, void *ctx)
{
    bool sort_by_device = *(const bool *) ctx;
    const struct kp_an_op_row *x = pa, *y = pb;
    int64_t vx = sort_by_device ? x->device_self_ns : x->host_self_ns;
    int64_t vy = sort_by_device ? y->device_self_ns : y->host_self_ns;
    int c;

    if (vx != vy) {
        return vx > vy ? -1 : 1;
    }
    c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->input_shape, y->input_shape);
}

int kp_an_ops(struct kp_an *a, bool by_shape, const struct kp_an_table **out)
{
    struct kp_an_table *t = &a->ops_tab[by_shape];
    struct kp_an_op_row *rows;
    int32_t *idx;
    size_t n = 0, nr = 0;
    bool by_device;
    int rc;

    if (!a->built && (rc = build_model(a)) < 0) {
        return rc;
    }
    idx = calloc(a->n_nodes + 1, sizeof(*idx));
    rows = calloc(a->n_nodes + 1, sizeof(*rows));
    if (!idx || !rows) {
        free(idx);
        free(rows);
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        if (!a->nodes[i].dead && a->nodes[i].type == NODE_OPERATOR) {
            idx[n++] = (int32_t) i;
        }
    }
    /* groups keep tree order inside */
    qsort_r(idx, n, sizeof(*idx), cmp_op_nodes, &(struct op_sort){ a, by_shape });
    for (size_t i = 0; i < n; i++) {
        const struct an_node *x = &a->nodes[idx[i]];
        const struct an_op *o = &a->ops[x->op];
        struct kp_an_op_row *r = nr ? &rows[nr - 1] : NULL;

        if (!r || strcmp(r->name, nm(a, o->name)) != 0 ||
            (by_shape && strcmp(r->input_shape, op_shapes(a, o)) != 0)) {
            r = &rows[nr++];
            r->name = nm(a, o->name);
            r->input_shape = op_shapes(a, o);
        }
        r->calls++;
        r->host_total_ns += x->end - x->start;
        r->host_self_ns += x->host_self;
        r->device_total_ns += x->dev_total;
        r->device_self_ns += x->dev_self;
        r->tc_self_ns += x->tc_self;
        r->tc_total_ns += x->tc_total;
        r->tc_eligible = r->tc_eligible || x->eligible;
    }
    free(idx);
    by_device = a->n_devs > 0;
    qsort_r(rows, nr, sizeof(*rows), cmp_op_rows, &by_device);
    free(t->rows);
    t->rows = rows;
    t->n = nr;
    *out = t;
    return 0;
}

/* ---- kernel view (spec §6) ------------------------------------------------------------ */

static void fmt_dim(char *buf, size_t len, bool has, const int32_t *v)
{
    if (has) {
        snprintf(buf, len, "[%d, %d, %d]", v[0], v[1], v[2]);
    }
    else {
        snprintf(buf, len, "None");
    }
}

static int cmp_kernel_rows_key(const void *pa, const void *pb)
{
    const struct kp_an_kernel_row *x = pa, *y = pb;
    int c = strcmp(x->name, y->name);

    if (c == 0) {
        c = strcmp(x->op_name, y->op_name);
    }
    if (c == 0) {
        c = strcmp(x->grid, y->grid);
    }
    if (c == 0) {
        c = strcmp(x->block, y->block);
    }
    if (c == 0 && x->registers != y->registers) {
        c = x->registers < y->registers ? -1 : 1;
    }
    if (c == 0 && x->shared_memory != y->shared_memory) {
        c = x->shared_memory < y->shared_memory ? -1 : 1;
    }
    return c;
}

static int cmp_kernel_rows_total(const void *pa, const void *pb)
{
    const struct kp_an_kernel_row *x = pa, *y = pb;

    if (x->total_ns != y->total_ns) {
        return x->total_ns > y->total_ns ? -1 : 1;
    }
    return cmp_kernel_rows_key(pa, pb);
}

int kp_an_kernels(struct kp_an *a, bool by_op, const struct kp_an_table **out)
{
    struct kp_an_table *t = &a->kern_tab[by_op];
    struct kp_an_kernel_row *rows;
    size_t n = 0, nr = 0;
    int rc;

    if (!a->built && (rc = build_model(a)) < 0) {
        return rc;
    }
    rows = calloc(a->n_kernels + 1, sizeof(*rows));
    if (!rows) {
        return -ENOMEM;
    }
    /* One row per kernel, then sorted by key and folded. */
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        struct kp_an_kernel_row *r = &rows[n];

        if (d->kind != DEV_KERNEL) {
            continue;
        }
        r->name = nm(a, d->name);
        r->op_name = "";
        if (by_op) {
            int32_t owner = d->rt >= 0 ? a->rts[d->rt].owner : -1;
            const struct an_node *node;

            if (owner < 0) {
                continue; /* not reached through the tree */
            }
            node = &a->nodes[owner];
            r->op_name = node->op >= 0 ? nm(a, a->ops[node->op].name) : "CallTreeRoot";
            r->op_tc_eligible = node->eligible;
            fmt_dim(r->grid, sizeof(r->grid), d->has_grid, d->grid);
            fmt_dim(r->block, sizeof(r->block), d->has_block, d->block);
            r->registers = d->regs;
            r->shared_memory = d->smem;
        }
        r->calls = 1;
        r->total_ns = r->min_ns = r->max_ns = d->end - d->start;
        /* duration-weighted means; a kernel without the figure counts as 0 (spec §6) */
        r->wsum_blocks_per_sm = isnan(d->bps) ? 0.0 : d->bps * (double) r->total_ns;
        r->wsum_occupancy = isnan(d->occ) ? 0.0 : d->occ * (double) r->total_ns;
        n++;
    }
    qsort(rows, n, sizeof(*rows), cmp_kernel_rows_key);
    for (size_t i = 0; i < n; i++) {
        if (nr > 0 && cmp_kernel_rows_key(&rows[nr - 1], &rows[i]) == 0) {
            struct kp_an_kernel_row *r = &rows[nr - 1];

            r->calls++;
            r->total_ns += rows[i].total_ns;
            r->min_ns = rows[i].min_ns < r->min_ns ? rows[i].min_ns : r->min_ns;
            r->max_ns = rows[i].max_ns > r->max_ns ? rows[i].max_ns : r->max_ns;
            r->wsum_blocks_per_sm += rows[i].wsum_blocks_per_sm;
            r->wsum_occupancy += rows[i].wsum_occupancy;
        }
        else {
            rows[nr++] = rows[i];
        }
    }
    for (size_t i = 0; i < nr; i++) {
        rows[i].tc_used = kp_an_is_tc_kernel(rows[i].name);
        rows[i].mean_blocks_per_sm =
            rows[i].total_ns ? rows[i].wsum_blocks_per_sm / (double) rows[i].total_ns : 0.0;
        rows[i].mean_est_achieved_occupancy =
            rows[i].total_ns ? rows[i].wsum_occupancy / (double) rows[i].total_ns : 0.0;
    }
    qsort(rows, nr, sizeof(*rows), cmp_kernel_rows_total);
    free(t->rows);
    t->rows = rows;
    t->n = nr;
    *out = t;
    return 0;
}

/* ---- JSON ----------------------------------------------------------------------------- */

/* ns as exact decimal µs. */
static void json_us(FILE *f, int64_t ns)
{
    uint64_t u = ns < 0 ? (uint64_t) 0 - (uint64_t) ns : (uint64_t) ns;
    unsigned frac = (unsigned) (u % 1000);

    if (ns < 0) {
        fputc('-', f);
    }
    if (frac == 0) {
        fprintf(f, "%" PRIu64, u / 1000);
        return;
    }
    if (frac % 100 == 0) {
        fprintf(f, "%" PRIu64 ".%u", u / 1000, frac / 100);
    }
    else if (frac % 10 == 0) {
        fprintf(f, "%" PRIu64 ".%02u", u / 1000, frac / 10);
    }
    else {
        fprintf(f, "%" PRIu64 ".%03u", u / 1000, frac);
    }
}

void kp_an_json_us(FILE *f, int64_t ns)
{
    json_us(f, ns);
}

static void json_dbl(FILE *f, double v)
{
    if (v == (double) (int64_t) v && v < 1e15 && v > -1e15) {
        fprintf(f, "%" PRId64, (int64_t) v);
    }
    else {
        fprintf(f, "%.17g", v);
    }
}

void kp_an_breakdown_json(FILE *f, const struct kp_an_breakdown *b)
{
    fprintf(f,
            "{\"flags\": {\"has_runtime\": %s, \"has_kernel\": %s, \"has_memcpy_or_memset\": "
            "%s, \"has_communication\": %s}, \"comm_node_count\": %zu, \"step_count\": %zu, "
            "\"steps\": [",
            b->has_runtime ? "true" : "false", b->has_kernel ? "true" : "false",
            b->has_memcpy_or_memset ? "true" : "false", b->has_communication ? "true" : "false",
            b->comm_node_count, b->n_steps);
    for (size_t s = 0; s < b->n_steps; s++) {
        const struct kp_an_step *st = &b->steps[s];

        fprintf(f, "%s{\"index\": %zu, \"name\": ", s ? ", " : "", s);
        kp_json_fputs(f, st->name);
        fprintf(f, ", \"start_us\": ");
        json_us(f, st->start_ns);
        fprintf(f, ", \"end_us\": ");
        json_us(f, st->end_ns);
        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            fprintf(f, ", \"%s\": ", kp_an_cat_keys[c]);
            json_us(f, st->cost_ns[c]);
        }
        fprintf(f, ", \"total_us\": ");
        json_us(f, st->end_ns - st->start_ns);
        fprintf(f, ", \"overlap\": {\"computation_us\": ");
        json_us(f, st->computation_ns - st->overlap_ns);
        fprintf(f, ", \"overlapping_us\": ");
        json_us(f, st->overlap_ns);
        fprintf(f, ", \"communication_us\": ");
        json_us(f, st->communication_ns - st->overlap_ns);
        fprintf(f, ", \"other_us\": ");
        json_us(f, st->end_ns - st->start_ns + st->overlap_ns - st->computation_ns -
                       st->communication_ns);
        fputs("}}", f);
    }
    fprintf(f, "], \"avg_step\": {");
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        fprintf(f, "%s\"%s\": ", c ? ", " : "", kp_an_cat_keys[c]);
        json_dbl(f, b->avg_ns[c] / 1000.0);
    }
    fprintf(f, ", \"total_us\": ");
    json_dbl(f, b->avg_total_ns / 1000.0);
    fprintf(f, "}, \"gpu\": {\"gpu_ids\": [");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s%d", i ? ", " : "", b->gpu_ids[i]);
    }
    fprintf(f, "], \"per_device\": {");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s\"%d\": {\"utilization\": ", i ? ", " : "", b->gpu_ids[i]);
        json_dbl(f, b->gpu_utilization[i]);
        fprintf(f, ", \"est_sm_efficiency\": ");
        if (b->est_sm_efficiency_defined[i]) {
            json_dbl(f, b->est_sm_efficiency[i]);
        }
        else {
            fprintf(f, "null");
        }
        fprintf(f, ", \"est_achieved_occupancy\": ");
        if (b->est_achieved_occupancy_defined[i]) {
            json_dbl(f, b->est_achieved_occupancy[i]);
        }
        else {
            fprintf(f, "null");
        }
        fputc('}', f);
    }
    fprintf(f, "}, \"util_timeline\": {");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s\"%d\": [", i ? ", " : "", b->gpu_ids[i]);
        for (size_t j = 0; j < b->n_util_points[i]; j++) {
            fprintf(f, "%s[", j ? ", " : "");
            json_us(f, b->util_timeline[i][j].t_ns); /* exact: epoch ns exceed a double */
            fprintf(f, ", ");
            json_dbl(f, b->util_timeline[i][j].value);
            fputc(']', f);
        }
        fputc(']', f);
    }
    fprintf(f, "}, \"sm_efficiency_ranges\": {");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s\"%d\": [", i ? ", " : "", b->gpu_ids[i]);
        for (size_t j = 0; j < b->n_sm_ranges[i]; j++) {
            const struct kp_an_sm_range *s = &b->sm_ranges[i][j];

            fprintf(f, "%s[", j ? ", " : "");
            json_us(f, s->start_ns);
            fprintf(f, ", ");
            json_us(f, s->end_ns);
            fprintf(f, ", ");
            json_dbl(f, s->value);
            fputc(']', f);
        }
        fputc(']', f);
    }
    fprintf(f, "}}}");
}

static double ratio(int64_t num, int64_t den)
{
    return den ? (double) num / (double) den : 0.0;
}

void kp_an_ops_json(FILE *f, const struct kp_an_table *t)
{
    const struct kp_an_op_row *rows = t->rows;

    fprintf(f, "{\"count\": %zu, \"rows\": [", t->n);
    for (size_t i = 0; i < t->n; i++) {
        const struct kp_an_op_row *r = &rows[i];

        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        kp_json_fputs(f, r->name);
        fprintf(f, ", \"input_shape\": ");
        kp_json_fputs(f, r->input_shape);
        fprintf(f, ", \"calls\": %" PRIu64 ", \"host_total_us\": ", r->calls);
        json_us(f, r->host_total_ns);
        fprintf(f, ", \"host_self_us\": ");
        json_us(f, r->host_self_ns);
        fprintf(f, ", \"device_total_us\": ");
        json_us(f, r->device_total_ns);
        fprintf(f, ", \"device_self_us\": ");
        json_us(f, r->device_self_ns);
        fprintf(f, ", \"tc_eligible\": %s, \"tc_self_ratio\": ", r->tc_eligible ? "true" : "false");
        json_dbl(f, ratio(r->tc_self_ns, r->device_self_ns));
        fprintf(f, ", \"tc_total_ratio\": ");
        json_dbl(f, ratio(r->tc_total_ns, r->device_total_ns));
        fputc('}', f);
    }
    fprintf(f, "]}");
}

static void json_dim(FILE *f, const char *s)
{
    fputs(strcmp(s, "None") == 0 ? "null" : s, f); /* "[x, y, z]" is JSON already */
}

void kp_an_kernels_json(FILE *f, const struct kp_an_table *t, bool by_op)
{
    const struct kp_an_kernel_row *rows = t->rows;

    fprintf(f, "{\"count\": %zu, \"rows\": [", t->n);
    for (size_t i = 0; i < t->n; i++) {
        const struct kp_an_kernel_row *r = &rows[i];

        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        kp_json_fputs(f, r->name);
        if (by_op) {
            fprintf(f, ", \"op_name\": ");
            kp_json_fputs(f, r->op_name);
            fprintf(f, ", \"grid\": ");
            json_dim(f, r->grid);
            fprintf(f, ", \"block\": ");
            json_dim(f, r->block);
            fprintf(f,
                    ", \"registers_per_thread\": %" PRId64 ", \"shared_memory\": %" PRId64
                    ", \"op_tc_eligible\": %s",
                    r->registers, r->shared_memory, r->op_tc_eligible ? "true" : "false");
        }
        fprintf(f, ", \"calls\": %" PRIu64 ", \"total_us\": ", r->calls);
        json_us(f, r->total_ns);
        fprintf(f, ", \"mean_us\": ");
        json_dbl(f, (double) r->total_ns / (double) r->calls / 1000.0);
        fprintf(f, ", \"min_us\": ");
        json_us(f, r->min_ns);
        fprintf(f, ", \"max_us\": ");
        json_us(f, r->max_ns);
        fprintf(f, ", \"mean_blocks_per_sm\": ");
        json_dbl(f, r->mean_blocks_per_sm);
        fprintf(f, ", \"mean_est_achieved_occupancy\": ");
        json_dbl(f, r->mean_est_achieved_occupancy);
        fprintf(f, ", \"tc_used\": %s}", r->tc_used ? "true" : "false");
    }
    fprintf(f, "]}");
}

/* ---- Tensor Core statistics (spec §7) ------------------------------------------------- */

int kp_an_tensor_cores(struct kp_an *a, struct kp_an_tc *out)
{
    int64_t kern[KP_AN_MAX_GPUS] = { 0 }, tc[KP_AN_MAX_GPUS] = { 0 }, bottom = 0, all = 0;
    bool seen[KP_AN_MAX_GPUS] = { false }, any = false;
    int rc;

    if (!a->built && (rc = build_model(a)) < 0) {
        return rc;
    }
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int32_t owner;

        if (d->kind != DEV_KERNEL || d->device < 0 || d->device >= KP_AN_MAX_GPUS) {
            continue;
        }
        seen[d->device] = true;
        owner = d->rt >= 0 ? a->rts[d->rt].owner : -1;
        if (owner < 0 || a->nodes[owner].type != NODE_OPERATOR) {
            continue; /* only kernels launched by operators */
        }
        any = true;
        kern[d->device] += d->end - d->start;
        if (kp_an_is_tc_kernel(nm(a, d->name))) {
            tc[d->device] += d->end - d->start;
        }
    }
    for (int g = 0; g < KP_AN_MAX_GPUS; g++) {
        if (!seen[g]) {
            continue;
        }
        out->gpu_ids[out->n_gpus] = g;
        out->tc_ratio[out->n_gpus] = kern[g] ? (double) tc[g] / (double) kern[g] : 0.0;
        out->n_gpus++;
    }
    out->tc_ratio_defined = any;
    for (size_t i = 0; i < a->n_nodes; i++) {
        const struct an_node *n = &a->nodes[i];

        if (n->dead || n->type != NODE_OPERATOR) {
            continue;
        }
        all += n->kern_self;
        if (n->eligible && !n->eligible_below) {
            bottom += n->kern_self;
        }
    }
    out->eligible_ops_kernel_ratio = all ? (double) bottom / (double) all : 0.0;
    return 0;
}

void kp_an_tc_json(FILE *f, const struct kp_an_tc *t)
{
    fprintf(f, "{\"tc_ratio_per_gpu\": ");
    if (!t->tc_ratio_defined) {
        fprintf(f, "null");
    }
    else {
        fputc('{', f);
        for (size_t i = 0; i < t->n_gpus; i++) {
            fprintf(f, "%s\"%d\": ", i ? ", " : "", t->gpu_ids[i]);
            json_dbl(f, t->tc_ratio[i]);
        }
        fputc('}', f);
    }
    fprintf(f, ", \"tc_eligible_ops_kernel_ratio\": ");
    json_dbl(f, t->eligible_ops_kernel_ratio);
    fputc('}', f);
}
