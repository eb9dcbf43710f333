#define KP_LOG_MODULE "analyzer"
/* The table of the Analyzer service's views (view.h) and what their key functions share. */
#include "view.h"

#include <errno.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"

const struct kp_view *const kp_views[] = {
    &kp_view_breakdown, &kp_view_ops,         &kp_view_kernels, &kp_view_prof,
    &kp_view_roofline,  &kp_view_counters,    &kp_view_compare, &kp_view_hta,
    &kp_view_memory,    &kp_view_distributed, &kp_view_diff,
};
const size_t kp_n_views = sizeof(kp_views) / sizeof(kp_views[0]);

const struct kp_view *kp_view_find(const char *name, bool *stream)
{
    for (size_t i = 0; i < kp_n_views; i++) {
        const struct kp_view *v = kp_views[i];

        if (strcmp(v->name, name) == 0 || (v->stream != NULL && strcmp(v->stream, name) == 0)) {
            if (stream != NULL) {
                *stream = strcmp(v->name, name) != 0;
            }
            return v;
        }
    }
    return NULL;
}

bool kp_view_key_init(struct kp_view_key *k, uint64_t run, int32_t rank, bool whole_run, char *err,
                      size_t len)
{
    memset(k, 0, sizeof(*k));
    if (run == 0 || run > INT32_MAX) {
        snprintf(err, len, "run_id %" PRIu64 " is not a run id: `kprofctl runs` lists the runs",
                 run);
        return false;
    }
    if (!whole_run && rank < KP_VIEW_ONLY_RANK) {
        snprintf(err, len, "rank %d is negative", (int) rank);
        return false;
    }
    k->run = run;
    k->rank = whole_run ? -1 : rank;
    return true;
}

bool kp_view_key_group_by(struct kp_view_key *k, uint64_t run, int32_t rank, int group_by,
                          char *err, size_t len)
{
    if (!kp_view_key_init(k, run, rank, false, err, len)) {
        return false;
    }
    if (group_by < 0 || group_by > 1) {
        snprintf(err, len, "group_by %d is not a known grouping", group_by);
        return false;
    }
    memcpy(k->opts, &group_by, sizeof(group_by));
    return true;
}

bool kp_view_group_by_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k,
                          char *err, size_t len)
{
    const ProtobufCMessageDescriptor *d = req->descriptor;
    const ProtobufCFieldDescriptor *run =
        protobuf_c_message_descriptor_get_field_by_name(d, "run_id");
    const ProtobufCFieldDescriptor *rank =
        protobuf_c_message_descriptor_get_field_by_name(d, "rank");
    const ProtobufCFieldDescriptor *group =
        protobuf_c_message_descriptor_get_field_by_name(d, "group_by");
    const char *m = (const char *) req;

    (void) max_rows;
    if (run == NULL || rank == NULL || group == NULL || run->type != PROTOBUF_C_TYPE_UINT64 ||
        rank->type != PROTOBUF_C_TYPE_INT32 || group->type != PROTOBUF_C_TYPE_ENUM) {
        snprintf(err, len, "%s has no run_id, rank and group_by", d->name);
        return false;
    }
    return kp_view_key_group_by(k, *(const uint64_t *) (m + run->offset),
                                *(const int32_t *) (m + rank->offset),
                                *(const int *) (m + group->offset), err, len);
}

int kp_view_resolve_rank(PGconn *pg, uint64_t run, int32_t *rank, char *err, size_t len)
{
    char id[32];
    const char *params[1] = { id };
    PGresult *r = NULL;
    int64_t n;
    int rc;

    snprintf(id, sizeof(id), "%" PRIu64, run);
    rc = kp_pg_query(pg,
                     "SELECT count(*), min(rank), coalesce(string_agg(rank::text, ', ' ORDER BY "
                     "rank), '') FROM ranks WHERE run_id = $1",
                     1, params, &r, err, len);
    if (rc != 0) {
        return rc;
    }
    n = kp_pg_i64(r, 0, 0, 0);
    if (n == 1) {
        *rank = (int32_t) kp_pg_i64(r, 0, 1, 0);
    }
    else if (n == 0) {
        snprintf(err, len, "run %" PRIu64 " has no ranks yet", run);
        rc = KP_ENOTFOUND;
    }
    else {
        snprintf(err, len, "run %" PRIu64 " has %" PRId64 " ranks (%.400s): pick one with --rank",
                 run, n, PQgetvalue(r, 0, 2));
        rc = -EINVAL;
    }
    PQclear(r);
    return rc;
}

int kp_view_run_version(PGconn *pg, uint64_t run, int *state, int64_t *batches, char *err,
                        size_t len)
{
    char id[32];
    const char *params[1] = { id };
    PGresult *r = NULL;
    int rc;

    snprintf(id, sizeof(id), "%" PRIu64, run);
    rc = kp_pg_query(pg,
                     "SELECT state, (SELECT count(*) FROM ingest_batches WHERE run_id = $1) "
                     "FROM runs WHERE id = $1",
                     1, params, &r, err, len);
    if (rc != 0) {
        return rc;
    }
    if (PQntuples(r) == 0) {
        snprintf(err, len, "run %" PRIu64 " does not exist: `kprofctl runs` lists the runs", run);
        PQclear(r);
        return KP_ENOTFOUND;
    }
    *state = atoi(PQgetvalue(r, 0, 0));
    *batches = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return 0;
}

