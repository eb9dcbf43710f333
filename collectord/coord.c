#define KP_LOG_MODULE "coord"
#include "coord.h"
#include "coord_int.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_ranks.h"
#include "kp_str.h"
#include "kp_strbuf.h"
#include "kp_wire.h"
#include "store.h"
#include "summary.h"

/* ---- lookups (mu held) ---- */

struct cap *kp__coord_cap_by_run(struct kp_coord *c, uint64_t run_id)
{
    for (struct cap *k = c->caps; k != NULL; k = k->next) {
        if (run_id != 0 && k->run_id == run_id) {
            return k;
        }
    }
    return NULL;
}

/* The capture of job that is not over (also one whose run is still being created). */
static struct cap *cap_active_of_job(struct kp_coord *c, const char *job)
{
    for (struct cap *k = c->caps; k != NULL; k = k->next) {
        if (!k->ended && strcmp(k->job, job) == 0) {
            return k;
        }
    }
    return NULL;
}

static struct agent *agent_by_id(struct kp_coord *c, uint64_t id)
{
    struct agent *best = NULL;

    for (struct agent *a = c->agents; a != NULL; a = a->next) {
        if (a->id == id && id != 0 && (best == NULL || (best->call == NULL && a->call != NULL))) {
            best = a;
        }
    }
    return best;
}

static void cap_free(struct cap *k)
{
    if (k != NULL) {
        free(k->ranks);
        free(k);
    }
}

static void cap_unlink(struct kp_coord *c, struct cap *k)
{
    for (struct cap **pp = &c->caps; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == k) {
            *pp = k->next;
            return;
        }
    }
}

/* ---- commands to agents (mu held) ---- */

static void send_cmd(struct agent *a, const Kprof__V1__CaptureCommand *cmd)
{
    int rc;

    if (a == NULL || a->call == NULL) {
        return;
    }
    if ((rc = kp_rpc_call_send(a->call, &cmd->base)) != 0) {
        kp_log_warn("cannot send a command to the agent host=%s kind=%d run=%" PRIu64 " err=%s",
                    a->host, (int) cmd->kind, cmd->run_id, kp_strerror(rc));
    }
}

/* Sends ARM for the ranks of k hosted by a that are still pending (all: every one of them). */
void kp__coord_send_arm(struct kp_coord *c, struct cap *k, struct agent *a, bool all)
{
    Kprof__V1__CaptureCommand cmd = KPROF__V1__CAPTURE_COMMAND__INIT;
    int32_t *ranks = malloc((k->n ? k->n : 1) * sizeof(*ranks));
    long long now = kp_mono_ms();
    size_t n = 0;

    if (ranks == NULL) {
        return;
    }
    for (size_t i = 0; i < k->n; i++) {
        struct crank *r = &k->ranks[i];

        if (r->agent_id == a->id && (all || r->state == ST_PENDING)) {
            ranks[n++] = r->rank;
            r->armed_ms = now;
        }
    }
    if (n > 0) {
        cmd.kind = KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM;
        cmd.run_id = k->run_id;
        cmd.job = k->job;
        cmd.n_ranks = n;
        cmd.ranks = ranks;
        cmd.start_step = k->start_step;
        cmd.steps = k->steps;
        cmd.duration_ms = k->duration_ms;
        cmd.activities = k->activities;
        cmd.world_size = k->world_size;
        send_cmd(a, &cmd);
        kp_log_info("capture armed on agent run=%" PRIu64 " host=%s ranks=%zu start_step=%" PRId64,
                    k->run_id, a->host, n, k->start_step);
    }
    free(ranks);
    (void) c;
}

/* Sends a STOP or FORGET for k to every agent hosting one of its ranks. */
static void send_to_hosts(struct kp_coord *c, struct cap *k, int kind, const char *reason)
{
    Kprof__V1__CaptureCommand cmd = KPROF__V1__CAPTURE_COMMAND__INIT;

    cmd.kind = (Kprof__V1__CaptureCommand__Kind) kind;
    cmd.run_id = k->run_id;
    cmd.job = k->job;
    cmd.reason = (char *) (reason != NULL ? reason : "");
    for (struct agent *a = c->agents; a != NULL; a = a->next) {
        bool hosts = false;

        for (size_t i = 0; i < k->n && !hosts; i++) {
            hosts = k->ranks[i].agent_id == a->id;
        }
        if (hosts) {
            send_cmd(a, &cmd);
        }
    }
}

