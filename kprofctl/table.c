/*
 * kp_table: typed rows printed as aligned text, CSV or JSON (table.h).
 *
 * Cells are kept as text: numbers are formatted when set, so printing only measures and
 * escapes. Text widths come from a small UTF-8 decoder and a table of zero-width and
 * double-width ranges (the common ones of Unicode's East Asian Width and combining marks),
 * which does not depend on the locale.
 */
#define _GNU_SOURCE /* asprintf, vasprintf */
#include "table.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kp_err.h"
#include "kp_json.h"
#include "kp_str.h"

enum cell_type {
    CELL_NULL = 0,
    CELL_STR,
    CELL_NUM,      /* s is a JSON number */
    CELL_NUM_TEXT, /* a non-finite double: its text in text and CSV, null in JSON */
};

struct cell {
    char *s;    /* owned; NULL for CELL_NULL */
    char *json; /* owned; CELL_NUM whose text is no JSON number: the number for JSON */
    enum cell_type type;
};

struct kp_table {
    const struct kp_table_col *cols; /* borrowed */
    size_t n_cols;
    size_t sel[KP_TABLE_MAX_COLS]; /* shown columns, in order */
    size_t n_sel;
    struct cell *cells; /* rows * n_cols */
    size_t n_rows, cap_rows;
};

#define ELLIPSIS "\xe2\x80\xa6" /* U+2026 */

int kp_table_create(const struct kp_table_col *cols, size_t n_cols, struct kp_table **out)
{
    struct kp_table *t;

    if (cols == NULL || n_cols == 0 || n_cols > KP_TABLE_MAX_COLS || out == NULL) {
        return -EINVAL;
    }
    for (size_t i = 0; i < n_cols; i++) {
        if (cols[i].name == NULL || cols[i].name[0] == '\0') {
            return -EINVAL;
        }
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return -ENOMEM;
    }
    t->cols = cols;
    t->n_cols = n_cols;
    for (size_t i = 0; i < n_cols; i++) {
        t->sel[i] = i;
    }
    t->n_sel = n_cols;
    *out = t;
    return 0;
}

void kp_table_destroy(struct kp_table *t)
{
    if (t == NULL) {
        return;
    }
    for (size_t i = 0; i < t->n_rows * t->n_cols; i++) {
        free(t->cells[i].s);
        free(t->cells[i].json);
    }
    free(t->cells);
    free(t);
}

int kp_table_add_row(struct kp_table *t)
{
    if (t->n_rows == t->cap_rows) {
        size_t cap = t->cap_rows == 0 ? 16 : t->cap_rows * 2;
        struct cell *c;

        if (cap > SIZE_MAX / t->n_cols / sizeof(*c)) {
            return -ENOMEM;
        }
        c = realloc(t->cells, cap * t->n_cols * sizeof(*c));
        if (c == NULL) {
            return -ENOMEM;
        }
        t->cells = c;
        t->cap_rows = cap;
    }
    memset(&t->cells[t->n_rows * t->n_cols], 0, t->n_cols * sizeof(struct cell));
    t->n_rows++;
    return 0;
}

size_t kp_table_rows(const struct kp_table *t)
{
    return t->n_rows;
}

/* Takes s (owned, may be NULL for a NULL cell). */
static int set_cell(struct kp_table *t, size_t col, char *s, enum cell_type type)
{
    struct cell *c;

    if (t->n_rows == 0 || col >= t->n_cols) {
        free(s);
        return -EINVAL;
    }
    c = &t->cells[(t->n_rows - 1) * t->n_cols + col];
    free(c->s);
    free(c->json);
    c->json = NULL;
    c->s = s;
    c->type = s == NULL ? CELL_NULL : type;
    return 0;
}

int kp_table_set_str(struct kp_table *t, size_t col, const char *s)
{
    char *copy = NULL;

    if (s != NULL && (copy = strdup(s)) == NULL) {
        return -ENOMEM;
    }
    return set_cell(t, col, copy, CELL_STR);
}

