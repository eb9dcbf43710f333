/*
 * kp_compare: the cross-rank comparison (docs/specs/compare.md). kp_compare_result_create reads the
 * whole run in one pass over each event table (PostgreSQL sums per rank and step; the collectives
 * come back as rows), matches the collectives across ranks by order within the step, aligns the
 * clocks from their end times and applies the straggler rule. kp_compare_hta_create is HTA's
 * metric, apart.
 */
#include "compare_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_err.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

void kp_compare_opts_init(struct kp_compare_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->late_frac = KP_COMPARE_DEFAULT_LATE_FRAC;
    o->excess_frac = KP_COMPARE_DEFAULT_EXCESS_FRAC;
    o->step_frac = KP_COMPARE_DEFAULT_STEP_FRAC;
}

/* ---- helpers -------------------------------------------------------------------------- */

int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *) pa, b = *(const double *) pb;

    return (a > b) - (a < b);
}

int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return (a > b) - (a < b);
}

/* The median of v[0..n) (reordered); 0 when n == 0. */
double cmp_median(double *v, size_t n)
{
    if (n == 0) {
        return 0.0;
    }
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* The median of sorted v[0..n) less one value equal to x (which v holds); 0 when n < 2. */
static double median_but_one(const double *v, size_t n, double x)
{
    size_t lo = 0, hi = n, m = n - 1; /* m values remain */

    if (n < 2) {
        return 0.0;
    }
    while (lo < hi) { /* the first v[i] >= x: the one left out */
        size_t mid = lo + (hi - lo) / 2;

        if (v[mid] < x) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
#define AT(i) ((i) < lo ? v[(i)] : v[(i) + 1])
    return m % 2 ? AT(m / 2) : (AT(m / 2 - 1) + AT(m / 2)) / 2.0;
#undef AT
}

static int64_t median_i64(int64_t *v, size_t n)
{
    if (n == 0) {
        return 0;
    }
    qsort(v, n, sizeof(*v), cmp_i64);
    return n % 2 ? v[n / 2] : v[n / 2 - 1] + (v[n / 2] - v[n / 2 - 1]) / 2;
}

/* Index of x in sorted v[0..n), or -1. */
static long find_i64(const int64_t *v, size_t n, int64_t x)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (v[mid] < x) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < n && v[lo] == x ? (long) lo : -1;
}

bool cmp_parse_step(const char *s, int64_t *out)
{
    char *end;
    long long v;

    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') {
        return false;
    }
    *out = (int64_t) v;
    return true;
}

/* Checks that run exists; returns 0, KP_ENOTFOUND or KP_EPG. */
int cmp_check_run(PGconn *c, const char *const *params, int64_t run, char *errbuf, size_t errlen)
{
    PGresult *r = NULL;
    int rc =
        kp_pg_query(c, "SELECT count(*) FROM runs WHERE id = $1", 1, params, &r, errbuf, errlen);

    if (rc < 0) {
        return rc;
    }
    if (kp_pg_i64(r, 0, 0, 0) == 0) {
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " does not exist: `kprofctl runs` lists the runs", run);
        rc = KP_ENOTFOUND;
    }
    PQclear(r);
    return rc;
}

/* The run's ranks, sorted. Returns 0 and *ranks (free) / *n, KP_ENOTFOUND, KP_EPG, -ENOMEM. */
static int load_ranks(PGconn *c, const char *const *params, int64_t run, int64_t **ranks, size_t *n,
                      char *errbuf, size_t errlen)
{
    PGresult *r = NULL;
    int rc = kp_pg_query(c, "SELECT rank FROM ranks WHERE run_id = $1 ORDER BY rank", 1, params, &r,
                         errbuf, errlen);
    size_t nr;

    if (rc < 0) {
        return rc;
    }
    nr = (size_t) PQntuples(r);
    if (nr == 0 || nr > KP_COMPARE_MAX_RANKS) {
        kp_errbuf_set(errbuf, errlen,
                      nr == 0 ? "run %" PRId64 " has no ranks: nothing was captured or imported"
                              : "run %" PRId64 " has too many ranks",
                      run);
        PQclear(r);
        return nr == 0 ? KP_ENOTFOUND : KP_ETOOBIG;
    }
    if ((*ranks = calloc(nr, sizeof(**ranks))) == NULL) {
        PQclear(r);
        return -ENOMEM;
    }
    for (size_t i = 0; i < nr; i++) {
        (*ranks)[i] = kp_pg_i64(r, (int) i, 0, 0);
    }
    *n = nr;
    PQclear(r);
    return 0;
}

/* The world around res's ranks: each rank's host, node and local rank, runs.world_size and the
 * ranks of the world missing from the run. Returns 0, KP_EPG or -ENOMEM. */
