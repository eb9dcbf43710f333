/*
 * hta: HTA's per-rank analyses (see hta.h and docs/specs/hta-analyses.md).
 *
 * DESIGN. The loader (hta_load.c) reads the rank's runtime/driver calls and its GPU rows (kernels,
 * memcpys, memsets) into two flat arrays, rounds every time as HTA does (unless exact_ns),
 * drops what HTA drops (the last ProfilerStep, GPU rows without a kept launch), sorts the GPU
 * rows by start (ties in load order, which is the import's file order) and links each to its
 * launch by correlation through a sorted index. Every analysis then runs once over the arrays
 * and keeps its result in struct kp_hta; nothing queries PostgreSQL again.
 *
 * Interval unions follow HTA's merge_kernel_intervals exactly: sorted by start, a row opens a
 * new group when it starts after the latest end seen so far (touching rows merge), and a
 * group spans its first start to its latest end. HTA's rounding can give a sub-µs row a
 * negative duration; a group of only such rows has a negative length, and HTA adds it as it
 * is, so this code does too.
 *
 * Equal start times. Where HTA's result depends on the order pandas leaves equal keys in (the
 * queue length series, where a launch and a GPU row often share a rounded µs), the rows are
 * put in the order HTA's DataFrame holds them (calls in load order, which is the import's file
 * order, then GPU rows in file order, which Kineto writes by start) and sorted with a copy of
 * numpy's quicksort (introsort), which is not stable. Elsewhere ties cannot change a figure
 * (unions, sweeps) or are broken by file order, as HTA's own sort left them on the peer traces.
 */
#define _GNU_SOURCE /* qsort_r */
#include "hta_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

const char *const kp_hta_ktype_names[4] = { "COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER" };

void kp_hta_opts_init(struct kp_hta_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->consecutive_kernel_delay_ns = KP_HTA_CONSECUTIVE_KERNEL_DELAY_NS;
    o->duration_ratio = KP_HTA_DURATION_RATIO;
    o->num_kernels = KP_HTA_NUM_KERNELS;
}

/* ---- classes ------------------------------------------------------------------------ */

