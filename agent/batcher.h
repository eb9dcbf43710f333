/*
 * kp_batcher: turns one process's raw kp_wire records of one capture window into
 * kprof.v1.Batch messages (one batcher per session per capture).
 *
 * Window: a record is kept if its time is in [WINDOW_BEGIN.start_ns, end), end being
 * WINDOW_END.end_ns (or, for a step window, the start of step target + n_steps once that STEP
 * arrives). API calls, syncs and overhead records are judged by their own start; ranges are
 * kept if they overlap the window; GPU records (kernel, memcpy, memset) by the start of their
 * launch API record, found by correlation id (or by their own start if that API record never
 * arrives). A record whose fate is not known yet (its API record has not arrived, or the end
 * is not known yet and it starts after the last step known to be inside the window) is held
 * in a bounded pending list and decided when the missing piece arrives or at WINDOW_END.
 * Records that arrive before WINDOW_BEGIN are held the same way and judged at WINDOW_BEGIN.
 * When the pending list is full, its oldest entry is decided with what is known (kept unless
 * known to be outside).
 *
 * Step: API calls, syncs and ranges by their start against the STEP boundaries (the last step
 * that started at or before); GPU records take their API record's step and external_id (the
 * innermost NVTX range, i.e. the op). Steps rows come from STEP messages inside the window;
 * a step lasts until the next one starts, the last until the window's end. A record's step is
 * looked up when it is kept, not when it (or its API record) arrives: the library may send a
 * step's first records before that STEP, and such records are held (their start is past the
 * last step known to be inside) until the STEP or WINDOW_END comes.
 *
 * Batches: strings table per batch (index 0 = ""), start_ns delta-encoded from base_ns per
 * kind, rank_info in the first batch, stats (CaptureStats increments) on the next batch built.
 * A batch is cut at batch_rows rows, by kp_batcher_tick after batch_ms, and at WINDOW_END
 * (the last batch is always built, even empty, so the capture's end has a seq). Every batch is
 * checked with kp_batch_validate; one that fails is logged and counted, never emitted (a
 * kprof bug: the checks below make it impossible for any wire input).
 *
 * Malformed input: the wire comes from processes on the node (a buggy or hostile peer), so
 * every value that lands in a narrower SQL column (sql/migrations/0001_init.sql, the spec
 * table of common/kp_codec.c) is checked per record when it arrives, before anything else
 * uses it. A record that fails is dropped and counted (stats.malformed, records_in too): it
 * is not held, not remembered as a launch, and does not move the window; the other records of
 * the same message and batch are kept. One warn line names the kind, field and value (the
 * first, then at most one per KP_BATCHER_MALFORMED_LOG_MS with the count since), and
 * window_end logs the capture's total. Per field:
 *  - start_ns < 0 (not a CLOCK_REALTIME time) or end_ns < start_ns: dropped. Both >= 0 keeps
 *    every delta and duration within int64 (bigint).
 *  - device, context, stream, cuda_event, src_device, dst_device == 0xFFFFFFFF: CUPTI's
 *    "not applicable" (CUPTI_SYNCHRONIZATION_INVALID_VALUE), sent as 0 like the library does
 *    (kp_wire.h); any other value above the column (device: smallint, context and stream:
 *    integer) is dropped.
 *  - smallint columns (block_x/y/z, registers, copy_kind, src_kind, dst_kind, mem_kind,
 *    api domain, sync_type, range kind) > 32767, integer columns (grid_x/y/z, static_smem,
 *    dynamic_smem, graph_id, cbid) > 2^31-1: dropped. Enum values that fit are kept as they
 *    are (a newer library may add kinds).
 *  - uint64 values stored as bigint (correlation, graph_node_id, external_id, tid, bytes,
 *    range_id (op_id, external_id), parent_id) > 2^63-1: dropped.
 *  - string ids without text (never defined, invalid UTF-8, or past the batch's string table
 *    limit): the name is sent as index 0 (NULL), counted in missing_strings; not dropped.
 *  - STEP with step outside [0, 2^31-1] (the rows' step column is an integer) or start_ns < 0:
 *    ignored and counted in malformed.
 *  - counters (dropped, cupti_dropped, overhead_ns) saturate at 2^63-1 per batch.
 *  - rank_info from the options: job/host not valid UTF-8 are cleaned (bad bytes become '?'),
 *    device outside [-1, 32767] becomes -1, pid/local_rank/world_size above 2^31-1 become 0.
 *
 * Threads: one thread (the agent's loop) drives a batcher. Memory is bounded by batch_rows,
 * max_pending and max_corr.
 */
#ifndef KP_BATCHER_H
#define KP_BATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_wire.h"

