/*
 * kprof-agent: the node daemon, composed of its modules (agent.h has the threads):
 *
 *   session.h  the local socket: the injected workers' connections and their messages
 *   capture.h  the capture state machine: arming ranks, windows, deadlines, batchers
 *   spool.h    the on-disk queue of encoded batches
 *   uplink.h   collectord: the spool pushed on Ingest.Push, and Control.Attach (the
 *              coordinator's capture commands in, the agent's reports out)
 *
 * This file owns the loop (epoll over the listening socket, every connection, a tick timer
 * and the wake-up eventfd), the HTTP endpoints and the lifecycle. Captures come only from
 * collectord's coordinator (kprofctl start / stop): the agent has no control plane of its own.
 */
#define _GNU_SOURCE
#define KP_LOG_MODULE "agent"
#include "agent.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "kp_clock.h"
#include "kp_daemon.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_log.h"
#include "kp_rpc.h"
#include "kp_str.h"
#include "kp_strbuf.h"
#include "metrics.h"
#include "preflight.h"
#include "session.h"
#include "spool.h"
#include "uplink.h"

#define KP_AGENT_TICK_MS 50

struct kp_agent {
    struct kp_agent_config cfg; /* borrowed strings */
    char host[256];
    uint64_t agent_id;
    int epfd, evfd, tfd;
    int lfd; /* the sessions' listening fd: its address tags its epoll events */
    struct kp_agent_metrics m;
    struct kp_spool *spool;
    struct kp_rpc_channel *ch;
    struct kp_rpc_channel_opts co; /* ch's, for the attach's channel to the coordinator */
    struct kp_sessions *sessions;
    struct kp_captures *captures;
    struct kp_uplink *uplink;
    struct kp_http *http;
    _Atomic bool stopping;
    _Atomic long long loop_ms;
};

static void on_tick(struct kp_agent *a)
{
    long long now = kp_mono_ms();
    struct kp_spool_stats ss;

    atomic_store(&a->loop_ms, now);
    kp_sessions_tick(a->sessions, now);
    kp_uplink_commands(a->uplink);
    kp_captures_tick(a->captures, now, kp_uplink_acked(a->uplink));
    kp_spool_get_stats(a->spool, &ss);
    kp_metric_set(a->m.spool_bytes, (int64_t) ss.bytes);
    kp_uplink_tick(a->uplink, now);
}

/* --- HTTP --- */

static bool h_healthz(void *ud)
{
    struct kp_agent *a = ud;

    return kp_mono_ms() - atomic_load(&a->loop_ms) < 10000;
}

static bool h_readyz(void *ud, char *why, size_t len)
{
    struct kp_agent *a = ud;
    struct kp_spool_stats ss;

    kp_spool_get_stats(a->spool, &ss);
    if (ss.bytes + (1u << 20) > (uint64_t) a->cfg.spool_max_bytes) {
        snprintf(why, len, "spool full (%" PRIu64 " bytes): collectord unreachable?", ss.bytes);
        return false;
    }
    return true;
}

static int h_metrics(void *ud, struct kp_strbuf *out)
{
    struct kp_agent *a = ud;

    return kp_metrics_render(a->m.reg, out);
}

/* --- lifecycle --- */

