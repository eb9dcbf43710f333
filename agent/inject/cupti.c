/*
 * cupti.c: the CUPTI side of libkprof_inject.so: a function table resolved with dlopen/dlsym,
 * the activity buffer pool and its callbacks, enabling kinds per capture, and the decoder that
 * turns CUpti_Activity* records into kp_wire structs.
 *
 * DESIGN
 * libcupti: the copy already mapped in the process (PyTorch's, RTLD_NOLOAD) first, else
 * KPROF_CUPTI_PATH, else libcupti.so.13 from the loader path or the CUDA install. Nothing links
 * it, so a missing or too old CUPTI leaves the library dormant with a reason instead of failing
 * to load. The structs are the CUDA 13.0U1 headers' (Kernel10, Memcpy6, MemcpyPtoP4, Memset4,
 * API, ExternalCorrelation, Synchronization2, Overhead3); the stride is always CUPTI's own
 * (cuptiActivityGetNextRecord), never computed here.
 *
 * Buffer pool: at most max_bufs buffers of buf_bytes (KPROF_BUFFER_BYTES, default 4 MiB;
 * KPROF_MAX_BUFFER_BYTES in all, default 64 MiB), zeroed (CUPTI is told so:
 * ZEROED_OUT_ACTIVITY_BUFFER=1, so it does not zero them on application threads). The worker
 * allocates them lazily, keeping a few spare while kinds are enabled; the request callback only
 * pops a spare (or declines with NULL and counts), so no CUPTI callback ever allocates. The
 * complete callback (any thread, possibly synchronously inside cuptiActivityFlushAll on the
 * worker) appends (buffer, validSize) to the completed FIFO and wakes the worker; it never
 * calls CUPTI. g_pool.mu guards only those two arrays and is never held across a CUPTI call.
 * The worker decodes a completed buffer, re-zeroes its valid bytes and returns it to the pool.
 */
#include "cupti_int.h"

#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- function table ---- */

struct kpi_cupti_fns {
    CUptiResult (*GetVersion)(uint32_t *);
    CUptiResult (*GetResultString)(CUptiResult, const char **);
    CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc,
                                             CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*ActivitySetAttribute)(CUpti_ActivityAttribute, size_t *, void *);
    CUptiResult (*ActivityEnable)(CUpti_ActivityKind);
    CUptiResult (*ActivityDisable)(CUpti_ActivityKind);
    CUptiResult (*ActivityFlushAll)(uint32_t);
    CUptiResult (*ActivityGetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t *);
    CUptiResult (*ActivityPushExternalCorrelationId)(CUpti_ExternalCorrelationKind, uint64_t);
    CUptiResult (*ActivityPopExternalCorrelationId)(CUpti_ExternalCorrelationKind, uint64_t *);
    CUptiResult (*SetThreadIdType)(CUpti_ActivityThreadIdType);
    CUptiResult (*GetTimestamp)(uint64_t *);
    /* optional */
    CUptiResult (*ActivityEnableRuntimeApi)(CUpti_CallbackId, uint8_t);
    CUptiResult (*ActivityEnableDriverApi)(CUpti_CallbackId, uint8_t);
    CUptiResult (*GetCallbackName)(CUpti_CallbackDomain, uint32_t, const char **);
    CUptiResult (*Finalize)(void);
};

static struct kpi_cupti_fns g_fn;
static atomic_int g_usable; /* 1 once init succeeded (release) */

#define SYM(field, name, required)                            \
    {                                                         \
        offsetof(struct kpi_cupti_fns, field), name, required \
    }
