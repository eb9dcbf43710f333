/*
 * Unit tests for common/kp_push against an in-process Ingest.Push server (kp_rpc on
 * 127.0.0.1:0) whose switches drop calls, hold acks, restart the server, or reject a batch.
 * The fake keeps a "stored" set that outlives calls and restarts (like PostgreSQL), so a
 * batch sent again after it was stored is acknowledged as a duplicate.
 */
#define _GNU_SOURCE /* pthread_timedjoin_np */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kp_err.h"
#include "kp_push.h"
#include "kp_rpc.h"
#include "kp_synth.h"
#include "kp_testutil.h"

#define MAX_SEQ   4096
#define MAX_CALLS 64

struct fake;

struct fcall {
    struct fake *f;
    struct kp_rpc_call *call;
    int index; /* into f->order */
    int n;     /* batches received on this call */
    bool half_closed, finished;
    uint64_t held[MAX_SEQ];
    bool held_dup[MAX_SEQ];
    int n_held;
};

struct fake {
    struct kp_rpc_server *srv;
    struct kp_rpc_method method;
    int port;
    pthread_mutex_t mu;
    /* switches */
    int drop_after;      /* finish UNAVAILABLE when a call gets its batch number n+1 */
    int drop_calls;      /* ... on this many calls */
    bool drop_stores;    /* ... after storing that batch (its ack is lost) */
    uint64_t reject_seq; /* finish with reject_code when this seq arrives */
    grpc_status_code reject_code;
    bool hold_acks; /* keep acks until fake_release */
    bool freeze;    /* like a collectord stopped with SIGSTOP: after the first batch, read
                     * nothing more and answer nothing (the connection stays up) */
    /* state */
    bool stored[MAX_SEQ];
    int n_stored, received, calls, dup_acks;
    uint64_t stream_seen;
    uint64_t order[MAX_CALLS][64]; /* first seqs received on each call */
    int n_order[MAX_CALLS];
    bool out_of_order;
    struct fcall *cur;
};

static void send_ack(struct kp_rpc_call *call, uint64_t stream, uint64_t seq, bool dup)
{
    Kprof__V1__Ack ack = KPROF__V1__ACK__INIT;
    Kprof__V1__BatchRef ref = KPROF__V1__BATCH_REF__INIT;
    Kprof__V1__BatchRef *refs[1] = { &ref };

    ref.run_id = 1;
    ref.stream = stream;
    ref.seq = seq;
    ref.duplicate = dup;
    ack.n_batches = 1;
    ack.batches = refs;
    kp_rpc_call_send(call, &ack.base);
}

static void *f_open(struct kp_rpc_call *call, void *ud)
{
    struct fake *f = ud;
    struct fcall *c = calloc(1, sizeof(*c));

    assert_non_null(c);
    pthread_mutex_lock(&f->mu);
    c->f = f;
    c->call = call;
    c->index = f->calls < MAX_CALLS ? f->calls : MAX_CALLS - 1;
    f->calls++;
    f->cur = c;
    pthread_mutex_unlock(&f->mu);
    return c;
}

static enum kp_rpc_next f_message(struct kp_rpc_call *call, ProtobufCMessage *msg, size_t wire,
                                  void *state)
{
    struct fcall *c = state;
    struct fake *f = c->f;
    Kprof__V1__Batch *b = (Kprof__V1__Batch *) msg;
    enum kp_rpc_next next = KP_RPC_CONTINUE;
    uint64_t seq = b->seq;
    bool dup;

    (void) wire;
    pthread_mutex_lock(&f->mu);
    f->received++;
    f->stream_seen = b->stream;
    if (c->n > 0 && c->n <= 64 && f->order[c->index][c->n - 1] + 1 != seq) {
        f->out_of_order = true;
    }
    if (c->n < 64) {
        f->order[c->index][c->n] = seq;
        f->n_order[c->index] = c->n + 1;
    }
    c->n++;
    if (seq == 0 || seq >= MAX_SEQ) {
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, "seq out of the test's range");
        next = KP_RPC_STOP;
        goto out;
    }
    if (f->reject_seq != 0 && seq == f->reject_seq) {
        kp_rpc_call_finish(call, f->reject_code, "test: batch rejected: strings[3] is bad");
        next = KP_RPC_STOP;
        goto out;
    }
    if (f->drop_calls > 0 && c->n > f->drop_after) {
        f->drop_calls--;
        if (f->drop_stores && !f->stored[seq]) {
            f->stored[seq] = true;
            f->n_stored++;
        }
        kp_rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, "test: connection dropped");
        next = KP_RPC_STOP;
        goto out;
    }
    dup = f->stored[seq];
    if (!dup) {
        f->stored[seq] = true;
        f->n_stored++;
    }
    else {
        f->dup_acks++;
    }
    if (f->freeze) {
        next = KP_RPC_PAUSE; /* never resumed: HTTP/2 flow control stops the sender */
    }
    else if (f->hold_acks) {
        c->held[c->n_held] = seq;
        c->held_dup[c->n_held] = dup;
        c->n_held++;
    }
    else {
        send_ack(call, b->stream, seq, dup);
    }
