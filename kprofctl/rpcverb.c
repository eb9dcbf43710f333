/*
 * kp_rpcverb: the verb framework, and the flags, call and table output shared by kprofctl's
 * verbs over collectord's Control and kprof-analyzer's Analyzer services (rpcverb.h).
 */
#include "rpcverb.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kp_clock.h"
#include "kp_coordinator.h"
#include "kp_daemon.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_str.h"
#include "kprofctl.h"

#define RPCVERB_MAX_ARGS 256
#define RPCVERB_FLAGBUF  4096
#define RPCVERB_PATH_MAX 128
/* How long a capture call waits out a change of the capture coordinator, and its retry pace. */
#define RPCVERB_FAILOVER_MS     10000
#define RPCVERB_FAILOVER_NAP_MS 250

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };

#define OFF(f) offsetof(struct kp_rpcverb_common, f)
/* Before the verb's own rows. */
static const struct kp_config_def head_defs[] = {
    { "collector", KP_CONFIG_STRING, "127.0.0.1:7070", 1, 0, OFF(collector),
      "kprof-collectord's gRPC address (host:port or unix:/path)", NULL, false },
    KP_RPCVERB_CRED_DEFS(struct kp_rpcverb_common, "collectord"),
};
/* After them; "columns" gets the verb's column list as its help. */
static const struct kp_config_def tail_defs[] = {
    { "json", KP_CONFIG_BOOL, "false", 0, 0, OFF(json), "print a JSON array of objects", NULL,
      false },
    { "csv", KP_CONFIG_BOOL, "false", 0, 0, OFF(csv), "print CSV with a header line", NULL, false },
    { "columns", KP_CONFIG_STRING, "", 0, 1024, OFF(columns), NULL, NULL, false },
    { "width", KP_CONFIG_INT, "0", 0, 100000, OFF(width),
      "-w: cut text cells wider than this many columns with \"…\" (0: no limit; text output)", NULL,
      false },
    { "timeout", KP_CONFIG_DURATION, "15s", 100, 3600000, OFF(timeout_ms),
      "give up on collectord after this long", NULL, false },
    { "log-level", KP_CONFIG_ENUM, "warn", 0, 0, OFF(log_level), "error, warn, info or debug",
      log_levels, false },
};
/* For analyzer verbs, in place of head_defs. */
static const struct kp_config_def analyzer_head_defs[] = {
    { "analyzer", KP_CONFIG_STRING, "127.0.0.1:7072", 1, 0, OFF(collector),
      "kprof-analyzer's gRPC address (host:port or unix:/path)", NULL, false },
    KP_RPCVERB_CRED_DEFS(struct kp_rpcverb_common, "kprof-analyzer"),
};
#undef OFF
#define N_HEAD (sizeof(head_defs) / sizeof(head_defs[0]))
_Static_assert(sizeof(head_defs) == sizeof(analyzer_head_defs), "one head for either server");
#define N_TAIL (sizeof(tail_defs) / sizeof(tail_defs[0]))

static void vreport(const struct kp_rpcverb *v, const char *suffix, const char *fmt, va_list ap)
{
    fprintf(stderr, "kprofctl %s: ", v->spec->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "%s\n", suffix);
}

void kp_rpcverb_error(const struct kp_rpcverb *v, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vreport(v, "", fmt, ap);
    va_end(ap);
}

int kp_rpcverb_usage_error(const struct kp_rpcverb *v, const char *fmt, ...)
{
    char suffix[128];
    va_list ap;

    snprintf(suffix, sizeof(suffix), " (see kprofctl %s --help)", v->spec->name);
    va_start(ap, fmt);
    vreport(v, suffix, fmt, ap);
    va_end(ap);
    return KPROFCTL_EXIT_USAGE;
}