static bool starts(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

/* "cuda...LaunchKernel" anywhere in s. */
static bool has_cuda_launch(const char *s)
{
    const char *c = strstr(s, "cuda");

    return c != NULL && strstr(c + 4, "LaunchKernel") != NULL;
}

enum kp_hta_ktype kp_hta_kernel_type(const char *s)
{
    if (starts(s, "nccl") || starts(s, "hip") || starts(s, "hccl") || strstr(s, "ncclKernel")) {
        return KP_HTA_COMMUNICATION;
    }
    if (starts(s, "Memcpy") || starts(s, "Memset") || starts(s, "dma")) {
        return KP_HTA_MEMORY;
    }
    if (strstr(s, "Memcpy") || strstr(s, "Memset") || strstr(s, "dma") || strstr(s, "Sync") ||
        strstr(s, "Stream Wait Event") || has_cuda_launch(s)) {
        return KP_HTA_OTHER;
    }
    return KP_HTA_COMPUTATION;
}

void kp_hta_type_label(unsigned mask, char *buf, size_t len)
{
    size_t off = 0;

    buf[0] = '\0';
    for (unsigned t = 0; t < 3; t++) {
        if (!(mask & (1u << t))) {
            continue;
        }
        off += (size_t) snprintf(buf + off, off < len ? len - off : 0, "%s%s",
                                 off ? " overlapping " : "", kp_hta_ktype_names[t]);
        if (off >= len) {
            return;
        }
    }
}

/* ---- helpers -------------------------------------------------------------------------- */

/* HTA's merge_kernel_intervals over the rows whose type is in mask (bit 1 << type), rows
 * by start. Writes groups to out (n_evs entries) and returns the count. */
static size_t merge_types(const struct kp_hta *h, unsigned mask, struct kp_range *out)
{
    size_t n = 0;
    int64_t cm = INT64_MIN;

    for (size_t i = 0; i < h->n_evs; i++) {
        const struct hta_ev *e = &h->evs[i];

        if (!(mask & (1u << e->type))) {
            continue;
        }
        if (n == 0 || e->ts > cm) {
            out[n].start = e->ts;
            out[n].end = e->end;
            n++;
        }
        else if (e->end > out[n - 1].end) {
            out[n - 1].end = e->end;
        }
        if (e->end > cm) {
            cm = e->end;
        }
    }
    return n;
}

static int64_t groups_len(const struct kp_range *g, size_t n)
{
    int64_t s = 0;

    for (size_t i = 0; i < n; i++) {
        s += g[i].end - g[i].start;
    }
    return s;
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return a < b ? -1 : a > b;
}

static int cmp_dbl(const void *pa, const void *pb)
{
    double a = *(const double *) pa, b = *(const double *) pb;

    return a < b ? -1 : a > b;
}

/* numpy's linear quantile of a sorted array. */
static double quantile(const double *v, size_t n, double q)
{
    double pos = q * (double) (n - 1), lo;
    size_t i;

    lo = floor(pos);
    i = (size_t) lo;
    if (i + 1 >= n) {
        return v[n - 1];
    }
    return v[i] + (v[i + 1] - v[i]) * (pos - lo);
}

/* pandas describe(); sorts v. */
static void describe(double *v, size_t n, struct kp_hta_stats *s)
{
    double sum = 0, ss = 0;

    s->count = n;
    s->mean = s->std = s->min = s->q25 = s->q50 = s->q75 = s->max = NAN;
    if (n == 0) {
        return;
    }
    qsort(v, n, sizeof(*v), cmp_dbl);
    for (size_t i = 0; i < n; i++) {
        sum += v[i];
    }
    s->mean = sum / (double) n;
    for (size_t i = 0; i < n; i++) {
        ss += (v[i] - s->mean) * (v[i] - s->mean);
    }
    if (n > 1) {
        s->std = sqrt(ss / (double) (n - 1));
    }
    s->min = v[0];
    s->max = v[n - 1];
    s->q25 = quantile(v, n, 0.25);
    s->q50 = quantile(v, n, 0.5);
    s->q75 = quantile(v, n, 0.75);
}

static double pct(int64_t num, int64_t den)
{
    return den ? 100.0 * (double) num / (double) den : NAN;
}

/* ---- analyses --------------------------------------------------------------------------- */

/* §2 and §4. */
static void temporal_overlap(struct kp_hta *h, struct kp_range *g, struct kp_range *g2,
                             struct kp_range *tmp)
{
    struct kp_hta_temporal *t = &h->temporal;
    size_t n, nc, nm, k;

    n = merge_types(h, 0xF, g);
    t->kernel_ns = g[n - 1].end - g[0].start;
    t->idle_ns = t->kernel_ns - groups_len(g, n);
    n = merge_types(h, 1u << KP_HTA_COMPUTATION, g);
    t->compute_ns = groups_len(g, n);
    t->non_compute_ns = t->kernel_ns - t->compute_ns - t->idle_ns;
    t->idle_pct = pct(t->idle_ns, t->kernel_ns);
    t->compute_pct = pct(t->compute_ns, t->kernel_ns);
    t->non_compute_pct = pct(t->non_compute_ns, t->kernel_ns);

    /* overlap: the union of communication inside the union of computation */
    nm = merge_types(h, 1u << KP_HTA_COMMUNICATION, g2);
    h->overlap.comm_ns = groups_len(g2, nm);
    k = 0;
    for (size_t i = 0; i < n; i++) { /* g still holds computation; keep the non-empty */
        if (g[i].end > g[i].start) {
            g[k++] = g[i];
        }
    }
    nc = k;
    k = 0;
    for (size_t i = 0; i < nm; i++) {
        if (g2[i].end > g2[i].start) {
            g2[k++] = g2[i];
        }
    }
    nm = kp_ranges_intersect(g, nc, g2, k, tmp);
    h->overlap.overlap_ns = kp_ranges_length(tmp, nm);
    h->overlap.pct = pct(h->overlap.overlap_ns, h->overlap.comm_ns);
}

struct point {
    int64_t t;
    int v;
};

static int cmp_point(const void *pa, const void *pb)
{
    const struct point *a = pa, *b = pb;

    return a->t < b->t ? -1 : a->t > b->t;
}

/* §5 table 1: the sweep over the three types' unions. */
static int type_time(struct kp_hta *h, struct kp_range *g)
{
    struct point *p = calloc(2 * h->n_evs + 1, sizeof(*p));
    size_t np = 0;
    int running = 0;

    if (!p) {
        return -ENOMEM;
    }
    for (int t = 0; t < 3; t++) {
        size_t n = merge_types(h, 1u << t, g);

        for (size_t i = 0; i < n; i++) {
            p[np].t = g[i].start;
            p[np++].v = 1 << t;
            p[np].t = g[i].end;
            p[np++].v = -(1 << t);
        }
    }
    qsort(p, np, sizeof(*p), cmp_point);
    for (size_t i = 0; i + 1 < np; i++) {
        running += p[i].v;
        if (running > 0 && running < 8) {
            h->type_time[running] += p[i + 1].t - p[i].t;
        }
    }
    free(p);
    return 0;
}

struct name_agg {
    const char *name;
    double sum, max, min, mean, std;
    size_t n;
};

static int cmp_ev_name(const void *pa, const void *pb, void *ctx)
{
    const struct hta_ev *e = ctx;
    const size_t a = *(const size_t *) pa, b = *(const size_t *) pb;

    return strcmp(e[a].name, e[b].name);
}

static int cmp_agg_sum(const void *pa, const void *pb)
{
    const struct name_agg *a = pa, *b = pb;

    if (a->sum != b->sum) {
        return a->sum > b->sum ? -1 : 1;
    }
    return strcmp(a->name, b->name);
}

static int cmp_agg_name(const void *pa, const void *pb)
{
    return strcmp(((const struct name_agg *) pa)->name, ((const struct name_agg *) pb)->name);
}

/* Aggregates v[0..n) (sorted or not) into a; std NaN → 0 as HTA fills it. */
static void agg(struct name_agg *a, const double *v, size_t n)
{
    double ss = 0;

    a->n = n;
    a->sum = 0;
    a->max = -INFINITY;
    a->min = INFINITY;
    for (size_t i = 0; i < n; i++) {
        a->sum += v[i];
        a->max = v[i] > a->max ? v[i] : a->max;
        a->min = v[i] < a->min ? v[i] : a->min;
    }
    a->mean = a->sum / (double) n;
    for (size_t i = 0; i < n; i++) {
        ss += (v[i] - a->mean) * (v[i] - a->mean);
    }
    a->std = n > 1 ? sqrt(ss / (double) (n - 1)) : 0;
}

/* §5 table 2 for one type. */
static int kernel_rows(struct kp_hta *h, enum kp_hta_ktype type, size_t *idx, double *v,
                       struct name_agg *aggs)
{
    size_t n = 0, na = 0, nf;
    struct kp_hta_kernel_row *rows;

    for (size_t i = 0; i < h->n_evs; i++) {
        if (h->evs[i].type == type) {
            idx[n++] = i;
        }
    }
    if (n == 0) {
        return 0;
    }
    qsort_r(idx, n, sizeof(*idx), cmp_ev_name, h->evs);
    for (size_t i = 0; i < n;) {
        size_t j = i;

        while (j < n && strcmp(h->evs[idx[j]].name, h->evs[idx[i]].name) == 0) {
            v[j - i] = (double) (h->evs[idx[j]].end - h->evs[idx[j]].ts);
            j++;
        }
        aggs[na].name = h->evs[idx[i]].name;
        agg(&aggs[na++], v, j - i);
        i = j;
    }
    qsort(aggs, na, sizeof(*aggs), cmp_agg_sum);
    nf = na;
    if (na > (size_t) h->opts.num_kernels) {
        double cum = 0, q;
        struct name_agg *folded = aggs + na; /* room: aggs holds 2 × n */

        for (size_t i = 0; i < na; i++) {
            cum += aggs[i].sum;
            v[i] = cum;
        }
        q = quantile(v, na, h->opts.duration_ratio);
        for (size_t i = 0; i < na; i++) {
            if (v[i] > q || i >= (size_t) h->opts.num_kernels) {
                aggs[i].name = "others";
            }
        }
        qsort(aggs, na, sizeof(*aggs), cmp_agg_name);
        nf = 0;
        for (size_t i = 0; i < na;) {
            size_t j = i;

            while (j < na && strcmp(aggs[j].name, aggs[i].name) == 0) {
                v[j - i] = aggs[j].sum;
                j++;
            }
            folded[nf].name = aggs[i].name;
            agg(&folded[nf++], v, j - i);
            i = j;
        }
        memmove(aggs, folded, nf * sizeof(*aggs));
    }
    rows = realloc(h->krows, (h->n_krows + nf) * sizeof(*rows));
    if (!rows) {
        return -ENOMEM;
    }
    h->krows = rows;
    for (size_t i = 0; i < nf; i++) {
        struct kp_hta_kernel_row *r = &rows[h->n_krows++];

        r->name = aggs[i].name;
        r->type = type;
        r->sum_ns = aggs[i].sum;
        r->max_ns = aggs[i].max;
        r->min_ns = aggs[i].min;
        r->mean_ns = aggs[i].mean;
        r->std_ns = aggs[i].std;
    }
    return 0;
}

/* §3: gaps per stream. */
static int idle(struct kp_hta *h, double *v)
{
    int64_t *streams = calloc(h->n_evs, sizeof(*streams));
    size_t ns = 0;

    if (!streams) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < h->n_evs; i++) {
        size_t k = 0;

        while (k < ns && streams[k] != h->evs[i].stream) {
            k++;
        }
        if (k == ns) {
            streams[ns++] = h->evs[i].stream;
        }
    }
    qsort(streams, ns, sizeof(*streams), cmp_i64);
    h->idle = calloc(ns ? ns : 1, sizeof(*h->idle));
    if (!h->idle) {
        free(streams);
        return -ENOMEM;
    }
    h->n_idle = ns;
    for (size_t s = 0; s < ns; s++) {
        struct kp_hta_idle_stream *is = &h->idle[s];
        /* gaps per category, packed in v: category c at v + c * n_evs */
        size_t cnt[3] = { 0, 0, 0 };
        int64_t prev_end = 0, total = 0;
        bool first = true;

        is->stream = streams[s];
        for (size_t i = 0; i < h->n_evs; i++) {
            const struct hta_ev *e = &h->evs[i];
            int64_t gap;
            int c;

            if (e->stream != is->stream) {
                continue;
            }
            if (first) {
                /* HTA: the first row has no gap and falls into "other" (NaN, not counted) */
                is->present[KP_HTA_IDLE_OTHER] = true;
                first = false;
                prev_end = e->end;
                continue;
            }
            gap = e->ts - prev_end;
            if (e->rt >= 0 && h->rts[e->rt].ts > prev_end) {
                c = KP_HTA_HOST_WAIT;
            }
            else if (gap < h->opts.consecutive_kernel_delay_ns) {
                c = KP_HTA_KERNEL_WAIT;
            }
            else {
                c = KP_HTA_IDLE_OTHER;
            }
            is->present[c] = true;
            is->idle_ns[c] += gap;
            v[(size_t) c * h->n_evs + cnt[c]++] = (double) gap;
            prev_end = e->end;
        }
        for (int c = 0; c < 3; c++) {
            total += is->idle_ns[c];
            describe(v + (size_t) c * h->n_evs, cnt[c], &is->stats[c]);
        }
        for (int c = 0; c < 3; c++) {
            is->ratio[c] = total ? (double) is->idle_ns[c] / (double) total : NAN;
        }
    }
    free(streams);
    return 0;
}