out:
    pthread_mutex_unlock(&f->mu);
    protobuf_c_message_free_unpacked(msg, NULL);
    return next;
}

static void f_half_close(struct kp_rpc_call *call, void *state)
{
    struct fcall *c = state;

    pthread_mutex_lock(&c->f->mu);
    c->half_closed = true;
    if (c->n_held == 0) {
        c->finished = true;
        kp_rpc_call_finish(call, GRPC_STATUS_OK, "");
    }
    pthread_mutex_unlock(&c->f->mu);
}

static void f_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    struct fcall *c = state;

    (void) call;
    (void) cancelled;
    pthread_mutex_lock(&c->f->mu);
    if (c->f->cur == c) {
        c->f->cur = NULL;
    }
    pthread_mutex_unlock(&c->f->mu);
    free(c);
}

/* Sends the held acks of the current call and stops holding. */
static void fake_release(struct fake *f)
{
    pthread_mutex_lock(&f->mu);
    f->hold_acks = false;
    if (f->cur != NULL) {
        struct fcall *c = f->cur;

        for (int i = 0; i < c->n_held; i++) {
            send_ack(c->call, f->stream_seen, c->held[i], c->held_dup[i]);
        }
        c->n_held = 0;
        if (c->half_closed && !c->finished) {
            c->finished = true;
            kp_rpc_call_finish(c->call, GRPC_STATUS_OK, "");
        }
    }
    pthread_mutex_unlock(&f->mu);
}

static void fake_start(struct fake *f, int port, bool with_push)
{
    struct kp_rpc_server_opts so;
    char listen[64], err[256];

    memset(&so, 0, sizeof(so));
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    so.listen = listen;
    so.name = "fake-collectord";
    f->method.path = KP_PUSH_PATH;
    f->method.kind = KP_RPC_STREAM;
    f->method.request = &kprof__v1__batch__descriptor;
    f->method.on_open = f_open;
    f->method.on_message = f_message;
    f->method.on_half_close = f_half_close;
    f->method.on_close = f_close;
    f->method.ud = f;
    err[0] = '\0';
    if (kp_rpc_server_create(&so, &f->method, with_push ? 1 : 0, &f->srv, err, sizeof(err)) != 0) {
        fail_msg("fake server on %s: %s", listen, err);
    }
    f->port = kp_rpc_server_port(f->srv);
}

static struct fake *fake_new(void)
{
    struct fake *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    fake_start(f, 0, true);
    return f;
}

static void fake_stop(struct fake *f)
{
    kp_rpc_server_destroy(f->srv);
    f->srv = NULL;
}

