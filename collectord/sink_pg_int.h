/*
 * What the two files of the PostgreSQL sink share (docs/style.md §2): sink_pg.c stores one
 * flush (its design is described there), sink_queue.c holds the queue, the flush thread with
 * its connection and retries, and the public functions of sink_pg.h.
 */
#ifndef KP_SINK_PG_INT_H
#define KP_SINK_PG_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <libpq-fe.h>

#include "kp_codec.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "sink_pg.h"

#define KP_SINK_APPLICATION_NAME          "kprof-collectord-sink"
#define KP_SINK_DEFAULT_QUEUE_MAX_BYTES   (256u << 20)
#define KP_SINK_DEFAULT_FLUSH_MAX_ROWS    50000
#define KP_SINK_DEFAULT_FLUSH_INTERVAL_MS 100
#define KP_SINK_DEFAULT_RETRY_MAX_MS      10000
#define KP_SINK_RETRY_BASE_MS             50
#define KP_SINK_COPY_CHUNK                (256u << 10) /* bytes encoded per PQputCopyData */
#define KP_SINK_COPY_FIRST_CHUNK          (16u << 10)
#define KP_SINK_RUN_CACHE_SLOTS           4096       /* direct-mapped, power of 2 */
#define KP_SINK_NAME_CACHE_MAX_ENTRIES    (1u << 20) /* then the cache starts over */
#define KP_SINK_NAME_CACHE_MAX_BYTES      (128u << 20)
#define KP_SINK_NAMES_PER_INSERT          4096
#define KP_SINK_NAMES_BYTES_PER_INSERT    (4u << 20)
#define KP_SINK_CANCEL_GRACE_MS           1000 /* past the drain deadline, then PQcancel */

enum item_state {
    ST_PENDING, /* not settled; part of this attempt */
    ST_NEW,     /* its key was inserted in the open transaction */
    ST_DUP,     /* its key was stored before (or earlier in this flush) */
    ST_DONE,    /* settled: status/duplicate/err are final */
};

struct run_slot {
    int32_t run_id; /* 0: empty */
    int32_t world_size;
};

struct name_entry {
    char *name; /* owned by the cache; NULL: empty slot */
    uint64_t hash;
    int32_t id;
};

/* A name of this flush that the cache lacks; `name` is borrowed from a batch. */
struct name_miss {
    const char *name;
    uint64_t hash;
    int32_t id; /* 0 until resolved */
};

struct key_ref {
    int64_t run, rank, stream, seq;
    uint32_t idx; /* into items[] */
};

struct dev_ref {
    int64_t run, rank, dev;
    uint32_t idx; /* into items[] */
    uint32_t d;   /* into the batch's devices[] */
};

struct kp_sink {
    /* Set by kp_sink_create, then read-only. */
    char *conninfo;
    size_t queue_max_bytes;
    size_t flush_max_rows;
    long long flush_interval_ms;
    long long retry_max_ms;
    kp_sink_done_cb *done;
    void *done_ud;
    char lock_sql[512];
    char copy_cols[KP_EV_COUNT][640];
    char side_cols[KP_EV_COUNT][256]; /* "" for a kind without a side table */

    /* Guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC; queue changes, stop, thread exit */
    struct kp_sink_item *head, *tail;
    size_t pending_rows;        /* rows queued and not yet taken by a flush */
    long long pending_since_ns; /* when the oldest untaken item was queued */
    size_t queued_bytes;        /* wire bytes submitted and not settled */
    size_t queued_items;
    bool stopping;
    long long drain_deadline_ns;
    bool thread_started;
    bool thread_exited;
    PGcancel *cancel; /* of the flush thread's connection */
    struct kp_sink_stats stats;
    pthread_t thread;
    atomic_bool ready;

    /* Flush thread only. */
    PGconn *conn;
    struct kp_complain complain;
    unsigned rng;
    unsigned failures; /* consecutive failed attempts */
    struct kp_sink_item **items;
    size_t n_items, cap_items;
    uint8_t *state;   /* enum item_state of items[i] */
    size_t *name_off; /* items[i]'s name ids start at name_ids[name_off[i]] */
    size_t cap_state, cap_name_off;
    int32_t *name_ids;
    size_t cap_name_ids;
    struct key_ref *keys;
    size_t cap_keys;
    struct dev_ref *devs;
    size_t cap_devs;
    struct run_slot runs[KP_SINK_RUN_CACHE_SLOTS];
    struct run_slot *found; /* this flush's look-up, sorted by run_id */
    size_t n_found, cap_found;
    struct name_entry *names; /* open addressing, linear probing */
    size_t names_cap, names_n, names_bytes;
    struct name_miss *miss;
    size_t n_miss, cap_miss;
    uint32_t *miss_slots; /* 0: empty, else index + 1 into miss[] */
    size_t miss_slots_cap;
    const char **sorted;
    size_t cap_sorted;
    struct kp_strbuf copy;    /* COPY data, reused across flushes */
    struct kp_strbuf arr[18]; /* array-literal parameters, reused */
    char err[512];            /* the last failure's message */
};

static inline struct timespec kp__sink_abs_ts(long long ns)
{
    struct timespec ts = { .tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL };

    return ts;
}

/* Returns p grown to hold at least n elements of size bytes (capacity *cap), or NULL (p
 * unchanged). */
static inline void *kp__sink_grow(void *p, size_t *cap, size_t n, size_t size)
{
    size_t c = *cap < 64 ? 64 : *cap;
    void *q;

    if (n <= *cap && p != NULL) {
        return p;
    }
    while (c < n) {
        c *= 2;
    }
    if ((q = realloc(p, c * size)) == NULL) {
        return NULL;
    }
    *cap = c;
    return q;
}

/* Grows the array arr (capacity cap) to hold n elements. Returns 0 or -ENOMEM. */
#define GROW(arr, cap, n)                                                  \
    __extension__({                                                        \
        void *grow_p_ = kp__sink_grow((arr), &(cap), (n), sizeof(*(arr))); \
        grow_p_ != NULL ? ((arr) = grow_p_, 0) : -ENOMEM;                  \
    })

/* Clears the name cache (text -> names.id). Flush thread. */
void kp__sink_names_clear(struct kp_sink *s);

/* Stores the items items[lo..hi) not settled yet, splitting the range to isolate a batch
 * PostgreSQL refuses (see "Failures" in sink_pg.c). Returns 0, or the failed attempt's code
 * with its message in s->err (kp__sink_attempt_fault tells what to do). Flush thread. */
int kp__sink_flush_range(struct kp_sink *s, size_t lo, size_t hi, bool *isolating);

/* What the failure rc of the last attempt calls for. */
enum kp_pg_fault kp__sink_attempt_fault(struct kp_sink *s, int rc);

/* Settles every item of items[] not settled yet with status and "why: s->err". */
void kp__sink_reject_unsettled(struct kp_sink *s, int status, const char *why);

#endif
