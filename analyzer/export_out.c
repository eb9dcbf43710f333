/* kp_export's writer: JSON into a buffer flushed (gzipped with zlib when asked) to the sink, and
 * Python literals back to JSON (export_int.h). */
#include "export_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_json.h"
#include "kp_strbuf.h"

/* ------------------------------------------------------------------------------------------ */
/* Output: a buffered writer over a file descriptor or zlib */

/* Compresses (gz) what the buffer holds and hands the result on; with finish, ends the gzip
 * stream. */
void kp__export_out_deflate(struct xout *o, bool finish)
{
    o->z.next_in = (Bytef *) o->buf;
    o->z.avail_in = (uInt) o->len;
    for (;;) {
        int zrc;

        o->z.next_out = (Bytef *) o->zbuf;
        o->z.avail_out = EXPORT_OUT_BUF;
        zrc = deflate(&o->z, finish ? Z_FINISH : Z_NO_FLUSH);
        if (zrc == Z_STREAM_ERROR) {
            o->err = -EIO;
            return;
        }
        if (o->z.avail_out < EXPORT_OUT_BUF) {
            int rc = o->sink(o->ud, o->zbuf, EXPORT_OUT_BUF - o->z.avail_out);

            if (rc != 0) {
                o->err = rc;
                return;
            }
        }
        if (finish ? zrc == Z_STREAM_END : o->z.avail_out != 0) {
            return;
        }
    }
}

void kp__export_out_flush(struct xout *o)
{
    if (o->err != 0 || o->len == 0) {
        o->len = 0;
        return;
    }
    if (o->gz) {
        kp__export_out_deflate(o, false);
    }
    else {
        int rc = o->sink(o->ud, o->buf, o->len);

        if (rc != 0) {
            o->err = rc;
        }
    }
    o->bytes += o->len;
    o->len = 0;
}

/* Slow path of kp__export_out_put: flushes, then copies p (in pieces when it is bigger than the
 * buffer). */
__attribute__((noinline)) void kp__export_out_put_slow(struct xout *o, const char *p, size_t n)
{
    kp__export_out_flush(o);
    while (n > 0) {
        size_t k = n < EXPORT_OUT_BUF ? n : EXPORT_OUT_BUF;

        memcpy(o->buf, p, k);
        o->len = k;
        p += k;
        n -= k;
        if (n > 0) {
            kp__export_out_flush(o);
        }
    }
}

/* A JSON string of s[0..n) (kp_json.h), straight into the output buffer. */
void kp__export_out_jstrn(struct xout *o, const char *s, size_t n)
{
    char esc[KP_JSON_ESCAPE_MAX];

    kp__export_out_putc(o, '"');
    while (n > 0) {
        size_t k = kp_json_plain_len(s, n);

        kp__export_out_put(o, s, k);
        if (k == n) {
            break;
        }
        kp__export_out_put(o, esc, kp_json_escape((unsigned char) s[k], esc));
        s += k + 1;
        n -= k + 1;
    }
    kp__export_out_putc(o, '"');
}

void kp__export_out_jstr(struct xout *o, const char *s)
{
    kp__export_out_jstrn(o, s, strlen(s));
}

/* ------------------------------------------------------------------------------------------ */
/* Python literal (as import stores Input Dims / Input type) back to JSON */

struct pylit {
    const char *p, *end;
    struct kp_strbuf *out;
    int depth;
};

static void py_ws(struct pylit *y)
{
    while (y->p < y->end && (*y->p == ' ' || *y->p == '\t' || *y->p == '\n')) {
        y->p++;
    }
}

static int py_value(struct pylit *y);

