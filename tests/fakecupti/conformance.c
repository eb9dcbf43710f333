/*
 * test_fakecupti_conformance: the fake libcupti against the real one, and the fake's own
 * behaviour.
 *
 * usage: test_fakecupti_conformance FAKE_SO [REAL_SO]
 *
 * Both libraries are dlopen'ed RTLD_LOCAL (neither interposes on the other). With the real
 * library (no GPU needed) it checks that cuptiActivityGetNextRecord walks identical buffers
 * identically: hand-built buffers of every kind the fake emits, at every valid size, with
 * unknown kinds inside, and every buffer the fake delivers while it is exercised. The fake's
 * own checks (enabled kinds, external correlation stacks, buffers filling and flushing,
 * declined buffers and the dropped count, error injection, incomplete kernels, names freed
 * after their buffer is reused, per-thread buffers) always run. Exit 0 pass, 1 fail, 77 skip
 * (fake checks passed but the real libcupti cannot be loaded). FAKECUPTI_ASYNC=1 in the
 * environment: expects full buffers to be completed on the fake's worker thread.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fakecupti.h"

#define CF_MAX_BUFS 4096
#define CF_MAX_RECS 4096

/* Functions of the fake, by dlsym, typed from the headers. */
#define CF_FAKE_FUNCS(X)                      \
    X(cuptiGetVersion)                        \
    X(cuptiGetResultString)                   \
    X(cuptiActivityRegisterCallbacks)         \
    X(cuptiActivitySetAttribute)              \
    X(cuptiActivityEnable)                    \
    X(cuptiActivityDisable)                   \
    X(cuptiActivityFlushAll)                  \
    X(cuptiActivityGetNextRecord)             \
    X(cuptiActivityGetNumDroppedRecords)      \
    X(cuptiActivityPushExternalCorrelationId) \
    X(cuptiActivityPopExternalCorrelationId)  \
    X(cuptiSetThreadIdType)                   \
    X(cuptiGetTimestamp)                      \
    X(cuptiActivityEnableRuntimeApi)          \
    X(cuptiActivityEnableDriverApi)           \
    X(cuptiGetCallbackName)                   \
    X(cuptiFinalize)                          \
    X(fakecupti_launch_kernel)                \
    X(fakecupti_memcpy)                       \
    X(fakecupti_memset)                       \
    X(fakecupti_sync)                         \
    X(fakecupti_overhead)                     \
    X(fakecupti_last_written)                 \
    X(fakecupti_enabled_kinds)                \
    X(fakecupti_enable_calls)                 \
    X(fakecupti_ext_depth)                    \
    X(fakecupti_stats)                        \
    X(fakecupti_set_fail_enable)              \
    X(fakecupti_set_incomplete_every)

static struct {
#define CF_X(n) __typeof__(&n) n;
    CF_FAKE_FUNCS(CF_X)
#undef CF_X
} F;

static struct {
    __typeof__(&cuptiActivityGetNextRecord) next;
    __typeof__(&cuptiGetResultString) result_string;
    __typeof__(&cuptiGetCallbackName) callback_name;
} R;
static int g_have_real;

static int g_fail;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            g_fail++;                                                                \
        }                                                                            \
    } while (0)

