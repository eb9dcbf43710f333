/*
 * kprofctl compare --run R [--step S] [--top N] [--flagged] [--json|--csv] [-c COLS]
 * [-w WIDTH]: which rank holds the job back, and why (analyzer/compare.h has the rules), from
 * kprof-analyzer's Analyzer.Compare (--analyzer or KPROF_ANALYZER), which reads PostgreSQL and
 * caches the comparison per run and options until the run changes.
 *
 * Output: a per-rank table, flagged ranks first (stragglers, latest first, then the rank the
 * others wait for, flagged "late"), then the others by step time, slowest first, in µs as
 * every text table of kprofctl, with the columns
 *   rank; host (ranks.host); node (the host's index, hosts numbered in the order of their
 *   lowest ranks); step_us (median over the steps); vs_median (% against the median rank);
 *   collective_us (median time in collectives per step); late_us (mean over the steps of how
 *   long after the median rank it arrives, summed over the step's collectives); compute_us
 *   (non-collective kernels), dataload_us (data loading ops), launch_us (CUDA runtime calls
 *   but synchronizations), other_us (copies, memsets): medians of the per-step sums;
 *   offset_us (its clock offset, from collectives every rank finishes together; "-" when it
 *   has none); flag ("straggler", "late", "waits" or "")
 * then the lateness map (one row per rank shown, one column per step: '.' on time, '+' later
 * than --late-pct of the step's median step time after the median rank, '#' 5 times that, ' '
 * the rank lacks the step), a line on the clock offsets (how many collectives they come from,
 * their spread, the ranks without one), the verdict line (which also says which ranks of the
 * world are missing from the run) and the next commands to run (the breakdown of the first
 * flagged rank, its export beside the median rank's). --top N shows the first N ranks,
 * --flagged only the flagged ones (table, map and JSON). --csv prints the table only; --json
 * one object {run, world_size, missing_ranks, waited_for, hta_rank, ..., next, ranks: [...
 * late_us_by_step ...], steps: [...], stragglers: [{rank, steps, late_ms, cause, excess_ms,
 * own and median ms by cause, ...}], verdict}: the exact figures, each with its unit in its
 * name.
 * --hta prints HTA's straggler call instead (get_potential_stragglers: --hta-candidates K); on
 * a run it cannot be computed on (no NCCL collectives, one rank) it prints why and exits 0.
 * The reply is structured (compare_pb.h); it is turned back into compare.h's result and printed
 * by compare.h's own writers, so the output is what the in-process comparison printed.
 *
 * compare only reads, in one read-only transaction, unless --save-offsets: then the analyzer
 * writes the clock offsets it estimates from collective end times (compare.h) to
 * ranks.clock_offset_ns of the ranks that share collectives with the reference (the lowest
 * rank), in the same transaction, committed before it answers (such a request is never
 * answered from its cache). An explicit flag rather than always: a comparison is something one
 * runs often, and a stored offset is a claim about the hosts' clocks that the user should ask
 * for.
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or step, 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else (e.g. over the row budget).
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
#include "compare_pb.h"
#include "kp_config.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct compare_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    long long step;
    long long late_pct;
    long long excess_pct;
    long long step_pct;
    long long max_rows;
    bool save_offsets;
    bool hta;
    long long hta_candidates;
    long long top;
    bool flagged;
    Kprof__V1__CompareThresholds th; /* the request's */
};

#define OFF(f) offsetof(struct compare_config, f)
static const struct kp_config_def compare_defs[] = {
    KP_RPCVERB_RUN_DEF,
    { "step", KP_CONFIG_INT, "-1", -1, INT64_MAX, OFF(step),
      "compare only this step (the N of ProfilerStep#N); -1: every step", NULL, false },
    { "late-pct", KP_CONFIG_INT, "2", 0, 10000, OFF(late_pct),
      "a rank is late in a step when it arrives at the step's collectives, in all, more than "
      "this % of the median step time after the median rank",
      NULL, false },
    { "excess-pct", KP_CONFIG_INT, "5", 0, 10000, OFF(excess_pct),
      "... and spends more than this % of the median step time longer than the median rank on "
      "compute, data loading or launches",
      NULL, false },
    { "step-pct", KP_CONFIG_INT, "50", 0, 100, OFF(step_pct),
      "a straggler is late in at least this % of the steps compared", NULL, false },
    { "max-rows", KP_CONFIG_INT, "0", 0, INT64_MAX, OFF(max_rows),
      "refuse when the run's queries return more than this many rows in all (per-step sums and "
      "collectives; 0: kprof-analyzer's own --max-rows, which this cannot raise)",
      NULL, false },
    { "save-offsets", KP_CONFIG_BOOL, "false", 0, 0, OFF(save_offsets),
      "write the clock offsets estimated from collective end times to ranks.clock_offset_ns "
      "(compare only reads otherwise)",
      NULL, false },
    { "hta", KP_CONFIG_BOOL, "false", 0, 0, OFF(hta),
      "print HTA's straggler call (get_potential_stragglers) instead", NULL, false },
    { "hta-candidates", KP_CONFIG_INT, "2", 1, 65536, OFF(hta_candidates), "HTA's num_candidates",
      NULL, false },
    { "top", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(top),
      "show only the first N ranks (flagged first; 0: all) in the table, map and JSON", NULL,
      false },
    { "flagged", KP_CONFIG_BOOL, "false", 0, 0, OFF(flagged),
      "show only the flagged ranks (straggler, late: those the others wait for)", NULL, false },
};
#undef OFF

