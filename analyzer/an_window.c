/*
 * kp_an_create_windowed: the operator and kernel tables and the Tensor Core statistics of a
 * rank, and if asked its step-time breakdown (an_bdwin.c, which each window is handed to), read
 * a window at a time, so that what the analyzer holds is one window's model and the tables, not
 * the rank's rows (bench/scale/FINDINGS.md, "Memory").
 *
 * Windows are cut at quiet points of the rank's host time: instants that no host op (CPU op,
 * user annotation, ProfilerStep) and no runtime call of any thread spans, the first one after
 * every window_events host events. Each window's model is then the whole rank's model
 * restricted to it: its trees are closed, and every runtime call's op is in it. Its device
 * events are those launched from it, by correlation: CUPTI numbers calls as they enter, so a
 * window's correlations all lie above the previous window's (checked here; a rank where they
 * do not, or with no quiet point, is read whole instead). Stale device events (no launch) go
 * to the window whose correlation range holds theirs, under the rank's main thread, as they
 * would in the whole rank.
 *
 * The tables add up over windows: calls and times are sums, minima and maxima fold, the
 * duration-weighted means are kept as sums, and what a group shows from its first op or kernel
 * (the shapes of an operator by name, the op's Tensor Core eligibility of a kernel by op) is
 * taken from the window that holds the earliest one. The means' double sums are added in
 * window order rather than in the rank's device order: the same to the last bits unless
 * kernels of a group launched in two windows overlap in time.
 */
#include "an_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

/* ---- the windows ------------------------------------------------------------------------ */

/* The first quiet point after every n host events ($3), in time order. The window function
 * gives each host event the latest end of those before it in start order; where that end is at
 * or before the event's start, nothing open before spans it. */
#define CUTS_HOST                                                                             \
    "WITH h AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM ops WHERE run_id = $1 AND " \
    "rank = $2 AND kind IN (1, 2, 6) UNION ALL SELECT start_ns, start_ns + dur_ns FROM "      \
    "api_calls WHERE run_id = $1 AND rank = $2 AND domain = 1"
#define CUTS_STEPS " UNION ALL SELECT start_ns, start_ns + dur_ns FROM steps" WHERE_RR
#define CUTS_REST                                                                              \
    "), o AS (SELECT s, max(e) OVER (ORDER BY s, e DESC ROWS BETWEEN UNBOUNDED PRECEDING AND " \
    "1 PRECEDING) AS pe, row_number() OVER (ORDER BY s, e DESC) AS n FROM h) "                 \
    "SELECT min(s) FROM o WHERE n > $3::bigint AND pe <= s GROUP BY (n - 1) / $3::bigint "     \
    "ORDER BY 1"
static const char cuts_sql[] = CUTS_HOST CUTS_REST;
/* the same where no recorded step spans the cut either (whole_steps) */
static const char cuts_steps_sql[] = CUTS_HOST CUTS_STEPS CUTS_REST;
/* The steps' starts (ProfilerStep ops, recorded steps), the cuts cuts_by_steps tries. */
static const char step_starts_sql[] =
    "SELECT start_ns FROM ops" WHERE_RR " AND kind = 6 AND start_ns IS NOT NULL UNION SELECT "
    "start_ns FROM steps" WHERE_RR " AND start_ns IS NOT NULL ORDER BY 1";
/* Per step (bucket i >= 1: the host events that start in [start i, start i + 1); 0: before the
 * first), how many host events and their latest end. */
#define STEP_SUMS_REST \
    ") SELECT width_bucket(s, $3::bigint[]), count(*), max(e) FROM h GROUP BY 1 ORDER BY 1"
static const char step_sums_sql[] = CUTS_HOST STEP_SUMS_REST;
static const char step_sums_steps_sql[] = CUTS_HOST CUTS_STEPS STEP_SUMS_REST;