#define CHECK_EQ(a, b)                                                                            \
    do {                                                                                          \
        long long cf_a_ = (long long) (a), cf_b_ = (long long) (b);                               \
        if (cf_a_ != cf_b_) {                                                                     \
            fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n", __FILE__, __LINE__, \
                    #a, #b, cf_a_, cf_b_);                                                        \
            g_fail++;                                                                             \
        }                                                                                         \
    } while (0)

/* ---- the test's buffer callbacks (what the library does, minimally) ---- */

struct cf_buf {
    uint8_t *buf;
    size_t size, valid;
    pid_t tid; /* thread that ran the complete callback */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cf_buf g_bufs[CF_MAX_BUFS]; /* delivered, in order */
static size_t g_nbufs;
static uint8_t *g_reuse; /* next request hands out this (already delivered) memory */
static size_t g_buf_size = 64 * 1024;
static size_t g_max_records; /* maxNumRecords to ask for */
static int g_decline;        /* answer requests with NULL */
static int g_flush_in_cb;    /* call FlushAll from the next complete callback */
static CUptiResult g_flush_in_cb_rc = CUPTI_SUCCESS;

static void cf_request(uint8_t **buffer, size_t *size, size_t *max_records)
{
    pthread_mutex_lock(&g_mu);
    if (g_decline) {
        *buffer = NULL;
        *size = 0;
    }
    else if (g_reuse) {
        *buffer = g_reuse;
        *size = g_buf_size;
        g_reuse = NULL;
    }
    else {
        *buffer = aligned_alloc(8, g_buf_size);
        *size = g_buf_size;
        if (*buffer) {
            memset(*buffer, 0, g_buf_size);
        }
    }
    *max_records = g_max_records;
    pthread_mutex_unlock(&g_mu);
}

static void cf_complete(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    int flush = 0;

    pthread_mutex_lock(&g_mu);
    if (g_nbufs < CF_MAX_BUFS) {
        g_bufs[g_nbufs].buf = buffer;
        g_bufs[g_nbufs].size = size;
        g_bufs[g_nbufs].valid = valid;
        g_bufs[g_nbufs].tid = (pid_t) syscall(SYS_gettid);
        g_nbufs++;
    }
    flush = g_flush_in_cb;
    g_flush_in_cb = 0;
    pthread_mutex_unlock(&g_mu);
    if (flush) {
        g_flush_in_cb_rc = F.cuptiActivityFlushAll(0);
    }
}

/* Forgets the delivered buffers (frees them unless one is kept for reuse). */
static void cf_bufs_reset(const uint8_t *keep)
{
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_nbufs; i++) {
        if (g_bufs[i].buf != keep) {
            free(g_bufs[i].buf);
        }
    }
    g_nbufs = 0;
    pthread_mutex_unlock(&g_mu);
}

/* ---- walking ---- */

struct cf_walk {
    size_t n;
    size_t off[CF_MAX_RECS];
    uint32_t kind[CF_MAX_RECS];
    CUptiResult end; /* the result that ended the walk */
};

static void cf_walk(__typeof__(&cuptiActivityGetNextRecord) next, uint8_t *buf, size_t valid,
                    struct cf_walk *w)
{
    CUpti_Activity *r = NULL;
    CUptiResult rc;

    w->n = 0;
    while ((rc = next(buf, valid, &r)) == CUPTI_SUCCESS && w->n < CF_MAX_RECS) {
        w->off[w->n] = (size_t) ((uint8_t *) r - buf);
        w->kind[w->n] = r->kind;
        w->n++;
    }
    w->end = rc;
}

static struct cf_walk g_wf, g_wr;

/* Walks buf with the fake and (if loaded) the real iterator; the walks must agree. Leaves the
 * fake's walk in g_wf. Returns the number of records. */
static size_t cf_walk_both(uint8_t *buf, size_t valid, const char *what)
{
    cf_walk(F.cuptiActivityGetNextRecord, buf, valid, &g_wf);
    if (!g_have_real) {
        return g_wf.n;
    }
    cf_walk(R.next, buf, valid, &g_wr);
    if (g_wf.n != g_wr.n || g_wf.end != g_wr.end ||
        memcmp(g_wf.off, g_wr.off, g_wf.n * sizeof(g_wf.off[0])) ||
        memcmp(g_wf.kind, g_wr.kind, g_wf.n * sizeof(g_wf.kind[0]))) {
        fprintf(stderr,
                "conformance: %s (valid=%zu): fake walked %zu records (end %d), real %zu (end "
                "%d)\n",
                what, valid, g_wf.n, g_wf.end, g_wr.n, g_wr.end);
        for (size_t i = 0; i < g_wf.n || i < g_wr.n; i++) {
            fprintf(stderr, "  #%zu fake off=%zd kind=%d | real off=%zd kind=%d\n", i,
                    i < g_wf.n ? (ssize_t) g_wf.off[i] : -1, i < g_wf.n ? (int) g_wf.kind[i] : -1,
                    i < g_wr.n ? (ssize_t) g_wr.off[i] : -1, i < g_wr.n ? (int) g_wr.kind[i] : -1);
            if (i > 20) {
                break;
            }
        }
        g_fail++;
    }
    return g_wf.n;
}

/* ---- the real iterator vs the fake on hand-built buffers ---- */

static const uint32_t cf_emitted_kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_KERNEL,
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
    CUPTI_ACTIVITY_KIND_OVERHEAD,
};

static size_t cf_struct_size(uint32_t kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL:
        return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_RUNTIME:
        return sizeof(CUpti_ActivityAPI);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
        return sizeof(CUpti_ActivityExternalCorrelation);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
        return sizeof(CUpti_ActivityMemset4);
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
        return sizeof(CUpti_ActivitySynchronization2);
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
        return sizeof(CUpti_ActivityOverhead3);
    default:
        return 0;
    }
}

