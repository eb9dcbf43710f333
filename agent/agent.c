/*
 * kprof-agent: the registry of local processes, capture control, the batchers, the spool and
 * the uplink. See agent.h for the threads and kp_wire.h / ctl.h for the protocols.
 *
 * Sessions: one per accepted connection (library or control client), owned by the loop
 * thread. A capture selects sessions, arms them (ARM) and gives each a batcher; the batchers
 * append encoded batches to the spool; the uplink pushes the spool to collectord with
 * stream = the spool's stream id and seq = the spool seq, so a replay after any crash or
 * reconnect is deduplicated by collectord. A capture is complete when every rank is done or
 * failed and the spool is acknowledged through the last batch of every rank.
 *
 * Captures come from `kprof-agent capture` (local: the agent may create and end the run, a
 * waiting client gets the result, the capture is freed once complete) or from collectord's
 * KIND_ARM commands over Control.Attach (remote, attach.h). A remote capture is reported in
 * every AgentReport (PENDING, CAPTURING, FLUSHING, DONE or FAILED per rank); a rank's process
 * is released for other captures as soon as the rank is over, and the capture itself stays,
 * for the reports, until KIND_FORGET or KP_AGENT_FINISHED_KEEP_MS after it completed.
 */
#define _GNU_SOURCE
#define KP_LOG_MODULE "agent"
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "attach.h"
#include "batcher.h"
#include "ctl.h"
#include "demangle.h"
#include "kp_clock.h"
#include "kp_codec.h"
#include "kp_err.h"
#include "kp_http.h"
#include "kp_log.h"
#include "kp_metrics.h"
#include "kp_push.h"
#include "kp_ranks.h"
#include "kp_ready.h"
#include "kp_rpc.h"
#include "kp_str.h"
#include "kp_strbuf.h"
#include "kp_wire.h"
#include "kprof.pb-c.h"
#include "spool.h"

#define KP_AGENT_MAX_STRINGS_BYTES (64u << 20) /* per session */
/* Highest string id a session may define. The table is indexed by id, so this bounds its
 * size (16 bytes an id) whatever a peer sends; the library caps its table at 2^20 names
 * (KPI_INTERN_MAX_ENTRIES), so its ids stay below this even with raced-out entries. */
#define KP_AGENT_MAX_STRING_ID   (1u << 21)
#define KP_AGENT_TICK_MS         50
#define KP_AGENT_MAX_ALLOW       64
#define KP_AGENT_DEADLINE_MIN_MS 60000
#define KP_AGENT_PUSH_WINDOW     32
/* Reports to collectord: built every tick, published when something but the step ages
 * changed, and at least this often. */
#define KP_AGENT_REPORT_MS 500
/* Captures armed by collectord stay (reported in their final state) until it sends
 * KIND_FORGET, or this long after they finished, at most KP_AGENT_MAX_FINISHED of them. */
#define KP_AGENT_FINISHED_KEEP_MS (10 * 60 * 1000)
#define KP_AGENT_MAX_FINISHED     64
/* collectord refuses a whole report with a rank or world size at or above this
 * (KP_STORE_MAX_WORLD_SIZE): such values are reported as unknown */
#define KP_AGENT_REPORT_MAX_RANK (1 << 20)

enum rank_state {
    RS_ARMED,
    RS_BEGUN,
    RS_DONE,
    RS_FAILED,
};

struct session;

struct cap_rank {
    struct session *s; /* NULL once the process is gone */
    int32_t rank;
    uint32_t pid;
    enum rank_state state;
    bool last_emitted; /* the capture's last batch of this rank is in the spool */
    uint64_t last_seq; /* its seq */
    uint64_t spool_dropped;
    long long deadline_ms; /* CLOCK_MONOTONIC: FAILED if the window has not begun by then, or
                            * (once begun) has not ended by then */
    char reason[300];
    /* reported to collectord (remote captures) */
    uint64_t records;     /* records_in of its batcher, kept once the batcher is gone */
    uint64_t malformed;   /* records its batcher dropped as malformed */
    uint64_t lib_dropped; /* the library's dropped + cupti_dropped in this capture */
    uint64_t spool_rows;  /* rows lost with the batches the spool refused */
    int spool_err;        /* the first spool append error (negative errno) */
    int64_t first_step;   /* the window's, -1 until known */
    int64_t last_step;    /* -1 until WINDOW_END */
    bool stopped;         /* KIND_STOP came before its window began: done, no data */
    int reported;         /* the RankState last reported (0: none yet) */
};

struct capture {
    uint64_t id;
    uint64_t run_id;
    char job[256];
    char name[256];
    bool created_run;      /* the agent created it: it ends it */
    bool remote;           /* armed by collectord (KIND_ARM): reported, kept until KIND_FORGET */
    bool stopped;          /* KIND_STOP received */
    long long finished_ms; /* remote: CLOCK_MONOTONIC when every rank was over; 0: live */
    bool wait;
    bool run_pending;       /* CreateRun in flight */
    bool ending;            /* EndRun in flight, or finished */
    struct session *client; /* the control client waiting for the reply, or NULL */
    int64_t start_step;
    uint32_t steps;
    uint64_t duration_ms;
    uint32_t activities;
    uint32_t world_size;
    size_t n;
    struct cap_rank *ranks;
    struct capture *next;
};

struct strent {
    char *text;
    size_t len;
};

struct session {
    struct kp_agent *a;
    int fd;
    bool hello, ctl;
    uint32_t pid, uid;
    struct kp_wire_hello h;
    uint32_t state;
    int64_t current_step;
    uint64_t records, dropped; /* as the library reports them */
    time_t since;
    long long step_t0_ms;
    long long step_seen_ms; /* when current_step last changed */
    int64_t step0;
    /* strings: id -> text */
    struct strent *strs;
    size_t n_strs; /* capacity of strs (indexed by id) */
    size_t str_bytes;
    uint64_t str_dropped;
    /* capture */
    struct capture *cap;
    size_t cap_idx;
    uint64_t capture_id;
    struct kp_batcher *bat;
    struct session *prev, *next;
};

struct job {
    bool end; /* EndRun; else CreateRun */
    uint64_t capture_id;
    uint64_t run_id;
    bool failed;
    char job[256], name[256];
    uint32_t world_size;
    /* result */
    int rc;
    struct kp_rpc_status st;
    uint64_t result_run;
    struct job *next;
};

struct kp_agent {
    struct kp_agent_config cfg; /* borrowed strings */
    char host[256];
    uint64_t agent_id;
    uint32_t own_uid;
    uint32_t allow[KP_AGENT_MAX_ALLOW];
    size_t n_allow;
    uint32_t refused_logged[KP_AGENT_MAX_ALLOW];
    size_t n_refused_logged;
    unsigned socket_mode;
    int lfd, epfd, evfd, tfd;
    struct session *sessions;
    size_t n_sessions;
    struct capture *caps;
    uint64_t next_capture_id;
    struct kp_spool *spool;
    struct kp_rpc_channel *ch;
    /* Control.Attach (NULL with --attach=false); the report is built by the loop thread */
    struct kp_attach *att;
    long long report_ms; /* CLOCK_MONOTONIC of the last publish */
    uint8_t *report_key; /* the last published report packed with step ages zeroed */
    size_t report_key_len;
    /* uplink */
    pthread_t uplink;
    bool uplink_started;
    _Atomic bool stopping;
    _Atomic uint64_t acked_through; /* every spool seq <= this is acknowledged */
    /* control worker */
    pthread_t worker;
    bool worker_started;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    struct job *todo, *done;
    bool worker_stop;
    struct kp_http *http;
    struct kp_metrics *metrics;
    struct kp_metric *m_sessions, *m_records, *m_dropped_agent, *m_dropped_lib, *m_spooled,
        *m_acked, *m_spool_full, *m_spool_bytes, *m_invalid, *m_captures, *m_refused, *m_malformed,
        *m_rec_malformed, *m_terminal, *m_warmup, *m_attached, *m_commands, *m_commands_dropped,
        *m_reports;
    _Atomic long long loop_ms;
    uint8_t buf[KP_WIRE_MAX_MSG + 8] __attribute__((aligned(8)));
};

/* --- sending --- */

static int send_msg(int fd, enum kp_wire_type type, const void *payload, size_t len, uint32_t count)
{
    uint8_t buf[sizeof(struct kp_wire_hdr) + 8192];
    struct kp_wire_hdr h;

    if (len > sizeof(buf) - sizeof(h)) {
        return -EMSGSIZE;
    }
    kp_wire_hdr_init(&h, type, (uint32_t) len, count);
    memcpy(buf, &h, sizeof(h));
    if (len > 0) {
        memcpy(buf + sizeof(h), payload, len);
    }
    if (send(fd, buf, sizeof(h) + len, MSG_DONTWAIT | MSG_NOSIGNAL) !=
        (ssize_t) (sizeof(h) + len)) {
        return -errno;
    }
    return 0;
}

static void send_welcome(struct kp_agent *a, int fd, bool ok, const char *reason)
{
    struct kp_wire_welcome w;

    memset(&w, 0, sizeof(w));
    w.accepted = ok ? 1 : 0;
    w.agent_id = a->agent_id;
    kp_strlcpy(w.reason, sizeof(w.reason), reason);
    send_msg(fd, KP_W_WELCOME, &w, sizeof(w), 0);
}

static void ctl_reply(struct session *s, int status, const char *text)
{
    uint8_t buf[KP_WIRE_MAX_MSG];
    struct kp_wire_hdr h;
    struct kp_wire_ctl_reply r = { status, 0 };
    size_t n = strlen(text), max = sizeof(buf) - sizeof(h) - sizeof(r);

    if (n > max) {
        n = max;
    }
    kp_wire_hdr_init(&h, KP_W_CTL_REPLY, (uint32_t) (sizeof(r) + n), 0);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), &r, sizeof(r));
    memcpy(buf + sizeof(h) + sizeof(r), text, n);
    if (send(s->fd, buf, sizeof(h) + sizeof(r) + n, MSG_NOSIGNAL) < 0) {
        kp_log_warn("cannot answer a control client err=\"%s\"", strerror(errno));
    }
}

/* Replaces, in place, each byte of s that does not start a valid UTF-8 sequence with '?'
 * (names from processes and truncated reasons go into protobuf strings, which collectord
 * checks). */
static void utf8_clean(char *s)
{
    size_t n = strlen(s), j = 0;

    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char) s[i];
        size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;

        if (len <= n - i && kp_utf8_valid(s + i, len)) {
            memmove(s + j, s + i, len);
            j += len;
            i += len;
        }
        else {
            s[j++] = '?';
            i++;
        }
    }
    s[j] = '\0';
}

/* --- sessions --- */

static const char *session_string(void *ud, uint32_t id, size_t *len)
{
    struct session *s = ud;

    if (id >= s->n_strs || s->strs[id].text == NULL) {
        return NULL;
    }
    *len = s->strs[id].len;
    return s->strs[id].text;
}

