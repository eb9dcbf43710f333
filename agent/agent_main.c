/*
 * kprof-agent: `kprof-agent [daemon flags]` runs the node daemon until SIGTERM or SIGINT;
 * `kprof-agent capture ...` and `kprof-agent ps ...` are clients of its local socket (ctl.h).
 * Client exit codes: 0 ok, 1 failed, 2 usage, 3 not found, 4 busy, 5 agent unreachable.
 */
#define KP_LOG_MODULE "agent"
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent.h"
#include "ctl.h"
#include "kp_config.h"
#include "kp_daemon.h"
#include "kp_json.h"
#include "kp_log.h"
#include "kp_str.h"
#include "kp_strbuf.h"
#include "kp_wire.h"

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

#define OFF(f) offsetof(struct kp_agent_config, f)
static const struct kp_config_def agent_config[] = {
    { "socket", KP_CONFIG_STRING, KP_WIRE_DEFAULT_SOCKET, 1, 107, OFF(socket),
      "Unix socket the injection library and the local clients connect to", NULL, false },
    { "socket-mode", KP_CONFIG_STRING, "0660", 1, 8, OFF(socket_mode),
      "permissions of the socket file (octal)", NULL, false },
    { "allow-uid", KP_CONFIG_STRING, "", 0, 1000, OFF(allow_uid),
      "comma list of uids or user names allowed to connect (the agent's own uid and root "
      "always are)",
      NULL, false },
    { "collector", KP_CONFIG_STRING, "127.0.0.1:7070", 1, 512, OFF(collector),
      "kprof-collectord gRPC address, host:port", NULL, false },
    { "tls-ca", KP_CONFIG_STRING, "", 0, 0, OFF(tls_ca),
      "PEM of the CA that signed collectord's certificate; empty: plaintext", NULL, false },
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
    { "ready-file", KP_CONFIG_STRING, "", 0, 0, OFF(ready_file),
      "file to write \"socket=<path>\" to once listening", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "info", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
    { "host", KP_CONFIG_STRING, "", 0, 255, OFF(host), "this node's name; empty: gethostname()",
      NULL, false },
    { "attach", KP_CONFIG_BOOL, "true", 0, 0, OFF(attach),
      "attach to collectord (Control.Attach): report the registered processes and obey "
      "kprofctl's capture commands",
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

/* --- clients --- */

static void usage(FILE *f)
{
    fprintf(f, "usage: kprof-agent [daemon flags]      (kprof-agent --help lists them)\n"
               "       kprof-agent capture [--socket S] [--job J] [--ranks all|0,2-3] [--run R]\n"
               "                           [--start-step N] [--steps N | --duration 5s]\n"
               "                           [--activities kernel,memcpy,...] [--name X] [--wait] "
               "[--json]\n"
               "       kprof-agent ps [--socket S] [--json]\n");
}

/* Sends the request and receives the reply text (malloc'd into *text). Returns the reply
 * status, or KP_CTL_UNREACHABLE / KP_CTL_FAILED with a message on stderr. */
static int ctl_call(const char *sock, const char *req, char **text)
{
    struct sockaddr_un sa;
    static uint8_t buf[KP_WIRE_MAX_MSG + 1];
    struct kp_wire_hdr h;
    size_t n = strlen(req);
    ssize_t got;
    int fd;

    *text = NULL;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    kp_strlcpy(sa.sun_path, sizeof(sa.sun_path), sock);
    if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) < 0 ||
        connect(fd, (struct sockaddr *) &sa, sizeof(sa)) != 0) {
        fprintf(stderr, "kprof-agent: is kprof-agent running? socket %s: %s\n", sock,
                strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return KP_CTL_UNREACHABLE;
    }
    kp_wire_hdr_init(&h, KP_W_CTL_REQUEST, (uint32_t) n, 0);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), req, n);
    if (send(fd, buf, sizeof(h) + n, MSG_NOSIGNAL) < 0) {
        fprintf(stderr, "kprof-agent: is kprof-agent running? socket %s: %s\n", sock,
                strerror(errno));
        close(fd);
        return KP_CTL_UNREACHABLE;
    }
    do {
        got = recv(fd, buf, KP_WIRE_MAX_MSG, 0);
    } while (got < 0 && errno == EINTR);
    close(fd);
    if (got <= 0 || kp_wire_check(buf, (size_t) got, NULL) != 0) {
        fprintf(stderr,
                "kprof-agent: the agent on %s closed the connection without an answer%s%s\n", sock,
                got < 0 ? ": " : "", got < 0 ? strerror(errno) : "");
        return KP_CTL_UNREACHABLE;
    }
    memcpy(&h, buf, sizeof(h));
    if (h.type == KP_W_WELCOME) {
        struct kp_wire_welcome w;

        memcpy(&w, buf + sizeof(h), sizeof(w));
        w.reason[sizeof(w.reason) - 1] = '\0';
        fprintf(stderr, "kprof-agent: refused by the agent: %s\n", w.reason);
        return KP_CTL_FAILED;
    }
    if (h.type != KP_W_CTL_REPLY) {
        fprintf(stderr, "kprof-agent: unexpected answer type %u from %s\n", h.type, sock);
        return KP_CTL_FAILED;
    }
    struct kp_wire_ctl_reply r;
    memcpy(&r, buf + sizeof(h), sizeof(r));
    size_t tl = h.len - sizeof(r);
    if ((*text = malloc(tl + 1)) == NULL) {
        return KP_CTL_FAILED;
    }
    memcpy(*text, buf + sizeof(h) + sizeof(r), tl);
    (*text)[tl] = '\0';
    return r.status;
}

