/*
 * roofline: achieved FLOP/s and bytes/s of one (run, rank)'s kernels against the device's
 * peaks, per kernel name or per op (PyProf's op and direction), from PyProf's per-kernel
 * table (pyprof.h: each kernel's duration, FLOPs, bytes, tc and params' type=).
 *
 * A group's figures (kernels whose FLOPs, or bytes, are unknown count only in its time):
 *   flop_per_s = Σ flops / Σ duration of the kernels with known FLOPs; bytes_per_s likewise;
 *   intensity  = Σ flops / Σ bytes over the kernels with both known (FLOP/byte);
 *   compute_fraction = Σ flops / Σ (peak_i × duration_i), each kernel against its own peak,
 *     so that a group mixing Tensor Core and CUDA-core kernels is judged fairly; peak_flop_per_s
 *     is that Σ (peak_i × duration_i) / Σ duration_i; bandwidth_fraction = bytes_per_s / the
 *     device's memory bandwidth. A figure without the data it needs is undefined.
 * A kernel's FLOPs and bytes are its share of its op's (pyprof.h: the op's work shared among
 * its kernels in proportion to their durations), so a kernel shows its op's achieved rate.
 * A figure above 100 % of its peak is flagged (above_peak), never printed silently.
 * Rows by kernel are keyed by the kernel's full name, as `kprofctl kernels` shows it.
 * Units: text shows µs and TFLOP/s, GB/s; CSV time_us (exact, 3 decimals) and per-second
 * figures; JSON exact integer time_ns.
 * The peak of a kernel: tc "1" (pyprof.h) uses the Tensor Core peak of its dtype (params'
 * type=: fp16/bf16 -> FP16 TC, fp32/tf32 -> TF32 TC, fp8 -> FP8 TC; a device without that
 * path uses its FP16 TC peak); any other kernel the CUDA-core FP32 peak, fp64 none.
 *
 * The device's peaks (kp_roofline_device_peaks): from its properties in `devices` when they are
 * complete (sm_count, clock_khz, compute capability and memory_bandwidth_bytes_per_s, as a
 * capture records them): FP32 = SMs × FP32 lanes per SM × 2 × clock, FP16 TC = SMs × dense
 * FP16 Tensor Core FLOP/clock/SM × clock (TF32 half of it, FP8 twice on 8.9/9.0); else from
 * the built-in table of datasheet figures matched by the device's name (imported Kineto
 * traces carry no clock or bandwidth); else none (fractions undefined).
 * Thread-safety: a result is used by one thread at a time.
 */
#ifndef KP_ROOFLINE_H
#define KP_ROOFLINE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KP_ROOFLINE_MAX_DEVICES 64

/* A compute peak class. */
enum kp_roofline_peak {
    KP_ROOFLINE_FP32,    /* CUDA cores, fp32 FMA */
    KP_ROOFLINE_TF32_TC, /* Tensor Cores, tf32 inputs */
    KP_ROOFLINE_FP16_TC, /* Tensor Cores, fp16/bf16 inputs, fp32 accumulate */
    KP_ROOFLINE_FP8_TC,  /* Tensor Cores, fp8 inputs */
    KP_ROOFLINE_PEAK_COUNT,
    KP_ROOFLINE_NO_PEAK = KP_ROOFLINE_PEAK_COUNT, /* fp64 and what has no peak here */
};

enum kp_roofline_by {
    KP_ROOFLINE_BY_KERNEL,
    KP_ROOFLINE_BY_OP,
};

enum kp_roofline_format {
    KP_ROOFLINE_TEXT,
    KP_ROOFLINE_CSV,
    KP_ROOFLINE_JSON,
};

/* One entry of the built-in table; 0: the GPU has no such path. */
struct kp_roofline_gpu {
    const char *entry;   /* "H100 SXM" */
    const char *model;   /* a whole word of the device name: "H100" */
    const char *variant; /* also in the name (any case), or NULL */
    double peak_flop_per_s[KP_ROOFLINE_PEAK_COUNT];
    double bandwidth_bytes_per_s;
};

struct kp_roofline_device {
    int id;
    char name[128];
    char entry[32];   /* the table entry used, "" when none */
    char source[512]; /* why these peaks: "table entry H100 SXM (device name ...)" */
    double peak_flop_per_s[KP_ROOFLINE_PEAK_COUNT]; /* 0: unknown */
    double bandwidth_bytes_per_s;                   /* 0: unknown */
};

