/*
 * kprofctl roofline --run R [--rank N] [--by kernel|op] [--top N] [--csv|--json]: achieved
 * FLOP/s and bytes/s of one rank's kernels, per kernel or per op, against the device's peaks
 * (analyzer/roofline.h), from kprof-analyzer's Analyzer.Roofline, longest total time first.
 *
 * Output: exactly what `kprof-analyze roofline` prints for the same run, rank and flags
 * (tests/it/test_analyzer_roofline.py checks it): text starts with a line per device naming
 * the peaks used and why (the built-in table entry its name matched, or its properties).
 *
 * Exit status: 0 shown, 2 bad usage, 3 unknown run or rank, 5 kprof-analyzer (or its
 * PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "roofline"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_config.h"
#include "kp_err.h"
#include "kprof.pb-c.h"
#include "kprofctl.h"
#include "roofline.h"
#include "rpcverb.h"
#include "table.h"

struct roofline_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    int by;
    long long top;
};

static const char *const bys[] = { "kernel", "op", NULL };

#define OFF(f) offsetof(struct roofline_config, f)
static const struct kp_config_def roofline_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
    { "by", KP_CONFIG_ENUM, "kernel", 0, 0, OFF(by),
      "kernel: one row per kernel name; op: one row per op and direction (fprop, bprop)", bys,
      false },
    { "top", KP_CONFIG_INT, "0", 0, INT32_MAX, OFF(top), "only the first N rows (0: all)", NULL,
      false },
};
#undef OFF

/* The CSV columns (fixed: -c does not apply). */
static const struct kp_table_col roofline_cols[] = {
    { "name", KP_TABLE_TEXT },
};

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src != NULL ? src : "");
}

static void device_from(struct kp_roofline_device *d, const Kprof__V1__RooflineDevice *o)
{
    d->id = o->id;
    copy_str(d->name, sizeof(d->name), o->name);
    copy_str(d->entry, sizeof(d->entry), o->entry);
    copy_str(d->source, sizeof(d->source), o->source);
    d->peak_flop_per_s[KP_ROOFLINE_FP32] = o->peak_fp32_flop_per_s;
    d->peak_flop_per_s[KP_ROOFLINE_TF32_TC] = o->peak_tf32_flop_per_s;
    d->peak_flop_per_s[KP_ROOFLINE_FP16_TC] = o->peak_fp16_flop_per_s;
    d->peak_flop_per_s[KP_ROOFLINE_FP8_TC] = o->peak_fp8_flop_per_s;
    d->bandwidth_bytes_per_s = o->bandwidth_bytes_per_s;
}

static void row_from(struct kp_roofline_row *r, const Kprof__V1__RooflineRow *o)
{
    r->name = o->name != NULL ? o->name : "";
    copy_str(r->dir, sizeof(r->dir), o->dir);
    r->device = o->device;
    copy_str(r->peak, sizeof(r->peak), o->peak);
    r->kernels = o->kernels;
    r->time_ns = o->time_ns;
    r->flops = o->flops;
    r->flops_known = o->flops_known;
    r->bytes = o->bytes;
    r->bytes_known = o->bytes_known;
    r->flop_per_s = o->flop_per_s;
    r->flop_per_s_defined = o->flop_per_s_defined;
    r->bytes_per_s = o->bytes_per_s;
    r->bytes_per_s_defined = o->bytes_per_s_defined;
    r->intensity = o->intensity;
    r->intensity_defined = o->intensity_defined;
    r->peak_flop_per_s = o->peak_flop_per_s;
    r->compute_fraction = o->compute_fraction;
    r->compute_fraction_defined = o->compute_fraction_defined;
    r->bandwidth_bytes_per_s = o->bandwidth_bytes_per_s;
    r->bandwidth_fraction = o->bandwidth_fraction;
    r->bandwidth_fraction_defined = o->bandwidth_fraction_defined;
    copy_str(r->above_peak, sizeof(r->above_peak), o->above_peak);
}

static int roofline_check(struct kp_rpcverb *v)
{
    if (v->common->columns != NULL && v->common->columns[0] != '\0') {
        return kp_rpcverb_usage_error(v, "-c does not apply: roofline prints fixed columns");
    }
    return KP_RPCVERB_RUN;
}

