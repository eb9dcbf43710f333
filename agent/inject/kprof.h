/*
 * kprof.h: the public C API of libkprof_inject.so, for code inside the profiled process
 * (the Python hook that kprof-run installs calls it through ctypes).
 *
 * The library is loaded by the CUDA driver (CUDA_INJECTION64_PATH, entry InitializeInjection)
 * and by NVTX (NVTX_INJECTION64_PATH, entry InitializeInjectionNvtx2). Every function here is
 * safe to call from any thread at any time, including before InitializeInjection and in a
 * forked child (where it does nothing), and never blocks.
 */
#ifndef KPROF_H
#define KPROF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Marks the start of training step `step` (steps count up from 0; the hook passes the number
 * of optimizer steps completed so far). Returns 1 while the library is recording (a capture's
 * warm-up step or window: the hook then switches PyTorch's NVTX op ranges on), else 0.
 * Cost while dormant: an atomic load and store.
 */
int kprof_step(int64_t step);

struct kprof_stats {
    uint32_t size;        /* caller sets sizeof(struct kprof_stats) */
    uint32_t state;       /* enum kp_wire_state of the current or last capture */
    int64_t current_step; /* -1 before the first step */
    uint64_t buffers_requested, buffers_declined, buffers_completed;
    uint64_t records_decoded; /* CUPTI records walked by the drain */
    uint64_t records_sent;    /* compact records handed to the agent */
    uint64_t records_dropped; /* dropped by kprof (queue full, agent gone, ring full) */
    uint64_t cupti_dropped;   /* reported by cuptiActivityGetNumDroppedRecords */
    uint64_t ranges;          /* NVTX range instances recorded */
    uint64_t ranges_dropped;  /* range ring full */
    uint64_t names;           /* interned strings */
    uint64_t names_overflow;  /* strings replaced by "(kprof: name table full)" */
    uint64_t agent_connects;  /* successful registrations */
    uint64_t captures;        /* windows completed */
    uint32_t connected;       /* 1 while registered with an agent */
    uint32_t enabled_kinds;   /* CUPTI activity kinds enabled right now (0 while dormant) */
};

/* Copies the library's counters. Returns 0, or -1 if size is wrong. */
int kprof_get_stats(struct kprof_stats *out);

#ifdef __cplusplus
}
#endif
#endif
