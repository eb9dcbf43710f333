/* The agent's metrics: see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <string.h>

static int metric(struct kp_agent_metrics *m, struct kp_metric **out, const char *name,
                  const char *help, enum kp_metric_type t, const char *lk, const char *lv)
{
    return kp_metrics_register(m->reg, name, help, t, lk, lv, out);
}

int kp_agent_metrics_init(struct kp_agent_metrics *m)
{
    const enum kp_metric_type C = KP_METRIC_COUNTER, G = KP_METRIC_GAUGE;
    const char *drop = "Records dropped, by reason.";
    int rc;

    memset(m, 0, sizeof(*m));
    if ((rc = kp_metrics_create(32, &m->reg)) != 0) {
        return rc;
    }
    rc |= metric(m, &m->sessions, "kprof_agent_sessions", "Connected processes.", G, NULL, NULL);
    rc |= metric(m, &m->records, "kprof_agent_records_total", "Records received.", C, NULL, NULL);
    rc |= metric(m, &m->dropped_agent, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "agent");
    rc |= metric(m, &m->dropped_lib, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "library");
    rc |= metric(m, &m->warmup, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "outside_window");
    rc |= metric(m, &m->spooled, "kprof_agent_batches_spooled_total", "Batches spooled.", C, NULL,
                 NULL);
    rc |= metric(m, &m->acked, "kprof_agent_batches_acked_total",
                 "Batches acknowledged by collectord.", C, NULL, NULL);
    rc |= metric(m, &m->spool_full, "kprof_agent_batches_dropped_total", "Batches dropped.", C,
                 "reason", "spool_full");
    rc |= metric(m, &m->terminal, "kprof_agent_batches_dropped_total", "Batches dropped.", C,
                 "reason", "refused");
    rc |= metric(m, &m->invalid, "kprof_agent_batches_dropped_total", "Batches dropped.", C,
                 "reason", "invalid");
    rc |=
        metric(m, &m->spool_bytes, "kprof_agent_spool_bytes", "Bytes in the spool.", G, NULL, NULL);
    rc |= metric(m, &m->captures, "kprof_agent_captures_total", "Captures armed.", C, NULL, NULL);
    rc |= metric(m, &m->refused, "kprof_agent_connections_refused_total",
                 "Connections refused (uid, limit).", C, NULL, NULL);
    rc |= metric(m, &m->rec_malformed, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "malformed");
    rc |= metric(m, &m->malformed, "kprof_agent_malformed_messages_total",
                 "Connections closed for a malformed message.", C, NULL, NULL);
    rc |= metric(m, &m->attached, "kprof_agent_attached",
                 "1 while the Control.Attach call to collectord is up.", G, NULL, NULL);
    rc |= metric(m, &m->commands, "kprof_agent_capture_commands_total",
                 "Capture commands received from collectord.", C, NULL, NULL);
    rc |= metric(m, &m->commands_dropped, "kprof_agent_capture_commands_dropped_total",
                 "Capture commands dropped (queue full or not unpackable).", C, NULL, NULL);
    rc |= metric(m, &m->reports, "kprof_agent_reports_sent_total",
                 "Reports sent to collectord (heartbeats included).", C, NULL, NULL);
    rc |= metric(m, &m->profiling_admin_only, "kprof_agent_gpu_profiling_admin_only",
                 "The NVIDIA driver's RmProfilingAdminOnly at start: 1 GPU performance counters "
                 "are admin-only, 0 open to every user, -1 unknown (no driver).",
                 G, NULL, NULL);
    return rc != 0 ? -EINVAL : 0;
}

void kp_agent_metrics_fini(struct kp_agent_metrics *m)
{
    kp_metrics_destroy(m->reg);
    m->reg = NULL;
}
