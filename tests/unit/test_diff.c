/*
 * kp_diff's arithmetic (analyzer/diff.h) on rows whose figures are chosen by hand: matching by
 * name (both, new, vanished; a name twice on one side summed), deltas, the ratio with a zero
 * base (undefined, never a division by zero), the totals over every row before the cuts, the
 * order (|delta| first, then size, then name), --top and the minimum delta as prefix cuts, the
 * step breakdown per category from two breakdowns, and the verdict's words and figures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "diff.h"
#include "kprof.pb-c.h"
#include "view.h"

#define FIG(c, t)                     \
    {                                 \
        .calls = (c), .total_ns = (t) \
    }

static const struct kp_diff_row *find(const struct kp_diff_table *t, const char *name)
{
    for (size_t i = 0; i < t->n_all; i++) {
        if (strcmp(t->rows[i].name, name) == 0) {
            return &t->rows[i];
        }
    }
    fail_msg("no row %s", name);
    return NULL;
}

static void test_match(void **state)
{
    const struct kp_diff_item base[] = {
        { "gemm", FIG(10, 1000) }, { "relu", FIG(4, 400) }, { "gone", FIG(2, 300) },
        { "same", FIG(5, 500) },   { "zero", FIG(1, 0) },
    };
    const struct kp_diff_item other[] = {
        { "relu", FIG(4, 100) }, { "gemm", FIG(10, 2000) }, { "fresh", FIG(3, 250) },
        { "same", FIG(5, 500) }, { "zero", FIG(2, 70) },
    };
    struct kp_diff_table t;
    const struct kp_diff_row *r;

    (void) state;
    assert_int_equal(kp_diff_match(base, 5, other, 5, 0, 0, &t), 0);
    assert_int_equal(t.n_all, 6);
    assert_int_equal(t.n, 6);
    assert_int_equal(t.n_both, 4);
    assert_int_equal(t.n_new, 1);
    assert_int_equal(t.n_vanished, 1);
    /* totals: every row of each side */
    assert_int_equal(t.base.calls, 22);
    assert_int_equal(t.base.total_ns, 2200);
    assert_int_equal(t.other.calls, 24);
    assert_int_equal(t.other.total_ns, 2920);
    assert_int_equal(t.delta_ns, 720);

    r = find(&t, "gemm");
    assert_int_equal(r->status, KP_DIFF_BOTH);
    assert_int_equal(r->delta_ns, 1000);
    assert_int_equal(r->delta_calls, 0);
    assert_true(r->ratio_defined);
    assert_true(r->ratio == 2.0);
    r = find(&t, "gone");
    assert_int_equal(r->status, KP_DIFF_VANISHED);
    assert_int_equal(r->other.calls, 0);
    assert_int_equal(r->other.total_ns, 0);
    assert_int_equal(r->delta_ns, -300);
    assert_int_equal(r->delta_calls, -2);
    assert_true(r->ratio_defined && r->ratio == 0.0);
    r = find(&t, "fresh");
    assert_int_equal(r->status, KP_DIFF_NEW);
    assert_int_equal(r->base.total_ns, 0);
    assert_int_equal(r->delta_ns, 250);
    assert_false(r->ratio_defined); /* nothing to divide by */
    assert_true(r->ratio == 0.0);
    r = find(&t, "zero"); /* on both sides, but its base took no time */
    assert_int_equal(r->status, KP_DIFF_BOTH);
    assert_false(r->ratio_defined);
    r = find(&t, "relu");
    assert_true(r->ratio_defined && r->ratio == 0.25);

    /* |delta| first: gemm +1000; relu and gone both -300, a tie that the larger base + other
     * breaks (relu 500, gone 300); fresh +250, zero +70, same 0 */
    assert_string_equal(t.rows[0].name, "gemm");
    assert_string_equal(t.rows[1].name, "relu");
    assert_string_equal(t.rows[2].name, "gone");
    assert_string_equal(t.rows[3].name, "fresh");
    assert_string_equal(t.rows[4].name, "zero");
    assert_string_equal(t.rows[5].name, "same");
    kp_diff_table_fini(&t);
}

