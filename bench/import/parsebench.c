/*
 * kprof-bench-parse: how fast kp_kineto reads one trace file without any network: the scan
 * (parse, map, build and validate batches, as `kprofctl import` does first) and, with
 * --convert, a second parse whose batches are packed like kp_push does. Prints one JSON line:
 * {"json_bytes":N,"events":N,"batches":N,"scan_s":S,"scan_mb_s":X[,"convert_s":S,...]}.
 *
 * usage: kprof-bench-parse [--convert] [--reps N] FILE
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_kineto.h"
#include "kprof.pb-c.h"

struct sink {
    uint8_t *buf;
    size_t cap;
    uint64_t bytes;
};

static int pack_cb(Kprof__V1__Batch *b, void *ud)
{
    struct sink *s = ud;
    size_t len = kprof__v1__batch__get_packed_size(b);

    if (len > s->cap) {
        uint8_t *p = realloc(s->buf, len);

        if (p == NULL) {
            return -ENOMEM;
        }
        s->buf = p;
        s->cap = len;
    }
    s->bytes += kprof__v1__batch__pack(b, s->buf);
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    struct kp_kineto_opts o;
    struct kp_kineto_meta meta, conv;
    struct sink s = { NULL, 0, 0 };
    double scan[15], cvt[15];
    const char *path = NULL;
    bool convert = false;
    int reps = 3, rc;
    char err[1024];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--convert") == 0) {
            convert = true;
        }
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        }
        else if (argv[i][0] != '-' && path == NULL) {
            path = argv[i];
        }
        else {
            fprintf(stderr, "usage: kprof-bench-parse [--convert] [--reps N] FILE\n");
            return 2;
        }
    }
    if (path == NULL || reps < 1 || reps > 15) {
        fprintf(stderr, "usage: kprof-bench-parse [--convert] [--reps 1..15] FILE\n");
        return 2;
    }
    memset(&o, 0, sizeof(o));
    for (int r = 0; r < reps; r++) {
        double t0 = kp_mono_s();

        o.meta = NULL;
        if ((rc = kp_kineto_parse_file(path, &o, NULL, NULL, &meta, err, sizeof(err))) != 0) {
            fprintf(stderr, "kprof-bench-parse: %s\n", err);
            return 1;
        }
        scan[r] = kp_mono_s() - t0;
        if (convert) {
            o.meta = &meta;
            o.run_id = 1;
            t0 = kp_mono_s();
            if ((rc = kp_kineto_parse_file(path, &o, pack_cb, &s, &conv, err, sizeof(err))) != 0) {
                fprintf(stderr, "kprof-bench-parse: %s\n", err);
                return 1;
            }
            cvt[r] = kp_mono_s() - t0;
        }
    }
    qsort(scan, (size_t) reps, sizeof(double), cmp_d);
    printf("{\"json_bytes\":%" PRIu64 ",\"events\":%" PRIu64 ",\"batches\":%" PRIu64
           ",\"scan_s\":%.6f,\"scan_mb_s\":%.1f",
           meta.json_bytes, meta.events, meta.batches, scan[reps / 2],
           (double) meta.json_bytes / 1e6 / scan[reps / 2]);
    if (convert) {
        qsort(cvt, (size_t) reps, sizeof(double), cmp_d);
        printf(",\"convert_s\":%.6f,\"convert_mb_s\":%.1f,\"encoded_bytes\":%" PRIu64,
               cvt[reps / 2], (double) meta.json_bytes / 1e6 / cvt[reps / 2],
               s.bytes / (uint64_t) reps);
    }
    printf("}\n");
    free(s.buf);
    return 0;
}
