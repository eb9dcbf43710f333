/*
 * The Kafka sink of kprof-collectord (--sink kafka): each validated batch is produced into a
 * Kafka topic, and "committed" toward the producer means durable in Kafka. Sink consumers
 * (collectord --role sink) later store the topic in PostgreSQL through sink_pg.h.
 *
 * Contract with the consumers (docs/design.md "Kafka"): topic --kafka-topic; key
 * "<run_id>/<rank>" in ASCII decimal, so that a rank's batches stay in order in one partition;
 * value the protobuf-encoded kprof.v1.Batch as ingest validated it. A record may be produced
 * twice (a resend after a lost ack): the consumers store it once, by (run, rank, stream, seq).
 *
 * Same contract toward ingest.c as sink_pg.h (struct kp_sink_ops): kp_sink_kafka_submit takes
 * an item and says pause while the bytes submitted and not handed back are over
 * queue_max_bytes; the items come back through done_cb, in submission order, on the sink's
 * own thread, which also runs librdkafka's delivery reports:
 *   - status 0 once Kafka acknowledged the record (idempotent producer, acks=all);
 *   - KP_ENOTFOUND (the run does not exist) or KP_EPROTO (rank outside its world size),
 *     checked before producing against a read-only cache of runs filled from PostgreSQL;
 *   - -EAGAIN (UNAVAILABLE to the producer, which resends) when librdkafka gave up on the
 *     record (message.timeout.ms, 5 minutes unless --kafka-property sets it) or when
 *     PostgreSQL could not be asked about the run.
 * A batch into a run that has ended is not refused here (a resend or a late spool is stored
 * into an ended run, and the rules need the rows in PostgreSQL): the consumer refuses it.
 */
#ifndef KP_SINK_KAFKA_H
#define KP_SINK_KAFKA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sink_pg.h"

struct kp_sink_kafka;

struct kp_sink_kafka_config {
    const char *brokers;         /* bootstrap.servers; borrowed for create's duration */
    const char *topic;           /* copied */
    const char *properties;      /* "key=value" pairs separated by ',' or ';' given to librdkafka
                                    as they are (TLS, SASL, message.timeout.ms); NULL: none */
    const char *properties_file; /* more, from a private file (kp_kafka_conf_file); NULL:
                                    none */
    const char *conninfo;        /* PostgreSQL, for the runs' cache */
    size_t queue_max_bytes;      /* over this, kp_sink_kafka_submit says pause */
};

/*
 * Creates the producer and starts the sink's thread; connects to PostgreSQL once and applies
 * pending migrations if it owns the schema. Does not wait for Kafka: the sink is ready
 * (kp_sink_kafka_ready) once the topic's metadata came back. Returns 0 and *out (owned:
 * kp_sink_kafka_destroy), or KP_ECONFIG (a bad property, with its name) or KP_EPG with the
 * reason in errbuf.
 */
int kp_sink_kafka_create(const struct kp_sink_kafka_config *cfg, kp_sink_done_cb *done, void *ud,
                         struct kp_sink_kafka **out, char *errbuf, size_t errlen);

/* As kp_sink_submit. Never blocks; thread-safe. */
bool kp_sink_kafka_submit(struct kp_sink_kafka *s, struct kp_sink_item *item);

/* As kp_sink_has_room. Thread-safe. */
bool kp_sink_kafka_has_room(struct kp_sink_kafka *s);

/* True once Kafka answered with the topic's metadata (for /readyz). */
bool kp_sink_kafka_ready(struct kp_sink_kafka *s);

/* Waits up to drain_timeout_ms for what is queued and in flight to be acknowledged, then
 * purges the rest (handed back -EAGAIN) and frees the sink. Accepts NULL. */
void kp_sink_kafka_destroy(struct kp_sink_kafka *s, long long drain_timeout_ms);

/* kp_sink_kafka_submit and kp_sink_kafka_has_room, for kp_ingest_set_sink. */
extern const struct kp_sink_ops kp_sink_kafka_ops;

/* Counters, for /metrics. Thread-safe snapshot. */
struct kp_sink_kafka_stats {
    uint64_t records_produced; /* acknowledged by Kafka */
    uint64_t bytes_produced;   /* their values' bytes */
    uint64_t delivery_failures;
    uint64_t batches_rejected; /* unknown run or rank outside the world size */
    uint64_t queued_bytes;     /* wire bytes submitted and not handed back (queued or in flight) */
    uint64_t inflight_records; /* produced, not yet acknowledged */
};
void kp_sink_kafka_get_stats(struct kp_sink_kafka *s, struct kp_sink_kafka_stats *out);

#endif
