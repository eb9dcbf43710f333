/*
 * compare_int.h: what compare.c (matching, clocks, the figures), compare_load.c (reading the
 * run), compare_verdict.c (who waits, the verdict) and compare_hta.c (HTA's metric) share. Private
 * to those files.
 */
#ifndef KP_COMPARE_INT_H
#define KP_COMPARE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "compare.h"
#include "kp_strbuf.h"

/* Classes of names compare reads, from one pass over names. */
enum {
    NC_NCCL,
    NC_GLOO,
    NC_STEP,
    NC_DATA,
    NC_SYNC,
    NC_COUNT
};

struct ncls {
    int64_t id;
    int cls;
    int64_t num; /* NC_STEP: the N of ProfilerStep#N; -1 when not a number */
    bool p2p;    /* NC_NCCL, NC_GLOO: a point-to-point transfer (docs/specs/compare.md §3) */
};

struct nameset {
    struct ncls *v; /* by id */
    size_t n;
    struct kp_strbuf arr[NC_COUNT + 1]; /* "{id,...}" per class; [NC_COUNT]: the ops classes */
};

/* One step of one rank: a ProfilerStep#N op, else a row of the steps table (captures), else
 * step 0 over the rank's kernels. */
struct rstep {
    int64_t num, start, end;
};

struct rsteps {
    size_t n, cap;
    struct rstep *v; /* by start */
    bool from_ops;   /* has ProfilerStep ops (the steps table is then not read for it) */
    bool kany;       /* kmin, kmax: the span of its kernels */
    int64_t kmin, kmax;
};

/* One collective of one rank: an NCCL kernel (kind 0) or a Gloo op (kind 1). */
struct coll {
    uint32_t ri;   /* rank index */
    uint32_t si;   /* step index: among every step of the run, then (compacted) compared */
    uint32_t kind; /* 0 NCCL, 1 Gloo */
    uint32_t idx;  /* order within (rank, step, kind) */
    int64_t start, end;
    uint32_t cs; /* compared step index; NOT_COMPARED when its step is not compared */
    bool p2p;    /* a point-to-point transfer */
};

#define NOT_COMPARED UINT32_MAX

/* What kp_compare_result_create reads, between the queries and the result. */
struct cmp_load {
    int64_t *ranks; /* sorted */
    size_t n_ranks;
    struct rsteps *rs;
    struct nameset names;
    PGresult *ops, *steps, *kern, *coll, *api, *mem;
    size_t budget;
    /* read from the run's summary (sql/migrations/0014_compare_summaries.sql), not its
     * events; ranges: its compare_ranges rows, by rank, start, end, once read */
    bool summary;
    PGresult *ranges;
};

/* Index of x in sorted v[0..n), or -1. */
long kp__compare_find_i64(const int64_t *v, size_t n, int64_t x);

/* compare_load.c. Each returns 0, or KP_ENOTFOUND, KP_ETOOBIG, KP_EPG, -ENOMEM with a message
 * in errbuf; each blocks on PostgreSQL. */
/* The run's ranks, ascending, into *ranks (owned: free) and *n. */
int kp__compare_load_ranks(PGconn *c, const char *const *params, int64_t run, int64_t **ranks,
                           size_t *n, char *errbuf, size_t errlen);
/* res's world: its size, the missing ranks, each rank's host, node and local rank. */
int kp__compare_load_world(PGconn *c, const char *const *params, struct kp_compare_result *res,
                           char *errbuf, size_t errlen);
/* The first queries into L (its ranks set) and every rank's steps. */
int kp__compare_load_run(PGconn *c, const char *runs, int64_t run, size_t max_rows,
                         struct cmp_load *L, char *errbuf, size_t errlen);
void kp__compare_load_fini(struct cmp_load *L);
/* res's cells (rank x compared step) from the sums, and the run's collectives into *colls
 * (owned: free) and *n_colls. */
int kp__compare_fill_cells(PGconn *c, const char *runs, struct cmp_load *L,
                           struct kp_compare_result *res, const int64_t *nums, const int64_t *all,
                           size_t n_all, size_t max_rows, struct coll **colls, size_t *n_colls,
                           char *errbuf, size_t errlen);

/* qsort comparators of doubles and of int64s, ascending. */
int kp__compare_double(const void *pa, const void *pb);
int kp__compare_i64(const void *pa, const void *pb);

/* The median of v[0..n) (reordered); 0 when n == 0. */
double kp__compare_median(double *v, size_t n);

/* The N of ProfilerStep#N's text N into *out; false when it is not a whole number. */
bool kp__compare_parse_step(const char *s, int64_t *out);

/* Checks that run (its id the text params[0]) exists; returns 0, KP_ENOTFOUND or KP_EPG with a
 * message in errbuf. Blocks. */
int kp__compare_check_run(PGconn *c, const char *const *params, int64_t run, char *errbuf,
                          size_t errlen);

/* A cell's time for cause (KP_COMPARE_COMPUTE, _HOST, _LAUNCH). */
int64_t kp__compare_cell_cause(const struct kp_compare_cell *cl, int cause);

/* The rank the others wait for (docs/specs/compare.md §7), flagged "late" when it is no
 * straggler, and HTA's pick per step and over the steps. */
void kp__compare_who_waits(struct kp_compare_result *res, const struct kp_compare_opts *o);

/* The rank entry of rank in res, or NULL. */
const struct kp_compare_rank *kp__compare_rank_of(const struct kp_compare_result *res, int rank);

/* res->verdict: the answer in words, with its caveats; n_coll_total the collectives read. */
void kp__compare_make_verdict(struct kp_compare_result *res, const struct kp_compare_opts *o,
                              size_t n_coll_total);

#endif
