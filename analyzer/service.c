#define KP_LOG_MODULE "analyzer"
#include "service.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "an.h"
#include "export_rpc.h"
#include "kp_auth.h"
#include "kp_clock.h"
#include "kp_daemon.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_rpc.h"
#include "kp_strbuf.h"
#include "kp_workq.h"
#include "kprof.pb-c.h"
#include "view.h"
#include "web.h"

#define KP_ANALYZER_MAX_WORKERS 64
#define KP_ANALYZER_MAX_VIEWS   32
/* Methods outside the view table (a streaming one has no cached unary reply). */
#define KP_ANALYZER_EXTRA_METHODS 4

/* A queued request: a view's (the gRPC method's or the web API's, answered through sink), or
 * work of another front end on a worker's connection (pg_fn). */
struct job {
    size_t view;                         /* index into kp_views */
    const struct kp_analyzer_sink *sink; /* how the answer goes back (static) */
    void *ud;                            /* sink's */
    ProtobufCMessage *req;               /* owned */
    kp_analyzer_pg_fn *pg_fn;            /* not NULL: this, not a view */
};

/* What a cached reply was computed from: the view and its key (view.h). */
struct cache_key {
    size_t view; /* index into kp_views */
    struct kp_view_key k;
};

struct cache_entry {
    struct cache_key key;
    int state;       /* runs.state when computed */
    int64_t batches; /* the run's committed ingest batches when computed */
    uint8_t *packed; /* the packed reply (cached = false) */
    size_t len;
    struct cache_entry *prev, *next; /* most recently used first */
};

/* A worker's state (kp_workq): its PostgreSQL connection. */
struct worker {
    struct kp_analyzer *a;
    PGconn *pg;
    struct kp_complain pg_complain;
};

struct stats {
    uint64_t requests[KP_ANALYZER_MAX_VIEWS];
    uint64_t errors; /* answered with a status other than OK */
    uint64_t rejected;
    uint64_t cache_hits, cache_misses, cache_evictions;
    uint64_t pg_ok; /* 1 while the last connection attempt or query worked */
    uint64_t memory_refused, memory_waits;
};

/* A view's method's ud: the service and the view's index in kp_views. */
struct view_slot {
    struct kp_analyzer *a;
    size_t view;
};

struct kp_analyzer {
    struct kp_analyzer_config cfg; /* borrowed strings */
    /* a method per view, one per view's stream, and the extra ones */
    struct kp_rpc_method methods[2 * KP_ANALYZER_MAX_VIEWS + KP_ANALYZER_EXTRA_METHODS];
    char paths[KP_ANALYZER_MAX_VIEWS][64];        /* "/kprof.v1.Analyzer/<view>" */
    char stream_paths[KP_ANALYZER_MAX_VIEWS][64]; /* "/kprof.v1.Analyzer/<view's stream>" */
    struct view_slot slots[KP_ANALYZER_MAX_VIEWS];
    size_t n_methods;
    struct kp_export_svc *export_svc; /* Analyzer.Export (export_rpc.h) */
    struct kp_rpc_server *server;
    struct kp_http *http;
    struct kp_web *web;   /* --web-listen: the JSON HTTP API (web.h); NULL: off */
    struct kp_auth *auth; /* NULL: --allow-anonymous */
    struct kp_workq *q;   /* the workers, each with a struct worker */

    pthread_mutex_t mu; /* last_reject_log_ns */
    long long last_reject_log_ns;

    pthread_mutex_t cache_mu; /* the cache list and its byte count */
    struct cache_entry *lru_head, *lru_tail;
    size_t cache_used, cache_entries;

    pthread_mutex_t mem_mu; /* mem_held, mem_stopping */
    pthread_cond_t mem_cv;  /* signalled when memory is released, or on stop */
    size_t mem_held;        /* the estimates of the analyses in progress (--memory-budget) */
    bool mem_stopping;

    struct stats st; /* __atomic */
};

#define INC(field) __atomic_add_fetch(&(field), 1, __ATOMIC_RELAXED)
#define GET(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

static void job_free(struct job *j)
{
    if (j->req != NULL) {
        protobuf_c_message_free_unpacked(j->req, NULL);
    }
    if (j->sink != NULL && j->sink->release != NULL) {
        j->sink->release(j->ud);
    }
    free(j);
}

static void finish_error(struct kp_analyzer *a, struct job *j, grpc_status_code code,
                         const char *details)
{
    INC(a->st.errors);
    j->sink->error(j->ud, code, details);
}

/* The gRPC method's sink: ud is the call (a reference). */
static void grpc_reply(void *ud, const ProtobufCMessage *msg)
{
    kp_rpc_call_reply(ud, msg);
}

static void grpc_error(void *ud, grpc_status_code code, const char *details)
{
    kp_rpc_call_finish(ud, code, details);
}

static void grpc_release(void *ud)
{
    kp_rpc_call_unref(ud);
}

static const struct kp_analyzer_sink grpc_sink = { .reply = grpc_reply,
                                                   .error = grpc_error,
                                                   .release = grpc_release };

/* How long a streaming view's page waits for a client that does not read before the call is
 * given up: the compute holds a worker (and its memory) meanwhile. */
