/*
 * spill: the importer's batch output, see spill.h; the spool's contract is kp_kineto.h's.
 */
#define KP_LOG_MODULE "kineto"
#include "spill.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kp_err.h"
#include "kp_log.h"

/* The first batch's rank_info and devices, from the opts and the file's meta. */
static void fill_rank_info(const struct kp_kineto_opts *opts, const struct kp_kineto_meta *src,
                           Kprof__V1__Batch *m, Kprof__V1__RankInfo *ri, Kprof__V1__Device *devs,
                           Kprof__V1__Device **devp)
{
    ri->job = (char *) (opts->job != NULL ? opts->job : "");
    ri->host = (char *) src->host;
    ri->pid = src->pid;
    ri->world_size = opts->world_size;
    ri->device = src->device;
    ri->distributed_info = (char *) src->dist_json;
    ri->profiler_start_ns = ri->profiler_end_ns = 0;
    ri->time_base_ns = src->base_ns;
    if (src->has_profiler_span) { /* both 0 (unknown) if it overflows or starts at 0 */
        int64_t s, e;

        if (!__builtin_add_overflow(src->base_ns, src->profiler_ts_ns, &s) &&
            !__builtin_add_overflow(s, src->profiler_dur_ns, &e) && s > 0) {
            ri->profiler_start_ns = s;
            ri->profiler_end_ns = e;
        }
    }
    m->rank_info = ri;
    for (size_t i = 0; i < src->n_devices; i++) {
        const struct kp_kineto_device *d = &src->devices[i];

        kprof__v1__device__init(&devs[i]);
        devs[i].id = d->id;
        devs[i].name = (char *) d->name;
        devs[i].sm_count = d->sm_count;
        devs[i].cc_major = d->cc_major;
        devs[i].cc_minor = d->cc_minor;
        devs[i].global_memory_bytes = d->global_memory_bytes;
        devs[i].max_threads_per_block = d->max_threads_per_block;
        devs[i].max_threads_per_sm = d->max_threads_per_sm;
        devs[i].regs_per_block = d->regs_per_block;
        devs[i].regs_per_sm = d->regs_per_sm;
        devs[i].smem_per_block = d->smem_per_block;
        devs[i].smem_per_sm = d->smem_per_sm;
        devs[i].warp_size = d->warp_size;
        devp[i] = &devs[i];
    }
    m->devices = devp;
    m->n_devices = src->n_devices;
}

/* Gives up on the spool (the import parses the file again): frees what it holds. */
void spool_drop(struct kp_kineto_spool *s)
{
    s->unusable = true;
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    if (s->fd >= 0) {
        close(s->fd);
        s->fd = -1;
    }
}

static bool write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);

        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return false;
        }
        p += w;
        n -= (size_t) w;
    }
    return true;
}

/* Moves the buffered records to the file (created on the first call). */
static bool spool_spill(struct kp_kineto_spool *s)
{
    if (s->fd < 0) {
        const char *dir = getenv("TMPDIR");
        char path[4096];

        if (dir == NULL || dir[0] == '\0') {
            dir = "/tmp";
        }
        snprintf(path, sizeof(path), "%s/kprof-import-XXXXXX", dir);
        if ((s->fd = mkstemp(path)) < 0) {
            kp_log_warn("cannot create a temporary file in %s (%s): the trace will be parsed "
                        "twice; set TMPDIR to a writable directory",
                        dir, strerror(errno));
            return false;
        }
        unlink(path);
        (void) fcntl(s->fd, F_SETFD, FD_CLOEXEC);
    }
    if (!write_all(s->fd, s->buf, s->len)) {
        kp_log_warn("cannot write the scanned batches to a temporary file (%s): the trace will "
                    "be parsed twice; set TMPDIR to a directory with free space",
                    strerror(errno));
        return false;
    }
    s->file_bytes += s->len;
    s->len = 0;
    return true;
}

/* Keeps a validated batch (m) in the spool, without what the replay puts in front. A
 * failure only makes the spool unusable: the scan goes on. */
static void spool_put(struct spill *sp, Kprof__V1__Batch *m)
{
    struct kp_kineto_spool *s = sp->spool;
    struct spool_rec h;
    size_t body, need;

    h.first = m->rank_info != NULL;
    h.base_ns = m->base_ns;
    h.in_bytes = s->in_bytes;
    m->run_id = 0;
    m->rank = 0;
    m->base_ns = 0;
    m->rank_info = NULL;
    m->devices = NULL;
    m->n_devices = 0;
    body = kprof__v1__batch__get_packed_size(m);
    if (body > UINT32_MAX - sizeof(h)) {
        spool_drop(s);
        return;
    }
    h.len = (uint32_t) body;
    need = sizeof(h) + body;
    if (s->fd < 0 && s->len + need > s->mem_limit) {
        if (!spool_spill(s)) {
            spool_drop(s);
            return;
        }
        if (s->cap > 2 * SPOOL_WBUF) { /* from now on only a write buffer */
            free(s->buf);
            s->buf = NULL;
            s->cap = 0;
        }
    }
    if (s->fd >= 0 && s->len + need > SPOOL_WBUF && s->len > 0 && !spool_spill(s)) {
        spool_drop(s);
        return;
    }
    if (s->len + need > s->cap) {
        size_t cap = s->cap ? s->cap : 64 * 1024;
        unsigned char *p;

        while (cap < s->len + need) {
            cap *= 2;
        }
        if ((p = realloc(s->buf, cap)) == NULL) {
            spool_drop(s);
            return;
        }
        s->buf = p;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, &h, sizeof(h));
    kprof__v1__batch__pack(m, s->buf + s->len + sizeof(h));
    s->len += need;
    s->records++;
    s->bytes += need;
}