static void rank_set_failed(struct cap *k, struct crank *r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void rank_set_failed(struct cap *k, struct crank *r, const char *fmt, ...)
{
    va_list ap;

    if (kp__coord_terminal(r->state)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
    r->state = ST_FAILED;
    kp_log_warn("capture rank failed run=%" PRIu64 " rank=%d host=%s reason=\"%s\"", k->run_id,
                r->rank, r->host, r->reason);
}

/* ---- replies ---- */

/* A Capture message over a struct cap (strings borrowed from it). */
struct capmsg {
    Kprof__V1__Capture m;
    Kprof__V1__Run run;
    Kprof__V1__CaptureRank *r;
    Kprof__V1__CaptureRank **rp;
};

static int capmsg_fill(struct capmsg *cm, struct cap *k)
{
    kprof__v1__capture__init(&cm->m);
    kprof__v1__run__init(&cm->run);
    cm->r = calloc(k->n ? k->n : 1, sizeof(*cm->r));
    cm->rp = calloc(k->n ? k->n : 1, sizeof(*cm->rp));
    if (cm->r == NULL || cm->rp == NULL) {
        free(cm->r);
        free(cm->rp);
        cm->r = NULL;
        cm->rp = NULL;
        return -ENOMEM;
    }
    cm->run.id = k->run_id;
    cm->run.job = k->job;
    cm->run.name = k->name;
    cm->run.state = (Kprof__V1__RunState) k->run_state;
    cm->run.source = KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE;
    cm->run.world_size = k->world_size;
    cm->run.created_ns = k->created_ns;
    cm->run.ended_ns = k->ended_ns;
    cm->m.run = &cm->run;
    cm->m.start_step = k->start_step;
    cm->m.steps = k->steps;
    cm->m.duration_ms = k->duration_ms;
    cm->m.activities = k->activities_text;
    cm->m.deadline_ns = k->deadline_ns;
    cm->m.stopped = k->stopped;
    for (size_t i = 0; i < k->n; i++) {
        Kprof__V1__CaptureRank *r = &cm->r[i];
        struct crank *q = &k->ranks[i];

        kprof__v1__capture_rank__init(r);
        r->rank = q->rank;
        r->host = q->host;
        r->pid = q->pid;
        r->state = (Kprof__V1__RankState) q->state;
        r->records = q->records;
        r->dropped = q->dropped;
        r->reason = q->reason;
        r->first_step = q->first_step;
        r->last_step = q->last_step;
        cm->rp[i] = r;
    }
    cm->m.n_ranks = k->n;
    cm->m.ranks = cm->rp;
    return 0;
}

static void capmsg_fini(struct capmsg *cm)
{
    free(cm->r);
    free(cm->rp);
}

/* Answers call with k as a Capture, or (as_list) as a CaptureStatusResponse of one. */
static void reply_capture(struct kp_rpc_call *call, struct cap *k, bool as_list)
{
    Kprof__V1__CaptureStatusResponse resp = KPROF__V1__CAPTURE_STATUS_RESPONSE__INIT;
    Kprof__V1__Capture *one[1];
    struct capmsg cm;

    if (capmsg_fill(&cm, k) != 0) {
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        return;
    }
    one[0] = &cm.m;
    resp.n_captures = 1;
    resp.captures = one;
    kp_rpc_call_reply(call, as_list ? &resp.base : &cm.m.base);
    capmsg_fini(&cm);
}

/* ---- ListJobs ---- */

static int procref_cmp(const void *x, const void *y)
{
    const struct procref *a = x, *b = y;
    int d = strcmp(a->p->job, b->p->job);

    if (d != 0) {
        return d;
    }
    return (a->p->rank > b->p->rank) - (a->p->rank < b->p->rank);
}

/* The processes of job (NULL: all) on attached agents, sorted by job and rank (mu held).
 * Returns the count, or -ENOMEM; *out is owned by the caller. */
long kp__coord_gather(struct kp_coord *c, const char *job, struct procref **out)
{
    size_t n = 0, cap = 0;
    struct procref *v = NULL;

    for (struct agent *a = c->agents; a != NULL; a = a->next) {
        if ((a->call == NULL && !a->local) || a->report == NULL) {
            continue;
        }
        for (size_t i = 0; i < a->report->n_processes; i++) {
            const Kprof__V1__AgentProcess *p = a->report->processes[i];

            if (job != NULL && strcmp(p->job, job) != 0) {
                continue;
            }
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                struct procref *nv = realloc(v, ncap * sizeof(*nv));

                if (nv == NULL) {
                    free(v);
                    return -ENOMEM;
                }
                v = nv;
                cap = ncap;
            }
            v[n].p = p;
            v[n].a = a;
            n++;
        }
    }
    if (n > 1) {
        qsort(v, n, sizeof(*v), procref_cmp);
    }
    *out = v;
    return (long) n;
}

void kp_coord_list_jobs(struct kp_coord *c, struct kp_rpc_call *call,
                        const Kprof__V1__ListJobsRequest *req)
{
    Kprof__V1__ListJobsResponse resp = KPROF__V1__LIST_JOBS_RESPONSE__INIT;
    Kprof__V1__Job *jobs = NULL, **jp = NULL;
    Kprof__V1__JobRank *ranks = NULL, **rp = NULL;
    struct procref *v = NULL;
    size_t nj = 0;
    long n;

    if (!kp__coord_text_ok(req->job, KP_COORD_MAX_TEXT)) {
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "job is not UTF-8 of at most 256 bytes");
        return;
    }
    pthread_mutex_lock(&c->mu);
    n = kp__coord_gather(c, req->job[0] ? req->job : NULL, &v);
    if (n < 0 || (n > 0 && ((jobs = calloc((size_t) n, sizeof(*jobs))) == NULL ||
                            (jp = calloc((size_t) n, sizeof(*jp))) == NULL ||
                            (ranks = calloc((size_t) n, sizeof(*ranks))) == NULL ||
                            (rp = calloc((size_t) n, sizeof(*rp))) == NULL))) {
        pthread_mutex_unlock(&c->mu);
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        goto out;
    }
    for (long i = 0; i < n; i++) {
        const Kprof__V1__AgentProcess *p = v[i].p;
        Kprof__V1__JobRank *r = &ranks[i];
        Kprof__V1__Job *j;

        if (nj == 0 || strcmp(jobs[nj - 1].name, p->job) != 0) {
            struct cap *k = cap_active_of_job(c, p->job);

            j = &jobs[nj];
            kprof__v1__job__init(j);
            j->name = p->job;
            j->ranks = &rp[i];
            j->run_id = k != NULL ? k->run_id : 0;
            jp[nj++] = j;
        }
        j = &jobs[nj - 1];
        kprof__v1__job_rank__init(r);
        r->rank = p->rank;
        r->host = (char *) v[i].a->host;
        r->pid = p->pid;
        r->local_rank = p->local_rank;
        r->device = p->device;
        r->step = p->step;
        r->step_ms = p->step_ms;
        r->run_id = p->run_id;
        rp[i] = r;
        j->n_ranks++;
        if (p->world_size > j->world_size) {
            j->world_size = p->world_size;
        }
        {
            bool seen = false;

            for (size_t q = 0; q + 1 < j->n_ranks && !seen; q++) {
                seen = strcmp(j->ranks[q]->host, r->host) == 0;
            }
            j->hosts += seen ? 0 : 1;
        }
    }
    resp.n_jobs = nj;
    resp.jobs = jp;
    kp_rpc_call_reply(call, &resp.base);
    pthread_mutex_unlock(&c->mu);
out:
    free(v);
    free(jobs);
    free(jp);
    free(ranks);
    free(rp);
}

/* ---- StopCapture ---- */

void kp_coord_stop(struct kp_coord *c, struct kp_rpc_call *call,
                   const Kprof__V1__StopCaptureRequest *req)
{
    char err[600];
    struct cap *k;

    if (!kp__coord_text_ok(req->job, KP_COORD_MAX_TEXT) ||
        (req->run_id == 0) == (req->job[0] == '\0')) {
        kp_rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                           "give either run_id or job (the job's capture in progress)");
        return;
    }
    pthread_mutex_lock(&c->mu);
    k = req->run_id != 0 ? kp__coord_cap_by_run(c, req->run_id) : cap_active_of_job(c, req->job);
    if (k == NULL || k->run_id == 0) {
        pthread_mutex_unlock(&c->mu);
        if (req->run_id != 0) {
            snprintf(err, sizeof(err),
                     "run %" PRIu64 " is not a capture in progress (kprofctl status lists the "
                     "captures; kprofctl runs lists every run)",
                     req->run_id);
        }
        else {
            snprintf(err, sizeof(err),
                     "no capture of job %s is in progress (kprofctl status lists the captures)",
                     req->job);
        }
        kp_rpc_call_finish(call, GRPC_STATUS_NOT_FOUND, err);
        return;
    }
    if (k->ended || k->ending) {
        snprintf(err, sizeof(err),
                 "run %" PRIu64 " has ended already (kprofctl status --run %" PRIu64 " shows how)",
                 k->run_id, k->run_id);
        pthread_mutex_unlock(&c->mu);
        kp_rpc_call_finish(call, GRPC_STATUS_FAILED_PRECONDITION, err);
        return;
    }
    if (!k->stopped) {
        k->stopped = true;
        snprintf(err, sizeof(err), "stopped by %s", kp_rpc_call_peer(call));
        send_to_hosts(c, k, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP, err);
        kp_log_info("capture stop requested run=%" PRIu64 " job=%s peer=%s", k->run_id, k->job,
                    kp_rpc_call_peer(call));
    }
    reply_capture(call, k, false);
    pthread_mutex_unlock(&c->mu);
}

/* ---- StartCapture ---- */

/* The step a process is most likely at now: its report moved on by its step rate. */
static int64_t step_now(const struct procref *pr, long long now)
{
    const Kprof__V1__AgentProcess *p = pr->p;
    long long age = (long long) p->step_age_ms + (now - pr->a->report_ms);

    if (p->step < 0 || p->step_ms == 0 || age <= 0) {
        return p->step;
    }
    return p->step + age / p->step_ms;
}

static grpc_status_code finish_err(struct kp_rpc_call *call, grpc_status_code code, const char *msg)
{
    kp_log_info("StartCapture refused status=%s err=\"%s\" peer=%s", kp_rpc_status_name(code), msg,
                kp_rpc_call_peer(call));
    kp_rpc_call_finish(call, code, msg);
    return code;
}

