/*
 * kp_an: the analyzer core's loader (see an.h).
 *
 * DESIGN. The loader reads each table of the (run, rank) with one ordered query into flat
 * arrays, the big ones (ops, runtime calls, device events) streamed as COPY rows parsed as they
 * arrive; names are resolved once to indexes into one id-sorted array, from a process-wide
 * cache of the names dictionary (an id is read from PostgreSQL once). The model then links
 * the arrays by index: each device event to its runtime call (correlation, through a sorted
 * index), each runtime call to the host node that owns it (external id, through a sorted
 * index of the nodes in tree order), and every host node into its thread's tree (a stack
 * over the ops sorted by thread, start, end descending). Nodes are created parent first, so
 * walking them backwards is a post-order walk: the bottom-up statistics need no recursion.
 * Everything the breakdown, operator, kernel and Tensor Core views need is in struct kp_an:
 * they query PostgreSQL no more. The memory view (an_memory.c) reads the rank's memory events
 * and the recommendations (an_recommend.c) two more small queries, each over the caller's
 * connection.
 *
 * The files: an.c loads and frees; an_names.c classifies names; an_model.c builds the model and
 * the steps; an_breakdown.c, an_comm.c, an_memory.c and an_tables.c compute the views;
 * an_json.c writes them. an_int.h is what they share.
 */
#include "an_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

const char *const kp_an_cat_keys[KP_AN_CAT_COUNT] = {
    "kernel_us",  "memcpy_us",     "memset_us",   "communication_us",
    "runtime_us", "dataloader_us", "cpu_exec_us", "other_us",
};

/* ---- loading ------------------------------------------------------------------------- */

static int cmp_name_id(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = ((const struct kp_an_name *) pb)->id;

    return a < b ? -1 : a > b;
}

int32_t kp_an_dict_find(const struct kp_an_dict *d, int64_t id)
{
    const struct kp_an_name *n = bsearch(&id, d->v, d->n, sizeof(*d->v), cmp_name_id);

    return n ? (int32_t) (n - d->v) : -1;
}

int kp_an_dict_load(PGconn *c, const char *sql, const char *const *params, size_t *budget,
                    size_t max_rows, struct kp_an_dict *d, char *errbuf, size_t errlen)
{
    PGresult *r = NULL;
    size_t n;
    int rc = kp_an_query(c, 2, sql, params, budget, max_rows, &r, errbuf, errlen);

    if (rc < 0) {
        return rc;
    }
    n = (size_t) PQntuples(r);
    d->v = calloc(n ? n : 1, sizeof(*d->v));
    if (!d->v) {
        PQclear(r);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        d->v[i].id = kp_pg_i64(r, (int) i, 0, 0);
        d->v[i].s = strdup(PQgetvalue(r, (int) i, 1));
        if (!d->v[i].s) {
            PQclear(r);
            kp_an_dict_fini(d);
            return -ENOMEM;
        }
        d->n++;
    }
    PQclear(r);
    return 0;
}

void kp_an_dict_fini(struct kp_an_dict *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->v[i].s);
    }
    free(d->v);
    d->v = NULL;
    d->n = 0;
}

const char *kp_an_pool_intern(struct kp_an_pool *pl, const char *s)
{
    size_t h;

    if (2 * (pl->n + 1) > pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 1024;
        char **slot = calloc(cap, sizeof(*slot));

        if (!slot) {
            return NULL;
        }
        for (size_t i = 0; i < pl->cap; i++) {
            if (pl->slot[i]) {
                for (h = kp_an_str_hash(pl->slot[i]) & (cap - 1); slot[h];
                     h = (h + 1) & (cap - 1)) {
                }
                slot[h] = pl->slot[i];
            }
        }
        free(pl->slot);
        pl->slot = slot;
        pl->cap = cap;
    }
    for (h = kp_an_str_hash(s) & (pl->cap - 1); pl->slot[h]; h = (h + 1) & (pl->cap - 1)) {
        if (strcmp(pl->slot[h], s) == 0) {
            return pl->slot[h];
        }
    }
    if (!(pl->slot[h] = strdup(s))) {
        return NULL;
    }
    pl->n++;
    return pl->slot[h];
}

void kp_an_pool_fini(struct kp_an_pool *pl)
{
    for (size_t i = 0; i < pl->cap; i++) {
        free(pl->slot[i]);
    }
    free(pl->slot);
    pl->slot = NULL;
    pl->cap = pl->n = 0;
}

/* A name id field as read (-1 for NULL); an_resolve_names turns it into an index into
 * a->names. */
static int32_t name_id(const char *f)
{
    int64_t id = kp_pg_field_i64(f, -1);

    return id > 0 && id <= INT32_MAX ? (int32_t) id : -1;
}

