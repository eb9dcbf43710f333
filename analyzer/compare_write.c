/* The comparison's writers and destructors (compare.h): kprofctl compare prints a reply
 * turned back into a result (compare_pb.h) with them, in kp_analyzer_print, which links no
 * libpq. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "kp_json.h"

const char *const kp_compare_cause_names[KP_COMPARE_CAUSE_COUNT] = {
    [KP_COMPARE_COMPUTE] = "compute",
    [KP_COMPARE_HOST] = "host",
    [KP_COMPARE_LAUNCH] = "launch",
};

void kp_compare_result_destroy(struct kp_compare_result *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < r->n_stragglers; i++) {
        free(r->stragglers[i].steps);
    }
    free(r->stragglers);
    free(r->missing);
    free(r->cells);
    free(r->steps);
    free(r->ranks);
    free(r);
}

/* ---- JSON ----------------------------------------------------------------------------- */

static void json_num(FILE *f, double x)
{
    if (isfinite(x)) {
        fprintf(f, "%.17g", x);
    }
    else {
        fputs("null", f);
    }
}

/* n, or null when negative (-1: none). */
static void json_int_or_null(FILE *f, int n)
{
    if (n >= 0) {
        fprintf(f, "%d", n);
    }
    else {
        fputs("null", f);
    }
}

struct order_key {
    int group;      /* 0 straggler, 1 late, 2 the others */
    double late_ns; /* stragglers: their lateness, latest first */
    double step_ns;
    int rank;
    size_t i;
};

static int cmp_order(const void *pa, const void *pb)
{
    const struct order_key *a = pa, *b = pb;

    if (a->group != b->group) {
        return a->group < b->group ? -1 : 1;
    }
    if (a->group == 0 && a->late_ns != b->late_ns) {
        return a->late_ns > b->late_ns ? -1 : 1;
    }
    if (a->step_ns != b->step_ns) {
        return a->step_ns > b->step_ns ? -1 : 1;
    }
    return (a->rank > b->rank) - (a->rank < b->rank);
}

int kp_compare_order(const struct kp_compare_result *r, size_t *idx)
{
    struct order_key *k = calloc(r->n_ranks + 1, sizeof(*k));

    if (k == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < r->n_ranks; i++) {
        const struct kp_compare_rank *rk = &r->ranks[i];

        k[i] = (struct order_key){ rk->straggler ? 0
                                   : rk->late    ? 1
                                                 : 2,
                                   rk->late_ns, rk->step_ns, rk->rank, i };
    }
    qsort(k, r->n_ranks, sizeof(*k), cmp_order);
    for (size_t i = 0; i < r->n_ranks; i++) {
        idx[i] = k[i].i;
    }
    free(k);
    return 0;
}

const char *kp_compare_flag(const struct kp_compare_rank *rk)
{
    return rk->straggler ? "straggler" : rk->late ? "late" : rk->waits ? "waits" : "";
}

bool kp_compare_flagged(const struct kp_compare_rank *rk)
{
    return rk->straggler || rk->late;
}

long kp_compare_select(const struct kp_compare_result *r, size_t top, bool flagged, size_t *idx)
{
    size_t n = 0;

    if (kp_compare_order(r, idx) != 0) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < r->n_ranks && (top == 0 || n < top); i++) {
        if (!flagged || kp_compare_flagged(&r->ranks[idx[i]])) {
            idx[n++] = idx[i];
        }
    }
    return (long) n;
}

long kp_compare_median_rank(const struct kp_compare_result *r)
{
    long best = -1;
    bool any_free = false;

    for (size_t i = 0; i < r->n_ranks; i++) {
        any_free = any_free || !kp_compare_flagged(&r->ranks[i]);
    }
    for (size_t i = 0; i < r->n_ranks; i++) {
        if (any_free && kp_compare_flagged(&r->ranks[i])) {
            continue;
        }
        if (best < 0 || fabs(r->ranks[i].step_ns - r->step_median_ns) <
                            fabs(r->ranks[best].step_ns - r->step_median_ns)) {
            best = (long) i;
        }
    }
    return best;
}

