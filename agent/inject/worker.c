/*
 * worker.c: the one background thread of libkprof_inject.so: the link to kprof-agent, capture
 * windows, draining CUPTI and the NVTX range ring, and the outgoing message queue.
 *
 * DESIGN
 * Only this thread talks to the agent or calls cuptiActivityFlushAll. It loops on poll(2)
 * over the agent socket and an eventfd that application threads and CUPTI callbacks write to
 * (step events, completed buffers, a low buffer pool); the tick is at most 100 ms.
 *
 * Link: AF_UNIX SOCK_SEQPACKET, non-blocking, to KPROF_AGENT_SOCKET (default
 * KP_WIRE_DEFAULT_SOCKET). connect fails ⇒ retry with backoff 1 s → 10 s. Connected ⇒ HELLO,
 * kpi_intern_rewind (the agent needs every string again), wait for WELCOME (5 s); refused ⇒
 * the reason is logged once and we retry later. Registered ⇒ STATUS every second and on each
 * state change. A lost link fails an active capture ("agent connection lost"): kinds off, what
 * is still in CUPTI is drained and counted as dropped.
 *
 * Capture (one at a time): ARM(target_step ≥ 0) ⇒ ARMED; at step target-1 the kinds are
 * enabled and recording starts (WARMUP; records starting before that are discarded); at
 * step target ⇒ WINDOW_BEGIN (CAPTURING); at step target+n_steps, after duration_ms, or on
 * DISARM ⇒ recording stops, kinds off (FLUSHING), and after a 200 ms grace FlushAll(0),
 * FlushAll(FORCED), the last drain, WINDOW_END with the final counters (DONE). A step whose
 * event is popped only after the window ended (a DISARM read first in the same turn) but that
 * began before the end is still sent: its records are inside the window. target_step -1
 * is a time window that begins at once. During a window FlushAll(0) runs every 250 ms.
 *
 * Outgoing: messages of at most KP_WIRE_MAX_MSG bytes in a FIFO bounded by KPROF_QUEUE_BYTES
 * (default 16 MiB). RECORDS (one kind per message) may use the queue up to its limit minus a
 * reserve and are dropped and counted beyond; STRINGS, STEP, WINDOW_* and STATUS use the
 * reserve. STRINGS always precede the RECORDS that use their ids: before a RECORDS message is
 * queued the intern table is drained past the largest id it holds. A queue that stays full
 * even for those means the agent stopped reading: the link is closed. Sending never blocks:
 * EAGAIN keeps the message queued until POLLOUT.
 */
#define _GNU_SOURCE /* dladdr, pthread_setname_np, pthread_timedjoin_np */
#include "cupti_int.h"
#include "kp_clock.h"
#include "kp_str.h"

#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MS                  1000000ll
#define KPI_TICK_MS         100
#define KPI_FLUSH_EVERY_MS  250
#define KPI_GRACE_MS        200
#define KPI_STATUS_EVERY_MS 1000
#define KPI_STATUS_STEP_MS  100
#define KPI_WELCOME_WAIT_MS 5000
#define KPI_BACKOFF_MIN_MS  1000u
#define KPI_BACKOFF_MAX_MS  10000u
#define KPI_QUEUE_RESERVE   (1u << 20) /* kept for STRINGS/STEP/WINDOW/STATUS */
#define KPI_RANGE_POP       256
#define KPI_REC_KINDS       (KP_REC_RANGE + 1)
#define KPI_REC_PAYLOAD_OFF (sizeof(struct kp_wire_hdr) + sizeof(struct kp_wire_records))

enum kpi_link {
    LINK_DOWN = 0,
    LINK_HELLO,
    LINK_UP
};

struct kpi_msg {
    struct kpi_msg *next;
    uint32_t len;
    uint32_t nrec; /* RECORDS: records in it (counted as sent when it leaves) */
    unsigned char data[];
};

struct kpi_batch {
    unsigned char buf[KP_WIRE_MAX_MSG];
    uint32_t count;
    uint32_t max_name; /* largest string id used by the records in buf */
};

struct kpi_capture {
    uint64_t id, run_id;
    int64_t target_step;
    uint32_t n_steps, acts;
    uint64_t duration_ms, deadline_ns;
    uint32_t state;     /* enum kp_wire_state */
    int recording;      /* kinds enabled, kpi_recording_flag = 1 */
    int began;          /* WINDOW_BEGIN sent */
    int lost;           /* failed after recording began: late records are drops */
    int64_t warmup_ns;  /* CLOCK_REALTIME when recording began: earlier records discarded */
    int64_t begin_ns;   /* WINDOW_BEGIN.start_ns */
    int64_t end_ns;     /* WINDOW_END.end_ns */
    int64_t begin_mono; /* CLOCK_MONOTONIC at begin (duration limit) */
    int64_t flush_at;   /* FLUSHING: CLOCK_MONOTONIC when the final flush runs */
    int64_t first_step, last_step, prev_step;
    uint64_t records, dropped, cupti_dropped, incomplete, overhead_ns;
    uint64_t ranges_dropped0; /* kpi_nvtx_counters.ranges_dropped when the capture began */
    char reason[KPI_REASON_CAP];
};

static struct {
    pthread_t thr;
    int started;
    atomic_int stop;       /* the exit handler asks the worker to finish */
    int64_t stop_deadline; /* CLOCK_MONOTONIC */
    int stopping;          /* the worker has acted on stop */
    int fd;                /* agent socket, -1 when down */
    int evfd;
    enum kpi_link link;
    int64_t next_connect; /* CLOCK_MONOTONIC */
    uint32_t backoff_ms;
    int64_t hello_deadline;
    int connect_logged, refused_logged;
    const char *kill_reason; /* close the link at the end of this iteration (set in enqueue) */
    char sock_path[sizeof(((struct sockaddr_un *) 0)->sun_path)];