int kp_an_snapshot_begin(PGconn *c, bool *began, char *errbuf, size_t errlen)
{
    *began = PQtransactionStatus(c) == PQTRANS_IDLE;
    return *began ? kp_pg_exec(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", errbuf, errlen)
                  : 0;
}

void kp_an_snapshot_end(PGconn *c, bool began, int rc)
{
    char ignored[128];

    if (began) {
        (void) kp_pg_exec(c, rc == 0 ? "COMMIT" : "ROLLBACK", ignored, sizeof(ignored));
    }
}

int kp_an_query(PGconn *c, int n_params, const char *sql, const char *const *params, size_t *budget,
                size_t max_rows, PGresult **out, char *errbuf, size_t errlen)
{
    size_t n;
    int rc;

    *out = NULL; /* a failed query leaves no stale result for the caller's cleanup */
    rc = kp_pg_query(c, sql, n_params, params, out, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    n = (size_t) PQntuples(*out);
    if (max_rows && n > max_rows - *budget) {
        kp_errbuf_set(errbuf, errlen, "the rank has more than %zu rows: raise the row limit",
                      max_rows);
        PQclear(*out);
        *out = NULL;
        return KP_ETOOBIG;
    }
    *budget += n;
    return 0;
}

int kp_an_check_rank(PGconn *c, const char *const *params, int64_t run, int rank, char *errbuf,
                     size_t errlen)
{
    PGresult *r = NULL;
    int rc;

    rc = kp_pg_query(c, "SELECT count(*) FROM runs WHERE id = $1", 1, params, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    if (kp_pg_i64(r, 0, 0, 0) == 0) {
        PQclear(r);
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " does not exist: `kprofctl runs` lists "
                      "the runs",
                      run);
        return KP_ENOTFOUND;
    }
    PQclear(r);
    rc = kp_pg_query(c,
                     "SELECT coalesce(string_agg(rank::text, ',' ORDER BY rank), ''), "
                     "count(*) FILTER (WHERE rank = $2) FROM ranks WHERE run_id = $1",
                     2, params, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    if (kp_pg_i64(r, 0, 1, 0) == 0) {
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " has no rank %d: pick one of its ranks (%s) with --rank", run,
                      rank, PQgetvalue(r, 0, 0)[0] ? PQgetvalue(r, 0, 0) : "none");
        PQclear(r);
        return KP_ENOTFOUND;
    }
    PQclear(r);
    return 0;
}

/* What kp_an_create's phases share while a rank loads. */
struct an_load {
    PGconn *c;
    const char *const *params; /* run, rank as text */
    /* A window's conditions (kp_an_create_window), "" for the whole rank: $3 on the host rows'
     * start, $4 on the device events' correlation, $5 on the chunks of kernels (whose kernels
     * are then taken by correlation as they are unnested). */
    const char *host_cond, *dev_cond, *chunk_cond;
    const struct kp_an_window *win;
    int64_t run;
    int rank;
    size_t budget, max_rows; /* rows read so far, the limit (0: none) */
    char *errbuf;
    size_t errlen;
};

static int load_nomem(struct an_load *ld)
{
    kp_errbuf_set(ld->errbuf, ld->errlen, "out of memory loading run %" PRId64 " rank %d", ld->run,
                  ld->rank);
    return -ENOMEM;
}

/* ---- the rank's rows, streamed ------------------------------------------------------------ */

/* The big tables (ops, runtime calls, device events) come as COPY (...) TO STDOUT rows parsed
 * as they arrive into the growing arrays: no PGresult of the whole table (libpq keeps every
 * value as a string and 16 B of pointers: ~70 MB for the ops of a 1 M-event rank), no strtoll
 * of it. */
struct an_copy {
    struct kp_an *a;
    struct an_load *ld;
    size_t n, cap; /* rows in the array being filled, its slots */
};

/* Makes room for one more row of size sz in *v, zeroed, and one spare slot after it (the
 * runtimes' dummy); counts it against the budget. The room beyond is left untouched (realloc
 * moves big blocks by remapping them): it costs address space, not memory. 0, KP_ETOOBIG or
 * -ENOMEM. */
static int copy_slot(struct an_copy *cp, void **v, size_t sz)
{
    struct an_load *ld = cp->ld;

    if (ld->max_rows && ld->budget >= ld->max_rows) {
        return KP_ETOOBIG;
    }
    if (cp->n + 1 >= cp->cap) {
        size_t cap = cp->cap ? 2 * cp->cap : 4096;
        void *g = realloc(*v, cap * sz);

        if (!g) {
            return -ENOMEM;
        }
        *v = g;
        cp->cap = cap;
    }
    memset((char *) *v + cp->n * sz, 0, 2 * sz);
    ld->budget++;
    return 0;
}

/* COPY (query) TO STDOUT with query's $1 and $2 the run and rank, each row to fn. */
static int an_copy(struct an_copy *cp, const char *query, kp_pg_row_fn *fn)
{
    struct an_load *ld = cp->ld;
    size_t len = strlen(query) + 64 +
                 4 * (strlen(ld->host_cond) + strlen(ld->dev_cond) + strlen(ld->chunk_cond)),
           o;
    char *sql = malloc(len);
    int rc;

    if (!sql) {
        return load_nomem(ld);
    }
    o = (size_t) snprintf(sql, len, "COPY (");
    for (const char *q = query; *q; q++) {
        if (q[0] == '$' && q[1] >= '1' && q[1] <= '5') {
            const char *v = q[1] == '3'   ? ld->host_cond
                            : q[1] == '4' ? ld->dev_cond
                            : q[1] == '5' ? ld->chunk_cond
                                          : ld->params[q[1] - '1'];

            o += (size_t) snprintf(sql + o, len - o, "%s", v);
            q++;
        }
        else {
            sql[o++] = *q;
        }
    }
    snprintf(sql + o, len - o, ") TO STDOUT");
    rc = kp_pg_copy_out(ld->c, sql, fn, cp, ld->errbuf, ld->errlen);
    free(sql);
    if (rc == KP_ETOOBIG) {
        kp_errbuf_set(ld->errbuf, ld->errlen,
                      "the rank has more than %zu rows: raise the row limit", ld->max_rows);
    }
    else if (rc == -ENOMEM) {
        rc = load_nomem(ld);
    }
    else if (rc == -EINVAL) {
        kp_errbuf_set(ld->errbuf, ld->errlen, "PostgreSQL sent a row the analyzer cannot read");
        rc = KP_EPG;
    }
    return rc;
}

static int op_row(void *ud, char *row, size_t len)
{
    struct an_copy *cp = ud;
    struct kp_an *a = cp->a;
    char *f[8];
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, 8)) < 0 ||
        (rc = copy_slot(cp, (void **) &a->ops, sizeof(*a->ops))) < 0) {
        return rc;
    }
    a->ops[cp->n].start = kp_pg_field_i64(f[0], 0);
    a->ops[cp->n].end = a->ops[cp->n].start + kp_pg_field_i64(f[1], 0);
    a->ops[cp->n].tid = kp_pg_field_i64(f[2], 0);
    a->ops[cp->n].ext = kp_pg_field_i64(f[3], 0);
    a->ops[cp->n].name = name_id(f[4]);
    a->ops[cp->n].shapes = name_id(f[5]);
    a->ops[cp->n].kind = (uint8_t) kp_pg_field_i64(f[6], 0);
    a->ops[cp->n].dtypes = name_id(f[7]);
    a->n_ops = ++cp->n;
    return 0;
}