static int set_fmt(struct kp_table *t, size_t col, enum cell_type type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int set_fmt(struct kp_table *t, size_t col, enum cell_type type, const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    int n;

    va_start(ap, fmt);
    n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return -ENOMEM;
    }
    return set_cell(t, col, s, type);
}

int kp_table_set_i64(struct kp_table *t, size_t col, int64_t v)
{
    return set_fmt(t, col, CELL_NUM, "%" PRId64, v);
}

int kp_table_set_u64(struct kp_table *t, size_t col, uint64_t v)
{
    return set_fmt(t, col, CELL_NUM, "%" PRIu64, v);
}

/* True if s is a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool is_json_number(const char *s)
{
    const char *p = s;

    if (*p == '-') {
        p++;
    }
    if (*p == '0') {
        p++;
    }
    else if (*p >= '1' && *p <= '9') {
        while (isdigit((unsigned char) *p)) {
            p++;
        }
    }
    else {
        return false;
    }
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char) *p)) {
            return false;
        }
        while (isdigit((unsigned char) *p)) {
            p++;
        }
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') {
            p++;
        }
        if (!isdigit((unsigned char) *p)) {
            return false;
        }
        while (isdigit((unsigned char) *p)) {
            p++;
        }
    }
    return *p == '\0';
}

int kp_table_set_double(struct kp_table *t, size_t col, double v, const char *fmt)
{
    char *s = NULL;
    int rc;

    if (fmt == NULL) {
        return -EINVAL;
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    rc = asprintf(&s, fmt, v);
#pragma GCC diagnostic pop
    if (rc < 0) {
        return -ENOMEM;
    }
    rc = set_cell(t, col, s, isfinite(v) ? CELL_NUM : CELL_NUM_TEXT);
    /* A format that prints no plain number ("%.1f%%", "%'.0f", "%a") still shows as given,
     * but JSON cannot take that as a number: it gets the shortest exact form instead. */
    if (rc == 0 && isfinite(v) && !is_json_number(s)) {
        struct cell *c = &t->cells[(t->n_rows - 1) * t->n_cols + col];

        if (asprintf(&c->json, "%.17g", v) < 0) {
            c->json = NULL;
            c->type = CELL_NUM_TEXT; /* never invalid JSON */
            return -ENOMEM;
        }
    }
    return rc;
}

int kp_table_set_null(struct kp_table *t, size_t col)
{
    return set_cell(t, col, NULL, CELL_NULL);
}

static void list_columns(const struct kp_table *t, char *errbuf, size_t errlen, const char *bad)
{
    size_t off;

    kp_errbuf_set(errbuf, errlen, "unknown column \"%s\" (columns: ", bad);
    if (errbuf == NULL || errlen == 0) {
        return;
    }
    for (size_t i = 0; i < t->n_cols; i++) {
        off = strlen(errbuf);
        snprintf(errbuf + off, errlen - off, "%s%s", i > 0 ? ", " : "", t->cols[i].name);
    }
    off = strlen(errbuf);
    snprintf(errbuf + off, errlen - off, ")");
}

int kp_table_select(struct kp_table *t, const char *list, char *errbuf, size_t errlen)
{
    size_t sel[KP_TABLE_MAX_COLS], n = 0;
    const char *p = list;

    if (list == NULL || list[strspn(list, " \t")] == '\0') {
        for (size_t i = 0; i < t->n_cols; i++) {
            t->sel[i] = i;
        }
        t->n_sel = t->n_cols;
        return 0;
    }
    while (p != NULL) {
        size_t i;
        char name[128];

        p = kp_str_list_item(p, name, sizeof(name));
        for (i = 0; i < t->n_cols; i++) {
            if (strcasecmp(t->cols[i].name, name) == 0) {
                break;
            }
        }
        if (i == t->n_cols) {
            list_columns(t, errbuf, errlen, name);
            return -EINVAL;
        }
        if (n == KP_TABLE_MAX_COLS) {
            kp_errbuf_set(errbuf, errlen, "more than %d columns", KP_TABLE_MAX_COLS);
            return -EINVAL;
        }
        sel[n++] = i;
    }
    memcpy(t->sel, sel, n * sizeof(sel[0]));
    t->n_sel = n;
    return 0;
}