enum compare_col {
    COL_RANK,
    COL_HOSTNAME,
    COL_NODE,
    COL_STEP,
    COL_VS,
    COL_COLL,
    COL_LATE,
    COL_COMPUTE,
    COL_HOST,
    COL_LAUNCH,
    COL_OTHER,
    COL_OFFSET,
    COL_FLAG,
    N_COLS,
};

static const struct kp_table_col compare_cols[N_COLS] = {
    [COL_RANK] = { "rank", KP_TABLE_NUMERIC },
    [COL_HOSTNAME] = { "host", KP_TABLE_TEXT },
    [COL_NODE] = { "node", KP_TABLE_NUMERIC },
    [COL_STEP] = { "step_us", KP_TABLE_NUMERIC },
    [COL_VS] = { "vs_median", KP_TABLE_NUMERIC },
    [COL_COLL] = { "collective_us", KP_TABLE_NUMERIC },
    [COL_LATE] = { "late_us", KP_TABLE_NUMERIC },
    [COL_COMPUTE] = { "compute_us", KP_TABLE_NUMERIC },
    [COL_HOST] = { "dataload_us", KP_TABLE_NUMERIC },
    [COL_LAUNCH] = { "launch_us", KP_TABLE_NUMERIC },
    [COL_OTHER] = { "other_us", KP_TABLE_NUMERIC },
    [COL_OFFSET] = { "offset_us", KP_TABLE_NUMERIC },
    [COL_FLAG] = { "flag", KP_TABLE_TEXT },
};

static int fill_table(struct kp_table *t, const struct kp_compare_result *r, const size_t *idx,
                      size_t n)
{
    int rc = 0;

    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct kp_compare_rank *k = &r->ranks[idx[i]];

        rc = rc != 0 ? rc : kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_RANK, k->rank);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_HOSTNAME, k->host[0] ? k->host : "-");
        if (k->node >= 0) {
            rc = rc != 0 ? rc : kp_table_set_i64(t, COL_NODE, k->node);
        }
        else {
            rc = rc != 0 ? rc : kp_table_set_null(t, COL_NODE);
        }
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_STEP, k->step_ns / 1e3, "%.1f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_VS, 100.0 * k->vs_median, "%+.1f%%");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_COLL, k->coll_ns / 1e3, "%.1f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_LATE, k->late_ns / 1e3, "%.1f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_COMPUTE, k->compute_ns / 1e3, "%.1f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_HOST, k->host_ns / 1e3, "%.1f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_LAUNCH, k->launch_ns / 1e3, "%.1f");
        rc = rc != 0 ? rc : kp_table_set_double(t, COL_OTHER, k->other_ns / 1e3, "%.1f");
        if (k->has_offset) {
            rc = rc != 0 ? rc
                         : kp_table_set_double(t, COL_OFFSET, (double) k->clock_offset_ns / 1e3,
                                               "%.1f");
        }
        else {
            rc = rc != 0 ? rc : kp_table_set_null(t, COL_OFFSET);
        }
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_FLAG, kp_compare_flag(k));
    }
    return rc;
}

