/*
 * kprofctl's verbs. main.c dispatches `kprofctl VERB ARGS...` through a table of struct
 * kprofctl_verb; each verb lives in its own .c file, and its flags are kp_config rows (so
 * --help works per verb and KPROF_<KEY> env vars apply). Every verb but import is a struct
 * kp_rpcverb_spec (rpcverb.h): the common flags, the call, the error-to-exit-status mapping and
 * the text/CSV/JSON output are kp_rpcverb's, and the verb keeps its own flags, request, rows
 * and printing; the capture verbs share how a capture is shown (capview.h).
 *
 * Exit statuses. Every verb over collectord uses these, and its --help lists them:
 *   0    ok
 *   1    failed: collectord refused for a reason not listed below, the output could not be
 *        written, or (start --wait, status --watch) a rank of the capture FAILED
 *   2    usage: bad flags, or collectord found the request invalid (INVALID_ARGUMENT, e.g. a
 *        rank outside the job's world size)
 *   3    not found: an unknown job or run (NOT_FOUND)
 *   4    busy: a selected rank is capturing already (ALREADY_EXISTS)
 *   5    collectord unreachable (UNAVAILABLE, DEADLINE_EXCEEDED)
 *   6    no agent: a selected rank has no kprof-agent attached, or is live on two hosts
 *        (FAILED_PRECONDITION)
 *   7    refused: no or wrong credential, or a role that may not do this (UNAUTHENTICATED,
 *        PERMISSION_DENIED): the message names --token-file / KPROF_TOKEN_FILE and the role
 *   130  interrupted (SIGINT) while waiting (start --wait, status --watch)
 * import and export keep their own (import.c, export.c): 0, 1, 2, 5, 7 and, for export, 3.
 */
#ifndef KPROFCTL_H
#define KPROFCTL_H

enum kprofctl_exit {
    KPROFCTL_EXIT_OK = 0,
    KPROFCTL_EXIT_FAILED = 1,
    KPROFCTL_EXIT_USAGE = 2,
    KPROFCTL_EXIT_NOT_FOUND = 3,
    KPROFCTL_EXIT_BUSY = 4,
    KPROFCTL_EXIT_UNREACHABLE = 5,
    KPROFCTL_EXIT_NO_AGENT = 6,
    KPROFCTL_EXIT_REFUSED = 7,
    KPROFCTL_EXIT_INTERRUPTED = 130,
};

/* --help's line for exit 7, the same in every verb. */
/* The largest reply kprofctl takes from a daemon (gRPC's default is 64 MiB). */
#define KPROFCTL_MAX_REPLY ((size_t) 1 << 30)

#define KPROFCTL_EXIT_REFUSED_HELP                                                       \
    "refused: no or wrong credential, or a role that may not do this (UNAUTHENTICATED, " \
    "PERMISSION_DENIED): give --token-file (KPROF_TOKEN_FILE) with a token of the role " \
    "the message names"

/* A verb's entry point: argv[0] is the verb's name. Returns the process exit status
 * (enum kprofctl_exit). */
typedef int kprofctl_verb_cb(int argc, char **argv);

struct kprofctl_verb {
    const char *name;
    const char *summary; /* one line for `kprofctl --help` */
    kprofctl_verb_cb *run;
};

/* kprofctl import --job NAME FILE_OR_DIR...: torch.profiler traces into a run (import.c). */
int kprofctl_import(int argc, char **argv);

/* kprofctl export --run R [--rank N] -o FILE|DIR|-: a run as Chrome trace JSON (export.c).
 * Also exits 3 when the run or rank does not exist. */
int kprofctl_export(int argc, char **argv);

/* kprofctl runs [--job J] [--limit N] [--json|--csv] [-c COLS] [-w WIDTH]: the newest runs
 * from Control.ListRuns as a table (runs.c). */
int kprofctl_runs(int argc, char **argv);

/* kprofctl jobs [--job J] [--json|--csv] [-c COLS] [-w WIDTH]: every registered rank of every
 * job from Control.ListJobs, one row each (jobs.c). */
int kprofctl_jobs(int argc, char **argv);

/* kprofctl start --job J [--ranks all|0,3-5] [--steps N | --duration 30s] ... [--wait]:
 * Control.StartCapture; prints the run id (start.c). */
int kprofctl_start(int argc, char **argv);

/* kprofctl stop (--run R | --job J): Control.StopCapture; prints the capture's ranks
 * (stop.c). */
int kprofctl_stop(int argc, char **argv);

/* kprofctl status [--run R] [--watch]: Control.CaptureStatus, one row per rank of each
 * capture (status.c). */
int kprofctl_status(int argc, char **argv);

/* kprofctl breakdown --run R [--rank N] [--plugin-compat]: the step-time breakdown from
 * kprof-analyzer's Analyzer.Breakdown, one row per step and an average row (breakdown.c).
 * The analyzer verbs use the statuses above with kprof-analyzer in collectord's place
 * (--analyzer, KPROF_ANALYZER); 4 and 6 do not occur. */
int kprofctl_breakdown(int argc, char **argv);

/* kprofctl ops --run R [--rank N] [--group-by name|shapes] [--top N]: the operator view
 * (Analyzer.Ops; ops.c). */
int kprofctl_ops(int argc, char **argv);

/* kprofctl kernels --run R [--rank N] [--group-by name|op] [--top N]: the kernel view
 * (Analyzer.Kernels; kernels.c). */
int kprofctl_kernels(int argc, char **argv);

/* kprofctl prof --run R [--rank N] [-c COLS] [--csv|--json] [-w WIDTH]: PyProf's per-kernel
 * table (Analyzer.ProfRows, streamed; prof.c), as kprof-analyze prof prints it. */
int kprofctl_prof(int argc, char **argv);

/* kprofctl roofline --run R [--rank N] [--by kernel|op] [--top N]: achieved FLOP/s and
 * bytes/s against the device's peaks (Analyzer.Roofline; roofline.c). */
int kprofctl_roofline(int argc, char **argv);

/* kprofctl compare --run R [--step S]: per-rank step times, stragglers and the verdict
 * (analyzer/compare.h) from Analyzer.Compare (compare.c). Exits 0, 1, 2, 3 (unknown run or
 * step) or 5 (kprof-analyzer or its PostgreSQL unreachable). */
int kprofctl_compare(int argc, char **argv);

/* kprofctl counters --run R [--rank N] [-c COLS] [--json|--csv]: CUPTI counter values per
 * kernel with its op stack and FLOPs (analyzer/counters.h) from Analyzer.Counters
 * (counters.c), as kprof-analyze counters prints them. Exits 0, 1, 2, 3 (unknown run or rank)
 * or 5 (kprof-analyzer or its PostgreSQL unreachable). */
int kprofctl_counters(int argc, char **argv);

/* kprofctl hta ANALYSIS: one of HTA's per-rank analyses (hta.c). */
int kprofctl_hta(int argc, char **argv);

/* kprofctl memory: the memory view of a rank (memory.c). */
int kprofctl_memory(int argc, char **argv);

/* kprofctl distributed: the distributed view of a run (distributed.c). */
int kprofctl_distributed(int argc, char **argv);

/* kprofctl diff: one rank of a run against another run's rank, or two ranks of one run
 * (Analyzer.Diff). */
int kprofctl_diff(int argc, char **argv);

#endif
