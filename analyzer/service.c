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

#include "compare.h"
#include "compare_pb.h"
#include "counters.h"
#include "export_rpc.h"
#include "kp_analyzer.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_rpc.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"
#include "pyprof.h"
#include "recommend.h"
#include "roofline.h"

#define KP_ANALYZER_MAX_WORKERS 64

enum view {
    VIEW_BREAKDOWN,
    VIEW_OPS,
    VIEW_KERNELS,
    VIEW_PROF,
    VIEW_ROOFLINE,
    VIEW_COUNTERS,
    VIEW_COMPARE,
    VIEW_COUNT
};

static const char *const view_names[VIEW_COUNT] = { "Breakdown", "Ops",      "Kernels", "Prof",
                                                    "Roofline",  "Counters", "Compare" };

struct job {
    enum view view;
    struct kp_rpc_call *call; /* a reference */
    ProtobufCMessage *req;    /* owned */
    struct job *next;
};

/* What a cached reply was computed from. */
struct cache_key {
    uint64_t run;
    int32_t rank;
    enum view view;
    int option; /* plugin_compat or group_by */
    /* Compare's options (zero for the other views): the comparison's (step, thresholds as
     * fractions of the percentages below, the row budget), or HTA's call (cmp_hta, the step
     * and hta_k alone). */
    struct kp_cmp_opts cmp;
    double late_pct, excess_pct, step_pct;
    bool cmp_hta;
    int hta_k;
};

struct cache_entry {
    struct cache_key key;
    int state;       /* runs.state when computed */
    int64_t batches; /* the run's committed ingest batches when computed */
    uint8_t *packed; /* the packed reply (cached = false) */
    size_t len;
    struct cache_entry *prev, *next; /* most recently used first */
};

struct worker {
    struct kp_analyzer *a;
    pthread_t thread;
    bool started;
    PGconn *pg;
    struct kp_complain pg_complain;
};

struct stats {
    uint64_t requests[VIEW_COUNT];
    uint64_t errors; /* answered with a status other than OK */
    uint64_t rejected;
    uint64_t cache_hits, cache_misses, cache_evictions;
    uint64_t pg_ok; /* 1 while the last connection attempt or query worked */
};

struct kp_analyzer {
    struct kp_analyzer_config cfg;                /* borrowed strings */
    struct kp_rpc_method methods[VIEW_COUNT + 1]; /* the views, then Export */
    struct kp_export_svc *export_svc;             /* Analyzer.Export (export_rpc.h) */
    struct kp_rpc_server *server;
    struct kp_http *http;
    struct worker workers[KP_ANALYZER_MAX_WORKERS];
    size_t n_workers;

    pthread_mutex_t mu; /* the queue */
    pthread_cond_t cond;
    struct job *head, *tail;
    size_t queued;
    bool stopping;
    long long last_reject_log_ns;

    pthread_mutex_t cache_mu; /* the cache list and its byte count */
    struct cache_entry *lru_head, *lru_tail;
    size_t cache_used, cache_entries;

    struct stats st; /* __atomic */
};

#define INC(field) __atomic_add_fetch(&(field), 1, __ATOMIC_RELAXED)
#define GET(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

static long long mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void job_free(struct job *j)
{
    protobuf_c_message_free_unpacked(j->req, NULL);
    kp_rpc_call_unref(j->call);
    free(j);
}

static void finish_error(struct kp_analyzer *a, struct kp_rpc_call *call, grpc_status_code code,
                         const char *details)
{
    INC(a->st.errors);
    kp_rpc_call_finish(call, code, details);
}

/* ---- cache ------------------------------------------------------------------------------ */

