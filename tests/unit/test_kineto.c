/*
 * Unit tests of kp_kineto: small hand-written Kineto traces for every category and every
 * error case, parsed twice like kprofctl import does (a scan, then a pass whose batches are
 * captured), with the rows checked column by column.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kp_err.h"
#include "kp_kineto.h"

#define MAX_BATCHES 256

struct capture {
    Kprof__V1__Batch *b[MAX_BATCHES];
    size_t n;
};

static int capture_cb(Kprof__V1__Batch *b, void *ud)
{
    struct capture *c = ud;
    size_t len = kprof__v1__batch__get_packed_size(b);
    uint8_t *buf = malloc(len);

    assert_non_null(buf);
    kprof__v1__batch__pack(b, buf);
    assert_true(c->n < MAX_BATCHES);
    c->b[c->n] = kprof__v1__batch__unpack(NULL, len, buf);
    assert_non_null(c->b[c->n]);
    c->n++;
    free(buf);
    return 0;
}

static void capture_free(struct capture *c)
{
    for (size_t i = 0; i < c->n; i++) {
        kprof__v1__batch__free_unpacked(c->b[i], NULL);
    }
    c->n = 0;
}

/* Encoded batches from a spool's replay, unpacked and packed again (canonical field order). */
struct enc_capture {
    uint8_t *buf[MAX_BATCHES];
    size_t len[MAX_BATCHES];
    size_t n;
};

static int enc_cb(const void *buf, size_t len, void *ud)
{
    struct enc_capture *c = ud;
    Kprof__V1__Batch *b = kprof__v1__batch__unpack(NULL, len, buf);

    assert_non_null(b);
    assert_true(c->n < MAX_BATCHES);
    assert_int_equal(b->stream, 0);
    assert_int_equal(b->seq, 0);
    c->len[c->n] = kprof__v1__batch__get_packed_size(b);
    c->buf[c->n] = malloc(c->len[c->n] + 1);
    assert_non_null(c->buf[c->n]);
    kprof__v1__batch__pack(b, c->buf[c->n]);
    c->n++;
    kprof__v1__batch__free_unpacked(b, NULL);
    return 0;
}

static void enc_free(struct enc_capture *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->buf[i]);
    }
    c->n = 0;
}

static void meta_equal(const struct kp_kineto_meta *a, const struct kp_kineto_meta *b)
{
    assert_int_equal(a->events, b->events);
    assert_int_equal(a->batches, b->batches);
    assert_int_equal(a->json_bytes, b->json_bytes);
    assert_int_equal(a->base_ns, b->base_ns);
    assert_int_equal(a->min_ns, b->min_ns);
    assert_int_equal(a->max_ns, b->max_ns);
    assert_int_equal(a->ext_dropped, b->ext_dropped);
    assert_int_equal(a->names_truncated, b->names_truncated);
    assert_memory_equal(a->rows, b->rows, sizeof(a->rows));
    assert_memory_equal(a->cats, b->cats, sizeof(a->cats));
}

/* Scans with a spool (in memory up to mem_limit) and replays it with the opts of the second
 * parse; the replayed batches must equal those of that parse (c), field for field. */
static void check_spool(const char *json, struct kp_kineto_opts o, size_t mem_limit,
                        const struct kp_kineto_meta *conv, const struct capture *c)
{
    struct kp_kineto_spool *sp;
    struct kp_kineto_meta scan, replayed;
    struct enc_capture e = { .n = 0 };
    char err[1024] = "";
    int rc;

    assert_int_equal(kp_kineto_spool_create(mem_limit, &sp), 0);
    o.meta = NULL;
    o.spool = sp;
    rc = kp_kineto_parse_mem(json, strlen(json), &o, NULL, NULL, &scan, err, sizeof(err));
    if (rc != 0) {
        fail_msg("scan with a spool failed: %s", err);
    }
    assert_true(kp_kineto_spool_bytes(sp) > 0);
    assert_true(kp_kineto_spool_mem_bytes(sp) <= mem_limit);
    o.spool = NULL;
    o.meta = &scan;
    rc = kp_kineto_spool_replay(sp, &o, enc_cb, &e, &replayed, err, sizeof(err));
    if (rc != 0) {
        fail_msg("replay failed (%d): %s", rc, err);
    }
    /* one replay per spool */
    assert_int_equal(kp_kineto_spool_replay(sp, &o, enc_cb, &e, &replayed, err, sizeof(err)),
                     KP_KINETO_REPARSE);
    kp_kineto_spool_destroy(sp);
    meta_equal(&replayed, conv);
    assert_int_equal(e.n, c->n);
    for (size_t i = 0; i < c->n; i++) {
        size_t len = kprof__v1__batch__get_packed_size(c->b[i]);
        uint8_t *buf = malloc(len + 1);

        assert_non_null(buf);
        kprof__v1__batch__pack(c->b[i], buf);
        assert_int_equal(e.len[i], len);
        assert_memory_equal(e.buf[i], buf, len);
        free(buf);
    }
    enc_free(&e);
}

/* Scans, then converts with the scan's meta; both must succeed. The spool's replay (in
 * memory, and in a temporary file) must give the same batches as the conversion. */
static void import(const char *json, uint32_t batch_rows, struct kp_kineto_meta *meta,
                   struct capture *c)
{
    struct kp_kineto_opts o;
    struct kp_kineto_meta scan;
    char err[1024] = "";
    int rc;

    memset(&o, 0, sizeof(o));
    o.batch_rows = batch_rows;
    rc = kp_kineto_parse_mem(json, strlen(json), &o, NULL, NULL, &scan, err, sizeof(err));
    if (rc != 0) {
        fail_msg("scan failed: %s", err);
    }
    o.meta = &scan;
    o.run_id = 7;
    o.rank = scan.rank;
    o.job = "unit";
    o.world_size = 2;
    rc = kp_kineto_parse_mem(json, strlen(json), &o, capture_cb, c, meta, err, sizeof(err));
    if (rc != 0) {
        fail_msg("convert failed: %s", err);
    }
    assert_int_equal(meta->batches, c->n);
    check_spool(json, o, 1 << 20, meta, c);
    check_spool(json, o, 0, meta, c);
}

static const char *str(const Kprof__V1__Batch *b, uint32_t idx)
{
    assert_true(idx < b->n_strings);
    return b->strings[idx];
}

static int64_t start_of(const Kprof__V1__Batch *b, const int64_t *deltas, size_t i)
{
    int64_t t = b->base_ns;

    for (size_t k = 0; k <= i; k++) {
        t += deltas[k];
    }
    return t;
}

