/*
 * Run bookkeeping for the Control service: create, end, list and drop runs in PostgreSQL.
 *
 * A run is a row of `runs` plus one partition per event table (kp_create_run_partitions),
 * made in one transaction, so a run that exists can always take events. Times travel as unix
 * nanoseconds; `batches` counts the run's rows in ingest_batches.
 *
 * Every function borrows a connection that the caller uses from one thread, may block on
 * PostgreSQL, and returns 0 or a negative code with a one-line reason in errbuf:
 * KP_EPROTO for an invalid argument, KP_ENOTFOUND for a run that does not exist, -EBUSY for a
 * run in the wrong state (kp_store_drop_run), KP_EPG when PostgreSQL failed
 * (kp_pg_last_fault() tells whether the connection was lost), -ENOMEM.
 */
#ifndef KP_STORE_H
#define KP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "kp_auth.h"
#include "kprof.pb-c.h"

#define KP_STORE_MAX_WORLD_SIZE (1 << 20)
#define KP_STORE_MAX_TEXT_BYTES 4096 /* job and name */
#define KP_STORE_DEFAULT_LIMIT  100  /* ListRuns with limit 0 */
#define KP_STORE_MAX_LIMIT      10000

/*
 * Creates a run of job (non-empty) named name ("" or NULL: none) with world_size ranks
 * (1..KP_STORE_MAX_WORLD_SIZE) and source (a Kprof__V1__RunSource), with its partitions, in
 * one transaction. Fills *out (initialised with KPROF__V1__RUN__INIT by the caller; its strings
 * are owned: kp_store_run_fini, also after a failure).
 */
int kp_store_create_run(PGconn *c, const char *job, const char *name, uint32_t world_size,
                        int source, Kprof__V1__Run *out, char *errbuf, size_t errlen);

/* kp_store_create_run that also records who created the run (runs.created_by, migration
 * 0011: "ROLE:NAME", kp_store_principal; NULL: nobody recorded). */
int kp_store_create_run_by(PGconn *c, const char *job, const char *name, uint32_t world_size,
                           int source, const char *created_by, Kprof__V1__Run *out, char *errbuf,
                           size_t errlen);

/* "ROLE:NAME" (KP_STORE_PRINCIPAL_MAX bytes at most) */
#define KP_STORE_PRINCIPAL_MAX (16 + KP_AUTH_NAME_MAX)

/* The principal of id: "agent:node7", "operator:alice", "any:anonymous" (no authentication),
 * as runs.created_by and capture_ranks.agent_by store it. */
void kp_store_principal(const struct kp_identity *id, char *buf, size_t len);

/* Who may push into a run (docs/design.md "Authorization"). */
struct kp_store_run_owner {
    char created_by[KP_STORE_PRINCIPAL_MAX]; /* "" where none was recorded */
    bool capture;                            /* a capture (its `captures` row) */
    /* source CAPTURE without a `captures` row: StartCapture writes it (and the ranks) after
     * the run, so this may become a capture; not an answer to keep */
    bool unsettled;
    size_t n; /* its capture ranks, sorted by rank */
    int32_t *ranks;
    char (*agent_by)[KP_STORE_PRINCIPAL_MAX]; /* each rank's agent ("" none recorded) */
};

/* Reads who created run_id and, for a capture, the agent of each rank, into *out (zeroed by
 * the caller; kp_store_run_owner_fini, also after a failure). KP_ENOTFOUND if there is no such
 * run. */
int kp_store_run_owner(PGconn *c, uint64_t run_id, struct kp_store_run_owner *out, char *errbuf,
                       size_t errlen);

/* Frees what kp_store_run_owner put into o. Accepts NULL. */
void kp_store_run_owner_fini(struct kp_store_run_owner *o);

/*
 * Ends run run_id: state ENDED, or FAILED if failed, and ended_at now. Ending an ended run
 * changes nothing and is not an error. Waits for a flush of the run's batches in progress
 * (the sink holds the run FOR SHARE); from then on the sink refuses the run new batches.
 * KP_ENOTFOUND if there is no such run. Fills *out like kp_store_create_run.
 */
int kp_store_end_run(PGconn *c, uint64_t run_id, bool failed, Kprof__V1__Run *out, char *errbuf,
                     size_t errlen);

/*
 * Lists the newest runs of job ("" or NULL: every job), newest first, at most limit (0:
 * KP_STORE_DEFAULT_LIMIT; capped at KP_STORE_MAX_LIMIT). Fills *out (initialised by the caller
 * with KPROF__V1__LIST_RUNS_RESPONSE__INIT; what it holds is owned: kp_store_list_fini, also
 * after a failure).
 */
int kp_store_list_runs(PGconn *c, const char *job, uint32_t limit, Kprof__V1__ListRunsResponse *out,
                       char *errbuf, size_t errlen);

/*
 * Drops run run_id and every row stored for it (kp_drop_run: its partitions, then the run,
 * ranks and devices cascading), in one transaction. Only a run that has been ended (ENDED or
 * FAILED) is dropped: an OPEN run may still be taking batches, so it is refused with -EBUSY
 * and left alone (end it first). KP_ENOTFOUND if there is no such run. Fills *out like
 * kp_store_create_run with the run as it was just before the drop. Waits for flushes of the
 * run's batches that are in progress (the sink's transaction locks the tables it drops).
 */
/* The most marks one EndRun or one check may carry. */
#define KP_STORE_MAX_MARKS 65536

/*
 * Checks StreamMarks (kprof.proto) of run_id against ingest_batches: missing[i] (n entries,
 * the caller's) gets how many of marks[i]'s batches are not stored yet. Marks may overlap
 * (each is counted on its own). KP_EPROTO names a mark that cannot be right (first_seq after
 * last_seq, a count larger than its range, a stream or seq beyond INT64_MAX, more than
 * KP_STORE_MAX_MARKS). With Kafka between the producers and PostgreSQL, this is how "stored"
 * is told apart from "acknowledged".
 */
int kp_store_marks_missing(PGconn *c, uint64_t run_id, Kprof__V1__StreamMark *const *marks,
                           size_t n, uint64_t *missing, char *errbuf, size_t errlen);

int kp_store_drop_run(PGconn *c, uint64_t run_id, Kprof__V1__Run *out, char *errbuf, size_t errlen);

/* Frees the strings the store put into r and resets them to empty. Accepts NULL. */
void kp_store_run_fini(Kprof__V1__Run *r);

/* Frees the runs the store put into r and empties it. Accepts NULL. */
void kp_store_list_fini(Kprof__V1__ListRunsResponse *r);

#endif
