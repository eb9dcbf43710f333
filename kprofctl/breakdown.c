/*
 * kprofctl breakdown --run R [--rank N] [--plugin-compat] [--json|--csv] [-c COLS] [-w WIDTH]:
 * the step-time breakdown of one rank of a run, from kprof-analyzer's Analyzer.Breakdown.
 *
 * Output (stable; tests/it/test_analyzer_service.py parses it): one row per step, then one
 * row "average" (the mean over the steps), with the columns
 *   step (the N of ProfilerStep#N, or "average"), kernel_us, memcpy_us, memset_us,
 *   communication_us, runtime_us, dataloader_us, cpu_exec_us, other_us, total_us (numbers, µs)
 * as aligned text or CSV. Text output adds one line per GPU below the table:
 *   GPU N: utilization U%, est. SM efficiency E%, est. achieved occupancy O%
 * (2 decimals, like the TensorBoard plugin; "-" for a figure no kernel in the window has),
 * and under it, when the trace has the device's properties (the plugin's GPU summary):
 *     device: NAME, M GiB, compute capability X.Y, S SMs
 * then kprof's recommendations (analyzer/an_recommend.h, the plugin's rules in its order):
 *   recommendations:
 *     - <one per line>
 * or "recommendations: none".
 * --json carries all of it as one object: {"run", "rank", "plugin_compat", "steps": [the
 * rows, keyed by the column names, "average" last, every digit], "gpus": [{"gpu_id",
 * "utilization_pct", "est_sm_efficiency_pct", "est_achieved_occupancy_pct" (null when
 * undefined), "name", "memory_bytes", "compute_capability" ("8.0"), "sm_count" (null when
 * the trace has no properties)}], "recommendations": [strings]}.
 * --plugin-compat gives the TensorBoard plugin's double-counting figure instead of kprof's.
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or rank, 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "breakdown"
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct breakdown_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    bool plugin_compat;
};

#define OFF(f) offsetof(struct breakdown_config, f)
static const struct kp_config_def breakdown_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
    { "plugin-compat", KP_CONFIG_BOOL, "false", 0, 0, OFF(plugin_compat),
      "the TensorBoard plugin's figure, which counts time twice once a category fills a step", NULL,
      false },
};
#undef OFF
#define N_DEFS (sizeof(breakdown_defs) / sizeof(breakdown_defs[0]))

enum breakdown_col {
    COL_STEP,
    COL_KERNEL,
    COL_MEMCPY,
    COL_MEMSET,
    COL_COMMUNICATION,
    COL_RUNTIME,
    COL_DATALOADER,
    COL_CPU_EXEC,
    COL_OTHER,
    COL_TOTAL,
    N_COLS,
};

static const struct kp_table_col breakdown_cols[N_COLS] = {
    [COL_STEP] = { "step", KP_TABLE_TEXT },
    [COL_KERNEL] = { "kernel_us", KP_TABLE_NUMERIC },
    [COL_MEMCPY] = { "memcpy_us", KP_TABLE_NUMERIC },
    [COL_MEMSET] = { "memset_us", KP_TABLE_NUMERIC },
    [COL_COMMUNICATION] = { "communication_us", KP_TABLE_NUMERIC },
    [COL_RUNTIME] = { "runtime_us", KP_TABLE_NUMERIC },
    [COL_DATALOADER] = { "dataloader_us", KP_TABLE_NUMERIC },
    [COL_CPU_EXEC] = { "cpu_exec_us", KP_TABLE_NUMERIC },
    [COL_OTHER] = { "other_us", KP_TABLE_NUMERIC },
    [COL_TOTAL] = { "total_us", KP_TABLE_NUMERIC },
};

static int add_step(struct kp_table *t, const Kprof__V1__BreakdownStep *s)
{
    static const Kprof__V1__StepCosts zero = KPROF__V1__STEP_COSTS__INIT;
    const Kprof__V1__StepCosts *c = s->cost != NULL ? s->cost : &zero;
    int rc = 0;

    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_STEP, s->name);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_KERNEL, c->kernel_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_MEMCPY, c->memcpy_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_MEMSET, c->memset_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_COMMUNICATION, c->communication_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_RUNTIME, c->runtime_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_DATALOADER, c->dataloader_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_CPU_EXEC, c->cpu_exec_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_OTHER, c->other_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_TOTAL, s->end_ns - s->start_ns);
    return rc;
}

static int add_average(const struct kp_rpcverb *v, struct kp_table *t,
                       const Kprof__V1__AverageCosts *a)
{
    static const Kprof__V1__AverageCosts zero = KPROF__V1__AVERAGE_COSTS__INIT;
    int rc = 0;

    a = a != NULL ? a : &zero;
    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_STEP, "average");
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_KERNEL, a->kernel_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_MEMCPY, a->memcpy_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_MEMSET, a->memset_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_COMMUNICATION, a->communication_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_RUNTIME, a->runtime_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_DATALOADER, a->dataloader_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_CPU_EXEC, a->cpu_exec_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_OTHER, a->other_ns / 1000.0);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_TOTAL, a->total_ns / 1000.0);
    return rc;
}

/* "12.34%" of pct into buf, or "-" when !defined. */
static const char *fmt_pct(char *buf, size_t cap, bool defined, double pct)
{
    if (!defined) {
        return "-";
    }
    snprintf(buf, cap, "%.2f%%", pct);
    return buf;
}

