/* The roofline's writer (roofline.h): text, CSV and JSON. In kp_analyzer_print, which links
 * no libpq, so that kprofctl roofline prints with it. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kp_json.h"
#include "roofline.h"

static const char *const peak_names[KP_ROOFLINE_PEAK_COUNT + 1] = { "fp32", "tf32", "fp16", "fp8",
                                                                    "-" };

const char *kp_roofline_peak_name(enum kp_roofline_peak p)
{
    return p <= KP_ROOFLINE_NO_PEAK ? peak_names[p] : "?";
}

static void json_num(FILE *f, const char *key, double v, bool defined)
{
    fprintf(f, ", \"%s\": ", key);
    if (defined) {
        fprintf(f, "%.17g", v);
    }
    else {
        fputs("null", f);
    }
}

/* A CSV/text cell of a figure: %.6g, "-" when undefined. */
static const char *fig(char *buf, size_t len, double v, bool defined)
{
    if (!defined) {
        return "-";
    }
    snprintf(buf, len, "%.6g", v);
    return buf;
}

void kp_roofline_write_parts(FILE *f, enum kp_roofline_by by, const struct kp_roofline_device *devs,
                             size_t n_devs, const struct kp_roofline_row *rows, size_t n_rows,
                             int64_t run, int rank, enum kp_roofline_format fmt, size_t top)
{
    kp_roofline_write_parts_width(f, by, devs, n_devs, rows, n_rows, run, rank, fmt, top, 0);
}

/* s, cut to width display columns (UTF-8 code points) with "…"; 0: whole. */
static void put_cut(FILE *f, const char *s, int width)
{
    int cols = 0;
    const char *p;

    for (p = s; *p; p++) {
        cols += ((unsigned char) *p & 0xC0) != 0x80;
    }
    if (width <= 0 || cols <= width) {
        fputs(s, f);
        return;
    }
    for (p = s, cols = 0; *p; p++) {
        if (((unsigned char) *p & 0xC0) != 0x80 && ++cols > width - 1) {
            break;
        }
        fputc(*p, f);
    }
    fputs("\u2026", f);
}

