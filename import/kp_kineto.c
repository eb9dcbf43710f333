/*
 * kp_kineto: streaming Kineto trace JSON → kprof batches. See kp_kineto.h for the contract
 * and the mapping. The importer is four files:
 *  - jr.c: the pull JSON tokenizer over a refillable 256 KiB buffer (jr.h);
 *  - kineto_walk.c: the trace walker. The top-level object (or a bare array), its metadata
 *    keys, and each traceEvents entry parsed into a struct ev — the envelope plus every args
 *    key the mapping uses, whatever their order (args may come before cat) — handed to
 *    kp__kineto_ev_finish; and the trace's sources (memory, a gzip or plain file);
 *  - this file: the Kineto mapping and kp_kineto_parse. kp__kineto_ev_finish dispatches the
 *    event by phase and category (classify) to a map_<kind> that writes its rows into a
 *    kp_batch_builder; at batch_rows rows (or 8 MiB of names) the batch is flushed;
 *  - spill.c: the flush (rank_info, validation, the callback) and the spool of a scan.
 * What the walker and the mapping share is in kp_kineto_int.h.
 * Memory is O(batch_rows + max_string_bytes), independent of the file.
 */
#define KP_LOG_MODULE "kineto"
#include "kp_kineto.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jr.h"
#include "kp_batch_builder.h"
#include "kp_err.h"
#include "kp_kineto_int.h"
#include "kp_log.h"
#include "kp_strbuf.h"
#include "spill.h"

const char *const kp_kineto_cat_names[KP_KINETO_CAT_COUNT] = {
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_sync",
    "memory",
    "ac2g",
    "fwdbwd",
    "profiler_step",
    "collective",
    "cuda_profiler_range",
    "metadata",
    "skipped",
};

/* ------------------------------------------------------------------------------------------ */
/* The batch's columns (kp_batch_builder does the rest) */

/* An imported batch leaves out an optional column whose every row holds its "none" value
 * (NULL in PostgreSQL: 0, or -1 where 0 means something; NaN for the doubles), except those
 * that every event of the kind has (ALWAYS). */
#define ALWAYS(kind, col)          \
    {                              \
        kind, col, KP_BB_ALWAYS, 0 \
    }
static const struct kp_batch_builder_rule import_cols[] = {
    ALWAYS(KP_EV_KERNEL, "start_ns"),
    ALWAYS(KP_EV_KERNEL, "dur_ns"),
    ALWAYS(KP_EV_KERNEL, "name"),
    ALWAYS(KP_EV_KERNEL, "device"),
    ALWAYS(KP_EV_KERNEL, "stream"),
    ALWAYS(KP_EV_MEMCPY, "start_ns"),
    ALWAYS(KP_EV_MEMCPY, "dur_ns"),
    ALWAYS(KP_EV_MEMCPY, "bytes"),
    ALWAYS(KP_EV_MEMCPY, "device"),
    ALWAYS(KP_EV_MEMCPY, "stream"),
    ALWAYS(KP_EV_MEMSET, "start_ns"),
    ALWAYS(KP_EV_MEMSET, "dur_ns"),
    ALWAYS(KP_EV_MEMSET, "bytes"),
    ALWAYS(KP_EV_MEMSET, "device"),
    ALWAYS(KP_EV_MEMSET, "stream"),
    ALWAYS(KP_EV_API, "start_ns"),
    ALWAYS(KP_EV_API, "dur_ns"),
    ALWAYS(KP_EV_API, "domain"),
    ALWAYS(KP_EV_API, "name"),
    ALWAYS(KP_EV_API, "tid"),
    ALWAYS(KP_EV_OP, "start_ns"),
    ALWAYS(KP_EV_OP, "dur_ns"),
    ALWAYS(KP_EV_OP, "name"),
    ALWAYS(KP_EV_OP, "kind"),
    { KP_EV_OP, "seq", KP_BB_AUTO, -1 },
    { KP_EV_OP, "device", KP_BB_AUTO, -1 },
    ALWAYS(KP_EV_STEP, "start_ns"),
    ALWAYS(KP_EV_STEP, "step"),
    ALWAYS(KP_EV_STEP, "dur_ns"),
    ALWAYS(KP_EV_COLLECTIVE, "start_ns"),
    ALWAYS(KP_EV_COLLECTIVE, "dur_ns"),
    ALWAYS(KP_EV_COLLECTIVE, "name"),
    ALWAYS(KP_EV_COLLECTIVE, "tid"),
    ALWAYS(KP_EV_SYNC, "start_ns"),
    ALWAYS(KP_EV_SYNC, "dur_ns"),
    ALWAYS(KP_EV_SYNC, "sync_type"),
    ALWAYS(KP_EV_SYNC, "device"),
    ALWAYS(KP_EV_SYNC, "stream"),
    ALWAYS(KP_EV_MEMORY, "start_ns"),
    ALWAYS(KP_EV_MEMORY, "name"),
    ALWAYS(KP_EV_MEMORY, "device_type"),
    ALWAYS(KP_EV_MEMORY, "device"),
    ALWAYS(KP_EV_MEMORY, "bytes"),
    ALWAYS(KP_EV_COUNTER, "metric"),
    ALWAYS(KP_EV_COUNTER, "correlation"),
    ALWAYS(KP_EV_COUNTER, "value"),
    ALWAYS(KP_EV_COUNTER, "device"),
};
#undef ALWAYS

/* ------------------------------------------------------------------------------------------ */
/* The Kineto mapping */

