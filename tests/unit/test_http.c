/*
 * Unit tests for common/kp_http: a real server on an ephemeral loopback port, real sockets.
 * Every wait is a bounded poll(2); nothing sleeps to wait.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kp_clock.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_metrics.h"
#include "kp_strbuf.h"

#define IO_TIMEOUT_MS 5000 /* bound on any single wait for the server */

struct app {
    atomic_bool healthy;
    atomic_bool ready;
    atomic_int metrics_rc;
    atomic_size_t metrics_pad; /* extra bytes /metrics appends */
    struct kp_metrics *reg;
    struct kp_metric *hits;
};

static bool app_healthz(void *ud)
{
    struct app *a = ud;

    return atomic_load(&a->healthy);
}

static bool app_readyz(void *ud, char *why, size_t len)
{
    struct app *a = ud;

    if (atomic_load(&a->ready)) {
        return true;
    }
    snprintf(why, len, "postgres unreachable: host=/tmp");
    return false;
}

static int app_metrics(void *ud, struct kp_strbuf *out)
{
    struct app *a = ud;
    size_t pad = atomic_load(&a->metrics_pad);
    int rc;

    if (atomic_load(&a->metrics_rc) != 0) {
        return atomic_load(&a->metrics_rc);
    }
    kp_metric_add(a->hits, 1);
    rc = kp_metrics_render(a->reg, out);
    while (rc == 0 && out->len < pad) {
        rc = kp_strbuf_append_str(out, "# padding padding padding padding padding padding pad\n");
    }
    return rc;
}

static const struct kp_http_handlers app_handlers = {
    .healthz = app_healthz,
    .readyz = app_readyz,
    .metrics = app_metrics,
};

struct fixture {
    struct app app;
    struct kp_http *http;
    int port;
};

static struct fixture *fixture_start(const struct kp_http_limits *lim)
{
    struct fixture *f = calloc(1, sizeof(*f));
    char err[256] = "";

    assert_non_null(f);
    atomic_store(&f->app.healthy, true);
    atomic_store(&f->app.ready, true);
    assert_int_equal(kp_metrics_create(4, &f->app.reg), 0);
    assert_int_equal(kp_metrics_register(f->app.reg, "kprof_test_scrapes_total", "Scrapes.",
                                         KP_METRIC_COUNTER, NULL, NULL, &f->app.hits),
                     0);
    if (kp_http_create_with_limits("127.0.0.1:0", &app_handlers, lim, &f->app, &f->http, err,
                                   sizeof(err)) != 0) {
        fail_msg("kp_http_create: %s", err);
    }
    f->port = kp_http_port(f->http);
    assert_true(f->port > 0 && f->port < 65536);
    return f;
}

static void fixture_stop(struct fixture *f)
{
    kp_http_destroy(f->http);
    kp_metrics_destroy(f->app.reg);
    free(f);
}

static int connect_to(int port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t) port) };
    int fd;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof(sa)), 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    ssize_t r;

    while (n > 0) {
        r = send(fd, p, n, MSG_NOSIGNAL);
        assert_true(r > 0);
        p += r;
        n -= (size_t) r;
    }
}

/* Reads until the server closes (each wait bounded). Returns the bytes read into sb. */
static void read_to_eof(int fd, struct kp_strbuf *sb)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    char buf[4096];
    ssize_t r;

    for (;;) {
        if (poll(&pfd, 1, IO_TIMEOUT_MS) != 1) {
            fail_msg("no data or EOF from the server within %d ms", IO_TIMEOUT_MS);
        }
        r = recv(fd, buf, sizeof(buf), 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET)) {
            return;
        }
        assert_true(r > 0);
        assert_int_equal(kp_strbuf_append(sb, buf, (size_t) r), 0);
    }
}

struct resp {
    int status;
    char head[1024];
    const char *body; /* into raw */
    size_t body_len;
    struct kp_strbuf raw;
};

