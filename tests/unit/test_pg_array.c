/* Unit tests for kp_pg's array literals: element separators, quoting and escaping of text
 * elements (", \, "NULL", commas, braces, the empty string), NULL elements, the empty array,
 * and an array after other text in the same buffer; and the reader of integer arrays' text
 * (kp_pg_array_next_i64): round trips, NULLs, the int64 limits, malformed text refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <stdint.h>

#include "kp_err.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

static void test_empty_array(void **state)
{
    struct kp_strbuf sb;

    (void) state;
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_pg_array_open(&sb), 0);
    assert_int_equal(kp_pg_array_close(&sb), 0);
    assert_string_equal(sb.data, "{}");
    kp_strbuf_reset(&sb);
    assert_int_equal(kp_pg_array_i64s(&sb, NULL, 0), 0);
    assert_string_equal(sb.data, "{}");
    kp_strbuf_fini(&sb);
}

static void test_i64(void **state)
{
    static const int64_t v[] = { 1, -2, 0, INT64_MAX, INT64_MIN };
    struct kp_strbuf sb;

    (void) state;
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_pg_array_i64s(&sb, v, 5), 0);
    assert_string_equal(sb.data, "{1,-2,0,9223372036854775807,-9223372036854775808}");
    kp_strbuf_reset(&sb);
    assert_int_equal(kp_pg_array_open(&sb), 0);
    assert_int_equal(kp_pg_array_null(&sb), 0);
    assert_int_equal(kp_pg_array_i64(&sb, 7), 0);
    assert_int_equal(kp_pg_array_null(&sb), 0);
    assert_int_equal(kp_pg_array_close(&sb), 0);
    assert_string_equal(sb.data, "{NULL,7,NULL}");
    kp_strbuf_fini(&sb);
}

static void test_text_quoting(void **state)
{
    struct kp_strbuf sb;

    (void) state;
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_pg_array_open(&sb), 0);
    assert_int_equal(kp_pg_array_text(&sb, "plain"), 0);
    assert_int_equal(kp_pg_array_text(&sb, "a \"q\" b"), 0);
    assert_int_equal(kp_pg_array_text(&sb, "back\\slash\\"), 0);
    assert_int_equal(kp_pg_array_text(&sb, "NULL"), 0);
    assert_int_equal(kp_pg_array_text(&sb, "null"), 0);
    assert_int_equal(kp_pg_array_text(&sb, ""), 0);
    assert_int_equal(kp_pg_array_text(&sb, "a,b"), 0);
    assert_int_equal(kp_pg_array_text(&sb, "{x}"), 0);
    assert_int_equal(kp_pg_array_text(&sb, NULL), 0);
    assert_int_equal(kp_pg_array_text(&sb, "\\\""), 0);
    assert_int_equal(kp_pg_array_close(&sb), 0);
    assert_string_equal(sb.data, "{\"plain\",\"a \\\"q\\\" b\",\"back\\\\slash\\\\\",\"NULL\","
                                 "\"null\",\"\",\"a,b\",\"{x}\",NULL,\"\\\\\\\"\"}");
    kp_strbuf_fini(&sb);
}

/* A text element that starts with '{' or an array after other text: the separator depends
 * only on the array's own open brace. */
static void test_after_other_text(void **state)
{
    struct kp_strbuf sb;

    (void) state;
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_strbuf_append_str(&sb, "x="), 0);
    assert_int_equal(kp_pg_array_open(&sb), 0);
    assert_int_equal(kp_pg_array_text(&sb, "{"), 0);
    assert_int_equal(kp_pg_array_text(&sb, "}"), 0);
    assert_int_equal(kp_pg_array_close(&sb), 0);
    assert_string_equal(sb.data, "x={\"{\",\"}\"}");
    kp_strbuf_fini(&sb);
}

/* A capped buffer reports KP_ETOOBIG rather than writing a truncated element. */
static void test_cap(void **state)
{
    struct kp_strbuf sb;

    (void) state;
    kp_strbuf_init(&sb, 4);
    assert_int_equal(kp_pg_array_open(&sb), 0);
    assert_int_equal(kp_pg_array_i64(&sb, 12), 0);
    assert_int_equal(kp_pg_array_i64(&sb, 345), KP_ETOOBIG);
    assert_int_equal(kp_pg_array_text(&sb, "abcdef"), KP_ETOOBIG);
    kp_strbuf_fini(&sb);
}

/* Reads the whole of text; the elements into v (NULL as -7), their count, or the error. */
static int read_all(const char *text, int64_t *v, int cap)
{
    const char *p = text;
    int64_t x;
    bool null;
    int n = 0, rc;

    while ((rc = kp_pg_array_next_i64(&p, &x, &null)) == 1) {
        if (n == cap) {
            return -ENOSPC;
        }
        v[n++] = null ? -7 : x;
    }
    if (rc == 0 && *p != '\0') {
        return -EBADMSG; /* the reader stops right after the '}' */
    }
    return rc < 0 ? rc : n;
}

static void test_read_i64(void **state)
{
    static const int64_t want[] = { 0, -1, 42, INT64_MAX, INT64_MIN, 1700000000123456789 };
    struct kp_strbuf sb;
    int64_t got[8];

    (void) state;
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_pg_array_i64s(&sb, want, 6), 0);
    assert_int_equal(read_all(sb.data, got, 8), 6);
    assert_memory_equal(got, want, sizeof(want));
    kp_strbuf_fini(&sb);
    assert_int_equal(read_all("{}", got, 8), 0);
    assert_int_equal(read_all("{NULL,3,NULL}", got, 8), 3);
    assert_true(got[0] == -7 && got[1] == 3 && got[2] == -7);
    assert_int_equal(read_all("{5}", got, 8), 1);
    assert_true(got[0] == 5);
    static const char *const bad[] = { "",
                                       "5",
                                       "{",
                                       "{1,}",
                                       "{,1}",
                                       "{1 ,2}",
                                       "{\"1\"}",
                                       "{{1}}",
                                       "{1.5}",
                                       "{-}",
                                       "{NUL}",
                                       "{NULLx}",
                                       "{9223372036854775808}",
                                       "{-9223372036854775809}",
                                       "{99999999999999999999}",
                                       "{1,2" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (read_all(bad[i], got, 8) != -EINVAL) {
            fail_msg("accepted %s", bad[i]);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_array),  cmocka_unit_test(test_i64),
        cmocka_unit_test(test_text_quoting), cmocka_unit_test(test_after_other_text),
        cmocka_unit_test(test_cap),          cmocka_unit_test(test_read_i64),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