static void print_gpu(const Kprof__V1__GpuUtilization *g)
{
    char eff[32], occ[32];

    printf("GPU %d: utilization %.2f%%, est. SM efficiency %s, est. achieved occupancy %s\n",
           g->gpu_id, 100.0 * g->utilization,
           fmt_pct(eff, sizeof(eff), g->est_sm_efficiency_defined, 100.0 * g->est_sm_efficiency),
           fmt_pct(occ, sizeof(occ), g->est_achieved_occupancy_defined, g->est_achieved_occupancy));
    if (g->device_known) {
        printf("    device: %s, %.2f GiB, compute capability %d.%d, %d SMs\n", g->name,
               (double) g->memory_bytes / (1024.0 * 1024.0 * 1024.0), g->compute_major,
               g->compute_minor, g->sm_count);
    }
}

enum gpu_col {
    GCOL_ID,
    GCOL_UTIL,
    GCOL_EFF,
    GCOL_OCC,
    GCOL_NAME,
    GCOL_MEMORY,
    GCOL_CC,
    GCOL_SMS,
    N_GCOLS,
};

static const struct kp_table_col gpu_cols[N_GCOLS] = {
    [GCOL_ID] = { "gpu_id", KP_TABLE_NUMERIC },
    [GCOL_UTIL] = { "utilization_pct", KP_TABLE_NUMERIC },
    [GCOL_EFF] = { "est_sm_efficiency_pct", KP_TABLE_NUMERIC },
    [GCOL_OCC] = { "est_achieved_occupancy_pct", KP_TABLE_NUMERIC },
    [GCOL_NAME] = { "name", KP_TABLE_TEXT },
    [GCOL_MEMORY] = { "memory_bytes", KP_TABLE_NUMERIC },
    [GCOL_CC] = { "compute_capability", KP_TABLE_TEXT },
    [GCOL_SMS] = { "sm_count", KP_TABLE_NUMERIC },
};

static int add_gpu(const struct kp_rpcverb *v, struct kp_table *t,
                   const Kprof__V1__GpuUtilization *g)
{
    char cc[32];
    int rc = kp_table_add_row(t);

    snprintf(cc, sizeof(cc), "%d.%d", g->compute_major, g->compute_minor);
    rc = rc != 0 ? rc : kp_table_set_i64(t, GCOL_ID, g->gpu_id);
    rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, GCOL_UTIL, 100.0 * g->utilization);
    rc = rc != 0 ? rc
         : g->est_sm_efficiency_defined
             ? kp_rpcverb_set_exact(v, t, GCOL_EFF, 100.0 * g->est_sm_efficiency)
             : kp_table_set_null(t, GCOL_EFF);
    rc = rc != 0 ? rc
         : g->est_achieved_occupancy_defined
             ? kp_rpcverb_set_exact(v, t, GCOL_OCC, g->est_achieved_occupancy)
             : kp_table_set_null(t, GCOL_OCC);
    if (g->device_known) {
        rc = rc != 0 ? rc : kp_table_set_str(t, GCOL_NAME, g->name);
        rc = rc != 0 ? rc : kp_table_set_i64(t, GCOL_MEMORY, g->memory_bytes);
        rc = rc != 0 ? rc : kp_table_set_str(t, GCOL_CC, cc);
        rc = rc != 0 ? rc : kp_table_set_i64(t, GCOL_SMS, g->sm_count);
    }
    else {
        for (size_t c = GCOL_NAME; c < N_GCOLS && rc == 0; c++) {
            rc = kp_table_set_null(t, c);
        }
    }
    return rc;
}