/* End of a clean scan: a file spool flushes its buffer and frees it. */
void spool_seal(struct kp_kineto_spool *s)
{
    if (s->unusable) {
        return;
    }
    if (s->fd >= 0) {
        if (s->len > 0 && !spool_spill(s)) {
            spool_drop(s);
            return;
        }
        free(s->buf);
        s->buf = NULL;
        s->cap = 0;
    }
    else if (s->cap > s->len && s->len > 0) {
        unsigned char *p = realloc(s->buf, s->len);

        if (p != NULL) {
            s->buf = p;
            s->cap = s->len;
        }
    }
}

int spill_flush(struct spill *sp)
{
    Kprof__V1__Batch *m;
    Kprof__V1__RankInfo ri = KPROF__V1__RANK_INFO__INIT;
    Kprof__V1__Device devs[KP_KINETO_MAX_DEVICES];
    Kprof__V1__Device *devp[KP_KINETO_MAX_DEVICES];
    const struct kp_kineto_meta *src = sp->opts->meta != NULL ? sp->opts->meta : sp->meta;
    struct kp_batch_limits lim;
    char err[512];
    int rc;

    if (kp_batch_builder_total(sp->bb) == 0 && sp->sent_first) {
        return 0;
    }
    m = kp_batch_builder_finish(sp->bb, sp->have_base ? sp->base_ns : 0, NULL);
    m->run_id = sp->opts->run_id != 0 ? sp->opts->run_id : 1; /* a scan validates as run 1 */
    m->rank = sp->opts->rank;
    if (!sp->sent_first) {
        fill_rank_info(sp->opts, src, m, &ri, devs, devp);
    }
    lim.max_name_bytes = sp->max_name;
    lim.max_strings = KP_CODEC_DEFAULT_MAX_STRINGS;
    lim.max_rows = KP_CODEC_DEFAULT_MAX_ROWS;
    if ((rc = kp_batch_validate(m, &lim, err, sizeof(err))) != 0) {
        return jr_fail(sp->j, "batch %" PRIu64 " (the events before this one) is invalid: %s",
                       sp->meta->batches + 1, err);
    }
    sp->meta->batches++;
    sp->sent_first = true;
    if (sp->spool != NULL && !sp->spool->unusable) {
        spool_put(sp, m);
    }
    if (sp->cb != NULL && (rc = sp->cb(m, sp->cb_ud)) != 0) {
        sp->j->err = rc;
        kp_errbuf_set(sp->j->errbuf, sp->j->errlen, "sending batch %" PRIu64 ": %s",
                      sp->meta->batches, kp_strerror(rc));
        return rc;
    }
    kp_batch_builder_next(sp->bb);
    sp->have_base = false;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Spool */

int kp_kineto_spool_create(size_t mem_limit, struct kp_kineto_spool **out)
{
    struct kp_kineto_spool *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        return -ENOMEM;
    }
    s->mem_limit = mem_limit;
    s->fd = -1;
    *out = s;
    return 0;
}

void kp_kineto_spool_destroy(struct kp_kineto_spool *s)
{
    if (s == NULL) {
        return;
    }
    spool_drop(s);
    free(s);
}

size_t kp_kineto_spool_mem_bytes(const struct kp_kineto_spool *s)
{
    return s != NULL ? s->cap : 0;
}

uint64_t kp_kineto_spool_bytes(const struct kp_kineto_spool *s)
{
    return s != NULL && !s->unusable ? s->bytes : 0;
}

static bool read_at(int fd, void *buf, size_t n, uint64_t off)
{
    unsigned char *p = buf;

    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t) off);

        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            if (r == 0) {
                errno = EIO;
            }
            return false;
        }
        p += r;
        n -= (size_t) r;
        off += (uint64_t) r;
    }
    return true;
}

