/*
 * kprof-test-worker: a stand-in for one DDP rank of a PyTorch job, for tests without a GPU.
 *
 * It loads libkprof_inject.so the way the CUDA driver does (dlopen of CUDA_INJECTION64_PATH,
 * then InitializeInjection()), emits NVTX through the real NVTX3 API (NVTX_INJECTION64_PATH
 * makes the NVTX loader call the library's InitializeInjectionNvtx2) and plays the GPU with
 * the fake libcupti it is linked with (KPROF_CUPTI_PATH is set to that fake unless already
 * set, and must then name the same file). Without CUDA_INJECTION64_PATH it runs the same
 * steps with no library.
 *
 * Each step (rank from RANK): kprof_step(step) (or, with --no-hook, an NVTX range
 * "ProfilerStep#<step>" around the step); an H2D copy under "aten::to" / "aten::copy_";
 * per layer "aten::linear, seq = S, op_id = O, sizes = [...]" / "aten::addmm" with a GEMM
 * kernel, then "aten::gelu" with its kernel; "aten::zero_" with a memset; the backward pass on
 * a second (autograd) thread: "AddmmBackward0, seq = S" / "aten::mm" with two GEMM kernels
 * per layer; "nccl:all_reduce" with an NCCL kernel on another stream; a cudaStreamSynchronize;
 * the optimizer's "aten::_foreach_add_" kernel; then it sleeps --step-ms. --fork (or
 * --fork-step N, for a step only known at run time) forks a DataLoader-like child at step 2
 * (or N) that must exit 0.
 *
 * --expect FILE writes one JSON object per line for each GPU-side record and each NVTX range
 * emitted: {"type":"gpu"|"range", "step", "kind", "name", "correlation", "recorded" (the fake
 * wrote it into a CUPTI buffer), "launch_ns" and "dur_ns" (when it was issued and the duration
 * the fake gives it), "op" (innermost op name), "stack" (op names, outermost
 * first), "tid", ...}, so an integration test can compare the database with what was emitted
 * during the captured steps.
 *
 * Exit status: 0 done; 1 a step failed (backward thread stuck, fork child failed); 2 usage or
 * setup error; 3 --until-captures gave up at --max-steps; 4 the --timeout-s watchdog fired.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nvtx3/nvToolsExt.h>

#include "fakecupti.h"
#include "kp_json.h"
#include "kprof.h"

#define WK_MAX_DEPTH   32
#define WK_WAIT_MS     10000 /* longest wait for the autograd thread or the fork child */
#define WK_BATCH       32
#define WK_HIDDEN      1024
#define WK_STREAM_MAIN 7
#define WK_STREAM_NCCL 13
#define WK_CONTEXT     1

static const char *const wk_gelu_kernel =
    "void at::native::vectorized_elementwise_kernel<4, "
    "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}"
    "::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, "
    "at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() "
    "const::{lambda(float)#1}, at::detail::Array<char*, 2>)";
static const char *const wk_foreach_kernel =
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor"
    "<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous "
    "namespace)::TensorListMetadata<2>, at::native::(anonymous "
    "namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)";

struct wk_opts {
    int steps, layers, step_ms, max_steps, timeout_s;
    int no_hook, fork_child, fork_step, stats;
    int until_captures; /* -1: off */
    unsigned seed;
    const char *expect;
};

struct wk_frame {
    char msg[256];
    char name[96];
    int64_t start_ns;
};

static struct wk_opts g_o = {
    .steps = 20,
    .layers = 4,
    .step_ms = 20,
    .max_steps = 10000,
    .timeout_s = 300,
    .until_captures = -1,
    .seed = 1,
    .fork_step = 2,
};
static int g_rank = -1;
static uint32_t g_device;
static _Atomic int64_t g_step = -1;
static int (*g_kprof_step)(int64_t);
static int (*g_kprof_get_stats)(struct kprof_stats *);
static FILE *g_expect;
static pthread_mutex_t g_expect_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread struct wk_frame tl_stack[WK_MAX_DEPTH];
static __thread int tl_depth;
static __thread unsigned tl_seed;
static _Atomic int64_t g_seq, g_op_id;

