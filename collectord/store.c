#define KP_LOG_MODULE "store"
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

/* The columns of a Run, in fill_run's order; `r` is the runs row. */
/* pg_advisory_xact_lock key that serialises run creations across collectords ("kprofrun"). */
#define KP_STORE_CREATE_LOCK "7741813582235596142"

#define RUN_COLS                                                           \
    "r.id, r.job, r.name, r.state, r.source, r.world_size, "               \
    "(extract(epoch FROM r.created_at) * 1000000000)::bigint, "            \
    "coalesce((extract(epoch FROM r.ended_at) * 1000000000)::bigint, 0), " \
    "(SELECT count(*) FROM ingest_batches b WHERE b.run_id = r.id)"

static bool owned(const char *s)
{
    return s != NULL && s != protobuf_c_empty_string;
}

void kp_store_run_fini(Kprof__V1__Run *r)
{
    if (r == NULL) {
        return;
    }
    if (owned(r->job)) {
        free(r->job);
    }
    if (owned(r->name)) {
        free(r->name);
    }
    r->job = (char *) protobuf_c_empty_string;
    r->name = (char *) protobuf_c_empty_string;
}

void kp_store_list_fini(Kprof__V1__ListRunsResponse *r)
{
    if (r == NULL) {
        return;
    }
    for (size_t i = 0; i < r->n_runs; i++) {
        kp_store_run_fini(r->runs[i]);
        free(r->runs[i]);
    }
    free(r->runs);
    r->runs = NULL;
    r->n_runs = 0;
}

/* Fills r from row of res (RUN_COLS). Returns 0 or -ENOMEM. */
static int fill_run(const PGresult *res, int row, Kprof__V1__Run *r)
{
    char *job = strdup(PQgetvalue(res, row, 1));
    char *name = strdup(PQgetvalue(res, row, 2));

    if (job == NULL || name == NULL) {
        free(job);
        free(name);
        return -ENOMEM;
    }
    kp_store_run_fini(r);
    r->id = (uint64_t) kp_pg_i64(res, row, 0, 0);
    r->job = job;
    r->name = name;
    r->state = (Kprof__V1__RunState) kp_pg_i64(res, row, 3, 0);
    r->source = (Kprof__V1__RunSource) kp_pg_i64(res, row, 4, 0);
    r->world_size = (uint32_t) kp_pg_i64(res, row, 5, 0);
    r->created_ns = (int64_t) kp_pg_i64(res, row, 6, 0);
    r->ended_ns = (int64_t) kp_pg_i64(res, row, 7, 0);
    r->batches = (uint64_t) kp_pg_i64(res, row, 8, 0);
    return 0;
}

static int check_text(const char *what, const char *s, bool required, char *errbuf, size_t errlen)
{
    size_t n = s == NULL ? 0 : strlen(s);

    if (required && n == 0) {
        snprintf(errbuf, errlen, "%s must not be empty", what);
        return KP_EPROTO;
    }
    if (n > KP_STORE_MAX_TEXT_BYTES) {
        snprintf(errbuf, errlen, "%s is %zu bytes long; the limit is %d bytes", what, n,
                 KP_STORE_MAX_TEXT_BYTES);
        return KP_EPROTO;
    }
    if (!kp_utf8_valid(s == NULL ? "" : s, n)) {
        snprintf(errbuf, errlen, "%s is not valid UTF-8", what);
        return KP_EPROTO;
    }
    return 0;
}

int kp_store_create_run(PGconn *c, const char *job, const char *name, uint32_t world_size,
                        int source, Kprof__V1__Run *out, char *errbuf, size_t errlen)
{
    return kp_store_create_run_by(c, job, name, world_size, source, NULL, out, errbuf, errlen);
}

void kp_store_principal(const struct kp_identity *id, char *buf, size_t len)
{
    snprintf(buf, len, "%s:%s", kp_auth_role_name(id->role), id->name);
}

