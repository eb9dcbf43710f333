/*
 * kp_compare_pb: compare.h's result and HTA call as Analyzer.Compare's reply, and back
 * (compare_pb.h).
 */
#include "compare_pb.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"

enum {
    ARR_RANKS,
    ARR_STEPS,
    ARR_STRAGGLERS,
    ARR_EVIDENCE,
    ARR_PTRS,
    ARR_HTA_ROWS,
    ARR_HTA_PTRS,
    ARR_LATE,
    ARR_STEP_TIME
};

/* compare.h's cause c as the proto's enum, and back (-1: not a cause). */
static Kprof__V1__CompareCause cause_to_pb(enum kp_compare_cause c)
{
    return (Kprof__V1__CompareCause) ((int) c + 1);
}

static int cause_from_pb(Kprof__V1__CompareCause c)
{
    int i = (int) c - 1;

    return i >= 0 && i < KP_COMPARE_CAUSE_COUNT ? i : -1;
}

/* One calloc for n items of size sz (at least one, so that 0 items is not an error). */
static void *alloc_n(size_t n, size_t sz)
{
    return calloc(n ? n : 1, sz);
}

int kp_compare_pb_init(struct kp_compare_pb *p, const struct kp_compare_result *r)
{
    Kprof__V1__CompareResponse *m = &p->msg;
    Kprof__V1__CompareRank *ranks;
    Kprof__V1__CompareStep *steps;
    Kprof__V1__CompareStraggler *str;
    Kprof__V1__CompareEvidence *ev;
    void **ptrs;
    double *late, *step_time;
    size_t n_ev = r->n_stragglers * KP_COMPARE_CAUSE_COUNT, used = 0;

    memset(p, 0, sizeof(*p));
    kprof__v1__compare_response__init(m);
    kprof__v1__compare_thresholds__init(&p->thresholds);
    kprof__v1__compare_hta__init(&p->hta);
    ranks = p->arr[ARR_RANKS] = alloc_n(r->n_ranks, sizeof(*ranks));
    steps = p->arr[ARR_STEPS] = alloc_n(r->n_steps, sizeof(*steps));
    str = p->arr[ARR_STRAGGLERS] = alloc_n(r->n_stragglers, sizeof(*str));
    ev = p->arr[ARR_EVIDENCE] = alloc_n(n_ev, sizeof(*ev));
    /* one array of pointers for every repeated message field: ranks, steps, stragglers,
     * then each straggler's evidence */
    ptrs = p->arr[ARR_PTRS] =
        alloc_n(r->n_ranks + r->n_steps + r->n_stragglers + n_ev, sizeof(*ptrs));
    late = p->arr[ARR_LATE] = alloc_n(r->n_ranks * r->n_steps, sizeof(*late));
    step_time = p->arr[ARR_STEP_TIME] = alloc_n(r->n_ranks * r->n_steps, sizeof(*step_time));
    if (ranks == NULL || steps == NULL || str == NULL || ev == NULL || ptrs == NULL ||
        late == NULL || step_time == NULL) {
        return -ENOMEM;
    }
    m->run_id = (uint64_t) r->run;
    m->n_ranks = r->n_ranks;
    m->ranks = (Kprof__V1__CompareRank **) (ptrs + used);
    for (size_t i = 0; i < r->n_ranks; i++) {
        const struct kp_compare_rank *k = &r->ranks[i];
        Kprof__V1__CompareRank *o = &ranks[i];

        kprof__v1__compare_rank__init(o);
        o->rank = k->rank;
        o->step_ns = k->step_ns;
        o->vs_median = k->vs_median;
        o->collective_ns = k->coll_ns;
        o->late_ns = k->late_ns;
        o->compute_ns = k->compute_ns;
        o->host_ns = k->host_ns;
        o->launch_ns = k->launch_ns;
        o->other_ns = k->other_ns;
        o->clock_offset_ns = k->clock_offset_ns;
        o->has_offset = k->has_offset;
        o->late_steps = k->n_late_steps;
        o->straggler = k->straggler;
        o->waits = k->waits;
        o->late = k->late;
        o->host = (char *) k->host;
        o->node = k->node;
        o->local_rank = k->local_rank;
        o->offset_spread_ns = k->offset_spread_ns;
        o->offset_collectives = k->offset_n;
        o->n_step_late_ns = r->n_steps;
        o->step_late_ns = late + i * r->n_steps;
        o->n_step_time_ns = r->n_steps;
        o->step_time_ns = step_time + i * r->n_steps;
        for (size_t j = 0; j < r->n_steps; j++) {
            const struct kp_compare_cell *cl =
                r->cells != NULL ? &r->cells[i * r->n_steps + j] : NULL;
            bool present = cl != NULL && cl->present;

            o->step_late_ns[j] = present ? cl->late_ns : NAN;
            o->step_time_ns[j] = present ? (double) cl->step_ns : NAN;
        }
        ptrs[used++] = o;
    }
    m->n_steps = r->n_steps;
    m->steps = (Kprof__V1__CompareStep **) (ptrs + used);
    for (size_t j = 0; j < r->n_steps; j++) {
        const struct kp_compare_step *s = &r->steps[j];
        Kprof__V1__CompareStep *o = &steps[j];

        kprof__v1__compare_step__init(o);
        o->step = s->step;
        o->ranks = s->n_ranks;
        o->collectives = s->n_coll;
        o->step_median_ns = s->step_median_ns;
        o->step_max_ns = s->step_max_ns;
        o->step_ratio = s->step_ratio;
        o->collective_median_ns = s->coll_median_ns;
        o->collective_max_ns = s->coll_max_ns;
        o->collective_ratio = s->coll_ratio;
        o->last_rank = s->last_rank;
        o->hta_rank = s->hta_rank;
        ptrs[used++] = o;
    }
    m->n_stragglers = r->n_stragglers;
    m->stragglers = (Kprof__V1__CompareStraggler **) (ptrs + used);
    used += r->n_stragglers;
    for (size_t i = 0; i < r->n_stragglers; i++) {
        const struct kp_compare_straggler *s = &r->stragglers[i];
        Kprof__V1__CompareStraggler *o = &str[i];

        kprof__v1__compare_straggler__init(o);
        o->rank = s->rank;
        o->n_steps = s->n_steps;
        o->steps = s->steps;
        o->late_ns = s->late_ns;
        o->max_late_ns = s->max_late_ns;
        o->cause = cause_to_pb(s->cause);
        o->n_evidence = KP_COMPARE_CAUSE_COUNT;
        o->evidence = (Kprof__V1__CompareEvidence **) (ptrs + used);
        for (int c = 0; c < KP_COMPARE_CAUSE_COUNT; c++) {
            Kprof__V1__CompareEvidence *e = &ev[i * KP_COMPARE_CAUSE_COUNT + (size_t) c];

            kprof__v1__compare_evidence__init(e);
            e->cause = cause_to_pb((enum kp_compare_cause) c);
            e->own_ns = s->own_ns[c];
            e->excess_ns = s->excess_ns[c];
            e->median_ns = s->own_ns[c] - s->excess_ns[c];
            ptrs[used++] = e;
        }
        m->stragglers[i] = o;
    }
    m->step_median_ns = r->step_median_ns;
    m->verdict = (char *) r->verdict;
    m->world_size = r->world_size > 0 ? (uint32_t) r->world_size : 0;
    m->n_missing_ranks = r->n_missing;
    m->missing_ranks = r->missing;
    m->waited_for = r->waited_for;
    m->hta_rank = r->hta_rank;
    m->hta_rank_steps = r->hta_rank_steps;
    m->collectives = r->n_groups;
    m->p2p_collectives = r->n_p2p;
    m->offset_collectives = r->n_offset_colls;
    m->ranks_without_offset = r->n_no_offset;
    return 0;
}

