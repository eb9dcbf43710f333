/* kp_diff: one loaded rank against another (diff.h). */
#include "diff.h"

#include "kp_strbuf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const kp_diff_cat_names[KP_DIFF_N_CATS] = {
    "kernel",     "memcpy",   "memset", "communication", "runtime",
    "dataloader", "cpu_exec", "other",  "total",
};

double kp_diff_ratio(double base, double other, bool *defined)
{
    *defined = base > 0.0;
    return *defined ? other / base : 0.0;
}

/* ---- matching by name ------------------------------------------------------------------ */

struct entry {
    const char *name;
    const struct kp_diff_fig *fig;
    bool other;
};

static int cmp_entry(const void *pa, const void *pb)
{
    const struct entry *x = pa, *y = pb;

    return strcmp(x->name, y->name);
}

static int64_t abs64(int64_t x)
{
    return x < 0 ? -x : x;
}

static int cmp_row(const void *pa, const void *pb)
{
    const struct kp_diff_row *x = pa, *y = pb;
    int64_t dx = abs64(x->delta_ns), dy = abs64(y->delta_ns);
    int64_t sx = x->base.total_ns + x->other.total_ns, sy = y->base.total_ns + y->other.total_ns;

    if (dx != dy) {
        return dx > dy ? -1 : 1;
    }
    if (sx != sy) {
        return sx > sy ? -1 : 1;
    }
    return strcmp(x->name, y->name);
}

static void fig_add(struct kp_diff_fig *to, const struct kp_diff_fig *f)
{
    to->calls += f->calls;
    to->total_ns += f->total_ns;
    to->self_ns += f->self_ns;
    to->device_total_ns += f->device_total_ns;
    to->device_self_ns += f->device_self_ns;
}

int kp_diff_match(const struct kp_diff_item *base, size_t nb, const struct kp_diff_item *other,
                  size_t no, size_t top, int64_t min_delta_ns, struct kp_diff_table *out)
{
    size_t n = nb + no, k = 0;
    struct entry *e = calloc(n ? n : 1, sizeof(*e));

    memset(out, 0, sizeof(*out));
    out->rows = calloc(n ? n : 1, sizeof(*out->rows));
    if (e == NULL || out->rows == NULL) {
        free(e);
        free(out->rows);
        out->rows = NULL;
        return -ENOMEM;
    }
    for (size_t i = 0; i < nb; i++) {
        e[i] = (struct entry){ base[i].name ? base[i].name : "", &base[i].fig, false };
    }
    for (size_t i = 0; i < no; i++) {
        e[nb + i] = (struct entry){ other[i].name ? other[i].name : "", &other[i].fig, true };
    }
    qsort(e, n, sizeof(*e), cmp_entry);
    for (size_t i = 0; i < n;) {
        struct kp_diff_row *r = &out->rows[k++];
        bool in_base = false, in_other = false;

        r->name = e[i].name;
        for (; i < n && strcmp(e[i].name, r->name) == 0; i++) {
            fig_add(e[i].other ? &r->other : &r->base, e[i].fig);
            in_other |= e[i].other;
            in_base |= !e[i].other;
        }
        r->status = in_base && in_other ? KP_DIFF_BOTH : in_base ? KP_DIFF_VANISHED : KP_DIFF_NEW;
        r->delta_calls = (int64_t) r->other.calls - (int64_t) r->base.calls;
        r->delta_ns = r->other.total_ns - r->base.total_ns;
        r->ratio =
            kp_diff_ratio((double) r->base.total_ns, (double) r->other.total_ns, &r->ratio_defined);
        fig_add(&out->base, &r->base);
        fig_add(&out->other, &r->other);
        out->n_both += r->status == KP_DIFF_BOTH;
        out->n_new += r->status == KP_DIFF_NEW;
        out->n_vanished += r->status == KP_DIFF_VANISHED;
    }
    free(e);
    out->n_all = k;
    out->delta_ns = out->other.total_ns - out->base.total_ns;
    qsort(out->rows, k, sizeof(*out->rows), cmp_row);
    /* sorted by |delta_ns|: the rows at or above the minimum are a prefix, and so is top */
    out->n = k;
    while (min_delta_ns > 0 && out->n > 0 && abs64(out->rows[out->n - 1].delta_ns) < min_delta_ns) {
        out->n--;
    }
    if (top > 0 && top < out->n) {
        out->n = top;
    }
    return 0;
}

