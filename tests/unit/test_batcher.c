/* Unit tests of agent/batcher.c: hand-built kp_wire records for a window with warm-up
 * records, steps, GPU records before and after their API record; the emitted Batch columns
 * are checked one by one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batcher.h"
#include "kprof.pb-c.h"

#define T0 1700000000000000000LL

static const char *const strs[] = { "",         "volta_sgemm_128x64_nn", "cudaLaunchKernel",
                                    "aten::mm", "[[2, 3], [3, 4]]",      "cudaMemcpyAsync" };

struct sink {
    Kprof__V1__Batch *b[16];
    bool last[16];
    size_t rows[16];
    int n;
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

static int emit(void *ud, const uint8_t *buf, size_t len, size_t rows, bool last)
{
    struct sink *s = ud;

    assert_true(s->n < 16);
    s->b[s->n] = kprof__v1__batch__unpack(NULL, len, buf);
    assert_non_null(s->b[s->n]);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_cuts),
        cmocka_unit_test(test_bounded_pending),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
