/*
 * kp_export (export.h): rows → Chrome trace JSON into a sink, as docs/specs/export.md lays it
 * out. It lives in the analyzer so that kprofctl links no libpq.
 */
#define KP_LOG_MODULE "export"
#include "export.h"

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
#include "kp_kineto.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

#define EXPORT_OUT_BUF     KP_EXPORT_CHUNK
#define EXPORT_MAX_TRACKS  KP_EXPORT_MAX_TRACKS
#define EXPORT_MAX_DEVICES 256
#define EXPORT_SQL_MAX     4096
#define EXPORT_NC_CAP      (1u << 20) /* name cache slots (power of 2) */
#define EXPORT_NC_MAX      (EXPORT_NC_CAP / 2)
#define EXPORT_NC_TEXT_MAX (256u << 20)

/* ------------------------------------------------------------------------------------------ */
/* Output: a buffered writer over a file descriptor or zlib */

struct xout {
    kp_export_sink *sink;
    void *ud;
    bool gz;
    z_stream z;
    char *buf;  /* JSON not yet handed on */
    char *zbuf; /* compressed bytes (gz) */
    size_t len;
    int err;        /* first error (the sink's, or zlib's), sticky */
    uint64_t bytes; /* JSON bytes written (before compression) */
};

/* Compresses (gz) what the buffer holds and hands the result on; with finish, ends the gzip
 * stream. */
static void xo_deflate(struct xout *o, bool finish)
{
    o->z.next_in = (Bytef *) o->buf;
    o->z.avail_in = (uInt) o->len;
    for (;;) {
        int zrc;

        o->z.next_out = (Bytef *) o->zbuf;
        o->z.avail_out = EXPORT_OUT_BUF;
        zrc = deflate(&o->z, finish ? Z_FINISH : Z_NO_FLUSH);
        if (zrc == Z_STREAM_ERROR) {
            o->err = -EIO;
            return;
        }
        if (o->z.avail_out < EXPORT_OUT_BUF) {
            int rc = o->sink(o->ud, o->zbuf, EXPORT_OUT_BUF - o->z.avail_out);

            if (rc != 0) {
                o->err = rc;
                return;
            }
        }
        if (finish ? zrc == Z_STREAM_END : o->z.avail_out != 0) {
            return;
        }
    }
}

static void xo_flush(struct xout *o)
{
    if (o->err != 0 || o->len == 0) {
        o->len = 0;
        return;
    }
    if (o->gz) {
        xo_deflate(o, false);
    }
    else {
        int rc = o->sink(o->ud, o->buf, o->len);

        if (rc != 0) {
            o->err = rc;
        }
    }
    o->bytes += o->len;
    o->len = 0;
}

/* Slow path of xo_put: flushes, then copies p (in pieces when it is bigger than the buffer). */
static __attribute__((noinline)) void xo_put_slow(struct xout *o, const char *p, size_t n)
{
    xo_flush(o);
    while (n > 0) {
        size_t k = n < EXPORT_OUT_BUF ? n : EXPORT_OUT_BUF;

        memcpy(o->buf, p, k);
        o->len = k;
        p += k;
        n -= k;
        if (n > 0) {
            xo_flush(o);
        }
    }
}