/* --json: one object with the steps (t), the GPUs and the recommendations. Returns 0 or 1
 * after printing why. */
static int print_json(const struct kp_rpcverb *v, const struct kp_table *t,
                      const Kprof__V1__BreakdownResponse *resp)
{
    struct kp_table *g = NULL;
    int rc = kp_table_create(gpu_cols, N_GCOLS, &g);

    for (size_t i = 0; i < resp->n_gpus && rc == 0; i++) {
        rc = add_gpu(v, g, resp->gpus[i]);
    }
    if (rc != 0) {
        kp_rpcverb_error(v, "%s", kp_strerror(rc));
        kp_table_destroy(g);
        return KPROFCTL_EXIT_FAILED;
    }
    printf("{\"run\": %" PRIu64 ", \"rank\": %d, \"plugin_compat\": %s, \"steps\": ", resp->run_id,
           resp->rank, resp->plugin_compat ? "true" : "false");
    rc = kp_rpcverb_print(v, t, stdout);
    if (rc == 0) {
        fputs(", \"gpus\": ", stdout);
        rc = kp_table_print(g, KP_TABLE_FORMAT_JSON, 0, stdout) != 0 ? KPROFCTL_EXIT_FAILED : 0;
    }
    kp_table_destroy(g);
    if (rc != 0) {
        return rc;
    }
    fputs(", \"recommendations\": [", stdout);
    for (size_t i = 0; i < resp->n_recommendations; i++) {
        fputs(i ? ", " : "", stdout);
        kp_json_fputs(stdout, resp->recommendations[i]);
    }
    fputs("]}\n", stdout);
    return fflush(stdout) != 0 ? KPROFCTL_EXIT_FAILED : 0;
}

static int breakdown_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct breakdown_config *cfg = v->cfg;

    ((Kprof__V1__BreakdownRequest *) msg)->plugin_compat = cfg->plugin_compat;
    return 0;
}

static int breakdown_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    const Kprof__V1__BreakdownResponse *resp = (const Kprof__V1__BreakdownResponse *) msg;
    int r = 0;

    for (size_t i = 0; i < resp->n_steps && r == 0; i++) {
        r = add_step(t, resp->steps[i]);
    }
    return r != 0 ? r : add_average(v, t, resp->average);
}

/* Text adds the GPUs and the recommendations below the table; --json is one object. */
static int breakdown_print(struct kp_rpcverb *v, const struct kp_table *t,
                           const ProtobufCMessage *msg)
{
    const Kprof__V1__BreakdownResponse *resp = (const Kprof__V1__BreakdownResponse *) msg;
    int rc;

    if (v->format == KP_TABLE_FORMAT_JSON) {
        return print_json(v, t, resp);
    }
    if ((rc = kp_rpcverb_print(v, t, stdout)) != 0 || v->format != KP_TABLE_FORMAT_TEXT) {
        return rc;
    }
    for (size_t i = 0; i < resp->n_gpus; i++) {
        print_gpu(resp->gpus[i]);
    }
    printf("recommendations:%s\n", resp->n_recommendations == 0 ? " none" : "");
    for (size_t i = 0; i < resp->n_recommendations; i++) {
        printf("  - %s\n", resp->recommendations[i]);
    }
    return fflush(stdout) != 0 ? KPROFCTL_EXIT_FAILED : 0;
}

static const struct kp_rpcverb_spec breakdown_spec = {
    .name = "breakdown",
    .synopsis =
        "kprofctl breakdown --run R [--rank N] [--plugin-compat] [--json|--csv] [-c COLS]\n"
        "                   [-w WIDTH]\n"
        "  The step-time breakdown of one rank (Analyzer.Breakdown): one row per step and an\n"
        "  \"average\" row, each category in µs, by the TensorBoard plugin's priority rule.\n",
    .exit_ok = "shown",
    .defs = breakdown_defs,
    .n_defs = N_DEFS,
    .cols = breakdown_cols,
    .n_cols = N_COLS,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Breakdown",
    .req_desc = &kprof__v1__breakdown_request__descriptor,
    .resp_desc = &kprof__v1__breakdown_response__descriptor,
    .request = breakdown_request,
    .rows = breakdown_rows,
    .print = breakdown_print,
};

int kprofctl_breakdown(int argc, char **argv)
{
    struct breakdown_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&breakdown_spec, &cfg, argc, argv);
}