#define VIEW_PAGE_TIMEOUT_MS 60000LL

/* A streaming view's page: sent once the one before has reached the transport (one in
 * flight: a slow client slows the compute, never grows the analyzer). */
static int grpc_page(void *ud, const ProtobufCMessage *msg)
{
    int rc = kp_rpc_call_wait_sent(ud, VIEW_PAGE_TIMEOUT_MS);

    return rc != 0 ? rc : kp_rpc_call_send(ud, msg);
}

static const struct kp_analyzer_sink grpc_stream_sink = { .reply = grpc_reply,
                                                          .error = grpc_error,
                                                          .release = grpc_release,
                                                          .page = grpc_page };

/* ---- cache ------------------------------------------------------------------------------ */

static bool key_eq(const struct cache_key *x, const struct cache_key *y)
{
    return x->view == y->view && memcmp(&x->k, &y->k, sizeof(x->k)) == 0;
}

/* Unlinks e from the LRU list. cache_mu held. */
static void lru_unlink(struct kp_analyzer *a, struct cache_entry *e)
{
    if (e->prev != NULL) {
        e->prev->next = e->next;
    }
    else {
        a->lru_head = e->next;
    }
    if (e->next != NULL) {
        e->next->prev = e->prev;
    }
    else {
        a->lru_tail = e->prev;
    }
    e->prev = e->next = NULL;
}

static void lru_push_front(struct kp_analyzer *a, struct cache_entry *e)
{
    e->prev = NULL;
    e->next = a->lru_head;
    if (a->lru_head != NULL) {
        a->lru_head->prev = e;
    }
    a->lru_head = e;
    if (a->lru_tail == NULL) {
        a->lru_tail = e;
    }
}

/* Removes and frees e. cache_mu held. */
static void cache_drop(struct kp_analyzer *a, struct cache_entry *e)
{
    lru_unlink(a, e);
    a->cache_used -= e->len + sizeof(*e);
    a->cache_entries--;
    free(e->packed);
    free(e);
}

static struct cache_entry *cache_find(struct kp_analyzer *a, const struct cache_key *k)
{
    for (struct cache_entry *e = a->lru_head; e != NULL; e = e->next) {
        if (key_eq(&e->key, k)) {
            return e;
        }
    }
    return NULL;
}

/* Returns the reply for k unpacked (owned), or NULL on a miss or a stale entry (which is
 * dropped). */
static ProtobufCMessage *cache_get(struct kp_analyzer *a, const struct cache_key *k, int state,
                                   int64_t batches, const ProtobufCMessageDescriptor *desc)
{
    ProtobufCMessage *m = NULL;
    struct cache_entry *e;

    pthread_mutex_lock(&a->cache_mu);
    e = cache_find(a, k);
    if (e != NULL && (e->state != state || e->batches != batches)) {
        cache_drop(a, e);
        e = NULL;
    }
    if (e != NULL) {
        lru_unlink(a, e);
        lru_push_front(a, e);
        m = protobuf_c_message_unpack(desc, NULL, e->len, e->packed);
    }
    pthread_mutex_unlock(&a->cache_mu);
    return m;
}

/* Keeps msg packed under k, evicting the least recently used entries to make room. */
static void cache_put(struct kp_analyzer *a, const struct cache_key *k, int state, int64_t batches,
                      const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    size_t cap = (size_t) a->cfg.cache_bytes;
    struct cache_entry *e, *old;

    if (len + sizeof(*e) > cap) {
        return; /* larger than the whole cache (or the cache is off) */
    }
    if ((e = calloc(1, sizeof(*e))) == NULL || (e->packed = malloc(len ? len : 1)) == NULL) {
        free(e);
        return;
    }
    e->key = *k;
    e->state = state;
    e->batches = batches;
    e->len = protobuf_c_message_pack(msg, e->packed);
    pthread_mutex_lock(&a->cache_mu);
    if ((old = cache_find(a, k)) != NULL) {
        cache_drop(a, old);
    }
    while (a->lru_tail != NULL && a->cache_used + e->len + sizeof(*e) > cap) {
        cache_drop(a, a->lru_tail);
        INC(a->st.cache_evictions);
    }
    lru_push_front(a, e);
    a->cache_used += e->len + sizeof(*e);
    a->cache_entries++;
    pthread_mutex_unlock(&a->cache_mu);
}

/* ---- answering a request ------------------------------------------------------------ */

static PGconn *pg_get(struct worker *w, char *err, size_t len)
{
    if (w->pg != NULL && PQstatus(w->pg) == CONNECTION_OK) {
        return w->pg;
    }
    if (w->pg != NULL) {
        PQfinish(w->pg);
        w->pg = NULL;
    }
    if (kp_pg_connect(w->a->cfg.base.pg_conninfo, "kprof-analyzer", &w->pg, err, len) != 0) {
        __atomic_store_n(&w->a->st.pg_ok, 0, __ATOMIC_RELAXED);
        kp_complain(&w->pg_complain, KP_LOG_ERROR, KP_LOG_MODULE,
                    "PostgreSQL unreachable for analyses err=\"%s\"", err);
        return NULL;
    }
    __atomic_store_n(&w->a->st.pg_ok, 1, __ATOMIC_RELAXED);
    kp_release(&w->pg_complain, KP_LOG_MODULE, "PostgreSQL reachable again for analyses");
    return w->pg;
}

