#define KP_LOG_MODULE "sink"
#include "consumer.h"

#include <errno.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kafka_conf.h"
#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_daemon.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_log.h"
#include "kp_strbuf.h"
#include "metrics_text.h"
#include "sink_pg.h"

/* One record on its way through the sink, in its partition's order. */
struct pend {
    int64_t offset;
    bool settled;
};

/* What the consumer knows of one partition of the topic; never freed before the consumer, so
 * a late done callback can look it up (gen tells it whether the record is still ours). */
struct cpart {
    bool assigned;
    uint64_t gen;      /* bumped on assign and revoke */
    struct pend *pend; /* [head, n): records read and not yet committed, offset order */
    size_t head, n, cap;
    int64_t last_read; /* highest offset read in this assignment; -1 none */
    int64_t want;      /* offset to commit: the end of the settled prefix; -1 none */
    int64_t committed; /* the group's committed offset as last known; -1 none */
    int64_t low, high; /* watermarks as last queried */
};

/* A sink item's origin: which record it is. */
struct origin {
    int32_t partition;
    uint64_t gen;
    int64_t offset;
};

struct kp_sinkd {
    struct kp_collectord_config cfg; /* borrowed strings */
    struct kp_batch_limits limits;
    struct kp_sink *sink;
    rd_kafka_t *rk;
    struct kp_http *http;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    atomic_bool closing; /* the sink is gone: rebalance callbacks do not wait for it */
    bool paused;         /* poll thread only */
    pthread_mutex_t mu;  /* parts */
    struct cpart *parts; /* indexed by partition id */
    int32_t nparts;
    atomic_uint_fast64_t consumed, stored, duplicate, rejected, malformed, lost, pauses, rebalances;
};

static struct cpart *part_get(struct kp_sinkd *d, int32_t id)
{
    if (id < 0) {
        return NULL;
    }
    if (id >= d->nparts) {
        int32_t n = id + 1;
        struct cpart *np = realloc(d->parts, (size_t) n * sizeof(*np));

        if (np == NULL) {
            return NULL;
        }
        memset(np + d->nparts, 0, (size_t) (n - d->nparts) * sizeof(*np));
        for (int32_t i = d->nparts; i < n; i++) {
            np[i].last_read = np[i].want = np[i].committed = -1;
            np[i].low = np[i].high = -1;
        }
        d->parts = np;
        d->nparts = n;
    }
    return &d->parts[id];
}

/* Caller holds mu. Appends a record read; false when out of memory. */
static bool pend_push(struct cpart *p, int64_t offset, bool settled)
{
    if (p->head > 0 && p->n == p->cap) {
        memmove(p->pend, p->pend + p->head, (p->n - p->head) * sizeof(*p->pend));
        p->n -= p->head;
        p->head = 0;
    }
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        struct pend *np = realloc(p->pend, cap * sizeof(*np));

        if (np == NULL) {
            return false;
        }
        p->pend = np;
        p->cap = cap;
    }
    p->pend[p->n++] = (struct pend){ .offset = offset, .settled = settled };
    return true;
}

/* Caller holds mu. Moves want past the settled prefix. */
static void pend_advance(struct cpart *p)
{
    while (p->head < p->n && p->pend[p->head].settled) {
        p->want = p->pend[p->head].offset + 1;
        p->head++;
    }
    if (p->head == p->n) {
        p->head = p->n = 0;
    }
}

/* Caller holds mu. Marks offset settled (binary search: offsets increase). */
static void pend_settle(struct cpart *p, int64_t offset)
{
    size_t lo = p->head, hi = p->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (p->pend[mid].offset < offset) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    if (lo < p->n && p->pend[lo].offset == offset) {
        p->pend[lo].settled = true;
    }
    pend_advance(p);
}

static void part_reset(struct cpart *p, bool assigned)
{
    p->assigned = assigned;
    p->gen++;
    p->head = p->n = 0;
    p->last_read = p->want = -1;
    if (!assigned) {
        p->committed = -1;
    }
}

