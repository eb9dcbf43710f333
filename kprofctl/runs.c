/*
 * kprofctl runs [--job J] [--limit N] [--json|--csv] [-c COLS] [-w WIDTH]: the newest runs,
 * newest first, from collectord's Control.ListRuns, as a table (table.h): id, job, name,
 * state, source, world_size, created and ended (ISO-8601 UTC), batches.
 *
 * Exit status: 0 listed (also when there are none), 2 bad usage, 5 collectord unreachable,
 * 1 anything else (collectord refused, output failed).
 */
#define KP_LOG_MODULE "runs"
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_rpc.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "table.h"

#define RUNS_MAX_ARGS    256
#define RUNS_TIMEOUT_MS  15000
#define RUNS_EXIT_USAGE  2
#define RUNS_EXIT_UNREAC 5

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

struct runs_config {
    char *collector;
    char *tls_ca;
    char *job;
    long long limit;
    bool json;
    bool csv;
    char *columns;
    long long width;
    long long timeout_ms;
    int log_level;
};

#define OFF(f) offsetof(struct runs_config, f)
static const struct kp_config_def runs_defs[] = {
    { "collector", KP_CONFIG_STRING, "127.0.0.1:7070", 1, 0, OFF(collector),
      "kprof-collectord's gRPC address (host:port or unix:/path)", NULL, false },
    { "tls-ca", KP_CONFIG_STRING, "", 0, 0, OFF(tls_ca),
      "PEM of the CA that signed collectord's certificate: use TLS", NULL, false },
    { "job", KP_CONFIG_STRING, "", 0, 4096, OFF(job), "only the runs of this job (default: all)",
      NULL, false },
    { "limit", KP_CONFIG_INT, "100", 1, 10000, OFF(limit), "at most this many runs, newest first",
      NULL, false },
    { "json", KP_CONFIG_BOOL, "false", 0, 0, OFF(json), "print a JSON array of objects", NULL,
      false },
    { "csv", KP_CONFIG_BOOL, "false", 0, 0, OFF(csv), "print CSV with a header line", NULL, false },
    { "columns", KP_CONFIG_STRING, "", 0, 1024, OFF(columns),
      "-c: comma-separated columns to show, in order (id, job, name, state, source, world_size, "
      "created, ended, batches)",
      NULL, false },
    { "width", KP_CONFIG_INT, "0", 0, 100000, OFF(width),
      "-w: cut text cells wider than this many columns with \"…\" (0: no limit; text output)", NULL,
      false },
    { "timeout", KP_CONFIG_DURATION, "15s", 100, 3600000, OFF(timeout_ms),
      "give up on collectord after this long", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "warn", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
};
#undef OFF
#define N_DEFS (sizeof(runs_defs) / sizeof(runs_defs[0]))

enum runs_col {
    COL_ID,
    COL_JOB,
    COL_NAME,
    COL_STATE,
    COL_SOURCE,
    COL_WORLD_SIZE,
    COL_CREATED,
    COL_ENDED,
    COL_BATCHES,
    N_COLS,
};

static const struct kp_table_col runs_cols[N_COLS] = {
    [COL_ID] = { "id", KP_TABLE_NUMERIC },
    [COL_JOB] = { "job", KP_TABLE_TEXT },
    [COL_NAME] = { "name", KP_TABLE_TEXT },
    [COL_STATE] = { "state", KP_TABLE_TEXT },
    [COL_SOURCE] = { "source", KP_TABLE_TEXT },
    [COL_WORLD_SIZE] = { "world_size", KP_TABLE_NUMERIC },
    [COL_CREATED] = { "created", KP_TABLE_TEXT },
    [COL_ENDED] = { "ended", KP_TABLE_TEXT },
    [COL_BATCHES] = { "batches", KP_TABLE_NUMERIC },
};

static const char *state_name(Kprof__V1__RunState s)
{
    switch (s) {
    case KPROF__V1__RUN_STATE__RUN_STATE_OPEN:
        return "open";
    case KPROF__V1__RUN_STATE__RUN_STATE_ENDED:
        return "ended";
    case KPROF__V1__RUN_STATE__RUN_STATE_FAILED:
        return "failed";
    default:
        return "unknown";
    }
}

static const char *source_name(Kprof__V1__RunSource s)
{
    switch (s) {
    case KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE:
        return "capture";
    case KPROF__V1__RUN_SOURCE__RUN_SOURCE_IMPORT:
        return "import";
    case KPROF__V1__RUN_SOURCE__RUN_SOURCE_SYNTHETIC:
        return "synthetic";
    default:
        return "unknown";
    }
}

/* ns since the epoch as "2026-11-22T02:34:15Z" (whole seconds, UTC); 0 is a NULL cell. */
static int set_time(struct kp_table *t, size_t col, int64_t ns)
{
    char buf[64];
    struct tm tm;
    time_t secs;

    if (ns <= 0) {
        return kp_table_set_null(t, col);
    }
    secs = (time_t) (ns / 1000000000);
    if (gmtime_r(&secs, &tm) == NULL ||
        strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
        return kp_table_set_i64(t, col, ns);
    }
    return kp_table_set_str(t, col, buf);
}

static int add_run(struct kp_table *t, const Kprof__V1__Run *r)
{
    int rc = 0;

    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_ID, r->id);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_JOB, r->job);
    rc = rc != 0 ? rc
                 : kp_table_set_str(t, COL_NAME,
                                    r->name != NULL && r->name[0] != '\0' ? r->name : NULL);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_STATE, state_name(r->state));
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_SOURCE, source_name(r->source));
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_WORLD_SIZE, r->world_size);
    rc = rc != 0 ? rc : set_time(t, COL_CREATED, r->created_ns);
    rc = rc != 0 ? rc : set_time(t, COL_ENDED, r->ended_ns);
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_BATCHES, r->batches);
    return rc;
}

