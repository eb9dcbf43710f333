/* The Counters view (Analyzer.Counters): CUPTI counter values per kernel of one rank with the
 * op stack and FLOPs (counters.h, view.h). It reads its own rows: no kp_an_create. */
#include <errno.h>
#include <stdlib.h>

#include "counters.h"
#include "kp_pg.h"
#include "kprof.pb-c.h"
#include "view.h"

struct counters_state {
    Kprof__V1__CountersResponse m;
    struct kp_counters *ctr;
    void *rows, *ptrs;
};

static bool counters_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k,
                         char *err, size_t len)
{
    const Kprof__V1__CountersRequest *r = (const Kprof__V1__CountersRequest *) req;

    (void) max_rows; /* columns and format are the client's */
    return kp_view_key_init(k, r->run_id, r->rank, false, err, len);
}

/* The counters table of the rank, read in one snapshot (its queries see the same rows).
 * Returns as kp_counters_create. */
static int build_counters(PGconn *pg, const struct kp_view_key *k, size_t max_rows,
                          struct kp_counters **out, char *err, size_t len)
{
    char ignored[256];
    int rc;

    if ((rc = kp_pg_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err, len)) != 0) {
        return rc;
    }
    rc = kp_counters_create(pg, (int64_t) k->run, (int) k->rank, max_rows, out, err, len);
    /* A failed COMMIT or ROLLBACK leaves a broken connection, which pg_get replaces. */
    (void) kp_pg_exec(pg, rc == 0 ? "COMMIT" : "ROLLBACK", ignored, sizeof(ignored));
    return rc;
}

/* The counters table as a CountersResponse into *m, pointing into t and the arrays (freed by
 * the caller). Returns 0 or -ENOMEM. */
static int fill_counters(Kprof__V1__CountersResponse *m, const struct kp_counters *t,
                         void **rows_out, void **ptrs_out)
{
    size_t n, nm;
    const struct kp_counters_row *r = kp_counters_rows(t, &n);
    const char *const *metrics = kp_counters_metrics(t, &nm);
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
        o->flops_fp64 = r[i].flops_prec[KP_COUNTERS_FP64];
        o->flops_fp32 = r[i].flops_prec[KP_COUNTERS_FP32];
        o->flops_fp16 = r[i].flops_prec[KP_COUNTERS_FP16];
        o->flops_per_s = r[i].flops_per_s;
        ptrs[i] = o;
    }
    m->n_metrics = nm;
    m->metrics = (char **) metrics;
    m->n_rows = n;
    m->rows = ptrs;
    m->message = (char *) (kp_counters_message(t) != NULL ? kp_counters_message(t) : "");
    return 0;
}

static void counters_free(void *p)
{
    struct counters_state *s = p;

    kp_counters_destroy(s->ctr);
    free(s->rows);
    free(s->ptrs);
    free(s);
}

static int counters_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct counters_state *s = calloc(1, sizeof(*s));
    int rc;

    if (s == NULL) {
        return -ENOMEM;
    }
    kprof__v1__counters_response__init(&s->m);
    rc = build_counters(c->pg, k, c->max_rows, &s->ctr, c->err, c->errlen);
    if (rc == 0) {
        rc = fill_counters(&s->m, s->ctr, &s->rows, &s->ptrs);
    }
    if (rc != 0) {
        counters_free(s);
        return rc;
    }
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = counters_free;
    return 0;
}

const struct kp_view kp_view_counters = {
    .name = "Counters",
    .request = &kprof__v1__counters_request__descriptor,
    .reply = &kprof__v1__counters_response__descriptor,
    .key = counters_key,
    .compute = counters_compute,
    .bytes_per_event = 40,
};
