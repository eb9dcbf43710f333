/*
 * kp_ranges: sweeps over half-open time intervals [start, end) in integer ns, the building
 * block of every analyzer view (spec tbplugin-views.md: "union", intersection, difference,
 * total length). A "set" is an array sorted by start whose intervals are disjoint and do not
 * touch, as kp_ranges_merge leaves it.
 *
 * Thread-safety: none needed; every function works on the caller's arrays only.
 */
#ifndef KP_RANGES_H
#define KP_RANGES_H

#include <stddef.h>
#include <stdint.h>

struct kp_range {
    int64_t start; /* inclusive */
    int64_t end;   /* exclusive; end >= start */
};

/* Sorts r by start and merges the intervals that overlap or touch, in place; empty intervals
 * (end == start) are dropped. Returns the new count. */
size_t kp_ranges_merge(struct kp_range *r, size_t n);

/* Writes a ∩ b (two sets) to out, which must hold na + nb intervals. Returns the count. */
size_t kp_ranges_intersect(const struct kp_range *a, size_t na, const struct kp_range *b, size_t nb,
                           struct kp_range *out);

/* Writes a − b (two sets) to out, which must hold na + nb intervals. Returns the count. */
size_t kp_ranges_subtract(const struct kp_range *a, size_t na, const struct kp_range *b, size_t nb,
                          struct kp_range *out);

/* Returns the total length of a set. */
int64_t kp_ranges_length(const struct kp_range *r, size_t n);

/* Returns the length of the part of a set (sorted, disjoint) inside [start, end), in
 * O(log n + the ranges it meets). */
int64_t kp_ranges_clip_length(const struct kp_range *r, size_t n, int64_t start, int64_t end);

#endif
