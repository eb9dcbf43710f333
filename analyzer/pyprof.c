/*
 * pyprof: PyProf's per-kernel table (see pyprof.h).
 *
 * DESIGN. Three COPYs, each sorted here (the server's sorts and text result sets cost more
 * than the rest of the load): the rank's kernels (launch order: correlation, then start), its
 * API calls (correlation -> thread and external id) and its host ops (thread, start, longest
 * first). Names come from the process's names cache (kp_an_names_for). One sweep per thread
 * gives each op its enclosing op (parent); two sorted indexes find an op by op_id and the ops
 * of a seq. Each kernel then walks its op's parent chain once.
 */
#include "pyprof.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "flops.h"
#include "kp_err.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

/* OpKind (proto/kprof.proto). */
enum {
    OPK_CPU_OP = 1,
    OPK_USER_ANNOTATION = 2,
    OPK_PYTHON_FUNCTION = 4,
    OPK_NVTX = 5,
};

struct pp_op {
    int64_t start, end, tid, op_id, seq, fwd_tid;
    const char *name, *shapes, *dtypes; /* set once the names are read (pp_read_ops) */
    int64_t name_id[3];                 /* name, shapes, dtypes as the COPY sent them; -1: NULL */
    uint32_t ord;                       /* its place in the COPY: ties of the sort keep it */
    int32_t parent;
    uint8_t kind;
    bool formula; /* kp_flops_has_formula(name) */
};

/* An API call with a correlation, as the COPY sent it; -1 for NULL. */
struct pp_call {
    int64_t corr, tid, ext;
    int32_t domain; /* INT32_MAX for NULL: last, as the server's ORDER BY had it */
    uint32_t ord;
};

struct pp_key {
    int64_t key;
    int32_t idx;
};

/* A kernel as the table reads it; -1 for a NULL column. */
struct pp_kern {
    int64_t start, dur, corr, ext;
    int64_t name, stream, device;
    int64_t grid[3], block[3];
    bool has_grid, has_block;
};

/* A row's text columns while it is built, then interned (kp_an_pool_intern). */
struct pp_text {
    char altseq[96], layer[128], mod[48], op[96], params[256], grid[64], block[64];
};

/* Each distinct text value once, for the rows to point into: most repeat from kernel to kernel,
 * and a row of the buffers above for each kernel was most of the table's memory (1 KB a
 * kernel). Open addressing over a power-of-two table; NULL slots are empty. */
/* What row_compute_work derives from an attributed op. Ops of the same name, shapes, dtypes,
 * direction and convolution hint come back step after step, so it is computed once for each
 * (pp_work_of): parsing the shapes and finding the formula for every kernel was a fifth of
 * prof's time. */
struct pp_work {
    /* the key: pointers into names (equal strings are one entry), the direction, the hint */
    const char *name, *shapes, *dtypes;
    bool bwd, have_hint, used;
    struct kp_flops_tensor hint;
    /* the value */
    char mod[48], op[96], params[256];
    bool known, bytes_known;
    enum kp_flops_tc tc;
    double flops, bytes; /* the whole op's */
};

struct pp_works {
    struct pp_work *slot; /* open addressing over a power of two; used marks a full slot */
    size_t cap, n;
};

struct kp_pyprof {
    struct pp_kern *kern; /* while the table is built: the rank's kernels, in launch order */
    size_t n_kern, cap_kern;
    struct pp_call *calls; /* while the table is built: the rank's API calls, by correlation */
    size_t n_calls, cap_calls;
    struct kp_an_dict names; /* the names kern's and ops' name ids refer to */
    struct kp_an_pool pool;  /* the rows' text columns */
    struct pp_works works;   /* while the table is built */
    struct pp_op *ops;       /* while the table is built: by thread, start, longest first */
    size_t n_ops, cap_ops;
    struct kp_pyprof_row *rows;
    size_t n_rows, cap_rows; /* cap_rows: a table gathered from windows (pp_append) */
    uint64_t idx0;           /* a window's: the rows before it */
};

static int cmp_key(const void *pa, const void *pb)
{
    const struct pp_key *a = pa, *b = pb;

    if (a->key != b->key) {
        return a->key < b->key ? -1 : 1;
    }
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* The first entry of v with key k, or NULL. */
static const struct pp_key *lower(const struct pp_key *v, size_t n, int64_t k)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (v[mid].key < k) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo < n && v[lo].key == k ? &v[lo] : NULL;
}

/* ---- names --------------------------------------------------------------------------- */

/* PyProf's short kernel name (spec §4), spaces as '_'. */
static void short_kernel(const char *name, char *out, size_t len)
{
    static const char *const strip[] = { "void ",
                                         "at::", "cuda::", "native::", "(anonymous namespace)::" };
    char buf[512];
    size_t n = strcspn(name, "<");
    char *p;

    if (n >= sizeof(buf)) {
        n = sizeof(buf) - 1;
    }
    memcpy(buf, name, n);
    buf[n] = '\0';
    for (size_t i = 0; i < sizeof(strip) / sizeof(strip[0]); i++) {
        while ((p = strstr(buf, strip[i])) != NULL) {
            memmove(p, p + strlen(strip[i]), strlen(p + strlen(strip[i])) + 1);
        }
    }
    buf[strcspn(buf, "(")] = '\0';
    for (p = buf; *p; p++) {
        if (*p == ' ') {
            *p = '_';
        }
    }
    n = strlen(buf);
    if (n >= len) {
        n = len - 1;
    }
    memcpy(out, buf, n);
    out[n] = '\0';
}

static bool is_bwd_node(const struct pp_op *o)
{
    return o->seq >= 0 && strncmp(o->name, "aten::", 6) != 0 &&
           (strstr(o->name, "Backward") || strstr(o->name, "backward"));
}

/* The node's forward name: "AddmmBackward0" -> "Addmm" (namespaces dropped). */
static void bwd_base(const char *name, char *out, size_t len)
{
    const char *s = name, *p;
    size_t n;

    while ((p = strstr(s, "::")) != NULL) {
        s = p + 2;
    }
    p = strstr(s, "Backward");
    if (!p) {
        p = strstr(s, "backward");
    }
    n = (size_t) (p - s);
    if (n > 0 && s[n - 1] == '_') {
        n--;
    }
    if (n >= len) {
        n = len - 1;
    }
    memcpy(out, s, n);
    out[n] = '\0';
}

/* Lower-case letters and digits only: "_softmax" and "Softmax" compare equal. */
static void squash(const char *s, char *out, size_t len)
{
    size_t n = 0;

    for (; *s && n + 1 < len; s++) {
        char ch = *s;

        if (ch >= 'A' && ch <= 'Z') {
            ch = (char) (ch - 'A' + 'a');
        }
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')) {
            out[n++] = ch;
        }
    }
    out[n] = '\0';
}

