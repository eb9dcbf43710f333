/*
 * Analyzer.Export over kp_export (export_rpc.h).
 */
#define KP_LOG_MODULE "export"
#include "export_rpc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "export.h"
#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_workq.h"
#include "kprof.pb-c.h"

/* How long one chunk may wait for a client that does not read before the export gives up. */
#define EXPORT_SEND_TIMEOUT_MS (5 * 60 * 1000LL)

struct kp_export_svc {
    const char *conninfo;
    int max_active;
    struct kp_workq *q; /* max_active workers, nothing waits (queue_max 0) */
    struct kp_rpc_method method;
};

/* The gRPC side of one call, until its request came. */
struct xcall {
    struct kp_export_svc *svc;
    bool got_request;
};

/* One export, run by a worker of svc->q. */
struct xjob {
    struct kp_export_svc *svc;
    struct kp_rpc_call *call; /* referenced */
    Kprof__V1__ExportRequest *req;
    int32_t rank; /* the rank being sent */
    uint64_t sent_bytes;
};

static void job_done(struct xjob *j)
{
    kp_rpc_call_unref(j->call);
    protobuf_c_message_free_unpacked(&j->req->base, NULL);
    free(j);
}

/* Sends one chunk once the previous one has reached the transport (one in flight). */
static int send_chunk(struct xjob *j, Kprof__V1__ExportChunk *c)
{
    int rc = kp_rpc_call_wait_sent(j->call, EXPORT_SEND_TIMEOUT_MS);

    if (rc != 0) {
        return rc;
    }
    return kp_rpc_call_send(j->call, &c->base);
}

static int sink(void *ud, const void *data, size_t len)
{
    struct xjob *j = ud;
    Kprof__V1__ExportChunk c = KPROF__V1__EXPORT_CHUNK__INIT;

    c.run_id = j->req->run_id;
    c.rank = j->rank;
    c.data.data = (uint8_t *) data;
    c.data.len = len;
    j->sent_bytes += len;
    return send_chunk(j, &c);
}

static int send_end(struct xjob *j, const struct kp_export_stats *st)
{
    Kprof__V1__ExportChunk c = KPROF__V1__EXPORT_CHUNK__INIT;
    Kprof__V1__ExportRowCount rows[KP_EV_COUNT], *rp[KP_EV_COUNT];

    c.run_id = j->req->run_id;
    c.rank = j->rank;
    c.end_of_rank = true;
    c.json_bytes = st->json_bytes;
    c.events = st->events;
    c.flows = st->flows;
    for (int k = 0; k < KP_EV_COUNT; k++) {
        kprof__v1__export_row_count__init(&rows[k]);
        rows[k].table = (char *) kp_event_kinds[k].table;
        rows[k].rows = st->rows[k];
        rp[k] = &rows[k];
    }
    c.n_rows = KP_EV_COUNT;
    c.rows = rp;
    return send_chunk(j, &c);
}

/* The status for a kp_export error. */
static grpc_status_code status_of(int rc, PGconn *pg)
{
    if (rc == KP_ENOTFOUND) {
        return GRPC_STATUS_NOT_FOUND;
    }
    if (rc == KP_EPG && (pg == NULL || PQstatus(pg) != CONNECTION_OK || kp_pg_conn_lost(pg))) {
        return GRPC_STATUS_UNAVAILABLE;
    }
    return rc == -ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INTERNAL;
}

/* The queue's run callback: one export, with a connection of its own. */
static void export_run(void *ud, void *state, void *item)
{
    struct xjob *j = item;
    const Kprof__V1__ExportRequest *r = j->req;
    struct kp_export *x = NULL;
    PGconn *pg = NULL;
    char err[1024], msg[1200];
    const int32_t *ranks;
    size_t n_ranks, n_done = 0;
    uint64_t json = 0;
    double t0 = kp_mono_s();
    int rc;

    if (kp_pg_connect(j->svc->conninfo, "kprof-analyzer-export", &pg, err, sizeof(err)) != 0) {
        snprintf(msg, sizeof(msg), "kprof-analyzer cannot reach PostgreSQL: %s", err);
        kp_rpc_call_finish(j->call, GRPC_STATUS_UNAVAILABLE, msg);
        goto out;
    }
    if ((rc = kp_export_open(pg, (int64_t) r->run_id, r->fetch_rows, &x, err, sizeof(err))) != 0) {
        kp_rpc_call_finish(j->call, status_of(rc, pg), err);
        goto out;
    }
    ranks = kp_export_ranks(x, &n_ranks);
    if (r->all_ranks && r->one_rank && n_ranks > 1) {
        snprintf(msg, sizeof(msg),
                 "run %" PRIu64 " has %zu ranks and a trace file holds one: pass --rank N, or "
                 "-o DIR for one file per rank",
                 r->run_id, n_ranks);
        kp_rpc_call_finish(j->call, GRPC_STATUS_INVALID_ARGUMENT, msg);
        goto out;
    }
    for (size_t i = 0; i < (r->all_ranks ? n_ranks : 1); i++) {
        struct kp_export_stats st;

        j->rank = r->all_ranks ? ranks[i] : r->rank;
        rc = kp_export_rank(x, j->rank, r->gzip ? (r->gzip_level > 0 ? r->gzip_level : 1) : 0, sink,
                            j, &st, err, sizeof(err));
        if (rc == 0) {
            rc = send_end(j, &st);
            snprintf(err, sizeof(err), "%s", strerror(rc < 0 ? -rc : rc));
        }
        if (rc == -ECANCELED || rc == -ETIMEDOUT) {
            kp_log_info("export stopped run=%" PRIu64 " rank=%d: %s", r->run_id, (int) j->rank,
                        rc == -ECANCELED ? "the client went away" : "the client stopped reading");
            kp_rpc_call_finish(j->call, GRPC_STATUS_CANCELLED, "the client stopped reading");
            goto out;
        }
        if (rc != 0) {
            kp_log_warn("export failed run=%" PRIu64 " rank=%d err=\"%s\"", r->run_id,
                        (int) j->rank, err);
            kp_rpc_call_finish(j->call, status_of(rc, pg), err);
            goto out;
        }
        json += st.json_bytes;
        n_done++;
    }
    if (kp_rpc_call_wait_sent(j->call, EXPORT_SEND_TIMEOUT_MS) == 0) {
        kp_rpc_call_finish(j->call, GRPC_STATUS_OK, "");
    }
    kp_log_info("exported run=%" PRIu64 " ranks=%zu json_bytes=%" PRIu64 " sent_bytes=%" PRIu64
                " seconds=%.3f",
                r->run_id, n_done, json, j->sent_bytes, kp_mono_s() - t0);
out:
    kp_export_close(x);
    if (pg != NULL) {
        PQfinish(pg);
    }
    job_done(j);
}

