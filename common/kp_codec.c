#define KP_LOG_MODULE "codec"
#include "kp_codec.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kp_err.h"
#include "kp_json.h"
#include "kp_strbuf.h"

#define V  KP_ROLE_VALUE
#define TS KP_ROLE_TS
#define NM KP_ROLE_NAME
#define I2 KP_SQL_INT2
#define I4 KP_SQL_INT4
#define I8 KP_SQL_INT8
#define F8 KP_SQL_FLOAT8

/* Column order is COPY order; the first column is the row count. Keep in step with
 * proto/kprof.proto and sql/migrations (the selfcheck and tests/it compare them). */
static const struct kp_column_spec kernel_cols[] = {
    { "start_ns", I8, TS, true },      { "dur_ns", I8, V, true },
    { "name", I4, NM, false },         { "device", I2, V, false },
    { "context", I4, V, false },       { "stream", I4, V, false },
    { "correlation", I8, V, false },   { "external_id", I8, V, false },
    { "grid_x", I4, V, false },        { "grid_y", I4, V, false },
    { "grid_z", I4, V, false },        { "block_x", I2, V, false },
    { "block_y", I2, V, false },       { "block_z", I2, V, false },
    { "registers", I2, V, false },     { "static_smem", I4, V, false },
    { "dynamic_smem", I4, V, false },  { "graph_id", I4, V, false },
    { "graph_node_id", I8, V, false }, { "step", I4, V, false },
    { "blocks_per_sm", F8, V, false }, { "est_occupancy", F8, V, false },
};

/* Kineto's "blocks per SM" and "est. achieved occupancy %": only imported traces carry them
 * (migration 0006). The key identifies a kernel within its run and rank. */
static const struct kp_side_spec kernel_side = {
    .table = "kernel_occupancy",
    .key = { "start_ns", "device", "stream", "correlation" },
    .values = { "blocks_per_sm", "est_occupancy" },
};

static const struct kp_column_spec memcpy_cols[] = {
    { "start_ns", I8, TS, true },       { "dur_ns", I8, V, true },
    { "bytes", I8, V, false },          { "copy_kind", I2, V, false },
    { "src_kind", I2, V, false },       { "dst_kind", I2, V, false },
    { "device", I2, V, false },         { "context", I4, V, false },
    { "stream", I4, V, false },         { "correlation", I8, V, false },
    { "external_id", I8, V, false },    { "src_device", I2, V, false },
    { "dst_device", I2, V, false },     { "step", I4, V, false },
    { "bandwidth_gbps", F8, V, false },
};

/* Kineto's "memory bandwidth (GB/s)" of a memcpy or memset: only imported traces carry it
 * (migration 0010). The key identifies a copy within its run and rank. */
static const struct kp_side_spec memcpy_side = {
    .table = "memcpy_bandwidth",
    .key = { "start_ns", "device", "stream", "correlation" },
    .values = { "bandwidth_gbps" },
};

static const struct kp_column_spec memset_cols[] = {
    { "start_ns", I8, TS, true },    { "dur_ns", I8, V, true },
    { "bytes", I8, V, false },       { "value", I8, V, false },
    { "mem_kind", I2, V, false },    { "device", I2, V, false },
    { "context", I4, V, false },     { "stream", I4, V, false },
    { "correlation", I8, V, false }, { "external_id", I8, V, false },
    { "step", I4, V, false },        { "bandwidth_gbps", F8, V, false },
};

static const struct kp_side_spec memset_side = {
    .table = "memset_bandwidth",
    .key = { "start_ns", "device", "stream", "correlation" },
    .values = { "bandwidth_gbps" },
};

static const struct kp_column_spec api_cols[] = {
    { "start_ns", I8, TS, true },     { "dur_ns", I8, V, true },
    { "domain", I2, V, false },       { "cbid", I4, V, false },
    { "name", I4, NM, false },        { "tid", I8, V, false },
    { "correlation", I8, V, false },  { "external_id", I8, V, false },
    { "return_value", I4, V, false }, { "step", I4, V, false },
};

static const struct kp_column_spec op_cols[] = {
    { "start_ns", I8, TS, true },      { "dur_ns", I8, V, true },
    { "name", I4, NM, false },         { "kind", I2, V, false },
    { "tid", I8, V, false },           { "op_id", I8, V, false },
    { "parent_id", I8, V, false },     { "seq", I8, V, false },
    { "fwd_tid", I8, V, false },       { "input_shapes", I4, NM, false },
    { "input_dtypes", I4, NM, false }, { "external_id", I8, V, false },
    { "domain", I4, NM, false },       { "device", I2, V, false },
    { "stream", I4, V, false },        { "step", I4, V, false },
};