static bool is_functional(const char *op)
{
    static const char *const fns[] = {
        "linear",
        "bilinear",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "softmax",
        "log_softmax",
        "dropout",
        "layer_norm",
        "group_norm",
        "batch_norm",
        "instance_norm",
        "rms_norm",
        "embedding",
        "embedding_bag",
        "gelu",
        "silu",
        "mish",
        "relu",
        "relu6",
        "leaky_relu",
        "hardswish",
        "hardsigmoid",
        "hardtanh",
        "elu",
        "selu",
        "celu",
        "softplus",
        "logsigmoid",
        "scaled_dot_product_attention",
        "mse_loss",
        "l1_loss",
        "nll_loss",
        "cross_entropy_loss",
        "binary_cross_entropy",
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "adaptive_avg_pool1d",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool3d",
        "adaptive_max_pool2d",
        "pad",
        "interpolate",
        "normalize",
    };

    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        if (strcmp(op, fns[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* mod and op from an op name (pyprof.h). */
static void mod_op(const char *name, struct pp_text *t)
{
    const char *p = strstr(name, "::");
    size_t n;

    if (strncmp(name, "aten::", 6) == 0) {
        const char *op = name + 6;
        size_t len = strlen(op);

        snprintf(t->op, sizeof(t->op), "%s", op);
        if (is_functional(op)) {
            snprintf(t->mod, sizeof(t->mod), "torch.nn.functional");
        }
        else if ((len > 1 && op[len - 1] == '_' && op[len - 2] != '_') ||
                 strncmp(op, "__", 2) == 0) {
            snprintf(t->mod, sizeof(t->mod), "Tensor");
        }
        else {
            snprintf(t->mod, sizeof(t->mod), "torch");
        }
        return;
    }
    if (p && p != name) {
        n = (size_t) (p - name);
        snprintf(t->mod, sizeof(t->mod), "%.*s", (int) n, name);
        snprintf(t->op, sizeof(t->op), "%s", p + 2);
        return;
    }
    snprintf(t->mod, sizeof(t->mod), "na");
    snprintf(t->op, sizeof(t->op), "%s", name[0] ? name : "na");
}

/* ---- building ------------------------------------------------------------------------ */

#define WHERE_RR " WHERE x.run_id = $1 AND x.rank = $2"

static bool op_kind(const struct pp_op *o)
{
    return o->kind == OPK_CPU_OP || o->kind == OPK_NVTX;
}

/* The forward op of backward node b (pyprof.h), or -1. */
static int32_t find_forward_on(const struct kp_pyprof *p, const struct pp_key *by_seq, size_t n_seq,
                               const struct pp_op *b, bool on_fwd_tid)
{
    const struct pp_key *k = lower(by_seq, n_seq, b->seq), *end = by_seq + n_seq;
    char want[96], got[96], base[96];
    int32_t best = -1, named = -1;

    if (!k) {
        return -1;
    }
    bwd_base(b->name, base, sizeof(base));
    squash(base, want, sizeof(want));
    for (; k < end && k->key == b->seq; k++) {
        const struct pp_op *o = &p->ops[k->idx];

        if (!op_kind(o) || is_bwd_node(o) || (on_fwd_tid && o->tid != b->fwd_tid)) {
            continue;
        }
        if (best < 0 || o->start < p->ops[best].start ||
            (o->start == p->ops[best].start && o->end > p->ops[best].end)) {
            best = k->idx;
        }
        kp_flops_base_name(o->name, base, sizeof(base));
        squash(base, got, sizeof(got));
        if (named < 0 && want[0] && strcmp(got, want) == 0) {
            named = k->idx;
        }
    }
    return named >= 0 ? named : best;
}

/* Kineto's "Fwd thread id" is sometimes the profiler's thread index, not the OS thread id:
 * when no op of the seq runs on it, any thread's op is taken. */
static int32_t find_forward(const struct kp_pyprof *p, const struct pp_key *by_seq, size_t n_seq,
                            const struct pp_op *b)
{
    int32_t f = b->fwd_tid > 0 ? find_forward_on(p, by_seq, n_seq, b, true) : -1;

    return f >= 0 ? f : find_forward_on(p, by_seq, n_seq, b, false);
}

/* The output shape of a forward op from its backward node's grad_output (for convolutions). */
static bool conv_hint(const struct kp_pyprof *p, const struct pp_key *by_seq, size_t n_seq,
                      int64_t seq, struct kp_flops_tensor *hint)
{
    const struct pp_key *k = seq >= 0 ? lower(by_seq, n_seq, seq) : NULL, *end = by_seq + n_seq;

    for (; k && k < end && k->key == seq; k++) {
        const struct pp_op *o = &p->ops[k->idx];
        struct kp_flops_args a;

        if (is_bwd_node(o) && kp_flops_parse(o->shapes, NULL, &a) == 0 && a.n > 0 &&
            a.a[0].kind == KP_FLOPS_TENSOR) {
            *hint = a.a[0].t;
            return true;
        }
    }
    return false;
}

static int cmp_i64(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *) pa, b = *(const int64_t *) pb;

    return a < b ? -1 : a > b;
}

/* What a kernel shares with the other kernels of its op evaluation (see share_work). */
struct pp_share {
    int64_t key;         /* (group, attributed op); -1: no op */
    double flops, bytes; /* the whole op's */
    size_t row;
};

/* What kp_pyprof_create's phases share: the indexes over the ops and the API calls, and the
 * per-kernel scratch. */
struct pp_build {
    struct pp_key *by_id, *by_seq, *by_corr; /* ops by op_id and seq, calls by correlation */
    size_t n_id, n_seq, n_corr;
    int64_t *corr_tid, *corr_ext; /* by_corr's thread and external id, by call row */
    int32_t *stack;               /* pp_read_ops' open ops */
    int *sub_count;               /* kernels so far of each op (sub) */
    struct pp_share *share;       /* one per kernel row (share_work) */
    /* per entry of names (and one more for "", an unknown or NULL name), computed on first use
     * rather than once per op or kernel: whether an op name has a FLOP formula (-1: not yet),
     * a kernel name's short form (interned; NULL: not yet) and Tensor Core use */
    int8_t *formula;
    const char **kshort;
    bool *ktc;
};

/* The attribution of a kernel whose op stack is chain (innermost first). */
struct pp_attr {
    int32_t node; /* the innermost backward node, or -1 */
    int32_t attr; /* the op its work is counted for, or -1 */
    bool as_bwd;  /* attr is node's forward op, evaluated backward */
};

/* Picks the attributed op of a kernel under backward node node (-1: none); sets r's bwd and
 * seq. */
static struct pp_attr row_attribute(const struct kp_pyprof *p, const struct pp_build *b,
                                    const int32_t *chain, int n, int32_t node,
                                    struct kp_pyprof_row *r)
{
    struct pp_attr at = { .node = node, .attr = -1 };

    r->bwd = at.node >= 0;
    if (at.node >= 0) {
        int32_t fwd = find_forward(p, b->by_seq, b->n_seq, &p->ops[at.node]);

        if (fwd >= 0) {
            at.attr = fwd;
            at.as_bwd = true;
        }
        else {
            for (int i = 0; i < n && chain[i] != at.node; i++) {
                if (op_kind(&p->ops[chain[i]]) && p->ops[chain[i]].formula) {
                    at.attr = chain[i];
                    break;
                }
            }
        }
        r->seq = p->ops[at.node].seq;
        return at;
    }
    for (int i = n - 1; i >= 0 && at.attr < 0; i--) {
        if (op_kind(&p->ops[chain[i]]) && p->ops[chain[i]].formula &&
            strncmp(p->ops[chain[i]].name, "aten::", 6) == 0) {
            at.attr = chain[i];
        }
    }
    for (int i = 0; i < n && at.attr < 0; i++) {
        if (op_kind(&p->ops[chain[i]]) && p->ops[chain[i]].formula) {
            at.attr = chain[i];
        }
    }
    for (int i = 0; i < n && at.attr < 0; i++) {
        if (op_kind(&p->ops[chain[i]])) {
            at.attr = chain[i];
        }
    }
    if (at.attr < 0) {
        at.attr = chain[0];
    }
    /* the attributed op's seq, else its nearest enclosing op's */
    for (int i = 0, seen = 0; i < n && r->seq < 0; i++) {
        seen = seen || chain[i] == at.attr;
        if (seen && p->ops[chain[i]].seq >= 0) {
            r->seq = p->ops[chain[i]].seq;
        }
    }
    return at;
}

/* altseq: the stack's other seqs; layer: enclosing layer:NAME annotations, outermost first. */
static void row_fill_stack(const struct kp_pyprof *p, const int32_t *chain, int n,
                           const struct kp_pyprof_row *r, struct pp_text *t)
{
    int64_t seqs[64];
    int ns = 0;

    for (int i = 0; i < n; i++) {
        int64_t s = p->ops[chain[i]].seq;
        bool dup = s < 0 || s == r->seq;

        for (int j = 0; j < ns && !dup; j++) {
            dup = seqs[j] == s;
        }
        if (!dup) {
            seqs[ns++] = s;
        }
    }
    if (ns) {
        size_t len = 0;

        qsort(seqs, (size_t) ns, sizeof(seqs[0]), cmp_i64);
        t->altseq[0] = '\0';
        for (int j = 0; j < ns && len + 24 < sizeof(t->altseq); j++) {
            len += (size_t) snprintf(t->altseq + len, sizeof(t->altseq) - len, "%s%" PRId64,
                                     j ? "," : "", seqs[j]);
        }
    }
    for (int i = n - 1, len = 0; i >= 0; i--) {
        const char *nm = p->ops[chain[i]].name;

        if (strncmp(nm, "layer:", 6) == 0 && (size_t) len + 2 < sizeof(t->layer)) {
            len += snprintf(t->layer + len, sizeof(t->layer) - (size_t) len, "%s%s", len ? ":" : "",
                            nm + 6);
        }
    }
}

static bool tensor_eq(const struct kp_flops_tensor *x, const struct kp_flops_tensor *y)
{
    if (x->ndim != y->ndim || x->esize != y->esize || strcmp(x->dtype, y->dtype) != 0) {
        return false;
    }
    for (int i = 0; i < x->ndim && i < KP_FLOPS_MAX_DIMS; i++) {
        if (x->dim[i] != y->dim[i]) {
            return false;
        }
    }
    return true;
}

static bool work_eq(const struct pp_work *w, const struct pp_work *k)
{
    return w->name == k->name && w->shapes == k->shapes && w->dtypes == k->dtypes &&
           w->bwd == k->bwd && w->have_hint == k->have_hint &&
           (!k->have_hint || tensor_eq(&w->hint, &k->hint));
}

static size_t work_hash(const struct pp_work *k)
{
    uint64_t h = (uintptr_t) k->name * 0x9E3779B97F4A7C15ull;

    h = (h ^ (uintptr_t) k->shapes) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (uintptr_t) k->dtypes) * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t) k->bwd << 1 | (uint64_t) k->have_hint;
    for (int i = 0; k->have_hint && i < k->hint.ndim && i < KP_FLOPS_MAX_DIMS; i++) {
        h = (h ^ (uint64_t) k->hint.dim[i]) * 0x9E3779B97F4A7C15ull;
    }
    return (size_t) (h ^ h >> 29);
}

/* The entry of key k (name, shapes, dtypes, bwd, have_hint, hint), computed on first sight;
 * NULL without memory. */
static const struct pp_work *pp_work_of(struct pp_works *ws, const struct pp_work *k)
{
    struct pp_work *w;
    size_t h;

    if (2 * (ws->n + 1) > ws->cap) {
        size_t cap = ws->cap ? 2 * ws->cap : 256;
        struct pp_work *slot = calloc(cap, sizeof(*slot));

        if (!slot) {
            return NULL;
        }
        for (size_t i = 0; i < ws->cap; i++) {
            if (ws->slot[i].used) {
                for (h = work_hash(&ws->slot[i]) & (cap - 1); slot[h].used;
                     h = (h + 1) & (cap - 1)) {
                }
                slot[h] = ws->slot[i];
            }
        }
        free(ws->slot);
        ws->slot = slot;
        ws->cap = cap;
    }
    for (h = work_hash(k) & (ws->cap - 1); ws->slot[h].used; h = (h + 1) & (ws->cap - 1)) {
        if (work_eq(&ws->slot[h], k)) {
            return &ws->slot[h];
        }
    }
    w = &ws->slot[h];
    *w = *k;
    w->used = true;
    ws->n++;

    struct kp_flops_args args;
    struct kp_flops_result res;
    struct pp_text t;

    mod_op(w->name, &t);
    snprintf(w->mod, sizeof(w->mod), "%s", t.mod);
    snprintf(w->op, sizeof(w->op), "%s", t.op);
    if (kp_flops_parse(w->shapes, w->dtypes, &args) < 0) {
        memset(&args, 0, sizeof(args));
    }
    kp_flops_compute(w->name, &args, w->bwd ? KP_FLOPS_BWD : KP_FLOPS_FWD,
                     w->have_hint ? &w->hint : NULL, &res);
    snprintf(w->params, sizeof(w->params), "%s", res.params[0] ? res.params : "-");
    w->known = res.known;
    w->bytes_known = res.known && res.bytes_known;
    w->tc = res.tc;
    for (int i = 0; res.known && i < res.n_parts; i++) {
        w->flops += kp_flops_part_flops(&res, i);
        w->bytes += w->bytes_known ? kp_flops_part_bytes(&res, i) : 0;
    }
    return w;
}

/* The attributed op's module, op, parameters, Tensor Core use and whole work (into sh);
 * -ENOMEM. */
static int row_compute_work(struct kp_pyprof *p, const struct pp_build *b, const struct pp_attr *at,
                            int group, bool kern_tc, struct kp_pyprof_row *r, struct pp_text *t,
                            struct pp_share *sh)
{
    const struct pp_op *ao = &p->ops[at->attr];
    struct pp_work key = { .name = ao->name, .shapes = ao->shapes, .dtypes = ao->dtypes };
    const struct pp_work *w;

    key.bwd = at->as_bwd;
    key.have_hint = conv_hint(p, b->by_seq, b->n_seq, at->as_bwd ? r->seq : ao->seq, &key.hint);
    if (!(w = pp_work_of(&p->works, &key))) {
        return -ENOMEM;
    }
    snprintf(t->mod, sizeof(t->mod), "%s", w->mod);
    snprintf(t->op, sizeof(t->op), "%s", w->op);
    snprintf(t->params, sizeof(t->params), "%s", w->params);
    r->flops_known = w->known;
    r->bytes_known = w->bytes_known;
    /* the whole op's work, shared among its kernels by share_work */
    sh->key = ((int64_t) group << 32) | (uint32_t) at->attr;
    sh->flops += w->known ? w->flops : 0;
    sh->bytes += w->bytes_known ? w->bytes : 0;
    if (w->tc == KP_FLOPS_TC_GEMM) {
        r->tc = kern_tc ? "1" : "0";
    }
    else if (w->tc == KP_FLOPS_TC_CONV) {
        r->tc = kern_tc ? "1" : "-";
    }
    else {
        r->tc = "-";
    }
    return 0;
}

/* The op-side columns of kernel row r, whose innermost op is oi (-1: none); -ENOMEM. */
static int fill_row(struct kp_pyprof *p, struct pp_build *b, struct kp_pyprof_row *r,
                    struct pp_text *t, int32_t oi, bool kern_tc, struct pp_share *sh)
{
    int32_t chain[64], node = -1;
    int n = 0, group;
    struct pp_attr at;

    for (int32_t i = oi; i >= 0 && n < 64; i = p->ops[i].parent) {
        chain[n++] = i; /* innermost first */
    }
    snprintf(t->layer, sizeof(t->layer), "-");
    r->trace = "-";
    r->seq = -1;
    snprintf(t->altseq, sizeof(t->altseq), "-");
    snprintf(t->mod, sizeof(t->mod), "na");
    snprintf(t->op, sizeof(t->op), "na");
    snprintf(t->params, sizeof(t->params), "na");
    r->tc = "na";
    if (n == 0) {
        return 0;
    }
    r->tid = p->ops[chain[0]].tid;
    for (int i = 0; i < n; i++) {
        const struct pp_op *o = &p->ops[chain[i]];

        if (node < 0 && is_bwd_node(o)) {
            node = chain[i];
        }
        if (r->trace[0] == '-' && o->kind == OPK_PYTHON_FUNCTION) {
            r->trace = o->name;
        }
    }
    at = row_attribute(p, b, chain, n, node, r);
    row_fill_stack(p, chain, n, r, t);
    /* sub: ordinal within the backward node or the attributed op */
    group = at.node >= 0 ? at.node : at.attr;
    r->sub = group >= 0 ? b->sub_count[group]++ : 0;
    if (at.attr < 0) {
        if (at.node >= 0) {
            bwd_base(p->ops[at.node].name, t->op, sizeof(t->op));
            snprintf(t->mod, sizeof(t->mod), "na");
        }
        return 0;
    }
    return row_compute_work(p, b, &at, group, kern_tc, r, t, sh);
}

static int cmp_share(const void *pa, const void *pb)
{
    const struct pp_share *a = pa, *b = pb;

    if (a->key != b->key) {
        return a->key < b->key ? -1 : 1;
    }
    return a->row < b->row ? -1 : a->row > b->row;
}

/* The kernels of one op evaluation (the op's, or the backward node's when the op is
 * evaluated backward) share its FLOPs and bytes in proportion to their durations (equally
 * when none has one), helper kernels (layout changes, Winograd transforms, split-K
 * reductions) included: every kernel of the op then shows the op's own achieved rate, so a
 * kernel is above a peak exactly when its op is (a FLOP/byte model the kernels beat, e.g.
 * direct-convolution FLOPs for a Winograd or FFT algorithm, or a wrong peak). Sorts sh. */
static void share_work(struct kp_pyprof_row *rows, struct pp_share *sh, size_t n)
{
    qsort(sh, n, sizeof(*sh), cmp_share);
    for (size_t i = 0, j; i < n; i = j) {
        double w = 0;

        for (j = i; j < n && sh[j].key == sh[i].key; j++) {
            w += rows[sh[j].row].sil_ns > 0 ? (double) rows[sh[j].row].sil_ns : 0;
        }
        for (size_t k = i; k < j; k++) {
            struct kp_pyprof_row *r = &rows[sh[k].row];
            double d = r->sil_ns > 0 ? (double) r->sil_ns : 0;
            double f = w > 0 ? d / w : 1.0 / (double) (j - i);

            if (sh[k].key < 0) {
                continue;
            }
            r->flops = r->flops_known ? sh[k].flops * f : 0;
            r->bytes = r->bytes_known ? sh[k].bytes * f : 0;
        }
    }
}

/* Loading the COPYs (pp_read_kernels, pp_read_rows). */
struct pp_kload {
    struct kp_pyprof *p;
    size_t *budget, max_rows;
    const struct kp_an_window *win; /* NULL: the whole rank */
};

/* The message of a failed load COPY of the rank's what (a row-callback's KP_ETOOBIG, -EINVAL,
 * -ENOMEM; kp_pg_copy_out's own failures carry theirs) into errbuf; rc, with -EINVAL as KP_EPG. */
static int pp_copy_failed(int rc, size_t max_rows, const char *what, char *errbuf, size_t errlen)
{
    if (rc == KP_ETOOBIG) {
        kp_errbuf_set(errbuf, errlen, "the rank has more than %zu rows: raise the row limit",
                      max_rows);
    }
    else if (rc == -EINVAL) {
        kp_errbuf_set(errbuf, errlen,
                      "PostgreSQL sent a row of the rank's %s the analyzer cannot "
                      "read",
                      what);
        rc = KP_EPG;
    }
    else if (rc == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory loading the rank's %s", what);
    }
    return rc;
}

/* Room for one more of n elements of size sz in *v (capacity *cap), counted against the row
 * budget. 0, KP_ETOOBIG or -ENOMEM. */
static int pp_slot(struct pp_kload *l, void **v, size_t *cap, size_t n, size_t sz)
{
    if (l->max_rows && *l->budget >= l->max_rows) {
        return KP_ETOOBIG;
    }
    if (n == *cap) {
        size_t c = *cap ? 2 * *cap : 4096;
        void *g = realloc(*v, c * sz);

        if (!g) {
            return -ENOMEM;
        }
        *v = g;
        *cap = c;
    }
    ++*l->budget;
    return 0;
}

#define PP_KCOLS 13 /* start, dur, correlation, external id, name, stream, device, grid, block */

static int pp_add_kernel(struct pp_kload *l, const int64_t *v, const bool *null)
{
    struct kp_pyprof *p = l->p;
    struct pp_kern *k;
    int rc = pp_slot(l, (void **) &p->kern, &p->cap_kern, p->n_kern, sizeof(*p->kern));

    if (rc < 0) {
        return rc;
    }
    k = &p->kern[p->n_kern++];
    k->start = v[0];
    k->dur = null[1] ? -1 : v[1];
    k->corr = null[2] ? -1 : v[2];
    k->ext = null[3] ? -1 : v[3];
    k->name = null[4] ? -1 : v[4];
    k->stream = null[5] ? -1 : v[5];
    k->device = null[6] ? -1 : v[6];
    for (int i = 0; i < 3; i++) {
        k->grid[i] = null[7 + i] ? -1 : v[7 + i];
        k->block[i] = null[10 + i] ? -1 : v[10 + i];
    }
    k->has_grid = !null[7];
    k->has_block = !null[10];
    return 0;
}

/* A kernel_rows row of pp_read_kernels' first COPY. */
static int pp_kernel_row(void *ud, char *row, size_t len)
{
    char *f[PP_KCOLS];
    int64_t v[PP_KCOLS];
    bool null[PP_KCOLS];
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, PP_KCOLS)) < 0) {
        return rc;
    }
    for (int k = 0; k < PP_KCOLS; k++) {
        null[k] = f[k] == NULL;
        v[k] = kp_pg_field_i64(f[k], 0);
    }
    return pp_add_kernel(ud, v, null);
}

