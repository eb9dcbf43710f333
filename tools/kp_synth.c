/*
 * kp_synth: synthetic DDP traffic (see kp_synth.h for the model).
 *
 * How it is built:
 *  - Rows are first written to "pending" tables (one protobuf message per kind whose repeated
 *    fields grow together), with absolute start_ns and names as ids into the generator's
 *    string pool. A whole step is simulated at a time; after each small group of rows (an op
 *    with its API call and kernel, a bucket's allreduce, ...) a checkpoint records the row
 *    counts, and batches are cut only at checkpoints.
 *  - kp_synth_next copies the rows up to the first checkpoint at or past batch_rows into the
 *    output messages, delta-encodes start_ns from base_ns, maps pool ids to the batch's own
 *    string table, and on the next call shifts the pending rows down.
 *  - Every rank simulates the same base timeline (durations drawn from hash(seed, step, i),
 *    independent of the rank) and maps a base time t to origin_rank + f_rank * t. Because the
 *    mapping is monotone and linear, a rank's bucket-ready times and step end follow from a
 *    few base figures, which is how each generator knows every other rank's schedule.
 *    Rank-specific noise only shortens reported durations, so nesting and causality hold.
 */
#include "kp_synth.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_batch_builder.h"

#define STEP_NAME_FLAG 0x80000000u /* pending name id of "ProfilerStep#<first_step + low bits>" */

/* CUPTI constants (cupti_activity.h, cupti_runtime_cbid.h). */
#define CBID_MEMCPY_ASYNC      41
#define CBID_MEMSET_ASYNC      51
#define CBID_STREAM_SYNC       131
#define CBID_STREAM_WAIT_EVENT 147
#define CBID_LAUNCH_KERNEL     211
#define MEMCPY_HTOD            1
#define MEMCPY_DTOH            2
#define MEM_PAGEABLE           1
#define MEM_PINNED             2
#define MEM_DEVICE             3
#define SYNC_STREAM_WAIT_EVENT 2
#define SYNC_STREAM_SYNC       3

#define STREAM_COMPUTE 7
#define STREAM_COMM    13
#define CONTEXT_ID     1

/* The caching allocator: activations live at MEM_BASE + i * act stride (LIFO), and the
 * reserved pool grows in MEM_SEGMENT steps and never shrinks. c10::DeviceType CUDA = 1. */
#define MEM_BASE        0x7f3a00000000ULL
#define MEM_ALIGN       512
#define MEM_SEGMENT     (20LL << 20)
#define MEM_DEVICE_CUDA 1

enum sid {
    S_NONE = 0,
    S_DATALOADER,
    S_DDP_FORWARD,
    S_ATEN_TO,
    S_ATEN_TO_COPY,
    S_ATEN_COPY,
    S_ATEN_LINEAR,
    S_ATEN_ADDMM,
    S_ATEN_GELU,
    S_ATEN_DROPOUT,
    S_ATEN_NATIVE_DROPOUT,
    S_ATEN_ADD,
    S_ATEN_LAYER_NORM,
    S_ATEN_NATIVE_LAYER_NORM,
    S_ATEN_MUL,
    S_ATEN_ZERO,
    S_EV_LN_BWD,
    S_LN_BWD,
    S_ATEN_LN_BWD,
    S_EV_DROPOUT_BWD,
    S_DROPOUT_BWD,
    S_ATEN_DROPOUT_BWD,
    S_EV_ADDMM_BWD,
    S_ADDMM_BWD,
    S_ATEN_MM,
    S_ATEN_SUM,
    S_EV_GELU_BWD,
    S_GELU_BWD,
    S_ATEN_GELU_BWD,
    S_EV_ACCUM,
    S_ACCUM,
    S_NCCL_ALLREDUCE,
    S_RECORD_PARAM_COMMS,
    S_OPTIMIZER_STEP,
    S_FOREACH_ADD,
    S_ATEN_ITEM,
    S_LOCAL_SCALAR_DENSE,
    S_CUDA_LAUNCH_KERNEL,
    S_CUDA_MEMCPY_ASYNC,
    S_CUDA_MEMSET_ASYNC,
    S_CUDA_STREAM_SYNC,
    S_CUDA_STREAM_WAIT_EVENT,
    S_K_GEMM_FWD1,
    S_K_GEMM_FWD2,
    S_K_GEMM_DGRAD,
    S_K_GEMM_WGRAD,
    S_K_LN_FWD,
    S_K_LN_BWD_DX,
    S_K_LN_BWD_DW,
    S_K_GELU_FWD,
    S_K_GELU_BWD,
    S_K_DROPOUT_FWD,
    S_K_DROPOUT_BWD,
    S_K_ADD,
    S_K_MUL,
    S_K_SUM,
    S_K_FOREACH,
    S_K_NCCL,
    S_ALLREDUCE,
    S_FLOAT,
    S_DEFAULT_PG,
    S_M_SM_THROUGHPUT,
    S_M_DRAM_BYTES,
    S_MEMORY,
    /* built at create from the model's sizes */
    S_SH_TO,
    S_SH_ADDMM1,
    S_SH_ADDMM2,
    S_SH_ACT_4H,
    S_SH_ACT_H,
    S_SH_ADD,
    S_SH_LN,
    S_SH_MUL,
    S_SH_FOREACH,
    S_SH_ITEM,
    S_SH_ZERO,
    S_DT_1,
    S_DT_2,
    S_DT_ADDMM,
    S_DT_LN,
    S_DT_TO,
    S_DT_LIST,
    S_DT_ITEM,
    S_COUNT
};

#define S_FIRST_BUILT S_SH_TO

static const char *const fixed_strings[S_FIRST_BUILT] = {
    [S_NONE] = "",
    [S_DATALOADER] = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
    [S_DDP_FORWARD] = "DistributedDataParallel.forward",
    [S_ATEN_TO] = "aten::to",
    [S_ATEN_TO_COPY] = "aten::_to_copy",
    [S_ATEN_COPY] = "aten::copy_",
    [S_ATEN_LINEAR] = "aten::linear",
    [S_ATEN_ADDMM] = "aten::addmm",
    [S_ATEN_GELU] = "aten::gelu",
    [S_ATEN_DROPOUT] = "aten::dropout",
    [S_ATEN_NATIVE_DROPOUT] = "aten::native_dropout",
    [S_ATEN_ADD] = "aten::add",
    [S_ATEN_LAYER_NORM] = "aten::layer_norm",
    [S_ATEN_NATIVE_LAYER_NORM] = "aten::native_layer_norm",
    [S_ATEN_MUL] = "aten::mul",
    [S_ATEN_ZERO] = "aten::zero_",
    [S_EV_LN_BWD] = "autograd::engine::evaluate_function: NativeLayerNormBackward0",
    [S_LN_BWD] = "NativeLayerNormBackward0",
    [S_ATEN_LN_BWD] = "aten::native_layer_norm_backward",
    [S_EV_DROPOUT_BWD] = "autograd::engine::evaluate_function: NativeDropoutBackward0",
    [S_DROPOUT_BWD] = "NativeDropoutBackward0",
    [S_ATEN_DROPOUT_BWD] = "aten::native_dropout_backward",
    [S_EV_ADDMM_BWD] = "autograd::engine::evaluate_function: AddmmBackward0",
    [S_ADDMM_BWD] = "AddmmBackward0",
    [S_ATEN_MM] = "aten::mm",
    [S_ATEN_SUM] = "aten::sum",
    [S_EV_GELU_BWD] = "autograd::engine::evaluate_function: GeluBackward0",
    [S_GELU_BWD] = "GeluBackward0",
    [S_ATEN_GELU_BWD] = "aten::gelu_backward",
    [S_EV_ACCUM] = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
    [S_ACCUM] = "torch::autograd::AccumulateGrad",
    [S_NCCL_ALLREDUCE] = "nccl:all_reduce",
    [S_RECORD_PARAM_COMMS] = "record_param_comms",
    [S_OPTIMIZER_STEP] = "Optimizer.step#SGD.step",
    [S_FOREACH_ADD] = "aten::_foreach_add_",
    [S_ATEN_ITEM] = "aten::item",
    [S_LOCAL_SCALAR_DENSE] = "aten::_local_scalar_dense",
    [S_CUDA_LAUNCH_KERNEL] = "cudaLaunchKernel",
    [S_CUDA_MEMCPY_ASYNC] = "cudaMemcpyAsync",
    [S_CUDA_MEMSET_ASYNC] = "cudaMemsetAsync",
    [S_CUDA_STREAM_SYNC] = "cudaStreamSynchronize",
    [S_CUDA_STREAM_WAIT_EVENT] = "cudaStreamWaitEvent",
    [S_K_LN_FWD] =
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)",
    [S_K_LN_BWD_DX] =
        "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float>(float const*, float const*, float const*, float const*, float const*, float*, int)",
    [S_K_LN_BWD_DW] =
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float, float>(long, long, float const*, float const*, float const*, float const*, float*, float*)",
    [S_K_GELU_FWD] =
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)",
    [S_K_GELU_BWD] =
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float, float)#1}, at::detail::Array<char*, 3>)",
    [S_K_DROPOUT_FWD] =
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>(at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<bool, unsigned int>, unsigned int, float, at::PhiloxCudaState)",
    [S_K_DROPOUT_BWD] =
        "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::masked_scale_kernel<bool, float, float>(at::Tensor&, at::Tensor const&, at::Tensor const&, float)::{lambda(float, bool)#1}, at::detail::Array<char*, 3> >(int, at::native::(anonymous namespace)::masked_scale_kernel<bool, float, float>(at::Tensor&, at::Tensor const&, at::Tensor const&, float)::{lambda(float, bool)#1}, at::detail::Array<char*, 3>)",
    [S_K_ADD] =
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    [S_K_MUL] =
        "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2> >(int, at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2>)",
    [S_K_SUM] =
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)",
    [S_K_FOREACH] =
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)",
    [S_K_NCCL] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    [S_ALLREDUCE] = "allreduce",
    [S_FLOAT] = "Float",
    [S_DEFAULT_PG] = "default_pg",
    [S_M_SM_THROUGHPUT] = "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    [S_M_DRAM_BYTES] = "dram__bytes_read.sum",
    [S_MEMORY] = "[memory]",
};

