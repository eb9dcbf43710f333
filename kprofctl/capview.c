/*
 * kp_capview: the status table, the capture object, the summary line, rank lists and
 * durations as text, and the end of a wait of kprofctl's capture verbs (capview.h); the wait
 * loop is capwatch.c.
 */
#include "capview.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kp_json.h"
#include "kprofctl.h"

const struct kp_table_col kp_capview_cols[KP_CAPVIEW_N_COLS] = {
    [KP_CAPVIEW_COL_RUN] = { "run", KP_TABLE_NUMERIC },
    [KP_CAPVIEW_COL_JOB] = { "job", KP_TABLE_TEXT },
    [KP_CAPVIEW_COL_RUN_STATE] = { "run_state", KP_TABLE_TEXT },
    [KP_CAPVIEW_COL_RANK] = { "rank", KP_TABLE_NUMERIC },
    [KP_CAPVIEW_COL_HOST] = { "host", KP_TABLE_TEXT },
    [KP_CAPVIEW_COL_PID] = { "pid", KP_TABLE_NUMERIC },
    [KP_CAPVIEW_COL_STATE] = { "state", KP_TABLE_TEXT },
    [KP_CAPVIEW_COL_RECORDS] = { "records", KP_TABLE_NUMERIC },
    [KP_CAPVIEW_COL_DROPPED] = { "dropped", KP_TABLE_NUMERIC },
    [KP_CAPVIEW_COL_STEPS] = { "steps", KP_TABLE_TEXT },
    [KP_CAPVIEW_COL_REASON] = { "reason", KP_TABLE_TEXT },
};

const char *kp_capview_rank_state_name(Kprof__V1__RankState s)
{
    switch (s) {
    case KPROF__V1__RANK_STATE__RANK_STATE_PENDING:
        return "pending";
    case KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING:
        return "capturing";
    case KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING:
        return "flushing";
    case KPROF__V1__RANK_STATE__RANK_STATE_DONE:
        return "done";
    case KPROF__V1__RANK_STATE__RANK_STATE_FAILED:
        return "failed";
    default:
        return "unknown";
    }
}

static Kprof__V1__RunState run_state(const Kprof__V1__Capture *c)
{
    return c->run != NULL ? c->run->state : KPROF__V1__RUN_STATE__RUN_STATE_UNSPECIFIED;
}

enum kp_capview_progress kp_capview_progress(const Kprof__V1__Capture *c)
{
    Kprof__V1__RunState rs = run_state(c);
    bool run_over =
        rs == KPROF__V1__RUN_STATE__RUN_STATE_ENDED || rs == KPROF__V1__RUN_STATE__RUN_STATE_FAILED;
    bool all_over = c->n_ranks > 0, all_done = true;

    for (size_t i = 0; i < c->n_ranks; i++) {
        Kprof__V1__RankState s = c->ranks[i]->state;

        if (s != KPROF__V1__RANK_STATE__RANK_STATE_DONE) {
            all_done = false;
        }
        if (s != KPROF__V1__RANK_STATE__RANK_STATE_DONE &&
            s != KPROF__V1__RANK_STATE__RANK_STATE_FAILED) {
            all_over = false;
        }
    }
    if (!all_over && !run_over) {
        return KP_CAPVIEW_RUNNING;
    }
    /* Over. A rank not DONE when the run has ended never will be. */
    if (!all_done || rs == KPROF__V1__RUN_STATE__RUN_STATE_FAILED) {
        return KP_CAPVIEW_FAILED;
    }
    return KP_CAPVIEW_DONE;
}

