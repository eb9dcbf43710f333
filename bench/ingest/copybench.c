/*
 * kprof-bench-copy: the baseline of bench/ingest. It writes the same synthetic rows that
 * kprof-loadgen sends (kp_synth, same flags, same seed) straight into PostgreSQL: a fresh
 * run, its partitions, the names resolved to names.id beforehand (not timed), then, timed,
 * each batch encoded with kp_codec_copy_text and streamed with COPY ... FROM STDIN into the
 * same tables in the same text format, one transaction per --flush-rows rows (collectord's
 * flush-max-rows default). Generating and encoding the next transaction's rows overlaps
 * with PostgreSQL taking the previous one (two threads, two buffers), as in collectord.
 * No gRPC, no validation, no ingest_batches keys, no `ranks` upkeep: the ceiling that the
 * end-to-end path is compared with.
 *
 * Prints one JSON object: run_id, events, seconds, events_per_s, and the kernels partition's
 * size per row. --drop removes the run afterwards (kp_drop_run).
 */
#define KP_LOG_MODULE "bench-copy"
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_strbuf.h"
#include "kp_synth.h"

#define COPY_CHUNK (1u << 20)

struct copy_config {
    char *pg_conninfo;
    char *job;
    struct kp_synth_flags synth;
    long long start_ns;
    long long flush_rows;
    bool drop;
};

#define OFF(f) offsetof(struct copy_config, f)
static const struct kp_config_def copy_defs[] = {
    { "pg-conninfo", KP_CONFIG_STRING, "dbname=kprof", 1, 0, OFF(pg_conninfo),
      "libpq connection string of the kprof database", NULL, true },
    { "job", KP_CONFIG_STRING, "copy-baseline", 1, 256, OFF(job), "job name of the run", NULL,
      false },
    { "ranks", KP_CONFIG_INT, "4", 1, 4096, OFF(synth.ranks), "ranks to generate", NULL, false },
    { "steps", KP_CONFIG_INT, "100", 0, 1000000, OFF(synth.steps), "steps per rank", NULL, false },
    { "first-step", KP_CONFIG_INT, "0", 0, 1000000000, OFF(synth.first_step), "first step number",
      NULL, false },
    { "kernels-per-step", KP_CONFIG_INT, "200", KP_SYNTH_MIN_KERNELS_PER_STEP,
      KP_SYNTH_MAX_KERNELS_PER_STEP, OFF(synth.kernels_per_step), "compute kernels per step", NULL,
      false },
    { "batch-rows", KP_CONFIG_INT, "4000", KP_SYNTH_MIN_BATCH_ROWS, KP_SYNTH_MAX_BATCH_ROWS,
      OFF(synth.batch_rows), "rows per generated batch", NULL, false },
    { "seed", KP_CONFIG_INT, "1", 0, 0x7fffffffffffffffLL, OFF(synth.seed), "seed", NULL, false },
    { "start-ns", KP_CONFIG_INT, "1700000000000000000", 1, 0x7fffffffffffffffLL, OFF(start_ns),
      "CLOCK_REALTIME ns of the first step", NULL, false },
    { "flush-rows", KP_CONFIG_INT, "65536", 1, 1LL << 24, OFF(flush_rows), "rows per transaction",
      NULL, false },
    { "drop", KP_CONFIG_BOOL, "false", 0, 0, OFF(drop), "drop the run when done", NULL, false },
};
#undef OFF
#define N_DEFS (sizeof(copy_defs) / sizeof(copy_defs[0]))

/* text -> names.id, open addressing */
struct name_map {
    char **keys;
    int32_t *ids;
    size_t cap, n;
};

static uint64_t fnv(const char *s)
{
    uint64_t h = 1469598103934665603ULL;

    while (*s != '\0') {
        h = (h ^ (unsigned char) *s++) * 1099511628211ULL;
    }
    return h;
}

