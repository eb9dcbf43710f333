/* HTA's queue lengths depend on the order numpy's sort leaves equal keys in: numpy's argsort,
 * reproduced exactly (see kp__hta_np_argsort below). */
#include "hta_int.h"

#include <stddef.h>
#include <stdint.h>

/* numpy's argsort(kind="quicksort") of v (introsort: median-of-3 quicksort, insertion sort
 * under 16 rows, heapsort past the depth limit; numpy 1.24 npysort/quicksort.cpp and
 * heapsort.cpp). pandas sorts with it, and the order it leaves equal keys in decides HTA's
 * queue lengths where a launch and a GPU row share a µs, so it is reproduced exactly. */
#define NP_SMALL_QUICKSORT 15
#define NP_QS_STACK        128

/* numpy's sift-down: tmp into the 1-based heap a[1..n] from a[i] down. */
static void np_sift_down(const int64_t *v, size_t *a, size_t i, size_t n, size_t tmp)
{
    for (size_t j = i << 1; j <= n;) {
        if (j < n && v[a[j]] < v[a[j + 1]]) {
            j += 1;
        }
        if (v[tmp] < v[a[j]]) {
            a[i] = a[j];
            i = j;
            j += j;
        }
        else {
            break;
        }
    }
    a[i] = tmp;
}

static void np_aheapsort(const int64_t *v, size_t *tosort, size_t n)
{
    size_t *a = tosort - 1, tmp;

    for (size_t l = n >> 1; l > 0; --l) {
        np_sift_down(v, a, l, n, a[l]);
    }
    for (; n > 1;) {
        tmp = a[n];
        a[n] = a[1];
        n -= 1;
        np_sift_down(v, a, 1, n, tmp);
    }
}

#define ISWAP(a, b)      \
    do {                 \
        size_t t_ = (a); \
        (a) = (b);       \
        (b) = t_;        \
    } while (0)

void kp__hta_np_argsort(const int64_t *v, size_t *tosort, size_t num)
{
    size_t *pl = tosort, *pr = tosort + num - 1, *stack[NP_QS_STACK], **sptr = stack;
    size_t *pm, *pi, *pj, *pk, vi;
    int depth[NP_QS_STACK], *psdepth = depth, cdepth = 0;
    int64_t vp;

    if (num < 2) {
        return;
    }
    for (size_t u = num; u >>= 1;) {
        cdepth++;
    }
    cdepth *= 2;
    for (;;) {
        if (cdepth < 0) {
            np_aheapsort(v, pl, (size_t) (pr - pl + 1));
            goto stack_pop;
        }
        while ((pr - pl) > NP_SMALL_QUICKSORT) {
            pm = pl + ((pr - pl) >> 1);
            if (v[*pm] < v[*pl]) {
                ISWAP(*pm, *pl);
            }
            if (v[*pr] < v[*pm]) {
                ISWAP(*pr, *pm);
            }
            if (v[*pm] < v[*pl]) {
                ISWAP(*pm, *pl);
            }
            vp = v[*pm];
            pi = pl;
            pj = pr - 1;
            ISWAP(*pm, *pj);
            for (;;) {
                do {
                    ++pi;
                } while (v[*pi] < vp);
                do {
                    --pj;
                } while (vp < v[*pj]);
                if (pi >= pj) {
                    break;
                }
                ISWAP(*pi, *pj);
            }
            pk = pr - 1;
            ISWAP(*pi, *pk);
            if (pi - pl < pr - pi) {
                *sptr++ = pi + 1;
                *sptr++ = pr;
                pr = pi - 1;
            }
            else {
                *sptr++ = pl;
                *sptr++ = pi - 1;
                pl = pi + 1;
            }
            *psdepth++ = --cdepth;
        }
        for (pi = pl + 1; pi <= pr; ++pi) {
            vi = *pi;
            vp = v[vi];
            pj = pi;
            pk = pi - 1;
            while (pj > pl && vp < v[*pk]) {
                *pj-- = *pk--;
            }
            *pj = vi;
        }
stack_pop:
        if (sptr == stack) {
            break;
        }
        pr = *(--sptr);
        pl = *(--sptr);
        cdepth = *(--psdepth);
    }
}