static void test_handbuilt(void)
{
    static uint8_t buf[8192] __attribute__((aligned(8)));
    size_t n = sizeof(cf_emitted_kinds) / sizeof(cf_emitted_kinds[0]), total = 0, k;
    static const uint32_t bad[] = { 0, 6, 7, 14, 21, 999, 0x7ffffffe };

    /* Every emitted kind twice, packed at its struct size, with non-zero payload. */
    memset(buf, 0xab, sizeof(buf));
    for (size_t rep = 0; rep < 2; rep++) {
        for (size_t i = 0; i < n; i++) {
            memcpy(buf + total, &cf_emitted_kinds[i], sizeof(uint32_t));
            total += cf_struct_size(cf_emitted_kinds[i]);
        }
    }
    memset(buf + total, 0, sizeof(buf) - total);
    CHECK_EQ(cf_walk_both(buf, total, "all kinds"), 2 * n);
    CHECK_EQ(g_wf.end, CUPTI_ERROR_MAX_LIMIT_REACHED);
    for (size_t i = 0; i < g_wf.n; i++) {
        CHECK_EQ(g_wf.kind[i], cf_emitted_kinds[i % n]);
    }
    /* Every valid size, including sizes that cut a record and sizes past the end (zeroed
     * bytes there: kind 0 is invalid). */
    for (size_t v = 0; v <= total + 16; v++) {
        cf_walk_both(buf, v, "all kinds, truncated");
    }
    /* An unknown kind in the middle. */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t at = cf_struct_size(cf_emitted_kinds[0]) + cf_struct_size(cf_emitted_kinds[1]);
        uint32_t saved;

        memcpy(&saved, buf + at, sizeof(saved));
        memcpy(buf + at, &bad[i], sizeof(bad[i]));
        CHECK_EQ(cf_walk_both(buf, total, "unknown kind inside"), 2);
        CHECK_EQ(g_wf.end, CUPTI_ERROR_INVALID_KIND);
        memcpy(buf, &bad[i], sizeof(bad[i])); /* and first */
        CHECK_EQ(cf_walk_both(buf, total, "unknown kind first"), 0);
        CHECK_EQ(g_wf.end, CUPTI_ERROR_INVALID_KIND);
        memcpy(buf, &cf_emitted_kinds[0], sizeof(uint32_t));
        memcpy(buf + at, &saved, sizeof(saved));
    }
    /* Strides: every kind the fake knows, the real one knows with the same stride. */
    for (k = 0; g_have_real && k < 80; k++) {
        static uint8_t kb[65536] __attribute__((aligned(8)));
        CUpti_Activity *rf = NULL, *rr = NULL;
        CUptiResult f1, f2, r1, r2;

        for (size_t o = 0; o < sizeof(kb); o += 4) {
            memcpy(kb + o, &k, sizeof(uint32_t));
        }
        f1 = F.cuptiActivityGetNextRecord(kb, sizeof(kb), &rf);
        r1 = R.next(kb, sizeof(kb), &rr);
        if (f1 != CUPTI_SUCCESS) {
            continue; /* unknown to the fake: it answers INVALID_KIND (the library skips) */
        }
        f2 = F.cuptiActivityGetNextRecord(kb, sizeof(kb), &rf);
        r2 = r1 == CUPTI_SUCCESS ? R.next(kb, sizeof(kb), &rr) : r1;
        if (r1 != CUPTI_SUCCESS || f2 != r2 || rf != rr) {
            fprintf(stderr, "conformance: kind %zu: fake stride %td, real %s%td\n", k,
                    (uint8_t *) rf - kb, r1 ? "rejects it " : "", rr ? (uint8_t *) rr - kb : -1);
            g_fail++;
        }
    }
    /* Bad parameters. */
    {
        CUpti_Activity *r = NULL;

        CHECK_EQ(F.cuptiActivityGetNextRecord(NULL, 10, &r), CUPTI_ERROR_INVALID_PARAMETER);
        CHECK_EQ(F.cuptiActivityGetNextRecord(buf, 10, NULL), CUPTI_ERROR_INVALID_PARAMETER);
        if (g_have_real) {
            CHECK_EQ(R.next(NULL, 10, &r), CUPTI_ERROR_INVALID_PARAMETER);
        }
    }
}

