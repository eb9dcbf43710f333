/* Unit tests for common/kp_strbuf: growth, the length cap, printf appends, direct writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_strbuf.h"

static void test_empty(void **state)
{
    struct kp_strbuf sb;

    kp_strbuf_init(&sb, 0);
    assert_null(sb.data);
    assert_int_equal(sb.len, 0);
    kp_strbuf_reset(&sb);
    kp_strbuf_fini(&sb);
    kp_strbuf_fini(&sb); /* twice is fine */
    assert_int_equal(kp_strbuf_append(&sb, "", 0), 0);
    assert_non_null(sb.data);
    assert_string_equal(sb.data, "");
    kp_strbuf_fini(&sb);
}

static void test_append_and_grow(void **state)
{
    struct kp_strbuf sb;
    size_t grows = 0, last_cap = 0;
    char expect[8];

    kp_strbuf_init(&sb, 0);
    for (int i = 0; i < 100000; i++) {
        snprintf(expect, sizeof(expect), "%06d,", i % 1000000);
        assert_int_equal(kp_strbuf_append(&sb, expect, 7), 0);
        if (sb.cap != last_cap) {
            grows++;
            last_cap = sb.cap;
        }
    }
    assert_int_equal(sb.len, 700000);
    assert_int_equal(sb.data[sb.len], '\0');
    for (int i = 0; i < 100000; i += 997) {
        snprintf(expect, sizeof(expect), "%06d,", i);
        assert_memory_equal(sb.data + (size_t) i * 7, expect, 7);
    }
    /* Doubling: about log2(700000 / 64) reallocations, not one per append. */
    assert_true(grows < 20);
    kp_strbuf_fini(&sb);
}

static void test_str_and_putc(void **state)
{
    struct kp_strbuf sb;

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_strbuf_append_str(&sb, "abc"), 0);
    assert_int_equal(kp_strbuf_putc(&sb, '-'), 0);
    assert_int_equal(kp_strbuf_append_str(&sb, ""), 0);
    assert_int_equal(kp_strbuf_append(&sb, "x\0y", 3), 0); /* bytes, NULs included */
    assert_int_equal(sb.len, 7);
    assert_memory_equal(sb.data, "abc-x\0y", 8);
    kp_strbuf_fini(&sb);
}

struct fmt_case {
    const char *want;
    int a;
    const char *s;
};

static void test_appendf_table(void **state)
{
    static char big[3000];
    struct fmt_case cases[] = {
        { "n=0 s=", 0, "" },
        { "n=-12 s=hello", -12, "hello" },
        { NULL, 7, big }, /* longer than the first allocation: the grow-and-retry path */
    };
    struct kp_strbuf sb;
    char want[4000];

    memset(big, 'z', sizeof(big) - 1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kp_strbuf_init(&sb, 0);
        assert_int_equal(kp_strbuf_append_str(&sb, "["), 0);
        assert_int_equal(kp_strbuf_appendf(&sb, "n=%d s=%s", cases[i].a, cases[i].s), 0);
        snprintf(want, sizeof(want), "[%s", cases[i].want != NULL ? cases[i].want : "n=7 s=");
        if (cases[i].want == NULL) {
            strcat(want, big);
        }
        assert_string_equal(sb.data, want);
        assert_int_equal(sb.len, strlen(want));
        kp_strbuf_fini(&sb);
    }
}

static void test_cap(void **state)
{
    struct kp_strbuf sb;

    kp_strbuf_init(&sb, 10);
    assert_int_equal(kp_strbuf_append(&sb, "0123456789", 10), 0);
    assert_true(sb.cap <= 11);
    assert_int_equal(kp_strbuf_putc(&sb, 'x'), KP_ETOOBIG);
    assert_int_equal(kp_strbuf_appendf(&sb, "%d", 5), KP_ETOOBIG);
    assert_int_equal(kp_strbuf_reserve(&sb, 1), KP_ETOOBIG);
    assert_int_equal(kp_strbuf_reserve(&sb, SIZE_MAX), KP_ETOOBIG);
    assert_int_equal(sb.len, 10);
    assert_string_equal(sb.data, "0123456789");

    /* A failed appendf in the middle leaves the earlier contents intact. */
    kp_strbuf_reset(&sb);
    assert_int_equal(kp_strbuf_append_str(&sb, "abc"), 0);
    assert_int_equal(kp_strbuf_appendf(&sb, "%s", "too long for it"), KP_ETOOBIG);
    assert_int_equal(sb.len, 3);
    assert_string_equal(sb.data, "abc");
    assert_int_equal(kp_strbuf_appendf(&sb, "%s", "1234567"), 0);
    assert_string_equal(sb.data, "abc1234567");
    kp_strbuf_fini(&sb);
}

static void test_reset_keeps_memory(void **state)
{
    struct kp_strbuf sb;
    char *data;
    size_t cap;

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_strbuf_appendf(&sb, "%0500d", 1), 0);
    data = sb.data;
    cap = sb.cap;
    kp_strbuf_reset(&sb);
    assert_int_equal(sb.len, 0);
    assert_string_equal(sb.data, "");
    assert_ptr_equal(sb.data, data);
    assert_int_equal(sb.cap, cap);
    assert_int_equal(kp_strbuf_append_str(&sb, "again"), 0);
    assert_string_equal(sb.data, "again");
    kp_strbuf_fini(&sb);
}

static void test_reserve_direct_write(void **state)
{
    struct kp_strbuf sb;

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_strbuf_append_str(&sb, "head:"), 0);
    assert_int_equal(kp_strbuf_reserve(&sb, 1000), 0);
    assert_true(sb.cap >= sb.len + 1000 + 1);
    memset(sb.data + sb.len, 'q', 1000);
    sb.len += 1000;
    sb.data[sb.len] = '\0';
    assert_int_equal(kp_strbuf_append_str(&sb, ":tail"), 0);
    assert_int_equal(sb.len, 5 + 1000 + 5);
    assert_memory_equal(sb.data, "head:q", 6);
    assert_string_equal(sb.data + 1005, ":tail");
    kp_strbuf_fini(&sb);
}

static void test_zeroed_struct(void **state)
{
    struct kp_strbuf sb = { 0 };

    assert_int_equal(kp_strbuf_appendf(&sb, "%s-%d", "z", 1), 0);
    assert_string_equal(sb.data, "z-1");
    kp_strbuf_fini(&sb);
}

/* Sanitizers report a huge allocation instead of returning NULL. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define SANITIZED 1
#endif
#endif

static void test_enomem(void **state)
{
#ifdef SANITIZED
    skip();
#else
    struct kp_strbuf sb;

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_strbuf_append_str(&sb, "keep"), 0);
    assert_int_equal(kp_strbuf_reserve(&sb, SIZE_MAX / 4), -ENOMEM);
    assert_int_equal(sb.len, 4);
    assert_string_equal(sb.data, "keep");
    kp_strbuf_fini(&sb);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_append_and_grow),
        cmocka_unit_test(test_str_and_putc),
        cmocka_unit_test(test_appendf_table),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_reset_keeps_memory),
        cmocka_unit_test(test_reserve_direct_write),
        cmocka_unit_test(test_zeroed_struct),
        cmocka_unit_test(test_enomem),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
