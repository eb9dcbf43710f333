/*
 * kprofctl hta ANALYSIS --run R [--rank N] [--exact-ns] [--include-last-step]
 *                       [--consecutive-kernel-delay-us N] [--json|--csv] [-c COLS] [-w WIDTH]:
 * one of HTA's per-rank analyses (docs/specs/hta-analyses.md §2-§7, §11), from kprof-analyzer's
 * Analyzer.Hta. ANALYSIS and its table (times in µs, exact; NaN where HTA gives NaN is "-" in
 * text and CSV, null in JSON):
 *   temporal      one row: idle_us, compute_us, non_compute_us, kernel_us (the window),
 *                 idle_pct, compute_pct, non_compute_pct (unrounded)
 *   idle          per stream and category (host_wait, kernel_wait, other): idle_us,
 *                 idle_ratio, and the gaps' interval statistics count, mean_us, std_us,
 *                 min_us, p25_us, p50_us, p75_us, max_us
 *   overlap       one row: comm_us, overlap_us, overlap_pct
 *   kernel-types  per set of kernel types active at once: kernel_type, sum_us, pct (of the
 *                 sum of all)
 *   kernels       the top kernels per type (folded as HTA does): name, kernel_type, sum_us,
 *                 max_us, min_us, mean_us, std_us
 *   launch        one row: launches, cpu_mean_us, gpu_mean_us, delay_mean_us, delay_p50_us,
 *                 delay_max_us, gpu_shorter, runtime_outliers, delay_outliers (HTA's cut-offs)
 *   launches      per launch: correlation, cpu_us, gpu_us, delay_us
 *   queue         per stream: the queue length's count, mean, std, min, p25, p50, p75, max,
 *                 blocked_us and blocked_rel (at HTA's max queue length, 1024)
 *   membw         per memory operation kind (Memcpy DtoD, Memset, ...): the summed bandwidth
 *                 of the kind's memcpys/memsets at each change point (§11): count,
 *                 mean_gbps, std_gbps, min_gbps, p25_gbps, p50_gbps, p75_gbps, max_gbps
 *                 (6 significant digits in text and CSV, all in JSON);
 *                 events, and bw_from_bytes_per_ns: of them, those without the trace's
 *                 figure (a CUPTI capture), whose bandwidth is bytes / the exact ns duration
 * By default the figures are HTA's (times rounded to whole µs, the last ProfilerStep
 * dropped); --exact-ns and --include-last-step are kprof's departures.
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or rank (or a rank without GPU events),
 * 5 kprof-analyzer (or its PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "hta"
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "rpcverb.h"
#include "table.h"

struct analysis;

struct hta_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    const struct analysis *an;       /* the analysis named first */
    bool exact_ns;
    bool include_last_step;
    long long delay_us; /* -1: HTA's default */
};

#define OFF(f) offsetof(struct hta_config, f)
static const struct kp_config_def hta_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
    { "exact-ns", KP_CONFIG_BOOL, "false", 0, 0, OFF(exact_ns),
      "kprof's exact ns instead of HTA's whole-µs rounding", NULL, false },
    { "include-last-step", KP_CONFIG_BOOL, "false", 0, 0, OFF(include_last_step),
      "keep the last ProfilerStep (HTA drops it)", NULL, false },
    { "consecutive-kernel-delay-us", KP_CONFIG_INT, "-1", -1, 1000000000LL, OFF(delay_us),
      "idle: a gap shorter than this is kernel_wait (-1: HTA's 30 µs)", NULL, false },
};
#undef OFF

#define SYNOPSIS_HEAD                                                                         \
    "kprofctl hta temporal|idle|overlap|kernel-types|kernels|launch|launches|queue|membw\n"   \
    "             --run R [--rank N] [--exact-ns] [--include-last-step]\n"                    \
    "             [--consecutive-kernel-delay-us N] [--json|--csv] [-c COLS] [-w WIDTH]\n"    \
    "  One of HTA's per-rank analyses (Analyzer.Hta), with HTA's figures by default (times\n" \
    "  rounded to whole µs, the last ProfilerStep dropped). Times in µs, bandwidths in GB/s.\n"

