/*
 * Fuzz target: what kprof-agent does with the bytes a local process sends it (a buggy or
 * hostile peer): kp_wire_check on each message, then the dispatch of one library session
 * with a capture armed (agent/session.c on_message): STRINGS into a bounded id -> text table,
 * STATUS counters, STEP, WINDOW_BEGIN/END and RECORDS into a kp_batcher with small batches. Every
 * batch the batcher emits is unpacked and checked with kp_batch_validate; an invalid one, a
 * row count that does not match, or stats.invalid > 0 at the end abort()s.
 *
 * Input:
 *  - first byte 0x00 (canned mode): byte 1 picks the batcher's options (below); the rest is a
 *    script of edits applied to a canned, valid conversation (STATUS, STRINGS, warm-up STEP
 *    and records, WINDOW_BEGIN, STEPs, RECORDS of every kind, WINDOW_END), which is then
 *    played: overwrite a byte, write an extreme 32/64-bit value into a payload field, delete,
 *    duplicate or swap messages, insert raw bytes as a message, or insert a batch_ms tick.
 *    This reaches the deep paths (joins, pending list, cuts) with hostile field values.
 *  - any other first byte (raw mode): the input is a sequence of messages, each a 2-byte
 *    little-endian length and that many bytes, played against a step-window capture.
 * The end of the input is the end of the connection (window_end(NULL), as on a disconnect).
 *
 * With -DKP_FUZZ_WIRE_REPLAY (the ctest replay build, fuzz_main.c), the first call also plays
 * a deterministic set of generated canned-mode scripts, since the replay's own seeds are
 * protobuf batches and would only exercise the raw mode's framing checks.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "kp_codec.h"
#include "kp_log.h"
#include "kp_wire.h"
#include "kprof.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define T0          1700000000000000000LL
#define CAPTURE_ID  1
#define MAX_MSGS    256
#define MAX_STR_ID  4096
#define MAX_STR_ALL (1u << 20)
#define TICK        0xffff /* a pseudo message: kp_batcher_tick */

/* --- the session: strings table and batcher --- */

struct fz_str {
    char *text;
    size_t len;
};

struct fz_session {
    struct fz_str strs[MAX_STR_ID];
    size_t str_bytes;
    struct kp_batcher *bat;
    bool closed;
    bool fail_emit; /* refuse every third batch (spool full) */
    unsigned emits;
};

static const struct kp_batch_limits limits = {
    KP_CODEC_DEFAULT_MAX_NAME_BYTES,
    KP_CODEC_DEFAULT_MAX_STRINGS,
    KP_CODEC_DEFAULT_MAX_ROWS,
};

static const char *fz_string(void *ud, uint32_t id, size_t *len)
{
    struct fz_session *s = ud;

    if (id >= MAX_STR_ID || s->strs[id].text == NULL) {
        return NULL;
    }
    *len = s->strs[id].len;
    return s->strs[id].text;
}

