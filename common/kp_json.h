/*
 * The one JSON string writer: every JSON string kprof prints or stores goes through here.
 *
 * Contract (the same for every entry point):
 * - Input is s[0..n) bytes for the *n functions (NUL bytes inside are data and come out as
 *   \u0000) and a NUL-terminated string for kp_json_fputs(); s must not be NULL (n == 0 may
 *   pass NULL).
 * - '"' and '\\' get a backslash; '\n', '\r' and '\t' their short forms; every other byte
 *   below 0x20 and DEL (0x7f) is written as \u00XX with lowercase hex.
 * - Valid UTF-8 (shortest form, no surrogates, at most U+10FFFF) is copied unchanged, so
 *   non-ASCII text stays readable. Each byte that does not start a valid sequence becomes
 *   \ufffd (U+REPLACEMENT CHARACTER), one per byte, so the output is always valid JSON
 *   whatever the input bytes.
 * - '/' and everything else is copied as it is.
 * The quoted writers add the surrounding quotes; kp_json_append_chars() writes the contents
 * only (for a string assembled from pieces: split pieces only between UTF-8 sequences).
 *
 * kp_json_plain_len() and kp_json_escape() are the shared core, for writers with their own
 * output buffer (analyzer/export.c): copy plain_len bytes, then escape the one byte after
 * them, and go on after it.
 */
#ifndef KP_JSON_H
#define KP_JSON_H

#include <stddef.h>
#include <stdio.h>

#include "kp_strbuf.h"

/* Longest escape kp_json_escape() writes ("\ufffd", "\u001f"). */
#define KP_JSON_ESCAPE_MAX 6

/* Length (2..4) of the valid UTF-8 sequence that starts at s[0], a byte >= 0x80 (n > 0), or
 * 0 if none does: an overlong form, a surrogate, a value past U+10FFFF, a stray continuation
 * byte, or a sequence cut short by n. The one UTF-8 check of this writer and kp_utf8_valid(). */
size_t kp_utf8_seq_len(const char *s, size_t n);

/* Returns how many leading bytes of s[0..n) go out unchanged (n when none needs escaping). */
size_t kp_json_plain_len(const char *s, size_t n);

/* Writes the escape for byte c, one at which kp_json_plain_len() stopped, to esc (no NUL)
 * and returns its length (2 or 6). The escape stands for that one input byte. */
size_t kp_json_escape(unsigned char c, char esc[KP_JSON_ESCAPE_MAX]);

/* Writes s[0..n) as a quoted JSON string to f. Errors are left in ferror(f). */
void kp_json_fput(FILE *f, const char *s, size_t n);

/* Writes the NUL-terminated s as a quoted JSON string to f. */
void kp_json_fputs(FILE *f, const char *s);

/* Appends s[0..n) as a quoted JSON string. Returns 0, -ENOMEM or KP_ETOOBIG (then sb may
 * hold part of the string). */
int kp_json_append(struct kp_strbuf *sb, const char *s, size_t n);

/* Appends the escaped contents of s[0..n) without quotes. Same returns as kp_json_append(). */
int kp_json_append_chars(struct kp_strbuf *sb, const char *s, size_t n);

#endif
