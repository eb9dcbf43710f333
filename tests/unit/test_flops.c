/* Unit tests for analyzer/flops: the shape/dtype parser on good and junk text, and a table of
 * ops whose FLOPs and bytes are derived by hand from docs/specs/flops-bytes.md (each
 * case's comment shows the arithmetic). E = elements, S = bytes per element. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flops.h"

struct fcase {
    const char *op, *shapes, *dtypes;
    enum kp_flops_dir dir;
    bool known, bytes_known;
    int n_parts;
    double flops[KP_FLOPS_MAX_PARTS], bytes[KP_FLOPS_MAX_PARTS];
    const char *params; /* NULL: not checked */
};

#define F KP_FLOPS_FWD
#define B KP_FLOPS_BWD

static const struct fcase cases[] = {
    /* addmm(C[128], A[32,64], B[64,128]) fp32: 2·32·128·64 = 524288 FLOPs;
     * bytes 4·(32·64 + 64·128 + 32·128) = 4·(2048 + 8192 + 4096) = 57344 (§3.1) */
    { "aten::addmm",
      "[[128], [32, 64], [64, 128], [], []]",
      "['float', 'float', 'float', 'Scalar', 'Scalar']",
      F,
      true,
      true,
      1,
      { 524288 },
      { 57344 },
      "M=32,N=128,K=64,type=fp32" },
    /* backward of the same: dgrad and wgrad 524288 each, bias grad m·n = 4096 FLOPs and
     * 2·m·n·S = 2·4096·4 = 32768 bytes */
    { "aten::addmm",
      "[[128], [32, 64], [64, 128], [], []]",
      "['float', 'float', 'float', 'Scalar', 'Scalar']",
      B,
      true,
      true,
      3,
      { 524288, 524288, 4096 },
      { 57344, 57344, 32768 },
      NULL },
    /* mm A[16,32] B[32,8] fp16: 2·16·8·32 = 8192; bytes 2·(16·32 + 32·8 + 16·8) = 2·896 = 1792 */
    { "aten::mm",
      "[[16, 32], [32, 8]]",
      "['c10::Half', 'c10::Half']",
      F,
      true,
      true,
      1,
      { 8192 },
      { 1792 },
      "M=16,N=8,K=32,type=fp16" },
    /* bmm [4,16,32]x[4,32,8] bf16: 2·4·16·8·32 = 32768; bytes 4·2·896 = 7168 */
    { "aten::bmm",
      "[[4, 16, 32], [4, 32, 8]]",
      "['c10::BFloat16', 'c10::BFloat16']",
      F,
      true,
      true,
      1,
      { 32768 },
      { 7168 },
      "B=4,M=16,N=8,K=32,type=bf16" },
    /* baddbmm(C, A[2,3,4], B[2,4,5]) fp32: 2·2·3·5·4 = 240; bytes 2·4·(12 + 20 + 15) = 376 */
    { "aten::baddbmm",
      "[[2, 3, 5], [2, 3, 4], [2, 4, 5], [], []]",
      "['float', 'float', 'float', 'Scalar', 'Scalar']",
      F,
      true,
      true,
      1,
      { 240 },
      { 376 },
      NULL },
    /* matmul [8,1,3,4] x [5,4,6]: batch broadcast(8,1 ; 5) = 8·5 = 40; 2·40·3·6·4 = 5760;
     * bytes 40·4·(12 + 24 + 18) = 8640 */
    { "aten::matmul",
      "[[8, 1, 3, 4], [5, 4, 6]]",
      "['float', 'float']",
      F,
      true,
      true,
      1,
      { 5760 },
      { 8640 },
      NULL },
    /* matmul 1-D · 2-D: x[4] · W[4,6]: m=1, n=6, k=4: 2·6·4 = 48; bytes 4·(4 + 24 + 6) = 136 */
    { "aten::matmul",
      "[[4], [4, 6]]",
      "['float', 'float']",
      F,
      true,
      true,
      1,
      { 48 },
      { 136 },
      NULL },
    /* matmul with incompatible batch (3 vs 5) -> unknown */
    { "aten::matmul",
      "[[3, 2, 4], [5, 4, 6]]",
      "['float', 'float']",
      F,
      false,
      false,
      0,
      { 0 },
      { 0 },
      NULL },
    /* linear x[2,16,128] w[64,128] b[64]: M = 2·16 = 32, N = 64, K = 128:
     * 2·32·64·128 = 524288; bytes 4·(32·128 + 128·64 + 32·64) = 4·14336 = 57344 */
    { "aten::linear",
      "[[2, 16, 128], [64, 128], [64]]",
      "['float', 'float', 'float']",
      F,
      true,
      true,
      1,
      { 524288 },
      { 57344 },
      "M=32,N=64,K=128,type=fp32" },
    /* conv2d x[8,3,32,32] w[16,3,3,3], stride 1 pad 0: P = Q = 32 - 2 = 30, g = 3/3 = 1:
     * 2·8·16·30·30·3·3·3 = 6220800; bytes 4·(24576 + 432 + 8·16·900 = 115200) = 560832 */
    { "aten::conv2d",
      "[[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []]",
      "['float', 'float', 'float', 'ScalarList', 'ScalarList', 'ScalarList', 'Int']",
      F,
      true,
      true,
      1,
      { 6220800 },
      { 560832 },
      "N=8,C=3,K=16,in=32x32,out=30x30,kernel=3x3,g=1,type=fp32" },
    /* conv2d backward: dgrad and wgrad each the forward figures */
    { "aten::conv2d",
      "[[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []]",
      "['float', 'float', 'float', 'ScalarList', 'ScalarList', 'ScalarList', 'Int']",
      B,
      true,
      true,
      2,
      { 6220800, 6220800 },
      { 560832, 560832 },
      NULL },
    /* grouped conv2d x[1,8,10,10] w[8,2,3,3]: g = 8/2 = 4, P = Q = 8:
     * 2·1·8·8·8·(8/4)·3·3 = 18432; bytes 2·(800 + 144 + 512) = 2912 (fp16) */
    { "aten::conv2d",
      "[[1, 8, 10, 10], [8, 2, 3, 3]]",
      "['c10::Half', 'c10::Half']",
      F,
      true,
      true,
      1,
      { 18432 },
      { 2912 },
      NULL },
    /* conv3d x[2,4,8,8,8] w[6,4,3,3,3]: out 6x6x6 = 216: 2·2·6·216·4·27 = 559872;
     * bytes 4·(4096 + 648 + 2·6·216 = 2592) = 29344 */
    { "aten::conv3d",
      "[[2, 4, 8, 8, 8], [6, 4, 3, 3, 3]]",
      "['float', 'float']",
      F,
      true,
      true,
      1,
      { 559872 },
      { 29344 },
      NULL },
    /* conv_transpose2d x[1,4,5,5] w[4,6,3,3]: flop_counter 2·N·ΠI·ΠR·w0·w1 = 2·25·9·4·6 = 10800;
     * out 7x7: bytes 4·(100 + 216 + 6·49 = 294) = 2440 */
    { "aten::conv_transpose2d",
      "[[1, 4, 5, 5], [4, 6, 3, 3]]",
      "['float', 'float']",
      F,
      true,
      true,
      1,
      { 10800 },
      { 2440 },
      NULL },
    /* conv1d x[2,4,10] w[8,4,3]: out 8: 2·2·8·8·4·3 = 3072; bytes 4·(80 + 96 + 128) = 1216 */
    { "aten::conv1d",
      "[[2, 4, 10], [8, 4, 3]]",
      "['float', 'float']",
      F,
      true,
      true,
      1,
      { 3072 },
      { 1216 },
      NULL },
    /* convolution_backward(grad_out[8,16,28,28], x[8,3,32,32], w[16,3,5,5]): out from grad_out
     * 28x28: 2·8·16·784·3·25 = 15052800 per part; bytes 4·(24576 + 1200 + 100352) = 504512 */
    { "aten::convolution_backward",
      "[[8, 16, 28, 28], [8, 3, 32, 32], [16, 3, 5, 5], [], []]",
      "['float', 'float', 'float', 'ScalarList', 'Int']",
      F,
      true,
      true,
      2,
      { 15052800, 15052800 },
      { 504512, 504512 },
      NULL },
    /* sdpa q,k,v [2,4,128,64] bf16: 2·b·h·Sq·Sk·D + 2·b·h·Sq·Sk·Dv = 4·2·4·128·128·64 =
     * 33554432; bytes 2·(3·65536 + 65536) = 524288 */
    { "aten::scaled_dot_product_attention",
      "[[2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64]]",
      "['c10::BFloat16', 'c10::BFloat16', 'c10::BFloat16']",
      F,
      true,
      true,
      1,
      { 33554432 },
      { 524288 },
      "B=2,H=4,Sq=128,Sk=128,D=64,Dv=64,type=bf16" },
    /* its backward: b·h·Sq·Sk·(6D + 4Dv) = 2·4·128·128·640 = 83886080; bytes 2·524288 */
    { "aten::scaled_dot_product_attention",
      "[[2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64]]",
      "['c10::BFloat16', 'c10::BFloat16', 'c10::BFloat16']",
      B,
      true,
      true,
      1,
      { 83886080 },
      { 1048576 },
      NULL },
    /* _flash_attention_forward q[1,64,2,32] (b,s,h,d), k,v [1,32,2,32]: 4·1·2·64·32·32 = 524288;
     * bytes 2·(4096 + 2048 + 2048 + 1·2·64·32 = 4096) = 24576 */
    { "aten::_flash_attention_forward",
      "[[1, 64, 2, 32], [1, 32, 2, 32], [1, 32, 2, 32]]",
      "['c10::Half', 'c10::Half', 'c10::Half']",
      F,
      true,
      true,
      1,
      { 524288 },
      { 24576 },
      NULL },
    /* layer_norm x[4,10] w[10] b[10] fp32: 8·40 = 320; bytes 2·160 + 40 + 40 = 400 */
    { "aten::layer_norm",
      "[[4, 10], [], [10], [10], [], []]",
      "['float', 'ScalarList', 'float', 'float', 'Scalar', 'Scalar']",
      F,
      true,
      true,
      1,
      { 320 },
      { 400 },
      NULL },
    /* layer_norm backward: 320 FLOPs; bytes 3·160 + 80 = 560 */
    { "aten::layer_norm",
      "[[4, 10], [], [10], [10], [], []]",
      "['float', 'ScalarList', 'float', 'float', 'Scalar', 'Scalar']",
      B,
      true,
      true,
      1,
      { 320 },
      { 560 },
      NULL },
    /* batch_norm x[2,3,4,4] fp32 = 96 elems: 8·96 = 768; fwd 4·384 = 1536, bwd 5·384 = 1920 */
    { "aten::batch_norm",
      "[[2, 3, 4, 4], [3], [3], [3], [3]]",
      "['float', 'float', 'float', 'float', 'float']",
      F,
      true,
      true,
      1,
      { 768 },
      { 1536 },
      NULL },
    { "aten::batch_norm",
      "[[2, 3, 4, 4], [3], [3], [3], [3]]",
      "['float', 'float', 'float', 'float', 'float']",
      B,
      true,
      true,
      1,
      { 768 },
      { 1920 },
      NULL },
    /* gelu x[1000] fp16: 24·1000 = 24000; bytes 2·2000 = 4000 fwd, 3·2000 = 6000 bwd */
    { "aten::gelu", "[[1000]]", "['c10::Half']", F, true, true, 1, { 24000 }, { 4000 }, NULL },
    { "aten::gelu", "[[1000]]", "['c10::Half']", B, true, true, 1, { 24000 }, { 6000 }, NULL },
    /* silu x[10,10] fp32: 21·100 = 2100; bytes 2·400 = 800 */
    { "aten::silu", "[[10, 10]]", "['float']", F, true, true, 1, { 2100 }, { 800 }, NULL },
    /* relu_ (in-place -> relu) x[50] fp32: 50; 2·200 = 400 */
    { "aten::relu_", "[[50]]", "['float']", F, true, true, 1, { 50 }, { 400 }, NULL },
    /* softmax x[8,100] fp32: 40·800 = 32000; 3·3200 = 9600 fwd */
    { "aten::softmax",
      "[[8, 100], [], []]",
      "['float', 'Int', '']",
      F,
      true,
      true,
      1,
      { 32000 },
      { 9600 },
      NULL },
    /* _log_softmax backward: 21·800 = 16800; 5·3200 = 16000 */
    { "aten::_log_softmax",
      "[[8, 100], [], []]",
      "['float', 'Int', 'Bool']",
      B,
      true,
      true,
      1,
      { 16800 },
      { 16000 },
      NULL },
    /* add [4,1] + [3] fp32 -> out [4,3] = 12: 12 FLOPs; bytes 16 + 12 + 48 = 76;
     * backward: 0 FLOPs, 2·48 = 96 */
    { "aten::add",
      "[[4, 1], [3], []]",
      "['float', 'float', 'Scalar']",
      F,
      true,
      true,
      1,
      { 12 },
      { 76 },
      NULL },
    { "aten::add",
      "[[4, 1], [3], []]",
      "['float', 'float', 'Scalar']",
      B,
      true,
      true,
      1,
      { 0 },
      { 96 },
      NULL },
    /* mul_ (in-place) [10] x scalar: E(out) = 10; bytes 40 + 40 = 80 (the scalar adds none) */
    { "aten::mul_", "[[10], []]", "['float', 'Scalar']", F, true, true, 1, { 10 }, { 80 }, NULL },
    /* eq [6] [6] fp32 -> bool: 6; bytes 24 + 24 + 6 = 54 */
    { "aten::eq", "[[6], [6]]", "['float', 'float']", F, true, true, 1, { 6 }, { 54 }, NULL },
    /* exp [5] fp64: 20·5 = 100; 2·40 = 80 */
    { "aten::exp", "[[5]]", "['double']", F, true, true, 1, { 100 }, { 80 }, NULL },
    /* addcmul [4] [4] [4] fp32: 3·4 = 12; bytes 3·16 + 16 = 64 */
    { "aten::addcmul_",
      "[[4], [4], [4], []]",
      "['float', 'float', 'float', 'Scalar']",
      F,
      true,
      true,
      1,
      { 12 },
      { 64 },
      NULL },
    /* sum [10,10] fp32: 100; 400. mean: 101; 404. norm: 201; 400 */
    { "aten::sum",
      "[[10, 10], [], [], []]",
      "['float', 'ScalarList', 'Bool', '']",
      F,
      true,
      true,
      1,
      { 100 },
      { 400 },
      NULL },
    { "aten::mean", "[[10, 10]]", "['float']", F, true, true, 1, { 101 }, { 404 }, NULL },
    { "aten::norm", "[[10, 10]]", "['float']", F, true, true, 1, { 201 }, { 400 }, NULL },
    /* max_pool2d x[1,4,8,8] fp32: 256 FLOPs, 1024 bytes */
    { "aten::max_pool2d",
      "[[1, 4, 8, 8], [], [], [], [], []]",
      "['float', 'ScalarList', 'ScalarList', 'ScalarList', 'ScalarList', 'Bool']",
      F,
      true,
      true,
      1,
      { 256 },
      { 1024 },
      NULL },
    /* embedding(weight[1000,64], indices[4,16]) int64: 0 FLOPs; bytes fwd 64·8 + 2·64·64·4 =
     * 512 + 32768 = 33280; bwd 3·64·64·4 = 49152 */
    { "aten::embedding",
      "[[1000, 64], [4, 16], [], [], []]",
      "['float', 'long', 'Int', 'Bool', 'Bool']",
      F,
      true,
      true,
      1,
      { 0 },
      { 33280 },
      NULL },
    { "aten::embedding",
      "[[1000, 64], [4, 16], [], [], []]",
      "['float', 'long', 'Int', 'Bool', 'Bool']",
      B,
      true,
      true,
      1,
      { 0 },
      { 49152 },
      NULL },
    /* dropout [100] fp16: 5·100 = 500; 2·200 = 400 */
    { "aten::dropout",
      "[[100], [], []]",
      "['c10::Half', 'Double', 'Bool']",
      F,
      true,
      true,
      1,
      { 500 },
      { 400 },
      NULL },
    /* mse_loss [10] [10] fp32, fwd e = 20: 2·20 + 1 = 41, 20·4 = 80; bwd e = 30: 61, 120 */
    { "aten::mse_loss",
      "[[10], [10], []]",
      "['float', 'float', 'Int']",
      F,
      true,
      true,
      1,
      { 41 },
      { 80 },
      NULL },
    { "aten::mse_loss",
      "[[10], [10], []]",
      "['float', 'float', 'Int']",
      B,
      true,
      true,
      1,
      { 61 },
      { 120 },
      NULL },
    /* cross_entropy_loss x[4,10] t[4] int64: log_softmax 21·40 = 840, 3·160 = 480;
     * nll 4 FLOPs, 32 + 4·4 = 48 bytes */
    { "aten::cross_entropy_loss",
      "[[4, 10], [4], [], [], [], []]",
      "['float', 'long', '', 'Int', 'Int', 'Double']",
      F,
      true,
      true,
      2,
      { 840, 4 },
      { 480, 48 },
      NULL },
    /* apex adam(w[100] fp32, hw[0], m, v, g[100] fp16): 6·100·4 + 100·2 + 100·2 = 2800 */
    { "adam",
      "[[100], [0], [100], [100], [100]]",
      "['float', 'c10::Half', 'float', 'float', 'c10::Half']",
      F,
      true,
      true,
      1,
      { 0 },
      { 2800 },
      NULL },
    /* copy_(dst[10] fp16, src[10] fp32): 10·(4 + 2) = 60 */
    { "aten::copy_",
      "[[10], [10], []]",
      "['c10::Half', 'float', 'Bool']",
      F,
      true,
      true,
      1,
      { 0 },
      { 60 },
      NULL },
    /* cat of a tensor list without dtypes: known FLOPs (0), unknown bytes */
    { "aten::cat",
      "[[[5, 128], [5, 128]], []]",
      "['TensorList', 'Int']",
      F,
      true,
      false,
      1,
      { 0 },
      { 0 },
      NULL },
    /* NVTX shapes carry no dtype: mm FLOPs known, bytes not */
    { "aten::mm", "[[16, 32], [32, 8]]", NULL, F, true, false, 1, { 8192 }, { 0 }, NULL },
    /* unknown op: shapes kept in params */
    { "aten::einsum",
      "[[], [[2, 3], [3, 4]], []]",
      "['', 'TensorList', '']",
      F,
      false,
      false,
      0,
      { 0 },
      { 0 },
      "[2,3];[3,4]" },
    /* mm with mismatched inner dims -> unknown */
    { "aten::mm",
      "[[16, 32], [31, 8]]",
      "['float', 'float']",
      F,
      false,
      false,
      0,
      { 0 },
      { 0 },
      NULL },
};

