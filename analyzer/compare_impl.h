/*
 * compare_impl.h: what compare.c (loading, matching, the figures), compare_verdict.c (who waits,
 * the verdict) and compare_hta.c (HTA's metric) share. Private to those files.
 */
#ifndef KP_COMPARE_IMPL_H
#define KP_COMPARE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "compare.h"

/* qsort comparators of doubles and of int64s, ascending. */
int cmp_double(const void *pa, const void *pb);
int cmp_i64(const void *pa, const void *pb);

/* The median of v[0..n) (reordered); 0 when n == 0. */
double cmp_median(double *v, size_t n);

/* The N of ProfilerStep#N's text N into *out; false when it is not a whole number. */
bool cmp_parse_step(const char *s, int64_t *out);

/* Checks that run (its id the text params[0]) exists; returns 0, KP_ENOTFOUND or KP_EPG with a
 * message in errbuf. Blocks. */
int cmp_check_run(PGconn *c, const char *const *params, int64_t run, char *errbuf, size_t errlen);

/* A cell's time for cause (KP_COMPARE_COMPUTE, _HOST, _LAUNCH). */
int64_t cmp_cell_cause(const struct kp_compare_cell *cl, int cause);

/* The rank the others wait for (docs/specs/compare.md §7), flagged "late" when it is no
 * straggler, and HTA's pick per step and over the steps. */
void cmp_who_waits(struct kp_compare_result *res, const struct kp_compare_opts *o);

/* The rank entry of rank in res, or NULL. */
const struct kp_compare_rank *cmp_rank_of(const struct kp_compare_result *res, int rank);

/* res->verdict: the answer in words, with its caveats; n_coll_total the collectives read. */
void cmp_make_verdict(struct kp_compare_result *res, const struct kp_compare_opts *o,
                      size_t n_coll_total);

#endif
