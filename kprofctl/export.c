/*
 * kprofctl export --run R [--rank N] -o FILE|DIR|- [--gzip]: writes a run as Chrome trace JSON
 * (Kineto's dialect) that ui.perfetto.dev and chrome://tracing open and that `kprofctl import`
 * reads back to the same rows. kprof-analyzer reads PostgreSQL and streams the files
 * (Analyzer.Export, analyzer/export.h has the layout); this verb is a gRPC client that writes
 * them, so kprofctl links no libpq. --analyzer (KPROF_ANALYZER) names kprof-analyzer.
 *
 * Files. One trace file per rank, because a Kineto trace is one rank and that is what import
 * reads back exactly:
 *  - -o FILE: the run's only rank, or --rank N. A run with several ranks and no --rank is a
 *    usage error (exit 2) that says to pass --rank or a directory.
 *  - -o DIR (an existing directory, or a path ending in '/', created if missing): one file per
 *    rank, DIR/kprof-run<R>.rank-<N>.pt.trace.json (.json.gz with --gzip); `kprofctl import
 *    DIR` reads them all back as one run.
 *  - -o -: stdout (one rank, as for FILE).
 * A FILE ending in .gz (or --gzip) is gzip-compressed (by kprof-analyzer, with zlib). Files are
 * written to a temporary name beside the target, fsynced and renamed, so a reader never sees
 * half a file; a failed export leaves no temporary behind.
 *
 * Output: one line on stdout (stderr when the trace goes to stdout), or with --json one
 * object: {"run_id", "seconds", "json_bytes", "events", "files": [{"rank", "path",
 * "json_bytes", "events", "flows", "rows": {table: n}}]}; --csv: one line per file (rank,
 * path, json_bytes, events, flows).
 *
 * Exit status: 0; 1 failure (writing, kprof-analyzer failed); 2 usage; 3 the run or rank does
 * not exist; 5 kprof-analyzer or its PostgreSQL unreachable.
 */
#define KP_LOG_MODULE "export"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_log.h"
#include "kp_rpc.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

#define EXPORT_MAX_ARGS 256

struct export_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets (and run, rank) */
    char *output;
    long long fetch_rows;
    long long gzip_level;
    bool gzip;
};

#define OFF(f) offsetof(struct export_config, f)
static const struct kp_config_def export_defs[] = {
    { "run", KP_CONFIG_INT, "0", 0, 2147483647, OFF(common.run),
      "id of the run to export (required; kprofctl runs)", NULL, false },
    { "rank", KP_CONFIG_INT, "-1", -1, 65535, OFF(common.rank),
      "export only this rank (-1: every rank; a FILE output needs one rank)", NULL, false },
    { "output", KP_CONFIG_STRING, "", 0, 4000, OFF(output),
      "output: FILE (.gz: gzip), DIR (one file per rank; DIR/ is created) or - (stdout); also -o",
      NULL, false },
    { "gzip", KP_CONFIG_BOOL, "false", 0, 0, OFF(gzip),
      "gzip the output even without a .gz suffix (per-rank files get .json.gz)", NULL, false },
    { "gzip-level", KP_CONFIG_INT, "1", 1, 9, OFF(gzip_level), "zlib compression level", NULL,
      false },
    { "fetch-rows", KP_CONFIG_INT, "10000", 100, 1000000, OFF(fetch_rows),
      "rows kprof-analyzer fetches from PostgreSQL per round trip", NULL, false },
};
#undef OFF
#define N_DEFS (sizeof(export_defs) / sizeof(export_defs[0]))

enum export_col {
    COL_RANK,
    COL_PATH,
    COL_JSON_BYTES,
    COL_EVENTS,
    COL_FLOWS,
    N_COLS
};

static const struct kp_table_col export_cols[N_COLS] = {
    [COL_RANK] = { "rank", KP_TABLE_NUMERIC },
    [COL_PATH] = { "path", KP_TABLE_TEXT },
    [COL_JSON_BYTES] = { "json_bytes", KP_TABLE_NUMERIC },
    [COL_EVENTS] = { "events", KP_TABLE_NUMERIC },
    [COL_FLOWS] = { "flows", KP_TABLE_NUMERIC },
};

