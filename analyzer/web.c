#define KP_LOG_MODULE "web"
#include "web.h"
#include "web_int.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "kp_auth.h"
#include "kp_daemon.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_log.h"
#include "kp_pbjson.h"
#include "kp_pg.h"
#include "kp_secret.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"
#include "service.h"
#include "view.h"
#include "web_static.h"

#define REPLY_MAX    (256u << 20) /* the largest JSON reply built */
#define TLS_FILE_MAX (1u << 20)

/* ---- answers ------------------------------------------------------------------------------- */

static const char *status_name(unsigned http)
{
    switch (http) {
    case 400:
        return "INVALID_ARGUMENT";
    case 401:
        return "UNAUTHENTICATED";
    case 403:
        return "PERMISSION_DENIED";
    case 404:
        return "NOT_FOUND";
    case 405:
        return "METHOD_NOT_ALLOWED";
    case 413:
        return "PAYLOAD_TOO_LARGE";
    case 415:
        return "UNSUPPORTED_MEDIA_TYPE";
    case 429:
        return "RESOURCE_EXHAUSTED";
    case 501:
        return "UNIMPLEMENTED";
    case 503:
        return "UNAVAILABLE";
    case 504:
        return "DEADLINE_EXCEEDED";
    default:
        return http >= 500 ? "INTERNAL" : "FAILED_PRECONDITION";
    }
}

unsigned kp_web_http_of_grpc(grpc_status_code c)
{
    switch (c) {
    case GRPC_STATUS_OK:
        return 200;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_FAILED_PRECONDITION:
        return 400;
    case GRPC_STATUS_NOT_FOUND:
        return 404;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        return 429;
    case GRPC_STATUS_UNAVAILABLE:
        return 503;
    case GRPC_STATUS_PERMISSION_DENIED:
        return 403;
    case GRPC_STATUS_UNAUTHENTICATED:
        return 401;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return 504;
    case GRPC_STATUS_UNIMPLEMENTED:
        return 501;
    default:
        return 500;
    }
}

void kp_web_add_security_headers(struct MHD_Response *r)
{
    MHD_add_response_header(r, "Content-Security-Policy", KP_WEB_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
}

enum MHD_Result kp_web_send_body(struct MHD_Connection *c, unsigned status, const char *type,
                                 const char *body, size_t len, const char *retry_after,
                                 const char *cookie)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *) body, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ok;

    if (r == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    kp_web_add_security_headers(r);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (retry_after != NULL) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    }
    if (cookie != NULL) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_SET_COOKIE, cookie);
    }
    if (status == 401) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"kprof\"");
    }
    if (status == 405) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET");
    }
    ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result kp_web_send_error(struct MHD_Connection *c, unsigned status, const char *msg)
{
    struct kp_strbuf sb;
    enum MHD_Result ok;

    kp_strbuf_init(&sb, 1u << 16);
    kp_strbuf_appendf(&sb, "{\"error\":{\"code\":%u,\"status\":\"%s\",\"message\":", status,
                      status_name(status));
    kp_json_append(&sb, msg, strlen(msg));
    kp_strbuf_append_str(&sb, "}}\n");
    ok = kp_web_send_body(c, status, JSON_TYPE, sb.data != NULL ? sb.data : "", sb.len,
                          status == 429   ? "1"
                          : status == 503 ? "5"
                                          : NULL,
                          NULL);
    kp_strbuf_fini(&sb);
    return ok;
}

enum MHD_Result kp_web_send_json(struct MHD_Connection *c, struct kp_strbuf *sb)
{
    if (kp_strbuf_putc(sb, '\n') != 0) {
        return kp_web_send_error(c, 500, "the reply is too large to write as JSON");
    }
    return kp_web_send_body(c, 200, JSON_TYPE, sb->data, sb->len, NULL, NULL);
}

/* ---- views ------------------------------------------------------------------------------- */

/* A view's answer, shared by the connection thread and the worker (two references). */
struct pending {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int refs;
    unsigned status;
    struct kp_strbuf body; /* the reply's JSON, or the error's message */
};

static void pending_unref(struct pending *p)
{
    bool last;

    pthread_mutex_lock(&p->mu);
    last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (last) {
        kp_strbuf_fini(&p->body);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
    }
}

