/*
 * flops: FLOPs and bytes per op (see flops.h; formulas from docs/specs/flops-bytes.md).
 *
 * DESIGN. kp_flops_parse reads the stored text into fixed arrays (no allocation, so junk can
 * only make it return -EINVAL). kp_flops_compute looks the op's base name up in one table of
 * (name, family, constant) rows; each family function reads the tensors it needs, returns
 * false when they are missing or inconsistent (the op is then "unknown"), and fills the
 * parts. Deliberate choices where the spec leaves kprof to decide (§9):
 *  - an op is counted once: its work goes to its first kernel(s) by part, not to every kernel;
 *  - GEMM bytes carry the batch factor (PyProf's Matmul omits it) and no precedence bug;
 *  - GEMM params are printed row-major: M = output rows, N = output columns (PyProf swaps);
 *  - non-tensor arguments (Python scalars) add no bytes (PyProf sizes them as 4-byte tensors);
 *  - backward of binary ops never fails: add/sub move 2·B(out), the others 3·B(out) and
 *    E(out) FLOPs;
 *  - IntList arguments are not in Kineto traces: convolutions assume stride 1, padding 0,
 *    dilation 1 unless the caller passes the output shape; groups = C / weight[1];
 *    reductions= of losses are taken as "mean".
 */
#include "flops.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM_VALUE ((int64_t) 1 << 40)

/* ---- parsing ------------------------------------------------------------------------- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
        p++;
    }
    return p;
}

/* Parses "[d0, d1, ...]" (p at '[') into t. Returns the text after ']' or NULL. */
static const char *parse_dims(const char *p, struct kp_flops_tensor *t)
{
    p = skip_ws(p + 1);
    t->ndim = 0;
    if (*p == ']') {
        return p + 1;
    }
    for (;;) {
        int64_t v = 0;

        if (*p < '0' || *p > '9') {
            return NULL;
        }
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p - '0');
            if (v > MAX_DIM_VALUE) {
                return NULL;
            }
            p++;
        }
        if (t->ndim >= KP_FLOPS_MAX_DIMS) {
            return NULL;
        }
        t->dim[t->ndim++] = v;
        p = skip_ws(p);
        if (*p == ']') {
            return p + 1;
        }
        if (*p != ',') {
            return NULL;
        }
        p = skip_ws(p + 1);
    }
}

static int parse_shapes(const char *p, struct kp_flops_args *out)
{
    p = skip_ws(p);
    if (*p != '[') {
        return -EINVAL;
    }
    p = skip_ws(p + 1);
    if (*p == ']') {
        return *skip_ws(p + 1) ? -EINVAL : 0;
    }
    for (;;) {
        struct kp_flops_arg *a;

        if (*p != '[') {
            return -EINVAL;
        }
        if (out->n >= KP_FLOPS_MAX_ARGS) {
            return -EINVAL;
        }
        a = &out->a[out->n];
        memset(a, 0, sizeof(*a));
        if (*skip_ws(p + 1) == '[') { /* a list of shapes */
            a->kind = KP_FLOPS_LIST;
            a->first = out->n_sub;
            p = skip_ws(p + 1);
            for (;;) {
                if (*p != '[' || out->n_sub >= KP_FLOPS_MAX_SUB) {
                    return -EINVAL;
                }
                memset(&out->sub[out->n_sub], 0, sizeof(out->sub[0]));
                p = parse_dims(p, &out->sub[out->n_sub]);
                if (!p) {
                    return -EINVAL;
                }
                out->n_sub++;
                a->n++;
                p = skip_ws(p);
                if (*p == ']') {
                    p++;
                    break;
                }
                if (*p != ',') {
                    return -EINVAL;
                }
                p = skip_ws(p + 1);
            }
        }
        else {
            p = parse_dims(p, &a->t);
            if (!p) {
                return -EINVAL;
            }
            a->kind = a->t.ndim > 0 ? KP_FLOPS_TENSOR : KP_FLOPS_NONE;
        }
        out->n++;
        p = skip_ws(p);
        if (*p == ']') {
            return *skip_ws(p + 1) ? -EINVAL : 0;
        }
        if (*p != ',') {
            return -EINVAL;
        }
        p = skip_ws(p + 1);
    }
}

struct dtype_row {
    const char *name;
    int size;
    const char *short_name;
};

static const struct dtype_row dtypes[] = {
    { "bool", 1, "bool" },
    { "Bool", 1, "bool" },
    { "unsigned char", 1, "uint8" },
    { "uint8", 1, "uint8" },
    { "byte", 1, "uint8" },
    { "Byte", 1, "uint8" },
    { "signed char", 1, "int8" },
    { "int8", 1, "int8" },
    { "char", 1, "int8" },
    { "Char", 1, "int8" },
    { "short", 2, "int16" },
    { "int16", 2, "int16" },
    { "Short", 2, "int16" },
    { "unsigned short", 2, "uint16" },
    { "uint16", 2, "uint16" },
    { "UInt16", 2, "uint16" },
    { "int", 4, "int32" },
    { "int32", 4, "int32" },
    { "Int", 4, "int32" },
    { "unsigned int", 4, "uint32" },
    { "uint32", 4, "uint32" },
    { "UInt32", 4, "uint32" },
    { "long", 8, "int64" },
    { "long int", 8, "int64" },
    { "long long", 8, "int64" },
    { "__int64", 8, "int64" },
    { "int64", 8, "int64" },
    { "Long", 8, "int64" },
    { "unsigned long", 8, "uint64" },
    { "uint64", 8, "uint64" },
    { "UInt64", 8, "uint64" },
    { "c10::Half", 2, "fp16" },
    { "float16", 2, "fp16" },
    { "half", 2, "fp16" },
    { "Half", 2, "fp16" },
    { "c10::BFloat16", 2, "bf16" },
    { "bfloat16", 2, "bf16" },
    { "BFloat16", 2, "bf16" },
    { "float", 4, "fp32" },
    { "float32", 4, "fp32" },
    { "Float", 4, "fp32" },
    { "double", 8, "fp64" },
    { "float64", 8, "fp64" },
    { "Double", 8, "fp64" },
    { "c10::complex<c10::Half>", 4, "c32" },
    { "ComplexHalf", 4, "c32" },
    { "c10::complex<float>", 8, "c64" },
    { "ComplexFloat", 8, "c64" },
    { "c10::complex<double>", 16, "c128" },
    { "ComplexDouble", 16, "c128" },
    { "c10::qint8", 1, "qint8" },
    { "QInt8", 1, "qint8" },
    { "c10::quint8", 1, "quint8" },
    { "QUInt8", 1, "quint8" },
    { "c10::qint32", 4, "qint32" },
    { "QInt32", 4, "qint32" },
};