static const struct kp_rpcverb_spec export_spec = {
    .name = "export",
    .synopsis =
        "kprofctl export --run R [--rank N] -o FILE|DIR|- [--gzip] [--json|--csv]\n"
        "  Writes a run as Chrome/Perfetto trace JSON (Kineto's dialect), one file per rank,\n"
        "  streamed by kprof-analyzer (Analyzer.Export); `kprofctl import` reads it back.\n",
    .exit_ok = "exported",
    .json_help = "print the result as one JSON object (files, bytes, events, rows per table)",
    .defs = export_defs,
    .n_defs = N_DEFS,
    .cols = export_cols,
    .n_cols = N_COLS,
    .analyzer = true,
};

struct rank_result {
    long rank;
    char *path;
    uint64_t bytes, events, flows;
    uint64_t rows[KP_EV_COUNT];
};

/* The file being written. */
struct outf {
    char *path; /* borrowed from its rank_result */
    char *tmp;  /* NULL for stdout */
    int fd;
};

static bool has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);

    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* argv with "-o X" / "-oX" turned into "--output X" (kp_config takes only long flags). */
static int fix_argv(int argc, char **argv, char **out, int max)
{
    int n = 0;

    for (int i = 0; i < argc && n < max; i++) {
        if (strcmp(argv[i], "--") == 0) {
            for (; i < argc && n < max; i++) {
                out[n++] = argv[i];
            }
            break;
        }
        if (strcmp(argv[i], "-o") == 0) {
            out[n++] = (char *) "--output";
        }
        else if (strncmp(argv[i], "-o", 2) == 0 && argv[i][2] != '-') {
            out[n++] = (char *) "--output";
            if (n < max) {
                out[n++] = argv[i] + 2;
            }
        }
        else {
            out[n++] = argv[i];
        }
    }
    return n < max ? n : -1;
}

/* mkdir -p path. Returns 0 or -errno. */
static int make_dirs(const char *path)
{
    char *p = strdup(path);
    int rc = 0;

    if (p == NULL) {
        return -ENOMEM;
    }
    for (char *s = p + 1; rc == 0; s++) {
        bool end = *s == '\0';

        if (*s != '/' && !end) {
            continue;
        }
        *s = '\0';
        if (p[0] != '\0' && mkdir(p, 0777) != 0 && errno != EEXIST) {
            rc = -errno;
        }
        if (end) {
            break;
        }
        *s = '/';
    }
    free(p);
    return rc;
}

/* Opens path for writing: a temporary beside it ("-": stdout). Returns 0 or -errno. */
static int out_open(struct outf *f, char *path)
{
    size_t n = strlen(path) + 16;
    mode_t um;

    f->path = path;
    f->tmp = NULL;
    if (strcmp(path, "-") == 0) {
        f->fd = STDOUT_FILENO;
        return 0;
    }
    if ((f->tmp = malloc(n)) == NULL) {
        return -ENOMEM;
    }
    snprintf(f->tmp, n, "%s.tmp.XXXXXX", path);
    if ((f->fd = mkstemp(f->tmp)) < 0) {
        int e = -errno;

        free(f->tmp);
        f->tmp = NULL;
        return e;
    }
    um = umask(0);
    umask(um);
    (void) fchmod(f->fd, 0666 & ~um);
    return 0;
}

static int out_write(struct outf *f, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);

        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        p += w;
        n -= (size_t) w;
    }
    return 0;
}