/* Ops in the order the trees are built from: by thread and start, the longer first; ops of the
 * same thread, start and duration (a trace of microseconds has them: aten::to and its
 * aten::_to_copy) in the order they were stored, the trace's, so that which one is the parent
 * does not depend on the sort's whim, nor on what else the query read (a window). */
static int an_read_ops(struct kp_an *a, struct an_load *ld)
{
    struct an_copy cp = { a, ld, 0, 0 };
    int rc =
        an_copy(&cp,
                "SELECT start_ns, dur_ns, tid, external_id, name, input_shapes, kind, "
                "input_dtypes FROM ops" WHERE_RR "$3 ORDER BY tid, start_ns, dur_ns DESC, ctid",
                op_row);

    if (rc == 0 && !a->ops && !(a->ops = calloc(1, sizeof(*a->ops)))) {
        return load_nomem(ld);
    }
    return rc;
}

static int rt_row(void *ud, char *row, size_t len)
{
    struct an_copy *cp = ud;
    struct kp_an *a = cp->a;
    char *f[5];
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, 5)) < 0 ||
        (rc = copy_slot(cp, (void **) &a->rts, sizeof(*a->rts))) < 0) {
        return rc;
    }
    a->rts[cp->n].start = kp_pg_field_i64(f[0], 0);
    a->rts[cp->n].end = a->rts[cp->n].start + kp_pg_field_i64(f[1], 0);
    a->rts[cp->n].tid = kp_pg_field_i64(f[2], 0);
    a->rts[cp->n].corr = kp_pg_field_i64(f[3], 0);
    a->rts[cp->n].ext = kp_pg_field_i64(f[4], 0);
    a->n_rts = ++cp->n;
    return 0;
}

/* Runtime calls only: the plugin drops cuda_driver (spec §1). */
static int an_read_rts(struct kp_an *a, struct an_load *ld)
{
    struct an_copy cp = { a, ld, 0, 0 };
    int rc =
        an_copy(&cp,
                "SELECT start_ns, dur_ns, tid, correlation, external_id FROM api_calls" WHERE_RR
                " AND domain = 1$3 ORDER BY start_ns, dur_ns DESC, ctid",
                rt_row);

    if (rc == 0 && !a->rts && !(a->rts = calloc(1, sizeof(*a->rts)))) {
        return load_nomem(ld); /* the dummy runtime's slot */
    }
    return rc;
}

/* One row of an_read_devs' query into a->devs[cp->n]. */
static int dev_row(void *ud, char *row, size_t len)
{
    struct an_copy *cp = ud;
    struct kp_an *a = cp->a;
    struct an_dev *d;
    char *f[17];
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, 17)) < 0 ||
        (rc = copy_slot(cp, (void **) &a->devs, sizeof(*a->devs))) < 0) {
        return rc;
    }
    d = &a->devs[cp->n];
    d->kind = (uint8_t) kp_pg_field_i64(f[0], 0);
    d->start = kp_pg_field_i64(f[1], 0);
    d->end = d->start + kp_pg_field_i64(f[2], 0);
    d->corr = kp_pg_field_i64(f[3], 0);
    d->ext = kp_pg_field_i64(f[4], 0);
    d->name = name_id(f[5]);
    d->has_grid = f[6] != NULL;
    d->has_block = f[9] != NULL;
    for (int k = 0; k < 3; k++) {
        d->grid[k] = (int32_t) kp_pg_field_i64(f[6 + k], 0);
        d->block[k] = (int32_t) kp_pg_field_i64(f[9 + k], 0);
    }
    d->regs = (int32_t) kp_pg_field_i64(f[12], 0);
    d->smem = (int32_t) kp_pg_field_i64(f[13], 0);
    d->device = f[14] ? (int16_t) kp_pg_field_i64(f[14], 0) : -1;
    d->bps = f[15] ? strtod(f[15], NULL) : NAN;
    d->occ = f[16] ? strtod(f[16], NULL) : NAN;
    d->rt = -1;
    d->next = -1;
    if (d->kind == DEV_KERNEL) {
        a->n_kernels++;
    }
    else if (d->kind == DEV_MEMCPY) {
        a->n_memcpy++;
    }
    else {
        a->n_memset++;
    }
    a->n_devs = ++cp->n;
    return 0;
}

