/*
 * Unit tests for the NVTX half of libkprof_inject.so: string interning (intern.c), the range
 * ring (ring.c) and the NVTX handlers (nvtx.c). The .c files are compiled into this binary so
 * the tests reach their internals; the "provided by core" symbols of kpi.h are fakes below
 * (a step clock, a CUPTI external-correlation stack that records pushes and pops, a step
 * event log). The CUDA include dir is not on the unit tests' path, so nvtx.c is built in its
 * test mode (KPI_NVTX_TEST) and the handlers are driven through its kp__* functions; the
 * NVTX loader path (InitializeInjectionNvtx2) is covered end-to-end by the worker tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KPI_NVTX_TEST 1
#include "../../agent/inject/intern.c"
#include "../../agent/inject/nvtx.c"
#include "../../agent/inject/ring.c"

/* ---- fakes for the core half of kpi.h ---- */

atomic_int kpi_recording_flag;
atomic_int kpi_forked_flag;
static _Atomic int64_t fake_clock = 1000000;

int64_t kpi_now_ns(void)
{
    return atomic_fetch_add(&fake_clock, 1000) + 1000;
}

uint64_t kpi_tid(void)
{
    return (uint64_t) syscall(SYS_gettid);
}

#define FAKE_MAX 4096
static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cupti_pushed[FAKE_MAX];
static size_t n_cupti_push, n_cupti_pop;
static struct {
    int64_t step, ts;
    uint32_t source;
} steps[FAKE_MAX];
static size_t n_steps;

void kpi_cupti_push_ext(uint64_t id)
{
    pthread_mutex_lock(&fake_mu);
    if (n_cupti_push < FAKE_MAX) {
        cupti_pushed[n_cupti_push] = id;
    }
    n_cupti_push++;
    pthread_mutex_unlock(&fake_mu);
}

void kpi_cupti_pop_ext(void)
{
    pthread_mutex_lock(&fake_mu);
    n_cupti_pop++;
    pthread_mutex_unlock(&fake_mu);
}

void kpi_step_event(int64_t step, int64_t ts_ns, uint32_t source)
{
    pthread_mutex_lock(&fake_mu);
    if (n_steps < FAKE_MAX) {
        steps[n_steps].step = step;
        steps[n_steps].ts = ts_ns;
        steps[n_steps].source = source;
    }
    n_steps++;
    pthread_mutex_unlock(&fake_mu);
}

void kpi_log(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- helpers ---- */

/* Re-creates the name table with the given limits (NULL: defaults). */
static void intern_reinit(const char *entries, const char *arena)
{
    if (entries != NULL) {
        setenv("KPROF_NAME_TABLE", entries, 1);
    }
    else {
        unsetenv("KPROF_NAME_TABLE");
    }
    if (arena != NULL) {
        setenv("KPROF_NAME_ARENA", arena, 1);
    }
    else {
        unsetenv("KPROF_NAME_ARENA");
    }
    free((void *) g_in.slots);
    free(g_in.arena);
    memset(&g_in, 0, sizeof(g_in));
    atomic_store(&g_in_ready, 0);
    g_in_once = (pthread_once_t) PTHREAD_ONCE_INIT;
    kpi_intern_init();
    assert_int_equal(atomic_load(&g_in_ready), 1);
}

static void ring_reinit(const char *cap)
{
    if (cap != NULL) {
        setenv("KPROF_RANGE_RING", cap, 1);
    }
    else {
        unsetenv("KPROF_RANGE_RING");
    }
    free(g_ring.cells);
    g_ring.cells = NULL;
    atomic_store(&g_ring_ready, 0);
    g_ring_once = (pthread_once_t) PTHREAD_ONCE_INIT;
    kpi_ranges_init();
    assert_int_equal(atomic_load(&g_ring_ready), 1);
}

/* The text of an id, looked up by walking the arena (test only). */
static const char *intern_text(uint32_t id, uint32_t *len)
{
    uint64_t end = atomic_load(&g_in.cursor) & KPI_INTERN_OFF_MASK;

    for (uint64_t off = 0; off < end;) {
        struct kpi_intern_entry *e = (struct kpi_intern_entry *) (g_in.arena + off);

        if (e->id == id && atomic_load(&e->state) == KPI_ENT_READY) {
            if (len != NULL) {
                *len = e->len;
            }
            return e->bytes;
        }
        off += kp__entry_size(e->len);
    }
    return NULL;
}

static void assert_name(uint32_t id, const char *expect)
{
    const char *s;

    if (expect == NULL) {
        assert_int_equal(id, 0);
        return;
    }
    s = intern_text(id, NULL);
    assert_non_null(s);
    assert_string_equal(s, expect);
}

struct drained {
    size_t n, cap;
    uint32_t *ids;
    char **texts;
    int stop_after; /* return non-zero when n reaches this (0: never) */
};

static int drain_cb(void *ctx, uint32_t id, const char *s, uint32_t len)
{
    struct drained *d = ctx;

    if (d->stop_after > 0 && d->n == (size_t) d->stop_after) {
        return 1;
    }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 64;
        d->ids = realloc(d->ids, d->cap * sizeof(*d->ids));
        d->texts = realloc(d->texts, d->cap * sizeof(*d->texts));
    }
    d->ids[d->n] = id;
    d->texts[d->n] = strndup(s, len);
    assert_int_equal(s[len], '\0');
    d->n++;
    return 0;
}

