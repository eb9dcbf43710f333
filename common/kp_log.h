/*
 * Logging: one line per message on stderr, "ts level module: key=value ...".
 * Each .c file defines KP_LOG_MODULE before including this header. The level check comes
 * before any formatting. Thread-safe (one write(2) per line).
 */
#ifndef KP_LOG_H
#define KP_LOG_H

#include <stdarg.h>

enum kp_log_level {
    KP_LOG_ERROR = 0, /* an operator must act */
    KP_LOG_WARN = 1,  /* degraded but self-healing */
    KP_LOG_INFO = 2,  /* lifecycle */
    KP_LOG_DEBUG = 3, /* per batch */
};

#ifndef KP_LOG_MODULE
#define KP_LOG_MODULE "kprof"
#endif

extern int kp_log_level_current;

/* Sets the threshold; messages above it are not formatted. */
void kp_log_set_level(enum kp_log_level level);

/* Parses "error", "warn", "info" or "debug". Returns 0, or -EINVAL. */
int kp_log_parse_level(const char *s, enum kp_log_level *out);

void kp_log_write(enum kp_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define kp_log_at(level, ...)                                  \
    do {                                                       \
        if ((int) (level) <= kp_log_level_current) {           \
            kp_log_write((level), KP_LOG_MODULE, __VA_ARGS__); \
        }                                                      \
    } while (0)

#define kp_log_error(...) kp_log_at(KP_LOG_ERROR, __VA_ARGS__)
#define kp_log_warn(...)  kp_log_at(KP_LOG_WARN, __VA_ARGS__)
#define kp_log_info(...)  kp_log_at(KP_LOG_INFO, __VA_ARGS__)
#define kp_log_debug(...) kp_log_at(KP_LOG_DEBUG, __VA_ARGS__)

/*
 * Complain/release for reconnect loops (after collectd's utils_complain): the first failure
 * logs, repeats log at doubling intervals up to an hour, and the recovery logs once.
 * Not thread-safe: one struct per loop.
 */
struct kp_complain {
    long long next_ns;     /* CLOCK_MONOTONIC ns before which repeats stay quiet */
    long long interval_ns; /* current back-off; 0 while healthy */
};

void kp_complain(struct kp_complain *c, enum kp_log_level level, const char *module,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Logs fmt at info once if c was complaining, and resets it. */
void kp_release(struct kp_complain *c, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