/* The current format (B.8) with every category; baseTimeNanoseconds after traceEvents. */
static const char current_trace[] =
    "{\"schemaVersion\": 1,\n"
    " \"deviceProperties\": [{\"id\": 0, \"name\": \"NVIDIA H100 80GB HBM3\", \"totalGlobalMem\": "
    "85029158912, \"computeMajor\": 9, \"computeMinor\": 0, \"maxThreadsPerBlock\": 1024, "
    "\"maxThreadsPerMultiprocessor\": 2048, \"regsPerBlock\": 65536, \"warpSize\": 32, "
    "\"sharedMemPerBlock\": 49152, \"numSms\": 132, \"regsPerMultiprocessor\": 65536, "
    "\"sharedMemPerMultiprocessor\": 233472}],\n"
    " \"distributedInfo\": {\"backend\": \"nccl\", \"rank\": 1, \"world_size\": 2, \"pg_config\": "
    "[{\"ranks\": [0, 1]}]},\n"
    " \"host_name\": \"node7\",\n"
    " \"traceEvents\": [\n"
    "  {\"name\": \"process_labels\", \"ph\": \"M\", \"ts\": 1000.000, \"pid\": 0, \"tid\": 0, "
    "\"args\": {\"labels\": \"GPU 0\"}},\n"
    "  {\"ph\": \"X\", \"cat\": \"user_annotation\", \"name\": \"ProfilerStep#5\", \"pid\": 4242, "
    "\"tid\": 4242, \"ts\": 5000.000, \"dur\": 900.000, \"args\": {\"External id\": 1}},\n"
    "  {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::addmm\", \"pid\": 4242, \"tid\": 4242, "
    "\"ts\": 5030.400, \"dur\": 35.600, \"args\": {\"External id\": 4, \"Input type\": "
    "[\"c10::BFloat16\", \"Scalar\"], \"Input Dims\": [[64], [32, 128], []], \"Sequence number\": 4, "
    "\"Fwd thread id\": 0}},\n"
    "  {\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 4242, "
    "\"tid\": 4242, \"ts\": 5050.000, \"dur\": 8.500, \"args\": {\"External id\": 4, \"cbid\": 211, "
    "\"correlation\": 901}},\n"
    "  {\"ph\": \"X\", \"cat\": \"cuda_runtime\", \"name\": \"cudaStreamSynchronize\", \"pid\": 4242, "
    "\"tid\": 4242, \"ts\": 5060.000, \"dur\": 1, \"args\": {\"External id\": 902, \"cbid\": 131, "
    "\"correlation\": 902}},\n"
    "  {\"ph\": \"X\", \"cat\": \"cuda_driver\", \"name\": \"cuLaunchKernel\", \"pid\": 4242, \"tid\": "
    "-4243, \"ts\": 5070, \"dur\": 2, \"args\": {\"cbid\": 307, \"correlation\": 903}},\n"
    "  {\"ph\": \"s\", \"id\": 901, \"pid\": 4242, \"tid\": 4242, \"ts\": 5050.000, \"cat\": "
    "\"ac2g\", \"name\": \"ac2g\"},\n"
    "  {\"args\": {\"External id\": 4, \"device\": 0, \"context\": 1, \"stream\": 7, \"correlation\": "
    "901, \"registers per thread\": 168, \"shared memory\": 213248, \"grid\": [16, 1, 1], \"block\": "
    "[384, 1, 1], \"blocks per SM\": \"inf\"}, \"ph\": \"X\", \"cat\": \"kernel\", \"name\": "
    "\"sm90_gemm\", \"pid\": 0, \"tid\": 7, \"ts\": 5062.300, \"dur\": 4.100},\n"
    "  {\"ph\": \"f\", \"id\": 901, \"pid\": 0, \"tid\": 7, \"ts\": 5062.300, \"cat\": \"ac2g\", "
    "\"name\": \"ac2g\", \"bp\": \"e\"},\n"
    "  {\"ph\": \"X\", \"cat\": \"gpu_memcpy\", \"name\": \"Memcpy HtoD (Pinned -> Device)\", \"pid\": "
    "0, \"tid\": 7, \"ts\": 5100.000, \"dur\": 12.500, \"args\": {\"External id\": 6, \"device\": 0, "
    "\"context\": 1, \"stream\": 7, \"correlation\": 905, \"bytes\": 4194304}},\n"
    "  {\"ph\": \"X\", \"cat\": \"gpu_memset\", \"name\": \"Memset (Device)\", \"pid\": 0, \"tid\": "
    "7, \"ts\": 5120, \"dur\": 1, \"args\": {\"device\": 0, \"stream\": 7, \"correlation\": 906, "
    "\"bytes\": 128}},\n"
    "  {\"ph\": \"X\", \"cat\": \"cuda_sync\", \"name\": \"Stream Sync\", \"pid\": 0, \"tid\": 7, "
    "\"ts\": 5130, \"dur\": 3, \"args\": {\"cuda_sync_kind\": \"Stream Sync\", \"stream\": 7, "
    "\"correlation\": 902, \"device\": 0, \"context\": 1}},\n"
    "  {\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"s\": \"t\", \"name\": \"[memory]\", "
    "\"pid\": 4242, \"tid\": 4242, \"ts\": 5031.000, \"args\": {\"Total Reserved\": 2097152, "
    "\"Total Allocated\": 4096, \"Bytes\": -4096, \"Addr\": 140230045696000, \"Device Id\": 0, "
    "\"Device Type\": 1}},\n"
    "  {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"AddmmBackward0\", \"pid\": 4242, \"tid\": "
    "4301, \"ts\": 5600.000, \"dur\": 70.000, \"args\": {\"External id\": 40, \"Sequence number\": "
    "4, \"Fwd thread id\": 1}},\n"
    "  {\"ph\": \"s\", \"id\": 12, \"pid\": 4242, \"tid\": 4242, \"ts\": 5030.400, \"cat\": "
    "\"fwdbwd\", \"name\": \"fwdbwd\"},\n"
    "  {\"ph\": \"f\", \"id\": 12, \"pid\": 4242, \"tid\": 4301, \"ts\": 5600.000, \"cat\": "
    "\"fwdbwd\", \"name\": \"fwdbwd\", \"bp\": \"e\"},\n"
    "  {\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"record_param_comms\", \"pid\": 4242, "
    "\"tid\": 4301, \"ts\": 5700.000, \"dur\": 30.000, \"args\": {\"External id\": 50, "
    "\"Collective name\": \"allreduce\", \"dtype\": \"BFloat16\", \"In msg nelems\": 8256, "
    "\"Out msg nelems\": 8256, \"Group size\": 2, \"Process Group Name\": \"0\", \"Seq\": 3}},\n"
    "  {\"ph\": \"X\", \"cat\": \"gpu_user_annotation\", \"name\": \"ProfilerStep#5\", \"pid\": 0, "
    "\"tid\": 7, \"ts\": 5062.299, \"dur\": 50.202, \"args\": {\"External id\": 1}},\n"
    "  {\"ph\": \"X\", \"cat\": \"python_function\", \"name\": \"nn.Module: Linear_0\", \"pid\": "
    "4242, \"tid\": 4242, \"ts\": 5010, \"dur\": 80, \"args\": {\"Python id\": 9, \"Python parent "
    "id\": null}},\n"
    "  {\"ph\": \"X\", \"cat\": \"python_function\", \"name\": \"train.py(42): step\", \"pid\": "
    "4242, \"tid\": 4242, \"ts\": 5011, \"dur\": 10, \"args\": {\"Python id\": 10, \"Python parent "
    "id\": 9}},\n"
    "  {\"ph\": \"X\", \"cat\": \"Trace\", \"name\": \"PyTorch Profiler (0)\", \"pid\": \"Spans\", "
    "\"tid\": \"PyTorch Profiler\", \"ts\": 900.000, \"dur\": 5000.000},\n"
    "  {\"ph\": \"i\", \"s\": \"g\", \"name\": \"Record Window End\", \"pid\": \"\", \"tid\": \"\", "
    "\"ts\": 5950.000}\n"
    " ],\n"
    " \"displayTimeUnit\": \"ms\",\n"
    " \"baseTimeNanoseconds\": 1759276800000000000,\n"
    " \"traceName\": \"x\"}\n";

