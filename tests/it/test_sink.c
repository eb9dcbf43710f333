/*
 * The PostgreSQL sink, kp_pg and the run store against a real PostgreSQL (the "pg" fixture;
 * KPROF_TEST_PG). The tests share one fresh database and use a run each, so their
 * assertions are per run.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_migrations.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "kp_testutil.h"
#include "kprof.pb-c.h"
#include "sink_pg.h"
#include "store.h"

#define SINK_APP    "kprof-collectord-sink"
#define BASE_NS     1700000000000000000LL
#define MAX_RESULTS 8192
#define MAX_RANKS   8
#define N_STRINGS   7

static char conninfo[1024];
static PGconn *db;

/* --- what the done callback saw --- */

struct result {
    uint64_t run, stream, seq;
    uint32_t rank;
    int status;
    bool duplicate;
    char err[192];
    uintptr_t tag; /* submission number */
};

static struct collector {
    pthread_mutex_t mu;
    struct result r[MAX_RESULTS];
    size_t n;
    bool out_of_order;
    uintptr_t last_tag;
} col = { .mu = PTHREAD_MUTEX_INITIALIZER };

static uintptr_t next_tag = 1;

static void done_cb(struct kp_sink_item **items, size_t n, void *ud)
{
    pthread_mutex_lock(&col.mu);
    for (size_t i = 0; i < n; i++) {
        const Kprof__V1__Batch *b = items[i]->batch;
        uintptr_t tag = (uintptr_t) items[i]->origin;

        if (col.n < MAX_RESULTS) {
            struct result *r = &col.r[col.n++];

            r->run = b->run_id;
            r->rank = b->rank;
            r->stream = b->stream;
            r->seq = b->seq;
            r->status = items[i]->status;
            r->duplicate = items[i]->duplicate;
            snprintf(r->err, sizeof(r->err), "%s", items[i]->err);
            r->tag = tag;
        }
        if (tag <= col.last_tag) {
            col.out_of_order = true;
        }
        col.last_tag = tag;
        kp_sink_item_free(items[i]);
    }
    pthread_mutex_unlock(&col.mu);
}

static void collector_reset(void)
{
    pthread_mutex_lock(&col.mu);
    col.n = 0;
    col.out_of_order = false;
    pthread_mutex_unlock(&col.mu);
}

static size_t want_results;

static bool have_results(void *arg)
{
    size_t n;

    pthread_mutex_lock(&col.mu);
    n = col.n;
    pthread_mutex_unlock(&col.mu);
    return n >= want_results;
}

static void wait_results(size_t n, int timeout_ms)
{
    want_results = n;
    if (!kp_test_wait_for(have_results, NULL, timeout_ms)) {
        fail_msg("only %zu of %zu batches came back within %d ms", col.n, n, timeout_ms);
    }
}

static const struct result *find_result(uint64_t run, uint32_t rank, uint64_t stream, uint64_t seq,
                                        size_t nth)
{
    for (size_t i = 0; i < col.n; i++) {
        const struct result *r = &col.r[i];

        if (r->run == run && r->rank == rank && r->stream == stream && r->seq == seq &&
            nth-- == 0) {
            return r;
        }
    }
    fail_msg("no result for run=%" PRIu64 " rank=%u stream=%" PRIu64 " seq=%" PRIu64, run, rank,
             stream, seq);
    return NULL;
}

/* --- batches --- */

/* What the generated batches of one (run, rank) hold, for comparing with PostgreSQL. */
struct expect {
    long long rows[KP_EV_COUNT];
    long long dur[KP_EV_COUNT];   /* sum of dur_ns (counters: 2 * value; memory: bytes) */
    long long start[KP_EV_COUNT]; /* sum of start_ns - BASE_NS */
    long long batches, records;
};

/* strings[j] of every generated batch: quotes, backslashes, braces, commas and non-ASCII
 * text exercise the array literals and COPY escaping on the way. */
static void gen_string(char *buf, size_t len, int j)
{
    static const char *const shapes[N_STRINGS] = {
        "",
        "void gemm<float, 128>(\"tile\", {a,b})",
        "aten::addmm \\ back\\slash",
        "[[32, 3, 224, 224], [64, 3, 7, 7]]",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL \xc3\xbc\xe2\x82\xac",
        "tab\there, newline\nthere",
        "NULL",
    };

    snprintf(buf, len, "%s", shapes[j]);
}

#define FILL(arr, n, expr)                 \
    do {                                   \
        for (size_t i = 0; i < (n); i++) { \
            (arr)[i] = (expr);             \
        }                                  \
    } while (0)

/*
 * Makes a batch with n rows of every kind (n + 1 kernels), heap-allocated the way ingest gets
 * it (packed and unpacked), and adds its contents to *ex. rank_info and a device come with
 * seq 0. Returns owned (protobuf_c_message_free_unpacked, or through the sink).
 */
