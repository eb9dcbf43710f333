#define KP_LOG_MODULE "ingest"
#include "ingest.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_log.h"

#define OWNER_BUCKETS 1024
#define OWNER_MAX     4096 /* runs whose owners are kept; more: forget them all, read again */

struct ingest_call {
    struct kp_ingest *ing;
    struct kp_rpc_call *call; /* a reference, dropped when the state is freed */
    pthread_mutex_t mu;
    int refs;                 /* the call's, plus one per batch in the sink */
    size_t outstanding;       /* batches in the sink */
    size_t outstanding_bytes; /* their encoded bytes (kp_ingest_set_stream_max) */
    bool half_closed, finished, closed, paused;
    struct ingest_call *paused_next;
    /* the list of open streams (kp_ingest_live_runs), under ing->live_mu */
    struct ingest_call *live_prev, *live_next;
    uint64_t run_id; /* of its last batch; 0: none yet */
    /* authorization: the caller, and the (run, rank) last allowed */
    bool check;
    unsigned role;
    char principal[KP_STORE_PRINCIPAL_MAX];
    uint64_t ok_run;
    uint32_t ok_rank;
    /* a batch waiting for its run's lookup (under ing->auth_mu while on ing->waiters) */
    Kprof__V1__Batch *held;
    size_t held_bytes;
    struct ingest_call *wait_next;
    int verdict; /* enum verdict, set by kp_ingest_run_owner */
    char why[400];
};

enum verdict {
    ALLOW,
    DENY,
    WAIT,
    UNAVAIL
};

struct owner {
    uint64_t run;
    struct kp_store_run_owner o;
    struct owner *next;
};

struct kp_ingest {
    struct kp_batch_limits limits;
    size_t stream_max_bytes; /* 0: no cap */
    const struct kp_sink_ops *sink_ops;
    void *sink;
    pthread_mutex_t mu; /* guards paused */
    struct ingest_call *paused;
    pthread_mutex_t live_mu; /* guards live and every stream's live links and run_id */
    struct ingest_call *live;
    kp_ingest_lookup_fn *lookup;
    void *lookup_ud;
    pthread_mutex_t auth_mu; /* guards owners, n_owners and waiters */
    struct owner *owners[OWNER_BUCKETS];
    size_t n_owners;
    struct ingest_call *waiters; /* streams paused on a lookup */
    _Atomic uint64_t streams_opened, batches_received, batches_invalid, bytes_received, pauses,
        batches_refused;
};

struct kp_ingest *kp_ingest_create(const struct kp_batch_limits *limits)
{
    struct kp_ingest *ing = calloc(1, sizeof(*ing));

    if (ing == NULL) {
        return NULL;
    }
    ing->limits = *limits;
    pthread_mutex_init(&ing->mu, NULL);
    pthread_mutex_init(&ing->live_mu, NULL);
    pthread_mutex_init(&ing->auth_mu, NULL);
    return ing;
}

void kp_ingest_set_lookup(struct kp_ingest *ing, kp_ingest_lookup_fn *fn, void *ud)
{
    ing->lookup = fn;
    ing->lookup_ud = ud;
}

static void owners_clear_locked(struct kp_ingest *ing)
{
    for (size_t i = 0; i < OWNER_BUCKETS; i++) {
        while (ing->owners[i] != NULL) {
            struct owner *w = ing->owners[i];

            ing->owners[i] = w->next;
            kp_store_run_owner_fini(&w->o);
            free(w);
        }
    }
    ing->n_owners = 0;
}

static struct owner *owner_find_locked(struct kp_ingest *ing, uint64_t run)
{
    for (struct owner *w = ing->owners[run % OWNER_BUCKETS]; w != NULL; w = w->next) {
        if (w->run == run) {
            return w;
        }
    }
    return NULL;
}

void kp_ingest_set_sink(struct kp_ingest *ing, const struct kp_sink_ops *ops, void *sink)
{
    ing->sink_ops = ops;
    ing->sink = sink;
}

void kp_ingest_set_stream_max(struct kp_ingest *ing, size_t bytes)
{
    ing->stream_max_bytes = bytes;
}

/* Whether st is over its cap (reading must stop), or, with resume, still over half of it. */
static bool over_cap(struct ingest_call *st, bool resume)
{
    size_t max = st->ing->stream_max_bytes;
    bool over;

    pthread_mutex_lock(&st->mu);
    over = max > 0 && st->outstanding_bytes > (resume ? max / 2 : max);
    pthread_mutex_unlock(&st->mu);
    return over;
}