/* The first flagged rank (kp_compare_order's first) and the median rank, or false. */
static bool next_ranks(const struct kp_compare_result *r, int *flagged, int *median)
{
    const struct kp_compare_rank *first = NULL;
    long m;

    for (size_t i = 0; i < r->n_ranks; i++) {
        const struct kp_compare_rank *rk = &r->ranks[i];

        if (rk->straggler && (first == NULL || !first->straggler || rk->late_ns > first->late_ns)) {
            first = rk;
        }
        else if (rk->late && first == NULL) {
            first = rk;
        }
    }
    if (first == NULL || (m = kp_compare_median_rank(r)) < 0) {
        return false;
    }
    *flagged = first->rank;
    *median = r->ranks[m].rank;
    return true;
}

/* The next commands on r: the first flagged rank's breakdown, its export, the median rank's
 * export. Returns 3, or 0 when no rank is flagged. */
static int next_cmds(const struct kp_compare_result *r, char cmd[3][128])
{
    int x, m;

    if (!next_ranks(r, &x, &m)) {
        return 0;
    }
    snprintf(cmd[0], sizeof(cmd[0]), "kprofctl breakdown --run %" PRId64 " --rank %d", r->run, x);
    for (int k = 1; k < 3; k++) {
        int rank = k == 1 ? x : m;

        snprintf(cmd[k], sizeof(cmd[k]),
                 "kprofctl export --run %" PRId64 " --rank %d -o run%" PRId64 "-rank%d.json",
                 r->run, rank, r->run, rank);
    }
    return 3;
}

void kp_compare_next(FILE *f, const struct kp_compare_result *r, const char *indent)
{
    char cmd[3][128];

    if (next_cmds(r, cmd) == 3) {
        fprintf(f, "%s%s\n%s%s && %s\n", indent, cmd[0], indent, cmd[1], cmd[2]);
    }
}

void kp_compare_offsets_line(FILE *f, const struct kp_compare_result *r)
{
    const struct kp_compare_rank *wide = NULL;
    int none[8];
    size_t n_none = 0;

    for (size_t i = 0; i < r->n_ranks; i++) {
        const struct kp_compare_rank *rk = &r->ranks[i];

        if (!rk->has_offset) {
            if (n_none < sizeof(none) / sizeof(none[0])) {
                none[n_none] = rk->rank;
            }
            n_none++;
        }
        else if (i > 0 && (wide == NULL || rk->offset_spread_ns > wide->offset_spread_ns)) {
            wide = rk;
        }
    }
    if (r->n_ranks < 2) {
        return;
    }
    if (r->n_offset_colls == 0) {
        fprintf(f, "clock offsets: none (no collective that every rank finishes together, "
                   "point-to-point ones excluded): every rank's clock is taken as is\n");
        return;
    }
    fprintf(f,
            "clock offsets: from %zu collectives every rank finishes together, over every step "
            "of the run (a --step view uses the same)",
            r->n_offset_colls);
    if (wide != NULL) {
        fprintf(f, "; spread (interquartile range) up to %.1f us (rank %d)",
                wide->offset_spread_ns / 1e3, wide->rank);
    }
    if (n_none > 0) {
        fprintf(f, "; none for %zu rank%s (", n_none, n_none == 1 ? "" : "s");
        for (size_t i = 0; i < n_none && i < sizeof(none) / sizeof(none[0]); i++) {
            fprintf(f, "%s%d", i ? ", " : "", none[i]);
        }
        fprintf(f, "%s): their clocks are taken as is",
                n_none > sizeof(none) / sizeof(none[0]) ? ", ..." : "");
    }
    fputc('\n', f);
}

void kp_compare_json(FILE *f, const struct kp_compare_result *r)
{
    size_t *idx = calloc(r->n_ranks + 1, sizeof(*idx));

    if (idx == NULL || kp_compare_order(r, idx) != 0) { /* then in rank order */
        free(idx);
        idx = NULL;
    }
    kp_compare_json_sel(f, r, idx, r->n_ranks);
    free(idx);
}