struct kp_roofline_row {
    const char *name; /* the kernel's full name (as `kernels` shows it), or the op; borrowed
                       * from the struct kp_roofline (or the caller's reply) */
    char dir[8];      /* by op: "fprop" or "bprop"; "" by kernel */
    int device;       /* the first kernel's device, -1: none */
    char peak[8];     /* the class of its kernels' peak: fp32, tf32, fp16, fp8, mixed, - */
    uint64_t kernels;
    int64_t time_ns;
    double flops, bytes; /* over the kernels with known FLOPs, bytes */
    bool flops_known, bytes_known;
    double flop_per_s, bytes_per_s, intensity;
    double peak_flop_per_s, compute_fraction;
    double bandwidth_bytes_per_s, bandwidth_fraction;
    bool flop_per_s_defined, bytes_per_s_defined, intensity_defined;
    bool compute_fraction_defined, bandwidth_fraction_defined;
    /* The figures above 100 % of their peak: "compute", "bandwidth", "compute,bandwidth", or
     * "" for none. Physically impossible: the FLOP or byte model, or the peak, is wrong for
     * these kernels; every output shows it (never a silent 110 %). */
    char above_peak[24];
};

struct kp_roofline;

/* The built-in table entry for a device name, or NULL. */
const struct kp_roofline_gpu *kp_roofline_lookup(const char *device_name);

/* Fills d's peaks and source from its name and properties (see above); props 0 = unknown. */
void kp_roofline_device_peaks(struct kp_roofline_device *d, int sm_count, int clock_khz,
                              int cc_major, int cc_minor, double bandwidth_bytes_per_s);

/* Builds the roofline of run `run`, rank `rank` over c (the caller has checked that they
 * exist), rows by total time, longest first. With window_events > 0, PyProf's table is read a
 * window of about that many host events at a time, cut between steps (kp_pyprof_each):
 * the groups' sums are the same, added in the same order, while only a window's rows are held;
 * a rank that cannot be cut so returns KP_EWHOLE (0: whole). Returns 0 and *out
 * (kp_roofline_destroy), KP_EWHOLE, KP_EPG, -ENOMEM or KP_ETOOBIG (over max_rows rows; 0: no
 * limit), with a message in errbuf. */
int kp_roofline_create(PGconn *c, int64_t run, int rank, size_t max_rows, size_t window_events,
                       enum kp_roofline_by by, struct kp_roofline **out, char *errbuf,
                       size_t errlen);

/* How many windows r's rank was read in (1: whole). */
size_t kp_roofline_windows(const struct kp_roofline *r);

/* Frees a result; NULL is fine. */
void kp_roofline_destroy(struct kp_roofline *r);

/* The rows and the rank's devices, valid until kp_roofline_destroy. */
const struct kp_roofline_row *kp_roofline_rows(const struct kp_roofline *r, size_t *n);
const struct kp_roofline_device *kp_roofline_devices(const struct kp_roofline *r, size_t *n);

/* The name of a peak class ("fp16"). */
const char *kp_roofline_peak_name(enum kp_roofline_peak p);

/* Writes the devices and the first `top` rows (0: all). Text: a line per device saying
 * which peaks were used and why, then a table, and a line per row above a peak; CSV: the
 * rows; JSON: {"run", "rank", "by", "devices": [...], "rows": [...]}, undefined figures as
 * null, above_peak as a string or null. */
void kp_roofline_write(FILE *f, const struct kp_roofline *r, int64_t run, int rank,
                       enum kp_roofline_format fmt, size_t top);

/* kp_roofline_write over parts (borrowed): what a client of the Analyzer.Roofline rpc rebuilt from
 * its reply prints exactly what kprof-analyze prints. */
void kp_roofline_write_parts(FILE *f, enum kp_roofline_by by, const struct kp_roofline_device *devs,
                             size_t n_devs, const struct kp_roofline_row *rows, size_t n_rows,
                             int64_t run, int rank, enum kp_roofline_format fmt, size_t top);

/* kp_roofline_write_parts with text names cut to `width` display columns with "…" (0: no limit),
 * as kprofctl's -w does for every verb. */
void kp_roofline_write_parts_width(FILE *f, enum kp_roofline_by by,
                                   const struct kp_roofline_device *devs, size_t n_devs,
                                   const struct kp_roofline_row *rows, size_t n_rows, int64_t run,
                                   int rank, enum kp_roofline_format fmt, size_t top, int width);

/* How the rows are grouped. */
enum kp_roofline_by kp_roofline_group_by(const struct kp_roofline *r);

#endif