/* Joins the common rows around the verb's into v->defs. Returns 0 or -E2BIG. */
static int build_defs(struct kp_rpcverb *v)
{
    const struct kp_rpcverb_spec *spec = v->spec;
    size_t used = 0;
    int n;

    if (N_HEAD + spec->n_defs + N_TAIL > KP_RPCVERB_MAX_DEFS) {
        return -E2BIG;
    }
    v->n_defs = 0;
    for (size_t i = 0; i < N_HEAD; i++) {
        v->defs[v->n_defs++] = spec->analyzer ? analyzer_head_defs[i] : head_defs[i];
    }
    for (size_t i = 0; i < spec->n_defs; i++) {
        v->defs[v->n_defs++] = spec->defs[i];
    }
    n = snprintf(v->columns_help, sizeof(v->columns_help),
                 "-c: comma-separated columns to show, in order (");
    used = n > 0 ? (size_t) n : 0;
    for (size_t i = 0; i < spec->n_cols && used < sizeof(v->columns_help); i++) {
        n = snprintf(v->columns_help + used, sizeof(v->columns_help) - used, "%s%s",
                     i > 0 ? ", " : "", spec->cols[i].name);
        used += n > 0 ? (size_t) n : 0;
    }
    if (used < sizeof(v->columns_help)) {
        snprintf(v->columns_help + used, sizeof(v->columns_help) - used, ")");
    }
    for (size_t i = 0; i < N_TAIL; i++) {
        v->defs[v->n_defs] = tail_defs[i];
        if (strcmp(tail_defs[i].name, "columns") == 0) {
            v->defs[v->n_defs].help =
                spec->columns_help != NULL ? spec->columns_help : v->columns_help;
        }
        if (strcmp(tail_defs[i].name, "json") == 0 && spec->json_help != NULL) {
            v->defs[v->n_defs].help = spec->json_help;
        }
        if (strcmp(tail_defs[i].name, "timeout") == 0 && spec->analyzer) {
            /* A first analysis of a large rank loads and sweeps every row. */
            v->defs[v->n_defs].def = "120s";
            v->defs[v->n_defs].help = "give up on kprof-analyzer after this long";
        }
        v->n_defs++;
    }
    return 0;
}

/* True if --help or -h is among the flags (kp_config then prints the usage). */
int kp_rpcverb_short_flags(int argc, char **argv, char **out, char *buf, size_t buflen)
{
    static char columns[] = "--columns", width[] = "--width";
    size_t used = 0;
    bool done = false;

    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *key = NULL;

        out[i] = argv[i];
        if (i == 0 || done) {
            continue;
        }
        if (strcmp(a, "--") == 0) {
            done = true;
            continue;
        }
        if (a[0] == '-' && (a[1] == 'c' || a[1] == 'w')) {
            key = a[1] == 'c' ? columns : width;
        }
        if (key == NULL) {
            continue;
        }
        if (a[2] == '\0') {
            out[i] = (char *) key;
        }
        else {
            const char *val = a[2] == '=' ? a + 3 : a + 2;
            int n = snprintf(buf + used, buflen - used, "%s=%s", key, val);

            if (n < 0 || (size_t) n >= buflen - used) {
                return -ENOSPC;
            }
            out[i] = buf + used;
            used += (size_t) n + 1;
        }
    }
    out[argc] = NULL;
    return 0;
}

static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            break;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            return true;
        }
    }
    return false;
}

static void print_exits(const struct kp_rpcverb_spec *spec, FILE *out)
{
    if (spec->analyzer) {
        fprintf(out,
                "\nExit status:\n"
                "  0    %s\n"
                "  1    failed: kprof-analyzer refused for another reason (e.g. the rank is over "
                "its row limit), or the output failed\n"
                "  2    usage: bad flags, or kprof-analyzer found the request invalid\n"
                "  3    not found: an unknown run or rank (NOT_FOUND)\n"
                "  5    kprof-analyzer unreachable, or its PostgreSQL (UNAVAILABLE, "
                "DEADLINE_EXCEEDED)\n"
                "  7    %s\n",
                spec->exit_ok != NULL ? spec->exit_ok : "ok", KPROFCTL_EXIT_REFUSED_HELP);
        return;
    }
    fprintf(out,
            "\nExit status:\n"
            "  0    %s\n"
            "  1    %s\n"
            "  2    usage: bad flags, or collectord found the request invalid (INVALID_ARGUMENT)\n"
            "  3    not found: an unknown job or run (NOT_FOUND)\n"
            "  4    busy: a selected rank is capturing already (ALREADY_EXISTS)\n"
            "  5    collectord unreachable, or its PostgreSQL (UNAVAILABLE, DEADLINE_EXCEEDED)\n"
            "  6    no agent: a selected rank has no kprof-agent attached, or is live on two hosts "
            "(FAILED_PRECONDITION)\n"
            "  7    %s\n",
            spec->exit_ok != NULL ? spec->exit_ok : "ok",
            spec->exit_failed != NULL
                ? spec->exit_failed
                : "failed: collectord refused for another reason, or the output failed",
            KPROFCTL_EXIT_REFUSED_HELP);
    if (spec->interruptible) {
        fprintf(out, "  130  interrupted (ctrl-c) while waiting\n");
    }
}

