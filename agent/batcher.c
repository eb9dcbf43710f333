/*
 * kp_batcher: see batcher.h for the rules. Structures:
 *  - corr: correlation id -> {api start, external_id} of every API record seen in this
 *    capture (u64map to an index in corrs[]), bounded by max_corr.
 *  - pend[]: held records, each live or dead; GPU records waiting for their API record are
 *    chained per correlation id (pend_map -> first index, next -> the following one). Dead
 *    entries are compacted away when they outnumber the live ones.
 *  - rows[]: the records of the batch being built, with their step and external_id.
 */
#define KP_LOG_MODULE "batcher"
#include "batcher.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kp_batch_builder.h"
#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_log.h"
#include "kprof.pb-c.h"

#define NONE UINT32_MAX

union rec {
    struct kp_wire_kernel k;
    struct kp_wire_memcpy m;
    struct kp_wire_memset s;
    struct kp_wire_api a;
    struct kp_wire_sync y;
    struct kp_wire_range r;
};

/* No step here: a launch's step is looked up when its GPU record is kept (keep), since the
 * STEP that began it may arrive after its API record. */
struct corr {
    int64_t api_start;
    uint64_t ext;
};

struct pend {
    union rec r;
    uint32_t kind;
    uint32_t next; /* the next entry waiting for the same API record, or NONE */
    bool live;
    bool wait_api;
};

struct row {
    union rec r;
    uint32_t kind;
    int32_t step;
    uint64_t ext;
};

struct step_mark {
    int64_t step, start;
};

struct u64map {
    uint64_t *k; /* 0: empty slot */
    uint32_t *v;
    size_t cap, n;
};

enum verdict {
    V_KEEP,
    V_WARMUP,
    V_AFTER,
    V_PEND_API,
    V_PEND_TIME,
};

enum phase {
    PH_PRE,
    PH_IN,
    PH_ENDED,
};

struct kp_batcher {
    struct kp_batcher_opts o;
    char *job, *host;
    enum phase phase;
    int64_t ws, we;      /* window [ws, we); we = INT64_MAX until known */
    int64_t inside_upto; /* times <= this (and >= ws) are known to be inside */
    int64_t last_time;   /* latest end seen (window end of a vanished process) */
    struct step_mark *steps;
    size_t n_steps, cap_steps;
    struct corr *corrs;
    size_t n_corrs, cap_corrs;
    struct u64map corr_map;
    struct pend *pend;
    size_t n_pend, cap_pend, live_pend, dead_pend, pend_scan;
    struct u64map pend_map;
    struct row *rows;
    size_t n_rows, cap_rows;
    long long first_row_ms;
    bool rank_info_sent; /* a batch carrying the RankInfo was emitted */
    bool steps_lost;     /* the last batch (with the steps rows) was refused */
    uint64_t lib_dropped, lib_cupti, lib_overhead;
    uint64_t inc_dropped, inc_cupti, inc_overhead;
    long long mal_next_ms;       /* next malformed log line allowed (mono ms); 0: none logged yet */
    uint64_t mal_logged;         /* stats.malformed at the last log line */
    struct kp_batch_builder *bb; /* the batch being cut */
    struct u64map str_ids;       /* wire string id -> its index in that batch */
    struct kp_batcher_stats st;
};

/* --- a small open-addressing map, u64 (nonzero) -> u32 --- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int map_grow(struct u64map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *k = calloc(cap, sizeof(*k));
    uint32_t *v = calloc(cap, sizeof(*v));

    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->k[i] != 0) {
            size_t j = mix(m->k[i]) & (cap - 1);

            while (k[j] != 0) {
                j = (j + 1) & (cap - 1);
            }
            k[j] = m->k[i];
            v[j] = m->v[i];
        }
    }
    free(m->k);
    free(m->v);
    m->k = k;
    m->v = v;
    m->cap = cap;
    return 0;
}

static uint32_t *map_get(const struct u64map *m, uint64_t key)
{
    if (m->cap == 0 || key == 0) {
        return NULL;
    }
    for (size_t j = mix(key) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        if (m->k[j] == key) {
            return &m->v[j];
        }
        if (m->k[j] == 0) {
            return NULL;
        }
    }
}

static int map_put(struct u64map *m, uint64_t key, uint32_t val)
{
    uint32_t *p = map_get(m, key);

    if (p != NULL) {
        *p = val;
        return 0;
    }
    if ((m->n + 1) * 2 > m->cap && map_grow(m) != 0) {
        return -ENOMEM;
    }
    size_t j = mix(key) & (m->cap - 1);
    while (m->k[j] != 0) {
        j = (j + 1) & (m->cap - 1);
    }
    m->k[j] = key;
    m->v[j] = val;
    m->n++;
    return 0;
}

static void map_clear(struct u64map *m)
{
    if (m->cap > 0) {
        memset(m->k, 0, m->cap * sizeof(*m->k));
    }
    m->n = 0;
}

static void map_free(struct u64map *m)
{
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof(*m));
}

/* --- helpers --- */

static bool is_gpu(uint32_t kind)
{
    return kind == KP_REC_KERNEL || kind == KP_REC_MEMCPY || kind == KP_REC_MEMSET;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;

    if (__builtin_add_overflow(a, b, &r) || r > INT64_MAX) {
        return INT64_MAX;
    }
    return r;
}

static const char *kind_name(uint32_t kind)
{
    switch (kind) {
    case KP_REC_KERNEL:
        return "kernel";
    case KP_REC_MEMCPY:
        return "memcpy";
    case KP_REC_MEMSET:
        return "memset";
    case KP_REC_API:
        return "api";
    case KP_REC_SYNC:
        return "sync";
    case KP_REC_RANGE:
        return "range";
    default:
        return "step";
    }
}

