/* The Prof view (Analyzer.Prof): PyProf's per-kernel table of one rank (pyprof.h, view.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "kp_err.h"
#include "kp_log.h"
#include "kprof.pb-c.h"
#include "pyprof.h"
#include "view.h"

struct prof_state {
    Kprof__V1__ProfResponse m;
    struct kp_pyprof *prof;
    void *rows, *ptrs;
};

static bool prof_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k, char *err,
                     size_t len)
{
    const Kprof__V1__ProfRequest *r = (const Kprof__V1__ProfRequest *) req;

    (void) max_rows;
    return kp_view_key_init(k, r->run_id, r->rank, false, err, len);
}

/* PyProf's table of the rank as a ProfResponse into *m; the rows point into p and arrays
 * (freed by the caller). Returns 0 or -ENOMEM. */
static int fill_prof(Kprof__V1__ProfResponse *m, const struct kp_pyprof *p, void **rows_out,
                     void **ptrs_out)
{
    size_t n;
    const struct kp_pyprof_row *r = kp_pyprof_rows(p, &n);
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

static void prof_free(void *p)
{
    struct prof_state *s = p;

    kp_pyprof_destroy(s->prof);
    free(s->rows);
    free(s->ptrs);
    free(s);
}

static int prof_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct prof_state *s = calloc(1, sizeof(*s));
    size_t window = 0, windows = 1;
    int rc;

    if (s == NULL) {
        return -ENOMEM;
    }
    kprof__v1__prof_response__init(&s->m);
    rc = kp_view_check_rank(c);
    if (rc == 0) {
        rc = kp_view_window(c, &window);
    }
    if (rc == 0) {
        rc = kp_pyprof_create_windowed(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, window,
                                       &s->prof, &windows, c->err, c->errlen);
    }
    if (rc == KP_EWHOLE) { /* cannot be cut between steps: whole */
        rc = kp_pyprof_create(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, &s->prof, c->err,
                              c->errlen);
    }
    if (rc == 0 && windows > 1) {
        kp_log_info("rank read by windows method=Prof run=%" PRIu64 " rank=%d windows=%zu", k->run,
                    (int) k->rank, windows);
    }
    if (rc == 0) {
        rc = fill_prof(&s->m, s->prof, &s->rows, &s->ptrs);
    }
    if (rc != 0) {
        prof_free(s);
        return rc;
    }
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = prof_free;
    return 0;
}

/* Not load_rank: the table reads its own rows (kp_pyprof_create), so loading the rank too
 * would read it twice; kp_view_check_rank answers an unknown rank NOT_FOUND as the other views do.
 * A rank of more than --window-events events is read by windows (kp_pyprof_create_windowed),
 * but the reply holds a row per kernel: not .windowed, the service estimates the whole rank.
 */
const struct kp_view kp_view_prof = {
    .name = "Prof",
    .request = &kprof__v1__prof_request__descriptor,
    .reply = &kprof__v1__prof_response__descriptor,
    .load_rank = false,
    .key = prof_key,
    .compute = prof_compute,
    .bytes_per_event = 180,
};
