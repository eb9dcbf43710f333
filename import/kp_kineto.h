/*
 * kp_kineto: a streaming reader of torch.profiler (Kineto) chrome-trace JSON that turns the
 * trace into kprof protocol batches (proto/kprof.proto), in constant memory whatever the file
 * size. Reference: docs/specs/torch-trace-formats.md, Part B; the rules (parsing, the two
 * passes, the spool, the Kineto → kprof mapping, times): docs/datapath.md "The Kineto
 * importer".
 *
 * Two passes: an import scans a file first (cb NULL: every event is parsed, mapped and
 * checked, batches built and validated, nothing sent) to learn a struct kp_kineto_meta (the
 * time base, rank, devices may come anywhere in the file), then parses it again with
 * opts.meta set and a callback that sends the batches; a file that scans clean converts
 * clean. Or one pass: the scan keeps its batches in a spool and kp_kineto_spool_replay sends
 * them.
 *
 * Errors: bad JSON, a wrong type, a missing field, an out-of-range value or hostile sizes stop
 * the parse with KP_EPROTO and a one-line message giving the line, column, byte offset in the
 * (decompressed) JSON and the event index, e.g.
 *   "line 40, column 77 (byte 5124), traceEvents[12]: args.grid must be an array of 3 ints".
 *
 * Thread-safety: none needed; a parse uses only its own state.
 */
#ifndef KP_KINETO_H
#define KP_KINETO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kp_codec.h"
#include "kp_kineto_ids.h"
#include "kprof.pb-c.h"

#define KP_KINETO_DEFAULT_BATCH_ROWS       4096
#define KP_KINETO_DEFAULT_MAX_STRING_BYTES (1u << 20)
#define KP_KINETO_DEFAULT_MAX_DEPTH        64
#define KP_KINETO_MAX_DEVICES              64
/* cuda_profiler_range events (docs/datapath.md, Mapping) may carry up to KP_KINETO_MAX_COUNTERS
 * metrics each; their ids: kp_kineto_ids.h. */
#define KP_KINETO_MAX_COUNTERS  256
#define KP_KINETO_MAX_DIST_JSON 8192 /* distributedInfo kept as JSON text, at most */

/* The event categories counted while parsing (file side of the import's accounting). */
enum kp_kineto_cat {
    KP_KINETO_CPU_OP,              /* cpu_op, Operator */
    KP_KINETO_USER_ANNOTATION,     /* user_annotation (ProfilerStep# included) */
    KP_KINETO_GPU_USER_ANNOTATION, /* gpu_user_annotation, gpu_user_Annotation, User */
    KP_KINETO_PYTHON_FUNCTION,
    KP_KINETO_CUDA_RUNTIME, /* cuda_runtime, Runtime */
    KP_KINETO_CUDA_DRIVER,
    KP_KINETO_KERNEL,
    KP_KINETO_GPU_MEMCPY,
    KP_KINETO_GPU_MEMSET,
    KP_KINETO_CUDA_SYNC,
    KP_KINETO_MEMORY,         /* [memory] and [OutOfMemory] instants */
    KP_KINETO_FLOW_AC2G,      /* ac2g, async, async_gpu, async_cpu_to_gpu (s and f) */
    KP_KINETO_FLOW_FWDBWD,    /* fwdbwd, forward_backward (s and f) */
    KP_KINETO_PROFILER_STEP,  /* ProfilerStep#N CPU slices (also counted in their cat) */
    KP_KINETO_COLLECTIVE,     /* record_param_comms with Collective name (also cpu_op) */
    KP_KINETO_PROFILER_RANGE, /* cuda_profiler_range (CUPTI range profiler counters) */
    KP_KINETO_METADATA,       /* ph M */
    KP_KINETO_SKIPPED,        /* everything else */
    KP_KINETO_CAT_COUNT
};

/* Labels of enum kp_kineto_cat, for logs and JSON ("cpu_op", "ac2g", ...). */
extern const char *const kp_kineto_cat_names[KP_KINETO_CAT_COUNT];

