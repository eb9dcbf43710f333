/*
 * kprofctl prof --run R [--rank N] [-c COLS] [--csv|--json] [-w WIDTH]: PyProf's per-kernel
 * table of one rank (analyzer/pyprof.h) from kprof-analyzer's Analyzer.Prof. The default
 * columns are PyProf's: idx,dir,sub,mod,op,kernel,params,sil (sil in µs; JSON: sil_ns); -w
 * cuts text cells wider than WIDTH with "…", as in every verb (default: none).
 *
 * Output: exactly what `kprof-analyze prof` prints for the same run, rank and flags
 * (tests/it/test_analyzer_roofline.py checks it): the reply's rows go through pyprof.c's own
 * writer, kp_pyprof_write_rows.
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
    long long run;
    long long rank;
};

#define OFF(f) offsetof(struct prof_config, f)
static const struct kp_config_def prof_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(run), "the run (required; kprofctl runs)", NULL,
      false },
    KP_RPCVERB_RANK_DEF(OFF(rank)),
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

static const struct kp_rpcverb_spec prof_spec = {
    .name = "prof",
    .synopsis =
        "kprofctl prof --run R [--rank N] [-c COLS] [--csv|--json] [-w WIDTH]\n"
        "  PyProf's per-kernel table of one rank (Analyzer.Prof), one row per kernel in\n"
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
};

struct prof_rows {
    struct kp_pyprof_row *rows;
    size_t n_rows;
};

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src != NULL ? src : "");
}

/* The reply's rows as pyprof.h's rows; strings point into resp or are copied. */
static void from_reply(const Kprof__V1__ProfResponse *resp, struct kp_pyprof_row *rows)
{
    for (size_t i = 0; i < resp->n_rows; i++) {
        const Kprof__V1__ProfRow *o = resp->rows[i];
        struct kp_pyprof_row *r = &rows[i];

        r->idx = o->idx;
        r->seq = o->seq;
        copy_str(r->altseq, sizeof(r->altseq), o->altseq);
        r->tid = o->tid;
        copy_str(r->layer, sizeof(r->layer), o->layer);
        r->trace = o->trace != NULL ? o->trace : "";
        r->bwd = o->bprop;
        r->sub = o->sub;
        copy_str(r->mod, sizeof(r->mod), o->mod);
        copy_str(r->op, sizeof(r->op), o->op);
        copy_str(r->kernel, sizeof(r->kernel), o->kernel);
        copy_str(r->params, sizeof(r->params), o->params);
        r->sil_ns = o->sil_ns;
        r->tc = o->tc != NULL ? o->tc : "";
        r->device = o->device;
        r->stream = o->stream;
        copy_str(r->grid, sizeof(r->grid), o->grid);
        copy_str(r->block, sizeof(r->block), o->block);
        r->flops = o->flops;
        r->flops_known = o->flops_known;
        r->bytes = o->bytes;
        r->bytes_known = o->bytes_known;
    }
}

int kprofctl_prof(int argc, char **argv)
{
    struct prof_config cfg;
    struct kp_rpcverb v;
    Kprof__V1__ProfRequest req = KPROF__V1__PROF_REQUEST__INIT;
    Kprof__V1__ProfResponse *resp;
    ProtobufCMessage *msg = NULL;
    struct prof_rows pr = { NULL, 0 };
    enum kp_pyprof_col cols[64];
    char err[512];
    int ncols, rc;

    memset(&cfg, 0, sizeof(cfg));
    if ((rc = kp_rpcverb_init(&v, &prof_spec, &cfg, argc, argv)) != KP_RPCVERB_RUN) {
        goto out;
    }
    if (cfg.run == 0) {
        rc = kp_rpcverb_usage_error(&v, "--run is required (kprofctl runs lists the runs)");
        goto out;
    }
    ncols = kp_pyprof_parse_columns(cfg.common.columns != NULL && cfg.common.columns[0] != '\0'
                                        ? cfg.common.columns
                                        : KP_PYPROF_DEFAULT_COLUMNS,
                                    cols, 64, err, sizeof(err));
    if (ncols < 0) {
        rc = kp_rpcverb_usage_error(&v, "%s", err);
        goto out;
    }
    if (cfg.common.width != 0 && cfg.common.width < 20) {
        rc = kp_rpcverb_usage_error(&v, "-w takes a width of 20 or more");
        goto out;
    }
    req.run_id = (uint64_t) cfg.run;
    req.rank = (int32_t) cfg.rank;
    kp_rpcverb_set_subject(&v, cfg.run, cfg.rank);
    if ((rc = kp_rpcverb_call(&v, "Prof", &req.base, &kprof__v1__prof_response__descriptor,
                              &msg)) != 0) {
        goto out;
    }
    resp = (Kprof__V1__ProfResponse *) msg;
    pr.rows = calloc(resp->n_rows ? resp->n_rows : 1, sizeof(*pr.rows));
    if (pr.rows == NULL) {
        kp_rpcverb_error(&v, "out of memory");
        rc = KPROFCTL_EXIT_FAILED;
        goto out;
    }
    pr.n_rows = resp->n_rows;
    from_reply(resp, pr.rows);
    kp_pyprof_write_rows(stdout, pr.rows, pr.n_rows, cfg.run, resp->rank, cols, ncols,
                         v.format == KP_TABLE_FORMAT_JSON  ? KP_PYPROF_JSON
                         : v.format == KP_TABLE_FORMAT_CSV ? KP_PYPROF_CSV
                                                           : KP_PYPROF_TEXT,
                         cfg.common.width > 0 ? (int) cfg.common.width : KP_PYPROF_DEFAULT_WIDTH);
    rc = fflush(stdout) == 0 && !ferror(stdout) ? KPROFCTL_EXIT_OK : KPROFCTL_EXIT_FAILED;
out:
    free(pr.rows);
    if (msg != NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    kp_rpcverb_fini(&v);
    return rc;
}