/* The sink's flush thread: the items of one flush, settled after its COMMIT. */
static void done_cb(struct kp_sink_item **items, size_t n, void *ud)
{
    struct kp_sinkd *d = ud;

    for (size_t i = 0; i < n; i++) {
        struct kp_sink_item *it = items[i];
        struct origin *o = it->origin;
        const Kprof__V1__Batch *b = it->batch;

        if (it->status == KP_ESHUTDOWN || it->status == -ENOMEM) {
            /* Never stored: left uncommitted (its partition's offset stops there), so the
             * group reads it again after a restart or a rebalance. */
            kp_log_error("batch not stored partition=%" PRId32 " offset=%" PRId64 ": %s",
                         o->partition, o->offset, it->err);
        }
        else {
            if (it->status == 0) {
                atomic_fetch_add(it->duplicate ? &d->duplicate : &d->stored, 1);
            }
            else {
                atomic_fetch_add(&d->rejected, 1);
                kp_log_warn("rejected batch partition=%" PRId32 " offset=%" PRId64 " run=%" PRIu64
                            " rank=%u stream=%" PRIu64 " seq=%" PRIu64 " err=\"%s\" (skipped)",
                            o->partition, o->offset, b->run_id, b->rank, b->stream, b->seq,
                            it->err);
            }
            pthread_mutex_lock(&d->mu);
            if (o->partition < d->nparts && d->parts[o->partition].gen == o->gen) {
                pend_settle(&d->parts[o->partition], o->offset);
            }
            pthread_mutex_unlock(&d->mu);
        }
        free(o);
        kp_sink_item_free(it);
    }
}

/* Commits each assigned partition's settled prefix (of the partitions in only, when not NULL).
 * async: do not wait for the broker. */
static void commit_settled(struct kp_sinkd *d, const rd_kafka_topic_partition_list_t *only,
                           bool async)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(8);
    rd_kafka_resp_err_t err;

    pthread_mutex_lock(&d->mu);
    for (int32_t i = 0; i < d->nparts; i++) {
        struct cpart *p = &d->parts[i];

        if (!p->assigned || p->want < 0 || p->want <= p->committed) {
            continue;
        }
        if (only != NULL &&
            rd_kafka_topic_partition_list_find(only, d->cfg.kafka_topic, i) == NULL) {
            continue;
        }
        rd_kafka_topic_partition_list_add(l, d->cfg.kafka_topic, i)->offset = p->want;
    }
    pthread_mutex_unlock(&d->mu);
    if (l->cnt > 0) {
        err = rd_kafka_commit(d->rk, l, async ? 1 : 0);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR && !async) {
            kp_log_warn("offset commit failed: %s (the records are read again: duplicates, "
                        "recognised)",
                        rd_kafka_err2str(err));
        }
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* librdkafka, after a commit: the offsets the group now holds (for the lag). */
static void commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    struct kp_sinkd *d = opaque;

    if (offsets == NULL) {
        return;
    }
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < offsets->cnt; i++) {
        rd_kafka_topic_partition_t *t = &offsets->elems[i];

        if (t->err == RD_KAFKA_RESP_ERR_NO_ERROR && t->offset >= 0 && t->partition < d->nparts &&
            t->offset > d->parts[t->partition].committed) {
            d->parts[t->partition].committed = t->offset;
        }
    }
    pthread_mutex_unlock(&d->mu);
}