/* Counts one malformed record (or STEP) and logs it, rate-limited (batcher.h). */
static void malformed(struct kp_batcher *b, uint32_t kind, const char *field, int64_t sv,
                      uint64_t uv, bool is_signed)
{
    long long now;
    char val[24];

    b->st.malformed++;
    now = kp_mono_ms();
    if (b->mal_next_ms != 0 && now < b->mal_next_ms) {
        return;
    }
    if (is_signed) {
        snprintf(val, sizeof(val), "%" PRId64, sv);
    }
    else {
        snprintf(val, sizeof(val), "%" PRIu64, uv);
    }
    kp_log_warn("malformed record dropped run=%" PRIu64 " rank=%u kind=%s field=%s value=%s "
                "malformed=%" PRIu64 " since_last_log=%" PRIu64
                " (the process's libkprof_inject.so sent a value out of range: a bug or a version "
                "mismatch; the other records are kept)",
                b->o.run_id, b->o.rank, kind_name(kind), field, val, b->st.malformed,
                b->st.malformed - b->mal_logged);
    b->mal_logged = b->st.malformed;
    b->mal_next_ms = now + KP_BATCHER_MALFORMED_LOG_MS;
}

/* An id column: 0xFFFFFFFF (CUPTI's "not applicable") becomes 0; true if it then fits max. */
static bool fix_id(uint32_t *v, int64_t max)
{
    if (*v == UINT32_MAX) {
        *v = 0;
    }
    return (int64_t) *v <= max;
}

#define CHECK_U32(field, max)            \
    do {                                 \
        if ((int64_t) (field) > (max)) { \
            bad = #field;                \
            uv = (field);                \
            goto fail;                   \
        }                                \
    } while (0)
#define CHECK_ID(field, max)            \
    do {                                \
        uv = (field);                   \
        if (!fix_id(&(field), (max))) { \
            bad = #field;               \
            goto fail;                  \
        }                               \
    } while (0)
#define CHECK_U64(field)                      \
    do {                                      \
        if ((field) > (uint64_t) INT64_MAX) { \
            bad = #field;                     \
            uv = (field);                     \
            goto fail;                        \
        }                                     \
    } while (0)

/*
 * Checks a record from the wire against its columns' SQL ranges (batcher.h), replacing the
 * "not applicable" ids by 0 in place. Returns true if it may go on; false if it was counted
 * as malformed (and logged).
 */
static bool rec_check(struct kp_batcher *b, uint32_t kind, union rec *r)
{
    const char *bad = NULL;
    uint64_t uv = 0;
    int64_t sv = 0;
    bool is_signed = false;

    if (r->k.start_ns < 0) {
        bad = "start_ns";
        sv = r->k.start_ns;
        is_signed = true;
        goto fail;
    }
    if (r->k.end_ns < r->k.start_ns) {
        bad = "end_ns";
        sv = r->k.end_ns;
        is_signed = true;
        goto fail;
    }
    switch (kind) {
    case KP_REC_KERNEL: {
        struct kp_wire_kernel *k = &r->k;

        CHECK_U64(k->correlation);
        CHECK_U64(k->graph_node_id);
        CHECK_ID(k->device, INT16_MAX);
        CHECK_ID(k->context, INT32_MAX);
        CHECK_ID(k->stream, INT32_MAX);
        CHECK_U32(k->grid_x, INT32_MAX);
        CHECK_U32(k->grid_y, INT32_MAX);
        CHECK_U32(k->grid_z, INT32_MAX);
        CHECK_U32(k->block_x, INT16_MAX);
        CHECK_U32(k->block_y, INT16_MAX);
        CHECK_U32(k->block_z, INT16_MAX);
        CHECK_U32(k->registers, INT16_MAX);
        CHECK_U32(k->static_smem, INT32_MAX);
        CHECK_U32(k->dynamic_smem, INT32_MAX);
        CHECK_U32(k->graph_id, INT32_MAX);
        break;
    }
    case KP_REC_MEMCPY: {
        struct kp_wire_memcpy *m = &r->m;

        CHECK_U64(m->bytes);
        CHECK_U64(m->correlation);
        CHECK_U32(m->copy_kind, INT16_MAX);
        CHECK_U32(m->src_kind, INT16_MAX);
        CHECK_U32(m->dst_kind, INT16_MAX);
        CHECK_ID(m->device, INT16_MAX);
        CHECK_ID(m->context, INT32_MAX);
        CHECK_ID(m->stream, INT32_MAX);
        CHECK_ID(m->src_device, INT16_MAX);
        CHECK_ID(m->dst_device, INT16_MAX);
        break;
    }
    case KP_REC_MEMSET: {
        struct kp_wire_memset *m = &r->s;

        CHECK_U64(m->bytes);
        CHECK_U64(m->correlation);
        CHECK_U32(m->mem_kind, INT16_MAX);
        CHECK_ID(m->device, INT16_MAX);
        CHECK_ID(m->context, INT32_MAX);
        CHECK_ID(m->stream, INT32_MAX);
        break;
    }
    case KP_REC_API: {
        struct kp_wire_api *a = &r->a;

        CHECK_U64(a->correlation);
        CHECK_U64(a->external_id);
        CHECK_U64(a->tid);
        CHECK_U32(a->domain, INT16_MAX);
        CHECK_U32(a->cbid, INT32_MAX);
        break;
    }
    case KP_REC_SYNC: {
        struct kp_wire_sync *y = &r->y;

        CHECK_U64(y->correlation);
        CHECK_U32(y->sync_type, INT16_MAX);
        CHECK_ID(y->device, INT16_MAX);
        CHECK_ID(y->context, INT32_MAX);
        CHECK_ID(y->stream, INT32_MAX);
        CHECK_ID(y->cuda_event, INT64_MAX);
        break;
    }
    case KP_REC_RANGE: {
        struct kp_wire_range *g = &r->r;

        CHECK_U64(g->range_id);
        CHECK_U64(g->parent_id);
        CHECK_U64(g->tid);
        CHECK_U32(g->kind, INT16_MAX);
        break;
    }
    default:
        break;
    }
    return true;
fail:
    /* "k->device" -> "device" */
    if (strchr(bad, '>') != NULL) {
        bad = strchr(bad, '>') + 1;
    }
    malformed(b, kind, bad, sv, uv, is_signed);
    return false;
}

