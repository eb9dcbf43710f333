/*
 * kp_daemon: what every kprof daemon's main wires the same way (docs/style.md §1, §7): the stop
 * signals, the HTTP server of /healthz, /readyz and /metrics with its ready file, and the
 * settings collectord and the analyzer share.
 *
 * Signals: SIGTERM and SIGINT stop a daemon. kp_daemon_signals_block() blocks them in the main
 * thread before any other thread starts (every thread inherits the mask), so that only the
 * thread that waits for them (sigwait) takes them, and ignores SIGPIPE (a peer that goes away
 * is an error on the socket, not the end of the daemon).
 *
 * Logs carry the module the caller names ("collectord", "analyzer", "agent").
 */
#ifndef KP_DAEMON_H
#define KP_DAEMON_H

#include <stdbool.h>
#include <stddef.h>

#include "kp_ready.h"

struct kp_http;
struct kp_http_handlers;

/* The settings of a gRPC server daemon that keeps its data in PostgreSQL (collectord, the
 * analyzer): the first member of its config. Strings are owned by the config (kp_config_fini). */
struct kp_daemon_config {
    char *listen;      /* gRPC address, e.g. "127.0.0.1:7070" */
    char *http_listen; /* /healthz, /readyz, /metrics; "" disables */
    char *pg_conninfo; /* libpq conninfo */
    char *tls_cert;    /* PEM files; empty: plaintext */
    char *tls_key;
    int log_level;          /* index into kp_daemon_log_levels */
    char *ready_file;       /* written with the bound addresses once serving */
    char *pg_password_file; /* PostgreSQL password, read once at start; "": none */
    char *token_file;       /* bearer tokens and their roles (kp_auth.h); "": none */
    char *tls_client_ca;    /* PEM CA of the client certificates that carry roles; "": none */
    bool plaintext;         /* serve without TLS: refused unless listen is loopback or unix */
    bool allow_anonymous;   /* no authentication: refused unless listen is loopback or unix */
    char *metrics_token;    /* file of the bearer token /metrics requires; "": open */
};

/* The config rows (struct kp_config_def) of the settings above that secure a daemon, for a
 * config struct TYPE whose member base is its struct kp_daemon_config. */
/* One row a line reads better than the formatter's one field a line. */
/* clang-format off */
#define KP_DAEMON_SECURITY_CONFIG(TYPE)                                                          \
    { "tls-cert", KP_CONFIG_STRING, "", 0, 0, offsetof(TYPE, base.tls_cert),                     \
      "PEM certificate chain: serve gRPC over TLS (with --tls-key)", NULL, false },              \
    { "tls-key", KP_CONFIG_STRING, "", 0, 0, offsetof(TYPE, base.tls_key),                       \
      "PEM private key of --tls-cert (mode 0600)", NULL, true },                                 \
    { "tls-client-ca", KP_CONFIG_STRING, "", 0, 0, offsetof(TYPE, base.tls_client_ca),           \
      "PEM CA whose client certificates carry a role (SAN URI urn:kprof:ROLE:NAME)", NULL,       \
      false },                                                                                   \
    { "auth-tokens", KP_CONFIG_STRING, "", 0, 0, offsetof(TYPE, base.token_file),                \
      "bearer tokens, \"ROLE NAME TOKEN\" a line (mode 0600; re-read when it changes)", NULL,    \
      false },                                                                                   \
    { "plaintext", KP_CONFIG_BOOL, "false", 0, 0, offsetof(TYPE, base.plaintext),                \
      "serve gRPC without TLS: only on a loopback address or a unix socket", NULL, false },      \
    { "allow-anonymous", KP_CONFIG_BOOL, "false", 0, 0, offsetof(TYPE, base.allow_anonymous),    \
      "take calls without a credential, in every role: only on a loopback address or a unix "    \
      "socket (every local user gets in)", NULL, false }
/* clang-format on */

/* The config row of --metrics-token-file, for a config struct TYPE as above. */
#define KP_DAEMON_METRICS_CONFIG(TYPE)                                                           \
    {                                                                                            \
        "metrics-token-file", KP_CONFIG_STRING, "", 0, 0, offsetof(TYPE, base.metrics_token),    \
            "file whose first line is the bearer token /metrics requires (mode 0600); /healthz " \
            "and /readyz stay open",                                                             \
            NULL, false                                                                          \
    }

struct kp_auth;

/*
 * Checks how the daemon is secured and creates its authentication (kp_auth.h). A daemon
 * serves TLS (tls_cert and tls_key) or, only when listen is a loopback address or a unix
 * socket, plaintext when asked for (plaintext); it authenticates its callers (a token file,
 * client certificates, or both) or, only on loopback and when asked (allow_anonymous), takes
 * every caller with every role. Returns 0 and *auth (NULL when anonymous; kp_auth_destroy),
 * or KP_ECONFIG with what to set in errbuf.
 */
int kp_daemon_security(const struct kp_daemon_config *cfg, struct kp_auth **auth, char *errbuf,
                       size_t errlen);

