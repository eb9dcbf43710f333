/* kp_an: the step-time breakdown (spec §4): categories per step, GPU utilization, SM efficiency,
 * occupancy. */
#define _GNU_SOURCE /* qsort_r */
#include "an_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

/* ---- breakdown (spec §4) ------------------------------------------------------------- */

/* A category's list grows as it is filled: each holds a fraction of the rank's events, so
 * sizing every list for all of them (8 x 830 k ranges, and twice that for each share, at 1 M
 * events) made most of the breakdown's peak memory. */
int kp__an_rl_reserve(struct kp__an_rlist *l, size_t n)
{
    struct kp_range *r;
    size_t cap = l->cap ? l->cap : 64;

    if (n <= l->cap) {
        return 0;
    }
    while (cap < n) {
        cap *= 2;
    }
    r = realloc(l->r, cap * sizeof(*r));
    if (!r) {
        return -ENOMEM;
    }
    l->r = r;
    l->cap = cap;
    return 0;
}

/* A full list is merged first and grows only if that leaves it over 3/4 full. A category's
 * ranges nest and touch (a step's CPU ops merge into a few), so its list stays near the size
 * of its union, not of its events: the lists of a 1 M-event rank held 63 MiB, all filled
 * before any merge. The union, and every figure from it, is the same. */
int kp__an_rl_push(struct kp__an_rlist *l, int64_t s, int64_t e)
{
    if (l->n >= l->cap) {
        l->n = kp_ranges_merge(l->r, l->n);
        if (l->n >= l->cap / 4 * 3 &&
            kp__an_rl_reserve(l, l->n + 1 > 2 * l->cap ? l->n + 1 : 2 * l->cap) < 0) {
            return -ENOMEM;
        }
    }
    l->r[l->n++] = (struct kp_range){ s, e };
    l->pushed++;
    return 0;
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return (a > b) - (a < b);
}

/* Computation, communication and their overlap per step (spec §9); tmp holds comp->n +
 * comm->n ranges. */
static void overlap(struct kp_an *a, const struct kp__an_rlist *comp,
                    const struct kp__an_rlist *comm, struct kp_range *tmp)
{
    size_t n = kp_ranges_intersect(comp->r, comp->n, comm->r, comm->n, tmp);

    for (size_t s = 0; s < a->bd.n_steps; s++) {
        struct kp_an_step *st = &a->steps[s];

        st->computation_ns = kp_ranges_clip_length(comp->r, comp->n, st->start_ns, st->end_ns);
        st->communication_ns = kp_ranges_clip_length(comm->r, comm->n, st->start_ns, st->end_ns);
        st->overlap_ns = kp_ranges_clip_length(tmp, n, st->start_ns, st->end_ns);
    }
}

