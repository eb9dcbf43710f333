/*
 * counters: CUPTI counter values per kernel, mapped to the op stack (see counters.h).
 *
 * DESIGN. One ordered read of the rank's counters rows groups them into ranges by
 * (correlation, device). Positional ranges (Kineto, no correlation) are paired with the
 * cudaLaunchKernel calls by order; ranges with a correlation look their API call up by it.
 * Then the kernels of those correlations (name, duration) and the cpu_op ops of the launching
 * threads are read; one sweep per thread gives each op its enclosing op (parent), and each
 * launch finds its innermost enclosing op by a binary search and walks the parent chain.
 * Strings point into the kept PGresults.
 */
#include "counters.h"
#include "counters_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_err.h"
#include "kp_kineto_ids.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

#define OPK_CPU_OP         1
#define CT_LAUNCH_PREFIX   "cudaLaunchKernel"
#define CT_DURATION_METRIC "gpu__time_duration.sum"
#define CT_MAX_STACK       256
#define WHERE_RR           " WHERE x.run_id = $1 AND x.rank = $2"

struct ct_op {
    int64_t start, end, tid, op_id;
    const char *name;
    int32_t parent;
};

struct ct_range {
    int64_t key; /* the counters' correlation */
    int64_t start, end, ext;
};

/* A Kineto range without a correlation of its own (NULL correlations, -1 here, are not). */
static bool positional(int64_t key)
{
    return key >= (int64_t) KP_KINETO_RANGE_ID_BASE;
}

static bool is_name_row(const char *metric)
{
    return strncmp(metric, KP_KINETO_RANGE_NAME_PREFIX, sizeof(KP_KINETO_RANGE_NAME_PREFIX) - 1) ==
           0;
}

struct ct_perm {
    int64_t range, key;
    int device;
    size_t i;
};

/* Row order: ranges with an index by index, then the others by correlation. */
static int cmp_perm(const void *pa, const void *pb)
{
    const struct ct_perm *a = pa, *b = pb;
    int64_t ia = a->range >= 0 ? a->range : INT64_MAX, ib = b->range >= 0 ? b->range : INT64_MAX;

    if (ia != ib) {
        return ia < ib ? -1 : 1;
    }
    if (a->key != b->key) {
        return a->key < b->key ? -1 : 1;
    }
    return a->device < b->device ? -1 : a->device > b->device;
}

/* Sorts rows[] (and ranges[] with it) into range order. */
static int sort_rows(struct kp_counters *t)
{
    struct ct_perm *p = calloc(t->n_rows + 1, sizeof(*p));
    struct kp_counters_row *rows = calloc(t->n_rows + 1, sizeof(*rows));
    struct ct_range *g = calloc(t->n_rows + 1, sizeof(*g));

    if (!p || !rows || !g) {
        free(p);
        free(rows);
        free(g);
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        p[i].range = t->rows[i].range;
        p[i].key = t->ranges[i].key;
        p[i].device = t->rows[i].device;
        p[i].i = i;
    }
    qsort(p, t->n_rows, sizeof(*p), cmp_perm);
    for (size_t i = 0; i < t->n_rows; i++) {
        rows[i] = t->rows[p[i].i];
        g[i] = t->ranges[p[i].i];
    }
    free(t->rows);
    free(t->ranges);
    free(p);
    t->rows = rows;
    t->ranges = g;
    return 0;
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return a < b ? -1 : a > b;
}

/* The first row of r (sorted by column 0) whose column 0 is key, or -1. */
static int find_row(const PGresult *r, int64_t key)
{
    int lo = 0, hi = PQntuples(r);

    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;

        if (kp_pg_i64(r, mid, 0, -1) < key) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < PQntuples(r) && kp_pg_i64(r, lo, 0, -1) == key ? lo : -1;
}