#undef CHECK_U32
#undef CHECK_ID
#undef CHECK_U64

static int64_t rec_start(uint32_t kind, const union rec *r)
{
    return r->k.start_ns; /* every record struct begins with start_ns, end_ns */
}

static int64_t rec_end(uint32_t kind, const union rec *r)
{
    return r->k.end_ns;
}

static uint64_t rec_corr(uint32_t kind, const union rec *r)
{
    switch (kind) {
    case KP_REC_KERNEL:
        return r->k.correlation;
    case KP_REC_MEMCPY:
        return r->m.correlation;
    case KP_REC_MEMSET:
        return r->s.correlation;
    case KP_REC_API:
        return r->a.correlation;
    case KP_REC_SYNC:
        return r->y.correlation;
    default:
        return 0;
    }
}

/* The last step that started at or before t, or -1. */
static int32_t step_of(const struct kp_batcher *b, int64_t t)
{
    size_t lo = 0, hi = b->n_steps;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;

        if (b->steps[mid].start <= t) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    if (lo == 0) {
        return -1;
    }
    int64_t s = b->steps[lo - 1].step;
    return s > INT32_MAX ? INT32_MAX : (s < INT32_MIN ? INT32_MIN : (int32_t) s);
}

static const struct corr *corr_find(const struct kp_batcher *b, uint64_t c)
{
    const uint32_t *i = map_get(&b->corr_map, c);

    return i != NULL ? &b->corrs[*i] : NULL;
}

static void corr_remember(struct kp_batcher *b, const struct kp_wire_api *a)
{
    uint32_t *i;

    if (a->correlation == 0 || a->domain == 3) {
        return; /* overhead records launch nothing */
    }
    if ((i = map_get(&b->corr_map, a->correlation)) != NULL) {
        b->corrs[*i].api_start = a->start_ns;
        b->corrs[*i].ext = a->external_id;
        return;
    }
    if (b->n_corrs >= b->o.max_corr) {
        b->st.corr_full++;
        return;
    }
    if (b->n_corrs == b->cap_corrs) {
        size_t cap = b->cap_corrs ? b->cap_corrs * 2 : 1024;
        struct corr *n = realloc(b->corrs, cap * sizeof(*n));

        if (n == NULL) {
            b->st.corr_full++;
            return;
        }
        b->corrs = n;
        b->cap_corrs = cap;
    }
    if (map_put(&b->corr_map, a->correlation, (uint32_t) b->n_corrs) != 0) {
        b->st.corr_full++;
        return;
    }
    b->corrs[b->n_corrs].api_start = a->start_ns;
    b->corrs[b->n_corrs].ext = a->external_id;
    b->n_corrs++;
}

/* Where a record goes. final: nothing more will arrive (decide by what is known). */
static enum verdict decide(const struct kp_batcher *b, uint32_t kind, const union rec *r,
                           bool final)
{
    int64_t t = rec_start(kind, r);

    if (kind == KP_REC_RANGE) {
        if (r->r.end_ns <= b->ws && r->r.start_ns < b->ws) {
            return V_WARMUP;
        }
        if (t >= b->we) {
            return V_AFTER;
        }
        return final || t <= b->inside_upto ? V_KEEP : V_PEND_TIME;
    }
    if (is_gpu(kind)) {
        const struct corr *c = corr_find(b, rec_corr(kind, r));

        if (c != NULL) {
            t = c->api_start;
        }
        else if (!final && rec_corr(kind, r) != 0 && (b->o.activities & KP_ACT_RUNTIME) != 0) {
            return V_PEND_API;
        }
    }
    if (t < b->ws) {
        return V_WARMUP;
    }
    if (t >= b->we) {
        return V_AFTER;
    }
    return final || t <= b->inside_upto ? V_KEEP : V_PEND_TIME;
}

static void cut(struct kp_batcher *b, bool last);

static void keep(struct kp_batcher *b, uint32_t kind, const union rec *r)
{
    struct row *w;

    if (b->n_rows == b->cap_rows) {
        size_t cap = b->cap_rows ? b->cap_rows * 2 : 256;
        struct row *n;

        if (cap > b->o.batch_rows) {
            cap = b->o.batch_rows;
        }
        if ((n = realloc(b->rows, cap * sizeof(*n))) == NULL) {
            b->inc_dropped = sat_add(b->inc_dropped, 1);
            return;
        }
        b->rows = n;
        b->cap_rows = cap;
    }
    w = &b->rows[b->n_rows++];
    w->r = *r;
    w->kind = kind;
    w->ext = 0;
    if (is_gpu(kind)) {
        const struct corr *c = corr_find(b, rec_corr(kind, r));

        w->step = step_of(b, c != NULL ? c->api_start : rec_start(kind, r));
        w->ext = c != NULL ? c->ext : 0;
    }
    else {
        w->step = step_of(b, rec_start(kind, r));
        if (kind == KP_REC_API) {
            w->ext = r->a.external_id;
        }
        else if (kind == KP_REC_RANGE) {
            w->ext = r->r.range_id;
        }
    }
    if (b->n_rows == 1) {
        b->first_row_ms = kp_mono_ms();
    }
    b->st.kept++;
    if (b->n_rows >= b->o.batch_rows) {
        cut(b, false);
    }
}

/* Applies a verdict for a record that is not in the pending list. */
static void pend_add(struct kp_batcher *b, uint32_t kind, const union rec *r, bool wait_api);

static void apply(struct kp_batcher *b, uint32_t kind, const union rec *r, enum verdict v)
{
    switch (v) {
    case V_KEEP:
        keep(b, kind, r);
        break;
    case V_WARMUP:
        b->st.warmup++;
        break;
    case V_AFTER:
        b->st.after++;
        break;
    case V_PEND_API:
        pend_add(b, kind, r, true);
        break;
    case V_PEND_TIME:
        pend_add(b, kind, r, false);
        break;
    }
}