int kp_flops_dtype_size(const char *name, char *short_name, size_t len)
{
    const char *s = name;
    int size = 0;
    const char *sh = "";

    if (!name) {
        return 0;
    }
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            size = dtypes[i].size;
            sh = dtypes[i].short_name;
            break;
        }
    }
    if (!size) {
        if (strncmp(s, "c10::", 5) == 0) {
            s += 5;
        }
        if (strncmp(s, "Float8_", 7) == 0 || strncmp(s, "float8_", 7) == 0) {
            size = 1;
            sh = "fp8";
        }
    }
    if (short_name && len) {
        snprintf(short_name, len, "%s", sh);
    }
    return size;
}

/* IValue tags and Kineto's non-tensor types: `[]` with these is not a tensor. */
static bool non_tensor_type(const char *s)
{
    static const char *const tags[] = {
        "",       "Scalar", "ScalarList", "TensorList",  "GenericList", "IntList",
        "String", "None",   "Device",     "Layout",      "Int",         "Double",
        "Bool",   "Float",  "ScalarType", "MemoryFormat"
    };

    for (size_t i = 0; i < sizeof(tags) / sizeof(tags[0]); i++) {
        if (strcmp(s, tags[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Applies the quoted strings of dtypes to out's arguments in order. */
static int apply_dtypes(const char *p, struct kp_flops_args *out)
{
    int i = 0;

    while (*p) {
        char q, buf[64];
        size_t n = 0;

        if (*p != '\'' && *p != '"') {
            p++;
            continue;
        }
        q = *p++;
        while (*p && *p != q) {
            if (n + 1 < sizeof(buf)) {
                buf[n++] = *p;
            }
            p++;
        }
        if (!*p) {
            return -EINVAL;
        }
        p++;
        buf[n] = '\0';
        if (i < out->n) {
            struct kp_flops_arg *a = &out->a[i];

            if (a->kind == KP_FLOPS_TENSOR || a->kind == KP_FLOPS_NONE) {
                if (a->kind == KP_FLOPS_NONE && !non_tensor_type(buf) &&
                    kp_flops_dtype_size(buf, NULL, 0) > 0) {
                    a->kind = KP_FLOPS_TENSOR; /* a 0-d tensor */
                }
                if (a->kind == KP_FLOPS_TENSOR) {
                    a->t.esize = kp_flops_dtype_size(buf, a->t.dtype, sizeof(a->t.dtype));
                }
            }
        }
        i++;
    }
    return 0;
}

int kp_flops_parse(const char *shapes, const char *dtypes_text, struct kp_flops_args *out)
{
    int rc;

    memset(out, 0, sizeof(*out));
    if (!shapes) {
        return -EINVAL;
    }
    rc = parse_shapes(shapes, out);
    if (rc == 0 && dtypes_text && dtypes_text[0]) {
        rc = apply_dtypes(dtypes_text, out);
    }
    if (rc < 0) {
        memset(out, 0, sizeof(*out));
    }
    return rc;
}

/* ---- helpers ------------------------------------------------------------------------- */

struct ctx {
    const struct kp_flops_args *args;
    enum kp_flops_dir dir;
    const struct kp_flops_tensor *hint;
    struct kp_flops_result *r;
    const char *name; /* base name */
    bool aten;        /* the name had the aten:: namespace */
    double k;         /* the row's constant */
    bool no_bytes;    /* a dtype that bytes need is unknown */
};

static const struct kp_flops_tensor *arg_t(const struct ctx *c, int i)
{
    if (i < 0 || i >= c->args->n || c->args->a[i].kind != KP_FLOPS_TENSOR) {
        return NULL;
    }
    return &c->args->a[i].t;
}

/* The i-th tensor argument, skipping the others. */
static const struct kp_flops_tensor *nth_t(const struct ctx *c, int i)
{
    for (int j = 0; j < c->args->n; j++) {
        if (c->args->a[j].kind == KP_FLOPS_TENSOR && i-- == 0) {
            return &c->args->a[j].t;
        }
    }
    return NULL;
}

static double E(const struct kp_flops_tensor *t)
{
    double e = 1;

    for (int i = 0; i < t->ndim; i++) {
        e *= (double) t->dim[i];
    }
    return e;
}

static double S(struct ctx *c, const struct kp_flops_tensor *t)
{
    if (t->esize <= 0) {
        c->no_bytes = true;
    }
    return t->esize;
}

static double Bt(struct ctx *c, const struct kp_flops_tensor *t)
{
    return E(t) * S(c, t);
}

static void part(struct ctx *c, double flops, double bytes)
{
    struct kp_flops_result *r = c->r;

    if (r->n_parts < KP_FLOPS_MAX_PARTS) {
        r->flops[r->n_parts] = flops;
        r->bytes[r->n_parts] = bytes;
        r->n_parts++;
    }
}

static void pcat(struct kp_flops_result *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void pcat(struct kp_flops_result *r, const char *fmt, ...)
{
    size_t n = strlen(r->params);
    va_list ap;

    if (n + 1 >= sizeof(r->params)) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(r->params + n, sizeof(r->params) - n, fmt, ap);
    va_end(ap);
}

static void pshape(struct kp_flops_result *r, const struct kp_flops_tensor *t)
{
    pcat(r, "[");
    for (int i = 0; i < t->ndim; i++) {
        pcat(r, "%s%" PRId64, i ? "," : "", t->dim[i]);
    }
    pcat(r, "]%s", t->dtype);
}

/* PyProf's generic params: every tensor as [d0,d1]dtype, separated by ';'. */
static void params_tensors(const struct kp_flops_args *args, struct kp_flops_result *r)
{
    bool first = true;

    r->params[0] = '\0';
    for (int i = 0; i < args->n; i++) {
        const struct kp_flops_arg *a = &args->a[i];

        if (a->kind == KP_FLOPS_TENSOR) {
            pcat(r, "%s", first ? "" : ";");
            pshape(r, &a->t);
            first = false;
        }
        else if (a->kind == KP_FLOPS_LIST) {
            for (int j = 0; j < a->n; j++) {
                pcat(r, "%s", first ? "" : ";");
                pshape(r, &args->sub[a->first + j]);
                first = false;
            }
        }
    }
}

static const char *dt(const struct kp_flops_tensor *t)
{
    return t->dtype[0] ? t->dtype : "na";
}

/* ---- GEMM (§3.1, §8) ------------------------------------------------------------------ */

/* Sets the GEMM result: batch b, output [m, n], inner k; with_bias adds a bias-grad part. */
static bool gemm(struct ctx *c, double b, double m, double n, double k,
                 const struct kp_flops_tensor *A, const struct kp_flops_tensor *B, bool with_bias)
{
    double f = 2 * b * m * n * k;
    double by = b * (m * k * S(c, A) + k * n * S(c, B) + m * n * S(c, A));

    c->r->tc = KP_FLOPS_TC_GEMM;
    c->r->family = "gemm";
    if (c->dir == KP_FLOPS_FWD) {
        part(c, f, by);
    }
    else {
        part(c, f, by); /* dgrad */
        part(c, f, by); /* wgrad */
        if (with_bias) {
            part(c, b * m * n, 2 * b * m * n * S(c, A));
        }
    }
    c->r->params[0] = '\0';
    if (b != 1) {
        pcat(c->r, "B=%.0f,", b);
    }
    pcat(c->r, "M=%.0f,N=%.0f,K=%.0f,type=%s", m, n, k, dt(A));
    return true;
}

static bool fam_mm(struct ctx *c)
{
    /* mm(A, B), _scaled_mm(A, B, ...); addmm/baddbmm/addbmm(C, A, B); bmm(A, B) */
    int o = c->k > 0 ? 1 : 0;
    const struct kp_flops_tensor *A = arg_t(c, o), *B = arg_t(c, o + 1);

    if (!A || !B) {
        return false;
    }
    if (A->ndim == 2 && B->ndim == 2 && A->dim[1] == B->dim[0]) {
        return gemm(c, 1, (double) A->dim[0], (double) B->dim[1], (double) A->dim[1], A, B, o > 0);
    }
    if (A->ndim == 3 && B->ndim == 3 && A->dim[0] == B->dim[0] && A->dim[2] == B->dim[1]) {
        return gemm(c, (double) A->dim[0], (double) A->dim[1], (double) B->dim[2],
                    (double) A->dim[2], A, B, o > 0);
    }
    return false;
}

static bool fam_mv(struct ctx *c)
{
    /* mv(A[m,k], x[k]); addmv(y, A, x); dot/vdot(a[k], b[k]) */
    int o = c->k > 0 ? 1 : 0;
    const struct kp_flops_tensor *A = arg_t(c, o), *x = arg_t(c, o + 1);

    if (!A || !x || x->ndim != 1) {
        return false;
    }
    if (A->ndim == 2 && A->dim[1] == x->dim[0]) {
        return gemm(c, 1, (double) A->dim[0], 1, (double) A->dim[1], A, x, o > 0);
    }
    if (A->ndim == 1 && A->dim[0] == x->dim[0]) {
        return gemm(c, 1, 1, 1, (double) A->dim[0], A, x, false);
    }
    return false;
}

/* broadcast of batch dims a[0..na) and b[0..nb) into prod. */
static bool bcast_prod(const int64_t *a, int na, const int64_t *b, int nb, double *prod)
{
    int n = na > nb ? na : nb;

    *prod = 1;
    for (int i = 0; i < n; i++) {
        int64_t x = i < n - na ? 1 : a[i - (n - na)];
        int64_t y = i < n - nb ? 1 : b[i - (n - nb)];

        if (x != y && x != 1 && y != 1) {
            return false;
        }
        *prod *= (double) (x > y ? x : y);
    }
    return true;
}

static bool fam_matmul(struct ctx *c)
{
    /* matmul(A, B) with PyTorch broadcasting (§3.1 shape rules) */
    const struct kp_flops_tensor *A = arg_t(c, 0), *B = arg_t(c, 1);
    int na, nb;
    double batch = 1;

    if (!A || !B) {
        return false;
    }
    na = A->ndim;
    nb = B->ndim;
    /* torch refuses a 0-d operand ("both arguments to matmul need to be at least 1D") */
    if (na < 1 || nb < 1) {
        return false;
    }
    if (na == 1 && nb == 1) {
        return A->dim[0] == B->dim[0] && gemm(c, 1, 1, 1, (double) A->dim[0], A, B, false);
    }
    if (na == 1) {
        if (A->dim[0] != B->dim[nb - 2]) {
            return false;
        }
        bcast_prod(B->dim, nb - 2, NULL, 0, &batch);
        return gemm(c, batch, 1, (double) B->dim[nb - 1], (double) A->dim[0], A, B, false);
    }
    if (nb == 1) {
        if (A->dim[na - 1] != B->dim[0]) {
            return false;
        }
        bcast_prod(A->dim, na - 2, NULL, 0, &batch);
        return gemm(c, batch, (double) A->dim[na - 2], 1, (double) B->dim[0], A, B, false);
    }
    if (A->dim[na - 1] != B->dim[nb - 2] || !bcast_prod(A->dim, na - 2, B->dim, nb - 2, &batch)) {
        return false;
    }
    return gemm(c, batch, (double) A->dim[na - 2], (double) B->dim[nb - 1], (double) A->dim[na - 1],
                A, B, false);
}

static bool fam_linear(struct ctx *c)
{
    /* linear(x[..., k], w[out, k], b[out]?): M = Π x[:-1], N = out, K = k */
    const struct kp_flops_tensor *x = arg_t(c, 0), *w = arg_t(c, 1);
    double m = 1;

    if (!x || !w || w->ndim != 2 || x->ndim < 1 || x->dim[x->ndim - 1] != w->dim[1]) {
        return false;
    }
    for (int i = 0; i < x->ndim - 1; i++) {
        m *= (double) x->dim[i];
    }
    return gemm(c, 1, m, (double) w->dim[0], (double) w->dim[1], x, w, arg_t(c, 2) != NULL);
}

/* ---- convolution (§3.2, §8) ----------------------------------------------------------- */

/* c->k: 1 normal, 2 transposed, 3 convolution_backward (grad_out, input, weight). */
static bool fam_conv(struct ctx *c)
{
    int o = c->k == 3 ? 1 : 0;
    const struct kp_flops_tensor *x = arg_t(c, o), *w = arg_t(c, o + 1);
    const struct kp_flops_tensor *hint = c->k == 3 ? arg_t(c, 0) : c->hint;
    double N = 1, C, K, g = 1, in_sp = 1, out_sp = 1, ker = 1, f, by;
    int d, xs; /* spatial rank, first spatial dim of x */
    int64_t out[KP_FLOPS_MAX_DIMS];
    bool transposed = c->k == 2;

    if (!x || !w || w->ndim < 3 || w->ndim > 5) {
        return false;
    }
    d = w->ndim - 2;
    if (x->ndim == w->ndim) {
        xs = 2;
    }
    else if (x->ndim == w->ndim - 1) {
        xs = 1; /* unbatched */
    }
    else {
        return false;
    }
    if (xs == 2) {
        N = (double) x->dim[0];
    }
    C = (double) x->dim[xs - 1];
    if (!transposed) {
        if (w->dim[1] <= 0 || x->dim[xs - 1] <= 0 || x->dim[xs - 1] % w->dim[1] != 0) {
            return false;
        }
        g = (double) (x->dim[xs - 1] / w->dim[1]);
        K = (double) w->dim[0];
    }
    else {
        if (w->dim[0] != x->dim[xs - 1]) {
            return false;
        }
        K = (double) w->dim[1]; /* groups unknown: 1 */
    }
    for (int i = 0; i < d; i++) {
        int64_t I = x->dim[xs + i], R = w->dim[2 + i];

        if (hint && hint->ndim == x->ndim) {
            out[i] = hint->dim[xs + i];
        }
        else {
            out[i] = transposed ? I + (R - 1) : I - (R - 1);
        }
        if (out[i] <= 0) {
            return false;
        }
        in_sp *= (double) I;
        out_sp *= (double) out[i];
        ker *= (double) R;
    }
    if (!transposed) {
        f = 2 * N * K * out_sp * (C / g) * ker;
    }
    else {
        f = 2 * N * in_sp * ker * (double) w->dim[0] * (double) w->dim[1];
    }
    by = S(c, x) * (E(x) + E(w) + N * K * out_sp);
    c->r->tc = KP_FLOPS_TC_CONV;
    c->r->family = "conv";
    if (c->k == 3 || c->dir == KP_FLOPS_BWD) {
        part(c, f, by); /* dgrad */
        part(c, f, by); /* wgrad */
    }
    else {
        part(c, f, by);
    }
    c->r->params[0] = '\0';
    pcat(c->r, "N=%.0f,C=%.0f,K=%.0f,in=", N, C, K);
    for (int i = 0; i < d; i++) {
        pcat(c->r, "%s%" PRId64, i ? "x" : "", x->dim[xs + i]);
    }
    pcat(c->r, ",out=");
    for (int i = 0; i < d; i++) {
        pcat(c->r, "%s%" PRId64, i ? "x" : "", out[i]);
    }
    pcat(c->r, ",kernel=");
    for (int i = 0; i < d; i++) {
        pcat(c->r, "%s%" PRId64, i ? "x" : "", w->dim[2 + i]);
    }
    pcat(c->r, ",g=%.0f,type=%s", g, dt(x));
    return true;
}

/* ---- attention (§8) ------------------------------------------------------------------- */

/* c->k: 1 q/k/v as [b, h, s, d] (scaled_dot_product_*), 2 as [b, s, h, d] (flash kernels). */
static bool fam_attention(struct ctx *c)
{
    const struct kp_flops_tensor *q = arg_t(c, 0), *k = arg_t(c, 1), *v = arg_t(c, 2);
    double b = 1, h, sq, sk, D, Dv, f, by;
    int n;

    if (!q || !k || !v || q->ndim < 3 || k->ndim != q->ndim || v->ndim != q->ndim) {
        return false;
    }
    n = q->ndim;
    if (c->k == 2) {
        if (n != 4) {
            return false;
        }
        b = (double) q->dim[0];
        sq = (double) q->dim[1];
        h = (double) q->dim[2];
        sk = (double) k->dim[1];
        if (v->dim[1] != k->dim[1]) {
            return false;
        }
    }
    else {
        for (int i = 0; i < n - 3; i++) {
            b *= (double) q->dim[i];
        }
        h = (double) q->dim[n - 3];
        sq = (double) q->dim[n - 2];
        sk = (double) k->dim[n - 2];
        if (v->dim[n - 2] != k->dim[n - 2]) {
            return false;
        }
    }
    D = (double) q->dim[n - 1];
    Dv = (double) v->dim[n - 1];
    if (k->dim[n - 1] != q->dim[n - 1]) {
        return false;
    }
    c->r->tc = KP_FLOPS_TC_GEMM;
    c->r->family = "attention";
    if (c->dir == KP_FLOPS_FWD) {
        f = 2 * b * h * sq * sk * D + 2 * b * h * sq * sk * Dv;
        by = Bt(c, q) + Bt(c, k) + Bt(c, v) + b * h * sq * Dv * S(c, q);
    }
    else {
        f = b * h * sq * sk * (6 * D + 4 * Dv);
        by = 2 * (Bt(c, q) + Bt(c, k) + Bt(c, v) + b * h * sq * Dv * S(c, q));
    }
    part(c, f, by);
    c->r->params[0] = '\0';
    pcat(c->r, "B=%.0f,H=%.0f,Sq=%.0f,Sk=%.0f,D=%.0f,Dv=%.0f,type=%s", b, h, sq, sk, D, Dv, dt(q));
    return true;
}

/* ---- element-wise, activations, norms, softmax (§3.4-§3.7, §3.11) --------------------- */

static const struct kp_flops_tensor *first_tensor(const struct ctx *c)
{
    return nth_t(c, 0);
}

/* Unary: c->k FLOPs per element, 2·B(x) bytes, direction ignored (Pointwise). */
static bool fam_unary(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);

    if (!x) {
        return false;
    }
    c->r->family = "pointwise";
    part(c, c->k * E(x), 2 * Bt(c, x));
    return true;
}

/* Activation: c->k FLOPs per element both ways; bytes 2·B(x) fwd, 3·B(x) bwd. */
static bool fam_activation(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);

    if (!x) {
        return false;
    }
    c->r->family = "activation";
    part(c, c->k * E(x), (c->dir == KP_FLOPS_FWD ? 2 : 3) * Bt(c, x));
    return true;
}

/* Dropout: 5·E(x) FLOPs, 2·B(x) bytes, both ways (§3.11). */
static bool fam_dropout(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);

    if (!x) {
        return false;
    }
    c->r->family = "dropout";
    part(c, 5 * E(x), 2 * Bt(c, x));
    return true;
}

/* Broadcast output of every tensor argument (numpy rules) into out; false if incompatible. */
static bool bcast_out(const struct ctx *c, struct kp_flops_tensor *out, int *count)
{
    memset(out, 0, sizeof(*out));
    *count = 0;
    for (int i = 0; i < c->args->n; i++) {
        const struct kp_flops_tensor *t = arg_t(c, i);
        int n;
        int64_t d[KP_FLOPS_MAX_DIMS];

        if (!t) {
            continue;
        }
        if (*count == 0) {
            *out = *t;
            (*count)++;
            continue;
        }
        n = out->ndim > t->ndim ? out->ndim : t->ndim;
        for (int j = 0; j < n; j++) {
            int64_t x = j < n - out->ndim ? 1 : out->dim[j - (n - out->ndim)];
            int64_t y = j < n - t->ndim ? 1 : t->dim[j - (n - t->ndim)];

            if (x != y && x != 1 && y != 1) {
                return false;
            }
            d[j] = x == 1 ? y : x;
        }
        out->ndim = n;
        memcpy(out->dim, d, sizeof(d[0]) * (size_t) n);
        (*count)++;
    }
    return *count > 0;
}

/* Binary/ternary: c->k FLOPs per output element; bytes Σ B(tensor inputs) + B(out).
 * k = 1 arithmetic, 0.5 add/sub (marks the backward rule), 1.25 comparisons (bool out),
 * 20 pow, 3 ternary, 1.5 where (1 FLOP, bool condition). */
static bool fam_binary(struct ctx *c)
{
    struct kp_flops_tensor out;
    int count;
    double in_bytes = 0, per = c->k, out_s;
    bool cmp = c->k == 1.25, addsub = c->k == 0.5;

    if (!bcast_out(c, &out, &count)) {
        return false;
    }
    if (cmp || addsub || c->k == 1.5) {
        per = 1;
    }
    for (int i = 0; i < c->args->n; i++) {
        const struct kp_flops_tensor *t = arg_t(c, i);

        if (t) {
            in_bytes += Bt(c, t);
        }
    }
    out_s = cmp ? 1 : S(c, c->k == 1.5 && nth_t(c, 1) ? nth_t(c, 1) : first_tensor(c));
    c->r->family = "pointwise";
    if (c->dir == KP_FLOPS_FWD || per == 20 || c->k == 3) {
        part(c, per * E(&out), in_bytes + E(&out) * out_s);
    }
    else if (addsub) {
        part(c, 0, 2 * E(&out) * out_s);
    }
    else {
        part(c, E(&out), 3 * E(&out) * out_s);
    }
    return true;
}

/* Reductions: sum (k 1), mean (k 2: E+1, B+S), norm (k 3: 2E+1), max/min/prod... (k 4),
 * cumsum (k 5: E, 2B). Output writes are not counted (§3.8). */
static bool fam_reduce(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);
    int k = (int) c->k;

    if (!x) {
        return false;
    }
    c->r->family = "reduction";
    if (k == 2) {
        part(c, E(x) + 1, Bt(c, x) + S(c, x));
    }
    else if (k == 3) {
        part(c, 2 * E(x) + 1, Bt(c, x));
    }
    else if (k == 5) {
        part(c, E(x), 2 * Bt(c, x));
    }
    else {
        part(c, E(x), Bt(c, x));
    }
    return true;
}

/* Softmax (k 40) and log_softmax (k 21): fwd 3·B(x), bwd 5·B(x) (§3.5). */
static bool fam_softmax(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);

    if (!x) {
        return false;
    }
    c->r->family = "softmax";
    part(c, c->k * E(x), (c->dir == KP_FLOPS_FWD ? 3 : 5) * Bt(c, x));
    return true;
}

/* batch_norm: 8·E(x) FLOPs; fwd 4·B(x), bwd 5·B(x) (§3.4). */
static bool fam_batchnorm(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);

    if (!x) {
        return false;
    }
    c->r->family = "norm";
    part(c, 8 * E(x), (c->dir == KP_FLOPS_FWD ? 4 : 5) * Bt(c, x));
    return true;
}

