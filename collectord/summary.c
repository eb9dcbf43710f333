/*
 * Compare summaries (summary.h). Each statement below fills one table of migration 0014 with
 * exactly the rows of one of analyzer/compare_load.c's live queries (named at each), with the
 * same name classes (KP_COMPARE_NAME_CLASS_SQL): so the analyzer reads either and computes the
 * same answer. Two passes over the kernels (the sums with the spans, then the NCCL kernels),
 * one over the ops, the API calls, and the copies with the memsets, each a plain SELECT that
 * PostgreSQL may run in parallel (an INSERT ... SELECT never is), whose rows (a few per rank
 * and step, and the collectives) are copied back; the rows without a step (imports) take one
 * more pass per table, server-side, only where there are such rows. In the same transaction,
 * the dashboards' sums (migration 0016: kprof_dash's per-step and per-kernel figures), two
 * more passes through the functions the dashboards' views use on a run without them.
 */
#define KP_LOG_MODULE "summary"
#include "summary.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_clock.h"
#include "kp_compare_sql.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "kp_workq.h"

#define KP_SUMMARY_QUEUE_MAX 4096 /* runs waiting for their summary, at most */

static pthread_mutex_t stats_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kp_summary_stats stats;

#define NC "nc AS (SELECT id, " KP_COMPARE_NAME_CLASS_SQL " AS c FROM names)"

/* Whether run r.id has a current summary: compare's in this format, and the dashboards' (a
 * run summarised before migration 0016 has only the first). */
#define CURRENT_SQL(v)                                                                    \
    "EXISTS (SELECT 1 FROM compare_runs c JOIN dash_runs d ON d.run_id = c.run_id WHERE " \
    "c.run_id = r.id AND c.version = " v ")"

/* Locks the run against the sink's flushes (FOR SHARE) and EndRun; its state. */
static const char lock_sql[] =
    "SELECT r.state, " CURRENT_SQL("$2") " FROM runs r WHERE r.id = $1 FOR NO KEY UPDATE OF r";

/* The event tables' parents, in name order: the order kp_drop_run (which locks them ACCESS
 * EXCLUSIVE), kp_create_run_partitions and the sink take them in, so that a run dropped
 * meanwhile waits for the summary instead of deadlocking with it. (A run created meanwhile does
 * not wait: since migration 0016 its partitions are attached, under SHARE UPDATE EXCLUSIVE.) */
static const char tables_sql[] = "LOCK TABLE ONLY api_calls, ONLY kernel_chunks, ONLY kernel_rows, "
                                 "ONLY memcpys, ONLY memsets, ONLY ops, ONLY steps IN ACCESS "
                                 "SHARE MODE";

/* The run's kernel rows on pages [$2, $2 + $3) of its kernel_rows partition into chunks
 * (migration 0015): the kernels moved. */
static const char compact_sql[] = "SELECT kp_compact_kernels($1, $2, $3)";

/* The pages of the run's kernel_rows partition (0 without one). */
static const char pages_sql[] =
    "SELECT coalesce(pg_relation_size(to_regclass('kernel_rows_r' || $1)), 0) / "
    "current_setting('block_size')::bigint";

/* Pages of kernel_rows a step of the move takes: 128 MiB, about 1 M kernels, about 3 s. */
#define KP_COMPACT_STEP_PAGES 16384

/* Set while the summariser stops: a move ends after its current step (its rows stay rows until
 * the next start's sweep), so that stopping collectord waits for one step, not a whole run. */
static atomic_bool stopping;

static const char *const clear_sql[] = {
    "DELETE FROM compare_runs WHERE run_id = $1",  "DELETE FROM compare_sums WHERE run_id = $1",
    "DELETE FROM compare_colls WHERE run_id = $1", "DELETE FROM compare_ops WHERE run_id = $1",
    "DELETE FROM compare_spans WHERE run_id = $1", "DELETE FROM compare_ranges WHERE run_id = $1",
    "DELETE FROM dash_steps WHERE run_id = $1",    "DELETE FROM dash_kernels WHERE run_id = $1",
};