#define BASE 1759276800000000000LL

static void test_current_format(void **state)
{
    struct kp_kineto_meta m;
    struct capture c = { .n = 0 };
    const Kprof__V1__Batch *b;

    import(current_trace, 0, &m, &c);
    assert_int_equal(c.n, 1);
    b = c.b[0];
    assert_true(m.has_rank);
    assert_int_equal(m.rank, 1);
    assert_int_equal(m.world_size, 2);
    assert_int_equal(m.base_ns, BASE);
    assert_string_equal(m.host, "node7");
    assert_int_equal(m.pid, 4242);
    assert_int_equal(m.events, 22);
    assert_int_equal(m.cats[KP_KINETO_CPU_OP], 3);
    assert_int_equal(m.cats[KP_KINETO_USER_ANNOTATION], 1);
    assert_int_equal(m.cats[KP_KINETO_PROFILER_STEP], 1);
    assert_int_equal(m.cats[KP_KINETO_GPU_USER_ANNOTATION], 1);
    assert_int_equal(m.cats[KP_KINETO_PYTHON_FUNCTION], 2);
    assert_int_equal(m.cats[KP_KINETO_CUDA_RUNTIME], 2);
    assert_int_equal(m.cats[KP_KINETO_CUDA_DRIVER], 1);
    assert_int_equal(m.cats[KP_KINETO_KERNEL], 1);
    assert_int_equal(m.cats[KP_KINETO_GPU_MEMCPY], 1);
    assert_int_equal(m.cats[KP_KINETO_GPU_MEMSET], 1);
    assert_int_equal(m.cats[KP_KINETO_CUDA_SYNC], 1);
    assert_int_equal(m.cats[KP_KINETO_MEMORY], 1);
    assert_int_equal(m.cats[KP_KINETO_FLOW_AC2G], 2);
    assert_int_equal(m.cats[KP_KINETO_FLOW_FWDBWD], 2);
    assert_int_equal(m.cats[KP_KINETO_COLLECTIVE], 1);
    assert_int_equal(m.cats[KP_KINETO_METADATA], 1);
    assert_int_equal(m.cats[KP_KINETO_SKIPPED], 2);
    assert_int_equal(m.ext_dropped, 1); /* cudaStreamSynchronize: External id == correlation */

    /* rank info and devices */
    assert_non_null(b->rank_info);
    assert_string_equal(b->rank_info->job, "unit");
    assert_string_equal(b->rank_info->host, "node7");
    assert_int_equal(b->rank_info->pid, 4242);
    assert_int_equal(b->rank_info->device, 0);
    assert_int_equal(b->n_devices, 1);
    assert_string_equal(b->devices[0]->name, "NVIDIA H100 80GB HBM3");
    assert_int_equal(b->devices[0]->sm_count, 132);
    assert_int_equal(b->devices[0]->cc_major, 9);
    assert_int_equal(b->devices[0]->global_memory_bytes, 85029158912ULL);
    assert_int_equal(b->run_id, 7);
    assert_int_equal(b->rank, 1);

    /* kernel */
    assert_non_null(b->kernels);
    assert_int_equal(b->kernels->n_start_ns, 1);
    assert_int_equal(start_of(b, b->kernels->start_ns, 0), BASE + 5062300);
    assert_int_equal(b->kernels->dur_ns[0], 4100);
    assert_string_equal(str(b, b->kernels->name[0]), "sm90_gemm");
    assert_int_equal(b->kernels->stream[0], 7);
    assert_int_equal(b->kernels->correlation[0], 901);
    assert_int_equal(b->kernels->external_id[0], 4);
    assert_int_equal(b->kernels->grid_x[0], 16);
    assert_int_equal(b->kernels->block_x[0], 384);
    assert_int_equal(b->kernels->registers[0], 168);
    assert_int_equal(b->kernels->static_smem[0], 213248);
    assert_int_equal(b->kernels->context[0], 1);

    /* api calls: the trap drops the self-correlation External id */
    assert_int_equal(b->api_calls->n_start_ns, 3);
    assert_int_equal(b->api_calls->external_id[0], 4);
    assert_int_equal(b->api_calls->external_id[1], 0);
    assert_int_equal(b->api_calls->domain[0], KPROF__V1__API_DOMAIN__API_DOMAIN_RUNTIME);
    assert_int_equal(b->api_calls->domain[2], KPROF__V1__API_DOMAIN__API_DOMAIN_DRIVER);
    assert_int_equal(b->api_calls->tid[2], 4243); /* negative tid made positive */
    assert_int_equal(b->api_calls->cbid[0], 211);
    assert_string_equal(str(b, b->api_calls->name[2]), "cuLaunchKernel");
    assert_int_equal(start_of(b, b->api_calls->start_ns, 1), BASE + 5060000);

    /* memcpy / memset / sync */
    assert_int_equal(b->memcpys->bytes[0], 4194304);
    assert_int_equal(b->memcpys->copy_kind[0], 1); /* HtoD */
    assert_int_equal(b->memcpys->src_kind[0], 2);  /* Pinned */
    assert_int_equal(b->memcpys->dst_kind[0], 3);  /* Device */
    assert_int_equal(b->memcpys->external_id[0], 6);
    assert_int_equal(b->memsets->bytes[0], 128);
    assert_int_equal(b->memsets->mem_kind[0], 3);
    assert_int_equal(b->memcpys->n_bandwidth_gbps, 0); /* no figure in the trace: no column */
    assert_int_equal(b->memsets->n_bandwidth_gbps, 0);
    assert_int_equal(b->syncs->sync_type[0], 3); /* Stream Sync */
    assert_int_equal(b->syncs->stream[0], 7);

    /* [memory]: its own kind, every column */
    const Kprof__V1__MemoryEvents *me = b->memory;
    assert_non_null(me);
    assert_int_equal(me->n_start_ns, 1);
    assert_int_equal(start_of(b, me->start_ns, 0), BASE + 5031000);
    assert_string_equal(str(b, me->name[0]), "[memory]");
    assert_int_equal(me->bytes[0], -4096);
    assert_int_equal(me->addr[0], 140230045696000ULL);
    assert_int_equal(me->total_allocated[0], 4096);
    assert_int_equal(me->total_reserved[0], 2097152);
    assert_int_equal(me->device[0], 0);
    assert_int_equal(me->device_type[0], 1);
    assert_int_equal(me->tid[0], 4242);

    /* ops: step, addmm, backward, comms, gpu annotation, 2 python */
    const Kprof__V1__Ops *o = b->ops;
    assert_int_equal(o->n_start_ns, 7);
    assert_int_equal(o->kind[0], KPROF__V1__OP_KIND__OP_KIND_PROFILER_STEP);
    assert_int_equal(o->kind[1], KPROF__V1__OP_KIND__OP_KIND_CPU_OP);
    assert_string_equal(str(b, o->name[1]), "aten::addmm");
    assert_int_equal(o->op_id[1], 4);
    assert_int_equal(o->external_id[1], 4);
    assert_int_equal(o->seq[1], 4);
    assert_string_equal(str(b, o->input_shapes[1]), "[[64], [32, 128], []]");
    assert_string_equal(str(b, o->input_dtypes[1]), "['c10::BFloat16', 'Scalar']");
    assert_int_equal(start_of(b, o->start_ns, 1), BASE + 5030400);
    assert_int_equal(o->dur_ns[1], 35600);
    assert_int_equal(o->fwd_tid[2], 1);
    assert_int_equal(o->tid[2], 4301);
    assert_int_equal(o->kind[4], KPROF__V1__OP_KIND__OP_KIND_GPU_USER_ANNOTATION);
    assert_int_equal(o->device[4], 0);
    assert_int_equal(o->stream[4], 7);
    assert_int_equal(o->external_id[4], 1);
    assert_int_equal(o->op_id[4], 0);
    assert_int_equal(o->kind[5], KPROF__V1__OP_KIND__OP_KIND_PYTHON_FUNCTION);
    assert_int_equal(o->op_id[5], KP_KINETO_PY_ID_BASE + 9);
    assert_int_equal(o->parent_id[5], 0);
    assert_int_equal(o->parent_id[6], KP_KINETO_PY_ID_BASE + 9);
    assert_int_equal(o->device[1], -1);

    /* steps and collectives */
    assert_int_equal(b->steps->n_step, 1);
    assert_int_equal(b->steps->step[0], 5);
    assert_int_equal(start_of(b, b->steps->start_ns, 0), BASE + 5000000);
    assert_int_equal(b->steps->dur_ns[0], 900000);
    assert_int_equal(b->collectives->n_start_ns, 1);
    assert_string_equal(str(b, b->collectives->name[0]), "allreduce");
    assert_string_equal(str(b, b->collectives->dtype[0]), "BFloat16");
    assert_string_equal(str(b, b->collectives->process_group[0]), "0");
    assert_int_equal(b->collectives->in_nelems[0], 8256);
    assert_int_equal(b->collectives->group_size[0], 2);
    assert_int_equal(b->collectives->coll_seq[0], 3);
    assert_int_equal(b->collectives->external_id[0], 50);
    assert_int_equal(b->collectives->tid[0], 4301);

    assert_int_equal(m.rows[KP_EV_OP], 7);
    assert_int_equal(m.rows[KP_EV_MEMORY], 1);
    assert_int_equal(m.rows[KP_EV_STEP], 1);
    capture_free(&c);
}