static bool is_number(const char *s, size_t n)
{
    size_t i = s[0] == '-' ? 1 : 0;

    if (n == i || n > 19) {
        return false;
    }
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
    }
    return true;
}

/* Writes "k=v" items separated by sep ('\n' or ' ') as one JSON object. */
static void json_object(FILE *f, const char *text, char sep)
{
    const char *p = text;
    bool first = true;

    fputc('{', f);
    while (*p != '\0') {
        const char *end = strchr(p, sep), *eq;
        size_t len = end != NULL ? (size_t) (end - p) : strlen(p);

        eq = memchr(p, '=', len);
        if (eq != NULL) {
            size_t vl = len - (size_t) (eq - p) - 1;

            fprintf(f, "%s", first ? "" : ",");
            kp_json_fput(f, p, (size_t) (eq - p));
            fputc(':', f);
            if (is_number(eq + 1, vl)) {
                fwrite(eq + 1, 1, vl, f);
            }
            else {
                kp_json_fput(f, eq + 1, vl);
            }
            first = false;
        }
        p += len;
        if (*p == sep) {
            p++;
        }
    }
    fputc('}', f);
}

/* Prints an error reply ("error=...") to stderr. */
static void print_error(const char *verb, const char *text)
{
    const char *e = strstr(text, "error=");

    fprintf(stderr, "kprof-agent %s: %s", verb, e != NULL ? e + 6 : text);
    if (text[0] == '\0' || text[strlen(text) - 1] != '\n') {
        fputc('\n', stderr);
    }
}

static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);

    if (strncmp(argv[*i], name, n) == 0 && argv[*i][n] == '=') {
        return argv[*i] + n + 1;
    }
    if (strcmp(argv[*i], name) == 0 && *i + 1 < argc) {
        return argv[++*i];
    }
    return NULL;
}

