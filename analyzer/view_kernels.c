/* The Kernels view (Analyzer.Kernels): the kernel view of one rank, by name or by name and
 * launching op, with the Tensor Core statistics (view.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kprof.pb-c.h"
#include "view.h"

struct kernels_opts {
    int group_by;
};

struct kernels_state {
    Kprof__V1__KernelsResponse m;
    Kprof__V1__TensorCoreStats tcs;
    Kprof__V1__TensorCoreGpu tcg[KP_AN_MAX_GPUS], *tcg_ptrs[KP_AN_MAX_GPUS];
    Kprof__V1__KernelRow *rows, **ptrs;
};

static void kernels_free(void *p)
{
    struct kernels_state *s = p;

    free(s->rows);
    free(s->ptrs);
    free(s);
}

static int kernels_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct kernels_opts o;
    struct kernels_state *s = calloc(1, sizeof(*s));
    const struct kp_an_table *t;
    const struct kp_an_kernel_row *r;
    struct kp_an_tc tc;
    bool by_op;
    int rc;

    memcpy(&o, k->opts, sizeof(o));
    by_op = o.group_by != 0;
    if (s == NULL) {
        return -ENOMEM;
    }
    if ((rc = kp_an_kernels(c->an, by_op, &t)) != 0 || (rc = kp_an_tensor_cores(c->an, &tc)) != 0) {
        free(s);
        return rc;
    }
    r = t->rows;
    s->rows = calloc(t->n ? t->n : 1, sizeof(*s->rows));
    s->ptrs = calloc(t->n ? t->n : 1, sizeof(*s->ptrs));
    if (!s->rows || !s->ptrs) {
        kernels_free(s);
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->n; i++) {
        Kprof__V1__KernelRow *row = &s->rows[i];

        kprof__v1__kernel_row__init(row);
        row->name = (char *) (r[i].name ? r[i].name : "");
        if (by_op) {
            row->op_name = (char *) (r[i].op_name ? r[i].op_name : "");
            row->grid = (char *) r[i].grid;
            row->block = (char *) r[i].block;
            row->registers = r[i].registers;
            row->shared_memory = r[i].shared_memory;
            row->op_tc_eligible = r[i].op_tc_eligible;
        }
        row->calls = r[i].calls;
        row->total_ns = r[i].total_ns;
        row->min_ns = r[i].min_ns;
        row->max_ns = r[i].max_ns;
        row->tc_used = r[i].tc_used;
        row->mean_blocks_per_sm = r[i].mean_blocks_per_sm;
        row->mean_est_achieved_occupancy = r[i].mean_est_achieved_occupancy;
        s->ptrs[i] = row;
    }
    kprof__v1__tensor_core_stats__init(&s->tcs);
    for (size_t i = 0; i < tc.n_gpus && i < KP_AN_MAX_GPUS; i++) {
        kprof__v1__tensor_core_gpu__init(&s->tcg[i]);
        s->tcg[i].gpu_id = tc.gpu_ids[i];
        s->tcg[i].tc_ratio = tc.tc_ratio[i];
        s->tcg_ptrs[i] = &s->tcg[i];
    }
    s->tcs.n_gpus = tc.n_gpus;
    s->tcs.gpus = s->tcg_ptrs;
    s->tcs.tc_ratio_defined = tc.tc_ratio_defined;
    s->tcs.eligible_ops_kernel_ratio = tc.eligible_ops_kernel_ratio;
    kprof__v1__kernels_response__init(&s->m);
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    s->m.group_by = (Kprof__V1__KernelsGroupBy) o.group_by;
    s->m.n_rows = t->n;
    s->m.rows = s->ptrs;
    s->m.tensor_cores = &s->tcs;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = kernels_free;
    return 0;
}

const struct kp_view kp_view_kernels = {
    .name = "Kernels",
    .request = &kprof__v1__kernels_request__descriptor,
    .reply = &kprof__v1__kernels_response__descriptor,
    .load_rank = true,
    .windowed = KP_AN_WIN_TABLES,
    .key = kp_view_group_by_key,
    .compute = kernels_compute,
    .bytes_per_event = 150,
};
