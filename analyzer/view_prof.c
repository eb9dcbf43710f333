/* The Prof view (Analyzer.Prof, and Analyzer.ProfRows in pages): PyProf's per-kernel table of
 * one rank (pyprof.h, view.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "kp_err.h"
#include "kp_log.h"
#include "kprof.pb-c.h"
#include "pyprof.h"
#include "view.h"

struct prof_state {
    Kprof__V1__ProfResponse m;
    struct kp_pyprof *prof;
    void *rows, *ptrs;
};

/* ProfRows' rows a page: about 1 MiB on the wire (100 to 300 bytes a row), well under any
 * client's message limit. */
#define PROF_PAGE_ROWS 4096

/* A ProfRows call: the pages, sent as the windows' tables come (kp_pyprof_each). */
struct prof_stream {
    struct kp_view_ctx *c;
    Kprof__V1__ProfPage last; /* the reply: the last page */
    Kprof__V1__ProfRow *rows, **ptrs;
    uint64_t sent; /* rows */
    int send_rc;   /* nonzero: the client went away or stopped reading */
};

static bool prof_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k, char *err,
                     size_t len)
{
    const Kprof__V1__ProfRequest *r = (const Kprof__V1__ProfRequest *) req;

    (void) max_rows;
    return kp_view_key_init(k, r->run_id, r->rank, false, err, len);
}

/* r as a ProfRow into o; the strings point into r's table. */
static void prof_row(Kprof__V1__ProfRow *o, const struct kp_pyprof_row *r)
{
    kprof__v1__prof_row__init(o);
    o->idx = r->idx;
    o->seq = r->seq;
    o->altseq = (char *) r->altseq;
    o->tid = r->tid;
    o->layer = (char *) r->layer;
    o->trace = (char *) r->trace;
    o->bprop = r->bwd;
    o->sub = r->sub;
    o->mod = (char *) r->mod;
    o->op = (char *) r->op;
    o->kernel = (char *) r->kernel;
    o->params = (char *) r->params;
    o->sil_ns = r->sil_ns;
    o->tc = (char *) r->tc;
    o->device = r->device;
    o->stream = r->stream;
    o->grid = (char *) r->grid;
    o->block = (char *) r->block;
    o->flops = r->flops;
    o->flops_known = r->flops_known;
    o->bytes = r->bytes;
    o->bytes_known = r->bytes_known;
}

/* PyProf's table of the rank as a ProfResponse into *m; the rows point into p and arrays
 * (freed by the caller). Returns 0 or -ENOMEM. */
static int fill_prof(Kprof__V1__ProfResponse *m, const struct kp_pyprof *p, void **rows_out,
                     void **ptrs_out)
{
    size_t n;
    const struct kp_pyprof_row *r = kp_pyprof_rows(p, &n);
    Kprof__V1__ProfRow *rows, **ptrs;

    rows = *rows_out = calloc(n ? n : 1, sizeof(*rows));
    ptrs = *ptrs_out = calloc(n ? n : 1, sizeof(*ptrs));
    if (rows == NULL || ptrs == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        prof_row(&rows[i], &r[i]);
        ptrs[i] = &rows[i];
    }
    m->n_rows = n;
    m->rows = ptrs;
    return 0;
}

/* kp_pyprof_each's callback: a window's rows in pages of PROF_PAGE_ROWS, each sent once the
 * one before reached the client. Returns 0 or the send's error. */
static int send_window(void *ud, const struct kp_pyprof *t)
{
    struct prof_stream *s = ud;
    size_t n;
    const struct kp_pyprof_row *r = kp_pyprof_rows(t, &n);

    for (size_t at = 0; at < n;) {
        Kprof__V1__ProfPage page = KPROF__V1__PROF_PAGE__INIT;
        size_t k = n - at < PROF_PAGE_ROWS ? n - at : PROF_PAGE_ROWS;

        for (size_t i = 0; i < k; i++) {
            prof_row(&s->rows[i], &r[at + i]);
            s->ptrs[i] = &s->rows[i];
        }
        page.run_id = s->c->key->run;
        page.rank = s->c->key->rank;
        page.n_rows = k;
        page.rows = s->ptrs;
        if ((s->send_rc = s->c->pages->send(s->c->pages->ud, &page.base)) != 0) {
            return s->send_rc;
        }
        s->sent += k;
        at += k;
    }
    return 0;
}

static void stream_free(void *p)
{
    struct prof_stream *s = p;

    free(s->rows);
    free(s->ptrs);
    free(s);
}

/* ProfRows: the table by windows where the rank is over --window-events and can be cut
 * between steps, else whole (KP_EWHOLE first where the service reserved for windows); a
 * window's rows go out before the next window is read. */
