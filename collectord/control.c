#define KP_LOG_MODULE "control"
#include "control.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "coord.h"
#include "ingest.h"
#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "kp_workq.h"
#include "kprof.pb-c.h"
#include "leader.h"
#include "store.h"
#include "summary.h"

#define KP_CONTROL_QUEUE_MAX 256
#define KP_CONTROL_MAX_TEXT  256
#define KP_CONTROL_TICK_MS   100
#define KP_CONTROL_REAP_MS   5000 /* how often open runs are checked against their deadline */
#define KP_CONTROL_MAX_LIVE  4096 /* live runs named in the check; more: no check that time */
#define KP_CONTROL_LOOKUPS   64   /* run owner lookups queued for ingest at most */

enum job_type {
    JOB_CREATE,
    JOB_END,
    JOB_LIST,
    JOB_DROP,
    JOB_START,
    JOB_STATUS,
    JOB_LOOKUP, /* who may push into a run, for ingest (kp_ingest_set_lookup) */
};

struct job {
    enum job_type type;
    struct kp_rpc_call *call; /* a reference; NULL for JOB_LOOKUP */
    ProtobufCMessage *req;    /* owned; NULL for JOB_LOOKUP */
    uint64_t run_id;          /* JOB_LOOKUP's */
};

struct kp_control {
    struct kp_coord *coord; /* borrowed */
    char *conninfo;
    PGconn *pg; /* the worker's */
    struct kp_workq *q;
    long long last_tick_ms;
    struct kp_complain pg_complain;
    pthread_mutex_t mu; /* open runs without a producer (kp_control_set_open_run_timeout) */
    struct kp_ingest *ingest;
    long long open_run_timeout_ms;
    long long last_reap_ms;
    int lookups;              /* JOB_LOOKUPs queued, under mu */
    struct kp_leader *leader; /* under mu (kp_control_set_leader) */
};

static void job_free(struct job *j)
{
    if (j->req != NULL) {
        protobuf_c_message_free_unpacked(j->req, NULL);
    }
    if (j->call != NULL) {
        kp_rpc_call_unref(j->call);
    }
    free(j);
}

static bool text_ok(const char *s, const char *what, bool required, char *err, size_t len)
{
    size_t n = s == NULL ? 0 : strlen(s);

    if (required && n == 0) {
        snprintf(err, len, "%s is required", what);
        return false;
    }
    if (n > KP_CONTROL_MAX_TEXT) {
        snprintf(err, len, "%s is %zu bytes long; the limit is %d", what, n, KP_CONTROL_MAX_TEXT);
        return false;
    }
    if (!kp_utf8_valid(s == NULL ? "" : s, n)) {
        snprintf(err, len, "%s is not valid UTF-8", what);
        return false;
    }
    return true;
}

/* Returns a working connection, or NULL with the reason in err. Worker thread only. */
static PGconn *pg_get(struct kp_control *c, char *err, size_t len)
{
    if (c->pg != NULL && PQstatus(c->pg) == CONNECTION_OK) {
        return c->pg;
    }
    if (c->pg != NULL) {
        PQfinish(c->pg);
        c->pg = NULL;
    }
    if (kp_pg_connect(c->conninfo, "kprof-collectord-control", &c->pg, err, len) != 0) {
        kp_complain(&c->pg_complain, KP_LOG_ERROR, KP_LOG_MODULE,
                    "PostgreSQL unreachable for control requests err=\"%s\"", err);
        return NULL;
    }
    kp_release(&c->pg_complain, KP_LOG_MODULE, "PostgreSQL reachable again for control requests");
    return c->pg;
}

static grpc_status_code status_of(int rc)
{
    switch (rc) {
    case KP_ENOTFOUND:
        return GRPC_STATUS_NOT_FOUND;
    case KP_EPROTO:
    case -EINVAL:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case -EBUSY:
        return GRPC_STATUS_FAILED_PRECONDITION;
    case -EPERM:
        return GRPC_STATUS_PERMISSION_DENIED;
    default:
        return GRPC_STATUS_UNAVAILABLE;
    }
}

