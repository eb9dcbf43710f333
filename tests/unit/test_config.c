/*
 * Unit tests for common/kp_config: the value parsers, precedence (default < file < env <
 * flag), the file format, every error path's message, --help, --dry-run, --print-config and
 * positional arguments.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kp_config.h"
#include "kp_err.h"

/* A prog name whose /etc/kprof/<prog>.conf does not exist. */
#define PROG "kp-unit-test-no-such-prog"

struct tcfg {
    char *listen;
    long long port;
    long long max_name;
    long long flush_ms;
    bool verbose;
    char *conninfo;
    int level;
    char *note;
};

static const char *const levels[] = { "error", "warn", "info", "debug", NULL };

static const struct kp_config_def defs[] = {
    { "listen", KP_CONFIG_STRING, "127.0.0.1:7070", 1, 256, offsetof(struct tcfg, listen),
      "address the gRPC server listens on", NULL, false },
    { "port", KP_CONFIG_INT, "7070", 1, 65535, offsetof(struct tcfg, port), "a port", NULL, false },
    { "ingest.max-name-bytes", KP_CONFIG_SIZE, "16KiB", 1024, 1 << 20,
      offsetof(struct tcfg, max_name), "longest name accepted in a batch", NULL, false },
    { "flush-timeout", KP_CONFIG_DURATION, "500ms", 1, 3600000, offsetof(struct tcfg, flush_ms),
      "longest wait before a flush", NULL, false },
    { "verbose", KP_CONFIG_BOOL, NULL, 0, 0, offsetof(struct tcfg, verbose), "say more", NULL,
      false },
    { "pg.conninfo", KP_CONFIG_STRING, "host=/run/pg password=dflt", 0, 64,
      offsetof(struct tcfg, conninfo), "libpq connection string", NULL, true },
    { "log.level", KP_CONFIG_ENUM, "info", 0, 0, offsetof(struct tcfg, level), "log threshold",
      levels, false },
    { "note", KP_CONFIG_STRING, NULL, 0, 0, offsetof(struct tcfg, note), "free text", NULL, false },
};
#define NDEFS (sizeof(defs) / sizeof(defs[0]))

static const char *const env_vars[] = {
    "KPROF_LISTEN",        "KPROF_PORT",    "KPROF_INGEST_MAX_NAME_BYTES",
    "KPROF_FLUSH_TIMEOUT", "KPROF_VERBOSE", "KPROF_PG_CONNINFO",
    "KPROF_LOG_LEVEL",     "KPROF_NOTE",    "KP_TEST_VAR",
};

static char tmpdir[256];
static char errbuf[512];

static int group_setup(void **state)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/kp_test_config.XXXXXX");
    return mkdtemp(tmpdir) != NULL ? 0 : -1;
}

static int group_teardown(void **state)
{
    char cmd[300];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static int clear_env(void **state)
{
    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]); i++) {
        unsetenv(env_vars[i]);
    }
    errbuf[0] = '\0';
    return 0;
}

