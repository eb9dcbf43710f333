/* The table of the Analyzer service's views (view.h) and what their key functions share. */
#include "view.h"

#include <errno.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_pg.h"

const struct kp_view *const kp_views[] = {
    &kp_view_breakdown, &kp_view_ops,     &kp_view_kernels, &kp_view_prof,   &kp_view_roofline,
    &kp_view_counters,  &kp_view_compare, &kp_view_hta,     &kp_view_memory, &kp_view_distributed,
};
const size_t kp_n_views = sizeof(kp_views) / sizeof(kp_views[0]);

const struct kp_view *kp_view_find(const char *name)
{
    for (size_t i = 0; i < kp_n_views; i++) {
        if (strcmp(kp_views[i]->name, name) == 0) {
            return kp_views[i];
        }
    }
    return NULL;
}

bool kp_view_key_init(struct kp_view_key *k, uint64_t run, int32_t rank, bool whole_run, char *err,
                      size_t len)
{
    memset(k, 0, sizeof(*k));
    if (run == 0 || run > INT32_MAX) {
        snprintf(err, len, "run_id %" PRIu64 " is not a run id: `kprofctl runs` lists the runs",
                 run);
        return false;
    }
    if (!whole_run && rank < KP_VIEW_ONLY_RANK) {
        snprintf(err, len, "rank %d is negative", (int) rank);
        return false;
    }
    k->run = run;
    k->rank = whole_run ? -1 : rank;
    return true;
}

void kp_view_free(void *state)
{
    free(state);
}

int kp_view_resolve_rank(PGconn *pg, uint64_t run, int32_t *rank, char *err, size_t len)
{
    char id[32];
    const char *params[1] = { id };
    PGresult *r = NULL;
    int64_t n;
    int rc;

    snprintf(id, sizeof(id), "%" PRIu64, run);
    rc = kp_pg_query(pg,
                     "SELECT count(*), min(rank), coalesce(string_agg(rank::text, ', ' ORDER BY "
                     "rank), '') FROM ranks WHERE run_id = $1",
                     1, params, &r, err, len);
    if (rc != 0) {
        return rc;
    }
    n = kp_pg_i64(r, 0, 0, 0);
    if (n == 1) {
        *rank = (int32_t) kp_pg_i64(r, 0, 1, 0);
    }
    else if (n == 0) {
        snprintf(err, len, "run %" PRIu64 " has no ranks yet", run);
        rc = KP_ENOTFOUND;
    }
    else {
        snprintf(err, len, "run %" PRIu64 " has %" PRId64 " ranks (%.400s): pick one with --rank",
                 run, n, PQgetvalue(r, 0, 2));
        rc = -EINVAL;
    }
    PQclear(r);
    return rc;
}
