#include "kp_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kp_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
    case KP_EPG:
        return "PostgreSQL error";
    case KP_EPROTO:
        return "malformed protocol message";
    case KP_ERPC:
        return "gRPC call failed";
    case KP_ENOTFOUND:
        return "not found";
    case KP_ETOOBIG:
        return "over the configured size limit";
    case KP_ECONFIG:
        return "invalid configuration";
    case KP_ESCHEMA:
        return "database schema is newer than this binary";
    case KP_ESHUTDOWN:
        return "shutting down";
    case KP_EWHOLE:
        return "can only be read whole";
    default:
        break;
    }
    if (err < 0 && err > KP_EBASE) {
        /* strerror() is not thread-safe in general, but glibc's returns static strings
         * for known codes, which is all we pass it. */
        return strerror(-err);
    }
    return "unknown error";
}

void kp_errbuf_set(char *errbuf, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (errbuf == NULL || errlen == 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}