/* A kernel_chunks row (migration 0015: the columns as arrays) of the second COPY. */
static int pp_kernel_chunk(void *ud, char *row, size_t len)
{
    char *f[PP_KCOLS];
    const char *cur[PP_KCOLS];
    int64_t v[PP_KCOLS];
    bool null[PP_KCOLS];
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, PP_KCOLS)) < 0) {
        return rc;
    }
    for (int k = 0; k < PP_KCOLS; k++) {
        if (!f[k]) {
            return -EINVAL;
        }
        cur[k] = f[k];
    }
    while ((rc = kp_pg_arrays_next_i64(cur, PP_KCOLS, v, null)) == 1) {
        const struct pp_kload *l = ud;

        if (l->win && !kp_an_window_has(l->win, null[2], v[2])) {
            continue; /* launched in another window */
        }
        if ((rc = pp_add_kernel(ud, v, null)) < 0) {
            return rc;
        }
    }
    return rc;
}

/* Sorts v[0..n) by cmp unless it is in order already: the COPYs often hand rows in the order
 * wanted (API calls by correlation), and a check is a tenth of qsort's cost. qsort takes no
 * NULL array, even an empty one. */
static void pp_sort(void *v, size_t n, size_t size, int (*cmp)(const void *, const void *))
{
    const char *p = v;

    for (size_t i = 1; i < n; i++) {
        if (cmp(p + (i - 1) * size, p + i * size) > 0) {
            qsort(v, n, size, cmp);
            return;
        }
    }
}