static void drained_free(struct drained *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->texts[i]);
    }
    free(d->ids);
    free(d->texts);
    memset(d, 0, sizeof(*d));
}

static void fakes_reset(void)
{
    pthread_mutex_lock(&fake_mu);
    n_cupti_push = n_cupti_pop = n_steps = 0;
    pthread_mutex_unlock(&fake_mu);
}

#define MAX_RECS 8192
static struct kp_wire_range recs[MAX_RECS];

/* Pops everything from the ring into recs; returns the count. */
static size_t pop_all(void)
{
    size_t n = 0, k;

    while ((k = kpi_ranges_pop(recs + n, MAX_RECS - n)) > 0) {
        n += k;
    }
    return n;
}

static void set_recording(int on)
{
    atomic_store(&kpi_recording_flag, on);
    kpi_nvtx_recording_changed(on);
}

static int nvtx_setup(void **state)
{
    kp__nvtx_init();
    atomic_store(&kpi_recording_flag, 0);
    atomic_store(&kpi_forked_flag, 0);
    pop_all();
    fakes_reset();
    return 0;
}

static int push_a(unsigned d, const char *msg)
{
    struct kp__in in;

    kp__in_ascii(&in, msg);
    return kp__push(d, &in);
}

static void mark_a(unsigned d, const char *msg)
{
    struct kp__in in;

    kp__in_ascii(&in, msg);
    kp__mark(d, &in);
}

static const struct kp_wire_range *find_rec(size_t n, uint32_t name)
{
    for (size_t i = 0; i < n; i++) {
        if (recs[i].name == name) {
            return &recs[i];
        }
    }
    return NULL;
}

static uint32_t id_of(const char *s)
{
    return kpi_intern(s, strlen(s));
}

/* ---- intern ---- */

static void test_intern_basic(void **state)
{
    uint32_t a, b, c, a2, sub;
    struct drained d = { 0 };
    const char text[] = "aten::addmmXYZ";

    intern_reinit(NULL, NULL);
    assert_int_equal(kpi_intern("x", 0), 0);
    a = kpi_intern("aten::addmm", 11);
    b = kpi_intern("aten::relu", 10);
    c = kpi_intern("", 0);
    a2 = kpi_intern("aten::addmm", 11);
    sub = kpi_intern(text, 11); /* not NUL-terminated at len */
    assert_int_equal(c, 0);
    assert_true(a >= 2); /* 1 is the overflow name */
    assert_int_not_equal(a, b);
    assert_int_equal(a, a2);
    assert_int_equal(a, sub);
    assert_int_equal(b, a + 1);
    assert_int_equal(kpi_intern("aten::addm", 10) != a, 1);

    assert_int_equal(kpi_intern_drain(drain_cb, &d), 4);
    assert_int_equal(d.ids[0], 1);
    assert_string_equal(d.texts[0], "(kprof: name table full)");
    assert_int_equal(d.ids[1], a);
    assert_string_equal(d.texts[1], "aten::addmm");
    assert_int_equal(d.ids[2], b);
    assert_string_equal(d.texts[2], "aten::relu");
    assert_string_equal(d.texts[3], "aten::addm");
    /* Nothing new: nothing delivered. */
    assert_int_equal(kpi_intern_drain(drain_cb, &d), 0);
    kpi_intern("later", 5);
    assert_int_equal(kpi_intern_drain(drain_cb, &d), 1);
    assert_string_equal(d.texts[4], "later");
    drained_free(&d);

    /* Rewind: everything again; an early stop resumes at the refused entry. */
    kpi_intern_rewind();
    d.stop_after = 2;
    assert_int_equal(kpi_intern_drain(drain_cb, &d), 2);
    d.stop_after = 0;
    assert_int_equal(kpi_intern_drain(drain_cb, &d), 3);
    assert_int_equal(d.n, 5);
    for (size_t i = 1; i < d.n; i++) {
        assert_true(d.ids[i] == d.ids[i - 1] + 1);
    }
    assert_string_equal(d.texts[2], "aten::relu");
    drained_free(&d);
}

