/*
 * What the Kineto importer's walker (kineto_walk.c) and mapping (kp_kineto.c) share: the
 * parse's state (struct kp_kineto), the event being parsed (struct ev) and the args keys'
 * ids. Internal to import/; kp_kineto.h is the contract.
 */
#ifndef KP_IMPORT_KP_KINETO_INT_H
#define KP_IMPORT_KP_KINETO_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jr.h"
#include "kp_kineto.h"
#include "kp_strbuf.h"
#include "spill.h"

#define I2MAX 32767
#define I4MAX INT32_MAX

/* The args keys the mapping uses (kineto_walk.c's table names them). */
enum arg_id {
    A_EXT,
    A_EXT_LOWER,
    A_CORR,
    A_CBID,
    A_DEVICE,
    A_CONTEXT,
    A_STREAM,
    A_REGS,
    A_SMEM,
    A_BYTES,
    A_SEQ,
    A_FWD_TID,
    A_PY_ID,
    A_PY_PARENT,
    A_IN_NELEMS,
    A_OUT_NELEMS,
    A_GROUP_SIZE,
    A_PG_ID,
    A_COLL_SEQ,
    A_DEV_TYPE,
    A_DEV_ID,
    A_ADDR,
    A_MEM_BYTES,
    A_TOTAL_ALLOC,
    A_TOTAL_RES,
    A_FROM_DEV,
    A_TO_DEV,
    A_GRAPH_ID,
    A_GRAPH_NODE,
    A_EVENT_ID,
    A_NUM_COUNT,
    /* strings */
    S_COLL_NAME = A_NUM_COUNT,
    S_DTYPE,
    S_PG_NAME,
    S_PG_DESC,
    S_COUNT,
    /* captured lists and arrays */
    C_SHAPES = S_COUNT,
    C_TYPES,
    C_GRID,
    C_BLOCK,
    C_BLOCKS_SM, /* a number, parsed when the kernel is built */
    C_OCCUPANCY,
    C_MEMBW, /* likewise, when the memcpy or memset is built */
    ARG_COUNT
};

/* One traceEvents entry. Strings live in k->evs (offset, length). */
struct ev {
    int ph; /* 0: absent */
    bool has_ts, has_dur, has_id;
    int64_t ts_ns, dur_ns;
    bool pid_num, tid_num; /* an int, or a string with digits ("stream 7", "25738") */
    int64_t pid, tid;
    uint32_t name_off, name_len, cat_off, cat_len;
    bool has_name, has_cat;
    uint64_t have;             /* bit per enum arg_id */
    int64_t a[A_NUM_COUNT];    /* numeric args */
    uint32_t s_off[ARG_COUNT]; /* string and captured args in k->evs */
    uint32_t s_len[ARG_COUNT];
    int64_t grid[3], block[3];
    /* cuda_profiler_range metrics: args keys the table above does not know, with a number */
    uint32_t n_ctr;
    bool ctr_overflow; /* more than KP_KINETO_MAX_COUNTERS of them */
    uint32_t ctr_off[KP_KINETO_MAX_COUNTERS], ctr_len[KP_KINETO_MAX_COUNTERS];
    double ctr_val[KP_KINETO_MAX_COUNTERS];
};

struct kp_kineto {
    const struct kp_kineto_opts *opts;
    struct jr j;
    struct spill out;     /* the batch being read */
    struct kp_strbuf evs; /* the current event's strings */
    struct ev e;
    struct kp_kineto_meta *meta;
    size_t max_name;
    uint32_t batch_rows;
    uint64_t ev_index;
    uint64_t n_ranges; /* cuda_profiler_range events mapped so far */
};

/* Whether args key id was read (with a value). Per event and per arg: inlined on both sides. */
static inline bool has(const struct ev *e, int id)
{
    return (e->have >> id) & 1;
}

/* The string kept at off in the event's string space. */
static inline const char *evstr(struct kp_kineto *k, uint32_t off)
{
    return k->evs.data != NULL ? k->evs.data + off : ""; /* nothing kept yet: empty */
}

/* kineto_walk.c. Reads the whole trace from k->j into the mapping; 0, or the parse's error
 * (its message in k->j's errbuf). */
int kp__kineto_walk(struct kp_kineto *k);

/* kineto_walk.c. The key of args id as the trace spells it ("?" if none), for errors. */
const char *kp__kineto_arg_key(int id);

/* kp_kineto.c. Maps the event just parsed (k->e) into the batch's rows, flushing the batch
 * when it is full; 0, or the parse's error (the event's rows dropped). */
int kp__kineto_ev_finish(struct kp_kineto *k);

#endif
