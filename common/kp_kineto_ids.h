/*
 * kp_kineto_ids: the ids and name prefixes an imported Kineto trace's rows carry in
 * PostgreSQL (import/kp_kineto.h has the mapping that writes them). Part of the stored data:
 * the analyzer reads them back (counters, export), so they live here and not in the importer.
 */
#ifndef KP_KINETO_IDS_H
#define KP_KINETO_IDS_H

/* python_function events: op_id and parent_id are KP_KINETO_PY_ID_BASE + the Python id. */
#define KP_KINETO_PY_ID_BASE (1ULL << 56)
/* cuda_profiler_range events: the correlation of a range without one of its own is
 * KP_KINETO_RANGE_ID_BASE + its index; its name row's metric starts with
 * KP_KINETO_RANGE_NAME_PREFIX. */
#define KP_KINETO_RANGE_ID_BASE     (1ULL << 62)
#define KP_KINETO_RANGE_NAME_PREFIX "kprof.range_name:"

#endif