void kp_ingest_destroy(struct kp_ingest *ing)
{
    if (ing == NULL) {
        return;
    }
    owners_clear_locked(ing);
    pthread_mutex_destroy(&ing->mu);
    pthread_mutex_destroy(&ing->live_mu);
    pthread_mutex_destroy(&ing->auth_mu);
    free(ing);
}

size_t kp_ingest_live_runs(struct kp_ingest *ing, uint64_t *out, size_t max)
{
    size_t n = 0;

    pthread_mutex_lock(&ing->live_mu);
    for (const struct ingest_call *st = ing->live; st != NULL; st = st->live_next) {
        if (st->run_id != 0 && n < max) {
            out[n++] = st->run_id;
        }
        else if (st->run_id != 0) {
            n = max + 1; /* too many to tell */
            break;
        }
    }
    pthread_mutex_unlock(&ing->live_mu);
    return n;
}

void kp_ingest_get_stats(struct kp_ingest *ing, struct kp_ingest_stats *out)
{
    out->streams_opened = atomic_load(&ing->streams_opened);
    out->batches_received = atomic_load(&ing->batches_received);
    out->batches_invalid = atomic_load(&ing->batches_invalid);
    out->bytes_received = atomic_load(&ing->bytes_received);
    out->pauses = atomic_load(&ing->pauses);
    out->batches_refused = atomic_load(&ing->batches_refused);
}

static void state_unref(struct ingest_call *st, int n)
{
    int left;

    pthread_mutex_lock(&st->mu);
    st->refs -= n;
    left = st->refs;
    pthread_mutex_unlock(&st->mu);
    if (left == 0) {
        kp_rpc_call_unref(st->call);
        pthread_mutex_destroy(&st->mu);
        free(st);
    }
}

static void *on_open(struct kp_rpc_call *call, void *ud)
{
    struct kp_ingest *ing = ud;
    struct ingest_call *st = calloc(1, sizeof(*st));

    if (st == NULL) {
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        return NULL;
    }
    st->ing = ing;
    st->call = call;
    st->refs = 1;
    kp_rpc_call_ref(call);
    st->role = kp_rpc_call_identity(call)->role;
    st->check = st->role != KP_ROLES_ALL; /* authentication on */
    kp_store_principal(kp_rpc_call_identity(call), st->principal, sizeof(st->principal));
    pthread_mutex_init(&st->mu, NULL);
    pthread_mutex_lock(&ing->live_mu);
    st->live_next = ing->live;
    if (ing->live != NULL) {
        ing->live->live_prev = st;
    }
    ing->live = st;
    pthread_mutex_unlock(&ing->live_mu);
    atomic_fetch_add(&ing->streams_opened, 1);
    kp_log_debug("stream opened peer=%s", kp_rpc_call_peer(call));
    return st;
}

static enum kp_rpc_next enqueue_batch(struct ingest_call *st, Kprof__V1__Batch *b,
                                      size_t wire_bytes);

/* Whether a caller (role, principal) may push rank into the run o describes; why on false.
 * docs/design.md "Authorization". */
static bool push_allowed(const struct kp_store_run_owner *o, unsigned role, const char *principal,
                         uint64_t run, uint32_t rank, char *why, size_t len)
{
    if (o->capture) {
        size_t lo = 0, hi = o->n;

        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;

            if ((int64_t) o->ranks[mid] < (int64_t) rank) {
                lo = mid + 1;
            }
            else {
                hi = mid;
            }
        }
        if (role == KP_ROLE_AGENT && lo < o->n && (uint32_t) o->ranks[lo] == rank &&
            strcmp(o->agent_by[lo], principal) == 0) {
            return true;
        }
        snprintf(why, len,
                 "%s may not push into run %" PRIu64 " rank %u: a capture's rank takes batches "
                 "only from the agent identity it was armed on",
                 principal, run, rank);
        return false;
    }
    if ((role == KP_ROLE_AGENT && strcmp(o->created_by, principal) == 0) ||
        (role == KP_ROLE_OPERATOR && strncmp(o->created_by, "operator:", 9) == 0)) {
        return true;
    }
    snprintf(why, len,
             "%s may not push into run %" PRIu64 ": an agent pushes only into runs it created, "
             "an operator into runs an operator created",
             principal, run);
    return false;
}

