/*
 * nvtx.c: the NVTX injection (InitializeInjectionNvtx2) and its handlers.
 *
 * DESIGN
 * NVTX3 is header-only: every DSO that embeds it (libtorch, NCCL, extensions) has its own
 * hidden function table and calls InitializeInjectionNvtx2 once, at its first NVTX call. Each
 * call installs the same handlers into that instance's CORE and CORE2 tables. Global state
 * (name table, range ring, domain table, step prefix) is set up once behind pthread_once.
 *
 * Per-thread state (__thread, zeroed for every thread): a pool of KP_NVTX_FRAMES frames shared
 * by all domains, and per domain the index of its top frame, its depth and an overflow count.
 * A frame links to the frame below it in the same domain, so domains may interleave freely;
 * popped frames return to a free list. Pushes past the pool are only counted (overflow), and
 * a frame pushed above overflowed pushes saves the count so each domain stays LIFO.
 *
 * Dormant (kpi_recording() == 0): a push takes a frame with no id, no name and no time; the
 * only extra work is a prefix compare for the step range name. Recording: a push takes a
 * process-unique range id, parses the message (PyTorch emit_nvtx format), stamps the start
 * and pushes the id to CUPTI's CUSTOM2 external correlation stack; its pop emits a
 * struct kp_wire_range into the range ring and pops CUPTI. A frame pushed while dormant and
 * popped while recording is emitted with KP_RANGE_PRE_WINDOW (start = recording start, or the
 * step time for a step range) and is never popped from CUPTI. A frame pushed while recording
 * always pops CUPTI (keeps CUPTI's stack balanced) and is emitted at its pop even after the
 * window ended, unless it was already emitted as KP_RANGE_UNCLOSED: when recording stops,
 * each thread notices at its next NVTX call (the stop counter changed) and emits its frames
 * still open from before the stop with KP_RANGE_UNCLOSED and end = stop time.
 *
 * RangeStart/End ranges are not stack-scoped: while recording they get an id, are kept in a
 * small lock-free table (id -> start, name, domain, tid) and are emitted at RangeEnd with
 * parent 0; never pushed to CUPTI. Marks are emitted as zero-length ranges while recording.
 *
 * Hot path: no locks, no malloc (beyond glibc's one-time TLS block per thread), no syscalls
 * but clock_gettime through kpi_now_ns. After fork (kpi_forked_flag) only depth is tracked.
 */
#include "kpi.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The unit test compiles this file without the CUDA include dir (KPI_NVTX_TEST): the NVTX
 * wrappers and InitializeInjectionNvtx2 are then left out and it drives the kp__nvtx_*
 * functions directly. The library itself must see the real headers. */
#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#define KPI_HAVE_NVTX 1
#endif
#endif
#if !defined(KPI_HAVE_NVTX) && !defined(KPI_NVTX_TEST)
#error "nvtx3/nvToolsExt.h not found: add KP_NVTX_INCLUDE_DIR to the include path"
#endif
#ifdef KPI_HAVE_NVTX
#include <nvtx3/nvToolsExt.h> /* brings nvtxDetail/nvtxTypes.h: the callback table types */
#else
/* Test build: the handlers the NVTX wrappers would reach are driven directly. */
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

#define KP_NVTX_FRAMES      128 /* frames per thread, all domains together */
#define KP_NVTX_MAX_DOMAINS 64  /* domain 0 = default; the last slot takes any excess */
#define KP_NVTX_ASYNC_SLOTS 1024
#define KP_NVTX_ASYNC_PROBE 16
#define KP_NVTX_REG_SLOTS   4096
#define KP_NVTX_PREFIX_MAX  128
#define KP_NVTX_DEF_STEP    "ProfilerStep#"
#define KP_NVTX_KPROF_DOM   "kprof"
#define KP_NVTX_MSG_MAX     16384 /* bytes of a message looked at (names cap at 4096) */
#define KP__LEN_UNKNOWN     SIZE_MAX

/* kprof.v1.OpKind values used here. */
#define KP_KIND_CPU_OP        1u
#define KP_KIND_NVTX          5u
#define KP_KIND_PROFILER_STEP 6u

/* NVTX message types (nvtxMessageType_t), restated for the header-less test build. */
#define KP_MSG_ASCII      1
#define KP_MSG_REGISTERED 3

enum kp__frame_flag {
    KP_F_REC = 1u << 0,     /* pushed while recording: has id, name, start */
    KP_F_CUPTI = 1u << 1,   /* its id was pushed to CUPTI: pop it */
    KP_F_EMITTED = 1u << 2, /* already emitted (KP_RANGE_UNCLOSED): do not emit at pop */
};

