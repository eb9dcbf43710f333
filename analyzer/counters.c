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

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kp_analyzer.h"
#include "kp_err.h"
#include "kp_kineto.h"
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

struct kp_ctr {
    PGresult *cr, *kr, * or ;
    const char **metrics;
    size_t n_metrics;
    struct kp_ctr_row *rows;
    struct ct_range *ranges; /* parallel to rows */
    size_t n_rows;
    const char **stacks; /* every row's stack, one block */
    double *values;      /* every row's values, one block */
    char message[512];
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

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

static long metric_index(const struct kp_ctr *t, const char *name)
{
    const char **p = bsearch(&name, t->metrics, t->n_metrics, sizeof(*t->metrics), cmp_str);

    return p ? (long) (p - t->metrics) : -1;
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
static int sort_rows(struct kp_ctr *t)
{
    struct ct_perm *p = calloc(t->n_rows + 1, sizeof(*p));
    struct kp_ctr_row *rows = calloc(t->n_rows + 1, sizeof(*rows));
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

/* "{1,2,3}" for a bigint[] parameter. */
static int int_array(struct kp_strbuf *sb, const int64_t *v, size_t n)
{
    int rc = kp_strbuf_putc(sb, '{');

    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = kp_strbuf_appendf(sb, "%s%" PRId64, i ? "," : "", v[i]);
    }
    return rc != 0 ? rc : kp_strbuf_putc(sb, '}');
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
static int group_rows(struct kp_ctr *t)
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
    qsort(t->metrics, nm, sizeof(*t->metrics), cmp_str);
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
        struct kp_ctr_row *r;
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
            long k = metric_index(t, m);

            if (k >= 0 && isnan(r->values[k])) { /* a repeated metric: the first one counts */
                r->values[k] = v;
            }
        }
    }
    return 0;
}

