/*
 * The web UI's files in memory (web_static.h).
 */
#define _GNU_SOURCE
#include "web_static.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kp_err.h"
#include "kp_log.h"

#define MAX_DEPTH    8
#define PATH_MAX_LEN 256

struct kp_web_static {
    struct kp_web_file *files; /* sorted by path */
    size_t n, cap, bytes;
};

static const struct {
    const char *ext, *type;
} types[] = {
    { ".html", "text/html; charset=utf-8" },
    { ".js", "text/javascript; charset=utf-8" },
    { ".mjs", "text/javascript; charset=utf-8" },
    { ".css", "text/css; charset=utf-8" },
    { ".json", "application/json" },
    { ".svg", "image/svg+xml" },
    { ".png", "image/png" },
    { ".ico", "image/x-icon" },
    { ".md", "text/plain; charset=utf-8" },
    { ".txt", "text/plain; charset=utf-8" },
    { ".map", "application/json" },
    { ".woff2", "font/woff2" },
};

static const char *type_of(const char *name)
{
    const char *dot = strrchr(name, '.');

    if (dot == NULL) {
        return "text/plain; charset=utf-8"; /* LICENSE, README */
    }
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (strcmp(dot, types[i].ext) == 0) {
            return types[i].type;
        }
    }
    return "application/octet-stream";
}

/* FNV-1a, 64 bits: an ETag only needs to change when the content does. */
static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;

    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 1099511628211ULL;
    }
    return h;
}

static int add_file(struct kp_web_static *s, int dirfd, const char *name, const char *rel,
                    char *errbuf, size_t errlen)
{
    /* O_NONBLOCK: a FIFO swapped in after the walk's fstatat must not block the start. */
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    struct kp_web_file *f;
    size_t got = 0;

    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(errbuf, errlen, "cannot read %s in --web-root: %s", rel, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return KP_ECONFIG;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(errbuf, errlen, "%s in --web-root changed while it was read: start again", rel);
        return KP_ECONFIG;
    }
    if (s->n == KP_WEB_STATIC_FILES || (size_t) st.st_size > KP_WEB_STATIC_BYTES - s->bytes) {
        close(fd);
        snprintf(errbuf, errlen,
                 "--web-root holds more than %u files or %u MiB (at %s): point it at kprof's "
                 "web/ directory",
                 KP_WEB_STATIC_FILES, KP_WEB_STATIC_BYTES >> 20, rel);
        return KP_ECONFIG;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap != 0 ? s->cap * 2 : 64;
        struct kp_web_file *nf = realloc(s->files, cap * sizeof(*nf));

        if (nf == NULL) {
            close(fd);
            snprintf(errbuf, errlen, "out of memory");
            return -ENOMEM;
        }
        s->files = nf;
        s->cap = cap;
    }
    f = &s->files[s->n];
    memset(f, 0, sizeof(*f));
    if ((f->path = strdup(rel)) == NULL ||
        (f->data = malloc(st.st_size > 0 ? (size_t) st.st_size : 1)) == NULL) {
        free(f->path);
        close(fd);
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    while (got < (size_t) st.st_size) {
        ssize_t r = read(fd, f->data + got, (size_t) st.st_size - got);

        if (r <= 0) {
            snprintf(errbuf, errlen, "cannot read %s in --web-root: %s", rel,
                     r < 0 ? strerror(errno) : "it shrank while read");
            free(f->path);
            free(f->data);
            close(fd);
            return KP_ECONFIG;
        }
        got += (size_t) r;
    }
    close(fd);
    f->len = got;
    f->type = type_of(name);
    snprintf(f->etag, sizeof(f->etag), "\"%016llx\"", (unsigned long long) fnv1a(f->data, got));
    s->bytes += got;
    s->n++;
    return 0;
}

/* Walks the directory fd (owned: closed here), rel its path from the root ("" for the root). */
static int walk(struct kp_web_static *s, int fd, const char *rel, int depth, char *errbuf,
                size_t errlen)
{
    DIR *d = fdopendir(fd);
    struct dirent *e;
    int rc = 0;

    if (d == NULL) {
        snprintf(errbuf, errlen, "cannot list %s/ in --web-root: %s", rel, strerror(errno));
        close(fd);
        return KP_ECONFIG;
    }
    while (rc == 0 && (e = readdir(d)) != NULL) {
        char path[PATH_MAX_LEN];
        struct stat st;

        if (e->d_name[0] == '.') {
            continue; /* ., .. and hidden files (editors' swap files, .gitignore) */
        }
        if ((size_t) snprintf(path, sizeof(path), "%s/%s", rel, e->d_name) >= sizeof(path)) {
            kp_log_warn("web root: skipping a path longer than %d bytes under %s/", PATH_MAX_LEN,
                        rel);
            continue;
        }
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            continue;
        }
        if (S_ISREG(st.st_mode)) {
            rc = add_file(s, fd, e->d_name, path, errbuf, errlen);
        }
        else if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) {
            int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);

            rc = sub < 0 ? 0 : walk(s, sub, path, depth + 1, errbuf, errlen);
        }
        else {
            kp_log_warn("web root: skipping %s (not a regular file or directory%s)", path,
                        S_ISDIR(st.st_mode) ? " within 8 levels" : "");
        }
    }
    closedir(d);
    return rc;
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const struct kp_web_file *) a)->path, ((const struct kp_web_file *) b)->path);
}

int kp_web_static_load(const char *root, struct kp_web_static **out, char *errbuf, size_t errlen)
{
    struct kp_web_static *s = calloc(1, sizeof(*s));
    int fd, rc;

    *out = NULL;
    if (s == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    if ((fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        snprintf(errbuf, errlen,
                 "--web-root %s: %s: give the directory of kprof's web UI (web/ in the source "
                 "tree, /usr/share/kprof/web when installed)",
                 root, strerror(errno));
        free(s);
        return KP_ECONFIG;
    }
    if ((rc = walk(s, fd, "", 0, errbuf, errlen)) != 0) {
        kp_web_static_free(s);
        return rc;
    }
    if (s->n > 0) {
        qsort(s->files, s->n, sizeof(*s->files), cmp_file);
    }
    if (kp_web_static_find(s, "/") == NULL) {
        snprintf(errbuf, errlen,
                 "--web-root %s has no index.html: give the directory of kprof's web UI (web/ in "
                 "the source tree, /usr/share/kprof/web when installed)",
                 root);
        kp_web_static_free(s);
        return KP_ECONFIG;
    }
    *out = s;
    return 0;
}

const struct kp_web_file *kp_web_static_find(const struct kp_web_static *s, const char *path)
{
    struct kp_web_file key = { .path = (char *) (strcmp(path, "/") == 0 ? "/index.html" : path) };

    if (s == NULL || s->n == 0) {
        return NULL;
    }
    return bsearch(&key, s->files, s->n, sizeof(*s->files), cmp_file);
}

size_t kp_web_static_count(const struct kp_web_static *s, size_t *bytes)
{
    *bytes = s != NULL ? s->bytes : 0;
    return s != NULL ? s->n : 0;
}

void kp_web_static_free(struct kp_web_static *s)
{
    if (s == NULL) {
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        free(s->files[i].path);
        free(s->files[i].data);
    }
    free(s->files);
    free(s);
}
