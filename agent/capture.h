/*
 * kp_captures: the agent's capture state machine. collectord's coordinator decides what to
 * capture (the job, the ranks, the common start step, the window) and sends it as a
 * CaptureCommand (uplink.h); this module arms the local processes, follows each rank through
 * its window, feeds its records to a batcher whose batches go to the spool, fails a rank that
 * misses its deadline, and says what state every rank is in for the agent's reports.
 *
 * A rank goes ARMED (ARM sent, a batcher ready) -> BEGUN (the library began its window) ->
 * DONE (WINDOW_END) or FAILED (the library failed, the process left, a deadline passed); a
 * DONE rank is reported FLUSHING until the spool is acknowledged through its last batch. A
 * rank's process is released for other captures as soon as the rank is over; the capture
 * itself stays, for the reports, until KIND_FORGET or KP_CAP_FINISHED_KEEP_MS after every rank
 * was over.
 *
 * Processes: the capture side of one registered process is a struct kp_proc, embedded in the
 * session that owns the connection (session.h). The session fills its identity and steps;
 * this module owns its capture fields. The module reaches a process only through the ops the
 * session side gives it (send a message, look up a string, find a rank), so it never depends
 * on sessions.
 *
 * Ownership: kp_captures_create's set owns every capture and the batchers of the processes
 * in them. Threads: the agent's loop thread only. Errors: 0 or a negative errno.
 */
#ifndef KP_CAPTURE_H
#define KP_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_wire.h"
#include "kprof.pb-c.h"

struct kp_batcher;
struct kp_spool;
struct kp_agent_metrics;
struct kp_capture;
struct kp_captures;

/* A window with neither steps nor a duration would never end: it gets this duration. */
#define KP_CAP_DEFAULT_DURATION_MS 5000
/* A rank must begin its window within this (more for slow steps), and a begun window end
 * within this, unless --window-timeout says otherwise. */
#define KP_CAP_DEADLINE_MIN_MS 60000
/* Finished captures stay (reported in their final state) until collectord sends
 * KIND_FORGET, or this long, at most KP_CAP_MAX_FINISHED of them. */
#define KP_CAP_FINISHED_KEEP_MS (10 * 60 * 1000)
#define KP_CAP_MAX_FINISHED     64

/* One registered process as the capture state machine sees it. */
struct kp_proc {
    /* kept by the session: the identity from HELLO (job and host NUL-terminated, valid
     * UTF-8) and the step estimate (kp_proc_note_step) */
    uint32_t pid;
    struct kp_wire_hello h;
    int64_t current_step;   /* the last step reported; -1 before the first */
    int64_t step0;          /* the first step seen (or after the counter went back); -1 */
    long long step_t0_ms;   /* CLOCK_MONOTONIC of step0 */
    long long step_seen_ms; /* when current_step last changed */
    /* owned by kp_captures (zero in a fresh process) */
    struct kp_captures *set;
    struct kp_capture *cap; /* the capture this process is in now, or NULL */
    size_t cap_idx;         /* its rank slot there */
    uint64_t capture_id;    /* the id in its last ARM: the library's messages carry it */
    struct kp_batcher *bat; /* while its rank's window is live */
};

struct kp_captures_ops {
    void *ud;
    /* Sends one message (ARM or DISARM) to p's process. Returns 0 or a negative errno. */
    int (*send)(void *ud, struct kp_proc *p, enum kp_wire_type type, const void *msg, size_t len);
    /* The text of p's string id (len bytes, borrowed until the next message of p), or NULL. */
    const char *(*string)(void *ud, struct kp_proc *p, uint32_t id, size_t *len);
    /* The process of rank `rank` of `job`: an idle one when several are registered, else the
     * newest; NULL when none is. */
    struct kp_proc *(*find)(void *ud, const char *job, int32_t rank);
};