/* One chunk of kernels (kernel_chunks: 15 arrays of the same length, element i of each being
 * kernel i; migration 0015) into a->devs, a row per kernel as dev_row would make it. */
static int chunk_row(void *ud, char *row, size_t len)
{
    struct an_copy *cp = ud;
    struct kp_an *a = cp->a;
    const char *c[15];
    char *f[15];
    int64_t v[15];
    bool null[15];
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, 15)) < 0) {
        return rc;
    }
    for (int k = 0; k < 15; k++) {
        if (!f[k]) {
            return -EINVAL;
        }
        c[k] = f[k];
    }
    for (;;) {
        struct an_dev *d;

        if ((rc = kp_pg_arrays_next_i64(c, 15, v, null)) <= 0) {
            return rc;
        }
        if (cp->ld->win && !kp_an_window_has(cp->ld->win, null[2], v[2])) {
            continue; /* launched in another window */
        }
        if ((rc = copy_slot(cp, (void **) &a->devs, sizeof(*a->devs))) < 0) {
            return rc;
        }
        d = &a->devs[cp->n];
        d->kind = DEV_KERNEL;
        d->start = v[0];
        d->end = v[0] + v[1];
        d->corr = v[2];
        d->ext = v[3];
        d->name = !null[4] && v[4] > 0 && v[4] <= INT32_MAX ? (int32_t) v[4] : -1;
        d->has_grid = !null[5];
        d->has_block = !null[8];
        for (int k = 0; k < 3; k++) {
            d->grid[k] = (int32_t) v[5 + k];
            d->block[k] = (int32_t) v[8 + k];
        }
        d->regs = (int32_t) v[11];
        /* static_smem::bigint + coalesce(dynamic_smem, 0), NULL (0) without a static size */
        d->smem = null[12] ? 0 : (int32_t) (v[12] + v[13]);
        d->device = null[14] ? -1 : (int16_t) v[14];
        d->bps = NAN;
        d->occ = NAN;
        d->rt = -1;
        d->next = -1;
        a->n_kernels++;
        a->n_devs = ++cp->n;
    }
}

/* The order an_read_devs' query gives: start, then the longer first; the rest only so that
 * ties come out the same on every load. */
static int cmp_dev(const void *pa, const void *pb)
{
    const struct an_dev *x = pa, *y = pb;

    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    if (x->end != y->end) {
        return x->end > y->end ? -1 : 1;
    }
    if (x->kind != y->kind) {
        return x->kind < y->kind ? -1 : 1;
    }
    if (x->corr != y->corr) {
        return x->corr < y->corr ? -1 : 1;
    }
    if (x->ext != y->ext) {
        return x->ext < y->ext ? -1 : 1;
    }
    return (x->name > y->name) - (x->name < y->name);
}

#define DEV_COPY_MEM                                                                            \
    " UNION ALL SELECT 1, start_ns, dur_ns, correlation, external_id, NULL, NULL, NULL, NULL, " \
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM memcpys" WHERE_RR                      \
    "$4 UNION ALL SELECT 2, start_ns, dur_ns, correlation, external_id, NULL, NULL, NULL, "     \
    "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM memsets" WHERE_RR "$4"

/*
 * The device events: kernels with their launch and occupancy, memcpys, memsets, in start
 * order. An ended run's kernels are in chunks (migration 0015): the server would unnest them
 * into rows at about 1.3 us a kernel, three times what shipping the arrays costs, so they come
 * as arrays and are unnested here, the rest as rows, and the whole sorted here. Where the rank
 * has occupancy figures (an import's side table, joined by key), it is all read through the
 * kernels view, joined and sorted by the server.
 */
static int an_read_devs(struct kp_an *a, struct an_load *ld)
{
    struct an_copy cp = { a, ld, 0, 0 };
    PGresult *r = NULL;
    bool side, began;
    int rc;

    if ((rc = kp_an_snapshot_begin(ld->c, &began, ld->errbuf, ld->errlen)) != 0) {
        return rc;
    }
    rc = kp_pg_query(ld->c, "SELECT EXISTS (SELECT 1 FROM kernel_occupancy" WHERE_RR ")", 2,
                     ld->params, &r, ld->errbuf, ld->errlen);
    if (rc != 0) {
        kp_an_snapshot_end(ld->c, began, rc);
        return rc;
    }
    side = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!side) {
        rc = an_copy(&cp,
                     "SELECT 0, start_ns, dur_ns, correlation, external_id, name, grid_x, "
                     "grid_y, grid_z, block_x, block_y, block_z, registers, "
                     "static_smem::bigint + coalesce(dynamic_smem, 0), device, NULL, NULL FROM "
                     "kernel_rows" WHERE_RR "$4" DEV_COPY_MEM,
                     dev_row);
        rc = rc != 0 ? rc
                     : an_copy(&cp,
                               "SELECT start_ns, dur_ns, correlation, external_id, name, "
                               "grid_x, grid_y, grid_z, block_x, block_y, block_z, registers, "
                               "static_smem, dynamic_smem, device FROM kernel_chunks" WHERE_RR "$5",
                               chunk_row);
        kp_an_snapshot_end(ld->c, began, rc);
        if (rc == 0 && a->n_devs > 1) {
            qsort(a->devs, a->n_devs, sizeof(*a->devs), cmp_dev);
        }
    }
    else {
        kp_an_snapshot_end(ld->c, began, 0);
        /* The occupancy side table is joined by key. Right after an import PostgreSQL has no
         * statistics on the new partitions yet, estimates one row on each side and picks a
         * nested loop that re-aggregates the side table for every kernel: 25 s instead of
         * 25 ms on a resnet50 rank. A hash join is right at every size here, so say so
         * (export does too). */
        rc = kp_pg_exec(ld->c, "SET enable_nestloop = off", ld->errbuf, ld->errlen);
        if (rc != 0) {
            return rc;
        }
        rc = an_copy(&cp,
                     "SELECT 0, start_ns, dur_ns, correlation, external_id, name, grid_x, "
                     "grid_y, grid_z, block_x, block_y, block_z, registers, "
                     "static_smem::bigint + coalesce(dynamic_smem, 0), device, o.blocks_per_sm, "
                     "o.est_occupancy FROM kernels" KP_SQL_KERNEL_OCCUPANCY_JOIN("$1", "$2")
                         WHERE_RR "$4" DEV_COPY_MEM " ORDER BY 2, 3 DESC",
                     dev_row);
        if (rc != KP_EPG) {
            char ignored[128];

            (void) kp_pg_exec(ld->c, "RESET enable_nestloop", ignored, sizeof(ignored));
        }
    }
    if (rc == 0 && !a->devs && !(a->devs = calloc(1, sizeof(*a->devs)))) {
        return load_nomem(ld);
    }
    return rc;
}