/* Launch order: by correlation (none last), then start; the rest only so that ties come out
 * the same on every load. */
static int cmp_kern(const void *pa, const void *pb)
{
    const struct pp_kern *x = pa, *y = pb;

    if ((x->corr < 0) != (y->corr < 0)) {
        return x->corr < 0 ? 1 : -1;
    }
    if (x->corr != y->corr) {
        return x->corr < y->corr ? -1 : 1;
    }
    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    if (x->dur != y->dur) {
        return x->dur > y->dur ? -1 : 1;
    }
    if (x->ext != y->ext) {
        return x->ext < y->ext ? -1 : 1;
    }
    return (x->name > y->name) - (x->name < y->name);
}

/*
 * The rank's kernels into p->kern, in launch order. An ended run's kernels are in chunks
 * (migration 0015), which come as arrays and are unnested here: the server would spend three
 * times as long unnesting them into rows for the kernels view; the rows of an open run (and
 * late batches) come as rows; the whole is sorted here.
 */
static int pp_read_kernels(PGconn *c, const char *const *params, size_t *budget, size_t max_rows,
                           struct kp_pyprof *p, const struct kp_an_window *w, char *errbuf,
                           size_t errlen)
{
    static const char cols[] = "start_ns, dur_ns, correlation, external_id, name, stream, "
                               "device, grid_x, grid_y, grid_z, block_x, block_y, block_z";
    struct pp_kload l = { p, budget, max_rows, w };
    char sql[768], host[96] = "", dev[128] = "", chunk[192] = "";
    bool began;
    int rc;

    if (w) {
        kp_an_window_sql(w, host, dev, chunk);
    }
    if ((rc = kp_an_snapshot_begin(c, &began, errbuf, errlen)) != 0) {
        return rc;
    }
    snprintf(sql, sizeof(sql),
             "COPY (SELECT %s FROM kernel_rows WHERE run_id = %s AND rank = %s%s) TO STDOUT", cols,
             params[0], params[1], dev);
    rc = kp_pg_copy_out(c, sql, pp_kernel_row, &l, errbuf, errlen);
    if (rc == 0) {
        snprintf(sql, sizeof(sql),
                 "COPY (SELECT %s FROM kernel_chunks WHERE run_id = %s AND rank = %s%s) TO STDOUT",
                 cols, params[0], params[1], chunk);
        rc = kp_pg_copy_out(c, sql, pp_kernel_chunk, &l, errbuf, errlen);
    }
    kp_an_snapshot_end(c, began, rc);
    rc = pp_copy_failed(rc, max_rows, "kernels", errbuf, errlen);
    if (rc == 0) {
        pp_sort(p->kern, p->n_kern, sizeof(*p->kern), cmp_kern);
    }
    return rc;
}

