/*
 * kp_sessions: the agent's local socket side. It listens on the AF_UNIX SOCK_SEQPACKET socket
 * (kp_wire.h), accepts the connections of the injected workers (peer credentials checked
 * against --allow-uid, at most --max-sessions at once), and keeps one session per connection:
 * the process's identity (HELLO), its library state and counters (STATUS), its string table
 * (STRINGS, demangled), and its struct kp_proc, through which the capture state machine
 * (capture.h) gets its steps, records and windows.
 *
 * The sessions are the kp_captures_ops of the capture set: they send its ARM and DISARM,
 * look up its strings and find its ranks.
 *
 * A malformed message (kp_wire_check, a message before HELLO, a second HELLO) closes only
 * that connection, counted and logged.
 *
 * Ownership: the set owns the listening socket (and its file: unlinked on destroy), every
 * session and its fd. Threads: the agent's loop thread only. Errors: 0 or a negative errno,
 * with a message in errbuf that says what to do.
 */
#ifndef KP_SESSION_H
#define KP_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "capture.h"
#include "kprof.pb-c.h"

struct kp_agent_metrics;
struct kp_sessions;

struct kp_sessions_config {
    const char *socket;      /* the socket's path (copied) */
    const char *socket_mode; /* octal, e.g. "0660"; NULL: 0660 */
    const char *allow_uid;   /* comma list of uids or user names; own uid and root always */
    const char *allow_group; /* comma list of gids or group names: their members may connect */
    long long max_sessions;
    uint64_t agent_id;                /* sent in WELCOME */
    int epfd;                         /* the loop's epoll: sessions add their fds with
                                       * data.ptr = the session (kp_sessions_on_event) */
    struct kp_agent_metrics *metrics; /* borrowed */
};

/*
 * Parses the allow list and the mode, binds the socket (mkdir -p its directory; a stale
 * socket file is removed unless an agent answers there) and chmods it. Returns 0 and *out
 * (kp_sessions_destroy), or a negative errno with errbuf.
 */
int kp_sessions_create(const struct kp_sessions_config *cfg, struct kp_sessions **out, char *errbuf,
                       size_t errlen);

/* Sets the capture set the sessions' processes belong to (before the first accept). */
void kp_sessions_set_captures(struct kp_sessions *ss, struct kp_captures *caps);

/* The ops for kp_captures_config (ud: ss). */
struct kp_captures_ops kp_sessions_capture_ops(struct kp_sessions *ss);

/* Closes every connection and the socket, unlinks the socket file, frees ss. Accepts NULL.
 * Before or after kp_captures_destroy of the set the processes are in. */
void kp_sessions_destroy(struct kp_sessions *ss);

/* The listening fd (nonblocking), for the loop's epoll. */
int kp_sessions_listen_fd(const struct kp_sessions *ss);

/* The listening fd is readable: accepts every pending connection. */
void kp_sessions_accept(struct kp_sessions *ss);

/* An epoll event with data.ptr = tag: reads and handles the session's messages, unless the
 * session was closed earlier in the same round. */
void kp_sessions_on_event(struct kp_sessions *ss, void *tag);

/* The loop's tick: the batchers of capturing processes emit what waited long enough. */
void kp_sessions_tick(struct kp_sessions *ss, long long now);

/* Registered processes (the size kp_sessions_report needs). */
size_t kp_sessions_count(const struct kp_sessions *ss);

/*
 * Fills procs[0..] (at most max; each initialised here; strings borrowed from the sessions
 * until the next message) with the registered processes, and ages[i] with the ms since
 * process i's step last changed (0 when it has none). Returns how many were filled.
 */
size_t kp_sessions_report(struct kp_sessions *ss, long long now, Kprof__V1__AgentProcess *procs,
                          uint32_t *ages, size_t max);

#endif