/* Sets the reply's `cached` field (every view's reply has one: view.h). */
static void set_cached(ProtobufCMessage *m)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "cached");

    if (f != NULL && f->type == PROTOBUF_C_TYPE_BOOL) {
        *(protobuf_c_boolean *) ((char *) m + f->offset) = 1;
    }
}

/* kp_view_run_version as kp_pg_retry's work. */
struct run_version {
    uint64_t run;
    int state;
    int64_t batches;
};

static int run_version(PGconn *pg, void *ud, char *err, size_t len)
{
    struct run_version *v = ud;

    return kp_view_run_version(pg, v->run, &v->state, &v->batches, err, len);
}

/* ---- the memory budget (--memory-budget) ------------------------------------------------ */

/* How long a request waits for the analyses in progress to leave it room. */
#define MEM_WAIT_MS 60000

/* b in the unit --memory-budget is written in (MiB, else KiB, else B), rounded down. */
static const char *size_text(char buf[32], size_t b)
{
    if (b >= (1u << 20)) {
        snprintf(buf, 32, "%zu MiB", b >> 20);
    }
    else if (b >= (1u << 10)) {
        snprintf(buf, 32, "%zu KiB", b >> 10);
    }
    else {
        snprintf(buf, 32, "%zu B", b);
    }
    return buf;
}

/*
 * Holds the memory request k of view v is estimated to need (*need, 0 when the view or the
 * service has no budget) against the budget, before it computes: the events it reads times
 * the view's bytes an event. A request that alone needs more than the budget is refused; one
 * that does not fit beside the analyses in progress waits for them, up to MEM_WAIT_MS. A
 * windowed view's rank of over two windows (or a streaming view's: stream) is estimated for
 * two windows (*by_windows then true) unless whole: then for the rank.
 * Returns 0, or -1 with the status in *code and its details in err (logged here).
 */
static int mem_reserve(struct kp_analyzer *a, PGconn *pg, const struct kp_view *v,
                       const struct kp_view_key *k, bool stream, bool whole, size_t *need,
                       bool *by_windows, grpc_status_code *code, char *err, size_t len)
{
    size_t budget = (size_t) a->cfg.memory_budget, bytes;
    const char *method = stream ? v->stream : v->name;
    int64_t n = 0, other = 0;
    long long until = kp_mono_ms() + MEM_WAIT_MS;
    bool waited = false, got = false;

    *need = 0;
    *by_windows = false;
    if (budget == 0 || v->bytes_per_event == 0) {
        return 0;
    }
    if (kp_view_rank_events(pg, k->run, v->whole_run ? -1 : k->rank, &n, err, len) == 0 &&
        v->other_rank != NULL) {
        uint64_t orun;
        int32_t orank;

        v->other_rank(k, &orun, &orank);
        (void) kp_view_rank_events(pg, orun, orank, &other, err, len);
    }
    if (err[0] != '\0') {
        char pgerr[512];

        kp_log_warn("memory estimate failed method=%s run=%" PRIu64 " err=\"%s\"", method, k->run,
                    err);
        snprintf(pgerr, sizeof(pgerr), "%s", err);
        snprintf(err, len, "PostgreSQL failed (%s); retry later", pgerr);
        *code = GRPC_STATUS_UNAVAILABLE;
        return -1;
    }
    /* a rank read by windows holds about one window's rows: window_events host events and
     * the device events they launched (a host event launches at most about one) */
    bytes = (size_t) (n + other) * v->bytes_per_event;
    if (!whole && (v->windowed || stream) && a->cfg.window_events > 0 &&
        n > 2 * a->cfg.window_events) {
        bytes = (size_t) (2 * a->cfg.window_events) * v->bytes_per_event;
        *by_windows = true;
    }
    if (bytes > budget) {
        char rank[24] = "", need_s[32], budget_s[32];

        INC(a->st.memory_refused);
        if (!v->whole_run) {
            snprintf(rank, sizeof(rank), " rank %d", (int) k->rank);
        }
        snprintf(err, len,
                 "%s of run %" PRIu64 "%s reads %" PRId64 " events: about %s, over the "
                 "analyzer's --memory-budget of %s; raise --memory-budget (and the "
                 "analyzer's memory limit) to analyse it%s%s%s",
                 method, k->run, rank, n + other, size_text(need_s, bytes),
                 size_text(budget_s, budget), v->stream != NULL && !stream ? ", or call " : "",
                 v->stream != NULL && !stream ? v->stream : "",
                 v->stream != NULL && !stream ? ", which streams it in pages (kprofctl does)" : "");
        kp_log_warn("analysis refused method=%s run=%" PRIu64 " rank=%d err=\"%s\"", method, k->run,
                    (int) k->rank, err);
        *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        return -1;
    }
    pthread_mutex_lock(&a->mem_mu);
    while (!a->mem_stopping && a->mem_held + bytes > budget && kp_mono_ms() < until) {
        struct timespec ts;

        waited = true;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1; /* re-checks the deadline and the stop */
        pthread_cond_timedwait(&a->mem_cv, &a->mem_mu, &ts);
    }
    if (!a->mem_stopping && a->mem_held + bytes <= budget) {
        a->mem_held += bytes;
        *need = bytes;
        got = true;
    }
    else {
        snprintf(err, len,
                 a->mem_stopping ? "kprof-analyzer is shutting down; retry"
                                 : "kprof-analyzer is busy: the analyses in progress hold %zu MiB "
                                   "of its --memory-budget of %zu MiB, and this one needs %zu "
                                   "MiB; retry later",
                 a->mem_held >> 20, budget >> 20, bytes >> 20);
    }
    pthread_mutex_unlock(&a->mem_mu);
    if (waited) {
        INC(a->st.memory_waits);
    }
    if (!got) {
        kp_log_warn("analysis postponed method=%s run=%" PRIu64 " err=\"%s\"", method, k->run, err);
        *code = GRPC_STATUS_UNAVAILABLE;
        return -1;
    }
    return 0;
}

