/*
 * What the two files of the capture coordinator share (docs/style.md §2): coord.c starts,
 * follows, stops and ends captures; coord_agents.c serves the agents' Attach calls and applies
 * their reports. Everything here is guarded by struct kp_coord's mu unless it says otherwise.
 */
#ifndef KP_COORD_INT_H
#define KP_COORD_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "coord.h"
#include "kp_codec.h"
#include "kp_str.h"
#include "kprof.pb-c.h"
#include "store.h"

#define KP_COORD_MAX_TEXT        256
#define KP_COORD_MAX_REASON      2048
#define KP_COORD_MAX_PROCESSES   65536
#define KP_COORD_MAX_RANKS       (1u << 20)
#define KP_COORD_MAX_STEPS       100000
#define KP_COORD_MAX_DUR_MS      (24LL * 3600 * 1000)
#define KP_COORD_MAX_DEADLINE    (7LL * 24 * 3600 * 1000)
#define KP_COORD_REARM_MS        2000
#define KP_COORD_UNKNOWN_RATE    8 /* steps of margin while no rank's step rate is known */
#define KP_COORD_STATUS_LIMIT    20
#define KP_COORD_STORED_CHECK_MS 250 /* how often ranks waiting to be stored are checked */

#define ST_PENDING   KPROF__V1__RANK_STATE__RANK_STATE_PENDING
#define ST_CAPTURING KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING
#define ST_FLUSHING  KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING
#define ST_DONE      KPROF__V1__RANK_STATE__RANK_STATE_DONE
#define ST_FAILED    KPROF__V1__RANK_STATE__RANK_STATE_FAILED

struct agent {
    struct kp_coord *coord;
    struct kp_rpc_call *call; /* a reference; NULL once the call is over */
    uint64_t id;              /* the agent_id of its reports; 0 before the first */
    char host[KP_COORD_MAX_TEXT + 1];
    char peer[128];
    /* who attached it (kp_store_principal; "" for kp_coord_feed_report's), and whether that
     * identity is bound to one node (authentication on, NAME not "*") */
    char principal[KP_STORE_PRINCIPAL_MAX];
    bool authenticated;
    Kprof__V1__AgentReport *report; /* the newest, owned */
    long long report_ms;            /* CLOCK_MONOTONIC of its arrival */
    long long gone_ms;              /* when the call ended; 0 while attached */
    bool local;                     /* kp_coord_feed_report's: attached without a call */
    uint32_t slot;                  /* ... and which one */
    bool invalid_logged;
    bool foreign_logged; /* a report of ranks it does not host was logged */
    struct agent *next;
};

struct crank {
    int32_t rank;
    int state; /* Kprof__V1__RankState */
    uint64_t agent_id;
    char agent_by[KP_STORE_PRINCIPAL_MAX]; /* the principal of that agent */
    char host[KP_COORD_MAX_TEXT + 1];
    uint32_t pid;
    uint64_t records, dropped;
    int64_t first_step, last_step;
    long long armed_ms; /* when ARM was last sent for it */
    /* The agent said DONE with a StreamMark: FLUSHING until those batches are found in
     * ingest_batches (stored), then DONE. */
    bool awaiting, stored;
    uint64_t mark_stream, mark_first, mark_last, mark_count;
    char reason[KP_COORD_MAX_REASON + 1];
};

struct cap {
    uint64_t run_id; /* 0 while the run is being created */
    char job[KP_COORD_MAX_TEXT + 1];
    char name[KP_COORD_MAX_TEXT + 1];
    char activities_text[KP_COORD_MAX_TEXT + 1];
    uint32_t world_size;
    int64_t start_step;
    uint32_t steps;
    uint64_t duration_ms;
    uint32_t activities;
    long long deadline_ms; /* CLOCK_MONOTONIC */
    int64_t deadline_ns;   /* CLOCK_REALTIME, for users */
    bool stopped;
    bool deadline_stop_sent; /* STOP sent to its agents when the deadline passed */
    bool ending;             /* its end is being written to PostgreSQL */
    bool ended;
    /* taken over from PostgreSQL by kp_coord_recover: its ranks' agents (agent_id 0 until
     * one reports the rank) have the agent grace from adopted_ms to reattach */
    bool adopted;
    long long adopted_ms;
    int run_state; /* Kprof__V1__RunState */
    int64_t created_ns, ended_ns;
    long long ended_ms;
    size_t n;
    struct crank *ranks;
    struct cap *next; /* newest first */
};

struct kp_coord {
    struct kp_coord_opts o;
    pthread_mutex_t mu;
    struct agent *agents;
    struct cap *caps;
    struct kp_coord_stats stats;
    long long stored_check_ms;  /* when check_stored last asked PostgreSQL */
    bool active;                /* this replica coordinates captures (kp_coord_set_role) */
    char coordinator_addr[256]; /* when not: where the coordinator is ("": none elected) */
};

struct procref {
    const Kprof__V1__AgentProcess *p;
    const struct agent *a;
};

static inline bool kp__coord_terminal(int st)
{
    return st == ST_DONE || st == ST_FAILED;
}

static inline const char *kp__coord_state_name(int st)
{
    switch (st) {
    case ST_PENDING:
        return "pending";
    case ST_CAPTURING:
        return "capturing";
    case ST_FLUSHING:
        return "flushing";
    case ST_DONE:
        return "done";
    case ST_FAILED:
        return "failed";
    default:
        return "unknown";
    }
}

static inline bool kp__coord_text_ok(const char *s, size_t max)
{
    size_t n = s == NULL ? 0 : strlen(s);

    return n <= max && kp_utf8_valid(s == NULL ? "" : s, n);
}

static inline void kp__coord_copy_text(char *dst, size_t cap, const char *src)
{
    kp_strlcpy(dst, cap, src != NULL ? src : "");
}

/* The capture of run_id, or NULL. mu held. */
struct cap *kp__coord_cap_by_run(struct kp_coord *c, uint64_t run_id);

/* Sends k's ARM to agent a: for its ranks still PENDING, or all of its ranks. mu held. */
void kp__coord_send_arm(struct kp_coord *c, struct cap *k, struct agent *a, bool all);

/* The processes the attached agents report (of job, or all: NULL), sorted by job and rank, in
 * *out (owned: free). Returns their count or -ENOMEM. mu held. */
long kp__coord_gather(struct kp_coord *c, const char *job, struct procref **out);

#endif