void kp_compare_json_sel(FILE *f, const struct kp_compare_result *r, const size_t *idx, size_t n)
{
    char cmd[3][128];
    int n_cmd = next_cmds(r, cmd);

    fprintf(f, "{\"run\": %" PRId64 ", \"world_size\": %d, \"missing_ranks\": [", r->run,
            r->world_size);
    for (size_t i = 0; i < r->n_missing; i++) {
        fprintf(f, "%s%d", i ? ", " : "", r->missing[i]);
    }
    fputs("],\n \"waited_for\": ", f);
    json_int_or_null(f, r->waited_for);
    fputs(", \"hta_rank\": ", f);
    json_int_or_null(f, r->hta_rank);
    fprintf(f,
            ", \"hta_rank_steps\": %zu, \"collectives\": %zu, \"p2p_collectives\": %zu, "
            "\"offset_collectives\": %zu, \"ranks_without_offset\": %zu,\n \"next\": [",
            r->hta_rank_steps, r->n_groups, r->n_p2p, r->n_offset_colls, r->n_no_offset);
    for (int k = 0; k < n_cmd; k++) {
        fputs(k ? ", " : "", f);
        kp_json_fputs(f, cmd[k]);
    }
    fputs("],\n \"ranks\": [", f);
    for (size_t i = 0; i < n; i++) {
        const struct kp_compare_rank *rk = &r->ranks[idx != NULL ? idx[i] : i];
        size_t ri = (size_t) (rk - r->ranks);

        fprintf(f, "%s\n  {\"rank\": %d, \"host\": ", i ? "," : "", rk->rank);
        kp_json_fputs(f, rk->host);
        fprintf(f, ", \"node\": ");
        json_int_or_null(f, rk->node);
        fprintf(f, ", \"local_rank\": ");
        json_int_or_null(f, rk->local_rank);
        fputs(", \"step_ms\": ", f);
        json_num(f, rk->step_ns / 1e6);
        fputs(", \"vs_median\": ", f);
        json_num(f, 100.0 * rk->vs_median);
        fputs(", \"collective_ms\": ", f);
        json_num(f, rk->coll_ns / 1e6);
        fputs(", \"late_ms\": ", f);
        json_num(f, rk->late_ns / 1e6);
        fputs(", \"compute_ms\": ", f);
        json_num(f, rk->compute_ns / 1e6);
        fputs(", \"host_ms\": ", f);
        json_num(f, rk->host_ns / 1e6);
        fputs(", \"launch_ms\": ", f);
        json_num(f, rk->launch_ns / 1e6);
        fputs(", \"other_ms\": ", f);
        json_num(f, rk->other_ns / 1e6);
        fputs(", \"clock_offset_ms\": ", f);
        json_num(f, (double) rk->clock_offset_ns / 1e6);
        fprintf(f, ", \"has_offset\": %s, \"clock_offset_spread_ms\": ",
                rk->has_offset ? "true" : "false");
        json_num(f, rk->offset_spread_ns / 1e6);
        fprintf(f, ", \"offset_collectives\": %zu", rk->offset_n);
        fprintf(f, ", \"late_steps\": %zu, \"flag\": ", rk->n_late_steps);
        kp_json_fputs(f, kp_compare_flag(rk));
        fputs(", \"late_us_by_step\": [", f);
        for (size_t j = 0; j < r->n_steps; j++) {
            const struct kp_compare_cell *cl =
                r->cells != NULL ? &r->cells[ri * r->n_steps + j] : NULL;

            fputs(j ? ", " : "", f);
            if (cl != NULL && cl->present) {
                json_num(f, cl->late_ns / 1e3);
            }
            else {
                fputs("null", f);
            }
        }
        fputs("]}", f);
    }
    fputs("],\n \"steps\": [", f);
    for (size_t j = 0; j < r->n_steps; j++) {
        const struct kp_compare_step *s = &r->steps[j];

        fprintf(f, "%s\n  {\"step\": %" PRId64 ", \"ranks\": %zu, \"collectives\": %zu",
                j ? "," : "", s->step, s->n_ranks, s->n_coll);
        fputs(", \"step_median_ms\": ", f);
        json_num(f, s->step_median_ns / 1e6);
        fputs(", \"step_max_ms\": ", f);
        json_num(f, s->step_max_ns / 1e6);
        fputs(", \"step_ratio\": ", f);
        json_num(f, s->step_ratio);
        fputs(", \"collective_median_ms\": ", f);
        json_num(f, s->coll_median_ns / 1e6);
        fputs(", \"collective_max_ms\": ", f);
        json_num(f, s->coll_max_ns / 1e6);
        fputs(", \"collective_ratio\": ", f);
        json_num(f, s->coll_ratio);
        fputs(", \"last_rank\": ", f);
        json_int_or_null(f, s->last_rank);
        fputs(", \"hta_rank\": ", f);
        json_int_or_null(f, s->hta_rank);
        fputc('}', f);
    }
    fputs("],\n \"stragglers\": [", f);
    for (size_t i = 0; i < r->n_stragglers; i++) {
        const struct kp_compare_straggler *s = &r->stragglers[i];

        fprintf(f, "%s\n  {\"rank\": %d, \"steps\": [", i ? "," : "", s->rank);
        for (size_t k = 0; k < s->n_steps; k++) {
            fprintf(f, "%s%" PRId64, k ? ", " : "", s->steps[k]);
        }
        fputs("], \"late_ms\": ", f);
        json_num(f, s->late_ns / 1e6);
        fputs(", \"max_late_ms\": ", f);
        json_num(f, s->max_late_ns / 1e6);
        fputs(", \"cause\": ", f);
        kp_json_fputs(f, kp_compare_cause_names[s->cause]);
        fputs(", \"excess_ms\": ", f);
        json_num(f, s->excess_ns[s->cause] / 1e6);
        for (int w = 0; w < 3; w++) {
            static const char *const keys[3] = { "excess_ms_by_cause", "own_ms_by_cause",
                                                 "median_ms_by_cause" };

            fprintf(f, ", \"%s\": {", keys[w]);
            for (int c = 0; c < KP_COMPARE_CAUSE_COUNT; c++) {
                fprintf(f, "%s\"%s\": ", c ? ", " : "", kp_compare_cause_names[c]);
                json_num(f, (w == 0   ? s->excess_ns[c]
                             : w == 1 ? s->own_ns[c]
                                      : s->own_ns[c] - s->excess_ns[c]) /
                                1e6);
            }
            fputc('}', f);
        }
        fputc('}', f);
    }
    fputs("],\n \"verdict\": ", f);
    kp_json_fputs(f, r->verdict);
    fputs("}\n", f);
}

