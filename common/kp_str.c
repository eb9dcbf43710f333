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

const char *kp_str_list_item(const char *p, char *name, size_t cap)
{
    const char *end = strchr(p, ',');
    size_t len = end != NULL ? (size_t) (end - p) : strlen(p);

    while (len > 0 && (*p == ' ' || *p == '\t')) {
        p++;
        len--;
    }
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) {
        len--;
    }
    if (len >= cap) {
        len = cap - 1;
    }
    memcpy(name, p, len);
    name[len] = '\0';
    return end != NULL ? end + 1 : NULL;
}
