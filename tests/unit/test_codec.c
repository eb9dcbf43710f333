/* Unit tests of the batch codec (common/kp_codec.c): the spec table against the proto, the
 * validator's refusals, and the exact COPY text. No PostgreSQL. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

#define BASE_NS 1000000LL

static const struct kp_batch_limits limits = {
    .max_name_bytes = KP_CODEC_DEFAULT_MAX_NAME_BYTES,
    .max_strings = KP_CODEC_DEFAULT_MAX_STRINGS,
    .max_rows = KP_CODEC_DEFAULT_MAX_ROWS,
};

/* A small valid batch in static storage that each test copies and breaks one way. */
struct fixture {
    Kprof__V1__Batch b;
    Kprof__V1__Kernels k;
    Kprof__V1__Counters c;
    Kprof__V1__Steps st;
    Kprof__V1__RankInfo ri;
    char *strings[3];
    int64_t k_start[2];
    uint64_t k_dur[2];
    uint32_t k_name[2];
    uint64_t k_corr[2];
    uint32_t k_device[2];
    uint32_t c_metric[4];
    double c_value[4];
    int64_t st_step[2];
    int64_t st_start[2];
    uint64_t st_dur[2];
};

static void fixture_init(struct fixture *f)
{
    memset(f, 0, sizeof(*f));
    kprof__v1__batch__init(&f->b);
    kprof__v1__kernels__init(&f->k);
    kprof__v1__counters__init(&f->c);
    kprof__v1__steps__init(&f->st);
    kprof__v1__rank_info__init(&f->ri);
    f->strings[0] = "";
    f->strings[1] = "sgemm_128x64";
    f->strings[2] = "sm__inst_executed.sum";
    f->b.run_id = 7;
    f->b.rank = 3;
    f->b.stream = 1;
    f->b.seq = 0;
    f->b.base_ns = BASE_NS;
    f->b.n_strings = 3;
    f->b.strings = f->strings;

    f->k_start[0] = 1000; /* delta-encoded: 1001000, then 1001005 */
    f->k_start[1] = 5;
    f->k_dur[0] = 10;
    f->k_dur[1] = 20;
    f->k_name[0] = 1;
    f->k_name[1] = 0; /* no name: NULL */
    f->k_corr[0] = 77;
    f->k_corr[1] = 78;
    f->k_device[0] = 0;
    f->k_device[1] = 1;
    f->k.n_start_ns = 2;
    f->k.start_ns = f->k_start;
    f->k.n_dur_ns = 2;
    f->k.dur_ns = f->k_dur;
    f->k.n_name = 2;
    f->k.name = f->k_name;
    f->k.n_correlation = 2;
    f->k.correlation = f->k_corr;
    f->b.kernels = &f->k;

    for (int i = 0; i < 4; i++) {
        f->c_metric[i] = 2;
    }
    f->c_value[0] = NAN;
    f->c_value[1] = INFINITY;
    f->c_value[2] = -INFINITY;
    f->c_value[3] = 0.25;
    f->c.n_metric = 4;
    f->c.metric = f->c_metric;
    f->c.n_value = 4;
    f->c.value = f->c_value;
    f->b.counters = &f->c;

    f->st_step[0] = 1;
    f->st_step[1] = 2;
    f->st_start[0] = 100; /* 1000100, then 1000050: deltas may be negative */
    f->st_start[1] = -50;
    f->st_dur[0] = 5;
    f->st_dur[1] = 6;
    f->st.n_step = 2;
    f->st.step = f->st_step;
    f->st.n_start_ns = 2;
    f->st.start_ns = f->st_start;
    f->st.n_dur_ns = 2;
    f->st.dur_ns = f->st_dur;
    f->b.steps = &f->st;
}

static void test_selfcheck(void **state)
{
    char err[256] = "";

    assert_int_equal(kp_codec_selfcheck(err, sizeof(err)), 0);
    assert_string_equal(err, "");
    /* Every kind's first column is its row count. */
    for (int k = 0; k < KP_EV_COUNT; k++) {
        assert_true(kp_event_kinds[k].columns[0].required);
        assert_non_null(kp_codec_field((enum kp_event_kind) k, 0));
    }
}

