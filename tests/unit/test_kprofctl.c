/*
 * Unit tests for kprofctl's capture verbs (rpcverb.h, capview.h, jobs/start/stop/status):
 *  - the pure parts: gRPC status to exit status, --ranks checking, rank lists and durations
 *    as text, state names, a capture's progress, the status rows and the capture JSON built
 *    from Capture messages made here, the start summary line;
 *  - the verbs end to end against a fake Control service (kp_rpc_server on 127.0.0.1:0)
 *    that answers canned messages and error statuses: output on stdout and stderr, exit
 *    statuses, start --wait and status --watch polling until a capture is over, SIGINT;
 *  - every verb exits 5 with the "is kprof-collectord running" hint when nothing listens,
 *    and 2 on bad flags;
 *  - kp_rpcverb_main's flags: --run required, run_id and rank set in the request and named
 *    when it is refused (through an in-process Analyzer), a spec that does not fit exits 1.
 * Links kp_kprofctl_core (tests/CMakeLists.txt).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capview.h"
#include "kp_rpc.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

#define T0_NS 1700000000000000000LL /* 2023-11-14T22:13:20Z */

/* ---- Capture messages built in the test ---- */

struct cap_buf {
    Kprof__V1__Run run;
    Kprof__V1__Capture cap;
    Kprof__V1__CaptureRank ranks[4];
    Kprof__V1__CaptureRank *rank_ptrs[4];
};

/* A capture of job (run id) with n ranks on hosts n1 (even ranks) and n2 (odd), all in
 * state, listed in reverse rank order to check the sorting. */
static void cap_init(struct cap_buf *b, uint64_t id, const char *job, size_t n,
                     Kprof__V1__RankState state)
{
    static char *hosts[] = { "n1", "n2" };
    Kprof__V1__Run run = KPROF__V1__RUN__INIT;
    Kprof__V1__Capture cap = KPROF__V1__CAPTURE__INIT;

    memset(b, 0, sizeof(*b));
    b->run = run;
    b->run.id = id;
    b->run.job = (char *) job;
    b->run.state = KPROF__V1__RUN_STATE__RUN_STATE_OPEN;
    b->run.source = KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE;
    b->run.world_size = 4;
    b->run.created_ns = T0_NS;
    b->cap = cap;
    b->cap.run = &b->run;
    b->cap.start_step = 120;
    b->cap.steps = 5;
    b->cap.activities = "all";
    b->cap.deadline_ns = T0_NS + 600000000000LL;
    for (size_t i = 0; i < n; i++) {
        Kprof__V1__CaptureRank r = KPROF__V1__CAPTURE_RANK__INIT;
        int32_t rank = (int32_t) (n - 1 - i);

        b->ranks[i] = r;
        b->ranks[i].rank = rank;
        b->ranks[i].host = hosts[rank % 2];
        b->ranks[i].pid = 1000 + (uint32_t) rank;
        b->ranks[i].state = state;
        b->ranks[i].first_step = -1;
        b->ranks[i].last_step = -1;
        b->rank_ptrs[i] = &b->ranks[i];
    }
    b->cap.n_ranks = n;
    b->cap.ranks = b->rank_ptrs;
}

/* The rank numbered rank in b. */
static Kprof__V1__CaptureRank *cap_rank(struct cap_buf *b, int32_t rank)
{
    for (size_t i = 0; i < b->cap.n_ranks; i++) {
        if (b->ranks[i].rank == rank) {
            return &b->ranks[i];
        }
    }
    fail_msg("no rank %d", rank);
    return NULL;
}

/* Every rank DONE with records and its window, the run ended; rank 2 FAILED if fail. */
static void cap_finish(struct cap_buf *b, bool fail)
{
    for (size_t i = 0; i < b->cap.n_ranks; i++) {
        b->ranks[i].state = KPROF__V1__RANK_STATE__RANK_STATE_DONE;
        b->ranks[i].records = 100 + (uint64_t) b->ranks[i].rank;
        b->ranks[i].first_step = 120;
        b->ranks[i].last_step = 124;
    }
    b->run.state = KPROF__V1__RUN_STATE__RUN_STATE_ENDED;
    b->run.ended_ns = T0_NS + 60000000000LL;
    if (fail) {
        Kprof__V1__CaptureRank *r = cap_rank(b, 2);

        r->state = KPROF__V1__RANK_STATE__RANK_STATE_FAILED;
        r->reason = "process 1002 exited during the window";
        r->last_step = 122;
        r->dropped = 7;
    }
}

static char *render(const struct kp_table *t, enum kp_table_format f)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);

    assert_non_null(out);
    assert_int_equal(kp_table_print(t, f, 0, out), 0);
    fclose(out);
    return buf;
}

/* ---- pure parts ---- */

static void test_exit_codes(void **state)
{
    static const struct {
        grpc_status_code code;
        int exit;
    } cases[] = {
        { GRPC_STATUS_OK, 0 },
        { GRPC_STATUS_INVALID_ARGUMENT, KPROFCTL_EXIT_USAGE },
        { GRPC_STATUS_OUT_OF_RANGE, KPROFCTL_EXIT_USAGE },
        { GRPC_STATUS_NOT_FOUND, KPROFCTL_EXIT_NOT_FOUND },
        { GRPC_STATUS_ALREADY_EXISTS, KPROFCTL_EXIT_BUSY },
        { GRPC_STATUS_UNAVAILABLE, KPROFCTL_EXIT_UNREACHABLE },
        { GRPC_STATUS_DEADLINE_EXCEEDED, KPROFCTL_EXIT_UNREACHABLE },
        { GRPC_STATUS_FAILED_PRECONDITION, KPROFCTL_EXIT_NO_AGENT },
        { GRPC_STATUS_UNIMPLEMENTED, KPROFCTL_EXIT_FAILED },
        { GRPC_STATUS_INTERNAL, KPROFCTL_EXIT_FAILED },
        { GRPC_STATUS_PERMISSION_DENIED, KPROFCTL_EXIT_REFUSED },
        { GRPC_STATUS_UNAUTHENTICATED, KPROFCTL_EXIT_REFUSED },
        { GRPC_STATUS_RESOURCE_EXHAUSTED, KPROFCTL_EXIT_FAILED },
        { GRPC_STATUS_UNKNOWN, KPROFCTL_EXIT_FAILED },
    };

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(kp_rpcverb_exit_code(cases[i].code), cases[i].exit);
    }
    assert_int_equal(KPROFCTL_EXIT_UNREACHABLE, 5);
    assert_int_equal(KPROFCTL_EXIT_NO_AGENT, 6);
    assert_int_equal(KPROFCTL_EXIT_REFUSED, 7);
}

