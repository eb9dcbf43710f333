/*
 * collectord's capture coordinator (collectord/coord.c) in process: kp_coord behind the
 * Control service (kp_control, its worker ticking the coordinator) on a loopback kp_rpc server,
 * against the test PostgreSQL (a capture's run and its captures/capture_ranks rows live there).
 * Fake agents (fake_agent: a Control.Attach call of this test's own) report the processes of a
 * job and the states of its ranks; the test follows each rank and run through its transitions:
 *
 *   lifecycle  ARM to the agent with the ranks and a start step ahead of theirs; PENDING ->
 *              CAPTURING -> DONE (an older report never moves a rank back); every rank DONE:
 *              the run ENDED, FORGET to the agent, the final states in PostgreSQL
 *   failed     a rank FAILED with a reason: the run ends FAILED, the reason kept
 *   deadline   ranks that never finish: STOP at the deadline, FAILED, the run FAILED
 *   agent_lost an agent whose call breaks and stays away past the grace: its ranks FAILED
 *   stop       StopCapture: STOP to the agent; the run ENDED once the ranks are DONE
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "control.h"
#include "coord.h"
#include "kp_clock.h"
#include "kp_pg.h"
#include "kp_rpc.h"
#include "kp_testutil.h"
#include "kprof.pb-c.h"

#define AGENT_GRACE_MS 400
#define ATTACH_PATH    "/kprof.v1.Control/Attach"
#define CMD_ARM        KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM
#define CMD_STOP       KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP
#define CMD_FORGET     KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET
#define R_PENDING      KPROF__V1__RANK_STATE__RANK_STATE_PENDING
#define R_CAPTURING    KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING
#define R_DONE         KPROF__V1__RANK_STATE__RANK_STATE_DONE
#define R_FAILED       KPROF__V1__RANK_STATE__RANK_STATE_FAILED

static struct env {
    char conninfo[1024];
    PGconn *db;
    struct kp_coord *coord;
    struct kp_control *control;
    struct kp_rpc_method methods[KP_CONTROL_N_METHODS];
    struct kp_rpc_server *srv;
    struct kp_rpc_channel *ch;
} env;

/* One agent: an Attach call reporting the ranks of one job on one host. */
struct fake_agent {
    struct kp_rpc_stream *s;
    const char *host;
    uint64_t id;
    const char *job;
    int32_t ranks[4];
    size_t n;
    int states[4]; /* reported per rank; 0: not reported */
    uint64_t run_id;
    const char *reason; /* for FAILED ranks */
    uint64_t records;   /* reported for every rank */
};

static int setup(void **unused)
{
    struct kp_coord_opts co = { .agent_grace_ms = AGENT_GRACE_MS };
    struct kp_rpc_server_opts so = { .listen = "127.0.0.1:0", .name = "test-collectord" };
    char err[512] = "", target[64];

    kp_test_pg_fresh_db("kprof_test_coord", env.conninfo, sizeof(env.conninfo));
    if (kp_pg_connect(env.conninfo, "kprof-test-coord", &env.db, err, sizeof(err)) != 0 ||
        kp_pg_migrate(env.db, err, sizeof(err)) < 0) {
        fail_msg("migrate: %s", err);
    }
    assert_int_equal(kp_coord_create(&co, &env.coord), 0);
    if (kp_control_create(env.conninfo, env.coord, &env.control, err, sizeof(err)) != 0) {
        fail_msg("control: %s", err);
    }
    kp_control_methods(env.control, env.methods);
    if (kp_rpc_server_create(&so, env.methods, KP_CONTROL_N_METHODS, &env.srv, err, sizeof(err)) !=
        0) {
        fail_msg("server: %s", err);
    }
    snprintf(target, sizeof(target), "127.0.0.1:%d", kp_rpc_server_port(env.srv));
    assert_int_equal(kp_rpc_channel_create(target, NULL, &env.ch, err, sizeof(err)), 0);
    return 0;
}