/* Recorded steps: a capture has no ProfilerStep ops but reports its steps (the hook) */
static int an_read_rec_steps(struct kp_an *a, struct an_load *ld)
{
    PGresult *r = NULL;
    size_t n;
    int rc;

    rc = kp_an_query(ld->c, 2,
                     "SELECT step, start_ns, dur_ns FROM steps" WHERE_RR " ORDER BY start_ns",
                     ld->params, &ld->budget, ld->max_rows, &r, ld->errbuf, ld->errlen);
    if (rc < 0) {
        return rc;
    }
    n = (size_t) PQntuples(r);
    a->rec_steps = calloc(n ? n : 1, sizeof(*a->rec_steps));
    if (!a->rec_steps) {
        PQclear(r);
        return load_nomem(ld);
    }
    for (size_t i = 0; i < n; i++) {
        struct kp_an_step *st = &a->rec_steps[i];

        snprintf(st->name, sizeof(st->name), "%" PRId64, kp_pg_i64(r, (int) i, 0, 0));
        st->start_ns = kp_pg_i64(r, (int) i, 1, 0);
        st->end_ns = st->start_ns + kp_pg_i64(r, (int) i, 2, 0);
    }
    a->n_rec_steps = n;
    PQclear(r);
    return 0;
}

/* The profiler's span ("PyTorch Profiler (0)", kept by import): the timeline's range */
static int an_read_prof_span(struct kp_an *a, struct an_load *ld)
{
    PGresult *r = NULL;
    int rc;

    rc = kp_an_query(ld->c, 2,
                     "SELECT profiler_start_ns, profiler_end_ns FROM ranks" WHERE_RR
                     " AND profiler_start_ns >= 0 AND profiler_end_ns > profiler_start_ns",
                     ld->params, &ld->budget, ld->max_rows, &r, ld->errbuf, ld->errlen);
    if (rc < 0) {
        return rc;
    }
    if (PQntuples(r) == 1) {
        a->prof_start = kp_pg_i64(r, 0, 0, 0);
        a->prof_end = kp_pg_i64(r, 0, 1, 0);
    }
    PQclear(r);
    return 0;
}

/* ---- the names cache ------------------------------------------------------------------ */

/* names rows are only ever added: ids come from a serial and nothing in sql/ updates or
 * deletes one (a run's drop leaves its names). So an id's text, once read, stays right for
 * the life of the process (one database per process), and a rank's dictionary can come from
 * here, reading only the ids never seen before (`id = ANY`), instead of the per-rank UNION
 * over every name column of the rank (1.4 M ids for a 1 M-event rank, 0.35-0.7 s). An id is
 * looked up only once a row that refers to it has been read, so a names row committed late
 * (ids are not committed in order) is never missed. Shared by every worker under nc_mu;
 * bounded by KP_AN_NAMES_CACHE_BYTES (text + 16 B a name): a batch that would pass it
 * empties the cache first (the dictionaries handed out are copies). */
#define KP_AN_NAMES_CACHE_BYTES ((size_t) 64 << 20)

static pthread_mutex_t nc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kp_an_name *nc_v; /* sorted by id, strings owned */
static size_t nc_n, nc_cap, nc_bytes;

static size_t nc_cost(const char *s)
{
    return strlen(s) + 1 + sizeof(struct kp_an_name);
}

static void nc_clear_locked(void)
{
    for (size_t i = 0; i < nc_n; i++) {
        free(nc_v[i].s);
    }
    nc_n = 0;
    nc_bytes = 0;
}

/* Adds the names of add[0..n) (sorted by id, not in the cache) to it; best effort: out of
 * memory or past the cap, the cache simply keeps less. */
