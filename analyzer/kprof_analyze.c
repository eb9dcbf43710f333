/*
 * kprof-analyze: the analyzer core from the command line.
 *   kprof-analyze --pg CONNINFO --run R [--rank N] [--plugin-compat] [--max-rows N]
 *                 breakdown|ops|kernels [--json]
 *   kprof-analyze ... prof [-c COLUMNS] [--csv|--json] [-w WIDTH]
 *   kprof-analyze ... roofline [--by kernel|op] [--top N] [--csv|--json]
 *   kprof-analyze ... [--exact-ns] [--include-last-step] [--consecutive-kernel-delay-us N]
 *                 hta temporal|idle|overlap|kernels|launch|queue [--json]
 * breakdown: the step-time breakdown per step and on average (--plugin-compat: the
 * TensorBoard plugin's double-counting figure instead of kprof's), then the recommendations
 * (analyzer/an_recommend.h: kprof's as text; --json adds the plugin's HTML); ops: the operator view
 * by name and by name + input shapes; kernels: the kernel view by name and by name + op, and the
 * Tensor Core statistics; prof: PyProf's per-kernel table (analyzer/pyprof.h), the columns
 * of -c (default idx,dir,sub,mod,op,kernel,params,sil), columnated (cells cut at -w WIDTH,
 * default none), or every field quoted with --csv, or --json; roofline: achieved FLOP/s and bytes/s
 * per kernel or op against the device's peaks (analyzer/roofline.h), longest first.
 * counters: CUPTI counter values per kernel with the op stack and FLOPs (analyzer/counters.h),
 * -c COLUMNS (default KP_COUNTERS_TEXT_COLUMNS in text, every column in --csv and --json).
 * memory: the memory view's per-operator allocation statistics per device, always as JSON.
 * distributed: the plugin's wait view and communication-ops table across every rank of the
 * run (analyzer/distributed.h; --rank is ignored), or "no distributed view: <why>".
 * hta: HTA's per-rank analyses as JSON (analyze_hta.c; it was kprof-hta).
 * kprofctl VERB: any analysis verb of kprofctl, its Analyzer calls answered in process by the
 * service's views (analyze_ctl.c): kprofctl's output without a kprof-analyzer.
 * These are the offline mode of kprof-analyzer's views: the same computes, in process, reading
 * PostgreSQL directly; kprofctl's verbs get the same figures from the service.
 * --max-rows refuses a rank with more rows than that (0, the default: no limit).
 * --window-events (kprofctl verbs only): as kprof-analyzer's, the same default; 0: whole.
 * Exit codes: 0 ok, 2 usage, 3 unknown run or rank, 1 anything else.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "an_recommend.h"
#include "analyze.h"
#include "counters.h"
#include "distributed.h"
#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"
#include "pyprof.h"
#include "roofline.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kprof-analyze --pg CONNINFO --run R [--rank N] [--plugin-compat] "
            "[--max-rows N] breakdown|ops|kernels [--json]\n"
            "       kprof-analyze ... prof [-c COLUMNS] [--csv|--json] [-w WIDTH]\n"
            "       kprof-analyze ... roofline [--by kernel|op] [--top N] [--csv|--json]\n"
            "       kprof-analyze ... counters [-c COLUMNS] [--csv|--json]\n"
            "       kprof-analyze ... memory\n"
            "       kprof-analyze --pg CONNINFO [--max-rows N] [--window-events N] kprofctl VERB "
            "[VERB's flags]\n"
            "       kprof-analyze ... [--exact-ns] [--include-last-step] "
            "[--consecutive-kernel-delay-us N] hta temporal|idle|overlap|kernels|launch|queue\n"
            "       kprof-analyze ... distributed [--json]\n");
}

static void text_breakdown(const struct kp_an_breakdown *b)
{
    printf("%-8s", "step");
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        printf(" %14.*s", (int) (strlen(kp_an_cat_keys[c]) - 3), kp_an_cat_keys[c]);
    }
    printf(" %14s\n", "total");
    for (size_t s = 0; s < b->n_steps; s++) {
        printf("%-8s", b->steps[s].name);
        for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
            printf(" %14.3f", (double) b->steps[s].cost_ns[c] / 1000.0);
        }
        printf(" %14.3f\n", (double) (b->steps[s].end_ns - b->steps[s].start_ns) / 1000.0);
    }
    printf("%-8s", "average");
    for (int c = 0; c < KP_AN_CAT_COUNT; c++) {
        printf(" %14.3f", b->avg_ns[c] / 1000.0);
    }
    printf(" %14.3f\n(µs)\n", b->avg_total_ns / 1000.0);
}

/* kprof's own recommendations (analyzer/an_recommend.h) under the breakdown table. */
static void text_recommendations(const struct kp_an_recs *r)
{
    if (r->n_text == 0) {
        printf("recommendations: none\n");
        return;
    }
    printf("recommendations:\n");
    for (size_t i = 0; i < r->n_text; i++) {
        printf("  - %s\n", r->text[i]);
    }
}

