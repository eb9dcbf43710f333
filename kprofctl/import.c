/*
 * kprofctl import --job NAME FILE_OR_DIR...: loads torch.profiler (Kineto) traces, one file
 * per rank (.json or .json.gz; directories are searched for them), into one new run through
 * collectord's Ingest path (kp_kineto → kp_push).
 *
 * Steps:
 *  1. Scan every file (kp_kineto_parse with no callback): the whole file is parsed, mapped
 *     and its batches validated, and its rank, world size, base time and devices are learned.
 *     Any error stops here, before a run exists, with the file and the position — unless
 *     --partial, which imports the bad files up to the error.
 *  2. Ranks: distributedInfo.rank, else the file name (rank-3, worker3), else --rank (one
 *     file only), else 0 for one file (a trace without distributedInfo is not distributed). Two
 * files of one rank are an error. The world size is the largest of distributedInfo.world_size, the
 * highest rank + 1 and --world-size.
 *  3. Control.CreateRun (source IMPORT), then each file's batches are pushed on one producer
 *     stream (kp_push: acked only once committed), then EndRun. The batches come from the
 *     file's spool (kp_kineto_spool: the scan kept them encoded, up to IMPORT_SPOOL_MEM bytes
 *     in memory for all files together, the rest in temporary files), so each file is parsed
 *     once; a file whose spool cannot stand for a second parse (kp_kineto.h) is parsed again.
 *     If the push fails, the run is ended FAILED and then dropped (Control.DropRun) with
 *     whatever part of it was stored. If collectord is gone before the run is ended, EndRun
 *     is asked again until --give-up; a run it could not end stays open until collectord's
 *     --open-run-timeout ends it as failed (no producer stream, no batch). Exit status: 0
 *     imported (with --partial also when files were cut short: stderr says so), 1 failed, 2
 *     usage, 5 collectord unreachable or gone, 7 refused for the credential (see --help).
 * A progress bar goes to stderr when it is a terminal; the run id goes to stdout, as JSON
 * with --json.
 */
#define KP_LOG_MODULE "import"
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_kineto.h"
#include "kp_log.h"
#include "kp_push.h"
#include "kp_rpc.h"
#include "kprofctl.h"
#include "rpcverb.h"

#define IMPORT_MAX_ARGS    4096
#define IMPORT_MAX_FILES   65536
#define IMPORT_SPOOL_MEM   (64u << 20) /* scanned batches kept in memory, all files together */
#define CONTROL_TIMEOUT_MS 15000       /* one CreateRun, EndRun or DropRun call */

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };
static const char *const progress_modes[] = { "auto", "on", "off", NULL };

struct import_config {
    char *collector;
    char *tls_ca;
    char *tls_cert;
    char *tls_key;
    char *token_file;
    char *job;
    char *name;
    long long rank;
    long long world_size;
    long long batch_rows;
    long long max_string_bytes;
    long long max_name_bytes;
    long long give_up_ms;
    bool partial;
    bool json;
    int progress;
    int log_level;
};