struct kp__frame {
    uint64_t id;        /* range id, 0 until needed (frames pushed while dormant) */
    uint64_t parent;    /* KP_F_REC frames: parent id computed at push */
    uint64_t stops;     /* g_nvtx.stops at push: a later stop makes the frame UNCLOSED */
    int64_t start_ns;   /* 0 when pushed dormant (except step ranges) */
    int64_t seq, op_id; /* -1 if none */
    int64_t step;       /* step number of a step range, else -1 */
    uint32_t name, shapes;
    uint32_t saved_overflow; /* the domain's overflow count below this frame */
    uint8_t kind;
    uint8_t flags;  /* enum kp__frame_flag */
    uint8_t domain; /* domain slot */
    uint8_t prev;   /* in use: frame below in its domain (index + 1, 0 none); free: next free */
};

struct kp__tls {
    uint64_t seen_stops;                    /* g_nvtx.stops this thread has caught up with */
    uint8_t free_head;                      /* index + 1 of the first free frame, 0 none */
    uint8_t used;                           /* frames never used yet start at this index */
    uint8_t top[KP_NVTX_MAX_DOMAINS];       /* index + 1 of the top frame, 0 none */
    uint32_t depth[KP_NVTX_MAX_DOMAINS];    /* open pushes, frames and overflow */
    uint32_t overflow[KP_NVTX_MAX_DOMAINS]; /* open pushes above the top frame, frameless */
    struct kp__frame frames[KP_NVTX_FRAMES];
};

/* The parsed message of a range or mark. */
struct kp__msg {
    uint32_t name, shapes;
    int64_t seq, op_id;
    int64_t step; /* step range: N, else -1 */
    uint32_t kind;
};

/* A string registered with nvtxDomainRegisterStringA: parsed once. */
struct kp__reg {
    struct kp__msg msg;
};

struct kp__domain {
    _Atomic uint32_t name; /* interned name id; 0 = free slot (slot 0: the default domain) */
};

struct kp__async {
    _Atomic uint64_t key; /* range id; 0 free; KP__ASYNC_BUSY being written */
    int64_t start_ns;
    uint64_t tid;
    uint32_t name, domain;
};
#define KP__ASYNC_BUSY UINT64_MAX

static struct {
    pthread_once_t once;
    char step_prefix[KP_NVTX_PREFIX_MAX];
    size_t step_prefix_len;
    uint32_t kprof_name;      /* id of "kprof", the domain whose "step N" marks report steps */
    _Atomic uint64_t next_id; /* range ids; the first is 1 */
    _Atomic uint64_t stops;   /* recording stops so far (release; pairs with stop_ns) */
    _Atomic int64_t stop_ns;  /* time of the last stop */
    _Atomic int64_t start_ns; /* time of the last start */
    _Atomic unsigned instances;
    _Atomic uint64_t unicode_ignored, overflow_pushes, bad_pops, async_dropped;
    struct kp__domain domains[KP_NVTX_MAX_DOMAINS];
    struct kp__async async[KP_NVTX_ASYNC_SLOTS];
    _Atomic uint32_t nreg;
    struct kp__reg regs[KP_NVTX_REG_SLOTS];
} g_nvtx = { .once = PTHREAD_ONCE_INIT };

struct kpi_nvtx_counters kpi_nvtx_counters;

static __thread struct kp__tls kp__t;

/* ---- setup ---- */

static void kp__nvtx_init_once(void)
{
    const char *p = getenv("KPROF_STEP_RANGE");

    if (p == NULL || *p == '\0') {
        p = KP_NVTX_DEF_STEP;
    }
    snprintf(g_nvtx.step_prefix, sizeof(g_nvtx.step_prefix), "%s", p);
    g_nvtx.step_prefix_len = strlen(g_nvtx.step_prefix);
    atomic_store(&g_nvtx.next_id, 1);
    kpi_intern_init();
    kpi_ranges_init();
    g_nvtx.kprof_name = kpi_intern(KP_NVTX_KPROF_DOM, sizeof(KP_NVTX_KPROF_DOM) - 1);
}

static void kp__nvtx_init(void)
{
    pthread_once(&g_nvtx.once, kp__nvtx_init_once);
}

void kpi_nvtx_recording_changed(int recording)
{
    int64_t now = kpi_now_ns();

    kp__nvtx_init();
    if (recording) {
        atomic_store_explicit(&g_nvtx.start_ns, now, memory_order_relaxed);
        /* RangeStart ranges of earlier windows that never ended would fill the table: forget
         * them (an end racing with this finds its slot gone and records nothing). */
        for (unsigned i = 0; i < KP_NVTX_ASYNC_SLOTS; i++) {
            uint64_t key = atomic_load_explicit(&g_nvtx.async[i].key, memory_order_relaxed);

            if (key != 0 && key != KP__ASYNC_BUSY) {
                atomic_compare_exchange_strong_explicit(&g_nvtx.async[i].key, &key, 0,
                                                        memory_order_relaxed, memory_order_relaxed);
            }
        }
        return;
    }
    atomic_store_explicit(&g_nvtx.stop_ns, now, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_nvtx.stops, 1, memory_order_release);
}

