/*
 * fakecupti.c: libkprof_fakecupti.so, a CPU-only stand-in for libcupti.so.13 (see fakecupti.h
 * for what it emits and how).
 *
 * DESIGN
 * - Buffers ("slots"): one per thread for API-side records (CUPTI 13's default
 *   CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER=1; one shared slot if the library sets it to
 *   0) and one per device for GPU-side records. A slot holds at most one buffer obtained from
 *   the library's request callback. Each slot has its own mutex; a writer holds it while
 *   requesting and, in synchronous mode, while completing a full buffer, so the library sees
 *   each slot's buffers in order. Lock order: g_mu (thread list), then a slot's mu.
 * - cuptiActivityFlushAll completes every slot's buffer that holds records. Synchronous mode:
 *   on the calling thread, like CUPTI may do. FAKECUPTI_ASYNC=1: every completion (full or
 *   flushed) goes through one FIFO served by a "CUPTI worker" thread; FlushAll queues the
 *   partial buffers and waits (bounded) until that thread has delivered everything.
 * - Kernel names: strdup per record, listed with the buffer; after delivery the list is kept
 *   by buffer address until the library asks for a buffer and gets that same memory (it has
 *   finished decoding it), then each name is overwritten and freed.
 * - Never blocks without bound, never aborts: a failed allocation drops the record and counts
 *   it, as CUPTI would.
 */
#define _GNU_SOURCE
#include "fakecupti.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FC_EXT_KINDS     CUPTI_EXTERNAL_CORRELATION_KIND_SIZE
#define FC_EXT_MAX       256  /* external correlation stack depth per thread and kind */
#define FC_MAX_DELIVERED 1024 /* delivered buffers whose names are still alive */
#define FC_MAX_ATTR      32
#define FC_FLUSH_WAIT_MS 5000 /* async FlushAll: longest wait for the worker thread */
#define FC_POISON_BYTE   0x5a

/* Names owned by the records of one buffer. */
struct fc_names {
    char **v;
    size_t n, cap;
};

/* One buffer in the making. */
struct fc_slot {
    pthread_mutex_t mu;
    uint8_t *buf; /* NULL: none requested yet (or the last was completed) */
    size_t cap, used;
    size_t max_records, nrec; /* the request's maxNumRecords (0: as many as fit) */
    struct fc_names names;
};

/* A buffer on its way to the complete callback. */
struct fc_done {
    struct fc_done *next; /* async FIFO link */
    uint8_t *buf;
    size_t cap, used;
    struct fc_names names;
};

struct fc_thread {
    struct fc_thread *next; /* g_threads, under g_mu */
    struct fc_slot api;
    atomic_int exited; /* set by the thread-exit destructor; FlushAll then frees it */
    uint32_t depth[FC_EXT_KINDS];
    uint64_t stack[FC_EXT_KINDS][FC_EXT_MAX];
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* g_threads, g_attr */
static struct fc_thread *g_threads;
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static __thread struct fc_thread *tl_self;
static __thread int tl_in_callback; /* > 0 inside a request/complete callback */
static __thread uint32_t tl_last_written;

static struct fc_slot g_shared_api = { .mu = PTHREAD_MUTEX_INITIALIZER };
static struct fc_slot g_dev[FAKECUPTI_MAX_DEVICES];

static CUpti_BuffersCallbackRequestFunc g_req; /* __atomic builtins */
static CUpti_BuffersCallbackCompleteFunc g_cmp;

static atomic_uchar g_enabled[FAKECUPTI_MAX_KIND];
static atomic_uchar g_rt_off[CUPTI_RUNTIME_TRACE_CBID_SIZE]; /* runtime cbids switched off */
static atomic_uchar g_drv_on[CUPTI_DRIVER_TRACE_CBID_SIZE];  /* driver cbids switched on */
static uint64_t g_attr[FC_MAX_ATTR];
static unsigned char g_attr_set[FC_MAX_ATTR];
static atomic_int g_tid_type = CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT;
static atomic_int g_shared_api_on; /* PER_THREAD_ACTIVITY_BUFFER set to 0 */

static atomic_uint_fast32_t g_corr;
static atomic_uint_fast64_t g_kernel_seq;
static atomic_uint_fast64_t g_dropped_unread;

static struct {
    atomic_uint_fast64_t records[FAKECUPTI_MAX_KIND];
    atomic_uint_fast64_t dropped, requested, declined, completed, names_freed;
    atomic_uint_fast64_t enable_calls, disable_calls, flush_calls;
} g_st;

/* Settings from the environment (fakecupti_set_* override them). */
static uint32_t g_version = FAKECUPTI_DEFAULT_VERSION;
static int g_async;
static atomic_int g_fail_enable;
static atomic_uint g_incomplete_every;

/* Delivered buffers whose names are alive, oldest first. */
static pthread_mutex_t g_dlv_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint8_t *buf;
    struct fc_names names;
} g_dlv[FC_MAX_DELIVERED];
static size_t g_ndlv;

/* The async "CUPTI worker". */
static pthread_mutex_t g_async_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_async_cv = PTHREAD_COND_INITIALIZER;      /* work queued */
static pthread_cond_t g_async_idle_cv = PTHREAD_COND_INITIALIZER; /* queue drained */
static struct fc_done *g_async_head, *g_async_tail;
static int g_async_busy;      /* the worker is delivering one */
static int g_async_started;   /* the worker thread exists */
static pthread_t g_async_thr; /* joinable: at unload it is joined, not only told to quit */
static int g_async_joinable;  /* g_async_thr is a thread of this process not yet joined */
static int g_async_quit;      /* at unload: the worker exits, later deliveries are synchronous */

/* ---- small helpers ---- */

