/*
 * A tiny HTTP/1.1 server for a daemon's /healthz, /readyz and /metrics (docs/style.md §7).
 *
 * One thread polls the listening socket and the open connections. Each connection carries
 * one request: the server reads it (at most KP_HTTP_MAX_REQUEST_BYTES of request line and
 * headers, else 431), answers, sends "Connection: close" and closes. Only GET is served
 * (other methods get 405); paths other than the three get 404; a malformed request line gets
 * 400. A connection that has not sent a whole request within the read timeout gets 408 and is
 * closed, and so does one that does not take its response within the same time. At the cap, a
 * new connection takes the slot of the oldest one still sending its request (answered 408).
 * When every slot is sending or draining a response (clients that do not read theirs), a new
 * connection gets one of 4 probe slots kept apart for /healthz and /readyz (anything else
 * there is answered 503 "too many connections"; a probe slot closes as soon as its answer is
 * sent), so a liveness probe is never refused by other clients. Past those, connections are
 * accepted, answered 503 and closed, so the server never stalls its other clients. When the
 * process is out of file descriptors (EMFILE), a spare descriptor held for the purpose is
 * given back to accept one connection at a time, so probes still get their answer. The query
 * string is ignored.
 *
 * With a metrics token (kp_http_limits.metrics_token), /metrics answers 401 with
 * "WWW-Authenticate: Bearer" unless the request carries "Authorization: Bearer <token>";
 * /healthz and /readyz stay open.
 *
 *   /healthz  200 "ok\n", or 503 "unhealthy\n" when healthz_cb returns false.
 *   /readyz   200 "ok\n", or 503 with the reason readyz_cb wrote, plus "\n".
 *   /metrics  200 with what metrics_cb appended (Prometheus text format 0.0.4), or 500 if it
 *             failed or passed the response cap.
 *
 * The callbacks run on the server's thread, one at a time, while other requests wait: keep
 * them short and non-blocking (read atomics or a snapshot, never wait on I/O), and make what
 * they read safe against the daemon's other threads.
 */
#ifndef KP_HTTP_H
#define KP_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kp_http;
struct kp_strbuf;

#define KP_HTTP_DEFAULT_LISTEN             "127.0.0.1:0"
#define KP_HTTP_MAX_REQUEST_BYTES          8192
#define KP_HTTP_DEFAULT_MAX_CONNS          16
#define KP_HTTP_DEFAULT_TIMEOUT_MS         5000
#define KP_HTTP_DEFAULT_MAX_RESPONSE_BYTES (16u << 20)

/* Returns true while the daemon's loop turns. Runs on the HTTP thread. */
typedef bool kp_http_healthz_cb(void *ud);

/* Returns true when the daemon can do its work; when false, writes a one-line reason
 * (NUL-terminated, at most len bytes) to why. Runs on the HTTP thread. */
typedef bool kp_http_readyz_cb(void *ud, char *why, size_t len);

/* Appends Prometheus text to out (borrowed; capped at max_response_bytes). Returns 0, or a
 * negative code to answer 500. Runs on the HTTP thread. */
typedef int kp_http_metrics_cb(void *ud, struct kp_strbuf *out);

/* The callbacks; a NULL one means: /healthz always ok, /readyz always ready, /metrics
 * empty. */
struct kp_http_handlers {
    kp_http_healthz_cb *healthz;
    kp_http_readyz_cb *readyz;
    kp_http_metrics_cb *metrics;
};

/* Limits; a field left 0 takes its default. */
struct kp_http_limits {
    int max_conns;             /* open connections (default KP_HTTP_DEFAULT_MAX_CONNS) */
    int timeout_ms;            /* to receive a request, and again to send the response */
    size_t max_response_bytes; /* body cap; a bigger /metrics answers 500 */
    const char *metrics_token; /* copied; NULL or "": /metrics needs no token */
};

/* Counters, for the daemon's /metrics and for tests. */
struct kp_http_stats {
    uint64_t requests;       /* answered, any status, except the two below */
    uint64_t rejected_conns; /* answered 503: every slot busy, none still reading its request,
                              * or a probe slot asked for another path */
    uint64_t timeouts;       /* closed by the timeout, or answered 408 to free a slot for a
                              * new connection (the oldest that had not sent its request) */
    uint64_t oversized;      /* answered 431 */
    uint64_t bad_requests;   /* answered 400, 404 or 405 */
    uint64_t unauthorized;   /* /metrics answered 401 */
};

/*
 * Binds listen_addr ("host:port", "[v6addr]:port", ":port" for all interfaces; port 0 picks
 * a free one; NULL or "" means KP_HTTP_DEFAULT_LISTEN) and starts the server thread. h and ud are
 * borrowed and must stay valid until kp_http_destroy(). Returns 0 and sets *out (owned:
 * kp_http_destroy), -EINVAL for an unparsable address, or -errno from
 * getaddrinfo/socket/bind/listen/pthread_create, with a message in errbuf.
 */
int kp_http_create(const char *listen_addr, const struct kp_http_handlers *h, void *ud,
                   struct kp_http **out, char *errbuf, size_t errlen);

/* As kp_http_create(), with limits (borrowed for the call; NULL: all defaults). */
int kp_http_create_with_limits(const char *listen_addr, const struct kp_http_handlers *h,
                               const struct kp_http_limits *limits, void *ud, struct kp_http **out,
                               char *errbuf, size_t errlen);

/* Returns the bound TCP port (the real one when listen asked for 0). Thread-safe. */
int kp_http_port(const struct kp_http *s);

/* Copies the counters. Thread-safe. */
void kp_http_get_stats(const struct kp_http *s, struct kp_http_stats *out);

/* Stops the thread (waits for the callback in progress, if any), closes every connection
 * and frees s. Accepts NULL. Call from a thread other than the server's. */
void kp_http_destroy(struct kp_http *s);

#endif
