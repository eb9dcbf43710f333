/*
 * kp_export: a run as Chrome trace JSON (Kineto's dialect) that ui.perfetto.dev and
 * chrome://tracing open and that `kprofctl import` reads back to the same rows (the inverse of
 * common/kp_kineto.h's mapping). kprof-analyzer serves it as Analyzer.Export
 * (analyzer/export_rpc.c); kprofctl export writes the files.
 *
 * One trace per rank, because a Kineto trace is one rank and that is what import reads back
 * exactly. Reading: PostgreSQL, in one REPEATABLE READ READ ONLY transaction (every rank of a
 * run comes from one snapshot), each table through a cursor fetched fetch_rows rows at a time:
 * memory stays bounded whatever the run's size (the tracks seen, for the metadata events, are
 * capped at KP_EXPORT_MAX_TRACKS). The JSON goes, in pieces of at most KP_EXPORT_CHUNK bytes
 * (gzip-compressed with zlib when asked), to the caller's sink.
 *
 * Layout of a file: {"schemaVersion": 1, "deviceProperties": [devices], "distributedInfo": the
 * imported trace's own (ranks.distributed_info: backend, pg_count, pg_config, nccl_version as
 * they were; none if the trace had none), else (a capture) {"backend": "nccl", "rank",
 * "world_size"} for a run of several ranks, else none (a one-rank run is not distributed),
 * "host_name", "kprof": {"run", "job"}, "displayTimeUnit": "ns",
 * "baseTimeNanoseconds": B, "traceEvents": [...], "traceName"} where B is the rank's time base
 * (ranks.time_base_ns: the imported trace's own baseTimeNanoseconds, so that import gives the
 * same base back and HTA's rounding of relative µs stays the same) or, for a rank without one,
 * the run's earliest start_ns; every ts/dur is µs after B with 3 decimals (exact to the ns; a ts
 * before the base is negative). Processes: the
 * rank's host process (pid = ranks.pid) with its threads (tid) as tracks, and one process per
 * GPU (pid = device id) with its streams (tid = stream). Events, in Kineto's categories and
 * arg names:
 *  - kernels → kernel; memcpys → gpu_memcpy named "Memcpy HtoD (Pinned -> Device)" from the
 *    kinds; memsets → gpu_memset "Memset (Device)"; syncs → cuda_sync "Stream Sync" ...;
 *    static_smem + dynamic_smem → "shared memory" (Kineto's single number); kernel_occupancy's
 *    blocks_per_sm and est_occupancy → "blocks per SM" and "est. achieved occupancy %";
 *    memcpys' and memsets' "memory bandwidth (GB/s)": memcpy_bandwidth's/memset_bandwidth's
 *    figure (the trace's, kept at import) when there is one, else bytes / dur_ns;
 *  - api_calls → cuda_runtime (domain 1), cuda_driver (2), overhead (other domains);
 *  - ops → cpu_op (CPU_OP), user_annotation (USER_ANNOTATION, NVTX, PROFILER_STEP),
 *    gpu_user_annotation (on the GPU process), python_function, and [memory] instants
 *    (kind 0). "External id" of a CPU op is its op_id (else its external_id). input_shapes and
 *    input_dtypes (Python literals, as import stores them) go back to JSON arrays;
 *  - collectives → the args of their record_param_comms cpu_op (same start, dur, tid and
 *    external id); a collective without such an op becomes its own record_param_comms op;
 *  - steps: implied by the ProfilerStep#N ops; a step row without its op becomes a
 *    ProfilerStep#N user_annotation;
 *  - memory_events → [memory] instants;
 *  - counters → cuda_profiler_range events, one per range (the rows sharing a correlation and
 *    device), in range order (the index its name row holds), named by the name row
 *    (KP_KINETO_RANGE_NAME_PREFIX), on pid = device, tid 0 with ts = dur = 0 (the range
 *    profiler's times are synthetic and not stored), args: device, correlation (unless it is
 *    KP_KINETO_RANGE_ID_BASE + index) and one number per metric. Counters without a name row
 *    (not from an import) become a range named "range";
 *  - ac2g flows: one start ("s") on the API call and one end ("f", bp "e") on each GPU
 *    activity that has its correlation (a CUDA-graph launch: one start, many ends);
 *  - process_name / process_sort_index / thread_name metadata for every track seen.
 * Not exported: api_calls.return_value, memsets.value and the step columns (import does not
 * fill them).
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
 * (kp_export_end), or KP_ENOTFOUND ("run 42 not found", or a run with no ranks), KP_EPG,
 * -ENOMEM with a message in err.
 */
int kp_export_begin(PGconn *pg, int64_t run, unsigned fetch_rows, struct kp_export **out, char *err,
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
void kp_export_end(struct kp_export *x);

#endif
