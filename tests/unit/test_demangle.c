/* kp_demangle (agent/demangle.h): kernel names as Kineto writes them. The expected forms are
 * what binutils' c++filt prints for the same mangled names; the first is a kernel name a real
 * H200 capture reported (gpukit), which torch.profiler showed demangled. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "demangle.h"

static void expect(const char *mangled, const char *want)
{
    size_t n = 0;
    char *got = kp_demangle(mangled, strlen(mangled), &n);

    assert_non_null(got);
    assert_string_equal(got, want);
    assert_int_equal(n, strlen(want));
    free(got);
}

static void test_mangled(void **state)
{
    (void) state;
    expect("_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_128x256_8x4_nt_align1EEvNT_6ParamsE",
           "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>"
           "(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)");
    expect("_ZN2at6native6kernelIfEEvPT_i", "void at::native::kernel<float>(float*, int)");
    expect("_Z3foov", "foo()");
}

/* Only the first len bytes are the name (the agent's strings are not NUL-terminated). */
static void test_bounded(void **state)
{
    const char buf[] = "_Z3foovGARBAGE";
    size_t n = 0;
    char *got = kp_demangle(buf, 7, &n);

    (void) state;
    assert_non_null(got);
    assert_string_equal(got, "foo()");
    free(got);
}

/* Anything else is kept as it is: C kernels, names the runtime rejects, short or empty. */
static void test_kept(void **state)
{
    size_t n = 123;

    (void) state;
    assert_null(kp_demangle("volta_sgemm_128x64_nn", 21, &n));
    assert_null(kp_demangle("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 39, &n));
    assert_null(kp_demangle("_Z", 2, &n));
    assert_null(kp_demangle("_Zgarbage", 9, &n));
    assert_null(kp_demangle("", 0, &n));
    assert_int_equal(n, 123);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mangled),
        cmocka_unit_test(test_bounded),
        cmocka_unit_test(test_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
