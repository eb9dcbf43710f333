/*
 * kp_rpcverb: the verb framework of kprofctl. Every verb over a kprof gRPC service (runs, jobs,
 * start, stop and status on collectord's Control service; breakdown, ops, kernels, prof,
 * roofline, compare, counters, hta, memory, distributed and export on kprof-analyzer's Analyzer
 * service, spec.analyzer) describes itself in one struct kp_rpcverb_spec and parses, calls and
 * prints alike:
 *
 *   flags   --collector, --tls-ca, --tls-cert, --tls-key, --token-file (before the verb's own
 *           flags in --help: the credentials, KP_RPCVERB_CRED_DEFS), then --json,
 *           --csv, --columns (-c), --width (-w), --timeout and --log-level (after them), in
 *           one kp_config table built from the common rows and the verb's; --help adds the
 *           verb's synopsis above the flags and the exit statuses (kprofctl.h) below them.
 *   call    one blocking unary call to /kprof.v1.Control/<Method> (Analyzer/<Method>); a
 *           failed status is printed with the server's details and mapped to an exit status
 *           (kp_rpcverb_exit_code).
 *   output  the verb's table (table.h) with the -c selection, printed as text, CSV or JSON.
 *
 * kp_rpcverb_main runs a verb from its spec: parse, check, build the request, call, fill the
 * table, print; or, for a streamed reply (spec.page: prof), call and hand each message to the
 * verb as it comes, then print. The verb keeps only its own parts, in the spec's hooks. A verb
 * whose call is neither (export writes files) uses the steps below it: kp_rpcverb_init, _call or
 * _stream, _print.
 *
 * Messages go to stderr as "kprofctl VERB: ...". Not thread-safe.
 */
#ifndef KPROFCTL_RPCVERB_H
#define KPROFCTL_RPCVERB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "kp_config.h"
#include "kp_rpc.h"
#include "kprof.pb-c.h"
#include "table.h"

#define KP_RPCVERB_MAX_DEFS 56   /* common rows plus the verb's */
#define KP_RPCVERB_RUN      (-1) /* kp_rpcverb_init's and a check hook's "go on" */

/* The --run row of an analysis verb, into kp_rpcverb_common.run (so at the same offset in
 * the verb's config, which starts with it). */
#define KP_RPCVERB_RUN_DEF                                                                \
    {                                                                                     \
        "run", KP_CONFIG_INT, "0", 0, INT32_MAX, offsetof(struct kp_rpcverb_common, run), \
            "the run (required; kprofctl runs)", NULL, false                              \
    }

/* The credential rows of a client of SERVER ("collectord"), into TYPE's char * fields tls_ca,
 * tls_cert, tls_key and token_file; kp_rpcverb_channel checks and uses them. Every kprofctl
 * verb has them (also from KPROF_TLS_CA, KPROF_TLS_CERT, KPROF_TLS_KEY, KPROF_TOKEN_FILE and
 * /etc/kprof/kprofctl.conf, as every flag). */
#define KP_RPCVERB_CRED_DEFS(TYPE, SERVER)                                                     \
    { "tls-ca",                                                                                \
      KP_CONFIG_STRING,                                                                        \
      "",                                                                                      \
      0,                                                                                       \
      0,                                                                                       \
      offsetof(TYPE, tls_ca),                                                                  \
      "PEM of the CA that signed " SERVER "'s certificate: use TLS",                           \
      NULL,                                                                                    \
      false },                                                                                 \
        { "tls-cert",                                                                          \
          KP_CONFIG_STRING,                                                                    \
          "",                                                                                  \
          0,                                                                                   \
          0,                                                                                   \
          offsetof(TYPE, tls_cert),                                                            \
          "mutual TLS: PEM of this client's certificate (subjectAltName URI "                  \
          "urn:kprof:ROLE:NAME), with --tls-key and --tls-ca",                                 \
          NULL,                                                                                \
          false },                                                                             \
        { "tls-key",                                                                           \
          KP_CONFIG_STRING,                                                                    \
          "",                                                                                  \
          0,                                                                                   \
          0,                                                                                   \
          offsetof(TYPE, tls_key),                                                             \
          "mutual TLS: PEM of --tls-cert's private key",                                       \
          NULL,                                                                                \
          false },                                                                             \
    {                                                                                          \
        "token-file", KP_CONFIG_STRING, "", 0, 0, offsetof(TYPE, token_file),                  \
            "file (mode 0600) whose first line is the bearer token sent with every call: a "   \
            "viewer's token lists and analyses, an operator's also starts, stops and imports", \
            NULL, false                                                                        \
    }