/* Writes text to a file in tmpdir and returns its path (static buffer). */
static const char *write_file(const char *name, const char *text)
{
    static char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* Loads with argv = { PROG, args..., NULL }. */
static int load_v(struct tcfg *c, int *action, const char *const *args)
{
    char *argv[32];
    int argc = 0;

    argv[argc++] = (char *) PROG;
    for (; *args != NULL; args++) {
        argv[argc++] = (char *) *args;
    }
    argv[argc] = NULL;
    memset(c, 0, sizeof(*c));
    return kp_config_load(defs, NDEFS, c, PROG, argc, argv, errbuf, sizeof(errbuf), action);
}

#define LOAD(c, action, ...) load_v((c), (action), (const char *const[]){ __VA_ARGS__, NULL })

/* Captures what fn writes to stdout (fd 1). */
struct capture {
    int saved;
    FILE *tmp;
};

static void capture_begin(struct capture *cap)
{
    fflush(stdout);
    cap->saved = dup(STDOUT_FILENO);
    cap->tmp = tmpfile();
    assert_true(cap->saved >= 0);
    assert_non_null(cap->tmp);
    assert_true(dup2(fileno(cap->tmp), STDOUT_FILENO) >= 0);
}

/* Returns the captured text (owned: free). */
static char *capture_end(struct capture *cap)
{
    char *buf;
    long n;

    fflush(stdout);
    assert_true(dup2(cap->saved, STDOUT_FILENO) >= 0);
    close(cap->saved);
    n = ftell(cap->tmp);
    assert_true(n >= 0);
    buf = calloc(1, (size_t) n + 1);
    assert_non_null(buf);
    rewind(cap->tmp);
    assert_int_equal(fread(buf, 1, (size_t) n, cap->tmp), (size_t) n);
    fclose(cap->tmp);
    return buf;
}

/* ---- parsers ---- */

struct num_case {
    const char *in;
    int rc;
    long long want;
};

static void test_parse_size(void **state)
{
    const struct num_case cases[] = {
        { "0", 0, 0 },
        { "16384", 0, 16384 },
        { "512k", 0, 512 * 1024 },
        { "512K", 0, 512 * 1024 },
        { "16KiB", 0, 16384 },
        { "16kib", 0, 16384 },
        { "1kb", 0, 1000 },
        { "64MiB", 0, 64LL << 20 },
        { "64 MiB", 0, 64LL << 20 },
        { "3m", 0, 3LL << 20 },
        { "2MB", 0, 2000000 },
        { "2GiB", 0, 2LL << 30 },
        { "2g", 0, 2LL << 30 },
        { "5GB", 0, 5000000000LL },
        { "1TiB", 0, 1LL << 40 },
        { "7b", 0, 7 },
        { "9223372036854775807", 0, LLONG_MAX },
        { "8388607TiB", 0, 8388607LL << 40 },
        { "", -EINVAL, 0 },
        { "abc", -EINVAL, 0 },
        { "-1", -EINVAL, 0 },
        { "+1", -EINVAL, 0 },
        { " 1", -EINVAL, 0 },
        { "1.5MiB", -EINVAL, 0 },
        { "10 parsecs", -EINVAL, 0 },
        { "10KiBB", -EINVAL, 0 },
        { "0x10", -EINVAL, 0 },
        { "9223372036854775808", -ERANGE, 0 },
        { "8388608TiB", -ERANGE, 0 },
        { "99999999999999999999999", -ERANGE, 0 },
    };
    long long v;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        v = -42;
        if (kp_parse_size(cases[i].in, &v) != cases[i].rc) {
            fail_msg("kp_parse_size(\"%s\"): want rc %d", cases[i].in, cases[i].rc);
        }
        if (cases[i].rc == 0 && v != cases[i].want) {
            fail_msg("kp_parse_size(\"%s\") = %lld, want %lld", cases[i].in, v, cases[i].want);
        }
        if (cases[i].rc != 0) {
            assert_int_equal(v, -42); /* untouched on error */
        }
    }
    assert_int_equal(kp_parse_size(NULL, &v), -EINVAL);
}

static void test_parse_duration(void **state)
{
    const struct num_case cases[] = {
        { "0", 0, 0 },
        { "0s", 0, 0 },
        { "500ms", 0, 500 },
        { "30s", 0, 30000 },
        { "2m", 0, 120000 },
        { "1h", 0, 3600000 },
        { "1d", 0, 86400000 },
        { "1h30m", 0, 5400000 },
        { "1m500ms", 0, 60500 },
        { "10S", 0, 10000 },
        { "1MS", 0, 1 },
        { "", -EINVAL, 0 },
        { "30", -EINVAL, 0 },
        { "ms", -EINVAL, 0 },
        { "1.5s", -EINVAL, 0 },
        { "-1s", -EINVAL, 0 },
        { "5 s", -EINVAL, 0 },
        { "5us", -EINVAL, 0 },
        { "1h30", -EINVAL, 0 },
        { "5sec", -EINVAL, 0 },
        { "106751991167d", 0, 106751991167LL * 86400000 },
        { "106751991168d", -ERANGE, 0 },
        { "9223372036854775807ms1ms", -ERANGE, 0 },
    };
    long long v;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        v = -42;
        if (kp_parse_duration_ms(cases[i].in, &v) != cases[i].rc) {
            fail_msg("kp_parse_duration_ms(\"%s\"): want rc %d", cases[i].in, cases[i].rc);
        }
        if (cases[i].rc == 0 && v != cases[i].want) {
            fail_msg("kp_parse_duration_ms(\"%s\") = %lld, want %lld", cases[i].in, v,
                     cases[i].want);
        }
    }
}

static void test_parse_bool(void **state)
{
    const char *yes[] = { "true", "TRUE", "yes", "on", "1", "True" };
    const char *no[] = { "false", "no", "OFF", "0" };
    const char *bad[] = { "", "2", "y", "truee", "enabled", " true" };
    bool b;

    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        b = false;
        assert_int_equal(kp_parse_bool(yes[i], &b), 0);
        assert_true(b);
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        b = true;
        assert_int_equal(kp_parse_bool(no[i], &b), 0);
        assert_false(b);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(kp_parse_bool(bad[i], &b), -EINVAL);
    }
}

/* ---- loading ---- */

static void test_defaults(void **state)
{
    struct tcfg c;
    int action = -1;

    assert_int_equal(load_v(&c, &action, (const char *const[]){ NULL }), 0);
    assert_int_equal(action, KP_CONFIG_RUN);
    assert_string_equal(c.listen, "127.0.0.1:7070");
    assert_int_equal(c.port, 7070);
    assert_int_equal(c.max_name, 16384);
    assert_int_equal(c.flush_ms, 500);
    assert_false(c.verbose);
    assert_string_equal(c.conninfo, "host=/run/pg password=dflt");
    assert_int_equal(c.level, 2);
    assert_string_equal(c.note, "");
    kp_config_fini(defs, NDEFS, &c);
    assert_null(c.listen);
    assert_null(c.note);
    kp_config_fini(defs, NDEFS, &c); /* twice is fine */
}

