/*
 * Helpers shared by kprof's tests: bounded waits, child daemons, the test PostgreSQL.
 * Waits scale with KPROF_TEST_TIMEOUT_MULTIPLIER (default 1). Never sleep to wait.
 */
#ifndef KP_TESTUTIL_H
#define KP_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <libpq-fe.h>

/* Polls cond(arg) every few ms until it returns true or timeout_ms (scaled) passes.
 * Returns true if the condition held. */
bool kp_test_wait_for(bool (*cond)(void *arg), void *arg, int timeout_ms);

/* Returns timeout_ms scaled by KPROF_TEST_TIMEOUT_MULTIPLIER. */
int kp_test_scaled_ms(int timeout_ms);

/* Returns the conninfo of the test PostgreSQL (KPROF_TEST_PG), or skips the test. */
const char *kp_test_pg_conninfo(void);

/* Connects to the test PostgreSQL; fails the test on error. Returns owned (PQfinish). */
PGconn *kp_test_pg_connect(void);

/* Runs a query that returns one integer (e.g. "SELECT count(*) ..."); fails the test on
 * error. */
long long kp_test_pg_int(PGconn *c, const char *sql_fmt, ...) __attribute__((format(printf, 2, 3)));

/* Runs a statement; fails the test on error. */
void kp_test_pg_exec(PGconn *c, const char *sql_fmt, ...) __attribute__((format(printf, 2, 3)));

/* Makes a fresh empty database named name on the test server (dropping an old one) and
 * returns its conninfo in buf. Each test uses its own database so tests do not see each
 * other's rows. */
const char *kp_test_pg_fresh_db(const char *name, char *buf, size_t len);

/* A child process whose stderr goes to a file under KPROF_TEST_DIR. */
struct kp_test_child {
    pid_t pid;
    char log_path[512];
};

/* Starts argv[0] (a path) with argv; stderr and stdout go to log_path. Returns 0 or -errno. */
int kp_test_child_start(struct kp_test_child *c, const char *name, char *const argv[]);

/* Sends sig to the child (by pid) and waits for it up to timeout_ms. Returns its wait status,
 * or -1 if it did not exit (then it was SIGKILLed). */
int kp_test_child_stop(struct kp_test_child *c, int sig, int timeout_ms);

/* True if the child's log mentions a sanitizer report ("Sanitizer", "runtime error:"). */
bool kp_test_child_log_has_sanitizer_report(const struct kp_test_child *c);

/* Returns true if the log file of c contains needle. */
bool kp_test_child_log_contains(const struct kp_test_child *c, const char *needle);

/* Path of a built binary: $KPROF_BIN_DIR/rel (e.g. "collectord/kprof-collectord"). */
const char *kp_test_bin(const char *rel, char *buf, size_t len);

#endif