/* Exit 7's message: the role a refused call needs, and the flag or file to look at. */
static void test_refused_hint(void **state)
{
    struct kp_rpcverb_creds none = { NULL, NULL, NULL, NULL };
    struct kp_rpcverb_creds tok = { "ca.pem", NULL, NULL, "/home/u/.kprof/token" };
    const char *h;

    (void) state;
    h = kp_rpcverb_refused_hint(GRPC_STATUS_PERMISSION_DENIED, false, "StopCapture", &tok);
    assert_non_null(strstr(h, "StopCapture needs the operator role"));
    assert_non_null(strstr(h, "--token-file (KPROF_TOKEN_FILE)"));
    h = kp_rpcverb_refused_hint(GRPC_STATUS_PERMISSION_DENIED, false, "ListRuns", &tok);
    assert_non_null(strstr(h, "ListRuns needs the viewer role"));
    h = kp_rpcverb_refused_hint(GRPC_STATUS_PERMISSION_DENIED, true, "Export", &tok);
    assert_non_null(strstr(h, "Export needs the viewer role"));
    h = kp_rpcverb_refused_hint(GRPC_STATUS_UNAUTHENTICATED, false, "ListRuns", &tok);
    assert_non_null(strstr(h, "the token in /home/u/.kprof/token"));
    h = kp_rpcverb_refused_hint(GRPC_STATUS_UNAUTHENTICATED, false, "StartCapture", &none);
    assert_non_null(strstr(h, "sent none: give --token-file (KPROF_TOKEN_FILE)"));
    assert_non_null(strstr(h, "a token of the operator role"));
    assert_string_equal(kp_rpcverb_refused_hint(GRPC_STATUS_NOT_FOUND, false, "ListRuns", &tok),
                        "");
}

static void test_short_flags(void **state)
{
    char *argv[] = { "runs", "-c", "id,job", "-w12", "--json", "-w=3", "--", "-c", NULL };
    char *out[9];
    char buf[64];

    (void) state;
    assert_int_equal(kp_rpcverb_short_flags(8, argv, out, buf, sizeof(buf)), 0);
    assert_string_equal(out[0], "runs");
    assert_string_equal(out[1], "--columns");
    assert_string_equal(out[2], "id,job");
    assert_string_equal(out[3], "--width=12");
    assert_string_equal(out[4], "--json");
    assert_string_equal(out[5], "--width=3");
    assert_string_equal(out[6], "--");
    assert_string_equal(out[7], "-c"); /* after "--": untouched */
    assert_null(out[8]);
    assert_int_equal(kp_rpcverb_short_flags(8, argv, out, buf, 8), -ENOSPC);
}

static void test_ranks_check(void **state)
{
    static const char *good[] = {
        "all", "0", "7", "0,3-5", "3-3", "0-1048575", "1,1,1", "10-12,0"
    };
    static const struct {
        const char *s;
        const char *why;
    } bad[] = {
        { "", "empty" },
        { "ALL", "\"ALL\" is not a rank" },
        { "a", "\"a\" is not a rank" },
        { "0,,2", "empty entry" },
        { "0,", "empty entry" },
        { ",1", "empty entry" },
        { "-1", "\"-1\" is not a rank" },
        { "1-", "\"1-\" is not a rank" },
        { "3-1", "a range must go up (e.g. 1-3)" },
        { "1 ,2", "\"1 \" is not a rank" },
        { "1-2-3", "\"1-2-3\" is not a rank" },
        { "+1", "\"+1\" is not a rank" },
        { "1048576", "a rank is at most 1048575" },
        { "0-99999999999999999999", "a rank is at most" },
        { "0x10", "\"0x10\" is not a rank" },
    };
    char err[256];

    (void) state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        err[0] = '\0';
        assert_int_equal(kp_capview_ranks_check(good[i], err, sizeof(err)), 0);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(kp_capview_ranks_check(bad[i].s, err, sizeof(err)), -EINVAL);
        if (strstr(err, bad[i].why) == NULL) {
            fail_msg("ranks \"%s\": error \"%s\" lacks \"%s\"", bad[i].s, err, bad[i].why);
        }
    }
    assert_int_equal(kp_capview_ranks_check(NULL, err, sizeof(err)), -EINVAL);
}

static void test_ranks_format(void **state)
{
    static const int32_t a[] = { 3, 0, 2, 1, 7, 9, 8, 5 };
    static const int32_t dup[] = { 4, 4, 5, 5, 6 };
    static const int32_t one[] = { 42 };
    int32_t many[200];
    char buf[64], tiny[8];

    (void) state;
    assert_string_equal(kp_capview_ranks_format(a, 8, buf, sizeof(buf)), "0-3,5,7-9");
    assert_string_equal(kp_capview_ranks_format(dup, 5, buf, sizeof(buf)), "4-6");
    assert_string_equal(kp_capview_ranks_format(one, 1, buf, sizeof(buf)), "42");
    assert_string_equal(kp_capview_ranks_format(NULL, 0, buf, sizeof(buf)), "");
    /* Every other rank: cut with "..." and still NUL-terminated within the buffer. */
    for (int i = 0; i < 200; i++) {
        many[i] = 2 * i;
    }
    kp_capview_ranks_format(many, 200, buf, sizeof(buf));
    assert_true(strlen(buf) < sizeof(buf));
    assert_non_null(strstr(buf, "..."));
    assert_int_equal(strncmp(buf, "0,2,4,", 6), 0);
    kp_capview_ranks_format(many, 200, tiny, sizeof(tiny));
    assert_true(strlen(tiny) < sizeof(tiny));
    assert_non_null(strstr(tiny, "..."));
}

static void test_duration_format(void **state)
{
    static const struct {
        uint64_t ms;
        const char *s;
    } cases[] = {
        { 0, "0s" },
        { 1, "1ms" },
        { 500, "500ms" },
        { 1000, "1s" },
        { 1500, "1s500ms" },
        { 30000, "30s" },
        { 90000, "1m30s" },
        { 3600000, "1h" },
        { 5400000, "1h30m" },
        { 86400000, "1d" },
        { 90061001, "1d1h1m1s1ms" },
    };
    char buf[64];
    long long back;

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_string_equal(kp_capview_duration_format(cases[i].ms, buf, sizeof(buf)), cases[i].s);
        /* kprofctl's flags read it back. */
        assert_int_equal(kp_parse_duration_ms(buf, &back), 0);
        assert_int_equal(back, (long long) cases[i].ms);
    }
}

static void test_state_names(void **state)
{
    (void) state;
    assert_string_equal(kp_capview_rank_state_name(KPROF__V1__RANK_STATE__RANK_STATE_PENDING),
                        "pending");
    assert_string_equal(kp_capview_rank_state_name(KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING),
                        "capturing");
    assert_string_equal(kp_capview_rank_state_name(KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING),
                        "flushing");
    assert_string_equal(kp_capview_rank_state_name(KPROF__V1__RANK_STATE__RANK_STATE_DONE), "done");
    assert_string_equal(kp_capview_rank_state_name(KPROF__V1__RANK_STATE__RANK_STATE_FAILED),
                        "failed");
    assert_string_equal(kp_capview_rank_state_name(KPROF__V1__RANK_STATE__RANK_STATE_UNSPECIFIED),
                        "unknown");
    assert_string_equal(kp_capview_rank_state_name((Kprof__V1__RankState) 99), "unknown");
    assert_string_equal(kp_rpcverb_run_state_name(KPROF__V1__RUN_STATE__RUN_STATE_OPEN), "open");
    assert_string_equal(kp_rpcverb_run_state_name(KPROF__V1__RUN_STATE__RUN_STATE_ENDED), "ended");
    assert_string_equal(kp_rpcverb_run_state_name(KPROF__V1__RUN_STATE__RUN_STATE_FAILED),
                        "failed");
    assert_string_equal(kp_rpcverb_run_state_name(KPROF__V1__RUN_STATE__RUN_STATE_UNSPECIFIED),
                        "unknown");
}

