/*
 * kp_str: small string helpers on plain char arrays, with no allocation and libc only (the
 * injection library, agent/inject, compiles this file in; it links nothing of kp_common).
 */
#ifndef KP_STR_H
#define KP_STR_H

#include <stddef.h>

/*
 * Copies the NUL-terminated src (NULL: "") into dst of cap bytes, always terminated when
 * cap > 0, truncating at a UTF-8 character boundary. Async-signal-safe.
 */
void kp_strlcpy(char *dst, size_t cap, const char *src);

/*
 * One item of a comma-separated list ("a, b,c"): the item at p, up to the next ',' or the end,
 * without the blanks (spaces, tabs) around it, into name (cap > 0 bytes; a longer item is cut
 * to cap - 1 bytes). Returns where the next item starts (after the ','), or NULL when this
 * item was the last.
 */
const char *kp_str_list_item(const char *p, char *name, size_t cap);

#endif
