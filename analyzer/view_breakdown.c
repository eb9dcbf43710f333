/* The Breakdown view (Analyzer.Breakdown): the step-time breakdown of one rank, its GPUs'
 * utilization, SM efficiency and occupancy, and the recommendations (view.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "an_recommend.h"
#include "kp_pg.h"
#include "kprof.pb-c.h"
#include "view.h"

struct breakdown_opts {
    bool plugin_compat;
};

struct breakdown_state {
    Kprof__V1__BreakdownResponse m;
    Kprof__V1__AverageCosts avg;
    Kprof__V1__GpuUtilization gpus[KP_AN_MAX_GPUS], *gpu_ptrs[KP_AN_MAX_GPUS];
    void *steps, *step_ptrs, *costs;
    struct kp_an_recs recs;
    PGresult *devices; /* the GPUs' names point into it */
};

static bool breakdown_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k,
                          char *err, size_t len)
{
    const Kprof__V1__BreakdownRequest *r = (const Kprof__V1__BreakdownRequest *) req;
    struct breakdown_opts o = { .plugin_compat = r->plugin_compat };

    (void) max_rows;
    if (!kp_view_key_init(k, r->run_id, r->rank, false, err, len)) {
        return false;
    }
    memcpy(k->opts, &o, sizeof(o));
    return true;
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

/* The GPUs' properties from the devices table (the plugin's GPU summary) into s->gpus. Returns
 * 0 or KP_EPG. */
static int add_devices(struct breakdown_state *s, PGconn *pg, const struct kp_view_key *k,
                       char *err, size_t len)
{
    char run[32], rank[16];
    const char *params[2] = { run, rank };
    int rc;

    snprintf(run, sizeof(run), "%" PRIu64, k->run);
    snprintf(rank, sizeof(rank), "%d", (int) k->rank);
    rc = kp_pg_query(pg,
                     "SELECT id, name, global_memory_bytes, cc_major, cc_minor, sm_count FROM "
                     "devices WHERE run_id = $1 AND rank = $2",
                     2, params, &s->devices, err, len);
    if (rc != 0) {
        return rc;
    }
    for (int i = 0; i < PQntuples(s->devices); i++) {
        int64_t id = kp_pg_i64(s->devices, i, 0, -1);

        for (size_t g = 0; g < s->m.n_gpus; g++) {
            Kprof__V1__GpuUtilization *x = &s->gpus[g];

            if (x->gpu_id != id) {
                continue;
            }
            x->device_known = true;
            x->name = PQgetvalue(s->devices, i, 1);
            x->memory_bytes = kp_pg_i64(s->devices, i, 2, 0);
            x->compute_major = (int32_t) kp_pg_i64(s->devices, i, 3, 0);
            x->compute_minor = (int32_t) kp_pg_i64(s->devices, i, 4, 0);
            x->sm_count = (int32_t) kp_pg_i64(s->devices, i, 5, 0);
        }
    }
    return 0;
}

static void breakdown_free(void *p)
{
    struct breakdown_state *s = p;

    kp_an_recs_fini(&s->recs);
    PQclear(s->devices);
    free(s->steps);
    free(s->step_ptrs);
    free(s->costs);
    free(s);
}

static int breakdown_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct breakdown_opts o;
    struct breakdown_state *s = calloc(1, sizeof(*s));
    const struct kp_an_breakdown *b;
    size_t n;
    int rc;

    memcpy(&o, k->opts, sizeof(o));
    if (s == NULL) {
        return -ENOMEM;
    }
    /* the recommendations first: they compute both breakdown figures */
    if ((rc = kp_an_recommend(c->an, c->pg, (int64_t) k->run, (int) k->rank, &s->recs, c->err,
                              c->errlen)) != 0 ||
        (rc = kp_an_breakdown(c->an, o.plugin_compat, &b)) != 0) {
        breakdown_free(s);
        return rc;
    }
    n = b->n_steps ? b->n_steps : 1;
    s->steps = calloc(n, sizeof(Kprof__V1__BreakdownStep));
    s->step_ptrs = calloc(n, sizeof(Kprof__V1__BreakdownStep *));
    s->costs = calloc(n, sizeof(Kprof__V1__StepCosts));
    if (!s->steps || !s->step_ptrs || !s->costs) {
        breakdown_free(s);
        return -ENOMEM;
    }
    kprof__v1__breakdown_response__init(&s->m);
    fill_breakdown(&s->m, b, s->steps, s->step_ptrs, s->costs, &s->avg, s->gpus, s->gpu_ptrs);
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    s->m.plugin_compat = o.plugin_compat;
    if ((rc = add_devices(s, c->pg, k, c->err, c->errlen)) != 0) {
        breakdown_free(s);
        return rc;
    }
    s->m.n_recommendations = s->recs.n_text;
    s->m.recommendations = s->recs.text;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = breakdown_free;
    return 0;
}

const struct kp_view kp_view_breakdown = {
    .name = "Breakdown",
    .request = &kprof__v1__breakdown_request__descriptor,
    .reply = &kprof__v1__breakdown_response__descriptor,
    .load_rank = true,
    .windowed = KP_AN_WIN_TABLES | KP_AN_WIN_BREAKDOWN, /* and the recommendations' tables */
    .key = breakdown_key,
    .compute = breakdown_compute,
    .bytes_per_event = 168,
};