/* Whether a listen address is loopback or a unix socket ("127.0.0.1:7070", "[::1]:0",
 * "localhost:7070", "unix:/run/x"). */
bool kp_daemon_listen_is_local(const char *listen);

/* "error", "warn", "info", "debug", NULL: the log-level enum of every daemon's config. */
extern const char *const kp_daemon_log_levels[];

/* Blocks SIGTERM and SIGINT in the calling thread and ignores SIGPIPE (see Signals above). Call
 * it in main before any thread starts. */
void kp_daemon_signals_block(void);

/* Raises the soft limit of open files (RLIMIT_NOFILE) to the hard one, logging both under
 * module: a daemon holds a descriptor per client connection, and one failed accept stops
 * gRPC 1.51's listener (kp_rpc_server_accepting). kp_daemon_main calls it; the agent too. */
void kp_daemon_raise_nofile(const char *module);

/* Waits for SIGTERM or SIGINT (blocked by kp_daemon_signals_block), logs "stopping signal=TERM"
 * (or INT) under module and returns the signal. */
int kp_daemon_signals_wait(const char *module);

/* Creates the daemon from cfg (borrowed), setting *obj; returns 0, or a negative code with a
 * message in errbuf. */
typedef int kp_daemon_create_cb(const void *cfg, void **obj, char *errbuf, size_t errlen);
/* Stops the daemon and frees obj. */
typedef void kp_daemon_destroy_cb(void *obj);

struct kp_config_def;

/*
 * A server daemon's whole main: parses argv into cfg by defs (kp_config_main: --help,
 * --print-config and bad usage end here with its status), sets the log level, blocks the
 * signals, raises the open-file limit (kp_daemon_raise_nofile), creates the daemon, serves until
 * SIGTERM or SIGINT, destroys it and frees cfg's strings. cfg is the caller's zeroed config struct,
 * whose first member is a struct kp_daemon_config. Returns main's exit status: 0; 2 bad usage; 1
 * when create failed (logged as "cannot start: <why>" under module).
 */
int kp_daemon_main(const char *module, const char *prog, const struct kp_config_def *defs, size_t n,
                   void *cfg, kp_daemon_create_cb *create, kp_daemon_destroy_cb *destroy, int argc,
                   char **argv);

/* A thread that waits for SIGTERM or SIGINT and then calls stop(ud), for a daemon whose loop
 * runs on the main thread (the agent). */
struct kp_daemon_sigwatch;

typedef void kp_daemon_stop_cb(void *ud);

/* Starts the thread (the signals must be blocked already). stop and ud are borrowed until
 * kp_daemon_sigwatch_destroy. Returns 0 and *out, or -EAGAIN or -ENOMEM. */
int kp_daemon_sigwatch_create(const char *module, kp_daemon_stop_cb *stop, void *ud,
                              struct kp_daemon_sigwatch **out);

/* Ends the thread if no signal came (the loop ended on its own; stop is not called then),
 * joins it and frees w. Accepts NULL. */
void kp_daemon_sigwatch_destroy(struct kp_daemon_sigwatch *w);

#define KP_DAEMON_METRICS_TOKEN_MAX 4096

/*
 * Starts the HTTP server of /healthz, /readyz and /metrics on listen (kp_http_create), unless
 * listen is NULL or "": then *out is NULL. With metrics_token_file (not NULL or ""), /metrics
 * needs "Authorization: Bearer <its first line>" (kp_http.h); the file is read once, here,
 * with kp_secret_file_line (mode 0600 or 0640). h and ud as kp_http_create. Returns 0, or
 * kp_secret_file_line's or kp_http_create's code and message.
 */
int kp_daemon_http_start(const char *listen, const char *metrics_token_file,
                         const struct kp_http_handlers *h, void *ud, struct kp_http **out,
                         char *errbuf, size_t errlen);

/* Writes ready_file (kp_ready_file_write; NULL or "": nothing) with the n entries of e (at most
 * KP_DAEMON_READY_MAX; an entry with a NULL value is left out) and, when http is not NULL,
 * http=127.0.0.1:<its port>, then tells systemd the daemon is serving (kp_daemon_notify
 * "READY=1"; a failure there is logged, not returned). Every daemon calls it once, when it
 * serves. Returns 0 or kp_ready_file_write's code and message. */
#define KP_DAEMON_READY_MAX 4
int kp_daemon_ready_write(const char *ready_file, const struct kp_ready_entry *e, size_t n,
                          const struct kp_http *http, char *errbuf, size_t errlen);

/*
 * Sends state ("READY=1", "STOPPING=1", "STATUS=...", newline-separated) to the service manager
 * over $NOTIFY_SOCKET, the sd_notify(3) protocol (a datagram to a unix socket path, or to an
 * abstract one when the variable starts with '@'), so that a Type=notify systemd unit knows
 * when the daemon serves and when it stops. Written here rather than linked from libsystemd so
 * that readiness never depends on how the binary was built. Returns 0 (also when
 * NOTIFY_SOCKET is unset or empty: not under systemd), -EINVAL for an address it cannot use,
 * or -errno from socket or sendto.
 */
int kp_daemon_notify(const char *state);

#endif