/* Checks that an arg fits the column; absent gives def. */
static int arg_in(struct kp_kineto *k, int id, int64_t lo, int64_t hi, int64_t def, int64_t *out)
{
    const struct ev *e = &k->e;

    if (!has(e, id)) {
        *out = def;
        return 0;
    }
    if (e->a[id] < lo || e->a[id] > hi) {
        const char *key = kp__kineto_arg_key(id);

        *out = def; /* not used: the caller returns the error */
        return jr_fail(&k->j, "args.%s = %" PRId64 " is out of range (%" PRId64 "..%" PRId64 ")",
                       key, e->a[id], lo, hi);
    }
    *out = e->a[id];
    return 0;
}

/* A captured numeric arg (e.g. "blocks per SM": 0.5): *out, or NaN when it is absent or not
 * a finite number >= 0 (Kineto writes "inf" for a kernel with no SMs known). Informational:
 * never an error. */
static int arg_real(struct kp_kineto *k, int id, double *out)
{
    const struct ev *e = &k->e;
    const char *s;
    char *end;
    double v;

    *out = NAN;
    if (!has(e, id)) {
        return 0;
    }
    s = evstr(k, e->s_off[id]);
    if (!(*s >= '0' && *s <= '9')) {
        return 0;
    }
    errno = 0;
    v = strtod(s, &end);
    if (end != s && *end == '\0' && errno == 0 && isfinite(v) && v >= 0) {
        *out = v;
    }
    return 0;
}

/* Interns a name: cut to the limit at a UTF-8 boundary, invalid UTF-8 replaced. */
static int64_t intern_name(struct kp_kineto *k, const char *s, size_t n)
{
    char *tmp = NULL;
    int64_t idx;

    if (n > k->max_name) {
        n = k->max_name;
        while (n > 0 && ((unsigned char) s[n] & 0xc0) == 0x80) {
            n--;
        }
        k->meta->names_truncated++;
    }
    if (!kp_utf8_valid(s, n)) {
        /* replace every byte of an invalid sequence with '?' (same length, still bounded) */
        size_t i = 0;

        if ((tmp = malloc(n + 1)) == NULL) {
            return -ENOMEM;
        }
        memcpy(tmp, s, n);
        while (i < n) {
            size_t l = 1;
            unsigned char c = (unsigned char) tmp[i];

            if (c >= 0xc2 && c <= 0xdf) {
                l = 2;
            }
            else if (c >= 0xe0 && c <= 0xef) {
                l = 3;
            }
            else if (c >= 0xf0 && c <= 0xf4) {
                l = 4;
            }
            if (c == 0 || (c >= 0x80 && l == 1) || i + l > n || !kp_utf8_valid(tmp + i, l)) {
                tmp[i] = '?';
                l = 1;
            }
            i += l;
        }
        s = tmp;
    }
    idx = kp_batch_builder_intern(k->out.bb, s, n);
    free(tmp);
    return idx;
}

static int64_t intern_ev(struct kp_kineto *k, int id)
{
    if (!has(&k->e, id)) {
        return 0;
    }
    return intern_name(k, evstr(k, k->e.s_off[id]), k->e.s_len[id]);
}

/* Appends a zeroed row of kind to the batch (its columns: kp_batch_builder_table). Returns
 * its index, or -ENOMEM (set as the parse's error). */
static long row_new(struct kp_kineto *k, enum kp_event_kind kind)
{
    long i = kp_batch_builder_add(k->out.bb, kind, 1);

    if (i < 0) {
        k->j.err = -ENOMEM;
    }
    return i;
}

#define ROW(i, kind)                        \
    do {                                    \
        if (((i) = row_new(k, kind)) < 0) { \
            return k->j.err;                \
        }                                   \
    } while (0)

/* Counts a row and its start for the batch. */
static int row_added(struct kp_kineto *k, int kind, int64_t ts)
{
    if (!k->out.have_base) {
        k->out.base_ns = ts;
        k->out.have_base = true;
    }
    if (ts < k->meta->min_ns) {
        k->meta->min_ns = ts;
    }
    if (ts > k->meta->max_ns) {
        k->meta->max_ns = ts;
    }
    k->meta->rows[kind]++;
    return 0;
}

static bool batch_full(struct kp_kineto *k)
{
    /* + 1: the string table's "" counted as a byte, as it always was */
    return kp_batch_builder_total(k->out.bb) >= k->batch_rows ||
           kp_batch_builder_string_bytes(k->out.bb) + 1 >= KB_MAX_STR_BYTES;
}

/* Lower-cases cat into buf (at most len-1 bytes; longer cats never match). */
static void lower_cat(struct kp_kineto *k, char *buf, size_t len)
{
    const char *c = evstr(k, k->e.cat_off);
    size_t n = k->e.cat_len;

    if (!k->e.has_cat || n >= len) {
        buf[0] = '\0';
        return;
    }
    for (size_t i = 0; i < n; i++) {
        buf[i] = (char) ((c[i] >= 'A' && c[i] <= 'Z') ? c[i] + 32 : c[i]);
    }
    buf[n] = '\0';
}

enum map {
    M_SKIP,
    M_CPU_OP,
    M_USER_ANN,
    M_GPU_ANN,
    M_PY,
    M_RUNTIME,
    M_DRIVER,
    M_KERNEL,
    M_MEMCPY,
    M_MEMSET,
    M_SYNC,
    M_FLOW_AC2G,
    M_FLOW_FWDBWD,
    M_RANGE,
};

