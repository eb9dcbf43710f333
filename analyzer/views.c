/* The table of the Analyzer service's views (view.h) and what their key functions share. */
#include "view.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct kp_view *const kp_views[] = {
    &kp_view_breakdown, &kp_view_ops,      &kp_view_kernels, &kp_view_prof,
    &kp_view_roofline,  &kp_view_counters, &kp_view_compare,
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
    if (!whole_run && rank < 0) {
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
