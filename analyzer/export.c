/*
 * kp_export (export.h): rows → Chrome trace JSON into a sink, as docs/specs/export.md lays it
 * out. It lives in the analyzer so that kprofctl links no libpq.
 */
#define KP_LOG_MODULE "export"
#include "export_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <zlib.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_kineto_ids.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

/* ------------------------------------------------------------------------------------------ */
/* The export */

static uint64_t track_hash(int64_t pid, int64_t tid)
{
    uint64_t h = (uint64_t) pid * 0x9e3779b97f4a7c15ULL ^ (uint64_t) tid * 0xc2b2ae3d27d4eb4fULL;

    return h ^ (h >> 29);
}

void kp__export_track_seen(struct xp *x, int64_t pid, int64_t tid, bool gpu)
{
    size_t cap = 2 * EXPORT_MAX_TRACKS, i = track_hash(pid, tid) & (cap - 1);

    for (;; i = (i + 1) & (cap - 1)) {
        struct track *t = &x->tracks[i];

        if (t->tid < 0) {
            if (x->n_tracks >= EXPORT_MAX_TRACKS) {
                x->tracks_full = true;
                return;
            }
            t->pid = pid;
            t->tid = tid;
            t->gpu = gpu;
            x->n_tracks++;
            return;
        }
        if (t->pid == pid && t->tid == tid) {
            return;
        }
    }
}

/* {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ..., "dur": ..., "args": { */
void kp__export_ev_x(struct xp *x, const char *cat, const char *name, int64_t pid, int64_t tid,
                     int64_t start_ns, int64_t dur_ns, bool gpu)
{
    struct xout *o = &x->out;

    kp__export_ev_begin(x);
    XO_LIT(o, "{\"ph\": \"X\", \"cat\": \"");
    kp__export_out_put(o, cat, strlen(cat));
    XO_LIT(o, "\", \"name\": ");
    kp__export_out_jstr(o, name);
    XO_LIT(o, ", \"pid\": ");
    kp__export_out_i64(o, pid);
    XO_LIT(o, ", \"tid\": ");
    kp__export_out_i64(o, tid);
    XO_LIT(o, ", \"ts\": ");
    kp__export_out_us(o, start_ns - x->base_ns);
    XO_LIT(o, ", \"dur\": ");
    kp__export_out_us(o, dur_ns < 0 ? 0 : dur_ns);
    XO_LIT(o, ", \"args\": {");
    kp__export_track_seen(x, pid, tid, gpu);
}

static size_t nc_slot(const struct xp *x, uint32_t id)
{
    size_t i = (id * 0x9e3779b1u) & (x->nc_cap - 1);

    while (x->nc_id[i] != 0 && x->nc_id[i] != id) {
        i = (i + 1) & (x->nc_cap - 1);
    }
    return i;
}

static void nc_clear(struct xp *x)
{
    memset(x->nc_id, 0, x->nc_cap * sizeof(*x->nc_id));
    x->nc_n = 0;
    kp_strbuf_reset(&x->nc_text);
}

/* The name of names.id id, or "" (id 0 or not loaded: cannot happen after names_load). */
static const char *nc_get(const struct xp *x, uint32_t id)
{
    size_t i;

    if (id == 0) {
        return "";
    }
    i = nc_slot(x, id);
    return x->nc_id[i] == id && x->nc_off[i] != UINT32_MAX ? x->nc_text.data + x->nc_off[i] : "";
}

/* The name in column c of a row (its names.id), NULL when the column is NULL. */
const char *kp__export_nm(const struct xp *x, const PGresult *r, int row, int c)
{
    if (PQgetisnull(r, row, c)) {
        return NULL;
    }
    return nc_get(x, (uint32_t) strtoul(PQgetvalue(r, row, c), NULL, 10));
}

const char *kp__export_nm0(const struct xp *x, const PGresult *r, int row, int c)
{
    const char *s = kp__export_nm(x, r, row, c);

    return s != NULL ? s : "";
}