void kp_compare_hta_destroy(struct kp_compare_hta *h)
{
    if (h == NULL) {
        return;
    }
    free(h->collective);
    free(h->rows);
    free(h->stragglers);
    free(h);
}

void kp_compare_hta_json(FILE *f, const struct kp_compare_hta *h)
{
    fputs("{\"collective\": ", f);
    kp_json_fputs(f, h->collective);
    fputs(", \"note\": ", f);
    kp_json_fputs(f, h->note);
    fprintf(f, ", \"stream\": %d, \"mean_step_ms\": ", h->stream);
    json_num(f, h->mean_step_ns / 1e6);
    fputs(", \"metric\": [", f);
    for (size_t i = 0; i < h->n_rows; i++) {
        const struct kp_compare_hta_row *w = &h->rows[i];

        fprintf(f, "%s\n  {\"rank\": %d, \"step\": %" PRId64 ", \"ts_us\": ", i ? "," : "", w->rank,
                w->step);
        json_num(f, (double) w->start_ns / 1e3);
        fputs(", \"dur_us\": ", f);
        json_num(f, (double) w->dur_ns / 1e3);
        fputs(", \"normalized_start_time\": ", f);
        json_num(f, w->norm_start);
        fputs(", \"duration\": ", f);
        json_num(f, w->norm_dur);
        fputc('}', f);
    }
    fputs("],\n \"stragglers\": [", f);
    for (size_t i = 0; i < h->n_stragglers; i++) {
        fprintf(f, "%s%d", i ? ", " : "", h->stragglers[i]);
    }
    fputs("]}\n", f);
}