#define PP_OCOLS 11 /* start, dur, tid, op_id, seq, fwd_tid, external id, 3 names, kind */

/* A row of pp_read_rows' ops COPY. */
static int pp_op_row(void *ud, char *row, size_t len)
{
    struct pp_kload *l = ud;
    struct kp_pyprof *p = l->p;
    char *f[PP_OCOLS];
    struct pp_op *o;
    int64_t dur, ext;
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, PP_OCOLS)) < 0 ||
        (rc = pp_slot(l, (void **) &p->ops, &p->cap_ops, p->n_ops, sizeof(*p->ops))) < 0) {
        return rc;
    }
    o = &p->ops[p->n_ops];
    memset(o, 0, sizeof(*o));
    o->ord = (uint32_t) p->n_ops++;
    o->start = kp_pg_field_i64(f[0], -1);
    dur = kp_pg_field_i64(f[1], -1);
    o->end = o->start + (dur > 0 ? dur : 0);
    o->tid = kp_pg_field_i64(f[2], -1);
    o->op_id = kp_pg_field_i64(f[3], -1);
    o->seq = kp_pg_field_i64(f[4], -1);
    o->fwd_tid = kp_pg_field_i64(f[5], -1);
    ext = kp_pg_field_i64(f[6], -1);
    for (int k = 0; k < 3; k++) {
        o->name_id[k] = kp_pg_field_i64(f[7 + k], -1);
    }
    o->kind = (uint8_t) kp_pg_field_i64(f[10], -1);
    if (o->op_id < 0) {
        o->op_id = ext;
    }
    return 0;
}

/* A row of pp_read_rows' API calls COPY. */
static int pp_call_row(void *ud, char *row, size_t len)
{
    struct pp_kload *l = ud;
    struct kp_pyprof *p = l->p;
    char *f[4];
    struct pp_call *c;
    int rc;

    if ((rc = kp_pg_copy_fields(row, len, f, 4)) < 0 ||
        (rc = pp_slot(l, (void **) &p->calls, &p->cap_calls, p->n_calls, sizeof(*p->calls))) < 0) {
        return rc;
    }
    c = &p->calls[p->n_calls];
    c->ord = (uint32_t) p->n_calls++;
    c->corr = kp_pg_field_i64(f[0], -1);
    c->tid = kp_pg_field_i64(f[1], -1);
    c->ext = kp_pg_field_i64(f[2], -1);
    c->domain = (int32_t) kp_pg_field_i64(f[3], INT32_MAX);
    return 0;
}

/* Host ops: by thread, start, longest first; ties in the COPY's order. */
static int cmp_op(const void *pa, const void *pb)
{
    const struct pp_op *x = pa, *y = pb;

    if (x->tid != y->tid) {
        return x->tid < y->tid ? -1 : 1;
    }
    if (x->start != y->start) {
        return x->start < y->start ? -1 : 1;
    }
    if (x->end - x->start != y->end - y->start) {
        return x->end - x->start > y->end - y->start ? -1 : 1;
    }
    return (x->ord > y->ord) - (x->ord < y->ord);
}

/* API calls: by correlation, then domain; ties in the COPY's order. */
static int cmp_call(const void *pa, const void *pb)
{
    const struct pp_call *x = pa, *y = pb;

    if (x->corr != y->corr) {
        return x->corr < y->corr ? -1 : 1;
    }
    if (x->domain != y->domain) {
        return x->domain < y->domain ? -1 : 1;
    }
    return (x->ord > y->ord) - (x->ord < y->ord);
}

/* The ops' columns pp_op_row reads. */
#define PP_OPS_SELECT                                                                      \
    "SELECT start_ns, dur_ns, tid, op_id, seq, fwd_tid, external_id, name, input_shapes, " \
    "input_dtypes, kind FROM ops WHERE run_id = %s AND rank = %s AND kind IN "