grpc_status_code kp_view_status(const struct kp_view *v, const struct kp_view_key *k, int rc,
                                char *err, size_t len)
{
    char details[700];

    switch (rc) {
    case KP_ENOTFOUND:
        return GRPC_STATUS_NOT_FOUND;
    case -EINVAL: /* options the analysis itself refuses */
        return GRPC_STATUS_INVALID_ARGUMENT;
    case KP_ETOOBIG:
    case -ENOMEM:
        kp_log_warn("analysis refused method=%s run=%" PRIu64 " rank=%d err=\"%s\"", v->name,
                    k->run, (int) k->rank, err);
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    default:
        kp_log_warn("analysis failed method=%s run=%" PRIu64 " rank=%d err=\"%s\"", v->name, k->run,
                    (int) k->rank, err);
        snprintf(details, sizeof(details), "PostgreSQL failed (%s); retry later", err);
        snprintf(err, len, "%s", details);
        return GRPC_STATUS_UNAVAILABLE;
    }
}

int kp_view_check_rank(struct kp_view_ctx *ctx)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };

    snprintf(runs, sizeof(runs), "%" PRIu64, ctx->key->run);
    snprintf(ranks, sizeof(ranks), "%d", (int) ctx->key->rank);
    return kp_an_check_rank(ctx->pg, params, (int64_t) ctx->key->run, (int) ctx->key->rank,
                            ctx->err, ctx->errlen);
}

int kp_view_window(struct kp_view_ctx *ctx, size_t *window)
{
    int64_t events = 0;
    int rc = 0;

    *window = 0;
    if (ctx->window_events > 0 &&
        (rc = kp_view_rank_events(ctx->pg, ctx->key->run, ctx->key->rank, &events, ctx->err,
                                  ctx->errlen)) == 0 &&
        events > (int64_t) ctx->window_events) {
        *window = ctx->window_events;
    }
    return rc;
}

int kp_view_rank_events(PGconn *pg, uint64_t run, int32_t rank, int64_t *n, char *err, size_t len)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    PGresult *r = NULL;
    int rc;

    snprintf(runs, sizeof(runs), "%" PRIu64, run);
    snprintf(ranks, sizeof(ranks), "%d", (int) rank);
    rc = kp_pg_query(pg,
                     "SELECT coalesce(max(records), 0) FROM ranks WHERE run_id = $1 AND "
                     "($2::int < 0 OR rank = $2::int)",
                     2, params, &r, err, len);
    *n = rc == 0 ? kp_pg_i64(r, 0, 0, 0) : 0;
    PQclear(r);
    return rc;
}

/* Loads k's rank for v into *an: by windows where v allows it and the rank has more than
 * window_events events (and can be cut), else whole, but KP_EWHOLE with windows_only. */
static int load_rank(const struct kp_view *v, PGconn *pg, const struct kp_view_key *k,
                     size_t max_rows, size_t window_events, bool windows_only, struct kp_an **an,
                     char *err, size_t len)
{
    int64_t events = 0;
    int rc;

    if ((v->windowed & KP_AN_WIN_ALL) && window_events > 0) {
        if ((rc = kp_view_rank_events(pg, k->run, k->rank, &events, err, len)) != 0) {
            return rc;
        }
        if (events > (int64_t) window_events &&
            (rc =
                 kp_an_create_windowed(pg, (int64_t) k->run, (int) k->rank, max_rows, window_events,
                                       v->windowed & KP_AN_WIN_ALL, an, err, len)) != 0) {
            return rc;
        }
        if (*an != NULL) {
            kp_log_info("rank read by windows method=%s run=%" PRIu64 " rank=%d events=%" PRId64
                        " windows=%zu",
                        v->name, k->run, (int) k->rank, events, kp_an_windows(*an));
            return 0;
        }
        if (events > (int64_t) window_events && windows_only) {
            return KP_EWHOLE;
        }
    }
    return kp_an_create(pg, (int64_t) k->run, (int) k->rank, max_rows, an, err, len);
}

int kp_view_compute(const struct kp_view *v, PGconn *pg, const ProtobufCMessage *req,
                    const struct kp_view_key *k, size_t max_rows, size_t window_events,
                    bool windows_only, const struct kp_view_pages *pages, struct kp_an **an,
                    struct kp_view_reply *out, grpc_status_code *code, char *err, size_t len)
{
    struct kp_view_ctx ctx = { .pg = pg,
                               .req = req,
                               .key = k,
                               .max_rows = max_rows,
                               .window_events = window_events,
                               .windows_only = windows_only,
                               .pages = pages,
                               .err = err,
                               .errlen = len };
    int rc;

    *an = NULL;
    memset(out, 0, sizeof(*out));
    err[0] = '\0';
    if (v->load_rank &&
        (rc = load_rank(v, pg, k, max_rows, window_events, windows_only, an, err, len)) != 0) {
        /* KP_EWHOLE is the caller's to handle (it asked), not an answer */
        *code = rc == KP_EWHOLE ? GRPC_STATUS_INTERNAL : kp_view_status(v, k, rc, err, len);
        return rc;
    }
    ctx.an = *an;
    err[0] = '\0';
    if ((rc = v->compute(&ctx, out)) == 0) {
        return 0;
    }
    if (rc == KP_EWHOLE) {
        *code = GRPC_STATUS_INTERNAL;
        return rc;
    }
    if (err[0] == '\0') {
        snprintf(err, len, "%s", kp_strerror(rc));
    }
    *code = ctx.status != 0 ? (grpc_status_code) ctx.status : kp_view_status(v, k, rc, err, len);
    return rc;
}
