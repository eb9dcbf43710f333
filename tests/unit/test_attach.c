/*
 * Unit tests for agent/attach (kp_attach) against an in-process Control.Attach server
 * (kp_rpc on 127.0.0.1:0) that records the reports it receives and sends the commands the
 * test asks for: the report after connect, heartbeats, prompt new snapshots, commands in
 * order with a wake-up on the eventfd, reconnects after the server goes away and comes back,
 * the bounded command queue, and prompt shutdown while collectord is down.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "attach.h"
#include "kp_clock.h"
#include "kp_rpc.h"
#include "kp_testutil.h"

struct fake {
    struct kp_rpc_server *srv;
    struct kp_rpc_method method;
    int port;
    pthread_mutex_t mu;
    struct kp_rpc_call *cur; /* the open call (cleared by on_close, under mu) */
    int calls, reports, bad_reports;
    char last_host[64];
    uint64_t last_agent_id;
};

static void *f_open(struct kp_rpc_call *call, void *ud)
{
    struct fake *f = ud;

    pthread_mutex_lock(&f->mu);
    f->calls++;
    f->cur = call;
    pthread_mutex_unlock(&f->mu);
    return f;
}

static enum kp_rpc_next f_message(struct kp_rpc_call *call, ProtobufCMessage *msg, size_t wire,
                                  void *state)
{
    struct fake *f = state;
    Kprof__V1__AgentReport *r = (Kprof__V1__AgentReport *) msg;

    (void) call;
    (void) wire;
    pthread_mutex_lock(&f->mu);
    if (r->host == NULL) {
        f->bad_reports++;
    }
    else {
        snprintf(f->last_host, sizeof(f->last_host), "%s", r->host);
    }
    f->last_agent_id = r->agent_id;
    f->reports++;
    pthread_mutex_unlock(&f->mu);
    protobuf_c_message_free_unpacked(msg, NULL);
    return KP_RPC_CONTINUE;
}

static void f_half_close(struct kp_rpc_call *call, void *state)
{
    (void) state;
    kp_rpc_call_finish(call, GRPC_STATUS_OK, "");
}

static void f_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    struct fake *f = state;

    (void) cancelled;
    pthread_mutex_lock(&f->mu);
    if (f->cur == call) {
        f->cur = NULL;
    }
    pthread_mutex_unlock(&f->mu);
}

static void fake_start(struct fake *f, int port)
{
    struct kp_rpc_server_opts so;
    char listen[64], err[256];

    memset(&so, 0, sizeof(so));
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    so.listen = listen;
    so.name = "fake-collectord";
    f->method.path = KP_ATTACH_PATH;
    f->method.kind = KP_RPC_STREAM;
    f->method.request = &kprof__v1__agent_report__descriptor;
    f->method.on_open = f_open;
    f->method.on_message = f_message;
    f->method.on_half_close = f_half_close;
    f->method.on_close = f_close;
    f->method.ud = f;
    err[0] = '\0';
    if (kp_rpc_server_create(&so, &f->method, 1, &f->srv, err, sizeof(err)) != 0) {
        fail_msg("fake server on %s: %s", listen, err);
    }
    f->port = kp_rpc_server_port(f->srv);
}

static struct fake *fake_new(void)
{
    struct fake *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    fake_start(f, 0);
    return f;
}

