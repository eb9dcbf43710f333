/*
 * fuzz_pgtext: the analyzer's reader of PostgreSQL's COPY text for kernel chunks (common/kp_pg.h:
 * kp_pg_copy_fields splits a row, kp_pg_field_i64 reads a field as a number,
 * kp_pg_arrays_next_i64 walks its integer arrays in step, as analyzer/an.c and analyzer/pyprof.c
 * do). Any input must be read to its end or refused with
 * -EINVAL, without a crash or sanitizer report, and never yield more elements than it has
 * commas and braces to delimit.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kp_pg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant);

#define NF 4

size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant)
{
    static const char *const seeds[] = {
        "{1,2,3}\t{-4,NULL,6}\t{7,8,9}\t{NULL,NULL,NULL}",
        "{1700000000123456789}\t{9223372036854775807}\t{-9223372036854775808}\t{0}",
        "{}\t{}\t{}\t{}",
    };
    const char *s = seeds[variant % 3];
    size_t n = strlen(s);

    if (n > cap) {
        return 0;
    }
    memcpy(buf, s, n);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *row = malloc(size + 1);
    char *f[NF];
    const char *cur[NF];
    int64_t v[NF];
    bool null[NF];
    size_t elements = 0, delims = 0;
    int rc;

    if (!row) {
        return 0;
    }
    memcpy(row, data, size);
    for (size_t i = 0; i < size; i++) {
        delims += data[i] == ',' || data[i] == '}';
    }
    if (kp_pg_copy_fields(row, size, f, NF) == 0) {
        for (int k = 0; k < NF; k++) { /* a field as a number, as the analyzer's rows read it */
            volatile int64_t x = kp_pg_field_i64(f[k], -1);

            (void) x;
        }
        for (int k = 0; k < NF; k++) {
            cur[k] = f[k] ? f[k] : "{}";
        }
        while ((rc = kp_pg_arrays_next_i64(cur, NF, v, null)) == 1) {
            for (int k = 0; k < NF; k++) {
                if (null[k] && v[k] != 0) {
                    abort();
                }
            }
            if (++elements * NF > delims) {
                abort(); /* more elements than the text can delimit */
            }
        }
        if (rc != 0 && rc != -EINVAL) {
            abort();
        }
    }
    free(row);
    return 0;
}