/*
 * Makes sure every names.id in x->ncols of res is in the cache: one query for those that are
 * not. Names are resolved here rather than in SQL because a per-row subquery or a join with
 * the whole (global) names table costs far more than the export itself. The cache holds at
 * most EXPORT_NC_MAX names / EXPORT_NC_TEXT_MAX bytes; past that it starts again (a batch's
 * names are always loaded together). Returns 0 or KP_EPG.
 */
static int names_load(struct xp *x, const PGresult *res)
{
    struct kp_strbuf *q = &x->nc_query;
    PGresult *nr = NULL;
    size_t missing = 0;
    int rc, n = PQntuples(res);

    if (x->ncols == NULL || x->ncols[0] < 0 || n == 0) {
        return 0;
    }
    if (x->nc_n + (size_t) n * 4 > EXPORT_NC_MAX || x->nc_text.len > EXPORT_NC_TEXT_MAX) {
        nc_clear(x);
    }
    kp_strbuf_reset(q);
    if (kp_strbuf_append_str(q, "SELECT id, name FROM names WHERE id = ANY('{") != 0) {
        goto oom;
    }
    for (int i = 0; i < n; i++) {
        for (const int *c = x->ncols; *c >= 0; c++) {
            uint32_t id;
            size_t s;

            if (PQgetisnull(res, i, *c)) {
                continue;
            }
            id = (uint32_t) strtoul(PQgetvalue(res, i, *c), NULL, 10);
            if (id == 0) {
                continue;
            }
            s = nc_slot(x, id);
            if (x->nc_id[s] == id) {
                continue;
            }
            x->nc_id[s] = id; /* reserved; the text comes below */
            x->nc_off[s] = UINT32_MAX;
            x->nc_n++;
            if (kp_strbuf_appendf(q, "%s%u", missing++ ? "," : "", id) != 0) {
                goto oom;
            }
        }
    }
    if (missing == 0) {
        return 0;
    }
    if (kp_strbuf_append_str(q, "}'::integer[])") != 0) {
        goto oom;
    }
    if ((rc = kp_pg_query(x->pg, q->data, 0, NULL, &nr, x->err, sizeof(x->err))) != 0) {
        return rc;
    }
    for (int i = 0; i < PQntuples(nr); i++) {
        uint32_t id = (uint32_t) strtoul(PQgetvalue(nr, i, 0), NULL, 10);
        size_t s = nc_slot(x, id);

        if (x->nc_id[s] != id) {
            continue;
        }
        x->nc_off[s] = (uint32_t) x->nc_text.len;
        if (kp_strbuf_append(&x->nc_text, PQgetvalue(nr, i, 1),
                             (size_t) PQgetlength(nr, i, 1) + 1) != 0) {
            PQclear(nr);
            goto oom;
        }
    }
    PQclear(nr);
    return 0;
oom:
    snprintf(x->err, sizeof(x->err), "out of memory (names)");
    return -ENOMEM;
}

/* Runs sql through a cursor, calling cb for every row, with the names.id columns ncols (-1
 * terminated) resolved for kp__export_nm(). Returns 0 or KP_EPG (x->err). */
int kp__export_cursor_each(struct xp *x, const char *sql, const int *ncols, kp__export_row_cb *cb)
{
    struct kp_strbuf q;
    char fetch[64];
    int rc;

    kp_strbuf_init(&q, 0);
    if (kp_strbuf_appendf(&q, "DECLARE kp_export_c NO SCROLL CURSOR FOR %s", sql) != 0) {
        kp_strbuf_fini(&q);
        snprintf(x->err, sizeof(x->err), "out of memory");
        return -ENOMEM;
    }
    rc = kp_pg_exec(x->pg, q.data, x->err, sizeof(x->err));
    kp_strbuf_fini(&q);
    if (rc != 0) {
        return rc;
    }
    snprintf(fetch, sizeof(fetch), "FETCH FORWARD %lld FROM kp_export_c",
             (long long) x->fetch_rows);
    for (;;) {
        PGresult *res = NULL;
        int n;

        if ((rc = kp_pg_query(x->pg, fetch, 0, NULL, &res, x->err, sizeof(x->err))) != 0) {
            return rc;
        }
        n = PQntuples(res);
        x->ncols = ncols;
        if ((rc = names_load(x, res)) != 0) {
            PQclear(res);
            return rc;
        }
        for (int i = 0; i < n; i++) {
            cb(x, res, i);
        }
        PQclear(res);
        if (x->out.err != 0) {
            snprintf(x->err, sizeof(x->err), "writing: %s", strerror(-x->out.err));
            return x->out.err;
        }
        if (n == 0) {
            break;
        }
    }
    return kp_pg_exec(x->pg, "CLOSE kp_export_c", x->err, sizeof(x->err));
}