int kp__an_cmp_sm_ev(const void *pa, const void *pb)
{
    const struct kp__an_sm_ev *x = pa, *y = pb;

    if (x->t != y->t) {
        return x->t < y->t ? -1 : 1;
    }
    if (x->start != y->start) {
        return y->start - x->start;
    }
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Whether device event d is a kernel of GPU g that SM efficiency counts: blocks per SM > 0. */
static bool sm_counts(const struct an_dev *d, int g)
{
    return d->kind == DEV_KERNEL && d->device == g && !isnan(d->bps) && d->bps > 0;
}

/* Est. SM efficiency of GPU g over [w0, w1] (spec §8): a sweep over its kernels with blocks per
 * SM > 0 keeps the running sum; each stretch between consecutive distinct times with a sum > 0
 * counts min(sum, 1) over its part inside the window. Undefined when none falls inside. The
 * stretches, unclipped, go to b's SM-efficiency ranges of slot k. Returns 0 or -ENOMEM. */
static int sm_efficiency(struct kp_an *a, int g, size_t k, int64_t w0, int64_t w1)
{
    struct kp_an_breakdown *b = &a->bd;
    struct kp__an_sm_ev *ev;
    struct kp_an_sm_range *seg;
    size_t n = 0, n_seg = 0, n_k = 0;
    double sum = 0.0, acc = 0.0;
    bool any = false;

    /* sized for the GPU's kernels with the figure (a capture has none), not for every device
     * event of the rank */
    for (size_t i = 0; i < a->n_devs; i++) {
        n_k += sm_counts(&a->devs[i], g);
    }
    ev = calloc(2 * n_k + 1, sizeof(*ev));
    seg = calloc(2 * n_k + 1, sizeof(*seg));
    b->est_sm_efficiency[k] = 0.0;
    b->est_sm_efficiency_defined[k] = false;
    if (!ev || !seg) {
        free(ev);
        free(seg);
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];

        if (!sm_counts(d, g)) {
            continue;
        }
        ev[n] = (struct kp__an_sm_ev){ d->start, 1, d->bps, n };
        n++;
        ev[n] = (struct kp__an_sm_ev){ d->end, 0, d->bps, n };
        n++;
    }
    qsort(ev, n, sizeof(*ev), kp__an_cmp_sm_ev);
    for (size_t i = 0; i + 1 <= n; i++) {
        sum += ev[i].start ? ev[i].bps : -ev[i].bps;
        if (i + 1 < n && ev[i + 1].t > ev[i].t && sum > 0) {
            int64_t lo = ev[i].t > w0 ? ev[i].t : w0, hi = ev[i + 1].t < w1 ? ev[i + 1].t : w1;

            seg[n_seg++] = (struct kp_an_sm_range){ ev[i].t, ev[i + 1].t, sum < 1.0 ? sum : 1.0 };
            if (hi > lo) {
                acc += (sum < 1.0 ? sum : 1.0) * (double) (hi - lo);
                any = true;
            }
        }
    }
    free(ev);
    free(b->sm_ranges[k]);
    b->sm_ranges[k] = seg;
    b->n_sm_ranges[k] = n_seg;
    if (any && w1 > w0) {
        b->est_sm_efficiency[k] = acc / (double) (w1 - w0);
        b->est_sm_efficiency_defined[k] = true;
    }
    return 0;
}

/* The timeline's range (spec §8): the profiler's span ("PyTorch Profiler (0)", which import
 * keeps in ranks), or else the span of every loaded event (ops, runtimes, device events). */
static void event_span(const struct kp_an *a, int64_t *lo, int64_t *hi)
{
    int64_t l = INT64_MAX, h = INT64_MIN;

    if (a->prof_end > a->prof_start) {
        *lo = a->prof_start;
        *hi = a->prof_end;
        return;
    }

    for (size_t i = 0; i < a->n_ops; i++) {
        l = a->ops[i].start < l ? a->ops[i].start : l;
        h = a->ops[i].end > h ? a->ops[i].end : h;
    }
    for (size_t i = 0; i < a->n_rts; i++) {
        l = a->rts[i].start < l ? a->rts[i].start : l;
        h = a->rts[i].end > h ? a->rts[i].end : h;
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        l = a->devs[i].start < l ? a->devs[i].start : l;
        h = a->devs[i].end > h ? a->devs[i].end : h;
    }
    *lo = l <= h ? l : 0;
    *hi = l <= h ? h : 0;
}

/* The utilization timeline of slot k (spec §8) from the GPU's merged kernel ranges r[0..n):
 * buckets of the smallest power of ten µs giving at most 100 of them over [lo, hi], the last
 * one stretched to hi, each valued busy / length, then (hi, 0). Returns 0 or -ENOMEM. */
