/*
 * kp_rpc: kprof's one wrapper over gRPC's C core (grpc.h), used by every binary. It speaks
 * real gRPC over HTTP/2, so any gRPC client in any language can call kprof's services; the
 * messages are protobuf-c messages.
 *
 * Server: methods are registered up front with a path ("/kprof.v1.Ingest/Push"), a kind and
 * the request's descriptor. One thread of the server's own turns the completion queue and
 * runs the callbacks; requests that fail to unpack are answered INVALID_ARGUMENT by the
 * wrapper (logged once) and never reach a callback; unknown methods get UNIMPLEMENTED.
 * Replies, stream messages, resume and finish may be issued from any thread: each call
 * keeps its sends in order, with one send in flight, and sends its status after them.
 *
 * Call lifetime: the wrapper holds a reference while the call is live; a callee that keeps
 * the call past a callback (to answer from a worker thread) takes its own with
 * kp_rpc_call_ref and drops it with kp_rpc_call_unref. on_close runs exactly once, when the
 * call is over (status sent or client gone); after it, sends and finish are no-ops.
 *
 * Client: blocking unary calls, and streams on which one thread sends while another receives.
 */
#ifndef KP_RPC_H
#define KP_RPC_H

#include <stdbool.h>
#include <stddef.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "kp_auth.h"

struct kp_rpc_server;
struct kp_rpc_call;
struct kp_rpc_channel;
struct kp_rpc_stream;

enum kp_rpc_kind {
    KP_RPC_UNARY,  /* one request, one reply */
    KP_RPC_STREAM, /* a client stream of requests; the server may send any number of replies */
};

/* What a stream's on_message tells the wrapper to do next. */
enum kp_rpc_next {
    KP_RPC_CONTINUE, /* read the next message */
    KP_RPC_PAUSE,    /* stop reading until kp_rpc_call_resume (flow control to the client) */
    KP_RPC_STOP,     /* read no more (the callee has finished the call or will) */
};

/* Unary: the request, owned by the callee (protobuf_c_message_free_unpacked). The callee
 * answers, now or later from any thread, with kp_rpc_call_reply or kp_rpc_call_finish. */
typedef void kp_rpc_request_cb(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud);
/* Stream opened. Returns the callee's per-call state (passed to the other callbacks). */
typedef void *kp_rpc_open_cb(struct kp_rpc_call *call, void *ud);
/* A stream message, owned by the callee; wire_bytes is its encoded size. */
typedef enum kp_rpc_next kp_rpc_message_cb(struct kp_rpc_call *call, ProtobufCMessage *msg,
                                           size_t wire_bytes, void *state);
/* The client has sent its last message. The callee finishes the call when it is ready. */
typedef void kp_rpc_half_close_cb(struct kp_rpc_call *call, void *state);
/* The call is over: cancelled is true if the client went away (or was cancelled) before a
 * status was sent. Last callback for this call. */
typedef void kp_rpc_close_cb(struct kp_rpc_call *call, bool cancelled, void *state);

struct kp_rpc_method {
    const char *path; /* "/package.Service/Method" */
    enum kp_rpc_kind kind;
    const ProtobufCMessageDescriptor *request;
    kp_rpc_request_cb *on_request; /* unary */
    kp_rpc_open_cb *on_open;       /* stream */
    kp_rpc_message_cb *on_message;
    kp_rpc_half_close_cb *on_half_close;
    kp_rpc_close_cb *on_close;
    void *ud;
    /* The KP_ROLE_* bits that may call it where the server authenticates (opts.auth); a
     * caller with another role gets PERMISSION_DENIED. 0: nobody. */
    unsigned roles;
};

struct kp_rpc_server_opts {
    const char *listen;        /* "127.0.0.1:0" (port 0: ephemeral), "[::1]:7070", "unix:/path" */
    size_t max_message_bytes;  /* larger requests get RESOURCE_EXHAUSTED; 0: 64 MiB */
    const char *tls_cert_file; /* PEM; with tls_key_file, serve TLS; NULL: plaintext */
    const char *tls_key_file;
    /* PEM of the CA whose client certificates are accepted (mutual TLS, optional for the
     * client: one without a certificate must bring a token); NULL: no client certificates. */
    const char *tls_client_ca_file;
    /* Authentication (borrowed; outlives the server): every call is checked before its
     * method sees it, a missing or wrong credential gets UNAUTHENTICATED and a role the method
     * does not take PERMISSION_DENIED, each logged with the peer (never the secret). NULL:
     * no authentication, every caller is "anonymous" with every role (loopback only: the
     * daemons refuse it elsewhere). */
    struct kp_auth *auth;
    const char *name; /* for logs and UNIMPLEMENTED details, e.g. "kprof-collectord" */
};