static void test_cuts_and_duplicates(void **state)
{
    const struct kp_diff_item base[] = { { "a", FIG(1, 100) },
                                         { "b", FIG(1, 100) },
                                         { "a", FIG(2, 50) },
                                         { "c", FIG(1, 10) } };
    const struct kp_diff_item other[] = { { "a", FIG(1, 600) },
                                          { "b", FIG(1, 130) },
                                          { "c", FIG(1, 12) } };
    struct kp_diff_table t;
    const struct kp_diff_row *r;

    (void) state;
    /* a name twice on a side: summed (3 calls, 150 ns) */
    assert_int_equal(kp_diff_match(base, 4, other, 3, 0, 0, &t), 0);
    assert_int_equal(t.n_all, 3);
    r = find(&t, "a");
    assert_int_equal(r->base.calls, 3);
    assert_int_equal(r->base.total_ns, 150);
    assert_int_equal(r->delta_ns, 450);
    assert_int_equal(r->delta_calls, -2);
    kp_diff_table_fini(&t);

    /* min delta 30: a (450) and b (30) stay, c (2) goes; the totals still count c */
    assert_int_equal(kp_diff_match(base, 4, other, 3, 0, 30, &t), 0);
    assert_int_equal(t.n, 2);
    assert_int_equal(t.n_all, 3);
    assert_string_equal(t.rows[0].name, "a");
    assert_string_equal(t.rows[1].name, "b");
    assert_int_equal(t.base.total_ns, 260);
    assert_int_equal(t.other.total_ns, 742);
    kp_diff_table_fini(&t);

    /* top 1 with it */
    assert_int_equal(kp_diff_match(base, 4, other, 3, 1, 30, &t), 0);
    assert_int_equal(t.n, 1);
    assert_string_equal(t.rows[0].name, "a");
    kp_diff_table_fini(&t);

    /* nothing on either side */
    assert_int_equal(kp_diff_match(NULL, 0, NULL, 0, 5, 0, &t), 0);
    assert_int_equal(t.n_all, 0);
    assert_int_equal(t.n, 0);
    assert_int_equal(t.delta_ns, 0);
    kp_diff_table_fini(&t);
}

static void test_ratio(void **state)
{
    bool d;

    (void) state;
    assert_true(kp_diff_ratio(0.0, 5.0, &d) == 0.0);
    assert_false(d);
    assert_true(kp_diff_ratio(0.0, 0.0, &d) == 0.0);
    assert_false(d);
    assert_true(kp_diff_ratio(4.0, 5.0, &d) == 1.25);
    assert_true(d);
    assert_true(kp_diff_ratio(4.0, 0.0, &d) == 0.0);
    assert_true(d);
}

static void test_steps(void **state)
{
    struct kp_an_step bs[2], os[1];
    struct kp_an_breakdown b, o;
    struct kp_diff_cat c[KP_DIFF_N_CATS];

    (void) state;
    memset(bs, 0, sizeof(bs));
    memset(os, 0, sizeof(os));
    memset(&b, 0, sizeof(b));
    memset(&o, 0, sizeof(o));
    /* base: two steps of 100 and 140 ns, kernel 60 + 80, other 40 + 60 */
    bs[0] = (struct kp_an_step){ .start_ns = 0, .end_ns = 100 };
    bs[0].cost_ns[KP_AN_KERNEL] = 60;
    bs[0].cost_ns[KP_AN_OTHER] = 40;
    bs[1] = (struct kp_an_step){ .start_ns = 100, .end_ns = 240 };
    bs[1].cost_ns[KP_AN_KERNEL] = 80;
    bs[1].cost_ns[KP_AN_OTHER] = 60;
    b.steps = bs;
    b.n_steps = 2;
    b.avg_ns[KP_AN_KERNEL] = 70;
    b.avg_ns[KP_AN_OTHER] = 50;
    b.avg_total_ns = 120;
    /* other: one step of 180 ns, kernel 150 and memcpy 30 */
    os[0] = (struct kp_an_step){ .start_ns = 0, .end_ns = 180 };
    os[0].cost_ns[KP_AN_KERNEL] = 150;
    os[0].cost_ns[KP_AN_MEMCPY] = 30;
    o.steps = os;
    o.n_steps = 1;
    o.avg_ns[KP_AN_KERNEL] = 150;
    o.avg_ns[KP_AN_MEMCPY] = 30;
    o.avg_total_ns = 180;
    kp_diff_steps(&b, &o, c);
    assert_string_equal(c[KP_AN_KERNEL].name, "kernel");
    assert_true(c[KP_AN_KERNEL].base_avg_ns == 70 && c[KP_AN_KERNEL].other_avg_ns == 150);
    assert_true(c[KP_AN_KERNEL].delta_avg_ns == 80);
    assert_true(c[KP_AN_KERNEL].ratio_defined && c[KP_AN_KERNEL].ratio == 150.0 / 70.0);
    assert_int_equal(c[KP_AN_KERNEL].base_total_ns, 140);
    assert_int_equal(c[KP_AN_KERNEL].other_total_ns, 150);
    assert_false(c[KP_AN_MEMCPY].ratio_defined); /* a zero base */
    assert_true(c[KP_AN_MEMCPY].delta_avg_ns == 30);
    assert_true(c[KP_AN_OTHER].delta_avg_ns == -50 && c[KP_AN_OTHER].ratio == 0.0);
    assert_string_equal(c[KP_AN_CAT_COUNT].name, "total");
    assert_true(c[KP_AN_CAT_COUNT].base_avg_ns == 120 && c[KP_AN_CAT_COUNT].other_avg_ns == 180);
    assert_true(c[KP_AN_CAT_COUNT].ratio == 1.5);
    assert_int_equal(c[KP_AN_CAT_COUNT].base_total_ns, 240);
    assert_int_equal(c[KP_AN_CAT_COUNT].other_total_ns, 180);
}

