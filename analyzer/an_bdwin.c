/*
 * The step-time breakdown of a rank read by windows (an_window.c): both figures, each GPU's
 * utilization, SM efficiency and occupancy, exactly as kp_an_breakdown makes them from the
 * whole rank, while what is held is one window's model, the intervals that reach past the
 * time already summed, and a fixed number of sums per step.
 *
 * The breakdown does not add up over windows as the tables do: device time runs behind the
 * host's, so a category's intervals cross windows, and a step's range depends on the device
 * events it launched. What does add up is time itself. Every instant lies in at most one step
 * (fitted steps follow each other) and under some set of the breakdown's classes; a step's
 * sum of time under each set (2^8 of them: seven categories and the kernels only named as a
 * collective's, which the two figures count differently) gives every figure of the step: a
 * category's cost under kprof's priority (the lowest category in the set), under the plugin's
 * (which resets its free time once a category leaves none, decided on the steps' totals of the
 * same sums), and the computation/communication overlap. So the windows' intervals are swept
 * in time order, the sets' lengths summed per step, up to a watermark g: the time before it
 * that no later window can reach. Host events of later windows start at or after the cut;
 * their device events run after their launch, which is checked (a device event that starts
 * before g stops the windows: the rank is read whole). The steps are the host steps (from the
 * plan: ProfilerStep ops or recorded steps, one query) fitted to their device events as each
 * step closes, i.e. once no later runtime call can fall in it; g stays below the first step not
 * yet closed, so every instant is summed into the step it belongs to.
 *
 * The GPUs' figures are clipped to [first step's start, last step's end], whose end is known
 * only when the tail is trimmed at the end: they are summed per slot (a step and the gap before
 * it) and the slots of the steps kept are added at the end. Integer sums are exact; the SM
 * efficiency's and the occupancy's double sums are added in another order than the whole
 * read's (the same to about 1e-15). The trace counters (the utilization timeline, the SM
 * efficiency ranges), which only the offline `breakdown` command prints, are left empty.
 */
#include "an_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ranges.h"

/* Sets of the breakdown's classes (struct kp__an_bd_sets): bit c for class c. */
#define N_SETS       256
#define CLASS_BIT(c) (1u << (c))

struct kp__an_bdsums {
    int64_t (*sums)[N_SETS]; /* per step: its time under exactly each set of classes */
    size_t n_steps;
    unsigned pushed;   /* classes with any interval */
    unsigned positive; /* classes with an interval of positive length */
    size_t n_nccl, n_gloo;
    bool use_dp, use_ddp, has_kernel, has_memcpy_or_memset;
};

/* A kernel of one GPU not summed to its end yet. */
struct pend {
    int64_t s, e;
    double bps, occ; /* NaN: unknown */
    size_t idx;      /* arrival order: ties sort as the whole read's device order */
};

/* One GPU: its kernels still open, and its figures' sums per slot (slot s: step s and the gap
 * before it; slot 0 starts at the first step's start). */
struct gpu {
    bool seen;
    struct pend *k;
    size_t n, cap, next_idx;
    int64_t *busy;
    double *sm, *occ_num, *occ_den;
    uint8_t *sm_any;
};

struct kp__an_bdwin {
    struct kp_an_step *host;  /* the host steps, which runtime calls fall in */
    struct kp_an_step *steps; /* the same, [0, n_closed) fitted to their device events */
    struct kp__an_step_dev *sd;
    size_t n, n_closed;
    bool launched;
    /* step 0 starts at its host start or at the end of a device event outside every step that
     * ends before step 0's first one: pre holds those ends until step 0 closes */
    int64_t prev_end0;
    bool prev0_set;
    int64_t *pre;
    size_t n_pre, cap_pre;
    struct kp__an_bd_sets sets; /* intervals not summed yet (each ends after g) */
    int64_t g;                  /* the time before g is summed */
    bool g_set;
    struct kp__an_bdsums *out;
    struct gpu gpu[KP_AN_MAX_GPUS];
};

