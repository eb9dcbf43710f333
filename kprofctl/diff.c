/*
 * kprofctl diff --run A --run B [--rank N] [--other-rank M] [--what steps,ops,kernels]
 * [--top N] [--min-delta-us D] [--plugin-compat] [--json|--csv] [-c COLS] [-w WIDTH]: one rank
 * of a run (base, the first --run) against another run's rank (the second --run, or
 * --other-run) or against another rank of the same run (--other-rank), from kprof-analyzer's
 * Analyzer.Diff (analyzer/diff.h; docs/cli.md "Comparing two runs: kprofctl diff").
 *
 * --rank is the base's rank (default: its run's only rank); --other-rank the other side's
 * (default: --rank, so `--run A --run B --rank 3` compares rank 3 with rank 3). Both sides the
 * same rank of the same run is a usage error (exit 2): there is nothing to compare.
 *
 * Output: two lines naming the sides, then up to three tables, each under a title line: the
 * step breakdown per category (µs per step, each side's average over its steps, then the step
 * time "total"), kernels and ops by name (status both|new|vanished, calls, total µs, delta,
 * ratio other/base, mean µs per call; ops' time is their host total), sorted by |delta|; then
 * the verdict line. The columns are
 *   part (steps|kernels|ops), name, status, base_calls, other_calls, delta_calls, base_us,
 *   other_us, delta_us, ratio ("-" where the base is 0), base_mean_us, other_mean_us
 * (text shows each table's own; -c picks for all). --csv prints one table of every row with
 * its part; --json one object {"base": {run, rank, steps, step_avg_us}, "other": {...},
 * "plugin_compat", "steps": [{category, base_avg_us, other_avg_us, delta_avg_us, ratio,
 * base_total_ns, other_total_ns}], "kernels": [{name, status, base_calls, other_calls,
 * delta_calls, base_total_ns, other_total_ns, delta_ns, ratio, base_mean_us, other_mean_us}],
 * "kernels_totals": {rows, shown, both, new, vanished, base_calls, other_calls, base_total_ns,
 * other_total_ns, delta_ns}, "ops" and "ops_totals" (the same, plus base_/other_ self_ns,
 * device_total_ns and device_self_ns), "verdict"}, a part not asked for null, ratio null
 * where undefined; sums are exact integer ns (_ns), averages and means µs with every digit
 * (_us), as docs/cli.md "Units and names" has it.
 *
 * Exit status: 0 shown, 2 bad usage (also: both sides the same, a side's run with several
 * ranks and no rank for it), 3 unknown run or rank (either side), 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "diff"
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_config.h"
#include "kp_json.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

#define SAME_RANK (-2) /* --other-rank's default: --rank's */

struct diff_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    long long other_run;
    long long other_rank;
    char *what;
    long long top;
    long long min_delta_us;
    bool plugin_compat;
    Kprof__V1__DiffPart parts[3]; /* the request's, from --what */
    size_t n_parts;
};

#define OFF(f) offsetof(struct diff_config, f)
static const struct kp_config_def diff_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, INT32_MAX, offsetof(struct kp_rpcverb_common, run),
      "the base run (required; kprofctl runs); a second --run is the other run", NULL, false },
    { "other-run", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(other_run),
      "the other run (the second --run; default: --run's, a diff of two ranks)", NULL, false },
    { "rank", KP_CONFIG_INT, "-1", -1, INT32_MAX, offsetof(struct kp_rpcverb_common, rank),
      "the base's rank (default -1: its run's only rank; a run with several needs --rank)", NULL,
      false },
    { "other-rank", KP_CONFIG_INT, "-2", -2, INT32_MAX, OFF(other_rank),
      "the other side's rank (default -2: --rank's; -1: the other run's only rank)", NULL, false },
    { "what", KP_CONFIG_STRING, "steps,ops,kernels", 0, 0, OFF(what),
      "what to compare, comma-separated: steps (the breakdown per category), ops, kernels", NULL,
      false },
    { "top", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(top),
      "ops and kernels: only the N rows with the largest |delta| (0: all)", NULL, false },
    { "min-delta-us", KP_CONFIG_INT, "0", 0, INT64_MAX / 1000, OFF(min_delta_us),
      "ops and kernels: leave out rows whose |delta| is below this many µs", NULL, false },
    { "plugin-compat", KP_CONFIG_BOOL, "false", 0, 0, OFF(plugin_compat),
      "the step breakdown's TensorBoard-plugin figure on both sides (kprofctl breakdown)", NULL,
      false },
};
#undef OFF
#define N_DEFS (sizeof(diff_defs) / sizeof(diff_defs[0]))