/* The autograd thread's hand-off. */
static pthread_mutex_t g_bw_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_bw_cv = PTHREAD_COND_INITIALIZER;
static int g_bw_go, g_bw_done, g_bw_quit;
static int g_bw_stuck; /* it missed a deadline: not joined at exit */
static int64_t g_bw_seq_base;

static int64_t wk_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t wk_tid(void)
{
    return (uint64_t) syscall(SYS_gettid);
}

static void wk_sleep_ms(int ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000 };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static void wk_deadline(struct timespec *dl, int ms)
{
    clock_gettime(CLOCK_REALTIME, dl);
    dl->tv_sec += ms / 1000;
    dl->tv_nsec += (long) (ms % 1000) * 1000000;
    if (dl->tv_nsec >= 1000000000) {
        dl->tv_sec++;
        dl->tv_nsec -= 1000000000;
    }
}

static void wk_on_alarm(int sig)
{
    static const char msg[] = "kprof-test-worker: --timeout-s passed, giving up (exit 4)\n";

    (void) sig;
    (void) !write(2, msg, sizeof(msg) - 1);
    _exit(4);
}

/* ---- --expect output ---- */

/* Writes "stack":[...] of the calling thread's first n frames. Caller holds g_expect_mu. */
static void wk_json_stack(FILE *f, int n)
{
    fputs("\"stack\":[", f);
    for (int i = 0; i < n; i++) {
        if (i) {
            fputc(',', f);
        }
        kp_json_fputs(f, tl_stack[i].name);
    }
    fputc(']', f);
}

static void wk_expect_gpu(const char *kind, const char *name, uint32_t corr, uint32_t stream,
                          int64_t launch_ns, int64_t dur_ns)
{
    uint32_t w = fakecupti_last_written();

    if (!g_expect) {
        return;
    }
    pthread_mutex_lock(&g_expect_mu);
    fprintf(g_expect, "{\"type\":\"gpu\",\"rank\":%d,\"step\":%" PRId64 ",\"kind\":", g_rank,
            (int64_t) g_step);
    kp_json_fputs(g_expect, kind);
    fputs(",\"name\":", g_expect);
    kp_json_fputs(g_expect, name);
    fprintf(g_expect,
            ",\"correlation\":%" PRIu32 ",\"recorded\":%s,\"api_recorded\":%s,\"device\":%" PRIu32
            ",\"stream\":%" PRIu32 ",\"tid\":%" PRIu64 ",\"launch_ns\":%" PRId64
            ",\"dur_ns\":%" PRId64 ",\"op\":",
            corr, (w & FAKECUPTI_W_GPU) ? "true" : "false",
            (w & FAKECUPTI_W_API) ? "true" : "false", g_device, stream, wk_tid(), launch_ns,
            dur_ns);
    kp_json_fputs(g_expect, tl_depth ? tl_stack[tl_depth - 1].name : "");
    fputc(',', g_expect);
    wk_json_stack(g_expect, tl_depth);
    fputs("}\n", g_expect);
    pthread_mutex_unlock(&g_expect_mu);
}

/* ---- NVTX ops ---- */

/* Pushes an NVTX range with the formatted message; the op name is the text before ", ". */
static void __attribute__((format(printf, 1, 2))) wk_push(const char *fmt, ...)
{
    struct wk_frame *f;
    va_list ap;
    size_t n;

    if (tl_depth == WK_MAX_DEPTH) {
        fprintf(stderr, "kprof-test-worker: op stack deeper than %d\n", WK_MAX_DEPTH);
        abort(); /* a bug in this program, not in what it tests */
    }
    f = &tl_stack[tl_depth];
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
    va_end(ap);
    n = strcspn(f->msg, ",");
    if (n >= sizeof(f->name)) {
        n = sizeof(f->name) - 1;
    }
    memcpy(f->name, f->msg, n);
    f->name[n] = '\0';
    f->start_ns = wk_now_ns();
    tl_depth++;
    nvtxRangePushA(f->msg);
}