/* True when every record read from the partitions in l is settled. */
static bool all_settled(struct kp_sinkd *d, const rd_kafka_topic_partition_list_t *l)
{
    bool done = true;

    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < l->cnt; i++) {
        int32_t id = l->elems[i].partition;

        if (id < d->nparts && d->parts[id].head < d->parts[id].n) {
            done = false;
        }
    }
    pthread_mutex_unlock(&d->mu);
    return done;
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    struct kp_sinkd *d = opaque;
    rd_kafka_topic_partition_list_t *q;

    atomic_fetch_add(&d->rebalances, 1);
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        pthread_mutex_lock(&d->mu);
        for (int i = 0; i < parts->cnt; i++) {
            struct cpart *p = part_get(d, parts->elems[i].partition);

            if (p != NULL) {
                part_reset(p, true);
            }
        }
        pthread_mutex_unlock(&d->mu);
        /* The group's offsets, for the lag; the assignment itself starts from them. */
        q = rd_kafka_topic_partition_list_copy(parts);
        if (rd_kafka_committed(rk, q, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            pthread_mutex_lock(&d->mu);
            for (int i = 0; i < q->cnt; i++) {
                if (q->elems[i].partition < d->nparts && q->elems[i].offset >= 0) {
                    d->parts[q->elems[i].partition].committed = q->elems[i].offset;
                }
            }
            pthread_mutex_unlock(&d->mu);
        }
        rd_kafka_topic_partition_list_destroy(q);
        kp_log_info("assigned %d partition%s of %s", parts->cnt, parts->cnt == 1 ? "" : "s",
                    d->cfg.kafka_topic);
        rd_kafka_assign(rk, parts);
        rd_kafka_resume_partitions(rk, parts); /* whatever was paused before a revoke */
        d->paused = false;
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        long long deadline = kp_mono_ms() + d->cfg.kafka_revoke_wait_ms;
        bool settled = true;

        /* Let the sink settle what it holds from these partitions, then commit it. */
        while (!atomic_load(&d->closing) && !(settled = all_settled(d, parts)) &&
               kp_mono_ms() < deadline) {
            struct timespec ts = { 0, 20 * 1000000L };

            commit_settled(d, parts, true);
            nanosleep(&ts, NULL);
        }
        commit_settled(d, parts, false);
        if (!settled) {
            kp_log_warn("partitions revoked before PostgreSQL stored all that was read from them: "
                        "the next owner reads those records again (duplicates, recognised)");
        }
        pthread_mutex_lock(&d->mu);
        for (int i = 0; i < parts->cnt; i++) {
            if (parts->elems[i].partition < d->nparts) {
                part_reset(&d->parts[parts->elems[i].partition], false);
            }
        }
        pthread_mutex_unlock(&d->mu);
        kp_log_info("revoked %d partition%s of %s", parts->cnt, parts->cnt == 1 ? "" : "s",
                    d->cfg.kafka_topic);
        rd_kafka_assign(rk, NULL);
        d->paused = false;
        return;
    }
    kp_log_warn("rebalance failed: %s", rd_kafka_err2str(err));
    rd_kafka_assign(rk, NULL);
}

static void pause_all(struct kp_sinkd *d, bool pause)
{
    rd_kafka_topic_partition_list_t *l = NULL;

    if (rd_kafka_assignment(d->rk, &l) != RD_KAFKA_RESP_ERR_NO_ERROR || l == NULL) {
        return;
    }
    if (pause) {
        rd_kafka_pause_partitions(d->rk, l);
        atomic_fetch_add(&d->pauses, 1);
    }
    else {
        rd_kafka_resume_partitions(d->rk, l);
    }
    d->paused = pause;
    rd_kafka_topic_partition_list_destroy(l);
}

/* One record: unpack, validate, submit (or settle at once when it can never be stored). */
/*
 * A record read past where the partition should have gone on (expect): the offsets between
 * are gone when the log now starts after expect, i.e. the topic's retention deleted records
 * this group had not stored (offset out of range, reset to the earliest). Their batches are
 * lost: said once per gap, and counted for the user (kafka_records_lost_total), since
 * producers had their Acks. A gap with the log still holding expect (a transaction's control
 * records, which kprof's producers never write) is not a loss.
 */
