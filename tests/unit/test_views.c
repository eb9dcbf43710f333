/*
 * The Analyzer service's table of views (analyzer/view.h): every descriptor is complete, the
 * names are unique and each is a method of proto/kprof.proto's Analyzer service with the
 * descriptor's request and reply messages; every reply has run_id and cached, per-rank
 * requests have a rank and whole-run ones none; each key function refuses run 0 and a rank
 * below -1, accepts a default request, and gives byte-equal keys for equal requests (the
 * cache compares them with memcmp) and different keys for different runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kprof.pb-c.h"
#include "view.h"

static const ProtobufCFieldDescriptor *field(const ProtobufCMessageDescriptor *d, const char *n)
{
    return protobuf_c_message_descriptor_get_field_by_name(d, n);
}

static void test_complete_and_unique(void **state)
{
    (void) state;
    assert_true(kp_n_views >= 10);
    for (size_t i = 0; i < kp_n_views; i++) {
        const struct kp_view *v = kp_views[i];

        assert_non_null(v);
        assert_non_null(v->name);
        assert_true(v->name[0] != '\0');
        assert_non_null(v->request);
        assert_non_null(v->reply);
        assert_non_null(v->key);
        assert_non_null(v->compute);
        assert_false(v->whole_run && v->load_rank); /* a loaded rank needs a rank */
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(v->name, kp_views[j]->name);
        }
        assert_ptr_equal(kp_view_find(v->name, NULL), v);
        if (v->stream != NULL) {
            bool stream = false;

            assert_ptr_equal(kp_view_find(v->stream, &stream), v);
            assert_true(stream);
            assert_non_null(v->page);
            assert_ptr_equal(kp_view_find(v->name, &stream), v);
            assert_false(stream);
        }
    }
    assert_null(kp_view_find("NoSuchView", NULL));
}

static void test_matches_proto(void **state)
{
    const ProtobufCServiceDescriptor *svc = &kprof__v1__analyzer__descriptor;

    (void) state;
    for (size_t i = 0; i < kp_n_views; i++) {
        const struct kp_view *v = kp_views[i];
        const ProtobufCMethodDescriptor *m =
            protobuf_c_service_descriptor_get_method_by_name(svc, v->name);
        const ProtobufCFieldDescriptor *f;

        if (m == NULL) {
            fail_msg("view %s is no method of kprof.v1.Analyzer", v->name);
        }
        assert_ptr_equal(m->input, v->request);
        assert_ptr_equal(m->output, v->reply);
        f = field(v->reply, "run_id");
        assert_non_null(f);
        assert_int_equal(f->type, PROTOBUF_C_TYPE_UINT64);
        f = field(v->reply, "cached");
        assert_non_null(f);
        assert_int_equal(f->type, PROTOBUF_C_TYPE_BOOL);
        assert_int_equal(f->label, PROTOBUF_C_LABEL_NONE);
        f = field(v->request, "run_id");
        assert_non_null(f);
        assert_int_equal(f->type, PROTOBUF_C_TYPE_UINT64);
        f = field(v->request, "rank");
        if (v->whole_run) {
            assert_null(f);
        }
        else {
            assert_non_null(f);
            assert_int_equal(f->type, PROTOBUF_C_TYPE_INT32);
        }
        if (v->stream != NULL) { /* the same request, its pages' message, a server stream */
            m = protobuf_c_service_descriptor_get_method_by_name(svc, v->stream);
            if (m == NULL) {
                fail_msg("view %s's stream %s is no method of kprof.v1.Analyzer", v->name,
                         v->stream);
            }
            assert_ptr_equal(m->input, v->request);
            assert_ptr_equal(m->output, v->page);
            assert_non_null(field(v->page, "last"));
            assert_non_null(field(v->page, "rows"));
        }
    }
}

