/*
 * The PostgreSQL sink (see sink_pg.h for the protocol). DESIGN of this file:
 *
 * Threads. Submitters (ingest, on the gRPC thread) append to a FIFO under `mu`. One flush
 * thread takes a prefix of it (up to flush_max_rows rows), stores it, hands it to done_cb
 * and takes the next. Everything below "flush thread only" in struct kp_sink, the PG
 * connection included, belongs to that thread; `mu` guards the queue, the counters and the
 * stop flags, and is never held across PostgreSQL I/O or done_cb.
 *
 * One flush, for the items items[lo..hi) not settled yet (flush_once):
 *   1. runs: each batch's run must exist and its rank be under the run's world size. A small
 *      direct-mapped cache of (run, world size) answers; misses are looked up together.
 *      Failures settle the item at once (KP_ENOTFOUND / KP_EPROTO).
 *   2. names: every string of every batch maps to a names.id. A text -> id hash map answers;
 *      misses are de-duplicated, sorted (so that concurrent collectords lock names rows in the
 *      same order) and inserted in one INSERT ... ON CONFLICT ... RETURNING, autocommitted.
 *   3. BEGIN; lock the pending batches' runs FOR SHARE (check_open: a run that has ended
 *      refuses new sequences, see sink_pg.h; before the tables, in kp_store_drop_run's order);
 *      LOCK the event tables' parents in name order, the order that
 *      kp_create_run_partitions and kp_drop_run take them in (their CREATE/DROP TABLE ...
 *      PARTITION lock the parents ACCESS EXCLUSIVE, so any other order can deadlock); insert
 *      the batch keys into ingest_batches ON CONFLICT DO NOTHING RETURNING: the keys that come
 *      back are new, the others duplicates (keys repeated within the flush are de-duplicated
 *      here first); one COPY per kind of all new batches' rows, encoded in chunks (16 KiB
 *      first, growing to 256 KiB) while PostgreSQL parses the previous ones, and one into a
 *      kind's side table (kp_side_spec) when some row carries its figures; upsert `ranks`
 *      (one row per run and rank, increments summed here) and `devices`; COMMIT. Only then
 *      are the items settled.
 *
 * Failures. After a failed statement the transaction is rolled back and kp_pg_last_fault
 * decides: a lost connection is re-made (and the migrations re-checked) after a capped
 * full-jitter backoff, and the same items flushed again; the ingest_batches keys make the
 * retry exact even when a COMMIT's outcome was unknown (such batches come back as
 * duplicates). A transient server error (deadlock, disk full, ...) retries the same way on
 * the same connection. After a statement error the runs are checked afresh (a run dropped
 * under the cache fails the COPY; its batches then come back KP_ENOTFOUND). Otherwise some
 * batch's data is wrong (validated batches should never get here, so this is a defence): the
 * range is split in halves and each half flushed on its own, down to single batches, and a
 * batch that still fails alone is rejected with KP_EPROTO and PostgreSQL's message, while the
 * rest commit. Items that were settled in an attempt stay settled across retries.
 *
 * Stop. kp_sink_destroy lets the thread drain the queue; while PostgreSQL fails it retries
 * until drain_timeout_ms has passed, then settles what is left with KP_ESHUTDOWN. A statement
 * that hangs past the deadline is cancelled (PQcancel) from the destroying thread.
 */
#define KP_LOG_MODULE "sink_pg"
#include "sink_pg.h"
#include "sink_pg_int.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
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
#include "kp_strbuf.h"

static uint64_t hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;

    for (; *s != '\0'; s++) {
        h = (h ^ (unsigned char) *s) * 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

/* --- the name cache (text -> names.id) --- */

void kp__sink_names_clear(struct kp_sink *s)
{
    for (size_t i = 0; i < s->names_cap; i++) {
        free(s->names[i].name);
    }
    free(s->names);
    s->names = NULL;
    s->names_cap = s->names_n = s->names_bytes = 0;
}

static int32_t names_get(const struct kp_sink *s, const char *name, uint64_t h)
{
    size_t mask = s->names_cap - 1;

    if (s->names_cap == 0) {
        return 0;
    }
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const struct name_entry *e = &s->names[i];

        if (e->name == NULL) {
            return 0;
        }
        if (e->hash == h && strcmp(e->name, name) == 0) {
            return e->id;
        }
    }
}

static void names_place(struct name_entry *tab, size_t cap, struct name_entry e)
{
    for (size_t i = e.hash & (cap - 1);; i = (i + 1) & (cap - 1)) {
        if (tab[i].name == NULL) {
            tab[i] = e;
            return;
        }
    }
}

/* Adds name -> id. The cache is a cache: when full, or out of memory, it starts over. */
static void names_put(struct kp_sink *s, const char *name, uint64_t h, int32_t id)
{
    size_t len = strlen(name);
    struct name_entry e;

    if (s->names_n >= KP_SINK_NAME_CACHE_MAX_ENTRIES ||
        s->names_bytes + len > KP_SINK_NAME_CACHE_MAX_BYTES) {
        kp_log_info("name cache full entries=%zu bytes=%zu; starting over", s->names_n,
                    s->names_bytes);
        kp__sink_names_clear(s);
    }
    if ((s->names_n + 1) * 2 > s->names_cap) {
        size_t cap = s->names_cap == 0 ? 1024 : s->names_cap * 2;
        struct name_entry *tab = calloc(cap, sizeof(*tab));

        if (tab == NULL) {
            return;
        }
        for (size_t i = 0; i < s->names_cap; i++) {
            if (s->names[i].name != NULL) {
                names_place(tab, cap, s->names[i]);
            }
        }
        free(s->names);
        s->names = tab;
        s->names_cap = cap;
    }
    if ((e.name = malloc(len + 1)) == NULL) {
        return;
    }
    memcpy(e.name, name, len + 1);
    e.hash = h;
    e.id = id;
    names_place(s->names, s->names_cap, e);
    s->names_n++;
    s->names_bytes += len + 1;
}

/* Returns the index of name in miss[]: found, or added if add is true; -1 if absent and not
 * added; -ENOMEM. */