int kprofctl_runs(int argc, char **argv)
{
    struct runs_config cfg;
    struct kp_config_pos pos;
    struct kp_rpc_channel_opts co;
    struct kp_rpc_channel *ch = NULL;
    struct kp_rpc_status st;
    struct kp_table *t = NULL;
    Kprof__V1__ListRunsRequest req = KPROF__V1__LIST_RUNS_REQUEST__INIT;
    Kprof__V1__ListRunsResponse *resp = NULL;
    ProtobufCMessage *msg = NULL;
    enum kp_table_format format;
    char *args[RUNS_MAX_ARGS];
    char *av[RUNS_MAX_ARGS + 1];
    char flagbuf[4096];
    char err[1024];
    int action, rc = 1, r;

    memset(&cfg, 0, sizeof(cfg));
    if (argc > RUNS_MAX_ARGS) {
        fprintf(stderr, "kprofctl runs: too many arguments (see kprofctl runs --help)\n");
        return RUNS_EXIT_USAGE;
    }
    if (kp_table_short_flags(argc, argv, av, flagbuf, sizeof(flagbuf)) != 0) {
        fprintf(stderr, "kprofctl runs: arguments too long (see kprofctl runs --help)\n");
        return RUNS_EXIT_USAGE;
    }
    pos.args = args;
    pos.max = RUNS_MAX_ARGS;
    pos.n = 0;
    if (kp_config_load_args(runs_defs, N_DEFS, &cfg, "kprofctl", argc, av, &pos, err, sizeof(err),
                            &action) != 0) {
        fprintf(stderr, "kprofctl runs: %s (see kprofctl runs --help)\n", err);
        return RUNS_EXIT_USAGE;
    }
    if (action == KP_CONFIG_EXIT_OK) {
        rc = 0;
        goto out;
    }
    kp_log_set_level((enum kp_log_level) cfg.log_level);
    if (pos.n > 0) {
        fprintf(stderr, "kprofctl runs: unexpected argument \"%s\" (see kprofctl runs --help)\n",
                args[0]);
        rc = RUNS_EXIT_USAGE;
        goto out;
    }
    if (cfg.json && cfg.csv) {
        fprintf(stderr, "kprofctl runs: --json and --csv exclude each other: pick one\n");
        rc = RUNS_EXIT_USAGE;
        goto out;
    }
    format = cfg.json ? KP_TABLE_FORMAT_JSON : cfg.csv ? KP_TABLE_FORMAT_CSV : KP_TABLE_FORMAT_TEXT;
    if ((r = kp_table_create(runs_cols, N_COLS, &t)) != 0) {
        fprintf(stderr, "kprofctl runs: %s\n", kp_strerror(r));
        goto out;
    }
    if (kp_table_select(t, cfg.columns, err, sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl runs: -c %s: %s\n", cfg.columns, err);
        rc = RUNS_EXIT_USAGE;
        goto out;
    }

    memset(&co, 0, sizeof(co));
    co.tls_ca_file = cfg.tls_ca != NULL && cfg.tls_ca[0] != '\0' ? cfg.tls_ca : NULL;
    if (kp_rpc_channel_create(cfg.collector, &co, &ch, err, sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl runs: --collector=%s: %s\n", cfg.collector, err);
        rc = RUNS_EXIT_USAGE;
        goto out;
    }
    req.job = cfg.job;
    req.limit = (uint32_t) cfg.limit;
    memset(&st, 0, sizeof(st));
    if (kp_rpc_unary(ch, "/kprof.v1.Control/ListRuns", &req.base,
                     &kprof__v1__list_runs_response__descriptor, &msg, cfg.timeout_ms, &st) != 0) {
        if (st.code == GRPC_STATUS_UNAVAILABLE || st.code == GRPC_STATUS_DEADLINE_EXCEEDED) {
            fprintf(stderr,
                    "kprofctl runs: cannot reach collectord: %s: %s; is kprof-collectord running "
                    "at %s? (set --collector or KPROF_COLLECTOR)\n",
                    kp_rpc_status_name(st.code), st.details, cfg.collector);
            rc = RUNS_EXIT_UNREAC;
        }
        else {
            fprintf(stderr, "kprofctl runs: collectord at %s refused ListRuns: %s: %s\n",
                    cfg.collector, kp_rpc_status_name(st.code), st.details);
        }
        goto out;
    }
    resp = (Kprof__V1__ListRunsResponse *) msg;
    for (size_t i = 0; i < resp->n_runs; i++) {
        if ((r = add_run(t, resp->runs[i])) != 0) {
            fprintf(stderr, "kprofctl runs: %s\n", kp_strerror(r));
            goto out;
        }
    }
    if (kp_table_print(t, format, (int) cfg.width, stdout) != 0) {
        fprintf(stderr, "kprofctl runs: writing the table failed: %s\n", strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (msg != NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    kp_table_destroy(t);
    kp_rpc_channel_destroy(ch);
    kp_config_fini(runs_defs, N_DEFS, &cfg);
    return rc;
}
