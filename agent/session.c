/*
 * The agent's local socket side: see session.h. Loop thread only.
 */
#define _GNU_SOURCE
#define KP_LOG_MODULE "agent"
#include "session.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "demangle.h"
#include "kp_log.h"
#include "kp_str.h"
#include "kp_wire.h"
#include "metrics.h"

#define KP_SESSION_MAX_STRINGS_BYTES (64u << 20) /* per session */
/* Highest string id a session may define. The table is indexed by id, so this bounds its
 * size (16 bytes an id) whatever a peer sends; the library caps its table at 2^20 names
 * (KPI_INTERN_MAX_ENTRIES), so its ids stay below this even with raced-out entries. */
#define KP_SESSION_MAX_STRING_ID (1u << 21)
#define KP_SESSION_MAX_ALLOW     64
/* collectord refuses a whole report with a rank or world size at or above this
 * (KP_STORE_MAX_WORLD_SIZE): such values are reported as unknown */
#define KP_SESSION_REPORT_MAX_RANK (1 << 20)

struct strent {
    char *text;
    size_t len;
};

struct session {
    struct kp_sessions *ss;
    int fd;
    bool hello;
    uint32_t uid;
    /* strings: id -> text */
    struct strent *strs;
    size_t n_strs; /* capacity of strs (indexed by id) */
    size_t str_bytes;
    uint64_t str_dropped;
    struct kp_proc proc; /* identity, steps, capture */
    struct session *prev, *next;
};

struct kp_sessions {
    char socket[sizeof(((struct sockaddr_un *) 0)->sun_path)];
    unsigned socket_mode;
    long long max_sessions;
    uint64_t agent_id;
    int epfd, lfd;
    uint32_t own_uid;
    uint32_t allow[KP_SESSION_MAX_ALLOW];
    size_t n_allow;
    uint32_t allow_gid[KP_SESSION_MAX_ALLOW]; /* --allow-group */
    size_t n_allow_gid;
    uint32_t refused_logged[KP_SESSION_MAX_ALLOW];
    size_t n_refused_logged;
    /* pids whose HELLO was refused, logged once each (a refused library retries every 10 s) */
    uint32_t hello_refused_logged[KP_SESSION_MAX_ALLOW];
    size_t n_hello_refused;
    struct kp_agent_metrics *m;
    struct kp_captures *caps;
    struct session *list;
    size_t n;
    uint8_t buf[KP_WIRE_MAX_MSG + 8] __attribute__((aligned(8)));
};

static struct session *session_of(struct kp_proc *p)
{
    return (struct session *) ((char *) p - offsetof(struct session, proc));
}

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

static void send_welcome(struct kp_sessions *ss, int fd, bool ok, const char *reason)
{
    struct kp_wire_welcome w;

    memset(&w, 0, sizeof(w));
    w.accepted = ok ? 1 : 0;
    w.agent_id = ss->agent_id;
    kp_strlcpy(w.reason, sizeof(w.reason), reason);
    send_msg(fd, KP_W_WELCOME, &w, sizeof(w), 0);
}

/* --- the capture set's ops --- */

static int op_send(void *ud, struct kp_proc *p, enum kp_wire_type type, const void *msg, size_t len)
{
    (void) ud;
    return send_msg(session_of(p)->fd, type, msg, len, 0);
}

static const char *op_string(void *ud, struct kp_proc *p, uint32_t id, size_t *len)
{
    struct session *s = session_of(p);

    (void) ud;
    if (id >= s->n_strs || s->strs[id].text == NULL) {
        return NULL;
    }
    *len = s->strs[id].len;
    return s->strs[id].text;
}

/* An idle session if there are several (a restarted process whose old connection lingers),
 * else the newest. */
static struct kp_proc *op_find(void *ud, const char *job, int32_t rank)
{
    struct kp_sessions *ss = ud;
    struct session *found = NULL;

    for (struct session *s = ss->list; s != NULL; s = s->next) {
        const struct kp_wire_hello *h = &s->proc.h;

        if (!s->hello || strcmp(h->job, job) != 0 || (h->rank >= 0 ? h->rank : 0) != rank) {
            continue;
        }
        if (s->proc.cap == NULL) {
            return &s->proc;
        }
        if (found == NULL) {
            found = s;
        }
    }
    return found != NULL ? &found->proc : NULL;
}