/* --- UTF-8 --- */

/* Decodes one code point at s (len > 0 bytes left). Returns its length in bytes and *cp, or
 * 1 with *cp = -1 for a byte that does not start a valid, shortest-form sequence. */
static size_t utf8_decode(const unsigned char *s, size_t len, long *cp)
{
    long c;
    size_t n;

    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n = 2;
        c = s[0] & 0x1f;
    }
    else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n = 3;
        c = s[0] & 0x0f;
    }
    else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n = 4;
        c = s[0] & 0x07;
    }
    else {
        *cp = -1;
        return 1;
    }
    if (len < n) {
        *cp = -1;
        return 1;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *cp = -1;
            return 1;
        }
        c = (c << 6) | (s[i] & 0x3f);
    }
    if ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10ffff)) ||
        (c >= 0xd800 && c <= 0xdfff)) {
        *cp = -1;
        return 1;
    }
    *cp = c;
    return n;
}

struct range {
    long lo, hi;
};

static const struct range zero_width[] = {
    { 0x0300, 0x036f }, { 0x0483, 0x0489 },   { 0x0591, 0x05bd }, { 0x0610, 0x061a },
    { 0x064b, 0x065f }, { 0x0e31, 0x0e31 },   { 0x0e34, 0x0e3a }, { 0x0e47, 0x0e4e },
    { 0x1ab0, 0x1aff }, { 0x1dc0, 0x1dff },   { 0x200b, 0x200f }, { 0x2028, 0x202e },
    { 0x2060, 0x2064 }, { 0x20d0, 0x20ff },   { 0xfe00, 0xfe0f }, { 0xfe20, 0xfe2f },
    { 0xfeff, 0xfeff }, { 0xe0100, 0xe01ef },
};

static const struct range wide[] = {
    { 0x1100, 0x115f },   { 0x231a, 0x231b },   { 0x2329, 0x232a },   { 0x23e9, 0x23ec },
    { 0x23f0, 0x23f0 },   { 0x23f3, 0x23f3 },   { 0x25fd, 0x25fe },   { 0x2614, 0x2615 },
    { 0x2648, 0x2653 },   { 0x26a1, 0x26a1 },   { 0x26aa, 0x26ab },   { 0x26bd, 0x26be },
    { 0x26c4, 0x26c5 },   { 0x26ce, 0x26ce },   { 0x26d4, 0x26d4 },   { 0x26ea, 0x26ea },
    { 0x26f2, 0x26f5 },   { 0x26fa, 0x26fd },   { 0x2705, 0x2705 },   { 0x270a, 0x270b },
    { 0x2728, 0x2728 },   { 0x274c, 0x274c },   { 0x2753, 0x2755 },   { 0x2757, 0x2757 },
    { 0x2795, 0x2797 },   { 0x27b0, 0x27b0 },   { 0x27bf, 0x27bf },   { 0x2b1b, 0x2b1c },
    { 0x2b50, 0x2b50 },   { 0x2b55, 0x2b55 },   { 0x2e80, 0x303e },   { 0x3041, 0x33ff },
    { 0x3400, 0x4dbf },   { 0x4e00, 0x9fff },   { 0xa000, 0xa4cf },   { 0xa960, 0xa97f },
    { 0xac00, 0xd7a3 },   { 0xf900, 0xfaff },   { 0xfe10, 0xfe19 },   { 0xfe30, 0xfe6f },
    { 0xff00, 0xff60 },   { 0xffe0, 0xffe6 },   { 0x16fe0, 0x16fe4 }, { 0x17000, 0x18cff },
    { 0x1b000, 0x1b2ff }, { 0x1f004, 0x1f004 }, { 0x1f0cf, 0x1f0cf }, { 0x1f18e, 0x1f18e },
    { 0x1f191, 0x1f19a }, { 0x1f200, 0x1f251 }, { 0x1f300, 0x1f64f }, { 0x1f680, 0x1f6ff },
    { 0x1f7e0, 0x1f7eb }, { 0x1f90c, 0x1f9ff }, { 0x1fa70, 0x1faff }, { 0x20000, 0x2fffd },
    { 0x30000, 0x3fffd },
};