/* The --rank row of a per-rank analysis verb, into kp_rpcverb_common.rank: by default -1,
 * which asks kprof-analyzer for the run's only rank; a run with several ranks is then a usage
 * error (exit 2) whose message lists them. */
#define KP_RPCVERB_RANK_DEF                                                                      \
    {                                                                                            \
        "rank", KP_CONFIG_INT, "-1", -1, INT32_MAX, offsetof(struct kp_rpcverb_common, rank),    \
            "the rank (default -1: the run's only rank; a run with several needs --rank)", NULL, \
            false                                                                                \
    }

/* struct kp_rpcverb_spec.flags. F_RUN: --run R (KP_RPCVERB_RUN_DEF) is required
 * (kp_rpcverb_main exits 2 without it), it is the request's run_id, and a refused call names
 * "run R". F_RANK, with F_RUN: --rank N (KP_RPCVERB_RANK_DEF) is the request's rank too, and
 * a refused call names "run R rank N". */
#define KP_RPCVERB_F_RUN  0x1u
#define KP_RPCVERB_F_RANK 0x2u

/* The common flags. A verb's config struct has this as its FIRST member, so that the common
 * rows' offsets are valid in it. */
struct kp_rpcverb_common {
    char *collector; /* the server's address: --collector, or --analyzer for analyzer verbs */
    char *tls_ca;
    char *tls_cert;
    char *tls_key;
    char *token_file;
    bool json;
    bool csv;
    char *columns;
    long long width;
    long long timeout_ms; /* one call's deadline */
    int log_level;
    long long run;  /* --run, for the verbs whose rows point here (KP_RPCVERB_RUN_DEF) */
    long long rank; /* --rank, likewise (KP_RPCVERB_RANK_DEF) */
};

struct kp_rpcverb;

/* What a verb tells the module about itself; static, borrowed for the verb's run. */
struct kp_rpcverb_spec {
    const char *name;        /* "runs": messages start "kprofctl runs: " */
    const char *synopsis;    /* --help's first lines: usage and what the verb prints */
    const char *exit_ok;     /* --help's line for exit 0 ("listed (also when there are none)") */
    const char *exit_failed; /* --help's line for exit 1; NULL: the common one */
    bool interruptible;      /* waits: --help lists 130 (interrupted) */
    const char *json_help;   /* --json's help; NULL: "print a JSON array of objects" */
    const struct kp_config_def *defs; /* the verb's own flags (offsets into its config) */
    size_t n_defs;
    const struct kp_table_col *cols; /* the verb's table */
    size_t n_cols;
    const char *columns_help; /* NULL: -c names cols (and is checked against them); else -c's
                                 help, and the verb checks -c itself (e.g. metric names) */
    bool analyzer; /* calls kprof-analyzer's Analyzer service: --analyzer (KPROF_ANALYZER,
                      default 127.0.0.1:7072) instead of --collector, and its exit statuses */