/* EndRun by an agent: only a run it created (docs/design.md "Authorization"). Returns 0, or
 * -EPERM, KP_ENOTFOUND or the store's code with the reason in err. */
static int end_allowed(PGconn *pg, struct kp_rpc_call *call, uint64_t run_id, char *err, size_t len)
{
    const struct kp_identity *id = kp_rpc_call_identity(call);
    struct kp_store_run_owner o = { 0 };
    char me[KP_STORE_PRINCIPAL_MAX];
    int rc;

    if (id->role != KP_ROLE_AGENT) {
        return 0; /* an operator ends any run; without authentication every caller may */
    }
    kp_store_principal(id, me, sizeof(me));
    rc = kp_store_run_owner(pg, run_id, &o, err, len);
    if (rc == 0 && (o.capture || strcmp(o.created_by, me) != 0)) {
        snprintf(err, len,
                 "%s may not end run %" PRIu64 ": an agent ends only the runs it created "
                 "(a capture ends when its ranks are done, or with kprofctl stop)",
                 me, run_id);
        kp_log_warn("EndRun refused status=PERMISSION_DENIED identity=%s peer=%s run=%" PRIu64, me,
                    kp_rpc_call_peer(call), run_id);
        rc = -EPERM;
    }
    kp_store_run_owner_fini(&o);
    return rc;
}

/* CreateRun's checks before PostgreSQL. Returns true, or false with the reason in err. */
static bool create_ok(const Kprof__V1__CreateRunRequest *r, char *err, size_t len)
{
    if (!text_ok(r->job, "job", true, err, len) || !text_ok(r->name, "name", false, err, len)) {
        return false;
    }
    if (r->world_size == 0 || r->world_size > KP_STORE_MAX_WORLD_SIZE) {
        snprintf(err, len, "world_size %u is out of range (1..%d)", r->world_size,
                 KP_STORE_MAX_WORLD_SIZE);
        return false;
    }
    return true;
}

/* EndRun with marks: 0 once every marked batch is stored in PostgreSQL, else -EAGAIN
 * (UNAVAILABLE: the producer asks again) with how many are not, or the store's code. Behind
 * --sink kafka a producer's Ack means durable in Kafka; the sink consumers store the batches a
 * little later, and a run ended before that would refuse them. */
static int marks_stored(PGconn *pg, const Kprof__V1__EndRunRequest *r, char *err, size_t len)
{
    uint64_t *missing, sum = 0;
    size_t short_marks = 0;
    int rc;

    if (r->n_marks == 0) {
        return 0;
    }
    if (r->n_marks > KP_STORE_MAX_MARKS) {
        snprintf(err, len, "%zu marks (at most %d): give one per producer stream", r->n_marks,
                 KP_STORE_MAX_MARKS);
        return KP_EPROTO;
    }
    if ((missing = calloc(r->n_marks, sizeof(*missing))) == NULL) {
        snprintf(err, len, "out of memory");
        return -ENOMEM;
    }
    rc = kp_store_marks_missing(pg, r->run_id, r->marks, r->n_marks, missing, err, len);
    for (size_t i = 0; rc == 0 && i < r->n_marks; i++) {
        sum += missing[i];
        short_marks += missing[i] > 0;
    }
    free(missing);
    if (rc == 0 && sum > 0) {
        snprintf(err, len,
                 "%" PRIu64 " batches of %zu producer streams of run %" PRIu64
                 " are acknowledged but not stored in PostgreSQL yet (on their way through "
                 "Kafka to the sink consumers); retry EndRun shortly",
                 sum, short_marks, r->run_id);
        kp_log_debug("EndRun waits run=%" PRIu64 " batches_missing=%" PRIu64, r->run_id, sum);
        rc = -EAGAIN;
    }
    return rc;
}

/* The run requests (CreateRun, EndRun, DropRun) over the store: replies on success, else
 * returns the store's code with the reason in err. */
