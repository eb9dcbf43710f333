/*
 * kpi.h: internal contract between the parts of libkprof_inject.so.
 *
 *   inject.c   entry points (InitializeInjection, kprof_step, kprof_get_stats), identity,
 *              global state, fork and exit handling                          [core]
 *   cupti.c    CUPTI function table (dlopen), buffer pool, buffer callbacks, decode of
 *              CUpti_Activity* records into kp_wire structs, enabling kinds   [core]
 *   worker.c   the library's one background thread: agent link (kp_wire over SOCK_SEQPACKET),
 *              command handling and capture windows, periodic flush, outgoing queue [core]
 *   nvtx.c     InitializeInjectionNvtx2 and the NVTX handlers: per-thread, per-domain stacks,
 *              range instances, external correlation push/pop, step detection   [nvtx]
 *   intern.c   lock-free string interning (any thread)                           [nvtx]
 *   ring.c     bounded multi-producer queue of finished range records            [nvtx]
 *
 * Rules for every part: no blocking, no locks and no malloc on application threads' hot paths
 * (NVTX handlers, kprof_step, CUPTI callbacks on app threads); nothing may abort or raise a
 * signal; memory is bounded (drop and count); all symbols hidden except the entry points.
 */
#ifndef KPI_H
#define KPI_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_wire.h"

#define KPI_EXPORT __attribute__((visibility("default")))

/* ---- provided by core (inject.c / cupti.c / worker.c) ---- */

/* 1 while recording (a capture's warm-up or window, until the window's end), else 0. The
 * NVTX handlers test this on every call: a relaxed atomic load. */
extern atomic_int kpi_recording_flag;
static inline int kpi_recording(void)
{
    return atomic_load_explicit(&kpi_recording_flag, memory_order_relaxed);
}

/* 1 once the process has forked away from the one that loaded the library: everything off. */
extern atomic_int kpi_forked_flag;

/* CLOCK_REALTIME ns (vDSO), the clock CUPTI uses. */
int64_t kpi_now_ns(void);

/* gettid(), cached per thread. */
uint64_t kpi_tid(void);

/* Pushes / pops a CUSTOM2 external correlation id on the calling thread's CUPTI stack.
 * No-ops when CUPTI is unavailable. Called only while recording. */
void kpi_cupti_push_ext(uint64_t id);
void kpi_cupti_pop_ext(void);

/* A step began (from kprof_step or an NVTX step range/mark). Lock-free, any thread. */
void kpi_step_event(int64_t step, int64_t ts_ns, uint32_t source);

/* Diagnostic on stderr, "kprof: ...", at warn level unless KPROF_LOG=debug|info|warn|error|off
 * says otherwise, rate-limited to about 10 lines a second for the whole library, so a broken
 * setup cannot flood the job's log. Safe on any thread; never blocks for long. */
void kpi_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- provided by nvtx part (intern.c / ring.c / nvtx.c) ---- */

/* Interns len bytes (need not be NUL-terminated) and returns its id (>= 1), 0 for len == 0.
 * Lock-free, any thread. When the table or its arena is full, returns the id of
 * "(kprof: name table full)" and counts it. Capacity from KPROF_NAME_TABLE (entries, default
 * 65536) and KPROF_NAME_ARENA (bytes, default 8 MiB), read by kpi_intern_init. */
uint32_t kpi_intern(const char *s, size_t len);
void kpi_intern_init(void);

/* Worker thread only: calls fn for every string interned since the previous call, in id order,
 * stopping (and returning) early if fn returns non-zero; the next call resumes there. Returns
 * the number of strings delivered. An entry still being written by another thread ends the
 * call (it is delivered next time). */
size_t kpi_intern_drain(int (*fn)(void *ctx, uint32_t id, const char *s, uint32_t len), void *ctx);

/* Forgets the drain position so every string is delivered again (a new agent connection: ids
 * are per connection's view, the agent needs them all). Worker thread only. */
void kpi_intern_rewind(void);

/* Finished range records: multi-producer (any thread), single consumer (worker). Capacity
 * from KPROF_RANGE_RING (records, default 65536, rounded up to a power of two). push returns
 * 0, or -1 when full (the record is dropped and counted). */
void kpi_ranges_init(void);
int kpi_ranges_push(const struct kp_wire_range *r);
size_t kpi_ranges_pop(struct kp_wire_range *out, size_t max);

/* Called by the worker when recording starts and when it stops (window end), on the worker
 * thread. At stop, ranges still open are emitted with KP_RANGE_UNCLOSED when their thread
 * next touches NVTX (or never: the ring is what is delivered). */
void kpi_nvtx_recording_changed(int recording);

/* The name of the NVTX range that marks steps: "ProfilerStep#" by default (KPROF_STEP_RANGE).
 * A push-range whose message starts with it and is followed by a number N reports step N. */

/* Counters for kprof_get_stats (relaxed atomics). */
struct kpi_nvtx_counters {
    atomic_uint_fast64_t ranges, ranges_dropped, names, names_overflow;
};
extern struct kpi_nvtx_counters kpi_nvtx_counters;

#endif