static const struct kp_column_spec step_cols[] = {
    { "start_ns", I8, TS, true },
    { "step", I8, V, true },
    { "dur_ns", I8, V, true },
};

static const struct kp_column_spec counter_cols[] = {
    { "metric", I4, NM, true },
    { "correlation", I8, V, false },
    { "value", F8, V, true },
    { "device", I2, V, false },
};

static const struct kp_column_spec collective_cols[] = {
    { "start_ns", I8, TS, true },   { "dur_ns", I8, V, true },
    { "name", I4, NM, false },      { "in_nelems", I8, V, false },
    { "out_nelems", I8, V, false }, { "dtype", I4, NM, false },
    { "group_size", I4, V, false }, { "process_group", I4, NM, false },
    { "coll_seq", I8, V, false },   { "external_id", I8, V, false },
    { "tid", I8, V, false },        { "step", I4, V, false },
};

static const struct kp_column_spec sync_cols[] = {
    { "start_ns", I8, TS, true },   { "dur_ns", I8, V, true },       { "sync_type", I2, V, false },
    { "device", I2, V, false },     { "context", I4, V, false },     { "stream", I4, V, false },
    { "cuda_event", I8, V, false }, { "correlation", I8, V, false }, { "step", I4, V, false },
};

static const struct kp_column_spec memory_cols[] = {
    { "start_ns", I8, TS, true },
    { "name", I4, NM, false },
    { "device_type", I2, V, false },
    { "device", I2, V, false },
    { "addr", I8, V, false },
    { "bytes", I8, V, false },
    { "total_allocated", I8, V, false },
    { "total_reserved", I8, V, false },
    { "tid", I8, V, false },
    { "step", I4, V, false },
};

#define KIND_STORE(tbl, st, lbl, fld, cols, d, sd)                              \
    {                                                                           \
        .table = tbl, .store = st, .label = lbl, .field = fld, .columns = cols, \
        .n_columns = sizeof(cols) / sizeof(cols[0]), .desc = &d, .side = sd     \
    }
#define KIND_SIDE(tbl, lbl, fld, cols, d, sd) KIND_STORE(tbl, tbl, lbl, fld, cols, d, sd)
#define KIND(tbl, lbl, fld, cols, d)          KIND_SIDE(tbl, lbl, fld, cols, d, NULL)

const struct kp_event_kind_info kp_event_kinds[KP_EV_COUNT] = {
    [KP_EV_KERNEL] = KIND_STORE("kernels", "kernel_rows", "kernel", "kernels", kernel_cols,
                                kprof__v1__kernels__descriptor, &kernel_side),
    [KP_EV_MEMCPY] = KIND_SIDE("memcpys", "memcpy", "memcpys", memcpy_cols,
                               kprof__v1__memcpys__descriptor, &memcpy_side),
    [KP_EV_MEMSET] = KIND_SIDE("memsets", "memset", "memsets", memset_cols,
                               kprof__v1__memsets__descriptor, &memset_side),
    [KP_EV_API] = KIND("api_calls", "api", "api_calls", api_cols, kprof__v1__api_calls__descriptor),
    [KP_EV_OP] = KIND("ops", "op", "ops", op_cols, kprof__v1__ops__descriptor),
    [KP_EV_STEP] = KIND("steps", "step", "steps", step_cols, kprof__v1__steps__descriptor),
    [KP_EV_COUNTER] =
        KIND("counters", "counter", "counters", counter_cols, kprof__v1__counters__descriptor),
    [KP_EV_COLLECTIVE] = KIND("collectives", "collective", "collectives", collective_cols,
                              kprof__v1__collectives__descriptor),
    [KP_EV_SYNC] = KIND("syncs", "sync", "syncs", sync_cols, kprof__v1__syncs__descriptor),
    [KP_EV_MEMORY] = KIND("memory_events", "memory", "memory", memory_cols,
                          kprof__v1__memory_events__descriptor),
};

#undef V
#undef TS
#undef NM
#undef I2
#undef I4
#undef I8
#undef F8