static void test_every_type_by_flag(void **state)
{
    struct tcfg c;
    int action;

    assert_int_equal(LOAD(&c, &action, "--listen=0.0.0.0:1", "--port", "443",
                          "--ingest.max-name-bytes=1MiB", "--flush-timeout", "1h", "--verbose",
                          "--pg.conninfo=host=x", "--log.level=DEBUG", "--note", "a b  c"),
                     0);
    assert_int_equal(action, KP_CONFIG_RUN);
    assert_string_equal(c.listen, "0.0.0.0:1");
    assert_int_equal(c.port, 443);
    assert_int_equal(c.max_name, 1 << 20);
    assert_int_equal(c.flush_ms, 3600000);
    assert_true(c.verbose);
    assert_string_equal(c.conninfo, "host=x");
    assert_int_equal(c.level, 3);
    assert_string_equal(c.note, "a b  c");
    kp_config_fini(defs, NDEFS, &c);

    /* Bool forms; the last flag wins; a value may start with '-' in the two-word form. */
    assert_int_equal(LOAD(&c, &action, "--verbose", "--no-verbose"), 0);
    assert_false(c.verbose);
    kp_config_fini(defs, NDEFS, &c);
    assert_int_equal(LOAD(&c, &action, "--no-verbose", "--verbose=yes"), 0);
    assert_true(c.verbose);
    kp_config_fini(defs, NDEFS, &c);
    assert_int_equal(LOAD(&c, &action, "--verbose=off", "--note", "-x-", "--note=--y"), 0);
    assert_false(c.verbose);
    assert_string_equal(c.note, "--y");
    kp_config_fini(defs, NDEFS, &c);
    /* Bounds are inclusive. */
    assert_int_equal(
        LOAD(&c, &action, "--port=1", "--ingest.max-name-bytes=1024", "--flush-timeout=1ms"), 0);
    assert_int_equal(c.port, 1);
    assert_int_equal(c.max_name, 1024);
    assert_int_equal(c.flush_ms, 1);
    kp_config_fini(defs, NDEFS, &c);
    assert_int_equal(LOAD(&c, &action, "--port=65535", "--ingest.max-name-bytes=1MiB"), 0);
    kp_config_fini(defs, NDEFS, &c);
}

/* Each row sets port (and listen) at some levels; the highest level present wins. */
struct prec_case {
    bool file, env, flag;
    long long want_port;
    const char *want_listen;
};

static void test_precedence(void **state)
{
    const struct prec_case cases[] = {
        { false, false, false, 7070, "127.0.0.1:7070" }, { true, false, false, 1000, "file:1" },
        { false, true, false, 2000, "env:2" },           { true, true, false, 2000, "env:2" },
        { false, false, true, 3000, "flag:3" },          { true, false, true, 3000, "flag:3" },
        { false, true, true, 3000, "flag:3" },           { true, true, true, 3000, "flag:3" },
    };
    const char *path = write_file("prec.conf", "port = 1000\nlisten = file:1\nverbose = on\n");
    char cfgflag[600];
    const char *args[8];
    struct tcfg c;
    int action, n;

    snprintf(cfgflag, sizeof(cfgflag), "--config=%s", path);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        clear_env(state);
        n = 0;
        if (cases[i].file) {
            args[n++] = cfgflag;
        }
        if (cases[i].env) {
            setenv("KPROF_PORT", "2000", 1);
            setenv("KPROF_LISTEN", "env:2", 1);
        }
        if (cases[i].flag) {
            args[n++] = "--port=3000";
            args[n++] = "--listen=flag:3";
        }
        args[n] = NULL;
        if (load_v(&c, &action, args) != 0) {
            fail_msg("case %zu: %s", i, errbuf);
        }
        if (c.port != cases[i].want_port || strcmp(c.listen, cases[i].want_listen) != 0) {
            fail_msg("case %zu: port=%lld listen=%s", i, c.port, c.listen);
        }
        /* Keys set at one level only keep that level's value. */
        assert_int_equal(c.verbose, cases[i].file);
        assert_int_equal(c.max_name, 16384);
        kp_config_fini(defs, NDEFS, &c);
    }
    /* --config given twice: the last one wins (like any flag). */
    clear_env(state);
    write_file("other.conf", "port = 5\n");
    snprintf(cfgflag, sizeof(cfgflag), "%s/other.conf", tmpdir);
    assert_int_equal(LOAD(&c, &action, "--config", path, "--config", cfgflag), 0);
    assert_int_equal(c.port, 5);
    kp_config_fini(defs, NDEFS, &c);
}

