/*
 * spill: the Kineto importer's batch output (kp_kineto.h). The rows a parse maps go into a
 * kp_batch_builder; spill_flush makes the batch (rank_info and devices on the first),
 * validates it, keeps it in the scan's spool and hands it to the caller's callback. The spool
 * (struct kp_kineto_spool) keeps a scan's batches encoded, in memory up to its limit, then in
 * an unlinked temporary file, for kp_kineto_spool_replay. Internal to import/.
 */
#ifndef KP_IMPORT_SPILL_H
#define KP_IMPORT_SPILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jr.h"
#include "kp_batch_builder.h"
#include "kp_kineto.h"

#define KB_MAX_STR_BYTES (8u << 20) /* names of one batch before a flush */

/* A record of the spool: this header, then len bytes of the encoded batch. */
struct spool_rec {
    uint32_t len;
    uint32_t first; /* the batch that carries rank_info and devices */
    int64_t base_ns;
    uint64_t in_bytes; /* input position when the batch was built (for progress) */
};

#define SPOOL_WBUF (1u << 20) /* write buffer once the spool is a file */

struct kp_kineto_spool {
    size_t mem_limit;
    unsigned char *buf; /* every record while in memory; the write buffer once in a file */
    size_t len, cap;
    int fd; /* the unlinked temporary file, -1 while in memory */
    uint64_t file_bytes;
    uint64_t records, bytes;
    uint64_t in_bytes; /* latest input position the reader reported */
    int64_t base_used; /* the base time the rows were built with */
    bool base_set;
    bool used;     /* a scan wrote to it */
    bool unusable; /* see kp_kineto.h: replay answers KP_KINETO_REPARSE */
    bool replayed;
};

/* The batch being read and where it goes. */
struct spill {
    const struct kp_kineto_opts *opts;
    struct kp_kineto_meta *meta; /* of this parse: batches counted here */
    struct jr *j;                /* errors are the parse's */
    struct kp_batch_builder *bb; /* the batch's rows; the parse creates and frees it */
    int64_t base_ns;             /* its base_ns: the start of its first row */
    bool have_base;
    bool sent_first; /* the batch with rank_info went out */
    size_t max_name;
    kp_kineto_batch_cb *cb; /* NULL in a scan */
    void *cb_ud;
    struct kp_kineto_spool *spool; /* a scan's, or NULL */
};

/* Makes the batch of the rows held (none: nothing, unless no batch went out yet), validates
 * it, spools it and hands it to cb, then starts the next. Returns 0, or the parse's error
 * (KP_EPROTO: the batch is invalid; cb's error). */
int spill_flush(struct spill *sp);

/* The end of a scan: a clean one keeps its spool for the replay (seal), one that failed
 * frees what it holds and makes it answer KP_KINETO_REPARSE (drop). */
void spool_seal(struct kp_kineto_spool *s);
void spool_drop(struct kp_kineto_spool *s);

#endif