static const struct kp_table_col temporal_cols[] = {
    { "idle_us", KP_TABLE_NUMERIC },         { "compute_us", KP_TABLE_NUMERIC },
    { "non_compute_us", KP_TABLE_NUMERIC },  { "kernel_us", KP_TABLE_NUMERIC },
    { "idle_pct", KP_TABLE_NUMERIC },        { "compute_pct", KP_TABLE_NUMERIC },
    { "non_compute_pct", KP_TABLE_NUMERIC },
};
static const struct kp_table_col idle_cols[] = {
    { "stream", KP_TABLE_NUMERIC },  { "category", KP_TABLE_TEXT },
    { "idle_us", KP_TABLE_NUMERIC }, { "idle_ratio", KP_TABLE_NUMERIC },
    { "count", KP_TABLE_NUMERIC },   { "mean_us", KP_TABLE_NUMERIC },
    { "std_us", KP_TABLE_NUMERIC },  { "min_us", KP_TABLE_NUMERIC },
    { "p25_us", KP_TABLE_NUMERIC },  { "p50_us", KP_TABLE_NUMERIC },
    { "p75_us", KP_TABLE_NUMERIC },  { "max_us", KP_TABLE_NUMERIC },
};
static const struct kp_table_col overlap_cols[] = {
    { "comm_us", KP_TABLE_NUMERIC },
    { "overlap_us", KP_TABLE_NUMERIC },
    { "overlap_pct", KP_TABLE_NUMERIC },
};
static const struct kp_table_col types_cols[] = {
    { "kernel_type", KP_TABLE_TEXT },
    { "sum_us", KP_TABLE_NUMERIC },
    { "pct", KP_TABLE_NUMERIC },
};
static const struct kp_table_col kernels_cols[] = {
    { "name", KP_TABLE_TEXT },      { "kernel_type", KP_TABLE_TEXT },
    { "sum_us", KP_TABLE_NUMERIC }, { "max_us", KP_TABLE_NUMERIC },
    { "min_us", KP_TABLE_NUMERIC }, { "mean_us", KP_TABLE_NUMERIC },
    { "std_us", KP_TABLE_NUMERIC },
};
static const struct kp_table_col launch_cols[] = {
    { "launches", KP_TABLE_NUMERIC },       { "cpu_mean_us", KP_TABLE_NUMERIC },
    { "gpu_mean_us", KP_TABLE_NUMERIC },    { "delay_mean_us", KP_TABLE_NUMERIC },
    { "delay_p50_us", KP_TABLE_NUMERIC },   { "delay_max_us", KP_TABLE_NUMERIC },
    { "gpu_shorter", KP_TABLE_NUMERIC },    { "runtime_outliers", KP_TABLE_NUMERIC },
    { "delay_outliers", KP_TABLE_NUMERIC },
};
static const struct kp_table_col launches_cols[] = {
    { "correlation", KP_TABLE_NUMERIC },
    { "cpu_us", KP_TABLE_NUMERIC },
    { "gpu_us", KP_TABLE_NUMERIC },
    { "delay_us", KP_TABLE_NUMERIC },
};
static const struct kp_table_col queue_cols[] = {
    { "stream", KP_TABLE_NUMERIC },      { "count", KP_TABLE_NUMERIC },
    { "mean", KP_TABLE_NUMERIC },        { "std", KP_TABLE_NUMERIC },
    { "min", KP_TABLE_NUMERIC },         { "p25", KP_TABLE_NUMERIC },
    { "p50", KP_TABLE_NUMERIC },         { "p75", KP_TABLE_NUMERIC },
    { "max", KP_TABLE_NUMERIC },         { "blocked_us", KP_TABLE_NUMERIC },
    { "blocked_rel", KP_TABLE_NUMERIC },
};

static const struct kp_table_col membw_cols[] = {
    { "name", KP_TABLE_TEXT },
    { "count", KP_TABLE_NUMERIC },
    { "mean_gbps", KP_TABLE_NUMERIC },
    { "std_gbps", KP_TABLE_NUMERIC },
    { "min_gbps", KP_TABLE_NUMERIC },
    { "p25_gbps", KP_TABLE_NUMERIC },
    { "p50_gbps", KP_TABLE_NUMERIC },
    { "p75_gbps", KP_TABLE_NUMERIC },
    { "max_gbps", KP_TABLE_NUMERIC },
    { "events", KP_TABLE_NUMERIC },
    { "bw_from_bytes_per_ns", KP_TABLE_NUMERIC },
};

typedef int add_rows_fn(const struct kp_rpcverb *v, struct kp_table *t,
                        const Kprof__V1__HtaResponse *r);

struct analysis {
    const char *name;
    Kprof__V1__HtaAnalysis rpc;
    struct kp_rpcverb_spec spec;
    add_rows_fn *add;
};

