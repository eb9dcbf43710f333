/*
 * roofline: achieved FLOP/s and bytes/s against the device's peaks (see roofline.h).
 *
 * DESIGN. One pass over PyProf's table (kp_pyprof_create) assigns each kernel its device's peak
 * for its class and adds it to its group (kernel full name, or op and direction); a group
 * keeps sums only, so the figures are ratios of sums (roofline.h), and the table may come a
 * window at a time (kp_pyprof_each): its rows arrive in the same order either way.
 * Devices come from the `devices` rows of the rank. The groups' names are copies (r->names):
 * the table goes as soon as it is summed.
 */
#include "roofline.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_err.h"
#include "kp_pg.h"
#include "pyprof.h"

#define T 1e12 /* TFLOP/s */
#define G 1e9  /* GB/s */

/*
 * Datasheet peaks, dense (without 2:4 sparsity), boost clock. FP16 is the Tensor Core figure
 * with FP32 accumulation (PyTorch's default): for GeForce cards it is half the FP16-accumulate
 * figure NVIDIA headlines. 0: no such path (Volta and Turing have no TF32 or FP8; Ampere no
 * FP8).
 *  - V100: NVIDIA Tesla V100 datasheet (2020): SXM2 15.7 FP32 / 125 Tensor TFLOPS / 900 GB/s
 *    HBM2 (DGX Station's V100-DGXS is the SXM2 part); PCIe 14 / 112 / 900; V100S PCIe
 *    16.4 / 130 / 1134.
 *  - A100: NVIDIA A100 datasheet (2021): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS; HBM2
 *    1,555 GB/s (40GB), HBM2e 2,039 GB/s (80GB SXM) and 1,935 GB/s (80GB PCIe).
 *  - H100: NVIDIA H100 datasheet (2023): SXM FP32 67, TF32 494.5, BF16/FP16 989.5, FP8
 *    1,979 TFLOPS (the sparse figures halved), 3.35 TB/s; PCIe 51 / 378 / 756 / 1,513, 2 TB/s;
 *    NVL 60 / 417.5 / 835.5 / 1,670.5, 3.9 TB/s.
 *  - H200: NVIDIA H200 datasheet (2024), SXM: compute as H100 SXM, 4.8 TB/s HBM3e.
 *  - L4: NVIDIA L4 datasheet (2023): FP32 30.3, TF32 60, BF16/FP16 121, FP8 242.5, 300 GB/s.
 *  - L40S: NVIDIA L40S datasheet (2023): FP32 91.6, TF32 183, BF16/FP16 362.05, FP8 733,
 *    864 GB/s.
 *  - A10: NVIDIA A10 datasheet (2021): FP32 31.2, TF32 62.5, BF16/FP16 125, 600 GB/s.
 *  - T4: NVIDIA T4 datasheet (2019): FP32 8.1, mixed FP16/FP32 65 TFLOPS, 320 GB/s.
 *  - RTX 4090: NVIDIA Ada Lovelace architecture whitepaper v1.0 (2022), appendix table:
 *    FP32 82.6, TF32 82.6, FP16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3,
 *    1,008 GB/s.
 *  - RTX 3090: NVIDIA Ampere GA102 GPU architecture whitepaper v2.0 (2021): FP32 35.6, TF32
 *    35.6, FP16 with FP32 accumulate 71, 936 GB/s.
 * The first entry that matches wins: model is a whole word of the name, variant a substring
 * in any case (more specific variants come first).
 */