static enum map classify(const char *cat)
{
    static const struct {
        const char *cat;
        enum map m;
    } t[] = {
        { "cpu_op", M_CPU_OP },
        { "operator", M_CPU_OP },
        { "user_annotation", M_USER_ANN },
        { "gpu_user_annotation", M_GPU_ANN },
        { "user", M_GPU_ANN },
        { "python_function", M_PY },
        { "cuda_runtime", M_RUNTIME },
        { "runtime", M_RUNTIME },
        { "cuda_driver", M_DRIVER },
        { "kernel", M_KERNEL },
        { "gpu_memcpy", M_MEMCPY },
        { "memcpy", M_MEMCPY },
        { "gpu_memset", M_MEMSET },
        { "memset", M_MEMSET },
        { "cuda_sync", M_SYNC },
        { "ac2g", M_FLOW_AC2G },
        { "async", M_FLOW_AC2G },
        { "async_gpu", M_FLOW_AC2G },
        { "async_cpu_to_gpu", M_FLOW_AC2G },
        { "fwdbwd", M_FLOW_FWDBWD },
        { "forward_backward", M_FLOW_FWDBWD },
        { "cuda_profiler_range", M_RANGE },
    };

    size_t n = strlen(cat);

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (cat[0] == t[i].cat[0] && strlen(t[i].cat) == n && memcmp(cat, t[i].cat, n) == 0) {
            return t[i].m;
        }
    }
    return M_SKIP;
}

/* The External id of a runtime/GPU event after the trap rule (kp_kineto.h). */
static uint64_t gpu_ext(struct kp_kineto *k)
{
    const struct ev *e = &k->e;
    int64_t ext = 0;

    if (has(e, A_EXT)) {
        ext = e->a[A_EXT];
    }
    else if (has(e, A_EXT_LOWER)) {
        ext = e->a[A_EXT_LOWER];
    }
    if (ext <= 0) {
        return 0;
    }
    if (has(e, A_CORR) && e->a[A_CORR] == ext) {
        k->meta->ext_dropped++;
        return 0;
    }
    return (uint64_t) ext;
}

static int64_t abs_ts(struct kp_kineto *k)
{
    int64_t base = k->opts->meta != NULL ? k->opts->meta->base_ns : k->meta->base_ns;

    if (k->out.spool != NULL) {
        if (!k->out.spool->base_set) {
            k->out.spool->base_used = base;
            k->out.spool->base_set = true;
        }
        else if (k->out.spool->base_used != base) {
            k->out.spool->unusable = true; /* rows built with two different bases */
        }
    }
    if (__builtin_add_overflow(base, k->e.ts_ns, &base)) {
        return INT64_MAX;
    }
    return base;
}

/* GPU events: the device from args.device, else the pid; the stream from args.stream, else
 * the tid ("stream 7"). */
static int gpu_where(struct kp_kineto *k, int64_t *device, int64_t *stream)
{
    const struct ev *e = &k->e;

    if (arg_in(k, A_DEVICE, 0, I2MAX, e->pid_num && e->pid <= I2MAX ? e->pid : 0, device) != 0 ||
        arg_in(k, A_STREAM, 0, I4MAX, e->tid_num && e->tid <= I4MAX ? e->tid : 0, stream) != 0) {
        return k->j.err;
    }
    if (k->meta->device < 0) {
        k->meta->device = (int32_t) *device;
    }
    return 0;
}

static void cpu_seen(struct kp_kineto *k)
{
    if (k->meta->pid == 0 && k->e.pid_num && k->e.pid > 0 && k->e.pid <= UINT32_MAX) {
        k->meta->pid = (uint32_t) k->e.pid;
    }
}

static int64_t name_idx(struct kp_kineto *k)
{
    return intern_name(k, evstr(k, k->e.name_off), k->e.name_len);
}

/* "ProfilerStep#12" → 12. */
static bool profiler_step(struct kp_kineto *k, int64_t *step)
{
    const char *n = evstr(k, k->e.name_off);
    static const char pfx[] = "ProfilerStep#";

    if (k->e.name_len <= sizeof(pfx) - 1 || memcmp(n, pfx, sizeof(pfx) - 1) != 0) {
        return false;
    }
    return text_to_i64(n + sizeof(pfx) - 1, step) == NUM_OK && *step >= 0;
}

/* Reads args key id, an integer in [lo, hi] (def when absent), into dst; returns the parse's
 * error from the caller if it is not. */
#define ARG(dst, id, lo, hi, def)                   \
    do {                                            \
        int64_t v_;                                 \
        if (arg_in(k, id, lo, hi, def, &v_) != 0) { \
            return k->j.err;                        \
        }                                           \
        (dst) = (__typeof__(dst)) v_;               \
    } while (0)
#define IDX(var, expr)           \
    do {                         \
        int64_t i_ = (expr);     \
        if (i_ < 0) {            \
            k->j.err = (int) i_; \
            return k->j.err;     \
        }                        \
        var = (uint32_t) i_;     \
    } while (0)

