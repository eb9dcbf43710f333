/*
 * The agent's uplink to collectord: see uplink.h.
 */
#define _GNU_SOURCE
#define KP_LOG_MODULE "agent"
#include "uplink.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attach.h"
#include "capture.h"
#include "kp_clock.h"
#include "kp_log.h"
#include "kp_push.h"
#include "kp_rpc.h"
#include "kprof.pb-c.h"
#include "metrics.h"
#include "session.h"
#include "spool.h"

#define KP_UPLINK_PUSH_WINDOW   32
#define KP_UPLINK_CRED_RETRY_MS 5000 /* a refused credential is tried again this much later */
/* A rank's reason in a report: its own text and the notes the report adds. */
#define KP_UPLINK_REASON_BYTES 500

struct kp_uplink {
    struct kp_uplink_config cfg;
    struct kp_attach *att; /* NULL without attach */
    long long report_ms;   /* CLOCK_MONOTONIC of the last publish */
    uint8_t *report_key;   /* the last published report packed with step ages zeroed */
    size_t report_key_len;
    pthread_t thread;
    bool started;
    _Atomic bool stopping;
    _Atomic uint64_t acked_through; /* every spool seq <= this is acknowledged */
};

/* --- data: the spool to Ingest.Push --- */

/* Acknowledges in the spool what the push has acknowledged since the last call. */
static void note_acked(struct kp_uplink *up, struct kp_push *push)
{
    uint64_t acked = kp_push_acked_through(push);

    if (acked > 1 && acked - 1 > atomic_load(&up->acked_through)) {
        uint64_t before = atomic_load(&up->acked_through);

        kp_spool_ack_through(up->cfg.spool, acked - 1);
        atomic_store(&up->acked_through, acked - 1);
        kp_metric_add(up->cfg.metrics->acked, (int64_t) (acked - 1 - before));
    }
}

/* collectord refused the first unacknowledged batch for good: it is logged (once per run of
 * refusals), counted and acknowledged, so the stream goes on after it. */
static void drop_refused(struct kp_uplink *up, struct kp_push *push, bool *logged)
{
    struct kp_spool *sp = up->cfg.spool;
    struct kp_rpc_status st;
    uint64_t first = kp_spool_first_unacked(sp);

    kp_push_error(push, &st);
    if (!*logged) {
        kp_log_error("collectord refused a batch; it is dropped stream=%" PRIu64 " seq=%" PRIu64
                     " status=%s details=\"%s\"",
                     kp_spool_stream_id(sp), first, kp_rpc_status_name(st.code), st.details);
        *logged = true;
    }
    kp_metric_add(up->cfg.metrics->terminal, 1);
    kp_spool_ack_through(sp, first);
    atomic_store(&up->acked_through, first);
}

/* Whether the push failed because collectord refused this agent's credential
 * (UNAUTHENTICATED, PERMISSION_DENIED): a wrong, expired or rotated-out token or certificate,
 * which says nothing about the batches. Logged once per run of refusals. */
static bool credential_refused(struct kp_uplink *up, struct kp_push *push, bool *logged)
{
    struct kp_rpc_status st;

    kp_push_error(push, &st);
    if (st.code != GRPC_STATUS_UNAUTHENTICATED && st.code != GRPC_STATUS_PERMISSION_DENIED) {
        *logged = false;
        return false;
    }
    if (!*logged) {
        kp_log_error("collectord at %s refuses this agent's credential status=%s details=\"%s\"; "
                     "the batches stay in the spool: put an agent token whose NAME is this node "
                     "in the --token-file (read again when it changes, no restart needed), or "
                     "give --tls-cert with urn:kprof:agent:NODE and restart the agent",
                     up->cfg.collector, kp_rpc_status_name(st.code), st.details);
        *logged = true;
    }
    return true;
}