int kp_rpcverb_init(struct kp_rpcverb *v, const struct kp_rpcverb_spec *spec, void *cfg, int argc,
                    char **argv)
{
    struct kp_rpcverb_creds creds;
    struct kp_config_pos pos;
    struct kp_table *t = NULL;
    char *args[RPCVERB_MAX_ARGS];
    char *av[RPCVERB_MAX_ARGS + 1];
    char flagbuf[RPCVERB_FLAGBUF];
    char err[1024];
    bool help;
    int action, rc;

    memset(v, 0, sizeof(*v));
    v->spec = spec;
    v->cfg = cfg;
    v->common = cfg;
    if (build_defs(v) != 0) {
        kp_rpcverb_error(v, "too many flags in the verb's table");
        return KPROFCTL_EXIT_FAILED;
    }
    if (argc > RPCVERB_MAX_ARGS) {
        return kp_rpcverb_usage_error(v, "too many arguments");
    }
    if (kp_rpcverb_short_flags(argc, argv, av, flagbuf, sizeof(flagbuf)) != 0) {
        return kp_rpcverb_usage_error(v, "arguments too long");
    }
    help = wants_help(argc, av);
    if (help) {
        fputs(spec->synopsis, stdout);
        fputc('\n', stdout);
    }
    pos.args = args;
    pos.max = RPCVERB_MAX_ARGS;
    pos.n = 0;
    if (kp_config_load_args(v->defs, v->n_defs, cfg, "kprofctl", argc, av, &pos, err, sizeof(err),
                            &action) != 0) {
        return kp_rpcverb_usage_error(v, "%s", err);
    }
    if (action == KP_CONFIG_EXIT_OK) {
        if (help) {
            print_exits(spec, stdout);
        }
        return fflush(stdout) == 0 ? KPROFCTL_EXIT_OK : KPROFCTL_EXIT_FAILED;
    }
    kp_log_set_level((enum kp_log_level) v->common->log_level);
    if (pos.n > 0) {
        return kp_rpcverb_usage_error(v, "unexpected argument \"%s\"", args[0]);
    }
    if (v->common->json && v->common->csv) {
        kp_rpcverb_error(v, "--json and --csv exclude each other: pick one");
        return KPROFCTL_EXIT_USAGE;
    }
    v->format = v->common->json  ? KP_TABLE_FORMAT_JSON
                : v->common->csv ? KP_TABLE_FORMAT_CSV
                                 : KP_TABLE_FORMAT_TEXT;
    if ((rc = kp_table_create(spec->cols, spec->n_cols, &t)) != 0) {
        kp_rpcverb_error(v, "%s", kp_strerror(rc));
        return KPROFCTL_EXIT_FAILED;
    }
    /* A verb with its own -c help checks -c itself. */
    rc = spec->columns_help != NULL ? 0 : kp_table_select(t, v->common->columns, err, sizeof(err));
    kp_table_destroy(t);
    if (rc != 0) {
        kp_rpcverb_error(v, "-c %s: %s", v->common->columns, err);
        return KPROFCTL_EXIT_USAGE;
    }
    kp_rpcverb_creds_of(v->common, &creds);
    return kp_rpcverb_channel(spec->name, spec->analyzer ? "analyzer" : "collector",
                              v->common->collector, &creds, &v->ch) == 0
               ? KP_RPCVERB_RUN
               : KPROFCTL_EXIT_USAGE;
}

/* Sets req's field name (a plain scalar of type) to x. Returns 0, or -EINVAL when req has no
 * such field: a verb whose flags do not fit its request. */
static int set_field(ProtobufCMessage *req, const char *name, ProtobufCType type, long long x)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(req->descriptor, name);

    if (f == NULL || f->type != type || f->label != PROTOBUF_C_LABEL_NONE) {
        return -EINVAL;
    }
    if (type == PROTOBUF_C_TYPE_UINT64) {
        *(uint64_t *) (void *) ((char *) req + f->offset) = (uint64_t) x;
    }
    else {
        *(int32_t *) (void *) ((char *) req + f->offset) = (int32_t) x;
    }
    return 0;
}

/* The request: initialised, run_id and rank per the flags, then the verb's fields. Returns 0
 * and *out (free), or the exit status. */
static int build_request(struct kp_rpcverb *v, ProtobufCMessage **out)
{
    const struct kp_rpcverb_spec *spec = v->spec;
    const struct kp_rpcverb_common *c = v->common;
    ProtobufCMessage *req = malloc(spec->req_desc->sizeof_message);
    int rc = 0;

    *out = NULL;
    if (req == NULL) {
        kp_rpcverb_error(v, "out of memory");
        return KPROFCTL_EXIT_FAILED;
    }
    protobuf_c_message_init(spec->req_desc, req);
    if (spec->flags & KP_RPCVERB_F_RUN) {
        rc = set_field(req, "run_id", PROTOBUF_C_TYPE_UINT64, c->run);
        kp_rpcverb_set_subject(v, c->run, (spec->flags & KP_RPCVERB_F_RANK) ? c->rank : -1);
    }
    if (rc == 0 && (spec->flags & KP_RPCVERB_F_RANK)) {
        rc = set_field(req, "rank", PROTOBUF_C_TYPE_INT32, c->rank);
    }
    if (rc != 0) {
        kp_rpcverb_error(v, "%s has no run_id or rank to set", spec->req_desc->name);
        free(req);
        return KPROFCTL_EXIT_FAILED;
    }
    if (spec->request != NULL && (rc = spec->request(v, req)) != 0) {
        free(req);
        return rc;
    }
    *out = req;
    return 0;
}