enum diff_col {
    COL_PART,
    COL_NAME,
    COL_STATUS,
    COL_BASE_CALLS,
    COL_OTHER_CALLS,
    COL_DELTA_CALLS,
    COL_BASE,
    COL_OTHER,
    COL_DELTA,
    COL_RATIO,
    COL_BASE_MEAN,
    COL_OTHER_MEAN,
    N_COLS,
};

static const struct kp_table_col diff_cols[N_COLS] = {
    [COL_PART] = { "part", KP_TABLE_TEXT },
    [COL_NAME] = { "name", KP_TABLE_TEXT },
    [COL_STATUS] = { "status", KP_TABLE_TEXT },
    [COL_BASE_CALLS] = { "base_calls", KP_TABLE_NUMERIC },
    [COL_OTHER_CALLS] = { "other_calls", KP_TABLE_NUMERIC },
    [COL_DELTA_CALLS] = { "delta_calls", KP_TABLE_NUMERIC },
    [COL_BASE] = { "base_us", KP_TABLE_NUMERIC },
    [COL_OTHER] = { "other_us", KP_TABLE_NUMERIC },
    [COL_DELTA] = { "delta_us", KP_TABLE_NUMERIC },
    [COL_RATIO] = { "ratio", KP_TABLE_NUMERIC },
    [COL_BASE_MEAN] = { "base_mean_us", KP_TABLE_NUMERIC },
    [COL_OTHER_MEAN] = { "other_mean_us", KP_TABLE_NUMERIC },
};

static const char *const TEXT_STEPS = "name,base_us,other_us,delta_us,ratio";
static const char *const TEXT_ROWS = "name,status,base_calls,other_calls,delta_calls,base_us,"
                                     "other_us,delta_us,ratio,base_mean_us,other_mean_us";

static const char *status_name(Kprof__V1__DiffStatus s)
{
    return s == KPROF__V1__DIFF_STATUS__DIFF_STATUS_NEW        ? "new"
           : s == KPROF__V1__DIFF_STATUS__DIFF_STATUS_VANISHED ? "vanished"
                                                               : "both";
}

/* The second --run (or --run=) of argv as --other-run, so that `--run A --run B` reads as the
 * two runs. out has argc + 1 entries; buf holds a rewritten "--other-run=B". Returns 0, or 2
 * after printing why (a third --run, or --run twice and --other-run). */
static int second_run(int argc, char **argv, char **out, char *buf, size_t len)
{
    int runs = 0, other = 0;

    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];

        out[i] = argv[i];
        if (strcmp(a, "--") == 0) {
            for (i++; i < argc; i++) {
                out[i] = argv[i];
            }
            break;
        }
        other += strcmp(a, "--other-run") == 0 || strncmp(a, "--other-run=", 12) == 0;
        if (strcmp(a, "--run") != 0 && strncmp(a, "--run=", 6) != 0) {
            continue;
        }
        if (++runs == 2) {
            if (a[5] == '=') {
                snprintf(buf, len, "--other-run=%s", a + 6);
                out[i] = buf;
            }
            else {
                out[i] = "--other-run";
            }
        }
    }
    out[argc] = NULL;
    if (runs > 2 || (runs == 2 && other > 0)) {
        fprintf(stderr, "kprofctl diff: %s (see kprofctl diff --help)\n",
                runs > 2 ? "--run goes at most twice: the base run, then the other run"
                         : "the other run is the second --run or --other-run, not both");
        return KPROFCTL_EXIT_USAGE;
    }
    return 0;
}

