/*
 * kp_spool: see spool.h for the format. In memory, segs[] lists the segment files in seq
 * order; the last one is the active one (open for appends in wfd) unless it is full. The
 * reader keeps the seq it delivers next (rd_seq) and a position hint (rd_first, rd_off): the
 * segment it reads and the offset of the next record there.
 */
#define KP_LOG_MODULE "spool"
#include "spool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "kp_clock.h"
#include "kp_log.h"

struct seg {
    uint64_t first_seq, last_seq; /* of the records in it (last_seq 0: none yet) */
    uint64_t size;                /* bytes */
};

struct kp_spool {
    char *dir;
    uint64_t max_bytes, segment_bytes;
    uint64_t stream_id;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    struct seg *segs;
    size_t n_segs, cap_segs;
    int wfd;           /* the active segment, or -1 */
    uint64_t next_seq; /* assigned by the next append */
    uint64_t acked;
    uint64_t rd_seq;   /* the next seq the reader delivers */
    uint64_t rd_first; /* first_seq of the segment the hint points into */
    uint64_t rd_off;
    bool woken;
    struct kp_spool_stats st;
};

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;

        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        }
        crc_table[i] = c;
    }
}

uint32_t kp_spool_crc32(uint32_t crc, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    pthread_once(&crc_once, crc_init);
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    }
    return ~crc;
}

static uint32_t rec_crc(uint64_t seq, const void *payload, size_t len)
{
    return kp_spool_crc32(kp_spool_crc32(0, &seq, sizeof(seq)), payload, len);
}

static void seg_path(const struct kp_spool *sp, uint64_t first, char *buf, size_t len)
{
    snprintf(buf, len, "%s/seg-%020" PRIu64 ".kps", sp->dir, first);
}

static int mkdir_p(const char *dir)
{
    char tmp[4096];
    size_t n = strlen(dir);

    if (n == 0 || n >= sizeof(tmp)) {
        return -ENAMETOOLONG;
    }
    memcpy(tmp, dir, n + 1);
    for (char *p = tmp + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) { /* parents: searchable */
                return -errno;
            }
            *p = '/';
        }
    }
    if (mkdir(tmp, 0750) != 0 && errno != EEXIST) {
        return -errno;
    }
    return 0;
}

/* Reads "N\n" from dir/name. Returns 0 (and *v), -ENOENT or -EINVAL. */
static int read_u64_file(const struct kp_spool *sp, const char *name, uint64_t *v)
{
    char path[4200], buf[64];
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s/%s", sp->dir, name);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        return -errno;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return -EINVAL;
    }
    buf[n] = '\0';
    char *end;
    errno = 0;
    *v = strtoull(buf, &end, 10);
    if (errno != 0 || end == buf) {
        return -EINVAL;
    }
    return 0;
}

/* Writes "N\n" to dir/name through a temporary file and rename (atomic replace). */
static int write_u64_file(const struct kp_spool *sp, const char *name, uint64_t v)
{
    char path[4200], tmp[4210], buf[32];
    int fd, n, rc = 0;

    snprintf(path, sizeof(path), "%s/%s", sp->dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    n = snprintf(buf, sizeof(buf), "%" PRIu64 "\n", v);
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640)) < 0) {
        return -errno;
    }
    if (write(fd, buf, (size_t) n) != n) {
        rc = errno ? -errno : -EIO;
    }
    if (close(fd) != 0 && rc == 0) {
        rc = -errno;
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -errno;
    }
    if (rc != 0) {
        unlink(tmp);
    }
    return rc;
}

static int push_seg(struct kp_spool *sp, uint64_t first, uint64_t last, uint64_t size)
{
    if (sp->n_segs == sp->cap_segs) {
        size_t cap = sp->cap_segs ? sp->cap_segs * 2 : 16;
        struct seg *s = realloc(sp->segs, cap * sizeof(*s));

        if (s == NULL) {
            return -ENOMEM;
        }
        sp->segs = s;
        sp->cap_segs = cap;
    }
    sp->segs[sp->n_segs].first_seq = first;
    sp->segs[sp->n_segs].last_seq = last;
    sp->segs[sp->n_segs].size = size;
    sp->n_segs++;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

    return x < y ? -1 : x > y;
}