/* ---- message parsing ---- */

/* Parses an optional '-' and decimal digits at s[0..len); -1 if there are none. */
static int64_t kp__parse_int(const char *s, size_t len, size_t *used)
{
    size_t i = 0;
    int neg = 0;
    int64_t v = 0;

    if (i < len && s[i] == '-') {
        neg = 1;
        i++;
    }
    if (i >= len || s[i] < '0' || s[i] > '9') {
        *used = 0;
        return -1;
    }
    for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
        if (v < INT64_MAX / 10 - 10) {
            v = v * 10 + (s[i] - '0');
        }
    }
    *used = i;
    return neg ? -v : v;
}

/* The step number if s starts with the step prefix and a number, else -1. s is NUL-terminated;
 * len may be KP__LEN_UNKNOWN (the dormant path never measures the message). */
static int64_t kp__step_of(const char *s, size_t len)
{
    size_t plen = g_nvtx.step_prefix_len;
    size_t used;
    int64_t n;

    if (plen == 0 || s[0] != g_nvtx.step_prefix[0] || (len != KP__LEN_UNKNOWN && len <= plen) ||
        strncmp(s, g_nvtx.step_prefix, plen) != 0) {
        return -1;
    }
    n = kp__parse_int(s + plen, len - plen, &used);
    return used > 0 && n >= 0 ? n : -1;
}

static int kp__starts(const char *s, size_t len, const char *lit, size_t litlen)
{
    return len >= litlen && memcmp(s, lit, litlen) == 0;
}
#define KP__STARTS(s, len, lit) kp__starts((s), (len), lit, sizeof(lit) - 1)

/* Length of the bracketed text at s ("[[1, 2], [3]]"), or up to the next ", " if s does not
 * start with '['. */
static size_t kp__shapes_len(const char *s, size_t len)
{
    int depth = 0;

    if (len == 0 || s[0] != '[') {
        for (size_t i = 0; i + 1 < len; i++) {
            if (s[i] == ',' && s[i + 1] == ' ') {
                return i;
            }
        }
        return len;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '[') {
            depth++;
        }
        else if (s[i] == ']' && --depth == 0) {
            return i + 1;
        }
    }
    return len; /* unbalanced (truncated message): keep what is there */
}

/*
 * Parses a range message. PyTorch's emit_nvtx (getNvtxStr) writes
 *   <op>[, seq = N][, op_id = N][, sizes = [[...]]][, input_op_ids = [...]]
 * and name is <op>, shapes the sizes text. Interns name and shapes.
 */
static void kp__parse(const char *s, size_t len, struct kp__msg *m)
{
    size_t name_end = len;
    size_t used, n;
    const char *r;
    size_t rlen;
    int is_op = 0;

    m->seq = -1;
    m->op_id = -1;
    m->shapes = 0;
    m->step = kp__step_of(s, len);
    for (const char *c = memchr(s, ',', len); c != NULL;
         c = memchr(c + 1, ',', len - (size_t) (c + 1 - s))) {
        r = c + 2;
        if ((size_t) (r - s) > len || c[1] != ' ') {
            continue;
        }
        rlen = len - (size_t) (r - s);
        if (KP__STARTS(r, rlen, "seq = ")) {
            m->seq = kp__parse_int(r + 6, rlen - 6, &used);
            is_op = 1;
        }
        else if (KP__STARTS(r, rlen, "op_id = ")) {
            m->op_id = kp__parse_int(r + 8, rlen - 8, &used);
            is_op = 1;
        }
        else if (KP__STARTS(r, rlen, "sizes = ")) {
            n = kp__shapes_len(r + 8, rlen - 8);
            m->shapes = kpi_intern(r + 8, n);
        }
        else if (!KP__STARTS(r, rlen, "input_op_ids = ")) {
            continue;
        }
        if (name_end == len) {
            name_end = (size_t) (c - s);
        }
    }
    m->name = kpi_intern(s, name_end);
    if (m->step >= 0) {
        m->kind = KP_KIND_PROFILER_STEP;
    }
    else {
        m->kind = is_op ? KP_KIND_CPU_OP : KP_KIND_NVTX;
    }
}

/*
 * A message as NVTX hands it over: ASCII text (NUL-terminated) or a registered string handle.
 * Anything else (unicode, none) carries no text.
 */
struct kp__in {
    const char *s;             /* ASCII text, NUL-terminated, NULL if none */
    size_t len;                /* KP__LEN_UNKNOWN until measured */
    const struct kp__reg *reg; /* registered string, NULL if none */
};

static void kp__in_ascii(struct kp__in *in, const char *s)
{
    in->s = s;
    in->len = KP__LEN_UNKNOWN;
    in->reg = NULL;
}