void kp_roofline_write_parts_width(FILE *f, enum kp_roofline_by by,
                                   const struct kp_roofline_device *devs, size_t n_devs,
                                   const struct kp_roofline_row *rows, size_t n_rows, int64_t run,
                                   int rank, enum kp_roofline_format fmt, size_t top, int width)
{
    size_t n = top && top < n_rows ? top : n_rows, n_above = 0;
    char b[9][32];

    if (fmt == KP_ROOFLINE_JSON) {
        fprintf(f, "{\"run\": %" PRId64 ", \"rank\": %d, \"by\": \"%s\", \"devices\": [", run, rank,
                by == KP_ROOFLINE_BY_OP ? "op" : "kernel");
        for (size_t i = 0; i < n_devs; i++) {
            const struct kp_roofline_device *d = &devs[i];

            fprintf(f, "%s{\"id\": %d, \"name\": ", i ? ", " : "", d->id);
            kp_json_fputs(f, d->name);
            fputs(", \"entry\": ", f);
            if (d->entry[0]) {
                kp_json_fputs(f, d->entry);
            }
            else {
                fputs("null", f);
            }
            fputs(", \"source\": ", f);
            kp_json_fputs(f, d->source);
            for (int p = 0; p < KP_ROOFLINE_PEAK_COUNT; p++) {
                char key[40];

                snprintf(key, sizeof(key), "peak_%s_flop_per_s", peak_names[p]);
                json_num(f, key, d->peak_flop_per_s[p], d->peak_flop_per_s[p] > 0);
            }
            json_num(f, "bandwidth_bytes_per_s", d->bandwidth_bytes_per_s,
                     d->bandwidth_bytes_per_s > 0);
            fputc('}', f);
        }
        fputs("], \"rows\": [", f);
        for (size_t i = 0; i < n; i++) {
            const struct kp_roofline_row *g = &rows[i];

            fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
            kp_json_fputs(f, g->name);
            if (by == KP_ROOFLINE_BY_OP) {
                fputs(", \"dir\": ", f);
                kp_json_fputs(f, g->dir);
            }
            fprintf(f,
                    ", \"device\": %d, \"peak\": \"%s\", \"kernels\": %" PRIu64
                    ", \"time_ns\": %" PRId64,
                    g->device, g->peak, g->kernels, g->time_ns);
            json_num(f, "flops", g->flops, g->flops_known);
            json_num(f, "bytes", g->bytes, g->bytes_known);
            json_num(f, "flop_per_s", g->flop_per_s, g->flop_per_s_defined);
            json_num(f, "bytes_per_s", g->bytes_per_s, g->bytes_per_s_defined);
            json_num(f, "intensity", g->intensity, g->intensity_defined);
            json_num(f, "peak_flop_per_s", g->peak_flop_per_s, g->compute_fraction_defined);
            json_num(f, "compute_fraction", g->compute_fraction, g->compute_fraction_defined);
            json_num(f, "bandwidth_bytes_per_s", g->bandwidth_bytes_per_s,
                     g->bandwidth_bytes_per_s > 0);
            json_num(f, "bandwidth_fraction", g->bandwidth_fraction, g->bandwidth_fraction_defined);
            fputs(", \"above_peak\": ", f);
            if (g->above_peak[0]) {
                kp_json_fputs(f, g->above_peak);
            }
            else {
                fputs("null", f);
            }
            fputc('}', f);
        }
        fputs("]}\n", f);
        return;
    }
    if (fmt == KP_ROOFLINE_CSV) {
        fprintf(f,
                "name,%sdevice,peak,kernels,time_us,flops,bytes,flop_per_s,bytes_per_s,"
                "intensity,peak_flop_per_s,compute_fraction,bandwidth_bytes_per_s,"
                "bandwidth_fraction,above_peak\n",
                by == KP_ROOFLINE_BY_OP ? "dir," : "");
    }
    else {
        for (size_t i = 0; i < n_devs; i++) {
            fprintf(f, "device %d \"%s\": peaks from %s\n", devs[i].id, devs[i].name,
                    devs[i].source);
        }
        if (n_devs == 0) {
            fprintf(f, "no device properties for this rank: peaks unknown\n");
        }
        fprintf(f, "%-10s %-5s %7s %12s %10s %10s %9s %12s %4s %-10s  %s\n", "TFLOP/s", "peak",
                "%peak", "GB/s", "%bw", "FLOP/B", "kernels", "time_us", "dev", "above_peak",
                "name");
    }
    for (size_t i = 0; i < n; i++) {
        const struct kp_roofline_row *g = &rows[i];

        if (fmt == KP_ROOFLINE_CSV) {
            fputc('"', f);
            for (const char *s = g->name; *s; s++) {
                if (*s == '"') {
                    fputc('"', f);
                }
                fputc(*s, f);
            }
            fputc('"', f);
            if (by == KP_ROOFLINE_BY_OP) {
                fprintf(f, ",%s", g->dir);
            }
            fprintf(
                f,
                ",%d,%s,%" PRIu64 ",%" PRId64 ".%03" PRId64 ",%s,%s,%s,%s,%s,%s,%s,%s,%s,\"%s\"\n",
                g->device, g->peak, g->kernels, g->time_ns / 1000, g->time_ns % 1000,
                fig(b[0], 32, g->flops, g->flops_known), fig(b[1], 32, g->bytes, g->bytes_known),
                fig(b[2], 32, g->flop_per_s, g->flop_per_s_defined),
                fig(b[3], 32, g->bytes_per_s, g->bytes_per_s_defined),
                fig(b[4], 32, g->intensity, g->intensity_defined),
                fig(b[5], 32, g->peak_flop_per_s, g->compute_fraction_defined),
                fig(b[6], 32, g->compute_fraction, g->compute_fraction_defined),
                fig(b[7], 32, g->bandwidth_bytes_per_s, g->bandwidth_bytes_per_s > 0),
                fig(b[8], 32, g->bandwidth_fraction, g->bandwidth_fraction_defined), g->above_peak);
            continue;
        }
        fprintf(f,
                "%-10s %-5s %7s %12s %10s %10s %9" PRIu64 " %8" PRId64 ".%03" PRId64 " %4d %-10s  ",
                fig(b[0], 32, g->flop_per_s / 1e12, g->flop_per_s_defined), g->peak,
                fig(b[1], 32, 100 * g->compute_fraction, g->compute_fraction_defined),
                fig(b[2], 32, g->bytes_per_s / 1e9, g->bytes_per_s_defined),
                fig(b[3], 32, 100 * g->bandwidth_fraction, g->bandwidth_fraction_defined),
                fig(b[4], 32, g->intensity, g->intensity_defined), g->kernels, g->time_ns / 1000,
                g->time_ns % 1000, g->device, g->above_peak[0] ? g->above_peak : "-");
        put_cut(f, g->name, width);
        fprintf(f, "%s%s\n", g->dir[0] ? " " : "", g->dir);
        n_above += g->above_peak[0] != '\0';
    }
    if (fmt == KP_ROOFLINE_TEXT && n_above > 0) {
        fprintf(f,
                "%zu row(s) above 100 %% of a peak (above_peak): the FLOP/byte model or the "
                "device's peak is wrong for those kernels\n",
                n_above);
    }
}
