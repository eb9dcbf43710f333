/*
 * Unit tests for kprofctl/table: text alignment (UTF-8 widths, -w cuts, numeric columns
 * right-aligned), CSV quoting, JSON escaping and types, column selection (and kp_str_list_item,
 * which it splits -c with), the short flags.
 * table.c is compiled in here (first, since it defines _GNU_SOURCE) because the unit tests
 * do not link kp_kprofctl_core.
 */
#include "../../kprofctl/table.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct kp_table_col cols3[] = {
    { "id", KP_TABLE_NUMERIC },
    { "name", KP_TABLE_TEXT },
    { "note", KP_TABLE_TEXT },
};

/* Prints t in format and returns the output (free it). */
static char *render(const struct kp_table *t, enum kp_table_format f, int width)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);

    assert_non_null(out);
    assert_int_equal(kp_table_print(t, f, width, out), 0);
    fclose(out);
    return buf;
}

static struct kp_table *make3(void)
{
    struct kp_table *t = NULL;

    assert_int_equal(kp_table_create(cols3, 3, &t), 0);
    return t;
}

static void row3(struct kp_table *t, int64_t id, const char *name, const char *note)
{
    assert_int_equal(kp_table_add_row(t), 0);
    assert_int_equal(kp_table_set_i64(t, 0, id), 0);
    assert_int_equal(kp_table_set_str(t, 1, name), 0);
    assert_int_equal(kp_table_set_str(t, 2, note), 0);
}

static void test_text_aligned(void **state)
{
    struct kp_table *t = make3();
    char *s;

    (void) state;
    row3(t, 7, "alpha", "x");
    row3(t, 12345, "b", NULL);
    row3(t, -3, "gamma-long", "last");
    s = render(t, KP_TABLE_FORMAT_TEXT, 0);
    assert_string_equal(s, "   ID  NAME        NOTE\n"
                           "    7  alpha       x\n"
                           "12345  b           -\n"
                           "   -3  gamma-long  last\n");
    free(s);
    kp_table_destroy(t);
}

static void test_text_empty_and_header_wider(void **state)
{
    struct kp_table *t = make3();
    char *s;

    (void) state;
    s = render(t, KP_TABLE_FORMAT_TEXT, 0);
    assert_string_equal(s, "ID  NAME  NOTE\n");
    free(s);
    s = render(t, KP_TABLE_FORMAT_JSON, 0);
    assert_string_equal(s, "[]\n");
    free(s);
    s = render(t, KP_TABLE_FORMAT_CSV, 0);
    assert_string_equal(s, "id,name,note\n");
    free(s);
    assert_int_equal(kp_table_rows(t), 0);
    kp_table_destroy(t);
}

static void test_utf8_widths(void **state)
{
    struct kp_table *t = make3();
    char *s;

    (void) state;
    assert_int_equal(kp_table_text_width("abc"), 3);
    assert_int_equal(kp_table_text_width("\xe6\x97\xa5\xe6\x9c\xac"), 4); /* 日本 */
    assert_int_equal(kp_table_text_width("e\xcc\x81"), 1);                /* e + U+0301 */
    assert_int_equal(kp_table_text_width("caf\xc3\xa9"), 4);              /* café */
    assert_int_equal(kp_table_text_width("\xf0\x9f\x9a\x80"), 2);         /* U+1F680 */
    assert_int_equal(kp_table_text_width("a\xffz"), 3);                   /* invalid byte */
    assert_int_equal(kp_table_text_width("\xe6\x97"), 2);                 /* cut sequence */

    row3(t, 1, "\xe6\x97\xa5\xe6\x9c\xac", "a");
    row3(t, 2, "caf\xc3\xa9", "b");
    row3(t, 3, "x\ny\x01", "c"); /* control characters shown as '?' */
    s = render(t, KP_TABLE_FORMAT_TEXT, 0);
    assert_string_equal(s, "ID  NAME  NOTE\n"
                           " 1  \xe6\x97\xa5\xe6\x9c\xac  a\n"
                           " 2  caf\xc3\xa9  b\n"
                           " 3  x?y?  c\n");
    free(s);
    kp_table_destroy(t);
}

