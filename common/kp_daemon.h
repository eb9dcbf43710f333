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
};

/* "error", "warn", "info", "debug", NULL: the log-level enum of every daemon's config. */
extern const char *const kp_daemon_log_levels[];

/* Blocks SIGTERM and SIGINT in the calling thread and ignores SIGPIPE (see Signals above). Call
 * it in main before any thread starts. */
void kp_daemon_signals_block(void);

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
 * signals, creates the daemon, serves until SIGTERM or SIGINT, destroys it and frees cfg's
 * strings. cfg is the caller's zeroed config struct, whose first member is a struct
 * kp_daemon_config. Returns main's exit status: 0; 2 bad usage; 1 when create failed (logged
 * as "cannot start: <why>" under module).
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

/*
 * Starts the HTTP server of /healthz, /readyz and /metrics on listen (kp_http_create), unless
 * listen is NULL or "": then *out is NULL. h and ud as kp_http_create. Returns 0, or
 * kp_http_create's code and message.
 */
int kp_daemon_http_start(const char *listen, const struct kp_http_handlers *h, void *ud,
                         struct kp_http **out, char *errbuf, size_t errlen);

/* Writes ready_file (kp_ready_file_write; NULL or "": nothing) with key=value and, when http
 * is not NULL, http=127.0.0.1:<its port>. Returns 0 or kp_ready_file_write's code and message. */
int kp_daemon_ready_write(const char *ready_file, const char *key, const char *value,
                          const struct kp_http *http, char *errbuf, size_t errlen);

#endif
