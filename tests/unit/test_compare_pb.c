/*
 * kp_compare_pb (analyzer/compare_pb.h): a comparison and an HTA call go through Analyzer.Compare's
 * reply (packed and unpacked, as on the wire) and come back printing the very same JSON with
 * compare.h's writers, NaN (null) and "no last rank" included, with the per-step step times
 * (CompareRank.step_time_ns) of the cells; a reply whose straggler
 * evidence is malformed is refused with -EPROTO.
 */
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

#include "compare.h"
#include "compare_pb.h"

/* A result as kp_compare_result_create makes them: 3 ranks, 2 steps, 2 stragglers. */
static struct kp_compare_result *sample(void)
{
    struct kp_compare_result *r = calloc(1, sizeof(*r));

    assert_non_null(r);
    r->run = 17;
    r->n_ranks = 3;
    r->ranks = calloc(3, sizeof(*r->ranks));
    r->n_steps = 2;
    r->steps = calloc(2, sizeof(*r->steps));
    r->n_stragglers = 2;
    r->stragglers = calloc(2, sizeof(*r->stragglers));
    assert_true(r->ranks && r->steps && r->stragglers);
    for (int i = 0; i < 3; i++) {
        struct kp_compare_rank *k = &r->ranks[i];

        k->rank = i * 2;
        k->clock_offset_ns = i == 0 ? 0 : -30000000LL + i;
        k->has_offset = i != 1;
        k->step_ns = 21587000.0 + 1234.567 * i;
        k->coll_ns = 1.0 / 3.0 * 1e7 * (i + 1);
        k->late_ns = i == 2 ? 11434123.25 : 0.1;
        k->compute_ns = 15861000.5;
        k->host_ns = 1603000.0 + i;
        k->launch_ns = 1203000.0;
        k->other_ns = i == 1 ? NAN : 363000.0;
        k->vs_median = 0.001 * (i - 1);
        k->n_late_steps = (size_t) i;
        k->straggler = i == 2;
        k->waits = i == 0;
        k->late = i == 1;
        snprintf(k->host, sizeof(k->host), "%s", i == 0 ? "" : i == 1 ? "node-a" : "node-\"b\"");
        k->node = i - 1;
        k->local_rank = i == 0 ? -1 : i;
        k->offset_spread_ns = 1234.5 * i;
        k->offset_n = (size_t) (20 * i);
    }
    /* the lateness map: rank 2 lacks step 41 */
    r->cells = calloc(6, sizeof(*r->cells));
    assert_non_null(r->cells);
    for (int c = 0; c < 6; c++) {
        r->cells[c].present = c != 5;
        r->cells[c].late_ns = c == 4 ? 7.25e6 : 1000.0 / 3.0 * c;
        r->cells[c].step_ns = 21500000 + 1000 * c;
    }
    for (int j = 0; j < 2; j++) {
        struct kp_compare_step *s = &r->steps[j];

        s->step = 40 + j;
        s->n_ranks = 3;
        s->n_coll = 12;
        s->step_median_ns = 21.5e6;
        s->step_max_ns = 21.6e6;
        s->step_ratio = j == 0 ? NAN : 1.0046511627906976;
        s->coll_median_ns = 12.8e6;
        s->coll_max_ns = 12.9e6;
        s->coll_ratio = 1.0078125;
        s->last_rank = j == 0 ? -1 : 4;
        s->hta_rank = j == 0 ? 2 : -1;
    }
    for (int i = 0; i < 2; i++) {
        struct kp_compare_straggler *s = &r->stragglers[i];

        s->rank = 4 - 4 * i;
        s->n_steps = i == 0 ? 2 : 0;
        s->steps = calloc(2, sizeof(*s->steps));
        assert_non_null(s->steps);
        s->steps[0] = 40;
        s->steps[1] = 41;
        s->late_ns = 11434123.25 / (i + 1);
        s->max_late_ns = 3.9e6;
        s->cause = i == 0 ? KP_COMPARE_HOST : KP_COMPARE_LAUNCH;
        for (int c = 0; c < KP_COMPARE_CAUSE_COUNT; c++) {
            s->own_ns[c] = 4.773e6 + c;
            s->excess_ns[c] = 3.17e6 / (c + 1);
        }
    }
    r->step_median_ns = 21587000.0;
    r->world_size = 8;
    r->n_missing = 5;
    r->missing = calloc(5, sizeof(*r->missing));
    assert_non_null(r->missing);
    for (int i = 0; i < 5; i++) {
        static const int missing[5] = { 1, 3, 5, 6, 7 };

        r->missing[i] = missing[i];
    }
    r->waited_for = 4;
    r->hta_rank = 2;
    r->hta_rank_steps = 1;
    r->n_groups = 24;
    r->n_p2p = 3;
    r->n_offset_colls = 20;
    r->n_no_offset = 1;
    snprintf(r->verdict, sizeof(r->verdict),
             "rank 4 is a straggler: it arrives late \"quoted\"\tand tabbed");
    return r;
}

