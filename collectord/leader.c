#define KP_LOG_MODULE "leader"
#include "leader.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"
#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_str.h"

#define KP_LEADER_APP       "kprof-collectord-coordinator"
#define KP_LEADER_MARGIN_MS 1000 /* the fence's slack */
#define KP_LEADER_CHECK_MIN 1000 /* the least time a heartbeat is given to answer */

struct kp_leader {
    char *conninfo;
    bool take_part;
    long long poll_ms;
    long long check_ms; /* a heartbeat's limit: a poll, at least KP_LEADER_CHECK_MIN */
    char advertise[256];
    char host[256];
    struct kp_coord *coord;
    PGconn *pg;     /* the thread's (the first attempt's before it starts) */
    uint64_t epoch; /* ours while active */
    struct kp_complain complain;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* the fields below */
    pthread_cond_t cv;
    bool stop;
    struct kp_leader_info info;
    struct kp_leader_stats stats;
};

/* Runs sql on c, waiting at most timeout_ms for the whole answer. Returns the last result
 * (PQclear) or NULL with the reason in err: the caller treats NULL as a lost connection. */
static PGresult *timed_query(PGconn *c, const char *sql, int n, const char *const *params,
                             long long timeout_ms, char *err, size_t len)
{
    long long end = kp_mono_ms() + timeout_ms;
    PGresult *res, *last = NULL;

    if (PQstatus(c) != CONNECTION_OK ||
        !PQsendQueryParams(c, sql, n, NULL, params, NULL, NULL, 0)) {
        snprintf(err, len, "%s", PQerrorMessage(c));
        return NULL;
    }
    for (;;) {
        while (!PQisBusy(c)) {
            if ((res = PQgetResult(c)) == NULL) {
                if (last == NULL) {
                    snprintf(err, len, "no result");
                }
                return last;
            }
            PQclear(last);
            last = res;
            if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK) {
                snprintf(err, len, "%s", PQresultErrorMessage(res));
                while ((res = PQgetResult(c)) != NULL) {
                    PQclear(res);
                }
                PQclear(last);
                return NULL;
            }
        }
        long long left = end - kp_mono_ms();
        struct pollfd pfd = { .fd = PQsocket(c), .events = POLLIN };

        if (left <= 0 || poll(&pfd, 1, (int) left) <= 0 || !PQconsumeInput(c)) {
            snprintf(err, len, "%s",
                     left <= 0 || PQstatus(c) == CONNECTION_OK ? "no answer in time"
                                                               : PQerrorMessage(c));
            PQclear(last);
            return NULL;
        }
    }
}

static void drop_conn(struct kp_leader *l)
{
    if (l->pg != NULL) {
        PQfinish(l->pg); /* ends the session: PostgreSQL releases the lock */
        l->pg = NULL;
    }
}

static void step_down(struct kp_leader *l, const char *why)
{
    kp_coord_set_role(l->coord, false, "");
    drop_conn(l);
    pthread_mutex_lock(&l->mu);
    if (l->stats.active) {
        l->stats.active = false;
        l->stats.step_downs++;
        l->info.is_self = false;
        l->info.elected = false;
        kp_log_warn("stepped down as capture coordinator epoch=%" PRIu64 " reason=\"%s\"", l->epoch,
                    why);
    }
    pthread_mutex_unlock(&l->mu);
}

/* Sleeps ms unless told to stop. Returns true when stopping. */
static bool nap(struct kp_leader *l, long long ms)
{
    struct timespec ts = kp_real_deadline(ms);
    bool stop;

    pthread_mutex_lock(&l->mu);
    while (!l->stop && pthread_cond_timedwait(&l->cv, &l->mu, &ts) != ETIMEDOUT) {
    }
    stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    return stop;
}

