/*
 * kprofctl's verbs. main.c dispatches `kprofctl VERB ARGS...` through a table of struct
 * kprofctl_verb; each verb lives in its own .c file and parses its own flags with
 * kp_config_load_args (so --help works per verb and KPROF_<KEY> env vars apply).
 */
#ifndef KPROFCTL_H
#define KPROFCTL_H

/* A verb's entry point: argv[0] is the verb's name. Returns the process exit status:
 * 0 success, 1 failure (message printed), 2 bad usage. */
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
 * from Control.ListRuns as a table (runs.c). Also exits 5 when collectord is unreachable. */
int kprofctl_runs(int argc, char **argv);

#endif