static bool key_eq(const struct cache_key *x, const struct cache_key *y)
{
    return x->run == y->run && x->rank == y->rank && x->view == y->view && x->option == y->option &&
           x->cmp.has_step == y->cmp.has_step && x->cmp.step == y->cmp.step &&
           x->cmp.late_frac == y->cmp.late_frac && x->cmp.excess_frac == y->cmp.excess_frac &&
           x->cmp.step_frac == y->cmp.step_frac && x->cmp.max_rows == y->cmp.max_rows &&
           x->cmp_hta == y->cmp_hta && x->hta_k == y->hta_k;
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

/* ---- computing a reply ------------------------------------------------------------------ */

/* Compare's options into k (see struct cache_key), the row budget the smaller of the request's
 * and the analyzer's; or false with INVALID_ARGUMENT's details in err. */
static bool parse_compare(const Kprof__V1__CompareRequest *r, size_t max_rows, struct cache_key *k,
                          char *err, size_t len)
{
    const Kprof__V1__CompareThresholds *t = r->thresholds;

    kp_cmp_opts_init(&k->cmp);
    k->cmp.has_step = r->has_step;
    k->cmp.step = r->has_step ? r->step : 0;
    if (r->has_step && r->step < 0) {
        snprintf(err, len, "step %" PRId64 " is negative", r->step);
        return false;
    }
    if (r->hta) {
        if (r->save_offsets) {
            snprintf(err, len, "save_offsets goes with kprof's own comparison, not hta");
            return false;
        }
        if (r->hta_candidates > KP_CMP_MAX_RANKS) {
            snprintf(err, len, "hta_candidates %u is over %d", (unsigned) r->hta_candidates,
                     KP_CMP_MAX_RANKS);
            return false;
        }
        k->cmp_hta = true;
        k->hta_k = r->hta_candidates == 0 ? 2 : (int) r->hta_candidates; /* HTA's default */
        k->cmp.late_frac = k->cmp.excess_frac = k->cmp.step_frac = 0.0;
        return true;
    }
    k->late_pct = t != NULL ? t->late_pct : 100.0 * KP_CMP_DEFAULT_LATE_FRAC;
    k->excess_pct = t != NULL ? t->excess_pct : 100.0 * KP_CMP_DEFAULT_EXCESS_FRAC;
    k->step_pct = t != NULL ? t->step_pct : 100.0 * KP_CMP_DEFAULT_STEP_FRAC;
    /* written so that NaN fails too */
    if (!(k->late_pct >= 0.0 && k->late_pct <= 10000.0) ||
        !(k->excess_pct >= 0.0 && k->excess_pct <= 10000.0) ||
        !(k->step_pct >= 0.0 && k->step_pct <= 100.0)) {
        snprintf(err, len,
                 "thresholds late_pct %g, excess_pct %g (0..10000) and step_pct %g (0..100) "
                 "are out of range",
                 k->late_pct, k->excess_pct, k->step_pct);
        return false;
    }
    k->cmp.late_frac = k->late_pct / 100.0;
    k->cmp.excess_frac = k->excess_pct / 100.0;
    k->cmp.step_frac = k->step_pct / 100.0;
    k->cmp.max_rows = max_rows == 0                                ? (size_t) r->max_rows
                      : r->max_rows == 0 || r->max_rows > max_rows ? max_rows
                                                                   : (size_t) r->max_rows;
    return true;
}

/* The request's run, rank and option, or INVALID_ARGUMENT's details in err. */
static bool parse_request(const struct job *j, size_t max_rows, struct cache_key *k, char *err,
                          size_t len)
{
    uint64_t run;
    int32_t rank;
    int option, max_option = 1;

    switch (j->view) {
    case VIEW_BREAKDOWN: {
        const Kprof__V1__BreakdownRequest *r = (const Kprof__V1__BreakdownRequest *) j->req;

        run = r->run_id;
        rank = r->rank;
        option = r->plugin_compat ? 1 : 0;
        break;
    }
    case VIEW_OPS: {
        const Kprof__V1__OpsRequest *r = (const Kprof__V1__OpsRequest *) j->req;

        run = r->run_id;
        rank = r->rank;
        option = (int) r->group_by;
        break;
    }
    case VIEW_PROF: {
        const Kprof__V1__ProfRequest *r = (const Kprof__V1__ProfRequest *) j->req;

        run = r->run_id;
        rank = r->rank;
        option = 0;
        break;
    }
    case VIEW_ROOFLINE: {
        const Kprof__V1__RooflineRequest *r = (const Kprof__V1__RooflineRequest *) j->req;

        run = r->run_id;
        rank = r->rank;
        option = (int) r->group_by;
        break;
    }
    case VIEW_COUNTERS: {
        const Kprof__V1__CountersRequest *r = (const Kprof__V1__CountersRequest *) j->req;

        run = r->run_id;
        rank = r->rank;
        option = 0; /* columns and format are the client's */
        break;
    }
    case VIEW_COMPARE: {
        const Kprof__V1__CompareRequest *r = (const Kprof__V1__CompareRequest *) j->req;

        run = r->run_id;
        rank = 0; /* every rank */
        option = 0;
        if (!parse_compare(r, max_rows, k, err, len)) {
            return false;
        }
        break;
    }
    default: {
        const Kprof__V1__KernelsRequest *r = (const Kprof__V1__KernelsRequest *) j->req;

        run = r->run_id;
        rank = r->rank;
        option = (int) r->group_by;
        break;
    }
    }
    if (run == 0 || run > INT32_MAX) {
        snprintf(err, len, "run_id %" PRIu64 " is not a run id: `kprofctl runs` lists the runs",
                 run);
        return false;
    }
    if (rank < 0) {
        snprintf(err, len, "rank %d is negative", (int) rank);
        return false;
    }
    if (option < 0 || option > max_option) {
        snprintf(err, len, "group_by %d is not a known grouping", option);
        return false;
    }
    k->run = run;
    k->rank = rank;
    k->view = j->view;
    k->option = option;
    return true;
}

static PGconn *pg_get(struct worker *w, char *err, size_t len)
{
    if (w->pg != NULL && PQstatus(w->pg) == CONNECTION_OK) {
        return w->pg;
    }
    if (w->pg != NULL) {
        PQfinish(w->pg);
        w->pg = NULL;
    }
    if (kp_pg_connect(w->a->cfg.pg_conninfo, "kprof-analyzer", &w->pg, err, len) != 0) {
        __atomic_store_n(&w->a->st.pg_ok, 0, __ATOMIC_RELAXED);
        kp_complain(&w->pg_complain, KP_LOG_ERROR, KP_LOG_MODULE,
                    "PostgreSQL unreachable for analyses err=\"%s\"", err);
        return NULL;
    }
    __atomic_store_n(&w->a->st.pg_ok, 1, __ATOMIC_RELAXED);
    kp_release(&w->pg_complain, KP_LOG_MODULE, "PostgreSQL reachable again for analyses");
    return w->pg;
}

/* The run's version: its state and committed batch count. Returns 0, KP_ENOTFOUND or
 * KP_EPG, with a message in err. */
static int run_version(PGconn *pg, uint64_t run, int *state, int64_t *batches, char *err,
                       size_t len)
{
    char id[32];
    const char *params[1] = { id };
    PGresult *r = NULL;
    int rc;

    snprintf(id, sizeof(id), "%" PRIu64, run);
    rc = kp_pg_query(pg,
                     "SELECT state, (SELECT count(*) FROM ingest_batches WHERE run_id = $1) "
                     "FROM runs WHERE id = $1",
                     1, params, &r, err, len);
    if (rc != 0) {
        return rc;
    }
    if (PQntuples(r) == 0) {
        snprintf(err, len, "run %" PRIu64 " does not exist: `kprofctl runs` lists the runs", run);
        PQclear(r);
        return KP_ENOTFOUND;
    }
    *state = atoi(PQgetvalue(r, 0, 0));
    *batches = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return 0;
}

static void fill_breakdown(Kprof__V1__BreakdownResponse *m, const struct kp_an_breakdown *b,
                           Kprof__V1__BreakdownStep *steps, Kprof__V1__BreakdownStep **step_ptrs,
                           Kprof__V1__StepCosts *costs, Kprof__V1__AverageCosts *avg,
                           Kprof__V1__GpuUtilization *gpus, Kprof__V1__GpuUtilization **gpu_ptrs)
{
    m->has_runtime = b->has_runtime;
    m->has_kernel = b->has_kernel;
    m->has_memcpy_or_memset = b->has_memcpy_or_memset;
    m->has_communication = b->has_communication;
    m->comm_node_count = b->comm_node_count;
    for (size_t i = 0; i < b->n_steps; i++) {
        const struct kp_an_step *s = &b->steps[i];
        Kprof__V1__StepCosts *c = &costs[i];

        kprof__v1__breakdown_step__init(&steps[i]);
        kprof__v1__step_costs__init(c);
        steps[i].name = (char *) s->name;
        steps[i].start_ns = s->start_ns;
        steps[i].end_ns = s->end_ns;
        c->kernel_ns = s->cost_ns[KP_AN_KERNEL];
        c->memcpy_ns = s->cost_ns[KP_AN_MEMCPY];
        c->memset_ns = s->cost_ns[KP_AN_MEMSET];
        c->communication_ns = s->cost_ns[KP_AN_COMMUNICATION];
        c->runtime_ns = s->cost_ns[KP_AN_RUNTIME];
        c->dataloader_ns = s->cost_ns[KP_AN_DATALOADER];
        c->cpu_exec_ns = s->cost_ns[KP_AN_CPU_EXEC];
        c->other_ns = s->cost_ns[KP_AN_OTHER];
        steps[i].cost = c;
        steps[i].computation_ns = s->computation_ns;
        steps[i].communication_ns = s->communication_ns;
        steps[i].overlap_ns = s->overlap_ns;
        step_ptrs[i] = &steps[i];
    }
    m->n_steps = b->n_steps;
    m->steps = step_ptrs;
    kprof__v1__average_costs__init(avg);
    avg->kernel_ns = b->avg_ns[KP_AN_KERNEL];
    avg->memcpy_ns = b->avg_ns[KP_AN_MEMCPY];
    avg->memset_ns = b->avg_ns[KP_AN_MEMSET];
    avg->communication_ns = b->avg_ns[KP_AN_COMMUNICATION];
    avg->runtime_ns = b->avg_ns[KP_AN_RUNTIME];
    avg->dataloader_ns = b->avg_ns[KP_AN_DATALOADER];
    avg->cpu_exec_ns = b->avg_ns[KP_AN_CPU_EXEC];
    avg->other_ns = b->avg_ns[KP_AN_OTHER];
    avg->total_ns = b->avg_total_ns;
    m->average = avg;
    for (size_t i = 0; i < b->n_gpus; i++) {
        kprof__v1__gpu_utilization__init(&gpus[i]);
        gpus[i].gpu_id = b->gpu_ids[i];
        gpus[i].utilization = b->gpu_utilization[i];
        gpus[i].est_sm_efficiency = b->est_sm_efficiency[i];
        gpus[i].est_sm_efficiency_defined = b->est_sm_efficiency_defined[i];
        gpus[i].est_achieved_occupancy = b->est_achieved_occupancy[i];
        gpus[i].est_achieved_occupancy_defined = b->est_achieved_occupancy_defined[i];
        gpu_ptrs[i] = &gpus[i];
    }
    m->n_gpus = b->n_gpus;
    m->gpus = gpu_ptrs;
}

/* PyProf's table of the rank as a ProfResponse into *m; the rows point into p and arrays
 * (freed by the caller). Returns 0 or -ENOMEM. */
static int fill_prof(Kprof__V1__ProfResponse *m, const struct kp_prof *p, void **rows_out,
                     void **ptrs_out)
{
    size_t n;
    const struct kp_prof_row *r = kp_prof_rows(p, &n);
    Kprof__V1__ProfRow *rows, **ptrs;

    rows = *rows_out = calloc(n ? n : 1, sizeof(*rows));
    ptrs = *ptrs_out = calloc(n ? n : 1, sizeof(*ptrs));
    if (rows == NULL || ptrs == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        Kprof__V1__ProfRow *o = &rows[i];

        kprof__v1__prof_row__init(o);
        o->idx = r[i].idx;
        o->seq = r[i].seq;
        o->altseq = (char *) r[i].altseq;
        o->tid = r[i].tid;
        o->layer = (char *) r[i].layer;
        o->trace = (char *) r[i].trace;
        o->bprop = r[i].bwd;
        o->sub = r[i].sub;
        o->mod = (char *) r[i].mod;
        o->op = (char *) r[i].op;
        o->kernel = (char *) r[i].kernel;
        o->params = (char *) r[i].params;
        o->sil_ns = r[i].sil_ns;
        o->tc = (char *) r[i].tc;
        o->device = r[i].device;
        o->stream = r[i].stream;
        o->grid = (char *) r[i].grid;
        o->block = (char *) r[i].block;
        o->flops = r[i].flops;
        o->flops_known = r[i].flops_known;
        o->bytes = r[i].bytes;
        o->bytes_known = r[i].bytes_known;
        ptrs[i] = o;
    }
    m->n_rows = n;
    m->rows = ptrs;
    return 0;
}

/* The roofline as a RooflineResponse into *m, pointing into rl and the arrays (freed by the
 * caller). Returns 0 or -ENOMEM. */
static int fill_roofline(Kprof__V1__RooflineResponse *m, const struct kp_rl *rl, void **devs_out,
                         void **dptrs_out, void **rows_out, void **ptrs_out)
{
    size_t nd, n;
    const struct kp_rl_device *d = kp_rl_devices(rl, &nd);
    const struct kp_rl_row *r = kp_rl_rows(rl, &n);
    Kprof__V1__RooflineDevice *devs, **dptrs;
    Kprof__V1__RooflineRow *rows, **ptrs;

    devs = *devs_out = calloc(nd ? nd : 1, sizeof(*devs));
    dptrs = *dptrs_out = calloc(nd ? nd : 1, sizeof(*dptrs));
    rows = *rows_out = calloc(n ? n : 1, sizeof(*rows));
    ptrs = *ptrs_out = calloc(n ? n : 1, sizeof(*ptrs));
    if (devs == NULL || dptrs == NULL || rows == NULL || ptrs == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < nd; i++) {
        Kprof__V1__RooflineDevice *o = &devs[i];

        kprof__v1__roofline_device__init(o);
        o->id = d[i].id;
        o->name = (char *) d[i].name;
        o->entry = (char *) d[i].entry;
        o->source = (char *) d[i].source;
        o->peak_fp32_flop_per_s = d[i].peak_flop_per_s[KP_RL_FP32];
        o->peak_tf32_flop_per_s = d[i].peak_flop_per_s[KP_RL_TF32_TC];
        o->peak_fp16_flop_per_s = d[i].peak_flop_per_s[KP_RL_FP16_TC];
        o->peak_fp8_flop_per_s = d[i].peak_flop_per_s[KP_RL_FP8_TC];
        o->bandwidth_bytes_per_s = d[i].bandwidth_bytes_per_s;
        dptrs[i] = o;
    }
    for (size_t i = 0; i < n; i++) {
        Kprof__V1__RooflineRow *o = &rows[i];

        kprof__v1__roofline_row__init(o);
        o->name = (char *) r[i].name;
        o->dir = (char *) r[i].dir;
        o->device = r[i].device;
        o->peak = (char *) r[i].peak;
        o->kernels = r[i].kernels;
        o->time_ns = r[i].time_ns;
        o->flops = r[i].flops;
        o->flops_known = r[i].flops_known;
        o->bytes = r[i].bytes;
        o->bytes_known = r[i].bytes_known;
        o->flop_per_s = r[i].flop_per_s;
        o->flop_per_s_defined = r[i].flop_per_s_defined;
        o->bytes_per_s = r[i].bytes_per_s;
        o->bytes_per_s_defined = r[i].bytes_per_s_defined;
        o->intensity = r[i].intensity;
        o->intensity_defined = r[i].intensity_defined;
        o->peak_flop_per_s = r[i].peak_flop_per_s;
        o->compute_fraction = r[i].compute_fraction;
        o->compute_fraction_defined = r[i].compute_fraction_defined;
        o->bandwidth_bytes_per_s = r[i].bandwidth_bytes_per_s;
        o->bandwidth_fraction = r[i].bandwidth_fraction;
        o->bandwidth_fraction_defined = r[i].bandwidth_fraction_defined;
        ptrs[i] = o;
    }
    m->n_devices = nd;
    m->devices = dptrs;
    m->n_rows = n;
    m->rows = ptrs;
    return 0;
}

/* The counters table of the rank, read in one snapshot (its queries see the same rows).
 * Returns as kp_ctr_build. */
static int build_counters(PGconn *pg, const struct cache_key *k, size_t max_rows,
                          struct kp_ctr **out, char *err, size_t len)
{
    char ignored[256];
    int rc;

    if ((rc = kp_pg_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err, len)) != 0) {
        return rc;
    }
    rc = kp_ctr_build(pg, (int64_t) k->run, (int) k->rank, max_rows, out, err, len);
    /* A failed COMMIT or ROLLBACK leaves a broken connection, which pg_get replaces. */
    (void) kp_pg_exec(pg, rc == 0 ? "COMMIT" : "ROLLBACK", ignored, sizeof(ignored));
    return rc;
}