/* We hold the lock: wait out the fence, take the row, adopt, activate. */
static void take_over(struct kp_leader *l)
{
    char err[512], pid[16], fence[32];
    const char *p[4] = { l->advertise, l->host, pid, fence };
    /* the old holder's next heartbeat starts within a poll of its last and fails within
     * check_ms: by then it has stepped down */
    long long fence_ms = l->poll_ms + l->check_ms + KP_LEADER_MARGIN_MS, wait_ms;
    PGresult *res;
    int n;

    snprintf(pid, sizeof(pid), "%d", (int) getpid());
    snprintf(fence, sizeof(fence), "%lld", fence_ms);
    /* how long until the previous holder's last heartbeat is a fence old */
    res = timed_query(l->pg,
                      "SELECT greatest(0, $1::bigint - (extract(epoch FROM now() - seen) * "
                      "1000)::bigint) FROM kp_coordinator",
                      1, &p[3], l->poll_ms + KP_LEADER_MARGIN_MS, err, sizeof(err));
    if (res == NULL) {
        kp_log_warn("cannot read the coordinator row err=\"%s\"", err);
        drop_conn(l);
        return;
    }
    wait_ms = PQntuples(res) > 0 ? kp_pg_i64(res, 0, 0, 0) : 0;
    PQclear(res);
    if (wait_ms > 0) {
        kp_log_info("coordinator lock taken; waiting %lld ms for the previous coordinator to "
                    "step down",
                    wait_ms);
        if (nap(l, wait_ms)) {
            drop_conn(l);
            return;
        }
    }
    res =
        timed_query(l->pg,
                    "INSERT INTO kp_coordinator AS k (id, address, host, pid, since, epoch, seen) "
                    "VALUES (1, $1, $2, $3::integer, now(), 1, now()) ON CONFLICT (id) DO UPDATE "
                    "SET address = $1, host = $2, pid = $3::integer, since = now(), epoch = "
                    "k.epoch + 1, seen = now() RETURNING epoch, "
                    "(extract(epoch FROM since) * 1000000000)::bigint",
                    3, p, l->poll_ms + KP_LEADER_MARGIN_MS, err, sizeof(err));
    if (res == NULL || PQntuples(res) != 1) {
        kp_log_warn("cannot write the coordinator row err=\"%s\"", err);
        PQclear(res);
        drop_conn(l);
        return;
    }
    l->epoch = (uint64_t) kp_pg_i64(res, 0, 0, 0);
    pthread_mutex_lock(&l->mu);
    l->info.elected = true;
    l->info.is_self = true;
    kp_strlcpy(l->info.address, sizeof(l->info.address), l->advertise);
    kp_strlcpy(l->info.host, sizeof(l->info.host), l->host);
    l->info.pid = (uint32_t) getpid();
    l->info.since_ns = kp_pg_i64(res, 0, 1, 0);
    l->info.epoch = l->epoch;
    pthread_mutex_unlock(&l->mu);
    PQclear(res);
    if ((n = kp_coord_recover(l->coord, l->pg, err, sizeof(err))) < 0) {
        kp_log_warn("cannot adopt the open captures err=\"%s\"; giving the lock up", err);
        drop_conn(l);
        pthread_mutex_lock(&l->mu);
        l->info.elected = l->info.is_self = false;
        pthread_mutex_unlock(&l->mu);
        return;
    }
    kp_coord_set_role(l->coord, true, l->advertise);
    pthread_mutex_lock(&l->mu);
    l->stats.active = true;
    l->stats.takeovers++;
    pthread_mutex_unlock(&l->mu);
    kp_log_info("became capture coordinator epoch=%" PRIu64 " address=%s adopted_captures=%d",
                l->epoch, l->advertise, n);
}

/* The holder's heartbeat: over the lock's connection, within one poll, on our epoch. */
static void heartbeat(struct kp_leader *l)
{
    char err[512], ep[24];
    const char *p[1] = { ep };
    PGresult *res;

    snprintf(ep, sizeof(ep), "%" PRIu64, l->epoch);
    res = timed_query(l->pg, "UPDATE kp_coordinator SET seen = now() WHERE epoch = $1::bigint", 1,
                      p, l->poll_ms, err, sizeof(err));
    if (res == NULL) {
        step_down(l, err);
        return;
    }
    if (strcmp(PQcmdTuples(res), "1") != 0) {
        step_down(l, "a newer coordinator took over the coordinator row");
    }
    PQclear(res);
}