static void pending_finish(struct pending *p, unsigned status)
{
    pthread_mutex_lock(&p->mu);
    p->status = status;
    p->done = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* On the worker: the reply as JSON, written there (the worker holds the message). */
static void view_reply(void *ud, const ProtobufCMessage *msg)
{
    struct pending *p = ud;
    int rc = kp_pbjson_write(&p->body, msg);

    if (rc != 0) {
        kp_strbuf_reset(&p->body);
        kp_strbuf_appendf(&p->body, "the reply is too large to write as JSON (%s)",
                          rc == -ENOMEM ? "out of memory" : "over 256 MiB");
    }
    pending_finish(p, rc == 0 ? 200 : 500);
}

static void view_error(void *ud, grpc_status_code code, const char *details)
{
    struct pending *p = ud;

    kp_strbuf_reset(&p->body);
    kp_strbuf_append_str(&p->body, details != NULL ? details : "");
    pending_finish(p, kp_web_http_of_grpc(code));
}

static void view_release(void *ud)
{
    pending_unref(ud);
}

static const struct kp_analyzer_sink view_sink = { .reply = view_reply,
                                                   .error = view_error,
                                                   .release = view_release };

/* Whom a request counts against in the queue: as the gRPC front end's client_key. */
static void client_key(struct MHD_Connection *c, const struct kp_identity *id, char *key,
                       size_t len)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    char host[NI_MAXHOST] = "?";

    if (strcmp(id->via, "none") != 0) {
        snprintf(key, len, "id:%s", id->name);
        return;
    }
    if (ci != NULL && ci->client_addr != NULL) {
        getnameinfo(ci->client_addr,
                    ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                           : sizeof(struct sockaddr_in),
                    host, sizeof(host), NULL, 0, NI_NUMERICHOST);
    }
    snprintf(key, len, "peer:%s", host);
}

/* The view whose name is name, any case ("breakdown" is Breakdown). */
static const struct kp_view *view_named(const char *name)
{
    for (size_t i = 0; i < kp_n_views; i++) {
        if (strcasecmp(kp_views[i]->name, name) == 0) {
            return kp_views[i];
        }
    }
    return NULL;
}

static void view_list(struct kp_strbuf *sb)
{
    for (size_t i = 0; i < kp_n_views; i++) {
        char lower[64];
        size_t j = 0;

        for (; kp_views[i]->name[j] != '\0' && j + 1 < sizeof(lower); j++) {
            lower[j] = (char) tolower((unsigned char) kp_views[i]->name[j]);
        }
        lower[j] = '\0';
        kp_strbuf_appendf(sb, "%s%s", i > 0 ? ", " : "", lower);
    }
}

/* Sets the uint64 run_id and (when the request has one and the query did not set it) the
 * int32 rank: KP_VIEW_ONLY_RANK, the run's only rank, as kprofctl does without --rank. */
static void set_run_and_rank(ProtobufCMessage *m, uint64_t run, bool rank_given)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "run_id");

    if (f != NULL && f->type == PROTOBUF_C_TYPE_UINT64) {
        *(uint64_t *) ((char *) m + f->offset) = run;
    }
    f = protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "rank");
    if (f != NULL && f->type == PROTOBUF_C_TYPE_INT32 && !rank_given) {
        *(int32_t *) ((char *) m + f->offset) = KP_VIEW_ONLY_RANK;
    }
}

/* Whether the query q names the parameter name. */
static bool query_has(const char *q, const char *name)
{
    size_t n = strlen(name);

    for (const char *p = q; p != NULL && *p != '\0'; p = strchr(p, '&'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, n) == 0 && p[n] == '=') {
            return true;
        }
    }
    return false;
}