static bool is_launch_stats_call(const char *s)
{
    return strcmp(s, "cudaLaunchKernel") == 0 || strcmp(s, "cudaLaunchKernelExC") == 0 ||
           strcmp(s, "cudaMemcpyAsync") == 0 || strcmp(s, "cudaMemsetAsync") == 0;
}

static bool is_queue_call(const char *s)
{
    return is_launch_stats_call(s) || strcmp(s, "cuLaunchKernel") == 0 ||
           strcmp(s, "cuLaunchKernelEx") == 0;
}

static int cmp_launch(const void *pa, const void *pb)
{
    const struct kp_hta_launch_row *a = pa, *b = pb;

    return a->correlation < b->correlation ? -1 : a->correlation > b->correlation;
}

/* §6. */
static int launches(struct kp_hta *h, double *v)
{
    struct kp_hta_launch_summary *s = &h->lsum;
    size_t n = 0;
    double cpu = 0, gpu = 0, delay = 0;

    h->launches = calloc(h->n_evs, sizeof(*h->launches));
    if (!h->launches) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < h->n_evs; i++) {
        const struct hta_ev *e = &h->evs[i];
        const struct hta_rt *t;
        struct kp_hta_launch_row *l;

        if (e->rt < 0 || !is_launch_stats_call(h->rts[e->rt].name)) {
            continue;
        }
        t = &h->rts[e->rt];
        l = &h->launches[n++];
        l->correlation = e->corr;
        l->cpu_ns = t->end - t->ts;
        l->gpu_ns = e->end - e->ts;
        l->delay_ns = e->ts - t->end > 0 ? e->ts - t->end : 0;
    }
    qsort(h->launches, n, sizeof(*h->launches), cmp_launch);
    h->n_launches = n;
    s->n = n;
    for (size_t i = 0; i < n; i++) {
        const struct kp_hta_launch_row *l = &h->launches[i];

        cpu += (double) l->cpu_ns;
        gpu += (double) l->gpu_ns;
        delay += (double) l->delay_ns;
        v[i] = (double) l->delay_ns;
        if (l->cpu_ns <= KP_HTA_RUNTIME_CUTOFF_NS && l->gpu_ns < l->cpu_ns) {
            s->n_gpu_shorter++;
        }
        if (l->cpu_ns > KP_HTA_RUNTIME_CUTOFF_NS) {
            s->n_runtime_outliers++;
        }
        if (l->delay_ns > KP_HTA_LAUNCH_DELAY_CUTOFF_NS) {
            s->n_delay_outliers++;
        }
    }
    if (n) {
        s->cpu_mean_ns = cpu / (double) n;
        s->gpu_mean_ns = gpu / (double) n;
        s->delay_mean_ns = delay / (double) n;
        qsort(v, n, sizeof(*v), cmp_dbl);
        s->delay_p50_ns = quantile(v, n, 0.5);
        s->delay_max_ns = v[n - 1];
    }
    else {
        s->cpu_mean_ns = s->gpu_mean_ns = s->delay_mean_ns = s->delay_p50_ns = NAN;
        s->delay_max_ns = NAN;
    }
    return 0;
}

