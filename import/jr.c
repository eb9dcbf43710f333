/*
 * jr: the importer's pull JSON tokenizer (jr.h). It never holds more than one string (bounded
 * by max_string_bytes) and one number token; nesting is bounded by max_depth (skipping
 * recurses at most that deep). Positions (line, column, byte) are kept for errors: lines are
 * counted in whitespace, the only place a raw newline may be. Speed: string ends are found
 * eight bytes at a time (str_span) and plain numbers are read in one pass over the buffer;
 * integers up to 18 digits skip strtoll.
 */
#include "jr.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_json.h"

int jr_fail(struct jr *j, const char *fmt, ...)
{
    char msg[512];
    char where[64] = "";
    va_list ap;

    if (j->err != 0) {
        return j->err;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (j->event >= 0) {
        snprintf(where, sizeof(where), ", traceEvents[%" PRId64 "]", j->event);
    }
    kp_errbuf_set(j->errbuf, j->errlen,
                  "line %" PRIu64 ", column %" PRIu64 " (byte %" PRIu64 ")%s: %s", j->tok_line,
                  j->tok_col, j->tok_off, where, msg);
    j->err = KP_EPROTO;
    return j->err;
}

/* Refills the buffer. Returns 1 if bytes are available, 0 at the end, or the error. */
int jr_fill(struct jr *j)
{
    ssize_t n;

    if (j->err != 0) {
        return j->err;
    }
    if (j->eof) {
        return 0;
    }
    j->off += j->len;
    j->pos = 0;
    j->len = 0;
    char msg[512] = "";

    n = j->read(j->read_ud, j->buf, JR_CHUNK, msg, sizeof(msg));
    if (n < 0) {
        jr_mark(j);
        jr_fail(j, "%s", msg[0] != '\0' ? msg : kp_strerror((int) n));
        j->err = (int) n;
        return j->err;
    }
    if (n == 0) {
        j->eof = true;
        return 0;
    }
    j->len = (size_t) n;
    return 1;
}

const char *jr_what(int c)
{
    static __thread char b[16];

    if (c == -1) {
        return "the end of the input";
    }
    if (c >= 0x20 && c < 0x7f) {
        snprintf(b, sizeof(b), "'%c'", c);
    }
    else {
        snprintf(b, sizeof(b), "byte 0x%02x", (unsigned) c & 0xff);
    }
    return b;
}

int jr_unexpected(struct jr *j, int c, const char *expected)
{
    if (c == -2) {
        return j->err;
    }
    if (c == -1) {
        return jr_fail(j, "the input ends early (truncated file?): expected %s", expected);
    }
    return jr_fail(j, "expected %s, got %s", expected, jr_what(c));
}

static int jr_str_grow(struct jr *j, size_t need)
{
    size_t cap;
    char *p;

    if (need > j->smax) {
        return jr_fail(j, "a string longer than %zu bytes (max_string_bytes)", j->smax);
    }
    if (need + 1 <= j->scap) {
        return 0;
    }
    cap = j->scap ? j->scap : 256;
    while (cap < need + 1) {
        cap *= 2;
    }
    if ((p = realloc(j->str, cap)) == NULL) {
        j->err = -ENOMEM;
        return j->err;
    }
    j->str = p;
    j->scap = cap;
    return 0;
}

static int jr_put_utf8(struct jr *j, uint32_t cp)
{
    char u[4];
    size_t n;

    if (cp == 0) {
        cp = 0xfffd; /* NUL cannot be stored: names are C strings */
    }
    if (cp < 0x80) {
        u[0] = (char) cp;
        n = 1;
    }
    else if (cp < 0x800) {
        u[0] = (char) (0xc0 | (cp >> 6));
        u[1] = (char) (0x80 | (cp & 0x3f));
        n = 2;
    }
    else if (cp < 0x10000) {
        u[0] = (char) (0xe0 | (cp >> 12));
        u[1] = (char) (0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char) (0x80 | (cp & 0x3f));
        n = 3;
    }
    else {
        u[0] = (char) (0xf0 | (cp >> 18));
        u[1] = (char) (0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char) (0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char) (0x80 | (cp & 0x3f));
        n = 4;
    }
    if (jr_str_grow(j, j->slen + n) != 0) {
        return j->err;
    }
    memcpy(j->str + j->slen, u, n);
    j->slen += n;
    return 0;
}

static int jr_hex4(struct jr *j, uint32_t *out)
{
    uint32_t v = 0;

    for (int i = 0; i < 4; i++) {
        int c = jr_peekc(j);

        if (c >= '0' && c <= '9') {
            v = v * 16 + (uint32_t) (c - '0');
        }
        else if (c >= 'a' && c <= 'f') {
            v = v * 16 + (uint32_t) (c - 'a' + 10);
        }
        else if (c >= 'A' && c <= 'F') {
            v = v * 16 + (uint32_t) (c - 'A' + 10);
        }
        else {
            return jr_unexpected(j, c, "4 hex digits after \\u");
        }
        j->pos++;
    }
    *out = v;
    return 0;
}

/* Index of the first '"', '\\' or control byte in p[0..n), or n. Eight bytes at a time: a
 * byte of w is flagged if it is 0 after xor with the quote or the backslash, or below 0x20
 * (the classic has-less-than word trick); flags above the first true one may be false, so
 * the lowest flagged byte is the answer (little-endian). */
static inline size_t str_span(const unsigned char *p, size_t n)
{
    size_t i = 0;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;

    for (; i + 8 <= n; i += 8) {
        uint64_t w, q, b, t;

        memcpy(&w, p + i, 8);
        q = w ^ (ones * '"');
        b = w ^ (ones * '\\');
        t = ((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w);
        t &= highs;
        if (t != 0) {
            return i + (size_t) (__builtin_ctzll(t) >> 3);
        }
    }
#endif
    for (; i < n; i++) {
        unsigned char c = p[i];

        if (c == '"' || c == '\\' || c < 0x20) {
            break;
        }
    }
    return i;
}

/* Reads a string token (the next byte must be '"') into j->str. Raw bytes are copied as they
 * are (UTF-8 is checked where names are stored); escapes are decoded. */
int jr_string(struct jr *j)
{
    j->slen = 0;
    j->pos++; /* the opening quote */
    for (;;) {
        size_t start = j->pos, i = j->pos + str_span(j->buf + j->pos, j->len - j->pos);

        if (i > start) {
            if (jr_str_grow(j, j->slen + (i - start)) != 0) {
                return j->err;
            }
            memcpy(j->str + j->slen, j->buf + start, i - start);
            j->slen += i - start;
            j->pos = i;
        }
        int c = jr_peekc(j);
        if (c < 0) {
            return jr_unexpected(j, c, "the end of a string ('\"')");
        }
        if (c == '"') {
            j->pos++;
            break;
        }
        if (c < 0x20) {
            return jr_fail(j, "a raw control character (0x%02x) inside a string", (unsigned) c);
        }
        if (c == '\\') {
            uint32_t cp, lo;
            int e;

            j->pos++;
            e = jr_peekc(j);
            if (e < 0) {
                return jr_unexpected(j, e, "an escape after '\\'");
            }
            j->pos++;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                cp = (uint32_t) e;
                break;
            case 'b':
                cp = '\b';
                break;
            case 'f':
                cp = '\f';
                break;
            case 'n':
                cp = '\n';
                break;
            case 'r':
                cp = '\r';
                break;
            case 't':
                cp = '\t';
                break;
            case 'u':
                if (jr_hex4(j, &cp) != 0) {
                    return j->err;
                }
                if (cp >= 0xd800 && cp < 0xdc00) {
                    if (jr_peekc(j) == '\\') {
                        j->pos++;
                        if (jr_peekc(j) != 'u') {
                            return jr_fail(j, "a lone UTF-16 surrogate in a \\u escape");
                        }
                        j->pos++;
                        if (jr_hex4(j, &lo) != 0) {
                            return j->err;
                        }
                        if (lo < 0xdc00 || lo > 0xdfff) {
                            return jr_fail(j, "a lone UTF-16 surrogate in a \\u escape");
                        }
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    }
                    else {
                        cp = 0xfffd;
                    }
                }
                else if (cp >= 0xdc00 && cp <= 0xdfff) {
                    cp = 0xfffd;
                }
                break;
            default:
                return jr_fail(j, "an invalid escape '\\%c' in a string", e);
            }
            if (jr_put_utf8(j, cp) != 0) {
                return j->err;
            }
        }
    }
    if (jr_str_grow(j, j->slen) != 0) {
        return j->err;
    }
    j->str[j->slen] = '\0';
    return 0;
}

/* Reads a number token (strict JSON grammar) into j->num. */
int jr_number(struct jr *j)
{
    int c;
    size_t digits;

    j->nlen = 0;
    {
        /* fast path: -?int(.digits)? ending inside the buffer, no exponent */
        const unsigned char *p = j->buf + j->pos, *q = p, *end = j->buf + j->len, *d;

        if (q < end && *q == '-') {
            q++;
        }
        if (q < end && *q == '0') {
            q++;
        }
        else if (q < end && *q >= '1' && *q <= '9') {
            while (q < end && *q >= '0' && *q <= '9') {
                q++;
            }
        }
        else {
            goto slow;
        }
        if (q < end && *q == '.') {
            d = ++q;
            while (q < end && *q >= '0' && *q <= '9') {
                q++;
            }
            if (q == d) {
                goto slow;
            }
        }
        if (q >= end || *q == 'e' || *q == 'E' || (size_t) (q - p) + 2 > sizeof(j->num)) {
            goto slow;
        }
        j->nlen = (size_t) (q - p);
        memcpy(j->num, p, j->nlen);
        j->num[j->nlen] = '\0';
        j->pos += j->nlen;
        return 0;
    }
slow:
#define NUM_TAKE()                                                                        \
    do {                                                                                  \
        if (j->nlen + 1 >= sizeof(j->num)) {                                              \
            return jr_fail(j, "a number longer than %zu characters", sizeof(j->num) - 2); \
        }                                                                                 \
        j->num[j->nlen++] = (char) c;                                                     \
        j->pos++;                                                                         \
    } while (0)
    c = jr_peekc(j);
    if (c == '-') {
        NUM_TAKE();
        c = jr_peekc(j);
    }
    if (c == '0') {
        NUM_TAKE();
        c = jr_peekc(j);
    }
    else if (c >= '1' && c <= '9') {
        while (c >= '0' && c <= '9') {
            NUM_TAKE();
            c = jr_peekc(j);
        }
    }
    else {
        return jr_unexpected(j, c, "a digit");
    }
    if (c == '.') {
        NUM_TAKE();
        c = jr_peekc(j);
        digits = 0;
        while (c >= '0' && c <= '9') {
            NUM_TAKE();
            c = jr_peekc(j);
            digits++;
        }
        if (digits == 0) {
            return jr_unexpected(j, c, "a digit after '.'");
        }
    }
    if (c == 'e' || c == 'E') {
        NUM_TAKE();
        c = jr_peekc(j);
        if (c == '+' || c == '-') {
            NUM_TAKE();
            c = jr_peekc(j);
        }
        digits = 0;
        while (c >= '0' && c <= '9') {
            NUM_TAKE();
            c = jr_peekc(j);
            digits++;
        }
        if (digits == 0) {
            return jr_unexpected(j, c, "a digit in the exponent");
        }
    }
#undef NUM_TAKE
    if (c == -2) {
        return j->err;
    }
    j->num[j->nlen] = '\0';
    return 0;
}

int jr_literal(struct jr *j, const char *lit)
{
    for (const char *p = lit; *p != '\0'; p++) {
        int c = jr_peekc(j);

        if (c != *p) {
            return jr_unexpected(j, c, lit);
        }
        j->pos++;
    }
    return 0;
}

static int jr_enter(struct jr *j)
{
    if (++j->depth > j->max_depth) {
        return jr_fail(j, "nesting deeper than %u levels", j->max_depth);
    }
    return 0;
}

/* After a value inside a container: consumes ',' and returns 1, or the closer and returns
 * 0. */
static int jr_after(struct jr *j, char closer)
{
    int c = jr_ws(j);

    if (c == ',') {
        j->pos++;
        return 1;
    }
    if (c == closer) {
        j->pos++;
        j->depth--;
        return 0;
    }
    return jr_unexpected(j, c,
                         closer == '}' ? "',' or '}' in an object" : "',' or ']' in an array");
}

/* Consumes the opener ("'{'" or "'['") of a container. */
static int jr_begin(struct jr *j, bool *first, const char *opener)
{
    int c = jr_ws(j);

    if (c != opener[1]) {
        return jr_unexpected(j, c, opener);
    }
    j->pos++;
    *first = true;
    return jr_enter(j);
}

/* Object iteration. Call jr_obj_begin at '{' and then jr_obj_key until it returns 0: each 1
 * leaves the key in j->str and the position at the value. */
int jr_obj_begin(struct jr *j, bool *first)
{
    return jr_begin(j, first, "'{'");
}

int jr_obj_key(struct jr *j, bool *first)
{
    int c;

    if (*first) {
        *first = false;
        c = jr_ws(j);
        if (c == '}') {
            j->pos++;
            j->depth--;
            return 0;
        }
    }
    else {
        int rc = jr_after(j, '}');

        if (rc <= 0) {
            return rc;
        }
        c = jr_ws(j);
    }
    if (c != '"') {
        return jr_unexpected(j, c, "a key (a string) in an object");
    }
    if (jr_string(j) != 0) {
        return j->err;
    }
    c = jr_ws(j);
    if (c != ':') {
        return jr_unexpected(j, c, "':' after a key");
    }
    j->pos++;
    return 1;
}

int jr_arr_begin(struct jr *j, bool *first)
{
    return jr_begin(j, first, "'['");
}

/* Returns 1 if an element follows (position at it), 0 after ']'. */
int jr_arr_next(struct jr *j, bool *first)
{
    if (*first) {
        *first = false;
        int c = jr_ws(j);

        if (c == ']') {
            j->pos++;
            j->depth--;
            return 0;
        }
        return c < 0 ? jr_unexpected(j, c, "a value or ']'") : 1;
    }
    return jr_after(j, ']');
}

static int jr_skip_container(struct jr *j, int c)
{
    bool first;
    int rc;

    if (c == '{') {
        if (jr_obj_begin(j, &first) != 0) {
            return j->err;
        }
        while ((rc = jr_obj_key(j, &first)) == 1) {
            if (jr_skip(j) != 0) {
                return j->err;
            }
        }
        return rc;
    }
    if (jr_arr_begin(j, &first) != 0) {
        return j->err;
    }
    while ((rc = jr_arr_next(j, &first)) == 1) {
        if (jr_skip(j) != 0) {
            return j->err;
        }
    }
    return rc;
}

/* Skips one value of any type. Recursion is bounded by max_depth. */
int jr_skip(struct jr *j)
{
    int c = jr_ws(j);

    switch (c) {
    case '{':
    case '[':
        return jr_skip_container(j, c);
    case '"':
        return jr_string(j);
    case 't':
        return jr_literal(j, "true");
    case 'f':
        return jr_literal(j, "false");
    case 'n':
        return jr_literal(j, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            return jr_number(j);
        }
        return jr_unexpected(j, c, "a value");
    }
}

/* Appends s as a Python string literal ('...'). */
static int py_str(struct kp_strbuf *sb, const char *s, size_t n)
{
    int rc = kp_strbuf_putc(sb, '\'');

    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (s[i] == '\'' || s[i] == '\\') {
            rc = kp_strbuf_putc(sb, '\\');
        }
        if (rc == 0) {
            rc = kp_strbuf_putc(sb, s[i]);
        }
    }
    return rc == 0 ? kp_strbuf_putc(sb, '\'') : rc;
}