static int map_put(struct name_map *m, const char *k, int32_t id)
{
    size_t i;

    if ((m->n + 1) * 2 > m->cap) {
        struct name_map g = { NULL, NULL, m->cap ? m->cap * 2 : 1024, 0 };

        g.keys = calloc(g.cap, sizeof(char *));
        g.ids = calloc(g.cap, sizeof(int32_t));
        if (g.keys == NULL || g.ids == NULL) {
            free(g.keys);
            free(g.ids);
            return -ENOMEM;
        }
        for (size_t j = 0; j < m->cap; j++) {
            if (m->keys[j] != NULL) {
                for (i = fnv(m->keys[j]) & (g.cap - 1); g.keys[i] != NULL;
                     i = (i + 1) & (g.cap - 1)) {
                }
                g.keys[i] = m->keys[j];
                g.ids[i] = m->ids[j];
                g.n++;
            }
        }
        free(m->keys);
        free(m->ids);
        *m = g;
    }
    for (i = fnv(k) & (m->cap - 1); m->keys[i] != NULL; i = (i + 1) & (m->cap - 1)) {
        if (strcmp(m->keys[i], k) == 0) {
            if (id != 0) {
                m->ids[i] = id;
            }
            return 0;
        }
    }
    if ((m->keys[i] = strdup(k)) == NULL) {
        return -ENOMEM;
    }
    m->ids[i] = id;
    m->n++;
    return 0;
}

static int32_t map_get(const struct name_map *m, const char *k)
{
    for (size_t i = fnv(k) & (m->cap - 1); m->keys[i] != NULL; i = (i + 1) & (m->cap - 1)) {
        if (strcmp(m->keys[i], k) == 0) {
            return m->ids[i];
        }
    }
    return 0;
}

static void map_free(struct name_map *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        free(m->keys[i]);
    }
    free(m->keys);
    free(m->ids);
}

static int synth_for(const struct copy_config *cfg, uint32_t rank, uint64_t run_id,
                     struct kp_synth **out)
{
    struct kp_synth_opts so;

    kp_synth_opts_from_flags(&so, &cfg->synth, rank, run_id, cfg->job);
    so.start_ns = cfg->start_ns;
    return kp_synth_create(&so, out);
}

static PGresult *exec_ok(PGconn *c, const char *sql, int nparams, const char *const *params)
{
    PGresult *r = PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);

    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        fprintf(stderr, "kprof-bench-copy: %s: %s", sql, PQerrorMessage(c));
        PQclear(r);
        return NULL;
    }
    return r;
}

/* Collects every string the run will use and gets their names.id (untimed). */
static int resolve_names(PGconn *c, const struct copy_config *cfg, struct name_map *m)
{
    struct kp_strbuf arr;
    Kprof__V1__Batch *b;
    PGresult *r;
    const char *params[1];
    int rc = 0;

    for (uint32_t q = 0; q < cfg->synth.ranks && rc == 0; q++) {
        struct kp_synth *s;

        if (synth_for(cfg, q, 1, &s) != 0) {
            return -ENOMEM;
        }
        while (rc == 0 && kp_synth_next(s, &b) == 1) {
            for (size_t i = 1; i < b->n_strings && rc == 0; i++) {
                rc = map_put(m, b->strings[i], 0);
            }
        }
        kp_synth_destroy(s);
    }
    if (rc != 0) {
        return rc;
    }
    /* one text[] literal: {"a","b"} with " and \ escaped */
    kp_strbuf_init(&arr, 0);
    rc = kp_strbuf_putc(&arr, '{');
    for (size_t i = 0; i < m->cap && rc == 0; i++) {
        if (m->keys[i] == NULL) {
            continue;
        }
        if (arr.len > 1) {
            rc = kp_strbuf_putc(&arr, ',');
        }
        rc = rc ? rc : kp_strbuf_putc(&arr, '"');
        for (const char *p = m->keys[i]; *p != '\0' && rc == 0; p++) {
            if (*p == '"' || *p == '\\') {
                rc = kp_strbuf_putc(&arr, '\\');
            }
            rc = rc ? rc : kp_strbuf_putc(&arr, *p);
        }
        rc = rc ? rc : kp_strbuf_putc(&arr, '"');
    }
    rc = rc ? rc : kp_strbuf_putc(&arr, '}');
    if (rc != 0) {
        kp_strbuf_fini(&arr);
        return rc;
    }
    params[0] = arr.data;
    r = exec_ok(c,
                "INSERT INTO names (name) SELECT unnest($1::text[]) ON CONFLICT (md5(name)) DO "
                "NOTHING",
                1, params);
    PQclear(r);
    r = r == NULL ? NULL
                  : exec_ok(c,
                            "SELECT id, name FROM names WHERE md5(name) IN (SELECT "
                            "md5(unnest($1::text[])))",
                            1, params);
    kp_strbuf_fini(&arr);
    if (r == NULL) {
        return KP_EPG;
    }
    for (int i = 0; i < PQntuples(r) && rc == 0; i++) {
        rc = map_put(m, PQgetvalue(r, i, 1), (int32_t) atol(PQgetvalue(r, i, 0)));
    }
    PQclear(r);
    return rc;
}

