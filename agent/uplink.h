/*
 * kp_uplink: everything the agent says to and hears from collectord.
 *
 * Data: a thread of its own reads the spool in seq order and pushes it on one Ingest.Push
 * stream (kp_push) with stream = the spool's stream id and seq = the spool seq, so a replay
 * after any crash or reconnect is deduplicated by collectord; the spool is acknowledged, and
 * trimmed, as collectord acknowledges. A batch collectord refuses for good is logged, counted
 * and acknowledged (dropped), so one bad batch cannot stall the stream. The push retries
 * forever: the spool absorbs an outage up to --spool-max-bytes.
 *
 * Control: with attach set, a Control.Attach call (attach.h) to collectord's coordinator. The
 * coordinator's CaptureCommands (ARM, STOP, FORGET) are applied to the capture set on the
 * loop thread; the AgentReport (every registered process, every capture's ranks) is built on
 * the loop's tick and published when something but the step ages changed, and at least every
 * KP_UPLINK_REPORT_MS.
 *
 * Ownership: the uplink borrows the channel, the spool, the sessions, the captures and the
 * metrics (they must outlive it); it owns its thread and the attach. Threads: kp_uplink_acked
 * from any thread; the others from the loop thread. Errors: 0 or a negative errno, with a
 * message in errbuf.
 */
#ifndef KP_UPLINK_H
#define KP_UPLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kp_agent_metrics;
struct kp_captures;
struct kp_rpc_channel;
struct kp_sessions;
struct kp_spool;
struct kp_uplink;

/* Reports are published at least this often (heartbeats aside: attach.h). */
#define KP_UPLINK_REPORT_MS 500

struct kp_uplink_config {
    struct kp_rpc_channel *ch;
    const char *collector; /* collectord's address, for logs */
    /* ch's options, to reach the capture coordinator when it is another replica (attach.h;
     * borrowed for the uplink's life) */
    const struct kp_rpc_channel_opts *chopts;
    struct kp_spool *spool;
    struct kp_sessions *sessions;
    struct kp_captures *captures;
    struct kp_agent_metrics *metrics;
    bool attach;      /* false: data only, no reports and no commands */
    int wake_fd;      /* the loop's eventfd: written when commands are queued */
    const char *host; /* this node, in the reports (valid UTF-8) */
    uint64_t agent_id;
};

/* Starts the push thread and (attach) the Control.Attach thread. Returns 0 and *out
 * (kp_uplink_destroy), or a negative errno with errbuf. */
int kp_uplink_create(const struct kp_uplink_config *cfg, struct kp_uplink **out, char *errbuf,
                     size_t errlen);

/* Stops and joins the threads (promptly, even with collectord frozen mid-stream) and frees
 * the uplink. Accepts NULL. */
void kp_uplink_destroy(struct kp_uplink *up);

/* Every spool seq <= this is acknowledged by collectord. Any thread. */
uint64_t kp_uplink_acked(struct kp_uplink *up);

/* Applies the commands the attach thread queued (the loop's eventfd fired, or its tick); the
 * ranks' new states are reported at once. */
void kp_uplink_commands(struct kp_uplink *up);

/* The loop's tick: builds the report and publishes it when due; refreshes the metrics of the
 * attach. */
void kp_uplink_tick(struct kp_uplink *up, long long now);

#endif
