/* kp_compare_result_create's reading: the run's ranks, steps, names and per-(rank, step) sums,
 * and its collectives (docs/specs/compare.md §1). */
#include "compare_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_compare_sql.h"
#include "kp_err.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

/* The run's ranks, sorted. Returns 0 and *ranks (free) / *n, KP_ENOTFOUND, KP_EPG, -ENOMEM. */
int kp__compare_load_ranks(PGconn *c, const char *const *params, int64_t run, int64_t **ranks,
                           size_t *n, char *errbuf, size_t errlen)
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
int kp__compare_load_world(PGconn *c, const char *const *params, struct kp_compare_result *res,
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

static const char names_sql[] =
    "SELECT id, c, CASE WHEN c = 2 THEN substr(name, 14) WHEN c < 2 AND (name ILIKE '%send%' OR "
    "name ILIKE '%recv%') THEN 'p2p' END FROM (SELECT id, name, " KP_COMPARE_NAME_CLASS_SQL
    " AS c FROM names) x WHERE c IS NOT NULL ORDER BY id";

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
        if (k == NC_STEP && !kp__compare_parse_step(PQgetvalue(r, (int) i, 2), &x->num)) {
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

void kp__compare_load_fini(struct cmp_load *L)
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
    PQclear(L->ranges);
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

/*
 * The same rows from the run's summary, which collectord writes once the run has ended
 * (collectord/summary.c, with KP_COMPARE_NAME_CLASS_SQL for the classes): each query gives the
 * columns of its live twin above, so everything after the reading is the same code. The
 * summary counts only when its compare_runs row has this build's format version.
 */
/* (two statements: PostgreSQL resolves a table when it parses, so a database from before
 * migration 0014 would fail the second one) */
static const char sum_table_sql[] = "SELECT to_regclass('compare_runs') IS NOT NULL";
static const char sum_have_sql[] =
    "SELECT EXISTS (SELECT 1 FROM compare_runs WHERE run_id = $1 AND version = $2)";
static const char sum_ops_sql[] =
    "SELECT rank, step, name, start_ns, dur_ns FROM compare_ops WHERE run_id = $1";
static const char sum_kern_sql[] =
    "SELECT rank, step, kernel_ns FROM compare_sums WHERE run_id = $1 AND kernel_ns IS NOT NULL";
static const char sum_span_sql[] = "SELECT rank, kmin, kmax FROM compare_spans WHERE run_id = $1";
static const char sum_coll_sql[] =
    "SELECT rank, step, start_ns, dur_ns, name FROM compare_colls WHERE run_id = $1";
static const char sum_api_sql[] =
    "SELECT rank, step, api_ns FROM compare_sums WHERE run_id = $1 AND api_ns IS NOT NULL";
static const char sum_mem_sql[] =
    "SELECT rank, step, mem_ns FROM compare_sums WHERE run_id = $1 AND mem_ns IS NOT NULL";
static const char sum_ranges_sql[] =
    "SELECT rank, start_ns, end_ns, kernel_ns, api_ns, mem_ns FROM compare_ranges WHERE run_id = "
    "$1 ORDER BY rank, start_ns, end_ns";

/* Whether run has a summary this build reads (a database from before migration 0014 has none).
 * Returns 0 and *yes, or KP_EPG. */
static int summary_present(PGconn *c, const char *runs, bool *yes, char *errbuf, size_t errlen)
{
    char version[16];
    const char *p2[2] = { runs, version };
    PGresult *r = NULL;
    int rc;

    snprintf(version, sizeof(version), "%d", KP_COMPARE_SUMMARY_VERSION);
    *yes = false;
    if ((rc = kp_pg_query(c, sum_table_sql, 0, NULL, &r, errbuf, errlen)) < 0) {
        return rc;
    }
    *yes = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!*yes) {
        return 0;
    }
    if ((rc = kp_pg_query(c, sum_have_sql, 2, p2, &r, errbuf, errlen)) < 0) {
        return rc;
    }
    *yes = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    return 0;
}

/* Runs the first queries and builds every rank's steps. */
int kp__compare_load_run(PGconn *c, const char *runs, int64_t run, size_t max_rows,
                         struct cmp_load *L, char *errbuf, size_t errlen)
{
    const char *p2[2] = { runs, NULL };
    int rc;

    if ((L->rs = calloc(L->n_ranks, sizeof(*L->rs))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    if ((rc = nameset_load(c, &L->names, &L->budget, max_rows, errbuf, errlen)) != 0 ||
        (rc = summary_present(c, runs, &L->summary, errbuf, errlen)) != 0) {
        return rc;
    }
    p2[1] = L->names.arr[NC_COUNT].data;
    if ((rc = kp_an_query(c, L->summary ? 1 : 2, L->summary ? sum_ops_sql : ops_sql, p2, &L->budget,
                          max_rows, &L->ops, errbuf, errlen)) != 0 ||
        (rc = kp_an_query(c, 1, steps_sql, p2, &L->budget, max_rows, &L->steps, errbuf, errlen)) !=
            0) {
        return rc;
    }
    p2[1] = L->names.arr[NC_NCCL].data;
    if ((rc = kp_an_query(c, 1, L->summary ? sum_kern_sql : kern_sql, p2, &L->budget, max_rows,
                          &L->kern, errbuf, errlen)) != 0 ||
        (rc = kp_an_query(c, L->summary ? 1 : 2, L->summary ? sum_coll_sql : coll_sql, p2,
                          &L->budget, max_rows, &L->coll, errbuf, errlen)) != 0) {
        return rc;
    }
    p2[1] = L->names.arr[NC_SYNC].data;
    if ((rc = kp_an_query(c, L->summary ? 1 : 2, L->summary ? sum_api_sql : api_sql, p2, &L->budget,
                          max_rows, &L->api, errbuf, errlen)) != 0 ||
        (rc = kp_an_query(c, 1, L->summary ? sum_mem_sql : mem_sql, p2, &L->budget, max_rows,
                          &L->mem, errbuf, errlen)) != 0) {
        return rc;
    }
    /* steps: ProfilerStep ops, else the steps table, else step 0 over the kernels */
    for (int i = 0; i < PQntuples(L->ops); i++) {
        const struct ncls *nc = nameset_find(&L->names, kp_pg_i64(L->ops, i, 2, -1));
        long ri = kp__compare_find_i64(L->ranks, L->n_ranks, kp_pg_i64(L->ops, i, 0, -1));
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
        long ri = kp__compare_find_i64(L->ranks, L->n_ranks, kp_pg_i64(L->steps, i, 0, -1));
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
        if ((rc = kp_an_query(c, 1, L->summary ? sum_span_sql : span_sql, p2, &L->budget, max_rows,
                              &r, errbuf, errlen)) != 0) {
            return rc;
        }
        for (int i = 0; i < PQntuples(r); i++) {
            long q = kp__compare_find_i64(L->ranks, L->n_ranks, kp_pg_i64(r, i, 0, -1));

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

/* The compare_ranges row of rank's interval [start, end) in L->ranges (by rank, start, end), or
 * -1. */
static int range_row(const PGresult *r, int64_t rank, int64_t start, int64_t end)
{
    int lo = 0, hi = PQntuples(r);

    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int64_t k[3] = { kp_pg_i64(r, mid, 0, 0), kp_pg_i64(r, mid, 1, 0),
                         kp_pg_i64(r, mid, 2, 0) };
        int64_t x[3] = { rank, start, end };
        int d = 0;

        for (int f = 0; f < 3 && d == 0; f++) {
            d = (k[f] > x[f]) - (k[f] < x[f]);
        }
        if (d == 0) {
            return mid;
        }
        if (d < 0) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return -1;
}

/* load_unstepped from the summary's sums per interval: each rank's step adds its interval's
 * sums, as the live query's join does. Sets *done false, adding nothing, when some step's
 * interval is not in the summary (the live query then answers). */
static int unstepped_from_summary(PGconn *c, const char *runs, struct cmp_load *L,
                                  const bool need[3], const int64_t *nums, size_t ns,
                                  struct kp_compare_cell *cells, size_t max_rows, bool *done,
                                  char *errbuf, size_t errlen)
{
    const char *p1[1] = { runs };
    int rc;

    *done = false;
    if (L->ranges == NULL && (rc = kp_an_query(c, 1, sum_ranges_sql, p1, &L->budget, max_rows,
                                               &L->ranges, errbuf, errlen)) != 0) {
        return rc;
    }
    for (int pass = 0; pass < 2; pass++) { /* check every interval, then add */
        for (size_t i = 0; i < L->n_ranks; i++) {
            for (size_t j = 0; j < L->rs[i].n; j++) {
                const struct rstep *st = &L->rs[i].v[j];
                int row = range_row(L->ranges, L->ranks[i], st->start, st->end);
                long si;
                struct kp_compare_cell *cl;

                if (row < 0) {
                    return 0;
                }
                if (pass == 0 || (si = kp__compare_find_i64(nums, ns, st->num)) < 0 ||
                    !(cl = &cells[i * ns + (size_t) si])->present) {
                    continue;
                }
                for (int t = 0; t < 3; t++) {
                    if (need[t]) {
                        *(t == 0   ? &cl->compute_ns
                          : t == 1 ? &cl->launch_ns
                                   : &cl->other_ns) += kp_pg_i64(L->ranges, row, 3 + t, 0);
                    }
                }
            }
        }
    }
    *done = true;
    return 0;
}

/* Sums the rows without a step of the tables flagged in need (0 kernels, 1 API calls, 2
 * copies and memsets) by the ranks' steps, into the cells' compute, launch and other. */
static int load_unstepped(PGconn *c, const char *runs, struct cmp_load *L, const bool need[3],
                          const int64_t *nums, size_t ns, struct kp_compare_cell *cells,
                          size_t max_rows, char *errbuf, size_t errlen)
{
    struct kp_strbuf arr[4];
    const char *params[6] = { runs, NULL, NULL, NULL, NULL, NULL };
    bool done = false;
    int rc = 0;

    if (L->summary && ((rc = unstepped_from_summary(c, runs, L, need, nums, ns, cells, max_rows,
                                                    &done, errbuf, errlen)) != 0 ||
                       done)) {
        return rc;
    }
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
            long ri = kp__compare_find_i64(L->ranks, L->n_ranks, kp_pg_i64(r, i, 0, -1));
            long si = kp__compare_find_i64(nums, ns, kp_pg_i64(r, i, 1, 0));
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

/* What kp__compare_fill_cells' phases share. */
struct cell_fill {
    struct cmp_load *L;
    struct kp_compare_result *res;
    const int64_t *nums; /* the compared steps */
    size_t ns;
    const int64_t *all; /* every step number */
    size_t n_all;
    struct coll *v; /* the collectives so far */
    size_t nc, cap;
    bool need[3]; /* kernels, API calls, copies/memsets with rows outside every step */
};

/* The cell of rank ri and compared step si. */
static struct kp_compare_cell *fill_cell(const struct cell_fill *f, long ri, long si)
{
    return &f->res->cells[(size_t) ri * f->ns + (size_t) si];
}

/* The cells each rank has a step for, with the step's length. */
static void fill_present(struct cell_fill *f)
{
    for (size_t r = 0; r < f->L->n_ranks; r++) {
        for (size_t j = 0; j < f->L->rs[r].n; j++) {
            const struct rstep *s = &f->L->rs[r].v[j];
            long si = kp__compare_find_i64(f->nums, f->ns, s->num);
            struct kp_compare_cell *cl;

            if (si < 0 || (cl = fill_cell(f, (long) r, si))->present) {
                continue; /* not compared, or a repeated step number: the first is kept */
            }
            cl->present = true;
            cl->step_ns = s->end - s->start;
        }
    }
}

/* kernels: the sums per step, less the collective kernels, which come one by one */
static void fill_kernels(struct cell_fill *f)
{
    const PGresult *k = f->L->kern;

    for (int i = 0; i < PQntuples(k); i++) {
        long ri = kp__compare_find_i64(f->L->ranks, f->L->n_ranks, kp_pg_i64(k, i, 0, -1)), si;

        if (ri < 0) {
            continue;
        }
        if (PQgetisnull(k, i, 1)) {
            f->need[0] = true;
            continue;
        }
        if ((si = kp__compare_find_i64(f->nums, f->ns, kp_pg_i64(k, i, 1, 0))) >= 0) {
            fill_cell(f, ri, si)->compute_ns += kp_pg_i64(k, i, 2, 0);
        }
    }
}

/* The collective kernels, one by one, out of the compute sums. */
static void fill_collectives(struct cell_fill *f)
{
    const PGresult *cr = f->L->coll;

    for (int i = 0; i < PQntuples(cr); i++) {
        long ri = kp__compare_find_i64(f->L->ranks, f->L->n_ranks, kp_pg_i64(cr, i, 0, -1)), si, ai;
        bool nostep = PQgetisnull(cr, i, 1);
        int64_t start = kp_pg_i64(cr, i, 2, 0), dur = kp_pg_i64(cr, i, 3, 0), num;
        const struct ncls *x = nameset_find(&f->L->names, kp_pg_i64(cr, i, 4, -1));

        if (ri < 0) {
            continue;
        }
        num = nostep ? step_at(&f->L->rs[ri], start) : kp_pg_i64(cr, i, 1, 0);
        if ((ai = kp__compare_find_i64(f->all, f->n_all, num)) < 0) {
            continue;
        }
        si = kp__compare_find_i64(f->nums, f->ns, num);
        if (si >= 0 && !nostep) { /* in the sums above (the unstepped sums leave them out) */
            fill_cell(f, ri, si)->compute_ns -= dur;
        }
        if (si >= 0 && !fill_cell(f, ri, si)->present) {
            si = -1;
        }
        f->v[f->nc++] = (struct coll){ (uint32_t) ri,
                                       (uint32_t) ai,
                                       0,
                                       0,
                                       start,
                                       start + dur,
                                       si >= 0 ? (uint32_t) si : NOT_COMPARED,
                                       x != NULL && x->p2p };
    }
}

/* ops: data loading sums, Gloo collectives */
static void fill_ops(struct cell_fill *f)
{
    const PGresult *o = f->L->ops;

    for (int i = 0; i < PQntuples(o); i++) {
        const struct ncls *x = nameset_find(&f->L->names, kp_pg_i64(o, i, 2, -1));
        long ri = kp__compare_find_i64(f->L->ranks, f->L->n_ranks, kp_pg_i64(o, i, 0, -1)), si;
        int64_t start = kp_pg_i64(o, i, 3, 0), dur = kp_pg_i64(o, i, 4, 0);

        int64_t num;
        long ai;

        if (x == NULL || ri < 0 || (x->cls != NC_GLOO && x->cls != NC_DATA)) {
            continue;
        }
        num = PQgetisnull(o, i, 1) ? step_at(&f->L->rs[ri], start) : kp_pg_i64(o, i, 1, 0);
        si = kp__compare_find_i64(f->nums, f->ns, num);
        if (si >= 0 && !fill_cell(f, ri, si)->present) {
            si = -1;
        }
        if (x->cls == NC_DATA) {
            if (si >= 0) {
                fill_cell(f, ri, si)->host_ns += dur;
            }
        }
        else if (f->nc < f->cap && (ai = kp__compare_find_i64(f->all, f->n_all, num)) >= 0) {
            f->v[f->nc++] = (struct coll){ (uint32_t) ri,
                                           (uint32_t) ai,
                                           1,
                                           0,
                                           start,
                                           start + dur,
                                           si >= 0 ? (uint32_t) si : NOT_COMPARED,
                                           x->p2p };
        }
    }
}

/* API calls (launch) and copies/memsets (other) */
static void fill_calls(struct cell_fill *f)
{
    PGresult *sums[2] = { f->L->api, f->L->mem };

    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < PQntuples(sums[t]); i++) {
            long ri =
                     kp__compare_find_i64(f->L->ranks, f->L->n_ranks, kp_pg_i64(sums[t], i, 0, -1)),
                 si;
            struct kp_compare_cell *cl;

            if (ri < 0) {
                continue;
            }
            if (PQgetisnull(sums[t], i, 1)) {
                f->need[t + 1] = true;
                continue;
            }
            if ((si = kp__compare_find_i64(f->nums, f->ns, kp_pg_i64(sums[t], i, 1, 0))) < 0 ||
                !(cl = fill_cell(f, ri, si))->present) {
                continue;
            }
            *(t == 0 ? &cl->launch_ns : &cl->other_ns) += kp_pg_i64(sums[t], i, 2, 0);
        }
    }
}

int kp__compare_fill_cells(PGconn *c, const char *runs, struct cmp_load *L,
                           struct kp_compare_result *res, const int64_t *nums, const int64_t *all,
                           size_t n_all, size_t max_rows, struct coll **colls, size_t *n_colls,
                           char *errbuf, size_t errlen)
{
    struct cell_fill f = { .L = L,
                           .res = res,
                           .nums = nums,
                           .ns = res->n_steps,
                           .all = all,
                           .n_all = n_all };

    fill_present(&f);
    f.cap = (size_t) PQntuples(L->coll);
    for (int i = 0; i < PQntuples(L->ops); i++) {
        const struct ncls *x = nameset_find(&L->names, kp_pg_i64(L->ops, i, 2, -1));

        f.cap += x != NULL && x->cls == NC_GLOO;
    }
    if ((f.v = calloc(f.cap + 1, sizeof(*f.v))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    *colls = f.v;
    fill_kernels(&f);
    fill_collectives(&f);
    fill_ops(&f);
    fill_calls(&f);
    *n_colls = f.nc;
    if (f.need[0] || f.need[1] || f.need[2]) {
        return load_unstepped(c, runs, L, f.need, nums, f.ns, res->cells, max_rows, errbuf, errlen);
    }
    return 0;
}