static void test_verdict(void **state)
{
    const struct kp_diff_item base[] = { { "sgemm", FIG(2, 4000000) }, { "old", FIG(1, 1000) } };
    const struct kp_diff_item other[] = { { "sgemm", FIG(2, 9200000) }, { "new_k", FIG(1, 100) } };
    struct kp_diff_item ops_b[2], ops_o[1];
    char *longname = malloc(3001);
    struct kp_diff d;

    (void) state;
    memset(&d, 0, sizeof(d));
    d.has_steps = d.has_kernels = true;
    d.base_steps = d.other_steps = 2;
    d.base_step_ns = 40e6;
    d.other_step_ns = 45e6;
    d.cats[KP_AN_KERNEL] = (struct kp_diff_cat){ .name = "kernel", .delta_avg_ns = 2.6e6 };
    d.cats[KP_AN_OTHER] = (struct kp_diff_cat){ .name = "other", .delta_avg_ns = 2.4e6 };
    assert_int_equal(kp_diff_match(base, 2, other, 2, 0, 0, &d.kernels), 0);
    assert_int_equal(kp_diff_verdict(&d, "run 1 rank 0", "run 2 rank 0"), 0);
    assert_string_equal(d.verdict,
                        "run 2 rank 0 is 12.5% slower per step than run 1 rank 0 (45.000 ms vs "
                        "40.000 ms, +5.000 ms); the largest change per step: kernel +2.600 ms; "
                        "kernels (1 new, 1 vanished): kernel time +5.199 ms in all (4.001 ms vs "
                        "9.200 ms), mostly sgemm (+5.200 ms)");
    kp_diff_fini(&d);

    /* the same step time, shifted between categories; a name of 3000 bytes in full; ops name
     * their largest change only (their totals nest) */
    assert_non_null(longname);
    memset(longname, 'k', 3000);
    longname[3000] = '\0';
    ops_b[0] = (struct kp_diff_item){ "aten::mm", FIG(4, 9000) };
    ops_b[1] = (struct kp_diff_item){ "aten::conj", FIG(2, 500) };
    ops_o[0] = (struct kp_diff_item){ "aten::mm", FIG(4, 9000) };
    memset(&d, 0, sizeof(d));
    d.has_steps = d.has_kernels = d.has_ops = true;
    d.base_steps = d.other_steps = 6;
    d.base_step_ns = d.other_step_ns = 177592000.0;
    d.cats[KP_AN_KERNEL] = (struct kp_diff_cat){ .name = "kernel", .delta_avg_ns = 305500 };
    d.cats[KP_AN_OTHER] = (struct kp_diff_cat){ .name = "other", .delta_avg_ns = -305500 };
    assert_int_equal(kp_diff_match(&(struct kp_diff_item){ longname, FIG(1, 10) }, 1,
                                   &(struct kp_diff_item){ longname, FIG(1, 30) }, 1, 0, 0,
                                   &d.kernels),
                     0);
    assert_int_equal(kp_diff_match(ops_b, 2, ops_o, 1, 0, 0, &d.ops), 0);
    assert_int_equal(kp_diff_verdict(&d, "run 1 rank 0", "run 2 rank 0"), 0);
    assert_non_null(strstr(d.verdict, "run 2 rank 0 takes the same time per step as run 1 rank 0 "
                                      "(177.592 ms); the largest change per step: kernel "
                                      "+305.5 µs; kernels: kernel time +20 ns in all"));
    assert_non_null(strstr(d.verdict, longname));
    assert_non_null(strstr(d.verdict, "; ops (0 new, 1 vanished): largest change aten::conj "
                                      "(-500 ns host total, vanished)"));
    kp_diff_fini(&d);
    free(longname);

    /* one side without steps: said, not divided by */
    memset(&d, 0, sizeof(d));
    d.has_steps = true;
    d.base_steps = 3;
    d.base_step_ns = 10.0;
    assert_int_equal(kp_diff_verdict(&d, "run 1 rank 0", "run 1 rank 1"), 0);
    assert_string_equal(d.verdict,
                        "no step times to compare: run 1 rank 0 has 3 steps, run 1 rank 1 0");
    kp_diff_fini(&d);

    /* kernels asked for, none on either side */
    memset(&d, 0, sizeof(d));
    d.has_kernels = true;
    assert_int_equal(kp_diff_verdict(&d, "run 1 rank 0", "run 2 rank 0"), 0);
    assert_string_equal(d.verdict, "run 2 rank 0 against run 1 rank 0; neither side has kernels");
    kp_diff_fini(&d);
}