static const struct kp_roofline_gpu gpus[] = {
    { "H100 NVL", "H100", "NVL", { 60 * T, 417.5 * T, 835.5 * T, 1670.5 * T }, 3900 * G },
    { "H100 PCIe", "H100", "PCIe", { 51 * T, 378 * T, 756 * T, 1513 * T }, 2000 * G },
    { "H100 SXM", "H100", NULL, { 67 * T, 494.5 * T, 989.5 * T, 1979 * T }, 3350 * G },
    { "H200 SXM", "H200", NULL, { 67 * T, 494.5 * T, 989.5 * T, 1979 * T }, 4800 * G },
    { "A100 80GB PCIe", "A100", "80GB PCIe", { 19.5 * T, 156 * T, 312 * T, 0 }, 1935 * G },
    { "A100 80GB SXM", "A100", "80GB", { 19.5 * T, 156 * T, 312 * T, 0 }, 2039 * G },
    { "A100 40GB", "A100", NULL, { 19.5 * T, 156 * T, 312 * T, 0 }, 1555 * G },
    { "V100S PCIe", "V100S", NULL, { 16.4 * T, 0, 130 * T, 0 }, 1134 * G },
    { "V100 PCIe", "V100", "PCIE", { 14 * T, 0, 112 * T, 0 }, 900 * G },
    { "V100 SXM2", "V100", NULL, { 15.7 * T, 0, 125 * T, 0 }, 900 * G },
    { "L40S", "L40S", NULL, { 91.6 * T, 183 * T, 362.05 * T, 733 * T }, 864 * G },
    { "L4", "L4", NULL, { 30.3 * T, 60 * T, 121 * T, 242.5 * T }, 300 * G },
    { "A10", "A10", NULL, { 31.2 * T, 62.5 * T, 125 * T, 0 }, 600 * G },
    { "T4", "T4", NULL, { 8.1 * T, 0, 65 * T, 0 }, 320 * G },
    { "RTX 4090", "4090", NULL, { 82.6 * T, 82.6 * T, 165.2 * T, 330.3 * T }, 1008 * G },
    { "RTX 3090", "3090", NULL, { 35.6 * T, 35.6 * T, 71 * T, 0 }, 936 * G },
};

struct kp_roofline {
    enum kp_roofline_by by;
    struct kp_roofline_device devs[KP_ROOFLINE_MAX_DEVICES];
    size_t n_devs;
    struct kp_roofline_row *rows;
    size_t n_rows;
    struct kp_an_pool names; /* the rows' names */
    size_t windows;          /* the rank was read in (1: whole) */
};

/* A group's sums while building. */
struct acc {
    double flops_time, bytes_time, ai_flops, ai_bytes, peak_work;
    bool peak_missing;
    int peak; /* -1: none yet, KP_ROOFLINE_PEAK_COUNT + 1: mixed */
};

static bool word_at(const char *name, const char *p, size_t len)
{
    return (p == name || !isalnum((unsigned char) p[-1])) && !isalnum((unsigned char) p[len]);
}

static bool has_word(const char *name, const char *w)
{
    size_t len = strlen(w);

    for (const char *p = strstr(name, w); p != NULL; p = strstr(p + 1, w)) {
        if (word_at(name, p, len)) {
            return true;
        }
    }
    return false;
}

static bool has_ci(const char *s, const char *sub)
{
    size_t n = strlen(sub);

    for (; *s; s++) {
        if (strncasecmp(s, sub, n) == 0) {
            return true;
        }
    }
    return false;
}

const struct kp_roofline_gpu *kp_roofline_lookup(const char *device_name)
{
    for (size_t i = 0; i < sizeof(gpus) / sizeof(gpus[0]); i++) {
        if (has_word(device_name, gpus[i].model) &&
            (gpus[i].variant == NULL || has_ci(device_name, gpus[i].variant))) {
            return &gpus[i];
        }
    }
    return NULL;
}

/* FP32 lanes per SM (CUDA C Programming Guide, "Arithmetic Instructions"), 0: unknown. */
static int fp32_lanes(int major, int minor)
{
    if (major == 6) {
        return minor == 0 ? 64 : 128;
    }
    if (major == 7 || (major == 8 && minor == 0)) {
        return 64;
    }
    if (major == 8 || major == 9) {
        return 128;
    }
    return 0;
}

/* Dense FP16 Tensor Core FLOP per clock per SM (datasheet peak / SMs / boost clock: V100
 * 125 T / 80 / 1.53 GHz = 1024, A100 312 T / 108 / 1.41 GHz = 2048, H100 SXM 989.5 T / 132 /
 * 1.83 GHz = 4096, A10 and L4 1024), 0: none or unknown. */
