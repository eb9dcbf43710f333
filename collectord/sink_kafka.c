/*
 * The Kafka sink (sink_kafka.h). One thread of the sink's own takes the queued items, checks
 * their runs, produces them, serves librdkafka's delivery reports (rd_kafka_poll) and hands
 * the settled items back in submission order: items wait in a FIFO, and only its settled
 * prefix goes back, so a record acknowledged early never overtakes one still in flight.
 */
#define KP_LOG_MODULE "sink-kafka"
#include "sink_kafka.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "kafka_conf.h"
#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"

#define KAFKA_RUN_CACHE_SLOTS     4096 /* direct-mapped, power of 2 */
#define KAFKA_DEFAULT_MSG_TIMEOUT "300000"
#define KAFKA_APPLICATION_NAME    "kprof-collectord-kafka"
#define KAFKA_METADATA_RETRY_NS   1000000000LL
#define KAFKA_PG_RETRY_NS         1000000000LL

/* An item on its way through Kafka: the FIFO link and whether it is settled. */
struct kafka_entry {
    struct kp_sink_item *item;
    bool settled;
    struct kafka_entry *next;
};

struct run_slot {
    int64_t run_id; /* 0: empty */
    int32_t world_size;
};

struct kp_sink_kafka {
    /* Set by create, then read-only. */
    rd_kafka_t *rk;
    char *topic;
    char *conninfo;
    size_t queue_max_bytes;
    kp_sink_done_cb *done;
    void *done_ud;

    /* Guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: queue changes, stop */
    struct kp_sink_item *head, *tail;
    size_t queued_bytes; /* submitted and not handed back */
    bool stopping;
    long long drain_deadline_ns;
    struct kp_sink_kafka_stats stats;

    /* The sink's thread only. */
    pthread_t thread;
    bool thread_started;
    struct kafka_entry *fifo, *fifo_tail;
    size_t inflight;
    PGconn *conn;
    long long pg_retry_ns; /* no connection attempt before this */
    long long metadata_next_ns;
    struct run_slot runs[KAFKA_RUN_CACHE_SLOTS];
    atomic_bool ready;
};

static void settle(struct kafka_entry *e, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void settle(struct kafka_entry *e, int status, const char *fmt, ...)
{
    e->item->status = status;
    if (fmt != NULL) {
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(e->item->err, sizeof(e->item->err), fmt, ap);
        va_end(ap);
    }
    e->settled = true;
}

/* librdkafka's delivery report, on the sink's thread (inside rd_kafka_poll). */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *ud)
{
    struct kp_sink_kafka *s = ud;
    struct kafka_entry *e = m->_private;

    (void) rk;
    s->inflight--;
    pthread_mutex_lock(&s->mu);
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        s->stats.records_produced++;
        s->stats.bytes_produced += m->len;
    }
    else {
        s->stats.delivery_failures++;
    }
    pthread_mutex_unlock(&s->mu);
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        settle(e, 0, NULL);
        return;
    }
    kp_log_warn("Kafka did not take a batch run=%" PRIu64 " rank=%u seq=%" PRIu64 " err=\"%s\"",
                e->item->batch->run_id, e->item->batch->rank, e->item->batch->seq,
                rd_kafka_err2str(m->err));
    settle(e, -EAGAIN, "Kafka did not acknowledge the batch (%s); resend it",
           rd_kafka_err2str(m->err));
}

static struct run_slot *run_slot(struct kp_sink_kafka *s, uint64_t run)
{
    return &s->runs[run & (KAFKA_RUN_CACHE_SLOTS - 1)];
}

/* The run's world size from the cache or PostgreSQL: > 0; 0 no such run; < 0 PostgreSQL
 * could not be asked (why in errbuf). Runs' world sizes never change, so a hit stays true;
 * a run dropped later is the consumer's to refuse. */