static void parse_resp(struct resp *r)
{
    const char *end;
    const char *cl;

    r->status = -1;
    if (r->raw.data == NULL) {
        return;
    }
    end = strstr(r->raw.data, "\r\n\r\n");
    assert_non_null(end);
    assert_true((size_t) (end - r->raw.data) < sizeof(r->head));
    memcpy(r->head, r->raw.data, (size_t) (end - r->raw.data));
    r->head[end - r->raw.data] = '\0';
    assert_int_equal(sscanf(r->head, "HTTP/1.1 %d ", &r->status), 1);
    r->body = end + 4;
    r->body_len = r->raw.len - (size_t) (r->body - r->raw.data);
    /* Every response closes and says how long it is. */
    assert_non_null(strstr(r->head, "\r\nConnection: close"));
    cl = strstr(r->head, "\r\nContent-Length: ");
    assert_non_null(cl);
    assert_int_equal(strtoull(cl + 18, NULL, 10), r->body_len);
}

/* Sends a raw request on a fresh connection and reads the whole response. */
static void request(int port, const char *req, size_t len, struct resp *r)
{
    int fd = connect_to(port);

    memset(r, 0, sizeof(*r));
    kp_strbuf_init(&r->raw, 0);
    send_all(fd, req, len);
    read_to_eof(fd, &r->raw);
    close(fd);
    parse_resp(r);
}

static int get(int port, const char *path, struct resp *r)
{
    char req[512];

    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: localhost\r\nUser-Agent: t\r\n\r\n", path);
    request(port, req, strlen(req), r);
    return r->status;
}

static void resp_fini(struct resp *r)
{
    kp_strbuf_fini(&r->raw);
}

static void test_healthz(void **state)
{
    struct fixture *f = fixture_start(NULL);
    struct resp r;

    assert_int_equal(get(f->port, "/healthz", &r), 200);
    assert_int_equal(r.body_len, 3);
    assert_memory_equal(r.body, "ok\n", 3);
    assert_non_null(strstr(r.head, "Content-Type: text/plain"));
    resp_fini(&r);

    atomic_store(&f->app.healthy, false);
    assert_int_equal(get(f->port, "/healthz", &r), 503);
    assert_string_equal(r.body, "unhealthy\n");
    resp_fini(&r);

    /* The query string is ignored. */
    atomic_store(&f->app.healthy, true);
    assert_int_equal(get(f->port, "/healthz?verbose=1", &r), 200);
    resp_fini(&r);
    fixture_stop(f);
}

static void test_readyz(void **state)
{
    struct fixture *f = fixture_start(NULL);
    struct resp r;

    assert_int_equal(get(f->port, "/readyz", &r), 200);
    assert_string_equal(r.body, "ok\n");
    resp_fini(&r);

    atomic_store(&f->app.ready, false);
    assert_int_equal(get(f->port, "/readyz", &r), 503);
    assert_string_equal(r.body, "postgres unreachable: host=/tmp\n");
    resp_fini(&r);

    atomic_store(&f->app.ready, true);
    assert_int_equal(get(f->port, "/readyz", &r), 200);
    resp_fini(&r);
    fixture_stop(f);
}

static void test_metrics(void **state)
{
    struct fixture *f = fixture_start(NULL);
    struct resp r;

    assert_int_equal(get(f->port, "/metrics", &r), 200);
    assert_non_null(strstr(r.head, "Content-Type: text/plain; version=0.0.4"));
    assert_string_equal(r.body, "# HELP kprof_test_scrapes_total Scrapes.\n"
                                "# TYPE kprof_test_scrapes_total counter\n"
                                "kprof_test_scrapes_total 1\n");
    resp_fini(&r);
    assert_int_equal(get(f->port, "/metrics", &r), 200);
    assert_non_null(strstr(r.body, "kprof_test_scrapes_total 2\n"));
    resp_fini(&r);

    /* A big body goes out over several writes. */
    atomic_store(&f->app.metrics_pad, (size_t) 4 << 20);
    assert_int_equal(get(f->port, "/metrics", &r), 200);
    assert_true(r.body_len > (4u << 20));
    resp_fini(&r);

    /* A failing callback is a 500. */
    atomic_store(&f->app.metrics_rc, -EIO);
    assert_int_equal(get(f->port, "/metrics", &r), 500);
    resp_fini(&r);
    fixture_stop(f);
}