static void fake_free(struct fake *f)
{
    if (f->srv != NULL) {
        fake_stop(f);
    }
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static int fake_get(struct fake *f, const int *field)
{
    int v;

    pthread_mutex_lock(&f->mu);
    v = *field;
    pthread_mutex_unlock(&f->mu);
    return v;
}

static struct kp_rpc_channel *channel_to(int port)
{
    struct kp_rpc_channel *ch;
    char target[64], err[256];

    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    assert_int_equal(kp_rpc_channel_create(target, NULL, &ch, err, sizeof(err)), 0);
    return ch;
}

static struct kp_push_opts test_opts(uint32_t window)
{
    struct kp_push_opts o;

    memset(&o, 0, sizeof(o));
    o.window = window;
    o.reconnect_base_ms = 5;
    o.reconnect_max_ms = 50;
    o.give_up_after_ms = 20000;
    return o;
}

/* A tiny valid batch: one step row. */
struct tiny {
    Kprof__V1__Batch b;
    Kprof__V1__Steps steps;
    int64_t step, start, dur_unused;
    uint64_t dur;
    char *strings[1];
};

static void tiny_init(struct tiny *t, int64_t step)
{
    kprof__v1__batch__init(&t->b);
    kprof__v1__steps__init(&t->steps);
    t->step = step;
    t->start = 1000 * step;
    t->dur = 900;
    t->steps.n_step = 1;
    t->steps.step = &t->step;
    t->steps.n_start_ns = 1;
    t->steps.start_ns = &t->start;
    t->steps.n_dur_ns = 1;
    t->steps.dur_ns = &t->dur;
    t->strings[0] = (char *) "";
    t->b.n_strings = 1;
    t->b.strings = t->strings;
    t->b.run_id = 1;
    t->b.base_ns = 1700000000000000000LL;
    t->b.steps = &t->steps;
}

static void send_tiny(struct kp_push *p, int n, int from)
{
    struct tiny t;

    for (int i = 0; i < n; i++) {
        tiny_init(&t, from + i);
        assert_int_equal(kp_push_send(p, &t.b), 0);
    }
}

static void check_stored(struct fake *f, uint64_t from, uint64_t to)
{
    pthread_mutex_lock(&f->mu);
    for (uint64_t s = from; s <= to; s++) {
        if (!f->stored[s]) {
            pthread_mutex_unlock(&f->mu);
            fail_msg("seq %llu was never stored", (unsigned long long) s);
        }
    }
    assert_false(f->out_of_order);
    pthread_mutex_unlock(&f->mu);
}

/* Every batch acked once; the call ends cleanly on flush; seqs 1..n in order. */
static void test_all_acked(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(8);
    struct kp_synth_opts so;
    struct kp_synth *syn;
    struct kp_push_stats st;
    struct kp_push *p;
    Kprof__V1__Batch *b;
    int n = 0;

    (void) state;
    memset(&so, 0, sizeof(so));
    so.world_size = 2;
    so.n_steps = 60;
    so.kernels_per_step = 20;
    so.batch_rows = 200;
    so.run_id = 1;
    assert_int_equal(kp_synth_create(&so, &syn), 0);
    assert_int_equal(kp_push_create(ch, 77, &o, &p), 0);
    while (kp_synth_next(syn, &b) == 1) {
        assert_int_equal(kp_push_send(p, b), 0);
        assert_int_equal(b->stream, 77);
        assert_int_equal(b->seq, (uint64_t) n + 1);
        n++;
    }
    assert_true(n > 20);
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(10000)), 0);
    kp_push_get_stats(p, &st);
    assert_int_equal(st.batches, n);
    assert_int_equal(st.acked, n);
    assert_int_equal(st.duplicates, 0);
    assert_int_equal(st.resent, 0);
    assert_int_equal(st.reconnects, 0);
    assert_int_equal(st.calls, 1);
    assert_int_equal(st.inflight, 0);
    assert_true(st.max_inflight <= 8);
    assert_int_equal(kp_push_error(p, NULL), 0);
    assert_int_equal(fake_get(f, &f->n_stored), n);
    assert_int_equal(f->stream_seen, 77);
    check_stored(f, 1, (uint64_t) n);
    /* a send after the flush opens a new call */
    send_tiny(p, 3, 1000);
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(10000)), 0);
    kp_push_get_stats(p, &st);
    assert_int_equal(st.acked, n + 3);
    assert_int_equal(st.calls, 2);
    assert_int_equal(st.reconnects, 0);
    /* flush with nothing pending returns at once */
    assert_int_equal(kp_push_flush(p, 0), 0);
    kp_push_destroy(p);
    kp_synth_destroy(syn);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* Calls dropped with UNAVAILABLE mid-stream: the producer reconnects and resends in order;
 * a batch stored before its ack was lost comes back as a duplicate. */