static inline void xo_put(struct xout *o, const char *p, size_t n)
{
    if (o->len + n > EXPORT_OUT_BUF) {
        xo_put_slow(o, p, n);
        return;
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
}

#define XO_LIT(o, s) xo_put((o), (s), sizeof(s) - 1)

static inline void xo_putc(struct xout *o, char c)
{
    if (o->len + 1 > EXPORT_OUT_BUF) {
        xo_flush(o);
    }
    o->buf[o->len++] = c;
}

static inline void xo_u64(struct xout *o, uint64_t v)
{
    char tmp[24];
    int n = 0;

    do {
        tmp[sizeof(tmp) - 1 - n++] = (char) ('0' + v % 10);
        v /= 10;
    } while (v != 0);
    xo_put(o, tmp + sizeof(tmp) - n, (size_t) n);
}

static inline void xo_i64(struct xout *o, int64_t v)
{
    if (v < 0) {
        xo_putc(o, '-');
        xo_u64(o, v == INT64_MIN ? (uint64_t) INT64_MAX + 1 : (uint64_t) -v);
        return;
    }
    xo_u64(o, (uint64_t) v);
}

/* ns as µs with exactly 3 decimals ("1234.567"): exact, and import reads it back exactly. */
static inline void xo_us(struct xout *o, int64_t ns)
{
    uint64_t a;
    char frac[4];

    if (ns < 0) {
        xo_putc(o, '-');
        a = ns == INT64_MIN ? (uint64_t) INT64_MAX + 1 : (uint64_t) -ns;
    }
    else {
        a = (uint64_t) ns;
    }
    xo_u64(o, a / 1000);
    frac[0] = '.';
    frac[1] = (char) ('0' + a % 1000 / 100);
    frac[2] = (char) ('0' + a % 100 / 10);
    frac[3] = (char) ('0' + a % 10);
    xo_put(o, frac, 4);
}

/* A JSON string of s[0..n) (kp_json.h), straight into the output buffer. */
static void xo_jstrn(struct xout *o, const char *s, size_t n)
{
    char esc[KP_JSON_ESCAPE_MAX];

    xo_putc(o, '"');
    while (n > 0) {
        size_t k = kp_json_plain_len(s, n);

        xo_put(o, s, k);
        if (k == n) {
            break;
        }
        xo_put(o, esc, kp_json_escape((unsigned char) s[k], esc));
        s += k + 1;
        n -= k + 1;
    }
    xo_putc(o, '"');
}

static void xo_jstr(struct xout *o, const char *s)
{
    xo_jstrn(o, s, strlen(s));
}

/* ------------------------------------------------------------------------------------------ */
/* Python literal (as import stores Input Dims / Input type) back to JSON */

struct pylit {
    const char *p, *end;
    struct kp_strbuf *out;
    int depth;
};

static void py_ws(struct pylit *y)
{
    while (y->p < y->end && (*y->p == ' ' || *y->p == '\t' || *y->p == '\n')) {
        y->p++;
    }
}

static int py_value(struct pylit *y);

static int py_string(struct pylit *y)
{
    char q = *y->p++;
    int rc = kp_strbuf_putc(y->out, '"');

    while (rc == 0) {
        const char *run = y->p;

        /* a run of plain bytes: backslash and quote are ASCII, so a run ends between UTF-8
         * sequences */
        while (y->p < y->end && *y->p != q && *y->p != '\\') {
            y->p++;
        }
        rc = kp_json_append_chars(y->out, run, (size_t) (y->p - run));
        if (rc != 0) {
            return rc;
        }
        if (y->p >= y->end) {
            return -EINVAL;
        }
        if (*y->p == q) {
            break;
        }
        if (++y->p >= y->end) {
            return -EINVAL;
        }
        if (*y->p != '\'' && *y->p != '\\' && *y->p != '"') { /* py_str escapes only ' and \ */
            return -EINVAL;
        }
        rc = kp_json_append_chars(y->out, y->p++, 1);
    }
    if (rc != 0) {
        return rc;
    }
    y->p++;
    return kp_strbuf_putc(y->out, '"');
}

static int py_container(struct pylit *y)
{
    char open = *y->p++, close = open == '[' ? ']' : '}';
    int rc;
    bool first = true;

    if (++y->depth > 64) {
        return -EINVAL;
    }
    if ((rc = kp_strbuf_putc(y->out, open)) != 0) {
        return rc;
    }
    for (;;) {
        py_ws(y);
        if (y->p >= y->end) {
            return -EINVAL;
        }
        if (*y->p == close) {
            y->p++;
            break;
        }
        if (!first) {
            if (*y->p != ',') {
                return -EINVAL;
            }
            y->p++;
            py_ws(y);
            if ((rc = kp_strbuf_append(y->out, ", ", 2)) != 0) {
                return rc;
            }
        }
        first = false;
        if (open == '{') {
            if (y->p >= y->end || (*y->p != '\'' && *y->p != '"')) {
                return -EINVAL;
            }
            if ((rc = py_string(y)) != 0) {
                return rc;
            }
            py_ws(y);
            if (y->p >= y->end || *y->p != ':') {
                return -EINVAL;
            }
            y->p++;
            if ((rc = kp_strbuf_append(y->out, ": ", 2)) != 0) {
                return rc;
            }
        }
        if ((rc = py_value(y)) != 0) {
            return rc;
        }
    }
    y->depth--;
    return kp_strbuf_putc(y->out, close);
}

static bool py_word(struct pylit *y, const char *w)
{
    size_t n = strlen(w);

    if ((size_t) (y->end - y->p) >= n && memcmp(y->p, w, n) == 0) {
        y->p += n;
        return true;
    }
    return false;
}

static int py_value(struct pylit *y)
{
    py_ws(y);
    if (y->p >= y->end) {
        return -EINVAL;
    }
    switch (*y->p) {
    case '[':
    case '{':
        return py_container(y);
    case '\'':
    case '"':
        return py_string(y);
    default:
        break;
    }
    if (py_word(y, "True")) {
        return kp_strbuf_append_str(y->out, "true");
    }
    if (py_word(y, "False")) {
        return kp_strbuf_append_str(y->out, "false");
    }
    if (py_word(y, "None")) {
        return kp_strbuf_append_str(y->out, "null");
    }
    /* a JSON number, as captured */
    const char *s = y->p;

    if (y->p < y->end && *y->p == '-') {
        y->p++;
    }
    if (y->p >= y->end || *y->p < '0' || *y->p > '9') {
        return -EINVAL;
    }
    while (y->p < y->end && ((*y->p >= '0' && *y->p <= '9') || *y->p == '.' || *y->p == 'e' ||
                             *y->p == 'E' || *y->p == '+' || *y->p == '-')) {
        y->p++;
    }
    return kp_strbuf_append(y->out, s, (size_t) (y->p - s));
}

/* Writes the stored Python literal s as its JSON value; text that is not one (from another
 * producer) is written as a JSON string. */
static void xo_pylit(struct xout *o, struct kp_strbuf *tmp, const char *s)
{
    struct pylit y = { s, s + strlen(s), tmp, 0 };

    kp_strbuf_reset(tmp);
    if (py_value(&y) == 0 && (py_ws(&y), y.p == y.end)) {
        xo_put(o, tmp->data, tmp->len);
        return;
    }
    xo_jstr(o, s);
}

/* ------------------------------------------------------------------------------------------ */
/* The export */

struct track {
    int64_t pid, tid; /* tid -1: unused slot */
    bool gpu;
};

struct xp {
    PGconn *pg;
    unsigned fetch_rows;
    bool in_tx;
    int32_t *ranks;
    size_t n_ranks;
    struct xout out;
    struct kp_strbuf tmp;
    struct kp_strbuf dist; /* the rank's ranks.distributed_info, "" if none */
    char err[1024];
    /* the run */
    long run;
    char job[512];
    long world_size;
    bool imported;       /* source IMPORT: distributedInfo only if its trace had one */
    int64_t run_base_ns; /* the run's earliest event (>= 0) */
    /* the rank being written */
    long rank;
    int64_t base_ns; /* its baseTimeNanoseconds: every ts is µs relative to it */
    int64_t pid;
    int device;
    char host[512];
    char dev_name[EXPORT_MAX_DEVICES][128];
    uint64_t events, flows;
    uint64_t rows[KP_EV_COUNT];
    struct track *tracks;
    size_t n_tracks;
    bool tracks_full;
    /* names.id → name, filled a FETCH at a time (see names_load) */
    uint32_t *nc_id;  /* 0: empty slot */
    uint32_t *nc_off; /* into nc_text */
    size_t nc_cap, nc_n;
    struct kp_strbuf nc_text;
    struct kp_strbuf nc_query;
    const int *ncols; /* the name columns of the current cursor, -1 terminated */
    bool has_memory;  /* the schema has memory_events (migration 0002) */
    int memory_kind;  /* its index in kp_event_kinds, -1 if this build has none */
    /* the cuda_profiler_range event being written (row_counter) */
    bool rng_open;
    int64_t rng_corr, rng_dev;
};

static uint64_t track_hash(int64_t pid, int64_t tid)
{
    uint64_t h = (uint64_t) pid * 0x9e3779b97f4a7c15ULL ^ (uint64_t) tid * 0xc2b2ae3d27d4eb4fULL;

    return h ^ (h >> 29);
}

static void track_seen(struct xp *x, int64_t pid, int64_t tid, bool gpu)
{
    size_t cap = 2 * EXPORT_MAX_TRACKS, i = track_hash(pid, tid) & (cap - 1);

    for (;; i = (i + 1) & (cap - 1)) {
        struct track *t = &x->tracks[i];

        if (t->tid < 0) {
            if (x->n_tracks >= EXPORT_MAX_TRACKS) {
                x->tracks_full = true;
                return;
            }
            t->pid = pid;
            t->tid = tid;
            t->gpu = gpu;
            x->n_tracks++;
            return;
        }
        if (t->pid == pid && t->tid == tid) {
            return;
        }
    }
}

static inline void ev_begin(struct xp *x)
{
    if (x->events++ == 0) {
        XO_LIT(&x->out, "\n");
    }
    else {
        XO_LIT(&x->out, ",\n");
    }
}

/* {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ..., "dur": ..., "args": { */
static void ev_x(struct xp *x, const char *cat, const char *name, int64_t pid, int64_t tid,
                 int64_t start_ns, int64_t dur_ns, bool gpu)
{
    struct xout *o = &x->out;

    ev_begin(x);
    XO_LIT(o, "{\"ph\": \"X\", \"cat\": \"");
    xo_put(o, cat, strlen(cat));
    XO_LIT(o, "\", \"name\": ");
    xo_jstr(o, name);
    XO_LIT(o, ", \"pid\": ");
    xo_i64(o, pid);
    XO_LIT(o, ", \"tid\": ");
    xo_i64(o, tid);
    XO_LIT(o, ", \"ts\": ");
    xo_us(o, start_ns - x->base_ns);
    XO_LIT(o, ", \"dur\": ");
    xo_us(o, dur_ns < 0 ? 0 : dur_ns);
    XO_LIT(o, ", \"args\": {");
    track_seen(x, pid, tid, gpu);
}

/* An int arg: `, "key": v` (first: without the comma). */
static inline void arg_i(struct xout *o, bool *first, const char *key, int64_t v)
{
    if (!*first) {
        XO_LIT(o, ", ");
    }
    *first = false;
    xo_putc(o, '"');
    xo_put(o, key, strlen(key));
    XO_LIT(o, "\": ");
    xo_i64(o, v);
}

static inline void arg_s(struct xout *o, bool *first, const char *key, const char *v)
{
    if (!*first) {
        XO_LIT(o, ", ");
    }
    *first = false;
    xo_putc(o, '"');
    xo_put(o, key, strlen(key));
    XO_LIT(o, "\": ");
    xo_jstr(o, v);
}

static inline void arg_key(struct xout *o, bool *first, const char *key)
{
    if (!*first) {
        XO_LIT(o, ", ");
    }
    *first = false;
    xo_putc(o, '"');
    xo_put(o, key, strlen(key));
    XO_LIT(o, "\": ");
}

static inline int64_t I(const PGresult *r, int row, int col)
{
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static inline const char *S(const PGresult *r, int row, int col)
{
    return PQgetvalue(r, row, col);
}

typedef void export_row_cb(struct xp *x, const PGresult *r, int row);

static size_t nc_slot(const struct xp *x, uint32_t id)
{
    size_t i = (id * 0x9e3779b1u) & (x->nc_cap - 1);

    while (x->nc_id[i] != 0 && x->nc_id[i] != id) {
        i = (i + 1) & (x->nc_cap - 1);
    }
    return i;
}

static void nc_clear(struct xp *x)
{
    memset(x->nc_id, 0, x->nc_cap * sizeof(*x->nc_id));
    x->nc_n = 0;
    kp_strbuf_reset(&x->nc_text);
}

/* The name of names.id id, or "" (id 0 or not loaded: cannot happen after names_load). */
static const char *nc_get(const struct xp *x, uint32_t id)
{
    size_t i;

    if (id == 0) {
        return "";
    }
    i = nc_slot(x, id);
    return x->nc_id[i] == id && x->nc_off[i] != UINT32_MAX ? x->nc_text.data + x->nc_off[i] : "";
}

/* The name in column c of a row (its names.id), NULL when the column is NULL. */
static const char *NM(const struct xp *x, const PGresult *r, int row, int c)
{
    if (PQgetisnull(r, row, c)) {
        return NULL;
    }
    return nc_get(x, (uint32_t) strtoul(PQgetvalue(r, row, c), NULL, 10));
}

static const char *NM0(const struct xp *x, const PGresult *r, int row, int c)
{
    const char *s = NM(x, r, row, c);

    return s != NULL ? s : "";
}

/*
 * Makes sure every names.id in x->ncols of res is in the cache: one query for those that are
 * not. Names are resolved here rather than in SQL because a per-row subquery or a join with
 * the whole (global) names table costs far more than the export itself. The cache holds at
 * most EXPORT_NC_MAX names / EXPORT_NC_TEXT_MAX bytes; past that it starts again (a batch's
 * names are always loaded together). Returns 0 or KP_EPG.
 */
static int names_load(struct xp *x, const PGresult *res)
{
    struct kp_strbuf *q = &x->nc_query;
    PGresult *nr = NULL;
    size_t missing = 0;
    int rc, n = PQntuples(res);

    if (x->ncols == NULL || x->ncols[0] < 0 || n == 0) {
        return 0;
    }
    if (x->nc_n + (size_t) n * 4 > EXPORT_NC_MAX || x->nc_text.len > EXPORT_NC_TEXT_MAX) {
        nc_clear(x);
    }
    kp_strbuf_reset(q);
    if (kp_strbuf_append_str(q, "SELECT id, name FROM names WHERE id = ANY('{") != 0) {
        goto oom;
    }
    for (int i = 0; i < n; i++) {
        for (const int *c = x->ncols; *c >= 0; c++) {
            uint32_t id;
            size_t s;

            if (PQgetisnull(res, i, *c)) {
                continue;
            }
            id = (uint32_t) strtoul(PQgetvalue(res, i, *c), NULL, 10);
            if (id == 0) {
                continue;
            }
            s = nc_slot(x, id);
            if (x->nc_id[s] == id) {
                continue;
            }
            x->nc_id[s] = id; /* reserved; the text comes below */
            x->nc_off[s] = UINT32_MAX;
            x->nc_n++;
            if (kp_strbuf_appendf(q, "%s%u", missing++ ? "," : "", id) != 0) {
                goto oom;
            }
        }
    }
    if (missing == 0) {
        return 0;
    }
    if (kp_strbuf_append_str(q, "}'::integer[])") != 0) {
        goto oom;
    }
    if ((rc = kp_pg_query(x->pg, q->data, 0, NULL, &nr, x->err, sizeof(x->err))) != 0) {
        return rc;
    }
    for (int i = 0; i < PQntuples(nr); i++) {
        uint32_t id = (uint32_t) strtoul(PQgetvalue(nr, i, 0), NULL, 10);
        size_t s = nc_slot(x, id);

        if (x->nc_id[s] != id) {
            continue;
        }
        x->nc_off[s] = (uint32_t) x->nc_text.len;
        if (kp_strbuf_append(&x->nc_text, PQgetvalue(nr, i, 1),
                             (size_t) PQgetlength(nr, i, 1) + 1) != 0) {
            PQclear(nr);
            goto oom;
        }
    }
    PQclear(nr);
    return 0;
oom:
    snprintf(x->err, sizeof(x->err), "out of memory (names)");
    return -ENOMEM;
}

/* Runs sql through a cursor, calling cb for every row, with the names.id columns ncols (-1
 * terminated) resolved for NM(). Returns 0 or KP_EPG (x->err). */
static int cursor_each(struct xp *x, const char *sql, const int *ncols, export_row_cb *cb)
{
    struct kp_strbuf q;
    char fetch[64];
    int rc;

    kp_strbuf_init(&q, 0);
    if (kp_strbuf_appendf(&q, "DECLARE kp_export_c NO SCROLL CURSOR FOR %s", sql) != 0) {
        kp_strbuf_fini(&q);
        snprintf(x->err, sizeof(x->err), "out of memory");
        return -ENOMEM;
    }
    rc = kp_pg_exec(x->pg, q.data, x->err, sizeof(x->err));
    kp_strbuf_fini(&q);
    if (rc != 0) {
        return rc;
    }
    snprintf(fetch, sizeof(fetch), "FETCH FORWARD %lld FROM kp_export_c",
             (long long) x->fetch_rows);
    for (;;) {
        PGresult *res = NULL;
        int n;

        if ((rc = kp_pg_query(x->pg, fetch, 0, NULL, &res, x->err, sizeof(x->err))) != 0) {
            return rc;
        }
        n = PQntuples(res);
        x->ncols = ncols;
        if ((rc = names_load(x, res)) != 0) {
            PQclear(res);
            return rc;
        }
        for (int i = 0; i < n; i++) {
            cb(x, res, i);
        }
        PQclear(res);
        if (x->out.err != 0) {
            snprintf(x->err, sizeof(x->err), "writing: %s", strerror(-x->out.err));
            return x->out.err;
        }
        if (n == 0) {
            break;
        }
    }
    return kp_pg_exec(x->pg, "CLOSE kp_export_c", x->err, sizeof(x->err));
}

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
        arg_i(o, first, "External id", ext);
    }
    arg_i(o, first, "device", dev);
    arg_i(o, first, "context", ctx);
    arg_i(o, first, "stream", stream);
    arg_i(o, first, "correlation", corr);
}