/* type: nvtxMessageType_t; ptr: the message union's value. */
static void kp__in_attr(struct kp__in *in, int32_t type, const void *ptr)
{
    in->s = NULL;
    in->len = 0;
    in->reg = NULL;
    if (ptr == NULL) {
        return;
    }
    if (type == KP_MSG_ASCII) {
        kp__in_ascii(in, ptr);
    }
    else if (type == KP_MSG_REGISTERED) {
        /* Handles we gave out point into g_nvtx.regs; anything else is ignored. */
        if ((const char *) ptr >= (const char *) g_nvtx.regs &&
            (const char *) ptr < (const char *) (g_nvtx.regs + KP_NVTX_REG_SLOTS)) {
            in->reg = ptr;
        }
    }
    else {
        atomic_fetch_add_explicit(&g_nvtx.unicode_ignored, 1, memory_order_relaxed);
    }
}

/* Step number of a message without parsing the rest (the dormant path). */
static int64_t kp__in_step(const struct kp__in *in)
{
    if (in->reg != NULL) {
        return in->reg->msg.step;
    }
    return in->s != NULL ? kp__step_of(in->s, in->len) : -1;
}

static void kp__in_parse(const struct kp__in *in, struct kp__msg *m)
{
    size_t len = 0;

    if (in->s != NULL) {
        len = in->len != KP__LEN_UNKNOWN ? in->len : strnlen(in->s, KP_NVTX_MSG_MAX);
    }
    if (in->reg != NULL) {
        *m = in->reg->msg;
    }
    else if (len > 0) {
        kp__parse(in->s, len, m);
    }
    else {
        memset(m, 0, sizeof(*m));
        m->seq = m->op_id = m->step = -1;
        m->kind = KP_KIND_NVTX;
    }
}

/* ---- domains and registered strings (rare calls) ---- */

/* Returns the slot of a domain name (creating it), or the last slot when the table is full. */
static unsigned kp__domain_create(const char *name)
{
    uint32_t id, cur;
    size_t len = name != NULL ? strlen(name) : 0;

    kp__nvtx_init();
    id = kpi_intern(name, len);
    if (id == 0) {
        return 0; /* an unnamed domain is reported as the default one */
    }
    for (unsigned i = 1; i < KP_NVTX_MAX_DOMAINS; i++) {
        cur = atomic_load_explicit(&g_nvtx.domains[i].name, memory_order_acquire);
        if (cur == 0) {
            if (!atomic_compare_exchange_strong_explicit(&g_nvtx.domains[i].name, &cur, id,
                                                         memory_order_acq_rel,
                                                         memory_order_acquire)) {
                if (cur == id) {
                    return i;
                }
                continue;
            }
            return i;
        }
        if (cur == id) {
            return i;
        }
    }
    return KP_NVTX_MAX_DOMAINS - 1;
}

static int kp__domain_is_kprof(unsigned d)
{
    return d != 0 && g_nvtx.kprof_name != 0 &&
           atomic_load_explicit(&g_nvtx.domains[d].name, memory_order_relaxed) == g_nvtx.kprof_name;
}

/* Parses and keeps a registered string; NULL when the table is full (then it has no text). */
static const struct kp__reg *kp__register_string(const char *s)
{
    uint32_t i;
    struct kp__reg *r;

    kp__nvtx_init();
    i = atomic_fetch_add_explicit(&g_nvtx.nreg, 1, memory_order_relaxed);
    if (i >= KP_NVTX_REG_SLOTS || s == NULL) {
        return NULL;
    }
    r = &g_nvtx.regs[i];
    kp__parse(s, strlen(s), &r->msg);
    /* The handle is only used after this call returns (the caller's thread publishes it). */
    return r;
}

/* ---- per-thread stacks ---- */

static void kp__emit(const struct kp__frame *f, uint64_t id, uint64_t parent, int64_t end_ns,
                     uint32_t flags)
{
    struct kp_wire_range r;

    memset(&r, 0, sizeof(r));
    r.start_ns = f->start_ns;
    r.end_ns = end_ns;
    r.range_id = id;
    r.parent_id = parent;
    r.tid = kpi_tid();
    r.seq = f->seq;
    r.op_id = f->op_id;
    r.name = f->name;
    r.domain = f->domain == 0
                   ? 0
                   : atomic_load_explicit(&g_nvtx.domains[f->domain].name, memory_order_relaxed);
    r.shapes = f->shapes;
    r.kind = f->kind;
    r.flags = flags;
    kpi_ranges_push(&r);
}

static uint64_t kp__new_id(void)
{
    return atomic_fetch_add_explicit(&g_nvtx.next_id, 1, memory_order_relaxed);
}

