/*
 * kp_wire: the node-local protocol between libkprof_inject.so (inside each worker process)
 * and kprof-agent (one per node).
 *
 * Transport: a filesystem AF_UNIX SOCK_SEQPACKET socket (default KP_WIRE_DEFAULT_SOCKET).
 * SEQPACKET keeps message boundaries, so each send(2) is one message: a struct kp_wire_hdr
 * followed by hdr.len payload bytes, at most KP_WIRE_MAX_MSG bytes in all. Both ends are on
 * one host, so structs travel in host byte order; every record message states its record
 * size, so a newer sender may append fields and an older reader still walks the records.
 * The agent learns the peer's pid/uid/gid from SO_PEERCRED, never from the message.
 *
 * Conversation of a worker (the library):
 *   lib → HELLO (identity)                    agent → WELCOME (accepted, or refused + reason)
 *   agent → ARM (a capture)                   lib → STATUS (state changes, 1 s heartbeats)
 *   lib → STRINGS (id → text, before any record that uses the id; ids are per process)
 *   lib → WINDOW_BEGIN, then STEP / RECORDS ..., then WINDOW_END (after the final flush: every
 *         record of the window precedes it)
 *   agent → DISARM (stop the capture early)
 * Records are raw: the library decodes CUPTI and NVTX into these compact structs and nothing
 * more. The agent joins GPU records to their launch API record by correlation id (step, op),
 * assigns steps, keeps what falls inside the window and builds protobuf batches.
 *
 * Captures are started and stopped through kprofctl and collectord, never on this socket: a
 * message of the retired local control plane (type 20) closes its connection with a reason.
 *
 * Unknown message types are ignored by both ends (logged once); a malformed message (bad
 * magic, version, or a length that does not match) closes that one connection.
 */
#ifndef KP_WIRE_H
#define KP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KP_WIRE_MAGIC          0x4b505731u /* "KPW1" */
#define KP_WIRE_VERSION        1
#define KP_WIRE_MAX_MSG        (64u * 1024u)
#define KP_WIRE_DEFAULT_SOCKET "/run/kprof/agent.sock"
#define KP_WIRE_MAX_TEXT       1024 /* job, host, reasons, ctl text lines */

struct kp_wire_hdr {
    uint32_t magic;   /* KP_WIRE_MAGIC */
    uint16_t version; /* KP_WIRE_VERSION */
    uint16_t type;    /* enum kp_wire_type */
    uint32_t len;     /* payload bytes after this header */
    uint32_t count;   /* RECORDS, STRINGS: number of entries; otherwise 0 */
};

enum kp_wire_type {
    KP_W_HELLO = 1,        /* lib → agent: struct kp_wire_hello */
    KP_W_WELCOME = 2,      /* agent → lib: struct kp_wire_welcome */
    KP_W_ARM = 3,          /* agent → lib: struct kp_wire_arm */
    KP_W_DISARM = 4,       /* agent → lib: struct kp_wire_disarm */
    KP_W_STATUS = 5,       /* lib → agent: struct kp_wire_status */
    KP_W_STRINGS = 6,      /* lib → agent: count × { uint32 id; uint32 len; bytes; pad to 4 } */
    KP_W_RECORDS = 7,      /* lib → agent: struct kp_wire_records, then count records */
    KP_W_WINDOW_BEGIN = 8, /* lib → agent: struct kp_wire_window */
    KP_W_WINDOW_END = 9,   /* lib → agent: struct kp_wire_window */
    KP_W_STEP = 10,        /* lib → agent: struct kp_wire_step (a step started) */
    KP_W_CTL_REQUEST = 20, /* retired (a local control client's request): refused, see above */
};

/* Activity selection (ARM.activities). */
enum kp_wire_activity {
    KP_ACT_KERNEL = 1u << 0,
    KP_ACT_MEMCPY = 1u << 1,
    KP_ACT_MEMSET = 1u << 2,
    KP_ACT_RUNTIME = 1u << 3, /* runtime API calls, driver launch calls */
    KP_ACT_NVTX = 1u << 4,    /* NVTX / op ranges (and external correlation) */
    KP_ACT_SYNC = 1u << 5,
    KP_ACT_OVERHEAD = 1u << 6,
    KP_ACT_DEFAULT = 0x7f,
};

/* Capture state of one process (STATUS.state). */
enum kp_wire_state {
    KP_ST_DORMANT = 0,   /* registered, nothing enabled */
    KP_ST_ARMED = 1,     /* waiting for the target step */
    KP_ST_WARMUP = 2,    /* kinds enabled one step early; records before the window dropped */
    KP_ST_CAPTURING = 3, /* inside the window */
    KP_ST_FLUSHING = 4,  /* window over, draining CUPTI */
    KP_ST_DONE = 5,      /* WINDOW_END sent */
    KP_ST_FAILED = 6,    /* reason in STATUS.reason */
};