/* The GEMMs differ by device profile: 0 = V100 in fp32, 1 = A100 with autocast to fp16. */
static const char *const gemm_names[2][4] = {
    { "volta_sgemm_128x64_nn", "volta_sgemm_64x64_nn", "volta_sgemm_64x64_nt",
      "volta_sgemm_32x128_tn" },
    { "ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_nn",
      "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
      "ampere_fp16_s16816gemm_fp16_128x256_ldg8_f2f_stages_64x3_nt",
      "void cutlass::Kernel<cutlass_80_tensorop_f16_s16816gemm_f16_128x128_32x5_tn_align8>(cutlass_80_tensorop_f16_s16816gemm_f16_128x128_32x5_tn_align8::Params)" },
};

struct profile {
    const char *device_name;
    uint32_t sm_count, cc_major, cc_minor, clock_khz, smem_per_sm;
    uint64_t memory_bytes, bandwidth;
    uint32_t hidden;   /* model width h */
    uint32_t tokens;   /* rows of the activations (batch * sequence) */
    const char *dtype; /* of the GEMM inputs */
};

static const struct profile profiles[2] = {
    { "Tesla V100-SXM2-32GB", 80, 7, 0, 1530000, 98304, 34079637504ULL, 898048000000ULL, 512, 2048,
      "float" },
    { "NVIDIA A100-SXM4-80GB", 108, 8, 0, 1410000, 167936, 85198045184ULL, 2039000000000ULL, 1024,
      2048, "c10::Half" },
};

/* Kernel kinds of the model. */
enum ktype {
    KT_GEMM_FWD1,
    KT_GEMM_FWD2,
    KT_GEMM_DGRAD,
    KT_GEMM_WGRAD,
    KT_LN_FWD,
    KT_LN_BWD_DX,
    KT_LN_BWD_DW,
    KT_GELU_FWD,
    KT_GELU_BWD,
    KT_DROPOUT_FWD,
    KT_DROPOUT_BWD,
    KT_ADD,
    KT_MUL,
    KT_SUM,
    KT_FOREACH,
    KT_NCCL,
    KT_COUNT
};

struct kdef {
    enum sid name;
    uint32_t mean_ns;
    uint32_t grid[3], block[3];
    uint32_t registers, static_smem, dynamic_smem;
};

static const struct kdef kdefs[KT_COUNT] = {
    [KT_GEMM_FWD1] = { S_K_GEMM_FWD1, 180000, { 16, 32, 1 }, { 256, 1, 1 }, 126, 32768, 0 },
    [KT_GEMM_FWD2] = { S_K_GEMM_FWD2, 170000, { 32, 8, 1 }, { 256, 1, 1 }, 120, 16384, 0 },
    [KT_GEMM_DGRAD] = { S_K_GEMM_DGRAD, 175000, { 32, 16, 1 }, { 128, 1, 1 }, 128, 16384, 0 },
    [KT_GEMM_WGRAD] = { S_K_GEMM_WGRAD, 190000, { 64, 4, 1 }, { 256, 1, 1 }, 168, 0, 73728 },
    [KT_LN_FWD] = { S_K_LN_FWD, 14000, { 2048, 1, 1 }, { 128, 1, 1 }, 30, 0, 0 },
    [KT_LN_BWD_DX] = { S_K_LN_BWD_DX, 18000, { 2048, 1, 1 }, { 128, 1, 1 }, 40, 0, 0 },
    [KT_LN_BWD_DW] = { S_K_LN_BWD_DW, 16000, { 16, 1, 1 }, { 32, 32, 1 }, 64, 8448, 0 },
    [KT_GELU_FWD] = { S_K_GELU_FWD, 38000, { 8192, 1, 1 }, { 128, 1, 1 }, 24, 0, 0 },
    [KT_GELU_BWD] = { S_K_GELU_BWD, 52000, { 8192, 1, 1 }, { 128, 1, 1 }, 28, 0, 0 },
    [KT_DROPOUT_FWD] = { S_K_DROPOUT_FWD, 21000, { 320, 1, 1 }, { 256, 1, 1 }, 32, 0, 0 },
    [KT_DROPOUT_BWD] = { S_K_DROPOUT_BWD, 15000, { 2048, 1, 1 }, { 128, 1, 1 }, 22, 0, 0 },
    [KT_ADD] = { S_K_ADD, 13000, { 2048, 1, 1 }, { 128, 1, 1 }, 20, 0, 0 },
    [KT_MUL] = { S_K_MUL, 9000, { 2048, 1, 1 }, { 128, 1, 1 }, 16, 0, 0 },
    [KT_SUM] = { S_K_SUM, 11000, { 4, 16, 1 }, { 32, 16, 1 }, 32, 16, 0 },
    [KT_FOREACH] = { S_K_FOREACH, 65000, { 320, 1, 1 }, { 512, 1, 1 }, 38, 0, 0 },
    [KT_NCCL] = { S_K_NCCL, 0, { 16, 1, 1 }, { 640, 1, 1 }, 96, 41744, 0 },
};

/* A row group boundary: the pending row count of every kind. */
struct checkpoint {
    size_t rows[KP_EV_COUNT];
};

/* An open op range; its row is written when it closes (start and end in absolute ns). */
struct frame {
    uint64_t id;
    int64_t start;
    uint32_t name;
    uint32_t kind;
    uint64_t tid;
    uint64_t parent;
    int64_t seq;
    uint64_t fwd_tid;
    uint32_t shapes, dtypes;
};

/* Per-block autograd sequence numbers, for the backward ops. */
struct block_seq {
    int64_t ln, dropout, addmm2, gelu, addmm1, add;
};

struct kp_synth {
    struct kp_synth_opts o;
    const struct profile *prof;
    uint32_t kernels_per_step, batch_rows;
    uint32_t n_blocks, n_extra, n_opt, blocks_per_bucket, n_buckets;
    char *job;
    const char *pool[S_COUNT];
    char *owned[S_COUNT];

    /* cross-rank schedule */
    double *slow, *dlslow; /* per rank */
    int64_t *t0;           /* per rank: start of the current step */
    double *f;             /* per rank, this step */
    int64_t *origin;       /* per rank, this step (then: optimizer phase origin) */
    uint64_t *bucket_nelems;

    /* the step being simulated */
    int64_t step;      /* next step to simulate */
    int64_t step_end;  /* one past the last */
    uint64_t bi;       /* base draw counter within the step */
    uint64_t rstate;   /* rank noise state */
    int64_t my_origin; /* base time 0 of this rank */
    double my_f;
    int64_t cpu_main, cpu_bwd, gpu; /* base-time cursors */
    int64_t comm_end;               /* absolute: last allreduce end */
    uint64_t next_op_id, next_corr, next_coll_seq, next_event;
    int64_t next_aseq;
    uint32_t first_gemm_corr_done;
    struct block_seq *bseq;
    bool nomem;
    uint32_t mem_live;                   /* activations allocated and not yet freed */
    int64_t mem_allocated, mem_reserved; /* the allocator's totals, bytes */

    /* pending rows, in the builder (a batch takes those up to a checkpoint); its tables */
    struct kp_batch_builder *bb;
    Kprof__V1__Kernels *p_kernels;
    Kprof__V1__Memcpys *p_memcpys;
    Kprof__V1__Memsets *p_memsets;
    Kprof__V1__ApiCalls *p_api;
    Kprof__V1__Ops *p_ops;
    Kprof__V1__Steps *p_steps;
    Kprof__V1__Counters *p_counters;
    Kprof__V1__Collectives *p_colls;
    Kprof__V1__Syncs *p_syncs;
    Kprof__V1__MemoryEvents *p_memory;
    struct checkpoint *cps;
    size_t n_cps, cap_cps;
    size_t cut_cp; /* checkpoints consumed by the batch handed out, to shift on next call */
    bool have_out;

    /* the batch handed out (the builder's) */
    uint32_t xlat[S_COUNT];
    uint64_t xlat_epoch[S_COUNT];
    Kprof__V1__RankInfo rank_info;
    Kprof__V1__Device device;
    Kprof__V1__Device *devices[1];
    char host[64];

    struct kp_synth_totals totals;
};

/* --- randomness --- */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

static double u01(uint64_t x)
{
    return (double) (x >> 11) * (1.0 / 9007199254740992.0);
}

/* A draw of the base timeline: the same on every rank. */
static double base_u(struct kp_synth *s)
{
    return u01(hash4(s->o.seed, 0xba5e, (uint64_t) s->step, s->bi++));
}

/* A rank's own draw (reported-duration noise, counter values). */
static double rank_u(struct kp_synth *s)
{
    s->rstate += 0x9e3779b97f4a7c15ULL;
    return u01(mix64(s->rstate));
}