/* The id of frame index+1 `ref` (0: none), assigned now if it has none yet. */
static uint64_t kp__frame_id(struct kp__tls *t, uint8_t ref)
{
    struct kp__frame *f;

    if (ref == 0) {
        return 0;
    }
    f = &t->frames[ref - 1];
    if (f->id == 0) {
        f->id = kp__new_id();
    }
    return f->id;
}

/* Emits the frames still open from before a recording stop as KP_RANGE_UNCLOSED. */
static void kp__catch_up(struct kp__tls *t)
{
    uint64_t stops = atomic_load_explicit(&g_nvtx.stops, memory_order_acquire);
    int64_t stop_ns;

    if (stops == t->seen_stops) {
        return;
    }
    t->seen_stops = stops;
    stop_ns = atomic_load_explicit(&g_nvtx.stop_ns, memory_order_relaxed);
    for (unsigned d = 0; d < KP_NVTX_MAX_DOMAINS; d++) {
        for (uint8_t ref = t->top[d]; ref != 0; ref = t->frames[ref - 1].prev) {
            struct kp__frame *f = &t->frames[ref - 1];

            if ((f->flags & (KP_F_REC | KP_F_EMITTED)) == KP_F_REC && f->stops < stops) {
                kp__emit(f, f->id, f->parent, stop_ns, KP_RANGE_UNCLOSED);
                f->flags |= KP_F_EMITTED;
            }
        }
    }
}

static int kp__push(unsigned d, const struct kp__in *in)
{
    struct kp__tls *t = &kp__t;
    struct kp__frame *f;
    uint8_t ref;
    int64_t step, now = 0;
    int forked = atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed);
    int rec = !forked && kpi_recording();
    struct kp__msg m;

    if (d >= KP_NVTX_MAX_DOMAINS) {
        d = 0;
    }
    if (!forked) {
        kp__catch_up(t);
    }
    step = forked ? -1 : kp__in_step(in);
    if (step >= 0) {
        now = kpi_now_ns();
        kpi_step_event(step, now, KP_STEP_NVTX_RANGE);
    }
    /* Take a frame: the free list, then never-used ones; none left: depth only. */
    if (t->free_head != 0) {
        ref = t->free_head;
        t->free_head = t->frames[ref - 1].prev;
    }
    else if (t->used < KP_NVTX_FRAMES) {
        ref = ++t->used;
    }
    else {
        t->overflow[d]++;
        atomic_fetch_add_explicit(&g_nvtx.overflow_pushes, 1, memory_order_relaxed);
        return (int) t->depth[d]++;
    }
    f = &t->frames[ref - 1];
    f->domain = (uint8_t) d;
    f->prev = t->top[d];
    f->saved_overflow = t->overflow[d];
    t->overflow[d] = 0;
    t->top[d] = ref;
    f->flags = 0;
    f->id = 0;
    f->step = step;
    f->start_ns = now; /* dormant: the step time of a step range, else 0 */
    if (rec) {
        kp__in_parse(in, &m);
        f->id = kp__new_id();
        f->parent = kp__frame_id(t, f->prev);
        f->stops = atomic_load_explicit(&g_nvtx.stops, memory_order_acquire);
        f->name = m.name;
        f->shapes = m.shapes;
        f->seq = m.seq;
        f->op_id = m.op_id;
        f->kind = (uint8_t) m.kind;
        f->flags = KP_F_REC | KP_F_CUPTI;
        f->start_ns = now != 0 ? now : kpi_now_ns();
        kpi_cupti_push_ext(f->id);
    }
    else {
        f->kind = step >= 0 ? KP_KIND_PROFILER_STEP : KP_KIND_NVTX;
    }
    return (int) t->depth[d]++;
}

/* The name of a step range pushed while dormant, rebuilt from the prefix and its number. */
static uint32_t kp__step_name(int64_t step)
{
    char buf[KP_NVTX_PREFIX_MAX + 24];
    int n = snprintf(buf, sizeof(buf), "%s%lld", g_nvtx.step_prefix, (long long) step);

    return n > 0 ? kpi_intern(buf, (size_t) n < sizeof(buf) ? (size_t) n : sizeof(buf) - 1) : 0;
}