static Kprof__V1__Batch *make_batch(uint64_t run, uint32_t rank, uint64_t stream, uint64_t seq,
                                    size_t n, struct expect *ex)
{
    Kprof__V1__Batch b = KPROF__V1__BATCH__INIT;
    Kprof__V1__Kernels k = KPROF__V1__KERNELS__INIT;
    Kprof__V1__Memcpys mc = KPROF__V1__MEMCPYS__INIT;
    Kprof__V1__Memsets ms = KPROF__V1__MEMSETS__INIT;
    Kprof__V1__ApiCalls api = KPROF__V1__API_CALLS__INIT;
    Kprof__V1__Ops op = KPROF__V1__OPS__INIT;
    Kprof__V1__Steps st = KPROF__V1__STEPS__INIT;
    Kprof__V1__Counters ct = KPROF__V1__COUNTERS__INIT;
    Kprof__V1__Collectives co = KPROF__V1__COLLECTIVES__INIT;
    Kprof__V1__Syncs sy = KPROF__V1__SYNCS__INIT;
    Kprof__V1__MemoryEvents me = KPROF__V1__MEMORY_EVENTS__INIT;
    Kprof__V1__RankInfo ri = KPROF__V1__RANK_INFO__INIT;
    Kprof__V1__Device dev = KPROF__V1__DEVICE__INIT;
    Kprof__V1__Device *devs[1] = { &dev };
    Kprof__V1__CaptureStats stats = KPROF__V1__CAPTURE_STATS__INIT;
    char sbuf[N_STRINGS][128], host[32];
    char *strings[N_STRINGS];
    size_t nk = n + 1;
    int64_t *delta = calloc(nk, sizeof(int64_t));
    uint64_t *dur = calloc(nk, sizeof(uint64_t));
    uint64_t *u64 = calloc(nk, sizeof(uint64_t));
    uint32_t *name = calloc(nk, sizeof(uint32_t));
    uint32_t *u32 = calloc(nk, sizeof(uint32_t));
    uint32_t *metric = calloc(nk, sizeof(uint32_t));
    int32_t *i32 = calloc(nk, sizeof(int32_t));
    int64_t *i64 = calloc(nk, sizeof(int64_t));
    double *dbl = calloc(nk, sizeof(double));
    int64_t *mbytes = calloc(nk, sizeof(int64_t));
    uint8_t *wire;
    size_t len;
    Kprof__V1__Batch *out;

    assert_non_null(delta);
    assert_non_null(dbl);
    assert_non_null(mbytes);
    for (int j = 0; j < N_STRINGS; j++) {
        gen_string(sbuf[j], sizeof(sbuf[j]), j);
        strings[j] = sbuf[j];
    }
    b.run_id = run;
    b.rank = rank;
    b.stream = stream;
    b.seq = seq;
    b.n_strings = N_STRINGS;
    b.strings = strings;
    b.base_ns = BASE_NS + (int64_t) seq * 1000000000LL + rank * 1000;

    /* Shared columns: start deltas 0, 101, 102, ...; dur 10 + i + seq; names cycle through
     * the table, index 0 (NULL) included. */
    for (size_t i = 0; i < nk; i++) {
        delta[i] = i == 0 ? 0 : 100 + (int64_t) i;
        dur[i] = 10 + i + seq;
        name[i] = (uint32_t) (i % N_STRINGS);
    }
    FILL(u64, nk, i);

#define EXPECT(kind, nrows)                    \
    do {                                       \
        long long s_ = 0, d_ = 0, t_ = 0;      \
        for (size_t i = 0; i < (nrows); i++) { \
            t_ += delta[i];                    \
            s_ += b.base_ns - BASE_NS + t_;    \
            d_ += (long long) dur[i];          \
        }                                      \
        ex->rows[kind] += (long long) (nrows); \
        ex->start[kind] += s_;                 \
        ex->dur[kind] += d_;                   \
    } while (0)

    k.n_start_ns = nk;
    k.start_ns = delta;
    k.n_dur_ns = nk;
    k.dur_ns = dur;
    k.n_name = nk;
    k.name = name;
    k.n_correlation = nk;
    k.correlation = u64;
    k.n_device = nk;
    FILL(u32, nk, rank % 8);
    k.device = u32;
    k.n_step = nk;
    FILL(i32, nk, (int32_t) seq);
    k.step = i32;
    b.kernels = &k;
    EXPECT(KP_EV_KERNEL, nk);

    mc.n_start_ns = n;
    mc.start_ns = delta;
    mc.n_dur_ns = n;
    mc.dur_ns = dur;
    mc.n_bytes = n;
    mc.bytes = u64;
    mc.n_copy_kind = n;
    mc.copy_kind = u32;
    b.memcpys = &mc;
    EXPECT(KP_EV_MEMCPY, n);

    ms.n_start_ns = n;
    ms.start_ns = delta;
    ms.n_dur_ns = n;
    ms.dur_ns = dur;
    ms.n_value = n;
    ms.value = u32;
    b.memsets = &ms;
    EXPECT(KP_EV_MEMSET, n);

    api.n_start_ns = n;
    api.start_ns = delta;
    api.n_dur_ns = n;
    api.dur_ns = dur;
    api.n_name = n;
    api.name = name;
    api.n_correlation = n;
    api.correlation = u64;
    api.n_return_value = n;
    api.return_value = i32;
    b.api_calls = &api;
    EXPECT(KP_EV_API, n);

    op.n_start_ns = n;
    op.start_ns = delta;
    op.n_dur_ns = n;
    op.dur_ns = dur;
    op.n_name = n;
    op.name = name;
    op.n_input_shapes = n;
    op.input_shapes = name;
    op.n_op_id = n;
    op.op_id = u64;
    op.n_seq = n;
    FILL(i64, n, -1);
    op.seq = i64;
    b.ops = &op;
    EXPECT(KP_EV_OP, n);

    st.n_step = n;
    st.step = i64;
    st.n_start_ns = n;
    st.start_ns = delta;
    st.n_dur_ns = n;
    st.dur_ns = dur;
    b.steps = &st;
    EXPECT(KP_EV_STEP, n);

    ct.n_metric = n;
    FILL(metric, n, (uint32_t) (1 + i % (N_STRINGS - 1))); /* a required name: never 0 */
    ct.metric = metric;
    ct.n_value = n;
    FILL(dbl, n, 0.5 * (double) i);
    ct.value = dbl;
    b.counters = &ct;
    ex->rows[KP_EV_COUNTER] += (long long) n;
    for (size_t i = 0; i < n; i++) {
        ex->dur[KP_EV_COUNTER] += (long long) i; /* 2 * value */
    }

    co.n_start_ns = n;
    co.start_ns = delta;
    co.n_dur_ns = n;
    co.dur_ns = dur;
    co.n_name = n;
    co.name = name;
    co.n_process_group = n;
    co.process_group = name;
    co.n_coll_seq = n;
    co.coll_seq = u64;
    b.collectives = &co;
    EXPECT(KP_EV_COLLECTIVE, n);

    sy.n_start_ns = n;
    sy.start_ns = delta;
    sy.n_dur_ns = n;
    sy.dur_ns = dur;
    sy.n_cuda_event = n;
    sy.cuda_event = u32;
    b.syncs = &sy;
    EXPECT(KP_EV_SYNC, n);

    /* Allocator events: allocations and frees alternate (bytes +-512 (i + 1)). */
    me.n_start_ns = n;
    me.start_ns = delta;
    me.n_name = n;
    me.name = name;
    me.n_device_type = n;
    me.device_type = u32;
    me.n_device = n;
    me.device = i32;
    me.n_bytes = n;
    FILL(mbytes, n, (i % 2 ? -512 : 512) * (int64_t) (i + 1));
    me.bytes = mbytes;
    me.n_total_allocated = n;
    me.total_allocated = u64;
    b.memory = &me;
    {
        long long d0 = ex->dur[KP_EV_MEMORY];

        EXPECT(KP_EV_MEMORY, n);
        ex->dur[KP_EV_MEMORY] = d0; /* no dur_ns: the sum of bytes stands in */
        for (size_t i = 0; i < n; i++) {
            ex->dur[KP_EV_MEMORY] += mbytes[i];
        }
    }
#undef EXPECT

    if (seq == 0) {
        snprintf(host, sizeof(host), "host-%u", rank);
        ri.job = "job \"quoted\"";
        ri.host = host;
        ri.pid = 1000 + rank;
        ri.local_rank = rank % 4;
        ri.world_size = 8;
        ri.device = (int32_t) (rank % 8);
        ri.clock_offset_ns = -5 * (int64_t) rank;
        b.rank_info = &ri;
        dev.id = rank % 8;
        dev.name = "NVIDIA H100 80GB HBM3";
        dev.sm_count = 132;
        dev.cc_major = 9;
        dev.cc_minor = 0;
        dev.global_memory_bytes = 85520809984ULL;
        dev.warp_size = 32;
        b.n_devices = 1;
        b.devices = devs;
    }
    stats.records_dropped = 1;
    stats.cupti_dropped = 2;
    stats.overhead_ns = 3;
    b.stats = &stats;

    ex->batches++;
    ex->records += (long long) kp_batch_total_rows(&b);

    len = protobuf_c_message_get_packed_size(&b.base);
    wire = malloc(len);
    assert_non_null(wire);
    protobuf_c_message_pack(&b.base, wire);
    out = kprof__v1__batch__unpack(NULL, len, wire);
    assert_non_null(out);
    free(wire);
    free(delta);
    free(dur);
    free(u64);
    free(name);
    free(u32);
    free(metric);
    free(i32);
    free(i64);
    free(dbl);
    free(mbytes);
    {
        char err[256];
        struct kp_batch_limits lim = { KP_CODEC_DEFAULT_MAX_NAME_BYTES,
                                       KP_CODEC_DEFAULT_MAX_STRINGS, KP_CODEC_DEFAULT_MAX_ROWS };

        if (kp_batch_validate(out, &lim, err, sizeof(err)) != 0) {
            fail_msg("generated batch is invalid: %s", err);
        }
    }
    return out;
}

static void submit(struct kp_sink *s, Kprof__V1__Batch *b)
{
    struct kp_sink_item *it = calloc(1, sizeof(*it));

    assert_non_null(it);
    it->batch = b;
    it->wire_bytes = protobuf_c_message_get_packed_size(&b->base);
    it->rows = kp_batch_total_rows(b);
    it->origin = (void *) next_tag++;
    kp_sink_submit(s, it);
}

static struct kp_sink *sink_open(size_t flush_max_rows, long long interval_ms)
{
    struct kp_sink_config cfg = {
        .conninfo = conninfo,
        .queue_max_bytes = 64u << 20,
        .flush_max_rows = flush_max_rows,
        .flush_interval_ms = interval_ms,
        .retry_max_ms = 200,
    };
    struct kp_sink *s = NULL;
    char err[512] = "";

    if (kp_sink_create(&cfg, done_cb, NULL, &s, err, sizeof(err)) != 0) {
        fail_msg("kp_sink_create: %s", err);
    }
    assert_true(kp_sink_ready(s));
    collector_reset();
    return s;
}

static uint64_t create_run(const char *job, uint32_t world_size)
{
    Kprof__V1__Run run = KPROF__V1__RUN__INIT;
    char err[512] = "";
    uint64_t id;

    if (kp_store_create_run(db, job, "test", world_size,
                            KPROF__V1__RUN_SOURCE__RUN_SOURCE_SYNTHETIC, &run, err,
                            sizeof(err)) != 0) {
        fail_msg("create run: %s", err);
    }
    id = run.id;
    kp_store_run_fini(&run);
    return id;
}