int kp__an_bdwin_new(const struct kp_an_step *steps, size_t n, struct kp__an_bdwin **out)
{
    struct kp__an_bdwin *b = calloc(1, sizeof(*b));

    *out = NULL;
    if (!b || !(b->steps = calloc(n + 1, sizeof(*b->steps))) ||
        !(b->host = calloc(n + 1, sizeof(*b->host))) || !(b->sd = calloc(n + 1, sizeof(*b->sd))) ||
        !(b->out = calloc(1, sizeof(*b->out))) ||
        !(b->out->sums = calloc(n + 1, sizeof(*b->out->sums)))) {
        kp__an_bdwin_free(b);
        return -ENOMEM;
    }
    if (n > 0) {
        memcpy(b->steps, steps, n * sizeof(*steps));
        memcpy(b->host, steps, n * sizeof(*steps));
    }
    for (size_t s = 0; s < n; s++) {
        b->sd[s].min_start = INT64_MAX;
        b->sd[s].max_end = INT64_MIN;
    }
    b->n = n;
    *out = b;
    return 0;
}

void kp__an_bdsums_free(struct kp__an_bdsums *s)
{
    if (s) {
        free(s->sums);
        free(s);
    }
}

void kp__an_bdwin_free(struct kp__an_bdwin *b)
{
    if (!b) {
        return;
    }
    for (int g = 0; g < KP_AN_MAX_GPUS; g++) {
        struct gpu *u = &b->gpu[g];

        free(u->k);
        free(u->busy);
        free(u->sm);
        free(u->occ_num);
        free(u->occ_den);
        free(u->sm_any);
    }
    kp__an_bd_sets_fini(&b->sets);
    kp__an_bdsums_free(b->out);
    free(b->pre);
    free(b->sd);
    free(b->steps);
    free(b->host);
    free(b);
}

/* ---- steps and slots -------------------------------------------------------------------- */

/* The host step runtime call [s, e] falls in (kp__an_build_steps' rule: the last one starting at
 * or before it, if it ends inside it), or -1. */
static int32_t host_step_of(const struct kp__an_bdwin *b, int64_t s, int64_t e)
{
    size_t lo = 0, hi = b->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (b->host[mid].start_ns <= s) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo > 0 && e <= b->host[lo - 1].end_ns ? (int32_t) (lo - 1) : -1;
}

/* The first closed step ending after t, or n_closed. */
static size_t first_after(const struct kp__an_bdwin *b, int64_t t)
{
    size_t lo = 0, hi = b->n_closed;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (b->steps[mid].end_ns <= t) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo;
}

/* Slot s's bounds [lo, hi), false when they are not known yet (its step is the first not
 * closed and there is none before it) or there is no such slot. */
static bool slot_bounds(const struct kp__an_bdwin *b, size_t s, int64_t *lo, int64_t *hi)
{
    if (s >= b->n || s > b->n_closed || (s == 0 && b->n_closed == 0)) {
        return false;
    }
    *lo = s == 0 ? b->steps[0].start_ns : b->steps[s - 1].end_ns;
    *hi = s < b->n_closed ? b->steps[s].end_ns : INT64_MAX;
    return true;
}

/* Adds the time of [x, y) under set m to the closed steps it meets. */
static void add_to_steps(struct kp__an_bdwin *b, int64_t x, int64_t y, unsigned m)
{
    for (size_t s = first_after(b, x); s < b->n_closed && b->steps[s].start_ns < y; s++) {
        int64_t lo = b->steps[s].start_ns > x ? b->steps[s].start_ns : x;
        int64_t hi = b->steps[s].end_ns < y ? b->steps[s].end_ns : y;

        if (hi > lo) {
            b->out->sums[s][m] += hi - lo;
        }
    }
}

