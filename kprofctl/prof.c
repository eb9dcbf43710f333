/*
 * kprofctl prof --run R [--rank N] [-c COLS] [--csv|--json] [-w WIDTH]: PyProf's per-kernel
 * table of one rank (analyzer/pyprof.h) from kprof-analyzer's Analyzer.ProfRows, page by page as
 * the analyzer reads the rank by windows: CSV and JSON rows are printed as they come, and a text
 * table (whose columns need every row) keeps its cells until the end, past 16 MiB in an
 * unlinked file in $TMPDIR, so neither kprofctl nor the analyzer holds a large rank. The default
 * columns are PyProf's: idx,dir,sub,mod,op,kernel,params,sil (sil in µs; JSON: sil_ns); -w
 * cuts text cells wider than WIDTH with "…", as in every verb (default: none).
 *
 * Output: exactly what `kprof-analyze prof` prints for the same run, rank and flags
 * (tests/it/test_analyzer_roofline.py checks it): the reply's rows go through pyprof.c's own
 * writer (kp_pyprof_writer_*).
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or rank, 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "prof"
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "pyprof.h"
#include "rpcverb.h"
#include "table.h"

struct prof_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    enum kp_pyprof_col cols[64];     /* -c, parsed */
    int ncols;
    /* the stream's state: the writer (from the first page on), a page's rows as pyprof.h's */
    struct kp_pyprof_writer *w;
    struct kp_pyprof_row *rows;
    size_t cap;
    uint64_t seen, total; /* rows come, and the last page's count */
    bool got_last;
};

#define OFF(f) offsetof(struct prof_config, f)
static const struct kp_config_def prof_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
};
#undef OFF

/* PyProf's columns, so that -c is checked against them. */
static const struct kp_table_col prof_cols[KP_PYPROF_COL_COUNT] = {
    { "idx", KP_TABLE_NUMERIC },    { "seq", KP_TABLE_NUMERIC },   { "altseq", KP_TABLE_TEXT },
    { "tid", KP_TABLE_NUMERIC },    { "layer", KP_TABLE_TEXT },    { "trace", KP_TABLE_TEXT },
    { "dir", KP_TABLE_TEXT },       { "sub", KP_TABLE_NUMERIC },   { "mod", KP_TABLE_TEXT },
    { "op", KP_TABLE_TEXT },        { "kernel", KP_TABLE_TEXT },   { "params", KP_TABLE_TEXT },
    { "sil", KP_TABLE_NUMERIC },    { "tc", KP_TABLE_TEXT },       { "device", KP_TABLE_NUMERIC },
    { "stream", KP_TABLE_NUMERIC }, { "grid", KP_TABLE_TEXT },     { "block", KP_TABLE_TEXT },
    { "flops", KP_TABLE_NUMERIC },  { "bytes", KP_TABLE_NUMERIC },
};

static const char *str_or_empty(const char *s)
{
    return s != NULL ? s : "";
}

/* A page's rows as pyprof.h's rows; strings point into the page. */
static void from_page(const Kprof__V1__ProfPage *page, struct kp_pyprof_row *rows)
{
    for (size_t i = 0; i < page->n_rows; i++) {
        const Kprof__V1__ProfRow *o = page->rows[i];
        struct kp_pyprof_row *r = &rows[i];

        r->idx = o->idx;
        r->seq = o->seq;
        r->altseq = str_or_empty(o->altseq);
        r->tid = o->tid;
        r->layer = str_or_empty(o->layer);
        r->trace = o->trace != NULL ? o->trace : "";
        r->bwd = o->bprop;
        r->sub = o->sub;
        r->mod = str_or_empty(o->mod);
        r->op = str_or_empty(o->op);
        r->kernel = str_or_empty(o->kernel);
        r->params = str_or_empty(o->params);
        r->sil_ns = o->sil_ns;
        r->tc = o->tc != NULL ? o->tc : "";
        r->device = o->device;
        r->stream = o->stream;
        r->grid = str_or_empty(o->grid);
        r->block = str_or_empty(o->block);
        r->flops = o->flops;
        r->flops_known = o->flops_known;
        r->bytes = o->bytes;
        r->bytes_known = o->bytes_known;
    }
}

/* -c as PyProf's columns, and -w. */
static int prof_check(struct kp_rpcverb *v)
{
    struct prof_config *cfg = v->cfg;
    const char *cols = cfg->common.columns;
    char err[512];

    cfg->ncols =
        kp_pyprof_parse_columns(cols != NULL && cols[0] != '\0' ? cols : KP_PYPROF_DEFAULT_COLUMNS,
                                cfg->cols, 64, err, sizeof(err));
    if (cfg->ncols < 0) {
        return kp_rpcverb_usage_error(v, "%s", err);
    }
    if (cfg->common.width != 0 && cfg->common.width < 20) {
        return kp_rpcverb_usage_error(v, "-w takes a width of 20 or more");
    }
    return KP_RPCVERB_RUN;
}