/* 1.8/1.9 traces: Operator/Runtime/Kernel/Memcpy/Memset/User, string tids ("stream 7"),
 * lower-case external id, async flows, [memory] without cat, absolute µs. */
static const char old_trace[] =
    "{\"schemaVersion\": 1, \"traceEvents\": [\n"
    "{\"ph\": \"X\", \"cat\": \"Operator\", \"name\": \"ProfilerStep#3\", \"pid\": 25738, \"tid\": "
    "\"25738\", \"ts\": 1623142623460111, \"dur\": 2500, \"args\": {\"External id\": 1}},\n"
    "{\"ph\": \"X\", \"cat\": \"Operator\", \"name\": \"aten::conv2d\", \"pid\": 25738, \"tid\": "
    "\"25738\", \"ts\": 1623142623460120, \"dur\": 25, \"args\": {\"External id\": 2, \"Input dims\": "
    "[[1, 3], [8]]}},\n"
    "{\"ph\": \"i\", \"s\": \"t\", \"name\": \"[memory]\", \"pid\": 25738, \"tid\": 25738, \"ts\": "
    "1623142623460121, \"args\": {\"Device Type\": 0, \"Device Id\": -1, \"Bytes\": 4}},\n"
    "{\"ph\": \"X\", \"cat\": \"Runtime\", \"name\": \"cudaLaunchKernel\", \"pid\": 25738, \"tid\": "
    "\"25738\", \"ts\": 1623142623460130, \"dur\": 5, \"args\": {\"cbid\": 211, \"correlation\": 77, "
    "\"external id\": 2, \"external ts\": 1623142623460120}},\n"
    "{\"ph\": \"s\", \"id\": 77, \"pid\": 25738, \"tid\": 25738, \"ts\": 1623142623460130, \"cat\": "
    "\"async\", \"name\": \"launch\"},\n"
    "{\"ph\": \"X\", \"cat\": \"Kernel\", \"name\": \"k\", \"pid\": 0, \"tid\": \"stream 7\", \"ts\": "
    "1623142623460140, \"dur\": 2, \"args\": {\"device\": 0, \"correlation\": 77, \"external id\": 2, "
    "\"blocks per SM\": \"N/A\"}},\n"
    "{\"ph\": \"f\", \"id\": 77, \"pid\": 0, \"tid\": \"stream 7\", \"ts\": 1623142623460140, "
    "\"cat\": \"async\", \"name\": \"launch\", \"bp\": \"e\"},\n"
    "{\"ph\": \"X\", \"cat\": \"Memcpy\", \"name\": \"Memcpy DtoH (Device -> Pageable)\", \"pid\": 1, "
    "\"tid\": \"stream 9\", \"ts\": 1623142623460150, \"dur\": 3, \"args\": {\"correlation\": 78, "
    "\"bytes\": 64, \"memory bandwidth (GB/s)\": 9.927016204653041}},\n"
    "{\"ph\": \"X\", \"cat\": \"Memset\", \"name\": \"Memset (Device)\", \"pid\": 1, \"tid\": "
    "\"stream 9\", \"ts\": 1623142623460160, \"dur\": 1, \"args\": {\"bytes\": 8, "
    "\"memory bandwidth (GB/s)\": \"N/A\"}},\n"
    "{\"ph\": \"X\", \"cat\": \"User\", \"name\": \"my_range\", \"pid\": 0, \"tid\": \"stream 7 "
    "user\", \"ts\": 1623142623460139, \"dur\": 4},\n"
    "{\"ph\": \"X\", \"cat\": \"gpu_user_Annotation\", \"name\": \"r2\", \"pid\": 0, \"tid\": "
    "\"stream 5 annotations\", \"ts\": 1623142623460139, \"dur\": 4},\n"
    "{\"ph\": \"f\", \"id\": 1, \"pid\": 1, \"tid\": 1, \"ts\": 1, \"cat\": \"forward_backward\", "
    "\"name\": \"fwd_bwd\"}\n"
    "]}";

