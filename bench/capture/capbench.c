/*
 * kprof-bench-capture: cost per CUPTI record of libkprof_inject.so's decode and hand-off,
 * measured with the fake libcupti (no GPU).
 *
 * lib mode: a minimal agent peer runs in-process (a thread with a SOCK_SEQPACKET listener at a
 * temp path: HELLO is answered with WELCOME accepted=1 and an ARM for a time window starting
 * now, everything else is read and counted). The library is loaded like the driver does and,
 * once it is capturing, M kernel launches are emitted through the fake (each: external
 * correlation + API + kernel record, 3 CUPTI records), then cuptiActivityFlushAll hands every
 * buffer to the library; the time from the flush until kprof_get_stats().records_decoded
 * covers them, divided by the records decoded in that time, is the library's ns/record
 * (decode into compact records, name interning, buffer recycling, queueing to the agent).
 * Large CUPTI buffers (KPROF_BUFFER_BYTES) keep buffers from completing during emission.
 *
 * base mode: the same launches into buffers of our own, then a bare loop that walks them with
 * cuptiActivityGetNextRecord and copies the fields the library keeps (minimal decode).
 *
 * Output: human lines, plus "RESULT mode=<base|lib> ns_per_record=<x> records=<n>" lines for
 * bench/capture/run.sh. Exit 0 when every mode ran and (lib) every record was decoded and the
 * peer received records; 1 otherwise; 2 usage.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fakecupti.h"
#include "kp_clock.h"
#include "kp_wire.h"
#include "kprof.h"

#define CB_DEFAULT_LAUNCHES 200000
#define CB_QUICK_LAUNCHES   20000
#define CB_RECS_PER_LAUNCH  3
#define CB_WAIT_MS          60000
#define CB_CAPTURE_ID       1

static const char *const cb_names[] = {
    "ampere_sgemm_128x64_tn",
    "ampere_sgemm_64x64_nn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>",
    "void at::native::reduce_kernel<512, 1>",
    "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4",
    "void at::native::unrolled_elementwise_kernel<at::native::FillFunctor<float>>",
};
#define CB_NNAMES (sizeof(cb_names) / sizeof(cb_names[0]))

static void cb_sleep_us(int us)
{
    struct timespec ts = { .tv_sec = 0, .tv_nsec = (long) us * 1000 };

    nanosleep(&ts, NULL);
}

static void cb_emit(size_t launches)
{
    struct fakecupti_kernel k;

    memset(&k, 0, sizeof(k));
    k.context = 1;
    k.stream = 7;
    k.grid_x = 128;
    k.grid_y = k.grid_z = 1;
    k.block_x = 256;
    k.block_y = k.block_z = 1;
    k.registers = 64;
    k.static_smem = 16384;
    for (size_t i = 0; i < launches; i++) {
        k.name = cb_names[i % CB_NNAMES];
        fakecupti_launch_kernel(&k);
    }
}

/* ---- baseline: walk and copy ---- */

struct cb_buf {
    uint8_t *buf;
    size_t valid;
};

static struct cb_buf *g_bufs;
static size_t g_nbufs, g_capbufs;
static pthread_mutex_t g_bufs_mu = PTHREAD_MUTEX_INITIALIZER;
static const size_t cb_base_buf_bytes = 8u << 20;

static void cb_request(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, cb_base_buf_bytes);
    *size = *buffer ? cb_base_buf_bytes : 0;
    *max_records = 0;
}

static void cb_complete(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void) ctx;
    (void) stream;
    (void) size;
    pthread_mutex_lock(&g_bufs_mu);
    if (g_nbufs == g_capbufs) {
        size_t cap = g_capbufs ? 2 * g_capbufs : 64;
        struct cb_buf *b = realloc(g_bufs, cap * sizeof(*b));

        if (!b) {
            pthread_mutex_unlock(&g_bufs_mu);
            free(buffer);
            return;
        }
        g_bufs = b;
        g_capbufs = cap;
    }
    g_bufs[g_nbufs].buf = buffer;
    g_bufs[g_nbufs].valid = valid;
    g_nbufs++;
    pthread_mutex_unlock(&g_bufs_mu);
}

