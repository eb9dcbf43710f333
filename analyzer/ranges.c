/* kp_ranges: interval sweeps (see ranges.h). */
#include "ranges.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int cmp_range(const void *pa, const void *pb)
{
    const struct kp_range *a = pa, *b = pb;

    if (a->start != b->start) {
        return a->start < b->start ? -1 : 1;
    }
    if (a->end != b->end) {
        return a->end < b->end ? -1 : 1;
    }
    return 0;
}

/* r[0..n) by start, in linear time: a least-significant-byte radix sort over the bytes in
 * which the starts differ (a rank's starts share their high bytes: usually 4 or 5 passes).
 * The union taken after does not depend on the order of equal starts. false without memory
 * for the scratch copy (the caller sorts another way). */
static bool radix_by_start(struct kp_range *r, size_t n)
{
    size_t count[8][256] = { { 0 } };
    struct kp_range *tmp = malloc(n * sizeof(*tmp)), *src = r, *dst = tmp;
    uint64_t first, differ = 0;

    if (!tmp) {
        return false;
    }
    first = (uint64_t) r[0].start ^ (1ull << 63); /* signed order as unsigned */
    for (size_t i = 0; i < n; i++) {
        uint64_t k = (uint64_t) r[i].start ^ (1ull << 63);

        differ |= k ^ first;
        for (int b = 0; b < 8; b++) {
            count[b][(k >> (8 * b)) & 0xFF]++;
        }
    }
    for (int b = 0; b < 8; b++) {
        size_t sum = 0;
        struct kp_range *t;

        if (((differ >> (8 * b)) & 0xFF) == 0) {
            continue; /* every start has the same byte here */
        }
        for (int v = 0; v < 256; v++) {
            size_t c = count[b][v];

            count[b][v] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) {
            uint64_t k = (uint64_t) src[i].start ^ (1ull << 63);

            dst[count[b][(k >> (8 * b)) & 0xFF]++] = src[i];
        }
        t = src;
        src = dst;
        dst = t;
    }
    if (src != r) {
        memcpy(r, src, n * sizeof(*r));
    }
    free(tmp);
    return true;
}

size_t kp_ranges_merge(struct kp_range *r, size_t n)
{
    size_t out = 0, sorted = 1;

    if (n == 0) {
        return 0;
    }
    while (sorted < n && r[sorted - 1].start <= r[sorted].start) {
        sorted++;
    }
    /* Already in order (a rank's device events are), else the radix sort: qsort's comparisons
     * were a fifth of a breakdown's time. */
    if (sorted < n && !radix_by_start(r, n)) {
        qsort(r, n, sizeof(*r), cmp_range);
    }
    for (size_t i = 0; i < n; i++) {
        if (r[i].end <= r[i].start) {
            continue;
        }
        if (out > 0 && r[i].start <= r[out - 1].end) {
            if (r[i].end > r[out - 1].end) {
                r[out - 1].end = r[i].end;
            }
        }
        else {
            r[out++] = r[i];
        }
    }
    return out;
}

size_t kp_ranges_intersect(const struct kp_range *a, size_t na, const struct kp_range *b, size_t nb,
                           struct kp_range *out)
{
    size_t i = 0, j = 0, n = 0;

    while (i < na && j < nb) {
        int64_t s = a[i].start > b[j].start ? a[i].start : b[j].start;
        int64_t e = a[i].end < b[j].end ? a[i].end : b[j].end;

        if (s < e) {
            out[n++] = (struct kp_range){ s, e };
        }
        if (a[i].end < b[j].end) {
            i++;
        }
        else {
            j++;
        }
    }
    return n;
}

size_t kp_ranges_subtract(const struct kp_range *a, size_t na, const struct kp_range *b, size_t nb,
                          struct kp_range *out)
{
    size_t j = 0, n = 0;

    for (size_t i = 0; i < na; i++) {
        int64_t s = a[i].start;

        while (j < nb && b[j].end <= s) {
            j++;
        }
        for (size_t k = j; k < nb && b[k].start < a[i].end; k++) {
            if (b[k].start > s) {
                out[n++] = (struct kp_range){ s, b[k].start };
            }
            if (b[k].end > s) {
                s = b[k].end;
            }
            if (s >= a[i].end) {
                break;
            }
        }
        if (s < a[i].end) {
            out[n++] = (struct kp_range){ s, a[i].end };
        }
    }
    return n;
}

int64_t kp_ranges_length(const struct kp_range *r, size_t n)
{
    int64_t t = 0;

    for (size_t i = 0; i < n; i++) {
        t += r[i].end - r[i].start;
    }
    return t;
}

int64_t kp_ranges_clip_length(const struct kp_range *r, size_t n, int64_t start, int64_t end)
{
    size_t lo = 0, hi = n;
    int64_t t = 0;

    /* A set's ends rise with its starts: find the first range ending after start, then walk
     * until one starts at or after end. O(log n + ranges inside), so clipping every step of a
     * rank costs the ranges once, not once per step. */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (r[mid].end <= start) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    for (size_t i = lo; i < n && r[i].start < end; i++) {
        int64_t s = r[i].start > start ? r[i].start : start;
        int64_t e = r[i].end < end ? r[i].end : end;

        if (s < e) {
            t += e - s;
        }
    }
    return t;
}
