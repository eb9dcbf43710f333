#include "kp_pbjson.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_json.h"

#define PBJSON_MAX_DEPTH  32  /* nested messages written (kprof's are a few levels deep) */
#define QUERY_MAX_PARAMS  64  /* parameters one query may give */
#define QUERY_NAME_MAX    256 /* a parameter's decoded name */
#define JS_SAFE_INT       9007199254740992.0 /* 2^53: every integer up to it is a double */
#define FIELD_PTR(m, off) ((void *) ((char *) (m) + (off)))

/* ---- writer ------------------------------------------------------------------------------ */

static int write_message(struct kp_strbuf *sb, const ProtobufCMessage *m, int depth);

/* The shortest of %.{15,16,17}g (float: %.{6..9}g) that reads back to v. */
static int write_double(struct kp_strbuf *sb, double v, bool is_float)
{
    char buf[40];

    if (isnan(v)) {
        return kp_strbuf_append_str(sb, "\"NaN\"");
    }
    if (isinf(v)) {
        return kp_strbuf_append_str(sb, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    }
    for (int prec = is_float ? 6 : 15; prec <= (is_float ? 9 : 17); prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, v);
        if (is_float ? strtof(buf, NULL) == (float) v : strtod(buf, NULL) == v) {
            break;
        }
    }
    return kp_strbuf_append_str(sb, buf);
}

int kp_pbjson_write_i64(struct kp_strbuf *sb, int64_t v)
{
    bool exact = v >= -(int64_t) JS_SAFE_INT && v <= (int64_t) JS_SAFE_INT;

    return kp_strbuf_appendf(sb, exact ? "%" PRId64 : "\"%" PRId64 "\"", v);
}

static int write_u64(struct kp_strbuf *sb, uint64_t v)
{
    return kp_strbuf_appendf(sb, v <= (uint64_t) JS_SAFE_INT ? "%" PRIu64 : "\"%" PRIu64 "\"", v);
}

static int write_base64(struct kp_strbuf *sb, const uint8_t *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    int rc = kp_strbuf_putc(sb, '"');

    for (size_t i = 0; rc == 0 && i < n; i += 3) {
        uint32_t w = (uint32_t) p[i] << 16 | (i + 1 < n ? (uint32_t) p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);

        q[0] = tab[(w >> 18) & 63];
        q[1] = tab[(w >> 12) & 63];
        q[2] = i + 1 < n ? tab[(w >> 6) & 63] : '=';
        q[3] = i + 2 < n ? tab[w & 63] : '=';
        rc = kp_strbuf_append(sb, q, 4);
    }
    return rc != 0 ? rc : kp_strbuf_putc(sb, '"');
}

/* One value of field f stored at p (an element of a repeated field, or the field itself). */
static int write_value(struct kp_strbuf *sb, const ProtobufCFieldDescriptor *f, const void *p,
                       int depth)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return kp_strbuf_appendf(sb, "%" PRId32, *(const int32_t *) p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return kp_strbuf_appendf(sb, "%" PRIu32, *(const uint32_t *) p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return kp_pbjson_write_i64(sb, *(const int64_t *) p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return write_u64(sb, *(const uint64_t *) p);
    case PROTOBUF_C_TYPE_FLOAT:
        return write_double(sb, *(const float *) p, true);
    case PROTOBUF_C_TYPE_DOUBLE:
        return write_double(sb, *(const double *) p, false);
    case PROTOBUF_C_TYPE_BOOL:
        return kp_strbuf_append_str(sb, *(const protobuf_c_boolean *) p ? "true" : "false");
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *) p;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);

        return ev != NULL ? kp_json_append(sb, ev->name, strlen(ev->name))
                          : kp_strbuf_appendf(sb, "%d", v);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *) p;

        return s != NULL ? kp_json_append(sb, s, strlen(s)) : kp_strbuf_append_str(sb, "null");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;

        return write_base64(sb, b->data, b->len);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(const ProtobufCMessage *const *) p;

        return m != NULL ? write_message(sb, m, depth + 1) : kp_strbuf_append_str(sb, "null");
    }
    }
    return kp_strbuf_append_str(sb, "null");
}

/* Size of one stored value of a field of type t. */
static size_t value_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    default:
        return 4;
    }
}

/* Whether a singular field holds a value (proto3 fields always do; an optional or oneof
 * member only when set). */
static bool field_present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f)
{
    const void *q = (const char *) m + f->quantifier_offset;

    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        return *(const uint32_t *) q == f->id;
    }
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
        f->type != PROTOBUF_C_TYPE_STRING) {
        return *(const protobuf_c_boolean *) q != 0;
    }
    return true;
}

