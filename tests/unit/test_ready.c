/* Unit tests for common/kp_ready (the daemons' --ready-file), kp_ranks (--ranks text) and
 * kp_str (kp_strlcpy). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kp_ranks.h"
#include "kp_ready.h"
#include "kp_str.h"

static char *slurp(const char *path)
{
    static char buf[1024];
    FILE *f = fopen(path, "r");
    size_t n;

    if (f == NULL) {
        return NULL;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void test_ready_file(void **state)
{
    char dir[] = "/tmp/kp_ready.XXXXXX", path[256], tmp[300], err[512] = "";
    struct kp_ready_entry e[] = { { "grpc", "127.0.0.1:5" }, { "http", NULL }, { "x", "y" } };
    struct stat sb;

    (void) state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ready", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    /* No path: nothing written, no error. */
    assert_int_equal(kp_ready_file_write(NULL, e, 3, err, sizeof(err)), 0);
    assert_int_equal(kp_ready_file_write("", e, 3, err, sizeof(err)), 0);
    /* An entry without a value is left out; the temporary name is gone after the rename. */
    assert_int_equal(kp_ready_file_write(path, e, 3, err, sizeof(err)), 0);
    assert_string_equal(slurp(path), "grpc=127.0.0.1:5\nx=y\n");
    assert_int_not_equal(stat(tmp, &sb), 0);
    /* Written again, it is replaced whole. */
    e[1].value = "127.0.0.1:6";
    assert_int_equal(kp_ready_file_write(path, e, 2, err, sizeof(err)), 0);
    assert_string_equal(slurp(path), "grpc=127.0.0.1:5\nhttp=127.0.0.1:6\n");
    unlink(path);
    /* A directory that does not exist: an error that names the file, and no file. */
    snprintf(path, sizeof(path), "%s/nodir/ready", dir);
    assert_int_equal(kp_ready_file_write(path, e, 2, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "cannot write --ready-file"));
    assert_non_null(strstr(err, path));
    assert_int_equal(rmdir(dir), 0);
}

static void test_ranks(void **state)
{
    uint8_t sel[8] = { 0 };
    char buf[64], tiny[6];
    bool all;
    long bad = -1;

    (void) state;
    assert_int_equal(kp_ranks_parse("all", 8, sel, &all, NULL), 0);
    assert_true(all);
    assert_int_equal(kp_ranks_parse(NULL, 8, sel, &all, NULL), 0);
    assert_true(all);
    assert_int_equal(kp_ranks_parse("0,3-5,7", 8, sel, &all, NULL), 0);
    assert_false(all);
    assert_string_equal(kp_ranks_format(sel, 8, buf, sizeof(buf)), "0,3-5,7");
    assert_int_equal(kp_ranks_parse("6-9", 8, sel, &all, &bad), -ERANGE);
    assert_int_equal(bad, 8);
    assert_int_equal(kp_ranks_parse("12", 8, sel, &all, &bad), -ERANGE);
    assert_int_equal(bad, 12);
    assert_int_equal(kp_ranks_parse("3-1", 8, sel, &all, NULL), -EINVAL);
    assert_int_equal(kp_ranks_parse("1,", 8, sel, &all, NULL), -EINVAL);
    assert_int_equal(kp_ranks_parse("x", 8, sel, &all, NULL), -EINVAL);
    memset(sel, 1, sizeof(sel));
    sel[1] = sel[3] = sel[5] = 0;
    assert_string_equal(kp_ranks_format(sel, 8, buf, sizeof(buf)), "0,2,4,6-7");
    kp_ranks_format(sel, 8, tiny, sizeof(tiny));
    assert_string_equal(tiny, "0,...");
}

static void test_strlcpy(void **state)
{
    char d[8];

    (void) state;
    kp_strlcpy(d, sizeof(d), "abc");
    assert_string_equal(d, "abc");
    kp_strlcpy(d, sizeof(d), NULL);
    assert_string_equal(d, "");
    kp_strlcpy(d, sizeof(d), "abcdefghij");
    assert_string_equal(d, "abcdefg");
    /* "abcdef" then "é" (2 bytes) does not fit in 7: cut before it, not inside it. */
    kp_strlcpy(d, sizeof(d), "abcdef\xc3\xa9");
    assert_string_equal(d, "abcdef");
    kp_strlcpy(d, sizeof(d), "abcde\xc3\xa9"); /* exactly 7: whole */
    assert_string_equal(d, "abcde\xc3\xa9");
    kp_strlcpy(d, 0, "x"); /* no room: nothing written */
    assert_string_equal(d, "abcde\xc3\xa9");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_file),
        cmocka_unit_test(test_ranks),
        cmocka_unit_test(test_strlcpy),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