/* What a GPU sums over [x, y): busy time, SM efficiency (v: min(blocks per SM, 1)) or the
 * occupancy (v: its value), per slot. */
enum gpu_sum {
    SUM_BUSY,
    SUM_SM,
    SUM_OCC
};

static void add_to_slots(struct kp__an_bdwin *b, struct gpu *u, int64_t x, int64_t y,
                         enum gpu_sum what, double v)
{
    int64_t lo, hi;

    for (size_t s = first_after(b, x); slot_bounds(b, s, &lo, &hi) && lo < y; s++) {
        int64_t l = (hi < y ? hi : y) - (lo > x ? lo : x);

        if (l <= 0) {
            continue;
        }
        if (what == SUM_BUSY) {
            u->busy[s] += l;
        }
        else if (what == SUM_SM) {
            u->sm[s] += v * (double) l;
            u->sm_any[s] = 1;
        }
        else {
            u->occ_num[s] += v * (double) l;
            u->occ_den[s] += (double) l;
        }
    }
}

/* Fits step n_closed to its device events. */
static void close_step(struct kp__an_bdwin *b)
{
    size_t s = b->n_closed;
    int64_t prev;

    if (s == 0) {
        prev = b->host[0].start_ns;
        if (b->sd[0].count > 0) {
            for (size_t i = 0; i < b->n_pre; i++) {
                if (b->pre[i] < b->sd[0].min_start && b->pre[i] > prev) {
                    prev = b->pre[i];
                }
            }
        }
        b->prev_end0 = prev;
        b->prev0_set = true;
        free(b->pre);
        b->pre = NULL;
        b->n_pre = b->cap_pre = 0;
    }
    else {
        prev = b->steps[s - 1].end_ns;
    }
    kp__an_step_fit(&b->steps[s], &b->sd[s], prev);
    b->n_closed++;
}

/* ---- summing up to g ------------------------------------------------------------------- */

/* The classes' time before g into the steps' sums; what reaches past g is kept, from g on. */
static void sum_classes(struct kp__an_bdwin *b, int64_t g)
{
    struct kp__an_rlist *l = b->sets.cat;
    size_t idx[KP_AN_CAT_COUNT] = { 0 };
    int64_t t = INT64_MAX;

    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        l[c].n = kp_ranges_merge(l[c].r, l[c].n);
        if (l[c].n > 0) {
            b->out->positive |= CLASS_BIT(c);
            t = l[c].r[0].start < t ? l[c].r[0].start : t;
        }
    }
    while (t < g) {
        int64_t nxt = g;
        unsigned m = 0;
        bool any = false;

        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            while (idx[c] < l[c].n && l[c].r[idx[c]].end <= t) {
                idx[c]++;
            }
            if (idx[c] == l[c].n) {
                continue;
            }
            any = true;
            if (l[c].r[idx[c]].start <= t) {
                m |= CLASS_BIT(c);
                nxt = l[c].r[idx[c]].end < nxt ? l[c].r[idx[c]].end : nxt;
            }
            else {
                nxt = l[c].r[idx[c]].start < nxt ? l[c].r[idx[c]].start : nxt;
            }
        }
        if (!any) {
            break;
        }
        if (m != 0) {
            add_to_steps(b, t, nxt, m);
        }
        t = nxt;
    }
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        size_t k = 0;

        for (size_t i = 0; i < l[c].n; i++) {
            if (l[c].r[i].end > g) {
                l[c].r[k].start = l[c].r[i].start > g ? l[c].r[i].start : g;
                l[c].r[k++].end = l[c].r[i].end;
            }
        }
        l[c].n = k;
    }
}