static int write_message(struct kp_strbuf *sb, const ProtobufCMessage *m, int depth)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    int rc;

    if (depth > PBJSON_MAX_DEPTH) {
        return KP_ETOOBIG;
    }
    if ((rc = kp_strbuf_putc(sb, '{')) != 0) {
        return rc;
    }
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *p = (const char *) m + f->offset;

        if ((i > 0 && (rc = kp_strbuf_putc(sb, ',')) != 0) ||
            (rc = kp_json_append(sb, f->name, strlen(f->name))) != 0 ||
            (rc = kp_strbuf_putc(sb, ':')) != 0) {
            return rc;
        }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *) ((const char *) m + f->quantifier_offset);
            const char *arr = *(const char *const *) p;
            size_t sz = value_size(f->type);

            rc = kp_strbuf_putc(sb, '[');
            for (size_t j = 0; rc == 0 && j < n; j++) {
                if (j > 0) {
                    rc = kp_strbuf_putc(sb, ',');
                }
                if (rc == 0) {
                    rc = write_value(sb, f, arr + j * sz, depth);
                }
            }
            if (rc == 0) {
                rc = kp_strbuf_putc(sb, ']');
            }
        }
        else if (!field_present(m, f)) {
            rc = kp_strbuf_append_str(sb, "null");
        }
        else {
            rc = write_value(sb, f, p, depth);
        }
        if (rc != 0) {
            return rc;
        }
    }
    return kp_strbuf_putc(sb, '}');
}

int kp_pbjson_write(struct kp_strbuf *sb, const ProtobufCMessage *msg)
{
    return write_message(sb, msg, 0);
}

/* ---- query parser ------------------------------------------------------------------------ */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

long kp_pbjson_url_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        char c = s[i];

        if (c == '%') {
            int hi = i + 2 < n ? hexval(s[i + 1]) : -1, lo = i + 2 < n ? hexval(s[i + 2]) : -1;

            if (hi < 0 || lo < 0) {
                return -EINVAL;
            }
            c = (char) (hi << 4 | lo);
            i += 2;
        }
        else if (c == '+') {
            c = ' ';
        }
        if (c == '\0' || o + 1 >= cap) {
            return -EINVAL;
        }
        out[o++] = c;
    }
    out[o] = '\0';
    return (long) o;
}

/* What parsing one parameter needs to say why it failed. */
struct qctx {
    const char *name; /* the parameter as given (decoded) */
    char *err;
    size_t errlen;
};

static int bad(struct qctx *c, const char *value, const char *why)
{
    snprintf(c->err, c->errlen, "parameter %s: \"%.64s\" %s", c->name, value, why);
    return -EINVAL;
}

/* Decimal (or 0x hex) integer: the whole of s, no sign for unsigned. */
static bool parse_int(const char *s, bool is_signed, int64_t *iv, uint64_t *uv)
{
    const char *p = s;
    char *end;
    int base = 10;

    if (*p == '-' && is_signed) {
        p++;
    }
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
    }
    if ((base == 10 && (*p < '0' || *p > '9')) || (base == 16 && hexval(p[2]) < 0)) {
        return false;
    }
    errno = 0;
    if (is_signed) {
        *iv = strtoll(s, &end, base);
    }
    else {
        *uv = strtoull(s, &end, base);
    }
    return errno == 0 && *end == '\0';
}