static void test_metrics_over_cap(void **state)
{
    struct kp_http_limits lim = { .max_response_bytes = 4096 };
    struct fixture *f = fixture_start(&lim);
    struct resp r;

    atomic_store(&f->app.metrics_pad, 8192);
    assert_int_equal(get(f->port, "/metrics", &r), 500);
    resp_fini(&r);
    atomic_store(&f->app.metrics_pad, 0);
    assert_int_equal(get(f->port, "/metrics", &r), 200);
    resp_fini(&r);
    fixture_stop(f);
}

static void test_null_handlers(void **state)
{
    struct kp_http *h = NULL;
    struct resp r;
    char err[128];

    assert_int_equal(kp_http_create(NULL, NULL, NULL, &h, err, sizeof(err)), 0);
    assert_int_equal(get(kp_http_port(h), "/healthz", &r), 200);
    resp_fini(&r);
    assert_int_equal(get(kp_http_port(h), "/readyz", &r), 200);
    resp_fini(&r);
    assert_int_equal(get(kp_http_port(h), "/metrics", &r), 200);
    assert_int_equal(r.body_len, 0);
    resp_fini(&r);
    kp_http_destroy(h);
}

struct bad_case {
    const char *req;
    int status;
};

static void test_bad_requests(void **state)
{
    const struct bad_case cases[] = {
        { "GET /nope HTTP/1.1\r\n\r\n", 404 },
        { "GET /healthzz HTTP/1.1\r\n\r\n", 404 },
        { "GET / HTTP/1.1\r\n\r\n", 404 },
        { "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405 },
        { "HEAD /healthz HTTP/1.1\r\n\r\n", 405 },
        { "DELETE /readyz HTTP/1.0\r\n\r\n", 405 },
        { "GET /healthz\r\n\r\n", 400 },
        { "GET healthz HTTP/1.1\r\n\r\n", 400 },
        { "GET /healthz SPDY/3\r\n\r\n", 400 },
        { "GET  /healthz HTTP/1.1\r\n\r\n", 400 },
        { "\r\n\r\n", 400 },
        { "garbage\n\n", 400 },
        /* Bare LF line ends are accepted. */
        { "GET /healthz HTTP/1.0\n\n", 200 },
    };
    struct fixture *f = fixture_start(NULL);
    struct kp_http_stats st;
    struct resp r;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        request(f->port, cases[i].req, strlen(cases[i].req), &r);
        if (r.status != cases[i].status) {
            fail_msg("case %zu: want %d, got %d", i, cases[i].status, r.status);
        }
        if (r.status == 405) {
            assert_non_null(strstr(r.head, "\r\nAllow: GET"));
        }
        resp_fini(&r);
    }
    kp_http_get_stats(f->http, &st);
    assert_int_equal(st.requests, sizeof(cases) / sizeof(cases[0]));
    assert_int_equal(st.bad_requests, sizeof(cases) / sizeof(cases[0]) - 1);
    fixture_stop(f);
}