static int run_request(PGconn *pg, void *ud, char *err, size_t len)
{
    struct job *j = ud;
    Kprof__V1__Run run = KPROF__V1__RUN__INIT;
    int rc;

    if (j->type == JOB_CREATE) {
        Kprof__V1__CreateRunRequest *r = (Kprof__V1__CreateRunRequest *) j->req;
        char by[KP_STORE_PRINCIPAL_MAX];

        kp_store_principal(kp_rpc_call_identity(j->call), by, sizeof(by));
        rc = kp_store_create_run_by(pg, r->job, r->name, r->world_size, (int) r->source, by, &run,
                                    err, len);
        if (rc == 0) {
            kp_log_info("run created run=%" PRIu64 " job=%s world_size=%u by=%s", run.id, r->job,
                        r->world_size, by);
        }
    }
    else if (j->type == JOB_END) {
        Kprof__V1__EndRunRequest *r = (Kprof__V1__EndRunRequest *) j->req;

        if ((rc = end_allowed(pg, j->call, r->run_id, err, len)) != 0 ||
            (rc = marks_stored(pg, r, err, len)) != 0) {
            return rc;
        }
        rc = kp_store_end_run(pg, r->run_id, r->failed, &run, err, len);
        if (rc == 0) {
            kp_log_info("run ended run=%" PRIu64 " failed=%d", run.id, (int) r->failed);
        }
    }
    else {
        Kprof__V1__DropRunRequest *r = (Kprof__V1__DropRunRequest *) j->req;

        rc = kp_store_drop_run(pg, r->run_id, &run, err, len);
        if (rc == 0) {
            kp_log_info("run dropped run=%" PRIu64 " job=%s batches=%" PRIu64 " peer=%s", run.id,
                        run.job, run.batches, kp_rpc_call_peer(j->call));
        }
    }
    if (rc == 0) {
        kp_rpc_call_reply(j->call, &run.base);
    }
    kp_store_run_fini(&run);
    return rc;
}

/* ListRuns: replies on success, else returns the store's code with the reason in err. */
static int list_request(PGconn *pg, void *ud, char *err, size_t len)
{
    struct job *j = ud;
    Kprof__V1__ListRunsRequest *r = (Kprof__V1__ListRunsRequest *) j->req;
    Kprof__V1__ListRunsResponse resp = KPROF__V1__LIST_RUNS_RESPONSE__INIT;
    int rc = kp_store_list_runs(pg, r->job, r->limit, &resp, err, len);

    if (rc == 0) {
        kp_rpc_call_reply(j->call, &resp.base);
    }
    kp_store_list_fini(&resp);
    return rc;
}

/*
 * Whether a request may run again on a new connection when PostgreSQL dropped the pooled one
 * under it (kp_pg_retry). ListRuns reads. EndRun is one UPDATE that moves only an OPEN run and
 * keeps the first ended_at, so a second one leaves the run as the first left it. DropRun is one
 * transaction: broken before its COMMIT it rolled back, and a repeat after a COMMIT that took
 * effect finds no run (NOT_FOUND) and changes nothing. CreateRun is not repeated: a COMMIT
 * whose answer was lost may have created the run, and a repeat would create a second one;
 * kp_pg_ping checks its connection first instead.
 */
static bool repeatable(enum job_type t)
{
    return t == JOB_LIST || t == JOB_END || t == JOB_DROP;
}

/* Answers UNAVAILABLE for a request that found PostgreSQL unreachable (err: why). */
static void finish_pg_unreachable(struct job *j, const char *err)
{
    char details[640];

    snprintf(details, sizeof(details), "%s%s; retry when PostgreSQL is back",
             strncmp(err, "PostgreSQL", 10) == 0 ? "" : "PostgreSQL is unreachable: ", err);
    kp_rpc_call_finish(j->call, GRPC_STATUS_UNAVAILABLE, details);
}

/* JOB_LOOKUP's work: reads the run's owners and hands them to ingest. */
static int lookup_request(PGconn *pg, void *ud, char *err, size_t len)
{
    struct job *j = ud;
    struct kp_store_run_owner *o = (struct kp_store_run_owner *) j->req;

    kp_store_run_owner_fini(o);
    memset(o, 0, sizeof(*o));
    return kp_store_run_owner(pg, j->run_id, o, err, len);
}