void kp_diff_table_fini(struct kp_diff_table *t)
{
    free(t->rows);
    memset(t, 0, sizeof(*t));
}

/* ---- the step breakdown --------------------------------------------------------------- */

static int64_t cat_total(const struct kp_an_breakdown *b, int c)
{
    int64_t s = 0;

    for (size_t i = 0; i < b->n_steps; i++) {
        s += c < KP_AN_CAT_COUNT ? b->steps[i].cost_ns[c]
                                 : b->steps[i].end_ns - b->steps[i].start_ns;
    }
    return s;
}

void kp_diff_steps(const struct kp_an_breakdown *base, const struct kp_an_breakdown *other,
                   struct kp_diff_cat *out)
{
    for (int c = 0; c < KP_DIFF_N_CATS; c++) {
        struct kp_diff_cat *x = &out[c];

        x->name = kp_diff_cat_names[c];
        x->base_avg_ns = c < KP_AN_CAT_COUNT ? base->avg_ns[c] : base->avg_total_ns;
        x->other_avg_ns = c < KP_AN_CAT_COUNT ? other->avg_ns[c] : other->avg_total_ns;
        x->delta_avg_ns = x->other_avg_ns - x->base_avg_ns;
        x->ratio = kp_diff_ratio(x->base_avg_ns, x->other_avg_ns, &x->ratio_defined);
        x->base_total_ns = cat_total(base, c);
        x->other_total_ns = cat_total(other, c);
    }
}

/* ---- the whole diff -------------------------------------------------------------------- */

/* The rows of an ops or kernels view as items; *out owned (free). */
static int items_of(const struct kp_an_table *t, bool ops, struct kp_diff_item **out)
{
    struct kp_diff_item *it = calloc(t->n ? t->n : 1, sizeof(*it));

    if (it == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (ops) {
            const struct kp_an_op_row *r = &((const struct kp_an_op_row *) t->rows)[i];

            it[i].name = r->name;
            it[i].fig = (struct kp_diff_fig){ r->calls, r->host_total_ns, r->host_self_ns,
                                              r->device_total_ns, r->device_self_ns };
        }
        else {
            const struct kp_an_kernel_row *r = &((const struct kp_an_kernel_row *) t->rows)[i];

            it[i].name = r->name;
            it[i].fig = (struct kp_diff_fig){ .calls = r->calls, .total_ns = r->total_ns };
        }
    }
    *out = it;
    return 0;
}

/* The diff of one view (ops or kernels) of the two sides into *out. */
static int diff_view(struct kp_an *base, struct kp_an *other, bool ops,
                     const struct kp_diff_opts *o, struct kp_diff_table *out)
{
    const struct kp_an_table *tb, *to;
    struct kp_diff_item *ib = NULL, *io = NULL;
    int rc;

    if ((rc = ops ? kp_an_ops(base, false, &tb) : kp_an_kernels(base, false, &tb)) != 0 ||
        (rc = ops ? kp_an_ops(other, false, &to) : kp_an_kernels(other, false, &to)) != 0 ||
        (rc = items_of(tb, ops, &ib)) != 0 || (rc = items_of(to, ops, &io)) != 0) {
        free(ib);
        return rc;
    }
    rc = kp_diff_match(ib, tb->n, io, to->n, o->top, o->min_delta_ns, out);
    free(ib);
    free(io);
    return rc;
}

