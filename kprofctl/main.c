/*
 * kprofctl: kprof's command-line client, verbs in the kubectl style (docs/design.md "kprofctl").
 * This file only dispatches: `kprofctl VERB [flags] [args]` runs the verb's entry point from
 * the table below. To add a verb, write kprofctl/<verb>.c with its struct kp_rpcverb_spec
 * (rpcverb.h) and `int kprofctl_<verb>(int argc, char **argv)` that runs it with
 * kp_rpcverb_main, declare that in kprofctl.h and add a row here.
 */
#include <stdio.h>
#include <string.h>

#include "kprofctl.h"

#ifndef KPROF_VERSION
#define KPROF_VERSION "dev"
#endif

static const struct kprofctl_verb verbs[] = {
    { "import", "load torch.profiler (Kineto) trace files into a new run", kprofctl_import },
    { "export", "write a run as Chrome/Perfetto trace JSON (one file per rank)", kprofctl_export },
    { "runs", "list runs, newest first (--job J, --limit N, --json, --csv)", kprofctl_runs },
    { "jobs", "list the ranks registered with kprof-agents, by job (--job J)", kprofctl_jobs },
    { "start", "start a capture of a job; prints the run id (--job J, --steps N, --wait)",
      kprofctl_start },
    { "stop", "end a capture's window early (--run R or --job J)", kprofctl_stop },
    { "status", "each rank's state in the captures (--run R, --watch)", kprofctl_status },
    { "breakdown", "a rank's step-time breakdown per step and on average (--run R, --rank N)",
      kprofctl_breakdown },
    { "ops", "a rank's operator view (--run R, --rank N, --group-by name|shapes, --top N)",
      kprofctl_ops },
    { "kernels", "a rank's kernel view (--run R, --rank N, --group-by name|op, --top N)",
      kprofctl_kernels },
    { "prof", "a rank's PyProf per-kernel table (--run R, --rank N, -c COLS, -w WIDTH)",
      kprofctl_prof },
    { "roofline", "a rank's achieved FLOP/s and bytes/s vs the GPU's peaks (--run R, --by op)",
      kprofctl_roofline },
    { "compare", "which rank holds the job back, and why (--run R, --step S)", kprofctl_compare },
    { "counters", "CUPTI counters per kernel, its op stack and FLOPs (--run R, --rank N)",
      kprofctl_counters },
    { "hta", "HTA's analyses of a rank: temporal, idle, overlap, kernels, launch, queue, ...",
      kprofctl_hta },
    { "memory", "a rank's memory view: allocations per device and op (--run R, --rank N)",
      kprofctl_memory },
    { "distributed", "a run's distributed view: wait time per rank and step, comm ops (--run R)",
      kprofctl_distributed },
    { "diff", "two runs or two ranks side by side: steps, ops, kernels (--run A --run B)",
      kprofctl_diff },
};
#define N_VERBS (sizeof(verbs) / sizeof(verbs[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: kprofctl VERB [flags] [args]\n\nverbs:\n");
    for (size_t i = 0; i < N_VERBS; i++) {
        fprintf(out, "  %-12s %s\n", verbs[i].name, verbs[i].summary);
    }
    fprintf(out,
            "\n`kprofctl VERB --help` lists a verb's flags. Flags also come from the environment\n"
            "(KPROF_<FLAG>, e.g. KPROF_COLLECTOR) and /etc/kprof/kprofctl.conf.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("kprofctl %s\n", KPROF_VERSION);
        return 0;
    }
    for (size_t i = 0; i < N_VERBS; i++) {
        if (strcmp(argv[1], verbs[i].name) == 0) {
            return verbs[i].run(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "kprofctl: unknown verb \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