/* The queue's cancel callback: an export accepted as the analyzer began to stop. */
static void export_cancel(void *ud, void *item)
{
    struct xjob *j = item;

    kp_rpc_call_finish(j->call, GRPC_STATUS_UNAVAILABLE, "kprof-analyzer is stopping");
    job_done(j);
}

static void *on_open(struct kp_rpc_call *call, void *ud)
{
    struct xcall *c = calloc(1, sizeof(*c));

    (void) call;
    if (c != NULL) {
        c->svc = ud;
    }
    return c;
}

static enum kp_rpc_next on_message(struct kp_rpc_call *call, ProtobufCMessage *msg,
                                   size_t wire_bytes, void *state)
{
    struct xcall *c = state;
    Kprof__V1__ExportRequest *req = (Kprof__V1__ExportRequest *) msg;
    struct kp_export_svc *svc;
    struct xjob *j = NULL;
    int rc;

    (void) wire_bytes;
    if (c == NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return KP_RPC_STOP;
    }
    svc = c->svc;
    c->got_request = true;
    if (req->run_id == 0 || req->run_id > INT32_MAX || (!req->all_ranks && req->rank < 0) ||
        req->gzip_level < 0 || req->gzip_level > 9) {
        protobuf_c_message_free_unpacked(msg, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "ExportRequest needs run_id 1..2147483647, a rank >= 0 (or "
                           "all_ranks) and gzip_level 0..9");
        return KP_RPC_STOP;
    }
    if ((j = calloc(1, sizeof(*j))) == NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return KP_RPC_STOP;
    }
    j->svc = svc;
    j->call = call;
    j->req = req;
    kp_rpc_call_ref(call);
    if ((rc = kp_workq_submit(svc->q, j)) != 0) {
        char why[160];

        snprintf(why, sizeof(why),
                 rc == -ESHUTDOWN ? "kprof-analyzer is stopping"
                                  : "%d exports are running already: retry when one has ended",
                 svc->max_active);
        kp_rpc_call_finish(
            call, rc == -ESHUTDOWN ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_RESOURCE_EXHAUSTED, why);
        job_done(j); /* frees req */
    }
    return KP_RPC_STOP;
}

static void on_half_close(struct kp_rpc_call *call, void *state)
{
    const struct xcall *c = state;

    if (c == NULL || !c->got_request) {
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "Export takes one ExportRequest; none was sent");
    }
}

static void on_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    (void) call;
    (void) cancelled;
    free(state);
}

int kp_export_svc_create(const char *pg_conninfo, int max_active, struct kp_export_svc **out,
                         char *errbuf, size_t errlen)
{
    static const struct kp_workq_ops ops = { .run = export_run, .cancel = export_cancel };
    struct kp_export_svc *svc = calloc(1, sizeof(*svc));
    struct kp_workq_opts qo = { .queue_max = 0 };
    int rc;

    if (svc == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    svc->conninfo = pg_conninfo;
    svc->max_active = max_active > 0 ? max_active : 1;
    qo.workers = (size_t) svc->max_active;
    if ((rc = kp_workq_create(&qo, &ops, svc, &svc->q, errbuf, errlen)) != 0) {
        free(svc);
        return rc;
    }
    svc->method = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Export",
        .kind = KP_RPC_STREAM,
        .request = &kprof__v1__export_request__descriptor,
        .on_open = on_open,
        .on_message = on_message,
        .on_half_close = on_half_close,
        .on_close = on_close,
        .ud = svc,
        .roles = KP_ROLE_VIEWER,
    };
    *out = svc;
    return 0;
}

const struct kp_rpc_method *kp_export_svc_method(struct kp_export_svc *svc)
{
    return &svc->method;
}

void kp_export_svc_destroy(struct kp_export_svc *svc)
{
    if (svc == NULL) {
        return;
    }
    kp_workq_destroy(svc->q); /* waits for the running exports */
    free(svc);
}
