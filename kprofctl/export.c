/*
 * kprofctl export --run R [--rank N] -o FILE|DIR|- [--pg CONNINFO]: writes a run as Chrome
 * trace JSON (Kineto's dialect) that ui.perfetto.dev and chrome://tracing open and that
 * `kprofctl import` reads back to the same rows (the inverse of common/kp_kineto.h's mapping).
 *
 * Files. One trace file per rank, because a Kineto trace is one rank (distributedInfo.rank)
 * and that is what import reads back exactly:
 *  - -o FILE: the run's only rank, or --rank N. A run with several ranks and no --rank is a
 *    usage error (exit 2) that says to pass --rank or a directory.
 *  - -o DIR (an existing directory, or a path ending in '/'): one file per rank,
 *    DIR/kprof-run<R>.rank-<N>.pt.trace.json (.json.gz with --gzip); `kprofctl import DIR`
 *    reads them all back as one run.
 *  - -o -: stdout (one rank, as for FILE).
 * A FILE ending in .gz (or --gzip) is gzip-compressed with zlib. Files are written to a
 * temporary name beside the target, fsynced and renamed, so a reader never sees half a file.
 *
 * Reading. PostgreSQL through libpq, in one REPEATABLE READ READ ONLY transaction (every rank
 * of a run comes from one snapshot), each table through a cursor fetched --fetch-rows rows at
 * a time: memory stays bounded whatever the run's size (the tracks seen, for the metadata
 * events, are capped at EXPORT_MAX_TRACKS).
 *
 * Layout of a file: {"schemaVersion": 1, "deviceProperties": [devices], "distributedInfo":
 * {"backend", "rank", "world_size"}, "host_name", "baseTimeNanoseconds": B, "displayTimeUnit":
 * "ns", "traceEvents": [...]} where B is the run's earliest start_ns and every ts/dur is µs
 * after B with 3 decimals (exact to the ns). Processes: the rank's host process (pid =
 * ranks.pid) with its threads (tid) as tracks, and one process per GPU (pid = device id) with
 * its streams (tid = stream). Events, in Kineto's categories and arg names:
 *  - kernels → kernel; memcpys → gpu_memcpy named "Memcpy HtoD (Pinned -> Device)" from the
 *    kinds; memsets → gpu_memset "Memset (Device)"; syncs → cuda_sync "Stream Sync" ...;
 *    static_smem + dynamic_smem → "shared memory" (Kineto's single number); blocks_per_sm and
 *    est_occupancy → "blocks per SM" and "est. achieved occupancy %" when known; memcpys' and
 *    memsets' "memory bandwidth (GB/s)": the trace's figure when the import kept one, else
 *    bytes / dur_ns;
 *  - api_calls → cuda_runtime (domain 1), cuda_driver (2), overhead (other domains);
 *  - ops → cpu_op (CPU_OP), user_annotation (USER_ANNOTATION, NVTX, PROFILER_STEP),
 *    gpu_user_annotation (on the GPU process), python_function, and [memory] instants
 *    (kind 0). "External id" of a CPU op is its op_id (else its external_id): a captured
 *    run's op_id is the NVTX range id that its GPU rows' external_id names, so a kernel's
 *    External id equals its op's. input_shapes and input_dtypes (Python literals, as import
 *    stores them) go back to JSON arrays;
 *  - collectives → the args of their record_param_comms cpu_op (same start, dur, tid and
 *    external id); a collective without such an op becomes its own record_param_comms op;
 *  - steps: implied by the ProfilerStep#N ops; a step row without its op becomes a
 *    ProfilerStep#N user_annotation;
 *  - ac2g flows (s on the API call, f with bp "e" on the GPU activity, id = correlation) for
 *    every GPU activity whose correlation has an API call on the rank;
 *  - process_name / process_sort_index / thread_name metadata for every track seen.
 * Not exported: counters (they have no time), api_calls.return_value, memsets.value and the
 * step columns (import does not fill them).
 *
 * Exit status: 0; 1 failure (PostgreSQL, writing); 2 usage; 3 the run or rank does not exist.
 */
#define KP_LOG_MODULE "export"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <zlib.h>

#include "kp_codec.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_kineto.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "kprofctl.h"

#define EXPORT_MAX_ARGS    16
#define EXPORT_OUT_BUF     (1u << 20)
#define EXPORT_MAX_TRACKS  (1u << 16)
#define EXPORT_MAX_DEVICES 256
#define EXPORT_SQL_MAX     4096
#define EXPORT_NC_CAP      (1u << 20) /* name cache slots (power of 2) */
#define EXPORT_NC_MAX      (EXPORT_NC_CAP / 2)
#define EXPORT_NC_TEXT_MAX (256u << 20)

enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,
    EXIT_USAGE = 2,
    EXIT_NOTFOUND = 3
};

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