static int fz_emit(void *ud, const uint8_t *buf, size_t len, size_t rows, bool last)
{
    struct fz_session *s = ud;
    Kprof__V1__Batch *b = kprof__v1__batch__unpack(NULL, len, buf);
    char err[512];

    (void) last;
    if (b == NULL) {
        fprintf(stderr, "fuzz_wire: the batcher emitted %zu bytes that do not unpack\n", len);
        abort();
    }
    if (kp_batch_validate(b, &limits, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_wire: the batcher emitted an invalid batch: %s\n", err);
        abort();
    }
    if (kp_batch_total_rows(b) != rows) {
        fprintf(stderr, "fuzz_wire: batch has %zu rows, the batcher said %zu\n",
                kp_batch_total_rows(b), rows);
        abort();
    }
    kprof__v1__batch__free_unpacked(b, NULL);
    return s->fail_emit && ++s->emits % 3 == 0 ? -ENOSPC : 0;
}

static void fz_end(struct fz_session *s, const struct kp_wire_window *w)
{
    struct kp_batcher_stats st;

    if (s->bat == NULL) {
        return;
    }
    kp_batcher_window_end(s->bat, w);
    kp_batcher_get_stats(s->bat, &st);
    if (st.invalid > 0 || st.pending > 0) {
        fprintf(stderr, "fuzz_wire: invalid=%llu pending=%llu after the window's end\n",
                (unsigned long long) st.invalid, (unsigned long long) st.pending);
        abort();
    }
    kp_batcher_destroy(s->bat);
    s->bat = NULL;
}

static int fz_open(struct fz_session *s, uint8_t opt)
{
    struct kp_batcher_opts o;
    static const uint32_t acts[4] = { 0, KP_ACT_KERNEL | KP_ACT_MEMCPY, KP_ACT_DEFAULT,
                                      KP_ACT_RUNTIME | KP_ACT_KERNEL };

    memset(s, 0, sizeof(*s));
    memset(&o, 0, sizeof(o));
    o.run_id = 5;
    o.rank = 1;
    o.job = "fuzz";
    o.host = "node";
    o.pid = 100;
    o.world_size = 2;
    o.device = 0;
    o.target_step = (opt & 1) ? -1 : 10;
    o.n_steps = (opt & 1) ? 0 : 2;
    o.activities = acts[(opt >> 1) & 3];
    o.batch_rows = 1 + ((opt >> 3) & 7);
    o.batch_ms = 1;
    o.max_pending = (opt & 0x80) ? 4 : 64;
    o.max_corr = (opt & 0x80) ? 4 : 64;
    o.strings = fz_string;
    o.emit = fz_emit;
    o.ud = s;
    s->fail_emit = (opt & 0x40) != 0;
    return kp_batcher_create(&o, &s->bat);
}

static void fz_close(struct fz_session *s)
{
    if (s->closed) {
        return;
    }
    fz_end(s, NULL); /* the process is gone: keep what was decided */
    for (size_t i = 0; i < MAX_STR_ID; i++) {
        free(s->strs[i].text);
        s->strs[i].text = NULL;
    }
    s->closed = true;
}

/* agent.c session_strings, with a table bounded by id and total bytes. */
static void fz_strings(struct fz_session *s, const uint8_t *p, uint32_t count)
{
    size_t off = 0;

    for (uint32_t i = 0; i < count; i++) {
        uint32_t e[2];
        const char *text;
        char *t;

        memcpy(e, p + off, sizeof(e));
        off += sizeof(e);
        text = (const char *) p + off;
        off += ((size_t) e[1] + 3u) & ~(size_t) 3u;
        if (e[0] >= MAX_STR_ID || s->str_bytes + e[1] > MAX_STR_ALL) {
            if (s->bat != NULL) {
                kp_batcher_add_dropped(s->bat, 1);
            }
            continue;
        }
        if ((t = malloc((size_t) e[1] + 1)) == NULL) {
            continue;
        }
        memcpy(t, text, e[1]);
        t[e[1]] = '\0';
        if (s->strs[e[0]].text != NULL) {
            s->str_bytes -= s->strs[e[0]].len;
            free(s->strs[e[0]].text);
        }
        s->strs[e[0]].text = t;
        s->strs[e[0]].len = e[1];
        s->str_bytes += e[1];
    }
}

/* agent/session.c on_message for a registered library session whose capture CAPTURE_ID is armed. */
static void fz_message(struct fz_session *s, const uint8_t *msg, size_t n)
{
    struct kp_wire_hdr h;
    const uint8_t *p = msg + sizeof(h);

    if (s->closed) {
        return;
    }
    if (kp_wire_check(msg, n, NULL) != 0) {
        fz_close(s); /* a malformed message closes the connection */
        return;
    }
    memcpy(&h, msg, sizeof(h));
    switch (h.type) {
    case KP_W_HELLO:       /* a second HELLO */
    case KP_W_CTL_REQUEST: /* the retired local control plane */
        fz_close(s);
        return;
    case KP_W_STATUS: {
        struct kp_wire_status st;

        memcpy(&st, p, sizeof(st));
        if (st.capture_id == CAPTURE_ID && s->bat != NULL) {
            kp_batcher_counters(s->bat, st.dropped, st.cupti_dropped, st.overhead_ns);
        }
        return;
    }
    case KP_W_STRINGS:
        fz_strings(s, p, h.count);
        return;
    case KP_W_RECORDS: {
        struct kp_wire_records rh;

        memcpy(&rh, p, sizeof(rh));
        if (s->bat != NULL) {
            kp_batcher_records(s->bat, rh.kind, rh.rec_size, p + sizeof(rh), h.count);
        }
        return;
    }
    case KP_W_STEP: {
        struct kp_wire_step st;

        memcpy(&st, p, sizeof(st));
        if (s->bat != NULL) {
            kp_batcher_step(s->bat, &st);
        }
        return;
    }
    case KP_W_WINDOW_BEGIN:
    case KP_W_WINDOW_END: {
        struct kp_wire_window w;

        memcpy(&w, p, sizeof(w));
        if (w.capture_id != CAPTURE_ID || s->bat == NULL) {
            return;
        }
        if (h.type == KP_W_WINDOW_BEGIN) {
            kp_batcher_window_begin(s->bat, &w);
        }
        else {
            fz_end(s, &w);
        }
        return;
    }
    default:
        return; /* unknown or agent-bound types: ignored */
    }
}

/* --- the canned conversation --- */

struct msgs {
    uint8_t *p[MAX_MSGS];
    size_t n[MAX_MSGS];
    size_t count;
};

static void msgs_free(struct msgs *m)
{
    for (size_t i = 0; i < m->count; i++) {
        free(m->p[i]);
    }
    m->count = 0;
}

/* Inserts a copy of a message (hdr and payload given separately; payload may be NULL). */
static void msgs_insert(struct msgs *m, size_t at, const void *a, size_t na, const void *b,
                        size_t nb)
{
    uint8_t *p;

    if (m->count >= MAX_MSGS || (p = malloc(na + nb ? na + nb : 1)) == NULL) {
        return;
    }
    if (na) {
        memcpy(p, a, na);
    }
    if (nb) {
        memcpy(p + na, b, nb);
    }
    if (at > m->count) {
        at = m->count;
    }
    memmove(&m->p[at + 1], &m->p[at], (m->count - at) * sizeof(m->p[0]));
    memmove(&m->n[at + 1], &m->n[at], (m->count - at) * sizeof(m->n[0]));
    m->p[at] = p;
    m->n[at] = na + nb;
    m->count++;
}

static void add(struct msgs *m, enum kp_wire_type type, const void *payload, size_t len,
                uint32_t count)
{
    struct kp_wire_hdr h;

    kp_wire_hdr_init(&h, type, (uint32_t) len, count);
    msgs_insert(m, m->count, &h, sizeof(h), payload, len);
}

static void add_records(struct msgs *m, uint32_t kind, const void *recs, uint32_t count)
{
    uint8_t buf[2048];
    struct kp_wire_records rh = { kind, (uint32_t) kp_wire_rec_size(kind) };
    size_t len = sizeof(rh) + (size_t) count * rh.rec_size;

    memcpy(buf, &rh, sizeof(rh));
    memcpy(buf + sizeof(rh), recs, (size_t) count * rh.rec_size);
    add(m, KP_W_RECORDS, buf, len, count);
}

static void add_step(struct msgs *m, int64_t step, int64_t t)
{
    struct kp_wire_step s = { step, T0 + t, KP_STEP_HOOK, 0 };

    add(m, KP_W_STEP, &s, sizeof(s), 0);
}

static void add_window(struct msgs *m, bool end, int64_t t0, int64_t t1)
{
    struct kp_wire_window w;

    memset(&w, 0, sizeof(w));
    w.capture_id = CAPTURE_ID;
    w.run_id = 5;
    w.start_ns = T0 + t0;
    w.end_ns = end ? T0 + t1 : 0;
    w.first_step = 10;
    w.last_step = end ? 11 : -1;
    w.records = 40;
    w.dropped = end ? 2 : 0;
    w.cupti_dropped = end ? 1 : 0;
    w.overhead_ns = end ? 1000 : 0;
    add(m, end ? KP_W_WINDOW_END : KP_W_WINDOW_BEGIN, &w, sizeof(w), 0);
}

static void add_status(struct msgs *m, uint64_t dropped)
{
    struct kp_wire_status st;

    memset(&st, 0, sizeof(st));
    st.capture_id = CAPTURE_ID;
    st.state = KP_ST_CAPTURING;
    st.dropped = dropped;
    st.cupti_dropped = dropped / 2;
    st.overhead_ns = dropped * 100;
    add(m, KP_W_STATUS, &st, sizeof(st), 0);
}

static void add_strings(struct msgs *m)
{
    static const char *const s[] = { "volta_sgemm_128x64_nn", "cudaLaunchKernel", "aten::mm",
                                     "[[2, 3], [3, 4]]",      "my_domain",        "cudaMemcpyAsync",
                                     "\xc3\xa9t\xc3\xa9" };
    uint8_t buf[512];
    size_t off = 0;
    uint32_t n = sizeof(s) / sizeof(s[0]);

    for (uint32_t i = 0; i < n; i++) {
        uint32_t e[2] = { i + 1, (uint32_t) strlen(s[i]) };
        size_t padded = (e[1] + 3u) & ~3u;

        memcpy(buf + off, e, sizeof(e));
        off += sizeof(e);
        memset(buf + off, 0, padded);
        memcpy(buf + off, s[i], e[1]);
        off += padded;
    }
    add(m, KP_W_STRINGS, buf, off, n);
}

/* Id 8: a name longer than a batch string may be, with a 2-byte character across the cut. */
static void add_long_string(struct msgs *m)
{
    static uint8_t buf[8 + KP_CODEC_DEFAULT_MAX_NAME_BYTES + 4];
    uint32_t e[2] = { 8, KP_CODEC_DEFAULT_MAX_NAME_BYTES + 4 };

    memcpy(buf, e, sizeof(e));
    memset(buf + 8, 'a', e[1]);
    buf[8 + KP_CODEC_DEFAULT_MAX_NAME_BYTES - 1] = 0xc3;
    buf[8 + KP_CODEC_DEFAULT_MAX_NAME_BYTES] = 0xa9;
    add(m, KP_W_STRINGS, buf, sizeof(buf), 1);
}

/* Records of every kind around t (ns after T0); corr is the first correlation id. */
static void add_all_kinds(struct msgs *m, int64_t t, uint64_t corr)
{
    struct kp_wire_api a[3];
    struct kp_wire_kernel k[3];
    struct kp_wire_memcpy c[2];
    struct kp_wire_memset s[1];
    struct kp_wire_sync y[2];
    struct kp_wire_range r[3];

    memset(a, 0, sizeof(a));
    memset(k, 0, sizeof(k));
    memset(c, 0, sizeof(c));
    memset(s, 0, sizeof(s));
    memset(y, 0, sizeof(y));
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 3; i++) {
        /* kernel i+1 comes before its API record; kernel 0's API record never comes */
        k[i].start_ns = T0 + t + 100 + i * 30;
        k[i].end_ns = k[i].start_ns + 20;
        k[i].correlation = corr + (uint64_t) i;
        k[i].name = i == 1 ? 8 : 1;
        k[i].device = 0;
        k[i].context = 1;
        k[i].stream = 7;
        k[i].grid_x = 128;
        k[i].grid_y = k[i].grid_z = 1;
        k[i].block_x = 256;
        k[i].block_y = k[i].block_z = 1;
        k[i].registers = 64;
        k[i].static_smem = 1024;
        k[i].graph_id = (uint32_t) i;
        k[i].graph_node_id = (uint64_t) i;
    }
    add_records(m, KP_REC_KERNEL, k, 3);
    for (int i = 0; i < 3; i++) {
        a[i].start_ns = T0 + t + 10 + i * 10;
        a[i].end_ns = a[i].start_ns + 5;
        a[i].correlation = corr + 1 + (uint64_t) i;
        a[i].external_id = i == 0 ? 900 + (uint64_t) t : 0;
        a[i].tid = 4242;
        a[i].domain = i == 2 ? 3 : 1; /* an overhead record */
        a[i].cbid = 211;
        a[i].name = 2;
        a[i].return_value = i == 1 ? -1 : 0;
    }
    add_records(m, KP_REC_API, a, 3);
    for (int i = 0; i < 2; i++) {
        c[i].start_ns = T0 + t + 200 + i * 20;
        c[i].end_ns = c[i].start_ns + 10;
        c[i].bytes = 1 << 20;
        c[i].correlation = corr + 2 + (uint64_t) i;
        c[i].copy_kind = 1;
        c[i].src_kind = 1;
        c[i].dst_kind = 3;
        c[i].device = 0;
        c[i].context = 1;
        c[i].stream = 7;
        c[i].src_device = 0;
        c[i].dst_device = (uint32_t) i;
    }
    add_records(m, KP_REC_MEMCPY, c, 2);
    s[0].start_ns = T0 + t + 260;
    s[0].end_ns = s[0].start_ns + 4;
    s[0].bytes = 4096;
    s[0].correlation = corr + 3;
    s[0].value = 0;
    s[0].mem_kind = 3;
    s[0].stream = 7;
    add_records(m, KP_REC_MEMSET, s, 1);
    for (int i = 0; i < 2; i++) {
        y[i].start_ns = T0 + t + 300 + i * 40;
        y[i].end_ns = y[i].start_ns + 30;
        y[i].correlation = corr + 10 + (uint64_t) i;
        y[i].sync_type = 1 + (uint32_t) i;
        y[i].device = 0;
        y[i].context = 1;
        y[i].stream = i == 0 ? 7 : 0;
        y[i].cuda_event = i == 0 ? 0 : 12;
    }
    add_records(m, KP_REC_SYNC, y, 2);
    for (int i = 0; i < 3; i++) {
        r[i].start_ns = T0 + t + 5 + i * 2;
        r[i].end_ns = T0 + t + 400 - i * 2;
        r[i].range_id = 900 + (uint64_t) t + (uint64_t) i;
        r[i].parent_id = i == 0 ? 0 : r[i].range_id - 1;
        r[i].tid = 4242;
        r[i].seq = i == 1 ? 17 : -1;
        r[i].op_id = -1;
        r[i].name = 3;
        r[i].domain = i == 2 ? 5 : 0;
        r[i].shapes = i == 0 ? 4 : 0;
        r[i].kind = i == 2 ? 5 : 1;
        r[i].flags = i == 2 ? KP_RANGE_UNCLOSED : 0;
    }
    add_records(m, KP_REC_RANGE, r, 3);
}