static void test_resend_after_break(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(8);
    struct kp_push_stats st;
    struct kp_push *p;

    (void) state;
    f->drop_after = 5;
    f->drop_calls = 3;
    f->drop_stores = true;
    assert_int_equal(kp_push_create(ch, 5, &o, &p), 0);
    send_tiny(p, 40, 0);
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(20000)), 0);
    kp_push_get_stats(p, &st);
    assert_int_equal(st.batches, 40);
    assert_int_equal(st.acked, 40); /* each exactly once */
    assert_int_equal(st.reconnects, 3);
    assert_int_equal(st.calls, 4);
    assert_true(st.resent >= 3);
    assert_int_equal(st.duplicates, 3); /* the three stored-but-unacked batches */
    assert_int_equal(st.duplicates, (uint64_t) fake_get(f, &f->dup_acks));
    assert_int_equal(fake_get(f, &f->n_stored), 40);
    check_stored(f, 1, 40);
    /* each new call starts at the oldest unacknowledged batch */
    pthread_mutex_lock(&f->mu);
    for (int c = 1; c < 4; c++) {
        assert_true(f->n_order[c] > 0);
        assert_int_equal(f->order[c][0], f->order[c - 1][f->n_order[c - 1] - 1]);
    }
    pthread_mutex_unlock(&f->mu);
    kp_push_destroy(p);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

struct waitarg {
    struct kp_push *p;
    struct fake *f;
    uint64_t n;
};

static bool acked_at_least(void *arg)
{
    struct waitarg *w = arg;
    struct kp_push_stats st;

    kp_push_get_stats(w->p, &st);
    return st.acked >= w->n;
}

static bool received_at_least(void *arg)
{
    struct waitarg *w = arg;

    return (uint64_t) fake_get(w->f, &w->f->received) >= w->n;
}

/* collectord goes away (server destroyed: calls cancelled) and comes back on the same
 * port: everything unacknowledged is sent again; what was stored returns as duplicates. */
static void test_server_restart(void **state)
{
    struct fake *f = fake_new();
    int port = f->port;
    struct kp_rpc_channel *ch = channel_to(port);
    struct kp_push_opts o = test_opts(32);
    struct kp_push_stats st;
    struct waitarg w;
    struct kp_push *p;

    (void) state;
    assert_int_equal(kp_push_create(ch, 9, &o, &p), 0);
    send_tiny(p, 10, 0);
    w.p = p;
    w.f = f;
    w.n = 10;
    assert_true(kp_test_wait_for(acked_at_least, &w, 10000));
    /* 10 more are stored but their acks held when the server dies */
    pthread_mutex_lock(&f->mu);
    f->hold_acks = true;
    pthread_mutex_unlock(&f->mu);
    send_tiny(p, 10, 10);
    w.n = 20;
    assert_true(kp_test_wait_for(received_at_least, &w, 10000));
    fake_stop(f);
    send_tiny(p, 5, 20); /* queued while nobody listens */
    pthread_mutex_lock(&f->mu);
    f->hold_acks = false;
    pthread_mutex_unlock(&f->mu);
    fake_start(f, port, true);
    assert_int_equal(f->port, port);
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(20000)), 0);
    kp_push_get_stats(p, &st);
    assert_int_equal(st.acked, 25);
    assert_int_equal(st.duplicates, 10);
    assert_true(st.reconnects >= 1);
    assert_true(st.resent >= 10);
    assert_int_equal(fake_get(f, &f->n_stored), 25);
    check_stored(f, 1, 25);
    kp_push_destroy(p);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

static bool failed(void *arg)
{
    return kp_push_error(arg, NULL) != 0;
}

/* A terminal status fails the push at once: no second call, the status reaches the caller. */
static void check_terminal(grpc_status_code code, bool unimplemented)
{
    struct fake *f = calloc(1, sizeof(*f));
    struct kp_rpc_channel *ch;
    struct kp_push_opts o = test_opts(4);
    struct kp_rpc_status st;
    struct kp_push_stats ps;
    struct kp_push *p;
    struct tiny t;
    int rc = 0;

    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    fake_start(f, 0, !unimplemented);
    ch = channel_to(f->port);
    f->reject_seq = 3;
    f->reject_code = code;
    assert_int_equal(kp_push_create(ch, 11, &o, &p), 0);
    for (int i = 0; i < 50 && rc == 0; i++) {
        tiny_init(&t, i);
        rc = kp_push_send(p, &t.b);
    }
    assert_true(kp_test_wait_for(failed, p, 10000));
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(5000)), KP_ERPC);
    tiny_init(&t, 99);
    assert_int_equal(kp_push_send(p, &t.b), KP_ERPC);
    memset(&st, 0, sizeof(st));
    assert_int_equal(kp_push_error(p, &st), KP_ERPC);
    assert_int_equal(st.code, unimplemented ? GRPC_STATUS_UNIMPLEMENTED : code);
    if (!unimplemented) {
        assert_non_null(strstr(st.details, "strings[3] is bad"));
    }
    kp_push_get_stats(p, &ps);
    assert_int_equal(ps.calls, 1);
    assert_int_equal(ps.reconnects, 0);
    assert_int_equal(fake_get(f, &f->calls), unimplemented ? 0 : 1);
    kp_push_destroy(p);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