int kp_diff_compute(struct kp_an *base, struct kp_an *other, const struct kp_diff_opts *o,
                    const char *base_label, const char *other_label, struct kp_diff *out)
{
    int rc = 0;

    memset(out, 0, sizeof(*out));
    if (o->steps) {
        const struct kp_an_breakdown *bb, *bo;

        /* each result lives in its own handle, so both stay valid together */
        if ((rc = kp_an_breakdown(base, o->plugin_compat, &bb)) != 0 ||
            (rc = kp_an_breakdown(other, o->plugin_compat, &bo)) != 0) {
            return rc;
        }
        out->has_steps = true;
        out->base_steps = bb->n_steps;
        out->other_steps = bo->n_steps;
        out->base_step_ns = bb->avg_total_ns;
        out->other_step_ns = bo->avg_total_ns;
        kp_diff_steps(bb, bo, out->cats);
    }
    if (o->ops) {
        if ((rc = diff_view(base, other, true, o, &out->ops)) != 0) {
            kp_diff_fini(out);
            return rc;
        }
        out->has_ops = true;
    }
    if (o->kernels) {
        if ((rc = diff_view(base, other, false, o, &out->kernels)) != 0) {
            kp_diff_fini(out);
            return rc;
        }
        out->has_kernels = true;
    }
    if ((rc = kp_diff_verdict(out, base_label, other_label)) != 0) {
        kp_diff_fini(out);
    }
    return rc;
}

void kp_diff_fini(struct kp_diff *d)
{
    kp_diff_table_fini(&d->ops);
    kp_diff_table_fini(&d->kernels);
    free(d->verdict);
    d->verdict = NULL;
}

/* ---- the verdict ----------------------------------------------------------------------- */

/* ns as "1.234 ms", "56.7 µs" or "800 ns", signed with plus (+/-) when asked. */
static const char *dur(char *buf, size_t len, double ns, bool plus)
{
    const char *sign = ns < 0 ? "-" : plus ? "+" : "";
    double a = fabs(ns);

    if (a >= 1e6) {
        snprintf(buf, len, "%s%.3f ms", sign, a / 1e6);
    }
    else if (a >= 1e3) {
        snprintf(buf, len, "%s%.1f µs", sign, a / 1e3);
    }
    else {
        snprintf(buf, len, "%s%.0f ns", sign, a);
    }
    return buf;
}

/* The row that moves the table's total most in the total's direction, or NULL. */
static const struct kp_diff_row *main_row(const struct kp_diff_table *t)
{
    for (size_t i = 0; i < t->n_all; i++) {
        const struct kp_diff_row *r = &t->rows[i];

        if (r->delta_ns != 0 && (r->delta_ns > 0) == (t->delta_ns > 0)) {
            return r;
        }
    }
    return NULL;
}

static const char *status_note(const struct kp_diff_row *r)
{
    return r->status == KP_DIFF_NEW ? ", new" : r->status == KP_DIFF_VANISHED ? ", vanished" : "";
}

/* "; kernels (2 new, 1 vanished): kernel time +1.234 ms in all (10.000 ms vs 11.234 ms),
 * mostly NAME (+1.000 ms)" for a table, names in full. Ops' host totals nest (an op's total
 * holds its children's), so their sum is no time spent: for ops (summed false) only the
 * largest change is named. */
