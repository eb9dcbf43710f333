/* The Roofline view (Analyzer.Roofline): achieved FLOP/s and bytes/s of one rank against its
 * devices' peaks, per kernel or per op (roofline.h, view.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_log.h"
#include "kprof.pb-c.h"
#include "roofline.h"
#include "view.h"

struct roofline_opts {
    int group_by;
};

struct roofline_state {
    Kprof__V1__RooflineResponse m;
    struct kp_roofline *rl;
    void *devs, *dptrs, *rows, *ptrs;
};

/* The roofline as a RooflineResponse into *m, pointing into rl and the arrays (freed by the
 * caller). Returns 0 or -ENOMEM. */
static int fill_roofline(Kprof__V1__RooflineResponse *m, const struct kp_roofline *rl,
                         void **devs_out, void **dptrs_out, void **rows_out, void **ptrs_out)
{
    size_t nd, n;
    const struct kp_roofline_device *d = kp_roofline_devices(rl, &nd);
    const struct kp_roofline_row *r = kp_roofline_rows(rl, &n);
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
        o->peak_fp32_flop_per_s = d[i].peak_flop_per_s[KP_ROOFLINE_FP32];
        o->peak_tf32_flop_per_s = d[i].peak_flop_per_s[KP_ROOFLINE_TF32_TC];
        o->peak_fp16_flop_per_s = d[i].peak_flop_per_s[KP_ROOFLINE_FP16_TC];
        o->peak_fp8_flop_per_s = d[i].peak_flop_per_s[KP_ROOFLINE_FP8_TC];
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
        o->above_peak = (char *) r[i].above_peak;
        ptrs[i] = o;
    }
    m->n_devices = nd;
    m->devices = dptrs;
    m->n_rows = n;
    m->rows = ptrs;
    return 0;
}

static void roofline_free(void *p)
{
    struct roofline_state *s = p;

    kp_roofline_destroy(s->rl);
    free(s->devs);
    free(s->dptrs);
    free(s->rows);
    free(s->ptrs);
    free(s);
}

static int roofline_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct roofline_opts o;
    struct roofline_state *s = calloc(1, sizeof(*s));
    size_t window = 0;
    int rc;

    memcpy(&o, k->opts, sizeof(o));
    if (s == NULL) {
        return -ENOMEM;
    }
    kprof__v1__roofline_response__init(&s->m);
    rc = kp_view_check_rank(c);
    if (rc == 0) {
        rc = kp_view_window(c, &window);
    }
    if (rc == 0) {
        rc = kp_roofline_create(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, window,
                                o.group_by == 1 ? KP_ROOFLINE_BY_OP : KP_ROOFLINE_BY_KERNEL, &s->rl,
                                c->err, c->errlen);
    }
    if (rc == KP_EWHOLE && !c->windows_only) { /* cannot be cut between steps: whole */
        rc = kp_roofline_create(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, 0,
                                o.group_by == 1 ? KP_ROOFLINE_BY_OP : KP_ROOFLINE_BY_KERNEL, &s->rl,
                                c->err, c->errlen);
    }
    if (rc == 0 && kp_roofline_windows(s->rl) > 1) {
        kp_log_info("rank read by windows method=Roofline run=%" PRIu64 " rank=%d windows=%zu",
                    k->run, (int) k->rank, kp_roofline_windows(s->rl));
    }
    if (rc == 0) {
        rc = fill_roofline(&s->m, s->rl, &s->devs, &s->dptrs, &s->rows, &s->ptrs);
    }
    if (rc != 0) {
        roofline_free(s);
        return rc;
    }
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    s->m.group_by = (Kprof__V1__RooflineGroupBy) o.group_by;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = roofline_free;
    return 0;
}

/* Not load_rank: the table reads its own rows (kp_pyprof_create), so loading the rank too
 * would read it twice; kp_view_check_rank answers an unknown rank NOT_FOUND as the other views do.
 * windowed: a rank of more than --window-events events is read by windows cut between steps
 * (kp_roofline_create), so the service estimates it for two windows. */
const struct kp_view kp_view_roofline = {
    .name = "Roofline",
    .request = &kprof__v1__roofline_request__descriptor,
    .reply = &kprof__v1__roofline_response__descriptor,
    .load_rank = false,
    .windowed = KP_VIEW_WIN_SELF,
    .key = kp_view_group_by_key,
    .compute = roofline_compute,
    .bytes_per_event = 170,
};
