#define KP_LOG_MODULE "collectord"
#include "collectord.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control.h"
#include "coord.h"
#include "ingest.h"
#include "kp_auth.h"
#include "kp_codec.h"
#include "kp_daemon.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_log.h"
#include "kp_rpc.h"
#include "kp_strbuf.h"
#include "leader.h"
#include "metrics_text.h"
#include "sink_kafka.h"
#include "sink_pg.h"
#include "summary.h"

struct kp_collectord {
    struct kp_collectord_config cfg; /* borrowed strings: the caller's config outlives us */
    struct kp_ingest *ingest;
    struct kp_sink *sink;        /* --sink postgres */
    struct kp_sink_kafka *kafka; /* --sink kafka */
    struct kp_control *control;
    struct kp_coord *coord;
    struct kp_leader *leader;
    struct kp_rpc_method methods[1 + KP_CONTROL_N_METHODS];
    struct kp_rpc_server *server;
    struct kp_http *http;
    struct kp_auth *auth; /* NULL: --allow-anonymous */
    bool summary;         /* kp_summary_start succeeded: kp_summary_stop */
};

const char *const kp_collectord_sinks[] = { "postgres", "kafka", NULL };

static bool healthz(void *ud)
{
    return true;
}

static bool readyz(void *ud, char *why, size_t len)
{
    struct kp_collectord *d = ud;

    if (d->server != NULL && !kp_rpc_server_accepting(d->server, why, len)) {
        return false;
    }
    if (d->kafka != NULL) {
        if (!kp_sink_kafka_ready(d->kafka)) {
            snprintf(why, len, "Kafka has not answered with the topic's metadata yet\n");
            return false;
        }
    }
    else if (!kp_sink_ready(d->sink)) {
        snprintf(why, len, "PostgreSQL is not reachable or the schema is not applied\n");
        return false;
    }
    return true;
}

static int metrics(void *ud, struct kp_strbuf *out)
{
    struct kp_collectord *d = ud;
    struct kp_sink_stats ss = { 0 };
    struct kp_sink_kafka_stats ks = { 0 };
    struct kp_ingest_stats is;
    struct kp_coord_stats cs;
    struct kp_leader_stats ls = { 0 };
    struct kp_summary_stats sum;

    kp_coord_get_stats(d->coord, &cs);
    if (d->leader != NULL) {
        kp_leader_get_stats(d->leader, &ls);
    }
    if (d->kafka != NULL) {
        kp_sink_kafka_get_stats(d->kafka, &ks);
        ss.queued_bytes = ks.queued_bytes;
    }
    else {
        kp_sink_get_stats(d->sink, &ss);
    }
    kp_ingest_get_stats(d->ingest, &is);
#define COUNTER(name, help, v) KP_CD_COUNTER(out, name, help, v)
#define GAUGE(name, help, v)   KP_CD_GAUGE(out, name, help, v)
    COUNTER("streams_opened_total", "Ingest streams opened.", is.streams_opened);
    COUNTER("batches_received_total", "Batches received on Ingest.Push.", is.batches_received);
    COUNTER("batches_invalid_total", "Batches rejected by validation.", is.batches_invalid);
    COUNTER("bytes_received_total", "Encoded batch bytes received.", is.bytes_received);
    COUNTER("stream_pauses_total", "Times a stream stopped reading because the queue was full.",
            is.pauses);
    COUNTER("batches_refused_total",
            "Batches refused PERMISSION_DENIED: a run or rank the caller may not push to.",
            is.batches_refused);
    COUNTER("attach_refused_total",
            "Agent reports refused: a host or agent id that is not the caller's.",
            cs.attach_refused);
    COUNTER("foreign_rank_reports_total",
            "Rank states an agent reported for ranks it does not host (ignored).",
            cs.foreign_reports);
    COUNTER("batches_committed_total", "Batches committed to PostgreSQL.", ss.batches_committed);
    COUNTER("batches_duplicate_total", "Repeated batches recognised and skipped.",
            ss.batches_duplicate);
    COUNTER("batches_rejected_total", "Batches for unknown runs or ranks.", ss.batches_rejected);
    COUNTER("rows_committed_total", "Event rows committed to PostgreSQL.", ss.rows_committed);
    COUNTER("flushes_total", "Flush transactions committed.", ss.flushes);
    COUNTER("flush_failures_total", "Flush transactions rolled back and retried.",
            ss.flush_failures);
    GAUGE("queued_bytes", "Encoded bytes waiting for PostgreSQL (or Kafka, with --sink kafka).",
          ss.queued_bytes);
    GAUGE("queued_batches", "Batches waiting for PostgreSQL.", ss.queued_items);
    if (d->kafka != NULL) {
        COUNTER("kafka_records_produced_total", "Batches produced and acknowledged by Kafka.",
                ks.records_produced);
        COUNTER("kafka_bytes_produced_total", "Encoded batch bytes acknowledged by Kafka.",
                ks.bytes_produced);
        COUNTER("kafka_delivery_failures_total",
                "Batches Kafka did not acknowledge in time (answered UNAVAILABLE; resent).",
                ks.delivery_failures);
        COUNTER("kafka_batches_rejected_total",
                "Batches refused before Kafka: unknown run or rank outside its world size.",
                ks.batches_rejected);
        GAUGE("kafka_inflight_bytes",
              "Encoded bytes submitted to the Kafka sink and not yet acknowledged.",
              ks.queued_bytes);
        GAUGE("kafka_inflight_records", "Records produced and not yet acknowledged by Kafka.",
              ks.inflight_records);
    }
    GAUGE("coordinator", "1 when this replica is the active capture coordinator.",
          kp_coord_active(d->coord) ? 1 : 0);
    COUNTER("coordinator_takeovers_total", "Times this replica became the capture coordinator.",
            ls.takeovers);
    COUNTER("coordinator_step_downs_total",
            "Times this replica stopped coordinating (its lock connection failed).", ls.step_downs);
    kp_summary_get_stats(&sum);
    COUNTER("compare_summaries_total",
            "Runs summarised for compare when they ended (collectord/summary.h).", sum.made);
    COUNTER("compare_summary_failures_total",
            "Compare summaries that failed (the run is compared from its events).", sum.failed);
    COUNTER("compare_summary_milliseconds_total", "Time spent making compare summaries.",
            (uint64_t) (sum.seconds * 1000.0));
    COUNTER("kernels_compacted_total",
            "Kernel rows of ended runs moved into compressed chunks (kernel_chunks).",
            sum.kernels_compacted);
    COUNTER("kernel_compaction_milliseconds_total", "Time spent compacting kernel rows.",
            (uint64_t) (sum.compact_seconds * 1000.0));
    COUNTER("runs_settled_total",
            "Ended runs whose partitions were indexed by rank and analysed (kp_settle_run).",
            sum.settled);
    COUNTER("run_settle_milliseconds_total", "Time spent settling ended runs' partitions.",
            (uint64_t) (sum.settle_seconds * 1000.0));
    COUNTER("grpc_listener_restarts_total",
            "gRPC listeners restarted after they stopped accepting (out of file descriptors).",
            d->server != NULL ? kp_rpc_server_restarts(d->server) : 0);
#undef COUNTER
#undef GAUGE
    return 0;
}

