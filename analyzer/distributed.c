/*
 * distributed: the plugin's wait view and communication-ops table across ranks (see
 * distributed.h).
 *
 * DESIGN. Each rank is loaded with kp_an_create and its steps and communication nodes come from
 * the analyzer core (kp_an_breakdown, kp_an_comm_nodes: the same nodes and intervals that the
 * breakdown's Communication category and the overlap view use). Only the nodes are kept: per
 * rank one interval array, each node's op row (name, calls, bytes) and wait entry (its step).
 * Once every rank is in, the enable condition is checked, the real intervals are cut per
 * (node, interval) from the shortest one over the ranks, and the unions are measured.
 */
#include "distributed.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"

#define MAX_INPUTS 256 /* input types read per op; later inputs count 0 bytes */

/* ---- input bytes ----------------------------------------------------------------------- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n') {
        p++;
    }
    return p;
}

static int64_t mul_sat(int64_t a, int64_t b)
{
    int64_t r;

    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t add_sat(int64_t a, int64_t b)
{
    int64_t r;

    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

/* Reads one shape item at p: an integer, or a list: the product of its integers (a shape;
 * [] is 1), or the sum of its lists' values (a list of tensors). Sets *val; returns the text
 * after it, or NULL for text it cannot read. */
static const char *shape_item(const char *p, int depth, int64_t *val)
{
    int64_t prod = 1, sum = 0;
    bool lists = false;

    p = skip_ws(p);
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
        char *end;
        long long v = strtoll(p, &end, 10);

        *val = v < 0 ? 0 : (int64_t) v;
        return end;
    }
    if (*p != '[' || depth > 16) {
        return NULL;
    }
    p = skip_ws(p + 1);
    while (*p != ']') {
        int64_t v;
        bool list = *p == '[';

        if (!(p = shape_item(p, depth + 1, &v))) {
            return NULL;
        }
        if (list) {
            lists = true;
            sum = add_sat(sum, v);
        }
        else {
            prod = mul_sat(prod, v);
        }
        p = skip_ws(p);
        if (*p == ',') {
            p = skip_ws(p + 1);
        }
        else if (*p != ']') {
            return NULL;
        }
    }
    *val = lists ? sum : prod;
    return p + 1;
}

/* The plugin's element sizes (spec §9); anything else is 0. */
static int64_t elem_size(const char *s, size_t n)
{
    static const struct {
        const char *name;
        int64_t size;
    } t[] = { { "long int", 8 },  { "float", 4 },         { "int", 4 },
              { "c10::Half", 2 }, { "c10::BFloat16", 2 }, { "unsigned char", 1 } };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (strlen(t[i].name) == n && memcmp(t[i].name, s, n) == 0) {
            return t[i].size;
        }
    }
    return 0;
}

/* Reads the quoted strings of a list ("['float', \"c10::Half\"]") into sizes[]; returns the
 * count (those past max are dropped), or 0 for text it cannot read. */
static size_t dtype_sizes(const char *p, int64_t *sizes, size_t max)
{
    size_t n = 0;

    p = skip_ws(p);
    if (*p++ != '[') {
        return 0;
    }
    for (p = skip_ws(p); *p != ']'; p = skip_ws(p)) {
        char q = *p;
        const char *s = p + 1, *e;

        if (q != '\'' && q != '"') {
            return 0;
        }
        for (e = s; *e && *e != q; e++) {
            if (*e == '\\' && e[1]) {
                e++;
            }
        }
        if (!*e) {
            return 0;
        }
        if (n < max) {
            sizes[n] = elem_size(s, (size_t) (e - s));
        }
        n++;
        p = skip_ws(e + 1);
        if (*p == ',') {
            p++;
        }
        else if (*p != ']') {
            return 0;
        }
    }
    return n < max ? n : max;
}