static const struct {
    size_t off;
    const char *name;
    int required;
} g_syms[] = {
    SYM(GetVersion, "cuptiGetVersion", 1),
    SYM(GetResultString, "cuptiGetResultString", 1),
    SYM(ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks", 1),
    SYM(ActivitySetAttribute, "cuptiActivitySetAttribute", 1),
    SYM(ActivityEnable, "cuptiActivityEnable", 1),
    SYM(ActivityDisable, "cuptiActivityDisable", 1),
    SYM(ActivityFlushAll, "cuptiActivityFlushAll", 1),
    SYM(ActivityGetNextRecord, "cuptiActivityGetNextRecord", 1),
    SYM(ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords", 1),
    SYM(ActivityPushExternalCorrelationId, "cuptiActivityPushExternalCorrelationId", 1),
    SYM(ActivityPopExternalCorrelationId, "cuptiActivityPopExternalCorrelationId", 1),
    SYM(SetThreadIdType, "cuptiSetThreadIdType", 1),
    SYM(GetTimestamp, "cuptiGetTimestamp", 1),
    SYM(ActivityEnableRuntimeApi, "cuptiActivityEnableRuntimeApi", 0),
    SYM(ActivityEnableDriverApi, "cuptiActivityEnableDriverApi", 0),
    SYM(GetCallbackName, "cuptiGetCallbackName", 0),
    SYM(Finalize, "cuptiFinalize", 0),
};
#undef SYM

int kpi_cupti_usable(void)
{
    return atomic_load_explicit(&g_usable, memory_order_acquire) &&
           !atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed);
}

static const char *result_name(CUptiResult r)
{
    const char *s = NULL;

    if (g_fn.GetResultString == NULL || g_fn.GetResultString(r, &s) != CUPTI_SUCCESS || s == NULL) {
        return "CUPTI_ERROR_?";
    }
    return s;
}

/* What a user should do about an error from enabling or starting CUPTI. */
static const char *result_hint(CUptiResult r)
{
    switch ((int) r) {
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        return "another profiler (torch.profiler, Nsight, compute-sanitizer) holds CUPTI in this "
               "process; stop it, or capture when it is not running";
    case CUPTI_ERROR_NOT_INITIALIZED:
    case CUPTI_ERROR_UNKNOWN:
        return "CUPTI could not start (no GPU or driver older than CUDA 13)";
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
        return "GPU profiling is restricted to admin users on this host "
               "(NVreg_RestrictProfilingToAdminUsers=1)";
    case CUPTI_ERROR_NOT_SUPPORTED:
        return "not supported on this device or platform (vGPU, MIG, WSL?); capture fewer "
               "activities";
    default:
        return "see the CUPTI documentation for this error";
    }
}

static void *try_open(const char *path, int flags, char *err, size_t cap)
{
    void *h = dlopen(path, flags);
    const char *e;

    if (h == NULL && err != NULL && err[0] == '\0') {
        e = dlerror();
        snprintf(err, cap, "%s", e != NULL ? e : path);
    }
    return h;
}

static void *open_cupti(char *where, size_t where_cap)
{
    static const char *const paths[] = {
        "libcupti.so.13",
        "/usr/local/cuda/lib64/libcupti.so.13",
        "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
    };
    const char *env = getenv("KPROF_CUPTI_PATH");
    char err[200] = "";
    void *h;

    /* The copy PyTorch (or anyone) already mapped: one CUPTI per process. */
    h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
    if (h != NULL) {
        snprintf(where, where_cap, "libcupti.so.13 (already loaded)");
        return h;
    }
    if (env != NULL && *env != '\0') {
        h = try_open(env, RTLD_NOW | RTLD_LOCAL, err, sizeof(err));
        if (h == NULL) {
            snprintf(kpi_core.cupti_error, sizeof(kpi_core.cupti_error),
                     "KPROF_CUPTI_PATH=%.80s cannot be loaded (%.60s); point it at CUDA 13's "
                     "libcupti.so.13 or unset it",
                     env, err);
            return NULL;
        }
        snprintf(where, where_cap, "%s", env);
        return h;
    }
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        h = try_open(paths[i], RTLD_NOW | RTLD_LOCAL, err, sizeof(err));
        if (h != NULL) {
            snprintf(where, where_cap, "%s", paths[i]);
            return h;
        }
    }
    snprintf(kpi_core.cupti_error, sizeof(kpi_core.cupti_error),
             "libcupti.so.13 not found (%.80s); install CUDA 13's CUPTI, add its lib64 to "
             "LD_LIBRARY_PATH or set KPROF_CUPTI_PATH",
             err);
    return NULL;
}

/* ---- buffer pool ---- */

struct kpi_done {
    uint8_t *buf;
    size_t valid;
};

static struct {
    pthread_mutex_t mu; /* guards free/nfree and done/done_head/ndone only */
    size_t buf_bytes;   /* multiple of 8 */
    uint32_t max_bufs;  /* pool limit */
    uint32_t nbufs;     /* allocated so far (worker only) */
    uint8_t **free;     /* [max_bufs] zeroed buffers ready to hand out */
    uint32_t nfree;
    struct kpi_done *done; /* [max_bufs] FIFO of completed buffers */
    uint32_t done_head, ndone;
    atomic_uint spare_low; /* a request found the pool low: the worker should top up */
} g_pool = { .mu = PTHREAD_MUTEX_INITIALIZER };

#define KPI_POOL_SPARE 2u /* spare buffers the worker keeps while kinds are enabled */
#define KPI_POOL_FIRST 4u /* spare buffers made when a capture enables kinds */

static void pool_add(uint32_t want_free)
{
    for (;;) {
        uint8_t *b;
        uint32_t nfree;

        pthread_mutex_lock(&g_pool.mu);
        nfree = g_pool.nfree;
        pthread_mutex_unlock(&g_pool.mu);
        if (nfree >= want_free || g_pool.nbufs >= g_pool.max_bufs) {
            return;
        }
        b = calloc(1, g_pool.buf_bytes);
        if (b == NULL) {
            static int logged;
            if (!logged) {
                kpi_log("cannot allocate a %zu-byte CUPTI buffer: records will be dropped "
                        "(lower KPROF_BUFFER_BYTES?)",
                        g_pool.buf_bytes);
                logged = 1;
            }
            return;
        }
        g_pool.nbufs++;
        pthread_mutex_lock(&g_pool.mu);
        g_pool.free[g_pool.nfree++] = b;
        pthread_mutex_unlock(&g_pool.mu);
    }
}