static bool in_ranges(long cp, const struct range *r, size_t n)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (cp < r[mid].lo) {
            hi = mid;
        }
        else if (cp > r[mid].hi) {
            lo = mid + 1;
        }
        else {
            return true;
        }
    }
    return false;
}

/* Columns a code point takes in the text format; -1 (invalid) and control characters are
 * shown as '?', one column. */
static int cp_width(long cp)
{
    if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0)) {
        return 1;
    }
    if (in_ranges(cp, zero_width, sizeof(zero_width) / sizeof(zero_width[0]))) {
        return 0;
    }
    if (in_ranges(cp, wide, sizeof(wide) / sizeof(wide[0]))) {
        return 2;
    }
    return 1;
}

static bool shown_as_mark(long cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp < 0xa0);
}

size_t kp_table_text_width(const char *s)
{
    const unsigned char *p = (const unsigned char *) s;
    size_t len = strlen(s), w = 0;

    while (len > 0) {
        long cp;
        size_t n = utf8_decode(p, len, &cp);

        w += (size_t) cp_width(cp);
        p += n;
        len -= n;
    }
    return w;
}

/* Writes s sanitised for a terminal, at most max columns (0: no limit), ending in "…" when
 * cut. Returns the columns written; with out NULL only measures. */
static size_t put_text(const char *s, size_t max, FILE *out)
{
    const unsigned char *p = (const unsigned char *) s;
    size_t len = strlen(s), w = 0, budget;

    if (max > 0 && kp_table_text_width(s) > max) {
        budget = max - 1; /* room for the ellipsis */
    }
    else {
        budget = (size_t) -1;
        max = 0;
    }
    while (len > 0) {
        long cp;
        size_t n = utf8_decode(p, len, &cp);
        size_t cw = (size_t) cp_width(cp);

        if (w + cw > budget) {
            break;
        }
        if (out != NULL) {
            if (cp < 0 || shown_as_mark(cp)) {
                fputc('?', out);
            }
            else {
                fwrite(p, 1, n, out);
            }
        }
        w += cw;
        p += n;
        len -= n;
    }
    if (max > 0) {
        if (out != NULL) {
            fputs(ELLIPSIS, out);
        }
        w++;
    }
    return w;
}

static void pad(size_t n, FILE *out)
{
    while (n-- > 0) {
        fputc(' ', out);
    }
}

static const struct cell *cell_at(const struct kp_table *t, size_t row, size_t col)
{
    return &t->cells[row * t->n_cols + col];
}

/* The text a cell shows in the text format and its width limit. */
static const char *text_of(const struct cell *c)
{
    return c->type == CELL_NULL ? "-" : c->s;
}

