/* kp_an: the model (spec §2-§3): device events linked to runtime calls and host nodes, the host
 * trees and their statistics, the steps. */
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

/* ---- the model ------------------------------------------------------------------------ */

int kp__an_cmp_key_idx(const void *pa, const void *pb)
{
    const struct key_idx *a = pa, *b = pb;

    if (a->key != b->key) {
        return a->key < b->key ? -1 : 1;
    }
    return (a->idx > b->idx) - (a->idx < b->idx);
}

const struct key_idx *kp__an_find_key(const struct key_idx *v, size_t n, int64_t key)
{
    size_t lo = 0, hi = n;

    while (lo < hi) { /* the first entry with this key */
        size_t mid = lo + (hi - lo) / 2;

        if (v[mid].key < key) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < n && v[lo].key == key ? &v[lo] : NULL;
}

int32_t kp__an_root_of(const struct kp_an *a, int64_t tid)
{
    size_t lo = 0, hi = a->n_roots;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (a->roots[mid].tid == tid) {
            return a->roots[mid].node;
        }
        if (a->roots[mid].tid < tid) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return -1;
}

static int32_t new_node(struct kp_an *a, int32_t op, int64_t start, int64_t end, uint8_t type)
{
    struct an_node *n = &a->nodes[a->n_nodes];

    memset(n, 0, sizeof(*n));
    n->op = op;
    n->start = start;
    n->end = end;
    n->type = type;
    n->parent = n->first_child = n->last_child = n->next_sib = -1;
    n->first_rt = n->last_rt = -1;
    return (int32_t) a->n_nodes++;
}

static void add_child(struct kp_an *a, int32_t parent, int32_t child)
{
    struct an_node *p = &a->nodes[parent];

    a->nodes[child].parent = parent;
    if (p->last_child >= 0) {
        a->nodes[p->last_child].next_sib = child;
    }
    else {
        p->first_child = child;
    }
    p->last_child = child;
    p->n_child++;
}

static void add_rt(struct kp_an *a, int32_t node, int32_t rt)
{
    struct an_node *n = &a->nodes[node];

    a->rts[rt].owner = node;
    a->rts[rt].next = -1;
    if (n->last_rt >= 0) {
        a->rts[n->last_rt].next = rt;
    }
    else {
        n->first_rt = rt;
    }
    n->last_rt = rt;
}

static int cmp_tid_root(const void *pa, const void *pb)
{
    const struct an_tid_root *a = pa, *b = pb;

    return (a->tid > b->tid) - (a->tid < b->tid);
}

/* The runtime's external id if the device event has none. */
int64_t kp__an_dev_ext(const struct kp_an *a, const struct an_dev *d)
{
    if (d->ext) {
        return d->ext;
    }
    return d->rt >= 0 ? a->rts[d->rt].ext : 0;
}

/* What kp__an_build_model's phases share: the scratch indexes and the main thread. */
struct model_build {
    size_t cap;          /* a->nodes and a->roots hold this many */
    int32_t *stack;      /* the open nodes of the thread being built */
    struct key_idx *ext; /* host nodes by external id, in tree order */
    size_t n_ext;
    struct key_idx *corr; /* runtime calls by correlation */
    int64_t main_tid;     /* the thread of the first ProfilerStep */
    bool has_main;
    uint8_t *elig; /* model_eligible's answers by name index */
};

/* 1. One tree per thread: ops come sorted by (tid, start, end descending). */
static void model_build_trees(struct kp_an *a, struct model_build *mb)
{
    size_t sp = 0;

    if (a->main_set) { /* a window: the whole rank's */
        mb->has_main = true;
        mb->main_tid = a->main_tid;
    }
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        int type = kp__an_host_type(a, o);
        int32_t node;

        if (type < 0) {
            continue;
        }
        if (o->kind == OPK_PROFILER_STEP && !mb->has_main) {
            mb->has_main = true;
            mb->main_tid = o->tid;
        }
        if (sp == 0 || a->roots[a->n_roots - 1].tid != o->tid) {
            int32_t root = new_node(a, -1, INT64_MIN, INT64_MAX, NODE_ROOT);

            a->roots[a->n_roots++] = (struct an_tid_root){ o->tid, root };
            mb->stack[0] = root;
            sp = 1;
        }
        for (;;) {
            const struct an_node *top = &a->nodes[mb->stack[sp - 1]];

            if (o->start < top->end) {
                if (o->end <= top->end) {
                    node = new_node(a, (int32_t) i, o->start, o->end, (uint8_t) type);
                    add_child(a, mb->stack[sp - 1], node);
                    mb->stack[sp++] = node;
                    if (o->ext) {
                        mb->ext[mb->n_ext++] = (struct key_idx){ o->ext, node };
                    }
                }
                break; /* a partial overlap is dropped (spec §2.4) */
            }
            sp--;
        }
    }
    /* Threads with runtime calls but no host node get a root too, and so does a window's main
     * thread (its stale kernels' dummy runtime hangs there) if it has neither here. */
    for (size_t i = 0; i <= a->n_rts; i++) {
        int64_t tid = i < a->n_rts ? a->rts[i].tid : mb->main_tid;
        bool found = false;

        if (i == a->n_rts && !a->main_set) {
            break;
        }
        for (size_t k = 0; k < a->n_roots && !found; k++) {
            found = a->roots[k].tid == tid;
        }
        if (!found && a->n_roots < mb->cap) {
            int32_t root = new_node(a, -1, INT64_MIN, INT64_MAX, NODE_ROOT);

            a->roots[a->n_roots++] = (struct an_tid_root){ tid, root };
        }
    }
    qsort(a->roots, a->n_roots, sizeof(*a->roots), cmp_tid_root);
}