/* The counters table as a CountersResponse into *m, pointing into t and the arrays (freed by
 * the caller). Returns 0 or -ENOMEM. */
static int fill_counters(Kprof__V1__CountersResponse *m, const struct kp_ctr *t, void **rows_out,
                         void **ptrs_out)
{
    size_t n, nm;
    const struct kp_ctr_row *r = kp_ctr_rows(t, &n);
    const char *const *metrics = kp_ctr_metrics(t, &nm);
    Kprof__V1__CountersRow *rows, **ptrs;

    rows = *rows_out = calloc(n ? n : 1, sizeof(*rows));
    ptrs = *ptrs_out = calloc(n ? n : 1, sizeof(*ptrs));
    if (rows == NULL || ptrs == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        Kprof__V1__CountersRow *o = &rows[i];

        kprof__v1__counters_row__init(o);
        o->idx = r[i].idx;
        o->range = r[i].range;
        o->device = r[i].device;
        o->correlation = r[i].correlation;
        o->tid = r[i].tid;
        o->kernel = (char *) r[i].kernel;
        o->n_op_stack = r[i].n_stack;
        o->op_stack = (char **) r[i].stack;
        o->dur_ns = r[i].dur_ns;
        o->n_values = nm;
        o->values = r[i].values;
        o->flops = r[i].flops;
        o->flops_fp64 = r[i].flops_prec[KP_CTR_FP64];
        o->flops_fp32 = r[i].flops_prec[KP_CTR_FP32];
        o->flops_fp16 = r[i].flops_prec[KP_CTR_FP16];
        o->flops_per_s = r[i].flops_per_s;
        ptrs[i] = o;
    }
    m->n_metrics = nm;
    m->metrics = (char **) metrics;
    m->n_rows = n;
    m->rows = ptrs;
    m->message = (char *) (kp_ctr_message(t) != NULL ? kp_ctr_message(t) : "");
    return 0;
}

