/*
 * pyprof: PyProf's per-kernel table (docs/specs/flops-bytes.md §5-§6) for one (run,
 * rank): one row per kernel in launch order with its 20 columns (idx, seq, altseq, tid, layer,
 * trace, dir, sub, mod, op, kernel, params, sil, tc, device, stream, grid, block, flops, bytes).
 *
 * How each column is derived (kprof's reading of the spec, on the stored rows):
 *  - the kernel's op is the op whose op_id is the kernel's external_id (its API call's when
 *    the kernel has none); its stack is the ops of the same thread that enclose it in time;
 *  - dir: bprop when the stack holds a backward node (a non-aten op with a seq whose name
 *    says Backward/backward), else fprop. seq: the node's seq (bprop), else the attributed
 *    op's or its nearest enclosing op's; altseq: the stack's other seqs;
 *  - the attributed op, fprop: the outermost ATen op of the stack with a formula (PyProf's
 *    "outermost marker wins": linear over addmm), else the innermost op. bprop: the forward
 *    op with the node's seq (on the node's fwd_tid when set; the one whose name matches the
 *    node's, else the outermost), evaluated backward as PyProf does; without one, the
 *    innermost op with a formula inside the node, evaluated as itself;
 *  - sub: the kernel's ordinal among the kernels of its backward node (bprop) or of its
 *    attributed op (fprop); flops/bytes: the op's whole work (the sum of its parts, flops.h)
 *    shared among the kernels of that op evaluation (the op's, or the backward node's) in
 *    proportion to their durations (equally without durations), helper kernels (layout
 *    changes, Winograd transforms, split-K reductions) included: an op is counted once and
 *    each of its kernels shows the op's own achieved rate, so a kernel is above a peak
 *    exactly when its op is (roofline flags it: e.g. direct-convolution FLOPs for a
 *    Winograd algorithm). null (JSON) / "-" when the op has no formula or its shapes (or
 *    dtypes, for bytes) are missing;
 *  - mod/op: aten::x -> torch.nn.functional (functional ops), Tensor (in-place/dunder) or
 *    torch, and x; other namespaces ns::x -> ns, x; bprop without forward: the node's name
 *    before Backward, mod na;
 *  - layer: enclosing "layer:NAME" annotations joined with ':'; trace: the innermost
 *    enclosing python_function; kernel: the short name (§4); tc: kp_an_is_tc_kernel on the
 *    full name for GEMM and conv ops (1/0, conv 1/-), - for the others, na without an op;
 *    tid: the launching op's thread; sil: the kernel's duration in ns; device, stream, grid
 *    and block ("x,y,z") as stored.
 * Thread-safety: a table is used by one thread at a time.
 */
#ifndef KP_PYPROF_H
#define KP_PYPROF_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum kp_pyprof_col {
    KP_PYPROF_IDX,
    KP_PYPROF_SEQ,
    KP_PYPROF_ALTSEQ,
    KP_PYPROF_TID,
    KP_PYPROF_LAYER,
    KP_PYPROF_TRACE,
    KP_PYPROF_DIR,
    KP_PYPROF_SUB,
    KP_PYPROF_MOD,
    KP_PYPROF_OP,
    KP_PYPROF_KERNEL,
    KP_PYPROF_PARAMS,
    KP_PYPROF_SIL,
    KP_PYPROF_TC,
    KP_PYPROF_DEVICE,
    KP_PYPROF_STREAM,
    KP_PYPROF_GRID,
    KP_PYPROF_BLOCK,
    KP_PYPROF_FLOPS,
    KP_PYPROF_BYTES,
    KP_PYPROF_COL_COUNT
};

/* The default column list (PyProf's). */
#define KP_PYPROF_DEFAULT_COLUMNS "idx,dir,sub,mod,op,kernel,params,sil"
#define KP_PYPROF_DEFAULT_WIDTH   0 /* no cut: every column as wide as its longest cell */

enum kp_pyprof_format {
    KP_PYPROF_TEXT, /* columnated to a width */
    KP_PYPROF_CSV,  /* every field double-quoted, header first */
    KP_PYPROF_JSON,
};

struct kp_pyprof_row {
    uint64_t idx;
    int64_t seq; /* -1: none */
    /* The text columns point into the table (each distinct value stored once: they repeat
     * from kernel to kernel) or, in rows rebuilt from a reply, into the reply. */
    const char *altseq;
    int64_t tid;
    const char *layer; /* "-" when none */
    const char *trace; /* "-" when none */
    bool bwd;
    int sub;
    const char *mod, *op, *kernel; /* kernel: PyProf's short name */
    const char *kernel_full;       /* the stored name (as `kernels` shows it); borrowed from the
                                    * table, NULL in rows rebuilt from a reply */
    const char *params;
    int64_t sil_ns;
    const char *tc;
    int device, stream; /* -1: none */
    const char *grid, *block;
    double flops, bytes;
    bool flops_known, bytes_known;
};

struct kp_pyprof;