/* Finishes the file: fsync, close, rename tmp → path (ok), or unlink tmp (!ok). */
static int out_close(struct outf *f, bool ok)
{
    int rc = 0;

    if (f->path == NULL) {
        return 0;
    }
    if (f->tmp != NULL) {
        if (ok && fsync(f->fd) != 0) {
            rc = -errno;
        }
        if (close(f->fd) != 0 && rc == 0) {
            rc = -errno;
        }
        if (ok && rc == 0 && rename(f->tmp, f->path) != 0) {
            rc = -errno;
        }
        if (!ok || rc != 0) {
            unlink(f->tmp);
        }
        free(f->tmp);
    }
    f->path = NULL;
    f->tmp = NULL;
    f->fd = -1;
    return rc;
}

static void print_json(FILE *out, long run, double secs, const struct rank_result *r, size_t n)
{
    uint64_t bytes = 0, events = 0;

    for (size_t i = 0; i < n; i++) {
        bytes += r[i].bytes;
        events += r[i].events;
    }
    fprintf(out,
            "{\"run_id\":%ld,\"seconds\":%.6f,\"json_bytes\":%" PRIu64 ",\"events\":%" PRIu64
            ",\"files\":[",
            run, secs, bytes, events);
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "%s{\"rank\":%ld,\"path\":", i ? "," : "", r[i].rank);
        kp_json_fputs(out, r[i].path);
        fprintf(out,
                ",\"json_bytes\":%" PRIu64 ",\"events\":%" PRIu64 ",\"flows\":%" PRIu64
                ",\"rows\":{",
                r[i].bytes, r[i].events, r[i].flows);
        for (int k = 0; k < KP_EV_COUNT; k++) {
            fprintf(out, "%s\"%s\":%" PRIu64, k ? "," : "", kp_event_kinds[k].table, r[i].rows[k]);
        }
        fprintf(out, "}}");
    }
    fprintf(out, "]}\n");
}

static int print_csv(const struct kp_rpcverb *v, const struct rank_result *r, size_t n)
{
    struct kp_table *t = NULL;
    int rc = 0;

    if (kp_rpcverb_table(v, &t) != 0) {
        return KPROFCTL_EXIT_FAILED;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = rc != 0 ? rc : kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_RANK, r[i].rank);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_PATH, r[i].path);
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_JSON_BYTES, r[i].bytes);
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_EVENTS, r[i].events);
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_FLOWS, r[i].flows);
    }
    if (rc != 0) {
        kp_rpcverb_error(v, "%s", kp_strerror(rc));
        kp_table_destroy(t);
        return KPROFCTL_EXIT_FAILED;
    }
    rc = kp_rpcverb_print(v, t, stdout);
    kp_table_destroy(t);
    return rc;
}

/* One export: where it writes and what it wrote. */
struct export
{
    struct kp_rpcverb *v;
    const struct export_config *cfg;
    bool dir_mode; /* -o DIR: one file per rank */
    bool gz;
    struct outf f; /* the file being written: f.path NULL between files */
    struct rank_result *res;
    size_t n_res, cap;
};

/* Starts the file of c's rank: its rank_result, path and temporary. Returns 0 or 1 (printed). */
static int file_begin(const struct kp_rpcverb *v, struct export *ex,
                      const Kprof__V1__ExportChunk *c)
{
    const struct export_config *cfg = ex->cfg;
    struct rank_result *rr;
    int e;

    if (!ex->dir_mode && ex->n_res > 0) {
        kp_rpcverb_error(v, "kprof-analyzer sent more than one rank for one file");
        return KPROFCTL_EXIT_FAILED;
    }
    if (ex->n_res == ex->cap) {
        size_t nc = ex->cap ? 2 * ex->cap : 8;
        struct rank_result *nr = realloc(ex->res, nc * sizeof(*ex->res));

        if (nr == NULL) {
            kp_rpcverb_error(v, "out of memory");
            return KPROFCTL_EXIT_FAILED;
        }
        ex->res = nr;
        ex->cap = nc;
    }
    rr = &ex->res[ex->n_res++];
    memset(rr, 0, sizeof(*rr));
    rr->rank = c->rank;
    if (ex->dir_mode) {
        size_t ol = strlen(cfg->output), n = ol + 96;

        if ((rr->path = malloc(n)) != NULL) {
            snprintf(rr->path, n, "%s%skprof-run%lld.rank-%ld.pt.trace.json%s", cfg->output,
                     cfg->output[ol - 1] == '/' ? "" : "/", cfg->common.run, rr->rank,
                     ex->gz ? ".gz" : "");
        }
    }
    else {
        rr->path = strdup(cfg->output);
    }
    if (rr->path == NULL || (e = out_open(&ex->f, rr->path)) != 0) {
        kp_rpcverb_error(v,
                         "cannot write %s: %s (check the directory exists and is "
                         "writable)",
                         rr->path != NULL ? rr->path : cfg->output,
                         rr->path != NULL ? strerror(-e) : "out of memory");
        return KPROFCTL_EXIT_FAILED;
    }
    return 0;
}