/* Reads one value and appends it to sb as Python's str() would print it ("[[32, 128], []]",
 * "['float', 'Scalar']", None, True), or (json) as JSON text with the same separators. */
int jr_capture_as(struct jr *j, struct kp_strbuf *sb, bool json)
{
    static const char *const lits[2][3] = { { "True", "False", "None" },
                                            { "true", "false", "null" } };
    int c = jr_ws(j), rc = 0;
    bool first;

    switch (c) {
    case '[':
    case '{':
        if (c == '[' ? jr_arr_begin(j, &first) : jr_obj_begin(j, &first)) {
            return j->err;
        }
        rc = kp_strbuf_putc(sb, (char) c);
        for (size_t n = 0; rc == 0; n++) {
            int more = c == '[' ? jr_arr_next(j, &first) : jr_obj_key(j, &first);

            if (more < 0) {
                return more;
            }
            if (more == 0) {
                break;
            }
            if (n > 0) {
                rc = kp_strbuf_append(sb, ", ", 2);
            }
            if (rc == 0 && c == '{') {
                rc = json ? kp_json_append(sb, j->str, j->slen) : py_str(sb, j->str, j->slen);
                if (rc == 0) {
                    rc = kp_strbuf_append(sb, ": ", 2);
                }
            }
            if (rc == 0 && jr_capture_as(j, sb, json) != 0) {
                return j->err;
            }
        }
        if (rc == 0) {
            rc = kp_strbuf_putc(sb, c == '[' ? ']' : '}');
        }
        break;
    case '"':
        if (jr_string(j) != 0) {
            return j->err;
        }
        rc = json ? kp_json_append(sb, j->str, j->slen) : py_str(sb, j->str, j->slen);
        break;
    case 't':
        if (jr_literal(j, "true") != 0) {
            return j->err;
        }
        rc = kp_strbuf_append_str(sb, lits[json][0]);
        break;
    case 'f':
        if (jr_literal(j, "false") != 0) {
            return j->err;
        }
        rc = kp_strbuf_append_str(sb, lits[json][1]);
        break;
    case 'n':
        if (jr_literal(j, "null") != 0) {
            return j->err;
        }
        rc = kp_strbuf_append_str(sb, lits[json][2]);
        break;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            if (jr_number(j) != 0) {
                return j->err;
            }
            rc = kp_strbuf_append(sb, j->num, j->nlen);
            break;
        }
        return jr_unexpected(j, c, "a value");
    }
    if (rc == KP_ETOOBIG && !json) { /* json: the caller's buffer, which it names */
        return jr_fail(j, "an event's strings and lists exceed %u bytes", EV_MAX_BYTES);
    }
    if (rc != 0) {
        j->err = rc;
    }
    return rc;
}

