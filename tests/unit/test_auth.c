/* Unit tests for common/kp_auth and common/kp_secret: the token file (its lines, the line
 * numbers of its errors, which never hold a token, expiry, duplicates, rotation without a
 * restart), the authorization header, certificate URIs, roles, and the secret files' checks
 * (mode, type, size). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kp_auth.h"
#include "kp_err.h"
#include "kp_secret.h"
#include "kp_testutil.h"

#define TOK_A "agent-token-0123456789abcdef"
#define TOK_V "viewer-token-0123456789abcdef"
#define TOK_O "operator-token-0123456789abcd"

static char dir[256];

static int setup(void **state)
{
    (void) state;
    snprintf(dir, sizeof(dir), "%s/kp_test_auth_XXXXXX",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(dir) != NULL ? 0 : -1;
}

/* Writes text to dir/name with mode (through a rename, as an operator rotating would). */
static const char *put(const char *name, const char *text, mode_t mode)
{
    static char path[512];
    char tmp[600];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(tmp, mode), 0);
    assert_int_equal(rename(tmp, path), 0);
    return path;
}

static enum kp_auth_result check(struct kp_auth *a, const char *hdr, struct kp_identity *id)
{
    return kp_auth_check(a, hdr, hdr != NULL ? strlen(hdr) : 0, NULL, 0, id);
}

/* Comments (of any length), blank lines, CRLF, tabs and an expiry in both forms load. */
static void test_parse_ok(void **state)
{
    struct kp_auth *a = NULL;
    struct kp_identity id;
    char err[512] = "";
    const char *p = put("ok",
                        "# the tokens of the cluster, one a line: ROLE NAME TOKEN [expires]\n"
                        "\n"
                        "agent node-1 " TOK_A "\r\n"
                        "   # an indented comment\n"
                        "viewer\tdash\t" TOK_V " expires=2999-01-01T00:00:00Z\n"
                        "operator alice " TOK_O " expires=32503680000\n",
                        0600);

    (void) state;
    assert_int_equal(kp_auth_create(p, false, &a, err, sizeof(err)), 0);
    assert_int_equal(kp_auth_tokens(a), 3);
    assert_int_equal(check(a, "Bearer " TOK_A, &id), KP_AUTH_OK);
    assert_int_equal(id.role, KP_ROLE_AGENT);
    assert_string_equal(id.name, "node-1");
    assert_string_equal(id.via, "token");
    assert_int_equal(check(a, "bearer " TOK_V, &id), KP_AUTH_OK); /* the scheme is caseless */
    assert_int_equal(id.role, KP_ROLE_VIEWER);
    assert_int_equal(check(a, "Bearer " TOK_O, &id), KP_AUTH_OK);
    assert_int_equal(id.role, KP_ROLE_OPERATOR);
    kp_auth_destroy(a);
}

/* Each bad line is refused naming its line number (blank lines counted) and never the token. */
static void test_parse_errors(void **state)
{
    static const struct {
        const char *text;
        const char *want; /* in the message */
    } cases[] = {
        { "\n\nagent node-1 " TOK_A " extra field\n", "line 3" },
        { "agent node-1 " TOK_A "\n\n\nroot x " TOK_V "\n", "line 4: unknown role" },
        { "viewer bad/name " TOK_V "\n", "line 1: NAME" },
        { "viewer v short-secret\n", "line 1: TOKEN" },
        { "viewer v " TOK_V " expires=tomorrow\n", "line 1: the fourth field" },
        { "viewer v " TOK_V " expires=2026-02-30T00:00:00Z\n", "line 1: the fourth field" },
        { "viewer v " TOK_V " until=2999-01-01T00:00:00Z\n", "line 1: the fourth field" },
        { "agent node-1\n", "line 1: expected ROLE NAME TOKEN" },
        { "agent a " TOK_A "\n# x\nviewer b " TOK_A "\n", "line 3: the same token" },
        { "# only comments\n\n", "holds no token" },
    };

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct kp_auth *a = NULL;
        char err[512] = "";
        const char *p = put("bad", cases[i].text, 0600);

        if (kp_auth_create(p, false, &a, err, sizeof(err)) != KP_ECONFIG) {
            fail_msg("case %zu loaded or failed otherwise: %s", i, err);
        }
        assert_null(a);
        if (strstr(err, cases[i].want) == NULL || strstr(err, p) == NULL) {
            fail_msg("case %zu: \"%s\" lacks \"%s\" or the path", i, err, cases[i].want);
        }
        assert_null(strstr(err, TOK_A));
        assert_null(strstr(err, TOK_V));
        assert_null(strstr(err, "short-secret"));
    }
}

