/*
 * kp_workq: a bounded work queue served by a fixed pool of worker threads, each with optional
 * state of its own (a daemon's PostgreSQL connection, opened and reconnected by its callbacks),
 * for the blocking work that must not run on a gRPC or HTTP thread (docs/style.md §8).
 *
 * Items: opaque pointers. kp_workq_submit() takes one and returns at once: 0 (the queue owns it
 * now and hands it to run or cancel exactly once), -EBUSY when the queue is full (or the key's
 * share is, see Fairness), -ESHUTDOWN once kp_workq_destroy() began (in both the caller keeps
 * it). Each runs on one worker; with several workers, items run concurrently.
 *
 * Bound: at most workers + queue_max items are accepted and not yet finished, so queue_max items
 * wait while every worker is busy; queue_max 0 accepts an item only when a worker is free.
 *
 * Fairness: items carry a key (kp_workq_submit_keyed: the client that asked, so that one client
 * cannot refuse everyone else; kp_workq_submit's items share the key "" and no share limits
 * them). Keys are served in
 * turn: a free worker takes the oldest item of the next key that has one, so a key's first item
 * waits for at most one item of every other key, however many they queued. And a key that
 * already has items in flight gets -EBUSY past its share, (workers + queue_max) / (k + 2)
 * (at least 1) where k is the number of other keys with items in flight: a client alone may
 * fill half the capacity, the other half is left for the next ones. Items of one key run in
 * submission order (with one worker; with several they run concurrently).
 *
 * Worker state: each worker calls init on its own thread before anything else, and fini on it
 * before it ends. kp_workq_create() waits for every init: one that fails makes create fail (with
 * init's message), after the workers already started were stopped and their fini ran.
 *
 * Tick: when tick is set, each worker calls it once after init; with tick_ms > 0, also after
 * each item and every tick_ms while it waits for one. It is where a worker opens its connection
 * early (tick_ms 0), or does periodic work that a busy queue must not starve.
 *
 * Stop: kp_workq_destroy() refuses new items, lets the items that are running finish, hands
 * every item still queued to cancel (on a worker thread), joins the workers and frees the queue.
 *
 * Threads: submit, queued and destroy may be called from any thread except a worker's (destroy
 * from a worker would wait for itself). The callbacks run on the workers, never under the
 * queue's mutex, so they may block and may submit.
 */
#ifndef KP_WORKQ_H
#define KP_WORKQ_H

#include <stddef.h>

struct kp_workq;

#define KP_WORKQ_MAX_WORKERS 256
#define KP_WORKQ_KEY_MAX     128 /* a key's bytes that count, NUL included */

/* Sets *state (owned by the worker until fini; may stay NULL) for worker index 0..workers-1.
 * Returns 0, or a negative code with a message in err (at most len bytes). */
typedef int kp_workq_init_cb(void *ud, size_t index, void **state, char *err, size_t len);

/* Frees what init set. Also runs for a worker whose init failed, with the state it set. */
typedef void kp_workq_fini_cb(void *ud, void *state);

/* Does the work of item and frees it. */
typedef void kp_workq_run_cb(void *ud, void *state, void *item);

/* Answers an item that will not run (the queue is stopping) and frees it. */
typedef void kp_workq_cancel_cb(void *ud, void *item);

/* Periodic work of a worker (see Tick above). */
typedef void kp_workq_tick_cb(void *ud, void *state);

struct kp_workq_ops {
    kp_workq_init_cb *init;     /* optional */
    kp_workq_fini_cb *fini;     /* optional */
    kp_workq_run_cb *run;       /* required */
    kp_workq_cancel_cb *cancel; /* required */
    kp_workq_tick_cb *tick;     /* optional */
};

struct kp_workq_opts {
    size_t workers;    /* 1..KP_WORKQ_MAX_WORKERS */
    size_t queue_max;  /* items that may wait while every worker is busy */
    long long tick_ms; /* see Tick; 0: tick only once, after init */
};

/*
 * Starts opts->workers threads and waits for their init. ops and ud are borrowed and must
 * outlive the queue. Returns 0 and *out (owned: kp_workq_destroy); -EINVAL for bad opts or ops;
 * -ENOMEM; -EAGAIN when a thread cannot start; or init's code. On failure, err says why.
 */
int kp_workq_create(const struct kp_workq_opts *opts, const struct kp_workq_ops *ops, void *ud,
                    struct kp_workq **out, char *err, size_t len);

/* Queues item (see Items above) under the key "". Never blocks on the workers. */
int kp_workq_submit(struct kp_workq *q, void *item);

/* Queues item for the client key (borrowed; the first KP_WORKQ_KEY_MAX - 1 bytes count): see
 * Fairness above. Also -ENOMEM. Never blocks on the workers. */
int kp_workq_submit_keyed(struct kp_workq *q, void *item, const char *key);

/* Items waiting for a worker now (not those running). */
size_t kp_workq_queued(struct kp_workq *q);

/* Stops the queue (see Stop above) and frees it. Accepts NULL. */
void kp_workq_destroy(struct kp_workq *q);

#endif
