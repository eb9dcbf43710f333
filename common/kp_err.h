/*
 * Error codes. Functions return 0 (or a count) on success and a negative code on failure:
 * -errno for system errors, or one of kprof's own KP_E* codes, which sit in a reserved range
 * below any errno. kp_strerror() names both.
 */
#ifndef KP_ERR_H
#define KP_ERR_H

enum kp_err {
    KP_EBASE = -10000,
    KP_EPG = -10001,       /* PostgreSQL failed (connection, statement, COPY) */
    KP_EPROTO = -10002,    /* malformed or inconsistent protocol message */
    KP_ERPC = -10003,      /* gRPC call failed */
    KP_ENOTFOUND = -10004, /* a named thing (run, rank, job) does not exist */
    KP_ETOOBIG = -10005,   /* over a configured size limit */
    KP_ECONFIG = -10006,   /* bad configuration value */
    KP_ESCHEMA = -10007,   /* database schema is newer than this binary */
    KP_ESHUTDOWN = -10008, /* the object is stopping */
    KP_EWHOLE = -10009,    /* asked to read by windows what can only be read whole */
};

/* Returns a static description of a code from either range. Thread-safe. */
const char *kp_strerror(int err);

#include <stddef.h>

/* Formats a message into errbuf (the caller's buffer, as anet does); does nothing if errbuf
 * is NULL or errlen is 0. */
void kp_errbuf_set(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
