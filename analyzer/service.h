/*
 * kprof-analyzer as an object (docs/design.md "Analysis"): the Analyzer gRPC service
 * (proto/kprof.proto), one unary method per view of view.h's table (Breakdown, Ops, ...,
 * Hta, Memory, Distributed), over the analyzer core (an.h), and the server-streaming
 * Export (export_rpc.h), which runs on threads of its own.
 * analyzer_main.c and the tests drive it through create/destroy.
 *
 * Threads: the gRPC completion-queue thread only queues requests; a pool of workers, each
 * with its own PostgreSQL connection, checks the run, answers from the cache or loads the
 * rank and computes; the HTTP thread serves /healthz, /readyz and /metrics.
 *
 * Queue: at most queue_max requests wait; past that a request is answered RESOURCE_EXHAUSTED
 * (counted, logged at most once a second).
 *
 * Cache: the packed reply per (view, run, rank, options: the view's key function), at most
 * cache_bytes in all, least recently used evicted first. Each entry carries the run's version when
 * it was computed: its state and its count of committed ingest batches, read with one cheap query
 * per request. A run that received a batch or changed state since is recomputed; an ENDED run's
 * result is reused until evicted. The cache has one mutex, never held across PostgreSQL or gRPC
 * calls.
 */
#ifndef KP_ANALYZER_SERVICE_H
#define KP_ANALYZER_SERVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "kp_daemon.h"

struct kp_analyzer;

#define KP_ANALYZER_DEFAULT_LISTEN "127.0.0.1:7072"

struct kp_analyzer_config {
    struct kp_daemon_config base; /* listen, http_listen, pg_conninfo, TLS, log_level, ready_file */
    long long workers;            /* worker threads, each with its own PostgreSQL connection */
    long long queue_max;          /* requests waiting for a worker */
    long long cache_bytes;        /* packed replies kept; 0 disables the cache */
    long long max_rows; /* a rank with more rows is refused (RESOURCE_EXHAUSTED); 0: none */
    long long shutdown_grace_ms;
};

/*
 * Starts the workers (which connect to PostgreSQL lazily: a database that is down makes
 * requests UNAVAILABLE, not the start fail), the gRPC server and the HTTP server, and writes
 * the ready file. cfg's strings are borrowed and must outlive the object. Returns 0 and *out,
 * or a negative code with a message in errbuf.
 */
int kp_analyzer_create(const struct kp_analyzer_config *cfg, struct kp_analyzer **out, char *errbuf,
                       size_t errlen);

/* The bound gRPC and HTTP ports (0 when not serving that). */
int kp_analyzer_port(const struct kp_analyzer *a);
int kp_analyzer_http_port(const struct kp_analyzer *a);

/* Refuses new calls, lets live ones finish within the grace period (queued requests are
 * answered UNAVAILABLE), joins the workers and frees everything. Accepts NULL. */
void kp_analyzer_destroy(struct kp_analyzer *a);

#endif
