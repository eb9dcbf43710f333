/*
 * The capture state machine: see capture.h. Loop thread only.
 */
#define _GNU_SOURCE
#define KP_LOG_MODULE "agent"
#include "capture.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_log.h"
#include "kp_str.h"
#include "metrics.h"
#include "spool.h"

enum rank_state {
    RS_ARMED,
    RS_BEGUN,
    RS_DONE,
    RS_FAILED,
};

struct cap_rank {
    struct kp_proc *p; /* NULL once the process is gone or the rank is over */
    int32_t rank;
    uint32_t pid;
    enum rank_state state;
    bool last_emitted;  /* the capture's last batch of this rank is in the spool */
    uint64_t last_seq;  /* its seq */
    uint64_t first_seq; /* the seq of the rank's first batch in the spool */
    uint64_t spooled;   /* the rank's batches in the spool, between first_seq and last_seq */
    Kprof__V1__StreamMark mark; /* reported with DONE (kp_captures_report) */
    uint64_t spool_dropped;
    long long deadline_ms; /* CLOCK_MONOTONIC: FAILED if the window has not begun by then, or
                            * (once begun) has not ended by then */
    char reason[300];
    /* reported to collectord */
    uint64_t records;     /* records_in of its batcher, kept once the batcher is gone */
    uint64_t malformed;   /* records its batcher dropped as malformed */
    uint64_t lib_dropped; /* the library's dropped + cupti_dropped in this capture */
    uint64_t spool_rows;  /* rows lost with the batches the spool refused */
    int spool_err;        /* the first spool append error (negative errno) */
    int64_t first_step;   /* the window's, -1 until known */
    int64_t last_step;    /* -1 until WINDOW_END */
    bool stopped;         /* KIND_STOP came before its window began: done, no data */
    int reported;         /* the RankState last reported (0: none yet) */
};

struct kp_capture {
    uint64_t run_id;
    char job[256];
    long long finished_ms; /* CLOCK_MONOTONIC when every rank was over; 0: live */
    int64_t start_step;
    uint32_t steps;
    uint64_t duration_ms;
    uint32_t activities;
    uint32_t world_size;
    size_t n;
    struct cap_rank *ranks;
    struct kp_capture *next;
};

struct kp_captures {
    struct kp_captures_config cfg;
    struct kp_capture *caps;
    uint64_t next_capture_id;
};

int kp_captures_create(const struct kp_captures_config *cfg, struct kp_captures **out)
{
    struct kp_captures *set = calloc(1, sizeof(*set));

    *out = NULL;
    if (set == NULL) {
        return -ENOMEM;
    }
    set->cfg = *cfg;
    *out = set;
    return 0;
}

/* --- processes --- */

void kp_proc_init(struct kp_proc *p, struct kp_captures *set)
{
    memset(p, 0, sizeof(*p));
    p->set = set;
    p->current_step = -1;
    p->step0 = -1;
}

void kp_proc_note_step(struct kp_proc *p, int64_t step)
{
    if (step < 0) {
        return;
    }
    if (p->step0 < 0 || step < p->step0) {
        p->step0 = step; /* first report, or the counter went back (a restarted process) */
        p->step_t0_ms = kp_mono_ms();
    }
    if (step != p->current_step) {
        p->step_seen_ms = kp_mono_ms();
    }
    p->current_step = step;
}

void kp_proc_clean_text(char *s)
{
    size_t n = strlen(s), j = 0;

    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char) s[i];
        size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;

        if (len <= n - i && kp_utf8_valid(s + i, len)) {
            memmove(s + j, s + i, len);
            j += len;
            i += len;
        }
        else {
            s[j++] = '?';
            i++;
        }
    }
    s[j] = '\0';
}

long long kp_proc_step_ms(const struct kp_proc *p)
{
    if (p->step0 < 0 || p->current_step <= p->step0) {
        return 0;
    }
    return (p->step_seen_ms - p->step_t0_ms) / (p->current_step - p->step0);
}

uint64_t kp_proc_run_id(const struct kp_proc *p)
{
    return p->cap != NULL ? p->cap->run_id : 0;
}