/* whole_steps needs steps to keep cuts between */
static const char has_steps_sql[] =
    "SELECT EXISTS (SELECT 1 FROM ops" WHERE_RR " AND kind = 6) OR EXISTS (SELECT 1 FROM "
    "steps" WHERE_RR ")";

/* Per window (0: before the first cut, i: from cut i), its runtime calls' correlations. */
static const char corr_sql[] =
    "SELECT width_bucket(start_ns, $3::bigint[]), min(correlation), max(correlation) FROM "
    "api_calls WHERE run_id = $1 AND rank = $2 AND domain = 1 AND correlation IS NOT NULL AND "
    "correlation <> 0 GROUP BY 1 ORDER BY 1";

/* The main thread: the first ProfilerStep's in the order the model reads ops (tid, NULLs last). */
static const char main_sql[] =
    "SELECT min(tid), count(*) > 0 FROM ops WHERE run_id = $1 AND rank = $2 AND kind = 6";

/* The host steps (kp__an_build_steps before they meet the device): the ProfilerStep ops, else
 * the steps the capture recorded, by start. */
static const char prof_steps_sql[] =
    "SELECT coalesce(o.start_ns, 0), coalesce(o.start_ns, 0) + coalesce(o.dur_ns, 0), "
    "coalesce(n.name, '') FROM ops o LEFT JOIN names n ON n.id = o.name WHERE o.run_id = $1 AND "
    "o.rank = $2 AND o.kind = 6 ORDER BY 1, 2";
static const char rec_steps_sql[] =
    "SELECT step, start_ns, start_ns + dur_ns FROM steps WHERE run_id = $1 AND rank = $2 "
    "ORDER BY start_ns, dur_ns";

/* The rank's host steps into *out (*n of them, by start), as the whole read's model makes them;
 * *n 0 where the breakdown cannot be made by windows: no steps (the one step over every CPU op
 * spans the rank), or steps that overlap or share a start. 0 or KP_EPG, -ENOMEM. */
static int plan_steps(PGconn *c, const char *const *p2, struct kp_an_step **out, size_t *n,
                      char *errbuf, size_t errlen)
{
    struct kp_an_step *st;
    PGresult *r = NULL;
    bool prof = true;
    size_t m;
    int rc;

    *out = NULL;
    *n = 0;
    if ((rc = kp_pg_query(c, prof_steps_sql, 2, p2, &r, errbuf, errlen)) != 0) {
        return rc;
    }
    if (PQntuples(r) == 0) {
        PQclear(r);
        prof = false;
        if ((rc = kp_pg_query(c, rec_steps_sql, 2, p2, &r, errbuf, errlen)) != 0) {
            return rc;
        }
    }
    m = (size_t) PQntuples(r);
    if (m == 0 || !(st = calloc(m, sizeof(*st)))) {
        PQclear(r);
        return m == 0 ? 0 : -ENOMEM;
    }
    for (size_t i = 0; i < m; i++) {
        if (prof) {
            const char *s = PQgetvalue(r, (int) i, 2);

            st[i].start_ns = kp_pg_i64(r, (int) i, 0, 0);
            st[i].end_ns = kp_pg_i64(r, (int) i, 1, 0);
            snprintf(st[i].name, sizeof(st[i].name), "%s",
                     strncmp(s, "ProfilerStep#", 13) == 0 ? s + 13 : s);
        }
        else {
            snprintf(st[i].name, sizeof(st[i].name), "%" PRId64, kp_pg_i64(r, (int) i, 0, 0));
            st[i].start_ns = kp_pg_i64(r, (int) i, 1, 0);
            st[i].end_ns = kp_pg_i64(r, (int) i, 2, 0);
        }
        if (st[i].end_ns < st[i].start_ns || (i > 0 && (st[i].start_ns <= st[i - 1].start_ns ||
                                                        st[i].start_ns < st[i - 1].end_ns))) {
            PQclear(r);
            free(st);
            return 0;
        }
    }
    PQclear(r);
    *out = st;
    *n = m;
    return 0;
}