static void wk_pop(void)
{
    struct wk_frame *f;
    int64_t end;

    nvtxRangePop();
    end = wk_now_ns();
    f = &tl_stack[--tl_depth];
    if (!g_expect) {
        return;
    }
    pthread_mutex_lock(&g_expect_mu);
    fprintf(g_expect, "{\"type\":\"range\",\"rank\":%d,\"step\":%" PRId64 ",\"name\":", g_rank,
            (int64_t) g_step);
    kp_json_fputs(g_expect, f->name);
    fputs(",\"message\":", g_expect);
    kp_json_fputs(g_expect, f->msg);
    fprintf(g_expect,
            ",\"tid\":%" PRIu64 ",\"depth\":%d,\"start_ns\":%" PRId64 ",\"end_ns\":%" PRId64 ",",
            wk_tid(), tl_depth, f->start_ns, end);
    wk_json_stack(g_expect, tl_depth); /* the enclosing ranges */
    fputs("}\n", g_expect);
    pthread_mutex_unlock(&g_expect_mu);
}

/* ---- GPU work through the fake ---- */

static int64_t wk_jitter(int64_t base)
{
    return base + (int64_t) (rand_r(&tl_seed) % (unsigned) (base / 2 + 1));
}

static void wk_kernel(const char *name, uint32_t stream, int grid, int block, uint16_t regs,
                      int64_t dur_ns)
{
    struct fakecupti_kernel k;
    uint32_t corr;
    int64_t t0;

    memset(&k, 0, sizeof(k));
    k.name = name;
    k.device = g_device;
    k.context = WK_CONTEXT;
    k.stream = stream;
    k.grid_x = grid;
    k.grid_y = k.grid_z = 1;
    k.block_x = block;
    k.block_y = k.block_z = 1;
    k.registers = regs;
    k.static_smem = 16384;
    k.t.duration_ns = wk_jitter(dur_ns);
    t0 = wk_now_ns();
    corr = fakecupti_launch_kernel(&k);
    wk_expect_gpu("kernel", name, corr, stream, t0, (int64_t) k.t.duration_ns);
}

static void wk_memcpy_h2d(uint64_t bytes)
{
    struct fakecupti_memcpy m;
    uint32_t corr;
    int64_t t0;

    memset(&m, 0, sizeof(m));
    m.copy_kind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    m.src_kind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
    m.dst_kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
    m.bytes = bytes;
    m.device = g_device;
    m.context = WK_CONTEXT;
    m.stream = WK_STREAM_MAIN;
    m.t.duration_ns = wk_jitter(20000);
    t0 = wk_now_ns();
    corr = fakecupti_memcpy(&m);
    wk_expect_gpu("memcpy", "", corr, WK_STREAM_MAIN, t0, (int64_t) m.t.duration_ns);
}

static void wk_memset(uint64_t bytes)
{
    struct fakecupti_memset m;
    uint32_t corr;
    int64_t t0;

    memset(&m, 0, sizeof(m));
    m.bytes = bytes;
    m.mem_kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
    m.device = g_device;
    m.context = WK_CONTEXT;
    m.stream = WK_STREAM_MAIN;
    m.t.duration_ns = wk_jitter(2000);
    t0 = wk_now_ns();
    corr = fakecupti_memset(&m);
    wk_expect_gpu("memset", "", corr, WK_STREAM_MAIN, t0, (int64_t) m.t.duration_ns);
}

static void wk_stream_sync(uint32_t stream)
{
    struct fakecupti_sync s;
    uint32_t corr;
    int64_t t0;

    memset(&s, 0, sizeof(s));
    s.context = WK_CONTEXT;
    s.stream = stream;
    s.t.duration_ns = wk_jitter(30000);
    t0 = wk_now_ns();
    corr = fakecupti_sync(&s);
    wk_expect_gpu("sync", "", corr, stream, t0, (int64_t) s.t.duration_ns);
}

/* ---- the step ---- */

static void wk_backward(int64_t seq_base)
{
    for (int l = g_o.layers - 1; l >= 0; l--) {
        wk_push("AddmmBackward0, seq = %" PRId64, seq_base + l);
        for (int i = 0; i < 2; i++) {
            wk_push("aten::mm, seq = %" PRId64 ", op_id = %" PRId64, seq_base + l,
                    (int64_t) ++g_op_id);
            wk_kernel("ampere_sgemm_64x64_nn", WK_STREAM_MAIN, 256, 128, 122, 40000);
            wk_pop();
        }
        wk_pop();
    }
}