static void mem_release(struct kp_analyzer *a, size_t need)
{
    if (need == 0) {
        return;
    }
    pthread_mutex_lock(&a->mem_mu);
    a->mem_held -= need;
    pthread_cond_broadcast(&a->mem_cv);
    pthread_mutex_unlock(&a->mem_mu);
}

static void run_job(struct worker *w, struct job *j)
{
    struct kp_analyzer *a = w->a;
    const struct kp_view *v = kp_views[j->view];
    struct cache_key k;
    char err[700] = "", details[768]; /* details: err and a sentence around it */
    struct kp_an *an = NULL;
    struct kp_view_reply out = { 0 };
    ProtobufCMessage *hit;
    /* a streaming call's pages (kp_view.stream), or NULL */
    const struct kp_view_pages pages = { .send = j->sink->page, .ud = j->ud };
    const bool stream = j->sink->page != NULL;
    const char *method = stream ? v->stream : v->name; /* for the log */
    /* not cached: a request that writes, a view the cache cannot check (kp_view.uncached), or
     * a stream (its pages are gone once sent) */
    bool writes = (v->writes != NULL && v->writes(j->req)) || v->uncached || stream;
    int64_t batches = 0;
    struct run_version ver = { 0 };
    int state = 0, rc;
    size_t need = 0;         /* held in --memory-budget */
    bool by_windows = false; /* need is for windows, not a whole read */
    grpc_status_code code;
    PGconn *pg;

    memset(&k, 0, sizeof(k));
    k.view = j->view;
    if (!v->key(j->req, (size_t) a->cfg.max_rows, &k.k, err, sizeof(err))) {
        finish_error(a, j, GRPC_STATUS_INVALID_ARGUMENT, err);
        return;
    }
    if ((pg = pg_get(w, err, sizeof(err))) == NULL) {
        snprintf(details, sizeof(details), "PostgreSQL is unreachable (%s); retry later", err);
        finish_error(a, j, GRPC_STATUS_UNAVAILABLE, details);
        return;
    }
    /* The first statement of every request: a read, so it runs again on a new connection when
     * PostgreSQL dropped this idle one (restarted). The computation that follows then runs on
     * a connection that just worked; it is not repeated (Compare may save offsets). */
    ver.run = k.k.run;
    rc = kp_pg_retry(pg, true, run_version, &ver, err, sizeof(err));
    state = ver.state;
    batches = ver.batches;
    if (rc == KP_ENOTFOUND) {
        kp_log_debug("no such run method=%s run=%" PRIu64, method, k.k.run);
        finish_error(a, j, GRPC_STATUS_NOT_FOUND, err);
        return;
    }
    if (rc != 0) {
        kp_log_warn("run check failed run=%" PRIu64 " err=\"%s\"", k.k.run, err);
        if (kp_pg_conn_lost(pg)) {
            __atomic_store_n(&a->st.pg_ok, 0, __ATOMIC_RELAXED);
        }
        snprintf(details, sizeof(details), "%s%s; retry later",
                 strncmp(err, "PostgreSQL", 10) == 0 ? "" : "PostgreSQL failed: ", err);
        finish_error(a, j, GRPC_STATUS_UNAVAILABLE, details);
        return;
    }
    if (!v->whole_run && k.k.rank == KP_VIEW_ONLY_RANK &&
        (rc = kp_view_resolve_rank(pg, k.k.run, &k.k.rank, err, sizeof(err))) != 0) {
        finish_error(a, j, kp_view_status(v, &k.k, rc, err, sizeof(err)), err);
        return;
    }
    /* A request that writes (Compare's save_offsets) is never answered from the cache. */
    if (a->cfg.cache_bytes > 0 && !writes &&
        (hit = cache_get(a, &k, state, batches, v->reply)) != NULL) {
        INC(a->st.cache_hits);
        set_cached(hit);
        kp_log_debug("cache hit method=%s run=%" PRIu64 " rank=%d", v->name, k.k.run,
                     (int) k.k.rank);
        j->sink->reply(j->ud, hit);
        protobuf_c_message_free_unpacked(hit, NULL);
        return;
    }
    INC(a->st.cache_misses);
    err[0] = '\0';
    if (mem_reserve(a, pg, v, &k.k, stream, false, &need, &by_windows, &code, err, sizeof(err)) !=
        0) {
        finish_error(a, j, code, err);
        return;
    }
    {
        long long t0 = kp_mono_ns();

        rc = kp_view_compute(v, pg, j->req, &k.k, (size_t) a->cfg.max_rows,
                             (size_t) a->cfg.window_events, by_windows, stream ? &pages : NULL, &an,
                             &out, &code, err, sizeof(err));
        if (rc == KP_EWHOLE) {
            /* held for two windows, the rank cannot be cut: hold what a whole read takes */
            kp_an_destroy(an);
            an = NULL;
            mem_release(a, need);
            kp_log_info("rank cannot be read by windows method=%s run=%" PRIu64
                        " rank=%d: estimated whole",
                        method, k.k.run, (int) k.k.rank);
            err[0] = '\0';
            if (mem_reserve(a, pg, v, &k.k, stream, true, &need, &by_windows, &code, err,
                            sizeof(err)) != 0) {
                finish_error(a, j, code, err);
                return;
            }
            rc = kp_view_compute(v, pg, j->req, &k.k, (size_t) a->cfg.max_rows, 0, false,
                                 stream ? &pages : NULL, &an, &out, &code, err, sizeof(err));
        }
        kp_log_debug("computed method=%s run=%" PRIu64 " rank=%d ms=%lld rc=%d", method, k.k.run,
                     (int) k.k.rank, (kp_mono_ns() - t0) / 1000000, rc);
        if (rc != 0) {
            finish_error(a, j, code, err);
            kp_an_destroy(an);
            mem_release(a, need);
            return;
        }
    }
    if (a->cfg.cache_bytes > 0 && !writes) {
        cache_put(a, &k, state, batches, out.msg);
    }
    j->sink->reply(j->ud, out.msg);
    out.free_fn(out.state);
    kp_an_destroy(an); /* last: a reply may point into the loaded rank */
    mem_release(a, need);
}