/* Resolved once: the field descriptor of every column, and of each kind within Batch. */
static const ProtobufCFieldDescriptor *col_fields[KP_EV_COUNT][KP_CODEC_MAX_COLS];
static const ProtobufCFieldDescriptor *kind_fields[KP_EV_COUNT];
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
/* Where each column is stored (see struct kp_side_spec), and each side table's key and value
 * columns as spec indexes, in the spec's order of side->key and side->values. */
enum {
    STORE_MAIN,
    STORE_KEY,
    STORE_SIDE
};
static uint8_t col_store[KP_EV_COUNT][KP_CODEC_MAX_COLS];
static uint8_t side_key[KP_EV_COUNT][KP_SIDE_MAX_KEY], n_side_key[KP_EV_COUNT];
static uint8_t side_val[KP_EV_COUNT][KP_SIDE_MAX_VALUES], n_side_val[KP_EV_COUNT];
static int resolve_err;
static char resolve_msg[256];

static bool sql_accepts(enum kp_col_sql sql, ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_INT32:
        return sql == KP_SQL_INT2 || sql == KP_SQL_INT4 || sql == KP_SQL_INT8;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_INT64:
        return sql == KP_SQL_INT8;
    case PROTOBUF_C_TYPE_DOUBLE:
        return sql == KP_SQL_FLOAT8;
    default:
        return false;
    }
}

/* Finds the spec index of kind k's column `name`, or -1. */
static int col_index(const struct kp_event_kind_info *ki, const char *name)
{
    for (size_t c = 0; c < ki->n_columns; c++) {
        if (strcmp(ki->columns[c].name, name) == 0) {
            return (int) c;
        }
    }
    return -1;
}

/* Resolves kind k's side spec into col_store, side_key and side_val. Returns 0, or sets
 * resolve_err. */
static int resolve_side(int k)
{
    const struct kp_event_kind_info *ki = &kp_event_kinds[k];
    const struct kp_side_spec *sd = ki->side;

    for (int i = 0; i < KP_SIDE_MAX_KEY + KP_SIDE_MAX_VALUES; i++) {
        bool is_key = i < KP_SIDE_MAX_KEY;
        const char *name = is_key ? sd->key[i] : sd->values[i - KP_SIDE_MAX_KEY];
        int c = name == NULL ? -1 : col_index(ki, name);

        if (name == NULL) {
            continue;
        }
        /* Keys: integers or timestamps; values: optional doubles. */
        if (c < 0 || col_store[k][c] != STORE_MAIN ||
            (is_key && (col_fields[k][c]->type == PROTOBUF_C_TYPE_DOUBLE ||
                        ki->columns[c].role == KP_ROLE_NAME)) ||
            (!is_key &&
             (col_fields[k][c]->type != PROTOBUF_C_TYPE_DOUBLE || ki->columns[c].required))) {
            snprintf(resolve_msg, sizeof(resolve_msg),
                     "kind %s: side table %s: column %s is not a %s the kind has", ki->label,
                     sd->table, name, is_key ? "key" : "value");
            resolve_err = KP_EPROTO;
            return resolve_err;
        }
        col_store[k][c] = is_key ? STORE_KEY : STORE_SIDE;
        if (is_key) {
            side_key[k][n_side_key[k]++] = (uint8_t) c;
        }
        else {
            side_val[k][n_side_val[k]++] = (uint8_t) c;
        }
    }
    if (n_side_val[k] == 0) {
        snprintf(resolve_msg, sizeof(resolve_msg), "kind %s: side table %s has no values",
                 ki->label, sd->table);
        resolve_err = KP_EPROTO;
        return resolve_err;
    }
    return 0;
}