static long miss_find(struct kp_sink *s, const char *name, uint64_t h, bool add)
{
    size_t mask;

    if (add && (s->n_miss + 1) * 2 > s->miss_slots_cap) {
        size_t cap = s->miss_slots_cap == 0 ? 256 : s->miss_slots_cap * 2;
        uint32_t *tab = calloc(cap, sizeof(*tab));

        if (tab == NULL) {
            return -ENOMEM;
        }
        for (size_t m = 0; m < s->n_miss; m++) {
            size_t i = s->miss[m].hash & (cap - 1);

            while (tab[i] != 0) {
                i = (i + 1) & (cap - 1);
            }
            tab[i] = (uint32_t) m + 1;
        }
        free(s->miss_slots);
        s->miss_slots = tab;
        s->miss_slots_cap = cap;
    }
    if (s->miss_slots_cap == 0) {
        return -1;
    }
    mask = s->miss_slots_cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t m = s->miss_slots[i];

        if (m == 0) {
            if (!add) {
                return -1;
            }
            if (GROW(s->miss, s->cap_miss, s->n_miss + 1) != 0) {
                return -ENOMEM;
            }
            s->miss[s->n_miss] = (struct name_miss){ name, h, 0 };
            s->miss_slots[i] = (uint32_t) ++s->n_miss;
            return (long) s->n_miss - 1;
        }
        if (s->miss[m - 1].hash == h && strcmp(s->miss[m - 1].name, name) == 0) {
            return (long) m - 1;
        }
    }
}

static void miss_reset(struct kp_sink *s)
{
    if (s->miss_slots != NULL) {
        memset(s->miss_slots, 0, s->miss_slots_cap * sizeof(*s->miss_slots));
    }
    s->n_miss = 0;
}

/* --- array literals for unnest() parameters (kp_pg_array_*) --- */

/* Empties b and opens its array. */
static int arr_open(struct kp_strbuf *b)
{
    kp_strbuf_reset(b);
    return kp_pg_array_open(b);
}

/* Appends v, or NULL when v is 0 (proto3's "not set"). */
static int arr_i64_or_null(struct kp_strbuf *b, int64_t v)
{
    return v == 0 ? kp_pg_array_null(b) : kp_pg_array_i64(b, v);
}

/* --- settling --- */

static void settle(struct kp_sink *s, size_t i, int status, const char *err)
{
    struct kp_sink_item *it = s->items[i];

    it->status = status;
    it->duplicate = false;
    snprintf(it->err, sizeof(it->err), "%s", err != NULL ? err : "");
    s->state[i] = ST_DONE;
}

static void reject(struct kp_sink *s, size_t i, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reject(struct kp_sink *s, size_t i, int status, const char *fmt, ...)
{
    struct kp_sink_item *it = s->items[i];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(it->err, sizeof(it->err), fmt, ap);
    va_end(ap);
    it->status = status;
    it->duplicate = false;
    s->state[i] = ST_DONE;
}

/* --- one attempt --- */

/* Records a failure of the current attempt: its message, and the fault to act on. */
static int attempt_failed(struct kp_sink *s, int rc, const char *what, const char *err)
{
    snprintf(s->err, sizeof(s->err), "%s: %s", what, err);
    return rc;
}

enum kp_pg_fault kp__sink_attempt_fault(struct kp_sink *s, int rc)
{
    if (rc == -ENOMEM) {
        return KP_PG_FAULT_TRANSIENT;
    }
    return kp_pg_last_fault(s->conn);
}

static struct run_slot *run_slot(struct kp_sink *s, int32_t run)
{
    return &s->runs[(uint32_t) run & (KP_SINK_RUN_CACHE_SLOTS - 1)];
}

static int cmp_run_slot(const void *pa, const void *pb)
{
    const struct run_slot *a = pa, *b = pb;

    return a->run_id < b->run_id ? -1 : a->run_id > b->run_id;
}

/* The world size of run, from the cache or this flush's look-up; 0 if it does not exist. */
static int32_t world_size_of(struct kp_sink *s, uint64_t run)
{
    struct run_slot key = { (int32_t) run, 0 };
    const struct run_slot *f;

    if (run == 0 || run > INT32_MAX) {
        return 0;
    }
    if (run_slot(s, (int32_t) run)->run_id == (int32_t) run) {
        return run_slot(s, (int32_t) run)->world_size;
    }
    f = s->n_found > 0 ? bsearch(&key, s->found, s->n_found, sizeof(key), cmp_run_slot) : NULL;
    return f != NULL ? f->world_size : 0;
}

/* Step 1: settles the items whose run is unknown or rank out of range. */
static int check_runs(struct kp_sink *s, size_t lo, size_t hi)
{
    struct kp_strbuf *ids = &s->arr[0];
    const char *params[1];
    PGresult *res = NULL;
    char err[384];
    bool any = false;
    int rc = 0;

    s->n_found = 0;
    if ((rc = arr_open(ids)) != 0) {
        return rc;
    }
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;

        if (s->state[i] == ST_PENDING && b->run_id > 0 && b->run_id <= INT32_MAX &&
            run_slot(s, (int32_t) b->run_id)->run_id != (int32_t) b->run_id) {
            rc |= kp_pg_array_i64(ids, (int64_t) b->run_id);
            any = true;
        }
    }
    if ((rc |= kp_pg_array_close(ids)) != 0) {
        return -ENOMEM;
    }
    if (any) {
        params[0] = ids->data;
        if ((rc = kp_pg_query(s->conn, "SELECT id, world_size FROM runs WHERE id = ANY($1::int[])",
                              1, params, &res, err, sizeof(err))) != 0) {
            return attempt_failed(s, rc, "look up runs", err);
        }
        if (GROW(s->found, s->cap_found, (size_t) PQntuples(res)) != 0) {
            PQclear(res);
            return -ENOMEM;
        }
        for (int r = 0; r < PQntuples(res); r++) {
            struct run_slot f = { (int32_t) strtol(PQgetvalue(res, r, 0), NULL, 10),
                                  (int32_t) strtol(PQgetvalue(res, r, 1), NULL, 10) };

            *run_slot(s, f.run_id) = f;
            s->found[s->n_found++] = f;
        }
        PQclear(res);
        qsort(s->found, s->n_found, sizeof(*s->found), cmp_run_slot);
    }
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;
        int32_t ws;

        if (s->state[i] != ST_PENDING) {
            continue;
        }
        if ((ws = world_size_of(s, b->run_id)) == 0) {
            reject(s, i, KP_ENOTFOUND,
                   "run %" PRIu64
                   " does not exist; create it with Control.CreateRun (kprofctl start / import)",
                   b->run_id);
            kp_log_debug("batch rejected run=%" PRIu64 " rank=%u stream=%" PRIu64 " seq=%" PRIu64
                         " err=\"no such run\"",
                         b->run_id, b->rank, b->stream, b->seq);
        }
        else if ((int64_t) b->rank >= ws) {
            reject(s, i, KP_EPROTO, "rank %u is outside run %" PRIu64 "'s world size %d", b->rank,
                   b->run_id, ws);
            kp_log_debug("batch rejected run=%" PRIu64 " rank=%u stream=%" PRIu64 " seq=%" PRIu64
                         " err=\"rank outside world size %d\"",
                         b->run_id, b->rank, b->stream, b->seq, ws);
        }
    }
    return 0;
}

