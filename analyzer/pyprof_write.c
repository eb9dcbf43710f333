/* PyProf's table writers (pyprof.h): text, CSV and JSON, and the column names. In
 * kp_analyzer_print, which links no libpq, so that kprofctl prof prints with them. */
#define _GNU_SOURCE /* fputs_unlocked, fwrite_unlocked, getdelim */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kp_err.h"
#include "kp_json.h"
#include "kp_str.h"
#include "pyprof.h"

static const char *const col_names[KP_PYPROF_COL_COUNT] = {
    "idx",    "seq",    "altseq", "tid", "layer",  "trace",  "dir",  "sub",   "mod",   "op",
    "kernel", "params", "sil",    "tc",  "device", "stream", "grid", "block", "flops", "bytes",
};

static const char *const col_headers[KP_PYPROF_COL_COUNT] = {
    "Idx",    "SeqId",  "AltSeqId", "TId",    "Layer",  "Trace",   "Direction",
    "Sub",    "Module", "Op",       "Kernel", "Params", "Sil(us)", "TC",
    "Device", "Stream", "Grid",     "Block",  "FLOPs",  "Bytes",
};

/* JSON keys: the column names, but sil is exact ns. */
static const char *json_key(enum kp_pyprof_col c)
{
    return c == KP_PYPROF_SIL ? "sil_ns" : col_names[c];
}

const char *kp_pyprof_col_name(enum kp_pyprof_col c)
{
    return c < KP_PYPROF_COL_COUNT ? col_names[c] : "?";
}

int kp_pyprof_parse_columns(const char *list, enum kp_pyprof_col *cols, int max, char *errbuf,
                            size_t errlen)
{
    int n = 0;
    const char *s = list;

    while (s && *s) {
        size_t len = strcspn(s, ",");
        int c;

        for (c = 0; c < KP_PYPROF_COL_COUNT; c++) {
            if (strlen(col_names[c]) == len && strncmp(s, col_names[c], len) == 0) {
                break;
            }
        }
        if (c == KP_PYPROF_COL_COUNT || n >= max) {
            kp_errbuf_set(errbuf, errlen,
                          "unknown column '%.*s': pick from idx,seq,altseq,tid,layer,trace,dir,"
                          "sub,mod,op,kernel,params,sil,tc,device,stream,grid,block,flops,bytes",
                          (int) len, s);
            return -EINVAL;
        }
        cols[n++] = (enum kp_pyprof_col) c;
        s += len;
        if (*s == ',') {
            s++;
        }
    }
    if (n == 0) {
        kp_errbuf_set(errbuf, errlen, "no column selected");
        return -EINVAL;
    }
    return n;
}

/* v in decimal at the end of buf[0..len) (len >= 21), NUL-terminated; returns where it starts.
 * A table of 200 k rows formats millions of integers, twice (widths, then cells): snprintf's
 * format parsing was a tenth of printing it. */
