/* The Hta view (Analyzer.Hta): one of HTA's per-rank analyses (hta.h, view.h), the one the
 * request names; kp_hta_create computes them all, the reply carries that one. It reads its own
 * rows: no kp_an_create. A rank without GPU events is NOT_FOUND (HTA has nothing to analyze). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/status.h>

#include "hta.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "view.h"

#define HTA_MAX_DELAY_NS 1000000000000LL

struct hta_opts {
    int analysis;
    bool exact_ns, include_last_step;
    int64_t delay_ns;
};

static const char *const idle_names[3] = { "host_wait", "kernel_wait", "other" };

struct hta_state {
    Kprof__V1__HtaResponse m;
    struct kp_hta *h;
    Kprof__V1__HtaTemporal temporal;
    Kprof__V1__HtaOverlap overlap;
    Kprof__V1__HtaLaunchSummary lsum;
    Kprof__V1__HtaKernelType types[8], *type_ptrs[8];
    char type_labels[8][128];
    void *a[8]; /* the other arrays */
};

static bool hta_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k, char *err,
                    size_t len)
{
    const Kprof__V1__HtaRequest *r = (const Kprof__V1__HtaRequest *) req;
    struct hta_opts o;

    (void) max_rows;
    memset(&o, 0, sizeof(o));
    if (!kp_view_key_init(k, r->run_id, r->rank, false, err, len)) {
        return false;
    }
    if (r->analysis < KPROF__V1__HTA_ANALYSIS__HTA_TEMPORAL ||
        r->analysis > KPROF__V1__HTA_ANALYSIS__HTA_MEMBW) {
        snprintf(err, len, "analysis %d is not one of HTA's (temporal .. membw)",
                 (int) r->analysis);
        return false;
    }
    if (r->has_consecutive_kernel_delay_ns &&
        (r->consecutive_kernel_delay_ns < 0 || r->consecutive_kernel_delay_ns > HTA_MAX_DELAY_NS)) {
        snprintf(err, len, "consecutive_kernel_delay_ns %lld is outside 0..%lld",
                 (long long) r->consecutive_kernel_delay_ns, HTA_MAX_DELAY_NS);
        return false;
    }
    o.analysis = (int) r->analysis;
    o.exact_ns = r->exact_ns;
    o.include_last_step = r->include_last_step;
    o.delay_ns = r->has_consecutive_kernel_delay_ns ? r->consecutive_kernel_delay_ns
                                                    : KP_HTA_CONSECUTIVE_KERNEL_DELAY_NS;
    memcpy(k->opts, &o, sizeof(o));
    return true;
}

static void hta_free(void *p)
{
    struct hta_state *s = p;

    kp_hta_destroy(s->h);
    for (size_t i = 0; i < sizeof(s->a) / sizeof(s->a[0]); i++) {
        free(s->a[i]);
    }
    free(s);
}

static void stats_pb(Kprof__V1__HtaStats *o, const struct kp_hta_stats *st)
{
    kprof__v1__hta_stats__init(o);
    o->count = st->count;
    o->mean = st->mean;
    o->std = st->std;
    o->min = st->min;
    o->q25 = st->q25;
    o->q50 = st->q50;
    o->q75 = st->q75;
    o->max = st->max;
}

/* An array of n objects of size sz and one of n pointers to them, kept in s->a. */
static void *alloc2(struct hta_state *s, size_t n, size_t sz, void ***ptrs)
{
    size_t i = 0;

    while (i < sizeof(s->a) / sizeof(s->a[0]) - 1 && s->a[i] != NULL) {
        i++;
    }
    s->a[i] = calloc(n ? n : 1, sz);
    s->a[i + 1] = calloc(n ? n : 1, sizeof(void *));
    *ptrs = s->a[i + 1];
    return s->a[i] != NULL && s->a[i + 1] != NULL ? s->a[i] : NULL;
}

/* n rows of sz bytes (their pointers in *ptrs) and n HtaStats for them (in *stats); NULL when
 * out of memory. */
static void *alloc_with_stats(struct hta_state *s, size_t n, size_t sz, void ***ptrs,
                              Kprof__V1__HtaStats **stats)
{
    void **dummy;
    void *rows = alloc2(s, n, sz, ptrs);

    *stats = rows != NULL ? alloc2(s, n, sizeof(**stats), &dummy) : NULL;
    return *stats != NULL ? rows : NULL;
}