static void pend_kill(struct kp_batcher *b, struct pend *p)
{
    p->live = false;
    b->live_pend--;
    b->dead_pend++;
}

static void pend_compact(struct kp_batcher *b)
{
    size_t j = 0;

    map_clear(&b->pend_map);
    for (size_t i = 0; i < b->n_pend; i++) {
        if (!b->pend[i].live) {
            continue;
        }
        b->pend[j] = b->pend[i];
        b->pend[j].next = NONE;
        if (b->pend[j].wait_api) {
            uint64_t c = rec_corr(b->pend[j].kind, &b->pend[j].r);
            uint32_t *h = map_get(&b->pend_map, c);

            b->pend[j].next = h != NULL ? *h : NONE;
            if (map_put(&b->pend_map, c, (uint32_t) j) != 0) {
                b->pend[j].wait_api = false; /* decided by time instead */
            }
        }
        j++;
    }
    b->n_pend = j;
    b->dead_pend = 0;
    b->pend_scan = 0;
}

/* The list is full: decide the oldest live entry now. */
static void pend_force_oldest(struct kp_batcher *b)
{
    while (b->pend_scan < b->n_pend && !b->pend[b->pend_scan].live) {
        b->pend_scan++;
    }
    if (b->pend_scan >= b->n_pend) {
        return;
    }
    struct pend *p = &b->pend[b->pend_scan];
    union rec r = p->r;
    uint32_t kind = p->kind;

    pend_kill(b, p);
    b->st.forced++;
    if (b->phase == PH_PRE) {
        b->st.warmup++; /* held before the window: overwhelmingly warm-up */
        return;
    }
    apply(b, kind, &r, decide(b, kind, &r, true));
}

static void pend_add(struct kp_batcher *b, uint32_t kind, const union rec *r, bool wait_api)
{
    struct pend *p;

    if (b->live_pend >= b->o.max_pending) {
        pend_force_oldest(b);
    }
    if (b->n_pend == b->cap_pend) {
        if (b->dead_pend > 0 && b->dead_pend * 2 >= b->n_pend) {
            pend_compact(b);
        }
        if (b->n_pend == b->cap_pend) {
            size_t cap = b->cap_pend ? b->cap_pend * 2 : 256;
            struct pend *n;

            if (cap > b->o.max_pending * 2) {
                cap = b->o.max_pending * 2;
            }
            if (cap <= b->n_pend || (n = realloc(b->pend, cap * sizeof(*n))) == NULL) {
                pend_compact(b);
                if (b->n_pend == b->cap_pend) {
                    b->inc_dropped = sat_add(b->inc_dropped, 1);
                    return;
                }
            }
            else {
                b->pend = n;
                b->cap_pend = cap;
            }
        }
    }
    p = &b->pend[b->n_pend];
    p->r = *r;
    p->kind = kind;
    p->live = true;
    p->wait_api = wait_api;
    p->next = NONE;
    if (wait_api) {
        uint64_t c = rec_corr(kind, r);
        uint32_t *h = map_get(&b->pend_map, c);

        p->next = h != NULL ? *h : NONE;
        if (map_put(&b->pend_map, c, (uint32_t) b->n_pend) != 0) {
            p->wait_api = false;
            p->next = NONE;
        }
    }
    b->n_pend++;
    b->live_pend++;
}

/* The API record of correlation c arrived: decide the GPU records that waited for it. */
static void pend_resolve_corr(struct kp_batcher *b, uint64_t c)
{
    uint32_t *h = map_get(&b->pend_map, c);
    uint32_t i;

    if (h == NULL || *h == NONE) {
        return;
    }
    i = *h;
    *h = NONE;
    while (i != NONE) {
        struct pend *p = &b->pend[i];
        uint32_t next = p->next;

        if (p->live && p->wait_api) {
            enum verdict v;

            p->wait_api = false;
            p->next = NONE;
            v = decide(b, p->kind, &p->r, false);
            if (v != V_PEND_TIME && v != V_PEND_API) {
                union rec r = p->r;
                uint32_t kind = p->kind;

                pend_kill(b, p);
                apply(b, kind, &r, v); /* keep() never touches pend[] */
            }
        }
        i = next;
    }
}

/* Re-decides the held records (the window's bounds moved). final: decide them all. */
static void pend_rescan(struct kp_batcher *b, bool final)
{
    for (size_t i = 0; i < b->n_pend; i++) {
        struct pend *p = &b->pend[i];
        enum verdict v;

        if (!p->live || (p->wait_api && !final)) {
            continue;
        }
        v = decide(b, p->kind, &p->r, final);
        if (v == V_PEND_TIME || v == V_PEND_API) {
            if (v == V_PEND_API && !p->wait_api) {
                /* held before BEGIN without its API record: chain it now */
                uint64_t c = rec_corr(p->kind, &p->r);
                uint32_t *h = map_get(&b->pend_map, c);

                p->next = h != NULL ? *h : NONE;
                if (map_put(&b->pend_map, c, (uint32_t) i) == 0) {
                    p->wait_api = true;
                }
                else {
                    p->next = NONE;
                }
            }
            continue;
        }
        union rec r = p->r;
        uint32_t kind = p->kind;

        pend_kill(b, p);
        apply(b, kind, &r, v);
    }
    if (final) {
        b->n_pend = b->live_pend = b->dead_pend = b->pend_scan = 0;
        map_clear(&b->pend_map);
    }
}

/* --- batch building --- */

/* The columns a capture leaves out (NULL in PostgreSQL): kernels' occupancy figures and the
 * copies' bandwidth come only from imported traces (a capture that set them would write a
 * side-table row per event); the wire's ranges carry no fwd_tid, dtypes, device or stream. */