/* Answers NOT_FOUND for a job no attached agent hosts, naming the jobs they do host. mu held. */
static void refuse_unknown_job(struct kp_coord *c, struct kp_rpc_call *call, const char *job)
{
    struct procref *all_v = NULL;
    long na = kp__coord_gather(c, NULL, &all_v);
    struct kp_strbuf sb;
    char err[1400];

    kp_strbuf_init(&sb, 300);
    for (long i = 0; i < na; i++) {
        if (i == 0 || strcmp(all_v[i].p->job, all_v[i - 1].p->job) != 0) {
            kp_strbuf_appendf(&sb, "%s%s", sb.len ? ", " : "", all_v[i].p->job);
        }
    }
    snprintf(err, sizeof(err),
             "job %s is not registered with any attached agent; registered jobs: %s (kprofctl "
             "jobs lists them; workers register when started with kprof-run on a node whose "
             "kprof-agent is attached to this collectord)",
             job, sb.len ? sb.data : "none");
    kp_strbuf_fini(&sb);
    free(all_v);
    finish_err(call, GRPC_STATUS_NOT_FOUND, err);
}

/* The steps the selected ranks are at (-1 / INT64_MAX: none known) and their step times in ms
 * (0: none known). */
struct step_span {
    int64_t min_step, max_step;
    long long fastest_ms, slowest_ms;
};

/* Sets k's window (a common future step, or a time window when no rank reports steps) and its
 * deadline. */
static void set_window(const struct kp_coord *c, struct cap *k,
                       const Kprof__V1__StartCaptureRequest *req, long long now,
                       struct step_span sp)
{
    long long budget;

    k->steps = req->steps;
    k->duration_ms = req->duration_ms;
    if (k->steps == 0 && k->duration_ms == 0) {
        k->steps = (uint32_t) c->o.default_steps;
    }
    if (k->steps > 0 && sp.max_step >= 0) {
        /* a warm-up step, then the window, plus what the fastest rank steps while the
         * command travels to every agent */
        k->start_step =
            sp.max_step + 2 +
            (sp.fastest_ms > 0 ? (c->o.start_margin_ms + sp.fastest_ms - 1) / sp.fastest_ms
                               : KP_COORD_UNKNOWN_RATE);
    }
    else {
        k->start_step = -1;
        if (k->steps > 0 && k->duration_ms == 0) {
            k->duration_ms = 5000; /* no steps known: a 5 s time window */
        }
        k->steps = 0;
    }
    budget = c->o.min_deadline_ms;
    if (k->steps > 0 && sp.slowest_ms > 0) {
        long long need =
            2 * (k->start_step - (sp.min_step > 0 ? sp.min_step : 0) + (long long) k->steps + 5) *
                sp.slowest_ms +
            60000;
        budget = need > budget ? need : budget;
    }
    if (k->duration_ms > 0 && (long long) k->duration_ms + 60000 > budget) {
        budget = (long long) k->duration_ms + 60000;
    }
    if (req->deadline_ms > 0) {
        budget = (long long) req->deadline_ms;
    }
    k->deadline_ms = now + budget;
    k->deadline_ns = kp_real_ns() + (int64_t) budget * 1000000;
}

/* The job's world size as its processes report it (at least above the highest rank). */
static uint32_t job_world(const struct procref *v, long n)
{
    uint32_t world = 0;

    for (long i = 0; i < n; i++) {
        if (v[i].p->world_size > world) {
            world = v[i].p->world_size;
        }
        if (v[i].p->rank >= 0 && (uint32_t) v[i].p->rank >= world) {
            world = (uint32_t) v[i].p->rank + 1;
        }
    }
    return world;
}