static int diff_check(struct kp_rpcverb *v)
{
    struct diff_config *cfg = v->cfg;
    static const struct {
        const char *name;
        Kprof__V1__DiffPart part;
    } parts[] = { { "steps", KPROF__V1__DIFF_PART__DIFF_PART_STEPS },
                  { "ops", KPROF__V1__DIFF_PART__DIFF_PART_OPS },
                  { "kernels", KPROF__V1__DIFF_PART__DIFF_PART_KERNELS } };
    const char *p = cfg->what ? cfg->what : "";
    long long other_run = cfg->other_run ? cfg->other_run : cfg->common.run;
    long long other_rank = cfg->other_rank == SAME_RANK ? cfg->common.rank : cfg->other_rank;

    while (*p != '\0') {
        size_t n = strcspn(p, ","), j;

        for (j = 0; j < sizeof(parts) / sizeof(parts[0]); j++) {
            if (strlen(parts[j].name) == n && strncmp(p, parts[j].name, n) == 0) {
                break;
            }
        }
        if (j == sizeof(parts) / sizeof(parts[0])) {
            return kp_rpcverb_usage_error(v, "--what: \"%.*s\" is none of steps, ops, kernels",
                                          (int) n, p);
        }
        if (cfg->n_parts < 3) {
            cfg->parts[cfg->n_parts++] = parts[j].part;
        }
        p += n + (p[n] == ',');
    }
    if (cfg->n_parts == 0) {
        return kp_rpcverb_usage_error(v, "--what names nothing (steps, ops, kernels)");
    }
    if (other_run == cfg->common.run && other_rank == cfg->common.rank) {
        return kp_rpcverb_usage_error(
            v,
            "both sides are run %lld's %s: nothing to compare; give another run (--run twice) "
            "or another rank (--other-rank)",
            cfg->common.run, cfg->common.rank >= 0 ? "same rank" : "only rank");
    }
    return KP_RPCVERB_RUN;
}

static int diff_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    struct diff_config *cfg = v->cfg;
    Kprof__V1__DiffRequest *req = (Kprof__V1__DiffRequest *) msg;
    long long other_run = cfg->other_run ? cfg->other_run : cfg->common.run;
    long long other_rank = cfg->other_rank == SAME_RANK ? cfg->common.rank : cfg->other_rank;
    char a[64] = "", b[64] = "";

    req->other_run_id = (uint64_t) other_run;
    req->other_rank = (int32_t) other_rank;
    req->n_parts = cfg->n_parts;
    req->parts = cfg->parts;
    req->top = (uint32_t) cfg->top;
    req->min_delta_ns = cfg->min_delta_us * 1000;
    req->plugin_compat = cfg->plugin_compat;
    if (cfg->common.rank >= 0) {
        snprintf(a, sizeof(a), " rank %lld", cfg->common.rank);
    }
    if (other_rank >= 0) {
        snprintf(b, sizeof(b), " rank %lld", other_rank);
    }
    snprintf(v->subject, sizeof(v->subject), "run %lld%s against run %lld%s", cfg->common.run, a,
             other_run, b);
    return 0;
}

/* ---- text and CSV ---------------------------------------------------------------------- */

static int set_ratio(const struct kp_rpcverb *v, struct kp_table *t, bool defined, double r)
{
    return defined ? kp_rpcverb_set_exact(v, t, COL_RATIO, r) : kp_table_set_null(t, COL_RATIO);
}

static int add_steps(const struct kp_rpcverb *v, struct kp_table *t,
                     const Kprof__V1__DiffResponse *m)
{
    int rc = 0;

    for (size_t i = 0; i < m->n_steps && rc == 0; i++) {
        const Kprof__V1__DiffCategory *c = m->steps[i];

        rc = rc != 0 ? rc : kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_PART, "steps");
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_NAME, c->category);
        rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_BASE, c->base_avg_ns / 1e3);
        rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_OTHER, c->other_avg_ns / 1e3);
        rc = rc != 0 ? rc : kp_rpcverb_set_exact(v, t, COL_DELTA, c->delta_avg_ns / 1e3);
        rc = rc != 0 ? rc : set_ratio(v, t, c->ratio_defined, c->ratio);
    }
    return rc;
}