static const struct kp_batch_builder_rule capture_cols[] = {
    { KP_EV_KERNEL, "blocks_per_sm", KP_BB_NEVER, 0 },
    { KP_EV_KERNEL, "est_occupancy", KP_BB_NEVER, 0 },
    { KP_EV_MEMCPY, "bandwidth_gbps", KP_BB_NEVER, 0 },
    { KP_EV_MEMSET, "bandwidth_gbps", KP_BB_NEVER, 0 },
    { KP_EV_OP, "fwd_tid", KP_BB_NEVER, 0 },
    { KP_EV_OP, "input_dtypes", KP_BB_NEVER, 0 },
    { KP_EV_OP, "device", KP_BB_NEVER, 0 },
    { KP_EV_OP, "stream", KP_BB_NEVER, 0 },
};

/* Wire record kinds: the last one + 1. */
#define N_REC (KP_REC_RANGE + 1)

/* The event kind of each wire record kind. */
static const enum kp_event_kind rec_kind[N_REC] = {
    [KP_REC_KERNEL] = KP_EV_KERNEL, [KP_REC_MEMCPY] = KP_EV_MEMCPY, [KP_REC_MEMSET] = KP_EV_MEMSET,
    [KP_REC_API] = KP_EV_API,       [KP_REC_SYNC] = KP_EV_SYNC,     [KP_REC_RANGE] = KP_EV_OP,
};

/* The batch's index of wire string id (0: none), its text added on first use. */
static uint32_t intern(struct kp_batcher *b, uint32_t id)
{
    const uint32_t *hit;
    const char *text;
    size_t len = 0;
    int64_t idx;

    if (id == 0) {
        return 0;
    }
    if ((hit = map_get(&b->str_ids, id)) != NULL) {
        return *hit;
    }
    text = b->o.strings != NULL ? b->o.strings(b->o.ud, id, &len) : NULL;
    if (text == NULL) {
        b->st.missing_strings++;
        return 0;
    }
    if (len > KP_CODEC_DEFAULT_MAX_NAME_BYTES) {
        len = KP_CODEC_DEFAULT_MAX_NAME_BYTES;
        while (len > 0 && ((unsigned char) text[len] & 0xc0) == 0x80) {
            len--;
        }
    }
    if (!kp_utf8_valid(text, len)) {
        b->st.missing_strings++;
        return 0;
    }
    if (kp_batch_builder_strings(b->bb) >= KP_CODEC_DEFAULT_MAX_STRINGS) {
        b->st.missing_strings++; /* the batch's table is full (batch_rows near 1M) */
        return 0;
    }
    /* borrowed: the text lives until the batch is packed */
    if ((idx = kp_batch_builder_string(b->bb, text, len)) < 0) {
        return 0;
    }
    if (map_put(&b->str_ids, id, (uint32_t) idx) != 0) {
        return 0;
    }
    return (uint32_t) idx;
}

/* end - start, both >= 0 (rec_check, kp_batcher_step): never above INT64_MAX. */
static uint64_t dur(int64_t start, int64_t end)
{
    return end > start ? (uint64_t) end - (uint64_t) start : 0;
}

/* The tables of the batch being cut, looked up once per cut. */
struct tables {
    Kprof__V1__Kernels *kk;
    Kprof__V1__Memcpys *mc;
    Kprof__V1__Memsets *ms;
    Kprof__V1__ApiCalls *ap;
    Kprof__V1__Syncs *sy;
    Kprof__V1__Ops *op;
};

/* Writes row w at index j of its kind's table (start_ns absolute). */
static void put_row(struct kp_batcher *b, const struct tables *t, const struct row *w, size_t j)
{
    int64_t s = rec_start(w->kind, &w->r);
    uint64_t d = dur(s, rec_end(w->kind, &w->r));

    switch (w->kind) {
    case KP_REC_KERNEL: {
        const struct kp_wire_kernel *r = &w->r.k;
        Kprof__V1__Kernels *kk = t->kk;
        kk->start_ns[j] = s;
        kk->dur_ns[j] = d;
        kk->name[j] = intern(b, r->name);
        kk->device[j] = r->device;
        kk->context[j] = r->context;
        kk->stream[j] = r->stream;
        kk->correlation[j] = r->correlation;
        kk->external_id[j] = w->ext;
        kk->grid_x[j] = r->grid_x;
        kk->grid_y[j] = r->grid_y;
        kk->grid_z[j] = r->grid_z;
        kk->block_x[j] = r->block_x;
        kk->block_y[j] = r->block_y;
        kk->block_z[j] = r->block_z;
        kk->registers[j] = r->registers;
        kk->static_smem[j] = r->static_smem;
        kk->dynamic_smem[j] = r->dynamic_smem;
        kk->graph_id[j] = r->graph_id;
        kk->graph_node_id[j] = r->graph_node_id;
        kk->step[j] = w->step;
        break;
    }
    case KP_REC_MEMCPY: {
        const struct kp_wire_memcpy *r = &w->r.m;
        Kprof__V1__Memcpys *mc = t->mc;
        mc->start_ns[j] = s;
        mc->dur_ns[j] = d;
        mc->bytes[j] = r->bytes;
        mc->copy_kind[j] = r->copy_kind;
        mc->src_kind[j] = r->src_kind;
        mc->dst_kind[j] = r->dst_kind;
        mc->device[j] = r->device;
        mc->context[j] = r->context;
        mc->stream[j] = r->stream;
        mc->correlation[j] = r->correlation;
        mc->external_id[j] = w->ext;
        mc->src_device[j] = r->src_device;
        mc->dst_device[j] = r->dst_device;
        mc->step[j] = w->step;
        break;
    }
    case KP_REC_MEMSET: {
        const struct kp_wire_memset *r = &w->r.s;
        Kprof__V1__Memsets *ms = t->ms;
        ms->start_ns[j] = s;
        ms->dur_ns[j] = d;
        ms->bytes[j] = r->bytes;
        ms->value[j] = r->value;
        ms->mem_kind[j] = r->mem_kind;
        ms->device[j] = r->device;
        ms->context[j] = r->context;
        ms->stream[j] = r->stream;
        ms->correlation[j] = r->correlation;
        ms->external_id[j] = w->ext;
        ms->step[j] = w->step;
        break;
    }
    case KP_REC_API: {
        const struct kp_wire_api *r = &w->r.a;
        Kprof__V1__ApiCalls *ap = t->ap;
        ap->start_ns[j] = s;
        ap->dur_ns[j] = d;
        ap->domain[j] = r->domain;
        ap->cbid[j] = r->cbid;
        ap->name[j] = intern(b, r->name);
        ap->tid[j] = r->tid;
        ap->correlation[j] = r->correlation;
        ap->external_id[j] = w->ext;
        ap->return_value[j] = r->return_value;
        ap->step[j] = w->step;
        break;
    }
    case KP_REC_SYNC: {
        const struct kp_wire_sync *r = &w->r.y;
        Kprof__V1__Syncs *sy = t->sy;
        sy->start_ns[j] = s;
        sy->dur_ns[j] = d;
        sy->sync_type[j] = r->sync_type;
        sy->device[j] = r->device;
        sy->context[j] = r->context;
        sy->stream[j] = r->stream;
        sy->cuda_event[j] = r->cuda_event;
        sy->correlation[j] = r->correlation;
        sy->step[j] = w->step;
        break;
    }
    case KP_REC_RANGE: {
        const struct kp_wire_range *r = &w->r.r;
        Kprof__V1__Ops *op = t->op;
        op->start_ns[j] = s;
        op->dur_ns[j] = d;
        op->name[j] = intern(b, r->name);
        op->kind[j] = r->kind;
        op->tid[j] = r->tid;
        op->op_id[j] = r->range_id;
        op->parent_id[j] = r->parent_id;
        op->seq[j] = r->seq;
        op->input_shapes[j] = intern(b, r->shapes);
        op->external_id[j] = r->range_id;
        op->domain[j] = intern(b, r->domain);
        op->step[j] = w->step;
        break;
    }
    default:
        break;
    }
}