/*
 * Creates a server with the given methods (borrowed: they must outlive the server), binds
 * and starts it with its completion-queue thread. Returns 0 and *out, or a negative code with
 * the reason in errbuf (e.g. the address is in use).
 */
int kp_rpc_server_create(const struct kp_rpc_server_opts *opts, const struct kp_rpc_method *methods,
                         size_t n_methods, struct kp_rpc_server **out, char *errbuf, size_t errlen);

/* The bound TCP port (useful with port 0), or 0 for unix sockets. */
int kp_rpc_server_port(const struct kp_rpc_server *s);

/*
 * Whether the server accepts connections. gRPC 1.51 stops accepting for good after one
 * accept fails (EMFILE: the process ran out of file descriptors); a watchdog thread of the
 * server (TCP listeners) sees connections stay queued on the listening socket for about 1.5 s,
 * gives that grpc_server up (its live calls go on) and binds a new one on the same address,
 * retrying every 0.5 s until it can. Meanwhile this returns false with the reason in why
 * (NUL-terminated, at most len bytes), for /readyz. Connections that have not finished their
 * handshake within 10 s are closed, and one connection carries at most 256 calls at once
 * (more wait in the client). Thread-safe.
 */
bool kp_rpc_server_accepting(struct kp_rpc_server *s, char *why, size_t len);

/* How many times the watchdog restarted the listener (for /metrics). Thread-safe. */
unsigned long long kp_rpc_server_restarts(struct kp_rpc_server *s);

/*
 * Stops accepting calls, waits up to grace_ms for live calls to finish, then cancels the rest.
 * Callbacks may still run (on_close of cancelled calls) and sends from other threads stay safe
 * until kp_rpc_server_destroy. Blocks. Not from a callback.
 */
void kp_rpc_server_shutdown(struct kp_rpc_server *s, long long grace_ms);

/* Shuts down if needed, drains the queue, joins the thread and frees the server. Every
 * reference the callee took on a call must have been dropped. Accepts NULL. */
void kp_rpc_server_destroy(struct kp_rpc_server *s);

/* Server-side call operations. All are thread-safe. */
void kp_rpc_call_ref(struct kp_rpc_call *call);
void kp_rpc_call_unref(struct kp_rpc_call *call);

/* Queues a message to the client (borrowed: packed before return). Returns 0, -ENOMEM, or
 * -ECANCELED if the call is finished or gone. A stream whose client does not take what is
 * sent stops reading while more than 1 MiB waits for it (HTTP/2 flow control then holds the
 * client's sends), and reads again once half of it has gone: a client that never reads its
 * acks cannot grow the server by all it sends. */
int kp_rpc_call_send(struct kp_rpc_call *call, const ProtobufCMessage *msg);

/* Blocks until every queued send has gone to the transport (back-pressure for a server
 * stream: send, wait, send). Returns 0, -ECANCELED if the call is over or the client gone,
 * -ETIMEDOUT after timeout_ms. Not from a callback (it would stall the server's thread). */
int kp_rpc_call_wait_sent(struct kp_rpc_call *call, long long timeout_ms);

/* Ends the call with a status after the queued sends. details is copied. Later calls are
 * no-ops. Returns 0, or -ECANCELED if it was already finished or gone. */
int kp_rpc_call_finish(struct kp_rpc_call *call, grpc_status_code code, const char *details);

/* kp_rpc_call_send then kp_rpc_call_finish(OK): the reply of a unary call. */
int kp_rpc_call_reply(struct kp_rpc_call *call, const ProtobufCMessage *msg);

/* Reads again after KP_RPC_PAUSE. No-op if not paused or finished. */
void kp_rpc_call_resume(struct kp_rpc_call *call);

/* The client's address ("ipv4:127.0.0.1:5555") and the method path, for logs. Borrowed. */
const char *kp_rpc_call_peer(const struct kp_rpc_call *call);
const char *kp_rpc_call_method(const struct kp_rpc_call *call);

/* Who made the call (valid for the call's life; borrowed). */
const struct kp_identity *kp_rpc_call_identity(const struct kp_rpc_call *call);