/* ---- the queue's callbacks (kp_workq) ---------------------------------------------------- */

static int worker_init(void *ud, size_t index, void **state, char *err, size_t len)
{
    struct worker *w = calloc(1, sizeof(*w));

    if (w == NULL) {
        snprintf(err, len, "out of memory for analysis worker %zu", index);
        return -ENOMEM;
    }
    w->a = ud;
    *state = w;
    return 0;
}

static void worker_fini(void *ud, void *state)
{
    struct worker *w = state;

    if (w != NULL && w->pg != NULL) {
        PQfinish(w->pg);
    }
    free(w);
}

/* Once when the worker starts (tick_ms 0): connect early, so /readyz tells whether PostgreSQL is
 * there. */
static void worker_tick(void *ud, void *state)
{
    struct worker *w = state;
    char err[512];

    if (w->pg == NULL) {
        pg_get(w, err, sizeof(err));
    }
}

static void worker_run(void *ud, void *state, void *item)
{
    struct job *j = item;
    struct worker *w = state;
    char err[512];

    if (j->pg_fn != NULL) {
        PGconn *pg = pg_get(w, err, sizeof(err));

        j->pg_fn(pg, pg != NULL ? NULL : err, j->ud);
    }
    else {
        run_job(w, j);
    }
    job_free(j);
}

static void worker_cancel(void *ud, void *item)
{
    struct job *j = item;

    if (j->pg_fn != NULL) {
        j->pg_fn(NULL, "kprof-analyzer is shutting down", j->ud);
    }
    else {
        finish_error(ud, j, GRPC_STATUS_UNAVAILABLE, "kprof-analyzer is shutting down");
    }
    job_free(j);
}

/* Whom a request counts against in the queue (kp_workq Fairness): the authenticated caller's
 * name, else the peer's address without its port (a client's connections share it). */
static void client_key(struct kp_rpc_call *call, char *key, size_t len)
{
    const struct kp_identity *id = kp_rpc_call_identity(call);
    const char *peer = kp_rpc_call_peer(call);
    const char *colon;

    if (id != NULL && strcmp(id->via, "none") != 0) {
        snprintf(key, len, "id:%s", id->name);
        return;
    }
    colon = peer != NULL ? strrchr(peer, ':') : NULL;
    snprintf(key, len, "peer:%.*s", colon != NULL ? (int) (colon - peer) : 0, peer);
}

/* Queues j for a worker under the client key; on a full queue logs (at most once a second),
 * counts and returns nonzero (j still the caller's). */
static int enqueue(struct kp_analyzer *a, struct job *j, const char *key, const char *what,
                   const char *peer)
{
    bool log_it = false;
    long long now;

    if (kp_workq_submit_keyed(a->q, j, key) == 0) {
        return 0;
    }
    /* Full, or stopping. */
    now = kp_mono_ns();
    pthread_mutex_lock(&a->mu);
    if (now - a->last_reject_log_ns >= 1000000000LL) {
        a->last_reject_log_ns = now;
        log_it = true;
    }
    pthread_mutex_unlock(&a->mu);
    INC(a->st.rejected);
    if (log_it) {
        kp_log_warn("analysis queue full (or this client's share of it); rejecting method=%s "
                    "peer=%s client=%s queue_max=%lld",
                    what, peer, key, a->cfg.queue_max);
    }
    return -EBUSY;
}

