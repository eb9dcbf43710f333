/* Unit tests of agent/batcher.c: hand-built kp_wire records for a window with warm-up
 * records, steps, GPU records before and after their API record; the emitted Batch columns
 * are checked one by one. Then malformed wire values (out-of-range ids, end < start, huge
 * correlations and steps, undefined strings, times near the int64 limits): each bad record
 * is dropped and counted, the rest of its batch survives, and every batch validates. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batcher.h"
#include "kp_codec.h"
#include "kp_log.h"
#include "kprof.pb-c.h"

#define T0 1700000000000000000LL

static const char *const strs[] = { "",         "volta_sgemm_128x64_nn", "cudaLaunchKernel",
                                    "aten::mm", "[[2, 3], [3, 4]]",      "cudaMemcpyAsync" };

struct sink {
    Kprof__V1__Batch *b[16];
    bool last[16];
    size_t rows[16];
    int n;
    int refuse; /* refuse this many more batches that have rows (a full spool) */
};

static const char *lookup(void *ud, uint32_t id, size_t *len)
{
    (void) ud;
    if (id >= sizeof(strs) / sizeof(strs[0])) {
        return NULL;
    }
    *len = strlen(strs[id]);
    return strs[id];
}

static const struct kp_batch_limits limits = {
    KP_CODEC_DEFAULT_MAX_NAME_BYTES,
    KP_CODEC_DEFAULT_MAX_STRINGS,
    KP_CODEC_DEFAULT_MAX_ROWS,
};

/* Every emitted batch must pass the collector's validation (the batcher checks it too, but
 * it must never even build an invalid one). */
static void assert_valid(const Kprof__V1__Batch *x)
{
    char err[512] = "";
    int rc = kp_batch_validate(x, &limits, err, sizeof(err));

    if (rc != 0) {
        fail_msg("invalid batch: %s", err);
    }
}

static int emit(void *ud, const uint8_t *buf, size_t len, size_t rows, bool last)
{
    struct sink *s = ud;

    if (s->refuse > 0 && rows > 0) {
        s->refuse--;
        return -ENOSPC;
    }
    assert_true(s->n < 16);
    s->b[s->n] = kprof__v1__batch__unpack(NULL, len, buf);
    assert_non_null(s->b[s->n]);
    assert_valid(s->b[s->n]);
    s->last[s->n] = last;
    s->rows[s->n] = rows;
    s->n++;
    return 0;
}

static void sink_free(struct sink *s)
{
    for (int i = 0; i < s->n; i++) {
        kprof__v1__batch__free_unpacked(s->b[i], NULL);
    }
}

static struct kp_batcher *make(struct sink *s, size_t rows, size_t max_pending)
{
    struct kp_batcher_opts o;
    struct kp_batcher *b;

    memset(&o, 0, sizeof(o));
    o.run_id = 42;
    o.rank = 3;
    o.job = "jobA";
    o.host = "node7";
    o.pid = 4242;
    o.local_rank = 1;
    o.world_size = 8;
    o.device = 1;
    o.target_step = 10;
    o.n_steps = 2;
    o.batch_rows = rows;
    o.max_pending = max_pending;
    o.strings = lookup;
    o.emit = emit;
    o.ud = s;
    assert_int_equal(kp_batcher_create(&o, &b), 0);
    return b;
}

static void step(struct kp_batcher *b, int64_t n, int64_t t)
{
    struct kp_wire_step s = { n, T0 + t, KP_STEP_HOOK, 0 };

    kp_batcher_step(b, &s);
}

static void api(struct kp_batcher *b, uint64_t corr, int64_t t, uint64_t ext)
{
    struct kp_wire_api a;

    memset(&a, 0, sizeof(a));
    a.start_ns = T0 + t;
    a.end_ns = T0 + t + 10;
    a.correlation = corr;
    a.external_id = ext;
    a.tid = 777;
    a.domain = 1;
    a.cbid = 211;
    a.name = 2;
    kp_batcher_records(b, KP_REC_API, sizeof(a), &a, 1);
}

static void kernel(struct kp_batcher *b, uint64_t corr, int64_t t)
{
    struct kp_wire_kernel k;

    memset(&k, 0, sizeof(k));
    k.start_ns = T0 + t;
    k.end_ns = T0 + t + 50;
    k.correlation = corr;
    k.name = 1;
    k.device = 1;
    k.stream = 7;
    k.grid_x = 64;
    k.grid_y = k.grid_z = 1;
    k.block_x = 256;
    k.block_y = k.block_z = 1;
    k.registers = 32;
    kp_batcher_records(b, KP_REC_KERNEL, sizeof(k), &k, 1);
}

static void range(struct kp_batcher *b, uint64_t id, int64_t t0, int64_t t1)
{
    struct kp_wire_range r;

    memset(&r, 0, sizeof(r));
    r.start_ns = T0 + t0;
    r.end_ns = T0 + t1;
    r.range_id = id;
    r.parent_id = 5;
    r.tid = 777;
    r.seq = 12;
    r.op_id = 999; /* the op's own id is not stored */
    r.name = 3;
    r.shapes = 4;
    r.kind = 1;
    kp_batcher_records(b, KP_REC_RANGE, sizeof(r), &r, 1);
}