static int64_t fc_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint32_t fc_thread_id(void)
{
    if (atomic_load(&g_tid_type) == CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM) {
        return (uint32_t) syscall(SYS_gettid);
    }
    return (uint32_t) (uintptr_t) pthread_self();
}

static int fc_kind_on(CUpti_ActivityKind kind)
{
    return (unsigned) kind < FAKECUPTI_MAX_KIND &&
           atomic_load_explicit(&g_enabled[kind], memory_order_relaxed);
}

static int fc_runtime_on(uint32_t cbid)
{
    return fc_kind_on(CUPTI_ACTIVITY_KIND_RUNTIME) && cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE &&
           !atomic_load_explicit(&g_rt_off[cbid], memory_order_relaxed);
}

static long fc_env_long(const char *name, long def)
{
    const char *s = getenv(name);
    char *end;
    long v;

    if (!s || !*s) {
        return def;
    }
    errno = 0;
    v = strtol(s, &end, 0);
    if (errno || *end) {
        fprintf(stderr, "fakecupti: ignoring %s=%s (not a number)\n", name, s);
        return def;
    }
    return v;
}

/* The record stride of each kind the fake knows: sizeof the CUDA 13 header struct, as the
 * real iterator uses. 0: unknown to the fake (INVALID_KIND). */
static size_t fc_kind_size(uint32_t kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        return sizeof(CUpti_ActivityMemcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
        return sizeof(CUpti_ActivityMemset4);
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        return sizeof(CUpti_ActivityKernel10);
    case CUPTI_ACTIVITY_KIND_DRIVER:
    case CUPTI_ACTIVITY_KIND_RUNTIME:
        return sizeof(CUpti_ActivityAPI);
    case CUPTI_ACTIVITY_KIND_DEVICE:
        return sizeof(CUpti_ActivityDevice5);
    case CUPTI_ACTIVITY_KIND_CONTEXT:
        return sizeof(CUpti_ActivityContext3);
    case CUPTI_ACTIVITY_KIND_NAME:
        return sizeof(CUpti_ActivityName);
    case CUPTI_ACTIVITY_KIND_MARKER:
        return sizeof(CUpti_ActivityMarker2);
    case CUPTI_ACTIVITY_KIND_MARKER_DATA:
        return sizeof(CUpti_ActivityMarkerData2);
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
        return sizeof(CUpti_ActivityOverhead3);
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
        return sizeof(CUpti_ActivityMemcpyPtoP4);
    case CUPTI_ACTIVITY_KIND_CUDA_EVENT:
        return sizeof(CUpti_ActivityCudaEvent2);
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
        return sizeof(CUpti_ActivitySynchronization2);
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
        return sizeof(CUpti_ActivityExternalCorrelation);
    default:
        return 0;
    }
}

/* ---- names ---- */

static int fc_names_add(struct fc_names *ns, char *s)
{
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? ns->cap * 2 : 64;
        char **v = realloc(ns->v, cap * sizeof(*v));

        if (!v) {
            return -ENOMEM;
        }
        ns->v = v;
        ns->cap = cap;
    }
    ns->v[ns->n++] = s;
    return 0;
}

/* Overwrites and frees every name, then the list. */
static void fc_names_release(struct fc_names *ns)
{
    for (size_t i = 0; i < ns->n; i++) {
        memset(ns->v[i], FC_POISON_BYTE, strlen(ns->v[i]));
        free(ns->v[i]);
    }
    if (ns->n) {
        atomic_fetch_add(&g_st.names_freed, ns->n);
    }
    free(ns->v);
    memset(ns, 0, sizeof(*ns));
}

/* Keeps the names of a delivered buffer alive until its memory comes back. Takes names. */
static void fc_delivered_add(uint8_t *buf, struct fc_names *names)
{
    if (!names->n) {
        fc_names_release(names);
        return;
    }
    pthread_mutex_lock(&g_dlv_mu);
    if (g_ndlv == FC_MAX_DELIVERED) {
        /* The library keeps more than FC_MAX_DELIVERED buffers: the oldest names go. */
        fc_names_release(&g_dlv[0].names);
        memmove(&g_dlv[0], &g_dlv[1], (g_ndlv - 1) * sizeof(g_dlv[0]));
        g_ndlv--;
    }
    g_dlv[g_ndlv].buf = buf;
    g_dlv[g_ndlv].names = *names;
    g_ndlv++;
    memset(names, 0, sizeof(*names));
    pthread_mutex_unlock(&g_dlv_mu);
}

/* The library handed out buf again: names of its earlier deliveries die now. */
static void fc_delivered_reclaim(const uint8_t *buf)
{
    size_t i = 0;

    pthread_mutex_lock(&g_dlv_mu);
    while (i < g_ndlv) {
        if (g_dlv[i].buf == buf) {
            fc_names_release(&g_dlv[i].names);
            memmove(&g_dlv[i], &g_dlv[i + 1], (g_ndlv - i - 1) * sizeof(g_dlv[0]));
            g_ndlv--;
        }
        else {
            i++;
        }
    }
    pthread_mutex_unlock(&g_dlv_mu);
}

static void fc_delivered_release_all(void)
{
    pthread_mutex_lock(&g_dlv_mu);
    for (size_t i = 0; i < g_ndlv; i++) {
        fc_names_release(&g_dlv[i].names);
    }
    g_ndlv = 0;
    pthread_mutex_unlock(&g_dlv_mu);
}

/* ---- delivery ---- */

/* Calls the complete callback for d on this thread. Takes d's names (not d itself). */
static void fc_deliver_now(struct fc_done *d)
{
    CUpti_BuffersCallbackCompleteFunc cmp = __atomic_load_n(&g_cmp, __ATOMIC_ACQUIRE);

    tl_in_callback++;
    if (cmp) {
        cmp(NULL, 0, d->buf, d->cap, d->used);
    }
    tl_in_callback--;
    atomic_fetch_add(&g_st.completed, 1);
    fc_delivered_add(d->buf, &d->names);
}