static int util_timeline(struct kp_an *a, size_t k, const struct kp_range *r, size_t n, int64_t lo,
                         int64_t hi)
{
    struct kp_an_breakdown *b = &a->bd;
    int64_t bucket = 1000, n_b;
    struct kp_an_point *p;

    while (hi - lo > 100 * bucket && bucket <= INT64_MAX / 1000) {
        bucket *= 10;
    }
    n_b = (hi - lo) / bucket;
    p = calloc((size_t) n_b + 1, sizeof(*p));
    if (!p) {
        return -ENOMEM;
    }
    for (int64_t i = 0; i < n_b; i++) {
        int64_t s = lo + i * bucket, e = i + 1 == n_b ? hi : s + bucket;

        p[i].t_ns = s;
        p[i].value = (double) kp_ranges_clip_length(r, n, s, e) / (double) (e - s);
    }
    p[n_b] = (struct kp_an_point){ hi, 0.0 };
    free(b->util_timeline[k]);
    b->util_timeline[k] = p;
    b->n_util_points[k] = (size_t) n_b + 1;
    return 0;
}

/* Est. achieved occupancy of GPU g (spec §8): its kernels with a known occupancy, each
 * clipped to [w0, w1], weighted by the clipped length. Undefined without kernel time in it. */
static void occupancy(const struct kp_an *a, int g, int64_t w0, int64_t w1, double *out,
                      bool *defined)
{
    double num = 0.0, den = 0.0;

    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int64_t lo, hi;

        if (d->kind != DEV_KERNEL || d->device != g || isnan(d->occ) || d->occ < 0) {
            continue;
        }
        lo = d->start > w0 ? d->start : w0;
        hi = d->end < w1 ? d->end : w1;
        if (hi > lo) {
            num += d->occ * (double) (hi - lo);
            den += (double) (hi - lo);
        }
    }
    *defined = den > 0;
    *out = den > 0 ? num / den : 0.0;
}

/* Each GPU's busy share of the steps' window (spec §8); tmp holds n_devs ranges. */
static int gpu_utilization(struct kp_an *a, struct kp_range *tmp)
{
    struct kp_an_breakdown *b = &a->bd;
    bool seen[KP_AN_MAX_GPUS] = { false };
    int64_t w0, w1, lo, hi;
    int rc;

    b->n_gpus = 0;
    event_span(a, &lo, &hi);
    for (size_t i = 0; i < a->n_devs; i++) {
        if (a->devs[i].kind == DEV_KERNEL && a->devs[i].device >= 0 &&
            a->devs[i].device < KP_AN_MAX_GPUS) {
            seen[a->devs[i].device] = true;
        }
    }
    w0 = b->n_steps ? a->steps[0].start_ns : 0;
    w1 = b->n_steps ? a->steps[b->n_steps - 1].end_ns : 0;
    for (int g = 0; g < KP_AN_MAX_GPUS; g++) {
        size_t n = 0;

        if (!seen[g]) {
            continue;
        }
        for (size_t i = 0; i < a->n_devs; i++) {
            if (a->devs[i].kind == DEV_KERNEL && a->devs[i].device == g) {
                tmp[n++] = (struct kp_range){ a->devs[i].start, a->devs[i].end };
            }
        }
        n = kp_ranges_merge(tmp, n);
        b->gpu_ids[b->n_gpus] = g;
        b->gpu_utilization[b->n_gpus] =
            w1 > w0 ? (double) kp_ranges_clip_length(tmp, n, w0, w1) / (double) (w1 - w0) : 0.0;
        rc = util_timeline(a, b->n_gpus, tmp, n, lo, hi);
        if (rc == 0) {
            rc = sm_efficiency(a, g, b->n_gpus, w0, w1);
        }
        if (rc < 0) {
            return rc;
        }
        occupancy(a, g, w0, w1, &b->est_achieved_occupancy[b->n_gpus],
                  &b->est_achieved_occupancy_defined[b->n_gpus]);
        b->n_gpus++;
    }
    return 0;
}

/* What kp_an_breakdown's phases share: each category's intervals, their shares after priority
 * masking, and scratch. */