static void lookup_done(struct kp_control *c, uint64_t run_id, int rc,
                        const struct kp_store_run_owner *o, const char *why)
{
    pthread_mutex_lock(&c->mu);
    c->lookups--;
    pthread_mutex_unlock(&c->mu);
    kp_ingest_run_owner(c->ingest, run_id, rc, o, why);
}

static void run_lookup(struct kp_control *c, struct job *j)
{
    struct kp_store_run_owner o = { 0 };
    char err[512] = "", why[768];
    PGconn *pg;
    int rc;

    if ((pg = pg_get(c, err, sizeof(err))) == NULL) {
        snprintf(why, sizeof(why),
                 "PostgreSQL is unreachable (%s), so who may push into run %" PRIu64
                 " is not known; retry when it is back",
                 err, j->run_id);
        lookup_done(c, j->run_id, KP_EPG, NULL, why);
        return;
    }
    j->req = (ProtobufCMessage *) &o;
    rc = kp_pg_retry(pg, true, lookup_request, j, err, sizeof(err));
    j->req = NULL;
    if (rc != 0 && rc != KP_ENOTFOUND) {
        kp_log_warn("cannot look up who may push into run=%" PRIu64 " err=\"%s\"", j->run_id, err);
    }
    snprintf(why, sizeof(why), "cannot look up who may push into run %" PRIu64 " (%s); retry",
             j->run_id, err);
    lookup_done(c, j->run_id, rc, &o, why);
    kp_store_run_owner_fini(&o);
}

/* kp_ingest_lookup_fn: queues a JOB_LOOKUP (never blocks). */
static bool lookup_submit(void *ud, uint64_t run_id)
{
    struct kp_control *c = ud;
    struct job *j;
    bool room;

    pthread_mutex_lock(&c->mu);
    room = c->lookups < KP_CONTROL_LOOKUPS;
    c->lookups += room;
    pthread_mutex_unlock(&c->mu);
    if (!room) {
        return false;
    }
    if ((j = calloc(1, sizeof(*j))) != NULL) {
        j->type = JOB_LOOKUP;
        j->run_id = run_id;
        if (kp_workq_submit(c->q, j) == 0) {
            return true;
        }
        free(j);
    }
    pthread_mutex_lock(&c->mu);
    c->lookups--;
    pthread_mutex_unlock(&c->mu);
    return false;
}

