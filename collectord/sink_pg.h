/*
 * The PostgreSQL sink of kprof-collectord: a bounded queue of decoded batches and one flush
 * thread that stores them with COPY, one transaction per flush.
 *
 * Ingest protocol (the durable half; the gRPC half is ingest.c):
 *   1. ingest.c validates a batch (kp_batch_validate) and submits it here.
 *   2. The flush thread takes up to flush_max_rows rows (or whatever is queued when
 *      flush_interval_ms passes), checks each batch's run and rank (a cache of runs, filled
 *      from PostgreSQL on a miss), resolves new names into the `names` dictionary (its own
 *      short transaction: names are shared and harmless to keep), then in one transaction
 *      inserts the batch keys into ingest_batches ON CONFLICT DO NOTHING, COPYs the rows of
 *      the batches whose keys were new, adds their counts to `ranks`, and commits.
 *   3. Only after COMMIT are the items handed back through done_cb, marked committed or
 *      duplicate; a batch for an unknown run (KP_ENOTFOUND), a rank outside the run's world
 *      size (KP_EPROTO) or a run that has ended (-EBUSY) is handed back rejected, with the
 *      reason, and stores nothing. The transaction first locks the batches' runs FOR SHARE,
 *      which the UPDATE ending a run waits for, so a flush commits wholly before an end or
 *      after it. Into a run no longer OPEN, a batch its producer made before the end is
 *      stored: its seq is at most the highest seq its (run, stream) stored (a resend, which
 *      comes back duplicate, or an older batch late to arrive), or the run is a capture and
 *      the batch's base_ns is no later than ended_at (an agent's spool, sent once collectord is
 *      back). Any other batch is rejected with -EBUSY. Neither test depends on when the batch
 *      arrives (the highest seq of an ended run's stream no longer grows), so a resend always
 *      gets the answer its first copy got.
 *   4. If PostgreSQL fails, the transaction is rolled back, the connection is re-made with
 *      capped full-jitter backoff, and the same items are flushed again: nothing queued is
 *      lost and nothing is stored twice. Meanwhile the queue fills and ingest stops reading
 *      (kp_sink_submit returns false), which is gRPC flow control back to the producers.
 */
#ifndef KP_SINK_PG_H
#define KP_SINK_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kprof.pb-c.h"

struct kp_sink;
struct kp_metrics;

/* One decoded batch on its way to PostgreSQL. */
struct kp_sink_item {
    Kprof__V1__Batch *batch;   /* owned by the item: protobuf_c_message_free_unpacked */
    size_t wire_bytes;         /* counted against queue_max_bytes */
    size_t rows;               /* kp_batch_total_rows(batch) */
    void *origin;              /* the submitter's context (the ingest call); opaque here */
    struct kp_sink_item *next; /* queue link, owned by the sink while queued */
    /* Filled in by the sink before done_cb: */
    int status;     /* 0 stored (or duplicate), KP_ENOTFOUND, KP_EPROTO */
    bool duplicate; /* the key was stored before; rows skipped */
    char err[192];  /* reason when status != 0 */
};

/*
 * Called on the flush thread after each flush with the items it settled (committed,
 * duplicate or rejected), in submission order. The callee takes the items and frees them with
 * kp_sink_item_free. It must not block on the sink.
 */
typedef void kp_sink_done_cb(struct kp_sink_item **items, size_t n, void *ud);

struct kp_sink_config {
    const char *conninfo;        /* libpq conninfo; borrowed for kp_sink_create's duration */
    size_t queue_max_bytes;      /* over this, kp_sink_submit says pause */
    size_t flush_max_rows;       /* rows per transaction */
    long long flush_interval_ms; /* longest wait to fill a flush once something is queued */
    long long retry_max_ms;      /* backoff cap while PostgreSQL is down */
};

/*
 * Connects, applies the schema migrations (kp_pg_migrate), and starts the flush thread.
 * Returns 0 and *out (owned: kp_sink_destroy), or a negative code with the reason in errbuf.
 * May block on PostgreSQL.
 */
int kp_sink_create(const struct kp_sink_config *cfg, kp_sink_done_cb *done, void *ud,
                   struct kp_sink **out, char *errbuf, size_t errlen);

/*
 * Queues an item; takes it (it comes back through done_cb). Never blocks. Returns true if
 * the producer may keep sending, false if the queue is over queue_max_bytes and the producer
 * should pause until kp_sink_has_room. Thread-safe.
 */
bool kp_sink_submit(struct kp_sink *s, struct kp_sink_item *item);

/* True while the queue is under its byte limit. Thread-safe. */
bool kp_sink_has_room(struct kp_sink *s);

/* True once the sink has a working connection and the schema is current (for /readyz). */
bool kp_sink_ready(struct kp_sink *s);

/* Stops the flush thread after it has flushed what is queued (or given up after
 * drain_timeout_ms while PostgreSQL is unreachable: those items come back with status
 * KP_ESHUTDOWN) and frees the sink. Accepts NULL. */
void kp_sink_destroy(struct kp_sink *s, long long drain_timeout_ms);

/* Frees an item and its batch. Accepts NULL. */
void kp_sink_item_free(struct kp_sink_item *item);

/*
 * What ingest.c needs of a sink, so that it drives either this one or the Kafka sink
 * (sink_kafka.h) the same way: submit (takes the item; false: pause the stream), has_room, and
 * the items back through the done callback given at creation, in submission order.
 */
struct kp_sink_ops {
    bool (*submit)(void *sink, struct kp_sink_item *item);
    bool (*has_room)(void *sink);
};

/* kp_sink_submit and kp_sink_has_room, for kp_ingest_set_sink. */
extern const struct kp_sink_ops kp_sink_pg_ops;

/* Counters, for /metrics and tests. Thread-safe snapshots. */
struct kp_sink_stats {
    uint64_t batches_committed;
    uint64_t batches_duplicate;
    uint64_t batches_rejected;
    uint64_t rows_committed;
    uint64_t flushes;
    uint64_t flush_failures; /* transactions rolled back and retried */
    uint64_t queued_bytes;
    uint64_t queued_items;
};
void kp_sink_get_stats(struct kp_sink *s, struct kp_sink_stats *out);

#endif
