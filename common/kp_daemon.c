#include "kp_daemon.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kp_auth.h"
#include "kp_config.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_log.h"
#include "kp_ready.h"
#include "kp_secret.h"

const char *const kp_daemon_log_levels[] = { "error", "warn", "info", "debug", NULL };

struct kp_daemon_sigwatch {
    const char *module;
    kp_daemon_stop_cb *stop;
    void *ud;
    pthread_t thread;
    pthread_mutex_t mu;
    bool done; /* the loop ended on its own: a signal now only ends the thread */
};

static void stop_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
}

void kp_daemon_signals_block(void)
{
    sigset_t set;

    /* Signals are taken synchronously by one thread; every other thread inherits the mask. */
    stop_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void kp_daemon_raise_nofile(const char *module)
{
    struct rlimit rl;
    rlim_t was;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) {
        return;
    }
    was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        kp_log_write(KP_LOG_WARN, module, "cannot raise the open-file limit from %llu to %llu: %s",
                     (unsigned long long) was, (unsigned long long) rl.rlim_max, strerror(errno));
        return;
    }
    kp_log_write(KP_LOG_INFO, module, "open-file limit raised from %llu to %llu",
                 (unsigned long long) was, (unsigned long long) rl.rlim_max);
}

int kp_daemon_signals_wait(const char *module)
{
    sigset_t set;
    int sig = 0;

    stop_set(&set);
    sigwait(&set, &sig);
    kp_log_write(KP_LOG_INFO, module, "stopping signal=%s", sig == SIGTERM ? "TERM" : "INT");
    kp_daemon_notify("STOPPING=1");
    return sig;
}

int kp_daemon_main(const char *module, const char *prog, const struct kp_config_def *defs, size_t n,
                   void *cfg, kp_daemon_create_cb *create, kp_daemon_destroy_cb *destroy, int argc,
                   char **argv)
{
    const struct kp_daemon_config *base = cfg;
    char err[1024] = "";
    void *obj = NULL;
    int rc;

    if ((rc = kp_config_main(defs, n, cfg, prog, argc, argv)) >= 0) {
        return rc;
    }
    kp_log_set_level((enum kp_log_level) base->log_level);
    kp_daemon_signals_block();
    kp_daemon_raise_nofile(module);
    if (create(cfg, &obj, err, sizeof(err)) != 0) {
        kp_log_write(KP_LOG_ERROR, module, "cannot start: %s", err);
        kp_config_fini(defs, n, cfg);
        return 1;
    }
    kp_daemon_signals_wait(module);
    destroy(obj);
    kp_config_fini(defs, n, cfg);
    kp_log_write(KP_LOG_INFO, module, "stopped");
    return 0;
}

static void *sigwatch_main(void *arg)
{
    struct kp_daemon_sigwatch *w = arg;
    sigset_t set;
    int sig = 0;
    bool done;

    stop_set(&set);
    sigwait(&set, &sig);
    pthread_mutex_lock(&w->mu);
    done = w->done;
    pthread_mutex_unlock(&w->mu);
    if (!done) {
        kp_log_write(KP_LOG_INFO, w->module, "stopping signal=%s", sig == SIGTERM ? "TERM" : "INT");
        kp_daemon_notify("STOPPING=1");
        w->stop(w->ud);
    }
    return NULL;
}

int kp_daemon_sigwatch_create(const char *module, kp_daemon_stop_cb *stop, void *ud,
                              struct kp_daemon_sigwatch **out)
{
    struct kp_daemon_sigwatch *w = calloc(1, sizeof(*w));