/* The loop's epoll, wake-up eventfd and tick timer. */
static int loop_fds(struct kp_agent *a, char *errbuf, size_t errlen)
{
    struct epoll_event ev;
    struct itimerspec its;

    if ((a->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        (a->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
        (a->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0) {
        int rc = -errno;

        snprintf(errbuf, errlen, "epoll/eventfd/timerfd: %s", strerror(-rc));
        return rc;
    }
    memset(&its, 0, sizeof(its));
    its.it_interval.tv_nsec = KP_AGENT_TICK_MS * 1000000L;
    its.it_value = its.it_interval;
    timerfd_settime(a->tfd, 0, &its, NULL);
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.ptr = &a->evfd;
    epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->evfd, &ev);
    ev.data.ptr = &a->tfd;
    epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->tfd, &ev);
    return 0;
}

/* The sessions (listening on the socket) and the capture set, each the other's partner:
 * the sessions are the captures' ops, and their processes belong to the set. */
static int local_side(struct kp_agent *a, char *errbuf, size_t errlen)
{
    const struct kp_agent_config *cfg = &a->cfg;
    struct kp_sessions_config sc = { .socket = cfg->socket,
                                     .socket_mode = cfg->socket_mode,
                                     .allow_uid = cfg->allow_uid,
                                     .allow_group = cfg->allow_group,
                                     .max_sessions = cfg->max_sessions,
                                     .agent_id = a->agent_id,
                                     .epfd = a->epfd,
                                     .metrics = &a->m };
    struct kp_captures_config cc;
    struct epoll_event ev;
    int rc;

    if ((rc = kp_sessions_create(&sc, &a->sessions, errbuf, errlen)) != 0) {
        return rc;
    }
    memset(&cc, 0, sizeof(cc));
    cc.ops = kp_sessions_capture_ops(a->sessions);
    cc.spool = a->spool;
    cc.metrics = &a->m;
    cc.host = a->host;
    cc.batch_rows = cfg->batch_rows;
    cc.batch_ms = cfg->batch_ms;
    cc.window_timeout_ms = cfg->window_timeout_ms;
    if ((rc = kp_captures_create(&cc, &a->captures)) != 0) {
        snprintf(errbuf, errlen, "out of memory");
        return rc;
    }
    kp_sessions_set_captures(a->sessions, a->captures);
    a->lfd = kp_sessions_listen_fd(a->sessions);
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.ptr = &a->lfd;
    epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->lfd, &ev);
    return 0;
}