static void test_valid_batch(void **state)
{
    struct fixture f;
    char err[256] = "";

    fixture_init(&f);
    assert_int_equal(kp_batch_validate(&f.b, &limits, err, sizeof(err)), 0);
    assert_int_equal(kp_batch_rows(&f.b, KP_EV_KERNEL), 2);
    assert_int_equal(kp_batch_rows(&f.b, KP_EV_COUNTER), 4);
    assert_int_equal(kp_batch_rows(&f.b, KP_EV_STEP), 2);
    assert_int_equal(kp_batch_rows(&f.b, KP_EV_MEMCPY), 0);
    assert_int_equal(kp_batch_total_rows(&f.b), 8);
}

/* Each case breaks the fixture one way; the refusal must name what is wrong. */
enum breakage {
    BREAK_LENGTH,
    BREAK_NAME_INDEX,
    BREAK_UTF8,
    BREAK_LONG_NAME,
    BREAK_SMALLINT,
    BREAK_TS_OVERFLOW,
    BREAK_RUN_ID,
    BREAK_UINT64,
    BREAK_REQUIRED_NAME,
    BREAK_RANK_DEVICE,
    BREAK_REQUIRED_MISSING,
    BREAK_PROFILER_NEGATIVE,
    BREAK_PROFILER_REVERSED,
};

struct bad_case {
    enum breakage what;
    int rc;
    const char *needle; /* must appear in the message */
};

static const struct bad_case bad_cases[] = {
    { BREAK_LENGTH, KP_EPROTO, "kernels.dur_ns" },
    { BREAK_NAME_INDEX, KP_EPROTO, "kernels.name[1]" },
    { BREAK_UTF8, KP_EPROTO, "strings[1]" },
    { BREAK_LONG_NAME, KP_ETOOBIG, "strings[1]" },
    { BREAK_SMALLINT, KP_EPROTO, "kernels.device[1]" },
    { BREAK_TS_OVERFLOW, KP_EPROTO, "kernels.start_ns" },
    { BREAK_RUN_ID, KP_EPROTO, "run_id" },
    { BREAK_UINT64, KP_EPROTO, "kernels.correlation[0]" },
    { BREAK_REQUIRED_NAME, KP_EPROTO, "counters.metric[3]" },
    { BREAK_RANK_DEVICE, KP_EPROTO, "rank_info" },
    { BREAK_REQUIRED_MISSING, KP_EPROTO, "counters.value" },
    { BREAK_PROFILER_NEGATIVE, KP_EPROTO, "profiler span [-5, 10]" },
    { BREAK_PROFILER_REVERSED, KP_EPROTO, "profiler span [20, 10]" },
};

static void test_validate_refuses(void **state)
{
    static char long_name[KP_CODEC_DEFAULT_MAX_NAME_BYTES + 2];

    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const struct bad_case *bc = &bad_cases[i];
        struct fixture f;
        char err[256] = "";
        int rc;

        fixture_init(&f);
        switch (bc->what) {
        case BREAK_LENGTH:
            f.k.n_dur_ns = 1;
            break;
        case BREAK_NAME_INDEX:
            f.k_name[1] = 3;
            break;
        case BREAK_UTF8:
            f.strings[1] = "bad \xc3\x28 utf8";
            break;
        case BREAK_LONG_NAME:
            memset(long_name, 'x', sizeof(long_name) - 1);
            f.strings[1] = long_name;
            break;
        case BREAK_SMALLINT:
            f.k.n_device = 2;
            f.k.device = f.k_device;
            f.k_device[1] = 40000;
            break;
        case BREAK_TS_OVERFLOW:
            f.b.base_ns = INT64_MAX - 500;
            break;
        case BREAK_RUN_ID:
            f.b.run_id = 0;
            break;
        case BREAK_UINT64:
            f.k_corr[0] = UINT64_MAX;
            break;
        case BREAK_REQUIRED_NAME:
            f.c_metric[3] = 0;
            break;
        case BREAK_RANK_DEVICE:
            f.ri.device = 70000;
            f.b.rank_info = &f.ri;
            break;
        case BREAK_REQUIRED_MISSING:
            f.c.n_value = 0;
            break;
        case BREAK_PROFILER_NEGATIVE:
            f.ri.profiler_start_ns = -5;
            f.ri.profiler_end_ns = 10;
            f.b.rank_info = &f.ri;
            break;
        case BREAK_PROFILER_REVERSED:
            f.ri.profiler_start_ns = 20;
            f.ri.profiler_end_ns = 10;
            f.b.rank_info = &f.ri;
            break;
        }
        rc = kp_batch_validate(&f.b, &limits, err, sizeof(err));
        if (rc != bc->rc || strstr(err, bc->needle) == NULL) {
            fail_msg("case %zu: rc=%d (want %d) err=\"%s\" (want it to name %s)", i, rc, bc->rc,
                     err, bc->needle);
        }
    }
}