static void note_gap(struct kp_sinkd *d, int32_t partition, int64_t expect, int64_t got)
{
    int64_t lo = -1, hi = -1;

    if (rd_kafka_query_watermark_offsets(d->rk, d->cfg.kafka_topic, partition, &lo, &hi, 1000) !=
            RD_KAFKA_RESP_ERR_NO_ERROR ||
        lo <= expect) {
        return;
    }
    lo = lo < got ? lo : got;
    atomic_fetch_add(&d->lost, (uint64_t) (lo - expect));
    kp_log_error("%" PRId64 " records of partition %" PRId32 " (offsets %" PRId64 "..%" PRId64
                 ") were deleted by the topic's retention before this consumer group stored "
                 "them: their batches are lost (raise the topic's retention.ms and "
                 "retention.bytes, or add sink replicas; see docs/kafka.md)",
                 lo - expect, partition, expect, lo - 1);
}

static void on_record(struct kp_sinkd *d, rd_kafka_message_t *m)
{
    Kprof__V1__Batch *b = NULL;
    struct kp_sink_item *item = NULL;
    struct origin *o = NULL;
    struct cpart *p;
    char err[512] = "";
    uint64_t gen;
    int64_t expect;
    bool ok;

    pthread_mutex_lock(&d->mu);
    p = part_get(d, m->partition);
    if (p == NULL || !p->assigned || m->offset <= p->last_read) {
        /* not ours any more, or read again after a pause: already in flight */
        pthread_mutex_unlock(&d->mu);
        return;
    }
    /* where this record should have been: after the last one read, or at the group's offset */
    expect = p->last_read >= 0 ? p->last_read + 1 : p->committed;
    p->last_read = m->offset;
    gen = p->gen;
    pthread_mutex_unlock(&d->mu);
    if (expect >= 0 && m->offset > expect) {
        note_gap(d, m->partition, expect, m->offset);
    }
    atomic_fetch_add(&d->consumed, 1);
    if (m->len > (size_t) d->cfg.max_message_bytes) {
        snprintf(err, sizeof(err), "%zu bytes, over --max-message-bytes", m->len);
    }
    else if ((b = kprof__v1__batch__unpack(NULL, m->len, m->payload)) == NULL) {
        snprintf(err, sizeof(err), "not a kprof.v1.Batch");
    }
    else if (kp_batch_validate(b, &d->limits, err, sizeof(err)) != 0) {
        protobuf_c_message_free_unpacked(&b->base, NULL);
        b = NULL;
    }
    else if ((item = calloc(1, sizeof(*item))) == NULL || (o = calloc(1, sizeof(*o))) == NULL) {
        snprintf(err, sizeof(err), "out of memory");
        protobuf_c_message_free_unpacked(&b->base, NULL);
        free(item);
        item = NULL;
        b = NULL;
    }
    pthread_mutex_lock(&d->mu);
    ok = pend_push(p, m->offset, b == NULL);
    if (b == NULL) {
        pend_advance(p);
    }
    pthread_mutex_unlock(&d->mu);
    if (b == NULL) {
        atomic_fetch_add(&d->malformed, 1);
        kp_log_warn("skipped record partition=%" PRId32 " offset=%" PRId64 ": %s", m->partition,
                    m->offset, err);
        return;
    }
    if (!ok) {
        /* Untracked, it is never committed past: stored, and read again by a later owner. */
        kp_log_warn("out of memory tracking partition=%" PRId32 " offset=%" PRId64, m->partition,
                    m->offset);
    }
    *o = (struct origin){ .partition = m->partition, .gen = gen, .offset = m->offset };
    item->batch = b;
    item->wire_bytes = m->len;
    item->rows = kp_batch_total_rows(b);
    item->origin = o;
    if (!kp_sink_submit(d->sink, item) && !d->paused) {
        pause_all(d, true);
    }
}

