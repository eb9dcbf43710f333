/* The agent's start-up checks of its node: see preflight.h. */
#define KP_LOG_MODULE "agent"
#include "preflight.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_log.h"

int kp_preflight_profiling_admin_only(const char *path, char *why, size_t whylen)
{
    static const char key[] = "RmProfilingAdminOnly:";
    char line[256], dummy[1];
    FILE *f;
    int v = -1;

    if (why == NULL) {
        why = dummy;
        whylen = sizeof(dummy);
    }
    if ((f = fopen(path, "re")) == NULL) {
        snprintf(why, whylen, "%s: %s%s", path, strerror(errno),
                 errno == ENOENT ? " (no NVIDIA driver loaded on this node?)" : "");
        return -1;
    }
    snprintf(why, whylen, "%s has no RmProfilingAdminOnly line", path);
    while (fgets(line, sizeof(line), f) != NULL) {
        char *p = line, *end;
        long n;

        if (strncmp(p, key, sizeof(key) - 1) != 0) {
            continue;
        }
        p += sizeof(key) - 1;
        n = strtol(p, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') {
            end++;
        }
        if (end == p || *end != '\0' || (n != 0 && n != 1)) {
            snprintf(why, whylen, "%s: RmProfilingAdminOnly is not 0 or 1", path);
            break;
        }
        v = (int) n;
        why[0] = '\0';
        break;
    }
    fclose(f);
    return v;
}

int kp_preflight_profiling_log(const char *path)
{
    char why[512];
    int v = kp_preflight_profiling_admin_only(path, why, sizeof(why));

    if (v == 1) {
        kp_log_warn("GPU performance counters are restricted to admin users on this node "
                    "(RmProfilingAdminOnly: 1 in %s): CUPTI's profiling API fails with "
                    "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES in training processes that are not root; "
                    "tracing (kernels, copies, NVTX) is not affected. To allow counters, set "
                    "\"options nvidia NVreg_RestrictProfilingToAdminUsers=0\" in a file under "
                    "/etc/modprobe.d/ and reload the nvidia module (or reboot), or run the "
                    "training processes with CAP_SYS_ADMIN (CAP_PERFMON from driver R565)",
                    path);
    }
    else if (v == 0) {
        kp_log_debug("GPU performance counters are open to every user (RmProfilingAdminOnly: 0)");
    }
    else {
        kp_log_debug("GPU profiling permission unknown: %s", why);
    }
    return v;
}