static int cmp_order(const void *pa, const void *pb, void *ctx)
{
    const struct hta_ev *e = ctx;
    size_t a = e[*(const size_t *) pa].order, b = e[*(const size_t *) pb].order;

    return a < b ? -1 : a > b;
}

/* §7: per stream, +1 at each launch call with a GPU row, -1 at that row's start, in the
 * order HTA sorts them: the calls (in load order) and then the GPU rows (in file order)
 * concatenated, then numpy's quicksort by start over all streams at once. */
static int queue(struct kp_hta *h, double *v)
{
    size_t n = h->n_evs, np = 0, *ev_of = NULL, *perm = NULL, *srt = NULL;
    int64_t *key = NULL;
    struct {
        int64_t stream;
        int delta;
    } *pt = NULL;
    int rc = -ENOMEM;

    ev_of = malloc((h->n_rts + 1) * sizeof(*ev_of));
    perm = malloc((n + 1) * sizeof(*perm));
    srt = malloc((2 * n + 1) * sizeof(*srt));
    key = malloc((2 * n + 1) * sizeof(*key));
    pt = malloc((2 * n + 1) * sizeof(*pt));
    h->queue = calloc(h->n_idle ? h->n_idle : 1, sizeof(*h->queue));
    if (!ev_of || !perm || !srt || !key || !pt || !h->queue) {
        goto out;
    }
    for (size_t i = 0; i < h->n_rts; i++) {
        ev_of[i] = SIZE_MAX;
    }
    for (size_t i = 0; i < n; i++) {
        const struct hta_ev *e = &h->evs[i];

        if (e->rt >= 0 && is_queue_call(h->rts[e->rt].name)) {
            ev_of[e->rt] = i;
        }
    }
    for (size_t i = 0; i < h->n_rts; i++) {
        if (ev_of[i] == SIZE_MAX) {
            continue;
        }
        key[np] = h->rts[i].ts;
        pt[np].stream = h->evs[ev_of[i]].stream;
        pt[np++].delta = 1;
    }
    for (size_t i = 0; i < n; i++) {
        perm[i] = i;
    }
    qsort_r(perm, n, sizeof(*perm), cmp_order, h->evs);
    for (size_t k = 0; k < n; k++) {
        const struct hta_ev *e = &h->evs[perm[k]];

        if (e->rt < 0 || !is_queue_call(h->rts[e->rt].name)) {
            continue;
        }
        key[np] = e->ts;
        pt[np].stream = e->stream;
        pt[np++].delta = -1;
    }
    for (size_t i = 0; i < np; i++) {
        srt[i] = i;
    }
    kp__hta_np_argsort(key, srt, np);
    for (size_t s = 0; s < h->n_idle; s++) {
        struct kp_hta_queue_stream *q = &h->queue[h->n_queue];
        size_t m = 0;
        int64_t l = 0, dur = h->t_last - h->t_first, prev_t = 0;

        for (size_t i = 0; i < np; i++) {
            size_t j = srt[i];

            if (pt[j].stream != h->idle[s].stream) {
                continue;
            }
            if (m > 0 && l >= KP_HTA_MAX_QUEUE_LENGTH) {
                q->blocked_ns += key[j] - prev_t;
            }
            l += pt[j].delta;
            v[m++] = (double) l;
            prev_t = key[j];
        }
        if (m == 0) {
            continue;
        }
        q->stream = h->idle[s].stream;
        q->blocked_rel = dur > 0 ? (double) q->blocked_ns / (double) dur : NAN;
        describe(v, m, &q->stats);
        h->n_queue++;
    }
    rc = 0;
out:
    free(ev_of);
    free(perm);
    free(srt);
    free(key);
    free(pt);
    return rc;
}