/*
 * Scans one segment file: every record must have the magic, a sane length, a payload inside
 * the file, the right CRC and a seq above *prev_seq. The file is truncated at the first one
 * that does not. Sets first, last (0 if none) and size.
 */
static int scan_seg(struct kp_spool *sp, const char *path, uint64_t *prev_seq, uint64_t *first,
                    uint64_t *last, uint64_t *size)
{
    struct kp_spool_rec_hdr h;
    struct stat stb;
    uint64_t off = 0;
    uint8_t *buf = NULL;
    size_t cap = 0;
    int fd, rc = 0;

    *first = *last = 0;
    if ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0) {
        return -errno;
    }
    if (fstat(fd, &stb) != 0) {
        rc = -errno;
        goto out;
    }
    while (off + sizeof(h) <= (uint64_t) stb.st_size) {
        if (pread(fd, &h, sizeof(h), (off_t) off) != (ssize_t) sizeof(h) ||
            h.magic != KP_SPOOL_MAGIC || h.len > KP_SPOOL_MAX_RECORD ||
            off + sizeof(h) + h.len > (uint64_t) stb.st_size || h.seq <= *prev_seq) {
            break;
        }
        if (h.len > cap) {
            uint8_t *nb = realloc(buf, h.len);

            if (nb == NULL) {
                rc = -ENOMEM;
                goto out;
            }
            buf = nb;
            cap = h.len;
        }
        if (pread(fd, buf, h.len, (off_t) (off + sizeof(h))) != (ssize_t) h.len ||
            rec_crc(h.seq, buf, h.len) != h.crc) {
            break;
        }
        if (*first == 0) {
            *first = h.seq;
        }
        *last = *prev_seq = h.seq;
        off += sizeof(h) + h.len;
    }
    if (off < (uint64_t) stb.st_size) {
        kp_log_warn("torn or corrupt spool tail truncated file=%s offset=%" PRIu64
                    " bytes_cut=%" PRIu64,
                    path, off, (uint64_t) stb.st_size - off);
        sp->st.torn_bytes += (uint64_t) stb.st_size - off;
        if (ftruncate(fd, (off_t) off) != 0) {
            rc = -errno;
        }
    }
    *size = off;
out:
    free(buf);
    close(fd);
    return rc;
}

static int recover(struct kp_spool *sp, char *errbuf, size_t errlen)
{
    DIR *d = opendir(sp->dir);
    struct dirent *e;
    uint64_t *firsts = NULL, prev = 0, max_seq = 0;
    size_t n = 0, cap = 0;
    int rc = 0;

    if (d == NULL) {
        rc = -errno;
        snprintf(errbuf, errlen, "cannot read spool directory %s: %s", sp->dir, strerror(errno));
        return rc;
    }
    while ((e = readdir(d)) != NULL) {
        unsigned long long f;
        char tail[8];

        if (sscanf(e->d_name, "seg-%20llu.%4s", &f, tail) != 2 || strcmp(tail, "kps") != 0) {
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *nf = realloc(firsts, cap * sizeof(*nf));
            if (nf == NULL) {
                rc = -ENOMEM;
                goto out;
            }
            firsts = nf;
        }
        firsts[n++] = f;
    }
    if (n > 1) { /* n == 0 leaves firsts NULL, which qsort must not be given */
        qsort(firsts, n, sizeof(*firsts), cmp_u64);
    }
    for (size_t i = 0; i < n; i++) {
        char path[4200];
        uint64_t first, last, size;

        seg_path(sp, firsts[i], path, sizeof(path));
        if ((rc = scan_seg(sp, path, &prev, &first, &last, &size)) != 0) {
            snprintf(errbuf, errlen, "cannot recover spool segment %s: %s", path, strerror(-rc));
            goto out;
        }
        if (first == 0 || last <= sp->acked) {
            unlink(path); /* empty, or everything in it acknowledged */
            if (last > max_seq) {
                max_seq = last;
            }
            continue;
        }
        if ((rc = push_seg(sp, firsts[i], last, size)) != 0) {
            snprintf(errbuf, errlen, "out of memory");
            goto out;
        }
        max_seq = last;
        sp->st.replayed += last - (first > sp->acked ? first : sp->acked + 1) + 1;
    }
    sp->next_seq = (max_seq > sp->acked ? max_seq : sp->acked) + 1;
out:
    free(firsts);
    closedir(d);
    return rc;
}

