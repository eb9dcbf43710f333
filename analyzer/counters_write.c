/* The counters table's writers (counters.h): text, CSV and JSON. In kp_analyzer_print, which
 * links no libpq, so that kprofctl counters prints with them. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "counters_int.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_str.h"
#include "kp_strbuf.h"

/* ---- output ---------------------------------------------------------------------------- */

enum ct_col {
    C_IDX,
    C_RANGE,
    C_KERNEL,
    C_DEVICE,
    C_CORR,
    C_TID,
    C_TOP,
    C_BOTTOM,
    C_STACK,
    C_DUR,
    C_FLOPS,
    C_FP64,
    C_FP32,
    C_FP16,
    C_FLOPS_S,
    C_FIXED,
    C_COUNTERS = -1, /* JSON: every metric in one object */
};

static const char *const col_names[C_FIXED] = {
    "idx",   "range",      "kernel",     "device",     "correlation",
    "tid",   "top_op",     "bottom_op",  "op_stack",   "dur_us",
    "flops", "flops_fp64", "flops_fp32", "flops_fp16", "flops_per_s",
};

#define CT_TEXT_CUT 60 /* bytes of a text cell in the text format, without a width */

static bool col_numeric(long col)
{
    return !(col == C_KERNEL || col == C_TOP || col == C_BOTTOM || col == C_STACK);
}

static const char *col_name(const struct kp_counters *t, long col)
{
    return col < C_FIXED ? col_names[col] : t->metrics[col - C_FIXED];
}

/* JSON keeps the duration as exact integer ns. */
static const char *json_name(const struct kp_counters *t, long col)
{
    return col == C_DUR ? "dur_ns" : col_name(t, col);
}

/* Appends the columns of list to cols (at most max); "all" is every fixed column and every
 * metric. Returns the count or -EINVAL. */
static long parse_cols(const struct kp_counters *t, const char *list, long *cols, long max,
                       char *errbuf, size_t errlen)
{
    long n = 0;
    const char *p = list;

    while (p != NULL && *p) {
        char name[256];
        long col = -2;
        size_t len;

        p = kp_str_list_item(p, name, sizeof(name));
        len = strlen(name);
        if (len > 0 && strcmp(name, "all") == 0) {
            for (long c = 0; c < C_FIXED + (long) t->n_metrics && n < max; c++) {
                cols[n++] = c;
            }
        }
        else if (len > 0) {
            for (long c = 0; c < C_FIXED && col < 0; c++) {
                if (strcmp(name, col_names[c]) == 0) {
                    col = c;
                }
                else if (c == C_DUR && strcmp(name, "dur_ns") == 0) {
                    col = c; /* JSON's name for it */
                }
            }
            if (col < 0 && kp__counters_metric_index(t, name) >= 0) {
                col = C_FIXED + kp__counters_metric_index(t, name);
            }
            if (col < 0) {
                kp_errbuf_set(errbuf, errlen,
                              "unknown column \"%s\" (columns: idx, range, kernel, device, "
                              "correlation, tid, top_op, bottom_op, op_stack, dur_us, flops, "
                              "flops_fp64, flops_fp32, flops_fp16, flops_per_s, all, or one of "
                              "the run's %zu metrics)",
                              name, t->n_metrics);
                return -EINVAL;
            }
            if (n < max) {
                cols[n++] = col;
            }
        }
    }
    return n;
}

/* A number as text: exact (%.17g) for CSV and JSON, short for text. NULL when not finite. */
static const char *fmt_num(double v, bool exact, char *buf, size_t len)
{
    if (!isfinite(v)) {
        return NULL;
    }
    if (exact) {
        snprintf(buf, len, "%.17g", v);
    }
    else if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, len, "%.0f", v);
    }
    else {
        snprintf(buf, len, "%.4g", v);
    }
    return buf;
}

static const char *fmt_int(int64_t v, char *buf, size_t len)
{
    if (v < 0) {
        return NULL;
    }
    snprintf(buf, len, "%" PRId64, v);
    return buf;
}