/* The name classes' ids compare filters on: NCCL kernels, synchronising API calls, the ops. */
static const char classes_sql[] =
    "SELECT coalesce(array_agg(id) FILTER (WHERE c = 0), '{}'), coalesce(array_agg(id) FILTER "
    "(WHERE c = 4), '{}'), coalesce(array_agg(id) FILTER (WHERE c IN (1, 2, 3)), '{}') FROM "
    "(SELECT id, " KP_COMPARE_NAME_CLASS_SQL " AS c FROM names) x";

/* kern_sql, api_sql and mem_sql as one row per (rank, step) (NULL: no row of that table), with
 * the kernels' first start and last end for span_sql's spans. A plain SELECT, so that
 * PostgreSQL scans in parallel (an INSERT ... SELECT never does); its few rows are copied
 * back. */
static const char sums_sql[] =
    "SELECT rank, step, sum(kv), sum(av), sum(mv), min(lo), max(hi) FROM (SELECT rank, step, "
    "sum(dur_ns) AS kv, NULL::numeric AS av, NULL::numeric AS mv, min(start_ns) AS lo, "
    "max(start_ns + dur_ns) AS hi FROM kernels WHERE run_id = $1 GROUP BY rank, step "
    "UNION ALL SELECT rank, step, NULL, coalesce(sum(dur_ns) FILTER (WHERE coalesce(domain, 1) "
    "= 1 AND NOT coalesce(name = ANY($2::int[]), false)), 0), NULL, NULL, NULL FROM api_calls "
    "WHERE run_id = $1 GROUP BY rank, step "
    "UNION ALL SELECT rank, step, NULL, NULL, sum(dur_ns), NULL, NULL FROM (SELECT rank, step, "
    "dur_ns FROM memcpys WHERE run_id = $1 UNION ALL SELECT rank, step, dur_ns FROM memsets "
    "WHERE run_id = $1) x GROUP BY rank, step) u GROUP BY rank, step";

/* coll_sql and ops_sql: plain SELECTs too (parallel scans of the run's kernels and ops), their
 * rows copied back: the NCCL kernels, and the ProfilerStep, data-loading and Gloo ops. As
 * many rows as compare itself then reads. */
static const char colls_sql[] = "SELECT rank, step, start_ns, dur_ns, name FROM kernels WHERE "
                                "run_id = $1 AND name = ANY($2::int[])";
static const char ops_sql[] = "SELECT rank, step, name, start_ns, dur_ns FROM ops WHERE run_id = "
                              "$1 AND name = ANY($2::int[])";

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

/* The dashboards' sums (migration 0016): the same functions their views use on the events,
 * as plain SELECTs (parallel scans) whose rows are copied back; then the row that makes them
 * count, after compare_runs' (which it references: what makes one stale drops both). */
static const char dash_steps_sql[] = "SELECT * FROM kprof_dash.step_sums_events($1)";
static const char dash_kernels_sql[] = "SELECT * FROM kprof_dash.kernel_sums_events($1)";
static const char dash_done_sql[] = "INSERT INTO dash_runs (run_id) VALUES ($1)";

static int cmp_span(const void *pa, const void *pb)
{
    const int64_t *a = pa, *b = pb;

    return (a[0] > b[0]) - (a[0] < b[0]);
}

