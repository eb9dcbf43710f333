/*
 * export_int.h: what export.c (the snapshot, the ranks, the file's head and metadata),
 * export_out.c (the buffered, optionally gzipped JSON writer) and export_rows.c (each table's
 * rows as events) share. Private to those files.
 */
#ifndef KP_EXPORT_INT_H
#define KP_EXPORT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <zlib.h>

#include "export.h"
#include "kp_strbuf.h"

#define EXPORT_OUT_BUF     KP_EXPORT_CHUNK
#define EXPORT_MAX_TRACKS  KP_EXPORT_MAX_TRACKS
#define EXPORT_MAX_DEVICES 256
#define EXPORT_SQL_MAX     4096
#define EXPORT_NC_CAP      (1u << 20) /* name cache slots (power of 2) */
#define EXPORT_NC_MAX      (EXPORT_NC_CAP / 2)
#define EXPORT_NC_TEXT_MAX (256u << 20)

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

/* export_out.c: the writer. Errors stick in o->err; every call after one does nothing. */
void kp__export_out_deflate(struct xout *o, bool finish);
void kp__export_out_flush(struct xout *o);
void kp__export_out_put_slow(struct xout *o, const char *p, size_t n);
/* s[0..n) as a JSON string, quoted */
void kp__export_out_jstrn(struct xout *o, const char *s, size_t n);
void kp__export_out_jstr(struct xout *o, const char *s);
/* A Python literal (as import stores Input Dims / Input type) as JSON; tmp is scratch. */
void kp__export_out_pylit(struct xout *o, struct kp_strbuf *tmp, const char *s);

static inline void kp__export_out_put(struct xout *o, const char *p, size_t n)
{
    if (o->len + n > EXPORT_OUT_BUF) {
        kp__export_out_put_slow(o, p, n);
        return;
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
}

#define XO_LIT(o, s) kp__export_out_put((o), (s), sizeof(s) - 1)

static inline void kp__export_out_putc(struct xout *o, char c)
{
    if (o->len + 1 > EXPORT_OUT_BUF) {
        kp__export_out_flush(o);
    }
    o->buf[o->len++] = c;
}

static inline void kp__export_out_u64(struct xout *o, uint64_t v)
{
    char tmp[24];
    int n = 0;

    do {
        tmp[sizeof(tmp) - 1 - n++] = (char) ('0' + v % 10);
        v /= 10;
    } while (v != 0);
    kp__export_out_put(o, tmp + sizeof(tmp) - n, (size_t) n);
}

static inline void kp__export_out_i64(struct xout *o, int64_t v)
{
    if (v < 0) {
        kp__export_out_putc(o, '-');
        kp__export_out_u64(o, v == INT64_MIN ? (uint64_t) INT64_MAX + 1 : (uint64_t) -v);
        return;
    }
    kp__export_out_u64(o, (uint64_t) v);
}

/* ns as µs with exactly 3 decimals ("1234.567"): exact, and import reads it back exactly. */
static inline void kp__export_out_us(struct xout *o, int64_t ns)
{
    uint64_t a;
    char frac[4];

    if (ns < 0) {
        kp__export_out_putc(o, '-');
        a = ns == INT64_MIN ? (uint64_t) INT64_MAX + 1 : (uint64_t) -ns;
    }
    else {
        a = (uint64_t) ns;
    }
    kp__export_out_u64(o, a / 1000);
    frac[0] = '.';
    frac[1] = (char) ('0' + a % 1000 / 100);
    frac[2] = (char) ('0' + a % 100 / 10);
    frac[3] = (char) ('0' + a % 10);
    kp__export_out_put(o, frac, 4);
}

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

static inline void kp__export_ev_begin(struct xp *x)
{
    if (x->events++ == 0) {
        XO_LIT(&x->out, "\n");
    }
    else {
        XO_LIT(&x->out, ",\n");
    }
}

/* An int arg: `, "key": v` (first: without the comma). */
static inline void kp__export_arg_i(struct xout *o, bool *first, const char *key, int64_t v)
{
    if (!*first) {
        XO_LIT(o, ", ");
    }
    *first = false;
    kp__export_out_putc(o, '"');
    kp__export_out_put(o, key, strlen(key));
    XO_LIT(o, "\": ");
    kp__export_out_i64(o, v);
}

static inline void kp__export_arg_s(struct xout *o, bool *first, const char *key, const char *v)
{
    if (!*first) {
        XO_LIT(o, ", ");
    }
    *first = false;
    kp__export_out_putc(o, '"');
    kp__export_out_put(o, key, strlen(key));
    XO_LIT(o, "\": ");
    kp__export_out_jstr(o, v);
}

static inline void kp__export_arg_key(struct xout *o, bool *first, const char *key)
{
    if (!*first) {
        XO_LIT(o, ", ");
    }
    *first = false;
    kp__export_out_putc(o, '"');
    kp__export_out_put(o, key, strlen(key));
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

typedef void kp__export_row_cb(struct xp *x, const PGresult *r, int row);

/* export.c */
void kp__export_track_seen(struct xp *x, int64_t pid, int64_t tid, bool gpu);
/* {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ..., "dur": ...,
 * "args": { — the caller writes the args and closes with "}}". */
void kp__export_ev_x(struct xp *x, const char *cat, const char *name, int64_t pid, int64_t tid,
                     int64_t start_ns, int64_t dur_ns, bool gpu);
/* The name in column c of a row (its names.id, one of the cursor's ncols): kp__export_nm gives NULL
 * when the column is NULL, kp__export_nm0 "". */
const char *kp__export_nm(const struct xp *x, const PGresult *r, int row, int c);
const char *kp__export_nm0(const struct xp *x, const PGresult *r, int row, int c);
/* Runs sql through a cursor, cb on every row, with the names.id columns ncols (-1
 * terminated) resolved first. Returns 0, or an error with x->err set. */
int kp__export_cursor_each(struct xp *x, const char *sql, const int *ncols, kp__export_row_cb *cb);

/* export_rows.c: the rank's events, table by table. Each returns 0, or an error with x->err
 * set. */
int kp__export_write_gpu_events(struct xp *x);
int kp__export_write_host_events(struct xp *x);
int kp__export_write_ranges_and_flows(struct xp *x);

#endif
