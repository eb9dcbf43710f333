/* kp_an: what a name says (spec §2.4, §2.7): communication, data loading, Tensor Core eligibility,
 * a host node's type. */
#define _GNU_SOURCE /* qsort_r */
#include "an_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

/* ---- names --------------------------------------------------------------------------- */

static bool is_comm_name(const char *s)
{
    static const char *const ops[] = { "broadcast", "reduce", "all_reduce", "all_gather",
                                       "reduce_scatter" };
    const char *rest;

    if (strncmp(s, "nccl:", 5) == 0 || strncmp(s, "gloo:", 5) == 0) {
        rest = s + 5;
    }
    else {
        return false;
    }
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (strcmp(rest, ops[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether op o (named s) is a communication op: a host op named as one, or in a capture
 * NCCL's own NVTX range (nccl:all_reduce, ...). */
bool kp__an_is_comm_op(const struct an_op *o, const char *s)
{
    return (o->kind == OPK_CPU_OP || o->kind == OPK_USER_ANNOTATION || o->kind == OPK_NVTX) &&
           is_comm_name(s);
}

/* A collective's kernel by its name alone: NCCL's ncclKernel_* and ncclDevKernel_* (the rule
 * compare uses, 'nccl%Kernel%'), and Gloo's. kprof's breakdown counts them as Communication
 * whether or not an nccl:* op launched them; the plugin (plugin_compat) does not. */
bool kp__an_is_comm_kernel_name(const char *s)
{
    return (strncmp(s, "nccl", 4) == 0 && strstr(s + 4, "Kernel") != NULL) ||
           strncmp(s, "gloo", 4) == 0;
}

bool kp__an_is_dataloader_name(const char *s)
{
    size_t n = strlen(s);

    if (strncmp(s, "enumerate(DataPipe)#", 20) == 0) {
        return true;
    }
    return strncmp(s, "enumerate(DataLoader)#", 22) == 0 && n >= 9 &&
           strcmp(s + n - 9, ".__next__") == 0;
}

bool kp__an_is_tc_eligible_op(const char *s)
{
    static const char *const ops[] = { "aten::_convolution",
                                       "aten::conv1d",
                                       "aten::conv2d",
                                       "aten::conv3d",
                                       "aten::conv_tbc",
                                       "aten::conv_transpose1d",
                                       "aten::conv_transpose2d",
                                       "aten::conv_transpose3d",
                                       "aten::convolution",
                                       "aten::cudnn_convolution",
                                       "aten::cudnn_convolution_transpose",
                                       "aten::prelu",
                                       "aten::addmm",
                                       "aten::addmv",
                                       "aten::addr",
                                       "aten::matmul",
                                       "aten::mm",
                                       "aten::mv",
                                       "aten::linear",
                                       "aten::addbmm",
                                       "aten::baddbmm",
                                       "aten::bmm",
                                       "aten::chain_matmul",
                                       "aten::linalg_multi_dot",
                                       "aten::_thnn_fused_lstm_cell",
                                       "aten::_thnn_fused_gru_cell",
                                       "aten::lstm_cell",
                                       "aten::gru_cell",
                                       "aten::rnn_tanh_cell",
                                       "aten::rnn_relu_cell",
                                       "CudnnConvolutionBackward",
                                       "BmmBackward0",
                                       "aten::cudnn_convolution_transpose_backward",
                                       "CudnnConvolutionTransposeBackward",
                                       "MmBackward",
                                       "aten::cudnn_convolution_backward_weight",
                                       "aten::addmm_",
                                       "AddmvBackward",
                                       "MvBackward",
                                       "aten::cudnn_convolution_transpose_backward_weight",
                                       "aten::cudnn_convolution_transpose_backward_input",
                                       "AddmmBackward",
                                       "aten::cudnn_convolution_backward_input",
                                       "AddbmmBackward",
                                       "aten::cudnn_convolution_backward" };

    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (strcmp(s, ops[i]) == 0) {
            return true;
        }
    }
    return false;
}

bool kp_an_is_tc_kernel(const char *name)
{
    /* The TensorBoard plugin's list (spec §7): Volta and Turing cuBLAS/cuDNN names, and
     * xmma. */
    static const char *const pats[] = { "h884",
                                        "s884",
                                        "h1688",
                                        "s1688",
                                        "hmma",
                                        "i8816",
                                        "16816",
                                        "dgrad_1x1_stride_2x2",
                                        "first_layer_wgrad_kernel",
                                        "conv1x1",
                                        "conv2d_c1_k1",
                                        "direct_group",
                                        "xmma_implicit_gemm",
                                        "xmma_sparse_conv",
                                        "xmma_warp_specialized_implicit_gemm",
                                        "xmma_gemm",
                                        "xmma_sparse_gemm",
                                        "c1688" };
    /* kprof's additions for Ampere and Hopper (none of them occurs in the plugin's peer
     * traces, so its figures stay the plugin's): cuDNN's sm80/sm90 xmma convolutions
     * (sm80_xmma_fprop_implicit_gemm_*, *_dgrad_*, *_wgrad_*); Hopper warpgroup MMA in
     * cuBLAS, CUTLASS 3 and cuDNN (sm90_*_gmma_*, *wgmma*); cuBLAS 12.8+'s nvjet_* GEMMs;
     * CUTLASS tensor-op kernels (cutlass_80_tensorop_*, cutlass3x_sm90_tensorop_*), which a
     * cutlass_*_simt_* kernel is not; int8/fp8/tf32 MMA shapes (i16832, s16816 above); and
     * attention kernels: FlashAttention 2 (flash_fwd_*, flash_bwd_dq_dk_dv_*) and 3
     * (FlashAttnFwdSm90), xformers/PyTorch memory-efficient and TensorRT fmha_* but their fp32
     * variants, and cuDNN's fused SDPA. */
    static const char *const modern[] = { "xmma_fprop",
                                          "xmma_dgrad",
                                          "xmma_wgrad",
                                          "gmma",
                                          "nvjet_",
                                          "tensorop",
                                          "i16832",
                                          "flash_fwd_kernel",
                                          "flash_fwd_splitkv_kernel",
                                          "flash_bwd_dq_dk_dv",
                                          "flash_bwd_kernel",
                                          "FlashAttnFwd",
                                          "FlashAttnBwd",
                                          "fmha_",
                                          "_sdpa_" };

    for (size_t i = 0; i < sizeof(pats) / sizeof(pats[0]); i++) {
        if (strstr(name, pats[i])) {
            return true;
        }
    }
    if (strstr(name, "_simt_") != NULL) {
        return false;
    }
    /* fmha's fp32 kernels (fmha_cutlassF_f32_aligned_*) run on CUDA cores */
    if (strstr(name, "fmha_") != NULL) {
        return strstr(name, "_f32_") == NULL;
    }
    for (size_t i = 0; i < sizeof(modern) / sizeof(modern[0]); i++) {
        if (strstr(name, modern[i])) {
            return true;
        }
    }
    return false;
}

/* The node type of an op, or -1 if it is not a host node (spec §2.4). */
int kp__an_host_type(const struct kp_an *a, const struct an_op *o)
{
    const char *s = kp__an_nm(a, o->name);

    if (o->kind == OPK_PROFILER_STEP) {
        return NODE_STEP;
    }
    if (o->kind == OPK_USER_ANNOTATION) {
        return is_comm_name(s) ? NODE_COMM : -1;
    }
    if (o->kind != OPK_CPU_OP) {
        return -1;
    }
    if (kp__an_is_dataloader_name(s)) {
        return NODE_DATALOADER;
    }
    if (strncmp(s, "Optimizer.", 10) == 0) {
        return NODE_OPTIMIZER;
    }
    if (strcmp(s, "DataParallel.forward") == 0 ||
        strcmp(s, "DistributedDataParallel.forward") == 0) {
        return NODE_OTHER_OP;
    }
    return NODE_OPERATOR;
}
