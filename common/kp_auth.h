/*
 * kp_auth: who calls a kprof daemon, and in which role (docs/security.md).
 *
 * Roles:
 *   agent     kprof-agent: Control.Attach, and Ingest.Push into the captures collectord armed
 *             for it (CreateRun/EndRun where its local path needs them);
 *   operator  start, stop, import, drop, and everything a viewer may do;
 *   viewer    list, status, every analysis and export.
 *
 * A caller proves a role with either
 *   - a bearer token: the call's "authorization: Bearer TOKEN" metadata, looked up in the
 *     daemon's token file; or
 *   - a client certificate (mutual TLS) that the daemon's --tls-client-ca signed, whose
 *     subjectAltName holds the URI urn:kprof:ROLE:NAME.
 *
 * The token file holds one token a line, "ROLE NAME TOKEN [expires=YYYY-MM-DDTHH:MM:SSZ]";
 * blank lines and lines starting with '#' are skipped. NAME identifies the caller in logs,
 * and for an agent it is the node it speaks for (docs/security.md: "*" lets one token speak
 * for any node). TOKEN is 16 to 256 printable characters. The file must not be readable by
 * others (mode 0600, or 0640 for the daemon's group). It is read again when it changes
 * (checked at most once a second), so a token is rotated without a restart: add the new
 * token, move the clients, remove the old one. A file that no longer parses keeps the last
 * good table, and says why in the log once.
 *
 * Secrets never reach a log line or an error message: callers are named by NAME and peer.
 */
#ifndef KP_AUTH_H
#define KP_AUTH_H

#include <stdbool.h>
#include <stddef.h>

enum kp_role {
    KP_ROLE_AGENT = 1u << 0,
    KP_ROLE_VIEWER = 1u << 1,
    KP_ROLE_OPERATOR = 1u << 2,
};

#define KP_ROLES_ALL     (KP_ROLE_AGENT | KP_ROLE_VIEWER | KP_ROLE_OPERATOR)
#define KP_AUTH_NAME_MAX 64

/* An authenticated caller. */
struct kp_identity {
    unsigned role;               /* one KP_ROLE_*, or KP_ROLES_ALL where authentication is off */
    char name[KP_AUTH_NAME_MAX]; /* the token's or the certificate's NAME; "anonymous" */
    const char *via;             /* "token", "certificate" or "none" (static) */
};

/* Why a credential was refused (the caller's status is UNAUTHENTICATED either way). */
enum kp_auth_result {
    KP_AUTH_OK = 0,
    KP_AUTH_MISSING,   /* no token and no certificate with a kprof role */
    KP_AUTH_UNKNOWN,   /* a token that is not in the file (wrong, or rotated out) */
    KP_AUTH_EXPIRED,   /* a token past its expires= */
    KP_AUTH_MALFORMED, /* an authorization header that is not "Bearer TOKEN", or a bad URI */
};

struct kp_auth;

/*
 * Creates the checker. token_file: the token table ("" or NULL: no tokens); certs: accept a
 * role from a verified client certificate. At least one of the two. Returns 0 and *out, or a
 * negative code with a message in errbuf (the file's line number for a bad line, never its
 * secret).
 */
int kp_auth_create(const char *token_file, bool certs, struct kp_auth **out, char *errbuf,
                   size_t errlen);

/* Frees a. Accepts NULL. */
void kp_auth_destroy(struct kp_auth *a);

/*
 * Authenticates one call. authz: the value of its "authorization" metadata (len bytes, not
 * NUL-terminated; NULL when absent). uris: the URIs of the client certificate the TLS layer
 * verified (n of them; none without mTLS). A token wins over a certificate when both are
 * present. Fills *id on KP_AUTH_OK. Thread-safe (the table is swapped under a lock when the
 * file changes).
 */
enum kp_auth_result kp_auth_check(struct kp_auth *a, const char *authz, size_t len,
                                  const char *const *uris, size_t n, struct kp_identity *id);

/* The number of tokens loaded now (for /metrics and tests). */
size_t kp_auth_tokens(struct kp_auth *a);

/* Whether role may call a method open to roles (operator may do whatever viewer may). */
bool kp_auth_allows(unsigned roles, unsigned role);

/* "agent", "viewer", "operator" (one role), "any" for KP_ROLES_ALL; "?" otherwise. */
const char *kp_auth_role_name(unsigned role);

/* Parses a role name; returns 0 and *role, or KP_ECONFIG. */
int kp_auth_role_parse(const char *s, unsigned *role);

/* The words a refused caller is told ("no credential", "unknown token", ...). */
const char *kp_auth_result_text(enum kp_auth_result r);

#endif
