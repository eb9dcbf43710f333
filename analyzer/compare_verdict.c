/* kp_compare: who waits for whom and the verdict, in words (docs/specs/compare.md §6-§8). */
#include "compare_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kp_err.h"
#include "kp_pg.h"
#include "kp_strbuf.h"

int64_t kp__compare_cell_cause(const struct kp_compare_cell *cl, int cause)
{
    return cause == KP_COMPARE_COMPUTE ? cl->compute_ns
           : cause == KP_COMPARE_HOST  ? cl->host_ns
                                       : cl->launch_ns;
}

static const char *cause_phrase(enum kp_compare_cause c)
{
    switch (c) {
    case KP_COMPARE_COMPUTE:
        return "its compute (GPU kernels) takes";
    case KP_COMPARE_HOST:
        return "its data loading takes";
    default:
        return "its kernel launches (CUDA runtime calls) take";
    }
}

/* The rank the others wait for (docs/specs/compare.md §7), flagged "late" when it is no straggler,
 * and HTA's pick per step and over the steps. */
void kp__compare_who_waits(struct kp_compare_result *res, const struct kp_compare_opts *o)
{
    size_t nr = res->n_ranks, ns = res->n_steps, best_n = 0;
    long best = -1;

    /* the latest rank, when it is late and last in at least half the steps (not jitter's pick) */
    for (size_t r = 0; r < nr; r++) {
        if (best < 0 || res->ranks[r].late_ns > res->ranks[best].late_ns) {
            best = (long) r;
        }
    }
    if (best >= 0) {
        size_t n_last = 0;

        for (size_t j = 0; j < ns; j++) {
            n_last += res->steps[j].last_rank == res->ranks[best].rank;
        }
        if (!(res->ranks[best].late_ns > o->late_frac * res->step_median_ns) || 2 * n_last < ns) {
            best = -1;
        }
    }
    if (best >= 0) {
        res->waited_for = res->ranks[best].rank;
        res->ranks[best].late = !res->ranks[best].straggler;
        res->ranks[best].waits = false;
    }
    /* HTA: per step, the rank whose last collective starts latest on its own clock */
    for (size_t j = 0; j < ns; j++) {
        long who = -1;
        bool tie = false;

        for (size_t r = 0; r < nr; r++) {
            const struct kp_compare_cell *cl = &res->cells[r * ns + j];

            if (!cl->present || cl->n_coll_seen == 0) {
                continue;
            }
            if (who < 0 || cl->last_start > res->cells[(size_t) who * ns + j].last_start) {
                who = (long) r;
                tie = false;
            }
            else if (cl->last_start == res->cells[(size_t) who * ns + j].last_start) {
                tie = true;
            }
        }
        res->steps[j].hta_rank = who >= 0 && !tie ? res->ranks[who].rank : -1;
    }
    for (size_t r = 0; r < nr; r++) {
        size_t n = 0;

        for (size_t j = 0; j < ns; j++) {
            n += res->steps[j].hta_rank == res->ranks[r].rank;
        }
        if (n > best_n) {
            best_n = n;
            res->hta_rank = res->ranks[r].rank;
            res->hta_rank_steps = n;
        }
    }
}

/* Appends to buf (cap bytes, *len used) with snprintf's format, never past cap. */
static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (*len + 1 >= cap) {
        return;
    }
    va_start(ap, fmt);
    n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0) {
        *len = *len + (size_t) n < cap ? *len + (size_t) n : cap - 1;
    }
}

int kp_compare_ranges(char *buf, size_t cap, const int *v, size_t n)
{
    size_t len = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < n;) {
        size_t j = i;

        while (j + 1 < n && v[j + 1] == v[j] + 1) {
            j++;
        }
        if (len + 40 >= cap) {
            put(buf, cap, &len, "%s... (%zu in all)", i ? ", " : "", n);
            return -1;
        }
        if (j == i) {
            put(buf, cap, &len, "%s%d", i ? ", " : "", v[i]);
        }
        else {
            put(buf, cap, &len, "%s%d..%d", i ? ", " : "", v[i], v[j]);
        }
        i = j + 1;
    }
    return 0;
}

const struct kp_compare_rank *kp__compare_rank_of(const struct kp_compare_result *res, int rank)
{
    for (size_t r = 0; r < res->n_ranks; r++) {
        if (res->ranks[r].rank == rank) {
            return &res->ranks[r];
        }
    }
    return NULL;
}

/* The caveats every verdict carries: HTA's pick against kprof's, point-to-point collectives,
 * unaligned clocks, the ranks of the world missing from the run. */
