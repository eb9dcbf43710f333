/*
 * kp_ready: the "ready file" a daemon (collectord, the analyzer, the agent) writes once it
 * serves, so that a supervisor or a test learns the bound addresses (--ready-file PATH).
 *
 * The file holds one "key=value" line per entry, e.g. "grpc=127.0.0.1:50051" and
 * "http=127.0.0.1:9400". It appears whole or not at all: it is written to PATH.tmp and renamed
 * onto PATH, so a reader that sees PATH sees every line.
 */
#ifndef KP_READY_H
#define KP_READY_H

#include <stddef.h>

struct kp_ready_entry {
    const char *key;   /* "grpc", "http", "socket" */
    const char *value; /* NULL: the line is left out (e.g. http when no HTTP listener) */
};

/*
 * Writes the n entries to path (through path.tmp and rename). path NULL or "": writes nothing
 * and returns 0. Returns 0, or a negative errno with "cannot write --ready-file ..." in errbuf.
 */
int kp_ready_file_write(const char *path, const struct kp_ready_entry *entries, size_t n,
                        char *errbuf, size_t errlen);

#endif
