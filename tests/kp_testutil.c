#define _GNU_SOURCE /* memmem */
#include "kp_testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kp_clock.h"

#define KP_TEST_POLL_MS     5
#define KP_TEST_MAX_LOG     (64u << 20)
#define KP_TEST_MAX_SQL_LEN (1u << 20)

extern char **environ;

/* One poll interval of a bounded wait (the only place tests pause). */
static void poll_pause(void)
{
    struct timespec ts = { 0, KP_TEST_POLL_MS * 1000000L };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int kp_test_scaled_ms(int timeout_ms)
{
    const char *m = getenv("KPROF_TEST_TIMEOUT_MULTIPLIER");
    double f = m != NULL && *m != '\0' ? strtod(m, NULL) : 1.0;

    if (!(f > 0)) {
        f = 1.0;
    }
    return (int) ((double) timeout_ms * f);
}

bool kp_test_wait_for(bool (*cond)(void *arg), void *arg, int timeout_ms)
{
    long long deadline = kp_mono_ms() + kp_test_scaled_ms(timeout_ms);

    for (;;) {
        if (cond(arg)) {
            return true;
        }
        if (kp_mono_ms() >= deadline) {
            return cond(arg);
        }
        poll_pause();
    }
}

const char *kp_test_pg_conninfo(void)
{
    const char *ci = getenv("KPROF_TEST_PG");

    if (ci == NULL || ci[0] == '\0') {
        print_message("KPROF_TEST_PG is not set; skipping\n");
        skip();
    }
    return ci;
}

static PGconn *connect_or_fail(const char *conninfo)
{
    PGconn *c = PQconnectdb(conninfo);

    if (c == NULL || PQstatus(c) != CONNECTION_OK) {
        fail_msg("cannot connect to the test PostgreSQL (%s): %s", conninfo,
                 c != NULL ? PQerrorMessage(c) : "out of memory");
    }
    return c;
}

static void quiet_notice(void *arg, const char *msg)
{}

PGconn *kp_test_pg_connect(void)
{
    PGconn *c = connect_or_fail(kp_test_pg_conninfo());

    PQsetNoticeProcessor(c, quiet_notice, NULL);
    return c;
}

/* Formats sql_fmt into a malloc'd string; fails the test on error. */
static char *vformat(const char *fmt, va_list ap)
{
    va_list ap2;
    char *s;
    int n;

    va_copy(ap2, ap);
    n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0 || (size_t) n > KP_TEST_MAX_SQL_LEN || (s = malloc((size_t) n + 1)) == NULL) {
        fail_msg("cannot format SQL: %s", fmt);
        return NULL;
    }
    vsnprintf(s, (size_t) n + 1, fmt, ap);
    return s;
}

long long kp_test_pg_int(PGconn *c, const char *sql_fmt, ...)
{
    char sql_copy[512];
    PGresult *res;
    long long v;
    va_list ap;
    char *sql;

    va_start(ap, sql_fmt);
    sql = vformat(sql_fmt, ap);
    va_end(ap);
    res = PQexec(c, sql);
    snprintf(sql_copy, sizeof(sql_copy), "%s", sql);
    free(sql);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        char msg[512];

        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(res));
        PQclear(res);
        fail_msg("query failed: %s: %s", sql_copy, msg);
    }
    if (PQntuples(res) != 1 || PQnfields(res) != 1) {
        int rows = PQntuples(res), cols = PQnfields(res);

        PQclear(res);
        fail_msg("query returned %d rows of %d columns, not one value: %s", rows, cols, sql_copy);
    }
    if (PQgetisnull(res, 0, 0)) {
        PQclear(res);
        fail_msg("query returned NULL: %s", sql_copy);
    }
    v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return v;
}

void kp_test_pg_exec(PGconn *c, const char *sql_fmt, ...)
{
    char sql_copy[512];
    PGresult *res;
    va_list ap;
    char *sql;

    va_start(ap, sql_fmt);
    sql = vformat(sql_fmt, ap);
    va_end(ap);
    res = PQexec(c, sql);
    snprintf(sql_copy, sizeof(sql_copy), "%s", sql);
    free(sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK) {
        char msg[512];

        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(res));
        PQclear(res);
        fail_msg("statement failed: %s: %s", sql_copy, msg);
    }
    PQclear(res);
}

/* Appends " key='value'" (libpq quoting) to buf at *off. */
static void put_kv(char *buf, size_t len, size_t *off, const char *key, const char *val)
{
    int r = snprintf(buf + *off, len - *off, "%s%s='", *off > 0 ? " " : "", key);

    if (r < 0 || (size_t) r >= len - *off) {
        fail_msg("conninfo buffer too small");
    }
    *off += (size_t) r;
    for (; *val != '\0'; val++) {
        if (*off + 3 >= len) {
            fail_msg("conninfo buffer too small");
        }
        if (*val == '\'' || *val == '\\') {
            buf[(*off)++] = '\\';
        }
        buf[(*off)++] = *val;
    }
    if (*off + 2 >= len) {
        fail_msg("conninfo buffer too small");
    }
    buf[(*off)++] = '\'';
    buf[*off] = '\0';
}

