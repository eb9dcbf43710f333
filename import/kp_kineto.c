/*
 * kp_kineto: streaming Kineto trace JSON → kprof batches. See kp_kineto.h for the contract
 * and the mapping. The importer is three files:
 *  - jr.c: the pull JSON tokenizer over a refillable 256 KiB buffer (jr.h);
 *  - this file: the trace walker and the Kineto mapping. The top-level object (or a bare
 *    array), its metadata keys, and each traceEvents entry parsed into a struct ev — the
 *    envelope plus every args key the mapping uses, whatever their order (args may come
 *    before cat) — then mapped by ev_finish into the rows of a kp_batch_builder; at
 *    batch_rows rows (or 8 MiB of names) the batch is flushed;
 *  - spill.c: the flush (rank_info, validation, the callback) and the spool of a scan.
 * Memory is O(batch_rows + max_string_bytes), independent of the file.
 */
#define KP_LOG_MODULE "kineto"
#include "kp_kineto.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <zlib.h>

#include "jr.h"
#include "kp_batch_builder.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_log.h"
#include "kp_strbuf.h"
#include "spill.h"

#define I2MAX 32767
#define I4MAX INT32_MAX

const char *const kp_kineto_cat_names[KP_KINETO_CAT_COUNT] = {
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "cuda_sync",
    "memory",
    "ac2g",
    "fwdbwd",
    "profiler_step",
    "collective",
    "cuda_profiler_range",
    "metadata",
    "skipped",
};

/* ------------------------------------------------------------------------------------------ */
/* 3. The batch's columns (kp_batch_builder does the rest) */

/* An imported batch leaves out an optional column whose every row holds its "none" value
 * (NULL in PostgreSQL: 0, or -1 where 0 means something; NaN for the doubles), except those
 * that every event of the kind has (ALWAYS). */
#define ALWAYS(kind, col)          \
    {                              \
        kind, col, KP_BB_ALWAYS, 0 \
    }
static const struct kp_batch_builder_rule import_cols[] = {
    ALWAYS(KP_EV_KERNEL, "start_ns"),
    ALWAYS(KP_EV_KERNEL, "dur_ns"),
    ALWAYS(KP_EV_KERNEL, "name"),
    ALWAYS(KP_EV_KERNEL, "device"),
    ALWAYS(KP_EV_KERNEL, "stream"),
    ALWAYS(KP_EV_MEMCPY, "start_ns"),
    ALWAYS(KP_EV_MEMCPY, "dur_ns"),
    ALWAYS(KP_EV_MEMCPY, "bytes"),
    ALWAYS(KP_EV_MEMCPY, "device"),
    ALWAYS(KP_EV_MEMCPY, "stream"),
    ALWAYS(KP_EV_MEMSET, "start_ns"),
    ALWAYS(KP_EV_MEMSET, "dur_ns"),
    ALWAYS(KP_EV_MEMSET, "bytes"),
    ALWAYS(KP_EV_MEMSET, "device"),
    ALWAYS(KP_EV_MEMSET, "stream"),
    ALWAYS(KP_EV_API, "start_ns"),
    ALWAYS(KP_EV_API, "dur_ns"),
    ALWAYS(KP_EV_API, "domain"),
    ALWAYS(KP_EV_API, "name"),
    ALWAYS(KP_EV_API, "tid"),
    ALWAYS(KP_EV_OP, "start_ns"),
    ALWAYS(KP_EV_OP, "dur_ns"),
    ALWAYS(KP_EV_OP, "name"),
    ALWAYS(KP_EV_OP, "kind"),
    { KP_EV_OP, "seq", KP_BB_AUTO, -1 },
    { KP_EV_OP, "device", KP_BB_AUTO, -1 },
    ALWAYS(KP_EV_STEP, "start_ns"),
    ALWAYS(KP_EV_STEP, "step"),
    ALWAYS(KP_EV_STEP, "dur_ns"),
    ALWAYS(KP_EV_COLLECTIVE, "start_ns"),
    ALWAYS(KP_EV_COLLECTIVE, "dur_ns"),
    ALWAYS(KP_EV_COLLECTIVE, "name"),
    ALWAYS(KP_EV_COLLECTIVE, "tid"),
    ALWAYS(KP_EV_SYNC, "start_ns"),
    ALWAYS(KP_EV_SYNC, "dur_ns"),
    ALWAYS(KP_EV_SYNC, "sync_type"),
    ALWAYS(KP_EV_SYNC, "device"),
    ALWAYS(KP_EV_SYNC, "stream"),
    ALWAYS(KP_EV_MEMORY, "start_ns"),
    ALWAYS(KP_EV_MEMORY, "name"),
    ALWAYS(KP_EV_MEMORY, "device_type"),
    ALWAYS(KP_EV_MEMORY, "device"),
    ALWAYS(KP_EV_MEMORY, "bytes"),
    ALWAYS(KP_EV_COUNTER, "metric"),
    ALWAYS(KP_EV_COUNTER, "correlation"),
    ALWAYS(KP_EV_COUNTER, "value"),
    ALWAYS(KP_EV_COUNTER, "device"),
};
#undef ALWAYS

/* ------------------------------------------------------------------------------------------ */
/* 2. The trace walker */

enum arg_id {
    A_EXT,
    A_EXT_LOWER,
    A_CORR,
    A_CBID,
    A_DEVICE,
    A_CONTEXT,
    A_STREAM,
    A_REGS,
    A_SMEM,
    A_BYTES,
    A_SEQ,
    A_FWD_TID,
    A_PY_ID,
    A_PY_PARENT,
    A_IN_NELEMS,
    A_OUT_NELEMS,
    A_GROUP_SIZE,
    A_PG_ID,
    A_COLL_SEQ,
    A_DEV_TYPE,
    A_DEV_ID,
    A_ADDR,
    A_MEM_BYTES,
    A_TOTAL_ALLOC,
    A_TOTAL_RES,
    A_FROM_DEV,
    A_TO_DEV,
    A_GRAPH_ID,
    A_GRAPH_NODE,
    A_EVENT_ID,
    A_NUM_COUNT,
    /* strings */
    S_COLL_NAME = A_NUM_COUNT,
    S_DTYPE,
    S_PG_NAME,
    S_PG_DESC,
    S_COUNT,
    /* captured lists and arrays */
    C_SHAPES = S_COUNT,
    C_TYPES,
    C_GRID,
    C_BLOCK,
    C_BLOCKS_SM, /* a number, parsed when the kernel is built */
    C_OCCUPANCY,
    C_MEMBW, /* likewise, when the memcpy or memset is built */
    ARG_COUNT
};

struct arg_key {
    const char *key;
    uint8_t len;
    uint8_t id;
    const char *what; /* "args.<key>", for errors */
};

#define AK(s, id)                                   \
    {                                               \
        s, (uint8_t) (sizeof(s) - 1), id, "args." s \
    }
static const struct arg_key arg_keys[] = {
    AK("External id", A_EXT),
    AK("external id", A_EXT_LOWER),
    AK("correlation", A_CORR),
    AK("cbid", A_CBID),
    AK("device", A_DEVICE),
    AK("context", A_CONTEXT),
    AK("stream", A_STREAM),
    AK("registers per thread", A_REGS),
    AK("shared memory", A_SMEM),
    AK("bytes", A_BYTES),
    AK("Sequence number", A_SEQ),
    AK("Fwd thread id", A_FWD_TID),
    AK("Python id", A_PY_ID),
    AK("Python parent id", A_PY_PARENT),
    AK("In msg nelems", A_IN_NELEMS),
    AK("Out msg nelems", A_OUT_NELEMS),
    AK("Group size", A_GROUP_SIZE),
    AK("Process Group ID", A_PG_ID),
    AK("Seq", A_COLL_SEQ),
    AK("Device Type", A_DEV_TYPE),
    AK("Device Id", A_DEV_ID),
    AK("Addr", A_ADDR),
    AK("Bytes", A_MEM_BYTES),
    AK("Total Allocated", A_TOTAL_ALLOC),
    AK("Total Reserved", A_TOTAL_RES),
    AK("fromDevice", A_FROM_DEV),
    AK("toDevice", A_TO_DEV),
    AK("graph id", A_GRAPH_ID),
    AK("graph node id", A_GRAPH_NODE),
    AK("wait_on_cuda_event_id", A_EVENT_ID),
    AK("event_id", A_EVENT_ID),
    AK("Collective name", S_COLL_NAME),
    AK("dtype", S_DTYPE),
    AK("Process Group Name", S_PG_NAME),
    AK("Process Group Description", S_PG_DESC),
    AK("Input Dims", C_SHAPES),
    AK("Input dims", C_SHAPES),
    AK("Input type", C_TYPES),
    AK("grid", C_GRID),
    AK("block", C_BLOCK),
    AK("blocks per SM", C_BLOCKS_SM),
    AK("est. achieved occupancy %", C_OCCUPANCY),
    AK("memory bandwidth (GB/s)", C_MEMBW),
};
#undef AK
#define N_ARG_KEYS (sizeof(arg_keys) / sizeof(arg_keys[0]))