static int map_op(struct kp_kineto *k, enum map m)
{
    struct ev *e = &k->e;
    Kprof__V1__Ops *o = kp_batch_builder_table(k->out.bb, KP_EV_OP);
    int64_t v, step = 0;
    uint32_t kind;
    bool is_step = false;
    long i;

    if (m == M_GPU_ANN) {
        kind = KPROF__V1__OP_KIND__OP_KIND_GPU_USER_ANNOTATION;
    }
    else if (m == M_PY) {
        kind = KPROF__V1__OP_KIND__OP_KIND_PYTHON_FUNCTION;
    }
    else {
        is_step = profiler_step(k, &step);
        kind = is_step ? KPROF__V1__OP_KIND__OP_KIND_PROFILER_STEP
                       : (m == M_CPU_OP ? KPROF__V1__OP_KIND__OP_KIND_CPU_OP
                                        : KPROF__V1__OP_KIND__OP_KIND_USER_ANNOTATION);
    }
    ROW(i, KP_EV_OP);
    o->start_ns[i] = abs_ts(k);
    o->dur_ns[i] = (uint64_t) e->dur_ns;
    o->kind[i] = kind;
    o->seq[i] = -1;
    o->device[i] = -1;
    IDX(o->name[i], name_idx(k));
    if (m == M_GPU_ANN) {
        int64_t dev, stream;

        if (gpu_where(k, &dev, &stream) != 0 || arg_in(k, A_EXT, 0, INT64_MAX, 0, &v) != 0) {
            return k->j.err;
        }
        o->device[i] = (int32_t) dev;
        o->stream[i] = (uint32_t) stream;
        o->external_id[i] = (uint64_t) v;
    }
    else {
        cpu_seen(k);
        o->tid[i] = e->tid_num ? (uint64_t) e->tid : 0;
        if (m == M_PY) {
            if (arg_in(k, A_PY_ID, 0, INT64_MAX - (int64_t) KP_KINETO_PY_ID_BASE, -1, &v) != 0) {
                return k->j.err;
            }
            o->op_id[i] = v >= 0 ? KP_KINETO_PY_ID_BASE + (uint64_t) v : 0;
            if (arg_in(k, A_PY_PARENT, 0, INT64_MAX - (int64_t) KP_KINETO_PY_ID_BASE, -1, &v) !=
                0) {
                return k->j.err;
            }
            o->parent_id[i] = v >= 0 ? KP_KINETO_PY_ID_BASE + (uint64_t) v : 0;
        }
        else {
            if (arg_in(k, A_EXT, 0, INT64_MAX, 0, &v) != 0) {
                return k->j.err;
            }
            o->op_id[i] = o->external_id[i] = (uint64_t) v;
            if (arg_in(k, A_SEQ, -1, INT64_MAX, -1, &o->seq[i]) != 0 ||
                arg_in(k, A_FWD_TID, 0, INT64_MAX, 0, &v) != 0) {
                return k->j.err;
            }
            o->fwd_tid[i] = (uint64_t) v;
            IDX(o->input_shapes[i], intern_ev(k, C_SHAPES));
            IDX(o->input_dtypes[i], intern_ev(k, C_TYPES));
        }
    }
    row_added(k, KP_EV_OP, o->start_ns[i]);
    if (m == M_GPU_ANN) {
        k->meta->cats[KP_KINETO_GPU_USER_ANNOTATION]++;
        return 0;
    }
    k->meta->cats[m == M_PY       ? KP_KINETO_PYTHON_FUNCTION
                  : m == M_CPU_OP ? KP_KINETO_CPU_OP
                                  : KP_KINETO_USER_ANNOTATION]++;
    if (is_step) {
        Kprof__V1__Steps *st = kp_batch_builder_table(k->out.bb, KP_EV_STEP);
        long j;

        ROW(j, KP_EV_STEP);
        st->step[j] = step;
        st->start_ns[j] = o->start_ns[i];
        st->dur_ns[j] = o->dur_ns[i];
        row_added(k, KP_EV_STEP, st->start_ns[j]);
        k->meta->cats[KP_KINETO_PROFILER_STEP]++;
    }
    if (m == M_CPU_OP && has(e, S_COLL_NAME)) {
        Kprof__V1__Collectives *c = kp_batch_builder_table(k->out.bb, KP_EV_COLLECTIVE);
        long j;

        ROW(j, KP_EV_COLLECTIVE);
        c->start_ns[j] = o->start_ns[i];
        c->dur_ns[j] = o->dur_ns[i];
        c->external_id[j] = o->external_id[i];
        c->tid[j] = o->tid[i];
        IDX(c->name[j], intern_ev(k, S_COLL_NAME));
        IDX(c->dtype[j], intern_ev(k, S_DTYPE));
        if (has(e, S_PG_NAME)) {
            IDX(c->process_group[j], intern_ev(k, S_PG_NAME));
        }
        else if (has(e, S_PG_DESC)) {
            IDX(c->process_group[j], intern_ev(k, S_PG_DESC));
        }
        else if (has(e, A_PG_ID)) {
            char id[32];
            int n = snprintf(id, sizeof(id), "%" PRId64, e->a[A_PG_ID]);

            IDX(c->process_group[j], intern_name(k, id, (size_t) n));
        }
        ARG(c->in_nelems[j], A_IN_NELEMS, 0, INT64_MAX, 0);
        ARG(c->out_nelems[j], A_OUT_NELEMS, 0, INT64_MAX, 0);
        ARG(c->group_size[j], A_GROUP_SIZE, 0, I4MAX, 0);
        ARG(c->coll_seq[j], A_COLL_SEQ, 0, INT64_MAX, 0);
        row_added(k, KP_EV_COLLECTIVE, c->start_ns[j]);
        k->meta->cats[KP_KINETO_COLLECTIVE]++;
    }
    return 0;
}

