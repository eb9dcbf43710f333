/*
 * kp_export: a run as Chrome trace JSON (Kineto's dialect) that ui.perfetto.dev and
 * chrome://tracing open and that `kprofctl import` reads back to the same rows (the inverse of
 * import/kp_kineto.h's mapping). kprof-analyzer serves it as Analyzer.Export
 * (analyzer/export_rpc.c); kprofctl export writes the files.
 *
 * One trace per rank, because a Kineto trace is one rank and that is what import reads back
 * exactly. Reading: PostgreSQL, in one REPEATABLE READ READ ONLY transaction (every rank of a
 * run comes from one snapshot), each table through a cursor fetched fetch_rows rows at a time:
 * memory stays bounded whatever the run's size (the tracks seen, for the metadata events, are
 * capped at KP_EXPORT_MAX_TRACKS). The JSON goes, in pieces of at most KP_EXPORT_CHUNK bytes
 * (gzip-compressed with zlib when asked), to the caller's sink.
 *
 * The layout of a file and how each table becomes events: docs/specs/export.md.
 *
 * Errors: KP_EPG (PostgreSQL), KP_ENOTFOUND (no such run, or rank), -ENOMEM, or what the sink
 * returned; each with a message in the caller's buffer. Not thread-safe: one export per
 * object, one object per PostgreSQL connection.
 */
#ifndef KP_EXPORT_H
#define KP_EXPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "kp_codec.h"

#define KP_EXPORT_CHUNK      (1u << 20) /* the most bytes one sink call gets */
#define KP_EXPORT_MAX_TRACKS (1u << 16)
#define KP_EXPORT_FETCH_ROWS 10000

/* Takes the next len bytes of the rank's file (borrowed for the call). Returns 0, or a
 * negative code that stops the export and is returned by kp_export_rank. */
typedef int kp_export_sink(void *ud, const void *data, size_t len);

struct kp_export;

struct kp_export_stats {
    uint64_t json_bytes; /* before compression */
    uint64_t events;
    uint64_t flows; /* ac2g flow ends */
    uint64_t rows[KP_EV_COUNT];
};

/*
 * Begins the export of run over pg (borrowed; it must be idle): opens the read-only snapshot,
 * checks the run and lists its ranks. fetch_rows 0: KP_EXPORT_FETCH_ROWS. Returns 0 and *out
 * (kp_export_close), or KP_ENOTFOUND ("run 42 not found", or a run with no ranks), KP_EPG,
 * -ENOMEM with a message in err.
 */
int kp_export_open(PGconn *pg, int64_t run, unsigned fetch_rows, struct kp_export **out, char *err,
                   size_t errlen);

/* The run's ranks, ascending (borrowed from x), and its world size. */
const int32_t *kp_export_ranks(const struct kp_export *x, size_t *n);

/*
 * Writes rank's trace to sink, gzip-compressed (level 1..9) when gzip_level > 0. Returns 0 and
 * *st, or an error (a rank not in the run: KP_ENOTFOUND) with err set.
 */
int kp_export_rank(struct kp_export *x, int32_t rank, int gzip_level, kp_export_sink *sink,
                   void *ud, struct kp_export_stats *st, char *err, size_t errlen);

/* Ends the snapshot and frees x. Accepts NULL. */
void kp_export_close(struct kp_export *x);

#endif