static int world_size(struct kp_sink_kafka *s, uint64_t run, char *errbuf, size_t errlen)
{
    struct run_slot *slot = run_slot(s, run);
    char id[24];
    const char *params[1] = { id };
    PGresult *res = NULL;
    int rc, ws;

    if (slot->run_id == (int64_t) run) {
        return slot->world_size;
    }
    if (run == 0 || run > INT32_MAX) {
        return 0;
    }
    if (s->conn == NULL) {
        if (kp_mono_ns() < s->pg_retry_ns) {
            snprintf(errbuf, errlen, "PostgreSQL is unreachable");
            return KP_EPG;
        }
        if ((rc = kp_pg_connect(s->conninfo, KAFKA_APPLICATION_NAME, &s->conn, errbuf, errlen)) !=
            0) {
            s->conn = NULL;
            s->pg_retry_ns = kp_mono_ns() + KAFKA_PG_RETRY_NS;
            return rc;
        }
    }
    snprintf(id, sizeof(id), "%" PRIu64, run);
    if ((rc = kp_pg_query(s->conn, "SELECT world_size FROM runs WHERE id = $1::int", 1, params,
                          &res, errbuf, errlen)) != 0) {
        if (kp_pg_conn_lost(s->conn)) {
            PQfinish(s->conn);
            s->conn = NULL;
        }
        return rc;
    }
    ws = PQntuples(res) == 1 ? (int) kp_pg_i64(res, 0, 0, 0) : 0;
    PQclear(res);
    if (ws > 0) {
        slot->run_id = (int64_t) run;
        slot->world_size = ws;
    }
    return ws;
}

/* Checks e's run and produces it, or settles it rejected. */
static void produce_one(struct kp_sink_kafka *s, struct kafka_entry *e)
{
    const Kprof__V1__Batch *b = e->item->batch;
    char key[48], err[256];
    int ws = world_size(s, b->run_id, err, sizeof(err));
    size_t len;
    void *buf;

    if (ws < 0) {
        settle(e, -EAGAIN, "cannot check run %" PRIu64 ": %s; resend the batch", b->run_id, err);
        return;
    }
    if (ws == 0) {
        pthread_mutex_lock(&s->mu);
        s->stats.batches_rejected++;
        pthread_mutex_unlock(&s->mu);
        settle(e, KP_ENOTFOUND,
               "run %" PRIu64
               " does not exist; create it with Control.CreateRun (kprofctl start / import)",
               b->run_id);
        return;
    }
    if (b->rank >= (uint32_t) ws) {
        pthread_mutex_lock(&s->mu);
        s->stats.batches_rejected++;
        pthread_mutex_unlock(&s->mu);
        settle(e, KP_EPROTO, "rank %u is outside run %" PRIu64 "'s world size %d", b->rank,
               b->run_id, ws);
        return;
    }
    len = kprof__v1__batch__get_packed_size(b);
    if ((buf = malloc(len > 0 ? len : 1)) == NULL) {
        settle(e, -EAGAIN, "collectord is out of memory; resend the batch");
        return;
    }
    kprof__v1__batch__pack(b, buf);
    snprintf(key, sizeof(key), "%" PRIu64 "/%u", b->run_id, b->rank);
    for (;;) {
        rd_kafka_resp_err_t rerr =
            rd_kafka_producev(s->rk, RD_KAFKA_V_TOPIC(s->topic), RD_KAFKA_V_KEY(key, strlen(key)),
                              RD_KAFKA_V_VALUE(buf, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_FREE),
                              RD_KAFKA_V_OPAQUE(e), RD_KAFKA_V_END);

        if (rerr == RD_KAFKA_RESP_ERR_NO_ERROR) {
            s->inflight++;
            return;
        }
        if (rerr != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            free(buf);
            settle(e, -EAGAIN, "Kafka refused the batch (%s); resend it", rd_kafka_err2str(rerr));
            return;
        }
        /* librdkafka's own queue is full: serve delivery reports until it has room. */
        rd_kafka_poll(s->rk, 100);
    }
}

/* Hands the settled prefix of the FIFO back through done, in submission order. */
static void hand_back(struct kp_sink_kafka *s)
{
    struct kp_sink_item *items[256];
    size_t n = 0, bytes = 0;

    while (s->fifo != NULL && s->fifo->settled) {
        struct kafka_entry *e = s->fifo;

        s->fifo = e->next;
        if (s->fifo == NULL) {
            s->fifo_tail = NULL;
        }
        bytes += e->item->wire_bytes;
        items[n++] = e->item;
        free(e);
        if (n == sizeof(items) / sizeof(items[0]) || s->fifo == NULL || !s->fifo->settled) {
            pthread_mutex_lock(&s->mu);
            s->queued_bytes -= bytes;
            pthread_mutex_unlock(&s->mu);
            s->done(items, n, s->done_ud);
            n = 0;
            bytes = 0;
        }
    }
}

