#include "kp_ready.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int kp_ready_file_write(const char *path, const struct kp_ready_entry *entries, size_t n,
                        char *errbuf, size_t errlen)
{
    char tmp[4200];
    FILE *f;
    int rc;

    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    if ((size_t) snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp)) {
        snprintf(errbuf, errlen, "cannot write --ready-file %s: the path is too long", path);
        return -ENAMETOOLONG;
    }
    if ((f = fopen(tmp, "w")) == NULL) {
        rc = errno != 0 ? -errno : -EIO;
        snprintf(errbuf, errlen, "cannot write --ready-file %s: %s", tmp, strerror(-rc));
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        if (entries[i].value != NULL) {
            fprintf(f, "%s=%s\n", entries[i].key, entries[i].value);
        }
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        snprintf(errbuf, errlen, "cannot write --ready-file %s: %s", path, strerror(errno));
        unlink(tmp);
        return -EIO;
    }
    return 0;
}
