/*
 * kp_secret: reading a secret (a password, a bearer token, a token table) from a file that
 * only its owner may read. A secret on the command line is readable by every local user in
 * /proc/PID/cmdline; a file with mode 0600 (or 0640, for a group the daemon runs in, where
 * allow_group is set) is not.
 */
#ifndef KP_SECRET_H
#define KP_SECRET_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Reads the whole of path into buf (cap bytes, NUL-terminated). what names the file in
 * messages ("the PostgreSQL password file"). Refuses a file that is not a regular file, that
 * others may read (or the group, unless allow_group), that is empty, or that does not fit.
 * Returns the length read, or a negative code (-errno, KP_ECONFIG, KP_ETOOBIG) with a message
 * in errbuf that names path and says what to do, never the contents. On error buf holds no
 * part of the secret.
 */
long kp_secret_file_read(const char *path, const char *what, bool allow_group, char *buf,
                         size_t cap, char *errbuf, size_t errlen);

/* kp_secret_file_read, then cuts buf at its first line end: the secret is the first line (a
 * trailing newline from echo or an editor is not part of it). Refuses an empty first line. */
long kp_secret_file_line(const char *path, const char *what, bool allow_group, char *buf,
                         size_t cap, char *errbuf, size_t errlen);

#endif
