/*
 * fuzz_query: the web API's query strings (analyzer/web.c), which kp_pbjson_query turns into a
 * view's request message. The first byte picks the request (every Analyzer request of
 * proto/kprof.proto), the rest is the query. Any input must be refused with a message or
 * parsed without a crash or sanitizer report; a parsed message must pack, unpack and be
 * written as JSON, and free cleanly.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_pbjson.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant);

static const ProtobufCMessageDescriptor *const requests[] = {
    &kprof__v1__breakdown_request__descriptor, &kprof__v1__ops_request__descriptor,
    &kprof__v1__kernels_request__descriptor,   &kprof__v1__compare_request__descriptor,
    &kprof__v1__hta_request__descriptor,       &kprof__v1__export_request__descriptor,
};
#define N_REQUESTS (sizeof(requests) / sizeof(requests[0]))

size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant)
{
    static const char *const seeds[] = {
        "\001rank=0&group_by=OPS_GROUP_BY_NAME_AND_SHAPES",
        "\003has_step=true&step=-3&thresholds.late_pct=2.5&hta_candidates=4&max_rows=0x10",
        "\004analysis=HTA_IDLE&exact_ns=1&consecutive_kernel_delay_ns=30000&rank=%31",
        "\000plugin_compat=false&rank=2147483647&&",
    };
    const char *s = seeds[variant % 4];
    size_t n = 1 + strlen(s + 1);

    n = n > cap ? cap : n;
    memcpy(buf, s, n);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const reserved[] = { "run_id", NULL };
    const ProtobufCMessageDescriptor *d;
    ProtobufCMessage *m, *back;
    struct kp_strbuf sb;
    char err[1024];
    uint8_t *packed;
    size_t len;

    if (size < 1) {
        return 0;
    }
    d = requests[data[0] % N_REQUESTS];
    if ((m = malloc(d->sizeof_message)) == NULL) {
        return 0;
    }
    protobuf_c_message_init(d, m);
    err[0] = '\0';
    if (kp_pbjson_query(m, (const char *) data + 1, size - 1, reserved, err, sizeof(err)) != 0) {
        if (err[0] == '\0') {
            abort(); /* a refusal always says why */
        }
        protobuf_c_message_free_unpacked(m, NULL);
        return 0;
    }
    len = protobuf_c_message_get_packed_size(m);
    packed = malloc(len ? len : 1);
    if (packed != NULL) {
        protobuf_c_message_pack(m, packed);
        back = protobuf_c_message_unpack(d, NULL, len, packed);
        if (back == NULL) {
            abort(); /* what the parser built must be a valid message */
        }
        protobuf_c_message_free_unpacked(back, NULL);
        free(packed);
    }
    kp_strbuf_init(&sb, 1u << 20);
    kp_pbjson_write(&sb, m);
    kp_strbuf_fini(&sb);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