static enum kp_pyprof_format format_of(const struct kp_rpcverb *v)
{
    return v->format == KP_TABLE_FORMAT_JSON  ? KP_PYPROF_JSON
           : v->format == KP_TABLE_FORMAT_CSV ? KP_PYPROF_CSV
                                              : KP_PYPROF_TEXT;
}

/* Each ProfRows page through pyprof.c's writer as it comes: CSV and JSON rows are printed at
 * once, text's kept until the last page (its widths need every row). */
static int prof_page(void *ud, const ProtobufCMessage *msg)
{
    struct kp_rpcverb *v = ud;
    struct prof_config *cfg = v->cfg;
    const Kprof__V1__ProfPage *page = (const Kprof__V1__ProfPage *) msg;
    char err[512] = "";
    int rc;

    if (cfg->got_last) {
        kp_rpcverb_error(v, "kprof-analyzer sent rows after the table's last page");
        return KPROFCTL_EXIT_FAILED;
    }
    if (cfg->w == NULL && kp_pyprof_writer_open(stdout, cfg->common.run, page->rank, cfg->cols,
                                                cfg->ncols, format_of(v),
                                                cfg->common.width > 0 ? (int) cfg->common.width
                                                                      : KP_PYPROF_DEFAULT_WIDTH,
                                                &cfg->w) != 0) {
        kp_rpcverb_error(v, "out of memory");
        return KPROFCTL_EXIT_FAILED;
    }
    if (page->n_rows > cfg->cap) {
        struct kp_pyprof_row *r = realloc(cfg->rows, page->n_rows * sizeof(*r));

        if (r == NULL) {
            kp_rpcverb_error(v, "out of memory");
            return KPROFCTL_EXIT_FAILED;
        }
        cfg->rows = r;
        cfg->cap = page->n_rows;
    }
    from_page(page, cfg->rows);
    if ((rc = kp_pyprof_writer_rows(cfg->w, cfg->rows, page->n_rows, err, sizeof(err))) != 0) {
        kp_rpcverb_error(v, "%s", err);
        return KPROFCTL_EXIT_FAILED;
    }
    cfg->seen += page->n_rows;
    if (page->last) {
        cfg->got_last = true;
        cfg->total = page->total_rows;
    }
    return 0;
}

/* After the stream ended OK: the table's end (text: all of it). */
static int prof_end(struct kp_rpcverb *v, const struct kp_table *t, const ProtobufCMessage *msg)
{
    struct prof_config *cfg = v->cfg;
    char err[512] = "";
    int rc;

    (void) t;
    (void) msg;
    if (!cfg->got_last || cfg->seen != cfg->total) {
        kp_rpcverb_error(v,
                         "kprof-analyzer ended the table short (%" PRIu64 " rows of %" PRIu64
                         "%s): run it again",
                         cfg->seen, cfg->total, cfg->got_last ? "" : ", no last page");
        return KPROFCTL_EXIT_FAILED;
    }
    rc = kp_pyprof_writer_close(cfg->w, true, err, sizeof(err));
    cfg->w = NULL;
    if (rc != 0) {
        kp_rpcverb_error(v, "%s", err);
        return KPROFCTL_EXIT_FAILED;
    }
    return fflush(stdout) == 0 && !ferror(stdout) ? KPROFCTL_EXIT_OK : KPROFCTL_EXIT_FAILED;
}

static const struct kp_rpcverb_spec prof_spec = {
    .name = "prof",
    .synopsis =
        "kprofctl prof --run R [--rank N] [-c COLS] [--csv|--json] [-w WIDTH]\n"
        "  PyProf's per-kernel table of one rank (Analyzer.ProfRows), one row per kernel in\n"
        "  launch order; -c picks PyProf's columns (default " KP_PYPROF_DEFAULT_COLUMNS ")\n"
        "  and -w cuts text cells (default: none). Sil is in µs (JSON: exact sil_ns).\n"
        "  The same output as kprof-analyze prof.\n",
    .exit_ok = "shown",
    .json_help = "print {\"run\", \"rank\", \"columns\", \"rows\": [{column: value}]}",
    .defs = prof_defs,
    .n_defs = sizeof(prof_defs) / sizeof(prof_defs[0]),
    .cols = prof_cols,
    .n_cols = KP_PYPROF_COL_COUNT,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "ProfRows",
    .req_desc = &kprof__v1__prof_request__descriptor,
    .resp_desc = &kprof__v1__prof_page__descriptor,
    .check = prof_check,
    .page = prof_page,
    .print = prof_end,
};

int kprofctl_prof(int argc, char **argv)
{
    struct prof_config cfg;
    char err[64];
    int rc;

    memset(&cfg, 0, sizeof(cfg));
    rc = kp_rpcverb_main(&prof_spec, &cfg, argc, argv);
    (void) kp_pyprof_writer_close(cfg.w, false, err, sizeof(err)); /* a stream cut short */
    free(cfg.rows);
    return rc;
}
