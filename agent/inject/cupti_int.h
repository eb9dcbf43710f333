/*
 * cupti_int.h: what the core parts of libkprof_inject.so (inject.c, cupti.c, worker.c) share
 * beyond kpi.h. Nothing here is exported.
 *
 *   inject.c   owns struct kpi_core (identity, step, state, counters) and the entry points.
 *   cupti.c    owns the CUPTI function table, the buffer pool and the decoder.
 *   worker.c   owns the worker thread: agent link, captures, outgoing queue.
 *
 * Threads: application threads touch only atomics (kprof_step, kpi_step_event, the CUPTI
 * buffer callbacks' short pool mutex); everything else runs on the worker thread.
 */
#ifndef KPI_CUPTI_INT_H
#define KPI_CUPTI_INT_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kpi.h"
#include "kprof.h"

#define KPI_REASON_CAP       256    /* = sizeof kp_wire_status.reason */
#define KPI_MIN_CUPTI        130001 /* CUPTI_API_VERSION of CUDA 13.0 Update 1 */
#define KPI_DEF_BUFFER_BYTES (4u << 20)
#define KPI_DEF_MAX_BUFFERS  (64u << 20)
#define KPI_DEF_QUEUE_BYTES  (16u << 20)
#define KPI_DEF_EXIT_MS      2000u
#define KPI_STEP_RING        256 /* step events in flight to the worker (power of two) */

/* The CUDA driver's entry point (exported; see kprof.h for the rest of the public API). */
int InitializeInjection(void);

/* ---- logging (inject.c) ---- */

enum kpi_log_level {
    KPI_LOG_DEBUG = 0,
    KPI_LOG_INFO,
    KPI_LOG_WARN,
    KPI_LOG_ERROR,
    KPI_LOG_OFF
};

/* Like kpi_log at an explicit level (kpi_log is KPI_LOG_WARN). Rate-limited to about ten
 * lines a second in all; one write(2) per line. */
void kpi_logl(enum kpi_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kpi_logv(enum kpi_log_level level, const char *fmt, va_list ap);

/* ---- process-wide state (inject.c) ---- */

struct kpi_counters {
    atomic_uint_fast64_t buffers_requested, buffers_declined, buffers_completed;
    atomic_uint_fast64_t records_decoded, records_sent, records_dropped, cupti_dropped;
    atomic_uint_fast64_t agent_connects, captures;
    atomic_uint_fast64_t incomplete, unknown_kind;
    atomic_uint connected;     /* 1 while registered with an agent */
    atomic_uint enabled_kinds; /* CUPTI activity kinds enabled now */
};

struct kpi_core {
    /* identity, written once by InitializeInjection before the worker starts */
    char job[256];
    char host[256];
    int32_t rank, local_rank, world_size;
    uint32_t pid;
    int64_t start_ns;
    char cupti_error[KPI_REASON_CAP]; /* why CUPTI is unusable, "" if fine */
    uint32_t cupti_version;

    atomic_int_least64_t current_step; /* -1 before the first step */
    atomic_int hook_present;           /* kprof_step() has been called */
    atomic_int capture_live;           /* ARMED, WARMUP or CAPTURING: forward step events */
    atomic_uint state;                 /* enum kp_wire_state of the current or last capture */
    atomic_int device;                 /* learned from records' deviceId; -1 unknown */
    atomic_int wake_fd;                /* eventfd the worker polls; -1 before it exists */

    /* step events: multi-producer ring (Vyukov), consumed by the worker */
    struct kpi_step_cell {
        atomic_uint_fast64_t seq;
        struct kp_wire_step ev;
    } steps[KPI_STEP_RING];
    atomic_uint_fast64_t step_head; /* next slot to claim (producers) */
    uint64_t step_tail;             /* next slot to read (worker) */
    atomic_uint_fast64_t steps_dropped;

    struct kpi_counters c;
};
extern struct kpi_core kpi_core;

/* Wakes the worker (eventfd write; never blocks). Any thread. */
void kpi_wake(void);

/* Pops one step event into *ev. Worker thread only. Returns 1, or 0 when none is queued. */
int kpi_steps_pop(struct kp_wire_step *ev);

/* Reads a size from the environment ("4194304", "4MiB", "64M"), else def; clamps to lo..hi. */
uint64_t kpi_env_size(const char *name, uint64_t def, uint64_t lo, uint64_t hi);

/* ---- CUPTI (cupti.c) ---- */

/* Resolves libcupti, checks its version, sets the init-time attributes and registers the
 * buffer callbacks. Returns 0, or -1 with the reason in kpi_core.cupti_error (CUPTI is then
 * never called again). InitializeInjection only. */
int kpi_cupti_init(void);

/* 1 once kpi_cupti_init succeeded. */
int kpi_cupti_usable(void);

/* Enables the CUPTI kinds for a KP_ACT_* mask. Returns 0, or -1 with a user-facing reason in
 * why (what failed, CUPTI's text, a hint) after rolling back what it enabled. Worker only. */
int kpi_cupti_enable(uint32_t activities, char *why, size_t cap);

/* Disables every kind kpi_cupti_enable enabled. Worker only. */
void kpi_cupti_disable(void);

/* cuptiActivityFlushAll(flag); logs errors. Never called with a lock held. Worker only. */
void kpi_cupti_flush(uint32_t flag);

/* cuptiActivityGetNumDroppedRecords(NULL, 0, ...) (resets on read). Worker only. */
uint64_t kpi_cupti_take_dropped(void);

/* Keeps spare buffers in the pool while kinds are enabled (allocation happens here, on the
 * worker, never in a CUPTI callback). Worker only. */
void kpi_cupti_pool_topup(void);

/* What the decoder hands the worker for each kept record. */
struct kpi_sink {
    void *ctx;
    /* rec points at a kp_wire_* struct of kind KP_REC_*; max_name is the largest string id in
     * it (0 if none); start_ns for the warm-up filter. */
    void (*rec)(void *ctx, uint32_t kind, const void *rec, uint32_t max_name, int64_t start_ns);
    int64_t min_start_ns; /* records starting before this are discarded (warm-up) */
    uint64_t overhead_ns; /* added by OVERHEAD records */
    uint64_t incomplete;  /* start == end == 0 */
    uint64_t discarded;   /* before min_start_ns */
};

/* Decodes every completed buffer into sink and returns the buffers to the pool. Returns the
 * number of CUPTI records walked. Worker only. */
size_t kpi_cupti_drain(struct kpi_sink *sink);

/* ---- worker (worker.c) ---- */

/* Starts the worker thread. Returns 0 or -errno. InitializeInjection only. */
int kpi_worker_start(void);

/* Ends an active window (bounded by budget_ms in all), sends what it can and joins the worker
 * with a timeout. Never hangs. The atexit handler only. */
void kpi_worker_stop(uint32_t budget_ms);

/* Forgets the worker thread and its sockets in a forked child (async-signal-safe calls only). */
void kpi_worker_forget(void);

#endif
