/* kprof-analyzer: parses the configuration, serves the Analyzer service until SIGTERM or
 * SIGINT (service.h). */
#define KP_LOG_MODULE "analyzer"
#include <stddef.h>
#include <string.h>

#include "analyze.h"
#include "kp_config.h"
#include "kp_daemon.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "service.h"

#define OFF(f) offsetof(struct kp_analyzer_config, f)
static const struct kp_config_def analyzer_config[] = {
    { "listen", KP_CONFIG_STRING, KP_ANALYZER_DEFAULT_LISTEN, 0, 0, OFF(base.listen),
      "gRPC address (Analyzer): host:port, [v6]:port or unix:/path; port 0 picks one", NULL,
      false },
    { "http-listen", KP_CONFIG_STRING, "127.0.0.1:7073", 0, 0, OFF(base.http_listen),
      "address of /healthz, /readyz and /metrics; empty disables", NULL, false },
    { "pg-conninfo", KP_CONFIG_STRING, "dbname=kprof", 0, 0, OFF(base.pg_conninfo),
      "libpq connection string of the kprof database; keep the password out of it (the command "
      "line is public): use --pg-password-file, or libpq's PGPASSWORD or PGPASSFILE (~/.pgpass)",
      NULL, true },
    { "pg-password-file", KP_CONFIG_STRING, "", 0, 0, OFF(base.pg_password_file),
      "file whose first line is the PostgreSQL password (mode 0600, read once at start)", NULL,
      false },
    { "web-listen", KP_CONFIG_STRING, "", 0, 0, OFF(web_listen),
      "address (host:port) of the JSON HTTP API of the web UI (docs/web-api.md), with the same TLS "
      "and tokens as gRPC; empty disables",
      NULL, false },
    { "web-root", KP_CONFIG_STRING, "", 0, 0, OFF(web_root),
      "directory of the web UI's files, served on --web-listen (web/ in the source tree); empty: "
      "the installed ones (" KPROF_WEB_ROOT_FROM_BIN " from the executable's directory: "
      "/usr/share/kprof/web in the package), if present",
      NULL, false },
    KP_DAEMON_SECURITY_CONFIG(struct kp_analyzer_config),
    KP_DAEMON_METRICS_CONFIG(struct kp_analyzer_config),
    { "log-level", KP_CONFIG_ENUM, "info", 0, 0, OFF(base.log_level), "error, warn, info or debug",
      kp_daemon_log_levels, false },
    { "ready-file", KP_CONFIG_STRING, "", 0, 0, OFF(base.ready_file),
      "file to write the bound addresses to (grpc=..., http=...) once serving", NULL, false },
    { "workers", KP_CONFIG_INT, "2", 1, 64, OFF(workers),
      "analysis threads, each with its own PostgreSQL connection", NULL, false },
    { "queue-max", KP_CONFIG_INT, "64", 1, 65536, OFF(queue_max),
      "requests waiting for a worker; more get RESOURCE_EXHAUSTED", NULL, false },
    { "cache-bytes", KP_CONFIG_SIZE, "256MiB", 0, 1LL << 40, OFF(cache_bytes),
      "results kept in memory, least recently used evicted first; 0 disables the cache", NULL,
      false },
    { "max-rows", KP_CONFIG_INT, "50000000", 0, 1LL << 40, OFF(max_rows),
      "refuse a rank with more rows than this (RESOURCE_EXHAUSTED); 0: no limit", NULL, false },
    { "memory-budget", KP_CONFIG_SIZE, "2GiB", 0, 1LL << 50, OFF(memory_budget),
      "memory the analyses in progress may hold together, estimated per request from the events "
      "it reads before it starts: one that needs more is refused (RESOURCE_EXHAUSTED), one that "
      "does not fit beside the others waits for them (up to a minute); keep it under the "
      "process's memory limit, less --cache-bytes; 0: no budget",
      NULL, false },
    { "window-events", KP_CONFIG_INT, KP_ANALYZE_WINDOW_EVENTS_S, 0, 1LL << 40, OFF(window_events),
      "the breakdown, operator, kernel, memory and roofline views read a rank of more events "
      "than this a window of this many host events at a time, cut where no op or runtime call "
      "is open: memory for one window instead of the rank; 0: read every rank whole",
      NULL, false },
    { "shutdown-grace", KP_CONFIG_DURATION, "10s", 0, 600000, OFF(shutdown_grace_ms),
      "on SIGTERM, how long analyses in progress get to finish", NULL, false },
};
#undef OFF

static int create(const void *cfg, void **obj, char *errbuf, size_t errlen)
{
    struct kp_analyzer *a = NULL;
    const struct kp_daemon_config *base = cfg; /* the first member */
    int rc;

    /* Once, before any connection: the password stays off the command line and out of logs. */
    if ((rc = kp_pg_password_file_load(base->pg_password_file, errbuf, errlen)) != 0) {
        *obj = NULL;
        return rc;
    }
    rc = kp_analyzer_create(cfg, &a, errbuf, errlen);
    *obj = a;
    return rc;
}

static void destroy(void *obj)
{
    kp_analyzer_destroy(obj);
}

/* kp_daemon_main reads the shared settings at the start of the config. */
_Static_assert(offsetof(struct kp_analyzer_config, base) == 0, "base first");

int main(int argc, char **argv)
{
    struct kp_analyzer_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_daemon_main(KP_LOG_MODULE, "kprof-analyzer", analyzer_config,
                          sizeof(analyzer_config) / sizeof(analyzer_config[0]), &cfg, create,
                          destroy, argc, argv);
}
