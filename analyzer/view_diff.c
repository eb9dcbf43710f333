/* The Diff view (Analyzer.Diff): one rank of a run (base, loaded by the service) against
 * another run's rank or another rank of the same run (other, loaded here), by analyzer/diff.h
 * (view.h).
 *
 * Caching: the key covers both sides (the base in run and rank, the other side and the
 * options in opts). The service checks only the base run's version (state, committed
 * batches) before answering from its cache, and the other run may still be taking batches,
 * so a cached diff could outlive the other side's data: until the service checks a second run,
 * Diff is answered fresh every time (.uncached says so; it only reads, so the web API serves
 * it). The diff costs two loads, as two Breakdown calls do. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "diff.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "view.h"

#define PART_STEPS   (1u << KPROF__V1__DIFF_PART__DIFF_PART_STEPS)
#define PART_OPS     (1u << KPROF__V1__DIFF_PART__DIFF_PART_OPS)
#define PART_KERNELS (1u << KPROF__V1__DIFF_PART__DIFF_PART_KERNELS)
#define PART_ALL     (PART_STEPS | PART_OPS | PART_KERNELS)

/* The options in the key: zeroed whole (padding included) before they are set. */
struct diff_opts {
    uint64_t other_run;
    int64_t min_delta_ns;
    int32_t other_rank;
    uint32_t parts; /* PART_* */
    uint32_t top;
    uint32_t plugin_compat;
};

_Static_assert(sizeof(struct diff_opts) <= KP_VIEW_OPTS_BYTES, "Diff's options fit the key");

static bool diff_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k, char *err,
                     size_t len)
{
    const Kprof__V1__DiffRequest *r = (const Kprof__V1__DiffRequest *) req;
    struct diff_opts o;

    (void) max_rows;
    memset(&o, 0, sizeof(o));
    if (!kp_view_key_init(k, r->run_id, r->rank, false, err, len)) {
        return false;
    }
    o.other_run = r->other_run_id != 0 ? r->other_run_id : r->run_id;
    if (o.other_run > INT32_MAX) {
        snprintf(err, len,
                 "other_run_id %" PRIu64 " is not a run id: `kprofctl runs` lists the runs",
                 r->other_run_id);
        return false;
    }
    if (r->other_rank < KP_VIEW_ONLY_RANK) {
        snprintf(err, len, "other_rank %d is negative", (int) r->other_rank);
        return false;
    }
    if (r->min_delta_ns < 0) {
        snprintf(err, len, "min_delta_ns %" PRId64 " is negative", r->min_delta_ns);
        return false;
    }
    for (size_t i = 0; i < r->n_parts; i++) {
        unsigned p = (unsigned) r->parts[i];

        if (p > KPROF__V1__DIFF_PART__DIFF_PART_KERNELS) {
            snprintf(err, len, "part %d is not a known part (steps, ops, kernels)",
                     (int) r->parts[i]);
            return false;
        }
        o.parts |= p == KPROF__V1__DIFF_PART__DIFF_PART_ALL ? PART_ALL : 1u << p;
    }
    if (o.parts == 0) {
        o.parts = PART_ALL;
    }
    if (o.other_run == r->run_id && r->other_rank == r->rank) {
        if (r->rank == KP_VIEW_ONLY_RANK) {
            snprintf(err, len,
                     "both sides are run %" PRIu64 "'s only rank: nothing to compare; give "
                     "another run (--run twice) or two ranks (--rank, --other-rank)",
                     r->run_id);
        }
        else {
            snprintf(err, len,
                     "both sides are run %" PRIu64 " rank %d: nothing to compare; give another "
                     "run (--run twice) or another rank (--other-rank)",
                     r->run_id, (int) r->rank);
        }
        return false;
    }
    o.other_rank = r->other_rank;
    o.top = r->top;
    o.min_delta_ns = r->min_delta_ns;
    o.plugin_compat = r->plugin_compat;
    memcpy(k->opts, &o, sizeof(o));
    return true;
}

struct diff_state {
    Kprof__V1__DiffResponse m;
    Kprof__V1__DiffSide base, other;
    Kprof__V1__DiffCategory cats[KP_DIFF_N_CATS], *cat_ptrs[KP_DIFF_N_CATS];
    Kprof__V1__DiffTotals ops_totals, kernels_totals;
    Kprof__V1__DiffFigures tot_figs[4];
    Kprof__V1__DiffRow *rows, **row_ptrs;
    Kprof__V1__DiffFigures *figs;
    struct kp_diff d;
    struct kp_an *other_an; /* the rows' names point into it (and into the service's base) */
};