/* After kp_rpcverb_init: the rest of kp_rpcverb_main. */
static int run_verb(struct kp_rpcverb *v)
{
    const struct kp_rpcverb_spec *spec = v->spec;
    ProtobufCMessage *req = NULL, *resp = NULL;
    struct kp_table *t = NULL;
    int rc;

    if ((spec->flags & KP_RPCVERB_F_RUN) && v->common->run == 0) {
        return kp_rpcverb_usage_error(v, "--run is required (kprofctl runs lists the runs)");
    }
    if (spec->check != NULL && (rc = spec->check(v)) != KP_RPCVERB_RUN) {
        return rc;
    }
    if (spec->rows != NULL && (rc = kp_rpcverb_table(v, &t)) != 0) {
        return rc;
    }
    if ((rc = build_request(v, &req)) != 0) {
        goto out;
    }
    if (spec->page != NULL) { /* a stream: the hook takes every message, then print */
        if ((rc = kp_rpcverb_stream(v, spec->method, req, spec->resp_desc, spec->page, v)) == 0) {
            rc = spec->print(v, t, NULL);
        }
        goto out;
    }
    if ((rc = kp_rpcverb_call(v, spec->method, req, spec->resp_desc, &resp)) != 0) {
        goto out;
    }
    if (spec->rows != NULL && (rc = spec->rows(v, t, resp)) != 0) {
        if (rc < 0) {
            kp_rpcverb_error(v, "%s", kp_strerror(rc));
            rc = KPROFCTL_EXIT_FAILED;
        }
        goto out;
    }
    rc = spec->print != NULL ? spec->print(v, t, resp) : kp_rpcverb_print(v, t, stdout);
out:
    if (resp != NULL) {
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    free(req);
    kp_table_destroy(t);
    return rc;
}

int kp_rpcverb_main(const struct kp_rpcverb_spec *spec, void *cfg, int argc, char **argv)
{
    struct kp_rpcverb v;
    int rc = kp_rpcverb_init(&v, spec, cfg, argc, argv);

    if (rc == KP_RPCVERB_RUN) {
        rc = run_verb(&v);
    }
    kp_rpcverb_fini(&v);
    return rc;
}

void kp_rpcverb_fini(struct kp_rpcverb *v)
{
    if (v == NULL || v->spec == NULL) {
        return;
    }
    kp_rpc_channel_destroy(v->ch);
    v->ch = NULL;
    kp_rpc_channel_destroy(v->origin);
    v->origin = NULL;
    if (v->cfg != NULL && v->n_defs > 0) {
        kp_config_fini(v->defs, v->n_defs, v->cfg);
    }
}

int kp_rpcverb_exit_code(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK:
        return KPROFCTL_EXIT_OK;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
        return KPROFCTL_EXIT_USAGE;
    case GRPC_STATUS_NOT_FOUND:
        return KPROFCTL_EXIT_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS:
        return KPROFCTL_EXIT_BUSY;
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        return KPROFCTL_EXIT_UNREACHABLE;
    case GRPC_STATUS_FAILED_PRECONDITION:
        return KPROFCTL_EXIT_NO_AGENT;
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
        return KPROFCTL_EXIT_REFUSED;
    default:
        return KPROFCTL_EXIT_FAILED;
    }
}

/* After "cannot reach" without --tls-ca: a daemon that serves TLS closes a plaintext call. */
#define TLS_HINT "; if it serves TLS, give --tls-ca or KPROF_TLS_CA"

static bool given(const char *s)
{
    return s != NULL && s[0] != '\0';
}

/* TLS_HINT when the server may have closed a plaintext call: no --tls-ca, and something
 * listened (a refused connection says nothing about TLS). */
static const char *tls_hint(const struct kp_rpcverb *v, const struct kp_rpc_status *st)
{
    return given(v->common->tls_ca) || strstr(st->details, "Connection refused") != NULL ? ""
                                                                                         : TLS_HINT;
}

void kp_rpcverb_creds_of(const struct kp_rpcverb_common *c, struct kp_rpcverb_creds *out)
{
    out->tls_ca = c->tls_ca;
    out->tls_cert = c->tls_cert;
    out->tls_key = c->tls_key;
    out->token_file = c->token_file;
}