/* Who holds it, for a replica that does not. */
static void read_row(struct kp_leader *l)
{
    char err[512], key[24];
    const char *p[1] = { key };
    PGresult *res;
    struct kp_leader_info in = { 0 };

    snprintf(key, sizeof(key), "%lld", KP_LEADER_LOCK_KEY);
    res =
        timed_query(l->pg,
                    "SELECT address, host, pid, (extract(epoch FROM since) * 1000000000)::bigint, "
                    "epoch, EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND database = (SELECT oid FROM pg_database WHERE datname = "
                    "current_database()) AND classid = ($1::bigint >> 32)::integer::oid AND "
                    "objid = ($1::bigint & 4294967295)::oid AND objsubid = 1) FROM "
                    "kp_coordinator",
                    1, p, l->poll_ms + KP_LEADER_MARGIN_MS, err, sizeof(err));
    if (res == NULL) {
        kp_complain(&l->complain, KP_LOG_WARN, KP_LOG_MODULE,
                    "cannot read who the capture coordinator is err=\"%s\"", err);
        drop_conn(l);
        return;
    }
    if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 5), "t") == 0) {
        in.elected = true;
        kp_strlcpy(in.address, sizeof(in.address), PQgetvalue(res, 0, 0));
        kp_strlcpy(in.host, sizeof(in.host), PQgetvalue(res, 0, 1));
        in.pid = (uint32_t) kp_pg_i64(res, 0, 2, 0);
        in.since_ns = kp_pg_i64(res, 0, 3, 0);
        in.epoch = (uint64_t) kp_pg_i64(res, 0, 4, 0);
    }
    PQclear(res);
    pthread_mutex_lock(&l->mu);
    l->info = in;
    pthread_mutex_unlock(&l->mu);
    kp_coord_set_role(l->coord, false, in.elected ? in.address : "");
}

/* One poll. */
static void step(struct kp_leader *l)
{
    char err[512], key[24];
    const char *p[1] = { key };
    PGresult *res;
    bool active;

    pthread_mutex_lock(&l->mu);
    active = l->stats.active;
    pthread_mutex_unlock(&l->mu);
    if (l->pg == NULL || PQstatus(l->pg) != CONNECTION_OK) {
        if (active) {
            step_down(l, "the lock's PostgreSQL connection broke");
            active = false;
        }
        drop_conn(l);
        if (kp_pg_connect(l->conninfo, KP_LEADER_APP, &l->pg, err, sizeof(err)) != 0) {
            kp_complain(&l->complain, KP_LOG_WARN, KP_LOG_MODULE,
                        "PostgreSQL unreachable for the coordinator election err=\"%s\"", err);
            drop_conn(l);
            pthread_mutex_lock(&l->mu);
            l->info.elected = false;
            pthread_mutex_unlock(&l->mu);
            kp_coord_set_role(l->coord, false, "");
            return;
        }
        kp_release(&l->complain, KP_LOG_MODULE, "PostgreSQL reachable again for the election");
    }
    if (active) {
        heartbeat(l);
        return;
    }
    if (l->take_part) {
        snprintf(key, sizeof(key), "%lld", KP_LEADER_LOCK_KEY);
        res = timed_query(l->pg, "SELECT pg_try_advisory_lock($1::bigint)", 1, p,
                          l->poll_ms + KP_LEADER_MARGIN_MS, err, sizeof(err));
        if (res == NULL) {
            kp_complain(&l->complain, KP_LOG_WARN, KP_LOG_MODULE,
                        "cannot try the coordinator lock err=\"%s\"", err);
            drop_conn(l);
            return;
        }
        if (strcmp(PQgetvalue(res, 0, 0), "t") == 0) {
            PQclear(res);
            take_over(l);
            if (l->pg == NULL) {
                return;
            }
            pthread_mutex_lock(&l->mu);
            active = l->stats.active;
            pthread_mutex_unlock(&l->mu);
            if (active) {
                return;
            }
        }
        else {
            PQclear(res);
        }
    }
    read_row(l);
}