/* layer/group/instance norm (k 8) and RMS norm (k 4): c->k·E(x) FLOPs both ways; bytes fwd
 * 2·B(x) (read x, write y), bwd 3·B(x) (read x and dy, write dx), plus the weight and bias
 * once (kprof's estimate: PyProf has none). */
static bool fam_norm(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);
    double pb = 0;

    if (!x) {
        return false;
    }
    for (int i = 1; i < c->args->n; i++) {
        const struct kp_flops_tensor *t = arg_t(c, i);

        if (t && t->ndim >= 1 && t != x) {
            pb += Bt(c, t);
        }
    }
    c->r->family = "norm";
    part(c, c->k * E(x), (c->dir == KP_FLOPS_FWD ? 2 : 3) * Bt(c, x) + pb);
    return true;
}

/* Pooling (kprof's estimate: PyProf has none): E(x) FLOPs (each input element compared or
 * added once); bytes B(x) fwd (output size unknown without kernel_size), 2·B(x) bwd. */
static bool fam_pool(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c);

    if (!x) {
        return false;
    }
    c->r->family = "pooling";
    part(c, E(x), (c->dir == KP_FLOPS_FWD ? 1 : 2) * Bt(c, x));
    return true;
}

/* ---- embedding, losses, optimizer, data movement (§3.9-§3.15) ------------------------- */

