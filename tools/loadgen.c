/*
 * kprof-loadgen: synthetic PyTorch DDP traffic (kp_synth) pushed into kprof-collectord
 * through Ingest.Push (kp_push), one producer stream per rank, to load-test ingestion and to
 * fill a database with realistic runs (stragglers included) for the analyses.
 *
 * It creates a run (Control.CreateRun, world size = --ranks) unless --run-id names one, runs
 * the ranks on a bounded pool of threads, waits until every batch is acknowledged (that is,
 * committed), ends the run it created, and prints a summary; --json prints one JSON object
 * with the figures (its own CPU seconds among them) and, per rank and event kind, the rows and
 * dur_ns sums that were sent, so tests can compare the database with them.
 */
#define KP_LOG_MODULE "loadgen"
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_push.h"
#include "kp_rpc.h"
#include "kp_synth.h"

#define LOADGEN_MAX_RANKS   4096
#define LOADGEN_MAX_THREADS 256

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

struct loadgen_config {
    char *collector;
    char *tls_ca;
    char *tls_cert;
    char *tls_key;
    char *token_file;
    char *job;
    char *name;
    struct kp_synth_flags synth;
    long long threads;
    long long run_id;
    long long start_ns;
    long long window;
    long long give_up_ms;
    long long reconnect_max_ms;
    char *straggler;
    char *compute_straggler;
    char *dataload_straggler;
    char *send_log;
    bool json;
    bool end_run;
    int log_level;
};