static void test_intern_truncate(void **state)
{
    char *big = malloc(6000);
    uint32_t id, len = 0;
    const char *s;

    intern_reinit(NULL, NULL);
    memset(big, 'a', 6000);
    id = kpi_intern(big, 6000);
    s = intern_text(id, &len);
    assert_non_null(s);
    assert_int_equal(len, 4096);
    /* Same prefix, different tail: the same (truncated) string, the same id. */
    big[5000] = 'b';
    assert_int_equal(kpi_intern(big, 6000), id);

    /* A 3-byte UTF-8 character (U+20AC) at bytes 4095..4097 is dropped whole. */
    memset(big, 'c', 6000);
    big[4095] = (char) 0xE2;
    big[4096] = (char) 0x82;
    big[4097] = (char) 0xAC;
    id = kpi_intern(big, 6000);
    s = intern_text(id, &len);
    assert_non_null(s);
    assert_int_equal(len, 4095);
    assert_int_equal((unsigned char) s[4094], 'c');
    free(big);
}

#define MT_THREADS 8
#define MT_STRINGS 3000

struct mt_arg {
    int tno;
    uint32_t ids[MT_STRINGS];
};

static void mt_string(int i, char *buf, size_t cap)
{
    snprintf(buf, cap, "op::name_%d_%s", i, (i % 7) ? "fwd" : "bwd, seq = 1");
}

static void *mt_intern(void *p)
{
    struct mt_arg *a = p;
    char buf[64];

    for (int k = 0; k < MT_STRINGS; k++) {
        /* Each thread walks the strings in its own order so that inserts race. */
        int i = (a->tno % 2) ? MT_STRINGS - 1 - k : (k * 7 + a->tno) % MT_STRINGS;

        mt_string(i, buf, sizeof(buf));
        a->ids[i] = kpi_intern(buf, strlen(buf));
    }
    return NULL;
}

static void test_intern_concurrent(void **state)
{
    static struct mt_arg args[MT_THREADS];
    pthread_t th[MT_THREADS];
    struct drained d = { 0 };
    char buf[64];
    uint64_t names_before;
    unsigned char *seen;

    intern_reinit(NULL, NULL);
    names_before = atomic_load(&kpi_nvtx_counters.names);
    for (int t = 0; t < MT_THREADS; t++) {
        args[t].tno = t;
        assert_int_equal(pthread_create(&th[t], NULL, mt_intern, &args[t]), 0);
    }
    for (int t = 0; t < MT_THREADS; t++) {
        pthread_join(th[t], NULL);
    }
    for (int i = 0; i < MT_STRINGS; i++) {
        assert_true(args[0].ids[i] > 1);
        for (int t = 1; t < MT_THREADS; t++) {
            assert_int_equal(args[t].ids[i], args[0].ids[i]);
        }
    }
    assert_int_equal(atomic_load(&kpi_nvtx_counters.names) - names_before, MT_STRINGS);

    /* Drain: every string exactly once, ids strictly increasing, text matching its id. */
    kpi_intern_rewind();
    kpi_intern_drain(drain_cb, &d);
    assert_int_equal(d.n, MT_STRINGS + 1);
    seen = calloc(MT_STRINGS, 1);
    for (size_t k = 1; k < d.n; k++) {
        int i;

        assert_true(d.ids[k] > d.ids[k - 1]);
        assert_int_equal(sscanf(d.texts[k], "op::name_%d_", &i), 1);
        assert_true(i >= 0 && i < MT_STRINGS);
        assert_int_equal(seen[i], 0);
        seen[i] = 1;
        assert_int_equal(d.ids[k], args[0].ids[i]);
        mt_string(i, buf, sizeof(buf));
        assert_string_equal(d.texts[k], buf);
    }
    free(seen);
    drained_free(&d);
}

static void test_intern_overflow(void **state)
{
    char buf[64];
    uint32_t first, id, ovf_id;
    uint64_t ovf_before;
    static char big[4096];
    int n_ok = 0;

    /* Entry limit: 64 entries, one of them the overflow name. */
    intern_reinit("64", NULL);
    ovf_id = g_in.overflow_id;
    assert_int_equal(ovf_id, 1);
    first = kpi_intern("first", 5);
    ovf_before = atomic_load(&kpi_nvtx_counters.names_overflow);
    for (int i = 0; i < 100; i++) {
        snprintf(buf, sizeof(buf), "name-%d", i);
        id = kpi_intern(buf, strlen(buf));
        if (id != ovf_id) {
            n_ok++;
        }
    }
    assert_int_equal(n_ok, 62);
    assert_int_equal(atomic_load(&kpi_nvtx_counters.names_overflow) - ovf_before, 38);
    assert_int_equal(kpi_intern("first", 5), first); /* old names still resolve */
    assert_int_equal(kpi_intern("name-0", 6), first + 1);

    /* Arena limit: 64 KiB holds 15 strings of 4096 bytes plus headers, not 20. */
    intern_reinit(NULL, "64K");
    n_ok = 0;
    for (int i = 0; i < 20; i++) {
        memset(big, 'a' + i, sizeof(big));
        if (kpi_intern(big, sizeof(big)) != g_in.overflow_id) {
            n_ok++;
        }
    }
    assert_true(n_ok >= 14 && n_ok < 16);
    intern_reinit(NULL, NULL);
}