static int fill_idle(struct hta_state *s)
{
    size_t n, n_cat = 0, c = 0;
    const struct kp_hta_idle_stream *is = kp_hta_idle(s->h, &n);
    Kprof__V1__HtaIdleStream *st, **stp;
    Kprof__V1__HtaIdleCategory *cat, **catp;
    Kprof__V1__HtaStats *stats;
    void **dummy;

    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 3; k++) {
            n_cat += is[i].present[k];
        }
    }
    st = alloc2(s, n, sizeof(*st), (void ***) &stp);
    cat = st != NULL ? alloc2(s, n_cat, sizeof(*cat), (void ***) &catp) : NULL;
    stats = cat != NULL ? alloc2(s, n_cat, sizeof(*stats), &dummy) : NULL;
    if (stats == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kprof__v1__hta_idle_stream__init(&st[i]);
        st[i].stream = is[i].stream;
        st[i].categories = &catp[c];
        for (int k = 0; k < 3; k++) {
            if (!is[i].present[k]) {
                continue;
            }
            kprof__v1__hta_idle_category__init(&cat[c]);
            cat[c].category = (char *) idle_names[k];
            cat[c].idle_ns = is[i].idle_ns[k];
            cat[c].ratio = is[i].ratio[k];
            stats_pb(&stats[c], &is[i].stats[k]);
            cat[c].interval_stats = &stats[c];
            catp[c] = &cat[c];
            st[i].n_categories++;
            c++;
        }
        stp[i] = &st[i];
    }
    s->m.n_idle = n;
    s->m.idle = stp;
    return 0;
}

static int fill_kernels(struct hta_state *s)
{
    const int64_t *tt = kp_hta_type_time(s->h);
    size_t n;
    const struct kp_hta_kernel_row *r = kp_hta_kernels(s->h, &n);
    Kprof__V1__HtaKernelRow *rows, **ptrs;

    for (unsigned m = 1; m < 8; m++) {
        Kprof__V1__HtaKernelType *t = &s->types[s->m.n_kernel_types];

        if (tt[m] == 0) {
            continue;
        }
        kp_hta_type_label(m, s->type_labels[m], sizeof(s->type_labels[m]));
        kprof__v1__hta_kernel_type__init(t);
        t->kernel_type = s->type_labels[m];
        t->sum_ns = tt[m];
        s->type_ptrs[s->m.n_kernel_types++] = t;
    }
    s->m.kernel_types = s->type_ptrs;
    if ((rows = alloc2(s, n, sizeof(*rows), (void ***) &ptrs)) == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kprof__v1__hta_kernel_row__init(&rows[i]);
        rows[i].name = (char *) r[i].name;
        rows[i].kernel_type = (char *) kp_hta_ktype_names[r[i].type];
        rows[i].sum_ns = r[i].sum_ns;
        rows[i].max_ns = r[i].max_ns;
        rows[i].min_ns = r[i].min_ns;
        rows[i].mean_ns = r[i].mean_ns;
        rows[i].std_ns = r[i].std_ns;
        ptrs[i] = &rows[i];
    }
    s->m.n_kernels = n;
    s->m.kernels = ptrs;
    return 0;
}

static int fill_launch(struct hta_state *s)
{
    const struct kp_hta_launch_summary *ls = kp_hta_launch_summary(s->h);
    size_t n;
    const struct kp_hta_launch_row *r = kp_hta_launches(s->h, &n);
    Kprof__V1__HtaLaunchRow *rows, **ptrs;

    kprof__v1__hta_launch_summary__init(&s->lsum);
    s->lsum.n = ls->n;
    s->lsum.cpu_mean_ns = ls->cpu_mean_ns;
    s->lsum.gpu_mean_ns = ls->gpu_mean_ns;
    s->lsum.delay_mean_ns = ls->delay_mean_ns;
    s->lsum.delay_p50_ns = ls->delay_p50_ns;
    s->lsum.delay_max_ns = ls->delay_max_ns;
    s->lsum.n_gpu_shorter = ls->n_gpu_shorter;
    s->lsum.n_runtime_outliers = ls->n_runtime_outliers;
    s->lsum.n_delay_outliers = ls->n_delay_outliers;
    s->lsum.runtime_cutoff_ns = KP_HTA_RUNTIME_CUTOFF_NS;
    s->lsum.launch_delay_cutoff_ns = KP_HTA_LAUNCH_DELAY_CUTOFF_NS;
    s->m.launch_summary = &s->lsum;
    if ((rows = alloc2(s, n, sizeof(*rows), (void ***) &ptrs)) == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kprof__v1__hta_launch_row__init(&rows[i]);
        rows[i].correlation = r[i].correlation;
        rows[i].cpu_ns = r[i].cpu_ns;
        rows[i].gpu_ns = r[i].gpu_ns;
        rows[i].delay_ns = r[i].delay_ns;
        ptrs[i] = &rows[i];
    }
    s->m.n_launches = n;
    s->m.launches = ptrs;
    return 0;
}

