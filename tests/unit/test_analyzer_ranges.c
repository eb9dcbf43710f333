/* Unit tests for analyzer/kp_ranges: merge, intersect, subtract and lengths, on edge cases and
 * on the TensorBoard plugin's own range cases (tests/data/peers/tbplugin/cases/test_merge_ranges
 * and test_subtract_ranges_lists), read from the case files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ranges.h"

#define R(s, e) ((struct kp_range){ (s), (e) })

static void assert_ranges(const struct kp_range *got, size_t n, const struct kp_range *want,
                          size_t nw)
{
    assert_int_equal(n, nw);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(got[i].start, want[i].start);
        assert_int_equal(got[i].end, want[i].end);
    }
}

static void test_merge(void **state)
{
    struct kp_range r[] = { R(5, 7), R(1, 3), R(3, 4), R(2, 2), R(6, 6), R(8, 9), R(0, 0) };
    const struct kp_range want[] = { R(1, 4), R(5, 7), R(8, 9) };
    size_t n = kp_ranges_merge(r, sizeof(r) / sizeof(r[0]));

    assert_ranges(r, n, want, 3);
    assert_int_equal(kp_ranges_length(r, n), 6);
    assert_int_equal(kp_ranges_clip_length(r, n, 2, 6), 3);
    assert_int_equal(kp_ranges_merge(r, 0), 0);
}

/* The union by a plain O(n^2) walk: each point covered by some range is in the union. */
static size_t naive_union(const struct kp_range *in, size_t n, struct kp_range *out)
{
    size_t no = 0;
    bool *used = calloc(n + 1, sizeof(*used));

    assert_non_null(used);
    for (;;) { /* the range with the lowest start not taken yet, grown while others touch it */
        size_t best = n;
        struct kp_range cur;
        bool grew = true;

        for (size_t i = 0; i < n; i++) {
            if (!used[i] && in[i].end > in[i].start &&
                (best == n || in[i].start < in[best].start)) {
                best = i;
            }
        }
        if (best == n) {
            break;
        }
        cur = in[best];
        used[best] = true;
        while (grew) {
            grew = false;
            for (size_t i = 0; i < n; i++) {
                if (!used[i] && in[i].end > in[i].start && in[i].start <= cur.end) {
                    cur.end = in[i].end > cur.end ? in[i].end : cur.end;
                    used[i] = true;
                    grew = true;
                }
            }
        }
        out[no++] = cur;
    }
    free(used);
    return no;
}

/* Unsorted input (the radix sort's path) of every size up to 600, starts spread over the whole
 * int64 range, negative ones and repeats included, against the naive union. */
static void test_merge_unsorted(void **state)
{
    struct kp_range in[600], got[600], want[600];
    uint64_t x = 0x9E3779B97F4A7C15ull;

    for (size_t n = 1; n <= 600; n += (n < 40 ? 1 : 37)) {
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
            int shift = (int) (x % 4) * 16;          /* small, wide and full-width starts */
            int64_t start = (int64_t) ((x >> shift) - (x >> (shift + 1)) * 3); /* wraps */

            if (i % 5 == 4) {
                start = in[i / 2].start; /* a repeated start */
            }
            in[i] = R(start, start > INT64_MAX - 1000 ? start : start + (int64_t) (x % 1000));
        }
        memcpy(got, in, n * sizeof(*in));
        assert_ranges(got, kp_ranges_merge(got, n), want, naive_union(in, n, want));
    }
}

static void test_intersect(void **state)
{
    const struct kp_range a[] = { R(0, 10), R(20, 30) };
    const struct kp_range b[] = { R(5, 25), R(28, 40) };
    const struct kp_range want[] = { R(5, 10), R(20, 25), R(28, 30) };
    struct kp_range out[4];

    assert_ranges(out, kp_ranges_intersect(a, 2, b, 2, out), want, 3);
    assert_int_equal(kp_ranges_intersect(a, 2, b, 0, out), 0);
    /* touching is not overlapping */
    assert_int_equal(kp_ranges_intersect(a, 1, (const struct kp_range[]){ R(10, 20) }, 1, out), 0);
}

