/*
 * kp_capview_watch: the wait loop of start --wait and status --watch (capview.h): polls
 * Control.CaptureStatus, redrawing or reprinting the status table, until every capture is over
 * or SIGINT comes.
 */
#include "capview.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kprofctl.h"

#define CLEAR_SCREEN "\033[H\033[2J"

static bool all_over(const Kprof__V1__CaptureStatusResponse *r)
{
    for (size_t i = 0; i < r->n_captures; i++) {
        if (kp_capview_progress(r->captures[i]) == KP_CAPVIEW_RUNNING) {
            return false;
        }
    }
    return true;
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void) sig;
    interrupted = 1;
}

/* Sleeps ms, or less when SIGINT comes. */
static void nap(long long ms)
{
    struct timespec ts = { .tv_sec = (time_t) (ms / 1000),
                           .tv_nsec = (long) (ms % 1000) * 1000000 };

    while (!interrupted && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The status table of r as the verb prints it, into *text (owned: free). Returns 0 or an
 * exit status (message printed). */
static int render(struct kp_rpcverb *v, const Kprof__V1__CaptureStatusResponse *r, char **text)
{
    struct kp_table *t = NULL;
    size_t len = 0;
    FILE *mem = NULL;
    int rc;

    *text = NULL;
    if ((rc = kp_rpcverb_table(v, &t)) != 0) {
        return rc;
    }
    if (kp_capview_add_response(t, r) != 0 || (mem = open_memstream(text, &len)) == NULL) {
        kp_rpcverb_error(v, "out of memory");
        rc = KPROFCTL_EXIT_FAILED;
        goto out;
    }
    rc = kp_rpcverb_print(v, t, mem);
out:
    if (mem != NULL) {
        fclose(mem);
    }
    if (rc != 0) {
        free(*text);
        *text = NULL;
    }
    kp_table_destroy(t);
    return rc;
}

/* Shows one answer: redrawn on a terminal, else printed when it changed since *prev (which
 * takes text). Returns 0 or 1 (message printed). */
static int show(struct kp_rpcverb *v, const struct kp_capview_watch *w, bool tty, char *text,
                char **prev)
{
    char clock[32], every[64];
    time_t now = time(NULL);
    struct tm tm;
    int rc = 0;

    if (tty) {
        clock[0] = '\0';
        if (localtime_r(&now, &tm) != NULL) {
            strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
        }
        printf(CLEAR_SCREEN "every %s: %s  (ctrl-c to stop)  %s\n\n%s",
               kp_capview_duration_format((uint64_t) w->interval_ms, every, sizeof(every)),
               w->title, clock, text);
    }
    else if (*prev == NULL || strcmp(*prev, text) != 0) {
        printf("%s%s", *prev != NULL ? "\n" : "", text);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        kp_rpcverb_error(v, "writing the table failed: %s", strerror(errno));
        rc = KPROFCTL_EXIT_FAILED;
    }
    free(*prev);
    *prev = text;
    return rc;
}

int kp_capview_watch(struct kp_rpcverb *v, const struct kp_capview_watch *w,
                     Kprof__V1__CaptureStatusResponse **last)
{
    Kprof__V1__CaptureStatusRequest req = KPROF__V1__CAPTURE_STATUS_REQUEST__INIT;
    ProtobufCMessage *msg = NULL;
    struct sigaction sa, old;
    bool tty = w->show && isatty(STDOUT_FILENO);
    char *prev = NULL, *text = NULL;
    int rc;

    *last = NULL;
    req.run_id = w->run_id;
    req.limit = w->limit;
    interrupted = 0;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND; /* no SA_RESTART: the nap ends at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    for (;;) {
        if (interrupted) {
            rc = KPROFCTL_EXIT_INTERRUPTED;
            break;
        }
        if ((rc = kp_rpcverb_call(v, "CaptureStatus", &req.base,
                                  &kprof__v1__capture_status_response__descriptor, &msg)) != 0) {
            break;
        }
        if (interrupted) {
            rc = KPROFCTL_EXIT_INTERRUPTED;
            break;
        }
        if (w->show) {
            if ((rc = render(v, (Kprof__V1__CaptureStatusResponse *) msg, &text)) != 0 ||
                (rc = show(v, w, tty, text, &prev)) != 0) {
                break;
            }
        }
        if (all_over((Kprof__V1__CaptureStatusResponse *) msg)) {
            *last = (Kprof__V1__CaptureStatusResponse *) msg;
            msg = NULL;
            rc = 0;
            break;
        }
        protobuf_c_message_free_unpacked(msg, NULL);
        msg = NULL;
        nap(w->interval_ms);
    }
    if (msg != NULL) {
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    free(prev);
    sigaction(SIGINT, &old, NULL);
    if (rc == KPROFCTL_EXIT_INTERRUPTED && tty) {
        fputc('\n', stdout);
    }
    return rc;
}
