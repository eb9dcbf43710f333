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

/* An op's input shapes as the operator view keys and shows them: "[]" when none were recorded,
 * so that every op of a name without shapes falls into one group, as the plugin's do. */
static const char *op_shapes(const struct kp_an *a, const struct an_op *o)
{
    return o->shapes >= 0 ? kp__an_nm(a, o->shapes) : "[]";
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

/*
 * Grouping the kernels (kp_an_kernels) and the ops (kp_an_ops). A group's key is its strings
 * (name, op name or the ops' input shapes, grid, block) and two numbers: strings are compared by
 * content, but each distinct pointer (names come from the rank's dictionary, op names too, or are
 * literals) is hashed once and given the id of its content, so that a kernel costs a lookup by
 * pointer, not a sort's strcmps. Kernels fold into their group in device order, as the stable sort
 * this replaces folded them (the duration-weighted sums are the same doubles).
 */
struct str_id {
    const char *s; /* NULL: free slot */
    int32_t id;
};

struct kern_group {
    int32_t name, op;          /* ids of the strings */
    int32_t grid[3], block[3]; /* by op only */
    bool has_grid, has_block;  /* by op only */
    int64_t registers, smem;   /* by op only */
    int32_t row;               /* its row; -1: free slot */
};

struct kern_groups {
    struct str_id *by_ptr, *by_text; /* open addressing over powers of two */
    size_t cap_ptr, n_ptr, cap_text, n_text;
    struct kern_group *g;
    size_t cap_g, n_g;
};

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* Doubles a table of str_id, rehashing by text (by_text) or by pointer. */
static int str_grow(struct str_id **t, size_t *cap, bool by_text)
{
    size_t nc = *cap ? 2 * *cap : 256;
    struct str_id *g = calloc(nc, sizeof(*g));

    if (!g) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < *cap; i++) {
        if ((*t)[i].s) {
            uint64_t h = by_text ? kp_an_str_hash((*t)[i].s) : mix64((uintptr_t) (*t)[i].s);
            size_t k = h & (nc - 1);

            while (g[k].s) {
                k = (k + 1) & (nc - 1);
            }
            g[k] = (*t)[i];
        }
    }
    free(*t);
    *t = g;
    *cap = nc;
    return 0;
}

/* The id of string s's content; -1 without memory. */
static int32_t str_id(struct kern_groups *kg, const char *s)
{
    size_t k, kt;

    if (2 * (kg->n_ptr + 1) > kg->cap_ptr && str_grow(&kg->by_ptr, &kg->cap_ptr, false) < 0) {
        return -1;
    }
    for (k = mix64((uintptr_t) s) & (kg->cap_ptr - 1); kg->by_ptr[k].s;
         k = (k + 1) & (kg->cap_ptr - 1)) {
        if (kg->by_ptr[k].s == s) {
            return kg->by_ptr[k].id;
        }
    }
    /* a pointer seen for the first time: its content's id */
    if (2 * (kg->n_text + 1) > kg->cap_text && str_grow(&kg->by_text, &kg->cap_text, true) < 0) {
        return -1;
    }
    for (kt = kp_an_str_hash(s) & (kg->cap_text - 1); kg->by_text[kt].s;
         kt = (kt + 1) & (kg->cap_text - 1)) {
        if (strcmp(kg->by_text[kt].s, s) == 0) {
            break;
        }
    }
    if (!kg->by_text[kt].s) {
        kg->by_text[kt] = (struct str_id){ s, (int32_t) kg->n_text++ };
    }
    /* the pointer table may have grown above; its slot k is still free */
    kg->by_ptr[k] = (struct str_id){ s, kg->by_text[kt].id };
    kg->n_ptr++;
    return kg->by_text[kt].id;
}

static bool group_eq(const struct kern_group *x, const struct kern_group *y)
{
    return x->name == y->name && x->op == y->op && x->has_grid == y->has_grid &&
           x->has_block == y->has_block && x->registers == y->registers && x->smem == y->smem &&
           (!x->has_grid || memcmp(x->grid, y->grid, sizeof(x->grid)) == 0) &&
           (!x->has_block || memcmp(x->block, y->block, sizeof(x->block)) == 0);
}

static uint64_t group_hash(const struct kern_group *x)
{
    uint64_t h = mix64(((uint64_t) (uint32_t) x->name << 32) | (uint32_t) x->op);

    h = mix64(h ^ ((uint64_t) x->registers * 31 + (uint64_t) x->smem));
    for (int i = 0; x->has_grid && i < 3; i++) {
        h = mix64(h ^ (uint64_t) (uint32_t) x->grid[i] ^ ((uint64_t) i << 40));
    }
    for (int i = 0; x->has_block && i < 3; i++) {
        h = mix64(h ^ (uint64_t) (uint32_t) x->block[i] ^ ((uint64_t) (i + 3) << 40));
    }
    return h;
}

