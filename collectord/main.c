/* kprof-collectord: parses the configuration, runs the daemon until SIGTERM or SIGINT. */
#define KP_LOG_MODULE "collectord"
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectord.h"
#include "consumer.h"
#include "kp_config.h"
#include "kp_daemon.h"
#include "kp_log.h"
#include "kp_migrations.h"
#include "kp_pg.h"

static const char *const roles[] = { "ingest", "sink", NULL };

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
      "batches waiting for PostgreSQL (or for Kafka's acknowledgement with --sink kafka); over "
      "this, streams stop reading (flow control)",
      NULL, false },
    { "sink", KP_CONFIG_ENUM, "postgres", 0, 0, OFF(sink),
      "where validated batches go: postgres (stored here) or kafka (produced into "
      "--kafka-topic, acknowledged to the producer once Kafka has them; sink consumers store "
      "them)",
      kp_collectord_sinks, false },
    { "kafka-brokers", KP_CONFIG_STRING, "", 0, 0, OFF(kafka_brokers),
      "Kafka bootstrap servers, HOST:PORT,... (needed with --sink kafka and --role sink)", NULL,
      false },
    { "kafka-topic", KP_CONFIG_STRING, "kprof.batches", 1, 249, OFF(kafka_topic),
      "Kafka topic of the batches (key \"<run_id>/<rank>\", value the encoded kprof.v1.Batch)",
      NULL, false },
    { "kafka-property", KP_CONFIG_STRING, "", 0, 0, OFF(kafka_properties),
      "librdkafka properties passed as they are, KEY=VALUE separated by ',' or ';' in one flag "
      "(security.protocol, ssl.ca.location, sasl.*, message.timeout.ms: default 300000); masked "
      "by --print-config",
      NULL, true },
    { "kafka-properties-file", KP_CONFIG_STRING, "", 0, 0, OFF(kafka_properties_file),
      "librdkafka properties from a file only its owner may read (mode 0600, or 0640 for the "
      "daemon's group), KEY=VALUE a line, # comments: for sasl.password, ssl.key.password and "
      "other secrets, which the command line would show to every local user; applied after "
      "--kafka-property",
      NULL, false },
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
    { "migrate", KP_CONFIG_BOOL, "false", 0, 0, OFF(migrate),
      "apply the pending schema migrations, print them and exit, connected as the schema owner; "
      "collectord then runs as a login in role kprof_writer (CREATE ROLE kprof_collectord LOGIN "
      "PASSWORD '...' IN ROLE kprof_writer), which ingests but may not migrate: see "
      "docs/postgres-roles.md",
      NULL, false },
    { "coordinator", KP_CONFIG_BOOL, "true", 0, 0, OFF(coordinator),
      "take part in the election of the one capture coordinator among the replicas sharing the "
      "database (--no-coordinator: an ingest-only replica that never coordinates captures)",
      NULL, false },
    { "coordinator-poll-ms", KP_CONFIG_INT, "1000", 50, 60000, OFF(coordinator_poll_ms),
      "how often (ms) the election lock is tried, and its holder checks its PostgreSQL "
      "connection; a standby takes over about a poll, plus the greater of a poll and 1 s, plus "
      "1 s after the coordinator is gone (3 s by default)",
      NULL, false },
    { "advertise-address", KP_CONFIG_STRING, "", 0, 255, OFF(advertise_address),
      "HOST:PORT other replicas send clients to when this one is the capture coordinator "
      "(default: --listen, or this machine's host name and the bound port when --listen is a "
      "wildcard address)",
      NULL, false },
    { "role", KP_CONFIG_ENUM, "ingest", 0, 0, OFF(role),
      "ingest: serve gRPC Ingest and Control; sink: consume --kafka-topic in group "
      "--kafka-group and store the batches in PostgreSQL (no gRPC listener; /healthz, /readyz "
      "and /metrics stay)",
      roles, false },
    { "kafka-group", KP_CONFIG_STRING, "kprof-sink", 1, 255, OFF(kafka_group),
      "--role sink: Kafka consumer group; the sinks of one group share the topic's partitions",
      NULL, false },
    { "kafka-revoke-wait", KP_CONFIG_DURATION, "10s", 0, 600000, OFF(kafka_revoke_wait_ms),
      "--role sink: on a rebalance, how long to wait for PostgreSQL to store what was read "
      "from the revoked partitions before letting them go (the rest is read again by the next "
      "owner and recognised as duplicate)",
      NULL, false },
};
#undef OFF

/* Which object create() made: destroy() frees it. */
static bool sink_role;

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
    if (((const struct kp_collectord_config *) cfg)->role == KP_COLLECTORD_ROLE_SINK) {
        struct kp_sinkd *s = NULL;

        rc = kp_sinkd_create(cfg, &s, errbuf, errlen);
        *obj = s;
        sink_role = true;
        return rc;
    }
    rc = kp_collectord_create(cfg, &d, errbuf, errlen);
    *obj = d;
    return rc;
}