static void window(struct kp_batcher *b, bool end, int64_t t0, int64_t t1)
{
    struct kp_wire_window w;

    memset(&w, 0, sizeof(w));
    w.start_ns = T0 + t0;
    w.end_ns = end ? T0 + t1 : 0;
    w.first_step = 10;
    w.last_step = end ? 11 : -1;
    w.dropped = 3;
    w.cupti_dropped = 1;
    w.overhead_ns = 500;
    if (end) {
        assert_int_equal(kp_batcher_window_end(b, &w), 0);
    }
    else {
        kp_batcher_window_begin(b, &w);
    }
}

static const char *str_at(const Kprof__V1__Batch *b, uint32_t i)
{
    assert_true(i < b->n_strings);
    return b->strings[i];
}

/* The full scenario of the file comment (see the numbered events). */
static void test_window(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 1000, 0);
    struct kp_batcher_stats st;
    struct kp_wire_sync y;
    struct kp_wire_memcpy m;

    (void) state;
    /* warm-up, before WINDOW_BEGIN */
    step(b, 9, 1000);
    api(b, 1, 1100, 0);
    kernel(b, 1, 2050); /* inside by its own time, but launched in warm-up */
    range(b, 60, 1400, 1500);
    step(b, 10, 2000);
    window(b, false, 2000, 0);
    /* a kernel before its API record */
    kernel(b, 2, 2300);
    api(b, 2, 2100, 77);
    range(b, 77, 2050, 2400);
    api(b, 3, 1990, 0); /* late warm-up API record and its kernel */
    kernel(b, 3, 2500);
    step(b, 11, 3000);
    api(b, 4, 3100, 0);
    kernel(b, 4, 3200);
    memset(&y, 0, sizeof(y));
    y.start_ns = T0 + 3300;
    y.end_ns = T0 + 3350;
    y.sync_type = 3;
    y.stream = 7;
    kp_batcher_records(b, KP_REC_SYNC, sizeof(y), &y, 1);
    memset(&m, 0, sizeof(m));
    m.start_ns = T0 + 3400;
    m.end_ns = T0 + 3500;
    m.bytes = 4096;
    m.correlation = 5; /* its API record never comes */
    m.copy_kind = 1;
    kp_batcher_records(b, KP_REC_MEMCPY, sizeof(m), &m, 1);
    api(b, 6, 4100, 0); /* after the window */
    step(b, 12, 4000);
    assert_int_equal(s.n, 0); /* nothing cut before the end: 1000 rows per batch */
    window(b, true, 2000, 4000);

    assert_int_equal(s.n, 1);
    assert_true(s.last[0]);
    Kprof__V1__Batch *x = s.b[0];
    assert_int_equal(x->run_id, 42);
    assert_int_equal(x->rank, 3);
    assert_int_equal(x->stream, 0);
    assert_int_equal(x->seq, 0);
    assert_int_equal(x->base_ns, T0 + 2300);
    assert_string_equal(x->strings[0], "");
    /* rank info and stats */
    assert_non_null(x->rank_info);
    assert_string_equal(x->rank_info->job, "jobA");
    assert_string_equal(x->rank_info->host, "node7");
    assert_int_equal(x->rank_info->pid, 4242);
    assert_int_equal(x->rank_info->world_size, 8);
    assert_int_equal(x->rank_info->local_rank, 1);
    assert_int_equal(x->rank_info->device, 1);
    assert_non_null(x->stats);
    assert_int_equal(x->stats->records_dropped, 3);
    assert_int_equal(x->stats->cupti_dropped, 1);
    assert_int_equal(x->stats->overhead_ns, 500);
    /* kernels: corr 2 (step 10, op 77) and corr 4 (step 11, no op) */
    assert_non_null(x->kernels);
    assert_int_equal(x->kernels->n_start_ns, 2);
    assert_int_equal(x->kernels->start_ns[0], 0);
    assert_int_equal(x->kernels->start_ns[1], 900);
    assert_int_equal(x->kernels->dur_ns[0], 50);
    assert_int_equal(x->kernels->correlation[0], 2);
    assert_int_equal(x->kernels->correlation[1], 4);
    assert_int_equal(x->kernels->external_id[0], 77);
    assert_int_equal(x->kernels->external_id[1], 0);
    assert_int_equal(x->kernels->step[0], 10);
    assert_int_equal(x->kernels->step[1], 11);
    assert_string_equal(str_at(x, x->kernels->name[0]), "volta_sgemm_128x64_nn");
    assert_int_equal(x->kernels->n_grid_x, 2);
    assert_int_equal(x->kernels->block_x[1], 256);
    assert_int_equal(x->kernels->registers[0], 32);
    assert_int_equal(x->kernels->n_graph_node_id, 2);
    /* api calls: corr 2 and 4, deltas from base then from the previous row */
    assert_non_null(x->api_calls);
    assert_int_equal(x->api_calls->n_start_ns, 2);
    assert_int_equal(x->api_calls->start_ns[0], -200);
    assert_int_equal(x->api_calls->start_ns[1], 1000);
    assert_int_equal(x->api_calls->external_id[0], 77);
    assert_int_equal(x->api_calls->step[0], 10);
    assert_int_equal(x->api_calls->step[1], 11);
    assert_int_equal(x->api_calls->domain[0], 1);
    assert_int_equal(x->api_calls->tid[0], 777);
    assert_string_equal(str_at(x, x->api_calls->name[1]), "cudaLaunchKernel");
    /* ops: range 77 only (60 ended before the window) */
    assert_non_null(x->ops);
    assert_int_equal(x->ops->n_start_ns, 1);
    assert_int_equal(x->ops->start_ns[0], -250);
    assert_int_equal(x->ops->dur_ns[0], 350);
    assert_int_equal(x->ops->op_id[0], 77);
    assert_int_equal(x->ops->external_id[0], 77);
    assert_int_equal(x->ops->parent_id[0], 5);
    assert_int_equal(x->ops->seq[0], 12);
    assert_int_equal(x->ops->kind[0], 1);
    assert_int_equal(x->ops->step[0], 10);
    assert_string_equal(str_at(x, x->ops->name[0]), "aten::mm");
    assert_string_equal(str_at(x, x->ops->input_shapes[0]), "[[2, 3], [3, 4]]");
    assert_int_equal(x->ops->domain[0], 0);
    /* syncs and the memcpy without an API record (own time, step 11) */
    assert_non_null(x->syncs);
    assert_int_equal(x->syncs->n_start_ns, 1);
    assert_int_equal(x->syncs->step[0], 11);
    assert_int_equal(x->syncs->sync_type[0], 3);
    assert_non_null(x->memcpys);
    assert_int_equal(x->memcpys->n_start_ns, 1);
    assert_int_equal(x->memcpys->start_ns[0], 1100);
    assert_int_equal(x->memcpys->bytes[0], 4096);
    assert_int_equal(x->memcpys->step[0], 11);
    assert_int_equal(x->memcpys->external_id[0], 0);
    assert_null(x->memsets);
    /* steps 10 and 11, each 1000 ns; 9 and 12 are outside */
    assert_non_null(x->steps);
    assert_int_equal(x->steps->n_step, 2);
    assert_int_equal(x->steps->step[0], 10);
    assert_int_equal(x->steps->step[1], 11);
    assert_int_equal(x->steps->start_ns[0], -300);
    assert_int_equal(x->steps->start_ns[1], 1000);
    assert_int_equal(x->steps->dur_ns[0], 1000);
    assert_int_equal(x->steps->dur_ns[1], 1000);
    /* counters */
    kp_batcher_get_stats(b, &st);
    assert_int_equal(st.records_in, 13);
    assert_int_equal(st.warmup, 5);
    assert_int_equal(st.after, 1);
    assert_int_equal(st.kept, 9);
    assert_int_equal(s.rows[0], 9);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.invalid, 0);
    assert_int_equal(st.batches, 1);
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* batch_rows cuts batches; rank_info rides only the first; the last is flagged. */
static void test_cuts(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 3, 0);
    int rows = 0;

    (void) state;
    step(b, 10, 0);
    window(b, false, 0, 0);
    step(b, 11, 10000); /* everything below 10000 is known to be inside */
    for (int i = 0; i < 7; i++) {
        api(b, 100 + (uint64_t) i, 100 + i * 100, 0);
    }
    assert_int_equal(s.n, 2);
    window(b, true, 0, 20000);
    assert_int_equal(s.n, 3);
    for (int i = 0; i < s.n; i++) {
        assert_int_equal(s.last[i], i == 2);
        assert_true((s.b[i]->rank_info != NULL) == (i == 0));
        rows += s.b[i]->api_calls ? (int) s.b[i]->api_calls->n_start_ns : 0;
    }
    assert_int_equal(rows, 7);
    assert_int_equal(s.b[1]->base_ns, T0 + 400);
    assert_int_equal(s.b[2]->steps->n_step, 2);
    assert_int_equal(s.b[2]->steps->dur_ns[1], 10000);
    assert_null(s.b[1]->stats);
    assert_non_null(s.b[2]->stats); /* WINDOW_END's counters */
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* The pending list is bounded: the oldest held records are decided early. A capture whose
 * process vanished (window_end(NULL)) still emits its last batch. */