    struct kpi_msg *qhead, *qtail;
    size_t qbytes, qlimit;

    unsigned char sbuf[KP_WIRE_MAX_MSG]; /* STRINGS being built */
    uint32_t slen, scount;
    uint32_t strings_upto; /* largest string id handed to the queue on this connection */
    int sfull;

    struct kpi_batch batch[KPI_REC_KINDS];
    struct kpi_capture cap;
    int64_t next_status, next_flush;
    int64_t status_at, status_step; /* when the last STATUS went out, and the step it told */
    int nvtx_ours;

    unsigned char rbuf[KP_WIRE_MAX_MSG + 64];
} W = { .fd = -1, .evfd = -1 };

static int64_t raw_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int capture_active(uint32_t st)
{
    return st == KP_ST_ARMED || st == KP_ST_WARMUP || st == KP_ST_CAPTURING || st == KP_ST_FLUSHING;
}

/* ---- outgoing queue ---- */

static void link_lost(const char *why);

static void count_dropped(uint64_t n)
{
    if (n == 0) {
        return;
    }
    atomic_fetch_add_explicit(&kpi_core.c.records_dropped, n, memory_order_relaxed);
    if (capture_active(W.cap.state) || W.cap.lost) {
        W.cap.dropped += n;
    }
}

static void queue_clear(void)
{
    while (W.qhead != NULL) {
        struct kpi_msg *m = W.qhead;
        W.qhead = m->next;
        count_dropped(m->nrec);
        free(m);
    }
    W.qtail = NULL;
    W.qbytes = 0;
}

/* Queues header + payload. Records (nrec > 0) are dropped and counted when the queue is full
 * up to its reserve; other messages use the reserve, and a queue full past that closes the
 * link (the agent stopped reading). Returns 0 or -1 (not queued). */
static int enqueue(enum kp_wire_type type, uint32_t count, const void *payload, uint32_t len,
                   uint32_t nrec)
{
    size_t total = sizeof(struct kp_wire_hdr) + len;
    struct kpi_msg *m;

    if (W.fd < 0 || W.kill_reason != NULL || (W.link != LINK_UP && type != KP_W_HELLO)) {
        count_dropped(nrec);
        return -1;
    }
    if (nrec > 0 && W.qbytes + total > W.qlimit - KPI_QUEUE_RESERVE) {
        count_dropped(nrec);
        kpi_logl(KPI_LOG_INFO, "outgoing queue full (%zu bytes): dropped %u records", W.qbytes,
                 nrec);
        return -1;
    }
    if (nrec == 0 && W.qbytes + total > W.qlimit) {
        /* Not here: enqueue runs deep inside the decoder. The loop closes the link. */
        W.kill_reason = "the agent stopped reading (outgoing queue full)";
        return -1;
    }
    m = malloc(sizeof(*m) + total);
    if (m == NULL) {
        count_dropped(nrec);
        return -1;
    }
    m->next = NULL;
    m->len = (uint32_t) total;
    m->nrec = nrec;
    kp_wire_hdr_init((struct kp_wire_hdr *) m->data, type, len, count);
    if (len > 0) {
        memcpy(m->data + sizeof(struct kp_wire_hdr), payload, len);
    }
    if (W.qtail != NULL) {
        W.qtail->next = m;
    }
    else {
        W.qhead = m;
    }
    W.qtail = m;
    W.qbytes += total;
    return 0;
}

static void queue_send(void)
{
    while (W.qhead != NULL && W.fd >= 0) {
        struct kpi_msg *m = W.qhead;
        ssize_t n = send(W.fd, m->data, m->len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
                return; /* POLLOUT wakes us */
            }
            link_lost(strerror(errno));
            return;
        }
        W.qhead = m->next;
        if (W.qhead == NULL) {
            W.qtail = NULL;
        }
        W.qbytes -= m->len;
        atomic_fetch_add_explicit(&kpi_core.c.records_sent, m->nrec, memory_order_relaxed);
        free(m);
    }
}

/*
 * Like enqueue, for a payload that sits right after sizeof(struct kp_wire_hdr) writable bytes
 * at msg: when nothing is queued the message goes straight to the socket from there (no
 * allocation, no copy: the common case while the agent keeps up); otherwise, or on EAGAIN, it
 * is queued behind the others.
 */
static int send_or_enqueue(enum kp_wire_type type, uint32_t count, uint8_t *msg, uint32_t len,
                           uint32_t nrec)
{
    size_t total = sizeof(struct kp_wire_hdr) + len;

    if (W.qhead == NULL && W.fd >= 0 && W.kill_reason == NULL && W.link == LINK_UP) {
        kp_wire_hdr_init((struct kp_wire_hdr *) msg, type, len, count);
        for (;;) {
            ssize_t n = send(W.fd, msg, total, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n >= 0) {
                atomic_fetch_add_explicit(&kpi_core.c.records_sent, nrec, memory_order_relaxed);
                return 0;
            }
            if (errno != EINTR) {
                break;
            }
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) {
            /* Not here (we may be deep inside the decoder): the loop closes the link. */
            count_dropped(nrec);
            W.kill_reason = "sending to the agent failed (connection reset)";
            return -1;
        }
    }
    return enqueue(type, count, msg + sizeof(struct kp_wire_hdr), len, nrec);
}

/* ---- strings ---- */

static void strings_flush(void)
{
    if (W.scount > 0) {
        enqueue(KP_W_STRINGS, W.scount, W.sbuf, W.slen, 0);
    }
    W.slen = 0;
    W.scount = 0;
}

