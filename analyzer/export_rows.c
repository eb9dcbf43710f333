/* kp_export: each table's rows as Kineto's events (docs/specs/export.md §2). */
#define KP_LOG_MODULE "export"
#include "export_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <zlib.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_kineto_ids.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

/* CUPTI's names, as kineto prints them (kp_kineto.c reads them back). */
static const char *const memcpy_kinds[] = { "Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                            "AtoD",    "DtoA", "DtoD", "HtoH", "PtoP" };
static const char *const memory_kinds[] = {
    "Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static"
};
static const char *const sync_types[] = { "Unknown", "Event Sync", "Stream Wait Event",
                                          "Stream Sync", "Context Sync" };
#define NAME_OF(tbl, i) \
    ((i) >= 0 && (size_t) (i) < sizeof(tbl) / sizeof(tbl[0]) ? tbl[(i)] : tbl[0])

/* The GPU rows' common args: device, context, stream, correlation, External id. */
static void gpu_args(struct xout *o, bool *first, int64_t dev, int64_t ctx, int64_t stream,
                     int64_t corr, int64_t ext)
{
    if (ext != 0) {
        kp__export_arg_i(o, first, "External id", ext);
    }
    kp__export_arg_i(o, first, "device", dev);
    kp__export_arg_i(o, first, "context", ctx);
    kp__export_arg_i(o, first, "stream", stream);
    kp__export_arg_i(o, first, "correlation", corr);
}

#define GPU_ORDER "ORDER BY (coalesce(t.device, 0) <> %d), t.start_ns"

static void row_kernel(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t dev = I(r, i, 3), stream = I(r, i, 4);
    bool first = true;

    kp__export_ev_x(x, "kernel", kp__export_nm0(x, r, i, 2), dev, stream, I(r, i, 0), I(r, i, 1),
                    true);
    gpu_args(o, &first, dev, I(r, i, 5), stream, I(r, i, 6), I(r, i, 7));
    kp__export_arg_i(o, &first, "registers per thread", I(r, i, 14));
    kp__export_arg_i(o, &first, "shared memory", I(r, i, 15));
    kp__export_arg_key(o, &first, "grid");
    kp__export_out_putc(o, '[');
    kp__export_out_i64(o, I(r, i, 8));
    XO_LIT(o, ", ");
    kp__export_out_i64(o, I(r, i, 9));
    XO_LIT(o, ", ");
    kp__export_out_i64(o, I(r, i, 10));
    XO_LIT(o, "], \"block\": [");
    kp__export_out_i64(o, I(r, i, 11));
    XO_LIT(o, ", ");
    kp__export_out_i64(o, I(r, i, 12));
    XO_LIT(o, ", ");
    kp__export_out_i64(o, I(r, i, 13));
    kp__export_out_putc(o, ']');
    if (I(r, i, 16) != 0) {
        kp__export_arg_i(o, &first, "graph id", I(r, i, 16));
    }
    if (I(r, i, 17) != 0) {
        kp__export_arg_i(o, &first, "graph node id", I(r, i, 17));
    }
    /* float8 text is the shortest form that reads back to the same double */
    for (int c = 18; c <= 19; c++) {
        const char *v = PQgetvalue(r, i, c);

        if (!PQgetisnull(r, i, c) && strcmp(v, "NaN") != 0) {
            XO_LIT(o, ", \"");
            {
                const char *key = c == 18 ? "blocks per SM" : "est. achieved occupancy %";

                kp__export_out_put(o, key, strlen(key));
            }
            XO_LIT(o, "\": ");
            kp__export_out_put(o, v, strlen(v));
        }
    }
    XO_LIT(o, "}}");
    x->rows[KP_EV_KERNEL]++;
}

/* "memory bandwidth (GB/s)": the trace's figure (column col, float8 text: the shortest form
 * that reads back to the same double) when the import kept one, else bytes / ns, all 17
 * digits: the figure kprof-hta's §11 uses either way. */
static void arg_bandwidth(struct xout *o, const PGresult *r, int i, int col, int64_t bytes,
                          int64_t dur)
{
    char bw[80];

    if (!PQgetisnull(r, i, col)) {
        snprintf(bw, sizeof(bw), ", \"memory bandwidth (GB/s)\": %s", PQgetvalue(r, i, col));
    }
    else if (dur > 0) {
        snprintf(bw, sizeof(bw), ", \"memory bandwidth (GB/s)\": %.17g",
                 (double) bytes / (double) dur);
    }
    else {
        return;
    }
    kp__export_out_put(o, bw, strlen(bw));
}

/* The event and GPU args of a memcpy, memset or sync row: its columns 0 start, 1 duration,
 * 2 device, 3 stream, 4 context, 5 correlation; ext the external id (0: none). */
static void gpu_row(struct xp *x, const PGresult *r, int i, const char *cat, const char *name,
                    int64_t ext, bool *first)
{
    int64_t dev = I(r, i, 2), stream = I(r, i, 3);

    kp__export_ev_x(x, cat, name, dev, stream, I(r, i, 0), I(r, i, 1), true);
    gpu_args(&x->out, first, dev, I(r, i, 4), stream, I(r, i, 5), ext);
}

static void row_memcpy(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t bytes = I(r, i, 7), dur = I(r, i, 1);
    int64_t src_dev = I(r, i, 11), dst_dev = I(r, i, 12);
    char name[96];
    bool first = true;

    snprintf(name, sizeof(name), "Memcpy %s (%s -> %s)", NAME_OF(memcpy_kinds, I(r, i, 8)),
             NAME_OF(memory_kinds, I(r, i, 9)), NAME_OF(memory_kinds, I(r, i, 10)));
    gpu_row(x, r, i, "gpu_memcpy", name, I(r, i, 6), &first);
    kp__export_arg_i(o, &first, "bytes", bytes);
    arg_bandwidth(o, r, i, 13, bytes, dur);
    if (src_dev != 0 || dst_dev != 0) {
        kp__export_arg_i(o, &first, "fromDevice", src_dev);
        kp__export_arg_i(o, &first, "toDevice", dst_dev);
    }
    XO_LIT(o, "}}");
    x->rows[KP_EV_MEMCPY]++;
}

static void row_memset(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t bytes = I(r, i, 7), dur = I(r, i, 1);
    char name[64];
    bool first = true;

    snprintf(name, sizeof(name), "Memset (%s)", NAME_OF(memory_kinds, I(r, i, 8)));
    gpu_row(x, r, i, "gpu_memset", name, I(r, i, 6), &first);
    kp__export_arg_i(o, &first, "bytes", bytes);
    arg_bandwidth(o, r, i, 9, bytes, dur);
    XO_LIT(o, "}}");
    x->rows[KP_EV_MEMSET]++;
}

static void row_sync(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t ev = I(r, i, 7);
    bool first = true;

    gpu_row(x, r, i, "cuda_sync", NAME_OF(sync_types, I(r, i, 6)), 0, &first);
    if (ev != 0) {
        kp__export_arg_i(o, &first, "wait_on_cuda_event_id", ev);
    }
    XO_LIT(o, "}}");
    x->rows[KP_EV_SYNC]++;
}

static void row_api(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t dom = I(r, i, 4), corr = I(r, i, 6), ext = I(r, i, 7);
    bool first = true;

    kp__export_ev_x(x,
                    dom == 1   ? "cuda_runtime"
                    : dom == 2 ? "cuda_driver"
                               : "overhead",
                    kp__export_nm0(x, r, i, 2), x->pid, I(r, i, 3), I(r, i, 0), I(r, i, 1), false);
    if (ext != 0) {
        kp__export_arg_i(o, &first, "External id", ext);
    }
    kp__export_arg_i(o, &first, "cbid", I(r, i, 5));
    kp__export_arg_i(o, &first, "correlation", corr);
    XO_LIT(o, "}}");
    x->rows[KP_EV_API]++;
}

/* The args of a collective (columns c.. of r: name, dtype, in, out, group size, pg, seq). */
static void coll_args(struct xp *x, bool *first, const PGresult *r, int i, int c)
{
    struct xout *o = &x->out;

    kp__export_arg_s(o, first, "Collective name", kp__export_nm0(x, r, i, c));
    if (kp__export_nm(x, r, i, c + 1) != NULL) {
        kp__export_arg_s(o, first, "dtype", kp__export_nm(x, r, i, c + 1));
    }
    kp__export_arg_i(o, first, "In msg nelems", I(r, i, c + 2));
    kp__export_arg_i(o, first, "Out msg nelems", I(r, i, c + 3));
    kp__export_arg_i(o, first, "Group size", I(r, i, c + 4));
    if (kp__export_nm(x, r, i, c + 5) != NULL) {
        kp__export_arg_s(o, first, "Process Group Name", kp__export_nm(x, r, i, c + 5));
    }
    kp__export_arg_i(o, first, "Seq", I(r, i, c + 6));
}

enum {
    OP_UNSPEC = 0,
    OP_CPU = 1,
    OP_USER = 2,
    OP_GPU_USER = 3,
    OP_PY = 4,
    OP_NVTX = 5,
    OP_STEP = 6
};

/* Columns: 0 start, 1 dur, 2 name, 3 kind, 4 tid, 5 op_id, 6 parent_id, 7 seq, 8 fwd_tid,
 * 9 external_id, 10 shapes, 11 dtypes, 12 device, 13 stream, 14 has a collective ('t'/'f'),
 * 15.. the collective (coll_args). Names are names.id (NM). */
static void row_op(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t kind = I(r, i, 3), tid = I(r, i, 4), op_id = I(r, i, 5), parent = I(r, i, 6);
    int64_t seq = I(r, i, 7), fwd = I(r, i, 8), ext = I(r, i, 9);
    const char *name = kp__export_nm0(x, r, i, 2);
    bool first = true;

    x->rows[KP_EV_OP]++;
    if (kind == OP_UNSPEC) { /* a [memory] instant (kp_kineto.h) */
        kp__export_ev_begin(x);
        XO_LIT(o, "{\"ph\": \"i\", \"s\": \"t\", \"cat\": \"cpu_instant_event\", \"name\": ");
        kp__export_out_jstr(o, name);
        XO_LIT(o, ", \"pid\": ");
        kp__export_out_i64(o, x->pid);
        XO_LIT(o, ", \"tid\": ");
        kp__export_out_i64(o, tid);
        XO_LIT(o, ", \"ts\": ");
        kp__export_out_us(o, I(r, i, 0) - x->base_ns);
        XO_LIT(o, ", \"args\": {");
        kp__export_track_seen(x, x->pid, tid, false);
        kp__export_arg_i(o, &first, "Total Reserved", parent);
        kp__export_arg_i(o, &first, "Total Allocated", op_id);
        kp__export_arg_i(o, &first, "Bytes", seq);
        kp__export_arg_i(o, &first, "Addr", ext);
        kp__export_arg_i(o, &first, "Device Id", I(r, i, 12));
        kp__export_arg_i(o, &first, "Device Type", I(r, i, 13));
        XO_LIT(o, "}}");
        return;
    }
    if (kind == OP_GPU_USER) {
        int64_t dev = I(r, i, 12) < 0 ? 0 : I(r, i, 12);

        kp__export_ev_x(x, "gpu_user_annotation", name, dev, I(r, i, 13), I(r, i, 0), I(r, i, 1),
                        true);
        if (ext != 0) {
            kp__export_arg_i(o, &first, "External id", ext);
        }
        XO_LIT(o, "}}");
        return;
    }
    if (kind == OP_PY) {
        kp__export_ev_x(x, "python_function", name, x->pid, tid, I(r, i, 0), I(r, i, 1), false);
        if ((uint64_t) op_id >= KP_KINETO_PY_ID_BASE) {
            kp__export_arg_i(o, &first, "Python id",
                             (int64_t) ((uint64_t) op_id - KP_KINETO_PY_ID_BASE));
        }
        if ((uint64_t) parent >= KP_KINETO_PY_ID_BASE) {
            kp__export_arg_i(o, &first, "Python parent id",
                             (int64_t) ((uint64_t) parent - KP_KINETO_PY_ID_BASE));
        }
        XO_LIT(o, "}}");
        return;
    }
    kp__export_ev_x(x, kind == OP_CPU ? "cpu_op" : "user_annotation", name, x->pid, tid, I(r, i, 0),
                    I(r, i, 1), false);
    if (op_id != 0 || ext != 0) {
        kp__export_arg_i(o, &first, "External id", op_id != 0 ? op_id : ext);
    }
    if (kp__export_nm(x, r, i, 10) != NULL) {
        kp__export_arg_key(o, &first, "Input Dims");
        kp__export_out_pylit(o, &x->tmp, kp__export_nm(x, r, i, 10));
    }
    if (kp__export_nm(x, r, i, 11) != NULL) {
        kp__export_arg_key(o, &first, "Input type");
        kp__export_out_pylit(o, &x->tmp, kp__export_nm(x, r, i, 11));
    }
    if (seq != -1) {
        kp__export_arg_i(o, &first, "Sequence number", seq);
    }
    if (fwd != 0) {
        kp__export_arg_i(o, &first, "Fwd thread id", fwd);
    }
    if (kind == OP_CPU && S(r, i, 14)[0] == 't') {
        coll_args(x, &first, r, i, 15);
        x->rows[KP_EV_COLLECTIVE]++;
    }
    XO_LIT(o, "}}");
    if (kind == OP_STEP) {
        x->rows[KP_EV_STEP]++;
    }
}

/* A collective without its record_param_comms op: columns 0 start, 1 dur, 2 tid, 3 ext,
 * 4.. as coll_args. */
static void row_lone_coll(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    bool first = true;

    kp__export_ev_x(x, "cpu_op", "record_param_comms", x->pid, I(r, i, 2), I(r, i, 0), I(r, i, 1),
                    false);
    if (I(r, i, 3) != 0) {
        kp__export_arg_i(o, &first, "External id", I(r, i, 3));
    }
    coll_args(x, &first, r, i, 4);
    XO_LIT(o, "}}");
    x->rows[KP_EV_COLLECTIVE]++;
}

/* A memory_events row (schema 2): 0 start, 1 name, 2 tid, 3 total_reserved,
 * 4 total_allocated, 5 bytes, 6 addr, 7 device, 8 device_type. */
static void row_memory(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t tid = I(r, i, 2);
    bool first = true;

    kp__export_ev_begin(x);
    XO_LIT(o, "{\"ph\": \"i\", \"s\": \"t\", \"cat\": \"cpu_instant_event\", \"name\": ");
    kp__export_out_jstr(o,
                        kp__export_nm(x, r, i, 1) != NULL ? kp__export_nm(x, r, i, 1) : "[memory]");
    XO_LIT(o, ", \"pid\": ");
    kp__export_out_i64(o, x->pid);
    XO_LIT(o, ", \"tid\": ");
    kp__export_out_i64(o, tid);
    XO_LIT(o, ", \"ts\": ");
    kp__export_out_us(o, I(r, i, 0) - x->base_ns);
    XO_LIT(o, ", \"args\": {");
    kp__export_track_seen(x, x->pid, tid, false);
    kp__export_arg_i(o, &first, "Total Reserved", I(r, i, 3));
    kp__export_arg_i(o, &first, "Total Allocated", I(r, i, 4));
    kp__export_arg_i(o, &first, "Bytes", I(r, i, 5));
    kp__export_arg_i(o, &first, "Addr", I(r, i, 6));
    kp__export_arg_i(o, &first, "Device Id", I(r, i, 7));
    kp__export_arg_i(o, &first, "Device Type", I(r, i, 8));
    XO_LIT(o, "}}");
    if (x->memory_kind >= 0) {
        x->rows[x->memory_kind]++;
    }
}

/* A step without its ProfilerStep#N op: 0 start, 1 dur, 2 step. */
static void row_lone_step(struct xp *x, const PGresult *r, int i)
{
    char name[48];

    snprintf(name, sizeof(name), "ProfilerStep#%s", S(r, i, 2));
    kp__export_ev_x(x, "user_annotation", name, x->pid, x->pid, I(r, i, 0), I(r, i, 1), false);
    XO_LIT(&x->out, "}}");
    x->rows[KP_EV_STEP]++;
}

static void range_close(struct xp *x)
{
    if (x->rng_open) {
        XO_LIT(&x->out, "}}");
        x->rng_open = false;
    }
}

/* A counters row: 0 correlation, 1 device, 2 metric, 3 value (float8 text: the shortest that
 * reads back to the same double), 4 the range's name row ('t'/'f'). Rows come by range. */
static void row_counter(struct xp *x, const PGresult *r, int i)
{
    static const char pfx[] = KP_KINETO_RANGE_NAME_PREFIX;
    struct xout *o = &x->out;
    int64_t corr = I(r, i, 0), dev = I(r, i, 1);
    bool is_name = S(r, i, 4)[0] == 't';
    const char *v = S(r, i, 3);

    x->rows[KP_EV_COUNTER]++;
    if (!x->rng_open || corr != x->rng_corr || dev != x->rng_dev) {
        const char *name = "range";
        bool first = true;

        range_close(x);
        if (is_name && strncmp(kp__export_nm0(x, r, i, 2), pfx, sizeof(pfx) - 1) == 0) {
            name = kp__export_nm0(x, r, i, 2) + sizeof(pfx) - 1;
        }
        kp__export_ev_x(x, "cuda_profiler_range", name, dev, 0, x->base_ns, 0, true);
        kp__export_arg_i(o, &first, "device", dev);
        if (corr > 0 && (uint64_t) corr < KP_KINETO_RANGE_ID_BASE) {
            kp__export_arg_i(o, &first, "correlation", corr);
        }
        x->rng_open = true;
        x->rng_corr = corr;
        x->rng_dev = dev;
    }
    /* import stores finite numbers only */
    if (is_name || strcmp(v, "NaN") == 0 || strcmp(v, "Infinity") == 0 ||
        strcmp(v, "-Infinity") == 0) {
        return;
    }
    XO_LIT(o, ", ");
    kp__export_out_jstr(o, kp__export_nm0(x, r, i, 2));
    XO_LIT(o, ": ");
    kp__export_out_put(o, v, strlen(v));
}

/* 0 api start, 1 api tid, 2 gpu start, 3 device, 4 stream, 5 correlation, 6 the API call's
 * first GPU activity ('t'/'f'): a CUDA-graph launch has one correlation for all its kernels,
 * and one flow start for them (as Kineto writes it). */
static void row_flow(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    const char *corr = S(r, i, 5);

    if (S(r, i, 6)[0] != 't') {
        goto end_only;
    }
    kp__export_ev_begin(x);
    XO_LIT(o, "{\"ph\": \"s\", \"id\": ");
    kp__export_out_put(o, corr, strlen(corr));
    XO_LIT(o, ", \"pid\": ");
    kp__export_out_i64(o, x->pid);
    XO_LIT(o, ", \"tid\": ");
    kp__export_out_i64(o, I(r, i, 1));
    XO_LIT(o, ", \"ts\": ");
    kp__export_out_us(o, I(r, i, 0) - x->base_ns);
    XO_LIT(o, ", \"cat\": \"ac2g\", \"name\": \"ac2g\"}");
end_only:
    kp__export_ev_begin(x);
    XO_LIT(o, "{\"ph\": \"f\", \"id\": ");
    kp__export_out_put(o, corr, strlen(corr));
    XO_LIT(o, ", \"pid\": ");
    kp__export_out_i64(o, I(r, i, 3));
    XO_LIT(o, ", \"tid\": ");
    kp__export_out_i64(o, I(r, i, 4));
    XO_LIT(o, ", \"ts\": ");
    kp__export_out_us(o, I(r, i, 2) - x->base_ns);
    XO_LIT(o, ", \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"}");
    x->flows++;
}

/* Runs sql (printf-style, built from fmt) through a cursor, cb on each row (cursor_each). */
static int each(struct xp *x, kp__export_row_cb *cb, const int *ncols, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int each(struct xp *x, kp__export_row_cb *cb, const int *ncols, const char *fmt, ...)
{
    char sql[EXPORT_SQL_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    return kp__export_cursor_each(x, sql, ncols, cb);
}

static const int nc_none[] = { -1 }, nc_2[] = { 2, -1 };

/* The GPU tables' events, the rank's own device first: import takes ranks.device from the
 * first GPU event. Returns 0, or an error with x->err set. */
int kp__export_write_gpu_events(struct xp *x)
{
    const long run = x->run, rank = x->rank;
    int rc;

    if ((rc = each(x, row_kernel, nc_2,
                   "SELECT t.start_ns, t.dur_ns, t.name, "
                   "coalesce(t.device, 0), coalesce(t.stream, 0), coalesce(t.context, 0), "
                   "coalesce(t.correlation, 0), coalesce(t.external_id, 0), coalesce(t.grid_x, 0), "
                   "coalesce(t.grid_y, 0), coalesce(t.grid_z, 0), coalesce(t.block_x, 0), "
                   "coalesce(t.block_y, 0), coalesce(t.block_z, 0), coalesce(t.registers, 0), "
                   "coalesce(t.static_smem, 0)::bigint + coalesce(t.dynamic_smem, 0), "
                   "coalesce(t.graph_id, 0), coalesce(t.graph_node_id, 0), o.blocks_per_sm, "
                   "o.est_occupancy FROM kernels t" KP_SQL_KERNEL_OCCUPANCY_JOIN(
                       "%ld", "%ld") " WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
                   run, rank, run, rank, x->device)) != 0) {
        return rc;
    }
    if ((rc =
             each(x, row_memcpy, nc_none,
                  "SELECT t.start_ns, t.dur_ns, coalesce(t.device, 0), coalesce(t.stream, 0), "
                  "coalesce(t.context, 0), coalesce(t.correlation, 0), coalesce(t.external_id, 0), "
                  "coalesce(t.bytes, 0), coalesce(t.copy_kind, 0), coalesce(t.src_kind, 0), "
                  "coalesce(t.dst_kind, 0), coalesce(t.src_device, 0), coalesce(t.dst_device, 0), "
                  "bw.bandwidth_gbps FROM memcpys t" KP_SQL_BANDWIDTH_JOIN(
                      "t", "memcpy_bandwidth", "%ld",
                      "%ld") " WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
                  run, rank, run, rank, x->device)) != 0) {
        return rc;
    }
    if ((rc =
             each(x, row_memset, nc_none,
                  "SELECT t.start_ns, t.dur_ns, coalesce(t.device, 0), coalesce(t.stream, 0), "
                  "coalesce(t.context, 0), coalesce(t.correlation, 0), coalesce(t.external_id, 0), "
                  "coalesce(t.bytes, 0), coalesce(t.mem_kind, 0), bw.bandwidth_gbps "
                  "FROM memsets t" KP_SQL_BANDWIDTH_JOIN(
                      "t", "memset_bandwidth", "%ld",
                      "%ld") " WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
                  run, rank, run, rank, x->device)) != 0) {
        return rc;
    }
    if ((rc = each(x, row_sync, nc_none,
                   "SELECT t.start_ns, t.dur_ns, coalesce(t.device, 0), coalesce(t.stream, 0), "
                   "coalesce(t.context, 0), coalesce(t.correlation, 0), coalesce(t.sync_type, 0), "
                   "coalesce(t.cuda_event, 0) "
                   "FROM syncs t WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
                   run, rank, x->device)) != 0) {
        return rc;
    }
    return 0;
}

/* The host's events: API calls, ops (each record_param_comms cpu_op with its collective),
 * collectives and steps without their op, memory events. Returns 0, or an error with x->err
 * set. */
int kp__export_write_host_events(struct xp *x)
{
    static const int nc_op[] = { 2, 10, 11, 15, 16, 20, -1 }, nc_coll[] = { 4, 5, 9, -1 };
    const long run = x->run, rank = x->rank;
    int rc;

    if ((rc = each(x, row_api, nc_2,
                   "SELECT t.start_ns, t.dur_ns, t.name, "
                   "coalesce(t.tid, 0), coalesce(t.domain, 1), coalesce(t.cbid, 0), "
                   "coalesce(t.correlation, 0), coalesce(t.external_id, 0) "
                   "FROM api_calls t WHERE t.run_id = %ld AND t.rank = %ld ORDER BY t.start_ns",
                   run, rank)) != 0) {
        return rc;
    }
    /* ops, each record_param_comms cpu_op with its collective */
    if ((rc = each(
             x, row_op, nc_op,
             "SELECT t.start_ns, t.dur_ns, t.name, "
             "coalesce(t.kind, 0), coalesce(t.tid, 0), coalesce(t.op_id, 0), "
             "coalesce(t.parent_id, 0), coalesce(t.seq, -1), coalesce(t.fwd_tid, 0), "
             "coalesce(t.external_id, 0), t.input_shapes, "
             "t.input_dtypes, coalesce(t.device, -1), "
             "coalesce(t.stream, 0), c.start_ns IS NOT NULL, c.name, c.dtype, "
             "coalesce(c.in_nelems, 0), "
             "coalesce(c.out_nelems, 0), coalesce(c.group_size, 0), "
             "c.process_group, coalesce(c.coll_seq, 0) FROM ops t LEFT JOIN collectives c ON c.run_id = t.run_id AND c.rank = t.rank "
             "AND t.kind = 1 AND c.start_ns = t.start_ns AND c.dur_ns = t.dur_ns "
             "AND coalesce(c.tid, 0) = coalesce(t.tid, 0) "
             "AND coalesce(c.external_id, 0) = coalesce(t.external_id, 0) "
             "WHERE t.run_id = %ld AND t.rank = %ld ORDER BY t.start_ns",
             run, rank)) != 0) {
        return rc;
    }
    if ((rc = each(
             x, row_lone_coll, nc_coll,
             "SELECT c.start_ns, c.dur_ns, coalesce(c.tid, 0), coalesce(c.external_id, 0), "
             "c.name, c.dtype, coalesce(c.in_nelems, 0), coalesce(c.out_nelems, 0), "
             "coalesce(c.group_size, 0), c.process_group, coalesce(c.coll_seq, 0) "
             "FROM collectives c WHERE c.run_id = %ld AND c.rank = %ld AND NOT EXISTS ("
             "SELECT 1 FROM ops t WHERE t.run_id = c.run_id AND t.rank = c.rank AND t.kind = 1 "
             "AND t.start_ns = c.start_ns AND t.dur_ns = c.dur_ns "
             "AND coalesce(t.tid, 0) = coalesce(c.tid, 0) "
             "AND coalesce(t.external_id, 0) = coalesce(c.external_id, 0)) ORDER BY c.start_ns",
             run, rank)) != 0) {
        return rc;
    }
    if ((rc = each(
             x, row_lone_step, nc_none,
             "SELECT s.start_ns, s.dur_ns, s.step FROM steps s WHERE s.run_id = %ld AND "
             "s.rank = %ld AND NOT EXISTS (SELECT 1 FROM ops t WHERE t.run_id = s.run_id AND "
             "t.rank = s.rank AND t.kind = 6 AND t.start_ns = s.start_ns AND t.dur_ns = s.dur_ns) "
             "ORDER BY s.start_ns",
             run, rank)) != 0) {
        return rc;
    }
    if (x->has_memory) {
        static const int nc_mem[] = { 1, -1 };

        if ((rc = each(x, row_memory, nc_mem,
                       "SELECT start_ns, name, coalesce(tid, 0), coalesce(total_reserved, 0), "
                       "coalesce(total_allocated, 0), coalesce(bytes, 0), coalesce(addr, 0), "
                       "coalesce(device, -1), coalesce(device_type, 0) FROM memory_events "
                       "WHERE run_id = %ld AND rank = %ld ORDER BY start_ns",
                       run, rank)) != 0) {
            return rc;
        }
    }
    return 0;
}

/* The counters' ranges and the ac2g flows. Returns 0, or an error with x->err set. */
int kp__export_write_ranges_and_flows(struct xp *x)
{
    const long run = x->run, rank = x->rank;
    int rc;

    /* counters: one cuda_profiler_range event per range (rows of one correlation and
     * device), in range order, the name row first */
    {
        static const int nc_ctr[] = { 2, -1 };

        if ((rc = each(
                 x, row_counter, nc_ctr,
                 "SELECT coalesce(c.correlation, 0), coalesce(c.device, 0), c.metric, c.value::text, "
                 "starts_with(n.name, '" KP_KINETO_RANGE_NAME_PREFIX "'), min(CASE WHEN "
                 "starts_with(n.name, '" KP_KINETO_RANGE_NAME_PREFIX "') THEN c.value END) OVER "
                 "(PARTITION BY c.correlation, c.device) AS idx FROM counters c JOIN names n ON "
                 "n.id = c.metric WHERE c.run_id = %ld AND c.rank = %ld "
                 "ORDER BY idx NULLS LAST, 1, 2, 5 DESC, 3",
                 run, rank)) != 0) {
            return rc;
        }
        range_close(x);
    }
    /* ac2g flows: API call → each GPU activity with its correlation */
    if ((rc = each(
             x, row_flow, nc_none,
             "SELECT a.start_ns, coalesce(a.tid, 0), g.start_ns, g.device, g.stream, a.correlation, "
             "row_number() OVER (PARTITION BY a.start_ns, a.tid, a.correlation "
             "ORDER BY g.start_ns, g.device, g.stream) = 1 "
             "FROM api_calls a JOIN ("
             "SELECT start_ns, coalesce(device, 0) AS device, coalesce(stream, 0) AS stream, "
             "correlation FROM kernels WHERE run_id = %ld AND rank = %ld AND correlation > 0 "
             "UNION ALL SELECT start_ns, coalesce(device, 0), coalesce(stream, 0), correlation "
             "FROM memcpys WHERE run_id = %ld AND rank = %ld AND correlation > 0 "
             "UNION ALL SELECT start_ns, coalesce(device, 0), coalesce(stream, 0), correlation "
             "FROM memsets WHERE run_id = %ld AND rank = %ld AND correlation > 0"
             ") g ON g.correlation = a.correlation "
             "WHERE a.run_id = %ld AND a.rank = %ld AND a.correlation > 0 "
             "ORDER BY a.start_ns, a.tid, a.correlation, g.start_ns, g.device, g.stream",
             run, rank, run, rank, run, rank, run, rank)) != 0) {
        return rc;
    }
    return 0;
}