static void test_bounded_pending(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 100, 4);
    struct kp_batcher_stats st;

    (void) state;
    for (int i = 0; i < 10; i++) {
        api(b, 1 + (uint64_t) i, i, 0); /* before WINDOW_BEGIN: held */
    }
    kp_batcher_get_stats(b, &st);
    assert_int_equal(st.pending, 4);
    assert_int_equal(st.forced, 6);
    assert_int_equal(st.warmup, 6);
    window(b, false, 5, 0);
    for (int i = 0; i < 3; i++) {
        kernel(b, 500 + (uint64_t) i, 100); /* waiting for API records that never come */
    }
    assert_int_equal(kp_batcher_window_end(b, NULL), 0);
    assert_int_equal(s.n, 1);
    assert_true(s.last[0]);
    assert_int_equal(s.b[0]->api_calls->n_start_ns, 4); /* 6..9 */
    assert_int_equal(s.b[0]->kernels->n_start_ns, 3);
    assert_int_equal(s.b[0]->kernels->step[0], -1); /* no step known */
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* --- malformed wire values --- */

static struct kp_batcher *make_opts(struct sink *s, const struct kp_batcher_opts *base)
{
    struct kp_batcher_opts o = *base;
    struct kp_batcher *b;

    o.strings = lookup;
    o.emit = emit;
    o.ud = s;
    assert_int_equal(kp_batcher_create(&o, &b), 0);
    return b;
}