/* HTA's get_memory_kernel_type: "Memset", the first 11 characters of a memcpy's name
 * ("Memcpy DtoD"), or "Memcpy Unknown". Interned; NULL on ENOMEM. */
static const char *membw_kind(struct kp_hta *h, const char *name)
{
    char buf[12];

    if (starts(name, "Memset")) {
        return kp__hta_intern(h, "Memset");
    }
    if (!starts(name, "Memcpy")) {
        return kp__hta_intern(h, "Memcpy Unknown");
    }
    snprintf(buf, sizeof(buf), "%s", name);
    return kp__hta_intern(h, buf);
}

static int cmp_membw_name(const void *pa, const void *pb)
{
    return strcmp(((const struct kp_hta_membw_row *) pa)->name,
                  ((const struct kp_hta_membw_row *) pb)->name);
}

/* §11: the MEMORY-class GPU rows in file order, +bw at each start, then the same rows with
 * -bw at each end (a 0 duration counted as 1 trace unit), sorted together by time with numpy's
 * quicksort (ties as HTA leaves them); per kind (in name order, as groupby gives them) the
 * running sum at every point, and describe() of the sums > 0. */
static int membw(struct kp_hta *h, double *v)
{
    size_t n = h->n_evs, m = 0, np, *perm = NULL, *mem = NULL, *srt = NULL, *grp = NULL;
    int64_t *key = NULL, unit = h->opts.exact_ns ? 1 : 1000;
    double *val = NULL;
    int rc = -ENOMEM;

    perm = malloc((n + 1) * sizeof(*perm));
    mem = malloc((n + 1) * sizeof(*mem));
    srt = malloc((2 * n + 1) * sizeof(*srt));
    grp = malloc((2 * n + 1) * sizeof(*grp));
    key = malloc((2 * n + 1) * sizeof(*key));
    val = malloc((2 * n + 1) * sizeof(*val));
    h->membw = calloc(n + 1, sizeof(*h->membw));
    if (!perm || !mem || !srt || !grp || !key || !val || !h->membw) {
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        perm[i] = i;
    }
    qsort_r(perm, n, sizeof(*perm), cmp_order, h->evs);
    for (size_t k = 0; k < n; k++) {
        const struct hta_ev *e = &h->evs[perm[k]];
        const char *kind;
        size_t g = 0;

        if (e->type != KP_HTA_MEMORY) {
            continue;
        }
        if (!(kind = membw_kind(h, e->name))) {
            goto out;
        }
        while (g < h->n_membw && h->membw[g].name != kind) {
            g++;
        }
        if (g == h->n_membw) {
            h->membw[h->n_membw++].name = kind;
        }
        h->membw[g].events++;
        h->membw[g].computed += e->bw_computed;
        mem[m++] = perm[k];
    }
    qsort(h->membw, h->n_membw, sizeof(*h->membw), cmp_membw_name);
    np = 2 * m;
    for (size_t i = 0; i < np; i++) {
        const struct hta_ev *e = &h->evs[mem[i % m]];
        const char *kind = membw_kind(h, e->name);

        key[i] = i < m ? e->ts : e->end == e->ts ? e->ts + unit : e->end;
        val[i] = i < m ? e->bw : -e->bw;
        size_t g = 0;

        while (h->membw[g].name != kind) {
            g++;
        }
        grp[i] = g;
        srt[i] = i;
    }
    kp__hta_np_argsort(key, srt, np);
    for (size_t g = 0; g < h->n_membw; g++) {
        size_t c = 0;
        double sum = 0;

        for (size_t i = 0; i < np; i++) {
            if (grp[srt[i]] != g) {
                continue;
            }
            sum += val[srt[i]];
            if (sum > 0) {
                v[c++] = sum;
            }
        }
        describe(v, c, &h->membw[g].stats);
    }
    /* HTA has a row only for a kind with a point > 0 */
    m = 0;
    for (size_t g = 0; g < h->n_membw; g++) {
        if (h->membw[g].stats.count > 0) {
            h->membw[m++] = h->membw[g];
        }
    }
    h->n_membw = m;
    rc = 0;
out:
    free(perm);
    free(mem);
    free(srt);
    free(grp);
    free(key);
    free(val);
    return rc;
}