#define OFF(f) offsetof(struct import_config, f)
static const struct kp_config_def import_defs[] = {
    { "collector", KP_CONFIG_STRING, "127.0.0.1:7070", 1, 0, OFF(collector),
      "kprof-collectord's gRPC address (host:port or unix:/path)", NULL, false },
    KP_RPCVERB_CRED_DEFS(struct import_config, "collectord"),
    { "job", KP_CONFIG_STRING, "", 1, 256, OFF(job), "job name of the new run (required)", NULL,
      false },
    { "name", KP_CONFIG_STRING, "", 0, 256, OFF(name), "run name", NULL, false },
    { "rank", KP_CONFIG_INT, "-1", -1, 65535, OFF(rank),
      "rank of a single file that has no distributedInfo.rank and no rank in its name", NULL,
      false },
    { "world-size", KP_CONFIG_INT, "0", 0, 65536, OFF(world_size),
      "world size of the run (0: from distributedInfo and the ranks)", NULL, false },
    { "partial", KP_CONFIG_BOOL, "false", 0, 0, OFF(partial),
      "import bad files up to their first error instead of importing nothing", NULL, false },
    { "json", KP_CONFIG_BOOL, "false", 0, 0, OFF(json),
      "print the result as one JSON object on stdout", NULL, false },
    { "progress", KP_CONFIG_ENUM, "auto", 0, 0, OFF(progress),
      "progress bar on stderr: auto (when it is a terminal), on or off", progress_modes, false },
    { "batch-rows", KP_CONFIG_INT, "4096", 64, 1 << 20, OFF(batch_rows), "rows per batch", NULL,
      false },
    { "max-string-bytes", KP_CONFIG_SIZE, "1MiB", 1024, 1LL << 30, OFF(max_string_bytes),
      "longest JSON string accepted in a trace", NULL, false },
    { "max-name-bytes", KP_CONFIG_SIZE, "16KiB", 64, 1LL << 20, OFF(max_name_bytes),
      "names are cut to this (keep it <= collectord's max-name-bytes)", NULL, false },
    { "give-up", KP_CONFIG_DURATION, "60s", 100, 86400000, OFF(give_up_ms),
      "fail when collectord makes no progress for this long", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "warn", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
};
#undef OFF
#define N_DEFS (sizeof(import_defs) / sizeof(import_defs[0]))

struct trace_file {
    char *path;
    uint64_t size; /* on disk */
    long rank;
    struct kp_kineto_meta scan;
    struct kp_kineto_meta sent;
    int scan_rc;
    int send_rc;
    struct kp_kineto_spool *spool; /* the scan's batches; NULL: parse again */
    char err[1024];
};

struct import {
    const struct import_config *cfg;
    struct trace_file *files;
    size_t n_files, cap_files;
    uint64_t total_bytes; /* both passes */
    uint64_t done_bytes;  /* of finished files, both passes */
    uint64_t cur_bytes;   /* of the current file */
    bool bar;
    long long bar_last_ns, start_ns;
    const char *phase;
    size_t cur_index;
    struct kp_push *push;
    uint64_t batches_sent;
    size_t spool_mem;  /* in memory in the spools */
    uint64_t reparsed; /* files parsed a second time */
    /* the run */
    struct kp_rpc_channel *ch;
    uint64_t run_id;
    uint32_t world_size;
    bool run_failed;  /* the push failed: the run is ended FAILED and dropped */
    bool any_partial; /* --partial kept the part of a file before its error */
    bool ended;       /* EndRun answered */
    bool unreachable; /* collectord was unreachable or went away */
    bool refused;     /* CreateRun was refused for the credential (exit 7) */
};

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
    (void) sig;
    g_interrupted = 1;
}

static void progress_draw(struct import *im, bool final)
{
    uint64_t done = im->done_bytes + im->cur_bytes;
    double frac = im->total_bytes ? (double) done / (double) im->total_bytes : 1.0;
    double secs = (double) (kp_mono_ns() - im->start_ns) / 1e9;
    char bar[31];
    int fill;

    if (frac > 1.0) {
        frac = 1.0;
    }
    fill = (int) (frac * 30);
    for (int i = 0; i < 30; i++) {
        bar[i] = i < fill ? '#' : '.';
    }
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %3d%% %s %zu/%zu  %.1f MB/s ", bar, (int) (frac * 100), im->phase,
            im->cur_index + 1, im->n_files, secs > 0 ? (double) done / 2 / 1e6 / secs : 0.0);
    if (final) {
        fputc('\n', stderr);
    }
    fflush(stderr);
}

static void on_progress(uint64_t in_bytes, void *ud)
{
    struct import *im = ud;
    long long now;

    im->cur_bytes = in_bytes;
    if (!im->bar) {
        return;
    }
    now = kp_mono_ns();
    if (now - im->bar_last_ns >= 100000000LL) {
        im->bar_last_ns = now;
        progress_draw(im, false);
    }
}

static int add_file(struct import *im, const char *path, uint64_t size)
{
    struct trace_file *f;

    if (im->n_files >= IMPORT_MAX_FILES) {
        fprintf(stderr, "kprofctl import: more than %d files\n", IMPORT_MAX_FILES);
        return -1;
    }
    if (im->n_files == im->cap_files) {
        size_t cap = im->cap_files ? im->cap_files * 2 : 16;
        struct trace_file *p = realloc(im->files, cap * sizeof(*p));

        if (p == NULL) {
            return -1;
        }
        im->files = p;
        im->cap_files = cap;
    }
    f = &im->files[im->n_files];
    memset(f, 0, sizeof(*f));
    if ((f->path = strdup(path)) == NULL) {
        return -1;
    }
    f->size = size;
    im->n_files++;
    return 0;
}

