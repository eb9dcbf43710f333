/* kp_demangle over the C++ runtime's demangler (demangle.h). */
#include "demangle.h"

#include <stdlib.h>
#include <string.h>

/* libstdc++'s (and libc++abi's) C entry point behind abi::__cxa_demangle. */
extern char *__cxa_demangle(const char *mangled, char *out, size_t *len, int *status);

char *kp_demangle(const char *name, size_t len, size_t *out_len)
{
    char *z, *d;
    int status = -1;

    if (len < 3 || name[0] != '_' || name[1] != 'Z') {
        return NULL;
    }
    if ((z = malloc(len + 1)) == NULL) {
        return NULL;
    }
    memcpy(z, name, len);
    z[len] = '\0';
    d = __cxa_demangle(z, NULL, NULL, &status);
    free(z);
    if (status != 0 || d == NULL) {
        free(d);
        return NULL;
    }
    *out_len = strlen(d);
    return d;
}