static void *fc_async_main(void *arg)
{
    (void) arg;
    pthread_mutex_lock(&g_async_mu);
    for (;;) {
        struct fc_done *d;

        while (!g_async_head && !g_async_quit) {
            pthread_cond_wait(&g_async_cv, &g_async_mu);
        }
        if (!g_async_head) {
            break; /* quit, and nothing left */
        }
        d = g_async_head;
        g_async_head = d->next;
        if (!g_async_head) {
            g_async_tail = NULL;
        }
        g_async_busy = 1;
        pthread_mutex_unlock(&g_async_mu);
        fc_deliver_now(d);
        free(d);
        pthread_mutex_lock(&g_async_mu);
        g_async_busy = 0;
        if (!g_async_head) {
            pthread_cond_broadcast(&g_async_idle_cv);
        }
    }
    g_async_started = 0;
    pthread_cond_broadcast(&g_async_idle_cv);
    pthread_mutex_unlock(&g_async_mu);
    return NULL;
}

/* Hands d to the complete callback: now (sync mode, or if the async FIFO cannot take it) or
 * through the worker thread. Takes d's contents. */
static void fc_deliver(struct fc_done *d)
{
    struct fc_done *q;

    if (!g_async || !(q = malloc(sizeof(*q)))) {
        fc_deliver_now(d);
        return;
    }
    *q = *d;
    q->next = NULL;
    pthread_mutex_lock(&g_async_mu);
    if (g_async_quit) {
        pthread_mutex_unlock(&g_async_mu);
        free(q);
        fc_deliver_now(d);
        return;
    }
    if (!g_async_started) {
        /* Not started means never started (or forked away): the worker only quits at unload,
         * and g_async_quit turns deliveries synchronous above. */
        if (pthread_create(&g_async_thr, NULL, fc_async_main, NULL) == 0) {
            g_async_started = 1;
            g_async_joinable = 1;
        }
        if (!g_async_started) {
            pthread_mutex_unlock(&g_async_mu);
            free(q);
            fc_deliver_now(d);
            return;
        }
    }
    if (g_async_tail) {
        g_async_tail->next = q;
    }
    else {
        g_async_head = q;
    }
    g_async_tail = q;
    pthread_cond_signal(&g_async_cv);
    pthread_mutex_unlock(&g_async_mu);
}

/* Waits until the async worker has delivered everything queued so far (bounded). */
static void fc_async_drain(void)
{
    struct timespec dl;

    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += FC_FLUSH_WAIT_MS / 1000;
    dl.tv_nsec += (long) (FC_FLUSH_WAIT_MS % 1000) * 1000000;
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&g_async_mu);
    while (g_async_head || g_async_busy) {
        if (pthread_cond_timedwait(&g_async_idle_cv, &g_async_mu, &dl) == ETIMEDOUT) {
            fprintf(stderr,
                    "fakecupti: FlushAll gave up waiting %d ms for the async worker "
                    "(is the complete callback blocked?)\n",
                    FC_FLUSH_WAIT_MS);
            break;
        }
    }
    pthread_mutex_unlock(&g_async_mu);
}

/* ---- slots ---- */

/* Moves the slot's buffer into *d (caller holds s->mu). Returns 1 if there was one. */
static int fc_slot_detach(struct fc_slot *s, struct fc_done *d)
{
    if (!s->buf) {
        return 0;
    }
    memset(d, 0, sizeof(*d));
    d->buf = s->buf;
    d->cap = s->cap;
    d->used = s->used;
    d->names = s->names;
    s->buf = NULL;
    s->cap = s->used = s->max_records = s->nrec = 0;
    memset(&s->names, 0, sizeof(s->names));
    return 1;
}

/* Asks the library for a buffer of at least need bytes (caller holds s->mu). Returns 0, or
 * -1 if it declined (the caller drops the record). */
static int fc_slot_request(struct fc_slot *s, size_t need)
{
    CUpti_BuffersCallbackRequestFunc req = __atomic_load_n(&g_req, __ATOMIC_ACQUIRE);
    uint8_t *b = NULL;
    size_t size = 0, max_records = 0;

    if (!req) {
        return -1;
    }
    tl_in_callback++;
    req(&b, &size, &max_records);
    tl_in_callback--;
    atomic_fetch_add(&g_st.requested, 1);
    if (!b) {
        atomic_fetch_add(&g_st.declined, 1);
        return -1;
    }
    fc_delivered_reclaim(b);
    if (size < need || ((uintptr_t) b & (ACTIVITY_RECORD_ALIGNMENT - 1))) {
        /* Unusable (too small or misaligned): give it straight back, empty. */
        struct fc_done d = { .buf = b, .cap = size, .used = 0 };

        atomic_fetch_add(&g_st.declined, 1);
        fc_deliver(&d);
        return -1;
    }
    s->buf = b;
    s->cap = size;
    s->used = 0;
    s->max_records = max_records;
    s->nrec = 0;
    return 0;
}

static void fc_drop(void)
{
    atomic_fetch_add(&g_st.dropped, 1);
    atomic_fetch_add(&g_dropped_unread, 1);
    tl_last_written |= FAKECUPTI_W_DROPPED;
}

/* Appends one record of its kind's size to s. name (may be NULL) is owned by the record from
 * now on (freed here if the record is dropped). Returns 0, or -1 if dropped. */
