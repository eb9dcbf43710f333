/*
 * Compare summaries (summary.h). Each statement below fills one table of migration 0014 with
 * exactly the rows of one of analyzer/compare_load.c's live queries (named at each), with the
 * same name classes (KP_COMPARE_NAME_CLASS_SQL): so the analyzer reads either and computes the
 * same answer. Two passes over the kernels (the sums with the spans, then the NCCL kernels),
 * one over the ops, the API calls, and the copies with the memsets; the rows without a step
 * (imports) take one more pass per table, only where there are such rows.
 */
#define KP_LOG_MODULE "summary"
#include "summary.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_clock.h"
#include "kp_compare_sql.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_workq.h"

#define KP_SUMMARY_QUEUE_MAX 4096 /* runs waiting for their summary, at most */

static pthread_mutex_t stats_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kp_summary_stats stats;

#define NC "nc AS (SELECT id, " KP_COMPARE_NAME_CLASS_SQL " AS c FROM names)"

/* Locks the run against the sink's flushes (FOR SHARE) and EndRun; its state. */
static const char lock_sql[] =
    "SELECT r.state, EXISTS (SELECT 1 FROM compare_runs c WHERE c.run_id = r.id AND c.version = "
    "$2) FROM runs r WHERE r.id = $1 FOR NO KEY UPDATE OF r";

/* The event tables' parents, in name order: the order kp_drop_run and kp_create_run_partitions
 * (which lock them ACCESS EXCLUSIVE) and the sink take them in, so that a run dropped or
 * created meanwhile waits for the summary instead of deadlocking with it. */
static const char tables_sql[] = "LOCK TABLE ONLY api_calls, ONLY kernels, ONLY memcpys, ONLY "
                                 "memsets, ONLY ops, ONLY steps IN ACCESS SHARE MODE";

static const char *const clear_sql[] = {
    "DELETE FROM compare_runs WHERE run_id = $1",  "DELETE FROM compare_sums WHERE run_id = $1",
    "DELETE FROM compare_colls WHERE run_id = $1", "DELETE FROM compare_ops WHERE run_id = $1",
    "DELETE FROM compare_spans WHERE run_id = $1", "DELETE FROM compare_ranges WHERE run_id = $1",
};

/* kern_sql, api_sql and mem_sql in one table (NULL: no row of that table), and span_sql's
 * spans from the kernel sums' groups: one pass over each table. */
static const char sums_sql[] =
    "WITH " NC ", k AS MATERIALIZED (SELECT rank, step, sum(dur_ns) AS v, min(start_ns) AS lo, "
    "max(start_ns + dur_ns) AS hi FROM kernels WHERE run_id = $1 GROUP BY rank, step), "
    "sp AS (INSERT INTO compare_spans (run_id, rank, kmin, kmax) SELECT $1, rank, min(lo), "
    "max(hi) FROM k GROUP BY rank), "
    "a AS (SELECT rank, step, coalesce(sum(dur_ns) FILTER (WHERE coalesce(domain, 1) = 1 AND "
    "NOT coalesce(name IN (SELECT id FROM nc WHERE c = 4), false)), 0) AS v FROM api_calls "
    "WHERE run_id = $1 GROUP BY rank, step), "
    "m AS (SELECT rank, step, sum(dur_ns) AS v FROM (SELECT rank, step, dur_ns FROM memcpys "
    "WHERE run_id = $1 UNION ALL SELECT rank, step, dur_ns FROM memsets WHERE run_id = $1) x "
    "GROUP BY rank, step) "
    "INSERT INTO compare_sums (run_id, rank, step, kernel_ns, api_ns, mem_ns) "
    "SELECT $1, rank, step, sum(kv), sum(av), sum(mv) FROM (SELECT rank, step, v AS kv, "
    "NULL::numeric AS av, NULL::numeric AS mv FROM k UNION ALL SELECT rank, step, NULL, v, NULL "
    "FROM a UNION ALL SELECT rank, step, NULL, NULL, v FROM m) u GROUP BY rank, step";

/* coll_sql */
static const char colls_sql[] =
    "WITH " NC " INSERT INTO compare_colls (run_id, rank, step, start_ns, dur_ns, name) "
    "SELECT $1, rank, step, start_ns, dur_ns, name FROM kernels WHERE run_id = $1 AND name IN "
    "(SELECT id FROM nc WHERE c = 0)";