/* The python functions and NVTX ranges that cross a cut between windows (pp_spans_load): the
 * only ops of a window that may start before it. */
struct kp_pyprof_spans {
    struct pp_op *ops;
    size_t n;
};

/* Appends to p->ops the spans that reach into window w from before it. 0 or a pp_slot error. */
static int pp_add_spans(struct pp_kload *l, const struct kp_pyprof_spans *sp,
                        const struct kp_an_window *w)
{
    struct kp_pyprof *p = l->p;
    int rc;

    for (size_t i = 0; sp && !w->first && i < sp->n; i++) {
        if (sp->ops[i].start >= w->t_lo || sp->ops[i].end < w->t_lo) {
            continue;
        }
        if ((rc = pp_slot(l, (void **) &p->ops, &p->cap_ops, p->n_ops, sizeof(*p->ops))) < 0) {
            return rc;
        }
        p->ops[p->n_ops] = sp->ops[i];
        p->ops[p->n_ops].ord = (uint32_t) p->n_ops;
        p->n_ops++;
    }
    return 0;
}

/* The rank's kernels (p->kern), API calls with a correlation (p->calls) and host ops of the
 * kinds the table walks (p->ops), each sorted; of window w only (NULL: all): its kernels and
 * API calls by correlation, its ops by start, and the python functions and NVTX ranges that
 * reach into it from before (sp), which no cut avoids and which may enclose its ops. */
static int pp_read_rows(PGconn *c, const char *const *params, size_t max_rows, struct kp_pyprof *p,
                        const struct kp_an_window *w, const struct kp_pyprof_spans *sp,
                        char *errbuf, size_t errlen)
{
    size_t budget = 0;
    struct pp_kload l = { p, &budget, max_rows, w };
    char sql[1024], host[96] = "", dev[128] = "", chunk[192] = "", calls[256] = "";
    int rc;

    rc = pp_read_kernels(c, params, &budget, max_rows, p, w, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    if (w) {
        kp_an_window_sql(w, host, dev, chunk);
        kp_an_window_calls_sql(w, calls);
    }
    snprintf(sql, sizeof(sql),
             "COPY (SELECT correlation, tid, external_id, domain FROM api_calls WHERE run_id = %s "
             "AND rank = %s AND correlation IS NOT NULL%s) TO STDOUT",
             params[0], params[1], calls);
    rc = kp_pg_copy_out(c, sql, pp_call_row, &l, errbuf, errlen);
    if (rc == 0) {
        snprintf(sql, sizeof(sql), "COPY (" PP_OPS_SELECT "(1, 2, 4, 5, 6)%s) TO STDOUT", params[0],
                 params[1], host);
        rc = kp_pg_copy_out(c, sql, pp_op_row, &l, errbuf, errlen);
    }
    if (rc == 0 && w) {
        rc = pp_add_spans(&l, sp, w);
    }
    rc = pp_copy_failed(rc, max_rows, "API calls and ops", errbuf, errlen);
    if (rc == 0) {
        pp_sort(p->calls, p->n_calls, sizeof(*p->calls), cmp_call);
        pp_sort(p->ops, p->n_ops, sizeof(*p->ops), cmp_op);
    }
    return rc;
}

/* The names the rows refer to, from the process's names cache (kp_an_names_for) rather than
 * joined on the server: the joins (three for each op) cost more than reading the rows. */
static int pp_read_names(PGconn *c, struct kp_pyprof *p, char *errbuf, size_t errlen)
{
    size_t nk = p->n_kern, no = p->n_ops, n = 0;
    int32_t *ids = calloc(nk + 3 * no + 1, sizeof(*ids));
    int rc;

    if (!ids) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < nk; i++) {
        ids[n++] =
            p->kern[i].name > 0 && p->kern[i].name <= INT32_MAX ? (int32_t) p->kern[i].name : 0;
    }
    for (size_t i = 0; i < no; i++) {
        for (int k = 0; k < 3; k++) {
            int64_t id = p->ops[i].name_id[k];

            ids[n++] = id > 0 && id <= INT32_MAX ? (int32_t) id : 0;
        }
    }
    rc = kp_an_names_for(c, ids, n, &p->names, errbuf, errlen);
    free(ids);
    return rc;
}

/* The index in p->names of an id; p->names.n for NULL (-1) and unknown ids, whose name is "". */
static size_t pp_name_ix(const struct kp_pyprof *p, int64_t id)
{
    int32_t i = id < 0 ? -1 : kp_an_dict_find(&p->names, id);

    return i >= 0 ? (size_t) i : p->names.n;
}

/* The name at index ix of pp_name_ix, as the join's coalesce gave it. */
static const char *pp_name_at(const struct kp_pyprof *p, size_t ix)
{
    return ix < p->names.n ? p->names.v[ix].s : "";
}

/* The name of an id (-1: NULL; "" for it or an unknown id). */
static const char *pp_name_of(const struct kp_pyprof *p, int64_t id)
{
    return pp_name_at(p, pp_name_ix(p, id));
}

/* The host ops' names, each op's enclosing op, the indexes by op_id and seq; -ENOMEM. */
static int pp_read_ops(struct kp_pyprof *p, struct pp_build *b)
{
    size_t n = p->n_ops, depth = 0;

    b->by_id = calloc(n ? n : 1, sizeof(*b->by_id));
    b->by_seq = calloc(n ? n : 1, sizeof(*b->by_seq));
    b->stack = calloc(n ? n : 1, sizeof(*b->stack));
    b->sub_count = calloc(n ? n : 1, sizeof(*b->sub_count));
    b->formula = malloc(p->names.n + 1);
    b->kshort = calloc(p->names.n + 1, sizeof(*b->kshort));
    b->ktc = calloc(p->names.n + 1, sizeof(*b->ktc));
    if (!b->by_id || !b->by_seq || !b->stack || !b->sub_count || !b->formula || !b->kshort ||
        !b->ktc) {
        return -ENOMEM;
    }
    memset(b->formula, -1, p->names.n + 1);
    for (size_t i = 0; i < n; i++) {
        struct pp_op *o = &p->ops[i];
        size_t ix = pp_name_ix(p, o->name_id[0]);

        o->name = pp_name_at(p, ix);
        if (b->formula[ix] < 0) {
            b->formula[ix] = kp_flops_has_formula(o->name);
        }
        o->formula = b->formula[ix] == 1;
        o->shapes = pp_name_of(p, o->name_id[1]);
        o->dtypes = pp_name_of(p, o->name_id[2]);
        /* the enclosing op: the nearest earlier op of the thread that contains it */
        while (depth > 0) {
            const struct pp_op *t = &p->ops[b->stack[depth - 1]];

            if (t->tid == o->tid && t->start <= o->start && t->end >= o->end) {
                break;
            }
            depth--;
        }
        o->parent = depth ? b->stack[depth - 1] : -1;
        b->stack[depth++] = (int32_t) i;
        if (o->op_id >= 0) {
            b->by_id[b->n_id++] = (struct pp_key){ o->op_id, (int32_t) i };
        }
        if (o->seq >= 0) {
            b->by_seq[b->n_seq++] = (struct pp_key){ o->seq, (int32_t) i };
        }
    }
    qsort(b->by_id, b->n_id, sizeof(*b->by_id), cmp_key);
    qsort(b->by_seq, b->n_seq, sizeof(*b->by_seq), cmp_key);
    return 0;
}