struct export_config {
    long long run;
    long long rank;
    char *output;
    char *pg;
    long long fetch_rows;
    long long gzip_level;
    bool gzip;
    bool json;
    int log_level;
};

#define OFF(f) offsetof(struct export_config, f)
static const struct kp_config_def export_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, 2147483647, OFF(run), "id of the run to export (required)",
      NULL, false },
    { "rank", KP_CONFIG_INT, "-1", -1, 65535, OFF(rank),
      "export only this rank (-1: every rank; a FILE output needs one rank)", NULL, false },
    { "output", KP_CONFIG_STRING, "", 0, 4000, OFF(output),
      "output: FILE (.gz: gzip), DIR (one file per rank) or - (stdout); also -o", NULL, false },
    { "pg", KP_CONFIG_STRING, "", 0, 0, OFF(pg),
      "PostgreSQL conninfo (\"\": libpq's PG* environment)", NULL, true },
    { "gzip", KP_CONFIG_BOOL, "false", 0, 0, OFF(gzip),
      "gzip the output even without a .gz suffix (per-rank files get .json.gz)", NULL, false },
    { "gzip-level", KP_CONFIG_INT, "1", 1, 9, OFF(gzip_level), "zlib compression level", NULL,
      false },
    { "fetch-rows", KP_CONFIG_INT, "10000", 100, 1000000, OFF(fetch_rows),
      "rows fetched from PostgreSQL per round trip", NULL, false },
    { "json", KP_CONFIG_BOOL, "false", 0, 0, OFF(json),
      "print the result as one JSON object on stdout", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "warn", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
};
#undef OFF
#define N_DEFS (sizeof(export_defs) / sizeof(export_defs[0]))

/* ------------------------------------------------------------------------------------------ */
/* Output: a buffered writer over a file descriptor or zlib */

struct xout {
    int fd;
    gzFile gz;
    char *buf;
    size_t len;
    int err;        /* first write error (-errno), sticky */
    uint64_t bytes; /* JSON bytes written (before compression) */
};

