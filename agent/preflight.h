/*
 * preflight: what the agent checks about its node at start, so that an admin reads the cause in
 * the agent's log (and in /metrics) before a capture comes back without what it asked for.
 *
 * GPU profiling permission: with the NVIDIA driver's module parameter
 * NVreg_RestrictProfilingToAdminUsers=1 (its default since driver 418.43, shown as
 * "RmProfilingAdminOnly: 1" in /proc/driver/nvidia/params), CUPTI's profiling API (hardware
 * counters) answers CUPTI_ERROR_INSUFFICIENT_PRIVILEGES in every process that is neither root
 * nor holds CAP_SYS_ADMIN (or CAP_PERFMON from driver R565); tracing (kernels, copies, NVTX)
 * is not restricted (docs/specs/capture.md §3).
 */
#ifndef KP_AGENT_PREFLIGHT_H
#define KP_AGENT_PREFLIGHT_H

#include <stddef.h>

/* Where the NVIDIA driver publishes its module parameters. */
#define KP_NVIDIA_PARAMS_PATH "/proc/driver/nvidia/params"

/* RmProfilingAdminOnly of the driver, from path (the format of /proc/driver/nvidia/params,
 * "Name: value" a line): 1 counters are admin-only, 0 open to every user, -1 unknown (no such
 * file: no NVIDIA driver loaded; unreadable; no such line or a value that is not 0 or 1), with
 * why it is unknown in why (why may be NULL). */
int kp_preflight_profiling_admin_only(const char *path, char *why, size_t whylen);

/* Reads path as above and logs the outcome under the agent's module: a warning that says what
 * to do when counters are admin-only, a debug line otherwise. Returns what
 * kp_preflight_profiling_admin_only returned. */
int kp_preflight_profiling_log(const char *path);

#endif