/* COPYs each kind's buffered text into its table, in one transaction. */
static int flush_copy(PGconn *c, struct kp_strbuf *bufs, const size_t *rows)
{
    PGresult *r;
    char cols[1024], sql[1200];

    if ((r = exec_ok(c, "BEGIN", 0, NULL)) == NULL) {
        return KP_EPG;
    }
    PQclear(r);
    for (int k = 0; k < KP_EV_COUNT; k++) {
        if (rows[k] == 0) {
            continue;
        }
        snprintf(sql, sizeof(sql), "COPY %s (%s) FROM STDIN", kp_event_kinds[k].store,
                 kp_codec_copy_columns((enum kp_event_kind) k, cols, sizeof(cols)));
        r = PQexec(c, sql);
        if (PQresultStatus(r) != PGRES_COPY_IN) {
            fprintf(stderr, "kprof-bench-copy: %s: %s", sql, PQerrorMessage(c));
            PQclear(r);
            return KP_EPG;
        }
        PQclear(r);
        for (size_t off = 0; off < bufs[k].len; off += COPY_CHUNK) {
            size_t n = bufs[k].len - off < COPY_CHUNK ? bufs[k].len - off : COPY_CHUNK;

            if (PQputCopyData(c, bufs[k].data + off, (int) n) != 1) {
                fprintf(stderr, "kprof-bench-copy: COPY data: %s", PQerrorMessage(c));
                return KP_EPG;
            }
        }
        if (PQputCopyEnd(c, NULL) != 1) {
            fprintf(stderr, "kprof-bench-copy: COPY end: %s", PQerrorMessage(c));
            return KP_EPG;
        }
        r = PQgetResult(c);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            fprintf(stderr, "kprof-bench-copy: COPY %s: %s", kp_event_kinds[k].table,
                    PQerrorMessage(c));
            PQclear(r);
            return KP_EPG;
        }
        PQclear(r);
        while ((r = PQgetResult(c)) != NULL) {
            PQclear(r);
        }
        kp_strbuf_reset(&bufs[k]);
    }
    if ((r = exec_ok(c, "COMMIT", 0, NULL)) == NULL) {
        return KP_EPG;
    }
    PQclear(r);
    return 0;
}

/* One transaction's rows, encoded. */
struct unit {
    struct kp_strbuf bufs[KP_EV_COUNT];
    size_t rows[KP_EV_COUNT];
    size_t total;
};

/* The hand-over between the encoding thread (main) and the COPY thread: one unit at most
 * waits while the other is being filled. */
struct pipe {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    PGconn *conn;
    struct unit *full; /* waiting for the COPY thread */
    struct unit *done; /* copied: back to the encoder */
    bool closed, failed;
};