/*
 * The cuts where the steps start: cuts_sql's window functions sort every host event of the
 * rank (1.7 s of 6 for the operator table of a 3.9 M-event rank), while a quiet point is at a
 * step's start in a rank with ProfilerStep ops (they cover the main thread), and a cut there
 * is as good as any. One aggregate per step gives its host events' count and latest end: a
 * step's start is quiet when no event before it ends after it. The first quiet start after
 * every window_events events is a cut. Returns 0 with cuts[0..*m) (free; *m may be 0), or 1
 * where the steps do not serve (none, or one of more than window_events events, which only
 * cuts inside it would bound): use cuts_sql. KP_EPG or -ENOMEM with a message.
 */
static int cuts_by_steps(PGconn *c, const char *const *p2, size_t window_events, bool whole_steps,
                         int64_t **cuts, size_t *m, char *errbuf, size_t errlen)
{
    const char *p3[3] = { p2[0], p2[1], NULL };
    struct kp_strbuf arr;
    PGresult *r = NULL;
    int64_t *starts = NULL, run_end = INT64_MIN;
    size_t n_starts, since = 0, rows;
    int rc;

    *cuts = NULL;
    *m = 0;
    if ((rc = kp_pg_query(c, step_starts_sql, 2, p2, &r, errbuf, errlen)) != 0) {
        return rc;
    }
    n_starts = (size_t) PQntuples(r);
    kp_strbuf_init(&arr, 0);
    rc = n_starts == 0 ? 1 : kp_strbuf_append_str(&arr, "{") ? -ENOMEM : 0;
    if (rc == 0 && !(starts = calloc(n_starts, sizeof(*starts)))) {
        rc = -ENOMEM;
    }
    for (size_t i = 0; rc == 0 && i < n_starts; i++) {
        starts[i] = kp_pg_i64(r, (int) i, 0, 0);
        rc = kp_strbuf_appendf(&arr, "%s%" PRId64, i ? "," : "", starts[i]) ? -ENOMEM : 0;
    }
    rc = rc ? rc : kp_strbuf_append_str(&arr, "}") ? -ENOMEM : 0;
    PQclear(r);
    r = NULL;
    p3[2] = arr.data;
    if (rc == 0 && (rc = kp_pg_query(c, whole_steps ? step_sums_steps_sql : step_sums_sql, 3, p3,
                                     &r, errbuf, errlen)) == 0) {
        rows = (size_t) PQntuples(r);
        if (!(*cuts = calloc(rows + 1, sizeof(**cuts)))) {
            rc = -ENOMEM;
        }
        for (size_t i = 0; rc == 0 && i < rows; i++) {
            size_t b = (size_t) kp_pg_i64(r, (int) i, 0, 0);
            int64_t count = kp_pg_i64(r, (int) i, 1, 0), end = kp_pg_i64(r, (int) i, 2, 0);

            if ((size_t) count > window_events) {
                rc = 1; /* a step of more than a window */
                break;
            }
            /* bucket b starts at starts[b - 1]: quiet if nothing before it ends after it */
            if (b > 0 && since >= window_events && run_end <= starts[b - 1]) {
                (*cuts)[(*m)++] = starts[b - 1];
                since = 0;
            }
            since += (size_t) count;
            run_end = end > run_end ? end : run_end;
        }
    }
    PQclear(r);
    kp_strbuf_fini(&arr);
    free(starts);
    if (rc != 0) {
        free(*cuts);
        *cuts = NULL;
        *m = 0;
    }
    if (rc == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory planning the rank's windows");
    }
    return rc;
}

