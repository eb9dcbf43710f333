/*
 * Fuzz target: the Kineto trace importer (kp_kineto), the path every byte of a user's
 * torch.profiler file takes in `kprofctl import`. Each input is parsed as a trace twice, as
 * the importer does: a scan, and, if the scan succeeds, a conversion whose batches are
 * encoded like kp_push does. Invariants checked (abort on violation): the scan and the
 * conversion agree on success, rows and batches; every emitted batch passes
 * kp_batch_validate (kp_kineto validates before emitting) and packs. Limits are small so that
 * hostile sizes (strings, nesting, rows per batch) are reached. Then the importer's one-parse
 * path: a scan into a kp_kineto_spool (sometimes spilled to a temporary file) whose replay
 * must give the same batches, byte for byte once repacked, or decline before sending any. Built
 * with -fsanitize=fuzzer under KPROF_FUZZ (clang); otherwise linked with fuzz_main.c for ctest.
 * fuzz_main.c's seeds are protobuf batches, so the first call also plays a deterministic JSON-aware
 * mutation run (truncations, flips, inserted JSON tokens) of the Kineto seeds below.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_kineto.h"
#include "kprof.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct sink {
    uint64_t batches, rows;
    uint64_t hash; /* of every batch, packed (canonical field order) */
};

static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 1099511628211ULL;
    }
    return h;
}

static int sink_cb(Kprof__V1__Batch *b, void *ud)
{
    static const struct kp_batch_limits lim = { 256, KP_CODEC_DEFAULT_MAX_STRINGS,
                                                KP_CODEC_DEFAULT_MAX_ROWS };
    struct sink *s = ud;
    size_t len = kprof__v1__batch__get_packed_size(b);
    uint8_t *buf;
    char err[256];

    if (kp_batch_validate(b, &lim, err, sizeof(err)) != 0) {
        abort();
    }
    if ((buf = malloc(len ? len : 1)) == NULL) {
        return -12;
    }
    if (kprof__v1__batch__pack(b, buf) != len) {
        abort();
    }
    s->hash = fnv(s->hash, buf, len);
    free(buf);
    s->batches++;
    s->rows += kp_batch_total_rows(b);
    return 0;
}

/* A spool's replay: each encoded batch must decode, validate and pack like the second
 * parse's. */
static int enc_cb(const void *buf, size_t len, void *ud)
{
    Kprof__V1__Batch *b = kprof__v1__batch__unpack(NULL, len, buf);
    int rc;

    if (b == NULL || b->stream != 0 || b->seq != 0) {
        abort();
    }
    rc = sink_cb(b, ud);
    kprof__v1__batch__free_unpacked(b, NULL);
    return rc;
}

static int one_input(const uint8_t *data, size_t size)
{
    struct kp_kineto_opts o;
    struct kp_kineto_meta scan, conv;
    struct sink s = { 0, 0, 0 };
    char err[1024];
    int rc1, rc2;

    memset(&o, 0, sizeof(o));
    o.batch_rows = 8;
    o.max_string_bytes = 4096;
    o.max_name_bytes = 256;
    o.max_depth = 16;
    rc1 = kp_kineto_parse_mem(data, size, &o, NULL, NULL, &scan, err, sizeof(err));
    if (rc1 != 0) {
        return 1; /* rejected cleanly */
    }
    o.meta = &scan;
    o.run_id = 1;
    o.world_size = 1;
    rc2 = kp_kineto_parse_mem(data, size, &o, sink_cb, &s, &conv, err, sizeof(err));
    if (rc2 != 0 || conv.batches != scan.batches || s.batches != conv.batches) {
        abort(); /* a file that scans clean must convert clean, to the same batches */
    }
    uint64_t rows = 0;
    for (int k = 0; k < KP_EV_COUNT; k++) {
        rows += conv.rows[k];
        if (conv.rows[k] != scan.rows[k]) {
            abort();
        }
    }
    if (rows != s.rows) {
        abort();
    }

    /* The importer's path: a scan into a spool (sometimes a file), then its replay, which
     * must give the second parse's batches or decline before sending anything. */
    struct kp_kineto_spool *sp;
    struct kp_kineto_meta scan2, rep;
    struct sink r = { 0, 0, 0 };

    if (kp_kineto_spool_create((size & 7) == 0 ? 64 : 1u << 20, &sp) != 0) {
        return 0;
    }
    o.meta = NULL;
    o.spool = sp;
    if (kp_kineto_parse_mem(data, size, &o, NULL, NULL, &scan2, err, sizeof(err)) != 0 ||
        scan2.batches != scan.batches) {
        abort(); /* the spool must not change the scan */
    }
    o.spool = NULL;
    o.meta = &scan2;
    rc1 = kp_kineto_spool_replay(sp, &o, enc_cb, &r, &rep, err, sizeof(err));
    kp_kineto_spool_destroy(sp);
    if (rc1 == KP_KINETO_REPARSE) {
        if (r.batches != 0) {
            abort();
        }
        return 0;
    }
    if (rc1 != 0 || r.batches != s.batches || r.rows != s.rows || r.hash != s.hash ||
        rep.min_ns != conv.min_ns || rep.max_ns != conv.max_ns) {
        abort();
    }
    return 0;
}