/* Compares the ranks of the run (or makes HTA's call) in one snapshot and answers it; caches
 * the comparison on success. With save_offsets, the snapshot is a read-write transaction that
 * also writes the clock offsets, committed before the answer; a failed write is answered here
 * (INTERNAL, or UNAVAILABLE when the connection broke), not cached. Returns 0 when answered,
 * or as kp_cmp_run (-EINVAL, KP_ENOTFOUND, KP_EPG, KP_ETOOBIG, -ENOMEM with a message in err)
 * when nothing was sent. */
static int compare_and_reply(struct kp_analyzer *a, PGconn *pg, struct job *j,
                             const struct cache_key *k, int state, int64_t batches, char *err,
                             size_t errlen)
{
    const Kprof__V1__CompareRequest *req = (const Kprof__V1__CompareRequest *) j->req;
    bool save = req->save_offsets && !k->cmp_hta, in_tx = false;
    struct kp_cmp_result *res = NULL;
    struct kp_cmp_hta *hta = NULL;
    char ignored[256], details[700];
    struct kp_cmp_pb pb;
    size_t n_saved = 0;
    int rc;

    memset(&pb, 0, sizeof(pb));
    rc = kp_pg_exec(pg,
                    save ? "BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL jit = off"
                         : "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL jit = off",
                    err, errlen);
    if (rc != 0) {
        goto out;
    }
    in_tx = true;
    if (k->cmp_hta) {
        rc = kp_cmp_hta(pg, (int64_t) k->run, k->cmp.has_step, k->cmp.step, k->hta_k, &hta, err,
                        errlen);
        rc = rc != 0 ? rc : kp_cmp_pb_init_hta(&pb, hta, k->hta_k);
        goto built;
    }
    if ((rc = kp_cmp_run(pg, (int64_t) k->run, &k->cmp, &res, err, errlen)) != 0) {
        goto out;
    }
    if (save) {
        char why[512];

        if (kp_cmp_save_offsets(pg, res, &n_saved, why, sizeof(why)) != 0 ||
            kp_pg_exec(pg, "COMMIT", why, sizeof(why)) != 0) {
            bool broken = PQstatus(pg) != CONNECTION_OK;

            kp_log_warn("saving clock offsets failed run=%" PRIu64 " err=\"%s\"", k->run, why);
            snprintf(details, sizeof(details), "cannot save the clock offsets: %s%s", why,
                     broken ? "; retry later" : "");
            finish_error(a, j->call, broken ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_INTERNAL,
                         details);
            rc = 0;
            goto out;
        }
        in_tx = false;
    }
    rc = kp_cmp_pb_init(&pb, res);
    pb.thresholds.late_pct = k->late_pct;
    pb.thresholds.excess_pct = k->excess_pct;
    pb.thresholds.step_pct = k->step_pct;
    pb.msg.thresholds = &pb.thresholds;
built:
    if (rc != 0) {
        goto out;
    }
    if (in_tx) {
        /* A failed COMMIT leaves a broken connection, which pg_get replaces; a read-only
         * snapshot has nothing to lose. */
        (void) kp_pg_exec(pg, "COMMIT", ignored, sizeof(ignored));
        in_tx = false;
    }
    pb.msg.run_id = k->run;
    if (a->cfg.cache_bytes > 0) {
        cache_put(a, k, state, batches, &pb.msg.base); /* offsets_saved 0: it is this call's */
    }
    pb.msg.offsets_saved = (uint32_t) n_saved;
    kp_rpc_call_reply(j->call, &pb.msg.base);
out:
    if (in_tx) {
        (void) kp_pg_exec(pg, "ROLLBACK", ignored, sizeof(ignored));
    }
    kp_cmp_pb_fini(&pb);
    kp_cmp_result_destroy(res);
    kp_cmp_hta_destroy(hta);
    return rc;
}