static bool fam_embedding(struct ctx *c)
{
    const struct kp_flops_tensor *a0 = arg_t(c, 0), *a1 = arg_t(c, 1), *I, *W;
    double D;

    if (!a0 || !a1) {
        return false;
    }
    /* aten::embedding(weight, indices); F.embedding(input, weight) */
    if (c->aten) {
        W = a0;
        I = a1;
    }
    else {
        I = a0;
        W = a1;
    }
    if (W->ndim != 2) {
        return false;
    }
    D = (double) W->dim[1];
    c->r->family = "embedding";
    if (c->dir == KP_FLOPS_FWD) {
        part(c, 0, Bt(c, I) + 2 * E(I) * D * S(c, W));
    }
    else {
        part(c, 0, 3 * E(I) * D * S(c, W));
    }
    return true;
}

/* mse_loss(input, target, reduction): e = E(input)·k, k = 2 fwd / 3 bwd (reduction taken as
 * mean: Kineto does not record its value); bytes e·S, FLOPs 2e + 1 (§3.9). */
static bool fam_mse(struct ctx *c)
{
    const struct kp_flops_tensor *x = arg_t(c, 0), *t = arg_t(c, 1);
    double e;

    if (!x || !t || E(x) != E(t)) {
        return false;
    }
    e = E(x) * (c->dir == KP_FLOPS_FWD ? 2 : 3);
    c->r->family = "loss";
    part(c, 2 * e + 1, e * S(c, x));
    return true;
}

