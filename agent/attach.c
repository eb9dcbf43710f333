/*
 * kp_attach: see attach.h.
 *
 * One thread turns one loop: (re)open the call when there is none (after the backoff),
 * send the newest snapshot when it is new or the heartbeat is due, then receive for at most
 * recv_poll_ms. Sending and receiving on one thread keeps it simple: reports are small and
 * collectord reads them at once, so a send does not wait long; kp_rpc_stream_cancel (from
 * kp_attach_destroy) unblocks either.
 *
 * Lock: att->mu guards the snapshot hand-over, the command queue, the stats, stop and the
 * stream pointer (so that destroy can cancel a call the thread is blocked in). It is never
 * held across a gRPC operation.
 *
 * A call counts as attached once a report went out on it and the call survived the next
 * receive poll: a collectord that refuses the method (UNIMPLEMENTED) or drops the call at
 * once is an outage, not an attach followed by a loss.
 */
#define _GNU_SOURCE
#define KP_LOG_MODULE "attach"
#include "attach.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kp_clock.h"
#include "kp_coordinator.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_str.h"

/* The receive's slice while no report has been sent on the call yet. */
#define KP_ATTACH_FIRST_POLL_MS 20
/* How long the Coordinator question may take before the call opens on the given channel. */
#define KP_ATTACH_RESOLVE_MS 1000

struct kp_attach {
    struct kp_rpc_channel *ch;
    const struct kp_rpc_channel_opts *chopts;
    struct kp_rpc_channel *coord_ch; /* owned: to coord_target (attach thread only) */
    char coord_target[256];
    char target[512];
    int wake_fd;
    size_t max_queue;
    long long heartbeat_ms, poll_ms, base_ms, max_ms;
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: stop, during the backoff */
    /* under mu */
    bool stop;
    struct kp_rpc_stream *stream; /* the live call, for destroy to cancel */
    uint8_t *pending;             /* newest snapshot not yet taken by the thread */
    size_t pending_len;
    uint64_t gen;                  /* bumped by each publish */
    Kprof__V1__CaptureCommand **q; /* ring of max_queue */
    size_t q_head, q_len;
    bool overflow_logged; /* reset when the queue drains */
    struct kp_attach_stats stats;
    /* attach thread only */
    uint64_t rng;
    struct kp_complain complain;
    bool bad_logged;
};

static uint64_t rng_next(struct kp_attach *att)
{
    /* xorshift64*: jitter only */
    att->rng ^= att->rng >> 12;
    att->rng ^= att->rng << 25;
    att->rng ^= att->rng >> 27;
    return att->rng * 2685821657736338717ULL;
}

/* Capped full jitter: a delay in [0, min(max, base * 2^attempt)]. */
static long long backoff_ms(struct kp_attach *att, unsigned attempt)
{
    long long ceil_ms = att->base_ms;

    for (unsigned i = 0; i < attempt && ceil_ms < att->max_ms; i++) {
        ceil_ms *= 2;
    }
    if (ceil_ms > att->max_ms) {
        ceil_ms = att->max_ms;
    }
    return (long long) (rng_next(att) % (uint64_t) (ceil_ms + 1));
}

