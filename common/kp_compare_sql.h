/*
 * kp_compare_sql.h: what kprof-collectord's compare summaries (collectord/summary.c) and the
 * analyzer's compare (analyzer/compare_load.c) must agree on: the format version of the
 * summary tables (sql/migrations/0014_compare_summaries.sql) and the SQL that puts a name in
 * one of compare's classes. A name's class depends on its text only, and names rows never
 * change, so classifying when the run ends and when it is compared gives the same sets.
 */
#ifndef KP_COMPARE_SQL_H
#define KP_COMPARE_SQL_H

/* compare_runs.version of the summaries this build writes and reads. A change to what the
 * summary tables hold, or to KP_COMPARE_NAME_CLASS_SQL, must increment it: the summaries
 * written before are then ignored (their runs are compared from the events). */
#define KP_COMPARE_SUMMARY_VERSION 1

/* The class of the names row whose text is the column `name`: 0 NCCL kernel, 1 Gloo op,
 * 2 ProfilerStep#N, 3 data loading, 4 synchronising API call, NULL none (analyzer/compare_int.h
 * NC_*). */
#define KP_COMPARE_NAME_CLASS_SQL                                                         \
    "CASE WHEN name LIKE 'nccl%Kernel%' THEN 0 WHEN name LIKE 'gloo:%' THEN 1 "           \
    "WHEN name LIKE 'ProfilerStep#%' THEN 2 "                                             \
    "WHEN name LIKE 'enumerate(DataPipe)#%' OR (name LIKE 'enumerate(DataLoader)#%' AND " \
    "right(name, 9) = '.__next__') THEN 3 "                                               \
    "WHEN name LIKE 'cuda%Synchronize%' OR name LIKE 'cuda%WaitEvent%' OR name LIKE "     \
    "'cuda%Query%' THEN 4 END"

#endif