#define OFF(f) offsetof(struct loadgen_config, f)
static const struct kp_config_def loadgen_defs[] = {
    { "collector", KP_CONFIG_STRING, "127.0.0.1:7070", 1, 0, OFF(collector),
      "kprof-collectord's gRPC address (host:port or unix:/path)", NULL, false },
    { "tls-ca", KP_CONFIG_STRING, "", 0, 0, OFF(tls_ca),
      "PEM of the CA that signed collectord's certificate: use TLS", NULL, false },
    { "tls-cert", KP_CONFIG_STRING, "", 0, 0, OFF(tls_cert),
      "mutual TLS: PEM of this client's certificate (SAN URI urn:kprof:ROLE:NAME), with --tls-key",
      NULL, false },
    { "tls-key", KP_CONFIG_STRING, "", 0, 0, OFF(tls_key),
      "mutual TLS: PEM of the private key of --tls-cert", NULL, true },
    { "token-file", KP_CONFIG_STRING, "", 0, 0, OFF(token_file),
      "bearer token sent with every call: the first line of this file (mode 0600 or 0640); role "
      "agent or operator (--run-id: operator)",
      NULL, false },
    { "ranks", KP_CONFIG_INT, "4", 1, LOADGEN_MAX_RANKS, OFF(synth.ranks),
      "ranks (world size) to simulate, one producer stream each", NULL, false },
    { "threads", KP_CONFIG_INT, "0", 0, LOADGEN_MAX_THREADS, OFF(threads),
      "worker threads; each runs whole ranks in turn (0: one per rank, at most 64)", NULL, false },
    { "steps", KP_CONFIG_INT, "100", 0, 1000000, OFF(synth.steps), "training steps per rank", NULL,
      false },
    { "first-step", KP_CONFIG_INT, "0", 0, 1000000000, OFF(synth.first_step),
      "number of the first step", NULL, false },
    { "kernels-per-step", KP_CONFIG_INT, "200", KP_SYNTH_MIN_KERNELS_PER_STEP,
      KP_SYNTH_MAX_KERNELS_PER_STEP, OFF(synth.kernels_per_step),
      "compute kernels per step and rank (NCCL kernels come on top)", NULL, false },
    { "batch-rows", KP_CONFIG_INT, "4000", KP_SYNTH_MIN_BATCH_ROWS, KP_SYNTH_MAX_BATCH_ROWS,
      OFF(synth.batch_rows), "target rows (events of all kinds) per batch", NULL, false },
    { "job", KP_CONFIG_STRING, "loadgen", 1, 256, OFF(job), "job name of the run", NULL, false },
    { "name", KP_CONFIG_STRING, "", 0, 256, OFF(name), "run name (CreateRun)", NULL, false },
    { "run-id", KP_CONFIG_INT, "0", 0, 2147483647, OFF(run_id),
      "push into this existing run; 0: create one with world size --ranks", NULL, false },
    { "seed", KP_CONFIG_INT, "1", 0, 0x7fffffffffffffffLL, OFF(synth.seed),
      "seed of the synthetic traffic (same seed, same events)", NULL, false },
    { "start-ns", KP_CONFIG_INT, "0", 0, 0x7fffffffffffffffLL, OFF(start_ns),
      "CLOCK_REALTIME ns of the first step; 0: now", NULL, false },
    { "straggler", KP_CONFIG_STRING, "", 0, 0, OFF(straggler),
      "compute slowdowns, RANK:FACTOR[,RANK:FACTOR...], e.g. 3:1.4 (1.0 = nominal)", NULL, false },
    { "compute-straggler", KP_CONFIG_STRING, "", 0, 0, OFF(compute_straggler),
      "the same as --straggler (compute slowdowns), added to its list", NULL, false },
    { "dataload-straggler", KP_CONFIG_STRING, "", 0, 0, OFF(dataload_straggler),
      "data-loading slowdowns, RANK:FACTOR[,...]", NULL, false },
    { "window", KP_CONFIG_INT, "32", 1, KP_PUSH_MAX_WINDOW, OFF(window),
      "unacknowledged batches per rank", NULL, false },
    { "reconnect-max", KP_CONFIG_DURATION, "1s", 10, 600000, OFF(reconnect_max_ms),
      "cap of the backoff between attempts to reopen a broken Push call", NULL, false },
    { "give-up", KP_CONFIG_DURATION, "30s", 100, 86400000, OFF(give_up_ms),
      "fail when collectord makes no progress for this long", NULL, false },
    { "send-log", KP_CONFIG_STRING, "", 0, 0, OFF(send_log),
      "write a line \"RUN RANK STREAM SEQ NS\" per batch to this file, NS the CLOCK_REALTIME "
      "when the push took it (for latency measurements: bench/kafka)",
      NULL, false },
    { "json", KP_CONFIG_BOOL, "false", 0, 0, OFF(json),
      "print the summary as one JSON object on stdout", NULL, false },
    { "end-run", KP_CONFIG_BOOL, "true", 0, 0, OFF(end_run),
      "end the run (EndRun) when done, if loadgen created it", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "warn", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
};
#undef OFF
#define N_DEFS (sizeof(loadgen_defs) / sizeof(loadgen_defs[0]))

struct rank_result {
    struct kp_synth_totals totals;
    struct kp_push_stats push;
    Kprof__V1__StreamMark mark;  /* what its push sent, for EndRun (count 0: nothing) */
    int rc;                      /* 0, or the failure */
    struct kp_rpc_status status; /* when rc is KP_ERPC */
    char err[640];
};

struct loadgen {
    const struct loadgen_config *cfg;
    struct kp_rpc_channel *ch;
    uint64_t run_id;
    int64_t start_ns;
    double *slow, *dlslow;
    struct rank_result *res;
    atomic_uint next_rank;
    atomic_llong first_send_ns; /* CLOCK_MONOTONIC; LLONG_MAX until the first send */
    atomic_llong last_ack_ns;
    atomic_bool abort;
    FILE *send_log; /* --send-log, or NULL; one fprintf a line (stdio locks the FILE) */
};

static void atomic_min(atomic_llong *a, long long v)
{
    long long cur = atomic_load(a);

    while (v < cur && !atomic_compare_exchange_weak(a, &cur, v)) {
    }
}

static void atomic_max(atomic_llong *a, long long v)
{
    long long cur = atomic_load(a);

    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v)) {
    }
}

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Parses "R:F[,R:F...]" into f[0..n). Returns 0 or KP_ECONFIG with errbuf. */
static int parse_factors(const char *flag, const char *s, double *f, long long n, char *errbuf,
                         size_t errlen)
{
    const char *p = s;

    while (p != NULL && *p != '\0') {
        char *end;
        long long r;
        double v;

        errno = 0;
        r = strtoll(p, &end, 10);
        if (end == p || *end != ':' || errno != 0) {
            snprintf(errbuf, errlen, "--%s=%s: expected RANK:FACTOR[,RANK:FACTOR...]", flag, s);
            return KP_ECONFIG;
        }
        if (r < 0 || r >= n) {
            snprintf(errbuf, errlen, "--%s=%s: rank %lld is outside 0..%lld (--ranks)", flag, s, r,
                     n - 1);
            return KP_ECONFIG;
        }
        p = end + 1;
        v = strtod(p, &end);
        if (end == p || (*end != ',' && *end != '\0') || !(v >= 0.1 && v <= 100.0)) {
            snprintf(errbuf, errlen, "--%s=%s: the factor of rank %lld must be in [0.1, 100]", flag,
                     s, r);
            return KP_ECONFIG;
        }
        f[r] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static void run_rank(struct loadgen *lg, uint32_t rank)
{
    const struct loadgen_config *cfg = lg->cfg;
    struct rank_result *res = &lg->res[rank];
    struct kp_synth_opts so;
    struct kp_push_opts po;
    struct kp_synth *syn = NULL;
    struct kp_push *push = NULL;
    Kprof__V1__Batch *b;
    uint64_t stream;
    bool first = true;
    int rc;

    kp_synth_opts_from_flags(&so, &cfg->synth, rank, lg->run_id, cfg->job);
    so.compute_slowdown = lg->slow;
    so.dataload_slowdown = lg->dlslow;
    so.start_ns = lg->start_ns;
    memset(&po, 0, sizeof(po));
    po.window = (uint32_t) cfg->window;
    po.give_up_after_ms = cfg->give_up_ms;
    po.reconnect_max_ms = cfg->reconnect_max_ms;
    po.reconnect_base_ms = cfg->reconnect_max_ms < 50 ? cfg->reconnect_max_ms : 50;
    /* a fresh producer stream per rank and invocation: nothing to dedup against */
    stream = mix64(lg->run_id ^ mix64(((uint64_t) getpid() << 32) ^ (uint64_t) kp_mono_ns()) ^
                   ((uint64_t) rank << 48)) &
             0x7fffffffffffffffULL;
    stream = stream == 0 ? 1 : stream;

    if ((rc = kp_synth_create(&so, &syn)) != 0) {
        snprintf(res->err, sizeof(res->err), "cannot create the generator: %s", kp_strerror(rc));
        goto out;
    }
    if ((rc = kp_push_create(lg->ch, stream, &po, &push)) != 0) {
        snprintf(res->err, sizeof(res->err), "cannot create the producer: %s", kp_strerror(rc));
        goto out;
    }
    while (!atomic_load(&lg->abort) && (rc = kp_synth_next(syn, &b)) == 1) {
        if (first) {
            atomic_min(&lg->first_send_ns, kp_mono_ns());
            first = false;
        }
        if ((rc = kp_push_send(push, b)) != 0) {
            break;
        }
        if (lg->send_log != NULL) {
            fprintf(lg->send_log, "%" PRIu64 " %u %" PRIu64 " %" PRIu64 " %" PRId64 "\n",
                    lg->run_id, rank, b->stream, b->seq, kp_real_ns());
        }
    }
    if (rc == 0 && !atomic_load(&lg->abort)) {
        rc = kp_push_flush(push, -1);
    }
    if (rc == 0) {
        atomic_max(&lg->last_ack_ns, kp_mono_ns());
    }
    else if (rc == KP_ERPC) {
        kp_push_error(push, &res->status);
        snprintf(res->err, sizeof(res->err), "%s: %s", kp_rpc_status_name(res->status.code),
                 res->status.details);
    }
    else if (res->err[0] == '\0') {
        snprintf(res->err, sizeof(res->err), "%s", kp_strerror(rc));
    }
out:
    res->rc = rc;
    if (rc != 0) {
        atomic_store(&lg->abort, true); /* no point going on: the run is incomplete */
    }
    if (syn != NULL) {
        res->totals = *kp_synth_totals(syn);
    }
    if (push != NULL) {
        kp_push_get_stats(push, &res->push);
        kprof__v1__stream_mark__init(&res->mark);
        kp_push_mark(push, &res->mark);
    }
    kp_push_destroy(push);
    kp_synth_destroy(syn);
}

static void *worker(void *arg)
{
    struct loadgen *lg = arg;
    unsigned r;

    while ((r = atomic_fetch_add(&lg->next_rank, 1)) < (unsigned) lg->cfg->synth.ranks) {
        run_rank(lg, r);
    }
    return NULL;
}

static const char *unreachable_hint(const struct loadgen_config *cfg, const char *details,
                                    char *buf, size_t len)
{
    snprintf(buf, len,
             "cannot reach collectord at %s: %s; start it with deploy/local/kprof-stack up or "
             "pass --collector",
             cfg->collector, details);
    return buf;
}

/* Creates the run, or checks that collectord answers. Returns 0 or 1 (message printed). */
static int control(struct loadgen *lg)
{
    const struct loadgen_config *cfg = lg->cfg;
    ProtobufCMessage *resp = NULL;
    struct kp_rpc_status st;
    char msg[1024];
    int rc;

    memset(&st, 0, sizeof(st));
    if (cfg->run_id == 0) {
        Kprof__V1__CreateRunRequest req = KPROF__V1__CREATE_RUN_REQUEST__INIT;

        req.job = cfg->job;
        req.name = cfg->name;
        req.world_size = (uint32_t) cfg->synth.ranks;
        req.source = KPROF__V1__RUN_SOURCE__RUN_SOURCE_SYNTHETIC;
        rc = kp_rpc_unary(lg->ch, "/kprof.v1.Control/CreateRun", &req.base,
                          &kprof__v1__run__descriptor, &resp, 15000, &st);
        if (rc == 0) {
            lg->run_id = ((Kprof__V1__Run *) resp)->id;
            protobuf_c_message_free_unpacked(resp, NULL);
            if (lg->run_id == 0 || lg->run_id > INT32_MAX) {
                fprintf(stderr, "kprof-loadgen: CreateRun returned run id %" PRIu64 "\n",
                        lg->run_id);
                return 1;
            }
            return 0;
        }
    }
    else {
        Kprof__V1__ListRunsRequest req = KPROF__V1__LIST_RUNS_REQUEST__INIT;

        lg->run_id = (uint64_t) cfg->run_id;
        req.limit = 1;
        rc = kp_rpc_unary(lg->ch, "/kprof.v1.Control/ListRuns", &req.base,
                          &kprof__v1__list_runs_response__descriptor, &resp, 15000, &st);
        if (rc == 0) {
            protobuf_c_message_free_unpacked(resp, NULL);
            return 0;
        }
    }
    if (st.code == GRPC_STATUS_UNAVAILABLE || st.code == GRPC_STATUS_DEADLINE_EXCEEDED) {
        fprintf(stderr, "kprof-loadgen: %s\n", unreachable_hint(cfg, st.details, msg, sizeof(msg)));
    }
    else {
        fprintf(stderr, "kprof-loadgen: collectord at %s refused %s: %s: %s\n", cfg->collector,
                cfg->run_id == 0 ? "CreateRun" : "ListRuns", kp_rpc_status_name(st.code),
                st.details);
    }
    return 1;
}

/* EndRun with every rank's mark, asked again while collectord answers UNAVAILABLE (its
 * restart, or batches acknowledged by Kafka and not stored yet) for up to --give-up. Returns 0
 * or 1 (said). */
static int end_run(struct loadgen *lg, bool failed)
{
    Kprof__V1__EndRunRequest req = KPROF__V1__END_RUN_REQUEST__INIT;
    Kprof__V1__StreamMark **marks;
    ProtobufCMessage *resp = NULL;
    struct kp_rpc_status st;
    long long until = kp_mono_ms() + lg->cfg->give_up_ms, pause_ms = 50;
    int rc;

    if ((marks = calloc((size_t) lg->cfg->synth.ranks + 1, sizeof(*marks))) == NULL) {
        fprintf(stderr, "kprof-loadgen: out of memory\n");
        return 1;
    }
    for (long long r = 0; r < lg->cfg->synth.ranks && !failed; r++) {
        if (lg->res[r].mark.count > 0) {
            marks[req.n_marks++] = &lg->res[r].mark;
        }
    }
    req.marks = marks;
    req.run_id = lg->run_id;
    req.failed = failed;
    while ((rc = kp_rpc_unary(lg->ch, "/kprof.v1.Control/EndRun", &req.base,
                              &kprof__v1__run__descriptor, &resp, 15000, &st)) != 0 &&
           st.code == GRPC_STATUS_UNAVAILABLE && kp_mono_ms() < until) {
        struct timespec ts = { 0, pause_ms * 1000000L };

        kp_log_debug("EndRun again run=%" PRIu64 " details=\"%s\"", lg->run_id, st.details);
        nanosleep(&ts, NULL);
        pause_ms = pause_ms < 1000 ? 2 * pause_ms : 1000;
    }
    free(marks);
    if (rc != 0) {
        fprintf(stderr, "kprof-loadgen: cannot end run %" PRIu64 ": %s: %s\n", lg->run_id,
                kp_rpc_status_name(st.code), st.details);
        return 1;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static void print_json(const struct loadgen *lg, uint64_t events, uint64_t batches, uint64_t bytes,
                       double secs, const struct kp_push_stats *sum)
{
    const struct loadgen_config *cfg = lg->cfg;
    struct rusage ru;
    double cpu = 0.0;

    /* this process's CPU time (generating, encoding, TLS), for the cost of a transport */
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        cpu = (double) ru.ru_utime.tv_sec + (double) ru.ru_utime.tv_usec / 1e6 +
              (double) ru.ru_stime.tv_sec + (double) ru.ru_stime.tv_usec / 1e6;
    }
    printf("{\"run_id\":%" PRIu64 ",\"ranks\":%lld,\"steps\":%lld,\"kernels_per_step\":%lld,"
           "\"seed\":%lld,\"events\":%" PRIu64 ",\"batches\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"seconds\":%.6f,\"events_per_s\":%.1f,\"duplicates\":%" PRIu64
           ",\"reconnects\":%" PRIu64 ",\"resent\":%" PRIu64 ",\"cpu_seconds\":%.3f"
           ",\"expected\":[",
           lg->run_id, cfg->synth.ranks, cfg->synth.steps, cfg->synth.kernels_per_step,
           cfg->synth.seed, events, batches, bytes, secs, secs > 0 ? (double) events / secs : 0.0,
           sum->duplicates, sum->reconnects, sum->resent, cpu);
    for (long long r = 0; r < cfg->synth.ranks; r++) {
        const struct kp_synth_totals *t = &lg->res[r].totals;

        printf("%s{\"rank\":%lld,\"batches\":%" PRIu64 ",\"events\":%" PRIu64 ",\"kinds\":{",
               r ? "," : "", r, t->batches, t->all_rows);
        for (int k = 0; k < KP_EV_COUNT; k++) {
            printf("%s\"%s\":{\"rows\":%" PRIu64 ",\"dur_ns\":%" PRIu64 "}", k ? "," : "",
                   kp_event_kinds[k].label, t->rows[k], t->dur_ns[k]);
        }
        printf("}}");
    }
    printf("]}\n");
}

/* --straggler, --compute-straggler, --dataload-straggler into lg->slow and lg->dlslow (1.0
 * for a rank none names): 0, or 2 once said on stderr. */
static int parse_stragglers(struct loadgen *lg)
{
    const struct loadgen_config *cfg = lg->cfg;
    char err[1024];

    for (long long r = 0; r < cfg->synth.ranks; r++) {
        lg->slow[r] = 1.0;
        lg->dlslow[r] = 1.0;
    }
    if (parse_factors("straggler", cfg->straggler, lg->slow, cfg->synth.ranks, err, sizeof(err)) !=
            0 ||
        parse_factors("compute-straggler", cfg->compute_straggler, lg->slow, cfg->synth.ranks, err,
                      sizeof(err)) != 0 ||
        parse_factors("dataload-straggler", cfg->dataload_straggler, lg->dlslow, cfg->synth.ranks,
                      err, sizeof(err)) != 0) {
        fprintf(stderr, "kprof-loadgen: %s (see --help)\n", err);
        return 2;
    }
    return 0;
}

/* Every rank's traffic, pushed by nthreads workers (th: room for them): 0 once they are
 * done, or -1 when none could start (said on stderr). */
static int push_ranks(struct loadgen *lg, pthread_t *th, long long nthreads)
{
    const struct loadgen_config *cfg = lg->cfg;
    long long started = 0;

    atomic_init(&lg->next_rank, 0);
    atomic_init(&lg->first_send_ns, 0x7fffffffffffffffLL);
    atomic_init(&lg->last_ack_ns, 0);
    atomic_init(&lg->abort, false);
    kp_log_info("pushing run=%" PRIu64 " ranks=%lld steps=%lld kernels_per_step=%lld threads=%lld",
                lg->run_id, cfg->synth.ranks, cfg->synth.steps, cfg->synth.kernels_per_step,
                nthreads);
    for (long long i = 0; i < nthreads; i++) {
        if (pthread_create(&th[i], NULL, worker, lg) != 0) {
            break;
        }
        started++;
    }
    if (started == 0) {
        fprintf(stderr, "kprof-loadgen: cannot start worker threads\n");
        return -1;
    }
    for (long long i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
    }
    return 0;
}

/* The ranks' results added up into *sum (batches, bytes, duplicates, reconnects, resent) and
 * *events; returns whether a rank failed (the first failure said on stderr). */
static bool sum_results(const struct loadgen *lg, struct kp_push_stats *sum, uint64_t *events)
{
    const struct loadgen_config *cfg = lg->cfg;
    bool failed = false;
    char err[1024];

    memset(sum, 0, sizeof(*sum));
    *events = 0;
    for (long long r = 0; r < cfg->synth.ranks; r++) {
        const struct rank_result *res = &lg->res[r];

        *events += res->totals.all_rows;
        sum->batches += res->push.batches;
        sum->bytes += res->push.bytes;
        sum->duplicates += res->push.duplicates;
        sum->reconnects += res->push.reconnects;
        sum->resent += res->push.resent;
        if (res->rc != 0 && !failed) {
            failed = true;
            if (res->rc == KP_ERPC && (res->status.code == GRPC_STATUS_UNAVAILABLE ||
                                       res->status.code == GRPC_STATUS_DEADLINE_EXCEEDED)) {
                fprintf(stderr, "kprof-loadgen: rank %lld: %s\n", r,
                        unreachable_hint(cfg, res->err, err, sizeof(err)));
            }
            else {
                fprintf(stderr,
                        "kprof-loadgen: rank %lld: collectord did not take the batches: %s\n", r,
                        res->err);
            }
        }
    }
    return failed;
}

/* The result on stdout: --json's line, or one line for people. */
static void report(const struct loadgen *lg, uint64_t events, const struct kp_push_stats *sum)
{
    const struct loadgen_config *cfg = lg->cfg;
    double secs = lg->last_ack_ns > lg->first_send_ns
                      ? (double) (lg->last_ack_ns - lg->first_send_ns) / 1e9
                      : 0.0;

    if (cfg->json) {
        print_json(lg, events, sum->batches, sum->bytes, secs, sum);
    }
    else {
        printf("run %" PRIu64 ": %lld ranks x %lld steps, %" PRIu64 " events in %" PRIu64
               " batches (%.1f MB) committed in %.3f s: %.0f events/s; duplicates %" PRIu64
               ", reconnects %" PRIu64 ", resent %" PRIu64 "\n",
               lg->run_id, cfg->synth.ranks, cfg->synth.steps, events, sum->batches,
               (double) sum->bytes / 1e6, secs, secs > 0 ? (double) events / secs : 0.0,
               sum->duplicates, sum->reconnects, sum->resent);
    }
}

int main(int argc, char **argv)
{
    struct loadgen_config cfg;
    struct kp_rpc_channel_opts co;
    struct kp_push_stats sum;
    struct loadgen lg;
    pthread_t *th = NULL;
    uint64_t events;
    long long nthreads;
    char err[1024];
    int exit_rc, rc = 1;
    bool failed, created;

    memset(&cfg, 0, sizeof(cfg));
    memset(&lg, 0, sizeof(lg));
    if ((exit_rc = kp_config_main(loadgen_defs, N_DEFS, &cfg, "kprof-loadgen", argc, argv)) >= 0) {
        return exit_rc;
    }
    kp_log_set_level((enum kp_log_level) cfg.log_level);
    signal(SIGPIPE, SIG_IGN);
    lg.cfg = &cfg;
    lg.slow = calloc((size_t) cfg.synth.ranks, sizeof(double));
    lg.dlslow = calloc((size_t) cfg.synth.ranks, sizeof(double));
    lg.res = calloc((size_t) cfg.synth.ranks, sizeof(struct rank_result));
    nthreads = cfg.threads ? cfg.threads : (cfg.synth.ranks < 64 ? cfg.synth.ranks : 64);
    nthreads = nthreads > cfg.synth.ranks ? cfg.synth.ranks : nthreads;
    th = calloc((size_t) nthreads, sizeof(pthread_t));
    if (lg.slow == NULL || lg.dlslow == NULL || lg.res == NULL || th == NULL) {
        fprintf(stderr, "kprof-loadgen: out of memory\n");
        goto out;
    }
    if ((rc = parse_stragglers(&lg)) != 0) {
        goto out;
    }
    rc = 1;
    memset(&co, 0, sizeof(co));
    if ((cfg.tls_cert[0] != '\0') != (cfg.tls_key[0] != '\0')) {
        fprintf(stderr, "kprof-loadgen: --tls-cert and --tls-key go together (see --help)\n");
        rc = 2;
        goto out;
    }
    co.tls_ca_file = cfg.tls_ca;
    co.tls_cert_file = cfg.tls_cert;
    co.tls_key_file = cfg.tls_key;
    co.token_file = cfg.token_file;
    if (kp_rpc_channel_create(cfg.collector, &co, &lg.ch, err, sizeof(err)) != 0) {
        fprintf(stderr, "kprof-loadgen: cannot set up the channel to %s: %s\n", cfg.collector, err);
        rc = 2;
        goto out;
    }
    if (control(&lg) != 0) {
        goto out;
    }
    if (cfg.send_log[0] != '\0' && (lg.send_log = fopen(cfg.send_log, "w")) == NULL) {
        fprintf(stderr, "kprof-loadgen: cannot create --send-log %s: %s\n", cfg.send_log,
                strerror(errno));
        goto out;
    }
    created = cfg.run_id == 0;
    if (cfg.start_ns != 0) {
        lg.start_ns = cfg.start_ns;
    }
    else {
        lg.start_ns = kp_real_ns();
    }
    if (push_ranks(&lg, th, nthreads) != 0) {
        goto out;
    }
    failed = sum_results(&lg, &sum, &events);
    if (created && cfg.end_run && end_run(&lg, failed) != 0) {
        goto out;
    }
    if (failed) {
        goto out;
    }
    report(&lg, events, &sum);
    rc = 0;
out:
    if (lg.send_log != NULL && fclose(lg.send_log) != 0 && rc == 0) {
        fprintf(stderr, "kprof-loadgen: cannot write --send-log %s: %s\n", cfg.send_log,
                strerror(errno));
        rc = 1;
    }
    free(th);
    free(lg.slow);
    free(lg.dlslow);
    free(lg.res);
    kp_rpc_channel_destroy(lg.ch);
    kp_config_fini(loadgen_defs, N_DEFS, &cfg);
    return rc;
}