static bool is_trace_name(const char *n)
{
    size_t l = strlen(n);

    return (l > 5 && strcmp(n + l - 5, ".json") == 0) ||
           (l > 8 && strcmp(n + l - 8, ".json.gz") == 0);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Adds the trace files of a directory (sorted by name, subdirectories included). */
static int add_dir(struct import *im, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;

    if (d == NULL) {
        fprintf(stderr, "kprofctl import: %s: cannot open the directory: %s\n", dir,
                strerror(errno));
        return -1;
    }
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') {
            continue;
        }
        if (n == cap) {
            char **p = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof(*p));

            if (p == NULL) {
                rc = -1;
                goto out;
            }
            names = p;
        }
        if ((names[n] = strdup(de->d_name)) == NULL) {
            rc = -1;
            goto out;
        }
        n++;
    }
    qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n && rc == 0; i++) {
        char path[4096];
        struct stat st;

        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        if (stat(path, &st) != 0) {
            continue;
        }
        if (S_ISDIR(st.st_mode) && depth < 8) {
            rc = add_dir(im, path, depth + 1);
        }
        else if (S_ISREG(st.st_mode) && is_trace_name(names[i])) {
            rc = add_file(im, path, (uint64_t) st.st_size);
        }
    }
out:
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
    closedir(d);
    return rc;
}

static int send_batch(Kprof__V1__Batch *b, void *ud)
{
    struct import *im = ud;
    int rc;

    if (g_interrupted) {
        return -EINTR;
    }
    if ((rc = kp_push_send(im->push, b)) == 0) {
        im->batches_sent++;
    }
    return rc;
}

static int send_encoded(const void *buf, size_t len, void *ud)
{
    struct import *im = ud;
    int rc;

    if (g_interrupted) {
        return -EINTR;
    }
    if ((rc = kp_push_send_encoded(im->push, buf, len, NULL)) == 0) {
        im->batches_sent++;
    }
    return rc;
}

/* Sends file f's batches: from its spool, or by parsing it again. */
static int send_file(struct import *im, struct trace_file *f, struct kp_kineto_opts *o)
{
    int rc = KP_KINETO_REPARSE;

    if (f->spool != NULL) {
        rc =
            kp_kineto_spool_replay(f->spool, o, send_encoded, im, &f->sent, f->err, sizeof(f->err));
        kp_kineto_spool_destroy(f->spool);
        f->spool = NULL;
        if (rc != 0 && rc != KP_KINETO_REPARSE) {
            char inner[sizeof(f->err)];

            memcpy(inner, f->err, sizeof(inner));
            kp_errbuf_set(f->err, sizeof(f->err), "%s: %s", f->path, inner);
        }
    }
    if (rc == KP_KINETO_REPARSE) {
        im->reparsed++;
        rc = kp_kineto_parse_file(f->path, o, send_batch, im, &f->sent, f->err, sizeof(f->err));
    }
    return rc;
}

static bool is_unreachable(grpc_status_code code)
{
    return code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED;
}

/* One Control call; *unreachable (may be NULL) is set when collectord could not be reached,
 * *code (may be NULL) to the failed call's status. quiet: print nothing when it could not (the
 * caller retries). */
static bool control_call(const struct import_config *cfg, struct kp_rpc_channel *ch,
                         const char *method, const ProtobufCMessage *req, Kprof__V1__Run **run,
                         bool *unreachable, grpc_status_code *code, bool quiet,
                         long long timeout_ms)
{
    const char *cfg_collector = cfg->collector;
    struct kp_rpcverb_creds creds = { cfg->tls_ca, cfg->tls_cert, cfg->tls_key, cfg->token_file };
    struct kp_rpc_status st;
    ProtobufCMessage *resp = NULL;
    char path[64];

    memset(&st, 0, sizeof(st));
    snprintf(path, sizeof(path), "/kprof.v1.Control/%s", method);
    if (kp_rpc_unary(ch, path, req, &kprof__v1__run__descriptor, &resp, timeout_ms, &st) == 0) {
        *run = (Kprof__V1__Run *) resp;
        return true;
    }
    if (unreachable != NULL) {
        *unreachable = is_unreachable(st.code);
    }
    if (code != NULL) {
        *code = st.code;
    }
    if (is_unreachable(st.code) && quiet) {
        return false;
    }
    if (kp_rpcverb_daemon_answered(&st)) {
        fprintf(stderr, "kprofctl import: collectord at %s answered %s: %s\n", cfg_collector,
                kp_rpc_status_name(st.code), st.details);
    }
    else if (is_unreachable(st.code)) {
        fprintf(stderr,
                "kprofctl import: cannot reach collectord at %s: %s; start it (deploy/local/"
                "kprof-stack up) or pass --collector / KPROF_COLLECTOR\n",
                cfg_collector, st.details);
    }
    else {
        fprintf(stderr, "kprofctl import: collectord at %s refused %s: %s: %s%s\n", cfg_collector,
                method, kp_rpc_status_name(st.code), st.details,
                kp_rpcverb_refused_hint(st.code, false, method, &creds));
    }
    return false;
}