int kp__hta_compute(struct kp_hta *h)
{
    size_t n = h->n_evs;
    struct kp_range *g = calloc(3 * n + 1, sizeof(*g));
    size_t *idx = calloc(n + 1, sizeof(*idx));
    double *v = calloc(3 * n + 1, sizeof(*v));
    struct name_agg *aggs = calloc(2 * n + 1, sizeof(*aggs));
    int rc = -ENOMEM;

    if (!g || !idx || !v || !aggs) {
        goto out;
    }
    temporal_overlap(h, g, g + n, g + 2 * n);
    if ((rc = type_time(h, g)) < 0) {
        goto out;
    }
    for (int t = 0; t < 3; t++) {
        if ((rc = kernel_rows(h, (enum kp_hta_ktype) t, idx, v, aggs)) < 0) {
            goto out;
        }
    }
    if ((rc = idle(h, v)) < 0 || (rc = launches(h, v)) < 0 || (rc = queue(h, v)) < 0 ||
        (rc = membw(h, v)) < 0) {
        goto out;
    }
    rc = 0;
out:
    free(g);
    free(idx);
    free(v);
    free(aggs);
    return rc;
}

/* ---- getters ------------------------------------------------------------------------- */

const struct kp_hta_temporal *kp_hta_temporal(const struct kp_hta *h)
{
    return &h->temporal;
}