struct kp_kineto_device {
    uint32_t id;
    char name[128];
    uint32_t sm_count, cc_major, cc_minor, max_threads_per_block, max_threads_per_sm;
    uint32_t regs_per_block, regs_per_sm, smem_per_block, smem_per_sm, warp_size;
    uint64_t global_memory_bytes;
};

/* What a parse learned about the file; filled by every parse, needed by the second. */
struct kp_kineto_meta {
    bool has_rank;       /* distributedInfo.rank was present */
    uint32_t rank;       /* distributedInfo.rank */
    uint32_t world_size; /* distributedInfo.world_size, 0 if absent */
    int64_t base_ns;     /* baseTimeNanoseconds, 0 if absent */
    char host[256];      /* host_name / hostname metadata, "" if absent */
    uint32_t pid;        /* pid of the first CPU event, 0 if none */
    int32_t device;      /* device of the first GPU event, -1 if none */
    size_t n_devices;
    struct kp_kineto_device devices[KP_KINETO_MAX_DEVICES];
    uint64_t json_bytes;                /* decompressed bytes parsed */
    uint64_t events;                    /* traceEvents entries */
    uint64_t cats[KP_KINETO_CAT_COUNT]; /* per category */
    uint64_t rows[KP_EV_COUNT];         /* rows produced per kind */
    uint64_t batches;                   /* batches produced */
    uint64_t ext_dropped;               /* External ids dropped by the trap rule */
    uint64_t names_truncated;           /* names cut to max_name_bytes */
    int64_t min_ns, max_ns;             /* span of the events' start times */
    /* The "PyTorch Profiler (0)" Trace span (the last by ts if several), its ts as in the
     * file (relative to base_ns), for rank_info.profiler_start_ns/_end_ns */
    bool has_profiler_span;
    int64_t profiler_ts_ns, profiler_dur_ns;
    /* distributedInfo as JSON text (", " and ": " separators), for rank_info.distributed_info;
     * "" when absent or longer than KP_KINETO_MAX_DIST_JSON or max_name_bytes */
    char dist_json[KP_KINETO_MAX_DIST_JSON];
};

struct kp_kineto_spool;

/* Reads up to len bytes into buf. Returns the count, 0 at the end, or a negative code with a
 * message in errbuf (e.g. a gzip error). */
typedef ssize_t kp_kineto_read_cb(void *ud, void *buf, size_t len, char *errbuf, size_t errlen);

/* Receives a batch (borrowed: valid until the callback returns). Returns 0 to go on, or a
 * negative code that stops the parse and is returned by it. */
typedef int kp_kineto_batch_cb(Kprof__V1__Batch *b, void *ud);

/* Progress: bytes of input consumed so far (compressed bytes for gzip files). */
typedef void kp_kineto_progress_cb(uint64_t in_bytes, void *ud);

struct kp_kineto_opts {
    uint64_t run_id;                   /* copied into every batch */
    uint32_t rank;                     /* copied into every batch */
    const char *job;                   /* rank_info.job; NULL: "" */
    uint32_t world_size;               /* rank_info.world_size */
    const struct kp_kineto_meta *meta; /* from the scan: base_ns, devices, host; NULL in
                                        * a scan (then cb must be NULL too) */
    uint32_t batch_rows;               /* rows per batch; 0: KP_KINETO_DEFAULT_BATCH_ROWS */
    size_t max_string_bytes;           /* longest JSON string; 0: default (1 MiB) */
    size_t max_name_bytes;             /* names are cut to this; 0: the codec default */
    uint32_t max_depth;                /* JSON nesting; 0: KP_KINETO_DEFAULT_MAX_DEPTH */
    bool partial;                      /* on a parse error, still send the rows read before
                                        * it (the error is returned all the same) */
    kp_kineto_progress_cb *progress;   /* may be NULL; called once per chunk */
    void *progress_ud;
    struct kp_kineto_spool *spool; /* a scan (cb NULL) keeps its batches here; a fresh
                                    * spool per parse; NULL: none */
};