int kp_an_plan_windows(PGconn *c, int64_t run, int rank, size_t window_events, bool whole_steps,
                       struct kp_an_window **out, size_t *n, char *errbuf, size_t errlen)
{
    char per[24], runs[24], ranks[16];
    const char *p2[2] = { runs, ranks };
    const char *p3[3] = { runs, ranks, per };
    struct kp_strbuf arr;
    struct kp_an_window *w = NULL;
    PGresult *r = NULL;
    int64_t *cuts = NULL;
    size_t m = 0, i;
    int rc;
    bool main_set = false;
    int64_t main_tid = 0;

    *out = NULL;
    *n = 0;
    kp_strbuf_init(&arr, 0);
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    snprintf(per, sizeof(per), "%zu", window_events);
    if (whole_steps) {
        bool any;

        if ((rc = kp_pg_query(c, has_steps_sql, 2, p2, &r, errbuf, errlen)) != 0) {
            return rc;
        }
        any = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
        PQclear(r);
        r = NULL;
        if (!any) {
            return 0;
        }
    }
    if ((rc = cuts_by_steps(c, p2, window_events, whole_steps, &cuts, &m, errbuf, errlen)) < 0) {
        return rc;
    }
    if (rc == 1) { /* every host event in start order */
        if ((rc = kp_pg_query(c, whole_steps ? cuts_steps_sql : cuts_sql, 3, p3, &r, errbuf,
                              errlen)) != 0) {
            return rc;
        }
        m = (size_t) PQntuples(r);
        if (!(cuts = calloc(m + 1, sizeof(*cuts)))) {
            PQclear(r);
            return -ENOMEM;
        }
        for (i = 0; i < m; i++) {
            cuts[i] = kp_pg_i64(r, (int) i, 0, 0);
        }
        PQclear(r);
        r = NULL;
    }
    if (m == 0) {
        free(cuts);
        return 0;
    }
    if (!(w = calloc(m + 1, sizeof(*w)))) {
        free(cuts);
        return -ENOMEM;
    }
    rc = kp_strbuf_append_str(&arr, "{");
    for (i = 0; i < m; i++) {
        w[i + 1].t_lo = w[i].t_hi = cuts[i];
        rc = rc ? rc : kp_strbuf_appendf(&arr, "%s%" PRId64, i ? "," : "", w[i].t_hi);
    }
    rc = rc ? rc : kp_strbuf_append_str(&arr, "}");
    free(cuts);
    w[0].first = true;
    w[m].last = true;
    if (rc != 0) {
        rc = -ENOMEM;
        goto fail;
    }
    p3[2] = arr.data;
    if ((rc = kp_pg_query(c, corr_sql, 3, p3, &r, errbuf, errlen)) != 0) {
        goto fail;
    }
    /* c_hi of each window: its calls' largest correlation, or the previous window's; a window
     * whose smallest is not above every earlier one's cannot be cut off by correlation */
    {
        int64_t hi = INT64_MIN;
        size_t row = 0, rows = (size_t) PQntuples(r);

        for (i = 0; i <= m; i++) {
            if (row < rows && (size_t) kp_pg_i64(r, (int) row, 0, -1) == i) {
                int64_t lo_i = kp_pg_i64(r, (int) row, 1, 0), hi_i = kp_pg_i64(r, (int) row, 2, 0);

                if (i > 0 && lo_i <= hi) {
                    PQclear(r);
                    free(w);
                    kp_strbuf_fini(&arr);
                    return 0; /* correlations not in launch order across the cut */
                }
                hi = hi_i;
                row++;
                w[i].has_calls = true;
            }
            w[i].c_hi = hi;
            if (i > 0) {
                w[i].c_lo = w[i - 1].c_hi;
            }
        }
    }
    PQclear(r);
    /* An API call of any domain whose correlation is window i's entered after the runtime call
     * of correlation c_lo and before the first one above c_hi (CUPTI numbers calls as they
     * enter): after the start of the last earlier window with runtime calls, before the end of
     * the first later one. */
    for (i = 0; i <= m; i++) {
        size_t j;

        w[i].calls_lo = INT64_MIN;
        w[i].calls_hi = INT64_MAX;
        for (j = i; j-- > 1;) {
            if (w[j].has_calls) {
                w[i].calls_lo = w[j].t_lo;
                break;
            }
        }
        for (j = i + 1; j < m; j++) {
            if (w[j].has_calls) {
                w[i].calls_hi = w[j].t_hi;
                break;
            }
        }
    }
    r = NULL;
    if ((rc = kp_pg_query(c, main_sql, 2, p2, &r, errbuf, errlen)) != 0) {
        goto fail;
    }
    main_set = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
    main_tid = kp_pg_i64(r, 0, 0, 0); /* only NULL tids: min() is NULL, and they load as 0 */
    PQclear(r);
    for (i = 0; i <= m; i++) {
        w[i].main_set = main_set;
        w[i].main_tid = main_tid;
    }
    kp_strbuf_fini(&arr);
    *out = w;
    *n = m + 1;
    return 0;
fail:
    PQclear(r);
    free(w);
    kp_strbuf_fini(&arr);
    if (rc == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory planning the rank's windows");
    }
    return rc;
}

