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

/* Adds node x's self figures and those of its live descendants into its inclusive ones. */
static void mem_inclusive(const struct kp_an *a, int64_t *st, int32_t x)
{
    for (int32_t ch = a->nodes[x].first_child; ch >= 0; ch = a->nodes[ch].next_sib) {
        mem_inclusive(a, st, ch);
        for (int s = 0; s < MEM_SLOTS; s++) {
            for (int k = 0; k < 3; k++) {
                st[((size_t) x * MEM_SLOTS + s) * 3 + k] +=
                    st[((size_t) ch * MEM_SLOTS + s) * 3 + k];
            }
        }
    }
}

/* The innermost live node under x with start <= ts < end (x itself if none). */
static int32_t mem_innermost(const struct kp_an *a, int32_t x, int64_t ts)
{
    for (int32_t in = x; in >= 0;) {
        x = in;
        in = -1;
        for (int32_t ch = a->nodes[x].first_child; ch >= 0; ch = a->nodes[ch].next_sib) {
            if (!a->nodes[ch].dead && a->nodes[ch].start <= ts && ts < a->nodes[ch].end) {
                in = ch;
                break;
            }
        }
    }
    return x;
}

/* The memory events of r, each to the operator node it happened in: per (node, slot) the
 * bytes, the bytes allocated and the allocations into self; the slots seen into seen. */
static void mem_read_events(const struct kp_an *a, const PGresult *r, int64_t *self, bool *seen)
{
    size_t n = (size_t) PQntuples(r);

    for (size_t i = 0; i < n; i++) {
        int row = (int) i;
        int64_t ts = kp_pg_i64(r, row, 0, 0), bytes = kp_pg_i64(r, row, 1, 0),
                dtype = kp_pg_i64(r, row, 3, 0);
        int64_t dev = kp_pg_i64(r, row, 4, 0);
        int32_t x = kp__an_root_of(a, kp_pg_i64(r, row, 2, 0));
        int slot;
        int64_t *v;

        if (dtype == 0) {
            slot = 0;
        }
        else if (dtype == 1 && dev >= 0 && dev < KP_AN_MAX_GPUS) {
            slot = 1 + (int) dev;
        }
        else {
            continue;
        }
        seen[slot] = true;
        x = mem_innermost(a, x, ts);
        if (x < 0 || a->nodes[x].type != NODE_OPERATOR) {
            continue;
        }
        v = &self[((size_t) x * MEM_SLOTS + slot) * 3];
        v[0] += bytes;
        v[1] += bytes > 0 ? bytes : 0;
        v[2] += bytes > 0;
    }
}

/* The self and inclusive figures summed per operator name (and calls) into by_name. */
static void mem_sum_by_name(const struct kp_an *a, const int64_t *self, int64_t *incl,
                            int64_t *by_name)
{
    memcpy(incl, self, (a->n_nodes + 1) * MEM_SLOTS * 3 * sizeof(*incl));
    for (size_t i = 0; i < a->n_roots; i++) {
        mem_inclusive(a, incl, a->roots[i].node);
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        const struct an_node *x = &a->nodes[i];
        int32_t name;

        if (x->dead || x->type != NODE_OPERATOR || a->ops[x->op].name < 0) {
            continue;
        }
        name = a->ops[x->op].name;
        for (int s = 0; s < MEM_SLOTS; s++) {
            int64_t *v = &by_name[((size_t) name * MEM_SLOTS + s) * MEM_FIELDS];

            for (int k = 0; k < 3; k++) {
                v[k] += self[(i * MEM_SLOTS + s) * 3 + k];
                v[3 + k] += incl[(i * MEM_SLOTS + s) * 3 + k];
            }
            v[6]++;
        }
    }
}

static bool mem_row_empty(const int64_t *v)
{
    return !v[0] && !v[1] && !v[2] && !v[3] && !v[4] && !v[5];
}

/* out's rows: per seen slot, the names with any figure; -ENOMEM. */
static int mem_fill_rows(const struct kp_an *a, const int64_t *by_name, const bool *seen,
                         struct kp_an_memory *out)
{
    for (int s = 0; s < MEM_SLOTS; s++) {
        for (size_t m = 0; m < a->names.n; m++) {
            const int64_t *v = &by_name[(m * MEM_SLOTS + (size_t) s) * MEM_FIELDS];

            out->n_rows += seen[s] && !mem_row_empty(v);
        }
    }
    out->rows = calloc(out->n_rows + 1, sizeof(*out->rows));
    if (!out->rows) {
        return -ENOMEM;
    }
    out->n_rows = 0;
    for (int s = 0; s < MEM_SLOTS; s++) {
        out->seen[s] = seen[s];
        if (!seen[s]) {
            continue;
        }
        for (size_t m = 0; m < a->names.n; m++) {
            const int64_t *v = &by_name[(m * MEM_SLOTS + (size_t) s) * MEM_FIELDS];
            struct kp_an_mem_row *o = &out->rows[out->n_rows];

            if (mem_row_empty(v)) {
                continue;
            }
            o->slot = s;
            o->name = a->names.v[m].s;
            memcpy(o->v, v, sizeof(o->v));
            out->n_rows++;
        }
    }
    return 0;
}

int kp_an_memory(struct kp_an *a, PGconn *c, int64_t run, int rank, size_t max_rows,
                 struct kp_an_memory *out, char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    PGresult *r = NULL;
    size_t budget = 0;
    int64_t *self = NULL, *incl = NULL, *by_name = NULL;
    bool seen[MEM_SLOTS] = { false };
    int rc;

    memset(out, 0, sizeof(*out));
    if (!a->built && (rc = kp__an_build_model(a)) < 0) {
        return rc;
    }
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    rc = kp_an_query(c, 2,
                     "SELECT start_ns, bytes, tid, device_type, device FROM memory_events" WHERE_RR
                     " ORDER BY start_ns",
                     params, &budget, max_rows, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    self = calloc((a->n_nodes + 1) * MEM_SLOTS * 3, sizeof(*self));
    incl = calloc((a->n_nodes + 1) * MEM_SLOTS * 3, sizeof(*incl));
    by_name = calloc((a->names.n + 1) * MEM_SLOTS * MEM_FIELDS, sizeof(*by_name));
    if (!self || !incl || !by_name) {
        rc = -ENOMEM;
        goto out;
    }
    mem_read_events(a, r, self, seen);
    mem_sum_by_name(a, self, incl, by_name);
    rc = mem_fill_rows(a, by_name, seen, out);
out:
    PQclear(r);
    free(self);
    free(incl);
    free(by_name);
    return rc;
}

void kp_an_memory_fini(struct kp_an_memory *m)
{
    free(m->rows);
    memset(m, 0, sizeof(*m));
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