/* Ends the file of the last rank: renamed into place, its figures kept. Returns 0 or 1
 * (printed). */
static int file_end(const struct kp_rpcverb *v, struct export *ex, const Kprof__V1__ExportChunk *c)
{
    struct rank_result *rr = &ex->res[ex->n_res - 1];
    int e = out_close(&ex->f, true);

    if (e != 0) {
        kp_rpcverb_error(v, "writing %s: %s", rr->path, strerror(-e));
        return KPROFCTL_EXIT_FAILED;
    }
    rr->bytes = c->json_bytes;
    rr->events = c->events;
    rr->flows = c->flows;
    for (size_t i = 0; i < c->n_rows; i++) {
        for (int k = 0; k < KP_EV_COUNT; k++) {
            if (c->rows[i]->table != NULL &&
                strcmp(c->rows[i]->table, kp_event_kinds[k].table) == 0) {
                rr->rows[k] = c->rows[i]->rows;
            }
        }
    }
    return 0;
}

/* One chunk: its bytes into its rank's file, which it may start or end. Returns 0 or 1
 * (printed). */
static int take_chunk(const struct kp_rpcverb *v, struct export *ex,
                      const Kprof__V1__ExportChunk *c)
{
    int rc;

    if (ex->f.path != NULL && (ex->n_res == 0 || ex->res[ex->n_res - 1].rank != c->rank)) {
        kp_rpcverb_error(v, "kprof-analyzer switched ranks in the middle of a file");
        return KPROFCTL_EXIT_FAILED;
    }
    if (ex->f.path == NULL && (rc = file_begin(v, ex, c)) != 0) {
        return rc;
    }
    if (c->data.len > 0 && (rc = out_write(&ex->f, c->data.data, c->data.len)) != 0) {
        kp_rpcverb_error(v, "writing %s: %s", ex->f.path, strerror(-rc));
        return KPROFCTL_EXIT_FAILED;
    }
    return c->end_of_rank ? file_end(v, ex, c) : 0;
}

/* kp_rpcverb_stream's taker: a chunk into its file. */
static int export_chunk(void *ud, const ProtobufCMessage *msg)
{
    struct export *ex = ud;

    return take_chunk(ex->v, ex, (const Kprof__V1__ExportChunk *) msg);
}

/* Streams Analyzer.Export into the files. Returns 0 or the exit status (printed). */
static int stream_export(struct kp_rpcverb *v, struct export *ex,
                         const Kprof__V1__ExportRequest *req)
{
    int rc = kp_rpcverb_stream(v, "Export", &req->base, &kprof__v1__export_chunk__descriptor,
                               export_chunk, ex);

    if (rc != 0) {
        return rc;
    }
    if (ex->f.path != NULL || ex->n_res == 0) {
        kp_rpcverb_error(v, "kprof-analyzer ended the export in the middle of a file");
        return KPROFCTL_EXIT_FAILED;
    }
    return 0;
}

/* What was written: one line (on stderr when the trace went to stdout), --json or --csv.
 * Returns 0 or the exit status. */