static int strings_cb(void *ctx, uint32_t id, const char *s, uint32_t len)
{
    uint32_t e[2] = { id, len };
    uint32_t padded = (len + 3u) & ~3u;
    size_t room = KP_WIRE_MAX_MSG - sizeof(struct kp_wire_hdr);

    if (8u + padded > room) {
        /* Cannot happen (intern caps strings at 4 KiB); never emit an unsendable message. */
        W.strings_upto = id;
        return 0;
    }
    if (W.slen + 8u + padded > room) {
        W.sfull = 1;
        return 1;
    }
    memcpy(W.sbuf + W.slen, e, sizeof(e));
    memcpy(W.sbuf + W.slen + 8, s, len);
    memset(W.sbuf + W.slen + 8 + len, 0, padded - len);
    W.slen += 8u + padded;
    W.scount++;
    W.strings_upto = id;
    return 0;
}

static void strings_drain(void)
{
    for (;;) {
        W.sfull = 0;
        kpi_intern_drain(strings_cb, NULL);
        if (!W.sfull) {
            break;
        }
        strings_flush();
    }
    strings_flush();
}

/* Queues STRINGS up to id `upto` at least. An id still being written by another thread is
 * waited for briefly (it is a memcpy away); past that the records go anyway. */
static void strings_ensure(uint32_t upto)
{
    strings_drain();
    for (int i = 0; i < 1000 && W.strings_upto < upto; i++) {
        sched_yield();
        strings_drain();
    }
    if (W.strings_upto < upto) {
        kpi_logl(KPI_LOG_INFO, "string %u not ready: records may show an empty name", upto);
    }
}

/* ---- record batches ---- */

static void batch_flush(uint32_t kind)
{
    struct kpi_batch *b = &W.batch[kind];
    struct kp_wire_records rh;
    uint32_t rs = (uint32_t) kp_wire_rec_size(kind);

    if (b->count == 0) {
        return;
    }
    if (W.link == LINK_UP) {
        strings_ensure(b->max_name);
    }
    rh.kind = kind;
    rh.rec_size = rs;
    memcpy(b->buf + sizeof(struct kp_wire_hdr), &rh, sizeof(rh));
    if (send_or_enqueue(KP_W_RECORDS, b->count, b->buf,
                        (uint32_t) (sizeof(rh) + (size_t) b->count * rs), b->count) == 0) {
        W.cap.records += b->count;
    }
    b->count = 0;
    b->max_name = 0;
}

static void batches_flush(void)
{
    for (uint32_t k = 1; k < KPI_REC_KINDS; k++) {
        batch_flush(k);
    }
}

static void batches_clear(void)
{
    for (uint32_t k = 1; k < KPI_REC_KINDS; k++) {
        count_dropped(W.batch[k].count);
        W.batch[k].count = 0;
        W.batch[k].max_name = 0;
    }
}

static int sending(void)
{
    uint32_t st = W.cap.state;

    return W.link == LINK_UP &&
           (st == KP_ST_WARMUP || st == KP_ST_CAPTURING || st == KP_ST_FLUSHING);
}

static void on_record(void *ctx, uint32_t kind, const void *rec, uint32_t max_name,
                      int64_t start_ns)
{
    struct kpi_batch *b = &W.batch[kind];
    size_t rs = kp_wire_rec_size(kind);

    if (!sending()) {
        if (W.cap.lost) {
            count_dropped(1);
        }
        return;
    }
    if (KPI_REC_PAYLOAD_OFF + (size_t) (b->count + 1) * rs > KP_WIRE_MAX_MSG) {
        batch_flush(kind);
    }
    memcpy(b->buf + KPI_REC_PAYLOAD_OFF + (size_t) b->count * rs, rec, rs);
    b->count++;
    if (max_name > b->max_name) {
        b->max_name = max_name;
    }
}

/* ---- control messages ---- */

static void fill_status(struct kp_wire_status *s)
{
    memset(s, 0, sizeof(*s));
    s->capture_id = W.cap.id;
    s->state = W.cap.state;
    s->device = atomic_load_explicit(&kpi_core.device, memory_order_relaxed);
    s->current_step = atomic_load_explicit(&kpi_core.current_step, memory_order_relaxed);
    s->records = W.cap.records;
    s->dropped = W.cap.dropped;
    s->cupti_dropped = W.cap.cupti_dropped;
    s->incomplete = W.cap.incomplete;
    s->overhead_ns = W.cap.overhead_ns;
    if (W.cap.state == KP_ST_FAILED) {
        kp_strlcpy(s->reason, sizeof(s->reason), W.cap.reason);
    }
    else if (W.cap.state == KP_ST_DORMANT && kpi_core.cupti_error[0] != '\0') {
        kp_strlcpy(s->reason, sizeof(s->reason), kpi_core.cupti_error);
    }
}

static void send_status(void)
{
    struct kp_wire_status s;

    if (W.link != LINK_UP) {
        return;
    }
    fill_status(&s);
    enqueue(KP_W_STATUS, 0, &s, sizeof(s), 0);
    W.status_at = kp_mono_ns();
    W.status_step = s.current_step;
    W.next_status = W.status_at + KPI_STATUS_EVERY_MS * MS;
}

