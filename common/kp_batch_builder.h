/*
 * kp_batch_builder: builds kprof.v1.Batch messages row by row, driven by the codec's spec
 * table (kp_codec.h): every producer of batches (the agent's batcher, the Kineto importer,
 * the synthetic generator) uses it, so none of them lists a kind's columns. A new column or
 * kind needs no change here (docs/recipes.md "Adding an event kind").
 *
 * Rows: kp_batch_builder_add appends zeroed rows of a kind and returns the first's index; the
 * caller writes the values straight into the kind's message (kp_batch_builder_table, e.g.
 * Kprof__V1__Kernels), start times as absolute CLOCK_REALTIME ns, names as indexes into the
 * builder's string table (0: none). No per-row allocation: the columns grow by doubling and
 * keep their memory from batch to batch.
 *
 * Columns: which columns a batch carries is the producer's policy, given once as rules
 * (struct kp_batch_builder_rule) over the column names: ALWAYS (one value per row), NEVER
 * (left out: NULL in PostgreSQL; not even allocated) or AUTO (left out when every row holds
 * the column's "none" value: `none` for integers, NaN for doubles). The value columns of a
 * kind's side table (kp_codec.h) go together: if one is kept, all its allocated ones are.
 *
 * kp_batch_builder_finish delta-encodes the start times from base_ns (kprof.proto), applies
 * the rules, and returns the batch (borrowed); the caller sets its header (run_id, rank,
 * rank_info, stats, devices) and validates or sends it. kp_batch_builder_next then drops the
 * rows that batch held (the others move to the front) and empties the string table.
 *
 * Errors: -ENOMEM from add and the string functions leaves the builder as it was; -EINVAL
 * from create names a rule that names no column of its kind (a bug). Thread-safety: one
 * builder per thread.
 */
#ifndef KP_BATCH_BUILDER_H
#define KP_BATCH_BUILDER_H

#include <stddef.h>
#include <stdint.h>

#include "kp_codec.h"
#include "kprof.pb-c.h"

struct kp_batch_builder;

enum kp_batch_builder_presence {
    KP_BB_ALWAYS,
    KP_BB_NEVER,
    KP_BB_AUTO,
};

struct kp_batch_builder_rule {
    enum kp_event_kind kind;
    const char *column; /* the spec table's name */
    enum kp_batch_builder_presence presence;
    int64_t none; /* KP_BB_AUTO on an integer column: the value that means "none" */
};

/* Creates a builder whose columns follow rules[0..n_rules), the others dflt. Returns 0 and
 * *out (kp_batch_builder_destroy), -EINVAL (a rule names no column), or -ENOMEM. */
int kp_batch_builder_create(enum kp_batch_builder_presence dflt,
                            const struct kp_batch_builder_rule *rules, size_t n_rules,
                            struct kp_batch_builder **out);

/* Frees the builder and what it holds. Accepts NULL. */
void kp_batch_builder_destroy(struct kp_batch_builder *b);

/* Appends n zeroed rows of kind k. Returns the first one's index, or -ENOMEM. */
long kp_batch_builder_add(struct kp_batch_builder *b, enum kp_event_kind k, size_t n);

/* Kind k's message (cast it to its type: Kprof__V1__Kernels *, ...): its columns hold the
 * rows added so far; their n_<column> counts are set by finish only. The message stays; its
 * column pointers change when rows are added. */
void *kp_batch_builder_table(struct kp_batch_builder *b, enum kp_event_kind k);

/* Rows of kind k held; rows of every kind held. */
size_t kp_batch_builder_rows(const struct kp_batch_builder *b, enum kp_event_kind k);
size_t kp_batch_builder_total(const struct kp_batch_builder *b);

/* Drops kind k's rows from index n on (an event that failed half-way). */
void kp_batch_builder_truncate(struct kp_batch_builder *b, enum kp_event_kind k, size_t n);

/* Adds s[0..n) (valid UTF-8 without NUL, within the name limit) to the string table as a new
 * entry, borrowed when s[n] is NUL (it must then live until next), else copied. Returns its
 * index, or -ENOMEM. */
int64_t kp_batch_builder_string(struct kp_batch_builder *b, const char *s, size_t n);

/* The same, copied, and once per batch: the same text gives the same index (0 for ""). */
int64_t kp_batch_builder_intern(struct kp_batch_builder *b, const char *s, size_t n);

/* Entries in the string table ("" included); bytes of the copied ones. */
size_t kp_batch_builder_strings(const struct kp_batch_builder *b);
size_t kp_batch_builder_string_bytes(const struct kp_batch_builder *b);

/*
 * Makes the batch of the first upto[k] rows of each kind k (upto NULL: all rows), start times
 * delta-encoded from base_ns, and returns it (borrowed until next; header fields zero, the
 * caller's to set). Rows put into it are then only fit for next. Cannot fail.
 */
Kprof__V1__Batch *kp_batch_builder_finish(struct kp_batch_builder *b, int64_t base_ns,
                                          const size_t *upto);

/* Drops the rows the last finish used (every row if there was no finish since the last
 * next) and empties the string table and the batch header. */
void kp_batch_builder_next(struct kp_batch_builder *b);

#endif
