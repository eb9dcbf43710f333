#define _GNU_SOURCE /* accept4 */
#include "kp_http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define KP_LOG_MODULE "http"
#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_strbuf.h"

#define HTTP_DRAIN_MS 1000 /* lingering close: wait this long for the peer's FIN */
#define HTTP_DRAIN_MAX_BYTES                                                              \
    (64 << 10)                   /* ... and read at most this much of what it still sends \
                                  */
#define HTTP_ACCEPT_PAUSE_MS 100 /* after EMFILE and friends */
#define HTTP_HEADER_MAX      512 /* our response headers */
/* Slots past max_conns kept for /healthz and /readyz: a probe is served there when every
 * shared slot is sending or draining a response (clients that do not read theirs). */
#define HTTP_PROBE_CONNS 4

enum conn_state {
    CONN_FREE,
    CONN_READ,  /* receiving the request */
    CONN_WRITE, /* sending the response from out */
    CONN_DRAIN, /* response sent and write side shut; reading until the peer closes */
};

struct conn {
    int fd;
    bool probe; /* one of the HTTP_PROBE_CONNS slots: /healthz and /readyz only, no drain */
    enum conn_state state;
    long long deadline_ms; /* CLOCK_MONOTONIC ms at which the current state times out */
    size_t in_len;
    size_t drained;
    size_t out_off;
    struct kp_strbuf out; /* the whole response */
    char in[KP_HTTP_MAX_REQUEST_BYTES];
};

struct kp_http {
    int listen_fd;
    int wake_fd[2]; /* destroy writes to [1]; the thread stops when [0] turns readable */
    int port;
    bool thread_started;
    pthread_t thread;
    struct kp_http_handlers h;
    void *ud;
    int max_conns;
    int n_slots; /* max_conns + HTTP_PROBE_CONNS */
    int timeout_ms;
    size_t max_response_bytes;
    char *metrics_token; /* NULL: /metrics is open */
    /* Server thread only: */
    struct conn *conns;    /* n_slots slots, the probe ones last */
    struct pollfd *pfds;   /* 2 + n_slots */
    int spare_fd;          /* closed to accept one connection when out of descriptors */
    int *pfd_conn;         /* pfds index -> conns index */
    struct kp_strbuf body; /* scratch for response bodies */
    long long accept_paused_until_ms;
    struct kp_complain reject_complain;
    struct kp_complain accept_complain;
    struct kp_complain metrics_complain;
    /* Any thread: */
    _Atomic uint64_t n_requests;
    _Atomic uint64_t n_rejected;
    _Atomic uint64_t n_timeouts;
    _Atomic uint64_t n_oversized;
    _Atomic uint64_t n_bad;
    _Atomic uint64_t n_unauthorized;
};

static void count(_Atomic uint64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static const char *status_text(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    default:
        return "Unknown";
    }
}

/* Formats a whole response into buf (headers only; the body follows). Returns its length. */
static size_t format_head(char *buf, size_t len, int status, const char *ctype, size_t body_len,
                          const char *extra)
{
    int n;

    n = snprintf(buf, len,
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: "
                 "close\r\n\r\n",
                 status, status_text(status), ctype, body_len, extra);
    return n < 0 ? 0 : ((size_t) n >= len ? len - 1 : (size_t) n);
}

/* Answers a connection we will not serve (over the cap, or timed out) with one non-blocking
 * send, then closes it. Reading what the peer already sent before close() makes the kernel
 * send FIN rather than RST, which would discard the answer at the client. */
static void reject_fd(int fd, int status)
{
    char buf[HTTP_HEADER_MAX];
    size_t n;
    const char *body = status == 503 ? "too many connections\n" : "request timeout\n";

    n = format_head(buf, sizeof(buf), status, "text/plain; charset=utf-8", strlen(body), "");
    if (n + strlen(body) < sizeof(buf)) {
        memcpy(buf + n, body, strlen(body));
        n += strlen(body);
    }
    (void) !send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++) {
    }
    close(fd);
}

static void conn_close(struct conn *c)
{
    if (c->fd >= 0) {
        close(c->fd);
    }
    kp_strbuf_fini(&c->out);
    c->fd = -1;
    c->state = CONN_FREE;
}

/* Sends what is left of the response; on completion shuts the write side and starts the
 * lingering close. */