static void test_utf8(void **state)
{
    assert_true(kp_utf8_valid("", 0));
    assert_true(kp_utf8_valid("aten::addmm", 11));
    assert_true(kp_utf8_valid("\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80", 9)); /* ü € 😀 */
    assert_false(kp_utf8_valid("a\0b", 3));                                /* NUL */
    assert_false(kp_utf8_valid("\xc0\xaf", 2));                            /* overlong */
    assert_false(kp_utf8_valid("\xed\xa0\x80", 3));                        /* surrogate */
    assert_false(kp_utf8_valid("\xf4\x90\x80\x80", 4));                    /* > U+10FFFF */
    assert_false(kp_utf8_valid("\xe2\x82", 2));                            /* truncated */
    /* Every position of a 24-byte name, so that the eight-byte ASCII stride meets a NUL, a
     * stray continuation byte, a valid sequence and a truncated one wherever they fall. */
    for (size_t at = 0; at < 24; at++) {
        char b[32];

        memset(b, 'a', sizeof(b));
        b[at] = '\0';
        assert_false(kp_utf8_valid(b, 24));
        b[at] = (char) 0x80;
        assert_false(kp_utf8_valid(b, 24));
        if (at + 2 <= 24) {
            memcpy(b + at, "\xc3\xbc", 2);
            assert_true(kp_utf8_valid(b, 24));
        }
        memcpy(b, "aaaaaaaaaaaaaaaaaaaaaaaa", 24);
        b[23] = (char) 0xe2;
        assert_false(kp_utf8_valid(b + (at < 23 ? at : 0), 24 - (at < 23 ? at : 0)));
        assert_true(kp_utf8_valid(b, at < 23 ? at : 23));
    }
}