static int hta_request(struct kp_rpcverb *v, ProtobufCMessage *msg);
static int hta_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg);

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define SPEC(verb, cols_)                                                                     \
    {                                                                                         \
        .name = "hta " verb, .synopsis = SYNOPSIS_HEAD, .exit_ok = "shown", .defs = hta_defs, \
        .n_defs = N_OF(hta_defs), .cols = cols_, .n_cols = N_OF(cols_), .analyzer = true,     \
        .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK, .method = "Hta",                       \
        .req_desc = &kprof__v1__hta_request__descriptor,                                      \
        .resp_desc = &kprof__v1__hta_response__descriptor, .request = hta_request,            \
        .rows = hta_rows,                                                                     \
    }

/* x exactly (kp_rpcverb_set_exact), or null when HTA has NaN. */
static int set_num(const struct kp_rpcverb *v, struct kp_table *t, size_t col, double x)
{
    return isfinite(x) ? kp_rpcverb_set_exact(v, t, col, x) : kp_table_set_null(t, col);
}

/* GB/s: 6 significant digits in text and CSV (a copy can move well under 0.001 GB/s), all
 * of them in JSON; null for NaN. */
static int set_gbps(const struct kp_rpcverb *v, struct kp_table *t, size_t col, double x)
{
    if (!isfinite(x)) {
        return kp_table_set_null(t, col);
    }
    return kp_table_set_double(t, col, x, v->format == KP_TABLE_FORMAT_JSON ? "%.17g" : "%.6g");
}

static int set_usd(const struct kp_rpcverb *v, struct kp_table *t, size_t col, double ns)
{
    return set_num(v, t, col, ns / 1000.0);
}

static int add_temporal(const struct kp_rpcverb *v, struct kp_table *t,
                        const Kprof__V1__HtaResponse *r)
{
    static const Kprof__V1__HtaTemporal zero = KPROF__V1__HTA_TEMPORAL__INIT;
    const Kprof__V1__HtaTemporal *x = r->temporal != NULL ? r->temporal : &zero;
    int rc = kp_table_add_row(t);

    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 0, x->idle_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 1, x->compute_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 2, x->non_compute_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 3, x->kernel_ns);
    rc = rc != 0 ? rc : set_num(v, t, 4, x->idle_pct);
    rc = rc != 0 ? rc : set_num(v, t, 5, x->compute_pct);
    rc = rc != 0 ? rc : set_num(v, t, 6, x->non_compute_pct);
    return rc;
}

/* count, mean, std, min, quartiles, max from column col on; times in µs when us, else set
 * by set (NULL: set_num). */
static int set_stats_as(const struct kp_rpcverb *v, struct kp_table *t, size_t col,
                        const Kprof__V1__HtaStats *s, bool us,
                        int (*set)(const struct kp_rpcverb *, struct kp_table *, size_t, double))
{
    static const Kprof__V1__HtaStats zero = KPROF__V1__HTA_STATS__INIT;
    const double vals[7] = { s ? s->mean : 0, s ? s->std : 0, s ? s->min : 0, s ? s->q25 : 0,
                             s ? s->q50 : 0,  s ? s->q75 : 0, s ? s->max : 0 };
    int rc;

    s = s != NULL ? s : &zero;
    set = us ? set_usd : set != NULL ? set : set_num;
    rc = kp_table_set_u64(t, col, s->count);
    for (int i = 0; i < 7 && rc == 0; i++) {
        rc = set(v, t, col + 1 + (size_t) i, vals[i]);
    }
    return rc;
}

static int set_stats(const struct kp_rpcverb *v, struct kp_table *t, size_t col,
                     const Kprof__V1__HtaStats *s, bool us)
{
    return set_stats_as(v, t, col, s, us, NULL);
}

static int add_idle(const struct kp_rpcverb *v, struct kp_table *t, const Kprof__V1__HtaResponse *r)
{
    int rc = 0;

    for (size_t i = 0; i < r->n_idle && rc == 0; i++) {
        for (size_t c = 0; c < r->idle[i]->n_categories && rc == 0; c++) {
            const Kprof__V1__HtaIdleCategory *x = r->idle[i]->categories[c];

            rc = kp_table_add_row(t);
            rc = rc != 0 ? rc : kp_table_set_i64(t, 0, r->idle[i]->stream);
            rc = rc != 0 ? rc : kp_table_set_str(t, 1, x->category);
            rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 2, x->idle_ns);
            rc = rc != 0 ? rc : set_num(v, t, 3, x->ratio);
            rc = rc != 0 ? rc : set_stats(v, t, 4, x->interval_stats, true);
        }
    }
    return rc;
}