static void meta_ev(struct xp *x, const char *what, int64_t pid, int64_t tid, const char *key,
                    const char *sval, int64_t ival)
{
    struct xout *o = &x->out;

    kp__export_ev_begin(x);
    XO_LIT(o, "{\"name\": \"");
    kp__export_out_put(o, what, strlen(what));
    XO_LIT(o, "\", \"ph\": \"M\", \"ts\": 0.000, \"pid\": ");
    kp__export_out_i64(o, pid);
    XO_LIT(o, ", \"tid\": ");
    kp__export_out_i64(o, tid);
    XO_LIT(o, ", \"args\": {\"");
    kp__export_out_put(o, key, strlen(key));
    XO_LIT(o, "\": ");
    if (sval != NULL) {
        kp__export_out_jstr(o, sval);
    }
    else {
        kp__export_out_i64(o, ival);
    }
    XO_LIT(o, "}}");
}

/* process_name / process_sort_index / thread_name / thread_sort_index for every track. */
static void write_metadata(struct xp *x)
{
    char label[800];
    bool host_done = false;
    bool dev_done[EXPORT_MAX_DEVICES] = { false };

    for (size_t i = 0; i < 2 * EXPORT_MAX_TRACKS; i++) {
        const struct track *t = &x->tracks[i];

        if (t->tid < 0) {
            continue;
        }
        if (!t->gpu && !host_done) {
            snprintf(label, sizeof(label), "rank %ld%s%s (pid %" PRId64 ")", x->rank,
                     x->host[0] ? " on " : "", x->host, x->pid);
            meta_ev(x, "process_name", t->pid, 0, "name", label, 0);
            meta_ev(x, "process_labels", t->pid, 0, "labels", "CPU", 0);
            meta_ev(x, "process_sort_index", t->pid, 0, "sort_index", NULL, 0);
            host_done = true;
        }
        if (t->gpu && t->pid >= 0 && t->pid < EXPORT_MAX_DEVICES && !dev_done[t->pid]) {
            const char *dn = x->dev_name[t->pid];

            snprintf(label, sizeof(label), "GPU %" PRId64 "%s%s (rank %ld)", t->pid,
                     dn[0] ? ": " : "", dn, x->rank);
            meta_ev(x, "process_name", t->pid, 0, "name", label, 0);
            snprintf(label, sizeof(label), "GPU %" PRId64, t->pid);
            meta_ev(x, "process_labels", t->pid, 0, "labels", label, 0);
            meta_ev(x, "process_sort_index", t->pid, 0, "sort_index", NULL, 1 + t->pid);
            dev_done[t->pid] = true;
        }
        snprintf(label, sizeof(label), t->gpu ? "stream %" PRId64 : "thread %" PRId64, t->tid);
        meta_ev(x, "thread_name", t->pid, t->tid, "name", label, 0);
        meta_ev(x, "thread_sort_index", t->pid, t->tid, "sort_index", NULL, t->tid);
    }
}