int kp_rpcverb_channel(const char *verb, const char *flag, const char *target,
                       const struct kp_rpcverb_creds *creds, struct kp_rpc_channel **out)
{
    struct kp_rpc_channel_opts co;
    struct stat st;
    char err[1024];

    *out = NULL;
    if (given(creds->tls_cert) != given(creds->tls_key)) {
        fprintf(stderr,
                "kprofctl %s: --tls-cert and --tls-key go together: give the client "
                "certificate and its private key (see kprofctl %s --help)\n",
                verb, verb);
        return KPROFCTL_EXIT_USAGE;
    }
    if (given(creds->tls_cert) && !given(creds->tls_ca)) {
        fprintf(stderr,
                "kprofctl %s: --tls-cert needs --tls-ca (KPROF_TLS_CA): a client certificate "
                "is shown only over TLS, which needs the CA that signed the server's "
                "certificate\n",
                verb);
        return KPROFCTL_EXIT_USAGE;
    }
    /* A bearer token in clear text is anyone's who sees the traffic; loopback stays local. */
    if (given(creds->token_file) && !given(creds->tls_ca) && !kp_daemon_listen_is_local(target)) {
        fprintf(stderr,
                "kprofctl %s: --token-file without --tls-ca would send the token in clear text "
                "to %s: give --tls-ca (KPROF_TLS_CA), the CA that signed its certificate\n",
                verb, target);
        return KPROFCTL_EXIT_USAGE;
    }
    /* kp_rpc refuses it too (it allows 0640, for a group); a user's own token is 0600. */
    if (given(creds->token_file) && stat(creds->token_file, &st) == 0 && (st.st_mode & 0007) != 0) {
        fprintf(stderr,
                "kprofctl %s: the token file %s is readable by others (mode %04o): run chmod 600 "
                "%s\n",
                verb, creds->token_file, (unsigned) (st.st_mode & 07777), creds->token_file);
        return KPROFCTL_EXIT_USAGE;
    }
    memset(&co, 0, sizeof(co));
    co.tls_ca_file = given(creds->tls_ca) ? creds->tls_ca : NULL;
    co.tls_cert_file = given(creds->tls_cert) ? creds->tls_cert : NULL;
    co.tls_key_file = given(creds->tls_key) ? creds->tls_key : NULL;
    co.token_file = given(creds->token_file) ? creds->token_file : NULL;
    /* A reply is printed whole, and some are large: PyProf's table is a row per kernel, 130 MB
     * at 4 M events of a rank, past gRPC's default of 64 MiB. */
    co.max_message_bytes = KPROFCTL_MAX_REPLY;
    if (kp_rpc_channel_create(target, &co, out, err, sizeof(err)) != 0) {
        fprintf(stderr, "kprofctl %s: --%s=%s: %s\n", verb, flag, target, err);
        return KPROFCTL_EXIT_USAGE;
    }
    return 0;
}

/* The role a kprofctl call needs (the daemons' method tables, kp_auth.h): what changes
 * captures or runs is an operator's, the rest a viewer's. */
static const char *method_role(bool analyzer, const char *method)
{
    static const char *const operator_methods[] = { "StartCapture", "StopCapture", "DropRun",
                                                    "CreateRun", "EndRun" };

    if (analyzer) {
        return "viewer";
    }
    for (size_t i = 0; i < sizeof(operator_methods) / sizeof(operator_methods[0]); i++) {
        if (strcmp(method, operator_methods[i]) == 0) {
            return "operator";
        }
    }
    return "viewer";
}

const char *kp_rpcverb_refused_hint(grpc_status_code code, bool analyzer, const char *method,
                                    const struct kp_rpcverb_creds *creds)
{
    static char hint[512];

    if (code == GRPC_STATUS_PERMISSION_DENIED) {
        snprintf(hint, sizeof(hint),
                 "; kprofctl: %s needs the %s role: give --token-file (KPROF_TOKEN_FILE) a token "
                 "of that role",
                 method, method_role(analyzer, method));
    }
    else if (code != GRPC_STATUS_UNAUTHENTICATED) {
        hint[0] = '\0';
    }
    else if (given(creds->token_file)) {
        snprintf(hint, sizeof(hint),
                 "; kprofctl: the token in %s is not (or no longer) the server's: ask for a "
                 "current one",
                 creds->token_file);
    }
    else if (given(creds->tls_cert)) {
        snprintf(hint, sizeof(hint),
                 "; kprofctl: the certificate %s was not accepted (it needs the server's client "
                 "CA and a subjectAltName URI urn:kprof:ROLE:NAME)",
                 creds->tls_cert);
    }
    else {
        snprintf(hint, sizeof(hint),
                 "; kprofctl sent none: give --token-file (KPROF_TOKEN_FILE), a file (mode 0600) "
                 "holding a token of the %s role",
                 method_role(analyzer, method));
    }
    return hint;
}

static kp_rpcverb_local_fn *local_fn;
static const char *local_name;

