/* The TensorBoard plugin's recommendations (spec tbplugin-views.md §11); see an_recommend.h. */
#include "an_recommend.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_json.h"
#include "kp_pg.h"

#define URL_DATALOADER \
    "https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading"
#define URL_DDP      "https://pytorch.org/docs/stable/notes/cuda.html#cuda-nn-ddp-instead"
#define URL_COMPRESS "https://pytorch.org/docs/stable/ddp_comm_hooks.html"
#define URL_GRAD_ACC \
    "https://towardsdatascience.com/what-is-gradient-accumulation-in-deep-learning-ec034122cfa"
#define URL_LAMB       "https://nvidia.github.io/apex/optimizers.html#apex.optimizers.FusedLAMB"
#define URL_AMP        "https://pytorch.org/docs/stable/amp.html"
#define URL_CHECKPOINT "https://pytorch.org/docs/stable/checkpoint.html"

#define MAX_DEVICES 64

/* The figures of one breakdown that the rules read. */
struct fig {
    double dataloader_ns, communication_ns, total_ns; /* step averages */
};

/* A deviceProperties entry, in id order (the plugin indexes its list by position). */
struct dev {
    int id;
    bool has_cc, has_mem;
    int cc_major, cc_minor;
    int64_t mem_bytes;
};

/* A device's peak Total Allocated among its memory events, in order of first appearance. */
struct peak {
    int type, id; /* c10::DeviceType (0 CPU, 1 CUDA) and device id (-1: none) */
    int64_t bytes;
};

struct facts {
    struct fig compat, own;
    size_t n_gpus;
    int gpu_ids[KP_AN_MAX_GPUS];
    double gpu_util[KP_AN_MAX_GPUS];
    bool window; /* the steps window is longer than 0 (utilization is defined) */
    bool comm_nccl, use_dp, use_ddp;
    bool tc_used_known; /* kernels ran: the kernel view's Tensor Core share is defined */
    double tc_used_ratio, tc_eligible_ratio;
    size_t n_devs, n_peaks;
    struct dev devs[MAX_DEVICES];
    struct peak peaks[2 * MAX_DEVICES + 2];
};

/* A link: "<a href=…>title</a>" (html) or "title (url)". */
static const char *link(char *buf, size_t len, bool html, const char *title, const char *url)
{
    if (html) {
        snprintf(buf, len, "<a href=\"%s\" target=\"_blank\">%s</a>", url, title);
    }
    else {
        snprintf(buf, len, "%s (%s)", title, url);
    }
    return buf;
}

/* Appends a formatted text to list html (or text). Returns 0 or -ENOMEM. */
static int add(struct kp_an_recs *r, bool html, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int add(struct kp_an_recs *r, bool html, const char *fmt, ...)
{
    size_t *n = html ? &r->n_html : &r->n_text;
    char **list = html ? r->html : r->text;
    va_list ap;
    int len;
    char *s;

    if (*n >= KP_AN_RECS_MAX) {
        return 0;
    }
    va_start(ap, fmt);
    len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len < 0 || !(s = malloc((size_t) len + 1))) {
        return -ENOMEM;
    }
    va_start(ap, fmt);
    vsnprintf(s, (size_t) len + 1, fmt, ap);
    va_end(ap);
    list[(*n)++] = s;
    return 0;
}

/* Python's float("M.m") >= 3.5, as the plugin tests the compute capability ("3.10" is 3.1). */
static bool cc_at_least_35_plugin(int major, int minor)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%d.%d", major, minor);
    return strtod(buf, NULL) >= 3.5;
}

/* The low-utilization GPU list: the plugin's ("0, 1and 2", "have" unless the string is one
 * character long) or kprof's ("0, 1 and 2", "has" for one GPU). */
static void gpu_list(char *buf, size_t len, const int *ids, size_t n, bool plugin, const char **has)
{
    size_t off = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < n && off < len; i++) {
        const char *sep = i == 0 ? "" : i + 1 < n ? ", " : plugin ? "and " : " and ";

        off += (size_t) snprintf(buf + off, len - off, "%s%d", sep, ids[i]);
    }
    *has = (plugin ? strlen(buf) == 1 : n == 1) ? "has" : "have";
}