static void test_progress(void **state)
{
    struct cap_buf b;

    (void) state;
    cap_init(&b, 17, "ddp", 4, KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING);
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_RUNNING);
    /* Some done, one still flushing: running. */
    cap_finish(&b, false);
    b.run.state = KPROF__V1__RUN_STATE__RUN_STATE_OPEN;
    cap_rank(&b, 1)->state = KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING;
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_RUNNING);
    /* All done while the run is still open: done. */
    cap_rank(&b, 1)->state = KPROF__V1__RANK_STATE__RANK_STATE_DONE;
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_DONE);
    /* One failed: over and failed. */
    cap_rank(&b, 3)->state = KPROF__V1__RANK_STATE__RANK_STATE_FAILED;
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_FAILED);
    /* The run ended with a rank left pending: it never will finish. */
    cap_rank(&b, 3)->state = KPROF__V1__RANK_STATE__RANK_STATE_PENDING;
    b.run.state = KPROF__V1__RUN_STATE__RUN_STATE_ENDED;
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_FAILED);
    /* Every rank done but the run failed. */
    cap_rank(&b, 3)->state = KPROF__V1__RANK_STATE__RANK_STATE_DONE;
    b.run.state = KPROF__V1__RUN_STATE__RUN_STATE_FAILED;
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_FAILED);
    /* No ranks: over only once the run is. */
    cap_init(&b, 18, "ddp", 0, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_RUNNING);
    b.run.state = KPROF__V1__RUN_STATE__RUN_STATE_ENDED;
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_DONE);
    /* No run at all (a malformed answer) and no ranks: still running, never a crash. */
    b.cap.run = NULL;
    assert_int_equal(kp_capview_progress(&b.cap), KP_CAPVIEW_RUNNING);
}

