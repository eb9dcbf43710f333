/* Unit tests of kp_batch_builder (common/kp_batch_builder.c): rows into the kinds' columns, the
 * column rules (ALWAYS, NEVER, AUTO with its "none", side values together), delta-encoded
 * starts, the string table, and batches cut before the last rows (upto, next). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kp_batch_builder.h"
#include "kp_codec.h"
#include "kprof.pb-c.h"

static const struct kp_batch_limits limits = {
    .max_name_bytes = KP_CODEC_DEFAULT_MAX_NAME_BYTES,
    .max_strings = KP_CODEC_DEFAULT_MAX_STRINGS,
    .max_rows = KP_CODEC_DEFAULT_MAX_ROWS,
};

static void test_rule_names_a_column(void **state)
{
    static const struct kp_batch_builder_rule bad[] = {
        { KP_EV_KERNEL, "no_such_column", KP_BB_NEVER, 0 },
    };
    static const struct kp_batch_builder_rule wrong_kind[] = {
        { KP_EV_STEP, "grid_x", KP_BB_NEVER, 0 },
    };
    struct kp_batch_builder *b = (struct kp_batch_builder *) 1;

    (void) state;
    assert_int_equal(kp_batch_builder_create(KP_BB_ALWAYS, bad, 1, &b), -EINVAL);
    assert_null(b);
    assert_int_equal(kp_batch_builder_create(KP_BB_ALWAYS, wrong_kind, 1, &b), -EINVAL);
    assert_int_equal(kp_batch_builder_create(KP_BB_ALWAYS, NULL, 0, &b), 0);
    kp_batch_builder_destroy(b);
}

/* ALWAYS and NEVER columns, starts delta-encoded from base_ns, rows added n at a time. */
static void test_always_never_and_starts(void **state)
{
    static const struct kp_batch_builder_rule rules[] = {
        { KP_EV_KERNEL, "graph_id", KP_BB_NEVER, 0 },
        { KP_EV_KERNEL, "blocks_per_sm", KP_BB_NEVER, 0 },
        { KP_EV_KERNEL, "est_occupancy", KP_BB_NEVER, 0 },
    };
    struct kp_batch_builder *b;
    Kprof__V1__Kernels *k;
    Kprof__V1__Batch *m;
    char err[256];

    (void) state;
    assert_int_equal(kp_batch_builder_create(KP_BB_ALWAYS, rules, 3, &b), 0);
    assert_int_equal(kp_batch_builder_add(b, KP_EV_KERNEL, 2), 0);
    assert_int_equal(kp_batch_builder_add(b, KP_EV_KERNEL, 1), 2);
    k = kp_batch_builder_table(b, KP_EV_KERNEL);
    assert_null(k->graph_id); /* NEVER: not even allocated */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(k->device[i], 0); /* rows come zeroed */
        k->start_ns[i] = 1000 + 10 * i;
        k->dur_ns[i] = 5;
    }
    assert_int_equal(kp_batch_builder_rows(b, KP_EV_KERNEL), 3);
    assert_int_equal(kp_batch_builder_total(b), 3);
    m = kp_batch_builder_finish(b, 990, NULL);
    m->run_id = 1;
    assert_ptr_equal(m->kernels, k);
    assert_null(m->memcpys);
    assert_int_equal(m->base_ns, 990);
    assert_int_equal(k->n_start_ns, 3);
    assert_int_equal(k->start_ns[0], 10);
    assert_int_equal(k->start_ns[1], 10);
    assert_int_equal(k->start_ns[2], 10);
    assert_int_equal(k->n_device, 3); /* ALWAYS, though every row is 0 */
    assert_int_equal(k->n_graph_id, 0);
    assert_int_equal(k->n_blocks_per_sm, 0);
    assert_int_equal(m->n_strings, 1);
    assert_string_equal(m->strings[0], "");
    assert_int_equal(kp_batch_validate(m, &limits, err, sizeof(err)), 0);
    kp_batch_builder_next(b);
    assert_int_equal(kp_batch_builder_total(b), 0);
    kp_batch_builder_destroy(b);
}

/* AUTO: a column whose rows all hold its "none" is left out; side values go together. */
static void test_auto_and_side_values(void **state)
{
    static const struct kp_batch_builder_rule rules[] = {
        { KP_EV_OP, "seq", KP_BB_AUTO, -1 },
    };
    struct kp_batch_builder *b;
    Kprof__V1__Kernels *k;
    Kprof__V1__Ops *o;
    Kprof__V1__Batch *m;

    (void) state;
    assert_int_equal(kp_batch_builder_create(KP_BB_AUTO, rules, 1, &b), 0);
    assert_int_equal(kp_batch_builder_add(b, KP_EV_KERNEL, 2), 0);
    assert_int_equal(kp_batch_builder_add(b, KP_EV_OP, 2), 0);
    k = kp_batch_builder_table(b, KP_EV_KERNEL);
    o = kp_batch_builder_table(b, KP_EV_OP);
    k->start_ns[0] = k->start_ns[1] = 50;
    k->dur_ns[1] = 7;
    k->blocks_per_sm[0] = k->blocks_per_sm[1] = NAN;
    k->est_occupancy[0] = NAN;
    k->est_occupancy[1] = 12.5;
    o->start_ns[0] = o->start_ns[1] = 60;
    o->seq[0] = o->seq[1] = -1;
    o->device[1] = -1; /* its none is 0 here: -1 is a value */
    m = kp_batch_builder_finish(b, 0, NULL);
    assert_int_equal(k->n_dur_ns, 2);
    assert_int_equal(k->n_name, 0);
    assert_int_equal(k->n_est_occupancy, 2);
    assert_int_equal(k->n_blocks_per_sm, 2); /* all NaN, but its side partner has a value */
    assert_int_equal(o->n_seq, 0);
    assert_int_equal(o->n_device, 2);
    assert_int_equal(o->n_dur_ns, 0);
    assert_ptr_equal(m->ops, o);
    kp_batch_builder_destroy(b);
}

