/* kp_compare_hta_create: HTA's straggler metric on HTA's own terms (docs/specs/compare.md §9,
 * docs/specs/hta-analyses.md §9). */
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

/* Appends "{a,b,...}" of the steps' field (0 rank, 1 start, 2 end, 3 num) to sb. */
static int steps_array(struct kp_strbuf *sb, size_t n, const struct hstep *st, int field)
{
    int rc = kp_pg_array_open(sb);

    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = kp_pg_array_i64(sb, field == 0   ? st[i].rank
                                 : field == 1 ? st[i].start
                                 : field == 2 ? st[i].end
                                              : st[i].num);
    }
    return rc != 0 ? rc : kp_pg_array_close(sb);
}

/* The candidates of r (sql_cand's rows) that HTA keeps into cand: a step > 0, lasting 1% of
 * the mean step or more, the last one per (rank, stream, step, name). Returns how many. */
static size_t read_candidates(const PGresult *r, double mean_step_ns, struct hcand *cand)
{
    size_t nr = (size_t) PQntuples(r), n_cand = 0;

    for (size_t i = 0; i < nr; i++) {
        struct hcand x = { (int) kp_pg_i64(r, (int) i, 0, 0), (int) kp_pg_i64(r, (int) i, 1, 0),
                           kp_pg_i64(r, (int) i, 2, 0),       kp_pg_i64(r, (int) i, 3, 0),
                           kp_pg_i64(r, (int) i, 4, 0),       PQgetvalue(r, (int) i, 5) };
        size_t j;

        if (x.step <= 0 || (double) x.dur < 0.01 * mean_step_ns) { /* HTA: iteration > 0 */
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
    return n_cand;
}

/* The collective HTA picks: per (stream, name), the mean over steps of the std (ddof 1) across
 * ranks of dur / mean step, the largest (sd[i] for each first candidate of its (stream, name),
 * -1 where no step has 2 ranks). Returns its candidate's index. */
static size_t pick_collective(const struct hcand *cand, size_t n_cand, double mean_step_ns,
                              double *sd)
{
    double best = -1.0;
    size_t best_i = 0;

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
                    double d = (double) cand[k].dur / mean_step_ns;

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
    return best_i;
}

/* h's rows: the picked collective's candidates, by step then rank, start relative to t_min.
 * h->rows has room for n_cand. */
static void metric_rows(struct kp_compare_hta *h, const struct hcand *cand, size_t n_cand,
                        size_t best_i, int64_t t_min)
{
    h->stream = cand[best_i].stream;
    for (size_t k = 0; k < n_cand; k++) {
        if (cand[k].stream == h->stream && strcmp(cand[k].name, h->collective) == 0) {
            struct kp_compare_hta_row *w = &h->rows[h->n_rows++];

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
            struct kp_compare_hta_row t = h->rows[b];

            h->rows[b] = h->rows[b - 1];
            h->rows[b - 1] = t;
        }
    }
}

/* Per step, flags the ranks whose metric is at least the num_candidates-th largest, counts the
 * flags per rank (cnt, cnt_rank: n_cand each; sd reused as scratch) and keeps the top
 * num_candidates by count, ties by rank, as h's stragglers. */
static void flag_stragglers(struct kp_compare_hta *h, int num_candidates, double *sd, size_t *cnt,
                            int *cnt_rank, size_t n_cand)
{
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
            qsort(vals, m, sizeof(*vals), kp__compare_double);
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
}

/* HTA's queries over the chosen steps, given as (rank, start, end, num) arrays: the latest end
 * of the steps' work, and the candidate collectives (NCCL kernels launched in them). */
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

/* Drops each rank's last step (by start; st sorted by rank, start) when drop_last, as HTA
 * does when there are 2+ step names, and keeps only step `step` when has_step. Returns how
 * many steps are left at the front of st. */
static size_t keep_steps(struct hstep *st, size_t n_st, bool drop_last, bool has_step, int64_t step)
{
    size_t k = 0;

    for (size_t i = 0; i < n_st; i++) {
        bool last = i + 1 == n_st || st[i + 1].rank != st[i].rank;

        if ((drop_last && last) || (has_step && st[i].num != step)) {
            continue;
        }
        st[k++] = st[i];
    }
    return k;
}

/* What kp_compare_hta_create's phases share. */
struct hta_cmp {
    PGconn *c;
    const char **params; /* run, then the four step arrays */
    int64_t run;
    bool has_step;
    int64_t step;
    struct hstep *st; /* the steps kept, by rank and start */
    size_t n_st;
    int64_t *nums;           /* scratch: step numbers */
    size_t n_steps_all;      /* ProfilerStep ranges read */
    size_t n_steps_distinct; /* step numbers among them */
    int64_t t_min;           /* the first kept step's start */
    char *errbuf;
    size_t errlen;
};

static int hcmp_nomem(struct hta_cmp *x)
{
    kp_errbuf_set(x->errbuf, x->errlen, "out of memory");
    return -ENOMEM;
}

/* The run's ProfilerStep ranges into x->st, the ones HTA keeps (keep_steps). */
static int hcmp_read_steps(struct hta_cmp *x)
{
    PGresult *r = NULL;
    size_t nr;
    int rc;

    rc = kp_pg_query(
        x->c,
        "SELECT o.rank, o.start_ns, o.start_ns + o.dur_ns, substr(n.name, 14) FROM ops o "
        "JOIN names n ON n.id = o.name WHERE o.run_id = $1 AND n.name LIKE "
        "'ProfilerStep#%'",
        1, x->params, &r, x->errbuf, x->errlen);
    if (rc < 0) {
        return rc;
    }
    nr = (size_t) PQntuples(r);
    if ((x->st = calloc(nr + 1, sizeof(*x->st))) == NULL ||
        (x->nums = calloc(nr + 1, sizeof(*x->nums))) == NULL) {
        PQclear(r);
        return hcmp_nomem(x);
    }
    for (size_t i = 0; i < nr; i++) {
        struct hstep *t = &x->st[x->n_st];

        t->rank = (int) kp_pg_i64(r, (int) i, 0, 0);
        t->start = kp_pg_i64(r, (int) i, 1, 0);
        t->end = kp_pg_i64(r, (int) i, 2, 0);
        if (kp__compare_parse_step(PQgetvalue(r, (int) i, 3), &t->num)) {
            x->nums[x->n_st] = t->num;
            x->n_st++;
        }
    }
    PQclear(r);
    qsort(x->nums, x->n_st, sizeof(*x->nums), kp__compare_i64);
    x->n_steps_all = x->n_st;
    for (size_t i = 0; i < x->n_st; i++) {
        x->n_steps_distinct += i == 0 || x->nums[i] != x->nums[i - 1];
    }
    qsort(x->st, x->n_st, sizeof(*x->st), cmp_hstep);
    x->n_st = keep_steps(x->st, x->n_st, x->n_steps_distinct >= 2, x->has_step, x->step);
    return 0;
}

/* The asked step exists and 2+ ranks have kept steps; sets x->t_min. Returns 0 to go on, 1
 * with *out an answer that says why there is no metric, KP_ENOTFOUND, -ENOMEM. */
static int hcmp_check_ranks(struct hta_cmp *x, struct kp_compare_hta **out)
{
    size_t n_r = 0;
    bool step_seen = false;

    for (size_t i = 0; i < x->n_steps_all; i++) { /* (nums: every step number read) */
        step_seen = step_seen || x->nums[i] == x->step;
    }
    for (size_t i = 0; i < x->n_st; i++) {
        n_r += i == 0 || x->st[i].rank != x->st[i - 1].rank;
        x->t_min = x->st[i].start < x->t_min ? x->st[i].start : x->t_min;
    }
    if (x->has_step && !step_seen) {
        kp_errbuf_set(x->errbuf, x->errlen, "run %" PRId64 " has no step %" PRId64, x->run,
                      x->step);
        return KP_ENOTFOUND;
    }
    if (n_r >= 2) {
        return 0;
    }
    /* an answer, not an unknown run */
    if ((*out = calloc(1, sizeof(**out))) == NULL || ((*out)->collective = strdup("")) == NULL) {
        return hcmp_nomem(x);
    }
    snprintf((*out)->note, sizeof((*out)->note),
             "HTA's straggler metric needs 2 or more ranks with ProfilerStep ranges%s; "
             "run %" PRId64 " has %zu",
             x->n_steps_distinct >= 2 ? " (its last step dropped, as HTA does)" : "", x->run, n_r);
    return 1;
}

/* The kept steps as query parameters (arrs: 4), and *out with its mean step time:
 * (latest end of the steps' work - t_min) / steps. */
static int hcmp_mean_step(struct hta_cmp *x, struct kp_strbuf *arrs, struct kp_compare_hta **out)
{
    PGresult *r = NULL;
    int64_t t_max;
    size_t n_num = 0;
    int rc;

    for (int f = 0; f < 4; f++) {
        if (steps_array(&arrs[f], x->n_st, x->st, f) != 0) {
            return hcmp_nomem(x);
        }
        x->params[f + 1] = arrs[f].data;
    }
    if ((rc = kp_pg_query(x->c, sql_end, 5, x->params, &r, x->errbuf, x->errlen)) < 0) {
        return rc;
    }
    t_max = kp_pg_i64(r, 0, 0, 0);
    PQclear(r);
    for (size_t i = 0; i < x->n_st; i++) {
        x->nums[i] = x->st[i].num;
    }
    qsort(x->nums, x->n_st, sizeof(*x->nums), kp__compare_i64);
    for (size_t i = 0; i < x->n_st; i++) {
        n_num += i == 0 || x->nums[i] != x->nums[i - 1];
    }
    if ((*out = calloc(1, sizeof(**out))) == NULL) {
        return hcmp_nomem(x);
    }
    (*out)->mean_step_ns = (double) (t_max - x->t_min) / (double) n_num;
    return 0;
}

/* The candidate collectives, the one HTA picks, its metric rows and the stragglers into h (a
 * note instead when the run has no collective). */
static int hcmp_stragglers(struct hta_cmp *x, struct kp_compare_hta *h, int num_candidates)
{
    PGresult *r = NULL;
    struct hcand *cand = NULL;
    double *sd = NULL;
    size_t *cnt = NULL;
    int *cnt_rank = NULL;
    size_t n_cand, best_i;
    int rc;

    if ((rc = kp_pg_query(x->c, sql_cand, 5, x->params, &r, x->errbuf, x->errlen)) < 0) {
        return rc;
    }
    if ((cand = calloc((size_t) PQntuples(r) + 1, sizeof(*cand))) == NULL) {
        goto nomem;
    }
    n_cand = read_candidates(r, h->mean_step_ns, cand);
    if (n_cand == 0) { /* an answer, not an unknown run */
        if ((h->collective = strdup("")) == NULL) {
            goto nomem;
        }
        snprintf(h->note, sizeof(h->note),
                 "HTA's straggler metric needs collectives; this run has none (no ncclKernel* "
                 "kernel lasting 1%% of the mean step in a step it keeps)");
        goto out;
    }
    /* per (stream, name): mean over steps of the std (ddof 1) across ranks of dur' */
    if ((sd = calloc(n_cand, sizeof(*sd))) == NULL ||
        (cnt = calloc(n_cand, sizeof(*cnt))) == NULL) {
        goto nomem;
    }
    best_i = pick_collective(cand, n_cand, h->mean_step_ns, sd);
    if ((h->collective = strdup(cand[best_i].name)) == NULL ||
        (h->rows = calloc(n_cand, sizeof(*h->rows))) == NULL ||
        (cnt_rank = calloc(n_cand, sizeof(*cnt_rank))) == NULL ||
        (h->stragglers = calloc(n_cand, sizeof(*h->stragglers))) == NULL) {
        goto nomem;
    }
    metric_rows(h, cand, n_cand, best_i, x->t_min);
    /* per step: flag ranks whose metric >= the k-th largest; count flags per rank */
    flag_stragglers(h, num_candidates, sd, cnt, cnt_rank, n_cand);
    goto out;
nomem:
    rc = hcmp_nomem(x);
out:
    PQclear(r);
    free(cnt_rank);
    free(cnt);
    free(sd);
    free(cand);
    return rc;
}

int kp_compare_hta_create(PGconn *c, int64_t run, bool has_step, int64_t step, int num_candidates,
                          struct kp_compare_hta **out, char *errbuf, size_t errlen)
{
    char runs[24];
    const char *params[5] = { runs, NULL, NULL, NULL, NULL };
    struct hta_cmp x = { .c = c,
                         .params = params,
                         .run = run,
                         .has_step = has_step,
                         .step = step,
                         .t_min = INT64_MAX,
                         .errbuf = errbuf,
                         .errlen = errlen };
    struct kp_strbuf arrs[4];
    struct kp_compare_hta *h = NULL;
    int rc;

    *out = NULL;
    for (int f = 0; f < 4; f++) {
        kp_strbuf_init(&arrs[f], 0);
    }
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    if ((rc = kp__compare_check_run(c, params, run, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((rc = hcmp_read_steps(&x)) < 0) {
        goto out;
    }
    if ((rc = hcmp_check_ranks(&x, &h)) != 0) {
        if (rc > 0) {
            goto answer;
        }
        goto out;
    }
    if ((rc = hcmp_mean_step(&x, arrs, &h)) < 0 ||
        (rc = hcmp_stragglers(&x, h, num_candidates)) < 0) {
        goto out;
    }
answer:
    *out = h;
    h = NULL;
    rc = 0;
out:
    for (int f = 0; f < 4; f++) {
        kp_strbuf_fini(&arrs[f]);
    }
    kp_compare_hta_destroy(h);
    free(x.nums);
    free(x.st);
    return rc;
}
