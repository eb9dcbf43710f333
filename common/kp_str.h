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

#endif