static void update_dropped(void)
{
    uint64_t rd = atomic_load_explicit(&kpi_nvtx_counters.ranges_dropped, memory_order_relaxed);
    uint64_t n = kpi_cupti_take_dropped();

    /* CUPTI's count resets on read: poll after every flush, outside any lock. */
    if (n > 0) {
        atomic_fetch_add_explicit(&kpi_core.c.cupti_dropped, n, memory_order_relaxed);
        W.cap.cupti_dropped += n;
    }
    if (rd > W.cap.ranges_dropped0) {
        W.cap.dropped += rd - W.cap.ranges_dropped0;
        W.cap.ranges_dropped0 = rd;
    }
}

static void set_state(uint32_t st)
{
    W.cap.state = st;
    atomic_store_explicit(&kpi_core.state, st, memory_order_relaxed);
    atomic_store_explicit(&kpi_core.capture_live,
                          st == KP_ST_ARMED || st == KP_ST_WARMUP || st == KP_ST_CAPTURING,
                          memory_order_release);
    send_status();
}

static void send_window(enum kp_wire_type type)
{
    struct kp_wire_window w;

    memset(&w, 0, sizeof(w));
    w.capture_id = W.cap.id;
    w.run_id = W.cap.run_id;
    w.start_ns = W.cap.begin_ns;
    w.first_step = W.cap.first_step;
    w.last_step = -1;
    if (type == KP_W_WINDOW_END) {
        w.end_ns = W.cap.end_ns;
        w.last_step = W.cap.last_step;
        w.records = W.cap.records;
        w.dropped = W.cap.dropped;
        w.cupti_dropped = W.cap.cupti_dropped;
        w.incomplete = W.cap.incomplete;
        w.overhead_ns = W.cap.overhead_ns;
    }
    w.realtime_ns = kpi_now_ns();
    w.monotonic_raw_ns = raw_ns();
    enqueue(type, 0, &w, sizeof(w), 0);
}

static void send_step(const struct kp_wire_step *ev)
{
    struct kp_wire_step s = *ev;

    s.pad = 0;
    enqueue(KP_W_STEP, 0, &s, sizeof(s), 0);
}

/* ---- draining ---- */

static void drain_ranges(void)
{
    struct kp_wire_range r[KPI_RANGE_POP];
    size_t n;

    while ((n = kpi_ranges_pop(r, KPI_RANGE_POP)) > 0) {
        for (size_t i = 0; i < n; i++) {
            uint32_t mx = r[i].name;
            if (r[i].domain > mx) {
                mx = r[i].domain;
            }
            if (r[i].shapes > mx) {
                mx = r[i].shapes;
            }
            on_record(NULL, KP_REC_RANGE, &r[i], mx, r[i].start_ns);
        }
        if (n < KPI_RANGE_POP) {
            break;
        }
    }
}

static void drain_cupti(void)
{
    struct kpi_sink sink;

    memset(&sink, 0, sizeof(sink));
    sink.rec = on_record;
    sink.min_start_ns =
        W.cap.recording || W.cap.state == KP_ST_FLUSHING ? W.cap.warmup_ns : INT64_MIN;
    kpi_cupti_drain(&sink);
    if (sending()) {
        W.cap.overhead_ns += sink.overhead_ns;
        W.cap.incomplete += sink.incomplete;
    }
}

/* ---- capture ---- */

static void stop_recording(void)
{
    if (!W.cap.recording) {
        return;
    }
    W.cap.recording = 0;
    atomic_store_explicit(&kpi_recording_flag, 0, memory_order_relaxed);
    kpi_nvtx_recording_changed(0);
    kpi_cupti_disable();
}

static void cap_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void cap_fail(const char *fmt, ...)
{
    va_list ap;
    int was = W.cap.recording || W.cap.state == KP_ST_FLUSHING;

    va_start(ap, fmt);
    vsnprintf(W.cap.reason, sizeof(W.cap.reason), fmt, ap);
    va_end(ap);
    kpi_logl(KPI_LOG_INFO, "capture %llu failed: %s", (unsigned long long) W.cap.id, W.cap.reason);
    stop_recording();
    if (was) {
        /* What CUPTI still holds is drained and counted as dropped. */
        W.cap.lost = 1;
        set_state(KP_ST_FAILED);
        batches_clear();
        kpi_cupti_flush(0);
        kpi_cupti_flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        drain_cupti();
        drain_ranges();
        update_dropped();
        send_status();
        return;
    }
    set_state(KP_ST_FAILED);
}

static int start_recording(void)
{
    char why[KPI_REASON_CAP];

    if (kpi_cupti_enable(W.cap.acts, why, sizeof(why)) != 0) {
        cap_fail("%s", why);
        return -1;
    }
    W.cap.recording = 1;
    W.cap.warmup_ns = kpi_now_ns();
    W.cap.ranges_dropped0 =
        atomic_load_explicit(&kpi_nvtx_counters.ranges_dropped, memory_order_relaxed);
    kpi_cupti_take_dropped(); /* forget drops from before this capture */
    atomic_store_explicit(&kpi_recording_flag, 1, memory_order_relaxed);
    kpi_nvtx_recording_changed(1);
    W.next_flush = kp_mono_ns() + KPI_FLUSH_EVERY_MS * MS;
    return 0;
}

static void begin_window(int64_t start_ns, int64_t step)
{
    W.cap.begin_ns = start_ns;
    W.cap.begin_mono = kp_mono_ns() - (kpi_now_ns() - start_ns);
    W.cap.first_step = step;
    W.cap.last_step = step;
    W.cap.began = 1;
    send_window(KP_W_WINDOW_BEGIN);
    set_state(KP_ST_CAPTURING);
}

static void end_window(int64_t end_ns, int64_t grace_ms)
{
    W.cap.end_ns = end_ns;
    stop_recording();
    W.cap.flush_at = kp_mono_ns() + grace_ms * MS;
    set_state(KP_ST_FLUSHING);
}