static void test_result_strings(void)
{
    static const int codes[] = { 0, 1, 12, 15, 18, 21, 26, 35, 38, 39, 46, 999, 500, 12345 };

    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        const char *f = NULL, *r = NULL;
        CUptiResult fr = F.cuptiGetResultString((CUptiResult) codes[i], &f);

        CHECK(f != NULL);
        if (g_have_real) {
            CUptiResult rr = R.result_string((CUptiResult) codes[i], &r);

            CHECK_EQ(fr, rr);
            if (f && r && strcmp(f, r)) {
                fprintf(stderr, "conformance: result %d: fake '%s', real '%s'\n", codes[i], f, r);
                g_fail++;
            }
        }
    }
    for (uint32_t cbid = 0; g_have_real && cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE; cbid++) {
        const char *f = NULL, *r = NULL;

        if (F.cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &f) == CUPTI_SUCCESS) {
            CHECK_EQ(R.callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &r), CUPTI_SUCCESS);
            CHECK(r && f && strcmp(f, r) == 0);
        }
    }
}

/* ---- the fake's behaviour ---- */

static const CUpti_ActivityKind cf_trace_kinds[] = {
    CUPTI_ACTIVITY_KIND_RUNTIME,         CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,          CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_OVERHEAD,
};

static void cf_enable_all(int on)
{
    for (size_t i = 0; i < sizeof(cf_trace_kinds) / sizeof(cf_trace_kinds[0]); i++) {
        CHECK_EQ(on ? F.cuptiActivityEnable(cf_trace_kinds[i])
                    : F.cuptiActivityDisable(cf_trace_kinds[i]),
                 CUPTI_SUCCESS);
    }
}

static uint32_t cf_kernel(const char *name, uint32_t device)
{
    struct fakecupti_kernel k;

    memset(&k, 0, sizeof(k));
    k.name = name;
    k.device = device;
    k.context = 1;
    k.stream = 7;
    k.grid_x = 4;
    k.grid_y = k.grid_z = 1;
    k.block_x = 128;
    k.block_y = k.block_z = 1;
    k.registers = 32;
    return F.fakecupti_launch_kernel(&k);
}

/* Counts records of a kind over all delivered buffers (walking them with both iterators). */
static size_t cf_count(uint32_t kind)
{
    size_t n = 0;

    for (size_t b = 0; b < g_nbufs; b++) {
        cf_walk_both(g_bufs[b].buf, g_bufs[b].valid, "delivered buffer");
        for (size_t i = 0; i < g_wf.n; i++) {
            n += g_wf.kind[i] == kind;
        }
    }
    return n;
}

/* Finds the first delivered record of a kind whose correlation id field matches. */
static const void *cf_find(uint32_t kind, uint32_t corr)
{
    for (size_t b = 0; b < g_nbufs; b++) {
        CUpti_Activity *r = NULL;

        while (F.cuptiActivityGetNextRecord(g_bufs[b].buf, g_bufs[b].valid, &r) == CUPTI_SUCCESS) {
            uint32_t c = 0;

            if (r->kind != kind) {
                continue;
            }
            switch (kind) {
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
            case CUPTI_ACTIVITY_KIND_KERNEL:
                c = ((CUpti_ActivityKernel10 *) r)->correlationId;
                break;
            case CUPTI_ACTIVITY_KIND_RUNTIME:
                c = ((CUpti_ActivityAPI *) r)->correlationId;
                break;
            case CUPTI_ACTIVITY_KIND_MEMCPY:
                c = ((CUpti_ActivityMemcpy6 *) r)->correlationId;
                break;
            case CUPTI_ACTIVITY_KIND_MEMSET:
                c = ((CUpti_ActivityMemset4 *) r)->correlationId;
                break;
            case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
                c = ((CUpti_ActivitySynchronization2 *) r)->correlationId;
                break;
            case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
                c = ((CUpti_ActivityExternalCorrelation *) r)->correlationId;
                break;
            default:
                break;
            }
            if (c == corr) {
                return r;
            }
        }
    }
    return NULL;
}