/* Returns GRPC_STATUS_INVALID_ARGUMENT etc. as text ("INVALID_ARGUMENT"). */
const char *kp_rpc_status_name(grpc_status_code code);

/* --- Client --- */

struct kp_rpc_status {
    grpc_status_code code;
    char details[512];
};

struct kp_rpc_channel_opts {
    size_t max_message_bytes; /* largest reply accepted; 0: 64 MiB */
    const char *tls_ca_file;  /* PEM of the CA that signed the server's cert; NULL: plaintext */
    /* Mutual TLS: the client's certificate chain and key (PEM), with tls_ca_file. */
    const char *tls_cert_file;
    const char *tls_key_file;
    /* A file whose first line is the bearer token sent with every call (mode 0600 or 0640).
     * Read at create (an unreadable one fails it) and again at a call when it has changed
     * (looked at once a second at most; a version that cannot be read keeps the last token,
     * logged): a long-lived client takes a rotated token without a restart. NULL or "": none. */
    const char *token_file;
};

/* Creates a channel to target ("127.0.0.1:7070", "unix:/path"). Connects lazily. opts may be
 * NULL. Returns 0 and *out (kp_rpc_channel_destroy), or a negative code with errbuf (a file
 * that cannot be read, a token file others may read). */
int kp_rpc_channel_create(const char *target, const struct kp_rpc_channel_opts *opts,
                          struct kp_rpc_channel **out, char *errbuf, size_t errlen);
void kp_rpc_channel_destroy(struct kp_rpc_channel *ch);

/*
 * A blocking unary call. On success returns 0 and *resp (owned:
 * protobuf_c_message_free_unpacked). On failure returns KP_ERPC with the status in *st
 * (UNAVAILABLE when nothing listens, DEADLINE_EXCEEDED after timeout_ms, ...).
 */
int kp_rpc_unary(struct kp_rpc_channel *ch, const char *path, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                 long long timeout_ms, struct kp_rpc_status *st);

/* Opens a stream call. timeout_ms bounds the whole call (0: none). Returns 0 and *out
 * (kp_rpc_stream_destroy), or a negative code with the status in *st. Does not wait for the
 * server: the first send or close_send waits for the call's headers to go out, so a peer that
 * never reads (frozen) blocks a call that kp_rpc_stream_cancel can end, never the open. */
int kp_rpc_stream_open(struct kp_rpc_channel *ch, const char *path,
                       const ProtobufCMessageDescriptor *resp_desc, long long timeout_ms,
                       struct kp_rpc_stream **out, struct kp_rpc_status *st);

/* Sends a message (borrowed) and waits until the transport took it. Returns 0, or KP_ERPC if
 * the call is broken (then kp_rpc_stream_finish tells why). One sending thread at a time. */
int kp_rpc_stream_send(struct kp_rpc_stream *s, const ProtobufCMessage *msg);

/* Sends bytes as they are (pre-encoded messages, or garbage in tests). */
int kp_rpc_stream_send_bytes(struct kp_rpc_stream *s, const void *buf, size_t len);

/* Receives the next reply: returns 1 and *msg (owned), 0 at the end of the server's
 * messages, -ETIMEDOUT after timeout_ms (the receive stays armed for the next call; -1:
 * wait indefinitely), KP_EPROTO if a reply failed to unpack, or KP_ERPC. One receiving
 * thread at a time; it may run beside the sending thread. */
int kp_rpc_stream_recv(struct kp_rpc_stream *s, ProtobufCMessage **msg, long long timeout_ms);

/* Tells the server no more messages follow. */
int kp_rpc_stream_close_send(struct kp_rpc_stream *s);

/* Waits for the call's final status (up to timeout_ms; -1: indefinitely). Returns 0 if the
 * status is OK, KP_ERPC otherwise (status in *st), -ETIMEDOUT. Replies not yet received are
 * discarded. */
int kp_rpc_stream_finish(struct kp_rpc_stream *s, struct kp_rpc_status *st, long long timeout_ms);

/* Cancels the call from any thread: a send or recv blocked in another thread returns
 * KP_ERPC and finish reports CANCELLED. The owner still calls kp_rpc_stream_destroy (after
 * the other threads are out of the stream's functions). */
void kp_rpc_stream_cancel(struct kp_rpc_stream *s);

/* Cancels the call if it is not finished, and frees it. Accepts NULL. */
void kp_rpc_stream_destroy(struct kp_rpc_stream *s);

#endif