static void *wk_autograd_main(void *arg)
{
    (void) arg;
    tl_seed = g_o.seed * 7919u + 1;
    nvtxNameOsThreadA((uint32_t) wk_tid(), "pt_autograd_0");
    pthread_mutex_lock(&g_bw_mu);
    for (;;) {
        int64_t base;

        while (!g_bw_go && !g_bw_quit) {
            pthread_cond_wait(&g_bw_cv, &g_bw_mu);
        }
        if (g_bw_quit) {
            break;
        }
        g_bw_go = 0;
        base = g_bw_seq_base;
        pthread_mutex_unlock(&g_bw_mu);
        wk_backward(base);
        pthread_mutex_lock(&g_bw_mu);
        g_bw_done = 1;
        pthread_cond_broadcast(&g_bw_cv);
    }
    pthread_mutex_unlock(&g_bw_mu);
    return NULL;
}

/* Runs the backward pass on the autograd thread and waits for it (bounded). */
static int wk_run_backward(int64_t seq_base)
{
    struct timespec dl;
    int rc = 0;

    wk_deadline(&dl, WK_WAIT_MS);
    pthread_mutex_lock(&g_bw_mu);
    g_bw_seq_base = seq_base;
    g_bw_done = 0;
    g_bw_go = 1;
    pthread_cond_broadcast(&g_bw_cv);
    while (!g_bw_done && rc == 0) {
        rc = pthread_cond_timedwait(&g_bw_cv, &g_bw_mu, &dl);
    }
    pthread_mutex_unlock(&g_bw_mu);
    if (rc) {
        fprintf(stderr, "kprof-test-worker: the autograd thread did not finish in %d ms\n",
                WK_WAIT_MS);
        g_bw_stuck = 1;
        return -1;
    }
    return 0;
}

/* A DataLoader-like child: NVTX and kprof_step calls, then exit(0) (atexit handlers run). */
static int wk_fork_child(int64_t step)
{
    int status = 0;
    pid_t pid;

    fflush(NULL); /* or the child's exit() writes the parent's buffered output again */
    pid = fork();
    if (pid < 0) {
        perror("kprof-test-worker: fork");
        return -1;
    }
    if (pid == 0) {
        for (int i = 0; i < 3; i++) {
            nvtxRangePushA("DataLoader.__next__");
            nvtxMarkA("batch");
            if (g_kprof_step) {
                g_kprof_step(step + i);
            }
            nvtxRangePop();
        }
        exit(0);
    }
    for (int waited = 0;; waited += 5) {
        pid_t r = waitpid(pid, &status, WNOHANG);

        if (r == pid) {
            break;
        }
        if (r < 0 || waited >= WK_WAIT_MS) {
            fprintf(stderr, "kprof-test-worker: fork child %d did not exit in %d ms\n", (int) pid,
                    WK_WAIT_MS);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        wk_sleep_ms(5);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "kprof-test-worker: fork child failed (status 0x%x)\n", status);
        return -1;
    }
    return 0;
}