int jr_capture(struct jr *j, struct kp_strbuf *sb)
{
    return jr_capture_as(j, sb, false);
}

/* ------------------------------------------------------------------------------------------ */
/* Numbers */

/* num_us_to_ns of a number with an exponent. */
static int num_exp_to_ns(const char *s, int64_t *out)
{
    long double d = strtold(s, NULL) * 1000.0L;

    if (!(d > -9.2e18L && d < 9.2e18L)) {
        return -ERANGE;
    }
    *out = (int64_t) (d < 0 ? d - 0.5L : d + 0.5L); /* round half away from zero */
    return 0;
}

/* Parses the JSON number text s (µs) into ns, rounded half away from zero, without floating
 * point for the common forms. Returns 0 or -ERANGE. */
int num_us_to_ns(const char *s, int64_t *out)
{
    const char *p = s;
    bool neg = false;
    int64_t v = 0;
    int fd = 0;

    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX / 1000 - 9) / 10) {
            return strpbrk(s, "eE") != NULL ? num_exp_to_ns(s, out) : -ERANGE;
        }
        v = v * 10 + (*p - '0');
    }
    v *= 1000;
    if (*p == '.') {
        int mult = 100;

        for (p++; *p >= '0' && *p <= '9'; p++, fd++) {
            if (fd < 3) {
                v += (*p - '0') * mult;
                mult /= 10;
            }
            else if (fd == 3 && *p >= '5') {
                v += 1;
            }
        }
    }
    if (*p == 'e' || *p == 'E') {
        return num_exp_to_ns(s, out);
    }
    *out = neg ? -v : v;
    return 0;
}

