/*
 * kp_diff: one loaded rank (base) against another (other): another run's rank (a run diff) or
 * another rank of the same run (a rank diff). docs/cli.md "Comparing two runs: kprofctl diff"
 * says what a user sees, and where kprof differs from HTA's TraceDiff and nsys's diff recipe.
 *
 * Nothing is measured anew: each side's figures are the views' own (kp_an_breakdown,
 * kp_an_ops by name, kp_an_kernels by name), so a side's totals are what `kprofctl breakdown`,
 * `ops` and `kernels` give for it. The diff only matches and subtracts:
 *  - steps: per breakdown category (and the step time, "total"), the average over each side's
 *    steps and the sum over them, delta = other - base, ratio = other / base;
 *  - ops and kernels: rows matched by name (exact, full name); a name on one side only is
 *    new (other only) or vanished (base only), its missing side zero; delta_ns is the
 *    difference of the total times (ops: host total, as HTA's cpu_op duration; kernels: kernel
 *    time), rows sorted by |delta_ns|, then by base + other total time, then by name;
 *  - totals over every row before the top-N and minimum-delta cuts;
 *  - a verdict line in plain words.
 *
 * Memory: a kp_diff's rows and names borrow from the two handles (kp_an), which must outlive
 * it; kp_diff_fini frees what it owns. Thread-safety: as the handles (one thread at a time).
 */
#ifndef KP_DIFF_H
#define KP_DIFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "an.h"

#define KP_DIFF_N_CATS (KP_AN_CAT_COUNT + 1) /* the breakdown's categories, then "total" */

/* One side's figures for one name (the view's row, or the sum of a table's rows). */
struct kp_diff_fig {
    uint64_t calls;
    int64_t total_ns;        /* ops: host total; kernels: total */
    int64_t self_ns;         /* ops only: host self */
    int64_t device_total_ns; /* ops only */
    int64_t device_self_ns;  /* ops only */
};

/* A view's row as the diff reads it: a name and its figures. */
struct kp_diff_item {
    const char *name;
    struct kp_diff_fig fig;
};

enum kp_diff_status {
    KP_DIFF_BOTH,     /* on both sides */
    KP_DIFF_NEW,      /* only on the other side */
    KP_DIFF_VANISHED, /* only on the base side */
};

struct kp_diff_row {
    const char *name; /* borrowed from the items */
    enum kp_diff_status status;
    struct kp_diff_fig base, other; /* zero on the side the name is missing from */
    int64_t delta_calls, delta_ns;  /* other - base */
    double ratio;                   /* other.total_ns / base.total_ns when ratio_defined */
    bool ratio_defined;             /* base.total_ns > 0 */
};

struct kp_diff_table {
    struct kp_diff_row *rows; /* owned; the rows kept (sorted, cut), n of them */
    size_t n;
    size_t n_all; /* names on either side */
    size_t n_both, n_new, n_vanished;
    struct kp_diff_fig base, other; /* sums over every row of each side */
    int64_t delta_ns;
};

/* One breakdown category, or the step time ("total"). */
struct kp_diff_cat {
    const char *name; /* "kernel", ..., "cpu_exec", "other", "total" (static) */
    double base_avg_ns, other_avg_ns, delta_avg_ns;
    double ratio; /* other / base when ratio_defined (base > 0) */
    bool ratio_defined;
    int64_t base_total_ns, other_total_ns; /* over every step of the side */
};

/* The category names, in the breakdown's priority order, then "total". */
extern const char *const kp_diff_cat_names[KP_DIFF_N_CATS];

/* other / base, and whether it is defined (base > 0); 0 when not. */
double kp_diff_ratio(double base, double other, bool *defined);

/* Matches base[0..nb) and other[0..no) by name (a name twice on a side: its figures summed),
 * computes each row's deltas and ratio and the totals, sorts, then keeps the rows with
 * |delta_ns| >= min_delta_ns (0: all), the first top of them (0: all). Returns 0 and *out
 * (kp_diff_table_fini), or -ENOMEM (out empty). */
int kp_diff_match(const struct kp_diff_item *base, size_t nb, const struct kp_diff_item *other,
                  size_t no, size_t top, int64_t min_delta_ns, struct kp_diff_table *out);
void kp_diff_table_fini(struct kp_diff_table *t);

/* The breakdown of each side per category into out (KP_DIFF_N_CATS rows). */
void kp_diff_steps(const struct kp_an_breakdown *base, const struct kp_an_breakdown *other,
                   struct kp_diff_cat *out);

struct kp_diff_opts {
    bool steps, ops, kernels; /* the parts to compute */
    size_t top;               /* ops and kernels: rows kept (0: all) */
    int64_t min_delta_ns;     /* ops and kernels: the least |delta_ns| kept (0: all) */
    bool plugin_compat;       /* the breakdown's plugin figure (kp_an_breakdown) */
};

struct kp_diff {
    bool has_steps, has_ops, has_kernels;
    size_t base_steps, other_steps;
    double base_step_ns, other_step_ns; /* the average step time of each side */
    struct kp_diff_cat cats[KP_DIFF_N_CATS];
    struct kp_diff_table ops, kernels;
    char *verdict; /* owned; one line, names in full */
};

/* The diff of two loaded ranks (borrowed; other may be base's run). base_label and
 * other_label ("run 3 rank 0") name the sides in the verdict. Returns 0 and *out
 * (kp_diff_fini), or -ENOMEM (out empty). */
int kp_diff_compute(struct kp_an *base, struct kp_an *other, const struct kp_diff_opts *o,
                    const char *base_label, const char *other_label, struct kp_diff *out);

/* The verdict of d into d->verdict (kp_diff_compute calls it; kp_diff_fini frees it). Returns
 * 0 or -ENOMEM (d->verdict then unchanged). */
int kp_diff_verdict(struct kp_diff *d, const char *base_label, const char *other_label);

void kp_diff_fini(struct kp_diff *d);

#endif