static void conn_write(struct kp_http *s, struct conn *c, long long now)
{
    ssize_t r;

    while (c->out_off < c->out.len) {
        r = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off,
                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                conn_close(c); /* the peer went away; nothing to tell anyone */
            }
            return;
        }
        c->out_off += (size_t) r;
    }
    kp_strbuf_fini(&c->out);
    if (c->probe) {
        /* The probe sent its request whole; a lingering close would hold the slot. */
        conn_close(c);
        return;
    }
    shutdown(c->fd, SHUT_WR);
    c->state = CONN_DRAIN;
    c->drained = 0;
    c->deadline_ms = now + (s->timeout_ms < HTTP_DRAIN_MS ? s->timeout_ms : HTTP_DRAIN_MS);
}

static void respond(struct kp_http *s, struct conn *c, long long now, int status, const char *ctype,
                    const char *extra, const char *body, size_t body_len)
{
    char head[HTTP_HEADER_MAX];
    size_t n;

    count(&s->n_requests);
    if (status == 400 || status == 404 || status == 405) {
        count(&s->n_bad);
    }
    n = format_head(head, sizeof(head), status, ctype, body_len, extra);
    kp_strbuf_init(&c->out, s->max_response_bytes + HTTP_HEADER_MAX);
    if (kp_strbuf_append(&c->out, head, n) != 0 || kp_strbuf_append(&c->out, body, body_len) != 0) {
        kp_complain(&s->metrics_complain, KP_LOG_WARN, KP_LOG_MODULE,
                    "response dropped: out of memory status=%d bytes=%zu", status, body_len);
        conn_close(c);
        return;
    }
    c->state = CONN_WRITE;
    c->out_off = 0;
    c->deadline_ms = now + s->timeout_ms;
    conn_write(s, c, now);
}

static void respond_text(struct kp_http *s, struct conn *c, long long now, int status,
                         const char *body)
{
    respond(s, c, now, status, "text/plain; charset=utf-8", "", body, strlen(body));
}

static void serve_metrics(struct kp_http *s, struct conn *c, long long now)
{
    int rc = 0;

    kp_strbuf_reset(&s->body);
    if (s->h.metrics != NULL) {
        rc = s->h.metrics(s->ud, &s->body);
    }
    if (rc != 0) {
        kp_complain(&s->metrics_complain, KP_LOG_WARN, KP_LOG_MODULE,
                    "metrics failed: err=%d (%s) max_bytes=%zu", rc, kp_strerror(rc),
                    s->max_response_bytes);
        respond_text(s, c, now, 500, "metrics unavailable\n");
        return;
    }
    respond(s, c, now, 200, "text/plain; version=0.0.4; charset=utf-8", "",
            s->body.data != NULL ? s->body.data : "", s->body.len);
}

/* Whether the headers in [p, end) carry "Authorization: Bearer <s->metrics_token>". The
 * comparison takes the same time whatever the token's first wrong byte. */
static bool bearer_ok(const struct kp_http *s, const char *p, const char *end)
{
    static const char name[] = "authorization:";
    size_t want = strlen(s->metrics_token);

    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t) (end - p));
        const char *line_end = eol != NULL ? eol : end;
        size_t n = (size_t) (line_end - p);

        if (n > 0 && p[n - 1] == '\r') {
            n--;
        }
        if (n > sizeof(name) - 1 && strncasecmp(p, name, sizeof(name) - 1) == 0) {
            const char *v = p + sizeof(name) - 1, *ve = p + n;
            unsigned diff = 0;

            while (v < ve && (*v == ' ' || *v == '\t')) {
                v++;
            }
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) {
                ve--;
            }
            if (ve - v < 7 || strncasecmp(v, "bearer ", 7) != 0) {
                return false;
            }
            v += 7;
            while (v < ve && *v == ' ') {
                v++;
            }
            if ((size_t) (ve - v) != want) {
                return false;
            }
            for (size_t i = 0; i < want; i++) {
                diff |= (unsigned) (unsigned char) (v[i] ^ s->metrics_token[i]);
            }
            return diff == 0;
        }
        p = line_end + 1;
    }
    return false;
}