static void canned(struct msgs *m)
{
    add_status(m, 0);
    add_strings(m);
    add_long_string(m);
    add_step(m, 9, 0); /* warm-up */
    add_all_kinds(m, 100, 1);
    add_window(m, false, 1000, 0);
    add_step(m, 10, 1000);
    add_all_kinds(m, 1000, 100);
    add_status(m, 5);
    add_step(m, 11, 2000);
    add_all_kinds(m, 2100, 200);
    add_step(m, 12, 3000); /* the step after the window */
    add_all_kinds(m, 3000, 300);
    add_window(m, true, 1000, 3000);
}

/* --- the script --- */

struct reader {
    const uint8_t *p;
    size_t n;
};

static bool rd(struct reader *r, void *out, size_t n)
{
    if (r->n < n) {
        return false;
    }
    memcpy(out, r->p, n);
    r->p += n;
    r->n -= n;
    return true;
}

static void apply_script(struct msgs *m, struct reader *r)
{
    static const uint32_t v32[] = { 0,       1,          0x7fff,     0x8000,     0xffff,
                                    0x10000, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff };
    static const uint64_t v64[] = { 0,
                                    1,
                                    INT64_MAX,
                                    INT64_MAX - 1,
                                    (uint64_t) 1 << 63,
                                    UINT64_MAX,
                                    (uint64_t) -1000,
                                    (uint64_t) T0,
                                    (uint64_t) T0 + 5000,
                                    (uint64_t) 1 << 40,
                                    (uint64_t) T0 - 1,
                                    0x7fffffff };
    uint8_t op, i, j, v;
    uint16_t off;

    while (rd(r, &op, 1)) {
        if (m->count == 0 && op % 8 != 6) {
            continue;
        }
        switch (op % 8) {
        case 0: /* overwrite a byte anywhere (headers too) */
            if (!rd(r, &i, 1) || !rd(r, &off, 2) || !rd(r, &v, 1)) {
                return;
            }
            i %= m->count;
            m->p[i][off % m->n[i]] = v;
            break;
        case 1:   /* an extreme 32-bit value into a 4-aligned payload field */
        case 2: { /* an extreme 64-bit value into an 8-aligned payload field */
            size_t w = op % 8 == 1 ? 4 : 8, slots;

            if (!rd(r, &i, 1) || !rd(r, &off, 2) || !rd(r, &v, 1)) {
                return;
            }
            i %= m->count;
            if (m->n[i] < sizeof(struct kp_wire_hdr) + w) {
                break;
            }
            slots = (m->n[i] - sizeof(struct kp_wire_hdr)) / w;
            off = (uint16_t) (sizeof(struct kp_wire_hdr) + (off % slots) * w);
            if (w == 4) {
                memcpy(m->p[i] + off, &v32[v % (sizeof(v32) / sizeof(v32[0]))], 4);
            }
            else {
                memcpy(m->p[i] + off, &v64[v % (sizeof(v64) / sizeof(v64[0]))], 8);
            }
            break;
        }
        case 3: /* delete */
            if (!rd(r, &i, 1)) {
                return;
            }
            i %= m->count;
            free(m->p[i]);
            memmove(&m->p[i], &m->p[i + 1], (m->count - i - 1) * sizeof(m->p[0]));
            memmove(&m->n[i], &m->n[i + 1], (m->count - i - 1) * sizeof(m->n[0]));
            m->count--;
            break;
        case 4: /* duplicate message i before j */
            if (!rd(r, &i, 1) || !rd(r, &j, 1)) {
                return;
            }
            i %= m->count;
            msgs_insert(m, j % (m->count + 1), m->p[i], m->n[i], NULL, 0);
            break;
        case 5: { /* swap */
            uint8_t *tp;
            size_t tn;

            if (!rd(r, &i, 1) || !rd(r, &j, 1)) {
                return;
            }
            i %= m->count;
            j %= m->count;
            tp = m->p[i];
            tn = m->n[i];
            m->p[i] = m->p[j];
            m->n[i] = m->n[j];
            m->p[j] = tp;
            m->n[j] = tn;
            break;
        }
        case 6: { /* raw bytes as a message before j: a fixed header, the payload from input */
            struct kp_wire_hdr h;
            uint8_t type, cnt;
            uint16_t len;

            if (!rd(r, &j, 1) || !rd(r, &type, 1) || !rd(r, &cnt, 1) || !rd(r, &len, 2)) {
                return;
            }
            if (len > r->n) {
                len = (uint16_t) r->n;
            }
            kp_wire_hdr_init(&h, (enum kp_wire_type)(type % 12), len, cnt);
            msgs_insert(m, j % (m->count + 1), &h, sizeof(h), r->p, len);
            r->p += len;
            r->n -= len;
            break;
        }
        default: { /* a batch_ms tick before j */
            struct kp_wire_hdr h;

            if (!rd(r, &j, 1)) {
                return;
            }
            memset(&h, 0, sizeof(h));
            h.type = TICK;
            msgs_insert(m, j % (m->count + 1), &h, sizeof(h), NULL, 0);
            break;
        }
        }
    }
}