struct kp_captures_ops kp_sessions_capture_ops(struct kp_sessions *ss)
{
    struct kp_captures_ops ops = { ss, op_send, op_string, op_find };

    return ops;
}

void kp_sessions_set_captures(struct kp_sessions *ss, struct kp_captures *caps)
{
    ss->caps = caps;
}

/* --- sessions --- */

static void session_strings(struct session *s, const uint8_t *p, uint32_t count)
{
    size_t off = 0;

    for (uint32_t i = 0; i < count; i++) {
        uint32_t e[2];

        memcpy(e, p + off, sizeof(e));
        off += sizeof(e);
        const char *text = (const char *) p + off;
        off += ((size_t) e[1] + 3u) & ~(size_t) 3u;
        if (e[0] > KP_SESSION_MAX_STRING_ID || s->str_bytes + e[1] > KP_SESSION_MAX_STRINGS_BYTES) {
            if (s->str_dropped++ == 0) {
                kp_log_warn("strings table full, names will be empty pid=%u id=%u bytes=%zu",
                            s->proc.pid, e[0], s->str_bytes);
            }
            kp_metric_add(s->ss->m->dropped_agent, 1);
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
}

static void session_close(struct session *s)
{
    struct kp_sessions *ss = s->ss;

    kp_proc_gone(&s->proc);
    epoll_ctl(ss->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    if (s->hello) {
        kp_log_info("process gone pid=%u job=%s rank=%d", s->proc.pid, s->proc.h.job,
                    s->proc.h.rank);
    }
    for (size_t i = 0; i < s->n_strs; i++) {
        free(s->strs[i].text);
    }
    free(s->strs);
    if (s->prev != NULL) {
        s->prev->next = s->next;
    }
    else {
        ss->list = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    }
    ss->n--;
    kp_metric_set(ss->m->sessions, (int64_t) ss->n);
    free(s);
}

static bool uid_allowed(const struct kp_sessions *ss, uint32_t uid)
{
    if (uid == 0 || uid == ss->own_uid) {
        return true;
    }
    for (size_t i = 0; i < ss->n_allow; i++) {
        if (ss->allow[i] == uid) {
            return true;
        }
    }
    return false;
}

static bool gid_listed(const struct kp_sessions *ss, uint32_t gid)
{
    for (size_t i = 0; i < ss->n_allow_gid; i++) {
        if (ss->allow_gid[i] == gid) {
            return true;
        }
    }
    return false;
}

/* Whether the peer on fd is in a group of --allow-group: its primary group (cr) or one of its
 * supplementary groups as the kernel recorded them at connect (SO_PEERGROUPS), never what the
 * peer claims. */
static bool group_allowed(const struct kp_sessions *ss, int fd, const struct ucred *cr)
{
    gid_t small[64], *gids = small;
    socklen_t len = sizeof(small);
    bool ok = false;

    if (ss->n_allow_gid == 0) {
        return false;
    }
    if (gid_listed(ss, cr->gid)) {
        return true;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len) != 0) {
        /* A peer in more groups than small holds: the kernel said how many bytes it needs. */
        bool more = errno == ERANGE && (gids = malloc(len)) != NULL;

        if (!more || getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len) != 0) {
            len = 0;
        }
        if (gids == NULL) {
            gids = small;
        }
    }
    for (size_t i = 0; i < len / sizeof(gids[0]) && !ok; i++) {
        ok = gid_listed(ss, (uint32_t) gids[i]);
    }
    if (gids != small) {
        free(gids);
    }
    return ok;
}

/* Answers a connection of a uid not in --allow-uid (logged once per uid) and closes it. */
static void refuse_uid(struct kp_sessions *ss, int fd, const struct ucred *cr)
{
    char why[256];
    bool logged = false;

    snprintf(why, sizeof(why),
             "uid %u is not allowed by this kprof-agent (add it to --allow-uid, or the user to a "
             "group of --allow-group)",
             cr->uid);
    send_welcome(ss, fd, false, why);
    close(fd);
    kp_metric_add(ss->m->refused, 1);
    for (size_t i = 0; i < ss->n_refused_logged; i++) {
        logged |= ss->refused_logged[i] == cr->uid;
    }
    if (!logged) {
        kp_log_warn(
            "connection refused pid=%d uid=%u reason=\"not in --allow-uid or --allow-group\"",
            (int) cr->pid, cr->uid);
        if (ss->n_refused_logged < KP_SESSION_MAX_ALLOW) {
            ss->refused_logged[ss->n_refused_logged++] = cr->uid;
        }
    }
}

/* A new session for an accepted connection, added to the loop's epoll. */
static void session_add(struct kp_sessions *ss, int fd, const struct ucred *cr)
{
    struct epoll_event ev;
    struct session *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        close(fd);
        return;
    }
    s->ss = ss;
    s->fd = fd;
    s->uid = cr->uid;
    kp_proc_init(&s->proc, ss->caps);
    s->proc.pid = (uint32_t) cr->pid;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.ptr = s;
    if (epoll_ctl(ss->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(fd);
        free(s);
        return;
    }
    s->next = ss->list;
    if (ss->list != NULL) {
        ss->list->prev = s;
    }
    ss->list = s;
    ss->n++;
    kp_metric_set(ss->m->sessions, (int64_t) ss->n);
}

void kp_sessions_accept(struct kp_sessions *ss)
{
    for (;;) {
        struct ucred cr;
        socklen_t crl = sizeof(cr);
        int fd = accept4(ss->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

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
        if (!uid_allowed(ss, cr.uid) && !group_allowed(ss, fd, &cr)) {
            refuse_uid(ss, fd, &cr);
            continue;
        }
        if (ss->n >= (size_t) ss->max_sessions) {
            send_welcome(ss, fd, false,
                         "too many processes connected to this kprof-agent (raise --max-sessions)");
            close(fd);
            kp_metric_add(ss->m->refused, 1);
            continue;
        }
        session_add(ss, fd, &cr);
    }
}

/* --- library messages --- */

static bool malformed(struct session *s, const char *why)
{
    kp_metric_add(s->ss->m->malformed, 1);
    kp_log_warn("malformed message, connection closed pid=%u reason=\"%s\"", s->proc.pid, why);
    session_close(s);
    return false;
}

/* True if the session o (a live one by the agent's books) has in fact gone: its process exited
 * (kill(pid, 0) fails with ESRCH) or its connection's EOF is waiting unread. A restarted worker
 * may then take its identity even if the agent has not yet read that EOF. */
static bool session_gone(const struct session *o)
{
    char c;
    ssize_t r = recv(o->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        return true;
    }
    return o->proc.pid != 0 && kill((pid_t) o->proc.pid, 0) != 0 && errno == ESRCH;
}

/* Why the identity in h is refused (written to why), or NULL if it is acceptable: a rank,
 * local rank or world size out of range (-1 is "unknown", as the library sends without the
 * variables), a job name with control characters, or a (job, rank) a live session of another
 * process already holds. An empty job or an unknown rank is not checked for duplicates: such
 * processes are not one identity each. */
static const char *hello_refusal(const struct session *s, const struct kp_wire_hello *h, char *why,
                                 size_t n)
{
    if (h->world_size == 0 || h->world_size < -1 || h->world_size >= KP_SESSION_REPORT_MAX_RANK) {
        snprintf(why, n, "world size %d is out of range (1 to %d, or -1 if unknown)", h->world_size,
                 KP_SESSION_REPORT_MAX_RANK - 1);
        return why;
    }
    if (h->rank < -1 || h->rank >= KP_SESSION_REPORT_MAX_RANK ||
        (h->world_size > 0 && h->rank >= h->world_size)) {
        snprintf(why, n, "rank %d is out of range (0 to world size %d - 1, or -1 if unknown)",
                 h->rank, h->world_size);
        return why;
    }
    if (h->local_rank < -1 || h->local_rank >= KP_SESSION_REPORT_MAX_RANK) {
        snprintf(why, n, "local rank %d is out of range (0 or more, or -1 if unknown)",
                 h->local_rank);
        return why;
    }
    for (const char *c = h->job; *c != '\0'; c++) {
        if ((unsigned char) *c < 0x20 || *c == 0x7f) {
            snprintf(why, n, "job name has a control character (byte 0x%02x)", (unsigned char) *c);
            return why;
        }
    }
    if (h->job[0] == '\0' || h->rank < 0) {
        return NULL;
    }
    for (struct session *o = s->ss->list; o != NULL; o = o->next) {
        if (o == s || !o->hello || o->proc.h.rank != h->rank ||
            strcmp(o->proc.h.job, h->job) != 0 || session_gone(o)) {
            continue;
        }
        snprintf(why, n,
                 "job %.64s rank %d is already registered by pid %u on this agent (two "
                 "processes may not share a rank; check RANK and the job id)",
                 h->job, h->rank, o->proc.pid);
        return why;
    }
    return NULL;
}

/* Handles a HELLO; returns false if the identity was refused and the session closed. */
static bool on_hello(struct session *s, const uint8_t *p)
{
    struct kp_wire_hello *h = &s->proc.h;
    struct kp_sessions *ss = s->ss;
    char why[256];
    const char *refused;
    bool logged = false;

    memcpy(h, p, sizeof(*h));
    h->job[sizeof(h->job) - 1] = '\0';
    h->host[sizeof(h->host) - 1] = '\0';
    h->cupti_error[sizeof(h->cupti_error) - 1] = '\0';
    refused = hello_refusal(s, h, why, sizeof(why));
    if (refused != NULL) {
        send_welcome(ss, s->fd, false, refused);
        kp_metric_add(ss->m->refused, 1);
        kp_proc_clean_text(h->job);
        for (size_t i = 0; i < KP_SESSION_MAX_ALLOW && i < ss->n_hello_refused; i++) {
            logged |= ss->hello_refused_logged[i] == s->proc.pid;
        }
        if (!logged) {
            ss->hello_refused_logged[ss->n_hello_refused++ % KP_SESSION_MAX_ALLOW] = s->proc.pid;
            kp_log_warn("process refused pid=%u uid=%u job=%.64s rank=%d world=%d reason=\"%s\"",
                        s->proc.pid, s->uid, h->job, h->rank, h->world_size, refused);
        }
        session_close(s);
        return false;
    }
    kp_proc_clean_text(h->job);
    kp_proc_clean_text(h->host);
    s->hello = true;
    kp_proc_note_step(&s->proc, h->current_step);
    send_welcome(s->ss, s->fd, true, "");
    kp_log_info("process registered pid=%u uid=%u job=%s rank=%d local_rank=%d world=%d "
                "device=%d cupti=%u%s%s",
                s->proc.pid, s->uid, h->job, h->rank, h->local_rank, h->world_size, h->device,
                h->cupti_version, h->cupti_error[0] ? " cupti_error=" : "", h->cupti_error);
    return true;
}

static void on_status(struct session *s, const uint8_t *p)
{
    struct kp_wire_status st;

    memcpy(&st, p, sizeof(st));
    st.reason[sizeof(st.reason) - 1] = '\0';
    if (st.device >= 0) {
        s->proc.h.device = st.device;
    }
    kp_proc_note_step(&s->proc, st.current_step);
    kp_proc_on_status(&s->proc, &st);
}

/* Handles one message of n bytes in ss->buf; returns false if the session was closed. */
static bool on_message(struct session *s, size_t n)
{
    struct kp_sessions *ss = s->ss;
    struct kp_wire_hdr h;
    const uint8_t *p = ss->buf + sizeof(h);
    const char *why = NULL;

    if (kp_wire_check(ss->buf, n, &why) != 0) {
        return malformed(s, why);
    }
    memcpy(&h, ss->buf, sizeof(h));
    if (h.type == KP_W_CTL_REQUEST) {
        return malformed(s, "control request (the agent has no local control plane: use "
                            "kprofctl)");
    }
    if (h.type != KP_W_HELLO && !s->hello) {
        if (h.type <= KP_W_STEP) {
            return malformed(s, "message before HELLO");
        }
        return true;
    }
    switch (h.type) {
    case KP_W_HELLO:
        if (s->hello) {
            return malformed(s, "second HELLO");
        }
        return on_hello(s, p);
    case KP_W_STATUS:
        on_status(s, p);
        return true;
    case KP_W_STRINGS:
        session_strings(s, p, h.count);
        return true;
    case KP_W_RECORDS: {
        struct kp_wire_records rh;

        memcpy(&rh, p, sizeof(rh));
        kp_metric_add(ss->m->records, h.count);
        kp_proc_on_records(&s->proc, &rh, p + sizeof(rh), h.count);
        return true;
    }
    case KP_W_STEP: {
        struct kp_wire_step st;

        memcpy(&st, p, sizeof(st));
        kp_proc_note_step(&s->proc, st.step);
        kp_proc_on_step(&s->proc, &st);
        return true;
    }
    case KP_W_WINDOW_BEGIN:
    case KP_W_WINDOW_END: {
        struct kp_wire_window w;

        memcpy(&w, p, sizeof(w));
        kp_proc_on_window(&s->proc, (enum kp_wire_type) h.type, &w);
        return true;
    }
    default: {
        static _Atomic bool logged;

        if (!atomic_exchange(&logged, true)) {
            kp_log_info("unknown message type ignored type=%u pid=%u", h.type, s->proc.pid);
        }
        return true;
    }
    }
}

static void on_readable(struct session *s)
{
    struct kp_sessions *ss = s->ss;

    for (int i = 0; i < 64; i++) {
        ssize_t n = recv(s->fd, ss->buf, KP_WIRE_MAX_MSG + 1, MSG_DONTWAIT | MSG_TRUNC);

        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                return;
            }
            session_close(s);
            return;
        }
        if (n == 0) {
            session_close(s);
            return;
        }
        if ((size_t) n > KP_WIRE_MAX_MSG) {
            malformed(s, "message larger than KP_WIRE_MAX_MSG");
            return;
        }
        if (!on_message(s, (size_t) n)) {
            return;
        }
    }
}

