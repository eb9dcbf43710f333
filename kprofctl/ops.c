/*
 * kprofctl ops --run R [--rank N] [--group-by name|shapes] [--top N] [--json|--csv] [-c COLS]
 * [-w WIDTH]: the operator view of one rank of a run, from kprof-analyzer's Analyzer.Ops.
 *
 * Output (stable; tests/it/test_analyzer_service.py parses it): one row per operator (or
 * operator and input shapes), in the TensorBoard plugin's order, with the columns
 *   name, input_shape (by name: the first call's), calls (number), host_self_us,
 *   host_total_us, device_self_us, device_total_us (numbers, µs), tc_eligible (yes|no),
 *   tc_self_ratio, tc_total_ratio (Tensor Core kernel time over device time, 0..1)
 * as aligned text, CSV, or (--json) an array of objects keyed by those names. Grouped by
 * name, input_shape is left out unless -c names it.
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or rank, 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "ops"
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

struct ops_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    int group_by;
    long long top;
};

static const char *const group_bys[] = { "name", "shapes", NULL };

#define OFF(f) offsetof(struct ops_config, f)
static const struct kp_config_def ops_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
    { "group-by", KP_CONFIG_ENUM, "name", 0, 0, OFF(group_by),
      "name: one row per operator; shapes: per operator and input shapes", group_bys, false },
    { "top", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(top), "only the first N rows (0: all)", NULL,
      false },
};
#undef OFF
#define N_DEFS (sizeof(ops_defs) / sizeof(ops_defs[0]))

enum ops_col {
    COL_NAME,
    COL_INPUT_SHAPE,
    COL_CALLS,
    COL_HOST_SELF,
    COL_HOST_TOTAL,
    COL_DEVICE_SELF,
    COL_DEVICE_TOTAL,
    COL_TC_ELIGIBLE,
    COL_TC_SELF_RATIO,
    COL_TC_TOTAL_RATIO,
    N_COLS,
};

static const struct kp_table_col ops_cols[N_COLS] = {
    [COL_NAME] = { "name", KP_TABLE_TEXT },
    [COL_INPUT_SHAPE] = { "input_shape", KP_TABLE_TEXT },
    [COL_CALLS] = { "calls", KP_TABLE_NUMERIC },
    [COL_HOST_SELF] = { "host_self_us", KP_TABLE_NUMERIC },
    [COL_HOST_TOTAL] = { "host_total_us", KP_TABLE_NUMERIC },
    [COL_DEVICE_SELF] = { "device_self_us", KP_TABLE_NUMERIC },
    [COL_DEVICE_TOTAL] = { "device_total_us", KP_TABLE_NUMERIC },
    [COL_TC_ELIGIBLE] = { "tc_eligible", KP_TABLE_TEXT },
    [COL_TC_SELF_RATIO] = { "tc_self_ratio", KP_TABLE_NUMERIC },
    [COL_TC_TOTAL_RATIO] = { "tc_total_ratio", KP_TABLE_NUMERIC },
};

static double ratio(int64_t num, int64_t den)
{
    return den ? (double) num / (double) den : 0.0;
}

static int add_op(const struct kp_rpcverb *v, struct kp_table *t, const Kprof__V1__OpRow *r)
{
    int rc = 0;

    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_NAME, r->name);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_INPUT_SHAPE, r->input_shape);
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_CALLS, r->calls);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_HOST_SELF, r->host_self_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_HOST_TOTAL, r->host_total_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_DEVICE_SELF, r->device_self_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_DEVICE_TOTAL, r->device_total_ns);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_TC_ELIGIBLE, r->tc_eligible ? "yes" : "no");
    rc = rc != 0 ? rc
                 : kp_rpcverb_set_exact(v, t, COL_TC_SELF_RATIO,
                                        ratio(r->tc_self_ns, r->device_self_ns));
    rc = rc != 0 ? rc
                 : kp_rpcverb_set_exact(v, t, COL_TC_TOTAL_RATIO,
                                        ratio(r->tc_total_ns, r->device_total_ns));
    return rc;
}

static int ops_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct ops_config *cfg = v->cfg;

    ((Kprof__V1__OpsRequest *) msg)->group_by =
        cfg->group_by == 1 ? KPROF__V1__OPS_GROUP_BY__OPS_GROUP_BY_NAME_AND_SHAPES
                           : KPROF__V1__OPS_GROUP_BY__OPS_GROUP_BY_NAME;
    return 0;
}

static int ops_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    const struct ops_config *cfg = v->cfg;
    const Kprof__V1__OpsResponse *resp = (const Kprof__V1__OpsResponse *) msg;
    size_t n = kp_rpcverb_top(resp->n_rows, cfg->top);
    int r = 0;

    /* Grouped by name, input_shape is left out unless -c names it. */
    if (cfg->group_by == 0) {
        kp_rpcverb_default_columns(
            v, t,
            "name,calls,host_self_us,host_total_us,device_self_us,device_total_us,"
            "tc_eligible,tc_self_ratio,tc_total_ratio");
    }
    for (size_t i = 0; i < n && r == 0; i++) {
        r = add_op(v, t, resp->rows[i]);
    }
    return r;
}

static const struct kp_rpcverb_spec ops_spec = {
    .name = "ops",
    .synopsis =
        "kprofctl ops --run R [--rank N] [--group-by name|shapes] [--top N] [--json|--csv]\n"
        "             [-c COLS] [-w WIDTH]\n"
        "  The operator view of one rank (Analyzer.Ops): calls, host and device self and\n"
        "  total time in µs, Tensor Core eligibility and ratios.\n",
    .exit_ok = "shown",
    .defs = ops_defs,
    .n_defs = N_DEFS,
    .cols = ops_cols,
    .n_cols = N_COLS,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Ops",
    .req_desc = &kprof__v1__ops_request__descriptor,
    .resp_desc = &kprof__v1__ops_response__descriptor,
    .request = ops_request,
    .rows = ops_rows,
};

int kprofctl_ops(int argc, char **argv)
{
    struct ops_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&ops_spec, &cfg, argc, argv);
}