static int wk_step(int64_t step)
{
    int64_t seq_base;
    int rc = 0;

    g_step = step;
    if (g_o.no_hook) {
        wk_push("ProfilerStep#%" PRId64, step);
    }
    else if (g_kprof_step) {
        g_kprof_step(step);
    }
    if (g_o.fork_child && step == g_o.fork_step && wk_fork_child(step) < 0) {
        rc = -1;
    }

    wk_push("aten::to, seq = %" PRId64 ", op_id = %" PRId64, (int64_t) g_seq, (int64_t) ++g_op_id);
    wk_push("aten::copy_, seq = %" PRId64 ", op_id = %" PRId64, (int64_t) g_seq,
            (int64_t) ++g_op_id);
    wk_memcpy_h2d((uint64_t) WK_BATCH * WK_HIDDEN * 4);
    wk_pop();
    wk_pop();

    seq_base = g_seq;
    for (int l = 0; l < g_o.layers; l++) {
        int64_t seq = g_seq++;

        wk_push("aten::linear, seq = %" PRId64 ", op_id = %" PRId64
                ", sizes = [[%d, %d], [%d, %d], [%d]]",
                seq, (int64_t) ++g_op_id, WK_BATCH, WK_HIDDEN, WK_HIDDEN, WK_HIDDEN, WK_HIDDEN);
        wk_push("aten::addmm, seq = %" PRId64 ", op_id = %" PRId64
                ", sizes = [[%d], [%d, %d], [%d, %d]]",
                seq, (int64_t) ++g_op_id, WK_HIDDEN, WK_BATCH, WK_HIDDEN, WK_HIDDEN, WK_HIDDEN);
        wk_kernel("ampere_sgemm_128x64_tn", WK_STREAM_MAIN, 128, 256, 126, 50000);
        wk_pop();
        wk_pop();
        wk_push("aten::gelu, seq = %" PRId64 ", op_id = %" PRId64, g_seq++, (int64_t) ++g_op_id);
        wk_kernel(wk_gelu_kernel, WK_STREAM_MAIN, 64, 128, 32, 8000);
        wk_pop();
    }

    wk_push("aten::zero_, op_id = %" PRId64, (int64_t) ++g_op_id);
    wk_memset((uint64_t) WK_HIDDEN * WK_HIDDEN * 4);
    wk_pop();

    if (wk_run_backward(seq_base) < 0) {
        rc = -1;
    }

    wk_push("nccl:all_reduce");
    wk_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", WK_STREAM_NCCL, 32, 640, 96, 120000);
    wk_pop();
    wk_stream_sync(WK_STREAM_NCCL);

    wk_push("Optimizer.step#SGD.step");
    wk_push("aten::_foreach_add_, op_id = %" PRId64, (int64_t) ++g_op_id);
    wk_kernel(wk_foreach_kernel, WK_STREAM_MAIN, 320, 512, 40, 15000);
    wk_pop();
    wk_pop();

    if (g_o.step_ms > 0) {
        wk_sleep_ms(g_o.step_ms);
    }
    if (g_o.no_hook) {
        wk_pop();
    }
    return rc;
}

/* ---- setup and report ---- */

/* Makes KPROF_CUPTI_PATH name the fake this program is linked with, so the library's
 * dlopen returns this very copy (same file ⇒ same handle). */
static int wk_setup_cupti_path(void)
{
    const char *cur = getenv("KPROF_CUPTI_PATH");
    Dl_info di;
    void *h;
    int same;

    if (!dladdr((void *) fakecupti_stats, &di) || !di.dli_fname) {
        fprintf(stderr, "kprof-test-worker: cannot find the path of the linked fake libcupti\n");
        return -1;
    }
    if (!cur || !*cur) {
        return setenv("KPROF_CUPTI_PATH", di.dli_fname, 1);
    }
    h = dlopen(cur, RTLD_NOW | RTLD_NOLOAD);
    same = h && dlsym(h, "fakecupti_stats") == (void *) fakecupti_stats;
    if (h) {
        dlclose(h);
    }
    if (!same) {
        fprintf(stderr,
                "kprof-test-worker: KPROF_CUPTI_PATH=%s is not the fake libcupti this worker is "
                "linked with (%s); unset it or point it there\n",
                cur, di.dli_fname);
        return -1;
    }
    return 0;
}

/* Loads the injection library like the driver does. 0: none configured; 1: loaded; -1. */
static int wk_load_library(void)
{
    const char *path = getenv("CUDA_INJECTION64_PATH");
    int (*init)(void);
    void *h;

    if (!path || !*path) {
        return 0;
    }
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "kprof-test-worker: dlopen(CUDA_INJECTION64_PATH=%s): %s\n", path,
                dlerror());
        return -1;
    }
    *(void **) &init = dlsym(h, "InitializeInjection");
    *(void **) &g_kprof_step = dlsym(h, "kprof_step");
    *(void **) &g_kprof_get_stats = dlsym(h, "kprof_get_stats");
    if (!init || !g_kprof_step || !g_kprof_get_stats) {
        fprintf(stderr,
                "kprof-test-worker: %s lacks InitializeInjection, kprof_step or "
                "kprof_get_stats (exported with default visibility?)\n",
                path);
        return -1;
    }
    init();
    return 1;
}

static int wk_get_stats(struct kprof_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->size = sizeof(*st);
    return g_kprof_get_stats ? g_kprof_get_stats(st) : -1;
}