static void text_ops(const struct kp_an_table *t)
{
    const struct kp_an_op_row *r = t->rows;

    printf("%8s %14s %14s %14s %14s  %s\n", "calls", "host_total", "host_self", "dev_total",
           "dev_self", "name (µs)");
    for (size_t i = 0; i < t->n; i++) {
        printf("%8" PRIu64 " %14.3f %14.3f %14.3f %14.3f  %s\n", r[i].calls,
               (double) r[i].host_total_ns / 1e3, (double) r[i].host_self_ns / 1e3,
               (double) r[i].device_total_ns / 1e3, (double) r[i].device_self_ns / 1e3, r[i].name);
    }
}

static void text_kernels(const struct kp_an_table *t)
{
    const struct kp_an_kernel_row *r = t->rows;

    printf("%8s %14s %12s %12s %12s  %s\n", "calls", "total", "mean", "min", "max", "name (µs)");
    for (size_t i = 0; i < t->n; i++) {
        printf("%8" PRIu64 " %14.3f %12.3f %12.3f %12.3f  %s\n", r[i].calls,
               (double) r[i].total_ns / 1e3, (double) r[i].total_ns / 1e3 / (double) r[i].calls,
               (double) r[i].min_ns / 1e3, (double) r[i].max_ns / 1e3, r[i].name);
    }
}

/* distributed: across the run's ranks; needs no kp_an_create of one rank. A disabled view is
 * no error: the text (or JSON "reason") says why, and so does stderr. */
static int distributed_verb(const char *conninfo, int64_t run, size_t max_rows, bool json)
{
    char err[512] = "";
    PGconn *c = NULL;
    struct kp_distributed *d = NULL;
    int rc;

    rc = kp_pg_connect(conninfo, "kprof-analyze", &c, err, sizeof(err));
    if (rc == 0) {
        rc = kp_distributed_create(c, run, max_rows, &d, err, sizeof(err));
    }
    if (rc == 0) {
        if (json) {
            kp_distributed_json(stdout, d);
        }
        else {
            kp_distributed_text(stdout, d);
        }
        if (!d->enabled) {
            fprintf(stderr, "kprof-analyze: no distributed view: %s\n", d->reason);
        }
    }
    else {
        fprintf(stderr, "kprof-analyze: %s\n", err[0] ? err : kp_strerror(rc));
    }
    kp_distributed_destroy(d);
    PQfinish(c);
    return rc == 0 ? 0 : rc == KP_ENOTFOUND ? 3 : 1;
}

/* counters: CUPTI counter values per kernel (analyzer/counters.h); needs no kp_an_create. The
 * table goes to stdout, its message (no counters, ops not mapped) to stderr (JSON has it). */
static int counters_verb(const char *conninfo, int64_t run, int rank, size_t max_rows,
                         const char *columns, enum kp_counters_format format)
{
    char err[512] = "";
    PGconn *c = NULL;
    struct kp_counters *t = NULL;
    int rc;

    rc = kp_pg_connect(conninfo, "kprof-analyze", &c, err, sizeof(err));
    if (rc == 0) {
        rc = kp_counters_create(c, run, rank, max_rows, &t, err, sizeof(err));
    }
    if (rc == 0) {
        rc = kp_counters_write(stdout, t, run, rank, columns, format, err, sizeof(err));
        if (rc == 0 && format != KP_COUNTERS_JSON && kp_counters_message(t)) {
            fprintf(stderr, "kprof-analyze: %s\n", kp_counters_message(t));
        }
    }
    if (rc < 0) {
        fprintf(stderr, "kprof-analyze: %s\n", err[0] ? err : kp_strerror(rc));
    }
    kp_counters_destroy(t);
    PQfinish(c);
    return rc == 0 ? 0 : rc == KP_ENOTFOUND ? 3 : rc == -EINVAL ? 2 : 1;
}

