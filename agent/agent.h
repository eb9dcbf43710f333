/*
 * kprof-agent as an object (one per node): agent_main.c and the tests drive it through
 * create/run/stop/destroy.
 *
 * Threads: the loop thread (kp_agent_run: epoll over the listening socket, every library
 * connection, a timer and a wake-up eventfd; owns the sessions, the captures and their
 * batchers, and appends to the spool); the uplink thread (uplink.h: pushes the spool to
 * collectord and acknowledges it as collectord acknowledges); the attach thread (attach.h:
 * keeps a Control.Attach call open, sends the loop's reports and queues the coordinator's
 * capture commands for the loop, woken by the eventfd); the HTTP thread (/healthz, /readyz,
 * /metrics) when --http-listen is set.
 */
#ifndef KP_AGENT_H
#define KP_AGENT_H

#include <stdbool.h>
#include <stddef.h>

struct kp_agent;

struct kp_agent_config {
    char *socket;      /* AF_UNIX SOCK_SEQPACKET path */
    char *socket_mode; /* octal, e.g. "0660" */
    char *allow_uid;   /* comma list of uids or user names; own uid and root always allowed */
    char *allow_group; /* comma list of gids or group names whose members are allowed */
    char *collector;   /* host:port of kprof-collectord */
    char *tls_ca;      /* PEM of the collector's CA; empty: plaintext */
    char *tls_cert;    /* mutual TLS: this agent's certificate (urn:kprof:agent:HOST); "" none */
    char *tls_key;     /* its private key */
    char *token_file;  /* first line: the agent's bearer token (role agent, NAME its host) */
    char *spool_dir;
    long long spool_max_bytes;
    long long batch_rows;
    long long batch_ms;
    long long max_sessions;
    long long window_timeout_ms; /* a begun window must end within this; 0: from the step rate */
    char *http_listen;           /* "" disables */
    char *metrics_token_file;    /* bearer token /metrics requires; "": open */
    char *ready_file;            /* written with "socket=<path>" (and "http=...") once listening */
    int log_level;               /* index into error, warn, info, debug */
    char *host;                  /* this node's name for logs; "" : gethostname() */
    bool attach;         /* Control.Attach to collectord: reports, capture commands (without it the
                          * agent only uploads what is spooled: nothing can start a capture) */
    char *nvidia_params; /* the NVIDIA driver's parameters file (preflight.h); "": not read */
};

/*
 * Opens the spool, binds the socket (mkdir -p its directory, unlinks a stale socket file,
 * chmods it), starts the uplink, attach and HTTP threads. Returns 0 and *out, or a
 * negative code with a message in errbuf that says what to do.
 */
int kp_agent_create(const struct kp_agent_config *cfg, struct kp_agent **out, char *errbuf,
                    size_t errlen);

/* Runs the loop until kp_agent_stop. Returns 0, or a negative code if the loop failed. */
int kp_agent_run(struct kp_agent *a);

/* Makes kp_agent_run return soon. Any thread (async-signal-safe: one write to an eventfd). */
void kp_agent_stop(struct kp_agent *a);

/* Stops the threads, closes every connection and frees the agent (the spool stays on disk).
 * Accepts NULL. Not while kp_agent_run runs. */
void kp_agent_destroy(struct kp_agent *a);

#endif