int64_t kp_distributed_input_bytes(const char *shapes, const char *dtypes)
{
    int64_t sizes[MAX_INPUTS], total = 0;
    size_t n_types, i = 0;
    const char *p;

    if (!shapes || !dtypes) {
        return 0;
    }
    n_types = dtype_sizes(dtypes, sizes, MAX_INPUTS);
    p = skip_ws(shapes);
    if (*p++ != '[') {
        return 0;
    }
    for (p = skip_ws(p); *p != ']'; p = skip_ws(p), i++) {
        int64_t v;

        if (!(p = shape_item(p, 0, &v))) {
            return 0;
        }
        if (i < n_types) {
            total = add_sat(total, mul_sat(v, sizes[i]));
        }
        p = skip_ws(p);
        if (*p == ',') {
            p++;
        }
        else if (*p != ']') {
            return 0;
        }
    }
    return total;
}

/* ---- building ----------------------------------------------------------------------------- */

static void rank_fini(struct kp_distributed_rank *r)
{
    for (size_t i = 0; i < r->n_ops; i++) {
        free(r->ops[i].name);
    }
    free(r->ops);
    free(r->nodes);
    free(r->ranges);
    free(r->real);
    free(r->wait);
}

void kp_distributed_destroy(struct kp_distributed *d)
{
    if (!d) {
        return;
    }
    for (size_t i = 0; i < d->n_ranks; i++) {
        rank_fini(&d->ranks[i]);
    }
    free(d->ranks);
    free(d);
}

/* Takes the nodes of c (borrowed from the handle whose steps are b's) into r. */
static int rank_take(struct kp_distributed_rank *r, const struct kp_an_comm *c,
                     const struct kp_an_breakdown *b)
{
    size_t n_ranges = 0;
    int32_t last_step = -2, last_w = -1;

    r->nodes = calloc(c->n_nodes + 1, sizeof(*r->nodes));
    r->ops = calloc(c->n_nodes + 1, sizeof(*r->ops));
    r->wait = calloc(c->n_nodes + 1, sizeof(*r->wait));
    for (size_t i = 0; i < c->n_nodes; i++) {
        n_ranges += c->nodes[i].n;
    }
    r->ranges = calloc(n_ranges + 1, sizeof(*r->ranges));
    r->real = calloc(n_ranges + 1, sizeof(*r->real));
    if (!r->nodes || !r->ops || !r->wait || !r->ranges || !r->real) {
        return -ENOMEM;
    }
    n_ranges = 0;
    for (size_t i = 0; i < c->n_nodes; i++) {
        const struct kp_an_comm_node *cn = &c->nodes[i];
        struct kp_distributed_node *dn = &r->nodes[i];
        size_t k = 0;

        while (k < r->n_ops && strcmp(r->ops[k].name, cn->name) != 0) {
            k++;
        }
        if (k == r->n_ops) {
            if (!(r->ops[k].name = strdup(cn->name))) {
                return -ENOMEM;
            }
            r->n_ops++;
        }
        r->ops[k].calls++;
        r->ops[k].total_bytes = add_sat(
            r->ops[k].total_bytes, kp_distributed_input_bytes(cn->input_shapes, cn->input_dtypes));
        dn->op = (int32_t) k;
        /* wait entries, in the order the nodes reach them: each step with nodes, and one for
         * the nodes in none (a node straddling a step end may come between a step's nodes) */
        if (cn->step != last_step) {
            size_t w = 0;

            while (w < r->n_wait && r->wait[w].step != cn->step) {
                w++;
            }
            if (w == r->n_wait) {
                r->wait[w].step = cn->step;
                if (cn->step >= 0) {
                    snprintf(r->wait[w].step_name, sizeof(r->wait[w].step_name), "%s",
                             b->steps[cn->step].name);
                }
                r->n_wait++;
            }
            last_step = cn->step;
            last_w = (int32_t) w;
        }
        dn->wait = last_w;
        dn->first = n_ranges;
        dn->n = cn->n;
        memcpy(r->ranges + n_ranges, c->ranges + cn->first, cn->n * sizeof(*r->ranges));
        n_ranges += cn->n;
    }
    r->n_nodes = c->n_nodes;
    return 0;
}

