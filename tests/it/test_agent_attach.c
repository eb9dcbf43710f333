/*
 * kprof-agent obeying collectord's capture commands, in-process: a kp_agent (its loop in a
 * thread, --attach on) against a fake collectord (kp_rpc on 127.0.0.1:0: Control.Attach keeps
 * the newest AgentReport and sends the commands the test asks for; Ingest.Push acknowledges
 * batches, or holds the acks), and fake libkprof_inject processes that speak kp_wire on the
 * agent's socket (HELLO, then WINDOW_BEGIN / WINDOW_END / STATUS as the test says). Checks the
 * report's processes and rank states (PENDING, CAPTURING, FLUSHING, DONE, FAILED and their
 * reasons) through ARM, STOP and FORGET. An it test: it runs the daemon whole (threads, sockets,
 * gRPC), though it needs no PostgreSQL.
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
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "attach.h"
#include "kp_push.h"
#include "kp_rpc.h"
#include "kp_testutil.h"
#include "kp_wire.h"
#include "kprof.pb-c.h"

#define MAX_HELD 256

struct fake {
    struct kp_rpc_server *srv;
    struct kp_rpc_method methods[2];
    int port;
    pthread_mutex_t mu;
    struct kp_rpc_call *attach;     /* the open Attach call */
    Kprof__V1__AgentReport *report; /* the newest report */
    int reports;
    /* Push */
    struct kp_rpc_call *push;
    bool hold_acks;
    uint64_t held[MAX_HELD], stream;
    int n_held;
};

static void send_ack(struct kp_rpc_call *call, uint64_t stream, uint64_t seq)
{
    Kprof__V1__Ack ack = KPROF__V1__ACK__INIT;
    Kprof__V1__BatchRef ref = KPROF__V1__BATCH_REF__INIT;
    Kprof__V1__BatchRef *refs[1] = { &ref };

    ref.run_id = 1;
    ref.stream = stream;
    ref.seq = seq;
    ack.n_batches = 1;
    ack.batches = refs;
    kp_rpc_call_send(call, &ack.base);
}

static void *a_open(struct kp_rpc_call *call, void *ud)
{
    struct fake *f = ud;

    pthread_mutex_lock(&f->mu);
    f->attach = call;
    pthread_mutex_unlock(&f->mu);
    return f;
}

static enum kp_rpc_next a_message(struct kp_rpc_call *call, ProtobufCMessage *msg, size_t wire,
                                  void *state)
{
    struct fake *f = state;
    ProtobufCMessage *old;

    (void) call;
    (void) wire;
    pthread_mutex_lock(&f->mu);
    old = f->report != NULL ? &f->report->base : NULL;
    f->report = (Kprof__V1__AgentReport *) msg;
    f->reports++;
    pthread_mutex_unlock(&f->mu);
    if (old != NULL) {
        protobuf_c_message_free_unpacked(old, NULL);
    }
    return KP_RPC_CONTINUE;
}

static void a_half_close(struct kp_rpc_call *call, void *state)
{
    (void) state;
    kp_rpc_call_finish(call, GRPC_STATUS_OK, "");
}

static void a_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    struct fake *f = state;

    (void) cancelled;
    pthread_mutex_lock(&f->mu);
    if (f->attach == call) {
        f->attach = NULL;
    }
    pthread_mutex_unlock(&f->mu);
}

static void *p_open(struct kp_rpc_call *call, void *ud)
{
    struct fake *f = ud;

    pthread_mutex_lock(&f->mu);
    f->push = call;
    pthread_mutex_unlock(&f->mu);
    return f;
}

static enum kp_rpc_next p_message(struct kp_rpc_call *call, ProtobufCMessage *msg, size_t wire,
                                  void *state)
{
    struct fake *f = state;
    Kprof__V1__Batch *b = (Kprof__V1__Batch *) msg;

    (void) wire;
    pthread_mutex_lock(&f->mu);
    f->stream = b->stream;
    if (f->hold_acks && f->n_held < MAX_HELD) {
        f->held[f->n_held++] = b->seq;
    }
    else {
        send_ack(call, b->stream, b->seq);
    }
    pthread_mutex_unlock(&f->mu);
    protobuf_c_message_free_unpacked(msg, NULL);
    return KP_RPC_CONTINUE;
}