/* Parses the request line in c->in (complete headers are there) and answers it. */
static void serve(struct kp_http *s, struct conn *c, long long now)
{
    char *line = c->in, *eol, *sp1, *sp2, *q;
    char why[256];
    size_t path_len;

    eol = memchr(line, '\n', c->in_len);
    if (eol == NULL) {
        respond_text(s, c, now, 400, "bad request\n");
        return;
    }
    *eol = '\0';
    if (eol > line && eol[-1] == '\r') {
        eol[-1] = '\0';
    }
    sp1 = strchr(line, ' ');
    sp2 = sp1 != NULL ? strchr(sp1 + 1, ' ') : NULL;
    if (sp1 == NULL || sp2 == NULL || sp1 == line || sp1[1] != '/' ||
        strncmp(sp2 + 1, "HTTP/1.", 7) != 0 || strchr(sp2 + 1, ' ') != NULL) {
        respond_text(s, c, now, 400, "bad request\n");
        return;
    }
    *sp1 = '\0';
    *sp2 = '\0';
    if (strcmp(line, "GET") != 0) {
        respond(s, c, now, 405, "text/plain; charset=utf-8", "Allow: GET\r\n",
                "method not allowed\n", strlen("method not allowed\n"));
        return;
    }
    q = strchr(sp1 + 1, '?');
    path_len = q != NULL ? (size_t) (q - (sp1 + 1)) : strlen(sp1 + 1);
    if (c->probe && !(path_len == 8 && memcmp(sp1 + 1, "/healthz", 8) == 0) &&
        !(path_len == 7 && memcmp(sp1 + 1, "/readyz", 7) == 0)) {
        count(&s->n_rejected);
        respond_text(s, c, now, 503, "too many connections\n");
        return;
    }
    if (path_len == 8 && memcmp(sp1 + 1, "/healthz", 8) == 0) {
        if (s->h.healthz == NULL || s->h.healthz(s->ud)) {
            respond_text(s, c, now, 200, "ok\n");
        }
        else {
            respond_text(s, c, now, 503, "unhealthy\n");
        }
    }
    else if (path_len == 7 && memcmp(sp1 + 1, "/readyz", 7) == 0) {
        why[0] = '\0';
        if (s->h.readyz == NULL || s->h.readyz(s->ud, why, sizeof(why) - 1)) {
            respond_text(s, c, now, 200, "ok\n");
        }
        else {
            why[sizeof(why) - 1] = '\0';
            if (why[0] == '\0') {
                strcpy(why, "not ready");
            }
            why[strcspn(why, "\r\n")] = '\0';
            strcat(why, "\n");
            respond_text(s, c, now, 503, why);
        }
    }
    else if (path_len == 8 && memcmp(sp1 + 1, "/metrics", 8) == 0) {
        if (s->metrics_token != NULL && !bearer_ok(s, eol + 1, c->in + c->in_len)) {
            count(&s->n_unauthorized);
            respond(s, c, now, 401, "text/plain; charset=utf-8",
                    "WWW-Authenticate: Bearer realm=\"kprof-metrics\"\r\n",
                    "a bearer token is required for /metrics\n",
                    strlen("a bearer token is required for /metrics\n"));
            return;
        }
        serve_metrics(s, c, now);
    }
    else {
        respond_text(s, c, now, 404, "not found\n");
    }
}

/* True when buf[0..len) holds the blank line that ends the headers; from is where the
 * previous read ended, so each byte is looked at a bounded number of times. */
static bool headers_done(const char *buf, size_t len, size_t from)
{
    size_t i = from > 3 ? from - 3 : 0;

    for (; i < len; i++) {
        if (buf[i] != '\n') {
            continue;
        }
        /* "\n\n" or "\n\r\n" (which covers "\r\n\r\n") */
        if ((i >= 1 && buf[i - 1] == '\n') ||
            (i >= 2 && buf[i - 1] == '\r' && buf[i - 2] == '\n')) {
            return true;
        }
    }
    return false;
}

static void conn_read(struct kp_http *s, struct conn *c, long long now)
{
    char sink[4096];
    ssize_t r;
    size_t before;

    if (c->state == CONN_DRAIN) {
        r = recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
            conn_close(c);
        }
        else if (r > 0) {
            c->drained += (size_t) r;
            if (c->drained > HTTP_DRAIN_MAX_BYTES) {
                conn_close(c);
            }
        }
        return;
    }
    r = recv(c->fd, c->in + c->in_len, sizeof(c->in) - c->in_len, MSG_DONTWAIT);
    if (r < 0) {
        if (errno != EAGAIN && errno != EINTR) {
            conn_close(c);
        }
        return;
    }
    if (r == 0) {
        conn_close(c); /* closed before a whole request; no one to answer */
        return;
    }
    before = c->in_len;
    c->in_len += (size_t) r;
    if (headers_done(c->in, c->in_len, before)) {
        serve(s, c, now);
    }
    else if (c->in_len == sizeof(c->in)) {
        count(&s->n_oversized);
        respond_text(s, c, now, 431, "request too large\n");
    }
}

