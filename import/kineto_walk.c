/*
 * The Kineto importer's trace walker (kp_kineto.c says how the importer is cut): reads the
 * top-level object (or a bare event array) — traceEvents, distributedInfo, deviceProperties,
 * baseTimeNanoseconds, host_name — and parses each traceEvents entry into k->e, the envelope
 * plus every args key the mapping uses, then hands it to kp__kineto_ev_finish (kp_kineto.c).
 * Also the trace's sources: memory and a (gzip-compressed or plain) file.
 */
#include "kp_kineto.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "jr.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_kineto_int.h"
#include "kp_strbuf.h"
#include "spill.h"

/* ------------------------------------------------------------------------------------------ */
/* The trace walker */

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

const char *kp__kineto_arg_key(int id)
{
    for (size_t i = 0; i < N_ARG_KEYS; i++) {
        if (arg_keys[i].id == id) {
            return arg_keys[i].key;
        }
    }
    return "?";
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
    return kp__kineto_ev_finish(k);
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

int kp__kineto_walk(struct kp_kineto *k)
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
/* The trace's sources */

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