static enum MHD_Result serve_view(struct kp_web *w, struct MHD_Connection *c,
                                  const struct kp_identity *id, uint64_t run, const char *name,
                                  const char *q)
{
    static const char *const reserved[] = { "run_id", NULL };
    const struct kp_view *v = view_named(name);
    ProtobufCMessage *m;
    struct pending *p;
    char err[1024], key[128];
    unsigned status;
    enum MHD_Result ok;
    int rc;

    if (v == NULL) {
        struct kp_strbuf sb;

        kp_strbuf_init(&sb, 4096);
        kp_strbuf_appendf(&sb, "no view %.64s: the views are ", name);
        view_list(&sb);
        ok = kp_web_send_error(c, 404, sb.data != NULL ? sb.data : "no such view");
        kp_strbuf_fini(&sb);
        return ok;
    }
    if ((m = malloc(v->request->sizeof_message)) == NULL) {
        return kp_web_send_error(c, 503, "kprof-analyzer is out of memory; retry later");
    }
    protobuf_c_message_init(v->request, m);
    set_run_and_rank(m, run, query_has(q, "rank"));
    if ((rc = kp_pbjson_query(m, q, strlen(q), reserved, err, sizeof(err))) != 0) {
        protobuf_c_message_free_unpacked(m, NULL);
        return kp_web_send_error(c, rc == -ENOMEM ? 503 : 400,
                                 rc == -ENOMEM ? "kprof-analyzer is out of memory; retry later"
                                               : err);
    }
    if (v->writes != NULL && v->writes(m)) {
        protobuf_c_message_free_unpacked(m, NULL);
        return kp_web_send_error(c, 400,
                                 "this request writes to the database, which a GET never does: use "
                                 "kprofctl (gRPC) for it");
    }
    if ((p = calloc(1, sizeof(*p))) == NULL) {
        protobuf_c_message_free_unpacked(m, NULL);
        return kp_web_send_error(c, 503, "kprof-analyzer is out of memory; retry later");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    kp_strbuf_init(&p->body, REPLY_MAX);
    p->refs = 2;
    client_key(c, id, key, sizeof(key));
    if (kp_analyzer_submit(w->a, v, m, key, "web", &view_sink, p) != 0) {
        p->refs--; /* answered already; no release */
    }
    pthread_mutex_lock(&p->mu);
    while (!p->done) {
        pthread_cond_wait(&p->cv, &p->mu);
    }
    status = p->status;
    pthread_mutex_unlock(&p->mu);
    if (status == 200) {
        ok = kp_web_send_json(c, &p->body);
    }
    else {
        ok = kp_web_send_error(c, status, p->body.data != NULL ? p->body.data : "");
    }
    pending_unref(p);
    return ok;
}

/* ---- runs -------------------------------------------------------------------------------- */

struct runs_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    uint64_t run; /* 0: the list */
    char job[300];
    long limit;
    unsigned status;
    struct kp_strbuf body; /* JSON, or the error's message */
};

static int append_enum(struct kp_strbuf *sb, const ProtobufCEnumDescriptor *d, int v)
{
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);

    return ev != NULL ? kp_json_append(sb, ev->name, strlen(ev->name))
                      : kp_strbuf_appendf(sb, "%d", v);
}

/* One runs row as a JSON object (columns as runs_pg's query). */
static void append_run(struct kp_strbuf *sb, PGresult *r, int i)
{
    kp_strbuf_appendf(sb, "{\"id\":%s,\"job\":", PQgetvalue(r, i, 0));
    kp_json_append(sb, PQgetvalue(r, i, 1), (size_t) PQgetlength(r, i, 1));
    kp_strbuf_append_str(sb, ",\"name\":");
    kp_json_append(sb, PQgetvalue(r, i, 2), (size_t) PQgetlength(r, i, 2));
    kp_strbuf_append_str(sb, ",\"state\":");
    append_enum(sb, &kprof__v1__run_state__descriptor, atoi(PQgetvalue(r, i, 3)));
    kp_strbuf_append_str(sb, ",\"source\":");
    append_enum(sb, &kprof__v1__run_source__descriptor, atoi(PQgetvalue(r, i, 4)));
    /* the times as every view's int64 (kp_pbjson): past 2^53, strings a browser reads exactly */
    kp_strbuf_appendf(sb, ",\"world_size\":%s,\"created_ns\":", PQgetvalue(r, i, 5));
    kp_pbjson_write_i64(sb, kp_pg_i64(r, i, 6, 0));
    kp_strbuf_append_str(sb, ",\"ended_ns\":");
    if (PQgetisnull(r, i, 7)) {
        kp_strbuf_append_str(sb, "null");
    }
    else {
        kp_pbjson_write_i64(sb, kp_pg_i64(r, i, 7, 0));
    }
    kp_strbuf_appendf(sb, ",\"batches\":%s,\"ranks\":%s,\"hosts\":%s}", PQgetvalue(r, i, 8),
                      PQgetvalue(r, i, 9), PQgetvalue(r, i, 10));
}

/* On a worker: the runs (or the one run) as JSON. json_agg writes the ranks and hosts as
 * JSON already (PostgreSQL escapes the host names). */