static void p_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    struct fake *f = state;

    (void) cancelled;
    pthread_mutex_lock(&f->mu);
    if (f->push == call) {
        f->push = NULL;
    }
    pthread_mutex_unlock(&f->mu);
}

static void fake_hold(struct fake *f, bool hold)
{
    pthread_mutex_lock(&f->mu);
    f->hold_acks = hold;
    if (!hold && f->push != NULL) {
        for (int i = 0; i < f->n_held; i++) {
            send_ack(f->push, f->stream, f->held[i]);
        }
        f->n_held = 0;
    }
    pthread_mutex_unlock(&f->mu);
}

static struct fake *fake_new(void)
{
    struct fake *f = calloc(1, sizeof(*f));
    struct kp_rpc_server_opts so;
    char err[256] = "";

    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    memset(&so, 0, sizeof(so));
    so.listen = "127.0.0.1:0";
    so.name = "fake-collectord";
    f->methods[0].path = KP_ATTACH_PATH;
    f->methods[0].kind = KP_RPC_STREAM;
    f->methods[0].request = &kprof__v1__agent_report__descriptor;
    f->methods[0].on_open = a_open;
    f->methods[0].on_message = a_message;
    f->methods[0].on_half_close = a_half_close;
    f->methods[0].on_close = a_close;
    f->methods[0].ud = f;
    f->methods[1].path = KP_PUSH_PATH;
    f->methods[1].kind = KP_RPC_STREAM;
    f->methods[1].request = &kprof__v1__batch__descriptor;
    f->methods[1].on_open = p_open;
    f->methods[1].on_message = p_message;
    f->methods[1].on_half_close = a_half_close;
    f->methods[1].on_close = p_close;
    f->methods[1].ud = f;
    if (kp_rpc_server_create(&so, f->methods, 2, &f->srv, err, sizeof(err)) != 0) {
        fail_msg("fake collectord: %s", err);
    }
    f->port = kp_rpc_server_port(f->srv);
    return f;
}

