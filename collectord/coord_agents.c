/*
 * The agents' side of the capture coordinator (coord.h): their Control.Attach calls, the
 * reports they send on them (checked, then applied to the captures' ranks) and
 * kp_coord_feed_report, which plays an agent for tests and fuzzing.
 */
#define KP_LOG_MODULE "coord"
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "coord_int.h"
#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"
#include "store.h"

/* ---- Attach ---- */

static bool report_valid(const Kprof__V1__AgentReport *r, char *why, size_t len)
{
    if (!kp__coord_text_ok(r->host, KP_COORD_MAX_TEXT) ||
        !kp__coord_text_ok(r->version, KP_COORD_MAX_TEXT)) {
        snprintf(why, len, "AgentReport.host or .version is not UTF-8 of at most %d bytes",
                 KP_COORD_MAX_TEXT);
        return false;
    }
    if (r->agent_id == 0) {
        snprintf(why, len, "AgentReport.agent_id must not be 0");
        return false;
    }
    if (r->n_processes > KP_COORD_MAX_PROCESSES || r->n_ranks > KP_COORD_MAX_RANKS) {
        snprintf(why, len, "AgentReport has too many processes (%zu) or ranks (%zu)",
                 r->n_processes, r->n_ranks);
        return false;
    }
    for (size_t i = 0; i < r->n_processes; i++) {
        const Kprof__V1__AgentProcess *p = r->processes[i];

        if (!kp__coord_text_ok(p->job, KP_COORD_MAX_TEXT)) {
            snprintf(why, len, "processes[%zu].job is not UTF-8 of at most %d bytes", i,
                     KP_COORD_MAX_TEXT);
            return false;
        }
        if (p->world_size > KP_STORE_MAX_WORLD_SIZE || p->rank >= KP_STORE_MAX_WORLD_SIZE) {
            snprintf(why, len, "processes[%zu]: rank %d or world size %u out of range", i, p->rank,
                     p->world_size);
            return false;
        }
    }
    for (size_t i = 0; i < r->n_ranks; i++) {
        const Kprof__V1__AgentCaptureRank *q = r->ranks[i];

        if (!kp__coord_text_ok(q->reason, KP_COORD_MAX_REASON)) {
            snprintf(why, len, "ranks[%zu].reason is not UTF-8 of at most %d bytes", i,
                     KP_COORD_MAX_REASON);
            return false;
        }
        if (q->state < ST_PENDING || q->state > ST_FAILED) {
            snprintf(why, len, "ranks[%zu].state %d is not a RankState", i, (int) q->state);
            return false;
        }
        if (q->mark != NULL &&
            (q->mark->rank != q->rank || q->mark->stream == 0 || q->mark->stream > INT64_MAX ||
             q->mark->last_seq > INT64_MAX || q->mark->first_seq > q->mark->last_seq ||
             q->mark->count == 0 || q->mark->count > q->mark->last_seq - q->mark->first_seq + 1)) {
            snprintf(why, len,
                     "ranks[%zu].mark is not the rank's (rank %d, stream 1..2^63-1, first_seq <= "
                     "last_seq < 2^63, 0 < count <= last_seq - first_seq + 1)",
                     i, q->rank);
            return false;
        }
    }
    return true;
}

