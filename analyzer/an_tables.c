/* kp_an: the operator view (spec §5), the kernel view (spec §6) and the Tensor Core statistics
 * (spec §7). */
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

/* ---- operator view (spec §5) ---------------------------------------------------------- */

struct op_sort {
    const struct kp_an *a;
    bool by_shape;
};

/* An op's input shapes as the operator view keys and shows them: "[]" when none were recorded,
 * so that every op of a name without shapes falls into one group, as the plugin's do. */
static const char *op_shapes(const struct kp_an *a, const struct an_op *o)
{
    return o->shapes >= 0 ? kp__an_nm(a, o->shapes) : "[]";
}

static int cmp_op_nodes(const void *pa, const void *pb, void *ctx)
{
    const struct kp_an *sort_an = ((const struct op_sort *) ctx)->a;
    bool sort_by_shape = ((const struct op_sort *) ctx)->by_shape;
    const struct an_node *x = &sort_an->nodes[*(const int32_t *) pa];
    const struct an_node *y = &sort_an->nodes[*(const int32_t *) pb];
    const struct an_op *ox = &sort_an->ops[x->op], *oy = &sort_an->ops[y->op];
    int c = strcmp(kp__an_nm(sort_an, ox->name), kp__an_nm(sort_an, oy->name));

    if (c == 0 && sort_by_shape) {
        c = strcmp(op_shapes(sort_an, ox), op_shapes(sort_an, oy));
    }
    if (c == 0) {
        c = (*(const int32_t *) pa > *(const int32_t *) pb) -
            (*(const int32_t *) pa < *(const int32_t *) pb);
    }
    return c;
}

static int cmp_op_rows(const void *pa, const void *pb, void *ctx)
{
    bool sort_by_device = *(const bool *) ctx;
    const struct kp_an_op_row *x = pa, *y = pb;
    int64_t vx = sort_by_device ? x->device_self_ns : x->host_self_ns;
    int64_t vy = sort_by_device ? y->device_self_ns : y->host_self_ns;
    int c;

    if (vx != vy) {
        return vx > vy ? -1 : 1;
    }
    c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->input_shape, y->input_shape);
}

int kp_an_ops(struct kp_an *a, bool by_shape, const struct kp_an_table **out)
{
    struct kp_an_table *t = &a->ops_tab[by_shape];
    struct kp_an_op_row *rows;
    int32_t *idx;
    size_t n = 0, nr = 0;
    bool by_device;
    int rc;

    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    idx = calloc(a->n_nodes + 1, sizeof(*idx));
    rows = calloc(a->n_nodes + 1, sizeof(*rows));
    if (!idx || !rows) {
        free(idx);
        free(rows);
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        if (!a->nodes[i].dead && a->nodes[i].type == NODE_OPERATOR) {
            idx[n++] = (int32_t) i;
        }
    }
    /* groups keep tree order inside */
    qsort_r(idx, n, sizeof(*idx), cmp_op_nodes, &(struct op_sort){ a, by_shape });
    for (size_t i = 0; i < n; i++) {
        const struct an_node *x = &a->nodes[idx[i]];
        const struct an_op *o = &a->ops[x->op];
        struct kp_an_op_row *r = nr ? &rows[nr - 1] : NULL;

        if (!r || strcmp(r->name, kp__an_nm(a, o->name)) != 0 ||
            (by_shape && strcmp(r->input_shape, op_shapes(a, o)) != 0)) {
            r = &rows[nr++];
            r->name = kp__an_nm(a, o->name);
            r->input_shape = op_shapes(a, o);
        }
        r->calls++;
        r->host_total_ns += x->end - x->start;
        r->host_self_ns += x->host_self;
        r->device_total_ns += x->dev_total;
        r->device_self_ns += x->dev_self;
        r->tc_self_ns += x->tc_self;
        r->tc_total_ns += x->tc_total;
        r->tc_eligible = r->tc_eligible || x->eligible;
    }
    free(idx);
    by_device = a->n_devs > 0;
    qsort_r(rows, nr, sizeof(*rows), cmp_op_rows, &by_device);
    free(t->rows);
    t->rows = rows;
    t->n = nr;
    *out = t;
    return 0;
}

/* ---- kernel view (spec §6) ------------------------------------------------------------ */

static void fmt_dim(char *buf, size_t len, bool has, const int32_t *v)
{
    if (has) {
        snprintf(buf, len, "[%d, %d, %d]", v[0], v[1], v[2]);
    }
    else {
        snprintf(buf, len, "None");
    }
}

static int cmp_kernel_rows_key(const void *pa, const void *pb)
{
    const struct kp_an_kernel_row *x = pa, *y = pb;
    int c = strcmp(x->name, y->name);

    if (c == 0) {
        c = strcmp(x->op_name, y->op_name);
    }
    if (c == 0) {
        c = strcmp(x->grid, y->grid);
    }
    if (c == 0) {
        c = strcmp(x->block, y->block);
    }
    if (c == 0 && x->registers != y->registers) {
        c = x->registers < y->registers ? -1 : 1;
    }
    if (c == 0 && x->shared_memory != y->shared_memory) {
        c = x->shared_memory < y->shared_memory ? -1 : 1;
    }
    return c;
}