static int teardown(void **unused)
{
    kp_rpc_channel_destroy(env.ch);
    if (env.coord != NULL) {
        kp_coord_shutdown(env.coord);
    }
    if (env.srv != NULL) {
        kp_rpc_server_shutdown(env.srv, 1000);
    }
    kp_control_destroy(env.control);
    kp_rpc_server_destroy(env.srv);
    if (env.coord != NULL) {
        kp_coord_destroy(env.coord);
    }
    if (env.db != NULL) {
        PQfinish(env.db);
    }
    return 0;
}

/* --- the fake agent --- */

static void agent_report(struct fake_agent *a)
{
    Kprof__V1__AgentReport r = KPROF__V1__AGENT_REPORT__INIT;
    Kprof__V1__AgentProcess p[4], *pp[4];
    Kprof__V1__AgentCaptureRank q[4], *qp[4];
    size_t nq = 0;

    r.host = (char *) a->host;
    r.agent_id = a->id;
    r.version = (char *) "test";
    for (size_t i = 0; i < a->n; i++) {
        kprof__v1__agent_process__init(&p[i]);
        p[i].job = (char *) a->job;
        p[i].rank = a->ranks[i];
        p[i].local_rank = (int32_t) i;
        p[i].world_size = (uint32_t) a->n;
        p[i].pid = 1000 + (uint32_t) a->ranks[i];
        p[i].step = 100;
        p[i].step_ms = 10;
        pp[i] = &p[i];
        if (a->states[i] != 0) {
            kprof__v1__agent_capture_rank__init(&q[nq]);
            q[nq].run_id = a->run_id;
            q[nq].rank = a->ranks[i];
            q[nq].state = a->states[i];
            q[nq].pid = p[i].pid;
            q[nq].records = a->records;
            q[nq].first_step = -1;
            q[nq].last_step = -1;
            q[nq].reason = (char *) (a->states[i] == R_FAILED ? a->reason : "");
            qp[nq] = &q[nq];
            nq++;
        }
    }
    r.n_processes = a->n;
    r.processes = pp;
    r.n_ranks = nq;
    r.ranks = qp;
    assert_int_equal(kp_rpc_stream_send(a->s, &r.base), 0);
}