/* 2. Runtime calls to host nodes by external id (the first node in tree order); fills the
 * correlation index. */
static void model_link_rts(struct kp_an *a, struct model_build *mb)
{
    qsort(mb->ext, mb->n_ext, sizeof(*mb->ext), kp__an_cmp_key_idx);
    for (size_t i = 0; i < a->n_rts; i++) {
        struct an_rt *t = &a->rts[i];
        const struct key_idx *k;

        t->owner = -1;
        t->first_dev = -1;
        t->next = -1;
        if (t->ext == 0) {
            add_rt(a, kp__an_root_of(a, t->tid), (int32_t) i);
        }
        else if ((k = kp__an_find_key(mb->ext, mb->n_ext, t->ext)) != NULL) {
            add_rt(a, k->idx, (int32_t) i);
        }
        mb->corr[i] = (struct key_idx){ t->corr, (int32_t) i };
    }
}

/* 3. Device events to runtime calls by correlation; stale kernels to a dummy runtime
 * under the main thread's root. */
static void model_link_devs(struct kp_an *a, struct model_build *mb)
{
    qsort(mb->corr, a->n_rts, sizeof(*mb->corr), kp__an_cmp_key_idx);
    for (size_t i = a->n_devs; i-- > 0;) {
        struct an_dev *d = &a->devs[i];
        const struct key_idx *k = d->corr ? kp__an_find_key(mb->corr, a->n_rts, d->corr) : NULL;
        int32_t rt;

        if (k) {
            rt = k->idx;
        }
        else if (d->kind == DEV_KERNEL && mb->has_main) {
            rt = (int32_t) a->n_rts;
            if (!a->rts[rt].dummy) {
                a->rts[rt].dummy = true;
                a->rts[rt].first_dev = -1;
                a->rts[rt].step = -1;
                a->rts[rt].tid = mb->main_tid;
                add_rt(a, kp__an_root_of(a, mb->main_tid), rt);
            }
        }
        else {
            continue;
        }
        d->rt = rt;
        d->next = a->rts[rt].first_dev; /* walking backwards keeps start order */
        a->rts[rt].first_dev = (int32_t) i;
        a->rts[rt].dev_ns += d->end - d->start;
        if (d->kind == DEV_KERNEL) {
            a->rts[rt].kern_ns += d->end - d->start;
        }
        if (kp__an_dev_tc(a, d)) {
            a->rts[rt].tc_ns += d->end - d->start;
        }
    }
}

/* 4. Duplicate merging (spec §2.5), parents before children. */
static void model_merge_dups(struct kp_an *a)
{
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct an_node *n = &a->nodes[i];

        if (n->dead || n->op < 0 || a->ops[n->op].kind != OPK_CPU_OP) {
            continue;
        }
        while (n->n_child == 1) {
            struct an_node *c = &a->nodes[n->first_child];

            if (c->op < 0 || a->ops[c->op].kind != OPK_CPU_OP ||
                a->ops[c->op].name != a->ops[n->op].name) {
                break;
            }
            for (int32_t r = n->first_rt; r >= 0; r = a->rts[r].next) {
                a->rts[r].owner = -1;
            }
            n->first_rt = c->first_rt;
            n->last_rt = c->last_rt;
            for (int32_t r = n->first_rt; r >= 0; r = a->rts[r].next) {
                a->rts[r].owner = (int32_t) i;
            }
            n->first_child = c->first_child;
            n->last_child = c->last_child;
            n->n_child = c->n_child;
            for (int32_t k = n->first_child; k >= 0; k = a->nodes[k].next_sib) {
                a->nodes[k].parent = (int32_t) i;
            }
            c->dead = true;
        }
    }
}

/* Whether ops of name index idx are eligible for Tensor Cores, worked out once a name (elig: 0
 * not yet, 1 no, 2 yes; a->names.n entries) rather than once a node: a list of strcmps. */
