/* kp_an: the communication nodes (spec §9). */
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

int kp_an_comm_nodes(struct kp_an *a, struct kp_an_comm *out)
{
    struct comm_op *v = NULL;
    struct key_idx *ext = NULL;
    size_t n = 0, n_ext = 0, n_ranges = 0, s = 0;
    int rc = -ENOMEM;

    memset(out, 0, sizeof(*out));
    if (!a->steps) {
        return -EINVAL;
    }
    v = calloc(a->n_ops + 1, sizeof(*v));
    ext = calloc(a->n_ops + 1, sizeof(*ext));
    if (!v || !ext) {
        goto out;
    }
    for (size_t i = 0; i < a->n_ops; i++) {
        const struct an_op *o = &a->ops[i];
        const char *nam = nm(a, o->name);

        if (!an_is_comm_op(o, nam)) {
            continue;
        }
        out->nccl |= nam[0] == 'n';
        out->gloo |= nam[0] == 'g';
        if (o->ext) {
            ext[n_ext++] = (struct key_idx){ o->ext, (int32_t) i };
        }
        else { /* no external id (an NVTX range): a node of its own */
            v[n++] = (struct comm_op){ o->start, o->end, (int32_t) i };
        }
    }
    rc = 0;
    if (out->nccl && out->gloo) { /* the plugin empties the node list then */
        goto out;
    }
    /* One node per external id, the last op with it (the plugin's dict keeps the last). */
    qsort(ext, n_ext, sizeof(*ext), an_cmp_key_idx);
    for (size_t k = 0; k < n_ext; k++) {
        const struct an_op *o = &a->ops[ext[k].idx];

        if (k + 1 == n_ext || ext[k + 1].key != ext[k].key) {
            v[n++] = (struct comm_op){ o->start, o->end, ext[k].idx };
        }
    }
    qsort(v, n, sizeof(*v), cmp_comm_op);
    rc = -ENOMEM;
    out->nodes = calloc(n + 1, sizeof(*out->nodes));
    if (!out->nodes) {
        goto out;
    }
    n_ext = 0;
    for (size_t j = 0; j < n; j++) {
        const struct an_op *o = &a->ops[v[j].op];
        struct kp_an_comm_node *cn = &out->nodes[j];

        cn->name = nm(a, o->name);
        cn->input_shapes = o->shapes >= 0 ? nm(a, o->shapes) : NULL;
        cn->input_dtypes = o->dtypes >= 0 ? nm(a, o->dtypes) : NULL;
        cn->ext = o->ext;
        cn->start_ns = o->start;
        cn->end_ns = o->end;
        cn->step = -1;
        cn->n = 1; /* its own span */
        if (o->ext) {
            ext[n_ext++] = (struct key_idx){ o->ext, (int32_t) j };
        }
    }
    out->n_nodes = n;
    /* NCCL: the kernels of a node's external id are its intervals too. */
    qsort(ext, n_ext, sizeof(*ext), an_cmp_key_idx);
    for (size_t i = 0; out->nccl && i < a->n_devs; i++) {
        const struct key_idx *k;

        if (a->devs[i].kind == DEV_KERNEL &&
            (k = an_find_key(ext, n_ext, an_dev_ext(a, &a->devs[i]))) != NULL) {
            out->nodes[k->idx].n++;
        }
    }
    for (size_t j = 0; j < n; j++) {
        out->nodes[j].first = n_ranges;
        n_ranges += out->nodes[j].n;
        out->nodes[j].n = 1;
    }
    out->ranges = calloc(n_ranges + 1, sizeof(*out->ranges));
    if (!out->ranges) {
        goto out;
    }
    for (size_t j = 0; j < n; j++) {
        out->ranges[out->nodes[j].first] =
            (struct kp_range){ out->nodes[j].start_ns, out->nodes[j].end_ns };
    }
    for (size_t i = 0; out->nccl && i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        const struct key_idx *k;

        if (d->kind == DEV_KERNEL && (k = an_find_key(ext, n_ext, an_dev_ext(a, d))) != NULL) {
            struct kp_an_comm_node *cn = &out->nodes[k->idx];

            out->ranges[cn->first + cn->n++] = (struct kp_range){ d->start, d->end };
        }
    }
    for (size_t j = 0; j < n; j++) {
        qsort(out->ranges + out->nodes[j].first, out->nodes[j].n, sizeof(*out->ranges),
              cmp_range_start_end_desc);
    }
    /* Each node goes to the first step that contains it, walking both in time order; a node
     * that straddles a step end gets none, and after the last step none do. */
    for (size_t j = 0; j < n && s < a->bd.n_steps; j++) {
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
    rc = 0;
out:
    free(v);
    free(ext);
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
