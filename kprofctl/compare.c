/*
 * kprofctl compare --run R [--step S] [--json|--csv] [-c COLS] [-w WIDTH] [--pg CONNINFO]:
 * which rank holds the job back, and why (analyzer/compare.h has the rules).
 *
 * The computation runs here, in kprofctl, reading PostgreSQL directly (--pg or KPROF_PG, else
 * libpq's PG* environment), as kprofctl export does; there is no Analyzer.Compare rpc yet.
 *
 * Output: a per-rank table sorted by step time, slowest first, with the columns
 *   rank, step_ms (median over the steps), vs_median (% against the median rank), collective_ms
 *   (median time in collectives per step), late_ms (mean over the steps of its arrival
 *   lateness summed over the step's collectives),
 *   compute_ms, host_ms, launch_ms, other_ms (medians per step, from the breakdown),
 *   flag ("straggler", "waits" or "")
 * then the verdict line. --csv prints the table only; --json one object {run, ranks: [...],
 * steps: [...], stragglers: [{rank, steps, late_ms, cause, excess_ms, ...}], verdict}.
 * --hta prints HTA's straggler call instead (get_potential_stragglers: --hta-candidates K).
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or step, 1 anything else (PostgreSQL
 * unreachable included: the message says to pass --pg).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kprofctl.h"
#include "table.h"

#define CMP_MAX_ARGS 8

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

struct compare_config {
    long long run;
    long long step;
    char *pg;
    bool json;
    bool csv;
    char *columns;
    long long width;
    long long late_pct;
    long long last_pct;
    long long step_pct;
    long long max_rows;
    bool hta;
    long long hta_candidates;
    int log_level;
};

#define OFF(f) offsetof(struct compare_config, f)
static const struct kp_config_def compare_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(run), "the run (required; kprofctl runs)", NULL,
      false },
    { "step", KP_CONFIG_INT, "-1", -1, INT64_MAX, OFF(step),
      "compare only this step (the N of ProfilerStep#N); -1: every step", NULL, false },
    { "pg", KP_CONFIG_STRING, "", 0, 0, OFF(pg),
      "PostgreSQL conninfo (\"\": libpq's PG* environment)", NULL, true },
    { "json", KP_CONFIG_BOOL, "false", 0, 0, OFF(json),
      "print one JSON object {ranks, steps, stragglers, verdict}", NULL, false },
    { "csv", KP_CONFIG_BOOL, "false", 0, 0, OFF(csv), "print the table as CSV", NULL, false },
    { "columns", KP_CONFIG_STRING, "", 0, 0, OFF(columns),
      "show only these columns, comma-separated (also -c): rank, step_ms, vs_median, "
      "collective_ms, late_ms, compute_ms, host_ms, launch_ms, other_ms, flag",
      NULL, false },
    { "width", KP_CONFIG_INT, "0", 0, 10000, OFF(width),
      "cut text cells to this many columns (also -w; 0: no limit)", NULL, false },
    { "late-pct", KP_CONFIG_INT, "20", 0, 10000, OFF(late_pct),
      "a rank is late in a step when the others' median time in collectives exceeds its own by "
      "more than this % of the median step time (they wait for it)",
      NULL, false },
    { "last-pct", KP_CONFIG_INT, "50", 0, 99, OFF(last_pct),
      "... and it arrives last in more than this % of the step's collectives", NULL, false },
    { "step-pct", KP_CONFIG_INT, "50", 0, 100, OFF(step_pct),
      "a straggler is late in at least this % of the steps compared", NULL, false },
    { "max-rows", KP_CONFIG_INT, "0", 0, INT64_MAX, OFF(max_rows),
      "refuse a rank over this many rows (0: no limit)", NULL, false },
    { "hta", KP_CONFIG_BOOL, "false", 0, 0, OFF(hta),
      "print HTA's straggler call (get_potential_stragglers) instead", NULL, false },
    { "hta-candidates", KP_CONFIG_INT, "2", 1, 65536, OFF(hta_candidates), "HTA's num_candidates",
      NULL, false },
    { "log-level", KP_CONFIG_ENUM, "warn", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
};
#undef OFF
#define N_DEFS (sizeof(compare_defs) / sizeof(compare_defs[0]))

enum compare_col {
    COL_RANK,
    COL_STEP,
    COL_VS,
    COL_COLL,
    COL_LATE,
    COL_COMPUTE,
    COL_HOST,
    COL_LAUNCH,
    COL_OTHER,
    COL_FLAG,
    N_COLS,
};

static const struct kp_table_col compare_cols[N_COLS] = {
    [COL_RANK] = { "rank", KP_TABLE_NUMERIC },
    [COL_STEP] = { "step_ms", KP_TABLE_NUMERIC },
    [COL_VS] = { "vs_median", KP_TABLE_NUMERIC },
    [COL_COLL] = { "collective_ms", KP_TABLE_NUMERIC },
    [COL_LATE] = { "late_ms", KP_TABLE_NUMERIC },
    [COL_COMPUTE] = { "compute_ms", KP_TABLE_NUMERIC },
    [COL_HOST] = { "host_ms", KP_TABLE_NUMERIC },
    [COL_LAUNCH] = { "launch_ms", KP_TABLE_NUMERIC },
    [COL_OTHER] = { "other_ms", KP_TABLE_NUMERIC },
    [COL_FLAG] = { "flag", KP_TABLE_TEXT },
};

static const char usage_text[] =
    "usage: kprofctl compare --run R [--step S] [--json|--csv] [-c COLS] [-w WIDTH]\n"
    "                        [--pg CONNINFO] [--late-pct P] [--last-pct P] [--step-pct P]\n"
    "                        [--hta [--hta-candidates K]]\n"
    "  Which rank holds the job back, and why: one row per rank, slowest step time first,\n"
    "  stragglers (ranks that arrive late at collectives) and the ranks that wait for them\n"
    "  flagged, and the verdict in one line. Reads PostgreSQL directly (--pg or KPROF_PG).\n"
    "\nexit status: 0 shown, 1 failed (e.g. PostgreSQL unreachable), 2 bad usage, 3 unknown run "
    "or step\n";

static int status_of(int rc)
{
    return rc == KP_ENOTFOUND ? KPROFCTL_EXIT_NOT_FOUND
           : rc == -EINVAL    ? KPROFCTL_EXIT_USAGE
                              : KPROFCTL_EXIT_FAILED;
}

static int fill_table(struct kp_table *t, const struct kp_cmp_result *r)
{
    size_t *idx = calloc(r->n_ranks + 1, sizeof(*idx));
    int rc = idx == NULL ? -ENOMEM : kp_cmp_order(r, idx);

    for (size_t i = 0; i < r->n_ranks && rc == 0; i++) {
        const struct kp_cmp_rank *k = &r->ranks[idx[i]];

        rc = rc != 0 ? rc : kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_RANK, k->rank);
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_STEP, k->step_ns / 1e6, "%.3f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_VS, 100.0 * k->vs_median, "%+.1f%%");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_COLL, k->coll_ns / 1e6, "%.3f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_LATE, k->late_ns / 1e6, "%.3f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_COMPUTE, k->compute_ns / 1e6, "%.3f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_HOST, k->host_ns / 1e6, "%.3f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_LAUNCH, k->launch_ns / 1e6, "%.3f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_OTHER, k->other_ns / 1e6, "%.3f");
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_FLAG, kp_cmp_flag(k));
    }
    free(idx);
    return rc;
}

int kprofctl_compare(int argc, char **argv)
{
    struct compare_config cfg;
    struct kp_config_pos pos;
    char *args[CMP_MAX_ARGS], **av = NULL, buf[4096], err[1024];
    struct kp_cmp_opts o;
    struct kp_cmp_result *res = NULL;
    struct kp_cmp_hta *hta = NULL;
    struct kp_table *t = NULL;
    PGconn *pg = NULL;
    int action, rc = KPROFCTL_EXIT_FAILED, r;

    memset(&cfg, 0, sizeof(cfg));
    if ((av = calloc((size_t) argc + 1, sizeof(*av))) == NULL ||
        kp_table_short_flags(argc, argv, av, buf, sizeof(buf)) != 0) {
        fprintf(stderr, "kprofctl compare: arguments too long\n");
        free(av);
        return KPROFCTL_EXIT_USAGE;
    }
    pos.args = args;
    pos.max = CMP_MAX_ARGS;
    pos.n = 0;
    if (kp_config_load_args(compare_defs, N_DEFS, &cfg, "kprofctl", argc, av, &pos, err,
                            sizeof(err), &action) != 0) {
        fprintf(stderr, "kprofctl compare: %s (see kprofctl compare --help)\n", err);
        free(av);
        return KPROFCTL_EXIT_USAGE;
    }
    if (action == KP_CONFIG_EXIT_OK) {
        printf("\n%s", usage_text);
        rc = KPROFCTL_EXIT_OK;
        goto out;
    }
    kp_log_set_level((enum kp_log_level) cfg.log_level);
    if (cfg.run <= 0 || pos.n > 0 || (cfg.json && cfg.csv) || (cfg.hta && cfg.csv)) {
        fprintf(stderr, "kprofctl compare: %s (see kprofctl compare --help)\n",
                pos.n > 0      ? "unexpected argument"
                : cfg.run <= 0 ? "--run is required (kprofctl runs lists the runs)"
                : cfg.hta      ? "--hta prints text or --json, not --csv"
                               : "--json and --csv exclude each other");
        rc = KPROFCTL_EXIT_USAGE;
        goto out;
    }
    if (!cfg.hta) {
        if (kp_table_create(compare_cols, N_COLS, &t) != 0) {
            fprintf(stderr, "kprofctl compare: out of memory\n");
            goto out;
        }
        if (kp_table_select(t, cfg.columns, err, sizeof(err)) != 0) {
            fprintf(stderr, "kprofctl compare: -c: %s\n", err);
            rc = KPROFCTL_EXIT_USAGE;
            goto out;
        }
    }
    if (kp_pg_connect(cfg.pg, "kprofctl-compare", &pg, err, sizeof(err)) != 0) {
        fprintf(stderr,
                "kprofctl compare: cannot connect to PostgreSQL: %s; pass --pg CONNINFO or set "
                "KPROF_PG\n",
                err);
        goto out;
    }
    if (kp_pg_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL jit = off", err,
                   sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl compare: PostgreSQL: %s\n", err);
        goto out;
    }
    if (cfg.hta) {
        r = kp_cmp_hta(pg, cfg.run, cfg.step >= 0, cfg.step, (int) cfg.hta_candidates, &hta, err,
                       sizeof(err));
        if (r != 0) {
            fprintf(stderr, "kprofctl compare: %s\n", err);
            rc = status_of(r);
            goto out;
        }
        if (cfg.json) {
            kp_cmp_hta_json(stdout, hta);
        }
        else {
            printf("HTA's potential stragglers (num_candidates=%lld): [", cfg.hta_candidates);
            for (size_t i = 0; i < hta->n_stragglers; i++) {
                printf("%s%d", i ? ", " : "", hta->stragglers[i]);
            }
            printf("]\ncollective: %s (stream %d), mean step %.3f ms\n", hta->collective,
                   hta->stream, hta->mean_step_ns / 1e6);
            for (size_t i = 0; i < hta->n_rows; i++) {
                printf("  step %" PRId64 " rank %d: normalized start %.6f, duration %.6f\n",
                       hta->rows[i].step, hta->rows[i].rank, hta->rows[i].norm_start,
                       hta->rows[i].norm_dur);
            }
        }
    }
    else {
        kp_cmp_opts_init(&o);
        o.has_step = cfg.step >= 0;
        o.step = cfg.step;
        o.late_frac = (double) cfg.late_pct / 100.0;
        o.last_frac = (double) cfg.last_pct / 100.0;
        o.step_frac = (double) cfg.step_pct / 100.0;
        o.max_rows = (size_t) cfg.max_rows;
        if ((r = kp_cmp_run(pg, cfg.run, &o, &res, err, sizeof(err))) != 0) {
            fprintf(stderr, "kprofctl compare: %s\n", err);
            rc = status_of(r);
            goto out;
        }
        if (cfg.json) {
            kp_cmp_json(stdout, res);
        }
        else {
            if (fill_table(t, res) != 0) {
                fprintf(stderr, "kprofctl compare: out of memory\n");
                goto out;
            }
            if (kp_table_print(t, cfg.csv ? KP_TABLE_FORMAT_CSV : KP_TABLE_FORMAT_TEXT,
                               (int) cfg.width, stdout) != 0) {
                fprintf(stderr, "kprofctl compare: cannot write the output\n");
                goto out;
            }
            if (!cfg.csv) {
                printf("\n%s\n", res->verdict);
            }
        }
    }
    (void) kp_pg_exec(pg, "COMMIT", err, sizeof(err));
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kprofctl compare: cannot write the output\n");
        goto out;
    }
    rc = KPROFCTL_EXIT_OK;
out:
    kp_table_destroy(t);
    kp_cmp_result_destroy(res);
    kp_cmp_hta_destroy(hta);
    if (pg != NULL) {
        PQfinish(pg);
    }
    kp_config_fini(compare_defs, N_DEFS, &cfg);
    free(av);
    return rc;
}