/* The row of run in res (id, state, ended_at, source, ended_ns), or -1. */
static int run_row(const PGresult *res, uint64_t run)
{
    for (int r = 0; r < PQntuples(res); r++) {
        if (strtoull(PQgetvalue(res, r, 0), NULL, 10) == run) {
            return r;
        }
    }
    return -1;
}

/* Into *last (run_id, stream, the highest seq stored or NULL), for each (run, stream) of the
 * pending items whose run in res (check_open's rows) is no longer open. */
static int last_seqs(struct kp_sink *s, size_t lo, size_t hi, const PGresult *res, PGresult **last)
{
    struct kp_strbuf *ids = &s->arr[0], *streams = &s->arr[1];
    const char *params[2];
    char err[384];
    int rc = arr_open(ids) | arr_open(streams);

    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;
        int r = s->state[i] == ST_PENDING ? run_row(res, b->run_id) : -1;

        if (r >= 0 &&
            strtol(PQgetvalue(res, r, 1), NULL, 10) != KPROF__V1__RUN_STATE__RUN_STATE_OPEN) {
            rc |= kp_pg_array_i64(ids, (int64_t) b->run_id);
            rc |= kp_pg_array_i64(streams, (int64_t) b->stream);
        }
    }
    if ((rc |= kp_pg_array_close(ids) | kp_pg_array_close(streams)) != 0) {
        return -ENOMEM;
    }
    params[0] = ids->data;
    params[1] = streams->data;
    if ((rc = kp_pg_query(s->conn,
                          "SELECT u.run_id, u.stream, (SELECT max(k.seq) FROM ingest_batches k "
                          "WHERE k.run_id = u.run_id AND k.stream = u.stream) "
                          "FROM (SELECT DISTINCT * FROM unnest($1::int[], $2::bigint[])) "
                          "AS u(run_id, stream)",
                          2, params, last, err, sizeof(err))) != 0) {
        return attempt_failed(s, rc, "last batches of ended runs", err);
    }
    return 0;
}

/* The run ids of the pending items in [lo, hi) as a PostgreSQL array literal in ids. 0, or
 * -ENOMEM. */
static int pending_run_ids(struct kp_sink *s, size_t lo, size_t hi, struct kp_strbuf *ids)
{
    int rc;

    if ((rc = arr_open(ids)) != 0) {
        return rc;
    }
    for (size_t i = lo; i < hi; i++) {
        if (s->state[i] == ST_PENDING) {
            rc |= kp_pg_array_i64(ids, (int64_t) s->items[i]->batch->run_id);
        }
    }
    return (rc | kp_pg_array_close(ids)) != 0 ? -ENOMEM : 0;
}

/* A batch goes into a run that has ended: its compare summary (collectord/summary.h), made
 * when it ended, is deleted in this transaction, so that compare reads the events from now on
 * (a later EndRun of the run makes it again). Of the pending items' runs, only those ended
 * lose theirs. */
static int drop_summaries(struct kp_sink *s, size_t lo, size_t hi)
{
    struct kp_strbuf *ids = &s->arr[0];
    const char *params[1];
    char err[384];
    int rc;

    if ((rc = pending_run_ids(s, lo, hi, ids)) != 0) {
        return rc;
    }
    params[0] = ids->data;
    if ((rc = kp_pg_query(s->conn,
                          "DELETE FROM compare_runs c USING runs r WHERE c.run_id = r.id AND "
                          "r.id = ANY($1::int[]) AND r.state <> 1",
                          1, params, NULL, err, sizeof(err))) != 0) {
        return attempt_failed(s, rc, "drop compare summaries", err);
    }
    return 0;
}

/*
 * Step 3a, first in the transaction: locks the runs of the pending items FOR SHARE and settles
 * those that a run no longer open refuses. The lock conflicts with the UPDATE that ends a run
 * (EndRun, the open-run timeout, the coordinator), so a run's state cannot change until this
 * flush commits: a batch is stored only if its flush commits before the end does, and the
 * keys an ended run holds grow only by batches made before the end. Into an ended (or failed)
 * run a batch goes on when its producer made it before the end, told by what the batch and
 * the run hold, never by when it arrives: its seq is at most the highest seq its (run, stream)
 * stored (a resend, which the keys then mark duplicate, or an older batch late to arrive), or
 * the run is a capture and the batch's events start (base_ns, the agent's real-time clock) no
 * later than the end (what an agent spooled while collectord was away, which a restarted
 * collectord ends as FAILED before the agent is back). Any other batch is refused with -EBUSY.
 * Taken before the event tables, in the order kp_store_drop_run takes the run row and then the
 * tables, so that the two cannot deadlock.
 */
static int check_open(struct kp_sink *s, size_t lo, size_t hi)
{
    struct kp_strbuf *ids = &s->arr[0];
    const char *params[1];
    PGresult *res = NULL, *last = NULL;
    char err[384];
    bool closed = false, stale = false;
    int rc = 0;

    if ((rc = pending_run_ids(s, lo, hi, ids)) != 0) {
        return rc;
    }
    params[0] = ids->data;
    if ((rc = kp_pg_query(s->conn,
                          "SELECT id, state, to_char(ended_at AT TIME ZONE 'UTC', "
                          "'YYYY-MM-DD HH24:MI:SS'), source, "
                          "(extract(epoch FROM ended_at) * 1000000)::bigint * 1000 "
                          "FROM runs WHERE id = ANY($1::int[]) ORDER BY id FOR SHARE",
                          1, params, &res, err, sizeof(err))) != 0) {
        return attempt_failed(s, rc, "lock runs", err);
    }
    for (int r = 0; r < PQntuples(res); r++) {
        closed |= strtol(PQgetvalue(res, r, 1), NULL, 10) != KPROF__V1__RUN_STATE__RUN_STATE_OPEN;
    }
    if (closed && (rc = last_seqs(s, lo, hi, res, &last)) != 0) {
        PQclear(res);
        return rc;
    }
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;
        int r = s->state[i] == ST_PENDING ? run_row(res, b->run_id) : -1;
        long state = r >= 0 ? strtol(PQgetvalue(res, r, 1), NULL, 10) : 0;
        bool admit = false;

        if (s->state[i] != ST_PENDING || state == KPROF__V1__RUN_STATE__RUN_STATE_OPEN) {
            continue;
        }
        if (r < 0) {
            reject(s, i, KP_ENOTFOUND, "run %" PRIu64 " does not exist (it was dropped)",
                   b->run_id);
            continue;
        }
        if (strtol(PQgetvalue(res, r, 3), NULL, 10) == KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE &&
            !PQgetisnull(res, r, 4) && b->base_ns <= strtoll(PQgetvalue(res, r, 4), NULL, 10)) {
            stale = true;
            continue; /* made before the end */
        }
        for (int l = 0; last != NULL && l < PQntuples(last); l++) {
            if (strtoull(PQgetvalue(last, l, 0), NULL, 10) == b->run_id &&
                strtoll(PQgetvalue(last, l, 1), NULL, 10) == (int64_t) b->stream) {
                admit = !PQgetisnull(last, l, 2) &&
                        (int64_t) b->seq <= strtoll(PQgetvalue(last, l, 2), NULL, 10);
                break;
            }
        }
        if (admit) {
            stale = true;
        }
        else {
            reject(s, i, -EBUSY,
                   "run %" PRIu64 " %s at %s UTC and takes no new batches (stream %" PRIu64
                   " seq %" PRIu64 "); start a new run",
                   b->run_id, state == KPROF__V1__RUN_STATE__RUN_STATE_FAILED ? "failed" : "ended",
                   PQgetvalue(res, r, 2), b->stream, b->seq);
            kp_log_debug("batch refused run=%" PRIu64 " rank=%u stream=%" PRIu64 " seq=%" PRIu64
                         " err=\"run not open\"",
                         b->run_id, b->rank, b->stream, b->seq);
        }
    }
    PQclear(last);
    PQclear(res);
    return stale ? drop_summaries(s, lo, hi) : 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