/* Whether argv[i] is the verb `verb` rather than the value of a flag before it. */
static bool is_verb_at(char **argv, int i, const char *verb)
{
    static const char *const valued[] = { "--pg",
                                          "--run",
                                          "--rank",
                                          "--max-rows",
                                          "-c",
                                          "--columns",
                                          "-w",
                                          "--width",
                                          "--by",
                                          "--top",
                                          "--consecutive-kernel-delay-us" };

    if (strcmp(argv[i], verb) != 0) {
        return false;
    }
    for (size_t k = 0; k < sizeof(valued) / sizeof(valued[0]); k++) {
        if (strcmp(argv[i - 1], valued[k]) == 0) {
            return false;
        }
    }
    return true;
}

int kp_analyze_common_opt(const char *prog, int opt, const char *arg, const char **conninfo,
                          int64_t *run, int *rank)
{
    char *end;

    switch (opt) {
    case 'p':
        *conninfo = arg;
        return 1;
    case 'r':
        *run = strtoll(arg, &end, 10);
        if (*end || *run < 0) {
            fprintf(stderr, "%s: --run takes a run id, not '%s'\n", prog, arg);
            return -1;
        }
        return 1;
    case 'k':
        *rank = (int) strtol(arg, &end, 10);
        if (*end || *rank < 0) {
            fprintf(stderr, "%s: --rank takes a rank, not '%s'\n", prog, arg);
            return -1;
        }
        return 1;
    default:
        return 0;
    }
}

/* What the command line asks for. */
struct args {
    const char *conninfo, *verb;
    int64_t run;
    int rank;
    unsigned long long max_rows, top;
    bool json, compat, csv;
    const char *columns;
    long width;
    enum kp_pyprof_col cols[64];
    int ncols;
    enum kp_roofline_by by;
};

/* `... kprofctl VERB ...` at argv[i]: only --pg, --max-rows and --window-events come before it
 * (analyze_ctl.c). Returns the exit status. */
static int ctl_verb(int argc, char **argv, int i)
{
    const char *conninfo = NULL;
    unsigned long long max_rows = 0, window_events = KP_ANALYZE_WINDOW_EVENTS;
    char *end;

    for (int k = 1; k < i; k++) {
        if (strcmp(argv[k], "--pg") == 0 && k + 1 < i) {
            conninfo = argv[++k];
        }
        else if (strcmp(argv[k], "--max-rows") == 0 && k + 1 < i) {
            max_rows = strtoull(argv[++k], &end, 10);
            if (*end) {
                fprintf(stderr, "kprof-analyze: --max-rows takes a count, not '%s'\n", argv[k]);
                return 2;
            }
        }
        else if (strcmp(argv[k], "--window-events") == 0 && k + 1 < i) {
            window_events = strtoull(argv[++k], &end, 10);
            if (*end || argv[k][0] == '-' || argv[k][0] == '\0') {
                fprintf(stderr, "kprof-analyze: --window-events takes a count, not '%s'\n",
                        argv[k]);
                return 2;
            }
        }
        else {
            fprintf(stderr,
                    "kprof-analyze: before kprofctl only --pg, --max-rows and --window-events "
                    "(the verb takes the rest), not '%s'\n",
                    argv[k]);
            return 2;
        }
    }
    if (conninfo == NULL) {
        usage(stderr);
        return 2;
    }
    return kp_analyze_ctl(conninfo, (size_t) max_rows, (size_t) window_events, argc - i - 1,
                          argv + i + 1);
}

/* One flag of the verbs other than kprofctl and hta into *a. Returns -1 to go on, or the exit
 * status. */