/*
 * Parses one trace from read (see the top of this file). With cb NULL it scans: builds and
 * validates the batches and drops them, or keeps them in opts.spool. meta_out (required) gets
 * what was learned. Returns 0; KP_EPROTO with the position and reason in errbuf; the read
 * callback's error; cb's error; -ENOMEM; or -EINVAL for bad opts (a cb without opts.meta; a
 * spool with a cb, with opts.meta, or already used). A spool only fails quietly (it becomes
 * unusable and the replay says KP_KINETO_REPARSE); a scan that fails leaves it unusable.
 * Blocks only in read and cb.
 */
int kp_kineto_parse(kp_kineto_read_cb *read, void *read_ud, const struct kp_kineto_opts *opts,
                    kp_kineto_batch_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                    char *errbuf, size_t errlen);

/* kp_kineto_parse over a memory buffer (borrowed). */
int kp_kineto_parse_mem(const void *data, size_t len, const struct kp_kineto_opts *opts,
                        kp_kineto_batch_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                        char *errbuf, size_t errlen);

/*
 * kp_kineto_parse over a file, gzip-compressed or plain (zlib tells them apart). errbuf
 * starts with the path ("trace.json.gz: gzip: invalid stored block lengths (compressed byte
 * 40960)", "x.json: line 3, column 9 (byte 60): ..."). Returns as kp_kineto_parse, or
 * -errno if the file cannot be opened.
 */
int kp_kineto_parse_file(const char *path, const struct kp_kineto_opts *opts,
                         kp_kineto_batch_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                         char *errbuf, size_t errlen);

/* Receives one encoded Batch (borrowed: valid until the callback returns) whose stream and
 * seq are unset (kp_push_send_encoded appends them). Returns 0 or a negative code that stops
 * the replay and is returned by it. */
typedef int kp_kineto_encoded_cb(const void *buf, size_t len, void *ud);

/* kp_kineto_spool_replay's answer when the spool cannot stand for a second parse; the
 * callback was not called: parse the file again with kp_kineto_parse_file. */
#define KP_KINETO_REPARSE 1

/* Creates an empty spool that keeps up to mem_limit bytes in memory (0: none), the rest in
 * a temporary file created when needed. Returns 0 and *out, or -ENOMEM. */
int kp_kineto_spool_create(size_t mem_limit, struct kp_kineto_spool **out);

/* Frees the spool and its file. Accepts NULL. */
void kp_kineto_spool_destroy(struct kp_kineto_spool *s);

/* Bytes the spool holds in memory (after its scan: what it keeps until the replay). */
size_t kp_kineto_spool_mem_bytes(const struct kp_kineto_spool *s);

/* Bytes of encoded batches the spool holds, in memory and on disk. */
uint64_t kp_kineto_spool_bytes(const struct kp_kineto_spool *s);

/*
 * Sends the batches of a clean scan through cb, in order, as the second parse with the same
 * opts would (opts.meta: that scan's meta, plus run_id, rank, job, world_size; opts.progress
 * gets the input position each batch was read at). meta_out gets the scan's meta, its times
 * shifted like the rows. Returns 0; KP_KINETO_REPARSE (nothing sent) if the spool cannot be
 * used; cb's error; or -EIO / -ENOMEM with a message in errbuf. One replay per spool.
 */
int kp_kineto_spool_replay(struct kp_kineto_spool *s, const struct kp_kineto_opts *opts,
                           kp_kineto_encoded_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                           char *errbuf, size_t errlen);

/* Finds a rank in a trace's file name: "rank-3", "rank_3", "rank3", "worker3" (any case),
 * the last such match in the base name. Returns the rank, or -1 if there is none. */
long kp_kineto_rank_from_name(const char *path);

#endif