struct bd_work {
    struct kp__an_bd_sets sets;
    struct kp__an_rlist share[KP_AN_CAT_COUNT];
    struct kp__an_rlist free_r, tmp; /* the time no category before has taken; scratch */
    struct kp_range *all_steps;
    size_t n_all;
};

/* The host ops' intervals: communication, data loading, CPU execution; the communication ops'
 * external ids into s->comm_ext (a's only). 0 or -ENOMEM. */
static int bd_collect_ops(const struct kp_an *a, struct kp__an_bd_sets *w)
{
    int rc = 0;

    free(w->comm_ext);
    w->n_comm = 0;
    if (!(w->comm_ext = calloc(a->n_ops + 1, sizeof(*w->comm_ext)))) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *s = kp__an_nm(a, o->name);
        bool host = o->kind == OPK_CPU_OP || o->kind == OPK_USER_ANNOTATION;

        if (strcmp(s, "DataParallel.forward") == 0) {
            w->use_dp = true;
        }
        else if (strcmp(s, "DistributedDataParallel.forward") == 0) {
            w->use_ddp = true;
        }
        if (kp__an_is_comm_op(o, s)) {
            rc |= kp__an_rl_push(&w->cat[KP_AN_COMMUNICATION], o->start, o->end);
            w->n_nccl += s[0] == 'n';
            w->n_gloo += s[0] == 'g';
            if (o->ext) {
                w->comm_ext[w->n_comm++] = o->ext;
            }
        }
        if (host && kp__an_is_dataloader_name(s)) {
            rc |= kp__an_rl_push(&w->cat[KP_AN_DATALOADER], o->start, o->end);
        }
        else if (host || o->kind == OPK_GPU_USER_ANNOTATION || o->kind == OPK_NVTX) {
            rc |= kp__an_rl_push(&w->cat[KP_AN_CPU_EXEC], o->start, o->end);
        }
    }
    qsort(w->comm_ext, w->n_comm, sizeof(*w->comm_ext), cmp_i64);
    return rc < 0 ? -ENOMEM : 0;
}

/* The runtime calls' and device events' intervals; a kernel of a communication op is
 * communication, one only named as a collective's goes to KP__AN_NAMED_COMM. 0 or -ENOMEM. */
static int bd_collect_devs(const struct kp_an *a, struct kp__an_bd_sets *w)
{
    int rc = 0;

    for (size_t i = 0; i < a->n_rts && rc == 0; i++) {
        rc = kp__an_rl_push(&w->cat[KP_AN_RUNTIME], a->rts[i].start, a->rts[i].end);
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int c = d->kind == DEV_MEMCPY   ? KP_AN_MEMCPY
                : d->kind == DEV_MEMSET ? KP_AN_MEMSET
                                        : KP_AN_KERNEL;

        if (c == KP_AN_KERNEL) {
            int64_t e = kp__an_dev_ext(a, d);

            if (e && bsearch(&e, w->comm_ext, w->n_comm, sizeof(*w->comm_ext), cmp_i64)) {
                c = KP_AN_COMMUNICATION;
            }
            else if (d->kind == DEV_KERNEL && kp__an_is_comm_kernel_name(kp__an_nm(a, d->name))) {
                c = KP__AN_NAMED_COMM;
            }
        }
        if (rc == 0) {
            rc = kp__an_rl_push(&w->cat[c], d->start, d->end);
        }
    }
    return rc;
}

int kp__an_bd_collect(const struct kp_an *a, struct kp__an_bd_sets *s)
{
    int rc = bd_collect_ops(a, s);

    return rc < 0 ? rc : bd_collect_devs(a, s);
}

void kp__an_bd_sets_fini(struct kp__an_bd_sets *s)
{
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        free(s->cat[c].r);
    }
    free(s->comm_ext);
    memset(s, 0, sizeof(*s));
}

/* The named collectives' kernels into the category the figure gives them: Kernel for the
 * plugin's, Communication for kprof's. 0 or -ENOMEM. */