/* Groups the counters rows (ordered by correlation, device) into rows. */
static int group_rows(struct kp_counters *t)
{
    int n = PQntuples(t->cr);
    size_t nm = 0, nr = 0;

    t->metrics = calloc((size_t) n + 1, sizeof(*t->metrics));
    if (!t->metrics) {
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        const char *m = PQgetvalue(t->cr, i, 2);

        if (!is_name_row(m)) {
            t->metrics[nm++] = m;
        }
        if (i == 0 || kp_pg_i64(t->cr, i, 0, -1) != kp_pg_i64(t->cr, i - 1, 0, -1) ||
            kp_pg_i64(t->cr, i, 1, -1) != kp_pg_i64(t->cr, i - 1, 1, -1)) {
            nr++;
        }
    }
    qsort(t->metrics, nm, sizeof(*t->metrics), kp__counters_cmp_str);
    t->n_metrics = 0;
    for (size_t i = 0; i < nm; i++) {
        if (t->n_metrics == 0 || strcmp(t->metrics[t->n_metrics - 1], t->metrics[i]) != 0) {
            t->metrics[t->n_metrics++] = t->metrics[i];
        }
    }
    t->rows = calloc(nr + 1, sizeof(*t->rows));
    t->ranges = calloc(nr + 1, sizeof(*t->ranges));
    t->values = malloc((nr * t->n_metrics + 1) * sizeof(*t->values));
    if (!t->rows || !t->ranges || !t->values) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < nr * t->n_metrics; i++) {
        t->values[i] = NAN;
    }
    t->n_rows = 0;
    for (int i = 0; i < n; i++) {
        struct kp_counters_row *r;
        const char *m = PQgetvalue(t->cr, i, 2);
        double v = strtod(PQgetvalue(t->cr, i, 3), NULL);

        if (i == 0 || kp_pg_i64(t->cr, i, 0, -1) != kp_pg_i64(t->cr, i - 1, 0, -1) ||
            kp_pg_i64(t->cr, i, 1, -1) != kp_pg_i64(t->cr, i - 1, 1, -1)) {
            r = &t->rows[t->n_rows];
            r->values = t->values + t->n_rows * t->n_metrics;
            r->kernel = "";
            r->range = -1;
            r->device = (int) kp_pg_i64(t->cr, i, 1, -1);
            r->correlation = -1;
            r->tid = -1;
            r->dur_ns = -1;
            t->ranges[t->n_rows].key = kp_pg_i64(t->cr, i, 0, -1);
            t->ranges[t->n_rows].ext = -1;
            t->n_rows++;
        }
        r = &t->rows[t->n_rows - 1];
        if (is_name_row(m)) {
            r->kernel = m + sizeof(KP_KINETO_RANGE_NAME_PREFIX) - 1;
            r->range = (int64_t) v;
        }
        else {
            long k = kp__counters_metric_index(t, m);

            if (k >= 0 && isnan(r->values[k])) { /* a repeated metric: the first one counts */
                r->values[k] = v;
            }
        }
    }
    return 0;
}

/* The launch of each range: positional pairing (Kineto ranges) or by correlation. */
static int find_launches(struct kp_counters *t, PGconn *c, const char *const *params,
                         size_t *budget, size_t max_rows, char *errbuf, size_t errlen)
{
    PGresult *lr = NULL, *ar = NULL;
    struct kp_strbuf sb;
    const char *p3[3] = { params[0], params[1], NULL };
    int64_t *keys = NULL;
    size_t n_pos = 0, n_keys = 0;
    int rc = 0;

    kp_strbuf_init(&sb, 0);
    keys = calloc(t->n_rows + 1, sizeof(*keys));
    if (!keys) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        if (positional(t->ranges[i].key)) {
            n_pos++;
        }
        else if (t->ranges[i].key > 0) {
            keys[n_keys++] = t->ranges[i].key;
        }
    }
    if (n_pos > 0) {
        int n;

        rc = kp_an_query(c, 2,
                         "SELECT x.correlation, x.tid, x.start_ns, x.dur_ns, x.external_id FROM "
                         "api_calls x JOIN names n ON n.id = x.name" WHERE_RR
                         " AND n.name LIKE '" CT_LAUNCH_PREFIX
                         "%' ORDER BY x.start_ns, x.correlation",
                         params, budget, max_rows, &lr, errbuf, errlen);
        if (rc < 0) {
            goto out;
        }
        n = PQntuples(lr);
        if ((size_t) n != n_pos) {
            snprintf(t->message, sizeof(t->message),
                     "%zu counter ranges but %d %s* calls: ranges are paired with launches by "
                     "position, so the op stacks are not mapped (HTA skips such a rank)",
                     n_pos, n, CT_LAUNCH_PREFIX);
        }
        else {
            size_t j = 0;

            /* rows are in range order here (sorted by the caller) */
            for (size_t i = 0; i < t->n_rows; i++) {
                struct ct_range *g = &t->ranges[i];
                struct kp_counters_row *r = &t->rows[i];

                if (!positional(g->key)) {
                    continue;
                }
                r->correlation = kp_pg_i64(lr, (int) j, 0, -1);
                r->tid = kp_pg_i64(lr, (int) j, 1, -1);
                g->start = kp_pg_i64(lr, (int) j, 2, -1);
                g->end = g->start +
                         (kp_pg_i64(lr, (int) j, 3, -1) > 0 ? kp_pg_i64(lr, (int) j, 3, -1) : 0);
                g->ext = kp_pg_i64(lr, (int) j, 4, -1);
                j++;
            }
        }
    }
    if (n_keys > 0) {
        qsort(keys, n_keys, sizeof(*keys), cmp_i64);
        if ((rc = kp_pg_array_i64s(&sb, keys, n_keys)) != 0) {
            goto out;
        }
        p3[2] = sb.data;
        rc = kp_an_query(c, 3,
                         "SELECT x.correlation, x.tid, x.start_ns, x.dur_ns, x.external_id FROM "
                         "api_calls x" WHERE_RR " AND x.correlation = ANY($3::bigint[]) "
                         "ORDER BY x.correlation, x.domain",
                         p3, budget, max_rows, &ar, errbuf, errlen);
        if (rc < 0) {
            goto out;
        }
        for (size_t i = 0; i < t->n_rows; i++) {
            struct ct_range *g = &t->ranges[i];
            struct kp_counters_row *r = &t->rows[i];
            int a;

            if (positional(g->key) || g->key <= 0) {
                continue;
            }
            r->correlation = g->key;
            if ((a = find_row(ar, g->key)) < 0) {
                continue;
            }
            r->tid = kp_pg_i64(ar, a, 1, -1);
            g->start = kp_pg_i64(ar, a, 2, -1);
            g->end = g->start + (kp_pg_i64(ar, a, 3, -1) > 0 ? kp_pg_i64(ar, a, 3, -1) : 0);
            g->ext = kp_pg_i64(ar, a, 4, -1);
        }
    }