void kp_sessions_on_event(struct kp_sessions *ss, void *tag)
{
    /* the session may have been closed by an earlier event of this round */
    for (struct session *s = ss->list; s != NULL; s = s->next) {
        if (s == tag) {
            on_readable(s);
            return;
        }
    }
}

void kp_sessions_tick(struct kp_sessions *ss, long long now)
{
    for (struct session *s = ss->list; s != NULL; s = s->next) {
        kp_proc_tick(&s->proc, now);
    }
}

/* --- reports --- */

size_t kp_sessions_count(const struct kp_sessions *ss)
{
    size_t n = 0;

    for (const struct session *s = ss->list; s != NULL; s = s->next) {
        n += s->hello;
    }
    return n;
}

size_t kp_sessions_report(struct kp_sessions *ss, long long now, Kprof__V1__AgentProcess *procs,
                          uint32_t *ages, size_t max)
{
    size_t np = 0;

    for (struct session *s = ss->list; s != NULL && np < max; s = s->next) {
        const struct kp_wire_hello *h = &s->proc.h;
        Kprof__V1__AgentProcess *p = &procs[np];
        long long ms = kp_proc_step_ms(&s->proc);

        if (!s->hello) {
            continue;
        }
        kprof__v1__agent_process__init(p);
        p->job = s->proc.h.job;
        p->rank = h->rank >= 0 && h->rank < KP_SESSION_REPORT_MAX_RANK ? h->rank : -1;
        p->local_rank = h->local_rank;
        p->world_size = h->world_size > 0 && h->world_size <= KP_SESSION_REPORT_MAX_RANK
                            ? (uint32_t) h->world_size
                            : 0;
        p->pid = s->proc.pid;
        p->device = h->device;
        p->step = s->proc.current_step;
        p->step_ms = ms > 0 ? (ms < UINT32_MAX ? (uint32_t) ms : UINT32_MAX) : 0;
        p->run_id = kp_proc_run_id(&s->proc);
        ages[np] = 0;
        if (s->proc.current_step >= 0 && now > s->proc.step_seen_ms) {
            long long age = now - s->proc.step_seen_ms;

            ages[np] = age < UINT32_MAX ? (uint32_t) age : UINT32_MAX;
        }
        np++;
    }
    return np;
}

