/* kp_an: the memory view (spec §10). It reads the memory events from PostgreSQL itself. */
#define _GNU_SOURCE /* qsort_r */
#include "an_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kp_codec.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "ranges.h"

/* ---- memory view (spec §10) ----------------------------------------------------------- */

#define MEM_SLOTS  (KP_AN_MAX_GPUS + 1) /* 0: CPU, 1 + n: GPU n */
#define MEM_FIELDS 7 /* self inc, self alloc, self count, inc, alloc, count, calls */

/*
 * Each memory event goes to the innermost operator node it happened in (its thread's tree, by
 * its time); its figures count in that op's self and in the inclusive figures of the op and
 * every operator above it, summed per (op name, device). Rather than per-node tables of every
 * device (1.5 KB a node: 1.2 GB and 73 s for a 1 M-event rank), the sums go straight to the
 * names of the nodes on the event's path, and the search for the innermost node resumes where
 * the thread's previous event left it: the events come in time order, and siblings do not
 * overlap, so a child that ended before an event is passed for good.
 */
struct mem_walk {
    int32_t *at;     /* per root node: the innermost node of its thread's last event; -1: none */
    int32_t *cursor; /* per node: the first child that may still hold an event; -2: not set */
    int64_t *by[MEM_SLOTS]; /* per slot seen: MEM_FIELDS sums per name index */
};

/* The innermost live node of root's thread that holds ts (the root itself if none), for ts no
 * earlier than the thread's previous event. */
static int32_t mem_innermost(const struct kp_an *a, struct mem_walk *w, int32_t root, int64_t ts)
{
    int32_t x = w->at[root] >= 0 ? w->at[root] : root;

    while (x != root && ts >= a->nodes[x].end) {
        x = a->nodes[x].parent;
    }
    for (;;) {
        int32_t ch = w->cursor[x] == -2 ? a->nodes[x].first_child : w->cursor[x];

        while (ch >= 0 && a->nodes[ch].end <= ts) {
            ch = a->nodes[ch].next_sib;
        }
        w->cursor[x] = ch;
        if (ch < 0 || a->nodes[ch].dead || a->nodes[ch].start > ts) {
            break;
        }
        x = ch;
    }
    w->at[root] = x;
    return x;
}

/* Event (bytes, slot) at operator node y: y's name's self figures, and the inclusive ones of
 * every named operator from y up. */
static void mem_add(const struct kp_an *a, int64_t *by, int32_t y, int64_t bytes)
{
    int64_t alloc = bytes > 0 ? bytes : 0, count = bytes > 0;

    for (int32_t z = y; z >= 0; z = a->nodes[z].parent) {
        const struct an_node *n = &a->nodes[z];
        int64_t *v;

        if (n->type != NODE_OPERATOR || a->ops[n->op].name < 0) {
            continue;
        }
        v = &by[(size_t) a->ops[n->op].name * MEM_FIELDS];
        if (z == y) {
            v[0] += bytes;
            v[1] += alloc;
            v[2] += count;
        }
        v[3] += bytes;
        v[4] += alloc;
        v[5] += count;
    }
}

/* The memory events of r (by time) into w's sums; -ENOMEM. */
static int mem_read_events(const struct kp_an *a, const PGresult *r, struct mem_walk *w)
{
    size_t n = (size_t) PQntuples(r);

    for (size_t i = 0; i < n; i++) {
        int row = (int) i;
        int64_t ts = kp_pg_i64(r, row, 0, 0), bytes = kp_pg_i64(r, row, 1, 0),
                dtype = kp_pg_i64(r, row, 3, 0);
        int64_t dev = kp_pg_i64(r, row, 4, 0);
        int32_t root = kp__an_root_of(a, kp_pg_i64(r, row, 2, 0)), x;
        int slot;

        if (dtype == 0) {
            slot = 0;
        }
        else if (dtype == 1 && dev >= 0 && dev < KP_AN_MAX_GPUS) {
            slot = 1 + (int) dev;
        }
        else {
            continue;
        }
        if (!w->by[slot] && !(w->by[slot] = calloc(a->names.n + 1, MEM_FIELDS * sizeof(int64_t)))) {
            return -ENOMEM;
        }
        if (root < 0) {
            continue;
        }
        x = mem_innermost(a, w, root, ts);
        if (a->nodes[x].type == NODE_OPERATOR) {
            mem_add(a, w->by[slot], x, bytes);
        }
    }
    return 0;
}