static void test_subtract(void **state)
{
    const struct kp_range a[] = { R(0, 10), R(20, 30) };
    const struct kp_range b[] = { R(2, 3), R(5, 22), R(30, 31) };
    const struct kp_range want[] = { R(0, 2), R(3, 5), R(22, 30) };
    struct kp_range out[5];

    assert_ranges(out, kp_ranges_subtract(a, 2, b, 3, out), want, 3);
    assert_ranges(out, kp_ranges_subtract(a, 2, b, 0, out), a, 2);
    assert_int_equal(kp_ranges_subtract(a, 2, (const struct kp_range[]){ R(-5, 40) }, 1, out), 0);
}

/* Clipping a set to windows, as breakdown clips each category to each step: windows that cut
 * ranges, windows that touch a range's end or start (no overlap), empty and inverted windows,
 * windows before, between and after every range, consecutive windows that share a boundary
 * (their clips add up to the whole), and a long set checked against a plain sum. */
static void test_clip_length(void **state)
{
    const struct kp_range r[] = { R(-10, -5), R(0, 10), R(12, 13), R(20, 30), R(30, 31) };
    const struct kp_range set[] = { R(-10, -5), R(0, 10), R(12, 13), R(20, 31) };
    const struct {
        int64_t s, e, want;
    } cases[] = {
        { -20, 100, 5 + 10 + 1 + 11 }, /* all of it */
        { 5, 25, 5 + 1 + 5 },          /* cuts the first and the last range it meets */
        { 10, 12, 0 },                 /* between two ranges, touching both */
        { 10, 13, 1 },                 /* touches one, holds the next */
        { 12, 12, 0 },                 /* empty */
        { 13, 12, 0 },                 /* inverted */
        { -100, -10, 0 },              /* before every range, touching the first */
        { 31, 50, 0 },                 /* after every range, touching the last */
        { 25, 26, 1 },                 /* inside one range */
        { -7, 1, 2 + 1 },              /* across the first gap */
        { 0, 10, 10 },                 /* exactly one range */
        { 9, 21, 1 + 1 + 1 },          /* the tails of three ranges */
    };
    /* steps that touch: [-20, 0) [0, 12) [12, 20) [20, 20) [20, 30) [30, 40) */
    const int64_t bounds[] = { -20, 0, 12, 20, 20, 30, 40 };
    const int64_t want_steps[] = { 5, 10, 1, 0, 10, 1 };
    struct kp_range big[1000], m[5];
    int64_t total = 0;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(kp_ranges_clip_length(set, 4, cases[i].s, cases[i].e), cases[i].want);
    }
    assert_int_equal(kp_ranges_clip_length(set, 0, -100, 100), 0);
    for (size_t i = 0; i + 1 < sizeof(bounds) / sizeof(bounds[0]); i++) {
        int64_t got = kp_ranges_clip_length(set, 4, bounds[i], bounds[i + 1]);

        assert_int_equal(got, want_steps[i]);
        total += got;
    }
    assert_int_equal(total, kp_ranges_clip_length(set, 4, -20, 40));
    /* the unmerged input (touching ranges) merges to the set above */
    memcpy(m, r, sizeof(r));
    assert_ranges(m, kp_ranges_merge(m, 5), set, 4);
    /* ranges [10 i, 10 i + 3): each window of 7 from every start sees 3 + its share of the
     * next range */
    for (int i = 0; i < 1000; i++) {
        big[i] = R(10 * i, 10 * i + 3);
    }
    for (int64_t s = -15; s < 10010; s += 7) {
        int64_t want = 0;

        for (int i = 0; i < 1000; i++) {
            int64_t lo = big[i].start > s ? big[i].start : s;
            int64_t hi = big[i].end < s + 7 ? big[i].end : s + 7;

            want += hi > lo ? hi - lo : 0;
        }
        assert_int_equal(kp_ranges_clip_length(big, 1000, s, s + 7), want);
    }
}

/* ---- the plugin's cases ---- */