static void test_status_rows(void **state)
{
    struct cap_buf a, b;
    Kprof__V1__Capture *caps[2] = { &a.cap, &b.cap };
    Kprof__V1__CaptureStatusResponse resp = KPROF__V1__CAPTURE_STATUS_RESPONSE__INIT;
    struct kp_table *t = NULL;
    char *s;

    (void) state;
    cap_init(&a, 17, "ddp", 4, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    cap_finish(&a, true);
    cap_rank(&a, 0)->pid = 0;   /* unknown */
    cap_rank(&a, 1)->host = ""; /* unknown */
    cap_init(&b, 18, "we,ird \"job\"", 1, KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING);
    b.ranks[0].first_step = 7; /* the end not known yet */
    resp.n_captures = 2;
    resp.captures = caps;
    assert_int_equal(kp_table_create(kp_capview_cols, KP_CAPVIEW_N_COLS, &t), 0);
    assert_int_equal(kp_capview_add_response(t, &resp), 0);
    assert_int_equal(kp_table_rows(t), 5);
    s = render(t, KP_TABLE_FORMAT_CSV);
    assert_string_equal(s, "run,job,run_state,rank,host,pid,state,records,dropped,steps,reason\n"
                           "17,ddp,ended,0,n1,,done,100,0,120-124,\n"
                           "17,ddp,ended,1,,1001,done,101,0,120-124,\n"
                           "17,ddp,ended,2,n1,1002,failed,102,7,120-122,process 1002 exited "
                           "during the window\n"
                           "17,ddp,ended,3,n2,1003,done,103,0,120-124,\n"
                           "18,\"we,ird \"\"job\"\"\",open,0,n1,1000,capturing,0,0,7-,\n");
    free(s);
    s = render(t, KP_TABLE_FORMAT_JSON);
    assert_non_null(strstr(s, "{\"run\": 17, \"job\": \"ddp\", \"run_state\": \"ended\", "
                              "\"rank\": 0, \"host\": \"n1\", \"pid\": null, \"state\": \"done\", "
                              "\"records\": 100, \"dropped\": 0, \"steps\": \"120-124\", "
                              "\"reason\": null}"));
    assert_non_null(strstr(s, "\"rank\": 1, \"host\": null, \"pid\": 1001"));
    free(s);
    kp_table_destroy(t);
    /* A rank not started yet: steps NULL. */
    cap_init(&a, 19, "ddp", 1, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    assert_int_equal(kp_table_create(kp_capview_cols, KP_CAPVIEW_N_COLS, &t), 0);
    assert_int_equal(kp_capview_add_rows(t, &a.cap), 0);
    assert_int_equal(kp_table_select(t, "state,steps,reason", NULL, 0), 0);
    s = render(t, KP_TABLE_FORMAT_CSV);
    assert_string_equal(s, "state,steps,reason\npending,,\n");
    free(s);
    kp_table_destroy(t);
    assert_int_equal(kp_capview_add_rows(NULL, &a.cap), -EINVAL);
}

static char *capture_json(const Kprof__V1__Capture *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);

    assert_non_null(out);
    assert_int_equal(kp_capview_write_json(c, out), 0);
    fclose(out);
    return buf;
}

static void test_capture_json(void **state)
{
    struct cap_buf b;
    char *s;

    (void) state;
    cap_init(&b, 17, "ddp\t\"42\"", 2, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    s = capture_json(&b.cap);
    assert_string_equal(
        s,
        "{\"run\": 17, \"job\": \"ddp\\t\\\"42\\\"\", \"name\": null, \"run_state\": \"open\", "
        "\"start_step\": 120, \"steps\": 5, \"duration_ms\": 0, \"activities\": \"all\", "
        "\"created\": \"2023-11-14T22:13:20Z\", \"ended\": null, "
        "\"deadline\": \"2023-11-14T22:23:20Z\", \"stopped\": false, \"hosts\": 2, \"ranks\": [\n"
        "  {\"rank\": 0, \"host\": \"n1\", \"pid\": 1000, \"state\": \"pending\", \"records\": "
        "0, \"dropped\": 0, \"steps\": null, \"first_step\": null, \"last_step\": null, "
        "\"reason\": null},\n"
        "  {\"rank\": 1, \"host\": \"n2\", \"pid\": 1001, \"state\": \"pending\", \"records\": "
        "0, \"dropped\": 0, \"steps\": null, \"first_step\": null, \"last_step\": null, "
        "\"reason\": null}\n"
        "]}\n");
    free(s);
    /* A time window that was stopped, named, with a failed rank; no ranks at all. */
    cap_init(&b, 20, "j", 4, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    cap_finish(&b, true);
    b.cap.start_step = -1;
    b.cap.steps = 0;
    b.cap.duration_ms = 30000;
    b.cap.stopped = true;
    b.run.name = "nightly";
    s = capture_json(&b.cap);
    assert_non_null(strstr(s, "\"name\": \"nightly\", \"run_state\": \"ended\", \"start_step\": "
                              "null, \"steps\": 0, \"duration_ms\": 30000"));
    assert_non_null(strstr(s, "\"ended\": \"2023-11-14T22:14:20Z\""));
    assert_non_null(strstr(s, "\"stopped\": true"));
    assert_non_null(strstr(s, "\"state\": \"failed\", \"records\": 102, \"dropped\": 7, \"steps\": "
                              "\"120-122\", \"first_step\": 120, \"last_step\": 122, \"reason\": "
                              "\"process 1002 exited during the window\"}"));
    free(s);
    cap_init(&b, 21, "j", 0, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    s = capture_json(&b.cap);
    assert_non_null(strstr(s, "\"hosts\": 0, \"ranks\": []}\n"));
    free(s);
}

static void test_summary(void **state)
{
    struct cap_buf b;
    char buf[512];

    (void) state;
    cap_init(&b, 17, "ddp-42", 4, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    assert_string_equal(kp_capview_summary(&b.cap, buf, sizeof(buf)),
                        "run 17: capturing job ddp-42, ranks 0-3 (4 on 2 hosts), steps 120..124");
    b.cap.duration_ms = 30000;
    assert_string_equal(kp_capview_summary(&b.cap, buf, sizeof(buf)),
                        "run 17: capturing job ddp-42, ranks 0-3 (4 on 2 hosts), steps "
                        "120..124, at most 30s");
    b.cap.start_step = -1;
    b.cap.steps = 0;
    assert_string_equal(kp_capview_summary(&b.cap, buf, sizeof(buf)),
                        "run 17: capturing job ddp-42, ranks 0-3 (4 on 2 hosts), for 30s");
    cap_init(&b, 5, "solo", 1, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    b.ranks[0].rank = 3;
    b.ranks[0].host = "gpu7";
    assert_string_equal(kp_capview_summary(&b.cap, buf, sizeof(buf)),
                        "run 5: capturing job solo, rank 3 on gpu7, steps 120..124");
    cap_init(&b, 6, "two", 2, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
    b.ranks[0].host = "n1";
    b.ranks[1].host = "n1";
    assert_string_equal(kp_capview_summary(&b.cap, buf, sizeof(buf)),
                        "run 6: capturing job two, ranks 0-1 (2 on 1 host), steps 120..124");
    /* A short buffer is cut, never overrun. */
    assert_true(strlen(kp_capview_summary(&b.cap, buf, 10)) == 9);
}

/* ---- the verbs against a fake Control service ---- */

struct fake {
    struct kp_rpc_server *srv;
    struct kp_rpc_method methods[5];
    char addr[64];
    pthread_mutex_t mu;
    /* CaptureStatus: how the capture goes */
    int polls;          /* CaptureStatus calls so far */
    int done_after;     /* the capture is over from this poll on (0: never) */
    bool fail_rank;     /* it ends with rank 2 FAILED */
    int sigint_at_poll; /* raise SIGINT at this poll (0: never) */
    struct start_seen {
        char ranks[64];
        char activities[64];
        char name[64];
        uint32_t steps;
        uint64_t duration_ms;
        uint64_t deadline_ms;
    } start; /* what the last StartCapture asked */
};

static void on_list_jobs(struct kp_rpc_call *call, ProtobufCMessage *msg, void *ud)
{
    Kprof__V1__ListJobsRequest *req = (Kprof__V1__ListJobsRequest *) msg;
    Kprof__V1__ListJobsResponse resp = KPROF__V1__LIST_JOBS_RESPONSE__INIT;
    Kprof__V1__Job jobs[2] = { KPROF__V1__JOB__INIT, KPROF__V1__JOB__INIT };
    Kprof__V1__Job *job_ptrs[2] = { &jobs[0], &jobs[1] };
    Kprof__V1__JobRank ranks[3] = { KPROF__V1__JOB_RANK__INIT, KPROF__V1__JOB_RANK__INIT,
                                    KPROF__V1__JOB_RANK__INIT };
    Kprof__V1__JobRank *b_ranks[2] = { &ranks[0], &ranks[1] };
    Kprof__V1__JobRank *a_ranks[1] = { &ranks[2] };

    (void) ud;
    /* Job "b" first and its ranks backwards: kprofctl sorts. */
    jobs[0].name = "b";
    jobs[0].world_size = 2;
    jobs[0].hosts = 1;
    jobs[0].n_ranks = 2;
    jobs[0].ranks = b_ranks;
    ranks[0].rank = 1;
    ranks[0].host = "n1";
    ranks[0].pid = 11;
    ranks[0].local_rank = 1;
    ranks[0].device = 1;
    ranks[0].step = -1;
    ranks[1].rank = 0;
    ranks[1].host = "n1";
    ranks[1].pid = 10;
    ranks[1].local_rank = 0;
    ranks[1].device = 0;
    ranks[1].step = 42;
    ranks[1].step_ms = 250;
    jobs[1].name = "a";
    jobs[1].world_size = 1;
    jobs[1].hosts = 1;
    jobs[1].run_id = 17;
    jobs[1].n_ranks = 1;
    jobs[1].ranks = a_ranks;
    ranks[2].rank = 0;
    ranks[2].host = "n2";
    ranks[2].pid = 20;
    ranks[2].local_rank = -1;
    ranks[2].device = -1;
    ranks[2].step = 1000;
    ranks[2].step_ms = 90;
    ranks[2].run_id = 17;
    if (strcmp(req->job, "") == 0) {
        resp.n_jobs = 2;
        resp.jobs = job_ptrs;
    }
    else if (strcmp(req->job, "a") == 0) {
        resp.n_jobs = 1;
        resp.jobs = &job_ptrs[1];
    }
    protobuf_c_message_free_unpacked(msg, NULL);
    kp_rpc_call_reply(call, &resp.base);
}

static void on_start(struct kp_rpc_call *call, ProtobufCMessage *msg, void *ud)
{
    Kprof__V1__StartCaptureRequest *req = (Kprof__V1__StartCaptureRequest *) msg;
    struct fake *f = ud;
    struct cap_buf b;

    pthread_mutex_lock(&f->mu);
    snprintf(f->start.ranks, sizeof(f->start.ranks), "%s", req->ranks);
    snprintf(f->start.activities, sizeof(f->start.activities), "%s", req->activities);
    snprintf(f->start.name, sizeof(f->start.name), "%s", req->name);
    f->start.steps = req->steps;
    f->start.duration_ms = req->duration_ms;
    f->start.deadline_ms = req->deadline_ms;
    pthread_mutex_unlock(&f->mu);
    if (req->n_metrics > 0) {
        kp_rpc_call_finish(call, GRPC_STATUS_UNIMPLEMENTED,
                           "hardware counters are not captured yet: drop --metrics");
    }
    else if (strcmp(req->job, "missing") == 0) {
        kp_rpc_call_finish(call, GRPC_STATUS_NOT_FOUND,
                           "no job \"missing\" is registered: see kprofctl jobs");
    }
    else if (strcmp(req->job, "busy") == 0) {
        kp_rpc_call_finish(
            call, GRPC_STATUS_ALREADY_EXISTS,
            "rank 1 is capturing for run 16 already: wait, or kprofctl stop --run 16");
    }
    else if (strcmp(req->job, "noagent") == 0) {
        kp_rpc_call_finish(call, GRPC_STATUS_FAILED_PRECONDITION,
                           "rank 3 has no attached agent: check kprof-agent on n2");
    }
    else if (strcmp(req->ranks, "9") == 0) {
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "rank 9 is outside the world size 4");
    }
    else {
        cap_init(&b, 17, req->job, 4, KPROF__V1__RANK_STATE__RANK_STATE_PENDING);
        b.run.name = req->name;
        b.cap.duration_ms = req->duration_ms;
        kp_rpc_call_reply(call, &b.cap.base);
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_stop(struct kp_rpc_call *call, ProtobufCMessage *msg, void *ud)
{
    Kprof__V1__StopCaptureRequest *req = (Kprof__V1__StopCaptureRequest *) msg;
    struct cap_buf b;

    (void) ud;
    if (req->run_id == 17 || strcmp(req->job, "ddp") == 0) {
        cap_init(&b, 17, "ddp", 2, KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING);
        b.cap.stopped = true;
        kp_rpc_call_reply(call, &b.cap.base);
    }
    else {
        kp_rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, "no capture in progress for that");
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_status(struct kp_rpc_call *call, ProtobufCMessage *msg, void *ud)
{
    Kprof__V1__CaptureStatusRequest *req = (Kprof__V1__CaptureStatusRequest *) msg;
    Kprof__V1__CaptureStatusResponse resp = KPROF__V1__CAPTURE_STATUS_RESPONSE__INIT;
    Kprof__V1__Capture *caps[1];
    struct fake *f = ud;
    struct cap_buf b;
    int poll, done_after, sigint_at;
    bool fail;

    pthread_mutex_lock(&f->mu);
    poll = ++f->polls;
    done_after = f->done_after;
    fail = f->fail_rank;
    sigint_at = f->sigint_at_poll;
    pthread_mutex_unlock(&f->mu);
    if (req->run_id == 99) {
        kp_rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, "run 99 is not a capture");
        protobuf_c_message_free_unpacked(msg, NULL);
        return;
    }
    if (req->run_id == 0 && req->limit == 3) { /* "no capture yet" */
        kp_rpc_call_reply(call, &resp.base);
        protobuf_c_message_free_unpacked(msg, NULL);
        return;
    }
    cap_init(&b, 17, "ddp", 4, KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING);
    if (done_after > 0 && poll >= done_after) {
        cap_finish(&b, fail);
    }
    if (sigint_at > 0 && poll == sigint_at) {
        kill(getpid(), SIGINT);
    }
    caps[0] = &b.cap;
    resp.n_captures = 1;
    resp.captures = caps;
    kp_rpc_call_reply(call, &resp.base);
    protobuf_c_message_free_unpacked(msg, NULL);
}

/* Coordinator: the fake is the capture coordinator itself. */
static void on_coordinator(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    Kprof__V1__CoordinatorInfo in = KPROF__V1__COORDINATOR_INFO__INIT;

    (void) ud;
    protobuf_c_message_free_unpacked(req, NULL);
    in.elected = true;
    in.is_self = true;
    in.address = "fake";
    kp_rpc_call_reply(call, &in.base);
}

static int fake_setup(void **state)
{
    struct fake *f = calloc(1, sizeof(*f));
    struct kp_rpc_server_opts so;
    static const struct {
        const char *path;
        const ProtobufCMessageDescriptor *req;
        kp_rpc_request_cb *cb;
    } m[] = {
        { "/kprof.v1.Control/ListJobs", &kprof__v1__list_jobs_request__descriptor, on_list_jobs },
        { "/kprof.v1.Control/StartCapture", &kprof__v1__start_capture_request__descriptor,
          on_start },
        { "/kprof.v1.Control/StopCapture", &kprof__v1__stop_capture_request__descriptor, on_stop },
        { "/kprof.v1.Control/CaptureStatus", &kprof__v1__capture_status_request__descriptor,
          on_status },
        { "/kprof.v1.Control/Coordinator", &kprof__v1__coordinator_request__descriptor,
          on_coordinator },
    };
    char err[256];

    assert_non_null(f);
    pthread_mutex_init(&f->mu, NULL);
    for (size_t i = 0; i < 5; i++) {
        f->methods[i].path = m[i].path;
        f->methods[i].kind = KP_RPC_UNARY;
        f->methods[i].request = m[i].req;
        f->methods[i].on_request = m[i].cb;
        f->methods[i].ud = f;
    }
    memset(&so, 0, sizeof(so));
    so.listen = "127.0.0.1:0";
    so.name = "fake-collectord";
    if (kp_rpc_server_create(&so, f->methods, 5, &f->srv, err, sizeof(err)) != 0) {
        fail_msg("fake server: %s", err);
    }
    snprintf(f->addr, sizeof(f->addr), "127.0.0.1:%d", kp_rpc_server_port(f->srv));
    *state = f;
    return 0;
}

static int fake_teardown(void **state)
{
    struct fake *f = *state;

    kp_rpc_server_destroy(f->srv);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return 0;
}

/* How the next captures go (see struct fake); resets the poll count. */
static void fake_plan(struct fake *f, int done_after, bool fail_rank, int sigint_at_poll)
{
    pthread_mutex_lock(&f->mu);
    f->polls = 0;
    f->done_after = done_after;
    f->fail_rank = fail_rank;
    f->sigint_at_poll = sigint_at_poll;
    pthread_mutex_unlock(&f->mu);
}

static int fake_polls(struct fake *f)
{
    int n;

    pthread_mutex_lock(&f->mu);
    n = f->polls;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* A copy of what the last StartCapture asked, read under the lock. */
static struct start_seen fake_last_start(struct fake *f)
{
    struct start_seen copy;

    pthread_mutex_lock(&f->mu);
    copy = f->start;
    pthread_mutex_unlock(&f->mu);
    return copy;
}

struct result {
    int rc;
    char *out; /* stdout, owned */
    char *err; /* stderr, owned */
};

static char *slurp(FILE *f)
{
    long n;
    char *s;

    fflush(f);
    n = ftell(f);
    assert_true(n >= 0);
    s = calloc(1, (size_t) n + 1);
    assert_non_null(s);
    rewind(f);
    assert_int_equal(fread(s, 1, (size_t) n, f), (size_t) n);
    return s;
}

/* Runs verb with the NULL-terminated arguments after argv[0], stdout and stderr captured. */
static struct result run_verb(kprofctl_verb_cb *verb, const char *name, ...)
{
    char *argv[64];
    int argc = 0, saved_out, saved_err;
    FILE *out = tmpfile(), *err = tmpfile();
    struct result r;
    va_list ap;
    const char *a;

    assert_non_null(out);
    assert_non_null(err);
    argv[argc++] = (char *) name;
    va_start(ap, name);
    while ((a = va_arg(ap, const char *)) != NULL && argc < 63) {
        argv[argc++] = (char *) a;
    }
    va_end(ap);
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    saved_out = dup(STDOUT_FILENO);
    saved_err = dup(STDERR_FILENO);
    dup2(fileno(out), STDOUT_FILENO);
    dup2(fileno(err), STDERR_FILENO);
    r.rc = verb(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_err, STDERR_FILENO);
    close(saved_out);
    close(saved_err);
    /* The fds wrote past the FILEs' own positions: seek to the end to size them. */
    fseek(out, 0, SEEK_END);
    fseek(err, 0, SEEK_END);
    r.out = slurp(out);
    r.err = slurp(err);
    fclose(out);
    fclose(err);
    return r;
}

static void result_free(struct result *r)
{
    free(r->out);
    free(r->err);
}

#define assert_contains(hay, needle)                               \
    do {                                                           \
        if (strstr((hay), (needle)) == NULL) {                     \
            fail_msg("\"%s\" not found in:\n%s", (needle), (hay)); \
        }                                                          \
    } while (0)

static void test_jobs(void **state)
{
    struct fake *f = *state;
    struct result r;

    r = run_verb(kprofctl_jobs, "jobs", "--collector", f->addr, "--csv", NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out,
                        "job,world_size,rank,host,pid,local_rank,device,step,step_us,run,conflict\n"
                        "a,1,0,n2,20,,,1000,90000,17,\n"
                        "b,2,0,n1,10,0,0,42,250000,,\n"
                        "b,2,1,n1,11,1,1,,,,\n");
    assert_string_equal(r.err, "");
    result_free(&r);

    r = run_verb(kprofctl_jobs, "jobs", "--collector", f->addr, "--json", "--job", "a", NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "[\n  {\"job\": \"a\", \"world_size\": 1, \"rank\": 0, \"host\": "
                               "\"n2\", \"pid\": 20, \"local_rank\": null, \"device\": null, "
                               "\"step\": 1000, \"step_us\": 90000, \"run\": 17, \"conflict\": "
                               "null}\n]\n");
    result_free(&r);

    /* None: the header only, and the hint. */
    r = run_verb(kprofctl_jobs, "jobs", "--collector", f->addr, "--job", "zzz", "-c", "job,rank",
                 NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "JOB  RANK\n");
    assert_contains(r.err, "job \"zzz\" is not registered: start its workers with kprof-run");
    result_free(&r);
}

static void test_start(void **state)
{
    struct fake *f = *state;
    struct start_seen last;
    struct result r;

    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "ddp-42", NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "17\n");
    assert_string_equal(r.err, "run 17: capturing job ddp-42, ranks 0-3 (4 on 2 hosts), steps "
                               "120..124; follow with kprofctl status --run 17 --watch\n");
    last = fake_last_start(f);
    assert_string_equal(last.ranks, "all");
    assert_int_equal(last.steps, 0);
    result_free(&r);

    /* The flags reach the request. */
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "ddp", "--ranks",
                 "0,2-3", "--steps", "12", "--duration", "1m30s", "--activities", "kernel,nvtx",
                 "--name", "nightly", "--deadline", "10m", "--json", NULL);
    assert_int_equal(r.rc, 0);
    last = fake_last_start(f);
    assert_string_equal(last.ranks, "0,2-3");
    assert_string_equal(last.activities, "kernel,nvtx");
    assert_string_equal(last.name, "nightly");
    assert_int_equal(last.steps, 12);
    assert_int_equal(last.duration_ms, 90000);
    assert_int_equal(last.deadline_ms, 600000);
    assert_int_equal(strncmp(r.out, "{\"run\": 17, \"job\": \"ddp\", \"name\": \"nightly\", ", 45),
                     0);
    assert_contains(r.out, "\"duration_ms\": 90000");
    assert_contains(r.out, "\"state\": \"pending\"");
    assert_contains(r.err, "steps 120..124, at most 1m30s; follow with");
    result_free(&r);

    /* collectord's refusals map to exit statuses, its details printed. */
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "missing", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_NOT_FOUND);
    assert_string_equal(r.out, "");
    assert_contains(r.err, "kprofctl start: collectord at ");
    assert_contains(
        r.err, "refused StartCapture (job missing, ranks all): NOT_FOUND: no job \"missing\" is "
               "registered");
    result_free(&r);
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "busy", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_BUSY);
    assert_contains(r.err, "ALREADY_EXISTS: rank 1 is capturing for run 16 already");
    result_free(&r);
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "noagent", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_NO_AGENT);
    assert_contains(r.err, "FAILED_PRECONDITION: rank 3 has no attached agent");
    result_free(&r);
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "j", "--ranks", "9",
                 NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_USAGE);
    assert_contains(r.err, "INVALID_ARGUMENT: rank 9 is outside the world size 4");
    result_free(&r);
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "j", "--metrics",
                 "sm__cycles", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_FAILED);
    assert_contains(r.err, "UNIMPLEMENTED: hardware counters are not captured yet");
    result_free(&r);
}

static void test_start_wait(void **state)
{
    struct fake *f = *state;
    struct result r;

    fake_plan(f, 2, false, 0);
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "ddp", "--wait", "--csv",
                 "-c", "rank,state,steps", NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(fake_polls(f), 2);
    assert_string_equal(r.out, "rank,state,steps\n0,done,120-124\n1,done,120-124\n2,done,120-124\n"
                               "3,done,120-124\n");
    assert_contains(r.err, "run 17: capturing job ddp, ranks 0-3 (4 on 2 hosts), steps 120..124; "
                           "waiting for it to end");
    result_free(&r);

    /* A failed rank: exit 1, named on stderr; --json gives the final capture. */
    fake_plan(f, 1, true, 0);
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "ddp", "--wait",
                 "--json", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_FAILED);
    assert_int_equal(strncmp(r.out, "{\"run\": 17, ", 12), 0);
    assert_contains(r.out, "\"run_state\": \"ended\"");
    assert_contains(r.out, "\"state\": \"failed\"");
    assert_contains(r.err, "kprofctl start: run 17 failed: 1 of 4 ranks did not finish: rank 2 "
                           "(n1): process 1002 exited during the window");
    result_free(&r);
}

static void test_stop(void **state)
{
    struct fake *f = *state;
    struct result r;

    r = run_verb(kprofctl_stop, "stop", "--collector", f->addr, "--run", "17", "--csv", NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out,
                        "run,job,run_state,rank,host,pid,state,records,dropped,steps,reason\n"
                        "17,ddp,open,0,n1,1000,flushing,0,0,,\n"
                        "17,ddp,open,1,n2,1001,flushing,0,0,,\n");
    assert_string_equal(r.err, "run 17: stop requested; ranks flush what they captured (follow "
                               "with kprofctl status --run 17 --watch)\n");
    result_free(&r);
    r = run_verb(kprofctl_stop, "stop", "--collector", f->addr, "--job", "ddp", "--json", "-c",
                 "run,state", NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "[\n  {\"run\": 17, \"state\": \"flushing\"},\n"
                               "  {\"run\": 17, \"state\": \"flushing\"}\n]\n");
    result_free(&r);
    r = run_verb(kprofctl_stop, "stop", "--collector", f->addr, "--run", "5", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_NOT_FOUND);
    assert_string_equal(r.out, "");
    assert_contains(r.err, "refused StopCapture (run 5): NOT_FOUND: no capture in progress");
    result_free(&r);
}

static void test_status(void **state)
{
    struct fake *f = *state;
    struct result r;

    /* Once: exit 0 even though a rank failed. */
    fake_plan(f, 1, true, 0);
    r = run_verb(kprofctl_status, "status", "--collector", f->addr, "--run", "17", NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(strncmp(r.out, "RUN  JOB  RUN_STATE  RANK  HOST   PID  STATE   RECORDS  ",
                             strlen("RUN  JOB  RUN_STATE  RANK  HOST   PID  STATE   RECORDS  ")),
                     0);
    assert_contains(r.out, "  failed  ");
    assert_contains(r.out, "process 1002 exited during the window\n");
    assert_string_equal(r.err, "");
    result_free(&r);

    r = run_verb(kprofctl_status, "status", "--collector", f->addr, "--run", "99", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_NOT_FOUND);
    assert_contains(r.err, "refused CaptureStatus (run 99): NOT_FOUND: run 99 is not a capture");
    result_free(&r);

    /* No capture: header only, and the hint. */
    r = run_verb(kprofctl_status, "status", "--collector", f->addr, "--limit", "3", NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "RUN  JOB  RUN_STATE  RANK  HOST  PID  STATE  RECORDS  DROPPED  "
                               "STEPS  REASON\n");
    assert_contains(r.err, "no capture yet");
    result_free(&r);
    r = run_verb(kprofctl_status, "status", "--collector", f->addr, "--limit", "3", "--json", NULL);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "[]\n");
    assert_string_equal(r.err, "");
    result_free(&r);
}

static void test_status_watch(void **state)
{
    struct fake *f = *state;
    struct result r;

    /* Not a terminal: polls 1-2 print one table (unchanged), poll 3 the final one. */
    fake_plan(f, 3, false, 0);
    r = run_verb(kprofctl_status, "status", "--collector", f->addr, "--run", "17", "--watch",
                 "--interval", "100ms", "--csv", "-c", "rank,state", NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(fake_polls(f), 3);
    assert_string_equal(r.out, "rank,state\n0,capturing\n1,capturing\n2,capturing\n3,capturing\n"
                               "\n"
                               "rank,state\n0,done\n1,done\n2,done\n3,done\n");
    result_free(&r);

    /* It ends failed: exit 1, the failure on stderr. */
    fake_plan(f, 2, true, 0);
    r = run_verb(kprofctl_status, "status", "--collector", f->addr, "--watch", "--interval",
                 "100ms", "--json", "-c", "rank", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_FAILED);
    assert_contains(r.err, "run 17 failed: 1 of 4 ranks did not finish: rank 2");
    result_free(&r);

    /* ctrl-c (raised by the fake once the wait is on): exit 130 at once. */
    fake_plan(f, 0, false, 2);
    r = run_verb(kprofctl_status, "status", "--collector", f->addr, "--watch", "--interval",
                 "100ms", "-c", "rank", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_INTERRUPTED);
    assert_int_equal(fake_polls(f), 2);
    result_free(&r);
    fake_plan(f, 0, false, 2);
    r = run_verb(kprofctl_start, "start", "--collector", f->addr, "--job", "ddp", "--wait", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_INTERRUPTED);
    assert_contains(r.err, "stopped waiting; run 17 goes on (kprofctl stop --run 17 ends it)");
    result_free(&r);
}

/* Nothing listens: every verb exits 5 with the hint, nothing on stdout. */
static void test_unreachable(void **state)
{
    static const struct {
        kprofctl_verb_cb *verb;
        const char *name;
        const char *args[4];
    } cases[] = {
        { kprofctl_runs, "runs", { "--json" } },
        { kprofctl_jobs, "jobs", { NULL } },
        { kprofctl_start, "start", { "--job", "j" } },
        { kprofctl_start, "start", { "--job", "j", "--wait" } },
        { kprofctl_stop, "stop", { "--run", "3" } },
        { kprofctl_stop, "stop", { "--job", "j", "--csv" } },
        { kprofctl_status, "status", { NULL } },
        { kprofctl_status, "status", { "--run", "3", "--watch" } },
    };
    struct result r;

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char prefix[64];

        r = run_verb(cases[i].verb, cases[i].name, "--collector", "127.0.0.1:1", cases[i].args[0],
                     cases[i].args[1], cases[i].args[2], cases[i].args[3], NULL);
        if (r.rc != KPROFCTL_EXIT_UNREACHABLE) {
            fail_msg("case %zu: %s exited %d: %s", i, cases[i].name, r.rc, r.err);
        }
        assert_string_equal(r.out, "");
        snprintf(prefix, sizeof(prefix), "kprofctl %s: cannot reach collectord: ", cases[i].name);
        assert_int_equal(strncmp(r.err, prefix, strlen(prefix)), 0);
        assert_contains(r.err, "is kprof-collectord running at 127.0.0.1:1? (set --collector or "
                               "KPROF_COLLECTOR)");
        result_free(&r);
    }
}

/* Bad flags: exit 2, "kprofctl VERB: ..." on stderr, nothing on stdout. */
static void test_usage(void **state)
{
    static const struct {
        kprofctl_verb_cb *verb;
        const char *name;
        const char *args[4];
        const char *why;
    } cases[] = {
        { kprofctl_jobs, "jobs", { "--json", "--csv" }, "exclude each other" },
        { kprofctl_jobs, "jobs", { "extra" }, "unexpected argument \"extra\"" },
        { kprofctl_jobs, "jobs", { "-c", "bogus" }, "unknown column \"bogus\"" },
        { kprofctl_start, "start", { "--steps", "3" }, "job is required" },
        { kprofctl_start, "start", { "--job", "j", "--ranks", "3-1" }, "a range must go up" },
        { kprofctl_start, "start", { "--job", "j", "--steps", "0" }, "out of range (1..100000)" },
        { kprofctl_start, "start", { "--job", "j", "--steps", "100001" }, "out of range" },
        { kprofctl_start,
          "start",
          { "--job", "j", "--activities", "kernel,gpu" },
          "unknown activity \"gpu\"" },
        { kprofctl_start, "start", { "--job", "j", "--csv" }, "add --wait or drop them" },
        { kprofctl_start, "start", { "--job", "j", "--duration", "soon" }, "not a duration" },
        { kprofctl_stop, "stop", { "--json" }, "give --run R or --job J" },
        { kprofctl_stop, "stop", { "--run", "1", "--job", "j" }, "not both" },
        { kprofctl_status, "status", { "--interval", "1ms" }, "out of range" },
        { kprofctl_status, "status", { "--bogus" }, "unknown flag --bogus" },
        { kprofctl_runs, "runs", { "--limit", "0" }, "out of range" },
    };
    struct result r;

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char prefix[64];

        r = run_verb(cases[i].verb, cases[i].name, "--collector", "127.0.0.1:1", cases[i].args[0],
                     cases[i].args[1], cases[i].args[2], cases[i].args[3], NULL);
        if (r.rc != KPROFCTL_EXIT_USAGE) {
            fail_msg("case %zu: %s exited %d: %s", i, cases[i].name, r.rc, r.err);
        }
        assert_string_equal(r.out, "");
        snprintf(prefix, sizeof(prefix), "kprofctl %s: ", cases[i].name);
        assert_int_equal(strncmp(r.err, prefix, strlen(prefix)), 0);
        assert_contains(r.err, cases[i].why);
        result_free(&r);
    }
}