/* The high watermarks, every second, for the lag. */
static void query_watermarks(struct kp_sinkd *d)
{
    int32_t n;

    pthread_mutex_lock(&d->mu);
    n = d->nparts;
    pthread_mutex_unlock(&d->mu);
    for (int32_t i = 0; i < n && !atomic_load(&d->stop); i++) {
        int64_t lo = -1, hi = -1;
        bool assigned;

        pthread_mutex_lock(&d->mu);
        assigned = d->parts[i].assigned;
        pthread_mutex_unlock(&d->mu);
        if (!assigned || (rd_kafka_query_watermark_offsets(d->rk, d->cfg.kafka_topic, i, &lo, &hi,
                                                           200) != RD_KAFKA_RESP_ERR_NO_ERROR &&
                          rd_kafka_get_watermark_offsets(d->rk, d->cfg.kafka_topic, i, &lo, &hi) !=
                              RD_KAFKA_RESP_ERR_NO_ERROR)) {
            continue;
        }
        pthread_mutex_lock(&d->mu);
        d->parts[i].low = lo;
        d->parts[i].high = hi;
        pthread_mutex_unlock(&d->mu);
    }
}

static void *poll_thread(void *arg)
{
    struct kp_sinkd *d = arg;
    long long last_commit = 0, last_marks = 0;

    while (!atomic_load(&d->stop)) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(d->rk, 50);
        long long now;

        if (m != NULL) {
            if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
                on_record(d, m);
            }
            else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                kp_log_warn("kafka: %s", rd_kafka_message_errstr(m));
            }
            rd_kafka_message_destroy(m);
        }
        if (d->paused && kp_sink_has_room(d->sink)) {
            pause_all(d, false);
        }
        now = kp_mono_ms();
        if (now - last_commit >= 200) {
            commit_settled(d, NULL, true);
            last_commit = now;
        }
        if (now - last_marks >= 1000) {
            query_watermarks(d);
            last_marks = kp_mono_ms();
        }
    }
    return NULL;
}

static bool healthz(void *ud)
{
    return true;
}

static bool readyz(void *ud, char *why, size_t len)
{
    struct kp_sinkd *d = ud;

    if (!kp_sink_ready(d->sink)) {
        snprintf(why, len, "PostgreSQL is not reachable or the schema is not applied\n");
        return false;
    }
    return true;
}

static int metrics(void *ud, struct kp_strbuf *out)
{
    struct kp_sinkd *d = ud;
    struct kp_sinkd_stats st;
    struct kp_sink_stats ss;
    int64_t total = 0;

    kp_sinkd_get_stats(d, &st);
    kp_sink_get_stats(d->sink, &ss);
#define COUNTER(name, help, v) KP_CD_COUNTER(out, name, help, v)
#define GAUGE(name, help, v)   KP_CD_GAUGE(out, name, help, v)
    COUNTER("kafka_records_consumed_total", "Records read from Kafka.", st.consumed);
    COUNTER("kafka_records_stored_total", "Records committed to PostgreSQL.", st.stored);
    COUNTER("kafka_records_duplicate_total", "Records PostgreSQL already held (redelivered).",
            st.duplicate);
    COUNTER("kafka_records_rejected_total",
            "Records for an unknown or ended run or a rank outside it (skipped).", st.rejected);
    COUNTER("kafka_records_lost_total",
            "Records the topic's retention deleted before the group stored them (lost).", st.lost);
    COUNTER("kafka_records_malformed_total",
            "Records that are not a valid kprof.v1.Batch (skipped).", st.malformed);
    COUNTER("kafka_pauses_total", "Times the partitions were paused because the queue was full.",
            st.pauses);
    COUNTER("kafka_rebalances_total", "Partition assignments and revocations.", st.rebalances);
    COUNTER("rows_committed_total", "Event rows committed to PostgreSQL.", ss.rows_committed);
    COUNTER("flushes_total", "Flush transactions committed.", ss.flushes);
    COUNTER("flush_failures_total", "Flush transactions rolled back and retried.",
            ss.flush_failures);
    GAUGE("queued_bytes", "Encoded bytes waiting for PostgreSQL.", ss.queued_bytes);
    GAUGE("queued_batches", "Batches waiting for PostgreSQL.", ss.queued_items);
    kp_strbuf_appendf(out, "# HELP kprof_collectord_kafka_consumer_lag Records of an assigned "
                           "partition past the group's committed offset (high watermark - "
                           "committed).\n# TYPE kprof_collectord_kafka_consumer_lag gauge\n");
    pthread_mutex_lock(&d->mu);
    for (int32_t i = 0; i < d->nparts; i++) {
        const struct cpart *p = &d->parts[i];
        int64_t base = p->committed >= 0 ? p->committed : p->low;
        int64_t lag = p->high >= 0 && base >= 0 && p->high > base ? p->high - base : 0;

        if (!p->assigned) {
            continue;
        }
        total += lag;
        kp_strbuf_appendf(out,
                          "kprof_collectord_kafka_consumer_lag{topic=\"%s\",partition=\"%" PRId32
                          "\"} %" PRId64 "\n",
                          d->cfg.kafka_topic, i, lag);
    }
    pthread_mutex_unlock(&d->mu);
    GAUGE("kafka_consumer_lag_sum", "Sum of kafka_consumer_lag over the assigned partitions.",
          total);
#undef COUNTER
#undef GAUGE
    return 0;
}

