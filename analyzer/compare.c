/*
 * kp_compare: the cross-rank comparison (docs/specs/compare.md). kp_compare_result_create reads the
 * whole run in one pass over each event table (PostgreSQL sums per rank and step; the collectives
 * come back as rows), matches the collectives across ranks by order within the step, aligns the
 * clocks from their end times and applies the straggler rule. kp_compare_hta_create is HTA's
 * metric, apart.
 */
#include "compare_int.h"

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

int kp__compare_double(const void *pa, const void *pb)
{
    double a = *(const double *) pa, b = *(const double *) pb;

    return (a > b) - (a < b);
}

int kp__compare_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return (a > b) - (a < b);
}

/* The median of v[0..n) (reordered); 0 when n == 0. */
double kp__compare_median(double *v, size_t n)
{
    if (n == 0) {
        return 0.0;
    }
    qsort(v, n, sizeof(*v), kp__compare_double);
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
    qsort(v, n, sizeof(*v), kp__compare_i64);
    return n % 2 ? v[n / 2] : v[n / 2 - 1] + (v[n / 2] - v[n / 2 - 1]) / 2;
}

/* Index of x in sorted v[0..n), or -1. */
long kp__compare_find_i64(const int64_t *v, size_t n, int64_t x)
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

bool kp__compare_parse_step(const char *s, int64_t *out)
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
int kp__compare_check_run(PGconn *c, const char *const *params, int64_t run, char *errbuf,
                          size_t errlen)
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
        med = kp__compare_median(tmp, j - i);
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
        st->step_median_ns = kp__compare_median(tmp, k);
        k = 0;
        for (size_t r = 0; r < nr; r++) {
            if (res->cells[r * ns + j].present) {
                tmp[k++] = (double) res->cells[r * ns + j].coll_ns;
            }
        }
        st->coll_median_ns = kp__compare_median(tmp, k);
        st->step_ratio = st->step_median_ns > 0 ? st->step_max_ns / st->step_median_ns : 0.0;
        st->coll_ratio = st->coll_median_ns > 0 ? st->coll_max_ns / st->coll_median_ns : 0.0;
        for (int cause = 0; cause < KP_COMPARE_CAUSE_COUNT; cause++) {
            double m;

            k = 0;
            for (size_t r = 0; r < nr; r++) {
                if (res->cells[r * ns + j].present) {
                    tmp[k++] = (double) kp__compare_cell_cause(&res->cells[r * ns + j], cause);
                }
            }
            m = kp__compare_median(tmp, k);
            for (size_t r = 0; r < nr; r++) {
                struct kp_compare_cell *cl = &res->cells[r * ns + j];

                cl->excess_ns[cause] =
                    cl->present ? (double) kp__compare_cell_cause(cl, cause) - m : 0.0;
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
        qsort(tmp, k, sizeof(*tmp), kp__compare_double);
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
            *dst[f] = kp__compare_median(tmp, k);
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
    res->step_median_ns = kp__compare_median(tmp, nr);
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
                    s->own_ns[cause] += (double) kp__compare_cell_cause(cl, cause);
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
        const struct kp_compare_rank *s0 = kp__compare_rank_of(res, res->stragglers[0].rank);

        for (size_t r = 0; r < nr; r++) {
            res->ranks[r].waits =
                !res->ranks[r].straggler && s0 != NULL &&
                res->ranks[r].coll_ns - s0->coll_ns >= 0.5 * res->stragglers[0].late_ns;
        }
    }
    return 0;
}

/* The step numbers of a run's ranks, as kp_compare_result_create's phases share them. */
struct cmp_steps {
    int64_t *nums; /* every step number read, sorted; then the compared steps first */
    size_t n_nums; /* step numbers read */
    size_t ns;     /* steps compared */
    int64_t *all;  /* every distinct step number */
    size_t n_all;
    size_t *step_nr; /* by all's index: how many ranks have that step */
};

/* The steps: every step number any rank has (or the one asked for), and how many ranks have
 * each. Returns 0, -ENOMEM, KP_ENOTFOUND (errbuf says which steps there are). */
static int cmp_collect_steps(const struct cmp_load *L, const struct kp_compare_opts *o, int64_t run,
                             struct cmp_steps *S, char *errbuf, size_t errlen)
{
    size_t *seen_by = NULL;

