/*
 * kp_view: one analysis the Analyzer service answers (docs/design.md "Analysis"), described once:
 * its method name, its request and reply messages, how a request becomes a cache key, and its
 * compute. service.c serves every row of kp_views (queue, workers, run check, cache, errors,
 * metrics) and knows no view by name; kprof-analyze (the offline mode) runs the same computes
 * in process.
 *
 * Adding a view (the steps, the files and the tests: docs/recipes.md "Adding an analysis
 * view"): analyzer/view_<name>.c with its key and compute functions and its
 * `const struct kp_view kp_view_<name>`, declared here and listed in views.c's table.
 *
 * Thread-safety: descriptors are constant; a compute runs on one worker with its own
 * PostgreSQL connection and touches nothing shared.
 */
#ifndef KP_VIEW_H
#define KP_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>
#include <libpq-fe.h>
#include <protobuf-c/protobuf-c.h>

struct kp_an;

#define KP_VIEW_OPTS_BYTES 96
#define KP_VIEW_ONLY_RANK  (-1) /* a per-rank request's rank: the run's only rank */

/* What a cached reply was computed from. Key functions zero it first (kp_view_key_init), so
 * that two keys compare equal byte for byte (memcmp) exactly when they ask the same thing. */
struct kp_view_key {
    uint64_t run;
    int32_t rank; /* -1 for a view of the whole run; KP_VIEW_ONLY_RANK until resolved */
    /* the view's options (its own struct, copied in; zero padding included) */
    unsigned char opts[KP_VIEW_OPTS_BYTES];
};

/* How a streaming call's pages go out (kp_view.stream): send(ud, page) sends one page
 * (borrowed: packed before it returns) once the one before has reached the client, so a slow
 * client slows the compute instead of growing the analyzer. Returns 0, or nonzero when the
 * client went away or stopped reading: stop, the call is over. */
struct kp_view_pages {
    int (*send)(void *ud, const ProtobufCMessage *page);
    void *ud;
};

/* What a compute gets. */
struct kp_view_ctx {
    PGconn *pg;                    /* the worker's connection (borrowed) */
    struct kp_an *an;              /* the loaded rank when the view has load_rank; else NULL */
    const ProtobufCMessage *req;   /* the request (borrowed) */
    const struct kp_view_key *key; /* as the view's key function set it */
    size_t max_rows;               /* the service's row budget per rank (0: none) */
    size_t window_events;          /* the service's --window-events (kp_view_window) */
    /* the memory reserved is for windows: a rank that cannot be cut is not read whole, the
     * compute returns KP_EWHOLE instead (the service reserves for a whole read, then asks
     * again without) */
    bool windows_only;
    /* A streaming call's (kp_view.stream): the compute sends its reply's pages here as it makes
     * them and returns the last one (kp_view.page, its `last` set) as its reply. NULL: unary. */
    const struct kp_view_pages *pages;
    char *err; /* a message for a failure */
    size_t errlen;
    /* A compute may set this (a grpc_status_code) with err as the details, to answer with that
     * status instead of the one its return code maps to (service.c's status_for). */
    int status;
};

/* A computed reply: msg points into what free_fn releases (state). */
struct kp_view_reply {
    ProtobufCMessage *msg;
    void *state;
    void (*free_fn)(void *state);
};

struct kp_view {
    const char *name; /* "Breakdown": the method /kprof.v1.Analyzer/<name> and the metrics label */
    const ProtobufCMessageDescriptor *request; /* its reply has run_id and cached */
    const ProtobufCMessageDescriptor *reply;
    bool whole_run; /* a view of every rank: its request has no rank */
    bool load_rank; /* kp_an_create (run, rank) before the compute (ctx->an) */
    /* With load_rank, what the compute asks of ctx->an (KP_AN_WIN_*, an.h) when all it asks is
     * what a windowed read answers: a rank of more events than the service's window
     * (--window-events) is then read by windows (kp_an_create_windowed), in bounded memory.
     * Without load_rank, KP_VIEW_WIN_SELF: the compute reads its rows by windows of that size
     * itself (kp_view_window). Either way the service estimates it for two windows. 0: whole. */
    unsigned windowed;
    /* The request as a key: run, rank and options (key zeroed by the caller). Returns true, or
     * false with INVALID_ARGUMENT's details in err. max_rows is the service's budget. */
    bool (*key)(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k, char *err,
                size_t len);
    /* Computes the reply into *out (out->free_fn(out->state) releases it; it may point into
     * ctx->an, which outlives it). Returns 0; -EINVAL
     * (options the analysis refuses), KP_ENOTFOUND, KP_ETOOBIG, -ENOMEM, or KP_EPG with a
     * message in ctx->err and nothing to free. */
    int (*compute)(struct kp_view_ctx *ctx, struct kp_view_reply *out);
    /* NULL, or whether the request writes (it is then neither answered from nor kept in the
     * cache, and the web API refuses it: a GET never writes). */
    bool (*writes)(const ProtobufCMessage *req);
    /* Never answered from nor kept in the cache, though it only reads (Diff: the cache checks
     * one run's version, and a diff reads two runs). */
    bool uncached;
    /* The compute's peak memory per event of the rank it reads (ranks.records counts them), as
     * measured at 1 M events with a quarter more, for the service's --memory-budget; 0: what
     * it reads does not grow with the rank (Compare reads summaries). A whole-run view with a
     * figure reads one rank at a time: its largest rank counts. */
    unsigned bytes_per_event;
    /* NULL, or the second rank the request reads, which counts too (Diff's other side; rank
     * KP_VIEW_ONLY_RANK: the run's only one). */
    void (*other_rank)(const struct kp_view_key *k, uint64_t *run, int32_t *rank);
    /* NULL, or a server-streaming method answering the same request in pages of `page`
     * ("ProfRows" for Prof: a row per kernel), sent as the compute makes them (ctx->pages):
     * what the reply holds is then bounded too. The compute reads the rank by windows of
     * --window-events where it can (the service estimates it as a KP_VIEW_WIN_SELF view);
     * never cached. */
    const char *stream;
    const ProtobufCMessageDescriptor *page;
};

