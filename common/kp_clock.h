/*
 * kp_clock: the two clocks kprof's daemons and tools read. CLOCK_MONOTONIC for timeouts,
 * deadlines and rates (never jumps); CLOCK_REALTIME nanoseconds since the Unix epoch for what
 * is stored or shown (it is the clock CUPTI stamps records with).
 *
 * Header only, libc only, and every function is async-signal-safe (clock_gettime is): the
 * injection library (agent/inject) uses it inside the profiled process, where it may link
 * nothing of kp_common.
 */
#ifndef KP_CLOCK_H
#define KP_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline int64_t kp_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CLOCK_MONOTONIC in milliseconds. */
static inline long long kp_mono_ms(void)
{
    return (long long) (kp_mono_ns() / 1000000);
}

/* CLOCK_MONOTONIC in seconds, for elapsed times shown to the user and rates. */
static inline double kp_mono_s(void)
{
    return (double) kp_mono_ns() / 1e9;
}

/* CLOCK_REALTIME in nanoseconds since the Unix epoch. */
static inline int64_t kp_real_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * The CLOCK_REALTIME instant ms milliseconds from now, as the absolute timespec that
 * pthread_cond_timedwait (on a condition variable with the default clock) and
 * pthread_timedjoin_np take.
 */
static inline struct timespec kp_real_deadline(long long ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t) (ms / 1000);
    ts.tv_nsec += (long) (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif
