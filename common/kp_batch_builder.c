/*
 * kp_batch_builder: see kp_batch_builder.h. Per kind: its message (the columns, as protobuf-c
 * lays them out), the allocated columns as (offset, element size), the row count and the
 * capacity. The string table: entries that are either borrowed pointers or offsets into
 * `bytes` (copies), and a hash of the interned ones.
 */
#include "kp_batch_builder.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kp_strbuf.h"

#define BORROWED UINT32_MAX

struct bb_col {
    const ProtobufCFieldDescriptor *f;
    uint8_t size;     /* bytes per value */
    uint8_t presence; /* enum kp_batch_builder_presence */
    bool side;        /* a value column of the kind's side table */
    bool ts;          /* KP_ROLE_TS */
    int64_t none;
};

struct bb_kind {
    ProtobufCMessage *msg;
    size_t batch_offset; /* of the kind's pointer in Kprof__V1__Batch */
    struct bb_col cols[KP_CODEC_MAX_COLS];
    size_t n_cols; /* allocated (not KP_BB_NEVER) */
    size_t n, cap, used;
};

struct kp_batch_builder {
    struct bb_kind kinds[KP_EV_COUNT];
    size_t total;
    bool finished; /* since the last next */
    /* the string table: ptrs[i], or bytes.data + off[i] when off[i] != BORROWED */
    const char **ptrs;
    uint32_t *off;
    size_t nstr, cap_str;
    struct kp_strbuf bytes;
    uint32_t *htab; /* interned entries: index + 1, 0 empty */
    size_t hcap, hn;
    Kprof__V1__Batch batch;
};

static inline void **col_values(ProtobufCMessage *m, const struct bb_col *c)
{
    return (void **) ((char *) m + c->f->offset);
}

static inline size_t *col_count(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    return (size_t *) ((char *) m + f->quantifier_offset);
}

static uint8_t elem_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_INT32:
        return 4;
    default:
        return 8;
    }
}

static const struct kp_batch_builder_rule *find_rule(const struct kp_batch_builder_rule *rules,
                                                     size_t n_rules, enum kp_event_kind k,
                                                     const char *name)
{
    for (size_t i = 0; i < n_rules; i++) {
        if (rules[i].kind == k && strcmp(rules[i].column, name) == 0) {
            return &rules[i];
        }
    }
    return NULL;
}

static bool is_side_value(const struct kp_event_kind_info *ki, const char *name)
{
    if (ki->side == NULL) {
        return false;
    }
    for (size_t i = 0; i < KP_SIDE_MAX_VALUES && ki->side->values[i] != NULL; i++) {
        if (strcmp(ki->side->values[i], name) == 0) {
            return true;
        }
    }
    return false;
}

int kp_batch_builder_create(enum kp_batch_builder_presence dflt,
                            const struct kp_batch_builder_rule *rules, size_t n_rules,
                            struct kp_batch_builder **out)
{
    struct kp_batch_builder *b;
    size_t matched = 0;

