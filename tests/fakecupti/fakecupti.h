/*
 * fakecupti.h: the control API of libkprof_fakecupti.so, a test double for libcupti.so.13.
 *
 * The fake exports the CUPTI functions libkprof_inject.so resolves by dlsym (cuptiGetVersion,
 * cuptiActivity*, external correlation push/pop, ...), with the exact prototypes of the CUDA
 * 13 headers, and the fakecupti_* functions below that play the GPU: each emission call writes
 * real header structs (CUpti_ActivityKernel10, CUpti_ActivityAPI, ...) into buffers obtained
 * through the request callback the library registered, the way CUPTI does on a GPU:
 *
 *   calling thread's API buffer   ExternalCorrelation (one per kind with a non-empty stack on
 *                                 this thread, its top id), then the API record (RUNTIME),
 *                                 then, for fakecupti_sync, the Synchronization2 record
 *   per-device buffer             the GPU record (Kernel10, Memcpy6, Memset4) with the same
 *                                 correlation id as the API record
 *
 * Only enabled kinds are written (cuptiActivityEnable). Records are packed at sizeof the
 * kind's struct, the stride the real cuptiActivityGetNextRecord uses (the conformance test
 * checks this against the real library). A buffer is completed (complete callback) when the
 * next record does not fit, or by cuptiActivityFlushAll, which completes every buffer holding
 * records synchronously on the calling thread. A declined request (NULL buffer) drops the
 * record and counts it (cuptiActivityGetNumDroppedRecords returns and resets the count).
 *
 * Kernel names are owned by the fake: each record gets its own copy, which stays valid until
 * the library hands that buffer's memory out again through the request callback (it is then
 * done decoding it), at cuptiFinalize, or at exit; then the copy is overwritten and freed, so
 * a dereference after the buffer was recycled reads garbage (and ASan reports it).
 *
 * Environment (read once, at load):
 *   FAKECUPTI_VERSION=<n>       cuptiGetVersion's answer (default 130001)
 *   FAKECUPTI_ASYNC=1           full buffers are completed on a separate "CUPTI worker" thread
 *                               (FlushAll still completes the rest synchronously, after that
 *                               thread has delivered what it holds)
 *   FAKECUPTI_FAIL_ENABLE=<rc>  cuptiActivityEnable fails with that CUptiResult
 *   FAKECUPTI_INCOMPLETE=<n>    every n-th kernel gets start = end = completed = 0
 *
 * Thread-safety: every function may be called from any thread. Timestamps are CLOCK_REALTIME
 * ns, CUPTI's default time source on Linux.
 */
#ifndef FAKECUPTI_H
#define FAKECUPTI_H

#include <stdint.h>

#include <cupti.h>

#define FAKECUPTI_DEFAULT_VERSION 130001u
#define FAKECUPTI_MAX_KIND        64 /* CUpti_ActivityKind values tracked (enum ends at 55) */
#define FAKECUPTI_MAX_DEVICES     16 /* device ids >= this share buffer (id % 16) */

/* Bits of fakecupti_last_written(). */
#define FAKECUPTI_W_API     1u /* the API record went into a buffer */
#define FAKECUPTI_W_GPU     2u /* the GPU-side record (kernel/memcpy/memset/sync) did */
#define FAKECUPTI_W_EXTCORR 4u /* at least one external correlation record did */
#define FAKECUPTI_W_DROPPED 8u /* some enabled record was dropped (buffer declined) */

/*
 * Timing shared by the emission structs: if start_ns and end_ns are both 0, the GPU record
 * gets start = now + start_offset_ns (default 1000) and end = start + duration_ns (default
 * 5000); otherwise start_ns/end_ns are used as given.
 */
struct fakecupti_timing {
    int64_t start_ns, end_ns;
    int64_t start_offset_ns, duration_ns;
};

struct fakecupti_kernel {
    const char *name; /* borrowed: the fake copies it */
    uint32_t device, context, stream;
    int32_t grid_x, grid_y, grid_z;
    int32_t block_x, block_y, block_z;
    uint16_t registers;
    int32_t static_smem, dynamic_smem;
    uint64_t graph_node_id; /* 0: not from a graph */
    uint32_t graph_id;
    struct fakecupti_timing t;
};

struct fakecupti_memcpy {
    uint8_t copy_kind;          /* CUpti_ActivityMemcpyKind */
    uint8_t src_kind, dst_kind; /* CUpti_ActivityMemoryKind */
    uint64_t bytes;
    uint32_t device, context, stream;
    struct fakecupti_timing t;
};