/* --help: the synopsis, the flags and the exit statuses, exit 0. */
static void test_help(void **state)
{
    static kprofctl_verb_cb *const verbs[] = { kprofctl_runs, kprofctl_jobs, kprofctl_start,
                                               kprofctl_stop, kprofctl_status };
    static const char *const names[] = { "runs", "jobs", "start", "stop", "status" };
    struct result r;

    (void) state;
    for (size_t i = 0; i < 5; i++) {
        char synopsis[64];

        r = run_verb(verbs[i], names[i], "--help", NULL);
        assert_int_equal(r.rc, 0);
        snprintf(synopsis, sizeof(synopsis), "kprofctl %s ", names[i]);
        assert_int_equal(strncmp(r.out, synopsis, strlen(synopsis)), 0);
        assert_contains(r.out, "--collector=STRING");
        assert_contains(r.out, "--columns=STRING");
        assert_contains(r.out, "\nExit status:\n  0    ");
        assert_contains(r.out, "  5    collectord unreachable");
        assert_contains(r.out, "  6    no agent");
        if (i >= 2 && i != 3) {
            assert_contains(r.out, "  130  interrupted");
        }
        result_free(&r);
    }
}

/* counters (an Analyzer verb): --help shows --analyzer and -c's own column list (metric names
 * included, so -c is not checked before the call); bad flags exit 2; an unreachable analyzer
 * exits 5 naming --analyzer and KPROF_ANALYZER. */
