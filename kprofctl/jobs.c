/*
 * kprofctl jobs [--job J] [--json|--csv] [-c COLS] [-w WIDTH]: the jobs whose worker
 * processes are registered with attached kprof-agents (Control.ListJobs), one row per
 * registered rank, sorted by job, then rank (unknown ranks first), then host and pid.
 *
 * Output (stable; tests parse --json): the columns
 *   job, world_size (number; null when unknown), rank (number; null when unknown), host,
 *   pid (number), local_rank (number; null when unknown), device (number; null when
 *   negative), step (number: the last step the rank reported; null before the first),
 *   step_us (number: observed µs per step, to the agent's ms resolution; null when unknown), run
 * (number: the capture the rank is in now; null when idle), conflict (text: "live on N hosts"
 * when the job's rank is registered on more than one host, which collectord refuses to
 * capture; null otherwise) as aligned text, CSV, or (--json) an array of objects keyed by
 * those names; each conflict is also said on stderr in text output. With no job, the text output is
 * the header alone and a hint goes to stderr; CSV is the header, JSON
 * "[]".
 *
 * Exit status (kprofctl.h): 0 listed (also when none is registered), 2 bad usage, 5
 * collectord unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "jobs"
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct jobs_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    char *job;
};

#define OFF(f) offsetof(struct jobs_config, f)
static const struct kp_config_def jobs_defs[] = {
    { "job", KP_CONFIG_STRING, "", 0, 4096, OFF(job), "only this job's ranks (default: all jobs)",
      NULL, false },
};
#undef OFF
#define N_DEFS (sizeof(jobs_defs) / sizeof(jobs_defs[0]))

enum jobs_col {
    COL_JOB,
    COL_WORLD_SIZE,
    COL_RANK,
    COL_HOST,
    COL_PID,
    COL_LOCAL_RANK,
    COL_DEVICE,
    COL_STEP,
    COL_STEP_US,
    COL_RUN,
    COL_CONFLICT,
    N_COLS,
};

static const struct kp_table_col jobs_cols[N_COLS] = {
    [COL_JOB] = { "job", KP_TABLE_TEXT },
    [COL_WORLD_SIZE] = { "world_size", KP_TABLE_NUMERIC },
    [COL_RANK] = { "rank", KP_TABLE_NUMERIC },
    [COL_HOST] = { "host", KP_TABLE_TEXT },
    [COL_PID] = { "pid", KP_TABLE_NUMERIC },
    [COL_LOCAL_RANK] = { "local_rank", KP_TABLE_NUMERIC },
    [COL_DEVICE] = { "device", KP_TABLE_NUMERIC },
    [COL_STEP] = { "step", KP_TABLE_NUMERIC },
    [COL_STEP_US] = { "step_us", KP_TABLE_NUMERIC },
    [COL_RUN] = { "run", KP_TABLE_NUMERIC },
    [COL_CONFLICT] = { "conflict", KP_TABLE_TEXT },
};

struct job_row {
    const Kprof__V1__Job *job;
    const Kprof__V1__JobRank *rank;
    unsigned hosts; /* distinct hosts the job's rank is live on (0: rank unknown) */
};

static int cmp_row(const void *a, const void *b)
{
    const struct job_row *x = a, *y = b;
    int c = strcmp(x->job->name, y->job->name);

    if (c != 0) {
        return c;
    }
    if (x->rank->rank != y->rank->rank) {
        return x->rank->rank < y->rank->rank ? -1 : 1;
    }
    if ((c = strcmp(x->rank->host, y->rank->host)) != 0) {
        return c;
    }
    return (x->rank->pid > y->rank->pid) - (x->rank->pid < y->rank->pid);
}

static int add_row(struct kp_table *t, const struct job_row *row)
{
    const Kprof__V1__Job *j = row->job;
    const Kprof__V1__JobRank *r = row->rank;
    int rc = 0;

    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_JOB, j->name);
    if (j->world_size > 0) {
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_WORLD_SIZE, j->world_size);
    }
    if (r->rank >= 0) {
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_RANK, r->rank);
    }
    rc = rc != 0 ? rc
                 : kp_table_set_str(t, COL_HOST,
                                    r->host != NULL && r->host[0] != '\0' ? r->host : NULL);
    rc = rc != 0 ? rc : kp_table_set_u64(t, COL_PID, r->pid);
    if (r->local_rank >= 0) {
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_LOCAL_RANK, r->local_rank);
    }
    if (r->device >= 0) {
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_DEVICE, r->device);
    }
    if (r->step >= 0) {
        rc = rc != 0 ? rc : kp_table_set_i64(t, COL_STEP, r->step);
    }
    if (r->step_ms > 0) {
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_STEP_US, (uint64_t) r->step_ms * 1000);
    }
    if (r->run_id > 0) {
        rc = rc != 0 ? rc : kp_table_set_u64(t, COL_RUN, r->run_id);
    }
    if (row->hosts > 1) {
        char buf[64];

        snprintf(buf, sizeof(buf), "live on %u hosts", row->hosts);
        rc = rc != 0 ? rc : kp_table_set_str(t, COL_CONFLICT, buf);
    }
    return rc;
}

/* Whether a and b are the same rank of the same job (a known rank). */
static bool same_rank(const struct job_row *a, const struct job_row *b)
{
    return a->rank->rank >= 0 && a->rank->rank == b->rank->rank &&
           strcmp(a->job->name, b->job->name) == 0;
}

