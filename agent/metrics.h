/*
 * The agent's Prometheus metrics (/metrics), one registry shared by its modules: session.c
 * counts connections and records, capture.c batches and captures, uplink.c acknowledgements
 * and collectord's commands. Every pointer is registered by kp_agent_metrics_init and lives
 * until kp_agent_metrics_fini; kp_metric_add and kp_metric_set are thread-safe, so the loop
 * and the uplink thread both update them.
 */
#ifndef KP_AGENT_METRICS_H
#define KP_AGENT_METRICS_H

#include "kp_metrics.h"

struct kp_agent_metrics {
    struct kp_metrics *reg;
    struct kp_metric *sessions, *records, *dropped_agent, *dropped_lib, *spooled, *acked,
        *spool_full, *spool_bytes, *invalid, *captures, *refused, *malformed, *rec_malformed,
        *terminal, *warmup, *attached, *commands, *commands_dropped, *reports,
        *profiling_admin_only;
};

/* Creates the registry and registers every metric. Returns 0, or a negative errno (then
 * kp_agent_metrics_fini still frees what was made). */
int kp_agent_metrics_init(struct kp_agent_metrics *m);

void kp_agent_metrics_fini(struct kp_agent_metrics *m);

#endif