int kp_agent_create(const struct kp_agent_config *cfg, struct kp_agent **out, char *errbuf,
                    size_t errlen)
{
    struct kp_agent *a = calloc(1, sizeof(*a));
    struct kp_rpc_channel_opts co = { 0 };
    struct kp_http_handlers hh = { h_healthz, h_readyz, h_metrics };
    struct kp_uplink_config uc;
    int rc;

    *out = NULL;
    if (a == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    a->cfg = *cfg;
    a->lfd = a->epfd = a->evfd = a->tfd = -1;
    atomic_store(&a->loop_ms, kp_mono_ms());
    if (cfg->host != NULL && cfg->host[0] != '\0') {
        kp_strlcpy(a->host, sizeof(a->host), cfg->host);
    }
    else if (gethostname(a->host, sizeof(a->host) - 1) != 0) {
        strcpy(a->host, "localhost");
    }
    kp_proc_clean_text(a->host);
    a->agent_id = ((uint64_t) time(NULL) << 20) ^ (uint64_t) getpid();
    if ((rc = kp_agent_metrics_init(&a->m)) != 0) {
        snprintf(errbuf, errlen, "cannot register metrics");
        goto fail;
    }
    kp_metric_set(a->m.profiling_admin_only,
                  cfg->nvidia_params != NULL && cfg->nvidia_params[0] != '\0'
                      ? kp_preflight_profiling_log(cfg->nvidia_params)
                      : -1);
    if ((rc = kp_spool_open(cfg->spool_dir, (uint64_t) cfg->spool_max_bytes, 0, &a->spool, errbuf,
                            errlen)) != 0) {
        goto fail;
    }
    co.tls_ca_file = cfg->tls_ca != NULL && cfg->tls_ca[0] != '\0' ? cfg->tls_ca : NULL;
    co.tls_cert_file = cfg->tls_cert != NULL && cfg->tls_cert[0] != '\0' ? cfg->tls_cert : NULL;
    co.tls_key_file = cfg->tls_key != NULL && cfg->tls_key[0] != '\0' ? cfg->tls_key : NULL;
    co.token_file = cfg->token_file;
    if ((co.tls_cert_file == NULL) != (co.tls_key_file == NULL)) {
        snprintf(errbuf, errlen,
                 "--tls-cert and --tls-key go together: give this agent's "
                 "certificate and its private key");
        rc = KP_ECONFIG;
        goto fail;
    }
    if ((rc = kp_rpc_channel_create(cfg->collector, &co, &a->ch, errbuf, errlen)) != 0 ||
        (rc = loop_fds(a, errbuf, errlen)) != 0 || (rc = local_side(a, errbuf, errlen)) != 0) {
        goto fail;
    }
    memset(&uc, 0, sizeof(uc));
    uc.ch = a->ch;
    uc.collector = cfg->collector;
    a->co = co; /* the strings are cfg's, which outlives the agent */
    uc.chopts = &a->co;
    uc.spool = a->spool;
    uc.sessions = a->sessions;
    uc.captures = a->captures;
    uc.metrics = &a->m;
    uc.attach = cfg->attach;
    uc.wake_fd = a->evfd;
    uc.host = a->host;
    uc.agent_id = a->agent_id;
    if ((rc = kp_uplink_create(&uc, &a->uplink, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = kp_daemon_http_start(cfg->http_listen, cfg->metrics_token_file, &hh, a, &a->http,
                                   errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = kp_daemon_ready_write(cfg->ready_file,
                                    &(struct kp_ready_entry){ "socket", cfg->socket }, 1, a->http,
                                    errbuf, errlen)) != 0) {
        goto fail;
    }
    kp_log_info("listening socket=%s collector=%s spool=%s stream=%" PRIu64
                " http_port=%d attach=%d agent_id=%" PRIu64,
                cfg->socket, cfg->collector, cfg->spool_dir, kp_spool_stream_id(a->spool),
                a->http != NULL ? kp_http_port(a->http) : 0, (int) cfg->attach, a->agent_id);
    *out = a;
    return 0;
fail:
    kp_agent_destroy(a);
    return rc;
}

int kp_agent_run(struct kp_agent *a)
{
    struct epoll_event evs[64];

    while (!atomic_load(&a->stopping)) {
        int n = epoll_wait(a->epfd, evs, 64, 1000);

        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            kp_log_error("epoll_wait failed err=\"%s\"", strerror(errno));
            return -errno;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            uint64_t v;

            if (p == &a->lfd) {
                kp_sessions_accept(a->sessions);
            }
            else if (p == &a->evfd) {
                if (read(a->evfd, &v, sizeof(v)) < 0) {
                    /* spurious */
                }
                kp_uplink_commands(a->uplink);
            }
            else if (p == &a->tfd) {
                if (read(a->tfd, &v, sizeof(v)) < 0) {
                    /* spurious */
                }
                on_tick(a);
            }
            else {
                kp_sessions_on_event(a->sessions, p);
            }
        }
    }
    return 0;
}

void kp_agent_stop(struct kp_agent *a)
{
    uint64_t one = 1;

    atomic_store(&a->stopping, true);
    if (write(a->evfd, &one, sizeof(one)) < 0) {
        /* the loop wakes on its tick anyway */
    }
}

void kp_agent_destroy(struct kp_agent *a)
{
    if (a == NULL) {
        return;
    }
    atomic_store(&a->stopping, true);
    kp_http_destroy(a->http);
    kp_uplink_destroy(a->uplink); /* before the eventfd its attach writes to is closed */
    kp_captures_destroy(a->captures);
    kp_sessions_destroy(a->sessions);
    if (a->epfd >= 0) {
        close(a->epfd);
    }
    if (a->evfd >= 0) {
        close(a->evfd);
    }
    if (a->tfd >= 0) {
        close(a->tfd);
    }
    kp_rpc_channel_destroy(a->ch);
    kp_spool_close(a->spool);
    kp_agent_metrics_fini(&a->m);
    free(a);
}