/* Inserts sorted[0..n) into names and records the ids that come back in miss[]. */
static int insert_names(struct kp_sink *s, size_t from, size_t n)
{
    struct kp_strbuf *lit = &s->arr[0];
    const char *params[1];
    PGresult *res = NULL;
    char err[384];
    int rc = arr_open(lit);

    for (size_t i = from; i < from + n; i++) {
        rc |= kp_pg_array_text(lit, s->sorted[i]);
    }
    if ((rc |= kp_pg_array_close(lit)) != 0) {
        return -ENOMEM;
    }
    params[0] = lit->data;
    if ((rc = kp_pg_query(s->conn,
                          "INSERT INTO names (name) SELECT unnest($1::text[]) "
                          "ON CONFLICT (md5(name)) DO UPDATE SET name = EXCLUDED.name "
                          "RETURNING id, name",
                          1, params, &res, err, sizeof(err))) != 0) {
        return attempt_failed(s, rc, "resolve names", err);
    }
    for (int r = 0; r < PQntuples(res); r++) {
        const char *name = PQgetvalue(res, r, 1);
        uint64_t h = hash_str(name);
        long m = miss_find(s, name, h, false);

        if (m >= 0) {
            s->miss[m].id = (int32_t) strtol(PQgetvalue(res, r, 0), NULL, 10);
        }
    }
    PQclear(res);
    return 0;
}

/* Step 2: fills name_ids for the pending items. */
static int resolve_names(struct kp_sink *s, size_t lo, size_t hi)
{
    size_t total = 0, from, bytes;
    int rc;

    for (size_t i = lo; i < hi; i++) {
        s->name_off[i] = total;
        if (s->state[i] == ST_PENDING) {
            total += s->items[i]->batch->n_strings;
        }
    }
    if (GROW(s->name_ids, s->cap_name_ids, total + 1) != 0) {
        return -ENOMEM;
    }
    miss_reset(s);
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;
        int32_t *ids = s->name_ids + s->name_off[i];

        if (s->state[i] != ST_PENDING) {
            continue;
        }
        for (size_t j = 1; j < b->n_strings; j++) {
            uint64_t h = hash_str(b->strings[j]);
            int32_t id = names_get(s, b->strings[j], h);
            long m;

            if (id == 0) {
                if ((m = miss_find(s, b->strings[j], h, true)) < 0) {
                    return (int) m;
                }
                id = (int32_t) (-m - 1); /* resolved below */
            }
            ids[j] = id;
        }
        if (b->n_strings > 0) {
            ids[0] = 0;
        }
    }
    if (s->n_miss == 0) {
        return 0;
    }
    if (GROW(s->sorted, s->cap_sorted, s->n_miss) != 0) {
        return -ENOMEM;
    }
    for (size_t m = 0; m < s->n_miss; m++) {
        s->sorted[m] = s->miss[m].name;
    }
    qsort(s->sorted, s->n_miss, sizeof(*s->sorted), cmp_str);
    from = 0;
    bytes = 0;
    for (size_t m = 0; m <= s->n_miss; m++) {
        if (m == s->n_miss || m - from >= KP_SINK_NAMES_PER_INSERT ||
            bytes >= KP_SINK_NAMES_BYTES_PER_INSERT) {
            if (m > from && (rc = insert_names(s, from, m - from)) != 0) {
                return rc;
            }
            from = m;
            bytes = 0;
        }
        if (m < s->n_miss) {
            bytes += strlen(s->sorted[m]) + 3;
        }
    }
    for (size_t m = 0; m < s->n_miss; m++) {
        if (s->miss[m].id <= 0) {
            snprintf(s->err, sizeof(s->err), "resolve names: no id came back for a name");
            return KP_EPG;
        }
        names_put(s, s->miss[m].name, s->miss[m].hash, s->miss[m].id);
    }
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;
        int32_t *ids = s->name_ids + s->name_off[i];

        if (s->state[i] != ST_PENDING) {
            continue;
        }
        for (size_t j = 1; j < b->n_strings; j++) {
            if (ids[j] < 0) {
                ids[j] = s->miss[-(ids[j] + 1)].id;
            }
        }
    }
    return 0;
}

