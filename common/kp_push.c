/*
 * kp_push: see kp_push.h for the protocol.
 *
 * State, all under p->mu:
 *  - ring[seq % cap] holds the encoded bytes of seq for head <= seq < next; head is the
 *    oldest batch not yet acknowledged (acknowledged slots are released from the head, so
 *    the window is next - head). send_next is the next seq the I/O thread writes on the
 *    current call; a new call starts again at head.
 *  - call is the current Push call (NULL between calls). Only the I/O thread opens, sends on,
 *    half-closes and destroys it; the receiver thread only receives and finishes it; destroy
 *    may cancel it, under mu, which is why the I/O thread detaches it (call = NULL) before
 *    destroying it.
 *  - A slot may be released (acknowledged) while the I/O thread is still writing its bytes
 *    with mu dropped: in_send names those bytes, and the I/O thread frees them afterwards.
 * One condition variable (CLOCK_MONOTONIC) serves every wait: window room, acks, the end of a
 * call, new work, stop.
 */
#define KP_LOG_MODULE "push"
#include "kp_push.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"

struct slot {
    uint8_t *buf; /* owned: the encoded Batch */
    size_t len;
    bool acked;
    bool sent; /* written to some call at least once */
};

struct kp_push {
    struct kp_rpc_channel *ch;
    uint64_t stream_id;
    uint64_t first_seq; /* of the first batch */
    uint32_t cap;
    size_t window_bytes;
    long long base_ms, max_ms, give_up_ms;

    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool mu_init, cond_init;
    pthread_t io;
    bool io_started;

    struct slot *ring;
    uint64_t head, next, send_next;
    size_t unacked_bytes;
    const uint8_t *in_send;
    bool in_send_released;

    struct kp_rpc_stream *call;
    struct kp_rpc_stream *rx_call; /* the receiver thread's call (see rx_main) */
    pthread_t rx;
    bool call_done, call_half_closed, call_send_failed;
    struct kp_rpc_status call_status;

    bool flushing, stop;
    int failed;
    struct kp_rpc_status fail_status;

    bool had_break;        /* the last call broke: the next one is a reconnect */
    bool restored;         /* an ack came after a break: log the recovery */
    long long progress_ms; /* last ack, or when work became pending */
    long long retry_at_ms; /* no call before this */
    unsigned attempt;      /* backoff exponent */
    uint64_t rng;
    struct kp_rpc_status last_status;
    struct kp_complain complain; /* I/O thread only */

    struct kp_push_stats st;
};

/* Waits on the condition until abs_ms (CLOCK_MONOTONIC), or indefinitely if abs_ms < 0. */
static int cond_wait_until(struct kp_push *p, long long abs_ms)
{
    struct timespec ts;

    if (abs_ms < 0) {
        return pthread_cond_wait(&p->cond, &p->mu);
    }
    ts.tv_sec = abs_ms / 1000;
    ts.tv_nsec = (abs_ms % 1000) * 1000000;
    return pthread_cond_timedwait(&p->cond, &p->mu, &ts);
}

static uint64_t rng_next(struct kp_push *p)
{
    /* xorshift64* */
    p->rng ^= p->rng >> 12;
    p->rng ^= p->rng << 25;
    p->rng ^= p->rng >> 27;
    return p->rng * 0x2545f4914f6cdd1dULL;
}

static bool status_terminal(grpc_status_code c)
{
    switch (c) {
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_NOT_FOUND:
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
    case GRPC_STATUS_UNIMPLEMENTED:
    case GRPC_STATUS_PERMISSION_DENIED:
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_ALREADY_EXISTS:
    case GRPC_STATUS_DATA_LOSS:
        return true;
    default:
        return false;
    }
}

/* Marks the push failed with st. Called with mu held. */
static void fail_locked(struct kp_push *p, grpc_status_code code, const char *details)
{
    size_t n;

    if (p->failed) {
        return;
    }
    p->failed = KP_ERPC;
    n = strnlen(details, sizeof(p->fail_status.details) - 1);
    p->fail_status.code = code;
    memcpy(p->fail_status.details, details, n);
    p->fail_status.details[n] = '\0';
    pthread_cond_broadcast(&p->cond);
}