/*
 * Says why the push failed (path may be NULL) and returns whether collectord was unreachable.
 * The push fails on UNAVAILABLE or DEADLINE_EXCEEDED only by giving up: no acknowledgement
 * for --give-up (collectord gone, frozen or wedged; its stream has been cancelled).
 */
static bool push_failed(const struct import *im, const char *path, const char *what)
{
    const struct import_config *cfg = im->cfg;
    struct kp_rpc_status st;
    char dur[32];

    kp_push_error(im->push, &st);
    if (!is_unreachable(st.code)) {
        fprintf(stderr, "kprofctl import: %s%scollectord %s: %s: %s\n", path ? path : "",
                path ? ": " : "", what, kp_rpc_status_name(st.code), st.details);
        return false;
    }
    if (cfg->give_up_ms % 1000 == 0) {
        snprintf(dur, sizeof(dur), "%llds", cfg->give_up_ms / 1000);
    }
    else {
        snprintf(dur, sizeof(dur), "%lldms", cfg->give_up_ms);
    }
    fprintf(stderr,
            "kprofctl import: collectord at %s made no progress for %s; the import is given up "
            "(%s: %s). Check that collectord is running and not stopped or overloaded, or "
            "raise --give-up\n",
            cfg->collector, dur, kp_rpc_status_name(st.code), st.details);
    return true;
}

static void print_result(const struct import *im, uint64_t run_id, uint32_t world_size, double secs,
                         bool ok)
{
    const struct import_config *cfg = im->cfg;
    uint64_t rows[KP_EV_COUNT] = { 0 }, events = 0, json_bytes = 0;

    for (size_t i = 0; i < im->n_files; i++) {
        const struct trace_file *f = &im->files[i];

        events += f->sent.events;
        json_bytes += f->sent.json_bytes;
        for (int k = 0; k < KP_EV_COUNT; k++) {
            rows[k] += f->sent.rows[k];
        }
    }
    if (!cfg->json) {
        printf("run %" PRIu64 ": imported %zu file%s (%" PRIu64
               " events, %.1f MB of JSON) for job %s, "
               "world size %u, in %.2f s (%.1f MB/s)%s\n",
               run_id, im->n_files, im->n_files == 1 ? "" : "s", events, (double) json_bytes / 1e6,
               cfg->job, world_size, secs, secs > 0 ? (double) json_bytes / 1e6 / secs : 0.0,
               ok ? "" : " with errors (--partial)");
        return;
    }
    printf("{\"run_id\":%" PRIu64 ",\"job\":", run_id);
    kp_json_fputs(stdout, cfg->job);
    printf(",\"world_size\":%u,\"ok\":%s,\"seconds\":%.6f,\"json_bytes\":%" PRIu64
           ",\"events\":%" PRIu64 ",\"batches\":%" PRIu64 ",\"rows\":{",
           world_size, ok ? "true" : "false", secs, json_bytes, events, im->batches_sent);
    for (int k = 0; k < KP_EV_COUNT; k++) {
        printf("%s\"%s\":%" PRIu64, k ? "," : "", kp_event_kinds[k].table, rows[k]);
    }
    printf("},\"files\":[");
    for (size_t i = 0; i < im->n_files; i++) {
        const struct trace_file *f = &im->files[i];

        printf("%s{\"path\":", i ? "," : "");
        kp_json_fputs(stdout, f->path);
        printf(",\"rank\":%ld,\"bytes\":%" PRIu64 ",\"json_bytes\":%" PRIu64 ",\"events\":%" PRIu64
               ",\"batches\":%" PRIu64 ",\"ext_dropped\":%" PRIu64 ",\"names_truncated\":%" PRIu64
               ",\"categories\":{",
               f->rank, f->size, f->sent.json_bytes, f->sent.events, f->sent.batches,
               f->sent.ext_dropped, f->sent.names_truncated);
        for (int c = 0; c < KP_KINETO_CAT_COUNT; c++) {
            printf("%s\"%s\":%" PRIu64, c ? "," : "", kp_kineto_cat_names[c], f->sent.cats[c]);
        }
        printf("},\"rows\":{");
        for (int k = 0; k < KP_EV_COUNT; k++) {
            printf("%s\"%s\":%" PRIu64, k ? "," : "", kp_event_kinds[k].table, f->sent.rows[k]);
        }
        printf("}");
        if (f->scan_rc != 0 || f->send_rc != 0) {
            printf(",\"error\":");
            kp_json_fputs(stdout, f->err);
        }
        printf("}");
    }
    printf("]}\n");
}

static void kineto_opts(const struct import *im, struct kp_kineto_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->batch_rows = (uint32_t) im->cfg->batch_rows;
    o->max_string_bytes = (size_t) im->cfg->max_string_bytes;
    o->max_name_bytes = (size_t) im->cfg->max_name_bytes;
    o->progress = on_progress;
    o->progress_ud = (void *) im;
}

