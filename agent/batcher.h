/*
 * kp_batcher: turns one process's raw kp_wire records of one capture window into
 * kprof.v1.Batch messages (one batcher per session per capture), built with
 * kp_batch_builder.
 *
 * The rules (docs/datapath.md "The batcher"): which records the window keeps and when
 * (some are held in a bounded pending list until their launch or the window's end is known),
 * each row's step and external_id, how batches are cut (batch_rows, batch_ms, WINDOW_END;
 * the last is always built), and the checks on malformed input: every value that lands in a
 * narrower SQL column is checked when its record arrives, and a record that fails is dropped
 * and counted (stats.malformed), never emitted. Every batch is checked with
 * kp_batch_validate; one that fails is counted (stats.invalid), never emitted.
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
 * batch of the capture. Returns 0 or a negative code (counted as emit_failed): a refused
 * batch's rows are counted as dropped, and they and its counters (and the RankInfo) go with
 * the next batch; a refused last batch is followed by one last batch without rows (rows 0),
 * which the callback should admit whenever it can, so the final counts arrive. */
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
    uint64_t malformed;       /* records and STEPs dropped for a value out of range */
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
 * kinds are ignored; malformed records are dropped and counted (docs/datapath.md). May emit
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
 * -ENOSPC when the callback refused the last batch (its rows are lost; the count-only batch
 * that followed may have got in). Later calls do nothing.
 */
int kp_batcher_window_end(struct kp_batcher *b, const struct kp_wire_window *w);

void kp_batcher_get_stats(const struct kp_batcher *b, struct kp_batcher_stats *out);

#endif