static int kp__pop(unsigned d)
{
    struct kp__tls *t = &kp__t;
    struct kp__frame *f;
    uint8_t ref;
    int forked = atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed);
    int64_t now;
    int64_t start;

    if (d >= KP_NVTX_MAX_DOMAINS) {
        d = 0;
    }
    if (t->depth[d] == 0) {
        atomic_fetch_add_explicit(&g_nvtx.bad_pops, 1, memory_order_relaxed);
        return -1; /* more pops than pushes in this domain on this thread */
    }
    t->depth[d]--;
    if (t->overflow[d] > 0) {
        t->overflow[d]--;
        return (int) t->depth[d];
    }
    ref = t->top[d];
    f = &t->frames[ref - 1];
    t->top[d] = f->prev;
    t->overflow[d] = f->saved_overflow;
    if (!forked) {
        if (f->flags & KP_F_REC) {
            if (!(f->flags & KP_F_EMITTED)) {
                kp__emit(f, f->id, f->parent, kpi_now_ns(), 0);
            }
        }
        else if (kpi_recording()) {
            /* Pushed before recording began: the record says so (and CUPTI never saw it). */
            now = kpi_now_ns();
            start = f->start_ns;
            if (start == 0) {
                start = atomic_load_explicit(&g_nvtx.start_ns, memory_order_relaxed);
            }
            f->start_ns = start < now ? start : now;
            f->name = f->step >= 0 ? kp__step_name(f->step) : 0;
            f->shapes = 0;
            f->seq = f->op_id = -1;
            kp__emit(f, kp__frame_id(t, ref), kp__frame_id(t, f->prev), now, KP_RANGE_PRE_WINDOW);
        }
        if (f->flags & KP_F_CUPTI) {
            kpi_cupti_pop_ext();
        }
        kp__catch_up(t);
    }
    f->prev = t->free_head;
    t->free_head = ref;
    return (int) t->depth[d];
}

static void kp__mark(unsigned d, const struct kp__in *in)
{
    struct kp__tls *t = &kp__t;
    struct kp__frame f;
    struct kp__msg m;
    int64_t now;
    size_t used;
    int64_t n;

    if (d >= KP_NVTX_MAX_DOMAINS) {
        d = 0;
    }
    if (atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed)) {
        return;
    }
    if (in->s != NULL && kp__domain_is_kprof(d) && strncmp(in->s, "step ", 5) == 0) {
        n = kp__parse_int(in->s + 5, KP_NVTX_MSG_MAX, &used);
        if (used > 0 && n >= 0) {
            kpi_step_event(n, kpi_now_ns(), KP_STEP_NVTX_MARK);
        }
    }
    if (!kpi_recording()) {
        return;
    }
    kp__catch_up(t);
    kp__in_parse(in, &m);
    now = kpi_now_ns();
    memset(&f, 0, sizeof(f));
    f.start_ns = now;
    f.seq = m.seq;
    f.op_id = m.op_id;
    f.name = m.name;
    f.shapes = m.shapes;
    f.kind = (uint8_t) (m.kind == KP_KIND_PROFILER_STEP ? KP_KIND_NVTX : m.kind);
    f.domain = (uint8_t) d;
    kp__emit(&f, kp__new_id(), kp__frame_id(t, t->top[d]), now, 0);
}

/* ---- RangeStart / RangeEnd ---- */

static uint64_t kp__range_start(unsigned d, const struct kp__in *in)
{
    struct kp__msg m;
    uint64_t id, zero;
    struct kp__async *a;

    if (d >= KP_NVTX_MAX_DOMAINS) {
        d = 0;
    }
    if (atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed) || !kpi_recording()) {
        return 0;
    }
    kp__in_parse(in, &m);
    id = kp__new_id();
    for (unsigned i = 0; i < KP_NVTX_ASYNC_PROBE; i++) {
        a = &g_nvtx.async[(id + i) & (KP_NVTX_ASYNC_SLOTS - 1)];
        zero = 0;
        if (atomic_compare_exchange_strong_explicit(&a->key, &zero, KP__ASYNC_BUSY,
                                                    memory_order_acquire, memory_order_relaxed)) {
            a->start_ns = kpi_now_ns();
            a->tid = kpi_tid();
            a->name = m.name;
            a->domain =
                d == 0 ? 0 : atomic_load_explicit(&g_nvtx.domains[d].name, memory_order_relaxed);
            atomic_store_explicit(&a->key, id, memory_order_release);
            return id;
        }
    }
    /* Too many ranges open at once: this one is not recorded. */
    atomic_fetch_add_explicit(&g_nvtx.async_dropped, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&kpi_nvtx_counters.ranges_dropped, 1, memory_order_relaxed);
    return id;
}