/* --- lifecycle --- */

static bool user_id(const char *name, uint32_t *id)
{
    struct passwd *pw = getpwnam(name);

    if (pw != NULL) {
        *id = pw->pw_uid;
    }
    return pw != NULL;
}

static bool group_id(const char *name, uint32_t *id)
{
    struct group *gr = getgrnam(name);

    if (gr != NULL) {
        *id = gr->gr_gid;
    }
    return gr != NULL;
}

/* Parses flag's list of ids or names (lookup: a name to its id; what: "user" or "group")
 * into ids (at most KP_SESSION_MAX_ALLOW, *n of them). */
static int parse_ids(const char *flag, const char *what, bool (*lookup)(const char *, uint32_t *),
                     const char *list, uint32_t *ids, size_t *n, char *errbuf, size_t errlen)
{
    char tmp[1024], *save = NULL;

    kp_strlcpy(tmp, sizeof(tmp), list != NULL ? list : "");
    for (char *t = strtok_r(tmp, ", ", &save); t != NULL; t = strtok_r(NULL, ", ", &save)) {
        char *end;
        uint32_t v = (uint32_t) strtoul(t, &end, 10);

        if (*end != '\0' && !lookup(t, &v)) {
            snprintf(errbuf, errlen, "%s: no %s named %s", flag, what, t);
            return -EINVAL;
        }
        if (*n == KP_SESSION_MAX_ALLOW) {
            snprintf(errbuf, errlen, "%s: at most %d entries", flag, KP_SESSION_MAX_ALLOW);
            return -EINVAL;
        }
        ids[(*n)++] = v;
    }
    return 0;
}

