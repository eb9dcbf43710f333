/*
 * kprofctl distributed [wait|ops] --run R [--json|--csv] [-c COLS] [-w WIDTH]: the
 * TensorBoard plugin's distributed view across every rank of a run
 * (docs/specs/tbplugin-views.md §9), from kprof-analyzer's Analyzer.Distributed.
 *
 * wait (the default): per rank and step, data_transfer_us and synchronizing_us (step
 *   "(none)" for the communication in no step), then per rank a row step "all" with the
 *   plugin's mean over those rows (whole µs, truncated).
 * ops: per rank and communication op name (first-seen order): calls,
 *   total_size_bytes, avg_size_bytes, total_latency_us, avg_latency_us, data_transfer_us,
 *   avg_data_transfer_us (the averages rounded half to even, as the plugin does).
 * The column names are those of `kprof-analyze distributed --json`.
 * A run where the view is disabled (the plugin's enable condition) prints an empty table and
 * says why on stderr: "no distributed view: <reason>".
 *
 * Exit status: 0 shown (also disabled), 2 bad usage, 3 unknown run, 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "distributed"
#include <math.h>
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

static const struct kp_config_def dist_defs[] = {
    KP_RPCVERB_RUN_DEF,
};

enum wait_col {
    COL_RANK,
    COL_STEP,
    COL_TRANSFER,
    COL_SYNC,
    N_WAIT_COLS
};

static const struct kp_table_col wait_cols[N_WAIT_COLS] = {
    [COL_RANK] = { "rank", KP_TABLE_NUMERIC },
    [COL_STEP] = { "step", KP_TABLE_TEXT },
    [COL_TRANSFER] = { "data_transfer_us", KP_TABLE_NUMERIC },
    [COL_SYNC] = { "synchronizing_us", KP_TABLE_NUMERIC },
};

enum ops_col {
    COL_OP_RANK,
    COL_NAME,
    COL_CALLS,
    COL_TOTAL_SIZE,
    COL_AVG_SIZE,
    COL_TOTAL_LATENCY,
    COL_AVG_LATENCY,
    COL_OP_TRANSFER,
    COL_AVG_TRANSFER,
    N_OPS_COLS,
};

static const struct kp_table_col ops_cols[N_OPS_COLS] = {
    [COL_OP_RANK] = { "rank", KP_TABLE_NUMERIC },
    [COL_NAME] = { "name", KP_TABLE_TEXT },
    [COL_CALLS] = { "calls", KP_TABLE_NUMERIC },
    [COL_TOTAL_SIZE] = { "total_size_bytes", KP_TABLE_NUMERIC },
    [COL_AVG_SIZE] = { "avg_size_bytes", KP_TABLE_NUMERIC },
    [COL_TOTAL_LATENCY] = { "total_latency_us", KP_TABLE_NUMERIC },
    [COL_AVG_LATENCY] = { "avg_latency_us", KP_TABLE_NUMERIC },
    [COL_OP_TRANSFER] = { "data_transfer_us", KP_TABLE_NUMERIC },
    [COL_AVG_TRANSFER] = { "avg_data_transfer_us", KP_TABLE_NUMERIC },
};

#define SYNOPSIS                                                                                 \
    "kprofctl distributed [wait|ops] --run R [--json|--csv] [-c COLS] [-w WIDTH]\n"              \
    "  The TensorBoard plugin's distributed view of a run, every rank (Analyzer.Distributed):\n" \
    "  wait (the default): data transfer and synchronizing time per rank and step; ops: the\n"   \
    "  communication ops per rank. Times in µs.\n"

static int add_wait(struct kp_table *t, const Kprof__V1__DistributedRank *r)
{
    int rc = 0;

    for (size_t i = 0; i < r->n_wait && rc == 0; i++) {
        const Kprof__V1__DistributedWait *w = r->wait[i];

        rc = kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_RANK, r->rank);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_STEP, w->step < 0 ? "(none)" : w->step_name);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_TRANSFER, w->transfer_ns);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_SYNC, w->latency_ns - w->transfer_ns);
    }
    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_RANK, r->rank);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_STEP, "all");
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_TRANSFER, r->wait_all_transfer_us);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_SYNC, r->wait_all_sync_us);
    return rc;
}

/* x rounded half to even, as Python's round() (the plugin's). */
static int64_t round_even(double x)
{
    return (int64_t) nearbyint(x);
}