static void test_cases(void **state)
{
    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct fcase *c = &cases[i];
        struct kp_flops_args a;
        struct kp_flops_result r;

        if (kp_flops_parse(c->shapes, c->dtypes, &a) != 0) {
            fail_msg("case %zu (%s): parse failed", i, c->op);
        }
        kp_flops_compute(c->op, &a, c->dir, NULL, &r);
        if (r.known != c->known || (c->known && r.bytes_known != c->bytes_known) ||
            (c->known && r.n_parts != c->n_parts)) {
            fail_msg("case %zu (%s): known %d/%d bytes_known %d/%d parts %d/%d", i, c->op, r.known,
                     c->known, r.bytes_known, c->bytes_known, r.n_parts, c->n_parts);
        }
        for (int p = 0; p < c->n_parts; p++) {
            if (r.flops[p] != c->flops[p] || r.bytes[p] != c->bytes[p]) {
                fail_msg("case %zu (%s) part %d: flops %.0f want %.0f, bytes %.0f want %.0f", i,
                         c->op, p, r.flops[p], c->flops[p], r.bytes[p], c->bytes[p]);
            }
        }
        /* past the last part a kernel gets nothing */
        assert_true(kp_flops_part_flops(&r, c->n_parts) == 0);
        assert_true(kp_flops_part_bytes(&r, -1) == 0);
        if (c->params && strcmp(r.params, c->params) != 0) {
            fail_msg("case %zu (%s): params '%s' want '%s'", i, c->op, r.params, c->params);
        }
    }
}

