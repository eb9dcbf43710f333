/*
 * kp_pg: the libpq helpers every kprof binary shares.
 *
 * Errors: each call returns 0 (or a count) on success. On failure it returns KP_EPG (or
 * -ENOMEM, KP_ECONFIG, KP_ESCHEMA where stated) and writes one line into errbuf: the server's
 * message and SQLSTATE, or libpq's own text when the connection failed. Right after a failed
 * call, kp_pg_last_fault() tells the caller what kind of failure it was, so that it can decide
 * between reconnecting, retrying and giving up on the statement's data.
 *
 * Connections are plain libpq PGconn objects in blocking mode; each helper is as thread-safe
 * as libpq is: one thread per connection at a time. Notices are logged at debug level.
 */
#ifndef KP_PG_H
#define KP_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <libpq-fe.h>

struct kp_strbuf;

/* What went wrong in the last failed kp_pg_* call of this thread. */
enum kp_pg_fault {
    KP_PG_FAULT_NONE,      /* the last call succeeded */
    KP_PG_FAULT_CONN,      /* the connection is lost (CONNECTION_BAD, SQLSTATE 08xxx,
                              57P01..57P03 shutdown): reconnect, then retry */
    KP_PG_FAULT_TRANSIENT, /* the server refused for now (deadlock, serialization failure,
                              out of resources, read-only after a failover, cancelled, lock
                              timeout): roll back and retry the same work later */
    KP_PG_FAULT_STATEMENT, /* the statement or its data is wrong; the same work will fail
                              the same way */
};

/*
 * Connects to conninfo (a libpq conninfo string or URI; "" uses libpq's PG* environment) as
 * application_name, which overrides one in conninfo. Adds connect_timeout=10, TCP keepalive
 * settings and client_encoding=UTF8 where conninfo sets none. Returns 0 and *out (owned: PQfinish);
 * KP_ECONFIG if conninfo does not parse; KP_EPG with libpq's message if the connection failed.
 * Blocks.
 */
int kp_pg_connect(const char *conninfo, const char *application_name, PGconn **out, char *errbuf,
                  size_t errlen);

/*
 * Reads the PostgreSQL password from path (its first line; "" or NULL: nothing to do) once at
 * start, before any thread connects; every later kp_pg_connect passes it to libpq as the
 * password keyword (over one in conninfo, PGPASSWORD or PGPASSFILE). The password is never
 * logged. Refuses a file that the group or others may access (KP_ECONFIG, "... run chmod 600
 * PATH"), one that is not a regular file or is empty (KP_ECONFIG); -errno when it cannot be
 * read. The message in errbuf names the file, never its contents. Not thread-safe.
 */
int kp_pg_password_file_load(const char *path, char *errbuf, size_t errlen);

/*
 * Reopens c after its connection was lost (PostgreSQL restarted, or shut the session down):
 * PQreset, which connects again with the parameters c was opened with (conninfo, application
 * name, timeouts), on the same PGconn. Returns 0; or KP_EPG with "PostgreSQL is unreachable: "
 * and libpq's message in errbuf, leaving c CONNECTION_BAD (kp_pg_last_fault: CONN). Blocks up to
 * connect_timeout.
 */
int kp_pg_reopen(PGconn *c, char *errbuf, size_t errlen);

/* Work on a connection for kp_pg_retry: returns 0, or a code with the reason in errbuf. */
typedef int kp_pg_work_fn(PGconn *c, void *ud, char *errbuf, size_t errlen);

/*
 * The one place where kprof repeats work after PostgreSQL went away under an idle pooled
 * connection: runs fn(c, ud); when that fails with the connection lost (kp_pg_conn_lost right
 * after fn) and repeat is true, reopens c (kp_pg_reopen) and runs fn once more. Only work that
 * is safe to run twice may be repeated: reads, idempotent writes, and a transaction that cannot
 * have committed when the connection broke. With repeat false, fn is not run again and c stays
 * broken (the caller's next connect replaces it). Returns fn's last code; when the connection is
 * lost at the end, KP_EPG with errbuf starting "PostgreSQL is unreachable" and
 * kp_pg_conn_lost(c) true, so the caller can answer UNAVAILABLE. Blocks.
 */