static int add_ops(struct kp_table *t, const Kprof__V1__DistributedRank *r)
{
    int rc = 0;

    for (size_t i = 0; i < r->n_ops && rc == 0; i++) {
        const Kprof__V1__DistributedOp *o = r->ops[i];
        double calls = (double) o->calls;

        rc = kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_OP_RANK, r->rank);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_NAME, o->name);
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_CALLS, o->calls);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_TOTAL_SIZE, o->total_bytes);
        rc = rc != 0
                 ? rc
                 : kp_table_set_i64(t, COL_AVG_SIZE, round_even((double) o->total_bytes / calls));
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_TOTAL_LATENCY, o->latency_ns);
        rc = rc != 0 ? rc
                     : kp_table_set_i64(t, COL_AVG_LATENCY,
                                        round_even((double) o->latency_ns / 1e3 / calls));
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_OP_TRANSFER, o->transfer_ns);
        rc = rc != 0 ? rc
                     : kp_table_set_i64(t, COL_AVG_TRANSFER,
                                        round_even((double) o->transfer_ns / 1e3 / calls));
    }
    return rc;
}

/* The rows of the table the spec names (wait or ops); a run where the view is disabled
 * gets an empty table and a line on stderr that says why. */
static int dist_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    const Kprof__V1__DistributedResponse *resp = (const Kprof__V1__DistributedResponse *) msg;
    int r = 0;

    for (size_t i = 0; i < resp->n_ranks && r == 0; i++) {
        r = v->spec->cols == wait_cols ? add_wait(t, resp->ranks[i]) : add_ops(t, resp->ranks[i]);
    }
    if (r == 0 && !resp->enabled) {
        kp_rpcverb_error(v, "no distributed view: %s", resp->reason);
    }
    return r;
}

/* One spec per table: they differ in the name and the columns. */
#define DIST_SPEC(table, cols_, n_cols_)                                                         \
    {                                                                                            \
        .name = "distributed " table, .synopsis = SYNOPSIS,                                      \
        .exit_ok = "shown (also when the view is disabled: stderr says why)", .defs = dist_defs, \
        .n_defs = sizeof(dist_defs) / sizeof(dist_defs[0]), .cols = cols_, .n_cols = n_cols_,    \
        .analyzer = true, .flags = KP_RPCVERB_F_RUN, .method = "Distributed",                    \
        .req_desc = &kprof__v1__distributed_request__descriptor,                                 \
        .resp_desc = &kprof__v1__distributed_response__descriptor, .rows = dist_rows,            \
    }

static const struct kp_rpcverb_spec wait_spec = DIST_SPEC("wait", wait_cols, N_WAIT_COLS);
static const struct kp_rpcverb_spec ops_spec = DIST_SPEC("ops", ops_cols, N_OPS_COLS);

int kprofctl_distributed(int argc, char **argv)
{
    const struct kp_rpcverb_spec *spec = &wait_spec;
    struct kp_rpcverb_common cfg;
    char *av[256];
    int ac = argc;

    if (argc > (int) (sizeof(av) / sizeof(av[0]))) {
        fprintf(stderr, "kprofctl distributed: too many arguments\n");
        return KPROFCTL_EXIT_USAGE;
    }
    memcpy(av, argv, sizeof(*av) * (size_t) argc);
    if (argc >= 2 && argv[1][0] != '-') {
        if (strcmp(argv[1], "ops") == 0) {
            spec = &ops_spec;
        }
        else if (strcmp(argv[1], "wait") != 0) {
            fprintf(stderr, "kprofctl distributed: unknown table \"%s\": wait or ops\n%s", argv[1],
                    SYNOPSIS);
            return KPROFCTL_EXIT_USAGE;
        }
        /* "distributed TABLE flags..." as "distributed flags..." */
        memmove(&av[1], &av[2], sizeof(*av) * (size_t) (argc - 2));
        ac = argc - 1;
    }
    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(spec, &cfg, ac, av);
}