static struct kp_wire_kernel good_kernel(int64_t t)
{
    struct kp_wire_kernel k;

    memset(&k, 0, sizeof(k));
    k.start_ns = T0 + t;
    k.end_ns = T0 + t + 50;
    k.name = 1;
    k.device = 1;
    k.stream = 7;
    k.grid_x = k.grid_y = k.grid_z = 1;
    k.block_x = k.block_y = k.block_z = 32;
    return k;
}

/* One bad value per record, in the same RECORDS messages as good ones: only the bad records
 * go, each counted once; CUPTI's 0xFFFFFFFF "not applicable" ids become 0. */
static void test_malformed_records(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 1000, 0);
    struct kp_batcher_stats st;
    struct kp_wire_kernel k[7];
    struct kp_wire_memcpy m[4];
    struct kp_wire_memset ms[2];
    struct kp_wire_api a[4];
    struct kp_wire_sync y[4];
    struct kp_wire_range r[4];

    (void) state;
    step(b, 10, 0);
    window(b, false, 0, 0);
    for (int i = 0; i < 7; i++) {
        k[i] = good_kernel(100 + i * 10);
    }
    k[1].device = 40000;      /* smallint: dropped */
    k[2].device = UINT32_MAX; /* not applicable: 0 */
    k[2].context = UINT32_MAX;
    k[2].stream = UINT32_MAX;
    k[3].correlation = (uint64_t) 1 << 63; /* huge correlation: dropped */
    k[4].block_x = 70000;                  /* smallint: dropped */
    k[5].end_ns = k[5].start_ns - 1;       /* end < start: dropped */
    k[6].start_ns = INT64_MIN;             /* not a time: dropped */
    kp_batcher_records(b, KP_REC_KERNEL, sizeof(k[0]), k, 7);

    memset(m, 0, sizeof(m));
    for (int i = 0; i < 4; i++) {
        m[i].start_ns = T0 + 200 + i * 10;
        m[i].end_ns = m[i].start_ns + 5;
        m[i].bytes = 64;
        m[i].copy_kind = 1;
        m[i].device = m[i].src_device = m[i].dst_device = 2;
    }
    m[1].bytes = UINT64_MAX;      /* bigint: dropped */
    m[2].src_device = 0x8000;     /* smallint: dropped */
    m[3].dst_device = UINT32_MAX; /* not applicable: 0 */
    kp_batcher_records(b, KP_REC_MEMCPY, sizeof(m[0]), m, 4);

    memset(ms, 0, sizeof(ms));
    for (int i = 0; i < 2; i++) {
        ms[i].start_ns = T0 + 300 + i * 10;
        ms[i].end_ns = ms[i].start_ns + 5;
        ms[i].value = UINT32_MAX; /* a bigint column: fits */
    }
    ms[0].mem_kind = 0x10000; /* smallint: dropped */
    kp_batcher_records(b, KP_REC_MEMSET, sizeof(ms[0]), ms, 2);

    memset(a, 0, sizeof(a));
    for (int i = 0; i < 4; i++) {
        a[i].start_ns = T0 + 400 + i * 10;
        a[i].end_ns = a[i].start_ns + 5;
        a[i].correlation = 10 + (uint64_t) i;
        a[i].domain = 1;
        a[i].name = 2;
    }
    a[1].cbid = 0x80000000u;       /* integer: dropped */
    a[2].external_id = UINT64_MAX; /* bigint: dropped */
    a[3].tid = (uint64_t) 1 << 63; /* bigint: dropped */
    kp_batcher_records(b, KP_REC_API, sizeof(a[0]), a, 4);

    memset(y, 0, sizeof(y));
    for (int i = 0; i < 4; i++) {
        y[i].start_ns = T0 + 500 + i * 10;
        y[i].end_ns = y[i].start_ns + 5;
        y[i].sync_type = 2;
    }
    y[0].device = y[0].context = y[0].stream = y[0].cuda_event = UINT32_MAX; /* all n/a: 0 */
    y[1].stream = 0x80000000u;                                               /* integer: dropped */
    y[2].sync_type = 0x8000;                                                 /* smallint: dropped */
    y[3].device = 0x7fff; /* the largest smallint: kept */
    kp_batcher_records(b, KP_REC_SYNC, sizeof(y[0]), y, 4);

    memset(r, 0, sizeof(r));
    for (int i = 0; i < 4; i++) {
        r[i].start_ns = T0 + 600 + i * 10;
        r[i].end_ns = r[i].start_ns + 5;
        r[i].range_id = 100 + (uint64_t) i;
        r[i].seq = -1;
        r[i].kind = 5;
        r[i].name = 3;
    }
    r[0].name = 99; /* string ids never defined: NULL names, kept */
    r[0].shapes = 98;
    r[0].domain = 97;
    r[1].kind = 0x10000;                /* smallint: dropped */
    r[2].range_id = (uint64_t) 1 << 63; /* op_id is a bigint: dropped */
    r[3].parent_id = UINT64_MAX;        /* bigint: dropped */
    kp_batcher_records(b, KP_REC_RANGE, sizeof(r[0]), r, 4);

    step(b, 11, 1000);
    step(b, 12, 2000);
    window(b, true, 0, 2000);

    kp_batcher_get_stats(b, &st);
    assert_int_equal(st.records_in, 25);
    assert_int_equal(st.malformed, 16);
    assert_int_equal(st.kept, 9 + 2); /* and the rows of steps 10 and 11 */
    assert_int_equal(st.invalid, 0);
    assert_int_equal(st.missing_strings, 3);
    assert_int_equal(s.n, 1);
    Kprof__V1__Batch *x = s.b[0];
    assert_int_equal(x->kernels->n_start_ns, 2);
    assert_int_equal(x->kernels->device[0], 1);
    assert_int_equal(x->kernels->device[1], 0);
    assert_int_equal(x->kernels->context[1], 0);
    assert_int_equal(x->kernels->stream[1], 0);
    assert_int_equal(x->kernels->start_ns[1], 20); /* k[0] at 100, k[2] at 120 */
    assert_int_equal(x->memcpys->n_start_ns, 2);
    assert_int_equal(x->memcpys->dst_device[0], 2);
    assert_int_equal(x->memcpys->dst_device[1], 0);
    assert_int_equal(x->memcpys->src_device[1], 2);
    assert_int_equal(x->memsets->n_start_ns, 1);
    assert_int_equal(x->memsets->value[0], UINT32_MAX);
    assert_int_equal(x->api_calls->n_start_ns, 1);
    assert_int_equal(x->api_calls->correlation[0], 10);
    assert_int_equal(x->syncs->n_start_ns, 2);
    assert_int_equal(x->syncs->device[0], 0);
    assert_int_equal(x->syncs->context[0], 0);
    assert_int_equal(x->syncs->stream[0], 0);
    assert_int_equal(x->syncs->cuda_event[0], 0);
    assert_int_equal(x->syncs->device[1], 0x7fff);
    assert_int_equal(x->ops->n_start_ns, 1);
    assert_int_equal(x->ops->name[0], 0);
    assert_int_equal(x->ops->input_shapes[0], 0);
    assert_int_equal(x->ops->domain[0], 0);
    assert_int_equal(x->ops->op_id[0], 100);
    assert_int_equal(x->steps->n_step, 2);
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* STEPs with a step number that does not fit the rows' integer step column, or a negative
 * time, are ignored and counted; the records around them keep the real steps. */