/* ---- ring ---- */

static void test_ring_wrap(void **state)
{
    struct kp_wire_range r, out[64];
    uint64_t next = 0, got = 0;
    size_t n;

    ring_reinit("50"); /* rounded up to 64 */
    assert_int_equal(g_ring.mask, 63);
    memset(&r, 0, sizeof(r));
    for (int round = 0; round < 40; round++) {
        for (int i = 0; i < 50; i++) {
            r.range_id = ++next;
            r.start_ns = (int64_t) next * 3;
            assert_int_equal(kpi_ranges_push(&r), 0);
        }
        while ((n = kpi_ranges_pop(out, 17)) > 0) {
            for (size_t i = 0; i < n; i++) {
                got++;
                assert_int_equal(out[i].range_id, got);
                assert_int_equal(out[i].start_ns, (int64_t) got * 3);
            }
        }
    }
    assert_int_equal(got, 2000);
}

static void test_ring_full(void **state)
{
    struct kp_wire_range r, out[128];
    uint64_t dropped = atomic_load(&kpi_nvtx_counters.ranges_dropped);

    ring_reinit("64");
    memset(&r, 0, sizeof(r));
    for (int i = 0; i < 64; i++) {
        r.range_id = (uint64_t) i + 1;
        assert_int_equal(kpi_ranges_push(&r), 0);
    }
    r.range_id = 999;
    assert_int_equal(kpi_ranges_push(&r), -1);
    assert_int_equal(kpi_ranges_push(&r), -1);
    assert_int_equal(atomic_load(&kpi_nvtx_counters.ranges_dropped) - dropped, 2);
    assert_int_equal(kpi_ranges_pop(out, 10), 10);
    assert_int_equal(out[9].range_id, 10);
    r.range_id = 65;
    assert_int_equal(kpi_ranges_push(&r), 0);
    assert_int_equal(kpi_ranges_pop(out, 128), 55);
    assert_int_equal(out[0].range_id, 11);
    assert_int_equal(out[54].range_id, 65);
    assert_int_equal(kpi_ranges_pop(out, 128), 0);
}

#define RP_PRODUCERS 4
#define RP_N         200000

static atomic_int rp_done;

static void *rp_produce(void *p)
{
    uint64_t tno = (uint64_t) (uintptr_t) p;
    struct kp_wire_range r;

    memset(&r, 0, sizeof(r));
    r.tid = tno;
    for (uint64_t i = 0; i < RP_N; i++) {
        r.range_id = (tno << 32) | (i + 1);
        r.end_ns = (int64_t) i;
        while (kpi_ranges_push(&r) != 0) {
            sched_yield(); /* full: the test retries so that every record arrives */
        }
    }
    atomic_fetch_add(&rp_done, 1);
    return NULL;
}

static void test_ring_mpsc(void **state)
{
    pthread_t th[RP_PRODUCERS];
    uint64_t next[RP_PRODUCERS] = { 0 };
    uint64_t total = 0;
    struct kp_wire_range out[256];
    size_t n;
    int bad = 0;

    ring_reinit("1024");
    atomic_store(&rp_done, 0);
    for (uintptr_t t = 0; t < RP_PRODUCERS; t++) {
        assert_int_equal(pthread_create(&th[t], NULL, rp_produce, (void *) t), 0);
    }
    for (;;) {
        int done = atomic_load(&rp_done) == RP_PRODUCERS;

        n = kpi_ranges_pop(out, 256);
        for (size_t i = 0; i < n; i++) {
            uint64_t t = out[i].tid;
            uint64_t seq = out[i].range_id & 0xffffffffu;

            /* Per producer, records arrive once each and in order. */
            if (t >= RP_PRODUCERS || seq != next[t] + 1 || out[i].end_ns != (int64_t) next[t] ||
                (out[i].range_id >> 32) != t) {
                bad++;
            }
            else {
                next[t] = seq;
            }
        }
        total += n;
        if (n == 0 && done) {
            break;
        }
    }
    for (int t = 0; t < RP_PRODUCERS; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(next[t], RP_N);
    }
    assert_int_equal(bad, 0);
    assert_int_equal(total, (uint64_t) RP_PRODUCERS * RP_N);
    ring_reinit(NULL);
}

/* ---- nvtx ---- */