static void test_dormant_and_stacks(void)
{
    uint32_t v = 0;
    uint64_t id = 0;
    struct fakecupti_stats st;

    CHECK_EQ(F.cuptiGetVersion(&v), CUPTI_SUCCESS);
    CHECK_EQ(v, getenv("FAKECUPTI_VERSION") ? strtoul(getenv("FAKECUPTI_VERSION"), NULL, 0)
                                            : FAKECUPTI_DEFAULT_VERSION);
    CHECK_EQ(F.cuptiActivityRegisterCallbacks(NULL, cf_complete), CUPTI_ERROR_INVALID_PARAMETER);
    CHECK_EQ(F.cuptiActivityRegisterCallbacks(cf_request, cf_complete), CUPTI_SUCCESS);

    /* Nothing enabled: nothing written, no buffer requested. */
    CHECK_EQ(F.fakecupti_enabled_kinds(), 0);
    CHECK(cf_kernel("dormant", 0) > 0);
    CHECK_EQ(F.fakecupti_last_written(), 0);
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    F.fakecupti_stats(&st);
    CHECK_EQ(st.records_total, 0);
    CHECK_EQ(st.buffers_requested, 0);
    CHECK_EQ(st.enable_calls, 0);
    CHECK_EQ(g_nbufs, 0);

    /* External correlation stacks, per kind. */
    CHECK_EQ(F.cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, &id),
             CUPTI_ERROR_QUEUE_EMPTY);
    CHECK_EQ(F.cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, 5),
             CUPTI_SUCCESS);
    CHECK_EQ(F.cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, 6),
             CUPTI_SUCCESS);
    CHECK_EQ(F.cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, 9),
             CUPTI_SUCCESS);
    CHECK_EQ(F.cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_INVALID, 1),
             CUPTI_ERROR_INVALID_PARAMETER);
    CHECK_EQ(F.fakecupti_ext_depth(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2), 2);
    CHECK_EQ(F.fakecupti_ext_depth(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1), 0);
    CHECK_EQ(F.cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, &id),
             CUPTI_SUCCESS);
    CHECK_EQ(id, 6);
    CHECK_EQ(F.fakecupti_ext_depth(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2), 1);
    /* Left: CUSTOM2 = [5], CUSTOM0 = [9] for the next test. */

    /* Enabling: error injection, bad kinds. */
    F.fakecupti_set_fail_enable(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES);
    CHECK_EQ(F.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME),
             CUPTI_ERROR_INSUFFICIENT_PRIVILEGES);
    CHECK_EQ(F.fakecupti_enabled_kinds(), 0);
    F.fakecupti_set_fail_enable(CUPTI_SUCCESS);
    CHECK_EQ(F.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_METRIC), CUPTI_ERROR_INVALID_KIND);
    CHECK_EQ(F.fakecupti_enable_calls(), 2);
}