int kp_spool_open(const char *dir, uint64_t max_bytes, uint64_t segment_bytes,
                  struct kp_spool **out, char *errbuf, size_t errlen)
{
    struct kp_spool *sp;
    int rc;

    *out = NULL;
    if ((sp = calloc(1, sizeof(*sp))) == NULL || (sp->dir = strdup(dir)) == NULL) {
        free(sp);
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    sp->wfd = -1;
    sp->max_bytes = max_bytes ? max_bytes : KP_SPOOL_DEFAULT_MAX_BYTES;
    sp->segment_bytes = segment_bytes ? segment_bytes : KP_SPOOL_DEFAULT_SEGMENT;
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->cond, NULL);
    if ((rc = mkdir_p(dir)) != 0) {
        snprintf(errbuf, errlen, "cannot create spool directory %s: %s (set --spool-dir)", dir,
                 strerror(-rc));
        goto fail;
    }
    rc = read_u64_file(sp, "acked", &sp->acked);
    if (rc != 0 && rc != -ENOENT) {
        kp_log_warn("spool cursor unreadable, replaying everything dir=%s", dir);
        sp->acked = 0;
    }
    if (read_u64_file(sp, "stream_id", &sp->stream_id) != 0 || sp->stream_id == 0 ||
        sp->stream_id > INT64_MAX) {
        uint64_t r = 0;

        if (getrandom(&r, sizeof(r), 0) != (ssize_t) sizeof(r)) {
            r = (uint64_t) time(NULL) * 0x9e3779b97f4a7c15ULL ^ (uint64_t) getpid();
        }
        sp->stream_id = (r & (uint64_t) INT64_MAX) ? (r & (uint64_t) INT64_MAX) : 1;
        if ((rc = write_u64_file(sp, "stream_id", sp->stream_id)) != 0) {
            snprintf(errbuf, errlen, "cannot write %s/stream_id: %s (is the spool dir writable?)",
                     dir, strerror(-rc));
            goto fail;
        }
    }
    if ((rc = recover(sp, errbuf, errlen)) != 0) {
        goto fail;
    }
    sp->rd_seq = sp->acked + 1;
    sp->rd_first = sp->n_segs ? sp->segs[0].first_seq : 0;
    sp->rd_off = 0;
    if (sp->st.replayed > 0) {
        kp_log_info("spool recovered dir=%s unacked_records=%" PRIu64 " acked=%" PRIu64
                    " next_seq=%" PRIu64,
                    dir, sp->st.replayed, sp->acked, sp->next_seq);
    }
    *out = sp;
    return 0;
fail:
    kp_spool_close(sp);
    return rc;
}

void kp_spool_close(struct kp_spool *sp)
{
    if (sp == NULL) {
        return;
    }
    if (sp->wfd >= 0) {
        close(sp->wfd);
    }
    pthread_cond_destroy(&sp->cond);
    pthread_mutex_destroy(&sp->mu);
    free(sp->segs);
    free(sp->dir);
    free(sp);
}

uint64_t kp_spool_stream_id(const struct kp_spool *sp)
{
    return sp->stream_id;
}

static uint64_t total_bytes(const struct kp_spool *sp)
{
    uint64_t t = 0;

    for (size_t i = 0; i < sp->n_segs; i++) {
        t += sp->segs[i].size;
    }
    return t;
}

/* Opens a new active segment for next_seq. Called with mu held. */
static int new_segment(struct kp_spool *sp)
{
    char path[4200];
    int fd, rc;

    seg_path(sp, sp->next_seq, path, sizeof(path));
    if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640)) < 0) {
        return -errno;
    }
    if ((rc = push_seg(sp, sp->next_seq, 0, 0)) != 0) {
        close(fd);
        unlink(path);
        return rc;
    }
    sp->wfd = fd;
    return 0;
}