int kp_analyzer_submit(struct kp_analyzer *a, const struct kp_view *view, ProtobufCMessage *req,
                       const char *client, const char *peer, const struct kp_analyzer_sink *sink,
                       void *ud)
{
    struct job tmp = { .sink = sink, .ud = ud, .req = req };
    struct job *j;
    size_t v = 0;

    while (v < kp_n_views && kp_views[v] != view) {
        v++;
    }
    if (v == kp_n_views) {
        tmp.req = NULL;
        protobuf_c_message_free_unpacked(req, NULL);
        finish_error(a, &tmp, GRPC_STATUS_INTERNAL, "not a view of this analyzer");
        return -EINVAL;
    }
    INC(a->st.requests[v]);
    if ((j = calloc(1, sizeof(*j))) == NULL) {
        finish_error(a, &tmp, GRPC_STATUS_RESOURCE_EXHAUSTED, "kprof-analyzer is out of memory");
        protobuf_c_message_free_unpacked(req, NULL);
        return -ENOMEM;
    }
    *j = tmp;
    j->view = v;
    if (enqueue(a, j, client, view->name, peer) == 0) {
        return 0;
    }
    finish_error(a, j, GRPC_STATUS_RESOURCE_EXHAUSTED,
                 "too many analyses queued (for this client); retry later");
    protobuf_c_message_free_unpacked(j->req, NULL); /* not job_free: no release on failure */
    free(j);
    return -EBUSY;
}

int kp_analyzer_submit_pg(struct kp_analyzer *a, const char *client, kp_analyzer_pg_fn *fn,
                          void *ud)
{
    struct job *j = calloc(1, sizeof(*j));

    if (j == NULL) {
        return -ENOMEM;
    }
    j->pg_fn = fn;
    j->ud = ud;
    if (enqueue(a, j, client, "web", "-") != 0) {
        free(j);
        return -EBUSY;
    }
    return 0;
}

/* Every view's method: ud is the view's slot. */
static void on_view(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    struct view_slot *slot = ud;
    char key[KP_WORKQ_KEY_MAX];

    client_key(call, key, sizeof(key));
    kp_rpc_call_ref(call);
    if (kp_analyzer_submit(slot->a, kp_views[slot->view], req, key, kp_rpc_call_peer(call),
                           &grpc_sink, call) != 0) {
        kp_rpc_call_unref(call);
    }
}

/* A view's streaming method (kp_view.stream): one request, then the pages. The call's state:
 * whether its request came. */
struct stream_call {
    struct view_slot *slot;
    bool got_request;
};

static void *on_stream_open(struct kp_rpc_call *call, void *ud)
{
    struct stream_call *c = calloc(1, sizeof(*c));

    (void) call;
    if (c != NULL) {
        c->slot = ud;
    }
    return c;
}

static enum kp_rpc_next on_stream_message(struct kp_rpc_call *call, ProtobufCMessage *msg,
                                          size_t wire_bytes, void *state)
{
    struct stream_call *c = state;
    char key[KP_WORKQ_KEY_MAX];

    (void) wire_bytes;
    if (c == NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "kprof-analyzer is out of memory");
        return KP_RPC_STOP;
    }
    c->got_request = true;
    client_key(call, key, sizeof(key));
    kp_rpc_call_ref(call);
    if (kp_analyzer_submit(c->slot->a, kp_views[c->slot->view], msg, key, kp_rpc_call_peer(call),
                           &grpc_stream_sink, call) != 0) {
        kp_rpc_call_unref(call);
    }
    return KP_RPC_STOP; /* one request: anything after it is not read */
}

static void on_stream_half_close(struct kp_rpc_call *call, void *state)
{
    const struct stream_call *c = state;

    if (c != NULL && !c->got_request) {
        char why[128];

        snprintf(why, sizeof(why), "%s takes one %s; none was sent",
                 kp_views[c->slot->view]->stream, kp_views[c->slot->view]->request->short_name);
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, why);
    }
}

static void on_stream_close(struct kp_rpc_call *call, bool cancelled, void *state)
{
    (void) call;
    (void) cancelled;
    free(state);
}

/* ---- HTTP ------------------------------------------------------------------------------- */

static bool healthz(void *ud)
{
    return true;
}

static bool readyz(void *ud, char *why, size_t len)
{
    struct kp_analyzer *a = ud;

    if (a->server != NULL && !kp_rpc_server_accepting(a->server, why, len)) {
        return false;
    }
    if (!GET(a->st.pg_ok)) {
        snprintf(why, len, "PostgreSQL is not reachable");
        return false;
    }
    return true;
}