out:
    PQclear(lr);
    PQclear(ar);
    free(keys);
    kp_strbuf_fini(&sb);
    return rc;
}

/* Kernel names and durations by correlation. */
static int find_kernels(struct kp_counters *t, PGconn *c, const char *const *params, size_t *budget,
                        size_t max_rows, char *errbuf, size_t errlen)
{
    struct kp_strbuf sb;
    const char *p3[3] = { params[0], params[1], NULL };
    int64_t *keys = calloc(t->n_rows + 1, sizeof(*keys));
    size_t n = 0;
    int rc = 0;

    kp_strbuf_init(&sb, 0);
    if (!keys) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        if (t->rows[i].correlation > 0) {
            keys[n++] = t->rows[i].correlation;
        }
    }
    if (n == 0) {
        goto out;
    }
    qsort(keys, n, sizeof(*keys), cmp_i64);
    if ((rc = kp_pg_array_i64s(&sb, keys, n)) != 0) {
        goto out;
    }
    p3[2] = sb.data;
    rc =
        kp_an_query(c, 3,
                    "SELECT x.correlation, x.dur_ns, coalesce(n.name, ''), x.device FROM kernels x "
                    "LEFT JOIN names n ON n.id = x.name" WHERE_RR
                    " AND x.correlation = ANY($3::bigint[]) ORDER BY x.correlation, x.start_ns",
                    p3, budget, max_rows, &t->kr, errbuf, errlen);
    if (rc < 0) {
        goto out;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        struct kp_counters_row *r = &t->rows[i];
        int k = r->correlation > 0 ? find_row(t->kr, r->correlation) : -1;

        if (k < 0) {
            continue;
        }
        r->dur_ns = kp_pg_i64(t->kr, k, 1, -1);
        if (r->kernel[0] == '\0') {
            r->kernel = PQgetvalue(t->kr, k, 2);
        }
        if (r->device < 0) {
            r->device = (int) kp_pg_i64(t->kr, k, 3, -1);
        }
    }
out:
    free(keys);
    kp_strbuf_fini(&sb);
    return rc;
}

