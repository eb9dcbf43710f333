/*
 * counters: CUPTI counter values per kernel for one (run, rank), mapped to the op stack, with
 * FLOPs derived from the SASS instruction counters (HTA's get_cupti_counter_data_with_operators
 * and its CUPTI counter notebook; docs/specs/hta-analyses.md §10).
 *
 * What is read. The `counters` table: (metric, correlation, value, device) rows. A kernel (a
 * "range") is the set of rows sharing (correlation, device). Two kinds of correlation:
 *  - a CUPTI correlation (< KP_KINETO_RANGE_ID_BASE): kprof's own capture, or a Kineto range
 *    event that carried args.correlation. It is the kernel's launch: the api_calls row and the
 *    kernels row with that correlation give the thread, the launch time and the duration;
 *  - KP_KINETO_RANGE_ID_BASE + i: the i-th cuda_profiler_range event of an imported trace,
 *    which carries no correlation. As HTA does, the i-th such range (by i) is paired with the
 *    i-th runtime call whose name begins with "cudaLaunchKernel" (by start time), positionally;
 *    when the counts differ nothing is paired (HTA skips the rank): the rows keep their
 *    counters, with no op stack, and the result's message says why.
 * A row whose metric starts with KP_KINETO_RANGE_NAME_PREFIX names the range (the kernel's
 * name in Kineto's auto-range mode) and holds its index; without one, the name comes from the
 * kernels row of the correlation.
 *
 * The op stack: the cpu_op ops (OpKind CPU_OP) of the launching thread that enclose the launch
 * call in time, outermost first (HTA's top_level_op is the first, bottom_level_op the last).
 * Without an enclosing op the launch's external id names the innermost op.
 *
 * FLOPs (HTA's notebook; Kineto's kineto__cuda_core_flops metric set): per precision p in
 * d (fp64), f (fp32), h (fp16), flops_p = padd + pmul + 2 * pfma, from the counters
 * {smsp,sm}__sass_thread_inst_executed_op_<p>{add,mul,fma}_pred_on.sum; a precision is null
 * unless all three of its counters are there for that kernel. flops = the sum over the
 * precisions the run recorded any counter of; null when one of them is null for the kernel,
 * or when the run recorded none. flops_per_s = flops / duration, the duration being the
 * kernels row's, else the gpu__time_duration.sum counter (ns), else unknown (null). Counters
 * only count CUDA-core instructions: tensor-core math (sm__inst_executed_pipe_tensor) is not
 * FLOPs here, as in HTA.
 *
 * A counter missing for a kernel is unknown (NaN in the row, null in JSON, "-" in text, an
 * empty CSV field), never 0.
 * Thread-safety: a result is used by one thread at a time.
 */
#ifndef KP_COUNTERS_H
#define KP_COUNTERS_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum kp_counters_prec {
    KP_COUNTERS_FP64,
    KP_COUNTERS_FP32,
    KP_COUNTERS_FP16,
    KP_COUNTERS_PREC_COUNT
};

struct kp_counters_row {
    uint64_t idx;          /* 1-based, in range order */
    int64_t range;         /* the range's index (Kineto), -1 when the rows give none */
    int device;            /* -1: none */
    int64_t correlation;   /* the launch's CUPTI correlation; -1: unknown */
    int64_t tid;           /* the launching thread; -1: unknown */
    const char *kernel;    /* "" when unknown */
    const char *top_op;    /* outermost enclosing op; NULL: none */
    const char *bottom_op; /* innermost; NULL: none */
    const char **stack;    /* n_stack op names, outermost first */
    size_t n_stack;
    int64_t dur_ns; /* -1: unknown */
    double *values; /* one per kp_counters_metrics entry; NaN: not recorded for the kernel */
    double flops;   /* NaN: unknown (see the top of this file) */
    double flops_prec[KP_COUNTERS_PREC_COUNT]; /* NaN: unknown */
    double flops_per_s;                        /* NaN: unknown */
};

struct kp_counters;

/* Builds the table of run `run`, rank `rank` over c. Returns 0 and *out (free with
 * kp_counters_destroy); KP_ENOTFOUND if the run or rank does not exist; KP_EPG, -ENOMEM or
 * KP_ETOOBIG (more than max_rows rows read; 0: no limit), with a message in errbuf. Blocks
 * on PostgreSQL. */
int kp_counters_create(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_counters **out,
                       char *errbuf, size_t errlen);

/* Frees a table; NULL is fine. */
void kp_counters_destroy(struct kp_counters *t);

/* The rows, valid until kp_counters_destroy. */
const struct kp_counters_row *kp_counters_rows(const struct kp_counters *t, size_t *n);

/* The metric names (sorted), valid until kp_counters_destroy; row values follow this order. */
const char *const *kp_counters_metrics(const struct kp_counters *t, size_t *n);

/* Why the table is empty or has no op stacks ("no CUPTI counters in run 3 rank 0: ..."), or
 * NULL when there is nothing to say. Valid until kp_counters_destroy. */
const char *kp_counters_message(const struct kp_counters *t);

enum kp_counters_format {
    KP_COUNTERS_TEXT, /* aligned columns; NULL as "-" */
    KP_COUNTERS_CSV,  /* header first; fields quoted when needed (RFC 4180); NULL empty */
    KP_COUNTERS_JSON,
};

/* The default columns of the text format; CSV and JSON default to every column. */
#define KP_COUNTERS_TEXT_COLUMNS "idx,kernel,device,top_op,bottom_op,dur_us,flops,flops_per_s"
/* The most columns one output shows (15 fixed, the rest metrics; "all" stops there). */
#define KP_COUNTERS_MAX_COLS 512

/*
 * Writes the table. columns: a comma-separated list of column names (idx, range, kernel,
 * device, correlation, tid, top_op, bottom_op, op_stack, dur_us, flops, flops_fp64,
 * flops_fp32, flops_fp16, flops_per_s, any metric name, or "all"); NULL or "": the format's
 * default. The duration is dur_us in text and CSV (µs, three decimals: exact) and exact
 * integer dur_ns in JSON (-c takes either name). Text cells are cut at 60 bytes with "...".
 * JSON: {"run", "rank", "metrics": [...], "message": str|null, "rows": [{...}]}, op_stack an
 * array, every metric under "counters" by default. Returns 0, -EINVAL with errbuf naming an
 * unknown column, or -EIO when writing failed.
 */
int kp_counters_write(FILE *f, const struct kp_counters *t, int64_t run, int rank,
                      const char *columns, enum kp_counters_format format, char *errbuf,
                      size_t errlen);

/* The same for rows the caller holds (kprofctl's, from the Analyzer.Counters reply), so that
 * every output of the table comes from one writer: metrics (sorted) name the rows' values,
 * message is kp_counters_message's (NULL or "": none). */
int kp_counters_write_rows(FILE *f, const struct kp_counters_row *rows, size_t n_rows,
                           const char *const *metrics, size_t n_metrics, const char *message,
                           int64_t run, int rank, const char *columns,
                           enum kp_counters_format format, char *errbuf, size_t errlen);

/* kp_counters_write_rows with text cells cut at width bytes instead of 60 (0: 60), for
 * kprofctl's -w. */
int kp_counters_write_rows_width(FILE *f, const struct kp_counters_row *rows, size_t n_rows,
                                 const char *const *metrics, size_t n_metrics, const char *message,
                                 int64_t run, int rank, const char *columns,
                                 enum kp_counters_format format, int width, char *errbuf,
                                 size_t errlen);

#endif