/* The slot of key x in kg->g (x->row -1 when new); NULL without memory. */
static struct kern_group *group_slot(struct kern_groups *kg, const struct kern_group *x)
{
    size_t k;

    if (2 * (kg->n_g + 1) > kg->cap_g) {
        size_t nc = kg->cap_g ? 2 * kg->cap_g : 256;
        struct kern_group *g = malloc(nc * sizeof(*g));

        if (!g) {
            return NULL;
        }
        for (size_t i = 0; i < nc; i++) {
            g[i].row = -1;
        }
        for (size_t i = 0; i < kg->cap_g; i++) {
            if (kg->g[i].row >= 0) {
                for (k = group_hash(&kg->g[i]) & (nc - 1); g[k].row >= 0; k = (k + 1) & (nc - 1)) {
                }
                g[k] = kg->g[i];
            }
        }
        free(kg->g);
        kg->g = g;
        kg->cap_g = nc;
    }
    for (k = group_hash(x) & (kg->cap_g - 1); kg->g[k].row >= 0; k = (k + 1) & (kg->cap_g - 1)) {
        if (group_eq(&kg->g[k], x)) {
            return &kg->g[k];
        }
    }
    kg->g[k] = *x;
    kg->g[k].row = -1;
    return &kg->g[k];
}

static void kern_groups_fini(struct kern_groups *kg)
{
    free(kg->by_ptr);
    free(kg->by_text);
    free(kg->g);
}

/* The index of group g's row (g from group_slot) in *rows (*nr rows of size bytes, room for
 * *cap): a new row of zeros at the end when g has none yet. -1 without memory. */
static int32_t group_row(struct kern_groups *kg, struct kern_group *g, void **rows, size_t *nr,
                         size_t *cap, size_t size)
{
    if (g->row >= 0) {
        return g->row;
    }
    if (*nr == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        void *grown = realloc(*rows, nc * size);

        if (!grown) {
            return -1;
        }
        *rows = grown;
        *cap = nc;
    }
    memset((char *) *rows + *nr * size, 0, size);
    g->row = (int32_t) (*nr)++;
    kg->n_g++;
    return g->row;
}

/* Makes rows[0..nr) (rows of size bytes, owned) table t's rows, in place of the ones it had, and
 * *out t. An empty table is still an array. 0 or -ENOMEM (rows then freed). */
static int table_take(struct kp_an_table *t, void *rows, size_t nr, size_t size,
                      const struct kp_an_table **out)
{
    if (nr == 0) {
        free(rows);
        if (!(rows = calloc(1, size))) {
            return -ENOMEM;
        }
    }
    free(t->rows);
    t->rows = rows;
    t->n = nr;
    *out = t;
    return 0;
}

/* The operator view: one row per name (by_shape: name and input shapes), folded in tree
 * order, so that a row by name shows the shapes of its first op, as the stable sort by name
 * this replaces did; the groups are kp_an_kernels', keyed by the name's and the shapes' ids. */
int kp_an_ops(struct kp_an *a, bool by_shape, const struct kp_an_table **out)
{
    struct kp_an_table *t = &a->ops_tab[by_shape];
    struct kp_an_op_row *rows = NULL;
    struct kern_groups kg = { 0 };
    size_t nr = 0, cap = 0;
    bool by_device;
    int rc;

    if (a->windowed) { /* summed over the windows (an_window.c) */
        *out = t;
        return a->tables_done ? 0 : -EINVAL;
    }
    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        const struct an_node *x = &a->nodes[i];
        struct kern_group key = { 0 }, *g;
        const struct an_op *o;
        struct kp_an_op_row *r;
        int32_t ri;

        if (x->dead || x->type != NODE_OPERATOR) {
            continue;
        }
        o = &a->ops[x->op];
        key.op = -2; /* by name only */
        if ((key.name = str_id(&kg, kp__an_nm(a, o->name))) < 0 ||
            (by_shape && (key.op = str_id(&kg, op_shapes(a, o))) < 0) ||
            !(g = group_slot(&kg, &key)) ||
            (ri = group_row(&kg, g, (void **) &rows, &nr, &cap, sizeof(*rows))) < 0) {
            kern_groups_fini(&kg);
            free(rows);
            return -ENOMEM;
        }
        r = &rows[ri];
        if (r->calls == 0) { /* the group's first op */
            r->name = kp__an_nm(a, o->name);
            r->input_shape = op_shapes(a, o);
            r->first_tid = o->tid;
            r->first_start = o->start;
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
    kern_groups_fini(&kg);
    by_device = a->n_devs > 0;
    kp__an_sort_op_rows(rows, nr, by_device);
    return table_take(t, rows, nr, sizeof(*rows), out);
}

void kp__an_sort_op_rows(struct kp_an_op_row *rows, size_t n, bool by_device)
{
    if (n > 0) {
        qsort_r(rows, n, sizeof(*rows), cmp_op_rows, &by_device);
    }
}

void kp__an_finish_kernel_rows(struct kp_an_kernel_row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rows[i].tc_used = kp_an_is_tc_kernel(rows[i].name);
        rows[i].mean_blocks_per_sm =
            rows[i].total_ns ? rows[i].wsum_blocks_per_sm / (double) rows[i].total_ns : 0.0;
        rows[i].mean_est_achieved_occupancy =
            rows[i].total_ns ? rows[i].wsum_occupancy / (double) rows[i].total_ns : 0.0;
    }
    if (n > 0) {
        qsort(rows, n, sizeof(*rows), cmp_kernel_rows_total);
    }
}