/* The enclosing cpu_ops of every launch, outermost first. */
static int find_stacks(struct kp_counters *t, PGconn *c, const char *const *params, size_t *budget,
                       size_t max_rows, char *errbuf, size_t errlen)
{
    struct kp_strbuf sb;
    const char *p3[3] = { params[0], params[1], NULL };
    int64_t *tids = calloc(t->n_rows + 1, sizeof(*tids));
    struct ct_op *ops = NULL;
    int32_t *stack = NULL, chain[CT_MAX_STACK];
    size_t n_tids = 0, n_ops, depth = 0, total = 0, used = 0;
    int rc = 0;

    kp_strbuf_init(&sb, 0);
    if (!tids) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        if (t->rows[i].tid >= 0) {
            tids[n_tids++] = t->rows[i].tid;
        }
    }
    if (n_tids == 0) {
        goto out;
    }
    qsort(tids, n_tids, sizeof(*tids), cmp_i64);
    if ((rc = kp_pg_array_i64s(&sb, tids, n_tids)) != 0) {
        goto out;
    }
    p3[2] = sb.data;
    rc = kp_an_query(c, 3,
                     "SELECT x.tid, x.start_ns, x.dur_ns, coalesce(x.op_id, x.external_id), "
                     "coalesce(n.name, '') FROM ops x LEFT JOIN names n ON n.id = x.name" WHERE_RR
                     " AND x.kind = 1 AND x.tid = ANY($3::bigint[]) "
                     "ORDER BY x.tid, x.start_ns, x.dur_ns DESC",
                     p3, budget, max_rows, &t->or, errbuf, errlen);
    if (rc < 0) {
        goto out;
    }
    n_ops = (size_t) PQntuples(t->or);
    ops = calloc(n_ops + 1, sizeof(*ops));
    stack = calloc(n_ops + 1, sizeof(*stack));
    if (!ops || !stack) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n_ops; i++) {
        struct ct_op *o = &ops[i];
        int row = (int) i;

        o->tid = kp_pg_i64(t->or, row, 0, -1);
        o->start = kp_pg_i64(t->or, row, 1, -1);
        o->end = o->start + (kp_pg_i64(t->or, row, 2, -1) > 0 ? kp_pg_i64(t->or, row, 2, -1) : 0);
        o->op_id = kp_pg_i64(t->or, row, 3, -1);
        o->name = PQgetvalue(t->or, row, 4);
        while (depth > 0) {
            const struct ct_op *p = &ops[stack[depth - 1]];

            if (p->tid == o->tid && p->start <= o->start && p->end >= o->end) {
                break;
            }
            depth--;
        }
        o->parent = depth ? stack[depth - 1] : -1;
        stack[depth++] = (int32_t) i;
    }
    /* every row's chain, counted first so that the stacks are one block */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < t->n_rows; i++) {
            struct kp_counters_row *r = &t->rows[i];
            const struct ct_range *g = &t->ranges[i];
            size_t lo = 0, hi = n_ops, nc = 0;
            int32_t o = -1;

            if (r->tid < 0) {
                continue;
            }
            /* the last op of the thread that starts at or before the launch */
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (ops[mid].tid < r->tid ||
                    (ops[mid].tid == r->tid && ops[mid].start <= g->start)) {
                    lo = mid + 1;
                }
                else {
                    hi = mid;
                }
            }
            if (lo > 0 && ops[lo - 1].tid == r->tid) {
                o = (int32_t) (lo - 1);
            }
            while (o >= 0 && !(ops[o].start <= g->start && ops[o].end >= g->end)) {
                o = ops[o].parent;
            }
            if (o < 0 && g->ext > 0) { /* no enclosing op: the launch's external id */
                for (size_t j = 0; j < n_ops; j++) {
                    if (ops[j].op_id == g->ext && (o < 0 || ops[j].start >= ops[o].start)) {
                        o = (int32_t) j;
                    }
                }
            }
            for (; o >= 0 && nc < CT_MAX_STACK; o = ops[o].parent) {
                chain[nc++] = o;
            }
            if (pass == 0) {
                total += nc;
                continue;
            }
            r->stack = t->stacks + used;
            r->n_stack = nc;
            for (size_t k = 0; k < nc; k++) {
                t->stacks[used++] = ops[chain[nc - 1 - k]].name;
            }
            r->top_op = nc ? r->stack[0] : NULL;
            r->bottom_op = nc ? r->stack[nc - 1] : NULL;
        }
        if (pass == 0 && (t->stacks = calloc(total + 1, sizeof(*t->stacks))) == NULL) {
            rc = -ENOMEM;
            goto out;
        }
    }
out:
    free(tids);
    free(ops);
    free(stack);
    kp_strbuf_fini(&sb);
    return rc;
}