static int parse_opt(int opt, struct args *a)
{
    char *end;
    int rc = kp_analyze_common_opt("kprof-analyze", opt, optarg, &a->conninfo, &a->run, &a->rank);

    if (rc != 0) {
        return rc < 0 ? 2 : -1;
    }
    switch (opt) {
    case 'm':
        a->max_rows = strtoull(optarg, &end, 10);
        if (*end || optarg[0] == '-') {
            fprintf(stderr, "kprof-analyze: --max-rows takes a row count, not '%s'\n", optarg);
            return 2;
        }
        return -1;
    case 'j':
        a->json = true;
        return -1;
    case 'P':
        a->compat = true;
        return -1;
    case 'v':
        a->csv = true;
        return -1;
    case 'c':
        a->columns = optarg;
        return -1;
    case 'w':
        a->width = strtol(optarg, &end, 10);
        if (*end || a->width < 20 || a->width > 100000) {
            fprintf(stderr, "kprof-analyze: -w takes a width of 20 or more, not '%s'\n", optarg);
            return 2;
        }
        return -1;
    case 'b':
        if (strcmp(optarg, "kernel") != 0 && strcmp(optarg, "op") != 0) {
            fprintf(stderr, "kprof-analyze: --by takes kernel or op, not '%s'\n", optarg);
            return 2;
        }
        a->by = strcmp(optarg, "op") == 0 ? KP_ROOFLINE_BY_OP : KP_ROOFLINE_BY_KERNEL;
        return -1;
    case 't':
        a->top = strtoull(optarg, &end, 10);
        if (*end || optarg[0] == '-') {
            fprintf(stderr, "kprof-analyze: --top takes a row count, not '%s'\n", optarg);
            return 2;
        }
        return -1;
    case 'h':
        usage(stdout);
        return 0;
    default:
        usage(stderr);
        return 2;
    }
}

/* The flags and the verb into *a. Returns -1 to go on, or the exit status. */
static int parse_args(int argc, char **argv, struct args *a)
{
    static const struct option longopts[] = { { "pg", required_argument, NULL, 'p' },
                                              { "run", required_argument, NULL, 'r' },
                                              { "rank", required_argument, NULL, 'k' },
                                              { "json", no_argument, NULL, 'j' },
                                              { "plugin-compat", no_argument, NULL, 'P' },
                                              { "max-rows", required_argument, NULL, 'm' },
                                              { "help", no_argument, NULL, 'h' },
                                              { "csv", no_argument, NULL, 'v' },
                                              { "columns", required_argument, NULL, 'c' },
                                              { "width", required_argument, NULL, 'w' },
                                              { "by", required_argument, NULL, 'b' },
                                              { "top", required_argument, NULL, 't' },
                                              { NULL, 0, NULL, 0 } };
    char err[512] = "";
    int opt, rc;

    while ((opt = getopt_long(argc, argv, "c:w:", longopts, NULL)) != -1) {
        if ((rc = parse_opt(opt, a)) >= 0) {
            return rc;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            a->json = true;
        }
        else if (!a->verb) {
            a->verb = argv[i];
        }
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!a->conninfo || a->run < 0 || !a->verb ||
        (strcmp(a->verb, "breakdown") && strcmp(a->verb, "ops") && strcmp(a->verb, "kernels") &&
         strcmp(a->verb, "prof") && strcmp(a->verb, "roofline") && strcmp(a->verb, "counters") &&
         strcmp(a->verb, "memory") && strcmp(a->verb, "distributed"))) {
        usage(stderr);
        return 2;
    }
    if (strcmp(a->verb, "prof") == 0) {
        a->ncols = kp_pyprof_parse_columns(a->columns, a->cols, 64, err, sizeof(err));
        if (a->ncols < 0) {
            fprintf(stderr, "kprof-analyze: %s\n", err);
            return 2;
        }
    }
    return -1;
}

/* roofline: its table, or the error on stderr. Returns the exit status. */
static int roofline_verb(PGconn *c, const struct args *a)
{
    char err[512] = "";
    struct kp_roofline *rl = NULL;
    int rc = kp_roofline_create(c, a->run, a->rank, (size_t) a->max_rows, 0, a->by, &rl, err,
                                sizeof(err));

    if (rc == 0) {
        kp_roofline_write(stdout, rl, a->run, a->rank,
                          a->json  ? KP_ROOFLINE_JSON
                          : a->csv ? KP_ROOFLINE_CSV
                                   : KP_ROOFLINE_TEXT,
                          (size_t) a->top);
    }
    else {
        fprintf(stderr, "kprof-analyze: %s\n", err[0] ? err : kp_strerror(rc));
    }
    kp_roofline_destroy(rl);
    return rc < 0 ? 1 : 0;
}

