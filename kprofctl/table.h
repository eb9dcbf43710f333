/*
 * kp_table: the tables every kprofctl verb prints. A verb defines its columns, adds rows of
 * typed cells, optionally picks columns (-c), then prints the table in one of three formats:
 *
 *   text  aligned columns under an upper-case header, two spaces apart; text columns left-,
 *         numeric columns right-aligned; widths in terminal columns (UTF-8 aware: combining
 *         marks take none, East Asian wide characters and emoji two); control characters
 *         and invalid UTF-8 bytes shown as '?'; NULL shown as "-". With a width limit (-w),
 *         longer text cells are cut and end in "…"; numeric cells are never cut.
 *   csv   a header line of the column names, then one line per row ('\n' ends lines);
 *         fields with ',', '"', CR or LF are quoted with '"' doubled (RFC 4180); NULL is an
 *         empty field.
 *   json  an array of objects keyed by column name, one object per line; strings escaped
 *         (invalid UTF-8 becomes U+FFFD), numbers as numbers, NULL (and non-finite doubles)
 *         as null.
 *
 * Memory: the table owns copies of every cell; kp_table_destroy frees them. Not thread-safe.
 */
#ifndef KPROFCTL_TABLE_H
#define KPROFCTL_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KP_TABLE_MAX_COLS 64

enum kp_table_kind {
    KP_TABLE_TEXT,    /* strings: left-aligned, cut by the width limit */
    KP_TABLE_NUMERIC, /* numbers: right-aligned, never cut, JSON numbers */
};

enum kp_table_format {
    KP_TABLE_FORMAT_TEXT,
    KP_TABLE_FORMAT_CSV,
    KP_TABLE_FORMAT_JSON,
};

struct kp_table_col {
    const char *name; /* lower-case [a-z0-9_], e.g. "world_size"; borrowed, must outlive */
    enum kp_table_kind kind;
};

struct kp_table;

/*
 * Creates an empty table with columns cols[0..n_cols) (borrowed: they must outlive the
 * table), 1 <= n_cols <= KP_TABLE_MAX_COLS. Every column is shown, in order, until
 * kp_table_select. Returns 0 and *out (kp_table_destroy), -EINVAL or -ENOMEM.
 */
int kp_table_create(const struct kp_table_col *cols, size_t n_cols, struct kp_table **out);

/* Frees the table and its cells. Accepts NULL. */
void kp_table_destroy(struct kp_table *t);

/* Appends a row whose cells are all NULL; the kp_table_set_* calls fill the last row.
 * Returns 0 or -ENOMEM. */
int kp_table_add_row(struct kp_table *t);

/*
 * Set cell col (index into the columns given to kp_table_create) of the last row, replacing
 * what it held. Return 0, -EINVAL (no row yet, col out of range, or a NULL fmt) or -ENOMEM.
 * A NULL s is a NULL cell. fmt is a printf format for one double ("%.3f"); the cell's text is
 * what it prints, and JSON gets that text as a number (v as "%.17g" where the text is not a
 * plain number, e.g. "%.1f%%"; null if v is not finite).
 */
int kp_table_set_str(struct kp_table *t, size_t col, const char *s);
int kp_table_set_i64(struct kp_table *t, size_t col, int64_t v);
int kp_table_set_u64(struct kp_table *t, size_t col, uint64_t v);
int kp_table_set_double(struct kp_table *t, size_t col, double v, const char *fmt);
int kp_table_set_null(struct kp_table *t, size_t col);

/*
 * Shows only the columns named in list ("id,job,state": comma-separated, in that order,
 * names compared without case, blanks around names ignored, a name may repeat). An empty or
 * NULL list keeps every column. Returns 0, or -EINVAL with errbuf naming the bad entry and
 * the valid columns ("unknown column \"foo\" (columns: id, job, ...)"); the selection is then
 * unchanged.
 */
int kp_table_select(struct kp_table *t, const char *list, char *errbuf, size_t errlen);

/* Rows added so far. */
size_t kp_table_rows(const struct kp_table *t);

/*
 * Writes the table to out in format. width (text only) is the most terminal columns a text
 * cell takes (longer ones are cut and end in "…"); 0: no limit, 1 or more allowed. Returns 0,
 * or -EIO if writing failed (e.g. a closed pipe: check before exiting 0).
 */
int kp_table_print(const struct kp_table *t, enum kp_table_format format, int width, FILE *out);

/* The display width of a UTF-8 string in terminal columns, as the text format counts it. */
size_t kp_table_text_width(const char *s);

#endif
