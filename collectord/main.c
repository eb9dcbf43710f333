/* kprof-collectord: parses the configuration, runs the daemon until SIGTERM or SIGINT. */
#define KP_LOG_MODULE "collectord"
#include <stddef.h>
#include <string.h>

#include "collectord.h"
#include "kp_config.h"
#include "kp_daemon.h"
#include "kp_log.h"
#include "kp_pg.h"

#define OFF(f) offsetof(struct kp_collectord_config, f)
static const struct kp_config_def collectord_config[] = {
    { "listen", KP_CONFIG_STRING, "127.0.0.1:7070", 0, 0, OFF(base.listen),
      "gRPC address (Ingest and Control): host:port, [v6]:port or unix:/path; port 0 picks one",
      NULL, false },
    { "http-listen", KP_CONFIG_STRING, "127.0.0.1:7071", 0, 0, OFF(base.http_listen),
      "address of /healthz, /readyz and /metrics; empty disables", NULL, false },
    { "pg-conninfo", KP_CONFIG_STRING, "dbname=kprof", 0, 0, OFF(base.pg_conninfo),
      "libpq connection string of the kprof database; keep the password out of it (the command "
      "line is public): use --pg-password-file, or libpq's PGPASSWORD or PGPASSFILE (~/.pgpass)",
      NULL, true },
    { "pg-password-file", KP_CONFIG_STRING, "", 0, 0, OFF(base.pg_password_file),
      "file whose first line is the PostgreSQL password (mode 0600, read once at start)", NULL,
      false },
    KP_DAEMON_SECURITY_CONFIG(struct kp_collectord_config),
    KP_DAEMON_METRICS_CONFIG(struct kp_collectord_config),
    { "log-level", KP_CONFIG_ENUM, "info", 0, 0, OFF(base.log_level), "error, warn, info or debug",
      kp_daemon_log_levels, false },
    { "ready-file", KP_CONFIG_STRING, "", 0, 0, OFF(base.ready_file),
      "file to write the bound addresses to (grpc=..., http=...) once serving", NULL, false },
    { "max-message-bytes", KP_CONFIG_SIZE, "64MiB", 1024, 1LL << 30, OFF(max_message_bytes),
      "largest encoded batch accepted; larger ones get RESOURCE_EXHAUSTED", NULL, false },
    { "max-name-bytes", KP_CONFIG_SIZE, "16KiB", 64, 1LL << 20, OFF(max_name_bytes),
      "longest name (kernel, op, shapes string) accepted in a batch", NULL, false },
    { "queue-max-bytes", KP_CONFIG_SIZE, "256MiB", 1LL << 20, 1LL << 36, OFF(queue_max_bytes),
      "batches waiting for PostgreSQL; over this, streams stop reading (flow control)", NULL,
      false },
    { "flush-max-rows", KP_CONFIG_INT, "65536", 1, 1LL << 24, OFF(flush_max_rows),
      "event rows per PostgreSQL transaction", NULL, false },
    { "flush-interval", KP_CONFIG_DURATION, "50ms", 1, 60000, OFF(flush_interval_ms),
      "longest wait to fill a flush once a batch is queued", NULL, false },
    { "retry-max", KP_CONFIG_DURATION, "5s", 10, 600000, OFF(retry_max_ms),
      "backoff cap while PostgreSQL is unreachable", NULL, false },
    { "shutdown-grace", KP_CONFIG_DURATION, "10s", 0, 600000, OFF(shutdown_grace_ms),
      "on SIGTERM, how long live streams get to finish before they are cancelled", NULL, false },
    { "agent-grace", KP_CONFIG_DURATION, "15s", 100, 3600000, OFF(agent_grace_ms),
      "fail the capture ranks of an attached kprof-agent that stays away this long", NULL, false },
    { "open-run-timeout", KP_CONFIG_DURATION, "10m", 0, 30LL * 86400000, OFF(open_run_timeout_ms),
      "end as failed an open run (not a capture's) that no producer stream feeds and that has had "
      "no batch for this long: its producer died (0: never)",
      NULL, false },
};
#undef OFF

static int create(const void *cfg, void **obj, char *errbuf, size_t errlen)
{
    struct kp_collectord *d = NULL;
    const struct kp_daemon_config *base = cfg; /* the first member */
    int rc;

    /* Once, before any connection: the password stays off the command line and out of logs. */
    if ((rc = kp_pg_password_file_load(base->pg_password_file, errbuf, errlen)) != 0) {
        *obj = NULL;
        return rc;
    }
    rc = kp_collectord_create(cfg, &d, errbuf, errlen);
    *obj = d;
    return rc;
}

static void destroy(void *obj)
{
    kp_collectord_destroy(obj);
}

/* kp_daemon_main reads the shared settings at the start of the config. */
_Static_assert(offsetof(struct kp_collectord_config, base) == 0, "base first");

int main(int argc, char **argv)
{
    struct kp_collectord_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_daemon_main(KP_LOG_MODULE, "kprof-collectord", collectord_config,
                          sizeof(collectord_config) / sizeof(collectord_config[0]), &cfg, create,
                          destroy, argc, argv);
}