/* Compares PostgreSQL's rows of (run, rank) with what was sent. */
static void check_rank(uint64_t run, uint32_t rank, const struct expect *ex)
{
    for (int k = 0; k < KP_EV_COUNT; k++) {
        const char *t = kp_event_kinds[k].table;
        long long rows = kp_test_pg_int(
            db, "SELECT count(*) FROM %s WHERE run_id = %" PRIu64 " AND rank = %u", t, run, rank);

        if (rows != ex->rows[k]) {
            fail_msg("%s run=%" PRIu64 " rank=%u: %lld rows, sent %lld", t, run, rank, rows,
                     ex->rows[k]);
        }
        if (k == KP_EV_MEMORY) {
            assert_int_equal(kp_test_pg_int(db,
                                            "SELECT coalesce(sum(bytes), 0)::bigint FROM "
                                            "memory_events WHERE run_id = %" PRIu64
                                            " AND rank = %u",
                                            run, rank),
                             ex->dur[k]);
        }
        else if (k == KP_EV_COUNTER) {
            assert_int_equal(kp_test_pg_int(db,
                                            "SELECT coalesce(sum(value * 2), 0)::bigint FROM "
                                            "counters WHERE run_id = %" PRIu64 " AND rank = %u",
                                            run, rank),
                             ex->dur[k]);
            continue;
        }
        else {
            assert_int_equal(kp_test_pg_int(db,
                                            "SELECT coalesce(sum(dur_ns), 0)::bigint FROM %s "
                                            "WHERE run_id = %" PRIu64 " AND rank = %u",
                                            t, run, rank),
                             ex->dur[k]);
        }
        assert_int_equal(kp_test_pg_int(db,
                                        "SELECT coalesce(sum(start_ns - %lld), 0)::bigint FROM %s "
                                        "WHERE run_id = %" PRIu64 " AND rank = %u",
                                        BASE_NS, t, run, rank),
                         ex->start[k]);
    }
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM ingest_batches WHERE run_id = %" PRIu64
                                    " AND rank = %u",
                                    run, rank),
                     ex->batches);
    assert_int_equal(
        kp_test_pg_int(db, "SELECT batches FROM ranks WHERE run_id = %" PRIu64 " AND rank = %u",
                       run, rank),
        ex->batches);
    assert_int_equal(
        kp_test_pg_int(db, "SELECT records FROM ranks WHERE run_id = %" PRIu64 " AND rank = %u",
                       run, rank),
        ex->records);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT records_dropped + 10 * cupti_dropped + 100 * "
                                    "overhead_ns FROM ranks WHERE run_id = %" PRIu64
                                    " AND rank = %u",
                                    run, rank),
                     321 * ex->batches);
}

