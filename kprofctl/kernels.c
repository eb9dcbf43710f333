/*
 * kprofctl kernels --run R [--rank N] [--group-by name|op] [--top N] [--json|--csv] [-c COLS]
 * [-w WIDTH]: the kernel view of one rank of a run, from kprof-analyzer's Analyzer.Kernels.
 *
 * Output (stable; tests/it/test_analyzer_service.py parses it): one row per kernel (or
 * kernel and launching op), longest total time first, with the columns
 *   name, op_name, grid, block ("[x, y, z]"; null when unknown), registers_per_thread,
 *   shared_memory (numbers), calls (number), total_us, mean_us, min_us, max_us (numbers, µs),
 *   mean_blocks_per_sm, mean_est_achieved_occupancy (numbers, the latter in percent; the
 *   duration-weighted means, 2 decimals in text and CSV like the TensorBoard plugin, every
 *   digit in JSON), tc_used, op_tc_eligible (yes|no)
 * as aligned text, CSV, or (--json) an array of objects keyed by those names. Grouped by
 * name, the op columns are left out unless -c names them (they are null then). Text output
 * adds the Tensor Core statistics below the table.
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or rank, 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "kernels"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct kernels_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    int group_by;
    long long top;
};

static const char *const group_bys[] = { "name", "op", NULL };

#define OFF(f) offsetof(struct kernels_config, f)
static const struct kp_config_def kernels_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
    { "group-by", KP_CONFIG_ENUM, "name", 0, 0, OFF(group_by),
      "name: one row per kernel; op: per kernel, launching op, grid, block, registers and "
      "shared memory",
      group_bys, false },
    { "top", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(top), "only the first N rows (0: all)", NULL,
      false },
};
#undef OFF
#define N_DEFS (sizeof(kernels_defs) / sizeof(kernels_defs[0]))

enum kernels_col {
    COL_NAME,
    COL_OP_NAME,
    COL_GRID,
    COL_BLOCK,
    COL_REGISTERS,
    COL_SHARED_MEMORY,
    COL_CALLS,
    COL_TOTAL,
    COL_MEAN,
    COL_MIN,
    COL_MAX,
    COL_BLOCKS_PER_SM,
    COL_OCCUPANCY,
    COL_TC_USED,
    COL_OP_TC_ELIGIBLE,
    N_COLS,
};

static const struct kp_table_col kernels_cols[N_COLS] = {
    [COL_NAME] = { "name", KP_TABLE_TEXT },
    [COL_OP_NAME] = { "op_name", KP_TABLE_TEXT },
    [COL_GRID] = { "grid", KP_TABLE_TEXT },
    [COL_BLOCK] = { "block", KP_TABLE_TEXT },
    [COL_REGISTERS] = { "registers_per_thread", KP_TABLE_NUMERIC },
    [COL_SHARED_MEMORY] = { "shared_memory", KP_TABLE_NUMERIC },
    [COL_CALLS] = { "calls", KP_TABLE_NUMERIC },
    [COL_TOTAL] = { "total_us", KP_TABLE_NUMERIC },
    [COL_MEAN] = { "mean_us", KP_TABLE_NUMERIC },
    [COL_MIN] = { "min_us", KP_TABLE_NUMERIC },
    [COL_MAX] = { "max_us", KP_TABLE_NUMERIC },
    [COL_BLOCKS_PER_SM] = { "mean_blocks_per_sm", KP_TABLE_NUMERIC },
    [COL_OCCUPANCY] = { "mean_est_achieved_occupancy", KP_TABLE_NUMERIC },
    [COL_TC_USED] = { "tc_used", KP_TABLE_TEXT },
    [COL_OP_TC_ELIGIBLE] = { "op_tc_eligible", KP_TABLE_TEXT },
};

static int set_dim(struct kp_table *t, size_t col, const char *s)
{
    return kp_table_set_str(t, col, s == NULL || s[0] == '\0' || strcmp(s, "None") == 0 ? NULL : s);
}

/* A figure the TensorBoard plugin shows with 2 decimals: so in text and CSV, exact in JSON. */
static int set_2dp(const struct kp_rpcverb *v, struct kp_table *t, size_t col, double x)
{
    return kp_table_set_double(t, col, x, v->format == KP_TABLE_FORMAT_JSON ? "%.17g" : "%.2f");
}