/* The cell as text, or NULL for a null cell. op_stack is joined with " > " into sb. */
static const char *cell(const struct kp_counters_row *r, long col, bool exact, char *buf,
                        size_t len, struct kp_strbuf *sb)
{
    switch (col) {
    case C_IDX:
        return fmt_int((int64_t) r->idx, buf, len);
    case C_RANGE:
        return fmt_int(r->range, buf, len);
    case C_KERNEL:
        return r->kernel[0] ? r->kernel : NULL;
    case C_DEVICE:
        return fmt_int(r->device, buf, len);
    case C_CORR:
        return fmt_int(r->correlation, buf, len);
    case C_TID:
        return fmt_int(r->tid, buf, len);
    case C_TOP:
        return r->top_op;
    case C_BOTTOM:
        return r->bottom_op;
    case C_STACK:
        if (r->n_stack == 0) {
            return NULL;
        }
        kp_strbuf_reset(sb);
        for (size_t i = 0; i < r->n_stack; i++) {
            if (kp_strbuf_appendf(sb, "%s%s", i ? " > " : "", r->stack[i]) != 0) {
                return NULL;
            }
        }
        return sb->data;
    case C_DUR: /* µs, exact: three decimals of whole ns */
        if (r->dur_ns < 0) {
            return NULL;
        }
        snprintf(buf, len, "%" PRId64 ".%03" PRId64, r->dur_ns / 1000, r->dur_ns % 1000);
        return buf;
    case C_FLOPS:
        return fmt_num(r->flops, exact, buf, len);
    case C_FP64:
    case C_FP32:
    case C_FP16:
        return fmt_num(r->flops_prec[col - C_FP64], exact, buf, len);
    case C_FLOPS_S:
        return fmt_num(r->flops_per_s, exact, buf, len);
    default:
        return fmt_num(r->values[col - C_FIXED], exact, buf, len);
    }
}

static void csv_field(FILE *f, const char *s)
{
    if (!s) {
        return;
    }
    if (strpbrk(s, ",\"\r\n") == NULL) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') {
            fputc('"', f);
        }
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Bytes of s shown in the text format: at most limit, cut at a UTF-8 boundary. */
static size_t text_len(const char *s, size_t limit, bool *cut)
{
    size_t n = strlen(s);

    *cut = n > limit;
    if (!*cut) {
        return n;
    }
    n = limit > 3 ? limit - 3 : 0;
    while (n > 0 && ((unsigned char) s[n] & 0xc0) == 0x80) {
        n--;
    }
    return n;
}

static void write_json(FILE *f, const struct kp_counters *t, int64_t run, int rank,
                       const long *cols, long n_cols, struct kp_strbuf *sb)
{
    char buf[64];

    fprintf(f, "{\"run\": %" PRId64 ", \"rank\": %d, \"metrics\": [", run, rank);
    for (size_t m = 0; m < t->n_metrics; m++) {
        fputs(m ? ", " : "", f);
        kp_json_fputs(f, t->metrics[m]);
    }
    fputs("], \"message\": ", f);
    if (t->message[0]) {
        kp_json_fputs(f, t->message);
    }
    else {
        fputs("null", f);
    }
    fputs(", \"rows\": [", f);
    for (size_t i = 0; i < t->n_rows; i++) {
        const struct kp_counters_row *r = &t->rows[i];

        fputs(i ? ",\n  {" : "\n  {", f);
        for (long c = 0; c < n_cols; c++) {
            long col = cols[c];
            const char *v;

            fputs(c ? ", " : "", f);
            if (col == C_COUNTERS) {
                fputs("\"counters\": {", f);
                for (size_t m = 0; m < t->n_metrics; m++) {
                    fputs(m ? ", " : "", f);
                    kp_json_fputs(f, t->metrics[m]);
                    v = fmt_num(r->values[m], true, buf, sizeof(buf));
                    fprintf(f, ": %s", v ? v : "null");
                }
                fputc('}', f);
                continue;
            }
            kp_json_fputs(f, json_name(t, col));
            fputs(": ", f);
            if (col == C_STACK) {
                fputc('[', f);
                for (size_t k = 0; k < r->n_stack; k++) {
                    fputs(k ? ", " : "", f);
                    kp_json_fputs(f, r->stack[k]);
                }
                fputc(']', f);
                continue;
            }
            v = col == C_DUR && r->dur_ns >= 0 ? fmt_int(r->dur_ns, buf, sizeof(buf))
                                               : cell(r, col, true, buf, sizeof(buf), sb);
            if (!v) {
                fputs("null", f);
            }
            else if (col_numeric(col)) {
                fputs(v, f);
            }
            else {
                kp_json_fputs(f, v);
            }
        }
        fputc('}', f);
    }
    fputs(t->n_rows ? "\n]}\n" : "]}\n", f);
}