struct kp_batcher;

/* Returns the NUL-terminated text of a wire string id (NULL if unknown) and its length. */
typedef const char *kp_batcher_string_cb(void *ud, uint32_t id, size_t *len);
/* Takes an encoded Batch (without stream and seq; buf borrowed). last is true for the final
 * batch of the capture. Returns 0 or a negative code (counted as emit_failed). */
typedef int kp_batcher_emit_cb(void *ud, const uint8_t *buf, size_t len, size_t rows, bool last);

#define KP_BATCHER_DEFAULT_ROWS     4000
#define KP_BATCHER_DEFAULT_PENDING  (1u << 18)
#define KP_BATCHER_DEFAULT_CORR     (1u << 20)
#define KP_BATCHER_MAX_STEPS        65536
#define KP_BATCHER_MALFORMED_LOG_MS 10000

struct kp_batcher_opts {
    uint64_t run_id;
    uint32_t rank;
    const char *job, *host; /* copied */
    uint32_t pid, local_rank, world_size;
    int32_t device;
    int64_t target_step; /* first step of the window, -1: time window */
    uint32_t n_steps;    /* 0: time window */
    uint32_t activities; /* KP_ACT_* of the capture (0: default); without RUNTIME, GPU records
                          * are judged by their own start at once */
    size_t batch_rows;   /* 0: KP_BATCHER_DEFAULT_ROWS */
    long long batch_ms;  /* 0: no time cut */
    size_t max_pending;  /* 0: KP_BATCHER_DEFAULT_PENDING */
    size_t max_corr;     /* 0: KP_BATCHER_DEFAULT_CORR */
    kp_batcher_string_cb *strings;
    kp_batcher_emit_cb *emit;
    void *ud;
};

struct kp_batcher_stats {
    uint64_t records_in;      /* records received */
    uint64_t kept;            /* rows put into batches (steps included) */
    uint64_t warmup;          /* discarded: before the window */
    uint64_t after;           /* discarded: after the window */
    uint64_t forced;          /* pending entries decided early because the list was full */
    uint64_t corr_full;       /* API records not remembered (correlation map full) */
    uint64_t missing_strings; /* string ids without text (sent as "") */
    uint64_t malformed;       /* records and STEPs dropped for a value out of range (above) */
    uint64_t batches;         /* emitted */
    uint64_t invalid;         /* built but failed validation (a bug): not emitted */
    uint64_t emit_failed;     /* the emit callback refused (spool full) */
    uint64_t bytes;           /* encoded bytes emitted */
    uint64_t pending;         /* held now */
};

/* Creates a batcher. Returns 0 and *out (kp_batcher_destroy), -ENOMEM, or -EINVAL (no emit
 * callback, run_id not in 1..2^31-1, or rank above 2^31-1: no batch could be valid). */
int kp_batcher_create(const struct kp_batcher_opts *o, struct kp_batcher **out);

void kp_batcher_destroy(struct kp_batcher *b);

/* The window began (WINDOW_BEGIN): held records are judged. */
void kp_batcher_window_begin(struct kp_batcher *b, const struct kp_wire_window *w);

/* A step started (STEP). A step out of range or a negative time is counted in malformed and
 * ignored; one that starts before the last known step is ignored. */
void kp_batcher_step(struct kp_batcher *b, const struct kp_wire_step *s);

/* count records of kind, rec_size bytes each (a RECORDS message, already checked). Unknown
 * kinds are ignored; malformed records are dropped and counted (see above). May emit
 * batches. */
void kp_batcher_records(struct kp_batcher *b, uint32_t kind, uint32_t rec_size, const void *recs,
                        uint32_t count);

/* The library's counters (STATUS or WINDOW_END totals): increments go on the next batch. */
void kp_batcher_counters(struct kp_batcher *b, uint64_t dropped, uint64_t cupti_dropped,
                         uint64_t overhead_ns);

/* Adds n records dropped by the agent itself (strings table full, ...). */
void kp_batcher_add_dropped(struct kp_batcher *b, uint64_t n);

/* Cuts a batch if rows have waited batch_ms. now_ms: CLOCK_MONOTONIC ms. */
void kp_batcher_tick(struct kp_batcher *b, long long now_ms);

/*
 * The window ended (WINDOW_END, or w NULL: the process is gone, end at the last time seen):
 * decides every pending record, adds the steps rows and emits the last batch. Returns 0, or
 * the emit callback's error for the last batch. Later calls do nothing.
 */
int kp_batcher_window_end(struct kp_batcher *b, const struct kp_wire_window *w);

void kp_batcher_get_stats(const struct kp_batcher *b, struct kp_batcher_stats *out);

#endif