/* ---- the sums ------------------------------------------------------------------------- */

/* Rows of one table keyed by their strings, the rows' strings interned in the handle. */
struct fold {
    size_t size; /* of a row */
    void *rows;  /* n of them, room for cap */
    size_t n, cap;
    char **keys;   /* open addressing, key_cap slots: the key text, NULL free */
    int32_t *slot; /* the row of each key */
    size_t key_cap;
};

struct folds {
    struct kp_an *h; /* the handle whose tables they become */
    struct fold ops[2], kern[2];
    int64_t tc_kern[KP_AN_MAX_GPUS], tc_tc[KP_AN_MAX_GPUS], bottom, all;
    bool tc_seen[KP_AN_MAX_GPUS], tc_any, by_device;
};

/* The interned copy of s (owned by the handle), or NULL without memory. */
static const char *intern(struct folds *f, const char *s)
{
    return kp_an_pool_intern(&f->h->strs, s);
}

/* The row of key (a transient string) in fo: *fresh when new (zeroed). NULL without memory. */
static void *fold_row(struct fold *fo, const char *key, bool *fresh)
{
    size_t k;

    *fresh = false;
    if (2 * (fo->n + 1) > fo->key_cap) {
        size_t nc = fo->key_cap ? 2 * fo->key_cap : 256;
        char **g = calloc(nc, sizeof(*g));
        int32_t *gs = calloc(nc, sizeof(*gs));

        if (!g || !gs) {
            free(g);
            free(gs);
            return NULL;
        }
        for (size_t i = 0; i < fo->key_cap; i++) {
            if (fo->keys[i]) {
                for (k = kp_an_str_hash(fo->keys[i]) & (nc - 1); g[k]; k = (k + 1) & (nc - 1)) {
                }
                g[k] = fo->keys[i];
                gs[k] = fo->slot[i];
            }
        }
        free(fo->keys);
        free(fo->slot);
        fo->keys = g;
        fo->slot = gs;
        fo->key_cap = nc;
    }
    for (k = kp_an_str_hash(key) & (fo->key_cap - 1); fo->keys[k];
         k = (k + 1) & (fo->key_cap - 1)) {
        if (strcmp(fo->keys[k], key) == 0) {
            return (char *) fo->rows + (size_t) fo->slot[k] * fo->size;
        }
    }
    if (fo->n == fo->cap) {
        size_t nc = fo->cap ? 2 * fo->cap : 64;
        void *g = realloc(fo->rows, nc * fo->size);

        if (!g) {
            return NULL;
        }
        fo->rows = g;
        fo->cap = nc;
    }
    if (!(fo->keys[k] = strdup(key))) {
        return NULL;
    }
    fo->slot[k] = (int32_t) fo->n;
    memset((char *) fo->rows + fo->n * fo->size, 0, fo->size);
    *fresh = true;
    return (char *) fo->rows + fo->n++ * fo->size;
}