/* Every kernel's name, row by row, is the text its index named. */
static void check_names(uint64_t run, uint32_t rank)
{
    char want[128];
    PGresult *res;
    char sql[256];

    snprintf(sql, sizeof(sql),
             "SELECT k.correlation, k.name IS NULL, n.name FROM kernels k "
             "LEFT JOIN names n ON n.id = k.name WHERE k.run_id = %" PRIu64 " AND k.rank = %u",
             run, rank);
    res = PQexec(db, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    assert_true(PQntuples(res) > 0);
    for (int r = 0; r < PQntuples(res); r++) {
        long long corr = strtoll(PQgetvalue(res, r, 0), NULL, 10);
        int idx = (int) (corr % N_STRINGS);

        if (idx == 0) {
            assert_string_equal(PQgetvalue(res, r, 1), "t");
            continue;
        }
        gen_string(want, sizeof(want), idx);
        assert_string_equal(PQgetvalue(res, r, 1), "f");
        assert_string_equal(PQgetvalue(res, r, 2), want);
    }
    PQclear(res);
}

/* --- setup --- */

static void need_db(void)
{
    char err[512];

    if (db != NULL) {
        return;
    }
    kp_test_pg_fresh_db("kprof_test_sink", conninfo, sizeof(conninfo));
    if (kp_pg_connect(conninfo, "kprof-test", &db, err, sizeof(err)) != 0) {
        fail_msg("connect: %s", err);
    }
    if (kp_pg_migrate(db, err, sizeof(err)) < 0) {
        fail_msg("migrate: %s", err);
    }
}

static int group_teardown(void **state)
{
    if (db != NULL) {
        PQfinish(db);
        db = NULL;
    }
    return 0;
}

/* --- tests --- */

static const char *sql_type(enum kp_col_sql t)
{
    switch (t) {
    case KP_SQL_INT2:
        return "smallint";
    case KP_SQL_INT4:
        return "integer";
    case KP_SQL_INT8:
        return "bigint";
    case KP_SQL_FLOAT8:
        return "double precision";
    }
    return "?";
}

/* How many event kinds have a side table (kp_side_spec). */
static int n_side_tables(void)
{
    int n = 0;

    for (int k = 0; k < KP_EV_COUNT; k++) {
        n += kp_event_kinds[k].side != NULL;
    }
    return n;
}

/* (a) Every event table (the one rows are written to) has exactly run_id, rank and the codec's
 * columns, typed alike; where readers name another relation (kernels, a view over kernel_rows
 * and kernel_chunks), it has the same columns in the same order. */
static void test_schema_matches_codec(void **state)
{
    need_db();
    for (int k = 0; k < KP_EV_COUNT; k++) {
        const struct kp_event_kind_info *ki = &kp_event_kinds[k];
        long long n = kp_test_pg_int(db,
                                     "SELECT count(*) FROM information_schema.columns WHERE "
                                     "table_schema = current_schema() AND table_name = '%s'",
                                     ki->store);

        long long n_side =
            ki->side == NULL
                ? 0
                : kp_test_pg_int(db,
                                 "SELECT count(*) FROM information_schema.columns WHERE "
                                 "table_schema = current_schema() AND table_name = '%s' AND "
                                 "column_name <> ALL ('{run_id,rank,%s,%s,%s,%s}')",
                                 ki->side->table, ki->side->key[0], ki->side->key[1],
                                 ki->side->key[2], ki->side->key[3]);

        /* The side table's values are not in the kind's table; its key columns are in both. */
        if (n + n_side != (long long) ki->n_columns + 2) {
            fail_msg("table %s has %lld columns and its side table %lld values; the codec has "
                     "%zu + run_id, rank",
                     ki->store, n, n_side, ki->n_columns);
        }
        assert_int_equal(kp_test_pg_int(db,
                                        "SELECT count(*) FROM information_schema.columns WHERE "
                                        "table_schema = current_schema() AND table_name = '%s' "
                                        "AND column_name IN ('run_id', 'rank') "
                                        "AND data_type = 'integer' AND is_nullable = 'NO'",
                                        ki->store),
                         2);
        if (strcmp(ki->table, ki->store) != 0 &&
            kp_test_pg_int(db,
                           "SELECT ((SELECT string_agg(column_name || ' ' || data_type, ', ' "
                           "ORDER BY ordinal_position) FROM information_schema.columns WHERE "
                           "table_schema = current_schema() AND table_name = '%s') IS DISTINCT "
                           "FROM (SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER "
                           "BY ordinal_position) FROM information_schema.columns WHERE "
                           "table_schema = current_schema() AND table_name = '%s'))::int",
                           ki->table, ki->store) != 0) {
            fail_msg("%s has other columns than %s, or in another order", ki->table, ki->store);
        }
        for (size_t c = 0; c < ki->n_columns; c++) {
            const struct kp_column_spec *cs = &ki->columns[c];
            bool in_side = false;
            long long ok;

            for (size_t j = 0; ki->side != NULL && j < KP_SIDE_MAX_VALUES; j++) {
                in_side |=
                    ki->side->values[j] != NULL && strcmp(ki->side->values[j], cs->name) == 0;
            }
            for (size_t j = 0; ki->side != NULL && j < KP_SIDE_MAX_KEY; j++) {
                /* A side table's key and values: NOT NULL there (absent is 0, or NaN). */
                if (ki->side->key[j] != NULL && strcmp(ki->side->key[j], cs->name) == 0 &&
                    kp_test_pg_int(db,
                                   "SELECT count(*) FROM information_schema.columns WHERE "
                                   "table_schema = current_schema() AND table_name = '%s' AND "
                                   "column_name = '%s' AND data_type = '%s' AND "
                                   "is_nullable = 'NO'",
                                   ki->side->table, cs->name, sql_type(cs->sql)) != 1) {
                    fail_msg("%s.%s: no NOT NULL %s column", ki->side->table, cs->name,
                             sql_type(cs->sql));
                }
            }
            ok = kp_test_pg_int(
                db,
                "SELECT count(*) FROM information_schema.columns WHERE "
                "table_schema = current_schema() AND table_name = '%s' AND column_name = '%s' "
                "AND data_type = '%s' AND (is_nullable = 'YES') = %s",
                in_side ? ki->side->table : ki->store, cs->name, sql_type(cs->sql),
                cs->required || in_side ? "false" : "true");

            if (ok != 1) {
                fail_msg("%s.%s: no %s %s column", in_side ? ki->side->table : ki->store, cs->name,
                         sql_type(cs->sql), cs->required || in_side ? "NOT NULL" : "nullable");
            }
        }
    }
}

struct migrator {
    const char *conninfo;
    pthread_t thread;
    int rc;
    char err[512];
};

static void *migrate_main(void *arg)
{
    struct migrator *m = arg;
    PGconn *c = NULL;

    m->rc = kp_pg_connect(m->conninfo, "kprof-test-migrate", &c, m->err, sizeof(m->err));
    if (m->rc == 0) {
        m->rc = kp_pg_migrate(c, m->err, sizeof(m->err));
        PQfinish(c);
    }
    return NULL;
}

/* Migrations are recorded, idempotent, serialised, and refuse a newer schema. */
static void test_migrate(void **state)
{
    char ci[1024], err[512] = "";
    PGconn *c = NULL;
    int rc;

    need_db();
    assert_int_equal(kp_test_pg_int(db, "SELECT max(version) FROM kp_schema_migrations"),
                     kp_pg_schema_version());
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM kp_schema_migrations"),
                     (long long) kp_migrations_count);
    assert_int_equal(kp_pg_migrate(db, err, sizeof(err)), 0);

    kp_test_pg_exec(db, "INSERT INTO kp_schema_migrations (version, name) VALUES (%d, 'future')",
                    kp_pg_schema_version() + 1);
    rc = kp_pg_migrate(db, err, sizeof(err));
    kp_test_pg_exec(db, "DELETE FROM kp_schema_migrations WHERE name = 'future'");
    assert_int_equal(rc, KP_ESCHEMA);
    assert_non_null(strstr(err, "upgrade kprof"));
    assert_int_equal(PQtransactionStatus(db), PQTRANS_IDLE);

    /* A fresh database, migrated by four processes' worth of connections at once: the
     * advisory lock lets each migration run once. */
    kp_test_pg_fresh_db("kprof_test_migrate", ci, sizeof(ci));
    {
        struct migrator m[4];
        int applied = 0;

        for (int i = 0; i < 4; i++) {
            m[i].conninfo = ci;
            assert_int_equal(pthread_create(&m[i].thread, NULL, migrate_main, &m[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(m[i].thread, NULL);
            if (m[i].rc < 0) {
                fail_msg("migrator %d: %s", i, m[i].err);
            }
            applied += m[i].rc;
        }
        assert_int_equal(applied, (int) kp_migrations_count);
    }
    assert_int_equal(kp_pg_connect(ci, "kprof-test", &c, err, sizeof(err)), 0);
    assert_int_equal(kp_test_pg_int(c, "SELECT count(*) FROM kp_schema_migrations"),
                     (long long) kp_migrations_count);
    assert_int_equal(kp_test_pg_int(c, "SELECT count(*) FROM pg_tables WHERE tablename = 'runs'"),
                     1);
    PQfinish(c);
}

/* kp_pg tells a lost connection from a statement error. */
static void test_pg_faults(void **state)
{
    PGconn *c = NULL;
    PGresult *res = NULL;
    char err[512] = "";
    const char *p[1] = { "1" };

    need_db();
    assert_int_equal(kp_pg_connect(conninfo, "kprof-test-faults", &c, err, sizeof(err)), 0);
    assert_int_equal(kp_pg_exec(c, "SELECT 1/0", err, sizeof(err)), KP_EPG);
    assert_non_null(strstr(err, "division by zero"));
    assert_non_null(strstr(err, "22012"));
    assert_int_equal(kp_pg_last_fault(c), KP_PG_FAULT_STATEMENT);
    assert_false(kp_pg_conn_lost(c));
    assert_int_equal(kp_pg_query(c, "SELECT $1::int + 1", 1, p, &res, err, sizeof(err)), 0);
    assert_string_equal(PQgetvalue(res, 0, 0), "2");
    PQclear(res);
    assert_int_equal(kp_pg_last_fault(c), KP_PG_FAULT_NONE);

    assert_int_equal(kp_test_pg_int(db, "SELECT count(pg_terminate_backend(pid)) FROM "
                                        "pg_stat_activity WHERE application_name = "
                                        "'kprof-test-faults'"),
                     1);
    assert_int_equal(kp_pg_exec(c, "SELECT 1", err, sizeof(err)), KP_EPG);
    assert_true(kp_pg_conn_lost(c));
    PQfinish(c);

    assert_int_equal(kp_pg_classify_sqlstate("57P01"), KP_PG_FAULT_CONN);
    assert_int_equal(kp_pg_classify_sqlstate("08006"), KP_PG_FAULT_CONN);
    assert_int_equal(kp_pg_classify_sqlstate("40P01"), KP_PG_FAULT_TRANSIENT);
    assert_int_equal(kp_pg_classify_sqlstate("23505"), KP_PG_FAULT_STATEMENT);

    assert_int_equal(kp_pg_connect("host=/nonexistent/dir port=1", "x", &c, err, sizeof(err)),
                     KP_EPG);
    assert_int_equal(kp_pg_connect("this is = not a conninfo '", "x", &c, err, sizeof(err)),
                     KP_ECONFIG);

    /* COPY round trip through the helper, and a refused row. */
    kp_test_pg_exec(db, "CREATE TABLE IF NOT EXISTS copy_t (a int, b text)");
    assert_int_equal(kp_pg_connect(conninfo, "kprof-test-copy", &c, err, sizeof(err)), 0);
    assert_int_equal(kp_pg_copy_in(c, "copy_t", "a, b", "1\tx\n2\t\\N\n", 9, err, sizeof(err)), 2);
    assert_int_equal(kp_pg_copy_in(c, "copy_t", "a, b", "zz\tx\n", 5, err, sizeof(err)), KP_EPG);
    assert_int_equal(kp_pg_last_fault(c), KP_PG_FAULT_STATEMENT);
    assert_non_null(strstr(err, "22P02"));
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM copy_t WHERE b IS NULL"), 1);
    PQfinish(c);
}

/* (b) Several ranks' batches of every kind arrive exactly as sent. */
static void test_rows_exact(void **state)
{
    struct expect ex[4];
    struct kp_sink *s;
    struct kp_sink_stats st;
    uint64_t run;
    size_t n = 0;

    need_db();
    memset(ex, 0, sizeof(ex));
    run = create_run("job-b", 4);
    s = sink_open(400, 10); /* several flushes */
    for (uint64_t seq = 0; seq < 5; seq++) {
        for (uint32_t rank = 0; rank < 4; rank++) {
            submit(s, make_batch(run, rank, 1, seq, 20 + rank, &ex[rank]));
            n++;
        }
    }
    wait_results(n, 30000);
    for (size_t i = 0; i < n; i++) {
        if (col.r[i].status != 0 || col.r[i].duplicate) {
            fail_msg("batch %zu: status=%d duplicate=%d err=%s", i, col.r[i].status,
                     (int) col.r[i].duplicate, col.r[i].err);
        }
    }
    assert_false(col.out_of_order);
    kp_sink_get_stats(s, &st);
    assert_int_equal(st.batches_committed, n);
    assert_int_equal(st.batches_duplicate, 0);
    assert_int_equal(st.queued_items, 0);
    assert_int_equal(st.queued_bytes, 0);
    assert_true(st.flushes > 1);
    kp_sink_destroy(s, 1000);

    for (uint32_t rank = 0; rank < 4; rank++) {
        check_rank(run, rank, &ex[rank]);
        check_names(run, rank);
    }
    /* Columns never sent are NULL; sent ones are not. */
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM kernels WHERE run_id = %" PRIu64
                                    " AND (grid_x IS NOT NULL OR block_x IS NOT NULL OR "
                                    "external_id IS NOT NULL OR graph_node_id IS NOT NULL)",
                                    run),
                     0);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM kernels WHERE run_id = %" PRIu64
                                    " AND (device IS NULL OR step IS NULL OR correlation IS NULL)",
                                    run),
                     0);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM ops WHERE run_id = %" PRIu64
                                    " AND (seq <> -1 OR kind IS NOT NULL OR tid IS NOT NULL)",
                                    run),
                     0);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM ops o JOIN names n ON "
                                    "n.id = o.input_shapes WHERE o.run_id = %" PRIu64
                                    " AND n.name = '[[32, 3, 224, 224], [64, 3, 7, 7]]'",
                                    run),
                     kp_test_pg_int(db,
                                    "SELECT count(*) FROM ops WHERE run_id = %" PRIu64
                                    " AND op_id %% %d = 3",
                                    run, N_STRINGS));
    /* rank_info and devices */
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM ranks WHERE run_id = %" PRIu64
                                    " AND job = 'job \"quoted\"' AND host = 'host-' || rank "
                                    "AND pid = 1000 + rank AND local_rank = rank %% 4 AND "
                                    "device = rank %% 8 AND clock_offset_ns = -5 * rank",
                                    run),
                     4);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM devices WHERE run_id = %" PRIu64
                                    " AND id = rank %% 8 AND name = 'NVIDIA H100 80GB HBM3' "
                                    "AND sm_count = 132 AND cc_major = 9 AND cc_minor = 0 "
                                    "AND warp_size = 32 AND clock_khz IS NULL",
                                    run),
                     4);
}