static int add_rows(const struct kp_rpcverb *v, struct kp_table *t, const char *part,
                    Kprof__V1__DiffRow *const *rows, size_t n)
{
    static const Kprof__V1__DiffFigures zero = KPROF__V1__DIFF_FIGURES__INIT;
    int rc = 0;

    for (size_t i = 0; i < n && rc == 0; i++) {
        const Kprof__V1__DiffRow *r = rows[i];
        const Kprof__V1__DiffFigures *b = r->base_figures ? r->base_figures : &zero;
        const Kprof__V1__DiffFigures *o = r->other_figures ? r->other_figures : &zero;

        rc = rc != 0 ? rc : kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_PART, part);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_NAME, r->name);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_STATUS, status_name(r->status));
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_BASE_CALLS, b->calls);
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_OTHER_CALLS, o->calls);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_DELTA_CALLS, r->delta_calls);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_BASE, b->total_ns);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_OTHER, o->total_ns);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, COL_DELTA, r->delta_ns);
        rc = rc != 0 ? rc : set_ratio(v, t, r->ratio_defined, r->ratio);
        rc = rc != 0 ? rc
                     : (b->calls ? kp_rpcverb_set_exact(v, t, COL_BASE_MEAN, b->mean_ns / 1e3)
                                 : kp_table_set_null(t, COL_BASE_MEAN));
        rc = rc != 0 ? rc
                     : (o->calls ? kp_rpcverb_set_exact(v, t, COL_OTHER_MEAN, o->mean_ns / 1e3)
                                 : kp_table_set_null(t, COL_OTHER_MEAN));
    }
    return rc;
}

/* One text table: title, then the rows add() puts in a fresh table with the text default
 * columns. Returns 0 or an exit status. */
static int text_table(const struct kp_rpcverb *v, const char *title, const char *cols,
                      int (*add)(const struct kp_rpcverb *v, struct kp_table *t, const void *x),
                      const void *x)
{
    struct kp_table *t = NULL;
    int rc;

    if ((rc = kp_rpcverb_table(v, &t)) != 0) {
        return rc;
    }
    kp_rpcverb_default_columns(v, t, cols);
    if (add(v, t, x) != 0) {
        kp_rpcverb_error(v, "out of memory");
        rc = KPROFCTL_EXIT_FAILED;
    }
    else {
        printf("\n%s\n", title);
        rc = kp_rpcverb_print(v, t, stdout);
    }
    kp_table_destroy(t);
    return rc;
}

struct rows_of {
    const char *part;
    Kprof__V1__DiffRow *const *rows;
    size_t n;
};

static int add_steps_cb(const struct kp_rpcverb *v, struct kp_table *t, const void *x)
{
    return add_steps(v, t, x);
}

static int add_rows_cb(const struct kp_rpcverb *v, struct kp_table *t, const void *x)
{
    const struct rows_of *r = x;

    return add_rows(v, t, r->part, r->rows, r->n);
}

static void side_line(const char *label, const Kprof__V1__DiffSide *s, bool steps)
{
    if (s == NULL) {
        return;
    }
    printf("%-6s run %" PRIu64 " rank %d", label, s->run_id, (int) s->rank);
    if (steps) {
        printf(" (%" PRIu64 " steps, %.3f µs per step)", s->n_steps, s->step_avg_ns / 1e3);
    }
    putchar('\n');
}

/* "kernels (312 names: 300 on both sides, 10 new, 2 vanished; 20 shown, by |delta|):" */
static void table_title(char *buf, size_t len, const char *what, const char *time,
                        const Kprof__V1__DiffTotals *tt)
{
    if (tt == NULL) {
        snprintf(buf, len, "%s:", what);
        return;
    }
    snprintf(buf, len,
             "%s, %s in µs (%" PRIu64 " names: %" PRIu64 " on both sides, %" PRIu64 " new, %" PRIu64
             " vanished; %" PRIu64 " shown, largest |delta| first):",
             what, time, tt->rows, tt->n_both, tt->n_new, tt->n_vanished, tt->shown);
}

static int print_text(const struct kp_rpcverb *v, const Kprof__V1__DiffResponse *m)
{
    char title[256];
    int rc = 0;

    side_line("base:", m->base_side, m->has_steps);
    side_line("other:", m->other_side, m->has_steps);
    if (m->has_steps) {
        rc = text_table(v, "step breakdown, µs per step (each side's average over its steps):",
                        TEXT_STEPS, add_steps_cb, m);
    }
    if (rc == 0 && m->has_kernels) {
        struct rows_of r = { "kernels", m->kernels, m->n_kernels };

        table_title(title, sizeof(title), "kernels by name", "kernel time", m->kernels_totals);
        rc = text_table(v, title, TEXT_ROWS, add_rows_cb, &r);
    }
    if (rc == 0 && m->has_ops) {
        struct rows_of r = { "ops", m->ops, m->n_ops };

        table_title(title, sizeof(title), "ops by name", "host total time", m->ops_totals);
        rc = text_table(v, title, TEXT_ROWS, add_rows_cb, &r);
    }
    if (rc == 0) {
        printf("\nverdict: %s\n", m->verdict);
    }
    return rc;
}