static int cmp_rank_ptr(const void *a, const void *b)
{
    const Kprof__V1__CaptureRank *x = *(const Kprof__V1__CaptureRank *const *) a;
    const Kprof__V1__CaptureRank *y = *(const Kprof__V1__CaptureRank *const *) b;

    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* c's ranks by rank number (owned: free), or NULL if out of memory. n_ranks 0 gives a
 * non-NULL empty array. */
static const Kprof__V1__CaptureRank **sorted_ranks(const Kprof__V1__Capture *c)
{
    const Kprof__V1__CaptureRank **v = malloc((c->n_ranks + 1) * sizeof(*v));

    if (v == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < c->n_ranks; i++) {
        v[i] = c->ranks[i];
    }
    qsort(v, c->n_ranks, sizeof(*v), cmp_rank_ptr);
    return v;
}

/* The rank's window as "120-124", or NULL (not known yet). */
static const char *steps_text(const Kprof__V1__CaptureRank *r, char *buf, size_t cap)
{
    if (r->first_step < 0) {
        return NULL;
    }
    if (r->last_step >= r->first_step) {
        snprintf(buf, cap, "%" PRId64 "-%" PRId64, r->first_step, r->last_step);
    }
    else {
        snprintf(buf, cap, "%" PRId64 "-", r->first_step);
    }
    return buf;
}

static const char *nonempty(const char *s)
{
    return s != NULL && s[0] != '\0' ? s : NULL;
}

static int add_rank(struct kp_table *t, const Kprof__V1__Capture *c,
                    const Kprof__V1__CaptureRank *r)
{
    char steps[64];
    int rc = 0;

    rc = rc != 0 ? rc : kp_table_add_row(t);
    rc = rc != 0 ? rc : kp_table_set_u64(t, KP_CAPVIEW_COL_RUN, c->run != NULL ? c->run->id : 0);
    rc =
        rc != 0 ? rc : kp_table_set_str(t, KP_CAPVIEW_COL_JOB, c->run != NULL ? c->run->job : NULL);
    rc = rc != 0 ? rc
                 : kp_table_set_str(t, KP_CAPVIEW_COL_RUN_STATE,
                                    kp_rpcverb_run_state_name(run_state(c)));
    rc = rc != 0 ? rc : kp_table_set_i64(t, KP_CAPVIEW_COL_RANK, r->rank);
    rc = rc != 0 ? rc : kp_table_set_str(t, KP_CAPVIEW_COL_HOST, nonempty(r->host));
    rc = rc != 0       ? rc
         : r->pid != 0 ? kp_table_set_u64(t, KP_CAPVIEW_COL_PID, r->pid)
                       : kp_table_set_null(t, KP_CAPVIEW_COL_PID);
    rc = rc != 0 ? rc
                 : kp_table_set_str(t, KP_CAPVIEW_COL_STATE, kp_capview_rank_state_name(r->state));
    rc = rc != 0 ? rc : kp_table_set_u64(t, KP_CAPVIEW_COL_RECORDS, r->records);
    rc = rc != 0 ? rc : kp_table_set_u64(t, KP_CAPVIEW_COL_DROPPED, r->dropped);
    rc = rc != 0 ? rc
                 : kp_table_set_str(t, KP_CAPVIEW_COL_STEPS, steps_text(r, steps, sizeof(steps)));
    rc = rc != 0 ? rc : kp_table_set_str(t, KP_CAPVIEW_COL_REASON, nonempty(r->reason));
    return rc;
}

int kp_capview_add_rows(struct kp_table *t, const Kprof__V1__Capture *c)
{
    const Kprof__V1__CaptureRank **ranks;
    int rc = 0;

    if (t == NULL || c == NULL) {
        return -EINVAL;
    }
    if ((ranks = sorted_ranks(c)) == NULL) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < c->n_ranks && rc == 0; i++) {
        rc = add_rank(t, c, ranks[i]);
    }
    free(ranks);
    return rc;
}

int kp_capview_add_response(struct kp_table *t, const Kprof__V1__CaptureStatusResponse *r)
{
    int rc = 0;

    for (size_t i = 0; i < r->n_captures && rc == 0; i++) {
        rc = kp_capview_add_rows(t, r->captures[i]);
    }
    return rc;
}

/* "key": "value" or "key": null */
static void json_str_field(FILE *out, const char *key, const char *s)
{
    fprintf(out, "\"%s\": ", key);
    if (s == NULL) {
        fputs("null", out);
    }
    else {
        kp_json_fputs(out, s);
    }
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

/* The number of distinct non-empty hosts among c's ranks; 0 if out of memory. */
static size_t count_hosts(const Kprof__V1__Capture *c)
{
    const char **hosts = malloc((c->n_ranks + 1) * sizeof(*hosts));
    size_t n = 0, distinct = 0;

    if (hosts == NULL) {
        return 0;
    }
    for (size_t i = 0; i < c->n_ranks; i++) {
        if (nonempty(c->ranks[i]->host) != NULL) {
            hosts[n++] = c->ranks[i]->host;
        }
    }
    qsort(hosts, n, sizeof(*hosts), cmp_str_ptr);
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(hosts[i], hosts[i - 1]) != 0) {
            distinct++;
        }
    }
    free(hosts);
    return distinct;
}