/* Step 1. Returns the number of files that failed. */
static size_t scan_all(struct import *im)
{
    struct kp_kineto_opts o;
    size_t bad = 0;

    kineto_opts(im, &o);
    im->phase = "scan";
    for (size_t i = 0; i < im->n_files; i++) {
        struct trace_file *f = &im->files[i];

        im->cur_index = i;
        im->cur_bytes = 0;
        o.spool = NULL;
        if (kp_kineto_spool_create(IMPORT_SPOOL_MEM - im->spool_mem, &f->spool) == 0) {
            o.spool = f->spool;
        }
        f->scan_rc =
            kp_kineto_parse_file(f->path, &o, NULL, NULL, &f->scan, f->err, sizeof(f->err));
        if (f->scan_rc != 0) { /* --partial parses it again, up to the error */
            kp_kineto_spool_destroy(f->spool);
            f->spool = NULL;
        }
        im->spool_mem += kp_kineto_spool_mem_bytes(f->spool);
        im->done_bytes += f->size;
        if (f->scan_rc != 0) {
            bad++;
            if (im->bar) {
                fputc('\n', stderr);
            }
            fprintf(stderr, "kprofctl import: %s\n", f->err);
        }
        if (g_interrupted) {
            break;
        }
    }
    return bad;
}

/* Step 2. Returns 0 and the world size, or -1 (message printed). */
static int assign_ranks(struct import *im, uint32_t *world_size)
{
    const struct import_config *cfg = im->cfg;
    uint32_t ws = (uint32_t) cfg->world_size;
    long max_rank = -1;
    size_t unnamed = 0;

    for (size_t i = 0; i < im->n_files; i++) {
        struct trace_file *f = &im->files[i];

        if (f->scan.has_rank) {
            f->rank = (long) f->scan.rank;
        }
        else if ((f->rank = kp_kineto_rank_from_name(f->path)) < 0) {
            unnamed++;
        }
    }
    /* Kineto writes distributedInfo only for a distributed job: one file without it (and no
     * rank in its name) is a one-rank trace, rank 0, as export writes a one-rank run */
    if (cfg->rank < 0 && unnamed == 1 && im->n_files == 1) {
        im->files[0].rank = 0;
        unnamed = 0;
    }
    if (unnamed > 0) {
        if (cfg->rank < 0 || unnamed > 1) {
            for (size_t i = 0; i < im->n_files; i++) {
                if (im->files[i].rank < 0) {
                    fprintf(
                        stderr,
                        "kprofctl import: %s: cannot tell its rank (no distributedInfo.rank, no "
                        "rank-N or workerN in the file name)%s\n",
                        im->files[i].path,
                        unnamed > 1 ? "; rename the files or import them one at a time with --rank"
                                    : "; pass --rank N");
                }
            }
            return -1;
        }
        for (size_t i = 0; i < im->n_files; i++) {
            if (im->files[i].rank < 0) {
                im->files[i].rank = (long) cfg->rank;
            }
        }
    }
    for (size_t i = 0; i < im->n_files; i++) {
        const struct trace_file *f = &im->files[i];

        for (size_t j = 0; j < i; j++) {
            if (im->files[j].rank == f->rank) {
                fprintf(stderr,
                        "kprofctl import: %s and %s are both rank %ld; one run holds one trace "
                        "per rank: import them separately\n",
                        im->files[j].path, f->path, f->rank);
                return -1;
            }
        }
        if (f->rank > max_rank) {
            max_rank = f->rank;
        }
        if (f->scan.world_size > ws) {
            ws = f->scan.world_size;
        }
    }
    if ((long) ws < max_rank + 1) {
        ws = (uint32_t) (max_rank + 1);
    }
    if (cfg->world_size > 0 && (long) cfg->world_size < max_rank + 1) {
        fprintf(stderr, "kprofctl import: --world-size=%lld but a file is rank %ld\n",
                cfg->world_size, max_rank);
        return -1;
    }
    *world_size = ws == 0 ? 1 : ws;
    return 0;
}