struct kp_wire_hello {
    uint32_t wire_version;  /* KP_WIRE_VERSION */
    uint32_t pid;           /* self-reported (the agent trusts SO_PEERCRED instead) */
    int32_t rank;           /* RANK, -1 if unknown */
    int32_t local_rank;     /* LOCAL_RANK, -1 */
    int32_t world_size;     /* WORLD_SIZE, -1 */
    int32_t device;         /* CUDA ordinal if known, else -1 */
    uint32_t cupti_version; /* cuptiGetVersion(), 0 if CUPTI is unavailable */
    uint32_t flags;         /* KP_HELLO_* */
    int64_t current_step;   /* -1 before the first step */
    uint64_t start_time_ns; /* CLOCK_REALTIME at library init: one process incarnation */
    char job[256];          /* KPROF_JOB, TORCHELASTIC_RUN_ID or SLURM_JOB_ID; "" if none */
    char host[256];         /* gethostname() */
    char cupti_error[256];  /* why CUPTI is unusable ("" if fine): captures will fail */
};
#define KP_HELLO_STEP_HOOK 1u /* kprof_step() has been called (the Python hook is active) */
#define KP_HELLO_NVTX      2u /* the NVTX injection is ours */

struct kp_wire_welcome {
    uint32_t accepted; /* 1, or 0: the agent refuses this process (reason says why) */
    uint32_t pad;
    uint64_t agent_id; /* the agent's incarnation, for logs */
    char reason[256];
};

struct kp_wire_arm {
    uint64_t capture_id; /* the agent's id for this window in this process */
    uint64_t run_id;
    int64_t target_step;  /* first step of the window; -1: start now (time window) */
    uint32_t n_steps;     /* window length in steps; 0: use duration_ms */
    uint32_t activities;  /* KP_ACT_* mask; 0: KP_ACT_DEFAULT */
    uint64_t duration_ms; /* window length in ms (also the limit for a step window; 0: none) */
    uint64_t deadline_ns; /* CLOCK_REALTIME: give up (FAILED) if the window has not begun */
};

struct kp_wire_disarm {
    uint64_t capture_id;
};

struct kp_wire_status {
    uint64_t capture_id; /* 0 when no capture */
    uint32_t state;      /* enum kp_wire_state */
    int32_t device;      /* -1 if still unknown */
    int64_t current_step;
    uint64_t records;       /* records sent to the agent in this capture */
    uint64_t dropped;       /* dropped by the library (queue full, buffer pool empty, ...) */
    uint64_t cupti_dropped; /* cuptiActivityGetNumDroppedRecords, summed */
    uint64_t incomplete;    /* records without timestamps */
    uint64_t overhead_ns;   /* CUPTI overhead in this capture */
    char reason[256];       /* FAILED: what went wrong and what to do */
};

struct kp_wire_window {
    uint64_t capture_id;
    uint64_t run_id;
    int64_t start_ns;   /* CLOCK_REALTIME of the window's first step start (or arm time) */
    int64_t end_ns;     /* WINDOW_END: end of the window; BEGIN: 0 */
    int64_t first_step; /* -1 for a time window */
    int64_t last_step;  /* WINDOW_END: last step inside the window; BEGIN: -1 */
    /* WINDOW_END: the capture's final counters (as in STATUS) */
    uint64_t records, dropped, cupti_dropped, incomplete, overhead_ns;
    /* clock pair at this point: detects clock steps across the window */
    int64_t realtime_ns, monotonic_raw_ns;
};

struct kp_wire_step {
    int64_t step;     /* this step starts now */
    int64_t start_ns; /* CLOCK_REALTIME */
    uint32_t source;  /* enum kp_wire_step_source */
    uint32_t pad;
};
enum kp_wire_step_source {
    KP_STEP_HOOK = 1,
    KP_STEP_NVTX_RANGE = 2,
    KP_STEP_NVTX_MARK = 3
};

/* RECORDS payload header: `count` records of `rec_size` bytes each follow. */
struct kp_wire_records {
    uint32_t kind;     /* enum kp_wire_rec_kind */
    uint32_t rec_size; /* sizeof the sender's struct; a reader uses min(rec_size, its own) */
};

enum kp_wire_rec_kind {
    KP_REC_KERNEL = 1,
    KP_REC_MEMCPY = 2,
    KP_REC_MEMSET = 3,
    KP_REC_API = 4, /* runtime/driver API call, and CUPTI overhead (domain 3) */
    KP_REC_SYNC = 5,
    KP_REC_RANGE = 6, /* NVTX / op range instance */
};

