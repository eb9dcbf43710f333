/*
 * kprof-analyzer as an object (docs/design.md "Analysis"): the Analyzer gRPC service
 * (proto/kprof.proto), one unary method per view of view.h's table (Breakdown, Ops, ...,
 * Hta, Memory, Distributed), over the analyzer core (an.h), and the server-streaming
 * Export (export_rpc.h), which runs on threads of its own.
 * analyzer_main.c and the tests drive it through create/destroy.
 *
 * Threads: the gRPC completion-queue thread only queues requests; a pool of workers, each
 * with its own PostgreSQL connection, checks the run, answers from the cache or loads the
 * rank and computes; the HTTP thread serves /healthz, /readyz and /metrics. With web_listen,
 * the JSON HTTP API (web.h) hands its requests to the same queue through kp_analyzer_submit,
 * the one entry point of a view's request whichever front end it came in by.
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

#include <grpc/status.h>
#include <libpq-fe.h>
#include <protobuf-c/protobuf-c.h>

#include "kp_daemon.h"

struct kp_analyzer;
struct kp_auth;
struct kp_view;

#define KP_ANALYZER_DEFAULT_LISTEN "127.0.0.1:7072"

struct kp_analyzer_config {
    struct kp_daemon_config base; /* listen, http_listen, pg_conninfo, TLS, log_level, ready_file */
    long long workers;            /* worker threads, each with its own PostgreSQL connection */
    long long queue_max;          /* requests waiting for a worker */
    long long cache_bytes;        /* packed replies kept; 0 disables the cache */
    long long max_rows; /* a rank with more rows is refused (RESOURCE_EXHAUSTED); 0: none */
    /* bytes the analyses in progress may hold together, each estimated before it starts from
     * the events it reads (view.h bytes_per_event); 0: no budget */
    long long memory_budget;
    /* the breakdown, operator, kernel, memory and roofline views read a rank of more events
     * than this a window of this many host events at a time (kp_an_create_windowed,
     * kp_roofline_create); 0: whole */
    long long window_events;
    long long shutdown_grace_ms;
    char *web_listen; /* the JSON HTTP API (web.h, docs/web-api.md); "" or NULL: off */
    char *web_root;   /* the UI's files (web_static.h); "" or NULL: the installed ones
                       * (KPROF_WEB_ROOT_FROM_BIN), served if they are there */
};

/*
 * Starts the workers (which connect to PostgreSQL lazily: a database that is down makes
 * requests UNAVAILABLE, not the start fail), the gRPC server and the HTTP server, and writes
 * the ready file. cfg's strings are borrowed and must outlive the object. Returns 0 and *out,
 * or a negative code with a message in errbuf.
 */
int kp_analyzer_create(const struct kp_analyzer_config *cfg, struct kp_analyzer **out, char *errbuf,
                       size_t errlen);

/* The bound gRPC, HTTP (/healthz...) and web API ports (0 when not serving that). */
int kp_analyzer_port(const struct kp_analyzer *a);
int kp_analyzer_http_port(const struct kp_analyzer *a);
int kp_analyzer_web_port(const struct kp_analyzer *a);

/* ---- for the front ends other than gRPC (the web API, web.c) ---- */

/* How a view's answer goes back: exactly one of reply (msg borrowed for the call) or error is
 * called, on a worker thread (or on the caller's, for a request refused at once); then
 * release (may be NULL), unless kp_analyzer_submit returned nonzero. */
struct kp_analyzer_sink {
    void (*reply)(void *ud, const ProtobufCMessage *msg);
    void (*error)(void *ud, grpc_status_code code, const char *details);
    void (*release)(void *ud);
    /* NULL, or the request is the view's streaming method (kp_view.stream): its pages come
     * here first, each once the one before has gone (0, or nonzero when the client went away:
     * the compute stops), then reply with the last one. Never from the cache. */
    int (*page)(void *ud, const ProtobufCMessage *msg);
};

/*
 * The one entry point of a view's request, whichever front end it came in by: queues req
 * (owned from here on) for view under the fairness key client (peer: for the log), and a
 * worker checks the run, answers from the cache or computes, as for the gRPC method. Returns
 * 0 (answered later, then released), or nonzero after answering through sink->error at once
 * (RESOURCE_EXHAUSTED: the queue is full; no release).
 */
int kp_analyzer_submit(struct kp_analyzer *a, const struct kp_view *view, ProtobufCMessage *req,
                       const char *client, const char *peer, const struct kp_analyzer_sink *sink,
                       void *ud);

/* Work on a worker's PostgreSQL connection: pg, or NULL with why in pg_err (unreachable, or
 * the analyzer stopping). Called once. */
typedef void kp_analyzer_pg_fn(PGconn *pg, const char *pg_err, void *ud);

/* Queues fn(ud) for a worker under the fairness key client. Returns 0 (fn will be called), or
 * -EBUSY (queue full) or -ENOMEM (fn is not called). */
int kp_analyzer_submit_pg(struct kp_analyzer *a, const char *client, kp_analyzer_pg_fn *fn,
                          void *ud);

/* The caller authentication (NULL: --allow-anonymous) and the settings. */
struct kp_auth *kp_analyzer_auth(struct kp_analyzer *a);
const struct kp_analyzer_config *kp_analyzer_config(const struct kp_analyzer *a);

/* Refuses new calls, lets live ones finish within the grace period (queued requests are
 * answered UNAVAILABLE), joins the workers and frees everything. Accepts NULL. */
void kp_analyzer_destroy(struct kp_analyzer *a);

#endif