static void nc_add(const struct kp_an_name *add, size_t n)
{
    size_t bytes = 0, i, j, k;
    struct kp_an_name *v;

    for (i = 0; i < n; i++) {
        bytes += nc_cost(add[i].s);
    }
    if (n == 0 || bytes > KP_AN_NAMES_CACHE_BYTES) {
        return;
    }
    pthread_mutex_lock(&nc_mu);
    if (nc_bytes + bytes > KP_AN_NAMES_CACHE_BYTES) {
        nc_clear_locked();
    }
    if (nc_n + n > nc_cap) {
        size_t cap = (nc_n + n) * 2;

        v = realloc(nc_v, cap * sizeof(*v));
        if (!v) {
            pthread_mutex_unlock(&nc_mu);
            return;
        }
        nc_v = v;
        nc_cap = cap;
    }
    /* merge from the back: another worker may have added some of these meanwhile */
    i = nc_n;
    j = n;
    k = nc_n + n;
    while (j > 0) {
        char *s;

        if (i > 0 && nc_v[i - 1].id > add[j - 1].id) {
            nc_v[--k] = nc_v[--i];
            continue;
        }
        if (i > 0 && nc_v[i - 1].id == add[j - 1].id) {
            j--;
            continue;
        }
        s = strdup(add[j - 1].s);
        if (!s) {
            break;
        }
        nc_bytes += nc_cost(s);
        nc_v[--k] = (struct kp_an_name){ add[j - 1].id, s };
        j--;
    }
    if (j > 0 || k > i) {
        /* out of memory or duplicates skipped: close the gap between the merged tail [k, end)
         * and the untouched head [0, i) */
        memmove(nc_v + i, nc_v + k, (nc_n + n - k) * sizeof(*nc_v));
    }
    nc_n = i + (nc_n + n - k);
    pthread_mutex_unlock(&nc_mu);
}

/* Fills d with ids[0..n)'s names (sorted, distinct ids > 0): copies from the cache, the rest
 * read with one query (then cached). Ids without a names row are left out of d. Returns 0,
 * KP_EPG or -ENOMEM (d then empty). */
static int names_lookup(PGconn *c, const int32_t *ids, size_t n, struct kp_an_dict *d, char *errbuf,
                        size_t errlen)
{
    struct kp_an_name *got = NULL;
    size_t n_miss = 0, n_got = 0, len = 3, o = 0;
    int32_t *miss = NULL;
    char *arr = NULL;
    PGresult *r = NULL;
    int rc = -ENOMEM;

    d->v = calloc(n ? n : 1, sizeof(*d->v));
    miss = calloc(n ? n : 1, sizeof(*miss));
    if (!d->v || !miss) {
        goto out;
    }
    pthread_mutex_lock(&nc_mu);
    for (size_t i = 0, j = 0; i < n; i++) {
        while (j < nc_n && nc_v[j].id < ids[i]) {
            j++;
        }
        d->v[i].id = ids[i];
        if (j < nc_n && nc_v[j].id == ids[i]) {
            d->v[i].s = strdup(nc_v[j].s);
            if (!d->v[i].s) {
                pthread_mutex_unlock(&nc_mu);
                goto out;
            }
        }
        else {
            miss[n_miss++] = ids[i];
        }
    }
    pthread_mutex_unlock(&nc_mu);
    if (n_miss > 0) {
        len += n_miss * 12;
        arr = malloc(len);
        if (!arr) {
            goto out;
        }
        arr[o++] = '{';
        for (size_t i = 0; i < n_miss; i++) {
            o += (size_t) snprintf(arr + o, len - o, "%s%" PRId32, i ? "," : "", miss[i]);
        }
        snprintf(arr + o, len - o, "}");
        rc = kp_pg_query(c, "SELECT id, name FROM names WHERE id = ANY($1::int[]) ORDER BY id", 1,
                         (const char *const *) &arr, &r, errbuf, errlen);
        if (rc < 0) {
            goto out;
        }
        rc = -ENOMEM;
        n_got = (size_t) PQntuples(r);
        got = calloc(n_got ? n_got : 1, sizeof(*got));
        if (!got) {
            goto out;
        }
        for (size_t i = 0, j = 0; i < n_got; i++) {
            got[i] = (struct kp_an_name){ kp_pg_i64(r, (int) i, 0, 0), PQgetvalue(r, (int) i, 1) };
            while (j < n && d->v[j].id < got[i].id) {
                j++;
            }
            if (j < n && d->v[j].id == got[i].id && !(d->v[j].s = strdup(got[i].s))) {
                goto out;
            }
        }
        nc_add(got, n_got);
    }
    /* ids without a row (none in a consistent database): left out, as the UNION left them */
    d->n = 0;
    for (size_t i = 0; i < n; i++) {
        if (d->v[i].s) {
            d->v[d->n++] = d->v[i];
        }
    }
    rc = 0;
out:
    if (rc < 0) {
        for (size_t i = 0; d->v && i < n; i++) {
            free(d->v[i].s);
        }
        free(d->v);
        d->v = NULL;
        d->n = 0;
    }
    PQclear(r);
    free(got);
    free(arr);
    free(miss);
    return rc;
}

/* An open-addressing map from the name ids a rank's rows use to their index in a->names. */
struct id_map {
    int32_t *key; /* 0: empty */
    int32_t *val;
    size_t mask, n;
};

static int idm_grow(struct id_map *m)
{
    size_t cap = m->mask ? 2 * (m->mask + 1) : 1024;
    struct id_map g = { calloc(cap, sizeof(int32_t)), calloc(cap, sizeof(int32_t)), cap - 1, 0 };

    if (!g.key || !g.val) {
        free(g.key);
        free(g.val);
        return -ENOMEM;
    }
    for (size_t i = 0; m->mask && i <= m->mask; i++) {
        if (m->key[i]) {
            size_t h = ((uint32_t) m->key[i] * 2654435761u) & g.mask;

            while (g.key[h]) {
                h = (h + 1) & g.mask;
            }
            g.key[h] = m->key[i];
            g.n++;
        }
    }
    free(m->key);
    free(m->val);
    *m = g;
    return 0;
}