static void test_nvtx_nesting(void **state)
{
    size_t n;
    const struct kp_wire_range *a, *b, *c;

    set_recording(1);
    assert_int_equal(push_a(0, "outer"), 0);
    assert_int_equal(push_a(0, "inner"), 1);
    assert_int_equal(kp__pop(0), 1);
    assert_int_equal(push_a(0, "inner2"), 1);
    assert_int_equal(kp__pop(0), 1);
    assert_int_equal(kp__pop(0), 0);
    assert_int_equal(kp__pop(0), -1); /* unbalanced pop: ignored */
    set_recording(0);

    n = pop_all();
    assert_int_equal(n, 3);
    a = find_rec(n, id_of("outer"));
    b = find_rec(n, id_of("inner"));
    c = find_rec(n, id_of("inner2"));
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(a->parent_id, 0);
    assert_int_equal(b->parent_id, a->range_id);
    assert_int_equal(c->parent_id, a->range_id);
    assert_true(a->range_id != 0 && b->range_id != a->range_id && c->range_id != b->range_id);
    assert_true(a->start_ns < b->start_ns && b->end_ns < c->start_ns && c->end_ns < a->end_ns);
    assert_int_equal(a->kind, KP_KIND_NVTX);
    assert_int_equal(a->flags, 0);
    assert_int_equal(a->domain, 0);
    assert_int_equal(a->seq, -1);
    assert_int_equal(a->op_id, -1);
    assert_int_equal(a->tid, kpi_tid());
    /* CUPTI saw outer, inner, inner2 in push order, and as many pops. */
    assert_int_equal(n_cupti_push, 3);
    assert_int_equal(n_cupti_pop, 3);
    assert_int_equal(cupti_pushed[0], a->range_id);
    assert_int_equal(cupti_pushed[1], b->range_id);
    assert_int_equal(cupti_pushed[2], c->range_id);
}

struct th_arg {
    char prefix[16];
    int ok;
};

static void *th_nest(void *p)
{
    struct th_arg *a = p;
    char buf[32];

    for (int i = 0; i < 50; i++) {
        snprintf(buf, sizeof(buf), "%s-outer", a->prefix);
        if (push_a(0, buf) != 0) {
            return NULL;
        }
        snprintf(buf, sizeof(buf), "%s-inner", a->prefix);
        if (push_a(0, buf) != 1 || kp__pop(0) != 1 || kp__pop(0) != 0) {
            return NULL;
        }
    }
    a->ok = 1;
    return NULL;
}

static void test_nvtx_threads(void **state)
{
    struct th_arg args[2] = { { "t0", 0 }, { "t1", 0 } };
    pthread_t th[2];
    size_t n;
    uint32_t outer[2], inner[2];

    set_recording(1);
    /* The main thread holds a range: other threads' ranges must not become its children. */
    push_a(0, "main");
    for (int t = 0; t < 2; t++) {
        assert_int_equal(pthread_create(&th[t], NULL, th_nest, &args[t]), 0);
    }
    for (int t = 0; t < 2; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(args[t].ok, 1);
    }
    kp__pop(0);
    set_recording(0);
    outer[0] = id_of("t0-outer");
    outer[1] = id_of("t1-outer");
    inner[0] = id_of("t0-inner");
    inner[1] = id_of("t1-inner");
    n = pop_all();
    assert_int_equal(n, 201);
    for (size_t i = 0; i < n; i++) {
        const struct kp_wire_range *r = &recs[i];

        if (r->name == outer[0] || r->name == outer[1]) {
            assert_int_equal(r->parent_id, 0);
        }
        else if (r->name == inner[0] || r->name == inner[1]) {
            /* Its parent is an outer range of the same thread. */
            const struct kp_wire_range *p = NULL;

            for (size_t j = 0; j < n; j++) {
                if (recs[j].range_id == r->parent_id) {
                    p = &recs[j];
                }
            }
            assert_non_null(p);
            assert_int_equal(p->tid, r->tid);
            assert_int_equal(p->name, r->name == inner[0] ? outer[0] : outer[1]);
        }
        else {
            assert_int_equal(r->name, id_of("main"));
        }
    }
    assert_int_equal(n_cupti_push, n_cupti_pop);
}