static void test_env_every_type(void **state)
{
    struct tcfg c;
    int action;

    setenv("KPROF_INGEST_MAX_NAME_BYTES", "64k", 1);
    setenv("KPROF_FLUSH_TIMEOUT", "2m", 1);
    setenv("KPROF_VERBOSE", "true", 1);
    setenv("KPROF_LOG_LEVEL", "warn", 1);
    setenv("KPROF_PG_CONNINFO", "dbname=env", 1);
    setenv("KPROF_NOTE", "", 1); /* set but empty is a value */
    assert_int_equal(LOAD(&c, &action, "--port=9"), 0);
    assert_int_equal(c.max_name, 65536);
    assert_int_equal(c.flush_ms, 120000);
    assert_true(c.verbose);
    assert_int_equal(c.level, 1);
    assert_string_equal(c.conninfo, "dbname=env");
    assert_string_equal(c.note, "");
    kp_config_fini(defs, NDEFS, &c);
}

static void test_file_format(void **state)
{
    const char *path;
    char flag[600];
    struct tcfg c;
    int action;

    setenv("KP_TEST_VAR", "from-env", 1);
    path = write_file("fmt.conf", "# a comment\n"
                                  "\n"
                                  "   # an indented comment\n"
                                  "port=81\r\n"
                                  "  listen   =   spaced:1   \n"
                                  "note = \"  keep spaces # and hash  \"\n"
                                  "pg.conninfo = host=${KP_TEST_VAR} password=${KP_UNSET_VAR:-pw}\n"
                                  "flush-timeout = ${KP_UNSET_VAR:-2s}\n"
                                  "verbose = ${KP_UNSET_VAR}1\n"
                                  "log.level = error"); /* no final newline */
    snprintf(flag, sizeof(flag), "--config=%s", path);
    if (LOAD(&c, &action, flag) != 0) {
        fail_msg("%s", errbuf);
    }
    assert_int_equal(c.port, 81);
    assert_string_equal(c.listen, "spaced:1");
    assert_string_equal(c.note, "  keep spaces # and hash  ");
    assert_string_equal(c.conninfo, "host=from-env password=pw");
    assert_int_equal(c.flush_ms, 2000);
    assert_true(c.verbose);
    assert_int_equal(c.level, 0);
    kp_config_fini(defs, NDEFS, &c);

    /* An empty variable takes the :- default; ${VAR} keeps it empty. */
    setenv("KP_TEST_VAR", "", 1);
    path = write_file("empty.conf", "listen = ${KP_TEST_VAR:-dflt}\nnote = <${KP_TEST_VAR}>\n");
    snprintf(flag, sizeof(flag), "--config=%s", path);
    assert_int_equal(LOAD(&c, &action, flag), 0);
    assert_string_equal(c.listen, "dflt");
    assert_string_equal(c.note, "<>");
    kp_config_fini(defs, NDEFS, &c);
}

/* A missing default file is fine; a missing --config file is not. */
static void test_missing_files(void **state)
{
    char flag[600];
    struct tcfg c;
    int action;

    memset(&c, 0, sizeof(c));
    assert_int_equal(kp_config_load(defs, NDEFS, &c, "kp-no-such-prog", 1,
                                    (char *[]){ (char *) "x", NULL }, errbuf, sizeof(errbuf),
                                    &action),
                     0);
    kp_config_fini(defs, NDEFS, &c);
    snprintf(flag, sizeof(flag), "--config=%s/absent.conf", tmpdir);
    assert_int_equal(LOAD(&c, &action, flag), KP_ECONFIG);
    assert_non_null(strstr(errbuf, "absent.conf"));
    assert_non_null(strstr(errbuf, "no such file"));
    assert_null(c.listen);
}

struct err_case {
    const char *args[4];
    const char *want; /* exact errbuf, or a substring if it starts with '~' */
};