/* The slot of id (> 0), added if absent; NULL when out of memory. */
static int32_t *idm_slot(struct id_map *m, int32_t id, bool add)
{
    size_t h;

    if (add && 2 * (m->n + 1) > m->mask + 1 && idm_grow(m) < 0) {
        return NULL;
    }
    h = ((uint32_t) id * 2654435761u) & m->mask;
    while (m->key[h] && m->key[h] != id) {
        h = (h + 1) & m->mask;
    }
    if (!m->key[h] && add) {
        m->key[h] = id;
        m->n++;
    }
    return &m->val[h];
}

static int cmp_i32(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *) pa, b = *(const int32_t *) pb;

    return (a > b) - (a < b);
}

static int32_t idm_get(const struct id_map *m, int32_t id)
{
    size_t h;

    if (id <= 0) {
        return -1;
    }
    h = ((uint32_t) id * 2654435761u) & m->mask;
    while (m->key[h] && m->key[h] != id) {
        h = (h + 1) & m->mask;
    }
    return m->key[h] ? m->val[h] : -1;
}

/* d from the ids in m (names_lookup). */
static int idm_dict(PGconn *c, const struct id_map *m, struct kp_an_dict *d, char *errbuf,
                    size_t errlen)
{
    int32_t *ids = calloc(m->n ? m->n : 1, sizeof(*ids));
    size_t n = 0;
    int rc;

    if (!ids) {
        return -ENOMEM;
    }
    for (size_t i = 0; i <= m->mask; i++) {
        if (m->key[i]) {
            ids[n++] = m->key[i];
        }
    }
    qsort(ids, n, sizeof(*ids), cmp_i32);
    rc = names_lookup(c, ids, n, d, errbuf, errlen);
    free(ids);
    return rc;
}

int kp_an_names_for(PGconn *c, const int32_t *ids, size_t n, struct kp_an_dict *d, char *errbuf,
                    size_t errlen)
{
    struct id_map m = { 0 };
    int rc = idm_grow(&m);

    for (size_t i = 0; i < n && rc == 0; i++) {
        if (ids[i] > 0 && !idm_slot(&m, ids[i], true)) {
            rc = -ENOMEM;
        }
    }
    if (rc == 0) {
        rc = idm_dict(c, &m, d, errbuf, errlen);
    }
    free(m.key);
    free(m.val);
    return rc;
}

/* The rank's dictionary: the names its ops and kernels refer to (the same set the per-rank
 * query read), sorted by id; then each name field of a->ops and a->devs, an id as read, becomes
 * its index in a->names (-1: none or unknown). The names count against the row budget, as
 * that query's rows did. */
static int an_resolve_names(struct kp_an *a, struct an_load *ld)
{
    struct id_map m = { 0 };
    int rc = -ENOMEM;

    if (idm_grow(&m) < 0) {
        return load_nomem(ld);
    }
    for (size_t i = 0; i < a->n_ops; i++) {
        const int32_t f[3] = { a->ops[i].name, a->ops[i].shapes, a->ops[i].dtypes };

        for (int k = 0; k < 3; k++) {
            if (f[k] > 0 && !idm_slot(&m, f[k], true)) {
                goto out;
            }
        }
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        if (a->devs[i].name > 0 && !idm_slot(&m, a->devs[i].name, true)) {
            goto out;
        }
    }
    rc = idm_dict(ld->c, &m, &a->names, ld->errbuf, ld->errlen);
    if (rc < 0) {
        goto out;
    }
    if (ld->max_rows && a->names.n > ld->max_rows - ld->budget) {
        kp_errbuf_set(ld->errbuf, ld->errlen,
                      "the rank has more than %zu rows: raise the row limit", ld->max_rows);
        rc = KP_ETOOBIG;
        goto out;
    }
    ld->budget += a->names.n;
    for (size_t i = 0; i <= m.mask; i++) {
        m.val[i] = -1;
    }
    for (size_t i = 0; i < a->names.n; i++) {
        *idm_slot(&m, (int32_t) a->names.v[i].id, false) = (int32_t) i;
    }
    for (size_t i = 0; i < a->n_ops; i++) {
        struct an_op *o = &a->ops[i];

        o->name = idm_get(&m, o->name);
        o->shapes = idm_get(&m, o->shapes);
        o->dtypes = idm_get(&m, o->dtypes);
    }
    a->name_tc = calloc(a->names.n + 1, sizeof(*a->name_tc));
    if (!a->name_tc) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < a->n_devs; i++) {
        struct an_dev *d = &a->devs[i];

        d->name = idm_get(&m, d->name);
        if (d->kind == DEV_KERNEL && d->name >= 0 && !a->name_tc[d->name]) {
            a->name_tc[d->name] = kp_an_is_tc_kernel(a->names.v[d->name].s) ? 2 : 1;
        }
    }
    rc = 0;
out:
    free(m.key);
    free(m.val);
    return rc == -ENOMEM ? load_nomem(ld) : rc;
}