static int cmp_key(const void *pa, const void *pb)
{
    const struct key_ref *a = pa, *b = pb;

    if (a->run != b->run) {
        return a->run < b->run ? -1 : 1;
    }
    if (a->rank != b->rank) {
        return a->rank < b->rank ? -1 : 1;
    }
    if (a->stream != b->stream) {
        return a->stream < b->stream ? -1 : 1;
    }
    if (a->seq != b->seq) {
        return a->seq < b->seq ? -1 : 1;
    }
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static bool same_key(const struct key_ref *a, const struct key_ref *b)
{
    return a->run == b->run && a->rank == b->rank && a->stream == b->stream && a->seq == b->seq;
}

/* Step 3a: inserts the keys; marks pending items ST_NEW or ST_DUP. Returns the number new. */
static long insert_keys(struct kp_sink *s, size_t lo, size_t hi)
{
    struct kp_strbuf *a = s->arr;
    const char *params[5];
    PGresult *res = NULL;
    size_t n = 0, u = 0;
    long n_new = 0;
    char err[384];
    int rc = 0;

    if (GROW(s->keys, s->cap_keys, hi - lo) != 0) {
        return -ENOMEM;
    }
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;

        if (s->state[i] == ST_PENDING) {
            s->keys[n++] = (struct key_ref){ (int64_t) b->run_id, b->rank, (int64_t) b->stream,
                                             (int64_t) b->seq, (uint32_t) i };
        }
    }
    if (n == 0) {
        return 0;
    }
    /* Sorted, so that concurrent flushes lock keys in one order; repeats within the flush
     * are duplicates of their first occurrence. */
    qsort(s->keys, n, sizeof(*s->keys), cmp_key);
    for (int p = 0; p < 5; p++) {
        rc |= arr_open(&a[p]);
    }
    for (size_t k = 0; k < n; k++) {
        if (k > 0 && same_key(&s->keys[k], &s->keys[u - 1])) {
            s->state[s->keys[k].idx] = ST_DUP;
            continue;
        }
        s->keys[u++] = s->keys[k];
        rc |= kp_pg_array_i64(&a[0], s->keys[k].run);
        rc |= kp_pg_array_i64(&a[1], s->keys[k].rank);
        rc |= kp_pg_array_i64(&a[2], s->keys[k].stream);
        rc |= kp_pg_array_i64(&a[3], s->keys[k].seq);
        rc |=
            kp_pg_array_i64(&a[4], (int64_t) kp_batch_total_rows(s->items[s->keys[k].idx]->batch));
        s->state[s->keys[k].idx] = ST_DUP; /* until the INSERT says it is new */
    }
    for (int p = 0; p < 5; p++) {
        rc |= kp_pg_array_close(&a[p]);
        params[p] = a[p].data;
    }
    if (rc != 0) {
        return -ENOMEM;
    }
    if ((rc = kp_pg_query(s->conn,
                          "INSERT INTO ingest_batches (run_id, rank, stream, seq, rows) "
                          "SELECT * FROM unnest($1::int[], $2::int[], $3::bigint[], "
                          "$4::bigint[], $5::int[]) ON CONFLICT DO NOTHING "
                          "RETURNING run_id, rank, stream, seq",
                          5, params, &res, err, sizeof(err))) != 0) {
        return attempt_failed(s, rc, "insert batch keys", err);
    }
    for (int r = 0; r < PQntuples(res); r++) {
        struct key_ref want = { strtoll(PQgetvalue(res, r, 0), NULL, 10),
                                strtoll(PQgetvalue(res, r, 1), NULL, 10),
                                strtoll(PQgetvalue(res, r, 2), NULL, 10),
                                strtoll(PQgetvalue(res, r, 3), NULL, 10), 0 };
        size_t l = 0, h = u;

        while (l < h) {
            size_t m = l + (h - l) / 2;

            if (cmp_key(&s->keys[m], &want) < 0 && !same_key(&s->keys[m], &want)) {
                l = m + 1;
            }
            else {
                h = m;
            }
        }
        if (l < u && same_key(&s->keys[l], &want) && s->state[s->keys[l].idx] == ST_DUP) {
            s->state[s->keys[l].idx] = ST_NEW;
            n_new++;
        }
    }
    PQclear(res);
    return n_new;
}

/* Step 3b: one COPY of kind k's rows of the new items into its table, or (side) of their
 * side-table rows (kp_batch_side_rows: only the rows that carry a side figure) into its side
 * table. Returns the rows copied. */
static long copy_kind(struct kp_sink *s, enum kp_event_kind k, bool side, size_t lo, size_t hi)
{
    const struct kp_event_kind_info *ki = &kp_event_kinds[k];
    const char *table = side ? ki->side->table : ki->store;
    size_t want = 0, chunk = KP_SINK_COPY_FIRST_CHUNK;
    long got;
    char err[384];
    int rc;

    for (size_t i = lo; i < hi; i++) {
        if (s->state[i] == ST_NEW) {
            want += side ? kp_batch_side_rows(s->items[i]->batch, k)
                         : kp_batch_rows(s->items[i]->batch, k);
        }
    }
    if (want == 0) {
        return 0;
    }
    if ((rc = kp_pg_copy_begin(s->conn, table, side ? s->side_cols[k] : s->copy_cols[k], err,
                               sizeof(err))) != 0) {
        return attempt_failed(s, rc, table, err);
    }
    kp_strbuf_reset(&s->copy);
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;

        if (s->state[i] != ST_NEW || kp_batch_rows(b, k) == 0) {
            continue;
        }
        if ((side ? kp_codec_side_copy_text(b, k, &s->copy)
                  : kp_codec_copy_text(b, k, s->name_ids + s->name_off[i], &s->copy)) < 0) {
            kp_pg_copy_end(s->conn, "collectord is out of memory", err, sizeof(err));
            snprintf(s->err, sizeof(s->err), "%s: out of memory encoding rows", table);
            return -ENOMEM;
        }
        /* The first chunk is small so that PostgreSQL starts parsing at once; later ones
         * grow, and are encoded while it parses the ones before. */
        if (s->copy.len >= chunk) {
            if ((rc = kp_pg_copy_put(s->conn, s->copy.data, s->copy.len, err, sizeof(err))) != 0) {
                kp_pg_copy_end(s->conn, "send failed", s->err, sizeof(s->err));
                return attempt_failed(s, rc, table, err);
            }
            kp_strbuf_reset(&s->copy);
            chunk = chunk * 2 < KP_SINK_COPY_CHUNK ? chunk * 2 : KP_SINK_COPY_CHUNK;
        }
    }
    if (s->copy.len > 0 &&
        (rc = kp_pg_copy_put(s->conn, s->copy.data, s->copy.len, err, sizeof(err))) != 0) {
        kp_pg_copy_end(s->conn, "send failed", s->err, sizeof(s->err));
        return attempt_failed(s, rc, table, err);
    }
    if ((got = kp_pg_copy_end(s->conn, NULL, err, sizeof(err))) < 0) {
        return attempt_failed(s, (int) got, table, err);
    }
    if ((size_t) got != want) {
        kp_log_error("copy row count mismatch table=%s want=%zu got=%ld", table, want, got);
    }
    return got;
}