static void test_copy_text(void **state)
{
    struct fixture f;
    struct kp_strbuf sb;
    int32_t name_ids[3] = { 0, 42, 43 };
    char cols[512];
    const char *want_kernels =
        "7\t3\t1001000\t10\t42\t\\N\t\\N\t\\N\t77\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N"
        "\t\\N\t\\N\t\\N\t\\N\n"
        "7\t3\t1001005\t20\t\\N\t\\N\t\\N\t\\N\t78\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N"
        "\t\\N\t\\N\t\\N\t\\N\n";
    const char *want_counters = "7\t3\t43\t\\N\tNaN\t\\N\n"
                                "7\t3\t43\t\\N\tInfinity\t\\N\n"
                                "7\t3\t43\t\\N\t-Infinity\t\\N\n"
                                "7\t3\t43\t\\N\t0.25\t\\N\n";
    const char *want_steps = "7\t3\t1000100\t1\t5\n"
                             "7\t3\t1000050\t2\t6\n";

    fixture_init(&f);
    kp_strbuf_init(&sb, 0);

    assert_int_equal(kp_codec_copy_text(&f.b, KP_EV_KERNEL, name_ids, &sb), 2);
    assert_non_null(sb.data);
    assert_int_equal(sb.len, strlen(want_kernels));
    assert_memory_equal(sb.data, want_kernels, sb.len);

    kp_strbuf_reset(&sb);
    assert_int_equal(kp_codec_copy_text(&f.b, KP_EV_COUNTER, name_ids, &sb), 4);
    assert_int_equal(sb.len, strlen(want_counters));
    assert_memory_equal(sb.data, want_counters, sb.len);

    /* Appends: a second kind goes after what is there. */
    assert_int_equal(kp_codec_copy_text(&f.b, KP_EV_STEP, name_ids, &sb), 2);
    assert_int_equal(sb.len, strlen(want_counters) + strlen(want_steps));
    assert_memory_equal(sb.data + strlen(want_counters), want_steps, strlen(want_steps));

    /* A kind the batch lacks writes nothing. */
    kp_strbuf_reset(&sb);
    assert_int_equal(kp_codec_copy_text(&f.b, KP_EV_MEMCPY, name_ids, &sb), 0);
    assert_int_equal(sb.len, 0);

    assert_string_equal(kp_codec_copy_columns(KP_EV_STEP, cols, sizeof(cols)),
                        "run_id, rank, start_ns, step, dur_ns");
    assert_string_equal(kp_codec_copy_columns(KP_EV_COUNTER, cols, sizeof(cols)),
                        "run_id, rank, metric, correlation, value, device");
    kp_strbuf_fini(&sb);
}

/* Kernels' occupancy figures go to kernel_occupancy, one row per kernel that has one (not
 * NaN), keyed by start_ns, device, stream and correlation (0 when the batch lacks them); the
 * kernels COPY never carries them. */
static void test_side_table(void **state)
{
    struct fixture f;
    struct kp_strbuf sb, main_rows;
    int32_t name_ids[3] = { 0, 42, 43 };
    double bps[2] = { NAN, 2.5 }, occ[2] = { 12.0, NAN };
    char cols[512], err[256] = "";
    const char *one = "7\t3\t1001005\t0\t0\t78\t2.5\tNaN\n";
    const char *two = "7\t3\t1001000\t0\t0\t77\tNaN\t12\n"
                      "7\t3\t1001005\t0\t0\t78\t2.5\tNaN\n";

    fixture_init(&f);
    kp_strbuf_init(&sb, 0);
    kp_strbuf_init(&main_rows, 0);
    assert_int_equal(kp_codec_selfcheck(err, sizeof(err)), 0);
    assert_string_equal(kp_codec_side_columns(KP_EV_KERNEL, cols, sizeof(cols)),
                        "run_id, rank, start_ns, device, stream, correlation, blocks_per_sm, "
                        "est_occupancy");
    assert_non_null(strstr(kp_codec_copy_columns(KP_EV_KERNEL, cols, sizeof(cols)), "step"));
    assert_null(strstr(cols, "blocks_per_sm"));
    assert_null(strstr(cols, "est_occupancy"));
    assert_string_equal(kp_codec_side_columns(KP_EV_API, cols, sizeof(cols)), "");
    assert_int_equal(kp_codec_side_copy_text(&f.b, KP_EV_MEMCPY, &sb), 0);

    /* Without figures: no side rows. */
    assert_int_equal(kp_batch_side_rows(&f.b, KP_EV_KERNEL), 0);
    assert_int_equal(kp_codec_side_copy_text(&f.b, KP_EV_KERNEL, &sb), 0);
    assert_int_equal(sb.len, 0);
    assert_int_equal(kp_codec_copy_text(&f.b, KP_EV_KERNEL, name_ids, &main_rows), 2);

    /* All NaN: still none. */
    bps[1] = NAN;
    f.k.n_blocks_per_sm = 2;
    f.k.blocks_per_sm = bps;
    assert_int_equal(kp_batch_validate(&f.b, &limits, err, sizeof(err)), 0);
    assert_int_equal(kp_batch_side_rows(&f.b, KP_EV_KERNEL), 0);
    assert_int_equal(kp_codec_side_copy_text(&f.b, KP_EV_KERNEL, &sb), 0);

    /* One figure on the second kernel: its row, the missing figure NaN. */
    bps[1] = 2.5;
    assert_int_equal(kp_batch_side_rows(&f.b, KP_EV_KERNEL), 1);
    assert_int_equal(kp_codec_side_copy_text(&f.b, KP_EV_KERNEL, &sb), 1);
    assert_int_equal(sb.len, strlen(one));
    assert_memory_equal(sb.data, one, sb.len);

    /* Both kernels, one figure each; the kernels rows are as without figures. */
    kp_strbuf_reset(&sb);
    f.k.n_est_occupancy = 2;
    f.k.est_occupancy = occ;
    assert_int_equal(kp_batch_validate(&f.b, &limits, err, sizeof(err)), 0);
    assert_int_equal(kp_batch_side_rows(&f.b, KP_EV_KERNEL), 2);
    assert_int_equal(kp_codec_side_copy_text(&f.b, KP_EV_KERNEL, &sb), 2);
    assert_int_equal(sb.len, strlen(two));
    assert_memory_equal(sb.data, two, sb.len);
    kp_strbuf_reset(&sb);
    assert_int_equal(kp_codec_copy_text(&f.b, KP_EV_KERNEL, name_ids, &sb), 2);
    assert_int_equal(sb.len, main_rows.len);
    assert_memory_equal(sb.data, main_rows.data, sb.len);
    kp_strbuf_fini(&sb);
    kp_strbuf_fini(&main_rows);
}