static void finish_window(void)
{
    kpi_cupti_flush(0);
    kpi_cupti_flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    drain_cupti();
    drain_ranges();
    update_dropped();
    batches_flush();
    if (W.link != LINK_UP) {
        cap_fail("agent connection lost");
        return;
    }
    send_window(KP_W_WINDOW_END);
    atomic_fetch_add_explicit(&kpi_core.c.captures, 1, memory_order_relaxed);
    set_state(KP_ST_DONE);
    kpi_logl(KPI_LOG_INFO, "capture %llu done: steps %lld..%lld, %llu records, %llu dropped",
             (unsigned long long) W.cap.id, (long long) W.cap.first_step,
             (long long) W.cap.last_step, (unsigned long long) W.cap.records,
             (unsigned long long) (W.cap.dropped + W.cap.cupti_dropped));
}

static void reject_arm(const struct kp_wire_arm *a, const char *reason)
{
    struct kp_wire_status s;

    fill_status(&s);
    s.capture_id = a->capture_id;
    s.state = KP_ST_FAILED;
    s.records = s.dropped = s.cupti_dropped = s.incomplete = s.overhead_ns = 0;
    kp_strlcpy(s.reason, sizeof(s.reason), reason);
    enqueue(KP_W_STATUS, 0, &s, sizeof(s), 0);
}

static void on_arm(const struct kp_wire_arm *a)
{
    char why[KPI_REASON_CAP];
    int64_t cur;

    if (capture_active(W.cap.state)) {
        snprintf(why, sizeof(why),
                 "already capturing (capture %llu is %s); try again when it "
                 "is done",
                 (unsigned long long) W.cap.id, kp_wire_state_name(W.cap.state));
        reject_arm(a, why);
        return;
    }
    memset(&W.cap, 0, sizeof(W.cap));
    W.cap.id = a->capture_id;
    W.cap.run_id = a->run_id;
    W.cap.target_step = a->target_step;
    W.cap.n_steps = a->n_steps;
    W.cap.acts = a->activities != 0 ? a->activities : KP_ACT_DEFAULT;
    W.cap.duration_ms = a->duration_ms;
    W.cap.deadline_ns = a->deadline_ns;
    W.cap.first_step = -1;
    W.cap.last_step = -1;
    W.cap.prev_step = INT64_MIN;
    kpi_logl(KPI_LOG_INFO, "arm capture=%llu target_step=%lld steps=%u duration_ms=%llu",
             (unsigned long long) a->capture_id, (long long) a->target_step, a->n_steps,
             (unsigned long long) a->duration_ms);
    if (!kpi_cupti_usable()) {
        cap_fail("%s", kpi_core.cupti_error[0] != '\0' ? kpi_core.cupti_error
                                                       : "CUPTI is unavailable in this process");
        return;
    }
    if (a->deadline_ns != 0 && kpi_now_ns() > (int64_t) a->deadline_ns) {
        cap_fail("the capture's deadline passed before it reached this process");
        return;
    }
    if (a->target_step < 0) {
        if (start_recording() == 0) {
            begin_window(W.cap.warmup_ns, -1);
        }
        return;
    }
    /* Steps are forwarded from now on; read the step only after that, so none is missed. */
    atomic_store_explicit(&kpi_core.capture_live, 1, memory_order_release);
    cur = atomic_load_explicit(&kpi_core.current_step, memory_order_relaxed);
    if (cur >= a->target_step) {
        cap_fail("target step %lld already passed (current %lld); arm a later step",
                 (long long) a->target_step, (long long) cur);
        return;
    }
    W.cap.prev_step = cur;
    set_state(KP_ST_ARMED);
    if (cur == a->target_step - 1) {
        /* The warm-up step is running (or, with no step seen yet, target 0 is next). */
        if (start_recording() == 0) {
            set_state(KP_ST_WARMUP);
        }
    }
}

static void on_step(const struct kp_wire_step *ev)
{
    int64_t step = ev->step;

    if (step == W.cap.prev_step) {
        return; /* seen at arm time and again as an event */
    }
    W.cap.prev_step = step;
    switch (W.cap.state) {
    case KP_ST_ARMED:
        if (step > W.cap.target_step) {
            cap_fail("target step %lld was skipped (the step counter jumped to %lld)",
                     (long long) W.cap.target_step, (long long) step);
        }
        else if (step == W.cap.target_step) {
            /* No warm-up step was seen: begin without one. */
            if (start_recording() == 0) {
                begin_window(ev->start_ns, step);
                send_step(ev);
            }
        }
        else if (step == W.cap.target_step - 1) {
            if (start_recording() == 0) {
                set_state(KP_ST_WARMUP);
                send_step(ev);
            }
        }
        break;
    case KP_ST_WARMUP:
        if (step > W.cap.target_step) {
            cap_fail("target step %lld was skipped (the step counter jumped to %lld)",
                     (long long) W.cap.target_step, (long long) step);
        }
        else if (step == W.cap.target_step) {
            begin_window(ev->start_ns, step);
            send_step(ev);
        }
        else {
            send_step(ev);
        }
        break;
    case KP_ST_CAPTURING:
        if (W.cap.duration_ms != 0 &&
            ev->start_ns >= W.cap.begin_ns + (int64_t) W.cap.duration_ms * MS) {
            /* The duration ran out before this step began (the timer had not fired yet). */
            batches_flush();
            end_window(W.cap.begin_ns + (int64_t) W.cap.duration_ms * MS, KPI_GRACE_MS);
        }
        else if (W.cap.target_step >= 0 && W.cap.n_steps > 0 &&
                 step >= W.cap.target_step + (int64_t) W.cap.n_steps) {
            batches_flush();
            end_window(ev->start_ns, KPI_GRACE_MS);
        }
        else {
            send_step(ev);
            W.cap.last_step = step;
        }
        break;
    case KP_ST_FLUSHING:
        /* The window was ended (DISARM, the exit handler) in this loop turn before this
         * step's event was popped, but the step began before the end: it is inside the window
         * and its records are kept, so the agent needs its STEP or they would be counted in
         * the step before. The same bounds as CAPTURING apply; a bound that falls before the
         * end moves the end back to it. */
        if (ev->start_ns >= W.cap.end_ns) {
            break;
        }
        if (W.cap.duration_ms != 0 &&
            ev->start_ns >= W.cap.begin_ns + (int64_t) W.cap.duration_ms * MS) {
            W.cap.end_ns = W.cap.begin_ns + (int64_t) W.cap.duration_ms * MS;
        }
        else if (W.cap.target_step >= 0 && W.cap.n_steps > 0 &&
                 step >= W.cap.target_step + (int64_t) W.cap.n_steps) {
            W.cap.end_ns = ev->start_ns;
        }
        else {
            send_step(ev);
            W.cap.last_step = step;
        }
        break;
    default:
        break;
    }
}

