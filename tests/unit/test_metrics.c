/* Unit tests for common/kp_metrics: registration rules, values, Prometheus text rendering. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kp_err.h"
#include "kp_metrics.h"
#include "kp_strbuf.h"

static void test_render_families(void **state)
{
    struct kp_metrics *r = NULL;
    struct kp_metric *ring, *spool, *queued, *up, *odd;
    struct kp_strbuf sb;
    const char *want = "# HELP kprof_agent_records_dropped_total Records dropped, by reason.\n"
                       "# TYPE kprof_agent_records_dropped_total counter\n"
                       "kprof_agent_records_dropped_total{reason=\"ring_full\"} 3\n"
                       "kprof_agent_records_dropped_total{reason=\"spool_full\"} 0\n"
                       "# HELP kprof_agent_queue_bytes Bytes queued.\n"
                       "# TYPE kprof_agent_queue_bytes gauge\n"
                       "kprof_agent_queue_bytes -5\n"
                       "# HELP kprof_up Line one\\nwith a \\\\ backslash.\n"
                       "# TYPE kprof_up gauge\n"
                       "kprof_up 1\n"
                       "kprof_up{path=\"a\\\"b\\\\c\\nd\"} 9223372036854775807\n";

    assert_int_equal(kp_metrics_create(8, &r), 0);
    assert_int_equal(kp_metrics_register(r, "kprof_agent_records_dropped_total",
                                         "Records dropped, by reason.", KP_METRIC_COUNTER, "reason",
                                         "ring_full", &ring),
                     0);
    assert_int_equal(kp_metrics_register(r, "kprof_agent_queue_bytes", "Bytes queued.",
                                         KP_METRIC_GAUGE, NULL, NULL, &queued),
                     0);
    /* A second member of the first family, registered later, renders with it. */
    assert_int_equal(kp_metrics_register(r, "kprof_agent_records_dropped_total",
                                         "Records dropped, by reason.", KP_METRIC_COUNTER, "reason",
                                         "spool_full", &spool),
                     0);
    assert_int_equal(kp_metrics_register(r, "kprof_up", "Line one\nwith a \\ backslash.",
                                         KP_METRIC_GAUGE, NULL, NULL, &up),
                     0);
    assert_int_equal(kp_metrics_register(r, "kprof_up", "Line one\nwith a \\ backslash.",
                                         KP_METRIC_GAUGE, "path", "a\"b\\c\nd", &odd),
                     0);
    kp_metric_add(ring, 2);
    kp_metric_add(ring, 1);
    kp_metric_add(ring, -7); /* counters do not go down */
    kp_metric_add(queued, 10);
    kp_metric_add(queued, -15);
    kp_metric_set(up, 1);
    kp_metric_set(odd, INT64_MAX);
    assert_int_equal(kp_metric_get(ring), 3);
    assert_int_equal(kp_metric_get(spool), 0);
    assert_int_equal(kp_metric_get(queued), -5);

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_metrics_render(r, &sb), 0);
    assert_string_equal(sb.data, want);
    /* Rendering appends. */
    assert_int_equal(kp_metrics_render(r, &sb), 0);
    assert_int_equal(sb.len, 2 * strlen(want));
    kp_strbuf_fini(&sb);
    kp_metrics_destroy(r);
}

struct reg_case {
    const char *name;
    const char *help;
    int type;
    const char *lk, *lv;
    int want;
};