static int bd_place_named(struct kp__an_bd_sets *w, bool plugin_compat)
{
    struct kp__an_rlist *nm = &w->cat[KP__AN_NAMED_COMM];
    struct kp__an_rlist *to = &w->cat[plugin_compat ? KP_AN_KERNEL : KP_AN_COMMUNICATION];
    size_t pushed = nm->pushed;

    for (size_t i = 0; i < nm->n; i++) {
        if (kp__an_rl_push(to, nm->r[i].start, nm->r[i].end) < 0) {
            return -ENOMEM;
        }
    }
    /* what was pushed counts (has_communication), merged away or not */
    to->pushed += pushed - nm->n;
    free(nm->r);
    memset(nm, 0, sizeof(*nm));
    return 0;
}

/* Each category's share: its merged intervals within the steps, less those of the categories
 * before it; what is left is "other". Each list is sized for what it can hold: a ∩ b and
 * a − b hold at most |a| + |b| ranges. 0 or -ENOMEM. */
/* n ranges from src to dst; src may be NULL when n is 0 (a list that never grew), which
 * memcpy does not allow. */
static void ranges_copy(struct kp_range *dst, const struct kp_range *src, size_t n)
{
    if (n > 0) {
        memcpy(dst, src, n * sizeof(*dst));
    }
}

static int bd_mask(const struct kp_an *a, struct bd_work *w, bool plugin_compat)
{
    size_t n_steps = a->bd.n_steps;

    for (int c = 0; c < KP_AN_OTHER; c++) {
        w->sets.cat[c].n = kp_ranges_merge(w->sets.cat[c].r, w->sets.cat[c].n);
    }
    for (size_t s = 0; s < n_steps; s++) {
        w->all_steps[s] = (struct kp_range){ a->steps[s].start_ns, a->steps[s].end_ns };
    }
    w->n_all = kp_ranges_merge(w->all_steps, n_steps);
    if (kp__an_rl_reserve(&w->free_r, w->n_all + 1) < 0) {
        return -ENOMEM;
    }

    /* Priority masking. The plugin starts with no free time and resets it to all steps
     * whenever it is empty, taking that category unmasked: a double count once a category
     * covers every step. kprof keeps it empty. */
    if (!plugin_compat) {
        ranges_copy(w->free_r.r, w->all_steps, w->n_all);
        w->free_r.n = w->n_all;
    }
    for (int c = 0; c < KP_AN_OTHER; c++) {
        struct kp__an_rlist *sh = &w->share[c];

        if (kp__an_rl_reserve(sh, w->sets.cat[c].n + w->free_r.n + 1) < 0) {
            return -ENOMEM;
        }
        if (plugin_compat && w->free_r.n == 0) {
            ranges_copy(sh->r, w->sets.cat[c].r, w->sets.cat[c].n);
            sh->n = w->sets.cat[c].n;
            ranges_copy(w->free_r.r, w->all_steps, w->n_all);
            w->free_r.n = w->n_all;
        }
        else {
            sh->n = kp_ranges_intersect(w->sets.cat[c].r, w->sets.cat[c].n, w->free_r.r,
                                        w->free_r.n, sh->r);
        }
        if (kp__an_rl_reserve(&w->tmp, w->free_r.n + sh->n + 1) < 0) {
            return -ENOMEM;
        }
        w->free_r.n = kp_ranges_subtract(w->free_r.r, w->free_r.n, sh->r, sh->n, w->tmp.r);
        if (kp__an_rl_reserve(&w->free_r, w->free_r.n + 1) < 0) {
            return -ENOMEM;
        }
        ranges_copy(w->free_r.r, w->tmp.r, w->free_r.n);
    }
    if (kp__an_rl_reserve(&w->share[KP_AN_OTHER], w->free_r.n + 1) < 0) {
        return -ENOMEM;
    }
    ranges_copy(w->share[KP_AN_OTHER].r, w->free_r.r, w->free_r.n);
    w->share[KP_AN_OTHER].n = w->free_r.n;
    return 0;
}