static int cmp_rank(const void *pa, const void *pb)
{
    const struct key_ref *a = pa, *b = pb;

    if (a->run != b->run) {
        return a->run < b->run ? -1 : 1;
    }
    if (a->rank != b->rank) {
        return a->rank < b->rank ? -1 : 1;
    }
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/*
 * Step 3c: adds the new items' counts to `ranks`, one row per (run, rank). A group whose
 * batches carried no rank_info passes job NULL, which keeps the row's identity columns;
 * with rank_info, job is non-NULL ('' if the producer sent none).
 */
static int upsert_ranks(struct kp_sink *s, size_t lo, size_t hi)
{
    struct kp_strbuf *a = s->arr;
    const char *params[17];
    size_t n = 0;
    char err[384];
    int rc = 0;

    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;

        if (s->state[i] == ST_NEW) {
            s->keys[n++] = (struct key_ref){ (int64_t) b->run_id, b->rank, 0, 0, (uint32_t) i };
        }
    }
    if (n == 0) {
        return 0;
    }
    qsort(s->keys, n, sizeof(*s->keys), cmp_rank);
    for (int p = 0; p < 17; p++) {
        rc |= arr_open(&a[p]);
    }
    for (size_t g = 0; g < n;) {
        const Kprof__V1__RankInfo *info = NULL;
        int64_t batches = 0, records = 0, dropped = 0, cupti = 0, overhead = 0;
        size_t e = g;

        for (; e < n && s->keys[e].run == s->keys[g].run && s->keys[e].rank == s->keys[g].rank;
             e++) {
            const Kprof__V1__Batch *b = s->items[s->keys[e].idx]->batch;

            batches++;
            records += (int64_t) kp_batch_total_rows(b);
            if (b->stats != NULL) {
                dropped += (int64_t) b->stats->records_dropped;
                cupti += (int64_t) b->stats->cupti_dropped;
                overhead += (int64_t) b->stats->overhead_ns;
            }
            if (b->rank_info != NULL) {
                info = b->rank_info; /* the latest wins */
            }
        }
        rc |= kp_pg_array_i64(&a[0], s->keys[g].run);
        rc |= kp_pg_array_i64(&a[1], s->keys[g].rank);
        if (info != NULL) {
            rc |= kp_pg_array_text(&a[2], info->job);
            rc |= info->host[0] != '\0' ? kp_pg_array_text(&a[3], info->host)
                                        : kp_pg_array_null(&a[3]);
            rc |= arr_i64_or_null(&a[4], info->pid);
            rc |= kp_pg_array_i64(&a[5], info->local_rank);
            rc |= info->device >= 0 && info->device <= INT16_MAX
                      ? kp_pg_array_i64(&a[6], info->device)
                      : kp_pg_array_null(&a[6]);
            rc |= kp_pg_array_i64(&a[7], info->clock_offset_ns);
            /* the profiler's span: NULL when not known (both 0) */
            rc |= info->profiler_end_ns > 0 ? kp_pg_array_i64(&a[13], info->profiler_start_ns)
                                            : kp_pg_array_null(&a[13]);
            rc |= info->profiler_end_ns > 0 ? kp_pg_array_i64(&a[14], info->profiler_end_ns)
                                            : kp_pg_array_null(&a[14]);
            /* the trace's time base: NULL when absolute (0) */
            rc |= info->time_base_ns != 0 ? kp_pg_array_i64(&a[15], info->time_base_ns)
                                          : kp_pg_array_null(&a[15]);
            /* an imported trace's distributedInfo (JSON text); NULL: none */
            rc |= info->distributed_info != NULL && info->distributed_info[0] != '\0'
                      ? kp_pg_array_text(&a[16], info->distributed_info)
                      : kp_pg_array_null(&a[16]);
        }
        else {
            for (int p = 2; p <= 6; p++) {
                rc |= kp_pg_array_null(&a[p]);
            }
            rc |= kp_pg_array_i64(&a[7], 0);
            rc |= kp_pg_array_null(&a[13]);
            rc |= kp_pg_array_null(&a[14]);
            rc |= kp_pg_array_null(&a[15]);
            rc |= kp_pg_array_null(&a[16]);
        }
        rc |= kp_pg_array_i64(&a[8], batches);
        rc |= kp_pg_array_i64(&a[9], records);
        rc |= kp_pg_array_i64(&a[10], dropped);
        rc |= kp_pg_array_i64(&a[11], cupti);
        rc |= kp_pg_array_i64(&a[12], overhead);
        g = e;
    }
    for (int p = 0; p < 17; p++) {
        rc |= kp_pg_array_close(&a[p]);
        params[p] = a[p].data;
    }
    if (rc != 0) {
        return -ENOMEM;
    }
    if ((rc = kp_pg_query(
             s->conn,
             "INSERT INTO ranks AS k (run_id, rank, job, host, pid, local_rank, device, "
             "clock_offset_ns, batches, records, records_dropped, cupti_dropped, overhead_ns, "
             "profiler_start_ns, profiler_end_ns, time_base_ns, distributed_info) "
             "SELECT * FROM unnest($1::int[], $2::int[], $3::text[], $4::text[], $5::int[], "
             "$6::int[], $7::smallint[], $8::bigint[], $9::bigint[], $10::bigint[], "
             "$11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], "
             "$16::bigint[], $17::text[]) "
             "ON CONFLICT (run_id, rank) DO UPDATE SET "
             "job = coalesce(EXCLUDED.job, k.job), "
             "host = CASE WHEN EXCLUDED.job IS NULL THEN k.host ELSE EXCLUDED.host END, "
             "pid = CASE WHEN EXCLUDED.job IS NULL THEN k.pid ELSE EXCLUDED.pid END, "
             "local_rank = CASE WHEN EXCLUDED.job IS NULL THEN k.local_rank "
             "ELSE EXCLUDED.local_rank END, "
             "device = CASE WHEN EXCLUDED.job IS NULL THEN k.device ELSE EXCLUDED.device END, "
             "clock_offset_ns = CASE WHEN EXCLUDED.job IS NULL THEN k.clock_offset_ns "
             "ELSE EXCLUDED.clock_offset_ns END, "
             "profiler_start_ns = CASE WHEN EXCLUDED.job IS NULL THEN k.profiler_start_ns "
             "ELSE EXCLUDED.profiler_start_ns END, "
             "profiler_end_ns = CASE WHEN EXCLUDED.job IS NULL THEN k.profiler_end_ns "
             "ELSE EXCLUDED.profiler_end_ns END, "
             "time_base_ns = CASE WHEN EXCLUDED.job IS NULL THEN k.time_base_ns "
             "ELSE EXCLUDED.time_base_ns END, "
             "distributed_info = CASE WHEN EXCLUDED.job IS NULL THEN k.distributed_info "
             "ELSE EXCLUDED.distributed_info END, "
             "batches = k.batches + EXCLUDED.batches, records = k.records + EXCLUDED.records, "
             "records_dropped = k.records_dropped + EXCLUDED.records_dropped, "
             "cupti_dropped = k.cupti_dropped + EXCLUDED.cupti_dropped, "
             "overhead_ns = k.overhead_ns + EXCLUDED.overhead_ns, last_seen = now()",
             17, params, NULL, err, sizeof(err))) != 0) {
        return attempt_failed(s, rc, "ranks", err);
    }
    return 0;
}