/* Returns ns per record, or -1. */
static double cb_run_base(size_t launches, size_t *nrec_out)
{
    static struct kp_wire_kernel kr[1024];
    static struct kp_wire_api ar[1024];
    static uint64_t ext[4096];
    const CUpti_ActivityKind kinds[] = { CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION };
    size_t nrec = 0, nk = 0, na = 0;
    uint64_t sink = 0;
    int64_t t0, t1;

    if (cuptiActivityRegisterCallbacks(cb_request, cb_complete) != CUPTI_SUCCESS) {
        return -1;
    }
    for (size_t i = 0; i < 3; i++) {
        cuptiActivityEnable(kinds[i]);
    }
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, 42);
    cb_emit(launches);
    cuptiActivityFlushAll(0);
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, NULL);
    for (size_t i = 0; i < 3; i++) {
        cuptiActivityDisable(kinds[i]);
    }

    t0 = kp_mono_ns();
    for (size_t b = 0; b < g_nbufs; b++) {
        CUpti_Activity *r = NULL;

        while (cuptiActivityGetNextRecord(g_bufs[b].buf, g_bufs[b].valid, &r) == CUPTI_SUCCESS) {
            nrec++;
            switch (r->kind) {
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const CUpti_ActivityKernel10 *k = (const void *) r;
                struct kp_wire_kernel *o = &kr[nk++ % 1024];

                o->start_ns = (int64_t) k->start;
                o->end_ns = (int64_t) k->end;
                o->correlation = k->correlationId;
                o->graph_node_id = k->graphNodeId;
                o->name = (uint32_t) (uintptr_t) k->name; /* the library interns here */
                o->device = k->deviceId;
                o->context = k->contextId;
                o->stream = k->streamId;
                o->grid_x = (uint32_t) k->gridX;
                o->grid_y = (uint32_t) k->gridY;
                o->grid_z = (uint32_t) k->gridZ;
                o->block_x = (uint32_t) k->blockX;
                o->block_y = (uint32_t) k->blockY;
                o->block_z = (uint32_t) k->blockZ;
                o->registers = k->registersPerThread;
                o->static_smem = (uint32_t) k->staticSharedMemory;
                o->dynamic_smem = (uint32_t) k->dynamicSharedMemory;
                o->graph_id = k->graphId;
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME: {
                const CUpti_ActivityAPI *a = (const void *) r;
                struct kp_wire_api *o = &ar[na++ % 1024];

                o->start_ns = (int64_t) a->start;
                o->end_ns = (int64_t) a->end;
                o->correlation = a->correlationId;
                o->external_id = ext[a->correlationId % 4096];
                o->tid = a->threadId;
                o->domain = 1;
                o->cbid = a->cbid;
                o->return_value = (int32_t) a->returnValue;
                break;
            }
            case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
                const CUpti_ActivityExternalCorrelation *e = (const void *) r;

                ext[e->correlationId % 4096] = e->externalId;
                break;
            }
            default:
                break;
            }
        }
    }
    t1 = kp_mono_ns();
    for (size_t i = 0; i < 1024; i++) {
        sink += kr[i].correlation + ar[i].external_id;
    }
    for (size_t b = 0; b < g_nbufs; b++) {
        free(g_bufs[b].buf);
    }
    g_nbufs = 0;
    *nrec_out = nrec;
    if (nrec != launches * CB_RECS_PER_LAUNCH) {
        fprintf(stderr, "base: walked %zu records, expected %zu (sink %" PRIu64 ")\n", nrec,
                launches * CB_RECS_PER_LAUNCH, sink);
        return -1;
    }
    return (double) (t1 - t0) / (double) nrec;
}

/* ---- lib mode: the in-process agent peer ---- */

struct cb_peer {
    int lfd, fd;
    char path[108];
    pthread_t th;
    atomic_int stop, disarm;
    atomic_uint_fast64_t msgs, records, hellos, window_begin, window_end, bad;
};

