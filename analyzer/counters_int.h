/*
 * counters_int.h: what counters.c (building the table) and counters_write.c (writing it, in
 * the printing library that kprofctl links without libpq) share. Private to those two.
 */
#ifndef KP_COUNTERS_INT_H
#define KP_COUNTERS_INT_H

#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "counters.h"

struct kp_counters {
    PGresult *cr, *kr, * or ;
    const char **metrics;
    size_t n_metrics;
    struct kp_counters_row *rows;
    struct ct_range *ranges; /* parallel to rows */
    size_t n_rows;
    const char **stacks; /* every row's stack, one block */
    double *values;      /* every row's values, one block */
    char message[512];
};

static inline int kp__counters_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

static inline long kp__counters_metric_index(const struct kp_counters *t, const char *name)
{
    const char **p =
        bsearch(&name, t->metrics, t->n_metrics, sizeof(*t->metrics), kp__counters_cmp_str);

    return p ? (long) (p - t->metrics) : -1;
}

#endif