/* kp_an_window_has in SQL. */
void kp_an_window_sql(const struct kp_an_window *w, char host[static 96], char dev[static 128],
                      char chunk[static 192])
{
    size_t o = 0;

    host[0] = dev[0] = chunk[0] = '\0';
    if (!w->first) {
        o += (size_t) snprintf(host + o, 96 - o, " AND start_ns >= %" PRId64, w->t_lo);
    }
    /* A kernel ends after it starts, which is after its launch, in the window: a chunk that
     * ended before the window has none of its kernels. A chunk's correlations (c0, c1:
     * migration 0017; NULL in older chunks) must meet the window's, but for the last
     * window, which takes the kernels without one too. */
    if (!w->first && w->last) {
        snprintf(chunk, 192, " AND t1 >= %" PRId64, w->t_lo);
    }
    else if (!w->first) {
        snprintf(chunk, 192,
                 " AND t1 >= %" PRId64 " AND (c0 IS NULL OR (c1 > %" PRId64 " AND c0 <= %" PRId64
                 "))",
                 w->t_lo, w->c_lo, w->c_hi);
    }
    else if (!w->last) {
        snprintf(chunk, 192, " AND (c0 IS NULL OR c0 <= %" PRId64 ")", w->c_hi);
    }
    if (!w->last) {
        snprintf(host + o, 96 - o, " AND start_ns < %" PRId64, w->t_hi);
    }
    if (w->first && !w->last) {
        snprintf(dev, 128, " AND correlation <= %" PRId64, w->c_hi);
    }
    else if (!w->first && w->last) {
        snprintf(dev, 128, " AND (correlation > %" PRId64 " OR correlation IS NULL)", w->c_lo);
    }
    else if (!w->first && !w->last) {
        snprintf(dev, 128, " AND correlation > %" PRId64 " AND correlation <= %" PRId64, w->c_lo,
                 w->c_hi);
    }
}

void kp_an_window_calls_sql(const struct kp_an_window *w, char calls[static 256])
{
    char host[96], dev[128], chunk[192];
    size_t o;

    kp_an_window_sql(w, host, dev, chunk);
    o = (size_t) snprintf(calls, 256, "%s", dev);
    if (w->calls_lo != INT64_MIN) {
        o += (size_t) snprintf(calls + o, 256 - o, " AND start_ns >= %" PRId64, w->calls_lo);
    }
    if (w->calls_hi != INT64_MAX) {
        snprintf(calls + o, 256 - o, " AND start_ns < %" PRId64, w->calls_hi);
    }
}

/* kp_an_create, or window w of the rank (w NULL: the whole rank). */
static int an_create(PGconn *c, int64_t run, int rank, size_t max_rows,
                     const struct kp_an_window *w, struct kp_an **out, char *errbuf, size_t errlen)
{
    char runs[24], ranks[16], host[96] = "", dev[128] = "", chunk[192] = "";
    const char *params[2] = { runs, ranks };
    struct an_load ld = { .c = c,
                          .params = params,
                          .host_cond = host,
                          .dev_cond = dev,
                          .chunk_cond = chunk,
                          .win = w,
                          .run = run,
                          .rank = rank,
                          .max_rows = max_rows,
                          .errbuf = errbuf,
                          .errlen = errlen };
    struct kp_an *a;
    int rc;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    if (w) {
        kp_an_window_sql(w, host, dev, chunk);
    }
    rc = kp_an_check_rank(c, params, run, rank, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    a = calloc(1, sizeof(*a));
    if (!a) {
        return -ENOMEM;
    }
    if (w) {
        a->main_set = w->main_set;
        a->main_tid = w->main_tid;
    }
    rc = an_read_ops(a, &ld);
    if (rc < 0) {
        goto fail;
    }
    rc = an_read_rts(a, &ld);
    if (rc < 0) {
        goto fail;
    }
    rc = an_read_devs(a, &ld);
    if (rc != 0) {
        goto fail;
    }
    rc = an_resolve_names(a, &ld);
    if (rc < 0) {
        goto fail;
    }
    rc = an_read_rec_steps(a, &ld);
    if (rc < 0) {
        goto fail;
    }
    rc = an_read_prof_span(a, &ld);
    if (rc < 0) {
        goto fail;
    }
    *out = a;
    return 0;

fail:
    kp_an_destroy(a);
    return rc;
}

int kp_an_create(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_an **out,
                 char *errbuf, size_t errlen)
{
    return an_create(c, run, rank, max_rows, NULL, out, errbuf, errlen);
}

int kp__an_create_window(PGconn *c, int64_t run, int rank, size_t max_rows,
                         const struct kp_an_window *w, struct kp_an **out, char *errbuf,
                         size_t errlen)
{
    return an_create(c, run, rank, max_rows, w, out, errbuf, errlen);
}

void kp_an_destroy(struct kp_an *a)
{
    if (!a) {
        return;
    }
    kp_an_dict_fini(&a->names);
    kp_an_pool_fini(&a->strs);
    free(a->name_tc);
    free(a->ops);
    free(a->rts);
    free(a->devs);
    free(a->rec_steps);
    free(a->nodes);
    free(a->roots);
    free(a->steps);
    kp__an_bdsums_free(a->bd_sums);
    kp_an_memory_fini(&a->mem);
    for (int i = 0; i < KP_AN_MAX_GPUS; i++) {
        free(a->bd.util_timeline[i]);
        free(a->bd.sm_ranges[i]);
    }
    for (int i = 0; i < 2; i++) {
        free(a->ops_tab[i].rows);
        free(a->kern_tab[i].rows);
    }
    free(a);
}