static int py_string(struct pylit *y)
{
    char q = *y->p++;
    int rc = kp_strbuf_putc(y->out, '"');

    while (rc == 0) {
        const char *run = y->p;

        /* a run of plain bytes: backslash and quote are ASCII, so a run ends between UTF-8
         * sequences */
        while (y->p < y->end && *y->p != q && *y->p != '\\') {
            y->p++;
        }
        rc = kp_json_append_chars(y->out, run, (size_t) (y->p - run));
        if (rc != 0) {
            return rc;
        }
        if (y->p >= y->end) {
            return -EINVAL;
        }
        if (*y->p == q) {
            break;
        }
        if (++y->p >= y->end) {
            return -EINVAL;
        }
        if (*y->p != '\'' && *y->p != '\\' && *y->p != '"') { /* py_str escapes only ' and \ */
            return -EINVAL;
        }
        rc = kp_json_append_chars(y->out, y->p++, 1);
    }
    if (rc != 0) {
        return rc;
    }
    y->p++;
    return kp_strbuf_putc(y->out, '"');
}

static int py_container(struct pylit *y)
{
    char open = *y->p++, close = open == '[' ? ']' : '}';
    int rc;
    bool first = true;

    if (++y->depth > 64) {
        return -EINVAL;
    }
    if ((rc = kp_strbuf_putc(y->out, open)) != 0) {
        return rc;
    }
    for (;;) {
        py_ws(y);
        if (y->p >= y->end) {
            return -EINVAL;
        }
        if (*y->p == close) {
            y->p++;
            break;
        }
        if (!first) {
            if (*y->p != ',') {
                return -EINVAL;
            }
            y->p++;
            py_ws(y);
            if ((rc = kp_strbuf_append(y->out, ", ", 2)) != 0) {
                return rc;
            }
        }
        first = false;
        if (open == '{') {
            if (y->p >= y->end || (*y->p != '\'' && *y->p != '"')) {
                return -EINVAL;
            }
            if ((rc = py_string(y)) != 0) {
                return rc;
            }
            py_ws(y);
            if (y->p >= y->end || *y->p != ':') {
                return -EINVAL;
            }
            y->p++;
            if ((rc = kp_strbuf_append(y->out, ": ", 2)) != 0) {
                return rc;
            }
        }
        if ((rc = py_value(y)) != 0) {
            return rc;
        }
    }
    y->depth--;
    return kp_strbuf_putc(y->out, close);
}

static bool py_word(struct pylit *y, const char *w)
{
    size_t n = strlen(w);

    if ((size_t) (y->end - y->p) >= n && memcmp(y->p, w, n) == 0) {
        y->p += n;
        return true;
    }
    return false;
}

static int py_value(struct pylit *y)
{
    py_ws(y);
    if (y->p >= y->end) {
        return -EINVAL;
    }
    switch (*y->p) {
    case '[':
    case '{':
        return py_container(y);
    case '\'':
    case '"':
        return py_string(y);
    default:
        break;
    }
    if (py_word(y, "True")) {
        return kp_strbuf_append_str(y->out, "true");
    }
    if (py_word(y, "False")) {
        return kp_strbuf_append_str(y->out, "false");
    }
    if (py_word(y, "None")) {
        return kp_strbuf_append_str(y->out, "null");
    }
    /* a JSON number, as captured */
    const char *s = y->p;

    if (y->p < y->end && *y->p == '-') {
        y->p++;
    }
    if (y->p >= y->end || *y->p < '0' || *y->p > '9') {
        return -EINVAL;
    }
    while (y->p < y->end && ((*y->p >= '0' && *y->p <= '9') || *y->p == '.' || *y->p == 'e' ||
                             *y->p == 'E' || *y->p == '+' || *y->p == '-')) {
        y->p++;
    }
    return kp_strbuf_append(y->out, s, (size_t) (y->p - s));
}

/* Writes the stored Python literal s as its JSON value; text that is not one (from another
 * producer) is written as a JSON string. */
void kp__export_out_pylit(struct xout *o, struct kp_strbuf *tmp, const char *s)
{
    struct pylit y = { s, s + strlen(s), tmp, 0 };

    kp_strbuf_reset(tmp);
    if (py_value(&y) == 0 && (py_ws(&y), y.p == y.end)) {
        kp__export_out_put(o, tmp->data, tmp->len);
        return;
    }
    kp__export_out_jstr(o, s);
}
