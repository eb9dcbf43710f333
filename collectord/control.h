/*
 * The Control service of kprof-collectord: runs are created (started), ended (stopped),
 * listed and dropped. Requests are handed from the gRPC thread to one worker thread with its
 * own PostgreSQL connection (reconnected on demand), which answers them.
 */
#ifndef KP_CONTROL_H
#define KP_CONTROL_H

#include <stddef.h>

#include "kp_rpc.h"

struct kp_control;

#define KP_CONTROL_N_METHODS 4

/* Starts the worker. conninfo is copied. Returns 0 and *out, or a negative code. */
int kp_control_create(const char *conninfo, struct kp_control **out, char *errbuf, size_t errlen);

/* Fills out[KP_CONTROL_N_METHODS] with the Control methods bound to c. */
void kp_control_methods(struct kp_control *c, struct kp_rpc_method *out);

/* Answers what is queued with UNAVAILABLE, stops the worker and frees c. Accepts NULL. */
void kp_control_destroy(struct kp_control *c);

#endif