static bool mem_row_empty(const int64_t *v)
{
    return !v[0] && !v[1] && !v[2] && !v[3] && !v[4] && !v[5];
}

/* out's rows: per seen slot, the names with any figure, each with its calls (the live operator
 * nodes of that name); -ENOMEM. */
static int mem_fill_rows(const struct kp_an *a, struct mem_walk *w, struct kp_an_memory *out)
{
    int64_t *calls = calloc(a->names.n + 1, sizeof(*calls));
    size_t n = 0;

    if (!calls) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        const struct an_node *x = &a->nodes[i];

        if (!x->dead && x->type == NODE_OPERATOR && a->ops[x->op].name >= 0) {
            calls[a->ops[x->op].name]++;
        }
    }
    for (int s = 0; s < MEM_SLOTS; s++) {
        for (size_t m = 0; w->by[s] && m < a->names.n; m++) {
            n += !mem_row_empty(&w->by[s][m * MEM_FIELDS]);
        }
    }
    if (!(out->rows = calloc(n + 1, sizeof(*out->rows)))) {
        free(calls);
        return -ENOMEM;
    }
    for (int s = 0; s < MEM_SLOTS; s++) {
        out->seen[s] = w->by[s] != NULL;
        for (size_t m = 0; w->by[s] && m < a->names.n; m++) {
            int64_t *v = &w->by[s][m * MEM_FIELDS];
            struct kp_an_mem_row *o = &out->rows[out->n_rows];

            if (mem_row_empty(v)) {
                continue;
            }
            v[6] = calls[m];
            o->slot = s;
            o->name = a->names.v[m].s;
            o->id = a->names.v[m].id;
            memcpy(o->v, v, sizeof(o->v));
            out->n_rows++;
        }
    }
    free(calls);
    return 0;
}

/* The memory view of a (a rank, or window w of one: its memory events, NULL: all) into *out.
 * Returns as kp_an_memory. */
static int mem_compute(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows,
                       const struct kp_an_window *win, struct kp_an_memory *out, char *errbuf,
                       size_t errlen)
{
    char runs[24], ranks[16], sql[384], host[96] = "", dev[128], chunk[192];
    const char *params[2] = { runs, ranks };
    PGresult *r = NULL;
    size_t budget = 0;
    struct mem_walk w = { 0 };
    int rc;

    memset(out, 0, sizeof(*out));
    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    if (win) {
        kp_an_window_sql(win, host, dev, chunk);
    }
    snprintf(sql, sizeof(sql),
             "SELECT start_ns, bytes, tid, device_type, device FROM memory_events" WHERE_RR
             "%s ORDER BY start_ns",
             host);
    rc = kp_an_query(c, 2, sql, params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    w.at = malloc((a->n_nodes + 1) * sizeof(*w.at));
    w.cursor = malloc((a->n_nodes + 1) * sizeof(*w.cursor));
    if (!w.at || !w.cursor) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i <= a->n_nodes; i++) {
        w.at[i] = -1;
        w.cursor[i] = -2;
    }
    rc = mem_read_events(a, r, &w);
    if (rc == 0) {
        rc = mem_fill_rows(a, &w, out);
    }
out:
    PQclear(r);
    free(w.at);
    free(w.cursor);
    for (int s = 0; s < MEM_SLOTS; s++) {
        free(w.by[s]);
    }
    if (rc < 0) {
        kp_an_memory_fini(out);
    }
    return rc;
}

int kp_an_memory(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows,
                 struct kp_an_memory *out, char *errbuf, size_t errlen)
{
    if (a->windowed) {
        memset(out, 0, sizeof(*out));
        if (!a->mem_done) {
            return -EINVAL; /* read by windows without the memory view */
        }
        memcpy(out->seen, a->mem.seen, sizeof(out->seen));
        if (!(out->rows = calloc(a->mem.n_rows + 1, sizeof(*out->rows)))) {
            return -ENOMEM;
        }
        if (a->mem.n_rows > 0) {
            memcpy(out->rows, a->mem.rows, a->mem.n_rows * sizeof(*out->rows));
        }
        out->n_rows = a->mem.n_rows;
        return 0;
    }
    return mem_compute(a, c, run, rank, max_rows, NULL, out, errbuf, errlen);
}