static void on_disarm(const struct kp_wire_disarm *d)
{
    if (d->capture_id != W.cap.id) {
        return;
    }
    switch (W.cap.state) {
    case KP_ST_ARMED:
    case KP_ST_WARMUP:
        cap_fail("stopped by the agent before the window began");
        break;
    case KP_ST_CAPTURING:
        end_window(kpi_now_ns(), KPI_GRACE_MS);
        break;
    default:
        break;
    }
}

static void timers(int64_t now)
{
    uint32_t st = W.cap.state;

    if ((st == KP_ST_ARMED || st == KP_ST_WARMUP) && W.cap.deadline_ns != 0 &&
        kpi_now_ns() > (int64_t) W.cap.deadline_ns) {
        cap_fail("the window did not begin before its deadline (target step %lld, current "
                 "step %lld): is the step hook or a ProfilerStep# NVTX range reporting steps?",
                 (long long) W.cap.target_step,
                 (long long) atomic_load_explicit(&kpi_core.current_step, memory_order_relaxed));
        return;
    }
    if (st == KP_ST_CAPTURING && W.cap.duration_ms != 0 &&
        now - W.cap.begin_mono >= (int64_t) W.cap.duration_ms * MS) {
        batches_flush();
        end_window(W.cap.begin_ns + (int64_t) W.cap.duration_ms * MS, KPI_GRACE_MS);
        return;
    }
    if (st == KP_ST_FLUSHING && now >= W.cap.flush_at) {
        finish_window();
        return;
    }
    if ((st == KP_ST_WARMUP || st == KP_ST_CAPTURING) && now >= W.next_flush) {
        kpi_cupti_flush(0);
        update_dropped();
        W.next_flush = now + KPI_FLUSH_EVERY_MS * MS;
    }
    if (W.cap.recording) {
        kpi_cupti_pool_topup();
    }
}

/* ---- link ---- */

static void link_close(void)
{
    if (W.fd >= 0) {
        close(W.fd);
    }
    W.fd = -1;
    W.link = LINK_DOWN;
    atomic_store_explicit(&kpi_core.c.connected, 0, memory_order_relaxed);
    queue_clear();
    batches_clear();
    W.slen = 0;
    W.scount = 0;
}

static void schedule_connect(uint32_t ms)
{
    W.next_connect = kp_mono_ns() + (int64_t) ms * MS;
}

static void link_lost(const char *why)
{
    int was_up = W.link == LINK_UP;

    link_close();
    if (was_up) {
        kpi_logl(KPI_LOG_WARN, "lost the agent connection at %s (%s); reconnecting", W.sock_path,
                 why);
    }
    if (capture_active(W.cap.state)) {
        cap_fail("agent connection lost (%s)", why);
    }
    W.backoff_ms = KPI_BACKOFF_MIN_MS;
    schedule_connect(W.backoff_ms);
}

static int nvtx_is_ours(void)
{
    const char *env = getenv("NVTX_INJECTION64_PATH");
    char a[PATH_MAX], b[PATH_MAX];
    Dl_info info;

    if (env == NULL || *env == '\0' || dladdr((void *) nvtx_is_ours, &info) == 0 ||
        info.dli_fname == NULL) {
        return 0;
    }
    if (realpath(env, a) == NULL || realpath(info.dli_fname, b) == NULL) {
        return 0;
    }
    return strcmp(a, b) == 0;
}

static void send_hello(void)
{
    struct kp_wire_hello h;

    memset(&h, 0, sizeof(h));
    h.wire_version = KP_WIRE_VERSION;
    h.pid = kpi_core.pid;
    h.rank = kpi_core.rank;
    h.local_rank = kpi_core.local_rank;
    h.world_size = kpi_core.world_size;
    h.device = atomic_load_explicit(&kpi_core.device, memory_order_relaxed);
    h.cupti_version = kpi_core.cupti_version;
    if (atomic_load_explicit(&kpi_core.hook_present, memory_order_relaxed)) {
        h.flags |= KP_HELLO_STEP_HOOK;
    }
    if (W.nvtx_ours) {
        h.flags |= KP_HELLO_NVTX;
    }
    h.current_step = atomic_load_explicit(&kpi_core.current_step, memory_order_relaxed);
    h.start_time_ns = (uint64_t) kpi_core.start_ns;
    kp_strlcpy(h.job, sizeof(h.job), kpi_core.job);
    kp_strlcpy(h.host, sizeof(h.host), kpi_core.host);
    kp_strlcpy(h.cupti_error, sizeof(h.cupti_error), kpi_core.cupti_error);
    enqueue(KP_W_HELLO, 0, &h, sizeof(h), 0);
}