#define GPU_ORDER "ORDER BY (coalesce(t.device, 0) <> %d), t.start_ns"

static void row_kernel(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t dev = I(r, i, 3), stream = I(r, i, 4);
    bool first = true;

    ev_x(x, "kernel", NM0(x, r, i, 2), dev, stream, I(r, i, 0), I(r, i, 1), true);
    gpu_args(o, &first, dev, I(r, i, 5), stream, I(r, i, 6), I(r, i, 7));
    arg_i(o, &first, "registers per thread", I(r, i, 14));
    arg_i(o, &first, "shared memory", I(r, i, 15));
    arg_key(o, &first, "grid");
    xo_putc(o, '[');
    xo_i64(o, I(r, i, 8));
    XO_LIT(o, ", ");
    xo_i64(o, I(r, i, 9));
    XO_LIT(o, ", ");
    xo_i64(o, I(r, i, 10));
    XO_LIT(o, "], \"block\": [");
    xo_i64(o, I(r, i, 11));
    XO_LIT(o, ", ");
    xo_i64(o, I(r, i, 12));
    XO_LIT(o, ", ");
    xo_i64(o, I(r, i, 13));
    xo_putc(o, ']');
    if (I(r, i, 16) != 0) {
        arg_i(o, &first, "graph id", I(r, i, 16));
    }
    if (I(r, i, 17) != 0) {
        arg_i(o, &first, "graph node id", I(r, i, 17));
    }
    /* float8 text is the shortest form that reads back to the same double */
    for (int c = 18; c <= 19; c++) {
        const char *v = PQgetvalue(r, i, c);

        if (!PQgetisnull(r, i, c) && strcmp(v, "NaN") != 0) {
            XO_LIT(o, ", \"");
            {
                const char *key = c == 18 ? "blocks per SM" : "est. achieved occupancy %";

                xo_put(o, key, strlen(key));
            }
            XO_LIT(o, "\": ");
            xo_put(o, v, strlen(v));
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
    xo_put(o, bw, strlen(bw));
}

/* The event and GPU args of a memcpy, memset or sync row: its columns 0 start, 1 duration,
 * 2 device, 3 stream, 4 context, 5 correlation; ext the external id (0: none). */
static void gpu_row(struct xp *x, const PGresult *r, int i, const char *cat, const char *name,
                    int64_t ext, bool *first)
{
    int64_t dev = I(r, i, 2), stream = I(r, i, 3);

    ev_x(x, cat, name, dev, stream, I(r, i, 0), I(r, i, 1), true);
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
    arg_i(o, &first, "bytes", bytes);
    arg_bandwidth(o, r, i, 13, bytes, dur);
    if (src_dev != 0 || dst_dev != 0) {
        arg_i(o, &first, "fromDevice", src_dev);
        arg_i(o, &first, "toDevice", dst_dev);
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
    arg_i(o, &first, "bytes", bytes);
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
        arg_i(o, &first, "wait_on_cuda_event_id", ev);
    }
    XO_LIT(o, "}}");
    x->rows[KP_EV_SYNC]++;
}

static void row_api(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t dom = I(r, i, 4), corr = I(r, i, 6), ext = I(r, i, 7);
    bool first = true;

    ev_x(x,
         dom == 1   ? "cuda_runtime"
         : dom == 2 ? "cuda_driver"
                    : "overhead",
         NM0(x, r, i, 2), x->pid, I(r, i, 3), I(r, i, 0), I(r, i, 1), false);
    if (ext != 0) {
        arg_i(o, &first, "External id", ext);
    }
    arg_i(o, &first, "cbid", I(r, i, 5));
    arg_i(o, &first, "correlation", corr);
    XO_LIT(o, "}}");
    x->rows[KP_EV_API]++;
}

/* The args of a collective (columns c.. of r: name, dtype, in, out, group size, pg, seq). */
static void coll_args(struct xp *x, bool *first, const PGresult *r, int i, int c)
{
    struct xout *o = &x->out;

    arg_s(o, first, "Collective name", NM0(x, r, i, c));
    if (NM(x, r, i, c + 1) != NULL) {
        arg_s(o, first, "dtype", NM(x, r, i, c + 1));
    }
    arg_i(o, first, "In msg nelems", I(r, i, c + 2));
    arg_i(o, first, "Out msg nelems", I(r, i, c + 3));
    arg_i(o, first, "Group size", I(r, i, c + 4));
    if (NM(x, r, i, c + 5) != NULL) {
        arg_s(o, first, "Process Group Name", NM(x, r, i, c + 5));
    }
    arg_i(o, first, "Seq", I(r, i, c + 6));
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
    const char *name = NM0(x, r, i, 2);
    bool first = true;

    x->rows[KP_EV_OP]++;
    if (kind == OP_UNSPEC) { /* a [memory] instant (kp_kineto.h) */
        ev_begin(x);
        XO_LIT(o, "{\"ph\": \"i\", \"s\": \"t\", \"cat\": \"cpu_instant_event\", \"name\": ");
        xo_jstr(o, name);
        XO_LIT(o, ", \"pid\": ");
        xo_i64(o, x->pid);
        XO_LIT(o, ", \"tid\": ");
        xo_i64(o, tid);
        XO_LIT(o, ", \"ts\": ");
        xo_us(o, I(r, i, 0) - x->base_ns);
        XO_LIT(o, ", \"args\": {");
        track_seen(x, x->pid, tid, false);
        arg_i(o, &first, "Total Reserved", parent);
        arg_i(o, &first, "Total Allocated", op_id);
        arg_i(o, &first, "Bytes", seq);
        arg_i(o, &first, "Addr", ext);
        arg_i(o, &first, "Device Id", I(r, i, 12));
        arg_i(o, &first, "Device Type", I(r, i, 13));
        XO_LIT(o, "}}");
        return;
    }
    if (kind == OP_GPU_USER) {
        int64_t dev = I(r, i, 12) < 0 ? 0 : I(r, i, 12);

        ev_x(x, "gpu_user_annotation", name, dev, I(r, i, 13), I(r, i, 0), I(r, i, 1), true);
        if (ext != 0) {
            arg_i(o, &first, "External id", ext);
        }
        XO_LIT(o, "}}");
        return;
    }
    if (kind == OP_PY) {
        ev_x(x, "python_function", name, x->pid, tid, I(r, i, 0), I(r, i, 1), false);
        if ((uint64_t) op_id >= KP_KINETO_PY_ID_BASE) {
            arg_i(o, &first, "Python id", (int64_t) ((uint64_t) op_id - KP_KINETO_PY_ID_BASE));
        }
        if ((uint64_t) parent >= KP_KINETO_PY_ID_BASE) {
            arg_i(o, &first, "Python parent id",
                  (int64_t) ((uint64_t) parent - KP_KINETO_PY_ID_BASE));
        }
        XO_LIT(o, "}}");
        return;
    }
    ev_x(x, kind == OP_CPU ? "cpu_op" : "user_annotation", name, x->pid, tid, I(r, i, 0),
         I(r, i, 1), false);
    if (op_id != 0 || ext != 0) {
        arg_i(o, &first, "External id", op_id != 0 ? op_id : ext);
    }
    if (NM(x, r, i, 10) != NULL) {
        arg_key(o, &first, "Input Dims");
        xo_pylit(o, &x->tmp, NM(x, r, i, 10));
    }
    if (NM(x, r, i, 11) != NULL) {
        arg_key(o, &first, "Input type");
        xo_pylit(o, &x->tmp, NM(x, r, i, 11));
    }
    if (seq != -1) {
        arg_i(o, &first, "Sequence number", seq);
    }
    if (fwd != 0) {
        arg_i(o, &first, "Fwd thread id", fwd);
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

    ev_x(x, "cpu_op", "record_param_comms", x->pid, I(r, i, 2), I(r, i, 0), I(r, i, 1), false);
    if (I(r, i, 3) != 0) {
        arg_i(o, &first, "External id", I(r, i, 3));
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

    ev_begin(x);
    XO_LIT(o, "{\"ph\": \"i\", \"s\": \"t\", \"cat\": \"cpu_instant_event\", \"name\": ");
    xo_jstr(o, NM(x, r, i, 1) != NULL ? NM(x, r, i, 1) : "[memory]");
    XO_LIT(o, ", \"pid\": ");
    xo_i64(o, x->pid);
    XO_LIT(o, ", \"tid\": ");
    xo_i64(o, tid);
    XO_LIT(o, ", \"ts\": ");
    xo_us(o, I(r, i, 0) - x->base_ns);
    XO_LIT(o, ", \"args\": {");
    track_seen(x, x->pid, tid, false);
    arg_i(o, &first, "Total Reserved", I(r, i, 3));
    arg_i(o, &first, "Total Allocated", I(r, i, 4));
    arg_i(o, &first, "Bytes", I(r, i, 5));
    arg_i(o, &first, "Addr", I(r, i, 6));
    arg_i(o, &first, "Device Id", I(r, i, 7));
    arg_i(o, &first, "Device Type", I(r, i, 8));
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
    ev_x(x, "user_annotation", name, x->pid, x->pid, I(r, i, 0), I(r, i, 1), false);
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
        if (is_name && strncmp(NM0(x, r, i, 2), pfx, sizeof(pfx) - 1) == 0) {
            name = NM0(x, r, i, 2) + sizeof(pfx) - 1;
        }
        ev_x(x, "cuda_profiler_range", name, dev, 0, x->base_ns, 0, true);
        arg_i(o, &first, "device", dev);
        if (corr > 0 && (uint64_t) corr < KP_KINETO_RANGE_ID_BASE) {
            arg_i(o, &first, "correlation", corr);
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
    xo_jstr(o, NM0(x, r, i, 2));
    XO_LIT(o, ": ");
    xo_put(o, v, strlen(v));
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
    ev_begin(x);
    XO_LIT(o, "{\"ph\": \"s\", \"id\": ");
    xo_put(o, corr, strlen(corr));
    XO_LIT(o, ", \"pid\": ");
    xo_i64(o, x->pid);
    XO_LIT(o, ", \"tid\": ");
    xo_i64(o, I(r, i, 1));
    XO_LIT(o, ", \"ts\": ");
    xo_us(o, I(r, i, 0) - x->base_ns);
    XO_LIT(o, ", \"cat\": \"ac2g\", \"name\": \"ac2g\"}");
end_only:
    ev_begin(x);
    XO_LIT(o, "{\"ph\": \"f\", \"id\": ");
    xo_put(o, corr, strlen(corr));
    XO_LIT(o, ", \"pid\": ");
    xo_i64(o, I(r, i, 3));
    XO_LIT(o, ", \"tid\": ");
    xo_i64(o, I(r, i, 4));
    XO_LIT(o, ", \"ts\": ");
    xo_us(o, I(r, i, 2) - x->base_ns);
    XO_LIT(o, ", \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"}");
    x->flows++;
}

static void meta_ev(struct xp *x, const char *what, int64_t pid, int64_t tid, const char *key,
                    const char *sval, int64_t ival)
{
    struct xout *o = &x->out;

    ev_begin(x);
    XO_LIT(o, "{\"name\": \"");
    xo_put(o, what, strlen(what));
    XO_LIT(o, "\", \"ph\": \"M\", \"ts\": 0.000, \"pid\": ");
    xo_i64(o, pid);
    XO_LIT(o, ", \"tid\": ");
    xo_i64(o, tid);
    XO_LIT(o, ", \"args\": {\"");
    xo_put(o, key, strlen(key));
    XO_LIT(o, "\": ");
    if (sval != NULL) {
        xo_jstr(o, sval);
    }
    else {
        xo_i64(o, ival);
    }
    XO_LIT(o, "}}");
}

/* process_name / process_sort_index / thread_name / thread_sort_index for every track. */
static void write_metadata(struct xp *x)
{
    char label[800];
    bool host_done = false;
    bool dev_done[EXPORT_MAX_DEVICES] = { false };

    for (size_t i = 0; i < 2 * EXPORT_MAX_TRACKS; i++) {
        const struct track *t = &x->tracks[i];

        if (t->tid < 0) {
            continue;
        }
        if (!t->gpu && !host_done) {
            snprintf(label, sizeof(label), "rank %ld%s%s (pid %" PRId64 ")", x->rank,
                     x->host[0] ? " on " : "", x->host, x->pid);
            meta_ev(x, "process_name", t->pid, 0, "name", label, 0);
            meta_ev(x, "process_labels", t->pid, 0, "labels", "CPU", 0);
            meta_ev(x, "process_sort_index", t->pid, 0, "sort_index", NULL, 0);
            host_done = true;
        }
        if (t->gpu && t->pid >= 0 && t->pid < EXPORT_MAX_DEVICES && !dev_done[t->pid]) {
            const char *dn = x->dev_name[t->pid];

            snprintf(label, sizeof(label), "GPU %" PRId64 "%s%s (rank %ld)", t->pid,
                     dn[0] ? ": " : "", dn, x->rank);
            meta_ev(x, "process_name", t->pid, 0, "name", label, 0);
            snprintf(label, sizeof(label), "GPU %" PRId64, t->pid);
            meta_ev(x, "process_labels", t->pid, 0, "labels", label, 0);
            meta_ev(x, "process_sort_index", t->pid, 0, "sort_index", NULL, 1 + t->pid);
            dev_done[t->pid] = true;
        }
        snprintf(label, sizeof(label), t->gpu ? "stream %" PRId64 : "thread %" PRId64, t->tid);
        meta_ev(x, "thread_name", t->pid, t->tid, "name", label, 0);
        meta_ev(x, "thread_sort_index", t->pid, t->tid, "sort_index", NULL, t->tid);
    }
}

/* deviceProperties from the devices table; also fills x->dev_name. */
static int write_devices(struct xp *x)
{
    struct xout *o = &x->out;
    char sql[EXPORT_SQL_MAX];
    PGresult *res = NULL;
    int rc;

    snprintf(sql, sizeof(sql),
             "SELECT id, name, coalesce(global_memory_bytes, 0), coalesce(cc_major, 0), "
             "coalesce(cc_minor, 0), coalesce(max_threads_per_block, 0), "
             "coalesce(max_threads_per_sm, 0), coalesce(regs_per_block, 0), "
             "coalesce(regs_per_sm, 0), coalesce(warp_size, 0), coalesce(smem_per_block, 0), "
             "coalesce(smem_per_sm, 0), coalesce(sm_count, 0) FROM devices WHERE run_id = %ld "
             "AND rank = %ld ORDER BY id",
             x->run, x->rank);
    if ((rc = kp_pg_query(x->pg, sql, 0, NULL, &res, x->err, sizeof(x->err))) != 0) {
        return rc;
    }
    memset(x->dev_name, 0, sizeof(x->dev_name));
    XO_LIT(o, "\"deviceProperties\": [");
    for (int i = 0; i < PQntuples(res); i++) {
        static const char *const keys[] = { "totalGlobalMem",
                                            "computeMajor",
                                            "computeMinor",
                                            "maxThreadsPerBlock",
                                            "maxThreadsPerMultiprocessor",
                                            "regsPerBlock",
                                            "regsPerMultiprocessor",
                                            "warpSize",
                                            "sharedMemPerBlock",
                                            "sharedMemPerMultiprocessor",
                                            "numSms" };
        int64_t id = I(res, i, 0);

        if (i > 0) {
            xo_putc(o, ',');
        }
        XO_LIT(o, "\n  {\"id\": ");
        xo_i64(o, id);
        XO_LIT(o, ", \"name\": ");
        xo_jstr(o, S(res, i, 1));
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
            XO_LIT(o, ", \"");
            xo_put(o, keys[k], strlen(keys[k]));
            XO_LIT(o, "\": ");
            xo_i64(o, I(res, i, (int) k + 2));
        }
        xo_putc(o, '}');
        if (id >= 0 && id < EXPORT_MAX_DEVICES) {
            snprintf(x->dev_name[id], sizeof(x->dev_name[id]), "%s", S(res, i, 1));
        }
    }
    XO_LIT(o, "],\n");
    PQclear(res);
    return 0;
}

/* Runs sql (printf-style, built from fmt) through a cursor, cb on each row (cursor_each). */
static int each(struct xp *x, export_row_cb *cb, const int *ncols, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int each(struct xp *x, export_row_cb *cb, const int *ncols, const char *fmt, ...)
{
    char sql[EXPORT_SQL_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    return cursor_each(x, sql, ncols, cb);
}

static const int nc_none[] = { -1 }, nc_2[] = { 2, -1 };

/* The file's head up to the open traceEvents array: devices, distributedInfo, host, run,
 * time base. Returns 0, or an error with x->err set. */
static int write_head(struct xp *x)
{
    struct xout *o = &x->out;
    const long run = x->run, rank = x->rank;
    int rc;

    XO_LIT(o, "{\"schemaVersion\": 1,\n");
    if ((rc = write_devices(x)) != 0) {
        return rc;
    }
    /* An imported trace's distributedInfo as it was (pg_config, nccl_version ...), none if it
     * had none. Else (a capture), as Kineto, one only for a distributed job: a one-rank run
     * gets none (import then takes rank 0, world size 1) */
    if (x->dist.len > 0) {
        XO_LIT(o, "\"distributedInfo\": ");
        xo_put(o, x->dist.data, x->dist.len);
        XO_LIT(o, ",\n");
    }
    else if (!x->imported && (x->world_size > 1 || rank != 0)) {
        XO_LIT(o, "\"distributedInfo\": {\"backend\": ");
        XO_LIT(o, "\"nccl\", \"rank\": "); /* Kineto writes the process group's backend;
                                            * kprof does not store it and NCCL is what GPU
                                            * jobs use */
        xo_i64(o, rank);
        XO_LIT(o, ", \"world_size\": ");
        xo_i64(o, x->world_size);
        XO_LIT(o, "},\n");
    }
    XO_LIT(o, "\"host_name\": ");
    xo_jstr(o, x->host);
    XO_LIT(o, ",\n\"kprof\": {\"run\": ");
    xo_i64(o, run);
    XO_LIT(o, ", \"job\": ");
    xo_jstr(o, x->job);
    XO_LIT(o, "},\n\"displayTimeUnit\": \"ns\",\n\"baseTimeNanoseconds\": ");
    xo_i64(o, x->base_ns);
    XO_LIT(o, ",\n\"traceEvents\": [");
    return 0;
}

/* The GPU tables' events, the rank's own device first: import takes ranks.device from the
 * first GPU event. Returns 0, or an error with x->err set. */
static int write_gpu_events(struct xp *x)
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
static int write_host_events(struct xp *x)
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
static int write_ranges_and_flows(struct xp *x)
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

/* Writes rank x->rank's trace into x->out. Returns 0, or an error with x->err set. */
static int write_rank(struct xp *x)
{
    struct xout *o = &x->out;
    const long run = x->run, rank = x->rank;
    int rc;

    x->events = x->flows = 0;
    memset(x->rows, 0, sizeof(x->rows));
    for (size_t i = 0; i < 2 * EXPORT_MAX_TRACKS; i++) {
        x->tracks[i].tid = -1;
    }
    x->n_tracks = 0;
    x->tracks_full = false;
    if ((rc = write_head(x)) != 0 || (rc = write_gpu_events(x)) != 0 ||
        (rc = write_host_events(x)) != 0 || (rc = write_ranges_and_flows(x)) != 0) {
        return rc;
    }
    write_metadata(x);
    XO_LIT(o, "\n],\n\"traceName\": ");
    {
        char tn[128];

        snprintf(tn, sizeof(tn), "kprof run %ld rank %ld", run, rank);
        xo_jstr(o, tn);
    }
    XO_LIT(o, "}\n");
    if (x->tracks_full) {
        kp_log_warn("rank %ld has more than %u tracks: the extra ones are not named", rank,
                    EXPORT_MAX_TRACKS);
    }
    return 0;
}
/* ------------------------------------------------------------------------------------------ */
/* The API (export.h) */

static void xp_free(struct xp *x)
{
    if (x == NULL) {
        return;
    }
    free(x->ranks);
    free(x->tracks);
    free(x->nc_id);
    free(x->nc_off);
    kp_strbuf_fini(&x->nc_text);
    kp_strbuf_fini(&x->nc_query);
    free(x->out.buf);
    free(x->out.zbuf);
    kp_strbuf_fini(&x->tmp);
    kp_strbuf_fini(&x->dist);
    free(x);
}

/* Runs sql, a one-row query, into *res. */
static int query(struct xp *x, const char *sql, PGresult **res)
{
    return kp_pg_query(x->pg, sql, 0, NULL, res, x->err, sizeof(x->err));
}

static int begin(struct xp *x)
{
    char sql[2048], mem_min[128] = "";
    PGresult *res = NULL;
    int rc;

    if ((rc = kp_pg_exec(x->pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", x->err,
                         sizeof(x->err))) != 0) {
        return rc;
    }
    x->in_tx = true;
    /* Run partitions are rarely analyzed when a user exports (collectord does not ANALYZE),
     * and with no statistics the planner takes them for empty and nests loops over the
     * equi-joins below (flows, collectives): quadratic. Names are scalar subqueries (index
     * lookups), which this does not touch. The penalty that makes the costs huge would also
     * start JIT compilation (~0.5 s a query for nothing): off. */
    if ((rc = kp_pg_exec(x->pg, "SET LOCAL enable_nestloop = off; SET LOCAL jit = off", x->err,
                         sizeof(x->err))) != 0) {
        return rc;
    }
    x->memory_kind = -1;
    for (int k = 0; k < KP_EV_COUNT; k++) {
        if (strcmp(kp_event_kinds[k].table, "memory_events") == 0) {
            x->memory_kind = k;
        }
    }
    if ((rc = query(x, "SELECT to_regclass('memory_events') IS NOT NULL", &res)) != 0) {
        return rc;
    }
    x->has_memory = S(res, 0, 0)[0] == 't';
    PQclear(res);
    snprintf(sql, sizeof(sql), "SELECT job, world_size, source FROM runs WHERE id = %ld", x->run);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    if (PQntuples(res) == 0) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "run %ld not found; `kprofctl runs` lists runs", x->run);
        return KP_ENOTFOUND;
    }
    snprintf(x->job, sizeof(x->job), "%s", S(res, 0, 0));
    x->world_size = (long) I(res, 0, 1);
    x->imported = I(res, 0, 2) == KPROF__V1__RUN_SOURCE__RUN_SOURCE_IMPORT;
    PQclear(res);
    snprintf(sql, sizeof(sql), "SELECT rank FROM ranks WHERE run_id = %ld ORDER BY rank", x->run);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    if (PQntuples(res) == 0) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "run %ld has no ranks: no data reached it", x->run);
        return KP_ENOTFOUND;
    }
    if ((x->ranks = calloc((size_t) PQntuples(res), sizeof(*x->ranks))) == NULL) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        x->ranks[x->n_ranks++] = (int32_t) I(res, i, 0);
    }
    PQclear(res);
    if (x->has_memory) {
        snprintf(mem_min, sizeof(mem_min),
                 ", (SELECT min(start_ns) FROM memory_events WHERE run_id = %ld)", x->run);
    }
    /* B: the run's earliest event, so that every ts is >= 0 and the ranks line up */
    snprintf(sql, sizeof(sql),
             "SELECT coalesce(least((SELECT min(start_ns) FROM kernels WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM memcpys WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM memsets WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM api_calls WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM ops WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM steps WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM collectives WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM syncs WHERE run_id = %1$ld)%2$s), 0)",
             x->run, mem_min);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    x->run_base_ns = I(res, 0, 0);
    if (x->run_base_ns < 0) {
        x->run_base_ns = 0; /* baseTimeNanoseconds must not be negative */
    }
    PQclear(res);
    return 0;
}

int kp_export_open(PGconn *pg, int64_t run, unsigned fetch_rows, struct kp_export **out, char *err,
                   size_t errlen)
{
    struct xp *x = calloc(1, sizeof(*x));
    int rc;

    *out = NULL;
    if (x == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    x->pg = pg;
    x->run = (long) run;
    x->fetch_rows = fetch_rows > 0 ? fetch_rows : KP_EXPORT_FETCH_ROWS;
    kp_strbuf_init(&x->tmp, 0);
    kp_strbuf_init(&x->dist, 0);
    kp_strbuf_init(&x->nc_text, 0);
    kp_strbuf_init(&x->nc_query, 0);
    x->nc_cap = EXPORT_NC_CAP;
    if ((x->tracks = calloc(2 * EXPORT_MAX_TRACKS, sizeof(*x->tracks))) == NULL ||
        (x->nc_id = calloc(x->nc_cap, sizeof(*x->nc_id))) == NULL ||
        (x->nc_off = calloc(x->nc_cap, sizeof(*x->nc_off))) == NULL ||
        (x->out.buf = malloc(EXPORT_OUT_BUF)) == NULL ||
        (x->out.zbuf = malloc(EXPORT_OUT_BUF)) == NULL) {
        xp_free(x);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if ((rc = begin(x)) != 0) {
        snprintf(err, errlen, "%s", x->err);
        kp_export_close((struct kp_export *) x);
        return rc;
    }
    *out = (struct kp_export *) x;
    return 0;
}

const int32_t *kp_export_ranks(const struct kp_export *xe, size_t *n)
{
    const struct xp *x = (const struct xp *) xe;

    *n = x->n_ranks;
    return x->ranks;
}

/* Loads the rank's row of `ranks` into x. Its time base is the imported trace's own
 * baseTimeNanoseconds (ranks.time_base_ns, migration 0008), so that import gives back the same
 * base and HTA-compatible analyses round the same relative µs (analyzer/hta.h); a rank without
 * one (a capture, a trace without a base) is written relative to the run's earliest event. */
static int load_rank(struct xp *x)
{
    char sql[320];
    PGresult *res = NULL;
    int rc;

    snprintf(sql, sizeof(sql),
             "SELECT coalesce(host, ''), coalesce(pid, 0), coalesce(device, 0), "
             "coalesce(distributed_info, ''), time_base_ns FROM ranks WHERE run_id = %ld AND "
             "rank = %ld",
             x->run, x->rank);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    kp_strbuf_reset(&x->dist);
    if (PQntuples(res) && kp_strbuf_append_str(&x->dist, S(res, 0, 3)) != 0) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "out of memory");
        return -ENOMEM;
    }
    snprintf(x->host, sizeof(x->host), "%s", PQntuples(res) ? S(res, 0, 0) : "");
    x->pid = PQntuples(res) ? I(res, 0, 1) : 0;
    x->device = PQntuples(res) ? (int) I(res, 0, 2) : 0;
    /* import stores no base of 0 or below (kp_kineto.c refuses a negative one) */
    x->base_ns = PQntuples(res) && !PQgetisnull(res, 0, 4) && I(res, 0, 4) > 0 ? I(res, 0, 4)
                                                                               : x->run_base_ns;
    PQclear(res);
    return 0;
}

int kp_export_rank(struct kp_export *xe, int32_t rank, int gzip_level, kp_export_sink *sink,
                   void *ud, struct kp_export_stats *st, char *err, size_t errlen)
{
    struct xp *x = (struct xp *) xe;
    struct xout *o = &x->out;
    bool known = false;
    int rc;

    memset(st, 0, sizeof(*st));
    for (size_t i = 0; i < x->n_ranks; i++) {
        known = known || x->ranks[i] == rank;
    }
    if (!known) {
        struct kp_strbuf l;

        kp_strbuf_init(&l, 4096);
        for (size_t i = 0; i < x->n_ranks && i < 32; i++) {
            (void) kp_strbuf_appendf(&l, "%s%d", i ? ", " : "", (int) x->ranks[i]);
        }
        snprintf(err, errlen, "run %ld has no rank %d (its ranks: %s%s)", x->run, (int) rank,
                 l.data != NULL ? l.data : "", x->n_ranks > 32 ? ", ..." : "");
        kp_strbuf_fini(&l);
        return KP_ENOTFOUND;
    }
    x->rank = rank;
    x->err[0] = '\0';
    o->sink = sink;
    o->ud = ud;
    o->len = 0;
    o->err = 0;
    o->bytes = 0;
    o->gz = gzip_level > 0;
    if (o->gz) {
        memset(&o->z, 0, sizeof(o->z));
        /* windowBits 15 + 16: a gzip stream, as gzdopen writes */
        if (deflateInit2(&o->z, gzip_level > 9 ? 9 : gzip_level, Z_DEFLATED, 15 + 16, 8,
                         Z_DEFAULT_STRATEGY) != Z_OK) {
            snprintf(err, errlen, "out of memory (zlib)");
            return -ENOMEM;
        }
    }
    if ((rc = load_rank(x)) == 0) {
        rc = write_rank(x);
    }
    if (rc == 0) {
        xo_flush(o);
        if (o->gz && o->err == 0) {
            o->len = 0;
            xo_deflate(o, true);
        }
        rc = o->err;
        if (rc != 0) {
            snprintf(x->err, sizeof(x->err), "%s", o->err == -EIO ? "zlib failed" : "stopped");
        }
    }
    if (o->gz) {
        (void) deflateEnd(&o->z);
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s", x->err[0] ? x->err : "export failed");
        return rc;
    }
    st->json_bytes = o->bytes;
    st->events = x->events;
    st->flows = x->flows;
    memcpy(st->rows, x->rows, sizeof(st->rows));
    return 0;
}

void kp_export_close(struct kp_export *xe)
{
    struct xp *x = (struct xp *) xe;
    char ignored[256];

    if (x == NULL) {
        return;
    }
    if (x->in_tx) {
        if (kp_pg_exec(x->pg, "COMMIT", ignored, sizeof(ignored)) != 0) {
            kp_pg_rollback(x->pg);
        }
    }
    xp_free(x);
}