/* Takes in the rank states of a's report (mu held). */
static void apply_report(struct kp_coord *c, struct agent *a)
{
    const Kprof__V1__AgentReport *rep = a->report;
    long long now = kp_mono_ms();
    size_t foreign = 0;

    for (size_t i = 0; i < rep->n_ranks; i++) {
        const Kprof__V1__AgentCaptureRank *q = rep->ranks[i];
        struct cap *k = kp__coord_cap_by_run(c, q->run_id);
        bool hosts = false;
        int st;

        if (k == NULL || k->ended) {
            continue;
        }
        for (size_t j = 0; j < k->n; j++) {
            struct crank *r = &k->ranks[j];

            /* an adopted capture's rank goes to the agent of its host that reports it first */
            if (k->adopted && r->agent_id == 0 && r->rank == q->rank &&
                strcmp(r->host, a->host) == 0) {
                r->agent_id = a->id;
                kp__coord_copy_text(r->agent_by, sizeof(r->agent_by), a->principal);
                kp_log_info("capture rank reattached run=%" PRIu64 " rank=%d host=%s", k->run_id,
                            r->rank, r->host);
            }
            /* only the agent the rank was armed on, attached by the same identity */
            if (r->rank != q->rank || r->agent_id != a->id ||
                (a->authenticated && strcmp(r->agent_by, a->principal) != 0)) {
                continue;
            }
            hosts = true;
            if (kp__coord_terminal(r->state) || (int) q->state < r->state) {
                break; /* final already, or an older picture */
            }
            st = (int) q->state;
            if (st == ST_DONE && q->mark != NULL && !r->stored) {
                /* acknowledged is not stored behind Kafka: FLUSHING until the tick finds the
                 * marked batches in ingest_batches (kp_coord_tick) */
                r->awaiting = true;
                r->mark_stream = q->mark->stream;
                r->mark_first = q->mark->first_seq;
                r->mark_last = q->mark->last_seq;
                r->mark_count = q->mark->count;
                st = ST_FLUSHING;
            }
            if (st != r->state) {
                kp_log_info("capture rank run=%" PRIu64 " rank=%d host=%s state=%s%s%s%s",
                            k->run_id, r->rank, r->host, kp__coord_state_name(st),
                            st != (int) q->state ? " (acknowledged; waiting to be stored)" : "",
                            q->reason[0] ? " reason=" : "", q->reason);
            }
            r->state = st;
            r->records = q->records;
            r->dropped = q->dropped;
            if (q->pid != 0) {
                r->pid = q->pid;
            }
            r->first_step = q->first_step;
            r->last_step = q->last_step;
            kp__coord_copy_text(r->reason, sizeof(r->reason), q->reason);
            break;
        }
        foreign += !hosts;
    }
    if (foreign > 0) {
        /* ignored: the capture's result comes only from the agents its ranks were armed on */
        c->stats.foreign_reports += foreign;
        if (!a->foreign_logged) {
            kp_log_warn("agent reported the state of %zu rank(s) it does not host; ignored host=%s "
                        "agent_id=%016" PRIx64 " identity=%s peer=%s",
                        foreign, a->host, a->id, a->principal, a->peer);
            a->foreign_logged = true;
        }
    }
    /* ARMs that may not have arrived (the call broke before they went out): again */
    for (struct cap *k = c->caps; k != NULL; k = k->next) {
        bool want = false;

        if (k->ended || k->run_id == 0) {
            continue;
        }
        for (size_t j = 0; j < k->n && !want; j++) {
            struct crank *r = &k->ranks[j];

            if (r->agent_id != a->id || r->state != ST_PENDING ||
                now - r->armed_ms < KP_COORD_REARM_MS) {
                continue;
            }
            want = true;
            for (size_t i = 0; i < rep->n_ranks; i++) {
                if (rep->ranks[i]->run_id == k->run_id && rep->ranks[i]->rank == r->rank) {
                    want = false; /* it knows */
                    break;
                }
            }
        }
        if (want) {
            kp__coord_send_arm(c, k, a, false);
        }
    }
}

static void *att_open(struct kp_rpc_call *call, void *ud)
{
    struct kp_coord *c = ud;
    struct agent *a = calloc(1, sizeof(*a));

    if (a == NULL) {
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        return NULL;
    }
    kp_rpc_call_ref(call);
    a->coord = c;
    a->call = call;
    kp__coord_copy_text(a->peer, sizeof(a->peer), kp_rpc_call_peer(call));
    kp_store_principal(kp_rpc_call_identity(call), a->principal, sizeof(a->principal));
    a->authenticated = kp_rpc_call_identity(call)->role != KP_ROLES_ALL;
    pthread_mutex_lock(&c->mu);
    /* checked with the agent going in under one lock: a step-down ends every call it lists */
    while (!c->active) {
        pthread_mutex_unlock(&c->mu);
        if (kp_coord_refuse(c, call)) {
            kp_rpc_call_unref(call);
            free(a);
            return NULL;
        }
        pthread_mutex_lock(&c->mu);
    }
    a->next = c->agents;
    c->agents = a;
    pthread_mutex_unlock(&c->mu);
    kp_log_debug("attach call opened peer=%s", a->peer);
    return a;
}

