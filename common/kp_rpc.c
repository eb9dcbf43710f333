/*
 * kp_rpc over gRPC's C core (1.51). See docs/specs/grpc-core.md for the measured call
 * sequences and traps this follows:
 *  - every batch in flight holds a reference on its call context (tags complete in any order,
 *    the close tag often before the status tag);
 *  - one op of each kind in flight per call, so sends queue and go one at a time;
 *  - a NULL RECV_MESSAGE with success is "no more messages", but whether the call ended
 *    cleanly is known only from RECV_CLOSE_ON_SERVER's cancelled flag;
 *  - a catch-all request answers unregistered methods (else they hang to the deadline);
 *  - SO_REUSEPORT off, so a second server on a port fails instead of splitting traffic;
 *  - shutdown: shutdown_and_notify, cancel after the grace period, destroy, then drain the
 *    queue until GRPC_QUEUE_SHUTDOWN while still handling call tags.
 */
#define KP_LOG_MODULE "rpc"
#include "kp_rpc.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_secret.h"

#define KP_RPC_DEFAULT_MAX_MSG      (64u << 20)
#define KP_RPC_HANDSHAKE_TIMEOUT_MS 10000
#define KP_RPC_MAX_STREAMS_PER_CONN 256
/* A stream stops reading while more than this waits to go to its client (one that does not
 * read its replies would otherwise grow the server by everything it sends), and reads again
 * once half of it is gone. Each message counts its bytes plus SEND_MSG_OVERHEAD. */
#define KP_RPC_SEND_BACKLOG_MAX (1u << 20)
#define SEND_MSG_OVERHEAD       128

enum tag_type {
    TAG_NEW,     /* a registered method's call arrived */
    TAG_NEW_ANY, /* the catch-all request for unknown methods */
    TAG_RECV,
    TAG_SEND,
    TAG_CLOSE, /* RECV_CLOSE_ON_SERVER */
    TAG_STATUS,
    TAG_SHUTDOWN,
};

struct tag {
    enum tag_type type;
    struct kp_rpc_call *call;
    struct retired *retired; /* TAG_SHUTDOWN of a listener given up by a restart */
};

/* A grpc_server given up when its listener stopped accepting (restart_listener): its live
 * calls go on until they end or the server shuts down. */
struct retired {
    grpc_server *server;
    void **registered;
    struct tag tag;
    bool done; /* its shutdown tag came back */
    struct retired *next;
};

struct sendq {
    grpc_byte_buffer *bb;
    struct sendq *next;
};

struct kp_rpc_call {
    struct kp_rpc_server *srv;
    const struct kp_rpc_method *m; /* NULL for the catch-all */
    size_t method_index;
    grpc_call *call;
    grpc_server *armed_on; /* the grpc_server the request was armed on */
    pthread_mutex_t mu;
    pthread_cond_t sent; /* a send completed (kp_rpc_call_wait_sent) */
    int refs;
    void *state;
    gpr_timespec deadline;
    grpc_metadata_array req_md;
    grpc_call_details details; /* catch-all only */
    grpc_byte_buffer *payload; /* unary request, or the message being received */
    int close_cancelled;
    struct tag t_new, t_recv, t_send, t_close, t_status;
    grpc_byte_buffer *send_bb; /* in flight */
    struct sendq *q_head, *q_tail;
    grpc_status_code code;
    char *status_details;
    char *peer;
    struct kp_identity id; /* set before any callback (call_admit) */
    bool md_sent, recv_busy, paused, resume_pending, in_message_cb, stop_reading;
    bool send_busy, finish_requested, status_started, status_done, close_done;
    bool closed_notified, cancelled, live;
    size_t send_backlog; /* bytes queued or in flight to the client (KP_RPC_SEND_BACKLOG_MAX) */
    bool recv_held;      /* not reading until the backlog drains */
};

#define LISTEN_FDS_MAX 4

struct kp_rpc_server {
    grpc_server *server; /* the current one; changes only under mu (restart_listener) */
    grpc_completion_queue *cq;
    pthread_t thread;
    bool thread_started;
    const struct kp_rpc_method *methods;
    size_t n_methods;
    void **registered;
    int port;
    char name[64];
    struct kp_auth *auth; /* borrowed; NULL: no authentication */
    /* Refusals logged in the current second, and those left out of the log (a client that
     * retries a bad token in a loop must not fill the disk). */
    long long refused_sec;
    unsigned refused_logged, refused_quiet;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool shutdown_started, shutdown_done, destroyed_server;
    struct tag shutdown_tag;
    /* The accept watchdog (watch_thread, TCP listeners only): gRPC 1.51 stops accepting for
     * good after one failed accept4 (EMFILE), while the kernel keeps queueing connections on
     * the listening socket; the watchdog sees the queue stay full and rebinds a new server on
     * the same port. */
    char *listen_fixed; /* opts->listen with the bound port instead of 0 */
    grpc_channel_args *cargs;
    grpc_server_credentials *creds;
    int listen_fds[LISTEN_FDS_MAX];
    int n_listen_fds;
    pthread_t watch;
    bool watch_started, watch_stop, accepting;
    char not_accepting_why[320];
    unsigned long long restarts;
    struct retired *retired;
};

static const char *const status_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *kp_rpc_status_name(grpc_status_code code)
{
    if ((unsigned) code < sizeof(status_names) / sizeof(status_names[0])) {
        return status_names[code];
    }
    return "UNKNOWN";
}

static gpr_timespec deadline_ms(long long ms)
{
    if (ms < 0) {
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    }
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Packs msg into a byte buffer (returns owned, or NULL on ENOMEM). */
static grpc_byte_buffer *pack_msg(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(len);
    grpc_byte_buffer *bb;

    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static grpc_byte_buffer *bytes_bb(const void *buf, size_t len)
{
    grpc_slice s = grpc_slice_from_copied_buffer(buf, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);

    grpc_slice_unref(s);
    return bb;
}

/* Unpacks a received buffer; *wire gets its size. NULL if it does not parse. */
static ProtobufCMessage *unpack_bb(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb,
                                   size_t *wire)
{
    ProtobufCMessage *m;
    grpc_byte_buffer_reader r;
    grpc_slice all;

    *wire = grpc_byte_buffer_length(bb);
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
        bb->data.raw.slice_buffer.count == 1) {
        grpc_slice s = bb->data.raw.slice_buffer.slices[0];

        return protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    }
    if (!grpc_byte_buffer_reader_init(&r, bb)) {
        return NULL;
    }
    all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    return m;
}

/* --- Server --- */

static void call_free(struct kp_rpc_call *c)
{
    struct sendq *q = c->q_head;

    while (q != NULL) {
        struct sendq *next = q->next;

        grpc_byte_buffer_destroy(q->bb);
        free(q);
        q = next;
    }
    if (c->payload != NULL) {
        grpc_byte_buffer_destroy(c->payload);
    }
    if (c->send_bb != NULL) {
        grpc_byte_buffer_destroy(c->send_bb);
    }
    if (c->call != NULL) {
        grpc_call_unref(c->call);
    }
    grpc_metadata_array_destroy(&c->req_md);
    if (c->m == NULL) {
        grpc_call_details_destroy(&c->details);
    }
    if (c->peer != NULL) {
        gpr_free(c->peer);
    }
    free(c->status_details);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->sent);
    free(c);
}

void kp_rpc_call_ref(struct kp_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
}

void kp_rpc_call_unref(struct kp_rpc_call *c)
{
    int left;

    pthread_mutex_lock(&c->mu);
    left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left == 0) {
        call_free(c);
    }
}

static struct kp_rpc_call *call_new(struct kp_rpc_server *s, const struct kp_rpc_method *m,
                                    size_t index)
{
    struct kp_rpc_call *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return NULL;
    }
    c->srv = s;
    c->m = m;
    c->method_index = index;
    c->refs = 1; /* the pending request; becomes the "live" reference */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->sent, NULL);
    grpc_metadata_array_init(&c->req_md);
    if (m == NULL) {
        grpc_call_details_init(&c->details);
    }
    c->t_new = (struct tag){ m == NULL ? TAG_NEW_ANY : TAG_NEW, c, NULL };
    c->t_recv = (struct tag){ TAG_RECV, c, NULL };
    c->t_send = (struct tag){ TAG_SEND, c, NULL };
    c->t_close = (struct tag){ TAG_CLOSE, c, NULL };
    c->t_status = (struct tag){ TAG_STATUS, c, NULL };
    return c;
}