static void kp__range_end(uint64_t id)
{
    struct kp__async *a;
    struct kp_wire_range r;
    uint64_t key;

    if (id == 0 || id == KP__ASYNC_BUSY ||
        atomic_load_explicit(&kpi_forked_flag, memory_order_relaxed)) {
        return;
    }
    for (unsigned i = 0; i < KP_NVTX_ASYNC_PROBE; i++) {
        a = &g_nvtx.async[(id + i) & (KP_NVTX_ASYNC_SLOTS - 1)];
        key = atomic_load_explicit(&a->key, memory_order_acquire);
        if (key != id) {
            continue;
        }
        memset(&r, 0, sizeof(r));
        r.start_ns = a->start_ns;
        r.end_ns = kpi_now_ns();
        r.range_id = id;
        r.tid = a->tid;
        r.seq = -1;
        r.op_id = -1;
        r.name = a->name;
        r.domain = a->domain;
        r.kind = KP_KIND_NVTX;
        /* One RangeEnd per id: only the caller that wins the slot back emits. */
        if (atomic_compare_exchange_strong_explicit(&a->key, &key, 0, memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            kpi_ranges_push(&r);
        }
        return;
    }
}

/* ---- the NVTX entry points ---- */

#ifdef KPI_HAVE_NVTX

static unsigned kp__dom_index(nvtxDomainHandle_t h)
{
    const char *p = (const char *) h;

    if (p >= (const char *) g_nvtx.domains &&
        p < (const char *) (g_nvtx.domains + KP_NVTX_MAX_DOMAINS)) {
        return (unsigned) ((const struct kp__domain *) (const void *) p - g_nvtx.domains);
    }
    return 0;
}

static void kp__in_ev(struct kp__in *in, const nvtxEventAttributes_t *a)
{
    if (a == NULL) {
        kp__in_attr(in, 0, NULL);
        return;
    }
    kp__in_attr(in, a->messageType, (const void *) a->message.ascii);
}

static void NVTX_API kp__nv_mark_ex(const nvtxEventAttributes_t *a)
{
    struct kp__in in;

    kp__in_ev(&in, a);
    kp__mark(0, &in);
}

static void NVTX_API kp__nv_mark_a(const char *msg)
{
    struct kp__in in;

    kp__in_ascii(&in, msg);
    kp__mark(0, &in);
}

static nvtxRangeId_t NVTX_API kp__nv_range_start_ex(const nvtxEventAttributes_t *a)
{
    struct kp__in in;

    kp__in_ev(&in, a);
    return kp__range_start(0, &in);
}

static nvtxRangeId_t NVTX_API kp__nv_range_start_a(const char *msg)
{
    struct kp__in in;

    kp__in_ascii(&in, msg);
    return kp__range_start(0, &in);
}

static nvtxRangeId_t NVTX_API kp__nv_range_start_w(const wchar_t *msg)
{
    struct kp__in in;

    kp__in_attr(&in, 2, msg);
    return kp__range_start(0, &in);
}

static void NVTX_API kp__nv_range_end(nvtxRangeId_t id)
{
    kp__range_end(id);
}

static int NVTX_API kp__nv_push_ex(const nvtxEventAttributes_t *a)
{
    struct kp__in in;

    kp__in_ev(&in, a);
    return kp__push(0, &in);
}

static int NVTX_API kp__nv_push_a(const char *msg)
{
    struct kp__in in;

    kp__in_ascii(&in, msg);
    return kp__push(0, &in);
}

static int NVTX_API kp__nv_push_w(const wchar_t *msg)
{
    struct kp__in in;

    kp__in_attr(&in, 2, msg); /* counted and ignored: the range keeps its depth, no name */
    return kp__push(0, &in);
}

static int NVTX_API kp__nv_pop(void)
{
    return kp__pop(0);
}

static void NVTX_API kp__nv_mark_w(const wchar_t *msg)
{
    struct kp__in in;

    kp__in_attr(&in, 2, msg);
    kp__mark(0, &in);
}

static void NVTX_API kp__nv_name_os_thread_a(uint32_t tid, const char *name)
{
    /* Thread names come from /proc at analysis time; nothing to do. */
}

static void NVTX_API kp__nv_dom_mark_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    struct kp__in in;

    kp__in_ev(&in, a);
    kp__mark(kp__dom_index(d), &in);
}

static nvtxRangeId_t NVTX_API kp__nv_dom_range_start_ex(nvtxDomainHandle_t d,
                                                        const nvtxEventAttributes_t *a)
{
    struct kp__in in;

    kp__in_ev(&in, a);
    return kp__range_start(kp__dom_index(d), &in);
}

static void NVTX_API kp__nv_dom_range_end(nvtxDomainHandle_t d, nvtxRangeId_t id)
{
    kp__range_end(id);
}

static int NVTX_API kp__nv_dom_push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    struct kp__in in;

    kp__in_ev(&in, a);
    return kp__push(kp__dom_index(d), &in);
}

static int NVTX_API kp__nv_dom_pop(nvtxDomainHandle_t d)
{
    return kp__pop(kp__dom_index(d));
}

static nvtxStringHandle_t NVTX_API kp__nv_dom_register_string_a(nvtxDomainHandle_t d, const char *s)
{
    return (nvtxStringHandle_t) (uintptr_t) kp__register_string(s);
}

static nvtxDomainHandle_t NVTX_API kp__nv_dom_create_a(const char *name)
{
    return (nvtxDomainHandle_t) (void *) &g_nvtx.domains[kp__domain_create(name)];
}

static nvtxDomainHandle_t NVTX_API kp__nv_dom_create_w(const wchar_t *name)
{
    atomic_fetch_add_explicit(&g_nvtx.unicode_ignored, 1, memory_order_relaxed);
    return (nvtxDomainHandle_t) (void *) &g_nvtx.domains[0];
}