static void session_strings(struct kp_agent *a, struct session *s, const uint8_t *p, uint32_t len,
                            uint32_t count)
{
    size_t off = 0;

    for (uint32_t i = 0; i < count; i++) {
        uint32_t e[2];

        memcpy(e, p + off, sizeof(e));
        off += sizeof(e);
        const char *text = (const char *) p + off;
        off += ((size_t) e[1] + 3u) & ~(size_t) 3u;
        if (e[0] > KP_AGENT_MAX_STRING_ID || s->str_bytes + e[1] > KP_AGENT_MAX_STRINGS_BYTES) {
            if (s->str_dropped++ == 0) {
                kp_log_warn("strings table full, names will be empty pid=%u id=%u bytes=%zu",
                            s->pid, e[0], s->str_bytes);
            }
            kp_metric_add(a->m_dropped_agent, 1);
            continue;
        }
        if (e[0] >= s->n_strs) {
            size_t cap = s->n_strs ? s->n_strs : 256;
            struct strent *n;

            while (cap <= e[0]) {
                cap *= 2;
            }
            if ((n = realloc(s->strs, cap * sizeof(*n))) == NULL) {
                s->str_dropped++;
                continue;
            }
            memset(n + s->n_strs, 0, (cap - s->n_strs) * sizeof(*n));
            s->strs = n;
            s->n_strs = cap;
        }
        char *t = malloc((size_t) e[1] + 1);
        if (t == NULL) {
            s->str_dropped++;
            continue;
        }
        memcpy(t, text, e[1]);
        t[e[1]] = '\0';
        size_t tlen = e[1];
        char *dm = kp_demangle(t, tlen, &tlen); /* a mangled kernel name, as Kineto shows it */
        if (dm != NULL) {
            free(t);
            t = dm;
        }
        else {
            tlen = e[1];
        }
        if (s->strs[e[0]].text != NULL) {
            s->str_bytes -= s->strs[e[0]].len;
            free(s->strs[e[0]].text);
        }
        s->strs[e[0]].text = t;
        s->strs[e[0]].len = tlen;
        s->str_bytes += tlen;
    }
    (void) len;
}

static struct capture *capture_find(struct kp_agent *a, uint64_t id)
{
    for (struct capture *c = a->caps; c != NULL; c = c->next) {
        if (c->id == id) {
            return c;
        }
    }
    return NULL;
}

/* Keeps the counters of a rank's batcher before it is destroyed (and while it lives). */
static void rank_note_batcher(struct cap_rank *r, const struct kp_batcher *b)
{
    struct kp_batcher_stats bs;

    kp_batcher_get_stats(b, &bs);
    r->records = bs.records_in;
    r->malformed = bs.malformed;
}

static void rank_fail(struct kp_agent *a, struct capture *c, size_t i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Marks rank slot i of c FAILED (once) with a reason and ends its batcher. */
static void rank_fail(struct kp_agent *a, struct capture *c, size_t i, const char *fmt, ...)
{
    struct cap_rank *r = &c->ranks[i];
    va_list ap;

    if (r->state == RS_DONE || r->state == RS_FAILED) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
    r->state = RS_FAILED;
    kp_log_warn("capture rank failed run=%" PRIu64 " rank=%d pid=%u reason=\"%s\"", c->run_id,
                r->rank, r->pid, r->reason);
    if (r->s != NULL && r->s->bat != NULL) {
        /* keep what was captured: the decided rows and the final stats */
        kp_batcher_window_end(r->s->bat, NULL);
        rank_note_batcher(r, r->s->bat);
        kp_batcher_destroy(r->s->bat);
        r->s->bat = NULL;
    }
}

static void session_close(struct kp_agent *a, struct session *s)
{
    if (s->cap != NULL) {
        struct capture *c = s->cap;
        struct cap_rank *r = &c->ranks[s->cap_idx];

        if (r->state == RS_BEGUN) {
            rank_fail(a, c, s->cap_idx,
                      "process %u (rank %d) exited or closed its connection during the window",
                      s->pid, r->rank);
        }
        else if (r->state == RS_ARMED) {
            rank_fail(a, c, s->cap_idx,
                      "process %u (rank %d) exited or closed its connection while armed, before "
                      "its window began",
                      s->pid, r->rank);
        }
        r->s = NULL;
        s->cap = NULL;
    }
    for (struct capture *c = a->caps; c != NULL; c = c->next) {
        if (c->client == s) {
            c->client = NULL;
        }
    }
    kp_batcher_destroy(s->bat);
    epoll_ctl(a->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    if (s->hello) {
        kp_log_info("process gone pid=%u job=%s rank=%d", s->pid, s->h.job, s->h.rank);
    }
    for (size_t i = 0; i < s->n_strs; i++) {
        free(s->strs[i].text);
    }
    free(s->strs);
    if (s->prev != NULL) {
        s->prev->next = s->next;
    }
    else {
        a->sessions = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    }
    a->n_sessions--;
    kp_metric_set(a->m_sessions, (int64_t) a->n_sessions);
    free(s);
}

static bool uid_allowed(const struct kp_agent *a, uint32_t uid)
{
    if (uid == 0 || uid == a->own_uid) {
        return true;
    }
    for (size_t i = 0; i < a->n_allow; i++) {
        if (a->allow[i] == uid) {
            return true;
        }
    }
    return false;
}

static void on_accept(struct kp_agent *a)
{
    for (;;) {
        struct ucred cr;
        socklen_t crl = sizeof(cr);
        struct epoll_event ev;
        struct session *s;
        int fd = accept4(a->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                kp_log_warn("accept failed err=\"%s\"", strerror(errno));
            }
            return;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) != 0) {
            close(fd);
            continue;
        }
        if (!uid_allowed(a, cr.uid)) {
            char why[256];
            bool logged = false;

            snprintf(why, sizeof(why),
                     "uid %u is not allowed by this kprof-agent (add it to --allow-uid)", cr.uid);
            send_welcome(a, fd, false, why);
            close(fd);
            kp_metric_add(a->m_refused, 1);
            for (size_t i = 0; i < a->n_refused_logged; i++) {
                logged |= a->refused_logged[i] == cr.uid;
            }
            if (!logged) {
                kp_log_warn("connection refused pid=%d uid=%u reason=\"not in --allow-uid\"",
                            (int) cr.pid, cr.uid);
                if (a->n_refused_logged < KP_AGENT_MAX_ALLOW) {
                    a->refused_logged[a->n_refused_logged++] = cr.uid;
                }
            }
            continue;
        }
        if (a->n_sessions >= (size_t) a->cfg.max_sessions) {
            send_welcome(a, fd, false,
                         "too many processes connected to this kprof-agent (raise --max-sessions)");
            close(fd);
            kp_metric_add(a->m_refused, 1);
            continue;
        }
        if ((s = calloc(1, sizeof(*s))) == NULL) {
            close(fd);
            continue;
        }
        s->a = a;
        s->fd = fd;
        s->pid = (uint32_t) cr.pid;
        s->uid = cr.uid;
        s->since = time(NULL);
        s->current_step = -1;
        s->step0 = -1;
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN;
        ev.data.ptr = s;
        if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(s);
            continue;
        }
        s->next = a->sessions;
        if (a->sessions != NULL) {
            a->sessions->prev = s;
        }
        a->sessions = s;
        a->n_sessions++;
        kp_metric_set(a->m_sessions, (int64_t) a->n_sessions);
    }
}

/* Updates the step estimate from a current step report. */
static void note_step(struct session *s, int64_t step)
{
    if (step < 0) {
        return;
    }
    if (s->step0 < 0 || step < s->step0) {
        s->step0 = step; /* first report, or the counter went back (a restarted process) */
        s->step_t0_ms = kp_mono_ms();
    }
    if (step != s->current_step) {
        s->step_seen_ms = kp_mono_ms();
    }
    s->current_step = step;
}

/* Observed milliseconds per step (0 while unknown). */
static long long step_ms(const struct session *s)
{
    if (s->step0 < 0 || s->current_step <= s->step0) {
        return 0;
    }
    return (s->step_seen_ms - s->step_t0_ms) / (s->current_step - s->step0);
}

/* The step the process is most likely at now: its last report (heartbeats come once a second,
 * a fast job steps many times in between) moved on by the observed step rate. */
static int64_t step_now(const struct session *s)
{
    long long ms = step_ms(s);

    if (s->current_step < 0 || ms <= 0) {
        return s->current_step;
    }
    return s->current_step + (int64_t) ((kp_mono_ms() - s->step_seen_ms) / ms);
}

/* --- the batcher's sink: the spool --- */

/* The batcher's emit callback (ud: the session): appends to the spool. */
static int emit_batch(void *ud, const uint8_t *buf, size_t len, size_t rows, bool last)
{
    struct session *s = ud;
    struct kp_agent *a = s->a;
    struct capture *c = s->cap;
    uint64_t seq = 0;
    int rc = kp_spool_append(a->spool, buf, len, &seq);

    if (rc != 0) {
        kp_metric_add(a->m_spool_full, 1);
        kp_metric_add(a->m_dropped_agent, (int64_t) rows);
        if (c != NULL) {
            struct cap_rank *r = &c->ranks[s->cap_idx];

            r->spool_rows += rows;
            if (r->spool_err == 0) {
                r->spool_err = rc;
            }
            if (r->spool_dropped++ == 0) {
                kp_log_error("spool full, batch dropped run=%" PRIu64 " rank=%d rows=%zu "
                             "err=\"%s\" (is collectord reachable? raise --spool-max-bytes)",
                             c->run_id, r->rank, rows, strerror(-rc));
            }
        }
        return rc;
    }
    kp_metric_add(a->m_spooled, 1);
    if (last && c != NULL) {
        c->ranks[s->cap_idx].last_emitted = true;
        c->ranks[s->cap_idx].last_seq = seq;
    }
    kp_log_debug("batch spooled seq=%" PRIu64 " rows=%zu bytes=%zu last=%d", seq, rows, len,
                 (int) last);
    return 0;
}

/* --- captures --- */

static void capture_free(struct kp_agent *a, struct capture *c)
{
    struct capture **pp = &a->caps;

    while (*pp != NULL && *pp != c) {
        pp = &(*pp)->next;
    }
    if (*pp == c) {
        *pp = c->next;
    }
    for (size_t i = 0; i < c->n; i++) {
        struct session *s = c->ranks[i].s;

        if (s != NULL && s->cap == c) {
            if (s->bat != NULL) {
                kp_batcher_destroy(s->bat);
                s->bat = NULL;
            }
            s->cap = NULL;
        }
    }
    free(c->ranks);
    free(c);
}

static void post_job(struct kp_agent *a, struct job *j)
{
    pthread_mutex_lock(&a->mu);
    j->next = NULL;
    struct job **pp = &a->todo;
    while (*pp != NULL) {
        pp = &(*pp)->next;
    }
    *pp = j;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mu);
}

static void capture_text(const struct capture *c, struct kp_strbuf *sb, bool results)
{
    kp_strbuf_appendf(sb, "run_id=%" PRIu64 "\nranks=", c->run_id);
    for (size_t i = 0; i < c->n; i++) {
        kp_strbuf_appendf(sb, "%s%d", i ? "," : "", c->ranks[i].rank);
    }
    kp_strbuf_appendf(sb, "\nstart_step=%" PRId64 "\nsteps=%u\n", c->start_step, c->steps);
    if (results) {
        bool failed = false;

        for (size_t i = 0; i < c->n; i++) {
            failed |= c->ranks[i].state == RS_FAILED;
        }
        kp_strbuf_appendf(sb, "result=%s\n", failed ? "failed" : "ok");
        for (size_t i = 0; i < c->n; i++) {
            if (c->ranks[i].state == RS_FAILED) {
                kp_strbuf_appendf(sb, "rank.%d=failed: %s\n", c->ranks[i].rank, c->ranks[i].reason);
            }
            else if (c->ranks[i].spool_dropped > 0) {
                kp_strbuf_appendf(sb, "rank.%d=done: %" PRIu64 " batches dropped (spool full)\n",
                                  c->ranks[i].rank, c->ranks[i].spool_dropped);
            }
            else {
                kp_strbuf_appendf(sb, "rank.%d=done\n", c->ranks[i].rank);
            }
        }
    }
}

