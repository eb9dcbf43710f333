/*
 * Prometheus counters and gauges.
 *
 * A registry holds a fixed number of metric slots, allocated by kp_metrics_create(); nothing
 * is allocated after that. Each metric is a name, help text, a type and at most one label
 * pair; metrics that share a name (a family, e.g. kprof_agent_records_dropped_total with
 * reason="ring_full" and reason="spool_full") must share type and help, and are rendered
 * under one # HELP / # TYPE header.
 *
 * Threads: kp_metric_add/set/get are lock-free (relaxed atomics) and may be called from any
 * thread, including while the registry renders. Registration and rendering take the
 * registry's mutex. A registered metric lives until kp_metrics_destroy().
 *
 * Names follow docs/style.md §7: kprof_<daemon>_<thing>[_<unit>]_total for counters.
 */
#ifndef KP_METRICS_H
#define KP_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct kp_strbuf;
struct kp_metrics;

enum kp_metric_type {
    KP_METRIC_COUNTER, /* only goes up; kp_metric_add() ignores negative n */
    KP_METRIC_GAUGE,   /* any value */
};

#define KP_METRIC_NAME_MAX  96  /* bytes, excluding NUL, of a metric or label name */
#define KP_METRIC_LABEL_MAX 64  /* bytes, excluding NUL, of a label value */
#define KP_METRIC_HELP_MAX  200 /* bytes, excluding NUL, of the help text */

struct kp_metric {
    _Atomic int64_t value; /* wraps on overflow (C11 atomics are two's complement) */
    enum kp_metric_type type;
    char name[KP_METRIC_NAME_MAX + 1];
    char label_key[KP_METRIC_NAME_MAX + 1];    /* "" when the metric has no label */
    char label_value[KP_METRIC_LABEL_MAX + 1]; /* any UTF-8; escaped when rendered */
    char help[KP_METRIC_HELP_MAX + 1];
};

/* Creates a registry with room for capacity metrics. Returns 0 and sets *out (owned, freed
 * with kp_metrics_destroy), -EINVAL for capacity 0, or -ENOMEM. */
int kp_metrics_create(size_t capacity, struct kp_metrics **out);

/* Frees the registry and its metrics; pointers returned by kp_metrics_register() die with
 * it. Accepts NULL. No other thread may use the registry or its metrics any more. */
void kp_metrics_destroy(struct kp_metrics *r);

/*
 * Registers a metric and returns it in *out (owned by the registry). The strings are copied.
 * label_key and label_value are both NULL (no label) or both set. Returns 0, -EINVAL (a name
 * that is not [a-zA-Z_:][a-zA-Z0-9_:]*, a label key that is not [a-zA-Z_][a-zA-Z0-9_]* or
 * starts with "__", a string over its *_MAX, or a family whose type or help differs from an
 * earlier registration), -EEXIST (same name and label already registered) or -ENOSPC
 * (registry full). Thread-safe.
 */
int kp_metrics_register(struct kp_metrics *r, const char *name, const char *help,
                        enum kp_metric_type type, const char *label_key, const char *label_value,
                        struct kp_metric **out);

/*
 * Appends the Prometheus text exposition (format 0.0.4) of every registered metric to out:
 * per family one "# HELP" and one "# TYPE" line, then one sample line per metric, families
 * in order of first registration. Returns 0 or the strbuf's error (out then holds a
 * truncated rendering; reset it). Thread-safe.
 */
int kp_metrics_render(struct kp_metrics *r, struct kp_strbuf *out);

/* Adds n to m. For counters a negative n is ignored. Lock-free, any thread. */
static inline void kp_metric_add(struct kp_metric *m, int64_t n)
{
    if (n < 0 && m->type == KP_METRIC_COUNTER) {
        return;
    }
    atomic_fetch_add_explicit(&m->value, n, memory_order_relaxed);
}

/* Sets m to v. On a counter, only to mirror a monotonic count kept elsewhere. Lock-free. */
static inline void kp_metric_set(struct kp_metric *m, int64_t v)
{
    atomic_store_explicit(&m->value, v, memory_order_relaxed);
}

/* Returns m's current value. Lock-free. */
static inline int64_t kp_metric_get(const struct kp_metric *m)
{
    return atomic_load_explicit(&m->value, memory_order_relaxed);
}

#endif