static void test_nvtx_parse(void **state)
{
    static const struct {
        const char *msg, *name, *shapes;
        int64_t seq, op_id;
        uint32_t kind;
    } cases[] = {
        { "aten::addmm, seq = 12, op_id = 34, sizes = [[32, 64], [64, 128]], input_op_ids = "
          "[(1,0)]",
          "aten::addmm", "[[32, 64], [64, 128]]", 12, 34, KP_KIND_CPU_OP },
        { "aten::relu, seq = 3, op_id = 7", "aten::relu", NULL, 3, 7, KP_KIND_CPU_OP },
        { "aten::view, op_id = 5", "aten::view", NULL, -1, 5, KP_KIND_CPU_OP },
        { "aten::mm, seq = 9, op_id = 10, sizes = [[], [3]]", "aten::mm", "[[], [3]]", 9, 10,
          KP_KIND_CPU_OP },
        { "aten::empty, op_id = 11, input_op_ids = []", "aten::empty", NULL, -1, 11,
          KP_KIND_CPU_OP },
        { "forward", "forward", NULL, -1, -1, KP_KIND_NVTX },
        { "a, b, c", "a, b, c", NULL, -1, -1, KP_KIND_NVTX },
        { "ProfilerStep#41", "ProfilerStep#41", NULL, -1, -1, KP_KIND_PROFILER_STEP },
        { "ProfilerStep#42, op_id = 3", "ProfilerStep#42", NULL, -1, 3, KP_KIND_PROFILER_STEP },
        { "", NULL, NULL, -1, -1, KP_KIND_NVTX },
    };
    size_t n;
    const struct kp_wire_range *r;

    set_recording(1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        push_a(0, cases[i].msg);
        kp__pop(0);
        n = pop_all();
        assert_int_equal(n, 1);
        r = &recs[0];
        assert_name(r->name, cases[i].name);
        assert_name(r->shapes, cases[i].shapes);
        assert_int_equal(r->seq, cases[i].seq);
        assert_int_equal(r->op_id, cases[i].op_id);
        assert_int_equal(r->kind, cases[i].kind);
    }

    /* A registered string is parsed once and used by reference. */
    {
        const struct kp__reg *reg = kp__register_string("aten::bmm, seq = 5, sizes = [[2]]");
        struct kp__in in;

        assert_non_null(reg);
        kp__in_attr(&in, KP_MSG_REGISTERED, reg);
        kp__push(0, &in);
        kp__pop(0);
        /* Unicode messages are ignored: a nameless range that still nests. */
        kp__in_attr(&in, 2, L"wide");
        kp__push(0, &in);
        kp__pop(0);
        /* A registered handle we never gave out is ignored too. */
        kp__in_attr(&in, KP_MSG_REGISTERED, &in);
        kp__push(0, &in);
        kp__pop(0);
    }
    n = pop_all();
    assert_int_equal(n, 3);
    assert_name(recs[0].name, "aten::bmm");
    assert_name(recs[0].shapes, "[[2]]");
    assert_int_equal(recs[0].seq, 5);
    assert_int_equal(recs[0].kind, KP_KIND_CPU_OP);
    assert_int_equal(recs[1].name, 0);
    assert_int_equal(recs[2].name, 0);
    set_recording(0);
    pop_all();
}

static void test_nvtx_dormant(void **state)
{
    uint32_t names = (uint32_t) atomic_load(&kpi_nvtx_counters.names);

    /* Dormant: depth only; no records, no CUPTI, no new strings. */
    assert_int_equal(push_a(0, "dormant-only-name"), 0);
    assert_int_equal(push_a(0, "dormant-only-name2, seq = 1"), 1);
    assert_int_equal(kp__pop(0), 1);
    assert_int_equal(kp__pop(0), 0);
    mark_a(0, "dormant-mark");
    assert_int_equal(kp__range_start(0, &(struct kp__in){ "x", 1, NULL }), 0);
    assert_int_equal(pop_all(), 0);
    assert_int_equal(n_cupti_push, 0);
    assert_int_equal(n_cupti_pop, 0);
    assert_int_equal(atomic_load(&kpi_nvtx_counters.names), names);
}

static void test_nvtx_pre_window(void **state)
{
    size_t n;
    const struct kp_wire_range *in, *pre;

    assert_int_equal(push_a(0, "opened-while-dormant"), 0);
    set_recording(1);
    assert_int_equal(push_a(0, "in-window"), 1);
    assert_int_equal(kp__pop(0), 1);
    assert_int_equal(kp__pop(0), 0);
    set_recording(0);

    n = pop_all();
    assert_int_equal(n, 2);
    in = find_rec(n, id_of("in-window"));
    pre = find_rec(n, 0);
    assert_non_null(in);
    assert_non_null(pre);
    assert_int_equal(in->flags, 0);
    assert_int_equal(pre->flags, KP_RANGE_PRE_WINDOW);
    assert_true(pre->range_id != 0);
    assert_int_equal(in->parent_id, pre->range_id); /* the dormant frame got its id lazily */
    assert_true(pre->start_ns <= in->start_ns && pre->end_ns >= in->end_ns);
    /* Only the in-window range went to CUPTI. */
    assert_int_equal(n_cupti_push, 1);
    assert_int_equal(n_cupti_pop, 1);
    assert_int_equal(cupti_pushed[0], in->range_id);
}