static int tc_fp16_per_clk(int major, int minor)
{
    if (major == 7 && minor != 1) {
        return 1024;
    }
    if (major == 8) {
        return minor == 0 ? 2048 : 1024;
    }
    if (major == 9) {
        return 4096;
    }
    return 0;
}

void kp_roofline_device_peaks(struct kp_roofline_device *d, int sm_count, int clock_khz,
                              int cc_major, int cc_minor, double bandwidth_bytes_per_s)
{
    const struct kp_roofline_gpu *g = kp_roofline_lookup(d->name);
    double hz = (double) clock_khz * 1e3;

    memset(d->peak_flop_per_s, 0, sizeof(d->peak_flop_per_s));
    d->bandwidth_bytes_per_s = 0;
    d->entry[0] = '\0';
    if (sm_count > 0 && clock_khz > 0 && fp32_lanes(cc_major, cc_minor) > 0 &&
        bandwidth_bytes_per_s > 0) {
        double tc = (double) sm_count * tc_fp16_per_clk(cc_major, cc_minor) * hz;

        d->peak_flop_per_s[KP_ROOFLINE_FP32] =
            (double) sm_count * fp32_lanes(cc_major, cc_minor) * 2 * hz;
        d->peak_flop_per_s[KP_ROOFLINE_FP16_TC] = tc;
        d->peak_flop_per_s[KP_ROOFLINE_TF32_TC] = cc_major >= 8 ? tc / 2 : 0;
        d->peak_flop_per_s[KP_ROOFLINE_FP8_TC] =
            cc_major == 9 || (cc_major == 8 && cc_minor == 9) ? tc * 2 : 0;
        d->bandwidth_bytes_per_s = bandwidth_bytes_per_s;
        snprintf(d->source, sizeof(d->source),
                 "device properties (sm_count=%d clock_khz=%d cc=%d.%d "
                 "memory_bandwidth_bytes_per_s=%.0f)",
                 sm_count, clock_khz, cc_major, cc_minor, bandwidth_bytes_per_s);
        return;
    }
    if (g != NULL) {
        memcpy(d->peak_flop_per_s, g->peak_flop_per_s, sizeof(d->peak_flop_per_s));
        d->bandwidth_bytes_per_s = g->bandwidth_bytes_per_s;
        snprintf(d->entry, sizeof(d->entry), "%s", g->entry);
        snprintf(d->source, sizeof(d->source),
                 "built-in table entry \"%s\" (device name \"%s\" matches \"%s\"%s%s%s; its "
                 "properties carry no clock or bandwidth)",
                 g->entry, d->name, g->model, g->variant ? " and \"" : "",
                 g->variant ? g->variant : "", g->variant ? "\"" : "");
        return;
    }
    snprintf(d->source, sizeof(d->source),
             "none: device name \"%s\" is not in the built-in table and its properties lack the "
             "clock, SM count, compute capability or memory bandwidth",
             d->name);
}

/* The peak class of a kernel from PyProf's tc and params (type=). */
static enum kp_roofline_peak kernel_peak(const struct kp_pyprof_row *r)
{
    const char *t = strstr(r->params, "type=");
    char ty[24] = "";

    if (t != NULL) {
        snprintf(ty, sizeof(ty), "%.*s", (int) strcspn(t + 5, ",; "), t + 5);
    }
    if (strcmp(r->tc, "1") == 0) {
        if (has_ci(ty, "fp8") || has_ci(ty, "float8") || has_ci(ty, "e4m3") || has_ci(ty, "e5m2")) {
            return KP_ROOFLINE_FP8_TC;
        }
        if (strcmp(ty, "fp32") == 0 || strcmp(ty, "tf32") == 0) {
            return KP_ROOFLINE_TF32_TC;
        }
        return KP_ROOFLINE_FP16_TC;
    }
    if (strcmp(ty, "fp64") == 0 || strcmp(ty, "c128") == 0) {
        return KP_ROOFLINE_NO_PEAK;
    }
    return KP_ROOFLINE_FP32;
}