/* FLOPs per precision and in total (counters.h). */
static void compute_flops(struct kp_counters *t)
{
    static const char precs[KP_COUNTERS_PREC_COUNT] = { 'd', 'f', 'h' };
    static const char *const ops[3] = { "add", "mul", "fma" };
    static const char *const pfx[2] = { "smsp", "sm" };
    long idx[KP_COUNTERS_PREC_COUNT][3];
    bool recorded[KP_COUNTERS_PREC_COUNT], any = false;
    long dur = kp__counters_metric_index(t, CT_DURATION_METRIC);

    for (int p = 0; p < KP_COUNTERS_PREC_COUNT; p++) {
        recorded[p] = false;
        for (int o = 0; o < 3; o++) {
            idx[p][o] = -1;
            for (int x = 0; x < 2 && idx[p][o] < 0; x++) {
                char name[96];

                snprintf(name, sizeof(name), "%s__sass_thread_inst_executed_op_%c%s_pred_on.sum",
                         pfx[x], precs[p], ops[o]);
                idx[p][o] = kp__counters_metric_index(t, name);
            }
            recorded[p] = recorded[p] || idx[p][o] >= 0;
        }
        any = any || recorded[p];
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        struct kp_counters_row *r = &t->rows[i];
        double total = 0;

        for (int p = 0; p < KP_COUNTERS_PREC_COUNT; p++) {
            double a = idx[p][0] >= 0 ? r->values[idx[p][0]] : NAN;
            double m = idx[p][1] >= 0 ? r->values[idx[p][1]] : NAN;
            double f = idx[p][2] >= 0 ? r->values[idx[p][2]] : NAN;

            r->flops_prec[p] = a + m + 2.0 * f; /* NaN when one is missing */
            if (recorded[p]) {
                total += r->flops_prec[p];
            }
        }
        r->flops = any ? total : NAN;
        if (r->dur_ns < 0 && dur >= 0 && isfinite(r->values[dur]) && r->values[dur] >= 0) {
            r->dur_ns = (int64_t) llround(r->values[dur]);
        }
        r->flops_per_s = r->dur_ns > 0 ? r->flops / ((double) r->dur_ns * 1e-9) : NAN;
    }
}

int kp_counters_create(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_counters **out,
                       char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    struct kp_counters *t;
    size_t budget = 0;
    int rc;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    if ((t = calloc(1, sizeof(*t))) == NULL) {
        return -ENOMEM;
    }
    if ((rc = kp_an_check_rank(c, params, run, rank, errbuf, errlen)) < 0) {
        goto fail;
    }
    rc =
        kp_an_query(c, 2,
                    "SELECT x.correlation, x.device, coalesce(n.name, ''), x.value FROM counters x "
                    "LEFT JOIN names n ON n.id = x.metric" WHERE_RR
                    " ORDER BY x.correlation NULLS FIRST, x.device NULLS FIRST",
                    params, &budget, max_rows, &t->cr, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    if ((rc = group_rows(t)) != 0) {
        goto nomem;
    }
    if (t->n_rows == 0) {
        snprintf(t->message, sizeof(t->message),
                 "no CUPTI counters in run %s rank %s: record them with Kineto's CUPTI range "
                 "profiler (cuda_profiler_range events, imported with kprofctl import)",
                 runs, ranks);
    }
    if (sort_rows(t) != 0) {
        goto nomem;
    }
    if ((rc = find_launches(t, c, params, &budget, max_rows, errbuf, errlen)) != 0 ||
        (rc = find_kernels(t, c, params, &budget, max_rows, errbuf, errlen)) != 0 ||
        (rc = find_stacks(t, c, params, &budget, max_rows, errbuf, errlen)) != 0) {
        if (rc == -ENOMEM) {
            goto nomem;
        }
        goto fail;
    }
    compute_flops(t);
    for (size_t i = 0; i < t->n_rows; i++) {
        t->rows[i].idx = i + 1;
    }
    *out = t;
    return 0;

nomem:
    rc = -ENOMEM;
    kp_errbuf_set(errbuf, errlen, "out of memory building the counters table");
fail:
    kp_counters_destroy(t);
    return rc;
}

void kp_counters_destroy(struct kp_counters *t)
{
    if (!t) {
        return;
    }
    PQclear(t->cr);
    PQclear(t->kr);
    PQclear(t->or);
    free(t->metrics);
    free(t->rows);
    free(t->ranges);
    free(t->stacks);
    free(t->values);
    free(t);
}

const struct kp_counters_row *kp_counters_rows(const struct kp_counters *t, size_t *n)
{
    *n = t->n_rows;
    return t->rows;
}

const char *const *kp_counters_metrics(const struct kp_counters *t, size_t *n)
{
    *n = t->n_metrics;
    return t->metrics;
}

const char *kp_counters_message(const struct kp_counters *t)
{
    return t->message[0] ? t->message : NULL;
}
