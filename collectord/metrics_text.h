/*
 * One counter or gauge of kprof-collectord's /metrics in Prometheus text format 0.0.4, for
 * both roles (collectord.c, consumer.c): "kprof_collectord_" NAME with its HELP and TYPE
 * lines, appended to out (a struct kp_strbuf *). name and help are string literals.
 */
#ifndef KP_METRICS_TEXT_H
#define KP_METRICS_TEXT_H

#include <inttypes.h>
#include <stdint.h>

#include "kp_strbuf.h"

#define KP_CD_METRIC(out, type, name, help, v)                                                   \
    kp_strbuf_appendf((out),                                                                     \
                      "# HELP kprof_collectord_" name " " help "\n# TYPE kprof_collectord_" name \
                      " " type "\nkprof_collectord_" name " %" PRIu64 "\n",                      \
                      (uint64_t) (v))
#define KP_CD_COUNTER(out, name, help, v) KP_CD_METRIC(out, "counter", name, help, v)
#define KP_CD_GAUGE(out, name, help, v)   KP_CD_METRIC(out, "gauge", name, help, v)

#endif