/* Ends st's call with code and why (b is freed), logged with the peer, once per stream. */
static void refuse(struct ingest_call *st, Kprof__V1__Batch *b, grpc_status_code code,
                   const char *why)
{
    if (code == GRPC_STATUS_PERMISSION_DENIED) {
        atomic_fetch_add(&st->ing->batches_refused, 1);
    }
    kp_log_warn("batch refused status=%s peer=%s identity=%s run=%" PRIu64 " rank=%u err=\"%s\"",
                kp_rpc_status_name(code), kp_rpc_call_peer(st->call), st->principal, b->run_id,
                b->rank, why);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    pthread_mutex_lock(&st->mu);
    st->finished = true;
    pthread_mutex_unlock(&st->mu);
    kp_rpc_call_finish(st->call, code, why);
}

/* Decides on b from the owners known; WAIT: b is held on ing->waiters while its run is looked
 * up (a lookup started unless one is under way). */
static enum verdict authorize(struct ingest_call *st, Kprof__V1__Batch *b, size_t wire_bytes,
                              char *why, size_t len)
{
    struct kp_ingest *ing = st->ing;
    const struct owner *w;
    bool started = false;

    pthread_mutex_lock(&ing->auth_mu);
    if ((w = owner_find_locked(ing, b->run_id)) != NULL) {
        bool ok = push_allowed(&w->o, st->role, st->principal, b->run_id, b->rank, why, len);

        pthread_mutex_unlock(&ing->auth_mu);
        if (ok) {
            st->ok_run = b->run_id;
            st->ok_rank = b->rank;
        }
        return ok ? ALLOW : DENY;
    }
    for (const struct ingest_call *o = ing->waiters; o != NULL; o = o->wait_next) {
        started |= o->held->run_id == b->run_id;
    }
    st->held = b;
    st->held_bytes = wire_bytes;
    st->wait_next = ing->waiters;
    ing->waiters = st;
    pthread_mutex_lock(&st->mu);
    st->refs++; /* the waiters list's */
    pthread_mutex_unlock(&st->mu);
    pthread_mutex_unlock(&ing->auth_mu);
    if (started || (ing->lookup != NULL && ing->lookup(ing->lookup_ud, b->run_id))) {
        return WAIT;
    }
    /* no lookup: take b back (no other stream waits on its run: none had started one) */
    pthread_mutex_lock(&ing->auth_mu);
    for (struct ingest_call **pp = &ing->waiters; *pp != NULL; pp = &(*pp)->wait_next) {
        if (*pp == st) {
            *pp = st->wait_next;
            break;
        }
    }
    st->held = NULL;
    pthread_mutex_unlock(&ing->auth_mu);
    state_unref(st, 1);
    snprintf(why, len,
             "collectord cannot look up who may push into run %" PRIu64 " now (the "
             "control queue is full or stopping); retry",
             b->run_id);
    return UNAVAIL;
}