static void NVTX_API kp__nv_dom_destroy(nvtxDomainHandle_t d)
{
    /* Domain slots live as long as the process: other NVTX instances may share the name. */
}

struct kp__slot {
    unsigned idx;
    NvtxFunctionPointer fn;
};

/* Writes fns into one module's table; 0 if the table cannot be had. */
static int kp__install(const NvtxExportTableCallbacks *cb, NvtxCallbackModule mod,
                       const struct kp__slot *slots, size_t n)
{
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;

    if (!cb->GetModuleFunctionTable(mod, &table, &size) || table == NULL) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (slots[i].idx < size && table[slots[i].idx] != NULL) {
            *table[slots[i].idx] = slots[i].fn;
        }
    }
    return 1;
}

#define KP__SLOT(idx, fn)                 \
    {                                     \
        (idx), (NvtxFunctionPointer) (fn) \
    }

KPI_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table);

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table)
{
    static const struct kp__slot core[] = {
        KP__SLOT(NVTX_CBID_CORE_MarkEx, kp__nv_mark_ex),
        KP__SLOT(NVTX_CBID_CORE_MarkA, kp__nv_mark_a),
        KP__SLOT(NVTX_CBID_CORE_MarkW, kp__nv_mark_w),
        KP__SLOT(NVTX_CBID_CORE_RangeStartEx, kp__nv_range_start_ex),
        KP__SLOT(NVTX_CBID_CORE_RangeStartA, kp__nv_range_start_a),
        KP__SLOT(NVTX_CBID_CORE_RangeStartW, kp__nv_range_start_w),
        KP__SLOT(NVTX_CBID_CORE_RangeEnd, kp__nv_range_end),
        KP__SLOT(NVTX_CBID_CORE_RangePushEx, kp__nv_push_ex),
        KP__SLOT(NVTX_CBID_CORE_RangePushA, kp__nv_push_a),
        KP__SLOT(NVTX_CBID_CORE_RangePushW, kp__nv_push_w),
        KP__SLOT(NVTX_CBID_CORE_RangePop, kp__nv_pop),
        KP__SLOT(NVTX_CBID_CORE_NameOsThreadA, kp__nv_name_os_thread_a),
    };
    static const struct kp__slot core2[] = {
        KP__SLOT(NVTX_CBID_CORE2_DomainMarkEx, kp__nv_dom_mark_ex),
        KP__SLOT(NVTX_CBID_CORE2_DomainRangeStartEx, kp__nv_dom_range_start_ex),
        KP__SLOT(NVTX_CBID_CORE2_DomainRangeEnd, kp__nv_dom_range_end),
        KP__SLOT(NVTX_CBID_CORE2_DomainRangePushEx, kp__nv_dom_push_ex),
        KP__SLOT(NVTX_CBID_CORE2_DomainRangePop, kp__nv_dom_pop),
        KP__SLOT(NVTX_CBID_CORE2_DomainRegisterStringA, kp__nv_dom_register_string_a),
        KP__SLOT(NVTX_CBID_CORE2_DomainCreateA, kp__nv_dom_create_a),
        KP__SLOT(NVTX_CBID_CORE2_DomainCreateW, kp__nv_dom_create_w),
        KP__SLOT(NVTX_CBID_CORE2_DomainDestroy, kp__nv_dom_destroy),
    };
    const NvtxExportTableCallbacks *cb;
    const NvtxExportTableVersionInfo *vi;

    if (get_export_table == NULL) {
        return 0;
    }
    kp__nvtx_init();
    cb = get_export_table(NVTX_ETID_CALLBACKS);
    if (cb == NULL || cb->struct_size < sizeof(*cb) || cb->GetModuleFunctionTable == NULL) {
        kpi_log("NVTX injection refused: this NVTX instance has no callback table; its ranges "
                "will not be seen");
        return 0;
    }
    if (!kp__install(cb, NVTX_CB_MODULE_CORE, core, sizeof(core) / sizeof(core[0]))) {
        kpi_log("NVTX injection refused: no CORE function table; its ranges will not be seen");
        return 0;
    }
    /* Old NVTX (v1) instances have no CORE2: default-domain ranges still work. */
    kp__install(cb, NVTX_CB_MODULE_CORE2, core2, sizeof(core2) / sizeof(core2[0]));
    vi = get_export_table(NVTX_ETID_VERSIONINFO);
    if (vi != NULL && vi->struct_size >= sizeof(*vi) && vi->SetInjectionNvtxVersion != NULL) {
        vi->SetInjectionNvtxVersion(NVTX_VERSION);
    }
    atomic_fetch_add_explicit(&g_nvtx.instances, 1, memory_order_relaxed);
    return 1;
}

#endif /* KPI_HAVE_NVTX */