static void run_job(struct kp_control *c, struct job *j)
{
    char err[512] = "";
    PGconn *pg;
    int rc;

    if (j->type == JOB_LOOKUP) {
        run_lookup(c, j);
        return;
    }
    if (j->type == JOB_CREATE &&
        !create_ok((Kprof__V1__CreateRunRequest *) j->req, err, sizeof(err))) {
        kp_rpc_call_finish(j->call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return;
    }
    if (j->type == JOB_START || j->type == JOB_STATUS) {
        /* NULL: the coordinator says what it can. Checked first: a capture's writes are not
         * repeated. */
        if ((pg = pg_get(c, err, sizeof(err))) != NULL && kp_pg_ping(pg, err, sizeof(err)) != 0) {
            pg = NULL;
        }
        if (j->type == JOB_START) {
            kp_coord_start(c->coord, pg, j->call, (Kprof__V1__StartCaptureRequest *) j->req);
        }
        else {
            kp_coord_status(c->coord, pg, j->call, (Kprof__V1__CaptureStatusRequest *) j->req);
        }
        return;
    }
    if ((pg = pg_get(c, err, sizeof(err))) == NULL) {
        finish_pg_unreachable(j, err);
        return;
    }
    if (j->type == JOB_LIST &&
        !text_ok(((Kprof__V1__ListRunsRequest *) j->req)->job, "job", false, err, sizeof(err))) {
        kp_rpc_call_finish(j->call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return;
    }
    if (!repeatable(j->type) && kp_pg_ping(pg, err, sizeof(err)) != 0) {
        finish_pg_unreachable(j, err);
        return;
    }
    rc = kp_pg_retry(pg, repeatable(j->type), j->type == JOB_LIST ? list_request : run_request, j,
                     err, sizeof(err));
    if (rc == 0 && j->type == JOB_END) {
        /* answered already; the summary is made on the summariser's thread (summary.h) */
        kp_summary_after_end(pg, ((Kprof__V1__EndRunRequest *) j->req)->run_id);
    }
    if (rc == KP_EPG && kp_pg_conn_lost(pg)) {
        kp_log_warn("control request failed method=%s err=\"%s\"", kp_rpc_call_method(j->call),
                    err);
        finish_pg_unreachable(j, err);
    }
    else if (rc != 0) {
        if (rc != KP_ENOTFOUND && rc != KP_EPROTO && rc != -EINVAL && rc != -EBUSY &&
            rc != -EPERM && rc != -EAGAIN) {
            kp_log_warn("control request failed method=%s err=\"%s\"", kp_rpc_call_method(j->call),
                        err);
        }
        kp_rpc_call_finish(j->call, status_of(rc), err);
    }
}

/*
 * Ends as FAILED every OPEN run that no live Push stream feeds and that has had no batch (nor,
 * with no rank yet, been created) for the open-run timeout, with the reason in runs.end_reason:
 * its producer died (an import cut short, an API client gone) and nothing else would end it.
 * Captures are left to the coordinator, which has deadlines of its own.
 */
static void reap_open_runs(struct kp_control *c, PGconn *pg, long long now)
{
    uint64_t live[KP_CONTROL_MAX_LIVE];
    struct kp_strbuf q;
    char err[512], secs[32];
    const char *params[2] = { secs, NULL };
    PGresult *res = NULL;
    struct kp_ingest *ingest;
    long long timeout;
    size_t n;

    pthread_mutex_lock(&c->mu);
    timeout = c->open_run_timeout_ms;
    ingest = c->ingest;
    pthread_mutex_unlock(&c->mu);
    if (timeout <= 0 || ingest == NULL || pg == NULL ||
        now - c->last_reap_ms <
            (timeout / 4 < KP_CONTROL_REAP_MS ? timeout / 4 : KP_CONTROL_REAP_MS)) {
        return;
    }
    c->last_reap_ms = now;
    if ((n = kp_ingest_live_runs(ingest, live, KP_CONTROL_MAX_LIVE)) > KP_CONTROL_MAX_LIVE) {
        return;
    }
    kp_strbuf_init(&q, 256);
    if (kp_pg_array_i64s(&q, (const int64_t *) live, n) != 0) {
        kp_strbuf_fini(&q);
        return;
    }
    params[1] = q.data;
    snprintf(secs, sizeof(secs), "%.3f", (double) timeout / 1000.0);
    if (kp_pg_query(pg,
                    "UPDATE runs r SET state = 3, ended_at = now(), end_reason = "
                    "format('no live producer stream and no batch for %s s: its producer is "
                    "gone (ended by collectord)', $1) "
                    "WHERE r.state = 1 AND r.source <> 1 AND NOT (r.id = ANY($2::bigint[])) "
                    "AND greatest(r.created_at, (SELECT max(k.last_seen) FROM ranks k "
                    "WHERE k.run_id = r.id)) < now() - make_interval(secs => $1::double precision) "
                    "RETURNING r.id, r.job",
                    2, params, &res, err, sizeof(err)) != 0) {
        kp_log_warn("checking open runs failed err=\"%s\"", err);
        kp_strbuf_fini(&q);
        return;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        kp_log_warn("run ended as failed run=%s job=\"%s\" reason=\"no live producer stream and "
                    "no batch for %s s\"",
                    PQgetvalue(res, i, 0), PQgetvalue(res, i, 1), secs);
        kp_summary_after_end(pg, strtoull(PQgetvalue(res, i, 0), NULL, 10));
    }
    PQclear(res);
    kp_strbuf_fini(&q);
}

void kp_control_set_open_run_timeout(struct kp_control *c, struct kp_ingest *ingest,
                                     long long timeout_ms)
{
    pthread_mutex_lock(&c->mu);
    c->ingest = ingest;
    c->open_run_timeout_ms = timeout_ms;
    pthread_mutex_unlock(&c->mu);
    kp_ingest_set_lookup(ingest, lookup_submit, c);
}

/* The coordinator's periodic work, with the connection if PostgreSQL is reachable. */
static void tick(struct kp_control *c)
{
    char err[512];
    long long now;

    if (c->coord == NULL) {
        return;
    }
    now = kp_mono_ms();
    if (now - c->last_tick_ms < KP_CONTROL_TICK_MS) {
        return;
    }
    c->last_tick_ms = now;
    kp_coord_tick(c->coord, pg_get(c, err, sizeof(err)));
    reap_open_runs(c, c->pg != NULL && PQstatus(c->pg) == CONNECTION_OK ? c->pg : NULL, now);
}

/* The queue's callbacks: c is the ud, the worker has no state of its own but c->pg. */
static void run_cb(void *ud, void *state, void *item)
{
    run_job(ud, item);
    job_free(item);
}

static void cancel_cb(void *ud, void *item)
{
    struct job *j = item;

    if (j->type == JOB_LOOKUP) {
        lookup_done(ud, j->run_id, KP_ESHUTDOWN, NULL, "collectord is shutting down");
        job_free(j);
        return;
    }
    kp_rpc_call_finish(j->call, GRPC_STATUS_UNAVAILABLE, "collectord is shutting down");
    job_free(j);
}

static void tick_cb(void *ud, void *state)
{
    tick(ud);
}

static void enqueue(struct kp_control *c, enum job_type type, struct kp_rpc_call *call,
                    ProtobufCMessage *req)
{
    struct job *j = calloc(1, sizeof(*j));

    if (j == NULL) {
        protobuf_c_message_free_unpacked(req, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        return;
    }
    j->type = type;
    j->call = call;
    j->req = req;
    kp_rpc_call_ref(call);
    if (kp_workq_submit(c->q, j) != 0) { /* full, or stopping */
        kp_log_warn("control queue full; rejecting method=%s peer=%s", kp_rpc_call_method(call),
                    kp_rpc_call_peer(call));
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "too many control requests queued; retry later");
        job_free(j);
    }
}

static void on_create(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, JOB_CREATE, call, req);
}

static void on_end(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, JOB_END, call, req);
}

