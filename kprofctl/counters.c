/*
 * kprofctl counters --run R [--rank N] [-c COLS] [--json|--csv] [--pg CONNINFO]: CUPTI counter
 * values per kernel, the kernel's op stack (top and bottom op) and the FLOPs derived from the
 * SASS instruction counters (analyzer/counters.h has the rules).
 *
 * The table is built here, in kprofctl, reading PostgreSQL directly (--pg or KPROF_PG, else
 * libpq's PG* environment), as kprofctl export and compare do; the Analyzer service has no
 * Counters rpc (yet).
 *
 * Output: text columns (default idx, kernel, device, top_op, bottom_op, dur_ns, flops,
 * flops_per_s; -c picks others: range, correlation, tid, op_stack, flops_fp64, flops_fp32,
 * flops_fp16, any metric name, or all); --csv every column; --json one object {run, rank,
 * metrics, message, rows: [{..., op_stack: [...], counters: {metric: value|null}}]}. An unknown
 * counter is "-" (text), an empty field (CSV) or null (JSON), never 0. A run without counters
 * prints an empty table and says so on stderr (and in JSON's message).
 *
 * Exit status: 0 shown, 2 bad usage (an unknown -c column included), 3 unknown run or rank,
 * 1 anything else (PostgreSQL unreachable included: the message says to pass --pg).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "counters.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kprofctl.h"
#include "table.h"

#define CTR_MAX_ARGS 8

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

struct counters_config {
    long long run;
    long long rank;
    char *pg;
    bool json;
    bool csv;
    char *columns;
    long long max_rows;
    int log_level;
};

#define OFF(f) offsetof(struct counters_config, f)
static const struct kp_config_def counters_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(run), "the run (required; kprofctl runs)", NULL,
      false },
    { "rank", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(rank), "the rank", NULL, false },
    { "pg", KP_CONFIG_STRING, "", 0, 0, OFF(pg),
      "PostgreSQL conninfo (\"\": libpq's PG* environment)", NULL, true },
    { "json", KP_CONFIG_BOOL, "false", 0, 0, OFF(json),
      "print one JSON object {run, rank, metrics, message, rows}", NULL, false },
    { "csv", KP_CONFIG_BOOL, "false", 0, 0, OFF(csv), "print every column as CSV", NULL, false },
    { "columns", KP_CONFIG_STRING, "", 0, 0, OFF(columns),
      "show only these columns, comma-separated (also -c): idx, range, kernel, device, "
      "correlation, tid, top_op, bottom_op, op_stack, dur_ns, flops, flops_fp64, flops_fp32, "
      "flops_fp16, flops_per_s, a metric name, or all",
      NULL, false },
    { "max-rows", KP_CONFIG_INT, "0", 0, INT64_MAX, OFF(max_rows),
      "refuse a rank over this many rows (0: no limit)", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "warn", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
};
#undef OFF
#define N_DEFS (sizeof(counters_defs) / sizeof(counters_defs[0]))

static const char usage_text[] =
    "usage: kprofctl counters --run R [--rank N] [-c COLS] [--json|--csv] [--pg CONNINFO]\n"
    "  CUPTI counter values per kernel (Kineto's cuda_profiler_range events, imported with\n"
    "  kprofctl import), each kernel's op stack (top_op outermost, bottom_op innermost) and\n"
    "  the FLOPs from the SASS instruction counters (add + mul + 2 fma per precision), with\n"
    "  the achieved FLOP/s. Reads PostgreSQL directly (--pg or KPROF_PG).\n"
    "\nexit status: 0 shown, 1 failed (e.g. PostgreSQL unreachable), 2 bad usage, 3 unknown run "
    "or rank\n";

int kprofctl_counters(int argc, char **argv)
{
    struct counters_config cfg;
    struct kp_config_pos pos;
    char *args[CTR_MAX_ARGS], **av = NULL, buf[4096], err[1024];
    struct kp_ctr *t = NULL;
    PGconn *pg = NULL;
    int action, rc = KPROFCTL_EXIT_FAILED, r;

    memset(&cfg, 0, sizeof(cfg));
    if ((av = calloc((size_t) argc + 1, sizeof(*av))) == NULL ||
        kp_table_short_flags(argc, argv, av, buf, sizeof(buf)) != 0) {
        fprintf(stderr, "kprofctl counters: arguments too long\n");
        free(av);
        return KPROFCTL_EXIT_USAGE;
    }
    pos.args = args;
    pos.max = CTR_MAX_ARGS;
    pos.n = 0;
    if (kp_config_load_args(counters_defs, N_DEFS, &cfg, "kprofctl", argc, av, &pos, err,
                            sizeof(err), &action) != 0) {
        fprintf(stderr, "kprofctl counters: %s (see kprofctl counters --help)\n", err);
        free(av);
        return KPROFCTL_EXIT_USAGE;
    }
    if (action == KP_CONFIG_EXIT_OK) {
        printf("\n%s", usage_text);
        rc = KPROFCTL_EXIT_OK;
        goto out;
    }
    kp_log_set_level((enum kp_log_level) cfg.log_level);
    if (cfg.run <= 0 || pos.n > 0 || (cfg.json && cfg.csv)) {
        fprintf(stderr, "kprofctl counters: %s (see kprofctl counters --help)\n",
                pos.n > 0      ? "unexpected argument"
                : cfg.run <= 0 ? "--run is required (kprofctl runs lists the runs)"
                               : "--json and --csv exclude each other");
        rc = KPROFCTL_EXIT_USAGE;
        goto out;
    }
    if (kp_pg_connect(cfg.pg, "kprofctl-counters", &pg, err, sizeof(err)) != 0) {
        fprintf(stderr,
                "kprofctl counters: cannot connect to PostgreSQL: %s; pass --pg CONNINFO or set "
                "KPROF_PG\n",
                err);
        goto out;
    }
    if (kp_pg_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL jit = off", err,
                   sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl counters: PostgreSQL: %s\n", err);
        goto out;
    }
    r = kp_ctr_build(pg, cfg.run, (int) cfg.rank, (size_t) cfg.max_rows, &t, err, sizeof(err));
    if (r != 0) {
        fprintf(stderr, "kprofctl counters: %s\n", err);
        rc = r == KP_ENOTFOUND ? KPROFCTL_EXIT_NOT_FOUND : KPROFCTL_EXIT_FAILED;
        goto out;
    }
    (void) kp_pg_exec(pg, "COMMIT", err, sizeof(err));
    r = kp_ctr_write(stdout, t, cfg.run, (int) cfg.rank, cfg.columns,
                     cfg.json  ? KP_CTR_JSON
                     : cfg.csv ? KP_CTR_CSV
                               : KP_CTR_TEXT,
                     err, sizeof(err));
    if (r == -EINVAL) {
        fprintf(stderr, "kprofctl counters: -c: %s\n", err);
        rc = KPROFCTL_EXIT_USAGE;
        goto out;
    }
    if (r != 0) {
        fprintf(stderr, "kprofctl counters: cannot write the output\n");
        goto out;
    }
    if (!cfg.json && kp_ctr_message(t) != NULL) {
        fprintf(stderr, "kprofctl counters: %s\n", kp_ctr_message(t));
    }
    rc = KPROFCTL_EXIT_OK;
out:
    kp_ctr_destroy(t);
    if (pg != NULL) {
        PQfinish(pg);
    }
    kp_config_fini(counters_defs, N_DEFS, &cfg);
    free(av);
    return rc;
}