static char *json_of(const struct kp_compare_result *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    assert_non_null(f);
    kp_compare_json(f, r);
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* Packs p's reply and unpacks it, as the wire does. */
static Kprof__V1__CompareResponse *wire(const struct kp_compare_pb *p)
{
    size_t n = protobuf_c_message_get_packed_size(&p->msg.base);
    uint8_t *b = malloc(n ? n : 1);
    Kprof__V1__CompareResponse *m;

    assert_non_null(b);
    assert_int_equal(protobuf_c_message_pack(&p->msg.base, b), n);
    m = kprof__v1__compare_response__unpack(NULL, n, b);
    free(b);
    assert_non_null(m);
    return m;
}

static void test_round_trip(void **state)
{
    struct kp_compare_result *r = sample(), *back = NULL;
    Kprof__V1__CompareResponse *m;
    struct kp_compare_pb p;
    char err[256], *a, *b;

    (void) state;
    assert_int_equal(kp_compare_pb_init(&p, r), 0);
    m = wire(&p);
    kp_compare_pb_fini(&p);
    assert_int_equal(m->n_ranks, 3);
    assert_int_equal(m->stragglers[0]->cause, KPROF__V1__COMPARE_CAUSE__COMPARE_CAUSE_HOST);
    assert_int_equal(m->stragglers[0]->n_evidence, KP_COMPARE_CAUSE_COUNT);
    assert_true(m->stragglers[0]->evidence[1]->median_ns == 4.773e6 + 1 - 3.17e6 / 2);
    /* the step-time map: per rank, per step, NaN where the rank lacks the step */
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(m->ranks[i]->n_step_time_ns, 2);
        for (size_t j = 0; j < 2; j++) {
            size_t c = i * 2 + j;

            if (c == 5) {
                assert_true(isnan(m->ranks[i]->step_time_ns[j]));
            }
            else {
                assert_true(m->ranks[i]->step_time_ns[j] == 21500000.0 + 1000.0 * (double) c);
            }
        }
    }
    assert_int_equal(kp_compare_from_pb(m, &back, err, sizeof(err)), 0);
    for (size_t c = 0; c < 5; c++) {
        assert_int_equal(back->cells[c].step_ns, r->cells[c].step_ns);
    }
    a = json_of(r);
    b = json_of(back);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "\"step_ratio\": null"));
    assert_non_null(strstr(a, "\"last_rank\": null"));
    /* the world, the lateness map, HTA's pick, the next commands */
    assert_non_null(strstr(a, "\"world_size\": 8, \"missing_ranks\": [1, 3, 5, 6, 7]"));
    assert_non_null(strstr(a, "\"late_us_by_step\": [7250, null]"));
    assert_non_null(strstr(a, "\"host\": \"node-\\\"b\\\"\", \"node\": 1, \"local_rank\": 2"));
    assert_non_null(strstr(a, "\"node\": null, \"local_rank\": null"));
    assert_non_null(strstr(a, "\"hta_rank\": 2, \"hta_rank_steps\": 1, \"collectives\": 24, "
                              "\"p2p_collectives\": 3"));
    assert_non_null(strstr(a, "\"kprofctl breakdown --run 17 --rank 4\""));
    assert_non_null(strstr(a, "\"flag\": \"late\""));
    /* strings go through kp_json.h: quotes escaped, a tab in its short form */
    assert_non_null(strstr(a, "it arrives late \\\"quoted\\\"\\tand tabbed\""));
    {
        char buf[64];

        assert_int_equal(kp_compare_ranges(buf, sizeof(buf), back->missing, back->n_missing), 0);
        assert_string_equal(buf, "1, 3, 5..7");
    }
    for (size_t i = 0; i < r->n_ranks; i++) {
        assert_int_equal(back->ranks[i].has_offset, r->ranks[i].has_offset);
    }
    free(a);
    free(b);
    kp_compare_result_destroy(back);
    kprof__v1__compare_response__free_unpacked(m, NULL);
    kp_compare_result_destroy(r);
}

