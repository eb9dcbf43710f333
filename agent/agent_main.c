/*
 * kprof-agent: `kprof-agent [daemon flags]` runs the node daemon until SIGTERM or SIGINT.
 * Exit status: 0 stopped cleanly, 1 failed to start or the loop failed, 2 bad usage.
 * Captures are started and followed through collectord (kprofctl start, status, stop); the
 * agent has no commands of its own.
 */
#define KP_LOG_MODULE "agent"
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "kp_config.h"
#include "kp_daemon.h"
#include "kp_log.h"
#include "kp_wire.h"
#include "preflight.h"

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

#define OFF(f) offsetof(struct kp_agent_config, f)
static const struct kp_config_def agent_config[] = {
    { "socket", KP_CONFIG_STRING, KP_WIRE_DEFAULT_SOCKET, 1, 107, OFF(socket),
      "Unix socket the injection library connects to", NULL, false },
    { "socket-mode", KP_CONFIG_STRING, "0660", 1, 8, OFF(socket_mode),
      "permissions of the socket file (octal)", NULL, false },
    { "allow-uid", KP_CONFIG_STRING, "", 0, 1000, OFF(allow_uid),
      "comma list of uids or user names allowed to connect (the agent's own uid and root "
      "always are)",
      NULL, false },
    { "allow-group", KP_CONFIG_STRING, "", 0, 1000, OFF(allow_group),
      "comma list of gids or group names whose members (primary or supplementary group) are "
      "allowed to connect",
      NULL, false },
    { "collector", KP_CONFIG_STRING, "127.0.0.1:7070", 1, 512, OFF(collector),
      "kprof-collectord gRPC address, host:port", NULL, false },
    { "tls-ca", KP_CONFIG_STRING, "", 0, 0, OFF(tls_ca),
      "PEM of the CA that signed collectord's certificate; empty: plaintext", NULL, false },
    { "token-file", KP_CONFIG_STRING, "", 0, 0, OFF(token_file),
      "file (mode 0600 or 0640) whose first line is this agent's token: in collectord's token "
      "file as \"agent NAME TOKEN\", NAME this node (--host)",
      NULL, false },
    { "tls-cert", KP_CONFIG_STRING, "", 0, 0, OFF(tls_cert),
      "mutual TLS, instead of a token: PEM of this agent's certificate, its subjectAltName "
      "URI urn:kprof:agent:NAME with NAME this node (--host); needs --tls-key and --tls-ca",
      NULL, false },
    { "tls-key", KP_CONFIG_STRING, "", 0, 0, OFF(tls_key), "PEM of --tls-cert's private key", NULL,
      false },
    { "spool-dir", KP_CONFIG_STRING, "/var/lib/kprof/spool", 1, 3000, OFF(spool_dir),
      "directory of the on-disk queue of batches not yet acknowledged by collectord", NULL, false },
    { "spool-max-bytes", KP_CONFIG_SIZE, "1GiB", 1LL << 16, 1LL << 42, OFF(spool_max_bytes),
      "spool size limit; past it new batches are dropped and counted", NULL, false },
    { "batch-rows", KP_CONFIG_INT, "4000", 1, 1000000, OFF(batch_rows),
      "rows per batch sent to collectord", NULL, false },
    { "batch-ms", KP_CONFIG_DURATION, "200ms", 1, 60000, OFF(batch_ms),
      "longest time rows wait for a batch to fill", NULL, false },
    { "max-sessions", KP_CONFIG_INT, "1024", 1, 65536, OFF(max_sessions),
      "processes connected at once; more are refused", NULL, false },
    { "window-timeout", KP_CONFIG_DURATION, "0", 0, 86400000, OFF(window_timeout_ms),
      "a rank that began its capture window must end it within this, else it is failed "
      "(0: 60 s, or more for slow steps or long durations)",
      NULL, false },
    { "http-listen", KP_CONFIG_STRING, "", 0, 0, OFF(http_listen),
      "address of /healthz, /readyz and /metrics (e.g. 127.0.0.1:7072); empty disables", NULL,
      false },
    { "metrics-token-file", KP_CONFIG_STRING, "", 0, 0, OFF(metrics_token_file),
      "file whose first line is the bearer token /metrics requires (mode 0600); /healthz and "
      "/readyz stay open",
      NULL, false },
    { "ready-file", KP_CONFIG_STRING, "", 0, 0, OFF(ready_file),
      "file to write \"socket=<path>\" to once listening", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "info", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
    { "host", KP_CONFIG_STRING, "", 0, 255, OFF(host),
      "this node's name, and the agent's identity NAME for collectord (its token's or "
      "certificate's NAME); empty: gethostname()",
      NULL, false },
    { "attach", KP_CONFIG_BOOL, "true", 0, 0, OFF(attach),
      "attach to collectord (Control.Attach): report the registered processes and obey "
      "kprofctl's capture commands",
      NULL, false },
    { "nvidia-params", KP_CONFIG_STRING, KP_NVIDIA_PARAMS_PATH, 0, 4096, OFF(nvidia_params),
      "the NVIDIA driver's parameters file, read at start to warn when GPU performance counters "
      "are admin-only (RmProfilingAdminOnly); empty: not read",
      NULL, false },
};
#undef OFF

static void stop_agent(void *ud)
{
    kp_agent_stop(ud);
}

static int run_daemon(int argc, char **argv)
{
    struct kp_agent_config cfg;
    struct kp_agent *a = NULL;
    size_t n = sizeof(agent_config) / sizeof(agent_config[0]);
    char err[1024] = "";
    struct kp_daemon_sigwatch *sw = NULL;
    int exit_rc, rc;

    memset(&cfg, 0, sizeof(cfg));
    if ((exit_rc = kp_config_main(agent_config, n, &cfg, "kprof-agent", argc, argv)) >= 0) {
        return exit_rc;
    }
    kp_log_set_level((enum kp_log_level) cfg.log_level);
    kp_daemon_signals_block();
    kp_daemon_raise_nofile(KP_LOG_MODULE);
    if ((rc = kp_agent_create(&cfg, &a, err, sizeof(err))) != 0) {
        kp_log_error("cannot start: %s", err);
        kp_config_fini(agent_config, n, &cfg);
        return 1;
    }
    if (kp_daemon_sigwatch_create(KP_LOG_MODULE, stop_agent, a, &sw) != 0) {
        kp_log_error("cannot start the signal thread");
        kp_agent_destroy(a);
        kp_config_fini(agent_config, n, &cfg);
        return 1;
    }
    rc = kp_agent_run(a);
    kp_daemon_sigwatch_destroy(sw);
    kp_agent_destroy(a);
    kp_config_fini(agent_config, n, &cfg);
    kp_log_info("stopped");
    return rc == 0 ? 0 : 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kprof-agent [daemon flags]      (kprof-agent --help lists them)\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && argv[1][0] != '-') {
        if (strcmp(argv[1], "capture") == 0 || strcmp(argv[1], "ps") == 0) {
            fprintf(stderr,
                    "kprof-agent: there is no %s command: captures go through collectord "
                    "(kprofctl start --job J; kprofctl jobs lists the registered ranks)\n",
                    argv[1]);
        }
        else {
            fprintf(stderr, "kprof-agent: unknown command %s\n", argv[1]);
        }
        usage(stderr);
        return 2;
    }
    return run_daemon(argc, argv);
}