static void *copy_main(void *arg)
{
    struct pipe *p = arg;

    for (;;) {
        struct unit *u;

        pthread_mutex_lock(&p->mu);
        while (p->full == NULL && !p->closed) {
            pthread_cond_wait(&p->cond, &p->mu);
        }
        u = p->full;
        p->full = NULL;
        pthread_mutex_unlock(&p->mu);
        if (u == NULL) {
            return NULL;
        }
        if (flush_copy(p->conn, u->bufs, u->rows) != 0) {
            pthread_mutex_lock(&p->mu);
            p->failed = true;
            p->done = u;
            pthread_cond_broadcast(&p->cond);
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        memset(u->rows, 0, sizeof(u->rows));
        u->total = 0;
        pthread_mutex_lock(&p->mu);
        p->done = u;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Hands u to the COPY thread and returns an empty unit to fill next, or NULL on failure. */
static struct unit *hand_over(struct pipe *p, struct unit *u, struct unit **spare)
{
    struct unit *next = NULL;

    pthread_mutex_lock(&p->mu);
    while (p->full != NULL && !p->failed) {
        pthread_cond_wait(&p->cond, &p->mu);
    }
    if (!p->failed) {
        p->full = u;
        pthread_cond_broadcast(&p->cond);
        if (*spare != NULL) {
            next = *spare;
            *spare = NULL;
        }
        else {
            while (p->done == NULL && !p->failed) {
                pthread_cond_wait(&p->cond, &p->mu);
            }
            next = p->failed ? NULL : p->done;
            p->done = NULL;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return next;
}

/* Encodes one batch into u. Returns 0 or -ENOMEM. */
static int encode_batch(const Kprof__V1__Batch *b, const struct name_map *names, int32_t **ids,
                        size_t *ids_cap, struct unit *u)
{
    if (b->n_strings > *ids_cap) {
        int32_t *p = realloc(*ids, b->n_strings * sizeof(int32_t));

        if (p == NULL) {
            return -ENOMEM;
        }
        *ids = p;
        *ids_cap = b->n_strings;
    }
    (*ids)[0] = 0;
    for (size_t i = 1; i < b->n_strings; i++) {
        (*ids)[i] = map_get(names, b->strings[i]);
    }
    for (int k = 0; k < KP_EV_COUNT; k++) {
        long n = kp_codec_copy_text(b, (enum kp_event_kind) k, *ids, &u->bufs[k]);

        if (n < 0) {
            return -ENOMEM;
        }
        u->rows[k] += (size_t) n;
        u->total += (size_t) n;
    }
    return 0;
}

/* The timed part: generate, encode and COPY every rank's rows. Returns 0 and *events. */
static int run_copy(PGconn *c, const struct copy_config *cfg, const struct name_map *names,
                    uint64_t run_id, uint64_t *events)
{
    struct unit units[2];
    struct unit *u = &units[0], *spare = &units[1];
    struct pipe p;
    pthread_t th;
    int32_t *ids = NULL;
    size_t ids_cap = 0;
    int rc = 0;

    memset(units, 0, sizeof(units));
    memset(&p, 0, sizeof(p));
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < KP_EV_COUNT; k++) {
            kp_strbuf_init(&units[i].bufs[k], 0);
        }
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cond, NULL);
    p.conn = c;
    if (pthread_create(&th, NULL, copy_main, &p) != 0) {
        rc = -EAGAIN;
        goto out;
    }
    for (uint32_t q = 0; q < cfg->synth.ranks && rc == 0; q++) {
        struct kp_synth *s;
        Kprof__V1__Batch *b;

        if ((rc = synth_for(cfg, q, run_id, &s)) != 0) {
            break;
        }
        while (rc == 0 && kp_synth_next(s, &b) == 1) {
            if ((rc = encode_batch(b, names, &ids, &ids_cap, u)) != 0) {
                break;
            }
            if (u->total >= (size_t) cfg->flush_rows) {
                *events += u->total;
                if ((u = hand_over(&p, u, &spare)) == NULL) {
                    rc = KP_EPG;
                }
            }
        }
        kp_synth_destroy(s);
    }
    if (rc == 0 && u->total > 0) {
        *events += u->total;
        if (hand_over(&p, u, &spare) == NULL) {
            rc = KP_EPG;
        }
    }
    pthread_mutex_lock(&p.mu);
    p.closed = true;
    pthread_cond_broadcast(&p.cond);
    pthread_mutex_unlock(&p.mu);
    pthread_join(th, NULL);
    if (p.failed) {
        rc = KP_EPG;
    }
out:
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < KP_EV_COUNT; k++) {
            kp_strbuf_fini(&units[i].bufs[k]);
        }
    }
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.mu);
    free(ids);
    return rc;
}