void kpi_cupti_pool_topup(void)
{
    if (!kpi_cupti_usable()) {
        return;
    }
    atomic_store_explicit(&g_pool.spare_low, 0, memory_order_relaxed);
    pool_add(KPI_POOL_SPARE);
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    uint8_t *b = NULL;
    uint32_t left = 0;

    pthread_mutex_lock(&g_pool.mu);
    if (g_pool.nfree > 0) {
        b = g_pool.free[--g_pool.nfree];
        left = g_pool.nfree;
    }
    pthread_mutex_unlock(&g_pool.mu);
    atomic_fetch_add_explicit(&kpi_core.c.buffers_requested, 1, memory_order_relaxed);
    *max_records = 0;
    if (b == NULL) {
        /* Pool exhausted (or not topped up yet): decline; CUPTI drops and counts. */
        atomic_fetch_add_explicit(&kpi_core.c.buffers_declined, 1, memory_order_relaxed);
        *buffer = NULL;
        *size = 0;
    }
    else {
        *buffer = b;
        *size = g_pool.buf_bytes;
    }
    if (left < KPI_POOL_SPARE) {
        atomic_store_explicit(&g_pool.spare_low, 1, memory_order_relaxed);
        kpi_wake();
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    int queued = 0;

    if (buffer == NULL) {
        return;
    }
    pthread_mutex_lock(&g_pool.mu);
    if (g_pool.ndone < g_pool.max_bufs) {
        uint32_t i = (g_pool.done_head + g_pool.ndone) % g_pool.max_bufs;
        g_pool.done[i].buf = buffer;
        g_pool.done[i].valid = valid <= g_pool.buf_bytes ? valid : g_pool.buf_bytes;
        g_pool.ndone++;
        queued = 1;
    }
    pthread_mutex_unlock(&g_pool.mu);
    if (queued) {
        atomic_fetch_add_explicit(&kpi_core.c.buffers_completed, 1, memory_order_relaxed);
        kpi_wake();
    }
}

/* ---- init ---- */

int kpi_cupti_init(void)
{
    char where[300] = "";
    void *h;
    uint32_t ver = 0;
    CUptiResult r;
    uint8_t one = 1;
    size_t sz = sizeof(one);
    uint64_t total;

    h = open_cupti(where, sizeof(where));
    if (h == NULL) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(g_syms) / sizeof(g_syms[0]); i++) {
        void *p = dlsym(h, g_syms[i].name);
        if (p == NULL && g_syms[i].required) {
            snprintf(kpi_core.cupti_error, sizeof(kpi_core.cupti_error),
                     "%.80s lacks %.40s: not a CUDA 13 libcupti; set KPROF_CUPTI_PATH to CUDA 13's "
                     "libcupti.so.13",
                     where, g_syms[i].name);
            memset(&g_fn, 0, sizeof(g_fn));
            return -1;
        }
        memcpy((char *) &g_fn + g_syms[i].off, &p, sizeof(p));
    }
    r = g_fn.GetVersion(&ver);
    if (r != CUPTI_SUCCESS || ver < KPI_MIN_CUPTI) {
        snprintf(
            kpi_core.cupti_error, sizeof(kpi_core.cupti_error),
            "%.80s reports CUPTI API version %u (%.40s); kprof needs >= %u (CUDA 13.0 Update 1): "
            "upgrade CUDA/CUPTI",
            where, ver, r == CUPTI_SUCCESS ? "too old" : result_name(r), KPI_MIN_CUPTI);
        return -1;
    }
    kpi_core.cupti_version = ver;

    g_pool.buf_bytes =
        (size_t) kpi_env_size("KPROF_BUFFER_BYTES", KPI_DEF_BUFFER_BYTES, 64u << 10, 256u << 20);
    g_pool.buf_bytes = (g_pool.buf_bytes + 7u) & ~(size_t) 7u;
    total =
        kpi_env_size("KPROF_MAX_BUFFER_BYTES", KPI_DEF_MAX_BUFFERS, g_pool.buf_bytes, 16ull << 30);
    g_pool.max_bufs = (uint32_t) (total / g_pool.buf_bytes);
    if (g_pool.max_bufs == 0) {
        g_pool.max_bufs = 1;
    }
    g_pool.free = calloc(g_pool.max_bufs, sizeof(*g_pool.free));
    g_pool.done = calloc(g_pool.max_bufs, sizeof(*g_pool.done));
    if (g_pool.free == NULL || g_pool.done == NULL) {
        snprintf(kpi_core.cupti_error, sizeof(kpi_core.cupti_error), "out of memory at init");
        goto fail;
    }

    /* Attributes that must precede context creation; failures only degrade. */
    r = g_fn.ActivitySetAttribute(CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, &sz, &one);
    if (r != CUPTI_SUCCESS) {
        kpi_logl(KPI_LOG_INFO, "cuptiActivitySetAttribute(ZEROED_OUT_ACTIVITY_BUFFER): %s",
                 result_name(r));
    }
    r = g_fn.SetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
    if (r != CUPTI_SUCCESS) {
        kpi_logl(KPI_LOG_INFO, "cuptiSetThreadIdType(SYSTEM): %s (thread ids are pthread ids)",
                 result_name(r));
    }
    r = g_fn.ActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        snprintf(kpi_core.cupti_error, sizeof(kpi_core.cupti_error),
                 "cuptiActivityRegisterCallbacks failed: %s: %s", result_name(r), result_hint(r));
        goto fail;
    }
    atomic_store_explicit(&g_usable, 1, memory_order_release);
    kpi_logl(KPI_LOG_INFO, "CUPTI %u from %s; buffers %zu B x %u", ver, where, g_pool.buf_bytes,
             g_pool.max_bufs);
    return 0;
