/*
 * intern.c: lock-free string interning for libkprof_inject.so (any thread).
 *
 * DESIGN
 * Two fixed allocations made once by kpi_intern_init (pthread_once):
 *   - an arena of `arena_cap` bytes holding entries back to back, each
 *       { atomic state; uint32 id; uint32 hash; uint32 len; bytes[len]; NUL } padded to 8;
 *   - an open-addressing table of `slots` (a power of two, >= 2 × the entry limit) atomic
 *     pointers to arena entries, linear probing.
 * An insert reserves its entry and its id together with one CAS on a 64-bit cursor
 * (id count in the high 24 bits, arena offset in the low 40), so ids are 1, 2, 3, ... in arena
 * order and the worker can drain the arena front to back in id order. The writer fills the
 * entry, then publishes its pointer into an empty slot with a release CAS, then marks the entry
 * READY (release). A thread that finds the string already in a slot returns that entry's id. A
 * writer that loses a slot race to the same string marks its own entry DEAD (drain skips it;
 * the id is simply never used) and returns the winner's id, so one string always has one id.
 * Entries are never removed: a published pointer stays valid for the life of the process.
 *
 * Full (no entry id, no arena room, or no free slot on the probe path): the id of
 * OVERFLOW_NAME, interned first at init (id 1), is returned and names_overflow counted.
 * Strings are capped at KPI_INTERN_MAX_LEN bytes, cut at a UTF-8 character boundary.
 *
 * kpi_intern_drain runs on the worker thread only: it walks entries from its position while
 * they are READY or DEAD and stops at the first entry still being written (state 0); the next
 * call resumes there.
 */
#include "kpi.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KPI_INTERN_MAX_LEN       4096u
#define KPI_INTERN_DEF_ENTRIES   65536u
#define KPI_INTERN_DEF_ARENA     (8u << 20)
#define KPI_INTERN_MIN_ENTRIES   64u
#define KPI_INTERN_MAX_ENTRIES   (1u << 20) /* the agent accepts ids up to 2^21 */
#define KPI_INTERN_MIN_ARENA     (64u << 10)
#define KPI_INTERN_MAX_ARENA     (1ull << 32)
#define KPI_INTERN_OFF_BITS      40
#define KPI_INTERN_OFF_MASK      ((1ull << KPI_INTERN_OFF_BITS) - 1)
#define KPI_INTERN_OVERFLOW_NAME "(kprof: name table full)"

enum kpi_intern_state {
    KPI_ENT_WRITING = 0,
    KPI_ENT_READY = 1,
    KPI_ENT_DEAD = 2
};

struct kpi_intern_entry {
    atomic_uint state; /* enum kpi_intern_state */
    uint32_t id;
    uint32_t hash;
    uint32_t len;
    char bytes[]; /* len bytes, then a NUL */
};

struct kpi_intern {
    _Atomic(struct kpi_intern_entry *) *slots;
    uint32_t slot_mask;
    uint32_t max_entries;
    unsigned char *arena; /* 8-byte aligned */
    uint64_t arena_cap;
    _Atomic uint64_t cursor; /* (ids used << KPI_INTERN_OFF_BITS) | arena bytes used */
    uint32_t overflow_id;
    uint64_t drain_off; /* worker thread only */
};

static struct kpi_intern g_in;
static atomic_int g_in_ready; /* 1 once init succeeded (release) */
static pthread_once_t g_in_once = PTHREAD_ONCE_INIT;

/* Parses a positive size with an optional K/M/G (KiB/MiB/GiB) suffix; def if unset or bad. */
static uint64_t kp__env_size(const char *name, uint64_t def, uint64_t lo, uint64_t hi)
{
    const char *s = getenv(name);
    char *end = NULL;
    unsigned long long v;

    if (s == NULL || *s == '\0') {
        return def;
    }
    v = strtoull(s, &end, 10);
    if (end == s) {
        return def;
    }
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        break;
    default:
        break;
    }
    if (v < lo) {
        v = lo;
    }
    if (v > hi) {
        v = hi;
    }
    return v;
}