static int roofline_request(struct kp_rpcverb *v, ProtobufCMessage *msg)
{
    const struct roofline_config *cfg = v->cfg;

    ((Kprof__V1__RooflineRequest *) msg)->group_by =
        cfg->by == 1 ? KPROF__V1__ROOFLINE_GROUP_BY__ROOFLINE_GROUP_BY_OP
                     : KPROF__V1__ROOFLINE_GROUP_BY__ROOFLINE_GROUP_BY_KERNEL;
    return 0;
}

/* The reply's devices and rows through roofline.c's writer. */
static int roofline_print(struct kp_rpcverb *v, const struct kp_table *t,
                          const ProtobufCMessage *msg)
{
    const struct roofline_config *cfg = v->cfg;
    const Kprof__V1__RooflineResponse *resp = (const Kprof__V1__RooflineResponse *) msg;
    size_t nd =
        resp->n_devices < KP_ROOFLINE_MAX_DEVICES ? resp->n_devices : KP_ROOFLINE_MAX_DEVICES;
    struct kp_roofline_device *devs = calloc(nd ? nd : 1, sizeof(*devs));
    struct kp_roofline_row *rows = calloc(resp->n_rows ? resp->n_rows : 1, sizeof(*rows));
    int rc = KPROFCTL_EXIT_FAILED;

    (void) t;
    if (devs == NULL || rows == NULL) {
        kp_rpcverb_error(v, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nd; i++) {
        device_from(&devs[i], resp->devices[i]);
    }
    for (size_t i = 0; i < resp->n_rows; i++) {
        row_from(&rows[i], resp->rows[i]);
    }
    kp_roofline_write_parts_width(stdout, cfg->by == 1 ? KP_ROOFLINE_BY_OP : KP_ROOFLINE_BY_KERNEL,
                                  devs, nd, rows, resp->n_rows, cfg->common.run, resp->rank,
                                  v->format == KP_TABLE_FORMAT_JSON  ? KP_ROOFLINE_JSON
                                  : v->format == KP_TABLE_FORMAT_CSV ? KP_ROOFLINE_CSV
                                                                     : KP_ROOFLINE_TEXT,
                                  (size_t) cfg->top, (int) cfg->common.width);
    rc = fflush(stdout) == 0 && !ferror(stdout) ? KPROFCTL_EXIT_OK : KPROFCTL_EXIT_FAILED;
out:
    free(devs);
    free(rows);
    return rc;
}

static const struct kp_rpcverb_spec roofline_spec = {
    .name = "roofline",
    .synopsis =
        "kprofctl roofline --run R [--rank N] [--by kernel|op] [--top N] [-w WIDTH] [--csv|--json]\n"
        "  Achieved FLOP/s and bytes/s per kernel or op of one rank (Analyzer.Roofline),\n"
        "  arithmetic intensity and the fraction of the device's peak compute (for each\n"
        "  kernel's dtype and Tensor Core use) and memory bandwidth. Peaks come from the\n"
        "  device's properties, else a built-in table of datasheet figures matched by the\n"
        "  device's name; the output says which. The same output as kprof-analyze roofline.\n",
    .exit_ok = "shown",
    .json_help = "print {\"run\", \"rank\", \"by\", \"devices\": [...], \"rows\": [...]}",
    .defs = roofline_defs,
    .n_defs = sizeof(roofline_defs) / sizeof(roofline_defs[0]),
    .cols = roofline_cols,
    .n_cols = sizeof(roofline_cols) / sizeof(roofline_cols[0]),
    .columns_help = "-c: does not apply: roofline prints fixed columns (exits 2)",
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Roofline",
    .req_desc = &kprof__v1__roofline_request__descriptor,
    .resp_desc = &kprof__v1__roofline_response__descriptor,
    .check = roofline_check,
    .request = roofline_request,
    .print = roofline_print,
};

int kprofctl_roofline(int argc, char **argv)
{
    struct roofline_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&roofline_spec, &cfg, argc, argv);
}