/* Frees acknowledged slots from the head. Called with mu held. */
static void release_locked(struct kp_push *p)
{
    while (p->head < p->next && p->ring[p->head % p->cap].acked) {
        struct slot *sl = &p->ring[p->head % p->cap];

        if (sl->buf == p->in_send) {
            p->in_send_released = true; /* the I/O thread frees it after its write */
        }
        else {
            free(sl->buf);
        }
        p->unacked_bytes -= sl->len;
        memset(sl, 0, sizeof(*sl));
        p->head++;
    }
}

static void on_ack(struct kp_push *p, const Kprof__V1__Ack *ack)
{
    bool progress = false;

    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < ack->n_batches; i++) {
        const Kprof__V1__BatchRef *r = ack->batches[i];
        struct slot *sl;

        if (r->stream != p->stream_id || r->seq < p->head || r->seq >= p->send_next) {
            p->st.stale_acks++;
            continue;
        }
        sl = &p->ring[r->seq % p->cap];
        if (sl->acked) {
            p->st.stale_acks++;
            continue;
        }
        sl->acked = true;
        p->st.acked++;
        if (r->duplicate) {
            p->st.duplicates++;
        }
        progress = true;
    }
    if (progress) {
        release_locked(p);
        p->progress_ms = kp_mono_ms();
        p->attempt = 0;
        if (p->had_break) {
            p->restored = true;
        }
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&p->mu);
}

/*
 * How long the receiver may wait for an Ack before it checks the give-up clock (-1: no
 * limit), and whether that time is up with batches pending (*stalled). Takes mu.
 */
static long long rx_wait_ms(struct kp_push *p, bool *stalled)
{
    long long left;

    *stalled = false;
    pthread_mutex_lock(&p->mu);
    if (p->give_up_ms <= 0) {
        left = -1;
    }
    else if (p->head == p->next) {
        left = p->give_up_ms; /* idle: look again later, work may come */
    }
    else {
        left = p->progress_ms + p->give_up_ms - kp_mono_ms();
        *stalled = left <= 0;
    }
    pthread_mutex_unlock(&p->mu);
    return left;
}

/* The receiver thread of one call: reads Acks until the call ends, then its status. It also
 * keeps the give-up clock while the I/O thread may be blocked in a send that a frozen
 * collectord never takes: when it runs out, it cancels the call, which ends that send. */