static void diff_free(void *p)
{
    struct diff_state *s = p;

    kp_diff_fini(&s->d);
    free(s->rows);
    free(s->row_ptrs);
    free(s->figs);
    kp_an_destroy(s->other_an);
    free(s);
}

static void fill_fig(Kprof__V1__DiffFigures *m, const struct kp_diff_fig *f)
{
    kprof__v1__diff_figures__init(m);
    m->calls = f->calls;
    m->total_ns = f->total_ns;
    m->mean_ns = f->calls ? (double) f->total_ns / (double) f->calls : 0.0;
    m->self_ns = f->self_ns;
    m->device_total_ns = f->device_total_ns;
    m->device_self_ns = f->device_self_ns;
}

static void fill_totals(Kprof__V1__DiffTotals *m, Kprof__V1__DiffFigures *figs,
                        const struct kp_diff_table *t)
{
    kprof__v1__diff_totals__init(m);
    m->rows = t->n_all;
    m->shown = t->n;
    m->n_both = t->n_both;
    m->n_new = t->n_new;
    m->n_vanished = t->n_vanished;
    fill_fig(&figs[0], &t->base);
    fill_fig(&figs[1], &t->other);
    m->base_figures = &figs[0];
    m->other_figures = &figs[1];
    m->delta_ns = t->delta_ns;
}

/* The shown rows of t into rows[0..t->n) and its figures into figs (2 per row). */
static void fill_rows(const struct kp_diff_table *t, Kprof__V1__DiffRow *rows,
                      Kprof__V1__DiffRow **ptrs, Kprof__V1__DiffFigures *figs)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct kp_diff_row *r = &t->rows[i];
        Kprof__V1__DiffRow *m = &rows[i];

        kprof__v1__diff_row__init(m);
        m->name = (char *) r->name;
        m->status = r->status == KP_DIFF_NEW        ? KPROF__V1__DIFF_STATUS__DIFF_STATUS_NEW
                    : r->status == KP_DIFF_VANISHED ? KPROF__V1__DIFF_STATUS__DIFF_STATUS_VANISHED
                                                    : KPROF__V1__DIFF_STATUS__DIFF_STATUS_BOTH;
        fill_fig(&figs[2 * i], &r->base);
        fill_fig(&figs[2 * i + 1], &r->other);
        m->base_figures = &figs[2 * i];
        m->other_figures = &figs[2 * i + 1];
        m->delta_calls = r->delta_calls;
        m->delta_ns = r->delta_ns;
        m->ratio = r->ratio;
        m->ratio_defined = r->ratio_defined;
        ptrs[i] = m;
    }
}

static void fill_side(Kprof__V1__DiffSide *m, uint64_t run, int32_t rank, size_t n_steps,
                      double step_ns)
{
    kprof__v1__diff_side__init(m);
    m->run_id = run;
    m->rank = rank;
    m->n_steps = n_steps;
    m->step_avg_ns = step_ns;
}

/* The reply of s->d into s->m. Returns 0 or -ENOMEM. */
static int fill_reply(struct diff_state *s, const struct kp_view_key *k, const struct diff_opts *o)
{
    const struct kp_diff *d = &s->d;
    size_t n = d->ops.n + d->kernels.n;

    s->rows = calloc(n ? n : 1, sizeof(*s->rows));
    s->row_ptrs = calloc(n ? n : 1, sizeof(*s->row_ptrs));
    s->figs = calloc(2 * (n ? n : 1), sizeof(*s->figs));
    if (s->rows == NULL || s->row_ptrs == NULL || s->figs == NULL) {
        return -ENOMEM;
    }
    kprof__v1__diff_response__init(&s->m);
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    fill_side(&s->base, k->run, k->rank, d->base_steps, d->base_step_ns);
    fill_side(&s->other, o->other_run, o->other_rank, d->other_steps, d->other_step_ns);
    s->m.base_side = &s->base;
    s->m.other_side = &s->other;
    s->m.has_steps = d->has_steps;
    s->m.has_ops = d->has_ops;
    s->m.has_kernels = d->has_kernels;
    s->m.plugin_compat = o->plugin_compat != 0;
    if (d->has_steps) {
        for (size_t i = 0; i < KP_DIFF_N_CATS; i++) {
            const struct kp_diff_cat *c = &d->cats[i];
            Kprof__V1__DiffCategory *m = &s->cats[i];

            kprof__v1__diff_category__init(m);
            m->category = (char *) c->name;
            m->base_avg_ns = c->base_avg_ns;
            m->other_avg_ns = c->other_avg_ns;
            m->delta_avg_ns = c->delta_avg_ns;
            m->ratio = c->ratio;
            m->ratio_defined = c->ratio_defined;
            m->base_total_ns = c->base_total_ns;
            m->other_total_ns = c->other_total_ns;
            s->cat_ptrs[i] = m;
        }
        s->m.n_steps = KP_DIFF_N_CATS;
        s->m.steps = s->cat_ptrs;
    }
    if (d->has_ops) {
        fill_rows(&d->ops, s->rows, s->row_ptrs, s->figs);
        s->m.n_ops = d->ops.n;
        s->m.ops = s->row_ptrs;
        fill_totals(&s->ops_totals, &s->tot_figs[0], &d->ops);
        s->m.ops_totals = &s->ops_totals;
    }
    if (d->has_kernels) {
        fill_rows(&d->kernels, s->rows + d->ops.n, s->row_ptrs + d->ops.n, s->figs + 2 * d->ops.n);
        s->m.n_kernels = d->kernels.n;
        s->m.kernels = s->row_ptrs + d->ops.n;
        fill_totals(&s->kernels_totals, &s->tot_figs[2], &d->kernels);
        s->m.kernels_totals = &s->kernels_totals;
    }
    s->m.verdict = (char *) d->verdict;
    return 0;
}

