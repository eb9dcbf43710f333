/*
 * What the files of the web API share (web.h): the server's state, a request's state, the
 * answers' writers, authentication and the routes kept in files of their own. Not a contract
 * for anything outside analyzer/web*.c.
 */
#ifndef KP_WEB_INT_H
#define KP_WEB_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <grpc/status.h>
#include <microhttpd.h>

#include "kp_auth.h"
#include "kp_strbuf.h"
#include "web.h"

#define COOKIE_NAME      "kprof_session"
#define SESSION_ID_BYTES 32 /* random bytes, hex in the cookie */
#define TOKEN_MAX        300
#define PREFIX           "/api/v1"
#define JSON_TYPE        "application/json"
/* Every answer's Content-Security-Policy: the pages are same-origin modules and stylesheets
 * only (no inline script or style attribute, no eval, no frames), and reach only this origin. */
#define KP_WEB_CSP                                                                          \
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; " \
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "          \
    "frame-ancestors 'none'"

struct session {
    char id[SESSION_ID_BYTES * 2 + 1]; /* "" when free */
    char token[TOKEN_MAX + 8];         /* checked again on each request (rotation) */
    time_t created;
};

struct kp_web {
    struct kp_analyzer *a;
    struct kp_auth *auth; /* borrowed; NULL: anonymous */
    struct MHD_Daemon *d;
    int port;
    bool tls;
    char *cert, *key; /* PEM, for libmicrohttpd */

    pthread_mutex_t mu; /* sessions, exports */
    pthread_cond_t exports_done;
    struct session *sessions;    /* KP_WEB_SESSIONS */
    struct kp_web_static *files; /* the UI's files (web_static.h); NULL: the API only */
    int exports, max_exports;
};

/* One request's state (libmicrohttpd's con_cls), made by the URI callback. */
struct req {
    char *uri; /* the raw request target, query included */
    struct kp_strbuf body;
    bool started, body_too_big;
};

/* Queues body (len bytes, copied) with status, type and the headers every answer has
 * (nosniff, no-store; Retry-After and Set-Cookie when not NULL; WWW-Authenticate on 401). */
enum MHD_Result kp_web_send_body(struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *body, size_t len, const char *retry_after,
                                 const char *cookie);

/* The headers every answer carries: KP_WEB_CSP, nosniff, no framing, no referrer. */
void kp_web_add_security_headers(struct MHD_Response *r);

/* {"error": {"code": status, "status": "NOT_FOUND", "message": msg}} with status (429 and 503
 * with Retry-After). */
enum MHD_Result kp_web_send_error(struct MHD_Connection *c, unsigned status, const char *msg);

/* sb (a JSON value) and a newline, 200. */
enum MHD_Result kp_web_send_json(struct MHD_Connection *c, struct kp_strbuf *sb);

/* The HTTP status of a gRPC one (docs/web-api.md "Errors"). */
unsigned kp_web_http_of_grpc(grpc_status_code c);

/* Authenticates the request into *id (web_session.c): its bearer token, else its session
 * cookie. Returns 0, or 401 with the reason in why. */
unsigned kp_web_authenticate(struct kp_web *w, struct MHD_Connection *c, struct kp_identity *id,
                             char *why, size_t len);

/* POST and DELETE /api/v1/session (web_session.c). */
enum MHD_Result kp_web_serve_session(struct kp_web *w, struct MHD_Connection *c, const char *method,
                                     struct req *rq);

/* GET /api/v1/runs/{run}/export (web_export.c). */
enum MHD_Result kp_web_serve_export(struct kp_web *w, struct MHD_Connection *c, uint64_t run,
                                    const char *q);

#endif