/* One traceEvents entry. Strings live in k->evs (offset, length). */
struct ev {
    int ph; /* 0: absent */
    bool has_ts, has_dur, has_id;
    int64_t ts_ns, dur_ns;
    bool pid_num, tid_num; /* an int, or a string with digits ("stream 7", "25738") */
    int64_t pid, tid;
    uint32_t name_off, name_len, cat_off, cat_len;
    bool has_name, has_cat;
    uint64_t have;             /* bit per enum arg_id */
    int64_t a[A_NUM_COUNT];    /* numeric args */
    uint32_t s_off[ARG_COUNT]; /* string and captured args in k->evs */
    uint32_t s_len[ARG_COUNT];
    int64_t grid[3], block[3];
    /* cuda_profiler_range metrics: args keys the table above does not know, with a number */
    uint32_t n_ctr;
    bool ctr_overflow; /* more than KP_KINETO_MAX_COUNTERS of them */
    uint32_t ctr_off[KP_KINETO_MAX_COUNTERS], ctr_len[KP_KINETO_MAX_COUNTERS];
    double ctr_val[KP_KINETO_MAX_COUNTERS];
};

struct kp_kineto {
    const struct kp_kineto_opts *opts;
    struct jr j;
    struct spill out;     /* the batch being read */
    struct kp_strbuf evs; /* the current event's strings */
    struct ev e;
    struct kp_kineto_meta *meta;
    size_t max_name;
    uint32_t batch_rows;
    uint64_t ev_index;
    uint64_t n_ranges; /* cuda_profiler_range events mapped so far */
};

static bool has(const struct ev *e, int id)
{
    return (e->have >> id) & 1;
}

static const char *evstr(struct kp_kineto *k, uint32_t off)
{
    return k->evs.data != NULL ? k->evs.data + off : ""; /* nothing kept yet: empty */
}

/* Stores j->str (or s) in the event's string space. */
static int ev_keep(struct kp_kineto *k, const char *s, size_t n, uint32_t *off, uint32_t *len)
{
    int rc;

    *off = (uint32_t) k->evs.len;
    *len = (uint32_t) n;
    if ((rc = kp_strbuf_append(&k->evs, s, n)) != 0 || (rc = kp_strbuf_putc(&k->evs, 0)) != 0) {
        if (rc == KP_ETOOBIG) {
            return jr_fail(&k->j, "an event's strings exceed %u bytes", EV_MAX_BYTES);
        }
        k->j.err = rc;
        return rc;
    }
    return 0;
}

/* Reads a scalar the mapping needs as an integer. Numbers and numeric strings give
 * NUM_OK; null, non-numeric strings ("N/A", "inf") and booleans give NUM_NAN (absent);
 * containers are an error. */
static int read_int(struct kp_kineto *k, const char *what, int64_t *out, bool *present)
{
    struct jr *j = &k->j;
    int c = jr_ws(j);
    enum num_rc r;

    *present = false;
    if (c == '"') {
        if (jr_string(j) != 0) {
            return j->err;
        }
        r = text_to_i64(j->str, out);
    }
    else if (c == '-' || (c >= '0' && c <= '9')) {
        if (jr_number(j) != 0) {
            return j->err;
        }
        r = text_to_i64(j->num, out);
    }
    else if (c == 'n' || c == 't' || c == 'f') {
        return jr_skip(j);
    }
    else if (c == '{' || c == '[') {
        return jr_fail(j, "%s must be a number, got %s", what, c == '{' ? "an object" : "an array");
    }
    else {
        return jr_unexpected(j, c, "a value");
    }
    if (r == NUM_RANGE) {
        return jr_fail(j, "%s is out of the 64-bit range", what);
    }
    *present = r == NUM_OK;
    return 0;
}

/* Reads a string the mapping needs; numbers are taken as their text, null as absent. */
static int read_str(struct kp_kineto *k, const char *what, uint32_t *off, uint32_t *len,
                    bool *present)
{
    struct jr *j = &k->j;
    int c = jr_ws(j);

    *present = false;
    if (c == '"') {
        if (jr_string(j) != 0) {
            return j->err;
        }
        *present = true;
        return ev_keep(k, j->str, j->slen, off, len);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (jr_number(j) != 0) {
            return j->err;
        }
        *present = true;
        return ev_keep(k, j->num, j->nlen, off, len);
    }
    if (c == 'n') {
        return jr_literal(j, "null");
    }
    if (c < 0) {
        return jr_unexpected(j, c, "a value");
    }
    return jr_fail(j, "%s must be a string, got %s", what, jr_what(c));
}

/* Reads [x, y, z] (fewer entries leave 1s). */
static int read_dim3(struct kp_kineto *k, const char *what, int64_t v[3], bool *present)
{
    struct jr *j = &k->j;
    int c = jr_ws(j), rc;
    bool first, p;
    size_t n = 0;

    *present = false;
    if (c == 'n') {
        return jr_literal(j, "null");
    }
    if (c != '[') {
        return jr_fail(j, "%s must be an array of 3 ints, got %s", what, jr_what(c));
    }
    v[0] = v[1] = v[2] = 1;
    if (jr_arr_begin(j, &first) != 0) {
        return j->err;
    }
    while ((rc = jr_arr_next(j, &first)) == 1) {
        int64_t x = 0;

        if (n >= 3) {
            return jr_fail(j, "%s must be an array of 3 ints, got more", what);
        }
        if (read_int(k, what, &x, &p) != 0) {
            return j->err;
        }
        v[n++] = p ? x : 0;
    }
    *present = rc == 0;
    return rc;
}

/* A cuda_profiler_range event's category, or no category seen yet (args may come first). */
static bool maybe_range(struct kp_kineto *k)
{
    static const char rc[] = "cuda_profiler_range";

    return !k->e.has_cat || (k->e.cat_len == sizeof(rc) - 1 &&
                             strncasecmp(evstr(k, k->e.cat_off), rc, sizeof(rc) - 1) == 0);
}

/* An args key the table does not know (j->str): kept with its value when the event may be a
 * cuda_profiler_range and the value is a finite number (a metric), else skipped. */
static int ctr_arg(struct kp_kineto *k)
{
    struct jr *j = &k->j;
    struct ev *e = &k->e;
    uint32_t off, len;
    char *end;
    double v;
    int c;

    if (!maybe_range(k)) {
        return jr_skip(j);
    }
    c = jr_ws(j);
    if (c != '-' && !(c >= '0' && c <= '9')) {
        return jr_skip(j);
    }
    if (e->n_ctr >= KP_KINETO_MAX_COUNTERS) {
        e->ctr_overflow = true;
        return jr_skip(j);
    }
    if (ev_keep(k, j->str, j->slen, &off, &len) != 0 || jr_number(j) != 0) {
        return j->err;
    }
    errno = 0;
    v = strtod(j->num, &end);
    if (end == j->num || *end != '\0' || !isfinite(v)) {
        return 0; /* e.g. 1e999: not a value we can store */
    }
    e->ctr_off[e->n_ctr] = off;
    e->ctr_len[e->n_ctr] = len;
    e->ctr_val[e->n_ctr++] = v;
    return 0;
}

static int parse_args(struct kp_kineto *k)
{
    struct jr *j = &k->j;
    struct ev *e = &k->e;
    bool first, present;
    int rc, c = jr_ws(j);

    if (c == 'n') {
        return jr_literal(j, "null");
    }
    if (c != '{') {
        return jr_fail(j, "args must be an object, got %s", jr_what(c));
    }
    if (jr_obj_begin(j, &first) != 0) {
        return j->err;
    }
    while ((rc = jr_obj_key(j, &first)) == 1) {
        const struct arg_key *ak = NULL;
        const char *what;

        for (size_t i = 0; i < N_ARG_KEYS; i++) {
            if (arg_keys[i].len == j->slen && memcmp(arg_keys[i].key, j->str, j->slen) == 0) {
                ak = &arg_keys[i];
                break;
            }
        }
        if (ak == NULL) {
            if (ctr_arg(k) != 0) {
                return j->err;
            }
            continue;
        }
        what = ak->what;
        if (ak->id < A_NUM_COUNT) {
            int64_t v = 0;

            if (read_int(k, what, &v, &present) != 0) {
                return j->err;
            }
            if (present) {
                e->a[ak->id] = v;
                e->have |= 1ULL << ak->id;
            }
            else {
                e->have &= ~(1ULL << ak->id);
            }
        }
        else if (ak->id < S_COUNT) {
            if (read_str(k, what, &e->s_off[ak->id], &e->s_len[ak->id], &present) != 0) {
                return j->err;
            }
            e->have = present ? e->have | (1ULL << ak->id) : e->have & ~(1ULL << ak->id);
        }
        else if (ak->id == C_GRID || ak->id == C_BLOCK) {
            if (read_dim3(k, what, ak->id == C_GRID ? e->grid : e->block, &present) != 0) {
                return j->err;
            }
            e->have = present ? e->have | (1ULL << ak->id) : e->have & ~(1ULL << ak->id);
        }
        else {
            size_t start = k->evs.len;

            if (jr_capture(j, &k->evs) != 0) {
                return j->err;
            }
            if (kp_strbuf_putc(&k->evs, 0) != 0) {
                return jr_fail(j, "an event's strings exceed %u bytes", EV_MAX_BYTES);
            }
            e->s_off[ak->id] = (uint32_t) start;
            e->s_len[ak->id] = (uint32_t) (k->evs.len - start - 1);
            e->have |= 1ULL << ak->id;
        }
    }
    return rc;
}

/* pid/tid: an int, or a string whose first digits are the number ("stream 7", "25738").
 * Negative ints are made positive (kineto does so since 2024-10). */