static void wk_print_stats(int64_t steps)
{
    struct fakecupti_stats fs;
    struct kprof_stats st;
    int have = wk_get_stats(&st) == 0;

    fakecupti_stats(&fs);
    printf("{\"steps\":%" PRId64 ",\"rank\":%d,\"library\":%s", steps, g_rank,
           have ? "true" : "false");
    if (have) {
        printf(",\"state\":%" PRIu32 ",\"current_step\":%" PRId64 ",\"buffers_requested\":%" PRIu64
               ",\"buffers_declined\":%" PRIu64 ",\"buffers_completed\":%" PRIu64
               ",\"records_decoded\":%" PRIu64 ",\"records_sent\":%" PRIu64
               ",\"records_dropped\":%" PRIu64 ",\"cupti_dropped\":%" PRIu64 ",\"ranges\":%" PRIu64
               ",\"ranges_dropped\":%" PRIu64 ",\"names\":%" PRIu64 ",\"names_overflow\":%" PRIu64
               ",\"agent_connects\":%" PRIu64 ",\"captures\":%" PRIu64 ",\"connected\":%" PRIu32
               ",\"enabled_kinds\":%" PRIu32,
               st.state, st.current_step, st.buffers_requested, st.buffers_declined,
               st.buffers_completed, st.records_decoded, st.records_sent, st.records_dropped,
               st.cupti_dropped, st.ranges, st.ranges_dropped, st.names, st.names_overflow,
               st.agent_connects, st.captures, st.connected, st.enabled_kinds);
    }
    printf(",\"fake\":{\"enable_calls\":%" PRIu64 ",\"enabled_kinds\":%" PRIu32
           ",\"enabled_mask\":%" PRIu64 ",\"records_total\":%" PRIu64 ",\"kernels\":%" PRIu64
           ",\"api\":%" PRIu64 ",\"ext_corr\":%" PRIu64 ",\"dropped\":%" PRIu64
           ",\"buffers_requested\":%" PRIu64 ",\"buffers_declined\":%" PRIu64
           ",\"buffers_completed\":%" PRIu64 ",\"flush_calls\":%" PRIu64 ",\"registered\":%" PRIu32
           ",\"thread_id_type\":%" PRIu32 "}}\n",
           fs.enable_calls, fs.enabled_kinds, fakecupti_enabled_kinds(), fs.records_total,
           fs.records[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] +
               fs.records[CUPTI_ACTIVITY_KIND_KERNEL],
           fs.records[CUPTI_ACTIVITY_KIND_RUNTIME],
           fs.records[CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION], fs.dropped, fs.buffers_requested,
           fs.buffers_declined, fs.buffers_completed, fs.flush_calls, fs.registered,
           fs.thread_id_type);
    fflush(stdout);
}

static void wk_usage(FILE *f)
{
    fputs("usage: kprof-test-worker [--steps N] [--layers L] [--step-ms M] [--no-hook] [--fork]\n"
          "         [--fork-step N]\n"
          "         [--until-captures K] [--max-steps N] [--expect FILE] [--stats] [--seed S]\n"
          "         [--timeout-s S]\n"
          "Plays one DDP rank: loads $CUDA_INJECTION64_PATH like the CUDA driver, emits NVTX\n"
          "and fake CUPTI records. See the top of tests/fakecupti/worker.c.\n",
          f);
}

static int wk_int_arg(const char *name, const char *s, int min, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > 100000000) {
        fprintf(stderr, "kprof-test-worker: --%s wants an integer >= %d, got '%s'\n", name, min, s);
        return -1;
    }
    *out = (int) v;
    return 0;
}