/* Times are CLOCK_REALTIME ns (CUPTI's default source). Strings are ids from STRINGS, 0 = "". */
struct kp_wire_kernel {
    int64_t start_ns, end_ns;
    uint64_t correlation;
    uint64_t graph_node_id;
    uint32_t name;
    uint32_t device, context, stream;
    uint32_t grid_x, grid_y, grid_z;
    uint32_t block_x, block_y, block_z;
    uint32_t registers, static_smem, dynamic_smem;
    uint32_t graph_id;
};

struct kp_wire_memcpy {
    int64_t start_ns, end_ns;
    uint64_t bytes;
    uint64_t correlation;
    uint32_t copy_kind, src_kind, dst_kind; /* CUpti_ActivityMemcpyKind, CUpti_ActivityMemoryKind */
    uint32_t device, context, stream;
    uint32_t src_device, dst_device; /* peer copies; else = device */
};

struct kp_wire_memset {
    int64_t start_ns, end_ns;
    uint64_t bytes;
    uint64_t correlation;
    uint32_t value, mem_kind;
    uint32_t device, context, stream;
    uint32_t pad;
};

struct kp_wire_api {
    int64_t start_ns, end_ns;
    uint64_t correlation;
    uint64_t external_id; /* innermost range instance (CUSTOM2 external correlation), 0: none */
    uint64_t tid;         /* gettid() (CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM) */
    uint32_t domain;      /* kprof.v1.ApiDomain: 1 runtime, 2 driver, 3 CUPTI overhead */
    uint32_t cbid;        /* callback id; overhead: CUpti_ActivityOverheadKind */
    uint32_t name;        /* e.g. "cudaLaunchKernel"; overhead: its kind's name */
    int32_t return_value;
};

struct kp_wire_sync {
    int64_t start_ns, end_ns;
    uint64_t correlation;
    uint32_t sync_type;                           /* CUpti_ActivitySynchronizationType */
    uint32_t device, context, stream, cuda_event; /* 0 where CUPTI says "not applicable" */
    uint32_t pad;
};

struct kp_wire_range {
    int64_t start_ns, end_ns;
    uint64_t range_id;  /* process-unique instance id (the CUSTOM2 external id), never 0 */
    uint64_t parent_id; /* enclosing instance on the same thread and domain, 0: none */
    uint64_t tid;       /* gettid() */
    int64_t seq;        /* PyTorch autograd seq from "..., seq = N", -1 if none */
    int64_t op_id;      /* PyTorch op_id from "..., op_id = N", -1 if none */
    uint32_t name;      /* op name only ("aten::addmm"), message parsed */
    uint32_t domain;    /* domain name id, 0 = default domain */
    uint32_t shapes;    /* "sizes = [[...]]" text, 0 if none */
    uint32_t kind;      /* kprof.v1.OpKind: CPU_OP for emit_nvtx ops, NVTX otherwise,
                         * PROFILER_STEP for ProfilerStep#N */
    uint32_t flags;     /* KP_RANGE_* */
    uint32_t pad;
};
#define KP_RANGE_PRE_WINDOW 1u /* pushed before recording began (no id pushed to CUPTI) */
#define KP_RANGE_UNCLOSED   2u /* still open at window end; end_ns is the window end */

/*
 * Helpers shared by both ends. A message is built in a caller buffer of KP_WIRE_MAX_MSG bytes.
 */

/* Writes a header for a payload of len bytes into buf. */
void kp_wire_hdr_init(struct kp_wire_hdr *h, enum kp_wire_type type, uint32_t len, uint32_t count);

/*
 * Checks a received message of n bytes: magic, version, len == n - sizeof(hdr), len within
 * KP_WIRE_MAX_MSG, and, for types with a fixed payload struct, len >= that struct's size
 * (RECORDS: rec_size > 0 and count * rec_size == len - sizeof(struct kp_wire_records); STRINGS:
 * every entry inside len). Returns 0, or -EPROTO with a reason in why (may be NULL).
 */
int kp_wire_check(const void *msg, size_t n, const char **why);

/* Size of the fixed record struct of a kind, 0 if unknown. */
size_t kp_wire_rec_size(uint32_t kind);

/* Name of a state ("capturing") or "?". */
const char *kp_wire_state_name(uint32_t state);

/* Parses "kernel,memcpy,memset,runtime,nvtx,sync,overhead" or "all" into a KP_ACT_* mask.
 * Returns 0, or -EINVAL with the offending word in *bad (points into s). */
int kp_wire_parse_activities(const char *s, uint32_t *mask, const char **bad);

#endif
