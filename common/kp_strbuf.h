/*
 * A growable byte buffer with a length cap, for HTTP responses, Prometheus text and COPY
 * encoding.
 *
 * The caller owns the struct (init/fini); the buffer owns data. Growth doubles the capacity,
 * so appends are amortised O(1), and an append that fits is an inline memcpy. The cap bounds
 * len; an append that would pass it fails with KP_ETOOBIG and leaves the buffer as it was.
 * Allocation failure returns -ENOMEM; nothing here aborts.
 *
 * After init data is NULL until the first append or reserve. After any successful
 * kp_strbuf_* call that changes the contents, data[len] is '\0', so data can be used as a C
 * string if no NUL was appended. Code that writes at data + len after kp_strbuf_reserve()
 * and then advances len itself must terminate the string itself if it needs one.
 *
 * Not thread-safe: one owner at a time.
 */
#ifndef KP_STRBUF_H
#define KP_STRBUF_H

#include <stdarg.h>
#include <stddef.h>
#include <string.h>

struct kp_strbuf {
    char *data;     /* owned; NULL until the first allocation */
    size_t len;     /* bytes in use, excluding the trailing NUL */
    size_t cap;     /* bytes allocated, including room for the NUL; 0 when data is NULL */
    size_t max_len; /* len never passes this */
};

/* Initialises an empty buffer whose len may grow to max_len bytes (0: no cap beyond
 * SIZE_MAX / 2). Allocates nothing. */
void kp_strbuf_init(struct kp_strbuf *sb, size_t max_len);

/* Frees the data and leaves sb as after kp_strbuf_init() with the same cap. Accepts a
 * zeroed struct. */
void kp_strbuf_fini(struct kp_strbuf *sb);

/* Empties the buffer but keeps its memory for reuse. */
void kp_strbuf_reset(struct kp_strbuf *sb);

/* Makes room for extra more bytes plus a NUL after len, so that data + len .. data + len +
 * extra may be written directly before advancing len. Returns 0, -ENOMEM, or KP_ETOOBIG if
 * len + extra would pass the cap. */
int kp_strbuf_reserve(struct kp_strbuf *sb, size_t extra);

/* Appends printf-style text. Returns 0, -ENOMEM, KP_ETOOBIG (the buffer is unchanged), or
 * -EINVAL for a bad format. */
int kp_strbuf_appendf(struct kp_strbuf *sb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int kp_strbuf_vappendf(struct kp_strbuf *sb, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Slow path of kp_strbuf_append(); internal. */
int kp__strbuf_append_slow(struct kp_strbuf *sb, const void *p, size_t n);

/* Appends n bytes from p (borrowed). Returns 0, -ENOMEM or KP_ETOOBIG (the buffer is
 * unchanged). */
static inline int kp_strbuf_append(struct kp_strbuf *sb, const void *p, size_t n)
{
    /* cap never exceeds max_len + 1, so fitting in cap also respects the length cap. */
    if (n < sb->cap - sb->len) {
        memcpy(sb->data + sb->len, p, n);
        sb->len += n;
        sb->data[sb->len] = '\0';
        return 0;
    }
    return kp__strbuf_append_slow(sb, p, n);
}

/* Appends a NUL-terminated string (borrowed). Same returns as kp_strbuf_append(). */
static inline int kp_strbuf_append_str(struct kp_strbuf *sb, const char *s)
{
    return kp_strbuf_append(sb, s, strlen(s));
}

/* Appends one byte. Same returns as kp_strbuf_append(). */
static inline int kp_strbuf_putc(struct kp_strbuf *sb, char c)
{
    return kp_strbuf_append(sb, &c, 1);
}

#endif
