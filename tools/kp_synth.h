/*
 * kp_synth: a deterministic generator of synthetic PyTorch DDP traffic, as kprof batches.
 *
 * One generator is one rank of a data-parallel job. For each step it produces what CUPTI and
 * PyTorch's NVTX/Kineto ranges would report for an MLP-block model trained with DDP:
 *  - a data-loading gap (a user annotation on the main thread, GPU idle), then the input's
 *    host-to-device copy (aten::to → aten::_to_copy → aten::copy_ → cudaMemcpyAsync → memcpy);
 *  - forward ops per block (aten::linear → aten::addmm, aten::gelu, aten::native_dropout, ...)
 *    with autograd sequence numbers, input shapes and dtypes, each leaf op launching one
 *    kernel (cudaLaunchKernel on the main thread, the kernel on the compute stream);
 *  - a memset (DDP zeroing its bucket) and the backward ops on the autograd thread
 *    ("autograd::engine::evaluate_function: AddmmBackward0" → AddmmBackward0 → aten::mm ...),
 *    with fwd_tid and the forward op's seq;
 *  - one NCCL allreduce per gradient bucket (nccl:all_reduce → record_param_comms → the
 *    ncclDevKernel on the communication stream) and its host-side collective row;
 *  - a cudaStreamWaitEvent (sync row) before the optimizer, the optimizer's foreach kernels,
 *    loss.item() (a device-to-host copy and a cudaStreamSynchronize, sync row), two counter
 *    rows for the first GEMM, a ProfilerStep#N op and a step row;
 *  - caching-allocator events (memory_events): each forward op allocates its activation,
 *    backward frees the newest one, and what is left is freed after the optimizer.
 * Kernels carry grid, block, registers and shared memory; correlation links a kernel (or
 * copy, memset) to its API call, external_id links both to the innermost op (op_id).
 *
 * Time model: every rank runs the same base timeline, stretched by its compute slowdown and
 * shifted by its data-loading gap; the allreduce of each bucket ends, on every rank, when the
 * slowest rank's gradients are ready plus the transfer time. So a straggler shows up as
 * longer compute on its own rank and longer NCCL kernels (waiting) on all the others; a slow
 * data loader shows up as a longer gap at the start of its steps. Each generator computes
 * every rank's schedule (O(world_size) per bucket), so separate generators (threads,
 * processes) agree on the cross-rank timeline without talking to each other.
 *
 * Determinism: the same options give byte-identical batches. Rows go into batches of about
 * batch_rows rows (cut between groups of a few rows; the ProfilerStep op and step row of a
 * step may land in a later batch than its kernels), each with its own string table (index 0
 * is ""), start_ns delta-encoded from base_ns. rank_info and the device go in the first batch.
 *
 * Thread-safety: one generator per thread; separate generators share nothing.
 */
#ifndef KP_SYNTH_H
#define KP_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "kp_codec.h"
#include "kprof.pb-c.h"

struct kp_synth;

#define KP_SYNTH_DEFAULT_KERNELS_PER_STEP 200
#define KP_SYNTH_DEFAULT_BATCH_ROWS       4000
#define KP_SYNTH_DEFAULT_START_NS         1700000000000000000LL /* 2023-11-14T22:13:20Z */
#define KP_SYNTH_MIN_KERNELS_PER_STEP     4
#define KP_SYNTH_MAX_KERNELS_PER_STEP     100000
#define KP_SYNTH_MIN_BATCH_ROWS           64
#define KP_SYNTH_MAX_BATCH_ROWS           (1u << 20)
#define KP_SYNTH_MAX_WORLD_SIZE           65536

struct kp_synth_opts {
    uint64_t seed;
    uint32_t rank;                   /* < world_size */
    uint32_t world_size;             /* 1..KP_SYNTH_MAX_WORLD_SIZE */
    int64_t first_step;              /* number of the first step (>= 0) */
    uint32_t n_steps;                /* steps to generate */
    uint32_t kernels_per_step;       /* compute kernels per step, NCCL excluded; 0: default */
    uint32_t batch_rows;             /* target rows per batch; 0: default */
    const double *compute_slowdown;  /* world_size factors in [0.1, 100] (borrowed, copied by
                                      * create); 1.0 = nominal; NULL: all 1.0 */
    const double *dataload_slowdown; /* the same for the data-loading gap */
    int64_t start_ns;                /* CLOCK_REALTIME ns of the first step's start; 0: default */
    uint64_t run_id;                 /* copied into every batch (stream and seq stay 0) */
    const char *job;                 /* rank_info.job (copied); NULL: "synthetic" */
};

/* The generator's shape as the command-line flags of kprof-loadgen and bench/ingest's COPY
 * baseline give it (kp_config integers; the flags' ranges keep them within the opts'). */
struct kp_synth_flags {
    long long seed, ranks, first_step, steps, kernels_per_step, batch_rows;
};

/* Fills *so (all of it: the rest zero) for rank `rank` of the job the flags describe. */
void kp_synth_opts_from_flags(struct kp_synth_opts *so, const struct kp_synth_flags *f,
                              uint32_t rank, uint64_t run_id, const char *job);

/*
 * What the generator has produced so far, per event kind (kp_event_kinds order), counted as
 * rows are generated (a step at a time, independently of the batch encoding): mid-way they
 * may run ahead of the batches returned by up to a batch or so; once kp_synth_next has
 * returned 0 they equal the sums over all returned batches (what a database should hold).
 */
struct kp_synth_totals {
    uint64_t batches;
    uint64_t steps; /* steps completed */
    uint64_t rows[KP_EV_COUNT];
    uint64_t dur_ns[KP_EV_COUNT]; /* sum of dur_ns; 0 for counters, which have none */
    uint64_t all_rows;
};

/* Creates a generator. Returns 0 and *out (kp_synth_destroy), -EINVAL for bad options, or
 * -ENOMEM. */
int kp_synth_create(const struct kp_synth_opts *opts, struct kp_synth **out);

/*
 * Produces the next batch: returns 1 and *out, 0 when all steps have been emitted, or
 * -ENOMEM (after which the generator is only fit for kp_synth_destroy). The batch is
 * borrowed: it stays valid, and the caller may change its header fields (run_id, rank,
 * stream, seq), until the next call or kp_synth_destroy.
 */
int kp_synth_next(struct kp_synth *s, Kprof__V1__Batch **out);

/* The totals (see struct kp_synth_totals). Borrowed, updated by kp_synth_next. */
const struct kp_synth_totals *kp_synth_totals(const struct kp_synth *s);

/* Adds b's rows and dur_ns sums into t (batches += 1). Tests use it to re-count batches. */
void kp_synth_count(const Kprof__V1__Batch *b, struct kp_synth_totals *t);

/* Frees the generator. Accepts NULL. */
void kp_synth_destroy(struct kp_synth *s);

#endif