static void write_text(FILE *f, const struct kp_counters *t, const long *cols, long n_cols,
                       size_t limit, struct kp_strbuf *sb)
{
    size_t w[KP_COUNTERS_MAX_COLS];
    char buf[64];
    bool cut;

    for (long c = 0; c < n_cols; c++) {
        w[c] = strlen(col_name(t, cols[c]));
        for (size_t i = 0; i < t->n_rows; i++) {
            const char *v = cell(&t->rows[i], cols[c], false, buf, sizeof(buf), sb);
            size_t n = v ? text_len(v, limit, &cut) + (cut ? 3 : 0) : 1;

            w[c] = n > w[c] ? n : w[c];
        }
    }
    for (long c = 0; c < n_cols; c++) {
        fprintf(f, "%s%*s", c ? "  " : "", col_numeric(cols[c]) ? (int) w[c] : -(int) w[c],
                col_name(t, cols[c]));
    }
    fputc('\n', f);
    for (size_t i = 0; i < t->n_rows; i++) {
        for (long c = 0; c < n_cols; c++) {
            const char *v = cell(&t->rows[i], cols[c], false, buf, sizeof(buf), sb);
            size_t n;

            fputs(c ? "  " : "", f);
            if (!v) {
                fprintf(f, "%*s", col_numeric(cols[c]) ? (int) w[c] : -(int) w[c], "-");
                continue;
            }
            n = text_len(v, limit, &cut);
            if (col_numeric(cols[c])) {
                fprintf(f, "%*s", (int) w[c], v);
            }
            else {
                fprintf(f, "%.*s%s%*s", (int) n, v, cut ? "..." : "",
                        (int) (w[c] - n - (cut ? 3 : 0)), "");
            }
        }
        fputc('\n', f);
    }
}

static int write_table(FILE *f, const struct kp_counters *t, int64_t run, int rank,
                       const char *columns, enum kp_counters_format format, int width, char *errbuf,
                       size_t errlen)
{
    long cols[KP_COUNTERS_MAX_COLS], n_cols;
    struct kp_strbuf sb;
    char buf[64];

    if (!columns || !columns[0]) {
        columns = format == KP_COUNTERS_TEXT ? KP_COUNTERS_TEXT_COLUMNS : "all";
    }
    n_cols = parse_cols(t, columns, cols, KP_COUNTERS_MAX_COLS, errbuf, errlen);
    if (n_cols < 0) {
        return (int) n_cols;
    }
    if (format == KP_COUNTERS_JSON && strcmp(columns, "all") == 0) {
        n_cols = C_FIXED; /* every fixed column, then the metrics as one object */
        cols[n_cols++] = C_COUNTERS;
    }
    kp_strbuf_init(&sb, 0);
    if (format == KP_COUNTERS_JSON) {
        write_json(f, t, run, rank, cols, n_cols, &sb);
    }
    else if (format == KP_COUNTERS_CSV) {
        for (long c = 0; c < n_cols; c++) {
            fputs(c ? "," : "", f);
            csv_field(f, col_name(t, cols[c]));
        }
        fputc('\n', f);
        for (size_t i = 0; i < t->n_rows; i++) {
            for (long c = 0; c < n_cols; c++) {
                fputs(c ? "," : "", f);
                csv_field(f, cell(&t->rows[i], cols[c], true, buf, sizeof(buf), &sb));
            }
            fputc('\n', f);
        }
    }
    else {
        write_text(f, t, cols, n_cols, width > 0 ? (size_t) width : CT_TEXT_CUT, &sb);
    }
    kp_strbuf_fini(&sb);
    return fflush(f) != 0 || ferror(f) ? -EIO : 0;
}

int kp_counters_write(FILE *f, const struct kp_counters *t, int64_t run, int rank,
                      const char *columns, enum kp_counters_format format, char *errbuf,
                      size_t errlen)
{
    return write_table(f, t, run, rank, columns, format, 0, errbuf, errlen);
}

int kp_counters_write_rows(FILE *f, const struct kp_counters_row *rows, size_t n_rows,
                           const char *const *metrics, size_t n_metrics, const char *message,
                           int64_t run, int rank, const char *columns,
                           enum kp_counters_format format, char *errbuf, size_t errlen)
{
    return kp_counters_write_rows_width(f, rows, n_rows, metrics, n_metrics, message, run, rank,
                                        columns, format, 0, errbuf, errlen);
}

int kp_counters_write_rows_width(FILE *f, const struct kp_counters_row *rows, size_t n_rows,
                                 const char *const *metrics, size_t n_metrics, const char *message,
                                 int64_t run, int rank, const char *columns,
                                 enum kp_counters_format format, int width, char *errbuf,
                                 size_t errlen)
{
    struct kp_counters t;

    /* A table without its PGresults: the writer only reads rows, metrics and message. */
    memset(&t, 0, sizeof(t));
    t.rows = (struct kp_counters_row *) rows;
    t.n_rows = n_rows;
    t.metrics = (const char **) metrics;
    t.n_metrics = n_metrics;
    snprintf(t.message, sizeof(t.message), "%s", message != NULL ? message : "");
    return write_table(f, &t, run, rank, columns, format, width, errbuf, errlen);
}