static bool capture_failed(const struct capture *c)
{
    for (size_t i = 0; i < c->n; i++) {
        if (c->ranks[i].state == RS_FAILED) {
            return true;
        }
    }
    return false;
}

/* Replies to the waiting client (if any) and frees the capture. */
static void capture_finish(struct kp_agent *a, struct capture *c, const char *extra)
{
    if (c->client != NULL) {
        struct kp_strbuf sb;

        kp_strbuf_init(&sb, KP_WIRE_MAX_MSG - 64);
        capture_text(c, &sb, true);
        if (extra != NULL) {
            kp_strbuf_appendf(&sb, "%s\n", extra);
        }
        ctl_reply(c->client, capture_failed(c) ? KP_CTL_FAILED : KP_CTL_OK, sb.data ? sb.data : "");
        kp_strbuf_fini(&sb);
        session_close(a, c->client);
    }
    kp_log_info("capture complete run=%" PRIu64 " ranks=%zu failed=%d", c->run_id, c->n,
                (int) capture_failed(c));
    capture_free(a, c);
}

/* How long a begun window may take to end: --window-timeout, else a minute, stretched for
 * slow steps (twice the expected window, plus slack) and for long time windows. */
static long long window_budget_ms(const struct kp_agent *a, const struct capture *c,
                                  const struct session *s)
{
    long long budget = KP_AGENT_DEADLINE_MIN_MS, st_ms = step_ms(s);

    if (a->cfg.window_timeout_ms > 0) {
        return a->cfg.window_timeout_ms;
    }
    if (c->steps > 0 && st_ms > 0 && 2 * ((long long) c->steps + 5) * st_ms > budget) {
        budget = 2 * ((long long) c->steps + 5) * st_ms;
    }
    if (c->duration_ms > 0 && (long long) c->duration_ms + KP_AGENT_DEADLINE_MIN_MS > budget) {
        budget = (long long) c->duration_ms + KP_AGENT_DEADLINE_MIN_MS;
    }
    return budget;
}

/* A rank of a remote capture is over (done or failed, its batcher gone): its process may join
 * another capture at once, while the capture keeps the rank's final state for the reports. */
static void rank_release(struct capture *c, size_t i)
{
    struct cap_rank *r = &c->ranks[i];

    if (r->s != NULL && r->s->cap == c && r->s->cap_idx == i) {
        r->s->cap = NULL;
    }
    r->s = NULL;
}

/* Called on every tick: deadlines, and the end of captures whose ranks are all over. */
static void capture_check(struct kp_agent *a, struct capture *c)
{
    uint64_t acked = atomic_load(&a->acked_through);
    long long now = kp_mono_ms();
    bool over = true;

    if (c->run_pending || c->ending || c->finished_ms != 0) {
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        struct cap_rank *r = &c->ranks[i];

        if (r->state == RS_ARMED && now >= r->deadline_ms) {
            rank_fail(a, c, i,
                      "rank %d did not begin its window (step %" PRId64
                      ") in time: current step %" PRId64
                      "; is the training loop running and is the kprof step hook active?",
                      r->rank, c->start_step, r->s != NULL ? r->s->current_step : -1);
            if (r->s != NULL) {
                struct kp_wire_disarm d = { r->s->capture_id };

                send_msg(r->s->fd, KP_W_DISARM, &d, sizeof(d), 0);
            }
        }
        if (r->state == RS_BEGUN && now >= r->deadline_ms) {
            rank_fail(a, c, i,
                      "rank %d began its window (step %" PRId64
                      ") but did not end it in time (now at step %" PRId64
                      "): the training loop may be stuck or the process too busy to drain; "
                      "the rows received so far are kept",
                      r->rank, c->start_step, r->s != NULL ? r->s->current_step : -1);
            if (r->s != NULL) {
                struct kp_wire_disarm d = { r->s->capture_id };

                send_msg(r->s->fd, KP_W_DISARM, &d, sizeof(d), 0);
            }
        }
        if (r->state == RS_ARMED || r->state == RS_BEGUN) {
            over = false;
        }
        else {
            if (r->last_emitted && r->last_seq > acked) {
                over = false; /* not yet acknowledged by collectord */
            }
            if (c->remote) {
                rank_release(c, i);
            }
        }
    }
    if (!over) {
        return;
    }
    if (c->remote) {
        /* kept, so that reports keep telling the ranks' final states, until collectord
         * forgets it (or captures_expire) */
        bool failed = false;

        for (size_t i = 0; i < c->n; i++) {
            /* a rank whose last batch the spool refused is reported FAILED too */
            failed |= c->ranks[i].state == RS_FAILED ||
                      (!c->ranks[i].stopped && !c->ranks[i].last_emitted);
        }
        c->finished_ms = now;
        kp_log_info("capture complete run=%" PRIu64 " ranks=%zu failed=%d", c->run_id, c->n,
                    (int) failed);
        return;
    }
    if (c->created_run) {
        struct job *j = calloc(1, sizeof(*j));

        if (j != NULL) {
            j->end = true;
            j->capture_id = c->id;
            j->run_id = c->run_id;
            j->failed = capture_failed(c);
            c->ending = true;
            post_job(a, j);
            return;
        }
    }
    capture_finish(a, c, NULL);
}

/* Arms every rank of c (the run id is known). */
static void capture_arm(struct kp_agent *a, struct capture *c)
{
    long long now = kp_mono_ms();

    for (size_t i = 0; i < c->n; i++) {
        struct cap_rank *r = &c->ranks[i];
        struct session *s = r->s;
        struct kp_batcher_opts o;
        struct kp_wire_arm arm;
        long long st_ms, wait_ms;
        int rc;

        r->first_step = -1;
        r->last_step = -1;
        if (s == NULL) {
            rank_fail(a, c, i, "process %u disconnected before the capture was armed", r->pid);
            continue;
        }
        memset(&o, 0, sizeof(o));
        o.run_id = c->run_id;
        o.rank = (uint32_t) (r->rank >= 0 ? r->rank : 0);
        o.job = s->h.job;
        o.host = s->h.host[0] ? s->h.host : a->host;
        o.pid = s->pid;
        o.local_rank = (uint32_t) (s->h.local_rank >= 0 ? s->h.local_rank : 0);
        o.world_size = c->world_size;
        o.device = s->h.device;
        o.target_step = c->start_step;
        o.n_steps = c->steps;
        o.activities = c->activities;
        o.batch_rows = (size_t) a->cfg.batch_rows;
        o.batch_ms = a->cfg.batch_ms;
        o.strings = session_string;
        o.emit = emit_batch;
        o.ud = s;
        if ((rc = kp_batcher_create(&o, &s->bat)) != 0) {
            rank_fail(a, c, i, "cannot start the batcher: %s", strerror(-rc));
            continue;
        }
        st_ms = step_ms(s);
        wait_ms = KP_AGENT_DEADLINE_MIN_MS;
        if (st_ms > 0 && c->start_step >= 0) {
            long long steps = c->start_step - (s->current_step > 0 ? s->current_step : 0) +
                              (long long) c->steps + 10;

            if (steps * st_ms > wait_ms) {
                wait_ms = steps * st_ms;
            }
        }
        r->deadline_ms = now + wait_ms;
        s->capture_id = ++a->next_capture_id;
        memset(&arm, 0, sizeof(arm));
        arm.capture_id = s->capture_id;
        arm.run_id = c->run_id;
        arm.target_step = c->start_step;
        arm.n_steps = c->steps;
        arm.activities = c->activities;
        arm.duration_ms = c->duration_ms;
        arm.deadline_ns = (uint64_t) (kp_real_ns() + (int64_t) wait_ms * 1000000);
        if ((rc = send_msg(s->fd, KP_W_ARM, &arm, sizeof(arm), 0)) != 0) {
            rank_fail(a, c, i, "cannot send ARM to process %u: %s", s->pid, strerror(-rc));
            continue;
        }
        kp_log_info("rank armed run=%" PRIu64 " rank=%d pid=%u start_step=%" PRId64
                    " steps=%u duration_ms=%" PRIu64,
                    c->run_id, r->rank, s->pid, c->start_step, c->steps, c->duration_ms);
    }
    kp_metric_add(a->m_captures, 1);
    if (!c->wait && c->client != NULL) {
        struct kp_strbuf sb;

        kp_strbuf_init(&sb, KP_WIRE_MAX_MSG - 64);
        capture_text(c, &sb, false);
        ctl_reply(c->client, KP_CTL_OK, sb.data ? sb.data : "");
        kp_strbuf_fini(&sb);
        session_close(a, c->client);
        c->client = NULL;
    }
}

/* --- control requests --- */

struct kv {
    const char *verb, *job, *ranks, *run, *start_step, *steps, *duration_ms, *activities, *name,
        *wait;
};

static int parse_kv(char *text, struct kv *kv, char *err, size_t errlen)
{
    char *save = NULL;

    memset(kv, 0, sizeof(*kv));
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');

        if (eq == NULL) {
            snprintf(err, errlen, "error=bad request line \"%.100s\" (want key=value)", line);
            return -EINVAL;
        }
        *eq = '\0';
        const char *v = eq + 1;
#define KEY(k)                   \
    if (strcmp(line, #k) == 0) { \
        kv->k = v;               \
        continue;                \
    }
        KEY(verb)
        KEY(job)
        KEY(ranks)
        KEY(run)
        KEY(start_step)
        KEY(steps)
        KEY(duration_ms)
        KEY(activities)
        KEY(name)
        KEY(wait)
#undef KEY
        snprintf(err, errlen, "error=unknown request key \"%.100s\"", line);
        return -EINVAL;
    }
    return 0;
}

static bool parse_i64(const char *s, long long min, long long max, long long *out)
{
    char *end;

    if (s == NULL || *s == '\0') {
        return false;
    }
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) {
        return false;
    }
    *out = v;
    return true;
}

static void ctl_ps(struct kp_agent *a, struct session *client)
{
    struct kp_strbuf sb;

    kp_strbuf_init(&sb, KP_WIRE_MAX_MSG - 64);
    for (struct session *s = a->sessions; s != NULL; s = s->next) {
        char job[256];

        if (!s->hello) {
            continue;
        }
        kp_strlcpy(job, sizeof(job), s->h.job[0] ? s->h.job : "-");
        for (char *p = job; *p; p++) {
            if (*p == ' ' || *p == '\n' || *p == '=') {
                *p = '_';
            }
        }
        kp_strbuf_appendf(&sb,
                          "pid=%u job=%s rank=%d local_rank=%d world=%d device=%d state=%s "
                          "step=%" PRId64 " records=%" PRIu64 " dropped=%" PRIu64 " since=%lld\n",
                          s->pid, job, s->h.rank, s->h.local_rank, s->h.world_size, s->h.device,
                          s->cap != NULL && s->cap->ranks[s->cap_idx].state == RS_FAILED
                              ? "failed"
                              : kp_wire_state_name(s->state),
                          s->current_step, s->records, s->dropped, (long long) s->since);
    }
    ctl_reply(client, KP_CTL_OK, sb.data ? sb.data : "");
    kp_strbuf_fini(&sb);
}

#define MAX_RANKS 65536

