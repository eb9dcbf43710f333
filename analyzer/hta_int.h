/*
 * hta_int.h: what hta_load.c (loading), hta.c (the analyses), hta_npsort.c (numpy's sort) and
 * hta_write.c (the JSON) share. Private to those files.
 */
#ifndef KP_HTA_INT_H
#define KP_HTA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "an.h"
#include "hta.h"

struct hta_rt {
    int64_t ts, end, corr;
    const char *name;
};

struct hta_ev {
    int64_t ts, end, corr, stream;
    const char *name;
    size_t order;     /* load order, the tie-break of every sort by start */
    int32_t rt;       /* index of the launching call in h->rts, -1: none */
    uint8_t type;     /* enum kp_hta_ktype */
    bool bw_computed; /* bw is bytes / exact ns: no figure from the trace */
    double bw;        /* memcpys/memsets: the trace's GB/s (kernels: 0, HTA's default) */
};

struct kp_hta {
    struct kp_hta_opts opts;
    struct kp_an_dict names;  /* the calls' names */
    struct kp_an_dict knames; /* the GPU rows' names */
    char **extra;             /* memcpy/memset names made here */
    size_t n_extra;
    struct hta_rt *rts; /* kept calls */
    size_t n_rts;
    struct hta_ev *evs; /* kept GPU rows with a stream, by start */
    size_t n_evs;
    int64_t base_ns;         /* the trace's time base, 0: absolute (HTA rounds relative) */
    int64_t t_first, t_last; /* first and last start of any kept row */
    bool dropped;            /* the last ProfilerStep was dropped */

    struct kp_hta_temporal temporal;
    struct kp_hta_idle_stream *idle;
    size_t n_idle;
    struct kp_hta_overlap overlap;
    int64_t type_time[8];
    struct kp_hta_kernel_row *krows;
    size_t n_krows;
    struct kp_hta_launch_row *launches;
    size_t n_launches;
    struct kp_hta_launch_summary lsum;
    struct kp_hta_queue_stream *queue;
    size_t n_queue;
    struct kp_hta_membw_row *membw;
    size_t n_membw;
};

/* hta.c: every analysis of h (its rows loaded) into h. Returns 0 or -ENOMEM. */
int kp__hta_compute(struct kp_hta *h);
/* s as a string h owns (a name made while loading or computing); NULL when out of memory. */
const char *kp__hta_intern(struct kp_hta *h, const char *s);

/* numpy's argsort(kind="quicksort") of v[0..num) into tosort (hta_npsort.c). */
void kp__hta_np_argsort(const int64_t *v, size_t *tosort, size_t num);

#endif