static int table_clause(struct kp_strbuf *sb, const struct kp_diff_table *t, const char *what,
                        const char *time, bool summed)
{
    char a[32], b[32], c[32], tail[96] = "";
    const struct kp_diff_row *r = summed ? main_row(t) : (t->n_all > 0 ? &t->rows[0] : NULL);

    if (t->n_all == 0) {
        return kp_strbuf_appendf(sb, "; neither side has %s", what);
    }
    if (t->n_new > 0 || t->n_vanished > 0) {
        snprintf(tail, sizeof(tail), " (%zu new, %zu vanished)", t->n_new, t->n_vanished);
    }
    if (!summed) {
        if (r == NULL || r->delta_ns == 0) {
            return kp_strbuf_appendf(sb, "; %s%s: no %s changed", what, tail, time);
        }
        return kp_strbuf_appendf(sb, "; %s%s: largest change %s (%s %s%s)", what, tail, r->name,
                                 dur(a, sizeof(a), (double) r->delta_ns, true), time,
                                 status_note(r));
    }
    if (t->delta_ns == 0) {
        return kp_strbuf_appendf(sb, "; %s%s: the same %s in all (%s)", what, tail, time,
                                 dur(a, sizeof(a), (double) t->base.total_ns, false));
    }
    if (kp_strbuf_appendf(sb, "; %s%s: %s %s in all (%s vs %s)", what, tail, time,
                          dur(a, sizeof(a), (double) t->delta_ns, true),
                          dur(b, sizeof(b), (double) t->base.total_ns, false),
                          dur(c, sizeof(c), (double) t->other.total_ns, false)) != 0) {
        return -ENOMEM;
    }
    return r == NULL
               ? 0
               : kp_strbuf_appendf(sb, ", mostly %s (%s%s)", r->name,
                                   dur(a, sizeof(a), (double) r->delta_ns, true), status_note(r));
}

/* The step-time sentence. */
static int steps_clause(struct kp_strbuf *sb, const struct kp_diff *d, const char *base_label,
                        const char *other_label)
{
    double pct = 100.0 * (d->other_step_ns / d->base_step_ns - 1.0);
    const struct kp_diff_cat *top = NULL;
    char a[32], b[32], c[32];
    int rc;

    for (int i = 0; i < KP_AN_CAT_COUNT; i++) {
        if (d->cats[i].delta_avg_ns != 0.0 &&
            (top == NULL || fabs(d->cats[i].delta_avg_ns) > fabs(top->delta_avg_ns))) {
            top = &d->cats[i];
        }
    }
    if (d->other_step_ns == d->base_step_ns) {
        rc = kp_strbuf_appendf(sb, "%s takes the same time per step as %s (%s)", other_label,
                               base_label, dur(a, sizeof(a), d->base_step_ns, false));
    }
    else {
        rc = kp_strbuf_appendf(sb, "%s is %.*f%% %s per step than %s (%s vs %s, %s)", other_label,
                               fabs(pct) < 0.1 ? 3 : 1, fabs(pct), pct > 0 ? "slower" : "faster",
                               base_label, dur(a, sizeof(a), d->other_step_ns, false),
                               dur(b, sizeof(b), d->base_step_ns, false),
                               dur(c, sizeof(c), d->other_step_ns - d->base_step_ns, true));
    }
    if (rc != 0 || top == NULL) {
        return rc;
    }
    return kp_strbuf_appendf(sb, "; the largest change per step: %s %s", top->name,
                             dur(a, sizeof(a), top->delta_avg_ns, true));
}

int kp_diff_verdict(struct kp_diff *d, const char *base_label, const char *other_label)
{
    struct kp_strbuf sb;
    int rc;

    kp_strbuf_init(&sb, 0);
    if (d->has_steps && (d->base_steps == 0 || d->other_steps == 0)) {
        rc = kp_strbuf_appendf(&sb, "no step times to compare: %s has %zu steps, %s %zu",
                               base_label, d->base_steps, other_label, d->other_steps);
    }
    else if (d->has_steps && d->base_step_ns > 0) {
        rc = steps_clause(&sb, d, base_label, other_label);
    }
    else {
        rc = kp_strbuf_appendf(&sb, "%s against %s", other_label, base_label);
    }
    if (rc == 0 && d->has_kernels) {
        rc = table_clause(&sb, &d->kernels, "kernels", "kernel time", true);
    }
    if (rc == 0 && d->has_ops) {
        rc = table_clause(&sb, &d->ops, "ops", "host total", false);
    }
    if (rc != 0) {
        kp_strbuf_fini(&sb);
        return -ENOMEM;
    }
    free(d->verdict);
    d->verdict = sb.data;
    return 0;
}