static void wake_loop(struct kp_attach *att)
{
    uint64_t one = 1;

    if (att->wake_fd >= 0 && write(att->wake_fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is saturated, so the loop is woken anyway */
    }
}

/* Queues a received command (takes cmd). */
static void enqueue(struct kp_attach *att, Kprof__V1__CaptureCommand *cmd)
{
    bool was_empty, dropped = false, log_drop = false;
    uint64_t n_dropped = 0;

    pthread_mutex_lock(&att->mu);
    att->stats.commands_received++;
    was_empty = att->q_len == 0;
    if (att->q_len >= att->max_queue) {
        dropped = true;
        n_dropped = ++att->stats.commands_dropped;
        if (!att->overflow_logged) {
            att->overflow_logged = true;
            log_drop = true;
        }
    }
    else {
        att->q[(att->q_head + att->q_len) % att->max_queue] = cmd;
        att->q_len++;
        att->stats.queued = att->q_len;
    }
    pthread_mutex_unlock(&att->mu);
    if (dropped) {
        if (log_drop) {
            kp_log_warn("capture command queue full, command dropped kind=%d run=%" PRIu64
                        " queued=%zu dropped_total=%" PRIu64
                        " (the agent's loop is not taking commands: stalled?)",
                        (int) cmd->kind, cmd->run_id, att->max_queue, n_dropped);
        }
        protobuf_c_message_free_unpacked(&cmd->base, NULL);
        return;
    }
    kp_log_debug("capture command queued kind=%d run=%" PRIu64, (int) cmd->kind, cmd->run_id);
    if (was_empty) {
        /* the loop drains the whole queue on each wake-up, so one wake per empty->non-empty
         * transition is enough */
        wake_loop(att);
    }
}

/* Sleeps until ms (CLOCK_MONOTONIC) or stop. Called with mu held. */
static void wait_until_locked(struct kp_attach *att, long long ms)
{
    struct timespec ts;

    ts.tv_sec = (time_t) (ms / 1000);
    ts.tv_nsec = (long) (ms % 1000) * 1000000L;
    while (!att->stop && kp_mono_ms() < ms) {
        if (pthread_cond_timedwait(&att->cond, &att->mu, &ts) == ETIMEDOUT) {
            break;
        }
    }
}

/* The call is over (or never came up): says so once per outage and frees it. */
static void call_broken(struct kp_attach *att, struct kp_rpc_stream *st, bool attached,
                        const char *what)
{
    struct kp_rpc_status rs;

    memset(&rs, 0, sizeof(rs));
    if (kp_rpc_stream_finish(st, &rs, 1000) == -ETIMEDOUT) {
        rs.code = GRPC_STATUS_UNKNOWN;
        snprintf(rs.details, sizeof(rs.details), "%s, and no status came", what);
    }
    pthread_mutex_lock(&att->mu);
    att->stream = NULL;
    att->stats.attached = false;
    pthread_mutex_unlock(&att->mu);
    kp_rpc_stream_destroy(st);
    if (attached) {
        kp_complain(&att->complain, KP_LOG_WARN, KP_LOG_MODULE,
                    "detached from collectord at %s status=%s details=\"%s\" (reconnecting)",
                    att->target, kp_rpc_status_name(rs.code), rs.details);
    }
    else {
        kp_complain(&att->complain, KP_LOG_WARN, KP_LOG_MODULE,
                    "cannot attach to collectord at %s status=%s details=\"%s\" (retrying; "
                    "kprofctl capture commands do not reach this agent meanwhile)",
                    att->target, kp_rpc_status_name(rs.code), rs.details);
    }
}

/* The channel to open Attach on: ch, or one to the capture coordinator when ch's replica
 * names another (asked again at every open, so a failover is followed). Attach thread. */
static struct kp_rpc_channel *coordinator_channel(struct kp_attach *att)
{
    char addr[256], err[512];
    struct kp_rpc_channel *ch = NULL;

    if (att->chopts == NULL) {
        return att->ch;
    }
    /* short: a stop waits for it */
    kp_coordinator_resolve(att->ch, att->target, KP_ATTACH_RESOLVE_MS, addr, sizeof(addr));
    if (addr[0] == '\0') {
        return att->ch;
    }
    if (att->coord_ch != NULL && strcmp(addr, att->coord_target) == 0) {
        return att->coord_ch;
    }
    if (kp_rpc_channel_create(addr, att->chopts, &ch, err, sizeof(err)) != 0) {
        kp_log_warn("cannot open a channel to the capture coordinator at %s err=\"%s\"", addr, err);
        return att->ch;
    }
    kp_log_info("capture coordinator is at %s (asked %s)", addr, att->target);
    kp_rpc_channel_destroy(att->coord_ch);
    att->coord_ch = ch;
    kp_strlcpy(att->coord_target, sizeof(att->coord_target), addr);
    return ch;
}

static void *attach_main(void *arg)
{
    struct kp_attach *att = arg;
    struct kp_rpc_stream *st = NULL;
    uint8_t *snap = NULL; /* the newest snapshot taken over from the publisher */
    size_t snap_len = 0;
    uint64_t snap_gen = 0, sent_gen = 0;
    long long last_send_ms = 0, retry_at_ms = 0, up_since_ms = 0;
    bool attached = false, sent = false;
    unsigned attempt = 0;
    struct kp_rpc_channel *used;
    const char *via = att->target; /* where the call went: target or the coordinator */

    pthread_mutex_lock(&att->mu);
    while (!att->stop) {
        ProtobufCMessage *msg = NULL;
        struct kp_rpc_status rs;
        long long now;
        int rc;

        if (st == NULL) {
            if (kp_mono_ms() < retry_at_ms) {
                wait_until_locked(att, retry_at_ms);
                continue;
            }
            att->stats.attempts++;
            pthread_mutex_unlock(&att->mu);
            memset(&rs, 0, sizeof(rs));
            used = coordinator_channel(att);
            via = used == att->coord_ch ? att->coord_target : att->target;
            rc = kp_rpc_stream_open(used, KP_ATTACH_PATH, &kprof__v1__capture_command__descriptor,
                                    0, &st, &rs);
            pthread_mutex_lock(&att->mu);
            if (rc != 0) {
                st = NULL;
                pthread_mutex_unlock(&att->mu);
                kp_complain(&att->complain, KP_LOG_WARN, KP_LOG_MODULE,
                            "cannot attach to collectord at %s status=%s details=\"%s\" "
                            "(retrying)",
                            att->target, kp_rpc_status_name(rs.code), rs.details);
                pthread_mutex_lock(&att->mu);
                retry_at_ms = kp_mono_ms() + backoff_ms(att, attempt++);
                continue;
            }
            if (att->stop) {
                break; /* destroyed below */
            }
            att->stream = st;
            sent_gen = 0; /* (re)send the newest snapshot at once */
            attached = false;
            sent = false;
            continue;
        }
        if (att->pending != NULL) {
            free(snap);
            snap = att->pending;
            snap_len = att->pending_len;
            snap_gen = att->gen;
            att->pending = NULL;
        }
        pthread_mutex_unlock(&att->mu);
        now = kp_mono_ms();
        rc = 0;
        if (snap != NULL && (snap_gen != sent_gen || now - last_send_ms >= att->heartbeat_ms)) {
            rc = kp_rpc_stream_send_bytes(st, snap, snap_len);
            if (rc == 0) {
                sent_gen = snap_gen;
                last_send_ms = now;
                sent = true;
                pthread_mutex_lock(&att->mu);
                att->stats.reports_sent++;
                pthread_mutex_unlock(&att->mu);
            }
        }
        if (rc == 0) {
            /* Until the first report is out, wait in short slices: a snapshot published just
             * after the call opened must not wait a whole poll (collectord sends nothing
             * before it knows the agent). */
            rc = kp_rpc_stream_recv(st, &msg, sent ? att->poll_ms : KP_ATTACH_FIRST_POLL_MS);
            if (rc == 1) {
                enqueue(att, (Kprof__V1__CaptureCommand *) msg);
            }
            else if (rc == KP_EPROTO) {
                pthread_mutex_lock(&att->mu);
                att->stats.commands_bad++;
                pthread_mutex_unlock(&att->mu);
                if (!att->bad_logged) {
                    att->bad_logged = true;
                    kp_log_warn("a capture command from collectord at %s did not unpack; "
                                "ignored (a kprof version mismatch?)",
                                att->target);
                }
                rc = -ETIMEDOUT; /* the call goes on */
            }
        }
        if ((rc == 1 || rc == -ETIMEDOUT) && sent && !attached) {
            attached = true;
            up_since_ms = kp_mono_ms();
            pthread_mutex_lock(&att->mu);
            att->stats.attached = true;
            att->stats.attaches++;
            pthread_mutex_unlock(&att->mu);
            if (att->complain.interval_ns != 0) {
                kp_release(&att->complain, KP_LOG_MODULE, "attached to collectord at %s", via);
            }
            else {
                kp_log_info("attached to collectord at %s", via);
            }
        }
        if (rc != 1 && rc != -ETIMEDOUT) {
            /* 0: collectord ended the call; KP_ERPC: it broke (or destroy cancelled it) */
            bool stopping;

            pthread_mutex_lock(&att->mu);
            stopping = att->stop;
            pthread_mutex_unlock(&att->mu);
            if (stopping) {
                pthread_mutex_lock(&att->mu);
                break;
            }
            if (attached && kp_mono_ms() - up_since_ms >= att->max_ms) {
                attempt = 0; /* it was up for a while: start the backoff over */
            }
            call_broken(att, st, attached, rc == 0 ? "collectord ended the call" : "call broke");
            st = NULL;
            attached = false;
            retry_at_ms = kp_mono_ms() + backoff_ms(att, attempt++);
        }
        pthread_mutex_lock(&att->mu);
    }
    att->stream = NULL;
    att->stats.attached = false;
    pthread_mutex_unlock(&att->mu);
    kp_rpc_stream_destroy(st);
    free(snap);
    return NULL;
}

int kp_attach_create(const struct kp_attach_opts *o, struct kp_attach **out)
{
    struct kp_attach *att;
    pthread_condattr_t ca;

    *out = NULL;
    if (o == NULL || o->ch == NULL) {
        return -EINVAL;
    }
    if ((att = calloc(1, sizeof(*att))) == NULL) {
        return -ENOMEM;
    }
    att->ch = o->ch;
    att->chopts = o->chopts;
    snprintf(att->target, sizeof(att->target), "%s", o->target != NULL ? o->target : "?");
    att->wake_fd = o->wake_fd;
    att->max_queue = o->max_queue > 0 ? o->max_queue : KP_ATTACH_DEFAULT_QUEUE;
    att->heartbeat_ms = o->heartbeat_ms > 0 ? o->heartbeat_ms : KP_ATTACH_DEFAULT_HEARTBEAT_MS;
    att->poll_ms = o->recv_poll_ms > 0 ? o->recv_poll_ms : KP_ATTACH_DEFAULT_POLL_MS;
    att->base_ms = o->reconnect_base_ms > 0 ? o->reconnect_base_ms : KP_ATTACH_DEFAULT_BASE_MS;
    att->max_ms = o->reconnect_max_ms > 0 ? o->reconnect_max_ms : KP_ATTACH_DEFAULT_MAX_MS;
    if (att->max_ms < att->base_ms) {
        att->max_ms = att->base_ms;
    }
    att->rng = ((uint64_t) kp_mono_ms() << 16) ^ (uint64_t) getpid() ^ (uint64_t) (uintptr_t) att;
    if (att->rng == 0) {
        att->rng = 0x9e3779b97f4a7c15ULL;
    }
    pthread_mutex_init(&att->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&att->cond, &ca);
    pthread_condattr_destroy(&ca);
    if ((att->q = calloc(att->max_queue, sizeof(*att->q))) == NULL) {
        kp_attach_destroy(att);
        return -ENOMEM;
    }
    if (pthread_create(&att->th, NULL, attach_main, att) != 0) {
        kp_attach_destroy(att);
        return -EAGAIN;
    }
    att->started = true;
    *out = att;
    return 0;
}

void kp_attach_destroy(struct kp_attach *att)
{
    if (att == NULL) {
        return;
    }
    if (att->started) {
        pthread_mutex_lock(&att->mu);
        att->stop = true;
        if (att->stream != NULL) {
            kp_rpc_stream_cancel(att->stream);
        }
        pthread_cond_broadcast(&att->cond);
        pthread_mutex_unlock(&att->mu);
        pthread_join(att->th, NULL);
    }
    if (att->q != NULL) {
        for (size_t i = 0; i < att->q_len; i++) {
            Kprof__V1__CaptureCommand *c = att->q[(att->q_head + i) % att->max_queue];

            protobuf_c_message_free_unpacked(&c->base, NULL);
        }
        free(att->q);
    }
    free(att->pending);
    kp_rpc_channel_destroy(att->coord_ch);
    pthread_cond_destroy(&att->cond);
    pthread_mutex_destroy(&att->mu);
    free(att);
}

int kp_attach_publish(struct kp_attach *att, const void *buf, size_t len)
{
    uint8_t *copy = malloc(len > 0 ? len : 1);
    uint8_t *old;

    if (copy == NULL) {
        return -ENOMEM;
    }
    if (len > 0) {
        memcpy(copy, buf, len);
    }
    pthread_mutex_lock(&att->mu);
    old = att->pending;
    att->pending = copy;
    att->pending_len = len;
    att->gen++;
    pthread_mutex_unlock(&att->mu);
    free(old);
    return 0;
}

Kprof__V1__CaptureCommand *kp_attach_take(struct kp_attach *att)
{
    Kprof__V1__CaptureCommand *c = NULL;

    pthread_mutex_lock(&att->mu);
    if (att->q_len > 0) {
        c = att->q[att->q_head];
        att->q[att->q_head] = NULL;
        att->q_head = (att->q_head + 1) % att->max_queue;
        att->q_len--;
        att->stats.queued = att->q_len;
    }
    if (att->q_len == 0) {
        att->overflow_logged = false;
    }
    pthread_mutex_unlock(&att->mu);
    return c;
}

void kp_attach_get_stats(struct kp_attach *att, struct kp_attach_stats *out)
{
    pthread_mutex_lock(&att->mu);
    *out = att->stats;
    pthread_mutex_unlock(&att->mu);
}
