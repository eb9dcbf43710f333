/* Unit tests for common/kp_pbjson: the protobuf-c to JSON writer over a message with a field of
 * every type (described here by hand, as protoc-c would), 64-bit and float edge values, string
 * escaping through kp_json; and the query parser: every type, lists, nested fields, the
 * refusals and their messages; and a real request of proto/kprof.proto. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_pbjson.h"
#include "kp_strbuf.h"
#include "kprof.pb-c.h"

/* ---- a message with every field type ------------------------------------------------------ */

typedef struct {
    ProtobufCMessage base;
    double x;
} Sub;

typedef struct {
    ProtobufCMessage base;
    int32_t i32, s32, sf32;
    uint32_t u32, f32;
    int64_t i64, s64, sf64;
    uint64_t u64, f64;
    float fl;
    double db;
    protobuf_c_boolean b;
    int e;
    char *str;
    ProtobufCBinaryData by;
    Sub *sub;
    size_t n_rep_i64;
    int64_t *rep_i64;
    size_t n_rep_str;
    char **rep_str;
    protobuf_c_boolean has_opt;
    int32_t opt;
} All;

static const ProtobufCEnumValue color_values[] = {
    { "COLOR_RED", "RED", 0 },
    { "COLOR_GREEN", "GREEN", 1 },
    { "COLOR_BLUE", "BLUE", 5 },
};
static const ProtobufCEnumValueIndex color_by_name[] = {
    { "COLOR_BLUE", 2 },
    { "COLOR_GREEN", 1 },
    { "COLOR_RED", 0 },
};
static const ProtobufCIntRange color_ranges[] = { { 0, 0 }, { 5, 2 }, { 0, 3 } };
static const ProtobufCEnumDescriptor color_descriptor = {
    PROTOBUF_C__ENUM_DESCRIPTOR_MAGIC,
    "t.Color",
    "Color",
    "Color",
    "t",
    3,
    color_values,
    3,
    color_by_name,
    2,
    color_ranges,
    NULL,
    NULL,
    NULL,
    NULL,
};

static void sub_init(Sub *m);
static const ProtobufCFieldDescriptor sub_fields[] = {
    { "x", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_DOUBLE, 0, offsetof(Sub, x), NULL, NULL, 0, 0,
      NULL, NULL },
};
static const unsigned sub_by_name[] = { 0 };
static const ProtobufCIntRange sub_ranges[] = { { 1, 0 }, { 0, 1 } };
static const ProtobufCMessageDescriptor sub_descriptor = {
    PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
    "t.Sub",
    "Sub",
    "Sub",
    "t",
    sizeof(Sub),
    1,
    sub_fields,
    sub_by_name,
    1,
    sub_ranges,
    (ProtobufCMessageInit) sub_init,
    NULL,
    NULL,
    NULL,
};

static void sub_init(Sub *m)
{
    memset(m, 0, sizeof(*m));
    m->base.descriptor = &sub_descriptor;
}

#define F(name, id, label, type, q, field, d, def)                               \
    {                                                                            \
        name, id, label, type, q, offsetof(All, field), d, def, 0, 0, NULL, NULL \
    }
static const ProtobufCFieldDescriptor all_fields[] = {
    F("i32", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_INT32, 0, i32, NULL, NULL),
    F("s32", 2, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_SINT32, 0, s32, NULL, NULL),
    F("sf32", 3, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_SFIXED32, 0, sf32, NULL, NULL),
    F("u32", 4, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_UINT32, 0, u32, NULL, NULL),
    F("f32", 5, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_FIXED32, 0, f32, NULL, NULL),
    F("i64", 6, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_INT64, 0, i64, NULL, NULL),
    F("s64", 7, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_SINT64, 0, s64, NULL, NULL),
    F("sf64", 8, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_SFIXED64, 0, sf64, NULL, NULL),
    F("u64", 9, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_UINT64, 0, u64, NULL, NULL),
    F("f64", 10, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_FIXED64, 0, f64, NULL, NULL),
    F("fl", 11, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_FLOAT, 0, fl, NULL, NULL),
    F("db", 12, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_DOUBLE, 0, db, NULL, NULL),
    F("b", 13, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_BOOL, 0, b, NULL, NULL),
    F("e", 14, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_ENUM, 0, e, &color_descriptor, NULL),
    F("str", 15, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_STRING, 0, str, NULL,
      &protobuf_c_empty_string),
    F("by", 16, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_BYTES, 0, by, NULL, NULL),
    F("sub", 17, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_MESSAGE, 0, sub, &sub_descriptor, NULL),
    F("rep_i64", 18, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_INT64, offsetof(All, n_rep_i64),
      rep_i64, NULL, NULL),
    F("rep_str", 19, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_STRING, offsetof(All, n_rep_str),
      rep_str, NULL, NULL),
    F("opt", 20, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_INT32, offsetof(All, has_opt), opt,
      NULL, NULL),
};
#undef F
/* indices of all_fields in name order */
static const unsigned all_by_name[] = { 12, 15, 11, 13, 4, 9, 10, 0,  5, 19,
                                        17, 18, 1,  6,  2, 7, 14, 16, 3, 8 };
