#include "kp_ranks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kp_ranks_parse(const char *s, uint32_t world, uint8_t *sel, bool *all, long *bad_rank)
{
    *all = s == NULL || *s == '\0' || strcmp(s, "all") == 0;
    if (*all) {
        return 0;
    }
    while (*s != '\0') {
        char *end;
        long lo, hi;

        if (*s < '0' || *s > '9') {
            return -EINVAL;
        }
        errno = 0;
        lo = strtol(s, &end, 10);
        hi = lo;
        if (errno != 0) {
            return -EINVAL;
        }
        if (*end == '-') {
            const char *p = end + 1;

            if (*p < '0' || *p > '9') {
                return -EINVAL;
            }
            hi = strtol(p, &end, 10);
            if (errno != 0 || hi < lo) {
                return -EINVAL;
            }
        }
        if (hi >= (long) world) {
            if (bad_rank != NULL) {
                *bad_rank = lo >= (long) world ? lo : (long) world;
            }
            return -ERANGE;
        }
        for (long r = lo; r <= hi; r++) {
            sel[r] = 1;
        }
        if (*end == ',') {
            end++;
            if (*end == '\0') {
                return -EINVAL;
            }
        }
        else if (*end != '\0') {
            return -EINVAL;
        }
        s = end;
    }
    return 0;
}

char *kp_ranks_format(const uint8_t *sel, size_t n, char *buf, size_t cap)
{
    size_t len = 0;

    if (cap == 0) {
        return buf;
    }
    buf[0] = '\0';
    for (size_t r = 0; r < n; r++) {
        size_t hi = r;
        int w;

        if (!sel[r]) {
            continue;
        }
        while (hi + 1 < n && sel[hi + 1]) {
            hi++;
        }
        if (hi == r) {
            w = snprintf(buf + len, cap - len, "%s%zu", len ? "," : "", r);
        }
        else {
            w = snprintf(buf + len, cap - len, "%s%zu-%zu", len ? "," : "", r, hi);
        }
        if (w < 0 || (size_t) w >= cap - len) {
            if (cap >= 4) {
                strcpy(buf + cap - 4, "...");
            }
            return buf;
        }
        len += (size_t) w;
        r = hi;
    }
    return buf;
}