static void test_emit_all(void)
{
    struct fakecupti_memcpy mc;
    struct fakecupti_memset ms;
    struct fakecupti_sync sy;
    const CUpti_ActivityKernel10 *k;
    const CUpti_ActivityAPI *api;
    const CUpti_ActivityExternalCorrelation *ec;
    const CUpti_ActivitySynchronization2 *s2;
    const CUpti_ActivityMemcpy6 *m6;
    uint32_t ck, cm, cs, cy;
    uint64_t now, mask = 0;
    int64_t t0;

    cf_enable_all(1);
    for (size_t i = 0; i < sizeof(cf_trace_kinds) / sizeof(cf_trace_kinds[0]); i++) {
        mask |= 1ull << cf_trace_kinds[i];
    }
    CHECK_EQ(F.fakecupti_enabled_kinds(), mask);
    CHECK_EQ(F.cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM), CUPTI_SUCCESS);
    CHECK_EQ(F.cuptiGetTimestamp(&now), CUPTI_SUCCESS);
    t0 = (int64_t) now;

    ck = cf_kernel("k1", 0);
    CHECK_EQ(F.fakecupti_last_written(), FAKECUPTI_W_API | FAKECUPTI_W_GPU | FAKECUPTI_W_EXTCORR);
    memset(&mc, 0, sizeof(mc));
    mc.copy_kind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    mc.bytes = 4096;
    mc.device = 1;
    cm = F.fakecupti_memcpy(&mc);
    memset(&ms, 0, sizeof(ms));
    ms.bytes = 512;
    ms.t.start_ns = 100;
    ms.t.end_ns = 200;
    cs = F.fakecupti_memset(&ms);
    memset(&sy, 0, sizeof(sy));
    sy.stream = 13;
    cy = F.fakecupti_sync(&sy);
    CHECK_EQ(F.fakecupti_overhead(CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH, t0, t0 + 10), 1);
    CHECK(ck && cm == ck + 1 && cs == cm + 1 && cy == cs + 1);
    CHECK_EQ(g_nbufs, 0); /* nothing full yet */
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    CHECK(g_nbufs >= 3); /* this thread's API buffer, device 0, device 1 */

    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), 1);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_RUNTIME), 4);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), 8); /* 2 kinds x 4 calls */
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_MEMCPY), 1);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_MEMSET), 1);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION), 1);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_OVERHEAD), 1);

    k = cf_find(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, ck);
    api = cf_find(CUPTI_ACTIVITY_KIND_RUNTIME, ck);
    ec = cf_find(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, ck);
    CHECK(k && api && ec);
    if (k && api && ec) {
        CHECK(k->name && strcmp(k->name, "k1") == 0);
        CHECK_EQ(k->gridX, 4);
        CHECK_EQ(k->blockX, 128);
        CHECK_EQ(k->registersPerThread, 32);
        CHECK(k->start >= (uint64_t) t0 && k->end > k->start && k->completed == k->end);
        CHECK_EQ(api->cbid, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
        CHECK_EQ(api->threadId, (uint32_t) syscall(SYS_gettid));
        CHECK_EQ(api->processId, (uint32_t) getpid());
        CHECK(api->start >= (uint64_t) t0 && api->end >= api->start);
        /* Kinds in enum order: CUSTOM0 (9) then CUSTOM2 (5), before the API record. */
        CHECK_EQ(ec->externalKind, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
        CHECK_EQ(ec->externalId, 9);
        CHECK_EQ(ec[1].externalKind, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2);
        CHECK_EQ(ec[1].externalId, 5);
        CHECK((const void *) &ec[2] == (const void *) api);
    }
    m6 = cf_find(CUPTI_ACTIVITY_KIND_MEMCPY, cm);
    CHECK(m6 && m6->bytes == 4096 && m6->deviceId == 1 &&
          m6->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD);
    CHECK(cf_find(CUPTI_ACTIVITY_KIND_RUNTIME, cm) != NULL);
    CHECK(cf_find(CUPTI_ACTIVITY_KIND_MEMSET, cs) &&
          ((const CUpti_ActivityMemset4 *) cf_find(CUPTI_ACTIVITY_KIND_MEMSET, cs))->start == 100);
    s2 = cf_find(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, cy);
    api = cf_find(CUPTI_ACTIVITY_KIND_RUNTIME, cy);
    CHECK(s2 && api && (const void *) (api + 1) == (const void *) s2);
    CHECK(s2 && s2->streamId == 13 &&
          s2->type == CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE);
    CHECK(api && api->cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020);

    /* Switching a runtime cbid off drops its API and external correlation records. */
    CHECK_EQ(F.cuptiActivityEnableRuntimeApi(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, 0),
             CUPTI_SUCCESS);
    cf_kernel("k2", 0);
    CHECK_EQ(F.fakecupti_last_written(), FAKECUPTI_W_GPU);
    CHECK_EQ(F.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), CUPTI_SUCCESS); /* resets */
    cf_kernel("k3", 0);
    CHECK_EQ(F.fakecupti_last_written(), FAKECUPTI_W_API | FAKECUPTI_W_GPU | FAKECUPTI_W_EXTCORR);
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
}