static const ProtobufCIntRange all_ranges[] = { { 1, 0 }, { 0, 20 } };
static void all_init(All *m);
static const ProtobufCMessageDescriptor all_descriptor = {
    PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
    "t.All",
    "All",
    "All",
    "t",
    sizeof(All),
    20,
    all_fields,
    all_by_name,
    1,
    all_ranges,
    (ProtobufCMessageInit) all_init,
    NULL,
    NULL,
    NULL,
};

static void all_init(All *m)
{
    memset(m, 0, sizeof(*m));
    m->base.descriptor = &all_descriptor;
    m->str = (char *) protobuf_c_empty_string;
}

static All *all_new(void)
{
    All *m = malloc(sizeof(*m));

    assert_non_null(m);
    all_init(m);
    return m;
}

/* msg as JSON (owned). */
static char *json(const ProtobufCMessage *msg)
{
    struct kp_strbuf sb;

    kp_strbuf_init(&sb, 0);
    assert_int_equal(kp_pbjson_write(&sb, msg), 0);
    return sb.data;
}

/* ---- writer ------------------------------------------------------------------------------- */

static void test_names_sorted(void **state)
{
    (void) state;
    for (size_t i = 1; i < 20; i++) {
        assert_true(strcmp(all_fields[all_by_name[i - 1]].name, all_fields[all_by_name[i]].name) <
                    0);
    }
}

static void test_defaults(void **state)
{
    All m;
    char *s;

    (void) state;
    all_init(&m);
    s = json(&m.base);
    assert_string_equal(s,
                        "{\"i32\":0,\"s32\":0,\"sf32\":0,\"u32\":0,\"f32\":0,\"i64\":0,\"s64\":0,"
                        "\"sf64\":0,\"u64\":0,\"f64\":0,\"fl\":0,\"db\":0,\"b\":false,"
                        "\"e\":\"COLOR_RED\",\"str\":\"\",\"by\":\"\",\"sub\":null,"
                        "\"rep_i64\":[],\"rep_str\":[],\"opt\":null}");
    free(s);
}

static void test_values(void **state)
{
    All m;
    Sub sub;
    int64_t reps[] = { 9007199254740992LL, 9007199254740993LL, INT64_MIN, -9007199254740992LL,
                       -9007199254740993LL };
    char *strs[] = { "a", "" };
    char *s;

    (void) state;
    all_init(&m);
    sub_init(&sub);
    sub.x = NAN;
    m.i32 = INT32_MIN;
    m.s32 = -1;
    m.sf32 = INT32_MAX;
    m.u32 = UINT32_MAX;
    m.f32 = 7;
    m.i64 = INT64_MAX;
    m.s64 = -5;
    m.sf64 = 9007199254740992LL;
    m.u64 = UINT64_MAX;
    m.f64 = 9007199254740993ULL;
    m.fl = 0.1f;
    m.db = 0.1;
    m.b = 1;
    m.e = 5;
    m.str = "q\"b\\s\n\x01\xff\xc3\xa9/";
    m.by = (ProtobufCBinaryData){ 4, (uint8_t *) "hi!\xff" };
    m.sub = &sub;
    m.n_rep_i64 = 5;
    m.rep_i64 = reps;
    m.n_rep_str = 2;
    m.rep_str = strs;
    m.has_opt = 1;
    m.opt = -3;
    s = json(&m.base);
    assert_string_equal(
        s, "{\"i32\":-2147483648,\"s32\":-1,\"sf32\":2147483647,\"u32\":4294967295,\"f32\":7,"
           "\"i64\":\"9223372036854775807\",\"s64\":-5,\"sf64\":9007199254740992,"
           "\"u64\":\"18446744073709551615\",\"f64\":\"9007199254740993\",\"fl\":0.1,\"db\":0.1,"
           "\"b\":true,\"e\":\"COLOR_BLUE\",\"str\":\"q\\\"b\\\\s\\n\\u0001\\ufffd\xc3\xa9/\","
           "\"by\":\"aGkh/w==\",\"sub\":{\"x\":\"NaN\"},"
           "\"rep_i64\":[9007199254740992,\"9007199254740993\",\"-9223372036854775808\","
           "-9007199254740992,\"-9007199254740993\"],\"rep_str\":[\"a\",\"\"],\"opt\":-3}");
    free(s);
}

