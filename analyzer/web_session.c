#define KP_LOG_MODULE "web"
/* The web API's sessions and authentication (web.h "Security"). */
#include "web_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "kp_json.h"
#include "kp_log.h"

/* ---- sessions ---------------------------------------------------------------------------- */

static bool session_id_new(char out[SESSION_ID_BYTES * 2 + 1])
{
    unsigned char r[SESSION_ID_BYTES];

    if (getrandom(r, sizeof(r), 0) != (ssize_t) sizeof(r)) {
        return false;
    }
    for (size_t i = 0; i < sizeof(r); i++) {
        snprintf(out + 2 * i, 3, "%02x", r[i]);
    }
    return true;
}

/* Whether two session ids (SESSION_ID_BYTES * 2 characters each) are equal, in a time that does
 * not depend on where they differ (an id is a credential). */
static bool id_eq(const char *x, const char *y)
{
    unsigned char d = 0;

    for (size_t i = 0; i < SESSION_ID_BYTES * 2; i++) {
        d |= (unsigned char) (x[i] ^ y[i]);
    }
    return d == 0;
}

/* The token of the live session id (copied to token), or false. Drops it when expired. */
static bool session_token(struct kp_web *w, const char *id, char *token, size_t len)
{
    time_t now = time(NULL);
    bool found = false;

    if (strlen(id) != SESSION_ID_BYTES * 2) {
        return false;
    }
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < KP_WEB_SESSIONS; i++) {
        struct session *s = &w->sessions[i];

        if (s->id[0] != '\0' && id_eq(s->id, id)) {
            if (now - s->created >= KP_WEB_SESSION_TTL_S) {
                explicit_bzero(s, sizeof(*s));
            }
            else {
                snprintf(token, len, "%s", s->token);
                found = true;
            }
            break;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return found;
}

/* Keeps a session for token in a free (or expired, or else the oldest) slot; its id in id. */
static bool session_add(struct kp_web *w, const char *token, char id[SESSION_ID_BYTES * 2 + 1])
{
    time_t now = time(NULL);
    size_t pick = 0;

    if (!session_id_new(id)) {
        return false;
    }
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < KP_WEB_SESSIONS; i++) {
        struct session *s = &w->sessions[i];

        if (s->id[0] == '\0' || now - s->created >= KP_WEB_SESSION_TTL_S) {
            pick = i;
            break;
        }
        if (s->created < w->sessions[pick].created) {
            pick = i;
        }
    }
    snprintf(w->sessions[pick].id, sizeof(w->sessions[pick].id), "%s", id);
    snprintf(w->sessions[pick].token, sizeof(w->sessions[pick].token), "%s", token);
    w->sessions[pick].created = now;
    pthread_mutex_unlock(&w->mu);
    return true;
}

static void session_end(struct kp_web *w, const char *id)
{
    if (strlen(id) != SESSION_ID_BYTES * 2) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < KP_WEB_SESSIONS; i++) {
        if (w->sessions[i].id[0] != '\0' && id_eq(w->sessions[i].id, id)) {
            explicit_bzero(&w->sessions[i], sizeof(w->sessions[i]));
        }
    }
    pthread_mutex_unlock(&w->mu);
}

/* ---- authentication ---------------------------------------------------------------------- */

unsigned kp_web_authenticate(struct kp_web *w, struct MHD_Connection *c, struct kp_identity *id,
                             char *why, size_t len)
{
    const char *authz = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *sid = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, COOKIE_NAME);
    char token[TOKEN_MAX + 16];
    enum kp_auth_result r;

    if (w->auth == NULL) {
        id->role = KP_ROLES_ALL;
        snprintf(id->name, sizeof(id->name), "anonymous");
        id->via = "none";
        return 0;
    }
    if (authz == NULL && sid != NULL) {
        if (!session_token(w, sid, token + 7, sizeof(token) - 7)) {
            snprintf(why, len,
                     "the session is unknown or expired: sign in again (POST " PREFIX
                     "/session with the token) or send Authorization: Bearer TOKEN");
            return 401;
        }
        memcpy(token, "Bearer ", 7);
        authz = token;
    }
    r = kp_auth_check(w->auth, authz, authz != NULL ? strlen(authz) : 0, NULL, 0, id);
    explicit_bzero(token, sizeof(token));
    if (r != KP_AUTH_OK) {
        snprintf(why, len,
                 "%s: send Authorization: Bearer TOKEN with a viewer token of the analyzer's "
                 "--auth-tokens file, or sign in with POST " PREFIX "/session",
                 kp_auth_result_text(r));
        return 401;
    }
    return 0;
}

/* ---- session routes ---------------------------------------------------------------------- */