/* deviceProperties from the devices table; also fills x->dev_name. */
static int write_devices(struct xp *x)
{
    struct xout *o = &x->out;
    char sql[EXPORT_SQL_MAX];
    PGresult *res = NULL;
    int rc;

    snprintf(sql, sizeof(sql),
             "SELECT id, name, coalesce(global_memory_bytes, 0), coalesce(cc_major, 0), "
             "coalesce(cc_minor, 0), coalesce(max_threads_per_block, 0), "
             "coalesce(max_threads_per_sm, 0), coalesce(regs_per_block, 0), "
             "coalesce(regs_per_sm, 0), coalesce(warp_size, 0), coalesce(smem_per_block, 0), "
             "coalesce(smem_per_sm, 0), coalesce(sm_count, 0) FROM devices WHERE run_id = %ld "
             "AND rank = %ld ORDER BY id",
             x->run, x->rank);
    if ((rc = kp_pg_query(x->pg, sql, 0, NULL, &res, x->err, sizeof(x->err))) != 0) {
        return rc;
    }
    memset(x->dev_name, 0, sizeof(x->dev_name));
    XO_LIT(o, "\"deviceProperties\": [");
    for (int i = 0; i < PQntuples(res); i++) {
        static const char *const keys[] = { "totalGlobalMem",
                                            "computeMajor",
                                            "computeMinor",
                                            "maxThreadsPerBlock",
                                            "maxThreadsPerMultiprocessor",
                                            "regsPerBlock",
                                            "regsPerMultiprocessor",
                                            "warpSize",
                                            "sharedMemPerBlock",
                                            "sharedMemPerMultiprocessor",
                                            "numSms" };
        int64_t id = I(res, i, 0);

        if (i > 0) {
            kp__export_out_putc(o, ',');
        }
        XO_LIT(o, "\n  {\"id\": ");
        kp__export_out_i64(o, id);
        XO_LIT(o, ", \"name\": ");
        kp__export_out_jstr(o, S(res, i, 1));
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
            XO_LIT(o, ", \"");
            kp__export_out_put(o, keys[k], strlen(keys[k]));
            XO_LIT(o, "\": ");
            kp__export_out_i64(o, I(res, i, (int) k + 2));
        }
        kp__export_out_putc(o, '}');
        if (id >= 0 && id < EXPORT_MAX_DEVICES) {
            snprintf(x->dev_name[id], sizeof(x->dev_name[id]), "%s", S(res, i, 1));
        }
    }
    XO_LIT(o, "],\n");
    PQclear(res);
    return 0;
}

/* The file's head up to the open traceEvents array: devices, distributedInfo, host, run,
 * time base. Returns 0, or an error with x->err set. */
static int write_head(struct xp *x)
{
    struct xout *o = &x->out;
    const long run = x->run, rank = x->rank;
    int rc;

    XO_LIT(o, "{\"schemaVersion\": 1,\n");
    if ((rc = write_devices(x)) != 0) {
        return rc;
    }
    /* An imported trace's distributedInfo as it was (pg_config, nccl_version ...), none if it
     * had none. Else (a capture), as Kineto, one only for a distributed job: a one-rank run
     * gets none (import then takes rank 0, world size 1) */
    if (x->dist.len > 0) {
        XO_LIT(o, "\"distributedInfo\": ");
        kp__export_out_put(o, x->dist.data, x->dist.len);
        XO_LIT(o, ",\n");
    }
    else if (!x->imported && (x->world_size > 1 || rank != 0)) {
        XO_LIT(o, "\"distributedInfo\": {\"backend\": ");
        XO_LIT(o, "\"nccl\", \"rank\": "); /* Kineto writes the process group's backend;
                                            * kprof does not store it and NCCL is what GPU
                                            * jobs use */
        kp__export_out_i64(o, rank);
        XO_LIT(o, ", \"world_size\": ");
        kp__export_out_i64(o, x->world_size);
        XO_LIT(o, "},\n");
    }
    XO_LIT(o, "\"host_name\": ");
    kp__export_out_jstr(o, x->host);
    XO_LIT(o, ",\n\"kprof\": {\"run\": ");
    kp__export_out_i64(o, run);
    XO_LIT(o, ", \"job\": ");
    kp__export_out_jstr(o, x->job);
    XO_LIT(o, "},\n\"displayTimeUnit\": \"ns\",\n\"baseTimeNanoseconds\": ");
    kp__export_out_i64(o, x->base_ns);
    XO_LIT(o, ",\n\"traceEvents\": [");
    return 0;
}