static int cmp_kernel_rows_total(const void *pa, const void *pb)
{
    const struct kp_an_kernel_row *x = pa, *y = pb;

    if (x->total_ns != y->total_ns) {
        return x->total_ns > y->total_ns ? -1 : 1;
    }
    return cmp_kernel_rows_key(pa, pb);
}

int kp_an_kernels(struct kp_an *a, bool by_op, const struct kp_an_table **out)
{
    struct kp_an_table *t = &a->kern_tab[by_op];
    struct kp_an_kernel_row *rows;
    size_t n = 0, nr = 0;
    int rc;

    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    rows = calloc(a->n_kernels + 1, sizeof(*rows));
    if (!rows) {
        return -ENOMEM;
    }
    /* One row per kernel, then sorted by key and folded. */
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        struct kp_an_kernel_row *r = &rows[n];

        if (d->kind != DEV_KERNEL) {
            continue;
        }
        r->name = kp__an_nm(a, d->name);
        r->op_name = "";
        if (by_op) {
            int32_t owner = d->rt >= 0 ? a->rts[d->rt].owner : -1;
            const struct an_node *node;

            if (owner < 0) {
                continue; /* not reached through the tree */
            }
            node = &a->nodes[owner];
            r->op_name = node->op >= 0 ? kp__an_nm(a, a->ops[node->op].name) : "CallTreeRoot";
            r->op_tc_eligible = node->eligible;
            fmt_dim(r->grid, sizeof(r->grid), d->has_grid, d->grid);
            fmt_dim(r->block, sizeof(r->block), d->has_block, d->block);
            r->registers = d->regs;
            r->shared_memory = d->smem;
        }
        r->calls = 1;
        r->total_ns = r->min_ns = r->max_ns = d->end - d->start;
        /* duration-weighted means; a kernel without the figure counts as 0 (spec §6) */
        r->wsum_blocks_per_sm = isnan(d->bps) ? 0.0 : d->bps * (double) r->total_ns;
        r->wsum_occupancy = isnan(d->occ) ? 0.0 : d->occ * (double) r->total_ns;
        n++;
    }
    qsort(rows, n, sizeof(*rows), cmp_kernel_rows_key);
    for (size_t i = 0; i < n; i++) {
        if (nr > 0 && cmp_kernel_rows_key(&rows[nr - 1], &rows[i]) == 0) {
            struct kp_an_kernel_row *r = &rows[nr - 1];

            r->calls++;
            r->total_ns += rows[i].total_ns;
            r->min_ns = rows[i].min_ns < r->min_ns ? rows[i].min_ns : r->min_ns;
            r->max_ns = rows[i].max_ns > r->max_ns ? rows[i].max_ns : r->max_ns;
            r->wsum_blocks_per_sm += rows[i].wsum_blocks_per_sm;
            r->wsum_occupancy += rows[i].wsum_occupancy;
        }
        else {
            rows[nr++] = rows[i];
        }
    }
    for (size_t i = 0; i < nr; i++) {
        rows[i].tc_used = kp_an_is_tc_kernel(rows[i].name);
        rows[i].mean_blocks_per_sm =
            rows[i].total_ns ? rows[i].wsum_blocks_per_sm / (double) rows[i].total_ns : 0.0;
        rows[i].mean_est_achieved_occupancy =
            rows[i].total_ns ? rows[i].wsum_occupancy / (double) rows[i].total_ns : 0.0;
    }
    qsort(rows, nr, sizeof(*rows), cmp_kernel_rows_total);
    free(t->rows);
    t->rows = rows;
    t->n = nr;
    *out = t;
    return 0;
}

/* ---- Tensor Core statistics (spec §7) ------------------------------------------------- */

int kp_an_tensor_cores(struct kp_an *a, struct kp_an_tc *out)
{
    int64_t kern[KP_AN_MAX_GPUS] = { 0 }, tc[KP_AN_MAX_GPUS] = { 0 }, bottom = 0, all = 0;
    bool seen[KP_AN_MAX_GPUS] = { false }, any = false;
    int rc;

    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        int32_t owner;

        if (d->kind != DEV_KERNEL || d->device < 0 || d->device >= KP_AN_MAX_GPUS) {
            continue;
        }
        seen[d->device] = true;
        owner = d->rt >= 0 ? a->rts[d->rt].owner : -1;
        if (owner < 0 || a->nodes[owner].type != NODE_OPERATOR) {
            continue; /* only kernels launched by operators */
        }
        any = true;
        kern[d->device] += d->end - d->start;
        if (kp__an_dev_tc(a, d)) {
            tc[d->device] += d->end - d->start;
        }
    }
    for (int g = 0; g < KP_AN_MAX_GPUS; g++) {
        if (!seen[g]) {
            continue;
        }
        out->gpu_ids[out->n_gpus] = g;
        out->tc_ratio[out->n_gpus] = kern[g] ? (double) tc[g] / (double) kern[g] : 0.0;
        out->n_gpus++;
    }
    out->tc_ratio_defined = any;
    for (size_t i = 0; i < a->n_nodes; i++) {
        const struct an_node *n = &a->nodes[i];

        if (n->dead || n->type != NODE_OPERATOR) {
            continue;
        }
        all += n->kern_self;
        if (n->eligible && !n->eligible_below) {
            bottom += n->kern_self;
        }
    }
    out->eligible_ops_kernel_ratio = all ? (double) bottom / (double) all : 0.0;
    return 0;
}