static void *rx_main(void *arg)
{
    struct kp_push *p = arg;
    struct kp_rpc_stream *call;
    struct kp_rpc_status st;
    ProtobufCMessage *msg;
    int rc;

    /* rx_call, not call: the I/O thread may clear p->call (to tear the call down) before
     * this thread first runs; rx_call is set before the thread starts and stays until the
     * I/O thread has joined it */
    call = p->rx_call;
    for (;;) {
        bool stalled;
        long long wait = rx_wait_ms(p, &stalled);

        if (stalled) {
            /* the I/O thread gives up at its next look (see io_main); the call ends
             * CANCELLED and the receive below returns */
            kp_rpc_stream_cancel(call);
            wait = -1;
        }
        rc = kp_rpc_stream_recv(call, &msg, wait);
        if (rc == -ETIMEDOUT) {
            continue;
        }
        if (rc != 1) {
            break;
        }
        on_ack(p, (const Kprof__V1__Ack *) msg);
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    if (rc == KP_EPROTO) {
        kp_rpc_stream_cancel(call);
    }
    memset(&st, 0, sizeof(st));
    kp_rpc_stream_finish(call, &st, -1);
    if (rc == KP_EPROTO) {
        st.code = GRPC_STATUS_INTERNAL;
        snprintf(st.details, sizeof(st.details), "collectord sent an Ack that does not unpack");
    }
    pthread_mutex_lock(&p->mu);
    p->call_status = st;
    p->call_done = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Schedules the next call after a failure (capped full jitter). Called with mu held. */
static long long backoff_locked(struct kp_push *p)
{
    long long ceil_ms = p->base_ms;
    long long delay;

    for (unsigned i = 0; i < p->attempt && ceil_ms < p->max_ms; i++) {
        ceil_ms *= 2;
    }
    if (ceil_ms > p->max_ms) {
        ceil_ms = p->max_ms;
    }
    p->attempt++;
    delay = (long long) (rng_next(p) % (uint64_t) (ceil_ms + 1));
    p->retry_at_ms = kp_mono_ms() + delay;
    return delay;
}

/* A call failed to open or broke with batches unacknowledged. Called with mu held; drops it
 * to log. */
static void broken_locked(struct kp_push *p, const struct kp_rpc_status *st, const char *what)
{
    long long delay;
    uint64_t unacked = p->next - p->head;

    p->last_status = *st;
    if (status_terminal(st->code)) {
        fail_locked(p, st->code, st->details);
        return;
    }
    p->had_break = true;
    delay = backoff_locked(p);
    pthread_mutex_unlock(&p->mu);
    kp_complain(&p->complain, KP_LOG_WARN, KP_LOG_MODULE,
                "ingest %s stream=%" PRIu64 " status=%s details=\"%s\" unacked=%" PRIu64
                " retry_in_ms=%lld",
                what, p->stream_id, kp_rpc_status_name(st->code), st->details, unacked, delay);
    pthread_mutex_lock(&p->mu);
}

static void open_call(struct kp_push *p)
{
    struct kp_rpc_stream *c = NULL;
    struct kp_rpc_status st;
    int rc;

    memset(&st, 0, sizeof(st));
    pthread_mutex_unlock(&p->mu);
    rc = kp_rpc_stream_open(p->ch, KP_PUSH_PATH, &kprof__v1__ack__descriptor, 0, &c, &st);
    pthread_mutex_lock(&p->mu);
    if (rc != 0) {
        if (rc == -ENOMEM) {
            st.code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            snprintf(st.details, sizeof(st.details), "out of memory opening a call");
        }
        broken_locked(p, &st, "call failed to open");
        return;
    }
    if (p->stop || p->failed) {
        pthread_mutex_unlock(&p->mu);
        kp_rpc_stream_destroy(c);
        pthread_mutex_lock(&p->mu);
        return;
    }
    p->call = c;
    p->rx_call = c;
    p->call_done = false;
    p->call_half_closed = false;
    p->call_send_failed = false;
    p->send_next = p->head;
    p->st.calls++;
    if (p->had_break) {
        p->st.reconnects++;
    }
    if (pthread_create(&p->rx, NULL, rx_main, p) != 0) {
        p->call = NULL;
        pthread_mutex_unlock(&p->mu);
        kp_rpc_stream_destroy(c);
        pthread_mutex_lock(&p->mu);
        fail_locked(p, GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot start the receiver thread");
    }
}

/* The receiver has seen the call end: reap it, then decide. Called with mu held. */
static void end_call(struct kp_push *p)
{
    struct kp_rpc_stream *c = p->call;
    struct kp_rpc_status st;

    p->call = NULL; /* destroy no longer cancels it; nobody else touches it */
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->rx, NULL);
    kp_rpc_stream_destroy(c);
    pthread_mutex_lock(&p->mu);
    st = p->call_status;
    if (p->head >= p->send_next) {
        /* everything written on it was acknowledged: a clean end (a flush, or an idle
         * call that collectord closed) */
        p->attempt = 0;
        p->retry_at_ms = 0;
        pthread_cond_broadcast(&p->cond);
        return;
    }
    if (st.code == GRPC_STATUS_OK) {
        /* collectord ended the call OK with batches unacknowledged: not per protocol */
        st.code = GRPC_STATUS_UNKNOWN;
        snprintf(st.details, sizeof(st.details),
                 "collectord ended the call OK with %" PRIu64 " batches unacknowledged",
                 p->send_next - p->head);
    }
    broken_locked(p, &st, "call broken");
}

static void send_one(struct kp_push *p)
{
    struct slot *sl = &p->ring[p->send_next % p->cap];
    struct kp_rpc_stream *c = p->call;
    uint8_t *buf = sl->buf;
    size_t len = sl->len;
    int rc;

    p->send_next++;
    if (sl->acked) {
        return; /* acknowledged meanwhile (out of order): nothing to repeat */
    }
    if (sl->sent) {
        p->st.resent++;
    }
    sl->sent = true;
    p->st.sends++;
    p->in_send = buf;
    p->in_send_released = false;
    pthread_mutex_unlock(&p->mu);
    rc = kp_rpc_stream_send_bytes(c, buf, len);
    pthread_mutex_lock(&p->mu);
    p->in_send = NULL;
    if (p->in_send_released) {
        free(buf);
        p->in_send_released = false;
    }
    if (rc != 0) {
        /* The call is over; its status (maybe an error naming the batch) reaches the
         * receiver. Cancelling now could replace that status with CANCELLED. */
        p->call_send_failed = true;
    }
}

static void half_close(struct kp_push *p)
{
    struct kp_rpc_stream *c = p->call;

    p->call_half_closed = true;
    pthread_mutex_unlock(&p->mu);
    kp_rpc_stream_close_send(c);
    pthread_mutex_lock(&p->mu);
}

/* The next time the I/O thread must wake on its own, or -1. Called with mu held. */
static long long io_deadline(const struct kp_push *p)
{
    long long d = -1;

    if (p->head == p->next) {
        return -1;
    }
    if (p->call == NULL) {
        d = p->retry_at_ms;
    }
    if (p->give_up_ms > 0) {
        long long g = p->progress_ms + p->give_up_ms;

        d = d < 0 || g < d ? g : d;
    }
    return d;
}

static void *io_main(void *arg)
{
    struct kp_push *p = arg;

    pthread_mutex_lock(&p->mu);
    while (!p->stop && !p->failed) {
        long long now = kp_mono_ms();

        if (p->restored) {
            p->restored = false;
            p->had_break = false;
            pthread_mutex_unlock(&p->mu);
            kp_release(&p->complain, KP_LOG_MODULE, "ingest call restored stream=%" PRIu64,
                       p->stream_id);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        if (p->give_up_ms > 0 && p->head < p->next && now - p->progress_ms >= p->give_up_ms) {
            char why[sizeof(p->fail_status.details) + 64];

            if (p->last_status.code == GRPC_STATUS_OK) {
                /* no call broke: collectord took the call and never acknowledged (frozen,
                 * wedged); the call is cancelled below */
                snprintf(why, sizeof(why),
                         "no progress for %lld ms; %" PRIu64 " batches not acknowledged",
                         p->give_up_ms, p->next - p->head);
            }
            else {
                snprintf(why, sizeof(why), "no progress for %lld ms; last: %s %.400s",
                         p->give_up_ms, kp_rpc_status_name(p->last_status.code),
                         p->last_status.details);
            }
            fail_locked(p,
                        p->last_status.code != GRPC_STATUS_OK ? p->last_status.code
                                                              : GRPC_STATUS_DEADLINE_EXCEEDED,
                        why);
            break;
        }
        if (p->call == NULL) {
            if (p->head == p->next) {
                pthread_cond_wait(&p->cond, &p->mu);
            }
            else if (now < p->retry_at_ms) {
                cond_wait_until(p, io_deadline(p));
            }
            else {
                open_call(p);
            }
            continue;
        }
        if (p->call_done) {
            end_call(p);
            continue;
        }
        if (!p->call_send_failed && !p->call_half_closed && p->send_next < p->next) {
            send_one(p);
            continue;
        }
        if (p->flushing && !p->call_send_failed && !p->call_half_closed &&
            p->send_next == p->next) {
            half_close(p);
            continue;
        }
        cond_wait_until(p, io_deadline(p));
    }
    /* stopping or failed: tear the call down */
    if (p->call != NULL) {
        struct kp_rpc_stream *c = p->call;

        kp_rpc_stream_cancel(c);
        p->call = NULL;
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->rx, NULL);
        kp_rpc_stream_destroy(c);
        pthread_mutex_lock(&p->mu);
    }
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int kp_push_create(struct kp_rpc_channel *ch, uint64_t stream_id, const struct kp_push_opts *opts,
                   struct kp_push **out)
{
    struct kp_push_opts o;
    struct kp_push *p;
    pthread_condattr_t ca;
    int rc = -ENOMEM;

    *out = NULL;
    memset(&o, 0, sizeof(o));
    if (opts != NULL) {
        o = *opts;
    }
    if (ch == NULL || stream_id == 0 || stream_id > INT64_MAX || o.window > KP_PUSH_MAX_WINDOW ||
        o.reconnect_base_ms < 0 || o.reconnect_max_ms < 0 || o.give_up_after_ms < 0 ||
        o.first_seq > INT64_MAX / 2) {
        return -EINVAL;
    }
    if ((p = calloc(1, sizeof(*p))) == NULL) {
        return -ENOMEM;
    }
    p->ch = ch;
    p->stream_id = stream_id;
    p->cap = o.window ? o.window : KP_PUSH_DEFAULT_WINDOW;
    p->window_bytes = o.window_bytes ? o.window_bytes : KP_PUSH_DEFAULT_WINDOW_BYTES;
    p->base_ms = o.reconnect_base_ms ? o.reconnect_base_ms : KP_PUSH_DEFAULT_BACKOFF_MS;
    p->max_ms = o.reconnect_max_ms ? o.reconnect_max_ms : KP_PUSH_DEFAULT_RECONNECT_MAX;
    if (p->max_ms < p->base_ms) {
        p->max_ms = p->base_ms;
    }
    p->give_up_ms = o.give_up_after_ms;
    p->head = p->next = p->send_next = o.first_seq ? o.first_seq : 1;
    p->first_seq = p->head;
    p->rng = (stream_id * 0x9e3779b97f4a7c15ULL) ^ (uint64_t) kp_mono_ms() ^ 0x5deece66dULL;
    if (p->rng == 0) {
        p->rng = 1;
    }
    if ((p->ring = calloc(p->cap, sizeof(*p->ring))) == NULL) {
        goto fail;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        goto fail;
    }
    p->mu_init = true;
    if (pthread_condattr_init(&ca) != 0) {
        goto fail;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&p->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        rc = -ENOMEM;
        goto fail;
    }
    p->cond_init = true;
    if (pthread_create(&p->io, NULL, io_main, p) != 0) {
        rc = -EAGAIN;
        goto fail;
    }
    p->io_started = true;
    *out = p;
    return 0;
fail:
    kp_push_destroy(p);
    return rc;
}

/* Queues buf (taken) as seq. Called by the producer thread. */
static int enqueue(struct kp_push *p, uint8_t *buf, size_t len, uint64_t seq)
{
    struct slot *sl;

    pthread_mutex_lock(&p->mu);
    while (!p->failed && !p->stop &&
           (p->next - p->head >= p->cap ||
            (p->next > p->head && p->unacked_bytes + len > p->window_bytes))) {
        pthread_cond_wait(&p->cond, &p->mu);
    }
    if (p->failed || p->stop || p->next != seq) {
        pthread_mutex_unlock(&p->mu);
        free(buf);
        return KP_ERPC;
    }
    if (p->head == p->next) {
        p->progress_ms = kp_mono_ms(); /* the give-up clock starts with pending work */
    }
    sl = &p->ring[p->next % p->cap];
    sl->buf = buf;
    sl->len = len;
    sl->acked = false;
    sl->sent = false;
    p->next++;
    p->unacked_bytes += len;
    p->st.batches++;
    p->st.bytes += len;
    if (p->next - p->head > p->st.max_inflight) {
        p->st.max_inflight = (uint32_t) (p->next - p->head);
    }
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

/* The seq the next batch gets, or KP_ERPC if the push cannot take one. */
static int next_seq(struct kp_push *p, uint64_t *seq)
{
    int rc = 0;

    pthread_mutex_lock(&p->mu);
    if (p->failed || p->stop) {
        rc = KP_ERPC;
    }
    *seq = p->next; /* only the producer thread advances next */
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int kp_push_send(struct kp_push *p, Kprof__V1__Batch *b)
{
    uint64_t seq;
    uint8_t *buf;
    size_t len;
    int rc;

    if ((rc = next_seq(p, &seq)) != 0) {
        return rc;
    }
    b->stream = p->stream_id;
    b->seq = seq;
    len = kprof__v1__batch__get_packed_size(b);
    if ((buf = malloc(len ? len : 1)) == NULL) {
        return -ENOMEM;
    }
    kprof__v1__batch__pack(b, buf);
    return enqueue(p, buf, len, seq);
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;

    while (v >= 0x80) {
        p[n++] = (uint8_t) (v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t) v;
    return n;
}

int kp_push_send_encoded(struct kp_push *p, const void *src, size_t len, uint64_t *seq_out)
{
    uint64_t seq;
    uint8_t *buf;
    size_t n;
    int rc;

    if ((rc = next_seq(p, &seq)) != 0) {
        return rc;
    }
    /* two fields of tag + varint: at most 2 * (1 + 10) bytes */
    if (len > SIZE_MAX - 22 || (buf = malloc(len + 22)) == NULL) {
        return -ENOMEM;
    }
    memcpy(buf, src, len);
    n = len;
    buf[n++] = (3 << 3) | 0; /* Batch.stream, varint */
    n += put_varint(buf + n, p->stream_id);
    buf[n++] = (4 << 3) | 0; /* Batch.seq, varint */
    n += put_varint(buf + n, seq);
    if ((rc = enqueue(p, buf, n, seq)) == 0 && seq_out != NULL) {
        *seq_out = seq;
    }
    return rc;
}

int kp_push_flush(struct kp_push *p, long long timeout_ms)
{
    long long deadline = timeout_ms < 0 ? -1 : kp_mono_ms() + timeout_ms;
    int rc = 0;

    pthread_mutex_lock(&p->mu);
    p->flushing = true;
    pthread_cond_broadcast(&p->cond);
    while (!p->failed && !(p->head == p->next && p->call == NULL)) {
        if (cond_wait_until(p, deadline) == ETIMEDOUT) {
            if (!p->failed && !(p->head == p->next && p->call == NULL)) {
                rc = -ETIMEDOUT;
            }
            break;
        }
    }
    if (p->failed) {
        rc = p->failed;
    }
    p->flushing = false;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int kp_push_error(struct kp_push *p, struct kp_rpc_status *st)
{
    int rc;

    pthread_mutex_lock(&p->mu);
    rc = p->failed;
    if (rc != 0 && st != NULL) {
        *st = p->fail_status;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void kp_push_get_stats(struct kp_push *p, struct kp_push_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    out->inflight = (uint32_t) (p->next - p->head);
    pthread_mutex_unlock(&p->mu);
}

bool kp_push_mark(struct kp_push *p, Kprof__V1__StreamMark *out)
{
    pthread_mutex_lock(&p->mu);
    out->rank = -1;
    out->stream = p->stream_id;
    out->first_seq = p->first_seq;
    out->last_seq = p->next - 1;
    out->count = p->next - p->first_seq;
    pthread_mutex_unlock(&p->mu);
    return out->count > 0;
}

uint64_t kp_push_acked_through(struct kp_push *p)
{
    uint64_t head;

    pthread_mutex_lock(&p->mu);
    head = p->head; /* slots below head are acknowledged and released */
    pthread_mutex_unlock(&p->mu);
    return head;
}

void kp_push_destroy(struct kp_push *p)
{
    if (p == NULL) {
        return;
    }
    if (p->io_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        if (p->call != NULL) {
            kp_rpc_stream_cancel(p->call); /* wakes a send or receive blocked on it */
        }
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->io, NULL);
    }
    if (p->ring != NULL) {
        for (uint32_t i = 0; i < p->cap; i++) {
            free(p->ring[i].buf);
        }
        free(p->ring);
    }
    if (p->cond_init) {
        pthread_cond_destroy(&p->cond);
    }
    if (p->mu_init) {
        pthread_mutex_destroy(&p->mu);
    }
    free(p);
}