static void test_conv_hint(void **state)
{
    /* stride 2, padding 1: x[1,3,8,8] w[4,3,3,3] out[1,4,4,4] from the backward node:
     * 2·1·4·16·3·9 = 3456 */
    struct kp_flops_args a;
    struct kp_flops_result r;
    struct kp_flops_tensor hint = { 4, { 1, 4, 4, 4 }, 4, "fp32" };

    (void) state;
    assert_int_equal(kp_flops_parse("[[1, 3, 8, 8], [4, 3, 3, 3]]", "['float', 'float']", &a), 0);
    kp_flops_compute("aten::conv2d", &a, KP_FLOPS_FWD, &hint, &r);
    assert_true(r.known);
    assert_true(r.flops[0] == 3456);
}

static void test_parse(void **state)
{
    struct kp_flops_args a;

    (void) state;
    assert_int_equal(kp_flops_parse("[[32, 64], [64, 128]]", "['float', 'float']", &a), 0);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.a[1].kind, KP_FLOPS_TENSOR);
    assert_int_equal(a.a[1].t.dim[1], 128);
    assert_int_equal(a.a[1].t.esize, 4);
    /* JSON quoting, a 0-d tensor, a scalar, an empty list */
    assert_int_equal(
        kp_flops_parse("[[], [], [3]]", "[\"float\", \"Scalar\", \"c10::BFloat16\"]", &a), 0);
    assert_int_equal(a.a[0].kind, KP_FLOPS_TENSOR);
    assert_int_equal(a.a[0].t.ndim, 0);
    assert_int_equal(a.a[1].kind, KP_FLOPS_NONE);
    assert_string_equal(a.a[2].t.dtype, "bf16");
    assert_int_equal(kp_flops_parse("[]", "", &a), 0);
    assert_int_equal(a.n, 0);
    /* tensor list */
    assert_int_equal(kp_flops_parse("[[[5, 128], [5, 128]], []]", NULL, &a), 0);
    assert_int_equal(a.a[0].kind, KP_FLOPS_LIST);
    assert_int_equal(a.a[0].n, 2);
    assert_int_equal(a.n_sub, 2);
    assert_int_equal(kp_flops_dtype_size("c10::Float8_e4m3fn", NULL, 0), 1);
    assert_int_equal(kp_flops_dtype_size("c10::complex<double>", NULL, 0), 16);
    assert_int_equal(kp_flops_dtype_size("Scalar", NULL, 0), 0);
}