static int cmp_dev(const void *pa, const void *pb)
{
    const struct dev_ref *a = pa, *b = pb;

    if (a->run != b->run) {
        return a->run < b->run ? -1 : 1;
    }
    if (a->rank != b->rank) {
        return a->rank < b->rank ? -1 : 1;
    }
    if (a->dev != b->dev) {
        return a->dev < b->dev ? -1 : 1;
    }
    if (a->idx != b->idx) {
        return a->idx < b->idx ? -1 : 1;
    }
    return a->d < b->d ? -1 : a->d > b->d;
}

/* Step 3d: upserts the new items' devices; for a device seen twice the latest wins. */
static int upsert_devices(struct kp_sink *s, size_t lo, size_t hi)
{
    struct kp_strbuf *a = s->arr;
    const char *params[18];
    size_t n = 0;
    char err[384];
    int rc = 0;

    for (size_t i = lo; i < hi; i++) {
        if (s->state[i] == ST_NEW) {
            n += s->items[i]->batch->n_devices;
        }
    }
    if (n == 0) {
        return 0;
    }
    if (GROW(s->devs, s->cap_devs, n) != 0) {
        return -ENOMEM;
    }
    n = 0;
    for (size_t i = lo; i < hi; i++) {
        const Kprof__V1__Batch *b = s->items[i]->batch;

        for (size_t d = 0; s->state[i] == ST_NEW && d < b->n_devices; d++) {
            s->devs[n++] = (struct dev_ref){ (int64_t) b->run_id, b->rank, b->devices[d]->id,
                                             (uint32_t) i, (uint32_t) d };
        }
    }
    qsort(s->devs, n, sizeof(*s->devs), cmp_dev);
    for (int p = 0; p < 18; p++) {
        rc |= arr_open(&a[p]);
    }
    for (size_t k = 0; k < n; k++) {
        const struct dev_ref *r = &s->devs[k];
        const Kprof__V1__Device *d;

        if (k + 1 < n && r->run == r[1].run && r->rank == r[1].rank && r->dev == r[1].dev) {
            continue; /* a later one of the same device follows */
        }
        d = s->items[r->idx]->batch->devices[r->d];
        rc |= kp_pg_array_i64(&a[0], r->run);
        rc |= kp_pg_array_i64(&a[1], r->rank);
        rc |= kp_pg_array_i64(&a[2], r->dev);
        rc |= kp_pg_array_text(&a[3], d->name);
        rc |= arr_i64_or_null(&a[4], (int64_t) d->global_memory_bytes);
        rc |= arr_i64_or_null(&a[5], (int64_t) d->memory_bandwidth_bytes_per_s);
        rc |= arr_i64_or_null(&a[6], d->sm_count);
        rc |= arr_i64_or_null(&a[7], d->clock_khz);
        rc |= arr_i64_or_null(&a[8], d->max_threads_per_block);
        rc |= arr_i64_or_null(&a[9], d->max_threads_per_sm);
        rc |= arr_i64_or_null(&a[10], d->max_blocks_per_sm);
        rc |= arr_i64_or_null(&a[11], d->regs_per_sm);
        rc |= arr_i64_or_null(&a[12], d->regs_per_block);
        rc |= arr_i64_or_null(&a[13], d->smem_per_sm);
        rc |= arr_i64_or_null(&a[14], d->smem_per_block);
        rc |= arr_i64_or_null(&a[15], d->warp_size);
        /* 0 is a real minor version (8.0); both are unset only together. */
        rc |= d->cc_major == 0 ? kp_pg_array_null(&a[16]) : kp_pg_array_i64(&a[16], d->cc_major);
        rc |= d->cc_major == 0 ? kp_pg_array_null(&a[17]) : kp_pg_array_i64(&a[17], d->cc_minor);
    }
    for (int p = 0; p < 18; p++) {
        rc |= kp_pg_array_close(&a[p]);
        params[p] = a[p].data;
    }
    if (rc != 0) {
        return -ENOMEM;
    }
    if ((rc = kp_pg_query(
             s->conn,
             "INSERT INTO devices AS d (run_id, rank, id, name, global_memory_bytes, "
             "memory_bandwidth_bytes_per_s, sm_count, clock_khz, max_threads_per_block, "
             "max_threads_per_sm, max_blocks_per_sm, regs_per_sm, regs_per_block, smem_per_sm, "
             "smem_per_block, warp_size, cc_major, cc_minor) "
             "SELECT * FROM unnest($1::int[], $2::int[], $3::smallint[], $4::text[], "
             "$5::bigint[], $6::bigint[], $7::int[], $8::int[], $9::int[], $10::int[], "
             "$11::int[], $12::int[], $13::int[], $14::int[], $15::int[], $16::int[], "
             "$17::smallint[], $18::smallint[]) "
             "ON CONFLICT (run_id, rank, id) DO UPDATE SET name = EXCLUDED.name, "
             "global_memory_bytes = EXCLUDED.global_memory_bytes, "
             "memory_bandwidth_bytes_per_s = EXCLUDED.memory_bandwidth_bytes_per_s, "
             "sm_count = EXCLUDED.sm_count, clock_khz = EXCLUDED.clock_khz, "
             "max_threads_per_block = EXCLUDED.max_threads_per_block, "
             "max_threads_per_sm = EXCLUDED.max_threads_per_sm, "
             "max_blocks_per_sm = EXCLUDED.max_blocks_per_sm, "
             "regs_per_sm = EXCLUDED.regs_per_sm, regs_per_block = EXCLUDED.regs_per_block, "
             "smem_per_sm = EXCLUDED.smem_per_sm, smem_per_block = EXCLUDED.smem_per_block, "
             "warp_size = EXCLUDED.warp_size, cc_major = EXCLUDED.cc_major, "
             "cc_minor = EXCLUDED.cc_minor",
             18, params, NULL, err, sizeof(err))) != 0) {
        return attempt_failed(s, rc, "devices", err);
    }
    return 0;
}

/*
 * One attempt at storing the unsettled items of items[lo..hi) (steps 1-3 at the top).
 * Returns 0 with every item of the range settled, or a negative code with s->err set and
 * the transaction rolled back.
 */