static void test_nvtx_stop_mid_range(void **state)
{
    size_t n;
    const struct kp_wire_range *a, *b;
    int64_t stop_ns;

    set_recording(1);
    push_a(0, "spans-stop-outer");
    push_a(0, "spans-stop-inner");
    set_recording(0);
    stop_ns = atomic_load(&g_nvtx.stop_ns);
    /* The inner pop after the stop: its own record (real end), and the outer one, still open
     * from before the stop, is emitted UNCLOSED at the stop time. */
    kp__pop(0);
    n = pop_all();
    assert_int_equal(n, 2);
    a = find_rec(n, id_of("spans-stop-outer"));
    b = find_rec(n, id_of("spans-stop-inner"));
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(b->flags, 0);
    assert_true(b->end_ns > stop_ns);
    assert_int_equal(b->parent_id, a->range_id);
    assert_int_equal(a->flags, KP_RANGE_UNCLOSED);
    assert_int_equal(a->end_ns, stop_ns);
    /* The outer pop: no second record, but CUPTI is still popped (balanced). */
    kp__pop(0);
    assert_int_equal(pop_all(), 0);
    assert_int_equal(n_cupti_push, 2);
    assert_int_equal(n_cupti_pop, 2);
}

static void test_nvtx_steps(void **state)
{
    unsigned kd, kd2, other;
    size_t n;

    /* Dormant step range: the step is reported, nothing else. */
    assert_int_equal(push_a(0, "ProfilerStep#7"), 0);
    assert_int_equal(n_steps, 1);
    assert_int_equal(steps[0].step, 7);
    assert_int_equal(steps[0].source, KP_STEP_NVTX_RANGE);
    assert_true(steps[0].ts > 0);
    kp__pop(0);
    push_a(0, "ProfilerStep#"); /* no number */
    kp__pop(0);
    push_a(0, "ProfilerStepX#8"); /* not the prefix */
    kp__pop(0);
    push_a(0, "xProfilerStep#8"); /* not at the start */
    kp__pop(0);
    assert_int_equal(n_steps, 1);

    /* Marks "step N" in the domain "kprof" only. */
    kd = kp__domain_create("kprof");
    kd2 = kp__domain_create("kprof");
    other = kp__domain_create("my-domain");
    assert_true(kd != 0);
    assert_int_equal(kd, kd2);
    assert_true(other != kd && other != 0);
    mark_a(kd, "step 9");
    mark_a(other, "step 10");
    mark_a(0, "step 11");
    mark_a(kd, "step x");
    assert_int_equal(n_steps, 2);
    assert_int_equal(steps[1].step, 9);
    assert_int_equal(steps[1].source, KP_STEP_NVTX_MARK);

    /* A step range in another domain counts too; recording: kind PROFILER_STEP. */
    set_recording(1);
    push_a(other, "ProfilerStep#12");
    assert_int_equal(n_steps, 3);
    assert_int_equal(steps[2].step, 12);
    kp__pop(other);
    set_recording(0);
    n = pop_all();
    assert_int_equal(n, 1);
    assert_int_equal(recs[0].kind, KP_KIND_PROFILER_STEP);
    assert_name(recs[0].name, "ProfilerStep#12");
    assert_name(recs[0].domain, "my-domain");

    /* A dormant step range popped while recording: PRE_WINDOW, its name rebuilt. */
    push_a(0, "ProfilerStep#13");
    set_recording(1);
    kp__pop(0);
    set_recording(0);
    n = pop_all();
    assert_int_equal(n, 1);
    assert_int_equal(recs[0].flags, KP_RANGE_PRE_WINDOW);
    assert_int_equal(recs[0].kind, KP_KIND_PROFILER_STEP);
    assert_name(recs[0].name, "ProfilerStep#13");
    assert_int_equal(recs[0].start_ns, steps[3].ts);
}

static void test_nvtx_deep(void **state)
{
    uint64_t ovf = atomic_load(&g_nvtx.overflow_pushes);
    size_t n;
    char buf[32];

    set_recording(1);
    for (int i = 0; i < 200; i++) {
        snprintf(buf, sizeof(buf), "deep-%d", i);
        assert_int_equal(push_a(0, buf), i);
    }
    assert_int_equal(atomic_load(&g_nvtx.overflow_pushes) - ovf, 200 - KP_NVTX_FRAMES);
    for (int i = 199; i >= 0; i--) {
        assert_int_equal(kp__pop(0), i);
    }
    assert_int_equal(kp__pop(0), -1);
    set_recording(0);
    n = pop_all();
    assert_int_equal(n, KP_NVTX_FRAMES);
    assert_int_equal(n_cupti_push, KP_NVTX_FRAMES);
    assert_int_equal(n_cupti_pop, KP_NVTX_FRAMES);
    /* The innermost recorded range is the last frame-backed one, parent its predecessor. */
    assert_name(recs[0].name, "deep-127");
    assert_int_equal(recs[0].parent_id, recs[1].range_id);

    /* Overflow in one domain does not disturb another; frames freed are reused. */
    set_recording(1);
    for (int i = 0; i < 130; i++) {
        push_a(0, "fill");
    }
    {
        unsigned d = kp__domain_create("side");

        push_a(d, "side-range"); /* no frame left: depth only */
        kp__pop(0);              /* frees a frame in domain 0 (an overflowed push first) */
        kp__pop(0);
        kp__pop(0);          /* this one frees a real frame */
        push_a(d, "side-2"); /* gets the freed frame above the frameless one */
        assert_int_equal(kp__pop(d), 1);
        assert_int_equal(kp__pop(d), 0);
    }
    for (int i = 0; i < 127; i++) {
        kp__pop(0);
    }
    assert_int_equal(kp__pop(0), -1);
    set_recording(0);
    n = pop_all();
    assert_int_equal(n, KP_NVTX_FRAMES + 1); /* 128 "fill" + "side-2" */
    assert_non_null(find_rec(n, id_of("side-2")));
    assert_null(find_rec(n, id_of("side-range")));
    assert_int_equal(n_cupti_push, n_cupti_pop);
}