static void fake_stop(struct fake *f)
{
    kp_rpc_server_destroy(f->srv); /* cancels the live call (on_close clears cur) */
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

/* Sends a command on the live call. Returns 0, or -ENOTCONN if no call is open. */
static int fake_send(struct fake *f, Kprof__V1__CaptureCommand__Kind kind, uint64_t run_id)
{
    Kprof__V1__CaptureCommand cmd = KPROF__V1__CAPTURE_COMMAND__INIT;
    int32_t ranks[2] = { 0, 3 };
    int rc = -ENOTCONN;

    cmd.kind = kind;
    cmd.run_id = run_id;
    cmd.job = (char *) "train";
    cmd.n_ranks = 2;
    cmd.ranks = ranks;
    cmd.start_step = 100;
    cmd.steps = 5;
    pthread_mutex_lock(&f->mu);
    if (f->cur != NULL) {
        rc = kp_rpc_call_send(f->cur, &cmd.base);
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static struct kp_rpc_channel *channel_to(int port)
{
    struct kp_rpc_channel *ch;
    char target[64], err[256];

    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    assert_int_equal(kp_rpc_channel_create(target, NULL, &ch, err, sizeof(err)), 0);
    return ch;
}

static struct kp_attach_opts test_opts(struct kp_rpc_channel *ch, int wake_fd)
{
    struct kp_attach_opts o;

    memset(&o, 0, sizeof(o));
    o.ch = ch;
    o.target = "fake-collectord";
    o.wake_fd = wake_fd;
    o.reconnect_base_ms = 20;
    o.reconnect_max_ms = 200;
    return o;
}

static void publish_host(struct kp_attach *att, const char *host, uint64_t agent_id)
{
    Kprof__V1__AgentReport r = KPROF__V1__AGENT_REPORT__INIT;
    uint8_t buf[256];
    size_t n;

    r.host = (char *) host;
    r.agent_id = agent_id;
    r.version = (char *) "test";
    n = kprof__v1__agent_report__pack(&r, buf);
    assert_int_equal(kp_attach_publish(att, buf, n), 0);
}

struct waitarg {
    struct fake *f;
    struct kp_attach *att;
    int n;
    const char *host;
};

static bool reports_at_least(void *arg)
{
    struct waitarg *w = arg;

    return fake_get(w->f, &w->f->reports) >= w->n;
}

static bool host_seen(void *arg)
{
    struct waitarg *w = arg;
    bool ok;

    pthread_mutex_lock(&w->f->mu);
    ok = strcmp(w->f->last_host, w->host) == 0;
    pthread_mutex_unlock(&w->f->mu);
    return ok;
}

static bool calls_at_least(void *arg)
{
    struct waitarg *w = arg;
    bool ok;

    pthread_mutex_lock(&w->f->mu);
    ok = w->f->calls >= w->n && w->f->cur != NULL;
    pthread_mutex_unlock(&w->f->mu);
    return ok;
}

static bool attached(void *arg)
{
    struct waitarg *w = arg;
    struct kp_attach_stats st;

    kp_attach_get_stats(w->att, &st);
    return st.attached && st.attaches >= (uint64_t) w->n;
}

static bool received_at_least(void *arg)
{
    struct waitarg *w = arg;
    struct kp_attach_stats st;

    kp_attach_get_stats(w->att, &st);
    return st.commands_received >= (uint64_t) w->n;
}

/* A report arrives right after connect; heartbeats follow about once a second with nothing
 * new; the call counts as attached. */
static void test_report_and_heartbeat(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_attach_opts o = test_opts(ch, -1);
    struct kp_attach_stats st;
    struct kp_attach *att;
    struct waitarg w = { f, NULL, 1, "node-a" };
    long long t0;

    (void) state;
    assert_int_equal(kp_attach_create(&o, &att), 0);
    w.att = att;
    publish_host(att, "node-a", 42);
    assert_true(kp_test_wait_for(host_seen, &w, 5000));
    pthread_mutex_lock(&f->mu);
    assert_int_equal(f->last_agent_id, 42);
    assert_int_equal(f->bad_reports, 0);
    pthread_mutex_unlock(&f->mu);
    assert_true(kp_test_wait_for(attached, &w, 5000));
    /* heartbeats: three more reports with nothing published, within generous bounds */
    t0 = kp_mono_ms();
    w.n = fake_get(f, &f->reports) + 3;
    assert_true(kp_test_wait_for(reports_at_least, &w, 6000));
    assert_true(kp_mono_ms() - t0 >= 1500); /* not a busy loop: about one a second */
    kp_attach_get_stats(att, &st);
    assert_int_equal(st.attaches, 1);
    assert_int_equal(fake_get(f, &f->calls), 1);
    assert_true(st.reports_sent >= 4);
    kp_attach_destroy(att);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* A new snapshot goes out long before the next heartbeat would. */
static void test_new_snapshot_prompt(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_attach_opts o = test_opts(ch, -1);
    struct kp_attach *att;
    struct waitarg w = { f, NULL, 1, "one" };

    (void) state;
    o.heartbeat_ms = 600000; /* only new snapshots are sent in this test */
    assert_int_equal(kp_attach_create(&o, &att), 0);
    w.att = att;
    publish_host(att, "one", 1);
    assert_true(kp_test_wait_for(host_seen, &w, 5000));
    for (int i = 0; i < 5; i++) {
        char host[16];

        snprintf(host, sizeof(host), "snap-%d", i);
        w.host = host;
        publish_host(att, host, 1);
        assert_true(kp_test_wait_for(host_seen, &w, 2000));
    }
    /* several publishes between two sends: only the newest counts */
    publish_host(att, "skipped-1", 1);
    publish_host(att, "skipped-2", 1);
    publish_host(att, "newest", 1);
    w.host = "newest";
    assert_true(kp_test_wait_for(host_seen, &w, 2000));
    assert_true(fake_get(f, &f->reports) <= 9);
    kp_attach_destroy(att);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* Commands reach kp_attach_take in the order sent, and the eventfd wakes the loop. */
static void test_commands_in_order(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct kp_attach_opts o = test_opts(ch, efd);
    struct kp_attach_stats st;
    struct kp_attach *att;
    struct waitarg w = { f, NULL, 1, "n" };
    struct pollfd pfd;
    uint64_t v;
    int next = 1;
    long long deadline;

    (void) state;
    assert_true(efd >= 0);
    assert_int_equal(kp_attach_create(&o, &att), 0);
    w.att = att;
    assert_null(kp_attach_take(att));
    publish_host(att, "n", 1);
    assert_true(kp_test_wait_for(calls_at_least, &w, 5000));
    for (int i = 1; i <= 100; i++) {
        assert_int_equal(fake_send(f,
                                   i % 3 == 0   ? KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET
                                   : i % 3 == 1 ? KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM
                                                : KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP,
                                   (uint64_t) i),
                         0);
    }
    /* drain like the agent's loop: wait for the eventfd, then take until NULL */
    deadline = kp_mono_ms() + kp_test_scaled_ms(10000);
    while (next <= 100 && kp_mono_ms() < deadline) {
        Kprof__V1__CaptureCommand *c;

        pfd.fd = efd;
        pfd.events = POLLIN;
        if (poll(&pfd, 1, 200) == 1) {
            assert_int_equal(read(efd, &v, sizeof(v)), (ssize_t) sizeof(v));
        }
        while ((c = kp_attach_take(att)) != NULL) {
            assert_int_equal(c->run_id, (uint64_t) next);
            assert_string_equal(c->job, "train");
            assert_int_equal(c->n_ranks, 2);
            assert_int_equal(c->ranks[1], 3);
            assert_int_equal(c->start_step, 100);
            next++;
            protobuf_c_message_free_unpacked(&c->base, NULL);
        }
    }
    assert_int_equal(next, 101);
    kp_attach_get_stats(att, &st);
    assert_int_equal(st.commands_received, 100);
    assert_int_equal(st.commands_dropped, 0);
    assert_int_equal(st.queued, 0);
    kp_attach_destroy(att);
    kp_rpc_channel_destroy(ch);
    close(efd);
    fake_free(f);
}

/* Beyond max_queue, commands are dropped and counted; the queued ones stay in order. */
static void test_queue_bound(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_attach_opts o = test_opts(ch, -1);
    struct kp_attach_stats st;
    struct kp_attach *att;
    struct waitarg w = { f, NULL, 1, "n" };
    Kprof__V1__CaptureCommand *c;

    (void) state;
    o.max_queue = 4;
    assert_int_equal(kp_attach_create(&o, &att), 0);
    w.att = att;
    publish_host(att, "n", 1);
    assert_true(kp_test_wait_for(calls_at_least, &w, 5000));
    for (int i = 1; i <= 10; i++) {
        assert_int_equal(fake_send(f, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM, (uint64_t) i), 0);
    }
    w.n = 10;
    assert_true(kp_test_wait_for(received_at_least, &w, 5000));
    kp_attach_get_stats(att, &st);
    assert_int_equal(st.queued, 4);
    assert_int_equal(st.commands_dropped, 6);
    for (uint64_t i = 1; i <= 4; i++) {
        c = kp_attach_take(att);
        assert_non_null(c);
        assert_int_equal(c->run_id, i);
        protobuf_c_message_free_unpacked(&c->base, NULL);
    }
    assert_null(kp_attach_take(att));
    /* room again: the next command is queued */
    assert_int_equal(fake_send(f, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP, 11), 0);
    w.n = 11;
    assert_true(kp_test_wait_for(received_at_least, &w, 5000));
    c = kp_attach_take(att);
    assert_non_null(c);
    assert_int_equal(c->run_id, 11);
    assert_int_equal(c->kind, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP);
    protobuf_c_message_free_unpacked(&c->base, NULL);
    /* queued commands are freed with the attach */
    assert_int_equal(fake_send(f, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM, 12), 0);
    w.n = 12;
    assert_true(kp_test_wait_for(received_at_least, &w, 5000));
    kp_attach_destroy(att);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* collectord goes away and comes back on the same port: the attach reconnects by itself and
 * sends the newest snapshot again on the new call; commands flow on it. */
static void test_reconnect(void **state)
{
    struct fake *f = fake_new();
    int port = f->port;
    struct kp_rpc_channel *ch = channel_to(port);
    struct kp_attach_opts o = test_opts(ch, -1);
    struct kp_attach_stats st;
    struct kp_attach *att;
    struct waitarg w = { f, NULL, 1, "before" };
    Kprof__V1__CaptureCommand *c;

    (void) state;
    o.heartbeat_ms = 600000; /* a report on the new call can only be the reconnect's */
    assert_int_equal(kp_attach_create(&o, &att), 0);
    w.att = att;
    publish_host(att, "before", 7);
    assert_true(kp_test_wait_for(host_seen, &w, 5000));
    assert_true(kp_test_wait_for(attached, &w, 5000));
    fake_stop(f);
    /* published while collectord is away: sent once it is back */
    publish_host(att, "while-down", 7);
    pthread_mutex_lock(&f->mu);
    f->reports = 0;
    f->calls = 0;
    f->last_host[0] = '\0';
    pthread_mutex_unlock(&f->mu);
    fake_start(f, port);
    assert_int_equal(f->port, port);
    w.host = "while-down";
    assert_true(kp_test_wait_for(host_seen, &w, 10000));
    w.n = 2;
    assert_true(kp_test_wait_for(attached, &w, 10000));
    /* the same snapshot again on a later call (server restarted once more) */
    fake_stop(f);
    pthread_mutex_lock(&f->mu);
    f->last_host[0] = '\0';
    pthread_mutex_unlock(&f->mu);
    fake_start(f, port);
    assert_true(kp_test_wait_for(host_seen, &w, 10000));
    w.n = 1;
    assert_true(kp_test_wait_for(calls_at_least, &w, 5000));
    assert_int_equal(fake_send(f, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM, 5), 0);
    w.n = 1;
    assert_true(kp_test_wait_for(received_at_least, &w, 5000));
    c = kp_attach_take(att);
    assert_non_null(c);
    assert_int_equal(c->run_id, 5);
    protobuf_c_message_free_unpacked(&c->base, NULL);
    kp_attach_get_stats(att, &st);
    assert_true(st.attaches >= 3);
    assert_true(st.attempts >= 3);
    kp_attach_destroy(att);
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

static bool attempts_at_least(void *arg)
{
    struct waitarg *w = arg;
    struct kp_attach_stats st;

    kp_attach_get_stats(w->att, &st);
    return st.attempts >= (uint64_t) w->n;
}

/* Nobody listens: the attach keeps retrying (backing off), never counts as attached, and
 * destroy returns promptly. A server that starts later gets the snapshot. */
static void test_collector_down(void **state)
{
    struct fake *f = fake_new();
    int port = f->port;
    struct kp_rpc_channel *ch;
    struct kp_attach_opts o;
    struct kp_attach_stats st;
    struct kp_attach *att;
    struct waitarg w = { f, NULL, 4, "late" };
    long long t0;

    (void) state;
    fake_stop(f); /* a port that was just free */
    ch = channel_to(port);
    o = test_opts(ch, -1);
    assert_int_equal(kp_attach_create(&o, &att), 0);
    w.att = att;
    publish_host(att, "late", 3);
    assert_true(kp_test_wait_for(attempts_at_least, &w, 10000));
    kp_attach_get_stats(att, &st);
    assert_false(st.attached);
    assert_int_equal(st.attaches, 0);
    assert_int_equal(st.reports_sent, 0);
    fake_start(f, port);
    assert_true(kp_test_wait_for(host_seen, &w, 10000));
    fake_stop(f);
    t0 = kp_mono_ms();
    kp_attach_destroy(att);
    assert_true(kp_mono_ms() - t0 < kp_test_scaled_ms(3000));
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

/* Destroy while attached and idle in a receive returns promptly (the call is cancelled). */
static void test_destroy_attached(void **state)
{
    struct fake *f = fake_new();
    struct kp_rpc_channel *ch = channel_to(f->port);
    struct kp_attach_opts o = test_opts(ch, -1);
    struct kp_attach *att;
    struct waitarg w = { f, NULL, 1, "x" };
    long long t0;

    (void) state;
    o.recv_poll_ms = 60000; /* only the cancel can end the receive */
    assert_int_equal(kp_attach_create(&o, &att), 0);
    w.att = att;
    publish_host(att, "x", 1);
    assert_true(kp_test_wait_for(host_seen, &w, 5000));
    t0 = kp_mono_ms();
    kp_attach_destroy(att);
    assert_true(kp_mono_ms() - t0 < kp_test_scaled_ms(3000));
    kp_rpc_channel_destroy(ch);
    fake_free(f);
}

static void test_bad_args(void **state)
{
    struct kp_attach_opts o;
    struct kp_attach *att = (struct kp_attach *) &o;

    (void) state;
    memset(&o, 0, sizeof(o));
    assert_int_equal(kp_attach_create(&o, &att), -EINVAL);
    assert_null(att);
    kp_attach_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_and_heartbeat),
        cmocka_unit_test(test_new_snapshot_prompt),
        cmocka_unit_test(test_commands_in_order),
        cmocka_unit_test(test_queue_bound),
        cmocka_unit_test(test_reconnect),
        cmocka_unit_test(test_collector_down),
        cmocka_unit_test(test_destroy_attached),
        cmocka_unit_test(test_bad_args),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
