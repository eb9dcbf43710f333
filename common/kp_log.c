#include "kp_log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kp_clock.h"

int kp_log_level_current = KP_LOG_INFO;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void kp_log_set_level(enum kp_log_level level)
{
    kp_log_level_current = (int) level;
}

int kp_log_parse_level(const char *s, enum kp_log_level *out)
{
    for (int i = 0; i < 4; i++) {
        if (s != NULL && strcmp(s, level_names[i]) == 0) {
            *out = (enum kp_log_level) i;
            return 0;
        }
    }
    return -EINVAL;
}

static void log_vwrite(enum kp_log_level level, const char *module, const char *fmt, va_list ap)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    size_t n;
    int r;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    r = snprintf(line + n, sizeof(line) - n, ".%03ldZ %s %s: ", ts.tv_nsec / 1000000,
                 level_names[level], module);
    if (r > 0) {
        n += (size_t) r;
    }
    if (n < sizeof(line)) {
        r = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
        if (r > 0) {
            n += (size_t) r;
        }
    }
    if (n >= sizeof(line) - 1) {
        n = sizeof(line) - 2; /* truncated: keep the newline */
    }
    line[n++] = '\n';
    /* One write per line so lines from threads do not interleave. */
    while (write(STDERR_FILENO, line, n) < 0 && errno == EINTR) {
    }
}

void kp_log_write(enum kp_log_level level, const char *module, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    log_vwrite(level, module, fmt, ap);
    va_end(ap);
}

void kp_complain(struct kp_complain *c, enum kp_log_level level, const char *module,
                 const char *fmt, ...)
{
    long long now = kp_mono_ns();
    va_list ap;

    if (c->interval_ns != 0 && now < c->next_ns) {
        return;
    }
    c->interval_ns = c->interval_ns == 0 ? 10000000000LL : c->interval_ns * 2;
    if (c->interval_ns > 3600000000000LL) {
        c->interval_ns = 3600000000000LL;
    }
    c->next_ns = now + c->interval_ns;
    if ((int) level <= kp_log_level_current) {
        va_start(ap, fmt);
        log_vwrite(level, module, fmt, ap);
        va_end(ap);
    }
}

void kp_release(struct kp_complain *c, const char *module, const char *fmt, ...)
{
    va_list ap;

    if (c->interval_ns == 0) {
        return;
    }
    c->interval_ns = 0;
    c->next_ns = 0;
    if (KP_LOG_INFO <= kp_log_level_current) {
        va_start(ap, fmt);
        log_vwrite(KP_LOG_INFO, module, fmt, ap);
        va_end(ap);
    }
}