static void test_oversized(void **state)
{
    struct fixture *f = fixture_start(NULL);
    struct kp_http_stats st;
    struct kp_strbuf req;
    struct resp r;

    /* Headers that never end within the limit. */
    kp_strbuf_init(&req, 0);
    assert_int_equal(kp_strbuf_append_str(&req, "GET /metrics HTTP/1.1\r\n"), 0);
    while (req.len < KP_HTTP_MAX_REQUEST_BYTES + 2000) {
        assert_int_equal(kp_strbuf_append_str(&req, "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"),
                         0);
    }
    request(f->port, req.data, req.len, &r);
    assert_int_equal(r.status, 431);
    resp_fini(&r);

    /* One byte under the limit is still served. */
    kp_strbuf_reset(&req);
    assert_int_equal(kp_strbuf_append_str(&req, "GET /healthz HTTP/1.1\r\nX-Pad: "), 0);
    while (req.len < KP_HTTP_MAX_REQUEST_BYTES - 5) {
        assert_int_equal(kp_strbuf_putc(&req, 'p'), 0);
    }
    assert_int_equal(kp_strbuf_append_str(&req, "\r\n\r\n"), 0);
    assert_int_equal(req.len, KP_HTTP_MAX_REQUEST_BYTES - 1);
    request(f->port, req.data, req.len, &r);
    assert_int_equal(r.status, 200);
    resp_fini(&r);

    kp_http_get_stats(f->http, &st);
    assert_int_equal(st.oversized, 1);
    kp_strbuf_fini(&req);
    fixture_stop(f);
}

/* A client that connects and sends nothing neither blocks others nor stays forever. */
static void test_idle_client(void **state)
{
    struct kp_http_limits lim = { .timeout_ms = 1000 };
    struct fixture *f = fixture_start(&lim);
    struct pollfd pfd;
    struct kp_http_stats st;
    struct kp_strbuf got;
    struct resp r;
    long long t0;
    int idle, partial;

    t0 = kp_mono_ms();
    idle = connect_to(f->port);
    partial = connect_to(f->port);
    send_all(partial, "GET /healthz HTTP/1.1\r\nHost:", 29);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(get(f->port, "/healthz", &r), 200);
        resp_fini(&r);
    }
    /* Served while the idle connections were open, and before they timed out. */
    pfd = (struct pollfd){ .fd = idle, .events = POLLIN };
    if (kp_mono_ms() - t0 < 900) {
        assert_int_equal(poll(&pfd, 1, 0), 0);
    }
    /* Then the server answers 408 and closes them. */
    kp_strbuf_init(&got, 0);
    read_to_eof(idle, &got);
    assert_true(kp_mono_ms() - t0 >= 900);
    assert_non_null(got.data);
    assert_non_null(strstr(got.data, "HTTP/1.1 408 "));
    kp_strbuf_reset(&got);
    read_to_eof(partial, &got);
    assert_non_null(strstr(got.data, "HTTP/1.1 408 "));
    kp_strbuf_fini(&got);
    close(idle);
    close(partial);

    kp_http_get_stats(f->http, &st);
    assert_int_equal(st.timeouts, 2);
    assert_int_equal(st.requests, 20);
    fixture_stop(f);
}

/* Connections that never send a full request do not hold the slots: when max_conns are
 * open, the oldest of them is answered 408 and closed, and the new request is served. */
static void test_connection_cap(void **state)
{
    struct kp_http_limits lim = { .max_conns = 2, .timeout_ms = 10000 };
    struct fixture *f = fixture_start(&lim);
    struct kp_http_stats st;
    struct kp_strbuf got;
    struct resp r;
    int a, b;

    a = connect_to(f->port);
    b = connect_to(f->port);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(get(f->port, "/healthz", &r), 200);
        resp_fini(&r);
    }
    /* a was evicted by then (the oldest), well before its 10 s timeout. */
    kp_strbuf_init(&got, 0);
    read_to_eof(a, &got);
    assert_non_null(got.data);
    assert_non_null(strstr(got.data, "HTTP/1.1 408 "));
    kp_strbuf_fini(&got);
    kp_http_get_stats(f->http, &st);
    assert_int_equal(st.rejected_conns, 0);
    assert_int_equal(st.requests, 20);
    assert_true(st.timeouts >= 1);
    close(a);
    close(b);
    fixture_stop(f);
}

/* More slow clients than the limit (the default 16): some send nothing, some half a request
 * line. /healthz still answers 200 every time, long before their timeout would free a slot. */
