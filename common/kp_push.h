/*
 * kp_push: the reliable producer of Ingest.Push, used by the node agent, kprofctl import and
 * kprof-loadgen.
 *
 * One kp_push is one producer `stream` id. It numbers the batches it is given 1, 2, 3, ...
 * (or from opts.first_seq), encodes each once and keeps the bytes until collectord
 * acknowledges them (an Ack means the batch is committed in PostgreSQL, or was already:
 * duplicate). Protocol, per kprof.proto:
 *  - Batches go out in seq order on one Push call. At most `window` batches (and about
 *    `window_bytes` bytes) are unacknowledged at a time: kp_push_send blocks while the window
 *    is full, so memory stays bounded.
 *  - If the call breaks with a retryable status (UNAVAILABLE: collectord restarted or the
 *    connection reset; CANCELLED, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNKNOWN; or an OK end
 *    that left batches unacknowledged), a new call is opened after a capped full-jitter backoff
 *    and every unacknowledged batch is sent again, in order. collectord stores each
 *    (run, rank, stream, seq) once and acknowledges repeats as duplicates, so nothing is lost
 *    or stored twice.
 *  - Terminal statuses (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, UNIMPLEMENTED,
 *    PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS,
 *    DATA_LOSS) are not retried: the push fails, every later call returns KP_ERPC, and
 *    kp_push_error gives the status code and details. So does giving up: no
 *    acknowledgement for give_up_after_ms while batches are pending (collectord unreachable,
 *    or not acknowledging, frozen included: the call is cancelled even while a send waits on
 *    a collectord that reads nothing), with the last call's status (UNAVAILABLE, ...) or
 *    DEADLINE_EXCEEDED.
 *  - kp_push_flush half-closes the call once everything is sent and returns when every batch
 *    is acknowledged and collectord has ended the call OK. A later send opens a new call.
 *
 * Threads: an I/O thread owns the call and does all sends (one sender per kp_rpc_stream); a
 * receiver thread per call reads the Acks and, with give_up_after_ms, cancels a call that
 * outlives it (the I/O thread may be blocked in a send then). kp_push_send, kp_push_send_encoded,
 * kp_push_flush and kp_push_destroy are for one producer thread; kp_push_get_stats and
 * kp_push_error may be called from any thread.
 */
#ifndef KP_PUSH_H
#define KP_PUSH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_rpc.h"
#include "kprof.pb-c.h"

struct kp_push;

#define KP_PUSH_PATH                  "/kprof.v1.Ingest/Push"
#define KP_PUSH_DEFAULT_WINDOW        32
#define KP_PUSH_DEFAULT_WINDOW_BYTES  (64u << 20)
#define KP_PUSH_DEFAULT_BACKOFF_MS    100
#define KP_PUSH_DEFAULT_RECONNECT_MAX 5000
#define KP_PUSH_MAX_WINDOW            65536

struct kp_push_opts {
    uint32_t window;             /* unacknowledged batches; 0: KP_PUSH_DEFAULT_WINDOW */
    size_t window_bytes;         /* unacknowledged encoded bytes (one batch may exceed it
                                  * alone); 0: KP_PUSH_DEFAULT_WINDOW_BYTES */
    long long reconnect_base_ms; /* first backoff ceiling; 0: KP_PUSH_DEFAULT_BACKOFF_MS */
    long long reconnect_max_ms;  /* backoff cap; 0: KP_PUSH_DEFAULT_RECONNECT_MAX */
    long long give_up_after_ms;  /* fail with the last status after this long without
                                  * progress while batches are pending; 0: never */
    uint64_t first_seq;          /* seq of the first batch; 0: 1 */
};

struct kp_push_stats {
    uint64_t batches;      /* accepted by send */
    uint64_t bytes;        /* their encoded size */
    uint64_t acked;        /* acknowledged, each batch counted once */
    uint64_t duplicates;   /* of those, acknowledged as duplicates */
    uint64_t sends;        /* messages written to a call, repeats included */
    uint64_t resent;       /* repeats: sends of a batch after its first */
    uint64_t calls;        /* Push calls opened */
    uint64_t reconnects;   /* calls opened after a broken one */
    uint64_t stale_acks;   /* acks for batches not in flight (ignored) */
    uint32_t inflight;     /* unacknowledged now */
    uint32_t max_inflight; /* high-water mark of unacknowledged batches */
};

/*
 * Creates a producer for stream_id (1..INT64_MAX) on ch (borrowed: it must outlive the
 * push). Connects lazily, on the first send. Returns 0 and *out (kp_push_destroy), -EINVAL,
 * -ENOMEM or -EAGAIN (no thread).
 */
int kp_push_create(struct kp_rpc_channel *ch, uint64_t stream_id, const struct kp_push_opts *opts,
                   struct kp_push **out);

/*
 * Sets b->stream and b->seq (the caller sets run_id and rank), encodes b (borrowed: free to
 * reuse after the return) and queues it. Blocks while the window is full. Returns 0,
 * -ENOMEM, or KP_ERPC once the push has failed (see kp_push_error) or is being destroyed.
 */
int kp_push_send(struct kp_push *p, Kprof__V1__Batch *b);

/*
 * Queues an already encoded Batch (buf borrowed, copied). Its stream and seq fields should
 * be unset: the push appends its own (protobuf keeps the last value of a repeated scalar
 * field, so these win). Same returns as kp_push_send; *seq_out (may be NULL) gets the seq.
 */
int kp_push_send_encoded(struct kp_push *p, const void *buf, size_t len, uint64_t *seq_out);

/*
 * Waits until every batch sent so far is acknowledged and the call has ended cleanly.
 * Returns 0, -ETIMEDOUT after timeout_ms (-1: no limit; nothing is lost, the push goes on),
 * or KP_ERPC if the push has failed.
 */
int kp_push_flush(struct kp_push *p, long long timeout_ms);

/* Returns 0 while the push is healthy, or KP_ERPC with the terminal status in *st (may be
 * NULL). */
int kp_push_error(struct kp_push *p, struct kp_rpc_status *st);

void kp_push_get_stats(struct kp_push *p, struct kp_push_stats *out);

/*
 * Fills *out (initialised by the caller) with what this push has been given so far: rank -1,
 * its stream, the seqs of its first and last batch and their count, for EndRunRequest.marks
 * (kprof.proto StreamMark). Returns false when no batch has been sent (out->count 0: leave it
 * out). Any thread.
 */
bool kp_push_mark(struct kp_push *p, Kprof__V1__StreamMark *out);

/*
 * Returns how far acknowledgements have reached: every seq below the returned value is
 * acknowledged (first_seq while nothing is). Acks that arrive out of order do not move it past
 * an unacknowledged seq. Any thread.
 */
uint64_t kp_push_acked_through(struct kp_push *p);

/* Cancels the call, stops the threads and frees everything; unacknowledged batches are
 * dropped (flush first to keep them). Accepts NULL. */
void kp_push_destroy(struct kp_push *p);

#endif