    /* What kp_rpcverb_main does; every hook may be NULL. */
    unsigned flags;                              /* KP_RPCVERB_F_* */
    const char *method;                          /* the RPC ("ListRuns") */
    const ProtobufCMessageDescriptor *req_desc;  /* its request */
    const ProtobufCMessageDescriptor *resp_desc; /* its reply */
    /* After the common checks (and --run's): the verb's own. Returns KP_RPCVERB_RUN to go on,
     * or the exit status to return at once (status --watch does its own calls here). */
    int (*check)(struct kp_rpcverb *v);
    /* Fills req (initialised, run_id and rank set per flags); its fields may borrow from
     * v->cfg, which outlives the call. Returns 0 or the exit status. */
    int (*request)(struct kp_rpcverb *v, ProtobufCMessage *req);
    /* Adds resp's rows to t (the verb's table, -c applied). Returns 0, a negative errno
     * (kp_rpcverb_main prints it and exits 1) or the exit status after printing why. NULL: no
     * table is made, and print gets t NULL. */
    int (*rows)(struct kp_rpcverb *v, struct kp_table *t, const ProtobufCMessage *resp);
    /* Prints the result. Returns the exit status. NULL: kp_rpcverb_print(t) to stdout. */
    int (*print)(struct kp_rpcverb *v, const struct kp_table *t, const ProtobufCMessage *resp);
    /* A verb whose method streams its reply (a server stream of resp_desc): each message goes
     * here (ud: the struct kp_rpcverb) as it comes (kp_rpcverb_stream), then print runs with
     * resp NULL once the stream ended OK; rows is not used. NULL: one unary call. */
    int (*page)(void *ud, const ProtobufCMessage *msg);
};

/* One verb's run. Caller-owned (kp_rpcverb_init/fini). */
struct kp_rpcverb {
    const struct kp_rpcverb_spec *spec;
    void *cfg;                        /* the verb's config (borrowed) */
    struct kp_rpcverb_common *common; /* == cfg */
    struct kp_config_def defs[KP_RPCVERB_MAX_DEFS];
    size_t n_defs;
    char columns_help[1024];
    enum kp_table_format format;
    struct kp_rpc_channel *ch;
    /* the capture coordinator's address when it is not --collector's replica (a capture call
     * asked Control.Coordinator first: kp_coordinator.h); ch then leads there, and origin is
     * the channel to --collector, asked again when the coordinator changes */
    char coordinator[256];
    struct kp_rpc_channel *origin;
    bool resolved;
    char subject[256]; /* what the call is about ("job ddp-42", "run 17"), named when refused */
};

/*
 * Runs the verb spec describes: kp_rpcverb_init, then (--run required with F_RUN) spec->check,
 * the table (when spec->rows), the request (run_id and rank per flags, then spec->request),
 * kp_rpcverb_call, spec->rows and spec->print. cfg is the verb's config struct, zeroed by the
 * caller, struct kp_rpcverb_common first. Returns the process exit status (kprofctl.h).
 */
int kp_rpcverb_main(const struct kp_rpcverb_spec *spec, void *cfg, int argc, char **argv);

/*
 * Parses argv into cfg (the verb's config struct, zeroed by the caller, struct
 * kp_rpcverb_common first) with the common flags and spec's, checks them (no positional
 * arguments, not both --json and --csv, known -c columns), sets the log level and creates
 * the channel (which connects lazily). Prints what went wrong. Returns KP_RPCVERB_RUN to go
 * on, or the exit status to return at once: 0 after --help, --dry-run or --print-config, 2
 * for bad usage, 1 when out of memory. Call kp_rpcverb_fini in every case.
 */
int kp_rpcverb_init(struct kp_rpcverb *v, const struct kp_rpcverb_spec *spec, void *cfg, int argc,
                    char **argv);

/* A client's credentials (the KP_RPCVERB_CRED_DEFS flags; "" or NULL: not given). */
struct kp_rpcverb_creds {
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
    const char *token_file;
};

/* The credentials of the common flags (borrowed from c). */
void kp_rpcverb_creds_of(const struct kp_rpcverb_common *c, struct kp_rpcverb_creds *out);