static uint32_t kp__hash(const char *s, size_t len)
{
    /* Eight bytes a step (multiply, xor-shift), then the tail: kernel names run to hundreds of
     * bytes and are hashed once per kernel record, so a byte-wise hash would dominate decode. */
    const uint64_t m = 0x9e3779b97f4a7c15ull;
    uint64_t h = 0x2545f4914f6cdd1dull ^ (len * m);
    size_t i = 0;

    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * m;
        h ^= h >> 29;
    }
    if (i < len) {
        uint64_t w = 0;
        memcpy(&w, s + i, len - i);
        h = (h ^ w) * m;
        h ^= h >> 29;
    }
    h *= m;
    return (uint32_t) (h ^ (h >> 32));
}

static size_t kp__entry_size(size_t len)
{
    return (sizeof(struct kpi_intern_entry) + len + 1 + 7) & ~(size_t) 7;
}

/* Cuts len to KPI_INTERN_MAX_LEN at a UTF-8 boundary (never inside a multi-byte character). */
static size_t kp__cap_len(const char *s, size_t len)
{
    size_t n;

    if (len <= KPI_INTERN_MAX_LEN) {
        return len;
    }
    n = KPI_INTERN_MAX_LEN;
    /* s[n] is the first byte dropped: while it continues a character, drop that one too. */
    while (n > 0 && ((unsigned char) s[n] & 0xC0) == 0x80) {
        n--;
    }
    return n;
}

/* Reserves an entry for len bytes; NULL when out of ids or arena. Sets the entry's id. */
static struct kpi_intern_entry *kp__reserve(size_t len)
{
    uint64_t need = kp__entry_size(len);
    uint64_t cur = atomic_load_explicit(&g_in.cursor, memory_order_relaxed);
    uint64_t ids, off;
    struct kpi_intern_entry *e;

    for (;;) {
        ids = cur >> KPI_INTERN_OFF_BITS;
        off = cur & KPI_INTERN_OFF_MASK;
        if (ids >= g_in.max_entries || off + need > g_in.arena_cap) {
            return NULL;
        }
        if (atomic_compare_exchange_weak_explicit(&g_in.cursor, &cur,
                                                  ((ids + 1) << KPI_INTERN_OFF_BITS) | (off + need),
                                                  memory_order_relaxed, memory_order_relaxed)) {
            break;
        }
    }
    e = (struct kpi_intern_entry *) (g_in.arena + off);
    e->id = (uint32_t) (ids + 1);
    return e;
}

static int kp__entry_eq(const struct kpi_intern_entry *e, uint32_t h, const char *s, size_t len)
{
    return e->hash == h && e->len == len && memcmp(e->bytes, s, len) == 0;
}

/* The insert proper; returns 0 when full (the caller substitutes the overflow id). */
static uint32_t kp__intern(const char *s, size_t len)
{
    uint32_t h = kp__hash(s, len);
    uint32_t i = h & g_in.slot_mask;
    struct kpi_intern_entry *mine = NULL;
    struct kpi_intern_entry *cur;
    uint32_t id = 0;

    for (uint32_t probes = 0; probes <= g_in.slot_mask; probes++, i = (i + 1) & g_in.slot_mask) {
        cur = atomic_load_explicit(&g_in.slots[i], memory_order_acquire);
        while (cur == NULL) {
            if (mine == NULL) {
                mine = kp__reserve(len);
                if (mine == NULL) {
                    return 0;
                }
                mine->hash = h;
                mine->len = (uint32_t) len;
                memcpy(mine->bytes, s, len);
                mine->bytes[len] = '\0';
            }
            if (atomic_compare_exchange_strong_explicit(
                    &g_in.slots[i], &cur, mine, memory_order_acq_rel, memory_order_acquire)) {
                atomic_store_explicit(&mine->state, KPI_ENT_READY, memory_order_release);
                atomic_fetch_add_explicit(&kpi_nvtx_counters.names, 1, memory_order_relaxed);
                return mine->id;
            }
            /* Lost the slot: cur now holds the winner; compare below. */
        }
        if (kp__entry_eq(cur, h, s, len)) {
            id = cur->id;
            break;
        }
    }
    if (mine != NULL) {
        /* Our reserved entry was not published (the string was there, or no slot was free). */
        atomic_store_explicit(&mine->state, KPI_ENT_DEAD, memory_order_release);
    }
    return id;
}