static int map_api(struct kp_kineto *k, enum map m)
{
    struct ev *e = &k->e;
    Kprof__V1__ApiCalls *a = kp_batch_builder_table(k->out.bb, KP_EV_API);
    long i;

    cpu_seen(k);
    ROW(i, KP_EV_API);
    a->start_ns[i] = abs_ts(k);
    a->dur_ns[i] = (uint64_t) e->dur_ns;
    a->domain[i] = m == M_DRIVER ? KPROF__V1__API_DOMAIN__API_DOMAIN_DRIVER
                                 : KPROF__V1__API_DOMAIN__API_DOMAIN_RUNTIME;
    a->tid[i] = e->tid_num ? (uint64_t) e->tid : 0;
    IDX(a->name[i], name_idx(k));
    ARG(a->cbid[i], A_CBID, 0, I4MAX, 0);
    ARG(a->correlation[i], A_CORR, 0, INT64_MAX, 0);
    a->external_id[i] = gpu_ext(k);
    row_added(k, KP_EV_API, a->start_ns[i]);
    k->meta->cats[m == M_DRIVER ? KP_KINETO_CUDA_DRIVER : KP_KINETO_CUDA_RUNTIME]++;
    return 0;
}

static int map_kernel(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    Kprof__V1__Kernels *r = kp_batch_builder_table(k->out.bb, KP_EV_KERNEL);
    int64_t dev, stream;
    long i;

    if (gpu_where(k, &dev, &stream) != 0) {
        return k->j.err;
    }
    ROW(i, KP_EV_KERNEL);
    r->start_ns[i] = abs_ts(k);
    r->dur_ns[i] = (uint64_t) e->dur_ns;
    r->device[i] = (uint32_t) dev;
    r->stream[i] = (uint32_t) stream;
    IDX(r->name[i], name_idx(k));
    ARG(r->context[i], A_CONTEXT, 0, I4MAX, 0);
    ARG(r->correlation[i], A_CORR, 0, INT64_MAX, 0);
    r->external_id[i] = gpu_ext(k);
    for (int d = 0; d < 3; d++) {
        if (has(e, C_GRID) && (e->grid[d] < 0 || e->grid[d] > I4MAX)) {
            return jr_fail(&k->j, "args.grid[%d] = %" PRId64 " is out of range (0..%d)", d,
                           e->grid[d], I4MAX);
        }
        if (has(e, C_BLOCK) && (e->block[d] < 0 || e->block[d] > I2MAX)) {
            return jr_fail(&k->j, "args.block[%d] = %" PRId64 " is out of range (0..%d)", d,
                           e->block[d], I2MAX);
        }
    }
    r->grid_x[i] = has(e, C_GRID) ? (uint32_t) e->grid[0] : 0;
    r->grid_y[i] = has(e, C_GRID) ? (uint32_t) e->grid[1] : 0;
    r->grid_z[i] = has(e, C_GRID) ? (uint32_t) e->grid[2] : 0;
    r->block_x[i] = has(e, C_BLOCK) ? (uint32_t) e->block[0] : 0;
    r->block_y[i] = has(e, C_BLOCK) ? (uint32_t) e->block[1] : 0;
    r->block_z[i] = has(e, C_BLOCK) ? (uint32_t) e->block[2] : 0;
    if (arg_real(k, C_BLOCKS_SM, &r->blocks_per_sm[i]) != 0 ||
        arg_real(k, C_OCCUPANCY, &r->est_occupancy[i]) != 0) {
        return k->j.err;
    }
    ARG(r->registers[i], A_REGS, 0, I2MAX, 0);
    ARG(r->static_smem[i], A_SMEM, 0, I4MAX, 0);
    ARG(r->graph_id[i], A_GRAPH_ID, 0, I4MAX, 0);
    ARG(r->graph_node_id[i], A_GRAPH_NODE, 0, INT64_MAX, 0);
    row_added(k, KP_EV_KERNEL, r->start_ns[i]);
    k->meta->cats[KP_KINETO_KERNEL]++;
    return 0;
}

/* CUPTI's names as kineto prints them (memcpyKindString, memoryKindString). */
static uint32_t word_index(const char *s, size_t n, const char *const *words)
{
    for (uint32_t i = 0; words[i] != NULL; i++) {
        if (strlen(words[i]) == n && memcmp(words[i], s, n) == 0) {
            return i;
        }
    }
    return 0;
}

