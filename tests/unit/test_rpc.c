/*
 * Unit tests for common/kp_rpc over loopback (127.0.0.1, port 0): a server of a unary and a
 * streaming method (fakes of Control.CreateRun and Control.Attach, named as such), and the
 * client calls: a unary round trip and an error status, a stream in both directions, bad
 * bytes (INVALID_ARGUMENT), a deadline, an unknown method (UNIMPLEMENTED), nothing listening
 * (UNAVAILABLE), a port already bound, and a shutdown that cancels a live stream.
 */
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
#include <unistd.h>

#include "kp_clock.h"
#include "kp_err.h"
#include "kp_rpc.h"
#include "kprof.pb-c.h"

#define UNARY_PATH  "/kprof.v1.Control/CreateRun"
#define STREAM_PATH "/kprof.v1.Control/Attach"

/* The fake server: what its callbacks saw. */
struct fake {
    struct kp_rpc_method methods[2];
    struct kp_rpc_server *srv;
    char target[64];
    pthread_mutex_t mu;
    struct kp_rpc_call *held; /* a unary call left unanswered (job "slow"), referenced */
    int opened, closed, closed_cancelled, messages;
};

/* CreateRun: job "slow" is kept unanswered, job "missing" gets NOT_FOUND; else a Run whose id
 * is world_size * 2 and whose job and name are the request's. */
static void fake_unary(struct kp_rpc_call *call, ProtobufCMessage *msg, void *ud)
{
    struct fake *f = ud;
    Kprof__V1__CreateRunRequest *req = (Kprof__V1__CreateRunRequest *) msg;
    Kprof__V1__Run run = KPROF__V1__RUN__INIT;

    if (strcmp(req->job, "slow") == 0) {
        kp_rpc_call_ref(call);
        pthread_mutex_lock(&f->mu);
        f->held = call;
        pthread_mutex_unlock(&f->mu);
    }
    else if (strcmp(req->job, "missing") == 0) {
        kp_rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, "no job named missing");
    }
    else {
        run.id = (uint64_t) req->world_size * 2;
        run.job = req->job;
        run.name = req->name;
        kp_rpc_call_reply(call, &run.base);
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void *fake_open(struct kp_rpc_call *call, void *ud)
{
    struct fake *f = ud;

    pthread_mutex_lock(&f->mu);
    f->opened++;
    pthread_mutex_unlock(&f->mu);
    return f;
}

/* Attach: each report is answered with a command whose run_id is the report's agent_id. */
static enum kp_rpc_next fake_message(struct kp_rpc_call *call, ProtobufCMessage *msg, size_t wire,
                                     void *state)
{
    struct fake *f = state;
    Kprof__V1__AgentReport *r = (Kprof__V1__AgentReport *) msg;
    Kprof__V1__CaptureCommand cmd = KPROF__V1__CAPTURE_COMMAND__INIT;

    pthread_mutex_lock(&f->mu);
    f->messages++;
    pthread_mutex_unlock(&f->mu);
    cmd.kind = KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM;
    cmd.run_id = r->agent_id;
    cmd.job = r->host;
    assert_int_equal(kp_rpc_call_send(call, &cmd.base), 0);
    protobuf_c_message_free_unpacked(msg, NULL);
    return KP_RPC_CONTINUE;
}

static void fake_half_close(struct kp_rpc_call *call, void *state)
{
    kp_rpc_call_finish(call, GRPC_STATUS_OK, "");
}

static void fake_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    struct fake *f = state;

    pthread_mutex_lock(&f->mu);
    f->closed++;
    f->closed_cancelled += cancelled;
    pthread_mutex_unlock(&f->mu);
}