/* (c) A repeated key is stored once: within one flush and across flushes. */
static void test_duplicates(void **state)
{
    struct expect ex = { 0 }, ex2 = { 0 }, ex3 = { 0 };
    struct kp_sink_stats before, after;
    struct kp_sink *s;
    uint64_t run;

    need_db();
    run = create_run("job-c", 2);
    s = sink_open(100000, 300); /* a long interval: the first three land in one flush */
    kp_sink_get_stats(s, &before);
    submit(s, make_batch(run, 0, 9, 0, 10, &ex));
    submit(s, make_batch(run, 0, 9, 0, 10, &ex2));
    submit(s, make_batch(run, 0, 9, 1, 10, &ex));
    wait_results(3, 10000);
    kp_sink_get_stats(s, &after);
    assert_int_equal(after.flushes - before.flushes, 1);
    assert_int_equal(find_result(run, 0, 9, 0, 0)->status, 0);
    assert_false(find_result(run, 0, 9, 0, 0)->duplicate);
    assert_int_equal(find_result(run, 0, 9, 0, 1)->status, 0);
    assert_true(find_result(run, 0, 9, 0, 1)->duplicate);
    assert_false(find_result(run, 0, 9, 1, 0)->duplicate);
    assert_false(col.out_of_order);

    /* Across flushes. */
    submit(s, make_batch(run, 0, 9, 1, 10, &ex3));
    wait_results(4, 10000);
    assert_int_equal(find_result(run, 0, 9, 1, 1)->status, 0);
    assert_true(find_result(run, 0, 9, 1, 1)->duplicate);
    kp_sink_get_stats(s, &after);
    assert_int_equal(after.batches_committed - before.batches_committed, 2);
    assert_int_equal(after.batches_duplicate - before.batches_duplicate, 2);
    kp_sink_destroy(s, 1000);
    check_rank(run, 0, &ex);
}

/* (d) Unknown runs and ranks are rejected; the rest of the flush commits. A batch PostgreSQL
 * refuses (here: an unvalidated one) is isolated and rejected with the server's reason. */
static void test_rejections(void **state)
{
    struct expect ex = { 0 }, junk = { 0 };
    struct kp_sink *s;
    Kprof__V1__Batch *bad;
    struct kp_sink_stats st;
    uint64_t run;
    char want[192];

    need_db();
    run = create_run("job-d", 2);
    s = sink_open(100000, 200);
    submit(s, make_batch(run, 0, 1, 0, 10, &ex));
    submit(s, make_batch(999999, 0, 1, 0, 10, &junk));
    submit(s, make_batch(run, 9, 1, 0, 10, &junk));
    /* metric index 0 is NULL in a NOT NULL column: COPY fails for this batch only. */
    bad = make_batch(run, 1, 1, 7, 10, &junk);
    bad->counters->metric[0] = 0;
    submit(s, bad);
    submit(s, make_batch(run, 0, 1, 1, 10, &ex));
    wait_results(5, 20000);
    assert_false(col.out_of_order);

    assert_int_equal(find_result(run, 0, 1, 0, 0)->status, 0);
    assert_int_equal(find_result(run, 0, 1, 1, 0)->status, 0);
    assert_int_equal(find_result(999999, 0, 1, 0, 0)->status, KP_ENOTFOUND);
    assert_string_equal(find_result(999999, 0, 1, 0, 0)->err,
                        "run 999999 does not exist; create it with Control.CreateRun "
                        "(kprofctl start / import)");
    assert_int_equal(find_result(run, 9, 1, 0, 0)->status, KP_EPROTO);
    snprintf(want, sizeof(want), "rank 9 is outside run %" PRIu64 "'s world size 2", run);
    assert_string_equal(find_result(run, 9, 1, 0, 0)->err, want);
    assert_int_equal(find_result(run, 1, 1, 7, 0)->status, KP_EPROTO);
    assert_non_null(strstr(find_result(run, 1, 1, 7, 0)->err, "23502"));

    kp_sink_get_stats(s, &st);
    assert_int_equal(st.batches_rejected, 3);
    assert_true(st.flush_failures >= 1);
    kp_sink_destroy(s, 1000);

    check_rank(run, 0, &ex);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM ingest_batches WHERE run_id = %" PRIu64
                                    " AND rank <> 0",
                                    run),
                     0);
    assert_int_equal(
        kp_test_pg_int(db, "SELECT count(*) FROM counters WHERE run_id = %" PRIu64 " AND rank = 1",
                       run),
        0);
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM ranks WHERE run_id = %" PRIu64, run),
                     1);
}

static long long kill_sink_backend(void)
{
    return kp_test_pg_int(db, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                              "application_name = '" SINK_APP "' AND datname = current_database()");
}

static struct kp_sink *cond_sink;

static bool sink_reconnected(void *arg)
{
    struct kp_sink_stats st;

    kp_sink_get_stats(cond_sink, &st);
    return st.flush_failures > (uint64_t) (uintptr_t) arg && kp_sink_ready(cond_sink) &&
           kp_test_pg_int(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                              "'" SINK_APP "' AND datname = current_database()") == 1;
}

/* (e) The sink's connection is killed mid-stream, repeatedly: it reconnects and every batch
 * ends up stored exactly once. */
static void test_connection_killed(void **state)
{
    struct expect ex[2];
    struct kp_sink *s;
    struct kp_sink_stats st;
    uint64_t run;
    const size_t n = 240;
    long long kills = 0;

    need_db();
    memset(ex, 0, sizeof(ex));
    run = create_run("job-e", 2);
    s = sink_open(300, 2);
    cond_sink = s;
    for (size_t i = 0; i < n; i++) {
        bool kill_point = i > 0 && i % 40 == 0;

        if (kill_point) {
            kp_sink_get_stats(s, &st);
            kills += kill_sink_backend(); /* often mid-flush: submissions never stop */
        }
        submit(s, make_batch(run, (uint32_t) (i % 2), 5, i / 2, 15, &ex[i % 2]));
        if (kill_point &&
            !kp_test_wait_for(sink_reconnected, (void *) (uintptr_t) st.flush_failures, 20000)) {
            kp_sink_get_stats(s, &st);
            fail_msg("the sink did not reconnect (flush_failures=%" PRIu64 ")", st.flush_failures);
        }
    }
    wait_results(n, 60000);
    for (size_t i = 0; i < n; i++) {
        if (col.r[i].status != 0) {
            fail_msg("batch %zu: status=%d err=%s", i, col.r[i].status, col.r[i].err);
        }
    }
    assert_false(col.out_of_order);
    kp_sink_get_stats(s, &st);
    assert_true(kills >= 3);
    assert_true(st.flush_failures >= 3);
    assert_int_equal(st.batches_committed + st.batches_duplicate, n);
    kp_sink_destroy(s, 1000);
    check_rank(run, 0, &ex[0]);
    check_rank(run, 1, &ex[1]);
}