static int print_csv(const struct kp_rpcverb *v, const Kprof__V1__DiffResponse *m)
{
    struct kp_table *t = NULL;
    int rc;

    if ((rc = kp_rpcverb_table(v, &t)) != 0) {
        return rc;
    }
    if (add_steps(v, t, m) != 0 || add_rows(v, t, "kernels", m->kernels, m->n_kernels) != 0 ||
        add_rows(v, t, "ops", m->ops, m->n_ops) != 0) {
        kp_rpcverb_error(v, "out of memory");
        rc = KPROFCTL_EXIT_FAILED;
    }
    else {
        rc = kp_rpcverb_print(v, t, stdout);
    }
    kp_table_destroy(t);
    return rc;
}

/* ---- JSON ------------------------------------------------------------------------------ */

static void json_ratio(bool defined, double r)
{
    if (defined) {
        printf("%.17g", r);
    }
    else {
        fputs("null", stdout);
    }
}

static void json_side(const char *key, const Kprof__V1__DiffSide *s)
{
    printf("\"%s\": ", key);
    if (s == NULL) {
        fputs("null", stdout);
        return;
    }
    printf("{\"run\": %" PRIu64 ", \"rank\": %d, \"steps\": %" PRIu64 ", \"step_avg_us\": %.17g}",
           s->run_id, (int) s->rank, s->n_steps, s->step_avg_ns / 1e3);
}

/* The two sides' figures of a row or totals, "base_calls": ..., each key once per side. */
static void json_figs(const Kprof__V1__DiffFigures *b, const Kprof__V1__DiffFigures *o, bool ops,
                      bool mean)
{
    static const Kprof__V1__DiffFigures zero = KPROF__V1__DIFF_FIGURES__INIT;

    b = b ? b : &zero;
    o = o ? o : &zero;
    printf("\"base_calls\": %" PRIu64 ", \"other_calls\": %" PRIu64 ", \"base_total_ns\": %" PRId64
           ", \"other_total_ns\": %" PRId64,
           b->calls, o->calls, b->total_ns, o->total_ns);
    if (mean) {
        printf(", \"base_mean_us\": %.17g, \"other_mean_us\": %.17g", b->mean_ns / 1e3,
               o->mean_ns / 1e3);
    }
    if (ops) {
        printf(", \"base_self_ns\": %" PRId64 ", \"other_self_ns\": %" PRId64
               ", \"base_device_total_ns\": %" PRId64 ", \"other_device_total_ns\": %" PRId64
               ", \"base_device_self_ns\": %" PRId64 ", \"other_device_self_ns\": %" PRId64,
               b->self_ns, o->self_ns, b->device_total_ns, o->device_total_ns, b->device_self_ns,
               o->device_self_ns);
    }
}

static void json_table(const char *key, bool has, Kprof__V1__DiffRow *const *rows, size_t n,
                       const Kprof__V1__DiffTotals *tt, bool ops)
{
    printf(", \"%s\": ", key);
    if (!has) {
        printf("null, \"%s_totals\": null", key);
        return;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) {
        const Kprof__V1__DiffRow *r = rows[i];

        printf("%s{\"name\": ", i ? ", " : "");
        kp_json_fputs(stdout, r->name);
        printf(", \"status\": \"%s\", ", status_name(r->status));
        json_figs(r->base_figures, r->other_figures, ops, true);
        printf(", \"delta_calls\": %" PRId64 ", \"delta_ns\": %" PRId64 ", \"ratio\": ",
               r->delta_calls, r->delta_ns);
        json_ratio(r->ratio_defined, r->ratio);
        putchar('}');
    }
    printf("], \"%s_totals\": ", key);
    if (tt == NULL) {
        fputs("null", stdout);
        return;
    }
    printf("{\"rows\": %" PRIu64 ", \"shown\": %" PRIu64 ", \"both\": %" PRIu64
           ", \"new\": %" PRIu64 ", \"vanished\": %" PRIu64 ", ",
           tt->rows, tt->shown, tt->n_both, tt->n_new, tt->n_vanished);
    json_figs(tt->base_figures, tt->other_figures, ops, false);
    printf(", \"delta_ns\": %" PRId64 "}", tt->delta_ns);
}