/* The API calls by correlation, with their thread and external id; -ENOMEM. */
static int pp_read_calls(struct kp_pyprof *p, struct pp_build *b)
{
    size_t n = p->n_calls;

    b->n_corr = n;
    b->by_corr = calloc(n ? n : 1, sizeof(*b->by_corr));
    b->corr_tid = calloc(n ? n : 1, sizeof(*b->corr_tid));
    b->corr_ext = calloc(n ? n : 1, sizeof(*b->corr_ext));
    if (!b->by_corr || !b->corr_tid || !b->corr_ext) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        b->by_corr[i] = (struct pp_key){ p->calls[i].corr, (int32_t) i };
        b->corr_tid[i] = p->calls[i].tid;
        b->corr_ext[i] = p->calls[i].ext;
    }
    return 0;
}

/* A grid's or block's column: "x,y,z", or "-" without one (what "%lld,%lld,%lld" writes, without
 * snprintf's cost at two a kernel). out holds 3 x 20 digits and signs, 2 commas, the NUL. */
static void fmt_dims(char out[static 64], bool has, const int64_t v[3])
{
    char *o = out;

    if (!has) {
        strcpy(out, "-");
        return;
    }
    for (int d = 0; d < 3; d++) {
        char digits[20];
        int n = 0;
        uint64_t u = v[d] < 0 ? 0 - (uint64_t) v[d] : (uint64_t) v[d];

        if (d > 0) {
            *o++ = ',';
        }
        if (v[d] < 0) {
            *o++ = '-';
        }
        do {
            digits[n++] = (char) ('0' + u % 10);
            u /= 10;
        } while (u > 0);
        while (n > 0) {
            *o++ = digits[--n];
        }
    }
    *o = '\0';
}

/* Kernel row i: its own columns, its op (through the correlation's external id), then the
 * op-side columns. */
static int pp_fill_kernel(struct kp_pyprof *p, struct pp_build *b, size_t i)
{
    struct kp_pyprof_row *r = &p->rows[i];
    struct pp_text text, *t = &text;
    const struct pp_kern *k = &p->kern[i];
    int64_t corr = k->corr, ext = k->ext;
    const struct pp_key *ck = corr >= 0 ? lower(b->by_corr, b->n_corr, corr) : NULL, *ok;
    size_t kix = pp_name_ix(p, k->name);
    const char *kname = pp_name_at(p, kix);
    int32_t oi = -1;

    r->idx = p->idx0 + i + 1;
    r->sil_ns = k->dur;
    r->stream = (int) k->stream;
    r->device = (int) k->device;
    fmt_dims(t->grid, k->has_grid, k->grid);
    fmt_dims(t->block, k->has_block, k->block);
    if (!b->kshort[kix]) { /* the name's first kernel */
        char sk[160];      /* PyProf's short names are short; a long one is cut */

        short_kernel(kname, sk, sizeof(sk));
        if (!(b->kshort[kix] = kp_an_pool_intern(&p->pool, sk))) {
            return -ENOMEM;
        }
        b->ktc[kix] = kp_an_is_tc_kernel(kname);
    }
    r->kernel = b->kshort[kix];
    r->kernel_full = kname;
    if (ext <= 0 && ck) {
        ext = b->corr_ext[ck->idx];
    }
    /* the innermost op of that id: the last one in (tid, start) order */
    ok = ext > 0 ? lower(b->by_id, b->n_id, ext) : NULL;
    for (; ok && ok < b->by_id + b->n_id && ok->key == ext; ok++) {
        if (oi < 0 || p->ops[ok->idx].start >= p->ops[oi].start) {
            oi = ok->idx;
        }
    }
    r->tid = ck ? b->corr_tid[ck->idx] : 0;
    b->share[i].key = -1;
    b->share[i].row = i;
    if (fill_row(p, b, r, t, oi, b->ktc[kix], &b->share[i]) < 0 ||
        !(r->altseq = kp_an_pool_intern(&p->pool, t->altseq)) ||
        !(r->layer = kp_an_pool_intern(&p->pool, t->layer)) ||
        !(r->mod = kp_an_pool_intern(&p->pool, t->mod)) ||
        !(r->op = kp_an_pool_intern(&p->pool, t->op)) ||
        !(r->params = kp_an_pool_intern(&p->pool, t->params)) ||
        !(r->grid = kp_an_pool_intern(&p->pool, t->grid)) ||
        !(r->block = kp_an_pool_intern(&p->pool, t->block))) {
        return -ENOMEM;
    }
    return 0;
}

/* kp_pyprof_create, or of window w (NULL: the whole rank) with its rows numbered from idx0. */
static int pp_create(PGconn *c, int64_t run, int rank, size_t max_rows,
                     const struct kp_an_window *w, const struct kp_pyprof_spans *sp, uint64_t idx0,
                     struct kp_pyprof **out, char *errbuf, size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    struct kp_pyprof *p;
    struct pp_build b = { 0 };
    size_t n;
    int rc;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    p = calloc(1, sizeof(*p));
    if (!p) {
        return -ENOMEM;
    }
    p->idx0 = idx0;
    rc = pp_read_rows(c, params, max_rows, p, w, sp, errbuf, errlen);
    if (rc == 0) {
        rc = pp_read_names(c, p, errbuf, errlen);
        if (rc == -ENOMEM) {
            goto nomem;
        }
    }
    if (rc < 0) {
        goto fail;
    }
    if (pp_read_ops(p, &b) < 0 || pp_read_calls(p, &b) < 0) {
        goto nomem;
    }
    free(p->calls); /* in b now */
    p->calls = NULL;
    n = p->n_kern;
    p->rows = calloc(n ? n : 1, sizeof(*p->rows));
    b.share = calloc(n ? n : 1, sizeof(*b.share));
    if (!p->rows || !b.share) {
        goto nomem;
    }
    p->n_rows = n;
    for (size_t i = 0; i < n; i++) {
        if (pp_fill_kernel(p, &b, i) < 0) {
            goto nomem;
        }
    }
    /* the rows point into the pool and the names, not into the loaded rows: those go before
     * the caller copies the rows for the reply (a third of the peak at 1 M events) */
    free(p->kern);
    p->kern = NULL;
    free(p->ops);
    p->ops = NULL;
    p->n_ops = p->cap_ops = 0;
    free(p->works.slot);
    p->works = (struct pp_works){ 0 };
    share_work(p->rows, b.share, n);
    rc = 0;
    *out = p;
    p = NULL;
    goto out;

nomem:
    rc = -ENOMEM;
    kp_errbuf_set(errbuf, errlen, "out of memory building the PyProf table");
fail:
    kp_pyprof_destroy(p);
out:
    free(b.by_id);
    free(b.by_seq);
    free(b.by_corr);
    free(b.corr_tid);
    free(b.corr_ext);
    free(b.stack);
    free(b.sub_count);
    free(b.share);
    free(b.formula);
    free(b.kshort);
    free(b.ktc);
    return rc;
}

int kp_pyprof_create(PGconn *c, int64_t run, int rank, size_t max_rows, struct kp_pyprof **out,
                     char *errbuf, size_t errlen)
{
    return pp_create(c, run, rank, max_rows, NULL, NULL, 0, out, errbuf, errlen);
}

/* The python functions and NVTX ranges of the rank that cross a cut between windows w[0..n),
 * into *out (kp_pyprof_spans_free). 0, or kp_pyprof_create's errors. */
