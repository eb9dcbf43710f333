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

const char *const kp_cmp_cause_names[KP_CMP_CAUSE_COUNT] = {
    [KP_CMP_COMPUTE] = "compute",
    [KP_CMP_HOST] = "host",
    [KP_CMP_LAUNCH] = "launch",
};

void kp_cmp_result_destroy(struct kp_cmp_result *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < r->n_stragglers; i++) {
        free(r->stragglers[i].steps);
    }
    free(r->stragglers);
    free(r->cells);
    free(r->steps);
    free(r->ranks);
    free(r);
}

void kp_cmp_hta_destroy(struct kp_cmp_hta *h)
{
    if (h == NULL) {
        return;
    }
    free(h->collective);
    free(h->rows);
    free(h->stragglers);
    free(h);
}

/* ---- JSON ----------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *) s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\') {
            fprintf(f, "\\%c", *p);
        }
        else if (*p < 0x20) {
            fprintf(f, "\\u%04x", *p);
        }
        else {
            fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x)
{
    if (isfinite(x)) {
        fprintf(f, "%.17g", x);
    }
    else {
        fputs("null", f);
    }
}

struct order_key {
    double step_ns;
    int rank;
    size_t i;
};

static int cmp_order(const void *pa, const void *pb)
{
    const struct order_key *a = pa, *b = pb;

    if (a->step_ns != b->step_ns) {
        return a->step_ns > b->step_ns ? -1 : 1;
    }
    return (a->rank > b->rank) - (a->rank < b->rank);
}

int kp_cmp_order(const struct kp_cmp_result *r, size_t *idx)
{
    struct order_key *k = calloc(r->n_ranks + 1, sizeof(*k));

    if (k == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < r->n_ranks; i++) {
        k[i] = (struct order_key){ r->ranks[i].step_ns, r->ranks[i].rank, i };
    }
    qsort(k, r->n_ranks, sizeof(*k), cmp_order);
    for (size_t i = 0; i < r->n_ranks; i++) {
        idx[i] = k[i].i;
    }
    free(k);
    return 0;
}

const char *kp_cmp_flag(const struct kp_cmp_rank *rk)
{
    return rk->straggler ? "straggler" : rk->waits ? "waits" : "";
}

void kp_cmp_json(FILE *f, const struct kp_cmp_result *r)
{
    size_t *idx = calloc(r->n_ranks + 1, sizeof(*idx));
    bool ordered = idx != NULL && kp_cmp_order(r, idx) == 0;

    fprintf(f, "{\"run\": %" PRId64 ", \"ranks\": [", r->run);
    for (size_t i = 0; i < r->n_ranks; i++) {
        const struct kp_cmp_rank *rk = &r->ranks[i];

        if (ordered) {
            rk = &r->ranks[idx[i]];
        }
        fprintf(f, "%s\n  {\"rank\": %d, \"step_ms\": ", i ? "," : "", rk->rank);
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
        fprintf(f, ", \"late_steps\": %zu, \"flag\": ", rk->n_late_steps);
        json_str(f, kp_cmp_flag(rk));
        fputc('}', f);
    }
    fputs("],\n \"steps\": [", f);
    for (size_t j = 0; j < r->n_steps; j++) {
        const struct kp_cmp_step *s = &r->steps[j];

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
        if (s->last_rank >= 0) {
            fprintf(f, "%d", s->last_rank);
        }
        else {
            fputs("null", f);
        }
        fputc('}', f);
    }
    fputs("],\n \"stragglers\": [", f);
    for (size_t i = 0; i < r->n_stragglers; i++) {
        const struct kp_cmp_straggler *s = &r->stragglers[i];

        fprintf(f, "%s\n  {\"rank\": %d, \"steps\": [", i ? "," : "", s->rank);
        for (size_t k = 0; k < s->n_steps; k++) {
            fprintf(f, "%s%" PRId64, k ? ", " : "", s->steps[k]);
        }
        fputs("], \"late_ms\": ", f);
        json_num(f, s->late_ns / 1e6);
        fputs(", \"max_late_ms\": ", f);
        json_num(f, s->max_late_ns / 1e6);
        fputs(", \"cause\": ", f);
        json_str(f, kp_cmp_cause_names[s->cause]);
        fputs(", \"excess_ms\": ", f);
        json_num(f, s->excess_ns[s->cause] / 1e6);
        for (int w = 0; w < 3; w++) {
            static const char *const keys[3] = { "excess_ms_by_cause", "own_ms_by_cause",
                                                 "median_ms_by_cause" };

            fprintf(f, ", \"%s\": {", keys[w]);
            for (int c = 0; c < KP_CMP_CAUSE_COUNT; c++) {
                fprintf(f, "%s\"%s\": ", c ? ", " : "", kp_cmp_cause_names[c]);
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
    json_str(f, r->verdict);
    fputs("}\n", f);
    free(idx);
}

void kp_cmp_hta_json(FILE *f, const struct kp_cmp_hta *h)
{
    fputs("{\"collective\": ", f);
    json_str(f, h->collective);
    fprintf(f, ", \"stream\": %d, \"mean_step_ms\": ", h->stream);
    json_num(f, h->mean_step_ns / 1e6);
    fputs(", \"metric\": [", f);
    for (size_t i = 0; i < h->n_rows; i++) {
        const struct kp_cmp_hta_row *w = &h->rows[i];

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