/* A DiffRequest's key (view.h: the cache compares keys byte for byte), or NULL with err set
 * when the view refuses the request. */
static bool key_of(const Kprof__V1__DiffRequest *r, struct kp_view_key *k, char *err, size_t len)
{
    memset(k, 0xa5, sizeof(*k)); /* garbage: the key function sets every byte */
    err[0] = '\0';
    return kp_view_diff.key(&r->base, 0, k, err, len);
}

static void test_key(void **state)
{
    Kprof__V1__DiffPart all[] = { KPROF__V1__DIFF_PART__DIFF_PART_ALL };
    Kprof__V1__DiffPart three[] = { KPROF__V1__DIFF_PART__DIFF_PART_KERNELS,
                                    KPROF__V1__DIFF_PART__DIFF_PART_STEPS,
                                    KPROF__V1__DIFF_PART__DIFF_PART_OPS };
    Kprof__V1__DiffPart bad[] = { (Kprof__V1__DiffPart) 7 };
    Kprof__V1__DiffRequest base = KPROF__V1__DIFF_REQUEST__INIT, r;
    struct kp_view_key k0, k;
    char err[512];

    (void) state;
    /* never cached, yet it only reads: the web API serves it */
    assert_true(kp_view_diff.uncached);
    assert_true(kp_view_diff.writes == NULL);
    base.run_id = 3;
    base.rank = 0;
    base.other_run_id = 4;
    assert_true(key_of(&base, &k0, err, sizeof(err)));
    assert_int_equal(k0.run, 3);
    assert_int_equal(k0.rank, 0);

    /* the same request, said otherwise: the same key */
    r = base;
    r.n_parts = 1;
    r.parts = all;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_equal(&k, &k0, sizeof(k));
    r.n_parts = 3;
    r.parts = three;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_equal(&k, &k0, sizeof(k));

    /* the other side and every option are in the key */
    r = base;
    r.other_run_id = 5;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_not_equal(&k, &k0, sizeof(k));
    r = base;
    r.other_rank = 1;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_not_equal(&k, &k0, sizeof(k));
    r = base;
    r.n_parts = 1;
    r.parts = three; /* kernels only */
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_not_equal(&k, &k0, sizeof(k));
    r = base;
    r.top = 10;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_not_equal(&k, &k0, sizeof(k));
    r = base;
    r.min_delta_ns = 1000;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_not_equal(&k, &k0, sizeof(k));
    r = base;
    r.plugin_compat = 1;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_not_equal(&k, &k0, sizeof(k));

    /* other_run_id 0 is the base run: a rank diff, the same key as naming it */
    r = base;
    r.other_run_id = 0;
    r.other_rank = 2;
    assert_true(key_of(&r, &k0, err, sizeof(err)));
    r.other_run_id = 3;
    assert_true(key_of(&r, &k, err, sizeof(err)));
    assert_memory_equal(&k, &k0, sizeof(k));

    /* refusals */
    r = base;
    r.other_run_id = 0;
    assert_false(key_of(&r, &k, err, sizeof(err))); /* run 3 rank 0 twice */
    assert_non_null(strstr(err, "both sides are run 3 rank 0: nothing to compare"));
    r.rank = r.other_rank = -1;
    assert_false(key_of(&r, &k, err, sizeof(err)));
    assert_non_null(strstr(err, "both sides are run 3's only rank"));
    r = base;
    r.other_rank = -2;
    assert_false(key_of(&r, &k, err, sizeof(err)));
    assert_non_null(strstr(err, "other_rank -2 is negative"));
    r = base;
    r.other_run_id = (uint64_t) INT32_MAX + 1;
    assert_false(key_of(&r, &k, err, sizeof(err)));
    assert_non_null(strstr(err, "is not a run id"));
    r = base;
    r.min_delta_ns = -1;
    assert_false(key_of(&r, &k, err, sizeof(err)));
    assert_non_null(strstr(err, "min_delta_ns -1 is negative"));
    r = base;
    r.n_parts = 1;
    r.parts = bad;
    assert_false(key_of(&r, &k, err, sizeof(err)));
    assert_non_null(strstr(err, "part 7 is not a known part"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match),   cmocka_unit_test(test_cuts_and_duplicates),
        cmocka_unit_test(test_ratio),   cmocka_unit_test(test_steps),
        cmocka_unit_test(test_verdict), cmocka_unit_test(test_key),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