/* prof: PyProf's table. Returns rc, with *reported when the error is on stderr already. */
static int prof_verb(PGconn *c, const struct args *a, bool *reported)
{
    char err[512] = "";
    struct kp_pyprof *p = NULL;
    int rc = kp_pyprof_create(c, a->run, a->rank, (size_t) a->max_rows, &p, err, sizeof(err));

    if (rc == 0) {
        kp_pyprof_write(stdout, p, a->run, a->rank, a->cols, a->ncols,
                        a->json  ? KP_PYPROF_JSON
                        : a->csv ? KP_PYPROF_CSV
                                 : KP_PYPROF_TEXT,
                        (int) a->width);
    }
    else if (err[0]) {
        fprintf(stderr, "kprof-analyze: %s\n", err);
    }
    kp_pyprof_destroy(p);
    *reported = rc < 0 && err[0];
    return rc;
}

/* memory: the memory view's statistics as JSON. Returns rc. */
static int memory_verb(struct kp_an *an, PGconn *c, const struct args *a)
{
    char err[512] = "";
    int rc;

    printf("{\"run\": %" PRId64 ", \"rank\": %d, \"memory_stats\": ", a->run, a->rank);
    rc = kp_an_memory_json(an, c, a->run, a->rank, (size_t) a->max_rows, stdout, err, sizeof(err));
    printf("}\n");
    if (rc < 0 && err[0]) {
        fprintf(stderr, "kprof-analyze: %s\n", err);
    }
    return rc;
}

/* breakdown: the breakdown and the recommendations, as text or JSON. Returns rc. */
static int breakdown_verb(struct kp_an *an, PGconn *c, const struct args *a)
{
    char err[512] = "";
    const struct kp_an_breakdown *b;
    struct kp_an_recs recs;
    /* the recommendations first: they compute both breakdown figures */
    int rc = kp_an_recommend(an, c, a->run, a->rank, &recs, err, sizeof(err));

    if (rc == 0) {
        rc = kp_an_breakdown(an, a->compat, &b);
    }
    if (rc == 0) {
        if (a->json) {
            char *ov = kp_an_recs_overview_html(&recs);

            printf("{\"run\": %" PRId64 ", \"rank\": %d, \"plugin_compat\": %s, "
                   "\"breakdown\": ",
                   a->run, a->rank, a->compat ? "true" : "false");
            kp_an_breakdown_json(stdout, b);
            printf(", \"recommendations\": ");
            kp_an_recs_json(stdout, &recs, false);
            printf(", \"plugin_recommendations\": {\"items_html\": ");
            kp_an_recs_json(stdout, &recs, true);
            printf(", \"overview_html\": ");
            kp_json_fputs(stdout, ov ? ov : "");
            printf("}}\n");
            free(ov);
            if (!ov) {
                rc = -ENOMEM;
            }
        }
        else {
            text_breakdown(b);
            text_recommendations(&recs);
        }
    }
    else if (err[0]) {
        fprintf(stderr, "kprof-analyze: %s\n", err);
    }
    kp_an_recs_fini(&recs);
    return rc;
}

/* ops or kernels: the view's two tables (and the Tensor Core statistics), as text or JSON.
 * Returns rc. */
