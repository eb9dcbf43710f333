/* kp_hta_write_json: HTA's analyses as JSON (hta.h), what kprof-analyze hta prints. */
#include "hta_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kp_json.h"

static const char *const idle_cat_names[3] = { "host_wait", "kernel_wait", "other" };

/* A number, or null for NaN and infinities. */
static void json_num(FILE *f, double v)
{
    if (!isfinite(v)) {
        fputs("null", f);
    }
    else if (v == floor(v) && fabs(v) < 1e15) {
        fprintf(f, "%.0f", v);
    }
    else {
        fprintf(f, "%.17g", v);
    }
}

/* ns as µs. */
static void json_us(FILE *f, double ns)
{
    json_num(f, ns / 1000.0);
}

static void json_stats(FILE *f, const struct kp_hta_stats *s, bool us)
{
    const double vals[7] = { s->mean, s->std, s->min, s->q25, s->q50, s->q75, s->max };
    static const char *const keys[7] = { "mean", "std", "min", "25%", "50%", "75%", "max" };

    fprintf(f, "{\"count\": %zu", s->count);
    for (int i = 0; i < 7; i++) {
        fprintf(f, ", \"%s\": ", keys[i]);
        if (us) {
            json_us(f, vals[i]);
        }
        else {
            json_num(f, vals[i]);
        }
    }
    fputc('}', f);
}

static void w_temporal(const struct kp_hta *h, FILE *f)
{
    const struct kp_hta_temporal *t = &h->temporal;

    fputs("\"idle_time_us\": ", f);
    json_us(f, (double) t->idle_ns);
    fputs(", \"compute_time_us\": ", f);
    json_us(f, (double) t->compute_ns);
    fputs(", \"non_compute_time_us\": ", f);
    json_us(f, (double) t->non_compute_ns);
    fputs(", \"kernel_time_us\": ", f);
    json_us(f, (double) t->kernel_ns);
    fputs(", \"idle_time_pctg\": ", f);
    json_num(f, t->idle_pct);
    fputs(", \"compute_time_pctg\": ", f);
    json_num(f, t->compute_pct);
    fputs(", \"non_compute_time_pctg\": ", f);
    json_num(f, t->non_compute_pct);
}

static void w_idle(const struct kp_hta *h, FILE *f)
{
    fputs("\"streams\": [", f);
    for (size_t s = 0; s < h->n_idle; s++) {
        const struct kp_hta_idle_stream *is = &h->idle[s];
        bool first = true;

        fprintf(f, "%s{\"stream\": %" PRId64 ", \"categories\": [", s ? ", " : "", is->stream);
        for (int c = 0; c < 3; c++) {
            if (!is->present[c]) {
                continue;
            }
            fprintf(f, "%s{\"idle_category\": \"%s\", \"idle_time_us\": ", first ? "" : ", ",
                    idle_cat_names[c]);
            json_us(f, (double) is->idle_ns[c]);
            fputs(", \"idle_time_ratio\": ", f);
            json_num(f, is->ratio[c]);
            fputs(", \"interval_stats_us\": ", f);
            json_stats(f, &is->stats[c], true);
            fputc('}', f);
            first = false;
        }
        fputs("]}", f);
    }
    fputc(']', f);
}

static void w_overlap(const struct kp_hta *h, FILE *f)
{
    fputs("\"comm_time_us\": ", f);
    json_us(f, (double) h->overlap.comm_ns);
    fputs(", \"overlap_time_us\": ", f);
    json_us(f, (double) h->overlap.overlap_ns);
    fputs(", \"comp_comm_overlap_pctg\": ", f);
    json_num(f, h->overlap.pct);
}

static void w_kernels(const struct kp_hta *h, FILE *f)
{
    bool first = true;
    char label[128];

    fputs("\"kernel_types\": [", f);
    for (unsigned m = 1; m < 8; m++) {
        if (h->type_time[m] == 0) {
            continue;
        }
        kp_hta_type_label(m, label, sizeof(label));
        fprintf(f, "%s{\"kernel_type\": \"%s\", \"sum_us\": ", first ? "" : ", ", label);
        json_us(f, (double) h->type_time[m]);
        fputc('}', f);
        first = false;
    }
    fputs("], \"kernels\": [", f);
    for (size_t i = 0; i < h->n_krows; i++) {
        const struct kp_hta_kernel_row *r = &h->krows[i];

        fputs(i ? ", {\"name\": " : "{\"name\": ", f);
        kp_json_fputs(f, r->name);
        fprintf(f, ", \"kernel_type\": \"%s\", \"sum_us\": ", kp_hta_ktype_names[r->type]);
        json_us(f, r->sum_ns);
        fputs(", \"max_us\": ", f);
        json_us(f, r->max_ns);
        fputs(", \"min_us\": ", f);
        json_us(f, r->min_ns);
        fputs(", \"mean_us\": ", f);
        json_us(f, r->mean_ns);
        fputs(", \"std_us\": ", f);
        json_us(f, r->std_ns);
        fputc('}', f);
    }
    fputc(']', f);
}