/* Memcpys' and memsets' "memory bandwidth (GB/s)" go to memcpy_bandwidth/memset_bandwidth
 * (migration 0010), one row per event with a figure, every digit kept (HTA's §11 sums them);
 * the memcpys/memsets COPY never carries it, and a batch without it (a capture) has no rows. */
static void test_bandwidth_side_tables(void **state)
{
    Kprof__V1__Batch b = KPROF__V1__BATCH__INIT;
    Kprof__V1__Memcpys m = KPROF__V1__MEMCPYS__INIT;
    Kprof__V1__Memsets z = KPROF__V1__MEMSETS__INIT;
    int64_t m_start[3] = { 1000, 17, 3 }, z_start[1] = { 50 };
    uint64_t m_dur[3] = { 17000, 5, 1 }, m_bytes[3] = { 16777216, 64, 8 }, z_dur[1] = { 2 };
    uint64_t m_corr[3] = { 41, 42, 43 };
    uint32_t m_stream[3] = { 7, 7, 9 }, m_dev[3] = { 1, 1, 1 };
    double m_bw[3] = { 960.2344322344322, NAN, 0.000969227041434456 }, z_bw[1] = { 24 };
    char cols[512], err[256] = "";
    struct kp_strbuf sb;
    char *strings[1] = { "" };
    const char *rows = "2\t0\t1001000\t1\t7\t41\t960.23443223443223\n"
                       "2\t0\t1001020\t1\t9\t43\t0.00096922704143445604\n";

    (void) state;
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_codec_selfcheck(err, sizeof(err)), 0);
    assert_string_equal(kp_codec_side_columns(KP_EV_MEMCPY, cols, sizeof(cols)),
                        "run_id, rank, start_ns, device, stream, correlation, bandwidth_gbps");
    assert_string_equal(kp_codec_side_columns(KP_EV_MEMSET, cols, sizeof(cols)),
                        "run_id, rank, start_ns, device, stream, correlation, bandwidth_gbps");
    assert_null(strstr(kp_codec_copy_columns(KP_EV_MEMCPY, cols, sizeof(cols)), "bandwidth"));
    assert_null(strstr(kp_codec_copy_columns(KP_EV_MEMSET, cols, sizeof(cols)), "bandwidth"));

    b.run_id = 2;
    b.base_ns = BASE_NS;
    b.n_strings = 1;
    b.strings = strings;
    m.n_start_ns = m.n_dur_ns = m.n_bytes = m.n_correlation = m.n_stream = m.n_device = 3;
    m.start_ns = m_start;
    m.dur_ns = m_dur;
    m.bytes = m_bytes;
    m.correlation = m_corr;
    m.stream = m_stream;
    m.device = m_dev;
    z.n_start_ns = z.n_dur_ns = 1;
    z.start_ns = z_start;
    z.dur_ns = z_dur;
    b.memcpys = &m;
    b.memsets = &z;

    /* A capture: no figures, no rows. */
    assert_int_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), 0);
    assert_int_equal(kp_batch_side_rows(&b, KP_EV_MEMCPY), 0);
    assert_int_equal(kp_codec_side_copy_text(&b, KP_EV_MEMCPY, &sb), 0);
    assert_int_equal(sb.len, 0);

    /* An import: a row per figure, NaN none; the exact double, keys 0 where absent. */
    m.n_bandwidth_gbps = 3;
    m.bandwidth_gbps = m_bw;
    z.n_bandwidth_gbps = 1;
    z.bandwidth_gbps = z_bw;
    assert_int_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), 0);
    assert_int_equal(kp_batch_side_rows(&b, KP_EV_MEMCPY), 2);
    assert_int_equal(kp_codec_side_copy_text(&b, KP_EV_MEMCPY, &sb), 2);
    assert_int_equal(sb.len, strlen(rows));
    assert_memory_equal(sb.data, rows, sb.len);
    assert_true(strtod("960.23443223443223", NULL) == m_bw[0]); /* reads back the same */
    assert_true(strtod("0.00096922704143445604", NULL) == m_bw[2]);
    kp_strbuf_reset(&sb);
    assert_int_equal(kp_batch_side_rows(&b, KP_EV_MEMSET), 1);
    assert_int_equal(kp_codec_side_copy_text(&b, KP_EV_MEMSET, &sb), 1);
    assert_int_equal(sb.len, strlen("2\t0\t1000050\t0\t0\t0\t24\n"));
    assert_memory_equal(sb.data, "2\t0\t1000050\t0\t0\t0\t24\n", sb.len);

    /* A column of the wrong length is refused. */
    m.n_bandwidth_gbps = 2;
    assert_int_not_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "bandwidth_gbps"));
    kp_strbuf_fini(&sb);
}