static void fold_fini(struct fold *fo)
{
    for (size_t i = 0; i < fo->key_cap; i++) {
        free(fo->keys[i]);
    }
    free(fo->keys);
    free(fo->slot);
    free(fo->rows);
}

/* Adds window table t (operator rows; by_shape as keyed) into fo. 0 or -ENOMEM. */
static int fold_ops(struct folds *f, struct fold *fo, const struct kp_an_table *t, bool by_shape)
{
    const struct kp_an_op_row *w = t->rows;
    struct kp_strbuf key;

    kp_strbuf_init(&key, 0);
    for (size_t i = 0; i < t->n; i++) {
        struct kp_an_op_row *r;
        bool fresh, earlier;

        kp_strbuf_reset(&key);
        if (kp_strbuf_appendf(&key, "%s\x1f%s", w[i].name, by_shape ? w[i].input_shape : "") ||
            !(r = fold_row(fo, key.data, &fresh))) {
            kp_strbuf_fini(&key);
            return -ENOMEM;
        }
        earlier = fresh || w[i].first_tid < r->first_tid ||
                  (w[i].first_tid == r->first_tid && w[i].first_start < r->first_start);
        if (fresh && !(r->name = intern(f, w[i].name))) {
            kp_strbuf_fini(&key);
            return -ENOMEM;
        }
        if (earlier) {
            if (!(r->input_shape = intern(f, w[i].input_shape))) {
                kp_strbuf_fini(&key);
                return -ENOMEM;
            }
            r->first_tid = w[i].first_tid;
            r->first_start = w[i].first_start;
        }
        r->calls += w[i].calls;
        r->host_total_ns += w[i].host_total_ns;
        r->host_self_ns += w[i].host_self_ns;
        r->device_total_ns += w[i].device_total_ns;
        r->device_self_ns += w[i].device_self_ns;
        r->tc_self_ns += w[i].tc_self_ns;
        r->tc_total_ns += w[i].tc_total_ns;
        r->tc_eligible = r->tc_eligible || w[i].tc_eligible;
    }
    kp_strbuf_fini(&key);
    return 0;
}

/* Adds window table t (kernel rows) into fo. 0 or -ENOMEM. */
static int fold_kernels(struct folds *f, struct fold *fo, const struct kp_an_table *t)
{
    const struct kp_an_kernel_row *w = t->rows;
    struct kp_strbuf key;

    kp_strbuf_init(&key, 0);
    for (size_t i = 0; i < t->n; i++) {
        struct kp_an_kernel_row *r;
        bool fresh, earlier;

        kp_strbuf_reset(&key);
        if (kp_strbuf_appendf(&key, "%s\x1f%s\x1f%s\x1f%s\x1f%" PRId64 "\x1f%" PRId64, w[i].name,
                              w[i].op_name, w[i].grid, w[i].block, w[i].registers,
                              w[i].shared_memory) ||
            !(r = fold_row(fo, key.data, &fresh))) {
            kp_strbuf_fini(&key);
            return -ENOMEM;
        }
        earlier = fresh || w[i].first_start < r->first_start ||
                  (w[i].first_start == r->first_start &&
                   (w[i].first_end > r->first_end ||
                    (w[i].first_end == r->first_end && w[i].first_corr < r->first_corr)));
        if (fresh) {
            if (!(r->name = intern(f, w[i].name)) || !(r->op_name = intern(f, w[i].op_name))) {
                kp_strbuf_fini(&key);
                return -ENOMEM;
            }
            memcpy(r->grid, w[i].grid, sizeof(r->grid));
            memcpy(r->block, w[i].block, sizeof(r->block));
            r->registers = w[i].registers;
            r->shared_memory = w[i].shared_memory;
            r->min_ns = w[i].min_ns;
            r->max_ns = w[i].max_ns;
        }
        if (earlier) {
            r->op_tc_eligible = w[i].op_tc_eligible;
            r->first_start = w[i].first_start;
            r->first_end = w[i].first_end;
            r->first_corr = w[i].first_corr;
        }
        r->calls += w[i].calls;
        r->total_ns += w[i].total_ns;
        r->min_ns = w[i].min_ns < r->min_ns ? w[i].min_ns : r->min_ns;
        r->max_ns = w[i].max_ns > r->max_ns ? w[i].max_ns : r->max_ns;
        r->wsum_blocks_per_sm += w[i].wsum_blocks_per_sm;
        r->wsum_occupancy += w[i].wsum_occupancy;
    }
    kp_strbuf_fini(&key);
    return 0;
}