static void test_terminal_statuses(void **state)
{
    (void) state;
    check_terminal(GRPC_STATUS_INVALID_ARGUMENT, false);
    check_terminal(GRPC_STATUS_NOT_FOUND, false);
    check_terminal(GRPC_STATUS_RESOURCE_EXHAUSTED, false);
    check_terminal(GRPC_STATUS_PERMISSION_DENIED, false);
    check_terminal(GRPC_STATUS_UNIMPLEMENTED, true); /* a server without Ingest.Push */
}

struct producer {
    struct kp_push *p;
    int n;
    int rc;
    pthread_mutex_t mu;
    bool done;
};

static void *produce(void *arg)
{
    struct producer *pr = arg;
    struct tiny t;
    int rc = 0;

    for (int i = 0; i < pr->n && rc == 0; i++) {
        tiny_init(&t, i);
        rc = kp_push_send(pr->p, &t.b);
    }
    pthread_mutex_lock(&pr->mu);
    pr->rc = rc;
    pr->done = true;
    pthread_mutex_unlock(&pr->mu);
    return NULL;
}

static bool producer_done(void *arg)
{
    struct producer *pr = arg;
    bool d;

    pthread_mutex_lock(&pr->mu);
    d = pr->done;
    pthread_mutex_unlock(&pr->mu);
    return d;
}

static bool received_more(void *arg)
{
    struct waitarg *w = arg;

    return (uint64_t) fake_get(w->f, &w->f->received) > w->n;
}

/* With acks held, exactly `window` batches go out and send blocks; releasing the acks lets
 * the producer finish. */
static void test_window_bound(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(4);
    struct kp_push_stats st;
    struct producer pr;
    struct waitarg w;
    pthread_t th;

    (void) state;
    f->hold_acks = true;
    memset(&pr, 0, sizeof(pr));
    pthread_mutex_init(&pr.mu, NULL);
    pr.n = 20;
    assert_int_equal(kp_push_create(ch, 3, &o, &pr.p), 0);
    assert_int_equal(pthread_create(&th, NULL, produce, &pr), 0);
    w.p = pr.p;
    w.f = f;
    w.n = 4;
    assert_true(kp_test_wait_for(received_at_least, &w, 10000));
    /* a bounded look for what must not happen: a fifth batch, or the producer finishing */
    assert_false(kp_test_wait_for(received_more, &w, 200));
    assert_false(producer_done(&pr));
    kp_push_get_stats(pr.p, &st);
    assert_int_equal(st.batches, 4);
    assert_int_equal(st.inflight, 4);
    fake_release(f);
    assert_true(kp_test_wait_for(producer_done, &pr, 10000));
    pthread_join(th, NULL);
    assert_int_equal(pr.rc, 0);
    assert_int_equal(kp_push_flush(pr.p, kp_test_scaled_ms(10000)), 0);
    kp_push_get_stats(pr.p, &st);
    assert_int_equal(st.acked, 20);
    assert_int_equal(st.max_inflight, 4);
    kp_push_destroy(pr.p);
    pthread_mutex_destroy(&pr.mu);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* Pre-encoded batches get the push's stream and seq appended. */
static void test_send_encoded(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(4);
    struct kp_push_stats st;
    struct kp_push *p;
    struct tiny t;
    uint8_t buf[256];
    uint64_t seq = 0;
    size_t len;

    (void) state;
    o.first_seq = 500;
    assert_int_equal(kp_push_create(ch, 123456789012345ULL, &o, &p), 0);
    tiny_init(&t, 1);
    t.b.stream = 1; /* overridden by the appended fields */
    t.b.seq = 1;
    len = kprof__v1__batch__pack(&t.b, buf);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kp_push_send_encoded(p, buf, len, &seq), 0);
        assert_int_equal(seq, 500 + (uint64_t) i);
    }
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(10000)), 0);
    kp_push_get_stats(p, &st);
    assert_int_equal(st.acked, 3);
    assert_int_equal(f->stream_seen, 123456789012345ULL);
    check_stored(f, 500, 502);
    assert_int_equal(fake_get(f, &f->n_stored), 3);
    kp_push_destroy(p);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

