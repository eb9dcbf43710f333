/* kp_auth: bearer tokens and certificate roles (see kp_auth.h). */
#define _GNU_SOURCE   /* timegm */
#define KP_LOG_MODULE "auth"
#include "kp_auth.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kp_clock.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_secret.h"

#define TOKEN_MIN  16
#define TOKEN_MAX  256
#define FILE_MAX   (256u << 10)
#define RECHECK_NS 1000000000LL
#define URI_PREFIX "urn:kprof:"
#define BEARER     "Bearer "

struct token {
    unsigned role;
    char name[KP_AUTH_NAME_MAX];
    char secret[TOKEN_MAX + 1];
    size_t len;
    long long expires; /* unix seconds; 0: never */
};

struct table {
    struct token *t;
    size_t n;
};

struct kp_auth {
    char *path; /* NULL: no token file */
    bool certs;
    pthread_mutex_t mu;
    struct table tab;
    long long checked_ns; /* monotonic time of the last stat */
    struct stat seen;     /* the file as last loaded (or last refused) */
};

static const char *const role_names[] = { "agent", "viewer", "operator" };

const char *kp_auth_role_name(unsigned role)
{
    if (role == KP_ROLES_ALL) {
        return "any";
    }
    for (size_t i = 0; i < 3; i++) {
        if (role == (1u << i)) {
            return role_names[i];
        }
    }
    return "?";
}

int kp_auth_role_parse(const char *s, unsigned *role)
{
    for (size_t i = 0; i < 3; i++) {
        if (strcmp(s, role_names[i]) == 0) {
            *role = 1u << i;
            return 0;
        }
    }
    return KP_ECONFIG;
}

bool kp_auth_allows(unsigned roles, unsigned role)
{
    if ((role & KP_ROLE_OPERATOR) != 0) {
        role |= KP_ROLE_VIEWER;
    }
    return (roles & role) != 0;
}

const char *kp_auth_result_text(enum kp_auth_result r)
{
    switch (r) {
    case KP_AUTH_OK:
        return "ok";
    case KP_AUTH_MISSING:
        return "no credential";
    case KP_AUTH_UNKNOWN:
        return "unknown token";
    case KP_AUTH_EXPIRED:
        return "expired token";
    case KP_AUTH_MALFORMED:
        return "malformed credential";
    }
    return "?";
}

static bool name_ok(const char *s, size_t len)
{
    if (len == 0 || len >= KP_AUTH_NAME_MAX) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        char c = s[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_' || c == '*')) {
            return false;
        }
    }
    return true;
}

static bool token_chars_ok(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] <= ' ' || s[i] > '~') {
            return false;
        }
    }
    return true;
}

/* "2026-12-01T00:00:00Z" or unix seconds. */
static int parse_expires(const char *s, long long *out)
{
    struct tm tm, asked;
    const char *end;
    char *e;

    if (s[0] >= '0' && s[0] <= '9' && strchr(s, '-') == NULL) {
        errno = 0;
        *out = strtoll(s, &e, 10);
        return errno == 0 && *e == '\0' && *out > 0 ? 0 : KP_ECONFIG;
    }
    memset(&tm, 0, sizeof(tm));
    end = strptime(s, "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (end == NULL || *end != '\0') {
        return KP_ECONFIG;
    }
    asked = tm;
    *out = (long long) timegm(&tm); /* normalises tm: 2026-02-30 becomes March 2nd */
    if (tm.tm_mday != asked.tm_mday || tm.tm_mon != asked.tm_mon || tm.tm_hour != asked.tm_hour ||
        tm.tm_min != asked.tm_min || tm.tm_sec != asked.tm_sec) {
        return KP_ECONFIG; /* not a date: refused rather than moved */
    }
    return 0;
}

/* Parses one line into *t; returns 0, 1 for a line to skip, or KP_ECONFIG with why. */
static int parse_line(char *line, struct token *t, const char **why)
{
    char *f[5];
    size_t n = 0;
    char *save = NULL, *w;

    line += strspn(line, " \t");
    if (line[0] == '\0' || line[0] == '#') {
        return 1; /* a comment may have any number of words */
    }
    for (w = strtok_r(line, " \t", &save); w != NULL; w = strtok_r(NULL, " \t", &save)) {
        if (n == 5) {
            *why = "too many fields (ROLE NAME TOKEN [expires=...])";
            return KP_ECONFIG;
        }
        f[n++] = w;
    }
    if (n < 3 || n > 4) {
        *why = "expected ROLE NAME TOKEN [expires=YYYY-MM-DDTHH:MM:SSZ]";
        return KP_ECONFIG;
    }
    memset(t, 0, sizeof(*t));
    if (kp_auth_role_parse(f[0], &t->role) != 0) {
        *why = "unknown role (agent, viewer or operator)";
        return KP_ECONFIG;
    }
    if (!name_ok(f[1], strlen(f[1]))) {
        *why = "NAME must be 1 to 63 of A-Z a-z 0-9 . - _ *";
        return KP_ECONFIG;
    }
    snprintf(t->name, sizeof(t->name), "%s", f[1]);
    t->len = strlen(f[2]);
    if (t->len < TOKEN_MIN || t->len > TOKEN_MAX || !token_chars_ok(f[2], t->len)) {
        *why = "TOKEN must be 16 to 256 printable characters without spaces";
        return KP_ECONFIG;
    }
    memcpy(t->secret, f[2], t->len);
    if (n == 4) {
        if (strncmp(f[3], "expires=", 8) != 0 || parse_expires(f[3] + 8, &t->expires) != 0) {
            *why = "the fourth field must be expires=YYYY-MM-DDTHH:MM:SSZ";
            return KP_ECONFIG;
        }
    }
    return 0;
}