int kp_collectord_create(const struct kp_collectord_config *cfg, struct kp_collectord **out,
                         char *errbuf, size_t errlen)
{
    struct kp_collectord *d = calloc(1, sizeof(*d));
    struct kp_batch_limits limits = {
        .max_name_bytes = (size_t) cfg->max_name_bytes,
        .max_strings = KP_CODEC_DEFAULT_MAX_STRINGS,
        .max_rows = KP_CODEC_DEFAULT_MAX_ROWS,
    };
    struct kp_sink_config scfg = {
        .conninfo = cfg->base.pg_conninfo,
        .queue_max_bytes = (size_t) cfg->queue_max_bytes,
        .flush_max_rows = (size_t) cfg->flush_max_rows,
        .flush_interval_ms = cfg->flush_interval_ms,
        .retry_max_ms = cfg->retry_max_ms,
    };
    struct kp_rpc_server_opts sopts = {
        .listen = cfg->base.listen,
        .max_message_bytes = (size_t) cfg->max_message_bytes,
        .tls_cert_file = cfg->base.tls_cert,
        .tls_key_file = cfg->base.tls_key,
        .name = "kprof-collectord",
    };
    struct kp_http_handlers hh = { .healthz = healthz, .readyz = readyz, .metrics = metrics };
    char grpc[32];
    int rc;

    if (d == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    d->cfg = *cfg;
    if ((rc = kp_daemon_security(&cfg->base, &d->auth, errbuf, errlen)) != 0) {
        goto fail;
    }
    sopts.auth = d->auth;
    sopts.tls_client_ca_file = cfg->base.tls_client_ca;
    if ((rc = kp_codec_selfcheck(errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((d->ingest = kp_ingest_create(&limits)) == NULL) {
        rc = -ENOMEM;
        snprintf(errbuf, errlen, "out of memory");
        goto fail;
    }
    if (cfg->sink == KP_COLLECTORD_SINK_KAFKA) {
        struct kp_sink_kafka_config kcfg = {
            .brokers = cfg->kafka_brokers,
            .topic = cfg->kafka_topic,
            .properties = cfg->kafka_properties,
            .properties_file = cfg->kafka_properties_file,
            .conninfo = cfg->base.pg_conninfo,
            .queue_max_bytes = (size_t) cfg->queue_max_bytes,
        };

        if (cfg->kafka_brokers == NULL || cfg->kafka_brokers[0] == '\0') {
            snprintf(errbuf, errlen, "--sink kafka needs --kafka-brokers HOST:PORT,...");
            rc = KP_ECONFIG;
            goto fail;
        }
        if ((rc = kp_sink_kafka_create(&kcfg, kp_ingest_done_cb, d->ingest, &d->kafka, errbuf,
                                       errlen)) != 0) {
            goto fail;
        }
        kp_ingest_set_sink(d->ingest, &kp_sink_kafka_ops, d->kafka);
    }
    else {
        if ((rc = kp_sink_create(&scfg, kp_ingest_done_cb, d->ingest, &d->sink, errbuf, errlen)) !=
            0) {
            goto fail;
        }
        kp_ingest_set_sink(d->ingest, &kp_sink_pg_ops, d->sink);
    }
    /* One client may hold a quarter of the queue: the others still get in. */
    kp_ingest_set_stream_max(d->ingest, (size_t) cfg->queue_max_bytes / 4);
    struct kp_coord_opts copts = { .agent_grace_ms = cfg->agent_grace_ms };

    if ((rc = kp_coord_create(&copts, &d->coord)) != 0) {
        snprintf(errbuf, errlen, "out of memory");
        goto fail;
    }
    /* No captures until the election says this replica coordinates (leader.h). */
    kp_coord_set_role(d->coord, false, "");
    if ((rc = kp_summary_start(cfg->base.pg_conninfo, errbuf, errlen)) != 0) {
        goto fail;
    }
    d->summary = true;
    if ((rc = kp_control_create(cfg->base.pg_conninfo, d->coord, &d->control, errbuf, errlen)) !=
        0) {
        goto fail;
    }
    kp_control_set_open_run_timeout(d->control, d->ingest, cfg->open_run_timeout_ms);
    d->methods[0] = kp_ingest_method(d->ingest);
    kp_control_methods(d->control, &d->methods[1]);
    if ((rc = kp_rpc_server_create(&sopts, d->methods, 1 + KP_CONTROL_N_METHODS, &d->server, errbuf,
                                   errlen)) != 0) {
        goto fail;
    }
    {
        char adv[256];
        struct kp_leader_opts lo = { .conninfo = cfg->base.pg_conninfo,
                                     .take_part = cfg->coordinator,
                                     .poll_ms = cfg->coordinator_poll_ms,
                                     .advertise = adv,
                                     .coord = d->coord };

        if (cfg->advertise_address != NULL && cfg->advertise_address[0] != '\0') {
            snprintf(adv, sizeof(adv), "%s", cfg->advertise_address);
        }
        else {
            kp_leader_default_advertise(cfg->base.listen, kp_collectord_port(d), adv, sizeof(adv));
        }
        if ((rc = kp_leader_create(&lo, &d->leader, errbuf, errlen)) != 0) {
            goto fail;
        }
        kp_control_set_leader(d->control, d->leader);
    }
    if ((rc = kp_daemon_http_start(cfg->base.http_listen, cfg->base.metrics_token, &hh, d, &d->http,
                                   errbuf, errlen)) != 0) {
        goto fail;
    }
    snprintf(grpc, sizeof(grpc), "127.0.0.1:%d", kp_collectord_port(d));
    if ((rc = kp_daemon_ready_write(cfg->base.ready_file, &(struct kp_ready_entry){ "grpc", grpc },
                                    1, d->http, errbuf, errlen)) != 0) {
        goto fail;
    }
    kp_log_info("serving grpc=%s port=%d http_port=%d", cfg->base.listen, kp_collectord_port(d),
                kp_collectord_http_port(d));
    *out = d;
    return 0;
fail:
    kp_collectord_destroy(d);
    return rc;
}

int kp_collectord_port(const struct kp_collectord *d)
{
    return d->server != NULL ? kp_rpc_server_port(d->server) : 0;
}

int kp_collectord_http_port(const struct kp_collectord *d)
{
    return d->http != NULL ? kp_http_port(d->http) : 0;
}

void kp_collectord_destroy(struct kp_collectord *d)
{
    if (d == NULL) {
        return;
    }
    /*
     * Order matters: stop taking calls and let live streams end (their batches still commit),
     * then flush and free the sink (its last done_cb may still send on calls, which is safe
     * until the server is destroyed), then the server, whose queue drains the last tags.
     */
    kp_http_destroy(d->http);
    if (d->control != NULL) {
        kp_control_set_leader(d->control, NULL);
    }
    kp_leader_destroy(d->leader); /* steps down first: a standby takes over at once */
    if (d->coord != NULL) {
        kp_coord_shutdown(d->coord); /* agents' Attach calls never end by themselves */
    }
    if (d->server != NULL) {
        kp_rpc_server_shutdown(d->server, d->cfg.shutdown_grace_ms);
    }
    kp_sink_destroy(d->sink, d->cfg.shutdown_grace_ms);
    kp_sink_kafka_destroy(d->kafka, d->cfg.shutdown_grace_ms);
    kp_control_destroy(d->control);
    kp_rpc_server_destroy(d->server);
    kp_coord_destroy(d->coord);
    if (d->summary) { /* after what ends runs: control, coord */
        kp_summary_stop();
    }
    kp_ingest_destroy(d->ingest);
    kp_auth_destroy(d->auth);
    free(d);
}
