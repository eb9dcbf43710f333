#define KP_LOG_MODULE "coordinator"
#include "kp_coordinator.h"

#include <string.h>

#include "kp_log.h"
#include "kp_str.h"
#include "kprof.pb-c.h"

void kp_coordinator_resolve(struct kp_rpc_channel *ch, const char *target, long long timeout_ms,
                            char *addr, size_t len)
{
    Kprof__V1__CoordinatorRequest req = KPROF__V1__COORDINATOR_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    const Kprof__V1__CoordinatorInfo *in;
    struct kp_rpc_status st;

    addr[0] = '\0';
    memset(&st, 0, sizeof(st));
    if (kp_rpc_unary(ch, KP_COORDINATOR_PATH, &req.base, &kprof__v1__coordinator_info__descriptor,
                     &resp, timeout_ms, &st) != 0) {
        kp_log_debug("Coordinator call failed target=%s status=%s details=\"%s\"", target,
                     kp_rpc_status_name(st.code), st.details);
        return;
    }
    in = (const Kprof__V1__CoordinatorInfo *) resp;
    if (in->elected && !in->is_self && in->address[0] != '\0' &&
        strcmp(in->address, target != NULL ? target : "") != 0) {
        kp_strlcpy(addr, len, in->address);
        kp_log_debug("capture coordinator at %s (asked %s) epoch=%llu", addr, target,
                     (unsigned long long) in->epoch);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
}