/* Parses one value of field f into the storage at p (strings malloc'd). */
static int parse_value(struct qctx *c, const ProtobufCFieldDescriptor *f, const char *v, void *p)
{
    int64_t iv = 0;
    uint64_t uv = 0;

    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if (!parse_int(v, true, &iv, NULL) || iv < INT32_MIN || iv > INT32_MAX) {
            return bad(c, v, "is not an int32 (-2147483648..2147483647)");
        }
        *(int32_t *) p = (int32_t) iv;
        return 0;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if (!parse_int(v, false, NULL, &uv) || uv > UINT32_MAX) {
            return bad(c, v, "is not a uint32 (0..4294967295)");
        }
        *(uint32_t *) p = (uint32_t) uv;
        return 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        if (!parse_int(v, true, &iv, NULL)) {
            return bad(c, v, "is not an int64");
        }
        *(int64_t *) p = iv;
        return 0;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        if (!parse_int(v, false, NULL, &uv)) {
            return bad(c, v, "is not a uint64 (0..18446744073709551615)");
        }
        *(uint64_t *) p = uv;
        return 0;
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        char *end;
        double d;

        errno = 0;
        d = strtod(v, &end);
        if (v[0] == '\0' || v[0] == ' ' || *end != '\0' || errno != 0 || !isfinite(d) ||
            (f->type == PROTOBUF_C_TYPE_FLOAT && fabs(d) > FLT_MAX)) {
            return bad(c, v, "is not a finite number");
        }
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            *(float *) p = (float) d;
        }
        else {
            *(double *) p = d;
        }
        return 0;
    }
    case PROTOBUF_C_TYPE_BOOL:
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) {
            *(protobuf_c_boolean *) p = 1;
        }
        else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) {
            *(protobuf_c_boolean *) p = 0;
        }
        else {
            return bad(c, v, "is not a bool (true, false, 1 or 0)");
        }
        return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value_by_name(ed, v);
        char names[400] = "";
        size_t o = 0;

        if (ev == NULL && parse_int(v, true, &iv, NULL) && iv >= INT32_MIN && iv <= INT32_MAX) {
            ev = protobuf_c_enum_descriptor_get_value(ed, (int) iv);
        }
        if (ev != NULL) {
            *(int *) p = ev->value;
            return 0;
        }
        for (unsigned i = 0; i < ed->n_values && o + 2 < sizeof(names); i++) {
            int w = snprintf(names + o, sizeof(names) - o, "%s%s", i > 0 ? ", " : "",
                             ed->values[i].name);

            o += w > 0 ? (size_t) w : 0;
        }
        {
            char why[480];

            snprintf(why, sizeof(why), "is not one of %s (or its number)", names);
            return bad(c, v, why);
        }
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *s;

        /* proto3 strings are UTF-8 (a peer's decoder may refuse anything else) */
        for (size_t i = 0, n = strlen(v), l; i < n; i += l) {
            l = (unsigned char) v[i] < 0x80 ? 1 : kp_utf8_seq_len(v + i, n - i);
            if (l == 0) {
                return bad(c, v, "is not UTF-8");
            }
        }
        s = strdup(v);

        if (s == NULL) {
            return -ENOMEM;
        }
        *(char **) p = s;
        return 0;
    }
    default:
        return bad(c, v, "cannot be given in a query (a bytes or message field)");
    }
}

/* The field of d named name, or NULL. */
static const ProtobufCFieldDescriptor *field_named(const ProtobufCMessageDescriptor *d,
                                                   const char *name)
{
    return protobuf_c_message_descriptor_get_field_by_name(d, name);
}

/* "run_id, rank, group_by": d's fields, for an unknown parameter's message. */
static void field_list(const ProtobufCMessageDescriptor *d, char *out, size_t len)
{
    size_t o = 0;

    out[0] = '\0';
    for (unsigned i = 0; i < d->n_fields && o + 2 < len; i++) {
        int w = snprintf(out + o, len - o, "%s%s", i > 0 ? ", " : "", d->fields[i].name);

        o += w > 0 ? (size_t) w : 0;
    }
}