static void test_counters(void **state)
{
    static const struct {
        const char *args[4];
        const char *why;
    } usage[] = {
        { { "--rank", "1" }, "--run is required" },
        { { "--run", "3", "-w", "2" }, "-w takes a width of 4 or more" },
        { { "--run", "3", "--json", "--csv" }, "exclude each other" },
        { { "--run", "3", "--pg", "dbname=kprof" }, "unknown flag --pg" },
        { { "--run", "3", "--rank", "-2" }, "out of range" },
    };
    struct result r;

    (void) state;
    r = run_verb(kprofctl_counters, "counters", "--help", NULL);
    assert_int_equal(r.rc, 0);
    assert_int_equal(strncmp(r.out, "kprofctl counters ", 18), 0);
    assert_contains(r.out, "Analyzer.Counters");
    assert_contains(r.out, "--analyzer=STRING");
    assert_contains(r.out, "flops_per_s, a metric name, or all");
    assert_contains(r.out, "  5    kprof-analyzer unreachable");
    assert_null(strstr(r.out, "--pg"));
    result_free(&r);
    for (size_t i = 0; i < sizeof(usage) / sizeof(usage[0]); i++) {
        r = run_verb(kprofctl_counters, "counters", "--analyzer", "127.0.0.1:1", usage[i].args[0],
                     usage[i].args[1], usage[i].args[2], usage[i].args[3], NULL);
        if (r.rc != KPROFCTL_EXIT_USAGE) {
            fail_msg("case %zu exited %d: %s", i, r.rc, r.err);
        }
        assert_string_equal(r.out, "");
        assert_int_equal(strncmp(r.err, "kprofctl counters: ", 19), 0);
        assert_contains(r.err, usage[i].why);
        result_free(&r);
    }
    r = run_verb(kprofctl_counters, "counters", "--analyzer", "127.0.0.1:1", "--run", "3", "-c",
                 "idx,gpu__time_duration.sum", "--timeout", "2s", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_UNREACHABLE);
    assert_string_equal(r.out, "");
    assert_contains(r.err, "kprofctl counters: cannot reach kprof-analyzer");
    assert_contains(r.err, "(set --analyzer or KPROF_ANALYZER)");
    result_free(&r);
}