/* The launch of each range: positional pairing (Kineto ranges) or by correlation. */
static int find_launches(struct kp_ctr *t, PGconn *c, const char *const *params, size_t *budget,
                         size_t max_rows, char *errbuf, size_t errlen)
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
                struct kp_ctr_row *r = &t->rows[i];

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
        if ((rc = int_array(&sb, keys, n_keys)) != 0) {
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
            struct kp_ctr_row *r = &t->rows[i];
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
static int find_kernels(struct kp_ctr *t, PGconn *c, const char *const *params, size_t *budget,
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
    if ((rc = int_array(&sb, keys, n)) != 0) {
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
        struct kp_ctr_row *r = &t->rows[i];
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
static int find_stacks(struct kp_ctr *t, PGconn *c, const char *const *params, size_t *budget,
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
    if ((rc = int_array(&sb, tids, n_tids)) != 0) {
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
            struct kp_ctr_row *r = &t->rows[i];
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
static void compute_flops(struct kp_ctr *t)
{
    static const char precs[KP_CTR_PREC_COUNT] = { 'd', 'f', 'h' };
    static const char *const ops[3] = { "add", "mul", "fma" };
    static const char *const pfx[2] = { "smsp", "sm" };
    long idx[KP_CTR_PREC_COUNT][3];
    bool recorded[KP_CTR_PREC_COUNT], any = false;
    long dur = metric_index(t, CT_DURATION_METRIC);

    for (int p = 0; p < KP_CTR_PREC_COUNT; p++) {
        recorded[p] = false;
        for (int o = 0; o < 3; o++) {
            idx[p][o] = -1;
            for (int x = 0; x < 2 && idx[p][o] < 0; x++) {
                char name[96];

                snprintf(name, sizeof(name), "%s__sass_thread_inst_executed_op_%c%s_pred_on.sum",
                         pfx[x], precs[p], ops[o]);
                idx[p][o] = metric_index(t, name);
            }
            recorded[p] = recorded[p] || idx[p][o] >= 0;
        }
        any = any || recorded[p];
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        struct kp_ctr_row *r = &t->rows[i];
        double total = 0;

        for (int p = 0; p < KP_CTR_PREC_COUNT; p++) {
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

int kp_ctr_build(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_ctr **out,
                 char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    struct kp_ctr *t;
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
    kp_ctr_destroy(t);
    return rc;
}

void kp_ctr_destroy(struct kp_ctr *t)
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

const struct kp_ctr_row *kp_ctr_rows(const struct kp_ctr *t, size_t *n)
{
    *n = t->n_rows;
    return t->rows;
}

const char *const *kp_ctr_metrics(const struct kp_ctr *t, size_t *n)
{
    *n = t->n_metrics;
    return t->metrics;
}

const char *kp_ctr_message(const struct kp_ctr *t)
{
    return t->message[0] ? t->message : NULL;
}

/* ---- output ---------------------------------------------------------------------------- */

enum ct_col {
    C_IDX,
    C_RANGE,
    C_KERNEL,
    C_DEVICE,
    C_CORR,
    C_TID,
    C_TOP,
    C_BOTTOM,
    C_STACK,
    C_DUR,
    C_FLOPS,
    C_FP64,
    C_FP32,
    C_FP16,
    C_FLOPS_S,
    C_FIXED,
    C_COUNTERS = -1, /* JSON: every metric in one object */
};

static const char *const col_names[C_FIXED] = {
    "idx",   "range",      "kernel",     "device",     "correlation",
    "tid",   "top_op",     "bottom_op",  "op_stack",   "dur_us",
    "flops", "flops_fp64", "flops_fp32", "flops_fp16", "flops_per_s",
};

#define CT_TEXT_CUT 60 /* bytes of a text cell in the text format, without a width */

static bool col_numeric(long col)
{
    return !(col == C_KERNEL || col == C_TOP || col == C_BOTTOM || col == C_STACK);
}

static const char *col_name(const struct kp_ctr *t, long col)
{
    return col < C_FIXED ? col_names[col] : t->metrics[col - C_FIXED];
}

/* JSON keeps the duration as exact integer ns. */
static const char *json_name(const struct kp_ctr *t, long col)
{
    return col == C_DUR ? "dur_ns" : col_name(t, col);
}

/* Appends the columns of list to cols (at most max); "all" is every fixed column and every
 * metric. Returns the count or -EINVAL. */
static long parse_cols(const struct kp_ctr *t, const char *list, long *cols, long max, char *errbuf,
                       size_t errlen)
{
    long n = 0;
    const char *p = list;

    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t) (e - p) : strlen(p);
        char name[256];
        long col = -2;

        while (len > 0 && (*p == ' ' || *p == '\t')) {
            p++;
            len--;
        }
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) {
            len--;
        }
        if (len >= sizeof(name)) {
            len = sizeof(name) - 1;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        if (len > 0 && strcmp(name, "all") == 0) {
            for (long c = 0; c < C_FIXED + (long) t->n_metrics && n < max; c++) {
                cols[n++] = c;
            }
        }
        else if (len > 0) {
            for (long c = 0; c < C_FIXED && col < 0; c++) {
                if (strcmp(name, col_names[c]) == 0) {
                    col = c;
                }
                else if (c == C_DUR && strcmp(name, "dur_ns") == 0) {
                    col = c; /* JSON's name for it */
                }
            }
            if (col < 0 && metric_index(t, name) >= 0) {
                col = C_FIXED + metric_index(t, name);
            }
            if (col < 0) {
                kp_errbuf_set(errbuf, errlen,
                              "unknown column \"%s\" (columns: idx, range, kernel, device, "
                              "correlation, tid, top_op, bottom_op, op_stack, dur_us, flops, "
                              "flops_fp64, flops_fp32, flops_fp16, flops_per_s, all, or one of "
                              "the run's %zu metrics)",
                              name, t->n_metrics);
                return -EINVAL;
            }
            if (n < max) {
                cols[n++] = col;
            }
        }
        p += e ? (size_t) (e - p) + 1 : strlen(p);
    }
    return n;
}

/* A number as text: exact (%.17g) for CSV and JSON, short for text. NULL when not finite. */
static const char *fmt_num(double v, bool exact, char *buf, size_t len)
{
    if (!isfinite(v)) {
        return NULL;
    }
    if (exact) {
        snprintf(buf, len, "%.17g", v);
    }
    else if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, len, "%.0f", v);
    }
    else {
        snprintf(buf, len, "%.4g", v);
    }
    return buf;
}

static const char *fmt_int(int64_t v, char *buf, size_t len)
{
    if (v < 0) {
        return NULL;
    }
    snprintf(buf, len, "%" PRId64, v);
    return buf;
}

/* The cell as text, or NULL for a null cell. op_stack is joined with " > " into sb. */
static const char *cell(const struct kp_ctr_row *r, long col, bool exact, char *buf, size_t len,
                        struct kp_strbuf *sb)
{
    switch (col) {
    case C_IDX:
        return fmt_int((int64_t) r->idx, buf, len);
    case C_RANGE:
        return fmt_int(r->range, buf, len);
    case C_KERNEL:
        return r->kernel[0] ? r->kernel : NULL;
    case C_DEVICE:
        return fmt_int(r->device, buf, len);
    case C_CORR:
        return fmt_int(r->correlation, buf, len);
    case C_TID:
        return fmt_int(r->tid, buf, len);
    case C_TOP:
        return r->top_op;
    case C_BOTTOM:
        return r->bottom_op;
    case C_STACK:
        if (r->n_stack == 0) {
            return NULL;
        }
        kp_strbuf_reset(sb);
        for (size_t i = 0; i < r->n_stack; i++) {
            if (kp_strbuf_appendf(sb, "%s%s", i ? " > " : "", r->stack[i]) != 0) {
                return NULL;
            }
        }
        return sb->data;
    case C_DUR: /* µs, exact: three decimals of whole ns */
        if (r->dur_ns < 0) {
            return NULL;
        }
        snprintf(buf, len, "%" PRId64 ".%03" PRId64, r->dur_ns / 1000, r->dur_ns % 1000);
        return buf;
    case C_FLOPS:
        return fmt_num(r->flops, exact, buf, len);
    case C_FP64:
    case C_FP32:
    case C_FP16:
        return fmt_num(r->flops_prec[col - C_FP64], exact, buf, len);
    case C_FLOPS_S:
        return fmt_num(r->flops_per_s, exact, buf, len);
    default:
        return fmt_num(r->values[col - C_FIXED], exact, buf, len);
    }
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char) *s;

        if (ch == '"' || ch == '\\') {
            fprintf(f, "\\%c", ch);
        }
        else if (ch < 0x20) {
            fprintf(f, "\\u%04x", ch);
        }
        else {
            fputc(ch, f);
        }
    }
    fputc('"', f);
}

static void csv_field(FILE *f, const char *s)
{
    if (!s) {
        return;
    }
    if (strpbrk(s, ",\"\r\n") == NULL) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') {
            fputc('"', f);
        }
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Bytes of s shown in the text format: at most limit, cut at a UTF-8 boundary. */
static size_t text_len(const char *s, size_t limit, bool *cut)
{
    size_t n = strlen(s);

    *cut = n > limit;
    if (!*cut) {
        return n;
    }
    n = limit > 3 ? limit - 3 : 0;
    while (n > 0 && ((unsigned char) s[n] & 0xc0) == 0x80) {
        n--;
    }
    return n;
}

static void write_json(FILE *f, const struct kp_ctr *t, int64_t run, int rank, const long *cols,
                       long n_cols, struct kp_strbuf *sb)
{
    char buf[64];

    fprintf(f, "{\"run\": %" PRId64 ", \"rank\": %d, \"metrics\": [", run, rank);
    for (size_t m = 0; m < t->n_metrics; m++) {
        fputs(m ? ", " : "", f);
        json_str(f, t->metrics[m]);
    }
    fputs("], \"message\": ", f);
    if (t->message[0]) {
        json_str(f, t->message);
    }
    else {
        fputs("null", f);
    }
    fputs(", \"rows\": [", f);
    for (size_t i = 0; i < t->n_rows; i++) {
        const struct kp_ctr_row *r = &t->rows[i];

        fputs(i ? ",\n  {" : "\n  {", f);
        for (long c = 0; c < n_cols; c++) {
            long col = cols[c];
            const char *v;

            fputs(c ? ", " : "", f);
            if (col == C_COUNTERS) {
                fputs("\"counters\": {", f);
                for (size_t m = 0; m < t->n_metrics; m++) {
                    fputs(m ? ", " : "", f);
                    json_str(f, t->metrics[m]);
                    v = fmt_num(r->values[m], true, buf, sizeof(buf));
                    fprintf(f, ": %s", v ? v : "null");
                }
                fputc('}', f);
                continue;
            }
            json_str(f, json_name(t, col));
            fputs(": ", f);
            if (col == C_STACK) {
                fputc('[', f);
                for (size_t k = 0; k < r->n_stack; k++) {
                    fputs(k ? ", " : "", f);
                    json_str(f, r->stack[k]);
                }
                fputc(']', f);
                continue;
            }
            v = col == C_DUR && r->dur_ns >= 0 ? fmt_int(r->dur_ns, buf, sizeof(buf))
                                               : cell(r, col, true, buf, sizeof(buf), sb);
            if (!v) {
                fputs("null", f);
            }
            else if (col_numeric(col)) {
                fputs(v, f);
            }
            else {
                json_str(f, v);
            }
        }
        fputc('}', f);
    }
    fputs(t->n_rows ? "\n]}\n" : "]}\n", f);
}

static void write_text(FILE *f, const struct kp_ctr *t, const long *cols, long n_cols, size_t limit,
                       struct kp_strbuf *sb)
{
    size_t w[KP_CTR_MAX_COLS];
    char buf[64];
    bool cut;

    for (long c = 0; c < n_cols; c++) {
        w[c] = strlen(col_name(t, cols[c]));
        for (size_t i = 0; i < t->n_rows; i++) {
            const char *v = cell(&t->rows[i], cols[c], false, buf, sizeof(buf), sb);
            size_t n = v ? text_len(v, limit, &cut) + (cut ? 3 : 0) : 1;

            w[c] = n > w[c] ? n : w[c];
        }
    }
    for (long c = 0; c < n_cols; c++) {
        fprintf(f, "%s%*s", c ? "  " : "", col_numeric(cols[c]) ? (int) w[c] : -(int) w[c],
                col_name(t, cols[c]));
    }
    fputc('\n', f);
    for (size_t i = 0; i < t->n_rows; i++) {
        for (long c = 0; c < n_cols; c++) {
            const char *v = cell(&t->rows[i], cols[c], false, buf, sizeof(buf), sb);
            size_t n;

            fputs(c ? "  " : "", f);
            if (!v) {
                fprintf(f, "%*s", col_numeric(cols[c]) ? (int) w[c] : -(int) w[c], "-");
                continue;
            }
            n = text_len(v, limit, &cut);
            if (col_numeric(cols[c])) {
                fprintf(f, "%*s", (int) w[c], v);
            }
            else {
                fprintf(f, "%.*s%s%*s", (int) n, v, cut ? "..." : "",
                        (int) (w[c] - n - (cut ? 3 : 0)), "");
            }
        }
        fputc('\n', f);
    }
}

static int write_table(FILE *f, const struct kp_ctr *t, int64_t run, int rank, const char *columns,
                       enum kp_ctr_format format, int width, char *errbuf, size_t errlen)
{
    long cols[KP_CTR_MAX_COLS], n_cols;
    struct kp_strbuf sb;
    char buf[64];

    if (!columns || !columns[0]) {
        columns = format == KP_CTR_TEXT ? KP_CTR_TEXT_COLUMNS : "all";
    }
    n_cols = parse_cols(t, columns, cols, KP_CTR_MAX_COLS, errbuf, errlen);
    if (n_cols < 0) {
        return (int) n_cols;
    }
    if (format == KP_CTR_JSON && strcmp(columns, "all") == 0) {
        n_cols = C_FIXED; /* every fixed column, then the metrics as one object */
        cols[n_cols++] = C_COUNTERS;
    }
    kp_strbuf_init(&sb, 0);
    if (format == KP_CTR_JSON) {
        write_json(f, t, run, rank, cols, n_cols, &sb);
    }
    else if (format == KP_CTR_CSV) {
        for (long c = 0; c < n_cols; c++) {
            fputs(c ? "," : "", f);
            csv_field(f, col_name(t, cols[c]));
        }
        fputc('\n', f);
        for (size_t i = 0; i < t->n_rows; i++) {
            for (long c = 0; c < n_cols; c++) {
                fputs(c ? "," : "", f);
                csv_field(f, cell(&t->rows[i], cols[c], true, buf, sizeof(buf), &sb));
            }
            fputc('\n', f);
        }
    }
    else {
        write_text(f, t, cols, n_cols, width > 0 ? (size_t) width : CT_TEXT_CUT, &sb);
    }
    kp_strbuf_fini(&sb);
    return fflush(f) != 0 || ferror(f) ? -EIO : 0;
}

int kp_ctr_write(FILE *f, const struct kp_ctr *t, int64_t run, int rank, const char *columns,
                 enum kp_ctr_format format, char *errbuf, size_t errlen)
{
    return write_table(f, t, run, rank, columns, format, 0, errbuf, errlen);
}

int kp_ctr_write_rows(FILE *f, const struct kp_ctr_row *rows, size_t n_rows,
                      const char *const *metrics, size_t n_metrics, const char *message,
                      int64_t run, int rank, const char *columns, enum kp_ctr_format format,
                      char *errbuf, size_t errlen)
{
    return kp_ctr_write_rows_width(f, rows, n_rows, metrics, n_metrics, message, run, rank, columns,
                                   format, 0, errbuf, errlen);
}

int kp_ctr_write_rows_width(FILE *f, const struct kp_ctr_row *rows, size_t n_rows,
                            const char *const *metrics, size_t n_metrics, const char *message,
                            int64_t run, int rank, const char *columns, enum kp_ctr_format format,
                            int width, char *errbuf, size_t errlen)
{
    struct kp_ctr t;

    /* A table without its PGresults: the writer only reads rows, metrics and message. */
    memset(&t, 0, sizeof(t));
    t.rows = (struct kp_ctr_row *) rows;
    t.n_rows = n_rows;
    t.metrics = (const char **) metrics;
    t.n_metrics = n_metrics;
    snprintf(t.message, sizeof(t.message), "%s", message != NULL ? message : "");
    return write_table(f, &t, run, rank, columns, format, width, errbuf, errlen);
}