static int parse_id(struct kp_kineto *k, const char *what, int64_t *out, bool *num)
{
    struct jr *j = &k->j;
    int c = jr_ws(j);
    bool present;

    *num = false;
    if (c == '"') {
        const char *p;

        if (jr_string(j) != 0) {
            return j->err;
        }
        p = j->str;
        while (*p != '\0' && !(*p >= '0' && *p <= '9')) {
            p++;
        }
        if (*p != '\0') {
            int64_t v = 0;

            for (; *p >= '0' && *p <= '9' && v < INT64_MAX / 10 - 9; p++) {
                v = v * 10 + (*p - '0');
            }
            *out = v;
            *num = true;
        }
        return 0;
    }
    if (read_int(k, what, out, &present) != 0) {
        return j->err;
    }
    if (present) {
        *out = *out < 0 ? (*out == INT64_MIN ? INT64_MAX : -*out) : *out;
        *num = true;
    }
    return 0;
}

static int parse_time(struct kp_kineto *k, const char *what, int64_t *out, bool *present)
{
    struct jr *j = &k->j;
    int c = jr_ws(j);
    const char *text;

    *present = false;
    if (c == '"') { /* old traces quote some numbers */
        if (jr_string(j) != 0) {
            return j->err;
        }
        text = j->str;
        char *end;
        errno = 0;
        (void) strtod(text, &end);
        if (end == text || *end != '\0' || strpbrk(text, "nNiI") != NULL) {
            return jr_fail(j, "%s must be a number of microseconds, got \"%.40s\"", what, text);
        }
    }
    else if (c == '-' || (c >= '0' && c <= '9')) {
        if (jr_number(j) != 0) {
            return j->err;
        }
        text = j->num;
    }
    else if (c < 0) {
        return jr_unexpected(j, c, "a value");
    }
    else {
        return jr_fail(j, "%s must be a number of microseconds, got %s", what, jr_what(c));
    }
    if (num_us_to_ns(text, out) != 0) {
        return jr_fail(j, "%s = %.40s is out of range", what, text);
    }
    *present = true;
    return 0;
}

/* Checks that an arg fits the column; absent gives def. */
static int arg_in(struct kp_kineto *k, int id, int64_t lo, int64_t hi, int64_t def, int64_t *out)
{
    const struct ev *e = &k->e;

    if (!has(e, id)) {
        *out = def;
        return 0;
    }
    if (e->a[id] < lo || e->a[id] > hi) {
        const char *key = "?";

        for (size_t i = 0; i < N_ARG_KEYS; i++) {
            if (arg_keys[i].id == id) {
                key = arg_keys[i].key;
                break;
            }
        }
        return jr_fail(&k->j, "args.%s = %" PRId64 " is out of range (%" PRId64 "..%" PRId64 ")",
                       key, e->a[id], lo, hi);
    }
    *out = e->a[id];
    return 0;
}

/* A captured numeric arg (e.g. "blocks per SM": 0.5): *out, or NaN when it is absent or not
 * a finite number >= 0 (Kineto writes "inf" for a kernel with no SMs known). Informational:
 * never an error. */
static int arg_real(struct kp_kineto *k, int id, double *out)
{
    const struct ev *e = &k->e;
    const char *s;
    char *end;
    double v;

    *out = NAN;
    if (!has(e, id)) {
        return 0;
    }
    s = evstr(k, e->s_off[id]);
    if (!(*s >= '0' && *s <= '9')) {
        return 0;
    }
    errno = 0;
    v = strtod(s, &end);
    if (end != s && *end == '\0' && errno == 0 && isfinite(v) && v >= 0) {
        *out = v;
    }
    return 0;
}

/* Interns a name: cut to the limit at a UTF-8 boundary, invalid UTF-8 replaced. */
static int64_t intern_name(struct kp_kineto *k, const char *s, size_t n)
{
    char *tmp = NULL;
    int64_t idx;

    if (n > k->max_name) {
        n = k->max_name;
        while (n > 0 && ((unsigned char) s[n] & 0xc0) == 0x80) {
            n--;
        }
        k->meta->names_truncated++;
    }
    if (!kp_utf8_valid(s, n)) {
        /* replace every byte of an invalid sequence with '?' (same length, still bounded) */
        size_t i = 0;

        if ((tmp = malloc(n + 1)) == NULL) {
            return -ENOMEM;
        }
        memcpy(tmp, s, n);
        while (i < n) {
            size_t l = 1;
            unsigned char c = (unsigned char) tmp[i];

            if (c >= 0xc2 && c <= 0xdf) {
                l = 2;
            }
            else if (c >= 0xe0 && c <= 0xef) {
                l = 3;
            }
            else if (c >= 0xf0 && c <= 0xf4) {
                l = 4;
            }
            if (c == 0 || (c >= 0x80 && l == 1) || i + l > n || !kp_utf8_valid(tmp + i, l)) {
                tmp[i] = '?';
                l = 1;
            }
            i += l;
        }
        s = tmp;
    }
    idx = kp_batch_builder_intern(k->out.bb, s, n);
    free(tmp);
    return idx;
}

static int64_t intern_ev(struct kp_kineto *k, int id)
{
    if (!has(&k->e, id)) {
        return 0;
    }
    return intern_name(k, evstr(k, k->e.s_off[id]), k->e.s_len[id]);
}

/* Appends a zeroed row of kind to the batch (its columns: kp_batch_builder_table). Returns
 * its index, or -ENOMEM (set as the parse's error). */
static long row_new(struct kp_kineto *k, enum kp_event_kind kind)
{
    long i = kp_batch_builder_add(k->out.bb, kind, 1);

    if (i < 0) {
        k->j.err = -ENOMEM;
    }
    return i;
}

#define ROW(i, kind)                        \
    do {                                    \
        if (((i) = row_new(k, kind)) < 0) { \
            return k->j.err;                \
        }                                   \
    } while (0)

/* Counts a row and its start for the batch. */
static int row_added(struct kp_kineto *k, int kind, int64_t ts)
{
    if (!k->out.have_base) {
        k->out.base_ns = ts;
        k->out.have_base = true;
    }
    if (ts < k->meta->min_ns) {
        k->meta->min_ns = ts;
    }
    if (ts > k->meta->max_ns) {
        k->meta->max_ns = ts;
    }
    k->meta->rows[kind]++;
    return 0;
}

static bool batch_full(struct kp_kineto *k)
{
    /* + 1: the string table's "" counted as a byte, as it always was */
    return kp_batch_builder_total(k->out.bb) >= k->batch_rows ||
           kp_batch_builder_string_bytes(k->out.bb) + 1 >= KB_MAX_STR_BYTES;
}

/* Lower-cases cat into buf (at most len-1 bytes; longer cats never match). */
static void lower_cat(struct kp_kineto *k, char *buf, size_t len)
{
    const char *c = evstr(k, k->e.cat_off);
    size_t n = k->e.cat_len;

    if (!k->e.has_cat || n >= len) {
        buf[0] = '\0';
        return;
    }
    for (size_t i = 0; i < n; i++) {
        buf[i] = (char) ((c[i] >= 'A' && c[i] <= 'Z') ? c[i] + 32 : c[i]);
    }
    buf[n] = '\0';
}

enum map {
    M_SKIP,
    M_CPU_OP,
    M_USER_ANN,
    M_GPU_ANN,
    M_PY,
    M_RUNTIME,
    M_DRIVER,
    M_KERNEL,
    M_MEMCPY,
    M_MEMSET,
    M_SYNC,
    M_FLOW_AC2G,
    M_FLOW_FWDBWD,
    M_RANGE,
};

static enum map classify(const char *cat)
{
    static const struct {
        const char *cat;
        enum map m;
    } t[] = {
        { "cpu_op", M_CPU_OP },
        { "operator", M_CPU_OP },
        { "user_annotation", M_USER_ANN },
        { "gpu_user_annotation", M_GPU_ANN },
        { "user", M_GPU_ANN },
        { "python_function", M_PY },
        { "cuda_runtime", M_RUNTIME },
        { "runtime", M_RUNTIME },
        { "cuda_driver", M_DRIVER },
        { "kernel", M_KERNEL },
        { "gpu_memcpy", M_MEMCPY },
        { "memcpy", M_MEMCPY },
        { "gpu_memset", M_MEMSET },
        { "memset", M_MEMSET },
        { "cuda_sync", M_SYNC },
        { "ac2g", M_FLOW_AC2G },
        { "async", M_FLOW_AC2G },
        { "async_gpu", M_FLOW_AC2G },
        { "async_cpu_to_gpu", M_FLOW_AC2G },
        { "fwdbwd", M_FLOW_FWDBWD },
        { "forward_backward", M_FLOW_FWDBWD },
        { "cuda_profiler_range", M_RANGE },
    };

    size_t n = strlen(cat);

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (cat[0] == t[i].cat[0] && strlen(t[i].cat) == n && memcmp(cat, t[i].cat, n) == 0) {
            return t[i].m;
        }
    }
    return M_SKIP;
}

/* The External id of a runtime/GPU event after the trap rule (kp_kineto.h). */
static uint64_t gpu_ext(struct kp_kineto *k)
{
    const struct ev *e = &k->e;
    int64_t ext = 0;

    if (has(e, A_EXT)) {
        ext = e->a[A_EXT];
    }
    else if (has(e, A_EXT_LOWER)) {
        ext = e->a[A_EXT_LOWER];
    }
    if (ext <= 0) {
        return 0;
    }
    if (has(e, A_CORR) && e->a[A_CORR] == ext) {
        k->meta->ext_dropped++;
        return 0;
    }
    return (uint64_t) ext;
}