static void test_flag_errors(void **state)
{
    const struct err_case cases[] = {
        { { "--ingest.max-name-bytes=abc" },
          "--ingest.max-name-bytes=abc: not a size (use e.g. 16384, 16KiB, 1MiB)" },
        { { "--ingest.max-name-bytes=2MiB" },
          "--ingest.max-name-bytes=2MiB: out of range (allowed 1KiB..1MiB)" },
        { { "--ingest.max-name-bytes=99999999999TiB" },
          "--ingest.max-name-bytes=99999999999TiB: out of range (allowed 1KiB..1MiB)" },
        { { "--port=0" }, "--port=0: out of range (allowed 1..65535)" },
        { { "--port", "70000" }, "--port=70000: out of range (allowed 1..65535)" },
        { { "--port=abc" }, "--port=abc: not an integer" },
        { { "--port=12x" }, "--port=12x: not an integer" },
        { { "--port=" }, "--port=: not an integer" },
        { { "--port=99999999999999999999" },
          "--port=99999999999999999999: out of range (allowed 1..65535)" },
        { { "--flush-timeout=5" },
          "--flush-timeout=5: not a duration (use e.g. 500ms, 30s, 2m, 1h)" },
        { { "--flush-timeout=2h" }, "--flush-timeout=2h: out of range (allowed 1ms..1h)" },
        { { "--flush-timeout=0" }, "--flush-timeout=0: out of range (allowed 1ms..1h)" },
        { { "--verbose=maybe" }, "--verbose=maybe: not a bool (use true or false)" },
        { { "--log.level=loud" }, "--log.level=loud: not one of: error, warn, info, debug" },
        { { "--listen=" }, "--listen=: must not be empty" },
        { { "--bogus=1" }, "unknown flag --bogus (see --help)" },
        { { "--bogus" }, "unknown flag --bogus (see --help)" },
        { { "--no-port" }, "unknown flag --no-port (see --help)" },
        { { "--no-verbose=1" }, "--no-verbose=1: --no-verbose takes no value" },
        { { "--help=1" }, "--help takes no value" },
        { { "--dry-run=yes" }, "--dry-run takes no value" },
        { { "--port" }, "--port needs a value (INT)" },
        { { "--config" }, "--config needs a value (PATH)" },
        { { "-p", "1" }, "unknown flag -p (flags are --key=value; see --help)" },
        { { "serve" }, "~unexpected argument 'serve'" },
        { { "--", "--port=1" }, "~unexpected argument '--port=1'" },
        /* The first error is the one reported. */
        { { "--port=x", "--bogus" }, "unknown flag --bogus (see --help)" },
        { { "--port=x", "--flush-timeout=y" }, "--port=x: not an integer" },
        /* Secrets are not echoed. */
        { { "--pg.conninfo=password=hunter2hunter2hunter2hunter2hunter2hunter2hunter2hunter2" },
          "--pg.conninfo=***: too long (at most 64 bytes)" },
    };
    struct tcfg c;
    int action, rc;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        errbuf[0] = '\0';
        rc = load_v(&c, &action, cases[i].args);
        if (rc != KP_ECONFIG) {
            fail_msg("case %zu (%s): rc %d", i, cases[i].args[0], rc);
        }
        if (cases[i].want[0] == '~' ? strstr(errbuf, cases[i].want + 1) == NULL
                                    : strcmp(errbuf, cases[i].want) != 0) {
            fail_msg("case %zu: got \"%s\", want \"%s\"", i, errbuf, cases[i].want);
        }
        /* On failure cfg holds no strings. */
        assert_null(c.listen);
        assert_null(c.conninfo);
        assert_null(c.note);
    }
}

static void test_env_errors(void **state)
{
    struct tcfg c;
    int action;

    setenv("KPROF_PORT", "abc", 1);
    assert_int_equal(LOAD(&c, &action, "--verbose"), KP_ECONFIG);
    assert_string_equal(errbuf, "KPROF_PORT=abc: not an integer");
    clear_env(state);
    setenv("KPROF_LOG_LEVEL", "", 1);
    assert_int_equal(LOAD(&c, &action, "--verbose"), KP_ECONFIG);
    assert_string_equal(errbuf, "KPROF_LOG_LEVEL=: not one of: error, warn, info, debug");
    clear_env(state);
    setenv("KPROF_PG_CONNINFO", "password=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
           1);
    assert_int_equal(LOAD(&c, &action, "--verbose"), KP_ECONFIG);
    assert_string_equal(errbuf, "KPROF_PG_CONNINFO=***: too long (at most 64 bytes)");
    /* A flag does not rescue a bad environment value: the error is reported. */
    clear_env(state);
    setenv("KPROF_PORT", "0", 1);
    assert_int_equal(LOAD(&c, &action, "--port=5"), KP_ECONFIG);
    assert_string_equal(errbuf, "KPROF_PORT=0: out of range (allowed 1..65535)");
}

struct file_err_case {
    const char *text;
    const char *want; /* after "<path>:" */
};

static void test_file_errors(void **state)
{
    const struct file_err_case cases[] = {
        { "port = 80\nbogus = 1\n", "2: unknown key 'bogus'" },
        { "# c\n\njust words\n", "3: expected key = value" },
        { "port = eighty\n", "1: port = eighty: not an integer" },
        { "verbose = sometimes\n", "1: verbose = sometimes: not a bool (use true or false)" },
        { "listen = ${NOPE\n", "1: listen = ${NOPE: unterminated ${" },
        { "listen = ${}\n", "1: listen = ${}: bad variable name in ${...}" },
        { "pg.conninfo = ${KP_UNSET_VAR:-password=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
          "xxxxxxxxxxxxxxxxxxxxxxxx}\n",
          "1: pg.conninfo = ***: too long (at most 64 bytes)" },
        { " = 5\n", "1: unknown key ''" },
    };
    char flag[600], want[900], name[32];
    const char *path;
    struct tcfg c;
    int action;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(name, sizeof(name), "err%zu.conf", i);
        path = write_file(name, cases[i].text);
        snprintf(flag, sizeof(flag), "--config=%s", path);
        snprintf(want, sizeof(want), "%s:%s", path, cases[i].want);
        assert_int_equal(LOAD(&c, &action, flag), KP_ECONFIG);
        if (strcmp(errbuf, want) != 0) {
            fail_msg("case %zu: got \"%s\", want \"%s\"", i, errbuf, want);
        }
    }
}