/* sums_sql's rows r into compare_sums and, per rank, compare_spans, by COPY. */
static int copy_sums(PGconn *c, const char *id, const PGresult *r, char *errbuf, size_t errlen)
{
    struct kp_strbuf sb;
    int n = PQntuples(r), ns = 0, rc = 0;
    int64_t(*sp)[3] = calloc((size_t) n + 1, sizeof(*sp)); /* rank, first start, last end */

    kp_strbuf_init(&sb, 0);
    if (sp == NULL) {
        rc = -ENOMEM;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        rc = kp_strbuf_append_str(&sb, id);
        for (int f = 0; f < 5 && rc == 0; f++) {
            rc = kp_strbuf_appendf(&sb, "\t%s", PQgetisnull(r, i, f) ? "\\N" : PQgetvalue(r, i, f));
        }
        rc = rc != 0 ? rc : kp_strbuf_putc(&sb, '\n');
        if (!PQgetisnull(r, i, 5)) {
            sp[ns][0] = kp_pg_i64(r, i, 0, 0);
            sp[ns][1] = kp_pg_i64(r, i, 5, 0);
            sp[ns++][2] = kp_pg_i64(r, i, 6, 0);
        }
    }
    if (rc == 0 && kp_pg_copy_in(c, "compare_sums", "run_id, rank, step, kernel_ns, api_ns, mem_ns",
                                 sb.data != NULL ? sb.data : "", sb.len, errbuf, errlen) < 0) {
        rc = KP_EPG;
    }
    qsort(sp, (size_t) ns, sizeof(*sp), cmp_span);
    kp_strbuf_reset(&sb);
    for (int i = 0; i < ns && rc == 0; i++) {
        if (i + 1 < ns && sp[i + 1][0] == sp[i][0]) { /* the rank's next group */
            sp[i + 1][1] = sp[i][1] < sp[i + 1][1] ? sp[i][1] : sp[i + 1][1];
            sp[i + 1][2] = sp[i][2] > sp[i + 1][2] ? sp[i][2] : sp[i + 1][2];
            continue;
        }
        rc = kp_strbuf_appendf(&sb, "%s\t%" PRId64 "\t%" PRId64 "\t%" PRId64 "\n", id, sp[i][0],
                               sp[i][1], sp[i][2]);
    }
    if (rc == 0 && ns > 0 &&
        kp_pg_copy_in(c, "compare_spans", "run_id, rank, kmin, kmax", sb.data, sb.len, errbuf,
                      errlen) < 0) {
        rc = KP_EPG;
    }
    if (rc == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
    }
    kp_strbuf_fini(&sb);
    free(sp);
    return rc;
}

/* The rows of select (n params: the run id first) into table's columns, by COPY with the run
 * id first. */
static int copy_rows(PGconn *c, const char *select, int n, const char *const *params,
                     const char *table, const char *columns, char *errbuf, size_t errlen)
{
    struct kp_strbuf sb;
    PGresult *r = NULL;
    int rc;

    if ((rc = kp_pg_query(c, select, n, params, &r, errbuf, errlen)) != 0) {
        return rc;
    }
    kp_strbuf_init(&sb, 0);
    for (int i = 0; i < PQntuples(r) && rc == 0; i++) {
        rc = kp_strbuf_append_str(&sb, params[0]);
        for (int f = 0; f < PQnfields(r) && rc == 0; f++) {
            rc = kp_strbuf_appendf(&sb, "\t%s", PQgetisnull(r, i, f) ? "\\N" : PQgetvalue(r, i, f));
        }
        rc = rc != 0 ? rc : kp_strbuf_putc(&sb, '\n');
    }
    PQclear(r);
    if (rc != 0) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
    }
    else if (sb.len > 0 && kp_pg_copy_in(c, table, columns, sb.data, sb.len, errbuf, errlen) < 0) {
        rc = KP_EPG;
    }
    kp_strbuf_fini(&sb);
    return rc;
}