static void test_old_format(void **state)
{
    struct kp_kineto_meta m;
    struct capture c = { .n = 0 };
    const Kprof__V1__Batch *b;

    import(old_trace, 0, &m, &c);
    b = c.b[0];
    assert_false(m.has_rank);
    assert_int_equal(m.base_ns, 0);
    assert_int_equal(m.cats[KP_KINETO_CPU_OP], 2);
    assert_int_equal(m.cats[KP_KINETO_PROFILER_STEP], 1);
    assert_int_equal(m.cats[KP_KINETO_MEMORY], 1);
    assert_int_equal(m.cats[KP_KINETO_CUDA_RUNTIME], 1);
    assert_int_equal(m.cats[KP_KINETO_KERNEL], 1);
    assert_int_equal(m.cats[KP_KINETO_GPU_MEMCPY], 1);
    assert_int_equal(m.cats[KP_KINETO_GPU_MEMSET], 1);
    assert_int_equal(m.cats[KP_KINETO_GPU_USER_ANNOTATION], 2);
    assert_int_equal(m.cats[KP_KINETO_FLOW_AC2G], 2);
    assert_int_equal(m.cats[KP_KINETO_FLOW_FWDBWD], 1);
    assert_int_equal(m.ext_dropped, 0);
    assert_int_equal(b->ops->kind[0], KPROF__V1__OP_KIND__OP_KIND_PROFILER_STEP);
    assert_int_equal(b->steps->step[0], 3);
    assert_int_equal(start_of(b, b->steps->start_ns, 0), 1623142623460111000LL);
    assert_string_equal(str(b, b->ops->input_shapes[1]), "[[1, 3], [8]]");
    assert_int_equal(b->ops->tid[1], 25738);
    assert_int_equal(b->memory->device[0], -1); /* [memory] on the CPU */
    assert_int_equal(b->memory->device_type[0], 0);
    assert_int_equal(b->memory->bytes[0], 4);
    assert_int_equal(b->memory->n_addr, 0); /* no Addr, no Total *: absent columns */
    assert_int_equal(b->memory->n_total_allocated, 0);
    assert_int_equal(b->api_calls->external_id[0], 2); /* 1.x external id is the op's */
    assert_int_equal(b->kernels->stream[0], 7);        /* from tid "stream 7" */
    assert_int_equal(b->kernels->external_id[0], 2);
    assert_int_equal(b->memcpys->device[0], 1); /* from pid */
    assert_int_equal(b->memcpys->stream[0], 9);
    assert_int_equal(b->memcpys->copy_kind[0], 2);
    assert_int_equal(b->memcpys->dst_kind[0], 1);
    /* the trace's bandwidth, the very double (bytes / dur would be 21.3); not a number: none */
    assert_int_equal(b->memcpys->n_bandwidth_gbps, 1);
    assert_true(b->memcpys->bandwidth_gbps[0] == 9.927016204653041);
    assert_int_equal(b->memsets->n_bandwidth_gbps, 0);
    assert_int_equal(b->ops->kind[2], KPROF__V1__OP_KIND__OP_KIND_GPU_USER_ANNOTATION);
    assert_int_equal(b->ops->stream[3], 5);
    capture_free(&c);
}

static void test_times_and_names(void **state)
{
    static const char json[] =
        "[{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"a\\u0000b\\ud83d\\ude00\\u00e9\", \"pid\": 0,"
        " \"tid\": 7, \"ts\": 1712195495505543.2, \"dur\": 0.0005},"
        " {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"\xff\xfe ok\", \"pid\": 0, \"tid\": 7,"
        " \"ts\": \"12.3456\", \"dur\": -5},"
        " {\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"e\", \"pid\": 0, \"tid\": 7, \"ts\": 1.5e3,"
        " \"dur\": 1E0}]";
    struct kp_kineto_meta m;
    struct capture c = { .n = 0 };
    const Kprof__V1__Batch *b;

    import(json, 0, &m, &c);
    b = c.b[0];
    assert_int_equal(start_of(b, b->kernels->start_ns, 0), 1712195495505543200LL);
    assert_int_equal(b->kernels->dur_ns[0], 1); /* 0.5 ns rounds up */
    assert_string_equal(str(b, b->kernels->name[0]), "a\xef\xbf\xbd"
                                                     "b\xf0\x9f\x98\x80\xc3\xa9");
    assert_int_equal(start_of(b, b->kernels->start_ns, 1), 12346); /* "12.3456" µs */
    assert_int_equal(b->kernels->dur_ns[1], 0);                    /* negative clamped */
    assert_string_equal(str(b, b->kernels->name[1]), "?? ok");
    assert_int_equal(start_of(b, b->kernels->start_ns, 2), 1500000);
    assert_int_equal(b->kernels->dur_ns[2], 1000);
    capture_free(&c);
}