static int cmp_pend(const void *pa, const void *pb)
{
    const struct pend *x = pa, *y = pb;

    if (x->s != y->s) {
        return x->s < y->s ? -1 : 1;
    }
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* GPU u's kernels' time in [g0, g): busy, SM efficiency, occupancy; the kernels that run past g
 * are kept. 0 or -ENOMEM. */
static int sum_gpu(struct kp__an_bdwin *b, struct gpu *u, int64_t g0, int64_t g)
{
    struct kp__an_sm_ev *ev;
    size_t n_ev = 0, k = 0;
    int64_t cs = 0, ce = INT64_MIN;
    double sum = 0.0;

    if (u->n == 0) {
        return 0;
    }
    if (!(ev = calloc(2 * u->n, sizeof(*ev)))) {
        return -ENOMEM;
    }
    qsort(u->k, u->n, sizeof(*u->k), cmp_pend);
    for (size_t i = 0; i < u->n; i++) {
        const struct pend *p = &u->k[i];
        int64_t x = p->s > g0 ? p->s : g0, y = p->e < g ? p->e : g;

        /* busy: the union of the kernels, as merged runs */
        if (x < y) {
            if (x > ce) {
                if (ce > cs) {
                    add_to_slots(b, u, cs, ce, SUM_BUSY, 0.0);
                }
                cs = x;
                ce = y;
            }
            else if (y > ce) {
                ce = y;
            }
        }
        if (!isnan(p->occ) && p->occ >= 0 && x < y) {
            add_to_slots(b, u, x, y, SUM_OCC, p->occ);
        }
        if (!isnan(p->bps) && p->bps > 0 && p->e > x) {
            ev[n_ev++] = (struct kp__an_sm_ev){ x, 1, p->bps, p->idx };
            ev[n_ev++] = (struct kp__an_sm_ev){ p->e, 0, p->bps, p->idx };
        }
    }
    if (ce > cs) {
        add_to_slots(b, u, cs, ce, SUM_BUSY, 0.0);
    }
    qsort(ev, n_ev, sizeof(*ev), kp__an_cmp_sm_ev);
    for (size_t i = 0; i < n_ev && ev[i].t < g; i++) {
        sum += ev[i].start ? ev[i].bps : -ev[i].bps;
        if (i + 1 < n_ev && ev[i + 1].t > ev[i].t && sum > 0) {
            int64_t hi = ev[i + 1].t < g ? ev[i + 1].t : g;

            add_to_slots(b, u, ev[i].t, hi, SUM_SM, sum < 1.0 ? sum : 1.0);
        }
    }
    free(ev);
    for (size_t i = 0; i < u->n; i++) {
        if (u->k[i].e > g) {
            u->k[k++] = u->k[i];
        }
    }
    u->n = k;
    return 0;
}

/* Sums everything before g and moves the watermark there. 0 or -ENOMEM. */
static int sum_to(struct kp__an_bdwin *b, int64_t g)
{
    int64_t g0 = b->g_set ? b->g : INT64_MIN;

    if (b->g_set && g < b->g) {
        g = b->g;
    }
    sum_classes(b, g);
    for (int i = 0; i < KP_AN_MAX_GPUS; i++) {
        if (b->gpu[i].seen && sum_gpu(b, &b->gpu[i], g0, g) < 0) {
            return -ENOMEM;
        }
    }
    b->g = g;
    b->g_set = true;
    return 0;
}

/* ---- a window ----------------------------------------------------------------------------- */

static int gpu_push(struct kp__an_bdwin *b, const struct an_dev *d)
{
    struct gpu *u = &b->gpu[d->device];

    if (!u->seen) {
        size_t n = b->n + 1;

        if (!(u->busy = calloc(n, sizeof(*u->busy))) || !(u->sm = calloc(n, sizeof(*u->sm))) ||
            !(u->occ_num = calloc(n, sizeof(*u->occ_num))) ||
            !(u->occ_den = calloc(n, sizeof(*u->occ_den))) ||
            !(u->sm_any = calloc(n, sizeof(*u->sm_any)))) {
            return -ENOMEM;
        }
        u->seen = true;
    }
    if (u->n == u->cap) {
        size_t nc = u->cap ? 2 * u->cap : 256;
        struct pend *k = realloc(u->k, nc * sizeof(*k));

        if (!k) {
            return -ENOMEM;
        }
        u->k = k;
        u->cap = nc;
    }
    u->k[u->n++] = (struct pend){ d->start, d->end, d->bps, d->occ, u->next_idx++ };
    return 0;
}

/* Counts a's device events into their steps (the steps their runtime calls fall in), keeps
 * the ends of those outside every step for step 0's start. 0, 1 (cannot), -ENOMEM. */
static int count_devs(struct kp__an_bdwin *b, const struct kp_an *a)
{
    int32_t *rstep = calloc(a->n_rts + 1, sizeof(*rstep));
    int rc = 0;

    if (!rstep) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_rts; i++) {
        rstep[i] = host_step_of(b, a->rts[i].start, a->rts[i].end);
        if (rstep[i] >= 0 && (size_t) rstep[i] < b->n_closed) {
            rc = 1; /* a step already fitted and summed */
            goto out;
        }
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int32_t s = d->rt >= 0 && (size_t) d->rt < a->n_rts ? rstep[d->rt] : -1;

        if (s >= 0) {
            struct kp__an_step_dev *sd = &b->sd[s];

            sd->count++;
            sd->min_start = d->start < sd->min_start ? d->start : sd->min_start;
            sd->max_end = d->end > sd->max_end ? d->end : sd->max_end;
            b->launched = true;
            continue;
        }
        if (b->prev0_set) {
            if (b->sd[0].count > 0 && d->end < b->sd[0].min_start && d->end > b->prev_end0) {
                rc = 1; /* it would have moved step 0's start */
                goto out;
            }
            continue;
        }
        if (b->n_pre == b->cap_pre) {
            size_t nc = b->cap_pre ? 2 * b->cap_pre : 256;
            int64_t *p = realloc(b->pre, nc * sizeof(*p));

            if (!p) {
                rc = -ENOMEM;
                goto out;
            }
            b->pre = p;
            b->cap_pre = nc;
        }
        b->pre[b->n_pre++] = d->end;
    }
out:
    free(rstep);
    return rc;
}