static char *slurp(const char *name)
{
    const char *src = getenv("KPROF_SOURCE_DIR");
    char path[4096];
    FILE *f;
    char *buf;
    long n;

    snprintf(path, sizeof(path), "%s/tests/data/peers/tbplugin/cases/%s", src ? src : ".", name);
    f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = calloc(1, (size_t) n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t) n, f), (size_t) n);
    fclose(f);
    return buf;
}

/* A decimal number in units of 1e-6, exactly (the cases have at most a few decimals). */
static int64_t parse_fixed(const char **p)
{
    int64_t ip = 0, frac = 0, scale = 1000000;
    int neg = 0;

    while (**p == ' ' || **p == '\n') {
        (*p)++;
    }
    if (**p == '-') {
        neg = 1;
        (*p)++;
    }
    while (**p >= '0' && **p <= '9') {
        ip = ip * 10 + (*(*p)++ - '0');
    }
    if (**p == '.') {
        (*p)++;
        while (**p >= '0' && **p <= '9') {
            scale /= 10;
            frac += (*(*p)++ - '0') * scale;
        }
    }
    return (neg ? -1 : 1) * (ip * 1000000 + frac);
}

/* Parses the [[a, b], ...] list after "key" within the section after "section". */
static size_t parse_list(const char *doc, const char *section, const char *key,
                         struct kp_range *out, size_t cap)
{
    const char *p = strstr(doc, section);
    size_t n = 0;

    assert_non_null(p);
    p = strstr(p, key);
    assert_non_null(p);
    p = strchr(p, '[') + 1; /* the outer list */
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == ',') {
            p++;
        }
        if (*p == ']') {
            return n;
        }
        assert_true(*p == '[' && n < cap);
        p++;
        out[n].start = parse_fixed(&p);
        while (*p == ' ' || *p == '\n' || *p == ',') {
            p++;
        }
        out[n].end = parse_fixed(&p);
        while (*p != ']') {
            p++;
        }
        p++;
        n++;
    }
}

static void test_plugin_merge_ranges(void **state)
{
    char *doc = slurp("test_merge_ranges.json");
    struct kp_range in[64], want[64];
    size_t n, nw;

    if (!doc) {
        /* under ctest (KPROF_SOURCE_DIR set) the peers must be there: tests/data */
        print_message("peer case test_merge_ranges.json not found\n");
        if (getenv("KPROF_SOURCE_DIR") != NULL) {
            fail();
        }
        skip();
    }
    n = parse_list(doc, "\"input\"", "\"ranges\"", in, 64);
    nw = parse_list(doc, "\"expected\"", "\"ranges\"", want, 64);
    assert_true(n > 0 && nw > 0);
    n = kp_ranges_merge(in, n);
    assert_ranges(in, n, want, nw);
    free(doc);
}

static void test_plugin_subtract_ranges_lists(void **state)
{
    char *doc = slurp("test_subtract_ranges_lists.json");
    struct kp_range a[64], b[64], want[64], out[128];
    size_t na, nb, nw;

    if (!doc) {
        /* under ctest (KPROF_SOURCE_DIR set) the peers must be there: tests/data */
        print_message("peer case test_subtract_ranges_lists.json not found\n");
        if (getenv("KPROF_SOURCE_DIR") != NULL) {
            fail();
        }
        skip();
    }
    na = parse_list(doc, "\"input\"", "\"ranges1\"", a, 64);
    nb = parse_list(doc, "\"input\"", "\"ranges2\"", b, 64);
    nw = parse_list(doc, "\"expected\"", "\"ranges\"", want, 64);
    assert_true(na > 0 && nb > 0 && nw > 0);
    assert_ranges(out, kp_ranges_subtract(a, na, b, nb, out), want, nw);
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_merge_unsorted),
        cmocka_unit_test(test_intersect),
        cmocka_unit_test(test_subtract),
        cmocka_unit_test(test_clip_length),
        cmocka_unit_test(test_plugin_merge_ranges),
        cmocka_unit_test(test_plugin_subtract_ranges_lists),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