static int send_disarm(struct kp_proc *p)
{
    struct kp_captures *set = p->set;
    struct kp_wire_disarm d = { p->capture_id };

    return set->cfg.ops.send(set->cfg.ops.ud, p, KP_W_DISARM, &d, sizeof(d));
}

/* --- a rank's batcher --- */

/* The batcher's strings callback (ud: the process). */
static const char *proc_string(void *ud, uint32_t id, size_t *len)
{
    struct kp_proc *p = ud;

    return p->set->cfg.ops.string(p->set->cfg.ops.ud, p, id, len);
}

/* The batcher's emit callback (ud: the process): appends to the spool. A last batch without
 * rows (the batcher's count-only one after a refused last batch, or a window with nothing in
 * it) may use the spool's tail reserve: it carries the rank's final drop count into
 * ranks.records_dropped and marks the rank's data complete for collectord. */
static int emit_batch(void *ud, const uint8_t *buf, size_t len, size_t rows, bool last)
{
    struct kp_proc *p = ud;
    struct kp_agent_metrics *m = p->set->cfg.metrics;
    struct kp_capture *c = p->cap;
    uint64_t seq = 0;
    int rc = last && rows == 0 ? kp_spool_append_tail(p->set->cfg.spool, buf, len, &seq)
                               : kp_spool_append(p->set->cfg.spool, buf, len, &seq);

    if (rc != 0) {
        kp_metric_add(m->spool_full, 1);
        kp_metric_add(m->dropped_agent, (int64_t) rows);
        if (c != NULL) {
            struct cap_rank *r = &c->ranks[p->cap_idx];

            r->spool_rows += rows;
            if (r->spool_err == 0) {
                r->spool_err = rc;
            }
            if (r->spool_dropped++ == 0) {
                kp_log_error("spool full, batch dropped run=%" PRIu64 " rank=%d rows=%zu "
                             "err=\"%s\" (is collectord reachable? raise --spool-max-bytes)",
                             c->run_id, r->rank, rows, strerror(-rc));
            }
        }
        return rc;
    }
    kp_metric_add(m->spooled, 1);
    if (c != NULL && c->ranks[p->cap_idx].spooled++ == 0) {
        c->ranks[p->cap_idx].first_seq = seq;
    }
    if (last && c != NULL) {
        c->ranks[p->cap_idx].last_emitted = true;
        c->ranks[p->cap_idx].last_seq = seq;
    }
    kp_log_debug("batch spooled seq=%" PRIu64 " rows=%zu bytes=%zu last=%d", seq, rows, len,
                 (int) last);
    return 0;
}

/* Keeps the counters of a rank's batcher before it is destroyed (and while it lives). */
static void rank_note_batcher(struct cap_rank *r, const struct kp_batcher *b)
{
    struct kp_batcher_stats bs;

    kp_batcher_get_stats(b, &bs);
    r->records = bs.records_in;
    r->malformed = bs.malformed;
}

/* Ends r's batcher (if it has one), keeping its counters. */
static void rank_end_batcher(struct cap_rank *r)
{
    if (r->p != NULL && r->p->bat != NULL) {
        rank_note_batcher(r, r->p->bat);
        kp_batcher_destroy(r->p->bat);
        r->p->bat = NULL;
    }
}