static const char *const memcpy_kinds[] = { "Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                            "AtoD",    "DtoA", "DtoD", "HtoH", "PtoP", NULL };
static const char *const memory_kinds[] = { "Unknown",       "Pageable",       "Pinned",
                                            "Device",        "Array",          "Managed",
                                            "Device Static", "Managed Static", NULL };

/* "Memcpy HtoD (Pinned -> Device)": kind, src, dst; "Memset (Device)": src only. */
static void parse_mem_name(const char *n, size_t len, uint32_t *kind, uint32_t *src, uint32_t *dst)
{
    const char *sp = memchr(n, ' ', len), *lp = memchr(n, '(', len);

    *kind = *src = *dst = 0;
    if (sp != NULL && lp != NULL && lp > sp + 1) {
        *kind = word_index(sp + 1, (size_t) (lp - sp - 2 > 0 ? lp - sp - 2 : 0), memcpy_kinds);
    }
    if (lp != NULL) {
        const char *end = memchr(lp, ')', len - (size_t) (lp - n));
        const char *arrow = end != NULL ? strstr(lp, " -> ") : NULL;

        if (end == NULL) {
            return;
        }
        if (arrow != NULL && arrow < end) {
            *src = word_index(lp + 1, (size_t) (arrow - lp - 1), memory_kinds);
            *dst = word_index(arrow + 4, (size_t) (end - arrow - 4), memory_kinds);
        }
        else {
            *src = word_index(lp + 1, (size_t) (end - lp - 1), memory_kinds);
        }
    }
}

static int map_memcpy(struct kp_kineto *k, bool memset_)
{
    struct ev *e = &k->e;
    int64_t dev, stream, ctx, corr, bytes;
    uint32_t kind, src, dst;
    double bw;
    long i;

    if (gpu_where(k, &dev, &stream) != 0 || arg_in(k, A_CONTEXT, 0, I4MAX, 0, &ctx) != 0 ||
        arg_in(k, A_CORR, 0, INT64_MAX, 0, &corr) != 0 ||
        arg_in(k, A_BYTES, 0, INT64_MAX, 0, &bytes) != 0 || arg_real(k, C_MEMBW, &bw) != 0) {
        return k->j.err;
    }
    parse_mem_name(evstr(k, e->name_off), e->name_len, &kind, &src, &dst);
    if (memset_) {
        Kprof__V1__Memsets *r = kp_batch_builder_table(k->out.bb, KP_EV_MEMSET);

        ROW(i, KP_EV_MEMSET);
        r->start_ns[i] = abs_ts(k);
        r->dur_ns[i] = (uint64_t) e->dur_ns;
        r->bytes[i] = (uint64_t) bytes;
        r->mem_kind[i] = src;
        r->device[i] = (uint32_t) dev;
        r->context[i] = (uint32_t) ctx;
        r->stream[i] = (uint32_t) stream;
        r->correlation[i] = (uint64_t) corr;
        r->external_id[i] = gpu_ext(k);
        r->bandwidth_gbps[i] = bw;
        row_added(k, KP_EV_MEMSET, r->start_ns[i]);
        k->meta->cats[KP_KINETO_GPU_MEMSET]++;
        return 0;
    }
    Kprof__V1__Memcpys *r = kp_batch_builder_table(k->out.bb, KP_EV_MEMCPY);

    ROW(i, KP_EV_MEMCPY);
    r->start_ns[i] = abs_ts(k);
    r->dur_ns[i] = (uint64_t) e->dur_ns;
    r->bytes[i] = (uint64_t) bytes;
    r->copy_kind[i] = kind;
    r->src_kind[i] = src;
    r->dst_kind[i] = dst;
    r->device[i] = (uint32_t) dev;
    r->context[i] = (uint32_t) ctx;
    r->stream[i] = (uint32_t) stream;
    r->correlation[i] = (uint64_t) corr;
    r->external_id[i] = gpu_ext(k);
    r->bandwidth_gbps[i] = bw;
    ARG(r->src_device[i], A_FROM_DEV, 0, I2MAX, 0);
    ARG(r->dst_device[i], A_TO_DEV, 0, I2MAX, 0);
    row_added(k, KP_EV_MEMCPY, r->start_ns[i]);
    k->meta->cats[KP_KINETO_GPU_MEMCPY]++;
    return 0;
}

static int map_sync(struct kp_kineto *k)
{
    static const char *const types[] = { "Unknown",     "Event Sync",   "Stream Wait Event",
                                         "Stream Sync", "Context Sync", NULL };
    struct ev *e = &k->e;
    Kprof__V1__Syncs *r = kp_batch_builder_table(k->out.bb, KP_EV_SYNC);
    int64_t dev, stream;
    long i;

    if (gpu_where(k, &dev, &stream) != 0) {
        return k->j.err;
    }
    ROW(i, KP_EV_SYNC);
    r->start_ns[i] = abs_ts(k);
    r->dur_ns[i] = (uint64_t) e->dur_ns;
    r->sync_type[i] = word_index(evstr(k, e->name_off), e->name_len, types);
    r->device[i] = (uint32_t) dev;
    r->stream[i] = (uint32_t) (stream >= 1000000 ? stream - 1000000 : stream);
    ARG(r->context[i], A_CONTEXT, 0, I4MAX, 0);
    ARG(r->correlation[i], A_CORR, 0, INT64_MAX, 0);
    ARG(r->cuda_event[i], A_EVENT_ID, 0, I4MAX, 0);
    row_added(k, KP_EV_SYNC, r->start_ns[i]);
    k->meta->cats[KP_KINETO_CUDA_SYNC]++;
    return 0;
}

static int map_memory(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    Kprof__V1__MemoryEvents *r = kp_batch_builder_table(k->out.bb, KP_EV_MEMORY);
    long i;

    cpu_seen(k);
    ROW(i, KP_EV_MEMORY);
    r->start_ns[i] = abs_ts(k);
    r->tid[i] = e->tid_num ? (uint64_t) e->tid : 0;
    IDX(r->name[i], name_idx(k));
    ARG(r->device[i], A_DEV_ID, -1, I2MAX, -1);
    ARG(r->device_type[i], A_DEV_TYPE, 0, I2MAX, 0);
    if (arg_in(k, A_MEM_BYTES, INT64_MIN, INT64_MAX, 0, &r->bytes[i]) != 0) {
        return k->j.err;
    }
    ARG(r->addr[i], A_ADDR, 0, INT64_MAX, 0);
    ARG(r->total_allocated[i], A_TOTAL_ALLOC, 0, INT64_MAX, 0);
    ARG(r->total_reserved[i], A_TOTAL_RES, 0, INT64_MAX, 0);
    row_added(k, KP_EV_MEMORY, r->start_ns[i]);
    k->meta->cats[KP_KINETO_MEMORY]++;
    return 0;
}

/* Counts a row that has no start time (counters) for the batch. */
static void row_added_untimed(struct kp_kineto *k, int kind)
{
    k->meta->rows[kind]++;
}

/* A cuda_profiler_range event: its counters rows and the row naming it (kp_kineto.h). */
static int map_range(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    static const char pfx[] = KP_KINETO_RANGE_NAME_PREFIX;
    Kprof__V1__Counters *r = kp_batch_builder_table(k->out.bb, KP_EV_COUNTER);
    long i;
    int64_t dev, stream, corr;
    uint64_t key, index = k->n_ranges;
    char *nm;
    int64_t idx;

    if (e->ctr_overflow) {
        return jr_fail(&k->j, "a cuda_profiler_range event has more than %d metrics",
                       KP_KINETO_MAX_COUNTERS);
    }
    if (gpu_where(k, &dev, &stream) != 0 ||
        arg_in(k, A_CORR, INT64_MIN, (int64_t) KP_KINETO_RANGE_ID_BASE - 1, 0, &corr) != 0) {
        return k->j.err;
    }
    key = corr > 0 ? (uint64_t) corr : KP_KINETO_RANGE_ID_BASE + index;
    if ((nm = malloc(sizeof(pfx) + e->name_len)) == NULL) {
        k->j.err = -ENOMEM;
        return k->j.err;
    }
    memcpy(nm, pfx, sizeof(pfx) - 1);
    memcpy(nm + sizeof(pfx) - 1, evstr(k, e->name_off), e->name_len);
    idx = intern_name(k, nm, sizeof(pfx) - 1 + e->name_len);
    free(nm);
    if (idx < 0) {
        k->j.err = (int) idx;
        return k->j.err;
    }
    ROW(i, KP_EV_COUNTER);
    r->metric[i] = (uint32_t) idx;
    r->value[i] = (double) index;
    r->correlation[i] = key;
    r->device[i] = (uint32_t) dev;
    row_added_untimed(k, KP_EV_COUNTER);
    for (uint32_t c = 0; c < e->n_ctr; c++) {
        ROW(i, KP_EV_COUNTER);
        IDX(r->metric[i], intern_name(k, evstr(k, e->ctr_off[c]), e->ctr_len[c]));
        r->value[i] = e->ctr_val[c];
        r->correlation[i] = key;
        r->device[i] = (uint32_t) dev;
        row_added_untimed(k, KP_EV_COUNTER);
    }
    k->n_ranges++;
    k->meta->cats[KP_KINETO_PROFILER_RANGE]++;
    return 0;
}

/* Maps the event just parsed (k->e): by phase, then by category (classify). */
int kp__kineto_ev_finish(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    char cat[32];
    enum map m;
    int rc = 0;

    size_t snap[KP_EV_COUNT];

    for (int kind = 0; kind < KP_EV_COUNT; kind++) {
        snap[kind] = kp_batch_builder_rows(k->out.bb, (enum kp_event_kind) kind);
    }

    if (e->ph == 0) {
        return jr_fail(&k->j, "the event has no \"ph\" (phase)");
    }
    lower_cat(k, cat, sizeof(cat));
    m = classify(cat);
    switch (e->ph) {
    case 'M':
        k->meta->cats[KP_KINETO_METADATA]++;
        return 0;
    case 's':
    case 'f':
    case 't':
        if (m == M_FLOW_AC2G || m == M_FLOW_FWDBWD) {
            if (!e->has_id) {
                return jr_fail(&k->j, "a flow event (cat %s) has no \"id\"", cat);
            }
            k->meta->cats[m == M_FLOW_AC2G ? KP_KINETO_FLOW_AC2G : KP_KINETO_FLOW_FWDBWD]++;
        }
        else {
            k->meta->cats[KP_KINETO_SKIPPED]++;
        }
        return 0;
    case 'i':
    case 'I':
        if (e->has_name &&
            ((e->name_len == 8 && memcmp(evstr(k, e->name_off), "[memory]", 8) == 0) ||
             (e->name_len == 13 && memcmp(evstr(k, e->name_off), "[OutOfMemory]", 13) == 0))) {
            if (!e->has_ts) {
                return jr_fail(&k->j, "a %s event has no \"ts\"", evstr(k, e->name_off));
            }
            rc = map_memory(k);
            break;
        }
        k->meta->cats[KP_KINETO_SKIPPED]++;
        return 0;
    case 'X':
        if (m == M_SKIP && strcmp(cat, "trace") == 0 && e->has_name && e->has_ts && e->has_dur &&
            e->name_len == 20 && memcmp(evstr(k, e->name_off), "PyTorch Profiler (0)", 20) == 0 &&
            (!k->meta->has_profiler_span || e->ts_ns >= k->meta->profiler_ts_ns)) {
            /* the profiler's span, kept for the GPU utilization timeline
             * (docs/specs/tbplugin-views.md §8); the plugin takes the last one in ts order */
            k->meta->has_profiler_span = true;
            k->meta->profiler_ts_ns = e->ts_ns;
            k->meta->profiler_dur_ns = e->dur_ns > 0 ? e->dur_ns : 0;
        }
        if (m == M_SKIP || m == M_FLOW_AC2G || m == M_FLOW_FWDBWD) {
            k->meta->cats[KP_KINETO_SKIPPED]++;
            return 0;
        }
        if (!e->has_name) {
            return jr_fail(&k->j, "a \"%s\" event has no \"name\"", cat);
        }
        if (!e->has_ts) {
            return jr_fail(&k->j, "a \"%s\" event has no \"ts\"", cat);
        }
        if (!e->has_dur) {
            return jr_fail(&k->j, "a \"%s\" complete event (ph X) has no \"dur\"", cat);
        }
        if (e->dur_ns < 0) {
            e->dur_ns = 0; /* kineto clamps negative durations too */
        }
        switch (m) {
        case M_CPU_OP:
        case M_USER_ANN:
        case M_GPU_ANN:
        case M_PY:
            rc = map_op(k, m);
            break;
        case M_RUNTIME:
        case M_DRIVER:
            rc = map_api(k, m);
            break;
        case M_KERNEL:
            rc = map_kernel(k);
            break;
        case M_MEMCPY:
            rc = map_memcpy(k, false);
            break;
        case M_MEMSET:
            rc = map_memcpy(k, true);
            break;
        case M_SYNC:
            rc = map_sync(k);
            break;
        case M_RANGE:
            rc = map_range(k);
            break;
        default:
            break;
        }
        break;
    default:
        k->meta->cats[KP_KINETO_SKIPPED]++;
        return 0;
    }
    if (rc != 0) {
        /* drop the rows of the event that failed half-way (--partial flushes the rest) */
        for (int kind = 0; kind < KP_EV_COUNT; kind++) {
            kp_batch_builder_truncate(k->out.bb, (enum kp_event_kind) kind, snap[kind]);
        }
        return rc;
    }
    if (batch_full(k)) {
        rc = spill_flush(&k->out);
    }
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points */

int kp_kineto_parse(kp_kineto_read_cb *read, void *read_ud, const struct kp_kineto_opts *opts,
                    kp_kineto_batch_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                    char *errbuf, size_t errlen)
{
    struct kp_kineto *k;
    int rc;

    if (read == NULL || opts == NULL || meta_out == NULL || (cb != NULL && opts->meta == NULL) ||
        (opts->spool != NULL && (cb != NULL || opts->meta != NULL || opts->spool->used))) {
        kp_errbuf_set(errbuf, errlen, "kp_kineto_parse: bad arguments");
        return -EINVAL;
    }
    if ((k = calloc(1, sizeof(*k))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    memset(meta_out, 0, sizeof(*meta_out));
    meta_out->device = -1;
    meta_out->min_ns = INT64_MAX;
    meta_out->max_ns = INT64_MIN;
    k->opts = opts;
    k->meta = meta_out;
    k->out.opts = opts;
    k->out.meta = meta_out;
    k->out.j = &k->j;
    k->out.cb = cb;
    k->out.cb_ud = cb_ud;
    k->out.spool = opts->spool;
    if (k->out.spool != NULL) {
        k->out.spool->used = true;
    }
    k->max_name = opts->max_name_bytes ? opts->max_name_bytes : KP_CODEC_DEFAULT_MAX_NAME_BYTES;
    k->out.max_name = k->max_name;
    k->batch_rows = opts->batch_rows ? opts->batch_rows : KP_KINETO_DEFAULT_BATCH_ROWS;
    k->j.read = read;
    k->j.read_ud = read_ud;
    k->j.progress = opts->progress;
    k->j.progress_ud = opts->progress_ud;
    k->j.line = 1;
    k->j.event = -1;
    k->j.smax =
        opts->max_string_bytes ? opts->max_string_bytes : KP_KINETO_DEFAULT_MAX_STRING_BYTES;
    k->j.max_depth = opts->max_depth ? opts->max_depth : KP_KINETO_DEFAULT_MAX_DEPTH;
    k->j.errbuf = errbuf;
    k->j.errlen = errlen;
    kp_strbuf_init(&k->evs, EV_MAX_BYTES);
    if ((k->j.buf = malloc(JR_CHUNK)) == NULL ||
        (rc = kp_batch_builder_create(KP_BB_AUTO, import_cols,
                                      sizeof(import_cols) / sizeof(import_cols[0]), &k->out.bb)) !=
            0) {
        rc = -ENOMEM;
        kp_errbuf_set(errbuf, errlen, "out of memory");
        goto out;
    }
    rc = kp__kineto_walk(k);
    if (rc == 0 && (kp_batch_builder_total(k->out.bb) > 0 || !k->out.sent_first)) {
        rc = spill_flush(&k->out);
    }
    else if (rc == KP_EPROTO && opts->partial && cb != NULL &&
             kp_batch_builder_total(k->out.bb) > 0) {
        /* --partial: send what was read before the error, keep the error's message */
        char saved[1024];

        snprintf(saved, sizeof(saved), "%s", errbuf != NULL ? errbuf : "");
        k->j.err = 0;
        k->j.errbuf = NULL;
        k->j.errlen = 0;
        if (spill_flush(&k->out) != 0) {
            kp_errbuf_set(errbuf, errlen, "%s (and the rows before it could not be sent)", saved);
        }
        else {
            kp_errbuf_set(errbuf, errlen, "%s", saved);
        }
    }
    if (rc == -ENOMEM && k->j.err == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
    }
    meta_out->json_bytes = k->j.off + k->j.pos;
    if (meta_out->min_ns == INT64_MAX) {
        meta_out->min_ns = meta_out->max_ns = 0;
    }
out:
    if (k->out.spool != NULL) {
        if (rc == 0) {
            spool_seal(k->out.spool);
        }
        else {
            spool_drop(k->out.spool);
        }
    }
    free(k->j.buf);
    free(k->j.str);
    kp_strbuf_fini(&k->evs);
    kp_batch_builder_destroy(k->out.bb);
    free(k);
    return rc;
}