static int pp_spans_load(PGconn *c, int64_t run, int rank, const struct kp_an_window *w, size_t n,
                         size_t max_rows, struct kp_pyprof_spans **out, char *errbuf, size_t errlen)
{
    struct kp_pyprof holder = { 0 };
    size_t budget = 0;
    struct pp_kload l = { &holder, &budget, max_rows, NULL };
    struct kp_strbuf cuts, sql;
    char runs[24], ranks[16];
    int rc = 0;

    *out = NULL;
    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    kp_strbuf_init(&cuts, 0);
    kp_strbuf_init(&sql, 0);
    /* the cuts: each window's start but the first's; width_bucket puts a time at a cut in the
     * window it starts, so that a span ending at a cut counts as reaching it (>= t_lo) */
    rc = kp_strbuf_append_str(&cuts, "'{");
    for (size_t i = 1; i < n && rc == 0; i++) {
        rc = kp_strbuf_appendf(&cuts, "%s%" PRId64, i > 1 ? "," : "", w[i].t_lo);
    }
    rc = rc ? rc : kp_strbuf_append_str(&cuts, "}'::bigint[]");
    rc = rc ? rc
            : kp_strbuf_appendf(&sql,
                                "COPY (" PP_OPS_SELECT "(4, 5) AND width_bucket(start_ns, %s) <> "
                                "width_bucket(start_ns + coalesce(dur_ns, 0), %s)) TO STDOUT",
                                runs, ranks, cuts.data, cuts.data);
    rc = rc ? -ENOMEM : kp_pg_copy_out(c, sql.data, pp_op_row, &l, errbuf, errlen);
    kp_strbuf_fini(&cuts);
    kp_strbuf_fini(&sql);
    rc = pp_copy_failed(rc, max_rows, "python functions and NVTX ranges", errbuf, errlen);
    if (rc == 0 && !(*out = calloc(1, sizeof(**out)))) {
        rc = -ENOMEM;
    }
    if (rc != 0) {
        free(holder.ops);
        return rc;
    }
    (*out)->ops = holder.ops;
    (*out)->n = holder.n_ops;
    return 0;
}

static void pp_spans_free(struct kp_pyprof_spans *s)
{
    if (s) {
        free(s->ops);
        free(s);
    }
}

int kp_pyprof_each(PGconn *c, int64_t run, int rank, size_t max_rows, size_t window_events,
                   int (*each)(void *ud, const struct kp_pyprof *table), void *ud, size_t *windows,
                   char *errbuf, size_t errlen)
{
    struct kp_an_window *w = NULL;
    struct kp_pyprof *p = NULL;
    struct kp_pyprof_spans *sp = NULL;
    size_t n = 0;
    uint64_t idx0 = 0;
    bool began = false;
    int rc;

    *windows = 1;
    if (window_events == 0) {
        if ((rc = kp_pyprof_create(c, run, rank, max_rows, &p, errbuf, errlen)) == 0) {
            rc = each(ud, p);
        }
        kp_pyprof_destroy(p);
        return rc;
    }
    /* the plan and every window read one snapshot */
    if ((rc = kp_an_snapshot_begin(c, &began, errbuf, errlen)) != 0) {
        return rc;
    }
    rc = kp_an_plan_windows(c, run, rank, window_events, true, &w, &n, errbuf, errlen);
    if (rc == 0 && n == 0) {
        rc = KP_EWHOLE;
        kp_errbuf_set(errbuf, errlen,
                      "run %" PRId64 " rank %d cannot be cut between steps: read it whole", run,
                      rank);
    }
    if (rc == 0) {
        rc = pp_spans_load(c, run, rank, w, n, max_rows, &sp, errbuf, errlen);
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if ((rc = pp_create(c, run, rank, max_rows, &w[i], sp, idx0, &p, errbuf, errlen)) == 0) {
            idx0 += p->n_rows;
            rc = each(ud, p);
        }
        kp_pyprof_destroy(p);
        p = NULL;
    }
    if (rc == 0) {
        *windows = n;
    }
    kp_an_snapshot_end(c, began, rc);
    pp_spans_free(sp);
    free(w);
    return rc;
}

/* s's copy in dst's pool (NULL stays NULL); false without memory. */
static bool pp_keep(struct kp_pyprof *dst, const char **s)
{
    return *s == NULL || (*s = kp_an_pool_intern(&dst->pool, *s)) != NULL;
}

/* kp_pyprof_each's callback for kp_pyprof_create_windowed: a window's rows appended to the
 * table ud, their text copied into its pool. 0 or -ENOMEM. */
static int pp_append(void *ud, const struct kp_pyprof *src)
{
    struct kp_pyprof *dst = ud;

    if (dst->n_rows + src->n_rows > dst->cap_rows) {
        size_t nc = dst->cap_rows ? dst->cap_rows : 4096;
        struct kp_pyprof_row *r;

        while (nc < dst->n_rows + src->n_rows) {
            nc *= 2;
        }
        if (!(r = realloc(dst->rows, nc * sizeof(*r)))) {
            return -ENOMEM;
        }
        dst->rows = r;
        dst->cap_rows = nc;
    }
    for (size_t i = 0; i < src->n_rows; i++) {
        struct kp_pyprof_row *r = &dst->rows[dst->n_rows];

        *r = src->rows[i];
        if (!pp_keep(dst, &r->altseq) || !pp_keep(dst, &r->layer) || !pp_keep(dst, &r->trace) ||
            !pp_keep(dst, &r->mod) || !pp_keep(dst, &r->op) || !pp_keep(dst, &r->kernel) ||
            !pp_keep(dst, &r->kernel_full) || !pp_keep(dst, &r->params) || !pp_keep(dst, &r->tc) ||
            !pp_keep(dst, &r->grid) || !pp_keep(dst, &r->block)) {
            return -ENOMEM;
        }
        dst->n_rows++;
    }
    return 0;
}

int kp_pyprof_create_windowed(PGconn *c, int64_t run, int rank, size_t max_rows,
                              size_t window_events, struct kp_pyprof **out, size_t *windows,
                              char *errbuf, size_t errlen)
{
    struct kp_pyprof *p;
    int rc;

    *out = NULL;
    *windows = 1;
    if (window_events == 0) { /* the table as it is built, not a copy */
        return kp_pyprof_create(c, run, rank, max_rows, out, errbuf, errlen);
    }
    if (!(p = calloc(1, sizeof(*p)))) {
        return -ENOMEM;
    }
    rc = kp_pyprof_each(c, run, rank, max_rows, window_events, pp_append, p, windows, errbuf,
                        errlen);
    if (rc == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory building the PyProf table");
    }
    if (rc != 0) {
        kp_pyprof_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void kp_pyprof_destroy(struct kp_pyprof *p)
{
    if (!p) {
        return;
    }
    free(p->kern);
    free(p->calls);
    kp_an_dict_fini(&p->names);
    kp_an_pool_fini(&p->pool);
    free(p->works.slot);
    free(p->ops);
    free(p->rows);
    free(p);
}

const struct kp_pyprof_row *kp_pyprof_rows(const struct kp_pyprof *p, size_t *n)
{
    *n = p->n_rows;
    return p->rows;
}

void kp_pyprof_write(FILE *f, const struct kp_pyprof *p, int64_t run, int rank,
                     const enum kp_pyprof_col *cols, int ncols, enum kp_pyprof_format fmt,
                     int width)
{
    kp_pyprof_write_rows(f, p->rows, p->n_rows, run, rank, cols, ncols, fmt, width);
}
