/* kp_hta_create and kp_hta_destroy: a rank's calls and GPU rows read, rounded and linked as HTA
 * holds them (hta.c's DESIGN), then every analysis computed (kp__hta_compute). */
#define _GNU_SOURCE /* qsort_r */
#include "hta_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

#define OPK_PROFILER_STEP 6 /* OpKind (proto/kprof.proto) */

/* CUPTI's names as Kineto prints them (import/kp_kineto.c reads them back). */
static const char *const memcpy_kinds[] = { "Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                            "AtoD",    "DtoA", "DtoD", "HtoH", "PtoP" };
static const char *const memory_kinds[] = {
    "Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static"
};
#define NAME_OF(tbl, i) \
    ((i) >= 0 && (size_t) (i) < sizeof(tbl) / sizeof(tbl[0]) ? tbl[(i)] : tbl[0])

/* ---- loading ------------------------------------------------------------------------ */

/* A time as the trace wrote it, µs relative to its time base, read as json.loads reads it:
 * the double nearest the decimal (whole ns are 3 decimals, so the text is exact). */
static double trace_us(int64_t rel_ns)
{
    char buf[40];
    uint64_t a = rel_ns < 0 ? -(uint64_t) rel_ns : (uint64_t) rel_ns;

    snprintf(buf, sizeof(buf), "%s%" PRIu64 ".%03" PRIu64, rel_ns < 0 ? "-" : "", a / 1000,
             a % 1000);
    return strtod(buf, NULL);
}

/* HTA's rounding of fractional-µs traces, on the trace's own time base (base_ns: its
 * baseTimeNanoseconds, 0 for absolute µs): in float64 as pandas holds the parsed JSON,
 * end = ts + dur, then ts rounded up and end down to whole µs. Rounding the absolute epoch
 * µs instead (~1.7e15, where a double resolves 0.25 µs) moves most boundaries. Returns ns
 * since the epoch. */
static void hta_round(bool exact, int64_t base_ns, int64_t ts_ns, int64_t dur_ns, int64_t *ts,
                      int64_t *end)
{
    double t, e;

    if (exact) {
        *ts = ts_ns;
        *end = ts_ns + dur_ns;
        return;
    }
    t = trace_us(ts_ns - base_ns);
    e = t + trace_us(dur_ns);
    *ts = base_ns + (int64_t) ceil(t) * 1000;
    *end = base_ns + (int64_t) floor(e) * 1000;
}

static const char *name_of(const struct kp_an_dict *d, const PGresult *r, int row, int col)
{
    int32_t i = PQgetisnull(r, row, col) ? -1 : kp_an_dict_find(d, kp_pg_i64(r, row, col, 0));

    return i >= 0 ? d->v[i].s : "";
}

/* Interns a name made here (memcpy/memset); NULL on ENOMEM. */
const char *kp__hta_intern(struct kp_hta *h, const char *s)
{
    char **v;

    for (size_t i = 0; i < h->n_extra; i++) {
        if (strcmp(h->extra[i], s) == 0) {
            return h->extra[i];
        }
    }
    v = realloc(h->extra, (h->n_extra + 1) * sizeof(*v));
    if (!v) {
        return NULL;
    }
    h->extra = v;
    v[h->n_extra] = strdup(s);
    if (!v[h->n_extra]) {
        return NULL;
    }
    return v[h->n_extra++];
}

struct corr_idx {
    int64_t corr;
    int32_t idx;
};

static int cmp_corr(const void *pa, const void *pb)
{
    const struct corr_idx *a = pa, *b = pb;

    if (a->corr != b->corr) {
        return a->corr < b->corr ? -1 : 1;
    }
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static int cmp_ev(const void *pa, const void *pb)
{
    const struct hta_ev *a = pa, *b = pb;

    if (a->ts != b->ts) {
        return a->ts < b->ts ? -1 : 1;
    }
    return a->order < b->order ? -1 : a->order > b->order;
}

#define WHERE_RR " WHERE run_id = $1 AND rank = $2"

/* What kp_hta_create's phases share while a rank loads. */
struct hta_load {
    PGconn *c;
    const char *const *params; /* run, rank as text */
    int64_t run;
    int rank;
    bool drop;           /* §0: rows from the last ProfilerStep on are left out */
    int64_t cutoff;      /* that step's start, rounded */
    struct corr_idx *ci; /* kept calls by (correlation, index) */
    char *errbuf;
    size_t errlen;
};

/* The names that column col of r refers to, into d, from the process's names cache: the server
 * looking them up joined every kernel and call of the rank again (0.37 s of 1.3 at 1 M
 * events). 0, KP_EPG or -ENOMEM. */
static int names_of_column(struct hta_load *ld, const PGresult *r, int col, struct kp_an_dict *d)
{
    size_t n = (size_t) PQntuples(r);
    int32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    int rc;

    if (!ids) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        ids[i] = PQgetisnull(r, (int) i, col) ? -1 : (int32_t) kp_pg_i64(r, (int) i, col, -1);
    }
    rc = kp_an_names_for(ld->c, ids, n, d, ld->errbuf, ld->errlen);
    free(ids);
    return rc;
}

static int load_nomem(struct hta_load *ld)
{
    kp_errbuf_set(ld->errbuf, ld->errlen, "out of memory loading run %" PRId64 " rank %d", ld->run,
                  ld->rank);
    return -ENOMEM;
}

/* §0 last-step drop: only with two or more ProfilerStep names in the whole run; and the
 * time base HTA's rounding works on (the imported trace's, NULL: absolute). */
static int hta_query_cutoff(struct kp_hta *h, struct hta_load *ld)
{
    PGresult *r = NULL;
    int rc;

    rc = kp_pg_query(ld->c,
                     "SELECT (SELECT count(DISTINCT name) FROM ops WHERE run_id = $1 AND kind = 6),"
                     " (SELECT start_ns FROM ops" WHERE_RR
                     " AND kind = 6 ORDER BY start_ns DESC LIMIT 1),"
                     " (SELECT time_base_ns FROM ranks" WHERE_RR ")",
                     2, ld->params, &r, ld->errbuf, ld->errlen);
    if (rc < 0) {
        return rc;
    }
    h->base_ns = kp_pg_i64(r, 0, 2, 0);
    if (!h->opts.include_last_step && kp_pg_i64(r, 0, 0, 0) >= 2 && !PQgetisnull(r, 0, 1)) {
        int64_t e;

        ld->drop = true;
        h->dropped = true;
        hta_round(h->opts.exact_ns, h->base_ns, kp_pg_i64(r, 0, 1, 0), 0, &ld->cutoff, &e);
    }
    PQclear(r);
    return 0;
}

/* CPU side: the runtime and driver calls (the only CPU rows with a correlation), kept ones
 * indexed by correlation in ld->ci. */
static int hta_read_calls(struct kp_hta *h, struct hta_load *ld)
{
    PGresult *r = NULL;
    size_t n;
    int rc;

    rc = kp_pg_query(ld->c,
                     "SELECT start_ns, dur_ns, correlation, name FROM api_calls" WHERE_RR
                     " AND domain IN (1, 2) AND correlation IS NOT NULL ORDER BY ctid",
                     2, ld->params, &r, ld->errbuf, ld->errlen);
    if (rc == 0 && (rc = names_of_column(ld, r, 3, &h->names)) != 0) {
        PQclear(r);
        return rc == -ENOMEM ? load_nomem(ld) : rc;
    }
    if (rc < 0) {
        return rc;
    }
    n = (size_t) PQntuples(r);
    h->rts = calloc(n ? n : 1, sizeof(*h->rts));
    if (!h->rts) {
        PQclear(r);
        return load_nomem(ld);
    }
    h->t_first = INT64_MAX;
    h->t_last = INT64_MIN;
    for (size_t i = 0; i < n; i++) {
        struct hta_rt *t = &h->rts[h->n_rts];

        hta_round(h->opts.exact_ns, h->base_ns, kp_pg_i64(r, (int) i, 0, 0),
                  kp_pg_i64(r, (int) i, 1, 0), &t->ts, &t->end);
        if (ld->drop && t->ts >= ld->cutoff) {
            continue;
        }
        t->corr = kp_pg_i64(r, (int) i, 2, 0);
        t->name = name_of(&h->names, r, (int) i, 3);
        h->n_rts++;
    }
    PQclear(r);
    ld->ci = calloc(h->n_rts ? h->n_rts : 1, sizeof(*ld->ci));
    if (!ld->ci) {
        return load_nomem(ld);
    }
    for (size_t i = 0; i < h->n_rts; i++) {
        ld->ci[i].corr = h->rts[i].corr;
        ld->ci[i].idx = (int32_t) i;
        if (h->rts[i].ts < h->t_first) {
            h->t_first = h->rts[i].ts;
        }
        if (h->rts[i].ts > h->t_last) {
            h->t_last = h->rts[i].ts;
        }
    }
    qsort(ld->ci, h->n_rts, sizeof(*ld->ci), cmp_corr);
    return 0;
}

/* The first kept call with this correlation: bsearch on the pair, then step back; NULL if
 * none. */
static const struct corr_idx *find_launch(const struct kp_hta *h, const struct hta_load *ld,
                                          int64_t corr)
{
    struct corr_idx key = { .corr = corr, .idx = -1 };
    size_t lo = 0, hi = h->n_rts;

    if (!h->n_rts) {
        return NULL;
    }
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;

        if (cmp_corr(&ld->ci[mid], &key) < 0) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < h->n_rts && ld->ci[lo].corr == corr ? &ld->ci[lo] : NULL;
}

/* The name and bandwidth of a memcpy (kind 1) or memset (kind 2) row; -ENOMEM. */
static int fill_mem_ev(struct kp_hta *h, const PGresult *r, int row, int64_t kind, struct hta_ev *e)
{
    char buf[96];

    if (kind == 1) {
        snprintf(buf, sizeof(buf), "Memcpy %s (%s -> %s)",
                 NAME_OF(memcpy_kinds, kp_pg_i64(r, row, 6, 0)),
                 NAME_OF(memory_kinds, kp_pg_i64(r, row, 7, 0)),
                 NAME_OF(memory_kinds, kp_pg_i64(r, row, 8, 0)));
    }
    else {
        snprintf(buf, sizeof(buf), "Memset (%s)", NAME_OF(memory_kinds, kp_pg_i64(r, row, 6, 0)));
    }
    e->name = kp__hta_intern(h, buf);
    if (!e->name) {
        return -ENOMEM;
    }
    /* §11: the trace's bandwidth; a capture has none: bytes / exact ns (= GB/s) */
    if (PQgetisnull(r, row, 9)) {
        int64_t dur = kp_pg_i64(r, row, 2, 0);

        e->bw_computed = true;
        e->bw = dur > 0 ? (double) kp_pg_i64(r, row, 10, 0) / (double) dur : 0.0;
    }
    else {
        e->bw = strtod(PQgetvalue(r, row, 9), NULL);
    }
    return 0;
}

/* One GPU row into h->evs[h->n_evs]; 1 kept, 0 left out, -ENOMEM. */
static int fill_ev(struct kp_hta *h, const struct hta_load *ld, const PGresult *r, int row)
{
    struct hta_ev *e = &h->evs[h->n_evs];
    const struct corr_idx *hit;
    int64_t kind = kp_pg_i64(r, row, 0, 0);

    if (PQgetisnull(r, row, 4)) {
        return 0; /* no stream: not a GPU event here */
    }
    e->corr = PQgetisnull(r, row, 3) ? -1 : kp_pg_i64(r, row, 3, 0);
    hit = find_launch(h, ld, e->corr);
    if (ld->drop && !hit) {
        return 0; /* HTA keeps GPU rows whose launch it kept */
    }
    e->rt = hit ? hit->idx : -1;
    hta_round(h->opts.exact_ns, h->base_ns, kp_pg_i64(r, row, 1, 0), kp_pg_i64(r, row, 2, 0),
              &e->ts, &e->end);
    e->stream = kp_pg_i64(r, row, 4, 0);
    if (kind == 0) {
        e->name = name_of(&h->knames, r, row, 5);
    }
    else if (fill_mem_ev(h, r, row, kind, e) < 0) {
        return -ENOMEM;
    }
    e->type = (uint8_t) kp_hta_kernel_type(e->name);
    e->order = (size_t) row;
    if (e->ts < h->t_first) {
        h->t_first = e->ts;
    }
    if (e->ts > h->t_last) {
        h->t_last = e->ts;
    }
    return 1;
}

/* GPU side: kernels, memcpys and memsets, each linked to its launch, sorted by start. */
static int hta_read_gpu(struct kp_hta *h, struct hta_load *ld)
{
    PGresult *r = NULL;
    size_t n;
    int rc;

    rc = kp_pg_query(
        ld->c,
        "SELECT 0, start_ns, dur_ns, correlation, stream, name, 0, 0, 0, NULL::float8, 0 "
        "FROM kernels" WHERE_RR " UNION ALL SELECT 1, start_ns, dur_ns, correlation, stream, "
        "NULL, copy_kind, src_kind, dst_kind, bw.bandwidth_gbps, bytes "
        "FROM memcpys" KP_SQL_BANDWIDTH_JOIN("memcpys", "memcpy_bandwidth", "$1", "$2") WHERE_RR
        " UNION ALL SELECT 2, start_ns, dur_ns, correlation, stream, NULL, mem_kind, 0, 0, "
        "bw.bandwidth_gbps, bytes FROM memsets" KP_SQL_BANDWIDTH_JOIN(
            "memsets", "memset_bandwidth", "$1", "$2") WHERE_RR " ORDER BY 2, 1",
        2, ld->params, &r, ld->errbuf, ld->errlen);
    if (rc == 0 && (rc = names_of_column(ld, r, 5, &h->knames)) != 0) {
        PQclear(r);
        return rc == -ENOMEM ? load_nomem(ld) : rc;
    }
    if (rc < 0) {
        return rc;
    }
    n = (size_t) PQntuples(r);
    h->evs = calloc(n ? n : 1, sizeof(*h->evs));
    if (!h->evs) {
        PQclear(r);
        return load_nomem(ld);
    }
    for (size_t i = 0; i < n; i++) {
        rc = fill_ev(h, ld, r, (int) i);
        if (rc < 0) {
            PQclear(r);
            return load_nomem(ld);
        }
        h->n_evs += (size_t) rc;
    }
    PQclear(r);
    if (h->n_evs == 0) {
        kp_errbuf_set(ld->errbuf, ld->errlen, "run %" PRId64 " rank %d has no GPU events%s",
                      ld->run, ld->rank, ld->drop ? " before its last ProfilerStep" : "");
        return -ENODATA;
    }
    qsort(h->evs, h->n_evs, sizeof(*h->evs), cmp_ev);
    return 0;
}

int kp_hta_create(PGconn *c, int64_t run, int rank, const struct kp_hta_opts *opts,
                  struct kp_hta **out, char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    struct hta_load ld = { .c = c,
                           .params = params,
                           .run = run,
                           .rank = rank,
                           .errbuf = errbuf,
                           .errlen = errlen };
    struct kp_hta *h;
    int rc;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    rc = kp_an_check_rank(c, params, run, rank, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    h = calloc(1, sizeof(*h));
    if (!h) {
        return -ENOMEM;
    }
    h->opts = *opts;
    rc = hta_query_cutoff(h, &ld);
    if (rc < 0) {
        goto fail;
    }
    rc = hta_read_calls(h, &ld);
    if (rc < 0) {
        goto fail;
    }
    rc = hta_read_gpu(h, &ld);
    if (rc < 0) {
        goto fail;
    }
    rc = kp__hta_compute(h);
    if (rc < 0) {
        rc = load_nomem(&ld);
        goto fail;
    }
    free(ld.ci);
    *out = h;
    return 0;

fail:
    free(ld.ci);
    kp_hta_destroy(h);
    return rc;
}

void kp_hta_destroy(struct kp_hta *h)
{
    if (!h) {
        return;
    }
    kp_an_dict_fini(&h->names);
    kp_an_dict_fini(&h->knames);
    for (size_t i = 0; i < h->n_extra; i++) {
        free(h->extra[i]);
    }
    free(h->extra);
    free(h->rts);
    free(h->evs);
    free(h->idle);
    free(h->krows);
    free(h->launches);
    free(h->queue);
    free(h->membw);
    free(h);
}