static void rank_fail(struct kp_capture *c, size_t i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Marks rank slot i of c FAILED (once) with a reason and ends its batcher. */
static void rank_fail(struct kp_capture *c, size_t i, const char *fmt, ...)
{
    struct cap_rank *r = &c->ranks[i];
    va_list ap;

    if (r->state == RS_DONE || r->state == RS_FAILED) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
    r->state = RS_FAILED;
    kp_log_warn("capture rank failed run=%" PRIu64 " rank=%d pid=%u reason=\"%s\"", c->run_id,
                r->rank, r->pid, r->reason);
    if (r->p != NULL && r->p->bat != NULL) {
        /* keep what was captured: the decided rows and the final stats */
        kp_batcher_window_end(r->p->bat, NULL);
    }
    rank_end_batcher(r);
}

/* A rank is over (done or failed, its batcher gone): its process may join another capture
 * at once, while the capture keeps the rank's final state for the reports. */
static void rank_release(struct kp_capture *c, size_t i)
{
    struct cap_rank *r = &c->ranks[i];

    if (r->p != NULL && r->p->cap == c && r->p->cap_idx == i) {
        r->p->cap = NULL;
    }
    r->p = NULL;
}

/* The rank slot of p in its capture, or NULL when p is not capturing. */
static struct cap_rank *proc_rank(const struct kp_proc *p)
{
    return p->cap != NULL ? &p->cap->ranks[p->cap_idx] : NULL;
}

/* How long a begun window may take to end: --window-timeout, else a minute, stretched for
 * slow steps (twice the expected window, plus slack) and for long time windows. */
static long long window_budget_ms(const struct kp_captures *set, const struct kp_capture *c,
                                  const struct kp_proc *p)
{
    long long budget = KP_CAP_DEADLINE_MIN_MS, st_ms = kp_proc_step_ms(p);

    if (set->cfg.window_timeout_ms > 0) {
        return set->cfg.window_timeout_ms;
    }
    if (c->steps > 0 && st_ms > 0 && 2 * ((long long) c->steps + 5) * st_ms > budget) {
        budget = 2 * ((long long) c->steps + 5) * st_ms;
    }
    if (c->duration_ms > 0 && (long long) c->duration_ms + KP_CAP_DEADLINE_MIN_MS > budget) {
        budget = (long long) c->duration_ms + KP_CAP_DEADLINE_MIN_MS;
    }
    return budget;
}

void kp_proc_on_status(struct kp_proc *p, const struct kp_wire_status *st)
{
    struct cap_rank *r = proc_rank(p);

    if (r == NULL || st->capture_id != p->capture_id || p->capture_id == 0) {
        return;
    }
    if (p->bat != NULL) {
        kp_batcher_counters(p->bat, st->dropped, st->cupti_dropped, st->overhead_ns);
    }
    r->lib_dropped = st->dropped + st->cupti_dropped;
    if (st->state == KP_ST_FAILED) {
        rank_fail(p->cap, p->cap_idx, "%s",
                  st->reason[0] ? st->reason : "the library reported a failure");
    }
    else if (st->state >= KP_ST_CAPTURING && r->state == RS_ARMED) {
        r->state = RS_BEGUN;
    }
}

void kp_proc_on_records(struct kp_proc *p, const struct kp_wire_records *rh, const void *recs,
                        uint32_t count)
{
    if (p->bat == NULL) {
        /* no capture: nothing to do with them */
        kp_metric_add(p->set->cfg.metrics->dropped_agent, count);
        return;
    }
    kp_batcher_records(p->bat, rh->kind, rh->rec_size, recs, count);
}

void kp_proc_on_step(struct kp_proc *p, const struct kp_wire_step *st)
{
    if (p->bat != NULL) {
        kp_batcher_step(p->bat, st);
    }
}

static void window_begin(struct kp_proc *p, struct cap_rank *r, const struct kp_wire_window *w)
{
    kp_batcher_window_begin(p->bat, w);
    r->first_step = w->first_step;
    if (r->state == RS_ARMED) {
        r->state = RS_BEGUN;
        r->deadline_ms = kp_mono_ms() + window_budget_ms(p->set, p->cap, p);
    }
    kp_log_info("window begun run=%" PRIu64 " rank=%d first_step=%" PRId64, p->cap->run_id, r->rank,
                w->first_step);
}

static void window_end(struct kp_proc *p, struct cap_rank *r, const struct kp_wire_window *w)
{
    struct kp_agent_metrics *m = p->set->cfg.metrics;
    struct kp_batcher_stats bs;

    kp_batcher_window_end(p->bat, w);
    kp_batcher_get_stats(p->bat, &bs);
    kp_metric_add(m->invalid, (int64_t) bs.invalid);
    kp_metric_add(m->rec_malformed, (int64_t) bs.malformed);
    kp_metric_add(m->warmup, (int64_t) (bs.warmup + bs.after));
    kp_metric_add(m->dropped_lib, (int64_t) w->dropped);
    r->records = bs.records_in;
    r->malformed = bs.malformed;
    r->lib_dropped = w->dropped + w->cupti_dropped;
    r->first_step = w->first_step;
    r->last_step = w->last_step;
    kp_batcher_destroy(p->bat);
    p->bat = NULL;
    if (r->state != RS_FAILED && bs.invalid > 0) {
        r->state = RS_FAILED;
        snprintf(r->reason, sizeof(r->reason),
                 "kprof bug: %" PRIu64 " batches of this rank failed validation and were "
                 "dropped (the agent log names the column); please report it",
                 bs.invalid);
    }
    if (r->state != RS_FAILED) {
        r->state = RS_DONE;
    }
    kp_log_info("window ended run=%" PRIu64 " rank=%d steps=%" PRId64 "..%" PRId64
                " records_in=%" PRIu64 " kept=%" PRIu64 " warmup=%" PRIu64 " after=%" PRIu64
                " batches=%" PRIu64 " lib_dropped=%" PRIu64 " malformed=%" PRIu64,
                p->cap->run_id, r->rank, w->first_step, w->last_step, bs.records_in, bs.kept,
                bs.warmup, bs.after, bs.batches, w->dropped, bs.malformed);
}

void kp_proc_on_window(struct kp_proc *p, enum kp_wire_type type, const struct kp_wire_window *w)
{
    struct cap_rank *r = proc_rank(p);

    if (r == NULL || w->capture_id != p->capture_id || p->bat == NULL) {
        return; /* a capture that is over (deadline, disarm): ignore */
    }
    if (type == KP_W_WINDOW_BEGIN) {
        window_begin(p, r, w);
    }
    else {
        window_end(p, r, w);
    }
}

void kp_proc_tick(struct kp_proc *p, long long now)
{
    if (p->bat != NULL) {
        kp_batcher_tick(p->bat, now);
    }
}

void kp_proc_gone(struct kp_proc *p)
{
    struct kp_capture *c = p->cap;

    if (c != NULL) {
        struct cap_rank *r = &c->ranks[p->cap_idx];

        if (r->state == RS_BEGUN) {
            rank_fail(c, p->cap_idx,
                      "process %u (rank %d) exited or closed its connection during the window",
                      p->pid, r->rank);
        }
        else if (r->state == RS_ARMED) {
            rank_fail(c, p->cap_idx,
                      "process %u (rank %d) exited or closed its connection while armed, before "
                      "its window began",
                      p->pid, r->rank);
        }
        r->p = NULL;
        p->cap = NULL;
    }
    kp_batcher_destroy(p->bat);
    p->bat = NULL;
}

/* --- captures --- */

static void capture_free(struct kp_captures *set, struct kp_capture *c)
{
    struct kp_capture **pp = &set->caps;

    while (*pp != NULL && *pp != c) {
        pp = &(*pp)->next;
    }
    if (*pp == c) {
        *pp = c->next;
    }
    for (size_t i = 0; i < c->n; i++) {
        struct kp_proc *p = c->ranks[i].p;

        if (p != NULL && p->cap == c) {
            kp_batcher_destroy(p->bat);
            p->bat = NULL;
            p->cap = NULL;
        }
    }
    free(c->ranks);
    free(c);
}

void kp_captures_destroy(struct kp_captures *set)
{
    if (set == NULL) {
        return;
    }
    while (set->caps != NULL) {
        capture_free(set, set->caps);
    }
    free(set);
}

static struct kp_capture *capture_of_run(struct kp_captures *set, uint64_t run_id)
{
    for (struct kp_capture *c = set->caps; c != NULL; c = c->next) {
        if (c->run_id == run_id) {
            return c;
        }
    }
    return NULL;
}

/* How long rank r may take to begin its window: a minute, or more when the start step is
 * far ahead of the process's step at its observed rate. */
static long long arm_wait_ms(const struct kp_capture *c, const struct kp_proc *p)
{
    long long st_ms = kp_proc_step_ms(p), wait_ms = KP_CAP_DEADLINE_MIN_MS;

    if (st_ms > 0 && c->start_step >= 0) {
        long long steps =
            c->start_step - (p->current_step > 0 ? p->current_step : 0) + (long long) c->steps + 10;

        if (steps * st_ms > wait_ms) {
            wait_ms = steps * st_ms;
        }
    }
    return wait_ms;
}

/* Gives rank slot i of c a batcher and sends ARM to its process. */
static void rank_arm(struct kp_captures *set, struct kp_capture *c, size_t i, long long now)
{
    struct cap_rank *r = &c->ranks[i];
    struct kp_proc *p = r->p;
    struct kp_batcher_opts o;
    struct kp_wire_arm arm;
    long long wait_ms;
    int rc;

    r->first_step = -1;
    r->last_step = -1;
    if (p == NULL) {
        rank_fail(c, i, "process %u disconnected before the capture was armed", r->pid);
        return;
    }
    memset(&o, 0, sizeof(o));
    o.run_id = c->run_id;
    o.rank = (uint32_t) (r->rank >= 0 ? r->rank : 0);
    o.job = p->h.job;
    o.host = p->h.host[0] ? p->h.host : set->cfg.host;
    o.pid = p->pid;
    o.local_rank = (uint32_t) (p->h.local_rank >= 0 ? p->h.local_rank : 0);
    o.world_size = c->world_size;
    o.device = p->h.device;
    o.target_step = c->start_step;
    o.n_steps = c->steps;
    o.activities = c->activities;
    o.batch_rows = (size_t) set->cfg.batch_rows;
    o.batch_ms = set->cfg.batch_ms;
    o.strings = proc_string;
    o.emit = emit_batch;
    o.ud = p;
    if ((rc = kp_batcher_create(&o, &p->bat)) != 0) {
        rank_fail(c, i, "cannot start the batcher: %s", strerror(-rc));
        return;
    }
    wait_ms = arm_wait_ms(c, p);
    r->deadline_ms = now + wait_ms;
    p->capture_id = ++set->next_capture_id;
    memset(&arm, 0, sizeof(arm));
    arm.capture_id = p->capture_id;
    arm.run_id = c->run_id;
    arm.target_step = c->start_step;
    arm.n_steps = c->steps;
    arm.activities = c->activities;
    arm.duration_ms = c->duration_ms;
    arm.deadline_ns = (uint64_t) (kp_real_ns() + (int64_t) wait_ms * 1000000);
    if ((rc = set->cfg.ops.send(set->cfg.ops.ud, p, KP_W_ARM, &arm, sizeof(arm))) != 0) {
        rank_fail(c, i, "cannot send ARM to process %u: %s", p->pid, strerror(-rc));
        return;
    }
    kp_log_info("rank armed run=%" PRIu64 " rank=%d pid=%u start_step=%" PRId64
                " steps=%u duration_ms=%" PRIu64,
                c->run_id, r->rank, p->pid, c->start_step, c->steps, c->duration_ms);
}

/* Takes the next rank slot of c for rank `rank`: ARMED with its idle process, or FAILED with
 * the reason (not registered here, or busy in another capture). Returns the process's world
 * size, 0 when unknown. */
static uint32_t rank_select(struct kp_captures *set, struct kp_capture *c, int32_t rank,
                            long long now)
{
    struct cap_rank *r = &c->ranks[c->n];
    struct kp_proc *p = set->cfg.ops.find(set->cfg.ops.ud, c->job, rank);
    uint32_t world = 0;

    r->rank = rank;
    r->first_step = -1;
    r->last_step = -1;
    r->deadline_ms = now + KP_CAP_DEADLINE_MIN_MS;
    if (p == NULL) {
        r->state = RS_FAILED;
        snprintf(r->reason, sizeof(r->reason),
                 "rank %d of job %.100s is not registered on the agent on host %.100s (pid "
                 "gone?)",
                 rank, c->job, set->cfg.host);
    }
    else if (p->cap != NULL) {
        r->state = RS_FAILED;
        r->pid = p->pid;
        snprintf(r->reason, sizeof(r->reason), "rank %d is already capturing for run %" PRIu64,
                 rank, p->cap->run_id);
    }
    else {
        r->state = RS_ARMED;
        r->p = p;
        r->pid = p->pid;
        p->cap = c;
        p->cap_idx = c->n;
        if (p->h.world_size > 0) {
            world = (uint32_t) p->h.world_size;
        }
    }
    if (r->state == RS_FAILED) {
        kp_log_warn("capture rank failed run=%" PRIu64 " rank=%d pid=%u reason=\"%s\"", c->run_id,
                    r->rank, r->pid, r->reason);
    }
    c->n++;
    return world;
}

void kp_captures_arm(struct kp_captures *set, const Kprof__V1__CaptureCommand *cmd)
{
    long long now = kp_mono_ms();
    struct kp_capture *c;
    uint32_t world = 0;

    if (capture_of_run(set, cmd->run_id) != NULL) {
        /* collectord resends its arms after a reconnect */
        kp_log_info("capture command ignored: run %" PRIu64 " already has a capture here",
                    cmd->run_id);
        return;
    }
    if (cmd->run_id == 0 || cmd->n_ranks == 0) {
        kp_log_warn("capture command ignored: ARM without a run id or ranks run=%" PRIu64
                    " ranks=%zu",
                    cmd->run_id, cmd->n_ranks);
        return;
    }
    if ((c = calloc(1, sizeof(*c))) == NULL ||
        (c->ranks = calloc(cmd->n_ranks, sizeof(*c->ranks))) == NULL) {
        kp_log_error("capture command dropped: out of memory run=%" PRIu64, cmd->run_id);
        free(c);
        return;
    }
    c->run_id = cmd->run_id;
    kp_strlcpy(c->job, sizeof(c->job), cmd->job != NULL ? cmd->job : "");
    c->start_step = cmd->start_step >= 0 ? cmd->start_step : -1;
    c->steps = cmd->steps;
    c->duration_ms = cmd->duration_ms;
    c->activities = cmd->activities != 0 ? cmd->activities : KP_ACT_DEFAULT;
    if (c->steps == 0 && c->duration_ms == 0) {
        c->duration_ms = KP_CAP_DEFAULT_DURATION_MS; /* a window needs an end */
    }
    for (size_t k = 0; k < cmd->n_ranks; k++) {
        bool dup = false;

        for (size_t j = 0; j < c->n; j++) {
            dup |= c->ranks[j].rank == cmd->ranks[k];
        }
        if (!dup) {
            uint32_t w = rank_select(set, c, cmd->ranks[k], now);

            world = w > world ? w : world;
        }
    }
    c->world_size = cmd->world_size != 0 ? cmd->world_size : world != 0 ? world : (uint32_t) c->n;
    c->next = set->caps;
    set->caps = c;
    for (size_t i = 0; i < c->n; i++) {
        if (c->ranks[i].state == RS_ARMED) {
            rank_arm(set, c, i, now);
        }
    }
    kp_metric_add(set->cfg.metrics->captures, 1);
}

void kp_captures_stop(struct kp_captures *set, uint64_t run_id)
{
    struct kp_capture *c = capture_of_run(set, run_id);
    long long now = kp_mono_ms();

    if (c == NULL) {
        kp_log_info("capture command ignored: no capture of run %" PRIu64 " here", run_id);
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        struct cap_rank *r = &c->ranks[i];

        if (r->state == RS_ARMED) {
            if (r->p != NULL) {
                send_disarm(r->p);
            }
            rank_end_batcher(r);
            r->state = RS_DONE;
            r->stopped = true;
            snprintf(r->reason, sizeof(r->reason), "stopped before its window began");
        }
        else if (r->state == RS_BEGUN) {
            /* the library ends the window; WINDOW_END makes the rank done as usual */
            if (r->p != NULL) {
                send_disarm(r->p);
            }
            if (r->deadline_ms > now + KP_CAP_DEADLINE_MIN_MS) {
                r->deadline_ms = now + KP_CAP_DEADLINE_MIN_MS;
            }
        }
    }
}

void kp_captures_forget(struct kp_captures *set, uint64_t run_id)
{
    struct kp_capture *c = capture_of_run(set, run_id);

    if (c == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        struct cap_rank *r = &c->ranks[i];

        if (r->state == RS_ARMED || r->state == RS_BEGUN) {
            kp_log_warn("capture forgotten while rank %d still captures run=%" PRIu64
                        "; disarmed, its rows so far are kept",
                        r->rank, c->run_id);
            if (r->p != NULL) {
                send_disarm(r->p);
            }
        }
    }
    capture_free(set, c);
}

/* Fails rank slot i of c when its deadline passed: it never began its window, or never
 * ended it. The library is told to stop (DISARM). */
static void rank_check_deadline(struct kp_capture *c, size_t i, long long now)
{
    struct cap_rank *r = &c->ranks[i];
    int64_t step = r->p != NULL ? r->p->current_step : -1;

    if (now < r->deadline_ms || (r->state != RS_ARMED && r->state != RS_BEGUN)) {
        return;
    }
    if (r->state == RS_ARMED) {
        rank_fail(c, i,
                  "rank %d did not begin its window (step %" PRId64
                  ") in time: current step %" PRId64
                  "; is the training loop running and is the kprof step hook active?",
                  r->rank, c->start_step, step);
    }
    else {
        rank_fail(c, i,
                  "rank %d began its window (step %" PRId64 ") but did not end it in time (now at "
                  "step %" PRId64 "): the training loop may be stuck or the process too busy to "
                  "drain; the rows received so far are kept",
                  r->rank, c->start_step, step);
    }
    if (r->p != NULL) {
        send_disarm(r->p);
    }
}

/* Deadlines of c's ranks; c is finished once every rank is over and acknowledged. */
static void capture_check(struct kp_capture *c, long long now, uint64_t acked)
{
    bool over = true, failed = false;

    if (c->finished_ms != 0) {
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        struct cap_rank *r = &c->ranks[i];

        rank_check_deadline(c, i, now);
        if (r->state == RS_ARMED || r->state == RS_BEGUN) {
            over = false;
            continue;
        }
        if (r->last_emitted && r->last_seq > acked) {
            over = false; /* not yet acknowledged by collectord */
        }
        rank_release(c, i);
    }
    if (!over) {
        return;
    }
    /* kept, so that reports keep telling the ranks' final states, until collectord forgets it
     * (or captures_expire) */
    for (size_t i = 0; i < c->n; i++) {
        /* a rank whose last batch the spool refused is reported FAILED too */
        failed |=
            c->ranks[i].state == RS_FAILED || (!c->ranks[i].stopped && !c->ranks[i].last_emitted);
    }
    c->finished_ms = now;
    kp_log_info("capture complete run=%" PRIu64 " ranks=%zu failed=%d", c->run_id, c->n,
                (int) failed);
}

/* Frees the captures finished more than KP_CAP_FINISHED_KEEP_MS ago, and the oldest finished
 * ones beyond KP_CAP_MAX_FINISHED. */
static void captures_expire(struct kp_captures *set, long long now)
{
    size_t n = 0;

    for (struct kp_capture *c = set->caps, *next; c != NULL; c = next) {
        next = c->next;
        if (c->finished_ms == 0) {
            continue;
        }
        if (now - c->finished_ms >= KP_CAP_FINISHED_KEEP_MS) {
            kp_log_info("capture state dropped run=%" PRIu64 " (finished %lld s ago)", c->run_id,
                        (now - c->finished_ms) / 1000);
            capture_free(set, c);
            continue;
        }
        n++;
    }
    while (n > KP_CAP_MAX_FINISHED) {
        struct kp_capture *oldest = NULL;

        for (struct kp_capture *c = set->caps; c != NULL; c = c->next) {
            if (c->finished_ms != 0 && (oldest == NULL || c->finished_ms < oldest->finished_ms)) {
                oldest = c;
            }
        }
        capture_free(set, oldest);
        n--;
    }
}

void kp_captures_tick(struct kp_captures *set, long long now, uint64_t acked)
{
    for (struct kp_capture *c = set->caps; c != NULL; c = c->next) {
        capture_check(c, now, acked);
    }
    captures_expire(set, now);
}

/* --- reports --- */

static const char *rank_state_name(Kprof__V1__RankState st)
{
    switch (st) {
    case KPROF__V1__RANK_STATE__RANK_STATE_PENDING:
        return "PENDING";
    case KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING:
        return "CAPTURING";
    case KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING:
        return "FLUSHING";
    case KPROF__V1__RANK_STATE__RANK_STATE_DONE:
        return "DONE";
    case KPROF__V1__RANK_STATE__RANK_STATE_FAILED:
        return "FAILED";
    default:
        return "UNSPECIFIED";
    }
}

/* The state of a rank as reported to collectord; reason (len bytes) gets the text for FAILED
 * and DONE-with-a-note, else "". */
static Kprof__V1__RankState rank_report_state(const struct cap_rank *r, uint64_t acked,
                                              char *reason, size_t len)
{
    reason[0] = '\0';
    switch (r->state) {
    case RS_ARMED:
        return KPROF__V1__RANK_STATE__RANK_STATE_PENDING;
    case RS_BEGUN:
        return KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING;
    case RS_FAILED:
        snprintf(reason, len, "%s", r->reason);
        return KPROF__V1__RANK_STATE__RANK_STATE_FAILED;
    case RS_DONE:
        break;
    }
    if (r->stopped) {
        snprintf(reason, len, "%s", r->reason);
        return KPROF__V1__RANK_STATE__RANK_STATE_DONE;
    }
    if (!r->last_emitted) {
        /* its last batch never reached the spool: nothing will ever make it DONE */
        if (r->spool_dropped > 0) {
            snprintf(reason, len,
                     "%" PRIu64 " batches (%" PRIu64 " records) of this rank, the last one "
                     "included, were dropped because the agent's spool refused them (%s): is "
                     "collectord reachable? raise --spool-max-bytes",
                     r->spool_dropped, r->spool_rows, strerror(-r->spool_err));
        }
        else {
            snprintf(reason, len, "the last batch of this rank was not stored (see the agent log)");
        }
        return KPROF__V1__RANK_STATE__RANK_STATE_FAILED;
    }
    if (r->spool_dropped > 0) {
        snprintf(reason, len,
                 "%" PRIu64 " batches (%" PRIu64 " records) dropped: the agent's spool refused "
                 "them (raise --spool-max-bytes)",
                 r->spool_dropped, r->spool_rows);
    }
    if (r->last_seq > acked) {
        return KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING;
    }
    return KPROF__V1__RANK_STATE__RANK_STATE_DONE;
}

size_t kp_captures_count_ranks(const struct kp_captures *set)
{
    size_t n = 0;

    for (const struct kp_capture *c = set->caps; c != NULL; c = c->next) {
        n += c->n;
    }
    return n;
}

size_t kp_captures_report(struct kp_captures *set, uint64_t acked,
                          Kprof__V1__AgentCaptureRank *ranks, char *reasons, size_t reason_len,
                          size_t max)
{
    size_t nr = 0;

    for (struct kp_capture *c = set->caps; c != NULL; c = c->next) {
        for (size_t i = 0; i < c->n && nr < max; i++) {
            struct cap_rank *r = &c->ranks[i];
            Kprof__V1__AgentCaptureRank *q = &ranks[nr];
            char *reason = reasons + nr * reason_len;

            kprof__v1__agent_capture_rank__init(q);
            q->run_id = c->run_id;
            q->rank = r->rank;
            q->pid = r->pid;
            q->state = rank_report_state(r, acked, reason, reason_len);
            kp_proc_clean_text(reason);
            q->reason = reason;
            if (r->p != NULL && r->p->cap == c && r->p->bat != NULL) {
                rank_note_batcher(r, r->p->bat);
            }
            q->records = r->records;
            q->dropped = r->lib_dropped + r->malformed + r->spool_rows;
            q->first_step = r->first_step;
            q->last_step = r->last_step;
            if (q->state == KPROF__V1__RANK_STATE__RANK_STATE_DONE && r->last_emitted &&
                r->spooled > 0) {
                /* collectord calls the rank DONE once these are stored in PostgreSQL */
                kprof__v1__stream_mark__init(&r->mark);
                r->mark.rank = r->rank;
                r->mark.stream = kp_spool_stream_id(set->cfg.spool);
                r->mark.first_seq = r->first_seq;
                r->mark.last_seq = r->last_seq;
                r->mark.count = r->spooled;
                q->mark = &r->mark;
            }
            if ((int) q->state != r->reported) {
                r->reported = (int) q->state;
                kp_log_info("capture rank state run=%" PRIu64 " rank=%d pid=%u state=%s "
                            "records=%" PRIu64 " dropped=%" PRIu64 " steps=%" PRId64 "..%" PRId64
                            " reason=\"%s\"",
                            c->run_id, r->rank, r->pid, rank_state_name(q->state), q->records,
                            q->dropped, q->first_step, q->last_step, q->reason);
            }
            nr++;
        }
    }
    return nr;
}
