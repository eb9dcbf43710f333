#define KP_LOG_MODULE "pg"
#include "kp_pg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kp_err.h"
#include "kp_log.h"
#include "kp_migrations.h"
#include "kp_secret.h"
#include "kp_strbuf.h"

/* Largest buffer handed to PQputCopyData at once (its length is an int). */
#define KP_PG_COPY_CHUNK (1u << 20)

/* pg_advisory_xact_lock key that serialises kp_pg_migrate across processes ("kprofmig"). */
#define KP_PG_MIGRATE_LOCK "7741294115474884455"

/* The last failure of a kp_pg_* call on this thread, for kp_pg_last_fault. */
static _Thread_local bool last_failed;
static _Thread_local char last_state[6];

/* The password of --pg-password-file, set once at start (kp_pg_password_file_load) before any
 * connection; NULL: none. Never logged. */
static char *pg_password;

static void fault_clear(void)
{
    last_failed = false;
    last_state[0] = '\0';
}

static void fault_set(const char *sqlstate)
{
    last_failed = true;
    snprintf(last_state, sizeof(last_state), "%s", sqlstate != NULL ? sqlstate : "");
}

/* Copies s into errbuf on one line: newlines and tabs become spaces, runs of them collapse,
 * and trailing blanks go. */
static void put_line(char *errbuf, size_t errlen, const char *prefix, const char *s)
{
    size_t o = 0;
    bool space = false;
    int r;

    if (errbuf == NULL || errlen == 0) {
        return;
    }
    r = snprintf(errbuf, errlen, "%s", prefix != NULL ? prefix : "");
    o = r > 0 ? (size_t) r : 0;
    if (o >= errlen) {
        return;
    }
    for (; s != NULL && *s != '\0' && o + 1 < errlen; s++) {
        if (*s == '\n' || *s == '\t' || *s == '\r' || *s == ' ') {
            space = o > 0;
            continue;
        }
        if (space && o + 2 < errlen) {
            errbuf[o++] = ' ';
        }
        space = false;
        errbuf[o++] = *s;
    }
    errbuf[o] = '\0';
}

/* Describes a failed result (or, without one, the connection's error) in errbuf and records
 * the failure for kp_pg_last_fault. */
static void set_error(PGconn *c, const PGresult *res, char *errbuf, size_t errlen)
{
    const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *primary = res != NULL ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    const char *detail = res != NULL ? PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : NULL;
    char line[384];

    fault_set(state);
    if (errbuf == NULL || errlen == 0) {
        return;
    }
    if (primary != NULL) {
        snprintf(line, sizeof(line), "%s%s%s (SQLSTATE %s)", primary, detail != NULL ? ": " : "",
                 detail != NULL ? detail : "", state != NULL ? state : "?");
        put_line(errbuf, errlen, NULL, line);
        return;
    }
    if (res != NULL && PQresultErrorMessage(res)[0] != '\0') {
        put_line(errbuf, errlen, NULL, PQresultErrorMessage(res));
    }
    else if (c != NULL && PQerrorMessage(c)[0] != '\0') {
        put_line(errbuf, errlen, NULL, PQerrorMessage(c));
    }
    else {
        snprintf(errbuf, errlen, "PostgreSQL call failed (%s)",
                 res != NULL ? PQresStatus(PQresultStatus(res)) : "no result");
    }
}

static void notice_cb(void *arg, const char *message)
{
    char line[512];

    put_line(line, sizeof(line), NULL, message);
    kp_log_debug("notice msg=\"%s\"", line);
}