static void ctl_capture(struct kp_agent *a, struct session *client, const struct kv *kv)
{
    char err[1200];
    const char *job = kv->job;
    struct capture *c = NULL;
    uint8_t *sel = NULL;
    bool all;
    long long v;
    int status = KP_CTL_USAGE, rc;
    uint32_t world = 0;
    size_t n = 0;

    /* which job */
    if (job == NULL || *job == '\0') {
        const char *first = NULL;
        bool several = false;

        for (struct session *s = a->sessions; s != NULL; s = s->next) {
            if (!s->hello) {
                continue;
            }
            if (first == NULL) {
                first = s->h.job;
            }
            else if (strcmp(first, s->h.job) != 0) {
                several = true;
            }
        }
        if (first == NULL) {
            status = KP_CTL_NOT_FOUND;
            snprintf(err, sizeof(err),
                     "error=no process is registered on this agent (start the job with "
                     "kprof-run, or check CUDA_INJECTION64_PATH)");
            goto fail;
        }
        if (several) {
            struct kp_strbuf sb;

            kp_strbuf_init(&sb, 900);
            for (struct session *s = a->sessions; s != NULL; s = s->next) {
                if (s->hello && (sb.data == NULL || strstr(sb.data, s->h.job) == NULL)) {
                    kp_strbuf_appendf(&sb, "%s%s", sb.len ? ", " : "", s->h.job);
                }
            }
            snprintf(err, sizeof(err),
                     "error=processes of several jobs are registered (%s); pick one with --job",
                     sb.data ? sb.data : "");
            kp_strbuf_fini(&sb);
            goto fail;
        }
        job = first;
    }
    for (struct session *s = a->sessions; s != NULL; s = s->next) {
        if (s->hello && strcmp(s->h.job, job) == 0) {
            n++;
            if (s->h.world_size > 0 && (uint32_t) s->h.world_size > world) {
                world = (uint32_t) s->h.world_size;
            }
        }
    }
    if (n == 0) {
        struct kp_strbuf sb;

        kp_strbuf_init(&sb, 900);
        for (struct session *s = a->sessions; s != NULL; s = s->next) {
            if (s->hello && (sb.data == NULL || strstr(sb.data, s->h.job) == NULL)) {
                kp_strbuf_appendf(&sb, "%s%s", sb.len ? ", " : "", s->h.job);
            }
        }
        status = KP_CTL_NOT_FOUND;
        snprintf(err, sizeof(err),
                 "error=no process of job %.256s is registered on this agent; registered jobs: "
                 "%s",
                 job, sb.data && sb.len ? sb.data : "(none)");
        kp_strbuf_fini(&sb);
        goto fail;
    }
    if (world == 0) {
        world = (uint32_t) n;
    }
    if ((sel = calloc(MAX_RANKS, sizeof(*sel))) == NULL) {
        snprintf(err, sizeof(err), "error=out of memory");
        status = KP_CTL_FAILED;
        goto fail;
    }
    rc = kp_ranks_parse(kv->ranks, world < MAX_RANKS ? world : MAX_RANKS, sel, &all, NULL);
    if (rc == -ERANGE) {
        snprintf(err, sizeof(err),
                 "error=ranks %.100s: outside the job's world size %u (ranks are 0..%u)", kv->ranks,
                 world, world - 1);
        goto fail;
    }
    if (rc != 0) {
        snprintf(err, sizeof(err), "error=ranks %.100s: not a list (use all, or e.g. 0,2-3)",
                 kv->ranks);
        goto fail;
    }
    if ((c = calloc(1, sizeof(*c))) == NULL || (c->ranks = calloc(n, sizeof(*c->ranks))) == NULL) {
        snprintf(err, sizeof(err), "error=out of memory");
        status = KP_CTL_FAILED;
        goto fail;
    }
    c->world_size = world;
    kp_strlcpy(c->job, sizeof(c->job), job);
    kp_strlcpy(c->name, sizeof(c->name), kv->name ? kv->name : "");
    for (struct session *s = a->sessions; s != NULL; s = s->next) {
        int32_t rank;

        if (!s->hello || strcmp(s->h.job, job) != 0) {
            continue;
        }
        rank = s->h.rank >= 0 ? s->h.rank : 0;
        if (!all && (rank >= MAX_RANKS || !sel[rank])) {
            continue;
        }
        if (s->cap != NULL) {
            status = KP_CTL_BUSY;
            snprintf(err, sizeof(err),
                     "error=rank %d (pid %u) is already capturing for run %" PRIu64
                     "; wait for it to finish",
                     rank, s->pid, s->cap->run_id);
            goto fail;
        }
        c->ranks[c->n].s = s;
        c->ranks[c->n].rank = rank;
        c->ranks[c->n].pid = s->pid;
        c->n++;
        if (rank < MAX_RANKS) {
            sel[rank] = 0; /* found */
        }
    }
    if (!all) {
        for (uint32_t r = 0; r < world && r < MAX_RANKS; r++) {
            if (sel[r]) {
                status = KP_CTL_NOT_FOUND;
                snprintf(err, sizeof(err),
                         "error=rank %u of job %.256s is not registered on this agent (see "
                         "kprof-agent ps; it may run on another node)",
                         r, job);
                goto fail;
            }
        }
    }
    /* window */
    c->steps = KP_CTL_DEFAULT_STEPS;
    if (kv->steps != NULL) {
        if (!parse_i64(kv->steps, 1, 100000, &v)) {
            snprintf(err, sizeof(err), "error=steps %.50s: want 1..100000", kv->steps);
            goto fail;
        }
        c->steps = (uint32_t) v;
    }
    if (kv->duration_ms != NULL) {
        if (!parse_i64(kv->duration_ms, 1, 3600000, &v)) {
            snprintf(err, sizeof(err), "error=duration_ms %.50s: want 1..3600000", kv->duration_ms);
            goto fail;
        }
        c->duration_ms = (uint64_t) v;
        if (kv->steps == NULL) {
            c->steps = 0; /* a time window */
        }
    }
    c->activities = KP_ACT_DEFAULT;
    if (kv->activities != NULL) {
        const char *bad = NULL;

        if (kp_wire_parse_activities(kv->activities, &c->activities, &bad) != 0) {
            snprintf(err, sizeof(err),
                     "error=activities: unknown \"%.50s\" (use kernel,memcpy,memset,runtime,nvtx,"
                     "sync,overhead or all)",
                     bad ? bad : "");
            goto fail;
        }
    }
    if (kv->start_step != NULL) {
        if (!parse_i64(kv->start_step, 0, INT64_MAX / 2, &v)) {
            snprintf(err, sizeof(err), "error=start_step %.50s: want a step number >= 0",
                     kv->start_step);
            goto fail;
        }
        c->start_step = v;
    }
    else if (c->steps > 0) {
        int64_t mx = -1;
        long long fastest_ms = 0;

        for (size_t i = 0; i < c->n; i++) {
            int64_t now = step_now(c->ranks[i].s);
            long long ms = step_ms(c->ranks[i].s);
            if (now > mx) {
                mx = now;
            }
            if (ms > 0 && (fastest_ms == 0 || ms < fastest_ms)) {
                fastest_ms = ms;
            }
        }
        if (mx >= 0) {
            /* Two steps ahead (a warm-up step, then the window), plus what the fastest rank
             * can step while the command travels and the estimate errs: half a second. */
            c->start_step =
                mx + 2 +
                (fastest_ms > 0 ? (500 + fastest_ms - 1) / fastest_ms : KP_CTL_UNKNOWN_RATE_MARGIN);
        }
        else {
            c->start_step = -1; /* no steps known: a time window that starts now */
            c->steps = 0;
            if (c->duration_ms == 0) {
                c->duration_ms = KP_CTL_DEFAULT_DURATION_MS;
            }
        }
    }
    else {
        c->start_step = -1;
    }
    c->wait = kv->wait != NULL && strcmp(kv->wait, "1") == 0;
    c->client = client;
    c->id = ++a->next_capture_id;
    for (size_t i = 0; i < c->n; i++) {
        c->ranks[i].s->cap = c;
        c->ranks[i].s->cap_idx = i;
        c->ranks[i].state = RS_ARMED;
        c->ranks[i].deadline_ms = kp_mono_ms() + KP_AGENT_DEADLINE_MIN_MS;
    }
    c->next = a->caps;
    a->caps = c;
    free(sel);
    if (kv->run != NULL) {
        if (!parse_i64(kv->run, 1, INT32_MAX, &v)) {
            snprintf(err, sizeof(err), "error=run %.50s: want a run id", kv->run);
            capture_free(a, c);
            ctl_reply(client, KP_CTL_USAGE, err);
            session_close(a, client);
            return;
        }
        c->run_id = (uint64_t) v;
        capture_arm(a, c);
        return;
    }
    struct job *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        capture_free(a, c);
        ctl_reply(client, KP_CTL_FAILED, "error=out of memory");
        session_close(a, client);
        return;
    }
    j->capture_id = c->id;
    kp_strlcpy(j->job, sizeof(j->job), c->job);
    kp_strlcpy(j->name, sizeof(j->name), c->name);
    j->world_size = c->world_size;
    c->run_pending = true;
    post_job(a, j);
    return;
fail:
    free(sel);
    if (c != NULL) {
        free(c->ranks);
        free(c);
    }
    ctl_reply(client, status, err);
    session_close(a, client);
}

static void on_ctl(struct kp_agent *a, struct session *s, const uint8_t *p, uint32_t len)
{
    char text[KP_WIRE_MAX_MSG + 1], err[512];
    struct kv kv;

    s->ctl = true;
    memcpy(text, p, len);
    text[len] = '\0';
    if (parse_kv(text, &kv, err, sizeof(err)) != 0) {
        ctl_reply(s, KP_CTL_USAGE, err);
        session_close(a, s);
        return;
    }
    if (kv.verb != NULL && strcmp(kv.verb, "ps") == 0) {
        ctl_ps(a, s);
        session_close(a, s);
        return;
    }
    if (kv.verb != NULL && strcmp(kv.verb, "capture") == 0) {
        ctl_capture(a, s, &kv); /* replies and closes, now or later */
        return;
    }
    ctl_reply(s, KP_CTL_USAGE, "error=unknown verb (use ps or capture)");
    session_close(a, s);
}

/* Results of the control worker. */
static void on_jobs_done(struct kp_agent *a)
{
    struct job *done;

    pthread_mutex_lock(&a->mu);
    done = a->done;
    a->done = NULL;
    pthread_mutex_unlock(&a->mu);
    while (done != NULL) {
        struct job *j = done;
        struct capture *c = capture_find(a, j->capture_id);

        done = j->next;
        if (c == NULL) {
            free(j);
            continue;
        }
        if (!j->end) {
            c->run_pending = false;
            if (j->rc != 0) {
                char err[900];

                snprintf(err, sizeof(err),
                         "error=cannot create the run: the collector at %s answered %s: %s (is "
                         "kprof-collectord running? set --collector)",
                         a->cfg.collector, kp_rpc_status_name(j->st.code), j->st.details);
                kp_log_warn("CreateRun failed job=%s status=%s details=\"%s\"", c->job,
                            kp_rpc_status_name(j->st.code), j->st.details);
                if (c->client != NULL) {
                    ctl_reply(c->client, KP_CTL_FAILED, err);
                    session_close(a, c->client);
                    c->client = NULL;
                }
                capture_free(a, c);
            }
            else {
                c->run_id = j->result_run;
                c->created_run = true;
                capture_arm(a, c);
            }
        }
        else {
            char extra[700] = "";

            if (j->rc != 0) {
                snprintf(extra, sizeof(extra), "end_run_error=%s: %s",
                         kp_rpc_status_name(j->st.code), j->st.details);
                kp_log_warn("EndRun failed run=%" PRIu64 " status=%s details=\"%s\"", c->run_id,
                            kp_rpc_status_name(j->st.code), j->st.details);
            }
            capture_finish(a, c, extra[0] ? extra : NULL);
        }
        free(j);
    }
}