    *out = NULL;
    if (kp_codec_selfcheck(NULL, 0) != 0) {
        return -EINVAL;
    }
    if ((b = calloc(1, sizeof(*b))) == NULL) {
        return -ENOMEM;
    }
    kp_strbuf_init(&b->bytes, 0);
    kprof__v1__batch__init(&b->batch);
    for (int k = 0; k < KP_EV_COUNT; k++) {
        const struct kp_event_kind_info *ki = &kp_event_kinds[k];
        struct bb_kind *bk = &b->kinds[k];

        bk->batch_offset = protobuf_c_message_descriptor_get_field_by_name(
                               &kprof__v1__batch__descriptor, ki->field)
                               ->offset;
        if ((bk->msg = calloc(1, ki->desc->sizeof_message)) == NULL) {
            kp_batch_builder_destroy(b);
            return -ENOMEM;
        }
        protobuf_c_message_init(ki->desc, bk->msg);
        for (size_t c = 0; c < ki->n_columns; c++) {
            const struct kp_batch_builder_rule *r =
                find_rule(rules, n_rules, (enum kp_event_kind) k, ki->columns[c].name);
            struct bb_col *col = &bk->cols[bk->n_cols];

            matched += r != NULL;
            if ((r != NULL ? r->presence : dflt) == KP_BB_NEVER) {
                continue;
            }
            col->f = kp_codec_field((enum kp_event_kind) k, c);
            col->size = elem_size(col->f);
            col->presence = (uint8_t) (r != NULL ? r->presence : dflt);
            col->none = r != NULL ? r->none : 0;
            col->side = is_side_value(ki, ki->columns[c].name);
            col->ts = ki->columns[c].role == KP_ROLE_TS;
            bk->n_cols++;
        }
    }
    if (matched != n_rules) { /* a rule names no column of its kind */
        kp_batch_builder_destroy(b);
        return -EINVAL;
    }
    *out = b;
    kp_batch_builder_next(b);
    return 0;
}

void kp_batch_builder_destroy(struct kp_batch_builder *b)
{
    if (b == NULL) {
        return;
    }
    for (int k = 0; k < KP_EV_COUNT; k++) {
        struct bb_kind *bk = &b->kinds[k];

        if (bk->msg == NULL) {
            continue;
        }
        for (size_t c = 0; c < bk->n_cols; c++) {
            free(*col_values(bk->msg, &bk->cols[c]));
        }
        free(bk->msg);
    }
    free(b->ptrs);
    free(b->off);
    free(b->htab);
    kp_strbuf_fini(&b->bytes);
    free(b);
}

/* Grows every allocated column of bk to hold need rows. */
static int grow(struct bb_kind *bk, size_t need)
{
    size_t cap = bk->cap ? bk->cap : 256;

    while (cap < need) {
        cap *= 2;
    }
    for (size_t c = 0; c < bk->n_cols; c++) {
        void **v = col_values(bk->msg, &bk->cols[c]);
        void *p = realloc(*v, cap * bk->cols[c].size);

        if (p == NULL) {
            return -ENOMEM; /* the columns grown so far keep their new size: harmless */
        }
        *v = p;
    }
    bk->cap = cap;
    return 0;
}

long kp_batch_builder_add(struct kp_batch_builder *b, enum kp_event_kind k, size_t n)
{
    struct bb_kind *bk = &b->kinds[k];
    size_t first = bk->n;

    if (first + n > bk->cap && grow(bk, first + n) != 0) {
        return -ENOMEM;
    }
    if (n == 1) { /* the importer's and the generator's case: stores, not memset calls */
        for (size_t c = 0; c < bk->n_cols; c++) {
            void *v = *col_values(bk->msg, &bk->cols[c]);

            if (bk->cols[c].size == 4) {
                ((uint32_t *) v)[first] = 0;
            }
            else {
                ((uint64_t *) v)[first] = 0;
            }
        }
    }
    else {
        for (size_t c = 0; c < bk->n_cols; c++) {
            const struct bb_col *col = &bk->cols[c];

            memset((char *) *col_values(bk->msg, col) + first * col->size, 0, n * col->size);
        }
    }
    bk->n += n;
    b->total += n;
    return (long) first;
}

void *kp_batch_builder_table(struct kp_batch_builder *b, enum kp_event_kind k)
{
    return b->kinds[k].msg;
}

size_t kp_batch_builder_rows(const struct kp_batch_builder *b, enum kp_event_kind k)
{
    return b->kinds[k].n;
}

size_t kp_batch_builder_total(const struct kp_batch_builder *b)
{
    return b->total;
}

void kp_batch_builder_truncate(struct kp_batch_builder *b, enum kp_event_kind k, size_t n)
{
    struct bb_kind *bk = &b->kinds[k];

    if (n < bk->n) {
        b->total -= bk->n - n;
        bk->n = n;
    }
}