static void test_nvtx_domains_interleave(void **state)
{
    unsigned d1 = kp__domain_create("dom-one");
    size_t n;
    const struct kp_wire_range *a, *x, *m;

    set_recording(1);
    push_a(d1, "in-d1");
    push_a(0, "in-default");
    mark_a(0, "a-mark");
    assert_int_equal(kp__pop(d1), 0); /* not LIFO across domains: fine */
    assert_int_equal(kp__pop(0), 0);
    set_recording(0);
    n = pop_all();
    assert_int_equal(n, 3);
    a = find_rec(n, id_of("in-d1"));
    x = find_rec(n, id_of("in-default"));
    m = find_rec(n, id_of("a-mark"));
    assert_non_null(a);
    assert_non_null(x);
    assert_non_null(m);
    assert_int_equal(a->parent_id, 0);
    assert_int_equal(x->parent_id, 0); /* stacks are per domain */
    assert_name(a->domain, "dom-one");
    assert_int_equal(x->domain, 0);
    assert_int_equal(m->start_ns, m->end_ns);
    assert_int_equal(m->parent_id, x->range_id);
    assert_int_equal(n_cupti_push, 2);
    assert_int_equal(n_cupti_pop, 2);
}

static void *th_range_end(void *p)
{
    kp__range_end(*(uint64_t *) p);
    return NULL;
}

static void test_nvtx_start_end(void **state)
{
    struct kp__in in;
    uint64_t id, id2;
    pthread_t th;
    size_t n;

    set_recording(1);
    push_a(0, "enclosing");
    kp__in_ascii(&in, "async-range");
    id = kp__range_start(0, &in);
    assert_true(id != 0);
    kp__pop(0);
    /* Ended on another thread. */
    assert_int_equal(pthread_create(&th, NULL, th_range_end, &id), 0);
    pthread_join(th, NULL);
    kp__range_end(id); /* a second end of the same id: nothing */
    kp__range_end(12345678);
    id2 = kp__range_start(0, &in);
    set_recording(0);
    kp__range_end(id2); /* ends after the window: still recorded */
    n = pop_all();
    assert_int_equal(n, 3);
    assert_int_equal(recs[1].range_id, id);
    assert_name(recs[1].name, "async-range");
    assert_int_equal(recs[1].parent_id, 0);
    assert_int_equal(recs[1].kind, KP_KIND_NVTX);
    assert_int_equal(recs[1].tid, kpi_tid());
    assert_true(recs[1].end_ns > recs[1].start_ns);
    assert_int_equal(recs[2].range_id, id2);
    assert_int_equal(n_cupti_push, 1); /* only "enclosing" */

    /* A range that never ends is forgotten when the next window starts. */
    set_recording(1);
    id = kp__range_start(0, &in);
    set_recording(0);
    set_recording(1);
    kp__range_end(id);
    set_recording(0);
    assert_int_equal(pop_all(), 0);
}

static void test_nvtx_forked(void **state)
{
    set_recording(1);
    atomic_store(&kpi_forked_flag, 1);
    assert_int_equal(push_a(0, "ProfilerStep#99"), 0);
    mark_a(0, "m");
    assert_int_equal(kp__pop(0), 0);
    atomic_store(&kpi_forked_flag, 0);
    set_recording(0);
    assert_int_equal(pop_all(), 0);
    assert_int_equal(n_cupti_push, 0);
    assert_int_equal(n_steps, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intern_basic),
        cmocka_unit_test(test_intern_truncate),
        cmocka_unit_test(test_intern_concurrent),
        cmocka_unit_test(test_intern_overflow),
        cmocka_unit_test(test_ring_wrap),
        cmocka_unit_test(test_ring_full),
        cmocka_unit_test(test_ring_mpsc),
        cmocka_unit_test_setup(test_nvtx_nesting, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_threads, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_parse, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_dormant, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_pre_window, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_stop_mid_range, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_steps, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_deep, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_domains_interleave, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_start_end, nvtx_setup),
        cmocka_unit_test_setup(test_nvtx_forked, nvtx_setup),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