static void *run(void *arg)
{
    struct kp_leader *l = arg;

    while (!nap(l, l->poll_ms)) {
        step(l);
    }
    return NULL;
}

void kp_leader_default_advertise(const char *listen, int port, char *out, size_t len)
{
    char host[256] = "";
    const char *colon = strrchr(listen != NULL ? listen : "", ':');
    size_t hl = colon != NULL ? (size_t) (colon - listen) : 0;

    if (listen == NULL || strncmp(listen, "unix:", 5) == 0) {
        kp_strlcpy(out, len, listen != NULL ? listen : "");
        return;
    }
    if (hl >= sizeof(host)) {
        hl = sizeof(host) - 1;
    }
    memcpy(host, listen, hl);
    host[hl] = '\0';
    if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0 ||
        strcmp(host, "*") == 0 || strcmp(host, "[::0]") == 0) {
        if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
            kp_strlcpy(host, sizeof(host), "localhost");
        }
        host[sizeof(host) - 1] = '\0';
    }
    snprintf(out, len, "%s:%d", host, port);
}

int kp_leader_create(const struct kp_leader_opts *o, struct kp_leader **out, char *errbuf,
                     size_t errlen)
{
    struct kp_leader *l = calloc(1, sizeof(*l));

    if (l == NULL || (l->conninfo = strdup(o->conninfo != NULL ? o->conninfo : "")) == NULL) {
        free(l);
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    l->take_part = o->take_part;
    l->poll_ms = o->poll_ms > 0 ? o->poll_ms : 1000;
    l->check_ms = l->poll_ms > KP_LEADER_CHECK_MIN ? l->poll_ms : KP_LEADER_CHECK_MIN;
    l->coord = o->coord;
    kp_strlcpy(l->advertise, sizeof(l->advertise), o->advertise);
    if (gethostname(l->host, sizeof(l->host) - 1) != 0) {
        kp_strlcpy(l->host, sizeof(l->host), "unknown");
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    kp_coord_set_role(l->coord, false, "");
    step(l);
    if (pthread_create(&l->thread, NULL, run, l) != 0) {
        snprintf(errbuf, errlen, "cannot start the election thread");
        kp_leader_destroy(l);
        return -EAGAIN;
    }
    l->started = true;
    *out = l;
    return 0;
}

void kp_leader_info(struct kp_leader *l, struct kp_leader_info *out)
{
    pthread_mutex_lock(&l->mu);
    *out = l->info;
    pthread_mutex_unlock(&l->mu);
}

void kp_leader_get_stats(struct kp_leader *l, struct kp_leader_stats *out)
{
    pthread_mutex_lock(&l->mu);
    *out = l->stats;
    pthread_mutex_unlock(&l->mu);
}

void kp_leader_destroy(struct kp_leader *l)
{
    if (l == NULL) {
        return;
    }
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (l->started) {
        pthread_join(l->thread, NULL);
    }
    if (l->stats.active) {
        char err[256], ep[24];
        const char *p[1] = { ep };

        /* no longer coordinating: a standby may take over without waiting out the fence */
        kp_coord_set_role(l->coord, false, "");
        snprintf(ep, sizeof(ep), "%" PRIu64, l->epoch);
        PQclear(timed_query(l->pg,
                            "UPDATE kp_coordinator SET seen = 'epoch' WHERE epoch = "
                            "$1::bigint",
                            1, p, l->poll_ms, err, sizeof(err)));
        kp_log_info("gave up the capture coordinator role epoch=%" PRIu64, l->epoch);
    }
    drop_conn(l);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l->conninfo);
    free(l);
}