void kp_an_memory_fini(struct kp_an_memory *m)
{
    free(m->rows);
    memset(m, 0, sizeof(*m));
}

/* ---- the memory view by windows ------------------------------------------------------- */

/* A row of a window (or rows folded so far), keyed by (slot, name id): the view's order. */
struct mem_entry {
    int slot;
    int64_t id;
    const char *name; /* interned in the windowed handle */
    int64_t v[MEM_FIELDS];
};

/* Each window's memory rows and its operators' calls per name, appended; folded (sorted by
 * key, sums added) whenever they have doubled, so they stay near the rows the view has. The
 * calls count every operator of a name, with memory events in its window or not. */
struct kp__an_memfold {
    struct kp_an *h;
    bool seen[MEM_SLOTS];
    struct mem_entry *e, *calls; /* calls: slot 0, v[6] the count */
    size_t n_e, cap_e, folded_e, n_calls, cap_calls, folded_calls;
};

static int cmp_mem_entry(const void *pa, const void *pb)
{
    const struct mem_entry *x = pa, *y = pb;

    if (x->slot != y->slot) {
        return x->slot < y->slot ? -1 : 1;
    }
    return (x->id > y->id) - (x->id < y->id);
}

/* Sorts v[0..*n) by key and adds up the entries of a key. */
static void mem_fold(struct mem_entry *v, size_t *n)
{
    size_t k = 0;

    if (*n == 0) {
        return;
    }
    qsort(v, *n, sizeof(*v), cmp_mem_entry);
    for (size_t i = 1; i < *n; i++) {
        if (cmp_mem_entry(&v[k], &v[i]) == 0) {
            for (int f = 0; f < MEM_FIELDS; f++) {
                v[k].v[f] += v[i].v[f];
            }
        }
        else {
            v[++k] = v[i];
        }
    }
    *n = k + 1;
}

/* Appends an entry to *v (n, cap, folded as in struct kp__an_memfold). 0 or -ENOMEM. */
static int mem_push(struct mem_entry **v, size_t *n, size_t *cap, size_t *folded,
                    const struct mem_entry *x)
{
    if (*n == *cap) {
        size_t nc;
        struct mem_entry *g;

        if (*n > 2 * *folded + 256) { /* fold before growing */
            mem_fold(*v, n);
            *folded = *n;
        }
        nc = *n < *cap ? *cap : (*cap ? 2 * *cap : 256);
        if (nc != *cap) {
            if (!(g = realloc(*v, nc * sizeof(*g)))) {
                return -ENOMEM;
            }
            *v = g;
            *cap = nc;
        }
    }
    (*v)[(*n)++] = *x;
    return 0;
}

int kp__an_memfold_new(struct kp_an *h, struct kp__an_memfold **out)
{
    if (!(*out = calloc(1, sizeof(**out)))) {
        return -ENOMEM;
    }
    (*out)->h = h;
    return 0;
}

void kp__an_memfold_free(struct kp__an_memfold *f)
{
    if (f) {
        free(f->e);
        free(f->calls);
        free(f);
    }
}

