/*
 * distributed: the PyTorch Profiler TensorBoard plugin's distributed view across every rank
 * of a run, as docs/specs/tbplugin-views.md §9 describes it:
 *  - the wait view ("Synchronizing/Communication Overview"), per step and rank: latency =
 *    |union of the step's communication-node intervals|, data transfer = |union of their
 *    "real" intervals|, synchronizing = latency - data transfer; and the mean over those
 *    steps, truncated;
 *  - the communication-ops table, per rank, one row per op name in first-seen order: calls,
 *    input bytes (Σ product of shape × element size), latency and data-transfer time, each
 *    also per call, rounded half to even.
 * Node i on one rank is matched with node i on every other (time order); for its interval j,
 * m = the shortest interval j over the ranks, and each rank's real interval is
 * [its end - m, its end]: the rest of the latency is time spent waiting for peers. The
 * overlap view is per rank (kp_an_breakdown's steps).
 *
 * Enable condition (the plugin's): every rank has communication nodes, all ranks have the
 * same number, and node i has the same number of intervals on every rank; a rank with both
 * NCCL and Gloo ops has none. Otherwise the view is disabled and `reason` says why.
 * kprof's choices where the plugin fails or is silent: a communication op without an external
 * id is a node of its own; an input that is a list of tensors counts each tensor.
 *
 * Memory: ranks are loaded one at a time (kp_an_create) and only their communication nodes are
 * kept. Thread-safety: a kp_distributed is read-only once built.
 */
#ifndef KP_DISTRIBUTED_H
#define KP_DISTRIBUTED_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ranges.h"

/* One wait-view entry: a step with communication nodes, or the nodes in no step. */
struct kp_distributed_wait {
    int32_t step;       /* index into the rank's steps (kp_an_breakdown); -1: in no step */
    char step_name[24]; /* "" when step is -1 */
    int64_t latency_ns, transfer_ns;
};

struct kp_distributed_op {
    char *name; /* owned */
    uint64_t calls;
    int64_t total_bytes;
    int64_t latency_ns, transfer_ns; /* |union| of the op's intervals, of its real intervals */
};

/* The communication nodes of one rank, as kept between loading and computing. */
struct kp_distributed_node {
    int32_t op;      /* index into the rank's ops */
    int32_t wait;    /* index into the rank's wait entries */
    size_t first, n; /* intervals: ranges[first .. first + n), real[first .. first + n) */
};

struct kp_distributed_rank {
    int rank;
    size_t n_nodes;
    struct kp_distributed_node *nodes;
    struct kp_range *ranges, *real;
    size_t n_wait; /* in the order the nodes first reach them (time order) */
    struct kp_distributed_wait *wait;
    int64_t wait_all_transfer_us, wait_all_sync_us; /* mean over the entries, truncated */
    size_t n_ops;                                   /* first-seen order */
    struct kp_distributed_op *ops;
};

struct kp_distributed {
    int64_t run;
    bool enabled;
    char reason[256]; /* why the view is disabled ("rank 1 has no communication ops ...") */
    size_t n_ranks;
    struct kp_distributed_rank *ranks; /* by rank; empty when disabled */
};

/*
 * Builds the distributed view of run `run` over c (borrowed; may block on PG). Each rank is
 * loaded under the max_rows budget (0: no limit). Returns 0 and *out (free with
 * kp_distributed_destroy), also when the view is disabled (then enabled is false and reason says
 * why), or KP_ENOTFOUND (no such run), KP_EPG, KP_ETOOBIG, -ENOMEM with a message in errbuf.
 */
int kp_distributed_create(PGconn *c, int64_t run, size_t max_rows, struct kp_distributed **out,
                          char *errbuf, size_t errlen);

/* Writes d as one JSON object: {"run", "enabled", "reason", "ranks": [{"rank",
 * "comm_node_count", "wait": [{"index", "step", "data_transfer_us", "synchronizing_us"}],
 * "wait_all": {...}, "comm_ops": [{"name", "calls", "total_size_bytes", "avg_size_bytes",
 * "total_latency_us", "avg_latency_us", "data_transfer_us", "avg_data_transfer_us"}]}]}. */
void kp_distributed_json(FILE *f, const struct kp_distributed *d);

/* Writes d as text tables, or "no distributed view: <reason>". */
void kp_distributed_text(FILE *f, const struct kp_distributed *d);

void kp_distributed_destroy(struct kp_distributed *d);

/* Bytes of a communication op's inputs from the stored "Input Dims" ("[[53120], [4, 2]]")
 * and "Input type" ("['float', 'long int']"): Σ over inputs of Π shape × element size, with
 * the plugin's element sizes (float, int 4; long int 8; c10::Half, c10::BFloat16 2;
 * unsigned char 1; anything else 0). NULL or unreadable text counts 0. */
int64_t kp_distributed_input_bytes(const char *shapes, const char *dtypes);

#endif