static void play(struct fz_session *s, const struct msgs *m)
{
    for (size_t i = 0; i < m->count && !s->closed; i++) {
        struct kp_wire_hdr h;

        if (m->n[i] < sizeof(h)) {
            fz_message(s, m->p[i], m->n[i]);
            continue;
        }
        memcpy(&h, m->p[i], sizeof(h));
        if (h.magic == 0 && h.type == TICK && m->n[i] == sizeof(h)) {
            if (s->bat != NULL) {
                kp_batcher_tick(s->bat, 1LL << 62);
            }
            continue;
        }
        fz_message(s, m->p[i], m->n[i]);
    }
}

static void run_canned(const uint8_t *data, size_t size)
{
    static struct fz_session s;
    struct msgs m;
    struct reader r = { data, size };
    uint8_t opt = 0;

    rd(&r, &opt, 1);
    if (fz_open(&s, opt) != 0) {
        abort();
    }
    m.count = 0;
    canned(&m);
    apply_script(&m, &r);
    play(&s, &m);
    msgs_free(&m);
    fz_close(&s);
}

static void run_raw(const uint8_t *data, size_t size)
{
    static struct fz_session s;
    struct reader r = { data, size };
    uint16_t len;

    if (fz_open(&s, 0x10) != 0) {
        abort();
    }
    while (!s.closed && rd(&r, &len, 2)) {
        if (len > r.n) {
            len = (uint16_t) r.n;
        }
        fz_message(&s, r.p, len);
        r.p += len;
        r.n -= len;
    }
    fz_close(&s);
}

#ifdef KP_FUZZ_WIRE_REPLAY
/* Deterministic canned-mode scripts for the ctest replay (see the top of the file). */
static void self_seed(void)
{
    uint64_t x = 0x853c49e6748fea9bull;
    uint8_t buf[96];

    for (int iter = 0; iter < 6000; iter++) {
        size_t n = 2 + (size_t) (iter % 48) * 2;

        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = (uint8_t) x;
        }
        buf[0] = 0;
        buf[1] = (uint8_t) iter;
        if (iter < 256) {
            n = 2; /* the unmutated conversation under every option byte */
        }
        run_canned(buf + 1, n - 1);
    }
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool init;

    if (!init) {
        init = true;
        kp_log_set_level(KP_LOG_ERROR); /* malformed records log at warn */
#ifdef KP_FUZZ_WIRE_REPLAY
        self_seed();
#endif
    }
    if (size == 0) {
        return 0;
    }
    if (data[0] == 0x00) {
        run_canned(data + 1, size - 1);
    }
    else {
        run_raw(data, size);
    }
    return 0;
}