static int64_t abs_ts(struct kp_kineto *k)
{
    int64_t base = k->opts->meta != NULL ? k->opts->meta->base_ns : k->meta->base_ns;

    if (k->out.spool != NULL) {
        if (!k->out.spool->base_set) {
            k->out.spool->base_used = base;
            k->out.spool->base_set = true;
        }
        else if (k->out.spool->base_used != base) {
            k->out.spool->unusable = true; /* rows built with two different bases */
        }
    }
    if (__builtin_add_overflow(base, k->e.ts_ns, &base)) {
        return INT64_MAX;
    }
    return base;
}

/* GPU events: the device from args.device, else the pid; the stream from args.stream, else
 * the tid ("stream 7"). */
static int gpu_where(struct kp_kineto *k, int64_t *device, int64_t *stream)
{
    const struct ev *e = &k->e;

    if (arg_in(k, A_DEVICE, 0, I2MAX, e->pid_num && e->pid <= I2MAX ? e->pid : 0, device) != 0 ||
        arg_in(k, A_STREAM, 0, I4MAX, e->tid_num && e->tid <= I4MAX ? e->tid : 0, stream) != 0) {
        return k->j.err;
    }
    if (k->meta->device < 0) {
        k->meta->device = (int32_t) *device;
    }
    return 0;
}

static void cpu_seen(struct kp_kineto *k)
{
    if (k->meta->pid == 0 && k->e.pid_num && k->e.pid > 0 && k->e.pid <= UINT32_MAX) {
        k->meta->pid = (uint32_t) k->e.pid;
    }
}

static int64_t name_idx(struct kp_kineto *k)
{
    return intern_name(k, evstr(k, k->e.name_off), k->e.name_len);
}

/* "ProfilerStep#12" → 12. */
static bool profiler_step(struct kp_kineto *k, int64_t *step)
{
    const char *n = evstr(k, k->e.name_off);
    static const char pfx[] = "ProfilerStep#";

    if (k->e.name_len <= sizeof(pfx) - 1 || memcmp(n, pfx, sizeof(pfx) - 1) != 0) {
        return false;
    }
    return text_to_i64(n + sizeof(pfx) - 1, step) == NUM_OK && *step >= 0;
}

/* Reads args key id, an integer in [lo, hi] (def when absent), into dst; returns the parse's
 * error from the caller if it is not. */
#define ARG(dst, id, lo, hi, def)                   \
    do {                                            \
        int64_t v_;                                 \
        if (arg_in(k, id, lo, hi, def, &v_) != 0) { \
            return k->j.err;                        \
        }                                           \
        (dst) = (__typeof__(dst)) v_;               \
    } while (0)
#define IDX(var, expr)           \
    do {                         \
        int64_t i_ = (expr);     \
        if (i_ < 0) {            \
            k->j.err = (int) i_; \
            return k->j.err;     \
        }                        \
        var = (uint32_t) i_;     \
    } while (0)

static int map_op(struct kp_kineto *k, enum map m)
{
    struct ev *e = &k->e;
    Kprof__V1__Ops *o = kp_batch_builder_table(k->out.bb, KP_EV_OP);
    int64_t v, step = 0;
    uint32_t kind;
    bool is_step = false;
    long i;

    if (m == M_GPU_ANN) {
        kind = KPROF__V1__OP_KIND__OP_KIND_GPU_USER_ANNOTATION;
    }
    else if (m == M_PY) {
        kind = KPROF__V1__OP_KIND__OP_KIND_PYTHON_FUNCTION;
    }
    else {
        is_step = profiler_step(k, &step);
        kind = is_step ? KPROF__V1__OP_KIND__OP_KIND_PROFILER_STEP
                       : (m == M_CPU_OP ? KPROF__V1__OP_KIND__OP_KIND_CPU_OP
                                        : KPROF__V1__OP_KIND__OP_KIND_USER_ANNOTATION);
    }
    ROW(i, KP_EV_OP);
    o->start_ns[i] = abs_ts(k);
    o->dur_ns[i] = (uint64_t) e->dur_ns;
    o->kind[i] = kind;
    o->seq[i] = -1;
    o->device[i] = -1;
    IDX(o->name[i], name_idx(k));
    if (m == M_GPU_ANN) {
        int64_t dev, stream;

        if (gpu_where(k, &dev, &stream) != 0 || arg_in(k, A_EXT, 0, INT64_MAX, 0, &v) != 0) {
            return k->j.err;
        }
        o->device[i] = (int32_t) dev;
        o->stream[i] = (uint32_t) stream;
        o->external_id[i] = (uint64_t) v;
    }
    else {
        cpu_seen(k);
        o->tid[i] = e->tid_num ? (uint64_t) e->tid : 0;
        if (m == M_PY) {
            if (arg_in(k, A_PY_ID, 0, INT64_MAX - (int64_t) KP_KINETO_PY_ID_BASE, -1, &v) != 0) {
                return k->j.err;
            }
            o->op_id[i] = v >= 0 ? KP_KINETO_PY_ID_BASE + (uint64_t) v : 0;
            if (arg_in(k, A_PY_PARENT, 0, INT64_MAX - (int64_t) KP_KINETO_PY_ID_BASE, -1, &v) !=
                0) {
                return k->j.err;
            }
            o->parent_id[i] = v >= 0 ? KP_KINETO_PY_ID_BASE + (uint64_t) v : 0;
        }
        else {
            if (arg_in(k, A_EXT, 0, INT64_MAX, 0, &v) != 0) {
                return k->j.err;
            }
            o->op_id[i] = o->external_id[i] = (uint64_t) v;
            if (arg_in(k, A_SEQ, -1, INT64_MAX, -1, &o->seq[i]) != 0 ||
                arg_in(k, A_FWD_TID, 0, INT64_MAX, 0, &v) != 0) {
                return k->j.err;
            }
            o->fwd_tid[i] = (uint64_t) v;
            IDX(o->input_shapes[i], intern_ev(k, C_SHAPES));
            IDX(o->input_dtypes[i], intern_ev(k, C_TYPES));
        }
    }
    row_added(k, KP_EV_OP, o->start_ns[i]);
    if (m == M_GPU_ANN) {
        k->meta->cats[KP_KINETO_GPU_USER_ANNOTATION]++;
        return 0;
    }
    k->meta->cats[m == M_PY       ? KP_KINETO_PYTHON_FUNCTION
                  : m == M_CPU_OP ? KP_KINETO_CPU_OP
                                  : KP_KINETO_USER_ANNOTATION]++;
    if (is_step) {
        Kprof__V1__Steps *st = kp_batch_builder_table(k->out.bb, KP_EV_STEP);
        long j;

        ROW(j, KP_EV_STEP);
        st->step[j] = step;
        st->start_ns[j] = o->start_ns[i];
        st->dur_ns[j] = o->dur_ns[i];
        row_added(k, KP_EV_STEP, st->start_ns[j]);
        k->meta->cats[KP_KINETO_PROFILER_STEP]++;
    }
    if (m == M_CPU_OP && has(e, S_COLL_NAME)) {
        Kprof__V1__Collectives *c = kp_batch_builder_table(k->out.bb, KP_EV_COLLECTIVE);
        long j;

        ROW(j, KP_EV_COLLECTIVE);
        c->start_ns[j] = o->start_ns[i];
        c->dur_ns[j] = o->dur_ns[i];
        c->external_id[j] = o->external_id[i];
        c->tid[j] = o->tid[i];
        IDX(c->name[j], intern_ev(k, S_COLL_NAME));
        IDX(c->dtype[j], intern_ev(k, S_DTYPE));
        if (has(e, S_PG_NAME)) {
            IDX(c->process_group[j], intern_ev(k, S_PG_NAME));
        }
        else if (has(e, S_PG_DESC)) {
            IDX(c->process_group[j], intern_ev(k, S_PG_DESC));
        }
        else if (has(e, A_PG_ID)) {
            char id[32];
            int n = snprintf(id, sizeof(id), "%" PRId64, e->a[A_PG_ID]);

            IDX(c->process_group[j], intern_name(k, id, (size_t) n));
        }
        ARG(c->in_nelems[j], A_IN_NELEMS, 0, INT64_MAX, 0);
        ARG(c->out_nelems[j], A_OUT_NELEMS, 0, INT64_MAX, 0);
        ARG(c->group_size[j], A_GROUP_SIZE, 0, I4MAX, 0);
        ARG(c->coll_seq[j], A_COLL_SEQ, 0, INT64_MAX, 0);
        row_added(k, KP_EV_COLLECTIVE, c->start_ns[j]);
        k->meta->cats[KP_KINETO_COLLECTIVE]++;
    }
    return 0;
}

static int map_api(struct kp_kineto *k, enum map m)
{
    struct ev *e = &k->e;
    Kprof__V1__ApiCalls *a = kp_batch_builder_table(k->out.bb, KP_EV_API);
    long i;

    cpu_seen(k);
    ROW(i, KP_EV_API);
    a->start_ns[i] = abs_ts(k);
    a->dur_ns[i] = (uint64_t) e->dur_ns;
    a->domain[i] = m == M_DRIVER ? KPROF__V1__API_DOMAIN__API_DOMAIN_DRIVER
                                 : KPROF__V1__API_DOMAIN__API_DOMAIN_RUNTIME;
    a->tid[i] = e->tid_num ? (uint64_t) e->tid : 0;
    IDX(a->name[i], name_idx(k));
    ARG(a->cbid[i], A_CBID, 0, I4MAX, 0);
    ARG(a->correlation[i], A_CORR, 0, INT64_MAX, 0);
    a->external_id[i] = gpu_ext(k);
    row_added(k, KP_EV_API, a->start_ns[i]);
    k->meta->cats[m == M_DRIVER ? KP_KINETO_CUDA_DRIVER : KP_KINETO_CUDA_RUNTIME]++;
    return 0;
}