/* Computes the view on a loaded rank and answers it; caches it on success. Returns 0, or a
 * negative code (-ENOMEM, KP_EPG, KP_ETOOBIG with a message in err) when nothing was sent. */
static int compute_and_reply(struct kp_analyzer *a, struct kp_an *an, PGconn *pg, struct job *j,
                             const struct cache_key *k, int state, int64_t batches, char *err,
                             size_t errlen)
{
    void *arr1 = NULL, *arr2 = NULL, *arr3 = NULL, *arr4 = NULL, *arr5 = NULL;
    ProtobufCMessage *msg = NULL;
    Kprof__V1__BreakdownResponse bm = KPROF__V1__BREAKDOWN_RESPONSE__INIT;
    Kprof__V1__AverageCosts avg;
    Kprof__V1__OpsResponse om = KPROF__V1__OPS_RESPONSE__INIT;
    Kprof__V1__KernelsResponse km = KPROF__V1__KERNELS_RESPONSE__INIT;
    Kprof__V1__TensorCoreStats tcs = KPROF__V1__TENSOR_CORE_STATS__INIT;
    Kprof__V1__TensorCoreGpu tcg[KP_AN_MAX_GPUS], *tcg_ptrs[KP_AN_MAX_GPUS];
    Kprof__V1__ProfResponse pm = KPROF__V1__PROF_RESPONSE__INIT;
    Kprof__V1__RooflineResponse rm = KPROF__V1__ROOFLINE_RESPONSE__INIT;
    Kprof__V1__CountersResponse cm = KPROF__V1__COUNTERS_RESPONSE__INIT;
    struct kp_prof *prof = NULL;
    struct kp_rl *rl = NULL;
    struct kp_ctr *ctr = NULL;
    struct kp_an_recs recs = { 0 };
    int rc;

    if (k->view == VIEW_BREAKDOWN) {
        const struct kp_an_breakdown *b;
        size_t n;

        /* the recommendations first: they compute both breakdown figures */
        if ((rc = kp_an_recommend(an, pg, (int64_t) k->run, (int) k->rank, &recs, err, errlen)) !=
                0 ||
            (rc = kp_an_breakdown(an, k->option != 0, &b)) != 0) {
            goto out;
        }
        n = b->n_steps ? b->n_steps : 1;
        arr1 = calloc(n, sizeof(Kprof__V1__BreakdownStep));
        arr2 = calloc(n, sizeof(Kprof__V1__BreakdownStep *));
        arr3 = calloc(n, sizeof(Kprof__V1__StepCosts));
        arr4 = calloc(KP_AN_MAX_GPUS, sizeof(Kprof__V1__GpuUtilization));
        arr5 = calloc(KP_AN_MAX_GPUS, sizeof(Kprof__V1__GpuUtilization *));
        if (!arr1 || !arr2 || !arr3 || !arr4 || !arr5) {
            rc = -ENOMEM;
            goto out;
        }
        fill_breakdown(&bm, b, arr1, arr2, arr3, &avg, arr4, arr5);
        bm.run_id = k->run;
        bm.rank = k->rank;
        bm.plugin_compat = k->option != 0;
        bm.n_recommendations = recs.n_text;
        bm.recommendations = recs.text;
        msg = &bm.base;
    }
    else if (k->view == VIEW_PROF) {
        rc = kp_prof_build(pg, (int64_t) k->run, (int) k->rank, (size_t) a->cfg.max_rows, &prof,
                           err, errlen);
        if (rc == 0) {
            rc = fill_prof(&pm, prof, &arr1, &arr2);
        }
        if (rc != 0) {
            goto out;
        }
        pm.run_id = k->run;
        pm.rank = k->rank;
        msg = &pm.base;
    }
    else if (k->view == VIEW_ROOFLINE) {
        rc = kp_rl_build(pg, (int64_t) k->run, (int) k->rank, (size_t) a->cfg.max_rows,
                         k->option == 1 ? KP_RL_BY_OP : KP_RL_BY_KERNEL, &rl, err, errlen);
        if (rc == 0) {
            rc = fill_roofline(&rm, rl, &arr1, &arr2, &arr3, &arr4);
        }
        if (rc != 0) {
            goto out;
        }
        rm.run_id = k->run;
        rm.rank = k->rank;
        rm.group_by = (Kprof__V1__RooflineGroupBy) k->option;
        msg = &rm.base;
    }
    else if (k->view == VIEW_COUNTERS) {
        rc = build_counters(pg, k, (size_t) a->cfg.max_rows, &ctr, err, errlen);
        if (rc == 0) {
            rc = fill_counters(&cm, ctr, &arr1, &arr2);
        }
        if (rc != 0) {
            goto out;
        }
        cm.run_id = k->run;
        cm.rank = k->rank;
        msg = &cm.base;
    }
    else if (k->view == VIEW_OPS) {
        const struct kp_an_table *t;
        const struct kp_an_op_row *r;
        Kprof__V1__OpRow *rows, **ptrs;

        if ((rc = kp_an_ops(an, k->option != 0, &t)) != 0) {
            goto out;
        }
        r = t->rows;
        rows = arr1 = calloc(t->n ? t->n : 1, sizeof(*rows));
        ptrs = arr2 = calloc(t->n ? t->n : 1, sizeof(*ptrs));
        if (!rows || !ptrs) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < t->n; i++) {
            kprof__v1__op_row__init(&rows[i]);
            rows[i].name = (char *) (r[i].name ? r[i].name : "");
            rows[i].input_shape = (char *) (r[i].input_shape ? r[i].input_shape : "");
            rows[i].calls = r[i].calls;
            rows[i].host_total_ns = r[i].host_total_ns;
            rows[i].host_self_ns = r[i].host_self_ns;
            rows[i].device_total_ns = r[i].device_total_ns;
            rows[i].device_self_ns = r[i].device_self_ns;
            rows[i].tc_self_ns = r[i].tc_self_ns;
            rows[i].tc_total_ns = r[i].tc_total_ns;
            rows[i].tc_eligible = r[i].tc_eligible;
            ptrs[i] = &rows[i];
        }
        om.run_id = k->run;
        om.rank = k->rank;
        om.group_by = (Kprof__V1__OpsGroupBy) k->option;
        om.n_rows = t->n;
        om.rows = ptrs;
        msg = &om.base;
    }
    else {
        const struct kp_an_table *t;
        const struct kp_an_kernel_row *r;
        struct kp_an_tc tc;
        Kprof__V1__KernelRow *rows, **ptrs;
        bool by_op = k->option != 0;

        if ((rc = kp_an_kernels(an, by_op, &t)) != 0 || (rc = kp_an_tensor_cores(an, &tc)) != 0) {
            goto out;
        }
        r = t->rows;
        rows = arr1 = calloc(t->n ? t->n : 1, sizeof(*rows));
        ptrs = arr2 = calloc(t->n ? t->n : 1, sizeof(*ptrs));
        if (!rows || !ptrs) {
            rc = -ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < t->n; i++) {
            kprof__v1__kernel_row__init(&rows[i]);
            rows[i].name = (char *) (r[i].name ? r[i].name : "");
            if (by_op) {
                rows[i].op_name = (char *) (r[i].op_name ? r[i].op_name : "");
                rows[i].grid = (char *) r[i].grid;
                rows[i].block = (char *) r[i].block;
                rows[i].registers = r[i].registers;
                rows[i].shared_memory = r[i].shared_memory;
                rows[i].op_tc_eligible = r[i].op_tc_eligible;
            }
            rows[i].calls = r[i].calls;
            rows[i].total_ns = r[i].total_ns;
            rows[i].min_ns = r[i].min_ns;
            rows[i].max_ns = r[i].max_ns;
            rows[i].tc_used = r[i].tc_used;
            rows[i].mean_blocks_per_sm = r[i].mean_blocks_per_sm;
            rows[i].mean_est_achieved_occupancy = r[i].mean_est_achieved_occupancy;
            ptrs[i] = &rows[i];
        }
        for (size_t i = 0; i < tc.n_gpus && i < KP_AN_MAX_GPUS; i++) {
            kprof__v1__tensor_core_gpu__init(&tcg[i]);
            tcg[i].gpu_id = tc.gpu_ids[i];
            tcg[i].tc_ratio = tc.tc_ratio[i];
            tcg_ptrs[i] = &tcg[i];
        }
        tcs.n_gpus = tc.n_gpus;
        tcs.gpus = tcg_ptrs;
        tcs.tc_ratio_defined = tc.tc_ratio_defined;
        tcs.eligible_ops_kernel_ratio = tc.eligible_ops_kernel_ratio;
        km.run_id = k->run;
        km.rank = k->rank;
        km.group_by = (Kprof__V1__KernelsGroupBy) k->option;
        km.n_rows = t->n;
        km.rows = ptrs;
        km.tensor_cores = &tcs;
        msg = &km.base;
    }
    if (a->cfg.cache_bytes > 0) {
        cache_put(a, k, state, batches, msg);
    }
    kp_rpc_call_reply(j->call, msg);
    rc = 0;
