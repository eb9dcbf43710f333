/*
 * kprof-analyze hta: HTA's per-rank analyses (analyzer/hta.h) computed in process, the
 * offline mode of kprofctl hta (analyzer/view_hta.c computes the same kp_hta_create).
 *   kprof-analyze --pg CONNINFO --run R [--rank N] [--exact-ns] [--include-last-step]
 *             [--consecutive-kernel-delay-us N] hta
 * temporal|idle|overlap|kernels|launch|queue|membw
 *             [--json]
 * The output is JSON (times in µs, bandwidths in GB/s) with or without --json. --exact-ns and
 * --include-last-step are kprof's departures from HTA (HTA rounds times to whole µs and
 * drops the last ProfilerStep).
 * Exit codes: 0 ok, 2 usage, 3 unknown run or rank, 1 anything else.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "hta.h"
#include "kp_err.h"
#include "kp_pg.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kprof-analyze --pg CONNINFO --run R [--rank N] [--exact-ns] "
               "[--include-last-step] [--consecutive-kernel-delay-us N] "
               "hta temporal|idle|overlap|kernels|launch|queue|membw [--json]\n");
}

static bool known(const char *v)
{
    static const char *const verbs[] = { "temporal", "idle",  "overlap", "kernels",
                                         "launch",   "queue", "membw" };

    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
        if (strcmp(verbs[i], v) == 0) {
            return true;
        }
    }
    return false;
}

int kp_analyze_hta(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "pg", required_argument, NULL, 'p' },
        { "run", required_argument, NULL, 'r' },
        { "rank", required_argument, NULL, 'k' },
        { "json", no_argument, NULL, 'j' },
        { "exact-ns", no_argument, NULL, 'x' },
        { "include-last-step", no_argument, NULL, 'l' },
        { "consecutive-kernel-delay-us", required_argument, NULL, 'd' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *conninfo = NULL, *verb = NULL;
    char err[512] = "", *end;
    int64_t run = -1;
    int rank = 0, opt, rc, status = 1;
    long long delay;
    struct kp_hta_opts o;
    PGconn *c = NULL;
    struct kp_hta *h = NULL;

    kp_hta_opts_init(&o);
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if ((rc = kp_analyze_common_opt("kprof-analyze hta", opt, optarg, &conninfo, &run,
                                        &rank)) != 0) {
            if (rc < 0) {
                return 2;
            }
            continue;
        }
        switch (opt) {
        case 'j':
            break; /* JSON is the only output */
        case 'x':
            o.exact_ns = true;
            break;
        case 'l':
            o.include_last_step = true;
            break;
        case 'd':
            delay = strtoll(optarg, &end, 10);
            if (*end || delay < 0 || delay > 1000000000LL) {
                fprintf(stderr,
                        "kprof-analyze hta: --consecutive-kernel-delay-us takes µs, not '%s'\n",
                        optarg);
                return 2;
            }
            o.consecutive_kernel_delay_ns = delay * 1000;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            continue;
        }
        if (verb) {
            fprintf(stderr, "kprof-analyze hta: one analysis at a time ('%s' and '%s')\n", verb,
                    argv[i]);
            return 2;
        }
        verb = argv[i];
    }
    if (!conninfo || run < 0 || !verb) {
        usage(stderr);
        return 2;
    }
    if (!known(verb)) {
        fprintf(stderr, "kprof-analyze hta: unknown analysis '%s'\n", verb);
        usage(stderr);
        return 2;
    }
    rc = kp_pg_connect(conninfo, "kprof-analyze", &c, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "kprof-analyze hta: %s\n", err);
        goto out;
    }
    rc = kp_hta_create(c, run, rank, &o, &h, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "kprof-analyze hta: %s\n", err[0] ? err : kp_strerror(rc));
        status = rc == KP_ENOTFOUND ? 3 : 1;
        goto out;
    }
    if (kp_hta_write_json(h, verb, stdout) < 0 || fflush(stdout) != 0) {
        fprintf(stderr, "kprof-analyze hta: writing the output failed\n");
        goto out;
    }
    status = 0;
out:
    kp_hta_destroy(h);
    if (c) {
        PQfinish(c);
    }
    return status;
}