/*
 * Creates the channel to target (the value of --FLAG, "collector" or "analyzer") with creds,
 * after checking them: --tls-cert and --tls-key go together and need --tls-ca; a token is not
 * sent in clear text to an address that is not loopback (--token-file needs --tls-ca there).
 * A token file that is missing, empty or readable by others is refused naming its path.
 * Returns 0 and *out (kp_rpc_channel_destroy), or KPROFCTL_EXIT_USAGE after printing
 * "kprofctl VERB: ..." with what to do.
 */
int kp_rpcverb_channel(const char *verb, const char *flag, const char *target,
                       const struct kp_rpcverb_creds *creds, struct kp_rpc_channel **out);

/*
 * What to do about a call refused for its credential (UNAUTHENTICATED, PERMISSION_DENIED:
 * exit 7): "; ..." naming the flag and environment variable and, for PERMISSION_DENIED, the
 * role method needs (Control's or, with analyzer, Analyzer's). "" for any other code.
 * Static storage; not thread-safe.
 */
const char *kp_rpcverb_refused_hint(grpc_status_code code, bool analyzer, const char *method,
                                    const struct kp_rpcverb_creds *creds);

/* Frees the channel and cfg's strings. Safe on a zeroed or failed v. */
void kp_rpcverb_fini(struct kp_rpcverb *v);

/*
 * The table options' short flags, which kp_rpcverb_init applies before kp_config (it takes
 * only --key forms): copies argv[0..argc) into out (argc + 1 entries, out[argc] = NULL), with
 * "-c" rewritten to "--columns" and "-w" to "--width" (their value stays the next argument)
 * and "-cVALUE"/"-wVALUE" to "--columns=VALUE"/"--width=VALUE" (in buf, the caller's storage,
 * buflen bytes). Nothing after "--" changes. Returns 0, or -ENOSPC if buf is too small.
 */
int kp_rpcverb_short_flags(int argc, char **argv, char **out, char *buf, size_t buflen);

