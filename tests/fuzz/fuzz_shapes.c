/*
 * fuzz_shapes: the analyzer's parser for stored op shapes and dtypes (trace or NVTX data) and
 * the FLOP/byte formulas over whatever it accepts (analyzer/flops.h). The input is split at
 * the first two NUL bytes into an op name, a shapes text and a dtypes text. Any input must be
 * refused cleanly or computed without a crash or sanitizer report, and a known result must
 * be finite and not negative.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant);

size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant)
{
    static const char *const seeds[] = {
        "aten::addmm\0[[128], [32, 64], [64, 128], [], []]\0['float', 'float', 'float', "
        "'Scalar', 'Scalar']",
        "aten::conv2d\0[[8, 3, 224, 224], [64, 3, 7, 7], [64], [], [], [], []]\0['c10::Half', "
        "'c10::Half', 'c10::Half', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar']",
        "aten::scaled_dot_product_attention\0[[2, 8, 512, 64], [2, 8, 512, 64], [2, 8, 512, "
        "64]]\0[\"c10::BFloat16\", \"c10::BFloat16\", \"c10::BFloat16\"]",
    };
    const char *s = seeds[variant % 3];
    size_t n = strlen(s) + 1;

    n += strlen(s + n) + 1;
    n += strlen(s + n);
    if (n > cap) {
        return 0;
    }
    memcpy(buf, s, n);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 3);
    const char *op, *shapes, *dtypes;
    struct kp_flops_args args;
    struct kp_flops_result r;
    size_t a, b;

    if (text == NULL) {
        return 0;
    }
    memcpy(text, data, size);
    text[size] = text[size + 1] = text[size + 2] = '\0';
    op = text;
    a = strlen(op) + 1;
    shapes = a <= size ? text + a : text + size + 1;
    b = a <= size ? a + strlen(shapes) + 1 : size + 2;
    dtypes = b <= size ? text + b : text + size + 2;
    if (kp_flops_parse(shapes, dtypes, &args) == 0) {
        for (int dir = 0; dir < 2; dir++) {
            kp_flops_compute(op, &args, (enum kp_flops_dir) dir, NULL, &r);
            for (int sub = 0; r.known && sub <= KP_FLOPS_MAX_PARTS; sub++) {
                double f = kp_flops_part_flops(&r, sub), by = kp_flops_part_bytes(&r, sub);

                if (!(f >= 0) || isinf(f) || (r.bytes_known && (!(by >= 0) || isinf(by)))) {
                    abort();
                }
            }
        }
    }
    free(text);
    return 0;
}