fail:
    free(g_pool.free);
    free(g_pool.done);
    g_pool.free = NULL;
    g_pool.done = NULL;
    return -1;
}

/* ---- enabling kinds ---- */

static CUpti_ActivityKind g_on[16]; /* kinds enabled now, in enable order (worker only) */
static unsigned g_non;
static int g_driver_on; /* the driver launch cbids are on */

static const CUpti_CallbackId g_noisy_runtime[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaSetDevice_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaGetLastError_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaPeekAtLastError_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaEventCreate_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaEventCreateWithFlags_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaEventDestroy_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaDeviceGetAttribute_v5000,
    CUPTI_RUNTIME_TRACE_CBID_cudaStreamIsCapturing_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaPointerGetAttributes_v4000,
};

static const CUpti_CallbackId g_driver_launch[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,   CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

static const char *kind_name(CUpti_ActivityKind k)
{
    switch (k) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        return "CONCURRENT_KERNEL";
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        return "MEMCPY";
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
        return "MEMCPY2";
    case CUPTI_ACTIVITY_KIND_MEMSET:
        return "MEMSET";
    case CUPTI_ACTIVITY_KIND_RUNTIME:
        return "RUNTIME";
    case CUPTI_ACTIVITY_KIND_DRIVER:
        return "DRIVER";
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
        return "EXTERNAL_CORRELATION";
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
        return "SYNCHRONIZATION";
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
        return "OVERHEAD";
    default:
        return "?";
    }
}

/* Whether a driver API record is a launch (the only driver calls kprof keeps). */
static int driver_launch_cbid(CUpti_CallbackId cbid)
{
    for (size_t i = 0; i < sizeof(g_driver_launch) / sizeof(g_driver_launch[0]); i++) {
        if (g_driver_launch[i] == cbid) {
            return 1;
        }
    }
    return 0;
}

static void driver_launch_set(uint8_t on)
{
    if (g_fn.ActivityEnableDriverApi == NULL) {
        return;
    }
    for (size_t i = 0; i < sizeof(g_driver_launch) / sizeof(g_driver_launch[0]); i++) {
        CUptiResult r = g_fn.ActivityEnableDriverApi(g_driver_launch[i], on);
        if (r != CUPTI_SUCCESS) {
            kpi_logl(KPI_LOG_DEBUG, "cuptiActivityEnableDriverApi(%u, %u): %s",
                     (unsigned) g_driver_launch[i], (unsigned) on, result_name(r));
        }
    }
}

void kpi_cupti_disable(void)
{
    while (g_non > 0) {
        CUpti_ActivityKind k = g_on[--g_non];
        CUptiResult r = g_fn.ActivityDisable(k);
        if (r != CUPTI_SUCCESS) {
            kpi_logl(KPI_LOG_INFO, "cuptiActivityDisable(%s): %s", kind_name(k), result_name(r));
        }
    }
    if (g_driver_on) {
        driver_launch_set(0);
        g_driver_on = 0;
    }
    atomic_store_explicit(&kpi_core.c.enabled_kinds, 0, memory_order_relaxed);
}