static int fill_queue(struct hta_state *s)
{
    size_t n;
    const struct kp_hta_queue_stream *q = kp_hta_queue(s->h, &n);
    Kprof__V1__HtaQueueStream *rows, **ptrs;
    Kprof__V1__HtaStats *stats;

    if ((rows = alloc_with_stats(s, n, sizeof(*rows), (void ***) &ptrs, &stats)) == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kprof__v1__hta_queue_stream__init(&rows[i]);
        rows[i].stream = q[i].stream;
        stats_pb(&stats[i], &q[i].stats);
        rows[i].queue_length = &stats[i];
        rows[i].blocked_ns = q[i].blocked_ns;
        rows[i].blocked_rel = q[i].blocked_rel;
        ptrs[i] = &rows[i];
    }
    s->m.n_queue = n;
    s->m.queue = ptrs;
    s->m.max_queue_length = KP_HTA_MAX_QUEUE_LENGTH;
    return 0;
}

static int fill_membw(struct hta_state *s)
{
    size_t n;
    const struct kp_hta_membw_row *m = kp_hta_membw(s->h, &n);
    Kprof__V1__HtaMembwRow *rows, **ptrs;
    Kprof__V1__HtaStats *stats;

    if ((rows = alloc_with_stats(s, n, sizeof(*rows), (void ***) &ptrs, &stats)) == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        kprof__v1__hta_membw_row__init(&rows[i]);
        rows[i].name = (char *) m[i].name;
        stats_pb(&stats[i], &m[i].stats);
        rows[i].memory_bw_gbps = &stats[i];
        rows[i].events = m[i].events;
        rows[i].computed = m[i].computed;
        ptrs[i] = &rows[i];
    }
    s->m.n_membw = n;
    s->m.membw = ptrs;
    return 0;
}

static int hta_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct hta_state *s = calloc(1, sizeof(*s));
    struct kp_hta_opts ho;
    struct hta_opts o;
    int rc = 0;

    memcpy(&o, k->opts, sizeof(o));
    if (s == NULL) {
        return -ENOMEM;
    }
    kp_hta_opts_init(&ho);
    ho.exact_ns = o.exact_ns;
    ho.include_last_step = o.include_last_step;
    ho.consecutive_kernel_delay_ns = o.delay_ns;
    rc = kp_hta_create(c->pg, (int64_t) k->run, (int) k->rank, &ho, &s->h, c->err, c->errlen);
    if (rc == -ENODATA) {
        c->status = GRPC_STATUS_NOT_FOUND;
        goto fail;
    }
    if (rc != 0) {
        goto fail;
    }
    kprof__v1__hta_response__init(&s->m);
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    s->m.analysis = (Kprof__V1__HtaAnalysis) o.analysis;
    s->m.rounded_to_us = !o.exact_ns;
    s->m.last_step_dropped = kp_hta_last_step_dropped(s->h);
    s->m.consecutive_kernel_delay_ns = o.delay_ns;
    switch (s->m.analysis) {
    case KPROF__V1__HTA_ANALYSIS__HTA_TEMPORAL: {
        const struct kp_hta_temporal *t = kp_hta_temporal(s->h);

        kprof__v1__hta_temporal__init(&s->temporal);
        s->temporal.idle_ns = t->idle_ns;
        s->temporal.compute_ns = t->compute_ns;
        s->temporal.non_compute_ns = t->non_compute_ns;
        s->temporal.kernel_ns = t->kernel_ns;
        s->temporal.idle_pct = t->idle_pct;
        s->temporal.compute_pct = t->compute_pct;
        s->temporal.non_compute_pct = t->non_compute_pct;
        s->m.temporal = &s->temporal;
        break;
    }
    case KPROF__V1__HTA_ANALYSIS__HTA_IDLE:
        rc = fill_idle(s);
        break;
    case KPROF__V1__HTA_ANALYSIS__HTA_OVERLAP: {
        const struct kp_hta_overlap *ov = kp_hta_overlap(s->h);

        kprof__v1__hta_overlap__init(&s->overlap);
        s->overlap.comm_ns = ov->comm_ns;
        s->overlap.overlap_ns = ov->overlap_ns;
        s->overlap.pct = ov->pct;
        s->m.overlap = &s->overlap;
        break;
    }
    case KPROF__V1__HTA_ANALYSIS__HTA_KERNELS:
        rc = fill_kernels(s);
        break;
    case KPROF__V1__HTA_ANALYSIS__HTA_LAUNCH:
        rc = fill_launch(s);
        break;
    case KPROF__V1__HTA_ANALYSIS__HTA_MEMBW:
        rc = fill_membw(s);
        break;
    default:
        rc = fill_queue(s);
        break;
    }
    if (rc != 0) {
        goto fail;
    }
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = hta_free;
    return 0;
fail:
    hta_free(s);
    return rc;
}

const struct kp_view kp_view_hta = {
    .name = "Hta",
    .request = &kprof__v1__hta_request__descriptor,
    .reply = &kprof__v1__hta_response__descriptor,
    .key = hta_key,
    .compute = hta_compute,
    .bytes_per_event = 100,
};
