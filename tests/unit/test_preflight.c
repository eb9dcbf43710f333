/* agent/preflight.c: the NVIDIA driver's RmProfilingAdminOnly read from a params file as the
 * driver writes it, and every way the file can fail to say. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "preflight.h"

static char dir[] = "/tmp/kp_preflight.XXXXXX";
static char path[256];

/* Writes text to the test's params file and returns its path. */
static const char *params(const char *text)
{
    FILE *f = fopen(path, "w");

    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* A few lines of a real /proc/driver/nvidia/params around the one that matters. */
#define HEAD "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n"
#define TAIL "EnableMSI: 1\nRegistryDwords: \"\"\n"

static void test_values(void **state)
{
    char why[256];

    (void) state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/params", dir);
    assert_int_equal(kp_preflight_profiling_admin_only(
                         params(HEAD "RmProfilingAdminOnly: 1\n" TAIL), why, sizeof(why)),
                     1);
    assert_string_equal(why, "");
    assert_int_equal(kp_preflight_profiling_admin_only(
                         params(HEAD "RmProfilingAdminOnly: 0\n" TAIL), why, sizeof(why)),
                     0);
    /* No newline at the end of the file; why may be NULL. */
    assert_int_equal(kp_preflight_profiling_admin_only(params("RmProfilingAdminOnly: 1"), NULL, 0),
                     1);
    assert_int_equal(kp_preflight_profiling_log(params(HEAD "RmProfilingAdminOnly: 1\n")), 1);
}

static void test_unknown(void **state)
{
    char why[256], missing[300];

    (void) state;
    assert_int_equal(kp_preflight_profiling_admin_only(params(HEAD TAIL), why, sizeof(why)), -1);
    assert_non_null(strstr(why, "no RmProfilingAdminOnly line"));
    assert_int_equal(
        kp_preflight_profiling_admin_only(params("RmProfilingAdminOnly: 2\n"), why, sizeof(why)),
        -1);
    assert_non_null(strstr(why, "not 0 or 1"));
    assert_int_equal(
        kp_preflight_profiling_admin_only(params("RmProfilingAdminOnly: yes\n"), why, sizeof(why)),
        -1);
    /* A longer name that starts the same is another parameter. */
    assert_int_equal(
        kp_preflight_profiling_admin_only(params("XRmProfilingAdminOnly: 1\n"), why, sizeof(why)),
        -1);
    snprintf(missing, sizeof(missing), "%s/none", dir);
    assert_int_equal(kp_preflight_profiling_admin_only(missing, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "no NVIDIA driver"));
    assert_int_equal(kp_preflight_profiling_log(missing), -1);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_unknown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
