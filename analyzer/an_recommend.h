/*
 * recommend: the TensorBoard plugin's performance recommendations
 * (docs/specs/tbplugin-views.md §11) on a loaded rank, checked in the plugin's order:
 *  1. DataLoader > 5% of the average step;    2. DataParallel on more than one GPU;
 *  3. DDP without NCCL on a device >= 3.5;    4. Communication > 10% of the average step;
 *  5. GPUs under 50% utilization;             6. AMP: no Tensor Core kernel time although
 *     Tensor Core eligible ops launch kernels (device 0 of compute capability >= 7);
 *  7. a GPU's peak allocated memory above 90% of its capacity.
 *
 * Two lists come out of one call:
 *  - html: the plugin's own texts, byte for byte, for parity (its overview shows them as
 *    "<ul><li>…</li></ul>", kp_an_recs_overview_html). They are computed from the plugin's
 *    double-counting breakdown figure and keep its quirks: the Gradient Compression link's
 *    href is a Python tuple's repr; "has"/"have" follows the *string* length of the GPU list,
 *    whose last id is joined with a bare "and" ("GPU 0and 1 have"); the CPU's memory (device
 *    id -1) is not skipped and is measured against the last GPU's capacity ("on GPU-1").
 *  - text: kprof's own, plain text (a link is "title (url)"), from kprof's own breakdown
 *    figure, without those quirks: the real URL, "GPU 0 and 1 have", "GPU 12 has", only GPUs
 *    measured against their own capacity; rule 5 only with a steps window longer than 0.
 *
 * Inputs beyond the handle: the rank's devices (deviceProperties: compute capability, memory)
 * and the peak "Total Allocated" per device of its memory events, read over c.
 * kp_an_recommend computes the breakdown twice (the plugin's figure, then kprof's): call
 * kp_an_breakdown after it, not before, when both are wanted.
 * Thread-safety: as the handle (one thread at a time).
 */
#ifndef KP_AN_RECOMMEND_H
#define KP_AN_RECOMMEND_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "an.h"

#define KP_AN_RECS_MAX 7 /* one per rule at most */

struct kp_an_recs {
    size_t n_html, n_text;
    char *html[KP_AN_RECS_MAX]; /* the plugin's texts (HTML), in rule order */
    char *text[KP_AN_RECS_MAX]; /* kprof's own (plain text), in rule order */
};

/* Fills *out (caller's memory; kp_an_recs_fini frees it) for run/rank, loaded in a, reading
 * the devices and memory_events tables over c. Returns 0, -ENOMEM, or KP_EPG / KP_ETOOBIG
 * with a message in errbuf; *out is then empty. */
int kp_an_recommend(struct kp_an *a, PGconn *c, int64_t run, int rank, struct kp_an_recs *out,
                    char *errbuf, size_t errlen);

/* The plugin's overview HTML: "<ul><li>R1</li>…</ul>", or "<ul><li>N/A</li></ul>" without
 * any. Returns a malloc'd string, or NULL (out of memory). */
char *kp_an_recs_overview_html(const struct kp_an_recs *r);

/* Writes "[\"…\", …]" of kprof's texts (html false) or the plugin's (html true). */
void kp_an_recs_json(FILE *f, const struct kp_an_recs *r, bool html);

/* Frees the strings; r is empty afterwards. NULL is fine. */
void kp_an_recs_fini(struct kp_an_recs *r);

#endif
