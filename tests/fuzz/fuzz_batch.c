/*
 * Fuzz target: the path every byte from the network takes in collectord before PostgreSQL:
 * protobuf-c unpack of a Batch, kp_batch_validate, and for valid batches the COPY text
 * encoding of every kind. Built with -fsanitize=fuzzer under KPROF_FUZZ (clang); otherwise
 * linked with fuzz_main.c, which replays files and a deterministic mutation run for ctest.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kp_codec.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct kp_batch_limits lim = { 4096, 4096, 1 << 16 };
    Kprof__V1__Batch *b = kprof__v1__batch__unpack(NULL, size, data);
    struct kp_strbuf sb;
    int32_t *ids;
    char err[256];

    if (b == NULL) {
        return 0;
    }
    if (kp_batch_validate(b, &lim, err, sizeof(err)) == 0) {
        ids = calloc(b->n_strings + 1, sizeof(*ids));
        kp_strbuf_init(&sb, 0);
        for (size_t i = 0; ids != NULL && i < b->n_strings; i++) {
            ids[i] = (int32_t) i + 1;
        }
        for (int k = 0; ids != NULL && k < KP_EV_COUNT; k++) {
            long rows = kp_codec_copy_text(b, (enum kp_event_kind) k, ids, &sb);

            if (rows >= 0 && (size_t) rows != kp_batch_rows(b, (enum kp_event_kind) k)) {
                abort(); /* the encoder must write every row of a valid batch */
            }
        }
        kp_strbuf_fini(&sb);
        free(ids);
    }
    kprof__v1__batch__free_unpacked(b, NULL);
    return 0;
}