static int load_world(PGconn *c, const char *const *params, struct kp_compare_result *res,
                      char *errbuf, size_t errlen)
{
    PGresult *r = NULL;
    int rc = kp_pg_query(
        c,
        "SELECT k.rank, k.host, k.local_rank, (SELECT world_size FROM runs WHERE id = $1), "
        "dense_rank() OVER (ORDER BY k.host IS NULL, k.first) - 1 FROM (SELECT rank, host, "
        "local_rank, min(rank) OVER (PARTITION BY host) AS first FROM ranks WHERE run_id = $1) k "
        "ORDER BY k.rank",
        1, params, &r, errbuf, errlen);
    size_t at = 0;

    if (rc < 0) {
        return rc;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        int rank = (int) kp_pg_i64(r, i, 0, -1);

        res->world_size = (int) kp_pg_i64(r, i, 3, 0);
        for (; at < res->n_ranks && res->ranks[at].rank < rank; at++) {
        }
        if (at == res->n_ranks || res->ranks[at].rank != rank) {
            continue;
        }
        if (!PQgetisnull(r, i, 1)) {
            snprintf(res->ranks[at].host, sizeof(res->ranks[at].host), "%s", PQgetvalue(r, i, 1));
            res->ranks[at].node = (int) kp_pg_i64(r, i, 4, -1);
        }
        res->ranks[at].local_rank = (int) kp_pg_i64(r, i, 2, -1);
    }
    PQclear(r);
    if (res->world_size > 0 &&
        (res->missing = calloc((size_t) res->world_size, sizeof(*res->missing))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    at = 0;
    for (int w = 0; w < res->world_size; w++) {
        for (; at < res->n_ranks && res->ranks[at].rank < w; at++) {
        }
        if (at == res->n_ranks || res->ranks[at].rank != w) {
            res->missing[res->n_missing++] = w;
        }
    }
    return 0;
}

/* ---- kp_compare_result_create: loading
 * --------------------------------------------------------------- */

/*
 * The whole run is read in a few queries, each one pass over one event table of the run's
 * partition, with PostgreSQL summing per (rank, step) where a sum is all compare needs; only
 * the collectives and the step, data-loading and Gloo ops come back as rows. So the cost is
 * about one scan of each table, whatever the number of ranks, and the memory is that of the
 * sums and the collectives (a few rows per rank and step), not of the run.
 */

/* Classes of names compare reads, from one pass over names. */
enum {
    NC_NCCL,
    NC_GLOO,
    NC_STEP,
    NC_DATA,
    NC_SYNC,
    NC_COUNT
};

static const char names_sql[] =
    "SELECT id, c, CASE WHEN c = 2 THEN substr(name, 14) WHEN c < 2 AND (name ILIKE '%send%' OR "
    "name ILIKE '%recv%') THEN 'p2p' END FROM (SELECT id, name, CASE "
    "WHEN name LIKE 'nccl%Kernel%' THEN 0 WHEN name LIKE 'gloo:%' THEN 1 "
    "WHEN name LIKE 'ProfilerStep#%' THEN 2 "
    "WHEN name LIKE 'enumerate(DataPipe)#%' OR (name LIKE 'enumerate(DataLoader)#%' AND "
    "right(name, 9) = '.__next__') THEN 3 "
    "WHEN name LIKE 'cuda%Synchronize%' OR name LIKE 'cuda%WaitEvent%' OR name LIKE "
    "'cuda%Query%' THEN 4 END AS c FROM names) x WHERE c IS NOT NULL ORDER BY id";

struct ncls {
    int64_t id;
    int cls;
    int64_t num; /* NC_STEP: the N of ProfilerStep#N; -1 when not a number */
    bool p2p;    /* NC_NCCL, NC_GLOO: a point-to-point transfer (docs/specs/compare.md §3) */
};

struct nameset {
    struct ncls *v; /* by id */
    size_t n;
    struct kp_strbuf arr[NC_COUNT + 1]; /* "{id,...}" per class; [NC_COUNT]: the ops classes */
};

static void nameset_fini(struct nameset *ns)
{
    free(ns->v);
    for (int k = 0; k <= NC_COUNT; k++) {
        kp_strbuf_fini(&ns->arr[k]);
    }
    memset(ns, 0, sizeof(*ns));
}

static const struct ncls *nameset_find(const struct nameset *ns, int64_t id)
{
    size_t lo = 0, hi = ns->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (ns->v[mid].id < id) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < ns->n && ns->v[lo].id == id ? &ns->v[lo] : NULL;
}

static int nameset_load(PGconn *c, struct nameset *ns, size_t *budget, size_t max_rows,
                        char *errbuf, size_t errlen)
{
    PGresult *r = NULL;
    int rc = kp_an_query(c, 0, names_sql, NULL, budget, max_rows, &r, errbuf, errlen);
    size_t n;

    if (rc != 0) {
        return rc;
    }
    n = (size_t) PQntuples(r);
    if ((ns->v = calloc(n + 1, sizeof(*ns->v))) == NULL) {
        goto nomem;
    }
    for (int k = 0; k <= NC_COUNT; k++) {
        kp_strbuf_init(&ns->arr[k], 0);
        if (kp_pg_array_open(&ns->arr[k]) != 0) {
            goto nomem;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct ncls *x = &ns->v[ns->n++];
        int k;

        x->id = kp_pg_i64(r, (int) i, 0, 0);
        x->cls = k = (int) kp_pg_i64(r, (int) i, 1, 0);
        if (k < 0 || k >= NC_COUNT) {
            ns->n--;
            continue;
        }
        if (k == NC_STEP && !cmp_parse_step(PQgetvalue(r, (int) i, 2), &x->num)) {
            x->num = -1;
        }
        x->p2p = k != NC_STEP && strcmp(PQgetvalue(r, (int) i, 2), "p2p") == 0;
        if (kp_pg_array_i64(&ns->arr[k], x->id) != 0 ||
            ((k == NC_GLOO || k == NC_STEP || k == NC_DATA) &&
             kp_pg_array_i64(&ns->arr[NC_COUNT], x->id) != 0)) {
            goto nomem;
        }
    }
    for (int k = 0; k <= NC_COUNT; k++) {
        if (kp_pg_array_close(&ns->arr[k]) != 0) {
            goto nomem;
        }
    }
    PQclear(r);
    return 0;
nomem:
    PQclear(r);
    kp_errbuf_set(errbuf, errlen, "out of memory");
    return -ENOMEM;
}

/* One step of one rank: a ProfilerStep#N op, else a row of the steps table (captures), else
 * step 0 over the rank's kernels. */
struct rstep {
    int64_t num, start, end;
};

struct rsteps {
    size_t n, cap;
    struct rstep *v; /* by start */
    bool from_ops;   /* has ProfilerStep ops (the steps table is then not read for it) */
    bool kany;       /* kmin, kmax: the span of its kernels */
    int64_t kmin, kmax;
};

static int rsteps_add(struct rsteps *rs, int64_t num, int64_t start, int64_t end)
{
    if (rs->n == rs->cap) {
        size_t nc = rs->cap * 2 + 16;
        struct rstep *nv = realloc(rs->v, nc * sizeof(*nv));

        if (nv == NULL) {
            return -ENOMEM;
        }
        rs->v = nv;
        rs->cap = nc;
    }
    rs->v[rs->n++] = (struct rstep){ num, start, end };
    return 0;
}

static int cmp_rstep(const void *pa, const void *pb)
{
    const struct rstep *a = pa, *b = pb;

    return (a->start > b->start) - (a->start < b->start);
}

/* The step number of a row without one: the rank's step holding start, or -1. */
static int64_t step_at(const struct rsteps *rs, int64_t start)
{
    size_t lo = 0, hi = rs->n;

    while (lo < hi) { /* the first step starting after start */
        size_t mid = lo + (hi - lo) / 2;

        if (rs->v[mid].start <= start) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    for (size_t i = lo; i-- > 0;) { /* steps may nest or overlap: the latest holding it */
        if (start >= rs->v[i].start && start < rs->v[i].end) {
            return rs->v[i].num;
        }
        if (lo - i > 4) {
            break;
        }
    }
    return -1;
}

/* One collective of one rank: an NCCL kernel (kind 0) or a Gloo op (kind 1). */
struct coll {
    uint32_t ri;   /* rank index */
    uint32_t si;   /* step index: among every step of the run, then (compacted) compared */
    uint32_t kind; /* 0 NCCL, 1 Gloo */
    uint32_t idx;  /* order within (rank, step, kind) */
    int64_t start, end;
    uint32_t cs; /* compared step index; NOT_COMPARED when its step is not compared */
    bool p2p;    /* a point-to-point transfer */
};

#define NOT_COMPARED UINT32_MAX

/* -1, 0 or 1 as a is below, equal to or above b. */
static int cmp3(int64_t a, int64_t b)
{
    return (a > b) - (a < b);
}

/* By rank, step, kind, start. */
static int cmp_coll_rank(const void *pa, const void *pb)
{
    const struct coll *a = pa, *b = pb;
    int d;

    if ((d = cmp3(a->ri, b->ri)) != 0 || (d = cmp3(a->si, b->si)) != 0 ||
        (d = cmp3(a->kind, b->kind)) != 0) {
        return d;
    }
    return cmp3(a->start, b->start);
}

/* By step, kind, order, rank: the same collective of every rank together. */
static int cmp_coll_match(const void *pa, const void *pb)
{
    const struct coll *a = pa, *b = pb;
    int d;

    if ((d = cmp3(a->si, b->si)) != 0 || (d = cmp3(a->kind, b->kind)) != 0 ||
        (d = cmp3(a->idx, b->idx)) != 0) {
        return d;
    }
    return cmp3(a->ri, b->ri);
}

/* What kp_compare_result_create reads, between the queries and the result. */
struct cmp_load {
    int64_t *ranks; /* sorted */
    size_t n_ranks;
    struct rsteps *rs;
    struct nameset names;
    PGresult *ops, *steps, *kern, *coll, *api, *mem;
    size_t budget;
};

static void cmp_load_fini(struct cmp_load *L)
{
    if (L->rs != NULL) {
        for (size_t i = 0; i < L->n_ranks; i++) {
            free(L->rs[i].v);
        }
    }
    free(L->rs);
    free(L->ranks);
    nameset_fini(&L->names);
    PQclear(L->ops);
    PQclear(L->steps);
    PQclear(L->kern);
    PQclear(L->coll);
    PQclear(L->api);
    PQclear(L->mem);
}

/* The event queries, one pass over each table (two over kernels: the sums of every kernel per
 * (rank, step), with their span, then the collective kernels one by one, whose durations are
 * taken off the sums: each pass is a plain parallel scan). */
static const char ops_sql[] = "SELECT rank, step, name, start_ns, dur_ns FROM ops WHERE run_id = "
                              "$1 AND name = ANY($2::int[])";
static const char steps_sql[] = "SELECT rank, step, start_ns, dur_ns FROM steps WHERE run_id = $1";
static const char kern_sql[] =
    "SELECT rank, step, sum(dur_ns) FROM kernels WHERE run_id = $1 GROUP BY rank, step";
/* only when a rank has no steps at all */
static const char span_sql[] = "SELECT rank, min(start_ns), max(start_ns + dur_ns) FROM kernels "
                               "WHERE run_id = $1 GROUP BY rank";
static const char coll_sql[] =
    "SELECT rank, step, start_ns, dur_ns, name FROM kernels WHERE run_id "
    "= $1 AND name = ANY($2::int[])";
/* (a FILTER rather than a WHERE: PostgreSQL then estimates the groups right, and sums them
 * in parallel) */
static const char api_sql[] =
    "SELECT rank, step, sum(dur_ns) FILTER (WHERE coalesce(domain, 1) = 1 AND NOT coalesce(name "
    "= ANY($2::int[]), false)) FROM api_calls WHERE run_id = $1 GROUP BY rank, step";
static const char mem_sql[] =
    "SELECT rank, step, sum(dur_ns) FROM (SELECT rank, step, dur_ns FROM memcpys WHERE run_id = "
    "$1 UNION ALL SELECT rank, step, dur_ns FROM memsets WHERE run_id = $1) m GROUP BY rank, step";

/* The same sums for rows without a step (imports): by the rank's step holding their start. */
#define RANGE_SQL(table, filter)                                                                \
    "WITH st AS (SELECT * FROM unnest($2::int[], $3::bigint[], $4::bigint[], $5::bigint[]) AS " \
    "st(rank, s, e, num)) SELECT t.rank, st.num, sum(t.dur_ns) FROM " table " t JOIN st ON "    \
    "t.rank = st.rank AND t.start_ns >= st.s AND t.start_ns < st.e WHERE t.run_id = $1 AND "    \
    "t.step IS NULL" filter " GROUP BY t.rank, st.num"
static const char *const range_sql[3] = {
    RANGE_SQL("kernels", " AND NOT coalesce(t.name = ANY($6::int[]), false)"),
    RANGE_SQL("api_calls",
              " AND coalesce(t.domain, 1) = 1 AND NOT coalesce(t.name = ANY($6::int[]), false)"),
    RANGE_SQL("(SELECT run_id, rank, step, start_ns, dur_ns FROM memcpys UNION ALL SELECT run_id, "
              "rank, step, start_ns, dur_ns FROM memsets)",
              ""),
};
#undef RANGE_SQL

/* Runs the first queries and builds every rank's steps. */
static int cmp_load_run(PGconn *c, const char *runs, int64_t run, size_t max_rows,
                        struct cmp_load *L, char *errbuf, size_t errlen)
{
    const char *p2[2] = { runs, NULL };
    int rc;

    if ((L->rs = calloc(L->n_ranks, sizeof(*L->rs))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    if ((rc = nameset_load(c, &L->names, &L->budget, max_rows, errbuf, errlen)) != 0) {
        return rc;
    }
    p2[1] = L->names.arr[NC_COUNT].data;
    if ((rc = kp_an_query(c, 2, ops_sql, p2, &L->budget, max_rows, &L->ops, errbuf, errlen)) != 0 ||
        (rc = kp_an_query(c, 1, steps_sql, p2, &L->budget, max_rows, &L->steps, errbuf, errlen)) !=
            0) {
        return rc;
    }
    p2[1] = L->names.arr[NC_NCCL].data;
    if ((rc = kp_an_query(c, 1, kern_sql, p2, &L->budget, max_rows, &L->kern, errbuf, errlen)) !=
            0 ||
        (rc = kp_an_query(c, 2, coll_sql, p2, &L->budget, max_rows, &L->coll, errbuf, errlen)) !=
            0) {
        return rc;
    }
    p2[1] = L->names.arr[NC_SYNC].data;
    if ((rc = kp_an_query(c, 2, api_sql, p2, &L->budget, max_rows, &L->api, errbuf, errlen)) != 0 ||
        (rc = kp_an_query(c, 1, mem_sql, p2, &L->budget, max_rows, &L->mem, errbuf, errlen)) != 0) {
        return rc;
    }
    /* steps: ProfilerStep ops, else the steps table, else step 0 over the kernels */
    for (int i = 0; i < PQntuples(L->ops); i++) {
        const struct ncls *nc = nameset_find(&L->names, kp_pg_i64(L->ops, i, 2, -1));
        long ri = find_i64(L->ranks, L->n_ranks, kp_pg_i64(L->ops, i, 0, -1));
        int64_t st = kp_pg_i64(L->ops, i, 3, 0);

        if (nc == NULL || nc->cls != NC_STEP || nc->num < 0 || ri < 0) {
            continue;
        }
        if (rsteps_add(&L->rs[ri], nc->num, st, st + kp_pg_i64(L->ops, i, 4, 0)) != 0) {
            goto nomem;
        }
        L->rs[ri].from_ops = true;
    }
    for (int i = 0; i < PQntuples(L->steps); i++) {
        long ri = find_i64(L->ranks, L->n_ranks, kp_pg_i64(L->steps, i, 0, -1));
        int64_t st = kp_pg_i64(L->steps, i, 2, 0);

        if (ri >= 0 && !L->rs[ri].from_ops &&
            rsteps_add(&L->rs[ri], kp_pg_i64(L->steps, i, 1, 0), st,
                       st + kp_pg_i64(L->steps, i, 3, 0)) != 0) {
            goto nomem;
        }
    }
    for (size_t ri = 0; ri < L->n_ranks; ri++) {
        PGresult *r = NULL;

        if (L->rs[ri].n > 0) {
            continue;
        }
        if ((rc = kp_an_query(c, 1, span_sql, p2, &L->budget, max_rows, &r, errbuf, errlen)) != 0) {
            return rc;
        }
        for (int i = 0; i < PQntuples(r); i++) {
            long q = find_i64(L->ranks, L->n_ranks, kp_pg_i64(r, i, 0, -1));

            if (q >= 0 && !PQgetisnull(r, i, 1)) {
                L->rs[q].kany = true;
                L->rs[q].kmin = kp_pg_i64(r, i, 1, 0);
                L->rs[q].kmax = kp_pg_i64(r, i, 2, 0);
            }
        }
        PQclear(r);
        break;
    }
    for (size_t ri = 0; ri < L->n_ranks; ri++) {
        struct rsteps *rs = &L->rs[ri];

        if (rs->n == 0 && rs->kany && rsteps_add(rs, 0, rs->kmin, rs->kmax + 1) != 0) {
            goto nomem;
        }
        qsort(rs->v, rs->n, sizeof(*rs->v), cmp_rstep);
    }
    return 0;
nomem:
    kp_errbuf_set(errbuf, errlen, "out of memory");
    return -ENOMEM;
}

/* Sums the rows without a step of the tables flagged in need (0 kernels, 1 API calls, 2
 * copies and memsets) by the ranks' steps, into the cells' compute, launch and other. */
static int load_unstepped(PGconn *c, const char *runs, struct cmp_load *L, const bool need[3],
                          const int64_t *nums, size_t ns, struct kp_compare_cell *cells,
                          size_t max_rows, char *errbuf, size_t errlen)
{
    struct kp_strbuf arr[4];
    const char *params[6] = { runs, NULL, NULL, NULL, NULL, NULL };
    int rc = 0;

    for (int f = 0; f < 4; f++) {
        kp_strbuf_init(&arr[f], 0);
        rc = rc != 0 ? rc : kp_pg_array_open(&arr[f]);
    }
    for (size_t i = 0; i < L->n_ranks && rc == 0; i++) {
        for (size_t j = 0; j < L->rs[i].n && rc == 0; j++) {
            const struct rstep *st = &L->rs[i].v[j];

            rc = kp_pg_array_i64(&arr[0], L->ranks[i]);
            rc = rc != 0 ? rc : kp_pg_array_i64(&arr[1], st->start);
            rc = rc != 0 ? rc : kp_pg_array_i64(&arr[2], st->end);
            rc = rc != 0 ? rc : kp_pg_array_i64(&arr[3], st->num);
        }
    }
    for (int f = 0; f < 4 && rc == 0; f++) {
        if ((rc = kp_pg_array_close(&arr[f])) == 0) {
            params[f + 1] = arr[f].data;
        }
    }
    if (rc != 0) {
        goto out;
    }
    for (int t = 0; t < 3 && rc == 0; t++) {
        PGresult *r = NULL;

        if (!need[t]) {
            continue;
        }
        params[5] = L->names.arr[t == 0 ? NC_NCCL : NC_SYNC].data;
        if ((rc = kp_an_query(c, t == 2 ? 5 : 6, range_sql[t], params, &L->budget, max_rows, &r,
                              errbuf, errlen)) != 0) {
            break;
        }
        for (int i = 0; i < PQntuples(r); i++) {
            long ri = find_i64(L->ranks, L->n_ranks, kp_pg_i64(r, i, 0, -1));
            long si = find_i64(nums, ns, kp_pg_i64(r, i, 1, 0));
            struct kp_compare_cell *cl;

            if (ri < 0 || si < 0 || !(cl = &cells[(size_t) ri * ns + (size_t) si])->present) {
                continue;
            }
            *(t == 0   ? &cl->compute_ns
              : t == 1 ? &cl->launch_ns
                       : &cl->other_ns) += kp_pg_i64(r, i, 2, 0);
        }
        PQclear(r);
    }
out:
    for (int f = 0; f < 4; f++) {
        kp_strbuf_fini(&arr[f]);
    }
    return rc;
}

/* Whether the group v[i..j) (one matched collective) is one every rank finishes together: no
 * point-to-point transfer, every rank that has the step in it (step_nr: per step of the run),
 * the reference rank (index 0) among them. */
static bool common_coll(const struct coll *v, size_t i, size_t j, const size_t *step_nr)
{
    if (v[i].ri != 0 || j - i != step_nr[v[i].si]) {
        return false;
    }
    for (size_t k = i; k < j; k++) {
        if (v[k].p2p) {
            return false;
        }
    }
    return true;
}

/* Offsets from end times over every step of the run: rank i's median of (end - the reference
 * rank's end) over the common collectives (common_coll) both have, the interquartile range of
 * those differences as its spread; colls sorted by cmp_coll_match. */
static int align_clocks(struct kp_compare_result *res, const struct coll *v, size_t n,
                        const size_t *step_nr)
{
    size_t nr = res->n_ranks, *cnt = calloc(nr + 1, sizeof(*cnt)), *at = NULL;
    int64_t *d = NULL;
    int rc = -ENOMEM;

    if (cnt == NULL || (at = calloc(nr + 1, sizeof(*at))) == NULL ||
        (d = calloc(n + 1, sizeof(*d))) == NULL) {
        goto out;
    }
    /* group by (step, kind, idx): v is sorted so that groups are runs */
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;

        while (j < n && v[j].si == v[i].si && v[j].kind == v[i].kind && v[j].idx == v[i].idx) {
            j++;
        }
        if (common_coll(v, i, j, step_nr)) {
            res->n_offset_colls++;
            for (size_t k = i; k < j; k++) {
                cnt[v[k].ri]++;
            }
        }
        i = j;
    }
    for (size_t r = 1; r <= nr; r++) {
        at[r] = at[r - 1] + cnt[r - 1];
    }
    memset(cnt, 0, (nr + 1) * sizeof(*cnt));
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;

        while (j < n && v[j].si == v[i].si && v[j].kind == v[i].kind && v[j].idx == v[i].idx) {
            j++;
        }
        if (common_coll(v, i, j, step_nr)) {
            for (size_t k = i; k < j; k++) {
                d[at[v[k].ri] + cnt[v[k].ri]++] = v[k].end - v[i].end;
            }
        }
        i = j;
    }
    for (size_t r = 0; r < nr; r++) {
        struct kp_compare_rank *rk = &res->ranks[r];
        int64_t *x = d + at[r];
        size_t m = cnt[r];

        rk->clock_offset_ns = median_i64(x, m); /* sorts x */
        rk->has_offset = r == 0 || m > 0;
        rk->offset_n = m;
        rk->offset_spread_ns = m > 0 ? (double) (x[(3 * (m - 1)) / 4] - x[(m - 1) / 4]) : 0.0;
        res->n_no_offset += !rk->has_offset;
    }
    rc = 0;
out:
    free(d);
    free(at);
    free(cnt);
    return rc;
}

/* Arrivals at each matched collective (aligned starts): fills the cells' late_ns (the sum
 * over the step's collectives of how long after the median arrival it arrived) and
 * max_late_ns, n_coll (decisive collectives: the spread of arrivals is over decisive_frac of
 * the step's median step time; exact ties and jitter do not count) and n_last (it arrived
 * last, alone). tmp holds n_ranks values. */
static void lateness(struct kp_compare_result *res, const struct coll *v, size_t n, double *tmp)
{
    size_t ns = res->n_steps;

    for (size_t i = 0; i < n;) {
        size_t j = i + 1, n_max = 0, who = 0;
        int64_t first = INT64_MAX, last = INT64_MIN;
        double med;

        while (j < n && v[j].si == v[i].si && v[j].kind == v[i].kind && v[j].idx == v[i].idx) {
            j++;
        }
        if (j - i < 2) {
            i = j;
            continue;
        }
        for (size_t k = i; k < j; k++) {
            int64_t a = v[k].start - res->ranks[v[k].ri].clock_offset_ns;

            tmp[k - i] = (double) a;
            first = a < first ? a : first;
            if (a > last) {
                last = a;
                n_max = 1;
                who = k;
            }
            else if (a == last) {
                n_max++;
            }
        }
        med = cmp_median(tmp, j - i);
        for (size_t k = i; k < j; k++) {
            double late = (double) (v[k].start - res->ranks[v[k].ri].clock_offset_ns) - med;
            struct kp_compare_cell *cl = &res->cells[(size_t) v[k].ri * ns + v[k].si];

            cl->late_ns += late > 0 ? late : 0.0;
            cl->max_late_ns = late > cl->max_late_ns ? late : cl->max_late_ns;
        }
        res->n_groups++;
        for (size_t k = i; k < j; k++) {
            if (v[k].p2p) {
                res->n_p2p++;
                break;
            }
        }
        if ((double) (last - first) >
            KP_COMPARE_DECISIVE_FRAC * res->steps[v[i].si].step_median_ns) {
            for (size_t k = i; k < j; k++) {
                res->cells[(size_t) v[k].ri * ns + v[k].si].n_coll++;
            }
            if (n_max == 1) {
                res->cells[(size_t) v[who].ri * ns + v[who].si].n_last++;
            }
        }
        i = j;
    }
}

static int fill_cells(PGconn *c, const char *runs, struct cmp_load *L,
                      struct kp_compare_result *res, const int64_t *nums, const int64_t *all,
                      size_t n_all, size_t max_rows, struct coll **colls, size_t *n_colls,
                      char *errbuf, size_t errlen)
{
    size_t ns = res->n_steps, nc = 0, cap = 0;
    bool need[3] = { false, false, false };
    struct coll *v;
    PGresult *sums[2] = { L->api, L->mem };

    for (size_t r = 0; r < L->n_ranks; r++) {
        for (size_t j = 0; j < L->rs[r].n; j++) {
            const struct rstep *s = &L->rs[r].v[j];
            long si = find_i64(nums, ns, s->num);
            struct kp_compare_cell *cl;

            if (si < 0 || (cl = &res->cells[r * ns + (size_t) si])->present) {
                continue; /* not compared, or a repeated step number: the first is kept */
            }
            cl->present = true;
            cl->step_ns = s->end - s->start;
        }
    }
    cap = (size_t) PQntuples(L->coll);
    for (int i = 0; i < PQntuples(L->ops); i++) {
        const struct ncls *x = nameset_find(&L->names, kp_pg_i64(L->ops, i, 2, -1));

        cap += x != NULL && x->cls == NC_GLOO;
    }
    if ((v = calloc(cap + 1, sizeof(*v))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    *colls = v;
    /* kernels: the sums per step, less the collective kernels, which come one by one */
    for (int i = 0; i < PQntuples(L->kern); i++) {
        long ri = find_i64(L->ranks, L->n_ranks, kp_pg_i64(L->kern, i, 0, -1)), si;

        if (ri < 0) {
            continue;
        }
        if (PQgetisnull(L->kern, i, 1)) {
            need[0] = true;
            continue;
        }
        if ((si = find_i64(nums, ns, kp_pg_i64(L->kern, i, 1, 0))) >= 0) {
            res->cells[(size_t) ri * ns + (size_t) si].compute_ns += kp_pg_i64(L->kern, i, 2, 0);
        }
    }
    for (int i = 0; i < PQntuples(L->coll); i++) {
        long ri = find_i64(L->ranks, L->n_ranks, kp_pg_i64(L->coll, i, 0, -1)), si, ai;
        bool nostep = PQgetisnull(L->coll, i, 1);
        int64_t start = kp_pg_i64(L->coll, i, 2, 0), dur = kp_pg_i64(L->coll, i, 3, 0), num;
        const struct ncls *x = nameset_find(&L->names, kp_pg_i64(L->coll, i, 4, -1));

        if (ri < 0) {
            continue;
        }
        num = nostep ? step_at(&L->rs[ri], start) : kp_pg_i64(L->coll, i, 1, 0);
        if ((ai = find_i64(all, n_all, num)) < 0) {
            continue;
        }
        si = find_i64(nums, ns, num);
        if (si >= 0 && !nostep) { /* in the sums above (the unstepped sums leave them out) */
            res->cells[(size_t) ri * ns + (size_t) si].compute_ns -= dur;
        }
        if (si >= 0 && !res->cells[(size_t) ri * ns + (size_t) si].present) {
            si = -1;
        }
        v[nc++] = (struct coll){ (uint32_t) ri,
                                 (uint32_t) ai,
                                 0,
                                 0,
                                 start,
                                 start + dur,
                                 si >= 0 ? (uint32_t) si : NOT_COMPARED,
                                 x != NULL && x->p2p };
    }
    /* ops: data loading sums, Gloo collectives */
    for (int i = 0; i < PQntuples(L->ops); i++) {
        const struct ncls *x = nameset_find(&L->names, kp_pg_i64(L->ops, i, 2, -1));
        long ri = find_i64(L->ranks, L->n_ranks, kp_pg_i64(L->ops, i, 0, -1)), si;
        int64_t start = kp_pg_i64(L->ops, i, 3, 0), dur = kp_pg_i64(L->ops, i, 4, 0);

        int64_t num;
        long ai;

        if (x == NULL || ri < 0 || (x->cls != NC_GLOO && x->cls != NC_DATA)) {
            continue;
        }
        num = PQgetisnull(L->ops, i, 1) ? step_at(&L->rs[ri], start) : kp_pg_i64(L->ops, i, 1, 0);
        si = find_i64(nums, ns, num);
        if (si >= 0 && !res->cells[(size_t) ri * ns + (size_t) si].present) {
            si = -1;
        }
        if (x->cls == NC_DATA) {
            if (si >= 0) {
                res->cells[(size_t) ri * ns + (size_t) si].host_ns += dur;
            }
        }
        else if (nc < cap && (ai = find_i64(all, n_all, num)) >= 0) {
            v[nc++] = (struct coll){ (uint32_t) ri,
                                     (uint32_t) ai,
                                     1,
                                     0,
                                     start,
                                     start + dur,
                                     si >= 0 ? (uint32_t) si : NOT_COMPARED,
                                     x->p2p };
        }
    }
    /* API calls (launch) and copies/memsets (other) */
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < PQntuples(sums[t]); i++) {
            long ri = find_i64(L->ranks, L->n_ranks, kp_pg_i64(sums[t], i, 0, -1)), si;
            struct kp_compare_cell *cl;

            if (ri < 0) {
                continue;
            }
            if (PQgetisnull(sums[t], i, 1)) {
                need[t + 1] = true;
                continue;
            }
            if ((si = find_i64(nums, ns, kp_pg_i64(sums[t], i, 1, 0))) < 0 ||
                !(cl = &res->cells[(size_t) ri * ns + (size_t) si])->present) {
                continue;
            }
            *(t == 0 ? &cl->launch_ns : &cl->other_ns) += kp_pg_i64(sums[t], i, 2, 0);
        }
    }
    *n_colls = nc;
    if (need[0] || need[1] || need[2]) {
        return load_unstepped(c, runs, L, need, nums, ns, res->cells, max_rows, errbuf, errlen);
    }
    return 0;
}

/* Numbers the collectives in order within (rank, step, kind) (sorting them so). */
static void number_colls(struct coll *colls, size_t n_colls)
{
    qsort(colls, n_colls, sizeof(*colls), cmp_coll_rank);
    for (size_t i = 0; i < n_colls; i++) {
        const struct coll *p = i > 0 ? &colls[i - 1] : NULL;

        colls[i].idx =
            (p != NULL && p->ri == colls[i].ri && p->si == colls[i].si && p->kind == colls[i].kind)
                ? p->idx + 1
                : 0;
    }
}

/* Keeps the collectives of compared steps only (their si the compared index), adding their
 * times to the cells. Returns how many are kept. */
static size_t keep_compared(struct kp_compare_result *res, struct coll *colls, size_t n_colls)
{
    size_t ns = res->n_steps;
    size_t k = 0;

    for (size_t i = 0; i < n_colls; i++) { /* (all -> compared keeps the order) */
        struct kp_compare_cell *cl;

        if (colls[i].cs == NOT_COMPARED) {
            continue;
        }
        colls[k] = colls[i];
        colls[k].si = colls[i].cs;
        cl = &res->cells[(size_t) colls[k].ri * ns + colls[k].si];
        cl->coll_ns += colls[k].end - colls[k].start;
        if (cl->n_coll_seen++ == 0 || colls[k].start > cl->last_start) {
            cl->last_start = colls[k].start;
        }
        k++;
    }
    return k;
}

/* Per step: the spreads of step and collective times, and each rank's excess over the median
 * rank per cause. tmp holds max(ranks, steps) doubles. */
static void step_spreads(struct kp_compare_result *res, double *tmp)
{
    size_t ns = res->n_steps, nr = res->n_ranks;

    for (size_t j = 0; j < ns; j++) {
        struct kp_compare_step *st = &res->steps[j];
        size_t k = 0;

        for (size_t r = 0; r < nr; r++) {
            const struct kp_compare_cell *cl = &res->cells[r * ns + j];

            if (cl->present) {
                tmp[k++] = (double) cl->step_ns;
                st->step_max_ns = fmax(st->step_max_ns, (double) cl->step_ns);
                st->coll_max_ns = fmax(st->coll_max_ns, (double) cl->coll_ns);
            }
        }
        st->n_ranks = k;
        st->step_median_ns = cmp_median(tmp, k);
        k = 0;
        for (size_t r = 0; r < nr; r++) {
            if (res->cells[r * ns + j].present) {
                tmp[k++] = (double) res->cells[r * ns + j].coll_ns;
            }
        }
        st->coll_median_ns = cmp_median(tmp, k);
        st->step_ratio = st->step_median_ns > 0 ? st->step_max_ns / st->step_median_ns : 0.0;
        st->coll_ratio = st->coll_median_ns > 0 ? st->coll_max_ns / st->coll_median_ns : 0.0;
        for (int cause = 0; cause < KP_COMPARE_CAUSE_COUNT; cause++) {
            double m;

            k = 0;
            for (size_t r = 0; r < nr; r++) {
                if (res->cells[r * ns + j].present) {
                    tmp[k++] = (double) cmp_cell_cause(&res->cells[r * ns + j], cause);
                }
            }
            m = cmp_median(tmp, k);
            for (size_t r = 0; r < nr; r++) {
                struct kp_compare_cell *cl = &res->cells[r * ns + j];

                cl->excess_ns[cause] = cl->present ? (double) cmp_cell_cause(cl, cause) - m : 0.0;
            }
        }
    }
}

/* Per step: each rank's wait and whether it is late (docs/specs/compare.md §6), and the step's
 * last rank. */
static void late_cells(struct kp_compare_result *res, const struct kp_compare_opts *o, double *tmp)
{
    size_t ns = res->n_steps, nr = res->n_ranks;

    for (size_t j = 0; j < ns; j++) {
        struct kp_compare_step *st = &res->steps[j];
        size_t best = 0, k = 0;

        /* the step's collective times, sorted: the others' median is that of all less one */
        for (size_t q = 0; q < nr; q++) {
            if (res->cells[q * ns + j].present) {
                tmp[k++] = (double) res->cells[q * ns + j].coll_ns;
            }
        }
        qsort(tmp, k, sizeof(*tmp), cmp_double);
        for (size_t r = 0; r < nr; r++) {
            struct kp_compare_cell *cl = &res->cells[r * ns + j];
            double excess = 0.0;

            st->n_coll = cl->n_coll > st->n_coll ? cl->n_coll : st->n_coll;
            if (cl->n_last > best) {
                best = cl->n_last;
                st->last_rank = res->ranks[r].rank;
            }
            if (!cl->present) {
                continue;
            }
            cl->wait_ns = median_but_one(tmp, k, (double) cl->coll_ns) - (double) cl->coll_ns;
            for (int cause = 0; cause < KP_COMPARE_CAUSE_COUNT; cause++) {
                excess = fmax(excess, cl->excess_ns[cause]);
            }
            cl->late = cl->late_ns > o->late_frac * st->step_median_ns &&
                       excess > o->excess_frac * st->step_median_ns;
        }
    }
}

/* Per rank: medians over its steps, its lateness and whether it is a straggler; the run's
 * median step time. */
static void rank_medians(struct kp_compare_result *res, const struct kp_compare_opts *o,
                         double *tmp)
{
    size_t ns = res->n_steps, nr = res->n_ranks;

    for (size_t r = 0; r < nr; r++) {
        struct kp_compare_rank *rk = &res->ranks[r];
        double *dst[6] = { &rk->step_ns, &rk->coll_ns,   &rk->compute_ns,
                           &rk->host_ns, &rk->launch_ns, &rk->other_ns };
        size_t present = 0;
        double late = 0.0;

        for (int f = 0; f < 6; f++) {
            size_t k = 0;

            for (size_t j = 0; j < ns; j++) {
                const struct kp_compare_cell *cl = &res->cells[r * ns + j];
                int64_t const *fields[6] = { &cl->step_ns, &cl->coll_ns,   &cl->compute_ns,
                                             &cl->host_ns, &cl->launch_ns, &cl->other_ns };

                if (cl->present) {
                    tmp[k++] = (double) *fields[f];
                }
            }
            *dst[f] = cmp_median(tmp, k);
        }
        for (size_t j = 0; j < ns; j++) {
            const struct kp_compare_cell *cl = &res->cells[r * ns + j];

            if (cl->present) {
                present++;
                late += cl->late_ns;
                rk->n_late_steps += cl->late;
            }
        }
        rk->late_ns = present > 0 ? late / (double) present : 0.0;
        rk->straggler =
            rk->n_late_steps > 0 && (double) rk->n_late_steps >= o->step_frac * (double) present;
        res->n_stragglers += rk->straggler;
    }
    for (size_t r = 0; r < nr; r++) {
        tmp[r] = res->ranks[r].step_ns;
    }
    res->step_median_ns = cmp_median(tmp, nr);
    for (size_t r = 0; r < nr; r++) {
        res->ranks[r].vs_median =
            res->step_median_ns > 0 ? res->ranks[r].step_ns / res->step_median_ns - 1.0 : 0.0;
    }
}

/* The stragglers' evidence and cause, over the steps they are late in, latest first; which
 * ranks wait. Returns 0 or -ENOMEM. */
static int straggler_evidence(struct kp_compare_result *res)
{
    size_t ns = res->n_steps, nr = res->n_ranks;

    if (res->n_stragglers > 0) {
        size_t k = 0;

        if ((res->stragglers = calloc(res->n_stragglers, sizeof(*res->stragglers))) == NULL) {
            res->n_stragglers = 0;
            return -ENOMEM;
        }
        for (size_t r = 0; r < nr; r++) {
            struct kp_compare_straggler *s;

            if (!res->ranks[r].straggler) {
                continue;
            }
            s = &res->stragglers[k++];
            s->rank = res->ranks[r].rank;
            if ((s->steps = calloc(res->ranks[r].n_late_steps, sizeof(*s->steps))) == NULL) {
                return -ENOMEM;
            }
            for (size_t j = 0; j < ns; j++) {
                const struct kp_compare_cell *cl = &res->cells[r * ns + j];

                if (!cl->late) {
                    continue;
                }
                s->steps[s->n_steps++] = res->steps[j].step;
                s->late_ns += cl->late_ns;
                s->max_late_ns = fmax(s->max_late_ns, cl->max_late_ns);
                for (int cause = 0; cause < KP_COMPARE_CAUSE_COUNT; cause++) {
                    s->excess_ns[cause] += cl->excess_ns[cause];
                    s->own_ns[cause] += (double) cmp_cell_cause(cl, cause);
                }
            }
            s->late_ns /= (double) s->n_steps;
            for (int cause = 0; cause < KP_COMPARE_CAUSE_COUNT; cause++) {
                s->excess_ns[cause] /= (double) s->n_steps;
                s->own_ns[cause] /= (double) s->n_steps;
                if (s->excess_ns[cause] > s->excess_ns[s->cause]) {
                    s->cause = (enum kp_compare_cause) cause;
                }
            }
        }
        /* latest first */
        for (size_t a = 1; a < res->n_stragglers; a++) {
            for (size_t b = a; b > 0 && res->stragglers[b].late_ns > res->stragglers[b - 1].late_ns;
                 b--) {
                struct kp_compare_straggler t = res->stragglers[b];

                res->stragglers[b] = res->stragglers[b - 1];
                res->stragglers[b - 1] = t;
            }
        }
        const struct kp_compare_rank *s0 = cmp_rank_of(res, res->stragglers[0].rank);

        for (size_t r = 0; r < nr; r++) {
            res->ranks[r].waits =
                !res->ranks[r].straggler && s0 != NULL &&
                res->ranks[r].coll_ns - s0->coll_ns >= 0.5 * res->stragglers[0].late_ns;
        }
    }
    return 0;
}

int kp_compare_result_create(PGconn *c, int64_t run, const struct kp_compare_opts *o,
                             struct kp_compare_result **out, char *errbuf, size_t errlen)
{
    char runs[24];
    const char *params[1] = { runs };
    struct cmp_load L;
    size_t n_nums = 0, n_colls = 0, ns, nr, n_all = 0;
    int64_t *nums = NULL, *all = NULL;
    size_t *step_nr = NULL, *seen_by = NULL;
    struct coll *colls = NULL;
    double *tmp = NULL;
    struct kp_compare_result *res = NULL;
    int rc;

    *out = NULL;
    memset(&L, 0, sizeof(L));
    if (!(o->late_frac >= 0.0) || !(o->excess_frac >= 0.0) ||
        !(o->step_frac >= 0.0 && o->step_frac <= 1.0)) {
        kp_errbuf_set(errbuf, errlen, "bad thresholds");
        return -EINVAL;
    }
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    if ((rc = cmp_check_run(c, params, run, errbuf, errlen)) != 0 ||
        (rc = load_ranks(c, params, run, &L.ranks, &L.n_ranks, errbuf, errlen)) != 0 ||
        (rc = cmp_load_run(c, runs, run, o->max_rows, &L, errbuf, errlen)) != 0) {
        goto fail;
    }
    for (size_t i = 0; i < L.n_ranks; i++) {
        n_nums += L.rs[i].n;
    }
    /* the steps: every step number any rank has (or the one asked for) */
    if ((nums = calloc(n_nums + 1, sizeof(*nums))) == NULL) {
        goto nomem;
    }
    n_nums = 0;
    for (size_t i = 0; i < L.n_ranks; i++) {
        for (size_t j = 0; j < L.rs[i].n; j++) {
            nums[n_nums++] = L.rs[i].v[j].num;
        }
    }
    qsort(nums, n_nums, sizeof(*nums), cmp_i64);
    if ((all = calloc(n_nums + 1, sizeof(*all))) == NULL ||
        (step_nr = calloc(n_nums + 1, sizeof(*step_nr))) == NULL ||
        (seen_by = calloc(n_nums + 1, sizeof(*seen_by))) == NULL) {
        goto nomem;
    }
    for (size_t i = 0; i < n_nums; i++) {
        if (i == 0 || nums[i] != nums[i - 1]) {
            all[n_all++] = nums[i];
        }
    }
    for (size_t i = 0; i < L.n_ranks; i++) { /* the ranks having each step */
        for (size_t j = 0; j < L.rs[i].n; j++) {
            long a = find_i64(all, n_all, L.rs[i].v[j].num);

            if (seen_by[a] != i + 1) { /* a repeated step number counts once */
                seen_by[a] = i + 1;
                step_nr[a]++;
            }
        }
    }
    ns = 0;
    for (size_t i = 0; i < n_nums; i++) {
        if ((i == 0 || nums[i] != nums[i - 1]) && (!o->has_step || nums[i] == o->step)) {
            nums[ns++] = nums[i];
        }
    }
    if (ns == 0) {
        if (o->has_step && n_nums > 0) {
            kp_errbuf_set(errbuf, errlen,
                          "run %" PRId64 " has no step %" PRId64 ": its steps are %" PRId64
                          "..%" PRId64,
                          run, o->step, nums[0], nums[n_nums - 1]);
        }
        else {
            kp_errbuf_set(errbuf, errlen,
                          "run %" PRId64 " has no steps with GPU work to compare: capture steps "
                          "(kprofctl start --steps N) or import ProfilerStep ranges",
                          run);
        }
        rc = KP_ENOTFOUND;
        goto fail;
    }
    nr = L.n_ranks;
    if ((res = calloc(1, sizeof(*res))) == NULL ||
        (res->ranks = calloc(nr, sizeof(*res->ranks))) == NULL ||
        (res->steps = calloc(ns, sizeof(*res->steps))) == NULL ||
        (res->cells = calloc(nr * ns, sizeof(*res->cells))) == NULL ||
        (tmp = calloc((nr > ns ? nr : ns) + 1, sizeof(*tmp))) == NULL) {
        goto nomem;
    }
    res->run = run;
    res->n_ranks = nr;
    res->n_steps = ns;
    for (size_t r = 0; r < nr; r++) {
        res->ranks[r].rank = (int) L.ranks[r];
        res->ranks[r].node = res->ranks[r].local_rank = -1;
    }
    res->waited_for = res->hta_rank = -1;
    if ((rc = load_world(c, params, res, errbuf, errlen)) != 0) {
        goto fail;
    }
    for (size_t j = 0; j < ns; j++) {
        res->steps[j].step = nums[j];
        res->steps[j].last_rank = -1;
    }
    if ((rc = fill_cells(c, runs, &L, res, nums, all, n_all, o->max_rows, &colls, &n_colls, errbuf,
                         errlen)) != 0) {
        goto fail;
    }
    /* collectives of every step: order within (rank, step, kind), then matched across ranks;
     * the clocks aligned over all of them, then only the compared steps' kept */
    number_colls(colls, n_colls);
    qsort(colls, n_colls, sizeof(*colls), cmp_coll_match);
    if ((rc = align_clocks(res, colls, n_colls, step_nr)) != 0) {
        goto nomem;
    }
    n_colls = keep_compared(res, colls, n_colls);
    step_spreads(res, tmp);
    lateness(res, colls, n_colls, tmp);
    late_cells(res, o, tmp);
    rank_medians(res, o, tmp);
    if (straggler_evidence(res) != 0) {
        goto nomem;
    }
    cmp_who_waits(res, o);
    cmp_make_verdict(res, o, n_colls);
    *out = res;
    res = NULL;
    rc = 0;
    goto out;
nomem:
    rc = -ENOMEM;
    kp_errbuf_set(errbuf, errlen, "out of memory");
fail:
out:
    kp_compare_result_destroy(res);
    free(tmp);
    free(colls);
    free(nums);
    free(all);
    free(step_nr);
    free(seen_by);
    cmp_load_fini(&L);
    return rc;
}

int kp_compare_save_offsets(PGconn *c, const struct kp_compare_result *r, size_t *n_saved,
                            char *errbuf, size_t errlen)
{
    char runs[24];
    struct kp_strbuf arr[2];
    size_t n = 0;
    const char *params[3] = { runs, NULL, NULL };
    int rc = 0;

    *n_saved = 0;
    snprintf(runs, sizeof(runs), "%" PRId64, r->run);
    for (int f = 0; f < 2; f++) {
        kp_strbuf_init(&arr[f], 0);
        rc = rc != 0 ? rc : kp_pg_array_open(&arr[f]);
    }
    for (size_t i = 0; i < r->n_ranks && rc == 0; i++) {
        if (!r->ranks[i].has_offset) {
            continue;
        }
        rc = kp_pg_array_i64(&arr[0], r->ranks[i].rank);
        rc = rc != 0 ? rc : kp_pg_array_i64(&arr[1], r->ranks[i].clock_offset_ns);
        n++;
    }
    for (int f = 0; f < 2 && rc == 0; f++) {
        rc = kp_pg_array_close(&arr[f]);
        params[f + 1] = arr[f].data;
    }
    if (rc != 0) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
    }
    else if (n > 0 && (rc = kp_pg_query(c,
                                        "UPDATE ranks AS k SET clock_offset_ns = u.off FROM "
                                        "unnest($2::int[], $3::bigint[]) AS u(rank, off) WHERE "
                                        "k.run_id = $1 AND k.rank = u.rank",
                                        3, params, NULL, errbuf, errlen)) == 0) {
        *n_saved = n;
    }
    kp_strbuf_fini(&arr[0]);
    kp_strbuf_fini(&arr[1]);
    return rc;
}