static int cb_send(int fd, enum kp_wire_type type, const void *payload, uint32_t len)
{
    uint8_t msg[sizeof(struct kp_wire_hdr) + 512];
    struct kp_wire_hdr h;

    kp_wire_hdr_init(&h, type, len, 0);
    memcpy(msg, &h, sizeof(h));
    memcpy(msg + sizeof(h), payload, len);
    return send(fd, msg, sizeof(h) + len, MSG_NOSIGNAL) == (ssize_t) (sizeof(h) + len) ? 0 : -errno;
}

static void cb_peer_on_msg(struct cb_peer *p, const uint8_t *msg, size_t n)
{
    const struct kp_wire_hdr *h = (const void *) msg;
    const char *why = NULL;

    if (kp_wire_check(msg, n, &why) < 0) {
        fprintf(stderr, "peer: bad message from the library: %s\n", why ? why : "?");
        atomic_fetch_add(&p->bad, 1);
        return;
    }
    atomic_fetch_add(&p->msgs, 1);
    switch (h->type) {
    case KP_W_HELLO: {
        struct kp_wire_welcome w;
        struct kp_wire_arm a;

        atomic_fetch_add(&p->hellos, 1);
        memset(&w, 0, sizeof(w));
        w.accepted = 1;
        w.agent_id = 1;
        memset(&a, 0, sizeof(a));
        a.capture_id = CB_CAPTURE_ID;
        a.run_id = 1;
        a.target_step = -1;
        a.duration_ms = 600000;
        a.activities = KP_ACT_DEFAULT;
        if (cb_send(p->fd, KP_W_WELCOME, &w, sizeof(w)) < 0 ||
            cb_send(p->fd, KP_W_ARM, &a, sizeof(a)) < 0) {
            fprintf(stderr, "peer: send: %s\n", strerror(errno));
        }
        break;
    }
    case KP_W_RECORDS:
        atomic_fetch_add(&p->records, h->count);
        break;
    case KP_W_WINDOW_BEGIN:
        atomic_fetch_add(&p->window_begin, 1);
        break;
    case KP_W_WINDOW_END:
        atomic_fetch_add(&p->window_end, 1);
        break;
    default:
        break;
    }
}

static void *cb_peer_main(void *arg)
{
    struct cb_peer *p = arg;
    static uint8_t msg[KP_WIRE_MAX_MSG];
    int disarm_sent = 0;

    while (!atomic_load(&p->stop)) {
        struct pollfd pf = { .fd = p->fd >= 0 ? p->fd : p->lfd, .events = POLLIN };
        int r = poll(&pf, 1, 20);

        if (p->fd >= 0 && atomic_load(&p->disarm) && !disarm_sent) {
            struct kp_wire_disarm d = { .capture_id = CB_CAPTURE_ID };

            disarm_sent = cb_send(p->fd, KP_W_DISARM, &d, sizeof(d)) == 0;
        }
        if (r <= 0) {
            continue;
        }
        if (p->fd < 0) {
            p->fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
            continue;
        }
        for (;;) {
            ssize_t n = recv(p->fd, msg, sizeof(msg), MSG_DONTWAIT);

            if (n > 0) {
                cb_peer_on_msg(p, msg, (size_t) n);
                continue;
            }
            if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                close(p->fd);
                p->fd = -1;
            }
            break;
        }
    }
    return NULL;
}

static int cb_peer_start(struct cb_peer *p)
{
    struct sockaddr_un a;

    memset(p, 0, sizeof(*p));
    p->fd = -1;
    snprintf(p->path, sizeof(p->path), "/tmp/kprof-bench-capture-%d.sock", (int) getpid());
    unlink(p->path);
    p->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (p->lfd < 0) {
        return -errno;
    }
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, p->path, strlen(p->path) + 1);
    if (bind(p->lfd, (struct sockaddr *) &a, sizeof(a)) < 0 || listen(p->lfd, 4) < 0) {
        int e = -errno;

        close(p->lfd);
        return e;
    }
    if (pthread_create(&p->th, NULL, cb_peer_main, p) != 0) {
        close(p->lfd);
        unlink(p->path);
        return -EAGAIN;
    }
    return 0;
}