const struct kp_hta_idle_stream *kp_hta_idle(const struct kp_hta *h, size_t *n)
{
    *n = h->n_idle;
    return h->idle;
}

const struct kp_hta_overlap *kp_hta_overlap(const struct kp_hta *h)
{
    return &h->overlap;
}

const int64_t *kp_hta_type_time(const struct kp_hta *h)
{
    return h->type_time;
}

const struct kp_hta_kernel_row *kp_hta_kernels(const struct kp_hta *h, size_t *n)
{
    *n = h->n_krows;
    return h->krows;
}

const struct kp_hta_launch_row *kp_hta_launches(const struct kp_hta *h, size_t *n)
{
    *n = h->n_launches;
    return h->launches;
}

const struct kp_hta_launch_summary *kp_hta_launch_summary(const struct kp_hta *h)
{
    return &h->lsum;
}

bool kp_hta_last_step_dropped(const struct kp_hta *h)
{
    return h->dropped;
}

const struct kp_hta_membw_row *kp_hta_membw(const struct kp_hta *h, size_t *n)
{
    *n = h->n_membw;
    return h->membw;
}

const struct kp_hta_queue_stream *kp_hta_queue(const struct kp_hta *h, size_t *n)
{
    *n = h->n_queue;
    return h->queue;
}