static void cut(struct kp_batcher *b, bool last)
{
    static const struct kp_batch_limits limits = {
        .max_name_bytes = KP_CODEC_DEFAULT_MAX_NAME_BYTES,
        .max_strings = KP_CODEC_DEFAULT_MAX_STRINGS,
        .max_rows = KP_CODEC_DEFAULT_MAX_ROWS,
    };
    Kprof__V1__Batch *batch;
    struct tables t;
    Kprof__V1__RankInfo ri = KPROF__V1__RANK_INFO__INIT;
    Kprof__V1__CaptureStats cs = KPROF__V1__CAPTURE_STATS__INIT;
    size_t n[N_REC] = { 0 }, at[N_REC] = { 0 }, n_steps = 0;
    int64_t base;
    bool oom = false, retry_last = false;
    uint8_t *buf = NULL;
    size_t len, rows = b->n_rows;
    char err[512];
    int rc;

    map_clear(&b->str_ids);
    /* steps rows go into the last batch (not into the count-only one that follows a refused
     * last batch) */
    if (last && !b->steps_lost) {
        for (size_t i = 0; i < b->n_steps; i++) {
            if (b->steps[i].start >= b->ws && b->steps[i].start < b->we) {
                n_steps++;
            }
        }
    }
    for (size_t i = 0; i < b->n_rows; i++) {
        n[b->rows[i].kind]++;
    }
    base = b->n_rows > 0 ? rec_start(b->rows[0].kind, &b->rows[0].r) : b->ws;
    if (base == INT64_MIN || base < 0) {
        base = 0;
    }
    for (int k = KP_REC_KERNEL; k < N_REC; k++) {
        if (n[k] > 0 && kp_batch_builder_add(b->bb, rec_kind[k], n[k]) < 0) {
            oom = true;
        }
    }
    if (n_steps > 0 && kp_batch_builder_add(b->bb, KP_EV_STEP, n_steps) < 0) {
        oom = true;
    }
    if (oom) {
        goto out;
    }
    t.kk = kp_batch_builder_table(b->bb, KP_EV_KERNEL);
    t.mc = kp_batch_builder_table(b->bb, KP_EV_MEMCPY);
    t.ms = kp_batch_builder_table(b->bb, KP_EV_MEMSET);
    t.ap = kp_batch_builder_table(b->bb, KP_EV_API);
    t.sy = kp_batch_builder_table(b->bb, KP_EV_SYNC);
    t.op = kp_batch_builder_table(b->bb, KP_EV_OP);
    for (size_t i = 0; i < b->n_rows; i++) {
        put_row(b, &t, &b->rows[i], at[b->rows[i].kind]++);
    }
    if (n_steps) {
        Kprof__V1__Steps *stp = kp_batch_builder_table(b->bb, KP_EV_STEP);
        size_t j = 0;

        for (size_t i = 0; i < b->n_steps; i++) {
            int64_t s = b->steps[i].start, e;

            if (s < b->ws || s >= b->we) {
                continue;
            }
            e = i + 1 < b->n_steps && b->steps[i + 1].start <= b->we ? b->steps[i + 1].start
                                                                     : b->we;
            stp->step[j] = b->steps[i].step;
            stp->start_ns[j] = s;
            stp->dur_ns[j] = dur(s, e);
            j++;
        }
        rows += n_steps;
        b->st.kept += n_steps;
    }
    batch = kp_batch_builder_finish(b->bb, base, NULL);
    batch->run_id = b->o.run_id;
    batch->rank = b->o.rank;
    if (!b->rank_info_sent) {
        ri.job = b->job;
        ri.host = b->host;
        ri.pid = b->o.pid;
        ri.local_rank = b->o.local_rank;
        ri.world_size = b->o.world_size;
        ri.device = b->o.device;
        batch->rank_info = &ri;
    }
    if (b->inc_dropped || b->inc_cupti || b->inc_overhead) {
        cs.records_dropped = b->inc_dropped;
        cs.cupti_dropped = b->inc_cupti;
        cs.overhead_ns = b->inc_overhead;
        batch->stats = &cs;
    }
    if ((rc = kp_batch_validate(batch, &limits, err, sizeof(err))) != 0) {
        b->st.invalid++;
        kp_log_error("built an invalid batch (a kprof bug; dropped) run=%" PRIu64
                     " rank=%u rows=%zu err=\"%s\"",
                     b->o.run_id, b->o.rank, rows, err);
        goto out;
    }
    len = kprof__v1__batch__get_packed_size(batch);
    if ((buf = malloc(len ? len : 1)) == NULL) {
        oom = true;
        goto out;
    }
    kprof__v1__batch__pack(batch, buf);
    if (b->o.emit(b->o.ud, buf, len, rows, last) != 0) {
        /* Refused (spool full): its rows are lost, and its counts must not be. They ride on
         * the next batch; a refused last batch is followed by one with no rows, which the
         * emit callback admits from the spool's tail reserve, so the final count arrives. */
        b->st.emit_failed++;
        b->inc_dropped = sat_add(b->inc_dropped, rows);
        retry_last = last && rows > 0;
        b->steps_lost |= last;
    }
    else {
        b->st.batches++;
        b->st.bytes += len;
        b->rank_info_sent = true;
        b->inc_dropped = b->inc_cupti = b->inc_overhead = 0;
    }
out:
    if (oom) {
        kp_log_error("out of memory building a batch run=%" PRIu64 " rank=%u rows=%zu", b->o.run_id,
                     b->o.rank, rows);
        b->inc_dropped = sat_add(b->inc_dropped, b->n_rows);
    }
    free(buf);
    kp_batch_builder_next(b->bb);
    b->n_rows = 0;
    if (retry_last) {
        cut(b, true); /* no rows now: the count-only last batch, tried once */
    }
}