static bool model_eligible(const struct kp_an *a, uint8_t *elig, int32_t idx)
{
    if (idx < 0) {
        return kp__an_is_tc_eligible_op("");
    }
    if (elig[idx] == 0) {
        elig[idx] = kp__an_is_tc_eligible_op(kp__an_nm(a, idx)) ? 2 : 1;
    }
    return elig[idx] == 2;
}

/* 5. Bottom-up statistics (spec §2.6, §7): children have higher indexes. */
static void model_compute_stats(struct kp_an *a, uint8_t *elig)
{
    for (size_t i = a->n_nodes; i-- > 0;) {
        struct an_node *n = &a->nodes[i];
        bool host = n->op >= 0; /* roots have no host time */

        if (n->dead) {
            continue;
        }
        n->host_self = host ? n->end - n->start : 0;
        n->eligible = n->op >= 0 && model_eligible(a, elig, a->ops[n->op].name);
        for (int32_t r = n->first_rt; r >= 0; r = a->rts[r].next) {
            if (host) {
                n->host_self -= a->rts[r].end - a->rts[r].start;
            }
            n->dev_self += a->rts[r].dev_ns;
            n->tc_self += a->rts[r].tc_ns;
            n->kern_self += a->rts[r].kern_ns;
            if (a->rts[r].tc_ns > 0) {
                n->eligible = true;
            }
        }
        n->dev_total += n->dev_self;
        n->tc_total += n->tc_self;
        for (int32_t k = n->first_child; k >= 0; k = a->nodes[k].next_sib) {
            const struct an_node *c = &a->nodes[k];

            if (host) {
                n->host_self -= c->end - c->start;
            }
            n->dev_total += c->dev_total;
            n->tc_total += c->tc_total;
            if (c->eligible && n->op >= 0 && a->ops[n->op].kind == OPK_CPU_OP) {
                n->eligible = true;
            }
            if (c->eligible || c->eligible_below) {
                n->eligible_below = true;
            }
        }
    }
}

/* Builds the trees and the per-node statistics (spec §2). */
int kp__an_build_model(struct kp_an *a)
{
    struct model_build mb = { .cap = 2 * a->n_ops + a->n_rts + 2 }; /* and one root per thread */
    int rc = -ENOMEM;

    a->nodes = calloc(mb.cap, sizeof(*a->nodes));
    a->roots = calloc(mb.cap, sizeof(*a->roots));
    mb.stack = calloc(a->n_ops + 2, sizeof(*mb.stack));
    mb.ext = calloc(a->n_ops + 1, sizeof(*mb.ext));
    mb.corr = calloc(a->n_rts + 1, sizeof(*mb.corr));
    mb.elig = calloc(a->names.n + 1, 1);
    if (!a->nodes || !a->roots || !mb.stack || !mb.ext || !mb.corr || !mb.elig) {
        goto out;
    }
    model_build_trees(a, &mb);
    model_link_rts(a, &mb);
    model_link_devs(a, &mb);
    model_merge_dups(a);
    model_compute_stats(a, mb.elig);
    a->built = true;
    rc = 0;
out:
    free(mb.stack);
    free(mb.ext);
    free(mb.corr);
    free(mb.elig);
    return rc;
}

/* ---- steps (spec §3) ----------------------------------------------------------------- */

static int cmp_step(const void *pa, const void *pb)
{
    const struct kp_an_step *a = pa, *b = pb;

    return (a->start_ns > b->start_ns) - (a->start_ns < b->start_ns);
}

/* The steps' ranges into a->steps, by start: the ProfilerStep ops, else the steps the capture
 * recorded, else one step "0" over the CPU-side events. Returns how many. */
static size_t steps_collect(struct kp_an *a)
{
    size_t n = 0;

    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *s = kp__an_nm(a, o->name);

        if (o->kind != OPK_PROFILER_STEP) {
            continue;
        }
        snprintf(a->steps[n].name, sizeof(a->steps[n].name), "%s",
                 strncmp(s, "ProfilerStep#", 13) == 0 ? s + 13 : s);
        a->steps[n].start_ns = o->start;
        a->steps[n].end_ns = o->end;
        n++;
    }
    if (n == 0 && a->n_rec_steps > 0) {
        /* no ProfilerStep ranges: the steps the capture recorded (kprof_step reports) */
        memcpy(a->steps, a->rec_steps, a->n_rec_steps * sizeof(*a->steps));
        n = a->n_rec_steps;
    }
    if (n == 0) { /* one step "0" over the CPU-side events */
        int64_t lo = INT64_MAX, hi = INT64_MIN;

        for (size_t i = 0; i < a->n_ops; i++) {
            if (a->ops[i].kind != OPK_CPU_OP) {
                continue;
            }
            lo = a->ops[i].start < lo ? a->ops[i].start : lo;
            hi = a->ops[i].end > hi ? a->ops[i].end : hi;
        }
        if (lo <= hi) {
            snprintf(a->steps[0].name, sizeof(a->steps[0].name), "0");
            a->steps[0].start_ns = lo;
            a->steps[0].end_ns = hi;
            n = 1;
        }
    }
    qsort(a->steps, n, sizeof(*a->steps), cmp_step);
    return n;
}