static void resolve(void)
{
    const ProtobufCMessageDescriptor *bd = &kprof__v1__batch__descriptor;

    for (int k = 0; k < KP_EV_COUNT; k++) {
        const struct kp_event_kind_info *ki = &kp_event_kinds[k];
        size_t n_repeated = 0;

        kind_fields[k] = protobuf_c_message_descriptor_get_field_by_name(bd, ki->field);
        if (kind_fields[k] == NULL || kind_fields[k]->descriptor != ki->desc ||
            ki->n_columns > KP_CODEC_MAX_COLS) {
            snprintf(resolve_msg, sizeof(resolve_msg), "kind %s: no Batch field %s", ki->label,
                     ki->field);
            resolve_err = KP_EPROTO;
            return;
        }
        for (size_t c = 0; c < ki->n_columns; c++) {
            const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field_by_name(ki->desc, ki->columns[c].name);

            if (f == NULL || f->label != PROTOBUF_C_LABEL_REPEATED ||
                !sql_accepts(ki->columns[c].sql, f->type) ||
                (ki->columns[c].role != KP_ROLE_VALUE && f->type == PROTOBUF_C_TYPE_DOUBLE)) {
                snprintf(resolve_msg, sizeof(resolve_msg),
                         "kind %s: column %s missing from the proto or of the wrong type",
                         ki->label, ki->columns[c].name);
                resolve_err = KP_EPROTO;
                return;
            }
            col_fields[k][c] = f;
        }
        if (ki->side != NULL && resolve_side(k) != 0) {
            return;
        }
        for (unsigned i = 0; i < ki->desc->n_fields; i++) {
            n_repeated += ki->desc->fields[i].label == PROTOBUF_C_LABEL_REPEATED;
        }
        if (n_repeated != ki->n_columns || ki->desc->n_fields != ki->n_columns) {
            snprintf(resolve_msg, sizeof(resolve_msg),
                     "kind %s: proto has %u fields but the codec knows %zu", ki->label,
                     ki->desc->n_fields, ki->n_columns);
            resolve_err = KP_EPROTO;
            return;
        }
    }
}

int kp_codec_selfcheck(char *errbuf, size_t errlen)
{
    pthread_once(&resolve_once, resolve);
    if (resolve_err != 0 && errbuf != NULL && errlen > 0) {
        snprintf(errbuf, errlen, "%s", resolve_msg);
    }
    return resolve_err;
}

const ProtobufCFieldDescriptor *kp_codec_field(enum kp_event_kind k, size_t c)
{
    pthread_once(&resolve_once, resolve);
    return col_fields[k][c];
}

static inline size_t field_count(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    return *(const size_t *) ((const char *) m + f->quantifier_offset);
}

static inline const void *field_values(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    return *(const void *const *) ((const char *) m + f->offset);
}

const ProtobufCMessage *kp_batch_kind(const Kprof__V1__Batch *b, enum kp_event_kind k)
{
    pthread_once(&resolve_once, resolve);
    if (resolve_err != 0) {
        return NULL;
    }
    return *(const ProtobufCMessage *const *) ((const char *) b + kind_fields[k]->offset);
}

size_t kp_batch_rows(const Kprof__V1__Batch *b, enum kp_event_kind k)
{
    const ProtobufCMessage *m = kp_batch_kind(b, k);

    return m == NULL ? 0 : field_count(m, col_fields[k][0]);
}

size_t kp_batch_total_rows(const Kprof__V1__Batch *b)
{
    size_t n = 0;

    for (int k = 0; k < KP_EV_COUNT; k++) {
        n += kp_batch_rows(b, (enum kp_event_kind) k);
    }
    return n;
}

int64_t kp_codec_get_i64(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, size_t i)
{
    const void *v = field_values(m, f);

    switch (f->type) {
    case PROTOBUF_C_TYPE_UINT32:
        return ((const uint32_t *) v)[i];
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_INT32:
        return ((const int32_t *) v)[i];
    case PROTOBUF_C_TYPE_UINT64:
        return (int64_t) ((const uint64_t *) v)[i];
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_INT64:
        return ((const int64_t *) v)[i];
    case PROTOBUF_C_TYPE_DOUBLE:
        return (int64_t) ((const double *) v)[i];
    default:
        return 0;
    }
}

bool kp_utf8_valid(const char *s, size_t len)
{
    size_t i = 0;

    while (i < len) {
        size_t k;

        /* Names are mostly ASCII: eight bytes at a time while none has its high bit set or
         * is NUL (the classic has-zero-byte test), then byte by byte. */
        while (len - i >= 8) {
            uint64_t w;

            memcpy(&w, s + i, 8);
            if (((w | ((w - 0x0101010101010101ULL) & ~w)) & 0x8080808080808080ULL) != 0) {
                break;
            }
            i += 8;
        }
        if (i == len) {
            break;
        }
        k = (unsigned char) s[i] < 0x80 ? s[i] != '\0' : kp_utf8_seq_len(s + i, len - i);

        if (k == 0) {
            return false;
        }
        i += k;
    }
    return true;
}

