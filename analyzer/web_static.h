/*
 * kp_web_static: the web UI's files (the repository's web/, installed in
 * ${datadir}/kprof/web), read once at start and served from memory by web.c.
 *
 * Why in memory: a request then looks up an exact path in a table built from a walk of the
 * root at start, and never touches the filesystem, so no URL (.., %2e%2e, encoded slashes,
 * symlinks) can reach a file outside the tree; and a UI of a few hundred KiB costs nothing to
 * keep. The walk takes regular files only (symlinks and others are skipped and logged), at
 * most KP_WEB_STATIC_FILES files and KP_WEB_STATIC_BYTES bytes in all, and needs index.html.
 *
 * Thread-safety: immutable once loaded; any number of threads may call kp_web_static_find.
 */
#ifndef KP_WEB_STATIC_H
#define KP_WEB_STATIC_H

#include <stddef.h>

#define KP_WEB_STATIC_FILES 1024
#define KP_WEB_STATIC_BYTES (32u << 20)

struct kp_web_static;

struct kp_web_file {
    char *path;       /* "/js/main.js": from the root, with a leading slash */
    const char *type; /* Content-Type (static string) */
    char etag[20];    /* "\"<16 hex digits>\"": a hash of the content */
    unsigned char *data;
    size_t len;
};

/* Reads the tree under root. Returns 0 and *out, or a negative code (KP_ECONFIG: the root or
 * its index.html is missing, a limit is passed; -ENOMEM) with a message in errbuf that says
 * what to pass. */
int kp_web_static_load(const char *root, struct kp_web_static **out, char *errbuf, size_t errlen);

/* The file at a decoded request path ("/" is "/index.html"), or NULL. */
const struct kp_web_file *kp_web_static_find(const struct kp_web_static *s, const char *path);

/* The number of files and their bytes. */
size_t kp_web_static_count(const struct kp_web_static *s, size_t *bytes);

/* Accepts NULL. */
void kp_web_static_free(struct kp_web_static *s);

#endif