static void test_doubles(void **state)
{
    static const struct {
        double v;
        const char *want;
    } cases[] = {
        { INFINITY, "\"Infinity\"" },          { -INFINITY, "\"-Infinity\"" },
        { 1.0 / 3, "0.33333333333333331" },    { 1e300, "1.0000000000000001e+300" },
        { 5e-324, "4.9406564584124654e-324" }, { -0.0, "-0" },
        { 123456789.0, "123456789" },          { 2.5, "2.5" },
    };
    char want[80];

    (void) state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Sub m;
        char *s;

        sub_init(&m);
        m.x = cases[i].v;
        s = json(&m.base);
        snprintf(want, sizeof(want), "{\"x\":%s}", cases[i].want);
        if (strcmp(s, want) != 0 && isfinite(cases[i].v)) {
            /* the shortest round-trip form may be shorter than the %.17g above: check that */
            assert_true(strtod(s + 5, NULL) == cases[i].v);
        }
        else {
            assert_string_equal(s, want);
        }
        free(s);
    }
}

static void test_unknown_enum_and_limit(void **state)
{
    All m;
    struct kp_strbuf sb;
    char *s;

    (void) state;
    all_init(&m);
    m.e = 7; /* a newer peer's value */
    s = json(&m.base);
    assert_non_null(strstr(s, "\"e\":7,"));
    free(s);
    kp_strbuf_init(&sb, 16);
    assert_int_not_equal(kp_pbjson_write(&sb, &m.base), 0);
    kp_strbuf_fini(&sb);
}

/* ---- query parser ------------------------------------------------------------------------- */

static int query(All *m, const char *q, char *err)
{
    return kp_pbjson_query(&m->base, q, strlen(q), NULL, err, 512);
}

static void test_query_every_type(void **state)
{
    All *m = all_new();
    char err[512] = "";

    (void) state;
    assert_int_equal(
        query(m,
              "i32=-2147483648&s32=2147483647&sf32=-1&u32=4294967295&f32=0x10&i64=-"
              "9223372036854775808&s64=9223372036854775807&sf64=3&u64=18446744073709551615&"
              "f64=0&fl=1.5&db=-2.25e3&b=true&e=COLOR_GREEN&str=a%20b+c%2B&sub.x=0.5&"
              "rep_i64=1,-2,3&rep_str=x,,y&opt=4&",
              err),
        0);
    assert_int_equal(m->i32, INT32_MIN);
    assert_int_equal(m->s32, INT32_MAX);
    assert_int_equal(m->sf32, -1);
    assert_int_equal(m->u32, UINT32_MAX);
    assert_int_equal(m->f32, 16);
    assert_true(m->i64 == INT64_MIN);
    assert_true(m->s64 == INT64_MAX);
    assert_true(m->u64 == UINT64_MAX);
    assert_true(m->fl == 1.5f && m->db == -2250.0 && m->b);
    assert_int_equal(m->e, 1);
    assert_string_equal(m->str, "a b c+");
    assert_non_null(m->sub);
    assert_true(m->sub->x == 0.5);
    assert_int_equal(m->n_rep_i64, 3);
    assert_true(m->rep_i64[0] == 1 && m->rep_i64[1] == -2 && m->rep_i64[2] == 3);
    assert_int_equal(m->n_rep_str, 3);
    assert_string_equal(m->rep_str[1], "");
    assert_string_equal(m->rep_str[2], "y");
    assert_true(m->has_opt && m->opt == 4);
    protobuf_c_message_free_unpacked(&m->base, NULL);

    m = all_new();
    assert_int_equal(query(m, "e=5&b=0", err), 0); /* an enum by number */
    assert_int_equal(m->e, 5);
    assert_int_equal(query(m, "", err), 0);
    protobuf_c_message_free_unpacked(&m->base, NULL);
}