/* Flags and --help: -1 to go on, else the exit status (0 after --help, 2 for bad flags). */
static int import_flags(struct import_config *cfg, int argc, char **argv, struct kp_config_pos *pos)
{
    char err[1024];
    int action;

    if (kp_config_load_args(import_defs, N_DEFS, cfg, "kprofctl", argc, argv, pos, err, sizeof(err),
                            &action) != 0) {
        fprintf(stderr, "kprofctl import: %s (see kprofctl import --help)\n", err);
        return 2;
    }
    if (action == KP_CONFIG_EXIT_OK) {
        if (pos->n == 0) {
            printf("\nusage: kprofctl import --job NAME [flags] FILE_OR_DIR...\n"
                   "\nExit status:\n"
                   "  0    imported: the run is ENDED (with --partial also when some files were\n"
                   "       cut short at an error: their part before it is kept, and stderr says\n"
                   "       so; --json's \"ok\" is false)\n"
                   "  1    failed: a file is unreadable (nothing imported), or collectord refused\n"
                   "       the batches (the run is ended FAILED and dropped)\n"
                   "  2    usage: bad flags\n"
                   "  5    collectord unreachable, or gone before the import ended (a run it\n"
                   "       could not end is ended FAILED by collectord at its\n"
                   "       --open-run-timeout)\n"
                   "  7    " KPROFCTL_EXIT_REFUSED_HELP "\n");
        }
        kp_config_fini(import_defs, N_DEFS, cfg);
        return 0;
    }
    kp_log_set_level((enum kp_log_level) cfg->log_level);
    return -1;
}

/* The trace files: the arguments' files and directories listed, each scanned (parsed once,
 * its batches spooled) and given its rank. 0, or -1 once said on stderr (nothing imported). */
static int import_scan(struct import *im, char **args, int n_args)
{
    const struct import_config *cfg = im->cfg;
    size_t bad;

    for (int i = 0; i < n_args; i++) {
        struct stat st;

        if (stat(args[i], &st) != 0) {
            fprintf(stderr, "kprofctl import: %s: %s\n", args[i], strerror(errno));
            return -1;
        }
        if (S_ISDIR(st.st_mode) ? add_dir(im, args[i], 0) != 0
                                : add_file(im, args[i], (uint64_t) st.st_size) != 0) {
            return -1;
        }
    }
    if (im->n_files == 0) {
        fprintf(stderr, "kprofctl import: no .json or .json.gz files in %s%s\n", args[0],
                n_args > 1 ? " ..." : "");
        return -1;
    }
    for (size_t i = 0; i < im->n_files; i++) {
        im->total_bytes += 2 * im->files[i].size;
    }
    im->bar = cfg->progress == 1 || (cfg->progress == 0 && isatty(STDERR_FILENO));
    im->start_ns = kp_mono_ns();
    signal(SIGINT, on_sigint);
    signal(SIGPIPE, SIG_IGN);

    bad = scan_all(im);
    if (g_interrupted) {
        fprintf(stderr, "\nkprofctl import: interrupted; nothing was imported\n");
        return -1;
    }
    if (bad > 0 && !cfg->partial) {
        fprintf(stderr,
                "kprofctl import: %zu of %zu file%s unreadable; nothing was imported (--partial "
                "imports the good part of each file)\n",
                bad, im->n_files, im->n_files == 1 ? "" : "s");
        return -1;
    }
    if (assign_ranks(im, &im->world_size) != 0) {
        return -1;
    }
    for (size_t i = 0; i < im->n_files; i++) {
        if (im->files[i].scan_rc == 0 && im->files[i].scan.events == 0) {
            fprintf(stderr,
                    "kprofctl import: warning: %s is an empty trace (no events): rank %ld of the "
                    "run will hold no rows\n",
                    im->files[i].path, im->files[i].rank);
        }
    }
    return 0;
}

/* The channel to collectord and CreateRun: 0 (im->ch, im->run_id set), or the exit status
 * once said on stderr (2: a bad --collector; nothing to end then). */
static int import_open_run(struct import *im)
{
    const struct import_config *cfg = im->cfg;
    Kprof__V1__CreateRunRequest req = KPROF__V1__CREATE_RUN_REQUEST__INIT;
    struct kp_rpcverb_creds creds = { cfg->tls_ca, cfg->tls_cert, cfg->tls_key, cfg->token_file };
    Kprof__V1__Run *run = NULL;
    grpc_status_code code = GRPC_STATUS_OK;

    if (kp_rpcverb_channel("import", "collector", cfg->collector, &creds, &im->ch) != 0) {
        return KPROFCTL_EXIT_USAGE;
    }
    req.job = cfg->job;
    req.name = cfg->name;
    req.world_size = im->world_size;
    req.source = KPROF__V1__RUN_SOURCE__RUN_SOURCE_IMPORT;
    if (!control_call(cfg, im->ch, "CreateRun", &req.base, &run, &im->unreachable, &code, false,
                      CONTROL_TIMEOUT_MS)) {
        im->refused = kp_rpcverb_exit_code(code) == KPROFCTL_EXIT_REFUSED;
        return im->unreachable ? KPROFCTL_EXIT_UNREACHABLE
               : im->refused   ? KPROFCTL_EXIT_REFUSED
                               : KPROFCTL_EXIT_FAILED;
    }
    im->run_id = run->id;
    protobuf_c_message_free_unpacked(&run->base, NULL);
    return 0;
}

