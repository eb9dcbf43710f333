/*
 * kp_coordinator: how a client finds collectord's capture coordinator (docs/design.md
 * "Coordinator election"). Several collectord replicas may serve one address; only the
 * elected one answers Attach, ListJobs, StartCapture, StopCapture and CaptureStatus. Any
 * replica answers Control.Coordinator with the coordinator's address. kprofctl's capture
 * verbs ask once per command, the agent each time its Attach call (re)opens.
 */
#ifndef KP_COORDINATOR_H
#define KP_COORDINATOR_H

#include <stddef.h>

#include "kp_rpc.h"

#define KP_COORDINATOR_PATH       "/kprof.v1.Control/Coordinator"
#define KP_COORDINATOR_TIMEOUT_MS 5000

/*
 * Asks the collectord behind ch (reached at target) where the capture coordinator is. Writes
 * into addr (len bytes) the address to connect to for capture calls, or "" when ch itself is
 * the one to use: the answering replica is the coordinator, the answer names target, no
 * coordinator is elected now, or the call failed (an older collectord without the RPC, or
 * one unreachable): the capture call on ch then says what is wrong. Never fails; blocks up to
 * timeout_ms.
 */
void kp_coordinator_resolve(struct kp_rpc_channel *ch, const char *target, long long timeout_ms,
                            char *addr, size_t len);

#endif