static int parse_allow(struct kp_sessions *ss, const char *list, char *errbuf, size_t errlen)
{
    return parse_ids("--allow-uid", "user", user_id, list, ss->allow, &ss->n_allow, errbuf, errlen);
}

static int parse_allow_group(struct kp_sessions *ss, const char *list, char *errbuf, size_t errlen)
{
    return parse_ids("--allow-group", "group", group_id, list, ss->allow_gid, &ss->n_allow_gid,
                     errbuf, errlen);
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

/* A stale socket file from a crashed agent is removed, unless an agent answers there. */
static int remove_stale(const struct sockaddr_un *sa, char *errbuf, size_t errlen)
{
    int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

    if (probe >= 0 && connect(probe, (const struct sockaddr *) sa, sizeof(*sa)) == 0) {
        close(probe);
        snprintf(errbuf, errlen,
                 "another kprof-agent is listening on %s (stop it, or use --socket)", sa->sun_path);
        return -EADDRINUSE;
    }
    if (probe >= 0) {
        close(probe);
    }
    unlink(sa->sun_path);
    return 0;
}

static int listen_socket(struct kp_sessions *ss, const char *path, char *errbuf, size_t errlen)
{
    struct sockaddr_un sa;
    int fd, rc;

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(errbuf, errlen, "--socket %s: path too long (at most %zu bytes)", path,
                 sizeof(sa.sun_path) - 1);
        return -ENAMETOOLONG;
    }
    strcpy(sa.sun_path, path);
    if ((rc = mkdir_parents(path)) != 0) {
        snprintf(errbuf, errlen, "cannot create the directory of --socket %s: %s", path,
                 strerror(-rc));
        return rc;
    }
    if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "socket: %s", strerror(errno));
        return rc;
    }
    if ((rc = remove_stale(&sa, errbuf, errlen)) != 0) {
        close(fd);
        return rc;
    }
    if (bind(fd, (struct sockaddr *) &sa, sizeof(sa)) != 0 || listen(fd, 256) != 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (chmod(path, ss->socket_mode) != 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "cannot chmod %s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    kp_strlcpy(ss->socket, sizeof(ss->socket), path); /* from here on, destroy unlinks it */
    ss->lfd = fd;
    return 0;
}

int kp_sessions_create(const struct kp_sessions_config *cfg, struct kp_sessions **out, char *errbuf,
                       size_t errlen)
{
    struct kp_sessions *ss = calloc(1, sizeof(*ss));
    const char *mode = cfg->socket_mode != NULL ? cfg->socket_mode : "0660";
    char *end;
    int rc;

    *out = NULL;
    if (ss == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    ss->lfd = -1;
    ss->epfd = cfg->epfd;
    ss->m = cfg->metrics;
    ss->agent_id = cfg->agent_id;
    ss->max_sessions = cfg->max_sessions;
    ss->own_uid = (uint32_t) getuid();
    ss->socket_mode = (unsigned) strtoul(mode, &end, 8);
    if (end == mode || *end != '\0' || ss->socket_mode > 07777) {
        snprintf(errbuf, errlen, "--socket-mode %s: want an octal mode such as 0660", mode);
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = parse_allow(ss, cfg->allow_uid, errbuf, errlen)) != 0 ||
        (rc = parse_allow_group(ss, cfg->allow_group, errbuf, errlen)) != 0 ||
        (rc = listen_socket(ss, cfg->socket, errbuf, errlen)) != 0) {
        goto fail;
    }
    *out = ss;
    return 0;
fail:
    kp_sessions_destroy(ss);
    return rc;
}

int kp_sessions_listen_fd(const struct kp_sessions *ss)
{
    return ss->lfd;
}

void kp_sessions_destroy(struct kp_sessions *ss)
{
    if (ss == NULL) {
        return;
    }
    while (ss->list != NULL) {
        session_close(ss->list);
    }
    if (ss->lfd >= 0) {
        close(ss->lfd);
        unlink(ss->socket);
    }
    free(ss);
}