static void test_names_freed_on_reuse(void)
{
    struct fakecupti_stats before, after;
    uint8_t *kbuf = NULL;

    /* Reuse the buffer that holds the kernels of test_emit_all (device 0). */
    for (size_t b = 0; b < g_nbufs && !kbuf; b++) {
        CUpti_Activity *r = NULL;

        while (F.cuptiActivityGetNextRecord(g_bufs[b].buf, g_bufs[b].valid, &r) == CUPTI_SUCCESS) {
            if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
                kbuf = g_bufs[b].buf;
                break;
            }
        }
    }
    CHECK(kbuf != NULL);
    cf_bufs_reset(kbuf);
    F.fakecupti_stats(&before);
    pthread_mutex_lock(&g_mu);
    memset(kbuf, 0, g_buf_size);
    g_reuse = kbuf;
    pthread_mutex_unlock(&g_mu);
    cf_kernel("k4", 0); /* the API buffer request gets kbuf */
    F.fakecupti_stats(&after);
    CHECK(after.names_freed >= before.names_freed + 1);
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    cf_bufs_reset(NULL);
}

static void test_full_buffers_and_drops(void)
{
    struct fakecupti_stats st0, st;
    size_t dropped = 0, kernels, nbufs;
    pid_t me = (pid_t) syscall(SYS_gettid);
    int async = getenv("FAKECUPTI_ASYNC") && atoi(getenv("FAKECUPTI_ASYNC")) != 0;
    int off_thread = 0;

    CHECK_EQ(F.cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped), CUPTI_SUCCESS);
    CHECK_EQ(dropped, 0);

    /* Small buffers: room for 3 kernels. 50 launches fill many; all arrive, in order. */
    g_buf_size = 3 * sizeof(CUpti_ActivityKernel10) + 8;
    for (int i = 0; i < 50; i++) {
        cf_kernel("fill", 2);
    }
    pthread_mutex_lock(&g_mu);
    nbufs = g_nbufs; /* delivered before any flush (async: maybe not yet) */
    pthread_mutex_unlock(&g_mu);
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    CHECK(async || nbufs >= 16);
    kernels = cf_count(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    CHECK_EQ(kernels, 50);
    for (size_t b = 0; b < g_nbufs; b++) {
        CHECK(g_bufs[b].valid <= g_bufs[b].size);
        off_thread += g_bufs[b].tid != me;
    }
    CHECK(async ? off_thread > 0 : off_thread == 0);
    cf_bufs_reset(NULL);

    /* maxNumRecords: at most 2 records per buffer. */
    g_buf_size = 64 * 1024;
    g_max_records = 2;
    for (int i = 0; i < 5; i++) {
        cf_kernel("max2", 3);
    }
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), 5);
    for (size_t b = 0; b < g_nbufs; b++) {
        CHECK(g_bufs[b].valid <= 2 * sizeof(CUpti_ActivityKernel10));
    }
    g_max_records = 0;
    cf_bufs_reset(NULL);

    /* Declined buffers: records dropped and counted; the count resets on read. */
    F.fakecupti_stats(&st0);
    g_decline = 1;
    for (int i = 0; i < 5; i++) {
        cf_kernel("declined", 4);
        CHECK(F.fakecupti_last_written() & FAKECUPTI_W_DROPPED);
    }
    g_decline = 0;
    F.fakecupti_stats(&st);
    CHECK(st.buffers_declined >= st0.buffers_declined + 5);
    /* Per launch: kernel, API, 2 external correlation records. */
    CHECK_EQ(st.dropped - st0.dropped, 20);
    CHECK_EQ(F.cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped), CUPTI_SUCCESS);
    CHECK_EQ(dropped, 20);
    CHECK_EQ(F.cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped), CUPTI_SUCCESS);
    CHECK_EQ(dropped, 0);
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    CHECK_EQ(g_nbufs, 0);

    /* Incomplete kernels. */
    F.fakecupti_set_incomplete_every(2);
    for (int i = 0; i < 4; i++) {
        cf_kernel("maybe", 5);
    }
    F.fakecupti_set_incomplete_every(0);
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    {
        size_t zero = 0, n = 0;

        for (size_t b = 0; b < g_nbufs; b++) {
            CUpti_Activity *r = NULL;

            while (F.cuptiActivityGetNextRecord(g_bufs[b].buf, g_bufs[b].valid, &r) ==
                   CUPTI_SUCCESS) {
                if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
                    const CUpti_ActivityKernel10 *k = (const void *) r;

                    n++;
                    zero += k->start == 0 && k->end == 0;
                }
            }
        }
        CHECK_EQ(n, 4);
        CHECK_EQ(zero, 2);
    }
    cf_bufs_reset(NULL);

    /* FlushAll from inside the complete callback is refused (no self-deadlock). */
    cf_kernel("reentrant", 0);
    g_flush_in_cb = 1;
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    CHECK_EQ(g_flush_in_cb_rc, CUPTI_ERROR_INVALID_OPERATION);
    cf_bufs_reset(NULL);
}