static void cb_peer_stop(struct cb_peer *p)
{
    atomic_store(&p->stop, 1);
    pthread_join(p->th, NULL);
    if (p->fd >= 0) {
        close(p->fd);
    }
    close(p->lfd);
    unlink(p->path);
}

static int (*g_get_stats)(struct kprof_stats *);

static void cb_stats(struct kprof_stats *st)
{
    memset(st, 0, sizeof(*st));
    st->size = sizeof(*st);
    g_get_stats(st);
}

/* Polls until cond holds or timeout_ms pass. */
static int cb_wait(int (*cond)(void *), void *arg, int timeout_ms)
{
    int64_t end = kp_mono_ns() + (int64_t) timeout_ms * 1000000;

    while (!cond(arg)) {
        if (kp_mono_ns() > end) {
            return -1;
        }
        cb_sleep_us(20);
    }
    return 0;
}

static int cb_capturing(void *arg)
{
    struct kprof_stats st;

    (void) arg;
    cb_stats(&st);
    return st.connected && st.enabled_kinds > 0 && st.state == KP_ST_CAPTURING;
}

static int cb_decoded(void *arg)
{
    struct kprof_stats st;

    cb_stats(&st);
    return st.records_decoded >= *(uint64_t *) arg;
}

static int cb_window_ended(void *arg)
{
    return atomic_load(&((struct cb_peer *) arg)->window_end) > 0;
}

static double cb_run_lib(const char *lib, size_t launches, size_t *nrec_out)
{
    struct cb_peer peer;
    struct kprof_stats st0, st1, st2;
    int (*init)(void);
    uint64_t target, at_flush;
    int64_t t0, t1;
    double ns = -1;
    void *h;
    int rc;

    if ((rc = cb_peer_start(&peer)) < 0) {
        fprintf(stderr, "lib: cannot listen on a temp socket: %s\n", strerror(-rc));
        return -1;
    }
    setenv("KPROF_AGENT_SOCKET", peer.path, 1);
    setenv("KPROF_BUFFER_BYTES", "128MiB", 0);
    setenv("KPROF_MAX_BUFFER_BYTES", "1GiB", 0);
    setenv("KPROF_QUEUE_BYTES", "1GiB", 0);
    h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "lib: dlopen %s: %s\n", lib, dlerror());
        goto out;
    }
    *(void **) &init = dlsym(h, "InitializeInjection");
    *(void **) &g_get_stats = dlsym(h, "kprof_get_stats");
    if (!init || !g_get_stats) {
        fprintf(stderr, "lib: %s lacks InitializeInjection/kprof_get_stats\n", lib);
        goto out;
    }
    init();
    if (cb_wait(cb_capturing, NULL, 15000) < 0) {
        cb_stats(&st0);
        fprintf(stderr,
                "lib: the library did not start capturing in 15 s (connected=%" PRIu32
                " state=%" PRIu32 " enabled_kinds=%" PRIu32 " hellos=%" PRIuFAST64 ")\n",
                st0.connected, st0.state, st0.enabled_kinds, atomic_load(&peer.hellos));
        goto out;
    }
    cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, 42);
    cb_stats(&st0);
    cb_emit(launches);
    cb_stats(&st1);
    at_flush = st1.records_decoded;
    target = st0.records_decoded + launches * CB_RECS_PER_LAUNCH;
    t0 = kp_mono_ns();
    cuptiActivityFlushAll(0);
    if (cb_wait(cb_decoded, &target, CB_WAIT_MS) < 0) {
        cb_stats(&st2);
        fprintf(stderr,
                "lib: only %" PRIu64 " of %zu records decoded in %d ms (cupti_dropped=%" PRIu64
                " buffers_declined=%" PRIu64 ")\n",
                st2.records_decoded - st0.records_decoded, launches * CB_RECS_PER_LAUNCH,
                CB_WAIT_MS, st2.cupti_dropped, st2.buffers_declined);
        goto out;
    }
    t1 = kp_mono_ns();
    cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2, NULL);
    *nrec_out = (size_t) (target - at_flush);
    ns = (double) (t1 - t0) / (double) (target - at_flush);

    /* End the window and wait for WINDOW_END: every record reached the peer or was counted. */
    atomic_store(&peer.disarm, 1);
    if (cb_wait(cb_window_ended, &peer, 10000) < 0) {
        fprintf(stderr, "lib: no WINDOW_END within 10 s of DISARM\n");
        ns = -1;
    }
    cb_stats(&st2);
    printf("lib: decoded %" PRIu64 " (%" PRIu64 " before the flush), sent %" PRIu64
           ", dropped %" PRIu64 ", peer received %" PRIuFAST64 " records in %" PRIuFAST64
           " messages\n",
           st2.records_decoded - st0.records_decoded, at_flush - st0.records_decoded,
           st2.records_sent, st2.records_dropped, atomic_load(&peer.records),
           atomic_load(&peer.msgs));
    if (atomic_load(&peer.records) == 0 || atomic_load(&peer.bad)) {
        fprintf(stderr, "lib: the peer received no records or bad messages\n");
        ns = -1;
    }