int kp_capview_write_json(const Kprof__V1__Capture *c, FILE *out)
{
    const Kprof__V1__CaptureRank **ranks = sorted_ranks(c);
    const Kprof__V1__Run *run = c->run;
    char buf[64];

    if (ranks == NULL) {
        return -ENOMEM;
    }
    fprintf(out, "{\"run\": %" PRIu64 ", ", run != NULL ? run->id : 0);
    json_str_field(out, "job", run != NULL ? run->job : NULL);
    fputs(", ", out);
    json_str_field(out, "name", run != NULL ? nonempty(run->name) : NULL);
    fputs(", ", out);
    json_str_field(out, "run_state", kp_rpcverb_run_state_name(run_state(c)));
    if (c->start_step >= 0) {
        fprintf(out, ", \"start_step\": %" PRId64, c->start_step);
    }
    else {
        fputs(", \"start_step\": null", out);
    }
    fprintf(out, ", \"steps\": %" PRIu32 ", \"duration_ms\": %" PRIu64 ", ", c->steps,
            c->duration_ms);
    json_str_field(out, "activities", c->activities);
    fputs(", ", out);
    json_str_field(out, "created",
                   run != NULL ? kp_rpcverb_format_time(run->created_ns, buf, sizeof(buf)) : NULL);
    fputs(", ", out);
    json_str_field(out, "ended",
                   run != NULL ? kp_rpcverb_format_time(run->ended_ns, buf, sizeof(buf)) : NULL);
    fputs(", ", out);
    json_str_field(out, "deadline", kp_rpcverb_format_time(c->deadline_ns, buf, sizeof(buf)));
    fprintf(out, ", \"stopped\": %s, \"hosts\": %zu, \"ranks\": [", c->stopped ? "true" : "false",
            count_hosts(c));
    for (size_t i = 0; i < c->n_ranks; i++) {
        const Kprof__V1__CaptureRank *r = ranks[i];

        fprintf(out, "%s\n  {\"rank\": %" PRId32 ", ", i > 0 ? "," : "", r->rank);
        json_str_field(out, "host", nonempty(r->host));
        if (r->pid != 0) {
            fprintf(out, ", \"pid\": %" PRIu32 ", ", r->pid);
        }
        else {
            fputs(", \"pid\": null, ", out);
        }
        json_str_field(out, "state", kp_capview_rank_state_name(r->state));
        fprintf(out, ", \"records\": %" PRIu64 ", \"dropped\": %" PRIu64 ", ", r->records,
                r->dropped);
        json_str_field(out, "steps", steps_text(r, buf, sizeof(buf)));
        if (r->first_step >= 0) {
            fprintf(out, ", \"first_step\": %" PRId64, r->first_step);
        }
        else {
            fputs(", \"first_step\": null", out);
        }
        if (r->first_step >= 0 && r->last_step >= 0) {
            fprintf(out, ", \"last_step\": %" PRId64 ", ", r->last_step);
        }
        else {
            fputs(", \"last_step\": null, ", out);
        }
        json_str_field(out, "reason", nonempty(r->reason));
        fputc('}', out);
    }
    fputs(c->n_ranks > 0 ? "\n]}\n" : "]}\n", out);
    free(ranks);
    if (fflush(out) != 0 || ferror(out)) {
        return -EIO;
    }
    return 0;
}

char *kp_capview_duration_format(uint64_t ms, char *buf, size_t cap)
{
    static const struct {
        uint64_t ms;
        const char *unit;
    } units[] = { { 86400000, "d" }, { 3600000, "h" }, { 60000, "m" }, { 1000, "s" }, { 1, "ms" } };
    size_t used = 0;

    if (cap == 0) {
        return buf;
    }
    buf[0] = '\0';
    if (ms == 0) {
        snprintf(buf, cap, "0s");
        return buf;
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]) && used < cap; i++) {
        uint64_t n = ms / units[i].ms;
        int w;

        if (n == 0) {
            continue;
        }
        ms -= n * units[i].ms;
        w = snprintf(buf + used, cap - used, "%" PRIu64 "%s", n, units[i].unit);
        used += w > 0 ? (size_t) w : 0;
    }
    return buf;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;

    return (x > y) - (x < y);
}

