/*
 * inject.c: entry points of libkprof_inject.so (InitializeInjection, kprof_step,
 * kprof_get_stats), the process identity, step events, logging, fork and exit handling.
 *
 * DESIGN
 * InitializeInjection runs inside the application's first cuInit: it only reads the
 * environment, resolves CUPTI (cupti.c), installs the fork and exit handlers and starts the
 * worker thread (worker.c); it never touches the network or CUDA. Any failure leaves the
 * library dormant with the reason kept for the agent (HELLO.cupti_error, STATUS.reason).
 *
 * Application threads only touch atomics here: kprof_step stores the step and, while a
 * capture is ARMED/WARMUP/CAPTURING (capture_live), queues a step event in a bounded
 * multi-producer ring (full ⇒ dropped and counted) and pokes the worker's eventfd.
 *
 * Fork: the child handler marks the process forked (everything off), clears the recording
 * flag and forgets the worker and its sockets; nothing else runs in the child, at exit either.
 */
#include "cupti_int.h"
#include "kp_clock.h"
#include "kp_str.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

atomic_int kpi_recording_flag;
atomic_int kpi_forked_flag;
struct kpi_core kpi_core = {
    .rank = -1,
    .local_rank = -1,
    .world_size = -1,
    .current_step = -1,
    .device = -1,
    .wake_fd = -1,
};

static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static atomic_int g_initialized; /* 1 once InitializeInjection set everything up */
static atomic_int g_exiting;
static __thread uint64_t t_tid;

/* ---- time, thread ids ---- */

int64_t kpi_now_ns(void)
{
    return kp_real_ns();
}

uint64_t kpi_tid(void)
{
    if (t_tid == 0) {
        t_tid = (uint64_t) syscall(SYS_gettid);
    }
    return t_tid;
}

/* ---- logging ---- */

static atomic_int g_log_level = -1; /* enum kpi_log_level, -1 until KPROF_LOG is read */
static atomic_int_least64_t g_log_sec;
static atomic_uint g_log_lines;      /* lines written in g_log_sec */
static atomic_uint g_log_suppressed; /* lines dropped by the rate limit since the last line */

#define KPI_LOG_PER_SEC 10u

static int log_level(void)
{
    int lv = atomic_load_explicit(&g_log_level, memory_order_relaxed);
    const char *s;

    if (lv >= 0) {
        return lv;
    }
    s = getenv("KPROF_LOG");
    lv = KPI_LOG_WARN;
    if (s != NULL && *s != '\0') {
        if (strcasecmp(s, "debug") == 0 || strcmp(s, "1") == 0) {
            lv = KPI_LOG_DEBUG;
        }
        else if (strcasecmp(s, "info") == 0) {
            lv = KPI_LOG_INFO;
        }
        else if (strcasecmp(s, "error") == 0) {
            lv = KPI_LOG_ERROR;
        }
        else if (strcasecmp(s, "off") == 0 || strcmp(s, "0") == 0) {
            lv = KPI_LOG_OFF;
        }
    }
    atomic_store_explicit(&g_log_level, lv, memory_order_relaxed);
    return lv;
}

void kpi_logv(enum kpi_log_level level, const char *fmt, va_list ap)
{
    char line[768];
    int64_t sec;
    int64_t cur;
    unsigned supp;
    size_t n = 0;
    int w;

    if ((int) level < log_level() || level >= KPI_LOG_OFF) {
        return;
    }
    /* Rate limit over all call sites: KPI_LOG_PER_SEC lines per wall-clock second. */
    sec = kpi_now_ns() / 1000000000;
    cur = atomic_load_explicit(&g_log_sec, memory_order_relaxed);
    if (cur != sec && atomic_compare_exchange_strong_explicit(
                          &g_log_sec, &cur, sec, memory_order_relaxed, memory_order_relaxed)) {
        atomic_store_explicit(&g_log_lines, 0, memory_order_relaxed);
    }
    if (atomic_fetch_add_explicit(&g_log_lines, 1, memory_order_relaxed) >= KPI_LOG_PER_SEC) {
        atomic_fetch_add_explicit(&g_log_suppressed, 1, memory_order_relaxed);
        return;
    }
    supp = atomic_exchange_explicit(&g_log_suppressed, 0, memory_order_relaxed);
    w = snprintf(line, sizeof(line), "kprof[%u]: ", (unsigned) getpid());
    n = w > 0 ? (size_t) w : 0;
    if (supp > 0) {
        w = snprintf(line + n, sizeof(line) - n, "(%u lines suppressed) ", supp);
        n += w > 0 ? (size_t) w : 0;
    }
    w = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    n += w > 0 ? (size_t) w : 0;
    if (n > sizeof(line) - 2) {
        n = sizeof(line) - 2;
    }
    line[n++] = '\n';
    /* One write(2): no stdio lock, never interleaved with other lines. */
    if (write(STDERR_FILENO, line, n) < 0) {
        return;
    }
}

void kpi_logl(enum kpi_log_level level, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    kpi_logv(level, fmt, ap);
    va_end(ap);
}