/* req->ranks ("all", "0,3-5") into sel (world entries). 0, or -1 after answering the call. */
static int select_ranks(struct kp_rpc_call *call, const Kprof__V1__StartCaptureRequest *req,
                        uint32_t world, uint8_t *sel)
{
    char err[1400];
    long bad_rank = 0;
    bool all;
    int rc;

    rc = kp_ranks_parse(req->ranks, world, sel, &all, &bad_rank);
    if (rc == -ERANGE) {
        snprintf(err, sizeof(err),
                 "ranks %.100s: rank %ld is outside job %s's world size %u (its ranks are 0..%u)",
                 req->ranks, bad_rank, req->job, world, world - 1);
        finish_err(call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return -1;
    }
    if (rc != 0) {
        snprintf(err, sizeof(err), "ranks %.100s: not a rank list (use all, or e.g. 0,3-5)",
                 req->ranks);
        finish_err(call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return -1;
    }
    if (all) {
        memset(sel, 1, world);
    }
    return 0;
}

/* Each selected rank's process into by_rank (world entries; missing: world bytes of room) and
 * their count into *nsel. 0, or -1 after answering the call when a selected rank has no
 * process, one that is capturing already, or processes on two agents (two live workers claim
 * that rank: which one is the job's is not ours to guess). */
static int pick_procs(struct kp_rpc_call *call, const Kprof__V1__StartCaptureRequest *req,
                      const struct procref *v, long n, uint32_t world, const uint8_t *sel,
                      const struct procref **by_rank, uint8_t *missing, size_t *nsel)
{
    char err[1400], list[400];
    bool any_missing = false;

    /* one process per rank: the one reported most recently if a rank shows up twice */
    for (long i = 0; i < n; i++) {
        int32_t r = v[i].p->rank;

        if (r < 0 || (uint32_t) r >= world) {
            continue;
        }
        if (by_rank[r] != NULL && by_rank[r]->a != v[i].a && sel[r]) {
            snprintf(err, sizeof(err),
                     "rank %d of job %s is registered on two hosts, %s (pid %u) and %s (pid "
                     "%u): two live workers claim it; stop the stray one (check RANK and the "
                     "job id) and retry",
                     r, req->job, by_rank[r]->a->host, by_rank[r]->p->pid, v[i].a->host,
                     v[i].p->pid);
            finish_err(call, GRPC_STATUS_FAILED_PRECONDITION, err);
            return -1;
        }
        if (by_rank[r] == NULL || by_rank[r]->a->report_ms < v[i].a->report_ms) {
            by_rank[r] = &v[i];
        }
    }
    for (uint32_t r = 0; r < world; r++) {
        if (sel[r] && by_rank[r] == NULL) {
            missing[r] = 1;
            any_missing = true;
        }
        *nsel += sel[r];
    }
    if (any_missing) {
        snprintf(err, sizeof(err),
                 "no attached agent hosts rank(s) %s of job %s (world size %u): start kprof-agent "
                 "with --collector pointing here on their nodes, or pick --ranks among the "
                 "attached ones (kprofctl jobs lists them)",
                 kp_ranks_format(missing, world, list, sizeof(list)), req->job, world);
        finish_err(call, GRPC_STATUS_FAILED_PRECONDITION, err);
        return -1;
    }
    for (uint32_t r = 0; r < world; r++) {
        if (sel[r] && by_rank[r]->p->run_id != 0) {
            snprintf(err, sizeof(err),
                     "rank %u of job %s (pid %u on %s) is capturing for run %" PRIu64
                     " already: wait for it to end (kprofctl status --run %" PRIu64
                     " --watch) or end it (kprofctl stop --run %" PRIu64 ")",
                     r, req->job, by_rank[r]->p->pid, by_rank[r]->a->host, by_rank[r]->p->run_id,
                     by_rank[r]->p->run_id, by_rank[r]->p->run_id);
            finish_err(call, GRPC_STATUS_ALREADY_EXISTS, err);
            return -1;
        }
    }
    return 0;
}

/* k's ranks, one per selected rank, pending on its process's agent (k->ranks has room for
 * them). Returns the steps they are at and their step times. */
static struct step_span plan_ranks(struct cap *k, const struct procref *const *by_rank,
                                   const uint8_t *sel, uint32_t world, long long now)
{
    struct step_span sp = { INT64_MAX, -1, 0, 0 };

    for (uint32_t r = 0; r < world; r++) {
        const struct procref *pr = by_rank[r];
        struct crank *q;
        int64_t at;

        if (!sel[r]) {
            continue;
        }
        q = &k->ranks[k->n++];
        q->rank = (int32_t) r;
        q->state = ST_PENDING;
        q->agent_id = pr->a->id;
        kp__coord_copy_text(q->agent_by, sizeof(q->agent_by), pr->a->principal);
        kp__coord_copy_text(q->host, sizeof(q->host), pr->a->host);
        q->pid = pr->p->pid;
        q->first_step = -1;
        q->last_step = -1;
        at = step_now(pr, now);
        if (at > sp.max_step) {
            sp.max_step = at;
        }
        if (at < sp.min_step) {
            sp.min_step = at;
        }
        if (pr->p->step_ms > 0 && (sp.fastest_ms == 0 || pr->p->step_ms < sp.fastest_ms)) {
            sp.fastest_ms = pr->p->step_ms;
        }
        if (pr->p->step_ms > sp.slowest_ms) {
            sp.slowest_ms = pr->p->step_ms;
        }
    }
    return sp;
}

/* Validates req and reserves the ranks: a new capture (run_id 0) linked into c. Returns it,
 * or NULL after answering the call. mu held. */
static struct cap *plan(struct kp_coord *c, struct kp_rpc_call *call,
                        const Kprof__V1__StartCaptureRequest *req, uint32_t activities)
{
    char err[1400];
    struct procref *v = NULL;
    const struct procref **by_rank = NULL;
    uint8_t *sel = NULL, *missing = NULL;
    struct cap *k = NULL, *busy;
    uint32_t world;
    long long now = kp_mono_ms();
    size_t nsel = 0;
    long n;

    n = kp__coord_gather(c, req->job, &v);
    if (n < 0) {
        finish_err(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        goto out;
    }
    if (n == 0) {
        refuse_unknown_job(c, call, req->job);
        goto out;
    }
    if ((busy = cap_active_of_job(c, req->job)) != NULL) {
        snprintf(err, sizeof(err),
                 "job %s is already capturing (run %" PRIu64
                 "): wait for it (kprofctl status --run %" PRIu64
                 " --watch) or stop it (kprofctl stop --run %" PRIu64 ")",
                 req->job, busy->run_id, busy->run_id, busy->run_id);
        finish_err(call, GRPC_STATUS_ALREADY_EXISTS, err);
        goto out;
    }
    world = job_world(v, n);
    if (world == 0 || (sel = calloc(world, 1)) == NULL || (missing = calloc(world, 1)) == NULL ||
        (by_rank = calloc(world, sizeof(*by_rank))) == NULL) {
        finish_err(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        goto out;
    }
    if (select_ranks(call, req, world, sel) != 0 ||
        pick_procs(call, req, v, n, world, sel, by_rank, missing, &nsel) != 0) {
        goto out;
    }
    if ((k = calloc(1, sizeof(*k))) == NULL ||
        (k->ranks = calloc(nsel, sizeof(*k->ranks))) == NULL) {
        free(k);
        k = NULL;
        finish_err(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        goto out;
    }
    kp__coord_copy_text(k->job, sizeof(k->job), req->job);
    kp__coord_copy_text(k->name, sizeof(k->name), req->name);
    kp__coord_copy_text(k->activities_text, sizeof(k->activities_text),
                        req->activities[0] ? req->activities : "all");
    k->world_size = world;
    k->activities = activities;
    k->run_state = KPROF__V1__RUN_STATE__RUN_STATE_OPEN;
    set_window(c, k, req, now, plan_ranks(k, by_rank, sel, world, now));
    k->next = c->caps;
    c->caps = k;
out:
    free(v);
    free(sel);
    free(missing);
    free(by_rank);
    return k;
}

/* Writes k's captures row (if first) and its ranks' rows, in one transaction. */
static int persist(PGconn *pg, const struct cap *k, bool first, char *err, size_t len)
{
    char run[24], a[24], b[24], d[24], e[24], f[24], g[24], h[24];
    int rc;

    snprintf(run, sizeof(run), "%" PRIu64, k->run_id);
    if ((rc = kp_pg_exec(pg, "BEGIN", err, len)) != 0) {
        return rc;
    }
    if (first) {
        const char *p[6] = { run, a, b, d, k->activities_text, e };

        snprintf(a, sizeof(a), "%" PRId64, k->start_step);
        snprintf(b, sizeof(b), "%u", k->steps);
        snprintf(d, sizeof(d), "%" PRIu64, k->duration_ms);
        snprintf(e, sizeof(e), "%" PRId64, k->deadline_ns / 1000);
        rc = kp_pg_query(pg,
                         "INSERT INTO captures (run_id, start_step, steps, duration_ms, "
                         "activities, deadline_at) VALUES ($1, $2, $3, $4, $5, "
                         "to_timestamp($6::bigint / 1e6))",
                         6, p, NULL, err, len);
    }
    else {
        const char *p[2] = { run, k->stopped ? "true" : "false" };

        rc = kp_pg_query(pg, "UPDATE captures SET stopped = $2 WHERE run_id = $1", 2, p, NULL, err,
                         len);
    }
    for (size_t i = 0; rc == 0 && i < k->n; i++) {
        const struct crank *q = &k->ranks[i];
        const char *p[11] = { run, a, b, q->host, d, e, f, g, h, q->reason, q->agent_by };

        snprintf(a, sizeof(a), "%d", q->rank);
        snprintf(b, sizeof(b), "%d", q->state);
        snprintf(d, sizeof(d), "%u", q->pid);
        snprintf(e, sizeof(e), "%" PRIu64, q->records);
        snprintf(f, sizeof(f), "%" PRIu64, q->dropped);
        snprintf(g, sizeof(g), "%" PRId64, q->first_step);
        snprintf(h, sizeof(h), "%" PRId64, q->last_step);
        rc = kp_pg_query(
            pg,
            "INSERT INTO capture_ranks (run_id, rank, state, host, pid, records, "
            "dropped, first_step, last_step, reason, agent_by) VALUES ($1, $2, $3, "
            "$4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (run_id, rank) DO UPDATE SET "
            "state = EXCLUDED.state, host = EXCLUDED.host, pid = EXCLUDED.pid, "
            "records = EXCLUDED.records, dropped = EXCLUDED.dropped, "
            "first_step = EXCLUDED.first_step, last_step = EXCLUDED.last_step, "
            "reason = EXCLUDED.reason, updated_at = now()",
            11, p, NULL, err, len);
    }
    if (rc != 0) {
        char ignore[64];

        kp_pg_exec(pg, "ROLLBACK", ignore, sizeof(ignore));
        return rc;
    }
    return kp_pg_exec(pg, "COMMIT", err, len);
}

static struct cap *cap_copy(const struct cap *k)
{
    struct cap *s = malloc(sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    *s = *k;
    s->next = NULL;
    if ((s->ranks = malloc((k->n ? k->n : 1) * sizeof(*s->ranks))) == NULL) {
        free(s);
        return NULL;
    }
    memcpy(s->ranks, k->ranks, k->n * sizeof(*s->ranks));
    return s;
}

void kp_coord_start(struct kp_coord *c, PGconn *pg, struct kp_rpc_call *call,
                    const Kprof__V1__StartCaptureRequest *req)
{
    Kprof__V1__Run run = KPROF__V1__RUN__INIT;
    char err[1200], pgerr[600], by[KP_STORE_PRINCIPAL_MAX];
    const char *bad = NULL;
    uint32_t activities = KP_ACT_DEFAULT;
    struct cap *k, *snap;
    int rc;

    if (req->job[0] == '\0' || !kp__coord_text_ok(req->job, KP_COORD_MAX_TEXT) ||
        !kp__coord_text_ok(req->name, KP_COORD_MAX_TEXT) ||
        !kp__coord_text_ok(req->ranks, KP_COORD_MAX_TEXT) ||
        !kp__coord_text_ok(req->activities, KP_COORD_MAX_TEXT)) {
        finish_err(call, GRPC_STATUS_INVALID_ARGUMENT,
                   "job is required; job, name, ranks and activities must be UTF-8 of at most "
                   "256 bytes");
        return;
    }
    if (req->n_metrics > 0) {
        finish_err(call, GRPC_STATUS_UNIMPLEMENTED,
                   "hardware counters (metrics) are not captured yet: the injection library "
                   "does not drive CUPTI's range profiler; start the capture without --metrics");
        return;
    }
    if (req->steps > KP_COORD_MAX_STEPS) {
        snprintf(err, sizeof(err), "steps %u is out of range (1..%d)", req->steps,
                 KP_COORD_MAX_STEPS);
        finish_err(call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return;
    }
    if ((long long) req->duration_ms > KP_COORD_MAX_DUR_MS ||
        (long long) req->deadline_ms > KP_COORD_MAX_DEADLINE) {
        finish_err(call, GRPC_STATUS_INVALID_ARGUMENT,
                   "duration is over 24 h or deadline over 7 days");
        return;
    }
    if (req->activities[0] != '\0' &&
        kp_wire_parse_activities(req->activities, &activities, &bad) != 0) {
        snprintf(err, sizeof(err),
                 "activities: unknown \"%.50s\" (use kernel,memcpy,memset,runtime,nvtx,sync,"
                 "overhead or all)",
                 bad != NULL ? bad : "");
        finish_err(call, GRPC_STATUS_INVALID_ARGUMENT, err);
        return;
    }
    if (pg == NULL) {
        finish_err(call, GRPC_STATUS_UNAVAILABLE,
                   "PostgreSQL is unreachable, so no run can be created; retry later");
        return;
    }
    if (kp_coord_refuse(c, call)) {
        return; /* stepped down while the request was queued */
    }
    pthread_mutex_lock(&c->mu);
    k = plan(c, call, req, activities);
    snap = k != NULL ? cap_copy(k) : NULL;
    pthread_mutex_unlock(&c->mu);
    if (k == NULL) {
        return;
    }
    if (snap == NULL) {
        rc = -ENOMEM;
        snprintf(pgerr, sizeof(pgerr), "out of memory");
        goto undo;
    }
    kp_store_principal(kp_rpc_call_identity(call), by, sizeof(by));
    rc = kp_store_create_run_by(pg, snap->job, snap->name, snap->world_size,
                                KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE, by, &run, pgerr,
                                sizeof(pgerr));
    if (rc != 0) {
        goto undo;
    }
    snap->run_id = run.id;
    if ((rc = persist(pg, snap, true, pgerr, sizeof(pgerr))) != 0) {
        Kprof__V1__Run ended = KPROF__V1__RUN__INIT;
        char ignore[300];

        kp_store_end_run(pg, run.id, true, &ended, ignore, sizeof(ignore));
        kp_store_run_fini(&ended);
        goto undo;
    }
    pthread_mutex_lock(&c->mu);
    k->run_id = run.id;
    k->created_ns = run.created_ns;
    for (struct agent *a = c->agents; a != NULL; a = a->next) {
        if (a->call != NULL) {
            kp__coord_send_arm(c, k, a, true);
        }
    }
    kp_log_info("capture started run=%" PRIu64 " job=%s ranks=%zu start_step=%" PRId64
                " steps=%u duration_ms=%" PRIu64 " deadline_s=%lld peer=%s",
                k->run_id, k->job, k->n, k->start_step, k->steps, k->duration_ms,
                (k->deadline_ms - kp_mono_ms()) / 1000, kp_rpc_call_peer(call));
    reply_capture(call, k, false);
    pthread_mutex_unlock(&c->mu);
    kp_store_run_fini(&run);
    cap_free(snap);
    return;
undo:
    pthread_mutex_lock(&c->mu);
    cap_unlink(c, k);
    pthread_mutex_unlock(&c->mu);
    cap_free(k);
    cap_free(snap);
    kp_store_run_fini(&run);
    snprintf(err, sizeof(err), "cannot record the capture in PostgreSQL (%s); retry later", pgerr);
    kp_log_warn("StartCapture failed job=%s err=\"%s\"", req->job, pgerr);
    kp_rpc_call_finish(
        call, rc == -ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_UNAVAILABLE, err);
}

/* ---- CaptureStatus ---- */

#define CAP_COLS                                                                         \
    "r.id, r.job, r.name, r.state, r.world_size, "                                       \
    "(extract(epoch FROM r.created_at) * 1000000000)::bigint, "                          \
    "coalesce((extract(epoch FROM r.ended_at) * 1000000000)::bigint, 0), c.start_step, " \
    "c.steps, c.duration_ms, c.activities, "                                             \
    "(extract(epoch FROM c.deadline_at) * 1000000000)::bigint, c.stopped"

/* Reads capture run_id from PostgreSQL into a new struct cap. Returns 0, KP_ENOTFOUND (with
 * the reason in err), KP_EPG or -ENOMEM. */
static int load_capture(PGconn *pg, uint64_t run_id, struct cap **out, char *err, size_t len)
{
    char run[24];
    const char *p[1] = { run };
    PGresult *res = NULL, *rr = NULL;
    struct cap *k;
    int rc;

    snprintf(run, sizeof(run), "%" PRIu64, run_id);
    if ((rc = kp_pg_query(pg,
                          "SELECT " CAP_COLS " FROM runs r JOIN captures c ON c.run_id = r.id "
                          "WHERE r.id = $1",
                          1, p, &res, err, len)) != 0) {
        return rc;
    }
    if (PQntuples(res) == 0) {
        PQclear(res);
        if ((rc = kp_pg_query(pg, "SELECT source FROM runs WHERE id = $1", 1, p, &res, err, len)) !=
            0) {
            return rc;
        }
        if (PQntuples(res) == 0) {
            snprintf(err, len, "there is no run %" PRIu64 " (kprofctl runs lists the runs)",
                     run_id);
        }
        else {
            snprintf(err, len,
                     "run %" PRIu64 " was not started with kprofctl start, so it has no capture "
                     "state (kprofctl runs shows it)",
                     run_id);
        }
        PQclear(res);
        return KP_ENOTFOUND;
    }
    if ((rc = kp_pg_query(pg,
                          "SELECT rank, state, host, pid, records, dropped, first_step, last_step, "
                          "reason FROM capture_ranks WHERE run_id = $1 ORDER BY rank",
                          1, p, &rr, err, len)) != 0) {
        PQclear(res);
        return rc;
    }
    if ((k = calloc(1, sizeof(*k))) == NULL ||
        (k->ranks = calloc((size_t) PQntuples(rr) + 1, sizeof(*k->ranks))) == NULL) {
        free(k);
        PQclear(res);
        PQclear(rr);
        return -ENOMEM;
    }
    k->run_id = run_id;
    kp__coord_copy_text(k->job, sizeof(k->job), PQgetvalue(res, 0, 1));
    kp__coord_copy_text(k->name, sizeof(k->name), PQgetvalue(res, 0, 2));
    k->run_state = (int) kp_pg_i64(res, 0, 3, 0);
    k->world_size = (uint32_t) kp_pg_i64(res, 0, 4, 0);
    k->created_ns = kp_pg_i64(res, 0, 5, 0);
    k->ended_ns = kp_pg_i64(res, 0, 6, 0);
    k->start_step = kp_pg_i64(res, 0, 7, 0);
    k->steps = (uint32_t) kp_pg_i64(res, 0, 8, 0);
    k->duration_ms = (uint64_t) kp_pg_i64(res, 0, 9, 0);
    kp__coord_copy_text(k->activities_text, sizeof(k->activities_text), PQgetvalue(res, 0, 10));
    k->deadline_ns = kp_pg_i64(res, 0, 11, 0);
    k->stopped = strcmp(PQgetvalue(res, 0, 12), "t") == 0;
    k->ended = true;
    for (int i = 0; i < PQntuples(rr); i++) {
        struct crank *q = &k->ranks[k->n++];

        q->rank = (int32_t) kp_pg_i64(rr, i, 0, 0);
        q->state = (int) kp_pg_i64(rr, i, 1, 0);
        kp__coord_copy_text(q->host, sizeof(q->host), PQgetvalue(rr, i, 2));
        q->pid = (uint32_t) kp_pg_i64(rr, i, 3, 0);
        q->records = (uint64_t) kp_pg_i64(rr, i, 4, 0);
        q->dropped = (uint64_t) kp_pg_i64(rr, i, 5, 0);
        q->first_step = kp_pg_i64(rr, i, 6, 0);
        q->last_step = kp_pg_i64(rr, i, 7, 0);
        kp__coord_copy_text(q->reason, sizeof(q->reason), PQgetvalue(rr, i, 8));
    }
    PQclear(res);
    PQclear(rr);
    *out = k;
    return 0;
}

void kp_coord_status(struct kp_coord *c, PGconn *pg, struct kp_rpc_call *call,
                     const Kprof__V1__CaptureStatusRequest *req)
{
    Kprof__V1__CaptureStatusResponse resp = KPROF__V1__CAPTURE_STATUS_RESPONSE__INIT;
    struct capmsg *cms = NULL;
    Kprof__V1__Capture **cp = NULL;
    struct cap *k = NULL;
    size_t limit = req->limit ? req->limit : KP_COORD_STATUS_LIMIT, n = 0;
    char err[600];
    int rc;

    if (req->run_id != 0) {
        pthread_mutex_lock(&c->mu);
        if ((k = kp__coord_cap_by_run(c, req->run_id)) != NULL) {
            reply_capture(call, k, true);
            pthread_mutex_unlock(&c->mu);
            return;
        }
        pthread_mutex_unlock(&c->mu);
        if (pg == NULL) {
            kp_rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE,
                               "PostgreSQL is unreachable and the run is not a capture in "
                               "progress; retry later");
            return;
        }
        if ((rc = load_capture(pg, req->run_id, &k, err, sizeof(err))) != 0) {
            kp_rpc_call_finish(call,
                               rc == KP_ENOTFOUND ? GRPC_STATUS_NOT_FOUND
                               : rc == -ENOMEM    ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                                  : GRPC_STATUS_UNAVAILABLE,
                               err);
            return;
        }
        reply_capture(call, k, true);
        cap_free(k);
        return;
    }
    pthread_mutex_lock(&c->mu);
    for (k = c->caps; k != NULL; k = k->next) {
        n += k->run_id != 0;
    }
    n = n < limit ? n : limit;
    if ((cms = calloc(n + 1, sizeof(*cms))) == NULL || (cp = calloc(n + 1, sizeof(*cp))) == NULL) {
        pthread_mutex_unlock(&c->mu);
        free(cms);
        kp_rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "collectord is out of memory");
        return;
    }
    for (k = c->caps; k != NULL && resp.n_captures < n; k = k->next) {
        if (k->run_id == 0) {
            continue;
        }
        if (capmsg_fill(&cms[resp.n_captures], k) != 0) {
            break;
        }
        cp[resp.n_captures] = &cms[resp.n_captures].m;
        resp.n_captures++;
    }
    resp.captures = cp;
    kp_rpc_call_reply(call, &resp.base);
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < resp.n_captures; i++) {
        capmsg_fini(&cms[i]);
    }
    free(cms);
    free(cp);
}

/* ---- the tick ---- */

/* An agent attached on host that has reported (its whole picture), or NULL. mu held. */
static struct agent *attached_on_host(struct kp_coord *c, const char *host)
{
    for (struct agent *a = c->agents; a != NULL; a = a->next) {
        if (a->call != NULL && a->id != 0 && a->report != NULL && strcmp(a->host, host) == 0) {
            return a;
        }
    }
    return NULL;
}

/* Fails what must fail now and returns (copies of) the captures to end. mu held. */
static size_t tick_locked(struct kp_coord *c, struct cap **todo, size_t max)
{
    long long now = kp_mono_ms();
    size_t nt = 0, kept = 0;

    for (struct cap *k = c->caps; k != NULL; k = k->next) {
        bool over = true, expired;

        if (k->run_id == 0 || k->ended || k->ending) {
            continue;
        }
        expired = now >= k->deadline_ms;
        for (size_t i = 0; i < k->n; i++) {
            struct crank *r = &k->ranks[i];
            struct agent *a;

            if (kp__coord_terminal(r->state)) {
                continue;
            }
            a = agent_by_id(c, r->agent_id);
            if (r->awaiting && expired) {
                rank_set_failed(k, r,
                                "the capture's deadline passed while %" PRIu64
                                " batches of the rank, acknowledged by collectord, were not all "
                                "stored in PostgreSQL (on their way through Kafka: are the sink "
                                "consumers, kprof-collectord --role sink, running, and "
                                "PostgreSQL reachable?); they are stored when they arrive",
                                r->mark_count);
            }
            else if (r->awaiting) {
                /* the agent's part is over: its going away changes nothing */
            }
            else if (k->adopted && r->agent_id == 0 && !expired) {
                struct agent *h = attached_on_host(c, r->host);

                if (h != NULL) {
                    /* its agent is back and reported its whole picture without the rank: it
                     * restarted (or its ARM never went out before the takeover) */
                    rank_set_failed(k, r,
                                    "the capture coordinator changed during the capture and the "
                                    "kprof-agent on host %s came back without the rank's "
                                    "capture (it restarted); the rows it stored before are kept",
                                    r->host);
                }
                else if (now - k->adopted_ms >= c->o.agent_grace_ms) {
                    rank_set_failed(k, r,
                                    "the capture coordinator changed during the capture and the "
                                    "kprof-agent on host %s did not reattach and report the rank "
                                    "within %lld s; the rows it stored before are kept",
                                    r->host, c->o.agent_grace_ms / 1000);
                }
            }
            else if (a == NULL || (a->call == NULL && now - a->gone_ms >= c->o.agent_grace_ms)) {
                rank_set_failed(k, r,
                                "lost contact with the kprof-agent on host %s for over %lld s "
                                "while the rank was %s (the agent stopped, or its connection to "
                                "collectord broke); the rows it stored before are kept",
                                r->host, c->o.agent_grace_ms / 1000,
                                kp__coord_state_name(r->state));
            }
            else if (expired) {
                rank_set_failed(k, r,
                                "the capture's deadline passed while the rank was %s (step "
                                "%" PRId64 " of the window %" PRId64 "..%" PRId64
                                "); the rows stored so far are kept (give kprofctl start a "
                                "longer --deadline if the steps are that slow)",
                                kp__coord_state_name(r->state), r->last_step, k->start_step,
                                k->start_step + (int64_t) k->steps - 1);
            }
            over &= kp__coord_terminal(r->state);
        }
        if (expired && !k->deadline_stop_sent) {
            k->deadline_stop_sent = true;
            send_to_hosts(c, k, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP, "deadline passed");
        }
        if (over && nt < max) {
            struct cap *snap = cap_copy(k);

            if (snap != NULL) {
                k->ending = true;
                todo[nt++] = snap;
            }
        }
    }
    /* agents away for longer than the grace: forget them */
    for (struct agent **pp = &c->agents; *pp != NULL;) {
        struct agent *a = *pp;

        if (a->call == NULL && !a->local && now - a->gone_ms >= c->o.agent_grace_ms) {
            *pp = a->next;
            if (a->report != NULL) {
                protobuf_c_message_free_unpacked(&a->report->base, NULL);
            }
            free(a);
            continue;
        }
        pp = &a->next;
    }
    /* ended captures beyond the ones kept for status */
    for (struct cap **pp = &c->caps; *pp != NULL;) {
        struct cap *k = *pp;

        if (k->ended && ++kept > (size_t) c->o.keep_ended) {
            *pp = k->next;
            cap_free(k);
            continue;
        }
        pp = &k->next;
    }
    return nt;
}

/* One capture's ranks waiting to be stored (check_stored). */
struct waiting {
    uint64_t run_id;
    size_t n;
    Kprof__V1__StreamMark *marks; /* n */
    Kprof__V1__StreamMark **ptrs; /* n, into marks */
    uint64_t *missing;            /* n */
};

/* Copies the marks of the ranks of up to max captures waiting to be stored (mu held). */
static size_t waiting_collect(struct kp_coord *c, struct waiting *w, size_t max)
{
    size_t nw = 0;

    for (struct cap *k = c->caps; k != NULL && nw < max; k = k->next) {
        size_t n = 0;

        if (k->run_id == 0 || k->ended || k->ending) {
            continue;
        }
        for (size_t i = 0; i < k->n; i++) {
            n += k->ranks[i].awaiting && k->ranks[i].state == ST_FLUSHING;
        }
        if (n == 0) {
            continue;
        }
        w[nw].marks = calloc(n, sizeof(*w[nw].marks));
        w[nw].ptrs = calloc(n, sizeof(*w[nw].ptrs));
        w[nw].missing = calloc(n, sizeof(*w[nw].missing));
        if (w[nw].marks == NULL || w[nw].ptrs == NULL || w[nw].missing == NULL) {
            free(w[nw].marks);
            free(w[nw].ptrs);
            free(w[nw].missing);
            break; /* the next tick asks again */
        }
        w[nw].run_id = k->run_id;
        w[nw].n = 0;
        for (size_t i = 0; i < k->n; i++) {
            const struct crank *r = &k->ranks[i];
            Kprof__V1__StreamMark *m = &w[nw].marks[w[nw].n];

            if (!r->awaiting || r->state != ST_FLUSHING) {
                continue;
            }
            kprof__v1__stream_mark__init(m);
            m->rank = r->rank;
            m->stream = r->mark_stream;
            m->first_seq = r->mark_first;
            m->last_seq = r->mark_last;
            m->count = r->mark_count;
            w[nw].ptrs[w[nw].n++] = m;
        }
        nw++;
    }
    return nw;
}

/*
 * Ranks an agent called DONE with a StreamMark become DONE once their batches are in
 * ingest_batches: behind --sink kafka an agent's Ack means durable in Kafka, and "DONE: every
 * row committed in PostgreSQL" waits for the sink consumers. Asked at most every
 * KP_COORD_STORED_CHECK_MS, one query per capture.
 */
static void check_stored(struct kp_coord *c, PGconn *pg)
{
    struct waiting w[16];
    size_t nw;
    long long now = kp_mono_ms();

    pthread_mutex_lock(&c->mu);
    if (now - c->stored_check_ms < KP_COORD_STORED_CHECK_MS) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->stored_check_ms = now;
    nw = waiting_collect(c, w, sizeof(w) / sizeof(w[0]));
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < nw; i++) {
        char err[512] = "";
        int rc = kp_store_marks_missing(pg, w[i].run_id, w[i].ptrs, w[i].n, w[i].missing, err,
                                        sizeof(err));
        struct cap *k;

        if (rc != 0) {
            kp_log_warn("cannot check the stored batches of run=%" PRIu64 " err=\"%s\" (retrying)",
                        w[i].run_id, err);
        }
        pthread_mutex_lock(&c->mu);
        k = kp__coord_cap_by_run(c, w[i].run_id);
        for (size_t j = 0; rc == 0 && k != NULL && !k->ended && j < w[i].n; j++) {
            for (size_t l = 0; w[i].missing[j] == 0 && l < k->n; l++) {
                struct crank *r = &k->ranks[l];

                if (r->rank == w[i].marks[j].rank && r->awaiting && r->state == ST_FLUSHING &&
                    r->mark_stream == w[i].marks[j].stream &&
                    r->mark_last == w[i].marks[j].last_seq) {
                    r->stored = true;
                    r->state = ST_DONE;
                    kp_log_info("capture rank run=%" PRIu64 " rank=%d host=%s state=done "
                                "(its %" PRIu64 " batches are stored)",
                                k->run_id, r->rank, r->host, r->mark_count);
                }
            }
        }
        pthread_mutex_unlock(&c->mu);
        free(w[i].marks);
        free(w[i].ptrs);
        free(w[i].missing);
    }
}

void kp_coord_tick(struct kp_coord *c, PGconn *pg)
{
    struct cap *todo[16];
    size_t nt;

    if (pg != NULL) {
        check_stored(c, pg);
    }
    pthread_mutex_lock(&c->mu);
    nt = c->active ? tick_locked(c, todo, sizeof(todo) / sizeof(todo[0])) : 0;
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < nt; i++) {
        struct cap *s = todo[i], *k;
        Kprof__V1__Run run = KPROF__V1__RUN__INIT;
        char err[600] = "";
        size_t failed = 0, done = 0;
        int rc = KP_EPG;

        for (size_t j = 0; j < s->n; j++) {
            failed += s->ranks[j].state == ST_FAILED;
            done += s->ranks[j].state == ST_DONE;
        }
        if (pg != NULL && (rc = persist(pg, s, false, err, sizeof(err))) == 0) {
            rc = kp_store_end_run(pg, s->run_id, failed > 0, &run, err, sizeof(err));
        }
        if (rc == 0) {
            kp_summary_after_end(pg, s->run_id);
        }
        pthread_mutex_lock(&c->mu);
        if ((k = kp__coord_cap_by_run(c, s->run_id)) != NULL) {
            k->ending = false;
            if (rc == 0) {
                k->ended = true;
                k->ended_ms = kp_mono_ms();
                k->run_state = run.state;
                k->ended_ns = run.ended_ns;
                send_to_hosts(c, k, KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET, "");
            }
        }
        pthread_mutex_unlock(&c->mu);
        if (rc == 0) {
            kp_log_info("capture ended run=%" PRIu64 " job=%s ranks=%zu done=%zu failed=%zu "
                        "stopped=%d",
                        s->run_id, s->job, s->n, done, failed, (int) s->stopped);
        }
        else if (pg != NULL) {
            kp_log_warn("cannot end the capture in PostgreSQL run=%" PRIu64
                        " err=\"%s\" (retrying)",
                        s->run_id, err);
        }
        kp_store_run_fini(&run);
        cap_free(s);
    }
}

/* Drops every capture in memory but those being created or ended (their threads hold them),
 * and the agents whose call is over. mu held. */
static void forget_all(struct kp_coord *c)
{
    for (struct cap **pp = &c->caps; *pp != NULL;) {
        struct cap *k = *pp;

        if (k->run_id != 0 && !k->ending) {
            *pp = k->next;
            cap_free(k);
            continue;
        }
        pp = &k->next;
    }
    for (struct agent **pp = &c->agents; *pp != NULL;) {
        struct agent *a = *pp;

        if (a->call == NULL && !a->local) {
            *pp = a->next;
            if (a->report != NULL) {
                protobuf_c_message_free_unpacked(&a->report->base, NULL);
            }
            free(a);
            continue;
        }
        pp = &a->next;
    }
}

int kp_coord_recover(struct kp_coord *c, PGconn *pg, char *errbuf, size_t errlen)
{
    PGresult *res = NULL;
    struct cap **got = NULL;
    size_t n = 0;
    int rc;

    /* Open captures: their run is OPEN. A capture whose rows say it is over (every rank
     * final) is adopted too: the tick ends it at once. */
    if ((rc = kp_pg_query(pg,
                          "SELECT c.run_id, (extract(epoch FROM c.deadline_at) * 1000)::bigint - "
                          "(extract(epoch FROM now()) * 1000)::bigint FROM captures c JOIN runs r "
                          "ON r.id = c.run_id WHERE r.state = 1 ORDER BY c.run_id",
                          0, NULL, &res, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((got = calloc((size_t) PQntuples(res) + 1, sizeof(*got))) == NULL) {
        PQclear(res);
        return -ENOMEM;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        uint64_t run_id = (uint64_t) kp_pg_i64(res, i, 0, 0);
        long long left = kp_pg_i64(res, i, 1, 0);
        struct cap *k = NULL;

        if ((rc = load_capture(pg, run_id, &k, errbuf, errlen)) != 0) {
            if (rc == KP_ENOTFOUND) {
                continue; /* dropped meanwhile */
            }
            goto fail;
        }
        k->ended = false;
        k->adopted = true;
        k->adopted_ms = kp_mono_ms();
        k->deadline_ms = k->adopted_ms + left;
        k->run_state = KPROF__V1__RUN_STATE__RUN_STATE_OPEN;
        got[n++] = k;
    }
    PQclear(res);
    res = NULL;
    pthread_mutex_lock(&c->mu);
    forget_all(c);
    for (size_t i = 0; i < n; i++) {
        if (kp__coord_cap_by_run(c, got[i]->run_id) != NULL) {
            cap_free(got[i]); /* being ended by this replica's worker right now */
            continue;
        }
        got[i]->next = c->caps;
        c->caps = got[i];
        kp_log_info("capture adopted run=%" PRIu64 " job=%s ranks=%zu deadline_s=%lld",
                    got[i]->run_id, got[i]->job, got[i]->n,
                    (got[i]->deadline_ms - got[i]->adopted_ms) / 1000);
    }
    pthread_mutex_unlock(&c->mu);
    free(got);
    return (int) n;
fail:
    PQclear(res);
    for (size_t i = 0; i < n; i++) {
        cap_free(got[i]);
    }
    free(got);
    return rc;
}

void kp_coord_set_role(struct kp_coord *c, bool active, const char *coordinator_addr)
{
    pthread_mutex_lock(&c->mu);
    kp__coord_copy_text(c->coordinator_addr, sizeof(c->coordinator_addr), coordinator_addr);
    if (c->active && !active) {
        for (struct agent *a = c->agents; a != NULL; a = a->next) {
            if (a->call != NULL) {
                kp_rpc_call_finish(a->call, GRPC_STATUS_UNAVAILABLE,
                                   "this collectord stepped down as the capture coordinator; "
                                   "ask Control.Coordinator where the new one is");
            }
        }
        forget_all(c);
    }
    c->active = active;
    pthread_mutex_unlock(&c->mu);
}

bool kp_coord_active(struct kp_coord *c)
{
    bool on;

    pthread_mutex_lock(&c->mu);
    on = c->active;
    pthread_mutex_unlock(&c->mu);
    return on;
}

bool kp_coord_refuse(struct kp_coord *c, struct kp_rpc_call *call)
{
    char msg[400];

    pthread_mutex_lock(&c->mu);
    if (c->active) {
        pthread_mutex_unlock(&c->mu);
        return false;
    }
    if (c->coordinator_addr[0] != '\0') {
        snprintf(msg, sizeof(msg), "this collectord is not the capture coordinator; it is at %s",
                 c->coordinator_addr);
    }
    else {
        snprintf(msg, sizeof(msg),
                 "this collectord is not the capture coordinator and no "
                 "coordinator is elected yet; retry");
    }
    pthread_mutex_unlock(&c->mu);
    kp_rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, msg);
    return true;
}

int kp_coord_create(const struct kp_coord_opts *o, struct kp_coord **out)
{
    struct kp_coord *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return -ENOMEM;
    }
    c->o = *o;
    if (c->o.agent_grace_ms <= 0) {
        c->o.agent_grace_ms = 15000;
    }
    if (c->o.default_steps <= 0) {
        c->o.default_steps = 5;
    }
    if (c->o.keep_ended <= 0) {
        c->o.keep_ended = 100;
    }
    if (c->o.start_margin_ms <= 0) {
        c->o.start_margin_ms = 1000;
    }
    if (c->o.min_deadline_ms <= 0) {
        c->o.min_deadline_ms = 120000;
    }
    c->active = true; /* until collectord's election says otherwise (leader.h) */
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return 0;
}

void kp_coord_get_stats(struct kp_coord *c, struct kp_coord_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}

void kp_coord_shutdown(struct kp_coord *c)
{
    pthread_mutex_lock(&c->mu);
    for (struct agent *a = c->agents; a != NULL; a = a->next) {
        if (a->call != NULL) {
            kp_rpc_call_finish(a->call, GRPC_STATUS_UNAVAILABLE, "collectord is shutting down");
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void kp_coord_destroy(struct kp_coord *c)
{
    if (c == NULL) {
        return;
    }
    while (c->agents != NULL) {
        struct agent *a = c->agents;

        c->agents = a->next;
        if (a->report != NULL) {
            protobuf_c_message_free_unpacked(&a->report->base, NULL);
        }
        if (a->call != NULL) {
            kp_rpc_call_unref(a->call);
        }
        free(a);
    }
    while (c->caps != NULL) {
        struct cap *k = c->caps;

        c->caps = k->next;
        cap_free(k);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}