/* Arms the request for method index (or the catch-all when index == n_methods) on server,
 * whose registered methods are registered. */
static void request_arm_on(struct kp_rpc_server *s, grpc_server *server, void **registered,
                           size_t index)
{
    const struct kp_rpc_method *m = index < s->n_methods ? &s->methods[index] : NULL;
    struct kp_rpc_call *c = call_new(s, m, index);
    grpc_call_error e;

    if (c == NULL) {
        kp_log_error("out of memory arming a request; method=%s", m ? m->path : "*");
        return;
    }
    c->armed_on = server;
    if (m == NULL) {
        e = grpc_server_request_call(server, &c->call, &c->details, &c->req_md, s->cq, s->cq,
                                     &c->t_new);
    }
    else {
        e = grpc_server_request_registered_call(
            server, registered[index], &c->call, &c->deadline, &c->req_md,
            m->kind == KP_RPC_UNARY ? &c->payload : NULL, s->cq, s->cq, &c->t_new);
    }
    if (e != GRPC_CALL_OK) {
        kp_log_error("request_call failed method=%s err=%d", m ? m->path : "*", (int) e);
        call_free(c);
    }
}

/* Starts a batch holding a reference; on failure drops it. Called with c->mu held. */
static bool batch_locked(struct kp_rpc_call *c, const grpc_op *ops, size_t n, struct tag *t)
{
    grpc_call_error e;

    c->refs++;
    e = grpc_call_start_batch(c->call, ops, n, t, NULL);
    if (e != GRPC_CALL_OK) {
        c->refs--;
        kp_log_warn("start_batch failed method=%s peer=%s err=%d", kp_rpc_call_method(c),
                    c->peer ? c->peer : "?", (int) e);
        return false;
    }
    return true;
}

static void recv_arm_locked(struct kp_rpc_call *c)
{
    grpc_op ops[2];
    size_t n = 0;

    if (c->recv_busy || c->stop_reading || c->finish_requested || c->cancelled) {
        return;
    }
    if (c->send_backlog > KP_RPC_SEND_BACKLOG_MAX) {
        c->recv_held = true; /* on_send reads again once the client takes its replies */
        return;
    }
    memset(ops, 0, sizeof(ops));
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->md_sent = true;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &c->payload;
    n++;
    if (batch_locked(c, ops, n, &c->t_recv)) {
        c->recv_busy = true;
    }
    else {
        c->stop_reading = true;
    }
}

/* Starts the next send, or the status once the sends are done. Called with c->mu held. */
static void pump_locked(struct kp_rpc_call *c)
{
    grpc_op ops[2];
    size_t n = 0;
    grpc_slice details;

    if (c->send_busy || c->status_started || c->cancelled || c->call == NULL) {
        return;
    }
    memset(ops, 0, sizeof(ops));
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
    }
    if (c->q_head != NULL) {
        struct sendq *q = c->q_head;

        c->q_head = q->next;
        if (c->q_head == NULL) {
            c->q_tail = NULL;
        }
        c->send_bb = q->bb;
        free(q);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->send_bb;
        n++;
        if (batch_locked(c, ops, n, &c->t_send)) {
            c->send_busy = true;
            c->md_sent = true;
        }
        else {
            c->send_backlog -= grpc_byte_buffer_length(c->send_bb) + SEND_MSG_OVERHEAD;
            grpc_byte_buffer_destroy(c->send_bb);
            c->send_bb = NULL;
        }
        return;
    }
    if (!c->finish_requested) {
        return;
    }
    details = grpc_slice_from_copied_string(c->status_details ? c->status_details : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = c->code;
    ops[n].data.send_status_from_server.status_details = &details;
    n++;
    c->status_started = true;
    c->md_sent = true;
    if (!batch_locked(c, ops, n, &c->t_status)) {
        c->status_done = true;
    }
    grpc_slice_unref(details);
}

int kp_rpc_call_send(struct kp_rpc_call *c, const ProtobufCMessage *msg)
{
    struct sendq *q = malloc(sizeof(*q));
    int rc = 0;

    if (q == NULL) {
        return -ENOMEM;
    }
    q->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->finish_requested || c->cancelled || c->closed_notified) {
        rc = -ECANCELED;
        goto out;
    }
    q->bb = pack_msg(msg);
    c->send_backlog += grpc_byte_buffer_length(q->bb) + SEND_MSG_OVERHEAD;
    if (c->q_tail != NULL) {
        c->q_tail->next = q;
    }
    else {
        c->q_head = q;
    }
    c->q_tail = q;
    q = NULL;
    pump_locked(c);
out:
    pthread_mutex_unlock(&c->mu);
    free(q);
    return rc;
}