static int fc_slot_write(struct fc_slot *s, const void *rec, char *name)
{
    uint32_t kind = *(const uint32_t *) rec;
    size_t size = fc_kind_size(kind);
    struct fc_done full;
    int rc = 0;

    pthread_mutex_lock(&s->mu);
    if (s->buf && (s->cap - s->used < size || (s->max_records && s->nrec >= s->max_records))) {
        fc_slot_detach(s, &full);
        fc_deliver(&full); /* under s->mu: this slot's buffers reach the library in order */
    }
    if (!s->buf && fc_slot_request(s, size) < 0) {
        rc = -1;
    }
    if (rc == 0 && name && fc_names_add(&s->names, name) < 0) {
        rc = -1;
    }
    if (rc == 0) {
        memcpy(s->buf + s->used, rec, size);
        s->used += size;
        s->nrec++;
        atomic_fetch_add(&g_st.records[kind], 1);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc < 0) {
        free(name);
        fc_drop();
    }
    return rc;
}

/* Completes s's buffer if it holds records. */
static void fc_slot_flush(struct fc_slot *s)
{
    struct fc_done d;

    pthread_mutex_lock(&s->mu);
    if (s->buf && s->used && fc_slot_detach(s, &d)) {
        fc_deliver(&d);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- threads ---- */

static void fc_thread_exit(void *p)
{
    struct fc_thread *t = p;

    atomic_store(&t->exited, 1);
}

static void fc_key_init(void)
{
    pthread_key_create(&g_key, fc_thread_exit);
}

/* The calling thread's state, created on first use. NULL if out of memory. */
static struct fc_thread *fc_self(void)
{
    struct fc_thread *t = tl_self;

    if (t) {
        return t;
    }
    pthread_once(&g_key_once, fc_key_init);
    t = calloc(1, sizeof(*t));
    if (!t) {
        return NULL;
    }
    pthread_mutex_init(&t->api.mu, NULL);
    pthread_setspecific(g_key, t);
    pthread_mutex_lock(&g_mu);
    t->next = g_threads;
    g_threads = t;
    pthread_mutex_unlock(&g_mu);
    tl_self = t;
    return t;
}

static struct fc_slot *fc_api_slot(void)
{
    struct fc_thread *t;

    if (atomic_load_explicit(&g_shared_api_on, memory_order_relaxed)) {
        return &g_shared_api;
    }
    t = fc_self();
    return t ? &t->api : NULL;
}

/* ---- emission ---- */

struct fc_call {
    int64_t t0;
    uint32_t corr;
    uint32_t cbid;
    int api_on;
};

/* Starts an API call: new correlation id and, if its API record will be written, the
 * external correlation records of this thread's non-empty stacks. */
static void fc_call_begin(struct fc_call *c, uint32_t cbid)
{
    c->t0 = fc_now_ns();
    c->corr = (uint32_t) atomic_fetch_add(&g_corr, 1) + 1;
    c->cbid = cbid;
    c->api_on = fc_runtime_on(cbid);
    tl_last_written = 0;
    if (c->api_on && fc_kind_on(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) && tl_self) {
        struct fc_slot *s = fc_api_slot();

        for (int k = 1; s && k < FC_EXT_KINDS; k++) {
            CUpti_ActivityExternalCorrelation r;

            if (!tl_self->depth[k]) {
                continue;
            }
            memset(&r, 0, sizeof(r));
            r.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
            r.externalKind = (CUpti_ExternalCorrelationKind) k;
            r.externalId = tl_self->stack[k][tl_self->depth[k] - 1];
            r.correlationId = c->corr;
            if (fc_slot_write(s, &r, NULL) == 0) {
                tl_last_written |= FAKECUPTI_W_EXTCORR;
            }
        }
    }
}

/* Ends the API call: the API record, start at begin, end now. */
static void fc_call_end(struct fc_call *c)
{
    CUpti_ActivityAPI r;
    struct fc_slot *s;

    if (!c->api_on) {
        return;
    }
    s = fc_api_slot();
    if (!s) {
        fc_drop();
        return;
    }
    memset(&r, 0, sizeof(r));
    r.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    r.cbid = c->cbid;
    r.start = (uint64_t) c->t0;
    r.end = (uint64_t) fc_now_ns();
    r.processId = (uint32_t) getpid();
    r.threadId = fc_thread_id();
    r.correlationId = c->corr;
    r.returnValue = 0;
    if (fc_slot_write(s, &r, NULL) == 0) {
        tl_last_written |= FAKECUPTI_W_API;
    }
}

static void fc_times(const struct fakecupti_timing *t, int64_t t0, uint64_t *start, uint64_t *end)
{
    if (t->start_ns || t->end_ns) {
        *start = (uint64_t) t->start_ns;
        *end = (uint64_t) t->end_ns;
        return;
    }
    *start = (uint64_t) (t0 + (t->start_offset_ns ? t->start_offset_ns : 1000));
    *end = *start + (uint64_t) (t->duration_ns ? t->duration_ns : 5000);
}

static struct fc_slot *fc_dev_slot(uint32_t device)
{
    return &g_dev[device % FAKECUPTI_MAX_DEVICES];
}

static void fc_write_gpu(uint32_t device, const void *rec, char *name)
{
    if (fc_slot_write(fc_dev_slot(device), rec, name) == 0) {
        tl_last_written |= FAKECUPTI_W_GPU;
    }
}

/*
 * FAKECUPTI_SHARED_NAMES=1: kernel names behave as CUPTI documents them ("shared across all
 * activity records representing the same kernel"): one copy per distinct name, alive until
 * the process exits. By default each record gets its own copy, freed once the library reuses
 * the buffer, so a library that keeps a name pointer past decoding is caught.
 */
#define FC_SHARED_NAMES 256
static const char *fc_shared_name(const char *s)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char *names[FC_SHARED_NAMES];
    static atomic_int on = -1;
    const char *out = NULL;
    int v = atomic_load(&on);

    if (v < 0) {
        const char *e = getenv("FAKECUPTI_SHARED_NAMES");
        v = e != NULL && strcmp(e, "1") == 0;
        atomic_store(&on, v);
    }
    if (!v || s == NULL) {
        return NULL;
    }
    pthread_mutex_lock(&mu);
    for (int i = 0; i < FC_SHARED_NAMES; i++) {
        if (names[i] == NULL) {
            names[i] = strdup(s);
            out = names[i];
            break;
        }
        if (strcmp(names[i], s) == 0) {
            out = names[i];
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return out; /* NULL (table full or no memory): a per-record copy instead */
}

uint32_t fakecupti_launch_kernel(const struct fakecupti_kernel *k)
{
    struct fc_call c;
    CUpti_ActivityKernel10 r;
    CUpti_ActivityKind kind;
    uint32_t every;

    fc_call_begin(&c, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    kind = fc_kind_on(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
           : fc_kind_on(CUPTI_ACTIVITY_KIND_KERNEL)          ? CUPTI_ACTIVITY_KIND_KERNEL
                                                             : CUPTI_ACTIVITY_KIND_INVALID;
    if (kind != CUPTI_ACTIVITY_KIND_INVALID) {
        uint64_t seq = atomic_fetch_add(&g_kernel_seq, 1) + 1;
        const char *shared = fc_shared_name(k->name);
        char *name = shared != NULL ? NULL : strdup(k->name ? k->name : "");

        memset(&r, 0, sizeof(r));
        r.kind = kind;
        r.registersPerThread = k->registers;
        fc_times(&k->t, c.t0, &r.start, &r.end);
        every = atomic_load(&g_incomplete_every);
        if (every && seq % every == 0) {
            r.start = r.end = 0;
        }
        r.completed = r.end;
        r.deviceId = k->device;
        r.contextId = k->context;
        r.streamId = k->stream;
        r.gridX = k->grid_x;
        r.gridY = k->grid_y;
        r.gridZ = k->grid_z;
        r.blockX = k->block_x;
        r.blockY = k->block_y;
        r.blockZ = k->block_z;
        r.staticSharedMemory = k->static_smem;
        r.dynamicSharedMemory = k->dynamic_smem;
        r.correlationId = c.corr;
        r.gridId = (int64_t) seq;
        r.name = shared != NULL ? shared : name;
        r.graphNodeId = k->graph_node_id;
        r.graphId = k->graph_id;
        if (shared != NULL || name != NULL) {
            fc_write_gpu(k->device, &r, name);
        }
        else {
            fc_drop();
        }
    }
    fc_call_end(&c);
    return c.corr;
}

uint32_t fakecupti_memcpy(const struct fakecupti_memcpy *m)
{
    struct fc_call c;
    CUpti_ActivityMemcpy6 r;

    fc_call_begin(&c, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020);
    if (fc_kind_on(CUPTI_ACTIVITY_KIND_MEMCPY)) {
        memset(&r, 0, sizeof(r));
        r.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
        r.copyKind = m->copy_kind;
        r.srcKind = m->src_kind;
        r.dstKind = m->dst_kind;
        r.bytes = m->bytes;
        fc_times(&m->t, c.t0, &r.start, &r.end);
        r.deviceId = m->device;
        r.contextId = m->context;
        r.streamId = m->stream;
        r.correlationId = c.corr;
        r.runtimeCorrelationId = c.corr;
        r.copyCount = 1;
        fc_write_gpu(m->device, &r, NULL);
    }
    fc_call_end(&c);
    return c.corr;
}

uint32_t fakecupti_memset(const struct fakecupti_memset *m)
{
    struct fc_call c;
    CUpti_ActivityMemset4 r;

    fc_call_begin(&c, CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020);
    if (fc_kind_on(CUPTI_ACTIVITY_KIND_MEMSET)) {
        memset(&r, 0, sizeof(r));
        r.kind = CUPTI_ACTIVITY_KIND_MEMSET;
        r.value = m->value;
        r.bytes = m->bytes;
        fc_times(&m->t, c.t0, &r.start, &r.end);
        r.deviceId = m->device;
        r.contextId = m->context;
        r.streamId = m->stream;
        r.correlationId = c.corr;
        r.memoryKind = m->mem_kind;
        fc_write_gpu(m->device, &r, NULL);
    }
    fc_call_end(&c);
    return c.corr;
}

uint32_t fakecupti_sync(const struct fakecupti_sync *s)
{
    struct fc_call c;
    CUpti_ActivitySynchronization2 r;
    struct fc_slot *slot;

    fc_call_begin(&c, CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020);
    fc_call_end(&c);
    if (fc_kind_on(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION) && (slot = fc_api_slot())) {
        memset(&r, 0, sizeof(r));
        r.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
        r.type = s->type ? (CUpti_ActivitySynchronizationType) s->type
                         : CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
        fc_times(&s->t, c.t0, &r.start, &r.end);
        r.correlationId = c.corr;
        r.contextId = s->context;
        r.streamId = s->stream;
        r.cudaEventId = s->cuda_event;
        if (fc_slot_write(slot, &r, NULL) == 0) {
            tl_last_written |= FAKECUPTI_W_GPU;
        }
    }
    return c.corr;
}

int fakecupti_overhead(uint32_t overhead_kind, int64_t start_ns, int64_t end_ns)
{
    CUpti_ActivityOverhead3 r;
    struct fc_slot *s;

    tl_last_written = 0;
    if (!fc_kind_on(CUPTI_ACTIVITY_KIND_OVERHEAD) || !(s = fc_api_slot())) {
        return 0;
    }
    memset(&r, 0, sizeof(r));
    r.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
    r.overheadKind = (CUpti_ActivityOverheadKind) overhead_kind;
    r.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
    r.objectId.pt.processId = (uint32_t) getpid();
    r.objectId.pt.threadId = fc_thread_id();
    r.start = (uint64_t) start_ns;
    r.end = (uint64_t) end_ns;
    if (fc_slot_write(s, &r, NULL) < 0) {
        return 0;
    }
    tl_last_written |= FAKECUPTI_W_API;
    return 1;
}

/* ---- control API ---- */

uint32_t fakecupti_last_written(void)
{
    return tl_last_written;
}

uint64_t fakecupti_enabled_kinds(void)
{
    uint64_t m = 0;

    for (unsigned k = 0; k < FAKECUPTI_MAX_KIND; k++) {
        if (atomic_load(&g_enabled[k])) {
            m |= 1ull << k;
        }
    }
    return m;
}

uint64_t fakecupti_enable_calls(void)
{
    return atomic_load(&g_st.enable_calls);
}

int fakecupti_ext_depth(CUpti_ExternalCorrelationKind kind)
{
    if ((unsigned) kind >= FC_EXT_KINDS || kind == CUPTI_EXTERNAL_CORRELATION_KIND_INVALID) {
        return -1;
    }
    return tl_self ? (int) tl_self->depth[kind] : 0;
}

int fakecupti_runtime_cbid_enabled(uint32_t cbid)
{
    return cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE && !atomic_load(&g_rt_off[cbid]);
}

uint64_t fakecupti_attribute(CUpti_ActivityAttribute attr, int *was_set)
{
    uint64_t v = 0;
    int set = 0;

    if ((unsigned) attr < FC_MAX_ATTR) {
        pthread_mutex_lock(&g_mu);
        v = g_attr[attr];
        set = g_attr_set[attr];
        pthread_mutex_unlock(&g_mu);
    }
    if (was_set) {
        *was_set = set;
    }
    return v;
}

void fakecupti_set_fail_enable(CUptiResult rc)
{
    atomic_store(&g_fail_enable, (int) rc);
}

void fakecupti_set_incomplete_every(uint32_t n)
{
    atomic_store(&g_incomplete_every, n);
}

void fakecupti_stats(struct fakecupti_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (unsigned k = 0; k < FAKECUPTI_MAX_KIND; k++) {
        out->records[k] = atomic_load(&g_st.records[k]);
        out->records_total += out->records[k];
        out->enabled_kinds += atomic_load(&g_enabled[k]) ? 1 : 0;
    }
    out->dropped = atomic_load(&g_st.dropped);
    out->buffers_requested = atomic_load(&g_st.requested);
    out->buffers_declined = atomic_load(&g_st.declined);
    out->buffers_completed = atomic_load(&g_st.completed);
    out->names_freed = atomic_load(&g_st.names_freed);
    out->enable_calls = atomic_load(&g_st.enable_calls);
    out->disable_calls = atomic_load(&g_st.disable_calls);
    out->flush_calls = atomic_load(&g_st.flush_calls);
    out->registered = __atomic_load_n(&g_req, __ATOMIC_ACQUIRE) != NULL;
    out->thread_id_type = (uint32_t) atomic_load(&g_tid_type);
}

/* ---- the CUPTI API ---- */

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version)
{
    if (!version) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    *version = g_version;
    return CUPTI_SUCCESS;
}

static const char *fc_result_name(CUptiResult r)
{
    switch (r) {
#define FC_R(x) \
    case x:     \
        return #x;
        FC_R(CUPTI_SUCCESS)
        FC_R(CUPTI_ERROR_INVALID_PARAMETER)
        FC_R(CUPTI_ERROR_INVALID_DEVICE)
        FC_R(CUPTI_ERROR_INVALID_CONTEXT)
        FC_R(CUPTI_ERROR_INVALID_EVENT_DOMAIN_ID)
        FC_R(CUPTI_ERROR_INVALID_EVENT_ID)
        FC_R(CUPTI_ERROR_INVALID_EVENT_NAME)
        FC_R(CUPTI_ERROR_INVALID_OPERATION)
        FC_R(CUPTI_ERROR_OUT_OF_MEMORY)
        FC_R(CUPTI_ERROR_HARDWARE)
        FC_R(CUPTI_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT)
        FC_R(CUPTI_ERROR_API_NOT_IMPLEMENTED)
        FC_R(CUPTI_ERROR_MAX_LIMIT_REACHED)
        FC_R(CUPTI_ERROR_NOT_READY)
        FC_R(CUPTI_ERROR_NOT_COMPATIBLE)
        FC_R(CUPTI_ERROR_NOT_INITIALIZED)
        FC_R(CUPTI_ERROR_INVALID_METRIC_ID)
        FC_R(CUPTI_ERROR_INVALID_METRIC_NAME)
        FC_R(CUPTI_ERROR_QUEUE_EMPTY)
        FC_R(CUPTI_ERROR_INVALID_HANDLE)
        FC_R(CUPTI_ERROR_INVALID_STREAM)
        FC_R(CUPTI_ERROR_INVALID_KIND)
        FC_R(CUPTI_ERROR_INVALID_EVENT_VALUE)
        FC_R(CUPTI_ERROR_DISABLED)
        FC_R(CUPTI_ERROR_INVALID_MODULE)
        FC_R(CUPTI_ERROR_INVALID_METRIC_VALUE)
        FC_R(CUPTI_ERROR_HARDWARE_BUSY)
        FC_R(CUPTI_ERROR_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_ON_DEVICE)
        FC_R(CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_ON_NON_P2P_DEVICES)
        FC_R(CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_WITH_MPS)
        FC_R(CUPTI_ERROR_CDP_TRACING_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_CUDA_COMPILER_NOT_COMPATIBLE)
        FC_R(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
        FC_R(CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED)
        FC_R(CUPTI_ERROR_OPENACC_UNDEFINED_ROUTINE)
        FC_R(CUPTI_ERROR_LEGACY_PROFILER_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES)
        FC_R(CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED)
        FC_R(CUPTI_ERROR_INVALID_CHIP_NAME)
        FC_R(CUPTI_ERROR_UNKNOWN)
#undef FC_R
    default:
        return NULL;
    }
}

/* As the real one: the enum name, or "<unknown>" and INVALID_PARAMETER. */
CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str)
{
    const char *s = fc_result_name(result);

    if (!str) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    *str = s ? s : "<unknown>";
    return s ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_PARAMETER;
}

CUptiResult CUPTIAPI cuptiGetErrorMessage(CUptiResult result, const char **str)
{
    return cuptiGetResultString(result, str);
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
                                                    CUpti_BuffersCallbackCompleteFunc cmp)
{
    if (!req || !cmp) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    __atomic_store_n(&g_req, req, __ATOMIC_RELEASE);
    __atomic_store_n(&g_cmp, cmp, __ATOMIC_RELEASE);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivitySetAttribute(CUpti_ActivityAttribute attr, size_t *valueSize,
                                               void *value)
{
    uint64_t v = 0;

    if (!valueSize || !value || *valueSize == 0 || *valueSize > sizeof(v) ||
        (unsigned) attr >= FC_MAX_ATTR) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    switch (*valueSize) {
    case 1:
        v = *(const uint8_t *) value;
        break;
    case 2:
        v = *(const uint16_t *) value;
        break;
    case 4:
        v = *(const uint32_t *) value;
        break;
    case 8:
        v = *(const uint64_t *) value;
        break;
    default:
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    pthread_mutex_lock(&g_mu);
    g_attr[attr] = v;
    g_attr_set[attr] = 1;
    pthread_mutex_unlock(&g_mu);
    if (attr == CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER) {
        atomic_store(&g_shared_api_on, v == 0);
    }
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind)
{
    int fail = atomic_load(&g_fail_enable);

    atomic_fetch_add(&g_st.enable_calls, 1);
    if (fail) {
        return (CUptiResult) fail;
    }
    if ((unsigned) kind >= FAKECUPTI_MAX_KIND || !fc_kind_size(kind)) {
        return CUPTI_ERROR_INVALID_KIND;
    }
    if (kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
        /* Enabling the kind overrides earlier per-cbid choices. */
        for (size_t i = 0; i < CUPTI_RUNTIME_TRACE_CBID_SIZE; i++) {
            atomic_store(&g_rt_off[i], 0);
        }
    }
    atomic_store(&g_enabled[kind], 1);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind)
{
    atomic_fetch_add(&g_st.disable_calls, 1);
    if ((unsigned) kind >= FAKECUPTI_MAX_KIND || !fc_kind_size(kind)) {
        return CUPTI_ERROR_INVALID_KIND;
    }
    atomic_store(&g_enabled[kind], 0);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable)
{
    if (cbid >= CUPTI_RUNTIME_TRACE_CBID_SIZE) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    atomic_store(&g_rt_off[cbid], enable ? 0 : 1);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable)
{
    if (cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    atomic_store(&g_drv_on[cbid], enable ? 1 : 0);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag)
{
    (void) flag; /* no record is ever in flight in the fake: forced or not is the same */
    struct fc_thread **pp, *t, *dead = NULL;

    if (tl_in_callback) {
        /* From inside a buffer callback: CUPTI would deadlock or misbehave; say so instead. */
        return CUPTI_ERROR_INVALID_OPERATION;
    }
    atomic_fetch_add(&g_st.flush_calls, 1);
    if (g_async) {
        fc_async_drain(); /* full buffers queued earlier go first */
    }
    pthread_mutex_lock(&g_mu);
    for (pp = &g_threads; (t = *pp);) {
        fc_slot_flush(&t->api);
        if (atomic_load(&t->exited)) {
            *pp = t->next;
            t->next = dead;
            dead = t;
        }
        else {
            pp = &t->next;
        }
    }
    pthread_mutex_unlock(&g_mu);
    fc_slot_flush(&g_shared_api);
    for (size_t i = 0; i < FAKECUPTI_MAX_DEVICES; i++) {
        fc_slot_flush(&g_dev[i]);
    }
    if (g_async) {
        fc_async_drain();
    }
    while ((t = dead)) {
        dead = t->next;
        pthread_mutex_destroy(&t->api.mu);
        free(t->api.names.v); /* empty: flushed above, and the thread is gone */
        free(t);
    }
    return CUPTI_SUCCESS;
}

/*
 * Walks a buffer the way the real CUPTI 13 iterator does (checked by the conformance test):
 * advance by the stride of the current record's kind; at or past the valid size ⇒
 * MAX_LIMIT_REACHED; a kind it does not know ⇒ INVALID_KIND; a record that does not fit in
 * the valid size ⇒ MAX_LIMIT_REACHED. *record is only updated on success.
 */
CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes,
                                                CUpti_Activity **record)
{
    size_t off, size;
    uint32_t kind;

    if (!buffer || !record) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    if (!*record) {
        off = 0;
    }
    else {
        size = fc_kind_size((*record)->kind);
        if (!size) {
            return CUPTI_ERROR_INVALID_KIND;
        }
        off = (size_t) ((uint8_t *) *record - buffer) + size;
    }
    if (off >= validBufferSizeBytes) {
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    }
    memcpy(&kind, buffer + off, sizeof(kind));
    size = fc_kind_size(kind);
    if (!size) {
        return CUPTI_ERROR_INVALID_KIND;
    }
    if (off + size > validBufferSizeBytes) {
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    }
    *record = (CUpti_Activity *) (buffer + off);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId,
                                                       size_t *dropped)
{
    (void) context; /* one count for the whole process */
    (void) streamId;
    if (!dropped) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    *dropped = (size_t) atomic_exchange(&g_dropped_unread, 0);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                            uint64_t id)
{
    struct fc_thread *t;

    if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID || kind >= FC_EXT_KINDS) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    if (!(t = fc_self())) {
        return CUPTI_ERROR_OUT_OF_MEMORY;
    }
    if (t->depth[kind] == FC_EXT_MAX) {
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    }
    t->stack[kind][t->depth[kind]++] = id;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                           uint64_t *lastId)
{
    struct fc_thread *t = tl_self;

    if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID || kind >= FC_EXT_KINDS) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    if (!t || !t->depth[kind]) {
        return CUPTI_ERROR_QUEUE_EMPTY;
    }
    t->depth[kind]--;
    if (lastId) {
        *lastId = t->stack[kind][t->depth[kind]];
    }
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiSetThreadIdType(CUpti_ActivityThreadIdType type)
{
    if ((unsigned) type >= CUPTI_ACTIVITY_THREAD_ID_TYPE_SIZE) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    atomic_store(&g_tid_type, (int) type);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp)
{
    if (!timestamp) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    *timestamp = (uint64_t) fc_now_ns();
    return CUPTI_SUCCESS;
}

/* Names as the real library gives them, for the cbids the fake emits or a library enables;
 * other cbids answer INVALID_PARAMETER (the real one knows them all). */
CUptiResult CUPTIAPI cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid,
                                          const char **name)
{
    const char *n = NULL;

    if (!name) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        switch (cbid) {
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
            n = "cudaLaunchKernel_v7000";
            break;
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
            n = "cudaMemcpyAsync_v3020";
            break;
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020:
            n = "cudaMemsetAsync_v3020";
            break;
        case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
            n = "cudaStreamSynchronize_v3020";
            break;
        default:
            break;
        }
    }
    else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
        switch (cbid) {
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
            n = "cuLaunchKernel";
            break;
        case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
            n = "cuLaunchKernelEx";
            break;
        case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
            n = "cuGraphLaunch";
            break;
        default:
            break;
        }
    }
    if (!n) {
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    *name = n;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiFinalize(void)
{
    CUptiResult rc;

    for (unsigned k = 0; k < FAKECUPTI_MAX_KIND; k++) {
        atomic_store(&g_enabled[k], 0);
    }
    rc = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (rc != CUPTI_SUCCESS) {
        return rc;
    }
    fc_delivered_release_all();
    return CUPTI_SUCCESS;
}

/* ---- load time and fork ---- */

static void fc_atfork_prepare(void)
{
    pthread_mutex_lock(&g_mu);
}

static void fc_atfork_parent(void)
{
    pthread_mutex_unlock(&g_mu);
}

/* The child has only the forking thread: other threads' state is dead, mutexes that other
 * threads held are reset, the async worker is gone (started again on demand). */
static void fc_atfork_child(void)
{
    pthread_mutex_init(&g_mu, NULL);
    for (struct fc_thread *t = g_threads; t; t = t->next) {
        pthread_mutex_init(&t->api.mu, NULL);
        if (t != tl_self) {
            atomic_store(&t->exited, 1);
        }
    }
    pthread_mutex_init(&g_shared_api.mu, NULL);
    for (size_t i = 0; i < FAKECUPTI_MAX_DEVICES; i++) {
        pthread_mutex_init(&g_dev[i].mu, NULL);
    }
    pthread_mutex_init(&g_dlv_mu, NULL);
    pthread_mutex_init(&g_async_mu, NULL);
    pthread_cond_init(&g_async_cv, NULL);
    pthread_cond_init(&g_async_idle_cv, NULL);
    g_async_head = g_async_tail = NULL; /* leaked in the child: their memory is the parent's */
    g_async_busy = 0;
    g_async_started = 0;
    g_async_joinable = 0; /* the parent's worker is not a thread of the child */
}

__attribute__((constructor)) static void fc_init(void)
{
    long v;

    for (size_t i = 0; i < FAKECUPTI_MAX_DEVICES; i++) {
        pthread_mutex_init(&g_dev[i].mu, NULL);
    }
    v = fc_env_long("FAKECUPTI_VERSION", FAKECUPTI_DEFAULT_VERSION);
    g_version = v > 0 ? (uint32_t) v : FAKECUPTI_DEFAULT_VERSION;
    g_async = fc_env_long("FAKECUPTI_ASYNC", 0) != 0;
    atomic_store(&g_fail_enable, (int) fc_env_long("FAKECUPTI_FAIL_ENABLE", 0));
    v = fc_env_long("FAKECUPTI_INCOMPLETE", 0);
    atomic_store(&g_incomplete_every, v > 0 ? (unsigned) v : 0u);
    pthread_atfork(fc_atfork_prepare, fc_atfork_parent, fc_atfork_child);
}

/* At exit or unload: the async worker delivers what it holds and exits (bounded wait), so no
 * thread of ours outlives the library; later completions run synchronously. It is joined, not
 * only waited for: a thread that has returned is still tearing down its TLS until the join, and
 * LeakSanitizer's exit-time scan of such a thread's dynamic TLS crashes its tracer (seen under
 * load in CI, about 1 run in 100). */
__attribute__((destructor)) static void fc_fini(void)
{
    struct timespec dl;

    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 1;
    pthread_mutex_lock(&g_async_mu);
    g_async_quit = 1;
    pthread_cond_broadcast(&g_async_cv);
    while (g_async_started) {
        if (pthread_cond_timedwait(&g_async_idle_cv, &g_async_mu, &dl) == ETIMEDOUT) {
            break;
        }
    }
    if (g_async_joinable && !g_async_started) {
        /* It has left its loop: the join returns as soon as the thread is gone. */
        pthread_join(g_async_thr, NULL);
        g_async_joinable = 0;
    }
    pthread_mutex_unlock(&g_async_mu);
}