/* --- the string table --- */

static inline const char *entry_text(const struct kp_batch_builder *b, size_t i)
{
    return b->off[i] == BORROWED ? b->ptrs[i] : b->bytes.data + b->off[i];
}

/* Makes room for one more entry; an empty table first gets entry 0, "". */
static int str_room(struct kp_batch_builder *b)
{
    while (b->nstr + 2 > b->cap_str) {
        size_t cap = b->cap_str ? b->cap_str * 2 : 1024;
        const char **p;
        uint32_t *o;

        if ((p = realloc(b->ptrs, cap * sizeof(*p))) == NULL) {
            return -ENOMEM;
        }
        b->ptrs = p;
        if ((o = realloc(b->off, cap * sizeof(*o))) == NULL) {
            return -ENOMEM;
        }
        b->off = o;
        b->cap_str = cap;
    }
    if (b->nstr == 0) {
        b->ptrs[0] = "";
        b->off[0] = BORROWED;
        b->nstr = 1;
    }
    return 0;
}

/* Appends a copy of s[0..n) as a new entry. */
static int64_t str_copy(struct kp_batch_builder *b, const char *s, size_t n)
{
    size_t at = b->bytes.len;
    int rc;

    if ((rc = str_room(b)) != 0) {
        return rc;
    }
    if ((rc = kp_strbuf_append(&b->bytes, s, n)) != 0 || (rc = kp_strbuf_putc(&b->bytes, 0)) != 0) {
        b->bytes.len = at;
        return rc;
    }
    b->off[b->nstr] = (uint32_t) at;
    b->ptrs[b->nstr] = NULL;
    return (int64_t) b->nstr++;
}

int64_t kp_batch_builder_string(struct kp_batch_builder *b, const char *s, size_t n)
{
    int rc;

    if (s[n] != '\0') {
        return str_copy(b, s, n);
    }
    if ((rc = str_room(b)) != 0) {
        return rc;
    }
    b->ptrs[b->nstr] = s;
    b->off[b->nstr] = BORROWED;
    return (int64_t) b->nstr++;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;

    for (size_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char) s[i]) * 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static int rehash(struct kp_batch_builder *b, size_t cap)
{
    uint32_t *t = calloc(cap, sizeof(*t));

    if (t == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < b->hcap; i++) {
        if (b->htab[i] != 0) {
            const char *s = entry_text(b, b->htab[i] - 1);
            size_t h = (size_t) hash_bytes(s, strlen(s)) & (cap - 1);

            while (t[h] != 0) {
                h = (h + 1) & (cap - 1);
            }
            t[h] = b->htab[i];
        }
    }
    free(b->htab);
    b->htab = t;
    b->hcap = cap;
    return 0;
}

int64_t kp_batch_builder_intern(struct kp_batch_builder *b, const char *s, size_t n)
{
    size_t h;
    int64_t idx;

    if (n == 0) {
        return 0;
    }
    if ((b->hn + 1) * 2 > b->hcap && rehash(b, b->hcap ? b->hcap * 2 : 1024) != 0) {
        return -ENOMEM;
    }
    h = (size_t) hash_bytes(s, n) & (b->hcap - 1);
    while (b->htab[h] != 0) {
        const char *t = entry_text(b, b->htab[h] - 1);

        if (strncmp(t, s, n) == 0 && t[n] == '\0') {
            return b->htab[h] - 1;
        }
        h = (h + 1) & (b->hcap - 1);
    }
    if ((idx = str_copy(b, s, n)) < 0) {
        return idx;
    }
    b->htab[h] = (uint32_t) idx + 1;
    b->hn++;
    return idx;
}

size_t kp_batch_builder_strings(const struct kp_batch_builder *b)
{
    return b->nstr;
}

size_t kp_batch_builder_string_bytes(const struct kp_batch_builder *b)
{
    return b->bytes.len;
}

