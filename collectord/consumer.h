/*
 * kprof-collectord --role sink: a Kafka consumer in a consumer group that reads the batches
 * ingest replicas produced (--sink kafka) and stores them through the PostgreSQL sink
 * (sink_pg.h), the same code and transactions as the direct path.
 *
 * Delivery: a record's offset is committed only after the database transaction that stored it
 * (or recognised it as a duplicate, or rejected it for good) has committed. Per partition the
 * committed offset is the end of the longest run of settled records from the last commit, so
 * a consumer killed at any point leaves every unsettled record to be read again; the sink
 * recognises a record stored twice by its (run, rank, stream, seq) key. A record that is not
 * a valid kprof.v1.Batch never becomes one: it is logged, counted and skipped.
 *
 * Backpressure: when the sink's queue is over its byte limit the assigned partitions are
 * paused (rd_kafka_pause_partitions) and resumed once it has room, so memory stays bounded
 * and a PostgreSQL that is down leaves the records in Kafka (the lag grows).
 *
 * Rebalance (eager): on revoke the consumer waits up to revoke_wait_ms for the sink to settle
 * what it submitted, commits what is settled and lets the partitions go; what is still
 * queued then is stored later but not committed, so the next owner reads it again (a
 * duplicate, recognised). On assign it starts from the group's committed offset.
 *
 * Threads: the poll thread (records, rebalance callbacks, commits, watermarks), the sink's
 * flush thread (done callback), the HTTP thread (metrics).
 */
#ifndef KP_CONSUMER_H
#define KP_CONSUMER_H

#include <stdbool.h>
#include <stdint.h>

#include "collectord.h"

struct kp_sinkd;

/*
 * Starts the sink role from collectord's configuration: the PostgreSQL sink, the consumer
 * (subscribed to cfg->kafka_topic in group cfg->kafka_group) and the HTTP server; writes the
 * ready file. Returns 0 and *out (owned: kp_sinkd_destroy), or a negative code with what to
 * do in errbuf. Blocks on PostgreSQL.
 */
int kp_sinkd_create(const struct kp_collectord_config *cfg, struct kp_sinkd **out, char *errbuf,
                    size_t errlen);

/* The bound HTTP port. */
int kp_sinkd_http_port(const struct kp_sinkd *d);

/* Stops polling, flushes what the sink holds (up to the shutdown grace), commits the offsets
 * of what it settled, leaves the group and frees everything. Accepts NULL. */
void kp_sinkd_destroy(struct kp_sinkd *d);

/* Counters, for /metrics and tests. */
struct kp_sinkd_stats {
    uint64_t consumed;  /* records read from Kafka */
    uint64_t stored;    /* batches committed to PostgreSQL */
    uint64_t duplicate; /* batches PostgreSQL already held */
    uint64_t rejected;  /* batches for an unknown or ended run, or a rank outside it */
    uint64_t malformed; /* records that are not a valid kprof.v1.Batch */
    uint64_t lost;      /* records deleted by retention before they were stored */
    uint64_t pauses;    /* times the partitions were paused for a full queue */
    uint64_t rebalances;
};
void kp_sinkd_get_stats(struct kp_sinkd *d, struct kp_sinkd_stats *out);

#endif