static void test_junk(void **state)
{
    static const char *const junk[] = {
        "",
        "[",
        "]",
        "[[",
        "[[1, 2]",
        "[[1, 2]]]",
        "[[1,, 2]]",
        "[[-1]]",
        "[[1.5]]",
        "[[99999999999999999999999]]",
        "[[1, 2, 3, 4, 5, 6, 7, 8, 9]]",
        "[[[[1]]]]",
        "[[a]]",
        "hello",
        "[[1] [2]]",
        "[[1], ]",
        "[[[1], 2]]",
    };
    struct kp_flops_args a;
    struct kp_flops_result r;
    char big[4096];

    (void) state;
    for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
        if (kp_flops_parse(junk[i], "['float']", &a) != -EINVAL) {
            fail_msg("junk '%s' parsed", junk[i]);
        }
        assert_int_equal(a.n, 0);
        /* an empty parse never crashes a formula */
        kp_flops_compute("aten::addmm", &a, KP_FLOPS_FWD, NULL, &r);
        assert_false(r.known);
    }
    assert_int_equal(kp_flops_parse(NULL, NULL, &a), -EINVAL);
    /* an unterminated dtype quote */
    assert_int_equal(kp_flops_parse("[[1]]", "['float", &a), -EINVAL);
    /* too many arguments */
    memset(big, 0, sizeof(big));
    strcpy(big, "[");
    for (int i = 0; i < 40; i++) {
        strcat(big, i ? ", [1]" : "[1]");
    }
    strcat(big, "]");
    assert_int_equal(kp_flops_parse(big, NULL, &a), -EINVAL);
    /* wrong ranks and zero dims give unknown, not a crash or a division by zero */
    assert_int_equal(kp_flops_parse("[[8, 3, 2, 2], [16, 0, 3, 3]]", "['float', 'float']", &a), 0);
    kp_flops_compute("aten::conv2d", &a, KP_FLOPS_FWD, NULL, &r);
    assert_false(r.known);
    assert_int_equal(kp_flops_parse("[[8, 0, 5, 5], [16, 3, 3, 3]]", "['float', 'float']", &a), 0);
    kp_flops_compute("aten::conv2d", &a, KP_FLOPS_FWD, NULL, &r); /* 0 channels: groups 0 */
    assert_false(r.known);
    assert_int_equal(r.tc, KP_FLOPS_TC_CONV); /* still a convolution for the tc column */
    assert_int_equal(kp_flops_parse("[[8, 3, 2, 2], [16, 3, 3, 3]]", "['float', 'float']", &a), 0);
    kp_flops_compute("aten::conv2d", &a, KP_FLOPS_FWD, NULL, &r); /* output would be 0x0 */
    assert_false(r.known);
    /* a 0-d operand to matmul, on either side or both (found by fuzz_shapes) */
    static const char *const zero_d[] = { "[[], [4]]", "[[4], []]", "[[], []]", "[[], [3, 4]]",
                                          "[[3, 4], []]" };
    for (size_t i = 0; i < sizeof(zero_d) / sizeof(zero_d[0]); i++) {
        assert_int_equal(kp_flops_parse(zero_d[i], "['float', 'float']", &a), 0);
        kp_flops_compute("aten::matmul", &a, KP_FLOPS_FWD, NULL, &r);
        assert_false(r.known);
    }
    assert_int_equal(kp_flops_parse("[[8], [3]]", "['float', 'float']", &a), 0);
    kp_flops_compute("aten::scaled_dot_product_attention", &a, KP_FLOPS_BWD, NULL, &r);
    assert_false(r.known);
    kp_flops_compute(NULL, &a, KP_FLOPS_FWD, NULL, &r);
    assert_false(r.known);
    kp_flops_compute("", &a, KP_FLOPS_FWD, NULL, &r);
    assert_false(r.known);
    assert_false(kp_flops_has_formula("aten::"));
    assert_true(kp_flops_has_formula("aten::add_"));
    assert_true(kp_flops_has_formula("torch.nn.functional.gelu"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_conv_hint),
        cmocka_unit_test(test_junk),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