/* The token of a body {"token": "..."} (no escapes: a token is printable ASCII), or false. */
static bool body_token(const char *b, size_t n, char *token, size_t len)
{
    size_t i = 0, start;

#define SKIP_WS()                                                                    \
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n')) { \
        i++;                                                                         \
    }
    SKIP_WS();
    if (i >= n || b[i++] != '{') {
        return false;
    }
    SKIP_WS();
    if (n - i < 7 || memcmp(b + i, "\"token\"", 7) != 0) {
        return false;
    }
    i += 7;
    SKIP_WS();
    if (i >= n || b[i++] != ':') {
        return false;
    }
    SKIP_WS();
    if (i >= n || b[i++] != '"') {
        return false;
    }
    start = i;
    while (i < n && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 && b[i] < 0x7f) {
        i++;
    }
    if (i >= n || b[i] != '"' || i - start == 0 || i - start >= len) {
        return false;
    }
    memcpy(token, b + start, i - start);
    token[i - start] = '\0';
    i++;
    SKIP_WS();
    if (i >= n || b[i++] != '}') {
        return false;
    }
    SKIP_WS();
#undef SKIP_WS
    return i == n;
}

enum MHD_Result kp_web_serve_session(struct kp_web *w, struct MHD_Connection *c, const char *method,
                                     struct req *rq)
{
    const char *sid = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, COOKIE_NAME);
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    char token[TOKEN_MAX + 8], id[SESSION_ID_BYTES * 2 + 1], cookie[256], body[256];
    struct kp_identity who;
    enum kp_auth_result r;

    if (strcmp(method, "DELETE") == 0) {
        if (sid != NULL) {
            session_end(w, sid);
        }
        snprintf(cookie, sizeof(cookie),
                 COOKIE_NAME "=; Path=/; Max-Age=0; HttpOnly; "
                             "SameSite=Strict%s",
                 w->tls ? "; Secure" : "");
        return kp_web_send_body(c, 200, JSON_TYPE, "{\"ended\":true}\n", 15, NULL, cookie);
    }
    if (strcmp(method, "POST") != 0) {
        return kp_web_send_error(c, 405, "use POST to sign in, DELETE to sign out");
    }
    /* A JSON body only: a cross-site form cannot send one without the browser's preflight. */
    if (type == NULL || strncasecmp(type, JSON_TYPE, strlen(JSON_TYPE)) != 0) {
        return kp_web_send_error(c, 415,
                                 "send Content-Type: application/json with {\"token\": \"...\"}");
    }
    if (rq->body_too_big) {
        return kp_web_send_error(c, 413, "the body is too large: send {\"token\": \"...\"}");
    }
    if (!body_token(rq->body.data != NULL ? rq->body.data : "", rq->body.len, token + 7,
                    sizeof(token) - 7)) {
        return kp_web_send_error(c, 400, "the body must be {\"token\": \"...\"}");
    }
    if (w->auth == NULL) {
        who.role = KP_ROLES_ALL;
        snprintf(who.name, sizeof(who.name), "anonymous");
        r = KP_AUTH_OK;
    }
    else {
        memcpy(token, "Bearer ", 7);
        r = kp_auth_check(w->auth, token, strlen(token), NULL, 0, &who);
    }
    if (r != KP_AUTH_OK) {
        explicit_bzero(token, sizeof(token));
        snprintf(body, sizeof(body), "%s: give a token of the analyzer's --auth-tokens file",
                 kp_auth_result_text(r));
        return kp_web_send_error(c, 401, body);
    }
    if (!kp_auth_allows(KP_ROLE_VIEWER, who.role)) {
        explicit_bzero(token, sizeof(token));
        return kp_web_send_error(c, 403,
                                 "this token's role may not view analyses: give a viewer or "
                                 "operator token");
    }
    if (!session_add(w, token + 7, id)) {
        explicit_bzero(token, sizeof(token));
        return kp_web_send_error(c, 503, "cannot make a session id; retry later");
    }
    explicit_bzero(token, sizeof(token));
    snprintf(cookie, sizeof(cookie),
             COOKIE_NAME "=%s; Path=/; Max-Age=%d; HttpOnly; SameSite=Strict%s", id,
             KP_WEB_SESSION_TTL_S, w->tls ? "; Secure" : "");
    {
        struct kp_strbuf sb;
        enum MHD_Result ok;

        kp_strbuf_init(&sb, 4096);
        kp_strbuf_appendf(&sb, "{\"name\":");
        kp_json_append(&sb, who.name, strlen(who.name));
        kp_strbuf_appendf(&sb, ",\"role\":\"%s\",\"expires_in_s\":%d}\n",
                          kp_auth_role_name(who.role), KP_WEB_SESSION_TTL_S);
        ok = kp_web_send_body(c, 200, JSON_TYPE, sb.data, sb.len, NULL, cookie);
        kp_strbuf_fini(&sb);
        return ok;
    }
}