static void on_list(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, JOB_LIST, call, req);
}

static void on_drop(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, JOB_DROP, call, req);
}

static void on_start(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    struct kp_control *c = ud;

    if (kp_coord_refuse(c->coord, call)) {
        protobuf_c_message_free_unpacked(req, NULL);
        return;
    }
    enqueue(c, JOB_START, call, req);
}

static void on_status(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    struct kp_control *c = ud;

    if (kp_coord_refuse(c->coord, call)) {
        protobuf_c_message_free_unpacked(req, NULL);
        return;
    }
    enqueue(c, JOB_STATUS, call, req);
}

/* ListJobs and StopCapture need no PostgreSQL: answered on the gRPC thread. */
static void on_jobs(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    struct kp_control *c = ud;

    if (kp_coord_refuse(c->coord, call)) {
        protobuf_c_message_free_unpacked(req, NULL);
        return;
    }

    kp_coord_list_jobs(c->coord, call, (Kprof__V1__ListJobsRequest *) req);
    protobuf_c_message_free_unpacked(req, NULL);
}

static void on_stop(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    struct kp_control *c = ud;

    if (kp_coord_refuse(c->coord, call)) {
        protobuf_c_message_free_unpacked(req, NULL);
        return;
    }

    kp_coord_stop(c->coord, call, (Kprof__V1__StopCaptureRequest *) req);
    protobuf_c_message_free_unpacked(req, NULL);
}

