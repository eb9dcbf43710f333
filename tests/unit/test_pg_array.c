/* Unit tests for kp_pg's array literals: element separators, quoting and escaping of text
 * elements (", \, "NULL", commas, braces, the empty string), NULL elements, the empty array,
 * and an array after other text in the same buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_array),  cmocka_unit_test(test_i64),
        cmocka_unit_test(test_text_quoting), cmocka_unit_test(test_after_other_text),
        cmocka_unit_test(test_cap),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