int kp_compare_pb_init_hta(struct kp_compare_pb *p, const struct kp_compare_hta *h, int k)
{
    Kprof__V1__CompareHtaRow *rows;
    Kprof__V1__CompareHtaRow **ptrs;
    Kprof__V1__CompareHta *o = &p->hta;

    memset(p, 0, sizeof(*p));
    kprof__v1__compare_response__init(&p->msg);
    kprof__v1__compare_thresholds__init(&p->thresholds);
    kprof__v1__compare_hta__init(o);
    rows = p->arr[ARR_HTA_ROWS] = alloc_n(h->n_rows, sizeof(*rows));
    ptrs = p->arr[ARR_HTA_PTRS] = alloc_n(h->n_rows, sizeof(*ptrs));
    if (rows == NULL || ptrs == NULL) {
        return -ENOMEM;
    }
    o->collective = h->collective != NULL ? h->collective : (char *) "";
    o->note = (char *) h->note;
    o->stream = h->stream;
    o->mean_step_ns = h->mean_step_ns;
    for (size_t i = 0; i < h->n_rows; i++) {
        const struct kp_compare_hta_row *w = &h->rows[i];

        kprof__v1__compare_hta_row__init(&rows[i]);
        rows[i].rank = w->rank;
        rows[i].step = w->step;
        rows[i].start_ns = w->start_ns;
        rows[i].dur_ns = w->dur_ns;
        rows[i].normalized_start = w->norm_start;
        rows[i].normalized_duration = w->norm_dur;
        ptrs[i] = &rows[i];
    }
    o->n_metric = h->n_rows;
    o->metric = ptrs;
    o->n_stragglers = h->n_stragglers;
    o->stragglers = h->stragglers;
    o->num_candidates = (uint32_t) k;
    p->msg.hta = o;
    return 0;
}