static void link_connect(void)
{
    struct sockaddr_un sa;
    int fd;

    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        goto fail;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, W.sock_path, strlen(W.sock_path));
    if (connect(fd, (struct sockaddr *) &sa, sizeof(sa)) != 0) {
        goto fail;
    }
    W.fd = fd;
    W.link = LINK_HELLO;
    W.hello_deadline = kp_mono_ns() + KPI_WELCOME_WAIT_MS * MS;
    W.strings_upto = 0;
    W.connect_logged = 0;
    kpi_intern_rewind(); /* the agent needs every string again */
    send_hello();
    kpi_logl(KPI_LOG_DEBUG, "connected to %s, waiting for WELCOME", W.sock_path);
    return;
fail:
    if (!W.connect_logged) {
        kpi_logl(KPI_LOG_INFO, "agent not reachable at %s (%s); retrying every %u s at most",
                 W.sock_path, strerror(errno), KPI_BACKOFF_MAX_MS / 1000);
        W.connect_logged = 1;
    }
    if (fd >= 0) {
        close(fd);
    }
    schedule_connect(W.backoff_ms);
    W.backoff_ms = W.backoff_ms * 2 > KPI_BACKOFF_MAX_MS ? KPI_BACKOFF_MAX_MS : W.backoff_ms * 2;
}

static void on_welcome(const struct kp_wire_welcome *w)
{
    char reason[sizeof(w->reason) + 1];

    if (W.link != LINK_HELLO) {
        return;
    }
    if (!w->accepted) {
        memcpy(reason, w->reason, sizeof(w->reason));
        reason[sizeof(w->reason)] = '\0';
        if (!W.refused_logged) {
            kpi_log("the agent at %s refused this process: %s", W.sock_path, reason);
            W.refused_logged = 1;
        }
        link_close();
        W.backoff_ms = KPI_BACKOFF_MAX_MS;
        schedule_connect(W.backoff_ms);
        return;
    }
    W.link = LINK_UP;
    W.refused_logged = 0;
    W.backoff_ms = KPI_BACKOFF_MIN_MS;
    atomic_store_explicit(&kpi_core.c.connected, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&kpi_core.c.agent_connects, 1, memory_order_relaxed);
    kpi_logl(KPI_LOG_INFO, "registered with the agent at %s (agent %llx)", W.sock_path,
             (unsigned long long) w->agent_id);
    send_status();
}

static void on_message(const unsigned char *msg, size_t n)
{
    static int unknown_logged;
    struct kp_wire_hdr h;
    const char *why = NULL;
    const unsigned char *p = msg + sizeof(h);

    if (kp_wire_check(msg, n, &why) != 0) {
        kpi_log("malformed message from the agent (%s): closing the connection", why);
        link_lost("malformed message");
        return;
    }
    memcpy(&h, msg, sizeof(h));
    switch (h.type) {
    case KP_W_WELCOME: {
        struct kp_wire_welcome w;
        memcpy(&w, p, sizeof(w));
        on_welcome(&w);
        break;
    }
    case KP_W_ARM: {
        struct kp_wire_arm a;
        memcpy(&a, p, sizeof(a));
        if (W.link == LINK_UP) {
            on_arm(&a);
        }
        break;
    }
    case KP_W_DISARM: {
        struct kp_wire_disarm d;
        memcpy(&d, p, sizeof(d));
        on_disarm(&d);
        break;
    }
    default:
        if (!unknown_logged) {
            kpi_logl(KPI_LOG_INFO, "ignoring message type %u from the agent", h.type);
            unknown_logged = 1;
        }
        break;
    }
}

static void link_read(void)
{
    while (W.fd >= 0) {
        ssize_t n = recv(W.fd, W.rbuf, sizeof(W.rbuf), MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                link_lost(strerror(errno));
            }
            return;
        }
        if (n == 0) {
            link_lost(W.link == LINK_UP ? "the agent closed the connection"
                                        : "closed before WELCOME");
            return;
        }
        on_message(W.rbuf, (size_t) n);
    }
}

/* ---- the loop ---- */

static void handle_stop(int64_t now)
{
    int64_t left_ms = (W.stop_deadline - now) / MS;
    int64_t grace = left_ms / 4 < KPI_GRACE_MS ? left_ms / 4 : KPI_GRACE_MS;

    W.stopping = 1;
    if (grace < 0) {
        grace = 0;
    }
    switch (W.cap.state) {
    case KP_ST_ARMED:
    case KP_ST_WARMUP:
        cap_fail("the process exited before the window began");
        break;
    case KP_ST_CAPTURING:
        batches_flush();
        end_window(kpi_now_ns(), grace);
        break;
    case KP_ST_FLUSHING:
        if (W.cap.flush_at > now + grace * MS) {
            W.cap.flush_at = now + grace * MS;
        }
        break;
    default:
        break;
    }
}

static int poll_timeout_ms(int64_t now)
{
    int64_t t = KPI_TICK_MS * MS;

    if (W.cap.state == KP_ST_FLUSHING && W.cap.flush_at - now < t) {
        t = W.cap.flush_at - now;
    }
    if (W.cap.recording && W.next_flush - now < t) {
        t = W.next_flush - now;
    }
    if (W.cap.state == KP_ST_CAPTURING && W.cap.duration_ms != 0 &&
        W.cap.begin_mono + (int64_t) W.cap.duration_ms * MS - now < t) {
        t = W.cap.begin_mono + (int64_t) W.cap.duration_ms * MS - now;
    }
    if (W.link == LINK_DOWN && W.next_connect - now < t) {
        t = W.next_connect - now;
    }
    if (t < 0) {
        t = 0;
    }
    return (int) ((t + MS - 1) / MS);
}