int kpi_cupti_enable(uint32_t acts, char *why, size_t cap)
{
    CUpti_ActivityKind want[16];
    unsigned n = 0;

    if (!kpi_cupti_usable()) {
        snprintf(why, cap, "%s",
                 kpi_core.cupti_error[0] != '\0' ? kpi_core.cupti_error : "CUPTI is unavailable");
        return -1;
    }
    if (acts == 0) {
        acts = KP_ACT_DEFAULT;
    }
    /* Never KIND_KERNEL: it serializes every kernel. */
    if (acts & KP_ACT_KERNEL) {
        want[n++] = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    }
    if (acts & KP_ACT_MEMCPY) {
        want[n++] = CUPTI_ACTIVITY_KIND_MEMCPY;
        want[n++] = CUPTI_ACTIVITY_KIND_MEMCPY2;
    }
    if (acts & KP_ACT_MEMSET) {
        want[n++] = CUPTI_ACTIVITY_KIND_MEMSET;
    }
    /* External correlation records come only with API records: NVTX needs RUNTIME. */
    if (acts & (KP_ACT_RUNTIME | KP_ACT_NVTX)) {
        want[n++] = CUPTI_ACTIVITY_KIND_RUNTIME;
    }
    /* The whole DRIVER kind, as Kineto enables it: cuBLAS(Lt) and Triton launch through
     * cuLaunchKernel(Ex), and only with the kind on does CUPTI emit those calls' records and
     * their external correlation (a real H200 showed per-cbid enabling alone yields neither,
     * leaving cutlass GEMMs without their aten::mm). decode keeps the launch calls only. */
    if (acts & (KP_ACT_RUNTIME | KP_ACT_NVTX)) {
        want[n++] = CUPTI_ACTIVITY_KIND_DRIVER;
    }
    if (acts & KP_ACT_NVTX) {
        want[n++] = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    }
    if (acts & KP_ACT_SYNC) {
        want[n++] = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    }
    if (acts & KP_ACT_OVERHEAD) {
        want[n++] = CUPTI_ACTIVITY_KIND_OVERHEAD;
    }
    kpi_cupti_disable();
    pool_add(KPI_POOL_FIRST < g_pool.max_bufs ? KPI_POOL_FIRST : g_pool.max_bufs);
    for (unsigned i = 0; i < n; i++) {
        CUptiResult r = g_fn.ActivityEnable(want[i]);
        if (r != CUPTI_SUCCESS) {
            snprintf(why, cap, "cuptiActivityEnable(%s) failed with %s (%d): %s",
                     kind_name(want[i]), result_name(r), (int) r, result_hint(r));
            kpi_cupti_disable();
            return -1;
        }
        g_on[g_non++] = want[i];
        atomic_store_explicit(&kpi_core.c.enabled_kinds, g_non, memory_order_relaxed);
        if (want[i] == CUPTI_ACTIVITY_KIND_RUNTIME && g_fn.ActivityEnableRuntimeApi != NULL) {
            for (size_t j = 0; j < sizeof(g_noisy_runtime) / sizeof(g_noisy_runtime[0]); j++) {
                r = g_fn.ActivityEnableRuntimeApi(g_noisy_runtime[j], 0);
                if (r != CUPTI_SUCCESS) {
                    kpi_logl(KPI_LOG_DEBUG, "cuptiActivityEnableRuntimeApi(%u, 0): %s",
                             (unsigned) g_noisy_runtime[j], result_name(r));
                }
            }
        }
    }
    if (acts & KP_ACT_RUNTIME) {
        /* Driver launches only (Triton's cuLaunchKernel, graph launches); not the DRIVER kind. */
        driver_launch_set(1);
        g_driver_on = 1;
    }
    return 0;
}

void kpi_cupti_flush(uint32_t flag)
{
    CUptiResult r;

    if (!kpi_cupti_usable()) {
        return;
    }
    r = g_fn.ActivityFlushAll(flag);
    if (r != CUPTI_SUCCESS) {
        kpi_logl(KPI_LOG_DEBUG, "cuptiActivityFlushAll(%u): %s", flag, result_name(r));
    }
}

uint64_t kpi_cupti_take_dropped(void)
{
    size_t n = 0;

    if (!kpi_cupti_usable()) {
        return 0;
    }
    if (g_fn.ActivityGetNumDroppedRecords(NULL, 0, &n) != CUPTI_SUCCESS) {
        return 0;
    }
    return n;
}

void kpi_cupti_push_ext(uint64_t id)
{
    if (kpi_cupti_usable()) {
        g_fn.ActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, id);
    }
}

void kpi_cupti_pop_ext(void)
{
    uint64_t last = 0;

    if (kpi_cupti_usable()) {
        g_fn.ActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, &last);
    }
}

/* ---- decode ---- */

#define KPI_EXT_CACHE  4096u /* correlationId → CUSTOM2 external id, direct-mapped */
#define KPI_CBID_CACHE 2048u /* (domain, cbid) → name id */
#define KPI_CTX_CACHE  64u   /* contextId → deviceId, direct-mapped */

static struct {
    uint32_t corr;
    uint64_t ext;
} g_ext[KPI_EXT_CACHE];
static uint32_t g_cbname[2][KPI_CBID_CACHE];
static struct {
    uint32_t ctx_plus1;
    uint32_t dev;
} g_ctx[KPI_CTX_CACHE];

static void learn_device(uint32_t dev, uint32_t ctx)
{
    int unknown = -1;

    g_ctx[ctx % KPI_CTX_CACHE].ctx_plus1 = ctx + 1;
    g_ctx[ctx % KPI_CTX_CACHE].dev = dev;
    if (atomic_load_explicit(&kpi_core.device, memory_order_relaxed) == -1) {
        atomic_compare_exchange_strong(&kpi_core.device, &unknown, (int) dev);
    }
}

static uint32_t ctx_device(uint32_t ctx)
{
    int dev;

    if (g_ctx[ctx % KPI_CTX_CACHE].ctx_plus1 == ctx + 1) {
        return g_ctx[ctx % KPI_CTX_CACHE].dev;
    }
    dev = atomic_load_explicit(&kpi_core.device, memory_order_relaxed);
    return dev >= 0 ? (uint32_t) dev : UINT32_MAX;
}

static uint32_t intern_cstr(const char *s)
{
    return s != NULL ? kpi_intern(s, strnlen(s, 65536)) : 0;
}

/*
 * Kernel names: CUPTI hands the same few hundred (often very long) names over and over, so
 * the worker keeps a direct-mapped cache keyed by the name pointer, holding its own copy of
 * the text. A hit is confirmed by comparing the text (strncmp stops at the NUL, so a reused
 * pointer to another string can never be taken for the old name); a miss interns as usual.
 * Worker thread only.
 */
#define KPI_NAME_CACHE     512
#define KPI_NAME_CACHE_MAX 512 /* longer names are not cached */