/* The fields in front of a spooled batch; packed into out (NULL: only the size). */
static size_t spool_prefix(const struct kp_kineto_opts *opts, const struct spool_rec *h,
                           int64_t shift, uint8_t *out, const struct kp_batch_limits *lim,
                           char *err, size_t errlen, int *valid)
{
    Kprof__V1__Batch m = KPROF__V1__BATCH__INIT;
    Kprof__V1__RankInfo ri = KPROF__V1__RANK_INFO__INIT;
    Kprof__V1__Device devs[KP_KINETO_MAX_DEVICES];
    Kprof__V1__Device *devp[KP_KINETO_MAX_DEVICES];

    m.run_id = opts->run_id;
    m.rank = opts->rank;
    m.base_ns = h->base_ns + shift;
    if (h->first) {
        fill_rank_info(opts, opts->meta, &m, &ri, devs, devp);
    }
    if (valid != NULL) {
        *valid = kp_batch_validate(&m, lim, err, errlen);
    }
    return out != NULL ? kprof__v1__batch__pack(&m, out) : kprof__v1__batch__get_packed_size(&m);
}

int kp_kineto_spool_replay(struct kp_kineto_spool *s, const struct kp_kineto_opts *opts,
                           kp_kineto_encoded_cb *cb, void *cb_ud, struct kp_kineto_meta *meta_out,
                           char *errbuf, size_t errlen)
{
    const struct kp_kineto_meta *meta;
    struct kp_batch_limits lim;
    struct spool_rec h;
    unsigned char *buf = NULL;
    size_t cap = 0, pos = 0;
    uint64_t off = 0;
    int64_t shift = 0, lo = 0, hi = 0;
    char err[512];
    int rc = 0, valid;

    if (s == NULL || opts == NULL || opts->meta == NULL || cb == NULL || meta_out == NULL) {
        kp_errbuf_set(errbuf, errlen, "kp_kineto_spool_replay: bad arguments");
        return -EINVAL;
    }
    meta = opts->meta;
    if (s->unusable || s->replayed || !s->used || s->records == 0) {
        return KP_KINETO_REPARSE;
    }
    if (s->base_set && __builtin_sub_overflow(meta->base_ns, s->base_used, &shift)) {
        return KP_KINETO_REPARSE;
    }
    if (shift != 0 && (meta->max_ns == INT64_MAX || meta->min_ns == INT64_MIN ||
                       __builtin_add_overflow(meta->min_ns, shift, &lo) ||
                       __builtin_add_overflow(meta->max_ns, shift, &hi))) {
        return KP_KINETO_REPARSE; /* a time saturated in the scan, or would now */
    }
    /* the first batch's rank_info as the second parse would build it must validate */
    lim.max_name_bytes =
        opts->max_name_bytes ? opts->max_name_bytes : KP_CODEC_DEFAULT_MAX_NAME_BYTES;
    lim.max_strings = KP_CODEC_DEFAULT_MAX_STRINGS;
    lim.max_rows = KP_CODEC_DEFAULT_MAX_ROWS;
    memset(&h, 0, sizeof(h));
    h.first = 1;
    (void) spool_prefix(opts, &h, 0, NULL, &lim, err, sizeof(err), &valid);
    if (valid != 0) {
        return KP_KINETO_REPARSE;
    }
    s->replayed = true;
    *meta_out = *meta;
    for (int kind = 0; shift != 0 && kind < KP_EV_COUNT; kind++) {
        if (meta->rows[kind] > 0) { /* with no rows, min_ns and max_ns are 0 unshifted */
            meta_out->min_ns = lo;
            meta_out->max_ns = hi;
            break;
        }
    }
    for (uint64_t r = 0; r < s->records; r++) {
        size_t pre, need;

        if (s->fd < 0) {
            memcpy(&h, s->buf + pos, sizeof(h));
            pos += sizeof(h);
        }
        else {
            if (!read_at(s->fd, &h, sizeof(h), off)) {
                rc = -errno;
                kp_errbuf_set(errbuf, errlen, "reading back the scanned batches: %s",
                              strerror(errno));
                break;
            }
            off += sizeof(h);
        }
        pre = spool_prefix(opts, &h, shift, NULL, NULL, NULL, 0, NULL);
        need = pre + h.len;
        if (need > cap) {
            unsigned char *p = realloc(buf, need);

            if (p == NULL) {
                rc = -ENOMEM;
                kp_errbuf_set(errbuf, errlen, "out of memory");
                break;
            }
            buf = p;
            cap = need;
        }
        (void) spool_prefix(opts, &h, shift, buf, NULL, NULL, 0, NULL);
        if (s->fd < 0) {
            memcpy(buf + pre, s->buf + pos, h.len);
            pos += h.len;
        }
        else {
            if (!read_at(s->fd, buf + pre, h.len, off)) {
                rc = -errno;
                kp_errbuf_set(errbuf, errlen, "reading back the scanned batches: %s",
                              strerror(errno));
                break;
            }
            off += h.len;
        }
        if (opts->progress != NULL) {
            opts->progress(h.in_bytes, opts->progress_ud);
        }
        if ((rc = cb(buf, need, cb_ud)) != 0) {
            kp_errbuf_set(errbuf, errlen, "sending batch %" PRIu64 ": %s", r + 1, kp_strerror(rc));
            break;
        }
    }
    free(buf);
    return rc;
}