/* Extreme values are written in full; start_ns deltas accumulate from base_ns. */
static void test_copy_text_extremes(void **state)
{
    struct fixture f;
    struct kp_strbuf sb;
    int32_t name_ids[3] = { 0, 1, 2 };
    char err[256] = "", line0[128], line1[128];

    fixture_init(&f);
    f.b.run_id = INT32_MAX;
    f.b.rank = INT32_MAX;
    f.b.base_ns = INT64_MIN;
    f.st_start[0] = 0;         /* INT64_MIN */
    f.st_start[1] = INT64_MAX; /* INT64_MIN + INT64_MAX = -1 */
    f.st_step[0] = INT64_MIN;
    f.st_step[1] = INT64_MAX;
    f.st_dur[0] = (uint64_t) INT64_MAX;
    f.st_dur[1] = 0;
    f.b.kernels = NULL;
    f.b.counters = NULL;
    assert_int_equal(kp_batch_validate(&f.b, &limits, err, sizeof(err)), 0);
    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_codec_copy_text(&f.b, KP_EV_STEP, name_ids, &sb), 2);
    snprintf(line0, sizeof(line0), "2147483647\t2147483647\t%lld\t%lld\t%lld\n",
             (long long) INT64_MIN, (long long) INT64_MIN, (long long) INT64_MAX);
    snprintf(line1, sizeof(line1), "2147483647\t2147483647\t-1\t%lld\t0\n", (long long) INT64_MAX);
    assert_int_equal(sb.len, strlen(line0) + strlen(line1));
    assert_memory_equal(sb.data, line0, strlen(line0));
    assert_memory_equal(sb.data + strlen(line0), line1, strlen(line1));
    kp_strbuf_fini(&sb);
}