/* The device's peak for a class; a Tensor Core class the device lacks falls back to FP16. */
static double device_peak(const struct kp_roofline_device *d, enum kp_roofline_peak p)
{
    if (d == NULL || p >= KP_ROOFLINE_PEAK_COUNT) {
        return 0;
    }
    if (d->peak_flop_per_s[p] <= 0 && (p == KP_ROOFLINE_TF32_TC || p == KP_ROOFLINE_FP8_TC)) {
        return d->peak_flop_per_s[KP_ROOFLINE_FP16_TC];
    }
    return d->peak_flop_per_s[p];
}

static const struct kp_roofline_device *find_dev(const struct kp_roofline *r, int id)
{
    for (size_t i = 0; i < r->n_devs; i++) {
        if (r->devs[i].id == id) {
            return &r->devs[i];
        }
    }
    return r->n_devs == 1 ? &r->devs[0] : NULL;
}

static int load_devices(PGconn *c, struct kp_roofline *r, int64_t run, int rank, char *errbuf,
                        size_t errlen)
{
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    PGresult *res = NULL;
    int rc;

    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    rc = kp_pg_query(c,
                     "SELECT id, name, coalesce(sm_count, 0), coalesce(clock_khz, 0), "
                     "coalesce(cc_major, 0), coalesce(cc_minor, 0), "
                     "coalesce(memory_bandwidth_bytes_per_s, 0) FROM devices "
                     "WHERE run_id = $1 AND rank = $2 ORDER BY id",
                     2, params, &res, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    for (int i = 0; i < PQntuples(res) && r->n_devs < KP_ROOFLINE_MAX_DEVICES; i++) {
        struct kp_roofline_device *d = &r->devs[r->n_devs++];

        d->id = atoi(PQgetvalue(res, i, 0));
        snprintf(d->name, sizeof(d->name), "%s", PQgetvalue(res, i, 1));
        kp_roofline_device_peaks(d, atoi(PQgetvalue(res, i, 2)), atoi(PQgetvalue(res, i, 3)),
                                 atoi(PQgetvalue(res, i, 4)), atoi(PQgetvalue(res, i, 5)),
                                 strtod(PQgetvalue(res, i, 6), NULL));
    }
    PQclear(res);
    return 0;
}

/* FNV-1a of a group's key. */
static size_t key_hash(const char *name, const char *dir)
{
    uint64_t h = 1469598103934665603ULL;

    for (const char *s = name; *s; s++) {
        h = (h ^ (unsigned char) *s) * 1099511628211ULL;
    }
    h = (h ^ '/') * 1099511628211ULL;
    for (const char *s = dir; *s; s++) {
        h = (h ^ (unsigned char) *s) * 1099511628211ULL;
    }
    return (size_t) h;
}

static int cmp_rows(const void *pa, const void *pb)
{
    const struct kp_roofline_row *a = pa, *b = pb;
    int c;

    if (a->time_ns != b->time_ns) {
        return a->time_ns > b->time_ns ? -1 : 1;
    }
    if ((c = strcmp(a->name, b->name)) != 0) {
        return c;
    }
    return strcmp(a->dir, b->dir);
}

static void flag_row(struct kp_roofline_row *g)
{
    bool c = g->compute_fraction_defined && g->compute_fraction > 1.0;
    bool b = g->bandwidth_fraction_defined && g->bandwidth_fraction > 1.0;

    snprintf(g->above_peak, sizeof(g->above_peak), "%s%s%s", c ? "compute" : "", c && b ? "," : "",
             b ? "bandwidth" : "");
}

static void finish_row(struct kp_roofline_row *g, const struct acc *a)
{
    snprintf(g->peak, sizeof(g->peak), "%s",
             a->peak < 0 ? "-"
             : a->peak > KP_ROOFLINE_PEAK_COUNT
                 ? "mixed"
                 : kp_roofline_peak_name((enum kp_roofline_peak) a->peak));
    if (g->flops_known && a->flops_time > 0) {
        g->flop_per_s = g->flops / (a->flops_time * 1e-9);
        g->flop_per_s_defined = true;
        if (!a->peak_missing && a->peak_work > 0) {
            g->peak_flop_per_s = a->peak_work / a->flops_time;
            g->compute_fraction = g->flops / (a->peak_work * 1e-9);
            g->compute_fraction_defined = true;
        }
    }
    if (g->bytes_known && a->bytes_time > 0) {
        g->bytes_per_s = g->bytes / (a->bytes_time * 1e-9);
        g->bytes_per_s_defined = true;
        if (g->bandwidth_bytes_per_s > 0) {
            g->bandwidth_fraction = g->bytes_per_s / g->bandwidth_bytes_per_s;
            g->bandwidth_fraction_defined = true;
        }
    }
    if (a->ai_bytes > 0) {
        g->intensity = a->ai_flops / a->ai_bytes;
        g->intensity_defined = true;
    }
    flag_row(g);
}

/* The groups while they are summed: rows and their sums, found by key through open addressing
 * (a group's index + 1, 0 empty) that grows with them. */
struct groups {
    struct kp_roofline *r;
    struct acc *acc;
    size_t cap;
    size_t *slots, mask;
};

/* Room for one more group (the table at most half full). 0 or -ENOMEM. */
static int groups_grow(struct groups *gs)
{
    struct kp_roofline *r = gs->r;

    if (r->n_rows == gs->cap) {
        size_t nc = gs->cap ? 2 * gs->cap : 256;
        struct kp_roofline_row *rows = realloc(r->rows, nc * sizeof(*rows));
        struct acc *acc = rows ? realloc(gs->acc, nc * sizeof(*acc)) : NULL;

        if (rows) {
            r->rows = rows;
        }
        if (!acc) {
            return -ENOMEM;
        }
        gs->acc = acc;
        gs->cap = nc;
    }
    if (2 * (r->n_rows + 1) > gs->mask + 1 || gs->slots == NULL) {
        size_t m = gs->slots ? 2 * (gs->mask + 1) : 512;
        size_t *slots = calloc(m, sizeof(*slots));

        if (!slots) {
            return -ENOMEM;
        }
        for (size_t j = 0; j < r->n_rows; j++) {
            size_t h = key_hash(r->rows[j].name, r->rows[j].dir) & (m - 1);

            while (slots[h] != 0) {
                h = (h + 1) & (m - 1);
            }
            slots[h] = j + 1;
        }
        free(gs->slots);
        gs->slots = slots;
        gs->mask = m - 1;
    }
    return 0;
}

/* Adds PyProf's row k to its group. 0 or -ENOMEM. */
static int groups_add(struct groups *gs, const struct kp_pyprof_row *k)
{
    struct kp_roofline *r = gs->r;
    const char *name = r->by == KP_ROOFLINE_BY_OP ? k->op
                       : k->kernel_full           ? k->kernel_full
                                                  : k->kernel;
    const char *dir = r->by == KP_ROOFLINE_BY_OP ? (k->bwd ? "bprop" : "fprop") : "";
    const struct kp_roofline_device *d = find_dev(r, k->device);
    enum kp_roofline_peak pk = kernel_peak(k);
    double t = (double) (k->sil_ns > 0 ? k->sil_ns : 0), peak = device_peak(d, pk);
    struct kp_roofline_row *g;
    struct acc *a;
    size_t j, h;

    if (groups_grow(gs) < 0) {
        return -ENOMEM;
    }
    for (j = r->n_rows, h = key_hash(name, dir) & gs->mask; gs->slots[h] != 0;
         h = (h + 1) & gs->mask) {
        const struct kp_roofline_row *x = &r->rows[gs->slots[h] - 1];

        if (strcmp(x->name, name) == 0 && strcmp(x->dir, dir) == 0) {
            j = gs->slots[h] - 1;
            break;
        }
    }
    g = &r->rows[j];
    a = &gs->acc[j];
    if (j == r->n_rows) {
        memset(g, 0, sizeof(*g));
        memset(a, 0, sizeof(*a));
        if (!(g->name = kp_an_pool_intern(&r->names, name))) {
            return -ENOMEM;
        }
        gs->slots[h] = j + 1;
        r->n_rows++;
        snprintf(g->dir, sizeof(g->dir), "%s", dir);
        g->device = k->device;
        g->bandwidth_bytes_per_s = d != NULL ? d->bandwidth_bytes_per_s : 0;
        a->peak = -1;
    }
    g->kernels++;
    g->time_ns += (int64_t) t;
    if (k->flops_known) {
        g->flops_known = true;
        g->flops += k->flops;
        a->flops_time += t;
        a->peak_work += peak * t;
        a->peak_missing = a->peak_missing || peak <= 0;
        if (a->peak < 0) {
            a->peak = (int) pk;
        }
        else if (a->peak != (int) pk) {
            a->peak = KP_ROOFLINE_PEAK_COUNT + 1;
        }
    }
    if (k->bytes_known) {
        g->bytes_known = true;
        g->bytes += k->bytes;
        a->bytes_time += t;
        if (d == NULL || d->bandwidth_bytes_per_s != g->bandwidth_bytes_per_s) {
            g->bandwidth_bytes_per_s = 0; /* kernels on devices with other bandwidths */
        }
    }
    if (k->flops_known && k->bytes_known) {
        a->ai_flops += k->flops;
        a->ai_bytes += k->bytes;
    }
    return 0;
}

/* kp_pyprof_each's callback: every row of PyProf's table p (a window's, or the rank's) to the
 * groups ud. 0 or -ENOMEM. */
static int groups_add_table(void *ud, const struct kp_pyprof *p)
{
    struct groups *gs = ud;
    size_t n;
    const struct kp_pyprof_row *pr = kp_pyprof_rows(p, &n);

    for (size_t i = 0; i < n; i++) {
        if (groups_add(gs, &pr[i]) < 0) {
            return -ENOMEM;
        }
    }
    return 0;
}

int kp_roofline_create(PGconn *c, int64_t run, int rank, size_t max_rows, size_t window_events,
                       enum kp_roofline_by by, struct kp_roofline **out, char *errbuf,
                       size_t errlen)
{
    struct kp_roofline *r = calloc(1, sizeof(*r));
    struct groups gs = { .r = r };
    int rc;

    *out = NULL;
    if (r == NULL) {
        return -ENOMEM;
    }
    r->by = by;
    if ((rc = load_devices(c, r, run, rank, errbuf, errlen)) < 0 ||
        (rc = kp_pyprof_each(c, run, rank, max_rows, window_events, groups_add_table, &gs,
                             &r->windows, errbuf, errlen)) < 0) {
        if (rc == -ENOMEM) {
            kp_errbuf_set(errbuf, errlen, "out of memory building the roofline");
        }
        goto fail;
    }
    for (size_t j = 0; j < r->n_rows; j++) {
        finish_row(&r->rows[j], &gs.acc[j]);
    }
    if (r->n_rows > 0) {
        qsort(r->rows, r->n_rows, sizeof(*r->rows), cmp_rows);
    }
    *out = r;
    r = NULL;
fail:
    free(gs.slots);
    free(gs.acc);
    kp_roofline_destroy(r);
    return rc;
}

size_t kp_roofline_windows(const struct kp_roofline *r)
{
    return r->windows;
}

void kp_roofline_destroy(struct kp_roofline *r)
{
    if (r == NULL) {
        return;
    }
    free(r->rows);
    kp_an_pool_fini(&r->names);
    free(r);
}

const struct kp_roofline_row *kp_roofline_rows(const struct kp_roofline *r, size_t *n)
{
    *n = r->n_rows;
    return r->rows;
}

enum kp_roofline_by kp_roofline_group_by(const struct kp_roofline *r)
{
    return r->by;
}

const struct kp_roofline_device *kp_roofline_devices(const struct kp_roofline *r, size_t *n)
{
    *n = r->n_devs;
    return r->devs;
}

void kp_roofline_write(FILE *f, const struct kp_roofline *r, int64_t run, int rank,
                       enum kp_roofline_format fmt, size_t top)
{
    kp_roofline_write_parts(f, r->by, r->devs, r->n_devs, r->rows, r->n_rows, run, rank, fmt, top);
}
