/*
 * ring.c: the bounded queue of finished NVTX range records (many producers, one consumer).
 *
 * DESIGN
 * Dmitry Vyukov's bounded MPMC queue: a power-of-two array of cells, each a sequence number
 * and one struct kp_wire_range. Cell i starts with seq = i. A producer at position p owns the
 * cell p & mask once cell.seq == p and it wins the CAS of the enqueue position p -> p + 1; it
 * copies the record and stores seq = p + 1 (release). The consumer at position c reads the
 * cell when seq == c + 1, then stores seq = c + capacity (release) to hand it back to the
 * producer one lap later. A producer that sees seq < p knows the ring is full: it drops the
 * record and counts it (never waits). Producers never block each other for longer than a
 * failed CAS; a producer preempted between its CAS and its seq store only delays the consumer,
 * which stops at that cell and resumes there next time.
 *
 * The array is allocated once by kpi_ranges_init (pthread_once); before that, or if the
 * allocation failed, every push is a counted drop.
 */
#include "kpi.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KPI_RING_DEF_CAP 65536u
#define KPI_RING_MIN_CAP 64u
#define KPI_RING_MAX_CAP (1u << 24)

struct kpi_ring_cell {
    _Atomic uint64_t seq;
    struct kp_wire_range rec;
};

struct kpi_ring {
    struct kpi_ring_cell *cells;
    uint64_t mask;
    _Alignas(64) _Atomic uint64_t head; /* enqueue position (producers) */
    _Alignas(64) uint64_t tail;         /* dequeue position (consumer only) */
};

static struct kpi_ring g_ring;
static atomic_int g_ring_ready; /* 1 once cells exist (release) */
static pthread_once_t g_ring_once = PTHREAD_ONCE_INIT;

static uint64_t kp__ring_cap_from_env(void)
{
    const char *s = getenv("KPROF_RANGE_RING");
    char *end = NULL;
    unsigned long long v = KPI_RING_DEF_CAP;
    uint64_t cap = 1;

    if (s != NULL && *s != '\0') {
        v = strtoull(s, &end, 10);
        if (end == s) {
            v = KPI_RING_DEF_CAP;
        }
    }
    if (v < KPI_RING_MIN_CAP) {
        v = KPI_RING_MIN_CAP;
    }
    if (v > KPI_RING_MAX_CAP) {
        v = KPI_RING_MAX_CAP;
    }
    while (cap < v) {
        cap <<= 1;
    }
    return cap;
}

static void kp__ranges_init_once(void)
{
    uint64_t cap = kp__ring_cap_from_env();

    g_ring.cells = calloc(cap, sizeof(*g_ring.cells));
    if (g_ring.cells == NULL) {
        kpi_log("cannot allocate the range ring (KPROF_RANGE_RING=%llu records): NVTX ranges "
                "will be dropped; lower KPROF_RANGE_RING",
                (unsigned long long) cap);
        return;
    }
    for (uint64_t i = 0; i < cap; i++) {
        atomic_init(&g_ring.cells[i].seq, i);
    }
    g_ring.mask = cap - 1;
    atomic_init(&g_ring.head, 0);
    g_ring.tail = 0;
    atomic_store_explicit(&g_ring_ready, 1, memory_order_release);
}

void kpi_ranges_init(void)
{
    pthread_once(&g_ring_once, kp__ranges_init_once);
}

int kpi_ranges_push(const struct kp_wire_range *r)
{
    struct kpi_ring_cell *c;
    uint64_t pos, seq;
    int64_t diff;

    if (!atomic_load_explicit(&g_ring_ready, memory_order_acquire)) {
        goto drop;
    }
    pos = atomic_load_explicit(&g_ring.head, memory_order_relaxed);
    for (;;) {
        c = &g_ring.cells[pos & g_ring.mask];
        seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        diff = (int64_t) (seq - pos);
        if (diff == 0) {
            if (atomic_compare_exchange_weak_explicit(&g_ring.head, &pos, pos + 1,
                                                      memory_order_relaxed, memory_order_relaxed)) {
                break;
            }
            /* pos was reloaded by the failed CAS */
        }
        else if (diff < 0) {
            goto drop; /* the consumer has not freed this cell yet: full */
        }
        else {
            pos = atomic_load_explicit(&g_ring.head, memory_order_relaxed);
        }
    }
    memcpy(&c->rec, r, sizeof(*r));
    atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
    atomic_fetch_add_explicit(&kpi_nvtx_counters.ranges, 1, memory_order_relaxed);
    return 0;

drop:
    atomic_fetch_add_explicit(&kpi_nvtx_counters.ranges_dropped, 1, memory_order_relaxed);
    return -1;
}

size_t kpi_ranges_pop(struct kp_wire_range *out, size_t max)
{
    size_t n = 0;
    struct kpi_ring_cell *c;
    uint64_t pos;

    if (!atomic_load_explicit(&g_ring_ready, memory_order_acquire)) {
        return 0;
    }
    pos = g_ring.tail;
    while (n < max) {
        c = &g_ring.cells[pos & g_ring.mask];
        if (atomic_load_explicit(&c->seq, memory_order_acquire) != pos + 1) {
            break; /* empty, or the producer of this cell has not finished writing */
        }
        memcpy(&out[n], &c->rec, sizeof(*out));
        atomic_store_explicit(&c->seq, pos + g_ring.mask + 1, memory_order_release);
        pos++;
        n++;
    }
    g_ring.tail = pos;
    return n;
}