int kp_store_create_run_by(PGconn *c, const char *job, const char *name, uint32_t world_size,
                           int source, const char *created_by, Kprof__V1__Run *out, char *errbuf,
                           size_t errlen)
{
    char ws[16], src[16], id[24], err[384];
    const char *params[5] = { job, name != NULL ? name : "", src, ws, created_by };
    PGresult *res = NULL;
    int rc;

    if ((rc = check_text("job", job, true, errbuf, errlen)) != 0 ||
        (rc = check_text("name", name, false, errbuf, errlen)) != 0) {
        return rc;
    }
    if (world_size == 0 || world_size > KP_STORE_MAX_WORLD_SIZE) {
        snprintf(errbuf, errlen, "world_size %" PRIu32 " is out of range (1..%d)", world_size,
                 KP_STORE_MAX_WORLD_SIZE);
        return KP_EPROTO;
    }
    if (source < KPROF__V1__RUN_SOURCE__RUN_SOURCE_UNSPECIFIED ||
        source > KPROF__V1__RUN_SOURCE__RUN_SOURCE_SYNTHETIC) {
        snprintf(errbuf, errlen, "source %d is not a RunSource", source);
        return KP_EPROTO;
    }
    snprintf(ws, sizeof(ws), "%" PRIu32, world_size);
    snprintf(src, sizeof(src), "%d", source);
    /* Run creations take turns: each creates a partition of every event table (ACCESS
     * EXCLUSIVE on the parent) with foreign keys to `runs` (SHARE ROW EXCLUSIVE on it, which
     * another creation's INSERT holds off), so two at once, on two collectord replicas,
     * deadlock. The lock is the transaction's, gone at COMMIT or ROLLBACK. */
    if ((rc = kp_pg_exec(c, "BEGIN; SELECT pg_advisory_xact_lock(" KP_STORE_CREATE_LOCK ")", err,
                         sizeof(err))) != 0 ||
        (rc = kp_pg_query(c,
                          "INSERT INTO runs AS r (job, name, source, world_size, created_by) "
                          "VALUES ($1, $2, $3, $4, $5) RETURNING " RUN_COLS,
                          5, params, &res, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "create run: %s", err);
        goto out;
    }
    snprintf(id, sizeof(id), "%s", PQgetvalue(res, 0, 0));
    params[0] = id;
    if ((rc = kp_pg_query(c, "SELECT kp_create_run_partitions($1)", 1, params, NULL, err,
                          sizeof(err))) != 0 ||
        (rc = kp_pg_exec(c, "COMMIT", err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "create run: %s", err);
        goto out;
    }
    if ((rc = fill_run(res, 0, out)) != 0) {
        snprintf(errbuf, errlen, "out of memory");
    }
out:
    if (rc != 0) {
        kp_pg_rollback(c);
    }
    PQclear(res);
    return rc;
}

int kp_store_end_run(PGconn *c, uint64_t run_id, bool failed, Kprof__V1__Run *out, char *errbuf,
                     size_t errlen)
{
    char id[24], state[8], err[384];
    const char *params[2] = { id, state };
    PGresult *res = NULL;
    int rc;

    if (run_id == 0 || run_id > INT32_MAX) {
        snprintf(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        return KP_ENOTFOUND;
    }
    snprintf(id, sizeof(id), "%" PRIu64, run_id);
    snprintf(state, sizeof(state), "%d",
             failed ? KPROF__V1__RUN_STATE__RUN_STATE_FAILED
                    : KPROF__V1__RUN_STATE__RUN_STATE_ENDED);
    /* Only an open run changes state; ended_at keeps the first end. */
    if ((rc = kp_pg_query(c,
                          "UPDATE runs AS r SET "
                          "state = CASE WHEN r.state = 1 THEN $2::smallint ELSE r.state END, "
                          "ended_at = coalesce(r.ended_at, now()) "
                          "WHERE r.id = $1 RETURNING " RUN_COLS,
                          2, params, &res, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "end run: %s", err);
        goto out;
    }
    if (PQntuples(res) == 0) {
        snprintf(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        rc = KP_ENOTFOUND;
        goto out;
    }
    if ((rc = fill_run(res, 0, out)) != 0) {
        snprintf(errbuf, errlen, "out of memory");
    }
out:
    PQclear(res);
    return rc;
}

int kp_store_marks_missing(PGconn *c, uint64_t run_id, Kprof__V1__StreamMark *const *marks,
                           size_t n, uint64_t *missing, char *errbuf, size_t errlen)
{
    struct kp_strbuf arr[5];
    char id[24], err[384];
    const char *params[6];
    PGresult *res = NULL;
    int rc = 0;

    if (run_id == 0 || run_id > INT32_MAX) {
        snprintf(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        return KP_ENOTFOUND;
    }
    if (n > KP_STORE_MAX_MARKS) {
        snprintf(errbuf, errlen, "%zu marks (at most %d)", n, KP_STORE_MAX_MARKS);
        return KP_EPROTO;
    }
    for (size_t i = 0; i < n; i++) {
        const Kprof__V1__StreamMark *m = marks[i];

        missing[i] = 0;
        if (m == NULL || m->stream == 0 || m->stream > INT64_MAX || m->last_seq > INT64_MAX ||
            m->first_seq > m->last_seq || m->count > m->last_seq - m->first_seq + 1 ||
            m->rank < -1) {
            snprintf(errbuf, errlen,
                     "marks[%zu] is not a mark a producer makes (stream 1..2^63-1, first_seq <= "
                     "last_seq < 2^63, count at most last_seq - first_seq + 1, rank -1 or more)",
                     i);
            return KP_EPROTO;
        }
    }
    if (n == 0) {
        return 0;
    }
    for (size_t k = 0; k < 5; k++) {
        kp_strbuf_init(&arr[k], (size_t) 64 << 20);
        rc |= kp_pg_array_open(&arr[k]);
    }
    for (size_t i = 0; i < n; i++) {
        rc |= kp_pg_array_i64(&arr[0], marks[i]->rank);
        rc |= kp_pg_array_i64(&arr[1], (int64_t) marks[i]->stream);
        rc |= kp_pg_array_i64(&arr[2], (int64_t) marks[i]->first_seq);
        rc |= kp_pg_array_i64(&arr[3], (int64_t) marks[i]->last_seq);
        rc |= kp_pg_array_i64(&arr[4], (int64_t) marks[i]->count);
    }
    for (size_t k = 0; k < 5; k++) {
        rc |= kp_pg_array_close(&arr[k]);
        params[k + 1] = arr[k].data;
    }
    if (rc != 0) {
        snprintf(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    snprintf(id, sizeof(id), "%" PRIu64, run_id);
    params[0] = id;
    /* One pass over the run's ingest_batches (its partition), joined to the marks by stream;
     * a mark's stored batches are counted on their own, so overlapping marks stay right. */
    if ((rc = kp_pg_query(c,
                          "WITH m AS (SELECT * FROM unnest($2::int[], $3::bigint[], $4::bigint[], "
                          "$5::bigint[], $6::bigint[]) WITH ORDINALITY "
                          "AS m(rank, stream, f, l, count, i)), "
                          "s AS (SELECT m.i, count(*) AS n FROM ingest_batches b JOIN m "
                          "ON b.stream = m.stream AND b.seq BETWEEN m.f AND m.l "
                          "AND (m.rank < 0 OR b.rank = m.rank) WHERE b.run_id = $1 "
                          "GROUP BY m.i) "
                          "SELECT greatest(m.count - coalesce(s.n, 0), 0) FROM m "
                          "LEFT JOIN s USING (i) ORDER BY m.i",
                          6, params, &res, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "check the stored batches: %s", err);
        goto out;
    }
    for (int r = 0; r < PQntuples(res) && (size_t) r < n; r++) {
        missing[r] = strtoull(PQgetvalue(res, r, 0), NULL, 10);
    }
out:
    for (size_t k = 0; k < 5; k++) {
        kp_strbuf_fini(&arr[k]);
    }
    PQclear(res);
    return rc;
}

int kp_store_drop_run(PGconn *c, uint64_t run_id, Kprof__V1__Run *out, char *errbuf, size_t errlen)
{
    char id[24], err[384];
    const char *params[1] = { id };
    PGresult *res = NULL;
    long long state;
    int rc;

    if (run_id == 0 || run_id > INT32_MAX) {
        snprintf(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        return KP_ENOTFOUND;
    }
    snprintf(id, sizeof(id), "%" PRIu64, run_id);
    /* FOR NO KEY UPDATE holds off a concurrent EndRun (and another DropRun) until COMMIT,
     * and waits for a flush of the run's batches, which holds the row FOR SHARE (sink_pg.h).
     * Both take the run row first and the event tables after it, so they cannot deadlock; a
     * stronger lock here would also wait for the FOR KEY SHARE of other writers. */
    if ((rc = kp_pg_exec(c, "BEGIN", err, sizeof(err))) != 0 ||
        (rc = kp_pg_query(c, "SELECT " RUN_COLS " FROM runs r WHERE r.id = $1 FOR NO KEY UPDATE", 1,
                          params, &res, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "drop run: %s", err);
        goto out;
    }
    if (PQntuples(res) == 0) {
        snprintf(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        rc = KP_ENOTFOUND;
        goto out;
    }
    state = kp_pg_i64(res, 0, 3, 0);
    if (state == KPROF__V1__RUN_STATE__RUN_STATE_OPEN) {
        snprintf(errbuf, errlen,
                 "run %" PRIu64 " is still open (it may be taking events); end it first "
                 "(EndRun, failed=true if it is being abandoned), then drop it",
                 run_id);
        rc = -EBUSY;
        goto out;
    }
    if ((rc = fill_run(res, 0, out)) != 0) {
        snprintf(errbuf, errlen, "out of memory");
        goto out;
    }
    if ((rc = kp_pg_query(c, "SELECT kp_drop_run($1)", 1, params, NULL, err, sizeof(err))) != 0 ||
        (rc = kp_pg_exec(c, "COMMIT", err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "drop run: %s", err);
        goto out;
    }
out:
    if (rc != 0) {
        kp_pg_rollback(c);
    }
    PQclear(res);
    return rc;
}

int kp_store_list_runs(PGconn *c, const char *job, uint32_t limit, Kprof__V1__ListRunsResponse *out,
                       char *errbuf, size_t errlen)
{
    char lim[16], err[384];
    const char *params[2];
    PGresult *res = NULL;
    int n, rc;

    if (job == NULL) {
        job = "";
    }
    if ((rc = check_text("job", job, false, errbuf, errlen)) != 0) {
        return rc;
    }
    if (limit == 0) {
        limit = KP_STORE_DEFAULT_LIMIT;
    }
    if (limit > KP_STORE_MAX_LIMIT) {
        limit = KP_STORE_MAX_LIMIT;
    }
    snprintf(lim, sizeof(lim), "%" PRIu32, limit);
    if (job[0] == '\0') {
        params[0] = lim;
        rc = kp_pg_query(c, "SELECT " RUN_COLS " FROM runs r ORDER BY r.id DESC LIMIT $1", 1,
                         params, &res, err, sizeof(err));
    }
    else {
        params[0] = job;
        params[1] = lim;
        rc = kp_pg_query(
            c, "SELECT " RUN_COLS " FROM runs r WHERE r.job = $1 ORDER BY r.id DESC LIMIT $2", 2,
            params, &res, err, sizeof(err));
    }
    if (rc != 0) {
        snprintf(errbuf, errlen, "list runs: %s", err);
        goto out;
    }
    kp_store_list_fini(out);
    n = PQntuples(res);
    if (n > 0 && (out->runs = calloc((size_t) n, sizeof(*out->runs))) == NULL) {
        rc = -ENOMEM;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        Kprof__V1__Run *r = malloc(sizeof(*r));

        if (r == NULL) {
            rc = -ENOMEM;
            break;
        }
        kprof__v1__run__init(r);
        out->runs[out->n_runs++] = r;
        rc = fill_run(res, i, r);
    }
    if (rc != 0) {
        snprintf(errbuf, errlen, "out of memory");
        kp_store_list_fini(out);
    }
out:
    PQclear(res);
    return rc;
}

void kp_store_run_owner_fini(struct kp_store_run_owner *o)
{
    if (o == NULL) {
        return;
    }
    free(o->ranks);
    free(o->agent_by);
    o->ranks = NULL;
    o->agent_by = NULL;
    o->n = 0;
}

int kp_store_run_owner(PGconn *c, uint64_t run_id, struct kp_store_run_owner *out, char *errbuf,
                       size_t errlen)
{
    char id[24], src[16], err[384];
    const char *params[2] = { id, src };
    PGresult *res = NULL;
    int rc, n;

    if (run_id == 0 || run_id > INT32_MAX) {
        snprintf(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        return KP_ENOTFOUND;
    }
    snprintf(id, sizeof(id), "%" PRIu64, run_id);
    snprintf(src, sizeof(src), "%d", KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE);
    if ((rc = kp_pg_query(c,
                          "SELECT coalesce(r.created_by, ''), "
                          "EXISTS (SELECT 1 FROM captures k WHERE k.run_id = r.id), "
                          "r.source = $2::smallint FROM runs r WHERE r.id = $1",
                          2, params, &res, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "look up the run's creator: %s", err);
        return rc;
    }
    if (PQntuples(res) == 0) {
        PQclear(res);
        snprintf(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        return KP_ENOTFOUND;
    }
    snprintf(out->created_by, sizeof(out->created_by), "%s", PQgetvalue(res, 0, 0));
    out->capture = PQgetvalue(res, 0, 1)[0] == 't';
    out->unsettled = !out->capture && PQgetvalue(res, 0, 2)[0] == 't';
    PQclear(res);
    res = NULL;
    if (!out->capture) {
        return 0;
    }
    if ((rc = kp_pg_query(c,
                          "SELECT rank, coalesce(agent_by, '') FROM capture_ranks "
                          "WHERE run_id = $1 ORDER BY rank",
                          1, params, &res, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "look up the capture's agents: %s", err);
        return rc;
    }
    n = PQntuples(res);
    out->ranks = calloc((size_t) n + 1, sizeof(*out->ranks));
    out->agent_by = calloc((size_t) n + 1, sizeof(*out->agent_by));
    if (out->ranks == NULL || out->agent_by == NULL) {
        PQclear(res);
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        out->ranks[i] = (int32_t) strtol(PQgetvalue(res, i, 0), NULL, 10);
        snprintf(out->agent_by[i], sizeof(out->agent_by[i]), "%s", PQgetvalue(res, i, 1));
    }
    out->n = (size_t) n;
    PQclear(res);
    return 0;
}