void kp_ingest_run_owner(struct kp_ingest *ing, uint64_t run_id, int rc,
                         const struct kp_store_run_owner *o, const char *why)
{
    struct ingest_call *mine = NULL;
    struct owner *w = NULL, stale = { 0 };

    pthread_mutex_lock(&ing->auth_mu);
    if (rc == 0 && o->unsettled) {
        /* maybe a capture whose rows are not written yet (StartCapture writes them after the
         * run, and only then arms its agents): decided on what it is now, not kept, so that a
         * push that came too early does not decide for the capture's ranks */
        stale.o = *o;
        w = &stale;
    }
    else if (rc == 0 && (w = owner_find_locked(ing, run_id)) == NULL &&
             (w = calloc(1, sizeof(*w))) != NULL) {
        w->run = run_id;
        w->o = *o;
        w->o.ranks = NULL;
        w->o.agent_by = NULL;
        w->o.n = 0;
        if (o->n > 0) {
            w->o.ranks = malloc(o->n * sizeof(*o->ranks));
            w->o.agent_by = malloc(o->n * sizeof(*o->agent_by));
            if (w->o.ranks == NULL || w->o.agent_by == NULL) {
                kp_store_run_owner_fini(&w->o);
                free(w);
                w = NULL;
            }
            else {
                memcpy(w->o.ranks, o->ranks, o->n * sizeof(*o->ranks));
                memcpy(w->o.agent_by, o->agent_by, o->n * sizeof(*o->agent_by));
                w->o.n = o->n;
            }
        }
        if (w != NULL) {
            if (ing->n_owners >= OWNER_MAX) {
                owners_clear_locked(ing);
            }
            w->next = ing->owners[run_id % OWNER_BUCKETS];
            ing->owners[run_id % OWNER_BUCKETS] = w;
            ing->n_owners++;
        }
    }
    for (struct ingest_call **pp = &ing->waiters; *pp != NULL;) {
        struct ingest_call *st = *pp;

        if (st->held->run_id == run_id) {
            *pp = st->wait_next;
            st->wait_next = mine;
            mine = st;
            continue;
        }
        pp = &st->wait_next;
    }
    /* decided under the lock: w may be freed by the next answer's eviction */
    for (struct ingest_call *st = mine; st != NULL; st = st->wait_next) {
        if (rc == 0 && w == NULL) {
            st->verdict = DENY;
            snprintf(st->why, sizeof(st->why), "collectord is out of memory; retry");
        }
        else if (rc == 0) {
            st->verdict = push_allowed(&w->o, st->role, st->principal, run_id, st->held->rank,
                                       st->why, sizeof(st->why))
                              ? ALLOW
                              : DENY;
        }
        else {
            st->verdict = rc == KP_ENOTFOUND ? ALLOW : UNAVAIL;
            snprintf(st->why, sizeof(st->why), "%s", why != NULL ? why : "");
        }
    }
    pthread_mutex_unlock(&ing->auth_mu);
    while (mine != NULL) {
        struct ingest_call *st = mine;
        Kprof__V1__Batch *b = st->held;
        bool closed;

        mine = st->wait_next;
        st->held = NULL;
        pthread_mutex_lock(&st->mu);
        closed = st->closed || st->finished;
        pthread_mutex_unlock(&st->mu);
        if (closed) {
            protobuf_c_message_free_unpacked(&b->base, NULL);
        }
        else if (st->verdict == ALLOW) {
            if (rc == 0) {
                st->ok_run = b->run_id;
                st->ok_rank = b->rank;
            }
            if (enqueue_batch(st, b, st->held_bytes) == KP_RPC_CONTINUE) {
                kp_rpc_call_resume(st->call);
            }
        }
        else if (st->verdict == DENY && rc == 0 && w != NULL) {
            refuse(st, b, GRPC_STATUS_PERMISSION_DENIED, st->why);
        }
        else {
            refuse(st, b,
                   rc == -ENOMEM || rc == 0 ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                            : GRPC_STATUS_UNAVAILABLE,
                   st->why);
        }
        state_unref(st, 1); /* the waiters list's */
    }
}

static enum kp_rpc_next on_message(struct kp_rpc_call *call, ProtobufCMessage *msg,
                                   size_t wire_bytes, void *state)
{
    struct ingest_call *st = state;
    struct kp_ingest *ing;
    Kprof__V1__Batch *b = (Kprof__V1__Batch *) msg;
    char err[512], details[640];
    int rc;

    if (st == NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
        return KP_RPC_STOP;
    }
    ing = st->ing;
    pthread_mutex_lock(&st->mu);
    if (st->finished) {
        /* a batch was refused and the call has ended: the producer resends what follows */
        pthread_mutex_unlock(&st->mu);
        protobuf_c_message_free_unpacked(msg, NULL);
        return KP_RPC_STOP;
    }
    pthread_mutex_unlock(&st->mu);
    pthread_mutex_lock(&ing->live_mu);
    st->run_id = b->run_id;
    pthread_mutex_unlock(&ing->live_mu);
    atomic_fetch_add(&ing->batches_received, 1);
    atomic_fetch_add(&ing->bytes_received, wire_bytes);
    rc = kp_batch_validate(b, &ing->limits, err, sizeof(err));
    if (rc != 0) {
        atomic_fetch_add(&ing->batches_invalid, 1);
        kp_log_warn("rejected batch peer=%s run=%" PRIu64 " rank=%u stream=%" PRIu64 " seq=%" PRIu64
                    " err=\"%s\"",
                    kp_rpc_call_peer(call), b->run_id, b->rank, b->stream, b->seq, err);
        snprintf(details, sizeof(details), "batch run=%" PRIu64 " rank=%u seq=%" PRIu64 ": %s",
                 b->run_id, b->rank, b->seq, err);
        protobuf_c_message_free_unpacked(msg, NULL);
        pthread_mutex_lock(&st->mu);
        st->finished = true;
        pthread_mutex_unlock(&st->mu);
        kp_rpc_call_finish(
            call, rc == KP_ETOOBIG ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INVALID_ARGUMENT,
            details);
        return KP_RPC_STOP;
    }
    if (st->check && !(st->ok_run != 0 && b->run_id == st->ok_run && b->rank == st->ok_rank)) {
        enum verdict v = authorize(st, b, wire_bytes, err, sizeof(err));

        if (v == WAIT) {
            return KP_RPC_PAUSE; /* kp_ingest_run_owner goes on with b and resumes the call */
        }
        if (v != ALLOW) {
            refuse(st, b, v == DENY ? GRPC_STATUS_PERMISSION_DENIED : GRPC_STATUS_UNAVAILABLE, err);
            return KP_RPC_STOP;
        }
    }
    return enqueue_batch(st, b, wire_bytes);
}

