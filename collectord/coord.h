/*
 * kp_coord: collectord's capture coordinator. It knows every attached agent (the
 * Control.Attach streams) and the processes each one hosts, starts captures across them,
 * tracks the state of every rank of every capture from the agents' reports, and decides
 * when a capture is over: when every rank is DONE or FAILED, or at its deadline (unfinished
 * ranks become FAILED), or when an agent stays away longer than the grace period (its
 * unfinished ranks become FAILED).
 *
 * Threads: the Attach callbacks run on the gRPC thread; ListJobs and StopCapture are answered
 * there too (memory only). StartCapture, CaptureStatus and the periodic tick, which need
 * PostgreSQL, run on the control worker (control.c) with its connection. One mutex guards
 * everything; commands to agents are queued on their calls (kp_rpc_call_send never blocks).
 *
 * PostgreSQL: a capture's run (source CAPTURE) plus a `captures` row and one `capture_ranks`
 * row per rank, written when it starts and again when it ends (migration 0003), so status
 * outlives this process. kp_coord_recover adopts the captures a previous coordinator left
 * open, and the agents that reattach drive them on.
 *
 * Only the elected coordinator (leader.h) is active: an inactive kp_coord answers Attach,
 * ListJobs, StartCapture, StopCapture and CaptureStatus with UNAVAILABLE naming the
 * coordinator's address, and its tick does nothing.
 */
#ifndef KP_COORD_H
#define KP_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "kp_rpc.h"
#include "kprof.pb-c.h"

struct kp_coord;

struct kp_coord_opts {
    long long agent_grace_ms;  /* an agent away this long fails its unfinished ranks */
    long long default_steps;   /* StartCapture with neither steps nor duration */
    long long keep_ended;      /* ended captures kept in memory for status */
    long long start_margin_ms; /* time the start step allows for the command to travel */
    long long min_deadline_ms; /* the least deadline a capture gets */
};

int kp_coord_create(const struct kp_coord_opts *o, struct kp_coord **out);

/* Counters for /metrics (docs/design.md "Authorization"). */
struct kp_coord_stats {
    uint64_t attach_refused;  /* Attach calls refused: a host or agent id not the caller's */
    uint64_t foreign_reports; /* rank states an agent reported for ranks it does not host */
};
void kp_coord_get_stats(struct kp_coord *c, struct kp_coord_stats *out);

/* Test and fuzz entry: takes an encoded AgentReport as if the agent in `slot` had sent it on
 * an Attach call (one with no call: commands to it are dropped), and lists the processes
 * it leaves. Returns 0, KP_EPROTO (why says what was wrong) or -ENOMEM. */
int kp_coord_feed_report(struct kp_coord *c, uint32_t slot, const uint8_t *buf, size_t len,
                         char *why, size_t whylen);

/* Ends every Attach call (UNAVAILABLE: the agents reconnect to the next collectord). Before
 * the server's shutdown, so that it need not wait for them. */
void kp_coord_shutdown(struct kp_coord *c);

/* Frees c. After kp_rpc_server_destroy: Attach's on_close may run until then. */
void kp_coord_destroy(struct kp_coord *c);

/* The Control.Attach method (a stream) bound to c. */
struct kp_rpc_method kp_coord_attach_method(struct kp_coord *c);

/* ListJobs and StopCapture: answered at once (any thread). */
void kp_coord_list_jobs(struct kp_coord *c, struct kp_rpc_call *call,
                        const Kprof__V1__ListJobsRequest *req);
void kp_coord_stop(struct kp_coord *c, struct kp_rpc_call *call,
                   const Kprof__V1__StopCaptureRequest *req);

/* StartCapture and CaptureStatus: the control worker, with its connection. */
void kp_coord_start(struct kp_coord *c, PGconn *pg, struct kp_rpc_call *call,
                    const Kprof__V1__StartCaptureRequest *req);
void kp_coord_status(struct kp_coord *c, PGconn *pg, struct kp_rpc_call *call,
                     const Kprof__V1__CaptureStatusRequest *req);

/* Deadlines, lost agents, and ending the captures that are over (PostgreSQL). The control
 * worker calls it every ~100 ms; pg may be NULL while PostgreSQL is down (ending waits). */
void kp_coord_tick(struct kp_coord *c, PGconn *pg);

/* On becoming the coordinator, before kp_coord_set_role(c, true, ...): the captures left open
 * in PostgreSQL (by a coordinator that died or stepped down) are loaded into memory, each rank
 * waiting up to the agent grace for its agent to reattach and report it; the captures this
 * replica held in memory before are dropped first (PostgreSQL has their newest state). Returns
 * the number adopted, or KP_EPG / -ENOMEM (then nothing is adopted). Any thread. */
int kp_coord_recover(struct kp_coord *c, PGconn *pg, char *errbuf, size_t errlen);

/* Makes c the active coordinator, or not. Stepping down ends every Attach call with
 * UNAVAILABLE (the agents re-resolve the coordinator) and drops the captures in memory, which
 * the next coordinator adopts from PostgreSQL. coordinator_addr (copied; NULL or "": none
 * elected) is the address an inactive c names in its refusals. Any thread. */
void kp_coord_set_role(struct kp_coord *c, bool active, const char *coordinator_addr);

/* Whether c is the active coordinator. */
bool kp_coord_active(struct kp_coord *c);

/* If c is not the active coordinator: answers call UNAVAILABLE ("this collectord is not the
 * capture coordinator; it is at ADDR", or "no coordinator elected yet; retry") and returns
 * true. Any thread. */
bool kp_coord_refuse(struct kp_coord *c, struct kp_rpc_call *call);

#endif