static int map_kernel(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    Kprof__V1__Kernels *r = kp_batch_builder_table(k->out.bb, KP_EV_KERNEL);
    int64_t dev, stream;
    long i;

    if (gpu_where(k, &dev, &stream) != 0) {
        return k->j.err;
    }
    ROW(i, KP_EV_KERNEL);
    r->start_ns[i] = abs_ts(k);
    r->dur_ns[i] = (uint64_t) e->dur_ns;
    r->device[i] = (uint32_t) dev;
    r->stream[i] = (uint32_t) stream;
    IDX(r->name[i], name_idx(k));
    ARG(r->context[i], A_CONTEXT, 0, I4MAX, 0);
    ARG(r->correlation[i], A_CORR, 0, INT64_MAX, 0);
    r->external_id[i] = gpu_ext(k);
    for (int d = 0; d < 3; d++) {
        if (has(e, C_GRID) && (e->grid[d] < 0 || e->grid[d] > I4MAX)) {
            return jr_fail(&k->j, "args.grid[%d] = %" PRId64 " is out of range (0..%d)", d,
                           e->grid[d], I4MAX);
        }
        if (has(e, C_BLOCK) && (e->block[d] < 0 || e->block[d] > I2MAX)) {
            return jr_fail(&k->j, "args.block[%d] = %" PRId64 " is out of range (0..%d)", d,
                           e->block[d], I2MAX);
        }
    }
    r->grid_x[i] = has(e, C_GRID) ? (uint32_t) e->grid[0] : 0;
    r->grid_y[i] = has(e, C_GRID) ? (uint32_t) e->grid[1] : 0;
    r->grid_z[i] = has(e, C_GRID) ? (uint32_t) e->grid[2] : 0;
    r->block_x[i] = has(e, C_BLOCK) ? (uint32_t) e->block[0] : 0;
    r->block_y[i] = has(e, C_BLOCK) ? (uint32_t) e->block[1] : 0;
    r->block_z[i] = has(e, C_BLOCK) ? (uint32_t) e->block[2] : 0;
    if (arg_real(k, C_BLOCKS_SM, &r->blocks_per_sm[i]) != 0 ||
        arg_real(k, C_OCCUPANCY, &r->est_occupancy[i]) != 0) {
        return k->j.err;
    }
    ARG(r->registers[i], A_REGS, 0, I2MAX, 0);
    ARG(r->static_smem[i], A_SMEM, 0, I4MAX, 0);
    ARG(r->graph_id[i], A_GRAPH_ID, 0, I4MAX, 0);
    ARG(r->graph_node_id[i], A_GRAPH_NODE, 0, INT64_MAX, 0);
    row_added(k, KP_EV_KERNEL, r->start_ns[i]);
    k->meta->cats[KP_KINETO_KERNEL]++;
    return 0;
}

/* CUPTI's names as kineto prints them (memcpyKindString, memoryKindString). */
static uint32_t word_index(const char *s, size_t n, const char *const *words)
{
    for (uint32_t i = 0; words[i] != NULL; i++) {
        if (strlen(words[i]) == n && memcmp(words[i], s, n) == 0) {
            return i;
        }
    }
    return 0;
}

