#include "kp_str.h"

#include <string.h>

void kp_strlcpy(char *dst, size_t cap, const char *src)
{
    if (cap == 0) {
        return;
    }
    size_t n = src != NULL ? strlen(src) : 0;
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char) src[n] & 0xc0) == 0x80) {
            n--; /* do not cut a UTF-8 sequence */
        }
    }
    if (n > 0) {
        memcpy(dst, src, n);
    }
    dst[n] = '\0';
}