int kp__an_bdwin_add(struct kp__an_bdwin *b, const struct kp_an *a, int64_t t_hi, bool last)
{
    int64_t g;
    int rc;

    if (b->g_set) {
        for (size_t i = 0; i < a->n_devs; i++) {
            if (a->devs[i].end > a->devs[i].start && a->devs[i].start < b->g) {
                return 1; /* it runs in time already summed */
            }
        }
    }
    if ((rc = count_devs(b, a)) != 0 || (rc = kp__an_bd_collect(a, &b->sets)) < 0) {
        return rc;
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];

        if (d->kind == DEV_KERNEL && d->device >= 0 && d->device < KP_AN_MAX_GPUS &&
            (rc = gpu_push(b, d)) < 0) {
            return rc;
        }
    }
    b->out->n_nccl = b->sets.n_nccl;
    b->out->n_gloo = b->sets.n_gloo;
    b->out->use_dp = b->sets.use_dp;
    b->out->use_ddp = b->sets.use_ddp;
    b->out->has_kernel = b->out->has_kernel || a->n_kernels > 0;
    b->out->has_memcpy_or_memset = b->out->has_memcpy_or_memset || a->n_memcpy + a->n_memset > 0;
    /* closed: no later runtime call can fall in it (they start at or after t_hi) */
    while (b->n_closed < b->n) {
        const struct kp_an_step *st = &b->host[b->n_closed];

        if (!last && st->end_ns >= t_hi && !(b->n_closed + 1 < b->n && st[1].start_ns <= t_hi)) {
            break;
        }
        close_step(b);
    }
    g = last ? INT64_MAX : t_hi;
    if (b->n_closed < b->n && b->host[b->n_closed].start_ns < g) {
        g = b->host[b->n_closed].start_ns;
    }
    return sum_to(b, g);
}