/* cuda_profiler_range events → counters rows: one per numeric metric plus the name row; the
 * correlation is args.correlation, else KP_KINETO_RANGE_ID_BASE + the range's index; args may
 * come before cat; other events' unknown args are not counters. */
static void test_profiler_range(void **state)
{
    static const char json[] =
        "[{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"aten::mm\", \"pid\": 9, \"tid\": 9,"
        " \"ts\": 1, \"dur\": 5, \"args\": {\"External id\": 3, \"queued\": 4}},"
        " {\"ph\": \"X\", \"cat\": \"cuda_profiler_range\", \"name\": \"gemm\", \"pid\": 1,"
        " \"tid\": 1, \"ts\": 10, \"dur\": 5, \"args\": {\"sm__a.sum\": 12, \"s\": \"N/A\","
        " \"sm__b.sum\": 2.5e3}},"
        " {\"args\": {\"sm__a.sum\": 7, \"correlation\": 77}, \"ph\": \"X\", \"name\": \"relu\","
        " \"pid\": 0, \"tid\": 1, \"ts\": 15, \"dur\": 5, \"cat\": \"CUDA_PROFILER_RANGE\"}]";
    struct kp_kineto_meta m;
    struct capture c = { .n = 0 };
    const Kprof__V1__Counters *k;
    const Kprof__V1__Batch *b;

    (void) state;
    import(json, 0, &m, &c);
    assert_int_equal(c.n, 1);
    b = c.b[0];
    k = b->counters;
    assert_non_null(k);
    assert_int_equal(m.cats[KP_KINETO_PROFILER_RANGE], 2);
    assert_int_equal(m.rows[KP_EV_COUNTER], 5);
    assert_int_equal(k->n_metric, 5);
    assert_int_equal(k->n_value, 5);
    assert_int_equal(k->n_correlation, 5);
    assert_int_equal(k->n_device, 5);
    assert_string_equal(str(b, k->metric[0]), KP_KINETO_RANGE_NAME_PREFIX "gemm");
    assert_true(k->value[0] == 0.0);
    assert_string_equal(str(b, k->metric[1]), "sm__a.sum");
    assert_true(k->value[1] == 12.0);
    assert_string_equal(str(b, k->metric[2]), "sm__b.sum");
    assert_true(k->value[2] == 2500.0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(k->correlation[i], KP_KINETO_RANGE_ID_BASE);
        assert_int_equal(k->device[i], 1);
    }
    assert_string_equal(str(b, k->metric[3]), KP_KINETO_RANGE_NAME_PREFIX "relu");
    assert_true(k->value[3] == 1.0);
    assert_string_equal(str(b, k->metric[4]), "sm__a.sum");
    assert_true(k->value[4] == 7.0);
    assert_int_equal(k->correlation[3], 77);
    assert_int_equal(k->correlation[4], 77);
    assert_int_equal(k->device[4], 0);
    capture_free(&c);
}

static void test_long_names_cut(void **state)
{
    size_t n = 40000;
    char *json = malloc(n + 200);
    struct kp_kineto_meta m;
    struct capture c = { .n = 0 };
    int off;

    assert_non_null(json);
    off = sprintf(json, "[{\"ph\": \"X\", \"cat\": \"kernel\", \"pid\": 0, \"tid\": 1, \"ts\": 1, "
                        "\"dur\": 1, \"name\": \"");
    for (size_t i = 0; i < n; i += 2) {
        memcpy(json + off + i, "\xc3\xa9", 2); /* é: the cut must not split it */
    }
    strcpy(json + off + n, "\"}]");
    import(json, 0, &m, &c);
    assert_int_equal(m.names_truncated, 1);
    assert_int_equal(strlen(str(c.b[0], c.b[0]->kernels->name[0])), 16384);
    capture_free(&c);
    free(json);
}

static void test_batching(void **state)
{
    size_t n = 10000;
    char *json = malloc(n * 120 + 16);
    struct kp_kineto_meta m;
    struct capture c = { .n = 0 };
    size_t off = 0, rows = 0, total_strings = 0;

    assert_non_null(json);
    json[off++] = '[';
    for (size_t i = 0; i < n; i++) {
        off += (size_t) sprintf(json + off,
                                "%s{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k%zu\",\"pid\":0,"
                                "\"tid\":7,\"ts\":%zu,\"dur\":1}",
                                i ? "," : "", i % 3, 1000 - i % 500);
    }
    strcpy(json + off, "]");
    import(json, 1000, &m, &c);
    assert_int_equal(c.n, 10);
    for (size_t i = 0; i < c.n; i++) {
        rows += c.b[i]->kernels->n_start_ns;
        total_strings += c.b[i]->n_strings;
        assert_true(c.b[i]->kernels->n_start_ns <= 1000);
        assert_int_equal(c.b[i]->n_strings, 4); /* "", k0, k1, k2 interned per batch */
        assert_int_equal(c.b[i]->rank_info != NULL, i == 0);
    }
    assert_int_equal(rows, n);
    assert_int_equal(m.rows[KP_EV_KERNEL], n);
    /* unsorted starts survive the delta encoding */
    assert_int_equal(start_of(c.b[9], c.b[9]->kernels->start_ns, 999), (1000 - 9999 % 500) * 1000);
    capture_free(&c);
    free(json);
}

struct bad_case {
    const char *json;
    const char *want; /* substring of the error */
};