/* Whether a (attached by an authenticated identity) may send rep: its host must be the
 * identity's NAME (unless NAME is "*", a token shared by every node), and its agent_id not one
 * that another identity attached first or holds ranks of an open capture under. Returns true,
 * or false with the reason in why. mu held. */
static bool report_allowed(struct kp_coord *c, const struct agent *a,
                           const Kprof__V1__AgentReport *rep, char *why, size_t len)
{
    const char *name;

    if (!a->authenticated) {
        return true;
    }
    name = strchr(a->principal, ':') + 1; /* "agent:NAME" (kp_store_principal) */
    if (strcmp(name, "*") != 0 && strcmp(rep->host, name) != 0) {
        snprintf(why, len,
                 "the agent identity %s speaks for host %s only, not for host %s; give each node "
                 "a token or certificate of its own name (docs/design.md, Authorization)",
                 name, name, rep->host);
        return false;
    }
    if (a->id != 0) {
        return true; /* checked at the first report; a change of id is refused below */
    }
    for (const struct agent *o = c->agents; o != NULL; o = o->next) {
        if (o != a && !o->local && o->id == rep->agent_id &&
            strcmp(o->principal, a->principal) != 0) {
            snprintf(why, len,
                     "agent_id %016" PRIx64 " is attached by another identity; an agent id "
                     "belongs to the identity that attached it first",
                     rep->agent_id);
            return false;
        }
    }
    for (const struct cap *k = c->caps; k != NULL; k = k->next) {
        for (size_t j = 0; j < k->n && !k->ended; j++) {
            if (k->ranks[j].agent_id == rep->agent_id &&
                strcmp(k->ranks[j].agent_by, a->principal) != 0) {
                snprintf(why, len,
                         "agent_id %016" PRIx64 " hosts ranks of capture run %" PRIu64
                         " for another identity",
                         rep->agent_id, k->run_id);
                return false;
            }
        }
    }
    return true;
}

static enum kp_rpc_next att_message(struct kp_rpc_call *call, ProtobufCMessage *msg,
                                    size_t wire_bytes, void *state)
{
    struct agent *a = state;
    struct kp_coord *c;
    Kprof__V1__AgentReport *rep = (Kprof__V1__AgentReport *) msg;
    char why[800];

    (void) wire_bytes;
    if (a == NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
        return KP_RPC_STOP;
    }
    c = a->coord;
    if (!report_valid(rep, why, sizeof(why))) {
        if (!a->invalid_logged) {
            kp_log_warn("agent report refused peer=%s err=\"%s\"", a->peer, why);
            a->invalid_logged = true;
        }
        protobuf_c_message_free_unpacked(msg, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, why);
        return KP_RPC_STOP;
    }
    pthread_mutex_lock(&c->mu);
    if (!report_allowed(c, a, rep, why, sizeof(why))) {
        c->stats.attach_refused++;
        pthread_mutex_unlock(&c->mu);
        kp_log_warn("agent report refused status=PERMISSION_DENIED identity=%s peer=%s host=%s "
                    "agent_id=%016" PRIx64 " err=\"%s\"",
                    a->principal, a->peer, rep->host, rep->agent_id, why);
        protobuf_c_message_free_unpacked(msg, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_PERMISSION_DENIED, why);
        return KP_RPC_STOP;
    }
    if (a->id == 0) {
        /* first report: a reconnecting agent takes over its earlier entry's ranks (by id) */
        a->id = rep->agent_id;
        kp__coord_copy_text(a->host, sizeof(a->host), rep->host);
        kp_log_info("agent attached host=%s agent_id=%016" PRIx64 " peer=%s processes=%zu", a->host,
                    a->id, a->peer, rep->n_processes);
        for (struct agent **pp = &c->agents; *pp != NULL;) {
            struct agent *o = *pp;

            if (o != a && o->id == a->id && o->call == NULL &&
                (!a->authenticated || strcmp(o->principal, a->principal) == 0)) {
                *pp = o->next;
                if (o->report != NULL) {
                    protobuf_c_message_free_unpacked(&o->report->base, NULL);
                }
                free(o);
                continue;
            }
            pp = &o->next;
        }
    }
    else if (rep->agent_id != a->id) {
        pthread_mutex_unlock(&c->mu);
        protobuf_c_message_free_unpacked(msg, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "AgentReport.agent_id changed within one Attach call");
        return KP_RPC_STOP;
    }
    if (a->report != NULL) {
        protobuf_c_message_free_unpacked(&a->report->base, NULL);
    }
    a->report = rep;
    a->report_ms = kp_mono_ms();
    apply_report(c, a);
    pthread_mutex_unlock(&c->mu);
    return KP_RPC_CONTINUE;
}