/* ops_sql */
static const char ops_sql[] =
    "WITH " NC " INSERT INTO compare_ops (run_id, rank, step, name, start_ns, dur_ns) "
    "SELECT $1, rank, step, name, start_ns, dur_ns FROM ops WHERE run_id = $1 AND name IN "
    "(SELECT id FROM nc WHERE c IN (1, 2, 3))";

/* Which tables have rows without a step (compare_load.c's need[]). */
static const char need_sql[] =
    "SELECT coalesce(bool_or(kernel_ns IS NOT NULL), false), coalesce(bool_or(api_ns IS NOT "
    "NULL), false), coalesce(bool_or(mem_ns IS NOT NULL), false) FROM compare_sums WHERE "
    "run_id = $1 AND step IS NULL";

/* range_sql's sums, over every interval that may be a rank's step in the analyzer's eyes (it
 * picks ProfilerStep ops, else steps rows, else the kernels' span): $2..$4 say which tables
 * have rows without a step. */
#define RANGE_JOIN(table)                                                                       \
    " AS (SELECT st.rank, st.s, st.e, sum(t.dur_ns) AS v FROM " table " t JOIN st ON t.rank = " \
    "st.rank AND t.start_ns >= st.s AND t.start_ns < st.e WHERE t.run_id = $1 AND t.step IS "   \
    "NULL"
#define RANGE_BY    " GROUP BY st.rank, st.s, st.e)"
#define RANGE_ON(x) " LEFT JOIN " x " ON (" x ".rank, " x ".s, " x ".e) = (st.rank, st.s, st.e)"
static const char ranges_sql[] =
    "WITH " NC ", st AS (SELECT DISTINCT rank, s, e FROM (SELECT rank, start_ns AS s, start_ns + "
    "dur_ns AS e FROM compare_ops WHERE run_id = $1 AND name IN (SELECT id FROM nc WHERE c = 2) "
    "UNION ALL SELECT rank, start_ns, start_ns + dur_ns FROM steps WHERE run_id = $1 "
    "UNION ALL SELECT rank, kmin, kmax + 1 FROM compare_spans WHERE run_id = $1) x), "
    "k" RANGE_JOIN(
        "kernels") " AND $2 AND NOT coalesce(t.name IN (SELECT id FROM nc WHERE c = "
                   "0), false)" RANGE_BY ", "
                   "a" RANGE_JOIN(
                       "api_calls") " AND $3 AND coalesce(t.domain, 1) = 1 AND NOT coalesce(t.name "
                                    "IN (SELECT id FROM nc WHERE c = 4), false)" RANGE_BY ", "
                                    "m" RANGE_JOIN(
                                        "(SELECT run_id, rank, step, start_ns, dur_ns FROM memcpys UNION ALL SELECT "
                                        "run_id, rank, step, start_ns, dur_ns FROM memsets)") " AND $4" RANGE_BY
                                                                                              " INSERT INTO compare_ranges (run_id, rank, start_ns, end_ns, kernel_ns, api_ns, mem_ns) "
                                                                                              "SELECT $1, st.rank, st.s, st.e, coalesce(k.v, 0), coalesce(a.v, 0), coalesce(m.v, 0) FROM "
                                                                                              "st" RANGE_ON(
                                                                                                  "k")
                                                                                                  RANGE_ON(
                                                                                                      "a")
                                                                                                      RANGE_ON(
                                                                                                          "m");
#undef RANGE_JOIN
#undef RANGE_BY
#undef RANGE_ON

static const char done_sql[] =
    "INSERT INTO compare_runs (run_id, version, seconds) VALUES ($1, $2, $3)";