/* A runtime call belongs to the last step starting at or before it, if inside it. */
static void steps_assign_rts(struct kp_an *a, size_t n)
{
    for (size_t i = 0; i <= a->n_rts; i++) {
        struct an_rt *t = &a->rts[i];
        size_t lo = 0, hi = n;

        t->step = -1;
        if (i == a->n_rts || t->dummy) {
            continue;
        }
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;

            if (a->steps[mid].start_ns <= t->start) {
                lo = mid + 1;
            }
            else {
                hi = mid;
            }
        }
        if (lo > 0 && t->end <= a->steps[lo - 1].end_ns) {
            t->step = (int32_t) (lo - 1);
        }
    }
}

/* Each step's device span and count into sd; false if no device event was launched in one. */
static bool steps_count_devs(const struct kp_an *a, struct kp__an_step_dev *sd)
{
    bool launched = false;

    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int32_t s = d->rt >= 0 ? a->rts[d->rt].step : -1;

        if (s < 0) {
            continue;
        }
        sd[s].count++;
        sd[s].min_start = d->start < sd[s].min_start ? d->start : sd[s].min_start;
        sd[s].max_end = d->end > sd[s].max_end ? d->end : sd[s].max_end;
        launched = true;
    }
    return launched;
}

void kp__an_step_fit(struct kp_an_step *st, const struct kp__an_step_dev *sd, int64_t prev_end)
{
    int64_t start = prev_end > st->start_ns ? prev_end : st->start_ns;
    int64_t end;

    if (sd->count > 0) {
        end = st->end_ns > sd->max_end ? st->end_ns : sd->max_end;
    }
    else {
        end = st->end_ns > start ? st->end_ns : start;
    }
    if (end < start) {
        end = start;
    }
    st->start_ns = start;
    st->end_ns = end;
}

size_t kp__an_steps_trim(const struct kp__an_step_dev *sd, size_t n)
{
    size_t last = n - 1;

    if (n <= 1) {
        return n;
    }
    while (sd[last].count == 0) {
        last--;
    }
    n = last + 1;
    if (last > 0 && (double) sd[last].count < 0.8 * (double) sd[last - 1].count) {
        n = last;
    }
    return n;
}

/* The steps stretched over their device events, back to back, and the tail trimmed.
 * Returns how many steps are left. */
static size_t steps_fit_devs(struct kp_an *a, const struct kp__an_step_dev *sd, size_t n)
{
    int64_t prev_end = a->steps[0].start_ns;

    if (sd[0].count > 0) {
        for (size_t i = 0; i < a->n_devs; i++) {
            const struct an_dev *d = &a->devs[i];

            if (d->rt >= 0 && a->rts[d->rt].step >= 0) {
                continue;
            }
            if (d->end < sd[0].min_start && d->end > prev_end) {
                prev_end = d->end;
            }
        }
    }
    for (size_t s = 0; s < n; s++) {
        kp__an_step_fit(&a->steps[s], &sd[s], prev_end);
        prev_end = a->steps[s].end_ns;
    }
    return kp__an_steps_trim(sd, n);
}

int kp__an_build_steps(struct kp_an *a)
{
    size_t n;
    struct kp__an_step_dev *sd = NULL;
    size_t cap = a->n_rec_steps;
    size_t n_prof = 0;

    /* sized for the steps there are (the ProfilerStep ops, else the recorded steps, else one),
     * not for "every op is a step" */
    for (size_t i = 0; i < a->n_ops; i++) {
        n_prof += a->ops[i].kind == OPK_PROFILER_STEP;
    }
    cap = n_prof > cap ? n_prof : cap;
    free(a->steps);
    a->steps = calloc(cap + 1, sizeof(*a->steps));
    if (!a->steps) {
        return -ENOMEM;
    }
    n = steps_collect(a);
    sd = calloc(n + 1, sizeof(*sd));
    if (!sd) {
        return -ENOMEM;
    }
    for (size_t s = 0; s < n; s++) {
        sd[s].min_start = INT64_MAX;
        sd[s].max_end = INT64_MIN;
    }
    steps_assign_rts(a, n);
    if (steps_count_devs(a, sd)) {
        n = steps_fit_devs(a, sd, n);
    }
    free(sd);
    a->bd.n_steps = n;
    a->bd.steps = a->steps;
    return 0;
}