/* The statements after the lock; returns 0, or the code of the statement that failed. */
static int make_locked(PGconn *c, const char *id, double t0, char *errbuf, size_t errlen)
{
    const char *p4[4] = { id, NULL, NULL, NULL };
    char version[16], secs[32];
    PGresult *r = NULL, *sums = NULL;
    int rc;

    for (size_t i = 0; i < sizeof(clear_sql) / sizeof(clear_sql[0]); i++) {
        if ((rc = kp_pg_query(c, clear_sql[i], 1, p4, NULL, errbuf, errlen)) != 0) {
            return rc;
        }
    }
    if ((rc = kp_pg_query(c, classes_sql, 0, NULL, &r, errbuf, errlen)) != 0) {
        return rc;
    }
    p4[1] = PQgetvalue(r, 0, 1); /* the sync class */
    if ((rc = kp_pg_query(c, sums_sql, 2, p4, &sums, errbuf, errlen)) != 0 ||
        (rc = copy_sums(c, id, sums, errbuf, errlen)) != 0) {
        PQclear(sums);
        PQclear(r);
        return rc;
    }
    PQclear(sums);
    p4[1] = PQgetvalue(r, 0, 0); /* the NCCL kernels */
    rc = copy_rows(c, colls_sql, 2, p4, "compare_colls",
                   "run_id, rank, step, start_ns, dur_ns, name", errbuf, errlen);
    p4[1] = PQgetvalue(r, 0, 2); /* the ops' classes */
    rc = rc != 0 ? rc
                 : copy_rows(c, ops_sql, 2, p4, "compare_ops",
                             "run_id, rank, step, name, start_ns, dur_ns", errbuf, errlen);
    PQclear(r);
    r = NULL;
    if (rc != 0 || (rc = kp_pg_query(c, need_sql, 1, p4, &r, errbuf, errlen)) != 0) {
        return rc;
    }
    for (int t = 0; t < 3; t++) {
        p4[t + 1] = strcmp(PQgetvalue(r, 0, t), "t") == 0 ? "true" : "false";
    }
    if (strcmp(p4[1], "true") == 0 || strcmp(p4[2], "true") == 0 || strcmp(p4[3], "true") == 0) {
        rc = kp_pg_query(c, ranges_sql, 4, p4, NULL, errbuf, errlen);
    }
    PQclear(r);
    if (rc != 0 ||
        (rc = copy_rows(c, dash_steps_sql, 1, p4, "dash_steps",
                        "run_id, rank, step, compute_ns, nccl_ns, memcpy_ns, memset_ns, kernels, "
                        "nccl_kernels",
                        errbuf, errlen)) != 0 ||
        (rc = copy_rows(c, dash_kernels_sql, 1, p4, "dash_kernels",
                        "run_id, rank, name, calls, total_ns, min_ns, max_ns", errbuf, errlen)) !=
            0) {
        return rc;
    }
    snprintf(version, sizeof(version), "%d", KP_COMPARE_SUMMARY_VERSION);
    snprintf(secs, sizeof(secs), "%.6f", kp_mono_s() - t0);
    p4[1] = version;
    p4[2] = secs;
    if ((rc = kp_pg_query(c, done_sql, 3, p4, NULL, errbuf, errlen)) != 0) {
        return rc;
    }
    return kp_pg_query(c, dash_done_sql, 1, p4, NULL, errbuf, errlen);
}

/* Moves ended run id's kernel rows into chunks, a step of KP_COMPACT_STEP_PAGES pages of its
 * kernel_rows partition per transaction, each with the run locked as the summary locks it: a
 * run created or dropped meanwhile waits for one step. Rows stored after the first step began
 * may stay rows (the next EndRun, or a collectord's start, moves them). Logs a failure once;
 * the rows then stay rows. */