static void runs_pg(PGconn *pg, const char *pg_err, void *ud)
{
    struct runs_job *j = ud;
    char run[32], limit[32], err[512];
    const char *params[3] = { run, j->job, limit };
    PGresult *r = NULL;
    int rc;

    snprintf(run, sizeof(run), "%" PRIu64, j->run);
    snprintf(limit, sizeof(limit), "%ld", j->limit);
    if (pg == NULL) {
        j->status = 503;
        kp_strbuf_appendf(&j->body, "PostgreSQL is unreachable (%s); retry later", pg_err);
        goto out;
    }
    rc = kp_pg_query(
        pg,
        "SELECT r.id, r.job, r.name, r.state, r.source, r.world_size, "
        "(extract(epoch FROM r.created_at) * 1000000000)::bigint, "
        "(extract(epoch FROM r.ended_at) * 1000000000)::bigint, "
        "(SELECT count(*) FROM ingest_batches b WHERE b.run_id = r.id), "
        "coalesce((SELECT json_agg(k.rank ORDER BY k.rank) FROM ranks k WHERE k.run_id = r.id), "
        "'[]'), "
        "coalesce((SELECT json_agg(DISTINCT k.host) FROM ranks k WHERE k.run_id = r.id AND "
        "k.host IS NOT NULL AND k.host <> ''), '[]') "
        "FROM runs r WHERE ($1::bigint = 0 OR r.id = $1::bigint) AND ($2 = '' OR r.job = $2) "
        "ORDER BY r.id DESC LIMIT $3::bigint",
        3, params, &r, err, sizeof(err));
    if (rc != 0) {
        j->status = 503;
        kp_strbuf_appendf(&j->body, "PostgreSQL failed (%s); retry later", err);
        goto out;
    }
    if (j->run != 0) {
        if (PQntuples(r) == 0) {
            j->status = 404;
            kp_strbuf_appendf(&j->body,
                              "run %" PRIu64 " does not exist: GET " PREFIX "/runs lists the runs",
                              j->run);
        }
        else {
            j->status = 200;
            append_run(&j->body, r, 0);
        }
    }
    else {
        j->status = 200;
        kp_strbuf_append_str(&j->body, "{\"runs\":[");
        for (int i = 0; i < PQntuples(r); i++) {
            if (i > 0) {
                kp_strbuf_putc(&j->body, ',');
            }
            append_run(&j->body, r, i);
        }
        kp_strbuf_append_str(&j->body, "]}");
    }
    PQclear(r);
out:
    pthread_mutex_lock(&j->mu);
    j->done = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static enum MHD_Result serve_runs(struct kp_web *w, struct MHD_Connection *c,
                                  const struct kp_identity *id, uint64_t run, const char *q)
{
    struct runs_job j = { .run = run, .limit = 100 };
    char key[128], v[300];
    enum MHD_Result ok;

    /* the list's parameters: job (exact), limit (1..KP_WEB_RUNS_LIMIT) */
    for (const char *p = q; p != NULL && *p != '\0';) {
        const char *amp = strchr(p, '&'), *eq = strchr(p, '=');
        size_t l = amp != NULL ? (size_t) (amp - p) : strlen(p);

        if (l > 0) {
            long n;
            char *end;

            if (eq == NULL || eq > p + l ||
                kp_pbjson_url_decode(eq + 1, l - (size_t) (eq + 1 - p), v, sizeof(v)) < 0) {
                return kp_web_send_error(c, 400, "malformed query: give job=NAME&limit=N");
            }
            if (run == 0 && (size_t) (eq - p) == 3 && strncmp(p, "job", 3) == 0) {
                snprintf(j.job, sizeof(j.job), "%s", v);
            }
            else if (run == 0 && (size_t) (eq - p) == 5 && strncmp(p, "limit", 5) == 0) {
                errno = 0;
                n = strtol(v, &end, 10);
                if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || n < 1 ||
                    n > KP_WEB_RUNS_LIMIT) {
                    return kp_web_send_error(c, 400, "limit must be a number from 1 to 1000");
                }
                j.limit = n;
            }
            else {
                snprintf(v, sizeof(v), "unknown parameter %.*s: %s", (int) (eq - p), p,
                         run == 0 ? "runs take job and limit" : "a run takes none");
                return kp_web_send_error(c, 400, v);
            }
        }
        p = amp != NULL ? amp + 1 : NULL;
    }
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    kp_strbuf_init(&j.body, 64u << 20);
    client_key(c, id, key, sizeof(key));
    if (kp_analyzer_submit_pg(w->a, key, runs_pg, &j) != 0) {
        ok = kp_web_send_error(c, 429, "too many analyses queued (for this client); retry later");
    }
    else {
        pthread_mutex_lock(&j.mu);
        while (!j.done) {
            pthread_cond_wait(&j.cv, &j.mu);
        }
        pthread_mutex_unlock(&j.mu);
        ok = j.status == 200
                 ? kp_web_send_json(c, &j.body)
                 : kp_web_send_error(c, j.status, j.body.data != NULL ? j.body.data : "");
    }
    kp_strbuf_fini(&j.body);
    pthread_cond_destroy(&j.cv);
    pthread_mutex_destroy(&j.mu);
    return ok;
}

