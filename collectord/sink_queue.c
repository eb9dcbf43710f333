/*
 * The PostgreSQL sink's queue, its flush thread (connection, retries with backoff, draining on
 * stop) and the functions of sink_pg.h. One flush is stored by sink_pg.c (its design, threads
 * and stop included, is described at its top).
 */
#define KP_LOG_MODULE "sink_pg"
#include "sink_pg.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "sink_pg_int.h"

/* --- connection --- */

static void drop_conn(struct kp_sink *s)
{
    PGcancel *cancel;

    pthread_mutex_lock(&s->mu);
    cancel = s->cancel;
    s->cancel = NULL;
    pthread_mutex_unlock(&s->mu);
    if (cancel != NULL) {
        PQfreeCancel(cancel);
    }
    if (s->conn != NULL) {
        PQfinish(s->conn);
        s->conn = NULL;
    }
    atomic_store(&s->ready, false);
}

/* Takes conn (a fresh connection with the schema current) as the sink's connection. */
static void adopt_conn(struct kp_sink *s, PGconn *conn)
{
    PGcancel *cancel = PQgetCancel(conn);

    s->conn = conn;
    pthread_mutex_lock(&s->mu);
    s->cancel = cancel;
    pthread_mutex_unlock(&s->mu);
    /* Another server (a failover, a restore) may have other ids: start the caches over. */
    memset(s->runs, 0, sizeof(s->runs));
    kp__sink_names_clear(s);
    atomic_store(&s->ready, true);
}

