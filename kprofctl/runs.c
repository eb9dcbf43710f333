/*
 * kprofctl runs [--job J] [--limit N] [--json|--csv] [-c COLS] [-w WIDTH]: the newest runs,
 * newest first, from collectord's Control.ListRuns, as a table (table.h): id, job, name,
 * state, source, world_size, created and ended (ISO-8601 UTC), batches.
 *
 * Output (stable; tests/it/test_kprofctl_runs.py parses it): one row per run with the columns
 *   id (number), job, name (null when empty), state (open|ended|failed), source
 *   (capture|import|synthetic|unknown), world_size (number), created, ended (ISO-8601 UTC,
 *   whole seconds; null while open), batches (number)
 * as aligned text, CSV, or (--json) an array of objects keyed by those names.
 *
 * Exit status (kprofctl.h): 0 listed (also when there are none), 2 bad usage, 5 collectord
 * unreachable, 1 anything else (collectord refused, output failed); a refusal with another
 * status maps as kp_rpcverb_exit_code says.
 */
#define KP_LOG_MODULE "runs"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct runs_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    char *job;
    long long limit;
};

#define OFF(f) offsetof(struct runs_config, f)
static const struct kp_config_def runs_defs[] = {
    { "job", KP_CONFIG_STRING, "", 0, 4096, OFF(job), "only the runs of this job (default: all)",
      NULL, false },
    { "limit", KP_CONFIG_INT, "100", 1, 10000, OFF(limit), "at most this many runs, newest first",
      NULL, false },
};
#undef OFF
#define N_DEFS (sizeof(runs_defs) / sizeof(runs_defs[0]))

enum runs_col {
    COL_ID,
    COL_JOB,
    COL_NAME,
    COL_STATE,
    COL_SOURCE,
    COL_WORLD_SIZE,
    COL_CREATED,
    COL_ENDED,
    COL_BATCHES,
    N_COLS,
};

static const struct kp_table_col runs_cols[N_COLS] = {
    [COL_ID] = { "id", KP_TABLE_NUMERIC },
    [COL_JOB] = { "job", KP_TABLE_TEXT },
    [COL_NAME] = { "name", KP_TABLE_TEXT },
    [COL_STATE] = { "state", KP_TABLE_TEXT },
    [COL_SOURCE] = { "source", KP_TABLE_TEXT },
    [COL_WORLD_SIZE] = { "world_size", KP_TABLE_NUMERIC },
    [COL_CREATED] = { "created", KP_TABLE_TEXT },
    [COL_ENDED] = { "ended", KP_TABLE_TEXT },
    [COL_BATCHES] = { "batches", KP_TABLE_NUMERIC },
};

static const char *source_name(Kprof__V1__RunSource s)
{
    switch (s) {
    case KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE:
        return "capture";
    case KPROF__V1__RUN_SOURCE__RUN_SOURCE_IMPORT:
        return "import";
    case KPROF__V1__RUN_SOURCE__RUN_SOURCE_SYNTHETIC:
        return "synthetic";
    default:
        return "unknown";
    }
}

static int add_run(struct kp_table *t, const Kprof__V1__Run *r)
{
    int rc = 0;

    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_ID, r->id);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_JOB, r->job);
    rc = rc != 0 ? rc
                 : kp_table_set_str(t, COL_NAME,
                                    r->name != NULL && r->name[0] != '\0' ? r->name : NULL);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_STATE, kp_rpcverb_run_state_name(r->state));
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_SOURCE, source_name(r->source));
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_WORLD_SIZE, r->world_size);
    rc = rc != 0 ? rc : kp_rpcverb_set_time(t, COL_CREATED, r->created_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_time(t, COL_ENDED, r->ended_ns);
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_BATCHES, r->batches);
    return rc;
}

static int runs_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct runs_config *cfg = v->cfg;
    Kprof__V1__ListRunsRequest *req = (Kprof__V1__ListRunsRequest *) msg;

    req->job = cfg->job;
    req->limit = (uint32_t) cfg->limit;
    return 0;
}

static int runs_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    const Kprof__V1__ListRunsResponse *resp = (const Kprof__V1__ListRunsResponse *) msg;
    int r = 0;

    (void) v;
    for (size_t i = 0; i < resp->n_runs && r == 0; i++) {
        r = add_run(t, resp->runs[i]);
    }
    return r;
}

static const struct kp_rpcverb_spec runs_spec = {
    .name = "runs",
    .synopsis = "kprofctl runs [--job J] [--limit N] [--json|--csv] [-c COLS] [-w WIDTH]\n"
                "  The newest runs, newest first (Control.ListRuns): id, job, name, state\n"
                "  (open|ended|failed), source, world_size, created, ended (UTC), batches.\n",
    .exit_ok = "listed (also when there are none)",
    .defs = runs_defs,
    .n_defs = N_DEFS,
    .cols = runs_cols,
    .n_cols = N_COLS,
    .method = "ListRuns",
    .req_desc = &kprof__v1__list_runs_request__descriptor,
    .resp_desc = &kprof__v1__list_runs_response__descriptor,
    .request = runs_request,
    .rows = runs_rows,
};

int kprofctl_runs(int argc, char **argv)
{
    struct runs_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&runs_spec, &cfg, argc, argv);
}