out:
    kp_an_recs_fini(&recs);
    kp_prof_destroy(prof);
    kp_rl_destroy(rl);
    kp_ctr_destroy(ctr);
    free(arr1);
    free(arr2);
    free(arr3);
    free(arr4);
    free(arr5);
    return rc;
}

static const ProtobufCMessageDescriptor *reply_desc(enum view v)
{
    switch (v) {
    case VIEW_BREAKDOWN:
        return &kprof__v1__breakdown_response__descriptor;
    case VIEW_OPS:
        return &kprof__v1__ops_response__descriptor;
    case VIEW_PROF:
        return &kprof__v1__prof_response__descriptor;
    case VIEW_ROOFLINE:
        return &kprof__v1__roofline_response__descriptor;
    case VIEW_COUNTERS:
        return &kprof__v1__counters_response__descriptor;
    case VIEW_COMPARE:
        return &kprof__v1__compare_response__descriptor;
    default:
        return &kprof__v1__kernels_response__descriptor;
    }
}

static void set_cached(enum view v, ProtobufCMessage *m)
{
    switch (v) {
    case VIEW_BREAKDOWN:
        ((Kprof__V1__BreakdownResponse *) m)->cached = true;
        break;
    case VIEW_OPS:
        ((Kprof__V1__OpsResponse *) m)->cached = true;
        break;
    case VIEW_PROF:
        ((Kprof__V1__ProfResponse *) m)->cached = true;
        break;
    case VIEW_ROOFLINE:
        ((Kprof__V1__RooflineResponse *) m)->cached = true;
        break;
    case VIEW_COUNTERS:
        ((Kprof__V1__CountersResponse *) m)->cached = true;
        break;
    case VIEW_COMPARE:
        ((Kprof__V1__CompareResponse *) m)->cached = true;
        break;
    default:
        ((Kprof__V1__KernelsResponse *) m)->cached = true;
        break;
    }
}

static bool save_offsets(const struct job *j)
{
    return ((const Kprof__V1__CompareRequest *) j->req)->save_offsets;
}