static void test_malformed_steps(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 1000, 0);
    struct kp_batcher_stats st;
    struct kp_wire_step bad = { 11, -1, KP_STEP_HOOK, 0 };

    (void) state;
    step(b, 10, 0);
    window(b, false, 0, 0);
    step(b, (int64_t) 1 << 40, 500); /* huge */
    step(b, -3, 600);
    step(b, (int64_t) INT32_MAX + 1, 650);
    kp_batcher_step(b, &bad);
    api(b, 1, 700, 0);
    step(b, 11, 1000);
    api(b, 2, 1100, 0);
    step(b, 12, 2000);
    window(b, true, 0, 2000);

    kp_batcher_get_stats(b, &st);
    assert_int_equal(st.malformed, 4);
    assert_int_equal(st.invalid, 0);
    assert_int_equal(s.n, 1);
    Kprof__V1__Batch *x = s.b[0];
    assert_int_equal(x->api_calls->n_start_ns, 2);
    assert_int_equal(x->api_calls->step[0], 10);
    assert_int_equal(x->api_calls->step[1], 11);
    assert_int_equal(x->steps->n_step, 2);
    assert_int_equal(x->steps->step[0], 10);
    assert_int_equal(x->steps->step[1], 11);
    assert_int_equal(x->steps->dur_ns[0], 1000);
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* The library may send a step's first records before that STEP (a flush between the app's
 * kprof_step and the worker popping its event; a STOP that ends the window in between): the
 * GPU records launched in the step take its number, not the one of the step before, whether
 * their API record came before or after them. */
