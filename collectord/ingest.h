/*
 * Ingest.Push, the gRPC half of ingestion (the durable half is sink_pg.h, or sink_kafka.h with
 * --sink kafka).
 *
 * Per stream: each Batch is unpacked by kp_rpc, validated here (kp_batch_validate with the
 * configured limits) and queued to the sink. A batch that fails validation ends the call with
 * INVALID_ARGUMENT (or RESOURCE_EXHAUSTED over a size limit) and a reason naming the column;
 * batches already queued from that call are still stored. When the sink settles batches
 * (after COMMIT), the call gets one Ack listing them, each marked duplicate or not; a batch
 * the sink rejects ends the call with NOT_FOUND (unknown run), INVALID_ARGUMENT (rank
 * outside the world size) or FAILED_PRECONDITION (a new batch into a run that has ended; see
 * sink_pg.h) or UNAVAILABLE (Kafka did not take it: the producer resends), logged once per call;
 * batches the producer sent after it on that call are dropped unread (it resends them). Once the
 * client half-closes and every batch it sent is settled, the call ends OK. While the sink's queue
 * is over its byte limit, the stream stops reading (gRPC flow control back to the producer) and
 * resumes when a flush makes room.
 *
 * Authorization (docs/design.md "Authorization"), with authentication on: a batch is taken
 * only if its caller may push into its run and rank (push_allowed in ingest.c: an agent into
 * the runs it created and the ranks it hosts of the captures armed on it, an operator into
 * runs an operator created). Who may is read from PostgreSQL (kp_store_run_owner) once per run
 * and kept: the first batch of a stream into a run not known yet waits, its stream paused,
 * until the lookup (kp_ingest_set_lookup) answers through kp_ingest_run_owner. A refused batch
 * ends the call with PERMISSION_DENIED naming the run; batches queued before it are stored.
 */
#ifndef KP_INGEST_H
#define KP_INGEST_H

#include <stdint.h>

#include "kp_codec.h"
#include "kp_rpc.h"
#include "sink_pg.h"
#include "store.h"

struct kp_ingest;

/* Creates the ingest state. limits is copied. Returns NULL on ENOMEM. */
struct kp_ingest *kp_ingest_create(const struct kp_batch_limits *limits);

/* Sets the sink, driven through ops (kp_sink_pg_ops or kp_sink_kafka_ops; sink borrowed; set
 * once, before the server starts). The sink hands items back through kp_ingest_done_cb. */
void kp_ingest_set_sink(struct kp_ingest *ing, const struct kp_sink_ops *ops, void *sink);

/* Caps the encoded bytes one stream may have in the sink, not yet acknowledged (set once,
 * before the server starts; 0: no cap): past it the stream stops reading, and reads again
 * once half of it is acknowledged, so one client cannot hold the whole queue. */
void kp_ingest_set_stream_max(struct kp_ingest *ing, size_t bytes);

/* Starts reading who may push into run_id (any thread; must not block): it answers later with
 * kp_ingest_run_owner. Returns false when it cannot (the waiting batch is then refused
 * UNAVAILABLE and resent by its producer). */
typedef bool kp_ingest_lookup_fn(void *ud, uint64_t run_id);

/* Sets the lookup (once, before the server starts). Without one, an authenticated push into a
 * run not known yet is refused UNAVAILABLE. */
void kp_ingest_set_lookup(struct kp_ingest *ing, kp_ingest_lookup_fn *fn, void *ud);

/* The answer to a lookup of run_id: rc 0 and *o (copied), KP_ENOTFOUND (no such run: its
 * batches go on to the sink, which answers NOT_FOUND), or another code with why (the waiting
 * streams end UNAVAILABLE). Any thread. */
void kp_ingest_run_owner(struct kp_ingest *ing, uint64_t run_id, int rc,
                         const struct kp_store_run_owner *o, const char *why);

/* The method table entry of Ingest.Push, bound to ing. */
struct kp_rpc_method kp_ingest_method(struct kp_ingest *ing);

/* The sink's done callback; ud is the kp_ingest. */
void kp_ingest_done_cb(struct kp_sink_item **items, size_t n, void *ud);

/* The runs of the open Push streams (each stream's last batch), up to max of them, into out
 * (repeats possible). Returns how many, or max + 1 when there are more. Any thread. */
size_t kp_ingest_live_runs(struct kp_ingest *ing, uint64_t *out, size_t max);

/* Counters for /metrics. */
struct kp_ingest_stats {
    uint64_t streams_opened;
    uint64_t batches_received;
    uint64_t batches_invalid;
    uint64_t bytes_received;
    uint64_t pauses;
    uint64_t batches_refused; /* PERMISSION_DENIED: a run or rank the caller may not push to */
};
void kp_ingest_get_stats(struct kp_ingest *ing, struct kp_ingest_stats *out);

/* Frees the ingest state. Every call must be closed and the sink destroyed first. */
void kp_ingest_destroy(struct kp_ingest *ing);

#endif