static void test_strings(void **state)
{
    struct kp_batch_builder *b;
    Kprof__V1__Batch *m;
    char text[] = "borrowed";
    const char *cut = "copied-not-all-of-this";

    (void) state;
    assert_int_equal(kp_batch_builder_create(KP_BB_ALWAYS, NULL, 0, &b), 0);
    assert_int_equal(kp_batch_builder_intern(b, "", 0), 0);
    assert_int_equal(kp_batch_builder_intern(b, "gemm", 4), 1);
    assert_int_equal(kp_batch_builder_string(b, text, strlen(text)), 2);
    assert_int_equal(kp_batch_builder_intern(b, "gemmX", 4), 1); /* the same 4 bytes */
    assert_int_equal(kp_batch_builder_string(b, cut, 6), 3);
    assert_int_equal(kp_batch_builder_intern(b, "relu", 4), 4);
    assert_int_equal(kp_batch_builder_strings(b), 5);
    assert_int_equal(kp_batch_builder_string_bytes(b), 5 + 7 + 5);
    for (int i = 0; i < 3000; i++) { /* the hash and the table grow */
        char s[16];
        int n = snprintf(s, sizeof(s), "n%d", i);

        assert_int_equal(kp_batch_builder_intern(b, s, (size_t) n), 5 + i);
    }
    assert_int_equal(kp_batch_builder_intern(b, "relu", 4), 4);
    m = kp_batch_builder_finish(b, 0, NULL);
    assert_int_equal(m->n_strings, 3005);
    assert_string_equal(m->strings[1], "gemm");
    assert_ptr_equal(m->strings[2], text);
    assert_string_equal(m->strings[3], "copied");
    assert_string_equal(m->strings[4], "relu");
    assert_string_equal(m->strings[3004], "n2999");
    kp_batch_builder_next(b);
    m = kp_batch_builder_finish(b, 0, NULL);
    assert_int_equal(m->n_strings, 1);
    kp_batch_builder_next(b);
    assert_int_equal(kp_batch_builder_intern(b, "relu", 4), 1); /* once per batch */
    kp_batch_builder_destroy(b);
}

/* A batch of the first rows only: the others move to the front for the next one. */
static void test_upto_and_next(void **state)
{
    struct kp_batch_builder *b;
    Kprof__V1__Steps *st;
    Kprof__V1__Batch *m;
    size_t upto[KP_EV_COUNT] = { 0 };

    (void) state;
    assert_int_equal(kp_batch_builder_create(KP_BB_ALWAYS, NULL, 0, &b), 0);
    assert_int_equal(kp_batch_builder_add(b, KP_EV_STEP, 5), 0);
    assert_int_equal(kp_batch_builder_add(b, KP_EV_API, 1), 0);
    st = kp_batch_builder_table(b, KP_EV_STEP);
    for (int i = 0; i < 5; i++) {
        st->step[i] = i;
        st->start_ns[i] = 100 * (i + 1);
        st->dur_ns[i] = 100;
    }
    upto[KP_EV_STEP] = 2;
    m = kp_batch_builder_finish(b, 100, upto);
    assert_int_equal(st->n_step, 2);
    assert_int_equal(st->start_ns[1], 100);
    assert_null(m->api_calls); /* none of its rows in this batch */
    kp_batch_builder_next(b);
    assert_int_equal(kp_batch_builder_rows(b, KP_EV_STEP), 3);
    assert_int_equal(kp_batch_builder_rows(b, KP_EV_API), 1);
    assert_int_equal(kp_batch_builder_total(b), 4);
    assert_int_equal(st->step[0], 2);
    assert_int_equal(st->start_ns[0], 300); /* still absolute */
    kp_batch_builder_truncate(b, KP_EV_STEP, 1);
    assert_int_equal(kp_batch_builder_total(b), 2);
    m = kp_batch_builder_finish(b, 250, NULL);
    assert_int_equal(st->n_step, 1);
    assert_int_equal(st->start_ns[0], 50);
    assert_non_null(m->api_calls);
    kp_batch_builder_next(b);
    assert_int_equal(kp_batch_builder_total(b), 0);
    /* without a finish, next drops every row */
    assert_int_equal(kp_batch_builder_add(b, KP_EV_STEP, 4), 0);
    kp_batch_builder_next(b);
    assert_int_equal(kp_batch_builder_total(b), 0);
    kp_batch_builder_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_names_a_column),  cmocka_unit_test(test_always_never_and_starts),
        cmocka_unit_test(test_auto_and_side_values), cmocka_unit_test(test_strings),
        cmocka_unit_test(test_upto_and_next),
    };

    return cmocka_run_group_tests_name("batch_builder", tests, NULL, NULL);
}