static int wk_parse(int argc, char **argv)
{
    static const struct option opts[] = {
        { "steps", required_argument, NULL, 's' },
        { "layers", required_argument, NULL, 'l' },
        { "step-ms", required_argument, NULL, 'm' },
        { "no-hook", no_argument, NULL, 'n' },
        { "fork", no_argument, NULL, 'f' },
        { "fork-step", required_argument, NULL, 'F' },
        { "until-captures", required_argument, NULL, 'u' },
        { "max-steps", required_argument, NULL, 'x' },
        { "expect", required_argument, NULL, 'e' },
        { "stats", no_argument, NULL, 'S' },
        { "seed", required_argument, NULL, 'r' },
        { "timeout-s", required_argument, NULL, 't' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, v = 0;

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            if (wk_int_arg("steps", optarg, 0, &g_o.steps) < 0) {
                return -1;
            }
            break;
        case 'l':
            if (wk_int_arg("layers", optarg, 1, &g_o.layers) < 0) {
                return -1;
            }
            break;
        case 'm':
            if (wk_int_arg("step-ms", optarg, 0, &g_o.step_ms) < 0) {
                return -1;
            }
            break;
        case 'n':
            g_o.no_hook = 1;
            break;
        case 'f':
            g_o.fork_child = 1;
            break;
        case 'F':
            if (wk_int_arg("fork-step", optarg, 0, &g_o.fork_step) < 0) {
                return -1;
            }
            g_o.fork_child = 1;
            break;
        case 'u':
            if (wk_int_arg("until-captures", optarg, 1, &g_o.until_captures) < 0) {
                return -1;
            }
            break;
        case 'x':
            if (wk_int_arg("max-steps", optarg, 1, &g_o.max_steps) < 0) {
                return -1;
            }
            break;
        case 'e':
            g_o.expect = optarg;
            break;
        case 'S':
            g_o.stats = 1;
            break;
        case 'r':
            if (wk_int_arg("seed", optarg, 0, &v) < 0) {
                return -1;
            }
            g_o.seed = (unsigned) v;
            break;
        case 't':
            if (wk_int_arg("timeout-s", optarg, 1, &g_o.timeout_s) < 0) {
                return -1;
            }
            break;
        case 'h':
            wk_usage(stdout);
            exit(0);
        default:
            wk_usage(stderr);
            return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "kprof-test-worker: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *rank = getenv("RANK"), *local = getenv("LOCAL_RANK");
    struct kprof_stats st;
    pthread_t bw;
    int64_t step = 0;
    int rc = 0, have_bw = 0;

    if (wk_parse(argc, argv) < 0) {
        return 2;
    }
    signal(SIGALRM, wk_on_alarm);
    alarm((unsigned) g_o.timeout_s);
    g_rank = rank ? atoi(rank) : 0;
    g_device = local ? (uint32_t) atoi(local) : 0;
    tl_seed = g_o.seed;
    if (g_o.until_captures > 0 && !getenv("CUDA_INJECTION64_PATH")) {
        fprintf(stderr, "kprof-test-worker: --until-captures needs CUDA_INJECTION64_PATH\n");
        return 2;
    }
    if (wk_setup_cupti_path() < 0 || wk_load_library() < 0) {
        return 2;
    }
    if (g_o.expect && !(g_expect = fopen(g_o.expect, "w"))) {
        fprintf(stderr, "kprof-test-worker: cannot write --expect %s: %s\n", g_o.expect,
                strerror(errno));
        return 2;
    }
    nvtxNameOsThreadA((uint32_t) wk_tid(), "MainThread");
    if (pthread_create(&bw, NULL, wk_autograd_main, NULL) != 0) {
        fprintf(stderr, "kprof-test-worker: cannot start the autograd thread\n");
        rc = 2;
        goto out;
    }
    have_bw = 1;

    for (step = 0;; step++) {
        if (g_o.until_captures > 0) {
            if (wk_get_stats(&st) == 0 && st.captures >= (uint64_t) g_o.until_captures) {
                break;
            }
            if (step >= g_o.max_steps) {
                fprintf(stderr,
                        "kprof-test-worker: gave up after %" PRId64 " steps: captures=%" PRIu64
                        " < %d\n",
                        step, st.captures, g_o.until_captures);
                rc = 3;
                break;
            }
        }
        else if (step >= g_o.steps) {
            break;
        }
        if (wk_step(step) < 0) {
            rc = 1;
            step++;
            break;
        }
    }

out:
    if (have_bw) {
        pthread_mutex_lock(&g_bw_mu);
        g_bw_quit = 1;
        pthread_cond_broadcast(&g_bw_cv);
        pthread_mutex_unlock(&g_bw_mu);
        if (g_bw_stuck) {
            pthread_detach(bw);
        }
        else {
            pthread_join(bw, NULL);
        }
    }
    if (g_expect) {
        fclose(g_expect);
        g_expect = NULL;
    }
    if (g_o.stats) {
        wk_print_stats(step);
    }
    return rc;
}
