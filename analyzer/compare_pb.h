/*
 * kp_compare_pb: the cross-rank comparison (compare.h) as Analyzer.Compare's reply
 * (proto/kprof.proto CompareResponse) and back. kprof-analyzer builds the reply from a result
 * with kp_compare_pb_init / kp_compare_pb_init_hta; kprofctl compare turns the reply back into a
 * result with kp_compare_from_pb / kp_compare_hta_from_pb and prints it with compare.h's own
 * writers (kp_compare_json, kp_compare_order, kp_compare_flag), so that its output is the same as
 * when the comparison ran in process. Every figure kprofctl prints goes through unchanged (doubles
 * as doubles, NaN included). Of the per-rank, per-step cells (kp_compare_result.cells) only the
 * lateness and the step time go over (CompareRank.step_late_ns: the lateness map kprofctl
 * prints; CompareRank.step_time_ns: the web page's step-time map; NaN where the rank lacks the
 * step); the rest stays on the server.
 */
#ifndef KP_COMPARE_PB_H
#define KP_COMPARE_PB_H

#include <stddef.h>

#include "compare.h"
#include "kprof.pb-c.h"

/* A reply under construction: msg points into the arrays here and into the result or HTA
 * call it was built from (borrowed: keep it until kp_compare_pb_fini). Caller-owned. */
struct kp_compare_pb {
    Kprof__V1__CompareResponse msg;
    Kprof__V1__CompareThresholds thresholds;
    Kprof__V1__CompareHta hta;
    void *arr[9];
};

/* p->msg as r's comparison: run_id, ranks (by rank number), steps, stragglers with their
 * evidence (one per cause, in compare.h's cause order), step_median_ns and verdict; the
 * caller sets thresholds (p->thresholds is there for it), offsets_saved and cached. Borrows
 * r. Returns 0 or -ENOMEM (call kp_compare_pb_fini in both cases). */
int kp_compare_pb_init(struct kp_compare_pb *p, const struct kp_compare_result *r);

/* p->msg with h as its hta (num_candidates k) and nothing else. Borrows h. Returns 0 or
 * -ENOMEM (call kp_compare_pb_fini in both cases). */
int kp_compare_pb_init_hta(struct kp_compare_pb *p, const struct kp_compare_hta *h, int k);

/* Frees p's arrays; p->msg is invalid afterwards. Safe after a failed init. */
void kp_compare_pb_fini(struct kp_compare_pb *p);

/* The reply's comparison as a result (borrows m). Returns 0 and *out (kp_compare_result_destroy;
 * cells is NULL), -ENOMEM, or -EPROTO with errbuf saying what is malformed (an unknown cause,
 * a cause without its evidence); cells carry present, late_ns and step_ns only. */
int kp_compare_from_pb(const Kprof__V1__CompareResponse *m, struct kp_compare_result **out,
                       char *errbuf, size_t errlen);

/* The reply's HTA call (borrows h). Returns 0 and *out (kp_compare_hta_destroy) or -ENOMEM. */
int kp_compare_hta_from_pb(const Kprof__V1__CompareHta *h, struct kp_compare_hta **out);

#endif
