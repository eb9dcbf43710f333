/*
 * jr: the pull JSON tokenizer of the Kineto importer (kp_kineto.c): reads the JSON through
 * the caller's read callback in JR_CHUNK chunks, one token at a time, with no DOM. Every
 * string is bounded (smax), nesting is bounded (max_depth). An error is sticky (j->err) and
 * its message names the line, column and byte of the token and the event index (j->event).
 * Internal to import/.
 */
#ifndef KP_IMPORT_JR_H
#define KP_IMPORT_JR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kp_kineto.h"

struct kp_strbuf;

#define JR_CHUNK     (256u * 1024u)
#define EV_MAX_BYTES (8u << 20) /* strings of one event together */

struct jr {
    kp_kineto_read_cb *read;
    void *read_ud;
    kp_kineto_progress_cb *progress;
    void *progress_ud;
    unsigned char *buf;
    size_t len, pos;
    bool eof;
    uint64_t off;        /* bytes before buf[0] */
    uint64_t line;       /* 1-based */
    uint64_t line_start; /* offset of the current line's first byte */
    uint64_t tok_off, tok_line, tok_col;
    int64_t event; /* index into traceEvents while inside one, else -1 */
    char *str;     /* the last string read, NUL-terminated */
    size_t slen, scap, smax;
    char num[72];
    size_t nlen;
    uint32_t depth, max_depth;
    int err; /* sticky */
    char *errbuf;
    size_t errlen;
};

/* Sets the parse's error (KP_EPROTO) with the token's position and the event index in front
 * of the message, unless an error is set already. Returns the error. */
__attribute__((format(printf, 2, 3))) int jr_fail(struct jr *j, const char *fmt, ...);

/* Reads the next chunk. Returns 1 (more input), 0 (the end) or a negative code. */
int jr_fill(struct jr *j);

/* A character for messages: "'x'", "end of input", ... */
const char *jr_what(int c);

/* Fails with "expected <expected>, found <c>". */
int jr_unexpected(struct jr *j, int c, const char *expected);

/* Reads a string into j->str (NUL-terminated, j->slen bytes). Returns 0 or an error. */
int jr_string(struct jr *j);

/* Reads a number token into j->num (j->nlen bytes). Returns 0 or an error. */
int jr_number(struct jr *j);

/* Reads the literal lit ("true", "false", "null"). */
int jr_literal(struct jr *j, const char *lit);

/* Objects and arrays: begin consumes the opener (*first set); obj_key returns 1 with the next
 * key in j->str and the position at its value, or 0 past the '}'; arr_next returns 1 with the
 * position at the next element, or 0 past the ']'. Errors: negative. */
int jr_obj_begin(struct jr *j, bool *first);
int jr_obj_key(struct jr *j, bool *first);
int jr_arr_begin(struct jr *j, bool *first);
int jr_arr_next(struct jr *j, bool *first);

/* Skips one value of any kind. */
int jr_skip(struct jr *j);

/* Appends the next value to sb as text: JSON (json true), else as Python prints it (the
 * shapes and dtypes columns); jr_capture: the latter. */
int jr_capture_as(struct jr *j, struct kp_strbuf *sb, bool json);
int jr_capture(struct jr *j, struct kp_strbuf *sb);

/* The JSON number text s (µs) to ns, rounded half away from zero. Returns 0 or -ERANGE. */
int num_us_to_ns(const char *s, int64_t *out);

enum num_rc {
    NUM_OK = 0,
    NUM_NAN = 1,
    NUM_RANGE = 2
};

/* Text (a JSON number, or a string from an old trace) to int64 (see jr.c). */
enum num_rc text_to_i64(const char *s, int64_t *out);

static inline void jr_mark(struct jr *j)
{
    j->tok_off = j->off + j->pos;
    j->tok_line = j->line;
    j->tok_col = j->tok_off - j->line_start + 1;
}

/* Next byte without consuming it, -1 at the end, or -2 on a read error. */
static inline int jr_peekc(struct jr *j)
{
    if (j->pos < j->len) {
        return j->buf[j->pos];
    }
    int rc = jr_fill(j);
    if (rc <= 0) {
        return rc == 0 ? -1 : -2;
    }
    return j->buf[j->pos];
}

/* Skips whitespace; returns the next significant byte (not consumed), -1 at the end, -2 on
 * a read error. Marks the token position. */
static inline int jr_ws(struct jr *j)
{
    for (;;) {
        while (j->pos < j->len) {
            unsigned char c = j->buf[j->pos];

            if (c == ' ' || c == '\t' || c == '\r') {
                j->pos++;
            }
            else if (c == '\n') {
                j->pos++;
                j->line++;
                j->line_start = j->off + j->pos;
            }
            else {
                jr_mark(j);
                return c;
            }
        }
        int rc = jr_fill(j);
        if (rc <= 0) {
            jr_mark(j);
            return rc == 0 ? -1 : -2;
        }
    }
}

#endif