/* ---- the result ----------------------------------------------------------------------------- */

int kp__an_bdwin_finish(struct kp__an_bdwin *b, struct kp_an *h)
{
    struct kp_an_breakdown *bd = &h->bd;
    struct kp__an_bdsums *z = b->out;
    size_t n = b->launched ? kp__an_steps_trim(b->sd, b->n) : b->n;
    int64_t w0 = n ? b->steps[0].start_ns : 0, w1 = n ? b->steps[n - 1].end_ns : 0;

    /* each step's time under no class */
    for (size_t s = 0; s < n; s++) {
        int64_t rest = b->steps[s].end_ns - b->steps[s].start_ns;

        for (unsigned m = 1; m < N_SETS; m++) {
            rest -= z->sums[s][m];
        }
        z->sums[s][0] = rest;
    }
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        z->pushed |= b->sets.cat[c].pushed > 0 ? CLASS_BIT(c) : 0;
    }
    z->n_steps = n;
    bd->n_gpus = 0;
    for (int g = 0; g < KP_AN_MAX_GPUS; g++) {
        const struct gpu *u = &b->gpu[g];
        int64_t busy = 0;
        double sm = 0.0, num = 0.0, den = 0.0;
        bool any = false;
        size_t k = bd->n_gpus;

        if (!u->seen) {
            continue;
        }
        for (size_t s = 0; s < n; s++) {
            busy += u->busy[s];
            sm += u->sm[s];
            any = any || u->sm_any[s];
            num += u->occ_num[s];
            den += u->occ_den[s];
        }
        bd->gpu_ids[k] = g;
        bd->gpu_utilization[k] = w1 > w0 ? (double) busy / (double) (w1 - w0) : 0.0;
        bd->est_sm_efficiency_defined[k] = any && w1 > w0;
        bd->est_sm_efficiency[k] = any && w1 > w0 ? sm / (double) (w1 - w0) : 0.0;
        bd->est_achieved_occupancy_defined[k] = den > 0;
        bd->est_achieved_occupancy[k] = den > 0 ? num / den : 0.0;
        bd->n_gpus++;
    }
    free(h->steps);
    h->steps = b->steps;
    b->steps = NULL;
    bd->steps = h->steps;
    bd->n_steps = n;
    kp__an_bdsums_free(h->bd_sums);
    h->bd_sums = z;
    b->out = NULL;
    kp__an_bdwin_free(b);
    return 0;
}

/* The categories set m counts as in a figure: the named collectives' kernels are the plugin's
 * Kernel and kprof's Communication. */
static unsigned cats_of(unsigned m, bool plugin_compat)
{
    unsigned c = m & ~CLASS_BIT(KP__AN_NAMED_COMM);

    if (m & CLASS_BIT(KP__AN_NAMED_COMM)) {
        c |= CLASS_BIT(plugin_compat ? KP_AN_KERNEL : KP_AN_COMMUNICATION);
    }
    return c;
}

/* Bits [lo, hi) of the categories. */
static unsigned cats_range(int lo, int hi)
{
    return (CLASS_BIT(hi) - 1u) & ~(CLASS_BIT(lo) - 1u);
}