/* Text (a JSON number, or a string from an old trace) to int64: integral text exactly,
 * otherwise truncated. "N/A", "inf", "" and other non-numbers give NUM_NAN. */
enum num_rc text_to_i64(const char *s, int64_t *out)
{
    char *end;

    {
        /* fast path: -?[0-9]{1,18}, which cannot overflow */
        const char *p = s + (*s == '-');
        int64_t v = 0;
        int n = 0;

        for (; *p >= '0' && *p <= '9' && n < 18; p++, n++) {
            v = v * 10 + (*p - '0');
        }
        if (*p == '\0' && n > 0) {
            *out = *s == '-' ? -v : v;
            return NUM_OK;
        }
    }
    while (*s == ' ') {
        s++;
    }
    if (*s == '\0') {
        return NUM_NAN;
    }
    if (strpbrk(s, ".eE") == NULL) {
        long long v;

        errno = 0;
        v = strtoll(s, &end, 10);
        if (end == s || *end != '\0') {
            return NUM_NAN;
        }
        if (errno == ERANGE) {
            return NUM_RANGE;
        }
        *out = v;
        return NUM_OK;
    }
    double d = strtod(s, &end);
    if (end == s || *end != '\0' || d != d) { /* d != d: NaN (no libm) */
        return NUM_NAN;
    }
    if (!(d > -9.2e18 && d < 9.2e18)) {
        return NUM_RANGE;
    }
    *out = (int64_t) d;
    return NUM_OK;
}