/* Writes rank x->rank's trace into x->out. Returns 0, or an error with x->err set. */
static int write_rank(struct xp *x)
{
    struct xout *o = &x->out;
    const long run = x->run, rank = x->rank;
    int rc;

    x->events = x->flows = 0;
    memset(x->rows, 0, sizeof(x->rows));
    for (size_t i = 0; i < 2 * EXPORT_MAX_TRACKS; i++) {
        x->tracks[i].tid = -1;
    }
    x->n_tracks = 0;
    x->tracks_full = false;
    if ((rc = write_head(x)) != 0 || (rc = kp__export_write_gpu_events(x)) != 0 ||
        (rc = kp__export_write_host_events(x)) != 0 ||
        (rc = kp__export_write_ranges_and_flows(x)) != 0) {
        return rc;
    }
    write_metadata(x);
    XO_LIT(o, "\n],\n\"traceName\": ");
    {
        char tn[128];

        snprintf(tn, sizeof(tn), "kprof run %ld rank %ld", run, rank);
        kp__export_out_jstr(o, tn);
    }
    XO_LIT(o, "}\n");
    if (x->tracks_full) {
        kp_log_warn("rank %ld has more than %u tracks: the extra ones are not named", rank,
                    EXPORT_MAX_TRACKS);
    }
    return 0;
}
/* ------------------------------------------------------------------------------------------ */
/* The API (export.h) */

static void xp_free(struct xp *x)
{
    if (x == NULL) {
        return;
    }
    free(x->ranks);
    free(x->tracks);
    free(x->nc_id);
    free(x->nc_off);
    kp_strbuf_fini(&x->nc_text);
    kp_strbuf_fini(&x->nc_query);
    free(x->out.buf);
    free(x->out.zbuf);
    kp_strbuf_fini(&x->tmp);
    kp_strbuf_fini(&x->dist);
    free(x);
}

/* Runs sql, a one-row query, into *res. */
static int query(struct xp *x, const char *sql, PGresult **res)
{
    return kp_pg_query(x->pg, sql, 0, NULL, res, x->err, sizeof(x->err));
}

static int begin(struct xp *x)
{
    char sql[2048], mem_min[128] = "";
    PGresult *res = NULL;
    int rc;

    if ((rc = kp_pg_exec(x->pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", x->err,
                         sizeof(x->err))) != 0) {
        return rc;
    }
    x->in_tx = true;
    /* Run partitions are rarely analyzed when a user exports (collectord does not ANALYZE),
     * and with no statistics the planner takes them for empty and nests loops over the
     * equi-joins below (flows, collectives): quadratic. Names are scalar subqueries (index
     * lookups), which this does not touch. The penalty that makes the costs huge would also
     * start JIT compilation (~0.5 s a query for nothing): off. */
    if ((rc = kp_pg_exec(x->pg, "SET LOCAL enable_nestloop = off; SET LOCAL jit = off", x->err,
                         sizeof(x->err))) != 0) {
        return rc;
    }
    x->memory_kind = -1;
    for (int k = 0; k < KP_EV_COUNT; k++) {
        if (strcmp(kp_event_kinds[k].table, "memory_events") == 0) {
            x->memory_kind = k;
        }
    }
    if ((rc = query(x, "SELECT to_regclass('memory_events') IS NOT NULL", &res)) != 0) {
        return rc;
    }
    x->has_memory = S(res, 0, 0)[0] == 't';
    PQclear(res);
    snprintf(sql, sizeof(sql), "SELECT job, world_size, source FROM runs WHERE id = %ld", x->run);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    if (PQntuples(res) == 0) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "run %ld not found; `kprofctl runs` lists runs", x->run);
        return KP_ENOTFOUND;
    }
    snprintf(x->job, sizeof(x->job), "%s", S(res, 0, 0));
    x->world_size = (long) I(res, 0, 1);
    x->imported = I(res, 0, 2) == KPROF__V1__RUN_SOURCE__RUN_SOURCE_IMPORT;
    PQclear(res);
    snprintf(sql, sizeof(sql), "SELECT rank FROM ranks WHERE run_id = %ld ORDER BY rank", x->run);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    if (PQntuples(res) == 0) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "run %ld has no ranks: no data reached it", x->run);
        return KP_ENOTFOUND;
    }
    if ((x->ranks = calloc((size_t) PQntuples(res), sizeof(*x->ranks))) == NULL) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        x->ranks[x->n_ranks++] = (int32_t) I(res, i, 0);
    }
    PQclear(res);
    if (x->has_memory) {
        snprintf(mem_min, sizeof(mem_min),
                 ", (SELECT min(start_ns) FROM memory_events WHERE run_id = %ld)", x->run);
    }
    /* B: the run's earliest event, so that every ts is >= 0 and the ranks line up */
    snprintf(sql, sizeof(sql),
             "SELECT coalesce(least((SELECT min(start_ns) FROM kernels WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM memcpys WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM memsets WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM api_calls WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM ops WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM steps WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM collectives WHERE run_id = %1$ld), "
             "(SELECT min(start_ns) FROM syncs WHERE run_id = %1$ld)%2$s), 0)",
             x->run, mem_min);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    x->run_base_ns = I(res, 0, 0);
    if (x->run_base_ns < 0) {
        x->run_base_ns = 0; /* baseTimeNanoseconds must not be negative */
    }
    PQclear(res);
    return 0;
}