/* Loads one rank and takes its nodes; sets d->reason when the rank disables the view. */
static int load_rank(PGconn *c, struct kp_distributed *d, struct kp_distributed_rank *r,
                     size_t max_rows, char *errbuf, size_t errlen)
{
    struct kp_an *a = NULL;
    struct kp_an_comm comm = { 0 };
    const struct kp_an_breakdown *b;
    int rc = kp_an_create(c, d->run, r->rank, max_rows, &a, errbuf, errlen);

    if (rc == 0) {
        rc = kp_an_breakdown(a, false, &b);
    }
    if (rc == 0) {
        rc = kp_an_comm_nodes(a, &comm);
    }
    if (rc == 0) {
        if (comm.nccl && comm.gloo) {
            snprintf(d->reason, sizeof(d->reason),
                     "rank %d has both NCCL and Gloo communication ops (the plugin disables the "
                     "view then)",
                     r->rank);
        }
        else if (comm.n_nodes == 0) {
            snprintf(d->reason, sizeof(d->reason),
                     "rank %d has no communication ops (nccl:* or gloo:* broadcast, reduce, "
                     "all_reduce, all_gather, reduce_scatter)",
                     r->rank);
        }
        else {
            rc = rank_take(r, &comm, b);
        }
    }
    if (rc == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory building the distributed view of run %" PRId64,
                      d->run);
    }
    kp_an_comm_fini(&comm);
    kp_an_destroy(a);
    return rc;
}

/* The plugin's enable condition once every rank is in; sets d->reason if it fails. */
static bool check_match(struct kp_distributed *d)
{
    const struct kp_distributed_rank *r0 = &d->ranks[0];

    for (size_t k = 1; k < d->n_ranks; k++) {
        const struct kp_distributed_rank *r = &d->ranks[k];

        if (r->n_nodes != r0->n_nodes) {
            snprintf(d->reason, sizeof(d->reason),
                     "rank %d has %zu communication ops and rank %d has %zu: the ranks' ops must "
                     "match one to one",
                     r->rank, r->n_nodes, r0->rank, r0->n_nodes);
            return false;
        }
    }
    for (size_t i = 0; i < r0->n_nodes; i++) {
        for (size_t k = 1; k < d->n_ranks; k++) {
            const struct kp_distributed_rank *r = &d->ranks[k];

            if (r->nodes[i].n != r0->nodes[i].n) {
                snprintf(d->reason, sizeof(d->reason),
                         "communication op #%zu (%s) has %zu intervals (its span and its "
                         "kernels) on rank %d and %zu on rank %d: they must match",
                         i, r0->ops[r0->nodes[i].op].name, r->nodes[i].n, r->rank, r0->nodes[i].n,
                         r0->rank);
                return false;
            }
        }
    }
    return true;
}

/* |union| of src's intervals (r->ranges or r->real) of r's nodes of op `op` or wait entry
 * `wait` (-1: any); tmp holds them all. */
static int64_t union_len(const struct kp_distributed_rank *r, const struct kp_range *src,
                         struct kp_range *tmp, int32_t op, int32_t wait)
{
    size_t n = 0;

    for (size_t i = 0; i < r->n_nodes; i++) {
        const struct kp_distributed_node *dn = &r->nodes[i];

        if ((op >= 0 && dn->op != op) || (wait >= 0 && dn->wait != wait)) {
            continue;
        }
        memcpy(tmp + n, src + dn->first, dn->n * sizeof(*tmp));
        n += dn->n;
    }
    n = kp_ranges_merge(tmp, n);
    return kp_ranges_length(tmp, n);
}

