/*
 * The batch codec: how kprof's columnar event messages (proto/kprof.proto) map to PostgreSQL.
 *
 * Each event kind (kernels, memcpys, ...) is one protobuf message of parallel repeated
 * fields, and one PostgreSQL table whose columns are (run_id, rank, <the fields, same names,
 * same order>). The spec table in kp_codec.c gives each field its SQL type and role. The
 * validator and the COPY encoder walk that table and protobuf-c's field descriptors, so a new
 * column is one row in the table, one field in the proto and one migration (a new kind:
 * docs/recipes.md). kp_batch_builder fills batches from the same table. A kind may keep
 * figures that few rows carry in a side table instead (struct kp_side_spec): kernels' occupancy
 * figures live in kernel_occupancy.
 *
 * Validation guarantees that a valid batch can be COPYed without error: every column has 0 or
 * n values, every value fits its SQL type, every name index points into the string table,
 * every string is valid UTF-8 within the length limit, and timestamps do not overflow.
 */
#ifndef KP_CODEC_H
#define KP_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kprof.pb-c.h"

struct kp_strbuf;

enum kp_event_kind {
    KP_EV_KERNEL,
    KP_EV_MEMCPY,
    KP_EV_MEMSET,
    KP_EV_API,
    KP_EV_OP,
    KP_EV_STEP,
    KP_EV_COUNTER,
    KP_EV_COLLECTIVE,
    KP_EV_SYNC,
    KP_EV_MEMORY, /* allocator events (Kineto [memory] / [OutOfMemory]) */
    KP_EV_COUNT
};

enum kp_col_sql {
    KP_SQL_INT2,
    KP_SQL_INT4,
    KP_SQL_INT8,
    KP_SQL_FLOAT8,
};

enum kp_col_role {
    KP_ROLE_VALUE, /* stored as is */
    KP_ROLE_TS,    /* delta-encoded CLOCK_REALTIME ns, see kprof.proto */
    KP_ROLE_NAME,  /* index into the batch's string table; stored as a names.id */
};

#define KP_CODEC_MAX_COLS 24 /* columns of a kind, at most (kp_codec_selfcheck checks) */

struct kp_column_spec {
    const char *name; /* the proto field's name and the SQL column's name */
    enum kp_col_sql sql;
    enum kp_col_role role;
    bool required; /* must have n values */
};

/*
 * A kind's side table: figures that few rows carry (double precision, optional columns) live
 * there instead of in the kind's table, one row per event row that has one of them set (not
 * NaN), so that the rows without them pay nothing. Its columns: run_id, rank, the key columns
 * (also in the kind's table; NOT NULL here, a value the batch lacks is 0) and the values.
 */
#define KP_SIDE_MAX_KEY    4
#define KP_SIDE_MAX_VALUES 2
struct kp_side_spec {
    const char *table;
    const char *key[KP_SIDE_MAX_KEY];       /* names of the kind's columns; NULL-padded */
    const char *values[KP_SIDE_MAX_VALUES]; /* likewise; stored in the side table only */
};

struct kp_event_kind_info {
    const char *table; /* what readers name in PostgreSQL (a table; for kernels, a view) */
    const char *store; /* the table its rows are written to (COPY, LOCK): table, or for kernels
                        * kernel_rows, which collectord compacts into kernel_chunks when a run
                        * ends (sql/migrations/0015_kernel_chunks.sql) */
    const char *label; /* short name for logs and metrics: "kernel", "memcpy", ... */
    const char *field; /* the Batch field that holds this kind */
    const struct kp_column_spec *columns;
    size_t n_columns; /* columns[0] is the one whose length is the row count */
    const ProtobufCMessageDescriptor *desc;
    const struct kp_side_spec *side; /* NULL: none */
};

extern const struct kp_event_kind_info kp_event_kinds[KP_EV_COUNT];

struct kp_batch_limits {
    size_t max_name_bytes; /* longest string in the string table or rank info */
    size_t max_strings;    /* entries in the string table */
    size_t max_rows;       /* rows of all kinds together */
};

#define KP_CODEC_DEFAULT_MAX_NAME_BYTES 16384
#define KP_CODEC_DEFAULT_MAX_STRINGS    (1u << 20)
#define KP_CODEC_DEFAULT_MAX_ROWS       (1u << 22)

/* Checks that the spec table matches the compiled proto descriptors. Returns 0, or
 * KP_EPROTO with the mismatch in errbuf. Call once at start (tests call it too). */
int kp_codec_selfcheck(char *errbuf, size_t errlen);

/* Returns kind k's message in b, or NULL if the batch has none. */
const ProtobufCMessage *kp_batch_kind(const Kprof__V1__Batch *b, enum kp_event_kind k);

/* Returns the row count of kind k in b (0 if absent). */
size_t kp_batch_rows(const Kprof__V1__Batch *b, enum kp_event_kind k);

