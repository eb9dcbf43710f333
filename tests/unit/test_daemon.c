/* Unit tests for common/kp_daemon: the stop signals (taken by sigwait, and by the watch thread
 * that calls stop), the HTTP server that an empty address disables, and the ready file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kp_daemon.h"
#include "kp_http.h"

static char *slurp(const char *path)
{
    static char buf[1024];
    FILE *f = fopen(path, "r");
    size_t n;

    if (f == NULL) {
        return NULL;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* A blocked SIGINT sent to the process is taken by kp_daemon_signals_wait, not delivered. */
static void test_signals_wait(void **state)
{
    (void) state;
    assert_int_equal(kill(getpid(), SIGINT), 0);
    assert_int_equal(kp_daemon_signals_wait("test"), SIGINT);
    assert_int_equal(kill(getpid(), SIGTERM), 0);
    assert_int_equal(kp_daemon_signals_wait("test"), SIGTERM);
}

struct stopped {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int calls;
};

static void stop_cb(void *ud)
{
    struct stopped *s = ud;

    pthread_mutex_lock(&s->mu);
    s->calls++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

/* The watch thread calls stop once on SIGTERM; destroyed without a signal, it does not. */
static void test_sigwatch(void **state)
{
    struct stopped s = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
    struct kp_daemon_sigwatch *w = NULL;

    (void) state;
    assert_int_equal(kp_daemon_sigwatch_create("test", stop_cb, &s, &w), 0);
    assert_int_equal(kill(getpid(), SIGTERM), 0);
    pthread_mutex_lock(&s.mu);
    while (s.calls == 0) {
        pthread_cond_wait(&s.cond, &s.mu);
    }
    pthread_mutex_unlock(&s.mu);
    kp_daemon_sigwatch_destroy(w);
    assert_int_equal(s.calls, 1);

    assert_int_equal(kp_daemon_sigwatch_create("test", stop_cb, &s, &w), 0);
    kp_daemon_sigwatch_destroy(w); /* the loop ended on its own */
    assert_int_equal(s.calls, 1);
    kp_daemon_sigwatch_destroy(NULL);
}

/* No address: no server and no error; an address: a server on a port, named in the ready
 * file beside the gRPC address. */
static void test_http_and_ready_file(void **state)
{
    static const struct kp_http_handlers h = { 0 };
    char dir[] = "/tmp/kp_daemon.XXXXXX", path[256], want[128], err[256] = "";
    struct kp_http *http = (struct kp_http *) &h; /* must be reset */

    (void) state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ready", dir);
    assert_int_equal(kp_daemon_http_start("", NULL, &h, NULL, &http, err, sizeof(err)), 0);
    assert_null(http);
    assert_int_equal(kp_daemon_http_start(NULL, NULL, &h, NULL, &http, err, sizeof(err)), 0);
    assert_null(http);
    assert_int_equal(kp_daemon_ready_write(path, &(struct kp_ready_entry){ "grpc", "127.0.0.1:7" },
                                           1, NULL, err, sizeof(err)),
                     0);
    assert_string_equal(slurp(path), "grpc=127.0.0.1:7\n");
    assert_int_equal(kp_daemon_http_start("127.0.0.1:0", NULL, &h, NULL, &http, err, sizeof(err)),
                     0);
    assert_non_null(http);
    assert_true(kp_http_port(http) > 0);
    assert_int_equal(kp_daemon_ready_write(path, &(struct kp_ready_entry){ "grpc", "127.0.0.1:7" },
                                           1, http, err, sizeof(err)),
                     0);
    snprintf(want, sizeof(want), "grpc=127.0.0.1:7\nhttp=127.0.0.1:%d\n", kp_http_port(http));
    assert_string_equal(slurp(path), want);
    kp_http_destroy(http);
    assert_int_not_equal(
        kp_daemon_http_start("not an address", NULL, &h, NULL, &http, err, sizeof(err)), 0);
    assert_true(err[0] != '\0');
    unlink(path);
    rmdir(dir);
}

/* A unix datagram socket bound at path (a leading '@': the abstract namespace), as systemd's
 * NOTIFY_SOCKET; returns its fd. */
static int notify_listener(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t len = strlen(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@') {
        sa.sun_path[0] = '\0';
    }
    assert_int_equal(bind(fd, (struct sockaddr *) &sa,
                          (socklen_t) (offsetof(struct sockaddr_un, sun_path) + len)),
                     0);
    return fd;
}

/* The datagram waiting on fd, as a string (empty if none came). */
static const char *notify_got(int fd)
{
    static char buf[256];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);

    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

/* Readiness reaches systemd's NOTIFY_SOCKET when a daemon writes its ready file (a path or an
 * abstract socket); stopping is told as STOPPING=1; outside systemd nothing is sent. */
static void test_notify(void **state)
{
    char dir[] = "/tmp/kp_daemon.XXXXXX", path[256], abs[64], err[256] = "";
    int fd;

    (void) state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/notify", dir);
    fd = notify_listener(path);
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(kp_daemon_notify("READY=1"), 0);
    assert_string_equal(notify_got(fd), "");
    setenv("NOTIFY_SOCKET", path, 1);
    assert_int_equal(kp_daemon_ready_write(NULL, &(struct kp_ready_entry){ "grpc", "127.0.0.1:7" },
                                           1, NULL, err, sizeof(err)),
                     0);
    assert_string_equal(notify_got(fd), "READY=1\nSTATUS=serving");
    assert_int_equal(kp_daemon_notify("STOPPING=1"), 0);
    assert_string_equal(notify_got(fd), "STOPPING=1");
    close(fd);
    unlink(path);

    snprintf(abs, sizeof(abs), "@kp_daemon_test_%ld", (long) getpid());
    fd = notify_listener(abs);
    setenv("NOTIFY_SOCKET", abs, 1);
    assert_int_equal(kp_daemon_notify("READY=1"), 0);
    assert_string_equal(notify_got(fd), "READY=1");
    close(fd);

    setenv("NOTIFY_SOCKET", "relative/path", 1);
    assert_int_equal(kp_daemon_notify("READY=1"), -EINVAL);
    /* A socket that is gone: the ready file is still written and the call succeeds. */
    setenv("NOTIFY_SOCKET", path, 1);
    assert_true(kp_daemon_notify("READY=1") < 0);
    assert_int_equal(kp_daemon_ready_write(NULL, &(struct kp_ready_entry){ "grpc", "127.0.0.1:7" },
                                           1, NULL, err, sizeof(err)),
                     0);
    unsetenv("NOTIFY_SOCKET");
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signals_wait),
        cmocka_unit_test(test_sigwatch),
        cmocka_unit_test(test_http_and_ready_file),
        cmocka_unit_test(test_notify),
    };

    kp_daemon_signals_block(); /* before any thread, as a daemon's main does */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