int main(int argc, char **argv)
{
    struct copy_config cfg;
    struct name_map names;
    uint64_t events = 0, run_id = 0;
    PGconn *c = NULL;
    PGresult *r;
    char err[1024], idbuf[32], wbuf[32];
    const char *params[2];
    double t0, secs;
    long long kern_rows = 0, kern_bytes = 0;
    int exit_rc, rc = 1;

    memset(&cfg, 0, sizeof(cfg));
    memset(&names, 0, sizeof(names));
    if ((exit_rc = kp_config_main(copy_defs, N_DEFS, &cfg, "kprof-bench-copy", argc, argv)) >= 0) {
        return exit_rc;
    }
    if (kp_codec_selfcheck(err, sizeof(err)) != 0) {
        fprintf(stderr, "kprof-bench-copy: codec: %s\n", err);
        goto out;
    }
    c = PQconnectdb(cfg.pg_conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "kprof-bench-copy: cannot connect to PostgreSQL: %s", PQerrorMessage(c));
        goto out;
    }
    params[0] = cfg.job;
    snprintf(wbuf, sizeof(wbuf), "%lld", cfg.synth.ranks);
    params[1] = wbuf;
    if ((r = exec_ok(c,
                     "INSERT INTO runs (job, name, world_size, source) VALUES ($1, "
                     "'copy-baseline', $2, 3) RETURNING id",
                     2, params)) == NULL) {
        goto out;
    }
    run_id = (uint64_t) atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    snprintf(idbuf, sizeof(idbuf), "%" PRIu64, run_id);
    params[0] = idbuf;
    if ((r = exec_ok(c, "SELECT kp_create_run_partitions($1::integer)", 1, params)) == NULL) {
        goto out;
    }
    PQclear(r);
    if (resolve_names(c, &cfg, &names) != 0) {
        fprintf(stderr, "kprof-bench-copy: cannot resolve the names\n");
        goto out;
    }
    t0 = kp_mono_s();
    if (run_copy(c, &cfg, &names, run_id, &events) != 0) {
        fprintf(stderr, "kprof-bench-copy: the COPY failed\n");
        goto out;
    }
    secs = kp_mono_s() - t0;

    snprintf(err, sizeof(err),
             "SELECT pg_total_relation_size('kernel_rows_r%" PRIu64 "'), (SELECT count(*) FROM "
             "kernel_rows_r%" PRIu64 ")",
             run_id, run_id);
    if ((r = exec_ok(c, err, 0, NULL)) == NULL) {
        goto out;
    }
    kern_bytes = atoll(PQgetvalue(r, 0, 0));
    kern_rows = atoll(PQgetvalue(r, 0, 1));
    PQclear(r);
    printf("{\"run_id\":%" PRIu64 ",\"events\":%" PRIu64 ",\"seconds\":%.6f,\"events_per_s\":%.1f,"
           "\"kernel_rows\":%lld,\"kernel_bytes\":%lld,\"kernel_bytes_per_row\":%.1f}\n",
           run_id, events, secs, secs > 0 ? (double) events / secs : 0.0, kern_rows, kern_bytes,
           kern_rows > 0 ? (double) kern_bytes / (double) kern_rows : 0.0);
    rc = 0;
out:
    if (c != NULL && run_id != 0 && (cfg.drop || rc != 0)) {
        params[0] = idbuf;
        PQclear(exec_ok(c, "SELECT kp_drop_run($1::integer)", 1, params));
    }
    PQfinish(c);
    map_free(&names);
    kp_config_fini(copy_defs, N_DEFS, &cfg);
    return rc;
}