/* The allocator-event kind: its columns, its refusals and its exact COPY text (signed bytes,
 * device -1, a NULL name, absent columns as \N). */
static void test_memory_kind(void **state)
{
    Kprof__V1__Batch b = KPROF__V1__BATCH__INIT;
    Kprof__V1__MemoryEvents me = KPROF__V1__MEMORY_EVENTS__INIT;
    char *strings[] = { "", "[memory]" };
    int64_t start[] = { 10, 5 };
    uint32_t name[] = { 1, 0 };
    int32_t device[] = { 0, -1 };
    uint64_t addr[] = { 0x7f0000000000ULL, 4096 };
    int64_t bytes[] = { 1048576, INT64_MIN };
    uint64_t total[] = { 1048576, 0 };
    uint32_t dtype[] = { 1, 40000 };
    int32_t step[] = { 3, 3 };
    int32_t name_ids[2] = { 0, 99 };
    struct kp_strbuf sb;
    char err[256] = "", cols[512];
    const char *want = "7\t3\t1000010\t99\t\\N\t0\t139637976727552\t1048576\t1048576\t\\N"
                       "\t\\N\t3\n"
                       "7\t3\t1000015\t\\N\t\\N\t-1\t4096\t-9223372036854775808\t0\t\\N"
                       "\t\\N\t3\n";

    assert_string_equal(kp_event_kinds[KP_EV_MEMORY].table, "memory_events");
    assert_string_equal(kp_codec_copy_columns(KP_EV_MEMORY, cols, sizeof(cols)),
                        "run_id, rank, start_ns, name, device_type, device, addr, bytes, "
                        "total_allocated, total_reserved, tid, step");
    b.run_id = 7;
    b.rank = 3;
    b.base_ns = BASE_NS;
    b.n_strings = 2;
    b.strings = strings;
    me.n_start_ns = 2;
    me.start_ns = start;
    me.n_name = 2;
    me.name = name;
    me.n_device = 2;
    me.device = device;
    me.n_addr = 2;
    me.addr = addr;
    me.n_bytes = 2;
    me.bytes = bytes;
    me.n_total_allocated = 2;
    me.total_allocated = total;
    me.n_step = 2;
    me.step = step;
    b.memory = &me;
    assert_int_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), 0);
    assert_int_equal(kp_batch_rows(&b, KP_EV_MEMORY), 2);
    assert_int_equal(kp_batch_total_rows(&b), 2);

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_codec_copy_text(&b, KP_EV_MEMORY, name_ids, &sb), 2);
    assert_int_equal(sb.len, strlen(want));
    assert_memory_equal(sb.data, want, sb.len);
    kp_strbuf_fini(&sb);

    /* device_type is a smallint */
    me.n_device_type = 2;
    me.device_type = dtype;
    assert_int_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), KP_EPROTO);
    assert_non_null(strstr(err, "memory.device_type[1]"));
    me.n_device_type = 0;
    /* an address past INT64_MAX does not fit a bigint */
    addr[1] = UINT64_MAX;
    assert_int_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), KP_EPROTO);
    assert_non_null(strstr(err, "memory.addr[1]"));
    addr[1] = 4096;
    /* every column has 0 or n values */
    me.n_bytes = 1;
    assert_int_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), KP_EPROTO);
    assert_non_null(strstr(err, "memory.bytes"));
    me.n_bytes = 2;
    name[1] = 2;
    assert_int_equal(kp_batch_validate(&b, &limits, err, sizeof(err)), KP_EPROTO);
    assert_non_null(strstr(err, "memory.name[1]"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_selfcheck),
        cmocka_unit_test(test_valid_batch),
        cmocka_unit_test(test_validate_refuses),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_copy_text),
        cmocka_unit_test(test_copy_text_extremes),
        cmocka_unit_test(test_memory_kind),
        cmocka_unit_test(test_side_table),
        cmocka_unit_test(test_bandwidth_side_tables),
    };

    return cmocka_run_group_tests_name("codec", tests, NULL, NULL);
}
