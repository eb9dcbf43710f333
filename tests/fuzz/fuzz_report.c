/*
 * fuzz_report: collectord's path for an agent's bytes on Control.Attach: AgentReport unpack,
 * validation, the rank states taken into the coordinator and the job listing built from the
 * processes (kp_coord_feed_report), and the rank-list parser that StartCapture and kprofctl
 * use on user text (kp_ranks_parse / kp_ranks_format). Any input must be refused
 * cleanly or taken in without a crash, leak or sanitizer report.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "kp_ranks.h"
#include "kprof.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant);

size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant)
{
    Kprof__V1__AgentReport r = KPROF__V1__AGENT_REPORT__INIT;
    Kprof__V1__AgentProcess p[3], *pp[3];
    Kprof__V1__AgentCaptureRank q[2], *qp[2];
    size_t n;

    r.host = "node-a";
    r.agent_id = 0xA1 + (uint64_t) variant;
    r.version = "fuzz";
    for (int i = 0; i < 3; i++) {
        kprof__v1__agent_process__init(&p[i]);
        p[i].job = variant == 2 ? "ddp-\xc3\xa9" : "ddp-42";
        p[i].rank = i + variant;
        p[i].world_size = 4;
        p[i].pid = 100 + (uint32_t) i;
        p[i].step = 40 + i;
        p[i].step_ms = 20;
        pp[i] = &p[i];
    }
    for (int i = 0; i < 2; i++) {
        kprof__v1__agent_capture_rank__init(&q[i]);
        q[i].run_id = 1;
        q[i].rank = i;
        q[i].state = KPROF__V1__RANK_STATE__RANK_STATE_CAPTURING + i;
        q[i].reason = i ? "process 101 exited" : "";
        qp[i] = &q[i];
    }
    r.n_processes = 3;
    r.processes = pp;
    r.n_ranks = variant > 0 ? 2 : 0;
    r.ranks = qp;
    n = kprof__v1__agent_report__get_packed_size(&r);
    if (n > cap) {
        return 0;
    }
    return kprof__v1__agent_report__pack(&r, buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct kp_coord *c;
    struct kp_coord_opts o = { 0 };
    char why[300], text[128], out[64];
    uint8_t sel[64];
    bool all;
    long bad;

    if (c == NULL && kp_coord_create(&o, &c) != 0) {
        abort();
    }
    kp_coord_feed_report(c, size > 0 ? data[0] % 4 : 0, data, size, why, sizeof(why));

    /* the same bytes as a --ranks text */
    size_t n = size < sizeof(text) - 1 ? size : sizeof(text) - 1;
    memcpy(text, data, n);
    text[n] = '\0';
    memset(sel, 0, sizeof(sel));
    if (kp_ranks_parse(text, sizeof(sel), sel, &all, &bad) == 0 && !all) {
        kp_ranks_format(sel, sizeof(sel), out, sizeof(out));
        if (strlen(out) >= sizeof(out)) {
            abort();
        }
    }
    return 0;
}