static void refused(const char *q, const char *want)
{
    static const char *const reserved[] = { "u64", NULL };
    All *m = all_new();
    char err[512] = "";

    assert_int_equal(kp_pbjson_query(&m->base, q, strlen(q), reserved, err, sizeof(err)), -EINVAL);
    if (strstr(err, want) == NULL) {
        fail_msg("query %s: \"%s\" lacks \"%s\"", q, err, want);
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
}

static void test_query_refusals(void **state)
{
    (void) state;
    refused("nope=1", "unknown parameter nope: All takes i32, s32");
    refused("i32=2147483648", "parameter i32: \"2147483648\" is not an int32");
    refused("i32=1.5", "is not an int32");
    refused("i32= 1", "is not an int32");
    refused("i32=", "is not an int32");
    refused("u32=-1", "is not a uint32");
    refused("u32=4294967296", "is not a uint32");
    refused("i64=9223372036854775808", "is not an int64");
    refused("u64=1", "set by the path");
    refused("f64=-1", "is not a uint64");
    refused("fl=1e39", "finite number");
    refused("db=nan", "finite number");
    refused("db=inf", "finite number");
    refused("db=1e999", "finite number");
    refused("b=yes", "is not a bool");
    refused("e=COLOR_PINK", "is not one of COLOR_RED, COLOR_GREEN, COLOR_BLUE");
    refused("e=2", "is not one of");
    refused("by=aGk", "cannot be given in a query");
    refused("sub=1", "is a message");
    refused("i32.x=1", "is not a message field");
    refused("sub.y=1", "unknown parameter sub.y: Sub takes x");
    refused("i32=1&i32=2", "given twice");
    refused("rep_i64=1,x", "parameter rep_i64: \"x\"");
    refused("i32", "has no value");
    refused("i32=%zz", "percent-encoded");
    refused("i32=%4", "percent-encoded");
    refused("=1", "empty");
    refused("i32=%00", "percent-encoded");
    refused("str=%ff", "is not UTF-8");
}

static void test_url_decode(void **state)
{
    char out[8];

    (void) state;
    assert_int_equal(kp_pbjson_url_decode("a%2fb+c", 7, out, sizeof(out)), 5);
    assert_string_equal(out, "a/b c");
    assert_int_equal(kp_pbjson_url_decode("abcdefgh", 8, out, sizeof(out)), -EINVAL);
    assert_int_equal(kp_pbjson_url_decode("abcdefg", 7, out, sizeof(out)), 7);
    assert_int_equal(kp_pbjson_url_decode("%", 1, out, sizeof(out)), -EINVAL);
}

/* A request of proto/kprof.proto, built from a query and written back. */
static void test_kprof_request(void **state)
{
    Kprof__V1__CompareRequest *r = malloc(sizeof(*r));
    char err[512] = "", *s;
    const char *q = "has_step=true&step=-3&thresholds.late_pct=2.5&hta_candidates=4";

    (void) state;
    kprof__v1__compare_request__init(r);
    assert_int_equal(kp_pbjson_query(&r->base, q, strlen(q), NULL, err, sizeof(err)), 0);
    assert_true(r->has_step && r->step == -3 && r->hta_candidates == 4);
    assert_non_null(r->thresholds);
    s = json(&r->base);
    assert_string_equal(s, "{\"run_id\":0,\"has_step\":true,\"step\":-3,\"thresholds\":{"
                           "\"late_pct\":2.5,\"excess_pct\":0,\"step_pct\":0},\"hta\":false,"
                           "\"hta_candidates\":4,\"max_rows\":0,\"save_offsets\":false}");
    free(s);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_sorted),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_doubles),
        cmocka_unit_test(test_unknown_enum_and_limit),
        cmocka_unit_test(test_query_every_type),
        cmocka_unit_test(test_query_refusals),
        cmocka_unit_test(test_url_decode),
        cmocka_unit_test(test_kprof_request),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