/* base ns: mean * [1 - spread, 1 + spread) */
static int64_t base_dur(struct kp_synth *s, double mean, double spread)
{
    return (int64_t) (mean * (1.0 - spread + 2.0 * spread * base_u(s)));
}

/* --- the time mapping --- */

static int64_t map_t(int64_t origin, double f, int64_t t)
{
    return origin + (int64_t) (f * (double) t);
}

static int64_t ab(const struct kp_synth *s, int64_t t)
{
    return map_t(s->my_origin, s->my_f, t);
}

/* --- pending rows --- */

/* Appends a zeroed row of kind k; returns its index. On ENOMEM, flags the generator and
 * returns the last row (overwritten; the step is thrown away by the caller): create reserved
 * room, so there is one. */
static size_t row_add(struct kp_synth *s, enum kp_event_kind k)
{
    long i = kp_batch_builder_add(s->bb, k, 1);

    if (i < 0) {
        s->nomem = true;
        return kp_batch_builder_rows(s->bb, k) - 1;
    }
    s->totals.rows[k]++;
    s->totals.all_rows++;
    return (size_t) i;
}

static void add_dur(struct kp_synth *s, enum kp_event_kind k, int64_t dur)
{
    s->totals.dur_ns[k] += (uint64_t) dur;
}

static void checkpoint(struct kp_synth *s)
{
    if (s->n_cps == s->cap_cps) {
        size_t ncap = s->cap_cps ? s->cap_cps * 2 : 1024;
        struct checkpoint *p = realloc(s->cps, ncap * sizeof(*p));

        if (p == NULL) {
            s->nomem = true;
            return;
        }
        s->cps = p;
        s->cap_cps = ncap;
    }
    for (int k = 0; k < KP_EV_COUNT; k++) {
        s->cps[s->n_cps].rows[k] = kp_batch_builder_rows(s->bb, (enum kp_event_kind) k);
    }
    s->n_cps++;
}

/* --- rows --- */

static void dur_noise(struct kp_synth *s, int64_t *dur)
{
    /* Shorten by up to 2%: keeps every row inside its slot. */
    *dur -= (int64_t) ((double) *dur * 0.02 * rank_u(s));
}

static void op_open(struct kp_synth *s, struct frame *fr, int64_t start_abs, enum sid name,
                    uint32_t kind, uint64_t tid, uint64_t parent)
{
    memset(fr, 0, sizeof(*fr));
    fr->id = s->next_op_id++;
    fr->start = start_abs;
    fr->name = name;
    fr->kind = kind;
    fr->tid = tid;
    fr->parent = parent;
    fr->seq = -1;
}

static void op_close(struct kp_synth *s, const struct frame *fr, int64_t end_abs)
{
    Kprof__V1__Ops *o = s->p_ops;
    size_t i = row_add(s, KP_EV_OP);
    int64_t dur = end_abs - fr->start;

    o->start_ns[i] = fr->start;
    o->dur_ns[i] = (uint64_t) dur;
    o->name[i] = fr->name;
    o->kind[i] = fr->kind;
    o->tid[i] = fr->tid;
    o->op_id[i] = fr->id;
    o->parent_id[i] = fr->parent;
    o->seq[i] = fr->seq;
    o->fwd_tid[i] = fr->fwd_tid;
    o->input_shapes[i] = fr->shapes;
    o->input_dtypes[i] = fr->dtypes;
    o->external_id[i] = fr->id;
    o->step[i] = (int32_t) s->step;
    add_dur(s, KP_EV_OP, dur);
}

static uint64_t pid_of(const struct kp_synth *s)
{
    return 4000 + 31ULL * s->o.rank;
}

static uint64_t tid_main(const struct kp_synth *s)
{
    return pid_of(s);
}

static uint64_t tid_bwd(const struct kp_synth *s)
{
    return pid_of(s) + 7;
}

/* An API call on the CPU cursor *cpu (base time), advancing it. Returns the correlation id
 * and the base time at which the GPU may start the work. */
static uint64_t api_call(struct kp_synth *s, int64_t *cpu, enum sid name, uint32_t cbid,
                         uint64_t tid, uint64_t ext, double mean_ns, int64_t *gpu_ready)
{
    Kprof__V1__ApiCalls *a = s->p_api;
    int64_t d = base_dur(s, mean_ns, 0.3);
    int64_t st = ab(s, *cpu), en = ab(s, *cpu + d);
    size_t i = row_add(s, KP_EV_API);
    uint64_t corr = s->next_corr++;

    a->start_ns[i] = st;
    a->dur_ns[i] = (uint64_t) (en - st);
    a->domain[i] = KPROF__V1__API_DOMAIN__API_DOMAIN_RUNTIME;
    a->cbid[i] = cbid;
    a->name[i] = name;
    a->tid[i] = tid;
    a->correlation[i] = corr;
    a->external_id[i] = ext;
    a->return_value[i] = 0;
    a->step[i] = (int32_t) s->step;
    add_dur(s, KP_EV_API, en - st);
    if (gpu_ready != NULL) {
        *gpu_ready = *cpu + d * 6 / 10;
    }
    *cpu += d;
    return corr;
}

/* A kernel row of kd at abs time st on stream. */
static void kernel_row(struct kp_synth *s, const struct kdef *kd, int64_t st, int64_t dur,
                       uint32_t stream, uint64_t corr, uint64_t ext)
{
    Kprof__V1__Kernels *k = s->p_kernels;
    size_t i = row_add(s, KP_EV_KERNEL);

    k->start_ns[i] = st;
    k->dur_ns[i] = (uint64_t) dur;
    k->name[i] = kd->name;
    k->device[i] = s->o.rank % 8;
    k->context[i] = CONTEXT_ID;
    k->stream[i] = stream;
    k->correlation[i] = corr;
    k->external_id[i] = ext;
    k->grid_x[i] = kd->grid[0];
    k->grid_y[i] = kd->grid[1];
    k->grid_z[i] = kd->grid[2];
    k->block_x[i] = kd->block[0];
    k->block_y[i] = kd->block[1];
    k->block_z[i] = kd->block[2];
    k->registers[i] = kd->registers;
    k->static_smem[i] = kd->static_smem;
    k->dynamic_smem[i] = kd->dynamic_smem;
    k->step[i] = (int32_t) s->step;
    add_dur(s, KP_EV_KERNEL, dur);
}

/* Launches a kernel of type kt from the CPU cursor *cpu on the compute stream. */
static uint64_t launch(struct kp_synth *s, int64_t *cpu, uint64_t tid, enum ktype kt, uint64_t ext)
{
    const struct kdef *kd = &kdefs[kt];
    int64_t ready, kst, kdur, st, dur;
    uint64_t corr;
    size_t i;

    corr = api_call(s, cpu, S_CUDA_LAUNCH_KERNEL, CBID_LAUNCH_KERNEL, tid, ext, 5500, &ready);
    kst = s->gpu + base_dur(s, 1800, 0.5);
    if (kst < ready) {
        kst = ready;
    }
    kdur = base_dur(s, kd->mean_ns, 0.1);
    s->gpu = kst + kdur;
    st = ab(s, kst);
    dur = ab(s, kst + kdur) - st;
    dur_noise(s, &dur);

    kernel_row(s, kd, st, dur, STREAM_COMPUTE, corr, ext);

    if (!s->first_gemm_corr_done && kt == KT_GEMM_FWD1) {
        Kprof__V1__Counters *c = s->p_counters;

        s->first_gemm_corr_done = 1;
        i = row_add(s, KP_EV_COUNTER);
        c->metric[i] = S_M_SM_THROUGHPUT;
        c->correlation[i] = corr;
        c->value[i] = 62.0 + 30.0 * rank_u(s) / (s->my_f > 1.0 ? s->my_f : 1.0);
        c->device[i] = s->o.rank % 8;
        i = row_add(s, KP_EV_COUNTER);
        c->metric[i] = S_M_DRAM_BYTES;
        c->correlation[i] = corr;
        c->value[i] = (double) (50331648 + (uint64_t) (4194304.0 * rank_u(s)));
        c->device[i] = s->o.rank % 8;
    }
    return corr;
}

/* A memcpy from the CPU cursor on the compute stream. */
static void memcpy_row(struct kp_synth *s, int64_t *cpu, uint64_t tid, uint64_t ext, uint64_t bytes,
                       uint32_t copy_kind, uint32_t src_kind, uint32_t dst_kind)
{
    Kprof__V1__Memcpys *m = s->p_memcpys;
    int64_t ready, st, dur, mst, mdur;
    uint64_t corr;
    size_t i;

    corr = api_call(s, cpu, S_CUDA_MEMCPY_ASYNC, CBID_MEMCPY_ASYNC, tid, ext, 7000, &ready);
    mst = s->gpu + 1500 > ready ? s->gpu + 1500 : ready;
    /* ~12 GB/s over PCIe, plus a fixed cost */
    mdur = 1800 + (int64_t) ((double) bytes / 12.0 * (0.95 + 0.1 * base_u(s)));
    s->gpu = mst + mdur;
    st = ab(s, mst);
    dur = ab(s, mst + mdur) - st;
    dur_noise(s, &dur);
    i = row_add(s, KP_EV_MEMCPY);
    m->start_ns[i] = st;
    m->dur_ns[i] = (uint64_t) dur;
    m->bytes[i] = bytes;
    m->copy_kind[i] = copy_kind;
    m->src_kind[i] = src_kind;
    m->dst_kind[i] = dst_kind;
    m->device[i] = s->o.rank % 8;
    m->context[i] = CONTEXT_ID;
    m->stream[i] = STREAM_COMPUTE;
    m->correlation[i] = corr;
    m->external_id[i] = ext;
    m->src_device[i] = s->o.rank % 8;
    m->dst_device[i] = s->o.rank % 8;
    m->step[i] = (int32_t) s->step;
    add_dur(s, KP_EV_MEMCPY, dur);
}