static int add_overlap(const struct kp_rpcverb *v, struct kp_table *t,
                       const Kprof__V1__HtaResponse *r)
{
    static const Kprof__V1__HtaOverlap zero = KPROF__V1__HTA_OVERLAP__INIT;
    const Kprof__V1__HtaOverlap *x = r->overlap != NULL ? r->overlap : &zero;
    int rc = kp_table_add_row(t);

    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 0, x->comm_ns);
    rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 1, x->overlap_ns);
    rc = rc != 0 ? rc : set_num(v, t, 2, x->pct);
    return rc;
}

static int add_types(const struct kp_rpcverb *v, struct kp_table *t,
                     const Kprof__V1__HtaResponse *r)
{
    double total = 0;
    int rc = 0;

    for (size_t i = 0; i < r->n_kernel_types; i++) {
        total += (double) r->kernel_types[i]->sum_ns;
    }
    for (size_t i = 0; i < r->n_kernel_types && rc == 0; i++) {
        const Kprof__V1__HtaKernelType *x = r->kernel_types[i];

        rc = kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_str(t, 0, x->kernel_type);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 1, x->sum_ns);
        rc = rc != 0 ? rc : set_num(v, t, 2, 100.0 * (double) x->sum_ns / total);
    }
    return rc;
}

static int add_kernels(const struct kp_rpcverb *v, struct kp_table *t,
                       const Kprof__V1__HtaResponse *r)
{
    int rc = 0;

    for (size_t i = 0; i < r->n_kernels && rc == 0; i++) {
        const Kprof__V1__HtaKernelRow *x = r->kernels[i];

        rc = kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_str(t, 0, x->name);
        rc = rc != 0 ? rc : kp_table_set_str(t, 1, x->kernel_type);
        rc = rc != 0 ? rc : set_usd(v, t, 2, x->sum_ns);
        rc = rc != 0 ? rc : set_usd(v, t, 3, x->max_ns);
        rc = rc != 0 ? rc : set_usd(v, t, 4, x->min_ns);
        rc = rc != 0 ? rc : set_usd(v, t, 5, x->mean_ns);
        rc = rc != 0 ? rc : set_usd(v, t, 6, x->std_ns);
    }
    return rc;
}

static int add_launch(const struct kp_rpcverb *v, struct kp_table *t,
                      const Kprof__V1__HtaResponse *r)
{
    static const Kprof__V1__HtaLaunchSummary zero = KPROF__V1__HTA_LAUNCH_SUMMARY__INIT;
    const Kprof__V1__HtaLaunchSummary *x = r->launch_summary != NULL ? r->launch_summary : &zero;
    int rc = kp_table_add_row(t);

    rc = rc != 0 ? rc : kp_table_set_u64(t, 0, x->n);
    rc = rc != 0 ? rc : set_usd(v, t, 1, x->cpu_mean_ns);
    rc = rc != 0 ? rc : set_usd(v, t, 2, x->gpu_mean_ns);
    rc = rc != 0 ? rc : set_usd(v, t, 3, x->delay_mean_ns);
    rc = rc != 0 ? rc : set_usd(v, t, 4, x->delay_p50_ns);
    rc = rc != 0 ? rc : set_usd(v, t, 5, x->delay_max_ns);
    rc = rc != 0 ? rc : kp_table_set_u64(t, 6, x->n_gpu_shorter);
    rc = rc != 0 ? rc : kp_table_set_u64(t, 7, x->n_runtime_outliers);
    rc = rc != 0 ? rc : kp_table_set_u64(t, 8, x->n_delay_outliers);
    return rc;
}

static int add_launches(const struct kp_rpcverb *v, struct kp_table *t,
                        const Kprof__V1__HtaResponse *r)
{
    int rc = 0;

    (void) v;
    for (size_t i = 0; i < r->n_launches && rc == 0; i++) {
        const Kprof__V1__HtaLaunchRow *x = r->launches[i];

        rc = kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_i64(t, 0, x->correlation);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 1, x->cpu_ns);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 2, x->gpu_ns);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 3, x->delay_ns);
    }
    return rc;
}

static int add_queue(const struct kp_rpcverb *v, struct kp_table *t,
                     const Kprof__V1__HtaResponse *r)
{
    int rc = 0;

    for (size_t i = 0; i < r->n_queue && rc == 0; i++) {
        const Kprof__V1__HtaQueueStream *x = r->queue[i];

        rc = kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_i64(t, 0, x->stream);
        rc = rc != 0 ? rc : set_stats(v, t, 1, x->queue_length, false);
        rc = rc != 0 ? rc : kp_rpcverb_set_us(t, 9, x->blocked_ns);
        rc = rc != 0 ? rc : set_num(v, t, 10, x->blocked_rel);
    }
    return rc;
}