/* --- batches --- */

/* True if some row of col in [0, n) holds a value other than its "none". */
static bool col_any(const void *v, const struct bb_col *col, size_t n)
{
    switch (col->f->type) {
    case PROTOBUF_C_TYPE_DOUBLE:
        for (size_t i = 0; i < n; i++) {
            if (!isnan(((const double *) v)[i])) {
                return true;
            }
        }
        return false;
    case PROTOBUF_C_TYPE_UINT32:
        for (size_t i = 0; i < n; i++) {
            if ((int64_t) ((const uint32_t *) v)[i] != col->none) {
                return true;
            }
        }
        return false;
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_INT32:
        for (size_t i = 0; i < n; i++) {
            if ((int64_t) ((const int32_t *) v)[i] != col->none) {
                return true;
            }
        }
        return false;
    default:
        for (size_t i = 0; i < n; i++) {
            if (((const int64_t *) v)[i] != col->none) {
                return true;
            }
        }
        return false;
    }
}

Kprof__V1__Batch *kp_batch_builder_finish(struct kp_batch_builder *b, int64_t base_ns,
                                          const size_t *upto)
{
    Kprof__V1__Batch *m = &b->batch;

    b->finished = true;
    for (int k = 0; k < KP_EV_COUNT; k++) {
        struct bb_kind *bk = &b->kinds[k];
        size_t n = upto != NULL && upto[k] < bk->n ? upto[k] : bk->n;
        ProtobufCMessage **slot = (ProtobufCMessage **) ((char *) m + bk->batch_offset);
        bool side = false;

        bk->used = n;
        *slot = n > 0 ? bk->msg : NULL;
        if (n == 0) {
            continue;
        }
        for (size_t c = 0; c < bk->n_cols; c++) {
            const struct bb_col *col = &bk->cols[c];
            void *v = *col_values(bk->msg, col);
            bool keep = col->presence == KP_BB_ALWAYS || col_any(v, col, n);

            *col_count(bk->msg, col->f) = keep ? n : 0;
            side |= keep && col->side;
            if (keep && col->ts) {
                int64_t *t = v, prev = base_ns;

                for (size_t i = 0; i < n; i++) {
                    int64_t abs_ns = t[i];

                    t[i] = abs_ns - prev;
                    prev = abs_ns;
                }
            }
        }
        for (size_t c = 0; side && c < bk->n_cols; c++) {
            if (bk->cols[c].side) {
                *col_count(bk->msg, bk->cols[c].f) = n;
            }
        }
    }
    for (size_t i = 0; i < b->nstr; i++) {
        b->ptrs[i] = (char *) entry_text(b, i);
    }
    m->strings = (char **) b->ptrs;
    m->n_strings = b->nstr;
    m->base_ns = base_ns;
    return m;
}

void kp_batch_builder_next(struct kp_batch_builder *b)
{
    for (int k = 0; k < KP_EV_COUNT; k++) {
        struct bb_kind *bk = &b->kinds[k];
        size_t left;

        if (!b->finished) {
            bk->used = bk->n;
        }
        left = bk->n - bk->used;

        if (bk->used > 0 && left > 0) {
            for (size_t c = 0; c < bk->n_cols; c++) {
                char *v = *col_values(bk->msg, &bk->cols[c]);
                size_t sz = bk->cols[c].size;

                memmove(v, v + bk->used * sz, left * sz);
            }
        }
        b->total -= bk->used;
        bk->n = left;
        bk->used = 0;
    }
    kp_strbuf_reset(&b->bytes);
    if (b->htab != NULL) {
        memset(b->htab, 0, b->hcap * sizeof(*b->htab));
    }
    b->hn = 0;
    b->finished = false;
    kprof__v1__batch__init(&b->batch);
    b->nstr = 0;
    (void) str_room(b); /* index 0 is the empty string; else the next entry adds it */
}