static bool acked_through_13(void *arg)
{
    return kp_push_acked_through(arg) == 13;
}

/* kp_push_acked_through: stays at first_seq while acks are held, then reaches the end. */
static void test_acked_through(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(8);
    struct kp_push *p;
    struct waitarg w;

    (void) state;
    f->hold_acks = true;
    o.first_seq = 10;
    assert_int_equal(kp_push_create(ch, 77, &o, &p), 0);
    assert_int_equal(kp_push_acked_through(p), 10);
    send_tiny(p, 3, 0);
    w.p = p;
    w.f = f;
    w.n = 3;
    assert_true(kp_test_wait_for(received_at_least, &w, 10000));
    assert_int_equal(kp_push_acked_through(p), 10); /* sent, not acknowledged */
    fake_release(f);
    assert_true(kp_test_wait_for(acked_through_13, p, 10000));
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(10000)), 0);
    assert_int_equal(kp_push_acked_through(p), 13);
    kp_push_destroy(p);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* Nobody listens: the push gives up after give_up_after_ms with UNAVAILABLE. */
static void test_give_up(void **state)
{
    struct fake *f = fake_new();
    int port = f->port;
    struct kp_rpc_channel *ch;
    struct kp_push_opts o = test_opts(4);
    struct kp_rpc_status st;
    struct kp_push *p;

    (void) state;
    fake_free(f); /* the port is free now */
    ch = channel_to(port);
    o.give_up_after_ms = 300;
    assert_int_equal(kp_push_create(ch, 1, &o, &p), 0);
    send_tiny(p, 2, 0);
    assert_int_equal(kp_push_flush(p, kp_test_scaled_ms(10000)), KP_ERPC);
    memset(&st, 0, sizeof(st));
    assert_int_equal(kp_push_error(p, &st), KP_ERPC);
    assert_int_equal(st.code, GRPC_STATUS_UNAVAILABLE);
    assert_non_null(strstr(st.details, "no progress"));
    kp_push_destroy(p);
    kp_rpc_channel_destroy(ch);
}

/* Destroy without flush while the call is stalled (acks held, window full, producer
 * blocked is not possible from this thread, so: batches in flight) returns promptly. */