/* PostgreSQL unreachable at destroy: what is queued comes back KP_ESHUTDOWN in time. */
static void test_destroy_gives_up(void **state)
{
    struct expect ex = { 0 };
    struct kp_sink *s;
    uint64_t run;
    double t0;
    double secs;

    need_db();
    run = create_run("job-g", 1);
    s = sink_open(100000, 100000); /* nothing flushes until destroy */
    submit(s, make_batch(run, 0, 1, 0, 5, &ex));
    /* Make every flush fail: the sink's role loses its rights on the tables for a moment. */
    kp_test_pg_exec(db, "ALTER DATABASE kprof_test_sink SET default_transaction_read_only = on");
    kill_sink_backend();
    t0 = kp_mono_s();
    kp_sink_destroy(s, 500);
    secs = kp_mono_s() - t0;
    kp_test_pg_exec(db, "ALTER DATABASE kprof_test_sink RESET default_transaction_read_only");
    assert_true(secs < 10.0);
    assert_int_equal(col.n, 1);
    assert_int_equal(col.r[0].status, KP_ESHUTDOWN);
    assert_int_equal(
        kp_test_pg_int(db, "SELECT count(*) FROM ingest_batches WHERE run_id = %" PRIu64, run), 0);
}

/* A flush that hangs (here: waiting for a lock) past the drain deadline is cancelled. */
static void test_destroy_cancels_hung_flush(void **state)
{
    struct expect ex = { 0 };
    struct kp_sink *s;
    uint64_t run;
    double t0;
    double secs;

    need_db();
    run = create_run("job-i", 1);
    s = sink_open(100000, 100000);
    submit(s, make_batch(run, 0, 1, 0, 5, &ex));
    kp_test_pg_exec(db, "BEGIN");
    kp_test_pg_exec(db, "LOCK TABLE kernel_rows IN ACCESS EXCLUSIVE MODE");
    t0 = kp_mono_s();
    kp_sink_destroy(s, 300);
    secs = kp_mono_s() - t0;
    kp_test_pg_exec(db, "ROLLBACK");
    if (secs > 10.0) {
        fail_msg("destroy took %.1f s", secs);
    }
    assert_int_equal(col.n, 1);
    assert_int_equal(col.r[0].status, KP_ESHUTDOWN);
    assert_non_null(strstr(col.r[0].err, "57014"));
}

/* (f) Runs: create, list, end; kp_drop_run removes the partitions. */
static void test_store(void **state)
{
    Kprof__V1__Run run = KPROF__V1__RUN__INIT, ended = KPROF__V1__RUN__INIT;
    Kprof__V1__ListRunsResponse list = KPROF__V1__LIST_RUNS_RESPONSE__INIT;
    struct expect ex = { 0 };
    struct kp_sink *s;
    char err[512] = "";
    long long now_ns = kp_real_ns();
    uint64_t id;

    need_db();

    assert_int_equal(kp_store_create_run(db, "", "x", 8, 1, &run, err, sizeof(err)), KP_EPROTO);
    assert_int_equal(kp_store_create_run(db, "job-f", "x", 0, 1, &run, err, sizeof(err)),
                     KP_EPROTO);
    assert_int_equal(
        kp_store_create_run(db, "job-f", "x", (1u << 20) + 1, 1, &run, err, sizeof(err)),
        KP_EPROTO);
    assert_int_equal(kp_store_create_run(db, "job-f", "x", 8, 9, &run, err, sizeof(err)),
                     KP_EPROTO);

    assert_int_equal(kp_store_create_run(db, "job-f", "first capture", 8,
                                         KPROF__V1__RUN_SOURCE__RUN_SOURCE_IMPORT, &run, err,
                                         sizeof(err)),
                     0);
    id = run.id;
    assert_true(id > 0);
    assert_string_equal(run.job, "job-f");
    assert_string_equal(run.name, "first capture");
    assert_int_equal(run.state, KPROF__V1__RUN_STATE__RUN_STATE_OPEN);
    assert_int_equal(run.source, KPROF__V1__RUN_SOURCE__RUN_SOURCE_IMPORT);
    assert_int_equal(run.world_size, 8);
    assert_true(run.created_ns > now_ns - 60000000000LL && run.created_ns < now_ns + 60000000000LL);
    assert_int_equal(run.ended_ns, 0);
    assert_int_equal(run.batches, 0);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM kp_run_tables t WHERE "
                                    "to_regclass(t.name || '_r%" PRIu64 "') IS NOT NULL",
                                    id),
                     KP_EV_COUNT + 2 + n_side_tables()); /* the event tables, their side
                                                          * tables, ingest_batches and
                                                          * kernel_chunks */

    s = sink_open(100000, 5);
    for (uint64_t seq = 0; seq < 3; seq++) {
        submit(s, make_batch(id, 2, 1, seq, 4, &ex));
    }
    wait_results(3, 10000);
    kp_sink_destroy(s, 1000);

    assert_int_equal(kp_store_list_runs(db, "job-f", 0, &list, err, sizeof(err)), 0);
    assert_int_equal(list.n_runs, 1);
    assert_int_equal(list.runs[0]->id, id);
    assert_int_equal(list.runs[0]->batches, 3);
    assert_string_equal(list.runs[0]->name, "first capture");
    kp_store_list_fini(&list);
    assert_int_equal(kp_store_list_runs(db, "", 2, &list, err, sizeof(err)), 0);
    assert_int_equal(list.n_runs, 2);
    assert_int_equal(list.runs[0]->id, id); /* newest first */
    assert_true(list.runs[1]->id < id);
    kp_store_list_fini(&list);
    assert_int_equal(kp_store_list_runs(db, "no-such-job", 0, &list, err, sizeof(err)), 0);
    assert_int_equal(list.n_runs, 0);
    kp_store_list_fini(&list);

    assert_int_equal(kp_store_end_run(db, id, false, &ended, err, sizeof(err)), 0);
    assert_int_equal(ended.state, KPROF__V1__RUN_STATE__RUN_STATE_ENDED);
    assert_true(ended.ended_ns >= ended.created_ns);
    assert_int_equal(ended.created_ns, run.created_ns);
    assert_int_equal(ended.batches, 3);
    {
        Kprof__V1__Run again = KPROF__V1__RUN__INIT;

        assert_int_equal(kp_store_end_run(db, id, true, &again, err, sizeof(err)), 0);
        assert_int_equal(again.state, KPROF__V1__RUN_STATE__RUN_STATE_ENDED);
        assert_int_equal(again.ended_ns, ended.ended_ns);
        kp_store_run_fini(&again);
    }
    assert_int_equal(kp_store_end_run(db, 999999, false, &ended, err, sizeof(err)), KP_ENOTFOUND);
    assert_int_equal(kp_store_end_run(db, 0, false, &ended, err, sizeof(err)), KP_ENOTFOUND);

    kp_test_pg_exec(db, "SELECT kp_drop_run(%" PRIu64 ")", id);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM kp_run_tables t WHERE "
                                    "to_regclass(t.name || '_r%" PRIu64 "') IS NOT NULL",
                                    id),
                     0);
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM runs WHERE id = %" PRIu64, id), 0);
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM ranks WHERE run_id = %" PRIu64, id),
                     0);
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM devices WHERE run_id = %" PRIu64, id),
                     0);
    kp_store_run_fini(&run);
    kp_store_run_fini(&ended);
}

/* A run dropped while the sink has it cached: its batches come back KP_ENOTFOUND. */
static void test_dropped_run(void **state)
{
    struct expect ex = { 0 };
    struct kp_sink *s;
    uint64_t run;

    need_db();
    run = create_run("job-h", 1);
    s = sink_open(100000, 5);
    submit(s, make_batch(run, 0, 1, 0, 4, &ex));
    wait_results(1, 10000);
    assert_int_equal(col.r[0].status, 0);
    kp_test_pg_exec(db, "SELECT kp_drop_run(%" PRIu64 ")", run);
    submit(s, make_batch(run, 0, 1, 1, 4, &ex));
    wait_results(2, 10000);
    assert_int_equal(col.r[1].status, KP_ENOTFOUND);
    kp_sink_destroy(s, 1000);
}

/* Unpacks a copy of b as ingest would hand it to the sink (owned). */
static Kprof__V1__Batch *wire_copy(const Kprof__V1__Batch *b)
{
    size_t len = protobuf_c_message_get_packed_size(&b->base);
    uint8_t *wire = malloc(len);
    Kprof__V1__Batch *out;

    assert_non_null(wire);
    protobuf_c_message_pack(&b->base, wire);
    out = kprof__v1__batch__unpack(NULL, len, wire);
    assert_non_null(out);
    free(wire);
    return out;
}