void kpi_log(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    kpi_logv(KPI_LOG_WARN, fmt, ap);
    va_end(ap);
}

/* ---- environment ---- */

uint64_t kpi_env_size(const char *name, uint64_t def, uint64_t lo, uint64_t hi)
{
    const char *s = getenv(name);
    char *end = NULL;
    unsigned long long v;
    uint64_t mul = 1;

    if (s == NULL || *s == '\0') {
        return def;
    }
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s) {
        kpi_log("ignoring %s=%s: not a number (using %llu)", name, s, (unsigned long long) def);
        return def;
    }
    switch (toupper((unsigned char) *end)) {
    case 'K':
        mul = 1ull << 10;
        break;
    case 'M':
        mul = 1ull << 20;
        break;
    case 'G':
        mul = 1ull << 30;
        break;
    default:
        break;
    }
    if (v > hi / mul) {
        v = hi;
    }
    else {
        v *= mul;
    }
    if (v < lo) {
        v = lo;
    }
    if (v > hi) {
        v = hi;
    }
    return v;
}

static void env_copy(char *dst, size_t cap, const char *name)
{
    const char *s = getenv(name);

    kp_strlcpy(dst, cap, s != NULL ? s : "");
}

static int32_t env_int(const char *name)
{
    const char *s = getenv(name);
    char *end = NULL;
    long v;

    if (s == NULL || *s == '\0') {
        return -1;
    }
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0 || v > INT32_MAX) {
        return -1;
    }
    return (int32_t) v;
}

static void read_identity(void)
{
    const char *te = getenv("TORCHELASTIC_RUN_ID");

    env_copy(kpi_core.job, sizeof(kpi_core.job), "KPROF_JOB");
    if (kpi_core.job[0] == '\0' && te != NULL && *te != '\0' && strcmp(te, "none") != 0) {
        kp_strlcpy(kpi_core.job, sizeof(kpi_core.job), te);
    }
    if (kpi_core.job[0] == '\0') {
        env_copy(kpi_core.job, sizeof(kpi_core.job), "SLURM_JOB_ID");
    }
    kpi_core.rank = env_int("RANK");
    kpi_core.local_rank = env_int("LOCAL_RANK");
    kpi_core.world_size = env_int("WORLD_SIZE");
    if (gethostname(kpi_core.host, sizeof(kpi_core.host) - 1) != 0) {
        kp_strlcpy(kpi_core.host, sizeof(kpi_core.host), "?");
    }
    kpi_core.host[sizeof(kpi_core.host) - 1] = '\0';
    kpi_core.pid = (uint32_t) getpid();
    kpi_core.start_ns = kpi_now_ns();
}

/* ---- step events ---- */

void kpi_wake(void)
{
    int fd = atomic_load_explicit(&kpi_core.wake_fd, memory_order_acquire);
    uint64_t one = 1;

    if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
        return; /* EAGAIN: the counter is saturated, the worker wakes anyway */
    }
}

static void steps_init(void)
{
    for (uint64_t i = 0; i < KPI_STEP_RING; i++) {
        atomic_store_explicit(&kpi_core.steps[i].seq, i, memory_order_relaxed);
    }
    atomic_store_explicit(&kpi_core.step_head, 0, memory_order_relaxed);
    kpi_core.step_tail = 0;
}

static void steps_push(int64_t step, int64_t ts_ns, uint32_t source)
{
    uint64_t pos = atomic_load_explicit(&kpi_core.step_head, memory_order_relaxed);
    struct kpi_step_cell *cell;

    for (;;) {
        cell = &kpi_core.steps[pos & (KPI_STEP_RING - 1)];
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        int64_t diff = (int64_t) (seq - pos);
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&kpi_core.step_head, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                break;
            }
        }
        else if (diff < 0) {
            atomic_fetch_add_explicit(&kpi_core.steps_dropped, 1, memory_order_relaxed);
            return; /* full: the worker is far behind; drop and count */
        }
        else {
            pos = atomic_load_explicit(&kpi_core.step_head, memory_order_relaxed);
        }
    }
    cell->ev.step = step;
    cell->ev.start_ns = ts_ns;
    cell->ev.source = source;
    cell->ev.pad = 0;
    atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
    kpi_wake();
}

int kpi_steps_pop(struct kp_wire_step *ev)
{
    struct kpi_step_cell *cell = &kpi_core.steps[kpi_core.step_tail & (KPI_STEP_RING - 1)];
    uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);

    if (seq != kpi_core.step_tail + 1) {
        return 0;
    }
    *ev = cell->ev;
    atomic_store_explicit(&cell->seq, kpi_core.step_tail + KPI_STEP_RING, memory_order_release);
    kpi_core.step_tail++;
    return 1;
}

void kpi_step_event(int64_t step, int64_t ts_ns, uint32_t source)
{
    if (atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed)) {
        return;
    }
    /* The Python hook wins over NVTX step ranges once it has been seen. */
    if (source != KP_STEP_HOOK &&
        atomic_load_explicit(&kpi_core.hook_present, memory_order_relaxed)) {
        return;
    }
    atomic_store_explicit(&kpi_core.current_step, step, memory_order_relaxed);
    if (!atomic_load_explicit(&kpi_core.capture_live, memory_order_acquire) ||
        !atomic_load_explicit(&g_initialized, memory_order_acquire)) {
        return;
    }
    steps_push(step, ts_ns, source);
}

