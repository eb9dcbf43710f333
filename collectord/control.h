/*
 * The Control service of kprof-collectord: runs are created (started), ended (stopped),
 * listed and dropped, and captures are started, stopped and followed across the attached
 * agents (coord.h). Requests that need PostgreSQL are handed from the gRPC thread to one
 * worker thread with its own connection (reconnected on demand), which answers them and
 * runs the coordinator's tick every 100 ms.
 */
#ifndef KP_CONTROL_H
#define KP_CONTROL_H

#include <stddef.h>

#include "kp_rpc.h"

struct kp_control;
struct kp_coord;

#define KP_CONTROL_N_METHODS 10

/* Starts the worker. conninfo is copied; coord is borrowed (it must outlive c). Returns 0
 * and *out, or a negative code. */
int kp_control_create(const char *conninfo, struct kp_coord *coord, struct kp_control **out,
                      char *errbuf, size_t errlen);

/* Fills out[KP_CONTROL_N_METHODS] with the Control methods bound to c. */
void kp_control_methods(struct kp_control *c, struct kp_rpc_method *out);

struct kp_ingest;

/* Ends as FAILED, with the reason in runs.end_reason, every OPEN run (other than a capture's)
 * that no live Push stream of ingest feeds and that has had no batch for timeout_ms (0: never):
 * a run whose producer died. Checked on the worker's tick, at most every 5 s. Also makes the
 * worker answer ingest's lookups of who may push into a run (kp_ingest_set_lookup). */
void kp_control_set_open_run_timeout(struct kp_control *c, struct kp_ingest *ingest,
                                     long long timeout_ms);

struct kp_leader;

/* Where Control.Coordinator reads who coordinates (leader.h; borrowed, NULL: none, answered
 * "not elected"). The capture methods are refused by coord.h while this replica is not the
 * coordinator. */
void kp_control_set_leader(struct kp_control *c, struct kp_leader *leader);

/* Answers what is queued with UNAVAILABLE, stops the worker and frees c. Accepts NULL. */
void kp_control_destroy(struct kp_control *c);

#endif