static int run_client(int argc, char **argv)
{
    const char *verb = argv[1], *sock = getenv("KPROF_AGENT_SOCKET");
    struct kp_strbuf req;
    bool json = false, is_capture = strcmp(verb, "capture") == 0;
    char *text = NULL;
    int st;

    if (sock == NULL || *sock == '\0') {
        sock = KP_WIRE_DEFAULT_SOCKET;
    }
    kp_strbuf_init(&req, KP_WIRE_MAX_MSG - 64);
    kp_strbuf_appendf(&req, "verb=%s\n", verb);
    for (int i = 2; i < argc; i++) {
        const char *v;
        static const struct {
            const char *flag, *key;
        } map[] = { { "--job", "job" },     { "--ranks", "ranks" },
                    { "--run", "run" },     { "--start-step", "start_step" },
                    { "--steps", "steps" }, { "--activities", "activities" },
                    { "--name", "name" } };
        bool done = false;

        if (strcmp(argv[i], "--json") == 0) {
            json = true;
            continue;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            kp_strbuf_fini(&req);
            return 0;
        }
        if ((v = flag_value(argc, argv, &i, "--socket")) != NULL) {
            sock = v;
            continue;
        }
        if (is_capture && strcmp(argv[i], "--wait") == 0) {
            kp_strbuf_appendf(&req, "wait=1\n");
            continue;
        }
        if (is_capture && (v = flag_value(argc, argv, &i, "--duration")) != NULL) {
            long long ms;

            if (kp_parse_duration_ms(v, &ms) != 0 || ms <= 0) {
                fprintf(stderr, "kprof-agent capture: --duration %s: not a duration (e.g. 5s)\n",
                        v);
                kp_strbuf_fini(&req);
                return KP_CTL_USAGE;
            }
            kp_strbuf_appendf(&req, "duration_ms=%lld\n", ms);
            continue;
        }
        for (size_t k = 0; is_capture && k < sizeof(map) / sizeof(map[0]); k++) {
            if ((v = flag_value(argc, argv, &i, map[k].flag)) != NULL) {
                if (strchr(v, '\n') != NULL) {
                    break;
                }
                kp_strbuf_appendf(&req, "%s=%s\n", map[k].key, v);
                done = true;
                break;
            }
        }
        if (!done) {
            fprintf(stderr, "kprof-agent %s: unknown or incomplete flag %s\n", verb, argv[i]);
            usage(stderr);
            kp_strbuf_fini(&req);
            return KP_CTL_USAGE;
        }
    }
    st = ctl_call(sock, req.data, &text);
    kp_strbuf_fini(&req);
    if (text == NULL) {
        return st;
    }
    if (st != KP_CTL_OK && strncmp(text, "error=", 6) == 0) {
        print_error(verb, text);
        free(text);
        return st;
    }
    if (!is_capture) {
        if (json) {
            const char *p = text;
            bool first = true;

            fputc('[', stdout);
            while (*p != '\0') {
                const char *end = strchr(p, '\n');
                size_t len = end ? (size_t) (end - p) : strlen(p);
                char *line = strndup(p, len);

                if (line != NULL && len > 0) {
                    fputs(first ? "" : ",", stdout);
                    json_object(stdout, line, ' ');
                    first = false;
                }
                free(line);
                p += len + (end != NULL);
            }
            fputs("]\n", stdout);
        }
        else {
            printf("%-8s %-20s %5s %5s %5s %6s %-9s %8s %10s %8s\n", "PID", "JOB", "RANK", "LOCAL",
                   "WORLD", "DEVICE", "STATE", "STEP", "RECORDS", "DROPPED");
            for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL;
                 line = strtok_r(NULL, "\n", &save)) {
                char pid[32] = "", job[257] = "", rank[16] = "", lr[16] = "", world[16] = "",
                     dev[16] = "", state[32] = "", step[32] = "", rec[32] = "", drop[32] = "";

                sscanf(line,
                       "pid=%31s job=%256s rank=%15s local_rank=%15s world=%15s device=%15s "
                       "state=%31s step=%31s records=%31s dropped=%31s",
                       pid, job, rank, lr, world, dev, state, step, rec, drop);
                printf("%-8s %-20s %5s %5s %5s %6s %-9s %8s %10s %8s\n", pid, job, rank, lr, world,
                       dev, state, step, rec, drop);
            }
        }
    }
    else if (json) {
        json_object(stdout, text, '\n');
        fputc('\n', stdout);
    }
    else {
        fputs(text, stdout);
    }
    if (st != KP_CTL_OK) {
        fprintf(stderr, "kprof-agent %s: failed (see the rank lines above)\n", verb);
    }
    free(text);
    return st;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "capture") == 0 || strcmp(argv[1], "ps") == 0)) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        return run_client(argc, argv);
    }
    if (argc >= 2 && argv[1][0] != '-') {
        fprintf(stderr, "kprof-agent: unknown command %s\n", argv[1]);
        usage(stderr);
        return KP_CTL_USAGE;
    }
    return run_daemon(argc, argv);
}
