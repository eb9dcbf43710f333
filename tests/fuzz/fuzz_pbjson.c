/*
 * fuzz_pbjson: kp_pbjson_write, the web API's JSON writer (analyzer/web.c), over any reply a
 * view can give: the first byte picks the message type (the Analyzer's replies of
 * proto/kprof.proto), the rest is unpacked as that message (whatever strings, NaNs, 64-bit
 * values and nesting it holds). The JSON written must be well formed: checked here with a
 * small validator of the grammar (strings as kp_json writes them, numbers, literals, arrays,
 * objects).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_pbjson.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant);

static const ProtobufCMessageDescriptor *const replies[] = {
    &kprof__v1__breakdown_response__descriptor,   &kprof__v1__ops_response__descriptor,
    &kprof__v1__kernels_response__descriptor,     &kprof__v1__compare_response__descriptor,
    &kprof__v1__hta_response__descriptor,         &kprof__v1__memory_response__descriptor,
    &kprof__v1__distributed_response__descriptor, &kprof__v1__export_chunk__descriptor,
    &kprof__v1__counters_response__descriptor,    &kprof__v1__roofline_response__descriptor,
};
#define N_REPLIES (sizeof(replies) / sizeof(replies[0]))

size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant)
{
    Kprof__V1__OpsResponse r = KPROF__V1__OPS_RESPONSE__INIT;
    Kprof__V1__OpRow row = KPROF__V1__OP_ROW__INIT, *rows[] = { &row };
    Kprof__V1__ExportChunk c = KPROF__V1__EXPORT_CHUNK__INIT;
    const ProtobufCMessage *m = &r.base;
    size_t n;

    r.run_id = UINT64_MAX - (uint64_t) variant;
    r.n_rows = 1;
    r.rows = rows;
    row.name = "aten::mm\"\n\xff";
    row.calls = 3;
    row.host_total_ns = -9007199254740993LL;
    buf[0] = 1;
    if (variant % 2 == 1) {
        c.rank = -1;
        c.data.len = 5;
        c.data.data = (uint8_t *) "{\"a\"}";
        m = &c.base;
        buf[0] = 7;
    }
    n = protobuf_c_message_get_packed_size(m);
    if (n + 1 > cap) {
        return 0;
    }
    return 1 + protobuf_c_message_pack(m, buf + 1);
}

/* ---- a JSON validator (RFC 8259's grammar) ---- */

static bool value(const char **p, const char *end, int depth);

static void ws(const char **p, const char *end)
{
    while (*p < end && (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r')) {
        (*p)++;
    }
}

static bool string(const char **p, const char *end)
{
    if (*p >= end || **p != '"') {
        return false;
    }
    for ((*p)++; *p < end; (*p)++) {
        unsigned char c = (unsigned char) **p;

        if (c == '"') {
            (*p)++;
            return true;
        }
        if (c < 0x20) {
            return false;
        }
        if (c == '\\') {
            (*p)++;
            if (*p >= end || strchr("\"\\/bfnrtu", **p) == NULL) {
                return false;
            }
        }
    }
    return false;
}

static bool number(const char **p, const char *end)
{
    const char *s = *p;

    while (*p < end && strchr("-+0123456789.eE", **p) != NULL) {
        (*p)++;
    }
    return *p > s;
}

static bool value(const char **p, const char *end, int depth)
{
    ws(p, end);
    if (*p >= end || depth > 64) {
        return false;
    }
    if (**p == '{' || **p == '[') {
        char close = **p == '{' ? '}' : ']';
        bool obj = **p == '{';

        (*p)++;
        ws(p, end);
        if (*p < end && **p == close) {
            (*p)++;
            return true;
        }
        for (;;) {
            if (obj) {
                ws(p, end);
                if (!string(p, end)) {
                    return false;
                }
                ws(p, end);
                if (*p >= end || *(*p)++ != ':') {
                    return false;
                }
            }
            if (!value(p, end, depth + 1)) {
                return false;
            }
            ws(p, end);
            if (*p < end && **p == ',') {
                (*p)++;
                continue;
            }
            if (*p < end && **p == close) {
                (*p)++;
                return true;
            }
            return false;
        }
    }
    if (**p == '"') {
        return string(p, end);
    }
    if ((size_t) (end - *p) >= 4 && (memcmp(*p, "true", 4) == 0 || memcmp(*p, "null", 4) == 0)) {
        *p += 4;
        return true;
    }
    if ((size_t) (end - *p) >= 5 && memcmp(*p, "false", 5) == 0) {
        *p += 5;
        return true;
    }
    return number(p, end);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ProtobufCMessageDescriptor *d;
    ProtobufCMessage *m;
    struct kp_strbuf sb;
    const char *p, *end;

    if (size < 1) {
        return 0;
    }
    d = replies[data[0] % N_REPLIES];
    if ((m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1)) == NULL) {
        return 0;
    }
    kp_strbuf_init(&sb, 64u << 20);
    if (kp_pbjson_write(&sb, m) == 0) {
        p = sb.data;
        end = sb.data + sb.len;
        if (!value(&p, end, 0) || p != end) {
            abort(); /* not one well-formed JSON value */
        }
    }
    kp_strbuf_fini(&sb);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
