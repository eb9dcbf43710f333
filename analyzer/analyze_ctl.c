/*
 * kprof-analyze --pg CONNINFO [--max-rows N] kprofctl VERB [VERB's flags]: kprofctl's analysis
 * verbs (breakdown, ops, kernels, prof, roofline, counters, compare, hta, memory, distributed)
 * without a kprof-analyzer. The verb runs as kprofctl runs it (its flags, its printers, its
 * exit statuses), but its Analyzer calls are answered in process by the service's own table
 * of views (view.h) over PostgreSQL: the same key, run check, rank default and compute, no
 * cache. So its output is kprofctl's, byte for byte, for the same database.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "analyze.h"
#include "kp_err.h"
#include "kp_pg.h"
#include "kp_rpc.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "view.h"

static PGconn *conn;
static size_t row_budget, window_events;

static const struct kprofctl_verb verbs[] = {
    { "breakdown", "", kprofctl_breakdown }, { "ops", "", kprofctl_ops },
    { "kernels", "", kprofctl_kernels },     { "prof", "", kprofctl_prof },
    { "roofline", "", kprofctl_roofline },   { "counters", "", kprofctl_counters },
    { "compare", "", kprofctl_compare },     { "hta", "", kprofctl_hta },
    { "memory", "", kprofctl_memory },       { "distributed", "", kprofctl_distributed },
    { "diff", "", kprofctl_diff },
};

/* kp_rpcverb_local_fn: the service's answer, computed here; a stream's pages go to page as
 * the compute sends them (borrowed: the verb reads them before the next is built). */
static int local_call(const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, kp_rpcverb_page_fn *page,
                      void *page_ud, ProtobufCMessage **resp, struct kp_rpc_status *st)
{
    bool stream = false;
    const struct kp_view *v = kp_view_find(method, &stream);
    const struct kp_view_pages pages = { .send = page, .ud = page_ud };
    struct kp_view_key k;
    struct kp_view_reply out = { 0 };
    struct kp_an *an = NULL;
    grpc_status_code code = GRPC_STATUS_OK;
    int64_t batches;
    uint8_t *buf = NULL;
    size_t n;
    int state, rc;

    *resp = NULL;
    if (v == NULL || (stream ? v->page : v->reply) != resp_desc || stream != (page != NULL)) {
        st->code = GRPC_STATUS_UNIMPLEMENTED;
        snprintf(st->details, sizeof(st->details), "no view %s", method);
        return -1;
    }
    if (!v->key(req, row_budget, &k, st->details, sizeof(st->details))) {
        st->code = GRPC_STATUS_INVALID_ARGUMENT;
        return -1;
    }
    rc = kp_view_run_version(conn, k.run, &state, &batches, st->details, sizeof(st->details));
    if (rc == 0 && !v->whole_run && k.rank == KP_VIEW_ONLY_RANK) {
        rc = kp_view_resolve_rank(conn, k.run, &k.rank, st->details, sizeof(st->details));
    }
    if (rc != 0) {
        st->code = kp_view_status(v, &k, rc, st->details, sizeof(st->details));
        return -1;
    }
    rc = kp_view_compute(v, conn, req, &k, row_budget, window_events, false, stream ? &pages : NULL,
                         &an, &out, &code, st->details, sizeof(st->details));
    if (rc != 0) {
        st->code = code;
        kp_an_destroy(an);
        return -1;
    }
    /* as on the wire: the verb owns an unpacked copy */
    n = protobuf_c_message_get_packed_size(out.msg);
    if ((buf = malloc(n ? n : 1)) != NULL) {
        protobuf_c_message_pack(out.msg, buf);
        *resp = protobuf_c_message_unpack(resp_desc, NULL, n, buf);
    }
    free(buf);
    out.free_fn(out.state);
    kp_an_destroy(an);
    if (*resp == NULL) {
        st->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(st->details, sizeof(st->details), "out of memory");
        return -1;
    }
    return 0;
}

int kp_analyze_ctl(const char *conninfo, size_t max_rows, size_t window, int argc, char **argv)
{
    char err[512];
    int rc = -1;

    if (argc < 1) {
        fprintf(stderr, "kprof-analyze kprofctl: name the verb: breakdown, ops, kernels, prof, "
                        "roofline, counters, compare, hta, memory or distributed\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
        if (strcmp(verbs[i].name, argv[0]) != 0) {
            continue;
        }
        if (kp_pg_connect(conninfo, "kprof-analyze", &conn, err, sizeof(err)) != 0) {
            fprintf(stderr, "kprof-analyze: %s\n", err);
            return 5;
        }
        row_budget = max_rows;
        window_events = window;
        kp_rpcverb_set_local(local_call, "kprof-analyze");
        rc = verbs[i].run(argc, argv);
        kp_rpcverb_set_local(NULL, NULL);
        PQfinish(conn);
        conn = NULL;
        return rc;
    }
    fprintf(stderr, "kprof-analyze kprofctl: \"%s\" is no analysis verb of kprofctl\n", argv[0]);
    return 2;
}