void kp_sinkd_get_stats(struct kp_sinkd *d, struct kp_sinkd_stats *out)
{
    out->consumed = atomic_load(&d->consumed);
    out->stored = atomic_load(&d->stored);
    out->duplicate = atomic_load(&d->duplicate);
    out->rejected = atomic_load(&d->rejected);
    out->malformed = atomic_load(&d->malformed);
    out->lost = atomic_load(&d->lost);
    out->pauses = atomic_load(&d->pauses);
    out->rebalances = atomic_load(&d->rebalances);
}

int kp_sinkd_create(const struct kp_collectord_config *cfg, struct kp_sinkd **out, char *errbuf,
                    size_t errlen)
{
    struct kp_sinkd *d = calloc(1, sizeof(*d));
    struct kp_sink_config scfg = {
        .conninfo = cfg->base.pg_conninfo,
        .queue_max_bytes = (size_t) cfg->queue_max_bytes,
        .flush_max_rows = (size_t) cfg->flush_max_rows,
        .flush_interval_ms = cfg->flush_interval_ms,
        .retry_max_ms = cfg->retry_max_ms,
    };
    struct kp_http_handlers hh = { .healthz = healthz, .readyz = readyz, .metrics = metrics };
    rd_kafka_conf_t *conf = NULL;
    rd_kafka_topic_partition_list_t *sub = NULL;
    rd_kafka_resp_err_t kerr;
    char why[512];
    int rc;

    if (d == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    d->cfg = *cfg;
    d->limits = (struct kp_batch_limits){
        .max_name_bytes = (size_t) cfg->max_name_bytes,
        .max_strings = KP_CODEC_DEFAULT_MAX_STRINGS,
        .max_rows = KP_CODEC_DEFAULT_MAX_ROWS,
    };
    pthread_mutex_init(&d->mu, NULL);
    if (cfg->sink == KP_COLLECTORD_SINK_KAFKA) {
        snprintf(errbuf, errlen,
                 "--role sink stores into PostgreSQL: --sink kafka is for --role ingest");
        rc = KP_ECONFIG;
        goto fail;
    }
    if (cfg->kafka_brokers == NULL || cfg->kafka_brokers[0] == '\0') {
        snprintf(errbuf, errlen, "--role sink needs --kafka-brokers HOST:PORT,...");
        rc = KP_ECONFIG;
        goto fail;
    }
    if ((rc = kp_codec_selfcheck(errbuf, errlen)) != 0) {
        goto fail;
    }
    conf = rd_kafka_conf_new();
    if ((rc = kp_kafka_conf_set(conf, "bootstrap.servers", cfg->kafka_brokers, errbuf, errlen)) !=
            0 ||
        (rc = kp_kafka_conf_set(conf, "group.id", cfg->kafka_group, errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_set(conf, "auto.offset.reset", "earliest", errbuf, errlen)) != 0 ||
        /* librdkafka prefetches up to this per partition on top of --queue-max-bytes (its
         * default, 64 MiB, times many partitions is gigabytes); --kafka-property may change it */
        (rc = kp_kafka_conf_set(conf, "queued.max.messages.kbytes", "8192", errbuf, errlen)) != 0 ||
        /* a fetch that found little waits at most this long (librdkafka's 500 ms left a
         * seconds-long tail of partitions with few records behind the others: bench/kafka) */
        (rc = kp_kafka_conf_set(conf, "fetch.wait.max.ms", "50", errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_properties(conf, cfg->kafka_properties, errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_file(conf, cfg->kafka_properties_file, errbuf, errlen)) != 0 ||
        /* after the user's: these make the delivery guarantee and may not be overridden */
        (rc = kp_kafka_conf_set(conf, "enable.auto.commit", "false", errbuf, errlen)) != 0 ||
        (rc = kp_kafka_conf_set(conf, "enable.auto.offset.store", "false", errbuf, errlen)) != 0) {
        goto fail;
    }
    rd_kafka_conf_set_opaque(conf, d);
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(conf, commit_cb);
    rd_kafka_conf_set_log_cb(conf, kp_kafka_log_cb);
    if ((rc = kp_sink_create(&scfg, done_cb, d, &d->sink, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((d->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, sizeof(why))) == NULL) {
        snprintf(errbuf, errlen, "kafka consumer: %s", why);
        rc = KP_ECONFIG;
        goto fail;
    }
    conf = NULL; /* rd_kafka_new took it */
    rd_kafka_poll_set_consumer(d->rk);
    sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, cfg->kafka_topic, RD_KAFKA_PARTITION_UA);
    kerr = rd_kafka_subscribe(d->rk, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(errbuf, errlen, "kafka subscribe to %s: %s", cfg->kafka_topic,
                 rd_kafka_err2str(kerr));
        rc = KP_ECONFIG;
        goto fail;
    }
    if (pthread_create(&d->thread, NULL, poll_thread, d) != 0) {
        snprintf(errbuf, errlen, "cannot start the poll thread");
        rc = -EAGAIN;
        goto fail;
    }
    d->thread_started = true;
    if ((rc = kp_daemon_http_start(cfg->base.http_listen, cfg->base.metrics_token, &hh, d, &d->http,
                                   errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc =
             kp_daemon_ready_write(cfg->base.ready_file, &(struct kp_ready_entry){ "role", "sink" },
                                   1, d->http, errbuf, errlen)) != 0) {
        goto fail;
    }
    kp_log_info("consuming topic=%s group=%s brokers=%s http_port=%d", cfg->kafka_topic,
                cfg->kafka_group, cfg->kafka_brokers, kp_sinkd_http_port(d));
    *out = d;
    return 0;
fail:
    if (conf != NULL) {
        rd_kafka_conf_destroy(conf);
    }
    kp_sinkd_destroy(d);
    return rc;
}

int kp_sinkd_http_port(const struct kp_sinkd *d)
{
    return d->http != NULL ? kp_http_port(d->http) : 0;
}

void kp_sinkd_destroy(struct kp_sinkd *d)
{
    if (d == NULL) {
        return;
    }
    kp_http_destroy(d->http);
    atomic_store(&d->stop, true);
    if (d->thread_started) {
        pthread_join(d->thread, NULL);
    }
    /* Flush what is queued; what PostgreSQL did not take stays uncommitted in Kafka. */
    kp_sink_destroy(d->sink, d->cfg.shutdown_grace_ms);
    d->sink = NULL;
    atomic_store(&d->closing, true);
    if (d->rk != NULL) {
        commit_settled(d, NULL, false);
        rd_kafka_consumer_close(d->rk);
        rd_kafka_destroy(d->rk);
    }
    for (int32_t i = 0; i < d->nparts; i++) {
        free(d->parts[i].pend);
    }
    free(d->parts);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