static void sync_row(struct kp_synth *s, int64_t st, int64_t en, uint32_t type, uint64_t corr,
                     uint32_t event)
{
    Kprof__V1__Syncs *y = s->p_syncs;
    size_t i = row_add(s, KP_EV_SYNC);

    y->start_ns[i] = st;
    y->dur_ns[i] = (uint64_t) (en - st);
    y->sync_type[i] = type;
    y->device[i] = s->o.rank % 8;
    y->context[i] = CONTEXT_ID;
    y->stream[i] = STREAM_COMPUTE;
    y->cuda_event[i] = event;
    y->correlation[i] = corr;
    y->step[i] = (int32_t) s->step;
    add_dur(s, KP_EV_SYNC, en - st);
}

/* An allocator event at abs time at on thread tid: bytes > 0 allocates, < 0 frees. */
static void mem_row(struct kp_synth *s, int64_t at, uint64_t tid, uint64_t addr, int64_t bytes)
{
    Kprof__V1__MemoryEvents *m = s->p_memory;
    size_t i = row_add(s, KP_EV_MEMORY);

    s->mem_allocated += bytes;
    if (s->mem_reserved < s->mem_allocated) {
        s->mem_reserved = (s->mem_allocated + MEM_SEGMENT - 1) / MEM_SEGMENT * MEM_SEGMENT;
    }
    m->start_ns[i] = at;
    m->name[i] = S_MEMORY;
    m->device_type[i] = MEM_DEVICE_CUDA;
    m->device[i] = (int32_t) (s->o.rank % 8);
    m->addr[i] = addr;
    m->bytes[i] = bytes;
    m->total_allocated[i] = (uint64_t) s->mem_allocated;
    m->total_reserved[i] = (uint64_t) s->mem_reserved;
    m->tid[i] = tid;
    m->step[i] = (int32_t) s->step;
}

/* The size of one activation (tokens x hidden floats), rounded up to the allocator's
 * alignment. */
