/* The Memory view (Analyzer.Memory): the memory view's per-operator allocation statistics of
 * one rank per device (an.h kp_an_memory, view.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "an.h"
#include "kprof.pb-c.h"
#include "view.h"

struct memory_state {
    Kprof__V1__MemoryResponse m;
    struct kp_an_memory mem;
    char names[KP_AN_MAX_GPUS + 1][16]; /* "CPU", "GPU<n>" by slot */
    char *devices[KP_AN_MAX_GPUS + 1];
    Kprof__V1__MemoryOpRow *rows, **ptrs;
};

static bool memory_key(const ProtobufCMessage *req, size_t max_rows, struct kp_view_key *k,
                       char *err, size_t len)
{
    const Kprof__V1__MemoryRequest *r = (const Kprof__V1__MemoryRequest *) req;

    (void) max_rows;
    return kp_view_key_init(k, r->run_id, r->rank, false, err, len);
}

static void memory_free(void *p)
{
    struct memory_state *s = p;

    kp_an_memory_fini(&s->mem);
    free(s->rows);
    free(s->ptrs);
    free(s);
}

static int memory_compute(struct kp_view_ctx *c, struct kp_view_reply *out)
{
    struct memory_state *s = calloc(1, sizeof(*s));
    int rc;

    if (s == NULL) {
        return -ENOMEM;
    }
    rc = kp_an_memory(c->an, c->pg, (int64_t) c->key->run, (int) c->key->rank, c->max_rows, &s->mem,
                      c->err, c->errlen);
    if (rc != 0) {
        memory_free(s);
        return rc;
    }
    s->rows = calloc(s->mem.n_rows + 1, sizeof(*s->rows));
    s->ptrs = calloc(s->mem.n_rows + 1, sizeof(*s->ptrs));
    if (s->rows == NULL || s->ptrs == NULL) {
        memory_free(s);
        return -ENOMEM;
    }
    kprof__v1__memory_response__init(&s->m);
    for (int slot = 0; slot <= KP_AN_MAX_GPUS; slot++) {
        if (slot == 0) {
            snprintf(s->names[slot], sizeof(s->names[slot]), "CPU");
        }
        else {
            snprintf(s->names[slot], sizeof(s->names[slot]), "GPU%d", slot - 1);
        }
        if (s->mem.seen[slot]) {
            s->devices[s->m.n_devices++] = s->names[slot];
        }
    }
    for (size_t i = 0; i < s->mem.n_rows; i++) {
        const struct kp_an_mem_row *r = &s->mem.rows[i];
        Kprof__V1__MemoryOpRow *o = &s->rows[i];

        kprof__v1__memory_op_row__init(o);
        o->device = s->names[r->slot];
        o->name = (char *) r->name;
        o->self_increase_bytes = r->v[0];
        o->self_alloc_bytes = r->v[1];
        o->self_alloc_count = r->v[2];
        o->increase_bytes = r->v[3];
        o->alloc_bytes = r->v[4];
        o->alloc_count = r->v[5];
        o->calls = r->v[6];
        s->ptrs[i] = o;
    }
    s->m.run_id = c->key->run;
    s->m.rank = c->key->rank;
    s->m.devices = s->devices;
    s->m.n_rows = s->mem.n_rows;
    s->m.rows = s->ptrs;
    out->msg = &s->m.base;
    out->state = s;
    out->free_fn = memory_free;
    return 0;
}

const struct kp_view kp_view_memory = {
    .name = "Memory",
    .request = &kprof__v1__memory_request__descriptor,
    .reply = &kprof__v1__memory_response__descriptor,
    .load_rank = true,
    .windowed = KP_AN_WIN_MEMORY,
    .key = memory_key,
    .compute = memory_compute,
    .bytes_per_event = 165,
};