static int compute(struct kp_distributed *d)
{
    const struct kp_distributed_rank *r0 = &d->ranks[0];

    /* real intervals: [end - m, end], m the shortest interval j of node i over the ranks */
    for (size_t i = 0; i < r0->n_nodes; i++) {
        for (size_t j = 0; j < r0->nodes[i].n; j++) {
            int64_t m = INT64_MAX;

            for (size_t k = 0; k < d->n_ranks; k++) {
                const struct kp_range *x = &d->ranks[k].ranges[d->ranks[k].nodes[i].first + j];

                m = x->end - x->start < m ? x->end - x->start : m;
            }
            for (size_t k = 0; k < d->n_ranks; k++) {
                struct kp_distributed_rank *r = &d->ranks[k];
                size_t at = r->nodes[i].first + j;

                r->real[at] = (struct kp_range){ r->ranges[at].end - m, r->ranges[at].end };
            }
        }
    }
    for (size_t k = 0; k < d->n_ranks; k++) {
        struct kp_distributed_rank *r = &d->ranks[k];
        size_t n = r->n_nodes ? r->nodes[r->n_nodes - 1].first + r->nodes[r->n_nodes - 1].n : 0;
        struct kp_range *tmp = calloc(n + 1, sizeof(*tmp));
        double sum_t = 0, sum_s = 0;

        if (!tmp) {
            return -ENOMEM;
        }
        for (size_t w = 0; w < r->n_wait; w++) {
            r->wait[w].latency_ns = union_len(r, r->ranges, tmp, -1, (int32_t) w);
            r->wait[w].transfer_ns = union_len(r, r->real, tmp, -1, (int32_t) w);
            sum_t += (double) r->wait[w].transfer_ns / 1e3;
            sum_s += (double) (r->wait[w].latency_ns - r->wait[w].transfer_ns) / 1e3;
        }
        if (r->n_wait) { /* int(x / steps) */
            r->wait_all_transfer_us = (int64_t) (sum_t / (double) r->n_wait);
            r->wait_all_sync_us = (int64_t) (sum_s / (double) r->n_wait);
        }
        for (size_t o = 0; o < r->n_ops; o++) {
            r->ops[o].latency_ns = union_len(r, r->ranges, tmp, (int32_t) o, -1);
            r->ops[o].transfer_ns = union_len(r, r->real, tmp, (int32_t) o, -1);
        }
        free(tmp);
    }
    return 0;
}

int kp_distributed_create(PGconn *c, int64_t run, size_t max_rows, struct kp_distributed **out,
                          char *errbuf, size_t errlen)
{
    char runs[24];
    const char *params[1] = { runs };
    struct kp_distributed *d;
    PGresult *r = NULL;
    size_t n;
    int rc;

    snprintf(runs, sizeof(runs), "%" PRId64, run);
    d = calloc(1, sizeof(*d));
    if (!d) {
        return -ENOMEM;
    }
    d->run = run;
    rc = kp_pg_query(c,
                     "SELECT (SELECT count(*) FROM runs WHERE id = $1), rank FROM ranks "
                     "RIGHT JOIN (SELECT 1) one ON run_id = $1 ORDER BY rank",
                     1, params, &r, errbuf, errlen);
    if (rc < 0) {
        goto fail;
    }
    if (kp_pg_i64(r, 0, 0, 0) == 0) {
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " does not exist: `kprofctl runs` lists the runs", run);
        rc = KP_ENOTFOUND;
        goto fail;
    }
    n = PQgetisnull(r, 0, 1) ? 0 : (size_t) PQntuples(r);
    d->ranks = calloc(n + 1, sizeof(*d->ranks));
    if (!d->ranks) {
        rc = -ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        d->ranks[i].rank = (int) kp_pg_i64(r, (int) i, 1, 0);
    }
    d->n_ranks = n;
    PQclear(r);
    r = NULL;
    if (n == 0) {
        snprintf(d->reason, sizeof(d->reason), "run %" PRId64 " has no ranks", run);
    }
    for (size_t i = 0; i < n && !d->reason[0]; i++) {
        if ((rc = load_rank(c, d, &d->ranks[i], max_rows, errbuf, errlen)) < 0) {
            goto fail;
        }
    }
    if (!d->reason[0] && check_match(d)) {
        if ((rc = compute(d)) < 0) {
            goto fail;
        }
        d->enabled = true;
    }
    if (!d->enabled) { /* keep nothing half-made */
        for (size_t i = 0; i < d->n_ranks; i++) {
            rank_fini(&d->ranks[i]);
        }
        d->n_ranks = 0;
    }
    *out = d;
    return 0;
fail:
    PQclear(r);
    kp_distributed_destroy(d);
    return rc;
}

/* ---- output ----------------------------------------------------------------------------- */

/* round(x) as Python 3 does it: half to even (the default rounding mode). */
static int64_t round_even(double x)
{
    return (int64_t) nearbyint(x);
}

