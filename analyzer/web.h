/*
 * kp_web: kprof-analyzer's JSON HTTP API (docs/web-api.md), the base of its web UI, on its own
 * address (--web-listen), served by GNU libmicrohttpd (TLS through its GnuTLS support).
 *
 * Routes (GET only read; JSON in and out):
 *   POST   /api/v1/session              {"token": "..."}: a session cookie for a browser
 *   DELETE /api/v1/session              ends it
 *   GET    /api/v1/views                the views and their request fields
 *   GET    /api/v1/runs?job=&limit=     runs, newest first
 *   GET    /api/v1/runs/{run}           one run
 *   GET    /api/v1/runs/{run}/views/{view}?FIELD=VALUE...   a view (view.h), its request built
 *                                       from the query (kp_pbjson), answered by
 *                                       kp_analyzer_submit: the gRPC method's queue, run check,
 *                                       cache and workers
 *   GET    /api/v1/runs/{run}/export?rank=&format=json|json.gz   a rank's trace, streamed
 *
 * Security: the daemon's own rules (kp_daemon_security): TLS with --tls-cert/--tls-key, else
 * plaintext only on a loopback --web-listen; --allow-anonymous only there too. Callers bring
 * "Authorization: Bearer TOKEN" (the daemon's token table, kp_auth.h) or the session cookie that
 * POST /api/v1/session gave for a token (HttpOnly, SameSite=Strict, Secure with TLS; the token
 * is checked again on each request, so rotating it out ends its sessions). Every route but the
 * session's needs the viewer role (operator has it). Client certificates are not taken here.
 *
 * Limits: KP_WEB_MAX_CONNECTIONS connections (one thread each), KP_WEB_TIMEOUT_S idle seconds,
 * KP_WEB_MEMORY_LIMIT bytes of request line and headers per connection (a longer URL is
 * refused by libmicrohttpd with 414 or 431), KP_WEB_BODY_MAX bytes of body, KP_WEB_SESSIONS
 * sessions (the oldest goes first), each KP_WEB_SESSION_TTL_S seconds long.
 *
 * Threads: libmicrohttpd's thread per connection parses, authenticates and waits for the
 * analyzer's worker to answer; an export streams from a thread of its own through a pipe (a
 * slow client stalls the export, never grows memory).
 */
#ifndef KP_WEB_H
#define KP_WEB_H

#include <stddef.h>

struct kp_analyzer;
struct kp_web;

#define KP_WEB_MAX_CONNECTIONS 64
#define KP_WEB_TIMEOUT_S       60
#define KP_WEB_MEMORY_LIMIT    (32u << 10)
#define KP_WEB_BODY_MAX        4096
#define KP_WEB_SESSIONS        1024
#define KP_WEB_SESSION_TTL_S   (12 * 3600)
#define KP_WEB_RUNS_LIMIT      1000 /* the most runs one /api/v1/runs answers */

/* Serves the API on listen for a (borrowed; it must outlive the object and keep its workers
 * until kp_web_destroy). Checks the security settings as above. Returns 0 and *out, or a
 * negative code (KP_ECONFIG, -errno) with a message in errbuf. */
int kp_web_create(struct kp_analyzer *a, const char *listen, struct kp_web **out, char *errbuf,
                  size_t errlen);

/* The bound port. */
int kp_web_port(const struct kp_web *w);

/* Stops accepting, lets requests in progress end (their analyses are answered by the workers,
 * which must still run), waits for the exports and frees w. Accepts NULL. */
void kp_web_destroy(struct kp_web *w);

#endif