int kp_rpc_call_wait_sent(struct kp_rpc_call *c, long long timeout_ms)
{
    long long left = timeout_ms;
    int rc;

    pthread_mutex_lock(&c->mu);
    for (;;) {
        struct timespec until;
        long long slice = left < 100 ? left : 100; /* cancellation is seen within 100 ms */

        if (c->cancelled || c->closed_notified || c->status_started) {
            rc = -ECANCELED;
            break;
        }
        if (!c->send_busy && c->q_head == NULL) {
            rc = 0;
            break;
        }
        if (left <= 0) {
            rc = -ETIMEDOUT;
            break;
        }
        until = kp_real_deadline(slice);
        (void) pthread_cond_timedwait(&c->sent, &c->mu, &until);
        left -= slice;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int kp_rpc_call_finish(struct kp_rpc_call *c, grpc_status_code code, const char *details)
{
    int rc = 0;

    pthread_mutex_lock(&c->mu);
    if (c->finish_requested || c->cancelled || c->closed_notified) {
        rc = -ECANCELED;
        goto out;
    }
    c->finish_requested = true;
    c->stop_reading = true;
    c->code = code;
    c->status_details = strdup(details ? details : "");
    pump_locked(c);
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int kp_rpc_call_reply(struct kp_rpc_call *c, const ProtobufCMessage *msg)
{
    int rc = kp_rpc_call_send(c, msg);

    if (rc != 0) {
        return rc;
    }
    return kp_rpc_call_finish(c, GRPC_STATUS_OK, "");
}

void kp_rpc_call_resume(struct kp_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->paused) {
        c->paused = false;
        recv_arm_locked(c);
    }
    else if (c->in_message_cb) {
        c->resume_pending = true;
    }
    pthread_mutex_unlock(&c->mu);
}

const char *kp_rpc_call_peer(const struct kp_rpc_call *c)
{
    return c->peer != NULL ? c->peer : "unknown";
}

const char *kp_rpc_call_method(const struct kp_rpc_call *c)
{
    return c->m != NULL ? c->m->path : "unknown";
}

/*
 * Runs on_close once the call is over: RECV_CLOSE_ON_SERVER has completed, and the status,
 * if one was started, has gone out. A call closed before any status was started was
 * cancelled by the client (or its deadline). Called without the lock.
 */
static void maybe_closed(struct kp_rpc_call *c)
{
    bool notify = false, cancelled = false;

    pthread_mutex_lock(&c->mu);
    if (c->live && !c->closed_notified && c->close_done && (!c->status_started || c->status_done)) {
        notify = true;
        c->closed_notified = true;
        cancelled = c->close_cancelled || !c->status_started;
        c->cancelled = c->cancelled || cancelled;
    }
    pthread_mutex_unlock(&c->mu);
    if (!notify) {
        return;
    }
    if (c->m != NULL && c->m->kind == KP_RPC_STREAM && c->m->on_close != NULL) {
        c->m->on_close(c, cancelled, c->state);
    }
    kp_rpc_call_unref(c); /* the live reference */
}

/* gRPC's own messages (a failed TLS handshake, a refused connection) go to kprof's log, in its
 * format and under its level, instead of gRPC's "E1126 ..." lines on stderr. */
/* gRPC's "Failed accept4: ..." lines so far: the sign that a listener may have stopped (the
 * watchdog's evidence, beside a queue that does not drain). */
static unsigned accept_failures;

static void grpc_log_cb(gpr_log_func_args *a)
{
    enum kp_log_level level = a->severity == GPR_LOG_SEVERITY_ERROR  ? KP_LOG_WARN
                              : a->severity == GPR_LOG_SEVERITY_INFO ? KP_LOG_INFO
                                                                     : KP_LOG_DEBUG;

    if (strncmp(a->message, "Failed accept", 13) == 0) {
        __atomic_add_fetch(&accept_failures, 1, __ATOMIC_RELAXED);
    }
    kp_log_write(level, "grpc", "%s", a->message);
}

static void grpc_log_route(void)
{
    gpr_set_log_function(grpc_log_cb);
}

static pthread_once_t grpc_log_once = PTHREAD_ONCE_INIT;

/* grpc_init, with gRPC's log routed into kprof's on the first call. */
static void rpc_init(void)
{
    pthread_once(&grpc_log_once, grpc_log_route);
    grpc_init();
}

const struct kp_identity *kp_rpc_call_identity(const struct kp_rpc_call *c)
{
    return &c->id;
}

/* Logs a refused call with its peer and reason (never the credential), at most 10 lines a
 * second; the lines left out are counted in the next one. */
static void refused_log(struct kp_rpc_server *s, struct kp_rpc_call *c, const char *path,
                        grpc_status_code code, const char *why)
{
    long long sec = kp_mono_ms() / 1000;
    unsigned quiet = 0;
    bool log;

    pthread_mutex_lock(&s->mu);
    if (sec != s->refused_sec) {
        s->refused_sec = sec;
        s->refused_logged = 0;
    }
    log = s->refused_logged < 10;
    if (log) {
        s->refused_logged++;
        quiet = s->refused_quiet;
        s->refused_quiet = 0;
    }
    else {
        s->refused_quiet++;
    }
    pthread_mutex_unlock(&s->mu);
    if (log) {
        kp_log_warn("refused status=%s method=%s peer=%s reason=\"%s\" not_logged_before=%u",
                    kp_rpc_status_name(code), path, kp_rpc_call_peer(c), why, quiet);
    }
}

/* The URIs of the client certificate the TLS layer verified (none without mutual TLS), into
 * buf; returns how many. */
static size_t peer_uris(grpc_call *call, char buf[][256], const char **uris, size_t max)
{
    static const char *const props[] = { GRPC_PEER_URI_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME };
    grpc_auth_context *ctx = grpc_call_auth_context(call);
    size_t n = 0;

    if (ctx == NULL) {
        return 0;
    }
    if (grpc_auth_context_peer_is_authenticated(ctx)) {
        for (size_t k = 0; k < 2; k++) {
            grpc_auth_property_iterator it =
                grpc_auth_context_find_properties_by_name(ctx, props[k]);
            const grpc_auth_property *p;

            while ((p = grpc_auth_property_iterator_next(&it)) != NULL && n < max) {
                if (p->value_length < 256) {
                    memcpy(buf[n], p->value, p->value_length);
                    buf[n][p->value_length] = '\0';
                    uris[n] = buf[n];
                    n++;
                }
            }
        }
    }
    grpc_auth_context_release(ctx);
    return n;
}

/* Authenticates the call and checks its role against the method's; on refusal finishes it
 * (UNAUTHENTICATED or PERMISSION_DENIED) and returns false. */
static bool call_admit(struct kp_rpc_server *s, struct kp_rpc_call *c, const char *path)
{
    char ubuf[8][256], details[256];
    const char *uris[8], *authz = NULL;
    size_t authz_len = 0, n;
    enum kp_auth_result r;

    if (s->auth == NULL) {
        c->id.role = KP_ROLES_ALL;
        snprintf(c->id.name, sizeof(c->id.name), "anonymous");
        c->id.via = "none";
        return true;
    }
    for (size_t i = 0; i < c->req_md.count; i++) {
        if (grpc_slice_str_cmp(c->req_md.metadata[i].key, "authorization") == 0) {
            authz = (const char *) GRPC_SLICE_START_PTR(c->req_md.metadata[i].value);
            authz_len = GRPC_SLICE_LENGTH(c->req_md.metadata[i].value);
            break;
        }
    }
    n = peer_uris(c->call, ubuf, uris, 8);
    r = kp_auth_check(s->auth, authz, authz_len, uris, n, &c->id);
    if (r != KP_AUTH_OK) {
        refused_log(s, c, path, GRPC_STATUS_UNAUTHENTICATED, kp_auth_result_text(r));
        snprintf(details, sizeof(details),
                 "%s: %s refuses the call (%s); send a token of the daemon's token file "
                 "(kprofctl --token-file, KPROF_TOKEN_FILE) or a client certificate its "
                 "--tls-client-ca signed",
                 kp_auth_result_text(r), s->name, path);
        kp_rpc_call_finish(c, GRPC_STATUS_UNAUTHENTICATED, details);
        return false;
    }
    if (c->m != NULL && !kp_auth_allows(c->m->roles, c->id.role)) {
        char why[160];

        snprintf(why, sizeof(why), "role %s (%s) may not call it", kp_auth_role_name(c->id.role),
                 c->id.name);
        refused_log(s, c, path, GRPC_STATUS_PERMISSION_DENIED, why);
        snprintf(details, sizeof(details),
                 "%s may not call %s as %s; ask for a token with the %s role", c->id.name, path,
                 kp_auth_role_name(c->id.role),
                 (c->m->roles & KP_ROLE_VIEWER) != 0     ? "viewer"
                 : (c->m->roles & KP_ROLE_OPERATOR) != 0 ? "operator"
                 : (c->m->roles & KP_ROLE_AGENT) != 0    ? "agent"
                                                         : "(none)");
        kp_rpc_call_finish(c, GRPC_STATUS_PERMISSION_DENIED, details);
        return false;
    }
    return true;
}

/* Arms the request again on the current server, unless the call came from a server given
 * up since (its requests are not renewed) or a restart is under way (it arms them all). */
static void request_rearm(struct kp_rpc_server *s, const struct kp_rpc_call *c)
{
    grpc_server *server;
    void **registered;

    pthread_mutex_lock(&s->mu);
    server = s->server;
    registered = s->registered;
    pthread_mutex_unlock(&s->mu);
    if (server != NULL && server == c->armed_on) {
        request_arm_on(s, server, registered, c->method_index);
    }
}

static void on_new_call(struct kp_rpc_server *s, struct kp_rpc_call *c, bool ok)
{
    const struct kp_rpc_method *m = c->m;
    grpc_op op;
    ProtobufCMessage *req;
    size_t wire;
    char details[256];

    request_rearm(s, c);
    c->live = true;
    c->peer = grpc_call_get_peer(c->call);
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    pthread_mutex_lock(&c->mu);
    if (!batch_locked(c, &op, 1, &c->t_close)) {
        c->close_done = true;
    }
    pthread_mutex_unlock(&c->mu);

    if (m == NULL) {
        char *method = grpc_slice_to_c_string(c->details.method);

        if (!call_admit(s, c, method)) {
            gpr_free(method);
            return;
        }
        kp_log_warn("unknown method=%s peer=%s", method, kp_rpc_call_peer(c));
        snprintf(details, sizeof(details), "method %s is not implemented by %s", method, s->name);
        gpr_free(method);
        kp_rpc_call_finish(c, GRPC_STATUS_UNIMPLEMENTED, details);
        return;
    }
    if (!call_admit(s, c, m->path)) {
        if (c->payload != NULL) {
            grpc_byte_buffer_destroy(c->payload);
            c->payload = NULL;
        }
        return;
    }
    if (m->kind == KP_RPC_UNARY) {
        if (c->payload == NULL) {
            kp_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, "the request message is missing");
            return;
        }
        req = unpack_bb(m->request, c->payload, &wire);
        grpc_byte_buffer_destroy(c->payload);
        c->payload = NULL;
        if (req == NULL) {
            kp_log_warn("malformed request method=%s peer=%s bytes=%zu", m->path,
                        kp_rpc_call_peer(c), wire);
            snprintf(details, sizeof(details), "malformed %s: failed to unpack %zu bytes",
                     m->request->name, wire);
            kp_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, details);
            return;
        }
        m->on_request(c, req, m->ud);
        return;
    }
    c->state = m->on_open != NULL ? m->on_open(c, m->ud) : NULL;
    pthread_mutex_lock(&c->mu);
    recv_arm_locked(c);
    pthread_mutex_unlock(&c->mu);
}