struct kpi_name_slot {
    const char *ptr;
    uint32_t id;
    uint32_t len;
    char text[KPI_NAME_CACHE_MAX + 1];
};
static struct kpi_name_slot *g_name_cache;

static uint32_t intern_kernel_name(const char *s)
{
    struct kpi_name_slot *e;
    size_t len;

    if (s == NULL) {
        return 0;
    }
    if (g_name_cache == NULL) {
        g_name_cache = calloc(KPI_NAME_CACHE, sizeof(*g_name_cache));
        if (g_name_cache == NULL) {
            return intern_cstr(s);
        }
    }
    e = &g_name_cache[((uintptr_t) s >> 3) % KPI_NAME_CACHE];
    if (e->ptr == s && strncmp(s, e->text, (size_t) e->len + 1) == 0) {
        return e->id;
    }
    len = strnlen(s, 65536);
    uint32_t id = kpi_intern(s, len);
    if (len <= KPI_NAME_CACHE_MAX) {
        e->ptr = s;
        e->id = id;
        e->len = (uint32_t) len;
        memcpy(e->text, s, len);
        e->text[len] = '\0';
    }
    return id;
}

/* "cudaLaunchKernel_v7000" → "cudaLaunchKernel": the version suffix is CUPTI's, not the API's. */
static size_t api_name_len(const char *s)
{
    size_t n = strlen(s);
    size_t i = n;

    while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9') {
        i--;
    }
    if (i < n && i >= 2 && s[i - 1] == 'v' && s[i - 2] == '_') {
        return i - 2;
    }
    return n;
}

static uint32_t api_name(uint32_t domain, uint32_t cbid)
{
    const char *s = NULL;
    char buf[32];
    uint32_t id;

    if (cbid < KPI_CBID_CACHE && g_cbname[domain - 1][cbid] != 0) {
        return g_cbname[domain - 1][cbid];
    }
    if (g_fn.GetCallbackName != NULL &&
        g_fn.GetCallbackName(domain == 1 ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                             cbid, &s) == CUPTI_SUCCESS &&
        s != NULL && *s != '\0') {
        id = kpi_intern(s, api_name_len(s));
    }
    else {
        int n = snprintf(buf, sizeof(buf), "cbid:%u", cbid);
        id = kpi_intern(buf, n > 0 ? (size_t) n : 0);
    }
    if (cbid < KPI_CBID_CACHE) {
        g_cbname[domain - 1][cbid] = id;
    }
    return id;
}

static const char *overhead_name(uint32_t kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_OVERHEAD_DRIVER_COMPILER:
        return "overhead:driver_compiler";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH:
        return "overhead:cupti_buffer_flush";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_INSTRUMENTATION:
        return "overhead:cupti_instrumentation";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_RESOURCE:
        return "overhead:cupti_resource";
    case CUPTI_ACTIVITY_OVERHEAD_RUNTIME_TRIGGERED_MODULE_LOADING:
        return "overhead:runtime_module_loading";
    case CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING:
        return "overhead:lazy_function_loading";
    case CUPTI_ACTIVITY_OVERHEAD_COMMAND_BUFFER_FULL:
        return "overhead:command_buffer_full";
    case CUPTI_ACTIVITY_OVERHEAD_ACTIVITY_BUFFER_REQUEST:
        return "overhead:activity_buffer_request";
    case CUPTI_ACTIVITY_OVERHEAD_UVM_ACTIVITY_INIT:
        return "overhead:uvm_activity_init";
    default:
        return "overhead:unknown";
    }
}

/* 1 if the record is to be kept; counts incomplete and pre-window records otherwise. */
static int keep(struct kpi_sink *sink, uint64_t start, uint64_t end)
{
    if (start == 0 && end == 0) {
        sink->incomplete++;
        atomic_fetch_add_explicit(&kpi_core.c.incomplete, 1, memory_order_relaxed);
        return 0;
    }
    if ((int64_t) start < sink->min_start_ns) {
        sink->discarded++;
        return 0;
    }
    return 1;
}

static void decode_kernel(const CUpti_ActivityKernel10 *k, struct kpi_sink *sink)
{
    struct kp_wire_kernel w;

    learn_device(k->deviceId, k->contextId);
    if (!keep(sink, k->start, k->end)) {
        return;
    }
    memset(&w, 0, sizeof(w));
    w.start_ns = (int64_t) k->start;
    w.end_ns = (int64_t) k->end;
    w.correlation = k->correlationId;
    w.graph_node_id = k->graphNodeId;
    w.name = intern_kernel_name(k->name); /* CUPTI owns the pointer: only valid now */
    w.device = k->deviceId;
    w.context = k->contextId;
    w.stream = k->streamId;
    w.grid_x = (uint32_t) k->gridX;
    w.grid_y = (uint32_t) k->gridY;
    w.grid_z = (uint32_t) k->gridZ;
    w.block_x = (uint32_t) k->blockX;
    w.block_y = (uint32_t) k->blockY;
    w.block_z = (uint32_t) k->blockZ;
    w.registers = k->registersPerThread;
    w.static_smem = (uint32_t) k->staticSharedMemory;
    w.dynamic_smem = (uint32_t) k->dynamicSharedMemory;
    w.graph_id = k->graphId;
    sink->rec(sink->ctx, KP_REC_KERNEL, &w, w.name, w.start_ns);
}