/* The slot of the connection that has waited longest for its request (the earliest read
 * deadline), or -1 when every connection is writing or draining a response. */
static int oldest_incomplete(const struct kp_http *s, int from, int to)
{
    int best = -1;

    for (int i = from; i < to; i++) {
        if (s->conns[i].state == CONN_READ &&
            (best < 0 || s->conns[i].deadline_ms < s->conns[best].deadline_ms)) {
            best = i;
        }
    }
    return best;
}

static void accept_all(struct kp_http *s, long long now)
{
    struct conn *c;
    int fd, i;

    for (;;) {
        fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && s->spare_fd >= 0) {
            /* Out of descriptors: give the spare back so that a probe still learns that the
             * daemon is alive and why it is not ready (it is opened again once free). */
            close(s->spare_fd);
            s->spare_fd = -1;
            fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        }
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                /* EMFILE, ENFILE, ENOBUFS, ENOMEM: the pending connection stays queued and
                 * the listen socket readable, so pause rather than spin. */
                kp_complain(&s->accept_complain, KP_LOG_WARN, KP_LOG_MODULE,
                            "accept failed: err=%s pause_ms=%d", strerror(errno),
                            HTTP_ACCEPT_PAUSE_MS);
                s->accept_paused_until_ms = now + HTTP_ACCEPT_PAUSE_MS;
            }
            return;
        }
        for (i = 0; i < s->max_conns && s->conns[i].state != CONN_FREE; i++) {
        }
        if (i == s->max_conns) {
            i = oldest_incomplete(s, 0, s->max_conns);
        }
        if (i < 0) {
            /* Every shared slot is sending or draining a response: the probe slots. */
            for (i = s->max_conns; i < s->n_slots && s->conns[i].state != CONN_FREE; i++) {
            }
            if (i == s->n_slots) {
                i = oldest_incomplete(s, s->max_conns, s->n_slots);
            }
        }
        if (i >= 0 && s->conns[i].state == CONN_READ) {
            /* Slow clients must not hold every slot: a probe sends its whole request at once,
             * so it is never the oldest incomplete one and /healthz keeps answering. */
            count(&s->n_timeouts);
            kp_complain(&s->reject_complain, KP_LOG_WARN, KP_LOG_MODULE,
                        "closed the oldest incomplete request: max_conns=%d open", s->max_conns);
            reject_fd(s->conns[i].fd, 408);
            s->conns[i].fd = -1;
            conn_close(&s->conns[i]);
        }
        if (i < 0) {
            count(&s->n_rejected);
            kp_complain(&s->reject_complain, KP_LOG_WARN, KP_LOG_MODULE,
                        "connection rejected: max_conns=%d open", s->max_conns);
            reject_fd(fd, 503);
            continue;
        }
        c = &s->conns[i];
        c->fd = fd;
        c->state = CONN_READ;
        c->in_len = 0;
        c->deadline_ms = now + s->timeout_ms;
    }
}

static void expire(struct kp_http *s, long long now)
{
    struct conn *c;

    for (int i = 0; i < s->n_slots; i++) {
        c = &s->conns[i];
        if (c->state == CONN_FREE || now < c->deadline_ms) {
            continue;
        }
        if (c->state == CONN_READ) {
            count(&s->n_timeouts);
            reject_fd(c->fd, 408);
            c->fd = -1;
            conn_close(c);
            continue;
        }
        if (c->state == CONN_WRITE) {
            count(&s->n_timeouts);
        }
        conn_close(c);
    }
}