char *kp_capview_ranks_format(const int32_t *ranks, size_t n, char *buf, size_t cap)
{
    int32_t *v;
    size_t used = 0, i = 0;

    if (cap == 0) {
        return buf;
    }
    buf[0] = '\0';
    if (n == 0) {
        return buf;
    }
    if ((v = malloc(n * sizeof(*v))) == NULL) {
        snprintf(buf, cap, "...");
        return buf;
    }
    memcpy(v, ranks, n * sizeof(*v));
    qsort(v, n, sizeof(*v), cmp_i32);
    while (i < n) {
        size_t j = i;
        char item[32];
        int w;

        /* Extend the range over repeats and consecutive ranks. */
        while (j + 1 < n && (v[j + 1] == v[j] || (int64_t) v[j + 1] == (int64_t) v[j] + 1)) {
            j++;
        }
        if (v[j] == v[i]) {
            w = snprintf(item, sizeof(item), "%s%" PRId32, used > 0 ? "," : "", v[i]);
        }
        else {
            w = snprintf(item, sizeof(item), "%s%" PRId32 "-%" PRId32, used > 0 ? "," : "", v[i],
                         v[j]);
        }
        /* Keep room for "..." after what fits. */
        if (w < 0 || used + (size_t) w + (j + 1 < n ? 3 : 0) >= cap) {
            if (used + 4 <= cap) {
                memcpy(buf + used, "...", 4);
            }
            break;
        }
        memcpy(buf + used, item, (size_t) w + 1);
        used += (size_t) w;
        i = j + 1;
    }
    free(v);
    return buf;
}

/* Parses a rank at *p (decimal digits). Returns 0 and advances *p, or -EINVAL. */
static int parse_rank(const char **p, long *out)
{
    const char *s = *p;
    long v = 0;

    if (!isdigit((unsigned char) *s)) {
        return -EINVAL;
    }
    while (isdigit((unsigned char) *s)) {
        v = v * 10 + (*s - '0');
        if (v > KP_CAPVIEW_MAX_RANK) {
            return -ERANGE;
        }
        s++;
    }
    *p = s;
    *out = v;
    return 0;
}

int kp_capview_ranks_check(const char *s, char *errbuf, size_t errlen)
{
    const char *p = s, *item;
    long lo, hi;
    int rc;

    if (s == NULL || s[0] == '\0') {
        snprintf(errbuf, errlen, "empty: use \"all\" or a list such as 0,3-5");
        return -EINVAL;
    }
    if (strcmp(s, "all") == 0) {
        return 0;
    }
    for (;;) {
        item = p;
        if ((rc = parse_rank(&p, &lo)) == 0) {
            hi = lo;
            if (*p == '-') {
                p++;
                rc = parse_rank(&p, &hi);
            }
        }
        if (rc == -ERANGE) {
            snprintf(errbuf, errlen, "\"%.*s\": a rank is at most %d", (int) strcspn(item, ","),
                     item, KP_CAPVIEW_MAX_RANK);
            return -EINVAL;
        }
        if (*item == ',' || *item == '\0') {
            snprintf(errbuf, errlen, "an empty entry (use \"all\" or a list such as 0,3-5)");
            return -EINVAL;
        }
        if (rc != 0 || (*p != ',' && *p != '\0')) {
            snprintf(errbuf, errlen,
                     "\"%.*s\" is not a rank or a range (use \"all\" or a list such as 0,3-5)",
                     (int) strcspn(item, ","), item);
            return -EINVAL;
        }
        if (lo > hi) {
            snprintf(errbuf, errlen, "\"%.*s\": a range must go up (e.g. %ld-%ld)",
                     (int) strcspn(item, ","), item, hi, lo);
            return -EINVAL;
        }
        if (*p == '\0') {
            return 0;
        }
        p++; /* ',' */
    }
}