static void *worker_main(void *arg)
{
    struct kp_wire_step ev;

    (void) arg;
    W.nvtx_ours = nvtx_is_ours();
    for (;;) {
        struct pollfd pfd[2];
        int64_t now = kp_mono_ns();
        nfds_t n = 1;

        if (atomic_load_explicit(&W.stop, memory_order_acquire)) {
            if (!W.stopping) {
                handle_stop(now);
            }
            if ((!capture_active(W.cap.state) && (W.qhead == NULL || W.link != LINK_UP)) ||
                now >= W.stop_deadline) {
                break;
            }
        }
        if (W.link == LINK_DOWN && now >= W.next_connect && !W.stopping) {
            link_connect();
        }
        if (W.link == LINK_HELLO && now >= W.hello_deadline) {
            link_close();
            kpi_logl(KPI_LOG_INFO, "no WELCOME from the agent at %s within %d s; retrying",
                     W.sock_path, KPI_WELCOME_WAIT_MS / 1000);
            schedule_connect(W.backoff_ms);
        }

        pfd[0].fd = W.evfd;
        pfd[0].events = POLLIN;
        pfd[0].revents = 0;
        if (W.fd >= 0) {
            pfd[1].fd = W.fd;
            pfd[1].events = POLLIN | (W.qhead != NULL ? POLLOUT : 0);
            pfd[1].revents = 0;
            n = 2;
        }
        if (poll(pfd, n, poll_timeout_ms(now)) > 0) {
            if (pfd[0].revents & POLLIN) {
                uint64_t v;
                if (read(W.evfd, &v, sizeof(v)) < 0) {
                    /* EAGAIN: another wake-up already consumed it */
                }
            }
            if (n == 2 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) {
                link_read();
            }
        }
        now = kp_mono_ns();
        while (kpi_steps_pop(&ev)) {
            on_step(&ev);
        }
        timers(now);
        drain_ranges();
        drain_cupti();
        if (W.link == LINK_UP) {
            batches_flush();
        }
        /* Heartbeats once a second, and sooner (at most every KPI_STATUS_STEP_MS) when the
         * step moved: the agent picks a capture's common start step from these reports. */
        if (W.link == LINK_UP && (now >= W.next_status ||
                                  (now - W.status_at >= KPI_STATUS_STEP_MS * MS &&
                                   atomic_load_explicit(&kpi_core.current_step,
                                                        memory_order_relaxed) != W.status_step))) {
            send_status();
        }
        queue_send();
        if (W.kill_reason != NULL) {
            const char *why = W.kill_reason;
            W.kill_reason = NULL;
            link_lost(why);
        }
    }
    if (W.fd >= 0) {
        queue_send();
        link_close();
    }
    return NULL;
}

int kpi_worker_start(void)
{
    const char *path = getenv("KPROF_AGENT_SOCKET");
    sigset_t all, old;
    int rc;

    if (path == NULL || *path == '\0') {
        path = KP_WIRE_DEFAULT_SOCKET;
    }
    if (strlen(path) >= sizeof(W.sock_path)) {
        kpi_log("KPROF_AGENT_SOCKET is longer than %zu bytes: using %s", sizeof(W.sock_path) - 1,
                KP_WIRE_DEFAULT_SOCKET);
        path = KP_WIRE_DEFAULT_SOCKET;
    }
    kp_strlcpy(W.sock_path, sizeof(W.sock_path), path);
    W.qlimit = (size_t) kpi_env_size("KPROF_QUEUE_BYTES", KPI_DEF_QUEUE_BYTES,
                                     4u * KPI_QUEUE_RESERVE, 4ull << 30);
    W.backoff_ms = KPI_BACKOFF_MIN_MS;
    W.cap.first_step = -1;
    W.cap.last_step = -1;
    W.evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (W.evfd < 0) {
        return -errno;
    }
    atomic_store_explicit(&kpi_core.wake_fd, W.evfd, memory_order_release);
    /* The worker takes no signals: they belong to the application's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&W.thr, NULL, worker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        atomic_store_explicit(&kpi_core.wake_fd, -1, memory_order_release);
        close(W.evfd);
        W.evfd = -1;
        return -rc;
    }
    pthread_setname_np(W.thr, "kprof-worker");
    W.started = 1;
    return 0;
}

void kpi_worker_stop(uint32_t budget_ms)
{
    struct timespec ts;
    int rc;

    if (!W.started) {
        return;
    }
    W.stop_deadline = kp_mono_ns() + (int64_t) budget_ms * MS;
    atomic_store_explicit(&W.stop, 1, memory_order_release);
    kpi_wake();
    ts = kp_real_deadline((long long) budget_ms + 200);
    rc = pthread_timedjoin_np(W.thr, NULL, &ts);
    if (rc != 0) {
        kpi_log("the worker did not finish within %u ms at exit; leaving it", budget_ms);
        return;
    }
    W.started = 0;
}

void kpi_worker_forget(void)
{
    /* Forked child: the thread does not exist here; the sockets are the parent's. */
    atomic_store_explicit(&kpi_core.wake_fd, -1, memory_order_relaxed);
    if (W.fd >= 0) {
        close(W.fd);
        W.fd = -1;
    }
    if (W.evfd >= 0) {
        close(W.evfd);
        W.evfd = -1;
    }
    W.started = 0;
    W.link = LINK_DOWN;
}