/* Loads the other side into s->other_an, its rank resolved into o->other_rank. Returns 0 or a
 * compute error with a message that names the other side. */
static int load_other(struct kp_view_ctx *c, struct diff_opts *o, struct diff_state *s)
{
    const struct kp_view_key *k = c->key;
    char msg[600];
    int state, rc;
    int64_t batches;

    if ((rc = kp_view_run_version(c->pg, o->other_run, &state, &batches, msg, sizeof(msg))) != 0) {
        snprintf(c->err, c->errlen, "the other side: %s", msg);
        return rc;
    }
    if (o->other_rank == KP_VIEW_ONLY_RANK &&
        (rc = kp_view_resolve_rank(c->pg, o->other_run, &o->other_rank, msg, sizeof(msg))) != 0) {
        snprintf(c->err, c->errlen, "the other side: %s%s", msg,
                 rc == -EINVAL ? " (the other side's: --other-rank)" : "");
        return rc;
    }
    if (o->other_run == k->run && o->other_rank == k->rank) {
        snprintf(c->err, c->errlen,
                 "both sides are run %" PRIu64 " rank %d: nothing to compare; give another run "
                 "(--run twice) or another rank (--other-rank)",
                 k->run, (int) k->rank);
        return -EINVAL;
    }
    rc = kp_an_create(c->pg, (int64_t) o->other_run, (int) o->other_rank, c->max_rows, &s->other_an,
                      msg, sizeof(msg));
    if (rc != 0) {
        snprintf(c->err, c->errlen, "the other side: %s", msg);
    }
    return rc;
}

static int diff_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct diff_opts o;
    struct kp_diff_opts dopts;
    struct diff_state *s = calloc(1, sizeof(*s));
    char bl[64], ol[64];
    int rc;

    memcpy(&o, k->opts, sizeof(o));
    if (s == NULL) {
        return -ENOMEM;
    }
    if ((rc = load_other(c, &o, s)) != 0) {
        diff_free(s);
        return rc;
    }
    dopts = (struct kp_diff_opts){ .steps = (o.parts & PART_STEPS) != 0,
                                   .ops = (o.parts & PART_OPS) != 0,
                                   .kernels = (o.parts & PART_KERNELS) != 0,
                                   .top = o.top,
                                   .min_delta_ns = o.min_delta_ns,
                                   .plugin_compat = o.plugin_compat != 0 };
    snprintf(bl, sizeof(bl), "run %" PRIu64 " rank %d", k->run, (int) k->rank);
    snprintf(ol, sizeof(ol), "run %" PRIu64 " rank %d", o.other_run, (int) o.other_rank);
    if ((rc = kp_diff_compute(c->an, s->other_an, &dopts, bl, ol, &s->d)) != 0 ||
        (rc = fill_reply(s, k, &o)) != 0) {
        diff_free(s);
        return rc;
    }
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = diff_free;
    return 0;
}

/* The other side of the diff, which the service's memory budget counts too. */
static void diff_other_rank(const struct kp_view_key *k, uint64_t *run, int32_t *rank)
{
    struct diff_opts o;

    memcpy(&o, k->opts, sizeof(o));
    *run = o.other_run;
    *rank = o.other_rank;
}

const struct kp_view kp_view_diff = {
    .name = "Diff",
    .request = &kprof__v1__diff_request__descriptor,
    .reply = &kprof__v1__diff_response__descriptor,
    .load_rank = true,
    .key = diff_key,
    .compute = diff_compute,
    .uncached = true,
    .bytes_per_event = 150,
    .other_rank = diff_other_rank,
};