KPI_EXPORT int kprof_step(int64_t step)
{
    if (atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed)) {
        return 0;
    }
    if (!atomic_load_explicit(&kpi_core.hook_present, memory_order_relaxed)) {
        atomic_store_explicit(&kpi_core.hook_present, 1, memory_order_relaxed);
    }
    if (atomic_load_explicit(&kpi_core.capture_live, memory_order_acquire)) {
        kpi_step_event(step, kpi_now_ns(), KP_STEP_HOOK);
    }
    else {
        atomic_store_explicit(&kpi_core.current_step, step, memory_order_relaxed);
    }
    return kpi_recording();
}

/* ---- stats ---- */

#define LD(x) atomic_load_explicit(&(x), memory_order_relaxed)

KPI_EXPORT int kprof_get_stats(struct kprof_stats *out)
{
    struct kprof_stats s;

    if (out == NULL || out->size != sizeof(struct kprof_stats)) {
        return -1;
    }
    memset(&s, 0, sizeof(s));
    s.size = sizeof(s);
    s.state = LD(kpi_core.state);
    s.current_step = LD(kpi_core.current_step);
    s.buffers_requested = LD(kpi_core.c.buffers_requested);
    s.buffers_declined = LD(kpi_core.c.buffers_declined);
    s.buffers_completed = LD(kpi_core.c.buffers_completed);
    s.records_decoded = LD(kpi_core.c.records_decoded);
    s.records_sent = LD(kpi_core.c.records_sent);
    s.records_dropped = LD(kpi_core.c.records_dropped);
    s.cupti_dropped = LD(kpi_core.c.cupti_dropped);
    s.ranges = LD(kpi_nvtx_counters.ranges);
    s.ranges_dropped = LD(kpi_nvtx_counters.ranges_dropped);
    s.names = LD(kpi_nvtx_counters.names);
    s.names_overflow = LD(kpi_nvtx_counters.names_overflow);
    s.agent_connects = LD(kpi_core.c.agent_connects);
    s.captures = LD(kpi_core.c.captures);
    s.connected = LD(kpi_core.c.connected);
    s.enabled_kinds = LD(kpi_core.c.enabled_kinds);
    if (LD(kpi_forked_flag)) {
        s.connected = 0;
        s.enabled_kinds = 0;
    }
    memcpy(out, &s, sizeof(s));
    return 0;
}

/* ---- fork and exit ---- */

static void atfork_child(void)
{
    /* Async-signal-safe work only: the child inherits a copy of every lock. */
    atomic_store_explicit(&kpi_forked_flag, 1, memory_order_relaxed);
    atomic_store_explicit(&kpi_recording_flag, 0, memory_order_relaxed);
    atomic_store_explicit(&kpi_core.capture_live, 0, memory_order_relaxed);
    t_tid = 0;
    kpi_worker_forget();
}

static void exit_handler(void)
{
    int expected = 0;

    if (atomic_load(&kpi_forked_flag) ||
        !atomic_compare_exchange_strong(&g_exiting, &expected, 1)) {
        return;
    }
    kpi_worker_stop((uint32_t) kpi_env_size("KPROF_EXIT_FLUSH_MS", KPI_DEF_EXIT_MS, 0, 60000));
}

static void core_init(void)
{
    const char *dis = getenv("KPROF_DISABLE");
    int rc;

    if (dis != NULL && strcmp(dis, "1") == 0) {
        kpi_logl(KPI_LOG_INFO, "KPROF_DISABLE=1: the library stays off in this process");
        return;
    }
    read_identity();
    steps_init();
    kpi_intern_init();
    kpi_ranges_init();
    if (kpi_cupti_init() != 0) {
        kpi_logl(KPI_LOG_INFO, "dormant: %s", kpi_core.cupti_error);
    }
    rc = pthread_atfork(NULL, NULL, atfork_child);
    if (rc != 0) {
        kpi_log("pthread_atfork failed (%s): the library stays off", strerror(rc));
        return;
    }
    atomic_store_explicit(&g_initialized, 1, memory_order_release);
    if (atexit(exit_handler) != 0) {
        kpi_log("atexit failed: an active capture will not be flushed at exit");
    }
    rc = kpi_worker_start();
    if (rc != 0) {
        atomic_store_explicit(&g_initialized, 0, memory_order_release);
        kpi_log("cannot start the worker thread (%s): the library stays off", strerror(-rc));
        return;
    }
    kpi_logl(KPI_LOG_INFO, "loaded: job=%s rank=%d local_rank=%d world_size=%d cupti=%u",
             kpi_core.job, kpi_core.rank, kpi_core.local_rank, kpi_core.world_size,
             kpi_core.cupti_version);
}

KPI_EXPORT int InitializeInjection(void)
{
    if (atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed)) {
        return 1;
    }
    pthread_once(&g_init_once, core_init);
    return 1;
}