static void *uplink_main(void *arg)
{
    struct kp_uplink *up = arg;
    struct kp_spool *sp = up->cfg.spool;
    struct kp_push *push = NULL;
    struct kp_push_opts po;
    uint64_t push_next = 0;
    bool terminal_logged = false, cred_logged = false;

    memset(&po, 0, sizeof(po));
    po.give_up_after_ms = 0; /* retry forever; the spool absorbs the rest */
    po.reconnect_max_ms = 2000;
    po.window = KP_UPLINK_PUSH_WINDOW;
    po.window_bytes = (size_t) 1 << 40; /* bounded by the batch count */
    while (!atomic_load(&up->stopping)) {
        struct kp_push_stats ps;
        uint8_t *buf = NULL;
        size_t len = 0;
        uint64_t seq = 0;
        int rc;

        if (push == NULL) {
            po.first_seq = kp_spool_first_unacked(sp);
            if (kp_push_create(up->cfg.ch, kp_spool_stream_id(sp), &po, &push) != 0) {
                kp_spool_wait(sp, 1000);
                continue;
            }
            push_next = po.first_seq;
            kp_spool_rewind(sp);
        }
        note_acked(up, push);
        if (kp_push_error(push, NULL) != 0 && credential_refused(up, push, &cred_logged)) {
            /* not the batch's fault: it stays spooled for when the credential is fixed */
            kp_push_destroy(push);
            push = NULL;
            for (int i = 0; i < KP_UPLINK_CRED_RETRY_MS / 100 && !atomic_load(&up->stopping); i++) {
                struct timespec ts = { 0, 100 * 1000000L };

                nanosleep(&ts, NULL);
            }
            continue;
        }
        if (kp_push_error(push, NULL) != 0) {
            drop_refused(up, push, &terminal_logged);
            kp_push_destroy(push);
            push = NULL;
            continue;
        }
        kp_push_get_stats(push, &ps);
        if (ps.inflight >= KP_UPLINK_PUSH_WINDOW) {
            /* the window is full (collectord slow or away): wait here rather than block in
             * kp_push_send_encoded, so that stopping stays prompt */
            kp_spool_wait(sp, 20);
            continue;
        }
        rc = kp_spool_read(sp, &seq, &buf, &len);
        if (rc == 0) {
            kp_spool_wait(sp, 20);
            continue;
        }
        if (rc < 0) {
            kp_log_warn("unreadable spool record skipped err=\"%s\"", strerror(-rc));
            continue;
        }
        if (seq != push_next) {
            /* a gap (records lost to a corrupt segment): start a push at this seq */
            kp_push_flush(push, 60000);
            kp_push_destroy(push);
            po.first_seq = seq;
            if (kp_push_create(up->cfg.ch, kp_spool_stream_id(sp), &po, &push) != 0) {
                push = NULL;
                free(buf);
                continue;
            }
            push_next = seq;
        }
        rc = kp_push_send_encoded(push, buf, len, NULL); /* blocks while the window is full */
        free(buf);
        if (rc == 0) {
            push_next++;
            terminal_logged = false;
        }
    }
    kp_push_destroy(push);
    return NULL;
}

uint64_t kp_uplink_acked(struct kp_uplink *up)
{
    return atomic_load(&up->acked_through);
}

/* --- control: collectord's commands --- */

static const char *cmd_kind_name(int kind)
{
    switch (kind) {
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM:
        return "ARM";
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP:
        return "STOP";
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET:
        return "FORGET";
    default:
        return "UNKNOWN";
    }
}

static void cmd_log(const Kprof__V1__CaptureCommand *cmd)
{
    char ranks[256];
    size_t off = 0;

    ranks[0] = '\0';
    for (size_t i = 0; i < cmd->n_ranks; i++) {
        int n = snprintf(ranks + off, sizeof(ranks) - off, "%s%d", i ? "," : "", cmd->ranks[i]);

        if (n < 0 || (size_t) n >= sizeof(ranks) - off) {
            snprintf(ranks + (off < sizeof(ranks) - 8 ? off : sizeof(ranks) - 8), 8, ",...");
            break;
        }
        off += (size_t) n;
    }
    switch (cmd->kind) {
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM:
        kp_log_info("capture command kind=ARM run=%" PRIu64 " job=%s ranks=%s start_step=%" PRId64
                    " steps=%u duration_ms=%" PRIu64 " activities=0x%x world_size=%u",
                    cmd->run_id, cmd->job != NULL ? cmd->job : "", ranks[0] ? ranks : "-",
                    cmd->start_step, cmd->steps, cmd->duration_ms, cmd->activities,
                    cmd->world_size);
        break;
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP:
        kp_log_info("capture command kind=STOP run=%" PRIu64 " reason=\"%s\"", cmd->run_id,
                    cmd->reason != NULL ? cmd->reason : "");
        break;
    default:
        kp_log_info("capture command kind=%s run=%" PRIu64, cmd_kind_name(cmd->kind), cmd->run_id);
        break;
    }
}