/* Sets each row's hosts: rows sorted by job, rank, then host. */
static void count_hosts(struct job_row *rows, size_t n)
{
    for (size_t i = 0, j; i < n; i = j) {
        unsigned hosts = 1;

        for (j = i + 1; j < n && same_rank(&rows[i], &rows[j]); j++) {
            hosts += strcmp(rows[j - 1].rank->host, rows[j].rank->host) != 0;
        }
        for (size_t k = i; k < j; k++) {
            rows[k].hosts = rows[i].rank->rank >= 0 ? hosts : 0;
        }
    }
}

/* The rows of resp sorted, into *out (owned: free). Returns 0 or -ENOMEM. */
static int collect(const Kprof__V1__ListJobsResponse *resp, struct job_row **out, size_t *n_out)
{
    struct job_row *rows;
    size_t n = 0;

    for (size_t i = 0; i < resp->n_jobs; i++) {
        n += resp->jobs[i]->n_ranks;
    }
    if ((rows = malloc((n + 1) * sizeof(*rows))) == NULL) {
        return -ENOMEM;
    }
    n = 0;
    for (size_t i = 0; i < resp->n_jobs; i++) {
        for (size_t k = 0; k < resp->jobs[i]->n_ranks; k++) {
            rows[n].job = resp->jobs[i];
            rows[n].rank = resp->jobs[i]->ranks[k];
            n++;
        }
    }
    qsort(rows, n, sizeof(*rows), cmp_row);
    count_hosts(rows, n);
    *out = rows;
    *n_out = n;
    return 0;
}

static int jobs_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct jobs_config *cfg = v->cfg;

    ((Kprof__V1__ListJobsRequest *) msg)->job = cfg->job;
    return 0;
}

static int jobs_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    struct job_row *rows = NULL;
    size_t n_rows = 0, conflicts = 0;
    int r;

    if ((r = collect((const Kprof__V1__ListJobsResponse *) msg, &rows, &n_rows)) != 0) {
        return r;
    }
    for (size_t i = 0; i < n_rows && r == 0; i++) {
        r = add_row(t, &rows[i]);
        conflicts += rows[i].hosts > 1;
    }
    free(rows);
    /* The text table shows the conflict column only when there is one (JSON and CSV keep it). */
    if (conflicts == 0 && v->format == KP_TABLE_FORMAT_TEXT) {
        kp_rpcverb_default_columns(v, t,
                                   "job,world_size,rank,host,pid,local_rank,device,step,"
                                   "step_us,run");
    }
    return r;
}

/* Says on stderr, once per rank, which ranks are live on several hosts. */
static void warn_conflicts(const Kprof__V1__ListJobsResponse *resp)
{
    struct job_row *rows = NULL;
    size_t n = 0;

    if (collect(resp, &rows, &n) != 0) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (rows[i].hosts > 1 && (i == 0 || !same_rank(&rows[i - 1], &rows[i]))) {
            fprintf(stderr,
                    "kprofctl jobs: job \"%s\" rank %d is live on %u hosts (first %s): "
                    "collectord will not capture it until the stale worker exits\n",
                    rows[i].job->name, rows[i].rank->rank, rows[i].hosts, rows[i].rank->host);
        }
    }
    free(rows);
}

/* The table; text says on stderr what to do when no job is registered. */
static int jobs_print(struct kp_rpcverb *v, const struct kp_table *t, const ProtobufCMessage *msg)
{
    const struct jobs_config *cfg = v->cfg;
    int rc = kp_rpcverb_print(v, t, stdout);

    if (rc != 0 || v->format != KP_TABLE_FORMAT_TEXT) {
        return rc;
    }
    if (kp_table_rows(t) > 0) {
        warn_conflicts((const Kprof__V1__ListJobsResponse *) msg);
        return rc;
    }
    if (cfg->job[0] != '\0') {
        fprintf(stderr,
                "kprofctl jobs: job \"%s\" is not registered: start its workers with "
                "kprof-run and check that kprof-agent runs on their nodes\n",
                cfg->job);
    }
    else {
        fprintf(stderr, "kprofctl jobs: no job is registered: start workers with kprof-run "
                        "and check that kprof-agent runs on their nodes\n");
    }
    return rc;
}

static const struct kp_rpcverb_spec jobs_spec = {
    .name = "jobs",
    .synopsis =
        "kprofctl jobs [--job J] [--json|--csv] [-c COLS] [-w WIDTH]\n"
        "  The ranks registered with attached kprof-agents (Control.ListJobs), one row\n"
        "  each, by job then rank: job, world_size, rank, host, pid, local_rank, device,\n"
        "  step (the last one reported), step_us, run (the capture it is in; - when idle),\n"
        "  conflict (\"live on N hosts\": the rank is registered on several hosts, and\n"
        "  collectord refuses to capture it; in text only when some rank is).\n",
    .exit_ok = "listed (also when no job is registered)",
    .defs = jobs_defs,
    .n_defs = N_DEFS,
    .cols = jobs_cols,
    .n_cols = N_COLS,
    .method = "ListJobs",
    .req_desc = &kprof__v1__list_jobs_request__descriptor,
    .resp_desc = &kprof__v1__list_jobs_response__descriptor,
    .request = jobs_request,
    .rows = jobs_rows,
    .print = jobs_print,
};

int kprofctl_jobs(int argc, char **argv)
{
    struct jobs_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&jobs_spec, &cfg, argc, argv);
}