const char *kp_test_pg_fresh_db(const char *name, char *buf, size_t len)
{
    const char *base = kp_test_pg_conninfo();
    PQconninfoOption *opts;
    char *perr = NULL, *ident;
    PGconn *c = kp_test_pg_connect();
    size_t off = 0;

    if ((ident = PQescapeIdentifier(c, name, strlen(name))) == NULL) {
        fail_msg("bad database name %s", name);
    }
    kp_test_pg_exec(c, "DROP DATABASE IF EXISTS %s WITH (FORCE)", ident);
    kp_test_pg_exec(c, "CREATE DATABASE %s", ident);
    PQfreemem(ident);
    PQfinish(c);

    if ((opts = PQconninfoParse(base, &perr)) == NULL) {
        fail_msg("KPROF_TEST_PG does not parse: %s", perr != NULL ? perr : "out of memory");
    }
    buf[0] = '\0';
    for (const PQconninfoOption *o = opts; o->keyword != NULL; o++) {
        if (o->val != NULL && strcmp(o->keyword, "dbname") != 0) {
            put_kv(buf, len, &off, o->keyword, o->val);
        }
    }
    put_kv(buf, len, &off, "dbname", name);
    PQconninfoFree(opts);
    return buf;
}

int kp_test_child_start(struct kp_test_child *c, const char *name, char *const argv[])
{
    const char *dir = getenv("KPROF_TEST_DIR");
    posix_spawn_file_actions_t fa;
    int rc;

    if (dir == NULL || dir[0] == '\0') {
        dir = "/tmp";
    }
    mkdir(dir, 0755);
    snprintf(c->log_path, sizeof(c->log_path), "%s/%s.log", dir, name);
    c->pid = -1;
    if ((rc = posix_spawn_file_actions_init(&fa)) != 0) {
        return -rc;
    }
    if ((rc = posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, c->log_path,
                                               O_WRONLY | O_CREAT | O_TRUNC, 0644)) != 0 ||
        (rc = posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO)) != 0 ||
        (rc = posix_spawn(&c->pid, argv[0], &fa, NULL, argv, environ)) != 0) {
        c->pid = -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    return -rc;
}

int kp_test_child_stop(struct kp_test_child *c, int sig, int timeout_ms)
{
    long long deadline = kp_mono_ms() + kp_test_scaled_ms(timeout_ms);
    int status = 0;
    pid_t r;

    if (c->pid <= 0) {
        return -1;
    }
    kill(c->pid, sig);
    for (;;) {
        r = waitpid(c->pid, &status, WNOHANG);
        if (r == c->pid) {
            c->pid = -1;
            return status;
        }
        if (r < 0 && errno != EINTR) {
            c->pid = -1;
            return -1;
        }
        if (kp_mono_ms() >= deadline) {
            break;
        }
        poll_pause();
    }
    kill(c->pid, SIGKILL);
    while (waitpid(c->pid, &status, 0) < 0 && errno == EINTR) {
    }
    c->pid = -1;
    return -1;
}

/* Reads the child's log (at most KP_TEST_MAX_LOG bytes); returns owned data or NULL. */
static char *read_log(const struct kp_test_child *c, size_t *len)
{
    FILE *f = fopen(c->log_path, "rb");
    char *data = NULL;
    size_t n = 0, cap = 0;

    if (f == NULL) {
        return NULL;
    }
    for (;;) {
        size_t r;

        if (n == cap) {
            char *p;

            if (cap >= KP_TEST_MAX_LOG || (p = realloc(data, cap == 0 ? 65536 : cap * 2)) == NULL) {
                break;
            }
            data = p;
            cap = cap == 0 ? 65536 : cap * 2;
        }
        if ((r = fread(data + n, 1, cap - n, f)) == 0) {
            break;
        }
        n += r;
    }
    fclose(f);
    *len = n;
    return data;
}

bool kp_test_child_log_contains(const struct kp_test_child *c, const char *needle)
{
    size_t len = 0;
    char *data = read_log(c, &len);
    bool found = data != NULL && memmem(data, len, needle, strlen(needle)) != NULL;

    free(data);
    return found;
}

bool kp_test_child_log_has_sanitizer_report(const struct kp_test_child *c)
{
    return kp_test_child_log_contains(c, "Sanitizer") ||
           kp_test_child_log_contains(c, "runtime error:");
}

const char *kp_test_bin(const char *rel, char *buf, size_t len)
{
    const char *dir = getenv("KPROF_BIN_DIR");

    snprintf(buf, len, "%s/%s", dir != NULL && dir[0] != '\0' ? dir : ".", rel);
    return buf;
}