void kp_distributed_json(FILE *f, const struct kp_distributed *d)
{
    fprintf(f, "{\"run\": %" PRId64 ", \"enabled\": %s, \"reason\": ", d->run,
            d->enabled ? "true" : "false");
    if (d->enabled) {
        fputs("null", f);
    }
    else {
        kp_json_fputs(f, d->reason);
    }
    fputs(", \"ranks\": [", f);
    for (size_t k = 0; k < d->n_ranks; k++) {
        const struct kp_distributed_rank *r = &d->ranks[k];

        fprintf(f, "%s{\"rank\": %d, \"comm_node_count\": %zu, \"wait\": [", k ? ", " : "", r->rank,
                r->n_nodes);
        for (size_t w = 0; w < r->n_wait; w++) {
            const struct kp_distributed_wait *x = &r->wait[w];

            fputs(w ? ", {\"index\": " : "{\"index\": ", f);
            if (x->step < 0) {
                fputs("null, \"step\": null", f);
            }
            else {
                fprintf(f, "%d, \"step\": ", (int) x->step);
                kp_json_fputs(f, x->step_name);
            }
            fputs(", \"data_transfer_us\": ", f);
            kp_an_json_us(f, x->transfer_ns);
            fputs(", \"synchronizing_us\": ", f);
            kp_an_json_us(f, x->latency_ns - x->transfer_ns);
            fputc('}', f);
        }
        fprintf(f,
                "], \"wait_all\": {\"data_transfer_us\": %" PRId64
                ", \"synchronizing_us\": %" PRId64 "}, \"comm_ops\": [",
                r->wait_all_transfer_us, r->wait_all_sync_us);
        for (size_t o = 0; o < r->n_ops; o++) {
            const struct kp_distributed_op *op = &r->ops[o];
            double calls = (double) op->calls;

            fputs(o ? ", {\"name\": " : "{\"name\": ", f);
            kp_json_fputs(f, op->name);
            fprintf(f,
                    ", \"calls\": %" PRIu64 ", \"total_size_bytes\": %" PRId64
                    ", \"avg_size_bytes\": %" PRId64 ", \"total_latency_us\": ",
                    op->calls, op->total_bytes, round_even((double) op->total_bytes / calls));
            kp_an_json_us(f, op->latency_ns);
            fprintf(f, ", \"avg_latency_us\": %" PRId64 ", \"data_transfer_us\": ",
                    round_even((double) op->latency_ns / 1e3 / calls));
            kp_an_json_us(f, op->transfer_ns);
            fprintf(f, ", \"avg_data_transfer_us\": %" PRId64 "}",
                    round_even((double) op->transfer_ns / 1e3 / calls));
        }
        fputs("]}", f);
    }
    fputs("]}\n", f);
}

void kp_distributed_text(FILE *f, const struct kp_distributed *d)
{
    if (!d->enabled) {
        fprintf(f, "no distributed view: %s\n", d->reason);
        return;
    }
    fprintf(f, "%-6s %-8s %16s %16s\n", "rank", "step", "data_transfer", "synchronizing");
    for (size_t k = 0; k < d->n_ranks; k++) {
        const struct kp_distributed_rank *r = &d->ranks[k];

        for (size_t w = 0; w < r->n_wait; w++) {
            fprintf(f, "%-6d %-8s %16.3f %16.3f\n", r->rank,
                    r->wait[w].step < 0 ? "(none)" : r->wait[w].step_name,
                    (double) r->wait[w].transfer_ns / 1e3,
                    (double) (r->wait[w].latency_ns - r->wait[w].transfer_ns) / 1e3);
        }
        fprintf(f, "%-6d %-8s %16" PRId64 " %16" PRId64 "\n", r->rank, "all",
                r->wait_all_transfer_us, r->wait_all_sync_us);
    }
    fprintf(f, "\n%-6s %8s %16s %14s %14s  %s\n", "rank", "calls", "total_bytes", "latency",
            "transfer", "op (µs)");
    for (size_t k = 0; k < d->n_ranks; k++) {
        const struct kp_distributed_rank *r = &d->ranks[k];

        for (size_t o = 0; o < r->n_ops; o++) {
            fprintf(f, "%-6d %8" PRIu64 " %16" PRId64 " %14.3f %14.3f  %s\n", r->rank,
                    r->ops[o].calls, r->ops[o].total_bytes, (double) r->ops[o].latency_ns / 1e3,
                    (double) r->ops[o].transfer_ns / 1e3, r->ops[o].name);
        }
    }
}