/* Appends under a limit of max_bytes less the tail reserve, or (tail) max_bytes itself. */
static int append(struct kp_spool *sp, const void *buf, size_t len, uint64_t *seq, bool tail)
{
    struct kp_spool_rec_hdr h;
    struct iovec iov[2];
    struct seg *s;
    size_t want = sizeof(h) + len;
    uint64_t reserve, limit;
    ssize_t n;
    int rc = 0;

    if (len > KP_SPOOL_MAX_RECORD) {
        return -EMSGSIZE;
    }
    if (tail && len > KP_SPOOL_TAIL_MAX) {
        return -EMSGSIZE;
    }
    reserve = sp->max_bytes / 16 < KP_SPOOL_TAIL_RESERVE_MAX ? sp->max_bytes / 16
                                                             : KP_SPOOL_TAIL_RESERVE_MAX;
    limit = tail ? sp->max_bytes : sp->max_bytes - reserve;
    pthread_mutex_lock(&sp->mu);
    if (total_bytes(sp) + want > limit) {
        sp->st.dropped_full++;
        rc = -ENOSPC;
        goto out;
    }
    if (sp->wfd >= 0 && sp->segs[sp->n_segs - 1].size + want > sp->segment_bytes &&
        sp->segs[sp->n_segs - 1].size > 0) {
        close(sp->wfd); /* full: the next record opens a new segment */
        sp->wfd = -1;
    }
    if (sp->wfd < 0 && (rc = new_segment(sp)) != 0) {
        kp_log_error("cannot create a spool segment dir=%s err=\"%s\"", sp->dir, strerror(-rc));
        sp->st.dropped_full++;
        goto out;
    }
    s = &sp->segs[sp->n_segs - 1];
    memset(&h, 0, sizeof(h));
    h.magic = KP_SPOOL_MAGIC;
    h.len = (uint32_t) len;
    h.seq = sp->next_seq;
    h.crc = rec_crc(h.seq, buf, len);
    iov[0].iov_base = &h;
    iov[0].iov_len = sizeof(h);
    iov[1].iov_base = (void *) buf;
    iov[1].iov_len = len;
    n = writev(sp->wfd, iov, 2);
    if (n != (ssize_t) want) {
        rc = n < 0 ? -errno : -EIO;
        kp_log_error("spool write failed dir=%s err=\"%s\"", sp->dir, strerror(-rc));
        if (ftruncate(sp->wfd, (off_t) s->size) != 0) {
            close(sp->wfd); /* the scan at the next open cuts the torn record */
            sp->wfd = -1;
        }
        sp->st.dropped_full++;
        goto out;
    }
    s->size += want;
    s->last_seq = h.seq;
    *seq = sp->next_seq++;
    sp->st.appended++;
    pthread_cond_broadcast(&sp->cond);
out:
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

int kp_spool_append(struct kp_spool *sp, const void *buf, size_t len, uint64_t *seq)
{
    return append(sp, buf, len, seq, false);
}

int kp_spool_append_tail(struct kp_spool *sp, const void *buf, size_t len, uint64_t *seq)
{
    return append(sp, buf, len, seq, true);
}

/* Index of the segment whose first_seq is first, or of the first segment after it. */
static size_t seg_index(const struct kp_spool *sp, uint64_t first)
{
    size_t i = 0;

    while (i < sp->n_segs && sp->segs[i].first_seq < first) {
        i++;
    }
    return i;
}

int kp_spool_read(struct kp_spool *sp, uint64_t *seq, uint8_t **buf, size_t *len)
{
    int rc = 0;

    pthread_mutex_lock(&sp->mu);
    if (sp->rd_seq <= sp->acked) {
        sp->rd_seq = sp->acked + 1;
    }
    for (size_t i = seg_index(sp, sp->rd_first); i < sp->n_segs; i++) {
        struct seg *s = &sp->segs[i];
        char path[4200];
        int fd;

        if (s->first_seq != sp->rd_first) {
            sp->rd_first = s->first_seq; /* the hinted segment is gone: start this one over */
            sp->rd_off = 0;
        }
        if (s->last_seq < sp->rd_seq || sp->rd_off >= s->size) {
            if (i + 1 < sp->n_segs) {
                sp->rd_first = sp->segs[i + 1].first_seq;
                sp->rd_off = 0;
            }
            continue;
        }
        seg_path(sp, s->first_seq, path, sizeof(path));
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = -errno;
            goto out;
        }
        while (sp->rd_off + sizeof(struct kp_spool_rec_hdr) <= s->size) {
            struct kp_spool_rec_hdr h;
            uint8_t *b;

            if (pread(fd, &h, sizeof(h), (off_t) sp->rd_off) != (ssize_t) sizeof(h) ||
                h.magic != KP_SPOOL_MAGIC || h.len > KP_SPOOL_MAX_RECORD) {
                sp->rd_off = s->size; /* unreadable: skip the rest of this segment */
                rc = -EIO;
                break;
            }
            if (h.seq < sp->rd_seq) {
                sp->rd_off += sizeof(h) + h.len;
                continue;
            }
            if ((b = malloc(h.len ? h.len : 1)) == NULL) {
                rc = -ENOMEM;
                break;
            }
            if (pread(fd, b, h.len, (off_t) (sp->rd_off + sizeof(h))) != (ssize_t) h.len ||
                rec_crc(h.seq, b, h.len) != h.crc) {
                free(b);
                sp->rd_off += sizeof(h) + h.len;
                sp->rd_seq = h.seq + 1;
                rc = -EIO;
                break;
            }
            sp->rd_off += sizeof(h) + h.len;
            sp->rd_seq = h.seq + 1;
            *seq = h.seq;
            *buf = b;
            *len = h.len;
            rc = 1;
            break;
        }
        close(fd);
        if (rc != 0) {
            goto out;
        }
    }
    sp->woken = false;
out:
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

void kp_spool_rewind(struct kp_spool *sp)
{
    pthread_mutex_lock(&sp->mu);
    sp->rd_seq = sp->acked + 1;
    sp->rd_first = sp->n_segs ? sp->segs[0].first_seq : 0;
    sp->rd_off = 0;
    pthread_mutex_unlock(&sp->mu);
}

int kp_spool_ack_through(struct kp_spool *sp, uint64_t seq)
{
    size_t drop = 0;
    int rc;

    pthread_mutex_lock(&sp->mu);
    if (seq <= sp->acked) {
        pthread_mutex_unlock(&sp->mu);
        return 0;
    }
    if (seq >= sp->next_seq) {
        seq = sp->next_seq - 1;
    }
    sp->acked = seq;
    rc = write_u64_file(sp, "acked", seq);
    while (drop < sp->n_segs && sp->segs[drop].last_seq != 0 && sp->segs[drop].last_seq <= seq) {
        char path[4200];

        if (drop == sp->n_segs - 1 && sp->wfd >= 0) {
            close(sp->wfd);
            sp->wfd = -1;
        }
        seg_path(sp, sp->segs[drop].first_seq, path, sizeof(path));
        unlink(path);
        sp->st.segments_gone++;
        drop++;
    }
    if (drop > 0) {
        memmove(sp->segs, sp->segs + drop, (sp->n_segs - drop) * sizeof(*sp->segs));
        sp->n_segs -= drop;
    }
    pthread_mutex_unlock(&sp->mu);
    if (rc != 0) {
        kp_log_warn("cannot persist the spool cursor dir=%s err=\"%s\"", sp->dir, strerror(-rc));
    }
    return rc;
}

uint64_t kp_spool_first_unacked(struct kp_spool *sp)
{
    uint64_t v;

    pthread_mutex_lock(&sp->mu);
    v = sp->acked + 1;
    if (sp->n_segs > 0 && sp->segs[0].first_seq > v) {
        v = sp->segs[0].first_seq; /* a gap (records lost to a corrupt segment) */
    }
    if (v > sp->next_seq) {
        v = sp->next_seq;
    }
    pthread_mutex_unlock(&sp->mu);
    return v;
}

void kp_spool_wait(struct kp_spool *sp, long long timeout_ms)
{
    struct timespec ts = kp_real_deadline(timeout_ms);

    pthread_mutex_lock(&sp->mu);
    if (sp->rd_seq >= sp->next_seq && !sp->woken) {
        pthread_cond_timedwait(&sp->cond, &sp->mu, &ts);
    }
    sp->woken = false;
    pthread_mutex_unlock(&sp->mu);
}

void kp_spool_wake(struct kp_spool *sp)
{
    pthread_mutex_lock(&sp->mu);
    sp->woken = true;
    pthread_cond_broadcast(&sp->cond);
    pthread_mutex_unlock(&sp->mu);
}

void kp_spool_get_stats(struct kp_spool *sp, struct kp_spool_stats *out)
{
    pthread_mutex_lock(&sp->mu);
    *out = sp->st;
    out->bytes = total_bytes(sp);
    out->segments = (uint32_t) sp->n_segs;
    out->next_seq = sp->next_seq;
    out->acked = sp->acked;
    pthread_mutex_unlock(&sp->mu);
}