/* A token past its expires= is EXPIRED, not OK; one in the future is OK. */
static void test_expiry(void **state)
{
    struct kp_auth *a = NULL;
    struct kp_identity id;
    char text[512], err[512];
    time_t now = time(NULL);
    struct tm past;

    (void) state;
    now -= 60;
    gmtime_r(&now, &past);
    snprintf(text, sizeof(text),
             "operator old " TOK_O " expires=%04d-%02d-%02dT%02d:%02d:%02dZ\n"
             "viewer v " TOK_V " expires=%lld\n",
             past.tm_year + 1900, past.tm_mon + 1, past.tm_mday, past.tm_hour, past.tm_min,
             past.tm_sec, (long long) now + 3600);
    assert_int_equal(kp_auth_create(put("exp", text, 0600), false, &a, err, sizeof(err)), 0);
    assert_int_equal(check(a, "Bearer " TOK_O, &id), KP_AUTH_EXPIRED);
    assert_int_equal(check(a, "Bearer " TOK_V, &id), KP_AUTH_OK);
    kp_auth_destroy(a);
}

struct rot {
    struct kp_auth *a;
    const char *hdr;
    enum kp_auth_result want;
};

static bool rot_done(void *arg)
{
    struct rot *r = arg;
    struct kp_identity id;

    return check(r->a, r->hdr, &id) == r->want;
}

/* Rewriting the file takes effect without a restart (polled: at most once a second); a file
 * that no longer parses keeps the tokens loaded before. */
static void test_rotation(void **state)
{
    struct kp_auth *a = NULL;
    struct kp_identity id;
    char err[512];
    const char *p = put("rot", "operator alice " TOK_O "\n", 0600);
    struct rot r;

    (void) state;
    assert_int_equal(kp_auth_create(p, false, &a, err, sizeof(err)), 0);
    assert_int_equal(check(a, "Bearer " TOK_O, &id), KP_AUTH_OK);
    put("rot", "operator alice " TOK_V "\n", 0600);
    r = (struct rot){ a, "Bearer " TOK_O, KP_AUTH_UNKNOWN };
    assert_true(kp_test_wait_for(rot_done, &r, 5000));
    assert_int_equal(check(a, "Bearer " TOK_V, &id), KP_AUTH_OK);
    /* broken: the last good table stays */
    put("rot", "operator alice\n", 0600);
    r = (struct rot){ a, "Bearer " TOK_V, KP_AUTH_OK };
    for (int i = 0; i < 3; i++) {
        assert_true(rot_done(&r));
        usleep(400 * 1000);
    }
    /* readable by others: refused too, the table stays */
    put("rot", "operator alice " TOK_A "\n", 0644);
    usleep(1100 * 1000);
    assert_int_equal(check(a, "Bearer " TOK_A, &id), KP_AUTH_UNKNOWN);
    assert_int_equal(check(a, "Bearer " TOK_V, &id), KP_AUTH_OK);
    kp_auth_destroy(a);
}