static void *worker_main(void *arg)
{
    struct kp_agent *a = arg;

    pthread_mutex_lock(&a->mu);
    for (;;) {
        struct job *j;
        ProtobufCMessage *resp = NULL;

        while (a->todo == NULL && !a->worker_stop) {
            pthread_cond_wait(&a->cond, &a->mu);
        }
        if (a->worker_stop) {
            break;
        }
        j = a->todo;
        a->todo = j->next;
        pthread_mutex_unlock(&a->mu);
        memset(&j->st, 0, sizeof(j->st));
        if (j->end) {
            Kprof__V1__EndRunRequest req = KPROF__V1__END_RUN_REQUEST__INIT;

            req.run_id = j->run_id;
            req.failed = j->failed;
            j->rc = kp_rpc_unary(a->ch, "/kprof.v1.Control/EndRun", &req.base,
                                 &kprof__v1__run__descriptor, &resp, 15000, &j->st);
        }
        else {
            Kprof__V1__CreateRunRequest req = KPROF__V1__CREATE_RUN_REQUEST__INIT;

            req.job = j->job;
            req.name = j->name;
            req.world_size = j->world_size;
            req.source = KPROF__V1__RUN_SOURCE__RUN_SOURCE_CAPTURE;
            j->rc = kp_rpc_unary(a->ch, "/kprof.v1.Control/CreateRun", &req.base,
                                 &kprof__v1__run__descriptor, &resp, 15000, &j->st);
            if (j->rc == 0) {
                j->result_run = ((Kprof__V1__Run *) resp)->id;
            }
        }
        if (resp != NULL) {
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        pthread_mutex_lock(&a->mu);
        j->next = a->done;
        a->done = j;
        pthread_mutex_unlock(&a->mu);
        uint64_t one = 1;
        if (write(a->evfd, &one, sizeof(one)) < 0) {
            /* the loop polls jobs on its tick too */
        }
        pthread_mutex_lock(&a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* --- collectord's capture control (Control.Attach) --- */

static const char *cmd_kind_name(int kind)
{
    switch (kind) {
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM:
        return "ARM";
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP:
        return "STOP";
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET:
        return "FORGET";
    default:
        return "UNKNOWN";
    }
}

static const char *rank_state_name(Kprof__V1__RankState st)
{
    switch (st) {
    case KPROF__V1__RANK_STATE__RANK_STATE_PENDING:
        return "PENDING";
    case KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING:
        return "CAPTURING";
    case KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING:
        return "FLUSHING";
    case KPROF__V1__RANK_STATE__RANK_STATE_DONE:
        return "DONE";
    case KPROF__V1__RANK_STATE__RANK_STATE_FAILED:
        return "FAILED";
    default:
        return "UNSPECIFIED";
    }
}

static struct capture *remote_find(struct kp_agent *a, uint64_t run_id)
{
    for (struct capture *c = a->caps; c != NULL; c = c->next) {
        if (c->remote && c->run_id == run_id) {
            return c;
        }
    }
    return NULL;
}

static void send_disarm(struct cap_rank *r)
{
    if (r->s != NULL) {
        struct kp_wire_disarm d = { r->s->capture_id };

        send_msg(r->s->fd, KP_W_DISARM, &d, sizeof(d), 0);
    }
}

/* The session of rank `rank` of `job`: an idle one if there are several (a restarted process
 * whose old connection lingers), else the newest. NULL if none is registered. */
static struct session *rank_session(struct kp_agent *a, const char *job, int32_t rank)
{
    struct session *found = NULL;

    for (struct session *s = a->sessions; s != NULL; s = s->next) {
        if (!s->hello || strcmp(s->h.job, job) != 0 || (s->h.rank >= 0 ? s->h.rank : 0) != rank) {
            continue;
        }
        if (s->cap == NULL) {
            return s;
        }
        if (found == NULL) {
            found = s;
        }
    }
    return found;
}

/* KIND_ARM: a remote capture of cmd->ranks of cmd->job, armed at once. */
static void cmd_arm(struct kp_agent *a, const Kprof__V1__CaptureCommand *cmd)
{
    const char *job = cmd->job != NULL ? cmd->job : "";
    long long now = kp_mono_ms();
    struct capture *c;
    uint32_t world = 0;

    for (c = a->caps; c != NULL; c = c->next) {
        if (c->run_id == cmd->run_id) {
            /* collectord resends its arms after a reconnect */
            kp_log_info("capture command ignored: run %" PRIu64 " already has a capture here",
                        cmd->run_id);
            return;
        }
    }
    if (cmd->run_id == 0 || cmd->n_ranks == 0) {
        kp_log_warn("capture command ignored: ARM without a run id or ranks run=%" PRIu64
                    " ranks=%zu",
                    cmd->run_id, cmd->n_ranks);
        return;
    }
    if ((c = calloc(1, sizeof(*c))) == NULL ||
        (c->ranks = calloc(cmd->n_ranks, sizeof(*c->ranks))) == NULL) {
        kp_log_error("capture command dropped: out of memory run=%" PRIu64, cmd->run_id);
        free(c);
        return;
    }
    c->id = ++a->next_capture_id;
    c->run_id = cmd->run_id;
    c->remote = true;
    kp_strlcpy(c->job, sizeof(c->job), job);
    c->start_step = cmd->start_step >= 0 ? cmd->start_step : -1;
    c->steps = cmd->steps;
    c->duration_ms = cmd->duration_ms;
    c->activities = cmd->activities != 0 ? cmd->activities : KP_ACT_DEFAULT;
    if (c->steps == 0 && c->duration_ms == 0) {
        c->duration_ms = KP_CTL_DEFAULT_DURATION_MS; /* a window needs an end */
    }
    for (size_t k = 0; k < cmd->n_ranks; k++) {
        int32_t rank = cmd->ranks[k];
        struct cap_rank *r = &c->ranks[c->n];
        struct session *s;
        bool dup = false;

        for (size_t j = 0; j < c->n; j++) {
            dup |= c->ranks[j].rank == rank;
        }
        if (dup) {
            continue;
        }
        r->rank = rank;
        r->first_step = -1;
        r->last_step = -1;
        r->deadline_ms = now + KP_AGENT_DEADLINE_MIN_MS;
        s = rank_session(a, job, rank);
        if (s == NULL) {
            r->state = RS_FAILED;
            snprintf(r->reason, sizeof(r->reason),
                     "rank %d of job %.100s is not registered on the agent on host %.100s (pid "
                     "gone?)",
                     rank, job, a->host);
        }
        else if (s->cap != NULL) {
            r->state = RS_FAILED;
            r->pid = s->pid;
            snprintf(r->reason, sizeof(r->reason), "rank %d is already capturing for run %" PRIu64,
                     rank, s->cap->run_id);
        }
        else {
            r->state = RS_ARMED;
            r->s = s;
            r->pid = s->pid;
            s->cap = c;
            s->cap_idx = c->n;
            if (s->h.world_size > 0 && (uint32_t) s->h.world_size > world) {
                world = (uint32_t) s->h.world_size;
            }
        }
        if (r->state == RS_FAILED) {
            kp_log_warn("capture rank failed run=%" PRIu64 " rank=%d pid=%u reason=\"%s\"",
                        c->run_id, r->rank, r->pid, r->reason);
        }
        c->n++;
    }
    c->world_size = cmd->world_size != 0 ? cmd->world_size : world != 0 ? world : (uint32_t) c->n;
    c->next = a->caps;
    a->caps = c;
    capture_arm(a, c);
}

/* KIND_STOP: armed ranks are disarmed and done (nothing captured); begun ranks are disarmed,
 * and the library ends their window (WINDOW_END makes them done as usual). */
static void cmd_stop(struct kp_agent *a, const Kprof__V1__CaptureCommand *cmd)
{
    struct capture *c = remote_find(a, cmd->run_id);
    long long now = kp_mono_ms();

    if (c == NULL) {
        kp_log_info("capture command ignored: no capture of run %" PRIu64 " here", cmd->run_id);
        return;
    }
    c->stopped = true; /* the reason is in the command's log line */
    for (size_t i = 0; i < c->n; i++) {
        struct cap_rank *r = &c->ranks[i];

        if (r->state == RS_ARMED) {
            send_disarm(r);
            if (r->s != NULL && r->s->bat != NULL) {
                rank_note_batcher(r, r->s->bat);
                kp_batcher_destroy(r->s->bat);
                r->s->bat = NULL;
            }
            r->state = RS_DONE;
            r->stopped = true;
            snprintf(r->reason, sizeof(r->reason), "stopped before its window began");
        }
        else if (r->state == RS_BEGUN) {
            send_disarm(r);
            if (r->deadline_ms > now + KP_AGENT_DEADLINE_MIN_MS) {
                r->deadline_ms = now + KP_AGENT_DEADLINE_MIN_MS;
            }
        }
    }
}

/* KIND_FORGET: collectord has ended the run; ranks still live are disarmed. */
static void cmd_forget(struct kp_agent *a, const Kprof__V1__CaptureCommand *cmd)
{
    struct capture *c = remote_find(a, cmd->run_id);

    if (c == NULL) {
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        if (c->ranks[i].state == RS_ARMED || c->ranks[i].state == RS_BEGUN) {
            kp_log_warn("capture forgotten while rank %d still captures run=%" PRIu64
                        "; disarmed, its rows so far are kept",
                        c->ranks[i].rank, c->run_id);
            send_disarm(&c->ranks[i]);
        }
    }
    capture_free(a, c);
}

static void cmd_log(const Kprof__V1__CaptureCommand *cmd)
{
    char ranks[256];
    size_t off = 0;

    ranks[0] = '\0';
    for (size_t i = 0; i < cmd->n_ranks; i++) {
        int n = snprintf(ranks + off, sizeof(ranks) - off, "%s%d", i ? "," : "", cmd->ranks[i]);

        if (n < 0 || (size_t) n >= sizeof(ranks) - off) {
            snprintf(ranks + (off < sizeof(ranks) - 8 ? off : sizeof(ranks) - 8), 8, ",...");
            break;
        }
        off += (size_t) n;
    }
    switch (cmd->kind) {
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM:
        kp_log_info("capture command kind=ARM run=%" PRIu64 " job=%s ranks=%s start_step=%" PRId64
                    " steps=%u duration_ms=%" PRIu64 " activities=0x%x world_size=%u",
                    cmd->run_id, cmd->job != NULL ? cmd->job : "", ranks[0] ? ranks : "-",
                    cmd->start_step, cmd->steps, cmd->duration_ms, cmd->activities,
                    cmd->world_size);
        break;
    case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP:
        kp_log_info("capture command kind=STOP run=%" PRIu64 " reason=\"%s\"", cmd->run_id,
                    cmd->reason != NULL ? cmd->reason : "");
        break;
    default:
        kp_log_info("capture command kind=%s run=%" PRIu64, cmd_kind_name(cmd->kind), cmd->run_id);
        break;
    }
}

/* Frees the remote captures finished more than KP_AGENT_FINISHED_KEEP_MS ago, and the oldest
 * finished ones beyond KP_AGENT_MAX_FINISHED. */
static void captures_expire(struct kp_agent *a, long long now)
{
    size_t n = 0;

    for (struct capture *c = a->caps, *next; c != NULL; c = next) {
        next = c->next;
        if (!c->remote || c->finished_ms == 0) {
            continue;
        }
        if (now - c->finished_ms >= KP_AGENT_FINISHED_KEEP_MS) {
            kp_log_info("capture state dropped run=%" PRIu64 " (finished %lld s ago)", c->run_id,
                        (now - c->finished_ms) / 1000);
            capture_free(a, c);
            continue;
        }
        n++;
    }
    while (n > KP_AGENT_MAX_FINISHED) {
        struct capture *oldest = NULL;

        for (struct capture *c = a->caps; c != NULL; c = c->next) {
            if (c->remote && c->finished_ms != 0 &&
                (oldest == NULL || c->finished_ms < oldest->finished_ms)) {
                oldest = c;
            }
        }
        capture_free(a, oldest);
        n--;
    }
}

/* The state of a remote capture's rank as reported to collectord; reason (len bytes) gets
 * the text for FAILED and DONE-with-a-note, else "". */
static Kprof__V1__RankState rank_report_state(const struct cap_rank *r, uint64_t acked,
                                              char *reason, size_t len)
{
    reason[0] = '\0';
    switch (r->state) {
    case RS_ARMED:
        return KPROF__V1__RANK_STATE__RANK_STATE_PENDING;
    case RS_BEGUN:
        return KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING;
    case RS_FAILED:
        snprintf(reason, len, "%s", r->reason);
        return KPROF__V1__RANK_STATE__RANK_STATE_FAILED;
    case RS_DONE:
        break;
    }
    if (r->stopped) {
        snprintf(reason, len, "%s", r->reason);
        return KPROF__V1__RANK_STATE__RANK_STATE_DONE;
    }
    if (!r->last_emitted) {
        /* its last batch never reached the spool: nothing will ever make it DONE */
        if (r->spool_dropped > 0) {
            snprintf(reason, len,
                     "%" PRIu64 " batches (%" PRIu64 " records) of this rank, the last one "
                     "included, were dropped because the agent's spool refused them (%s): is "
                     "collectord reachable? raise --spool-max-bytes",
                     r->spool_dropped, r->spool_rows, strerror(-r->spool_err));
        }
        else {
            snprintf(reason, len, "the last batch of this rank was not stored (see the agent log)");
        }
        return KPROF__V1__RANK_STATE__RANK_STATE_FAILED;
    }
    if (r->spool_dropped > 0) {
        snprintf(reason, len,
                 "%" PRIu64 " batches (%" PRIu64 " records) dropped: the agent's spool refused "
                 "them (raise --spool-max-bytes)",
                 r->spool_dropped, r->spool_rows);
    }
    if (r->last_seq > acked) {
        return KPROF__V1__RANK_STATE__RANK_STATE_FLUSHING;
    }
    return KPROF__V1__RANK_STATE__RANK_STATE_DONE;
}

/* Packs m into a fresh buffer (*out, free). Returns its length, or 0 and *out NULL. */
static size_t pack_alloc(const ProtobufCMessage *m, uint8_t **out)
{
    size_t n = protobuf_c_message_get_packed_size(m);

    if ((*out = malloc(n > 0 ? n : 1)) == NULL) {
        return 0;
    }
    return protobuf_c_message_pack(m, *out);
}

/*
 * Builds the AgentReport (every registered process, every rank of every remote capture),
 * logs the ranks whose reported state changed, and publishes the report when something but
 * the step ages changed, or KP_AGENT_REPORT_MS after the last publish. Loop thread.
 */
static void report_update(struct kp_agent *a, long long now)
{
    Kprof__V1__AgentReport rep = KPROF__V1__AGENT_REPORT__INIT;
    Kprof__V1__AgentProcess *procs = NULL, **pp = NULL;
    Kprof__V1__AgentCaptureRank *ranks = NULL, **rp = NULL;
    char(*reasons)[sizeof(((struct cap_rank *) 0)->reason) + 200] = NULL;
    uint64_t acked = atomic_load(&a->acked_through);
    uint8_t *key = NULL, *full = NULL;
    size_t np = 0, nr = 0, key_len, full_len;
    uint32_t *ages = NULL;

    if (a->att == NULL) {
        return;
    }
    for (struct session *s = a->sessions; s != NULL; s = s->next) {
        np += s->hello;
    }
    for (struct capture *c = a->caps; c != NULL; c = c->next) {
        nr += c->remote ? c->n : 0;
    }
    if ((np > 0 &&
         ((procs = calloc(np, sizeof(*procs))) == NULL || (pp = calloc(np, sizeof(*pp))) == NULL ||
          (ages = calloc(np, sizeof(*ages))) == NULL)) ||
        (nr > 0 &&
         ((ranks = calloc(nr, sizeof(*ranks))) == NULL || (rp = calloc(nr, sizeof(*rp))) == NULL ||
          (reasons = calloc(nr, sizeof(*reasons))) == NULL))) {
        goto out; /* the next tick tries again */
    }
    rep.host = a->host;
    rep.agent_id = a->agent_id;
    rep.version = (char *) KPROF_VERSION;
    np = 0;
    for (struct session *s = a->sessions; s != NULL; s = s->next) {
        Kprof__V1__AgentProcess *p = &procs[np];
        long long ms = step_ms(s);

        if (!s->hello) {
            continue;
        }
        kprof__v1__agent_process__init(p);
        p->job = s->h.job;
        p->rank = s->h.rank >= 0 && s->h.rank < KP_AGENT_REPORT_MAX_RANK ? s->h.rank : -1;
        p->local_rank = s->h.local_rank;
        p->world_size = s->h.world_size > 0 && s->h.world_size <= KP_AGENT_REPORT_MAX_RANK
                            ? (uint32_t) s->h.world_size
                            : 0;
        p->pid = s->pid;
        p->device = s->h.device;
        p->step = s->current_step;
        p->step_ms = ms > 0 ? (ms < UINT32_MAX ? (uint32_t) ms : UINT32_MAX) : 0;
        p->run_id = s->cap != NULL ? s->cap->run_id : 0;
        if (s->current_step >= 0 && now > s->step_seen_ms) {
            long long age = now - s->step_seen_ms;

            ages[np] = age < UINT32_MAX ? (uint32_t) age : UINT32_MAX;
        }
        pp[np] = p;
        np++;
    }
    rep.n_processes = np;
    rep.processes = pp;
    nr = 0;
    for (struct capture *c = a->caps; c != NULL; c = c->next) {
        if (!c->remote) {
            continue;
        }
        for (size_t i = 0; i < c->n; i++) {
            struct cap_rank *r = &c->ranks[i];
            Kprof__V1__AgentCaptureRank *q = &ranks[nr];

            kprof__v1__agent_capture_rank__init(q);
            q->run_id = c->run_id;
            q->rank = r->rank;
            q->pid = r->pid;
            q->state = rank_report_state(r, acked, reasons[nr], sizeof(reasons[nr]));
            utf8_clean(reasons[nr]);
            q->reason = reasons[nr];
            if (r->s != NULL && r->s->cap == c && r->s->bat != NULL) {
                rank_note_batcher(r, r->s->bat);
            }
            q->records = r->records;
            q->dropped = r->lib_dropped + r->malformed + r->spool_rows;
            q->first_step = r->first_step;
            q->last_step = r->last_step;
            if ((int) q->state != r->reported) {
                r->reported = (int) q->state;
                kp_log_info("capture rank state run=%" PRIu64 " rank=%d pid=%u state=%s "
                            "records=%" PRIu64 " dropped=%" PRIu64 " steps=%" PRId64 "..%" PRId64
                            " reason=\"%s\"",
                            c->run_id, r->rank, r->pid, rank_state_name(q->state), q->records,
                            q->dropped, q->first_step, q->last_step, q->reason);
            }
            rp[nr] = q;
            nr++;
        }
    }
    rep.n_ranks = nr;
    rep.ranks = rp;
    /* what changed is judged without the step ages, which move on every tick */
    if ((key_len = pack_alloc(&rep.base, &key)) == 0 && key == NULL) {
        goto out;
    }
    if (a->report_key != NULL && key_len == a->report_key_len &&
        memcmp(key, a->report_key, key_len) == 0 && now - a->report_ms < KP_AGENT_REPORT_MS) {
        goto out;
    }
    for (size_t i = 0; i < np; i++) {
        procs[i].step_age_ms = ages[i];
    }
    if ((full_len = pack_alloc(&rep.base, &full)) == 0 && full == NULL) {
        goto out;
    }
    if (kp_attach_publish(a->att, full, full_len) != 0) {
        goto out;
    }
    free(a->report_key);
    a->report_key = key;
    a->report_key_len = key_len;
    key = NULL;
    a->report_ms = now;
out:
    free(full);
    free(key);
    free(reasons);
    free(rp);
    free(ranks);
    free(ages);
    free(pp);
    free(procs);
}

/* Commands queued by the attach thread. Loop thread. */
static void on_commands(struct kp_agent *a)
{
    Kprof__V1__CaptureCommand *cmd;
    bool any = false;

    if (a->att == NULL) {
        return;
    }
    while ((cmd = kp_attach_take(a->att)) != NULL) {
        cmd_log(cmd);
        switch (cmd->kind) {
        case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_ARM:
            cmd_arm(a, cmd);
            break;
        case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_STOP:
            cmd_stop(a, cmd);
            break;
        case KPROF__V1__CAPTURE_COMMAND__KIND__KIND_FORGET:
            cmd_forget(a, cmd);
            break;
        default:
            kp_log_warn("capture command of unknown kind %d ignored run=%" PRIu64
                        " (a newer collectord?)",
                        (int) cmd->kind, cmd->run_id);
            break;
        }
        protobuf_c_message_free_unpacked(&cmd->base, NULL);
        any = true;
    }
    if (any) {
        report_update(a, kp_mono_ms()); /* the ranks' new states go out at once */
    }
}

/* --- library messages --- */

static bool malformed(struct kp_agent *a, struct session *s, const char *why)
{
    kp_metric_add(a->m_malformed, 1);
    kp_log_warn("malformed message, connection closed pid=%u reason=\"%s\"", s->pid, why);
    session_close(a, s);
    return false;
}

/* Handles one message; returns false if the session was closed. */
static bool on_message(struct kp_agent *a, struct session *s, size_t n)
{
    struct kp_wire_hdr h;
    const uint8_t *p = a->buf + sizeof(h);
    const char *why = NULL;
    struct cap_rank *r = s->cap != NULL ? &s->cap->ranks[s->cap_idx] : NULL;

    if (kp_wire_check(a->buf, n, &why) != 0) {
        return malformed(a, s, why);
    }
    memcpy(&h, a->buf, sizeof(h));
    if (h.type == KP_W_CTL_REQUEST) {
        if (s->hello) {
            return malformed(a, s, "control request on a library connection");
        }
        on_ctl(a, s, p, h.len);
        return false; /* replied and closed, or waiting: either way read no more */
    }
    if (h.type != KP_W_HELLO && !s->hello) {
        if (h.type <= KP_W_STEP) {
            return malformed(a, s, "message before HELLO");
        }
        return true;
    }
    switch (h.type) {
    case KP_W_HELLO: {
        if (s->hello) {
            return malformed(a, s, "second HELLO");
        }
        memcpy(&s->h, p, sizeof(s->h));
        s->h.job[sizeof(s->h.job) - 1] = '\0';
        s->h.host[sizeof(s->h.host) - 1] = '\0';
        s->h.cupti_error[sizeof(s->h.cupti_error) - 1] = '\0';
        utf8_clean(s->h.job);
        utf8_clean(s->h.host);
        s->hello = true;
        note_step(s, s->h.current_step);
        send_welcome(a, s->fd, true, "");
        kp_log_info("process registered pid=%u uid=%u job=%s rank=%d local_rank=%d world=%d "
                    "device=%d cupti=%u%s%s",
                    s->pid, s->uid, s->h.job, s->h.rank, s->h.local_rank, s->h.world_size,
                    s->h.device, s->h.cupti_version, s->h.cupti_error[0] ? " cupti_error=" : "",
                    s->h.cupti_error);
        return true;
    }
    case KP_W_STATUS: {
        struct kp_wire_status st;

        memcpy(&st, p, sizeof(st));
        st.reason[sizeof(st.reason) - 1] = '\0';
        s->state = st.state;
        if (st.device >= 0) {
            s->h.device = st.device;
        }
        note_step(s, st.current_step);
        s->records = st.records;
        s->dropped = st.dropped;
        if (r != NULL && st.capture_id == s->capture_id && s->capture_id != 0) {
            if (s->bat != NULL) {
                kp_batcher_counters(s->bat, st.dropped, st.cupti_dropped, st.overhead_ns);
            }
            r->lib_dropped = st.dropped + st.cupti_dropped;
            if (st.state == KP_ST_FAILED) {
                rank_fail(a, s->cap, s->cap_idx, "%s",
                          st.reason[0] ? st.reason : "the library reported a failure");
            }
            else if (st.state >= KP_ST_CAPTURING && r->state == RS_ARMED) {
                r->state = RS_BEGUN;
            }
        }
        return true;
    }
    case KP_W_STRINGS:
        session_strings(a, s, p, h.len, h.count);
        return true;
    case KP_W_RECORDS: {
        struct kp_wire_records rh;

        memcpy(&rh, p, sizeof(rh));
        kp_metric_add(a->m_records, h.count);
        if (s->bat == NULL) {
            kp_metric_add(a->m_dropped_agent, h.count); /* no capture: nothing to do with them */
            return true;
        }
        kp_batcher_records(s->bat, rh.kind, rh.rec_size, p + sizeof(rh), h.count);
        return true;
    }
    case KP_W_STEP: {
        struct kp_wire_step st;

        memcpy(&st, p, sizeof(st));
        note_step(s, st.step);
        if (s->bat != NULL) {
            kp_batcher_step(s->bat, &st);
        }
        return true;
    }
    case KP_W_WINDOW_BEGIN:
    case KP_W_WINDOW_END: {
        struct kp_wire_window w;

        memcpy(&w, p, sizeof(w));
        if (r == NULL || w.capture_id != s->capture_id || s->bat == NULL) {
            return true; /* a capture that is over (deadline, disarm): ignore */
        }
        if (h.type == KP_W_WINDOW_BEGIN) {
            kp_batcher_window_begin(s->bat, &w);
            r->first_step = w.first_step;
            if (r->state == RS_ARMED) {
                r->state = RS_BEGUN;
                r->deadline_ms = kp_mono_ms() + window_budget_ms(a, s->cap, s);
            }
            kp_log_info("window begun run=%" PRIu64 " rank=%d first_step=%" PRId64, s->cap->run_id,
                        r->rank, w.first_step);
            return true;
        }
        struct kp_batcher_stats bs;

        kp_batcher_window_end(s->bat, &w);
        kp_batcher_get_stats(s->bat, &bs);
        kp_metric_add(a->m_invalid, (int64_t) bs.invalid);
        kp_metric_add(a->m_rec_malformed, (int64_t) bs.malformed);
        kp_metric_add(a->m_warmup, (int64_t) (bs.warmup + bs.after));
        kp_metric_add(a->m_dropped_lib, (int64_t) w.dropped);
        r->records = bs.records_in;
        r->malformed = bs.malformed;
        r->lib_dropped = w.dropped + w.cupti_dropped;
        r->first_step = w.first_step;
        r->last_step = w.last_step;
        kp_batcher_destroy(s->bat);
        s->bat = NULL;
        if (r->state != RS_FAILED && bs.invalid > 0) {
            r->state = RS_FAILED;
            snprintf(r->reason, sizeof(r->reason),
                     "kprof bug: %" PRIu64 " batches of this rank failed validation and were "
                     "dropped (the agent log names the column); please report it",
                     bs.invalid);
        }
        if (r->state != RS_FAILED) {
            r->state = RS_DONE;
        }
        kp_log_info("window ended run=%" PRIu64 " rank=%d steps=%" PRId64 "..%" PRId64
                    " records_in=%" PRIu64 " kept=%" PRIu64 " warmup=%" PRIu64 " after=%" PRIu64
                    " batches=%" PRIu64 " lib_dropped=%" PRIu64 " malformed=%" PRIu64,
                    s->cap->run_id, r->rank, w.first_step, w.last_step, bs.records_in, bs.kept,
                    bs.warmup, bs.after, bs.batches, w.dropped, bs.malformed);
        return true;
    }
    default: {
        static _Atomic bool logged;

        if (!atomic_exchange(&logged, true)) {
            kp_log_info("unknown message type ignored type=%u pid=%u", h.type, s->pid);
        }
        return true;
    }
    }
}

static void on_readable(struct kp_agent *a, struct session *s)
{
    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(s->fd, a->buf, KP_WIRE_MAX_MSG + 1, MSG_DONTWAIT | MSG_TRUNC);

        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                return;
            }
            session_close(a, s);
            return;
        }
        if (n == 0) {
            session_close(a, s);
            return;
        }
        if ((size_t) n > KP_WIRE_MAX_MSG) {
            malformed(a, s, "message larger than KP_WIRE_MAX_MSG");
            return;
        }
        if (!on_message(a, s, (size_t) n)) {
            return;
        }
    }
}

static void on_tick(struct kp_agent *a)
{
    long long now = kp_mono_ms();
    struct kp_spool_stats ss;

    atomic_store(&a->loop_ms, now);
    for (struct session *s = a->sessions; s != NULL; s = s->next) {
        if (s->bat != NULL) {
            kp_batcher_tick(s->bat, now);
        }
    }
    on_commands(a);
    for (struct capture *c = a->caps, *next; c != NULL; c = next) {
        next = c->next;
        capture_check(a, c);
    }
    captures_expire(a, now);
    kp_spool_get_stats(a->spool, &ss);
    kp_metric_set(a->m_spool_bytes, (int64_t) ss.bytes);
    report_update(a, now);
    if (a->att != NULL) {
        struct kp_attach_stats as;

        kp_attach_get_stats(a->att, &as);
        kp_metric_set(a->m_attached, as.attached ? 1 : 0);
        kp_metric_set(a->m_commands, (int64_t) as.commands_received);
        kp_metric_set(a->m_commands_dropped, (int64_t) (as.commands_dropped + as.commands_bad));
        kp_metric_set(a->m_reports, (int64_t) as.reports_sent);
    }
}

/* --- uplink --- */

static void *uplink_main(void *arg)
{
    struct kp_agent *a = arg;
    struct kp_push *push = NULL;
    struct kp_push_opts po;
    uint64_t push_next = 0;
    bool terminal_logged = false;

    memset(&po, 0, sizeof(po));
    po.give_up_after_ms = 0; /* retry forever; the spool absorbs the rest */
    po.reconnect_max_ms = 2000;
    po.window = KP_AGENT_PUSH_WINDOW;
    po.window_bytes = (size_t) 1 << 40; /* bounded by the batch count */
    while (!atomic_load(&a->stopping)) {
        uint8_t *buf = NULL;
        size_t len = 0;
        uint64_t seq = 0, acked;
        int rc;

        if (push == NULL) {
            po.first_seq = kp_spool_first_unacked(a->spool);
            if (kp_push_create(a->ch, kp_spool_stream_id(a->spool), &po, &push) != 0) {
                kp_spool_wait(a->spool, 1000);
                continue;
            }
            push_next = po.first_seq;
            kp_spool_rewind(a->spool);
        }
        acked = kp_push_acked_through(push);
        if (acked > 1 && acked - 1 > atomic_load(&a->acked_through)) {
            uint64_t before = atomic_load(&a->acked_through);

            kp_spool_ack_through(a->spool, acked - 1);
            atomic_store(&a->acked_through, acked - 1);
            kp_metric_add(a->m_acked, (int64_t) (acked - 1 - before));
        }
        if (kp_push_error(push, NULL) != 0) {
            struct kp_rpc_status st;
            uint64_t first = kp_spool_first_unacked(a->spool);

            kp_push_error(push, &st);
            if (!terminal_logged) {
                kp_log_error("collectord refused a batch; it is dropped stream=%" PRIu64
                             " seq=%" PRIu64 " status=%s details=\"%s\"",
                             kp_spool_stream_id(a->spool), first, kp_rpc_status_name(st.code),
                             st.details);
                terminal_logged = true;
            }
            kp_metric_add(a->m_terminal, 1);
            kp_push_destroy(push);
            push = NULL;
            kp_spool_ack_through(a->spool, first);
            atomic_store(&a->acked_through, first);
            continue;
        }
        {
            struct kp_push_stats ps;

            kp_push_get_stats(push, &ps);
            if (ps.inflight >= KP_AGENT_PUSH_WINDOW) {
                /* the window is full (collectord slow or away): wait here rather than block
                 * in kp_push_send_encoded, so that stopping stays prompt */
                kp_spool_wait(a->spool, 20);
                continue;
            }
        }
        rc = kp_spool_read(a->spool, &seq, &buf, &len);
        if (rc == 0) {
            kp_spool_wait(a->spool, 20);
            continue;
        }
        if (rc < 0) {
            kp_log_warn("unreadable spool record skipped err=\"%s\"", strerror(-rc));
            continue;
        }
        if (seq != push_next) {
            /* a gap (records lost to a corrupt segment): start a push at this seq */
            kp_push_flush(push, 60000);
            kp_push_destroy(push);
            po.first_seq = seq;
            if (kp_push_create(a->ch, kp_spool_stream_id(a->spool), &po, &push) != 0) {
                push = NULL;
                free(buf);
                continue;
            }
            push_next = seq;
        }
        rc = kp_push_send_encoded(push, buf, len, NULL); /* blocks while the window is full */
        free(buf);
        if (rc == 0) {
            push_next++;
            terminal_logged = false;
        }
    }
    kp_push_destroy(push);
    return NULL;
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

    return kp_metrics_render(a->metrics, out);
}

/* --- lifecycle --- */

static int parse_allow(struct kp_agent *a, const char *list, char *errbuf, size_t errlen)
{
    char tmp[1024], *save = NULL;

    kp_strlcpy(tmp, sizeof(tmp), list != NULL ? list : "");
    for (char *t = strtok_r(tmp, ", ", &save); t != NULL; t = strtok_r(NULL, ", ", &save)) {
        char *end;
        unsigned long v = strtoul(t, &end, 10);

        if (*end != '\0') {
            struct passwd *pw = getpwnam(t);

            if (pw == NULL) {
                snprintf(errbuf, errlen, "--allow-uid: no user named %s", t);
                return -EINVAL;
            }
            v = pw->pw_uid;
        }
        if (a->n_allow == KP_AGENT_MAX_ALLOW) {
            snprintf(errbuf, errlen, "--allow-uid: at most %d entries", KP_AGENT_MAX_ALLOW);
            return -EINVAL;
        }
        a->allow[a->n_allow++] = (uint32_t) v;
    }
    return 0;
}

static int mkdir_parents(const char *path)
{
    char tmp[sizeof(((struct sockaddr_un *) 0)->sun_path)];
    char *slash;

    kp_strlcpy(tmp, sizeof(tmp), path);
    if ((slash = strrchr(tmp, '/')) == NULL || slash == tmp) {
        return 0;
    }
    *slash = '\0';
    for (char *p = tmp + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                return -errno;
            }
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
        return -errno;
    }
    return 0;
}

