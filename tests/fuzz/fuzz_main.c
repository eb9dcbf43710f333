/*
 * Replay driver for the fuzz targets when libFuzzer is not linked: runs each file named on
 * the command line, then a deterministic mutation run (truncations, bit flips, byte
 * insertions) of a few valid seeds built here, so ctest exercises the decoder's error paths
 * on every build. Exit 0 unless the target crashes (sanitizers abort).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kprof.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* A target may seed the mutation run with inputs of its own (else: protobuf batches). */
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant) __attribute__((weak));

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t seed_batch(uint8_t *buf, size_t cap, int variant)
{
    Kprof__V1__Batch b = KPROF__V1__BATCH__INIT;
    Kprof__V1__Kernels k = KPROF__V1__KERNELS__INIT;
    Kprof__V1__Ops o = KPROF__V1__OPS__INIT;
    Kprof__V1__Counters c = KPROF__V1__COUNTERS__INIT;
    char *strings[] = { "", "volta_sgemm_128x64_nn", "aten::addmm", "[[32, 64], [64, 128]]" };
    int64_t start[] = { 0, 100, 250 };
    uint64_t dur[] = { 50, 60, 70 };
    uint32_t name[] = { 1, 1, 0 };
    uint32_t oname[] = { 2, 2, 2 };
    uint32_t shapes[] = { 3, 0, 3 };
    int64_t seq[] = { -1, 4, 5 };
    double val[] = { 1.5, -2.0, 1e300 };
    uint32_t metric[] = { 1, 2, 3 };
    size_t n;

    b.run_id = 1;
    b.rank = (uint32_t) variant;
    b.stream = 9;
    b.seq = (uint64_t) variant + 1;
    b.base_ns = 1700000000000000000LL;
    b.n_strings = 4;
    b.strings = strings;
    k.n_start_ns = k.n_dur_ns = k.n_name = 3;
    k.start_ns = start;
    k.dur_ns = dur;
    k.name = name;
    b.kernels = &k;
    if (variant > 0) {
        o.n_start_ns = o.n_dur_ns = o.n_name = o.n_input_shapes = o.n_seq = 3;
        o.start_ns = start;
        o.dur_ns = dur;
        o.name = oname;
        o.input_shapes = shapes;
        o.seq = seq;
        b.ops = &o;
    }
    if (variant > 1) {
        c.n_metric = c.n_value = 3;
        c.metric = metric;
        c.value = val;
        b.counters = &c;
    }
    n = kprof__v1__batch__get_packed_size(&b);
    if (n > cap) {
        return 0;
    }
    return kprof__v1__batch__pack(&b, buf);
}

int main(int argc, char **argv)
{
    uint8_t seed[4096], buf[4200];
    long runs = 0;

    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        static uint8_t data[1 << 20];
        size_t n;

        if (f == NULL) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            return 1;
        }
        n = fread(data, 1, sizeof(data), f);
        fclose(f);
        LLVMFuzzerTestOneInput(data, n);
        runs++;
    }
    for (int v = 0; v < 3; v++) {
        size_t n = kp_fuzz_seed != NULL ? kp_fuzz_seed(seed, sizeof(seed), v)
                                        : seed_batch(seed, sizeof(seed), v);

        LLVMFuzzerTestOneInput(seed, n);
        for (int iter = 0; iter < 20000; iter++) {
            size_t len = n;

            memcpy(buf, seed, n);
            switch (rng() % 4) {
            case 0: /* truncate */
                len = rng() % (n + 1);
                break;
            case 1: /* flip bits */
                for (int j = 0; j < 1 + (int) (rng() % 4); j++) {
                    buf[rng() % n] ^= (uint8_t) (1u << (rng() % 8));
                }
                break;
            case 2: /* overwrite a byte with an interesting value */
                buf[rng() % n] = (uint8_t[]){ 0x00, 0xff, 0x7f, 0x80, 0x0a, 0xc0 }[rng() % 6];
                break;
            default: { /* insert random bytes */
                size_t at = rng() % (n + 1), k = 1 + rng() % 8;

                memmove(buf + at + k, buf + at, n - at);
                for (size_t j = 0; j < k; j++) {
                    buf[at + j] = (uint8_t) rng();
                }
                len = n + k;
                break;
            }
            }
            LLVMFuzzerTestOneInput(buf, len);
            runs++;
        }
    }
    printf("fuzz replay: %ld inputs, no crash\n", runs);
    return 0;
}