static int report(const struct kp_rpcverb *v, const struct export *ex, double secs)
{
    const struct export_config *cfg = ex->cfg;
    FILE *sout = strcmp(cfg->output, "-") == 0 ? stderr : stdout;
    uint64_t bytes = 0, events = 0;

    for (size_t i = 0; i < ex->n_res; i++) {
        bytes += ex->res[i].bytes;
        events += ex->res[i].events;
    }
    if (v->common->json) {
        print_json(sout, (long) cfg->common.run, secs, ex->res, ex->n_res);
        return 0;
    }
    if (v->common->csv) {
        return print_csv(v, ex->res, ex->n_res);
    }
    fprintf(sout,
            "run %lld: exported %zu rank%s (%" PRIu64 " events, %.1f MB of JSON) to %s in "
            "%.2f s (%.1f MB/s)\n",
            cfg->common.run, ex->n_res, ex->n_res == 1 ? "" : "s", events, (double) bytes / 1e6,
            ex->dir_mode ? cfg->output : ex->res[0].path, secs,
            secs > 0 ? (double) bytes / 1e6 / secs : 0.0);
    return 0;
}

/* -o DIR (an existing directory, or a path ending in '/'): created. Returns 0 or 1 (printed). */
static int output_dir(const struct kp_rpcverb *v, struct export *ex)
{
    const char *out = ex->cfg->output;
    struct stat sb;
    int e;

    ex->dir_mode = (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)) || out[strlen(out) - 1] == '/';
    if (ex->dir_mode && (e = make_dirs(out)) != 0) {
        kp_rpcverb_error(v, "cannot create the directory %s: %s", out, strerror(-e));
        return KPROFCTL_EXIT_FAILED;
    }
    ex->gz = ex->cfg->gzip || (!ex->dir_mode && has_suffix(out, ".gz"));
    return 0;
}

int kprofctl_export(int argc, char **argv)
{
    struct export_config cfg;
    struct kp_rpcverb v;
    struct export ex = { .v = &v, .cfg = &cfg, .f = { NULL, NULL, -1 } };
    Kprof__V1__ExportRequest req = KPROF__V1__EXPORT_REQUEST__INIT;
    char **av = NULL;
    double t0;
    int rc, ac;

    memset(&cfg, 0, sizeof(cfg));
    if (argc > EXPORT_MAX_ARGS || (av = calloc((size_t) argc + 2, sizeof(*av))) == NULL ||
        (ac = fix_argv(argc, argv, av, argc + 2)) < 0) {
        fprintf(stderr, "kprofctl export: too many arguments\n");
        free(av);
        return KPROFCTL_EXIT_USAGE;
    }
    if ((rc = kp_rpcverb_init(&v, &export_spec, &cfg, ac, av)) != KP_RPCVERB_RUN) {
        goto out;
    }
    if (cfg.common.run <= 0 || cfg.output == NULL || cfg.output[0] == '\0') {
        rc = kp_rpcverb_usage_error(&v, "%s",
                                    cfg.common.run <= 0 ? "--run is required" : "-o is required");
        goto out;
    }
    if ((rc = output_dir(&v, &ex)) != 0) {
        goto out;
    }
    req.run_id = (uint64_t) cfg.common.run;
    req.all_ranks = cfg.common.rank < 0;
    req.rank = cfg.common.rank < 0 ? 0 : (int32_t) cfg.common.rank;
    req.one_rank = !ex.dir_mode;
    req.gzip = ex.gz;
    req.gzip_level = (int32_t) cfg.gzip_level;
    req.fetch_rows = (uint32_t) cfg.fetch_rows;
    kp_rpcverb_set_subject(&v, cfg.common.run, -1);
    t0 = kp_mono_s();
    if ((rc = stream_export(&v, &ex, &req)) == 0) {
        rc = report(&v, &ex, kp_mono_s() - t0);
    }
out:
    (void) out_close(&ex.f, false);
    for (size_t i = 0; i < ex.n_res; i++) {
        free(ex.res[i].path);
    }
    free(ex.res);
    kp_rpcverb_fini(&v);
    free(av);
    return rc;
}