/* True once ListJobs shows the agent's job with all its ranks. */
static bool job_listed(void *arg)
{
    const struct fake_agent *a = arg;
    Kprof__V1__ListJobsRequest req = KPROF__V1__LIST_JOBS_REQUEST__INIT;
    Kprof__V1__ListJobsResponse *resp = NULL;
    struct kp_rpc_status st;
    bool listed = false;

    req.job = (char *) a->job;
    if (kp_rpc_unary(env.ch, "/kprof.v1.Control/ListJobs", &req.base,
                     &kprof__v1__list_jobs_response__descriptor, (ProtobufCMessage **) &resp, 10000,
                     &st) != 0) {
        fail_msg("ListJobs: %s %s", kp_rpc_status_name(st.code), st.details);
    }
    for (size_t i = 0; i < resp->n_jobs; i++) {
        listed |= strcmp(resp->jobs[i]->name, a->job) == 0 && resp->jobs[i]->n_ranks == a->n;
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return listed;
}

/* Attaches and reports; returns once the coordinator knows the job. */
static void agent_attach(struct fake_agent *a)
{
    struct kp_rpc_status st;

    assert_int_equal(kp_rpc_stream_open(env.ch, ATTACH_PATH,
                                        &kprof__v1__capture_command__descriptor, 0, &a->s, &st),
                     0);
    agent_report(a);
    assert_true(kp_test_wait_for(job_listed, a, 10000));
}

/* Sets every rank's state and reports. */
static void agent_all(struct fake_agent *a, int state)
{
    for (size_t i = 0; i < a->n; i++) {
        a->states[i] = state;
    }
    agent_report(a);
}

/* The next command of the given kind (others are skipped), owned; fails after 10 s. */
static Kprof__V1__CaptureCommand *agent_expect(struct fake_agent *a, int kind)
{
    long long end = kp_mono_ms() + kp_test_scaled_ms(10000);

    while (kp_mono_ms() < end) {
        ProtobufCMessage *m = NULL;
        Kprof__V1__CaptureCommand *c;

        if (kp_rpc_stream_recv(a->s, &m, 200) != 1) {
            continue;
        }
        c = (Kprof__V1__CaptureCommand *) m;
        if ((int) c->kind == kind) {
            return c;
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    fail_msg("agent %s: no command of kind %d", a->host, kind);
    return NULL;
}

static void agent_close(struct fake_agent *a)
{
    kp_rpc_stream_cancel(a->s);
    kp_rpc_stream_destroy(a->s);
    a->s = NULL;
}

/* --- kprofctl's side --- */

static Kprof__V1__Capture *start(const char *job, uint64_t deadline_ms)
{
    Kprof__V1__StartCaptureRequest req = KPROF__V1__START_CAPTURE_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    struct kp_rpc_status st;

    req.job = (char *) job;
    req.ranks = (char *) "all";
    req.steps = 2;
    req.deadline_ms = deadline_ms;
    if (kp_rpc_unary(env.ch, "/kprof.v1.Control/StartCapture", &req.base,
                     &kprof__v1__capture__descriptor, &resp, 10000, &st) != 0) {
        fail_msg("StartCapture %s: %s %s", job, kp_rpc_status_name(st.code), st.details);
    }
    return (Kprof__V1__Capture *) resp;
}

/* The capture of run_id as CaptureStatus tells it (owned response). */
static Kprof__V1__CaptureStatusResponse *status(uint64_t run_id)
{
    Kprof__V1__CaptureStatusRequest req = KPROF__V1__CAPTURE_STATUS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    struct kp_rpc_status st;

    req.run_id = run_id;
    if (kp_rpc_unary(env.ch, "/kprof.v1.Control/CaptureStatus", &req.base,
                     &kprof__v1__capture_status_response__descriptor, &resp, 10000, &st) != 0) {
        fail_msg("CaptureStatus %" PRIu64 ": %s %s", run_id, kp_rpc_status_name(st.code),
                 st.details);
    }
    assert_int_equal(((Kprof__V1__CaptureStatusResponse *) resp)->n_captures, 1);
    return (Kprof__V1__CaptureStatusResponse *) resp;
}

/* The state of rank in run_id's capture, or of the run itself (rank -1). */
static int state_of(uint64_t run_id, int32_t rank, char *reason, size_t len)
{
    Kprof__V1__CaptureStatusResponse *r = status(run_id);
    const Kprof__V1__Capture *k = r->captures[0];
    int st = -1;

    if (rank < 0) {
        st = (int) k->run->state;
    }
    for (size_t i = 0; rank >= 0 && i < k->n_ranks; i++) {
        if (k->ranks[i]->rank == rank) {
            st = (int) k->ranks[i]->state;
            if (reason != NULL) {
                snprintf(reason, len, "%s", k->ranks[i]->reason);
            }
        }
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return st;
}

/* The records CaptureStatus shows for rank of run_id. */
static uint64_t records_of(uint64_t run_id, int32_t rank)
{
    Kprof__V1__CaptureStatusResponse *r = status(run_id);
    const Kprof__V1__Capture *k = r->captures[0];
    uint64_t n = 0;

    for (size_t i = 0; i < k->n_ranks; i++) {
        if (k->ranks[i]->rank == rank) {
            n = k->ranks[i]->records;
        }
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return n;
}

struct wait_state {
    uint64_t run_id;
    int32_t rank;
    int want;
};

static bool state_is(void *arg)
{
    const struct wait_state *w = arg;

    return state_of(w->run_id, w->rank, NULL, 0) == w->want;
}

/* Waits until the rank (or the run: rank -1) is in state want. */
static void wait_state(uint64_t run_id, int32_t rank, int want)
{
    struct wait_state w = { run_id, rank, want };

    if (!kp_test_wait_for(state_is, &w, 10000)) {
        fail_msg("run %" PRIu64 " rank %d: state %d, not %d", run_id, (int) rank,
                 state_of(run_id, rank, NULL, 0), want);
    }
}

/* Starts a capture of the agent's job and takes its ARM. Returns the run id. */
static uint64_t start_armed(struct fake_agent *a, uint64_t deadline_ms)
{
    Kprof__V1__Capture *k = start(a->job, deadline_ms);
    Kprof__V1__CaptureCommand *arm;
    uint64_t run_id = k->run->id;

    assert_true(run_id > 0);
    assert_int_equal(k->run->state, KPROF__V1__RUN_STATE__RUN_STATE_OPEN);
    assert_int_equal(k->n_ranks, a->n);
    protobuf_c_message_free_unpacked(&k->base, NULL);
    arm = agent_expect(a, CMD_ARM);
    assert_int_equal(arm->run_id, run_id);
    assert_string_equal(arm->job, a->job);
    assert_int_equal(arm->n_ranks, a->n);
    assert_true(arm->start_step > 100); /* ahead of the step the processes reported */
    assert_int_equal(arm->steps, 2);
    protobuf_c_message_free_unpacked(&arm->base, NULL);
    a->run_id = run_id;
    return run_id;
}

/* --- the transitions --- */

static void test_lifecycle(void **unused)
{
    struct fake_agent a = { .host = "node-a",
                            .id = 11,
                            .job = "coord-life",
                            .ranks = { 0, 1 },
                            .n = 2 };
    Kprof__V1__CaptureCommand *forget;
    uint64_t run;

    agent_attach(&a);
    run = start_armed(&a, 0);
    assert_int_equal(state_of(run, 0, NULL, 0), R_PENDING);
    agent_all(&a, R_CAPTURING);
    wait_state(run, 0, R_CAPTURING);
    wait_state(run, 1, R_CAPTURING);
    /* An older picture (PENDING) never moves a rank back; a newer count of records in the
     * same report is taken, so once it shows, the report was applied. */
    a.records = 77;
    agent_all(&a, R_PENDING);
    a.records = 78;
    a.states[0] = R_CAPTURING;
    agent_report(&a);
    for (int i = 0; i < 1000 && records_of(run, 0) != 78; i++) {
        usleep(10000);
    }
    assert_int_equal(records_of(run, 0), 78);
    assert_int_equal(state_of(run, 1, NULL, 0), R_CAPTURING);
    a.states[0] = R_DONE;
    agent_report(&a);
    wait_state(run, 0, R_DONE);
    assert_int_equal(state_of(run, -1, NULL, 0), KPROF__V1__RUN_STATE__RUN_STATE_OPEN);
    a.states[1] = R_DONE;
    agent_report(&a);
    wait_state(run, -1, KPROF__V1__RUN_STATE__RUN_STATE_ENDED);
    forget = agent_expect(&a, CMD_FORGET);
    assert_int_equal(forget->run_id, run);
    protobuf_c_message_free_unpacked(&forget->base, NULL);
    assert_int_equal(kp_test_pg_int(env.db, "SELECT state FROM runs WHERE id = %" PRIu64, run), 2);
    assert_int_equal(kp_test_pg_int(env.db,
                                    "SELECT count(*) FROM capture_ranks WHERE run_id = %" PRIu64
                                    " AND state = 4",
                                    run),
                     2);
    agent_close(&a);
}

static void test_failed_rank(void **unused)
{
    struct fake_agent a = { .host = "node-f",
                            .id = 12,
                            .job = "coord-fail",
                            .ranks = { 0, 1 },
                            .n = 2,
                            .reason = "CUDA out of memory in the window" };
    char reason[256];
    uint64_t run;

    agent_attach(&a);
    run = start_armed(&a, 0);
    a.states[0] = R_FAILED;
    a.states[1] = R_DONE;
    agent_report(&a);
    wait_state(run, -1, KPROF__V1__RUN_STATE__RUN_STATE_FAILED);
    assert_int_equal(state_of(run, 0, reason, sizeof(reason)), R_FAILED);
    assert_string_equal(reason, a.reason);
    assert_int_equal(state_of(run, 1, NULL, 0), R_DONE);
    assert_int_equal(kp_test_pg_int(env.db, "SELECT state FROM runs WHERE id = %" PRIu64, run), 3);
    agent_close(&a);
}

static void test_deadline(void **unused)
{
    struct fake_agent a = { .host = "node-d",
                            .id = 13,
                            .job = "coord-deadline",
                            .ranks = { 0 },
                            .n = 1 };
    Kprof__V1__CaptureCommand *stop;
    char reason[1024];
    uint64_t run;

    agent_attach(&a);
    run = start_armed(&a, 300);
    agent_all(&a, R_CAPTURING);
    stop = agent_expect(&a, CMD_STOP);
    assert_int_equal(stop->run_id, run);
    assert_string_equal(stop->reason, "deadline passed");
    protobuf_c_message_free_unpacked(&stop->base, NULL);
    wait_state(run, -1, KPROF__V1__RUN_STATE__RUN_STATE_FAILED);
    assert_int_equal(state_of(run, 0, reason, sizeof(reason)), R_FAILED);
    assert_non_null(strstr(reason, "the capture's deadline passed while the rank was capturing"));
    agent_close(&a);
}

static void test_agent_lost(void **unused)
{
    struct fake_agent a = { .host = "node-lost",
                            .id = 14,
                            .job = "coord-lost",
                            .ranks = { 0, 1 },
                            .n = 2 };
    char reason[1024];
    long long t0;
    uint64_t run;

    agent_attach(&a);
    run = start_armed(&a, 0);
    agent_all(&a, R_CAPTURING);
    wait_state(run, 1, R_CAPTURING);
    agent_close(&a);
    t0 = kp_mono_ms();
    wait_state(run, -1, KPROF__V1__RUN_STATE__RUN_STATE_FAILED);
    assert_true(kp_mono_ms() - t0 >= AGENT_GRACE_MS - 50); /* not before the grace */
    assert_int_equal(state_of(run, 1, reason, sizeof(reason)), R_FAILED);
    assert_non_null(strstr(reason, "lost contact with the kprof-agent on host node-lost"));
}

static void test_stop(void **unused)
{
    struct fake_agent a = { .host = "node-s",
                            .id = 15,
                            .job = "coord-stop",
                            .ranks = { 0 },
                            .n = 1 };
    Kprof__V1__StopCaptureRequest req = KPROF__V1__STOP_CAPTURE_REQUEST__INIT;
    Kprof__V1__CaptureCommand *stop;
    ProtobufCMessage *resp = NULL;
    struct kp_rpc_status st;
    uint64_t run;

    agent_attach(&a);
    run = start_armed(&a, 0);
    agent_all(&a, R_CAPTURING);
    req.run_id = run;
    assert_int_equal(kp_rpc_unary(env.ch, "/kprof.v1.Control/StopCapture", &req.base,
                                  &kprof__v1__capture__descriptor, &resp, 10000, &st),
                     0);
    assert_true(((Kprof__V1__Capture *) resp)->stopped);
    protobuf_c_message_free_unpacked(resp, NULL);
    stop = agent_expect(&a, CMD_STOP);
    assert_int_equal(stop->run_id, run);
    protobuf_c_message_free_unpacked(&stop->base, NULL);
    assert_int_equal(state_of(run, -1, NULL, 0), KPROF__V1__RUN_STATE__RUN_STATE_OPEN);
    agent_all(&a, R_DONE);
    wait_state(run, -1, KPROF__V1__RUN_STATE__RUN_STATE_ENDED);
    agent_close(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle), cmocka_unit_test(test_failed_rank),
        cmocka_unit_test(test_deadline),  cmocka_unit_test(test_agent_lost),
        cmocka_unit_test(test_stop),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