static void test_width_cuts_text_only(void **state)
{
    struct kp_table *t = make3();
    char *s;

    (void) state;
    row3(t, 123456789, "abcdefgh", "abcde");
    row3(t, 2, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "ab"); /* 日本語: 6 columns */
    s = render(t, KP_TABLE_FORMAT_TEXT, 5);
    /* "abcdefgh" -> "abcd…"; 日本語 -> 日本… (4 + 1 columns); "abcde" fits exactly; the
     * number is not cut. */
    assert_string_equal(s, "       ID  NAME   NOTE\n"
                           "123456789  abcd\xe2\x80\xa6  abcde\n"
                           "        2  \xe6\x97\xa5\xe6\x9c\xac\xe2\x80\xa6  ab\n");
    free(s);
    /* width 4: 日本語 -> 日… (a wide character that does not fit is left out: 3 columns) */
    s = render(t, KP_TABLE_FORMAT_TEXT, 4);
    assert_string_equal(s, "       ID  NAME  NOTE\n"
                           "123456789  abc\xe2\x80\xa6  abc\xe2\x80\xa6\n"
                           "        2  \xe6\x97\xa5\xe2\x80\xa6   ab\n");
    free(s);
    /* width 1: only the ellipsis */
    s = render(t, KP_TABLE_FORMAT_TEXT, 1);
    assert_non_null(strstr(s, "123456789  \xe2\x80\xa6     \xe2\x80\xa6\n"));
    free(s);
    /* CSV and JSON are never cut */
    s = render(t, KP_TABLE_FORMAT_CSV, 3);
    assert_non_null(strstr(s, "123456789,abcdefgh,abcde\n"));
    free(s);
    kp_table_destroy(t);
}

static void test_csv_quoting(void **state)
{
    struct kp_table *t = make3();
    char *s;

    (void) state;
    row3(t, 1, "a,b", "say \"hi\"");
    row3(t, 2, "two\nlines", NULL);
    row3(t, 3, "plain", "cr\rhere");
    s = render(t, KP_TABLE_FORMAT_CSV, 0);
    assert_string_equal(s, "id,name,note\n"
                           "1,\"a,b\",\"say \"\"hi\"\"\"\n"
                           "2,\"two\nlines\",\n"
                           "3,plain,\"cr\rhere\"\n");
    free(s);
    kp_table_destroy(t);
}

static void test_json_types_and_escapes(void **state)
{
    static const struct kp_table_col cols[] = {
        { "s", KP_TABLE_TEXT },    { "i", KP_TABLE_NUMERIC }, { "u", KP_TABLE_NUMERIC },
        { "d", KP_TABLE_NUMERIC }, { "n", KP_TABLE_TEXT },
    };
    struct kp_table *t = NULL;
    char *s;

    (void) state;
    assert_int_equal(kp_table_create(cols, 5, &t), 0);
    assert_int_equal(kp_table_add_row(t), 0);
    assert_int_equal(kp_table_set_str(t, 0, "q\"b\\n\nt\t\x01\xff\xc3\xa9"), 0);
    assert_int_equal(kp_table_set_i64(t, 1, INT64_MIN), 0);
    assert_int_equal(kp_table_set_u64(t, 2, UINT64_MAX), 0);
    assert_int_equal(kp_table_set_double(t, 3, 1.5, "%.3f"), 0);
    assert_int_equal(kp_table_add_row(t), 0);
    assert_int_equal(kp_table_set_str(t, 0, ""), 0);
    assert_int_equal(kp_table_set_double(t, 3, 0.0 / 0.0, "%.2f"), 0); /* NaN -> null */
    assert_int_equal(kp_table_set_double(t, 1, 2.5, "%.1f%%"), 0);     /* not a number -> %.17g */
    assert_int_equal(kp_table_set_str(t, 4, "x"), 0);
    assert_int_equal(kp_table_set_null(t, 4), 0); /* back to NULL */
    s = render(t, KP_TABLE_FORMAT_JSON, 0);
    assert_string_equal(s, "[\n"
                           "  {\"s\": \"q\\\"b\\\\n\\nt\\t\\u0001\\ufffd\xc3\xa9\", "
                           "\"i\": -9223372036854775808, \"u\": 18446744073709551615, "
                           "\"d\": 1.500, \"n\": null},\n"
                           "  {\"s\": \"\", \"i\": 2.5, \"u\": null, \"d\": null, \"n\": null}\n"
                           "]\n");
    free(s);
    /* text shows the formatted double and the NaN as printed */
    s = render(t, KP_TABLE_FORMAT_TEXT, 0);
    assert_non_null(strstr(s, "1.500"));
    assert_non_null(strstr(s, "nan"));
    assert_non_null(strstr(s, "2.5%")); /* shown as formatted, a plain number in JSON */
    free(s);
    kp_table_destroy(t);
}