static int listen_socket(struct kp_agent *a, char *errbuf, size_t errlen)
{
    struct sockaddr_un sa;
    int fd, rc;

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(a->cfg.socket) >= sizeof(sa.sun_path)) {
        snprintf(errbuf, errlen, "--socket %s: path too long (at most %zu bytes)", a->cfg.socket,
                 sizeof(sa.sun_path) - 1);
        return -ENAMETOOLONG;
    }
    strcpy(sa.sun_path, a->cfg.socket);
    if ((rc = mkdir_parents(a->cfg.socket)) != 0) {
        snprintf(errbuf, errlen, "cannot create the directory of --socket %s: %s", a->cfg.socket,
                 strerror(-rc));
        return rc;
    }
    if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "socket: %s", strerror(errno));
        return rc;
    }
    /* a stale socket file from a crashed agent: remove it, unless an agent answers there */
    {
        int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        if (probe >= 0 && connect(probe, (struct sockaddr *) &sa, sizeof(sa)) == 0) {
            close(probe);
            close(fd);
            snprintf(errbuf, errlen,
                     "another kprof-agent is listening on %s (stop it, or use --socket)",
                     a->cfg.socket);
            return -EADDRINUSE;
        }
        if (probe >= 0) {
            close(probe);
        }
        unlink(a->cfg.socket);
    }
    if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) != 0 || listen(fd, 256) != 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "cannot listen on %s: %s", a->cfg.socket, strerror(errno));
        close(fd);
        return rc;
    }
    if (chmod(a->cfg.socket, a->socket_mode) != 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "cannot chmod %s: %s", a->cfg.socket, strerror(errno));
        close(fd);
        return rc;
    }
    a->lfd = fd;
    return 0;
}