    for (size_t i = 0; i < L->n_ranks; i++) {
        S->n_nums += L->rs[i].n;
    }
    if ((S->nums = calloc(S->n_nums + 1, sizeof(*S->nums))) == NULL) {
        return -ENOMEM;
    }
    S->n_nums = 0;
    for (size_t i = 0; i < L->n_ranks; i++) {
        for (size_t j = 0; j < L->rs[i].n; j++) {
            S->nums[S->n_nums++] = L->rs[i].v[j].num;
        }
    }
    qsort(S->nums, S->n_nums, sizeof(*S->nums), kp__compare_i64);
    if ((S->all = calloc(S->n_nums + 1, sizeof(*S->all))) == NULL ||
        (S->step_nr = calloc(S->n_nums + 1, sizeof(*S->step_nr))) == NULL ||
        (seen_by = calloc(S->n_nums + 1, sizeof(*seen_by))) == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < S->n_nums; i++) {
        if (i == 0 || S->nums[i] != S->nums[i - 1]) {
            S->all[S->n_all++] = S->nums[i];
        }
    }
    for (size_t i = 0; i < L->n_ranks; i++) { /* the ranks having each step */
        for (size_t j = 0; j < L->rs[i].n; j++) {
            long a = kp__compare_find_i64(S->all, S->n_all, L->rs[i].v[j].num);

            if (seen_by[a] != i + 1) { /* a repeated step number counts once */
                seen_by[a] = i + 1;
                S->step_nr[a]++;
            }
        }
    }
    free(seen_by);
    for (size_t i = 0; i < S->n_nums; i++) {
        if ((i == 0 || S->nums[i] != S->nums[i - 1]) && (!o->has_step || S->nums[i] == o->step)) {
            S->nums[S->ns++] = S->nums[i];
        }
    }
    if (S->ns > 0) {
        return 0;
    }
    if (o->has_step && S->n_nums > 0) {
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " has no step %" PRId64 ": its steps are %" PRId64
                      "..%" PRId64,
                      run, o->step, S->nums[0], S->nums[S->n_nums - 1]);
    }
    else {
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " has no steps with GPU work to compare: capture steps "
                      "(kprofctl start --steps N) or import ProfilerStep ranges",
                      run);
    }
    return KP_ENOTFOUND;
}

/* An empty result for L's ranks and S's compared steps; NULL on ENOMEM. */
static struct kp_compare_result *cmp_result_new(const struct cmp_load *L, const struct cmp_steps *S,
                                                int64_t run)
{
    struct kp_compare_result *res = calloc(1, sizeof(*res));
    size_t nr = L->n_ranks, ns = S->ns;

    if (res == NULL || (res->ranks = calloc(nr, sizeof(*res->ranks))) == NULL ||
        (res->steps = calloc(ns, sizeof(*res->steps))) == NULL ||
        (res->cells = calloc(nr * ns, sizeof(*res->cells))) == NULL) {
        kp_compare_result_destroy(res);
        return NULL;
    }
    res->run = run;
    res->n_ranks = nr;
    res->n_steps = ns;
    for (size_t r = 0; r < nr; r++) {
        res->ranks[r].rank = (int) L->ranks[r];
        res->ranks[r].node = res->ranks[r].local_rank = -1;
    }
    res->waited_for = res->hta_rank = -1;
    for (size_t j = 0; j < ns; j++) {
        res->steps[j].step = S->nums[j];
        res->steps[j].last_rank = -1;
    }
    return res;
}

/* From the filled cells and the collectives to the verdict; -ENOMEM. */
static int cmp_compute(struct kp_compare_result *res, const struct kp_compare_opts *o,
                       struct coll *colls, size_t n_colls, const size_t *step_nr, double *tmp)
{
    /* collectives of every step: order within (rank, step, kind), then matched across ranks;
     * the clocks aligned over all of them, then only the compared steps' kept */
    number_colls(colls, n_colls);
    qsort(colls, n_colls, sizeof(*colls), cmp_coll_match);
    if (align_clocks(res, colls, n_colls, step_nr) != 0) {
        return -ENOMEM;
    }
    n_colls = keep_compared(res, colls, n_colls);
    step_spreads(res, tmp);
    lateness(res, colls, n_colls, tmp);
    late_cells(res, o, tmp);
    rank_medians(res, o, tmp);
    if (straggler_evidence(res) != 0) {
        return -ENOMEM;
    }
    kp__compare_who_waits(res, o);
    kp__compare_make_verdict(res, o, n_colls);
    return 0;
}

int kp_compare_result_create(PGconn *c, int64_t run, const struct kp_compare_opts *o,
                             struct kp_compare_result **out, char *errbuf, size_t errlen)
{
    char runs[24];
    const char *params[1] = { runs };
    struct cmp_load L;
    struct cmp_steps S = { 0 };
    size_t n_colls = 0, nr;
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
    if ((rc = kp__compare_check_run(c, params, run, errbuf, errlen)) != 0 ||
        (rc = kp__compare_load_ranks(c, params, run, &L.ranks, &L.n_ranks, errbuf, errlen)) != 0 ||
        (rc = kp__compare_load_run(c, runs, run, o->max_rows, &L, errbuf, errlen)) != 0) {
        goto fail;
    }
    rc = cmp_collect_steps(&L, o, run, &S, errbuf, errlen);
    if (rc == -ENOMEM) {
        goto nomem;
    }
    if (rc != 0) {
        goto fail;
    }
    nr = L.n_ranks;
    if ((res = cmp_result_new(&L, &S, run)) == NULL ||
        (tmp = calloc((nr > S.ns ? nr : S.ns) + 1, sizeof(*tmp))) == NULL) {
        goto nomem;
    }
    if ((rc = kp__compare_load_world(c, params, res, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = kp__compare_fill_cells(c, runs, &L, res, S.nums, S.all, S.n_all, o->max_rows, &colls,
                                     &n_colls, errbuf, errlen)) != 0) {
        goto fail;
    }
    if (cmp_compute(res, o, colls, n_colls, S.step_nr, tmp) != 0) {
        goto nomem;
    }
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
    free(S.nums);
    free(S.all);
    free(S.step_nr);
    kp__compare_load_fini(&L);
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