/* nll_loss(input[N, C, ...], target[N, ...]): one gather-add per target element; bytes
 * B(target) + E(target)·S(input). cross_entropy_loss: log_softmax then nll_loss, two parts. */
static bool fam_nll(struct ctx *c)
{
    const struct kp_flops_tensor *x = arg_t(c, 0), *t = arg_t(c, 1);

    if (!x || !t || x->ndim < 1) {
        return false;
    }
    c->r->family = "loss";
    if (c->k == 2) {
        part(c, 21 * E(x), (c->dir == KP_FLOPS_FWD ? 3 : 5) * Bt(c, x));
    }
    part(c, E(t), Bt(c, t) + E(t) * S(c, x));
    return true;
}

/* apex fused adam(w, hw, m, v, g, ...): bytes 6·E(w)·S(w) + E(w)·S(g) (+E(w)·S(g) when the
 * dtypes differ), FLOPs 0 (§3.12). */
static bool fam_adam(struct ctx *c)
{
    const struct kp_flops_tensor *w = arg_t(c, 0), *g = arg_t(c, 4);
    double by;

    if (!w || !g) {
        return false;
    }
    by = 6 * E(w) * S(c, w) + E(w) * S(c, g);
    if (w->esize != g->esize) {
        by += E(w) * S(c, g);
    }
    c->r->family = "optimizer";
    part(c, 0, by);
    return true;
}