static void compact_steps(PGconn *c, const char *id, const char *version)
{
    char first[24], step[24], err[512] = "";
    const char *p2[2] = { id, version }, *p3[3] = { id, first, step };
    PGresult *r = NULL;
    double t0 = kp_mono_s();
    long long pages, moved = 0;
    int rc;

    snprintf(step, sizeof(step), "%d", KP_COMPACT_STEP_PAGES);
    if ((rc = kp_pg_query(c, pages_sql, 1, p2, &r, err, sizeof(err))) != 0) {
        goto fail;
    }
    pages = kp_pg_i64(r, 0, 0, 0);
    PQclear(r);
    r = NULL;
    for (long long p = 0; p < pages && !atomic_load(&stopping); p += KP_COMPACT_STEP_PAGES) {
        snprintf(first, sizeof(first), "%lld", p);
        if ((rc = kp_pg_exec(c, "BEGIN", err, sizeof(err))) != 0 ||
            (rc = kp_pg_query(c, lock_sql, 2, p2, &r, err, sizeof(err))) != 0) {
            goto rollback;
        }
        if (PQntuples(r) == 0 || strcmp(PQgetvalue(r, 0, 0), "1") == 0) {
            break; /* dropped, or opened again: nothing to move now */
        }
        PQclear(r);
        if ((rc = kp_pg_query(c, compact_sql, 3, p3, &r, err, sizeof(err))) != 0) {
            goto rollback;
        }
        moved += kp_pg_i64(r, 0, 0, 0);
        PQclear(r);
        r = NULL;
        if ((rc = kp_pg_exec(c, "COMMIT", err, sizeof(err))) != 0) {
            goto rollback;
        }
    }
    PQclear(r);
    kp_pg_rollback(c); /* the loop's break leaves a transaction open */
    pthread_mutex_lock(&stats_mu);
    stats.kernels_compacted += (uint64_t) moved;
    stats.compact_seconds += kp_mono_s() - t0;
    pthread_mutex_unlock(&stats_mu);
    if (moved > 0) {
        kp_log_info("kernels compacted run=%s kernels=%lld seconds=%.3f", id, moved,
                    kp_mono_s() - t0);
    }
    return;
rollback:
    PQclear(r);
    kp_pg_rollback(c);
fail:
    kp_log_warn("kernel compaction failed run=%s err=\"%s\" (its kernels stay rows until the next "
                "EndRun or collectord start)",
                id, err);
}

/* The run's partitions indexed by rank and analysed (migration 0017). */
static const char settle_sql[] = "SELECT kp_settle_run($1)";

/* Settles run id's partitions (summary.h); logs how it went. */
static void settle(PGconn *c, const char *id)
{
    char err[512] = "";
    const char *p1[1] = { id };
    PGresult *r = NULL;
    double t0 = kp_mono_s(), dt;
    long long indexed;

    if (atomic_load(&stopping)) {
        return; /* seconds at a thousand ranks: the next start's sweep settles it */
    }
    if (kp_pg_query(c, settle_sql, 1, p1, &r, err, sizeof(err)) != 0) {
        kp_log_warn("settling the run's partitions failed run=%s err=\"%s\" (a read of one "
                    "rank scans the whole run until its next EndRun or collectord's start)",
                    id, err);
        return;
    }
    indexed = kp_pg_i64(r, 0, 0, 0);
    PQclear(r);
    dt = kp_mono_s() - t0;
    pthread_mutex_lock(&stats_mu);
    stats.settled++;
    stats.settle_seconds += dt;
    pthread_mutex_unlock(&stats_mu);
    kp_log_info("run partitions settled run=%s indexed=%lld seconds=%.3f", id, indexed, dt);
}