static void table_free(struct table *tab)
{
    if (tab->t != NULL) {
        explicit_bzero(tab->t, tab->n * sizeof(*tab->t));
        free(tab->t);
    }
    tab->t = NULL;
    tab->n = 0;
}

/* Reads and parses the file into *out. */
static int table_load(const char *path, struct table *out, char *errbuf, size_t errlen)
{
    char *buf = malloc(FILE_MAX);
    struct table tab = { 0 };
    char *line, *next;
    size_t lineno = 0, cap = 0;
    long n;
    int rc = 0;

    if (buf == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    if ((n = kp_secret_file_read(path, "the token file", true, buf, FILE_MAX, errbuf, errlen)) <
        0) {
        free(buf);
        return (int) n;
    }
    /* line by line, blank ones counted, so that an error names the line an editor shows */
    for (line = buf; line != NULL; line = next) {
        struct token t;
        const char *why = NULL;
        size_t ll;

        if ((next = strchr(line, '\n')) != NULL) {
            *next++ = '\0';
        }
        ll = strlen(line);
        lineno++;
        if (ll > 0 && line[ll - 1] == '\r') {
            line[ll - 1] = '\0';
        }
        rc = parse_line(line, &t, &why);
        if (rc == 1) {
            rc = 0;
            continue;
        }
        if (rc != 0) {
            snprintf(errbuf, errlen, "the token file %s, line %zu: %s", path, lineno, why);
            explicit_bzero(&t, sizeof(t));
            break;
        }
        for (size_t i = 0; i < tab.n; i++) {
            if (tab.t[i].len == t.len && memcmp(tab.t[i].secret, t.secret, t.len) == 0) {
                /* one token, two identities: which one a caller is would be a guess */
                snprintf(errbuf, errlen,
                         "the token file %s, line %zu: the same token as the line of %s %s; "
                         "give every identity a token of its own",
                         path, lineno, kp_auth_role_name(tab.t[i].role), tab.t[i].name);
                rc = KP_ECONFIG;
                break;
            }
        }
        if (rc != 0) {
            explicit_bzero(&t, sizeof(t));
            break;
        }
        if (tab.n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            struct token *nt = realloc(tab.t, ncap * sizeof(*nt));

            if (nt == NULL) {
                rc = -ENOMEM;
                snprintf(errbuf, errlen, "out of memory");
                break;
            }
            tab.t = nt;
            cap = ncap;
        }
        tab.t[tab.n++] = t;
        explicit_bzero(&t, sizeof(t));
    }
    explicit_bzero(buf, FILE_MAX);
    free(buf);
    if (rc == 0 && tab.n == 0) {
        snprintf(errbuf, errlen, "the token file %s holds no token (ROLE NAME TOKEN a line)", path);
        rc = KP_ECONFIG;
    }
    if (rc != 0) {
        table_free(&tab);
        return rc;
    }
    *out = tab;
    return 0;
}

int kp_auth_create(const char *token_file, bool certs, struct kp_auth **out, char *errbuf,
                   size_t errlen)
{
    struct kp_auth *a;
    int rc;

    if ((token_file == NULL || token_file[0] == '\0') && !certs) {
        snprintf(errbuf, errlen, "authentication needs a token file or client certificates");
        return KP_ECONFIG;
    }
    if ((a = calloc(1, sizeof(*a))) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&a->mu, NULL);
    a->certs = certs;
    if (token_file != NULL && token_file[0] != '\0') {
        if ((a->path = strdup(token_file)) == NULL) {
            kp_auth_destroy(a);
            snprintf(errbuf, errlen, "out of memory");
            return -ENOMEM;
        }
        if (stat(token_file, &a->seen) != 0) {
            memset(&a->seen, 0, sizeof(a->seen));
        }
        if ((rc = table_load(token_file, &a->tab, errbuf, errlen)) != 0) {
            kp_auth_destroy(a);
            return rc;
        }
        a->checked_ns = kp_mono_ns();
    }
    *out = a;
    return 0;
}

void kp_auth_destroy(struct kp_auth *a)
{
    if (a == NULL) {
        return;
    }
    table_free(&a->tab);
    free(a->path);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static bool same_file(const struct stat *x, const struct stat *y)
{
    return x->st_ino == y->st_ino && x->st_dev == y->st_dev && x->st_size == y->st_size &&
           x->st_mtim.tv_sec == y->st_mtim.tv_sec && x->st_mtim.tv_nsec == y->st_mtim.tv_nsec &&
           x->st_mode == y->st_mode;
}

/* Re-reads the file if it changed since the last look (at most once a second). Locked. */
static void maybe_reload_locked(struct kp_auth *a)
{
    long long now = kp_mono_ns();
    struct stat st;
    struct table tab;
    char err[512];

    if (a->path == NULL || now - a->checked_ns < RECHECK_NS) {
        return;
    }
    a->checked_ns = now;
    if (stat(a->path, &st) != 0) {
        memset(&st, 0, sizeof(st));
    }
    if (same_file(&st, &a->seen)) {
        return;
    }
    a->seen = st; /* a refused version is reported once, not at every call */
    if (table_load(a->path, &tab, err, sizeof(err)) != 0) {
        kp_log_error("token file not reloaded, keeping the %zu tokens loaded before: %s", a->tab.n,
                     err);
        return;
    }
    table_free(&a->tab);
    a->tab = tab;
    kp_log_info("token file reloaded path=%s tokens=%zu", a->path, tab.n);
}

/* Compares without an early exit, so the time taken does not tell how much of a guess was
 * right. */
static bool secret_eq(const char *x, size_t xl, const char *y, size_t yl)
{
    unsigned char diff = (unsigned char) (xl != yl);

    for (size_t i = 0; i < yl; i++) {
        diff |= (unsigned char) (x[xl ? i % xl : 0] ^ y[i]);
    }
    return diff == 0 && xl > 0;
}

static enum kp_auth_result check_token(struct kp_auth *a, const char *authz, size_t len,
                                       struct kp_identity *id)
{
    size_t bl = strlen(BEARER);
    const struct token *hit = NULL;
    enum kp_auth_result r;

    if (len <= bl || strncasecmp(authz, BEARER, bl) != 0 || len - bl > TOKEN_MAX) {
        return KP_AUTH_MALFORMED;
    }
    authz += bl;
    len -= bl;
    pthread_mutex_lock(&a->mu);
    maybe_reload_locked(a);
    for (size_t i = 0; i < a->tab.n; i++) {
        if (secret_eq(authz, len, a->tab.t[i].secret, a->tab.t[i].len)) {
            hit = &a->tab.t[i];
        }
    }
    if (hit == NULL) {
        r = KP_AUTH_UNKNOWN;
    }
    else if (hit->expires != 0 && (long long) time(NULL) >= hit->expires) {
        r = KP_AUTH_EXPIRED;
    }
    else {
        r = KP_AUTH_OK;
        id->role = hit->role;
        snprintf(id->name, sizeof(id->name), "%s", hit->name);
        id->via = "token";
    }
    pthread_mutex_unlock(&a->mu);
    return r;
}

/* urn:kprof:ROLE:NAME */
static enum kp_auth_result check_uri(const char *uri, struct kp_identity *id)
{
    size_t pl = strlen(URI_PREFIX);
    const char *role, *colon;
    char rb[16];

    if (strncmp(uri, URI_PREFIX, pl) != 0) {
        return KP_AUTH_MISSING;
    }
    role = uri + pl;
    if ((colon = strchr(role, ':')) == NULL || (size_t) (colon - role) >= sizeof(rb)) {
        return KP_AUTH_MALFORMED;
    }
    memcpy(rb, role, (size_t) (colon - role));
    rb[colon - role] = '\0';
    if (kp_auth_role_parse(rb, &id->role) != 0 || !name_ok(colon + 1, strlen(colon + 1))) {
        return KP_AUTH_MALFORMED;
    }
    snprintf(id->name, sizeof(id->name), "%s", colon + 1);
    id->via = "certificate";
    return KP_AUTH_OK;
}

enum kp_auth_result kp_auth_check(struct kp_auth *a, const char *authz, size_t len,
                                  const char *const *uris, size_t n, struct kp_identity *id)
{
    enum kp_auth_result best = KP_AUTH_MISSING;

    if (authz != NULL) {
        if (a->path == NULL) {
            return KP_AUTH_UNKNOWN; /* this daemon takes certificates only */
        }
        return check_token(a, authz, len, id);
    }
    if (!a->certs) {
        return KP_AUTH_MISSING;
    }
    for (size_t i = 0; i < n; i++) {
        enum kp_auth_result r = check_uri(uris[i], id);

        if (r == KP_AUTH_OK) {
            return r;
        }
        if (r == KP_AUTH_MALFORMED) {
            best = r;
        }
    }
    return best;
}

size_t kp_auth_tokens(struct kp_auth *a)
{
    size_t n;

    pthread_mutex_lock(&a->mu);
    maybe_reload_locked(a);
    n = a->tab.n;
    pthread_mutex_unlock(&a->mu);
    return n;
}