static void run_job(struct worker *w, struct job *j)
{
    struct kp_analyzer *a = w->a;
    struct cache_key k;
    char err[512] = "", details[700];
    struct kp_an *an = NULL;
    ProtobufCMessage *hit;
    int64_t batches = 0;
    int state = 0, rc;
    PGconn *pg;

    memset(&k, 0, sizeof(k));
    if (!parse_request(j, (size_t) a->cfg.max_rows, &k, err, sizeof(err))) {
        finish_error(a, j->call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return;
    }
    if ((pg = pg_get(w, err, sizeof(err))) == NULL) {
        snprintf(details, sizeof(details), "PostgreSQL is unreachable (%s); retry later", err);
        finish_error(a, j->call, GRPC_STATUS_UNAVAILABLE, details);
        return;
    }
    rc = run_version(pg, k.run, &state, &batches, err, sizeof(err));
    if (rc == KP_ENOTFOUND) {
        finish_error(a, j->call, GRPC_STATUS_NOT_FOUND, err);
        return;
    }
    if (rc != 0) {
        kp_log_warn("run check failed run=%" PRIu64 " err=\"%s\"", k.run, err);
        snprintf(details, sizeof(details), "PostgreSQL failed (%s); retry later", err);
        finish_error(a, j->call, GRPC_STATUS_UNAVAILABLE, details);
        return;
    }
    /* A request that writes (Compare's save_offsets) is never answered from the cache. */
    if (a->cfg.cache_bytes > 0 && !(k.view == VIEW_COMPARE && save_offsets(j)) &&
        (hit = cache_get(a, &k, state, batches, reply_desc(k.view))) != NULL) {
        INC(a->st.cache_hits);
        set_cached(k.view, hit);
        kp_log_debug("cache hit method=%s run=%" PRIu64 " rank=%d option=%d", view_names[k.view],
                     k.run, (int) k.rank, k.option);
        kp_rpc_call_reply(j->call, hit);
        protobuf_c_message_free_unpacked(hit, NULL);
        return;
    }
    INC(a->st.cache_misses);
    /* Counters and Compare read their own rows (counters.h, compare.h): no kp_an_load. */
    rc = k.view == VIEW_COUNTERS || k.view == VIEW_COMPARE
             ? 0
             : kp_an_load(pg, (int64_t) k.run, (int) k.rank, (size_t) a->cfg.max_rows, &an, err,
                          sizeof(err));
    if (rc == 0) {
        long long t0 = mono_ns();

        err[0] = '\0';
        rc = k.view == VIEW_COMPARE
                 ? compare_and_reply(a, pg, j, &k, state, batches, err, sizeof(err))
                 : compute_and_reply(a, an, pg, j, &k, state, batches, err, sizeof(err));
        kp_log_debug("computed method=%s run=%" PRIu64 " rank=%d option=%d ms=%lld",
                     view_names[k.view], k.run, (int) k.rank, k.option, (mono_ns() - t0) / 1000000);
        if (rc != 0 && err[0] == '\0') {
            snprintf(err, sizeof(err), "%s", kp_strerror(rc));
        }
    }
    kp_an_destroy(an);
    switch (rc) {
    case 0:
        break;
    case KP_ENOTFOUND:
        finish_error(a, j->call, GRPC_STATUS_NOT_FOUND, err);
        break;
    case -EINVAL: /* options the analysis itself refuses */
        finish_error(a, j->call, GRPC_STATUS_INVALID_ARGUMENT, err);
        break;
    case KP_ETOOBIG:
    case -ENOMEM:
        kp_log_warn("analysis refused method=%s run=%" PRIu64 " rank=%d err=\"%s\"",
                    view_names[k.view], k.run, (int) k.rank, err);
        finish_error(a, j->call, GRPC_STATUS_RESOURCE_EXHAUSTED, err);
        break;
    default:
        kp_log_warn("analysis failed method=%s run=%" PRIu64 " rank=%d err=\"%s\"",
                    view_names[k.view], k.run, (int) k.rank, err);
        snprintf(details, sizeof(details), "PostgreSQL failed (%s); retry later", err);
        finish_error(a, j->call, GRPC_STATUS_UNAVAILABLE, details);
        break;
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kp_analyzer *a = w->a;
    char err[512];

    /* Connect early so /readyz tells whether PostgreSQL is there. */
    pg_get(w, err, sizeof(err));
    for (;;) {
        struct job *j;
        bool stop;

        pthread_mutex_lock(&a->mu);
        while (a->head == NULL && !a->stopping) {
            pthread_cond_wait(&a->cond, &a->mu);
        }
        j = a->head;
        if (j != NULL) {
            a->head = j->next;
            if (a->head == NULL) {
                a->tail = NULL;
            }
            a->queued--;
        }
        stop = a->stopping;
        pthread_mutex_unlock(&a->mu);
        if (j == NULL) {
            break;
        }
        if (stop) {
            finish_error(a, j->call, GRPC_STATUS_UNAVAILABLE, "kprof-analyzer is shutting down");
        }
        else {
            run_job(w, j);
        }
        job_free(j);
    }
    return NULL;
}

static void enqueue(struct kp_analyzer *a, enum view v, struct kp_rpc_call *call,
                    ProtobufCMessage *req)
{
    struct job *j = calloc(1, sizeof(*j));
    bool full, log_it = false;

    INC(a->st.requests[v]);
    if (j == NULL) {
        protobuf_c_message_free_unpacked(req, NULL);
        finish_error(a, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "kprof-analyzer is out of memory");
        return;
    }
    j->view = v;
    j->call = call;
    j->req = req;
    kp_rpc_call_ref(call);
    pthread_mutex_lock(&a->mu);
    full = a->queued >= (size_t) a->cfg.queue_max || a->stopping;
    if (!full) {
        if (a->tail != NULL) {
            a->tail->next = j;
        }
        else {
            a->head = j;
        }
        a->tail = j;
        a->queued++;
        pthread_cond_signal(&a->cond);
    }
    else {
        long long now = mono_ns();

        if (now - a->last_reject_log_ns >= 1000000000LL) {
            a->last_reject_log_ns = now;
            log_it = true;
        }
    }
    pthread_mutex_unlock(&a->mu);
    if (full) {
        INC(a->st.rejected);
        if (log_it) {
            kp_log_warn("analysis queue full; rejecting method=%s peer=%s queue_max=%lld",
                        kp_rpc_call_method(call), kp_rpc_call_peer(call), a->cfg.queue_max);
        }
        finish_error(a, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                     "too many analyses queued; retry later");
        job_free(j);
    }
}

static void on_breakdown(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, VIEW_BREAKDOWN, call, req);
}

static void on_ops(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, VIEW_OPS, call, req);
}

static void on_kernels(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, VIEW_KERNELS, call, req);
}

static void on_prof(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, VIEW_PROF, call, req);
}

static void on_roofline(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, VIEW_ROOFLINE, call, req);
}

static void on_counters(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, VIEW_COUNTERS, call, req);
}

static void on_compare(struct kp_rpc_call *call, ProtobufCMessage *req, void *ud)
{
    enqueue(ud, VIEW_COMPARE, call, req);
}

/* ---- HTTP ------------------------------------------------------------------------------- */

static bool healthz(void *ud)
{
    return true;
}

static bool readyz(void *ud, char *why, size_t len)
{
    struct kp_analyzer *a = ud;

    if (!GET(a->st.pg_ok)) {
        snprintf(why, len, "PostgreSQL is not reachable");
        return false;
    }
    return true;
}

