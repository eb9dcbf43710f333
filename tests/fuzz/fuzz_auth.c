/*
 * fuzz_auth: a daemon's token table (kp_auth.h), the "authorization" metadata of a call and a
 * client certificate's URI, the three things from outside that kp_auth parses. The input is
 * split at its first two NUL bytes into a table text, a header value and a URI. Any input
 * must be refused cleanly or parsed without a crash or sanitizer report; an accepted caller
 * must have exactly one role and a name.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant);

size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant)
{
    static const char *const seeds[] = {
        "# tokens\noperator alice operator-token-0123456789\nviewer bob "
        "viewer-token-0123456789ab expires=2030-01-01T00:00:00Z\n\0Bearer "
        "operator-token-0123456789\0urn:kprof:agent:node-a",
        "agent * agent-token-0123456789abc expires=1999999999\r\n\0bearer "
        "agent-token-0123456789abc\0urn:kprof:viewer:x",
        "viewer v old-token-0123456789abcdef expires=2020-02-30T00:00:00Z\n\0Basic abc\0urn:kprof:",
    };
    const char *s = seeds[variant % 3];
    size_t n = 0;

    /* the seeds hold NULs: their length is up to the end of the third part */
    for (int part = 0; part < 3; part++) {
        n += strlen(s + n) + (part < 2 ? 1 : 0);
    }
    if (n > cap) {
        n = cap;
    }
    memcpy(buf, s, n);
    return n;
}

static bool one_role(unsigned r)
{
    return r == KP_ROLE_AGENT || r == KP_ROLE_VIEWER || r == KP_ROLE_OPERATOR;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *) data, *end = p + size;
    const char *nul1 = memchr(p, '\0', size), *hdr = end, *uri_p = end;
    size_t table_len = nul1 != NULL ? (size_t) (nul1 - p) : size, hdr_len = 0;
    struct kp_auth *a = NULL;
    struct kp_identity id;
    char err[512], uri[300];
    const char *uris[1] = { uri };

    if (nul1 != NULL) {
        const char *nul2;

        hdr = nul1 + 1;
        nul2 = memchr(hdr, '\0', (size_t) (end - hdr));
        hdr_len = nul2 != NULL ? (size_t) (nul2 - hdr) : (size_t) (end - hdr);
        uri_p = nul2 != NULL ? nul2 + 1 : end;
    }
    snprintf(uri, sizeof(uri), "%.*s", (int) (end - uri_p < 299 ? end - uri_p : 299), uri_p);
    if (kp_auth_create_text(p, table_len, true, &a, err, sizeof(err)) != 0) {
        return 0;
    }
    memset(&id, 0, sizeof(id));
    if (kp_auth_check(a, nul1 != NULL ? hdr : NULL, hdr_len, uris, 1, &id) == KP_AUTH_OK) {
        if (!one_role(id.role) || id.name[0] == '\0' || id.via == NULL) {
            abort();
        }
    }
    memset(&id, 0, sizeof(id));
    if (kp_auth_check(a, NULL, 0, uris, 1, &id) == KP_AUTH_OK) {
        if (!one_role(id.role) || id.name[0] == '\0' || strcmp(id.via, "certificate") != 0) {
            abort();
        }
    }
    kp_auth_destroy(a);
    return 0;
}
