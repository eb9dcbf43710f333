#include "kp_strbuf.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kp_err.h"

#define KP_STRBUF_MIN_CAP 64

void kp_strbuf_init(struct kp_strbuf *sb, size_t max_len)
{
    sb->data = NULL;
    sb->len = 0;
    sb->cap = 0;
    sb->max_len = (max_len == 0 || max_len > SIZE_MAX / 2) ? SIZE_MAX / 2 : max_len;
}

void kp_strbuf_fini(struct kp_strbuf *sb)
{
    free(sb->data);
    sb->data = NULL;
    sb->len = 0;
    sb->cap = 0;
}

void kp_strbuf_reset(struct kp_strbuf *sb)
{
    sb->len = 0;
    if (sb->data != NULL) {
        sb->data[0] = '\0';
    }
}

int kp_strbuf_reserve(struct kp_strbuf *sb, size_t extra)
{
    size_t need, cap;
    char *p;

    if (sb->max_len == 0) {
        /* A zeroed struct that never saw kp_strbuf_init(): treat as uncapped. */
        sb->max_len = SIZE_MAX / 2;
    }
    if (extra > sb->max_len - sb->len) {
        return KP_ETOOBIG;
    }
    need = sb->len + extra + 1;
    if (need <= sb->cap) {
        return 0;
    }
    cap = sb->cap < KP_STRBUF_MIN_CAP ? KP_STRBUF_MIN_CAP : sb->cap;
    while (cap < need) {
        cap *= 2;
    }
    if (cap > sb->max_len + 1) {
        cap = sb->max_len + 1;
    }
    p = realloc(sb->data, cap);
    if (p == NULL) {
        return -ENOMEM;
    }
    sb->data = p;
    sb->cap = cap;
    return 0;
}

int kp__strbuf_append_slow(struct kp_strbuf *sb, const void *p, size_t n)
{
    int r;

    r = kp_strbuf_reserve(sb, n);
    if (r != 0) {
        return r;
    }
    if (n > 0) {
        memcpy(sb->data + sb->len, p, n);
    }
    sb->len += n;
    sb->data[sb->len] = '\0';
    return 0;
}

int kp_strbuf_vappendf(struct kp_strbuf *sb, const char *fmt, va_list ap)
{
    va_list ap2;
    size_t room;
    int n, r;

    room = sb->cap > sb->len ? sb->cap - sb->len : 0;
    va_copy(ap2, ap);
    n = vsnprintf(room > 0 ? sb->data + sb->len : NULL, room, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        r = -EINVAL;
        goto out;
    }
    if ((size_t) n >= room) {
        /* It did not fit (the partial write sits past len, so nothing changed). */
        r = kp_strbuf_reserve(sb, (size_t) n);
        if (r != 0) {
            if (sb->data != NULL) {
                sb->data[sb->len] = '\0';
            }
            goto out;
        }
        va_copy(ap2, ap);
        n = vsnprintf(sb->data + sb->len, sb->cap - sb->len, fmt, ap2);
        va_end(ap2);
        if (n < 0) {
            sb->data[sb->len] = '\0';
            r = -EINVAL;
            goto out;
        }
    }
    sb->len += (size_t) n;
    r = 0;
out:
    return r;
}

int kp_strbuf_appendf(struct kp_strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = kp_strbuf_vappendf(sb, fmt, ap);
    va_end(ap);
    return r;
}
