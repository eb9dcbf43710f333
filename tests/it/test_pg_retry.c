/*
 * kp_pg_retry and kp_pg_ping against the test PostgreSQL (KPROF_TEST_PG): a connection whose
 * backend was terminated (pg_terminate_backend: SQLSTATE 57P01, as in a fast shutdown) is
 * reopened with the parameters it was opened with and the work runs again, once, only where the
 * caller allows it; a statement error is never repeated.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kp_err.h"
#include "kp_pg.h"
#include "kp_testutil.h"

#define APP "kprof-test-retry"

struct work {
    const char *sql;
    int calls;
    char value[64]; /* the first cell of the last result */
};

static int work_fn(PGconn *c, void *ud, char *err, size_t len)
{
    struct work *w = ud;
    PGresult *res = NULL;
    int rc;

    w->calls++;
    if ((rc = kp_pg_query(c, w->sql, 0, NULL, &res, err, len)) == 0) {
        snprintf(w->value, sizeof(w->value), "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
    }
    return rc;
}

/* Terminates c's backend from another connection. */
static void kill_backend(PGconn *admin, PGconn *c)
{
    assert_int_equal(
        kp_test_pg_int(admin, "SELECT count(pg_terminate_backend(%d))", PQbackendPID(c)), 1);
}

static PGconn *open_conn(void)
{
    PGconn *c = NULL;
    char err[512] = "";

    assert_int_equal(kp_pg_connect(kp_test_pg_conninfo(), APP, &c, err, sizeof(err)), 0);
    return c;
}

static void test_repeat_on_new_connection(void **state)
{
    PGconn *admin = kp_test_pg_connect(), *c = open_conn();
    struct work w = { .sql = "SELECT current_setting('application_name')" };
    char err[512] = "";
    int pid = PQbackendPID(c);

    kill_backend(admin, c);
    assert_int_equal(kp_pg_retry(c, true, work_fn, &w, err, sizeof(err)), 0);
    assert_int_equal(w.calls, 2); /* the dead connection, then the reopened one */
    assert_string_equal(w.value, APP);
    assert_int_not_equal(PQbackendPID(c), pid);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    assert_false(kp_pg_conn_lost(c));

    /* A working connection runs the work once. */
    w.calls = 0;
    assert_int_equal(kp_pg_retry(c, true, work_fn, &w, err, sizeof(err)), 0);
    assert_int_equal(w.calls, 1);
    PQfinish(c);
    PQfinish(admin);
}

static void test_no_repeat(void **state)
{
    PGconn *admin = kp_test_pg_connect(), *c = open_conn();
    struct work w = { .sql = "SELECT 1" };
    char err[512] = "";

    kill_backend(admin, c);
    assert_int_equal(kp_pg_retry(c, false, work_fn, &w, err, sizeof(err)), KP_EPG);
    assert_int_equal(w.calls, 1);
    assert_true(kp_pg_conn_lost(c));
    assert_int_equal(strncmp(err, "PostgreSQL is unreachable", 25), 0);
    PQfinish(c);
    PQfinish(admin);
}

static void test_statement_error_not_repeated(void **state)
{
    PGconn *c = open_conn();
    struct work w = { .sql = "SELECT 1/0" };
    char err[512] = "";

    assert_int_equal(kp_pg_retry(c, true, work_fn, &w, err, sizeof(err)), KP_EPG);
    assert_int_equal(w.calls, 1);
    assert_false(kp_pg_conn_lost(c));
    assert_non_null(strstr(err, "22012"));
    PQfinish(c);
}

static void test_ping_reopens(void **state)
{
    PGconn *admin = kp_test_pg_connect(), *c = open_conn();
    struct work w = { .sql = "SELECT 2" };
    char err[512] = "";
    int pid = PQbackendPID(c);

    assert_int_equal(kp_pg_ping(c, err, sizeof(err)), 0);
    assert_int_equal(PQbackendPID(c), pid); /* alive: kept */
    kill_backend(admin, c);
    assert_int_equal(kp_pg_ping(c, err, sizeof(err)), 0);
    assert_int_not_equal(PQbackendPID(c), pid);
    assert_int_equal(kp_pg_retry(c, false, work_fn, &w, err, sizeof(err)), 0);
    assert_string_equal(w.value, "2");
    PQfinish(c);
    PQfinish(admin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeat_on_new_connection),
        cmocka_unit_test(test_no_repeat),
        cmocka_unit_test(test_statement_error_not_repeated),
        cmocka_unit_test(test_ping_reopens),
    };

    return cmocka_run_group_tests_name("pg_retry", tests, NULL, NULL);
}