static int metrics(void *ud, struct kp_strbuf *out)
{
    struct kp_analyzer *a = ud;
    size_t used, entries, queued, held;

    pthread_mutex_lock(&a->cache_mu);
    used = a->cache_used;
    entries = a->cache_entries;
    pthread_mutex_unlock(&a->cache_mu);
    pthread_mutex_lock(&a->mem_mu);
    held = a->mem_held;
    pthread_mutex_unlock(&a->mem_mu);
    queued = a->q != NULL ? kp_workq_queued(a->q) : 0;
#define METRIC(type, name, help, v)                                                          \
    kp_strbuf_appendf(out,                                                                   \
                      "# HELP kprof_analyzer_" name " " help "\n# TYPE kprof_analyzer_" name \
                      " " type "\nkprof_analyzer_" name " %" PRIu64 "\n",                    \
                      (uint64_t) (v))
    kp_strbuf_appendf(out, "# HELP kprof_analyzer_requests_total Analysis requests received.\n"
                           "# TYPE kprof_analyzer_requests_total counter\n");
    for (size_t v = 0; v < kp_n_views; v++) {
        kp_strbuf_appendf(out, "kprof_analyzer_requests_total{method=\"%s\"} %" PRIu64 "\n",
                          kp_views[v]->name, GET(a->st.requests[v]));
    }
    METRIC("counter", "errors_total", "Requests answered with an error status.", GET(a->st.errors));
    METRIC("counter", "rejected_total", "Requests refused because the queue was full.",
           GET(a->st.rejected));
    METRIC("counter", "cache_hits_total", "Requests answered from the cache.",
           GET(a->st.cache_hits));
    METRIC("counter", "cache_misses_total", "Requests computed (not cached, or the run changed).",
           GET(a->st.cache_misses));
    METRIC("counter", "cache_evictions_total", "Cached results evicted to make room.",
           GET(a->st.cache_evictions));
    METRIC("gauge", "cache_bytes", "Bytes held by the cache.", used);
    METRIC("gauge", "cache_entries", "Results held by the cache.", entries);
    METRIC("gauge", "queued_requests", "Requests waiting for a worker.", queued);
    METRIC("gauge", "memory_reserved_bytes",
           "Memory the analyses in progress are estimated to hold (--memory-budget).", held);
    METRIC("counter", "memory_refused_total",
           "Requests refused: their estimate alone is over --memory-budget.",
           GET(a->st.memory_refused));
    METRIC("counter", "memory_waits_total",
           "Requests that waited for others to leave room in --memory-budget.",
           GET(a->st.memory_waits));
    METRIC("counter", "grpc_listener_restarts_total",
           "gRPC listeners restarted after they stopped accepting (out of file descriptors).",
           a->server != NULL ? kp_rpc_server_restarts(a->server) : 0);
#undef METRIC
    return 0;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

int kp_analyzer_create(const struct kp_analyzer_config *cfg, struct kp_analyzer **out, char *errbuf,
                       size_t errlen)
{
    struct kp_analyzer *a = calloc(1, sizeof(*a));
    struct kp_rpc_server_opts sopts = {
        .listen = cfg->base.listen,
        .tls_cert_file =
            cfg->base.tls_cert != NULL && cfg->base.tls_cert[0] ? cfg->base.tls_cert : NULL,
        .tls_key_file =
            cfg->base.tls_key != NULL && cfg->base.tls_key[0] ? cfg->base.tls_key : NULL,
        .name = "kprof-analyzer",
        /* Every Analyzer request is a run id, a rank and a few options (under 100 bytes):
         * 64 KiB refuses a client's huge request with RESOURCE_EXHAUSTED before it is
         * buffered, instead of the 64 MiB default that let 30 of them take 1.2 GB. */
        .max_message_bytes = 64u << 10,
    };
    static const struct kp_http_handlers hh = { .healthz = healthz,
                                                .readyz = readyz,
                                                .metrics = metrics };
    static const struct kp_workq_ops ops = { .init = worker_init,
                                             .fini = worker_fini,
                                             .run = worker_run,
                                             .cancel = worker_cancel,
                                             .tick = worker_tick };
    char grpc[32], web[32];
    struct kp_ready_entry ready[2] = { { "grpc", grpc }, { "web", NULL } };
    struct kp_workq_opts qo = { .workers = (size_t) cfg->workers,
                                .queue_max = (size_t) cfg->queue_max };
    int rc;

    if (a == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    a->cfg = *cfg;
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->cache_mu, NULL);
    pthread_mutex_init(&a->mem_mu, NULL);
    pthread_cond_init(&a->mem_cv, NULL);
    if ((rc = kp_daemon_security(&cfg->base, &a->auth, errbuf, errlen)) != 0) {
        goto fail;
    }
    sopts.auth = a->auth;
    sopts.tls_client_ca_file = cfg->base.tls_client_ca;
    if (cfg->workers < 1 || cfg->workers > KP_ANALYZER_MAX_WORKERS || cfg->queue_max < 1) {
        snprintf(errbuf, errlen, "--workers must be 1..%d and --queue-max at least 1",
                 KP_ANALYZER_MAX_WORKERS);
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = kp_workq_create(&qo, &ops, a, &a->q, errbuf, errlen)) != 0) {
        goto fail;
    }
    if (kp_n_views > KP_ANALYZER_MAX_VIEWS) {
        snprintf(errbuf, errlen, "too many views (%zu) for KP_ANALYZER_MAX_VIEWS", kp_n_views);
        rc = -EINVAL;
        goto fail;
    }
    for (size_t i = 0; i < kp_n_views; i++) {
        snprintf(a->paths[i], sizeof(a->paths[i]), "/kprof.v1.Analyzer/%s", kp_views[i]->name);
        a->slots[i] = (struct view_slot){ .a = a, .view = i };
        a->methods[a->n_methods++] = (struct kp_rpc_method){
            .path = a->paths[i],
            .kind = KP_RPC_UNARY,
            .request = kp_views[i]->request,
            .on_request = on_view,
            .ud = &a->slots[i],
            .roles = KP_ROLE_VIEWER,
        };
    }
    for (size_t i = 0; i < kp_n_views; i++) {
        if (kp_views[i]->stream == NULL) {
            continue;
        }
        snprintf(a->stream_paths[i], sizeof(a->stream_paths[i]), "/kprof.v1.Analyzer/%s",
                 kp_views[i]->stream);
        a->methods[a->n_methods++] = (struct kp_rpc_method){
            .path = a->stream_paths[i],
            .kind = KP_RPC_STREAM,
            .request = kp_views[i]->request,
            .on_open = on_stream_open,
            .on_message = on_stream_message,
            .on_half_close = on_stream_half_close,
            .on_close = on_stream_close,
            .ud = &a->slots[i],
            .roles = KP_ROLE_VIEWER,
        };
    }
    /* Methods that are not views go here, after the views: Export streams its reply. */
    if ((rc = kp_export_svc_create(cfg->base.pg_conninfo, (int) cfg->workers, &a->export_svc,
                                   errbuf, errlen)) != 0) {
        goto fail;
    }
    a->methods[a->n_methods++] = *kp_export_svc_method(a->export_svc);
    if ((rc = kp_rpc_server_create(&sopts, a->methods, a->n_methods, &a->server, errbuf, errlen)) !=
        0) {
        goto fail;
    }
    if ((rc = kp_daemon_http_start(cfg->base.http_listen, cfg->base.metrics_token, &hh, a, &a->http,
                                   errbuf, errlen)) != 0) {
        goto fail;
    }
    if (cfg->web_listen != NULL && cfg->web_listen[0] != '\0' &&
        (rc = kp_web_create(a, cfg->web_listen, &a->web, errbuf, errlen)) != 0) {
        goto fail;
    }
    if (a->web == NULL && cfg->web_root != NULL && cfg->web_root[0] != '\0') {
        snprintf(errbuf, errlen, "--web-root is served on --web-listen: give both, or neither");
        rc = KP_ECONFIG;
        goto fail;
    }
    snprintf(grpc, sizeof(grpc), "127.0.0.1:%d", kp_analyzer_port(a));
    if (a->web != NULL) {
        snprintf(web, sizeof(web), "127.0.0.1:%d", kp_web_port(a->web));
    }
    ready[1].value = a->web != NULL ? web : NULL;
    if ((rc = kp_daemon_ready_write(cfg->base.ready_file, ready, 2, a->http, errbuf, errlen)) !=
        0) {
        goto fail;
    }
    kp_log_info("serving grpc=%s port=%d http_port=%d workers=%lld cache_bytes=%lld",
                cfg->base.listen, kp_analyzer_port(a), kp_analyzer_http_port(a), cfg->workers,
                cfg->cache_bytes);
    *out = a;
    return 0;
fail:
    kp_analyzer_destroy(a);
    return rc;
}

