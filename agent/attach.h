/*
 * kp_attach: the agent's long-lived Control.Attach call to collectord (proto/kprof.proto,
 * "Capture control"), run by one thread of its own.
 *
 * Reports: the loop thread builds an AgentReport, packs it and hands the bytes over with
 * kp_attach_publish (a copy under the mutex; the newest replaces an unsent older one). The
 * attach thread sends the newest snapshot right after each (re)connect, whenever a new one is
 * published (within recv_poll_ms; the first one on a call within a few ms), and again every
 * heartbeat_ms while nothing changes, so collectord always holds the agent's whole, fresh
 * picture and a lost report costs nothing.
 *
 * Commands: CaptureCommands received on the call are queued (at most max_queue; beyond that
 * a command is dropped, counted and logged once per overflow) and the loop is woken by one
 * write to wake_fd (an eventfd; coalesced); the loop drains the queue with kp_attach_take.
 *
 * The coordinator: only the elected collectord replica answers Attach (docs/design.md
 * "Coordinator election"). Before each (re)open the thread asks Control.Coordinator on ch
 * (kp_coordinator.h) and opens the call on a channel of its own to the address named there
 * (chopts: the same TLS settings and token), or on ch when that is the coordinator.
 *
 * Reconnects: when the call cannot be opened or breaks (collectord down, restarted, or ending
 * the call), the thread waits a capped full-jitter backoff (reconnect_base_ms doubling to
 * reconnect_max_ms) and opens a new call. One warn line per outage (kp_complain), and
 * "attached to collectord at <target>" at info once a call is up again.
 *
 * Threads: kp_attach_publish, kp_attach_take and kp_attach_get_stats may be called from any
 * thread and never block on I/O (only on the mutex, which no thread holds across I/O).
 */
#ifndef KP_ATTACH_H
#define KP_ATTACH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_rpc.h"
#include "kprof.pb-c.h"

#define KP_ATTACH_PATH                 "/kprof.v1.Control/Attach"
#define KP_ATTACH_DEFAULT_QUEUE        256
#define KP_ATTACH_DEFAULT_HEARTBEAT_MS 1000
#define KP_ATTACH_DEFAULT_POLL_MS      100
#define KP_ATTACH_DEFAULT_BASE_MS      100
#define KP_ATTACH_DEFAULT_MAX_MS       2000

struct kp_attach;

struct kp_attach_opts {
    struct kp_rpc_channel *ch; /* borrowed: must outlive the attach */
    /* how to open a channel to the coordinator when it is another replica (borrowed, with
     * its strings, for the attach's life); NULL: always use ch */
    const struct kp_rpc_channel_opts *chopts;
    const char *target;          /* collectord's address, for logs (copied) */
    int wake_fd;                 /* eventfd written when commands are queued; -1: none */
    size_t max_queue;            /* 0: KP_ATTACH_DEFAULT_QUEUE */
    long long heartbeat_ms;      /* 0: KP_ATTACH_DEFAULT_HEARTBEAT_MS */
    long long recv_poll_ms;      /* 0: KP_ATTACH_DEFAULT_POLL_MS */
    long long reconnect_base_ms; /* 0: KP_ATTACH_DEFAULT_BASE_MS */
    long long reconnect_max_ms;  /* 0: KP_ATTACH_DEFAULT_MAX_MS */
};

struct kp_attach_stats {
    bool attached;              /* a call is up now */
    uint64_t attaches;          /* calls that came up */
    uint64_t attempts;          /* calls opened (successful or not) */
    uint64_t reports_sent;      /* snapshots sent, heartbeats included */
    uint64_t commands_received; /* commands that unpacked */
    uint64_t commands_dropped;  /* queue full */
    uint64_t commands_bad;      /* did not unpack */
    size_t queued;              /* waiting for kp_attach_take */
};

/*
 * Starts the attach thread (it connects at once). Returns 0 and *out (kp_attach_destroy),
 * -EINVAL (no channel), -ENOMEM or -EAGAIN (no thread).
 */
int kp_attach_create(const struct kp_attach_opts *o, struct kp_attach **out);

/* Cancels the call, joins the thread and frees everything (queued commands too). Accepts
 * NULL. */
void kp_attach_destroy(struct kp_attach *att);

/*
 * Hands over a new report snapshot: len bytes of a packed AgentReport (borrowed: copied
 * before return). It replaces the previous snapshot and is sent soon. Any thread. Returns 0,
 * or -ENOMEM (the previous snapshot stays).
 */
int kp_attach_publish(struct kp_attach *att, const void *buf, size_t len);

/* Returns the oldest queued command (owned: protobuf_c_message_free_unpacked), or NULL when
 * none is queued. Any thread; never blocks on I/O. */
Kprof__V1__CaptureCommand *kp_attach_take(struct kp_attach *att);

void kp_attach_get_stats(struct kp_attach *att, struct kp_attach_stats *out);

#endif