/* Queues b (owned) to the sink; KP_RPC_PAUSE when the sink is full. */
static enum kp_rpc_next enqueue_batch(struct ingest_call *st, Kprof__V1__Batch *b,
                                      size_t wire_bytes)
{
    struct kp_ingest *ing = st->ing;
    struct kp_rpc_call *call = st->call;
    struct kp_sink_item *item;

    if ((item = calloc(1, sizeof(*item))) == NULL) {
        protobuf_c_message_free_unpacked(&b->base, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        return KP_RPC_STOP;
    }
    item->batch = b;
    item->wire_bytes = wire_bytes;
    item->rows = kp_batch_total_rows(b);
    item->origin = st;
    pthread_mutex_lock(&st->mu);
    st->refs++;
    st->outstanding++;
    st->outstanding_bytes += wire_bytes;
    pthread_mutex_unlock(&st->mu);
    if (ing->sink_ops->submit(ing->sink, item) && !over_cap(st, false)) {
        return KP_RPC_CONTINUE;
    }
    /* The queue is full, or this stream has its share of it: stop reading this stream until
     * a flush makes room. */
    pthread_mutex_lock(&ing->mu);
    pthread_mutex_lock(&st->mu);
    if (!st->paused) {
        st->paused = true;
        st->refs++;
        st->paused_next = ing->paused;
        ing->paused = st;
    }
    pthread_mutex_unlock(&st->mu);
    pthread_mutex_unlock(&ing->mu);
    atomic_fetch_add(&ing->pauses, 1);
    /* A flush may have made room before we were on the list: check once more. */
    if (ing->sink_ops->has_room(ing->sink) && !over_cap(st, true)) {
        return KP_RPC_CONTINUE; /* the next done_cb unlinks us; resume is then a no-op */
    }
    return KP_RPC_PAUSE;
}

static void maybe_finish_ok(struct ingest_call *st)
{
    bool finish;

    pthread_mutex_lock(&st->mu);
    finish = st->half_closed && st->outstanding == 0 && !st->finished;
    if (finish) {
        st->finished = true;
    }
    pthread_mutex_unlock(&st->mu);
    if (finish) {
        kp_rpc_call_finish(st->call, GRPC_STATUS_OK, "");
    }
}

static void on_half_close(struct kp_rpc_call *call, void *state)
{
    struct ingest_call *st = state;

    if (st == NULL) {
        return;
    }
    pthread_mutex_lock(&st->mu);
    st->half_closed = true;
    pthread_mutex_unlock(&st->mu);
    maybe_finish_ok(st);
}

static void on_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    struct ingest_call *st = state;

    if (st == NULL) {
        return;
    }
    if (cancelled) {
        kp_log_info("stream ended by the client peer=%s outstanding=%zu", kp_rpc_call_peer(call),
                    st->outstanding);
    }
    pthread_mutex_lock(&st->ing->live_mu);
    if (st->live_prev != NULL) {
        st->live_prev->live_next = st->live_next;
    }
    else {
        st->ing->live = st->live_next;
    }
    if (st->live_next != NULL) {
        st->live_next->live_prev = st->live_prev;
    }
    pthread_mutex_unlock(&st->ing->live_mu);
    pthread_mutex_lock(&st->mu);
    st->closed = true;
    pthread_mutex_unlock(&st->mu);
    state_unref(st, 1);
}

struct kp_rpc_method kp_ingest_method(struct kp_ingest *ing)
{
    struct kp_rpc_method m = {
        .path = "/kprof.v1.Ingest/Push",
        .kind = KP_RPC_STREAM,
        .request = &kprof__v1__batch__descriptor,
        .on_open = on_open,
        .on_message = on_message,
        .on_half_close = on_half_close,
        .on_close = on_close,
        .ud = ing,
        .roles = KP_ROLE_AGENT | KP_ROLE_OPERATOR, /* agents' captures, operators' imports */
    };

    return m;
}