static const char *const seeds[] = {
    "{\"schemaVersion\": 1, \"deviceProperties\": [{\"id\": 0, \"name\": \"H100\", \"numSms\": "
    "132, \"totalGlobalMem\": 85029158912}], \"distributedInfo\": {\"rank\": 0, \"world_size\": 2},"
    " \"traceEvents\": [{\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#5\","
    " \"pid\": 1, \"tid\": 1, \"ts\": 5000.000, \"dur\": 900.000, \"args\": {\"External id\": 1}},"
    " {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::addmm\", \"pid\": 1, \"tid\": 1, \"ts\":"
    " 5030.4, \"dur\": 35.6, \"args\": {\"External id\": 4, \"Input Dims\": [[64], [32, 128]], "
    "\"Input type\": [\"float\", \"Scalar\"], \"Sequence number\": 4, \"Fwd thread id\": 0}},"
    " {\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 1, "
    "\"tid\": 1, \"ts\": 5050, \"dur\": 8.5, \"args\": {\"External id\": 4, \"cbid\": 211, "
    "\"correlation\": 901}}, {\"ph\": \"s\", \"id\": 901, \"pid\": 1, \"tid\": 1, \"ts\": 5050, "
    "\"cat\": \"ac2g\", \"name\": \"ac2g\"}, {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\\u00e9\","
    " \"pid\": 0, \"tid\": 7, \"ts\": 5062.3, \"dur\": 4.1, \"args\": {\"device\": 0, \"stream\": 7,"
    " \"correlation\": 901, \"grid\": [16, 1, 1], \"block\": [384, 1, 1], \"registers per thread\":"
    " 168, \"shared memory\": 1024}}, {\"ph\": \"X\", \"cat\": \"gpu_memcpy\", \"name\": \"Memcpy "
    "HtoD (Pinned -> Device)\", \"pid\": 0, \"tid\": 7, \"ts\": 5100, \"dur\": 12.5, \"args\": "
    "{\"bytes\": 4194304}}, {\"ph\": \"i\", \"s\": \"t\", \"name\": \"[memory]\", \"pid\": 1, "
    "\"tid\": 1, \"ts\": 5031, \"args\": {\"Bytes\": -4096, \"Addr\": 1, \"Device Id\": 0}}, "
    "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"record_param_comms\", \"pid\": 1, \"tid\": 2,"
    " \"ts\": 5700, \"dur\": 30, \"args\": {\"Collective name\": \"allreduce\", \"dtype\": "
    "\"BFloat16\", \"In msg nelems\": 8256, \"Group size\": 2}}, {\"ph\": \"X\", \"cat\": "
    "\"cuda_sync\", \"name\": \"Stream Sync\", \"pid\": 0, \"tid\": 7, \"ts\": 5130, \"dur\": 3},"
    " {\"ph\": \"X\", \"cat\": \"python_function\", \"name\": \"f\", \"pid\": 1, \"tid\": 1, \"ts\":"
    " 5011, \"dur\": 10, \"args\": {\"Python id\": 10, \"Python parent id\": 9}}], "
    "\"baseTimeNanoseconds\": 1759276800000000000}",
    "[{\"ph\": \"X\", \"cat\": \"Operator\", \"name\": \"ProfilerStep#3\", \"pid\": 25738, \"tid\":"
    " \"25738\", \"ts\": 1623142623460111, \"dur\": 2500}, {\"ph\": \"X\", \"cat\": \"Kernel\", "
    "\"name\": \"k\", \"pid\": 0, \"tid\": \"stream 7\", \"ts\": 1623142623460140, \"dur\": 2, "
    "\"args\": {\"device\": 0, \"correlation\": 77, \"external id\": 2, \"blocks per SM\": \"N/A\"}},"
    " {\"ph\": \"X\", \"cat\": \"Memset\", \"name\": \"Memset (Device)\", \"pid\": 1, \"tid\": "
    "\"stream 9\", \"ts\": 1623142623460160, \"dur\": 1}]",
};

static const char *const tokens[] = { "[",
                                      "]",
                                      "{",
                                      "}",
                                      "\"",
                                      ",",
                                      ":",
                                      "\\u",
                                      "\\ud800",
                                      "1e999",
                                      "-",
                                      "0.0005",
                                      "99999999999999999999",
                                      "null",
                                      "\"ts\": ",
                                      "\"args\": {",
                                      "[[[[[[[[",
                                      "\xff",
                                      "\n" };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void self_play(void)
{
    static uint8_t buf[8192];

    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        size_t n = strlen(seeds[s]);

        if (one_input((const uint8_t *) seeds[s], n) != 0) {
            abort();
        }
        for (int iter = 0; iter < 15000; iter++) {
            size_t len = n;

            memcpy(buf, seeds[s], n);
            switch (rng() % 4) {
            case 0:
                len = rng() % (n + 1);
                break;
            case 1:
                for (int j = 0; j < 1 + (int) (rng() % 3); j++) {
                    buf[rng() % n] ^= (uint8_t) (1u << (rng() % 8));
                }
                break;
            case 2: {
                const char *t = tokens[rng() % (sizeof(tokens) / sizeof(tokens[0]))];
                size_t tl = strlen(t), at = rng() % (n + 1);

                memmove(buf + at + tl, buf + at, n - at);
                memcpy(buf + at, t, tl);
                len = n + tl;
                break;
            }
            default: { /* delete a span */
                size_t at = rng() % n, k = 1 + rng() % 16;

                k = at + k > n ? n - at : k;
                memmove(buf + at, buf + at + k, n - at - k);
                len = n - k;
                break;
            }
            }
            one_input(buf, len);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int played;

    if (!played) {
        played = 1;
        self_play();
    }
    one_input(data, size);
    return 0;
}