static void on_recv(struct kp_rpc_call *c, bool ok)
{
    grpc_byte_buffer *bb;
    ProtobufCMessage *msg;
    enum kp_rpc_next next;
    size_t wire;
    char details[256];

    pthread_mutex_lock(&c->mu);
    c->recv_busy = false;
    bb = c->payload;
    c->payload = NULL;
    if (!ok) {
        /* Over the size limit (the core has told the client), or the call broke. */
        c->stop_reading = true;
        pthread_mutex_unlock(&c->mu);
        if (bb != NULL) {
            grpc_byte_buffer_destroy(bb);
        }
        kp_rpc_call_finish(c, GRPC_STATUS_UNAVAILABLE, "receive failed");
        return;
    }
    if (bb == NULL) {
        c->stop_reading = true;
        pthread_mutex_unlock(&c->mu);
        if (c->m->on_half_close != NULL) {
            c->m->on_half_close(c, c->state);
        }
        else {
            kp_rpc_call_finish(c, GRPC_STATUS_OK, "");
        }
        return;
    }
    c->in_message_cb = true;
    c->resume_pending = false;
    pthread_mutex_unlock(&c->mu);

    msg = unpack_bb(c->m->request, bb, &wire);
    grpc_byte_buffer_destroy(bb);
    if (msg == NULL) {
        kp_log_warn("malformed message method=%s peer=%s bytes=%zu", c->m->path,
                    kp_rpc_call_peer(c), wire);
        snprintf(details, sizeof(details), "malformed %s: failed to unpack %zu bytes",
                 c->m->request->name, wire);
        kp_rpc_call_finish(c, GRPC_STATUS_INVALID_ARGUMENT, details);
        next = KP_RPC_STOP;
    }
    else {
        next = c->m->on_message(c, msg, wire, c->state);
    }

    pthread_mutex_lock(&c->mu);
    c->in_message_cb = false;
    if (next == KP_RPC_PAUSE && c->resume_pending) {
        next = KP_RPC_CONTINUE;
    }
    if (next == KP_RPC_CONTINUE) {
        recv_arm_locked(c);
    }
    else if (next == KP_RPC_PAUSE) {
        c->paused = true;
    }
    else {
        c->stop_reading = true;
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_send(struct kp_rpc_call *c, bool ok)
{
    pthread_mutex_lock(&c->mu);
    c->send_busy = false;
    c->send_backlog -= grpc_byte_buffer_length(c->send_bb) + SEND_MSG_OVERHEAD;
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
    if (!ok) {
        /* The client is gone: drop what is queued; the close tag will say cancelled. */
        c->cancelled = true;
    }
    if (c->recv_held && c->send_backlog <= KP_RPC_SEND_BACKLOG_MAX / 2 && !c->paused &&
        !c->in_message_cb) {
        c->recv_held = false;
        recv_arm_locked(c);
    }
    pump_locked(c);
    pthread_cond_broadcast(&c->sent);
    pthread_mutex_unlock(&c->mu);
}

static void dispatch(struct kp_rpc_server *s, grpc_event *ev)
{
    struct tag *t = ev->tag;
    struct kp_rpc_call *c = t->call;
    bool ok = ev->success != 0;

    switch (t->type) {
    case TAG_SHUTDOWN:
        pthread_mutex_lock(&s->mu);
        if (t->retired != NULL) {
            t->retired->done = true;
            pthread_cond_broadcast(&s->cond);
            pthread_mutex_unlock(&s->mu);
            return;
        }
        s->shutdown_done = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->mu);
        return;
    case TAG_NEW:
    case TAG_NEW_ANY:
        if (!ok) { /* shutting down: the armed request comes back unused */
            kp_rpc_call_unref(c);
            return;
        }
        on_new_call(s, c, ok);
        maybe_closed(c);
        return; /* the request's reference became the live one */
    case TAG_RECV:
        on_recv(c, ok);
        break;
    case TAG_SEND:
        on_send(c, ok);
        break;
    case TAG_CLOSE:
        pthread_mutex_lock(&c->mu);
        c->close_done = true;
        if (c->close_cancelled) {
            c->cancelled = true;
        }
        pthread_mutex_unlock(&c->mu);
        break;
    case TAG_STATUS:
        pthread_mutex_lock(&c->mu);
        c->status_done = true;
        pthread_mutex_unlock(&c->mu);
        break;
    }
    maybe_closed(c);
    kp_rpc_call_unref(c); /* the batch's reference */
}

static void *server_thread(void *arg)
{
    struct kp_rpc_server *s = arg;

    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, deadline_ms(200), NULL);

        if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        if (ev.type == GRPC_OP_COMPLETE) {
            dispatch(s, &ev);
        }
    }
    return NULL;
}

static char *read_file(const char *path, char *errbuf, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len;

    if (f == NULL) {
        snprintf(errbuf, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || len > (16 << 20) ||
        fseek(f, 0, SEEK_SET) != 0 || (buf = malloc((size_t) len + 1)) == NULL ||
        fread(buf, 1, (size_t) len, f) != (size_t) len) {
        snprintf(errbuf, errlen, "cannot read %s", path);
        free(buf);
        buf = NULL;
    }
    else {
        buf[len] = '\0';
    }
    fclose(f);
    return buf;
}

static grpc_server_credentials *server_creds(const struct kp_rpc_server_opts *o, char *errbuf,
                                             size_t errlen)
{
    grpc_ssl_pem_key_cert_pair pair;
    grpc_server_credentials *creds = NULL;
    char *cert = NULL, *key = NULL, *client_ca = NULL;
    bool mtls = o->tls_client_ca_file != NULL && o->tls_client_ca_file[0] != '\0';

    if (o->tls_cert_file == NULL || o->tls_cert_file[0] == '\0') {
        if (mtls) {
            snprintf(errbuf, errlen,
                     "client certificates (%s) need TLS: give the server's "
                     "certificate and key too",
                     o->tls_client_ca_file);
            return NULL;
        }
        return grpc_insecure_server_credentials_create();
    }
    if ((cert = read_file(o->tls_cert_file, errbuf, errlen)) == NULL ||
        (key = read_file(o->tls_key_file ? o->tls_key_file : "", errbuf, errlen)) == NULL ||
        (mtls && (client_ca = read_file(o->tls_client_ca_file, errbuf, errlen)) == NULL)) {
        goto out;
    }
    pair.cert_chain = cert;
    pair.private_key = key;
    /* With a client CA, a client certificate is verified when one is offered; a client without
     * one still connects and must then bring a token (kp_auth). */
    creds =
        grpc_ssl_server_credentials_create_ex(client_ca, &pair, 1,
                                              mtls ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                                                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
                                              NULL);
    if (creds == NULL) {
        snprintf(errbuf, errlen, "TLS credentials from %s and %s are not usable", o->tls_cert_file,
                 o->tls_key_file);
    }
out:
    free(cert);
    if (key != NULL) {
        explicit_bzero(key, strlen(key));
    }
    free(key);
    free(client_ca);
    return creds;
}

#define WATCH_INTERVAL_MS 500
/* Samples in a row with connections waiting in the accept queue before the listener is
 * taken as dead: gRPC accepts until EAGAIN on every wakeup, so a live listener empties the
 * queue within milliseconds. */
#define WATCH_STALL_SAMPLES 3
/* Without a failed accept in gRPC's log since the last look (a burst of connections that a
 * busy server thread has not taken yet also waits in the queue), only a queue that has not
 * drained for this many samples (10 s) counts as a dead listener: a restart resets the
 * connections that wait, so it must not happen to a live one. */
#define WATCH_STALL_SAMPLES_BLIND 20

/* Creates a grpc_server on listen with s's args, completion queue, methods and credentials,
 * and starts it. Returns the server and its registered methods (*reg, owned), or NULL with
 * the reason in errbuf; *port is the bound port. */
static grpc_server *server_build(struct kp_rpc_server *s, const char *listen, void ***reg,
                                 int *port, char *errbuf, size_t errlen)
{
    grpc_server *server = grpc_server_create(s->cargs, NULL);
    void **registered = calloc(s->n_methods + 1, sizeof(void *));

    *port = 0;
    if (registered == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        goto fail;
    }
    grpc_server_register_completion_queue(server, s->cq, NULL);
    for (size_t i = 0; i < s->n_methods; i++) {
        registered[i] = grpc_server_register_method(server, s->methods[i].path, NULL,
                                                    s->methods[i].kind == KP_RPC_UNARY
                                                        ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER
                                                        : GRPC_SRM_PAYLOAD_NONE,
                                                    0);
        if (registered[i] == NULL) {
            snprintf(errbuf, errlen, "cannot register method %s", s->methods[i].path);
            goto fail;
        }
    }
    *port = grpc_server_add_http2_port(server, listen, s->creds);
    if (*port == 0) {
        snprintf(errbuf, errlen,
                 "cannot listen on %s (address in use or invalid); pick another --listen", listen);
        goto fail;
    }
    grpc_server_start(server);
    *reg = registered;
    return server;
fail:
    /* Never started and without listeners: destroyed as it is. */
    grpc_server_destroy(server);
    free(registered);
    return NULL;
}

/* Adds fd to s->listen_fds when it is a socket listening on s->port. */
static void check_listen_fd(struct kp_rpc_server *s, int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int acc = 0;
    socklen_t al = sizeof(acc);
    int port = 0;

    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) != 0 || acc == 0) {
        return;
    }
    if (getsockname(fd, (struct sockaddr *) &ss, &sl) != 0) {
        return;
    }
    if (ss.ss_family == AF_INET) {
        port = ntohs(((struct sockaddr_in *) &ss)->sin_port);
    }
    else if (ss.ss_family == AF_INET6) {
        port = ntohs(((struct sockaddr_in6 *) &ss)->sin6_port);
    }
    if (port == s->port && s->n_listen_fds < LISTEN_FDS_MAX) {
        s->listen_fds[s->n_listen_fds++] = fd;
    }
}