int kp_pg_connect(const char *conninfo, const char *application_name, PGconn **out, char *errbuf,
                  size_t errlen)
{
    PQconninfoOption *opts = NULL;
    const char *keys[10];
    const char *vals[10];
    char *perr = NULL;
    bool has_timeout = false, has_keepalives = false, has_encoding = false;
    PGconn *c = NULL;
    int n = 0, rc;

    fault_clear();
    if (conninfo == NULL) {
        conninfo = "";
    }
    /* A bare word is a database name, which libpq's expand_dbname takes but
     * PQconninfoParse refuses. */
    if (strchr(conninfo, '=') == NULL && strncmp(conninfo, "postgresql://", 13) != 0 &&
        strncmp(conninfo, "postgres://", 11) != 0) {
        opts = PQconninfoParse("", &perr);
    }
    else {
        opts = PQconninfoParse(conninfo, &perr);
    }
    if (opts == NULL) {
        if (perr == NULL) {
            snprintf(errbuf, errlen, "out of memory");
            return -ENOMEM;
        }
        put_line(errbuf, errlen, "invalid conninfo: ", perr);
        PQfreemem(perr);
        return KP_ECONFIG;
    }
    for (const PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        if (o->val == NULL || o->val[0] == '\0') {
            continue;
        }
        has_timeout |= strcmp(o->keyword, "connect_timeout") == 0;
        has_keepalives |= strncmp(o->keyword, "keepalives", 10) == 0;
        has_encoding |= strcmp(o->keyword, "client_encoding") == 0;
    }
    PQconninfoFree(opts);

    /* dbname first with expand_dbname: conninfo's settings, then ours override them. */
    keys[n] = "dbname";
    vals[n++] = conninfo;
    if (application_name != NULL) {
        keys[n] = "application_name";
        vals[n++] = application_name;
    }
    if (!has_timeout) {
        keys[n] = "connect_timeout";
        vals[n++] = "10";
    }
    if (!has_encoding) {
        /* kprof's strings are UTF-8 (the codec checks), whatever PGCLIENTENCODING says. */
        keys[n] = "client_encoding";
        vals[n++] = "UTF8";
    }
    if (!has_keepalives) {
        /* Notice a dead peer within about a minute instead of the kernel's two hours. */
        keys[n] = "keepalives_idle";
        vals[n++] = "30";
        keys[n] = "keepalives_interval";
        vals[n++] = "10";
        keys[n] = "keepalives_count";
        vals[n++] = "3";
    }
    if (pg_password != NULL) {
        /* After dbname: overrides a password in conninfo, PGPASSWORD and PGPASSFILE. */
        keys[n] = "password";
        vals[n++] = pg_password;
    }
    keys[n] = NULL;
    vals[n] = NULL;

    if ((c = PQconnectdbParams(keys, vals, 1)) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    if (PQstatus(c) != CONNECTION_OK) {
        set_error(c, NULL, errbuf, errlen);
        rc = KP_EPG;
        goto fail;
    }
    PQsetNoticeProcessor(c, notice_cb, NULL);
    *out = c;
    return 0;
fail:
    if (c != NULL) {
        PQfinish(c);
    }
    return rc;
}

int kp_pg_password_file_load(const char *path, char *errbuf, size_t errlen)
{
    char buf[1024];
    long n;

    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    if ((n = kp_secret_file_line(path, "the PostgreSQL password file", false, buf, sizeof(buf),
                                 errbuf, errlen)) < 0) {
        return (int) n;
    }
    if (pg_password != NULL) {
        explicit_bzero(pg_password, strlen(pg_password));
        free(pg_password);
    }
    pg_password = strdup(buf);
    explicit_bzero(buf, sizeof(buf));
    if (pg_password == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

/* Checks a result: OK for commands and queries, an error otherwise. Takes res unless the
 * caller wants it back through keep. */
static int check_result(PGconn *c, PGresult *res, PGresult **keep, char *errbuf, size_t errlen)
{
    ExecStatusType st = res != NULL ? PQresultStatus(res) : PGRES_FATAL_ERROR;

    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_EMPTY_QUERY) {
        fault_clear();
        if (keep != NULL) {
            *keep = res;
        }
        else {
            PQclear(res);
        }
        return 0;
    }
    if (st == PGRES_COPY_IN) {
        /* A statement we did not expect to COPY: end it so the connection stays usable. */
        PQclear(res);
        PQputCopyEnd(c, "unexpected COPY");
        while ((res = PQgetResult(c)) != NULL && PQresultStatus(res) != PGRES_COPY_IN) {
            PQclear(res);
        }
        snprintf(errbuf, errlen, "statement unexpectedly started a COPY");
        fault_set("");
        PQclear(res);
        return KP_EPG;
    }
    set_error(c, res, errbuf, errlen);
    PQclear(res);
    return KP_EPG;
}

int kp_pg_exec(PGconn *c, const char *sql, char *errbuf, size_t errlen)
{
    return check_result(c, PQexec(c, sql), NULL, errbuf, errlen);
}

int kp_pg_query(PGconn *c, const char *sql, int n_params, const char *const *params, PGresult **out,
                char *errbuf, size_t errlen)
{
    PGresult *res = PQexecParams(c, sql, n_params, NULL, params, NULL, NULL, 0);

    return check_result(c, res, out, errbuf, errlen);
}

int kp_pg_copy_out(PGconn *c, const char *sql, kp_pg_row_fn *fn, void *ud, char *errbuf,
                   size_t errlen)
{
    PGresult *res = PQexec(c, sql);
    char *buf;
    int n, rc = 0, prc;

    if (res == NULL || PQresultStatus(res) != PGRES_COPY_OUT) {
        prc = check_result(c, res, NULL, errbuf, errlen);
        if (prc == 0) {
            snprintf(errbuf, errlen, "statement did not start a COPY TO STDOUT");
            fault_set("");
            prc = KP_EPG;
        }
        return prc;
    }
    PQclear(res);
    while ((n = PQgetCopyData(c, &buf, 0)) > 0) {
        if (rc == 0) {
            rc = fn(ud, buf, (size_t) n - (buf[n - 1] == '\n'));
        }
        PQfreemem(buf);
    }
    /* -1: the COPY is over, its result follows; -2: failed, the result says why */
    prc = check_result(c, PQgetResult(c), NULL, errbuf, errlen);
    while ((res = PQgetResult(c)) != NULL) {
        PQclear(res);
    }
    return prc != 0 ? prc : rc;
}

int kp_pg_reopen(PGconn *c, char *errbuf, size_t errlen)
{
    PQreset(c);
    if (PQstatus(c) != CONNECTION_OK) {
        put_line(errbuf, errlen, "PostgreSQL is unreachable: ", PQerrorMessage(c));
        fault_set("08006");
        return KP_EPG;
    }
    fault_clear();
    return 0;
}

/* Whether fn's failure (rc) lost the connection: kp_pg_conn_lost, or a failure that libpq saw
 * without an answer from the server (no SQLSTATE), such as "server closed the connection
 * unexpectedly" after a crash, which can leave PQstatus OK until the next call. */
static bool work_lost(PGconn *c, int rc)
{
    return rc != 0 &&
           (kp_pg_conn_lost(c) || (rc == KP_EPG && last_failed && last_state[0] == '\0'));
}

int kp_pg_retry(PGconn *c, bool repeat, kp_pg_work_fn *fn, void *ud, char *errbuf, size_t errlen)
{
    char first[384];
    int rc = fn(c, ud, errbuf, errlen);

    if (!work_lost(c, rc)) {
        return rc;
    }
    snprintf(first, sizeof(first), "%s", errbuf != NULL && errlen > 0 ? errbuf : "");
    if (repeat) {
        kp_log_info("connection to PostgreSQL lost; reconnecting to repeat the work err=\"%s\"",
                    first);
        if ((rc = kp_pg_reopen(c, errbuf, errlen)) != 0) {
            return rc;
        }
        if (!work_lost(c, (rc = fn(c, ud, errbuf, errlen)))) {
            return rc;
        }
        snprintf(first, sizeof(first), "%s", errbuf != NULL && errlen > 0 ? errbuf : "");
    }
    if (errbuf != NULL && errlen > 0) {
        snprintf(errbuf, errlen, "PostgreSQL is unreachable: the connection broke (%s)", first);
    }
    fault_set("08006");
    return KP_EPG;
}

static int ping_work(PGconn *c, void *ud, char *errbuf, size_t errlen)
{
    (void) ud;
    return kp_pg_exec(c, "", errbuf, errlen);
}

int kp_pg_ping(PGconn *c, char *errbuf, size_t errlen)
{
    return kp_pg_retry(c, true, ping_work, NULL, errbuf, errlen);
}

int kp_pg_copy_begin(PGconn *c, const char *table, const char *columns, char *errbuf, size_t errlen)
{
    size_t len = strlen(table) + strlen(columns) + 32;
    char *sql = malloc(len);
    PGresult *res;
    int rc = 0;

    if (sql == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    snprintf(sql, len, "COPY %s (%s) FROM STDIN", table, columns);
    res = PQexec(c, sql);
    if (res == NULL || PQresultStatus(res) != PGRES_COPY_IN) {
        set_error(c, res, errbuf, errlen);
        rc = KP_EPG;
    }
    else {
        fault_clear();
    }
    PQclear(res);
    free(sql);
    return rc;
}

int kp_pg_copy_put(PGconn *c, const char *data, size_t len, char *errbuf, size_t errlen)
{
    while (len > 0) {
        size_t n = len < KP_PG_COPY_CHUNK ? len : KP_PG_COPY_CHUNK;

        if (PQputCopyData(c, data, (int) n) != 1) {
            set_error(c, NULL, errbuf, errlen);
            return KP_EPG;
        }
        data += n;
        len -= n;
    }
    return 0;
}

long kp_pg_copy_end(PGconn *c, const char *abort_reason, char *errbuf, size_t errlen)
{
    PGresult *res;
    long rows = 0;
    bool failed = false;
    bool keep_fault = abort_reason != NULL;
    bool was_failed = last_failed;
    char was_state[6];

    /* An abort follows the caller's own failure: keep that one for kp_pg_last_fault. */
    memcpy(was_state, last_state, sizeof(was_state));
    if (PQputCopyEnd(c, abort_reason) != 1) {
        set_error(c, NULL, errbuf, errlen);
        failed = true;
    }
    while ((res = PQgetResult(c)) != NULL) {
        ExecStatusType st = PQresultStatus(res);

        if (st == PGRES_COPY_IN) {
            /* The end message never went out: the connection is stuck in COPY and only a new
             * one helps, so report it as lost (SQLSTATE 08006). */
            PQclear(res);
            if (!failed) {
                set_error(c, NULL, errbuf, errlen);
            }
            fault_set("08006");
            return KP_EPG;
        }
        if (st == PGRES_COMMAND_OK) {
            rows += strtol(PQcmdTuples(res), NULL, 10);
        }
        else if (!failed) {
            set_error(c, res, errbuf, errlen);
            failed = true;
        }
        PQclear(res);
    }
    if (keep_fault) {
        last_failed = was_failed;
        memcpy(last_state, was_state, sizeof(was_state));
        if (!failed) {
            snprintf(errbuf, errlen, "COPY abandoned: %s", abort_reason);
        }
        return KP_EPG;
    }
    if (failed) {
        return KP_EPG;
    }
    fault_clear();
    return rows;
}

long kp_pg_copy_in(PGconn *c, const char *table, const char *columns, const char *data, size_t len,
                   char *errbuf, size_t errlen)
{
    char scratch[8];
    int rc;

    if ((rc = kp_pg_copy_begin(c, table, columns, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((rc = kp_pg_copy_put(c, data, len, errbuf, errlen)) != 0) {
        kp_pg_copy_end(c, "client failed to send the data", scratch, sizeof(scratch));
        return rc;
    }
    return kp_pg_copy_end(c, NULL, errbuf, errlen);
}

int kp_pg_schema_version(void)
{
    int v = 0;

    for (size_t i = 0; i < kp_migrations_count; i++) {
        if (kp_migrations[i].version > v) {
            v = kp_migrations[i].version;
        }
    }
    return v;
}

void kp_pg_rollback(PGconn *c)
{
    PGTransactionStatusType ts = c != NULL ? PQtransactionStatus(c) : PQTRANS_UNKNOWN;
    bool failed = last_failed;
    char state[6];
    char scratch[8];

    if (c == NULL || (ts != PQTRANS_INTRANS && ts != PQTRANS_INERROR)) {
        return;
    }
    memcpy(state, last_state, sizeof(state));
    kp_pg_exec(c, "ROLLBACK", scratch, sizeof(scratch));
    last_failed = failed;
    memcpy(last_state, state, sizeof(state));
}

/* Returns the single integer that sql returns. */
static int query_int(PGconn *c, const char *sql, int n_params, const char *const *params,
                     long long *out, char *errbuf, size_t errlen)
{
    PGresult *res = NULL;
    int rc;

    if ((rc = kp_pg_query(c, sql, n_params, params, &res, errbuf, errlen)) != 0) {
        return rc;
    }
    if (PQntuples(res) != 1 || PQnfields(res) != 1 || PQgetisnull(res, 0, 0)) {
        snprintf(errbuf, errlen, "expected one value from: %s", sql);
        fault_set("");
        PQclear(res);
        return KP_EPG;
    }
    *out = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return 0;
}

int kp_pg_migrate(PGconn *c, char *errbuf, size_t errlen)
{
    int known = kp_pg_schema_version();
    long long current = 0, have = 0;
    char err[384] = "";
    int applied = 0, rc;

    fault_clear();
    for (size_t i = 1; i < kp_migrations_count; i++) {
        if (kp_migrations[i].version <= kp_migrations[i - 1].version) {
            snprintf(errbuf, errlen, "embedded migrations are not in ascending order at %s",
                     kp_migrations[i].name);
            return KP_ESCHEMA;
        }
    }
    /* The lock comes first: CREATE TABLE IF NOT EXISTS itself races between processes. */
    if ((rc = kp_pg_exec(c,
                         "BEGIN; SELECT pg_advisory_xact_lock(" KP_PG_MIGRATE_LOCK "); "
                         "CREATE TABLE IF NOT EXISTS kp_schema_migrations ("
                         "version integer PRIMARY KEY, name text NOT NULL, "
                         "applied_at timestamptz NOT NULL DEFAULT now())",
                         err, sizeof(err))) != 0 ||
        (rc = query_int(c, "SELECT coalesce(max(version), 0) FROM kp_schema_migrations", 0, NULL,
                        &current, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "schema migrations table: %s", err);
        goto fail;
    }
    if (current > known) {
        snprintf(errbuf, errlen,
                 "the database schema is version %lld but this binary knows versions up to %d; "
                 "upgrade kprof",
                 current, known);
        rc = KP_ESCHEMA;
        goto fail;
    }
    if ((rc = kp_pg_exec(c, "COMMIT", err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "schema migrations table: %s", err);
        goto fail;
    }
    for (size_t i = 0; i < kp_migrations_count; i++) {
        const struct kp_migration *m = &kp_migrations[i];
        char version[16];
        const char *params[2] = { version, m->name };

        snprintf(version, sizeof(version), "%d", m->version);
        if ((rc = kp_pg_exec(c, "BEGIN; SELECT pg_advisory_xact_lock(" KP_PG_MIGRATE_LOCK ")", err,
                             sizeof(err))) != 0 ||
            (rc = query_int(c, "SELECT count(*) FROM kp_schema_migrations WHERE version = $1", 1,
                            params, &have, err, sizeof(err))) != 0) {
            snprintf(errbuf, errlen, "migration %s: %s", m->name, err);
            goto fail;
        }
        if (have != 0) {
            /* Applied before, or by another process while we waited for the lock. */
            if ((rc = kp_pg_exec(c, "COMMIT", err, sizeof(err))) != 0) {
                snprintf(errbuf, errlen, "migration %s: %s", m->name, err);
                goto fail;
            }
            continue;
        }
        if ((rc = kp_pg_exec(c, m->sql, err, sizeof(err))) != 0 ||
            (rc = kp_pg_query(c, "INSERT INTO kp_schema_migrations (version, name) VALUES ($1, $2)",
                              2, params, NULL, err, sizeof(err))) != 0 ||
            (rc = kp_pg_exec(c, "COMMIT", err, sizeof(err))) != 0) {
            snprintf(errbuf, errlen, "migration %s: %s", m->name, err);
            goto fail;
        }
        kp_log_info("migration applied version=%d name=%s", m->version, m->name);
        applied++;
    }
    return applied;
fail:
    kp_pg_rollback(c);
    return rc;
}

int kp_pg_migrate_if_owner(PGconn *c, char *errbuf, size_t errlen)
{
    /* Whether kp_schema_migrations exists, and whether this user may migrate: a member of the
     * table's owner (the owner itself and superusers are), or, in a database without it, a user
     * who may CREATE in the schema the migrations would create their tables in. */
    static const char may_sql[] =
        "SELECT to_regclass('kp_schema_migrations') IS NOT NULL, "
        "coalesce(CASE WHEN to_regclass('kp_schema_migrations') IS NULL "
        "THEN has_schema_privilege(current_schema(), 'CREATE') "
        "ELSE pg_has_role((SELECT relowner FROM pg_class "
        "WHERE oid = to_regclass('kp_schema_migrations')), 'USAGE') END, false), "
        "coalesce(has_table_privilege(to_regclass('kp_schema_migrations'), 'SELECT'), false)";
    int known = kp_pg_schema_version();
    long long current = 0, have = 0, missing = 0;
    const char *missing_name = "all of them";
    PGresult *res = NULL;
    bool exists, may, readable;
    char versions[1024];
    const char *params[1] = { versions };
    size_t o = 0;
    char err[384] = "";
    int rc;

    fault_clear();
    if ((rc = kp_pg_query(c, may_sql, 0, NULL, &res, err, sizeof(err))) != 0) {
        snprintf(errbuf, errlen, "schema migrations table: %s", err);
        return rc;
    }
    exists = PQgetvalue(res, 0, 0)[0] == 't';
    may = PQgetvalue(res, 0, 1)[0] == 't';
    readable = PQgetvalue(res, 0, 2)[0] == 't';
    PQclear(res);
    if (exists && !readable) {
        /* A user in none of kprof's roles, or a database from before them (migration 0012). */
        snprintf(errbuf, errlen,
                 "user %s may not read kp_schema_migrations: run kprof-collectord --migrate as the "
                 "database owner, and connect as a member of kprof_writer",
                 PQuser(c));
        return KP_ESCHEMA;
    }
    if (exists) {
        /* The embedded versions as an array literal: pending means one of them is missing
         * (versions may have gaps, and one may come later than a higher one). */
        o = (size_t) snprintf(versions, sizeof(versions), "{");
        for (size_t i = 0; i < kp_migrations_count && o < sizeof(versions); i++) {
            o += (size_t) snprintf(versions + o, sizeof(versions) - o, "%s%d", i > 0 ? "," : "",
                                   kp_migrations[i].version);
        }
        if (o + 2 > sizeof(versions)) {
            snprintf(errbuf, errlen, "too many embedded migrations for the version check");
            return KP_ESCHEMA;
        }
        snprintf(versions + o, sizeof(versions) - o, "}");
        if ((rc = kp_pg_query(c,
                              "SELECT coalesce(max(version), 0), "
                              "count(*) FILTER (WHERE version = ANY($1::integer[])), "
                              "(SELECT min(v) FROM unnest($1::integer[]) v WHERE NOT EXISTS "
                              "(SELECT FROM kp_schema_migrations m WHERE m.version = v)) "
                              "FROM kp_schema_migrations",
                              1, params, &res, err, sizeof(err))) != 0) {
            snprintf(errbuf, errlen, "schema migrations table: %s", err);
            return rc;
        }
        current = kp_pg_i64(res, 0, 0, 0);
        have = kp_pg_i64(res, 0, 1, 0);
        missing = kp_pg_i64(res, 0, 2, 0);
        PQclear(res);
        if (current > known) {
            snprintf(errbuf, errlen,
                     "the database schema is version %lld but this binary knows versions up to "
                     "%d; upgrade kprof",
                     current, known);
            return KP_ESCHEMA;
        }
        if (have == (long long) kp_migrations_count) {
            return 0;
        }
    }
    if (may) {
        return kp_pg_migrate(c, errbuf, errlen);
    }
    /* The first one missing: with versions out of order (a lower one merged later), the
     * schema can be "at" the binary's version and still lack one. */
    for (size_t i = 0; i < kp_migrations_count; i++) {
        if (kp_migrations[i].version == missing) {
            missing_name = kp_migrations[i].name;
        }
    }
    snprintf(errbuf, errlen,
             "the schema is at version %lld, this binary needs %d: run kprof-collectord --migrate "
             "as the database owner (user %s may not change the schema; missing: %s)",
             current, known, PQuser(c), missing_name);
    return KP_ESCHEMA;
}

enum kp_pg_fault kp_pg_classify_sqlstate(const char *s)
{
    if (s == NULL || strlen(s) != 5) {
        return KP_PG_FAULT_STATEMENT;
    }
    /* Class 08: connection exception. 57P01..57P05: admin/crash shutdown, cannot connect
     * now, database dropped, idle session timeout. 25006: read-only transaction, i.e. we
     * reached a standby after a failover; a new connection finds the primary. */
    if (strncmp(s, "08", 2) == 0 || strncmp(s, "57P0", 4) == 0 || strcmp(s, "25006") == 0) {
        return KP_PG_FAULT_CONN;
    }
    /* Class 40: transaction rollback (serialization failure, deadlock). 53: insufficient
     * resources (disk full, out of memory, too many connections). 58: system error (I/O).
     * 55P03: lock not available. 57014: query cancelled (statement_timeout, pg_cancel). */
    if (strncmp(s, "40", 2) == 0 || strncmp(s, "53", 2) == 0 || strncmp(s, "58", 2) == 0 ||
        strcmp(s, "55P03") == 0 || strcmp(s, "57014") == 0) {
        return KP_PG_FAULT_TRANSIENT;
    }
    return KP_PG_FAULT_STATEMENT;
}

enum kp_pg_fault kp_pg_last_fault(const PGconn *c)
{
    if (c == NULL || PQstatus(c) == CONNECTION_BAD) {
        return KP_PG_FAULT_CONN;
    }
    if (!last_failed) {
        return KP_PG_FAULT_NONE;
    }
    return kp_pg_classify_sqlstate(last_state);
}

bool kp_pg_conn_lost(const PGconn *c)
{
    return kp_pg_last_fault(c) == KP_PG_FAULT_CONN;
}

const char *kp_pg_last_sqlstate(void)
{
    return last_state;
}

/* --- array literals --- */

/* The comma before an element that is not the array's first: the open '{' is the last byte
 * only before the first element. */
static int array_sep(struct kp_strbuf *sb)
{
    return sb->len > 0 && sb->data[sb->len - 1] == '{' ? 0 : kp_strbuf_putc(sb, ',');
}

int kp_pg_array_open(struct kp_strbuf *sb)
{
    return kp_strbuf_putc(sb, '{');
}

int kp_pg_array_close(struct kp_strbuf *sb)
{
    return kp_strbuf_putc(sb, '}');
}

int kp_pg_array_i64(struct kp_strbuf *sb, int64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%" PRId64, v);
    int rc = array_sep(sb);

    return rc != 0 ? rc : kp_strbuf_append(sb, tmp, (size_t) n);
}

int kp_pg_array_null(struct kp_strbuf *sb)
{
    int rc = array_sep(sb);

    return rc != 0 ? rc : kp_strbuf_append_str(sb, "NULL");
}

int kp_pg_array_text(struct kp_strbuf *sb, const char *s)
{
    int rc;

    if (s == NULL) {
        return kp_pg_array_null(sb);
    }
    if ((rc = array_sep(sb)) != 0 || (rc = kp_strbuf_putc(sb, '"')) != 0) {
        return rc;
    }
    while (*s != '\0') {
        size_t n = strcspn(s, "\"\\");

        if ((rc = kp_strbuf_append(sb, s, n)) != 0) {
            return rc;
        }
        s += n;
        if (*s != '\0' &&
            ((rc = kp_strbuf_putc(sb, '\\')) != 0 || (rc = kp_strbuf_putc(sb, *s++)) != 0)) {
            return rc;
        }
    }
    return kp_strbuf_putc(sb, '"');
}

int kp_pg_array_i64s(struct kp_strbuf *sb, const int64_t *v, size_t n)
{
    int rc = kp_pg_array_open(sb);

    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = kp_pg_array_i64(sb, v[i]);
    }
    return rc != 0 ? rc : kp_pg_array_close(sb);
}

int kp_pg_array_next_i64(const char **p, int64_t *v, bool *null)
{
    const char *s = *p;
    uint64_t u = 0, lim;
    bool neg;

    if (*s == '{') {
        s++;
        if (*s == '}') {
            *p = s + 1;
            return 0;
        }
    }
    else if (*s == '}') {
        *p = s + 1;
        return 0;
    }
    else if (*s++ != ',') {
        return -EINVAL;
    }
    if (strncmp(s, "NULL", 4) == 0) {
        s += 4;
        *v = 0;
        *null = true;
    }
    else {
        neg = *s == '-';
        s += neg;
        lim = neg ? (uint64_t) INT64_MAX + 1 : (uint64_t) INT64_MAX;
        if (*s < '0' || *s > '9') {
            return -EINVAL;
        }
        for (; *s >= '0' && *s <= '9'; s++) {
            if (u > (lim - (uint64_t) (*s - '0')) / 10) {
                return -EINVAL;
            }
            u = u * 10 + (uint64_t) (*s - '0');
        }
        *v = neg ? (int64_t) (0 - u) : (int64_t) u;
        *null = false;
    }
    if (*s != ',' && *s != '}') {
        return -EINVAL;
    }
    *p = s;
    return 1;
}

int kp_pg_arrays_next_i64(const char **cur, int n, int64_t *v, bool *null)
{
    int got = 0, rc;

    for (int k = 0; k < n; k++) {
        if ((rc = kp_pg_array_next_i64(&cur[k], &v[k], &null[k])) < 0) {
            return rc;
        }
        got += rc;
    }
    return got == n ? 1 : got == 0 ? 0 : -EINVAL;
}

int kp_pg_copy_fields(char *row, size_t len, char **f, int nf)
{
    int k = 0;

    row[len] = '\0'; /* the newline's byte, or the terminator libpq adds */
    f[k++] = row;
    for (char *p = row; *p; p++) {
        if (*p == '\t') {
            *p = '\0';
            if (k == nf) {
                return -EINVAL;
            }
            f[k++] = p + 1;
        }
    }
    for (int i = 0; i < k; i++) {
        if (f[i][0] == '\\' && f[i][1] == 'N' && f[i][2] == '\0') {
            f[i] = NULL;
        }
    }
    return k == nf ? 0 : -EINVAL;
}

int64_t kp_pg_field_i64(const char *f, int64_t null_value)
{
    bool neg;
    uint64_t v = 0; /* unsigned: INT64_MIN's digits, or a longer run of them, wrap, never UB */

    if (!f) {
        return null_value;
    }
    neg = *f == '-';
    for (f += neg; *f >= '0' && *f <= '9'; f++) {
        v = v * 10 + (uint64_t) (*f - '0');
    }
    return (int64_t) (neg ? 0 - v : v);
}