/* Memcpy6 and MemcpyPtoP4 share these fields (same names, same meaning). */
#define KPI_MEMCPY_FIELDS(w, m)               \
    do {                                      \
        (w).start_ns = (int64_t) (m)->start;  \
        (w).end_ns = (int64_t) (m)->end;      \
        (w).bytes = (m)->bytes;               \
        (w).correlation = (m)->correlationId; \
        (w).copy_kind = (m)->copyKind;        \
        (w).src_kind = (m)->srcKind;          \
        (w).dst_kind = (m)->dstKind;          \
        (w).device = (m)->deviceId;           \
        (w).context = (m)->contextId;         \
        (w).stream = (m)->streamId;           \
    } while (0)

static void decode_memcpy(const CUpti_ActivityMemcpy6 *m, struct kpi_sink *sink)
{
    struct kp_wire_memcpy w;

    learn_device(m->deviceId, m->contextId);
    if (!keep(sink, m->start, m->end)) {
        return;
    }
    memset(&w, 0, sizeof(w));
    KPI_MEMCPY_FIELDS(w, m);
    w.src_device = m->deviceId;
    w.dst_device = m->deviceId;
    sink->rec(sink->ctx, KP_REC_MEMCPY, &w, 0, w.start_ns);
}

static void decode_p2p(const CUpti_ActivityMemcpyPtoP4 *m, struct kpi_sink *sink)
{
    struct kp_wire_memcpy w;

    learn_device(m->deviceId, m->contextId);
    if (!keep(sink, m->start, m->end)) {
        return;
    }
    memset(&w, 0, sizeof(w));
    KPI_MEMCPY_FIELDS(w, m);
    w.src_device = m->srcDeviceId;
    w.dst_device = m->dstDeviceId;
    sink->rec(sink->ctx, KP_REC_MEMCPY, &w, 0, w.start_ns);
}

static void decode_memset(const CUpti_ActivityMemset4 *m, struct kpi_sink *sink)
{
    struct kp_wire_memset w;

    learn_device(m->deviceId, m->contextId);
    if (!keep(sink, m->start, m->end)) {
        return;
    }
    memset(&w, 0, sizeof(w));
    w.start_ns = (int64_t) m->start;
    w.end_ns = (int64_t) m->end;
    w.bytes = m->bytes;
    w.correlation = m->correlationId;
    w.value = m->value;
    w.mem_kind = m->memoryKind;
    w.device = m->deviceId;
    w.context = m->contextId;
    w.stream = m->streamId;
    sink->rec(sink->ctx, KP_REC_MEMSET, &w, 0, w.start_ns);
}

static void decode_api(const CUpti_ActivityAPI *a, uint32_t domain, struct kpi_sink *sink)
{
    struct kp_wire_api w;
    uint32_t slot = a->correlationId % KPI_EXT_CACHE;

    if (!keep(sink, a->start, a->end)) {
        return;
    }
    memset(&w, 0, sizeof(w));
    w.start_ns = (int64_t) a->start;
    w.end_ns = (int64_t) a->end;
    w.correlation = a->correlationId;
    if (g_ext[slot].corr == a->correlationId && g_ext[slot].ext != 0) {
        w.external_id = g_ext[slot].ext;
    }
    w.tid = a->threadId;
    w.domain = domain;
    w.cbid = a->cbid;
    w.name = api_name(domain, a->cbid);
    w.return_value = (int32_t) a->returnValue;
    sink->rec(sink->ctx, KP_REC_API, &w, w.name, w.start_ns);
}

static void decode_sync(const CUpti_ActivitySynchronization2 *s, struct kpi_sink *sink)
{
    struct kp_wire_sync w;

    if (!keep(sink, s->start, s->end)) {
        return;
    }
    memset(&w, 0, sizeof(w));
    w.start_ns = (int64_t) s->start;
    w.end_ns = (int64_t) s->end;
    w.correlation = s->correlationId;
    w.sync_type = (uint32_t) s->type;
    /* CUPTI_SYNCHRONIZATION_INVALID_VALUE marks a field that does not apply (no stream for a
     * context sync, no event for a stream sync): those travel as 0 (kp_wire.h). The device
     * comes from the context when known, else the process's device, else 0. */
    if (s->contextId != CUPTI_SYNCHRONIZATION_INVALID_VALUE) {
        w.device = ctx_device(s->contextId);
        w.context = s->contextId;
    }
    else {
        w.device = ctx_device(UINT32_MAX - 1); /* no such context: the process's device */
    }
    if (w.device == UINT32_MAX) {
        w.device = 0;
    }
    w.stream = s->streamId != CUPTI_SYNCHRONIZATION_INVALID_VALUE ? s->streamId : 0;
    w.cuda_event = s->cudaEventId != CUPTI_SYNCHRONIZATION_INVALID_VALUE ? s->cudaEventId : 0;
    sink->rec(sink->ctx, KP_REC_SYNC, &w, 0, w.start_ns);
}