static void cmd_apply(struct kp_uplink *up, const Kprof__V1__CaptureCommand *cmd)
{
    cmd_log(cmd);
    switch (cmd->kind) {
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM:
        kp_captures_arm(up->cfg.captures, cmd);
        break;
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP:
        kp_captures_stop(up->cfg.captures, cmd->run_id); /* the reason is in the log line */
        break;
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET:
        kp_captures_forget(up->cfg.captures, cmd->run_id);
        break;
    default:
        kp_log_warn("capture command of unknown kind %d ignored run=%" PRIu64
                    " (a newer collectord?)",
                    (int) cmd->kind, cmd->run_id);
        break;
    }
}

static void report_update(struct kp_uplink *up, long long now);

void kp_uplink_commands(struct kp_uplink *up)
{
    Kprof__V1__CaptureCommand *cmd;
    bool any = false;

    if (up->att == NULL) {
        return;
    }
    while ((cmd = kp_attach_take(up->att)) != NULL) {
        cmd_apply(up, cmd);
        protobuf_c_message_free_unpacked(&cmd->base, NULL);
        any = true;
    }
    if (any) {
        report_update(up, kp_mono_ms()); /* the ranks' new states go out at once */
    }
}

/* --- control: the report --- */

/* Packs m into a fresh buffer (*out, free). Returns its length, or 0 and *out NULL. */
static size_t pack_alloc(const ProtobufCMessage *m, uint8_t **out)
{
    size_t n = protobuf_c_message_get_packed_size(m);

    if ((*out = malloc(n > 0 ? n : 1)) == NULL) {
        return 0;
    }
    return protobuf_c_message_pack(m, *out);
}

/* Publishes rep unless it equals the last published one but for the step ages (ages[i]
 * goes into process i only after that comparison) and the last publish is recent. */
static void report_publish(struct kp_uplink *up, Kprof__V1__AgentReport *rep, const uint32_t *ages,
                           long long now)
{
    uint8_t *key = NULL, *full = NULL;
    size_t key_len, full_len;

    /* what changed is judged without the step ages, which move on every tick */
    if ((key_len = pack_alloc(&rep->base, &key)) == 0 && key == NULL) {
        goto out;
    }
    if (up->report_key != NULL && key_len == up->report_key_len &&
        memcmp(key, up->report_key, key_len) == 0 && now - up->report_ms < KP_UPLINK_REPORT_MS) {
        goto out;
    }
    for (size_t i = 0; i < rep->n_processes; i++) {
        rep->processes[i]->step_age_ms = ages[i];
    }
    if ((full_len = pack_alloc(&rep->base, &full)) == 0 && full == NULL) {
        goto out;
    }
    if (kp_attach_publish(up->att, full, full_len) != 0) {
        goto out;
    }
    free(up->report_key);
    up->report_key = key;
    up->report_key_len = key_len;
    key = NULL;
    up->report_ms = now;
out:
    free(full);
    free(key);
}

/* Builds the AgentReport (every registered process, every capture's ranks) and publishes it
 * when due. On out of memory the next tick tries again. */