static void test_step_after_its_records(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 1000, 0);
    struct kp_batcher_stats st;

    (void) state;
    step(b, 10, 0);
    window(b, false, 0, 0);
    api(b, 1, 100, 0);
    kernel(b, 1, 150);
    /* step 11 began at 1000; its records arrive first */
    api(b, 2, 1100, 0);
    kernel(b, 2, 1150);
    kernel(b, 3, 1250); /* before its API record */
    api(b, 3, 1200, 0);
    step(b, 11, 1000);
    api(b, 4, 1300, 0);
    kernel(b, 4, 1350);
    api(b, 5, 1900, 0); /* no STEP 12 before the end: decided at WINDOW_END */
    kernel(b, 5, 1950);
    window(b, true, 0, 2000);

    kp_batcher_get_stats(b, &st);
    assert_int_equal(st.invalid, 0);
    assert_int_equal(s.n, 1);
    Kprof__V1__Batch *x = s.b[0];
    assert_non_null(x->kernels);
    assert_int_equal(x->kernels->n_correlation, 5);
    for (size_t i = 0; i < x->kernels->n_correlation; i++) {
        uint64_t c = x->kernels->correlation[i];

        assert_int_equal(x->kernels->step[i], c == 1 ? 10 : 11);
    }
    assert_int_equal(x->api_calls->n_correlation, 5);
    for (size_t i = 0; i < x->api_calls->n_correlation; i++) {
        assert_int_equal(x->api_calls->step[i], x->api_calls->correlation[i] == 1 ? 10 : 11);
    }
    assert_int_equal(x->steps->n_step, 2);
    assert_int_equal(x->steps->step[1], 11);
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* Times at the int64 limits: a window from 0 to "the process vanished" after a record that
 * ends at INT64_MAX; durations and deltas stay in range. */
