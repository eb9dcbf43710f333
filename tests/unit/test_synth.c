/* Unit tests for tools/kp_synth: validity, determinism, totals, links, the straggler model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_synth.h"

static const struct kp_batch_limits limits = {
    KP_CODEC_DEFAULT_MAX_NAME_BYTES,
    KP_CODEC_DEFAULT_MAX_STRINGS,
    KP_CODEC_DEFAULT_MAX_ROWS,
};

static struct kp_synth_opts base_opts(void)
{
    struct kp_synth_opts o;

    memset(&o, 0, sizeof(o));
    o.seed = 42;
    o.rank = 1;
    o.world_size = 4;
    o.first_step = 100;
    o.n_steps = 12;
    o.kernels_per_step = 120;
    o.batch_rows = 2000;
    o.run_id = 7;
    o.job = "unit";
    return o;
}

/* Packs b and unpacks it again, as collectord would see it. Returns owned. */
static Kprof__V1__Batch *roundtrip(const Kprof__V1__Batch *b, size_t *wire)
{
    size_t len = kprof__v1__batch__get_packed_size(b);
    uint8_t *buf = malloc(len);
    Kprof__V1__Batch *u;

    assert_non_null(buf);
    assert_int_equal(kprof__v1__batch__pack(b, buf), len);
    u = kprof__v1__batch__unpack(NULL, len, buf);
    assert_non_null(u);
    free(buf);
    if (wire != NULL) {
        *wire = len;
    }
    return u;
}

/* Absolute start times of a delta-encoded column. Returns owned. */
static int64_t *abs_starts(const int64_t *d, size_t n, int64_t base)
{
    int64_t *a = calloc(n + 1, sizeof(int64_t)), t = base;

    assert_non_null(a);
    for (size_t i = 0; i < n; i++) {
        t += d[i];
        a[i] = t;
    }
    return a;
}

