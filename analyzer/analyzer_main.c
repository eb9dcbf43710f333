/* kprof-analyzer: parses the configuration, serves the Analyzer service until SIGTERM or
 * SIGINT (service.h). */
#define KP_LOG_MODULE "analyzer"
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "kp_config.h"
#include "kp_log.h"
#include "service.h"

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

#define OFF(f) offsetof(struct kp_analyzer_config, f)
static const struct kp_config_def analyzer_config[] = {
    { "listen", KP_CONFIG_STRING, KP_ANALYZER_DEFAULT_LISTEN, 0, 0, OFF(listen),
      "gRPC address (Analyzer): host:port, [v6]:port or unix:/path; port 0 picks one", NULL,
      false },
    { "http-listen", KP_CONFIG_STRING, "127.0.0.1:7073", 0, 0, OFF(http_listen),
      "address of /healthz, /readyz and /metrics; empty disables", NULL, false },
    { "pg-conninfo", KP_CONFIG_STRING, "dbname=kprof", 0, 0, OFF(pg_conninfo),
      "libpq connection string of the kprof database", NULL, true },
    { "tls-cert", KP_CONFIG_STRING, "", 0, 0, OFF(tls_cert),
      "PEM certificate chain: serve gRPC over TLS (with --tls-key)", NULL, false },
    { "tls-key", KP_CONFIG_STRING, "", 0, 0, OFF(tls_key), "PEM private key of --tls-cert", NULL,
      true },
    { "log-level", KP_CONFIG_ENUM, "info", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
    { "ready-file", KP_CONFIG_STRING, "", 0, 0, OFF(ready_file),
      "file to write the bound addresses to (grpc=..., http=...) once serving", NULL, false },
    { "workers", KP_CONFIG_INT, "2", 1, 64, OFF(workers),
      "analysis threads, each with its own PostgreSQL connection", NULL, false },
    { "queue-max", KP_CONFIG_INT, "64", 1, 65536, OFF(queue_max),
      "requests waiting for a worker; more get RESOURCE_EXHAUSTED", NULL, false },
    { "cache-bytes", KP_CONFIG_SIZE, "256MiB", 0, 1LL << 40, OFF(cache_bytes),
      "results kept in memory, least recently used evicted first; 0 disables the cache", NULL,
      false },
    { "max-rows", KP_CONFIG_INT, "50000000", 0, 1LL << 40, OFF(max_rows),
      "refuse a rank with more rows than this (RESOURCE_EXHAUSTED); 0: no limit", NULL, false },
    { "shutdown-grace", KP_CONFIG_DURATION, "10s", 0, 600000, OFF(shutdown_grace_ms),
      "on SIGTERM, how long analyses in progress get to finish", NULL, false },
};
#undef OFF

int main(int argc, char **argv)
{
    struct kp_analyzer_config cfg;
    struct kp_analyzer *a = NULL;
    size_t n = sizeof(analyzer_config) / sizeof(analyzer_config[0]);
    char err[1024];
    sigset_t set;
    int exit_rc, sig, rc;

    memset(&cfg, 0, sizeof(cfg));
    if ((exit_rc = kp_config_main(analyzer_config, n, &cfg, "kprof-analyzer", argc, argv)) >= 0) {
        return exit_rc;
    }
    kp_log_set_level((enum kp_log_level) cfg.log_level);
    /* Signals are taken synchronously by this thread; every other thread inherits the mask. */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    rc = kp_analyzer_create(&cfg, &a, err, sizeof(err));
    if (rc != 0) {
        kp_log_error("cannot start: %s", err);
        kp_config_fini(analyzer_config, n, &cfg);
        return 1;
    }
    sigwait(&set, &sig);
    kp_log_info("stopping signal=%s", sig == SIGTERM ? "TERM" : "INT");
    kp_analyzer_destroy(a);
    kp_config_fini(analyzer_config, n, &cfg);
    kp_log_info("stopped");
    return 0;
}