static int connect_pg(struct kp_sink *s, char *errbuf, size_t errlen)
{
    PGconn *conn = NULL;
    int rc;

    if ((rc = kp_pg_connect(s->conninfo, KP_SINK_APPLICATION_NAME, &conn, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((rc = kp_pg_migrate_if_owner(conn, errbuf, errlen)) < 0) {
        PQfinish(conn);
        return rc;
    }
    adopt_conn(s, conn);
    return 0;
}

/* True once destroy asked to stop and the drain deadline has passed. */
static bool give_up(struct kp_sink *s)
{
    bool r;

    pthread_mutex_lock(&s->mu);
    r = s->stopping && kp_mono_ns() >= s->drain_deadline_ns;
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* Waits the next full-jitter backoff, or less if the drain deadline comes first. */
static void backoff(struct kp_sink *s)
{
    long long cap_ms = KP_SINK_RETRY_BASE_MS, wait_ms, end;
    unsigned n = s->failures < 30 ? s->failures : 30;

    for (unsigned i = 1; i < n && cap_ms < s->retry_max_ms; i++) {
        cap_ms *= 2;
    }
    if (cap_ms > s->retry_max_ms) {
        cap_ms = s->retry_max_ms;
    }
    wait_ms = (long long) (rand_r(&s->rng) % (unsigned) (cap_ms + 1));
    end = kp_mono_ns() + wait_ms * 1000000LL;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        long long now = kp_mono_ns(), until = end;
        struct timespec ts;

        if (now >= end || (s->stopping && now >= s->drain_deadline_ns)) {
            break;
        }
        if (s->stopping && s->drain_deadline_ns < until) {
            until = s->drain_deadline_ns;
        }
        ts = kp__sink_abs_ts(until);
        pthread_cond_timedwait(&s->cond, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Stores the taken items, retrying through failures; settles every one of them. */
static void flush(struct kp_sink *s)
{
    char err[384];
    bool isolating = false;
    int rc;

    memset(s->state, ST_PENDING, s->n_items);
    for (;;) {
        if (s->conn == NULL || PQstatus(s->conn) != CONNECTION_OK) {
            drop_conn(s);
            rc = connect_pg(s, err, sizeof(err));
            if (rc != 0) {
                snprintf(s->err, sizeof(s->err), "connect: %s", err);
            }
        }
        if (s->conn != NULL) {
            rc = kp__sink_flush_range(s, 0, s->n_items, &isolating);
            if (rc == 0) {
                break;
            }
            if (kp__sink_attempt_fault(s, rc) == KP_PG_FAULT_CONN) {
                drop_conn(s);
            }
        }
        s->failures++;
        pthread_mutex_lock(&s->mu);
        s->stats.flush_failures++;
        pthread_mutex_unlock(&s->mu);
        kp_complain(&s->complain, KP_LOG_WARN, KP_LOG_MODULE,
                    "flush failed items=%zu attempt=%u err=\"%s\"; retrying", s->n_items,
                    s->failures, s->err);
        if (give_up(s)) {
            kp__sink_reject_unsettled(s, KP_ESHUTDOWN,
                                      "collectord stopped before the batch was stored");
            kp_log_error("sink stopped with batches unstored items=%zu err=\"%s\"", s->n_items,
                         s->err);
            return;
        }
        backoff(s);
    }
    if (s->failures > 0) {
        kp_release(&s->complain, KP_LOG_MODULE, "flush recovered failed_attempts=%u", s->failures);
        s->failures = 0;
    }
}

/* Hands items[0..n_items) to done_cb, after taking them off the byte count. */
static void hand_back(struct kp_sink *s)
{
    size_t bytes = 0, rejected = 0;

    for (size_t i = 0; i < s->n_items; i++) {
        bytes += s->items[i]->wire_bytes;
        rejected += s->items[i]->status != 0;
    }
    pthread_mutex_lock(&s->mu);
    s->queued_bytes -= bytes;
    s->queued_items -= s->n_items;
    s->stats.batches_rejected += rejected;
    s->stats.flushes++;
    pthread_mutex_unlock(&s->mu);
    if (s->n_items > 0) {
        s->done(s->items, s->n_items, s->done_ud);
    }
    s->n_items = 0;
}

/* Moves a prefix of the queue (at most flush_max_rows rows, at least one item) into items[].
 * Called with mu held. */
static int take(struct kp_sink *s)
{
    size_t rows = 0;

    while (s->head != NULL) {
        struct kp_sink_item *it = s->head;
        size_t r = it->rows > 0 ? it->rows : 1;

        if (s->n_items > 0 && rows + r > s->flush_max_rows) {
            break;
        }
        if (GROW(s->items, s->cap_items, s->n_items + 1) != 0) {
            break;
        }
        s->head = it->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        it->next = NULL;
        s->items[s->n_items++] = it;
        rows += r;
        s->pending_rows -= it->rows;
    }
    s->pending_since_ns = kp_mono_ns();
    return s->n_items > 0 ? 0 : -ENOMEM;
}

/* Sizes the per-item arrays for items[]. */
static int ensure_item_arrays(struct kp_sink *s)
{
    if (GROW(s->state, s->cap_state, s->n_items) != 0 ||
        GROW(s->name_off, s->cap_name_off, s->n_items) != 0) {
        return -ENOMEM;
    }
    return 0;
}

static void *flush_main(void *arg)
{
    struct kp_sink *s = arg;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        long long now;

        if (s->head == NULL) {
            if (s->stopping) {
                break;
            }
            pthread_cond_wait(&s->cond, &s->mu);
            continue;
        }
        now = kp_mono_ns();
        if (!s->stopping && s->pending_rows < s->flush_max_rows &&
            now < s->pending_since_ns + s->flush_interval_ms * 1000000LL) {
            struct timespec ts =
                kp__sink_abs_ts(s->pending_since_ns + s->flush_interval_ms * 1000000LL);

            pthread_cond_timedwait(&s->cond, &s->mu, &ts);
            continue;
        }
        if (take(s) != 0) {
            struct timespec ts = kp__sink_abs_ts(now + 100000000LL);

            /* Out of memory for the flush arrays: try again shortly. */
            pthread_cond_timedwait(&s->cond, &s->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        if (ensure_item_arrays(s) != 0) {
            for (size_t i = 0; i < s->n_items; i++) {
                s->items[i]->status = -ENOMEM;
                snprintf(s->items[i]->err, sizeof(s->items[i]->err), "collectord is out of memory");
            }
        }
        else {
            flush(s);
        }
        hand_back(s);
        pthread_mutex_lock(&s->mu);
    }
    s->thread_exited = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* --- public --- */

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

/* Builds "LOCK TABLE ONLY a, ONLY b, ... IN ROW EXCLUSIVE MODE" over ingest_batches,
 * the event tables and their side tables, in name order (see the top of this file). */
static void build_lock_sql(struct kp_sink *s)
{
    const char *tables[2 * KP_EV_COUNT + 1];
    size_t n = 0, o;

    tables[n++] = "ingest_batches";
    for (int k = 0; k < KP_EV_COUNT; k++) {
        tables[n++] = kp_event_kinds[k].store;
        if (kp_event_kinds[k].side != NULL) {
            tables[n++] = kp_event_kinds[k].side->table;
        }
    }
    qsort(tables, n, sizeof(tables[0]), cmp_cstr);
    o = (size_t) snprintf(s->lock_sql, sizeof(s->lock_sql), "LOCK TABLE ");
    for (size_t i = 0; i < n && o < sizeof(s->lock_sql); i++) {
        o += (size_t) snprintf(s->lock_sql + o, sizeof(s->lock_sql) - o, "%sONLY %s",
                               i > 0 ? ", " : "", tables[i]);
    }
    if (o < sizeof(s->lock_sql)) {
        snprintf(s->lock_sql + o, sizeof(s->lock_sql) - o, " IN ROW EXCLUSIVE MODE");
    }
}

int kp_sink_create(const struct kp_sink_config *cfg, kp_sink_done_cb *done, void *ud,
                   struct kp_sink **out, char *errbuf, size_t errlen)
{
    struct kp_sink *s = NULL;
    pthread_condattr_t ca;
    int rc;

    if (done == NULL) {
        snprintf(errbuf, errlen, "sink: done callback is required");
        return -EINVAL;
    }
    if ((rc = kp_codec_selfcheck(errbuf, errlen)) != 0) {
        return rc;
    }
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    kp_strbuf_init(&s->copy, 0);
    for (size_t p = 0; p < sizeof(s->arr) / sizeof(s->arr[0]); p++) {
        kp_strbuf_init(&s->arr[p], 0);
    }
    if ((s->conninfo = strdup(cfg->conninfo != NULL ? cfg->conninfo : "")) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    s->queue_max_bytes =
        cfg->queue_max_bytes > 0 ? cfg->queue_max_bytes : KP_SINK_DEFAULT_QUEUE_MAX_BYTES;
    s->flush_max_rows =
        cfg->flush_max_rows > 0 ? cfg->flush_max_rows : KP_SINK_DEFAULT_FLUSH_MAX_ROWS;
    s->flush_interval_ms =
        cfg->flush_interval_ms >= 0 ? cfg->flush_interval_ms : KP_SINK_DEFAULT_FLUSH_INTERVAL_MS;
    s->retry_max_ms = cfg->retry_max_ms > 0 ? cfg->retry_max_ms : KP_SINK_DEFAULT_RETRY_MAX_MS;
    s->done = done;
    s->done_ud = ud;
    s->rng = (unsigned) kp_mono_ns() ^ (unsigned) getpid();
    atomic_init(&s->ready, false);
    build_lock_sql(s);
    for (int k = 0; k < KP_EV_COUNT; k++) {
        kp_codec_copy_columns((enum kp_event_kind) k, s->copy_cols[k], sizeof(s->copy_cols[k]));
        kp_codec_side_columns((enum kp_event_kind) k, s->side_cols[k], sizeof(s->side_cols[k]));
    }
    if ((rc = connect_pg(s, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = pthread_create(&s->thread, NULL, flush_main, s)) != 0) {
        snprintf(errbuf, errlen, "sink: cannot start the flush thread: %s", strerror(rc));
        rc = -rc;
        goto fail;
    }
    s->thread_started = true;
    kp_log_info("sink started flush_max_rows=%zu flush_interval_ms=%lld queue_max_bytes=%zu",
                s->flush_max_rows, s->flush_interval_ms, s->queue_max_bytes);
    *out = s;
    return 0;
fail:
    kp_sink_destroy(s, 0);
    return rc;
}

bool kp_sink_submit(struct kp_sink *s, struct kp_sink_item *item)
{
    bool room, wake;

    item->next = NULL;
    item->status = 0;
    item->duplicate = false;
    item->err[0] = '\0';
    if (item->rows == 0) {
        item->rows = kp_batch_total_rows(item->batch);
    }
    pthread_mutex_lock(&s->mu);
    if (s->tail == NULL) {
        s->head = item;
        s->pending_since_ns = kp_mono_ns();
    }
    else {
        s->tail->next = item;
    }
    s->tail = item;
    wake = s->head == item || (s->pending_rows < s->flush_max_rows &&
                               s->pending_rows + item->rows >= s->flush_max_rows);
    s->pending_rows += item->rows;
    s->queued_bytes += item->wire_bytes;
    s->queued_items++;
    room = s->queued_bytes < s->queue_max_bytes;
    if (wake) {
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->mu);
    return room;
}

bool kp_sink_has_room(struct kp_sink *s)
{
    bool room;

    pthread_mutex_lock(&s->mu);
    room = s->queued_bytes < s->queue_max_bytes;
    pthread_mutex_unlock(&s->mu);
    return room;
}

bool kp_sink_ready(struct kp_sink *s)
{
    return s != NULL && atomic_load(&s->ready);
}

void kp_sink_get_stats(struct kp_sink *s, struct kp_sink_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->queued_bytes = s->queued_bytes;
    out->queued_items = s->queued_items;
    pthread_mutex_unlock(&s->mu);
}

void kp_sink_item_free(struct kp_sink_item *item)
{
    if (item == NULL) {
        return;
    }
    if (item->batch != NULL) {
        protobuf_c_message_free_unpacked(&item->batch->base, NULL);
    }
    free(item);
}

void kp_sink_destroy(struct kp_sink *s, long long drain_timeout_ms)
{
    if (s == NULL) {
        return;
    }
    if (s->thread_started) {
        long long deadline =
            kp_mono_ns() + (drain_timeout_ms > 0 ? drain_timeout_ms : 0) * 1000000LL;
        long long cancel_at = deadline + KP_SINK_CANCEL_GRACE_MS * 1000000LL;

        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        s->drain_deadline_ns = deadline;
        pthread_cond_broadcast(&s->cond);
        /* The drain takes as long as PostgreSQL works; past the deadline, a statement that
         * hangs is cancelled every grace period, so that the flush fails and gives up. */
        while (!s->thread_exited) {
            struct timespec ts = kp__sink_abs_ts(cancel_at);

            if (kp_mono_ns() >= cancel_at) {
                char err[256];

                if (s->cancel != NULL) {
                    PQcancel(s->cancel, err, sizeof(err));
                }
                cancel_at += KP_SINK_CANCEL_GRACE_MS * 1000000LL;
                continue;
            }
            pthread_cond_timedwait(&s->cond, &s->mu, &ts);
        }
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* What was submitted after the thread's last look (or with no thread) is not stored. */
    s->n_items = 0;
    while (s->head != NULL) {
        struct kp_sink_item *it = s->head;

        s->head = it->next;
        it->next = NULL;
        it->status = KP_ESHUTDOWN;
        snprintf(it->err, sizeof(it->err), "collectord stopped before the batch was stored");
        if (GROW(s->items, s->cap_items, s->n_items + 1) != 0) {
            kp_sink_item_free(it); /* out of memory: the submitter never hears back */
            continue;
        }
        s->items[s->n_items++] = it;
    }
    s->tail = NULL;
    if (s->n_items > 0) {
        hand_back(s);
    }
    drop_conn(s);
    kp__sink_names_clear(s);
    kp_strbuf_fini(&s->copy);
    for (size_t p = 0; p < sizeof(s->arr) / sizeof(s->arr[0]); p++) {
        kp_strbuf_fini(&s->arr[p]);
    }
    free(s->items);
    free(s->state);
    free(s->name_off);
    free(s->name_ids);
    free(s->keys);
    free(s->devs);
    free(s->found);
    free(s->miss);
    free(s->miss_slots);
    free(s->sorted);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s->conninfo);
    free(s);
}

static bool ops_submit(void *s, struct kp_sink_item *item)
{
    return kp_sink_submit(s, item);
}

static bool ops_has_room(void *s)
{
    return kp_sink_has_room(s);
}

const struct kp_sink_ops kp_sink_pg_ops = { .submit = ops_submit, .has_room = ops_has_room };
