/* kprof-analyze's verbs that live apart from kprof_analyze.c. */
#ifndef KP_ANALYZE_H
#define KP_ANALYZE_H

#include <stddef.h>
#include <stdint.h>

/* `kprof-analyze ... hta ANALYSIS ...` with "hta" taken out of argv: HTA's per-rank analyses
 * as JSON (analyze_hta.c). Returns the exit status: 0 ok, 2 usage, 3 unknown run or rank, 1
 * anything else. */
int kp_analyze_hta(int argc, char **argv);

/* `kprof-analyze --pg CONNINFO [--max-rows N] [--window-events N] kprofctl VERB ...` (argv from
 * VERB on): kprofctl's analysis verb VERB, its Analyzer calls answered in process by the views
 * of view.h (analyze_ctl.c), window_events as kprof-analyzer's --window-events. Returns the
 * verb's exit status (kprofctl.h); 5 when PostgreSQL is unreachable. */
/* kprof-analyzer's and kprof-analyze's default --window-events (a string for the config
 * table). */
#define KP_ANALYZE_WINDOW_EVENTS   1000000
#define KP_ANALYZE_WINDOW_EVENTS_S "1000000"

int kp_analyze_ctl(const char *conninfo, size_t max_rows, size_t window_events, int argc,
                   char **argv);

/* The flags of kprof-analyze that its hta verb shares (kprof_analyze.c): opt, getopt_long's
 * 'p' (--pg), 'r' (--run) or 'k' (--rank) with its argument arg, into *conninfo, *run or *rank.
 * Returns 1 when opt was one of them, 0 when not, -1 (a usage error, said on stderr after
 * "prog: ") when arg is not a run id or rank. */
int kp_analyze_common_opt(const char *prog, int opt, const char *arg, const char **conninfo,
                          int64_t *run, int *rank);

#endif