static void verdict_caveats(struct kp_compare_result *res, const struct kp_compare_opts *o, char *v,
                            size_t cap, size_t *len)
{
    int named = res->n_stragglers > 0 ? res->stragglers[0].rank : res->waited_for;

    if (res->hta_rank >= 0 && named >= 0) {
        const struct kp_compare_rank *h = kp__compare_rank_of(res, res->hta_rank);

        if (res->hta_rank == named) {
            put(v, cap, len,
                "; HTA's straggler metric agrees: rank %d's last collective of a step starts "
                "latest in %zu/%zu steps",
                res->hta_rank, res->hta_rank_steps, res->n_steps);
        }
        else {
            put(v, cap, len,
                "; HTA's straggler metric would name rank %d instead (its last collective of a "
                "step starts latest in %zu/%zu steps): HTA reads the hosts' clocks as they are "
                "(rank %d's is %.0f us off the reference's%s) and one kernel per step, kprof "
                "aligns the clocks and sums the lateness over every collective",
                res->hta_rank, res->hta_rank_steps, res->n_steps, res->hta_rank,
                h != NULL ? (double) h->clock_offset_ns / 1e3 : 0.0,
                h != NULL && !h->has_offset ? ", unknown" : "");
        }
    }
    else if (res->hta_rank < 0 && named >= 0 && res->n_groups > 0) {
        put(v, cap, len,
            "; HTA's straggler metric names no single rank: in every step the last collectives "
            "of several ranks start at the same time on their hosts' clocks");
    }
    if (res->n_p2p > 0) {
        put(v, cap, len,
            "; caveat: %zu of the %zu collectives compared are point-to-point (SendRecv, send, "
            "recv): they end when their own peer is done, which may be a rank outside this run, "
            "so a late arrival there is not necessarily this rank's doing",
            res->n_p2p, res->n_groups);
    }
    if (res->n_no_offset > 0) {
        put(v, cap, len,
            "; caveat: the clocks of %zu of the %zu ranks could not be aligned (no collective "
            "that every rank finishes together, point-to-point ones excluded): their arrivals "
            "are compared on their hosts' own clocks",
            res->n_no_offset, res->n_ranks);
    }
    if (res->n_missing > 0) {
        char list[512];

        kp_compare_ranges(list, sizeof(list), res->missing, res->n_missing);
        put(v, cap, len,
            "; only %zu of the world's %d ranks are in this run: rank%s %s %s missing (not "
            "captured or imported), so a straggler among them cannot be seen here",
            res->n_ranks, res->world_size, res->n_missing == 1 ? "" : "s", list,
            res->n_missing == 1 ? "is" : "are");
    }
    if (o->has_step) {
        put(v, cap, len,
            "; this is step %" PRId64 " alone: the other steps may name other ranks (the clock "
            "offsets are the whole run's)",
            o->step);
    }
}

void kp__compare_make_verdict(struct kp_compare_result *res, const struct kp_compare_opts *o,
                              size_t n_coll_total)
{
    char *v = res->verdict;
    size_t cap = sizeof(res->verdict), len = 0;

    v[0] = '\0';
    if (res->n_stragglers > 0) {
        for (size_t i = 0; i < res->n_stragglers; i++) {
            const struct kp_compare_straggler *s = &res->stragglers[i];
            size_t rsteps = 0;

            for (size_t r = 0; r < res->n_ranks; r++) {
                if (res->ranks[r].rank == s->rank) {
                    for (size_t j = 0; j < res->n_steps; j++) {
                        rsteps += res->cells[r * res->n_steps + j].present;
                    }
                }
            }
            put(v, cap, &len,
                "%srank %d %s: it arrives late at the collectives in %zu/%zu steps, %.0f us after "
                "the median rank per step over all of a step's collectives (up to %.0f us at one "
                "collective); %s %.0f us more per step "
                "than the median rank's (%.0f vs %.0f us)",
                i == 0 ? "" : "; ", s->rank,
                res->n_stragglers == 1 ? "is the straggler" : "is a straggler", s->n_steps, rsteps,
                s->late_ns / 1e3, s->max_late_ns / 1e3, cause_phrase(s->cause),
                s->excess_ns[s->cause] / 1e3, s->own_ns[s->cause] / 1e3,
                (s->own_ns[s->cause] - s->excess_ns[s->cause]) / 1e3);
        }
        verdict_caveats(res, o, v, cap, &len);
        return;
    }
    if (res->n_ranks < 2) {
        put(v, cap, &len, "no straggler: only 1 rank (rank %d) to compare", res->ranks[0].rank);
        verdict_caveats(res, o, v, cap, &len);
        return;
    }
    {
        double lo = INFINITY, hi = 0.0;

        for (size_t r = 0; r < res->n_ranks; r++) {
            lo = res->ranks[r].step_ns < lo ? res->ranks[r].step_ns : lo;
            hi = res->ranks[r].step_ns > hi ? res->ranks[r].step_ns : hi;
        }
        put(v, cap, &len, "no straggler: step times within %.0f%% across %zu ranks%s",
            res->step_median_ns > 0 ? 100.0 * (hi - lo) / res->step_median_ns : 0.0, res->n_ranks,
            n_coll_total == 0 ? " (no collectives to compare arrivals at)" : "");
    }
    if (res->waited_for >= 0) {
        const struct kp_compare_rank *w = kp__compare_rank_of(res, res->waited_for);
        double ex = 0.0;
        size_t n_last = 0;

        for (size_t r = 0; r < res->n_ranks; r++) {
            if (&res->ranks[r] != w) {
                continue;
            }
            for (size_t j = 0; j < res->n_steps; j++) {
                const struct kp_compare_cell *cl = &res->cells[r * res->n_steps + j];

                for (int c = 0; c < KP_COMPARE_CAUSE_COUNT && cl->present; c++) {
                    ex = fmax(ex, cl->excess_ns[c]);
                }
                n_last += res->steps[j].last_rank == w->rank;
            }
        }
        put(v, cap, &len,
            "; but the others wait for rank %d at the collectives: it arrives %.0f us after the "
            "median rank per step over all of a step's collectives (last in %zu/%zu steps), "
            "while its compute, data "
            "loading and launches exceed the median rank's by %.0f us at most (%.1f%% of a "
            "step), so what delays it is outside them",
            w->rank, w->late_ns / 1e3, n_last, res->n_steps, ex / 1e3,
            res->step_median_ns > 0 ? 100.0 * ex / res->step_median_ns : 0.0);
    }
    verdict_caveats(res, o, v, cap, &len);
}

/* Fills the cells from the loaded rows: steps, sums, and the collectives into *colls, those of
 * every step of the run (all[0..n_all), sorted; si indexes it), cs set for the compared ones
 * (nums, res->steps). */
