/* The Distributed view (Analyzer.Distributed): the TensorBoard plugin's wait view and
 * communication-ops table across every rank of the run (distributed.h, view.h). A disabled
 * view is a reply (enabled false, reason), not an error. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "distributed.h"
#include "kprof.pb-c.h"
#include "view.h"

struct dist_state {
    Kprof__V1__DistributedResponse m;
    struct kp_distributed *d;
    Kprof__V1__DistributedRank *ranks, **rank_ptrs;
    Kprof__V1__DistributedWait *waits, **wait_ptrs;
    Kprof__V1__DistributedOp *ops, **op_ptrs;
};

static bool dist_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k, char *err,
                     size_t len)
{
    const Kprof__V1__DistributedRequest *r = (const Kprof__V1__DistributedRequest *) req;

    (void) max_rows;
    return kp_view_key_init(k, r->run_id, -1, true, err, len);
}

static void dist_free(void *p)
{
    struct dist_state *s = p;

    kp_distributed_destroy(s->d);
    free(s->ranks);
    free(s->rank_ptrs);
    free(s->waits);
    free(s->wait_ptrs);
    free(s->ops);
    free(s->op_ptrs);
    free(s);
}

static int dist_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    struct dist_state *s = calloc(1, sizeof(*s));
    const struct kp_distributed *d;
    size_t n_wait = 0, n_ops = 0, w = 0, o = 0;
    int rc;

    if (s == NULL) {
        return -ENOMEM;
    }
    rc = kp_distributed_create(c->pg, (int64_t) c->key->run, c->max_rows, &s->d, c->err, c->errlen);
    if (rc != 0) {
        dist_free(s);
        return rc;
    }
    d = s->d;
    for (size_t i = 0; i < d->n_ranks; i++) {
        n_wait += d->ranks[i].n_wait;
        n_ops += d->ranks[i].n_ops;
    }
    s->ranks = calloc(d->n_ranks + 1, sizeof(*s->ranks));
    s->rank_ptrs = calloc(d->n_ranks + 1, sizeof(*s->rank_ptrs));
    s->waits = calloc(n_wait + 1, sizeof(*s->waits));
    s->wait_ptrs = calloc(n_wait + 1, sizeof(*s->wait_ptrs));
    s->ops = calloc(n_ops + 1, sizeof(*s->ops));
    s->op_ptrs = calloc(n_ops + 1, sizeof(*s->op_ptrs));
    if (!s->ranks || !s->rank_ptrs || !s->waits || !s->wait_ptrs || !s->ops || !s->op_ptrs) {
        dist_free(s);
        return -ENOMEM;
    }
    kprof__v1__distributed_response__init(&s->m);
    for (size_t i = 0; i < d->n_ranks; i++) {
        const struct kp_distributed_rank *r = &d->ranks[i];
        Kprof__V1__DistributedRank *x = &s->ranks[i];

        kprof__v1__distributed_rank__init(x);
        x->rank = r->rank;
        x->comm_node_count = r->n_nodes;
        x->wait_all_transfer_us = r->wait_all_transfer_us;
        x->wait_all_sync_us = r->wait_all_sync_us;
        x->wait = &s->wait_ptrs[w];
        for (size_t j = 0; j < r->n_wait; j++, w++) {
            kprof__v1__distributed_wait__init(&s->waits[w]);
            s->waits[w].step = r->wait[j].step;
            s->waits[w].step_name = (char *) r->wait[j].step_name;
            s->waits[w].latency_ns = r->wait[j].latency_ns;
            s->waits[w].transfer_ns = r->wait[j].transfer_ns;
            s->wait_ptrs[w] = &s->waits[w];
        }
        x->n_wait = r->n_wait;
        x->ops = &s->op_ptrs[o];
        for (size_t j = 0; j < r->n_ops; j++, o++) {
            kprof__v1__distributed_op__init(&s->ops[o]);
            s->ops[o].name = r->ops[j].name;
            s->ops[o].calls = r->ops[j].calls;
            s->ops[o].total_bytes = r->ops[j].total_bytes;
            s->ops[o].latency_ns = r->ops[j].latency_ns;
            s->ops[o].transfer_ns = r->ops[j].transfer_ns;
            s->op_ptrs[o] = &s->ops[o];
        }
        x->n_ops = r->n_ops;
        s->rank_ptrs[i] = x;
    }
    s->m.run_id = c->key->run;
    s->m.enabled = d->enabled;
    s->m.reason = (char *) d->reason;
    s->m.n_ranks = d->n_ranks;
    s->m.ranks = s->rank_ptrs;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = dist_free;
    return 0;
}

const struct kp_view kp_view_distributed = {
    .name = "Distributed",
    .request = &kprof__v1__distributed_request__descriptor,
    .reply = &kprof__v1__distributed_response__descriptor,
    .whole_run = true,
    .key = dist_key,
    .compute = dist_compute,
    .bytes_per_event = 168,
};