/* ---- routing ----------------------------------------------------------------------------- */

static enum MHD_Result serve_views_list(struct MHD_Connection *c)
{
    struct kp_strbuf sb;
    enum MHD_Result ok;

    kp_strbuf_init(&sb, 1u << 20);
    kp_strbuf_append_str(&sb, "{\"views\":[");
    for (size_t i = 0; i < kp_n_views; i++) {
        const ProtobufCMessageDescriptor *d = kp_views[i]->request;

        kp_strbuf_appendf(&sb,
                          "%s{\"name\":\"%s\",\"whole_run\":%s,\"request\":\"%s\",\"fields\":[",
                          i > 0 ? "," : "", kp_views[i]->name,
                          kp_views[i]->whole_run ? "true" : "false", d->name);
        for (unsigned f = 0; f < d->n_fields; f++) {
            kp_strbuf_appendf(&sb, "%s\"%s\"", f > 0 ? "," : "", d->fields[f].name);
        }
        kp_strbuf_append_str(&sb, "]}");
    }
    kp_strbuf_append_str(&sb, "]}");
    ok = kp_web_send_json(c, &sb);
    kp_strbuf_fini(&sb);
    return ok;
}

/* The run id at the start of *p ("42/..." or "42"), moving *p past it; 0 for none. */
static uint64_t parse_run(const char **p, char *err, size_t len)
{
    const char *s = *p;
    uint64_t v = 0;
    size_t n = 0;

    while (s[n] >= '0' && s[n] <= '9' && n < 11) { /* 11 digits: past INT32_MAX, no wrap */
        v = v * 10 + (uint64_t) (s[n] - '0');
        n++;
    }
    if (n == 0 || (s[n] != '\0' && s[n] != '/') || v == 0 || v > INT32_MAX || s[0] == '0') {
        snprintf(err, len,
                 "\"%.*s\" is not a run id (1..2147483647): GET " PREFIX "/runs lists the runs",
                 (int) strcspn(s, "/") > 32 ? 32 : (int) strcspn(s, "/"), s);
        return 0;
    }
    *p = s + n;
    return v;
}

/* A file of the UI (web_static.h): no credential (the files hold no data, and the sign-in
 * page must load), revalidated by ETag on each load (Cache-Control: no-cache), so an upgraded
 * analyzer's pages are never mixed with a cached older module. */