static void test_empty(void **state)
{
    struct kp_compare_result *r = calloc(1, sizeof(*r)), *back = NULL;
    Kprof__V1__CompareResponse *m;
    struct kp_compare_pb p;
    char err[256], *a, *b;

    (void) state;
    assert_non_null(r);
    r->run = 3;
    assert_int_equal(kp_compare_pb_init(&p, r), 0);
    m = wire(&p);
    kp_compare_pb_fini(&p);
    assert_int_equal(kp_compare_from_pb(m, &back, err, sizeof(err)), 0);
    a = json_of(r);
    b = json_of(back);
    assert_string_equal(a, b);
    free(a);
    free(b);
    kp_compare_result_destroy(back);
    kprof__v1__compare_response__free_unpacked(m, NULL);
    kp_compare_result_destroy(r);
}

static void test_malformed_evidence(void **state)
{
    struct kp_compare_result *r = sample(), *back = NULL;
    struct kp_compare_pb p;
    char err[256];

    (void) state;
    assert_int_equal(kp_compare_pb_init(&p, r), 0);
    p.msg.stragglers[1]->n_evidence = 2; /* launch, its cause, has no figures */
    assert_int_equal(kp_compare_from_pb(&p.msg, &back, err, sizeof(err)), -EPROTO);
    assert_null(back);
    assert_non_null(strstr(err, "rank 0"));
    p.msg.stragglers[1]->n_evidence = KP_COMPARE_CAUSE_COUNT;
    p.msg.stragglers[0]->cause = (Kprof__V1__CompareCause) 9;
    assert_int_equal(kp_compare_from_pb(&p.msg, &back, err, sizeof(err)), -EPROTO);
    p.msg.stragglers[0]->cause = KPROF__V1__COMPARE_CAUSE__COMPARE_CAUSE_UNSPECIFIED;
    assert_int_equal(kp_compare_from_pb(&p.msg, &back, err, sizeof(err)), -EPROTO);
    assert_null(back);
    kp_compare_pb_fini(&p);
    kp_compare_result_destroy(r);
}

static void test_hta(void **state)
{
    struct kp_compare_hta *h = calloc(1, sizeof(*h)), *back = NULL;
    Kprof__V1__CompareResponse *m;
    struct kp_compare_pb p;
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    FILE *f;

    (void) state;
    assert_non_null(h);
    h->collective = strdup("ncclKernel_SendRecv(ncclDevComm*, \"x\")");
    h->stream = 84;
    h->mean_step_ns = 608096000.0;
    h->n_rows = 2;
    h->rows = calloc(2, sizeof(*h->rows));
    h->n_stragglers = 2;
    h->stragglers = calloc(2, sizeof(*h->stragglers));
    assert_true(h->collective && h->rows && h->stragglers);
    h->rows[0] = (struct kp_compare_hta_row){
        0, 551, 269204000, 47652000, 0.44269983686786296, 0.078362626953638895
    };
    h->rows[1] = (struct kp_compare_hta_row){ 1, 551, 433395000, 17614000, 0.712708190811977, NAN };
    h->stragglers[0] = 1;
    h->stragglers[1] = 0;
    snprintf(h->note, sizeof(h->note), "a \"note\"");
    assert_int_equal(kp_compare_pb_init_hta(&p, h, 2), 0);
    m = wire(&p);
    kp_compare_pb_fini(&p);
    assert_non_null(m->hta);
    assert_int_equal(m->n_ranks, 0);
    assert_int_equal(m->hta->num_candidates, 2);
    assert_int_equal(kp_compare_hta_from_pb(m->hta, &back), 0);
    f = open_memstream(&a, &la);
    kp_compare_hta_json(f, h);
    fclose(f);
    f = open_memstream(&b, &lb);
    kp_compare_hta_json(f, back);
    fclose(f);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "\"note\": \"a \\\"note\\\"\""));
    free(a);
    free(b);
    kp_compare_hta_destroy(back);
    kprof__v1__compare_response__free_unpacked(m, NULL);
    kp_compare_hta_destroy(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_malformed_evidence),
        cmocka_unit_test(test_hta),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