static void decode_overhead(const CUpti_ActivityOverhead3 *o, struct kpi_sink *sink)
{
    struct kp_wire_api w;
    const char *name;

    if (!keep(sink, o->start, o->end)) {
        return;
    }
    memset(&w, 0, sizeof(w));
    w.start_ns = (int64_t) o->start;
    w.end_ns = (int64_t) o->end;
    w.correlation = o->correlationId;
    if (o->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ||
        o->objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS) {
        w.tid = o->objectId.pt.threadId;
    }
    w.domain = 3;
    w.cbid = (uint32_t) o->overheadKind;
    name = overhead_name((uint32_t) o->overheadKind);
    w.name = kpi_intern(name, strlen(name));
    if (o->end > o->start) {
        sink->overhead_ns += o->end - o->start;
    }
    sink->rec(sink->ctx, KP_REC_API, &w, w.name, w.start_ns);
}

static void decode_one(const CUpti_Activity *r, struct kpi_sink *sink)
{
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        decode_kernel((const CUpti_ActivityKernel10 *) r, sink);
        break;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        decode_memcpy((const CUpti_ActivityMemcpy6 *) r, sink);
        break;
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
        decode_p2p((const CUpti_ActivityMemcpyPtoP4 *) r, sink);
        break;
    case CUPTI_ACTIVITY_KIND_MEMSET:
        decode_memset((const CUpti_ActivityMemset4 *) r, sink);
        break;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
        decode_api((const CUpti_ActivityAPI *) r, 1, sink);
        break;
    case CUPTI_ACTIVITY_KIND_DRIVER:
        if (driver_launch_cbid(((const CUpti_ActivityAPI *) r)->cbid)) {
            decode_api((const CUpti_ActivityAPI *) r, 2, sink);
        }
        break;
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        /* Emitted before the API record it belongs to (same thread, same buffer). */
        const CUpti_ActivityExternalCorrelation *e = (const CUpti_ActivityExternalCorrelation *) r;
        if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2) {
            g_ext[e->correlationId % KPI_EXT_CACHE].corr = e->correlationId;
            g_ext[e->correlationId % KPI_EXT_CACHE].ext = e->externalId;
        }
        break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
        decode_sync((const CUpti_ActivitySynchronization2 *) r, sink);
        break;
    case CUPTI_ACTIVITY_KIND_OVERHEAD:
        decode_overhead((const CUpti_ActivityOverhead3 *) r, sink);
        break;
    default:
        break; /* a kind we did not enable (another client's?) */
    }
}

static size_t decode_buffer(uint8_t *buf, size_t valid, struct kpi_sink *sink)
{
    CUpti_Activity *r = NULL;
    size_t n = 0;

    for (;;) {
        CUptiResult st = g_fn.ActivityGetNextRecord(buf, valid, &r);
        if (st == CUPTI_SUCCESS) {
            n++;
            decode_one(r, sink);
            continue;
        }
        if (st == CUPTI_ERROR_INVALID_KIND) {
            /* A newer kind we cannot stride over: the rest of this buffer is lost. */
            atomic_fetch_add_explicit(&kpi_core.c.unknown_kind, 1, memory_order_relaxed);
            kpi_logl(KPI_LOG_INFO, "CUPTI buffer holds an unknown record kind: skipped the rest "
                                   "of the buffer");
        }
        else if (st != CUPTI_ERROR_MAX_LIMIT_REACHED) {
            kpi_logl(KPI_LOG_INFO, "cuptiActivityGetNextRecord: %s", result_name(st));
        }
        break;
    }
    return n;
}

size_t kpi_cupti_drain(struct kpi_sink *sink)
{
    size_t total = 0;

    if (!kpi_cupti_usable()) {
        return 0;
    }
    if (atomic_load_explicit(&g_pool.spare_low, memory_order_relaxed) &&
        atomic_load_explicit(&kpi_core.c.enabled_kinds, memory_order_relaxed) > 0) {
        kpi_cupti_pool_topup();
    }
    for (;;) {
        struct kpi_done d = { NULL, 0 };
        size_t n;

        pthread_mutex_lock(&g_pool.mu);
        if (g_pool.ndone > 0) {
            d = g_pool.done[g_pool.done_head];
            g_pool.done_head = (g_pool.done_head + 1) % g_pool.max_bufs;
            g_pool.ndone--;
        }
        pthread_mutex_unlock(&g_pool.mu);
        if (d.buf == NULL) {
            break;
        }
        n = d.valid > 0 ? decode_buffer(d.buf, d.valid, sink) : 0;
        total += n;
        atomic_fetch_add_explicit(&kpi_core.c.records_decoded, n, memory_order_relaxed);
        memset(d.buf, 0, d.valid); /* CUPTI was promised zeroed buffers */
        pthread_mutex_lock(&g_pool.mu);
        if (g_pool.nfree < g_pool.max_bufs) {
            g_pool.free[g_pool.nfree++] = d.buf;
            d.buf = NULL;
        }
        pthread_mutex_unlock(&g_pool.mu);
        /* d.buf != NULL: every buffer of ours is already free, so this one was never ours
         * (a foreign buffer): leave it alone. */
    }
    return total;
}