struct fakecupti_memset {
    uint32_t value;
    uint16_t mem_kind; /* CUpti_ActivityMemoryKind */
    uint64_t bytes;
    uint32_t device, context, stream;
    struct fakecupti_timing t;
};

struct fakecupti_sync {
    uint32_t type; /* CUpti_ActivitySynchronizationType; 0: STREAM_SYNCHRONIZE */
    uint32_t context, stream, cuda_event;
    struct fakecupti_timing t;
};

/*
 * A cudaLaunchKernel: external correlation records, the RUNTIME API record
 * (CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, start/end around this call, threadId per
 * cuptiSetThreadIdType: gettid() for SYSTEM, else (uint32_t) pthread_self()) and the
 * CONCURRENT_KERNEL record (or KERNEL if only that kind is enabled). Returns the correlation
 * id (a new process-wide id, also when nothing is enabled).
 */
uint32_t fakecupti_launch_kernel(const struct fakecupti_kernel *k);

/* A cudaMemcpyAsync: API record (cbid cudaMemcpyAsync_v3020) and Memcpy6 (kind MEMCPY). */
uint32_t fakecupti_memcpy(const struct fakecupti_memcpy *m);

/* A cudaMemsetAsync: API record (cbid cudaMemsetAsync_v3020) and Memset4 (kind MEMSET). */
uint32_t fakecupti_memset(const struct fakecupti_memset *m);

/* A cudaStreamSynchronize: API record (cbid cudaStreamSynchronize_v3020), then the
 * Synchronization2 record (kind SYNCHRONIZATION) in the same thread buffer. */
uint32_t fakecupti_sync(const struct fakecupti_sync *s);

/* A CUPTI overhead record (Overhead3, kind OVERHEAD, object = this thread) of the given
 * CUpti_ActivityOverheadKind from start_ns to end_ns. Returns 1 if written, else 0. */
int fakecupti_overhead(uint32_t overhead_kind, int64_t start_ns, int64_t end_ns);

/* FAKECUPTI_W_* bits for the calling thread's last emission call. */
uint32_t fakecupti_last_written(void);

/* Bit k set while CUpti_ActivityKind k (< 64) is enabled. 0 while the library is dormant. */
uint64_t fakecupti_enabled_kinds(void);

/* Number of cuptiActivityEnable calls so far (successful or not). */
uint64_t fakecupti_enable_calls(void);

/* Depth of the calling thread's external correlation stack of that kind, -1 for a bad kind. */
int fakecupti_ext_depth(CUpti_ExternalCorrelationKind kind);

/* 1 if API records of this runtime cbid are written while RUNTIME is enabled (not switched
 * off with cuptiActivityEnableRuntimeApi(cbid, 0)). */
int fakecupti_runtime_cbid_enabled(uint32_t cbid);

/* The value last set with cuptiActivitySetAttribute (0 if never set); *was_set tells. */
uint64_t fakecupti_attribute(CUpti_ActivityAttribute attr, int *was_set);

/* Overrides FAKECUPTI_FAIL_ENABLE (0: enabling succeeds) and FAKECUPTI_INCOMPLETE (0: off). */
void fakecupti_set_fail_enable(CUptiResult rc);
void fakecupti_set_incomplete_every(uint32_t n);

struct fakecupti_stats {
    uint64_t records[FAKECUPTI_MAX_KIND]; /* written into a buffer, per CUpti_ActivityKind */
    uint64_t records_total;
    uint64_t dropped;           /* all drops so far (cuptiActivityGetNumDroppedRecords resets
                                 * only its own count) */
    uint64_t buffers_requested; /* request callback calls */
    uint64_t buffers_declined;  /* requests answered with NULL (or too small) */
    uint64_t buffers_completed; /* complete callback calls */
    uint64_t names_freed;       /* kernel names poisoned and freed after their buffer came back */
    uint64_t enable_calls, disable_calls, flush_calls;
    uint32_t enabled_kinds;  /* number of kinds enabled now */
    uint32_t registered;     /* 1 once cuptiActivityRegisterCallbacks succeeded */
    uint32_t thread_id_type; /* last cuptiSetThreadIdType (CUpti_ActivityThreadIdType) */
    uint32_t pad;
};

/* Copies the counters. */
void fakecupti_stats(struct fakecupti_stats *out);

#endif