/* The authorization header: only "Bearer TOKEN" is a token. */
static void test_headers(void **state)
{
    struct kp_auth *a = NULL;
    struct kp_identity id;
    char err[512], big[400];

    (void) state;
    assert_int_equal(
        kp_auth_create(put("hdr", "viewer v " TOK_V "\n", 0600), false, &a, err, sizeof(err)), 0);
    assert_int_equal(check(a, NULL, &id), KP_AUTH_MISSING);
    assert_int_equal(check(a, "", &id), KP_AUTH_MALFORMED);
    assert_int_equal(check(a, "Bearer", &id), KP_AUTH_MALFORMED);
    assert_int_equal(check(a, "Bearer ", &id), KP_AUTH_MALFORMED);
    assert_int_equal(check(a, "Basic " TOK_V, &id), KP_AUTH_MALFORMED);
    assert_int_equal(check(a, TOK_V, &id), KP_AUTH_MALFORMED);
    assert_int_equal(check(a, "Bearer  " TOK_V, &id), KP_AUTH_UNKNOWN);
    assert_int_equal(check(a, "Bearer " TOK_V "x", &id), KP_AUTH_UNKNOWN);
    assert_int_equal(check(a, "Bearer viewer-token", &id), KP_AUTH_UNKNOWN); /* a prefix */
    memset(big, 'x', sizeof(big));
    memcpy(big, "Bearer ", 7);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(check(a, big, &id), KP_AUTH_MALFORMED);
    /* not NUL-terminated: only len bytes count */
    assert_int_equal(kp_auth_check(a, "Bearer " TOK_V "junk", 7 + strlen(TOK_V), NULL, 0, &id),
                     KP_AUTH_OK);
    kp_auth_destroy(a);
}

/* urn:kprof:ROLE:NAME from a verified certificate; a token wins over it. */
static void test_cert_uris(void **state)
{
    struct kp_auth *a = NULL, *tok = NULL;
    struct kp_identity id;
    char err[512];
    const char *ok[] = { "spiffe://cluster/x", "urn:kprof:agent:node-7" };
    const char *bad_role[] = { "urn:kprof:root:node-7" };
    const char *no_name[] = { "urn:kprof:agent:" };
    const char *bad_name[] = { "urn:kprof:viewer:a/b" };
    const char *other[] = { "https://example.org/x", "urn:other:agent:x" };

    (void) state;
    assert_int_equal(kp_auth_create(NULL, false, &a, err, sizeof(err)), KP_ECONFIG);
    assert_int_equal(kp_auth_create(NULL, true, &a, err, sizeof(err)), 0);
    assert_int_equal(kp_auth_check(a, NULL, 0, ok, 2, &id), KP_AUTH_OK);
    assert_int_equal(id.role, KP_ROLE_AGENT);
    assert_string_equal(id.name, "node-7");
    assert_string_equal(id.via, "certificate");
    assert_int_equal(kp_auth_check(a, NULL, 0, bad_role, 1, &id), KP_AUTH_MALFORMED);
    assert_int_equal(kp_auth_check(a, NULL, 0, no_name, 1, &id), KP_AUTH_MALFORMED);
    assert_int_equal(kp_auth_check(a, NULL, 0, bad_name, 1, &id), KP_AUTH_MALFORMED);
    assert_int_equal(kp_auth_check(a, NULL, 0, other, 2, &id), KP_AUTH_MISSING);
    assert_int_equal(kp_auth_check(a, NULL, 0, NULL, 0, &id), KP_AUTH_MISSING);
    /* certificates only: a token is not one it knows */
    assert_int_equal(kp_auth_check(a, "Bearer " TOK_V, 7 + strlen(TOK_V), ok, 2, &id),
                     KP_AUTH_UNKNOWN);
    /* tokens only: a certificate does not count */
    assert_int_equal(
        kp_auth_create(put("crt", "viewer v " TOK_V "\n", 0600), false, &tok, err, sizeof(err)), 0);
    assert_int_equal(kp_auth_check(tok, NULL, 0, ok, 2, &id), KP_AUTH_MISSING);
    kp_auth_destroy(tok);
    kp_auth_destroy(a);
}

