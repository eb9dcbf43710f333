/*
 * kp_cmp: the cross-rank comparison (compare.h). kp_cmp_run loads each rank's breakdown with
 * kp_an_load + kp_an_breakdown (one rank in memory at a time), reads every rank's collectives
 * in one query, matches them across ranks by order within the step, aligns the clocks from
 * their end times and applies the straggler rule. kp_cmp_hta is HTA's metric, apart.
 */
#include "compare.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kp_analyzer.h"
#include "kp_err.h"
#include "kp_pg.h"

const char *const kp_cmp_cause_names[KP_CMP_CAUSE_COUNT] = {
    [KP_CMP_COMPUTE] = "compute",
    [KP_CMP_HOST] = "host",
    [KP_CMP_LAUNCH] = "launch",
};

/* The NCCL kernel and Gloo op names, as SQL predicates on names.name. */
#define NCCL_NAMES "(name LIKE 'nccl%Kernel%')"
#define GLOO_NAMES "(name LIKE 'gloo:%')"

void kp_cmp_opts_init(struct kp_cmp_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->late_frac = KP_CMP_DEFAULT_LATE_FRAC;
    o->last_frac = KP_CMP_DEFAULT_LAST_FRAC;
    o->step_frac = KP_CMP_DEFAULT_STEP_FRAC;
}

/* ---- helpers -------------------------------------------------------------------------- */

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *) pa, b = *(const double *) pb;

    return (a > b) - (a < b);
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return (a > b) - (a < b);
}