int kp_export_open(PGconn *pg, int64_t run, unsigned fetch_rows, struct kp_export **out, char *err,
                   size_t errlen)
{
    struct xp *x = calloc(1, sizeof(*x));
    int rc;

    *out = NULL;
    if (x == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    x->pg = pg;
    x->run = (long) run;
    x->fetch_rows = fetch_rows > 0 ? fetch_rows : KP_EXPORT_FETCH_ROWS;
    kp_strbuf_init(&x->tmp, 0);
    kp_strbuf_init(&x->dist, 0);
    kp_strbuf_init(&x->nc_text, 0);
    kp_strbuf_init(&x->nc_query, 0);
    x->nc_cap = EXPORT_NC_CAP;
    if ((x->tracks = calloc(2 * EXPORT_MAX_TRACKS, sizeof(*x->tracks))) == NULL ||
        (x->nc_id = calloc(x->nc_cap, sizeof(*x->nc_id))) == NULL ||
        (x->nc_off = calloc(x->nc_cap, sizeof(*x->nc_off))) == NULL ||
        (x->out.buf = malloc(EXPORT_OUT_BUF)) == NULL ||
        (x->out.zbuf = malloc(EXPORT_OUT_BUF)) == NULL) {
        xp_free(x);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if ((rc = begin(x)) != 0) {
        snprintf(err, errlen, "%s", x->err);
        kp_export_close((struct kp_export *) x);
        return rc;
    }
    *out = (struct kp_export *) x;
    return 0;
}

const int32_t *kp_export_ranks(const struct kp_export *xe, size_t *n)
{
    const struct xp *x = (const struct xp *) xe;

    *n = x->n_ranks;
    return x->ranks;
}

/* Loads the rank's row of `ranks` into x. Its time base is the imported trace's own
 * baseTimeNanoseconds (ranks.time_base_ns, migration 0008), so that import gives back the same
 * base and HTA-compatible analyses round the same relative µs (analyzer/hta.h); a rank without
 * one (a capture, a trace without a base) is written relative to the run's earliest event. */
static int load_rank(struct xp *x)
{
    char sql[320];
    PGresult *res = NULL;
    int rc;

    snprintf(sql, sizeof(sql),
             "SELECT coalesce(host, ''), coalesce(pid, 0), coalesce(device, 0), "
             "coalesce(distributed_info, ''), time_base_ns FROM ranks WHERE run_id = %ld AND "
             "rank = %ld",
             x->run, x->rank);
    if ((rc = query(x, sql, &res)) != 0) {
        return rc;
    }
    kp_strbuf_reset(&x->dist);
    if (PQntuples(res) && kp_strbuf_append_str(&x->dist, S(res, 0, 3)) != 0) {
        PQclear(res);
        snprintf(x->err, sizeof(x->err), "out of memory");
        return -ENOMEM;
    }
    snprintf(x->host, sizeof(x->host), "%s", PQntuples(res) ? S(res, 0, 0) : "");
    x->pid = PQntuples(res) ? I(res, 0, 1) : 0;
    x->device = PQntuples(res) ? (int) I(res, 0, 2) : 0;
    /* import stores no base of 0 or below (kp_kineto.c refuses a negative one) */
    x->base_ns = PQntuples(res) && !PQgetisnull(res, 0, 4) && I(res, 0, 4) > 0 ? I(res, 0, 4)
                                                                               : x->run_base_ns;
    PQclear(res);
    return 0;
}

int kp_export_rank(struct kp_export *xe, int32_t rank, int gzip_level, kp_export_sink *sink,
                   void *ud, struct kp_export_stats *st, char *err, size_t errlen)
{
    struct xp *x = (struct xp *) xe;
    struct xout *o = &x->out;
    bool known = false;
    int rc;

    memset(st, 0, sizeof(*st));
    for (size_t i = 0; i < x->n_ranks; i++) {
        known = known || x->ranks[i] == rank;
    }
    if (!known) {
        struct kp_strbuf l;

        kp_strbuf_init(&l, 4096);
        for (size_t i = 0; i < x->n_ranks && i < 32; i++) {
            (void) kp_strbuf_appendf(&l, "%s%d", i ? ", " : "", (int) x->ranks[i]);
        }
        snprintf(err, errlen, "run %ld has no rank %d (its ranks: %s%s)", x->run, (int) rank,
                 l.data != NULL ? l.data : "", x->n_ranks > 32 ? ", ..." : "");
        kp_strbuf_fini(&l);
        return KP_ENOTFOUND;
    }
    x->rank = rank;
    x->err[0] = '\0';
    o->sink = sink;
    o->ud = ud;
    o->len = 0;
    o->err = 0;
    o->bytes = 0;
    o->gz = gzip_level > 0;
    if (o->gz) {
        memset(&o->z, 0, sizeof(o->z));
        /* windowBits 15 + 16: a gzip stream, as gzdopen writes */
        if (deflateInit2(&o->z, gzip_level > 9 ? 9 : gzip_level, Z_DEFLATED, 15 + 16, 8,
                         Z_DEFAULT_STRATEGY) != Z_OK) {
            snprintf(err, errlen, "out of memory (zlib)");
            return -ENOMEM;
        }
    }
    if ((rc = load_rank(x)) == 0) {
        rc = write_rank(x);
    }
    if (rc == 0) {
        kp__export_out_flush(o);
        if (o->gz && o->err == 0) {
            o->len = 0;
            kp__export_out_deflate(o, true);
        }
        rc = o->err;
        if (rc != 0) {
            snprintf(x->err, sizeof(x->err), "%s", o->err == -EIO ? "zlib failed" : "stopped");
        }
    }
    if (o->gz) {
        (void) deflateEnd(&o->z);
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s", x->err[0] ? x->err : "export failed");
        return rc;
    }
    st->json_bytes = o->bytes;
    st->events = x->events;
    st->flows = x->flows;
    memcpy(st->rows, x->rows, sizeof(st->rows));
    return 0;
}

void kp_export_close(struct kp_export *xe)
{
    struct xp *x = (struct xp *) xe;
    char ignored[256];

    if (x == NULL) {
        return;
    }
    if (x->in_tx) {
        if (kp_pg_exec(x->pg, "COMMIT", ignored, sizeof(ignored)) != 0) {
            kp_pg_rollback(x->pg);
        }
    }
    xp_free(x);
}