/* Data movement, FLOPs 0 (§3.14-§3.15): k 1 copy_(dst, src) E·(S(src)+S(dst)); 2 clone-like
 * 2·B(x); 3 fill-like B(x); 4 cat 2·ΣB(list); 5 gather 2·B(input); 6 nonzero B + E·ndim·8. */
static bool fam_move(struct ctx *c)
{
    const struct kp_flops_tensor *x = first_tensor(c), *y;
    int k = (int) c->k;

    c->r->family = "memory";
    if (k == 4) {
        const struct kp_flops_arg *a = c->args->n > 0 ? &c->args->a[0] : NULL;
        double by = 0;

        if (!a || a->kind != KP_FLOPS_LIST) {
            return false;
        }
        for (int i = 0; i < a->n; i++) {
            const struct kp_flops_tensor *t = &c->args->sub[a->first + i];

            by += Bt(c, t);
        }
        part(c, 0, 2 * by);
        return true;
    }
    if (!x) {
        return false;
    }
    if (k == 1) {
        y = nth_t(c, 1);
        if (!y) {
            return false;
        }
        part(c, 0, E(x) * (S(c, x) + S(c, y)));
    }
    else if (k == 2 || k == 5) {
        part(c, 0, 2 * Bt(c, x));
    }
    else if (k == 3) {
        part(c, 0, Bt(c, x));
    }
    else {
        part(c, 0, Bt(c, x) + E(x) * x->ndim * 8);
    }
    return true;
}

/* ---- dispatch ------------------------------------------------------------------------ */

struct op_row {
    const char *name;
    bool (*fn)(struct ctx *c);
    double k;
};