static void fake_free(struct fake *f)
{
    kp_rpc_server_destroy(f->srv);
    if (f->report != NULL) {
        protobuf_c_message_free_unpacked(&f->report->base, NULL);
    }
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void fake_command(struct fake *f, int kind, uint64_t run, const int32_t *ranks, size_t n,
                         int64_t start_step, uint32_t steps, const char *reason)
{
    Kprof__V1__CaptureCommand c = KPROF__V1__CAPTURE_COMMAND__INIT;
    int rc = -ENOTCONN;

    c.kind = (Kprof__V1__CaptureCommand__Kind) kind;
    c.run_id = run;
    c.job = (char *) "train";
    c.ranks = (int32_t *) ranks;
    c.n_ranks = n;
    c.start_step = start_step;
    c.steps = steps;
    c.duration_ms = steps == 0 ? 60000 : 0;
    c.world_size = 4;
    c.reason = (char *) (reason != NULL ? reason : "");
    pthread_mutex_lock(&f->mu);
    if (f->attach != NULL) {
        rc = kp_rpc_call_send(f->attach, &c.base);
    }
    pthread_mutex_unlock(&f->mu);
    assert_int_equal(rc, 0);
}

/* --- the report, as the fake last received it --- */

/* The state of rank of run in the newest report (0 if absent); reason copied if asked;
 * steps gets first_step, last_step, records and dropped. */
static int report_rank(struct fake *f, uint64_t run, int32_t rank, char *reason, size_t len,
                       int64_t *steps)
{
    int st = 0;

    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; f->report != NULL && i < f->report->n_ranks; i++) {
        Kprof__V1__AgentCaptureRank *r = f->report->ranks[i];

        if (r->run_id == run && r->rank == rank) {
            st = (int) r->state;
            if (reason != NULL) {
                snprintf(reason, len, "%s", r->reason);
            }
            if (steps != NULL) {
                steps[0] = r->first_step;
                steps[1] = r->last_step;
                steps[2] = (int64_t) r->records;
                steps[3] = (int64_t) r->dropped;
            }
        }
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

/* run_id of the process of rank in the newest report; -1 if it is not listed. */
static long long report_proc_run(struct fake *f, int32_t rank)
{
    long long run = -1;

    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; f->report != NULL && i < f->report->n_processes; i++) {
        if (f->report->processes[i]->rank == rank) {
            run = (long long) f->report->processes[i]->run_id;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return run;
}

struct rank_wait {
    struct fake *f;
    uint64_t run;
    int32_t rank;
    int state;
    long long proc_run;
};

static bool rank_in_state(void *arg)
{
    struct rank_wait *w = arg;

    return report_rank(w->f, w->run, w->rank, NULL, 0, NULL) == w->state;
}

static bool proc_in_run(void *arg)
{
    struct rank_wait *w = arg;

    return report_proc_run(w->f, w->rank) == w->proc_run;
}

static void wait_rank(struct fake *f, uint64_t run, int32_t rank, int state)
{
    struct rank_wait w = { f, run, rank, state, 0 };

    if (!kp_test_wait_for(rank_in_state, &w, 10000)) {
        char reason[512] = "";
        int got = report_rank(f, run, rank, reason, sizeof(reason), NULL);

        fail_msg("run %llu rank %d: state %d, want %d (reason \"%s\")", (unsigned long long) run,
                 rank, got, state, reason);
    }
}

static void wait_proc_run(struct fake *f, int32_t rank, long long run)
{
    struct rank_wait w = { f, 0, rank, 0, run };

    if (!kp_test_wait_for(proc_in_run, &w, 10000)) {
        fail_msg("process of rank %d: run %lld, want %lld", rank, report_proc_run(f, rank), run);
    }
}

/* --- fake library processes --- */

struct lib {
    int fd;
    int32_t rank;
    uint64_t capture_id; /* from the last ARM */
};

static void lib_send_n(struct lib *l, enum kp_wire_type type, const void *p, size_t len,
                       uint32_t count)
{
    uint8_t buf[sizeof(struct kp_wire_hdr) + 2048];
    struct kp_wire_hdr h;

    assert_true(len <= sizeof(buf) - sizeof(h));
    kp_wire_hdr_init(&h, type, (uint32_t) len, count);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), p, len);
    assert_int_equal(send(l->fd, buf, sizeof(h) + len, MSG_NOSIGNAL), (ssize_t) (sizeof(h) + len));
}

/* Waits for a message of type from the agent and copies its payload. */
static void lib_expect(struct lib *l, enum kp_wire_type type, void *payload, size_t len)
{
    uint8_t buf[KP_WIRE_MAX_MSG];
    struct kp_wire_hdr h;
    struct pollfd pfd = { l->fd, POLLIN, 0 };
    int timeout = kp_test_scaled_ms(10000);

    for (;;) {
        ssize_t n;

        if (poll(&pfd, 1, timeout) != 1) {
            fail_msg("rank %d: no message of type %d from the agent", l->rank, (int) type);
        }
        n = recv(l->fd, buf, sizeof(buf), 0);
        assert_true(n >= (ssize_t) sizeof(h));
        memcpy(&h, buf, sizeof(h));
        if (h.type == type) {
            assert_true(h.len >= len);
            memcpy(payload, buf + sizeof(h), len);
            return;
        }
    }
}

static void lib_send(struct lib *l, enum kp_wire_type type, const void *p, size_t len)
{
    lib_send_n(l, type, p, len, 0);
}

static int64_t real_ns(void);

/* n runtime API records inside the window (now). */
static void lib_records(struct lib *l, uint32_t n)
{
    uint8_t buf[sizeof(struct kp_wire_records) + 8 * sizeof(struct kp_wire_api)];
    struct kp_wire_records rh = { KP_REC_API, sizeof(struct kp_wire_api) };
    int64_t t = real_ns();

    assert_true(n <= 8);
    memcpy(buf, &rh, sizeof(rh));
    for (uint32_t i = 0; i < n; i++) {
        struct kp_wire_api api;

        memset(&api, 0, sizeof(api));
        api.start_ns = t - 500000 + i * 1000;
        api.end_ns = api.start_ns + 500;
        api.correlation = 100 + i;
        api.tid = 1;
        api.domain = 1;
        api.cbid = 211;
        memcpy(buf + sizeof(rh) + i * sizeof(api), &api, sizeof(api));
    }
    lib_send_n(l, KP_W_RECORDS, buf, sizeof(rh) + n * sizeof(struct kp_wire_api), n);
}

static struct lib *lib_connect(const char *sock, int32_t rank)
{
    struct lib *l = calloc(1, sizeof(*l));
    struct sockaddr_un sa;
    struct kp_wire_hello hello;
    struct kp_wire_welcome w;

    assert_non_null(l);
    l->rank = rank;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
    l->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(l->fd >= 0);
    assert_int_equal(connect(l->fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
    memset(&hello, 0, sizeof(hello));
    hello.wire_version = KP_WIRE_VERSION;
    hello.pid = (uint32_t) getpid();
    hello.rank = rank;
    hello.local_rank = rank;
    hello.world_size = 4;
    hello.device = rank;
    hello.current_step = 10;
    snprintf(hello.job, sizeof(hello.job), "train");
    snprintf(hello.host, sizeof(hello.host), "testhost");
    lib_send(l, KP_W_HELLO, &hello, sizeof(hello));
    lib_expect(l, KP_W_WELCOME, &w, sizeof(w));
    assert_int_equal(w.accepted, 1);
    return l;
}

static void lib_close(struct lib *l)
{
    if (l != NULL) {
        close(l->fd);
        free(l);
    }
}

static void lib_armed(struct lib *l, uint64_t run)
{
    struct kp_wire_arm arm;

    lib_expect(l, KP_W_ARM, &arm, sizeof(arm));
    assert_int_equal(arm.run_id, run);
    l->capture_id = arm.capture_id;
}

static int64_t real_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void lib_window(struct lib *l, enum kp_wire_type type, uint64_t run, int64_t first,
                       int64_t last)
{
    struct kp_wire_window w;

    memset(&w, 0, sizeof(w));
    w.capture_id = l->capture_id;
    w.run_id = run;
    w.start_ns = real_ns() - 1000000;
    w.end_ns = type == KP_W_WINDOW_END ? real_ns() : 0;
    w.first_step = first;
    w.last_step = type == KP_W_WINDOW_END ? last : -1;
    w.dropped = type == KP_W_WINDOW_END ? 3 : 0;
    w.realtime_ns = real_ns();
    lib_send(l, type, &w, sizeof(w));
}

/* --- the agent --- */

struct env {
    char dir[64], sock[128], spool[128], collector[64];
    struct kp_agent_config cfg;
    struct kp_agent *a;
    pthread_t th;
    struct fake *f;
};

static void *agent_thread(void *arg)
{
    struct env *e = arg;

    kp_agent_run(e->a);
    return NULL;
}

static bool attached(void *arg)
{
    struct fake *f = arg;
    bool ok;

    pthread_mutex_lock(&f->mu);
    ok = f->attach != NULL && f->report != NULL;
    pthread_mutex_unlock(&f->mu);
    return ok;
}

static long long spool_max_bytes = 64LL << 20;

static int env_setup(void **state)
{
    struct env *e = calloc(1, sizeof(*e));
    char err[512] = "";

    assert_non_null(e);
    e->f = fake_new();
    snprintf(e->dir, sizeof(e->dir), "/tmp/kp_agent_attach.XXXXXX");
    assert_non_null(mkdtemp(e->dir));
    snprintf(e->sock, sizeof(e->sock), "%s/agent.sock", e->dir);
    snprintf(e->spool, sizeof(e->spool), "%s/spool", e->dir);
    snprintf(e->collector, sizeof(e->collector), "127.0.0.1:%d", e->f->port);
    e->cfg.socket = e->sock;
    e->cfg.socket_mode = (char *) "0600";
    e->cfg.allow_uid = (char *) "";
    e->cfg.collector = e->collector;
    e->cfg.tls_ca = (char *) "";
    e->cfg.spool_dir = e->spool;
    e->cfg.spool_max_bytes = spool_max_bytes;
    e->cfg.batch_rows = 4000;
    e->cfg.batch_ms = 200;
    e->cfg.max_sessions = 64;
    e->cfg.http_listen = (char *) "";
    e->cfg.ready_file = (char *) "";
    e->cfg.log_level = 2;
    e->cfg.host = (char *) "testhost";
    e->cfg.attach = true;
    if (kp_agent_create(&e->cfg, &e->a, err, sizeof(err)) != 0) {
        fail_msg("kp_agent_create: %s", err);
    }
    assert_int_equal(pthread_create(&e->th, NULL, agent_thread, e), 0);
    assert_true(kp_test_wait_for(attached, e->f, 10000));
    *state = e;
    return 0;
}

static int env_teardown(void **state)
{
    struct env *e = *state;
    char cmd[200];

    kp_agent_stop(e->a);
    pthread_join(e->th, NULL);
    kp_agent_destroy(e->a);
    fake_free(e->f);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->dir);
    if (system(cmd) != 0) {
        print_message("cannot remove %s\n", e->dir);
    }
    free(e);
    return 0;
}

enum {
    PENDING = KPROF__V1__RANK_STATE__RANK_STATE_PENDING,
    CAPTURING = KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING,
    FLUSHING = KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING,
    DONE = KPROF__V1__RANK_STATE__RANK_STATE_DONE,
    FAILED = KPROF__V1__RANK_STATE__RANK_STATE_FAILED,
    ARM = KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM,
    STOP = KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP,
    FORGET = KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET,
};

/* ARM over registered and unregistered ranks; a window that begins, ends, flushes and is
 * acknowledged; a process that dies inside its window; a repeated ARM; a second capture of a
 * rank that is over; FORGET. */
static void test_arm_window_forget(void **state)
{
    struct env *e = *state;
    struct fake *f = e->f;
    struct lib *l0 = lib_connect(e->sock, 0), *l1 = lib_connect(e->sock, 1);
    const int32_t ranks[] = { 0, 1, 5 }, rank0[] = { 0 };
    char reason[512];
    int64_t steps[4];

    wait_proc_run(f, 0, 0);
    wait_proc_run(f, 1, 0);
    fake_hold(f, true);
    fake_command(f, ARM, 7, ranks, 3, -1, 0, NULL);
    lib_armed(l0, 7);
    lib_armed(l1, 7);
    wait_rank(f, 7, 0, PENDING);
    wait_rank(f, 7, 1, PENDING);
    wait_rank(f, 7, 5, FAILED);
    report_rank(f, 7, 5, reason, sizeof(reason), NULL);
    assert_non_null(
        strstr(reason, "rank 5 of job train is not registered on the agent on host testhost"));
    wait_proc_run(f, 0, 7);
    /* rank 0: begin, end, flush, done */
    lib_window(l0, KP_W_WINDOW_BEGIN, 7, -1, -1);
    wait_rank(f, 7, 0, CAPTURING);
    lib_window(l0, KP_W_WINDOW_END, 7, -1, -1);
    wait_rank(f, 7, 0, FLUSHING);
    wait_proc_run(f, 0, 0); /* its process is free for another capture already */
    fake_hold(f, false);
    wait_rank(f, 7, 0, DONE);
    report_rank(f, 7, 0, reason, sizeof(reason), steps);
    assert_string_equal(reason, "");
    assert_int_equal(steps[0], -1);
    /* rank 1 dies inside its window */
    lib_window(l1, KP_W_WINDOW_BEGIN, 7, -1, -1);
    wait_rank(f, 7, 1, CAPTURING);
    lib_close(l1);
    wait_rank(f, 7, 1, FAILED);
    report_rank(f, 7, 1, reason, sizeof(reason), NULL);
    assert_non_null(strstr(reason, "(rank 1) exited or closed its connection during the window"));
    /* collectord resends the ARM (after a reconnect): ignored */
    fake_command(f, ARM, 7, ranks, 3, -1, 0, NULL);
    /* rank 0 joins a new capture at once; run 7 stays reported until forgotten */
    fake_command(f, ARM, 8, rank0, 1, 500, 5, NULL);
    lib_armed(l0, 8);
    wait_rank(f, 8, 0, PENDING);
    wait_proc_run(f, 0, 8);
    assert_int_equal(report_rank(f, 7, 0, NULL, 0, NULL), DONE);
    lib_window(l0, KP_W_WINDOW_BEGIN, 8, 500, -1);
    lib_records(l0, 2);
    wait_rank(f, 8, 0, CAPTURING);
    report_rank(f, 8, 0, NULL, 0, steps);
    assert_int_equal(steps[0], 500);
    assert_int_equal(steps[1], -1);
    lib_window(l0, KP_W_WINDOW_END, 8, 500, 504);
    wait_rank(f, 8, 0, DONE);
    report_rank(f, 8, 0, NULL, 0, steps);
    assert_int_equal(steps[0], 500);
    assert_int_equal(steps[1], 504);
    assert_int_equal(steps[2], 2); /* records received, kept after the window ended */
    assert_int_equal(steps[3], 3); /* the library's dropped count at WINDOW_END */
    fake_command(f, FORGET, 7, NULL, 0, 0, 0, NULL);
    wait_rank(f, 7, 0, 0);
    wait_rank(f, 7, 5, 0);
    assert_int_equal(report_rank(f, 8, 0, NULL, 0, NULL), DONE);
    lib_close(l0);
    wait_proc_run(f, 0, -1);
}

/* STOP: an armed rank is disarmed and done at once; a begun one is disarmed and ends its
 * window. A rank already capturing cannot join another capture. */
static void test_stop_and_busy(void **state)
{
    struct env *e = *state;
    struct fake *f = e->f;
    struct lib *l0 = lib_connect(e->sock, 0), *l1 = lib_connect(e->sock, 1);
    const int32_t ranks[] = { 0, 1 }, rank0[] = { 0 };
    struct kp_wire_disarm d;
    char reason[512];

    wait_proc_run(f, 1, 0);
    fake_command(f, ARM, 9, ranks, 2, 1000, 5, NULL);
    lib_armed(l0, 9);
    lib_armed(l1, 9);
    lib_window(l0, KP_W_WINDOW_BEGIN, 9, 1000, -1);
    wait_rank(f, 9, 0, CAPTURING);
    wait_rank(f, 9, 1, PENDING);
    /* busy */
    fake_command(f, ARM, 10, rank0, 1, 2000, 5, NULL);
    wait_rank(f, 10, 0, FAILED);
    report_rank(f, 10, 0, reason, sizeof(reason), NULL);
    assert_string_equal(reason, "rank 0 is already capturing for run 9");
    /* stop */
    fake_command(f, STOP, 9, NULL, 0, 0, 0, "kprofctl stop");
    lib_expect(l1, KP_W_DISARM, &d, sizeof(d));
    assert_int_equal(d.capture_id, l1->capture_id);
    wait_rank(f, 9, 1, DONE);
    report_rank(f, 9, 1, reason, sizeof(reason), NULL);
    assert_string_equal(reason, "stopped before its window began");
    lib_expect(l0, KP_W_DISARM, &d, sizeof(d));
    assert_int_equal(d.capture_id, l0->capture_id);
    assert_int_equal(report_rank(f, 9, 0, NULL, 0, NULL), CAPTURING);
    lib_window(l0, KP_W_WINDOW_END, 9, 1000, 1002);
    wait_rank(f, 9, 0, DONE);
    wait_proc_run(f, 0, 0);
    wait_proc_run(f, 1, 0);
    fake_command(f, FORGET, 9, NULL, 0, 0, 0, NULL);
    fake_command(f, FORGET, 10, NULL, 0, 0, 0, NULL);
    wait_rank(f, 9, 0, 0);
    wait_rank(f, 10, 0, 0);
    lib_close(l0);
    lib_close(l1);
}

/* The spool refuses every batch (as when collectord has been away too long): the rank whose
 * last batch was dropped is FAILED, with a reason naming --spool-max-bytes, never FLUSHING. */
static void test_spool_full(void **state)
{
    struct env *e = *state;
    struct fake *f = e->f;
    struct lib *l0 = lib_connect(e->sock, 0);
    const int32_t rank0[] = { 0 };
    char reason[512];

    fake_command(f, ARM, 11, rank0, 1, -1, 0, NULL);
    lib_armed(l0, 11);
    lib_window(l0, KP_W_WINDOW_BEGIN, 11, -1, -1);
    lib_records(l0, 3);
    lib_window(l0, KP_W_WINDOW_END, 11, -1, -1);
    wait_rank(f, 11, 0, FAILED);
    report_rank(f, 11, 0, reason, sizeof(reason), NULL);
    assert_non_null(strstr(reason, "--spool-max-bytes"));
    assert_non_null(strstr(reason, "the last one included"));
    wait_proc_run(f, 0, 0);
    lib_close(l0);
}

static int env_setup_tiny_spool(void **state)
{
    int rc;

    spool_max_bytes = 1;
    rc = env_setup(state);
    spool_max_bytes = 64LL << 20;
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_arm_window_forget, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_stop_and_busy, env_setup, env_teardown),
        cmocka_unit_test_setup_teardown(test_spool_full, env_setup_tiny_spool, env_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