static void test_slow_clients(void **state)
{
    struct kp_http_limits lim = { .timeout_ms = 30000 };
    struct fixture *f = fixture_start(&lim);
    int slow[KP_HTTP_DEFAULT_MAX_CONNS + 8];
    int n = (int) (sizeof(slow) / sizeof(slow[0]));
    struct resp r;
    long long t0 = kp_mono_ms();

    for (int i = 0; i < n; i++) {
        slow[i] = connect_to(f->port);
        if (i % 2 == 1) {
            send_all(slow[i], "GET /hea", 8);
        }
    }
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 10; i++) {
            assert_int_equal(get(f->port, "/healthz", &r), 200);
            resp_fini(&r);
        }
        /* More slow clients arrive between the probes. */
        for (int i = 0; i < n; i += 3) {
            close(slow[i]);
            slow[i] = connect_to(f->port);
        }
    }
    /* Only detects waiting for the 30 s timeout, not speed. */
    assert_true(kp_mono_ms() - t0 < 20000);
    for (int i = 0; i < n; i++) {
        close(slow[i]);
    }
    fixture_stop(f);
}

/* Clients that send their request and never read the answer hold every shared slot (their
 * /metrics answers are bigger than the socket buffers). /healthz and /readyz still answer on
 * the probe slots, right away; another /metrics is refused 503 until a slot frees. */
static void test_slow_readers(void **state)
{
    struct kp_http_limits lim = { .timeout_ms = 30000 };
    struct fixture *f = fixture_start(&lim);
    int slow[KP_HTTP_DEFAULT_MAX_CONNS];
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    struct kp_http_stats st;
    struct resp r;
    long long t0;
    int rcvbuf = 4096;

    atomic_store(&f->app.metrics_pad, (size_t) 8 << 20);
    for (int i = 0; i < KP_HTTP_DEFAULT_MAX_CONNS; i++) {
        slow[i] = connect_to(f->port);
        setsockopt(slow[i], SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
        send_all(slow[i], req, strlen(req));
    }
    /* Every shared slot is writing: wait until the server has taken all 16 requests. */
    t0 = kp_mono_ms();
    do {
        kp_http_get_stats(f->http, &st);
    } while (st.requests < KP_HTTP_DEFAULT_MAX_CONNS && kp_mono_ms() - t0 < IO_TIMEOUT_MS);
    assert_int_equal(st.requests, KP_HTTP_DEFAULT_MAX_CONNS);
    t0 = kp_mono_ms();
    for (int i = 0; i < 20; i++) {
        assert_int_equal(get(f->port, i % 2 ? "/healthz" : "/readyz", &r), 200);
        resp_fini(&r);
    }
    assert_true(kp_mono_ms() - t0 < 5000); /* not waiting for the 30 s timeout */
    assert_int_equal(get(f->port, "/metrics", &r), 503);
    resp_fini(&r);
    for (int i = 0; i < KP_HTTP_DEFAULT_MAX_CONNS; i++) {
        close(slow[i]);
    }
    fixture_stop(f);
}

/* With a metrics token, /metrics answers 401 and asks for a bearer token unless the request
 * carries the right one; /healthz and /readyz stay open. */
static void test_metrics_token(void **state)
{
    struct kp_http_limits lim = { .metrics_token = "s3cret-token" };
    struct fixture *f = fixture_start(&lim);
    const char *bad[] = {
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret-tokeN\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret-token2\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nAuthorization: Basic s3cret-token\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nAuthorization: Bearer \r\n\r\n",
    };
    const char *good[] = {
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n\r\n",
        "GET /metrics?x=1 HTTP/1.0\r\nauthorization:   bearer s3cret-token  \r\n\r\n",
    };
    struct kp_http_stats st;
    struct resp r;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        request(f->port, bad[i], strlen(bad[i]), &r);
        assert_int_equal(r.status, 401);
        assert_non_null(strstr(r.head, "\r\nWWW-Authenticate: Bearer"));
        assert_null(strstr(r.body, "kprof_test_scrapes_total"));
        resp_fini(&r);
    }
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        request(f->port, good[i], strlen(good[i]), &r);
        assert_int_equal(r.status, 200);
        assert_non_null(strstr(r.body, "kprof_test_scrapes_total"));
        resp_fini(&r);
    }
    assert_int_equal(get(f->port, "/healthz", &r), 200);
    resp_fini(&r);
    assert_int_equal(get(f->port, "/readyz", &r), 200);
    resp_fini(&r);
    kp_http_get_stats(f->http, &st);
    assert_int_equal(st.unauthorized, sizeof(bad) / sizeof(bad[0]));
    fixture_stop(f);
}

