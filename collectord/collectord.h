/*
 * kprof-collectord as an object: main.c and the in-process tests both drive it through
 * create/destroy. Threads: the gRPC completion-queue thread (ingest, control and agent
 * Attach callbacks), the sink's flush thread, the control worker (which also runs the capture
 * coordinator's tick), and the HTTP thread.
 */
#ifndef KP_COLLECTORD_H
#define KP_COLLECTORD_H

#include <stdbool.h>
#include <stddef.h>

#include "kp_daemon.h"

struct kp_collectord;

/* --role: ingest (gRPC, the direct path) or sink (Kafka to PostgreSQL, consumer.h) */
enum {
    KP_COLLECTORD_ROLE_INGEST = 0,
    KP_COLLECTORD_ROLE_SINK = 1
};
/* --sink: postgres stores batches itself (sink_pg.h), kafka produces them (sink_kafka.h). */
enum {
    KP_COLLECTORD_SINK_POSTGRES = 0,
    KP_COLLECTORD_SINK_KAFKA = 1
};
extern const char *const kp_collectord_sinks[]; /* "postgres", "kafka", NULL */

struct kp_collectord_config {
    struct kp_daemon_config base; /* listen, http_listen, pg_conninfo, TLS, log_level, ready_file */
    long long max_message_bytes;  /* largest Batch accepted on the wire */
    long long max_name_bytes;
    long long queue_max_bytes;
    long long flush_max_rows;
    long long flush_interval_ms;
    long long retry_max_ms;
    long long shutdown_grace_ms;
    long long agent_grace_ms;      /* an attached agent away this long fails its capture ranks */
    long long open_run_timeout_ms; /* an OPEN run with no producer stream and no batch for this
                                      long is ended FAILED (0: never) */
    int sink;                      /* KP_COLLECTORD_SINK_*: where validated batches go */
    const char *kafka_brokers;     /* --sink kafka: bootstrap.servers */
    const char *kafka_topic;       /* --sink kafka: the topic (sink_kafka.h: key and value) */
    const char *kafka_properties;  /* librdkafka properties, "k=v" separated by ',' or ';' */
    const char *kafka_properties_file; /* more, KEY=VALUE a line, from a private file */
    bool migrate; /* apply the pending migrations as the schema owner and exit (main.c) */
    int role;     /* KP_COLLECTORD_ROLE_*: which daemon main.c starts */
    const char *kafka_group;        /* --role sink: the consumer group */
    long long kafka_revoke_wait_ms; /* --role sink: how long a revoke waits for PostgreSQL */
    bool coordinator;               /* take part in the capture coordinator election */
    long long coordinator_poll_ms;  /* how often the election lock is tried and held */
    const char *advertise_address;  /* HOST:PORT others reach this replica at ("": derived) */
};

/*
 * Connects to PostgreSQL, applies migrations, starts the sink, the control worker, the gRPC
 * server and the HTTP server. Returns 0 and *out, or a negative code with a message in
 * errbuf that says what to do. Blocks on PostgreSQL.
 */
int kp_collectord_create(const struct kp_collectord_config *cfg, struct kp_collectord **out,
                         char *errbuf, size_t errlen);

/* The bound gRPC and HTTP ports. */
int kp_collectord_port(const struct kp_collectord *d);
int kp_collectord_http_port(const struct kp_collectord *d);

/* Stops serving: refuses new calls, lets live streams finish within the grace period, flushes
 * what is queued, and frees everything. Accepts NULL. */
void kp_collectord_destroy(struct kp_collectord *d);

#endif
