/* Unit tests for common/kp_json: the one JSON string writer (escapes, UTF-8, lengths), the
 * FILE* and kp_strbuf writers giving the same bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_json.h"
#include "kp_strbuf.h"

/* s[0..n) through both writers; checks they agree and returns the strbuf's text (owned). */
static char *both(const char *s, size_t n)
{
    struct kp_strbuf sb;
    char *fbuf = NULL;
    size_t flen = 0;
    FILE *f = open_memstream(&fbuf, &flen);

    assert_non_null(f);
    kp_json_fput(f, s, n);
    assert_int_equal(fclose(f), 0);
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_json_append(&sb, s, n), 0);
    assert_int_equal(sb.len, flen);
    assert_memory_equal(sb.data, fbuf, flen);
    free(fbuf);
    return sb.data;
}

static void expect(const char *s, size_t n, const char *want)
{
    char *got = both(s, n);

    assert_string_equal(got, want);
    free(got);
}

static void test_empty(void **state)
{
    (void) state;
    expect("", 0, "\"\"");
    expect(NULL, 0, "\"\"");
}

static void test_plain(void **state)
{
    (void) state;
    expect("abc/ {}[]:,'", 12, "\"abc/ {}[]:,'\""); /* '/' and JSON punctuation stay */
}

static void test_quote_backslash(void **state)
{
    (void) state;
    expect("a\"b\\c", 5, "\"a\\\"b\\\\c\"");
    expect("\\\"", 2, "\"\\\\\\\"\"");
}

static void test_control(void **state)
{
    (void) state;
    expect("\n\r\t", 3, "\"\\n\\r\\t\"");
    expect("\x01\x08\x0c\x1f\x7f", 5, "\"\\u0001\\u0008\\u000c\\u001f\\u007f\"");
    /* length-bounded: a NUL inside is data, and the bytes after it are written */
    expect("a\0b", 3, "\"a\\u0000b\"");
    expect("ab", 1, "\"a\"");
}

static void test_utf8(void **state)
{
    (void) state;
    /* é, €, 😀 and U+10FFFF are copied unchanged */
    expect("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf", 13,
           "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"");
    /* each byte that does not start a valid sequence becomes one U+FFFD */
    expect("\xff", 1, "\"\\ufffd\"");
    expect("a\x80z", 3, "\"a\\ufffdz\"");
    expect("\xc0\xaf", 2, "\"\\ufffd\\ufffd\"");                       /* overlong '/' */
    expect("\xe0\x80\xaf", 3, "\"\\ufffd\\ufffd\\ufffd\"");            /* overlong 3-byte */
    expect("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"");            /* surrogate U+D800 */
    expect("\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\""); /* past U+10FFFF */
    expect("\xc3", 1, "\"\\ufffd\"");                                  /* cut short by n */
    expect("\xc3\xa9", 1, "\"\\ufffd\"");
    expect("\xe2\x82z", 3, "\"\\ufffd\\ufffdz\""); /* bad continuation */
}

static void test_fputs_and_chars(void **state)
{
    struct kp_strbuf sb;
    char *fbuf = NULL;
    size_t flen = 0;
    FILE *f = open_memstream(&fbuf, &flen);

    (void) state;
    kp_json_fputs(f, "x\ty");
    assert_int_equal(fclose(f), 0);
    assert_string_equal(fbuf, "\"x\\ty\"");
    free(fbuf);

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_json_append_chars(&sb, "a\"", 2), 0);
    assert_int_equal(kp_json_append_chars(&sb, "\xc3\xa9", 2), 0);
    assert_string_equal(sb.data, "a\\\"\xc3\xa9"); /* no quotes */
    kp_strbuf_fini(&sb);
}

static void test_cap(void **state)
{
    struct kp_strbuf sb;

    (void) state;
    kp_strbuf_init(&sb, 4);
    assert_int_equal(kp_json_append(&sb, "abcdef", 6), KP_ETOOBIG);
    kp_strbuf_fini(&sb);
}

static void test_core(void **state)
{
    char esc[KP_JSON_ESCAPE_MAX];

    (void) state;
    assert_int_equal(kp_json_plain_len("abc\"d", 5), 3);
    assert_int_equal(kp_json_plain_len("\xc3\xa9\xff", 3), 2);
    assert_int_equal(kp_json_escape('"', esc), 2);
    assert_memory_equal(esc, "\\\"", 2);
    assert_int_equal(kp_json_escape(0x1b, esc), 6);
    assert_memory_equal(esc, "\\u001b", 6);
    assert_int_equal(kp_json_escape(0xfe, esc), 6);
    assert_memory_equal(esc, "\\ufffd", 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_quote_backslash),
        cmocka_unit_test(test_control),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_fputs_and_chars),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_core),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