static void att_half_close(struct kp_rpc_call *call, void *state)
{
    (void) state;
    kp_rpc_call_finish(call, GRPC_STATUS_OK, "");
}

static void att_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    struct agent *a = state;
    struct kp_coord *c;

    if (a == NULL) {
        return;
    }
    c = a->coord;
    pthread_mutex_lock(&c->mu);
    a->call = NULL;
    a->gone_ms = kp_mono_ms();
    pthread_mutex_unlock(&c->mu);
    if (a->id != 0) {
        kp_log_info("agent detached host=%s agent_id=%016" PRIx64 " peer=%s cancelled=%d", a->host,
                    a->id, a->peer, (int) cancelled);
    }
    kp_rpc_call_unref(call);
}

struct kp_rpc_method kp_coord_attach_method(struct kp_coord *c)
{
    return (struct kp_rpc_method){ .path = "/kprof.v1.Control/Attach",
                                   .kind = KP_RPC_STREAM,
                                   .request = &kprof__v1__agent_report__descriptor,
                                   .on_open = att_open,
                                   .on_message = att_message,
                                   .on_half_close = att_half_close,
                                   .on_close = att_close,
                                   .ud = c,
                                   .roles = KP_ROLE_AGENT };
}

int kp_coord_feed_report(struct kp_coord *c, uint32_t slot, const uint8_t *buf, size_t len,
                         char *why, size_t whylen)
{
    Kprof__V1__AgentReport *rep = kprof__v1__agent_report__unpack(NULL, len, buf);
    struct procref *v = NULL;
    struct agent *a;
    long n;

    if (rep == NULL) {
        snprintf(why, whylen, "AgentReport failed to unpack");
        return KP_EPROTO;
    }
    if (!report_valid(rep, why, whylen)) {
        protobuf_c_message_free_unpacked(&rep->base, NULL);
        return KP_EPROTO;
    }
    pthread_mutex_lock(&c->mu);
    for (a = c->agents; a != NULL && !(a->local && a->slot == slot); a = a->next) {
    }
    if (a == NULL && (a = calloc(1, sizeof(*a))) != NULL) {
        a->coord = c;
        a->local = true;
        a->slot = slot;
        a->next = c->agents;
        c->agents = a;
    }
    if (a == NULL) {
        pthread_mutex_unlock(&c->mu);
        protobuf_c_message_free_unpacked(&rep->base, NULL);
        return -ENOMEM;
    }
    if (a->report != NULL) {
        protobuf_c_message_free_unpacked(&a->report->base, NULL);
    }
    a->id = rep->agent_id;
    kp__coord_copy_text(a->host, sizeof(a->host), rep->host);
    a->report = rep;
    a->report_ms = kp_mono_ms();
    apply_report(c, a);
    n = kp__coord_gather(c, NULL, &v);
    pthread_mutex_unlock(&c->mu);
    free(v);
    return n < 0 ? (int) n : 0;
}