static void xo_flush(struct xout *o)
{
    size_t off = 0;

    if (o->err != 0 || o->len == 0) {
        o->len = 0;
        return;
    }
    if (o->gz != NULL) {
        if (gzwrite(o->gz, o->buf, (unsigned) o->len) != (int) o->len) {
            int zerr = 0;

            (void) gzerror(o->gz, &zerr);
            o->err = zerr == Z_ERRNO && errno != 0 ? -errno : -EIO;
        }
    }
    else {
        while (off < o->len) {
            ssize_t w = write(o->fd, o->buf + off, o->len - off);

            if (w < 0) {
                if (errno == EINTR) {
                    continue;
                }
                o->err = -errno;
                break;
            }
            off += (size_t) w;
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

/* A JSON string of s[0..n) (valid UTF-8 from the database: only quotes, backslashes and
 * control characters need escapes). */
static void xo_jstrn(struct xout *o, const char *s, size_t n)
{
    size_t run = 0;

    xo_putc(o, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char) s[i];
        char esc[8];

        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        xo_put(o, s + run, i - run);
        run = i + 1;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char) c;
            xo_put(o, esc, 2);
        }
        else {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            xo_put(o, esc, 6);
        }
    }
    xo_put(o, s + run, n - run);
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

    while (rc == 0 && y->p < y->end && *y->p != q) {
        unsigned char c = (unsigned char) *y->p++;

        if (c == '\\') {
            if (y->p >= y->end) {
                return -EINVAL;
            }
            c = (unsigned char) *y->p++; /* py_str escapes only ' and \ */
            if (c != '\'' && c != '\\' && c != '"') {
                return -EINVAL;
            }
        }
        if (c == '"' || c == '\\') {
            rc = kp_strbuf_putc(y->out, '\\');
            if (rc == 0) {
                rc = kp_strbuf_putc(y->out, (char) c);
            }
        }
        else if (c < 0x20) {
            rc = kp_strbuf_appendf(y->out, "\\u%04x", c);
        }
        else {
            rc = kp_strbuf_putc(y->out, (char) c);
        }
    }
    if (rc != 0) {
        return rc;
    }
    if (y->p >= y->end) {
        return -EINVAL;
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
    const struct export_config *cfg;
    PGconn *pg;
    struct xout out;
    struct kp_strbuf tmp;
    char err[1024];
    /* the run */
    long run;
    char job[512];
    long world_size;
    int64_t base_ns;
    /* the rank being written */
    long rank;
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
    snprintf(fetch, sizeof(fetch), "FETCH FORWARD %lld FROM kp_export_c", x->cfg->fetch_rows);
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
 * that reads back to the same double) when the import kept one, else bytes / ns. */
static void arg_bandwidth(struct xout *o, const PGresult *r, int i, int col, int64_t bytes,
                          int64_t dur)
{
    char bw[80];

    if (!PQgetisnull(r, i, col)) {
        snprintf(bw, sizeof(bw), ", \"memory bandwidth (GB/s)\": %s", PQgetvalue(r, i, col));
    }
    else if (dur > 0) {
        snprintf(bw, sizeof(bw), ", \"memory bandwidth (GB/s)\": %.6g",
                 (double) bytes / (double) dur);
    }
    else {
        return;
    }
    xo_put(o, bw, strlen(bw));
}

static void row_memcpy(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t dev = I(r, i, 2), stream = I(r, i, 3), bytes = I(r, i, 7), dur = I(r, i, 1);
    int64_t src_dev = I(r, i, 11), dst_dev = I(r, i, 12);
    char name[96];
    bool first = true;

    snprintf(name, sizeof(name), "Memcpy %s (%s -> %s)", NAME_OF(memcpy_kinds, I(r, i, 8)),
             NAME_OF(memory_kinds, I(r, i, 9)), NAME_OF(memory_kinds, I(r, i, 10)));
    ev_x(x, "gpu_memcpy", name, dev, stream, I(r, i, 0), dur, true);
    gpu_args(o, &first, dev, I(r, i, 4), stream, I(r, i, 5), I(r, i, 6));
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
    int64_t dev = I(r, i, 2), stream = I(r, i, 3), bytes = I(r, i, 7), dur = I(r, i, 1);
    char name[64];
    bool first = true;

    snprintf(name, sizeof(name), "Memset (%s)", NAME_OF(memory_kinds, I(r, i, 8)));
    ev_x(x, "gpu_memset", name, dev, stream, I(r, i, 0), dur, true);
    gpu_args(o, &first, dev, I(r, i, 4), stream, I(r, i, 5), I(r, i, 6));
    arg_i(o, &first, "bytes", bytes);
    arg_bandwidth(o, r, i, 9, bytes, dur);
    XO_LIT(o, "}}");
    x->rows[KP_EV_MEMSET]++;
}

static void row_sync(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    int64_t dev = I(r, i, 2), stream = I(r, i, 3), ev = I(r, i, 7);
    bool first = true;

    ev_x(x, "cuda_sync", NAME_OF(sync_types, I(r, i, 6)), dev, stream, I(r, i, 0), I(r, i, 1),
         true);
    gpu_args(o, &first, dev, I(r, i, 4), stream, I(r, i, 5), 0);
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

/* 0 api start, 1 api tid, 2 gpu start, 3 device, 4 stream, 5 correlation. */
static void row_flow(struct xp *x, const PGresult *r, int i)
{
    struct xout *o = &x->out;
    const char *corr = S(r, i, 5);

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

/* Writes rank x->rank's trace into x->out. Returns 0, or an error with x->err set. */
static int write_rank(struct xp *x)
{
    struct xout *o = &x->out;
    char sql[EXPORT_SQL_MAX];
    const long run = x->run, rank = x->rank;
    int rc;

    x->events = x->flows = 0;
    memset(x->rows, 0, sizeof(x->rows));
    for (size_t i = 0; i < 2 * EXPORT_MAX_TRACKS; i++) {
        x->tracks[i].tid = -1;
    }
    x->n_tracks = 0;
    x->tracks_full = false;

    XO_LIT(o, "{\"schemaVersion\": 1,\n");
    if ((rc = write_devices(x)) != 0) {
        return rc;
    }
    XO_LIT(o, "\"distributedInfo\": {\"backend\": ");
    XO_LIT(o, "\"nccl\", \"rank\": "); /* Kineto writes the process group's backend; kprof
                                        * does not store it and NCCL is what GPU jobs use */
    xo_i64(o, rank);
    XO_LIT(o, ", \"world_size\": ");
    xo_i64(o, x->world_size);
    XO_LIT(o, "},\n\"host_name\": ");
    xo_jstr(o, x->host);
    XO_LIT(o, ",\n\"kprof\": {\"run\": ");
    xo_i64(o, run);
    XO_LIT(o, ", \"job\": ");
    xo_jstr(o, x->job);
    XO_LIT(o, "},\n\"displayTimeUnit\": \"ns\",\n\"baseTimeNanoseconds\": ");
    xo_i64(o, x->base_ns);
    XO_LIT(o, ",\n\"traceEvents\": [");

#define EACH(cb, ncols, ...)                                  \
    do {                                                      \
        snprintf(sql, sizeof(sql), __VA_ARGS__);              \
        if ((rc = cursor_each(x, sql, (ncols), (cb))) != 0) { \
            return rc;                                        \
        }                                                     \
    } while (0)
    static const int nc_none[] = { -1 }, nc_2[] = { 2, -1 };
    static const int nc_op[] = { 2, 10, 11, 15, 16, 20, -1 }, nc_coll[] = { 4, 5, 9, -1 };

    /* GPU tables first, the rank's own device first: import takes ranks.device from the
     * first GPU event */
    EACH(row_kernel, nc_2,
         "SELECT t.start_ns, t.dur_ns, t.name, "
         "coalesce(t.device, 0), coalesce(t.stream, 0), coalesce(t.context, 0), "
         "coalesce(t.correlation, 0), coalesce(t.external_id, 0), coalesce(t.grid_x, 0), "
         "coalesce(t.grid_y, 0), coalesce(t.grid_z, 0), coalesce(t.block_x, 0), "
         "coalesce(t.block_y, 0), coalesce(t.block_z, 0), coalesce(t.registers, 0), "
         "coalesce(t.static_smem, 0)::bigint + coalesce(t.dynamic_smem, 0), "
         "coalesce(t.graph_id, 0), coalesce(t.graph_node_id, 0), o.blocks_per_sm, "
         "o.est_occupancy FROM kernels t" KP_SQL_KERNEL_OCCUPANCY_JOIN(
             "%ld", "%ld") " WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
         run, rank, run, rank, x->device);
    EACH(row_memcpy, nc_none,
         "SELECT t.start_ns, t.dur_ns, coalesce(t.device, 0), coalesce(t.stream, 0), "
         "coalesce(t.context, 0), coalesce(t.correlation, 0), coalesce(t.external_id, 0), "
         "coalesce(t.bytes, 0), coalesce(t.copy_kind, 0), coalesce(t.src_kind, 0), "
         "coalesce(t.dst_kind, 0), coalesce(t.src_device, 0), coalesce(t.dst_device, 0), "
         "bw.bandwidth_gbps FROM memcpys t" KP_SQL_BANDWIDTH_JOIN(
             "t", "memcpy_bandwidth", "%ld",
             "%ld") " WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
         run, rank, run, rank, x->device);
    EACH(row_memset, nc_none,
         "SELECT t.start_ns, t.dur_ns, coalesce(t.device, 0), coalesce(t.stream, 0), "
         "coalesce(t.context, 0), coalesce(t.correlation, 0), coalesce(t.external_id, 0), "
         "coalesce(t.bytes, 0), coalesce(t.mem_kind, 0), bw.bandwidth_gbps "
         "FROM memsets t" KP_SQL_BANDWIDTH_JOIN(
             "t", "memset_bandwidth", "%ld",
             "%ld") " WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
         run, rank, run, rank, x->device);
    EACH(row_sync, nc_none,
         "SELECT t.start_ns, t.dur_ns, coalesce(t.device, 0), coalesce(t.stream, 0), "
         "coalesce(t.context, 0), coalesce(t.correlation, 0), coalesce(t.sync_type, 0), "
         "coalesce(t.cuda_event, 0) "
         "FROM syncs t WHERE t.run_id = %ld AND t.rank = %ld " GPU_ORDER,
         run, rank, x->device);
    EACH(row_api, nc_2,
         "SELECT t.start_ns, t.dur_ns, t.name, "
         "coalesce(t.tid, 0), coalesce(t.domain, 1), coalesce(t.cbid, 0), "
         "coalesce(t.correlation, 0), coalesce(t.external_id, 0) "
         "FROM api_calls t WHERE t.run_id = %ld AND t.rank = %ld ORDER BY t.start_ns",
         run, rank);
    /* ops, each record_param_comms cpu_op with its collective */
    EACH(
        row_op, nc_op,
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
        run, rank);
    EACH(row_lone_coll, nc_coll,
         "SELECT c.start_ns, c.dur_ns, coalesce(c.tid, 0), coalesce(c.external_id, 0), "
         "c.name, c.dtype, coalesce(c.in_nelems, 0), coalesce(c.out_nelems, 0), "
         "coalesce(c.group_size, 0), c.process_group, coalesce(c.coll_seq, 0) "
         "FROM collectives c WHERE c.run_id = %ld AND c.rank = %ld AND NOT EXISTS ("
         "SELECT 1 FROM ops t WHERE t.run_id = c.run_id AND t.rank = c.rank AND t.kind = 1 "
         "AND t.start_ns = c.start_ns AND t.dur_ns = c.dur_ns "
         "AND coalesce(t.tid, 0) = coalesce(c.tid, 0) "
         "AND coalesce(t.external_id, 0) = coalesce(c.external_id, 0)) ORDER BY c.start_ns",
         run, rank);
    EACH(row_lone_step, nc_none,
         "SELECT s.start_ns, s.dur_ns, s.step FROM steps s WHERE s.run_id = %ld AND "
         "s.rank = %ld AND NOT EXISTS (SELECT 1 FROM ops t WHERE t.run_id = s.run_id AND "
         "t.rank = s.rank AND t.kind = 6 AND t.start_ns = s.start_ns AND t.dur_ns = s.dur_ns) "
         "ORDER BY s.start_ns",
         run, rank);
    if (x->has_memory) {
        static const int nc_mem[] = { 1, -1 };

        EACH(row_memory, nc_mem,
             "SELECT start_ns, name, coalesce(tid, 0), coalesce(total_reserved, 0), "
             "coalesce(total_allocated, 0), coalesce(bytes, 0), coalesce(addr, 0), "
             "coalesce(device, -1), coalesce(device_type, 0) FROM memory_events "
             "WHERE run_id = %ld AND rank = %ld ORDER BY start_ns",
             run, rank);
    }
    /* ac2g flows: API call → each GPU activity with its correlation */
    EACH(row_flow, nc_none,
         "SELECT a.start_ns, coalesce(a.tid, 0), g.start_ns, g.device, g.stream, a.correlation "
         "FROM api_calls a JOIN ("
         "SELECT start_ns, coalesce(device, 0) AS device, coalesce(stream, 0) AS stream, "
         "correlation FROM kernels WHERE run_id = %ld AND rank = %ld AND correlation > 0 "
         "UNION ALL SELECT start_ns, coalesce(device, 0), coalesce(stream, 0), correlation "
         "FROM memcpys WHERE run_id = %ld AND rank = %ld AND correlation > 0 "
         "UNION ALL SELECT start_ns, coalesce(device, 0), coalesce(stream, 0), correlation "
         "FROM memsets WHERE run_id = %ld AND rank = %ld AND correlation > 0"
         ") g ON g.correlation = a.correlation "
         "WHERE a.run_id = %ld AND a.rank = %ld AND a.correlation > 0 ORDER BY a.start_ns",
         run, rank, run, rank, run, rank, run, rank);
#undef EACH
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
/* Files */

static bool has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);

    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* Opens path for writing (a temporary beside it; "-" is stdout). Returns 0 and *tmp (owned,
 * NULL for stdout), or -errno. */
static int out_open(struct xp *x, const char *path, bool gz, char **tmp)
{
    struct xout *o = &x->out;
    int fd;

    *tmp = NULL;
    o->len = 0;
    o->err = 0;
    o->bytes = 0;
    o->gz = NULL;
    if (strcmp(path, "-") == 0) {
        fd = STDOUT_FILENO;
    }
    else {
        size_t n = strlen(path) + 16;
        mode_t um;

        if ((*tmp = malloc(n)) == NULL) {
            return -ENOMEM;
        }
        snprintf(*tmp, n, "%s.tmp.XXXXXX", path);
        if ((fd = mkstemp(*tmp)) < 0) {
            int e = -errno;

            free(*tmp);
            *tmp = NULL;
            return e;
        }
        um = umask(0);
        umask(um);
        (void) fchmod(fd, 0666 & ~um);
    }
    o->fd = fd;
    if (gz) {
        char mode[8];
        int dfd = fd == STDOUT_FILENO ? dup(fd) : fd;

        snprintf(mode, sizeof(mode), "wb%lld", x->cfg->gzip_level);
        if (dfd < 0 || (o->gz = gzdopen(dfd, mode)) == NULL) {
            int e = dfd < 0 ? -errno : -ENOMEM;

            if (*tmp != NULL) {
                close(fd);
                unlink(*tmp);
                free(*tmp);
                *tmp = NULL;
            }
            return e;
        }
        (void) gzbuffer(o->gz, 256 * 1024);
    }
    return 0;
}

/* Finishes the file: flush, close, fsync, rename tmp → path (ok) or unlink tmp (!ok). */
static int out_close(struct xp *x, const char *path, char *tmp, bool ok)
{
    struct xout *o = &x->out;
    int rc;

    if (ok) {
        xo_flush(o);
    }
    rc = o->err;
    if (o->gz != NULL) {
        int zrc = gzclose(o->gz); /* closes the fd */

        if (rc == 0 && zrc != Z_OK) {
            rc = zrc == Z_ERRNO ? -errno : -EIO;
        }
        o->gz = NULL;
        if (tmp == NULL) {
            o->fd = -1;
        }
    }
    else if (tmp != NULL) {
        if (rc == 0 && ok && fsync(o->fd) != 0) {
            rc = -errno;
        }
        if (close(o->fd) != 0 && rc == 0) {
            rc = -errno;
        }
    }
    if (tmp == NULL) {
        return rc;
    }
    if (ok && rc == 0) {
        /* a gzip file was closed by gzclose: make its data durable through the name */
        int fd = open(tmp, O_RDONLY);

        if (fd >= 0) {
            (void) fsync(fd);
            close(fd);
        }
        if (rename(tmp, path) != 0) {
            rc = -errno;
        }
    }
    if (!ok || rc != 0) {
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* Loads the rank's row of `ranks` into x. */
static int load_rank(struct xp *x)
{
    char sql[256];
    PGresult *res = NULL;
    int rc;

    snprintf(sql, sizeof(sql),
             "SELECT coalesce(host, ''), coalesce(pid, 0), coalesce(device, 0) FROM ranks "
             "WHERE run_id = %ld AND rank = %ld",
             x->run, x->rank);
    if ((rc = kp_pg_query(x->pg, sql, 0, NULL, &res, x->err, sizeof(x->err))) != 0) {
        return rc;
    }
    snprintf(x->host, sizeof(x->host), "%s", PQntuples(res) ? S(res, 0, 0) : "");
    x->pid = PQntuples(res) ? I(res, 0, 1) : 0;
    x->device = PQntuples(res) ? (int) I(res, 0, 2) : 0;
    PQclear(res);
    return 0;
}

struct rank_result {
    long rank;
    char *path;
    uint64_t bytes, events, flows;
    uint64_t rows[KP_EV_COUNT];
};

/* argv with "-o X" / "-oX" turned into "--output X" (kp_config takes only long flags). */
static int fix_argv(int argc, char **argv, char **out, int max)
{
    int n = 0;

    for (int i = 0; i < argc && n < max; i++) {
        if (strcmp(argv[i], "--") == 0) {
            for (; i < argc && n < max; i++) {
                out[n++] = argv[i];
            }
            break;
        }
        if (strcmp(argv[i], "-o") == 0) {
            out[n++] = (char *) "--output";
        }
        else if (strncmp(argv[i], "-o", 2) == 0 && argv[i][2] != '-') {
            out[n++] = (char *) "--output";
            if (n < max) {
                out[n++] = argv[i] + 2;
            }
        }
        else {
            out[n++] = argv[i];
        }
    }
    return n < max ? n : -1;
}

int kprofctl_export(int argc, char **argv)
{
    struct export_config cfg;
    struct kp_config_pos pos;
    struct xp x;
    char *args[EXPORT_MAX_ARGS];
    char **av = NULL;
    char err[1024], sql[2048], mem_min[128] = "";
    long *ranks = NULL;
    struct rank_result *res_r = NULL;
    size_t n_ranks = 0, n_done = 0;
    PGresult *res = NULL;
    bool dir_mode = false, in_tx = false;
    double t0;
    int action, rc = EXIT_FAIL, ac;

    memset(&cfg, 0, sizeof(cfg));
    memset(&x, 0, sizeof(x));
    x.out.fd = -1;
    kp_strbuf_init(&x.tmp, 0);
    kp_strbuf_init(&x.nc_text, 0);
    kp_strbuf_init(&x.nc_query, 0);
    if ((av = calloc((size_t) argc + 2, sizeof(*av))) == NULL ||
        (ac = fix_argv(argc, argv, av, argc + 2)) < 0) {
        fprintf(stderr, "kprofctl export: out of memory\n");
        free(av);
        return EXIT_FAIL;
    }
    pos.args = args;
    pos.max = EXPORT_MAX_ARGS;
    pos.n = 0;
    if (kp_config_load_args(export_defs, N_DEFS, &cfg, "kprofctl", ac, av, &pos, err, sizeof(err),
                            &action) != 0) {
        fprintf(stderr, "kprofctl export: %s (see kprofctl export --help)\n", err);
        free(av);
        return EXIT_USAGE;
    }
    if (action == KP_CONFIG_EXIT_OK) {
        printf("\nusage: kprofctl export --run R [--rank N] -o FILE|DIR|- [--pg CONNINFO]\n");
        rc = EXIT_OK;
        goto out;
    }
    kp_log_set_level((enum kp_log_level) cfg.log_level);
    x.cfg = &cfg;
    if (cfg.run <= 0 || cfg.output == NULL || cfg.output[0] == '\0' || pos.n > 0) {
        fprintf(stderr, "usage: kprofctl export --run R [--rank N] -o FILE|DIR|- (%s)\n",
                pos.n > 0      ? "unexpected argument"
                : cfg.run <= 0 ? "--run is required"
                               : "-o is required");
        rc = EXIT_USAGE;
        goto out;
    }
    {
        struct stat st;
        size_t ol = strlen(cfg.output);

        dir_mode = (stat(cfg.output, &st) == 0 && S_ISDIR(st.st_mode)) ||
                   (ol > 0 && cfg.output[ol - 1] == '/');
        if (dir_mode && stat(cfg.output, &st) != 0) {
            fprintf(stderr, "kprofctl export: %s: %s (create the directory first)\n", cfg.output,
                    strerror(errno));
            goto out;
        }
    }
    x.nc_cap = EXPORT_NC_CAP;
    if ((x.tracks = calloc(2 * EXPORT_MAX_TRACKS, sizeof(*x.tracks))) == NULL ||
        (x.nc_id = calloc(x.nc_cap, sizeof(*x.nc_id))) == NULL ||
        (x.nc_off = calloc(x.nc_cap, sizeof(*x.nc_off))) == NULL ||
        (x.out.buf = malloc(EXPORT_OUT_BUF)) == NULL) {
        fprintf(stderr, "kprofctl export: out of memory\n");
        goto out;
    }
    t0 = now_s();
    if (kp_pg_connect(cfg.pg, "kprofctl-export", &x.pg, err, sizeof(err)) != 0) {
        fprintf(stderr,
                "kprofctl export: cannot connect to PostgreSQL: %s; pass --pg CONNINFO or set "
                "KPROF_PG\n",
                err);
        goto out;
    }
    if (kp_pg_exec(x.pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err, sizeof(err)) !=
        0) {
        fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", err);
        goto out;
    }
    in_tx = true;
    /* Run partitions are rarely analyzed when a user exports (collectord does not ANALYZE),
     * and with no statistics the planner takes them for empty and nests loops over the
     * equi-joins below (flows, collectives): quadratic. Names are scalar subqueries (index
     * lookups), which this does not touch. The penalty that makes the costs huge would also
     * start JIT compilation (~0.5 s a query for nothing): off. */
    if (kp_pg_exec(x.pg, "SET LOCAL enable_nestloop = off; SET LOCAL jit = off", err,
                   sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", err);
        goto out;
    }
    x.run = (long) cfg.run;
    x.memory_kind = -1;
    for (int k = 0; k < KP_EV_COUNT; k++) {
        if (strcmp(kp_event_kinds[k].table, "memory_events") == 0) {
            x.memory_kind = k;
        }
    }
    if (kp_pg_query(x.pg, "SELECT to_regclass('memory_events') IS NOT NULL", 0, NULL, &res, err,
                    sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", err);
        goto out;
    }
    x.has_memory = S(res, 0, 0)[0] == 't';
    PQclear(res);
    res = NULL;
    snprintf(sql, sizeof(sql), "SELECT job, world_size FROM runs WHERE id = %ld", x.run);
    if (kp_pg_query(x.pg, sql, 0, NULL, &res, err, sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", err);
        goto out;
    }
    if (PQntuples(res) == 0) {
        fprintf(stderr,
                "kprofctl export: run %ld does not exist; `SELECT id, job FROM runs` (psql) "
                "lists them\n",
                x.run);
        rc = EXIT_NOTFOUND;
        goto out;
    }
    snprintf(x.job, sizeof(x.job), "%s", S(res, 0, 0));
    x.world_size = (long) I(res, 0, 1);
    PQclear(res);
    res = NULL;
    snprintf(sql, sizeof(sql), "SELECT rank FROM ranks WHERE run_id = %ld ORDER BY rank", x.run);
    if (kp_pg_query(x.pg, sql, 0, NULL, &res, err, sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", err);
        goto out;
    }
    if (PQntuples(res) == 0) {
        fprintf(stderr, "kprofctl export: run %ld has no ranks: no data reached it\n", x.run);
        rc = EXIT_NOTFOUND;
        goto out;
    }
    if ((ranks = calloc((size_t) PQntuples(res), sizeof(*ranks))) == NULL ||
        (res_r = calloc((size_t) PQntuples(res), sizeof(*res_r))) == NULL) {
        fprintf(stderr, "kprofctl export: out of memory\n");
        goto out;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        long r = (long) I(res, i, 0);

        if (cfg.rank < 0 || r == cfg.rank) {
            ranks[n_ranks++] = r;
        }
    }
    if (n_ranks == 0) {
        struct kp_strbuf l;

        kp_strbuf_init(&l, 4096);
        for (int i = 0; i < PQntuples(res) && i < 32; i++) {
            (void) kp_strbuf_appendf(&l, "%s%s", i ? ", " : "", S(res, i, 0));
        }
        fprintf(stderr, "kprofctl export: run %ld has no rank %lld (its ranks: %s%s)\n", x.run,
                cfg.rank, l.data != NULL ? l.data : "", PQntuples(res) > 32 ? ", ..." : "");
        kp_strbuf_fini(&l);
        rc = EXIT_NOTFOUND;
        goto out;
    }
    if (n_ranks > 1 && !dir_mode) {
        fprintf(stderr,
                "kprofctl export: run %ld has %zu ranks and a trace file holds one: pass --rank N, "
                "or -o DIR for one file per rank\n",
                x.run, n_ranks);
        rc = EXIT_USAGE;
        goto out;
    }
    PQclear(res);
    res = NULL;
    if (x.has_memory) {
        snprintf(mem_min, sizeof(mem_min),
                 ", (SELECT min(start_ns) FROM memory_events WHERE run_id = %ld)", x.run);
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
             x.run, mem_min);
    if (kp_pg_query(x.pg, sql, 0, NULL, &res, err, sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", err);
        goto out;
    }
    x.base_ns = I(res, 0, 0);
    if (x.base_ns < 0) {
        x.base_ns = 0; /* baseTimeNanoseconds must not be negative */
    }
    PQclear(res);
    res = NULL;

    for (size_t i = 0; i < n_ranks; i++) {
        struct rank_result *rr = &res_r[i];
        char *tmp = NULL;
        bool gz;
        int wrc, crc;

        x.rank = ranks[i];
        rr->rank = x.rank;
        if (dir_mode) {
            size_t n = strlen(cfg.output) + 96;
            size_t ol = strlen(cfg.output);

            if ((rr->path = malloc(n)) == NULL) {
                fprintf(stderr, "kprofctl export: out of memory\n");
                goto out;
            }
            snprintf(rr->path, n, "%s%skprof-run%ld.rank-%ld.pt.trace.json%s", cfg.output,
                     cfg.output[ol - 1] == '/' ? "" : "/", x.run, x.rank, cfg.gzip ? ".gz" : "");
            gz = cfg.gzip;
        }
        else {
            if ((rr->path = strdup(cfg.output)) == NULL) {
                fprintf(stderr, "kprofctl export: out of memory\n");
                goto out;
            }
            gz = cfg.gzip || has_suffix(cfg.output, ".gz");
        }
        if (load_rank(&x) != 0) {
            fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", x.err);
            goto out;
        }
        if ((wrc = out_open(&x, rr->path, gz, &tmp)) != 0) {
            fprintf(stderr,
                    "kprofctl export: cannot write %s: %s (check the directory exists and is "
                    "writable)\n",
                    rr->path, strerror(-wrc));
            goto out;
        }
        wrc = write_rank(&x);
        crc = out_close(&x, rr->path, tmp, wrc == 0);
        if (wrc != 0) {
            if (wrc == KP_EPG) {
                fprintf(stderr, "kprofctl export: PostgreSQL: %s\n", x.err);
            }
            else {
                fprintf(stderr, "kprofctl export: %s: %s\n", rr->path, x.err);
            }
            goto out;
        }
        if (crc != 0) {
            fprintf(stderr, "kprofctl export: writing %s: %s\n", rr->path, strerror(-crc));
            goto out;
        }
        rr->bytes = x.out.bytes;
        rr->events = x.events;
        rr->flows = x.flows;
        memcpy(rr->rows, x.rows, sizeof(rr->rows));
        n_done++;
    }
    in_tx = false;
    (void) kp_pg_exec(x.pg, "COMMIT", err, sizeof(err));
    {
        double secs = now_s() - t0;
        uint64_t bytes = 0, events = 0;

        for (size_t i = 0; i < n_done; i++) {
            bytes += res_r[i].bytes;
            events += res_r[i].events;
        }
        FILE *sout = strcmp(cfg.output, "-") == 0 ? stderr : stdout;

        if (cfg.json) {
            fprintf(sout,
                    "{\"run_id\":%ld,\"seconds\":%.6f,\"json_bytes\":%" PRIu64
                    ",\"events\":%" PRIu64 ",\"files\":[",
                    x.run, secs, bytes, events);
            for (size_t i = 0; i < n_done; i++) {
                const struct rank_result *rr = &res_r[i];

                fprintf(sout, "%s{\"rank\":%ld,\"path\":", i ? "," : "", rr->rank);
                fputc('"', sout);
                for (const char *p = rr->path; *p; p++) {
                    if (*p == '"' || *p == '\\') {
                        fputc('\\', sout);
                    }
                    fputc(*p, sout);
                }
                fprintf(sout,
                        "\",\"json_bytes\":%" PRIu64 ",\"events\":%" PRIu64 ",\"flows\":%" PRIu64
                        ",\"rows\":{",
                        rr->bytes, rr->events, rr->flows);
                for (int k = 0; k < KP_EV_COUNT; k++) {
                    fprintf(sout, "%s\"%s\":%" PRIu64, k ? "," : "", kp_event_kinds[k].table,
                            rr->rows[k]);
                }
                fprintf(sout, "}}");
            }
            fprintf(sout, "]}\n");
        }
        else {
            fprintf(sout,
                    "run %ld: exported %zu rank%s (%" PRIu64 " events, %.1f MB of JSON) to %s in "
                    "%.2f s (%.1f MB/s)\n",
                    x.run, n_done, n_done == 1 ? "" : "s", events, (double) bytes / 1e6,
                    dir_mode ? cfg.output : res_r[0].path, secs,
                    secs > 0 ? (double) bytes / 1e6 / secs : 0.0);
        }
    }
    rc = EXIT_OK;
out:
    PQclear(res);
    if (x.pg != NULL) {
        if (in_tx) {
            kp_pg_rollback(x.pg);
        }
        PQfinish(x.pg);
    }
    if (res_r != NULL) {
        for (size_t i = 0; i < n_ranks; i++) {
            free(res_r[i].path);
        }
    }
    free(res_r);
    free(ranks);
    free(x.tracks);
    free(x.nc_id);
    free(x.nc_off);
    kp_strbuf_fini(&x.nc_text);
    kp_strbuf_fini(&x.nc_query);
    free(x.out.buf);
    kp_strbuf_fini(&x.tmp);
    kp_config_fini(export_defs, N_DEFS, &cfg);
    free(av);
    return rc;
}