static int64_t act_bytes(const struct kp_synth *s)
{
    int64_t n = (int64_t) s->prof->tokens * s->prof->hidden * 4;

    return (n + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
}

/* A forward op allocates its output activation... */
static void mem_alloc_act(struct kp_synth *s, int64_t at, uint64_t tid)
{
    uint64_t addr = MEM_BASE + (uint64_t) s->mem_live * (uint64_t) act_bytes(s);

    s->mem_live++;
    mem_row(s, at, tid, addr, act_bytes(s));
}

/* ...and the backward frees the newest one still alive (none: nothing happens). */
static void mem_free_act(struct kp_synth *s, int64_t at, uint64_t tid)
{
    if (s->mem_live == 0) {
        return;
    }
    s->mem_live--;
    mem_row(s, at, tid, MEM_BASE + (uint64_t) s->mem_live * (uint64_t) act_bytes(s), -act_bytes(s));
}

/* --- the model --- */

/* A leaf op with one kernel: [parent →] leaf → cudaLaunchKernel → kernel. */
static void fwd_op(struct kp_synth *s, uint64_t parent, enum sid outer, enum sid leaf,
                   enum ktype kt, uint32_t shapes, uint32_t dtypes, int64_t *aseq)
{
    struct frame fo, fl;
    uint64_t tid = tid_main(s);
    uint64_t p = parent;

    if (outer != S_NONE) {
        op_open(s, &fo, ab(s, s->cpu_main), outer, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tid, parent);
        fo.shapes = shapes;
        fo.dtypes = dtypes;
        s->cpu_main += base_dur(s, 1500, 0.4);
        p = fo.id;
    }
    op_open(s, &fl, ab(s, s->cpu_main), leaf, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tid, p);
    fl.shapes = shapes;
    fl.dtypes = dtypes;
    fl.seq = s->next_aseq++;
    if (aseq != NULL) {
        *aseq = fl.seq;
    }
    s->cpu_main += base_dur(s, 4000, 0.4);
    mem_alloc_act(s, ab(s, s->cpu_main), tid);
    launch(s, &s->cpu_main, tid, kt, fl.id);
    s->cpu_main += base_dur(s, 1500, 0.4);
    op_close(s, &fl, ab(s, s->cpu_main));
    if (outer != S_NONE) {
        s->cpu_main += base_dur(s, 800, 0.4);
        op_close(s, &fo, ab(s, s->cpu_main));
    }
    checkpoint(s);
}

/*
 * A backward function on the autograd thread: evaluate_function → XBackward0 → each aten op
 * with its kernels. kts lists (aten op, kernel) pairs; a kernel of KT_COUNT means none.
 */
static void bwd_fn(struct kp_synth *s, enum sid eval, enum sid fn, int64_t seq,
                   const enum sid *aten, const enum ktype *kts, size_t n)
{
    struct frame fe, ff, fa;
    uint64_t tid = tid_bwd(s);

    op_open(s, &fe, ab(s, s->cpu_bwd), eval, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tid, 0);
    s->cpu_bwd += base_dur(s, 2500, 0.4);
    op_open(s, &ff, ab(s, s->cpu_bwd), fn, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tid, fe.id);
    ff.seq = seq;
    ff.fwd_tid = tid_main(s);
    s->cpu_bwd += base_dur(s, 2000, 0.4);
    for (size_t i = 0; i < n; i++) {
        op_open(s, &fa, ab(s, s->cpu_bwd), aten[i], KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tid, ff.id);
        fa.shapes = S_SH_ACT_H;
        fa.dtypes = S_DT_2;
        s->cpu_bwd += base_dur(s, 3500, 0.4);
        if (kts[i] != KT_COUNT) {
            launch(s, &s->cpu_bwd, tid, kts[i], fa.id);
        }
        mem_free_act(s, ab(s, s->cpu_bwd), tid);
        s->cpu_bwd += base_dur(s, 1200, 0.4);
        op_close(s, &fa, ab(s, s->cpu_bwd));
        checkpoint(s);
    }
    s->cpu_bwd += base_dur(s, 1500, 0.4);
    op_close(s, &ff, ab(s, s->cpu_bwd));
    s->cpu_bwd += base_dur(s, 1000, 0.4);
    op_close(s, &fe, ab(s, s->cpu_bwd));
    checkpoint(s);
}

/* Rank q's NCCL kernel start for a bucket whose base ready time is t, after prev (abs). */
static int64_t nccl_start(const struct kp_synth *s, uint32_t q, int64_t t, int64_t prev)
{
    int64_t st = map_t(s->origin[q], s->f[q], t);

    return st > prev ? st : prev;
}

/* The allreduce of bucket b, launched from the autograd thread once its gradients are in. */
static void allreduce(struct kp_synth *s, uint32_t b)
{
    Kprof__V1__Collectives *c = s->p_colls;
    const struct kdef *kd = &kdefs[KT_NCCL];
    struct frame fo, fr;
    uint64_t tid = tid_bwd(s), corr, nelems = s->bucket_nelems[b];
    uint32_t w = s->o.world_size;
    int64_t ready, t, end = 0, mine, xfer, op_start;
    double bytes = (double) nelems * 4.0;
    size_t i;

    op_open(s, &fo, ab(s, s->cpu_bwd), S_NCCL_ALLREDUCE, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tid,
            0);
    fo.shapes = S_SH_FOREACH;
    fo.dtypes = S_DT_LIST;
    op_start = fo.start;
    s->cpu_bwd += base_dur(s, 6000, 0.3);
    op_open(s, &fr, ab(s, s->cpu_bwd), S_RECORD_PARAM_COMMS, KPROF__V1__OP_KIND__OP_KIND_CPU_OP,
            tid, fo.id);
    s->cpu_bwd += base_dur(s, 3000, 0.3);
    corr = api_call(s, &s->cpu_bwd, S_CUDA_LAUNCH_KERNEL, CBID_LAUNCH_KERNEL, tid, fr.id, 7000,
                    &ready);
    s->cpu_bwd += base_dur(s, 2000, 0.3);
    op_close(s, &fr, ab(s, s->cpu_bwd));
    s->cpu_bwd += base_dur(s, 1500, 0.3);
    op_close(s, &fo, ab(s, s->cpu_bwd));

    /* Ring allreduce: 2(w-1)/w of the bytes at the bus bandwidth (NVLink within a node of 8,
     * the network beyond), plus latency. */
    xfer = 15000 +
           (int64_t) (bytes * 2.0 * (double) (w - 1) / (double) w / (w <= 8 ? 150.0 : 80.0)) +
           (w == 1 ? (int64_t) (bytes / 400.0) : 0);
    xfer = (int64_t) ((double) xfer * (0.95 + 0.1 * base_u(s)));
    t = s->gpu > ready ? s->gpu : ready;
    for (uint32_t q = 0; q < w; q++) {
        int64_t st = nccl_start(s, q, t, s->comm_end);

        if (st > end) {
            end = st;
        }
    }
    end += xfer;
    mine = nccl_start(s, s->o.rank, t, s->comm_end);
    s->comm_end = end;

    kernel_row(s, kd, mine, end - mine, STREAM_COMM, corr, fr.id);

    i = row_add(s, KP_EV_COLLECTIVE);
    c->start_ns[i] = op_start;
    c->dur_ns[i] = (uint64_t) (ab(s, s->cpu_bwd) - op_start);
    c->name[i] = S_ALLREDUCE;
    c->in_nelems[i] = nelems;
    c->out_nelems[i] = nelems;
    c->dtype[i] = S_FLOAT;
    c->group_size[i] = w;
    c->process_group[i] = S_DEFAULT_PG;
    c->coll_seq[i] = s->next_coll_seq++;
    c->external_id[i] = fo.id;
    c->tid[i] = tid;
    c->step[i] = (int32_t) s->step;
    add_dur(s, KP_EV_COLLECTIVE, (int64_t) c->dur_ns[i]);
    checkpoint(s);
}

static void backward_block(struct kp_synth *s, uint32_t blk)
{
    const struct block_seq *q = &s->bseq[blk];
    static const enum sid ln_aten[] = { S_ATEN_LN_BWD, S_ATEN_LN_BWD };
    static const enum ktype ln_k[] = { KT_LN_BWD_DX, KT_LN_BWD_DW };
    static const enum sid dr_aten[] = { S_ATEN_DROPOUT_BWD };
    static const enum ktype dr_k[] = { KT_DROPOUT_BWD };
    static const enum sid mm_aten[] = { S_ATEN_MM, S_ATEN_MM, S_ATEN_SUM };
    static const enum ktype mm_k[] = { KT_GEMM_DGRAD, KT_GEMM_WGRAD, KT_SUM };
    static const enum sid ge_aten[] = { S_ATEN_GELU_BWD };
    static const enum ktype ge_k[] = { KT_GELU_BWD };
    static const enum sid acc_aten[] = { S_NONE };
    static const enum ktype acc_k[] = { KT_COUNT };

    bwd_fn(s, S_EV_LN_BWD, S_LN_BWD, q->ln, ln_aten, ln_k, 2);
    bwd_fn(s, S_EV_DROPOUT_BWD, S_DROPOUT_BWD, q->dropout, dr_aten, dr_k, 1);
    bwd_fn(s, S_EV_ADDMM_BWD, S_ADDMM_BWD, q->addmm2, mm_aten, mm_k, 3);
    bwd_fn(s, S_EV_GELU_BWD, S_GELU_BWD, q->gelu, ge_aten, ge_k, 1);
    bwd_fn(s, S_EV_ADDMM_BWD, S_ADDMM_BWD, q->addmm1, mm_aten, mm_k, 3);
    /* AccumulateGrad: no kernel (DDP's hook copies into the bucket view). */
    bwd_fn(s, S_EV_ACCUM, S_ACCUM, -1, acc_aten, acc_k, 0);
}

/* Computes every rank's origin and scale for the current step. */
static void schedule_step(struct kp_synth *s)
{
    double load_base = 1.5e6 * (0.8 + 0.4 * u01(hash4(s->o.seed, 0x10ad, (uint64_t) s->step, 0)));

    for (uint32_t q = 0; q < s->o.world_size; q++) {
        double jf = u01(hash4(s->o.seed, 0xf00, (uint64_t) s->step, q));
        double jl = u01(hash4(s->o.seed, 0xd1, (uint64_t) s->step, q));
        int64_t load = (int64_t) (load_base * s->dlslow[q] * (0.9 + 0.2 * jl));

        s->f[q] = s->slow[q] * (0.985 + 0.03 * jf);
        s->origin[q] = s->t0[q] + load;
    }
    s->my_f = s->f[s->o.rank];
    s->my_origin = s->origin[s->o.rank];
}

/* The input batch to the GPU: .to(), down to the host-to-device copy. */
static void step_input(struct kp_synth *s, uint64_t tm, uint64_t parent)
{
    struct frame f1, f2, f3;

    op_open(s, &f1, ab(s, s->cpu_main), S_ATEN_TO, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tm, parent);
    f1.shapes = S_SH_TO;
    f1.dtypes = S_DT_TO;
    s->cpu_main += base_dur(s, 3000, 0.3);
    op_open(s, &f2, ab(s, s->cpu_main), S_ATEN_TO_COPY, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tm,
            f1.id);
    f2.shapes = S_SH_TO;
    f2.dtypes = S_DT_TO;
    s->cpu_main += base_dur(s, 5000, 0.3);
    op_open(s, &f3, ab(s, s->cpu_main), S_ATEN_COPY, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tm, f2.id);
    f3.shapes = S_SH_TO;
    f3.dtypes = S_DT_TO;
    s->cpu_main += base_dur(s, 2000, 0.3);
    memcpy_row(s, &s->cpu_main, tm, f3.id, (uint64_t) s->prof->tokens * s->prof->hidden * 4,
               MEMCPY_HTOD, MEM_PINNED, MEM_DEVICE);
    s->cpu_main += base_dur(s, 1000, 0.3);
    op_close(s, &f3, ab(s, s->cpu_main));
    s->cpu_main += base_dur(s, 800, 0.3);
    op_close(s, &f2, ab(s, s->cpu_main));
    s->cpu_main += base_dur(s, 800, 0.3);
    op_close(s, &f1, ab(s, s->cpu_main));
    checkpoint(s);
}

/* Forward: DDP's forward over the blocks, then the loss and whatever else is left of the
 * kernel budget. */
static void step_forward(struct kp_synth *s, uint64_t tm, uint64_t parent)
{
    struct frame fddp;
    uint32_t blk;

    op_open(s, &fddp, ab(s, s->cpu_main), S_DDP_FORWARD,
            KPROF__V1__OP_KIND__OP_KIND_USER_ANNOTATION, tm, parent);
    s->cpu_main += base_dur(s, 20000, 0.3);
    for (blk = 0; blk < s->n_blocks; blk++) {
        struct block_seq *q = &s->bseq[blk];

        fwd_op(s, fddp.id, S_ATEN_LINEAR, S_ATEN_ADDMM, KT_GEMM_FWD1, S_SH_ADDMM1, S_DT_ADDMM,
               &q->addmm1);
        fwd_op(s, fddp.id, S_NONE, S_ATEN_GELU, KT_GELU_FWD, S_SH_ACT_4H, S_DT_1, &q->gelu);
        fwd_op(s, fddp.id, S_ATEN_LINEAR, S_ATEN_ADDMM, KT_GEMM_FWD2, S_SH_ADDMM2, S_DT_ADDMM,
               &q->addmm2);
        fwd_op(s, fddp.id, S_ATEN_DROPOUT, S_ATEN_NATIVE_DROPOUT, KT_DROPOUT_FWD, S_SH_ACT_H,
               S_DT_1, &q->dropout);
        fwd_op(s, fddp.id, S_NONE, S_ATEN_ADD, KT_ADD, S_SH_ADD, S_DT_2, &q->add);
        fwd_op(s, fddp.id, S_ATEN_LAYER_NORM, S_ATEN_NATIVE_LAYER_NORM, KT_LN_FWD, S_SH_LN, S_DT_LN,
               &q->ln);
    }
    s->cpu_main += base_dur(s, 5000, 0.3);
    op_close(s, &fddp, ab(s, s->cpu_main));
    /* the loss and whatever else is left of the kernel budget */
    for (uint32_t x = 0; x < s->n_extra; x++) {
        fwd_op(s, parent, S_NONE, S_ATEN_MUL, KT_MUL, S_SH_MUL, S_DT_2, NULL);
    }
}

/* Backward starts: DDP zeroes its first bucket (a memset on the GPU). */
static void step_zero_bucket(struct kp_synth *s, uint64_t tm, uint64_t parent)
{
    Kprof__V1__Memsets *ms = s->p_memsets;
    struct frame fz;
    uint64_t corr;
    int64_t ready;
    size_t i;

    op_open(s, &fz, ab(s, s->cpu_main), S_ATEN_ZERO, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tm,
            parent);
    fz.shapes = S_SH_ZERO;
    fz.dtypes = S_DT_1;
    s->cpu_main += base_dur(s, 2500, 0.3);
    corr =
        api_call(s, &s->cpu_main, S_CUDA_MEMSET_ASYNC, CBID_MEMSET_ASYNC, tm, fz.id, 4500, &ready);
    {
        int64_t mst = s->gpu + 1200 > ready ? s->gpu + 1200 : ready;
        uint64_t bytes = s->bucket_nelems[0] * 4;
        int64_t mdur = 1500 + (int64_t) ((double) bytes / 700.0);
        int64_t a = ab(s, mst), dur = ab(s, mst + mdur) - a;

        s->gpu = mst + mdur;
        i = row_add(s, KP_EV_MEMSET);
        ms->start_ns[i] = a;
        ms->dur_ns[i] = (uint64_t) dur;
        ms->bytes[i] = bytes;
        ms->value[i] = 0;
        ms->mem_kind[i] = MEM_DEVICE;
        ms->device[i] = s->o.rank % 8;
        ms->context[i] = CONTEXT_ID;
        ms->stream[i] = STREAM_COMPUTE;
        ms->correlation[i] = corr;
        ms->external_id[i] = fz.id;
        ms->step[i] = (int32_t) s->step;
        add_dur(s, KP_EV_MEMSET, dur);
    }
    s->cpu_main += base_dur(s, 1000, 0.3);
    op_close(s, &fz, ab(s, s->cpu_main));
    checkpoint(s);
}

/* Backward on the autograd thread, bucket by bucket with each bucket's allreduce; then every
 * rank's mapping re-based where its optimizer phase starts. */
static void step_backward(struct kp_synth *s)
{
    int64_t bwd_end;
    uint32_t blk;

    s->cpu_bwd = s->cpu_main + base_dur(s, 15000, 0.3);
    for (uint32_t b = 0; b < s->n_buckets; b++) {
        uint32_t hi = s->n_blocks - b * s->blocks_per_bucket;
        uint32_t lo = hi > s->blocks_per_bucket ? hi - s->blocks_per_bucket : 0;

        for (blk = hi; blk > lo; blk--) {
            backward_block(s, blk - 1);
        }
        allreduce(s, b);
    }
    s->cpu_main = s->cpu_bwd + base_dur(s, 3000, 0.3);
    bwd_end = s->cpu_main > s->gpu ? s->cpu_main : s->gpu;

    /*
     * The optimizer phase starts, on each rank, once the last allreduce is done and its own
     * backward is through: re-base every rank's mapping there (same base timeline again).
     */
    for (uint32_t q = 0; q < s->o.world_size; q++) {
        int64_t o = map_t(s->origin[q], s->f[q], bwd_end);

        s->origin[q] = o > s->comm_end ? o : s->comm_end;
    }
    s->my_origin = s->origin[s->o.rank];
    s->cpu_main = s->gpu = 0;
}

/* The optimizer phase: the compute stream waits for the communication stream, then
 * optimizer.step's foreach kernels, and what backward left alive is freed. */
static void step_optimizer(struct kp_synth *s, uint64_t tm, uint64_t parent)
{
    struct frame fopt, ffe;
    uint64_t corr;

    /* DDP makes the compute stream wait for the communication stream */
    {
        int64_t a0 = ab(s, s->cpu_main), a1;
        uint32_t ev = (uint32_t) (s->next_event++ & 0x7fffffff);

        corr = api_call(s, &s->cpu_main, S_CUDA_STREAM_WAIT_EVENT, CBID_STREAM_WAIT_EVENT, tm,
                        parent, 3000, NULL);
        a1 = ab(s, s->cpu_main);
        sync_row(s, a0, a1, SYNC_STREAM_WAIT_EVENT, corr, ev);
    }
    op_open(s, &fopt, ab(s, s->cpu_main), S_OPTIMIZER_STEP,
            KPROF__V1__OP_KIND__OP_KIND_USER_ANNOTATION, tm, parent);
    s->cpu_main += base_dur(s, 8000, 0.3);
    op_open(s, &ffe, ab(s, s->cpu_main), S_FOREACH_ADD, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tm,
            fopt.id);
    ffe.shapes = S_SH_FOREACH;
    ffe.dtypes = S_DT_LIST;
    s->cpu_main += base_dur(s, 6000, 0.3);
    for (uint32_t x = 0; x < s->n_opt; x++) {
        launch(s, &s->cpu_main, tm, KT_FOREACH, ffe.id);
        s->cpu_main += base_dur(s, 2000, 0.3);
        checkpoint(s);
    }
    op_close(s, &ffe, ab(s, s->cpu_main));
    /* what backward left alive is freed once the step's graph goes */
    while (s->mem_live > 0) {
        mem_free_act(s, ab(s, s->cpu_main), tm);
    }
    s->cpu_main += base_dur(s, 3000, 0.3);
    op_close(s, &fopt, ab(s, s->cpu_main));
}

/* loss.item(): a tiny copy back and a stream synchronize. Returns where the step ends (the
 * main thread's time). */
static int64_t step_item(struct kp_synth *s, uint64_t tm, uint64_t parent)
{
    struct frame fitem, fdense;
    int64_t sync_st, sync_en;
    uint64_t corr;

    op_open(s, &fitem, ab(s, s->cpu_main), S_ATEN_ITEM, KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tm,
            parent);
    fitem.shapes = S_SH_ITEM;
    fitem.dtypes = S_DT_ITEM;
    s->cpu_main += base_dur(s, 2000, 0.3);
    op_open(s, &fdense, ab(s, s->cpu_main), S_LOCAL_SCALAR_DENSE,
            KPROF__V1__OP_KIND__OP_KIND_CPU_OP, tm, fitem.id);
    fdense.shapes = S_SH_ITEM;
    fdense.dtypes = S_DT_ITEM;
    s->cpu_main += base_dur(s, 2000, 0.3);
    memcpy_row(s, &s->cpu_main, tm, fdense.id, 4, MEMCPY_DTOH, MEM_DEVICE, MEM_PAGEABLE);
    sync_st = s->cpu_main;
    corr =
        api_call(s, &s->cpu_main, S_CUDA_STREAM_SYNC, CBID_STREAM_SYNC, tm, fdense.id, 3000, NULL);
    sync_en = s->gpu + base_dur(s, 4000, 0.3);
    if (sync_en < s->cpu_main) {
        sync_en = s->cpu_main;
    }
    /* the API call lasts until the GPU is done: stretch its row */
    s->p_api->dur_ns[kp_batch_builder_rows(s->bb, KP_EV_API) - 1] =
        (uint64_t) (ab(s, sync_en) - ab(s, sync_st));
    s->totals.dur_ns[KP_EV_API] += (uint64_t) (ab(s, sync_en) - ab(s, s->cpu_main));
    sync_row(s, ab(s, sync_st), ab(s, sync_en), SYNC_STREAM_SYNC, corr, 0);
    s->cpu_main = sync_en + base_dur(s, 1500, 0.3);
    op_close(s, &fdense, ab(s, s->cpu_main));
    s->cpu_main += base_dur(s, 1000, 0.3);
    op_close(s, &fitem, ab(s, s->cpu_main));
    s->cpu_main += base_dur(s, 6000, 0.3);
    return s->cpu_main;
}

/* One training step of the rank: its rows (every rank's timeline moves on with it). */
static void sim_step(struct kp_synth *s)
{
    Kprof__V1__Steps *st = s->p_steps;
    struct frame fstep, fdl;
    uint64_t tm = tid_main(s);
    int64_t t0 = s->t0[s->o.rank], end, opt_end;
    size_t i;

    s->bi = 0;
    s->first_gemm_corr_done = 0;
    s->comm_end = 0;
    schedule_step(s);
    s->cpu_main = s->cpu_bwd = s->gpu = 0;

    op_open(s, &fstep, t0, S_NONE, KPROF__V1__OP_KIND__OP_KIND_PROFILER_STEP, tm, 0);
    fstep.name = STEP_NAME_FLAG | (uint32_t) (s->step - s->o.first_step);
    op_open(s, &fdl, t0, S_DATALOADER, KPROF__V1__OP_KIND__OP_KIND_USER_ANNOTATION, tm, fstep.id);
    op_close(s, &fdl, s->my_origin);

    step_input(s, tm, fstep.id);
    step_forward(s, tm, fstep.id);
    /* backward: DDP zeroes its first bucket, then the autograd thread takes over */
    step_zero_bucket(s, tm, fstep.id);
    step_backward(s);
    step_optimizer(s, tm, fstep.id);
    opt_end = step_item(s, tm, fstep.id);

    end = ab(s, opt_end);
    op_close(s, &fstep, end);
    i = row_add(s, KP_EV_STEP);
    st->step[i] = s->step;
    st->start_ns[i] = t0;
    st->dur_ns[i] = (uint64_t) (end - t0);
    add_dur(s, KP_EV_STEP, end - t0);
    checkpoint(s);

    /* every rank's next step starts where its optimizer phase ends */
    for (uint32_t q = 0; q < s->o.world_size; q++) {
        s->t0[q] = map_t(s->origin[q], s->f[q], opt_end) + (int64_t) (s->f[q] * 25000.0);
    }
    s->totals.steps++;
    s->step++;
}

/* --- batches --- */

/* Columns a CUPTI capture leaves empty. Kernels' blocks per SM and occupancy, and memcpys' and
 * memsets' bandwidth, come only from imported Kineto traces: a synthetic capture that set them
 * would write a side-table row per event, which no real capture does. */
static const struct kp_batch_builder_rule synth_cols[] = {
    { KP_EV_KERNEL, "graph_id", KP_BB_NEVER, 0 },
    { KP_EV_KERNEL, "graph_node_id", KP_BB_NEVER, 0 },
    { KP_EV_KERNEL, "blocks_per_sm", KP_BB_NEVER, 0 },
    { KP_EV_KERNEL, "est_occupancy", KP_BB_NEVER, 0 },
    { KP_EV_MEMCPY, "bandwidth_gbps", KP_BB_NEVER, 0 },
    { KP_EV_MEMSET, "bandwidth_gbps", KP_BB_NEVER, 0 },
    { KP_EV_OP, "domain", KP_BB_NEVER, 0 },
    { KP_EV_OP, "device", KP_BB_NEVER, 0 },
    { KP_EV_OP, "stream", KP_BB_NEVER, 0 },
};

static bool col_absent(enum kp_event_kind k, const char *name)
{
    for (size_t i = 0; i < sizeof(synth_cols) / sizeof(synth_cols[0]); i++) {
        if (synth_cols[i].kind == k && strcmp(name, synth_cols[i].column) == 0) {
            return true;
        }
    }
    return false;
}

/* The batch string index of pool id (or step name) v, adding it on first use. */
static int map_name(struct kp_synth *s, uint32_t v, uint32_t *out)
{
    int64_t idx;

    if (v == S_NONE) {
        *out = 0;
        return 0;
    }
    if ((v & STEP_NAME_FLAG) == 0 && s->xlat_epoch[v] == s->totals.batches + 1) {
        *out = s->xlat[v];
        return 0;
    }
    if (v & STEP_NAME_FLAG) {
        /* one ProfilerStep op per step, so each step name is added once per batch (copied) */
        char name[32];
        int n = snprintf(name, sizeof(name), "ProfilerStep#%" PRId64,
                         s->o.first_step + (int64_t) (v & ~STEP_NAME_FLAG));

        idx = kp_batch_builder_intern(s->bb, name, (size_t) n);
    }
    else {
        idx = kp_batch_builder_string(s->bb, s->pool[v], strlen(s->pool[v]));
        s->xlat[v] = (uint32_t) idx;
        s->xlat_epoch[v] = s->totals.batches + 1;
    }
    if (idx < 0) {
        return (int) idx;
    }
    *out = (uint32_t) idx;
    return 0;
}

/* Drops the rows of the batch handed out last from the pending rows. */
static void shift_out(struct kp_synth *s)
{
    const struct checkpoint cut = s->cps[s->cut_cp - 1];

    kp_batch_builder_next(s->bb);
    memmove(s->cps, s->cps + s->cut_cp, (s->n_cps - s->cut_cp) * sizeof(*s->cps));
    s->n_cps -= s->cut_cp;
    for (size_t j = 0; j < s->n_cps; j++) {
        for (int k = 0; k < KP_EV_COUNT; k++) {
            s->cps[j].rows[k] -= cut.rows[k];
        }
    }
    s->cut_cp = 0;
}

static size_t cp_total(const struct checkpoint *c)
{
    size_t n = 0;

    for (int k = 0; k < KP_EV_COUNT; k++) {
        n += c->rows[k];
    }
    return n;
}

static int build_batch(struct kp_synth *s, const struct checkpoint *cut, Kprof__V1__Batch **out)
{
    Kprof__V1__Batch *b;
    int64_t base = INT64_MAX;
    int rc;

    /* base_ns: the earliest start among the kinds' first rows */
    for (int k = 0; k < KP_EV_COUNT; k++) {
        const struct kp_event_kind_info *ki = &kp_event_kinds[k];
        const ProtobufCMessage *m = kp_batch_builder_table(s->bb, (enum kp_event_kind) k);

        if (cut->rows[k] == 0) {
            continue;
        }
        for (size_t c = 0; c < ki->n_columns; c++) {
            if (ki->columns[c].role == KP_ROLE_TS) {
                int64_t v = kp_codec_get_i64(m, kp_codec_field(k, c), 0);

                base = v < base ? v : base;
            }
        }
    }
    /* names: pool ids become the batch's string indexes, in kind, column, row order */
    for (int k = 0; k < KP_EV_COUNT; k++) {
        const struct kp_event_kind_info *ki = &kp_event_kinds[k];
        ProtobufCMessage *m = kp_batch_builder_table(s->bb, (enum kp_event_kind) k);

        for (size_t c = 0; c < ki->n_columns && cut->rows[k] > 0; c++) {
            const ProtobufCFieldDescriptor *f = kp_codec_field(k, c);
            uint32_t *v = *(uint32_t **) ((char *) m + f->offset);

            if (ki->columns[c].role != KP_ROLE_NAME ||
                col_absent((enum kp_event_kind) k, ki->columns[c].name)) {
                continue;
            }
            for (size_t i = 0; i < cut->rows[k]; i++) {
                if ((rc = map_name(s, v[i], &v[i])) != 0) {
                    return rc;
                }
            }
        }
    }
    b = kp_batch_builder_finish(s->bb, base == INT64_MAX ? 0 : base, cut->rows);
    b->run_id = s->o.run_id;
    b->rank = s->o.rank;
    b->rank_info = s->totals.batches == 0 ? &s->rank_info : NULL;
    b->n_devices = s->totals.batches == 0 ? 1 : 0;
    b->devices = s->totals.batches == 0 ? s->devices : NULL;
    *out = b;
    return 0;
}

int kp_synth_next(struct kp_synth *s, Kprof__V1__Batch **out)
{
    size_t cut = 0, total;
    int rc;

    *out = NULL;
    if (s->have_out) {
        shift_out(s);
        s->have_out = false;
    }
    for (;;) {
        total = kp_batch_builder_total(s->bb);
        if (total >= s->batch_rows || s->step >= s->step_end) {
            break;
        }
        sim_step(s);
        if (s->nomem) {
            return -ENOMEM;
        }
    }
    if (s->n_cps == 0) {
        return 0;
    }
    while (cut < s->n_cps - 1 && cp_total(&s->cps[cut]) < s->batch_rows) {
        cut++;
    }
    if ((rc = build_batch(s, &s->cps[cut], out)) != 0) {
        return rc;
    }
    s->cut_cp = cut + 1;
    s->have_out = true;
    s->totals.batches++;
    return 1;
}

const struct kp_synth_totals *kp_synth_totals(const struct kp_synth *s)
{
    return &s->totals;
}

void kp_synth_count(const Kprof__V1__Batch *b, struct kp_synth_totals *t)
{
    t->batches++;
    for (int k = 0; k < KP_EV_COUNT; k++) {
        const struct kp_event_kind_info *ki = &kp_event_kinds[k];
        const ProtobufCMessage *m = kp_batch_kind(b, (enum kp_event_kind) k);
        size_t n = kp_batch_rows(b, (enum kp_event_kind) k);

        t->rows[k] += n;
        t->all_rows += n;
        if (m == NULL) {
            continue;
        }
        for (size_t c = 0; c < ki->n_columns; c++) {
            if (strcmp(ki->columns[c].name, "dur_ns") == 0) {
                const ProtobufCFieldDescriptor *f = kp_codec_field((enum kp_event_kind) k, c);

                for (size_t i = 0; i < n; i++) {
                    t->dur_ns[k] += (uint64_t) kp_codec_get_i64(m, f, i);
                }
            }
        }
    }
}

void kp_synth_opts_from_flags(struct kp_synth_opts *so, const struct kp_synth_flags *f,
                              uint32_t rank, uint64_t run_id, const char *job)
{
    memset(so, 0, sizeof(*so));
    so->seed = (uint64_t) f->seed;
    so->rank = rank;
    so->world_size = (uint32_t) f->ranks;
    so->first_step = f->first_step;
    so->n_steps = (uint32_t) f->steps;
    so->kernels_per_step = (uint32_t) f->kernels_per_step;
    so->batch_rows = (uint32_t) f->batch_rows;
    so->run_id = run_id;
    so->job = job;
}

/* --- create / destroy --- */

static int build_strings(struct kp_synth *s, int p)
{
    const struct profile *pr = &profiles[p];
    uint32_t h = pr->hidden, n = pr->tokens;
    const char *dt = pr->dtype;
    char buf[512];

    for (int i = 0; i < S_FIRST_BUILT; i++) {
        s->pool[i] = fixed_strings[i];
    }
    for (int i = 0; i < 4; i++) {
        s->pool[S_K_GEMM_FWD1 + i] = gemm_names[p][i];
    }
#define BUILD(id, ...)                              \
    do {                                            \
        snprintf(buf, sizeof(buf), __VA_ARGS__);    \
        if ((s->owned[id] = strdup(buf)) == NULL) { \
            return -ENOMEM;                         \
        }                                           \
        s->pool[id] = s->owned[id];                 \
    } while (0)
    BUILD(S_SH_TO, "[[%u, %u], [], [], [], [], [], [], []]", n, h);
    BUILD(S_SH_ADDMM1, "[[%u], [%u, %u], [%u, %u], [], []]", 4 * h, n, h, h, 4 * h);
    BUILD(S_SH_ADDMM2, "[[%u], [%u, %u], [%u, %u], [], []]", h, n, 4 * h, 4 * h, h);
    BUILD(S_SH_ACT_4H, "[[%u, %u], []]", n, 4 * h);
    BUILD(S_SH_ACT_H, "[[%u, %u], [%u, %u]]", n, h, n, h);
    BUILD(S_SH_ADD, "[[%u, %u], [%u, %u], []]", n, h, n, h);
    BUILD(S_SH_LN, "[[%u, %u], [], [%u], [%u], [], []]", n, h, h, h);
    BUILD(S_SH_MUL, "[[%u, %u], []]", n, h);
    BUILD(S_SH_FOREACH, "[[], [], []]");
    BUILD(S_SH_ITEM, "[[]]");
    BUILD(S_SH_ZERO, "[[%u]]", 8 * h * h);
    BUILD(S_DT_1, "['%s']", dt);
    BUILD(S_DT_2, "['%s', '%s']", dt, dt);
    BUILD(S_DT_ADDMM, "['%s', '%s', '%s', 'Scalar', 'Scalar']", dt, dt, dt);
    BUILD(S_DT_LN, "['%s', 'ScalarList', 'float', 'float', 'Scalar', 'Scalar']", dt);
    BUILD(S_DT_TO, "['float', 'Scalar', 'Scalar', 'Scalar', 'Scalar', 'Scalar', 'Scalar', "
                   "'Scalar']");
    BUILD(S_DT_LIST, "['TensorList', 'TensorList', 'Scalar']");
    BUILD(S_DT_ITEM, "['float']");
#undef BUILD
    return 0;
}

/* Whether opts are within kp_synth.h's limits. */
static bool synth_opts_valid(const struct kp_synth_opts *opts)
{
    uint32_t w = opts->world_size;

    if (w == 0 || w > KP_SYNTH_MAX_WORLD_SIZE || opts->rank >= w || opts->first_step < 0 ||
        opts->n_steps > INT32_MAX || opts->first_step > (int64_t) INT32_MAX - opts->n_steps ||
        (opts->kernels_per_step != 0 && (opts->kernels_per_step < KP_SYNTH_MIN_KERNELS_PER_STEP ||
                                         opts->kernels_per_step > KP_SYNTH_MAX_KERNELS_PER_STEP)) ||
        (opts->batch_rows != 0 && (opts->batch_rows < KP_SYNTH_MIN_BATCH_ROWS ||
                                   opts->batch_rows > KP_SYNTH_MAX_BATCH_ROWS)) ||
        opts->run_id > INT32_MAX || opts->start_ns < 0) {
        return false;
    }
    for (uint32_t q = 0; q < w; q++) {
        if ((opts->compute_slowdown != NULL &&
             !(opts->compute_slowdown[q] >= 0.1 && opts->compute_slowdown[q] <= 100.0)) ||
            (opts->dataload_slowdown != NULL &&
             !(opts->dataload_slowdown[q] >= 0.1 && opts->dataload_slowdown[q] <= 100.0))) {
            return false;
        }
    }
    return true;
}

/* The kernel budget of a step: 16 per block, a few optimizer kernels, the rest elementwise;
 * the blocks in DDP buckets. */
static void plan_kernels(struct kp_synth *s)
{
    uint32_t k = s->kernels_per_step;

    s->n_opt = k / 25;
    s->n_opt = s->n_opt < 1 ? 1 : (s->n_opt > 8 ? 8 : s->n_opt);
    s->n_blocks = (k - s->n_opt) / 16;
    s->n_extra = k - s->n_opt - 16 * s->n_blocks;
    s->blocks_per_bucket = s->n_blocks / 16 + 1;
    s->n_buckets =
        s->n_blocks == 0 ? 1 : (s->n_blocks + s->blocks_per_bucket - 1) / s->blocks_per_bucket;
}

/* Every rank's slowdowns and first step's start, and each bucket's gradient size. */
static void init_timelines(struct kp_synth *s, const struct kp_synth_opts *opts)
{
    uint32_t w = opts->world_size;

    for (uint32_t q = 0; q < w; q++) {
        s->slow[q] = opts->compute_slowdown != NULL ? opts->compute_slowdown[q] : 1.0;
        s->dlslow[q] = opts->dataload_slowdown != NULL ? opts->dataload_slowdown[q] : 1.0;
        s->t0[q] = s->o.start_ns;
    }
    for (uint32_t b = 0; b < s->n_buckets; b++) {
        uint32_t hi = s->n_blocks - b * s->blocks_per_bucket;
        uint32_t nb = hi > s->blocks_per_bucket ? s->blocks_per_bucket : hi;
        uint64_t hh = s->prof->hidden;

        /* two linear layers (8h^2 + 5h) and a layer norm (2h) per block */
        s->bucket_nelems[b] = nb == 0 ? 4096 : nb * (8 * hh * hh + 7 * hh);
    }
}

/* Room for a row of every kind, so that row_add always has one to give, and the tables
 * the rows are written into. 0 or -ENOMEM. */
static int bind_tables(struct kp_synth *s)
{
    for (int ev = 0; ev < KP_EV_COUNT; ev++) {
        if (kp_batch_builder_add(s->bb, (enum kp_event_kind) ev, 1) < 0) {
            return -ENOMEM;
        }
        kp_batch_builder_truncate(s->bb, (enum kp_event_kind) ev, 0);
    }
    s->p_kernels = kp_batch_builder_table(s->bb, KP_EV_KERNEL);
    s->p_memcpys = kp_batch_builder_table(s->bb, KP_EV_MEMCPY);
    s->p_memsets = kp_batch_builder_table(s->bb, KP_EV_MEMSET);
    s->p_api = kp_batch_builder_table(s->bb, KP_EV_API);
    s->p_ops = kp_batch_builder_table(s->bb, KP_EV_OP);
    s->p_steps = kp_batch_builder_table(s->bb, KP_EV_STEP);
    s->p_counters = kp_batch_builder_table(s->bb, KP_EV_COUNTER);
    s->p_colls = kp_batch_builder_table(s->bb, KP_EV_COLLECTIVE);
    s->p_syncs = kp_batch_builder_table(s->bb, KP_EV_SYNC);
    s->p_memory = kp_batch_builder_table(s->bb, KP_EV_MEMORY);
    return 0;
}

/* rank_info and the device every batch of the rank carries. */
static void init_identity(struct kp_synth *s, const struct kp_synth_opts *opts)
{
    uint32_t w = opts->world_size;

    snprintf(s->host, sizeof(s->host), "synth-node-%u", opts->rank / 8);
    kprof__v1__rank_info__init(&s->rank_info);
    s->rank_info.job = s->job;
    s->rank_info.host = s->host;
    s->rank_info.pid = (uint32_t) pid_of(s);
    s->rank_info.local_rank = opts->rank % 8;
    s->rank_info.world_size = w;
    s->rank_info.device = (int32_t) (opts->rank % 8);
    kprof__v1__device__init(&s->device);
    s->device.id = opts->rank % 8;
    s->device.name = (char *) s->prof->device_name;
    s->device.sm_count = s->prof->sm_count;
    s->device.cc_major = s->prof->cc_major;
    s->device.cc_minor = s->prof->cc_minor;
    s->device.global_memory_bytes = s->prof->memory_bytes;
    s->device.memory_bandwidth_bytes_per_s = s->prof->bandwidth;
    s->device.clock_khz = s->prof->clock_khz;
    s->device.max_threads_per_block = 1024;
    s->device.max_threads_per_sm = 2048;
    s->device.max_blocks_per_sm = 32;
    s->device.regs_per_sm = 65536;
    s->device.regs_per_block = 65536;
    s->device.smem_per_sm = s->prof->smem_per_sm;
    s->device.smem_per_block = 49152;
    s->device.warp_size = 32;
    s->devices[0] = &s->device;
}

int kp_synth_create(const struct kp_synth_opts *opts, struct kp_synth **out)
{
    struct kp_synth *s;
    uint32_t w = opts->world_size;
    int rc = -ENOMEM, p;

    *out = NULL;
    if (!synth_opts_valid(opts)) {
        return -EINVAL;
    }
    if (kp_codec_selfcheck(NULL, 0) != 0) {
        return -EINVAL;
    }
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        return -ENOMEM;
    }
    s->o = *opts;
    s->o.job = NULL;
    s->o.compute_slowdown = NULL;
    s->o.dataload_slowdown = NULL;
    if (s->o.start_ns == 0) {
        s->o.start_ns = KP_SYNTH_DEFAULT_START_NS;
    }
    s->kernels_per_step =
        opts->kernels_per_step ? opts->kernels_per_step : KP_SYNTH_DEFAULT_KERNELS_PER_STEP;
    s->batch_rows = opts->batch_rows ? opts->batch_rows : KP_SYNTH_DEFAULT_BATCH_ROWS;
    p = (int) (mix64(opts->seed ^ 0x9f0f11e) & 1);
    s->prof = &profiles[p];

    plan_kernels(s);

    s->slow = calloc(w, sizeof(double));
    s->dlslow = calloc(w, sizeof(double));
    s->f = calloc(w, sizeof(double));
    s->t0 = calloc(w, sizeof(int64_t));
    s->origin = calloc(w, sizeof(int64_t));
    s->bucket_nelems = calloc(s->n_buckets, sizeof(uint64_t));
    s->bseq = calloc(s->n_blocks + 1, sizeof(struct block_seq));
    s->job = strdup(opts->job != NULL ? opts->job : "synthetic");
    if (s->slow == NULL || s->dlslow == NULL || s->f == NULL || s->t0 == NULL ||
        s->origin == NULL || s->bucket_nelems == NULL || s->bseq == NULL || s->job == NULL ||
        build_strings(s, p) != 0 ||
        kp_batch_builder_create(KP_BB_ALWAYS, synth_cols,
                                sizeof(synth_cols) / sizeof(synth_cols[0]), &s->bb) != 0) {
        goto fail;
    }
    init_timelines(s, opts);

    s->step = opts->first_step;
    s->step_end = opts->first_step + opts->n_steps;
    s->rstate = hash4(opts->seed, 0x7a9c, opts->rank, 0);
    s->next_op_id = 1;
    s->next_corr = 1;
    s->next_coll_seq = 1;
    s->next_event = 1;
    s->next_aseq = 1;

    if (bind_tables(s) != 0) {
        goto fail;
    }
    init_identity(s, opts);
    *out = s;
    return 0;
fail:
    kp_synth_destroy(s);
    return rc;
}

void kp_synth_destroy(struct kp_synth *s)
{
    if (s == NULL) {
        return;
    }
    kp_batch_builder_destroy(s->bb);
    for (int i = 0; i < S_COUNT; i++) {
        free(s->owned[i]);
    }
    free(s->cps);
    free(s->job);
    free(s->slow);
    free(s->dlslow);
    free(s->f);
    free(s->t0);
    free(s->origin);
    free(s->bucket_nelems);
    free(s->bseq);
    free(s);
}