int kp__an_bdwin_figure(struct kp_an *a, bool plugin_compat, const struct kp_an_breakdown **out)
{
    const struct kp__an_bdsums *z = a->bd_sums;
    struct kp_an_breakdown *bd = &a->bd;
    unsigned cats[N_SETS], comp, kern;
    int reset_at[KP_AN_OTHER], r = 0; /* per category, the last reset at or before it */
    bool reset[KP_AN_OTHER] = { false };

    if (!z) {
        return -EINVAL; /* read by windows for the tables only */
    }
    for (unsigned m = 0; m < N_SETS; m++) {
        cats[m] = cats_of(m, plugin_compat);
    }
    /* The plugin's resets (an_breakdown.c, bd_mask): it starts with no free time, so the first
     * category is taken whole; a later one is when the categories since the last reset cover
     * every step. */
    reset[0] = plugin_compat;
    reset_at[0] = 0;
    for (int c = 1; c < KP_AN_OTHER && plugin_compat; c++) {
        unsigned prior = cats_range(r, c);
        int64_t free_ns = 0;

        for (size_t s = 0; s < z->n_steps; s++) {
            for (unsigned m = 0; m < N_SETS; m++) {
                free_ns += (cats[m] & prior) == 0 ? z->sums[s][m] : 0;
            }
        }
        if (free_ns == 0) {
            reset[c] = true;
            r = c;
        }
        reset_at[c] = r;
    }
    kern = (z->positive & CLASS_BIT(KP_AN_KERNEL)) ||
           (plugin_compat && (z->positive & CLASS_BIT(KP__AN_NAMED_COMM)));
    comp = kern ? KP_AN_KERNEL : KP_AN_CPU_EXEC;
    memset(bd->avg_ns, 0, sizeof(bd->avg_ns));
    bd->avg_total_ns = 0;
    for (size_t s = 0; s < z->n_steps; s++) {
        struct kp_an_step *st = &a->steps[s];

        memset(st->cost_ns, 0, sizeof(st->cost_ns));
        st->computation_ns = st->communication_ns = st->overlap_ns = 0;
        for (unsigned m = 0; m < N_SETS; m++) {
            int64_t v = z->sums[s][m];
            unsigned cm = cats[m];

            if (v == 0) {
                continue;
            }
            if (!plugin_compat) {
                st->cost_ns[cm ? __builtin_ctz(cm) : KP_AN_OTHER] += v;
            }
            else {
                bool other = (cm & cats_range(r, KP_AN_OTHER)) == 0;

                for (int c = 0; c < KP_AN_OTHER; c++) {
                    if ((cm & CLASS_BIT(c)) &&
                        (reset[c] || (cm & cats_range(reset_at[c], c)) == 0)) {
                        st->cost_ns[c] += v;
                    }
                }
                st->cost_ns[KP_AN_OTHER] += other ? v : 0;
            }
            st->computation_ns += (cm & CLASS_BIT(comp)) ? v : 0;
            st->communication_ns += (cm & CLASS_BIT(KP_AN_COMMUNICATION)) ? v : 0;
            st->overlap_ns +=
                (cm & CLASS_BIT(comp)) && (cm & CLASS_BIT(KP_AN_COMMUNICATION)) ? v : 0;
        }
        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            bd->avg_ns[c] += (double) st->cost_ns[c];
        }
        bd->avg_total_ns += (double) (st->end_ns - st->start_ns);
    }
    if (z->n_steps > 0) {
        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            bd->avg_ns[c] /= (double) z->n_steps;
        }
        bd->avg_total_ns /= (double) z->n_steps;
    }
    bd->has_runtime = (z->pushed & CLASS_BIT(KP_AN_RUNTIME)) != 0;
    bd->has_kernel = z->has_kernel;
    bd->has_memcpy_or_memset = z->has_memcpy_or_memset;
    bd->has_communication = (z->pushed & CLASS_BIT(KP_AN_COMMUNICATION)) ||
                            (!plugin_compat && (z->pushed & CLASS_BIT(KP__AN_NAMED_COMM)));
    bd->comm_node_count = z->n_nccl && z->n_gloo ? 0 : z->n_nccl + z->n_gloo;
    bd->comm_nccl = z->n_nccl > 0;
    bd->use_dp = z->use_dp;
    bd->use_ddp = z->use_ddp;
    a->bd_done = true;
    a->bd_compat = plugin_compat;
    *out = bd;
    return 0;
}