static void test_roles(void **state)
{
    unsigned r = 0;

    (void) state;
    assert_true(kp_auth_allows(KP_ROLE_VIEWER, KP_ROLE_OPERATOR));
    assert_false(kp_auth_allows(KP_ROLE_OPERATOR, KP_ROLE_VIEWER));
    assert_false(kp_auth_allows(KP_ROLE_VIEWER, KP_ROLE_AGENT));
    assert_false(kp_auth_allows(KP_ROLE_AGENT, KP_ROLE_OPERATOR));
    assert_false(kp_auth_allows(0, KP_ROLES_ALL));
    assert_true(kp_auth_allows(KP_ROLE_AGENT, KP_ROLES_ALL));
    assert_int_equal(kp_auth_role_parse("operator", &r), 0);
    assert_int_equal(r, KP_ROLE_OPERATOR);
    assert_int_equal(kp_auth_role_parse("Operator", &r), KP_ECONFIG);
    assert_string_equal(kp_auth_role_name(KP_ROLES_ALL), "any");
    assert_string_equal(kp_auth_role_name(KP_ROLE_AGENT), "agent");
    assert_string_equal(kp_auth_role_name(KP_ROLE_AGENT | KP_ROLE_VIEWER), "?");
}

/* The token file's mode: 0600 and 0640 are taken; what others (or the group, writing) may
 * touch is refused with the chmod to run; the PostgreSQL password file takes 0600 only. */
static void test_modes(void **state)
{
    static const struct {
        mode_t mode;
        bool group_ok; /* allow_group */
        bool taken;
    } cases[] = {
        { 0600, true, true },  { 0640, true, true },  { 0400, true, true },   { 0644, true, false },
        { 0660, true, false }, { 0604, true, false }, { 0640, false, false }, { 0600, false, true },
    };
    char buf[128], err[512];

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *p = put("mode", "secret-line\nsecond\n", cases[i].mode);
        long n = kp_secret_file_line(p, "the test file", cases[i].group_ok, buf, sizeof(buf), err,
                                     sizeof(err));

        if (cases[i].taken) {
            assert_int_equal(n, 11);
            assert_string_equal(buf, "secret-line");
        }
        else {
            assert_int_equal(n, KP_ECONFIG);
            assert_non_null(strstr(err, "chmod"));
            assert_non_null(strstr(err, p));
            assert_null(strstr(err, "secret-line"));
        }
    }
}

/* Not a regular file, missing, empty, too big: refused naming the path, at once (a FIFO in
 * the file's place must not block the daemon). */
static void test_secret_files(void **state)
{
    char buf[16], err[512], fifo[300];
    const char *p;

    (void) state;
    assert_true(kp_secret_file_read(dir, "the test file", false, buf, sizeof(buf), err,
                                    sizeof(err)) == KP_ECONFIG);
    assert_non_null(strstr(err, "not a regular file"));
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_true(kp_secret_file_read(fifo, "the test file", false, buf, sizeof(buf), err,
                                    sizeof(err)) == KP_ECONFIG);
    assert_non_null(strstr(err, "not a regular file"));
    unlink(fifo);
    assert_true(kp_secret_file_read("/nonexistent/kprof/tok", "the test file", false, buf,
                                    sizeof(buf), err, sizeof(err)) == -ENOENT);
    assert_non_null(strstr(err, "/nonexistent/kprof/tok"));
    p = put("empty", "", 0600);
    assert_true(kp_secret_file_read(p, "the test file", false, buf, sizeof(buf), err,
                                    sizeof(err)) == KP_ECONFIG);
    assert_non_null(strstr(err, "empty"));
    p = put("nl", "\nsecond\n", 0600);
    assert_true(kp_secret_file_line(p, "the test file", false, buf, sizeof(buf), err,
                                    sizeof(err)) == KP_ECONFIG);
    p = put("exact", "0123456789abcde", 0600); /* 15 bytes: fits 16 with the NUL */
    assert_int_equal(
        kp_secret_file_read(p, "the test file", false, buf, sizeof(buf), err, sizeof(err)), 15);
    p = put("big", "0123456789abcdef", 0600);
    assert_true(kp_secret_file_read(p, "the test file", false, buf, sizeof(buf), err,
                                    sizeof(err)) == KP_ETOOBIG);
    assert_null(strstr(err, "0123"));
    for (size_t i = 0; i < sizeof(buf); i++) {
        assert_int_equal(buf[i], 0); /* no part of a refused secret is left */
    }
}

static int teardown(void **state)
{
    char cmd[400];

    (void) state;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ok),     cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_expiry),       cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_headers),      cmocka_unit_test(test_cert_uris),
        cmocka_unit_test(test_roles),        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_secret_files),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