static void test_file_limits(void **state)
{
    char flag[600], *text;
    const char *path;
    struct tcfg c;
    int action;

    /* A line longer than KP_CONFIG_LINE_MAX. */
    text = malloc(KP_CONFIG_LINE_MAX + 64);
    assert_non_null(text);
    strcpy(text, "note = ");
    memset(text + 7, 'n', KP_CONFIG_LINE_MAX);
    strcpy(text + 7 + KP_CONFIG_LINE_MAX, "\n");
    path = write_file("long.conf", text);
    free(text);
    snprintf(flag, sizeof(flag), "--config=%s", path);
    assert_int_equal(LOAD(&c, &action, flag), KP_ECONFIG);
    assert_non_null(strstr(errbuf, ":1: line longer than"));

    /* A file bigger than KP_CONFIG_FILE_MAX (comment lines only). */
    text = malloc(KP_CONFIG_FILE_MAX + 100);
    assert_non_null(text);
    for (size_t i = 0; i < KP_CONFIG_FILE_MAX + 50; i += 10) {
        memcpy(text + i, "#23456789\n", 10);
    }
    text[KP_CONFIG_FILE_MAX + 50] = '\0';
    path = write_file("big.conf", text);
    free(text);
    snprintf(flag, sizeof(flag), "--config=%s", path);
    assert_int_equal(LOAD(&c, &action, flag), KP_ECONFIG);
    assert_non_null(strstr(errbuf, "bigger than"));

    /* A directory is not a config file. */
    snprintf(flag, sizeof(flag), "--config=%s", tmpdir);
    assert_int_not_equal(LOAD(&c, &action, flag), 0);
    assert_non_null(strstr(errbuf, tmpdir));
}

static void test_help(void **state)
{
    struct capture cap;
    struct tcfg c;
    char *out, env[128];
    int action = -1;

    capture_begin(&cap);
    assert_int_equal(LOAD(&c, &action, "--port=1", "--help"), 0);
    out = capture_end(&cap);
    assert_int_equal(action, KP_CONFIG_EXIT_OK);
    for (size_t i = 0; i < NDEFS; i++) {
        if (strstr(out, defs[i].name) == NULL || strstr(out, defs[i].help) == NULL) {
            fail_msg("--help does not mention %s:\n%s", defs[i].name, out);
        }
    }
    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]) - 1; i++) {
        snprintf(env, sizeof(env), "env %s)", env_vars[i]);
        assert_non_null(strstr(out, env));
    }
    assert_non_null(strstr(out, "Usage: " PROG));
    assert_non_null(strstr(out, "--ingest.max-name-bytes=SIZE  (default \"16KiB\", 1KiB..1MiB;"));
    assert_non_null(strstr(out, "--flush-timeout=DURATION  (default \"500ms\", 1ms..1h;"));
    assert_non_null(strstr(out, "--port=INT  (default \"7070\", 1..65535;"));
    assert_non_null(strstr(out, "--[no-]verbose  (default \"false\";"));
    assert_non_null(strstr(out, "--log.level={error|warn|info|debug}  (default \"info\";"));
    assert_non_null(strstr(out, "--listen=STRING  (default \"127.0.0.1:7070\", 1..256 bytes;"));
    assert_non_null(strstr(out, "--pg.conninfo=STRING  (secret, at most 64 bytes;"));
    assert_null(strstr(out, "dflt")); /* the secret's default is not shown */
    assert_non_null(strstr(out, "--config=PATH"));
    assert_non_null(strstr(out, "--dry-run"));
    assert_non_null(strstr(out, "--print-config"));
    free(out);
    kp_config_fini(defs, NDEFS, &c);

    /* --help wins over a bad flag, and -h is the same. */
    capture_begin(&cap);
    assert_int_equal(LOAD(&c, &action, "--bogus", "-h"), 0);
    out = capture_end(&cap);
    assert_int_equal(action, KP_CONFIG_EXIT_OK);
    assert_non_null(strstr(out, "ingest.max-name-bytes"));
    free(out);
    kp_config_fini(defs, NDEFS, &c);
}