static int write_ready_file(struct kp_agent *a, char *errbuf, size_t errlen)
{
    char http[32];
    struct kp_ready_entry e[] = { { "socket", a->cfg.socket }, { "http", NULL } };

    if (a->http != NULL) {
        snprintf(http, sizeof(http), "127.0.0.1:%d", kp_http_port(a->http));
        e[1].value = http;
    }
    return kp_ready_file_write(a->cfg.ready_file, e, 2, errbuf, errlen);
}

static int metric(struct kp_agent *a, struct kp_metric **m, const char *name, const char *help,
                  enum kp_metric_type t, const char *lk, const char *lv)
{
    return kp_metrics_register(a->metrics, name, help, t, lk, lv, m);
}

static int metrics_init(struct kp_agent *a)
{
    int rc = kp_metrics_create(32, &a->metrics);
    const enum kp_metric_type C = KP_METRIC_COUNTER, G = KP_METRIC_GAUGE;
    const char *drop = "Records dropped, by reason.";

    if (rc != 0) {
        return rc;
    }
    rc |= metric(a, &a->m_sessions, "kprof_agent_sessions", "Connected processes.", G, NULL, NULL);
    rc |= metric(a, &a->m_records, "kprof_agent_records_total", "Records received.", C, NULL, NULL);
    rc |= metric(a, &a->m_dropped_agent, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "agent");
    rc |= metric(a, &a->m_dropped_lib, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "library");
    rc |= metric(a, &a->m_warmup, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "outside_window");
    rc |= metric(a, &a->m_spooled, "kprof_agent_batches_spooled_total", "Batches spooled.", C, NULL,
                 NULL);
    rc |= metric(a, &a->m_acked, "kprof_agent_batches_acked_total",
                 "Batches acknowledged by collectord.", C, NULL, NULL);
    rc |= metric(a, &a->m_spool_full, "kprof_agent_batches_dropped_total", "Batches dropped.", C,
                 "reason", "spool_full");
    rc |= metric(a, &a->m_terminal, "kprof_agent_batches_dropped_total", "Batches dropped.", C,
                 "reason", "refused");
    rc |= metric(a, &a->m_invalid, "kprof_agent_batches_dropped_total", "Batches dropped.", C,
                 "reason", "invalid");
    rc |= metric(a, &a->m_spool_bytes, "kprof_agent_spool_bytes", "Bytes in the spool.", G, NULL,
                 NULL);
    rc |= metric(a, &a->m_captures, "kprof_agent_captures_total", "Captures armed.", C, NULL, NULL);
    rc |= metric(a, &a->m_refused, "kprof_agent_connections_refused_total",
                 "Connections refused (uid, limit).", C, NULL, NULL);
    rc |= metric(a, &a->m_rec_malformed, "kprof_agent_records_dropped_total", drop, C, "reason",
                 "malformed");
    rc |= metric(a, &a->m_malformed, "kprof_agent_malformed_messages_total",
                 "Connections closed for a malformed message.", C, NULL, NULL);
    rc |= metric(a, &a->m_attached, "kprof_agent_attached",
                 "1 while the Control.Attach call to collectord is up.", G, NULL, NULL);
    rc |= metric(a, &a->m_commands, "kprof_agent_capture_commands_total",
                 "Capture commands received from collectord.", C, NULL, NULL);
    rc |= metric(a, &a->m_commands_dropped, "kprof_agent_capture_commands_dropped_total",
                 "Capture commands dropped (queue full or not unpackable).", C, NULL, NULL);
    rc |= metric(a, &a->m_reports, "kprof_agent_reports_sent_total",
                 "Reports sent to collectord (heartbeats included).", C, NULL, NULL);
    return rc != 0 ? -EINVAL : 0;
}