static void test_time_limits(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher_opts o;
    struct kp_batcher *b;
    struct kp_batcher_stats st;
    struct kp_wire_window w;
    struct kp_wire_api a[4];
    struct kp_wire_step stp = { 1, INT64_MAX - 5, KP_STEP_HOOK, 0 };

    (void) state;
    memset(&o, 0, sizeof(o));
    o.run_id = 7;
    o.target_step = -1;
    o.batch_rows = 2;
    b = make_opts(&s, &o);
    memset(&w, 0, sizeof(w));
    w.start_ns = 0;
    kp_batcher_window_begin(b, &w);
    memset(a, 0, sizeof(a));
    a[0].start_ns = 0;
    a[0].end_ns = INT64_MAX; /* the longest call there can be */
    a[1].start_ns = INT64_MAX - 10;
    a[1].end_ns = INT64_MAX - 1;
    a[2].start_ns = INT64_MAX; /* at the window's end (exclusive): after */
    a[2].end_ns = INT64_MAX;
    a[3].start_ns = 10; /* end before start */
    a[3].end_ns = INT64_MIN;
    kp_batcher_records(b, KP_REC_API, sizeof(a[0]), a, 4);
    kp_batcher_step(b, &stp);
    assert_int_equal(kp_batcher_window_end(b, NULL), 0);

    kp_batcher_get_stats(b, &st);
    assert_int_equal(st.invalid, 0);
    assert_int_equal(st.malformed, 1);
    assert_int_equal(st.after, 1);
    assert_true(s.n >= 1);
    Kprof__V1__Batch *x = s.b[0];
    assert_int_equal(x->base_ns, 0);
    assert_int_equal(x->api_calls->n_start_ns, 2);
    assert_int_equal(x->api_calls->dur_ns[0], INT64_MAX);
    assert_int_equal(x->api_calls->start_ns[1], INT64_MAX - 10);
    assert_int_equal(x->api_calls->dur_ns[1], 9);
    x = s.b[s.n - 1];
    assert_non_null(x->steps);
    assert_int_equal(x->steps->n_step, 1);
    assert_int_equal(x->steps->dur_ns[0], 5);
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* The library's counters saturate instead of overflowing the bigint columns. */
static void test_counters_saturate(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 1000, 0);

    (void) state;
    step(b, 10, 0);
    window(b, false, 0, 0);
    kp_batcher_counters(b, UINT64_MAX, UINT64_MAX, UINT64_MAX);
    kp_batcher_add_dropped(b, UINT64_MAX);
    window(b, true, 0, 2000);
    assert_int_equal(s.n, 1);
    assert_non_null(s.b[0]->stats);
    assert_int_equal(s.b[0]->stats->records_dropped, INT64_MAX);
    assert_int_equal(s.b[0]->stats->cupti_dropped, INT64_MAX);
    assert_int_equal(s.b[0]->stats->overhead_ns, INT64_MAX);
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* Batches the emit callback refuses (spool full) lose their rows, never their counts: those
 * and the rows ride on the next batch, with the RankInfo; a refused last batch is followed by
 * a last batch without rows that carries them. */
static void test_refused_counts(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher *b = make(&s, 3, 0);
    struct kp_wire_window w = { .start_ns = T0,
                                .end_ns = T0 + 20000,
                                .first_step = 10,
                                .last_step = 11,
                                .dropped = 3,
                                .cupti_dropped = 1 };

    (void) state;
    step(b, 10, 0);
    window(b, false, 0, 0);
    step(b, 11, 10000);
    s.refuse = 1;
    for (int i = 0; i < 4; i++) {
        api(b, 100 + (uint64_t) i, 100 + i * 100, 0);
    }
    /* the first batch (3 rows) refused, the second taken: it carries the first's loss */
    assert_int_equal(s.n, 0);
    for (int i = 4; i < 7; i++) {
        api(b, 100 + (uint64_t) i, 100 + i * 100, 0);
    }
    assert_int_equal(s.n, 1);
    assert_non_null(s.b[0]->rank_info);
    assert_non_null(s.b[0]->stats);
    assert_int_equal(s.b[0]->stats->records_dropped, 3);
    s.refuse = 1;
    /* the last batch (1 API row and 2 steps rows) refused: a count-only last batch follows */
    assert_int_equal(kp_batcher_window_end(b, &w), -ENOSPC);
    assert_int_equal(s.n, 2);
    assert_true(s.last[1]);
    assert_int_equal(s.rows[1], 0);
    assert_null(s.b[1]->api_calls);
    assert_null(s.b[1]->steps);
    assert_null(s.b[1]->rank_info);
    assert_non_null(s.b[1]->stats);
    assert_int_equal(s.b[1]->stats->records_dropped, 3 + 3); /* 3 rows, 3 by the library */
    assert_int_equal(s.b[1]->stats->cupti_dropped, 1);
    kp_batcher_destroy(b);
    sink_free(&s);
}

/* Identity from HELLO (job, host, device) is cleaned; impossible run ids are refused. */
static void test_rank_info_cleaned(void **state)
{
    struct sink s = { 0 };
    struct kp_batcher_opts o;
    struct kp_batcher *b;

    (void) state;
    memset(&o, 0, sizeof(o));
    o.run_id = 1;
    o.target_step = -1;
    o.job = "\xff\xfejob\xc3\xa9";
    o.host = "h\xc3";
    o.device = 70000;
    o.pid = 0x80000000u;
    o.emit = emit;
    b = make_opts(&s, &o);
    kp_batcher_window_begin(b, &(struct kp_wire_window){ .start_ns = T0 });
    api(b, 1, 10, 0);
    assert_int_equal(kp_batcher_window_end(b, NULL), 0);
    assert_int_equal(s.n, 1);
    assert_non_null(s.b[0]->rank_info);
    assert_string_equal(s.b[0]->rank_info->job, "??job\xc3\xa9");
    assert_string_equal(s.b[0]->rank_info->host, "h?");
    assert_int_equal(s.b[0]->rank_info->device, -1);
    assert_int_equal(s.b[0]->rank_info->pid, 0);
    kp_batcher_destroy(b);
    sink_free(&s);

    o.run_id = 0;
    assert_int_equal(kp_batcher_create(&o, &b), -EINVAL);
    assert_null(b);
    o.run_id = (uint64_t) INT32_MAX + 1;
    assert_int_equal(kp_batcher_create(&o, &b), -EINVAL);
    o.run_id = 1;
    o.rank = 0x80000000u;
    assert_int_equal(kp_batcher_create(&o, &b), -EINVAL);
}

/* Random hostile records, steps and windows: every batch validates, nothing is counted
 * invalid, and every record is accounted for (kept, warm-up, after or malformed). */
struct count_sink {
    uint64_t batches, rows, step_rows;
};

static int emit_count(void *ud, const uint8_t *buf, size_t len, size_t rows, bool last)
{
    struct count_sink *c = ud;
    Kprof__V1__Batch *x = kprof__v1__batch__unpack(NULL, len, buf);

    (void) last;
    assert_non_null(x);
    assert_valid(x);
    c->batches++;
    c->rows += rows;
    c->step_rows += x->steps != NULL ? x->steps->n_step : 0;
    kprof__v1__batch__free_unpacked(x, NULL);
    return 0;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static uint32_t rnd_u32(void)
{
    static const uint32_t vals[] = { 0,          1,       3,          0x7fff,     0x8000,
                                     0xffff,     0x10000, 0x7fffffff, 0x80000000, 0xfffffffe,
                                     0xffffffff, 2,       5,          1,          0 };
    switch (rnd() % 8) {
    case 0:
        return (uint32_t) rnd();
    case 1:
    case 2:
        return vals[rnd() % (sizeof(vals) / sizeof(vals[0]))];
    default:
        return (uint32_t) (rnd() % 8); /* mostly plausible values, so records get kept */
    }
}

static int64_t rnd_time(void)
{
    static const int64_t vals[] = { 0, -1, INT64_MIN, INT64_MAX, INT64_MAX - 1, T0, T0 + 1 };

    return rnd() % 8 == 0 ? vals[rnd() % (sizeof(vals) / sizeof(vals[0]))]
                          : T0 + (int64_t) (rnd() % 100000);
}

static void test_random_hostile(void **state)
{
    uint64_t kept = 0, malformed = 0;

    (void) state;
    kp_log_set_level(KP_LOG_ERROR); /* thousands of malformed lines otherwise */
    for (int round = 0; round < 200; round++) {
        struct count_sink c = { 0 };
        struct kp_batcher_opts o;
        struct kp_batcher *b;
        struct kp_batcher_stats st;
        uint64_t mal_steps = 0;
        bool begun = false;

        memset(&o, 0, sizeof(o));
        o.run_id = 1 + (uint64_t) round;
        o.target_step = round % 2 ? 3 : -1;
        o.n_steps = round % 2 ? 2 : 0;
        o.activities = round % 3 ? 0 : KP_ACT_KERNEL;
        o.batch_rows = 1 + (size_t) (rnd() % 8);
        o.max_pending = 1 + (size_t) (rnd() % 16);
        o.max_corr = 1 + (size_t) (rnd() % 16);
        o.strings = lookup;
        o.emit = emit_count;
        o.ud = &c;
        assert_int_equal(kp_batcher_create(&o, &b), 0);
        for (int op = 0; op < 60; op++) {
            uint32_t words[32];
            uint32_t kind = 1 + (uint32_t) (rnd() % 6), n = 1 + (uint32_t) (rnd() % 4);
            struct {
                int64_t t[2];
                uint32_t w[28];
            } recs[4];

            switch (rnd() % 8) {
            case 0: {
                struct kp_wire_step s = { (int64_t) rnd_u32() - (rnd() % 2 ? 0 : 5), rnd_time(), 1,
                                          0 };
                if (rnd() % 2) {
                    s.step = (int64_t) (rnd() % 8);
                }
                mal_steps += s.step < 0 || s.step > INT32_MAX || s.start_ns < 0;
                kp_batcher_step(b, &s);
                break;
            }
            case 1:
                if (!begun) {
                    kp_batcher_window_begin(b, &(struct kp_wire_window){ .start_ns = rnd_time() });
                    begun = true;
                }
                break;
            case 2:
                kp_batcher_counters(b, rnd(), rnd(), rnd());
                break;
            default:
                for (uint32_t i = 0; i < n; i++) {
                    for (size_t j = 0; j < sizeof(words) / sizeof(words[0]); j++) {
                        words[j] = rnd_u32();
                    }
                    memcpy(&recs[i], words, sizeof(recs[i]));
                    recs[i].t[0] = rnd_time();
                    recs[i].t[1] = rnd() % 2 && recs[i].t[0] < INT64_MAX - 1000
                                       ? recs[i].t[0] + (int64_t) (rnd() % 1000)
                                       : rnd_time();
                    if (recs[i].t[1] < recs[i].t[0] && rnd() % 2) {
                        recs[i].t[1] = recs[i].t[0];
                    }
                }
                kp_batcher_records(b, kind, (uint32_t) sizeof(recs[0]), recs, n);
                break;
            }
        }
        if (rnd() % 2) {
            assert_int_equal(
                kp_batcher_window_end(b, &(struct kp_wire_window){ .start_ns = rnd_time(),
                                                                   .end_ns = rnd_time(),
                                                                   .dropped = rnd() }),
                0);
        }
        else {
            assert_int_equal(kp_batcher_window_end(b, NULL), 0);
        }
        kp_batcher_get_stats(b, &st);
        assert_int_equal(st.invalid, 0);
        assert_int_equal(st.pending, 0);
        assert_true(c.batches >= 1);
        assert_int_equal(st.batches, c.batches);
        assert_int_equal(st.kept, c.rows);
        assert_int_equal(st.malformed >= mal_steps, true);
        assert_int_equal(st.records_in,
                         st.kept - c.step_rows + st.warmup + st.after + (st.malformed - mal_steps));
        kept += st.kept - c.step_rows;
        malformed += st.malformed;
        kp_batcher_destroy(b);
    }
    kp_log_set_level(KP_LOG_INFO);
    /* the mix reaches both paths */
    printf("random: kept=%llu malformed=%llu\n", (unsigned long long) kept,
           (unsigned long long) malformed);
    assert_true(kept > 1000);
    assert_true(malformed > 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window),          cmocka_unit_test(test_cuts),
        cmocka_unit_test(test_bounded_pending), cmocka_unit_test(test_malformed_records),
        cmocka_unit_test(test_malformed_steps), cmocka_unit_test(test_step_after_its_records),
        cmocka_unit_test(test_time_limits),     cmocka_unit_test(test_counters_saturate),
        cmocka_unit_test(test_refused_counts),  cmocka_unit_test(test_rank_info_cleaned),
        cmocka_unit_test(test_random_hostile),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