void kp_compare_pb_fini(struct kp_compare_pb *p)
{
    for (size_t i = 0; i < sizeof(p->arr) / sizeof(p->arr[0]); i++) {
        free(p->arr[i]);
        p->arr[i] = NULL;
    }
}

int kp_compare_from_pb(const Kprof__V1__CompareResponse *m, struct kp_compare_result **out,
                       char *errbuf, size_t errlen)
{
    struct kp_compare_result *r = calloc(1, sizeof(*r));
    int rc = -ENOMEM;

    *out = NULL;
    if (r == NULL || (r->ranks = alloc_n(m->n_ranks, sizeof(*r->ranks))) == NULL ||
        (r->steps = alloc_n(m->n_steps, sizeof(*r->steps))) == NULL ||
        (r->stragglers = alloc_n(m->n_stragglers, sizeof(*r->stragglers))) == NULL ||
        (r->cells = alloc_n(m->n_ranks * m->n_steps, sizeof(*r->cells))) == NULL ||
        (r->missing = alloc_n(m->n_missing_ranks, sizeof(*r->missing))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        goto fail;
    }
    r->world_size = (int) m->world_size;
    r->n_missing = m->n_missing_ranks;
    if (m->n_missing_ranks > 0) {
        memcpy(r->missing, m->missing_ranks, m->n_missing_ranks * sizeof(*r->missing));
    }
    r->waited_for = m->waited_for;
    r->hta_rank = m->hta_rank;
    r->hta_rank_steps = (size_t) m->hta_rank_steps;
    r->n_groups = (size_t) m->collectives;
    r->n_p2p = (size_t) m->p2p_collectives;
    r->n_offset_colls = (size_t) m->offset_collectives;
    r->n_no_offset = (size_t) m->ranks_without_offset;
    r->run = (int64_t) m->run_id;
    r->n_ranks = m->n_ranks;
    for (size_t i = 0; i < m->n_ranks; i++) {
        const Kprof__V1__CompareRank *o = m->ranks[i];
        struct kp_compare_rank *k = &r->ranks[i];

        k->rank = o->rank;
        k->step_ns = o->step_ns;
        k->vs_median = o->vs_median;
        k->coll_ns = o->collective_ns;
        k->late_ns = o->late_ns;
        k->compute_ns = o->compute_ns;
        k->host_ns = o->host_ns;
        k->launch_ns = o->launch_ns;
        k->other_ns = o->other_ns;
        k->clock_offset_ns = o->clock_offset_ns;
        k->has_offset = o->has_offset;
        k->n_late_steps = (size_t) o->late_steps;
        k->straggler = o->straggler;
        k->waits = o->waits;
        k->late = o->late;
        snprintf(k->host, sizeof(k->host), "%s", o->host != NULL ? o->host : "");
        k->node = o->node;
        k->local_rank = o->local_rank;
        k->offset_spread_ns = o->offset_spread_ns;
        k->offset_n = (size_t) o->offset_collectives;
        for (size_t j = 0; j < m->n_steps && j < o->n_step_late_ns; j++) {
            struct kp_compare_cell *cl = &r->cells[i * m->n_steps + j];

            cl->present = !isnan(o->step_late_ns[j]);
            cl->late_ns = cl->present ? o->step_late_ns[j] : 0.0;
            if (cl->present && j < o->n_step_time_ns && !isnan(o->step_time_ns[j])) {
                cl->step_ns = (int64_t) o->step_time_ns[j];
            }
        }
    }
    r->n_steps = m->n_steps;
    for (size_t j = 0; j < m->n_steps; j++) {
        const Kprof__V1__CompareStep *o = m->steps[j];
        struct kp_compare_step *s = &r->steps[j];

        s->step = o->step;
        s->n_ranks = (size_t) o->ranks;
        s->n_coll = (size_t) o->collectives;
        s->step_median_ns = o->step_median_ns;
        s->step_max_ns = o->step_max_ns;
        s->step_ratio = o->step_ratio;
        s->coll_median_ns = o->collective_median_ns;
        s->coll_max_ns = o->collective_max_ns;
        s->coll_ratio = o->collective_ratio;
        s->last_rank = o->last_rank;
        s->hta_rank = o->hta_rank;
    }
    for (size_t i = 0; i < m->n_stragglers; i++) {
        const Kprof__V1__CompareStraggler *o = m->stragglers[i];
        struct kp_compare_straggler *s = &r->stragglers[i];
        bool seen[KP_COMPARE_CAUSE_COUNT] = { false };
        int cause = cause_from_pb(o->cause);

        r->n_stragglers = i + 1; /* its steps are freed with r from here on */
        s->rank = o->rank;
        if ((s->steps = alloc_n(o->n_steps, sizeof(*s->steps))) == NULL) {
            kp_errbuf_set(errbuf, errlen, "out of memory");
            goto fail;
        }
        if (o->n_steps > 0) {
            memcpy(s->steps, o->steps, o->n_steps * sizeof(*s->steps));
        }
        s->n_steps = o->n_steps;
        s->late_ns = o->late_ns;
        s->max_late_ns = o->max_late_ns;
        for (size_t e = 0; e < o->n_evidence; e++) {
            int c = cause_from_pb(o->evidence[e]->cause);

            if (c < 0) {
                break;
            }
            s->own_ns[c] = o->evidence[e]->own_ns;
            s->excess_ns[c] = o->evidence[e]->excess_ns;
            seen[c] = true;
        }
        for (int c = 0; c < KP_COMPARE_CAUSE_COUNT && cause >= 0; c++) {
            if (!seen[c]) {
                cause = -1;
            }
        }
        if (cause < 0) {
            kp_errbuf_set(errbuf, errlen,
                          "rank %d's straggler evidence is malformed: an unknown cause, or a "
                          "cause without its figures",
                          (int) o->rank);
            rc = -EPROTO;
            goto fail;
        }
        s->cause = (enum kp_compare_cause) cause;
    }
    r->step_median_ns = m->step_median_ns;
    snprintf(r->verdict, sizeof(r->verdict), "%s", m->verdict != NULL ? m->verdict : "");
    *out = r;
    return 0;
fail:
    kp_compare_result_destroy(r);
    return rc;
}

int kp_compare_hta_from_pb(const Kprof__V1__CompareHta *h, struct kp_compare_hta **out)
{
    struct kp_compare_hta *o = calloc(1, sizeof(*o));

    *out = NULL;
    if (o == NULL || (o->collective = strdup(h->collective != NULL ? h->collective : "")) == NULL ||
        (o->rows = alloc_n(h->n_metric, sizeof(*o->rows))) == NULL ||
        (o->stragglers = alloc_n(h->n_stragglers, sizeof(*o->stragglers))) == NULL) {
        kp_compare_hta_destroy(o);
        return -ENOMEM;
    }
    o->stream = h->stream;
    o->mean_step_ns = h->mean_step_ns;
    snprintf(o->note, sizeof(o->note), "%s", h->note != NULL ? h->note : "");
    o->n_rows = h->n_metric;
    for (size_t i = 0; i < h->n_metric; i++) {
        const Kprof__V1__CompareHtaRow *w = h->metric[i];

        o->rows[i] = (struct kp_compare_hta_row){ .rank = w->rank,
                                                  .step = w->step,
                                                  .start_ns = w->start_ns,
                                                  .dur_ns = w->dur_ns,
                                                  .norm_start = w->normalized_start,
                                                  .norm_dur = w->normalized_duration };
    }
    o->n_stragglers = h->n_stragglers;
    if (h->n_stragglers > 0) {
        memcpy(o->stragglers, h->stragglers, h->n_stragglers * sizeof(*o->stragglers));
    }
    *out = o;
    return 0;
}