/* Adds window a's tables and Tensor Core sums into f. 0 or -ENOMEM. */
static int fold_window(struct folds *f, struct kp_an *a)
{
    const struct kp_an_table *t;
    struct kp_an_tc tc;
    int rc;

    for (int by = 0; by < 2; by++) {
        if ((rc = kp_an_ops(a, by != 0, &t)) < 0 || (rc = fold_ops(f, &f->ops[by], t, by)) < 0 ||
            (rc = kp_an_kernels(a, by != 0, &t)) < 0 ||
            (rc = fold_kernels(f, &f->kern[by], t)) < 0) {
            return rc;
        }
    }
    if ((rc = kp_an_tensor_cores(a, &tc)) < 0) {
        return rc;
    }
    for (size_t g = 0; g < tc.n_gpus; g++) {
        int id = tc.gpu_ids[g];

        f->tc_seen[id] = true;
        f->tc_kern[id] += tc.op_kernel_ns[g];
        f->tc_tc[id] += tc.op_tc_ns[g];
    }
    f->tc_any = f->tc_any || tc.tc_ratio_defined;
    f->bottom += tc.eligible_bottom_ns;
    f->all += tc.eligible_all_ns;
    f->by_device = f->by_device || a->n_devs > 0;
    return 0;
}

/* The sums into h's tables, in the orders a whole rank's have. */
static void folds_finish(struct folds *f)
{
    struct kp_an *h = f->h;
    struct kp_an_tc *tc = &h->tc;

    for (int by = 0; by < 2; by++) {
        kp__an_sort_op_rows(f->ops[by].rows, f->ops[by].n, f->by_device);
        kp__an_finish_kernel_rows(f->kern[by].rows, f->kern[by].n);
        h->ops_tab[by] = (struct kp_an_table){ f->ops[by].n, f->ops[by].rows };
        h->kern_tab[by] = (struct kp_an_table){ f->kern[by].n, f->kern[by].rows };
        f->ops[by].rows = f->kern[by].rows = NULL;
    }
    memset(tc, 0, sizeof(*tc));
    for (int g = 0; g < KP_AN_MAX_GPUS; g++) {
        if (!f->tc_seen[g]) {
            continue;
        }
        tc->gpu_ids[tc->n_gpus] = g;
        tc->tc_ratio[tc->n_gpus] =
            f->tc_kern[g] ? (double) f->tc_tc[g] / (double) f->tc_kern[g] : 0.0;
        tc->op_kernel_ns[tc->n_gpus] = f->tc_kern[g];
        tc->op_tc_ns[tc->n_gpus] = f->tc_tc[g];
        tc->n_gpus++;
    }
    tc->tc_ratio_defined = f->tc_any;
    tc->eligible_ops_kernel_ratio = f->all ? (double) f->bottom / (double) f->all : 0.0;
    tc->eligible_bottom_ns = f->bottom;
    tc->eligible_all_ns = f->all;
}

static void folds_fini(struct folds *f)
{
    for (int by = 0; by < 2; by++) {
        fold_fini(&f->ops[by]);
        fold_fini(&f->kern[by]);
    }
}