/* Sends every file's batches to the open run and flushes them: the exit status so far
 * (im->run_failed, im->any_partial, im->unreachable say why). */
static int import_push(struct import *im)
{
    const struct import_config *cfg = im->cfg;
    struct kp_push_opts po;
    struct kp_kineto_opts o;
    uint64_t stream;
    int rc;

    memset(&po, 0, sizeof(po));
    po.give_up_after_ms = cfg->give_up_ms;
    if (getrandom(&stream, sizeof(stream), 0) != (ssize_t) sizeof(stream)) {
        stream = (uint64_t) kp_mono_ns() ^ ((uint64_t) getpid() << 32);
    }
    stream &= 0x7fffffffffffffffULL;
    stream = stream == 0 ? 1 : stream;
    if ((rc = kp_push_create(im->ch, stream, &po, &im->push)) != 0) {
        fprintf(stderr, "kprofctl import: cannot create the producer: %s\n", kp_strerror(rc));
        im->run_failed = true;
        return 1;
    }
    kineto_opts(im, &o);
    o.run_id = im->run_id;
    o.job = cfg->job;
    o.world_size = im->world_size;
    o.partial = cfg->partial;
    im->phase = "send";
    im->done_bytes = im->total_bytes / 2;
    for (size_t i = 0; i < im->n_files && !im->run_failed; i++) {
        struct trace_file *f = &im->files[i];

        im->cur_index = i;
        im->cur_bytes = 0;
        o.rank = (uint32_t) f->rank;
        o.meta = &f->scan;
        f->send_rc = send_file(im, f, &o);
        im->done_bytes += f->size;
        if (f->send_rc == 0) {
            continue;
        }
        if (f->scan_rc != 0 && f->send_rc == f->scan_rc) {
            im->any_partial = true; /* --partial: the good part went in */
            continue;
        }
        if (im->bar) {
            fputc('\n', stderr);
        }
        if (f->send_rc == KP_ERPC) {
            im->unreachable = push_failed(im, f->path, "did not take the batches");
        }
        else {
            fprintf(stderr, "kprofctl import: %s\n", f->err);
        }
        im->run_failed = true;
    }
    if (!im->run_failed && kp_push_flush(im->push, -1) != 0) {
        im->unreachable = push_failed(im, NULL, "did not commit the batches");
        im->run_failed = true;
    }
    /* --partial that stored a run is a (partial) success: exit 0, said on stderr */
    return im->run_failed ? (im->unreachable ? KPROFCTL_EXIT_UNREACHABLE : KPROFCTL_EXIT_FAILED)
                          : KPROFCTL_EXIT_OK;
}

/* EndRun (failed when the push failed), asked again while collectord may be back: rc, or the
 * exit status that the run could not be ended (said on stderr). Sets im->ended. */
static int import_end(struct import *im, int rc)
{
    const struct import_config *cfg = im->cfg;
    Kprof__V1__EndRunRequest req = KPROF__V1__END_RUN_REQUEST__INIT;
    Kprof__V1__StreamMark mark = KPROF__V1__STREAM_MARK__INIT, *markp = &mark;
    Kprof__V1__Run *run = NULL;
    bool push_gone = im->unreachable, gone = false;
    /* once the push gave up on collectord, one more --give-up is all EndRun gets */
    long long end_timeout_ms = im->unreachable && cfg->give_up_ms < CONTROL_TIMEOUT_MS
                                   ? cfg->give_up_ms
                                   : CONTROL_TIMEOUT_MS;
    long long until, pause_ms = 100;

    if (im->bar) {
        im->cur_bytes = 0;
        progress_draw(im, true);
    }
    until = kp_mono_ns() + (im->unreachable ? 0 : cfg->give_up_ms * 1000000LL);
    req.run_id = im->run_id;
    req.failed = im->run_failed;
    /* what the push sent (all acknowledged, when the import did not fail): collectord ends the
     * run once all of it is stored in PostgreSQL (with Kafka in between, an Ack comes before
     * that); a failed import is dropped, so it waits for nothing */
    if (!im->run_failed && im->push != NULL && kp_push_mark(im->push, &mark)) {
        req.n_marks = 1;
        req.marks = &markp;
    }
    /* A collectord that went away (a restart) may be back soon: ask again until --give-up
     * (once only when the push already gave up on it). Quiet while it may ask again, and
     * once the push gave up (that was said; the line below says what it means for the
     * run). */
    while (!(im->ended = control_call(cfg, im->ch, "EndRun", &req.base, &run, &gone, NULL,
                                      push_gone || kp_mono_ns() < until, end_timeout_ms)) &&
           gone && kp_mono_ns() < until && !g_interrupted) {
        struct timespec ts = { 0, pause_ms * 1000000L };

        nanosleep(&ts, NULL);
        pause_ms = pause_ms < 1000 ? 2 * pause_ms : 1000;
    }
    if (im->ended) {
        protobuf_c_message_free_unpacked(&run->base, NULL);
        return rc;
    }
    im->unreachable = im->unreachable || gone;
    fprintf(stderr,
            "kprofctl import: run %" PRIu64 " could not be ended%s%s%s: collectord ends "
            "it as failed once it has had no batch for its --open-run-timeout; "
            "`kprofctl runs` shows its state\n",
            im->run_id, im->unreachable ? " (collectord at " : "",
            im->unreachable ? cfg->collector : "", im->unreachable ? " is unreachable)" : "");
    return im->unreachable ? KPROFCTL_EXIT_UNREACHABLE : KPROFCTL_EXIT_FAILED;
}

