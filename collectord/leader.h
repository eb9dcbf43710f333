/*
 * kp_leader: the election of the one capture coordinator among collectord replicas
 * (docs/design.md "Coordinator election").
 *
 * Every replica runs one thread with a PostgreSQL connection of its own (application_name
 * "kprof-collectord-coordinator"). A replica that takes part (--coordinator) tries the
 * session-level advisory lock KP_LEADER_LOCK_KEY every poll; the session holding it is the
 * coordinator. On taking the lock it waits out the fence (until the previous holder's last
 * heartbeat is a poll, a heartbeat's limit and 1 s old: by then that holder has stepped
 * down), bumps the epoch in
 * the one row of kp_coordinator (address, host, pid, since), adopts the open captures
 * (kp_coord_recover) and activates the capture coordinator (kp_coord_set_role). Each poll the
 * holder heartbeats that row over the lock connection, within one poll (at least 1 s): when
 * the heartbeat
 * fails, times out, or finds a newer epoch, it steps down at once (every Attach call ends
 * UNAVAILABLE) and closes the connection, which releases the lock if it still held it.
 *
 * Every replica (a non-participant too) reads the row each poll, with whether some session
 * holds the lock, for Control.Coordinator and the refusals of kp_coord_refuse.
 */
#ifndef KP_LEADER_H
#define KP_LEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kp_coord;
struct kp_leader;

/* The advisory lock (pg_try_advisory_lock(bigint)): "kprf" */
#define KP_LEADER_LOCK_KEY 0x6b707266LL

struct kp_leader_opts {
    const char *conninfo;   /* copied */
    bool take_part;         /* --coordinator: try the lock; false: only read who holds it */
    long long poll_ms;      /* --coordinator-poll-ms */
    const char *advertise;  /* HOST:PORT others reach this replica at (copied) */
    struct kp_coord *coord; /* borrowed; outlives the leader */
};

/* Who coordinates, as last read (any thread). */
struct kp_leader_info {
    bool elected; /* some session holds the lock and the row names it */
    bool is_self; /* this replica is the active coordinator */
    char address[256];
    char host[256];
    uint32_t pid;
    int64_t since_ns;
    uint64_t epoch;
};

struct kp_leader_stats {
    bool active;         /* this replica is the coordinator now */
    uint64_t takeovers;  /* times this replica became the coordinator */
    uint64_t step_downs; /* times it stopped being it (lock connection lost, newer epoch) */
};

/*
 * Makes one election attempt at once (so that a lone collectord coordinates as soon as it
 * serves), then starts the thread. A PostgreSQL failure is not an error (the thread retries).
 * Returns 0 and *out, or -ENOMEM / -EAGAIN with errbuf.
 */
int kp_leader_create(const struct kp_leader_opts *o, struct kp_leader **out, char *errbuf,
                     size_t errlen);

void kp_leader_info(struct kp_leader *l, struct kp_leader_info *out);
void kp_leader_get_stats(struct kp_leader *l, struct kp_leader_stats *out);

/*
 * The address others reach a server listening on listen (bound to port) at: listen itself
 * unless its host is a wildcard (0.0.0.0, [::], "" or "*"), then this machine's host name with
 * port. Writes into out (NUL-terminated, truncated to len).
 */
void kp_leader_default_advertise(const char *listen, int port, char *out, size_t len);

/* Steps down (the coordinator deactivated first, then the row marked released so that a
 * standby need not wait out the fence), stops the thread, closes the connection and frees l.
 * Accepts NULL. */
void kp_leader_destroy(struct kp_leader *l);

#endif