static int load_facts(struct kp_an *a, PGconn *c, int64_t run, int rank, struct facts *f,
                      char *errbuf, size_t errlen)
{
    const struct kp_an_breakdown *b;
    const struct kp_an_table *kt;
    const struct kp_an_kernel_row *kr;
    struct kp_an_tc tc;
    char runs[24], ranks[16];
    const char *params[2] = { runs, ranks };
    size_t budget = 0;
    PGresult *r = NULL;
    double tc_ns = 0, all_ns = 0;
    int rc;

    /* the plugin's figure, then kprof's own (left in the handle) */
    if ((rc = kp_an_breakdown(a, true, &b)) < 0) {
        return rc;
    }
    f->compat = (struct fig){ b->avg_ns[KP_AN_DATALOADER], b->avg_ns[KP_AN_COMMUNICATION],
                              b->avg_total_ns };
    if ((rc = kp_an_breakdown(a, false, &b)) < 0) {
        return rc;
    }
    f->own = (struct fig){ b->avg_ns[KP_AN_DATALOADER], b->avg_ns[KP_AN_COMMUNICATION],
                           b->avg_total_ns };
    f->n_gpus = b->n_gpus;
    memcpy(f->gpu_ids, b->gpu_ids, sizeof(f->gpu_ids));
    memcpy(f->gpu_util, b->gpu_utilization, sizeof(f->gpu_util));
    f->window = b->n_steps > 0 && b->steps[b->n_steps - 1].end_ns > b->steps[0].start_ns;
    f->comm_nccl = b->comm_nccl;
    f->use_dp = b->use_dp;
    f->use_ddp = b->use_ddp;

    /* the kernel view's Tensor Core share (undefined without kernel time) */
    if ((rc = kp_an_kernels(a, false, &kt)) < 0) {
        return rc;
    }
    kr = kt->rows;
    for (size_t i = 0; i < kt->n; i++) {
        all_ns += (double) kr[i].total_ns;
        if (kr[i].tc_used) {
            tc_ns += (double) kr[i].total_ns;
        }
    }
    f->tc_used_known = all_ns > 0;
    f->tc_used_ratio = all_ns > 0 ? tc_ns / all_ns : 0.0;
    if ((rc = kp_an_tensor_cores(a, &tc)) < 0) {
        return rc;
    }
    f->tc_eligible_ratio = tc.eligible_ops_kernel_ratio;

    snprintf(runs, sizeof(runs), "%" PRId64, run);
    snprintf(ranks, sizeof(ranks), "%d", rank);
    rc = kp_an_query(c, 2,
                     "SELECT id, cc_major, cc_minor, global_memory_bytes FROM devices "
                     "WHERE run_id = $1 AND rank = $2 ORDER BY id",
                     params, &budget, 0, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    for (int i = 0; i < PQntuples(r) && f->n_devs < MAX_DEVICES; i++) {
        struct dev *d = &f->devs[f->n_devs++];

        d->id = (int) kp_pg_i64(r, i, 0, 0);
        d->has_cc = !PQgetisnull(r, i, 1) && !PQgetisnull(r, i, 2);
        d->cc_major = (int) kp_pg_i64(r, i, 1, 0);
        d->cc_minor = (int) kp_pg_i64(r, i, 2, 0);
        d->has_mem = !PQgetisnull(r, i, 3);
        d->mem_bytes = kp_pg_i64(r, i, 3, 0);
    }
    PQclear(r);
    /* the memory curve's records (spec §10: CPU and CUDA, with an address and totals) */
    rc = kp_an_query(c, 2,
                     "SELECT device_type, coalesce(device, -1), max(total_allocated) "
                     "FROM memory_events WHERE run_id = $1 AND rank = $2 "
                     "AND device_type IN (0, 1) AND addr IS NOT NULL "
                     "AND total_allocated IS NOT NULL "
                     "GROUP BY 1, 2 ORDER BY min(start_ns), 1, 2",
                     params, &budget, 0, &r, errbuf, errlen);
    if (rc < 0) {
        return rc;
    }
    for (int i = 0; i < PQntuples(r) && f->n_peaks < sizeof(f->peaks) / sizeof(f->peaks[0]); i++) {
        struct peak *p = &f->peaks[f->n_peaks++];

        p->type = (int) kp_pg_i64(r, i, 0, 0);
        p->id = (int) kp_pg_i64(r, i, 1, -1);
        p->bytes = kp_pg_i64(r, i, 2, 0);
    }
    PQclear(r);
    return 0;
}

/* The rules for one list: the plugin's (html) or kprof's own. */
static int rules(const struct facts *f, bool html, struct kp_an_recs *out)
{
    const struct fig *g = html ? &f->compat : &f->own;
    char l1[256], l2[256], l3[256], ids[KP_AN_MAX_GPUS * 8];
    int low[KP_AN_MAX_GPUS];
    size_t n_low = 0;
    int rc = 0;

    /* 1. DataLoader */
    if (g->total_ns > 0 && g->dataloader_ns / g->total_ns > 0.05) {
        rc |= add(
            out, html,
            "This run has high time cost on input data loading. %.1f%% of the step time is "
            "in DataLoader. You could try to set num_workers on DataLoader's construction "
            "and %s.",
            100.0 * (g->dataloader_ns / g->total_ns),
            link(l1, sizeof(l1), html, "enable multi-processes on data loading", URL_DATALOADER));
    }
    /* 2. DataParallel (the plugin counts the devices of kernels, memcpys and memsets; kprof
     * those of kernels) */
    if (f->use_dp && f->n_gpus > 1) {
        rc |= add(out, html, "It is recommended to %s to do multi-GPU training.",
                  link(l1, sizeof(l1), html, "use DistributedDataParallel instead of DataParallel",
                       URL_DDP));
    }
    /* 3. NCCL backend */
    if (f->use_ddp && !f->comm_nccl) {
        for (size_t i = 0; i < f->n_devs; i++) {
            const struct dev *d = &f->devs[i];

            if (d->has_cc && (html ? cc_at_least_35_plugin(d->cc_major, d->cc_minor)
                                   : d->cc_major > 3 || (d->cc_major == 3 && d->cc_minor >= 5))) {
                rc |= add(out, html,
                          "Nccl backend is currently the fastest and highly recommended backend "
                          "when using DDP for training.");
                break;
            }
        }
    }
    /* 4. Communication. Peer bug: its compression URL is a 1-tuple, so the plugin's href is
     * the tuple's repr; kprof links the page itself. */
    if (g->total_ns > 0 && g->communication_ns / g->total_ns > 0.1) {
        rc |= add(out, html,
                  "This run has high time cost on communication. %.1f%% of the step time is in "
                  "communication. You could try %s or %s or increase the batch size. Note: "
                  "Gradient accumulation will increase global effective batch size, which may "
                  "hurt model convergence and accuracy. For such case, you may want to evaluate "
                  "%s.",
                  100.0 * (g->communication_ns / g->total_ns),
                  link(l1, sizeof(l1), html, "Gradient Compression",
                       html ? "('" URL_COMPRESS "',)" : URL_COMPRESS),
                  link(l2, sizeof(l2), html, "Gradient Accumulation", URL_GRAD_ACC),
                  link(l3, sizeof(l3), html, "LAMB optimizer", URL_LAMB));
    }
    /* 5. Low GPU utilization (ids ascending). Peer quirks in gpu_list. */
    for (size_t i = 0; i < f->n_gpus && (html || f->window); i++) {
        if (f->gpu_util[i] < 0.5) {
            low[n_low++] = f->gpu_ids[i];
        }
    }
    if (n_low > 0) {
        const char *has;

        gpu_list(ids, sizeof(ids), low, n_low, html, &has);
        rc |= add(out, html,
                  "GPU %s %s low utilization. You could try to increase batch size to improve. "
                  "Note: Increasing batch size may affect the speed and stability of model "
                  "convergence.",
                  ids, has);
    }
    /* 6. AMP: the first device listed, compute capability >= 7 */
    if (f->n_devs > 0 && f->devs[0].has_cc && f->devs[0].cc_major >= 7 && f->tc_used_known &&
        f->tc_used_ratio == 0.0 && f->tc_eligible_ratio > 0.0) {
        rc |= add(out, html,
                  "Kernels with %.0f%% time are launched by Tensor Cores eligible operators. You "
                  "could enable %s to speedup by using FP16.",
                  f->tc_eligible_ratio * 100.0,
                  link(l1, sizeof(l1), html, "Automatic Mixed Precision", URL_AMP));
    }
    /* 7. Memory limit: the first device over 90%. Peer bug: the plugin meant to skip the CPU
     * but tests the device *type* against -1, so the CPU (id -1) is measured against the last
     * listed GPU (Python's list[-1]); kprof only measures GPUs, each against its own. */
    for (size_t i = 0; i < f->n_peaks && f->n_devs > 0; i++) {
        const struct peak *p = &f->peaks[i];
        const struct dev *d = NULL;
        double pct, gb;

        if (html) {
            long idx = p->id < 0 ? (long) f->n_devs + p->id : p->id;

            if (idx >= 0 && idx < (long) f->n_devs) {
                d = &f->devs[idx];
            }
        }
        else if (p->type == 1) {
            for (size_t k = 0; k < f->n_devs; k++) {
                if (f->devs[k].id == p->id) {
                    d = &f->devs[k];
                }
            }
        }
        if (!d || !d->has_mem || !((double) p->bytes > (double) d->mem_bytes * 0.9)) {
            continue;
        }
        pct = (double) p->bytes / (double) d->mem_bytes * 100.0;
        gb = (double) d->mem_bytes / 1024.0 / 1024.0 / 1024.0;
        rc |= add(out, html,
                  "Device memory usage is at the limit of device memory capacity (%.1f%% of "
                  "%.1fGB on GPU%d). To get better value of your GPU or to use larger batch size "
                  "for training, please refer to %s or %s.",
                  pct, gb, p->id, link(l1, sizeof(l1), html, "Gradient Checkpoint", URL_CHECKPOINT),
                  link(l2, sizeof(l2), html, "Automatic Mixed Precision", URL_AMP));
        break;
    }
    return rc ? -ENOMEM : 0;
}

int kp_an_recommend(struct kp_an *a, PGconn *c, int64_t run, int rank, struct kp_an_recs *out,
                    char *errbuf, size_t errlen)
{
    struct facts *f = calloc(1, sizeof(*f));
    int rc;

    memset(out, 0, sizeof(*out));
    if (!f) {
        return -ENOMEM;
    }
    rc = load_facts(a, c, run, rank, f, errbuf, errlen);
    if (rc == 0) {
        rc = rules(f, true, out);
    }
    if (rc == 0) {
        rc = rules(f, false, out);
    }
    if (rc == -ENOMEM) {
        kp_errbuf_set(errbuf, errlen, "out of memory computing the recommendations");
    }
    if (rc < 0) {
        kp_an_recs_fini(out);
    }
    free(f);
    return rc;
}

char *kp_an_recs_overview_html(const struct kp_an_recs *r)
{
    size_t len = sizeof("<ul><li>N/A</li></ul>");
    char *s, *p;

    for (size_t i = 0; i < r->n_html; i++) {
        len += strlen(r->html[i]) + 9;
    }
    if (!(s = malloc(len))) {
        return NULL;
    }
    p = s + sprintf(s, "<ul>");
    if (r->n_html == 0) {
        p += sprintf(p, "<li>N/A</li>");
    }
    for (size_t i = 0; i < r->n_html; i++) {
        p += sprintf(p, "<li>%s</li>", r->html[i]);
    }
    sprintf(p, "</ul>");
    return s;
}

void kp_an_recs_json(FILE *f, const struct kp_an_recs *r, bool html)
{
    size_t n = html ? r->n_html : r->n_text;

    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i) {
            fputs(", ", f);
        }
        kp_json_fputs(f, html ? r->html[i] : r->text[i]);
    }
    fputc(']', f);
}

void kp_an_recs_fini(struct kp_an_recs *r)
{
    if (!r) {
        return;
    }
    for (size_t i = 0; i < r->n_html; i++) {
        free(r->html[i]);
    }
    for (size_t i = 0; i < r->n_text; i++) {
        free(r->text[i]);
    }
    memset(r, 0, sizeof(*r));
}
