/* kp_an: the views as JSON (the plugin's field names). */
#define _GNU_SOURCE /* qsort_r */
#include "an_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

/* ---- JSON ----------------------------------------------------------------------------- */

/* ns as exact decimal µs. */
static void json_us(FILE *f, int64_t ns)
{
    uint64_t u = ns < 0 ? (uint64_t) 0 - (uint64_t) ns : (uint64_t) ns;
    unsigned frac = (unsigned) (u % 1000);

    if (ns < 0) {
        fputc('-', f);
    }
    if (frac == 0) {
        fprintf(f, "%" PRIu64, u / 1000);
        return;
    }
    if (frac % 100 == 0) {
        fprintf(f, "%" PRIu64 ".%u", u / 1000, frac / 100);
    }
    else if (frac % 10 == 0) {
        fprintf(f, "%" PRIu64 ".%02u", u / 1000, frac / 10);
    }
    else {
        fprintf(f, "%" PRIu64 ".%03u", u / 1000, frac);
    }
}

void kp_an_json_us(FILE *f, int64_t ns)
{
    json_us(f, ns);
}

static void json_dbl(FILE *f, double v)
{
    if (v == (double) (int64_t) v && v < 1e15 && v > -1e15) {
        fprintf(f, "%" PRId64, (int64_t) v);
    }
    else {
        fprintf(f, "%.17g", v);
    }
}

void kp_an_breakdown_json(FILE *f, const struct kp_an_breakdown *b)
{
    fprintf(f,
            "{\"flags\": {\"has_runtime\": %s, \"has_kernel\": %s, \"has_memcpy_or_memset\": "
            "%s, \"has_communication\": %s}, \"comm_node_count\": %zu, \"step_count\": %zu, "
            "\"steps\": [",
            b->has_runtime ? "true" : "false", b->has_kernel ? "true" : "false",
            b->has_memcpy_or_memset ? "true" : "false", b->has_communication ? "true" : "false",
            b->comm_node_count, b->n_steps);
    for (size_t s = 0; s < b->n_steps; s++) {
        const struct kp_an_step *st = &b->steps[s];

        fprintf(f, "%s{\"index\": %zu, \"name\": ", s ? ", " : "", s);
        kp_json_fputs(f, st->name);
        fprintf(f, ", \"start_us\": ");
        json_us(f, st->start_ns);
        fprintf(f, ", \"end_us\": ");
        json_us(f, st->end_ns);
        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            fprintf(f, ", \"%s\": ", kp_an_cat_keys[c]);
            json_us(f, st->cost_ns[c]);
        }
        fprintf(f, ", \"total_us\": ");
        json_us(f, st->end_ns - st->start_ns);
        fprintf(f, ", \"overlap\": {\"computation_us\": ");
        json_us(f, st->computation_ns - st->overlap_ns);
        fprintf(f, ", \"overlapping_us\": ");
        json_us(f, st->overlap_ns);
        fprintf(f, ", \"communication_us\": ");
        json_us(f, st->communication_ns - st->overlap_ns);
        fprintf(f, ", \"other_us\": ");
        json_us(f, st->end_ns - st->start_ns + st->overlap_ns - st->computation_ns -
                       st->communication_ns);
        fputs("}}", f);
    }
    fprintf(f, "], \"avg_step\": {");
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        fprintf(f, "%s\"%s\": ", c ? ", " : "", kp_an_cat_keys[c]);
        json_dbl(f, b->avg_ns[c] / 1000.0);
    }
    fprintf(f, ", \"total_us\": ");
    json_dbl(f, b->avg_total_ns / 1000.0);
    fprintf(f, "}, \"gpu\": {\"gpu_ids\": [");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s%d", i ? ", " : "", b->gpu_ids[i]);
    }
    fprintf(f, "], \"per_device\": {");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s\"%d\": {\"utilization\": ", i ? ", " : "", b->gpu_ids[i]);
        json_dbl(f, b->gpu_utilization[i]);
        fprintf(f, ", \"est_sm_efficiency\": ");
        if (b->est_sm_efficiency_defined[i]) {
            json_dbl(f, b->est_sm_efficiency[i]);
        }
        else {
            fprintf(f, "null");
        }
        fprintf(f, ", \"est_achieved_occupancy\": ");
        if (b->est_achieved_occupancy_defined[i]) {
            json_dbl(f, b->est_achieved_occupancy[i]);
        }
        else {
            fprintf(f, "null");
        }
        fputc('}', f);
    }
    fprintf(f, "}, \"util_timeline\": {");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s\"%d\": [", i ? ", " : "", b->gpu_ids[i]);
        for (size_t j = 0; j < b->n_util_points[i]; j++) {
            fprintf(f, "%s[", j ? ", " : "");
            json_us(f, b->util_timeline[i][j].t_ns); /* exact: epoch ns exceed a double */
            fprintf(f, ", ");
            json_dbl(f, b->util_timeline[i][j].value);
            fputc(']', f);
        }
        fputc(']', f);
    }
    fprintf(f, "}, \"sm_efficiency_ranges\": {");
    for (size_t i = 0; i < b->n_gpus; i++) {
        fprintf(f, "%s\"%d\": [", i ? ", " : "", b->gpu_ids[i]);
        for (size_t j = 0; j < b->n_sm_ranges[i]; j++) {
            const struct kp_an_sm_range *s = &b->sm_ranges[i][j];

            fprintf(f, "%s[", j ? ", " : "");
            json_us(f, s->start_ns);
            fprintf(f, ", ");
            json_us(f, s->end_ns);
            fprintf(f, ", ");
            json_dbl(f, s->value);
            fputc(']', f);
        }
        fputc(']', f);
    }
    fprintf(f, "}}}");
}