static void test_destroy_in_flight(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(8);
    struct kp_push *p;
    struct waitarg w;

    (void) state;
    f->hold_acks = true;
    assert_int_equal(kp_push_create(ch, 2, &o, &p), 0);
    send_tiny(p, 8, 0);
    w.p = p;
    w.f = f;
    w.n = 8;
    assert_true(kp_test_wait_for(received_at_least, &w, 10000));
    kp_push_destroy(p);
    kp_push_destroy(NULL);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* A batch of about 256 KiB (one long string), so that a few fill HTTP/2's windows. */
static void send_big(struct kp_push *p, int n)
{
    static char big[256 * 1024];
    struct tiny t;

    memset(big, 'x', sizeof(big) - 1);
    for (int i = 0; i < n; i++) {
        tiny_init(&t, i);
        t.strings[0] = big;
        assert_int_equal(kp_push_send(p, &t.b), 0);
    }
}

static void *destroy_main(void *arg)
{
    kp_push_destroy(arg);
    return NULL;
}

/* kp_push_destroy(p) must return within ms; fails the test (leaking p) if it does not. */
static void destroy_within(struct kp_push *p, long long ms)
{
    pthread_t th;
    struct timespec ts;

    assert_int_equal(pthread_create(&th, NULL, destroy_main, p), 0);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000 + 1;
    if (pthread_timedjoin_np(th, NULL, &ts) != 0) {
        pthread_detach(th);
        fail_msg("kp_push_destroy still blocked after %lld ms on a frozen collectord", ms);
    }
}

/* A collectord that is frozen (SIGSTOP) mid-stream reads and acknowledges nothing while the
 * connection stays up: the I/O thread blocks in a send the transport never takes. The push
 * still gives up after give_up_after_ms, cancels the call and can be destroyed. */
static void test_give_up_frozen(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(64);
    struct kp_push_stats ps;
    struct kp_rpc_status st;
    struct kp_push *p;
    struct waitarg w;

    (void) state;
    f->freeze = true;
    o.give_up_after_ms = 500;
    assert_int_equal(kp_push_create(ch, 4, &o, &p), 0);
    send_big(p, 64); /* 16 MiB: far more than the windows let through */
    w.p = p;
    w.f = f;
    w.n = 1;
    assert_true(kp_test_wait_for(received_at_least, &w, 10000));
    assert_true(kp_test_wait_for(failed, p, 10000));
    memset(&st, 0, sizeof(st));
    assert_int_equal(kp_push_error(p, &st), KP_ERPC);
    assert_int_equal(st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(st.details, "no progress for 500 ms"));
    kp_push_get_stats(p, &ps);
    assert_int_equal(ps.acked, 0);
    assert_true(fake_get(f, &f->received) < 64); /* it was frozen, not slow */
    destroy_within(p, kp_test_scaled_ms(10000));
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* The agent's uplink retries forever (give_up_after_ms 0): on a frozen collectord its push
 * waits, and destroying it (the agent stopping) still returns at once. */
static void test_destroy_frozen(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_push_opts o = test_opts(64);
    struct kp_push_stats ps;
    struct kp_push *p;
    struct waitarg w;

    (void) state;
    f->freeze = true;
    o.give_up_after_ms = 0;
    assert_int_equal(kp_push_create(ch, 5, &o, &p), 0);
    send_big(p, 64);
    w.p = p;
    w.f = f;
    w.n = 1;
    assert_true(kp_test_wait_for(received_at_least, &w, 10000));
    /* a bounded look for what must not happen: a push that retries forever failing */
    assert_false(kp_test_wait_for(failed, p, 1000));
    kp_push_get_stats(p, &ps);
    assert_int_equal(ps.acked, 0);
    destroy_within(p, kp_test_scaled_ms(10000));
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* A port where the kernel completes TCP handshakes but nobody ever reads or answers (a
 * collectord frozen before it accepted): returns the listening socket, *port its port. */
static int silent_listener(int *port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *) &a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *) &a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Frozen before the call opened: the HTTP/2 handshake never completes, the call never
 * opens; the push gives up all the same and is destroyed at once. */
static void test_give_up_silent(void **state)
{
    int port, fd = silent_listener(&port);
    struct kp_rpc_channel *ch = channel_to(port);
    struct kp_push_opts o = test_opts(4);
    struct kp_rpc_status st;
    struct kp_push *p;

    (void) state;
    o.give_up_after_ms = 300;
    assert_int_equal(kp_push_create(ch, 6, &o, &p), 0);
    send_tiny(p, 2, 0);
    assert_true(kp_test_wait_for(failed, p, 10000));
    memset(&st, 0, sizeof(st));
    assert_int_equal(kp_push_error(p, &st), KP_ERPC);
    assert_non_null(strstr(st.details, "no progress for 300 ms"));
    destroy_within(p, kp_test_scaled_ms(10000));
    kp_rpc_channel_destroy(ch);
    close(fd);
}

static void test_bad_args(void **state)
{
    struct kp_rpc_channel *ch = channel_to(1);
    struct kp_push_opts o = test_opts(4);
    struct kp_push *p = NULL;

    (void) state;
    assert_int_equal(kp_push_create(ch, 0, &o, &p), -EINVAL);
    assert_int_equal(kp_push_create(ch, (uint64_t) INT64_MAX + 1, &o, &p), -EINVAL);
    o.window = KP_PUSH_MAX_WINDOW + 1;
    assert_int_equal(kp_push_create(ch, 1, &o, &p), -EINVAL);
    assert_null(p);
    assert_int_equal(kp_push_create(ch, 1, NULL, &p), 0); /* defaults */
    kp_push_destroy(p);
    kp_rpc_channel_destroy(ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_acked),      cmocka_unit_test(test_resend_after_break),
        cmocka_unit_test(test_server_restart), cmocka_unit_test(test_terminal_statuses),
        cmocka_unit_test(test_window_bound),   cmocka_unit_test(test_send_encoded),
        cmocka_unit_test(test_give_up),        cmocka_unit_test(test_destroy_in_flight),
        cmocka_unit_test(test_bad_args),       cmocka_unit_test(test_acked_through),
        cmocka_unit_test(test_give_up_frozen), cmocka_unit_test(test_destroy_frozen),
        cmocka_unit_test(test_give_up_silent),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