/* Sets one parameter: name (dotted) to value. */
static int set_param(ProtobufCMessage *msg, const char *name, const char *value, char *err,
                     size_t errlen)
{
    char path[QUERY_NAME_MAX], fields[300];
    char *seg = path, *dot;
    ProtobufCMessage *m = msg;
    const ProtobufCFieldDescriptor *f;
    struct qctx c = { .name = name, .err = err, .errlen = errlen };

    snprintf(path, sizeof(path), "%s", name);
    for (;;) {
        dot = strchr(seg, '.');
        if (dot != NULL) {
            *dot = '\0';
        }
        f = field_named(m->descriptor, seg);
        if (f == NULL) {
            field_list(m->descriptor, fields, sizeof(fields));
            snprintf(err, errlen, "unknown parameter %s: %s takes %s", name,
                     m->descriptor->short_name, fields);
            return -EINVAL;
        }
        if (dot == NULL) {
            break;
        }
        if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->label == PROTOBUF_C_LABEL_REPEATED) {
            snprintf(err, errlen, "unknown parameter %s: %s is not a message field", name, seg);
            return -EINVAL;
        }
        {
            ProtobufCMessage **sub = FIELD_PTR(m, f->offset);
            const ProtobufCMessageDescriptor *sd = f->descriptor;

            if (*sub == NULL) {
                if ((*sub = malloc(sd->sizeof_message)) == NULL) {
                    return -ENOMEM;
                }
                protobuf_c_message_init(sd, *sub);
                if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                    *(uint32_t *) FIELD_PTR(m, f->quantifier_offset) = f->id;
                }
            }
            m = *sub;
        }
        seg = dot + 1;
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        snprintf(err, errlen, "parameter %s is a message: set its fields (%s.FIELD=VALUE)", name,
                 name);
        return -EINVAL;
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t *n = FIELD_PTR(m, f->quantifier_offset);
        char **arr = FIELD_PTR(m, f->offset);
        size_t sz = value_size(f->type), k = 1;
        char one[KP_PBJSON_QUERY_VALUE_MAX];
        const char *v = value;
        void *grown;
        int rc;

        for (const char *s = value; *s != '\0'; s++) {
            k += *s == ',';
        }
        if ((grown = realloc(*arr, (*n + k) * sz)) == NULL) {
            return -ENOMEM;
        }
        *arr = grown;
        while (k-- > 0) {
            const char *comma = strchr(v, ',');
            size_t l = comma != NULL ? (size_t) (comma - v) : strlen(v);

            memcpy(one, v, l);
            one[l] = '\0';
            if ((rc = parse_value(&c, f, one, *arr + *n * sz)) != 0) {
                return rc;
            }
            (*n)++;
            v += l + (comma != NULL);
        }
        return 0;
    }
    if (f->type == PROTOBUF_C_TYPE_STRING) {
        char **s = FIELD_PTR(m, f->offset);

        if (*s != NULL && *s != f->default_value) {
            free(*s);
        }
        *s = NULL;
        int rc = parse_value(&c, f, value, s);

        if (rc != 0) {
            *s = (char *) f->default_value;
            return rc;
        }
    }
    else {
        int rc = parse_value(&c, f, value, FIELD_PTR(m, f->offset));

        if (rc != 0) {
            return rc;
        }
    }
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        *(uint32_t *) FIELD_PTR(m, f->quantifier_offset) = f->id;
    }
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING) {
        *(protobuf_c_boolean *) FIELD_PTR(m, f->quantifier_offset) = 1;
    }
    return 0;
}

int kp_pbjson_query(ProtobufCMessage *msg, const char *q, size_t len, const char *const *reserved,
                    char *err, size_t errlen)
{
    char names[QUERY_MAX_PARAMS][QUERY_NAME_MAX];
    size_t n_names = 0, i = 0;
    char *v = NULL;
    int rc = 0;

    if ((v = malloc(KP_PBJSON_QUERY_VALUE_MAX + 1)) == NULL) {
        return -ENOMEM;
    }
    while (i < len && rc == 0) {
        const char *seg = q + i, *amp = memchr(seg, '&', len - i), *eq;
        size_t l = amp != NULL ? (size_t) (amp - seg) : len - i;
        char name[QUERY_NAME_MAX];

        i += l + 1;
        if (l == 0) {
            continue; /* "a=1&&b=2", a trailing '&' */
        }
        eq = memchr(seg, '=', l);
        if (eq == NULL) {
            snprintf(err, errlen, "parameter \"%.*s\" has no value: give NAME=VALUE",
                     (int) (l < 64 ? l : 64), seg);
            rc = -EINVAL;
            break;
        }
        if (kp_pbjson_url_decode(seg, (size_t) (eq - seg), name, sizeof(name)) <= 0) {
            snprintf(err, errlen,
                     "parameter name \"%.*s\" is empty, too long or badly percent-encoded",
                     (int) ((eq - seg) < 64 ? (eq - seg) : 64), seg);
            rc = -EINVAL;
            break;
        }
        if (kp_pbjson_url_decode(eq + 1, l - (size_t) (eq + 1 - seg), v,
                                 KP_PBJSON_QUERY_VALUE_MAX + 1) < 0) {
            snprintf(err, errlen,
                     "parameter %s: the value is longer than %d bytes or badly percent-encoded",
                     name, KP_PBJSON_QUERY_VALUE_MAX);
            rc = -EINVAL;
            break;
        }
        for (const char *const *r = reserved; r != NULL && *r != NULL; r++) {
            if (strcmp(*r, name) == 0) {
                snprintf(err, errlen, "parameter %s is set by the path, not the query", name);
                rc = -EINVAL;
            }
        }
        for (size_t k = 0; rc == 0 && k < n_names; k++) {
            if (strcmp(names[k], name) == 0) {
                snprintf(err, errlen, "parameter %s is given twice: give it once (a list as a,b,c)",
                         name);
                rc = -EINVAL;
            }
        }
        if (rc == 0 && n_names == QUERY_MAX_PARAMS) {
            snprintf(err, errlen, "more than %d parameters", QUERY_MAX_PARAMS);
            rc = -EINVAL;
        }
        if (rc == 0) {
            memcpy(names[n_names++], name, sizeof(name));
            rc = set_param(msg, name, v, err, errlen);
        }
    }
    free(v);
    return rc;
}