/* Prints HTA's call as text or JSON; a run it cannot be computed on, its note. */
static void print_hta(const struct kp_rpcverb *v, const struct kp_compare_hta *h, long long k)
{
    if (v->format == KP_TABLE_FORMAT_JSON) {
        kp_compare_hta_json(stdout, h);
        return;
    }
    if (h->note[0] != '\0') {
        printf("%s\n", h->note);
        return;
    }
    printf("HTA's potential stragglers (num_candidates=%lld): [", k);
    for (size_t i = 0; i < h->n_stragglers; i++) {
        printf("%s%d", i ? ", " : "", h->stragglers[i]);
    }
    printf("]\ncollective: %s (stream %d), mean step %.1f us\n", h->collective, h->stream,
           h->mean_step_ns / 1e3);
    for (size_t i = 0; i < h->n_rows; i++) {
        printf("  step %" PRId64 " rank %d: normalized start %.6f, duration %.6f\n",
               h->rows[i].step, h->rows[i].rank, h->rows[i].norm_start, h->rows[i].norm_dur);
    }
}

/* The lateness map of the ranks idx[0..n): one row per rank, one column per step. */
static void print_map(const struct kp_compare_result *r, const size_t *idx, size_t n,
                      double late_frac)
{
    if (r->n_groups == 0) {
        printf("lateness map: no collectives to compare arrivals at\n");
        return;
    }
    printf("lateness map (rank x step %" PRId64 "..%" PRId64 "; '.' on time, '+' later than "
           "%.0f%% of the step after the median rank, '#' %.0f%%, ' ' no such step):\n",
           r->steps[0].step, r->steps[r->n_steps - 1].step, 100.0 * late_frac, 500.0 * late_frac);
    for (size_t i = 0; i < n; i++) {
        size_t ri = idx[i];

        printf("  %6d ", r->ranks[ri].rank);
        for (size_t j = 0; j < r->n_steps; j++) {
            const struct kp_compare_cell *cl = &r->cells[ri * r->n_steps + j];
            double lim = late_frac * r->steps[j].step_median_ns;

            putchar(!cl->present              ? ' '
                    : cl->late_ns > 5.0 * lim ? '#'
                    : cl->late_ns > lim       ? '+'
                                              : '.');
        }
        printf("  %s\n", kp_compare_flag(&r->ranks[ri]));
    }
}

/* Prints the comparison as the table, map, verdict and next commands, CSV or JSON, for the
 * ranks selected by --top and --flagged. Returns 0 or an exit status. */
static int print_result(const struct kp_rpcverb *v, const struct compare_config *cfg,
                        const struct kp_compare_result *res, double late_frac)
{
    struct kp_table *t = NULL;
    size_t *idx = calloc(res->n_ranks + 1, sizeof(*idx));
    long n = idx == NULL ? -ENOMEM : kp_compare_select(res, (size_t) cfg->top, cfg->flagged, idx);
    int rc;

    if (n < 0) {
        free(idx);
        kp_rpcverb_error(v, "out of memory");
        return KPROFCTL_EXIT_FAILED;
    }
    if (v->format == KP_TABLE_FORMAT_JSON) {
        kp_compare_json_sel(stdout, res, idx, (size_t) n);
        free(idx);
        return 0;
    }
    if ((rc = kp_rpcverb_table(v, &t)) != 0) {
        free(idx);
        return rc;
    }
    if (fill_table(t, res, idx, (size_t) n) != 0) {
        kp_rpcverb_error(v, "out of memory");
        rc = KPROFCTL_EXIT_FAILED;
    }
    else if ((rc = kp_rpcverb_print(v, t, stdout)) == 0 && v->format == KP_TABLE_FORMAT_TEXT) {
        if (n < (long) res->n_ranks) {
            printf("(%ld of %zu ranks shown%s)\n", n, res->n_ranks,
                   cfg->flagged ? ": the flagged ones" : "");
        }
        putchar('\n');
        print_map(res, idx, (size_t) n, late_frac);
        putchar('\n');
        kp_compare_offsets_line(stdout, res);
        printf("%s\n", res->verdict);
        if (res->n_stragglers > 0 || res->waited_for >= 0) { /* a rank is flagged */
            printf("next:\n");
            kp_compare_next(stdout, res, "  ");
        }
    }
    kp_table_destroy(t);
    free(idx);
    return rc;
}

static int compare_check(struct kp_rpcverb *v)
{
    const struct compare_config *cfg = v->cfg;

    if (cfg->hta && (cfg->common.csv || cfg->save_offsets)) {
        return kp_rpcverb_usage_error(v, "%s",
                                      cfg->save_offsets
                                          ? "--save-offsets goes with kprof's own comparison, "
                                            "not --hta"
                                          : "--hta prints text or --json, not --csv");
    }
    return KP_RPCVERB_RUN;
}