int kp_an_create_windowed(PGconn *c, int64_t run, int rank, size_t max_rows, size_t window_events,
                          unsigned what, struct kp_an **out, char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *p2[2] = { runs, ranks };
    struct kp_an_window *w = NULL;
    struct folds f = { 0 };
    struct kp__an_bdwin *bw = NULL;
    struct kp__an_memfold *mf = NULL;
    size_t n = 0;
    bool began = false;
    int rc;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    if (window_events == 0) {
        return 0;
    }
    /* every window and the plan read one snapshot */
    if ((rc = kp_an_snapshot_begin(c, &began, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((rc = kp_an_plan_windows(c, run, rank, window_events, false, &w, &n, errbuf, errlen)) !=
            0 ||
        n < 2) {
        kp_an_snapshot_end(c, began, rc);
        free(w);
        return rc;
    }
    if (what & KP_AN_WIN_BREAKDOWN) {
        struct kp_an_step *steps = NULL;
        size_t n_steps = 0;

        if ((rc = plan_steps(c, p2, &steps, &n_steps, errbuf, errlen)) != 0 || n_steps == 0 ||
            (rc = kp__an_bdwin_new(steps, n_steps, &bw)) != 0) {
            free(steps);
            goto out; /* rc 0 and no handle where the steps cannot be windowed: read whole */
        }
        free(steps);
    }
    if (!(f.h = calloc(1, sizeof(*f.h))) ||
        ((what & KP_AN_WIN_MEMORY) && kp__an_memfold_new(f.h, &mf) < 0)) {
        rc = -ENOMEM;
        goto out;
    }
    f.ops[0].size = f.ops[1].size = sizeof(struct kp_an_op_row);
    f.kern[0].size = f.kern[1].size = sizeof(struct kp_an_kernel_row);
    for (size_t i = 0; i < n; i++) {
        struct kp_an *a = NULL;

        if ((rc = kp__an_create_window(c, run, rank, max_rows, &w[i], &a, errbuf, errlen)) != 0) {
            goto out;
        }
        rc = (what & KP_AN_WIN_TABLES) ? fold_window(&f, a) : kp__an_build_model(a);
        if (rc == 0 && bw) {
            rc = kp__an_bdwin_add(bw, a, w[i].t_hi, w[i].last);
        }
        if (rc == 0 && mf) {
            rc = kp__an_memfold_add(mf, a, c, run, rank, max_rows, &w[i], errbuf, errlen);
        }
        kp_an_destroy(a);
        if (rc == 1) {
            kp_log_info("breakdown not by windows run=%" PRId64 " rank=%d window=%zu: device "
                        "time out of launch order with the cuts; reading whole",
                        run, rank, i);
            rc = 0;
            goto out;
        }
        if (rc != 0) {
            goto out;
        }
    }
    if (what & KP_AN_WIN_TABLES) {
        folds_finish(&f);
        f.h->tables_done = true;
    }
    if (mf && (rc = kp__an_memfold_finish(mf)) != 0) {
        goto out;
    }
    if (bw) {
        rc = kp__an_bdwin_finish(bw, f.h);
        bw = NULL;
        if (rc != 0) {
            goto out;
        }
    }
    f.h->windowed = true;
    f.h->windows = n;
    f.h->built = true;
    *out = f.h;
    f.h = NULL;
out:
    kp_an_snapshot_end(c, began, rc);
    if (rc == -ENOMEM && errbuf[0] == '\0') {
        kp_errbuf_set(errbuf, errlen, "out of memory reading run %" PRId64 " rank %d by windows",
                      run, rank);
    }
    folds_fini(&f);
    kp__an_bdwin_free(bw);
    kp__an_memfold_free(mf);
    kp_an_destroy(f.h);
    free(w);
    return rc;
}

size_t kp_an_windows(const struct kp_an *a)
{
    return a->windowed ? a->windows : 1;
}