/* --- public --- */

/* A copy of s (NULL: "") that kp_batch_validate accepts: at most the name limit, each byte
 * that does not start a valid UTF-8 sequence replaced by '?'. Returns owned, or NULL. */
static char *clean_text(const char *s)
{
    size_t n = s != NULL ? strnlen(s, KP_CODEC_DEFAULT_MAX_NAME_BYTES) : 0, j = 0;
    char *out = malloc(n + 1);

    if (out == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char) s[i];
        size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;

        if (len <= n - i && kp_utf8_valid(s + i, len)) {
            memcpy(out + j, s + i, len);
            j += len;
            i += len;
        }
        else {
            out[j++] = '?';
            i++;
        }
    }
    out[j] = '\0';
    return out;
}

int kp_batcher_create(const struct kp_batcher_opts *o, struct kp_batcher **out)
{
    struct kp_batcher *b;

    *out = NULL;
    if (o == NULL || o->emit == NULL || o->run_id == 0 || o->run_id > INT32_MAX ||
        o->rank > INT32_MAX) {
        return -EINVAL;
    }
    if ((b = calloc(1, sizeof(*b))) == NULL) {
        return -ENOMEM;
    }
    b->o = *o;
    b->o.batch_rows = o->batch_rows ? o->batch_rows : KP_BATCHER_DEFAULT_ROWS;
    b->o.max_pending = o->max_pending ? o->max_pending : KP_BATCHER_DEFAULT_PENDING;
    b->o.max_corr = o->max_corr ? o->max_corr : KP_BATCHER_DEFAULT_CORR;
    if (b->o.activities == 0) {
        b->o.activities = KP_ACT_DEFAULT;
    }
    b->job = clean_text(o->job);
    b->host = clean_text(o->host);
    if (b->o.device < -1 || b->o.device > INT16_MAX) {
        b->o.device = -1;
    }
    if (b->o.pid > INT32_MAX) {
        b->o.pid = 0;
    }
    if (b->o.local_rank > INT32_MAX) {
        b->o.local_rank = 0;
    }
    if (b->o.world_size > INT32_MAX) {
        b->o.world_size = 0;
    }
    b->cap_steps = 256;
    b->steps = malloc(b->cap_steps * sizeof(*b->steps));
    if (b->job == NULL || b->host == NULL || b->steps == NULL ||
        kp_batch_builder_create(KP_BB_ALWAYS, capture_cols,
                                sizeof(capture_cols) / sizeof(capture_cols[0]), &b->bb) != 0) {
        kp_batcher_destroy(b);
        return -ENOMEM;
    }
    b->o.job = b->o.host = NULL;
    b->phase = PH_PRE;
    b->ws = INT64_MIN;
    b->we = INT64_MAX;
    b->inside_upto = INT64_MIN;
    *out = b;
    return 0;
}

void kp_batcher_destroy(struct kp_batcher *b)
{
    if (b == NULL) {
        return;
    }
    free(b->job);
    free(b->host);
    free(b->steps);
    free(b->corrs);
    map_free(&b->corr_map);
    free(b->pend);
    map_free(&b->pend_map);
    free(b->rows);
    kp_batch_builder_destroy(b->bb);
    map_free(&b->str_ids);
    free(b);
}

void kp_batcher_window_begin(struct kp_batcher *b, const struct kp_wire_window *w)
{
    if (b->phase != PH_PRE) {
        return;
    }
    b->phase = PH_IN;
    b->ws = w->start_ns;
    /* a step that started inside the window bounds what is known to be inside */
    for (size_t i = 0; i < b->n_steps; i++) {
        if (b->steps[i].start >= b->ws && b->o.n_steps > 0 &&
            b->steps[i].step < b->o.target_step + (int64_t) b->o.n_steps &&
            b->steps[i].start > b->inside_upto) {
            b->inside_upto = b->steps[i].start;
        }
    }
    pend_rescan(b, false);
}

