/* kp_an: the step-time breakdown (spec §4): categories per step, GPU utilization, SM efficiency,
 * occupancy. */
#define _GNU_SOURCE /* qsort_r */
#include "an_impl.h"

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

struct rlist {
    struct kp_range *r;
    size_t n;
};

static int rl_push(struct rlist *l, size_t cap, int64_t s, int64_t e)
{
    if (l->n >= cap) {
        return -ENOMEM;
    }
    l->r[l->n++] = (struct kp_range){ s, e };
    return 0;
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return (a > b) - (a < b);
}

/* Computation, communication and their overlap per step (spec §9); tmp holds comp->n +
 * comm->n ranges. */
static void overlap(struct kp_an *a, const struct rlist *comp, const struct rlist *comm,
                    struct kp_range *tmp)
{
    size_t n = kp_ranges_intersect(comp->r, comp->n, comm->r, comm->n, tmp);

    for (size_t s = 0; s < a->bd.n_steps; s++) {
        struct kp_an_step *st = &a->steps[s];

        st->computation_ns = kp_ranges_clip_length(comp->r, comp->n, st->start_ns, st->end_ns);
        st->communication_ns = kp_ranges_clip_length(comm->r, comm->n, st->start_ns, st->end_ns);
        st->overlap_ns = kp_ranges_clip_length(tmp, n, st->start_ns, st->end_ns);
    }
}

struct sm_ev {
    int64_t t;
    int start; /* 1: a kernel starts (sorted before ends at equal times) */
    double bps;
    size_t idx; /* insertion order, to keep the float sums reproducible */
};