static int compare_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    struct compare_config *cfg = v->cfg;
    Kprof__V1__CompareRequest *req = (Kprof__V1__CompareRequest *) msg;

    req->has_step = cfg->step >= 0;
    req->step = cfg->step >= 0 ? cfg->step : 0;
    kprof__v1__compare_thresholds__init(&cfg->th);
    cfg->th.late_pct = (double) cfg->late_pct;
    cfg->th.excess_pct = (double) cfg->excess_pct;
    cfg->th.step_pct = (double) cfg->step_pct;
    req->thresholds = &cfg->th;
    req->hta = cfg->hta;
    req->hta_candidates = (uint32_t) cfg->hta_candidates;
    req->max_rows = (uint64_t) cfg->max_rows;
    req->save_offsets = cfg->save_offsets;
    return 0;
}

/* The comparison, or with --hta HTA's call, as text, CSV or JSON. */
static int compare_print(struct kp_rpcverb *v, const struct kp_table *t,
                         const ProtobufCMessage *msg)
{
    const struct compare_config *cfg = v->cfg;
    const Kprof__V1__CompareResponse *resp = (const Kprof__V1__CompareResponse *) msg;
    struct kp_compare_result *res = NULL;
    struct kp_compare_hta *hta = NULL;
    char err[1024];
    int rc = KPROFCTL_EXIT_FAILED;

    (void) t;
    if (cfg->hta) {
        if (resp->hta == NULL) {
            kp_rpcverb_error(v, "kprof-analyzer's reply is malformed: no HTA call in it");
            goto out;
        }
        if (kp_compare_hta_from_pb(resp->hta, &hta) != 0) {
            kp_rpcverb_error(v, "out of memory");
            goto out;
        }
        print_hta(v, hta, cfg->hta_candidates);
    }
    else {
        if (kp_compare_from_pb(resp, &res, err, sizeof(err)) != 0) {
            kp_rpcverb_error(v, "kprof-analyzer's reply is malformed: %s", err);
            goto out;
        }
        if (cfg->save_offsets) {
            fprintf(stderr, "kprofctl compare: saved the clock offsets of %u ranks of run %lld\n",
                    (unsigned) resp->offsets_saved, cfg->common.run);
        }
        if ((rc = print_result(v, cfg, res,
                               resp->thresholds != NULL ? resp->thresholds->late_pct / 100.0
                                                        : KP_COMPARE_DEFAULT_LATE_FRAC)) != 0) {
            goto out;
        }
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        kp_rpcverb_error(v, "cannot write the output");
        rc = KPROFCTL_EXIT_FAILED;
        goto out;
    }
    rc = KPROFCTL_EXIT_OK;
out:
    kp_compare_result_destroy(res);
    kp_compare_hta_destroy(hta);
    return rc;
}

static const struct kp_rpcverb_spec compare_spec = {
    .name = "compare",
    .synopsis =
        "usage: kprofctl compare --run R [--step S] [--top N] [--flagged] [--json|--csv]\n"
        "                        [-c COLS] [-w WIDTH] [--analyzer ADDR] [--late-pct P]\n"
        "                        [--excess-pct P] [--step-pct P] [--save-offsets]\n"
        "                        [--hta [--hta-candidates K]]\n"
        "  Which rank holds the job back, and why: one row per rank (µs), flagged ranks first\n"
        "  (stragglers: late at the collectives from their own work; late: the rank the others\n"
        "  wait for), with host and node, a rank x step lateness map, the verdict in one line\n"
        "  (with the ranks of the world missing from the run) and the next commands to run.\n"
        "  From kprof-analyzer (Analyzer.Compare; --analyzer or KPROF_ANALYZER), which caches\n"
        "  the comparison until the run changes.\n",
    .exit_ok = "shown",
    .json_help = "print one JSON object {run, world_size, missing_ranks, waited_for, next, ranks, "
                 "steps, stragglers, verdict} (--hta: {collective, note, stream, mean_step_ms, "
                 "metric, stragglers})",
    .defs = compare_defs,
    .n_defs = sizeof(compare_defs) / sizeof(compare_defs[0]),
    .cols = compare_cols,
    .n_cols = N_COLS,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN,
    .method = "Compare",
    .req_desc = &kprof__v1__compare_request__descriptor,
    .resp_desc = &kprof__v1__compare_response__descriptor,
    .check = compare_check,
    .request = compare_request,
    .print = compare_print,
};

int kprofctl_compare(int argc, char **argv)
{
    struct compare_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&compare_spec, &cfg, argc, argv);
}
