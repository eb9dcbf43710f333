/* Unit tests for analyzer/hta: the kernel classes of docs/specs/hta-analyses.md §0 (both NCCL
 * naming schemes, HTA's quirks kept), the labels of the kernel type breakdown and the
 * options' defaults. The analyses themselves are checked end to end against HTA's figures by
 * tests/it/test_analyzer_hta.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "hta.h"

struct kcase {
    const char *name;
    enum kp_hta_ktype want;
};

static const struct kcase kcases[] = {
    /* COMMUNICATION: nccl/hip/hccl prefixes or ncclKernel anywhere */
    { "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
      KP_HTA_COMMUNICATION },
    { "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
      KP_HTA_COMMUNICATION },
    { "void ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", KP_HTA_COMMUNICATION },
    { "hcclAllReduce", KP_HTA_COMMUNICATION },
    /* HTA's quirk: any hip* name is communication, even a HIP memcpy */
    { "hipMemcpyWithStream", KP_HTA_COMMUNICATION },
    /* MEMORY: Memcpy/Memset/dma prefixes */
    { "Memcpy DtoD (Device -> Device)", KP_HTA_MEMORY },
    { "Memset (Device)", KP_HTA_MEMORY },
    { "dma_copy", KP_HTA_MEMORY },
    /* OTHER: excluded from computation, not memory by prefix */
    { "Event Sync", KP_HTA_OTHER },
    { "Stream Wait Event", KP_HTA_OTHER },
    { "cudaLaunchKernel", KP_HTA_OTHER },
    { "my_Memcpy_kernel", KP_HTA_OTHER },
    /* COMPUTATION: the rest */
    { "ampere_sgemm_128x64_nn", KP_HTA_COMPUTATION },
    { "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >()",
      KP_HTA_COMPUTATION },
    { "", KP_HTA_COMPUTATION },
};

static void test_kernel_types(void **state)
{
    (void) state;
    for (size_t i = 0; i < sizeof(kcases) / sizeof(kcases[0]); i++) {
        enum kp_hta_ktype got = kp_hta_kernel_type(kcases[i].name);

        if (got != kcases[i].want) {
            fprintf(stderr, "case %zu '%s': got %s, want %s\n", i, kcases[i].name,
                    kp_hta_ktype_names[got], kp_hta_ktype_names[kcases[i].want]);
        }
        assert_int_equal(got, kcases[i].want);
    }
}

static void test_type_labels(void **state)
{
    char buf[128], small[16];

    (void) state;
    kp_hta_type_label(1, buf, sizeof(buf));
    assert_string_equal(buf, "COMPUTATION");
    kp_hta_type_label(3, buf, sizeof(buf));
    assert_string_equal(buf, "COMPUTATION overlapping COMMUNICATION");
    kp_hta_type_label(6, buf, sizeof(buf));
    assert_string_equal(buf, "COMMUNICATION overlapping MEMORY");
    kp_hta_type_label(7, buf, sizeof(buf));
    assert_string_equal(buf, "COMPUTATION overlapping COMMUNICATION overlapping MEMORY");
    /* a short buffer is cut, never overrun */
    kp_hta_type_label(7, small, sizeof(small));
    assert_int_equal(strlen(small), sizeof(small) - 1);
}

static void test_opts_defaults(void **state)
{
    struct kp_hta_opts o;

    (void) state;
    memset(&o, 0xff, sizeof(o));
    kp_hta_opts_init(&o);
    assert_false(o.exact_ns);
    assert_false(o.include_last_step);
    assert_int_equal(o.consecutive_kernel_delay_ns, 30000);
    assert_int_equal(o.num_kernels, 10);
    assert_true(o.duration_ratio > 0.79 && o.duration_ratio < 0.81);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_types),
        cmocka_unit_test(test_type_labels),
        cmocka_unit_test(test_opts_defaults),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