/* Prints "kprofctl VERB: <message> (see kprofctl VERB --help)" and returns 2. */
int kp_rpcverb_usage_error(const struct kp_rpcverb *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints "kprofctl VERB: <message>". */
void kp_rpcverb_error(const struct kp_rpcverb *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * Calls /kprof.v1.Control/<method> (e.g. "ListRuns"), or /kprof.v1.Analyzer/<method> for an
 * analyzer verb, with req (borrowed) within --timeout.
 * Returns 0 and *resp (owned: protobuf_c_message_free_unpacked), or the exit status for the
 * failed call (kp_rpcverb_exit_code) after printing collectord's status and details (and
 * v->subject, when set); for an unreachable collectord the message asks whether
 * kprof-collectord runs at --collector; for a refused credential it says which flag to give
 * (kp_rpcverb_refused_hint).
 * Blocks.
 */
int kp_rpcverb_call(struct kp_rpcverb *v, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp);

/* A streamed message's taker (kp_rpcverb_stream): msg is borrowed for the call. Returns 0, or
 * the exit status after printing why (the call is then cancelled). */
typedef int kp_rpcverb_page_fn(void *ud, const ProtobufCMessage *msg);

/*
 * The server-streaming counterpart of kp_rpcverb_call: calls method (its replies resp_desc)
 * with req, handing each message to page(ud, msg) as it comes, within --timeout of each other.
 * Returns 0 once the server ended the stream with OK, page's nonzero return, or the exit status
 * for the failed call after printing it as kp_rpcverb_call does (a stream cut short may have
 * given page some messages first). Blocks.
 */
int kp_rpcverb_stream(struct kp_rpcverb *v, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_desc, kp_rpcverb_page_fn *page,
                      void *ud);

/*
 * An in-process Analyzer (kprof-analyze's offline mode): called instead of the channel for
 * analyzer verbs once set, with the method's name ("Breakdown"). Returns 0 and *resp (owned,
 * of resp_desc), or fills st with the status the service would have answered. For a streaming
 * method ("ProfRows"), page is set: every message but the last goes to page(page_ud, msg)
 * (borrowed) as it is computed, its nonzero return stopping the call, and *resp is the last.
 */
typedef int kp_rpcverb_local_fn(const char *method, const ProtobufCMessage *req,
                                const ProtobufCMessageDescriptor *resp_desc,
                                kp_rpcverb_page_fn *page, void *page_ud, ProtobufCMessage **resp,
                                struct kp_rpc_status *st);

/* Sets (or with NULL clears) the in-process Analyzer, and the name its refusals carry
 * ("kprof-analyze"). Not thread-safe: set it before running a verb. */
void kp_rpcverb_set_local(kp_rpcverb_local_fn *fn, const char *name);

/* The exit status for a gRPC status (kprofctl.h): OK 0; INVALID_ARGUMENT, OUT_OF_RANGE 2;
 * NOT_FOUND 3; ALREADY_EXISTS 4; UNAVAILABLE, DEADLINE_EXCEEDED 5; FAILED_PRECONDITION 6;
 * UNAUTHENTICATED, PERMISSION_DENIED 7; anything else 1. */
int kp_rpcverb_exit_code(grpc_status_code code);

/* Whether an UNAVAILABLE came from the daemon itself rather than from gRPC failing to reach it:
 * the daemons answer UNAVAILABLE when their PostgreSQL is unreachable and name it in the
 * details, and a collectord replica that is not the capture coordinator says so; gRPC's own
 * connect failures and deadlines never do. Print such details as they are
 * (they say what to do) instead of asking whether the daemon runs. */
bool kp_rpcverb_daemon_answered(const struct kp_rpc_status *st);

/* Creates the verb's table with the -c selection applied. Returns 0 and *out
 * (kp_table_destroy), or 1 after printing why. */
int kp_rpcverb_table(const struct kp_rpcverb *v, struct kp_table **out);

/* Shows only list's columns ("name,calls") when -c was not given: a verb's narrower default. */
void kp_rpcverb_default_columns(const struct kp_rpcverb *v, struct kp_table *t, const char *list);

/* How many of n rows --top N shows: N when 0 < N < n, else n. */
size_t kp_rpcverb_top(size_t n, long long top);

/* Prints t to out in the chosen format and -w width. Returns 0, or 1 after printing why. */
int kp_rpcverb_print(const struct kp_rpcverb *v, const struct kp_table *t, FILE *out);

/* v->subject as "run R" or, when rank >= 0, "run R rank N". */
void kp_rpcverb_set_subject(struct kp_rpcverb *v, long long run, long long rank);

/* ns since the epoch as "2026-11-22T02:34:15Z" (whole seconds, UTC) into buf (at least 32
 * bytes). Returns buf, or NULL when ns <= 0 (not set). */
const char *kp_rpcverb_format_time(int64_t ns, char *buf, size_t cap);

/* A run's state as kprofctl prints it: "open", "ended", "failed" or "unknown". */
const char *kp_rpcverb_run_state_name(Kprof__V1__RunState s);

/* Sets a table cell to kp_rpcverb_format_time(ns); NULL when ns <= 0. Returns as
 * kp_table_set_str. */
int kp_rpcverb_set_time(struct kp_table *t, size_t col, int64_t ns);

/* Sets a table cell to ns in µs: exact (ns / 1000 with three decimals) in every format.
 * Returns as kp_table_set_double. */
int kp_rpcverb_set_us(struct kp_table *t, size_t col, int64_t ns);

/* Sets a table cell to x: "%.3f" in text and CSV, all of its digits ("%.17g") in JSON, so
 * JSON readers get the very double the server computed. Returns as kp_table_set_double. */
int kp_rpcverb_set_exact(const struct kp_rpcverb *v, struct kp_table *t, size_t col, double x);

#endif