static int tables_verb(struct kp_an *an, const struct args *a)
{
    bool ops = strcmp(a->verb, "ops") == 0;
    const struct kp_an_table *t1 = NULL, *t2 = NULL;
    int rc = ops ? kp_an_ops(an, false, &t1) : kp_an_kernels(an, false, &t1);

    if (rc == 0) {
        rc = ops ? kp_an_ops(an, true, &t2) : kp_an_kernels(an, true, &t2);
    }
    if (rc == 0 && a->json) {
        printf("{\"run\": %" PRId64 ", \"rank\": %d, \"%s\": ", a->run, a->rank,
               ops ? "operators_by_name" : "kernels_by_name");
        if (ops) {
            kp_an_ops_json(stdout, t1);
        }
        else {
            kp_an_kernels_json(stdout, t1, false);
        }
        printf(", \"%s\": ", ops ? "operators_by_name_and_input_shape" : "kernels_by_name_op");
        if (ops) {
            kp_an_ops_json(stdout, t2);
        }
        else {
            kp_an_kernels_json(stdout, t2, true);
        }
        if (!ops) {
            struct kp_an_tc tc;

            rc = kp_an_tensor_cores(an, &tc);
            printf(", \"tensor_cores\": ");
            kp_an_tc_json(stdout, &tc);
        }
        printf("}\n");
    }
    else if (rc == 0) {
        if (ops) {
            text_ops(t1);
        }
        else {
            text_kernels(t1);
        }
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct args a = { .run = -1,
                      .columns = KP_PYPROF_DEFAULT_COLUMNS,
                      .width = KP_PYPROF_DEFAULT_WIDTH,
                      .by = KP_ROOFLINE_BY_KERNEL };
    char err[512] = "";
    bool reported = false;
    PGconn *c = NULL;
    struct kp_an *an = NULL;
    int rc;

    for (int i = 1; i < argc; i++) {
        if (is_verb_at(argv, i, "kprofctl")) {
            return ctl_verb(argc, argv, i);
        }
    }
    /* hta has flags of its own (analyze_hta.c): hand it argv without the verb. */
    for (int i = 1; i < argc; i++) {
        if (is_verb_at(argv, i, "hta")) {
            memmove(&argv[i], &argv[i + 1], sizeof(*argv) * (size_t) (argc - i));
            return kp_analyze_hta(argc - 1, argv);
        }
    }
    if ((rc = parse_args(argc, argv, &a)) >= 0) {
        return rc;
    }
    if (strcmp(a.verb, "distributed") == 0) {
        return distributed_verb(a.conninfo, a.run, (size_t) a.max_rows, a.json);
    }
    if (strcmp(a.verb, "counters") == 0) {
        return counters_verb(a.conninfo, a.run, a.rank, (size_t) a.max_rows,
                             strcmp(a.columns, KP_PYPROF_DEFAULT_COLUMNS) ? a.columns : NULL,
                             a.json  ? KP_COUNTERS_JSON
                             : a.csv ? KP_COUNTERS_CSV
                                     : KP_COUNTERS_TEXT);
    }
    rc = kp_pg_connect(a.conninfo, "kprof-analyze", &c, err, sizeof(err));
    if (rc == 0 && (strcmp(a.verb, "roofline") == 0 || strcmp(a.verb, "prof") == 0)) {
        /* they read the rank's rows themselves (kp_pyprof_create): only check that it exists */
        char runs[24], ranks[16];
        const char *params[2] = { runs, ranks };

        snprintf(runs, sizeof(runs), "%" PRId64, a.run);
        snprintf(ranks, sizeof(ranks), "%d", a.rank);
        rc = kp_an_check_rank(c, params, a.run, a.rank, err, sizeof(err));
    }
    else if (rc == 0) {
        rc = kp_an_create(c, a.run, a.rank, (size_t) a.max_rows, &an, err, sizeof(err));
    }
    if (rc < 0) {
        fprintf(stderr, "kprof-analyze: %s\n", err[0] ? err : kp_strerror(rc));
        PQfinish(c);
        return rc == KP_ENOTFOUND ? 3 : 1;
    }
    if (strcmp(a.verb, "roofline") == 0) {
        rc = roofline_verb(c, &a);
        kp_an_destroy(an);
        PQfinish(c);
        return rc;
    }
    if (strcmp(a.verb, "prof") == 0) {
        rc = prof_verb(c, &a, &reported);
    }
    else if (strcmp(a.verb, "memory") == 0) {
        rc = memory_verb(an, c, &a);
    }
    else if (strcmp(a.verb, "breakdown") == 0) {
        rc = breakdown_verb(an, c, &a);
    }
    else {
        rc = tables_verb(an, &a);
    }
    if (rc < 0 && !reported) {
        fprintf(stderr, "kprof-analyze: %s\n", kp_strerror(rc));
    }
    kp_an_destroy(an);
    PQfinish(c);
    return rc < 0 ? 1 : 0;
}