int kp_analyzer_port(const struct kp_analyzer *a)
{
    return a->server != NULL ? kp_rpc_server_port(a->server) : 0;
}

int kp_analyzer_http_port(const struct kp_analyzer *a)
{
    return a->http != NULL ? kp_http_port(a->http) : 0;
}

int kp_analyzer_web_port(const struct kp_analyzer *a)
{
    return a->web != NULL ? kp_web_port(a->web) : 0;
}

struct kp_auth *kp_analyzer_auth(struct kp_analyzer *a)
{
    return a->auth;
}

const struct kp_analyzer_config *kp_analyzer_config(const struct kp_analyzer *a)
{
    return &a->cfg;
}

void kp_analyzer_destroy(struct kp_analyzer *a)
{
    if (a == NULL) {
        return;
    }
    pthread_mutex_lock(&a->mem_mu); /* requests waiting for memory give up */
    a->mem_stopping = true;
    pthread_cond_broadcast(&a->mem_cv);
    pthread_mutex_unlock(&a->mem_mu);
    kp_http_destroy(a->http);
    kp_web_destroy(a->web); /* first: its requests wait on the workers, which still run */
    /* Live calls get the grace period; the workers keep answering meanwhile. */
    if (a->server != NULL) {
        kp_rpc_server_shutdown(a->server, a->cfg.shutdown_grace_ms);
    }
    kp_export_svc_destroy(a->export_svc); /* its calls are over: their threads end */
    kp_workq_destroy(a->q);               /* queued requests are answered UNAVAILABLE */
    kp_rpc_server_destroy(a->server);
    while (a->lru_head != NULL) {
        cache_drop(a, a->lru_head);
    }
    pthread_mutex_destroy(&a->cache_mu);
    pthread_mutex_destroy(&a->mem_mu);
    pthread_cond_destroy(&a->mem_cv);
    pthread_mutex_destroy(&a->mu);
    kp_auth_destroy(a->auth);
    free(a);
}