static void report_update(struct kp_uplink *up, long long now)
{
    Kprof__V1__AgentReport rep = KPROF__V1__AGENT_REPORT__INIT;
    Kprof__V1__AgentProcess *procs = NULL, **pp = NULL;
    Kprof__V1__AgentCaptureRank *ranks = NULL, **rp = NULL;
    char *reasons = NULL;
    uint32_t *ages = NULL;
    size_t np, nr;

    if (up->att == NULL) {
        return;
    }
    np = kp_sessions_count(up->cfg.sessions);
    nr = kp_captures_count_ranks(up->cfg.captures);
    if ((np > 0 &&
         ((procs = calloc(np, sizeof(*procs))) == NULL || (pp = calloc(np, sizeof(*pp))) == NULL ||
          (ages = calloc(np, sizeof(*ages))) == NULL)) ||
        (nr > 0 &&
         ((ranks = calloc(nr, sizeof(*ranks))) == NULL || (rp = calloc(nr, sizeof(*rp))) == NULL ||
          (reasons = calloc(nr, KP_UPLINK_REASON_BYTES)) == NULL))) {
        goto out;
    }
    rep.host = (char *) up->cfg.host;
    rep.agent_id = up->cfg.agent_id;
    rep.version = (char *) KPROF_VERSION;
    np = kp_sessions_report(up->cfg.sessions, now, procs, ages, np);
    for (size_t i = 0; i < np; i++) {
        pp[i] = &procs[i];
    }
    rep.n_processes = np;
    rep.processes = pp;
    nr = kp_captures_report(up->cfg.captures, kp_uplink_acked(up), ranks, reasons,
                            KP_UPLINK_REASON_BYTES, nr);
    for (size_t i = 0; i < nr; i++) {
        rp[i] = &ranks[i];
    }
    rep.n_ranks = nr;
    rep.ranks = rp;
    report_publish(up, &rep, ages, now);
out:
    free(reasons);
    free(rp);
    free(ranks);
    free(ages);
    free(pp);
    free(procs);
}

void kp_uplink_tick(struct kp_uplink *up, long long now)
{
    struct kp_agent_metrics *m = up->cfg.metrics;
    struct kp_attach_stats as;

    report_update(up, now);
    if (up->att == NULL) {
        return;
    }
    kp_attach_get_stats(up->att, &as);
    kp_metric_set(m->attached, as.attached ? 1 : 0);
    kp_metric_set(m->commands, (int64_t) as.commands_received);
    kp_metric_set(m->commands_dropped, (int64_t) (as.commands_dropped + as.commands_bad));
    kp_metric_set(m->reports, (int64_t) as.reports_sent);
}

/* --- lifecycle --- */

int kp_uplink_create(const struct kp_uplink_config *cfg, struct kp_uplink **out, char *errbuf,
                     size_t errlen)
{
    struct kp_uplink *up = calloc(1, sizeof(*up));
    struct kp_spool_stats ss;
    int rc;

    *out = NULL;
    if (up == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    up->cfg = *cfg;
    kp_spool_get_stats(cfg->spool, &ss);
    atomic_store(&up->acked_through, ss.acked);
    if (pthread_create(&up->thread, NULL, uplink_main, up) != 0) {
        snprintf(errbuf, errlen, "cannot start the uplink thread");
        rc = -EAGAIN;
        goto fail;
    }
    up->started = true;
    if (cfg->attach) {
        struct kp_attach_opts ao;

        memset(&ao, 0, sizeof(ao));
        ao.ch = cfg->ch;
        ao.chopts = cfg->chopts;
        ao.target = cfg->collector;
        ao.wake_fd = cfg->wake_fd;
        if ((rc = kp_attach_create(&ao, &up->att)) != 0) {
            snprintf(errbuf, errlen, "cannot start the attach thread: %s", strerror(-rc));
            goto fail;
        }
    }
    *out = up;
    return 0;
fail:
    kp_uplink_destroy(up);
    return rc;
}

void kp_uplink_destroy(struct kp_uplink *up)
{
    if (up == NULL) {
        return;
    }
    atomic_store(&up->stopping, true);
    kp_attach_destroy(up->att);
    if (up->started) {
        kp_spool_wake(up->cfg.spool);
        pthread_join(up->thread, NULL);
    }
    free(up->report_key);
    free(up);
}