static int print_text(const struct kp_table *t, int width, FILE *out)
{
    size_t w[KP_TABLE_MAX_COLS];
    size_t limit = width > 0 ? (size_t) width : 0;

    for (size_t j = 0; j < t->n_sel; j++) {
        const struct kp_table_col *col = &t->cols[t->sel[j]];

        w[j] = strlen(col->name);
        for (size_t r = 0; r < t->n_rows; r++) {
            const char *s = text_of(cell_at(t, r, t->sel[j]));
            size_t cw = put_text(s, col->kind == KP_TABLE_TEXT ? limit : 0, NULL);

            w[j] = cw > w[j] ? cw : w[j];
        }
    }
    for (size_t j = 0; j < t->n_sel; j++) {
        const struct kp_table_col *col = &t->cols[t->sel[j]];
        size_t n = strlen(col->name);
        bool last = j + 1 == t->n_sel;

        if (j > 0) {
            fputs("  ", out);
        }
        if (col->kind == KP_TABLE_NUMERIC) {
            pad(w[j] - n, out);
        }
        for (const char *p = col->name; *p != '\0'; p++) {
            fputc(toupper((unsigned char) *p), out);
        }
        if (col->kind == KP_TABLE_TEXT && !last) {
            pad(w[j] - n, out);
        }
    }
    fputc('\n', out);
    for (size_t r = 0; r < t->n_rows; r++) {
        for (size_t j = 0; j < t->n_sel; j++) {
            const struct kp_table_col *col = &t->cols[t->sel[j]];
            const char *s = text_of(cell_at(t, r, t->sel[j]));
            size_t lim = col->kind == KP_TABLE_TEXT ? limit : 0;
            bool last = j + 1 == t->n_sel;

            if (j > 0) {
                fputs("  ", out);
            }
            if (col->kind == KP_TABLE_NUMERIC) {
                pad(w[j] - put_text(s, lim, NULL), out);
                put_text(s, lim, out);
            }
            else {
                size_t cw = put_text(s, lim, out);

                if (!last) {
                    pad(w[j] - cw, out);
                }
            }
        }
        fputc('\n', out);
    }
    return 0;
}

static void csv_field(const char *s, FILE *out)
{
    if (strpbrk(s, ",\"\r\n") == NULL) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (; *s != '\0'; s++) {
        if (*s == '"') {
            fputc('"', out);
        }
        fputc(*s, out);
    }
    fputc('"', out);
}

static int print_csv(const struct kp_table *t, FILE *out)
{
    for (size_t j = 0; j < t->n_sel; j++) {
        if (j > 0) {
            fputc(',', out);
        }
        csv_field(t->cols[t->sel[j]].name, out);
    }
    fputc('\n', out);
    for (size_t r = 0; r < t->n_rows; r++) {
        for (size_t j = 0; j < t->n_sel; j++) {
            const struct cell *c = cell_at(t, r, t->sel[j]);

            if (j > 0) {
                fputc(',', out);
            }
            if (c->type != CELL_NULL) {
                csv_field(c->s, out);
            }
        }
        fputc('\n', out);
    }
    return 0;
}

static int print_json(const struct kp_table *t, FILE *out)
{
    if (t->n_rows == 0) {
        fputs("[]\n", out);
        return 0;
    }
    fputs("[\n", out);
    for (size_t r = 0; r < t->n_rows; r++) {
        fputs("  {", out);
        for (size_t j = 0; j < t->n_sel; j++) {
            const struct cell *c = cell_at(t, r, t->sel[j]);

            if (j > 0) {
                fputs(", ", out);
            }
            kp_json_fputs(out, t->cols[t->sel[j]].name);
            fputs(": ", out);
            switch (c->type) {
            case CELL_STR:
                kp_json_fputs(out, c->s);
                break;
            case CELL_NUM:
                fputs(c->json != NULL ? c->json : c->s, out);
                break;
            case CELL_NULL:
            case CELL_NUM_TEXT:
            default:
                fputs("null", out);
                break;
            }
        }
        fputs(r + 1 < t->n_rows ? "},\n" : "}\n", out);
    }
    fputs("]\n", out);
    return 0;
}

int kp_table_print(const struct kp_table *t, enum kp_table_format format, int width, FILE *out)
{
    switch (format) {
    case KP_TABLE_FORMAT_CSV:
        print_csv(t, out);
        break;
    case KP_TABLE_FORMAT_JSON:
        print_json(t, out);
        break;
    case KP_TABLE_FORMAT_TEXT:
    default:
        print_text(t, width, out);
        break;
    }
    if (fflush(out) != 0 || ferror(out)) {
        return -EIO;
    }
    return 0;
}
