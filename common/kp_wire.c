/* kp_wire: message checks and small helpers of the node-local protocol (kp_wire.h). Built
 * into kp_common and, as a source file, into libkprof_inject.so (which links no kp_common). */
#include "kp_wire.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

void kp_wire_hdr_init(struct kp_wire_hdr *h, enum kp_wire_type type, uint32_t len, uint32_t count)
{
    h->magic = KP_WIRE_MAGIC;
    h->version = KP_WIRE_VERSION;
    h->type = (uint16_t) type;
    h->len = len;
    h->count = count;
}

size_t kp_wire_rec_size(uint32_t kind)
{
    switch (kind) {
    case KP_REC_KERNEL:
        return sizeof(struct kp_wire_kernel);
    case KP_REC_MEMCPY:
        return sizeof(struct kp_wire_memcpy);
    case KP_REC_MEMSET:
        return sizeof(struct kp_wire_memset);
    case KP_REC_API:
        return sizeof(struct kp_wire_api);
    case KP_REC_SYNC:
        return sizeof(struct kp_wire_sync);
    case KP_REC_RANGE:
        return sizeof(struct kp_wire_range);
    default:
        return 0;
    }
}

static size_t fixed_payload(uint16_t type)
{
    switch (type) {
    case KP_W_HELLO:
        return sizeof(struct kp_wire_hello);
    case KP_W_WELCOME:
        return sizeof(struct kp_wire_welcome);
    case KP_W_ARM:
        return sizeof(struct kp_wire_arm);
    case KP_W_DISARM:
        return sizeof(struct kp_wire_disarm);
    case KP_W_STATUS:
        return sizeof(struct kp_wire_status);
    case KP_W_RECORDS:
        return sizeof(struct kp_wire_records);
    case KP_W_WINDOW_BEGIN:
    case KP_W_WINDOW_END:
        return sizeof(struct kp_wire_window);
    case KP_W_STEP:
        return sizeof(struct kp_wire_step);
    default:
        return 0;
    }
}

static int fail(const char **why, const char *reason)
{
    if (why != NULL) {
        *why = reason;
    }
    return -EPROTO;
}

int kp_wire_check(const void *msg, size_t n, const char **why)
{
    struct kp_wire_hdr h;

    if (n < sizeof(h)) {
        return fail(why, "message shorter than its header");
    }
    if (n > KP_WIRE_MAX_MSG) {
        return fail(why, "message larger than KP_WIRE_MAX_MSG");
    }
    memcpy(&h, msg, sizeof(h));
    if (h.magic != KP_WIRE_MAGIC) {
        return fail(why, "bad magic (not a kprof peer)");
    }
    if (h.version != KP_WIRE_VERSION) {
        return fail(why, "unsupported wire version");
    }
    if ((size_t) h.len != n - sizeof(h)) {
        return fail(why, "payload length does not match the message size");
    }
    if (h.len < fixed_payload(h.type)) {
        return fail(why, "payload shorter than its message type's struct");
    }
    const unsigned char *p = (const unsigned char *) msg + sizeof(h);
    if (h.type == KP_W_RECORDS) {
        struct kp_wire_records r;
        memcpy(&r, p, sizeof(r));
        if (r.rec_size == 0 || r.rec_size > KP_WIRE_MAX_MSG) {
            return fail(why, "records: bad record size");
        }
        if ((uint64_t) h.count * r.rec_size != h.len - sizeof(r)) {
            return fail(why, "records: count times record size does not match the payload");
        }
    }
    else if (h.type == KP_W_STRINGS) {
        size_t off = 0;
        for (uint32_t i = 0; i < h.count; i++) {
            uint32_t e[2];
            if (h.len - off < sizeof(e)) {
                return fail(why, "strings: entry header past the payload");
            }
            memcpy(e, p + off, sizeof(e));
            off += sizeof(e);
            size_t padded = ((size_t) e[1] + 3u) & ~(size_t) 3u;
            if (e[0] == 0 || e[1] > h.len - off || padded > h.len - off) {
                return fail(why, "strings: bad id or entry length");
            }
            off += padded;
        }
        if (off != h.len) {
            return fail(why, "strings: trailing bytes after the last entry");
        }
    }
    return 0;
}

const char *kp_wire_state_name(uint32_t state)
{
    static const char *const names[] = { "dormant",  "armed", "warmup", "capturing",
                                         "flushing", "done",  "failed" };
    return state < sizeof(names) / sizeof(names[0]) ? names[state] : "?";
}

int kp_wire_parse_activities(const char *s, uint32_t *mask, const char **bad)
{
    static const struct {
        const char *name;
        uint32_t bit;
    } acts[] = { { "kernel", KP_ACT_KERNEL },     { "memcpy", KP_ACT_MEMCPY },
                 { "memset", KP_ACT_MEMSET },     { "runtime", KP_ACT_RUNTIME },
                 { "nvtx", KP_ACT_NVTX },         { "sync", KP_ACT_SYNC },
                 { "overhead", KP_ACT_OVERHEAD }, { "all", KP_ACT_DEFAULT } };
    uint32_t m = 0;
    const char *p = s;

    if (s == NULL || *s == '\0') {
        if (bad != NULL) {
            *bad = s;
        }
        return -EINVAL;
    }
    while (*p != '\0') {
        size_t len = strcspn(p, ",");
        size_t i;
        for (i = 0; i < sizeof(acts) / sizeof(acts[0]); i++) {
            if (strlen(acts[i].name) == len && strncasecmp(acts[i].name, p, len) == 0) {
                m |= acts[i].bit;
                break;
            }
        }
        if (i == sizeof(acts) / sizeof(acts[0])) {
            if (bad != NULL) {
                *bad = p;
            }
            return -EINVAL;
        }
        p += len;
        if (*p == ',') {
            p++;
        }
    }
    *mask = m;
    return 0;
}