int kp_agent_create(const struct kp_agent_config *cfg, struct kp_agent **out, char *errbuf,
                    size_t errlen)
{
    struct kp_agent *a = calloc(1, sizeof(*a));
    struct kp_rpc_channel_opts co = { 0 };
    struct kp_http_handlers hh = { h_healthz, h_readyz, h_metrics };
    struct epoll_event ev;
    struct itimerspec its;
    char *end;
    int rc;

    *out = NULL;
    if (a == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    a->cfg = *cfg;
    a->lfd = a->epfd = a->evfd = a->tfd = -1;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cond, NULL);
    a->own_uid = (uint32_t) getuid();
    atomic_store(&a->loop_ms, kp_mono_ms());
    if (cfg->host != NULL && cfg->host[0] != '\0') {
        kp_strlcpy(a->host, sizeof(a->host), cfg->host);
    }
    else if (gethostname(a->host, sizeof(a->host) - 1) != 0) {
        strcpy(a->host, "localhost");
    }
    utf8_clean(a->host);
    a->agent_id = ((uint64_t) time(NULL) << 20) ^ (uint64_t) getpid();
    a->socket_mode = (unsigned) strtoul(cfg->socket_mode ? cfg->socket_mode : "0660", &end, 8);
    if (end == cfg->socket_mode || *end != '\0' || a->socket_mode > 07777) {
        snprintf(errbuf, errlen, "--socket-mode %s: want an octal mode such as 0660",
                 cfg->socket_mode);
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = parse_allow(a, cfg->allow_uid, errbuf, errlen)) != 0 || (rc = metrics_init(a)) != 0) {
        if (rc != 0 && errbuf[0] == '\0') {
            snprintf(errbuf, errlen, "cannot register metrics");
        }
        goto fail;
    }
    if ((rc = kp_spool_open(cfg->spool_dir, (uint64_t) cfg->spool_max_bytes, 0, &a->spool, errbuf,
                            errlen)) != 0) {
        goto fail;
    }
    {
        struct kp_spool_stats ss;

        kp_spool_get_stats(a->spool, &ss);
        atomic_store(&a->acked_through, ss.acked);
    }
    co.tls_ca_file = cfg->tls_ca != NULL && cfg->tls_ca[0] != '\0' ? cfg->tls_ca : NULL;
    if ((rc = kp_rpc_channel_create(cfg->collector, &co, &a->ch, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = listen_socket(a, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((a->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        (a->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
        (a->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "epoll/eventfd/timerfd: %s", strerror(errno));
        goto fail;
    }
    memset(&its, 0, sizeof(its));
    its.it_interval.tv_nsec = KP_AGENT_TICK_MS * 1000000L;
    its.it_value = its.it_interval;
    timerfd_settime(a->tfd, 0, &its, NULL);
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.ptr = &a->lfd;
    epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->lfd, &ev);
    ev.data.ptr = &a->evfd;
    epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->evfd, &ev);
    ev.data.ptr = &a->tfd;
    epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->tfd, &ev);
    if (pthread_create(&a->worker, NULL, worker_main, a) != 0) {
        rc = -EAGAIN;
        snprintf(errbuf, errlen, "cannot start the control worker thread");
        goto fail;
    }
    a->worker_started = true;
    if (pthread_create(&a->uplink, NULL, uplink_main, a) != 0) {
        rc = -EAGAIN;
        snprintf(errbuf, errlen, "cannot start the uplink thread");
        goto fail;
    }
    a->uplink_started = true;
    if (cfg->attach) {
        struct kp_attach_opts ao;

        memset(&ao, 0, sizeof(ao));
        ao.ch = a->ch;
        ao.target = cfg->collector;
        ao.wake_fd = a->evfd;
        if ((rc = kp_attach_create(&ao, &a->att)) != 0) {
            snprintf(errbuf, errlen, "cannot start the attach thread: %s", strerror(-rc));
            goto fail;
        }
    }
    if (cfg->http_listen != NULL && cfg->http_listen[0] != '\0' &&
        (rc = kp_http_create(cfg->http_listen, &hh, a, &a->http, errbuf, errlen)) != 0) {
        goto fail;
    }
    if ((rc = write_ready_file(a, errbuf, errlen)) != 0) {
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

            if (p == &a->lfd) {
                on_accept(a);
            }
            else if (p == &a->evfd) {
                uint64_t v;

                if (read(a->evfd, &v, sizeof(v)) < 0) {
                    /* spurious */
                }
                on_jobs_done(a);
                on_commands(a);
            }
            else if (p == &a->tfd) {
                uint64_t v;

                if (read(a->tfd, &v, sizeof(v)) < 0) {
                    /* spurious */
                }
                on_tick(a);
            }
            else {
                struct session *s = p;
                bool alive = false;

                /* the session may have been closed by an earlier event of this round */
                for (struct session *x = a->sessions; x != NULL; x = x->next) {
                    if (x == s) {
                        alive = true;
                        break;
                    }
                }
                if (!alive) {
                    continue;
                }
                if (s->ctl && s->cap == NULL) {
                    /* a waiting control client: readable means it hung up */
                    bool waiting = false;

                    for (struct capture *c = a->caps; c != NULL; c = c->next) {
                        waiting |= c->client == s;
                    }
                    if (waiting) {
                        char b;

                        if (recv(s->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK) == 0) {
                            session_close(a, s);
                        }
                        continue;
                    }
                }
                on_readable(a, s);
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
    kp_attach_destroy(a->att); /* before the eventfd it writes to is closed */
    if (a->uplink_started) {
        kp_spool_wake(a->spool);
        pthread_join(a->uplink, NULL);
    }
    if (a->worker_started) {
        pthread_mutex_lock(&a->mu);
        a->worker_stop = true;
        pthread_cond_broadcast(&a->cond);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->worker, NULL);
    }
    while (a->caps != NULL) {
        capture_free(a, a->caps);
    }
    while (a->sessions != NULL) {
        session_close(a, a->sessions);
    }
    for (struct job *j = a->todo, *n; j != NULL; j = n) {
        n = j->next;
        free(j);
    }
    for (struct job *j = a->done, *n; j != NULL; j = n) {
        n = j->next;
        free(j);
    }
    if (a->lfd >= 0) {
        close(a->lfd);
        unlink(a->cfg.socket);
    }
    if (a->epfd >= 0) {
        close(a->epfd);
    }
    if (a->evfd >= 0) {
        close(a->evfd);
    }
    if (a->tfd >= 0) {
        close(a->tfd);
    }
    free(a->report_key);
    kp_rpc_channel_destroy(a->ch);
    kp_spool_close(a->spool);
    kp_metrics_destroy(a->metrics);
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