extern const struct kp_view kp_view_breakdown, kp_view_ops, kp_view_kernels, kp_view_prof,
    kp_view_roofline, kp_view_counters, kp_view_compare, kp_view_hta, kp_view_memory,
    kp_view_distributed;
extern const struct kp_view kp_view_diff; /* two sides: the other one in its key's opts */

/* For a view without load_rank that reads the rank's rows itself: 0, or KP_ENOTFOUND (an
 * unknown run or rank, the message in ctx->err, as kp_an_create says it) or KP_EPG. */
int kp_view_check_rank(struct kp_view_ctx *ctx);

#define KP_VIEW_WIN_SELF 0x100u

/* For a .windowed view that reads its own rows: the window to read ctx's rank by into *window,
 * the service's --window-events where the rank has more events than that, else 0 (whole).
 * Returns 0 or KP_EPG (message in ctx->err). */
int kp_view_window(struct kp_view_ctx *ctx, size_t *window);

/* Every view, in the order of the Analyzer service in proto/kprof.proto. */
extern const struct kp_view *const kp_views[];
extern const size_t kp_n_views;

/* The view whose method is name ("Breakdown"), or whose streaming method it is ("ProfRows":
 * *stream true; stream may be NULL), or NULL. */
const struct kp_view *kp_view_find(const char *name, bool *stream);

/* Sets k's run and rank from the request's run_id and rank (whole_run: views whose requests
 * have no rank; k->rank is -1), checking them (run 1..INT32_MAX, rank >= 0 or
 * KP_VIEW_ONLY_RANK); false with the INVALID_ARGUMENT details in err. */
bool kp_view_key_init(struct kp_view_key *k, uint64_t run, int32_t rank, bool whole_run, char *err,
                      size_t len);

/* kp_view_key_init for a per-rank view whose one option is a grouping (0 or 1), kept as an
 * int in k->opts; false with "group_by N is not a known grouping" otherwise. */
bool kp_view_key_group_by(struct kp_view_key *k, uint64_t run, int32_t rank, int group_by,
                          char *err, size_t len);

/* The key function of a per-rank view whose request is (uint64 run_id, int32 rank, enum
 * group_by), as Ops, Kernels and Roofline's are: kp_view_key_group_by over those fields. */
bool kp_view_group_by_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k,
                          char *err, size_t len);

/* KP_VIEW_ONLY_RANK as the run's only rank in *rank. Returns 0; -EINVAL when the run has
 * several ranks (err lists them and says to pick one with --rank); KP_ENOTFOUND when it has
 * none; KP_EPG. Blocks on PG. */
int kp_view_resolve_rank(PGconn *pg, uint64_t run, int32_t *rank, char *err, size_t len);

/* The run's version: its state and committed batch count (the cache's check). Returns 0,
 * KP_ENOTFOUND ("run N does not exist") or KP_EPG, with a message in err. */
int kp_view_run_version(PGconn *pg, uint64_t run, int *state, int64_t *batches, char *err,
                        size_t len);

/* The status answering a compute's failure rc (NOT_FOUND, INVALID_ARGUMENT for -EINVAL,
 * RESOURCE_EXHAUSTED for KP_ETOOBIG and -ENOMEM, else UNAVAILABLE with err rewritten as
 * "PostgreSQL failed (...); retry later"). Logs the last two. */
grpc_status_code kp_view_status(const struct kp_view *v, const struct kp_view_key *k, int rc,
                                char *err, size_t len);

/* Answers req (keyed as k, its rank resolved) with v over pg: loads the rank when the view
 * wants it (a windowed view's rank of more than window_events events by windows of that many
 * host events; 0: never by windows), computes. Returns 0 and *out, with *an the loaded rank (or
 * NULL), which the reply may point into: free the reply, then kp_an_destroy(*an). Or returns
 * nonzero with *code and its details in err (*an still to destroy); with windows_only, KP_EWHOLE
 * where the rank (over window_events) cannot be read by windows and was not read (no page was
 * sent). pages: v->stream's call (its pages go there, *out is the last), or NULL. */
int kp_view_compute(const struct kp_view *v, PGconn *pg, const ProtobufCMessage *req,
                    const struct kp_view_key *k, size_t max_rows, size_t window_events,
                    bool windows_only, const struct kp_view_pages *pages, struct kp_an **an,
                    struct kp_view_reply *out, grpc_status_code *code, char *err, size_t len);

/* The events of run's rank (ranks.records), or of its largest rank for rank < 0: what the
 * memory budget and the windows go by. 0, or KP_EPG with a message in err. */
int kp_view_rank_events(PGconn *pg, uint64_t run, int32_t rank, int64_t *n, char *err, size_t len);

#endif
