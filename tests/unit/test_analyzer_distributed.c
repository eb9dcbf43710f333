/* Unit tests for analyzer/distributed: the communication-ops table's input bytes (spec
 * tbplugin-views.md §9: Σ product of "Input Dims" × element size, with the plugin's element
 * size table) from the text import stores. The view itself is checked across ranks by
 * tests/it/test_analyzer_tbplugin.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdint.h>

#include "distributed.h"

static void test_sizes(void **state)
{
    (void) state;
    /* the plugin's test_distributed_nccl: broadcast and all_reduce of float tensors */
    assert_int_equal(kp_distributed_input_bytes("[[53120]]", "['float']"), 212480);
    assert_int_equal(kp_distributed_input_bytes("[[2049000]]", "['float']"), 8196000);
    /* each input its own element size */
    assert_int_equal(kp_distributed_input_bytes("[[2, 3], [4]]", "['c10::Half', 'long int']"), 44);
    assert_int_equal(kp_distributed_input_bytes("[[7], [2, 2]]", "['unsigned char', 'int']"), 23);
    assert_int_equal(kp_distributed_input_bytes("[[3]]", "['c10::BFloat16']"), 6);
    /* a 0-d tensor is 1 element; a scalar or an unknown type counts 0, as in the plugin */
    assert_int_equal(kp_distributed_input_bytes("[[], []]", "['float', 'Scalar']"), 4);
    assert_int_equal(kp_distributed_input_bytes("[[2, 3]]", "['double']"), 0);
    /* JSON quoting and spacing as stored by other producers */
    assert_int_equal(kp_distributed_input_bytes("[ [ 2 ,3 ] ]", "[\"float\"]"), 24);
}

static void test_edges(void **state)
{
    (void) state;
    /* a list of tensors: each tensor counts (the plugin fails on it) */
    assert_int_equal(kp_distributed_input_bytes("[[[2, 3], [4]]]", "['float']"), 40);
    /* more shapes than types: the rest count 0 */
    assert_int_equal(kp_distributed_input_bytes("[[2], [3]]", "['float']"), 8);
    /* missing or unreadable text counts 0 */
    assert_int_equal(kp_distributed_input_bytes(NULL, "['float']"), 0);
    assert_int_equal(kp_distributed_input_bytes("[[2]]", NULL), 0);
    assert_int_equal(kp_distributed_input_bytes("[[1, 2", "['float']"), 0);
    assert_int_equal(kp_distributed_input_bytes("[[2]]", "['float"), 0);
    assert_int_equal(kp_distributed_input_bytes("", ""), 0);
    /* a product past int64 saturates instead of wrapping */
    assert_true(kp_distributed_input_bytes("[[4294967296, 4294967296]]", "['float']") == INT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_edges),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
