/*
 * kprofctl memory --run R [--rank N] [--device D] [--json|--csv] [-c COLS] [-w WIDTH]: the
 * memory view's per-operator allocation statistics of one rank (the TensorBoard plugin's
 * memory view, docs/specs/tbplugin-views.md §10), from kprof-analyzer's Analyzer.Memory.
 *
 * Output: one row per device and operator name with any allocation, by device (CPU, then
 * GPU0, GPU1, ...), with the columns device, name, calls, self_increase_bytes,
 * self_alloc_bytes, self_alloc_count (in the op itself), increase_bytes, alloc_bytes,
 * alloc_count (with its children). --device keeps one device's rows.
 *
 * Exit status: 0 shown (also an empty table: the rank has no memory events), 2 bad usage,
 * 3 unknown run or rank, 5 kprof-analyzer (or its PostgreSQL) unreachable, 1 anything else.
 */
#define KP_LOG_MODULE "memory"
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

struct memory_config {
    struct kp_rpcverb_common common; /* first: the common rows' offsets */
    char *device;
};

#define OFF(f) offsetof(struct memory_config, f)
static const struct kp_config_def memory_defs[] = {
    KP_RPCVERB_RUN_DEF,
    KP_RPCVERB_RANK_DEF,
    { "device", KP_CONFIG_STRING, "", 0, 0, OFF(device),
      "only this device's rows (CPU, GPU0, ...); empty: every device", NULL, false },
};
#undef OFF

enum memory_col {
    COL_DEVICE,
    COL_NAME,
    COL_CALLS,
    COL_SELF_INCREASE,
    COL_SELF_ALLOC,
    COL_SELF_COUNT,
    COL_INCREASE,
    COL_ALLOC,
    COL_COUNT,
    N_COLS,
};

static const struct kp_table_col memory_cols[N_COLS] = {
    [COL_DEVICE] = { "device", KP_TABLE_TEXT },
    [COL_NAME] = { "name", KP_TABLE_TEXT },
    [COL_CALLS] = { "calls", KP_TABLE_NUMERIC },
    [COL_SELF_INCREASE] = { "self_increase_bytes", KP_TABLE_NUMERIC },
    [COL_SELF_ALLOC] = { "self_alloc_bytes", KP_TABLE_NUMERIC },
    [COL_SELF_COUNT] = { "self_alloc_count", KP_TABLE_NUMERIC },
    [COL_INCREASE] = { "increase_bytes", KP_TABLE_NUMERIC },
    [COL_ALLOC] = { "alloc_bytes", KP_TABLE_NUMERIC },
    [COL_COUNT] = { "alloc_count", KP_TABLE_NUMERIC },
};

static int add_row(struct kp_table *t, const Kprof__V1__MemoryOpRow *r)
{
    int rc = kp_table_add_row(t);

    rc = rc != 0 ? rc : kp_table_set_str(t, COL_DEVICE, r->device);
    rc = rc != 0 ? rc : kp_table_set_str(t, COL_NAME, r->name);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_CALLS, r->calls);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_SELF_INCREASE, r->self_increase_bytes);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_SELF_ALLOC, r->self_alloc_bytes);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_SELF_COUNT, r->self_alloc_count);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_INCREASE, r->increase_bytes);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_ALLOC, r->alloc_bytes);
    rc = rc != 0 ? rc : kp_table_set_i64(t, COL_COUNT, r->alloc_count);
    return rc;
}

/* Checks --device against the rank's devices, then adds the rows (of --device only). */
static int memory_rows(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *msg)
{
    const struct memory_config *cfg = v->cfg;
    const Kprof__V1__MemoryResponse *resp = (const Kprof__V1__MemoryResponse *) msg;
    bool all = cfg->device == NULL || cfg->device[0] == '\0', device_seen = all;
    int r = 0;

    for (size_t i = 0; i < resp->n_devices; i++) {
        device_seen = device_seen || strcmp(resp->devices[i], cfg->device) == 0;
    }
    if (!device_seen) {
        return kp_rpcverb_usage_error(v,
                                      "--device %s: rank %d of run %lld has no memory events "
                                      "on it (it has %zu devices with events)",
                                      cfg->device, resp->rank, cfg->common.run, resp->n_devices);
    }
    for (size_t i = 0; i < resp->n_rows && r == 0; i++) {
        if (all || strcmp(resp->rows[i]->device, cfg->device) == 0) {
            r = add_row(t, resp->rows[i]);
        }
    }
    if (r == 0 && resp->n_devices == 0) {
        kp_rpcverb_error(v,
                         "rank %d of run %lld has no memory events (record with "
                         "profile_memory=True)",
                         resp->rank, cfg->common.run);
    }
    return r;
}

static const struct kp_rpcverb_spec memory_spec = {
    .name = "memory",
    .synopsis =
        "kprofctl memory --run R [--rank N] [--device D] [--json|--csv] [-c COLS] [-w WIDTH]\n"
        "  The memory view of one rank (Analyzer.Memory): per device and operator name, the\n"
        "  bytes and allocations in the op itself (self_*) and with its children.\n",
    .exit_ok = "shown (also an empty table: the rank has no memory events)",
    .defs = memory_defs,
    .n_defs = sizeof(memory_defs) / sizeof(memory_defs[0]),
    .cols = memory_cols,
    .n_cols = N_COLS,
    .analyzer = true,
    .flags = KP_RPCVERB_F_RUN | KP_RPCVERB_F_RANK,
    .method = "Memory",
    .req_desc = &kprof__v1__memory_request__descriptor,
    .resp_desc = &kprof__v1__memory_response__descriptor,
    .rows = memory_rows,
};

int kprofctl_memory(int argc, char **argv)
{
    struct memory_config cfg;

    memset(&cfg, 0, sizeof(cfg));
    return kp_rpcverb_main(&memory_spec, &cfg, argc, argv);
}