/* After EndRun: a failed run is dropped (or said to be FAILED), an ended one reported. */
static void import_report(struct import *im)
{
    if (im->run_failed) {
        Kprof__V1__DropRunRequest req = KPROF__V1__DROP_RUN_REQUEST__INIT;
        Kprof__V1__Run *run = NULL;

        /* nothing more may go out for the run: unacknowledged batches are given up */
        kp_push_destroy(im->push);
        im->push = NULL;
        req.run_id = im->run_id;
        /* DropRun refuses a run that is still open, so only an ended one is worth asking */
        if (im->ended && control_call(im->cfg, im->ch, "DropRun", &req.base, &run, NULL, NULL,
                                      false, CONTROL_TIMEOUT_MS)) {
            protobuf_c_message_free_unpacked(&run->base, NULL);
            fprintf(stderr,
                    "kprofctl import: run %" PRIu64 " was dropped; nothing of these traces "
                    "was kept\n",
                    im->run_id);
        }
        else if (im->ended) {
            fprintf(stderr,
                    "kprofctl import: run %" PRIu64 " is marked FAILED and may hold part of "
                    "the traces (`kprofctl runs` lists it)\n",
                    im->run_id);
        }
    }
    else if (im->ended) {
        print_result(im, im->run_id, im->world_size, (double) (kp_mono_ns() - im->start_ns) / 1e9,
                     !im->any_partial);
        if (im->any_partial) {
            size_t cut = 0;

            for (size_t i = 0; i < im->n_files; i++) {
                cut += im->files[i].scan_rc != 0;
            }
            fprintf(stderr,
                    "kprofctl import: partial import: run %" PRIu64 " holds %zu of %zu file%s "
                    "whole and the part of %zu file%s before its first error (--partial)\n",
                    im->run_id, im->n_files - cut, im->n_files, im->n_files == 1 ? "" : "s", cut,
                    cut == 1 ? "" : "s");
        }
    }
}

int kprofctl_import(int argc, char **argv)
{
    struct import_config cfg;
    struct import im;
    struct kp_config_pos pos;
    char *args[IMPORT_MAX_ARGS];
    int rc;

    memset(&cfg, 0, sizeof(cfg));
    memset(&im, 0, sizeof(im));
    pos.args = args;
    pos.max = IMPORT_MAX_ARGS;
    pos.n = 0;
    if ((rc = import_flags(&cfg, argc, argv, &pos)) >= 0) {
        return rc;
    }
    im.cfg = &cfg;
    if (cfg.job == NULL || cfg.job[0] == '\0' || pos.n == 0) {
        fprintf(stderr, "usage: kprofctl import --job NAME [flags] FILE_OR_DIR... (%s)\n",
                pos.n == 0 ? "no trace files given" : "--job is required");
        rc = 2;
        goto out;
    }
    rc = 1;
    if (import_scan(&im, args, pos.n) != 0 || (rc = import_open_run(&im)) != 0) {
        goto out;
    }
    rc = import_push(&im);
    rc = import_end(&im, rc);
    import_report(&im);
out:
    kp_push_destroy(im.push);
    kp_rpc_channel_destroy(im.ch);
    for (size_t i = 0; i < im.n_files; i++) {
        free(im.files[i].path);
        kp_kineto_spool_destroy(im.files[i].spool);
    }
    free(im.files);
    kp_config_fini(import_defs, N_DEFS, &cfg);
    return rc;
}