static const char *const memcpy_kinds[] = { "Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                            "AtoD",    "DtoA", "DtoD", "HtoH", "PtoP", NULL };
static const char *const memory_kinds[] = { "Unknown",       "Pageable",       "Pinned",
                                            "Device",        "Array",          "Managed",
                                            "Device Static", "Managed Static", NULL };

/* "Memcpy HtoD (Pinned -> Device)": kind, src, dst; "Memset (Device)": src only. */
static void parse_mem_name(const char *n, size_t len, uint32_t *kind, uint32_t *src, uint32_t *dst)
{
    const char *sp = memchr(n, ' ', len), *lp = memchr(n, '(', len);

    *kind = *src = *dst = 0;
    if (sp != NULL && lp != NULL && lp > sp + 1) {
        *kind = word_index(sp + 1, (size_t) (lp - sp - 2 > 0 ? lp - sp - 2 : 0), memcpy_kinds);
    }
    if (lp != NULL) {
        const char *end = memchr(lp, ')', len - (size_t) (lp - n));
        const char *arrow = end != NULL ? strstr(lp, " -> ") : NULL;

        if (end == NULL) {
            return;
        }
        if (arrow != NULL && arrow < end) {
            *src = word_index(lp + 1, (size_t) (arrow - lp - 1), memory_kinds);
            *dst = word_index(arrow + 4, (size_t) (end - arrow - 4), memory_kinds);
        }
        else {
            *src = word_index(lp + 1, (size_t) (end - lp - 1), memory_kinds);
        }
    }
}

static int map_memcpy(struct kp_kineto *k, bool memset_)
{
    struct ev *e = &k->e;
    int64_t dev, stream, ctx, corr, bytes;
    uint32_t kind, src, dst;
    double bw;
    long i;

    if (gpu_where(k, &dev, &stream) != 0 || arg_in(k, A_CONTEXT, 0, I4MAX, 0, &ctx) != 0 ||
        arg_in(k, A_CORR, 0, INT64_MAX, 0, &corr) != 0 ||
        arg_in(k, A_BYTES, 0, INT64_MAX, 0, &bytes) != 0 || arg_real(k, C_MEMBW, &bw) != 0) {
        return k->j.err;
    }
    parse_mem_name(evstr(k, e->name_off), e->name_len, &kind, &src, &dst);
    if (memset_) {
        Kprof__V1__Memsets *r = kp_batch_builder_table(k->out.bb, KP_EV_MEMSET);

        ROW(i, KP_EV_MEMSET);
        r->start_ns[i] = abs_ts(k);
        r->dur_ns[i] = (uint64_t) e->dur_ns;
        r->bytes[i] = (uint64_t) bytes;
        r->mem_kind[i] = src;
        r->device[i] = (uint32_t) dev;
        r->context[i] = (uint32_t) ctx;
        r->stream[i] = (uint32_t) stream;
        r->correlation[i] = (uint64_t) corr;
        r->external_id[i] = gpu_ext(k);
        r->bandwidth_gbps[i] = bw;
        row_added(k, KP_EV_MEMSET, r->start_ns[i]);
        k->meta->cats[KP_KINETO_GPU_MEMSET]++;
        return 0;
    }
    Kprof__V1__Memcpys *r = kp_batch_builder_table(k->out.bb, KP_EV_MEMCPY);

    ROW(i, KP_EV_MEMCPY);
    r->start_ns[i] = abs_ts(k);
    r->dur_ns[i] = (uint64_t) e->dur_ns;
    r->bytes[i] = (uint64_t) bytes;
    r->copy_kind[i] = kind;
    r->src_kind[i] = src;
    r->dst_kind[i] = dst;
    r->device[i] = (uint32_t) dev;
    r->context[i] = (uint32_t) ctx;
    r->stream[i] = (uint32_t) stream;
    r->correlation[i] = (uint64_t) corr;
    r->external_id[i] = gpu_ext(k);
    r->bandwidth_gbps[i] = bw;
    ARG(r->src_device[i], A_FROM_DEV, 0, I2MAX, 0);
    ARG(r->dst_device[i], A_TO_DEV, 0, I2MAX, 0);
    row_added(k, KP_EV_MEMCPY, r->start_ns[i]);
    k->meta->cats[KP_KINETO_GPU_MEMCPY]++;
    return 0;
}

static int map_sync(struct kp_kineto *k)
{
    static const char *const types[] = { "Unknown",     "Event Sync",   "Stream Wait Event",
                                         "Stream Sync", "Context Sync", NULL };
    struct ev *e = &k->e;
    Kprof__V1__Syncs *r = kp_batch_builder_table(k->out.bb, KP_EV_SYNC);
    int64_t dev, stream;
    long i;

    if (gpu_where(k, &dev, &stream) != 0) {
        return k->j.err;
    }
    ROW(i, KP_EV_SYNC);
    r->start_ns[i] = abs_ts(k);
    r->dur_ns[i] = (uint64_t) e->dur_ns;
    r->sync_type[i] = word_index(evstr(k, e->name_off), e->name_len, types);
    r->device[i] = (uint32_t) dev;
    r->stream[i] = (uint32_t) (stream >= 1000000 ? stream - 1000000 : stream);
    ARG(r->context[i], A_CONTEXT, 0, I4MAX, 0);
    ARG(r->correlation[i], A_CORR, 0, INT64_MAX, 0);
    ARG(r->cuda_event[i], A_EVENT_ID, 0, I4MAX, 0);
    row_added(k, KP_EV_SYNC, r->start_ns[i]);
    k->meta->cats[KP_KINETO_CUDA_SYNC]++;
    return 0;
}

static int map_memory(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    Kprof__V1__MemoryEvents *r = kp_batch_builder_table(k->out.bb, KP_EV_MEMORY);
    long i;

    cpu_seen(k);
    ROW(i, KP_EV_MEMORY);
    r->start_ns[i] = abs_ts(k);
    r->tid[i] = e->tid_num ? (uint64_t) e->tid : 0;
    IDX(r->name[i], name_idx(k));
    ARG(r->device[i], A_DEV_ID, -1, I2MAX, -1);
    ARG(r->device_type[i], A_DEV_TYPE, 0, I2MAX, 0);
    if (arg_in(k, A_MEM_BYTES, INT64_MIN, INT64_MAX, 0, &r->bytes[i]) != 0) {
        return k->j.err;
    }
    ARG(r->addr[i], A_ADDR, 0, INT64_MAX, 0);
    ARG(r->total_allocated[i], A_TOTAL_ALLOC, 0, INT64_MAX, 0);
    ARG(r->total_reserved[i], A_TOTAL_RES, 0, INT64_MAX, 0);
    row_added(k, KP_EV_MEMORY, r->start_ns[i]);
    k->meta->cats[KP_KINETO_MEMORY]++;
    return 0;
}

/* Counts a row that has no start time (counters) for the batch. */
static void row_added_untimed(struct kp_kineto *k, int kind)
{
    k->meta->rows[kind]++;
}

/* A cuda_profiler_range event: its counters rows and the row naming it (kp_kineto.h). */
static int map_range(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    static const char pfx[] = KP_KINETO_RANGE_NAME_PREFIX;
    Kprof__V1__Counters *r = kp_batch_builder_table(k->out.bb, KP_EV_COUNTER);
    long i;
    int64_t dev, stream, corr;
    uint64_t key, index = k->n_ranges;
    char *nm;
    int64_t idx;

    if (e->ctr_overflow) {
        return jr_fail(&k->j, "a cuda_profiler_range event has more than %d metrics",
                       KP_KINETO_MAX_COUNTERS);
    }
    if (gpu_where(k, &dev, &stream) != 0 ||
        arg_in(k, A_CORR, INT64_MIN, (int64_t) KP_KINETO_RANGE_ID_BASE - 1, 0, &corr) != 0) {
        return k->j.err;
    }
    key = corr > 0 ? (uint64_t) corr : KP_KINETO_RANGE_ID_BASE + index;
    if ((nm = malloc(sizeof(pfx) + e->name_len)) == NULL) {
        k->j.err = -ENOMEM;
        return k->j.err;
    }
    memcpy(nm, pfx, sizeof(pfx) - 1);
    memcpy(nm + sizeof(pfx) - 1, evstr(k, e->name_off), e->name_len);
    idx = intern_name(k, nm, sizeof(pfx) - 1 + e->name_len);
    free(nm);
    if (idx < 0) {
        k->j.err = (int) idx;
        return k->j.err;
    }
    ROW(i, KP_EV_COUNTER);
    r->metric[i] = (uint32_t) idx;
    r->value[i] = (double) index;
    r->correlation[i] = key;
    r->device[i] = (uint32_t) dev;
    row_added_untimed(k, KP_EV_COUNTER);
    for (uint32_t c = 0; c < e->n_ctr; c++) {
        ROW(i, KP_EV_COUNTER);
        IDX(r->metric[i], intern_name(k, evstr(k, e->ctr_off[c]), e->ctr_len[c]));
        r->value[i] = e->ctr_val[c];
        r->correlation[i] = key;
        r->device[i] = (uint32_t) dev;
        row_added_untimed(k, KP_EV_COUNTER);
    }
    k->n_ranges++;
    k->meta->cats[KP_KINETO_PROFILER_RANGE]++;
    return 0;
}

/* Maps the event just parsed (k->e). */
static int ev_finish(struct kp_kineto *k)
{
    struct ev *e = &k->e;
    char cat[32];
    enum map m;
    int rc = 0;

    size_t snap[KP_EV_COUNT];

    for (int kind = 0; kind < KP_EV_COUNT; kind++) {
        snap[kind] = kp_batch_builder_rows(k->out.bb, (enum kp_event_kind) kind);
    }

    if (e->ph == 0) {
        return jr_fail(&k->j, "the event has no \"ph\" (phase)");
    }
    lower_cat(k, cat, sizeof(cat));
    m = classify(cat);
    switch (e->ph) {
    case 'M':
        k->meta->cats[KP_KINETO_METADATA]++;
        return 0;
    case 's':
    case 'f':
    case 't':
        if (m == M_FLOW_AC2G || m == M_FLOW_FWDBWD) {
            if (!e->has_id) {
                return jr_fail(&k->j, "a flow event (cat %s) has no \"id\"", cat);
            }
            k->meta->cats[m == M_FLOW_AC2G ? KP_KINETO_FLOW_AC2G : KP_KINETO_FLOW_FWDBWD]++;
        }
        else {
            k->meta->cats[KP_KINETO_SKIPPED]++;
        }
        return 0;
    case 'i':
    case 'I':
        if (e->has_name &&
            ((e->name_len == 8 && memcmp(evstr(k, e->name_off), "[memory]", 8) == 0) ||
             (e->name_len == 13 && memcmp(evstr(k, e->name_off), "[OutOfMemory]", 13) == 0))) {
            if (!e->has_ts) {
                return jr_fail(&k->j, "a %s event has no \"ts\"", evstr(k, e->name_off));
            }
            rc = map_memory(k);
            break;
        }
        k->meta->cats[KP_KINETO_SKIPPED]++;
        return 0;
    case 'X':
        if (m == M_SKIP && strcmp(cat, "trace") == 0 && e->has_name && e->has_ts && e->has_dur &&
            e->name_len == 20 && memcmp(evstr(k, e->name_off), "PyTorch Profiler (0)", 20) == 0 &&
            (!k->meta->has_profiler_span || e->ts_ns >= k->meta->profiler_ts_ns)) {
            /* the profiler's span, kept for the GPU utilization timeline
             * (docs/specs/tbplugin-views.md §8); the plugin takes the last one in ts order */
            k->meta->has_profiler_span = true;
            k->meta->profiler_ts_ns = e->ts_ns;
            k->meta->profiler_dur_ns = e->dur_ns > 0 ? e->dur_ns : 0;
        }
        if (m == M_SKIP || m == M_FLOW_AC2G || m == M_FLOW_FWDBWD) {
            k->meta->cats[KP_KINETO_SKIPPED]++;
            return 0;
        }
        if (!e->has_name) {
            return jr_fail(&k->j, "a \"%s\" event has no \"name\"", cat);
        }
        if (!e->has_ts) {
            return jr_fail(&k->j, "a \"%s\" event has no \"ts\"", cat);
        }
        if (!e->has_dur) {
            return jr_fail(&k->j, "a \"%s\" complete event (ph X) has no \"dur\"", cat);
        }
        if (e->dur_ns < 0) {
            e->dur_ns = 0; /* kineto clamps negative durations too */
        }
        switch (m) {
        case M_CPU_OP:
        case M_USER_ANN:
        case M_GPU_ANN:
        case M_PY:
            rc = map_op(k, m);
            break;
        case M_RUNTIME:
        case M_DRIVER:
            rc = map_api(k, m);
            break;
        case M_KERNEL:
            rc = map_kernel(k);
            break;
        case M_MEMCPY:
            rc = map_memcpy(k, false);
            break;
        case M_MEMSET:
            rc = map_memcpy(k, true);
            break;
        case M_SYNC:
            rc = map_sync(k);
            break;
        case M_RANGE:
            rc = map_range(k);
            break;
        default:
            break;
        }
        break;
    default:
        k->meta->cats[KP_KINETO_SKIPPED]++;
        return 0;
    }
    if (rc != 0) {
        /* drop the rows of the event that failed half-way (--partial flushes the rest) */
        for (int kind = 0; kind < KP_EV_COUNT; kind++) {
            kp_batch_builder_truncate(k->out.bb, (enum kp_event_kind) kind, snap[kind]);
        }
        return rc;
    }
    if (batch_full(k)) {
        rc = spill_flush(&k->out);
    }
    return rc;
}

static int parse_event(struct kp_kineto *k)
{
    struct jr *j = &k->j;
    struct ev *e = &k->e;
    bool first, present;
    int rc;

    e->ph = 0;
    e->has_ts = e->has_dur = e->has_id = e->has_name = e->has_cat = false;
    e->pid_num = e->tid_num = false;
    e->have = 0;
    e->n_ctr = 0;
    e->ctr_overflow = false;
    kp_strbuf_reset(&k->evs);
    if (jr_ws(j) != '{') {
        return jr_fail(j, "an event must be an object, got %s", jr_what(jr_ws(j)));
    }
    if (jr_obj_begin(j, &first) != 0) {
        return j->err;
    }
    while ((rc = jr_obj_key(j, &first)) == 1) {
        const char *key = j->str;

        switch (j->slen) {
        case 2:
            if (strcmp(key, "ph") == 0) {
                int c = jr_ws(j);

                if (c != '"') {
                    return jr_fail(j, "\"ph\" must be a string, got %s", jr_what(c));
                }
                if (jr_string(j) != 0) {
                    return j->err;
                }
                if (j->slen != 1) {
                    return jr_fail(j, "\"ph\" must be one character, got \"%.20s\"", j->str);
                }
                e->ph = (unsigned char) j->str[0];
                continue;
            }
            if (strcmp(key, "ts") == 0) {
                if (parse_time(k, "\"ts\"", &e->ts_ns, &e->has_ts) != 0) {
                    return j->err;
                }
                continue;
            }
            if (strcmp(key, "id") == 0) {
                int64_t v;

                if (read_int(k, "\"id\"", &v, &present) != 0) {
                    return j->err;
                }
                e->has_id = true; /* ids may be strings in other producers' traces */
                continue;
            }
            break;
        case 3:
            if (strcmp(key, "cat") == 0) {
                if (read_str(k, "\"cat\"", &e->cat_off, &e->cat_len, &e->has_cat) != 0) {
                    return j->err;
                }
                continue;
            }
            if (strcmp(key, "dur") == 0) {
                if (parse_time(k, "\"dur\"", &e->dur_ns, &e->has_dur) != 0) {
                    return j->err;
                }
                continue;
            }
            if (strcmp(key, "pid") == 0) {
                if (parse_id(k, "\"pid\"", &e->pid, &e->pid_num) != 0) {
                    return j->err;
                }
                continue;
            }
            if (strcmp(key, "tid") == 0) {
                if (parse_id(k, "\"tid\"", &e->tid, &e->tid_num) != 0) {
                    return j->err;
                }
                continue;
            }
            break;
        case 4:
            if (strcmp(key, "name") == 0) {
                if (read_str(k, "\"name\"", &e->name_off, &e->name_len, &e->has_name) != 0) {
                    return j->err;
                }
                continue;
            }
            if (strcmp(key, "args") == 0) {
                if (parse_args(k) != 0) {
                    return j->err;
                }
                continue;
            }
            break;
        default:
            break;
        }
        if (jr_skip(j) != 0) {
            return j->err;
        }
    }
    if (rc != 0) {
        return rc;
    }
    return ev_finish(k);
}

static int parse_events(struct kp_kineto *k)
{
    struct jr *j = &k->j;
    bool first;
    int rc;

    if (jr_arr_begin(j, &first) != 0) {
        return j->err;
    }
    while ((rc = jr_arr_next(j, &first)) == 1) {
        j->event = (int64_t) k->ev_index;
        if (parse_event(k) != 0) {
            return j->err;
        }
        k->ev_index++;
        k->meta->events++;
        j->event = -1;
    }
    return rc;
}

static int parse_dist(struct kp_kineto *k)
{
    struct jr *j = &k->j;
    struct kp_strbuf sb;
    bool first, present;
    int rc, orc = 0, c = jr_ws(j);
    size_t n = 0;

    if (c == 'n') {
        return jr_literal(j, "null");
    }
    if (c != '{') {
        return jr_fail(j, "distributedInfo must be an object, got %s", jr_what(c));
    }
    if (jr_obj_begin(j, &first) != 0) {
        return j->err;
    }
    /* the object is kept as JSON text too (export writes it back) */
    kp_strbuf_init(&sb, 1u << 20);
    orc = kp_strbuf_putc(&sb, '{');
    while ((rc = jr_obj_key(j, &first)) == 1) {
        int64_t v = 0;

        if (n++ > 0) {
            orc = orc != 0 ? orc : kp_strbuf_append(&sb, ", ", 2);
        }
        orc = orc != 0 ? orc : kp_json_append(&sb, j->str, j->slen);
        orc = orc != 0 ? orc : kp_strbuf_append(&sb, ": ", 2);
        if (strcmp(j->str, "rank") == 0 || strcmp(j->str, "world_size") == 0) {
            bool is_rank = j->str[0] == 'r';

            if (read_int(k, is_rank ? "distributedInfo.rank" : "distributedInfo.world_size", &v,
                         &present) != 0) {
                kp_strbuf_fini(&sb);
                return j->err;
            }
            if (present && (v < 0 || v > (is_rank ? 65535 : 65536))) {
                kp_strbuf_fini(&sb);
                return jr_fail(j, "distributedInfo.%s = %" PRId64 " is out of range",
                               is_rank ? "rank" : "world_size", v);
            }
            if (present && is_rank) {
                k->meta->has_rank = true;
                k->meta->rank = (uint32_t) v;
            }
            else if (present) {
                k->meta->world_size = (uint32_t) v;
            }
            orc = orc != 0  ? orc
                  : present ? kp_strbuf_appendf(&sb, "%" PRId64, v)
                            : kp_strbuf_append_str(&sb, "null");
        }
        else if (jr_capture_as(j, &sb, true) != 0) {
            kp_strbuf_fini(&sb);
            return j->err == KP_ETOOBIG ? jr_fail(j, "distributedInfo is larger than 1 MiB")
                                        : j->err;
        }
    }
    orc = orc != 0 ? orc : kp_strbuf_putc(&sb, '}');
    k->meta->dist_json[0] = '\0';
    if (rc == 0 && orc == 0 && sb.len < sizeof(k->meta->dist_json) && sb.len <= k->max_name &&
        kp_utf8_valid(sb.data, sb.len)) {
        memcpy(k->meta->dist_json, sb.data, sb.len + 1);
    }
    kp_strbuf_fini(&sb);
    return rc;
}

static int parse_device(struct kp_kineto *k, struct kp_kineto_device *d)
{
    static const struct {
        const char *key;
        size_t off;
        bool u64;
    } f[] = {
        { "id", offsetof(struct kp_kineto_device, id), false },
        { "numSms", offsetof(struct kp_kineto_device, sm_count), false },
        { "computeMajor", offsetof(struct kp_kineto_device, cc_major), false },
        { "computeMinor", offsetof(struct kp_kineto_device, cc_minor), false },
        { "maxThreadsPerBlock", offsetof(struct kp_kineto_device, max_threads_per_block), false },
        { "maxThreadsPerMultiprocessor", offsetof(struct kp_kineto_device, max_threads_per_sm),
          false },
        { "regsPerBlock", offsetof(struct kp_kineto_device, regs_per_block), false },
        { "regsPerMultiprocessor", offsetof(struct kp_kineto_device, regs_per_sm), false },
        { "sharedMemPerBlock", offsetof(struct kp_kineto_device, smem_per_block), false },
        { "sharedMemPerMultiprocessor", offsetof(struct kp_kineto_device, smem_per_sm), false },
        { "warpSize", offsetof(struct kp_kineto_device, warp_size), false },
        { "totalGlobalMem", offsetof(struct kp_kineto_device, global_memory_bytes), true },
    };
    struct jr *j = &k->j;
    bool first, present;
    int rc;

    memset(d, 0, sizeof(*d));
    if (jr_ws(j) != '{') {
        return jr_fail(j, "a deviceProperties entry must be an object, got %s", jr_what(jr_ws(j)));
    }
    if (jr_obj_begin(j, &first) != 0) {
        return j->err;
    }
    while ((rc = jr_obj_key(j, &first)) == 1) {
        size_t i;

        if (strcmp(j->str, "name") == 0) {
            int c = jr_ws(j);

            if (c != '"') {
                return jr_fail(j, "deviceProperties[].name must be a string, got %s", jr_what(c));
            }
            if (jr_string(j) != 0) {
                return j->err;
            }
            size_t n = j->slen < sizeof(d->name) - 1 ? j->slen : sizeof(d->name) - 1;
            while (n > 0 && n < j->slen && ((unsigned char) j->str[n] & 0xc0) == 0x80) {
                n--;
            }
            memcpy(d->name, j->str, n);
            d->name[n] = '\0';
            if (!kp_utf8_valid(d->name, n)) {
                snprintf(d->name, sizeof(d->name), "unknown");
            }
            continue;
        }
        for (i = 0; i < sizeof(f) / sizeof(f[0]) && strcmp(j->str, f[i].key) != 0; i++) {
        }
        if (i == sizeof(f) / sizeof(f[0])) {
            if (jr_skip(j) != 0) {
                return j->err;
            }
            continue;
        }
        int64_t v = 0;
        char what[64];

        snprintf(what, sizeof(what), "deviceProperties[].%s", f[i].key);
        if (read_int(k, what, &v, &present) != 0) {
            return j->err;
        }
        if (!present) {
            continue;
        }
        if (v < 0 || v > (f[i].u64 ? INT64_MAX : (i == 0 ? I2MAX : I4MAX))) {
            return jr_fail(j, "%s = %" PRId64 " is out of range", what, v);
        }
        if (f[i].u64) {
            *(uint64_t *) ((char *) d + f[i].off) = (uint64_t) v;
        }
        else {
            *(uint32_t *) ((char *) d + f[i].off) = (uint32_t) v;
        }
    }
    return rc;
}

static int parse_devices(struct kp_kineto *k)
{
    struct jr *j = &k->j;
    bool first;
    int rc, c = jr_ws(j);

    if (c == 'n') {
        return jr_literal(j, "null");
    }
    if (c != '[') {
        return jr_fail(j, "deviceProperties must be an array, got %s", jr_what(c));
    }
    k->meta->n_devices = 0;
    if (jr_arr_begin(j, &first) != 0) {
        return j->err;
    }
    while ((rc = jr_arr_next(j, &first)) == 1) {
        struct kp_kineto_device d;

        if (parse_device(k, &d) != 0) {
            return j->err;
        }
        if (k->meta->n_devices < KP_KINETO_MAX_DEVICES) {
            k->meta->devices[k->meta->n_devices++] = d;
        }
    }
    return rc;
}

static int parse_top(struct kp_kineto *k)
{
    struct jr *j = &k->j;
    bool first, seen_events = false, present;
    int rc, c = jr_ws(j);

    if (c == '[') { /* a bare event array is a valid trace too */
        if (parse_events(k) != 0) {
            return j->err;
        }
    }
    else if (c == '{') {
        if (jr_obj_begin(j, &first) != 0) {
            return j->err;
        }
        while ((rc = jr_obj_key(j, &first)) == 1) {
            if (strcmp(j->str, "traceEvents") == 0) {
                c = jr_ws(j);
                if (c != '[') {
                    return jr_fail(j, "traceEvents must be an array, got %s", jr_what(c));
                }
                if (parse_events(k) != 0) {
                    return j->err;
                }
                seen_events = true;
            }
            else if (strcmp(j->str, "distributedInfo") == 0) {
                if (parse_dist(k) != 0) {
                    return j->err;
                }
            }
            else if (strcmp(j->str, "deviceProperties") == 0) {
                if (parse_devices(k) != 0) {
                    return j->err;
                }
            }
            else if (strcmp(j->str, "baseTimeNanoseconds") == 0) {
                int64_t v = 0;

                if (read_int(k, "baseTimeNanoseconds", &v, &present) != 0) {
                    return j->err;
                }
                if (present && v < 0) {
                    return jr_fail(j, "baseTimeNanoseconds = %" PRId64 " is negative", v);
                }
                k->meta->base_ns = present ? v : 0;
            }
            else if (strcmp(j->str, "host_name") == 0 || strcmp(j->str, "hostname") == 0) {
                uint32_t off, len;

                kp_strbuf_reset(&k->evs);
                if (read_str(k, "host_name", &off, &len, &present) != 0) {
                    return j->err;
                }
                if (present) {
                    size_t n = len < sizeof(k->meta->host) - 1 ? len : sizeof(k->meta->host) - 1;

                    memcpy(k->meta->host, evstr(k, off), n);
                    k->meta->host[n] = '\0';
                    if (!kp_utf8_valid(k->meta->host, n)) {
                        k->meta->host[0] = '\0';
                    }
                }
            }
            else if (jr_skip(j) != 0) {
                return j->err;
            }
        }
        if (rc != 0) {
            return rc;
        }
        if (!seen_events) {
            return jr_fail(j, "the trace has no \"traceEvents\" array (is this a Kineto trace?)");
        }
    }
    else {
        return jr_unexpected(j, c, "a trace: '{' or '['");
    }
    c = jr_ws(j);
    if (c != -1) {
        return c == -2 ? j->err
                       : jr_fail(j, "unexpected %s after the end of the trace", jr_what(c));
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points */

int kp_kineto_parse(kp_kineto_read_cb *read, void *read_ud, const struct kp_kineto_opts *opts,
                    kp_kineto_batch_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                    char *errbuf, size_t errlen)
{
    struct kp_kineto *k;
    int rc;

    if (read == NULL || opts == NULL || meta_out == NULL || (cb != NULL && opts->meta == NULL) ||
        (opts->spool != NULL && (cb != NULL || opts->meta != NULL || opts->spool->used))) {
        kp_errbuf_set(errbuf, errlen, "kp_kineto_parse: bad arguments");
        return -EINVAL;
    }
    if ((k = calloc(1, sizeof(*k))) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    memset(meta_out, 0, sizeof(*meta_out));
    meta_out->device = -1;
    meta_out->min_ns = INT64_MAX;
    meta_out->max_ns = INT64_MIN;
    k->opts = opts;
    k->meta = meta_out;
    k->out.opts = opts;
    k->out.meta = meta_out;
    k->out.j = &k->j;
    k->out.cb = cb;
    k->out.cb_ud = cb_ud;
    k->out.spool = opts->spool;
    if (k->out.spool != NULL) {
        k->out.spool->used = true;
    }
    k->max_name = opts->max_name_bytes ? opts->max_name_bytes : KP_CODEC_DEFAULT_MAX_NAME_BYTES;
    k->out.max_name = k->max_name;
    k->batch_rows = opts->batch_rows ? opts->batch_rows : KP_KINETO_DEFAULT_BATCH_ROWS;
    k->j.read = read;
    k->j.read_ud = read_ud;
    k->j.progress = opts->progress;
    k->j.progress_ud = opts->progress_ud;
    k->j.line = 1;
    k->j.event = -1;
    k->j.smax =
        opts->max_string_bytes ? opts->max_string_bytes : KP_KINETO_DEFAULT_MAX_STRING_BYTES;
    k->j.max_depth = opts->max_depth ? opts->max_depth : KP_KINETO_DEFAULT_MAX_DEPTH;
    k->j.errbuf = errbuf;
    k->j.errlen = errlen;
    kp_strbuf_init(&k->evs, EV_MAX_BYTES);
    if ((k->j.buf = malloc(JR_CHUNK)) == NULL ||
        (rc = kp_batch_builder_create(KP_BB_AUTO, import_cols,
                                      sizeof(import_cols) / sizeof(import_cols[0]), &k->out.bb)) !=
            0) {
        rc = -ENOMEM;
        kp_errbuf_set(errbuf, errlen, "out of memory");
        goto out;
    }
    rc = parse_top(k);
    if (rc == 0 && (kp_batch_builder_total(k->out.bb) > 0 || !k->out.sent_first)) {
        rc = spill_flush(&k->out);
    }
    else if (rc == KP_EPROTO && opts->partial && cb != NULL &&
             kp_batch_builder_total(k->out.bb) > 0) {
        /* --partial: send what was read before the error, keep the error's message */
        char saved[1024];

        snprintf(saved, sizeof(saved), "%s", errbuf != NULL ? errbuf : "");
        k->j.err = 0;
        k->j.errbuf = NULL;
        k->j.errlen = 0;
        if (spill_flush(&k->out) != 0) {
            kp_errbuf_set(errbuf, errlen, "%s (and the rows before it could not be sent)", saved);
        }
        else {
            kp_errbuf_set(errbuf, errlen, "%s", saved);
        }
    }
    if (rc == -ENOMEM && k->j.err == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
    }
    meta_out->json_bytes = k->j.off + k->j.pos;
    if (meta_out->min_ns == INT64_MAX) {
        meta_out->min_ns = meta_out->max_ns = 0;
    }
out:
    if (k->out.spool != NULL) {
        if (rc == 0) {
            spool_seal(k->out.spool);
        }
        else {
            spool_drop(k->out.spool);
        }
    }
    free(k->j.buf);
    free(k->j.str);
    kp_strbuf_fini(&k->evs);
    kp_batch_builder_destroy(k->out.bb);
    free(k);
    return rc;
}

struct mem_src {
    const unsigned char *p;
    size_t len, pos;
};

static ssize_t mem_read(void *ud, void *buf, size_t len, char *errbuf, size_t errlen)
{
    struct mem_src *m = ud;
    size_t n = m->len - m->pos < len ? m->len - m->pos : len;

    memcpy(buf, m->p + m->pos, n);
    m->pos += n;
    return (ssize_t) n;
}

int kp_kineto_parse_mem(const void *data, size_t len, const struct kp_kineto_opts *opts,
                        kp_kineto_batch_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                        char *errbuf, size_t errlen)
{
    struct mem_src m = { data, len, 0 };

    return kp_kineto_parse(mem_read, &m, opts, cb, cb_ud, meta_out, errbuf, errlen);
}

struct gz_src {
    gzFile gz;
    const struct kp_kineto_opts *opts;
};

static ssize_t gz_read_cb(void *ud, void *buf, size_t len, char *errbuf, size_t errlen)
{
    struct gz_src *g = ud;
    int n = gzread(g->gz, buf, (unsigned) len), zerr;

    if (n < 0) {
        const char *msg = gzerror(g->gz, &zerr);

        kp_errbuf_set(errbuf, errlen,
                      "gzip: %s (near compressed byte %lld); the file is corrupt or truncated",
                      msg != NULL ? msg : "read error", (long long) gzoffset(g->gz));
        return zerr == Z_ERRNO ? -EIO : KP_EPROTO;
    }
    if (n == 0 && (gzerror(g->gz, &zerr), zerr != Z_OK)) {
        kp_errbuf_set(
            errbuf, errlen,
            "gzip: the compressed stream ends early (near compressed byte %lld): the file is truncated",
            (long long) gzoffset(g->gz));
        return KP_EPROTO;
    }
    if (g->opts->spool != NULL) {
        g->opts->spool->in_bytes = (uint64_t) gzoffset(g->gz);
    }
    if (g->opts->progress != NULL) {
        g->opts->progress((uint64_t) gzoffset(g->gz), g->opts->progress_ud);
    }
    return n;
}

int kp_kineto_parse_file(const char *path, const struct kp_kineto_opts *opts,
                         kp_kineto_batch_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                         char *errbuf, size_t errlen)
{
    struct gz_src g = { NULL, opts };
    char inner[768];
    int rc;

    errno = 0;
    if ((g.gz = gzopen(path, "rb")) == NULL) {
        rc = errno ? -errno : -ENOMEM;
        kp_errbuf_set(errbuf, errlen, "%s: cannot open: %s", path, strerror(-rc));
        return rc;
    }
    gzbuffer(g.gz, 256 * 1024);
    inner[0] = '\0';
    rc = kp_kineto_parse(gz_read_cb, &g, opts, cb, cb_ud, meta_out, inner, sizeof(inner));
    if (rc != 0) {
        kp_errbuf_set(errbuf, errlen, "%s: %s", path, inner[0] ? inner : kp_strerror(rc));
    }
    gzclose(g.gz);
    return rc;
}

long kp_kineto_rank_from_name(const char *path)
{
    const char *base = strrchr(path, '/');
    long found = -1;

    base = base != NULL ? base + 1 : path;
    for (const char *p = base; *p != '\0'; p++) {
        static const char *const pfx[] = { "rank", "worker" };

        for (size_t i = 0; i < 2; i++) {
            size_t n = strlen(pfx[i]);

            if (strncasecmp(p, pfx[i], n) == 0) {
                const char *q = p + n;
                long v = 0;

                if (*q == '-' || *q == '_' || *q == '.') {
                    q++;
                }
                if (*q < '0' || *q > '9') {
                    continue;
                }
                for (; *q >= '0' && *q <= '9' && v < 1000000; q++) {
                    v = v * 10 + (*q - '0');
                }
                found = v;
            }
        }
    }
    return found;
}