static int add_kernel(const struct kp_rpcverb *v, struct kp_table *t, const Kprof__V1__KernelRow *r,
                      bool by_op)
{
    int rc = 0;

    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_NAME, r->name);
    if (by_op) {
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_OP_NAME, r->op_name);
        rc = rc != 0 ? rc : set_dim(t, COL_GRID, r->grid);
        rc = rc != 0 ? rc : set_dim(t, COL_BLOCK, r->block);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_REGISTERS, r->registers);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_SHARED_MEMORY, r->shared_memory);
        rc = rc != 0 ? rc
                     : kp_table_set_str(t, COL_OP_TC_ELIGIBLE, r->op_tc_eligible ? "yes" : "no");
    }
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_CALLS, r->calls);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_TOTAL, r->total_ns);
    rc = rc != 0 ? rc
                 : kp_rpcverb_set_exact(v, t, COL_MEAN,
                                        r->calls ? (double) r->total_ns / (double) r->calls / 1000.0
                                                 : 0.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_MIN, r->min_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_MAX, r->max_ns);
    rc = rc != 0 ? rc : set_2dp(v, t, COL_BLOCKS_PER_SM, r->mean_blocks_per_sm);
    rc = rc != 0 ? rc : set_2dp(v, t, COL_OCCUPANCY, r->mean_est_achieved_occupancy);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_TC_USED, r->tc_used ? "yes" : "no");
    return rc;
}

static void print_tc(const Kprof__V1__TensorCoreStats *tc)
{
    if (tc == NULL) {
        return;
    }
    printf("Tensor Cores:");
    for (size_t i = 0; i < tc->n_gpus; i++) {
        if (tc->tc_ratio_defined) {
            printf(" GPU %d %.2f%% of kernel time;", tc->gpus[i]->gpu_id,
                   100.0 * tc->gpus[i]->tc_ratio);
        }
    }
    printf(" TC-eligible ops %.2f%% of ops' kernel time\n", 100.0 * tc->eligible_ops_kernel_ratio);
}

static int kernels_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct kernels_config *cfg = v->cfg;

    ((Kprof__V1__KernelsRequest *) msg)->group_by =
        cfg->group_by == 1 ? KPROF__V1__KERNELS_GROUP_BY__KERNELS_GROUP_BY_NAME_AND_OP
                           : KPROF__V1__KERNELS_GROUP_BY__KERNELS_GROUP_BY_NAME;
    return 0;
}

static int kernels_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    const struct kernels_config *cfg = v->cfg;
    const Kprof__V1__KernelsResponse *resp = (const Kprof__V1__KernelsResponse *) msg;
    size_t n = kp_rpcverb_top(resp->n_rows, cfg->top);
    int r = 0;

    /* Grouped by name, the op columns are left out unless -c names them. */
    if (cfg->group_by == 0) {
        kp_rpcverb_default_columns(v, t,
                                   "name,calls,total_us,mean_us,min_us,max_us,mean_blocks_per_sm,"
                                   "mean_est_achieved_occupancy,tc_used");
    }
    for (size_t i = 0; i < n && r == 0; i++) {
        r = add_kernel(v, t, resp->rows[i], cfg->group_by == 1);
    }
    return r;
}

/* Text adds the Tensor Core statistics below the table. */
static int kernels_print(struct kp_rpcverb *v, const struct kp_table *t,
                         const ProtobufCMessage *msg)
{
    int rc = kp_rpcverb_print(v, t, stdout);

    if (rc != 0 || v->format != KP_TABLE_FORMAT_TEXT) {
        return rc;
    }
    print_tc(((const Kprof__V1__KernelsResponse *) msg)->tensor_cores);
    return fflush(stdout) != 0 ? KPROFCTL_EXIT_FAILED : 0;
}

static const struct kp_rpcverb_spec kernels_spec = {
    .name = "kernels",
    .synopsis =
        "kprofctl kernels --run R [--rank N] [--group-by name|op] [--top N] [--json|--csv]\n"
        "                 [-c COLS] [-w WIDTH]\n"
        "  The kernel view of one rank (Analyzer.Kernels): calls, total, mean, min and max\n"
        "  time in µs, mean blocks per SM and est. achieved occupancy (%) weighted by\n"
        "  duration, and Tensor Core use, longest total first.\n",
    .exit_ok = "shown",
    .defs = kernels_defs,
    .n_defs = N_DEFS,
    .cols = kernels_cols,
    .n_cols = N_COLS,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Kernels",
    .req_desc = &kprof__v1__kernels_request__descriptor,
    .resp_desc = &kprof__v1__kernels_response__descriptor,
    .request = kernels_request,
    .rows = kernels_rows,
    .print = kernels_print,
};

int kprofctl_kernels(int argc, char **argv)
{
    struct kernels_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&kernels_spec, &cfg, argc, argv);
}
