/*
 * kp_clock: the two clocks kprof's daemons and tools read. CLOCK_MONOTONIC milliseconds for
 * timeouts, deadlines and rates (never jumps); CLOCK_REALTIME nanoseconds since the Unix
 * epoch for what is stored or shown (it is the clock CUPTI stamps records with).
 */
#ifndef KP_CLOCK_H
#define KP_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline long long kp_mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t kp_real_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