static int metrics(void *ud, struct kp_strbuf *out)
{
    struct kp_analyzer *a = ud;
    size_t used, entries, queued;

    pthread_mutex_lock(&a->cache_mu);
    used = a->cache_used;
    entries = a->cache_entries;
    pthread_mutex_unlock(&a->cache_mu);
    pthread_mutex_lock(&a->mu);
    queued = a->queued;
    pthread_mutex_unlock(&a->mu);
#define METRIC(type, name, help, v)                                                          \
    kp_strbuf_appendf(out,                                                                   \
                      "# HELP kprof_analyzer_" name " " help "\n# TYPE kprof_analyzer_" name \
                      " " type "\nkprof_analyzer_" name " %" PRIu64 "\n",                    \
                      (uint64_t) (v))
    kp_strbuf_appendf(out, "# HELP kprof_analyzer_requests_total Analysis requests received.\n"
                           "# TYPE kprof_analyzer_requests_total counter\n");
    for (int v = 0; v < VIEW_COUNT; v++) {
        kp_strbuf_appendf(out, "kprof_analyzer_requests_total{method=\"%s\"} %" PRIu64 "\n",
                          view_names[v], GET(a->st.requests[v]));
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
#undef METRIC
    return 0;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static int write_ready_file(const struct kp_analyzer *a, char *errbuf, size_t errlen)
{
    char tmp[4096];
    FILE *f;

    if (a->cfg.ready_file == NULL || a->cfg.ready_file[0] == '\0') {
        return 0;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", a->cfg.ready_file);
    if ((f = fopen(tmp, "w")) == NULL) {
        snprintf(errbuf, errlen, "cannot write --ready-file %s: %s", tmp, strerror(errno));
        return -errno;
    }
    fprintf(f, "grpc=127.0.0.1:%d\n", kp_analyzer_port(a));
    if (a->http != NULL) {
        fprintf(f, "http=127.0.0.1:%d\n", kp_analyzer_http_port(a));
    }
    if (fclose(f) != 0 || rename(tmp, a->cfg.ready_file) != 0) {
        snprintf(errbuf, errlen, "cannot write --ready-file %s: %s", a->cfg.ready_file,
                 strerror(errno));
        return -EIO;
    }
    return 0;
}

int kp_analyzer_create(const struct kp_analyzer_config *cfg, struct kp_analyzer **out, char *errbuf,
                       size_t errlen)
{
    struct kp_analyzer *a = calloc(1, sizeof(*a));
    struct kp_rpc_server_opts sopts = {
        .listen = cfg->listen,
        .tls_cert_file = cfg->tls_cert != NULL && cfg->tls_cert[0] ? cfg->tls_cert : NULL,
        .tls_key_file = cfg->tls_key != NULL && cfg->tls_key[0] ? cfg->tls_key : NULL,
        .name = "kprof-analyzer",
    };
    static const struct kp_http_handlers hh = { .healthz = healthz,
                                                .readyz = readyz,
                                                .metrics = metrics };
    int rc;

    if (a == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    a->cfg = *cfg;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cond, NULL);
    pthread_mutex_init(&a->cache_mu, NULL);
    if (cfg->workers < 1 || cfg->workers > KP_ANALYZER_MAX_WORKERS || cfg->queue_max < 1) {
        snprintf(errbuf, errlen, "--workers must be 1..%d and --queue-max at least 1",
                 KP_ANALYZER_MAX_WORKERS);
        rc = -EINVAL;
        goto fail;
    }
    for (long long i = 0; i < cfg->workers; i++) {
        struct worker *w = &a->workers[i];

        w->a = a;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            snprintf(errbuf, errlen, "cannot start analysis worker %lld", i);
            rc = -EAGAIN;
            goto fail;
        }
        w->started = true;
        a->n_workers++;
    }
    a->methods[VIEW_BREAKDOWN] = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Breakdown",
        .kind = KP_RPC_UNARY,
        .request = &kprof__v1__breakdown_request__descriptor,
        .on_request = on_breakdown,
        .ud = a,
    };
    a->methods[VIEW_OPS] = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Ops",
        .kind = KP_RPC_UNARY,
        .request = &kprof__v1__ops_request__descriptor,
        .on_request = on_ops,
        .ud = a,
    };
    a->methods[VIEW_KERNELS] = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Kernels",
        .kind = KP_RPC_UNARY,
        .request = &kprof__v1__kernels_request__descriptor,
        .on_request = on_kernels,
        .ud = a,
    };
    a->methods[VIEW_PROF] = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Prof",
        .kind = KP_RPC_UNARY,
        .request = &kprof__v1__prof_request__descriptor,
        .on_request = on_prof,
        .ud = a,
    };
    a->methods[VIEW_ROOFLINE] = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Roofline",
        .kind = KP_RPC_UNARY,
        .request = &kprof__v1__roofline_request__descriptor,
        .on_request = on_roofline,
        .ud = a,
    };
    a->methods[VIEW_COUNTERS] = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Counters",
        .kind = KP_RPC_UNARY,
        .request = &kprof__v1__counters_request__descriptor,
        .on_request = on_counters,
        .ud = a,
    };
    a->methods[VIEW_COMPARE] = (struct kp_rpc_method){
        .path = "/kprof.v1.Analyzer/Compare",
        .kind = KP_RPC_UNARY,
        .request = &kprof__v1__compare_request__descriptor,
        .on_request = on_compare,
        .ud = a,
    };
    if ((a->export_svc = kp_export_svc_create(cfg->pg_conninfo, (int) cfg->workers)) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    a->methods[VIEW_COUNT] = *kp_export_svc_method(a->export_svc);
    if ((rc = kp_rpc_server_create(&sopts, a->methods, VIEW_COUNT + 1, &a->server, errbuf,
                                   errlen)) != 0) {
        goto fail;
    }
    if (cfg->http_listen != NULL && cfg->http_listen[0] != '\0' &&
        (rc = kp_http_create(cfg->http_listen, &hh, a, &a->http, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = write_ready_file(a, errbuf, errlen)) != 0) {
        goto fail;
    }
    kp_log_info("serving grpc=%s port=%d http_port=%d workers=%lld cache_bytes=%lld", cfg->listen,
                kp_analyzer_port(a), kp_analyzer_http_port(a), cfg->workers, cfg->cache_bytes);
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

void kp_analyzer_destroy(struct kp_analyzer *a)
{
    if (a == NULL) {
        return;
    }
    kp_http_destroy(a->http);
    /* Live calls get the grace period; the workers keep answering meanwhile. */
    if (a->server != NULL) {
        kp_rpc_server_shutdown(a->server, a->cfg.shutdown_grace_ms);
    }
    kp_export_svc_destroy(a->export_svc); /* its calls are over: their threads end */
    pthread_mutex_lock(&a->mu);
    a->stopping = true;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < a->n_workers; i++) {
        if (a->workers[i].started) {
            pthread_join(a->workers[i].thread, NULL);
        }
        if (a->workers[i].pg != NULL) {
            PQfinish(a->workers[i].pg);
        }
    }
    kp_rpc_server_destroy(a->server);
    while (a->lru_head != NULL) {
        cache_drop(a, a->lru_head);
    }
    pthread_mutex_destroy(&a->cache_mu);
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