/* Every batch unpacks, validates, stays near batch_rows and has "" at index 0. */
static void test_batches_validate(void **state)
{
    struct kp_synth_opts o = base_opts();
    struct kp_synth *s;
    Kprof__V1__Batch *b;
    size_t nb = 0, steps = 0;
    char err[256];
    int rc;

    (void) state;
    assert_int_equal(kp_synth_create(&o, &s), 0);
    while ((rc = kp_synth_next(s, &b)) == 1) {
        Kprof__V1__Batch *u = roundtrip(b, NULL);
        size_t rows = kp_batch_total_rows(u);

        err[0] = '\0';
        rc = kp_batch_validate(u, &limits, err, sizeof(err));
        if (rc != 0) {
            fail_msg("batch %zu: %s", nb, err);
        }
        assert_true(u->n_strings >= 2);
        assert_string_equal(u->strings[0], "");
        assert_int_equal(u->run_id, 7);
        assert_int_equal(u->rank, 1);
        assert_true(rows <= o.batch_rows + 64);
        assert_true(rows > 0);
        /* rank info and the device only in the first batch */
        if (nb == 0) {
            assert_non_null(u->rank_info);
            assert_string_equal(u->rank_info->job, "unit");
            assert_int_equal(u->rank_info->world_size, 4);
            assert_int_equal(u->n_devices, 1);
        }
        else {
            assert_null(u->rank_info);
            assert_int_equal(u->n_devices, 0);
        }
        if (u->steps != NULL) {
            for (size_t i = 0; i < u->steps->n_step; i++) {
                assert_int_equal(u->steps->step[i], o.first_step + (int64_t) steps);
                steps++;
            }
        }
        kprof__v1__batch__free_unpacked(u, NULL);
        nb++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(steps, o.n_steps);
    assert_true(nb >= 4);
    /* exhausted stays exhausted */
    assert_int_equal(kp_synth_next(s, &b), 0);
    kp_synth_destroy(s);
}

/* Packs every batch of a generator into one buffer. Returns owned; *len its size. */
static uint8_t *pack_all(const struct kp_synth_opts *o, size_t *len)
{
    struct kp_synth *s;
    Kprof__V1__Batch *b;
    uint8_t *all = NULL;
    size_t n = 0;

    assert_int_equal(kp_synth_create(o, &s), 0);
    while (kp_synth_next(s, &b) == 1) {
        size_t l = kprof__v1__batch__get_packed_size(b);

        all = realloc(all, n + l);
        assert_non_null(all);
        kprof__v1__batch__pack(b, all + n);
        n += l;
    }
    kp_synth_destroy(s);
    *len = n;
    return all;
}

static void test_deterministic(void **state)
{
    struct kp_synth_opts o = base_opts();
    size_t l1, l2, l3;
    uint8_t *a, *b, *c;

    (void) state;
    a = pack_all(&o, &l1);
    b = pack_all(&o, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    o.seed = 43;
    c = pack_all(&o, &l3);
    assert_false(l3 == l1 && memcmp(a, c, l1) == 0);
    free(a);
    free(b);
    free(c);
}

/* The generator's totals equal a re-count of the unpacked columns, and every step has
 * exactly kernels_per_step compute kernels. */
static void test_totals(void **state)
{
    struct kp_synth_opts o = base_opts();
    struct kp_synth_totals t;
    const struct kp_synth_totals *g;
    struct kp_synth *s;
    Kprof__V1__Batch *b;
    uint64_t compute = 0;

    (void) state;
    memset(&t, 0, sizeof(t));
    o.kernels_per_step = 203; /* leaves a remainder for the extra elementwise ops */
    assert_int_equal(kp_synth_create(&o, &s), 0);
    while (kp_synth_next(s, &b) == 1) {
        Kprof__V1__Batch *u = roundtrip(b, NULL);

        kp_synth_count(u, &t);
        if (u->kernels != NULL) {
            for (size_t i = 0; i < u->kernels->n_stream; i++) {
                compute += u->kernels->stream[i] == 7;
            }
        }
        kprof__v1__batch__free_unpacked(u, NULL);
    }
    g = kp_synth_totals(s);
    assert_int_equal(g->batches, t.batches);
    assert_int_equal(g->all_rows, t.all_rows);
    assert_int_equal(g->steps, o.n_steps);
    for (int k = 0; k < KP_EV_COUNT; k++) {
        if (g->rows[k] != t.rows[k] || g->dur_ns[k] != t.dur_ns[k]) {
            fail_msg("kind %s: totals rows=%llu dur=%llu, recount rows=%llu dur=%llu",
                     kp_event_kinds[k].label, (unsigned long long) g->rows[k],
                     (unsigned long long) g->dur_ns[k], (unsigned long long) t.rows[k],
                     (unsigned long long) t.dur_ns[k]);
        }
        assert_true(g->rows[k] > 0); /* every kind is exercised */
    }
    assert_int_equal(compute, (uint64_t) o.n_steps * o.kernels_per_step);
    assert_int_equal(g->rows[KP_EV_STEP], o.n_steps);
    kp_synth_destroy(s);
}

/* All rows of one rank, decoded to absolute times. */
struct rank_rows {
    size_t nk, na, no, nc;
    int64_t *k_start, *a_start, *o_start;
    uint64_t *k_dur, *k_corr, *k_ext, *a_dur, *a_corr, *a_ext, *o_dur, *o_id, *o_parent, *o_tid;
    uint32_t *k_stream;
    uint64_t *c_seq;
    int32_t *k_step;
};

#define APPEND(dst, n, src, m)                                    \
    do {                                                          \
        (dst) = realloc((dst), ((n) + (m) + 1) * sizeof(*(dst))); \
        assert_non_null(dst);                                     \
        memcpy((dst) + (n), (src), (m) * sizeof(*(dst)));         \
    } while (0)

static void collect(const struct kp_synth_opts *o, struct rank_rows *r)
{
    struct kp_synth *s;
    Kprof__V1__Batch *b;

    memset(r, 0, sizeof(*r));
    assert_int_equal(kp_synth_create(o, &s), 0);
    while (kp_synth_next(s, &b) == 1) {
        Kprof__V1__Batch *u = roundtrip(b, NULL);

        if (u->kernels != NULL) {
            size_t m = u->kernels->n_start_ns;
            int64_t *st = abs_starts(u->kernels->start_ns, m, u->base_ns);

            APPEND(r->k_start, r->nk, st, m);
            APPEND(r->k_dur, r->nk, u->kernels->dur_ns, m);
            APPEND(r->k_corr, r->nk, u->kernels->correlation, m);
            APPEND(r->k_ext, r->nk, u->kernels->external_id, m);
            APPEND(r->k_stream, r->nk, u->kernels->stream, m);
            APPEND(r->k_step, r->nk, u->kernels->step, m);
            r->nk += m;
            free(st);
        }
        if (u->api_calls != NULL) {
            size_t m = u->api_calls->n_start_ns;
            int64_t *st = abs_starts(u->api_calls->start_ns, m, u->base_ns);

            APPEND(r->a_start, r->na, st, m);
            APPEND(r->a_dur, r->na, u->api_calls->dur_ns, m);
            APPEND(r->a_corr, r->na, u->api_calls->correlation, m);
            APPEND(r->a_ext, r->na, u->api_calls->external_id, m);
            r->na += m;
            free(st);
        }
        if (u->ops != NULL) {
            size_t m = u->ops->n_start_ns;
            int64_t *st = abs_starts(u->ops->start_ns, m, u->base_ns);

            APPEND(r->o_start, r->no, st, m);
            APPEND(r->o_dur, r->no, u->ops->dur_ns, m);
            APPEND(r->o_id, r->no, u->ops->op_id, m);
            APPEND(r->o_parent, r->no, u->ops->parent_id, m);
            APPEND(r->o_tid, r->no, u->ops->tid, m);
            r->no += m;
            free(st);
        }
        if (u->collectives != NULL) {
            size_t m = u->collectives->n_coll_seq;

            APPEND(r->c_seq, r->nc, u->collectives->coll_seq, m);
            r->nc += m;
        }
        kprof__v1__batch__free_unpacked(u, NULL);
    }
    kp_synth_destroy(s);
}

static void rows_free(struct rank_rows *r)
{
    free(r->k_start);
    free(r->k_dur);
    free(r->k_corr);
    free(r->k_ext);
    free(r->k_stream);
    free(r->k_step);
    free(r->a_start);
    free(r->a_dur);
    free(r->a_corr);
    free(r->a_ext);
    free(r->o_start);
    free(r->o_dur);
    free(r->o_id);
    free(r->o_parent);
    free(r->o_tid);
    free(r->c_seq);
}

/* Op ids are 1..n, so the id indexes a table. */
static size_t *op_index(const struct rank_rows *r)
{
    size_t *ix = calloc(r->no + 2, sizeof(size_t));

    assert_non_null(ix);
    for (size_t i = 0; i < r->no; i++) {
        assert_true(r->o_id[i] >= 1 && r->o_id[i] <= r->no);
        assert_int_equal(ix[r->o_id[i]], 0); /* unique */
        ix[r->o_id[i]] = i + 1;
    }
    return ix;
}

/* Kernel ↔ API call by correlation, both → an op by external id; ops nest in their parents;
 * kernels start after their launch. */
static void test_links(void **state)
{
    struct kp_synth_opts o = base_opts();
    struct rank_rows r;
    size_t *ix, *api_by_corr;

    (void) state;
    collect(&o, &r);
    ix = op_index(&r);
    api_by_corr = calloc(r.na + 2, sizeof(size_t));
    assert_non_null(api_by_corr);
    for (size_t i = 0; i < r.na; i++) {
        assert_true(r.a_corr[i] >= 1 && r.a_corr[i] <= r.na);
        api_by_corr[r.a_corr[i]] = i + 1;
        assert_true(r.a_ext[i] >= 1 && r.a_ext[i] <= r.no);
    }
    for (size_t i = 0; i < r.nk; i++) {
        size_t a = api_by_corr[r.k_corr[i]];

        assert_true(a != 0);
        assert_int_equal(r.a_ext[a - 1], r.k_ext[i]);
        assert_true(ix[r.k_ext[i]] != 0);
        assert_true(r.k_start[i] >= r.a_start[a - 1]);
        assert_true(r.k_dur[i] > 0);
    }
    for (size_t i = 0; i < r.no; i++) {
        size_t p;

        if (r.o_parent[i] == 0) {
            continue;
        }
        p = ix[r.o_parent[i]];
        assert_true(p != 0);
        p--;
        assert_int_equal(r.o_tid[p], r.o_tid[i]);
        assert_true(r.o_start[i] >= r.o_start[p]);
        assert_true(r.o_start[i] + (int64_t) r.o_dur[i] <= r.o_start[p] + (int64_t) r.o_dur[p]);
    }
    /* kernels on one stream never overlap (rows come in launch order per stream) */
    {
        int64_t end7 = 0, end13 = 0;

        for (size_t i = 0; i < r.nk; i++) {
            int64_t *end = r.k_stream[i] == 7 ? &end7 : &end13;

            assert_true(r.k_start[i] >= *end);
            *end = r.k_start[i] + (int64_t) r.k_dur[i];
        }
    }
    free(api_by_corr);
    free(ix);
    rows_free(&r);
}

/* Sum of compute-kernel time, of NCCL time, and the NCCL end times by collective. */
struct rank_view {
    uint64_t compute_ns, nccl_ns;
    int64_t *nccl_end;
    size_t n_nccl;
};

static void view_of(const struct kp_synth_opts *o, struct rank_view *v)
{
    struct rank_rows r;

    collect(o, &r);
    memset(v, 0, sizeof(*v));
    v->nccl_end = calloc(r.nk + 1, sizeof(int64_t));
    assert_non_null(v->nccl_end);
    for (size_t i = 0; i < r.nk; i++) {
        if (r.k_stream[i] == 13) {
            v->nccl_ns += r.k_dur[i];
            v->nccl_end[v->n_nccl++] = r.k_start[i] + (int64_t) r.k_dur[i];
        }
        else {
            v->compute_ns += r.k_dur[i];
        }
    }
    assert_int_equal(v->n_nccl, r.nc);
    rows_free(&r);
}

/* A compute straggler: its kernels take longer, the others wait in NCCL, and every rank's
 * allreduce of one bucket ends at the same time (separate generators agree). */
static void test_straggler(void **state)
{
    double slow[4] = { 1.0, 1.0, 1.6, 1.0 };
    double dl[4] = { 1.0, 1.0, 1.0, 1.0 };
    struct kp_synth_opts o = base_opts();
    struct rank_view v[4];

    (void) state;
    o.compute_slowdown = slow;
    o.dataload_slowdown = dl;
    for (uint32_t q = 0; q < 4; q++) {
        o.rank = q;
        view_of(&o, &v[q]);
    }
    for (uint32_t q = 0; q < 4; q++) {
        assert_int_equal(v[q].n_nccl, v[0].n_nccl);
        for (size_t i = 0; i < v[q].n_nccl; i++) {
            assert_int_equal(v[q].nccl_end[i], v[0].nccl_end[i]);
        }
        if (q != 2) {
            assert_true((double) v[2].compute_ns > 1.45 * (double) v[q].compute_ns);
            assert_true(v[q].nccl_ns > 2 * v[2].nccl_ns);
        }
    }
    for (uint32_t q = 0; q < 4; q++) {
        free(v[q].nccl_end);
    }
}

/* A slow data loader: a longer gap at the start of its steps (the data-loader range). */
static uint64_t dataloader_ns(const struct kp_synth_opts *o)
{
    struct kp_synth *s;
    Kprof__V1__Batch *b;
    uint64_t sum = 0;

    assert_int_equal(kp_synth_create(o, &s), 0);
    while (kp_synth_next(s, &b) == 1) {
        for (size_t i = 0; b->ops != NULL && i < b->ops->n_start_ns; i++) {
            const char *name = b->strings[b->ops->name[i]];

            if (strncmp(name, "enumerate(DataLoader)", 21) == 0) {
                sum += b->ops->dur_ns[i];
            }
        }
    }
    kp_synth_destroy(s);
    return sum;
}

static void test_dataload_straggler(void **state)
{
    double dl[4] = { 1.0, 3.0, 1.0, 1.0 };
    struct kp_synth_opts o = base_opts();
    uint64_t slow, fast;

    (void) state;
    o.dataload_slowdown = dl;
    o.rank = 1;
    slow = dataloader_ns(&o);
    o.rank = 0;
    fast = dataloader_ns(&o);
    assert_true(slow > 2 * fast);
}

static void test_bad_opts(void **state)
{
    struct kp_synth_opts o = base_opts();
    struct kp_synth *s = (struct kp_synth *) 1;
    double bad[4] = { 1.0, 0.0, 1.0, 1.0 };

    (void) state;
    o.rank = 4;
    assert_int_equal(kp_synth_create(&o, &s), -EINVAL);
    assert_null(s);
    o = base_opts();
    o.world_size = 0;
    assert_int_equal(kp_synth_create(&o, &s), -EINVAL);
    o = base_opts();
    o.kernels_per_step = 2;
    assert_int_equal(kp_synth_create(&o, &s), -EINVAL);
    o = base_opts();
    o.batch_rows = 10;
    assert_int_equal(kp_synth_create(&o, &s), -EINVAL);
    o = base_opts();
    o.compute_slowdown = bad;
    assert_int_equal(kp_synth_create(&o, &s), -EINVAL);
    o = base_opts();
    o.first_step = INT32_MAX;
    assert_int_equal(kp_synth_create(&o, &s), -EINVAL);
    kp_synth_destroy(NULL);
}

/* Small steps (kernels_per_step at its minimum) and zero steps. */
static void test_edges(void **state)
{
    struct kp_synth_opts o = base_opts();
    struct kp_synth *s;
    Kprof__V1__Batch *b;
    char err[256];
    int n = 0;

    (void) state;
    o.kernels_per_step = KP_SYNTH_MIN_KERNELS_PER_STEP;
    o.n_steps = 300;
    o.world_size = 1;
    o.rank = 0;
    o.batch_rows = KP_SYNTH_MIN_BATCH_ROWS;
    assert_int_equal(kp_synth_create(&o, &s), 0);
    while (kp_synth_next(s, &b) == 1) {
        assert_int_equal(kp_batch_validate(b, &limits, err, sizeof(err)), 0);
        n++;
    }
    assert_true(n > 10);
    assert_int_equal(kp_synth_totals(s)->steps, 300);
    kp_synth_destroy(s);

    o.n_steps = 0;
    assert_int_equal(kp_synth_create(&o, &s), 0);
    assert_int_equal(kp_synth_next(s, &b), 0);
    assert_int_equal(kp_synth_totals(s)->all_rows, 0);
    kp_synth_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_validate), cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_totals),           cmocka_unit_test(test_links),
        cmocka_unit_test(test_straggler),        cmocka_unit_test(test_dataload_straggler),
        cmocka_unit_test(test_bad_opts),         cmocka_unit_test(test_edges),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