static const struct op_row op_table[] = {
    /* GEMM */
    { "mm", fam_mm, 0 },
    { "_scaled_mm", fam_mm, 0 },
    { "bmm", fam_mm, 0 },
    { "addmm", fam_mm, 1 },
    { "_addmm_activation", fam_mm, 1 },
    { "baddbmm", fam_mm, 1 },
    { "addbmm", fam_mm, 1 },
    { "mv", fam_mv, 0 },
    { "dot", fam_mv, 0 },
    { "vdot", fam_mv, 0 },
    { "addmv", fam_mv, 1 },
    { "matmul", fam_matmul, 0 },
    { "__matmul__", fam_matmul, 0 },
    { "linear", fam_linear, 0 },
    /* convolution */
    { "conv1d", fam_conv, 1 },
    { "conv2d", fam_conv, 1 },
    { "conv3d", fam_conv, 1 },
    { "convolution", fam_conv, 1 },
    { "_convolution", fam_conv, 1 },
    { "cudnn_convolution", fam_conv, 1 },
    { "mkldnn_convolution", fam_conv, 1 },
    { "_slow_conv2d_forward", fam_conv, 1 },
    { "slow_conv3d_forward", fam_conv, 1 },
    { "_conv_depthwise2d", fam_conv, 1 },
    { "cudnn_convolution_relu", fam_conv, 1 },
    { "conv_transpose1d", fam_conv, 2 },
    { "conv_transpose2d", fam_conv, 2 },
    { "conv_transpose3d", fam_conv, 2 },
    { "cudnn_convolution_transpose", fam_conv, 2 },
    { "convolution_backward", fam_conv, 3 },
    /* attention */
    { "scaled_dot_product_attention", fam_attention, 1 },
    { "_scaled_dot_product_flash_attention", fam_attention, 1 },
    { "_scaled_dot_product_efficient_attention", fam_attention, 1 },
    { "_scaled_dot_product_cudnn_attention", fam_attention, 1 },
    { "_scaled_dot_product_flash_attention_for_cpu", fam_attention, 1 },
    { "_flash_attention_forward", fam_attention, 2 },
    { "_efficient_attention_forward", fam_attention, 2 },
    { "_flash_attn_forward", fam_attention, 2 },
    { "flash_attn_func", fam_attention, 2 },
    /* normalisation */
    { "batch_norm", fam_batchnorm, 0 },
    { "native_batch_norm", fam_batchnorm, 0 },
    { "_batch_norm_impl_index", fam_batchnorm, 0 },
    { "cudnn_batch_norm", fam_batchnorm, 0 },
    { "_native_batch_norm_legit", fam_batchnorm, 0 },
    { "_native_batch_norm_legit_no_training", fam_batchnorm, 0 },
    { "layer_norm", fam_norm, 8 },
    { "native_layer_norm", fam_norm, 8 },
    { "group_norm", fam_norm, 8 },
    { "native_group_norm", fam_norm, 8 },
    { "instance_norm", fam_norm, 8 },
    { "rms_norm", fam_norm, 4 },
    { "_fused_rms_norm", fam_norm, 4 },
    /* softmax */
    { "softmax", fam_softmax, 40 },
    { "_softmax", fam_softmax, 40 },
    { "_safe_softmax", fam_softmax, 40 },
    { "log_softmax", fam_softmax, 21 },
    { "_log_softmax", fam_softmax, 21 },
    /* activations: PyProf's list, 1 FLOP per element */
    { "celu", fam_activation, 1 },
    { "elu", fam_activation, 1 },
    { "hardshrink", fam_activation, 1 },
    { "hardtanh", fam_activation, 1 },
    { "leaky_relu", fam_activation, 1 },
    { "logsigmoid", fam_activation, 1 },
    { "log_sigmoid", fam_activation, 1 },
    { "prelu", fam_activation, 1 },
    { "_prelu_kernel", fam_activation, 1 },
    { "relu", fam_activation, 1 },
    { "relu6", fam_activation, 1 },
    { "rrelu", fam_activation, 1 },
    { "selu", fam_activation, 1 },
    { "softplus", fam_activation, 1 },
    { "softshrink", fam_activation, 1 },
    { "softsign", fam_activation, 1 },
    { "tanhshrink", fam_activation, 1 },
    { "threshold", fam_activation, 1 },
    /* modern activations (kprof): a transcendental counts 20 as in PyProf's Pointwise.
     * gelu: erf 20 + x/√2, +1, ·0.5, ·x = 24; silu: sigmoid 20 + ·x = 21;
     * mish: exp, log1p, tanh 60 + ·x = 61; hardswish: +3, clamp, ·x, /6 = 4;
     * hardsigmoid: +3, clamp, /6 = 3. */
    { "gelu", fam_activation, 24 },
    { "silu", fam_activation, 21 },
    { "mish", fam_activation, 61 },
    { "hardswish", fam_activation, 4 },
    { "hardsigmoid", fam_activation, 3 },
    /* pointwise unary (§3.7) */
    { "abs", fam_unary, 1 },
    { "neg", fam_unary, 1 },
    { "reciprocal", fam_unary, 1 },
    { "__abs__", fam_unary, 1 },
    { "__neg__", fam_unary, 1 },
    { "__invert__", fam_unary, 1 },
    { "bitwise_not", fam_unary, 1 },
    { "logical_not", fam_unary, 1 },
    { "ceil", fam_unary, 1 },
    { "clamp", fam_unary, 1 },
    { "clamp_min", fam_unary, 1 },
    { "clamp_max", fam_unary, 1 },
    { "clip", fam_unary, 1 },
    { "floor", fam_unary, 1 },
    { "frac", fam_unary, 1 },
    { "round", fam_unary, 1 },
    { "sign", fam_unary, 1 },
    { "trunc", fam_unary, 1 },
    { "square", fam_unary, 1 },
    { "exp", fam_unary, 20 },
    { "exp2", fam_unary, 20 },
    { "expm1", fam_unary, 20 },
    { "log", fam_unary, 20 },
    { "log10", fam_unary, 20 },
    { "log1p", fam_unary, 20 },
    { "log2", fam_unary, 20 },
    { "rsqrt", fam_unary, 20 },
    { "sqrt", fam_unary, 20 },
    { "acos", fam_unary, 20 },
    { "asin", fam_unary, 20 },
    { "atan", fam_unary, 20 },
    { "cos", fam_unary, 20 },
    { "cosh", fam_unary, 20 },
    { "sin", fam_unary, 20 },
    { "sinh", fam_unary, 20 },
    { "tan", fam_unary, 20 },
    { "sigmoid", fam_unary, 20 },
    { "tanh", fam_unary, 20 },
    { "erf", fam_unary, 20 },
    { "erfc", fam_unary, 20 },
    { "erfinv", fam_unary, 20 },
    /* pointwise binary (k: see fam_binary) */
    { "add", fam_binary, 0.5 },
    { "sub", fam_binary, 0.5 },
    { "rsub", fam_binary, 0.5 },
    { "__add__", fam_binary, 0.5 },
    { "__sub__", fam_binary, 0.5 },
    { "__radd__", fam_binary, 0.5 },
    { "__rsub__", fam_binary, 0.5 },
    { "__iadd__", fam_binary, 0.5 },
    { "__isub__", fam_binary, 0.5 },
    { "mul", fam_binary, 1 },
    { "div", fam_binary, 1 },
    { "true_divide", fam_binary, 1 },
    { "floor_divide", fam_binary, 1 },
    { "remainder", fam_binary, 1 },
    { "fmod", fam_binary, 1 },
    { "maximum", fam_binary, 1 },
    { "minimum", fam_binary, 1 },
    { "atan2", fam_binary, 1 },
    { "__mul__", fam_binary, 1 },
    { "__rmul__", fam_binary, 1 },
    { "__imul__", fam_binary, 1 },
    { "__truediv__", fam_binary, 1 },
    { "__rtruediv__", fam_binary, 1 },
    { "__itruediv__", fam_binary, 1 },
    { "__floordiv__", fam_binary, 1 },
    { "__mod__", fam_binary, 1 },
    { "bitwise_and", fam_binary, 1 },
    { "bitwise_or", fam_binary, 1 },
    { "bitwise_xor", fam_binary, 1 },
    { "__and__", fam_binary, 1 },
    { "__or__", fam_binary, 1 },
    { "__xor__", fam_binary, 1 },
    { "__lshift__", fam_binary, 1 },
    { "__rshift__", fam_binary, 1 },
    { "lt", fam_binary, 1.25 },
    { "gt", fam_binary, 1.25 },
    { "le", fam_binary, 1.25 },
    { "ge", fam_binary, 1.25 },
    { "eq", fam_binary, 1.25 },
    { "ne", fam_binary, 1.25 },
    { "logical_and", fam_binary, 1.25 },
    { "logical_or", fam_binary, 1.25 },
    { "logical_xor", fam_binary, 1.25 },
    { "pow", fam_binary, 20 },
    { "__pow__", fam_binary, 20 },
    { "__rpow__", fam_binary, 20 },
    { "addcmul", fam_binary, 3 },
    { "addcdiv", fam_binary, 3 },
    { "lerp", fam_binary, 3 },
    { "where", fam_binary, 1.5 },
    /* reductions */
    { "sum", fam_reduce, 1 },
    { "mean", fam_reduce, 2 },
    { "norm", fam_reduce, 3 },
    { "linalg_vector_norm", fam_reduce, 3 },
    { "max", fam_reduce, 4 },
    { "min", fam_reduce, 4 },
    { "amax", fam_reduce, 4 },
    { "amin", fam_reduce, 4 },
    { "argmax", fam_reduce, 4 },
    { "argmin", fam_reduce, 4 },
    { "prod", fam_reduce, 4 },
    { "any", fam_move, 3 },
    { "all", fam_reduce, 4 },
    { "cumsum", fam_reduce, 5 },
    /* pooling */
    { "max_pool1d", fam_pool, 0 },
    { "max_pool2d", fam_pool, 0 },
    { "max_pool3d", fam_pool, 0 },
    { "max_pool2d_with_indices", fam_pool, 0 },
    { "max_pool3d_with_indices", fam_pool, 0 },
    { "avg_pool1d", fam_pool, 0 },
    { "avg_pool2d", fam_pool, 0 },
    { "avg_pool3d", fam_pool, 0 },
    { "adaptive_avg_pool1d", fam_pool, 0 },
    { "adaptive_avg_pool2d", fam_pool, 0 },
    { "adaptive_avg_pool3d", fam_pool, 0 },
    { "_adaptive_avg_pool2d", fam_pool, 0 },
    { "_adaptive_avg_pool3d", fam_pool, 0 },
    { "adaptive_max_pool1d", fam_pool, 0 },
    { "adaptive_max_pool2d", fam_pool, 0 },
    { "adaptive_max_pool3d", fam_pool, 0 },
    /* embedding, dropout, losses, optimizers */
    { "embedding", fam_embedding, 0 },
    { "dropout", fam_dropout, 0 },
    { "native_dropout", fam_dropout, 0 },
    { "mse_loss", fam_mse, 0 },
    { "nll_loss", fam_nll, 1 },
    { "nll_loss_nd", fam_nll, 1 },
    { "nll_loss_forward", fam_nll, 1 },
    { "nll_loss2d_forward", fam_nll, 1 },
    { "cross_entropy_loss", fam_nll, 2 },
    { "adam", fam_adam, 0 },
    /* data movement */
    { "copy_", fam_move, 1 },
    { "clone", fam_move, 2 },
    { "contiguous", fam_move, 2 },
    { "_to_copy", fam_move, 2 },
    { "to", fam_move, 2 },
    { "fill_", fam_move, 3 },
    { "zero_", fam_move, 3 },
    { "zeros_like", fam_move, 3 },
    { "ones_like", fam_move, 3 },
    { "full_like", fam_move, 3 },
    { "cat", fam_move, 4 },
    { "gather", fam_move, 5 },
    { "nonzero", fam_move, 6 },
};