/* A default request of v with run and (when it has one) rank set; free with free(). */
static ProtobufCMessage *request(const struct kp_view *v, uint64_t run, int32_t rank)
{
    ProtobufCMessage *m = calloc(1, v->request->sizeof_message);
    const ProtobufCFieldDescriptor *f;

    assert_non_null(m);
    protobuf_c_message_init(v->request, m);
    *(uint64_t *) ((char *) m + field(v->request, "run_id")->offset) = run;
    if ((f = field(v->request, "rank")) != NULL) {
        *(int32_t *) ((char *) m + f->offset) = rank;
    }
    return m;
}

static void test_keys(void **state)
{
    char err[512];

    (void) state;
    for (size_t i = 0; i < kp_n_views; i++) {
        const struct kp_view *v = kp_views[i];
        ProtobufCMessage *a = request(v, 7, 1), *b = request(v, 7, 1), *c = request(v, 8, 1);
        ProtobufCMessage *z = request(v, 0, 0), *neg = request(v, 7, -2);
        struct kp_view_key ka, kb, kc, kz;

        /* garbage first: the key function must set every byte */
        memset(&ka, 0xa5, sizeof(ka));
        memset(&kb, 0x5a, sizeof(kb));
        err[0] = '\0';
        if (!v->key(a, 0, &ka, err, sizeof(err))) {
            fail_msg("view %s refuses a default request: %s", v->name, err);
        }
        assert_true(v->key(b, 0, &kb, err, sizeof(err)));
        assert_true(v->key(c, 0, &kc, err, sizeof(err)));
        assert_memory_equal(&ka, &kb, sizeof(ka));
        assert_memory_not_equal(&ka, &kc, sizeof(ka));
        assert_int_equal(ka.run, 7);
        assert_int_equal(ka.rank, v->whole_run ? -1 : 1);
        err[0] = '\0';
        assert_false(v->key(z, 0, &kz, err, sizeof(err)));
        assert_non_null(strstr(err, "run_id 0 is not a run id"));
        if (!v->whole_run) {
            err[0] = '\0';
            assert_false(v->key(neg, 0, &kz, err, sizeof(err)));
            assert_non_null(strstr(err, "rank -2 is negative"));
        }
        free(a);
        free(b);
        free(c);
        free(z);
        free(neg);
    }
}

/* The table is every view: each method of the Analyzer service with a unary reply is the
 * view of the same name, in the service's order (view.h: "in the order of the Analyzer
 * service"), and each view's reply is a message of its own (no two views share one). Export
 * is export_rpc.c's; a view's streaming method (ProfRows) answers its request in pages. A view
 * written but left out of views.c, or a
 * method added to the proto without its view, fails here. */
static void test_every_method_is_a_view(void **state)
{
    const ProtobufCServiceDescriptor *svc = &kprof__v1__analyzer__descriptor;
    size_t k = 0;

    (void) state;
    for (unsigned i = 0; i < svc->n_methods; i++) {
        const ProtobufCMethodDescriptor *m = &svc->methods[i];
        bool stream = false;

        if (strcmp(m->name, "Export") == 0 || (kp_view_find(m->name, &stream) != NULL && stream)) {
            continue; /* export_rpc.c's, or a view's pages (kp_view.stream) */
        }
        if (k >= kp_n_views) {
            fail_msg("method %s of kprof.v1.Analyzer has no view in views.c", m->name);
        }
        if (strcmp(kp_views[k]->name, m->name) != 0) {
            fail_msg("views.c lists %s where the service has %s", kp_views[k]->name, m->name);
        }
        k++;
    }
    assert_int_equal(k, kp_n_views);
    for (size_t i = 0; i < kp_n_views; i++) {
        for (size_t j = 0; j < i; j++) {
            assert_ptr_not_equal(kp_views[i]->reply, kp_views[j]->reply);
            assert_ptr_not_equal(kp_views[i]->request, kp_views[j]->request);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_complete_and_unique),
        cmocka_unit_test(test_matches_proto),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_every_method_is_a_view),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