char *kp_capview_summary(const Kprof__V1__Capture *c, char *buf, size_t cap)
{
    char ranks[256], window[128], dur[64];
    int32_t *nums = NULL;
    size_t hosts = count_hosts(c);

    if (c->n_ranks > 0 && (nums = malloc(c->n_ranks * sizeof(*nums))) != NULL) {
        for (size_t i = 0; i < c->n_ranks; i++) {
            nums[i] = c->ranks[i]->rank;
        }
    }
    kp_capview_ranks_format(nums, nums != NULL ? c->n_ranks : 0, ranks, sizeof(ranks));
    free(nums);
    kp_capview_duration_format(c->duration_ms, dur, sizeof(dur));
    if (c->start_step >= 0 && c->steps > 0) {
        snprintf(window, sizeof(window), "steps %" PRId64 "..%" PRId64 "%s%s", c->start_step,
                 c->start_step + (int64_t) c->steps - 1, c->duration_ms > 0 ? ", at most " : "",
                 c->duration_ms > 0 ? dur : "");
    }
    else if (c->steps > 0) {
        snprintf(window, sizeof(window), "%" PRIu32 " steps%s%s", c->steps,
                 c->duration_ms > 0 ? ", at most " : "", c->duration_ms > 0 ? dur : "");
    }
    else if (c->duration_ms > 0) {
        snprintf(window, sizeof(window), "for %s", dur);
    }
    else {
        window[0] = '\0';
    }
    if (c->n_ranks == 1) {
        snprintf(buf, cap, "run %" PRIu64 ": capturing job %s, rank %s%s%s%s%s",
                 c->run != NULL ? c->run->id : 0, c->run != NULL ? c->run->job : "", ranks,
                 hosts > 0 ? " on " : "", hosts > 0 ? c->ranks[0]->host : "",
                 window[0] != '\0' ? ", " : "", window);
    }
    else {
        snprintf(buf, cap, "run %" PRIu64 ": capturing job %s, ranks %s (%zu on %zu host%s)%s%s",
                 c->run != NULL ? c->run->id : 0, c->run != NULL ? c->run->job : "", ranks,
                 c->n_ranks, hosts, hosts == 1 ? "" : "s", window[0] != '\0' ? ", " : "", window);
    }
    return buf;
}

int kp_capview_exit_status(const Kprof__V1__CaptureStatusResponse *r)
{
    for (size_t i = 0; i < r->n_captures; i++) {
        if (kp_capview_progress(r->captures[i]) == KP_CAPVIEW_FAILED) {
            return KPROFCTL_EXIT_FAILED;
        }
    }
    return KPROFCTL_EXIT_OK;
}

void kp_capview_report_failures(const struct kp_rpcverb *v,
                                const Kprof__V1__CaptureStatusResponse *r)
{
    for (size_t i = 0; i < r->n_captures; i++) {
        const Kprof__V1__Capture *c = r->captures[i];
        const Kprof__V1__CaptureRank *first = NULL;
        size_t bad = 0;

        if (kp_capview_progress(c) != KP_CAPVIEW_FAILED) {
            continue;
        }
        for (size_t k = 0; k < c->n_ranks; k++) {
            const Kprof__V1__CaptureRank *rk = c->ranks[k];

            if (rk->state != KPROF__V1__RANK_STATE__RANK_STATE_DONE) {
                bad++;
                if (first == NULL || rk->rank < first->rank) {
                    first = rk;
                }
            }
        }
        if (first == NULL) {
            kp_rpcverb_error(v, "run %" PRIu64 " failed", c->run != NULL ? c->run->id : 0);
            continue;
        }
        kp_rpcverb_error(
            v,
            "run %" PRIu64 " failed: %zu of %zu ranks did not finish: rank %" PRId32 "%s%s%s: %s",
            c->run != NULL ? c->run->id : 0, bad, c->n_ranks, first->rank,
            nonempty(first->host) != NULL ? " (" : "",
            nonempty(first->host) != NULL ? first->host : "",
            nonempty(first->host) != NULL ? ")" : "",
            nonempty(first->reason) != NULL ? first->reason
                                            : kp_capview_rank_state_name(first->state));
    }
}
