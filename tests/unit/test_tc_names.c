/* Unit tests for kp_an_is_tc_kernel (analyzer/an.h): Tensor Core detection by kernel
 * name, a table of real kernel names: the TensorBoard plugin's Volta/Turing names (which must
 * keep matching: the plugin's peer figures depend on them), the Ampere and Hopper names of
 * cuBLAS, CUTLASS, cuDNN and the attention libraries, and CUDA-core kernels that must not. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>

#include "an.h"

struct tc_case {
    const char *name;
    bool tc;
};

static const struct tc_case cases[] = {
    /* the plugin's list */
    { "volta_h884gemm_64x128_ldg8_nn", true },
    { "volta_s884cudnn_fp16_256x128_ldg8_splitK_relu_interior_nn_v1", true },
    { "turing_h1688gemm_128x128_ldg8_tn", true },
    { "turing_s1688cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", true },
    { "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", true },
    { "void cudnn::detail::dgrad_1x1_stride_2x2<float, int, 32, 32>(...)", true },
    { "void cudnn::detail::first_layer_wgrad_kernel<__half>(...)", true },
    { "void cudnn::ops::conv2d_c1_k1_nhwc_kernel<float>(...)", true },
    { "xmma_implicit_gemm_wo_smem_256x64", true },
    { "turing_fp16_i8816cudnn_int8_128x128", true },
    { "ampere_c1688gemm_64x64_nn", true },
    /* Ampere */
    { "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", true },
    { "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn", true },
    { "ampere_h16816gemm_128x128_ldg8_stages_32x5_nn", true },
    { "ampere_s1688gemm_fp16_128x128_ldg8_f2f_tn", true },
    { "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8",
      true },
    { "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", true },
    { "sm80_xmma_dgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nchw", true },
    { "sm86_xmma_wgrad_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", true },
    { "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", true },
    { "cutlass_80_tensorop_s1688gemm_tf32_128x128_16x4_nn_align4", true },
    { "cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8", true },
    { "sm80_int8_i16832gemm_int8_128x128_64x3_tn", true },
    { "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 32, 4>>(Flash_fwd_params)",
      true },
    { "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>(...)", true },
    { "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(...)", true },
    { "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_traits>(...)",
      true },
    { "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>)",
      true },
    { "fmha_cutlassB_bf16_aligned_128x64_k128_sm80(PyTorchMemEffAttention::AttentionBackward)",
      true },
    { "fmha_v2_flash_attention_fp16_64_128_S_64_sm86_kernel_nl", true },
    /* Hopper */
    { "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
      "segment_k_off_kernel__5x_cublas",
      true },
    { "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x256x64_cluster1x2x1_gmma_se82_rr", true },
    { "void cutlass::device_kernel<cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_"
      "128x128x64_1x1x1_0_tnn_align8_warpspecialized_cooperative_epi_tma>(...)",
      true },
    { "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NTN", true },
    { "nvjet_tst_192x192_64x3_2x1_v_bz_coopA_TNT", true },
    { "sm90_gemm_f16f16_f32f32_wgmma_kernel", true },
    { "void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<...>>(...)", true },
    { "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1", true },
    /* CUDA cores (SIMT) and other work */
    { "ampere_sgemm_128x64_nn", false },
    { "ampere_sgemm_32x128_tn", false },
    { "volta_sgemm_128x64_nn", false },
    { "maxwell_sgemm_128x64_nt", false },
    { "sm80_xmma_gemv_f32f32_f32f32_f32_nn_n", false },
    { "cutlass_80_simt_sgemm_128x128_8x4_nn_align1", false },
    { "void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4>(...)", false },
    { "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>)",
      false },
    { "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<...>>(...)",
      false },
    { "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<...>>(...)", false },
    { "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>()",
      false },
    { "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(...)", false },
    { "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false>(...)",
      false },
    { "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", false },
    { "triton_poi_fused_add_0", false },
    { "", false },
};

static void test_names(void **state)
{
    int bad = 0;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (kp_an_is_tc_kernel(cases[i].name) != cases[i].tc) {
            fprintf(stderr, "case %zu: %s: want %s\n", i, cases[i].name,
                    cases[i].tc ? "tensor core" : "not tensor core");
            bad++;
        }
    }
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