/* Coordinator: who coordinates captures, as this replica's election thread last read it. */
static void on_coordinator(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    struct kp_control *c = ud;
    Kprof__V1__CoordinatorInfo resp = KPROF__V1__COORDINATOR_INFO__INIT;
    struct kp_leader_info in = { 0 };

    protobuf_c_message_free_unpacked(req, NULL);
    pthread_mutex_lock(&c->mu);
    if (c->leader != NULL) {
        kp_leader_info(c->leader, &in);
    }
    pthread_mutex_unlock(&c->mu);
    resp.elected = in.elected;
    resp.address = in.address;
    resp.host = in.host;
    resp.pid = in.pid;
    resp.since_ns = in.since_ns;
    resp.epoch = in.epoch;
    resp.is_self = in.is_self && kp_coord_active(c->coord);
    kp_rpc_call_reply(call, &resp.base);
}

void kp_control_set_leader(struct kp_control *c, struct kp_leader *leader)
{
    pthread_mutex_lock(&c->mu);
    c->leader = leader;
    pthread_mutex_unlock(&c->mu);
}

void kp_control_methods(struct kp_control *c, struct kp_rpc_method *out)
{
    out[0] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/CreateRun",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__create_run_request__descriptor,
                                     .on_request = on_create,
                                     .ud = c,
                                     .roles = KP_ROLE_AGENT | KP_ROLE_OPERATOR };
    out[1] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/EndRun",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__end_run_request__descriptor,
                                     .on_request = on_end,
                                     .ud = c,
                                     .roles = KP_ROLE_AGENT | KP_ROLE_OPERATOR };
    out[2] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/ListRuns",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__list_runs_request__descriptor,
                                     .on_request = on_list,
                                     .ud = c,
                                     .roles = KP_ROLE_VIEWER };
    out[3] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/DropRun",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__drop_run_request__descriptor,
                                     .on_request = on_drop,
                                     .ud = c,
                                     .roles = KP_ROLE_OPERATOR };
    out[4] = kp_coord_attach_method(c->coord);
    out[5] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/ListJobs",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__list_jobs_request__descriptor,
                                     .on_request = on_jobs,
                                     .ud = c,
                                     .roles = KP_ROLE_VIEWER };
    out[6] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/StartCapture",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__start_capture_request__descriptor,
                                     .on_request = on_start,
                                     .ud = c,
                                     .roles = KP_ROLE_OPERATOR };
    out[7] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/StopCapture",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__stop_capture_request__descriptor,
                                     .on_request = on_stop,
                                     .ud = c,
                                     .roles = KP_ROLE_OPERATOR };
    out[8] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/CaptureStatus",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__capture_status_request__descriptor,
                                     .on_request = on_status,
                                     .ud = c,
                                     .roles = KP_ROLE_VIEWER };
    out[9] = (struct kp_rpc_method){ .path = "/kprof.v1.Control/Coordinator",
                                     .kind = KP_RPC_UNARY,
                                     .request = &kprof__v1__coordinator_request__descriptor,
                                     .on_request = on_coordinator,
                                     .ud = c,
                                     .roles = KP_ROLE_AGENT | KP_ROLE_VIEWER | KP_ROLE_OPERATOR };
}

int kp_control_create(const char *conninfo, struct kp_coord *coord, struct kp_control **out,
                      char *errbuf, size_t errlen)
{
    static const struct kp_workq_ops ops = { .run = run_cb, .cancel = cancel_cb, .tick = tick_cb };
    struct kp_workq_opts qo = { .workers = 1,
                                .queue_max = KP_CONTROL_QUEUE_MAX,
                                .tick_ms = KP_CONTROL_TICK_MS };
    struct kp_control *c = calloc(1, sizeof(*c));
    int rc;

    if (c == NULL || (c->conninfo = strdup(conninfo)) == NULL) {
        free(c);
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    c->coord = coord;
    pthread_mutex_init(&c->mu, NULL);
    if ((rc = kp_workq_create(&qo, &ops, c, &c->q, errbuf, errlen)) != 0) {
        kp_control_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kp_control_destroy(struct kp_control *c)
{
    if (c == NULL) {
        return;
    }
    kp_workq_destroy(c->q); /* what is queued is answered UNAVAILABLE */
    if (c->pg != NULL) {
        PQfinish(c->pg);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->conninfo);
    free(c);
}