/* The process is out of descriptors (EMFILE): the server gives back its spare one to accept
 * a probe, which gets its answer, and serves as before once descriptors are free. */
static void test_out_of_fds(void **state)
{
    struct fixture *f = fixture_start(NULL);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t) f->port) };
    const char *req = "GET /healthz HTTP/1.1\r\n\r\n";
    struct rlimit old, low;
    struct resp r;
    int probe, n = 0, fds[4096];

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* made before the limit is hit */
    assert_true(probe >= 0);
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t) probe + 64;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    while (n < (int) (sizeof(fds) / sizeof(fds[0])) && (fds[n] = dup(0)) >= 0) {
        n++;
    }
    assert_int_equal(errno, EMFILE);
    assert_int_equal(connect(probe, (struct sockaddr *) &sa, sizeof(sa)), 0);
    memset(&r, 0, sizeof(r));
    kp_strbuf_init(&r.raw, 0);
    send_all(probe, req, strlen(req));
    read_to_eof(probe, &r.raw);
    close(probe);
    parse_resp(&r);
    assert_int_equal(r.status, 200);
    resp_fini(&r);
    while (n > 0) {
        close(fds[--n]);
    }
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(get(f->port, "/healthz", &r), 200);
        resp_fini(&r);
    }
    fixture_stop(f);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    assert_non_null(d);
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

/* Many requests, then destroy with a client still connected: no descriptor leaks. */
static void test_no_fd_leak(void **state)
{
    struct fixture *f;
    struct resp r;
    int before, idle;

    before = count_fds();
    f = fixture_start(NULL);
    for (int i = 0; i < 300; i++) {
        assert_int_equal(get(f->port, i % 2 ? "/metrics" : "/nope", &r), i % 2 ? 200 : 404);
        resp_fini(&r);
    }
    idle = connect_to(f->port);
    fixture_stop(f);
    close(idle);
    assert_int_equal(count_fds(), before);
}

static void test_create_errors(void **state)
{
    const char *bad[] = { "nonsense",     "127.0.0.1", "127.0.0.1:", "127.0.0.1:70000",
                          "127.0.0.1:-1", "::1:80",    "[::1]80",    "127.0.0.1:http" };
    struct kp_http *h = NULL, *h2 = NULL;
    char err[256], addr[64];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(kp_http_create(bad[i], NULL, NULL, &h, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, bad[i]));
        assert_null(h);
    }
    assert_int_equal(kp_http_create("127.0.0.1:0", NULL, NULL, &h, err, sizeof(err)), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", kp_http_port(h));
    assert_int_equal(kp_http_create(addr, NULL, NULL, &h2, err, sizeof(err)), -EADDRINUSE);
    assert_non_null(strstr(err, addr));
    assert_null(h2);
    kp_http_destroy(h);
    kp_http_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthz),        cmocka_unit_test(test_readyz),
        cmocka_unit_test(test_metrics),        cmocka_unit_test(test_metrics_over_cap),
        cmocka_unit_test(test_null_handlers),  cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_oversized),      cmocka_unit_test(test_idle_client),
        cmocka_unit_test(test_connection_cap), cmocka_unit_test(test_slow_clients),
        cmocka_unit_test(test_no_fd_leak),     cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_slow_readers),   cmocka_unit_test(test_metrics_token),
        cmocka_unit_test(test_out_of_fds),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