static void test_print_config(void **state)
{
    const char *want = "listen = 127.0.0.1:7070\n"
                       "port = 8080\n"
                       "ingest.max-name-bytes = 1536\n"
                       "flush-timeout = 90s\n"
                       "verbose = true\n"
                       "pg.conninfo = ***\n"
                       "log.level = warn\n"
                       "note = \" padded \"\n";
    struct capture cap;
    struct tcfg c, c2;
    char *out, flag[600];
    const char *path;
    int action = -1;

    capture_begin(&cap);
    assert_int_equal(LOAD(&c, &action, "--print-config", "--port=8080",
                          "--ingest.max-name-bytes=1536", "--flush-timeout=1m30s", "--verbose",
                          "--pg.conninfo=password=s3cr3t", "--log.level=warn", "--note= padded "),
                     0);
    out = capture_end(&cap);
    assert_int_equal(action, KP_CONFIG_EXIT_OK);
    assert_string_equal(out, want);
    assert_null(strstr(out, "s3cr3t"));

    /* The output is a config file that loads back to the same values (but the secret). */
    path = write_file("printed.conf", out);
    snprintf(flag, sizeof(flag), "--config=%s", path);
    assert_int_equal(LOAD(&c2, &action, flag), 0);
    assert_int_equal(action, KP_CONFIG_RUN);
    assert_string_equal(c2.listen, c.listen);
    assert_int_equal(c2.port, c.port);
    assert_int_equal(c2.max_name, c.max_name);
    assert_int_equal(c2.flush_ms, c.flush_ms);
    assert_int_equal(c2.verbose, c.verbose);
    assert_int_equal(c2.level, c.level);
    assert_string_equal(c2.note, c.note);
    assert_string_equal(c2.conninfo, "***");
    free(out);
    kp_config_fini(defs, NDEFS, &c);
    kp_config_fini(defs, NDEFS, &c2);

    /* An empty secret prints empty; big round numbers print in units. */
    capture_begin(&cap);
    assert_int_equal(
        LOAD(&c, &action, "--pg.conninfo=", "--print-config", "--ingest.max-name-bytes=1048576"),
        0);
    out = capture_end(&cap);
    assert_non_null(strstr(out, "\npg.conninfo = \n"));
    assert_non_null(strstr(out, "\ningest.max-name-bytes = 1MiB\n"));
    free(out);
    kp_config_fini(defs, NDEFS, &c);

    /* A password in a postgresql:// URI (user:pw@ or ?password=) is masked like key=value. */
    capture_begin(&cap);
    assert_int_equal(LOAD(&c, &action, "--print-config", "--pg.conninfo=postgresql://k:s3cr3t@h/d"),
                     0);
    out = capture_end(&cap);
    assert_non_null(strstr(out, "\npg.conninfo = ***\n"));
    assert_null(strstr(out, "s3cr3t"));
    free(out);
    kp_config_fini(defs, NDEFS, &c);
    capture_begin(&cap);
    assert_int_equal(
        LOAD(&c, &action, "--print-config", "--pg.conninfo=postgres:///d?password=s3cr3t"), 0);
    out = capture_end(&cap);
    assert_null(strstr(out, "s3cr3t"));
    free(out);
    kp_config_fini(defs, NDEFS, &c);
}

static void test_dry_run(void **state)
{
    struct capture cap;
    struct tcfg c;
    char *out;
    int action = -1;

    capture_begin(&cap);
    assert_int_equal(LOAD(&c, &action, "--dry-run", "--port=22"), 0);
    out = capture_end(&cap);
    assert_int_equal(action, KP_CONFIG_EXIT_OK);
    assert_string_equal(out, "");
    assert_int_equal(c.port, 22);
    free(out);
    kp_config_fini(defs, NDEFS, &c);

    /* A bad value still fails a dry run. */
    assert_int_equal(LOAD(&c, &action, "--dry-run", "--port=0"), KP_ECONFIG);
    assert_non_null(strstr(errbuf, "--port=0"));
}

static void test_positional(void **state)
{
    char *argv[] = { (char *) "kprofctl",     (char *) "export",
                     (char *) "--port=9",     (char *) "run-1",
                     (char *) "--verbose",    (char *) "--",
                     (char *) "--not-a-flag", NULL };
    char *args[4];
    struct kp_config_pos pos = { .args = args, .max = 4 };
    struct tcfg c;
    int action;

    memset(&c, 0, sizeof(c));
    assert_int_equal(
        kp_config_load_args(defs, NDEFS, &c, PROG, 7, argv, &pos, errbuf, sizeof(errbuf), &action),
        0);
    assert_int_equal(pos.n, 3);
    assert_string_equal(args[0], "export");
    assert_string_equal(args[1], "run-1");
    assert_string_equal(args[2], "--not-a-flag");
    assert_int_equal(c.port, 9);
    assert_true(c.verbose);
    kp_config_fini(defs, NDEFS, &c);

    pos.max = 2;
    memset(&c, 0, sizeof(c));
    assert_int_equal(
        kp_config_load_args(defs, NDEFS, &c, PROG, 7, argv, &pos, errbuf, sizeof(errbuf), &action),
        KP_ECONFIG);
    assert_string_equal(errbuf, "too many arguments at '--not-a-flag' (at most 2)");
    assert_int_equal(pos.n, 0);
}