static grpc_status_code status_of(int err)
{
    switch (err) {
    case KP_ENOTFOUND:
        return GRPC_STATUS_NOT_FOUND;
    case KP_EPROTO:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case -EBUSY:
        return GRPC_STATUS_FAILED_PRECONDITION; /* the run has ended */
    case KP_ESHUTDOWN:
    case -EAGAIN: /* Kafka did not acknowledge it, or its run could not be checked */
        return GRPC_STATUS_UNAVAILABLE;
    default:
        return GRPC_STATUS_INTERNAL;
    }
}

/* Acks (and rejections) for one call: the items of items[from..n) whose origin is st. */
static void settle_call(struct ingest_call *st, struct kp_sink_item **items, size_t from, size_t n,
                        bool *done)
{
    Kprof__V1__Ack ack = KPROF__V1__ACK__INIT;
    Kprof__V1__BatchRef *refs;
    Kprof__V1__BatchRef **ptrs;
    size_t count = 0, settled = 0, settled_bytes = 0;
    int reject = 0;
    char reason[sizeof(items[0]->err)] = "";

    for (size_t i = from; i < n; i++) {
        count += items[i]->origin == st;
    }
    refs = calloc(count, sizeof(*refs));
    ptrs = calloc(count, sizeof(*ptrs));
    for (size_t i = from; i < n; i++) {
        struct kp_sink_item *it = items[i];
        const Kprof__V1__Batch *b = it->batch;

        if (it->origin != st) {
            continue;
        }
        done[i] = true;
        settled++;
        settled_bytes += it->wire_bytes;
        if (it->status != 0) {
            if (reject == 0) {
                reject = it->status;
                snprintf(reason, sizeof(reason), "%s", it->err);
            }
            continue;
        }
        if (refs != NULL && ptrs != NULL) {
            Kprof__V1__BatchRef *r = &refs[ack.n_batches];

            kprof__v1__batch_ref__init(r);
            r->run_id = b->run_id;
            r->rank = b->rank;
            r->stream = b->stream;
            r->seq = b->seq;
            r->duplicate = it->duplicate;
            ptrs[ack.n_batches++] = r;
        }
    }
    ack.batches = ptrs;
    if (ack.n_batches > 0) {
        kp_rpc_call_send(st->call, &ack.base);
    }
    free(refs);
    free(ptrs);
    pthread_mutex_lock(&st->mu);
    st->outstanding -= settled;
    st->outstanding_bytes -= settled_bytes;
    if (reject != 0 && st->finished) {
        reject = 0; /* the call has ended already: said and logged once per stream */
    }
    if (reject != 0) {
        st->finished = true;
    }
    pthread_mutex_unlock(&st->mu);
    if (reject != 0) {
        kp_log_warn("batch not stored peer=%s err=\"%s\"", kp_rpc_call_peer(st->call), reason);
        kp_rpc_call_finish(st->call, status_of(reject), reason);
    }
    maybe_finish_ok(st);
    state_unref(st, (int) settled);
}

void kp_ingest_done_cb(struct kp_sink_item **items, size_t n, void *ud)
{
    struct kp_ingest *ing = ud;
    bool *done = calloc(n, sizeof(bool));
    struct ingest_call *resume;

    for (size_t i = 0; i < n; i++) {
        if (done != NULL && !done[i]) {
            settle_call(items[i]->origin, items, i, n, done);
        }
        else if (done == NULL) {
            /* Out of memory: settle one by one. */
            bool one = false;
            struct kp_sink_item *it = items[i];

            settle_call(it->origin, &items[i], 0, 1, &one);
        }
    }
    for (size_t i = 0; i < n; i++) {
        kp_sink_item_free(items[i]);
    }
    free(done);
    if (!ing->sink_ops->has_room(ing->sink)) {
        return;
    }
    pthread_mutex_lock(&ing->mu);
    resume = ing->paused;
    ing->paused = NULL;
    pthread_mutex_unlock(&ing->mu);
    while (resume != NULL) {
        struct ingest_call *next = resume->paused_next;

        if (over_cap(resume, true)) {
            /* Still holding its share: it waits for its own acknowledgements. */
            pthread_mutex_lock(&ing->mu);
            resume->paused_next = ing->paused;
            ing->paused = resume;
            pthread_mutex_unlock(&ing->mu);
            resume = next;
            continue;
        }
        pthread_mutex_lock(&resume->mu);
        resume->paused = false;
        pthread_mutex_unlock(&resume->mu);
        kp_rpc_call_resume(resume->call);
        state_unref(resume, 1);
        resume = next;
    }
}