/* Finds the sockets listening on s->port (the ones gRPC opened; there is no API for them):
 * the descriptors in /proc/self/fd, or, when that cannot be opened (no descriptor left),
 * every number below the limit. */
static void find_listen_fds(struct kp_rpc_server *s)
{
    DIR *d = opendir("/proc/self/fd");
    struct rlimit rl;
    int max_fd = 65536;

    s->n_listen_fds = 0;
    if (d != NULL) {
        struct dirent *e;

        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] >= '0' && e->d_name[0] <= '9') {
                check_listen_fd(s, atoi(e->d_name));
            }
        }
        closedir(d);
        return;
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (rlim_t) (1 << 22)) {
        max_fd = (int) rl.rlim_cur;
    }
    for (int fd = 0; fd < max_fd; fd++) {
        check_listen_fd(s, fd);
    }
}

/* The connections waiting in the listening sockets' accept queues (TCP_INFO of a listening
 * socket gives the queue's length in tcpi_unacked). */
static unsigned accept_queue_len(const struct kp_rpc_server *s)
{
    unsigned n = 0;

    for (int i = 0; i < s->n_listen_fds; i++) {
        struct tcp_info ti;
        socklen_t len = sizeof(ti);

        memset(&ti, 0, sizeof(ti));
        if (getsockopt(s->listen_fds[i], IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
            ti.tcpi_state == TCP_LISTEN) {
            n += ti.tcpi_unacked;
        }
    }
    return n;
}

/* Gives up the current grpc_server (its listener closes, its live calls go on) and binds a
 * new one on the same address. Runs on the watchdog thread. Returns true when serving. */
static bool restart_listener(struct kp_rpc_server *s)
{
    char err[256];
    void **registered = NULL;
    grpc_server *server;
    int port = 0;

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    /* No descriptor for the new listener yet: keep the old one (and gRPC's log) until then. */
    if (fd < 0) {
        pthread_mutex_lock(&s->mu);
        snprintf(s->not_accepting_why, sizeof(s->not_accepting_why),
                 "gRPC stopped accepting connections: %s; restarting the listener",
                 strerror(errno));
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    close(fd);
    pthread_mutex_lock(&s->mu);
    if (s->server != NULL) {
        struct retired *r = calloc(1, sizeof(*r));

        if (r == NULL) {
            pthread_mutex_unlock(&s->mu);
            return false;
        }
        r->server = s->server;
        r->registered = s->registered;
        r->tag = (struct tag){ TAG_SHUTDOWN, NULL, r };
        r->next = s->retired;
        s->retired = r;
        s->server = NULL; /* no request is armed on it any more */
        s->registered = NULL;
        pthread_mutex_unlock(&s->mu);
        /* Closes its listening sockets (connections still queued there are reset). */
        grpc_server_shutdown_and_notify(r->server, s->cq, &r->tag);
        s->n_listen_fds = 0;
    }
    else {
        pthread_mutex_unlock(&s->mu);
    }
    server = server_build(s, s->listen_fixed, &registered, &port, err, sizeof(err));
    if (server == NULL) {
        pthread_mutex_lock(&s->mu);
        snprintf(s->not_accepting_why, sizeof(s->not_accepting_why),
                 "gRPC is not listening: %s (retrying)", err);
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    pthread_mutex_lock(&s->mu);
    s->server = server;
    s->registered = registered;
    s->restarts++;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i <= s->n_methods; i++) {
        request_arm_on(s, server, registered, i);
    }
    find_listen_fds(s);
    return true;
}

static void *watch_thread(void *arg)
{
    struct kp_rpc_server *s = arg;
    int stalled = 0;
    unsigned last = 0, failures_seen = __atomic_load_n(&accept_failures, __ATOMIC_RELAXED);

    pthread_mutex_lock(&s->mu);
    while (!s->watch_stop) {
        struct timespec ts = kp_real_deadline(WATCH_INTERVAL_MS);
        bool listening;

        pthread_cond_timedwait(&s->cond, &s->mu, &ts);
        if (s->watch_stop) {
            break;
        }
        listening = s->server != NULL;
        pthread_mutex_unlock(&s->mu);
        if (listening) {
            /* A dead listener's queue only grows; a live one's empties within milliseconds. */
            unsigned q = accept_queue_len(s);

            stalled = q > 0 && q >= last ? stalled + 1 : 0;
            last = q;
        }
        if (stalled == 0) {
            failures_seen = __atomic_load_n(&accept_failures, __ATOMIC_RELAXED);
        }
        if (!listening ||
            (stalled >= WATCH_STALL_SAMPLES &&
             __atomic_load_n(&accept_failures, __ATOMIC_RELAXED) != failures_seen) ||
            stalled >= WATCH_STALL_SAMPLES_BLIND) {
            if (listening) {
                kp_log_error("%s: gRPC stopped accepting connections (the process ran out of file "
                             "descriptors); restarting the listener on %s",
                             s->name, s->listen_fixed);
                pthread_mutex_lock(&s->mu);
                snprintf(s->not_accepting_why, sizeof(s->not_accepting_why),
                         "gRPC stopped accepting connections (out of file descriptors); "
                         "restarting the listener");
                pthread_mutex_unlock(&s->mu);
            }
            __atomic_store_n(&s->accepting, false, __ATOMIC_RELEASE);
            if (restart_listener(s)) {
                kp_log_info("%s: gRPC listener restarted on %s", s->name, s->listen_fixed);
                __atomic_store_n(&s->accepting, true, __ATOMIC_RELEASE);
            }
            stalled = 0;
            last = 0;
            failures_seen = __atomic_load_n(&accept_failures, __ATOMIC_RELAXED);
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* "host:0" with the bound port ("127.0.0.1:0" becomes "127.0.0.1:43121"). */
static char *listen_with_port(const char *listen, int port)
{
    const char *colon = strrchr(listen, ':');
    size_t n = colon != NULL ? (size_t) (colon - listen) : strlen(listen);
    char *out = malloc(n + 16);

    if (out != NULL) {
        snprintf(out, n + 16, "%.*s:%d", (int) n, listen, port);
    }
    return out;
}

int kp_rpc_server_create(const struct kp_rpc_server_opts *opts, const struct kp_rpc_method *methods,
                         size_t n_methods, struct kp_rpc_server **out, char *errbuf, size_t errlen)
{
    struct kp_rpc_server *s = calloc(1, sizeof(*s));
    grpc_arg *args;
    int rc = -ENOMEM;

    if (s == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    rpc_init();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->methods = methods;
    s->n_methods = n_methods;
    s->auth = opts->auth;
    s->accepting = true;
    snprintf(s->name, sizeof(s->name), "%s", opts->name ? opts->name : "kprof");
    s->shutdown_tag = (struct tag){ TAG_SHUTDOWN, NULL, NULL };
    if ((s->cargs = calloc(1, sizeof(*s->cargs))) == NULL ||
        (args = calloc(4, sizeof(*args))) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        goto fail;
    }
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer =
        (int) (opts->max_message_bytes ? opts->max_message_bytes : KP_RPC_DEFAULT_MAX_MSG);
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[1].value.integer = 0;
    /* A connection that has not finished its handshake (TLS, HTTP/2 preface) in this time
     * is closed: idle sockets cannot hold descriptors for gRPC's default two minutes. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS;
    args[2].value.integer = KP_RPC_HANDSHAKE_TIMEOUT_MS;
    /* Calls open at once on one connection; a client's further calls wait for a free one. */
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_MAX_CONCURRENT_STREAMS;
    args[3].value.integer = KP_RPC_MAX_STREAMS_PER_CONN;
    s->cargs->num_args = 4;
    s->cargs->args = args;
    s->cq = grpc_completion_queue_create_for_next(NULL);
    if ((s->creds = server_creds(opts, errbuf, errlen)) == NULL) {
        rc = KP_ECONFIG;
        goto fail;
    }
    if ((s->server = server_build(s, opts->listen, &s->registered, &s->port, errbuf, errlen)) ==
        NULL) {
        rc = -EADDRINUSE;
        goto fail;
    }
    if (strncmp(opts->listen, "unix:", 5) == 0) {
        s->port = 0;
    }
    for (size_t i = 0; i <= n_methods; i++) {
        request_arm_on(s, s->server, s->registered, i);
    }
    if (pthread_create(&s->thread, NULL, server_thread, s) != 0) {
        snprintf(errbuf, errlen, "cannot start the server thread");
        rc = -EAGAIN;
        goto fail;
    }
    s->thread_started = true;
    if (s->port != 0) {
        if ((s->listen_fixed = listen_with_port(opts->listen, s->port)) == NULL) {
            snprintf(errbuf, errlen, "out of memory");
            goto fail;
        }
        find_listen_fds(s);
        if (pthread_create(&s->watch, NULL, watch_thread, s) != 0) {
            snprintf(errbuf, errlen, "cannot start the server's watchdog thread");
            rc = -EAGAIN;
            goto fail;
        }
        s->watch_started = true;
    }
    *out = s;
    return 0;
fail:
    kp_rpc_server_destroy(s);
    return rc;
}

int kp_rpc_server_port(const struct kp_rpc_server *s)
{
    return s->port;
}

bool kp_rpc_server_accepting(struct kp_rpc_server *s, char *why, size_t len)
{
    if (__atomic_load_n(&s->accepting, __ATOMIC_ACQUIRE)) {
        return true;
    }
    pthread_mutex_lock(&s->mu);
    snprintf(why, len, "%s", s->not_accepting_why);
    pthread_mutex_unlock(&s->mu);
    return false;
}

unsigned long long kp_rpc_server_restarts(struct kp_rpc_server *s)
{
    unsigned long long n;

    pthread_mutex_lock(&s->mu);
    n = s->restarts;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void watch_stop(struct kp_rpc_server *s)
{
    if (!s->watch_started) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->watch_stop = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->watch, NULL);
    s->watch_started = false;
}

static bool wait_shutdown(struct kp_rpc_server *s, long long ms)
{
    struct timespec ts = kp_real_deadline(ms);
    bool done;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        bool all = s->shutdown_done;

        for (struct retired *r = s->retired; r != NULL; r = r->next) {
            all = all && r->done;
        }
        if (all || pthread_cond_timedwait(&s->cond, &s->mu, &ts) != 0) {
            break;
        }
    }
    done = s->shutdown_done;
    for (struct retired *r = s->retired; r != NULL; r = r->next) {
        done = done && r->done;
    }
    pthread_mutex_unlock(&s->mu);
    return done;
}

static void cancel_all(struct kp_rpc_server *s)
{
    if (s->server != NULL) {
        grpc_server_cancel_all_calls(s->server);
    }
    for (struct retired *r = s->retired; r != NULL; r = r->next) {
        grpc_server_cancel_all_calls(r->server);
    }
}

void kp_rpc_server_shutdown(struct kp_rpc_server *s, long long grace_ms)
{
    if (s == NULL || !s->thread_started) {
        return;
    }
    watch_stop(s);
    pthread_mutex_lock(&s->mu);
    if (s->shutdown_started) {
        pthread_mutex_unlock(&s->mu);
        wait_shutdown(s, 10000);
        return;
    }
    s->shutdown_started = true;
    if (s->server == NULL) {
        s->shutdown_done = true; /* a restart left nothing listening */
    }
    pthread_mutex_unlock(&s->mu);
    if (s->server != NULL) {
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    }
    if (!wait_shutdown(s, grace_ms)) {
        kp_log_info("cancelling calls still open after the grace period grace_ms=%lld", grace_ms);
        cancel_all(s);
        wait_shutdown(s, 10000);
    }
}

void kp_rpc_server_destroy(struct kp_rpc_server *s)
{
    if (s == NULL) {
        return;
    }
    watch_stop(s);
    if (s->thread_started) {
        kp_rpc_server_shutdown(s, 0);
    }
    else if (s->server != NULL) {
        grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
        grpc_server_cancel_all_calls(s->server);
    }
    if (s->server != NULL) {
        grpc_server_destroy(s->server);
    }
    for (struct retired *r = s->retired; r != NULL; r = r->next) {
        grpc_server_destroy(r->server);
    }
    if (s->cq != NULL) {
        grpc_completion_queue_shutdown(s->cq);
        if (s->thread_started) {
            pthread_join(s->thread, NULL);
        }
        else {
            /* Never started: drain here (armed requests come back failed). */
            for (;;) {
                grpc_event ev = grpc_completion_queue_next(s->cq, deadline_ms(-1), NULL);

                if (ev.type == GRPC_QUEUE_SHUTDOWN) {
                    break;
                }
                dispatch(s, &ev);
            }
        }
        grpc_completion_queue_destroy(s->cq);
    }
    while (s->retired != NULL) {
        struct retired *r = s->retired;

        s->retired = r->next;
        free(r->registered);
        free(r);
    }
    if (s->creds != NULL) {
        grpc_server_credentials_release(s->creds);
    }
    if (s->cargs != NULL) {
        free(s->cargs->args);
        free(s->cargs);
    }
    free(s->listen_fixed);
    free(s->registered);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s);
    grpc_shutdown();
}

/* --- Client --- */

struct kp_rpc_channel {
    grpc_channel *ch;
    /* The token file, read again when it changes (at most once a second, at a call): a
     * long-lived client (the agent) takes a rotated token without a restart. */
    char *token_path;
    pthread_mutex_t mu;
    grpc_slice authz; /* "Bearer TOKEN"; meaningful when has_authz */
    bool has_authz;
    struct stat token_seen;
    long long token_checked_ns;
};

#define TOKEN_RECHECK_NS 1000000000LL

/* Reads path's first line as "Bearer TOKEN" into *out (owned). */
static int token_read(const char *path, grpc_slice *out, char *errbuf, size_t errlen)
{
    char buf[300], hdr[320];
    long n;

    if ((n = kp_secret_file_line(path, "the token file", true, buf, sizeof(buf), errbuf, errlen)) <
        0) {
        return (int) n;
    }
    snprintf(hdr, sizeof(hdr), "Bearer %s", buf);
    explicit_bzero(buf, sizeof(buf));
    *out = grpc_slice_from_copied_string(hdr);
    explicit_bzero(hdr, sizeof(hdr));
    return 0;
}

/* Re-reads the token file if it changed; keeps the last good token otherwise. Locked. */
static void token_maybe_reload_locked(struct kp_rpc_channel *c)
{
    long long now = kp_mono_ns();
    struct stat st;
    grpc_slice fresh;
    char err[512];

    if (c->token_path == NULL || now - c->token_checked_ns < TOKEN_RECHECK_NS) {
        return;
    }
    c->token_checked_ns = now;
    if (stat(c->token_path, &st) != 0 ||
        (st.st_ino == c->token_seen.st_ino && st.st_size == c->token_seen.st_size &&
         st.st_mtim.tv_sec == c->token_seen.st_mtim.tv_sec &&
         st.st_mtim.tv_nsec == c->token_seen.st_mtim.tv_nsec)) {
        return;
    }
    c->token_seen = st;
    if (token_read(c->token_path, &fresh, err, sizeof(err)) != 0) {
        kp_log_warn("token file not reloaded, keeping the token read before: %s", err);
        return;
    }
    grpc_slice_unref(c->authz);
    c->authz = fresh;
    kp_log_info("token file reloaded path=%s", c->token_path);
}

/* The initial metadata a call of ch sends: its token, if any, into md (whose value the caller
 * releases with md_release once the call is over). */
static void md_op(struct kp_rpc_channel *ch, grpc_op *op, grpc_metadata *md)
{
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    memset(md, 0, sizeof(*md));
    if (!ch->has_authz) {
        return;
    }
    pthread_mutex_lock(&ch->mu);
    token_maybe_reload_locked(ch);
    md->key = grpc_slice_from_static_string("authorization");
    md->value = grpc_slice_ref(ch->authz);
    pthread_mutex_unlock(&ch->mu);
    op->data.send_initial_metadata.count = 1;
    op->data.send_initial_metadata.metadata = md;
}

static void md_release(grpc_metadata *md)
{
    grpc_slice_unref(md->value); /* an empty slice when no token was sent */
}

/* Reads opts->token_file into c->authz. */
static int channel_token(struct kp_rpc_channel *c, const struct kp_rpc_channel_opts *opts,
                         char *errbuf, size_t errlen)
{
    int rc;

    if (opts == NULL || opts->token_file == NULL || opts->token_file[0] == '\0') {
        return 0;
    }
    if (stat(opts->token_file, &c->token_seen) != 0) {
        memset(&c->token_seen, 0, sizeof(c->token_seen));
    }
    if ((rc = token_read(opts->token_file, &c->authz, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((c->token_path = strdup(opts->token_file)) == NULL) {
        grpc_slice_unref(c->authz);
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    c->token_checked_ns = kp_mono_ns();
    c->has_authz = true;
    return 0;
}

struct kp_rpc_stream {
    grpc_call *call;
    grpc_completion_queue *cq;
    const ProtobufCMessageDescriptor *resp_desc;
    grpc_metadata_array init_md, trail_md;
    grpc_status_code status;
    grpc_slice status_details;
    const char *error_string;
    grpc_byte_buffer *recv_bb;
    bool recv_armed, status_done, broken;
    bool md_pending, md_failed; /* the initial metadata's send (see kp_rpc_stream_open) */
    grpc_metadata md;           /* the token sent, released at destroy */
    char t_md, t_send, t_recv, t_status, t_close; /* addresses serve as tags */
};

int kp_rpc_channel_create(const char *target, const struct kp_rpc_channel_opts *opts,
                          struct kp_rpc_channel **out, char *errbuf, size_t errlen)
{
    struct kp_rpc_channel *c = calloc(1, sizeof(*c));
    grpc_channel_credentials *creds;
    grpc_arg args[4];
    grpc_channel_args cargs;
    char *ca = NULL, *cert = NULL, *key = NULL;
    int rc;

    if (c == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&c->mu, NULL);
    rpc_init();
    if ((rc = channel_token(c, opts, errbuf, errlen)) != 0) {
        kp_rpc_channel_destroy(c);
        return rc;
    }
    if (opts != NULL && opts->tls_ca_file != NULL && opts->tls_ca_file[0] != '\0') {
        grpc_ssl_pem_key_cert_pair pair;
        bool mtls = opts->tls_cert_file != NULL && opts->tls_cert_file[0] != '\0';

        if ((ca = read_file(opts->tls_ca_file, errbuf, errlen)) == NULL ||
            (mtls && ((cert = read_file(opts->tls_cert_file, errbuf, errlen)) == NULL ||
                      (key = read_file(opts->tls_key_file != NULL ? opts->tls_key_file : "", errbuf,
                                       errlen)) == NULL))) {
            free(ca);
            free(cert);
            free(key);
            kp_rpc_channel_destroy(c);
            return KP_ECONFIG;
        }
        pair.cert_chain = cert;
        pair.private_key = key;
        creds = grpc_ssl_credentials_create(ca, mtls ? &pair : NULL, NULL, NULL);
    }
    else if (opts != NULL && opts->tls_cert_file != NULL && opts->tls_cert_file[0] != '\0') {
        snprintf(errbuf, errlen, "a client certificate needs TLS: give the CA (--tls-ca) too");
        kp_rpc_channel_destroy(c);
        return KP_ECONFIG;
    }
    else {
        creds = grpc_insecure_credentials_create();
    }
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer =
        (int) (opts != NULL && opts->max_message_bytes ? opts->max_message_bytes
                                                       : KP_RPC_DEFAULT_MAX_MSG);
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = -1;
    /* gRPC's own reconnect backoff grows to 120 s; producers resume soon after a collectord
     * restart only if it is capped. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[2].value.integer = 2000;
    /* No retry filter: kprof sets no retry policy (kp_push retries on its own), and with the
     * filter in the stack grpc_call_cancel of a stream whose peer is frozen (SIGSTOP: the
     * connection stays up, nothing is read or answered) leaves its pending receive pending
     * forever, so a cancelled call never ends (measured with 1.51, test_import_drop's frozen
     * case). Without it the cancel completes every pending op at once. */
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_ENABLE_RETRIES;
    args[3].value.integer = 0;
    cargs.num_args = 4;
    cargs.args = args;
    c->ch = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    free(ca);
    free(cert);
    if (key != NULL) {
        explicit_bzero(key, strlen(key));
    }
    free(key);
    *out = c;
    return 0;
}

void kp_rpc_channel_destroy(struct kp_rpc_channel *c)
{
    if (c == NULL) {
        return;
    }
    if (c->ch != NULL) {
        grpc_channel_destroy(c->ch);
    }
    if (c->has_authz) {
        grpc_slice_unref(c->authz);
    }
    free(c->token_path);
    pthread_mutex_destroy(&c->mu);
    free(c);
    grpc_shutdown();
}

static void status_fill(struct kp_rpc_status *st, grpc_status_code code, grpc_slice details,
                        const char *error_string)
{
    char *d;

    if (st == NULL) {
        return;
    }
    st->code = code;
    d = grpc_slice_to_c_string(details);
    snprintf(st->details, sizeof(st->details), "%s",
             d[0] != '\0' ? d : (error_string ? error_string : ""));
    gpr_free(d);
}

static void cq_drain_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

int kp_rpc_unary(struct kp_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                 long long timeout_ms, struct kp_rpc_status *st)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice method = grpc_slice_from_static_string(path);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata md;
    grpc_byte_buffer *send_bb = pack_msg(req), *recv_bb = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op ops[6];
    grpc_call *call;
    grpc_event ev;
    char tag;
    size_t wire;
    int rc = KP_ERPC;

    *resp = NULL;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                    deadline_ms(timeout_ms > 0 ? timeout_ms : -1), NULL);
    memset(ops, 0, sizeof(ops));
    md_op(ch, &ops[0], &md);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
        code = GRPC_STATUS_INTERNAL;
    }
    else {
        ev = grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        (void) ev;
    }
    status_fill(st, code, details, error_string);
    if (code == GRPC_STATUS_OK) {
        if (recv_bb == NULL || (*resp = unpack_bb(resp_desc, recv_bb, &wire)) == NULL) {
            if (st != NULL) {
                st->code = GRPC_STATUS_INTERNAL;
                snprintf(st->details, sizeof(st->details), "the reply to %s did not unpack", path);
            }
        }
        else {
            rc = 0;
        }
    }
    if (recv_bb != NULL) {
        grpc_byte_buffer_destroy(recv_bb);
    }
    grpc_byte_buffer_destroy(send_bb);
    grpc_slice_unref(details);
    gpr_free((void *) error_string);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(call);
    md_release(&md);
    cq_drain_destroy(cq);
    return rc;
}

int kp_rpc_stream_open(struct kp_rpc_channel *ch, const char *path,
                       const ProtobufCMessageDescriptor *resp_desc, long long timeout_ms,
                       struct kp_rpc_stream **out, struct kp_rpc_status *st)
{
    struct kp_rpc_stream *s = calloc(1, sizeof(*s));
    grpc_op ops[2];

    if (s == NULL) {
        return -ENOMEM;
    }
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    s->resp_desc = resp_desc;
    s->status_details = grpc_empty_slice();
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trail_md);
    s->call = grpc_channel_create_call(ch->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
                                       grpc_slice_from_static_string(path), NULL,
                                       deadline_ms(timeout_ms > 0 ? timeout_ms : -1), NULL);
    memset(ops, 0, sizeof(ops));
    md_op(ch, &ops[0], &s->md);
    if (grpc_call_start_batch(s->call, ops, 1, &s->t_md, NULL) != GRPC_CALL_OK) {
        goto fail;
    }
    /* Not awaited here: with a peer that is frozen (SIGSTOP) and no longer reads, the headers
     * may never be written, and a caller blocked in open has no stream to cancel. The
     * sending thread collects it before its first send (md_wait). */
    s->md_pending = true;
    /* Armed from the start, so an early error status is seen (spec pitfall 6). */
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
    ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[1].data.recv_status_on_client.trailing_metadata = &s->trail_md;
    ops[1].data.recv_status_on_client.status = &s->status;
    ops[1].data.recv_status_on_client.status_details = &s->status_details;
    ops[1].data.recv_status_on_client.error_string = &s->error_string;
    if (grpc_call_start_batch(s->call, ops, 2, &s->t_status, NULL) != GRPC_CALL_OK) {
        goto fail;
    }
    *out = s;
    return 0;
fail:
    if (st != NULL) {
        st->code = GRPC_STATUS_INTERNAL;
        snprintf(st->details, sizeof(st->details), "cannot start a call to %s", path);
    }
    s->status_done = true;
    kp_rpc_stream_destroy(s);
    return KP_ERPC;
}

/* Collects the initial metadata's send (see kp_rpc_stream_open); false if it failed. */
static bool md_wait(struct kp_rpc_stream *s)
{
    if (s->md_pending) {
        grpc_event ev =
            grpc_completion_queue_pluck(s->cq, &s->t_md, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

        s->md_pending = false;
        s->md_failed = !ev.success;
    }
    return !s->md_failed;
}

static int stream_send_bb(struct kp_rpc_stream *s, grpc_byte_buffer *bb)
{
    grpc_op op;
    grpc_event ev;

    if (s->broken || !md_wait(s)) {
        grpc_byte_buffer_destroy(bb);
        s->broken = true;
        return KP_ERPC;
    }
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_send, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(bb);
        s->broken = true;
        return KP_ERPC;
    }
    ev = grpc_completion_queue_pluck(s->cq, &s->t_send, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_byte_buffer_destroy(bb);
    if (!ev.success) {
        s->broken = true;
        return KP_ERPC;
    }
    return 0;
}

int kp_rpc_stream_send(struct kp_rpc_stream *s, const ProtobufCMessage *msg)
{
    return stream_send_bb(s, pack_msg(msg));
}

int kp_rpc_stream_send_bytes(struct kp_rpc_stream *s, const void *buf, size_t len)
{
    return stream_send_bb(s, bytes_bb(buf, len));
}

int kp_rpc_stream_recv(struct kp_rpc_stream *s, ProtobufCMessage **msg, long long timeout_ms)
{
    grpc_op op;
    grpc_event ev;
    grpc_byte_buffer *bb;
    size_t wire;

    *msg = NULL;
    if (!s->recv_armed) {
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &s->recv_bb;
        if (grpc_call_start_batch(s->call, &op, 1, &s->t_recv, NULL) != GRPC_CALL_OK) {
            return KP_ERPC;
        }
        s->recv_armed = true;
    }
    ev = grpc_completion_queue_pluck(s->cq, &s->t_recv, deadline_ms(timeout_ms), NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        return -ETIMEDOUT;
    }
    s->recv_armed = false;
    bb = s->recv_bb;
    s->recv_bb = NULL;
    if (!ev.success) {
        if (bb != NULL) {
            grpc_byte_buffer_destroy(bb);
        }
        return KP_ERPC;
    }
    if (bb == NULL) {
        return 0;
    }
    *msg = unpack_bb(s->resp_desc, bb, &wire);
    grpc_byte_buffer_destroy(bb);
    return *msg != NULL ? 1 : KP_EPROTO;
}

int kp_rpc_stream_close_send(struct kp_rpc_stream *s)
{
    grpc_op op;
    grpc_event ev;

    if (s->broken || !md_wait(s)) {
        s->broken = true;
        return KP_ERPC;
    }
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_close, NULL) != GRPC_CALL_OK) {
        return KP_ERPC;
    }
    ev = grpc_completion_queue_pluck(s->cq, &s->t_close, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.success ? 0 : KP_ERPC;
}

int kp_rpc_stream_finish(struct kp_rpc_stream *s, struct kp_rpc_status *st, long long timeout_ms)
{
    if (!s->status_done) {
        grpc_event ev =
            grpc_completion_queue_pluck(s->cq, &s->t_status, deadline_ms(timeout_ms), NULL);

        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            return -ETIMEDOUT;
        }
        s->status_done = true;
    }
    status_fill(st, s->status, s->status_details, s->error_string);
    return s->status == GRPC_STATUS_OK ? 0 : KP_ERPC;
}

void kp_rpc_stream_cancel(struct kp_rpc_stream *s)
{
    /* grpc_call_cancel is thread-safe; the call stays referenced until destroy. */
    if (s != NULL && s->call != NULL) {
        grpc_call_cancel(s->call, NULL);
    }
}

void kp_rpc_stream_destroy(struct kp_rpc_stream *s)
{
    if (s == NULL) {
        return;
    }
    if (s->call != NULL) {
        if (!s->status_done) {
            grpc_call_cancel(s->call, NULL);
            grpc_completion_queue_pluck(s->cq, &s->t_status, gpr_inf_future(GPR_CLOCK_REALTIME),
                                        NULL);
        }
        if (s->recv_armed) {
            grpc_completion_queue_pluck(s->cq, &s->t_recv, gpr_inf_future(GPR_CLOCK_REALTIME),
                                        NULL);
        }
        if (s->md_pending) {
            grpc_call_cancel(s->call, NULL); /* not collected: it may never go out */
            grpc_completion_queue_pluck(s->cq, &s->t_md, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        }
        if (s->recv_bb != NULL) {
            grpc_byte_buffer_destroy(s->recv_bb);
        }
        grpc_call_unref(s->call);
    }
    md_release(&s->md);
    grpc_slice_unref(s->status_details);
    gpr_free((void *) s->error_string);
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trail_md);
    cq_drain_destroy(s->cq);
    free(s);
}