static void *http_main(void *arg)
{
    struct kp_http *s = arg;
    struct conn *c;
    long long now, wait_ms;
    int n, nfds, listen_idx;

    for (;;) {
        if (s->spare_fd < 0) {
            s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
        now = kp_mono_ms();
        wait_ms = -1;
        nfds = 0;
        s->pfds[nfds++] = (struct pollfd){ .fd = s->wake_fd[0], .events = POLLIN };
        listen_idx = -1;
        if (now >= s->accept_paused_until_ms) {
            listen_idx = nfds;
            s->pfds[nfds++] = (struct pollfd){ .fd = s->listen_fd, .events = POLLIN };
        }
        else {
            wait_ms = s->accept_paused_until_ms - now;
        }
        for (int i = 0; i < s->n_slots; i++) {
            c = &s->conns[i];
            if (c->state == CONN_FREE) {
                continue;
            }
            s->pfd_conn[nfds] = i;
            s->pfds[nfds++] = (struct pollfd){
                .fd = c->fd,
                .events = c->state == CONN_WRITE ? POLLOUT : POLLIN,
            };
            if (wait_ms < 0 || c->deadline_ms - now < wait_ms) {
                wait_ms = c->deadline_ms > now ? c->deadline_ms - now : 0;
            }
        }
        n = poll(s->pfds, (nfds_t) nfds, (int) wait_ms);
        if (n < 0 && errno != EINTR) {
            kp_log_error("poll failed: err=%s; the HTTP server stops", strerror(errno));
            break;
        }
        if (n > 0 && s->pfds[0].revents != 0) {
            break; /* kp_http_destroy() */
        }
        now = kp_mono_ms();
        for (int k = 1; n > 0 && k < nfds; k++) {
            if (k == listen_idx || s->pfds[k].revents == 0) {
                continue;
            }
            c = &s->conns[s->pfd_conn[k]];
            if (c->state == CONN_WRITE) {
                conn_write(s, c, now);
            }
            else {
                conn_read(s, c, now);
            }
        }
        if (n > 0 && listen_idx >= 0 && s->pfds[listen_idx].revents != 0) {
            accept_all(s, now);
        }
        expire(s, kp_mono_ms());
    }
    return NULL;
}

/* Splits "host:port" or "[v6]:port" into host (NULL for all interfaces) and port. */
static int parse_listen(const char *addr, char *host, size_t hostlen, char *port, size_t portlen)
{
    const char *colon, *h = addr;
    size_t hl;
    char *end;
    long p;

    if (addr[0] == '[') {
        colon = strchr(addr, ']');
        if (colon == NULL || colon[1] != ':') {
            return -EINVAL;
        }
        h = addr + 1;
        hl = (size_t) (colon - h);
        colon++;
    }
    else {
        colon = strrchr(addr, ':');
        if (colon == NULL || memchr(addr, ':', (size_t) (colon - addr)) != NULL) {
            return -EINVAL;
        }
        hl = (size_t) (colon - addr);
    }
    if (hl >= hostlen || strlen(colon + 1) >= portlen || colon[1] == '\0') {
        return -EINVAL;
    }
    errno = 0;
    p = strtol(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || p < 0 || p > 65535 || colon[1] == '-' || colon[1] == '+') {
        return -EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    strcpy(port, colon + 1);
    return 0;
}

static int open_listener(struct kp_http *s, const char *addr, char *errbuf, size_t errlen)
{
    struct addrinfo hints = { 0 }, *res = NULL, *ai;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[256], port[8];
    int rc, fd = -1, one = 1;

    if (parse_listen(addr, host, sizeof(host), port, sizeof(port)) != 0) {
        kp_errbuf_set(errbuf, errlen, "listen address '%s': want host:port or [v6addr]:port", addr);
        rc = -EINVAL;
        goto out;
    }
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(host[0] != '\0' ? host : NULL, port, &hints, &res);
    if (rc != 0) {
        kp_errbuf_set(errbuf, errlen, "listen address '%s': %s", addr, gai_strerror(rc));
        rc = rc == EAI_SYSTEM ? -errno : -EINVAL;
        goto out;
    }
    rc = -EADDRNOTAVAIL;
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0) {
            break;
        }
        rc = -errno;
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        kp_errbuf_set(errbuf, errlen, "listen on '%s': %s", addr, strerror(-rc));
        goto out;
    }
    if (getsockname(fd, (struct sockaddr *) &ss, &sl) != 0) {
        rc = -errno;
        kp_errbuf_set(errbuf, errlen, "getsockname: %s", strerror(errno));
        close(fd);
        goto out;
    }
    s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *) &ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *) &ss)->sin_port);
    s->listen_fd = fd;
    rc = 0;
out:
    if (res != NULL) {
        freeaddrinfo(res);
    }
    return rc;
}