static int cmp_sm_ev(const void *pa, const void *pb)
{
    const struct sm_ev *x = pa, *y = pb;

    if (x->t != y->t) {
        return x->t < y->t ? -1 : 1;
    }
    if (x->start != y->start) {
        return y->start - x->start;
    }
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Est. SM efficiency of GPU g over [w0, w1] (spec §8): a sweep over its kernels with blocks per
 * SM > 0 keeps the running sum; each stretch between consecutive distinct times with a sum > 0
 * counts min(sum, 1) over its part inside the window. Undefined when none falls inside. The
 * stretches, unclipped, go to b's SM-efficiency ranges of slot k. Returns 0 or -ENOMEM. */
static int sm_efficiency(struct kp_an *a, int g, size_t k, int64_t w0, int64_t w1)
{
    struct kp_an_breakdown *b = &a->bd;
    struct sm_ev *ev = calloc(2 * a->n_devs + 1, sizeof(*ev));
    struct kp_an_sm_range *seg = calloc(2 * a->n_devs + 1, sizeof(*seg));
    size_t n = 0, n_seg = 0;
    double sum = 0.0, acc = 0.0;
    bool any = false;

    b->est_sm_efficiency[k] = 0.0;
    b->est_sm_efficiency_defined[k] = false;
    if (!ev || !seg) {
        free(ev);
        free(seg);
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];

        if (d->kind != DEV_KERNEL || d->device != g || isnan(d->bps) || !(d->bps > 0)) {
            continue;
        }
        ev[n] = (struct sm_ev){ d->start, 1, d->bps, n };
        n++;
        ev[n] = (struct sm_ev){ d->end, 0, d->bps, n };
        n++;
    }
    qsort(ev, n, sizeof(*ev), cmp_sm_ev);
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

int kp_an_breakdown(struct kp_an *a, bool plugin_compat, const struct kp_an_breakdown **out)
{
    size_t cap = a->n_ops + a->n_rts + a->n_devs + 1, n_comm = 0, n_steps, n_nccl = 0, n_gloo = 0;
    struct rlist cat[KP_AN_CAT_COUNT] = { { 0 } }, share[KP_AN_CAT_COUNT] = { { 0 } };
    struct kp_range *free_r = NULL, *all_steps = NULL, *tmp = NULL;
    size_t n_free = 0, n_all = 0;
    int64_t *comm_ext = NULL;
    int rc = -ENOMEM;

    if (!a->built && (rc = an_build_model(a)) < 0) {
        return rc;
    }
    if ((rc = an_build_steps(a)) < 0) {
        return rc;
    }
    rc = -ENOMEM;
    n_steps = a->bd.n_steps;
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        cat[c].r = calloc(cap, sizeof(struct kp_range));
        share[c].r = calloc(2 * cap + n_steps + 1, sizeof(struct kp_range));
        if (!cat[c].r || !share[c].r) {
            goto out;
        }
    }
    free_r = calloc(2 * cap + n_steps + 1, sizeof(*free_r));
    all_steps = calloc(n_steps + 1, sizeof(*all_steps));
    tmp = calloc(2 * cap + n_steps + 1, sizeof(*tmp));
    comm_ext = calloc(a->n_ops + 1, sizeof(*comm_ext));
    if (!free_r || !all_steps || !tmp || !comm_ext) {
        goto out;
    }

    /* Each category's intervals, from all events. */
    a->bd.use_dp = a->bd.use_ddp = false;
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *s = nm(a, o->name);
        bool host = o->kind == OPK_CPU_OP || o->kind == OPK_USER_ANNOTATION;

        if (strcmp(s, "DataParallel.forward") == 0) {
            a->bd.use_dp = true;
        }
        else if (strcmp(s, "DistributedDataParallel.forward") == 0) {
            a->bd.use_ddp = true;
        }
        if (an_is_comm_op(o, s)) {
            rl_push(&cat[KP_AN_COMMUNICATION], cap, o->start, o->end);
            n_nccl += s[0] == 'n';
            n_gloo += s[0] == 'g';
            if (o->ext) {
                comm_ext[n_comm++] = o->ext;
            }
        }
        if (host && an_is_dataloader_name(s)) {
            rl_push(&cat[KP_AN_DATALOADER], cap, o->start, o->end);
        }
        else if (host || o->kind == OPK_GPU_USER_ANNOTATION || o->kind == OPK_NVTX) {
            rl_push(&cat[KP_AN_CPU_EXEC], cap, o->start, o->end);
        }
    }
    qsort(comm_ext, n_comm, sizeof(*comm_ext), cmp_i64);
    for (size_t i = 0; i < a->n_rts; i++) {
        rl_push(&cat[KP_AN_RUNTIME], cap, a->rts[i].start, a->rts[i].end);
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int c = d->kind == DEV_MEMCPY   ? KP_AN_MEMCPY
                : d->kind == DEV_MEMSET ? KP_AN_MEMSET
                                        : KP_AN_KERNEL;

        if (c == KP_AN_KERNEL) {
            int64_t e = an_dev_ext(a, d);

            if ((e && bsearch(&e, comm_ext, n_comm, sizeof(*comm_ext), cmp_i64)) ||
                (!plugin_compat && d->kind == DEV_KERNEL &&
                 an_is_comm_kernel_name(nm(a, d->name)))) {
                c = KP_AN_COMMUNICATION;
            }
        }
        rl_push(&cat[c], cap, d->start, d->end);
    }
    a->bd.has_runtime = a->n_rts > 0;
    a->bd.has_kernel = a->n_kernels > 0;
    a->bd.has_memcpy_or_memset = a->n_memcpy + a->n_memset > 0;
    a->bd.has_communication = cat[KP_AN_COMMUNICATION].n > 0;
    a->bd.comm_node_count = n_nccl && n_gloo ? 0 : n_nccl + n_gloo;
    a->bd.comm_nccl = n_nccl > 0;
    for (int c = 0; c < KP_AN_OTHER; c++) {
        cat[c].n = kp_ranges_merge(cat[c].r, cat[c].n);
    }
    for (size_t s = 0; s < n_steps; s++) {
        all_steps[s] = (struct kp_range){ a->steps[s].start_ns, a->steps[s].end_ns };
    }
    n_all = kp_ranges_merge(all_steps, n_steps);

    /* Priority masking. The plugin starts with no free time and resets it to all steps
     * whenever it is empty, taking that category unmasked: a double count once a category
     * covers every step. kprof keeps it empty. */
    if (!plugin_compat) {
        memcpy(free_r, all_steps, n_all * sizeof(*free_r));
        n_free = n_all;
    }
    for (int c = 0; c < KP_AN_OTHER; c++) {
        if (plugin_compat && n_free == 0) {
            memcpy(share[c].r, cat[c].r, cat[c].n * sizeof(*free_r));
            share[c].n = cat[c].n;
            memcpy(free_r, all_steps, n_all * sizeof(*free_r));
            n_free = n_all;
        }
        else {
            share[c].n = kp_ranges_intersect(cat[c].r, cat[c].n, free_r, n_free, share[c].r);
        }
        n_free = kp_ranges_subtract(free_r, n_free, share[c].r, share[c].n, tmp);
        memcpy(free_r, tmp, n_free * sizeof(*free_r));
    }
    memcpy(share[KP_AN_OTHER].r, free_r, n_free * sizeof(*free_r));
    share[KP_AN_OTHER].n = n_free;

    memset(a->bd.avg_ns, 0, sizeof(a->bd.avg_ns));
    a->bd.avg_total_ns = 0;
    for (size_t s = 0; s < n_steps; s++) {
        struct kp_an_step *st = &a->steps[s];

        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            st->cost_ns[c] =
                kp_ranges_clip_length(share[c].r, share[c].n, st->start_ns, st->end_ns);
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
    overlap(a, cat[KP_AN_KERNEL].n ? &cat[KP_AN_KERNEL] : &cat[KP_AN_CPU_EXEC],
            &cat[KP_AN_COMMUNICATION], tmp);
    rc = gpu_utilization(a, tmp);
    if (rc < 0) {
        goto out;
    }
    *out = &a->bd;
out:
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        free(cat[c].r);
        free(share[c].r);
    }
    free(free_r);
    free(all_steps);
    free(tmp);
    free(comm_ext);
    return rc;
}