/* Builds the table of run `run`, rank `rank` over c (the caller has checked that they exist).
 * Returns 0 and *out (free with kp_pyprof_destroy), KP_EPG, -ENOMEM or KP_ETOOBIG (more than
 * max_rows rows; 0: no limit), with a message in errbuf. */
int kp_pyprof_create(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_pyprof **out,
                     char *errbuf, size_t errlen);

/* Calls each(ud, table) with PyProf's table of run `run`, rank `rank`: with window_events 0 the
 * whole table once, else the tables of its windows of about window_events host events, cut
 * between steps (kp_an_plan_windows whole_steps: a backward op's forward op, of the same step,
 * is in its window), in order, each freed when each returns, only a window's rows loaded at a
 * time. Their rows together are the whole table's: kernels come in launch order, a window's
 * are those it launched, numbered on from the windows before; a window's ops are those that
 * start in it and the python functions and NVTX ranges that reach into it from before (read
 * once: no cut avoids them, a script's top frame spans the run). *windows says how many tables
 * came. Returns 0,
 * KP_EWHOLE where the rank cannot be cut between steps (none came), each's nonzero return, or
 * kp_pyprof_create's errors. */
int kp_pyprof_each(PGconn *c, int64_t run, int rank, size_t max_rows, size_t window_events,
                   int (*each)(void *ud, const struct kp_pyprof *table), void *ud, size_t *windows,
                   char *errbuf, size_t errlen);

/* kp_pyprof_create's table gathered from kp_pyprof_each's windows (window_events 0: whole),
 * what each window loads freed before the next: the same rows, while the rank's rows are never
 * loaded at once. Returns as kp_pyprof_each. */
int kp_pyprof_create_windowed(PGconn *c, int64_t run, int rank, size_t max_rows,
                              size_t window_events, struct kp_pyprof **out, size_t *windows,
                              char *errbuf, size_t errlen);

/* Frees a table; NULL is fine. */
void kp_pyprof_destroy(struct kp_pyprof *p);

/* The rows, valid until kp_pyprof_destroy. */
const struct kp_pyprof_row *kp_pyprof_rows(const struct kp_pyprof *p, size_t *n);

/* Parses a comma-separated column list ("idx,dir,op") into cols (at most max). Returns the
 * count, or -EINVAL naming the bad column in errbuf. */
int kp_pyprof_parse_columns(const char *list, enum kp_pyprof_col *cols, int max, char *errbuf,
                            size_t errlen);

/* The option name of a column ("idx"). */
const char *kp_pyprof_col_name(enum kp_pyprof_col c);

/* Writes the selected columns of every row. Text and CSV show sil in µs ("Sil(us)", three
 * decimals: exact); JSON keeps it as exact integer ns under "sil_ns" (the key "columns"
 * lists), and flops/bytes with all their digits. Text columns are as wide as their longest
 * cell; width > 0 cuts cells wider than width display columns with "…" (kprofctl's -w in
 * every verb), 0 none. JSON: {"run", "rank", "columns", "rows": [{key: value}]}, numbers as
 * numbers, unknown flops/bytes as null. */
void kp_pyprof_write(FILE *f, const struct kp_pyprof *p, int64_t run, int rank,
                     const enum kp_pyprof_col *cols, int ncols, enum kp_pyprof_format fmt,
                     int width);

/* The same for rows the caller holds (e.g. a reply of Analyzer.Prof), so
 * every output of the table comes from one writer. */
void kp_pyprof_write_rows(FILE *f, const struct kp_pyprof_row *rows, size_t n_rows, int64_t run,
                          int rank, const enum kp_pyprof_col *cols, int ncols,
                          enum kp_pyprof_format fmt, int width);

/*
 * The same table written as its rows come (kprofctl prof, from Analyzer.ProfRows' pages), byte
 * for byte what kp_pyprof_write_rows writes for them all: JSON and CSV rows are written as they
 * come; a text table's columns are as wide as their longest cell, so its cells are kept until
 * the end (in memory up to 16 MiB, then in an unlinked file in $TMPDIR) and its lines written
 * at close. Memory stays bounded either way.
 */
struct kp_pyprof_writer;

/* Starts a table on f (borrowed), writing its header (JSON, CSV). Returns 0 and *out (end it
 * with kp_pyprof_writer_close), or -ENOMEM. */
int kp_pyprof_writer_open(FILE *f, int64_t run, int rank, const enum kp_pyprof_col *cols, int ncols,
                          enum kp_pyprof_format fmt, int width, struct kp_pyprof_writer **out);

/* The next rows (borrowed for the call). Returns 0, or a negative errno with a message in
 * errbuf (text: its cells could not be kept). */
int kp_pyprof_writer_rows(struct kp_pyprof_writer *w, const struct kp_pyprof_row *rows, size_t n,
                          char *errbuf, size_t errlen);

/* Ends the table and frees w (NULL is fine): with complete, JSON's closing or every line of the
 * text; without (the rows stopped short), nothing more is written. Returns 0, or a negative
 * errno with a message in errbuf (text: its kept cells could not be read back). */
int kp_pyprof_writer_close(struct kp_pyprof_writer *w, bool complete, char *errbuf, size_t errlen);

#endif