/* Asks for the topic's metadata now and then until it comes back: the sink is then ready. */
static void check_ready(struct kp_sink_kafka *s)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt;

    if (atomic_load(&s->ready) || kp_mono_ns() < s->metadata_next_ns) {
        return;
    }
    s->metadata_next_ns = kp_mono_ns() + KAFKA_METADATA_RETRY_NS;
    if ((rkt = rd_kafka_topic_new(s->rk, s->topic, NULL)) == NULL) {
        return;
    }
    if (rd_kafka_metadata(s->rk, 0, rkt, &md, 200) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
            md->topics[0].partition_cnt > 0) {
            atomic_store(&s->ready, true);
        }
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_topic_destroy(rkt);
}

static void *sink_thread(void *arg)
{
    struct kp_sink_kafka *s = arg;
    bool purged = false;

    for (;;) {
        struct kp_sink_item *taken;
        bool stopping;
        long long deadline;

        pthread_mutex_lock(&s->mu);
        if (s->head == NULL && s->fifo == NULL && !s->stopping) {
            struct timespec ts;
            long long until = kp_mono_ns() + 100000000LL;

            ts.tv_sec = until / 1000000000LL;
            ts.tv_nsec = until % 1000000000LL;
            pthread_cond_timedwait(&s->cond, &s->mu, &ts);
        }
        taken = s->head;
        s->head = s->tail = NULL;
        stopping = s->stopping;
        deadline = s->drain_deadline_ns;
        pthread_mutex_unlock(&s->mu);

        while (taken != NULL) {
            struct kafka_entry *e = calloc(1, sizeof(*e));
            struct kp_sink_item *next = taken->next;

            taken->next = NULL;
            if (e == NULL) {
                /* Out of memory: wait a little and take it again. */
                pthread_mutex_lock(&s->mu);
                taken->next = s->head;
                s->head = taken;
                if (s->tail == NULL) {
                    s->tail = taken;
                }
                pthread_mutex_unlock(&s->mu);
                break;
            }
            e->item = taken;
            if (s->fifo_tail != NULL) {
                s->fifo_tail->next = e;
            }
            else {
                s->fifo = e;
            }
            s->fifo_tail = e;
            if (stopping && purged) {
                settle(e, KP_ESHUTDOWN, "collectord is stopping; resend the batch");
            }
            else {
                produce_one(s, e);
            }
            taken = next;
        }
        rd_kafka_poll(s->rk, s->inflight > 0 ? 20 : 0);
        hand_back(s);
        check_ready(s);
        if (stopping) {
            if (s->fifo == NULL && s->inflight == 0) {
                pthread_mutex_lock(&s->mu);
                bool empty = s->head == NULL;
                pthread_mutex_unlock(&s->mu);
                if (empty) {
                    break;
                }
            }
            if (!purged && kp_mono_ns() >= deadline) {
                /* Past the drain deadline: what is still in librdkafka comes back failed. */
                rd_kafka_purge(s->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
                purged = true;
            }
        }
    }
    return NULL;
}

int kp_sink_kafka_create(const struct kp_sink_kafka_config *cfg, kp_sink_done_cb *done, void *ud,
                         struct kp_sink_kafka **out, char *errbuf, size_t errlen)
{
    struct kp_sink_kafka *s = calloc(1, sizeof(*s));
    rd_kafka_conf_t *conf = NULL;
    pthread_condattr_t ca;
    char why[512];
    int rc;

    if (s == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    s->topic = strdup(cfg->topic);
    s->conninfo = strdup(cfg->conninfo != NULL ? cfg->conninfo : "");
    s->queue_max_bytes = cfg->queue_max_bytes;
    s->done = done;
    s->done_ud = ud;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&s->ready, false);
    if (s->topic == NULL || s->conninfo == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    /* PostgreSQL: the schema (Control needs it) and the runs' cache. */
    if ((rc = kp_pg_connect(s->conninfo, KAFKA_APPLICATION_NAME, &s->conn, errbuf, errlen)) != 0) {
        s->conn = NULL;
        goto fail;
    }
    if ((rc = kp_pg_migrate_if_owner(s->conn, errbuf, errlen)) < 0) {
        goto fail;
    }
    conf = rd_kafka_conf_new();
    /* Ours first, then the user's properties, which may override the timeout (not the
     * guarantees: idempotence and acks=all are set again after them). */
    if ((rc = kp_kafka_conf_set(conf, "bootstrap.servers", cfg->brokers, errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_set(conf, "message.timeout.ms", KAFKA_DEFAULT_MSG_TIMEOUT, errbuf,
                                errlen)) != 0 ||
        (rc = kp_kafka_conf_set(conf, "linger.ms", "5", errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_properties(conf, cfg->properties, errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_file(conf, cfg->properties_file, errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_set(conf, "enable.idempotence", "true", errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_set(conf, "acks", "all", errbuf, errlen)) != 0) {
        goto fail;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_conf_set_log_cb(conf, kp_kafka_log_cb);
    rd_kafka_conf_set_opaque(conf, s);
    if ((s->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof(why))) == NULL) {
        snprintf(errbuf, errlen, "cannot create the Kafka producer: %s", why);
        rc = KP_ECONFIG;
        goto fail;
    }
    conf = NULL; /* the producer owns it */
    if (pthread_create(&s->thread, NULL, sink_thread, s) != 0) {
        snprintf(errbuf, errlen, "cannot start the Kafka sink's thread");
        rc = -EAGAIN;
        goto fail;
    }
    s->thread_started = true;
    kp_log_info("producing into Kafka brokers=%s topic=%s", cfg->brokers, s->topic);
    *out = s;
    return 0;
fail:
    if (conf != NULL) {
        rd_kafka_conf_destroy(conf);
    }
    kp_sink_kafka_destroy(s, 0);
    return rc;
}

bool kp_sink_kafka_submit(struct kp_sink_kafka *s, struct kp_sink_item *item)
{
    bool room;

    item->next = NULL;
    item->status = 0;
    item->duplicate = false;
    item->err[0] = '\0';
    pthread_mutex_lock(&s->mu);
    if (s->tail != NULL) {
        s->tail->next = item;
    }
    else {
        s->head = item;
    }
    s->tail = item;
    s->queued_bytes += item->wire_bytes;
    room = s->queued_bytes < s->queue_max_bytes;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
    return room;
}

bool kp_sink_kafka_has_room(struct kp_sink_kafka *s)
{
    bool room;

    pthread_mutex_lock(&s->mu);
    room = s->queued_bytes < s->queue_max_bytes;
    pthread_mutex_unlock(&s->mu);
    return room;
}

bool kp_sink_kafka_ready(struct kp_sink_kafka *s)
{
    return s != NULL && atomic_load(&s->ready);
}

void kp_sink_kafka_destroy(struct kp_sink_kafka *s, long long drain_timeout_ms)
{
    if (s == NULL) {
        return;
    }
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        s->drain_deadline_ns = kp_mono_ns() + drain_timeout_ms * 1000000LL;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->rk != NULL) {
        rd_kafka_destroy(s->rk);
    }
    if (s->conn != NULL) {
        PQfinish(s->conn);
    }
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s->topic);
    free(s->conninfo);
    free(s);
}

void kp_sink_kafka_get_stats(struct kp_sink_kafka *s, struct kp_sink_kafka_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->queued_bytes = s->queued_bytes;
    pthread_mutex_unlock(&s->mu);
    out->inflight_records = (uint64_t) rd_kafka_outq_len(s->rk); /* librdkafka: thread-safe */
}

static bool ops_submit(void *s, struct kp_sink_item *item)
{
    return kp_sink_kafka_submit(s, item);
}

static bool ops_has_room(void *s)
{
    return kp_sink_kafka_has_room(s);
}

const struct kp_sink_ops kp_sink_kafka_ops = { .submit = ops_submit, .has_room = ops_has_room };