static void test_errors(void **state)
{
    static const struct bad_case cases[] = {
        { "", "ends early" },
        { "{\"traceEvents\": [", "ends early" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a", "ends early" },
        { "{\"traceEvents\": []} x", "after the end of the trace" },
        { "{\"traceEvents\": [1]}", "an event must be an object" },
        { "{\"traceEvents\": {}}", "traceEvents must be an array" },
        { "{\"schemaVersion\": 1}", "no \"traceEvents\"" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"dur\": 1}]}",
          "has no \"ts\"" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1}]}",
          "has no \"dur\"" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"ts\": 1, \"dur\": 1}]}",
          "has no \"name\"" },
        { "{\"traceEvents\": [{\"cat\": \"kernel\"}]}", "no \"ph\"" },
        { "{\"traceEvents\": [{\"ph\": \"s\", \"cat\": \"ac2g\"}]}", "has no \"id\"" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": [1]}]}", "must be a number of microseconds" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": \"abc\"}]}", "must be a number" },
        { "{\"traceEvents\": [{\"ph\": 5}]}", "\"ph\" must be a string" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"name\": {}}]}", "\"name\" must be a string" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"args\": 5}]}", "args must be an object" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"args\": {\"correlation\": {}}}]}",
          "args.correlation must be a number" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1, "
          "\"dur\": 1, \"args\": {\"block\": [1, 1, 40000]}}]}",
          "args.block[2] = 40000 is out of range" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1, "
          "\"dur\": 1, \"args\": {\"grid\": [1, 1, 1, 1]}}]}",
          "array of 3 ints" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1, "
          "\"dur\": 1, \"args\": {\"registers per thread\": 99999}}]}",
          "out of range" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"ts\": 1, "
          "\"dur\": 1, \"args\": {\"correlation\": 99999999999999999999}}]}",
          "out of the 64-bit range" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 99999999999999999999}]}", "out of range" },
        { "{\"traceEvents\": [], \"distributedInfo\": {\"rank\": -1}}", "out of range" },
        { "{\"traceEvents\": [], \"baseTimeNanoseconds\": -5}", "negative" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"\\x\"}]}", "invalid escape" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"a\nb\"}]}", "raw control character" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"\\ud800\\u0041\"}]}", "surrogate" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 01}]}", "expected" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 1.}]}", "a digit after '.'" },
        { "{\"traceEvents\": [{\"ph\": \"X\",}]}", "a key (a string)" },
        { "{\"traceEvents\": [{\"ph\" \"X\"}]}", "':' after a key" },
        { "{\"traceEvents\": [{\"x\": tru}]}", "expected true" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"args\": {\"x\": [[[[[[[[[[[[1]]]]]]]]]]]]}}]}",
          "nesting deeper than 8" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"name\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "\"}]}",
          "a string longer than 100 bytes" },
        { "{\"traceEvents\": [{\"ph\": \"X\", \"ts\": 11111111111111111111111111111111111111111111"
          "11111111111111111111111111111111}]}",
          "a number longer than" },
    };
    struct kp_kineto_opts o;
    struct kp_kineto_meta m;
    char err[1024];

    memset(&o, 0, sizeof(o));
    o.max_depth = 8;
    o.max_string_bytes = 100;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc;

        err[0] = '\0';
        rc = kp_kineto_parse_mem(cases[i].json, strlen(cases[i].json), &o, NULL, NULL, &m, err,
                                 sizeof(err));
        if (rc != KP_EPROTO || strstr(err, cases[i].want) == NULL ||
            strstr(err, "line 1, column") == NULL) {
            fail_msg("case %zu (%s): rc %d, error \"%s\", want \"%s\"", i, cases[i].json, rc, err,
                     cases[i].want);
        }
    }
    /* the event index and the exact position */
    {
        static const char json[] = "{\"traceEvents\": [\n{\"ph\": \"M\"},\n  {\"ph\": \"X\", "
                                   "\"ts\": {}}]}";
        int rc = kp_kineto_parse_mem(json, strlen(json), &o, NULL, NULL, &m, err, sizeof(err));

        assert_int_equal(rc, KP_EPROTO);
        assert_string_equal(err, "line 3, column 21 (byte 51), traceEvents[1]: \"ts\" must be a "
                                 "number of microseconds, got '{'");
    }
}

static int failing_cb(Kprof__V1__Batch *b, void *ud)
{
    int *calls = ud;

    (*calls)++;
    return -ECONNRESET;
}

static void test_callback_error_and_args(void **state)
{
    struct kp_kineto_opts o;
    struct kp_kineto_meta scan, m;
    char err[512];
    int calls = 0, rc;

    memset(&o, 0, sizeof(o));
    /* a convert pass needs the scan's meta */
    rc = kp_kineto_parse_mem("[]", 2, &o, failing_cb, &calls, &m, err, sizeof(err));
    assert_int_equal(rc, -EINVAL);
    assert_int_equal(kp_kineto_parse_mem("[]", 2, &o, NULL, NULL, &scan, err, sizeof(err)), 0);
    assert_int_equal(scan.batches, 1); /* an empty trace still gives the rank_info batch */
    o.meta = &scan;
    o.run_id = 1;
    rc = kp_kineto_parse_mem("[]", 2, &o, failing_cb, &calls, &m, err, sizeof(err));
    assert_int_equal(rc, -ECONNRESET);
    assert_int_equal(calls, 1);
    assert_non_null(strstr(err, "sending batch 1"));
}

static void test_file_and_gzip(void **state)
{
    char path[] = "/tmp/kp_kineto_test_XXXXXX";
    struct kp_kineto_opts o;
    struct kp_kineto_meta m;
    char err[1024], cmd[256];
    int fd = mkstemp(path), rc;
    FILE *f;

    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    fputs(old_trace, f);
    fclose(f);
    memset(&o, 0, sizeof(o));
    assert_int_equal(kp_kineto_parse_file(path, &o, NULL, NULL, &m, err, sizeof(err)), 0);
    assert_int_equal(m.cats[KP_KINETO_KERNEL], 1);
    snprintf(cmd, sizeof(cmd), "gzip -f -k %s", path);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "%s.gz", path);
    assert_int_equal(kp_kineto_parse_file(cmd, &o, NULL, NULL, &m, err, sizeof(err)), 0);
    assert_int_equal(m.cats[KP_KINETO_KERNEL], 1);
    assert_int_equal(m.json_bytes, strlen(old_trace));
    /* truncated gzip */
    assert_int_equal(truncate(cmd, 60), 0);
    rc = kp_kineto_parse_file(cmd, &o, NULL, NULL, &m, err, sizeof(err));
    assert_int_equal(rc, KP_EPROTO);
    assert_non_null(strstr(err, cmd));
    assert_non_null(strstr(err, "gzip"));
    unlink(cmd);
    unlink(path);
    rc = kp_kineto_parse_file("/nonexistent/x.json", &o, NULL, NULL, &m, err, sizeof(err));
    assert_int_equal(rc, -ENOENT);
    assert_non_null(strstr(err, "/nonexistent/x.json: cannot open"));
}