const char *kp_flops_base_name(const char *op, char *buf, size_t len)
{
    const char *s = op ? op : "", *p;
    size_t n;

    if (strncmp(s, "torch.nn.functional.", 20) == 0) {
        s += 20;
    }
    /* the last namespace: "aten::add_" -> "add_", "flash_attn::_flash_attn_forward" */
    while ((p = strstr(s, "::")) != NULL) {
        s = p + 2;
    }
    n = strcspn(s, ". (");
    if (n >= len) {
        n = len ? len - 1 : 0;
    }
    if (len) {
        memcpy(buf, s, n);
        buf[n] = '\0';
    }
    return buf;
}

static const struct op_row *find_row(const char *op)
{
    char base[96];

    kp_flops_base_name(op, base, sizeof(base));
    for (int pass = 0; pass < 2; pass++) {
        size_t n = strlen(base);

        for (size_t i = 0; i < sizeof(op_table) / sizeof(op_table[0]); i++) {
            if (strcmp(base, op_table[i].name) == 0) {
                return &op_table[i];
            }
        }
        /* in-place variants: add_ -> add (copy_, zero_, fill_ matched above) */
        if (n > 1 && base[n - 1] == '_' && base[n - 2] != '_') {
            base[n - 1] = '\0';
        }
        else {
            break;
        }
    }
    return NULL;
}

bool kp_flops_has_formula(const char *op)
{
    return find_row(op) != NULL;
}

void kp_flops_compute(const char *op, const struct kp_flops_args *args, enum kp_flops_dir dir,
                      const struct kp_flops_tensor *out_hint, struct kp_flops_result *out)
{
    const struct op_row *row = find_row(op);
    char base[96];
    struct ctx c = { 0 };

    memset(out, 0, sizeof(*out));
    out->family = "unknown";
    out->tc = KP_FLOPS_TC_NA;
    params_tensors(args, out);
    if (!row) {
        return;
    }
    c.args = args;
    c.dir = dir;
    c.hint = out_hint;
    c.r = out;
    c.name = kp_flops_base_name(op, base, sizeof(base));
    c.aten = op && strncmp(op, "aten::", 6) == 0;
    c.k = row->k;
    if (!row->fn(&c)) {
        memset(out, 0, sizeof(*out));
        out->family = "unknown";
        params_tensors(args, out);
        /* the op's kind still says whether tensor cores apply */
        if (row->fn == fam_conv) {
            out->tc = KP_FLOPS_TC_CONV;
        }
        else if (row->fn == fam_mm || row->fn == fam_mv || row->fn == fam_matmul ||
                 row->fn == fam_linear || row->fn == fam_attention) {
            out->tc = KP_FLOPS_TC_GEMM;
        }
        else {
            out->tc = KP_FLOPS_TC_NA;
        }
        return;
    }
    out->known = true;
    out->bytes_known = !c.no_bytes;
    if (c.no_bytes) {
        for (int i = 0; i < out->n_parts; i++) {
            out->bytes[i] = 0;
        }
    }
}

double kp_flops_part_flops(const struct kp_flops_result *r, int sub)
{
    return sub >= 0 && sub < r->n_parts ? r->flops[sub] : 0;
}

double kp_flops_part_bytes(const struct kp_flops_result *r, int sub)
{
    return sub >= 0 && sub < r->n_parts ? r->bytes[sub] : 0;
}