static int check_string(const char *what, size_t idx, const char *s,
                        const struct kp_batch_limits *lim, char *errbuf, size_t errlen)
{
    size_t len = s == NULL ? 0 : strlen(s);

    if (len > lim->max_name_bytes) {
        snprintf(errbuf, errlen, "%s[%zu] is %zu bytes long; the limit is %zu bytes", what, idx,
                 len, lim->max_name_bytes);
        return KP_ETOOBIG;
    }
    if (!kp_utf8_valid(s == NULL ? "" : s, len)) {
        snprintf(errbuf, errlen, "%s[%zu] is not valid UTF-8", what, idx);
        return KP_EPROTO;
    }
    return 0;
}

/* Bounds of each SQL type. */
static void sql_bounds(enum kp_col_sql sql, int64_t *lo, int64_t *hi)
{
    switch (sql) {
    case KP_SQL_INT2:
        *lo = INT16_MIN;
        *hi = INT16_MAX;
        break;
    case KP_SQL_INT4:
        *lo = INT32_MIN;
        *hi = INT32_MAX;
        break;
    default:
        *lo = INT64_MIN;
        *hi = INT64_MAX;
        break;
    }
}

static int validate_kind(const Kprof__V1__Batch *b, enum kp_event_kind k, char *errbuf,
                         size_t errlen)
{
    const struct kp_event_kind_info *ki = &kp_event_kinds[k];
    const ProtobufCMessage *m = kp_batch_kind(b, k);
    size_t n;

    if (m == NULL) {
        return 0;
    }
    n = field_count(m, col_fields[k][0]);
    for (size_t c = 0; c < ki->n_columns; c++) {
        const struct kp_column_spec *cs = &ki->columns[c];
        const ProtobufCFieldDescriptor *f = col_fields[k][c];
        size_t cn = field_count(m, f);
        int64_t lo, hi, ts = b->base_ns;

        if (cn != n && (cn != 0 || cs->required)) {
            snprintf(errbuf, errlen, "%s.%s has %zu values but the batch has %zu %s rows",
                     ki->field, cs->name, cn, n, ki->label);
            return KP_EPROTO;
        }
        if (cn == 0) {
            continue;
        }
        if (f->type == PROTOBUF_C_TYPE_UINT64) {
            const uint64_t *v = field_values(m, f);

            for (size_t i = 0; i < n; i++) {
                if (v[i] > INT64_MAX) {
                    snprintf(errbuf, errlen, "%s.%s[%zu] = %" PRIu64 " is out of range", ki->field,
                             cs->name, i, v[i]);
                    return KP_EPROTO;
                }
            }
        }
        if (f->type == PROTOBUF_C_TYPE_DOUBLE) {
            continue;
        }
        sql_bounds(cs->sql, &lo, &hi);
        for (size_t i = 0; i < n; i++) {
            int64_t v = kp_codec_get_i64(m, f, i);

            if (cs->role == KP_ROLE_TS) {
                if (__builtin_add_overflow(ts, v, &ts)) {
                    snprintf(errbuf, errlen, "%s.%s[%zu]: timestamp overflows", ki->field, cs->name,
                             i);
                    return KP_EPROTO;
                }
                continue;
            }
            if (cs->role == KP_ROLE_NAME) {
                if ((uint64_t) v >= b->n_strings && v != 0) {
                    snprintf(errbuf, errlen,
                             "%s.%s[%zu] = %" PRId64 " is not an index into the %zu strings",
                             ki->field, cs->name, i, v, b->n_strings);
                    return KP_EPROTO;
                }
                /* Index 0 is stored as NULL, which a required column (NOT NULL) refuses. */
                if (v == 0 && cs->required) {
                    snprintf(errbuf, errlen, "%s.%s[%zu] = 0 (no name), but %s needs a name",
                             ki->field, cs->name, i, cs->name);
                    return KP_EPROTO;
                }
                continue;
            }
            if (v < lo || v > hi) {
                snprintf(errbuf, errlen,
                         "%s.%s[%zu] = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                         ki->field, cs->name, i, v, lo, hi);
                return KP_EPROTO;
            }
        }
    }
    return 0;
}

int kp_batch_validate(const Kprof__V1__Batch *b, const struct kp_batch_limits *lim, char *errbuf,
                      size_t errlen)
{
    size_t rows = 0;
    int rc;

    pthread_once(&resolve_once, resolve);
    if (resolve_err != 0) {
        snprintf(errbuf, errlen, "codec: %s", resolve_msg);
        return resolve_err;
    }
    if (b->run_id == 0 || b->run_id > INT32_MAX) {
        snprintf(errbuf, errlen, "run_id %" PRIu64 " is not a valid run id (1..%d)", b->run_id,
                 INT32_MAX);
        return KP_EPROTO;
    }
    if (b->rank > INT32_MAX || b->stream > INT64_MAX || b->seq > INT64_MAX) {
        snprintf(errbuf, errlen, "rank, stream or seq out of range");
        return KP_EPROTO;
    }
    if (b->n_strings > lim->max_strings) {
        snprintf(errbuf, errlen, "string table has %zu entries; the limit is %zu", b->n_strings,
                 lim->max_strings);
        return KP_ETOOBIG;
    }
    for (size_t i = 0; i < b->n_strings; i++) {
        if ((rc = check_string("strings", i, b->strings[i], lim, errbuf, errlen)) != 0) {
            return rc;
        }
    }
    if (b->rank_info != NULL) {
        if ((rc = check_string("rank_info.job", 0, b->rank_info->job, lim, errbuf, errlen)) != 0 ||
            (rc = check_string("rank_info.host", 0, b->rank_info->host, lim, errbuf, errlen)) !=
                0 ||
            (rc = check_string("rank_info.distributed_info", 0, b->rank_info->distributed_info, lim,
                               errbuf, errlen)) != 0) {
            return rc;
        }
        if (b->rank_info->pid > INT32_MAX || b->rank_info->local_rank > INT32_MAX ||
            b->rank_info->world_size > INT32_MAX || b->rank_info->device < -1 ||
            b->rank_info->device > INT16_MAX) {
            snprintf(errbuf, errlen,
                     "rank_info: pid, local_rank, world_size or device out of range");
            return KP_EPROTO;
        }
        if (b->rank_info->profiler_start_ns < 0 ||
            b->rank_info->profiler_end_ns < b->rank_info->profiler_start_ns) {
            snprintf(errbuf, errlen,
                     "rank_info: profiler span [%" PRId64 ", %" PRId64 "] is not 0 <= start <= end",
                     b->rank_info->profiler_start_ns, b->rank_info->profiler_end_ns);
            return KP_EPROTO;
        }
    }
    for (size_t i = 0; i < b->n_devices; i++) {
        const Kprof__V1__Device *d = b->devices[i];

        if ((rc = check_string("devices.name", i, d->name, lim, errbuf, errlen)) != 0) {
            return rc;
        }
        if (d->id > INT16_MAX || d->global_memory_bytes > INT64_MAX ||
            d->memory_bandwidth_bytes_per_s > INT64_MAX || d->sm_count > INT32_MAX ||
            d->clock_khz > INT32_MAX || d->regs_per_sm > INT32_MAX || d->smem_per_sm > INT32_MAX ||
            d->smem_per_block > INT32_MAX || d->regs_per_block > INT32_MAX ||
            d->max_threads_per_block > INT32_MAX || d->max_threads_per_sm > INT32_MAX ||
            d->max_blocks_per_sm > INT32_MAX || d->warp_size > INT32_MAX ||
            d->cc_major > INT16_MAX || d->cc_minor > INT16_MAX) {
            snprintf(errbuf, errlen, "devices[%zu]: a value is out of range", i);
            return KP_EPROTO;
        }
    }
    if (b->stats != NULL &&
        (b->stats->records_dropped > INT64_MAX || b->stats->cupti_dropped > INT64_MAX ||
         b->stats->overhead_ns > INT64_MAX)) {
        snprintf(errbuf, errlen, "stats: a counter is out of range");
        return KP_EPROTO;
    }
    for (int k = 0; k < KP_EV_COUNT; k++) {
        if ((rc = validate_kind(b, (enum kp_event_kind) k, errbuf, errlen)) != 0) {
            return rc;
        }
        rows += kp_batch_rows(b, (enum kp_event_kind) k);
    }
    if (rows > lim->max_rows) {
        snprintf(errbuf, errlen, "batch has %zu rows; the limit is %zu", rows, lim->max_rows);
        return KP_ETOOBIG;
    }
    return 0;
}

const char *kp_codec_copy_columns(enum kp_event_kind k, char *buf, size_t len)
{
    const struct kp_event_kind_info *ki = &kp_event_kinds[k];
    size_t off = 0;
    int r;

    pthread_once(&resolve_once, resolve);
    r = snprintf(buf, len, "run_id, rank");
    off = r > 0 ? (size_t) r : 0;
    for (size_t c = 0; c < ki->n_columns && off < len; c++) {
        if (col_store[k][c] == STORE_SIDE) {
            continue;
        }
        r = snprintf(buf + off, len - off, ", %s", ki->columns[c].name);
        off += r > 0 ? (size_t) r : 0;
    }
    return buf;
}

const char *kp_codec_side_columns(enum kp_event_kind k, char *buf, size_t len)
{
    const struct kp_event_kind_info *ki = &kp_event_kinds[k];
    size_t off = 0;
    int r;

    pthread_once(&resolve_once, resolve);
    if (len > 0) {
        buf[0] = '\0';
    }
    if (ki->side == NULL || resolve_err != 0) {
        return buf;
    }
    r = snprintf(buf, len, "run_id, rank");
    off = r > 0 ? (size_t) r : 0;
    for (size_t i = 0; i < (size_t) n_side_key[k] + n_side_val[k] && off < len; i++) {
        size_t c = i < n_side_key[k] ? side_key[k][i] : side_val[k][i - n_side_key[k]];

        r = snprintf(buf + off, len - off, ", %s", ki->columns[c].name);
        off += r > 0 ? (size_t) r : 0;
    }
    return buf;
}

/* The side values of kind k in m (NULL where the batch lacks the column). Returns how many
 * of them the batch has. */
static size_t side_values(const ProtobufCMessage *m, enum kp_event_kind k,
                          const double *vals[KP_SIDE_MAX_VALUES])
{
    size_t have = 0;

    for (size_t j = 0; j < n_side_val[k]; j++) {
        const ProtobufCFieldDescriptor *f = col_fields[k][side_val[k][j]];

        vals[j] = field_count(m, f) != 0 ? field_values(m, f) : NULL;
        have += vals[j] != NULL;
    }
    return have;
}

static inline bool side_row_set(enum kp_event_kind k, const double *const *vals, size_t i)
{
    for (size_t j = 0; j < n_side_val[k]; j++) {
        if (vals[j] != NULL && !isnan(vals[j][i])) {
            return true;
        }
    }
    return false;
}

size_t kp_batch_side_rows(const Kprof__V1__Batch *b, enum kp_event_kind k)
{
    const ProtobufCMessage *m = kp_batch_kind(b, k);
    const double *vals[KP_SIDE_MAX_VALUES];
    size_t n, rows = 0;

    if (m == NULL || kp_event_kinds[k].side == NULL || side_values(m, k, vals) == 0) {
        return 0;
    }
    n = field_count(m, col_fields[k][0]);
    for (size_t i = 0; i < n; i++) {
        rows += side_row_set(k, vals, i);
    }
    return rows;
}

/* Writes v in decimal at p (room for 20 digits and a sign). Returns the end. */
static inline char *put_i64(char *p, int64_t v)
{
    char tmp[24];
    char *t = tmp + sizeof(tmp);
    uint64_t u = v < 0 ? (uint64_t) 0 - (uint64_t) v : (uint64_t) v;

    do {
        *--t = (char) ('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0) {
        *--t = '-';
    }
    memcpy(p, t, (size_t) (tmp + sizeof(tmp) - t));
    return p + (tmp + sizeof(tmp) - t);
}

static char *put_f64(char *p, double v)
{
    int r;

    if (isnan(v)) {
        memcpy(p, "NaN", 3);
        return p + 3;
    }
    if (isinf(v)) {
        r = v > 0 ? 8 : 9;
        memcpy(p, v > 0 ? "Infinity" : "-Infinity", (size_t) r);
        return p + r;
    }
    r = snprintf(p, 32, "%.17g", v);
    return p + r;
}

long kp_codec_copy_text(const Kprof__V1__Batch *b, enum kp_event_kind k, const int32_t *name_ids,
                        struct kp_strbuf *out)
{
    const struct kp_event_kind_info *ki = &kp_event_kinds[k];
    const ProtobufCMessage *m = kp_batch_kind(b, k);
    const ProtobufCFieldDescriptor *const *fs = col_fields[k];
    size_t present[KP_CODEC_MAX_COLS], cols[KP_CODEC_MAX_COLS], n_cols = 0;
    int64_t ts[KP_CODEC_MAX_COLS];
    char prefix[48];
    size_t prefix_len, n, row_max;
    char *p;

    if (m == NULL) {
        return 0;
    }
    for (size_t c = 0; c < ki->n_columns; c++) {
        if (col_store[k][c] != STORE_SIDE) {
            cols[n_cols++] = c;
        }
    }
    n = field_count(m, fs[0]);
    p = put_i64(prefix, (int64_t) b->run_id);
    *p++ = '\t';
    p = put_i64(p, (int64_t) b->rank);
    prefix_len = (size_t) (p - prefix);
    for (size_t c = 0; c < ki->n_columns; c++) {
        present[c] = field_count(m, fs[c]);
        ts[c] = b->base_ns;
    }
    /* Worst case per row: prefix, then each column 24 bytes (a double 32) plus a tab. */
    row_max = prefix_len + 1 + n_cols * 33;
    for (size_t i = 0; i < n; i++) {
        if (kp_strbuf_reserve(out, row_max) != 0) {
            return -ENOMEM;
        }
        p = out->data + out->len;
        memcpy(p, prefix, prefix_len);
        p += prefix_len;
        for (size_t j = 0; j < n_cols; j++) {
            size_t c = cols[j];
            const struct kp_column_spec *cs = &ki->columns[c];
            int64_t v;

            *p++ = '\t';
            if (present[c] == 0) {
                *p++ = '\\';
                *p++ = 'N';
                continue;
            }
            if (fs[c]->type == PROTOBUF_C_TYPE_DOUBLE) {
                p = put_f64(p, ((const double *) field_values(m, fs[c]))[i]);
                continue;
            }
            v = kp_codec_get_i64(m, fs[c], i);
            if (cs->role == KP_ROLE_TS) {
                ts[c] += v;
                v = ts[c];
            }
            else if (cs->role == KP_ROLE_NAME) {
                if (v == 0) {
                    *p++ = '\\';
                    *p++ = 'N';
                    continue;
                }
                v = name_ids[v];
            }
            p = put_i64(p, v);
        }
        *p++ = '\n';
        out->len = (size_t) (p - out->data);
    }
    return (long) n;
}

long kp_codec_side_copy_text(const Kprof__V1__Batch *b, enum kp_event_kind k, struct kp_strbuf *out)
{
    const ProtobufCMessage *m = kp_batch_kind(b, k);
    const ProtobufCFieldDescriptor *const *fs = col_fields[k];
    const double *vals[KP_SIDE_MAX_VALUES];
    int64_t ts[KP_SIDE_MAX_KEY];
    char prefix[48];
    size_t prefix_len, n, row_max;
    long rows = 0;
    char *p;

    if (m == NULL || kp_event_kinds[k].side == NULL || side_values(m, k, vals) == 0) {
        return 0;
    }
    n = field_count(m, fs[0]);
    p = put_i64(prefix, (int64_t) b->run_id);
    *p++ = '\t';
    p = put_i64(p, (int64_t) b->rank);
    prefix_len = (size_t) (p - prefix);
    row_max = prefix_len + 1 + n_side_key[k] * 25 + n_side_val[k] * 33;
    for (size_t j = 0; j < n_side_key[k]; j++) {
        ts[j] = b->base_ns;
    }
    for (size_t i = 0; i < n; i++) {
        bool set = side_row_set(k, vals, i);

        /* Timestamps are deltas: every row's must be added up, written or not. */
        for (size_t j = 0; j < n_side_key[k]; j++) {
            size_t c = side_key[k][j];

            if (kp_event_kinds[k].columns[c].role == KP_ROLE_TS && field_count(m, fs[c]) != 0) {
                ts[j] += kp_codec_get_i64(m, fs[c], i);
            }
        }
        if (!set) {
            continue;
        }
        if (kp_strbuf_reserve(out, row_max) != 0) {
            return -ENOMEM;
        }
        p = out->data + out->len;
        memcpy(p, prefix, prefix_len);
        p += prefix_len;
        for (size_t j = 0; j < n_side_key[k]; j++) {
            size_t c = side_key[k][j];

            *p++ = '\t';
            if (kp_event_kinds[k].columns[c].role == KP_ROLE_TS) {
                p = put_i64(p, ts[j]);
            }
            else {
                p = put_i64(p, field_count(m, fs[c]) != 0 ? kp_codec_get_i64(m, fs[c], i) : 0);
            }
        }
        for (size_t j = 0; j < n_side_val[k]; j++) {
            *p++ = '\t';
            p = put_f64(p, vals[j] != NULL ? vals[j][i] : NAN);
        }
        *p++ = '\n';
        out->len = (size_t) (p - out->data);
        rows++;
    }
    return rows;
}
