/*
 * Analyzer.Export (proto/kprof.proto): kp_export (export.h) served as a server-streaming call.
 * The client sends one ExportRequest; the server answers with each rank's file in
 * ExportChunks (at most KP_EXPORT_CHUNK bytes of data each), the last chunk of a rank with
 * end_of_rank and its figures, then OK.
 *
 * Threads: the gRPC thread only checks the call and hands it to a pool of max_active workers
 * (kp_workq.h, nothing queued: an export starts at once or is refused), each export with a
 * PostgreSQL connection of its own, so a long export never holds up the analyzer's views. The
 * worker waits for each chunk to reach the transport before it builds the next (one chunk in
 * flight): a slow client slows the export, never grows the analyzer's memory. At most
 * max_active exports run at once; past that a call is answered RESOURCE_EXHAUSTED.
 *
 * Statuses: INVALID_ARGUMENT (no request, a negative rank, several ranks for one file),
 * NOT_FOUND (no such run or rank), UNAVAILABLE (PostgreSQL unreachable, or stopping),
 * RESOURCE_EXHAUSTED (too many exports), INTERNAL (anything else). A client that goes away
 * stops its export at the next chunk.
 */
#ifndef KP_EXPORT_RPC_H
#define KP_EXPORT_RPC_H

#include "kp_rpc.h"

struct kp_export_svc;

/* Creates the service and starts its max_active workers (pg_conninfo borrowed: it must outlive
 * the object). Returns 0 and *out, or -ENOMEM or -EAGAIN with a message in errbuf. */
int kp_export_svc_create(const char *pg_conninfo, int max_active, struct kp_export_svc **out,
                         char *errbuf, size_t errlen);

/* The method to register with the gRPC server (borrowed from svc). */
const struct kp_rpc_method *kp_export_svc_method(struct kp_export_svc *svc);

/* Refuses new exports and waits for the running ones to end: call it after
 * kp_rpc_server_shutdown (which cancels their calls) and before kp_rpc_server_destroy (the
 * exports hold references on their calls). Frees svc. Accepts NULL. */
void kp_export_svc_destroy(struct kp_export_svc *svc);

#endif