int kp__an_memfold_add(struct kp__an_memfold *f, struct kp_an *a, PGconn *c, int64_t run, int rank,
                       size_t max_rows, const struct kp_an_window *w, char *errbuf, size_t errlen)
{
    struct kp_an_memory m;
    int64_t *calls;
    int rc = mem_compute(a, c, run, rank, max_rows, w, &m, errbuf, errlen);

    if (rc < 0) {
        return rc;
    }
    for (int s = 0; s < MEM_SLOTS; s++) {
        f->seen[s] = f->seen[s] || m.seen[s];
    }
    for (size_t i = 0; i < m.n_rows && rc == 0; i++) {
        struct mem_entry x = { .slot = m.rows[i].slot };

        memcpy(x.v, m.rows[i].v, sizeof(x.v));
        x.v[6] = 0; /* the calls come from every operator below */
        x.name = kp_an_pool_intern(&f->h->strs, m.rows[i].name);
        x.id = m.rows[i].id;
        rc = x.name ? mem_push(&f->e, &f->n_e, &f->cap_e, &f->folded_e, &x) : -ENOMEM;
    }
    kp_an_memory_fini(&m);
    /* every operator's calls, per name */
    if (rc == 0 && !(calls = calloc(a->names.n + 1, sizeof(*calls)))) {
        rc = -ENOMEM;
    }
    if (rc == 0) {
        for (size_t i = 0; i < a->n_nodes; i++) {
            const struct an_node *x = &a->nodes[i];

            if (!x->dead && x->type == NODE_OPERATOR && a->ops[x->op].name >= 0) {
                calls[a->ops[x->op].name]++;
            }
        }
        for (size_t k = 0; k < a->names.n && rc == 0; k++) {
            struct mem_entry x = { .slot = 0, .id = a->names.v[k].id };

            if (calls[k] == 0) {
                continue;
            }
            x.v[6] = calls[k];
            rc = mem_push(&f->calls, &f->n_calls, &f->cap_calls, &f->folded_calls, &x);
        }
        free(calls);
    }
    return rc;
}

int kp__an_memfold_finish(struct kp__an_memfold *f)
{
    struct kp_an *h = f->h;

    mem_fold(f->e, &f->n_e);
    mem_fold(f->calls, &f->n_calls);
    memset(&h->mem, 0, sizeof(h->mem));
    memcpy(h->mem.seen, f->seen, sizeof(h->mem.seen));
    if (!(h->mem.rows = calloc(f->n_e + 1, sizeof(*h->mem.rows)))) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < f->n_e; i++) {
        struct kp_an_mem_row *o = &h->mem.rows[h->mem.n_rows];
        struct mem_entry key = { .slot = 0, .id = f->e[i].id };
        const struct mem_entry *cl;

        if (mem_row_empty(f->e[i].v)) {
            continue;
        }
        cl = f->n_calls ? bsearch(&key, f->calls, f->n_calls, sizeof(key), cmp_mem_entry) : NULL;
        o->slot = f->e[i].slot;
        o->name = f->e[i].name;
        o->id = f->e[i].id;
        memcpy(o->v, f->e[i].v, sizeof(o->v));
        o->v[6] = cl ? cl->v[6] : 0;
        h->mem.n_rows++;
    }
    h->mem_done = true;
    return 0;
}

int kp_an_memory_json(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows, FILE *f,
                      char *errbuf, size_t errlen)
{
    struct kp_an_memory m;
    int n_dev = 0, rc, first_dev = 1;
    size_t i = 0;

    if ((rc = kp_an_memory(a, c, run, rank, max_rows, &m, errbuf, errlen)) < 0) {
        return rc;
    }
    for (int s = 0; s < MEM_SLOTS; s++) {
        n_dev += m.seen[s];
    }
    fprintf(f, "{\"device_count\": %d, \"devices\": {", n_dev);
    for (int s = 0; s < MEM_SLOTS; s++) {
        int first = 1;

        if (!m.seen[s]) {
            continue;
        }
        if (s == 0) {
            fprintf(f, "%s\"CPU\": {", first_dev ? "" : ", ");
        }
        else {
            fprintf(f, "%s\"GPU%d\": {", first_dev ? "" : ", ", s - 1);
        }
        first_dev = 0;
        for (; i < m.n_rows && m.rows[i].slot == s; i++) {
            const int64_t *v = m.rows[i].v;

            fprintf(f, "%s", first ? "" : ", ");
            first = 0;
            kp_json_fputs(f, m.rows[i].name);
            fprintf(f,
                    ": {\"self_increase_bytes\": %" PRId64 ", \"self_alloc_bytes\": %" PRId64
                    ", \"self_alloc_count\": %" PRId64 ", \"increase_bytes\": %" PRId64
                    ", \"alloc_bytes\": %" PRId64 ", \"alloc_count\": %" PRId64
                    ", \"calls\": %" PRId64 "}",
                    v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
        }
        fputc('}', f);
    }
    fprintf(f, "}}");
    kp_an_memory_fini(&m);
    return 0;
}