static int add_membw(const struct kp_rpcverb *v, struct kp_table *t,
                     const Kprof__V1__HtaResponse *r)
{
    int rc = 0;

    for (size_t i = 0; i < r->n_membw && rc == 0; i++) {
        const Kprof__V1__HtaMembwRow *x = r->membw[i];

        rc = kp_table_add_row(t);
        rc = rc != 0 ? rc : kp_table_set_str(t, 0, x->name);
        rc = rc != 0 ? rc : set_stats_as(v, t, 1, x->memory_bw_gbps, false, set_gbps);
        rc = rc != 0 ? rc : kp_table_set_u64(t, 9, x->events);
        rc = rc != 0 ? rc : kp_table_set_u64(t, 10, x->computed);
    }
    return rc;
}

static const struct analysis analyses[] = {
    { "temporal", KPROF__V1__HTA_ANALYSIS__HTA_TEMPORAL, SPEC("temporal", temporal_cols),
      add_temporal },
    { "idle", KPROF__V1__HTA_ANALYSIS__HTA_IDLE, SPEC("idle", idle_cols), add_idle },
    { "overlap", KPROF__V1__HTA_ANALYSIS__HTA_OVERLAP, SPEC("overlap", overlap_cols), add_overlap },
    { "kernel-types", KPROF__V1__HTA_ANALYSIS__HTA_KERNELS, SPEC("kernel-types", types_cols),
      add_types },
    { "kernels", KPROF__V1__HTA_ANALYSIS__HTA_KERNELS, SPEC("kernels", kernels_cols), add_kernels },
    { "launch", KPROF__V1__HTA_ANALYSIS__HTA_LAUNCH, SPEC("launch", launch_cols), add_launch },
    { "launches", KPROF__V1__HTA_ANALYSIS__HTA_LAUNCH, SPEC("launches", launches_cols),
      add_launches },
    { "queue", KPROF__V1__HTA_ANALYSIS__HTA_QUEUE, SPEC("queue", queue_cols), add_queue },
    { "membw", KPROF__V1__HTA_ANALYSIS__HTA_MEMBW, SPEC("membw", membw_cols), add_membw },
};

static int hta_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct hta_config *cfg = v->cfg;
    Kprof__V1__HtaRequest *req = (Kprof__V1__HtaRequest *) msg;

    req->analysis = cfg->an->rpc;
    req->exact_ns = cfg->exact_ns;
    req->include_last_step = cfg->include_last_step;
    req->has_consecutive_kernel_delay_ns = cfg->delay_us >= 0;
    req->consecutive_kernel_delay_ns = cfg->delay_us >= 0 ? cfg->delay_us * 1000 : 0;
    return 0;
}

static int hta_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    const struct hta_config *cfg = v->cfg;

    return cfg->an->add(v, t, (const Kprof__V1__HtaResponse *) msg);
}

static int usage(FILE *out, int status)
{
    fputs(SYNOPSIS_HEAD "\n`kprofctl hta ANALYSIS --help` lists the flags and the columns.\n", out);
    return status;
}

int kprofctl_hta(int argc, char **argv)
{
    const struct analysis *an = NULL;
    struct hta_config cfg;
    char *av[256];

    if (argc < 2 || argv[1][0] == '-') {
        if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
            return usage(stdout, KPROFCTL_EXIT_OK);
        }
        fprintf(stderr, "kprofctl hta: name the analysis first\n");
        return usage(stderr, KPROFCTL_EXIT_USAGE);
    }
    for (size_t i = 0; i < N_OF(analyses); i++) {
        if (strcmp(argv[1], analyses[i].name) == 0) {
            an = &analyses[i];
        }
    }
    if (an == NULL) {
        fprintf(stderr, "kprofctl hta: unknown analysis \"%s\"\n", argv[1]);
        return usage(stderr, KPROFCTL_EXIT_USAGE);
    }
    if (argc > (int) N_OF(av)) {
        fprintf(stderr, "kprofctl hta: too many arguments\n");
        return KPROFCTL_EXIT_USAGE;
    }
    /* "hta ANALYSIS flags..." as "hta flags..." */
    av[0] = argv[0];
    for (int i = 2; i < argc; i++) {
        av[i - 1] = argv[i];
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.an = an;
    return kp_rpcverb_main(&an->spec, &cfg, argc - 1, av);
}
