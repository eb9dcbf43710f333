/* The Ops view (Analyzer.Ops): the operator view of one rank, by name or by name and input
 * shapes (view.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kprof.pb-c.h"
#include "view.h"

struct ops_opts {
    int group_by;
};

struct ops_state {
    Kprof__V1__OpsResponse m;
    Kprof__V1__OpRow *rows, **ptrs;
};

static void ops_free(void *p)
{
    struct ops_state *s = p;

    free(s->rows);
    free(s->ptrs);
    free(s);
}

static int ops_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct ops_opts o;
    struct ops_state *s = calloc(1, sizeof(*s));
    const struct kp_an_table *t;
    const struct kp_an_op_row *r;
    int rc;

    memcpy(&o, k->opts, sizeof(o));
    if (s == NULL) {
        return -ENOMEM;
    }
    if ((rc = kp_an_ops(c->an, o.group_by != 0, &t)) != 0) {
        free(s);
        return rc;
    }
    r = t->rows;
    s->rows = calloc(t->n ? t->n : 1, sizeof(*s->rows));
    s->ptrs = calloc(t->n ? t->n : 1, sizeof(*s->ptrs));
    if (!s->rows || !s->ptrs) {
        ops_free(s);
        return -ENOMEM;
    }
    for (size_t i = 0; i < t->n; i++) {
        Kprof__V1__OpRow *row = &s->rows[i];

        kprof__v1__op_row__init(row);
        row->name = (char *) (r[i].name ? r[i].name : "");
        row->input_shape = (char *) (r[i].input_shape ? r[i].input_shape : "");
        row->calls = r[i].calls;
        row->host_total_ns = r[i].host_total_ns;
        row->host_self_ns = r[i].host_self_ns;
        row->device_total_ns = r[i].device_total_ns;
        row->device_self_ns = r[i].device_self_ns;
        row->tc_self_ns = r[i].tc_self_ns;
        row->tc_total_ns = r[i].tc_total_ns;
        row->tc_eligible = r[i].tc_eligible;
        s->ptrs[i] = row;
    }
    kprof__v1__ops_response__init(&s->m);
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    s->m.group_by = (Kprof__V1__OpsGroupBy) o.group_by;
    s->m.n_rows = t->n;
    s->m.rows = s->ptrs;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = ops_free;
    return 0;
}

const struct kp_view kp_view_ops = {
    .name = "Ops",
    .request = &kprof__v1__ops_request__descriptor,
    .reply = &kprof__v1__ops_response__descriptor,
    .load_rank = true,
    .windowed = KP_AN_WIN_TABLES,
    .key = kp_view_group_by_key,
    .compute = ops_compute,
    .bytes_per_event = 150,
};