static void w_launch(const struct kp_hta *h, FILE *f)
{
    const struct kp_hta_launch_summary *s = &h->lsum;

    fprintf(f, "\"summary\": {\"n\": %zu, \"cpu_duration_mean_us\": ", s->n);
    json_us(f, s->cpu_mean_ns);
    fputs(", \"gpu_duration_mean_us\": ", f);
    json_us(f, s->gpu_mean_ns);
    fputs(", \"launch_delay_mean_us\": ", f);
    json_us(f, s->delay_mean_ns);
    fputs(", \"launch_delay_p50_us\": ", f);
    json_us(f, s->delay_p50_ns);
    fputs(", \"launch_delay_max_us\": ", f);
    json_us(f, s->delay_max_ns);
    fprintf(f,
            ", \"n_gpu_shorter_than_cpu\": %zu, \"n_runtime_outliers\": %zu, "
            "\"n_launch_delay_outliers\": %zu, \"runtime_cutoff_us\": %d, "
            "\"launch_delay_cutoff_us\": %d}, \"launches\": [",
            s->n_gpu_shorter, s->n_runtime_outliers, s->n_delay_outliers,
            KP_HTA_RUNTIME_CUTOFF_NS / 1000, KP_HTA_LAUNCH_DELAY_CUTOFF_NS / 1000);
    for (size_t i = 0; i < h->n_launches; i++) {
        const struct kp_hta_launch_row *l = &h->launches[i];

        fprintf(f, "%s{\"correlation\": %" PRId64 ", \"cpu_duration_us\": ", i ? ", " : "",
                l->correlation);
        json_us(f, (double) l->cpu_ns);
        fputs(", \"gpu_duration_us\": ", f);
        json_us(f, (double) l->gpu_ns);
        fputs(", \"launch_delay_us\": ", f);
        json_us(f, (double) l->delay_ns);
        fputc('}', f);
    }
    fputc(']', f);
}

static void w_queue(const struct kp_hta *h, FILE *f)
{
    fputs("\"streams\": [", f);
    for (size_t i = 0; i < h->n_queue; i++) {
        const struct kp_hta_queue_stream *q = &h->queue[i];

        fprintf(f, "%s{\"stream\": %" PRId64 ", \"queue_length\": ", i ? ", " : "", q->stream);
        json_stats(f, &q->stats, false);
        fputs(", \"duration_at_max_queue_length_us\": ", f);
        json_us(f, (double) q->blocked_ns);
        fputs(", \"relative_duration_at_max_queue_length\": ", f);
        json_num(f, q->blocked_rel);
        fputc('}', f);
    }
    fprintf(f, "], \"max_queue_length\": %d", KP_HTA_MAX_QUEUE_LENGTH);
}

static void w_membw(const struct kp_hta *h, FILE *f)
{
    fputs("\"kinds\": [", f);
    for (size_t i = 0; i < h->n_membw; i++) {
        const struct kp_hta_membw_row *r = &h->membw[i];

        fputs(i ? ", {\"name\": " : "{\"name\": ", f);
        kp_json_fputs(f, r->name);
        fputs(", \"memory_bw_gbps\": ", f);
        json_stats(f, &r->stats, false);
        fprintf(f, ", \"events\": %zu, \"bandwidth_from_bytes_per_ns\": %zu}", r->events,
                r->computed);
    }
    fputc(']', f);
}

int kp_hta_write_json(const struct kp_hta *h, const char *analysis, FILE *f)
{
    static const struct {
        const char *name;
        void (*fn)(const struct kp_hta *, FILE *);
    } tab[] = { { "temporal", w_temporal }, { "idle", w_idle },     { "overlap", w_overlap },
                { "kernels", w_kernels },   { "launch", w_launch }, { "queue", w_queue },
                { "membw", w_membw } };

    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
        if (strcmp(tab[i].name, analysis) != 0) {
            continue;
        }
        fprintf(f,
                "{\"analysis\": \"%s\", \"hta_compat\": {\"rounded_to_us\": %s, "
                "\"last_step_dropped\": %s, \"consecutive_kernel_delay_us\": ",
                analysis, h->opts.exact_ns ? "false" : "true", h->dropped ? "true" : "false");
        json_us(f, (double) h->opts.consecutive_kernel_delay_ns);
        fputs("}, ", f);
        tab[i].fn(h, f);
        fputs("}\n", f);
        return 0;
    }
    return -EINVAL;
}