int kp_http_create_with_limits(const char *listen_addr, const struct kp_http_handlers *h,
                               const struct kp_http_limits *limits, void *ud, struct kp_http **out,
                               char *errbuf, size_t errlen)
{
    struct kp_http *s;
    sigset_t all, old;
    int rc;

    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    s->listen_fd = -1;
    s->spare_fd = -1;
    s->wake_fd[0] = s->wake_fd[1] = -1;
    if (h != NULL) {
        s->h = *h;
    }
    s->ud = ud;
    s->max_conns = KP_HTTP_DEFAULT_MAX_CONNS;
    s->timeout_ms = KP_HTTP_DEFAULT_TIMEOUT_MS;
    s->max_response_bytes = KP_HTTP_DEFAULT_MAX_RESPONSE_BYTES;
    if (limits != NULL && limits->max_conns > 0) {
        s->max_conns = limits->max_conns;
    }
    if (limits != NULL && limits->timeout_ms > 0) {
        s->timeout_ms = limits->timeout_ms;
    }
    if (limits != NULL && limits->max_response_bytes > 0) {
        s->max_response_bytes = limits->max_response_bytes;
    }
    s->n_slots = s->max_conns + HTTP_PROBE_CONNS;
    kp_strbuf_init(&s->body, s->max_response_bytes);
    s->conns = calloc((size_t) s->n_slots, sizeof(*s->conns));
    s->pfds = calloc((size_t) s->n_slots + 2, sizeof(*s->pfds));
    s->pfd_conn = calloc((size_t) s->n_slots + 2, sizeof(*s->pfd_conn));
    if (s->conns == NULL || s->pfds == NULL || s->pfd_conn == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < s->n_slots; i++) {
        s->conns[i].fd = -1;
        s->conns[i].probe = i >= s->max_conns;
    }
    if (limits != NULL && limits->metrics_token != NULL && limits->metrics_token[0] != '\0' &&
        (s->metrics_token = strdup(limits->metrics_token)) == NULL) {
        kp_errbuf_set(errbuf, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (pipe2(s->wake_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
        rc = -errno;
        kp_errbuf_set(errbuf, errlen, "pipe2: %s", strerror(errno));
        goto fail;
    }
    rc = open_listener(
        s, listen_addr != NULL && listen_addr[0] != '\0' ? listen_addr : KP_HTTP_DEFAULT_LISTEN,
        errbuf, errlen);
    if (rc != 0) {
        goto fail;
    }
    /* The daemon's signals go to its own threads, not this one. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = -pthread_create(&s->thread, NULL, http_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        kp_errbuf_set(errbuf, errlen, "pthread_create: %s", strerror(-rc));
        goto fail;
    }
    s->thread_started = true;
    *out = s;
    return 0;
fail:
    kp_http_destroy(s);
    return rc;
}

int kp_http_create(const char *listen_addr, const struct kp_http_handlers *h, void *ud,
                   struct kp_http **out, char *errbuf, size_t errlen)
{
    return kp_http_create_with_limits(listen_addr, h, NULL, ud, out, errbuf, errlen);
}

int kp_http_port(const struct kp_http *s)
{
    return s->port;
}

void kp_http_get_stats(const struct kp_http *s, struct kp_http_stats *out)
{
    out->requests = atomic_load_explicit(&s->n_requests, memory_order_relaxed);
    out->rejected_conns = atomic_load_explicit(&s->n_rejected, memory_order_relaxed);
    out->timeouts = atomic_load_explicit(&s->n_timeouts, memory_order_relaxed);
    out->oversized = atomic_load_explicit(&s->n_oversized, memory_order_relaxed);
    out->bad_requests = atomic_load_explicit(&s->n_bad, memory_order_relaxed);
    out->unauthorized = atomic_load_explicit(&s->n_unauthorized, memory_order_relaxed);
}

void kp_http_destroy(struct kp_http *s)
{
    if (s == NULL) {
        return;
    }
    if (s->thread_started) {
        while (write(s->wake_fd[1], "x", 1) < 0 && errno == EINTR) {
        }
        pthread_join(s->thread, NULL);
    }
    for (int i = 0; s->conns != NULL && i < s->n_slots; i++) {
        if (s->conns[i].state != CONN_FREE) {
            conn_close(&s->conns[i]);
        }
    }
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
    }
    if (s->spare_fd >= 0) {
        close(s->spare_fd);
    }
    if (s->metrics_token != NULL) {
        explicit_bzero(s->metrics_token, strlen(s->metrics_token));
        free(s->metrics_token);
    }
    for (int i = 0; i < 2; i++) {
        if (s->wake_fd[i] >= 0) {
            close(s->wake_fd[i]);
        }
    }
    kp_strbuf_fini(&s->body);
    free(s->pfd_conn);
    free(s->pfds);
    free(s->conns);
    free(s);
}