static double ratio(int64_t num, int64_t den)
{
    return den ? (double) num / (double) den : 0.0;
}

void kp_an_ops_json(FILE *f, const struct kp_an_table *t)
{
    const struct kp_an_op_row *rows = t->rows;

    fprintf(f, "{\"count\": %zu, \"rows\": [", t->n);
    for (size_t i = 0; i < t->n; i++) {
        const struct kp_an_op_row *r = &rows[i];

        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        kp_json_fputs(f, r->name);
        fprintf(f, ", \"input_shape\": ");
        kp_json_fputs(f, r->input_shape);
        fprintf(f, ", \"calls\": %" PRIu64 ", \"host_total_us\": ", r->calls);
        json_us(f, r->host_total_ns);
        fprintf(f, ", \"host_self_us\": ");
        json_us(f, r->host_self_ns);
        fprintf(f, ", \"device_total_us\": ");
        json_us(f, r->device_total_ns);
        fprintf(f, ", \"device_self_us\": ");
        json_us(f, r->device_self_ns);
        fprintf(f, ", \"tc_eligible\": %s, \"tc_self_ratio\": ", r->tc_eligible ? "true" : "false");
        json_dbl(f, ratio(r->tc_self_ns, r->device_self_ns));
        fprintf(f, ", \"tc_total_ratio\": ");
        json_dbl(f, ratio(r->tc_total_ns, r->device_total_ns));
        fputc('}', f);
    }
    fprintf(f, "]}");
}

static void json_dim(FILE *f, const char *s)
{
    fputs(strcmp(s, "None") == 0 ? "null" : s, f); /* "[x, y, z]" is JSON already */
}

void kp_an_kernels_json(FILE *f, const struct kp_an_table *t, bool by_op)
{
    const struct kp_an_kernel_row *rows = t->rows;

    fprintf(f, "{\"count\": %zu, \"rows\": [", t->n);
    for (size_t i = 0; i < t->n; i++) {
        const struct kp_an_kernel_row *r = &rows[i];

        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        kp_json_fputs(f, r->name);
        if (by_op) {
            fprintf(f, ", \"op_name\": ");
            kp_json_fputs(f, r->op_name);
            fprintf(f, ", \"grid\": ");
            json_dim(f, r->grid);
            fprintf(f, ", \"block\": ");
            json_dim(f, r->block);
            fprintf(f,
                    ", \"registers_per_thread\": %" PRId64 ", \"shared_memory\": %" PRId64
                    ", \"op_tc_eligible\": %s",
                    r->registers, r->shared_memory, r->op_tc_eligible ? "true" : "false");
        }
        fprintf(f, ", \"calls\": %" PRIu64 ", \"total_us\": ", r->calls);
        json_us(f, r->total_ns);
        fprintf(f, ", \"mean_us\": ");
        json_dbl(f, (double) r->total_ns / (double) r->calls / 1000.0);
        fprintf(f, ", \"min_us\": ");
        json_us(f, r->min_ns);
        fprintf(f, ", \"max_us\": ");
        json_us(f, r->max_ns);
        fprintf(f, ", \"mean_blocks_per_sm\": ");
        json_dbl(f, r->mean_blocks_per_sm);
        fprintf(f, ", \"mean_est_achieved_occupancy\": ");
        json_dbl(f, r->mean_est_achieved_occupancy);
        fprintf(f, ", \"tc_used\": %s}", r->tc_used ? "true" : "false");
    }
    fprintf(f, "]}");
}

void kp_an_tc_json(FILE *f, const struct kp_an_tc *t)
{
    fprintf(f, "{\"tc_ratio_per_gpu\": ");
    if (!t->tc_ratio_defined) {
        fprintf(f, "null");
    }
    else {
        fputc('{', f);
        for (size_t i = 0; i < t->n_gpus; i++) {
            fprintf(f, "%s\"%d\": ", i ? ", " : "", t->gpu_ids[i]);
            json_dbl(f, t->tc_ratio[i]);
        }
        fputc('}', f);
    }
    fprintf(f, ", \"tc_eligible_ops_kernel_ratio\": ");
    json_dbl(f, t->eligible_ops_kernel_ratio);
    fputc('}', f);
}