/* ---- kp_rpcverb_main: what the flags of a spec do ---- */

static const struct kp_config_def main_defs[] = { KP_RPCVERB_RUN_DEF, KP_RPCVERB_RANK_DEF };
static const struct kp_table_col main_cols[] = { { "x", KP_TABLE_TEXT } };
static const struct kp_rpcverb_spec main_spec = {
    .name = "t",
    .synopsis = "kprofctl t --run R [--rank N]\n",
    .defs = main_defs,
    .n_defs = 2,
    .cols = main_cols,
    .n_cols = 1,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Breakdown",
    .req_desc = &kprof__v1__breakdown_request__descriptor,
    .resp_desc = &kprof__v1__breakdown_response__descriptor,
};
/* The same flags on a request that has no rank: a spec that does not fit. */
static const struct kp_rpcverb_spec misfit_spec = {
    .name = "t",
    .synopsis = "kprofctl t --run R [--rank N]\n",
    .defs = main_defs,
    .n_defs = 2,
    .cols = main_cols,
    .n_cols = 1,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Distributed",
    .req_desc = &kprof__v1__distributed_request__descriptor,
    .resp_desc = &kprof__v1__distributed_response__descriptor,
};
static Kprof__V1__BreakdownRequest main_seen;

/* The in-process Analyzer: keeps the request and refuses it as an unknown run. */
static int main_local(const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, kp_rpcverb_page_fn *page,
                      void *page_ud, ProtobufCMessage **resp, struct kp_rpc_status *st)
{
    (void) resp_desc;
    (void) resp;
    (void) page_ud;
    assert_null(page); /* a unary verb */
    assert_string_equal(method, "Breakdown");
    assert_ptr_equal(req->descriptor, &kprof__v1__breakdown_request__descriptor);
    main_seen = *(const Kprof__V1__BreakdownRequest *) req;
    st->code = GRPC_STATUS_NOT_FOUND;
    snprintf(st->details, sizeof(st->details), "no such run");
    return -1;
}