static void test_register_rules(void **state)
{
    static char long_name[KP_METRIC_NAME_MAX + 2];
    static char long_value[KP_METRIC_LABEL_MAX + 2];
    static char long_help[KP_METRIC_HELP_MAX + 2];
    const struct reg_case cases[] = {
        { "ok_total", "h", KP_METRIC_COUNTER, NULL, NULL, 0 },
        { "ok:colon_1", "h", KP_METRIC_GAUGE, NULL, NULL, 0 },
        { "_under", "h", KP_METRIC_GAUGE, "k", "", 0 },
        { "1starts_with_digit", "h", KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        { "has-dash", "h", KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        { "has space", "h", KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        { "", "h", KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        { NULL, "h", KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        { "no_help", NULL, KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        { "bad_type", "h", 7, NULL, NULL, -EINVAL },
        { "half_label", "h", KP_METRIC_GAUGE, "k", NULL, -EINVAL },
        { "half_label", "h", KP_METRIC_GAUGE, NULL, "v", -EINVAL },
        { "bad_label", "h", KP_METRIC_GAUGE, "a:b", "v", -EINVAL },
        { "bad_label", "h", KP_METRIC_GAUGE, "__reserved", "v", -EINVAL },
        { "bad_label", "h", KP_METRIC_GAUGE, "9k", "v", -EINVAL },
        { long_name, "h", KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        { "long_value", "h", KP_METRIC_GAUGE, "k", long_value, -EINVAL },
        { "long_help", long_help, KP_METRIC_GAUGE, NULL, NULL, -EINVAL },
        /* Same family: same type and help, distinct labels. */
        { "ok_total", "h", KP_METRIC_COUNTER, NULL, NULL, -EEXIST },
        { "ok_total", "h", KP_METRIC_COUNTER, "reason", "x", 0 },
        { "ok_total", "h", KP_METRIC_COUNTER, "reason", "x", -EEXIST },
        { "ok_total", "h", KP_METRIC_GAUGE, "reason", "y", -EINVAL },
        { "ok_total", "other help", KP_METRIC_COUNTER, "reason", "y", -EINVAL },
        { "ok_total", "h", KP_METRIC_COUNTER, "reason", "y", 0 },
    };
    struct kp_metrics *r = NULL;
    struct kp_metric *m;

    memset(long_name, 'a', sizeof(long_name) - 1);
    memset(long_value, 'v', sizeof(long_value) - 1);
    memset(long_help, 'h', sizeof(long_help) - 1);
    assert_int_equal(kp_metrics_create(16, &r), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        m = NULL;
        if (kp_metrics_register(r, cases[i].name, cases[i].help,
                                (enum kp_metric_type) cases[i].type, cases[i].lk, cases[i].lv,
                                &m) != cases[i].want) {
            fail_msg("case %zu (%s): want %d", i, cases[i].name ? cases[i].name : "NULL",
                     cases[i].want);
        }
        assert_true((m != NULL) == (cases[i].want == 0));
    }
    kp_metrics_destroy(r);
    kp_metrics_destroy(NULL);
}

static void test_capacity(void **state)
{
    struct kp_metrics *r = NULL;
    struct kp_metric *m[3];
    char name[32];

    assert_int_equal(kp_metrics_create(0, &r), -EINVAL);
    assert_int_equal(kp_metrics_create(3, &r), 0);
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof(name), "m%d", i);
        assert_int_equal(kp_metrics_register(r, name, "h", KP_METRIC_GAUGE, NULL, NULL, &m[i]), 0);
    }
    assert_int_equal(kp_metrics_register(r, "m3", "h", KP_METRIC_GAUGE, NULL, NULL, &m[0]),
                     -ENOSPC);
    /* Metrics stay where they were registered. */
    kp_metric_set(m[2], 42);
    assert_int_equal(kp_metric_get(m[2]), 42);
    kp_metrics_destroy(r);
}

static void test_render_cap(void **state)
{
    struct kp_metrics *r = NULL;
    struct kp_metric *m;
    struct kp_strbuf sb;

    assert_int_equal(kp_metrics_create(1, &r), 0);
    assert_int_equal(
        kp_metrics_register(r, "x_total", "Some help.", KP_METRIC_COUNTER, "k", "v", &m), 0);
    kp_strbuf_init(&sb, 40);
    assert_int_equal(kp_metrics_render(r, &sb), KP_ETOOBIG);
    kp_strbuf_fini(&sb);
    kp_metrics_destroy(r);
}

#define THREADS 4
#define ADDS    200000

static void *adder(void *arg)
{
    struct kp_metric *m = arg;

    for (int i = 0; i < ADDS; i++) {
        kp_metric_add(m, 1);
    }
    return NULL;
}

/* Concurrent adds lose nothing, and rendering while they run is safe. */
static void test_concurrent_adds(void **state)
{
    struct kp_metrics *r = NULL;
    struct kp_metric *m;
    struct kp_strbuf sb;
    pthread_t t[THREADS];

    assert_int_equal(kp_metrics_create(1, &r), 0);
    assert_int_equal(kp_metrics_register(r, "adds_total", "h", KP_METRIC_COUNTER, NULL, NULL, &m),
                     0);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_create(&t[i], NULL, adder, m), 0);
    }
    kp_strbuf_init(&sb, 0);
    for (int i = 0; i < 100; i++) {
        kp_strbuf_reset(&sb);
        assert_int_equal(kp_metrics_render(r, &sb), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
    }
    assert_int_equal(kp_metric_get(m), (int64_t) THREADS * ADDS);
    kp_strbuf_reset(&sb);
    assert_int_equal(kp_metrics_render(r, &sb), 0);
    assert_non_null(strstr(sb.data, "\nadds_total 800000\n"));
    kp_strbuf_fini(&sb);
    kp_metrics_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_families), cmocka_unit_test(test_register_rules),
        cmocka_unit_test(test_capacity),        cmocka_unit_test(test_render_cap),
        cmocka_unit_test(test_concurrent_adds),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