/* The statements after the lock; returns 0, or the code of the statement that failed. */
static int make_locked(PGconn *c, const char *id, double t0, char *errbuf, size_t errlen)
{
    const char *p4[4] = { id, NULL, NULL, NULL };
    char version[16], secs[32];
    PGresult *r = NULL;
    int rc;

    if ((rc = kp_pg_exec(c, tables_sql, errbuf, errlen)) != 0) {
        return rc;
    }
    for (size_t i = 0; i < sizeof(clear_sql) / sizeof(clear_sql[0]); i++) {
        if ((rc = kp_pg_query(c, clear_sql[i], 1, p4, NULL, errbuf, errlen)) != 0) {
            return rc;
        }
    }
    if ((rc = kp_pg_query(c, sums_sql, 1, p4, NULL, errbuf, errlen)) != 0 ||
        (rc = kp_pg_query(c, colls_sql, 1, p4, NULL, errbuf, errlen)) != 0 ||
        (rc = kp_pg_query(c, ops_sql, 1, p4, NULL, errbuf, errlen)) != 0 ||
        (rc = kp_pg_query(c, need_sql, 1, p4, &r, errbuf, errlen)) != 0) {
        return rc;
    }
    for (int t = 0; t < 3; t++) {
        p4[t + 1] = strcmp(PQgetvalue(r, 0, t), "t") == 0 ? "true" : "false";
    }
    if (strcmp(p4[1], "true") == 0 || strcmp(p4[2], "true") == 0 || strcmp(p4[3], "true") == 0) {
        rc = kp_pg_query(c, ranges_sql, 4, p4, NULL, errbuf, errlen);
    }
    PQclear(r);
    if (rc != 0) {
        return rc;
    }
    snprintf(version, sizeof(version), "%d", KP_COMPARE_SUMMARY_VERSION);
    snprintf(secs, sizeof(secs), "%.6f", kp_mono_s() - t0);
    p4[1] = version;
    p4[2] = secs;
    return kp_pg_query(c, done_sql, 3, p4, NULL, errbuf, errlen);
}