static int stream_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct prof_stream *s = calloc(1, sizeof(*s));
    size_t window = 0, windows = 1;
    int rc;

    if (s == NULL || (s->rows = calloc(PROF_PAGE_ROWS, sizeof(*s->rows))) == NULL ||
        (s->ptrs = calloc(PROF_PAGE_ROWS, sizeof(*s->ptrs))) == NULL) {
        if (s != NULL) {
            stream_free(s);
        }
        return -ENOMEM;
    }
    s->c = c;
    kprof__v1__prof_page__init(&s->last);
    rc = kp_view_check_rank(c);
    if (rc == 0) {
        rc = kp_view_window(c, &window);
    }
    if (rc == 0) {
        rc = kp_pyprof_each(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, window,
                            send_window, s, &windows, c->err, c->errlen);
    }
    if (rc == KP_EWHOLE && !c->windows_only) { /* cannot be cut between steps: whole */
        windows = 1;
        rc = kp_pyprof_each(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, 0, send_window, s,
                            &windows, c->err, c->errlen);
    }
    if (rc != 0 && s->send_rc != 0) {
        kp_log_info("stream stopped method=ProfRows run=%" PRIu64 " rank=%d rows=%" PRIu64 ": %s",
                    k->run, (int) k->rank, s->sent,
                    s->send_rc == -ETIMEDOUT ? "the client stopped reading"
                                             : "the client went away");
        c->status = GRPC_STATUS_CANCELLED;
        snprintf(c->err, c->errlen,
                 "the client went away or stopped reading after %" PRIu64 " rows", s->sent);
    }
    if (rc != 0) {
        stream_free(s);
        return rc;
    }
    if (windows > 1) {
        kp_log_info("rank read by windows method=ProfRows run=%" PRIu64 " rank=%d windows=%zu "
                    "rows=%" PRIu64,
                    k->run, (int) k->rank, windows, s->sent);
    }
    s->last.run_id = k->run;
    s->last.rank = k->rank;
    s->last.last = true;
    s->last.total_rows = s->sent;
    s->last.windows = windows;
    out->msg = &s->last.base;
    out->state = s;
    out->free_fn = stream_free;
    return 0;
}

static void prof_free(void *p)
{
    struct prof_state *s = p;

    kp_pyprof_destroy(s->prof);
    free(s->rows);
    free(s->ptrs);
    free(s);
}

static int prof_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    const struct kp_view_key *k = c->key;
    struct prof_state *s;
    size_t window = 0, windows = 1;
    int rc;

    if (c->pages != NULL) {
        return stream_compute(c, out);
    }
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        return -ENOMEM;
    }
    kprof__v1__prof_response__init(&s->m);
    rc = kp_view_check_rank(c);
    if (rc == 0) {
        rc = kp_view_window(c, &window);
    }
    if (rc == 0) {
        rc = kp_pyprof_create_windowed(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, window,
                                       &s->prof, &windows, c->err, c->errlen);
    }
    if (rc == KP_EWHOLE) { /* cannot be cut between steps: whole */
        rc = kp_pyprof_create(c->pg, (int64_t) k->run, (int) k->rank, c->max_rows, &s->prof, c->err,
                              c->errlen);
    }
    if (rc == 0 && windows > 1) {
        kp_log_info("rank read by windows method=Prof run=%" PRIu64 " rank=%d windows=%zu", k->run,
                    (int) k->rank, windows);
    }
    if (rc == 0) {
        rc = fill_prof(&s->m, s->prof, &s->rows, &s->ptrs);
    }
    if (rc != 0) {
        prof_free(s);
        return rc;
    }
    s->m.run_id = k->run;
    s->m.rank = k->rank;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = prof_free;
    return 0;
}

/* Not load_rank: the table reads its own rows (kp_pyprof_create), so loading the rank too
 * would read it twice; kp_view_check_rank answers an unknown rank NOT_FOUND as the other views do.
 * A rank of more than --window-events events is read by windows (kp_pyprof_create_windowed),
 * but the reply holds a row per kernel: not .windowed, the service estimates the whole rank.
 * ProfRows streams the same rows in pages, window by window (stream_compute): bounded.
 */
const struct kp_view kp_view_prof = {
    .name = "Prof",
    .request = &kprof__v1__prof_request__descriptor,
    .reply = &kprof__v1__prof_response__descriptor,
    .load_rank = false,
    .key = prof_key,
    .compute = prof_compute,
    .bytes_per_event = 180,
    .stream = "ProfRows",
    .page = &kprof__v1__prof_page__descriptor,
};