int kp_pg_retry(PGconn *c, bool repeat, kp_pg_work_fn *fn, void *ud, char *errbuf, size_t errlen);

/*
 * Checks that c still reaches PostgreSQL (an empty statement), reopening it once if not: for a
 * caller about to send work that must not be repeated (a transaction whose COMMIT may have
 * taken effect when the connection broke), so that a restart while c sat idle is found before
 * that work goes out. Returns 0, or KP_EPG as kp_pg_retry. Blocks.
 */
int kp_pg_ping(PGconn *c, char *errbuf, size_t errlen);

/* Cell (row, col) of r as an integer, or null_value where it is NULL. */
static inline int64_t kp_pg_i64(const PGresult *r, int row, int col, int64_t null_value)
{
    return PQgetisnull(r, row, col) ? null_value : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* Runs sql (one or more statements, no parameters) and discards the result. Returns 0 or
 * KP_EPG. Blocks. */
int kp_pg_exec(PGconn *c, const char *sql, char *errbuf, size_t errlen);

/*
 * Runs one statement with n_params text parameters (NULL entries are SQL NULLs). Returns 0
 * and, if out is not NULL, the result in *out (owned: PQclear); or KP_EPG. Blocks.
 */
int kp_pg_query(PGconn *c, const char *sql, int n_params, const char *const *params, PGresult **out,
                char *errbuf, size_t errlen);

/*
 * Runs sql, a "COPY (query) TO STDOUT" (text format, no parameters), handing each row to fn as
 * it arrives, without its newline (fields tab-separated, NULL as \N; fn may change the bytes,
 * they are freed after the call): no result of every row is kept. A nonzero return of fn stops
 * the calls (the other rows are read and dropped) and is returned. Returns 0, fn's code or
 * KP_EPG. Blocks.
 */
typedef int kp_pg_row_fn(void *ud, char *row, size_t len);
int kp_pg_copy_out(PGconn *c, const char *sql, kp_pg_row_fn *fn, void *ud, char *errbuf,
                   size_t errlen);

/*
 * COPY in three steps: begin ("COPY table (columns) FROM STDIN", text format), put any number
 * of buffers (whole rows or not: they are one stream), end. kp_pg_copy_end returns the rows
 * copied, or KP_EPG; with abort_reason non-NULL it makes the server abandon the COPY instead
 * (and returns KP_EPG, leaving kp_pg_last_fault as the caller's failure made it). After a
 * failed put, call kp_pg_copy_end with a reason: it takes the connection out of COPY state.
 * Blocks.
 */
int kp_pg_copy_begin(PGconn *c, const char *table, const char *columns, char *errbuf,
                     size_t errlen);
int kp_pg_copy_put(PGconn *c, const char *data, size_t len, char *errbuf, size_t errlen);
long kp_pg_copy_end(PGconn *c, const char *abort_reason, char *errbuf, size_t errlen);

/* Begin, one put of data[0..len), end. Returns the rows copied, or KP_EPG. Blocks. */
long kp_pg_copy_in(PGconn *c, const char *table, const char *columns, const char *data, size_t len,
                   char *errbuf, size_t errlen);

/*
 * Applies the embedded migrations (kp_migrations.h) that the database lacks, in version
 * order, each in its own transaction, recorded in kp_schema_migrations. Concurrent callers
 * (several collectords starting at once) are serialised by a transaction-scoped advisory lock,
 * so each migration runs once. Returns the number applied (0 when the schema was current);
 * KP_ESCHEMA if the database has a version newer than this binary knows; or KP_EPG. Blocks.
 */
int kp_pg_migrate(PGconn *c, char *errbuf, size_t errlen);

/*
 * What a daemon runs on each new connection: checks the schema against the embedded
 * migrations and applies the pending ones (kp_pg_migrate) only when the connected user may
 * change the schema: a member of the owner of kp_schema_migrations (the owner and superusers
 * are), or, in a database without that table, a user who may CREATE in the current schema. A
 * user in role kprof_writer (docs/postgres-roles.md) may not. Returns the number applied (0 when
 * the schema was current: then nothing is locked or created); KP_ESCHEMA with "the schema is at
 * version N, this binary needs M: run kprof-collectord --migrate as the database owner" when
 * migrations are pending and the user may not apply them, or when the database is newer than
 * this binary; or KP_EPG. Blocks.
 */
int kp_pg_migrate_if_owner(PGconn *c, char *errbuf, size_t errlen);

/* Rolls back c's open transaction, if any, keeping this thread's last fault for
 * kp_pg_last_fault (the rollback's own failure is ignored: a lost connection rolls back on
 * its own). Blocks. */
void kp_pg_rollback(PGconn *c);

/* The newest migration version compiled into this binary. */
int kp_pg_schema_version(void);

/*
 * Classifies the last failure of a kp_pg_* call made by this thread on c: see enum
 * kp_pg_fault. Call it right after the failure. c may be NULL (then it is CONN).
 */
enum kp_pg_fault kp_pg_last_fault(const PGconn *c);

/* True if the last failure of this thread on c was a connection loss (KP_PG_FAULT_CONN). */
bool kp_pg_conn_lost(const PGconn *c);

/* The SQLSTATE of this thread's last failed kp_pg_* call ("" if it had none). */
const char *kp_pg_last_sqlstate(void);

/* Classifies a SQLSTATE alone (NULL or "": statement). */
enum kp_pg_fault kp_pg_classify_sqlstate(const char *sqlstate);

/*
 * PostgreSQL array literals ({1,NULL,"a,b"}) for array parameters
 * ($1::bigint[], $2::text[]: unnest(), = ANY()), built in a caller's kp_strbuf (the caller
 * owns it: init/fini). kp_pg_array_open appends '{', each element call appends one element
 * (with the comma when it is not the first), kp_pg_array_close appends '}'; the buffer may hold
 * other text before the '{'. One array is open at a time. Each returns 0, -ENOMEM or KP_ETOOBIG
 * (kp_strbuf's returns); after a failure the buffer's array is incomplete.
 */
int kp_pg_array_open(struct kp_strbuf *sb);
int kp_pg_array_close(struct kp_strbuf *sb);
int kp_pg_array_i64(struct kp_strbuf *sb, int64_t v);
/* A NULL element. */
int kp_pg_array_null(struct kp_strbuf *sb);
/* s as a double-quoted element (" and \ escaped), so that "", "NULL", commas and braces stay
 * text; a NULL s is a NULL element. */
int kp_pg_array_text(struct kp_strbuf *sb, const char *s);
/* The whole array "{v[0],...,v[n-1]}" ("{}" when n is 0). */
int kp_pg_array_i64s(struct kp_strbuf *sb, const int64_t *v, size_t n);

/*
 * Reads an integer array's text as PostgreSQL writes it (COPY or a text result: "{1,-2,NULL}",
 * no quotes, no blanks), one element a call: *p starts at the '{' and is left after what was
 * read. Returns 1 with the element in *v (0 and *null true for NULL), 0 at the end (the '}'
 * consumed), or -EINVAL for anything else (another type, a nested array, a value outside
 * int64); *p is then left where it was.
 */
int kp_pg_array_next_i64(const char **p, int64_t *v, bool *null);

/* The next element of each of n integer arrays walked in step (cur[k] as for
 * kp_pg_array_next_i64): 1 with v[k] and null[k] filled, 0 when all of them end together, or
 * -EINVAL for a malformed one or arrays of different lengths. */
int kp_pg_arrays_next_i64(const char **cur, int n, int64_t *v, bool *null);

/* Splits a row of COPY ... TO STDOUT text (as kp_pg_copy_out hands it over: len bytes, with a
 * writable byte at row[len]) into nf fields in place, f[i] NULL for \N. The fields are not
 * unescaped (numbers and arrays of numbers need no unescaping). 0, or -EINVAL when the row has
 * another number of fields. */
int kp_pg_copy_fields(char *row, size_t len, char **f, int nf);

/* A field of kp_pg_copy_fields that holds an integer the server wrote (optional '-', digits),
 * or null_value for NULL (f NULL). Reads up to the first other character; no range check (the
 * server's text of a number column is in range; anything else gives some value, never UB). */
int64_t kp_pg_field_i64(const char *f, int64_t null_value);

#endif
