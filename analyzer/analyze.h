/* kprof-analyze's verbs that live apart from kprof_analyze.c. */
#ifndef KP_ANALYZE_H
#define KP_ANALYZE_H

/* `kprof-analyze ... hta ANALYSIS ...` with "hta" taken out of argv: HTA's per-rank analyses
 * as JSON (analyze_hta.c). Returns the exit status: 0 ok, 2 usage, 3 unknown run or rank, 1
 * anything else. */
int kp_analyze_hta(int argc, char **argv);

#endif