int kp_summary_make(PGconn *c, uint64_t run_id, double *secs, char *errbuf, size_t errlen)
{
    char id[24], version[16];
    const char *p2[2] = { id, version };
    PGresult *r = NULL;
    double t0 = kp_mono_s();
    bool current;
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
    /* open: nothing to summarise or move yet */
    if (strcmp(PQgetvalue(r, 0, 0), "1") == 0) {
        PQclear(r);
        kp_pg_rollback(c);
        return 0;
    }
    current = strcmp(PQgetvalue(r, 0, 1), "t") == 0; /* summarised already (EndRun again) */
    PQclear(r);
    r = NULL;
    if (current) {
        kp_pg_rollback(c);
    }
    /* The summary first, while the kernels are rows: read through the kernels view from
     * chunks they cost three times as much (5.3 s instead of 2.0 s at 1024 ranks x 2 M
     * kernels). */
    else if ((rc = kp_pg_exec(c, tables_sql, errbuf, errlen)) != 0 ||
             (rc = make_locked(c, id, t0, errbuf, errlen)) != 0 ||
             (rc = kp_pg_exec(c, "COMMIT", errbuf, errlen)) != 0) {
        goto rollback;
    }
    else {
        *secs = kp_mono_s() - t0;
        pthread_mutex_lock(&stats_mu);
        stats.made++;
        stats.seconds += *secs;
        pthread_mutex_unlock(&stats_mu);
    }
    /* Then the kernels move (EndRun again: the rows of late batches), and the partitions,
     * whole now, are settled. */
    compact_steps(c, id, version);
    settle(c, id);
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

/* The ended runs a summariser left undone: kernel rows not moved into chunks (a collectord
 * stopped with its queue full, a failed move, a database migrated to 0015 while a batch was
 * late), no summary in this format (one that failed, a summary format changed by an
 * upgrade, a run summarised before the dashboards' sums of migration 0016) or partitions not
 * settled (its ops partition not indexed by rank: a settle that failed, migration 0017). */
#define UNSETTLED_SQL                                                                             \
    "(to_regclass('ops_r' || r.id) IS NOT NULL AND to_regclass('ops_r' || r.id || '_rank_brin') " \
    "IS NULL)"
static const char undone_sql[] =
    "SELECT r.id FROM runs r WHERE r.state <> 1 AND (EXISTS (SELECT 1 FROM kernel_rows k WHERE "
    "k.run_id = r.id) OR NOT " CURRENT_SQL("$1") " OR " UNSETTLED_SQL ") ORDER BY r.id";

/* The start's sweep, on the summariser's worker: every undone run, oldest first, until the
 * summariser stops (the rest waits for the next start). */
static void sweep(PGconn *c)
{
    char version[16], err[512] = "";
    const char *p1[1] = { version };
    PGresult *r = NULL;

    snprintf(version, sizeof(version), "%d", KP_COMPARE_SUMMARY_VERSION);
    if (kp_pg_query(c, undone_sql, 1, p1, &r, err, sizeof(err)) != 0) {
        kp_log_warn("looking for ended runs to compact or summarise failed err=\"%s\" (EndRun "
                    "of a run does it)",
                    err);
        return;
    }
    if (PQntuples(r) > 0) {
        kp_log_info("ended runs to compact or summarise at start runs=%d", PQntuples(r));
    }
    for (int i = 0; i < PQntuples(r) && !atomic_load(&stopping); i++) {
        make_logged(c, strtoull(PQgetvalue(r, i, 0), NULL, 10));
    }
    PQclear(r);
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
        if (run_id != 0) {
            failed_one(run_id, err);
        }
        return;
    }
    kp_release(&s->pg_complain, KP_LOG_MODULE, "PostgreSQL reachable again for compare summaries");
    if (run_id == 0) {
        sweep(s->pg);
        return;
    }
    make_logged(s->pg, run_id);
}

static void cancel_cb(void *ud, void *item)
{
    (void) ud;
    if (*(uint64_t *) item == 0) { /* the sweep: its runs are looked for again next start */
        free(item);
        return;
    }
    failed_one(*(uint64_t *) item, "collectord stopped before it was made");
    free(item);
}

int kp_summary_start(const char *conninfo, char *errbuf, size_t errlen)
{
    static const struct kp_workq_ops ops = { .run = run_cb, .cancel = cancel_cb };
    struct kp_workq_opts qo = { .workers = 1, .queue_max = KP_SUMMARY_QUEUE_MAX };
    struct summariser *s;
    uint64_t *sweep_item;
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
    /* Item 0 is the start's sweep (run_cb); without memory for it, EndRun still does each. */
    if ((sweep_item = calloc(1, sizeof(*sweep_item))) != NULL &&
        kp_workq_submit(s->q, sweep_item) != 0) {
        free(sweep_item);
    }
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
    atomic_store(&stopping, true);
    kp_workq_destroy(s->q);
    atomic_store(&stopping, false);
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

    if (run_id == 0) { /* no run has id 0 (and item 0 is the summariser's sweep) */
        return;
    }
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