/* The median of v[0..n) (reordered); 0 when n == 0. */
static double median(double *v, size_t n)
{
    if (n == 0) {
        return 0.0;
    }
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
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

static bool parse_step(const char *s, int64_t *out)
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
static int check_run(PGconn *c, const char *const *params, int64_t run, char *errbuf, size_t errlen)
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
static int load_ranks(PGconn *c, const char *const *params, int64_t run, int **ranks, size_t *n,
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
    if (nr == 0 || nr > KP_CMP_MAX_RANKS) {
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
        (*ranks)[i] = (int) kp_pg_i64(r, (int) i, 0, 0);
    }
    *n = nr;
    PQclear(r);
    return 0;
}

/* ---- kp_cmp_run ----------------------------------------------------------------------- */

/* One breakdown step of one rank. */
struct rstep {
    int64_t num, start, end;
    int64_t host, launch, other;
};

struct rsteps {
    size_t n;
    struct rstep *v; /* by start */
};

/* One collective of one rank: an NCCL kernel (kind 0) or a Gloo op (kind 1). */
struct coll {
    uint32_t ri;   /* rank index */
    uint32_t si;   /* step index */
    uint32_t kind; /* 0 NCCL, 1 Gloo */
    uint32_t idx;  /* order within (rank, step, kind) */
    int64_t start, end;
};

static int cmp_coll_rank(const void *pa, const void *pb)
{
    const struct coll *a = pa, *b = pb;

    if (a->ri != b->ri) {
        return a->ri < b->ri ? -1 : 1;
    }
    if (a->si != b->si) {
        return a->si < b->si ? -1 : 1;
    }
    if (a->kind != b->kind) {
        return a->kind < b->kind ? -1 : 1;
    }
    return (a->start > b->start) - (a->start < b->start);
}

static int cmp_coll_match(const void *pa, const void *pb)
{
    const struct coll *a = pa, *b = pb;

    if (a->si != b->si) {
        return a->si < b->si ? -1 : 1;
    }
    if (a->kind != b->kind) {
        return a->kind < b->kind ? -1 : 1;
    }
    if (a->idx != b->idx) {
        return a->idx < b->idx ? -1 : 1;
    }
    return (a->ri > b->ri) - (a->ri < b->ri);
}

/* Loads one rank's breakdown steps into *rs. */
static int load_rank(PGconn *c, int64_t run, int rank, size_t max_rows, struct rsteps *rs,
                     char *errbuf, size_t errlen)
{
    struct kp_an *a = NULL;
    const struct kp_an_breakdown *b;
    int rc;

    if ((rc = kp_an_load(c, run, rank, max_rows, &a, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((rc = kp_an_breakdown(a, false, &b)) != 0) {
        goto out;
    }
    if ((rs->v = calloc(b->n_steps + 1, sizeof(*rs->v))) == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < b->n_steps; i++) {
        const struct kp_an_step *s = &b->steps[i];
        struct rstep *d = &rs->v[rs->n];

        if (!parse_step(s->name, &d->num)) {
            continue;
        }
        d->start = s->start_ns;
        d->end = s->end_ns;
        d->host = s->cost_ns[KP_AN_DATALOADER] + s->cost_ns[KP_AN_CPU_EXEC];
        d->launch = s->cost_ns[KP_AN_RUNTIME];
        d->other = s->cost_ns[KP_AN_MEMCPY] + s->cost_ns[KP_AN_MEMSET] + s->cost_ns[KP_AN_OTHER];
        rs->n++;
    }
out:
    kp_an_destroy(a);
    return rc;
}

/* The step number of a collective without one: the rank's step holding start, or -1. */
static int64_t step_at(const struct rsteps *rs, int64_t start)
{
    for (size_t i = 0; i < rs->n; i++) {
        if (start >= rs->v[i].start && start < rs->v[i].end) {
            return rs->v[i].num;
        }
    }
    return -1;
}

/* Reads every rank's collectives into *out / *n_out, steps as indices into nums. */
static int load_colls(PGconn *c, const char *const *params, const int *ranks, size_t n_ranks,
                      const struct rsteps *rs, const int64_t *nums, size_t n_nums,
                      struct coll **out, size_t *n_out, char *errbuf, size_t errlen)
{
    static const char sql[] =
        "SELECT rank, step, start_ns, dur_ns, 0 FROM kernels WHERE run_id = $1 AND name = "
        "ANY(ARRAY(SELECT id FROM names WHERE " NCCL_NAMES ")) "
        "UNION ALL SELECT rank, step, start_ns, dur_ns, 1 FROM ops WHERE run_id = $1 AND name = "
        "ANY(ARRAY(SELECT id FROM names WHERE " GLOO_NAMES "))";
    PGresult *r = NULL;
    struct coll *v;
    size_t nr, n = 0;
    int rc = kp_pg_query(c, sql, 1, params, &r, errbuf, errlen);

    if (rc < 0) {
        return rc;
    }
    nr = (size_t) PQntuples(r);
    if ((v = calloc(nr + 1, sizeof(*v))) == NULL) {
        PQclear(r);
        return -ENOMEM;
    }
    for (size_t i = 0; i < nr; i++) {
        int rank = (int) kp_pg_i64(r, (int) i, 0, 0);
        size_t lo = 0, hi = n_ranks;
        int64_t start = kp_pg_i64(r, (int) i, 2, 0), step;
        long si;

        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;

            if (ranks[mid] < rank) {
                lo = mid + 1;
            }
            else {
                hi = mid;
            }
        }
        if (lo >= n_ranks || ranks[lo] != rank) {
            continue;
        }
        step = PQgetisnull(r, (int) i, 1) ? step_at(&rs[lo], start) : kp_pg_i64(r, (int) i, 1, 0);
        if ((si = find_i64(nums, n_nums, step)) < 0) {
            continue;
        }
        v[n].ri = (uint32_t) lo;
        v[n].si = (uint32_t) si;
        v[n].kind = (uint32_t) kp_pg_i64(r, (int) i, 4, 0);
        v[n].start = start;
        v[n].end = start + kp_pg_i64(r, (int) i, 3, 0);
        n++;
    }
    PQclear(r);
    *out = v;
    *n_out = n;
    return 0;
}

/* Appends "{v,v,...}" text to b; returns 0 or -ENOMEM. */
static int arr_add(char **b, size_t *len, size_t *cap, int64_t v, bool first)
{
    if (*cap - *len < 32) {
        size_t nc = *cap * 2 + 64;
        char *nb = realloc(*b, nc);

        if (nb == NULL) {
            return -ENOMEM;
        }
        *b = nb;
        *cap = nc;
    }
    *len += (size_t) snprintf(*b + *len, *cap - *len, "%s%" PRId64, first ? "{" : ",", v);
    return 0;
}

/* Compute time per (rank, step): the sum of the durations of the kernels that are not
 * collectives. A kernel belongs to its row's step, else to the rank's breakdown step holding
 * its start (imports carry no kernel steps). Adds into the cells. */
static int load_compute(PGconn *c, int64_t run, const int *ranks, size_t nr,
                        const struct rsteps *rs, const int64_t *nums, size_t ns,
                        struct kp_cmp_cell *cells, char *errbuf, size_t errlen)
{
    static const char sql[] =
        "WITH nc AS (SELECT ARRAY(SELECT id FROM names WHERE " NCCL_NAMES ") ids), "
        "st AS (SELECT * FROM unnest($2::int[], $3::bigint[], $4::bigint[], $5::bigint[]) "
        "AS st(rank, s, e, num)) "
        "SELECT rank, step, sum(dur_ns) FROM kernels, nc WHERE run_id = $1 AND step IS NOT NULL "
        "AND name <> ALL(nc.ids) GROUP BY rank, step "
        "UNION ALL SELECT k.rank, st.num, sum(k.dur_ns) FROM kernels k JOIN st ON k.rank = "
        "st.rank AND k.start_ns >= st.s AND k.start_ns < st.e, nc WHERE k.run_id = $1 AND "
        "k.step IS NULL AND k.name <> ALL(nc.ids) GROUP BY k.rank, st.num";
    char runs[24], *arr[4] = { NULL, NULL, NULL, NULL };
    size_t len[4] = { 0 }, cap[4] = { 0 }, n = 0;
    const char *params[5] = { runs, NULL, NULL, NULL, NULL };
    PGresult *r = NULL;
    int rc = 0;

    snprintf(runs, sizeof(runs), "%" PRId64, run);
    for (size_t i = 0; i < nr && rc == 0; i++) {
        for (size_t j = 0; j < rs[i].n && rc == 0; j++) {
            const struct rstep *st = &rs[i].v[j];

            rc = arr_add(&arr[0], &len[0], &cap[0], ranks[i], n == 0);
            rc = rc != 0 ? rc : arr_add(&arr[1], &len[1], &cap[1], st->start, n == 0);
            rc = rc != 0 ? rc : arr_add(&arr[2], &len[2], &cap[2], st->end, n == 0);
            rc = rc != 0 ? rc : arr_add(&arr[3], &len[3], &cap[3], st->num, n == 0);
            n++;
        }
    }
    for (int f = 0; f < 4 && rc == 0; f++) {
        if (n == 0) {
            rc = arr_add(&arr[f], &len[f], &cap[f], 0, true); /* make room */
            snprintf(arr[f], cap[f], "{}");
        }
        else {
            arr[f][len[f]++] = '}';
            arr[f][len[f]] = '\0';
        }
        params[f + 1] = arr[f];
    }
    if (rc == 0 && (rc = kp_pg_query(c, sql, 5, params, &r, errbuf, errlen)) == 0) {
        for (int i = 0; i < PQntuples(r); i++) {
            int rank = (int) kp_pg_i64(r, i, 0, 0);
            long si = find_i64(nums, ns, kp_pg_i64(r, i, 1, 0));
            size_t lo = 0, hi = nr;

            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (ranks[mid] < rank) {
                    lo = mid + 1;
                }
                else {
                    hi = mid;
                }
            }
            if (si >= 0 && lo < nr && ranks[lo] == rank) {
                cells[lo * ns + (size_t) si].compute_ns += kp_pg_i64(r, i, 2, 0);
            }
        }
        PQclear(r);
    }
    for (int f = 0; f < 4; f++) {
        free(arr[f]);
    }
    return rc;
}

void kp_cmp_result_destroy(struct kp_cmp_result *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < r->n_stragglers; i++) {
        free(r->stragglers[i].steps);
    }
    free(r->stragglers);
    free(r->cells);
    free(r->steps);
    free(r->ranks);
    free(r);
}

/* Offsets from end times: rank i's median of (end - the reference rank's end) over the
 * collectives both have; colls sorted by cmp_coll_match. */
static int align_clocks(struct kp_cmp_result *res, const struct coll *v, size_t n)
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
        if (v[i].ri == 0) {
            for (size_t k = i + 1; k < j; k++) {
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
        if (v[i].ri == 0) {
            for (size_t k = i + 1; k < j; k++) {
                d[at[v[k].ri] + cnt[v[k].ri]++] = v[k].end - v[i].end;
            }
        }
        i = j;
    }
    for (size_t r = 0; r < nr; r++) {
        res->ranks[r].clock_offset_ns = median_i64(d + at[r], cnt[r]);
    }
    rc = 0;
out:
    free(d);
    free(at);
    free(cnt);
    return rc;
}

/* Lateness of each matched collective: fills the cells' late_ns (the sum over the step's
 * collectives) and max_late_ns, n_coll (decisive collectives: the last rank's lateness is over
 * decisive_frac of the step's median step time; exact ties and jitter do not count) and n_last. */
static void lateness(struct kp_cmp_result *res, const struct coll *v, size_t n)
{
    size_t ns = res->n_steps;

    for (size_t i = 0; i < n;) {
        size_t j = i + 1, n_max = 0, who = 0;
        int64_t first = INT64_MAX, max_late = 0;

        while (j < n && v[j].si == v[i].si && v[j].kind == v[i].kind && v[j].idx == v[i].idx) {
            j++;
        }
        if (j - i < 2) {
            i = j;
            continue;
        }
        for (size_t k = i; k < j; k++) {
            int64_t a = v[k].start - res->ranks[v[k].ri].clock_offset_ns;

            first = a < first ? a : first;
        }
        for (size_t k = i; k < j; k++) {
            int64_t late = v[k].start - res->ranks[v[k].ri].clock_offset_ns - first;
            struct kp_cmp_cell *cl = &res->cells[(size_t) v[k].ri * ns + v[k].si];

            cl->late_ns += (double) late;
            cl->max_late_ns = (double) late > cl->max_late_ns ? (double) late : cl->max_late_ns;
            if (late > max_late) {
                max_late = late;
                n_max = 1;
                who = k;
            }
            else if (late == max_late && late > 0) {
                n_max++;
            }
        }
        if ((double) max_late > KP_CMP_DECISIVE_FRAC * res->steps[v[i].si].step_median_ns) {
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

/* Mean over the straggler's late steps of a cell figure, for rank ri. */
static double mean_over(const struct kp_cmp_result *res, size_t ri,
                        const struct kp_cmp_straggler *s, int cause, bool *any)
{
    double sum = 0.0;
    size_t n = 0;

    for (size_t k = 0; k < s->n_steps; k++) {
        for (size_t j = 0; j < res->n_steps; j++) {
            const struct kp_cmp_cell *cl = &res->cells[ri * res->n_steps + j];

            if (res->steps[j].step != s->steps[k] || !cl->present) {
                continue;
            }
            sum += (double) (cause == KP_CMP_COMPUTE ? cl->compute_ns
                             : cause == KP_CMP_HOST  ? cl->host_ns
                                                     : cl->launch_ns);
            n++;
        }
    }
    *any = n > 0;
    return n > 0 ? sum / (double) n : 0.0;
}

static const char *cause_phrase(enum kp_cmp_cause c)
{
    switch (c) {
    case KP_CMP_COMPUTE:
        return "its compute (GPU kernels) takes";
    case KP_CMP_HOST:
        return "its data loading and host work take";
    default:
        return "its kernel launches (CUDA runtime) take";
    }
}

static void make_verdict(struct kp_cmp_result *res, size_t n_coll_total)
{
    char *v = res->verdict;
    size_t cap = sizeof(res->verdict), len = 0;

    if (res->n_stragglers > 0) {
        for (size_t i = 0; i < res->n_stragglers && len < cap; i++) {
            const struct kp_cmp_straggler *s = &res->stragglers[i];
            size_t rsteps = 0;

            for (size_t r = 0; r < res->n_ranks; r++) {
                if (res->ranks[r].rank == s->rank) {
                    for (size_t j = 0; j < res->n_steps; j++) {
                        rsteps += res->cells[r * res->n_steps + j].present;
                    }
                }
            }
            len += (size_t) snprintf(
                v + len, cap - len,
                "%srank %d %s: it arrives last at the collectives in %zu/%zu steps, %.1f ms late "
                "per step in all (up to %.1f ms at one); %s %.1f ms more than the median rank's",
                i == 0 ? "" : "; ", s->rank,
                res->n_stragglers == 1 ? "is the straggler" : "is a straggler", s->n_steps, rsteps,
                s->late_ns / 1e6, s->max_late_ns / 1e6, cause_phrase(s->cause),
                s->excess_ns[s->cause] / 1e6);
        }
        return;
    }
    if (res->n_ranks < 2) {
        snprintf(v, cap, "no straggler: only 1 rank (rank %d) to compare", res->ranks[0].rank);
        return;
    }
    {
        double lo = INFINITY, hi = 0.0;

        for (size_t r = 0; r < res->n_ranks; r++) {
            lo = res->ranks[r].step_ns < lo ? res->ranks[r].step_ns : lo;
            hi = res->ranks[r].step_ns > hi ? res->ranks[r].step_ns : hi;
        }
        snprintf(v, cap, "no straggler: step times within %.0f%% across %zu ranks%s",
                 res->step_median_ns > 0 ? 100.0 * (hi - lo) / res->step_median_ns : 0.0,
                 res->n_ranks, n_coll_total == 0 ? " (no collectives to compare arrivals at)" : "");
    }
}

int kp_cmp_run(PGconn *c, int64_t run, const struct kp_cmp_opts *o, struct kp_cmp_result **out,
               char *errbuf, size_t errlen)
{
    char runs[24];
    const char *params[1] = { runs };
    int *ranks = NULL;
    size_t n_ranks = 0, n_nums = 0, n_colls = 0, ns, nr;
    struct rsteps *rs = NULL;
    int64_t *nums = NULL;
    struct coll *colls = NULL;
    double *tmp = NULL;
    struct kp_cmp_result *res = NULL;
    int rc;

    *out = NULL;
    if (!(o->late_frac >= 0.0) || !(o->last_frac >= 0.0 && o->last_frac < 1.0) ||
        !(o->step_frac >= 0.0 && o->step_frac <= 1.0)) {
        kp_errbuf_set(errbuf, errlen, "bad thresholds");
        return -EINVAL;
    }
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    if ((rc = check_run(c, params, run, errbuf, errlen)) != 0 ||
        (rc = load_ranks(c, params, run, &ranks, &n_ranks, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rs = calloc(n_ranks, sizeof(*rs))) == NULL) {
        goto nomem;
    }
    for (size_t i = 0; i < n_ranks; i++) {
        if ((rc = load_rank(c, run, ranks[i], o->max_rows, &rs[i], errbuf, errlen)) != 0) {
            goto fail;
        }
        n_nums += rs[i].n;
    }
    /* the steps: every step number any rank has (or the one asked for) */
    if ((nums = calloc(n_nums + 1, sizeof(*nums))) == NULL) {
        goto nomem;
    }
    n_nums = 0;
    for (size_t i = 0; i < n_ranks; i++) {
        for (size_t j = 0; j < rs[i].n; j++) {
            nums[n_nums++] = rs[i].v[j].num;
        }
    }
    qsort(nums, n_nums, sizeof(*nums), cmp_i64);
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
    nr = n_ranks;
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
        res->ranks[r].rank = ranks[r];
        for (size_t j = 0; j < rs[r].n; j++) {
            const struct rstep *s = &rs[r].v[j];
            long si = find_i64(nums, ns, s->num);
            struct kp_cmp_cell *cl;

            if (si < 0) {
                continue;
            }
            cl = &res->cells[r * ns + (size_t) si];
            if (cl->present) { /* a repeated step number: keep the first */
                continue;
            }
            cl->present = true;
            cl->step_ns = s->end - s->start;
            cl->host_ns = s->host;
            cl->launch_ns = s->launch;
            cl->other_ns = s->other;
        }
    }
    for (size_t j = 0; j < ns; j++) {
        res->steps[j].step = nums[j];
        res->steps[j].last_rank = -1;
    }

    if ((rc = load_compute(c, run, ranks, nr, rs, nums, ns, res->cells, errbuf, errlen)) != 0) {
        goto fail;
    }
    /* collectives: order within (rank, step, kind), then matched across ranks */
    if ((rc = load_colls(c, params, ranks, nr, rs, nums, ns, &colls, &n_colls, errbuf, errlen)) !=
        0) {
        goto fail;
    }
    qsort(colls, n_colls, sizeof(*colls), cmp_coll_rank);
    for (size_t i = 0; i < n_colls; i++) {
        const struct coll *p = i > 0 ? &colls[i - 1] : NULL;
        struct kp_cmp_cell *cl = &res->cells[(size_t) colls[i].ri * ns + colls[i].si];

        colls[i].idx =
            (p != NULL && p->ri == colls[i].ri && p->si == colls[i].si && p->kind == colls[i].kind)
                ? p->idx + 1
                : 0;
        cl->coll_ns += colls[i].end - colls[i].start;
    }
    qsort(colls, n_colls, sizeof(*colls), cmp_coll_match);
    if ((rc = align_clocks(res, colls, n_colls)) != 0) {
        goto fail;
    }
    /* per step: spreads */
    for (size_t j = 0; j < ns; j++) {
        struct kp_cmp_step *st = &res->steps[j];
        size_t k = 0;

        for (size_t r = 0; r < nr; r++) {
            const struct kp_cmp_cell *cl = &res->cells[r * ns + j];

            if (cl->present) {
                tmp[k++] = (double) cl->step_ns;
                st->step_max_ns = fmax(st->step_max_ns, (double) cl->step_ns);
                st->coll_max_ns = fmax(st->coll_max_ns, (double) cl->coll_ns);
            }
        }
        st->n_ranks = k;
        st->step_median_ns = median(tmp, k);
        k = 0;
        for (size_t r = 0; r < nr; r++) {
            if (res->cells[r * ns + j].present) {
                tmp[k++] = (double) res->cells[r * ns + j].coll_ns;
            }
        }
        st->coll_median_ns = median(tmp, k);
        st->step_ratio = st->step_median_ns > 0 ? st->step_max_ns / st->step_median_ns : 0.0;
        st->coll_ratio = st->coll_median_ns > 0 ? st->coll_max_ns / st->coll_median_ns : 0.0;
    }
    lateness(res, colls, n_colls);
    /* per step: who is late */
    for (size_t j = 0; j < ns; j++) {
        struct kp_cmp_step *st = &res->steps[j];
        size_t best = 0;

        for (size_t r = 0; r < nr; r++) {
            struct kp_cmp_cell *cl = &res->cells[r * ns + j];

            st->n_coll = cl->n_coll > st->n_coll ? cl->n_coll : st->n_coll;
            if (cl->n_last > best) {
                best = cl->n_last;
                st->last_rank = res->ranks[r].rank;
            }
            cl->late = false;
            if (cl->present && cl->n_coll > 0 &&
                (double) cl->n_last > o->last_frac * (double) cl->n_coll) {
                /* the others wait for it: their median time in collectives over its own */
                size_t k = 0;

                for (size_t q = 0; q < nr; q++) {
                    if (q != r && res->cells[q * ns + j].present) {
                        tmp[k++] = (double) res->cells[q * ns + j].coll_ns;
                    }
                }
                cl->wait_ns = median(tmp, k) - (double) cl->coll_ns;
                cl->late = cl->wait_ns > o->late_frac * st->step_median_ns;
            }
        }
    }

    /* per rank: medians over its steps */
    for (size_t r = 0; r < nr; r++) {
        struct kp_cmp_rank *rk = &res->ranks[r];
        int64_t const *fields[6];
        double *dst[6] = { &rk->step_ns, &rk->coll_ns,   &rk->compute_ns,
                           &rk->host_ns, &rk->launch_ns, &rk->other_ns };
        size_t present = 0;
        double late = 0.0;

        for (int f = 0; f < 6; f++) {
            size_t k = 0;

            for (size_t j = 0; j < ns; j++) {
                const struct kp_cmp_cell *cl = &res->cells[r * ns + j];

                fields[0] = &cl->step_ns;
                fields[1] = &cl->coll_ns;
                fields[2] = &cl->compute_ns;
                fields[3] = &cl->host_ns;
                fields[4] = &cl->launch_ns;
                fields[5] = &cl->other_ns;
                if (cl->present) {
                    tmp[k++] = (double) *fields[f];
                }
            }
            *dst[f] = median(tmp, k);
        }
        for (size_t j = 0; j < ns; j++) {
            const struct kp_cmp_cell *cl = &res->cells[r * ns + j];

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
    res->step_median_ns = median(tmp, nr);
    for (size_t r = 0; r < nr; r++) {
        res->ranks[r].vs_median =
            res->step_median_ns > 0 ? res->ranks[r].step_ns / res->step_median_ns - 1.0 : 0.0;
    }

    /* stragglers: evidence and cause */
    if (res->n_stragglers > 0) {
        size_t k = 0;

        if ((res->stragglers = calloc(res->n_stragglers, sizeof(*res->stragglers))) == NULL) {
            res->n_stragglers = 0;
            goto nomem;
        }
        for (size_t r = 0; r < nr; r++) {
            struct kp_cmp_straggler *s;
            double late = 0.0;

            if (!res->ranks[r].straggler) {
                continue;
            }
            s = &res->stragglers[k++];
            s->rank = res->ranks[r].rank;
            if ((s->steps = calloc(res->ranks[r].n_late_steps, sizeof(*s->steps))) == NULL) {
                goto nomem;
            }
            for (size_t j = 0; j < ns; j++) {
                const struct kp_cmp_cell *cl = &res->cells[r * ns + j];

                if (cl->late) {
                    s->steps[s->n_steps++] = res->steps[j].step;
                    late += cl->late_ns;
                }
            }
            s->late_ns = late / (double) s->n_steps;
            for (size_t j = 0; j < ns; j++) {
                const struct kp_cmp_cell *cl = &res->cells[r * ns + j];

                if (cl->late && cl->max_late_ns > s->max_late_ns) {
                    s->max_late_ns = cl->max_late_ns;
                }
            }
            for (int cause = 0; cause < KP_CMP_CAUSE_COUNT; cause++) {
                size_t m = 0;
                bool any;
                double mine = mean_over(res, r, s, cause, &any);

                for (size_t q = 0; q < nr; q++) {
                    double x = mean_over(res, q, s, cause, &any);

                    if (any) {
                        tmp[m++] = x;
                    }
                }
                s->excess_ns[cause] = mine - median(tmp, m);
                if (s->excess_ns[cause] > s->excess_ns[s->cause]) {
                    s->cause = (enum kp_cmp_cause) cause;
                }
            }
        }
        /* latest first */
        for (size_t a = 1; a < res->n_stragglers; a++) {
            for (size_t b = a; b > 0 && res->stragglers[b].late_ns > res->stragglers[b - 1].late_ns;
                 b--) {
                struct kp_cmp_straggler t = res->stragglers[b];

                res->stragglers[b] = res->stragglers[b - 1];
                res->stragglers[b - 1] = t;
            }
        }
        for (size_t r = 0; r < nr; r++) {
            const struct kp_cmp_rank *s0 = NULL;

            for (size_t q = 0; q < nr; q++) {
                if (res->ranks[q].rank == res->stragglers[0].rank) {
                    s0 = &res->ranks[q];
                }
            }
            res->ranks[r].waits =
                !res->ranks[r].straggler && s0 != NULL &&
                res->ranks[r].coll_ns - s0->coll_ns >= 0.5 * res->stragglers[0].late_ns;
        }
    }
    make_verdict(res, n_colls);
    *out = res;
    res = NULL;
    rc = 0;
    goto out;
nomem:
    rc = -ENOMEM;
    kp_errbuf_set(errbuf, errlen, "out of memory");
fail:
out:
    kp_cmp_result_destroy(res);
    free(tmp);
    free(colls);
    free(nums);
    if (rs != NULL) {
        for (size_t i = 0; i < n_ranks; i++) {
            free(rs[i].v);
        }
    }
    free(rs);
    free(ranks);
    return rc;
}

/* ---- JSON ----------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *) s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\') {
            fprintf(f, "\\%c", *p);
        }
        else if (*p < 0x20) {
            fprintf(f, "\\u%04x", *p);
        }
        else {
            fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x)
{
    if (isfinite(x)) {
        fprintf(f, "%.17g", x);
    }
    else {
        fputs("null", f);
    }
}

struct order_key {
    double step_ns;
    int rank;
    size_t i;
};

static int cmp_order(const void *pa, const void *pb)
{
    const struct order_key *a = pa, *b = pb;

    if (a->step_ns != b->step_ns) {
        return a->step_ns > b->step_ns ? -1 : 1;
    }
    return (a->rank > b->rank) - (a->rank < b->rank);
}

int kp_cmp_order(const struct kp_cmp_result *r, size_t *idx)
{
    struct order_key *k = calloc(r->n_ranks + 1, sizeof(*k));

    if (k == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < r->n_ranks; i++) {
        k[i] = (struct order_key){ r->ranks[i].step_ns, r->ranks[i].rank, i };
    }
    qsort(k, r->n_ranks, sizeof(*k), cmp_order);
    for (size_t i = 0; i < r->n_ranks; i++) {
        idx[i] = k[i].i;
    }
    free(k);
    return 0;
}

const char *kp_cmp_flag(const struct kp_cmp_rank *rk)
{
    return rk->straggler ? "straggler" : rk->waits ? "waits" : "";
}

void kp_cmp_json(FILE *f, const struct kp_cmp_result *r)
{
    size_t *idx = calloc(r->n_ranks + 1, sizeof(*idx));
    bool ordered = idx != NULL && kp_cmp_order(r, idx) == 0;

    fprintf(f, "{\"run\": %" PRId64 ", \"ranks\": [", r->run);
    for (size_t i = 0; i < r->n_ranks; i++) {
        const struct kp_cmp_rank *rk = &r->ranks[i];

        if (ordered) {
            rk = &r->ranks[idx[i]];
        }
        fprintf(f, "%s\n  {\"rank\": %d, \"step_ms\": ", i ? "," : "", rk->rank);
        json_num(f, rk->step_ns / 1e6);
        fputs(", \"vs_median\": ", f);
        json_num(f, 100.0 * rk->vs_median);
        fputs(", \"collective_ms\": ", f);
        json_num(f, rk->coll_ns / 1e6);
        fputs(", \"late_ms\": ", f);
        json_num(f, rk->late_ns / 1e6);
        fputs(", \"compute_ms\": ", f);
        json_num(f, rk->compute_ns / 1e6);
        fputs(", \"host_ms\": ", f);
        json_num(f, rk->host_ns / 1e6);
        fputs(", \"launch_ms\": ", f);
        json_num(f, rk->launch_ns / 1e6);
        fputs(", \"other_ms\": ", f);
        json_num(f, rk->other_ns / 1e6);
        fputs(", \"clock_offset_ms\": ", f);
        json_num(f, (double) rk->clock_offset_ns / 1e6);
        fprintf(f, ", \"late_steps\": %zu, \"flag\": ", rk->n_late_steps);
        json_str(f, kp_cmp_flag(rk));
        fputc('}', f);
    }
    fputs("],\n \"steps\": [", f);
    for (size_t j = 0; j < r->n_steps; j++) {
        const struct kp_cmp_step *s = &r->steps[j];

        fprintf(f, "%s\n  {\"step\": %" PRId64 ", \"ranks\": %zu, \"collectives\": %zu",
                j ? "," : "", s->step, s->n_ranks, s->n_coll);
        fputs(", \"step_median_ms\": ", f);
        json_num(f, s->step_median_ns / 1e6);
        fputs(", \"step_max_ms\": ", f);
        json_num(f, s->step_max_ns / 1e6);
        fputs(", \"step_ratio\": ", f);
        json_num(f, s->step_ratio);
        fputs(", \"collective_median_ms\": ", f);
        json_num(f, s->coll_median_ns / 1e6);
        fputs(", \"collective_max_ms\": ", f);
        json_num(f, s->coll_max_ns / 1e6);
        fputs(", \"collective_ratio\": ", f);
        json_num(f, s->coll_ratio);
        fputs(", \"last_rank\": ", f);
        if (s->last_rank >= 0) {
            fprintf(f, "%d", s->last_rank);
        }
        else {
            fputs("null", f);
        }
        fputc('}', f);
    }
    fputs("],\n \"stragglers\": [", f);
    for (size_t i = 0; i < r->n_stragglers; i++) {
        const struct kp_cmp_straggler *s = &r->stragglers[i];

        fprintf(f, "%s\n  {\"rank\": %d, \"steps\": [", i ? "," : "", s->rank);
        for (size_t k = 0; k < s->n_steps; k++) {
            fprintf(f, "%s%" PRId64, k ? ", " : "", s->steps[k]);
        }
        fputs("], \"late_ms\": ", f);
        json_num(f, s->late_ns / 1e6);
        fputs(", \"max_late_ms\": ", f);
        json_num(f, s->max_late_ns / 1e6);
        fputs(", \"cause\": ", f);
        json_str(f, kp_cmp_cause_names[s->cause]);
        fputs(", \"excess_ms\": ", f);
        json_num(f, s->excess_ns[s->cause] / 1e6);
        fputs(", \"excess_ms_by_cause\": {", f);
        for (int c = 0; c < KP_CMP_CAUSE_COUNT; c++) {
            fprintf(f, "%s\"%s\": ", c ? ", " : "", kp_cmp_cause_names[c]);
            json_num(f, s->excess_ns[c] / 1e6);
        }
        fputs("}}", f);
    }
    fputs("],\n \"verdict\": ", f);
    json_str(f, r->verdict);
    fputs("}\n", f);
    free(idx);
}

/* ---- HTA's metric --------------------------------------------------------------------- */

struct hstep {
    int rank;
    int64_t num, start, end;
};

static int cmp_hstep(const void *pa, const void *pb)
{
    const struct hstep *a = pa, *b = pb;

    if (a->rank != b->rank) {
        return a->rank < b->rank ? -1 : 1;
    }
    return (a->start > b->start) - (a->start < b->start);
}

/* A candidate kernel, kept last per (rank, stream, step, name). */
struct hcand {
    int rank, stream;
    int64_t step, start, dur;
    char *name;
};

void kp_cmp_hta_destroy(struct kp_cmp_hta *h)
{
    if (h == NULL) {
        return;
    }
    free(h->collective);
    free(h->rows);
    free(h->stragglers);
    free(h);
}

/* Appends "{a,b,...}" of n int64 values (or ints) to a string buffer of cap bytes. */
static int pg_array(char **out, size_t n, const struct hstep *st, int field)
{
    size_t cap = 24 * n + 3, len = 0;
    char *b = malloc(cap);

    if (b == NULL) {
        return -ENOMEM;
    }
    b[len++] = '{';
    for (size_t i = 0; i < n; i++) {
        int64_t v = field == 0   ? st[i].rank
                    : field == 1 ? st[i].start
                    : field == 2 ? st[i].end
                                 : st[i].num;

        len += (size_t) snprintf(b + len, cap - len, "%s%" PRId64, i ? "," : "", v);
    }
    b[len++] = '}';
    b[len] = '\0';
    *out = b;
    return 0;
}

int kp_cmp_hta(PGconn *c, int64_t run, bool has_step, int64_t step, int num_candidates,
               struct kp_cmp_hta **out, char *errbuf, size_t errlen)
{
    /* the chosen steps as (rank, start, end, num) arrays */
#define HTA_STEPS                                                                                 \
    "WITH st AS (SELECT * FROM unnest($2::int[], $3::bigint[], $4::bigint[], $5::bigint[]) "      \
    "AS st(rank, s, e, num)), rt AS (SELECT a.rank, a.correlation, st.num FROM api_calls a JOIN " \
    "st ON a.rank = st.rank AND a.start_ns >= st.s AND a.start_ns < st.e WHERE a.run_id = $1 "    \
    "AND a.correlation IS NOT NULL) "
    static const char sql_end[] = HTA_STEPS
        "SELECT max(x) FROM (SELECT max(o.start_ns + o.dur_ns) x FROM ops o JOIN st ON o.rank = "
        "st.rank AND o.start_ns >= st.s AND o.start_ns < st.e WHERE o.run_id = $1 "
        "UNION ALL SELECT max(a.start_ns + a.dur_ns) FROM api_calls a JOIN st ON a.rank = st.rank "
        "AND a.start_ns >= st.s AND a.start_ns < st.e WHERE a.run_id = $1 "
        "UNION ALL SELECT max(k.start_ns + k.dur_ns) FROM kernels k JOIN rt ON k.rank = rt.rank "
        "AND k.correlation = rt.correlation WHERE k.run_id = $1 AND k.stream >= 0 "
        "UNION ALL SELECT max(k.start_ns + k.dur_ns) FROM memcpys k JOIN rt ON k.rank = rt.rank "
        "AND k.correlation = rt.correlation WHERE k.run_id = $1 AND k.stream >= 0 "
        "UNION ALL SELECT max(k.start_ns + k.dur_ns) FROM memsets k JOIN rt ON k.rank = rt.rank "
        "AND k.correlation = rt.correlation WHERE k.run_id = $1 AND k.stream >= 0) z";
    static const char sql_cand[] =
        HTA_STEPS "SELECT k.rank, k.stream, rt.num, k.start_ns, k.dur_ns, n.name FROM kernels k "
                  "JOIN rt ON k.rank = rt.rank AND k.correlation = rt.correlation JOIN names n ON "
                  "n.id = k.name WHERE k.run_id = $1 AND k.stream > 0 AND n.name LIKE "
                  "'ncclKernel%' ORDER BY k.rank, k.start_ns";
#undef HTA_STEPS
    char runs[24];
    const char *params[5] = { runs, NULL, NULL, NULL, NULL };
    PGresult *r = NULL;
    struct hstep *st = NULL;
    struct hcand *cand = NULL;
    struct kp_cmp_hta *h = NULL;
    size_t n_st = 0, n_cand = 0, n_steps_distinct = 0, nr;
    int64_t t_min = INT64_MAX, t_max;
    int64_t *nums = NULL;
    double *sd = NULL, best = -1.0;
    size_t best_i = 0;
    int *cnt_rank = NULL;
    size_t *cnt = NULL;
    int rc;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    if ((rc = check_run(c, params, run, errbuf, errlen)) != 0) {
        return rc;
    }
    rc = kp_pg_query(
        c,
        "SELECT o.rank, o.start_ns, o.start_ns + o.dur_ns, substr(n.name, 14) FROM ops o "
        "JOIN names n ON n.id = o.name WHERE o.run_id = $1 AND n.name LIKE "
        "'ProfilerStep#%'",
        1, params, &r, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    nr = (size_t) PQntuples(r);
    if ((st = calloc(nr + 1, sizeof(*st))) == NULL ||
        (nums = calloc(nr + 1, sizeof(*nums))) == NULL) {
        goto nomem;
    }
    for (size_t i = 0; i < nr; i++) {
        st[n_st].rank = (int) kp_pg_i64(r, (int) i, 0, 0);
        st[n_st].start = kp_pg_i64(r, (int) i, 1, 0);
        st[n_st].end = kp_pg_i64(r, (int) i, 2, 0);
        if (parse_step(PQgetvalue(r, (int) i, 3), &st[n_st].num)) {
            nums[n_st] = st[n_st].num;
            n_st++;
        }
    }
    PQclear(r);
    r = NULL;
    qsort(nums, n_st, sizeof(*nums), cmp_i64);
    for (size_t i = 0; i < n_st; i++) {
        n_steps_distinct += i == 0 || nums[i] != nums[i - 1];
    }
    qsort(st, n_st, sizeof(*st), cmp_hstep);
    {
        /* drop each rank's last step (by start) when there are 2+ step names; pick `step` */
        size_t k = 0;

        for (size_t i = 0; i < n_st; i++) {
            bool last = i + 1 == n_st || st[i + 1].rank != st[i].rank;

            if ((n_steps_distinct >= 2 && last) || (has_step && st[i].num != step)) {
                continue;
            }
            st[k++] = st[i];
        }
        n_st = k;
    }
    {
        size_t n_r = 0;

        for (size_t i = 0; i < n_st; i++) {
            n_r += i == 0 || st[i].rank != st[i - 1].rank;
            t_min = st[i].start < t_min ? st[i].start : t_min;
        }
        if (n_r < 2) {
            kp_errbuf_set(errbuf, errlen,
                          "HTA's straggler metric needs 2 or more ranks with ProfilerStep ranges "
                          "in the chosen steps (run %" PRId64 " has %zu)",
                          run, n_r);
            rc = KP_ENOTFOUND;
            goto fail;
        }
    }
    for (int f = 0; f < 4; f++) {
        if ((rc = pg_array((char **) &params[f + 1], n_st, st, f)) != 0) {
            goto nomem;
        }
    }
    if ((rc = kp_pg_query(c, sql_end, 5, params, &r, errbuf, errlen)) < 0) {
        goto fail;
    }
    t_max = kp_pg_i64(r, 0, 0, 0);
    PQclear(r);
    r = NULL;
    {
        /* mean step time: (latest end - t_min) / steps */
        size_t n_num = 0;

        for (size_t i = 0; i < n_st; i++) {
            nums[i] = st[i].num;
        }
        qsort(nums, n_st, sizeof(*nums), cmp_i64);
        for (size_t i = 0; i < n_st; i++) {
            n_num += i == 0 || nums[i] != nums[i - 1];
        }
        if ((h = calloc(1, sizeof(*h))) == NULL) {
            goto nomem;
        }
        h->mean_step_ns = (double) (t_max - t_min) / (double) n_num;
    }
    if ((rc = kp_pg_query(c, sql_cand, 5, params, &r, errbuf, errlen)) < 0) {
        goto fail;
    }
    nr = (size_t) PQntuples(r);
    if ((cand = calloc(nr + 1, sizeof(*cand))) == NULL) {
        goto nomem;
    }
    for (size_t i = 0; i < nr; i++) {
        struct hcand x = { (int) kp_pg_i64(r, (int) i, 0, 0), (int) kp_pg_i64(r, (int) i, 1, 0),
                           kp_pg_i64(r, (int) i, 2, 0),       kp_pg_i64(r, (int) i, 3, 0),
                           kp_pg_i64(r, (int) i, 4, 0),       PQgetvalue(r, (int) i, 5) };
        size_t j;

        if (x.step <= 0 || (double) x.dur < 0.01 * h->mean_step_ns) { /* HTA: iteration > 0 */
            continue;
        }
        for (j = 0; j < n_cand; j++) { /* the last per (rank, stream, step, name) */
            if (cand[j].rank == x.rank && cand[j].stream == x.stream && cand[j].step == x.step &&
                strcmp(cand[j].name, x.name) == 0) {
                break;
            }
        }
        cand[j] = x;
        n_cand += j == n_cand;
    }
    if (n_cand == 0) {
        kp_errbuf_set(errbuf, errlen,
                      "HTA's straggler metric found no ncclKernel* kernel lasting 1%% of the mean "
                      "step in run %" PRId64,
                      run);
        rc = KP_ENOTFOUND;
        goto fail;
    }
    /* per (stream, name): mean over steps of the std (ddof 1) across ranks of dur' */
    if ((sd = calloc(n_cand, sizeof(*sd))) == NULL ||
        (cnt = calloc(n_cand, sizeof(*cnt))) == NULL) {
        goto nomem;
    }
    for (size_t i = 0; i < n_cand; i++) {
        double sum = 0.0, sq = 0.0, nsteps = 0.0, acc = 0.0;
        bool seen = false;

        for (size_t j = 0; j < i && !seen; j++) {
            seen = cand[j].stream == cand[i].stream && strcmp(cand[j].name, cand[i].name) == 0;
        }
        if (seen) {
            continue;
        }
        /* each step of this (stream, name) */
        for (size_t j = 0; j < n_cand; j++) {
            size_t n = 0;
            bool first = true;

            if (cand[j].stream != cand[i].stream || strcmp(cand[j].name, cand[i].name) != 0) {
                continue;
            }
            for (size_t k = 0; k < j && first; k++) {
                first = !(cand[k].stream == cand[i].stream && cand[k].step == cand[j].step &&
                          strcmp(cand[k].name, cand[i].name) == 0);
            }
            if (!first) {
                continue;
            }
            sum = sq = 0.0;
            for (size_t k = 0; k < n_cand; k++) {
                if (cand[k].stream == cand[i].stream && cand[k].step == cand[j].step &&
                    strcmp(cand[k].name, cand[i].name) == 0) {
                    double d = (double) cand[k].dur / h->mean_step_ns;

                    sum += d;
                    sq += d * d;
                    n++;
                }
            }
            if (n >= 2) {
                double m = sum / (double) n;

                acc += sqrt(fmax(0.0, (sq - (double) n * m * m) / (double) (n - 1)));
                nsteps += 1.0;
            }
        }
        sd[i] = nsteps > 0 ? acc / nsteps : -1.0;
        if (sd[i] > best) {
            best = sd[i];
            best_i = i;
        }
    }
    if ((h->collective = strdup(cand[best_i].name)) == NULL ||
        (h->rows = calloc(n_cand, sizeof(*h->rows))) == NULL ||
        (cnt_rank = calloc(n_cand, sizeof(*cnt_rank))) == NULL ||
        (h->stragglers = calloc(n_cand, sizeof(*h->stragglers))) == NULL) {
        goto nomem;
    }
    h->stream = cand[best_i].stream;
    for (size_t k = 0; k < n_cand; k++) {
        if (cand[k].stream == h->stream && strcmp(cand[k].name, h->collective) == 0) {
            struct kp_cmp_hta_row *w = &h->rows[h->n_rows++];

            w->rank = cand[k].rank;
            w->step = cand[k].step;
            w->start_ns = cand[k].start - t_min;
            w->dur_ns = cand[k].dur;
            w->norm_start = (double) w->start_ns / h->mean_step_ns;
            w->norm_dur = (double) w->dur_ns / h->mean_step_ns;
        }
    }
    /* order the metric by step, then rank */
    for (size_t a = 1; a < h->n_rows; a++) {
        for (size_t b = a; b > 0 && (h->rows[b].step < h->rows[b - 1].step ||
                                     (h->rows[b].step == h->rows[b - 1].step &&
                                      h->rows[b].rank < h->rows[b - 1].rank));
             b--) {
            struct kp_cmp_hta_row t = h->rows[b];

            h->rows[b] = h->rows[b - 1];
            h->rows[b - 1] = t;
        }
    }
    /* per step: flag ranks whose metric >= the k-th largest; count flags per rank */
    memset(cnt, 0, n_cand * sizeof(*cnt));
    {
        size_t n_rk = 0;

        for (size_t a = 0; a < h->n_rows;) {
            size_t b = a, m = 0;
            double *vals = sd; /* reuse: n_cand >= rows of one step */
            double kth;

            while (b < h->n_rows && h->rows[b].step == h->rows[a].step) {
                vals[m++] = h->rows[b].norm_start;
                b++;
            }
            qsort(vals, m, sizeof(*vals), cmp_double);
            kth = vals[m >= (size_t) num_candidates ? m - (size_t) num_candidates : 0];
            for (size_t k = a; k < b; k++) {
                size_t q;

                if (h->rows[k].norm_start < kth) {
                    continue;
                }
                for (q = 0; q < n_rk && cnt_rank[q] != h->rows[k].rank; q++) {
                }
                if (q == n_rk) {
                    cnt_rank[n_rk++] = h->rows[k].rank;
                }
                cnt[q]++;
            }
            a = b;
        }
        /* top k by count, ties by rank */
        for (size_t a = 1; a < n_rk; a++) {
            for (size_t b = a; b > 0 && (cnt[b] > cnt[b - 1] ||
                                         (cnt[b] == cnt[b - 1] && cnt_rank[b] < cnt_rank[b - 1]));
                 b--) {
                size_t tc = cnt[b];
                int tr = cnt_rank[b];

                cnt[b] = cnt[b - 1];
                cnt_rank[b] = cnt_rank[b - 1];
                cnt[b - 1] = tc;
                cnt_rank[b - 1] = tr;
            }
        }
        for (size_t a = 0; a < n_rk && a < (size_t) num_candidates; a++) {
            h->stragglers[h->n_stragglers++] = cnt_rank[a];
        }
    }
    *out = h;
    h = NULL;
    rc = 0;
    goto out;
nomem:
    rc = -ENOMEM;
    kp_errbuf_set(errbuf, errlen, "out of memory");
fail:
out:
    PQclear(r);
    for (int f = 1; f < 5; f++) {
        free((char *) params[f]);
    }
    kp_cmp_hta_destroy(h);
    free(cnt_rank);
    free(cnt);
    free(sd);
    free(cand);
    free(nums);
    free(st);
    return rc;
}

void kp_cmp_hta_json(FILE *f, const struct kp_cmp_hta *h)
{
    fputs("{\"collective\": ", f);
    json_str(f, h->collective);
    fprintf(f, ", \"stream\": %d, \"mean_step_ms\": ", h->stream);
    json_num(f, h->mean_step_ns / 1e6);
    fputs(", \"metric\": [", f);
    for (size_t i = 0; i < h->n_rows; i++) {
        const struct kp_cmp_hta_row *w = &h->rows[i];

        fprintf(f, "%s\n  {\"rank\": %d, \"step\": %" PRId64 ", \"ts_us\": ", i ? "," : "", w->rank,
                w->step);
        json_num(f, (double) w->start_ns / 1e3);
        fputs(", \"dur_us\": ", f);
        json_num(f, (double) w->dur_ns / 1e3);
        fputs(", \"normalized_start_time\": ", f);
        json_num(f, w->norm_start);
        fputs(", \"duration\": ", f);
        json_num(f, w->norm_dur);
        fputc('}', f);
    }
    fputs("],\n \"stragglers\": [", f);
    for (size_t i = 0; i < h->n_stragglers; i++) {
        fprintf(f, "%s%d", i ? ", " : "", h->stragglers[i]);
    }
    fputs("]}\n", f);
}