static void print_json(const Kprof__V1__DiffResponse *m)
{
    putchar('{');
    json_side("base", m->base_side);
    putchar(',');
    putchar(' ');
    json_side("other", m->other_side);
    printf(", \"plugin_compat\": %s, \"steps\": ", m->plugin_compat ? "true" : "false");
    if (!m->has_steps) {
        fputs("null", stdout);
    }
    else {
        putchar('[');
        for (size_t i = 0; i < m->n_steps; i++) {
            const Kprof__V1__DiffCategory *c = m->steps[i];

            printf("%s{\"category\": ", i ? ", " : "");
            kp_json_fputs(stdout, c->category);
            printf(", \"base_avg_us\": %.17g, \"other_avg_us\": %.17g, \"delta_avg_us\": %.17g, "
                   "\"ratio\": ",
                   c->base_avg_ns / 1e3, c->other_avg_ns / 1e3, c->delta_avg_ns / 1e3);
            json_ratio(c->ratio_defined, c->ratio);
            printf(", \"base_total_ns\": %" PRId64 ", \"other_total_ns\": %" PRId64 "}",
                   c->base_total_ns, c->other_total_ns);
        }
        putchar(']');
    }
    json_table("kernels", m->has_kernels, m->kernels, m->n_kernels, m->kernels_totals, false);
    json_table("ops", m->has_ops, m->ops, m->n_ops, m->ops_totals, true);
    fputs(", \"verdict\": ", stdout);
    kp_json_fputs(stdout, m->verdict);
    fputs("}\n", stdout);
}

static int diff_print(struct kp_rpcverb *v, const struct kp_table *t, const ProtobufCMessage *msg)
{
    const Kprof__V1__DiffResponse *m = (const Kprof__V1__DiffResponse *) msg;
    int rc = 0;

    (void) t;
    if (v->format == KP_TABLE_FORMAT_JSON) {
        print_json(m);
    }
    else if (v->format == KP_TABLE_FORMAT_CSV) {
        rc = print_csv(v, m);
    }
    else {
        rc = print_text(v, m);
    }
    if (rc == 0 && (fflush(stdout) != 0 || ferror(stdout))) {
        kp_rpcverb_error(v, "cannot write the output");
        rc = KPROFCTL_EXIT_FAILED;
    }
    return rc;
}

static const struct kp_rpcverb_spec diff_spec = {
    .name = "diff",
    .synopsis =
        "usage: kprofctl diff --run A --run B [--rank N] [--other-rank M]\n"
        "                     [--what steps,ops,kernels] [--top N] [--min-delta-us D]\n"
        "                     [--plugin-compat] [--json|--csv] [-c COLS] [-w WIDTH]\n"
        "       kprofctl diff --run A --rank N --other-rank M   (two ranks of one run)\n"
        "  One rank of run A (base) against run B's (other; --other-rank M, default --rank's),\n"
        "  or against another rank of run A: the step breakdown per category (µs per step),\n"
        "  kernels and ops by name (calls, total and mean µs, delta = other - base, ratio\n"
        "  other/base, new or vanished), largest |delta| first, and a verdict in one line.\n"
        "  Each side's figures are those of kprofctl breakdown, kernels and ops.\n",
    .exit_ok = "shown",
    .json_help = "print one JSON object {base, other, plugin_compat, steps, kernels, "
                 "kernels_totals, ops, ops_totals, verdict}: sums in exact ns (_ns), averages and "
                 "means in µs (_us) with every digit",
    .defs = diff_defs,
    .n_defs = N_DEFS,
    .cols = diff_cols,
    .n_cols = N_COLS,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Diff",
    .req_desc = &kprof__v1__diff_request__descriptor,
    .resp_desc = &kprof__v1__diff_response__descriptor,
    .check = diff_check,
    .request = diff_request,
    .print = diff_print,
};

int kprofctl_diff(int argc, char **argv)
{
    struct diff_config cfg;
    char **args = calloc((size_t) argc + 1, sizeof(*args));
    char buf[64];
    int rc;

    if (args == NULL) {
        fprintf(stderr, "kprofctl diff: out of memory\n");
        return KPROFCTL_EXIT_FAILED;
    }
    memset(&cfg, 0, sizeof(cfg));
    if ((rc = second_run(argc, argv, args, buf, sizeof(buf))) == 0) {
        rc = kp_rpcverb_main(&diff_spec, &cfg, argc, args);
    }
    free(args);
    return rc;
}