int kp_an_kernels(struct kp_an *a, bool by_op, const struct kp_an_table **out)
{
    struct kp_an_table *t = &a->kern_tab[by_op];
    struct kp_an_kernel_row *rows = NULL;
    struct kern_groups kg = { 0 };
    size_t nr = 0, cap = 0;
    int rc;

    if (a->windowed) {
        *out = t;
        return a->tables_done ? 0 : -EINVAL;
    }
    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    /* One group per key, in device order. */
    for (size_t i = 0; i < a->n_devs; i++) {
        const struct an_dev *d = &a->devs[i];
        struct kern_group key = { 0 }, *g;
        struct kp_an_kernel_row *r;
        const char *name, *op_name = "";
        int64_t dur = d->end - d->start;
        double bps, occ;
        int32_t ri;

        if (d->kind != DEV_KERNEL) {
            continue;
        }
        name = kp__an_nm(a, d->name);
        if (by_op) {
            int32_t owner = d->rt >= 0 ? a->rts[d->rt].owner : -1;
            const struct an_node *node;

            if (owner < 0) {
                continue; /* not reached through the tree */
            }
            node = &a->nodes[owner];
            op_name = node->op >= 0 ? kp__an_nm(a, a->ops[node->op].name) : "CallTreeRoot";
            key.has_grid = d->has_grid;
            key.has_block = d->has_block;
            if (d->has_grid) {
                memcpy(key.grid, d->grid, sizeof(key.grid));
            }
            if (d->has_block) {
                memcpy(key.block, d->block, sizeof(key.block));
            }
            key.registers = d->regs;
            key.smem = d->smem;
        }
        if ((key.name = str_id(&kg, name)) < 0 || (key.op = str_id(&kg, op_name)) < 0 ||
            !(g = group_slot(&kg, &key)) ||
            (ri = group_row(&kg, g, (void **) &rows, &nr, &cap, sizeof(*rows))) < 0) {
            goto nomem;
        }
        r = &rows[ri];
        if (r->calls == 0) { /* the group's first kernel */
            r->name = name;
            r->op_name = op_name;
            if (by_op) {
                r->op_tc_eligible = a->nodes[a->rts[d->rt].owner].eligible;
                fmt_dim(r->grid, sizeof(r->grid), d->has_grid, d->grid);
                fmt_dim(r->block, sizeof(r->block), d->has_block, d->block);
                r->registers = d->regs;
                r->shared_memory = d->smem;
            }
            r->min_ns = r->max_ns = dur;
            r->first_start = d->start;
            r->first_end = d->end;
            r->first_corr = d->corr;
        }
        /* duration-weighted means; a kernel without the figure counts as 0 (spec §6) */
        bps = isnan(d->bps) ? 0.0 : d->bps * (double) dur;
        occ = isnan(d->occ) ? 0.0 : d->occ * (double) dur;
        r->calls++;
        r->total_ns += dur;
        r->min_ns = dur < r->min_ns ? dur : r->min_ns;
        r->max_ns = dur > r->max_ns ? dur : r->max_ns;
        r->wsum_blocks_per_sm += bps;
        r->wsum_occupancy += occ;
    }
    kern_groups_fini(&kg);
    kp__an_finish_kernel_rows(rows, nr);
    return table_take(t, rows, nr, sizeof(*rows), out);
nomem:
    kern_groups_fini(&kg);
    free(rows);
    return -ENOMEM;
}

/* ---- Tensor Core statistics (spec §7) ------------------------------------------------- */

int kp_an_tensor_cores(struct kp_an *a, struct kp_an_tc *out)
{
    int64_t kern[KP_AN_MAX_GPUS] = { 0 }, tc[KP_AN_MAX_GPUS] = { 0 }, bottom = 0, all = 0;
    bool seen[KP_AN_MAX_GPUS] = { false }, any = false;
    int rc;

    if (a->windowed) {
        *out = a->tc;
        return a->tables_done ? 0 : -EINVAL;
    }
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
        out->op_kernel_ns[out->n_gpus] = kern[g];
        out->op_tc_ns[out->n_gpus] = tc[g];
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
    out->eligible_bottom_ns = bottom;
    out->eligible_all_ns = all;
    return 0;
}