void kp_rpcverb_set_local(kp_rpcverb_local_fn *fn, const char *name)
{
    local_fn = fn;
    local_name = name;
}

bool kp_rpcverb_daemon_answered(const struct kp_rpc_status *st)
{
    return st->code == GRPC_STATUS_UNAVAILABLE &&
           (strstr(st->details, "PostgreSQL") != NULL ||
            strstr(st->details, "capture coordinator") != NULL);
}

/* The Control methods only the capture coordinator answers. */
static bool capture_method(const char *method)
{
    static const char *const m[] = { "StartCapture", "StopCapture", "CaptureStatus", "ListJobs",
                                     NULL };

    for (size_t i = 0; m[i] != NULL; i++) {
        if (strcmp(method, m[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* Asks --collector's replica where the capture coordinator is and points v->ch there (same
 * credentials), or back at --collector. Returns 0 or the exit status (a channel refused). */
static int follow(struct kp_rpcverb *v)
{
    struct kp_rpc_channel *base = v->origin != NULL ? v->origin : v->ch, *ch = NULL;
    struct kp_rpcverb_creds creds;
    char addr[sizeof(v->coordinator)];
    int rc;

    v->resolved = true;
    kp_coordinator_resolve(base, v->common->collector, v->common->timeout_ms, addr, sizeof(addr));
    if (strcmp(addr, v->coordinator) == 0) {
        return 0;
    }
    if (addr[0] != '\0') {
        kp_rpcverb_creds_of(v->common, &creds);
        if ((rc = kp_rpcverb_channel(v->spec->name, "collector", addr, &creds, &ch)) != 0) {
            return rc;
        }
        kp_log_debug("following the capture coordinator at %s (asked %s)", addr,
                     v->common->collector);
    }
    if (v->origin != NULL) {
        kp_rpc_channel_destroy(v->ch); /* the previous coordinator's */
        v->ch = v->origin;
        v->origin = NULL;
    }
    if (ch != NULL) {
        v->origin = v->ch;
        v->ch = ch;
    }
    kp_strlcpy(v->coordinator, sizeof(v->coordinator), addr);
    return 0;
}

static int call_failed(struct kp_rpcverb *v, const char *method, const struct kp_rpc_status *st);

/* The in-process Analyzer refused method with st: prints it. Returns the exit status. */
static int local_failed(struct kp_rpcverb *v, const char *method, const struct kp_rpc_status *st)
{
    int rc = kp_rpcverb_exit_code(st->code);

    kp_rpcverb_error(v, "%s refused %s%s%s%s: %s: %s", local_name, method,
                     v->subject[0] != '\0' ? " (" : "", v->subject,
                     v->subject[0] != '\0' ? ")" : "", kp_rpc_status_name(st->code), st->details);
    return rc == KPROFCTL_EXIT_OK ? KPROFCTL_EXIT_FAILED : rc;
}

int kp_rpcverb_call(struct kp_rpcverb *v, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp)
{
    char path[RPCVERB_PATH_MAX];
    struct kp_rpc_status st;
    long long until;
    bool capture;
    int rc;

    *resp = NULL;
    snprintf(path, sizeof(path), "/kprof.v1.%s/%s", v->spec->analyzer ? "Analyzer" : "Control",
             method);
    memset(&st, 0, sizeof(st));
    if (v->spec->analyzer && local_fn != NULL) {
        if (local_fn(method, req, resp_desc, NULL, NULL, resp, &st) == 0) {
            return 0;
        }
        return local_failed(v, method, &st);
    }
    capture = !v->spec->analyzer && capture_method(method);
    if (capture && !v->resolved && (rc = follow(v)) != 0) {
        return rc;
    }
    /* A failover: a replica said it is not the coordinator (the call did nothing), or the
     * coordinator followed is gone and the call only reads. Ask --collector's replica again,
     * for a while: a standby takes over within seconds. */
    for (until = kp_mono_ms() + RPCVERB_FAILOVER_MS;
         kp_rpc_unary(v->ch, path, req, resp_desc, resp, v->common->timeout_ms, &st) != 0;) {
        bool refused =
            st.code == GRPC_STATUS_UNAVAILABLE && strstr(st.details, "capture coordinator") != NULL;
        bool gone = st.code == GRPC_STATUS_UNAVAILABLE && v->coordinator[0] != '\0' &&
                    !kp_rpcverb_daemon_answered(&st) &&
                    (strcmp(method, "CaptureStatus") == 0 || strcmp(method, "ListJobs") == 0);
        struct timespec ts = { .tv_sec = 0, .tv_nsec = RPCVERB_FAILOVER_NAP_MS * 1000000L };

        if (!capture || !(refused || gone) || kp_mono_ms() >= until) {
            goto failed;
        }
        nanosleep(&ts, NULL);
        if ((rc = follow(v)) != 0) {
            return rc;
        }
        memset(&st, 0, sizeof(st));
    }
    return 0;
failed:
    return call_failed(v, method, &st);
}

/* A call that failed with st: prints why, with what to do. Returns the exit status. */
static int call_failed(struct kp_rpcverb *v, const char *method, const struct kp_rpc_status *sp)
{
    struct kp_rpc_status st = *sp;
    int rc = kp_rpcverb_exit_code(st.code);

    if (rc == KPROFCTL_EXIT_OK) {
        rc = KPROFCTL_EXIT_FAILED; /* OK with no usable reply */
    }
    if (rc == KPROFCTL_EXIT_UNREACHABLE && kp_rpcverb_daemon_answered(&st)) {
        kp_rpcverb_error(v, "%s at %s answered %s: %s",
                         v->spec->analyzer ? "kprof-analyzer" : "collectord",
                         v->coordinator[0] != '\0' ? v->coordinator : v->common->collector,
                         kp_rpc_status_name(st.code), st.details);
    }
    else if (rc == KPROFCTL_EXIT_UNREACHABLE && v->spec->analyzer) {
        kp_rpcverb_error(v,
                         "cannot reach kprof-analyzer: %s: %s; is kprof-analyzer running at %s? "
                         "(set --analyzer or KPROF_ANALYZER)%s",
                         kp_rpc_status_name(st.code), st.details, v->common->collector,
                         tls_hint(v, &st));
    }
    else if (rc == KPROFCTL_EXIT_UNREACHABLE) {
        kp_rpcverb_error(v,
                         "cannot reach collectord: %s: %s; is kprof-collectord running at %s? "
                         "(set --collector or KPROF_COLLECTOR)%s",
                         kp_rpc_status_name(st.code), st.details, v->common->collector,
                         tls_hint(v, &st));
    }
    else {
        struct kp_rpcverb_creds creds;

        kp_rpcverb_creds_of(v->common, &creds);
        kp_rpcverb_error(
            v, "%s at %s refused %s%s%s%s: %s: %s%s",
            v->spec->analyzer ? "kprof-analyzer" : "collectord", v->common->collector, method,
            v->subject[0] != '\0' ? " (" : "", v->subject, v->subject[0] != '\0' ? ")" : "",
            kp_rpc_status_name(st.code), st.details,
            /* gRPC's own words for a reply over the channel's limit: kprofctl's, not the
             * server's refusal */
            st.code == GRPC_STATUS_RESOURCE_EXHAUSTED &&
                    strstr(st.details, "Received message larger than max") != NULL
                ? "; kprofctl: the reply is larger than the 1 GiB kprofctl takes: ask for one "
                  "rank at a time, or export the run (kprofctl export)"
                : kp_rpcverb_refused_hint(st.code, v->spec->analyzer, method, &creds));
    }
    return rc;
}

/* An in-process stream's page to the verb's hook; its exit status is kept (it printed why). */
struct local_pages {
    kp_rpcverb_page_fn *page;
    void *ud;
    int exit;
};

static int local_page(void *ud, const ProtobufCMessage *msg)
{
    struct local_pages *lp = ud;

    return lp->exit = lp->page(lp->ud, msg);
}

int kp_rpcverb_stream(struct kp_rpcverb *v, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, kp_rpcverb_page_fn *page,
                      void *ud)
{
    char path[RPCVERB_PATH_MAX];
    struct kp_rpc_status st;
    struct kp_rpc_stream *s = NULL;
    int rc;

    memset(&st, 0, sizeof(st));
    if (v->spec->analyzer && local_fn != NULL) {
        struct local_pages lp = { .page = page, .ud = ud };
        ProtobufCMessage *last = NULL;

        if (local_fn(method, req, resp_desc, local_page, &lp, &last, &st) != 0) {
            return lp.exit != 0 ? lp.exit : local_failed(v, method, &st);
        }
        rc = page(ud, last);
        protobuf_c_message_free_unpacked(last, NULL);
        return rc;
    }
    snprintf(path, sizeof(path), "/kprof.v1.%s/%s", v->spec->analyzer ? "Analyzer" : "Control",
             method);
    if (kp_rpc_stream_open(v->ch, path, resp_desc, 0, &s, &st) != 0 ||
        kp_rpc_stream_send(s, req) != 0 || kp_rpc_stream_close_send(s) != 0) {
        if (s != NULL) {
            (void) kp_rpc_stream_finish(s, &st, v->common->timeout_ms);
        }
        rc = call_failed(v, method, &st);
        goto out;
    }
    for (;;) {
        ProtobufCMessage *m = NULL;
        int r = kp_rpc_stream_recv(s, &m, v->common->timeout_ms);

        if (r == 0) {
            break;
        }
        if (r == -ETIMEDOUT) {
            kp_rpcverb_error(v, "%s at %s sent nothing for %lld ms: giving up (raise --timeout)",
                             v->spec->analyzer ? "kprof-analyzer" : "collectord",
                             v->common->collector, v->common->timeout_ms);
            rc = KPROFCTL_EXIT_UNREACHABLE;
            goto out;
        }
        if (r == KP_EPROTO) {
            kp_rpcverb_error(v, "%s sent a %s that does not unpack",
                             v->spec->analyzer ? "kprof-analyzer" : "collectord", resp_desc->name);
            rc = KPROFCTL_EXIT_FAILED;
            goto out;
        }
        if (r < 0) {
            break; /* the status tells */
        }
        rc = page(ud, m);
        protobuf_c_message_free_unpacked(m, NULL);
        if (rc != 0) {
            goto out; /* destroy cancels the call */
        }
    }
    rc = kp_rpc_stream_finish(s, &st, v->common->timeout_ms) != 0 ? call_failed(v, method, &st) : 0;
out:
    kp_rpc_stream_destroy(s);
    return rc;
}

int kp_rpcverb_table(const struct kp_rpcverb *v, struct kp_table **out)
{
    struct kp_table *t = NULL;
    char err[1024];
    int rc;

    *out = NULL;
    if ((rc = kp_table_create(v->spec->cols, v->spec->n_cols, &t)) != 0) {
        kp_rpcverb_error(v, "%s", kp_strerror(rc));
        return KPROFCTL_EXIT_FAILED;
    }
    /* kp_rpcverb_init checked the selection. */
    if (kp_table_select(t, v->common->columns, err, sizeof(err)) != 0) {
        kp_rpcverb_error(v, "-c %s: %s", v->common->columns, err);
        kp_table_destroy(t);
        return KPROFCTL_EXIT_USAGE;
    }
    *out = t;
    return 0;
}

void kp_rpcverb_default_columns(const struct kp_rpcverb *v, struct kp_table *t, const char *list)
{
    char err[1024];

    if (v->common->columns == NULL || v->common->columns[0] == '\0') {
        kp_table_select(t, list, err, sizeof(err));
    }
}

size_t kp_rpcverb_top(size_t n, long long top)
{
    return top > 0 && (size_t) top < n ? (size_t) top : n;
}

int kp_rpcverb_print(const struct kp_rpcverb *v, const struct kp_table *t, FILE *out)
{
    if (kp_table_print(t, v->format, (int) v->common->width, out) != 0) {
        kp_rpcverb_error(v, "writing the table failed: %s", strerror(errno));
        return KPROFCTL_EXIT_FAILED;
    }
    return 0;
}

const char *kp_rpcverb_run_state_name(Kprof__V1__RunState s)
{
    switch (s) {
    case KPROF__V1__RUN_STATE__RUN_STATE_OPEN:
        return "open";
    case KPROF__V1__RUN_STATE__RUN_STATE_ENDED:
        return "ended";
    case KPROF__V1__RUN_STATE__RUN_STATE_FAILED:
        return "failed";
    default:
        return "unknown";
    }
}

void kp_rpcverb_set_subject(struct kp_rpcverb *v, long long run, long long rank)
{
    if (rank >= 0) {
        snprintf(v->subject, sizeof(v->subject), "run %lld rank %lld", run, rank);
    }
    else {
        snprintf(v->subject, sizeof(v->subject), "run %lld", run);
    }
}

const char *kp_rpcverb_format_time(int64_t ns, char *buf, size_t cap)
{
    struct tm tm;
    time_t secs;

    if (ns <= 0) {
        return NULL;
    }
    secs = (time_t) (ns / 1000000000);
    if (gmtime_r(&secs, &tm) == NULL || strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
        snprintf(buf, cap, "%lld", (long long) ns);
    }
    return buf;
}

int kp_rpcverb_set_time(struct kp_table *t, size_t col, int64_t ns)
{
    char buf[64];
    struct tm tm;
    time_t secs;

    if (ns <= 0) {
        return kp_table_set_null(t, col);
    }
    secs = (time_t) (ns / 1000000000);
    if (gmtime_r(&secs, &tm) == NULL ||
        strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
        return kp_table_set_i64(t, col, ns); /* as runs always did: the raw number */
    }
    return kp_table_set_str(t, col, buf);
}

int kp_rpcverb_set_us(struct kp_table *t, size_t col, int64_t ns)
{
    return kp_table_set_double(t, col, (double) ns / 1000.0, "%.3f");
}

int kp_rpcverb_set_exact(const struct kp_rpcverb *v, struct kp_table *t, size_t col, double x)
{
    return kp_table_set_double(t, col, x, v->format == KP_TABLE_FORMAT_JSON ? "%.17g" : "%.3f");
}
