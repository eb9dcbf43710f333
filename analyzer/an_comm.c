/* kp_an: the communication nodes (spec §9). */
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

/* ---- communication nodes (spec §9) --------------------------------------------------- */

struct comm_op {
    int64_t start, end;
    int32_t op;
};

static int cmp_comm_op(const void *pa, const void *pb)
{
    const struct comm_op *x = pa, *y = pb;

    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    if (x->end != y->end) {
        return x->end > y->end ? -1 : 1;
    }
    return (x->op > y->op) - (x->op < y->op);
}

static int cmp_range_start_end_desc(const void *pa, const void *pb)
{
    const struct kp_range *x = pa, *y = pb;

    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    return (x->end < y->end) - (x->end > y->end);
}

/* What kp_an_comm_nodes' phases share. */
struct comm_work {
    struct comm_op *v; /* the nodes' ops, by start */
    size_t n;
    struct key_idx *ext; /* ops, then nodes, by external id */
    size_t n_ext;
};

/* The communication ops: those without an external id as nodes, the others into w->ext. */
static void comm_collect_ops(const struct kp_an *a, struct comm_work *w, struct kp_an_comm *out)
{
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *nam = kp__an_nm(a, o->name);

        if (!kp__an_is_comm_op(o, nam)) {
            continue;
        }
        out->nccl |= nam[0] == 'n';
        out->gloo |= nam[0] == 'g';
        if (o->ext) {
            w->ext[w->n_ext++] = (struct key_idx){ o->ext, (int32_t) i };
        }
        else { /* no external id (an NVTX range): a node of its own */
            w->v[w->n++] = (struct comm_op){ o->start, o->end, (int32_t) i };
        }
    }
}

/* One node per external id, the last op with it (the plugin's dict keeps the last); then the
 * nodes by start. */
static void comm_pick_nodes(const struct kp_an *a, struct comm_work *w)
{
    qsort(w->ext, w->n_ext, sizeof(*w->ext), kp__an_cmp_key_idx);
    for (size_t k = 0; k < w->n_ext; k++) {
        const struct an_op *o = &a->ops[w->ext[k].idx];

        if (k + 1 == w->n_ext || w->ext[k + 1].key != w->ext[k].key) {
            w->v[w->n++] = (struct comm_op){ o->start, o->end, w->ext[k].idx };
        }
    }
    qsort(w->v, w->n, sizeof(*w->v), cmp_comm_op);
}

/* out's nodes from w->v; w->ext becomes the nodes by external id. */
static void comm_fill_nodes(const struct kp_an *a, struct comm_work *w, struct kp_an_comm *out)
{
    w->n_ext = 0;
    for (size_t j = 0; j < w->n; j++) {
        const struct an_op *o = &a->ops[w->v[j].op];
        struct kp_an_comm_node *cn = &out->nodes[j];

        cn->name = kp__an_nm(a, o->name);
        cn->input_shapes = o->shapes >= 0 ? kp__an_nm(a, o->shapes) : NULL;
        cn->input_dtypes = o->dtypes >= 0 ? kp__an_nm(a, o->dtypes) : NULL;
        cn->ext = o->ext;
        cn->start_ns = o->start;
        cn->end_ns = o->end;
        cn->step = -1;
        cn->n = 1; /* its own span */
        if (o->ext) {
            w->ext[w->n_ext++] = (struct key_idx){ o->ext, (int32_t) j };
        }
    }
    out->n_nodes = w->n;
    qsort(w->ext, w->n_ext, sizeof(*w->ext), kp__an_cmp_key_idx);
}

/* Each node's intervals: its own span and, for NCCL, the kernels of its external id;
 * -ENOMEM. */
static int comm_fill_ranges(const struct kp_an *a, const struct comm_work *w,
                            struct kp_an_comm *out)
{
    size_t n_ranges = 0;

    for (size_t i = 0; out->nccl && i < a->n_devs; i++) {
        const struct key_idx *k;

        if (a->devs[i].kind == DEV_KERNEL &&
            (k = kp__an_find_key(w->ext, w->n_ext, kp__an_dev_ext(a, &a->devs[i]))) != NULL) {
            out->nodes[k->idx].n++;
        }
    }
    for (size_t j = 0; j < w->n; j++) {
        out->nodes[j].first = n_ranges;
        n_ranges += out->nodes[j].n;
        out->nodes[j].n = 1;
    }
    out->ranges = calloc(n_ranges + 1, sizeof(*out->ranges));
    if (!out->ranges) {
        return -ENOMEM;
    }
    for (size_t j = 0; j < w->n; j++) {
        out->ranges[out->nodes[j].first] =
            (struct kp_range){ out->nodes[j].start_ns, out->nodes[j].end_ns };
    }
    for (size_t i = 0; out->nccl && i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        const struct key_idx *k;

        if (d->kind == DEV_KERNEL &&
            (k = kp__an_find_key(w->ext, w->n_ext, kp__an_dev_ext(a, d))) != NULL) {
            struct kp_an_comm_node *cn = &out->nodes[k->idx];

            out->ranges[cn->first + cn->n++] = (struct kp_range){ d->start, d->end };
        }
    }
    for (size_t j = 0; j < w->n; j++) {
        qsort(out->ranges + out->nodes[j].first, out->nodes[j].n, sizeof(*out->ranges),
              cmp_range_start_end_desc);
    }
    return 0;
}

/* Each node goes to the first step that contains it, walking both in time order; a node
 * that straddles a step end gets none, and after the last step none do. */
static void comm_assign_steps(const struct kp_an *a, struct kp_an_comm *out)
{
    size_t s = 0;

    for (size_t j = 0; j < out->n_nodes && s < a->bd.n_steps; j++) {
        struct kp_an_comm_node *cn = &out->nodes[j];

        while (s < a->bd.n_steps) {
            if (cn->start_ns >= a->steps[s].start_ns && cn->end_ns <= a->steps[s].end_ns) {
                cn->step = (int32_t) s;
                break;
            }
            if (cn->start_ns < a->steps[s].end_ns) {
                break;
            }
            s++;
        }
    }
}

int kp_an_comm_nodes(struct kp_an *a, struct kp_an_comm *out)
{
    struct comm_work w = { 0 };
    int rc = -ENOMEM;

    memset(out, 0, sizeof(*out));
    if (!a->steps) {
        return -EINVAL;
    }
    w.v = calloc(a->n_ops + 1, sizeof(*w.v));
    w.ext = calloc(a->n_ops + 1, sizeof(*w.ext));
    if (!w.v || !w.ext) {
        goto out;
    }
    comm_collect_ops(a, &w, out);
    rc = 0;
    if (out->nccl && out->gloo) { /* the plugin empties the node list then */
        goto out;
    }
    comm_pick_nodes(a, &w);
    rc = -ENOMEM;
    out->nodes = calloc(w.n + 1, sizeof(*out->nodes));
    if (!out->nodes) {
        goto out;
    }
    comm_fill_nodes(a, &w, out);
    if ((rc = comm_fill_ranges(a, &w, out)) < 0) {
        goto out;
    }
    comm_assign_steps(a, out);
    rc = 0;
out:
    free(w.v);
    free(w.ext);
    if (rc < 0) {
        kp_an_comm_fini(out);
    }
    return rc;
}

void kp_an_comm_fini(struct kp_an_comm *c)
{
    free(c->nodes);
    free(c->ranges);
    c->nodes = NULL;
    c->ranges = NULL;
    c->n_nodes = 0;
}