static void test_bad_tables(void **state)
{
    static const struct kp_config_def dup[] = {
        { "a.b", KP_CONFIG_INT, "1", 0, 0, 0, "x", NULL, false },
        { "a-b", KP_CONFIG_INT, "1", 0, 0, 0, "y", NULL, false },
    };
    static const struct kp_config_def builtin[] = {
        { "help", KP_CONFIG_BOOL, NULL, 0, 0, 0, "x", NULL, false },
    };
    static const struct kp_config_def upper[] = {
        { "Port", KP_CONFIG_INT, "1", 0, 0, 0, "x", NULL, false },
    };
    static const struct kp_config_def noenum[] = {
        { "mode", KP_CONFIG_ENUM, NULL, 0, 0, 0, "x", NULL, false },
    };
    static const struct kp_config_def baddef[] = {
        { "n", KP_CONFIG_INT, "ten", 0, 0, 0, "x", NULL, false },
    };
    static const struct kp_config_def badrange[] = {
        { "n", KP_CONFIG_INT, "5", 10, 1, 0, "x", NULL, false },
    };
    const struct {
        const struct kp_config_def *d;
        size_t n;
        const char *want;
    } cases[] = {
        { dup, 2, "config table: row 1 (a-b): name (or its environment variable) is used twice" },
        { builtin, 1, "config table: row 0 (help): name is a built-in flag" },
        { upper, 1, "config table: row 0 (Port): name must be 1-100 of [a-z0-9.-]" },
        { noenum, 1, "config table: row 0 (mode): enum without enum_values" },
        { baddef, 1, "config table: default of n (ten): not an integer" },
        { badrange, 1, "config table: row 0 (n): min > max" },
    };
    long long store[4];
    int action;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(kp_config_load(cases[i].d, cases[i].n, store, PROG, 1,
                                        (char *[]){ (char *) PROG, NULL }, errbuf, sizeof(errbuf),
                                        &action),
                         KP_ECONFIG);
        if (strcmp(errbuf, cases[i].want) != 0) {
            fail_msg("case %zu: got \"%s\"", i, errbuf);
        }
    }
}

/* A required string (min 1) may default to empty, but some source must set it. */
static void test_required(void **state)
{
    static const struct kp_config_def req[] = {
        { "pg.conninfo", KP_CONFIG_STRING, NULL, 1, 0, 0, "libpq conninfo", NULL, true },
    };
    char *argv[] = { (char *) PROG, (char *) "--pg.conninfo=host=x", NULL };
    char *conninfo = NULL, *out;
    struct capture cap;
    int action;

    assert_int_equal(
        kp_config_load(req, 1, &conninfo, PROG, 1, argv, errbuf, sizeof(errbuf), &action),
        KP_ECONFIG);
    assert_string_equal(errbuf, "pg.conninfo is required: set --pg.conninfo=..., "
                                "KPROF_PG_CONNINFO or \"pg.conninfo = ...\" in the file");
    assert_null(conninfo);
    /* --help still works without it. */
    argv[1] = (char *) "--help";
    capture_begin(&cap);
    assert_int_equal(
        kp_config_load(req, 1, &conninfo, PROG, 2, argv, errbuf, sizeof(errbuf), &action), 0);
    out = capture_end(&cap);
    assert_non_null(strstr(out, "--pg.conninfo=STRING  (secret, required;"));
    free(out);
    kp_config_fini(req, 1, &conninfo);
    argv[1] = (char *) "--pg.conninfo=host=x";
    assert_int_equal(
        kp_config_load(req, 1, &conninfo, PROG, 2, argv, errbuf, sizeof(errbuf), &action), 0);
    assert_string_equal(conninfo, "host=x");
    kp_config_fini(req, 1, &conninfo);
    setenv("KPROF_PG_CONNINFO", "host=env", 1);
    assert_int_equal(
        kp_config_load(req, 1, &conninfo, PROG, 1, argv, errbuf, sizeof(errbuf), &action), 0);
    assert_string_equal(conninfo, "host=env");
    kp_config_fini(req, 1, &conninfo);
    /* Set, but to nothing, is an error that names the source. */
    setenv("KPROF_PG_CONNINFO", "", 1);
    assert_int_equal(
        kp_config_load(req, 1, &conninfo, PROG, 1, argv, errbuf, sizeof(errbuf), &action),
        KP_ECONFIG);
    assert_string_equal(errbuf, "KPROF_PG_CONNINFO=***: must not be empty");
}

/* No errbuf at all is allowed. */
static void test_null_errbuf(void **state)
{
    struct tcfg c;
    int action;

    memset(&c, 0, sizeof(c));
    assert_int_equal(kp_config_load(defs, NDEFS, &c, PROG, 2,
                                    (char *[]){ (char *) PROG, (char *) "--port=x", NULL }, NULL, 0,
                                    &action),
                     KP_ECONFIG);
}

#define T(f) cmocka_unit_test_setup(f, clear_env)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_parse_size),         T(test_parse_duration),
        T(test_parse_bool),         T(test_defaults),
        T(test_every_type_by_flag), T(test_precedence),
        T(test_env_every_type),     T(test_file_format),
        T(test_missing_files),      T(test_flag_errors),
        T(test_env_errors),         T(test_file_errors),
        T(test_file_limits),        T(test_help),
        T(test_print_config),       T(test_dry_run),
        T(test_positional),         T(test_bad_tables),
        T(test_required),           T(test_null_errbuf),
    };

    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