void kp_batcher_step(struct kp_batcher *b, const struct kp_wire_step *s)
{
    bool moved = false;

    if (b->phase == PH_ENDED) {
        return;
    }
    if (s->step < 0 || s->step > INT32_MAX) {
        malformed(b, 0, "step", s->step, 0, true);
        return;
    }
    if (s->start_ns < 0) {
        malformed(b, 0, "start_ns", s->start_ns, 0, true);
        return;
    }
    if (b->n_steps > 0 && s->start_ns < b->steps[b->n_steps - 1].start) {
        return; /* out of order: ignore (steps only move forward) */
    }
    if (b->n_steps == KP_BATCHER_MAX_STEPS) {
        memmove(b->steps, b->steps + 1, (b->n_steps - 1) * sizeof(*b->steps));
        b->n_steps--;
    }
    if (b->n_steps == b->cap_steps) {
        size_t cap = b->cap_steps * 2;
        struct step_mark *n = realloc(b->steps, cap * sizeof(*n));

        if (n == NULL) {
            return;
        }
        b->steps = n;
        b->cap_steps = cap;
    }
    b->steps[b->n_steps].step = s->step;
    b->steps[b->n_steps].start = s->start_ns;
    b->n_steps++;
    if (b->phase == PH_IN && b->o.n_steps > 0) {
        int64_t end_step = b->o.target_step + (int64_t) b->o.n_steps;

        if (s->step >= end_step && s->start_ns < b->we) {
            b->we = s->start_ns; /* the step after the window began: the window is over */
            moved = true;
        }
        else if (s->step < end_step && s->start_ns >= b->ws && s->start_ns > b->inside_upto) {
            b->inside_upto = s->start_ns;
            moved = true;
        }
    }
    if (moved) {
        pend_rescan(b, false);
    }
}

void kp_batcher_records(struct kp_batcher *b, uint32_t kind, uint32_t rec_size, const void *recs,
                        uint32_t count)
{
    size_t own = kp_wire_rec_size(kind);
    size_t n = rec_size < own ? rec_size : own;
    const uint8_t *p = recs;

    if (own == 0 || b->phase == PH_ENDED) {
        return;
    }
    for (uint32_t i = 0; i < count; i++, p += rec_size) {
        union rec r;

        memset(&r, 0, sizeof(r));
        memcpy(&r, p, n);
        b->st.records_in++;
        if (!rec_check(b, kind, &r)) {
            continue;
        }
        if (rec_end(kind, &r) > b->last_time) {
            b->last_time = rec_end(kind, &r);
        }
        if (kind == KP_REC_API) {
            corr_remember(b, &r.a);
        }
        if (b->phase == PH_PRE) {
            bool wait = is_gpu(kind) && corr_find(b, rec_corr(kind, &r)) == NULL &&
                        rec_corr(kind, &r) != 0 && (b->o.activities & KP_ACT_RUNTIME) != 0;

            pend_add(b, kind, &r, wait);
        }
        else {
            apply(b, kind, &r, decide(b, kind, &r, false));
        }
        if (kind == KP_REC_API && b->phase == PH_IN) {
            pend_resolve_corr(b, r.a.correlation);
        }
    }
}

void kp_batcher_counters(struct kp_batcher *b, uint64_t dropped, uint64_t cupti_dropped,
                         uint64_t overhead_ns)
{
    if (dropped > b->lib_dropped) {
        b->inc_dropped = sat_add(b->inc_dropped, dropped - b->lib_dropped);
        b->lib_dropped = dropped;
    }
    if (cupti_dropped > b->lib_cupti) {
        b->inc_cupti = sat_add(b->inc_cupti, cupti_dropped - b->lib_cupti);
        b->lib_cupti = cupti_dropped;
    }
    if (overhead_ns > b->lib_overhead) {
        b->inc_overhead = sat_add(b->inc_overhead, overhead_ns - b->lib_overhead);
        b->lib_overhead = overhead_ns;
    }
}

void kp_batcher_add_dropped(struct kp_batcher *b, uint64_t n)
{
    b->inc_dropped = sat_add(b->inc_dropped, n);
}

void kp_batcher_tick(struct kp_batcher *b, long long now_ms)
{
    if (b->phase != PH_ENDED && b->n_rows > 0 && b->o.batch_ms > 0 &&
        now_ms - b->first_row_ms >= b->o.batch_ms) {
        cut(b, false);
    }
}

int kp_batcher_window_end(struct kp_batcher *b, const struct kp_wire_window *w)
{
    uint64_t emit_failed;

    if (b->phase == PH_ENDED) {
        return 0;
    }
    if (b->phase == PH_PRE) {
        b->ws = w != NULL ? w->start_ns : INT64_MAX; /* no BEGIN: nothing is inside */
    }
    b->phase = PH_IN;
    if (w != NULL) {
        b->we = w->end_ns;
        kp_batcher_counters(b, w->dropped, w->cupti_dropped, w->overhead_ns);
    }
    else if (b->we == INT64_MAX) {
        b->we = b->last_time > b->ws ? (b->last_time < INT64_MAX ? b->last_time + 1 : INT64_MAX)
                                     : b->ws;
    }
    pend_rescan(b, true);
    emit_failed = b->st.emit_failed;
    cut(b, true);
    b->phase = PH_ENDED;
    if (b->st.malformed > 0) {
        kp_log_warn("capture had malformed records run=%" PRIu64 " rank=%u malformed=%" PRIu64
                    " records_in=%" PRIu64 " (dropped; the first is logged above by field)",
                    b->o.run_id, b->o.rank, b->st.malformed, b->st.records_in);
    }
    return b->st.emit_failed > emit_failed ? -ENOSPC : 0;
}

void kp_batcher_get_stats(const struct kp_batcher *b, struct kp_batcher_stats *out)
{
    *out = b->st;
    out->pending = b->live_pend;
}