    if (w == NULL) {
        return -ENOMEM;
    }
    w->module = module;
    w->stop = stop;
    w->ud = ud;
    pthread_mutex_init(&w->mu, NULL);
    if (pthread_create(&w->thread, NULL, sigwatch_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return -EAGAIN;
    }
    *out = w;
    return 0;
}

void kp_daemon_sigwatch_destroy(struct kp_daemon_sigwatch *w)
{
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_mutex_unlock(&w->mu);
    pthread_kill(w->thread, SIGTERM); /* if the loop ended on its own, end the thread too */
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int kp_daemon_http_start(const char *listen, const char *metrics_token_file,
                         const struct kp_http_handlers *h, void *ud, struct kp_http **out,
                         char *errbuf, size_t errlen)
{
    struct kp_http_limits lim = { 0 };
    char token[KP_DAEMON_METRICS_TOKEN_MAX];
    long n;
    int rc;

    *out = NULL;
    if (listen == NULL || listen[0] == '\0') {
        return 0;
    }
    if (metrics_token_file != NULL && metrics_token_file[0] != '\0') {
        n = kp_secret_file_line(metrics_token_file, "the metrics token file", true, token,
                                sizeof(token), errbuf, errlen);
        if (n < 0) {
            return (int) n;
        }
        lim.metrics_token = token;
    }
    rc = kp_http_create_with_limits(listen, h, &lim, ud, out, errbuf, errlen);
    explicit_bzero(token, sizeof(token));
    return rc;
}

int kp_daemon_ready_write(const char *ready_file, const struct kp_ready_entry *e, size_t n,
                          const struct kp_http *http, char *errbuf, size_t errlen)
{
    char addr[32];
    struct kp_ready_entry all[KP_DAEMON_READY_MAX + 1];
    size_t k = 0;
    int rc;

    for (size_t i = 0; i < n && i < KP_DAEMON_READY_MAX; i++) {
        all[k++] = e[i];
    }
    if (http != NULL) {
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", kp_http_port(http));
        all[k++] = (struct kp_ready_entry){ "http", addr };
    }
    if ((rc = kp_ready_file_write(ready_file, all, k, errbuf, errlen)) != 0) {
        return rc;
    }
    if ((rc = kp_daemon_notify("READY=1\nSTATUS=serving")) != 0) {
        kp_log_write(KP_LOG_WARN, "daemon",
                     "cannot tell systemd the daemon is ready (NOTIFY_SOCKET) err=\"%s\"",
                     strerror(-rc));
    }
    return 0;
}

int kp_daemon_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    size_t len;
    int fd, rc = 0;

    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path)) {
        return -EINVAL;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@') {
        sa.sun_path[0] = '\0'; /* abstract namespace */
    }
    if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) {
        return -errno;
    }
    if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (const struct sockaddr *) &sa,
               (socklen_t) (offsetof(struct sockaddr_un, sun_path) + len)) < 0) {
        rc = -errno;
    }
    close(fd);
    return rc;
}

bool kp_daemon_listen_is_local(const char *listen)
{
    static const char *const local[] = { "unix:",      "unix-abstract:", "127.",       "[::1]:",
                                         "localhost:", "ipv4:127.",      "ipv6:[::1]:" };

    if (listen == NULL) {
        return false;
    }
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++) {
        if (strncmp(listen, local[i], strlen(local[i])) == 0) {
            return true;
        }
    }
    return false;
}

int kp_daemon_security(const struct kp_daemon_config *cfg, struct kp_auth **auth, char *errbuf,
                       size_t errlen)
{
    bool tls = cfg->tls_cert != NULL && cfg->tls_cert[0] != '\0';
    bool tokens = cfg->token_file != NULL && cfg->token_file[0] != '\0';
    bool certs = cfg->tls_client_ca != NULL && cfg->tls_client_ca[0] != '\0';
    bool local = kp_daemon_listen_is_local(cfg->listen);

    *auth = NULL;
    if (tls && cfg->plaintext) {
        snprintf(errbuf, errlen, "--plaintext and --tls-cert contradict each other: drop one");
        return KP_ECONFIG;
    }
    if (tls && (cfg->tls_key == NULL || cfg->tls_key[0] == '\0')) {
        snprintf(errbuf, errlen, "--tls-cert needs --tls-key (the certificate's private key)");
        return KP_ECONFIG;
    }
    if (!tls && !cfg->plaintext) {
        snprintf(errbuf, errlen,
                 "no TLS: give --tls-cert and --tls-key (kprof-stack makes a CA and certificates "
                 "for a local stack), or --plaintext to serve without TLS on a loopback address");
        return KP_ECONFIG;
    }
    if (!tls && !local) {
        snprintf(errbuf, errlen,
                 "--plaintext is refused on %s: plaintext is served only on a loopback address or "
                 "a unix socket; give --tls-cert and --tls-key",
                 cfg->listen);
        return KP_ECONFIG;
    }
    if (certs && !tls) {
        snprintf(errbuf, errlen, "--tls-client-ca needs TLS: give --tls-cert and --tls-key");
        return KP_ECONFIG;
    }
    if (cfg->allow_anonymous) {
        if (tokens || certs) {
            snprintf(errbuf, errlen,
                     "--allow-anonymous with --auth-tokens or --tls-client-ca: drop one (with a "
                     "credential configured, every caller must bring one)");
            return KP_ECONFIG;
        }
        if (!local) {
            snprintf(errbuf, errlen,
                     "--allow-anonymous is refused on %s: it is allowed only on a loopback address "
                     "or a unix socket; give --auth-tokens or --tls-client-ca",
                     cfg->listen);
            return KP_ECONFIG;
        }
        kp_log_write(KP_LOG_WARN, "auth",
                     "serving %s without authentication (--allow-anonymous): every local user "
                     "may call every method",
                     cfg->listen);
        return 0;
    }
    if (!tokens && !certs) {
        snprintf(errbuf, errlen,
                 "no authentication: give --auth-tokens (bearer tokens) or --tls-client-ca (client "
                 "certificates), or --allow-anonymous on a loopback address");
        return KP_ECONFIG;
    }
    return kp_auth_create(cfg->token_file, certs, auth, errbuf, errlen);
}