static void destroy(void *obj)
{
    if (sink_role) {
        kp_sinkd_destroy(obj);
    }
    else {
        kp_collectord_destroy(obj);
    }
}

/* Marks in have[i] whether kp_migrations[i] is recorded in the database (none when the
 * migrations table does not exist yet). Returns 0 or KP_EPG. */
static int applied_versions(PGconn *c, bool *have, char *errbuf, size_t errlen)
{
    PGresult *res = NULL;
    int rc;

    memset(have, 0, kp_migrations_count * sizeof(*have));
    if ((rc = kp_pg_query(c, "SELECT version FROM kp_schema_migrations", 0, NULL, &res, errbuf,
                          errlen)) != 0) {
        /* undefined_table: a database never migrated */
        if (strcmp(kp_pg_last_sqlstate(), "42P01") == 0) {
            return 0;
        }
        return rc;
    }
    for (int r = 0; r < PQntuples(res); r++) {
        long long v = kp_pg_i64(res, r, 0, -1);

        for (size_t i = 0; i < kp_migrations_count; i++) {
            if (kp_migrations[i].version == v) {
                have[i] = true;
            }
        }
    }
    PQclear(res);
    return 0;
}

/*
 * --migrate: connects with the configured conninfo (and password file), applies the pending
 * migrations (kp_pg_migrate_if_owner: a user that may not gets its message), prints each one
 * applied and the schema version to stdout.
 * Returns main's exit status: 0, or 1 with the reason on stderr.
 */
static int migrate(const struct kp_collectord_config *cfg)
{
    const struct kp_daemon_config *base = &cfg->base;
    bool *before = calloc(kp_migrations_count + 1, sizeof(*before));
    char err[1024] = "";
    PGconn *c = NULL;
    int rc;

    kp_log_set_level((enum kp_log_level) base->log_level);
    if (before == NULL) {
        fprintf(stderr, "kprof-collectord: --migrate: out of memory\n");
        return 1;
    }
    if ((rc = kp_pg_password_file_load(base->pg_password_file, err, sizeof(err))) != 0 ||
        (rc = kp_pg_connect(base->pg_conninfo, "kprof-collectord-migrate", &c, err, sizeof(err))) !=
            0 ||
        (rc = applied_versions(c, before, err, sizeof(err))) != 0) {
        fprintf(stderr, "kprof-collectord: --migrate: %s\n", err);
        PQfinish(c);
        free(before);
        return 1;
    }
    if ((rc = kp_pg_migrate_if_owner(c, err, sizeof(err))) < 0) {
        bool denied = strcmp(kp_pg_last_sqlstate(), "42501") == 0;

        fprintf(stderr, "kprof-collectord: --migrate as user %s: %s%s\n", PQuser(c), err,
                denied ? "; connect as the owner of the kprof schema (the user that created "
                         "its tables) or a superuser"
                       : "");
        PQfinish(c);
        free(before);
        return 1;
    }
    for (size_t i = 0; i < kp_migrations_count; i++) {
        if (!before[i]) {
            printf("applied %s (version %d)\n", kp_migrations[i].name, kp_migrations[i].version);
        }
    }
    printf("schema at version %d: %d migration%s applied\n", kp_pg_schema_version(), rc,
           rc == 1 ? "" : "s");
    PQfinish(c);
    free(before);
    return 0;
}

/* kp_daemon_main reads the shared settings at the start of the config. */
_Static_assert(offsetof(struct kp_collectord_config, base) == 0, "base first");

int main(int argc, char **argv)
{
    const size_t n = sizeof(collectord_config) / sizeof(collectord_config[0]);
    struct kp_collectord_config cfg;
    int rc;

    /* --migrate is a one-shot job, not the daemon: the settings are read here first, and
     * kp_daemon_main reads the same argv again when it is not set. */
    memset(&cfg, 0, sizeof(cfg));
    if ((rc = kp_config_main(collectord_config, n, &cfg, "kprof-collectord", argc, argv)) >= 0) {
        return rc;
    }
    if (cfg.migrate) {
        rc = migrate(&cfg);
        kp_config_fini(collectord_config, n, &cfg);
        return rc;
    }
    kp_config_fini(collectord_config, n, &cfg);
    memset(&cfg, 0, sizeof(cfg));
    return kp_daemon_main(KP_LOG_MODULE, "kprof-collectord", collectord_config,
                          sizeof(collectord_config) / sizeof(collectord_config[0]), &cfg, create,
                          destroy, argc, argv);
}