static char *fmt_i64(char *buf, size_t len, int64_t v)
{
    char *p = buf + len - 1;
    uint64_t u = v < 0 ? 0 - (uint64_t) v : (uint64_t) v;

    *p = '\0';
    do {
        *--p = (char) ('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0) {
        *--p = '-';
    }
    return p;
}

/* The text of one cell. */
static const char *cell(const struct kp_pyprof_row *r, enum kp_pyprof_col c, char *buf, size_t len)
{
    switch (c) {
    case KP_PYPROF_IDX:
        return r->idx > INT64_MAX ? (snprintf(buf, len, "%" PRIu64, r->idx), buf)
                                  : fmt_i64(buf, len, (int64_t) r->idx);
    case KP_PYPROF_SEQ:
        if (r->seq < 0) {
            return "-";
        }
        return fmt_i64(buf, len, r->seq);
    case KP_PYPROF_ALTSEQ:
        return r->altseq;
    case KP_PYPROF_TID:
        return fmt_i64(buf, len, r->tid);
    case KP_PYPROF_LAYER:
        return r->layer;
    case KP_PYPROF_TRACE:
        return r->trace;
    case KP_PYPROF_DIR:
        return r->bwd ? "bprop" : "fprop";
    case KP_PYPROF_SUB:
        return fmt_i64(buf, len, r->sub);
    case KP_PYPROF_MOD:
        return r->mod;
    case KP_PYPROF_OP:
        return r->op;
    case KP_PYPROF_KERNEL:
        return r->kernel;
    case KP_PYPROF_PARAMS:
        return r->params;
    case KP_PYPROF_SIL:
        if (r->sil_ns < 0) {
            return "-";
        }
        {
            char *p = fmt_i64(buf, len - 4, r->sil_ns / 1000); /* then ".nnn" */
            int64_t ms = r->sil_ns % 1000;

            buf[len - 5] = '.';
            buf[len - 4] = (char) ('0' + ms / 100);
            buf[len - 3] = (char) ('0' + ms / 10 % 10);
            buf[len - 2] = (char) ('0' + ms % 10);
            buf[len - 1] = '\0';
            return p;
        }
    case KP_PYPROF_TC:
        return r->tc;
    case KP_PYPROF_DEVICE:
        return r->device < 0 ? "-" : fmt_i64(buf, len, r->device);
    case KP_PYPROF_STREAM:
        return r->stream < 0 ? "-" : fmt_i64(buf, len, r->stream);
    case KP_PYPROF_GRID:
        return r->grid;
    case KP_PYPROF_BLOCK:
        return r->block;
    case KP_PYPROF_FLOPS:
        if (!r->flops_known) {
            return "-";
        }
        snprintf(buf, len, "%.0f", r->flops);
        return buf;
    case KP_PYPROF_BYTES:
        if (!r->bytes_known) {
            return "-";
        }
        snprintf(buf, len, "%.0f", r->bytes);
        return buf;
    default:
        return "?";
    }
}

/* Display columns of UTF-8 text (one per code point). */
static int disp_width(const char *s)
{
    int n = 0;

    for (; *s; s++) {
        n += ((unsigned char) *s & 0xC0) != 0x80;
    }
    return n;
}

/* sep, then s in w display columns: cut with "…" when wider, padded unless last. The caller
 * holds f's lock (flockfile). */
static void put_cell(FILE *f, const char *sep, const char *s, int w, bool last)
{
    int n = disp_width(s);

    static const char pad[] = "                                                                ";
    size_t b = 0;

    fputs_unlocked(sep, f);
    if (n > w) { /* the bytes of the first w - 1 code points, then the ellipsis */
        for (int cols = 0; s[b]; b++) {
            if (((unsigned char) s[b] & 0xC0) != 0x80 && ++cols > w - 1) {
                break;
            }
        }
        fwrite_unlocked(s, 1, b, f);
        fputs_unlocked("\u2026", f);
        return;
    }
    fputs_unlocked(s, f);
    /* a table of 200 k rows pads millions of cells: in runs, not a locked fputc a space */
    for (int left = last ? 0 : w - n; left > 0; left -= (int) sizeof(pad) - 1) {
        fwrite_unlocked(pad, 1, left < (int) sizeof(pad) - 1 ? (size_t) left : sizeof(pad) - 1, f);
    }
}

/* One JSON value; the caller holds f's lock (flockfile). */
static void json_cell(FILE *f, const struct kp_pyprof_row *r, enum kp_pyprof_col c)
{
    char buf[64];

    switch (c) {
    case KP_PYPROF_IDX:
    case KP_PYPROF_TID:
    case KP_PYPROF_SUB:
        fputs_unlocked(cell(r, c, buf, sizeof(buf)), f);
        return;
    case KP_PYPROF_SIL:
        fputs_unlocked(fmt_i64(buf, sizeof(buf), r->sil_ns), f);
        return;
    case KP_PYPROF_SEQ:
        fputs_unlocked(r->seq < 0 ? "null" : fmt_i64(buf, sizeof(buf), r->seq), f);
        return;
    case KP_PYPROF_DEVICE:
    case KP_PYPROF_STREAM: {
        int v = c == KP_PYPROF_DEVICE ? r->device : r->stream;

        fputs_unlocked(v < 0 ? "null" : fmt_i64(buf, sizeof(buf), v), f);
        return;
    }
    case KP_PYPROF_FLOPS:
    case KP_PYPROF_BYTES: {
        bool known = c == KP_PYPROF_FLOPS ? r->flops_known : r->bytes_known;

        if (!known) {
            fputs_unlocked("null", f);
        }
        else {
            fprintf(f, "%.17g", c == KP_PYPROF_FLOPS ? r->flops : r->bytes);
        }
        return;
    }
    default:
        kp_json_fputs(f, cell(r, c, buf, sizeof(buf)));
        return;
    }
}

/* JSON's opening, up to the rows' '[', and each cell's key with its separator into keys (once,
 * not a format a cell). */
static void json_begin(FILE *f, int64_t run, int rank, const enum kp_pyprof_col *cols, int ncols,
                       char keys[][24])
{
    fprintf(f, "{\"run\": %" PRId64 ", \"rank\": %d, \"columns\": [", run, rank);
    for (int c = 0; c < ncols; c++) {
        fprintf(f, "%s\"%s\"", c ? ", " : "", json_key(cols[c]));
    }
    fputs("], \"rows\": [", f);
    for (int c = 0; c < ncols; c++) {
        snprintf(keys[c], 24, "%s\"%s\": ", c ? ", " : "", json_key(cols[c]));
    }
}

/* JSON rows; first: no row came before them. */
static void json_rows(FILE *f, const struct kp_pyprof_row *rows, size_t n_rows, bool first,
                      const enum kp_pyprof_col *cols, int ncols, char keys[][24])
{
    flockfile(f);
    for (size_t i = 0; i < n_rows; i++) {
        fputs_unlocked(i || !first ? ",\n  {" : "\n  {", f);
        for (int c = 0; c < ncols; c++) {
            fputs_unlocked(keys[c], f);
            json_cell(f, &rows[i], cols[c]);
        }
        putc_unlocked('}', f);
    }
    funlockfile(f);
}

static void csv_header(FILE *f, const enum kp_pyprof_col *cols, int ncols)
{
    for (int c = 0; c < ncols; c++) {
        fprintf(f, "%s\"%s\"", c ? "," : "", col_headers[cols[c]]);
    }
    fputc('\n', f);
}

static void csv_rows(FILE *f, const struct kp_pyprof_row *rows, size_t n_rows,
                     const enum kp_pyprof_col *cols, int ncols)
{
    char buf[64];

    for (size_t i = 0; i < n_rows; i++) {
        for (int c = 0; c < ncols; c++) {
            const char *s = cell(&rows[i], cols[c], buf, sizeof(buf));

            fputs(c ? ",\"" : "\"", f);
            for (; *s; s++) {
                if (*s == '"') {
                    fputc('"', f);
                }
                fputc(*s, f);
            }
            fputc('"', f);
        }
        fputc('\n', f);
    }
}

/* Text's widths before any row: the headers'. */
static void text_widths(const enum kp_pyprof_col *cols, int ncols, int *w)
{
    for (int c = 0; c < ncols; c++) {
        w[c] = disp_width(col_headers[cols[c]]);
    }
}

/* Text's widths cut to width (> 0), then its header line. The caller holds f's lock. */
static void text_header(FILE *f, const enum kp_pyprof_col *cols, int ncols, int *w, int width)
{
    for (int c = 0; c < ncols; c++) {
        if (width > 0 && w[c] > width) {
            w[c] = width;
        }
    }
    for (int c = 0; c < ncols; c++) {
        put_cell(f, c ? " " : "", col_headers[cols[c]], w[c], c == ncols - 1);
    }
    putc_unlocked('\n', f);
}

void kp_pyprof_write_rows(FILE *f, const struct kp_pyprof_row *rows, size_t n_rows, int64_t run,
                          int rank, const enum kp_pyprof_col *cols, int ncols,
                          enum kp_pyprof_format fmt, int width)
{
    char buf[64];
    char keys[KP_PYPROF_COL_COUNT][24]; /* ", \"altseq\": " at most */
    int w[KP_PYPROF_COL_COUNT] = { 0 };

    if (fmt == KP_PYPROF_JSON) {
        json_begin(f, run, rank, cols, ncols, keys);
        json_rows(f, rows, n_rows, true, cols, ncols, keys);
        fputs("]}\n", f);
        return;
    }
    if (fmt == KP_PYPROF_CSV) {
        csv_header(f, cols, ncols);
        csv_rows(f, rows, n_rows, cols, ncols);
        return;
    }
    /* columnated: each column as wide as its longest cell, at most width (the rows are all
     * here: two passes over them, nothing kept) */
    text_widths(cols, ncols, w);
    for (int c = 0; c < ncols; c++) {
        for (size_t i = 0; i < n_rows; i++) {
            int l = disp_width(cell(&rows[i], cols[c], buf, sizeof(buf)));

            if (l > w[c]) {
                w[c] = l;
            }
        }
    }
    flockfile(f); /* once, not once a cell */
    text_header(f, cols, ncols, w, width);
    for (size_t i = 0; i < n_rows; i++) {
        for (int c = 0; c < ncols; c++) {
            put_cell(f, c ? " " : "", cell(&rows[i], cols[c], buf, sizeof(buf)), w[c],
                     c == ncols - 1);
        }
        putc_unlocked('\n', f);
    }
    funlockfile(f);
}

/* ---- the writer of rows as they come ----------------------------------------------------- */

/* Text cells kept in memory up to this, then in a file. */
#define SPOOL_MEM_MAX (16u << 20)

struct kp_pyprof_writer {
    FILE *f;
    enum kp_pyprof_col cols[KP_PYPROF_COL_COUNT];
    int ncols;
    enum kp_pyprof_format fmt;
    int width;
    size_t rows; /* written or kept */
    char keys[KP_PYPROF_COL_COUNT][24];
    int w[KP_PYPROF_COL_COUNT];
    /* text: every cell, each ended by a NUL (no cell holds one: they are C strings) */
    char *mem;
    size_t len, cap;
    FILE *spool; /* past SPOOL_MEM_MAX: an unlinked file in $TMPDIR, mem then empty */
    char spool_dir[256];
};

int kp_pyprof_writer_open(FILE *f, int64_t run, int rank, const enum kp_pyprof_col *cols, int ncols,
                          enum kp_pyprof_format fmt, int width, struct kp_pyprof_writer **out)
{
    struct kp_pyprof_writer *w = calloc(1, sizeof(*w));

    *out = NULL;
    if (w == NULL) {
        return -ENOMEM;
    }
    w->f = f;
    w->ncols = ncols < KP_PYPROF_COL_COUNT ? ncols : KP_PYPROF_COL_COUNT;
    memcpy(w->cols, cols, (size_t) w->ncols * sizeof(cols[0]));
    w->fmt = fmt;
    w->width = width;
    if (fmt == KP_PYPROF_JSON) {
        json_begin(f, run, rank, w->cols, w->ncols, w->keys);
    }
    else if (fmt == KP_PYPROF_CSV) {
        csv_header(f, w->cols, w->ncols);
    }
    else {
        text_widths(w->cols, w->ncols, w->w);
    }
    *out = w;
    return 0;
}

/* Moves the cells kept in memory to an unlinked file in $TMPDIR (else /tmp). 0 or -errno. */
static int spool_to_file(struct kp_pyprof_writer *w, char *errbuf, size_t errlen)
{
    const char *dir = getenv("TMPDIR");
    char path[300];
    int fd, e;

    kp_strlcpy(w->spool_dir, sizeof(w->spool_dir), dir != NULL && dir[0] ? dir : "/tmp");
    snprintf(path, sizeof(path), "%s/kprof-prof-XXXXXX", w->spool_dir);
    if ((fd = mkstemp(path)) < 0) {
        e = errno;
        kp_errbuf_set(errbuf, errlen,
                      "cannot keep the table's cells in %s (%s): the text table is printed "
                      "once every row has come; set TMPDIR, or print --csv or --json, which "
                      "stream",
                      w->spool_dir, strerror(e));
        return -e;
    }
    unlink(path); /* gone with the writer, whatever happens */
    if ((w->spool = fdopen(fd, "w+")) == NULL) {
        e = errno;
        close(fd);
        kp_errbuf_set(errbuf, errlen, "cannot keep the table's cells in %s: %s", w->spool_dir,
                      strerror(e));
        return -e;
    }
    if (w->len > 0 && fwrite(w->mem, 1, w->len, w->spool) != w->len) {
        e = errno ? errno : EIO;
        kp_errbuf_set(errbuf, errlen, "cannot keep the table's cells in %s: %s", w->spool_dir,
                      strerror(e));
        return -e;
    }
    free(w->mem);
    w->mem = NULL;
    w->len = w->cap = 0;
    return 0;
}

/* Keeps one cell (and its NUL). 0 or -errno. */
static int keep(struct kp_pyprof_writer *w, const char *s, char *errbuf, size_t errlen)
{
    size_t n = strlen(s) + 1;

    if (w->spool != NULL) {
        return fwrite(s, 1, n, w->spool) == n ? 0 : -(errno ? errno : EIO);
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 1u << 16;
        char *m;

        while (cap < w->len + n) {
            cap *= 2;
        }
        if (cap > SPOOL_MEM_MAX) {
            int rc = spool_to_file(w, errbuf, errlen);

            return rc != 0 ? rc : keep(w, s, errbuf, errlen);
        }
        if ((m = realloc(w->mem, cap)) == NULL) {
            return -ENOMEM;
        }
        w->mem = m;
        w->cap = cap;
    }
    memcpy(w->mem + w->len, s, n);
    w->len += n;
    return 0;
}

int kp_pyprof_writer_rows(struct kp_pyprof_writer *w, const struct kp_pyprof_row *rows, size_t n,
                          char *errbuf, size_t errlen)
{
    char buf[64];
    int rc = 0;

    if (errlen > 0) {
        errbuf[0] = '\0';
    }
    if (w->fmt == KP_PYPROF_JSON) {
        json_rows(w->f, rows, n, w->rows == 0, w->cols, w->ncols, w->keys);
    }
    else if (w->fmt == KP_PYPROF_CSV) {
        csv_rows(w->f, rows, n, w->cols, w->ncols);
    }
    else {
        for (size_t i = 0; i < n && rc == 0; i++) {
            for (int c = 0; c < w->ncols && rc == 0; c++) {
                const char *s = cell(&rows[i], w->cols[c], buf, sizeof(buf));
                int l = disp_width(s);

                if (l > w->w[c]) {
                    w->w[c] = l;
                }
                rc = keep(w, s, errbuf, errlen);
            }
        }
        if (rc != 0 && errbuf[0] == '\0') {
            kp_errbuf_set(errbuf, errlen, "cannot keep the table's cells%s%s: %s",
                          w->spool != NULL ? " in " : "", w->spool != NULL ? w->spool_dir : "",
                          strerror(-rc));
        }
    }
    w->rows += n;
    return rc;
}

/* Text: the header, then the kept cells, a line a row. 0 or -errno. */
static int text_end(struct kp_pyprof_writer *w, char *errbuf, size_t errlen)
{
    FILE *f = w->f;
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;

    if (w->spool != NULL && (fflush(w->spool) != 0 || fseek(w->spool, 0, SEEK_SET) != 0)) {
        rc = -(errno ? errno : EIO);
    }
    flockfile(f);
    text_header(f, w->cols, w->ncols, w->w, w->width);
    for (size_t i = 0, at = 0; i < w->rows && rc == 0; i++) {
        for (int c = 0; c < w->ncols; c++) {
            const char *s;

            if (w->spool == NULL) {
                s = w->mem + at;
                at += strlen(s) + 1;
            }
            else if (getdelim(&line, &cap, '\0', w->spool) < 0) {
                rc = -(ferror(w->spool) && errno ? errno : EIO);
                break;
            }
            else {
                s = line;
            }
            put_cell(f, c ? " " : "", s, w->w[c], c == w->ncols - 1);
        }
        putc_unlocked('\n', f);
    }
    funlockfile(f);
    free(line);
    if (rc != 0) {
        kp_errbuf_set(errbuf, errlen, "cannot read the table's cells back from %s: %s",
                      w->spool_dir, strerror(-rc));
    }
    return rc;
}

int kp_pyprof_writer_close(struct kp_pyprof_writer *w, bool complete, char *errbuf, size_t errlen)
{
    int rc = 0;

    if (w == NULL) {
        return 0;
    }
    if (complete && w->fmt == KP_PYPROF_JSON) {
        fputs("]}\n", w->f);
    }
    else if (complete && w->fmt == KP_PYPROF_TEXT) {
        rc = text_end(w, errbuf, errlen);
    }
    if (w->spool != NULL) {
        fclose(w->spool);
    }
    free(w->mem);
    free(w);
    return rc;
}