static int run_main_spec(int argc, char **argv)
{
    struct kp_rpcverb_common cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&main_spec, &cfg, argc, argv);
}

static int run_misfit_spec(int argc, char **argv)
{
    struct kp_rpcverb_common cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&misfit_spec, &cfg, argc, argv);
}

static void test_main_flags(void **state)
{
    struct result r;

    (void) state;
    r = run_verb(run_main_spec, "t", "--rank", "2", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_USAGE);
    assert_string_equal(r.err, "kprofctl t: --run is required (kprofctl runs lists the runs) "
                               "(see kprofctl t --help)\n");
    result_free(&r);

    kp_rpcverb_set_local(main_local, "kprof-analyze");
    memset(&main_seen, 0, sizeof(main_seen));
    r = run_verb(run_main_spec, "t", "--run", "7", "--rank", "2", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_NOT_FOUND);
    assert_int_equal(main_seen.run_id, 7);
    assert_int_equal(main_seen.rank, 2);
    assert_string_equal(r.out, "");
    assert_string_equal(r.err, "kprofctl t: kprof-analyze refused Breakdown (run 7 rank 2): "
                               "NOT_FOUND: no such run\n");
    result_free(&r);

    r = run_verb(run_misfit_spec, "t", "--run", "7", NULL);
    assert_int_equal(r.rc, KPROFCTL_EXIT_FAILED);
    assert_contains(r.err, "kprof.v1.DistributedRequest has no run_id or rank to set");
    result_free(&r);
    kp_rpcverb_set_local(NULL, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_codes),
        cmocka_unit_test(test_refused_hint),
        cmocka_unit_test(test_short_flags),
        cmocka_unit_test(test_ranks_check),
        cmocka_unit_test(test_ranks_format),
        cmocka_unit_test(test_duration_format),
        cmocka_unit_test(test_state_names),
        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_status_rows),
        cmocka_unit_test(test_capture_json),
        cmocka_unit_test(test_summary),
        cmocka_unit_test_setup_teardown(test_jobs, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_start, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_start_wait, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_stop, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_status, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_status_watch, fake_setup, fake_teardown),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_main_flags),
    };

    /* The verbs read KPROF_<FLAG>: keep the caller's environment out. */
    unsetenv("KPROF_COLLECTOR");
    unsetenv("KPROF_ANALYZER");
    unsetenv("KPROF_JOB");
    unsetenv("KPROF_JSON");
    unsetenv("KPROF_CSV");
    unsetenv("KPROF_COLUMNS");
    unsetenv("KPROF_RUN");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