static void test_select(void **state)
{
    struct kp_table *t = make3();
    char err[256];
    char *s;

    (void) state;
    row3(t, 1, "a", "b");
    assert_int_equal(kp_table_select(t, "NOTE, id", err, sizeof(err)), 0);
    s = render(t, KP_TABLE_FORMAT_CSV, 0);
    assert_string_equal(s, "note,id\nb,1\n");
    free(s);
    s = render(t, KP_TABLE_FORMAT_JSON, 0);
    assert_string_equal(s, "[\n  {\"note\": \"b\", \"id\": 1}\n]\n");
    free(s);

    /* unknown column: error lists the valid ones; the selection stays */
    assert_int_equal(kp_table_select(t, "id,bogus", err, sizeof(err)), -EINVAL);
    assert_string_equal(err, "unknown column \"bogus\" (columns: id, name, note)");
    assert_int_equal(kp_table_select(t, "id,", err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "unknown column \"\""));
    s = render(t, KP_TABLE_FORMAT_CSV, 0);
    assert_string_equal(s, "note,id\nb,1\n");
    free(s);

    /* empty list: every column again */
    assert_int_equal(kp_table_select(t, "", err, sizeof(err)), 0);
    s = render(t, KP_TABLE_FORMAT_CSV, 0);
    assert_string_equal(s, "id,name,note\n1,a,b\n");
    free(s);
    kp_table_destroy(t);
}

/* kp_str_list_item, which -c's parsing here and counters' share: blanks dropped, empty items
 * kept, long items cut, NULL after the last. */
static void test_list_item(void **state)
{
    const char *p = " id ,\tNote\t,,x";
    char name[4];

    (void) state;
    p = kp_str_list_item(p, name, sizeof(name));
    assert_string_equal(name, "id");
    p = kp_str_list_item(p, name, sizeof(name));
    assert_string_equal(name, "Not");
    p = kp_str_list_item(p, name, sizeof(name));
    assert_string_equal(name, "");
    assert_string_equal(p, "x");
    assert_null(kp_str_list_item(p, name, sizeof(name)));
    assert_string_equal(name, "x");
    assert_string_equal(kp_str_list_item("a,", name, sizeof(name)), "");
    assert_string_equal(name, "a");
}

static void test_bad_calls(void **state)
{
    struct kp_table *t = NULL;

    (void) state;
    assert_int_equal(kp_table_create(cols3, 0, &t), -EINVAL);
    assert_null(t);
    t = make3();
    assert_int_equal(kp_table_set_str(t, 0, "x"), -EINVAL); /* no row yet */
    assert_int_equal(kp_table_add_row(t), 0);
    assert_int_equal(kp_table_set_u64(t, 3, 1), -EINVAL);
    assert_int_equal(kp_table_set_double(t, 0, 1.0, NULL), -EINVAL);
    for (int i = 0; i < 1000; i++) { /* growth */
        assert_int_equal(kp_table_add_row(t), 0);
        assert_int_equal(kp_table_set_i64(t, 0, i), 0);
    }
    assert_int_equal(kp_table_rows(t), 1001);
    kp_table_destroy(t);
    kp_table_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_aligned), cmocka_unit_test(test_text_empty_and_header_wider),
        cmocka_unit_test(test_utf8_widths),  cmocka_unit_test(test_width_cuts_text_only),
        cmocka_unit_test(test_csv_quoting),  cmocka_unit_test(test_json_types_and_escapes),
        cmocka_unit_test(test_select),       cmocka_unit_test(test_list_item),
        cmocka_unit_test(test_bad_calls),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
