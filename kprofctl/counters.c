/*
 * kprofctl counters --run R [--rank N] [-c COLS] [--json|--csv]: CUPTI counter values per
 * kernel, the kernel's op stack (top and bottom op) and the FLOPs derived from the SASS
 * instruction counters (analyzer/counters.h has the rules), from kprof-analyzer's
 * Analyzer.Counters (--analyzer or KPROF_ANALYZER).
 *
 * Output: exactly what `kprof-analyze counters` prints for the same run, rank and flags
 * (tests/it/test_analyzer_counters.py checks it): the reply's rows go through counters.c's own
 * writer, kp_counters_write_rows. Text columns default to idx, kernel, device, top_op, bottom_op,
 * dur_us, flops, flops_per_s; -c picks others (range, correlation, tid, op_stack, flops_fp64,
 * flops_fp32, flops_fp16, any metric name, or all); --csv every column; --json one object
 * {run, rank, metrics, message, rows: [{..., op_stack: [...], counters: {metric: value|null}}]}.
 * An unknown counter is "-" (text), an empty field (CSV) or null (JSON), never 0. A run without
 * counters prints an empty table and says so on stderr (and in JSON's message). Durations:
 * dur_us (µs) in text and CSV, exact dur_ns in JSON. Text cells are cut at 60 bytes, as
 * kprof-analyze does, or at -w.
 *
 * Exit status: 0 shown, 2 bad usage (an unknown -c column included), 3 unknown run or rank,
 * 5 kprof-analyzer (or its PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "counters"
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "counters.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct counters_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
};

#define OFF(f) offsetof(struct counters_config, f)
static const struct kp_config_def counters_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
};
#undef OFF

/* The fixed columns (-c also takes the run's metric names: counters.c checks it). */
static const struct kp_table_col counters_cols[] = {
    { "idx", KP_TABLE_NUMERIC },         { "range", KP_TABLE_NUMERIC },
    { "kernel", KP_TABLE_TEXT },         { "device", KP_TABLE_NUMERIC },
    { "correlation", KP_TABLE_NUMERIC }, { "tid", KP_TABLE_NUMERIC },
    { "top_op", KP_TABLE_TEXT },         { "bottom_op", KP_TABLE_TEXT },
    { "op_stack", KP_TABLE_TEXT },       { "dur_us", KP_TABLE_NUMERIC },
    { "flops", KP_TABLE_NUMERIC },       { "flops_fp64", KP_TABLE_NUMERIC },
    { "flops_fp32", KP_TABLE_NUMERIC },  { "flops_fp16", KP_TABLE_NUMERIC },
    { "flops_per_s", KP_TABLE_NUMERIC },
};

/* The reply's rows as counters.h's rows, pointing into resp. Returns 0, or -EPROTO when a
 * row's values do not match the metrics. */
static int from_reply(const Kprof__V1__CountersResponse *resp, struct kp_counters_row *rows)
{
    for (size_t i = 0; i < resp->n_rows; i++) {
        const Kprof__V1__CountersRow *o = resp->rows[i];
        struct kp_counters_row *r = &rows[i];

        if (o->n_values != resp->n_metrics) {
            return -EPROTO;
        }
        r->idx = o->idx;
        r->range = o->range;
        r->device = o->device;
        r->correlation = o->correlation;
        r->tid = o->tid;
        r->kernel = o->kernel != NULL ? o->kernel : "";
        r->stack = (const char **) o->op_stack;
        r->n_stack = o->n_op_stack;
        r->top_op = o->n_op_stack > 0 ? o->op_stack[0] : NULL;
        r->bottom_op = o->n_op_stack > 0 ? o->op_stack[o->n_op_stack - 1] : NULL;
        r->dur_ns = o->dur_ns;
        r->values = o->values;
        r->flops = o->flops;
        r->flops_prec[KP_COUNTERS_FP64] = o->flops_fp64;
        r->flops_prec[KP_COUNTERS_FP32] = o->flops_fp32;
        r->flops_prec[KP_COUNTERS_FP16] = o->flops_fp16;
        r->flops_per_s = o->flops_per_s;
    }
    return 0;
}