/* Returns the rows of all kinds in b. */
size_t kp_batch_total_rows(const Kprof__V1__Batch *b);

/*
 * Validates b (see the top of this file). Returns 0; or KP_EPROTO (malformed) or KP_ETOOBIG
 * (over a limit) with a one-line reason in errbuf naming the kind, column and row.
 */
int kp_batch_validate(const Kprof__V1__Batch *b, const struct kp_batch_limits *lim, char *errbuf,
                      size_t errlen);

/* True if s[0..len) is valid UTF-8 without NUL bytes. */
bool kp_utf8_valid(const char *s, size_t len);

/*
 * Appends kind k's rows of a validated batch to out in PostgreSQL COPY text format, in the
 * column order "run_id, rank, <spec columns>" (see kp_codec_copy_columns). name_ids maps the
 * batch's string indexes to names.id (entry 0 is ignored: index 0 is NULL). Returns the rows
 * written, or -ENOMEM.
 */
long kp_codec_copy_text(const Kprof__V1__Batch *b, enum kp_event_kind k, const int32_t *name_ids,
                        struct kp_strbuf *out);

/* Writes "run_id, rank, col, ..." for kind k into buf (the columns of its table, without the
 * side table's values). Returns buf. */
const char *kp_codec_copy_columns(enum kp_event_kind k, char *buf, size_t len);

/* Returns how many rows of kind k in b have a side value set (not NaN): the rows
 * kp_codec_side_copy_text writes. 0 when the kind has no side table or b carries none. */
size_t kp_batch_side_rows(const Kprof__V1__Batch *b, enum kp_event_kind k);

/*
 * Appends the side-table rows of kind k's rows of a validated batch to out in COPY text
 * format, in the order of kp_codec_side_columns: one per row with a side value set
 * (the others written as NaN); key columns the batch lacks are written as 0. Returns the
 * rows written, or -ENOMEM.
 */
long kp_codec_side_copy_text(const Kprof__V1__Batch *b, enum kp_event_kind k,
                             struct kp_strbuf *out);

/* Writes "run_id, rank, <key columns>, <side columns>" for kind k's side table into buf.
 * Returns buf ("" when the kind has none). */
const char *kp_codec_side_columns(enum kp_event_kind k, char *buf, size_t len);

/*
 * SQL: a LEFT JOIN that gives each row of `kernels` (which must be in the FROM clause without
 * a join before it; its columns are referred to unqualified) of run `run` and rank `rank`
 * (SQL expressions, e.g. "$1") its figures from kernel_occupancy as o.blocks_per_sm and
 * o.est_occupancy, NULL when it has none. The subquery's other columns are named o_* so that
 * unqualified kernels columns stay unambiguous. Rows of kernel_occupancy with the same key
 * are averaged, so the join never repeats a kernel.
 */
#define KP_SQL_KERNEL_OCCUPANCY_JOIN(run, rank)                                                 \
    " LEFT JOIN (SELECT start_ns AS o_start_ns, correlation AS o_correlation, stream AS "       \
    "o_stream, device AS o_device, avg(blocks_per_sm) AS blocks_per_sm, avg(est_occupancy) AS " \
    "est_occupancy FROM kernel_occupancy WHERE run_id = " run " AND rank = " rank               \
    " GROUP BY 1, 2, 3, 4) o ON o.o_start_ns = start_ns AND o.o_correlation = "                 \
    "coalesce(correlation, 0) AND o.o_stream = coalesce(stream, 0) AND o.o_device = "           \
    "coalesce(device, 0)"

/*
 * SQL: the same for a memcpys or memsets row and its side table (`side`: "memcpy_bandwidth" or
 * "memset_bandwidth"); `table` is the event table's name or alias in the FROM clause. Gives
 * the trace's bandwidth as bw.bandwidth_gbps, NULL when the event has none.
 */
#define KP_SQL_BANDWIDTH_JOIN(table, side, run, rank)                                     \
    " LEFT JOIN (SELECT start_ns AS b_start_ns, correlation AS b_correlation, stream AS " \
    "b_stream, device AS b_device, avg(bandwidth_gbps) AS bandwidth_gbps FROM " side      \
    " WHERE run_id = " run " AND rank = " rank                                            \
    " GROUP BY 1, 2, 3, 4) bw ON bw.b_start_ns = " table                                  \
    ".start_ns AND bw.b_correlation = coalesce(" table ".correlation, 0) AND "            \
    "bw.b_stream = coalesce(" table ".stream, 0) AND bw.b_device = coalesce(" table ".device, 0)"

/* Reads value i of a repeated numeric field as int64 (uint64 reinterpreted; validation
 * guarantees it fits). For callers that walk columns themselves (tests, analyzers). */
int64_t kp_codec_get_i64(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, size_t i);

/* Returns the descriptor of column c of kind k (resolved by kp_codec_selfcheck). */
const ProtobufCFieldDescriptor *kp_codec_field(enum kp_event_kind k, size_t c);

#endif
