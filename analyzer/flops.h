/*
 * flops: FLOPs and estimated DRAM bytes of one PyTorch op from its name, input shapes and
 * dtypes, as docs/specs/flops-bytes.md describes PyProf's formulas (§3), extended to the
 * ops PyProf leaves out (attention, layer/group/RMS norm, gelu/silu, baddbmm, conv3d and
 * transposed convolutions, pooling, fused optimizers...) with torch.utils.flop_counter's
 * formulas where it has one (§8). 1 FMA = 2 FLOPs.
 *
 * An op's work is split into parts, its phases: a forward GEMM is one part; its backward is
 * dgrad, wgrad (and the bias gradient). PyProf's table (pyprof.h) shares their sum among the
 * op's kernels in proportion to their durations, so an op is counted once, not once per
 * kernel (the spec's §9.2 defect), and no kernel shows more than its op's rate.
 *
 * Inputs are trace data: every parser here accepts any text and reports what it could not
 * read as unknown, never crashes.
 * Thread-safety: pure functions over caller memory.
 */
#ifndef KP_FLOPS_H
#define KP_FLOPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KP_FLOPS_MAX_ARGS   32 /* inputs kept per op; more are dropped */
#define KP_FLOPS_MAX_DIMS   8  /* dims kept per tensor; a tensor with more is unknown */
#define KP_FLOPS_MAX_SUB    64 /* tensors kept inside lists, over all the list inputs */
#define KP_FLOPS_MAX_PARTS  3
#define KP_FLOPS_PARAMS_LEN 256

enum kp_flops_kind {
    KP_FLOPS_NONE,   /* `[]` with a non-tensor dtype (Scalar, "", ...) or no dtype */
    KP_FLOPS_TENSOR, /* a shape (0-d: `[]` with a tensor dtype) */
    KP_FLOPS_LIST,   /* a list of shapes: sub[first .. first + n) */
};

struct kp_flops_tensor {
    int ndim;
    int64_t dim[KP_FLOPS_MAX_DIMS];
    int esize;      /* bytes per element, 0: unknown dtype */
    char dtype[24]; /* short PyProf name: fp16, bf16, fp32, int64, ...; "" unknown */
};

struct kp_flops_arg {
    enum kp_flops_kind kind;
    struct kp_flops_tensor t; /* KP_FLOPS_TENSOR */
    int first, n;             /* KP_FLOPS_LIST */
};

struct kp_flops_args {
    int n;
    struct kp_flops_arg a[KP_FLOPS_MAX_ARGS];
    int n_sub;
    struct kp_flops_tensor sub[KP_FLOPS_MAX_SUB];
};

enum kp_flops_dir {
    KP_FLOPS_FWD,
    KP_FLOPS_BWD
};

/* What a kernel of the op may use (PyProf's tc column, spec §4). */
enum kp_flops_tc {
    KP_FLOPS_TC_NA,   /* no formula: "-" */
    KP_FLOPS_TC_GEMM, /* GEMM-like: "1" if the kernel name says so, else "0" */
    KP_FLOPS_TC_CONV, /* convolution: "1" or "-" */
};

struct kp_flops_result {
    bool known;       /* a formula applied; false: flops and bytes unknown */
    bool bytes_known; /* false when a dtype it needs is missing (NVTX shapes carry none) */
    int n_parts;
    double flops[KP_FLOPS_MAX_PARTS];
    double bytes[KP_FLOPS_MAX_PARTS];
    enum kp_flops_tc tc; /* set from the op's kind even when known is false */
    const char *family;  /* "gemm", "conv", ..., "unknown" */
    char params[KP_FLOPS_PARAMS_LEN];
};

/* Parses stored shapes ("[[32, 64], [64, 128], []]", tensor lists as "[[[5, 128], [5, 128]]]")
 * and dtypes ("['float', 'c10::Half', 'Scalar']", JSON or Python quoting; NULL or "": none)
 * into *out. Returns 0, or -EINVAL for text it cannot read (out is then empty). */
int kp_flops_parse(const char *shapes, const char *dtypes, struct kp_flops_args *out);

/* Bytes per element of a dtype name (Kineto C++ names, torch names, c10d names), 0: unknown.
 * Writes the short name (fp16, fp32, ...) to short_name when not NULL. */
int kp_flops_dtype_size(const char *name, char *short_name, size_t len);

/* The op's name without its namespace and overload: "aten::add_" -> "add_". */
const char *kp_flops_base_name(const char *op, char *buf, size_t len);

/* Whether a formula exists for the op name (any namespace prefix allowed). */
bool kp_flops_has_formula(const char *op);

/* FLOPs and bytes of op (`aten::addmm`, `addmm`, ...) over args, in direction dir. For a
 * convolution, out_hint (may be NULL) is the output's shape when the caller knows it (the
 * backward node's grad_output); without it stride 1, padding 0 and dilation 1 are assumed
 * (PyProf's defaults: Kineto records no IntList values). Always fills *out; out->known says
 * whether a formula applied. */
void kp_flops_compute(const char *op, const struct kp_flops_args *args, enum kp_flops_dir dir,
                      const struct kp_flops_tensor *out_hint, struct kp_flops_result *out);

/* The part of r that the kernel with sub-sequence id sub receives (0 past the last part). */
double kp_flops_part_flops(const struct kp_flops_result *r, int sub);
double kp_flops_part_bytes(const struct kp_flops_result *r, int sub);

#endif
