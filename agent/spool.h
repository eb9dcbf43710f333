/*
 * kp_spool: the agent's on-disk queue of encoded batches between the batcher and the uplink.
 *
 * A directory holds:
 *   seg-<first seq, 20 digits>.kps  append-only segment files of records
 *   acked                           "N\n": every record with seq <= N is acknowledged
 *   stream_id                       "N\n": the agent's producer stream id (random, 63-bit)
 * A record is a struct kp_spool_rec_hdr {magic, len, crc32, pad, seq} followed by len payload
 * bytes (an encoded kprof.v1.Batch without stream and seq). The CRC covers seq and payload.
 * Seqs are assigned by append, 1, 2, 3, ... and stay monotonic across restarts (the acked
 * cursor remembers them when every segment has been deleted).
 *
 * Durability: writes are not fsynced (a crash of the machine may lose the tail); a torn or
 * corrupt tail (a crash of the agent mid-write) is detected by the CRC at open and the segment
 * is truncated there. Records not acknowledged are replayed after a restart.
 *
 * Limits: the sum of the segment files is kept under max_bytes; an append that would pass it
 * is refused (-ENOSPC) and counted as dropped. The last 1/16 of max_bytes (at most
 * KP_SPOOL_TAIL_RESERVE_MAX) is kept for kp_spool_append_tail: a capture's small closing
 * batch, which carries its rank's final drop count, still gets in when the spool is full for
 * data (otherwise those counts would never reach collectord). A segment is closed once it reaches
 * segment_bytes; ack_through deletes the segments whose records are all acknowledged.
 *
 * Threads: every function takes the spool's mutex, so one thread may append while another
 * reads and acknowledges. No function blocks on anything but the disk, except kp_spool_wait.
 */
#ifndef KP_SPOOL_H
#define KP_SPOOL_H

#include <stddef.h>
#include <stdint.h>

#define KP_SPOOL_MAGIC             0x3153504bu /* "KPS1" */
#define KP_SPOOL_DEFAULT_SEGMENT   (16u << 20)
#define KP_SPOOL_MAX_RECORD        (64u << 20)
#define KP_SPOOL_DEFAULT_MAX_BYTES (1ull << 30)

struct kp_spool;

struct kp_spool_rec_hdr {
    uint32_t magic; /* KP_SPOOL_MAGIC */
    uint32_t len;   /* payload bytes */
    uint32_t crc;   /* crc32 (zlib polynomial) of seq (8 bytes, host order) then payload */
    uint32_t pad;
    uint64_t seq;
};

struct kp_spool_stats {
    uint64_t bytes;         /* sum of the segment files now */
    uint32_t segments;      /* segment files now */
    uint64_t next_seq;      /* the seq the next append gets */
    uint64_t acked;         /* every seq <= acked is acknowledged */
    uint64_t appended;      /* records appended since open */
    uint64_t dropped_full;  /* appends refused: max_bytes reached (or the disk failed) */
    uint64_t replayed;      /* unacknowledged records found at open */
    uint64_t torn_bytes;    /* bytes cut off at open (torn or corrupt tails) */
    uint64_t segments_gone; /* segments deleted after acknowledgement */
};

/*
 * Opens (creating it, mkdir -p) the spool in dir: recovers the segments, truncates torn
 * tails, deletes acknowledged segments, reads or creates the stream id. segment_bytes 0:
 * KP_SPOOL_DEFAULT_SEGMENT; max_bytes 0: KP_SPOOL_DEFAULT_MAX_BYTES. Returns 0 and *out
 * (kp_spool_close), or -errno with a message in errbuf.
 */
int kp_spool_open(const char *dir, uint64_t max_bytes, uint64_t segment_bytes,
                  struct kp_spool **out, char *errbuf, size_t errlen);

/* Closes the files and frees the spool (records stay on disk). Accepts NULL. */
void kp_spool_close(struct kp_spool *sp);

/* The producer stream id kept in the spool directory (1..INT64_MAX). */
uint64_t kp_spool_stream_id(const struct kp_spool *sp);

/*
 * Appends one record (buf borrowed) and returns its seq in *seq. Returns 0, -ENOSPC (over
 * max_bytes: dropped and counted), -EMSGSIZE (larger than KP_SPOOL_MAX_RECORD), or -errno of
 * a failed write (the segment is cut back; counted as dropped). Wakes kp_spool_wait.
 */
int kp_spool_append(struct kp_spool *sp, const void *buf, size_t len, uint64_t *seq);

/* The largest record kp_spool_append_tail takes, and the most bytes kept for such records. */
#define KP_SPOOL_TAIL_MAX         4096u
#define KP_SPOOL_TAIL_RESERVE_MAX (1u << 20)

/*
 * kp_spool_append for a record of at most KP_SPOOL_TAIL_MAX bytes that may also use the
 * reserve kept at the end of max_bytes (see Limits). Returns as kp_spool_append; -EMSGSIZE
 * for a larger record; -ENOSPC once the reserve is used up too (max_bytes is never passed).
 */
int kp_spool_append_tail(struct kp_spool *sp, const void *buf, size_t len, uint64_t *seq);

/*
 * Reads the next record in seq order after the previous read (or, after open or
 * kp_spool_rewind, the first unacknowledged one). Returns 1 with *buf (owned: free()), *len
 * and *seq; 0 when there is none yet; or -errno / -EIO (an unreadable record: it is skipped
 * on the next call).
 */
int kp_spool_read(struct kp_spool *sp, uint64_t *seq, uint8_t **buf, size_t *len);

/* Makes the next kp_spool_read start again at the first unacknowledged record. */
void kp_spool_rewind(struct kp_spool *sp);

/*
 * Marks every record with seq <= seq acknowledged: persists the cursor and deletes the
 * segments that hold nothing unacknowledged. A seq at or below the cursor is a no-op.
 * Returns 0 or -errno (persisting the cursor failed; the records are acknowledged in memory).
 */
int kp_spool_ack_through(struct kp_spool *sp, uint64_t seq);

/* The seq of the first unacknowledged record, or the next seq if there is none. */
uint64_t kp_spool_first_unacked(struct kp_spool *sp);

/* Waits up to timeout_ms for an append after the last read found nothing. Returns at once if
 * an unread record exists. */
void kp_spool_wait(struct kp_spool *sp, long long timeout_ms);

/* Wakes kp_spool_wait (stopping). */
void kp_spool_wake(struct kp_spool *sp);

void kp_spool_get_stats(struct kp_spool *sp, struct kp_spool_stats *out);

/* crc32 (zlib's polynomial), continuing from crc (0 to start). */
uint32_t kp_spool_crc32(uint32_t crc, const void *buf, size_t len);

#endif