/* Each step's cost per category, and the averages over the steps. */
static void bd_step_costs(struct kp_an *a, const struct bd_work *w)
{
    size_t n_steps = a->bd.n_steps;

    memset(a->bd.avg_ns, 0, sizeof(a->bd.avg_ns));
    a->bd.avg_total_ns = 0;
    for (size_t s = 0; s < n_steps; s++) {
        struct kp_an_step *st = &a->steps[s];

        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            st->cost_ns[c] =
                kp_ranges_clip_length(w->share[c].r, w->share[c].n, st->start_ns, st->end_ns);
            a->bd.avg_ns[c] += (double) st->cost_ns[c];
        }
        a->bd.avg_total_ns += (double) (st->end_ns - st->start_ns);
    }
    if (n_steps > 0) {
        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            a->bd.avg_ns[c] /= (double) n_steps;
        }
        a->bd.avg_total_ns /= (double) n_steps;
    }
}

int kp_an_breakdown(struct kp_an *a, bool plugin_compat, const struct kp_an_breakdown **out)
{
    struct bd_work w = { 0 };
    const struct kp__an_rlist *comp;
    size_t n_steps;
    int rc = -ENOMEM;

    /* the breakdown view asks for the figure the recommendations worked out just before */
    if (a->bd_done && a->bd_compat == plugin_compat) {
        *out = &a->bd;
        return 0;
    }
    a->bd_done = false;
    if (a->windowed) {
        return kp__an_bdwin_figure(a, plugin_compat, out);
    }
    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    if ((rc = kp__an_build_steps(a)) < 0) {
        return rc;
    }
    rc = -ENOMEM;
    n_steps = a->bd.n_steps;
    w.all_steps = calloc(n_steps + 1, sizeof(*w.all_steps));
    if (!w.all_steps || kp__an_bd_collect(a, &w.sets) < 0 ||
        bd_place_named(&w.sets, plugin_compat) < 0) {
        goto out;
    }
    a->bd.use_dp = w.sets.use_dp;
    a->bd.use_ddp = w.sets.use_ddp;
    a->bd.has_runtime = a->n_rts > 0;
    a->bd.has_kernel = a->n_kernels > 0;
    a->bd.has_memcpy_or_memset = a->n_memcpy + a->n_memset > 0;
    a->bd.has_communication = w.sets.cat[KP_AN_COMMUNICATION].pushed > 0;
    a->bd.comm_node_count = w.sets.n_nccl && w.sets.n_gloo ? 0 : w.sets.n_nccl + w.sets.n_gloo;
    a->bd.comm_nccl = w.sets.n_nccl > 0;
    if (bd_mask(a, &w, plugin_compat) < 0) {
        goto out;
    }
    bd_step_costs(a, &w);
    comp = w.sets.cat[KP_AN_KERNEL].n ? &w.sets.cat[KP_AN_KERNEL] : &w.sets.cat[KP_AN_CPU_EXEC];
    /* overlap's intersection, then gpu_utilization's kernels of one GPU */
    if (kp__an_rl_reserve(&w.tmp, comp->n + w.sets.cat[KP_AN_COMMUNICATION].n + 1) < 0 ||
        kp__an_rl_reserve(&w.tmp, a->n_devs + 1) < 0) {
        goto out;
    }
    overlap(a, comp, &w.sets.cat[KP_AN_COMMUNICATION], w.tmp.r);
    rc = gpu_utilization(a, w.tmp.r);
    if (rc < 0) {
        goto out;
    }
    a->bd_done = true;
    a->bd_compat = plugin_compat;
    *out = &a->bd;
out:
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        free(w.share[c].r);
    }
    kp__an_bd_sets_fini(&w.sets);
    free(w.free_r.r);
    free(w.all_steps);
    free(w.tmp.r);
    return rc;
}