out:
    cb_peer_stop(&peer);
    return ns;
}

int main(int argc, char **argv)
{
    const char *lib = KP_BENCH_INJECT_PATH, *mode = "both";
    size_t launches = CB_DEFAULT_LAUNCHES, nb = 0, nl = 0;
    double base = 0, libns = 0;
    Dl_info di;
    int rc = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            launches = CB_QUICK_LAUNCHES;
        }
        else if (!strcmp(argv[i], "--launches") && i + 1 < argc) {
            launches = strtoul(argv[++i], NULL, 10);
        }
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            mode = argv[++i];
        }
        else if (!strcmp(argv[i], "--lib") && i + 1 < argc) {
            lib = argv[++i];
        }
        else {
            fprintf(stderr,
                    "usage: %s [--quick] [--launches M] [--mode both|base|lib] "
                    "[--lib libkprof_inject.so]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!launches || (strcmp(mode, "both") && strcmp(mode, "base") && strcmp(mode, "lib"))) {
        fprintf(stderr, "%s: --launches must be > 0 and --mode both|base|lib\n", argv[0]);
        return 2;
    }
    /* The library must resolve this very fake. */
    if (!dladdr((void *) fakecupti_stats, &di) || !di.dli_fname) {
        fprintf(stderr, "cannot find the path of the linked fake libcupti\n");
        return 1;
    }
    setenv("KPROF_CUPTI_PATH", di.dli_fname, 1);
    /* Kernel names as real CUPTI hands them over: one pointer per distinct kernel. */
    setenv("FAKECUPTI_SHARED_NAMES", "1", 0);
    setenv("RANK", "0", 0);
    printf("capture bench: %zu launches, %d CUPTI records each (ext-corr + API + kernel)\n",
           launches, CB_RECS_PER_LAUNCH);
    if (strcmp(mode, "lib")) {
        base = cb_run_base(launches, &nb);
        if (base < 0) {
            rc = 1;
        }
        else {
            printf("baseline (walk + copy fields): %.1f ns/record over %zu records\n", base, nb);
            printf("RESULT mode=base ns_per_record=%.2f records=%zu\n", base, nb);
        }
    }
    if (strcmp(mode, "base")) {
        libns = cb_run_lib(lib, launches, &nl);
        if (libns < 0) {
            rc = 1;
        }
        else {
            printf("library decode + hand-off:     %.1f ns/record over %zu records (target < 50)\n",
                   libns, nl);
            printf("RESULT mode=lib ns_per_record=%.2f records=%zu\n", libns, nl);
        }
    }
    if (rc == 0 && base > 0 && libns > 0) {
        printf("ratio library/baseline: %.2f\n", libns / base);
    }
    return rc;
}