/* Where a spool cannot stand for a second parse, the replay says so and sends nothing. */
static void test_spool_reparse(void **state)
{
    /* baseTimeNanoseconds between two traceEvents arrays: rows built with two bases */
    static const char two_bases[] =
        "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"pid\": 0, "
        "\"tid\": 7, \"ts\": 1, \"dur\": 1}], \"baseTimeNanoseconds\": 1000, \"traceEvents\": "
        "[{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"pid\": 0, \"tid\": 7, \"ts\": 2, "
        "\"dur\": 1}]}";
    /* a shift that overflows: the scan's times are near the top already */
    static const char overflow[] =
        "{\"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"pid\": 0, "
        "\"tid\": 7, \"ts\": 9000000000000000, \"dur\": 1}], \"baseTimeNanoseconds\": "
        "9000000000000000000}";
    const char *cases[] = { two_bases, overflow };
    struct kp_kineto_opts o;
    struct kp_kineto_meta scan, m;
    struct enc_capture e = { .n = 0 };
    char err[512];

    for (size_t i = 0; i < 2; i++) {
        struct kp_kineto_spool *sp;

        memset(&o, 0, sizeof(o));
        assert_int_equal(kp_kineto_spool_create(1 << 20, &sp), 0);
        o.spool = sp;
        assert_int_equal(kp_kineto_parse_mem(cases[i], strlen(cases[i]), &o, NULL, NULL, &scan, err,
                                             sizeof(err)),
                         0);
        /* a spool serves one scan; a convert pass takes none */
        assert_int_equal(
            kp_kineto_parse_mem(cases[i], strlen(cases[i]), &o, NULL, NULL, &m, err, sizeof(err)),
            -EINVAL);
        o.spool = NULL;
        o.meta = &scan;
        o.run_id = 3;
        assert_int_equal(kp_kineto_spool_replay(sp, &o, enc_cb, &e, &m, err, sizeof(err)),
                         KP_KINETO_REPARSE);
        assert_int_equal(e.n, 0);
        kp_kineto_spool_destroy(sp);
    }
    /* no temporary file can be created: the scan goes on, the replay declines */
    {
        struct kp_kineto_spool *sp;
        const char *old = getenv("TMPDIR");
        char *saved = old != NULL ? strdup(old) : NULL;

        memset(&o, 0, sizeof(o));
        setenv("TMPDIR", "/nonexistent/kp_kineto_test", 1);
        assert_int_equal(kp_kineto_spool_create(0, &sp), 0);
        o.spool = sp;
        assert_int_equal(kp_kineto_parse_mem("[]", 2, &o, NULL, NULL, &scan, err, sizeof(err)), 0);
        if (saved != NULL) {
            setenv("TMPDIR", saved, 1);
            free(saved);
        }
        else {
            unsetenv("TMPDIR");
        }
        assert_int_equal(kp_kineto_spool_bytes(sp), 0);
        o.spool = NULL;
        o.meta = &scan;
        o.run_id = 3;
        assert_int_equal(kp_kineto_spool_replay(sp, &o, enc_cb, &e, &m, err, sizeof(err)),
                         KP_KINETO_REPARSE);
        assert_int_equal(e.n, 0);
        kp_kineto_spool_destroy(sp);
    }
    /* a failed scan leaves nothing to replay */
    {
        struct kp_kineto_spool *sp;

        memset(&o, 0, sizeof(o));
        assert_int_equal(kp_kineto_spool_create(1 << 20, &sp), 0);
        o.spool = sp;
        assert_int_equal(
            kp_kineto_parse_mem("[{\"ph\": 1}]", 12, &o, NULL, NULL, &scan, err, sizeof(err)),
            KP_EPROTO);
        assert_int_equal(kp_kineto_spool_bytes(sp), 0);
        o.spool = NULL;
        o.meta = &scan;
        o.run_id = 3;
        assert_int_equal(kp_kineto_spool_replay(sp, &o, enc_cb, &e, &m, err, sizeof(err)),
                         KP_KINETO_REPARSE);
        kp_kineto_spool_destroy(sp);
    }
}

/* distributedInfo is kept whole as JSON text (strings escaped again, numbers as written,
 * nested arrays and objects, null), rank and world size read from it, and the first batch's
 * rank_info carries it; a trace without one has "". */
static void test_distributed_info(void **state)
{
    static const char json[] =
        "{\"distributedInfo\": {\"backend\":\"nccl\",\"rank\":1, \"world_size\" : 4,"
        " \"pg_count\": 1, \"pg_config\": [{\"pg_name\": \"0\", \"desc\": \"a \\\"q\\\" \\\\ b\","
        " \"ranks\": [0, 1, 2, 3], \"x\": null, \"t\": true, \"f\": 1.5e-3}],"
        " \"nccl_version\": \"2.17.1\"},"
        " \"traceEvents\": [{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"k\", \"pid\": 0,"
        " \"tid\": 7, \"ts\": 1, \"dur\": 2}]}";
    static const char want[] =
        "{\"backend\": \"nccl\", \"rank\": 1, \"world_size\": 4, \"pg_count\": 1, \"pg_config\": "
        "[{\"pg_name\": \"0\", \"desc\": \"a \\\"q\\\" \\\\ b\", \"ranks\": [0, 1, 2, 3], \"x\": null, "
        "\"t\": true, \"f\": 1.5e-3}], \"nccl_version\": \"2.17.1\"}";
    struct kp_kineto_meta m;
    struct capture c = { .n = 0 };

    (void) state;
    import(json, 0, &m, &c);
    assert_string_equal(m.dist_json, want);
    assert_true(m.has_rank);
    assert_int_equal(m.rank, 1);
    assert_int_equal(m.world_size, 4);
    assert_int_equal(c.n, 1);
    assert_non_null(c.b[0]->rank_info);
    assert_string_equal(c.b[0]->rank_info->distributed_info, want);
    capture_free(&c);
    import("{\"traceEvents\": []}", 0, &m, &c);
    assert_string_equal(m.dist_json, "");
    capture_free(&c);
}

static void test_rank_from_name(void **state)
{
    assert_int_equal(kp_kineto_rank_from_name("/a/rank-3.Apr_03.1102.pt.trace.json.gz"), 3);
    assert_int_equal(kp_kineto_rank_from_name("sampled_rank-1.json.gz"), 1);
    assert_int_equal(kp_kineto_rank_from_name("RANK_12.json"), 12);
    assert_int_equal(kp_kineto_rank_from_name("worker0.1623143089861.pt.trace.json.gz"), 0);
    assert_int_equal(kp_kineto_rank_from_name("/rank7/host_123.pt.trace.json"), -1);
    assert_int_equal(kp_kineto_rank_from_name("trace.json"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_current_format),
        cmocka_unit_test(test_old_format),
        cmocka_unit_test(test_times_and_names),
        cmocka_unit_test(test_long_names_cut),
        cmocka_unit_test(test_batching),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_callback_error_and_args),
        cmocka_unit_test(test_file_and_gzip),
        cmocka_unit_test(test_spool_reparse),
        cmocka_unit_test(test_rank_from_name),
        cmocka_unit_test(test_distributed_info),
        cmocka_unit_test(test_profiler_range),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
