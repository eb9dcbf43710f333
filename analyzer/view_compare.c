/* The Compare view (Analyzer.Compare): the cross-rank comparison of a whole run, or HTA's
 * straggler call (compare.h, compare_pb.h, view.h). It reads its own rows: no kp_an_create. */
#define KP_LOG_MODULE "analyzer"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/status.h>

#include "compare.h"
#include "compare_pb.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kprof.pb-c.h"
#include "view.h"

/* Compare's options: the comparison's (step, thresholds as fractions of the percentages
 * below, the row budget), or HTA's call (cmp_hta, the step and hta_k alone). */
struct cmp_key {
    struct kp_compare_opts cmp;
    double late_pct, excess_pct, step_pct;
    bool cmp_hta;
    int hta_k;
};

_Static_assert(sizeof(struct cmp_key) <= KP_VIEW_OPTS_BYTES, "Compare's options fit the key");

struct compare_state {
    struct kp_compare_pb pb;
    struct kp_compare_result *res;
    struct kp_compare_hta *hta;
};

/* Compare's options into k (see struct cmp_key), the row budget the smaller of the request's
 * and the analyzer's; or false with INVALID_ARGUMENT's details in err. */
static bool parse_compare(const Kprof__V1__CompareRequest *r, size_t max_rows, struct cmp_key *k,
                          char *err, size_t len)
{
    const Kprof__V1__CompareThresholds *t = r->thresholds;

    kp_compare_opts_init(&k->cmp);
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
        if (r->hta_candidates > KP_COMPARE_MAX_RANKS) {
            snprintf(err, len, "hta_candidates %u is over %d", (unsigned) r->hta_candidates,
                     KP_COMPARE_MAX_RANKS);
            return false;
        }
        k->cmp_hta = true;
        k->hta_k = r->hta_candidates == 0 ? 2 : (int) r->hta_candidates; /* HTA's default */
        k->cmp.late_frac = k->cmp.excess_frac = k->cmp.step_frac = 0.0;
        return true;
    }
    k->late_pct = t != NULL ? t->late_pct : 100.0 * KP_COMPARE_DEFAULT_LATE_FRAC;
    k->excess_pct = t != NULL ? t->excess_pct : 100.0 * KP_COMPARE_DEFAULT_EXCESS_FRAC;
    k->step_pct = t != NULL ? t->step_pct : 100.0 * KP_COMPARE_DEFAULT_STEP_FRAC;
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

static bool compare_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k,
                        char *err, size_t len)
{
    const Kprof__V1__CompareRequest *r = (const Kprof__V1__CompareRequest *) req;
    struct cmp_key o;

    memset(&o, 0, sizeof(o)); /* the padding too: keys compare byte for byte */
    if (!kp_view_key_init(k, r->run_id, -1, true, err, len) ||
        !parse_compare(r, max_rows, &o, err, len)) {
        return false;
    }
    memcpy(k->opts, &o, sizeof(o));
    return true;
}

static bool compare_writes(const ProtobufCMessage *req)
{
    return ((const Kprof__V1__CompareRequest *) req)->save_offsets;
}

static void compare_free(void *p)
{
    struct compare_state *s = p;

    kp_compare_pb_fini(&s->pb);
    kp_compare_result_destroy(s->res);
    kp_compare_hta_destroy(s->hta);
    free(s);
}

/* Compares the ranks of the run (or makes HTA's call) in one snapshot. With save_offsets, the
 * snapshot is a read-write transaction that also writes the clock offsets, committed before
 * the answer; a failed write is INTERNAL, or UNAVAILABLE when the connection broke (ctx->status).
 * Returns as kp_compare_result_create (-EINVAL, KP_ENOTFOUND, KP_EPG, KP_ETOOBIG, -ENOMEM). */
static int compare_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const Kprof__V1__CompareRequest *req = (const Kprof__V1__CompareRequest *) c->req;
    PGconn *pg = c->pg;
    char *err = c->err;
    size_t errlen = c->errlen;
    struct cmp_key key, *k = &key;
    bool save, in_tx = false;
    struct compare_state *s = calloc(1, sizeof(*s));
    char ignored[256];
    size_t n_saved = 0;
    int rc;

    memcpy(&key, c->key->opts, sizeof(key));
    save = req->save_offsets && !k->cmp_hta;
    if (s == NULL) {
        return -ENOMEM;
    }
    rc = kp_pg_exec(pg,
                    save ? "BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL jit = off"
                         : "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL jit = off",
                    err, errlen);
    if (rc != 0) {
        goto out;
    }
    in_tx = true;
    if (k->cmp_hta) {
        rc = kp_compare_hta_create(pg, (int64_t) c->key->run, k->cmp.has_step, k->cmp.step,
                                   k->hta_k, &s->hta, err, errlen);
        rc = rc != 0 ? rc : kp_compare_pb_init_hta(&s->pb, s->hta, k->hta_k);
        goto built;
    }
    if ((rc = kp_compare_result_create(pg, (int64_t) c->key->run, &k->cmp, &s->res, err, errlen)) !=
        0) {
        goto out;
    }
    if (save) {
        char why[512];

        if (kp_compare_save_offsets(pg, s->res, &n_saved, why, sizeof(why)) != 0 ||
            kp_pg_exec(pg, "COMMIT", why, sizeof(why)) != 0) {
            bool broken = PQstatus(pg) != CONNECTION_OK;

            kp_log_warn("saving clock offsets failed run=%" PRIu64 " err=\"%s\"", c->key->run, why);
            snprintf(err, errlen, "cannot save the clock offsets: %s%s", why,
                     broken ? "; retry later" : "");
            c->status = broken ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_INTERNAL;
            rc = KP_EPG;
            goto out;
        }
        in_tx = false;
    }
    rc = kp_compare_pb_init(&s->pb, s->res);
    s->pb.thresholds.late_pct = k->late_pct;
    s->pb.thresholds.excess_pct = k->excess_pct;
    s->pb.thresholds.step_pct = k->step_pct;
    s->pb.msg.thresholds = &s->pb.thresholds;
built:
    if (rc != 0) {
        goto out;
    }
    if (in_tx) {
        /* A failed COMMIT leaves a broken connection, which the service replaces; a read-only
         * snapshot has nothing to lose. */
        (void) kp_pg_exec(pg, "COMMIT", ignored, sizeof(ignored));
        in_tx = false;
    }
    s->pb.msg.run_id = c->key->run;
    s->pb.msg.offsets_saved = (uint32_t) n_saved; /* a write: never cached */
    out->msg = &s->pb.msg.base;
    out->state = s;
    out->free_fn = compare_free;
    s = NULL;
out:
    if (in_tx) {
        (void) kp_pg_exec(pg, "ROLLBACK", ignored, sizeof(ignored));
    }
    if (s != NULL) {
        compare_free(s);
    }
    return rc;
}

const struct kp_view kp_view_compare = {
    .name = "Compare",
    .request = &kprof__v1__compare_request__descriptor,
    .reply = &kprof__v1__compare_response__descriptor,
    .whole_run = true,
    .key = compare_key,
    .compute = compare_compute,
    .writes = compare_writes,
};