static enum MHD_Result serve_static(struct kp_web *w, struct MHD_Connection *c, const char *method,
                                    const char *path)
{
    const struct kp_web_file *f;
    const char *inm;
    struct MHD_Response *r;
    enum MHD_Result ok;
    bool not_modified;

    if (w->files == NULL) {
        return kp_web_send_error(c, 404,
                                 "this analyzer serves the API only (its web UI's files were not "
                                 "found at start: give --web-root)");
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        return kp_web_send_error(c, 405, "only GET is served here");
    }
    if ((f = kp_web_static_find(w->files, path)) == NULL) {
        return kp_web_send_error(c, 404, "no such page or file: kprof's pages start at /");
    }
    inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    /* A list of ETags, weak ones (W/"...") included, or "*" (RFC 9110 13.1.2). */
    not_modified = inm != NULL && (strcmp(inm, "*") == 0 || strstr(inm, f->etag) != NULL);
    r = MHD_create_response_from_buffer(not_modified ? 0 : f->len, not_modified ? NULL : f->data,
                                        MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, f->type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, f->etag);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    kp_web_add_security_headers(r);
    ok = MHD_queue_response(c, not_modified ? 304 : 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result route(struct kp_web *w, struct MHD_Connection *c, const char *method,
                             struct req *rq)
{
    char path[1024], err[512];
    const char *q, *p;
    size_t plen;
    struct kp_identity id;
    unsigned st;
    uint64_t run;

    q = strchr(rq->uri, '?');
    plen = q != NULL ? (size_t) (q - rq->uri) : strlen(rq->uri);
    q = q != NULL ? q + 1 : "";
    if (kp_pbjson_url_decode(rq->uri, plen, path, sizeof(path)) < 0) {
        return kp_web_send_error(c, 400, "malformed path (a bad %-escape, or too long)");
    }
    if (strcmp(path, PREFIX "/session") == 0) {
        return kp_web_serve_session(w, c, method, rq);
    }
    if (strcmp(path, PREFIX) != 0 && strncmp(path, PREFIX "/", strlen(PREFIX "/")) != 0) {
        return serve_static(w, c, method, path);
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        return kp_web_send_error(c, 405,
                                 "only GET is served here (POST and DELETE: " PREFIX "/session)");
    }
    if (strncmp(path, PREFIX "/", strlen(PREFIX "/")) != 0) {
        return kp_web_send_error(c, 404,
                                 "no such route: the API is under " PREFIX "/ (docs/web-api.md)");
    }
    if ((st = kp_web_authenticate(w, c, &id, err, sizeof(err))) != 0) {
        return kp_web_send_error(c, st, err);
    }
    if (!kp_auth_allows(KP_ROLE_VIEWER, id.role)) {
        snprintf(err, sizeof(err),
                 "%s (role %s) may not view analyses: the viewer or operator role is needed",
                 id.name, kp_auth_role_name(id.role));
        return kp_web_send_error(c, 403, err);
    }
    p = path + strlen(PREFIX "/");
    if (strcmp(p, "views") == 0) {
        return serve_views_list(c);
    }
    if (strcmp(p, "runs") == 0) {
        return serve_runs(w, c, &id, 0, q);
    }
    if (strncmp(p, "runs/", 5) != 0) {
        return kp_web_send_error(c, 404, "no such route: see docs/web-api.md for the routes");
    }
    p += 5;
    if ((run = parse_run(&p, err, sizeof(err))) == 0) {
        return kp_web_send_error(
            c, strncmp(p, "0", 1) == 0 || isdigit((unsigned char) p[0]) ? 400 : 404, err);
    }
    if (*p == '\0') {
        return serve_runs(w, c, &id, run, q);
    }
    if (strcmp(p, "/export") == 0) {
        return kp_web_serve_export(w, c, run, q);
    }
    if (strncmp(p, "/views/", 7) == 0 && p[7] != '\0' && strchr(p + 7, '/') == NULL) {
        return serve_view(w, c, &id, run, p + 7, q);
    }
    return kp_web_send_error(c, 404, "no such route: see docs/web-api.md for the routes");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    struct kp_web *w = cls;
    struct req *rq = *con_cls;

    (void) url;
    (void) version;
    if (rq == NULL) {
        return MHD_NO; /* the URI callback failed (out of memory) */
    }
    if (!rq->started) {
        rq->started = true;
        return MHD_YES; /* the headers; the body (if any) comes next */
    }
    if (*upload_size > 0) {
        if (!rq->body_too_big && kp_strbuf_append(&rq->body, upload, *upload_size) != 0) {
            rq->body_too_big = true;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return route(w, c, method, rq);
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    struct req *rq = calloc(1, sizeof(*rq));

    (void) cls;
    (void) c;
    if (rq == NULL || (rq->uri = strdup(uri)) == NULL) {
        free(rq);
        return NULL;
    }
    kp_strbuf_init(&rq->body, KP_WEB_BODY_MAX);
    return rq;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct req *rq = *con_cls;

    (void) cls;
    (void) c;
    (void) toe;
    if (rq != NULL) {
        kp_strbuf_fini(&rq->body);
        free(rq->uri);
        free(rq);
        *con_cls = NULL;
    }
}

/* libmicrohttpd's messages (a client's bad request among them: at most one a second, so that a
 * client cannot flood the log). */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    static long long last_s;
    long long now = (long long) time(NULL), was = __atomic_load_n(&last_s, __ATOMIC_RELAXED);
    char msg[512];

    (void) cls;
    if (now == was || !__atomic_compare_exchange_n(&last_s, &was, now, false, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {
        return;
    }
    vsnprintf(msg, sizeof(msg), fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    kp_log_warn("libmicrohttpd: %s", msg);
}

/* ---- lifecycle --------------------------------------------------------------------------- */

/* A bound, listening socket for "host:port" ("[v6]:port"); its port in *port. */
static int listen_on(const char *addr, int *port, char *errbuf, size_t errlen)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    struct addrinfo hints = { .ai_family = AF_UNSPEC,
                              .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    struct addrinfo *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = -1, one = 1, rc;
    size_t hl;

    if (colon == NULL || colon == addr || colon[1] == '\0') {
        snprintf(errbuf, errlen, "--web-listen %s: give HOST:PORT (127.0.0.1:7080)", addr);
        return KP_ECONFIG;
    }
    hl = (size_t) (colon - addr);
    if (addr[0] == '[' && colon[-1] == ']') {
        snprintf(host, sizeof(host), "%.*s", (int) hl - 2, addr + 1);
    }
    else {
        snprintf(host, sizeof(host), "%.*s", (int) hl, addr);
    }
    if ((rc = getaddrinfo(host, colon + 1, &hints, &ai)) != 0) {
        snprintf(errbuf, errlen, "--web-listen %s: %s", addr, gai_strerror(rc));
        return KP_ECONFIG;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *) &ss, &sl) != 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "--web-listen %s: %s", addr, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        freeaddrinfo(ai);
        return rc;
    }
    freeaddrinfo(ai);
    *port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *) &ss)->sin6_port)
                                     : ntohs(((struct sockaddr_in *) &ss)->sin_port);
    return fd;
}

/* The whole of a PEM file (malloc'd), or NULL with errbuf set. */
static char *read_pem(const char *path, bool secret, char *errbuf, size_t errlen)
{
    char *buf = malloc(TLS_FILE_MAX);
    long n;

    if (buf == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return NULL;
    }
    if (secret) {
        n = kp_secret_file_read(path, "the TLS key", true, buf, TLS_FILE_MAX, errbuf, errlen);
    }
    else {
        FILE *f = fopen(path, "rb");

        n = f != NULL ? (long) fread(buf, 1, TLS_FILE_MAX - 1, f) : -1;
        if (f == NULL || ferror(f) || n <= 0) {
            snprintf(errbuf, errlen, "cannot read %s: %s", path,
                     f == NULL ? strerror(errno) : "empty or unreadable");
            n = -1;
        }
        if (f != NULL) {
            fclose(f);
        }
        if (n > 0) {
            buf[n] = '\0';
        }
    }
    if (n < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The installed UI's directory, from where this executable is (KPROF_WEB_ROOT_FROM_BIN, as
 * kprof-run finds its library): the packages are built from a tree of any prefix and install
 * under /usr, so a path compiled in from the tree's prefix would miss them. joined gets the
 * path before resolution, for messages. Returns 0 with the resolved path in out (PATH_MAX). */
static int installed_root(char *out, char *joined, size_t jlen)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash;

    snprintf(joined, jlen, "<this executable's directory>/%s", KPROF_WEB_ROOT_FROM_BIN);
    if (n <= 0) {
        return -1;
    }
    exe[n] = '\0';
    if ((slash = strrchr(exe, '/')) == NULL) {
        return -1;
    }
    *slash = '\0';
    snprintf(joined, jlen, "%s/%s", exe, KPROF_WEB_ROOT_FROM_BIN);
    return realpath(joined, out) != NULL ? 0 : -1;
}

/* The UI's files: --web-root's (which must hold them), else the installed ones if present (an
 * analyzer built from source and run without --web-root serves the API only, and says so). */
static int load_files(struct kp_web *w, const char *root, char *errbuf, size_t errlen)
{
    char installed[PATH_MAX], joined[PATH_MAX + 64], index[PATH_MAX + 16];
    bool given = root != NULL && root[0] != '\0';
    size_t n, bytes;
    int rc;

    if (!given) {
        bool found = installed_root(installed, joined, sizeof(joined)) == 0;

        if (found) {
            snprintf(index, sizeof(index), "%s/index.html", installed);
            found = access(index, R_OK) == 0;
        }
        if (!found) {
            kp_log_warn("the web UI's files are not in %s (the kprof-analyzer package installs "
                        "them in /usr/share/kprof/web): serving the API only; give --web-root "
                        "DIR to serve the UI",
                        joined);
            return 0;
        }
        root = installed;
    }
    if ((rc = kp_web_static_load(root, &w->files, errbuf, errlen)) != 0) {
        return rc;
    }
    n = kp_web_static_count(w->files, &bytes);
    kp_log_info("serving the web UI root=%s files=%zu bytes=%zu", root, n, bytes);
    return 0;
}

int kp_web_create(struct kp_analyzer *a, const char *listen, struct kp_web **out, char *errbuf,
                  size_t errlen)
{
    const struct kp_analyzer_config *cfg = kp_analyzer_config(a);
    const struct kp_daemon_config *b = &cfg->base;
    bool local = kp_daemon_listen_is_local(listen);
    bool tokens = b->token_file != NULL && b->token_file[0] != '\0';
    struct kp_web *w;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    int fd, port = 0, rc;

    *out = NULL;
    if (strncmp(listen, "unix:", 5) == 0) {
        snprintf(errbuf, errlen, "--web-listen takes HOST:PORT, not a unix socket");
        return KP_ECONFIG;
    }
    /* kp_daemon_security checked the daemon's settings against --listen; the same rules hold
     * for this address. */
    if ((b->tls_cert == NULL || b->tls_cert[0] == '\0') && !local) {
        snprintf(errbuf, errlen,
                 "--web-listen %s without TLS is refused: plaintext is served only on a loopback "
                 "address; give --tls-cert and --tls-key",
                 listen);
        return KP_ECONFIG;
    }
    if (b->allow_anonymous && !local) {
        snprintf(errbuf, errlen,
                 "--allow-anonymous is refused on --web-listen %s: it is allowed only on a "
                 "loopback address; give --auth-tokens",
                 listen);
        return KP_ECONFIG;
    }
    if (!b->allow_anonymous && !tokens) {
        snprintf(errbuf, errlen,
                 "--web-listen needs --auth-tokens (the web API takes bearer tokens, not client "
                 "certificates), or --allow-anonymous on a loopback address");
        return KP_ECONFIG;
    }
    if ((w = calloc(1, sizeof(*w))) == NULL ||
        (w->sessions = calloc(KP_WEB_SESSIONS, sizeof(*w->sessions))) == NULL) {
        free(w);
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    w->a = a;
    w->auth = kp_analyzer_auth(a);
    w->max_exports = (int) cfg->workers;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->exports_done, NULL);
    w->tls = b->tls_cert != NULL && b->tls_cert[0] != '\0';
    if (w->tls && ((w->cert = read_pem(b->tls_cert, false, errbuf, errlen)) == NULL ||
                   (w->key = read_pem(b->tls_key, true, errbuf, errlen)) == NULL)) {
        kp_web_destroy(w);
        return KP_ECONFIG;
    }
    if ((fd = listen_on(listen, &port, errbuf, errlen)) < 0) {
        kp_web_destroy(w);
        return fd;
    }
    w->port = port;
    if ((rc = load_files(w, cfg->web_root, errbuf, errlen)) != 0) {
        close(fd);
        kp_web_destroy(w);
        return rc;
    }
    if (w->tls) {
        flags |= MHD_USE_TLS;
    }
    w->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, w, MHD_OPTION_EXTERNAL_LOGGER,
                            on_mhd_log, w, MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned) KP_WEB_MAX_CONNECTIONS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) KP_WEB_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) KP_WEB_MEMORY_LIMIT,
                            MHD_OPTION_URI_LOG_CALLBACK, on_uri, w, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, w, w->tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END,
                            w->cert, MHD_OPTION_HTTPS_MEM_KEY, w->key, MHD_OPTION_END);
    if (w->d == NULL) {
        close(fd);
        snprintf(errbuf, errlen, "--web-listen %s: libmicrohttpd would not start (see the log)",
                 listen);
        kp_web_destroy(w);
        return -EIO;
    }
    kp_log_info("serving the web API listen=%s port=%d tls=%s auth=%s", listen, port,
                w->tls ? "yes" : "no", w->auth != NULL ? "tokens" : "anonymous");
    *out = w;
    return 0;
}

int kp_web_port(const struct kp_web *w)
{
    return w->port;
}

void kp_web_destroy(struct kp_web *w)
{
    if (w == NULL) {
        return;
    }
    if (w->d != NULL) {
        MHD_stop_daemon(w->d); /* joins the connection threads */
    }
    pthread_mutex_lock(&w->mu);
    while (w->exports > 0) {
        pthread_cond_wait(&w->exports_done, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    if (w->key != NULL) {
        explicit_bzero(w->key, strlen(w->key));
    }
    free(w->key);
    free(w->cert);
    if (w->sessions != NULL) {
        explicit_bzero(w->sessions, KP_WEB_SESSIONS * sizeof(*w->sessions));
    }
    free(w->sessions);
    kp_web_static_free(w->files);
    pthread_cond_destroy(&w->exports_done);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