int kp_summary_make(PGconn *c, uint64_t run_id, double *secs, char *errbuf, size_t errlen)
{
    char id[24], version[16];
    const char *p2[2] = { id, version };
    PGresult *r = NULL;
    double t0 = kp_mono_s();
    int rc;

    *secs = -1.0;
    if (run_id == 0 || run_id > INT32_MAX) {
        kp_errbuf_set(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        return KP_ENOTFOUND;
    }
    snprintf(id, sizeof(id), "%" PRIu64, run_id);
    snprintf(version, sizeof(version), "%d", KP_COMPARE_SUMMARY_VERSION);
    if ((rc = kp_pg_exec(c, "BEGIN", errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = kp_pg_query(c, lock_sql, 2, p2, &r, errbuf, errlen)) != 0) {
        goto rollback;
    }
    if (PQntuples(r) == 0) {
        kp_errbuf_set(errbuf, errlen, "run %" PRIu64 " does not exist", run_id);
        rc = KP_ENOTFOUND;
        goto rollback;
    }
    /* open: nothing to summarise yet; or summarised already (EndRun again) */
    if (strcmp(PQgetvalue(r, 0, 0), "1") == 0 || strcmp(PQgetvalue(r, 0, 1), "t") == 0) {
        PQclear(r);
        kp_pg_rollback(c);
        return 0;
    }
    PQclear(r);
    r = NULL;
    if ((rc = make_locked(c, id, t0, errbuf, errlen)) != 0 ||
        (rc = kp_pg_exec(c, "COMMIT", errbuf, errlen)) != 0) {
        goto rollback;
    }
    *secs = kp_mono_s() - t0;
    pthread_mutex_lock(&stats_mu);
    stats.made++;
    stats.seconds += *secs;
    pthread_mutex_unlock(&stats_mu);
    return 0;
rollback:
    PQclear(r);
    kp_pg_rollback(c);
fail:
    pthread_mutex_lock(&stats_mu);
    stats.failed++;
    pthread_mutex_unlock(&stats_mu);
    return rc;
}

/* Makes run_id's summary on c and says how it went. */
static void make_logged(PGconn *c, uint64_t run_id)
{
    char err[512] = "";
    double secs;
    int rc = kp_summary_make(c, run_id, &secs, err, sizeof(err));

    if (rc != 0) {
        kp_log_warn("compare summary failed run=%" PRIu64 " err=\"%s\" (compare reads the run's "
                    "events instead)",
                    run_id, err);
    }
    else if (secs >= 0) {
        kp_log_info("compare summary made run=%" PRIu64 " seconds=%.3f", run_id, secs);
    }
}

/* The summariser (kp_summary_start). */
struct summariser {
    char *conninfo;
    PGconn *pg; /* the worker's */
    struct kp_workq *q;
    struct kp_complain pg_complain;
};

/* The summariser, shared by the collectords of the process (tests run several): started by
 * the first kp_summary_start, stopped by the last kp_summary_stop. */
static pthread_mutex_t the_mu = PTHREAD_MUTEX_INITIALIZER;
static struct summariser *the;
static int the_users;

static void failed_one(uint64_t run_id, const char *why)
{
    pthread_mutex_lock(&stats_mu);
    stats.failed++;
    pthread_mutex_unlock(&stats_mu);
    kp_log_warn("compare summary failed run=%" PRIu64 " err=\"%s\" (compare reads the run's "
                "events instead)",
                run_id, why);
}

static void run_cb(void *ud, void *state, void *item)
{
    struct summariser *s = ud;
    uint64_t run_id = *(uint64_t *) item;
    char err[512] = "";

    (void) state;
    free(item);
    if (s->pg != NULL && PQstatus(s->pg) != CONNECTION_OK) {
        PQfinish(s->pg);
        s->pg = NULL;
    }
    if (s->pg == NULL &&
        kp_pg_connect(s->conninfo, "kprof-collectord-summary", &s->pg, err, sizeof(err)) != 0) {
        kp_complain(&s->pg_complain, KP_LOG_ERROR, KP_LOG_MODULE,
                    "PostgreSQL unreachable for compare summaries err=\"%s\"", err);
        failed_one(run_id, err);
        return;
    }
    kp_release(&s->pg_complain, KP_LOG_MODULE, "PostgreSQL reachable again for compare summaries");
    make_logged(s->pg, run_id);
}

static void cancel_cb(void *ud, void *item)
{
    (void) ud;
    failed_one(*(uint64_t *) item, "collectord stopped before it was made");
    free(item);
}

int kp_summary_start(const char *conninfo, char *errbuf, size_t errlen)
{
    static const struct kp_workq_ops ops = { .run = run_cb, .cancel = cancel_cb };
    struct kp_workq_opts qo = { .workers = 1, .queue_max = KP_SUMMARY_QUEUE_MAX };
    struct summariser *s;
    int rc = 0;

    pthread_mutex_lock(&the_mu);
    if (the != NULL) {
        the_users++;
        goto out;
    }
    if ((s = calloc(1, sizeof(*s))) == NULL || (s->conninfo = strdup(conninfo)) == NULL) {
        free(s);
        kp_errbuf_set(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = kp_workq_create(&qo, &ops, s, &s->q, errbuf, errlen)) != 0) {
        free(s->conninfo);
        free(s);
        goto out;
    }
    the = s;
    the_users = 1;
out:
    pthread_mutex_unlock(&the_mu);
    return rc;
}

void kp_summary_stop(void)
{
    struct summariser *s = NULL;

    pthread_mutex_lock(&the_mu);
    if (the != NULL && --the_users == 0) {
        s = the;
        the = NULL;
    }
    pthread_mutex_unlock(&the_mu);
    if (s == NULL) {
        return;
    }
    kp_workq_destroy(s->q);
    if (s->pg != NULL) {
        PQfinish(s->pg);
    }
    free(s->conninfo);
    free(s);
}

void kp_summary_after_end(PGconn *c, uint64_t run_id)
{
    uint64_t *item;
    int rc;

    pthread_mutex_lock(&the_mu);
    if (the == NULL) {
        pthread_mutex_unlock(&the_mu);
        make_logged(c, run_id);
        return;
    }
    if ((item = malloc(sizeof(*item))) == NULL) {
        rc = -ENOMEM;
    }
    else {
        *item = run_id;
        rc = kp_workq_submit(the->q, item); /* (returns at once) */
    }
    pthread_mutex_unlock(&the_mu);
    if (rc != 0) {
        free(item);
        failed_one(run_id, rc == -ENOMEM  ? "out of memory"
                           : rc == -EBUSY ? "too many summaries queued"
                                          : "collectord is stopping");
    }
}

void kp_summary_get_stats(struct kp_summary_stats *out)
{
    pthread_mutex_lock(&stats_mu);
    *out = stats;
    pthread_mutex_unlock(&stats_mu);
}