/* Allocator events are stored exactly, every column, extremes and NULLs included. */
static void test_memory_rows_exact(void **state)
{
    static const char *const want[] = {
        "0|[memory]|1|0|139637976727552|1048576|1048576|2097152|4242|3",
        "2|[OutOfMemory]|1|7|0|85899345920|9223372036854775807|9223372036854775807|0|-1",
        "3|NULL|0|-1|9223372036854775807|-9223372036854775808|0|0|9223372036854775807|"
        "-2147483648",
        "5|[memory]|1|0|139637976727552|-1048576|0|2097152|4242|3",
    };
    Kprof__V1__Batch b = KPROF__V1__BATCH__INIT;
    Kprof__V1__MemoryEvents me = KPROF__V1__MEMORY_EVENTS__INIT;
    char *strings[] = { "", "[memory]", "[OutOfMemory]" };
    int64_t start[] = { 0, 5, -3, 1 }; /* 0, 5, 2, 3 */
    uint32_t name[] = { 1, 1, 2, 0 };
    uint32_t dtype[] = { 1, 1, 1, 0 };
    int32_t device[] = { 0, 0, 7, -1 };
    uint64_t addr[] = { 0x7f0000000000ULL, 0x7f0000000000ULL, 0, INT64_MAX };
    int64_t bytes[] = { 1048576, -1048576, 85899345920LL, INT64_MIN };
    uint64_t total_alloc[] = { 1048576, 0, INT64_MAX, 0 };
    uint64_t total_res[] = { 2097152, 2097152, INT64_MAX, 0 };
    uint64_t tid[] = { 4242, 4242, 0, INT64_MAX };
    int32_t step[] = { 3, 3, -1, INT32_MIN };
    struct kp_sink *s;
    PGresult *res;
    char sql[512];
    uint64_t run;

    need_db();
    run = create_run("job-mem", 1);
    b.run_id = run;
    b.stream = 1;
    b.base_ns = BASE_NS;
    b.n_strings = 3;
    b.strings = strings;
#define COL(f, a) \
    me.n_##f = 4; \
    me.f = a
    COL(start_ns, start);
    COL(name, name);
    COL(device_type, dtype);
    COL(device, device);
    COL(addr, addr);
    COL(bytes, bytes);
    COL(total_allocated, total_alloc);
    COL(total_reserved, total_res);
    COL(tid, tid);
    COL(step, step);
#undef COL
    b.memory = &me;
    s = sink_open(100000, 5);
    submit(s, wire_copy(&b));
    wait_results(1, 10000);
    if (col.r[0].status != 0) {
        fail_msg("memory batch: status=%d err=%s", col.r[0].status, col.r[0].err);
    }
    kp_sink_destroy(s, 1000);

    snprintf(sql, sizeof(sql),
             "SELECT concat_ws('|', m.start_ns - %lld, coalesce(n.name, 'NULL'), m.device_type, "
             "m.device, m.addr, m.bytes, m.total_allocated, m.total_reserved, m.tid, m.step) "
             "FROM memory_events m LEFT JOIN names n ON n.id = m.name "
             "WHERE m.run_id = %" PRIu64 " ORDER BY m.start_ns",
             BASE_NS, run);
    res = PQexec(db, sql);
    assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(res), 4);
    for (int r = 0; r < 4; r++) {
        assert_string_equal(PQgetvalue(res, r, 0), want[r]);
    }
    PQclear(res);
    assert_int_equal(
        kp_test_pg_int(db, "SELECT records FROM ranks WHERE run_id = %" PRIu64 " AND rank = 0",
                       run),
        4);
}

struct dropper {
    uint64_t run;
    int rc;
    bool done;
    char err[512];
};

static void *drop_main(void *arg)
{
    struct dropper *d = arg;
    Kprof__V1__Run out = KPROF__V1__RUN__INIT;
    PGconn *c = NULL;

    d->rc = kp_pg_connect(conninfo, "kprof-test-drop", &c, d->err, sizeof(d->err));
    if (d->rc == 0) {
        d->rc = kp_store_drop_run(c, d->run, &out, d->err, sizeof(d->err));
        kp_store_run_fini(&out);
        PQfinish(c);
    }
    __atomic_store_n(&d->done, true, __ATOMIC_SEQ_CST);
    return NULL;
}

static bool drop_waiting(void *arg)
{
    (void) arg;
    return kp_test_pg_int(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                              "'kprof-test-drop' AND wait_event_type = 'Lock'") == 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

/* (g) kp_store_drop_run: refuses an open run, drops an ended one with all its rows, and
 * waits for (never deadlocks with) a sink transaction that is storing the run's batches. */
static void test_drop_run(void **state)
{
    Kprof__V1__Run out = KPROF__V1__RUN__INIT;
    struct expect ex = { 0 };
    struct kp_sink *s;
    char err[512] = "";
    uint64_t run, run2;

    need_db();
    run = create_run("job-drop", 2);
    s = sink_open(100000, 5);
    submit(s, make_batch(run, 0, 1, 0, 4, &ex));
    submit(s, make_batch(run, 1, 1, 0, 4, &ex));
    wait_results(2, 10000);
    assert_int_equal(col.r[0].status, 0);
    assert_int_equal(col.r[1].status, 0);
    kp_sink_destroy(s, 1000);

    /* Open: refused, nothing dropped, the connection usable. */
    assert_int_equal(kp_store_drop_run(db, run, &out, err, sizeof(err)), -EBUSY);
    assert_non_null(strstr(err, "open"));
    assert_non_null(strstr(err, "EndRun"));
    assert_int_equal(PQtransactionStatus(db), PQTRANS_IDLE);
    assert_int_equal(
        kp_test_pg_int(db, "SELECT count(*) FROM memory_events WHERE run_id = %" PRIu64, run),
        ex.rows[KP_EV_MEMORY]);
    assert_true(ex.rows[KP_EV_MEMORY] > 0);

    assert_int_equal(kp_store_end_run(db, run, true, &out, err, sizeof(err)), 0);
    assert_int_equal(kp_store_drop_run(db, run, &out, err, sizeof(err)), 0);
    assert_int_equal(out.id, run);
    assert_string_equal(out.job, "job-drop");
    assert_int_equal(out.state, KPROF__V1__RUN_STATE__RUN_STATE_FAILED);
    assert_int_equal(out.batches, 2);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM kp_run_tables t WHERE "
                                    "to_regclass(t.name || '_r%" PRIu64 "') IS NOT NULL",
                                    run),
                     0);
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM runs WHERE id = %" PRIu64, run), 0);
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM ranks WHERE run_id = %" PRIu64, run),
                     0);
    assert_int_equal(
        kp_test_pg_int(db, "SELECT count(*) FROM devices WHERE run_id = %" PRIu64, run), 0);
    assert_int_equal(kp_store_drop_run(db, run, &out, err, sizeof(err)), KP_ENOTFOUND);
    assert_non_null(strstr(err, "does not exist"));
    assert_int_equal(kp_store_drop_run(db, 0, &out, err, sizeof(err)), KP_ENOTFOUND);
    assert_int_equal(kp_store_drop_run(db, (uint64_t) INT32_MAX + 1, &out, err, sizeof(err)),
                     KP_ENOTFOUND);
    assert_int_equal(PQtransactionStatus(db), PQTRANS_IDLE);
    kp_store_run_fini(&out);

    /* A drop while a sink-like transaction holds the tables (in the sink's lock order) and
     * then upserts ranks (FOR KEY SHARE on the run's row): the drop waits, then succeeds. */
    run2 = create_run("job-drop", 1);
    assert_int_equal(kp_store_end_run(db, run2, false, &out, err, sizeof(err)), 0);
    kp_store_run_fini(&out);
    {
        const char *tables[KP_EV_COUNT + 1];
        char lock[1024];
        size_t o, n = 0;
        struct dropper d = { .run = run2 };
        pthread_t th;
        PGconn *c = NULL;

        tables[n++] = "ingest_batches";
        for (int k = 0; k < KP_EV_COUNT; k++) {
            tables[n++] = kp_event_kinds[k].store;
        }
        qsort(tables, n, sizeof(tables[0]), cmp_str);
        o = (size_t) snprintf(lock, sizeof(lock), "BEGIN; LOCK TABLE ");
        for (size_t i = 0; i < n; i++) {
            o += (size_t) snprintf(lock + o, sizeof(lock) - o, "%sONLY %s", i ? ", " : "",
                                   tables[i]);
        }
        snprintf(lock + o, sizeof(lock) - o, " IN ROW EXCLUSIVE MODE");
        assert_int_equal(kp_pg_connect(conninfo, "kprof-test-sinklike", &c, err, sizeof(err)), 0);
        kp_test_pg_exec(c, "%s", lock);
        assert_int_equal(pthread_create(&th, NULL, drop_main, &d), 0);
        if (!kp_test_wait_for(drop_waiting, NULL, 10000)) {
            fail_msg("the drop did not wait for the sink's transaction (done=%d rc=%d err=%s)",
                     (int) __atomic_load_n(&d.done, __ATOMIC_SEQ_CST), d.rc, d.err);
        }
        assert_false(__atomic_load_n(&d.done, __ATOMIC_SEQ_CST));
        /* The ranks upsert comes after the drop has locked the run's row: a drop that took
         * the row FOR UPDATE would deadlock here. */
        kp_test_pg_exec(c, "INSERT INTO ranks (run_id, rank) VALUES (%" PRIu64 ", 0)", run2);
        kp_test_pg_exec(
            c, "INSERT INTO memory_events (run_id, rank, start_ns) VALUES (%" PRIu64 ", 0, 1)",
            run2);
        kp_test_pg_exec(c, "COMMIT");
        pthread_join(th, NULL);
        if (d.rc != 0) {
            fail_msg("drop after the sink's commit: rc=%d err=%s", d.rc, d.err);
        }
        PQfinish(c);
    }
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM runs WHERE id = %" PRIu64, run2), 0);
    assert_int_equal(kp_test_pg_int(db, "SELECT count(*) FROM ranks WHERE run_id = %" PRIu64, run2),
                     0);
    assert_int_equal(kp_test_pg_int(db,
                                    "SELECT count(*) FROM pg_tables WHERE tablename = "
                                    "'memory_events_r%" PRIu64 "'",
                                    run2),
                     0);
}