static void kp__intern_init_once(void)
{
    uint64_t entries = kp__env_size("KPROF_NAME_TABLE", KPI_INTERN_DEF_ENTRIES,
                                    KPI_INTERN_MIN_ENTRIES, KPI_INTERN_MAX_ENTRIES);
    uint64_t arena = kp__env_size("KPROF_NAME_ARENA", KPI_INTERN_DEF_ARENA, KPI_INTERN_MIN_ARENA,
                                  KPI_INTERN_MAX_ARENA);
    uint64_t slots = 1;

    while (slots < 2 * entries) {
        slots <<= 1;
    }
    arena = (arena + 7) & ~(uint64_t) 7;
    /* calloc of this size maps fresh zero pages: untouched slots and arena cost no RSS. */
    g_in.slots = calloc(slots, sizeof(*g_in.slots));
    g_in.arena = calloc(1, arena);
    if (g_in.slots == NULL || g_in.arena == NULL) {
        free((void *) g_in.slots);
        free(g_in.arena);
        g_in.slots = NULL;
        g_in.arena = NULL;
        kpi_log("cannot allocate the name table (KPROF_NAME_TABLE=%llu KPROF_NAME_ARENA=%llu): "
                "NVTX range names will be missing; lower the sizes",
                (unsigned long long) entries, (unsigned long long) arena);
        return;
    }
    g_in.slot_mask = (uint32_t) (slots - 1);
    g_in.max_entries = (uint32_t) entries;
    g_in.arena_cap = arena;
    atomic_init(&g_in.cursor, 0);
    g_in.drain_off = 0;
    g_in.overflow_id = kp__intern(KPI_INTERN_OVERFLOW_NAME, sizeof(KPI_INTERN_OVERFLOW_NAME) - 1);
    atomic_store_explicit(&g_in_ready, 1, memory_order_release);
}

void kpi_intern_init(void)
{
    pthread_once(&g_in_once, kp__intern_init_once);
}

uint32_t kpi_intern(const char *s, size_t len)
{
    uint32_t id;

    if (len == 0 || s == NULL) {
        return 0;
    }
    if (!atomic_load_explicit(&g_in_ready, memory_order_acquire)) {
        kpi_intern_init();
        if (!atomic_load_explicit(&g_in_ready, memory_order_acquire)) {
            atomic_fetch_add_explicit(&kpi_nvtx_counters.names_overflow, 1, memory_order_relaxed);
            return 0;
        }
    }
    len = kp__cap_len(s, len);
    if (len == 0) {
        return 0;
    }
    id = kp__intern(s, len);
    if (id == 0) {
        atomic_fetch_add_explicit(&kpi_nvtx_counters.names_overflow, 1, memory_order_relaxed);
        id = g_in.overflow_id;
    }
    return id;
}

size_t kpi_intern_drain(int (*fn)(void *ctx, uint32_t id, const char *s, uint32_t len), void *ctx)
{
    size_t n = 0;
    uint64_t end;
    struct kpi_intern_entry *e;
    unsigned st;

    if (!atomic_load_explicit(&g_in_ready, memory_order_acquire)) {
        return 0;
    }
    end = atomic_load_explicit(&g_in.cursor, memory_order_acquire) & KPI_INTERN_OFF_MASK;
    while (g_in.drain_off < end) {
        e = (struct kpi_intern_entry *) (g_in.arena + g_in.drain_off);
        st = atomic_load_explicit(&e->state, memory_order_acquire);
        if (st == KPI_ENT_WRITING) {
            break;
        }
        if (st == KPI_ENT_READY) {
            if (fn(ctx, e->id, e->bytes, e->len) != 0) {
                /* The caller could not take this one (e.g. its message is full): resume here. */
                break;
            }
            n++;
        }
        g_in.drain_off += kp__entry_size(e->len);
    }
    return n;
}

void kpi_intern_rewind(void)
{
    g_in.drain_off = 0;
}