static int counters_check(struct kp_rpcverb *v)
{
    if (v->common->width != 0 && v->common->width < 4) {
        return kp_rpcverb_usage_error(v, "-w takes a width of 4 or more");
    }
    return KP_RPCVERB_RUN;
}

/* The reply's rows through kp_counters_write_rows_width, which also checks -c against the run's
 * metrics. */
static int counters_print(struct kp_rpcverb *v, const struct kp_table *t,
                          const ProtobufCMessage *msg)
{
    const Kprof__V1__CountersResponse *resp = (const Kprof__V1__CountersResponse *) msg;
    const struct kp_rpcverb_common *c = v->common;
    struct kp_counters_row *rows;
    const char *message;
    char err[1024];
    int rc, r;

    (void) t;
    if ((rows = calloc(resp->n_rows ? resp->n_rows : 1, sizeof(*rows))) == NULL) {
        kp_rpcverb_error(v, "out of memory");
        return KPROFCTL_EXIT_FAILED;
    }
    rc = KPROFCTL_EXIT_FAILED;
    if (from_reply(resp, rows) != 0) {
        kp_rpcverb_error(v,
                         "kprof-analyzer's reply is malformed: a row's values do not match "
                         "its %zu metrics",
                         resp->n_metrics);
        goto out;
    }
    message = resp->message != NULL && resp->message[0] != '\0' ? resp->message : NULL;
    r = kp_counters_write_rows_width(stdout, rows, resp->n_rows,
                                     (const char *const *) resp->metrics, resp->n_metrics, message,
                                     c->run, resp->rank, c->columns,
                                     v->format == KP_TABLE_FORMAT_JSON  ? KP_COUNTERS_JSON
                                     : v->format == KP_TABLE_FORMAT_CSV ? KP_COUNTERS_CSV
                                                                        : KP_COUNTERS_TEXT,
                                     (int) c->width, err, sizeof(err));
    if (r == -EINVAL) {
        rc = kp_rpcverb_usage_error(v, "-c: %s", err);
        goto out;
    }
    if (r != 0) {
        kp_rpcverb_error(v, "cannot write the output");
        goto out;
    }
    if (v->format != KP_TABLE_FORMAT_JSON && message != NULL) {
        kp_rpcverb_error(v, "%s", message);
    }
    rc = KPROFCTL_EXIT_OK;
out:
    free(rows);
    return rc;
}

static const struct kp_rpcverb_spec counters_spec = {
    .name = "counters",
    .synopsis =
        "kprofctl counters --run R [--rank N] [-c COLS] [--json|--csv]\n"
        "  CUPTI counter values per kernel (Kineto's cuda_profiler_range events, imported with\n"
        "  kprofctl import), each kernel's op stack (top_op outermost, bottom_op innermost) and\n"
        "  the FLOPs from the SASS instruction counters (add + mul + 2 fma per precision), with\n"
        "  the achieved FLOP/s, from kprof-analyzer (Analyzer.Counters). An unknown counter is\n"
        "  \"-\" (text), empty (CSV) or null (JSON), never 0. The same output as kprof-analyze\n"
        "  counters.\n",
    .exit_ok = "shown (also an empty table: the run has no counters; stderr says so)",
    .json_help = "print {\"run\", \"rank\", \"metrics\", \"message\", \"rows\": [{..., "
                 "\"op_stack\": [...], \"counters\": {metric: value|null}}]}",
    .defs = counters_defs,
    .n_defs = sizeof(counters_defs) / sizeof(counters_defs[0]),
    .cols = counters_cols,
    .n_cols = sizeof(counters_cols) / sizeof(counters_cols[0]),
    .columns_help = "-c: comma-separated columns to show, in order: idx, range, kernel, device, "
                    "correlation, tid, top_op, bottom_op, op_stack, dur_us, flops, flops_fp64, "
                    "flops_fp32, flops_fp16, flops_per_s, a metric name, or all (text "
                    "default: " KP_COUNTERS_TEXT_COLUMNS "; CSV and JSON: all)",
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Counters",
    .req_desc = &kprof__v1__counters_request__descriptor,
    .resp_desc = &kprof__v1__counters_response__descriptor,
    .check = counters_check,
    .print = counters_print,
};

int kprofctl_counters(int argc, char **argv)
{
    struct counters_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&counters_spec, &cfg, argc, argv);
}