struct kp_captures_config {
    struct kp_captures_ops ops;
    struct kp_spool *spool;           /* borrowed: the batches go there */
    struct kp_agent_metrics *metrics; /* borrowed */
    const char *host;                 /* this node, for a rank whose HELLO names none */
    long long batch_rows, batch_ms;   /* the batchers' limits */
    long long window_timeout_ms;      /* 0: from the step rate */
};

/* Returns 0 and *out (kp_captures_destroy), or -ENOMEM. cfg is copied; its pointers are
 * borrowed and must outlive the set. */
int kp_captures_create(const struct kp_captures_config *cfg, struct kp_captures **out);

/* Frees every capture and ends their processes' batchers. Accepts NULL. */
void kp_captures_destroy(struct kp_captures *set);

/* --- what the session tells about its process --- */

/* Makes p a process of set with no capture (before its first message). */
void kp_proc_init(struct kp_proc *p, struct kp_captures *set);

/* A step report (HELLO, STATUS, STEP): updates the step estimate. */
void kp_proc_note_step(struct kp_proc *p, int64_t step);

/* Replaces, in place, each byte of s that does not start a valid UTF-8 sequence with '?':
 * names and reasons from processes go into protobuf strings, which collectord checks. */
void kp_proc_clean_text(char *s);

/* Observed milliseconds per step, 0 while unknown. */
long long kp_proc_step_ms(const struct kp_proc *p);

/* The run p captures for now, 0 when idle. */
uint64_t kp_proc_run_id(const struct kp_proc *p);

/* The library's STATUS: its counters for the batcher, and a capture it failed or began. */
void kp_proc_on_status(struct kp_proc *p, const struct kp_wire_status *st);

/* RECORDS (count records of one kind): to p's batcher, or counted dropped when p has none. */
void kp_proc_on_records(struct kp_proc *p, const struct kp_wire_records *rh, const void *recs,
                        uint32_t count);

/* A STEP message: to the batcher while capturing. */
void kp_proc_on_step(struct kp_proc *p, const struct kp_wire_step *st);

/* WINDOW_BEGIN or WINDOW_END (type) of p's capture; another capture's is ignored. */
void kp_proc_on_window(struct kp_proc *p, enum kp_wire_type type, const struct kp_wire_window *w);

/* The loop's tick: lets p's batcher emit what waited long enough. */
void kp_proc_tick(struct kp_proc *p, long long now);

/* p's process exited or closed its connection: its live rank fails, its batcher ends. */
void kp_proc_gone(struct kp_proc *p);

/* --- what collectord commands (uplink.c) --- */

/* KIND_ARM: a capture of cmd->ranks of cmd->job, armed at once (a run that has a capture
 * here already is ignored: collectord resends its arms after a reconnect). */
void kp_captures_arm(struct kp_captures *set, const Kprof__V1__CaptureCommand *cmd);

/* KIND_STOP: armed ranks are disarmed and done, begun ones disarmed (their window ends). */
void kp_captures_stop(struct kp_captures *set, uint64_t run_id);

/* KIND_FORGET: collectord has ended the run; ranks still live are disarmed, the capture
 * freed. */
void kp_captures_forget(struct kp_captures *set, uint64_t run_id);

/* --- the loop's tick --- */

/* Deadlines, and the end of captures whose ranks are all over with the spool acknowledged
 * through acked; then frees the captures finished long enough ago. */
void kp_captures_tick(struct kp_captures *set, long long now, uint64_t acked);

/* --- reports --- */

/* Rank slots of every capture (the size kp_captures_report needs). */
size_t kp_captures_count_ranks(const struct kp_captures *set);

/*
 * Fills ranks[0..] (at most max; each initialised here) with every capture's ranks as
 * collectord sees them: states judged against acked, each reason written to reasons[i]
 * (reason_len bytes, valid UTF-8, pointed to by ranks[i].reason). Logs the ranks whose reported
 * state changed. Returns how many were filled.
 */
size_t kp_captures_report(struct kp_captures *set, uint64_t acked,
                          Kprof__V1__AgentCaptureRank *ranks, char *reasons, size_t reason_len,
                          size_t max);

#endif