/* Migration 0002 on a version-1 database gives the runs already there a memory_events
 * partition, and kp_drop_run drops it with them. */
static void test_migrate_existing_runs(void **state)
{
    char ci[1024], err[512] = "";
    PGconn *c = NULL;
    long long old;

    need_db();
    assert_true(kp_migrations_count >= 2);
    assert_int_equal(kp_migrations[0].version, 1);
    kp_test_pg_fresh_db("kprof_test_migrate_v1", ci, sizeof(ci));
    assert_int_equal(kp_pg_connect(ci, "kprof-test", &c, err, sizeof(err)), 0);
    kp_test_pg_exec(c, "CREATE TABLE kp_schema_migrations (version integer PRIMARY KEY, "
                       "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())");
    kp_test_pg_exec(c, "%s", kp_migrations[0].sql);
    kp_test_pg_exec(c, "INSERT INTO kp_schema_migrations (version, name) VALUES (1, '%s')",
                    kp_migrations[0].name);
    old = kp_test_pg_int(c, "INSERT INTO runs (job, world_size) VALUES ('old', 1) RETURNING id");
    kp_test_pg_exec(c, "SELECT kp_create_run_partitions(%lld)", old);
    assert_int_equal(kp_test_pg_int(c,
                                    "SELECT count(*) FROM pg_tables WHERE tablename = "
                                    "'memory_events_r%lld'",
                                    old),
                     0);

    assert_int_equal(kp_pg_migrate(c, err, sizeof(err)), (int) kp_migrations_count - 1);
    assert_int_equal(kp_test_pg_int(c,
                                    "SELECT count(*) FROM pg_tables WHERE tablename = "
                                    "'memory_events_r%lld'",
                                    old),
                     1);
    kp_test_pg_exec(c,
                    "INSERT INTO memory_events (run_id, rank, start_ns, bytes) VALUES (%lld, "
                    "0, 1, -512)",
                    old);
    assert_int_equal(kp_test_pg_int(c, "SELECT count(*) FROM kp_run_tables WHERE name = "
                                       "'memory_events'"),
                     1);
    kp_test_pg_exec(c, "SELECT kp_drop_run(%lld)", old);
    assert_int_equal(kp_test_pg_int(c,
                                    "SELECT count(*) FROM pg_tables WHERE tablename LIKE "
                                    "'%%_r%lld'",
                                    old),
                     0);
    PQfinish(c);
}

/*
 * Throughput of the sink against a raw COPY of the same rows, pre-encoded, in one
 * transaction (printed, not asserted: timings on a shared machine or under sanitizers mean
 * little). KPROF_TEST_SINK_ROWS sets flush_max_rows (default 50000); KPROF_TEST_SINK_DEBUG
 * turns on the sink's per-flush debug lines.
 */
static void test_throughput(void **state)
{
    struct expect ex = { 0 };
    struct kp_sink *s;
    Kprof__V1__Batch **bs;
    double t0;
    const size_t n = 100, per = 1000;
    struct kp_strbuf sb[KP_EV_COUNT];
    int32_t ids[N_STRINGS];
    uint64_t run, run2;
    double sink_s, raw_s, enc_s;
    long long rows = 0;
    char err[512], cols[640];
    PGconn *c = NULL;

    need_db();
    run = create_run("job-perf", 1);
    run2 = create_run("job-perf-raw", 1);
    bs = calloc(n, sizeof(*bs));
    for (size_t i = 0; i < n; i++) {
        bs[i] = make_batch(run, 0, 1, i, per, &ex);
        rows += (long long) kp_batch_total_rows(bs[i]);
    }
    /* Raw: the same rows, encoded beforehand, one COPY per kind in one transaction. */
    for (int j = 0; j < N_STRINGS; j++) {
        ids[j] = j;
    }
    t0 = kp_mono_s();
    for (int k = 0; k < KP_EV_COUNT; k++) {
        kp_strbuf_init(&sb[k], 0);
        for (size_t i = 0; i < n; i++) {
            bs[i]->run_id = run2;
            assert_true(kp_codec_copy_text(bs[i], (enum kp_event_kind) k, ids, &sb[k]) >= 0);
            bs[i]->run_id = run;
        }
    }
    enc_s = kp_mono_s() - t0;
    assert_int_equal(kp_pg_connect(conninfo, "kprof-test-raw", &c, err, sizeof(err)), 0);
    t0 = kp_mono_s();
    assert_int_equal(kp_pg_exec(c, "BEGIN", err, sizeof(err)), 0);
    for (int k = 0; k < KP_EV_COUNT; k++) {
        kp_codec_copy_columns((enum kp_event_kind) k, cols, sizeof(cols));
        assert_true(kp_pg_copy_in(c, kp_event_kinds[k].store, cols, sb[k].data, sb[k].len, err,
                                  sizeof(err)) > 0);
    }
    assert_int_equal(kp_pg_exec(c, "COMMIT", err, sizeof(err)), 0);
    raw_s = kp_mono_s() - t0;
    PQfinish(c);
    for (int k = 0; k < KP_EV_COUNT; k++) {
        kp_strbuf_fini(&sb[k]);
    }

    if (getenv("KPROF_TEST_SINK_DEBUG") != NULL) {
        kp_log_set_level(KP_LOG_DEBUG);
    }
    s = sink_open(getenv("KPROF_TEST_SINK_ROWS") != NULL
                      ? (size_t) atol(getenv("KPROF_TEST_SINK_ROWS"))
                      : 50000,
                  20);
    t0 = kp_mono_s();
    for (size_t i = 0; i < n; i++) {
        submit(s, bs[i]);
    }
    wait_results(n, 120000);
    sink_s = kp_mono_s() - t0;
    kp_sink_destroy(s, 1000);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(col.r[i].status, 0);
    }
    check_rank(run, 0, &ex);
    print_message("throughput: rows=%lld sink=%.3fs (%.0f rows/s) raw_copy=%.3fs (%.0f rows/s) "
                  "ratio=%.2f encode_only=%.3fs\n",
                  rows, sink_s, (double) rows / sink_s, raw_s, (double) rows / raw_s,
                  raw_s / sink_s, enc_s);
    free(bs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_matches_codec),
        cmocka_unit_test(test_migrate),
        cmocka_unit_test(test_pg_faults),
        cmocka_unit_test(test_rows_exact),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_connection_killed),
        cmocka_unit_test(test_destroy_gives_up),
        cmocka_unit_test(test_destroy_cancels_hung_flush),
        cmocka_unit_test(test_store),
        cmocka_unit_test(test_dropped_run),
        cmocka_unit_test(test_memory_rows_exact),
        cmocka_unit_test(test_drop_run),
        cmocka_unit_test(test_migrate_existing_runs),
        cmocka_unit_test(test_throughput),
    };

    return cmocka_run_group_tests_name("sink_pg", tests, NULL, group_teardown);
}