struct cf_thread_arg {
    pid_t tid;
    uint32_t first_corr;
};

static void *cf_thread_main(void *p)
{
    struct cf_thread_arg *a = p;

    a->tid = (pid_t) syscall(SYS_gettid);
    a->first_corr = cf_kernel("t", 6);
    for (int i = 0; i < 9; i++) {
        cf_kernel("t", 6);
    }
    /* This thread's stacks are its own: empty here. */
    if (F.fakecupti_ext_depth(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2) != 0) {
        a->tid = -1;
    }
    return NULL;
}

static void test_per_thread_buffers(void)
{
    struct cf_thread_arg a[2];
    pthread_t th[2];

    for (int i = 0; i < 2; i++) {
        CHECK_EQ(pthread_create(&th[i], NULL, cf_thread_main, &a[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].tid > 0);
    }
    CHECK_EQ(F.cuptiActivityFlushAll(0), CUPTI_SUCCESS);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_RUNTIME), 20);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), 0);
    /* Every API buffer holds one thread's records only. */
    for (size_t b = 0; b < g_nbufs; b++) {
        CUpti_Activity *r = NULL;
        uint32_t tid = 0;

        while (F.cuptiActivityGetNextRecord(g_bufs[b].buf, g_bufs[b].valid, &r) == CUPTI_SUCCESS) {
            if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
                uint32_t t = ((const CUpti_ActivityAPI *) r)->threadId;

                CHECK(tid == 0 || tid == t);
                CHECK(t == (uint32_t) a[0].tid || t == (uint32_t) a[1].tid);
                tid = t;
            }
        }
    }
    cf_bufs_reset(NULL);
}

static void test_finalize(void)
{
    cf_kernel("last", 0);
    CHECK_EQ(F.cuptiFinalize(), CUPTI_SUCCESS);
    CHECK_EQ(F.fakecupti_enabled_kinds(), 0);
    CHECK_EQ(cf_count(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), 1);
    cf_bufs_reset(NULL);
}

int main(int argc, char **argv)
{
    const char *real = argc > 2 ? argv[2] : "/usr/local/cuda/lib64/libcupti.so.13";
    void *fh, *rh;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FAKE_SO [REAL_SO]\n", argv[0]);
        return 2;
    }
    if (getenv("KP_REAL_CUPTI")) {
        real = getenv("KP_REAL_CUPTI");
    }
    fh = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!fh) {
        fprintf(stderr, "cannot load the fake %s: %s\n", argv[1], dlerror());
        return 1;
    }
#define CF_X(n)                                     \
    if (!(*(void **) &F.n = dlsym(fh, #n))) {       \
        fprintf(stderr, "the fake lacks %s\n", #n); \
        return 1;                                   \
    }
    CF_FAKE_FUNCS(CF_X)
#undef CF_X
    rh = dlopen(real, RTLD_NOW | RTLD_LOCAL);
    if (rh) {
        *(void **) &R.next = dlsym(rh, "cuptiActivityGetNextRecord");
        *(void **) &R.result_string = dlsym(rh, "cuptiGetResultString");
        *(void **) &R.callback_name = dlsym(rh, "cuptiGetCallbackName");
        g_have_real = R.next && R.result_string && R.callback_name;
    }
    if (!g_have_real) {
        fprintf(stderr, "note: real libcupti %s not usable (%s): fake-only checks\n", real,
                rh ? "symbols missing" : dlerror());
    }

    test_handbuilt();
    test_result_strings();
    test_dormant_and_stacks();
    test_emit_all();
    test_names_freed_on_reuse();
    test_full_buffers_and_drops();
    test_per_thread_buffers();
    test_finalize();

    if (g_fail) {
        fprintf(stderr, "FAILED: %d check(s)\n", g_fail);
        return 1;
    }
    printf("fakecupti conformance: ok (%s)\n",
           g_have_real ? "against the real libcupti" : "fake only, real not loaded");
    return g_have_real ? 0 : 77;
}