static int fake_start(struct fake *f, const char *listen, char *err, size_t len)
{
    struct kp_rpc_server_opts so = { .listen = listen, .name = "fake-collectord" };
    int rc;

    f->methods[0] = (struct kp_rpc_method){ .path = UNARY_PATH,
                                            .kind = KP_RPC_UNARY,
                                            .request = &kprof__v1__create_run_request__descriptor,
                                            .on_request = fake_unary,
                                            .ud = f };
    f->methods[1] = (struct kp_rpc_method){ .path = STREAM_PATH,
                                            .kind = KP_RPC_STREAM,
                                            .request = &kprof__v1__agent_report__descriptor,
                                            .on_open = fake_open,
                                            .on_message = fake_message,
                                            .on_half_close = fake_half_close,
                                            .on_close = fake_close,
                                            .ud = f };
    if ((rc = kp_rpc_server_create(&so, f->methods, 2, &f->srv, err, len)) == 0) {
        snprintf(f->target, sizeof(f->target), "127.0.0.1:%d", kp_rpc_server_port(f->srv));
    }
    return rc;
}

static int setup(void **state)
{
    struct fake *f = calloc(1, sizeof(*f));
    char err[256] = "";

    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    if (fake_start(f, "127.0.0.1:0", err, sizeof(err)) != 0) {
        fail_msg("fake server: %s", err);
    }
    assert_true(kp_rpc_server_port(f->srv) > 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fake *f = *state;

    kp_rpc_server_destroy(f->srv);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return 0;
}

static struct kp_rpc_channel *channel(const char *target)
{
    struct kp_rpc_channel *ch = NULL;
    char err[256] = "";

    if (kp_rpc_channel_create(target, NULL, &ch, err, sizeof(err)) != 0) {
        fail_msg("channel to %s: %s", target, err);
    }
    return ch;
}

static int create_run(struct kp_rpc_channel *ch, const char *path, const char *job,
                      uint32_t world_size, Kprof__V1__Run **out, long long timeout_ms,
                      struct kp_rpc_status *st)
{
    Kprof__V1__CreateRunRequest req = KPROF__V1__CREATE_RUN_REQUEST__INIT;

    req.job = (char *) job;
    req.name = (char *) "n";
    req.world_size = world_size;
    return kp_rpc_unary(ch, path, &req.base, &kprof__v1__run__descriptor, (ProtobufCMessage **) out,
                        timeout_ms, st);
}

/* A unary call comes back with the server's reply; an error status with its details. */
static void test_unary(void **state)
{
    struct fake *f = *state;
    struct kp_rpc_channel *ch = channel(f->target);
    struct kp_rpc_status st;
    Kprof__V1__Run *run = NULL;

    assert_int_equal(create_run(ch, UNARY_PATH, "train", 21, &run, 5000, &st), 0);
    assert_int_equal(run->id, 42);
    assert_string_equal(run->job, "train");
    assert_string_equal(run->name, "n");
    protobuf_c_message_free_unpacked(&run->base, NULL);
    run = NULL;
    assert_int_equal(create_run(ch, UNARY_PATH, "missing", 1, &run, 5000, &st), KP_ERPC);
    assert_null(run);
    assert_int_equal(st.code, GRPC_STATUS_NOT_FOUND);
    assert_string_equal(st.details, "no job named missing");
    assert_string_equal(kp_rpc_status_name(st.code), "NOT_FOUND");
    kp_rpc_channel_destroy(ch);
}

/* A call the server does not answer ends DEADLINE_EXCEEDED at its timeout, not before. */
static void test_deadline(void **state)
{
    struct fake *f = *state;
    struct kp_rpc_channel *ch = channel(f->target);
    struct kp_rpc_status st;
    Kprof__V1__Run *run = NULL;
    long long t0 = kp_mono_ms(), ms;
    struct kp_rpc_call *held;

    assert_int_equal(create_run(ch, UNARY_PATH, "slow", 1, &run, 300, &st), KP_ERPC);
    ms = kp_mono_ms() - t0;
    assert_int_equal(st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_true(ms >= 250);
    assert_true(ms < 10000);
    pthread_mutex_lock(&f->mu);
    held = f->held;
    f->held = NULL;
    pthread_mutex_unlock(&f->mu);
    assert_non_null(held);
    kp_rpc_call_finish(held, GRPC_STATUS_OK, ""); /* too late: a no-op or -ECANCELED */
    kp_rpc_call_unref(held);
    kp_rpc_channel_destroy(ch);
}

/* A method the server does not have: UNIMPLEMENTED, naming the server. */
static void test_unknown_method(void **state)
{
    struct fake *f = *state;
    struct kp_rpc_channel *ch = channel(f->target);
    struct kp_rpc_status st;
    Kprof__V1__Run *run = NULL;

    assert_int_equal(create_run(ch, "/kprof.v1.Control/NoSuchMethod", "train", 1, &run, 5000, &st),
                     KP_ERPC);
    assert_int_equal(st.code, GRPC_STATUS_UNIMPLEMENTED);
    assert_non_null(strstr(st.details, "fake-collectord"));
    kp_rpc_channel_destroy(ch);
}

/* A stream: every report is answered in order, then OK after the client's close. */
static void test_stream(void **state)
{
    struct fake *f = *state;
    struct kp_rpc_channel *ch = channel(f->target);
    struct kp_rpc_stream *s = NULL;
    struct kp_rpc_status st;
    ProtobufCMessage *m;

    assert_int_equal(kp_rpc_stream_open(ch, STREAM_PATH, &kprof__v1__capture_command__descriptor,
                                        10000, &s, &st),
                     0);
    for (uint64_t i = 1; i <= 3; i++) {
        Kprof__V1__AgentReport r = KPROF__V1__AGENT_REPORT__INIT;
        Kprof__V1__CaptureCommand *cmd;

        r.host = (char *) "node-a";
        r.agent_id = i * 7;
        assert_int_equal(kp_rpc_stream_send(s, &r.base), 0);
        assert_int_equal(kp_rpc_stream_recv(s, &m, 5000), 1);
        cmd = (Kprof__V1__CaptureCommand *) m;
        assert_int_equal(cmd->run_id, i * 7);
        assert_string_equal(cmd->job, "node-a");
        protobuf_c_message_free_unpacked(m, NULL);
    }
    assert_int_equal(kp_rpc_stream_close_send(s), 0);
    assert_int_equal(kp_rpc_stream_recv(s, &m, 5000), 0);
    assert_int_equal(kp_rpc_stream_finish(s, &st, 5000), 0);
    assert_int_equal(st.code, GRPC_STATUS_OK);
    kp_rpc_stream_destroy(s);
    pthread_mutex_lock(&f->mu);
    assert_int_equal(f->opened, 1);
    assert_int_equal(f->messages, 3);
    pthread_mutex_unlock(&f->mu);
    kp_rpc_channel_destroy(ch);
}

struct flood {
    struct kp_rpc_stream *s;
    int sent;
};

static void *flood_send(void *arg)
{
    struct flood *fl = arg;
    static char host[8192];
    Kprof__V1__AgentReport r = KPROF__V1__AGENT_REPORT__INIT;

    memset(host, 'h', sizeof(host) - 1);
    r.host = host;
    for (int i = 0; i < 4000; i++) {
        r.agent_id = (uint64_t) i;
        if (kp_rpc_stream_send(fl->s, &r.base) != 0) {
            break;
        }
        __atomic_add_fetch(&fl->sent, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

/* A client that sends and never reads its replies (each as big as its message, 8 KiB): the
 * server stops reading once about 1 MiB of replies waits, so it takes a bounded part of the
 * 32 MiB the client tries to send, and the client's sends block. Cancelling ends the call. */
static void test_unread_replies(void **state)
{
    struct fake *f = *state;
    struct kp_rpc_channel *ch = channel(f->target);
    struct flood fl = { 0 };
    struct kp_rpc_status st;
    pthread_t t;
    int seen, before;

    assert_int_equal(
        kp_rpc_stream_open(ch, STREAM_PATH, &kprof__v1__capture_command__descriptor, 0, &fl.s, &st),
        0);
    assert_int_equal(pthread_create(&t, NULL, flood_send, &fl), 0);
    /* Wait until the server's intake stops moving (or everything went through). */
    seen = -1;
    for (int i = 0; i < 100; i++) {
        usleep(100 * 1000);
        pthread_mutex_lock(&f->mu);
        before = seen;
        seen = f->messages;
        pthread_mutex_unlock(&f->mu);
        if (seen == before || seen == 4000) {
            break;
        }
    }
    assert_true(seen > 0);
    assert_true(seen < 1000);
    assert_true(__atomic_load_n(&fl.sent, __ATOMIC_RELAXED) < 4000);
    kp_rpc_stream_cancel(fl.s);
    pthread_join(t, NULL);
    kp_rpc_stream_destroy(fl.s);
    kp_rpc_channel_destroy(ch);
}

/* Bytes that are not a message: INVALID_ARGUMENT from the wrapper, the callee sees nothing. */
static void test_bad_input(void **state)
{
    struct fake *f = *state;
    struct kp_rpc_channel *ch = channel(f->target);
    struct kp_rpc_stream *s = NULL;
    struct kp_rpc_status st;
    static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0x0f };

    assert_int_equal(kp_rpc_stream_open(ch, STREAM_PATH, &kprof__v1__capture_command__descriptor,
                                        10000, &s, &st),
                     0);
    kp_rpc_stream_send_bytes(s, junk, sizeof(junk)); /* may already see the status */
    assert_int_equal(kp_rpc_stream_finish(s, &st, 5000), KP_ERPC);
    assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    kp_rpc_stream_destroy(s);
    pthread_mutex_lock(&f->mu);
    assert_int_equal(f->messages, 0);
    pthread_mutex_unlock(&f->mu);
    kp_rpc_channel_destroy(ch);
}

/* Start and stop: a second server on a bound port fails with a message; a shutdown cancels a
 * live stream (the client sees it end, on_close says cancelled); after destroy nothing listens
 * there (UNAVAILABLE). */
static void test_start_stop(void **state)
{
    struct fake *f = *state, other;
    struct kp_rpc_channel *ch = channel(f->target);
    struct kp_rpc_stream *s = NULL;
    struct kp_rpc_status st;
    Kprof__V1__AgentReport r = KPROF__V1__AGENT_REPORT__INIT;
    Kprof__V1__Run *run = NULL;
    ProtobufCMessage *m;
    char err[256] = "";

    memset(&other, 0, sizeof(other));
    pthread_mutex_init(&other.mu, NULL);
    assert_int_not_equal(fake_start(&other, f->target, err, sizeof(err)), 0);
    assert_null(other.srv);
    assert_true(err[0] != '\0');
    pthread_mutex_destroy(&other.mu);

    assert_int_equal(
        kp_rpc_stream_open(ch, STREAM_PATH, &kprof__v1__capture_command__descriptor, 0, &s, &st),
        0);
    r.host = (char *) "node-b";
    r.agent_id = 1;
    assert_int_equal(kp_rpc_stream_send(s, &r.base), 0);
    assert_int_equal(kp_rpc_stream_recv(s, &m, 5000), 1);
    protobuf_c_message_free_unpacked(m, NULL);
    kp_rpc_server_shutdown(f->srv, 100); /* the stream never ends by itself */
    assert_int_equal(kp_rpc_stream_finish(s, &st, 5000), KP_ERPC);
    assert_int_not_equal(st.code, GRPC_STATUS_OK);
    kp_rpc_stream_destroy(s);
    kp_rpc_server_destroy(f->srv);
    f->srv = NULL;
    pthread_mutex_lock(&f->mu);
    assert_int_equal(f->closed, 1);
    assert_int_equal(f->closed_cancelled, 1);
    pthread_mutex_unlock(&f->mu);
    assert_int_equal(create_run(ch, UNARY_PATH, "train", 1, &run, 2000, &st), KP_ERPC);
    assert_int_equal(st.code, GRPC_STATUS_UNAVAILABLE);
    kp_rpc_channel_destroy(ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_method, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unread_replies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_stop, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