static int flush_once(struct kp_sink *s, size_t lo, size_t hi)
{
    uint64_t rows = 0, n_new = 0, n_dup = 0;
    long long t0 = kp_mono_ns(), t_names, t_copy, t_end;
    size_t pending = 0, settled_here = 0;
    char err[384];
    long r;
    int rc;

    for (size_t i = lo; i < hi; i++) {
        if (s->state[i] != ST_DONE) {
            s->state[i] = ST_PENDING;
        }
    }
    if ((rc = check_runs(s, lo, hi)) != 0 || (rc = resolve_names(s, lo, hi)) != 0) {
        goto fail;
    }
    t_names = kp_mono_ns();
    for (size_t i = lo; i < hi; i++) {
        pending += s->state[i] == ST_PENDING;
    }
    if (pending == 0) {
        return 0;
    }
    /* kprof.sink: these inserts keep the compare summaries (migration 0014's triggers) */
    if ((rc = kp_pg_exec(s->conn, "BEGIN; SET LOCAL kprof.sink = 'on'", err, sizeof(err))) != 0) {
        rc = attempt_failed(s, rc, "begin", err);
        goto fail;
    }
    if ((rc = check_open(s, lo, hi)) != 0) {
        goto fail;
    }
    for (size_t i = lo; i < hi; i++) {
        settled_here += s->state[i] != ST_PENDING;
    }
    if (settled_here == hi - lo) {
        /* every batch was refused: nothing to store */
        kp_pg_rollback(s->conn);
        return 0;
    }
    if ((rc = kp_pg_exec(s->conn, s->lock_sql, err, sizeof(err))) != 0) {
        rc = attempt_failed(s, rc, "lock tables", err);
        goto fail;
    }
    if ((r = insert_keys(s, lo, hi)) < 0) {
        rc = (int) r;
        goto fail;
    }
    for (int k = 0; r > 0 && k < KP_EV_COUNT; k++) {
        long got = copy_kind(s, (enum kp_event_kind) k, false, lo, hi);

        if (got < 0) {
            rc = (int) got;
            goto fail;
        }
        rows += (uint64_t) got;
        /* Side-table rows are part of their event rows, not rows of their own. */
        if (kp_event_kinds[k].side != NULL &&
            (got = copy_kind(s, (enum kp_event_kind) k, true, lo, hi)) < 0) {
            rc = (int) got;
            goto fail;
        }
    }
    t_copy = kp_mono_ns();
    if ((rc = upsert_ranks(s, lo, hi)) != 0 || (rc = upsert_devices(s, lo, hi)) != 0) {
        goto fail;
    }
    if ((rc = kp_pg_exec(s->conn, "COMMIT", err, sizeof(err))) != 0) {
        rc = attempt_failed(s, rc, "commit", err);
        goto fail;
    }
    t_end = kp_mono_ns();
    for (size_t i = lo; i < hi; i++) {
        if (s->state[i] == ST_NEW || s->state[i] == ST_DUP) {
            bool dup = s->state[i] == ST_DUP;

            settle(s, i, 0, NULL);
            s->items[i]->duplicate = dup;
            n_new += !dup;
            n_dup += dup;
        }
    }
    pthread_mutex_lock(&s->mu);
    s->stats.batches_committed += n_new;
    s->stats.batches_duplicate += n_dup;
    s->stats.rows_committed += rows;
    pthread_mutex_unlock(&s->mu);
    kp_log_debug("flush committed items=%zu new=%" PRIu64 " duplicate=%" PRIu64 " rows=%" PRIu64
                 " lookup_ms=%.1f copy_ms=%.1f commit_ms=%.1f",
                 pending, n_new, n_dup, rows, (double) (t_names - t0) / 1e6,
                 (double) (t_copy - t_names) / 1e6, (double) (t_end - t_copy) / 1e6);
    return 0;
fail:
    if (rc == -ENOMEM && s->err[0] == '\0') {
        snprintf(s->err, sizeof(s->err), "out of memory");
    }
    kp_pg_rollback(s->conn);
    return rc;
}

/*
 * Flushes items[lo..hi), isolating batches that make statements fail. Returns 0 when every
 * item of the range is settled, or the failure (connection or transient) to retry after.
 */
int kp__sink_flush_range(struct kp_sink *s, size_t lo, size_t hi, bool *isolating)
{
    size_t pending = 0, mid, seen = 0, before = 0;
    int rc;

    s->err[0] = '\0';
    if ((rc = flush_once(s, lo, hi)) == 0) {
        return 0;
    }
    if (kp__sink_attempt_fault(s, rc) != KP_PG_FAULT_STATEMENT) {
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    s->stats.flush_failures++;
    pthread_mutex_unlock(&s->mu);
    /* A run may have gone away under the cache (kp_drop_run): check the runs afresh, and if
     * that settles anything, try the rest again as it is. */
    for (size_t i = lo; i < hi; i++) {
        before += s->state[i] != ST_DONE;
        if (s->state[i] != ST_DONE) {
            s->state[i] = ST_PENDING;
        }
    }
    memset(s->runs, 0, sizeof(s->runs));
    if ((rc = check_runs(s, lo, hi)) != 0) {
        return rc;
    }
    for (size_t i = lo; i < hi; i++) {
        pending += s->state[i] != ST_DONE;
    }
    if (pending < before) {
        return pending == 0 ? 0 : kp__sink_flush_range(s, lo, hi, isolating);
    }
    /* The data of some batch is wrong: halve the range until the culprit stands alone. */
    if (!*isolating) {
        kp_log_warn("flush failed items=%zu err=\"%s\"; isolating the bad batch", pending, s->err);
        *isolating = true;
    }
    if (pending == 1) {
        for (size_t i = lo; i < hi; i++) {
            const Kprof__V1__Batch *b = s->items[i]->batch;

            if (s->state[i] == ST_DONE) {
                continue;
            }
            reject(s, i, KP_EPROTO, "PostgreSQL refused the batch: %s", s->err);
            kp_log_warn("batch rejected run=%" PRIu64 " rank=%u stream=%" PRIu64 " seq=%" PRIu64
                        " err=\"%s\"",
                        b->run_id, b->rank, b->stream, b->seq, s->err);
        }
        return 0;
    }
    for (mid = lo; mid < hi; mid++) {
        if (s->state[mid] != ST_DONE && ++seen > pending / 2) {
            break;
        }
    }
    if ((rc = kp__sink_flush_range(s, lo, mid, isolating)) != 0) {
        return rc;
    }
    return kp__sink_flush_range(s, mid, hi, isolating);
}

void kp__sink_reject_unsettled(struct kp_sink *s, int status, const char *why)
{
    for (size_t i = 0; i < s->n_items; i++) {
        if (s->state[i] != ST_DONE) {
            reject(s, i, status, "%s: %s", why, s->err);
        }
    }
}
