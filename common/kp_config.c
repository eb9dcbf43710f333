#include "kp_config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kp_err.h"
#include "kp_strbuf.h"

#define NAME_MAX_LEN 100 /* table names; keeps env names and messages bounded */
#define SHOWN_MAX    80  /* bytes of a bad value quoted in an error */

static const char *const builtin_names[] = { "config", "help", "dry-run", "print-config" };

static const char *const type_names[] = {
    [KP_CONFIG_BOOL] = "BOOL",         [KP_CONFIG_INT] = "INT",       [KP_CONFIG_SIZE] = "SIZE",
    [KP_CONFIG_DURATION] = "DURATION", [KP_CONFIG_STRING] = "STRING", [KP_CONFIG_ENUM] = "ENUM",
};

static void *field(void *cfg, const struct kp_config_def *d)
{
    return (char *) cfg + d->offset;
}

static const void *cfield(const void *cfg, const struct kp_config_def *d)
{
    return (const char *) cfg + d->offset;
}

/* ---- value parsers ---- */

/* Reads the decimal digits at *s into *v. Returns 0, -EINVAL (no digits) or -ERANGE. */
static int parse_digits(const char **s, long long *v)
{
    const char *p = *s;
    long long acc = 0;

    if (!isdigit((unsigned char) *p)) {
        return -EINVAL;
    }
    for (; isdigit((unsigned char) *p); p++) {
        if (acc > (LLONG_MAX - (*p - '0')) / 10) {
            return -ERANGE;
        }
        acc = acc * 10 + (*p - '0');
    }
    *s = p;
    *v = acc;
    return 0;
}

struct unit {
    const char *name;
    long long mult;
};

static const struct unit size_units[] = {
    { "", 1 },
    { "b", 1 },
    { "k", 1LL << 10 },
    { "kib", 1LL << 10 },
    { "kb", 1000LL },
    { "m", 1LL << 20 },
    { "mib", 1LL << 20 },
    { "mb", 1000000LL },
    { "g", 1LL << 30 },
    { "gib", 1LL << 30 },
    { "gb", 1000000000LL },
    { "t", 1LL << 40 },
    { "tib", 1LL << 40 },
    { "tb", 1000000000000LL },
};

int kp_parse_size(const char *s, long long *out)
{
    long long v;
    int rc;

    if (s == NULL) {
        return -EINVAL;
    }
    rc = parse_digits(&s, &v);
    if (rc != 0) {
        return rc;
    }
    while (*s == ' ') {
        s++;
    }
    for (size_t i = 0; i < sizeof(size_units) / sizeof(size_units[0]); i++) {
        if (strcasecmp(s, size_units[i].name) != 0) {
            continue;
        }
        if (v > LLONG_MAX / size_units[i].mult) {
            return -ERANGE;
        }
        *out = v * size_units[i].mult;
        return 0;
    }
    return -EINVAL;
}

static const struct unit duration_units[] = {
    { "ms", 1 }, { "s", 1000 }, { "m", 60000 }, { "h", 3600000 }, { "d", 86400000 },
};

int kp_parse_duration_ms(const char *s, long long *out)
{
    long long total = 0, v, mult;
    size_t ulen;
    int rc;

    if (s == NULL || *s == '\0') {
        return -EINVAL;
    }
    if (strcmp(s, "0") == 0) {
        *out = 0;
        return 0;
    }
    while (*s != '\0') {
        rc = parse_digits(&s, &v);
        if (rc != 0) {
            return rc;
        }
        for (ulen = 0; isalpha((unsigned char) s[ulen]); ulen++) {
        }
        mult = 0;
        for (size_t i = 0; i < sizeof(duration_units) / sizeof(duration_units[0]); i++) {
            if (strlen(duration_units[i].name) == ulen &&
                strncasecmp(s, duration_units[i].name, ulen) == 0) {
                mult = duration_units[i].mult;
            }
        }
        if (mult == 0) {
            return -EINVAL;
        }
        if (v > LLONG_MAX / mult || v * mult > LLONG_MAX - total) {
            return -ERANGE;
        }
        total += v * mult;
        s += ulen;
    }
    *out = total;
    return 0;
}

int kp_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = { "true", "yes", "on", "1" };
    static const char *const no[] = { "false", "no", "off", "0" };

    for (size_t i = 0; s != NULL && i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- formatting ---- */

/* Writes v in the largest unit that divides it exactly. */
static const char *fmt_scaled(long long v, const struct unit *units, size_t nunits, char *buf,
                              size_t len)
{
    const struct unit *best = NULL;

    for (size_t i = 0; i < nunits; i++) {
        if (v != 0 && v % units[i].mult == 0 && (best == NULL || units[i].mult > best->mult)) {
            best = &units[i];
        }
    }
    if (best == NULL) {
        snprintf(buf, len, "%lld", v);
    }
    else {
        snprintf(buf, len, "%lld%s", v / best->mult, best->name);
    }
    return buf;
}

static const struct unit size_show_units[] = {
    { "", 1 },
    { "KiB", 1LL << 10 },
    { "MiB", 1LL << 20 },
    { "GiB", 1LL << 30 },
    { "TiB", 1LL << 40 },
};

static const char *fmt_size(long long v, char *buf, size_t len)
{
    return fmt_scaled(v, size_show_units, sizeof(size_show_units) / sizeof(size_show_units[0]), buf,
                      len);
}

static const char *fmt_duration(long long v, char *buf, size_t len)
{
    if (v == 0) {
        snprintf(buf, len, "0");
        return buf;
    }
    return fmt_scaled(v, duration_units, sizeof(duration_units) / sizeof(duration_units[0]), buf,
                      len);
}

static const char *fmt_number(const struct kp_config_def *d, long long v, char *buf, size_t len)
{
    if (d->type == KP_CONFIG_SIZE) {
        return fmt_size(v, buf, len);
    }
    if (d->type == KP_CONFIG_DURATION) {
        return fmt_duration(v, buf, len);
    }
    snprintf(buf, len, "%lld", v);
    return buf;
}

/* Writes the allowed range of a numeric row ("1KiB..1MiB", "at least 1") to buf; "" when
 * unbounded. */
static const char *fmt_bounds(const struct kp_config_def *d, char *buf, size_t len)
{
    char lo[32], hi[32];

    if (d->min == 0 && d->max == 0) {
        buf[0] = '\0';
    }
    else if (d->max == LLONG_MAX) {
        snprintf(buf, len, "at least %s", fmt_number(d, d->min, lo, sizeof(lo)));
    }
    else {
        snprintf(buf, len, "%s..%s", fmt_number(d, d->min, lo, sizeof(lo)),
                 fmt_number(d, d->max, hi, sizeof(hi)));
    }
    return buf;
}

static void fmt_enum_values(const struct kp_config_def *d, const char *sep, char *buf, size_t len)
{
    size_t off = 0;
    int r;

    buf[0] = '\0';
    for (size_t i = 0; d->enum_values[i] != NULL && off < len; i++) {
        r = snprintf(buf + off, len - off, "%s%s", i > 0 ? sep : "", d->enum_values[i]);
        if (r < 0) {
            break;
        }
        off += (size_t) r;
    }
}

/* The value as quoted in an error: "***" for secrets, long ones cut short. */
static const char *shown(const struct kp_config_def *d, const char *val, char *buf, size_t len)
{
    if (d != NULL && d->secret) {
        return "***";
    }
    if (strlen(val) <= SHOWN_MAX) {
        return val;
    }
    snprintf(buf, len, "%.*s...", SHOWN_MAX, val);
    return buf;
}

/* ---- applying one value ---- */

/* Parses val for row d and stores it in cfg. origin says where val came from (already
 * masked) and starts the error message; is_default marks the row's own default, which may
 * leave a required string empty. Returns 0, KP_ECONFIG or -ENOMEM. */
static int apply(const struct kp_config_def *d, void *cfg, const char *val, const char *origin,
                 bool is_default, char *errbuf, size_t errlen)
{
    char allowed[256];
    long long v = 0;
    char *end, *copy, **sp;
    size_t len;
    bool b;
    int rc;

    switch (d->type) {
    case KP_CONFIG_BOOL:
        if (kp_parse_bool(val, &b) != 0) {
            kp_errbuf_set(errbuf, errlen, "%s: not a bool (use true or false)", origin);
            return KP_ECONFIG;
        }
        *(bool *) field(cfg, d) = b;
        return 0;
    case KP_CONFIG_INT:
        errno = 0;
        v = strtoll(val, &end, 10);
        if (val[0] == '\0' || isspace((unsigned char) val[0]) || *end != '\0') {
            kp_errbuf_set(errbuf, errlen, "%s: not an integer", origin);
            return KP_ECONFIG;
        }
        rc = errno == ERANGE ? -ERANGE : 0;
        break;
    case KP_CONFIG_SIZE:
        rc = kp_parse_size(val, &v);
        if (rc == -EINVAL) {
            kp_errbuf_set(errbuf, errlen, "%s: not a size (use e.g. 16384, 16KiB, 1MiB)", origin);
            return KP_ECONFIG;
        }
        break;
    case KP_CONFIG_DURATION:
        rc = kp_parse_duration_ms(val, &v);
        if (rc == -EINVAL) {
            kp_errbuf_set(errbuf, errlen, "%s: not a duration (use e.g. 500ms, 30s, 2m, 1h)",
                          origin);
            return KP_ECONFIG;
        }
        break;
    case KP_CONFIG_STRING:
        len = strlen(val);
        /* A required string may default to empty: check_required() catches it if no
         * other source sets it. */
        if (len == 0 && d->min > 0 && !is_default) {
            kp_errbuf_set(errbuf, errlen, "%s: must not be empty", origin);
            return KP_ECONFIG;
        }
        if (len > 0 && len < (size_t) d->min) {
            kp_errbuf_set(errbuf, errlen, "%s: too short (at least %lld bytes)", origin, d->min);
            return KP_ECONFIG;
        }
        if (d->max > 0 && len > (size_t) d->max) {
            kp_errbuf_set(errbuf, errlen, "%s: too long (at most %lld bytes)", origin, d->max);
            return KP_ECONFIG;
        }
        copy = strdup(val);
        if (copy == NULL) {
            kp_errbuf_set(errbuf, errlen, "%s: out of memory", origin);
            return -ENOMEM;
        }
        sp = field(cfg, d);
        free(*sp);
        *sp = copy;
        return 0;
    case KP_CONFIG_ENUM:
        for (int i = 0; d->enum_values[i] != NULL; i++) {
            if (strcasecmp(val, d->enum_values[i]) == 0) {
                *(int *) field(cfg, d) = i;
                return 0;
            }
        }
        fmt_enum_values(d, ", ", allowed, sizeof(allowed));
        kp_errbuf_set(errbuf, errlen, "%s: not one of: %s", origin, allowed);
        return KP_ECONFIG;
    default:
        kp_errbuf_set(errbuf, errlen, "%s: bad type in config table", origin);
        return KP_ECONFIG;
    }
    /* INT, SIZE and DURATION: range. */
    if (rc == -ERANGE || ((d->min != 0 || d->max != 0) && (v < d->min || v > d->max))) {
        if (d->min == 0 && d->max == 0) {
            kp_errbuf_set(errbuf, errlen, "%s: out of range (must fit a 64-bit signed integer)",
                          origin);
        }
        else {
            kp_errbuf_set(errbuf, errlen, "%s: out of range (allowed %s)", origin,
                          fmt_bounds(d, allowed, sizeof(allowed)));
        }
        return KP_ECONFIG;
    }
    *(long long *) field(cfg, d) = v;
    return 0;
}

/* ---- the table ---- */

static const struct kp_config_def *find_def(const struct kp_config_def *defs, size_t n,
                                            const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++) {
        if (strlen(defs[i].name) == len && strncmp(defs[i].name, name, len) == 0) {
            return &defs[i];
        }
    }
    return NULL;
}

static void env_name(const char *name, char *buf, size_t len)
{
    size_t o = 0;

    o = (size_t) snprintf(buf, len, "KPROF_");
    for (; *name != '\0' && o + 1 < len; name++) {
        buf[o++] = (*name == '.' || *name == '-') ? '_' : (char) toupper((unsigned char) *name);
    }
    buf[o] = '\0';
}

static int check_table(const struct kp_config_def *defs, size_t n, char *errbuf, size_t errlen)
{
    char e1[NAME_MAX_LEN + 8], e2[NAME_MAX_LEN + 8];
    const struct kp_config_def *d;
    const char *why = NULL;

    for (size_t i = 0; i < n && why == NULL; i++) {
        d = &defs[i];
        if (d->name == NULL || d->name[0] == '\0' || strlen(d->name) > NAME_MAX_LEN ||
            strspn(d->name, "abcdefghijklmnopqrstuvwxyz0123456789.-") != strlen(d->name)) {
            why = "name must be 1-100 of [a-z0-9.-]";
        }
        else if ((unsigned) d->type > KP_CONFIG_ENUM) {
            why = "bad type";
        }
        else if (d->type == KP_CONFIG_ENUM &&
                 (d->enum_values == NULL || d->enum_values[0] == NULL)) {
            why = "enum without enum_values";
        }
        else if (d->type != KP_CONFIG_STRING && d->min > d->max) {
            why = "min > max";
        }
        for (size_t b = 0; why == NULL && b < sizeof(builtin_names) / sizeof(builtin_names[0]);
             b++) {
            if (strcmp(d->name, builtin_names[b]) == 0) {
                why = "name is a built-in flag";
            }
        }
        env_name(d->name != NULL ? d->name : "", e1, sizeof(e1));
        for (size_t j = 0; why == NULL && j < i; j++) {
            env_name(defs[j].name, e2, sizeof(e2));
            if (strcmp(e1, e2) == 0) {
                why = "name (or its environment variable) is used twice";
            }
        }
        if (why != NULL) {
            kp_errbuf_set(errbuf, errlen, "config table: row %zu (%s): %s", i,
                          d->name != NULL ? d->name : "NULL", why);
        }
    }
    return why == NULL ? 0 : KP_ECONFIG;
}

void kp_config_fini(const struct kp_config_def *defs, size_t n, void *cfg)
{
    char **sp;

    for (size_t i = 0; i < n; i++) {
        if (defs[i].type == KP_CONFIG_STRING) {
            sp = field(cfg, &defs[i]);
            free(*sp);
            *sp = NULL;
        }
    }
}

/* ---- the file ---- */

/* Expands ${VAR} and ${VAR:-default} in val into out. Returns 0 or a negative code with a
 * message (after prefix) in errbuf. */
static int expand(const char *val, struct kp_strbuf *out, const char *prefix, char *errbuf,
                  size_t errlen)
{
    char name[256];
    const char *p = val, *close, *colon, *env, *dflt;
    size_t nlen;
    int rc = 0;

    kp_strbuf_reset(out);
    while (rc == 0 && *p != '\0') {
        if (p[0] != '$' || p[1] != '{') {
            rc = kp_strbuf_putc(out, *p++);
            continue;
        }
        close = strchr(p, '}');
        if (close == NULL) {
            kp_errbuf_set(errbuf, errlen, "%s: unterminated ${", prefix);
            return KP_ECONFIG;
        }
        colon = strstr(p, ":-");
        if (colon == NULL || colon > close) {
            colon = close;
        }
        nlen = (size_t) (colon - (p + 2));
        if (nlen == 0 || nlen >= sizeof(name)) {
            kp_errbuf_set(errbuf, errlen, "%s: bad variable name in ${...}", prefix);
            return KP_ECONFIG;
        }
        memcpy(name, p + 2, nlen);
        name[nlen] = '\0';
        env = getenv(name);
        if (env != NULL && (env[0] != '\0' || colon == close)) {
            rc = kp_strbuf_append_str(out, env);
        }
        else if (colon != close) {
            dflt = colon + 2;
            rc = kp_strbuf_append(out, dflt, (size_t) (close - dflt));
        }
        p = close + 1;
    }
    if (rc == 0) {
        rc = kp_strbuf_reserve(out, 0); /* so that out->data is a string even if empty */
    }
    if (rc != 0) {
        kp_errbuf_set(errbuf, errlen, "%s: value too long after expansion", prefix);
        return rc == -ENOMEM ? -ENOMEM : KP_ECONFIG;
    }
    return 0;
}

static char *trim(char *s, char *end)
{
    while (s < end && isspace((unsigned char) *s)) {
        s++;
    }
    while (end > s && isspace((unsigned char) end[-1])) {
        end--;
    }
    *end = '\0';
    return s;
}

/* Reads the whole file at path into *buf (owned, NUL-terminated). Returns 0, 1 when the file
 * does not exist, or a negative code with a message. */
static int read_file(const char *path, char **buf, size_t *len, char *errbuf, size_t errlen)
{
    FILE *f;
    char *b = NULL;
    size_t got;
    int rc;

    f = fopen(path, "r");
    if (f == NULL) {
        if (errno == ENOENT) {
            return 1;
        }
        rc = -errno;
        kp_errbuf_set(errbuf, errlen, "config file %s: %s", path, strerror(errno));
        return rc;
    }
    b = malloc(KP_CONFIG_FILE_MAX + 1);
    if (b == NULL) {
        kp_errbuf_set(errbuf, errlen, "config file %s: out of memory", path);
        rc = -ENOMEM;
        goto out;
    }
    got = fread(b, 1, KP_CONFIG_FILE_MAX + 1, f);
    if (ferror(f)) {
        rc = -EIO;
        kp_errbuf_set(errbuf, errlen, "config file %s: read error", path);
        goto out;
    }
    if (got > KP_CONFIG_FILE_MAX) {
        rc = KP_ECONFIG;
        kp_errbuf_set(errbuf, errlen, "config file %s: bigger than %d bytes", path,
                      KP_CONFIG_FILE_MAX);
        goto out;
    }
    b[got] = '\0';
    *buf = b;
    *len = got;
    b = NULL;
    rc = 0;
out:
    free(b);
    fclose(f);
    return rc;
}

static int load_file(const struct kp_config_def *defs, size_t n, void *cfg, const char *path,
                     bool must_exist, char *errbuf, size_t errlen)
{
    const struct kp_config_def *d;
    struct kp_strbuf exp;
    char *buf = NULL, *line, *nl, *eq, *key, *val, *end;
    char prefix[NAME_MAX_LEN + SHOWN_MAX + 600], tmp[SHOWN_MAX + 4];
    size_t len = 0;
    int rc, lineno = 0;

    kp_strbuf_init(&exp, 64 << 10);
    rc = read_file(path, &buf, &len, errbuf, errlen);
    if (rc == 1) {
        if (must_exist) {
            kp_errbuf_set(errbuf, errlen, "--config=%s: no such file", path);
            rc = KP_ECONFIG;
        }
        else {
            rc = 0;
        }
        goto out;
    }
    if (rc != 0) {
        goto out;
    }
    if (strlen(buf) != len) {
        kp_errbuf_set(errbuf, errlen, "config file %s: contains a NUL byte", path);
        rc = KP_ECONFIG;
        goto out;
    }
    for (line = buf; rc == 0 && *line != '\0'; line = nl) {
        lineno++;
        nl = strchr(line, '\n');
        end = nl != NULL ? nl : line + strlen(line);
        nl = nl != NULL ? nl + 1 : end;
        if (end - line > KP_CONFIG_LINE_MAX) {
            kp_errbuf_set(errbuf, errlen, "%s:%d: line longer than %d bytes", path, lineno,
                          KP_CONFIG_LINE_MAX);
            rc = KP_ECONFIG;
            break;
        }
        key = trim(line, end);
        if (*key == '\0' || *key == '#') {
            continue;
        }
        eq = strchr(key, '=');
        if (eq == NULL) {
            kp_errbuf_set(errbuf, errlen, "%s:%d: expected key = value", path, lineno);
            rc = KP_ECONFIG;
            break;
        }
        val = trim(eq + 1, eq + 1 + strlen(eq + 1));
        key = trim(key, eq);
        len = strlen(val);
        if (len >= 2 && val[0] == '"' && val[len - 1] == '"') {
            val[len - 1] = '\0';
            val++;
        }
        d = find_def(defs, n, key, strlen(key));
        if (d == NULL) {
            kp_errbuf_set(errbuf, errlen, "%s:%d: unknown key '%s'", path, lineno, key);
            rc = KP_ECONFIG;
            break;
        }
        snprintf(prefix, sizeof(prefix), "%s:%d: %s = %s", path, lineno, key,
                 shown(d, val, tmp, sizeof(tmp)));
        rc = expand(val, &exp, prefix, errbuf, errlen);
        if (rc == 0) {
            rc = apply(d, cfg, exp.data, prefix, false, errbuf, errlen);
        }
    }
out:
    kp_strbuf_fini(&exp);
    free(buf);
    return rc;
}

/* ---- flags ---- */

enum tok_kind {
    TOK_END,
    TOK_KEY,    /* d and val */
    TOK_POS,    /* val */
    TOK_CONFIG, /* val */
    TOK_HELP,
    TOK_DRY_RUN,
    TOK_PRINT,
};

struct tok {
    enum tok_kind kind;
    const struct kp_config_def *d;
    const char *val;
};

/* Reads the next token from argv at *i (advancing it). Returns 0 or KP_ECONFIG with a
 * message. */
static int next_tok(const struct kp_config_def *defs, size_t n, int argc, char **argv, int *i,
                    bool *flags_done, struct tok *t, char *errbuf, size_t errlen)
{
    const char *arg, *name, *eq;
    size_t nlen;

    t->d = NULL;
    t->val = NULL;
    if (*i >= argc) {
        t->kind = TOK_END;
        return 0;
    }
    arg = argv[(*i)++];
    if (*flags_done || arg[0] != '-' || arg[1] == '\0') {
        t->kind = TOK_POS;
        t->val = arg;
        return 0;
    }
    if (strcmp(arg, "--") == 0) {
        *flags_done = true;
        return next_tok(defs, n, argc, argv, i, flags_done, t, errbuf, errlen);
    }
    if (strcmp(arg, "-h") == 0) {
        t->kind = TOK_HELP;
        return 0;
    }
    if (arg[1] != '-') {
        kp_errbuf_set(errbuf, errlen, "unknown flag %s (flags are --key=value; see --help)", arg);
        return KP_ECONFIG;
    }
    name = arg + 2;
    eq = strchr(name, '=');
    nlen = eq != NULL ? (size_t) (eq - name) : strlen(name);
    t->val = eq != NULL ? eq + 1 : NULL;
    if ((nlen == 4 && strncmp(name, "help", 4) == 0) ||
        (nlen == 7 && strncmp(name, "dry-run", 7) == 0) ||
        (nlen == 12 && strncmp(name, "print-config", 12) == 0)) {
        if (eq != NULL) {
            kp_errbuf_set(errbuf, errlen, "--%.*s takes no value", (int) nlen, name);
            return KP_ECONFIG;
        }
        t->kind = name[0] == 'h' ? TOK_HELP : name[0] == 'd' ? TOK_DRY_RUN : TOK_PRINT;
        return 0;
    }
    if (nlen == 6 && strncmp(name, "config", 6) == 0) {
        t->kind = TOK_CONFIG;
    }
    else {
        t->kind = TOK_KEY;
        t->d = find_def(defs, n, name, nlen);
        if (t->d == NULL && nlen > 3 && strncmp(name, "no-", 3) == 0) {
            t->d = find_def(defs, n, name + 3, nlen - 3);
            if (t->d != NULL && t->d->type == KP_CONFIG_BOOL && eq == NULL) {
                t->val = "false";
                return 0;
            }
            if (t->d != NULL && t->d->type == KP_CONFIG_BOOL) {
                kp_errbuf_set(errbuf, errlen, "%s: --no-%s takes no value", arg, t->d->name);
                return KP_ECONFIG;
            }
            t->d = NULL;
        }
        if (t->d == NULL) {
            kp_errbuf_set(errbuf, errlen, "unknown flag --%.*s (see --help)", (int) nlen, name);
            return KP_ECONFIG;
        }
        if (t->d->type == KP_CONFIG_BOOL && eq == NULL) {
            t->val = "true";
            return 0;
        }
    }
    if (t->val == NULL) {
        if (*i >= argc) {
            kp_errbuf_set(errbuf, errlen, "--%s needs a value (%s)",
                          t->d != NULL ? t->d->name : "config",
                          t->d != NULL ? type_names[t->d->type] : "PATH");
            return KP_ECONFIG;
        }
        t->val = argv[(*i)++];
    }
    return 0;
}

static int load_env(const struct kp_config_def *defs, size_t n, void *cfg, char *errbuf,
                    size_t errlen)
{
    char env[NAME_MAX_LEN + 8], origin[NAME_MAX_LEN + SHOWN_MAX + 16], tmp[SHOWN_MAX + 4];
    const char *val;
    int rc;

    for (size_t i = 0; i < n; i++) {
        env_name(defs[i].name, env, sizeof(env));
        val = getenv(env);
        if (val == NULL) {
            continue;
        }
        snprintf(origin, sizeof(origin), "%s=%s", env, shown(&defs[i], val, tmp, sizeof(tmp)));
        rc = apply(&defs[i], cfg, val, origin, false, errbuf, errlen);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* The row's default as text: its def, or the type's zero. */
static const char *default_of(const struct kp_config_def *d)
{
    if (d->def != NULL) {
        return d->def;
    }
    switch (d->type) {
    case KP_CONFIG_BOOL:
        return "false";
    case KP_CONFIG_ENUM:
        return d->enum_values[0];
    case KP_CONFIG_STRING:
        return "";
    default:
        return "0";
    }
}

static int load_defaults(const struct kp_config_def *defs, size_t n, void *cfg, char *errbuf,
                         size_t errlen)
{
    char origin[NAME_MAX_LEN + SHOWN_MAX + 32], tmp[SHOWN_MAX + 4];
    const char *def;
    int rc;

    for (size_t i = 0; i < n; i++) {
        def = default_of(&defs[i]);
        snprintf(origin, sizeof(origin), "config table: default of %s (%s)", defs[i].name,
                 shown(&defs[i], def, tmp, sizeof(tmp)));
        rc = apply(&defs[i], cfg, def, origin, true, errbuf, errlen);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* After every source: required strings must be set. */
static int check_required(const struct kp_config_def *defs, size_t n, const void *cfg, char *errbuf,
                          size_t errlen)
{
    char env[NAME_MAX_LEN + 8];
    const char *v;

    for (size_t i = 0; i < n; i++) {
        if (defs[i].type != KP_CONFIG_STRING || defs[i].min <= 0) {
            continue;
        }
        v = *(char *const *) cfield(cfg, &defs[i]);
        if (v == NULL || v[0] == '\0') {
            env_name(defs[i].name, env, sizeof(env));
            kp_errbuf_set(errbuf, errlen,
                          "%s is required: set --%s=..., %s or \"%s = ...\" in the file",
                          defs[i].name, defs[i].name, env, defs[i].name);
            return KP_ECONFIG;
        }
    }
    return 0;
}

/* What pass 1 over the arguments found: the built-in flags. */
struct builtins {
    bool help, dry_run, print;
    const char *config_path;
};

/* Pass 1: the built-in flags and the positional arguments, and every syntax error. Returns 0 or
 * the first error (its message in errbuf); bi is filled either way (--help wins over errors). */
static int scan_args(const struct kp_config_def *defs, size_t n, const char *prog, int argc,
                     char **argv, struct kp_config_pos *pos, struct builtins *bi, char *errbuf,
                     size_t errlen)
{
    bool flags_done = false;
    struct tok t;
    int rc, first_err = 0;

    memset(bi, 0, sizeof(*bi));
    for (int i = 1; i < argc;) {
        rc = next_tok(defs, n, argc, argv, &i, &flags_done, &t, first_err == 0 ? errbuf : NULL,
                      errlen);
        if (rc == 0 && t.kind == TOK_POS) {
            if (pos == NULL) {
                kp_errbuf_set(
                    first_err == 0 ? errbuf : NULL, errlen,
                    "unexpected argument '%s' (%s takes only --key=value flags; see --help)", t.val,
                    prog != NULL ? prog : "this program");
                rc = KP_ECONFIG;
            }
            else if (pos->n >= pos->max) {
                kp_errbuf_set(first_err == 0 ? errbuf : NULL, errlen,
                              "too many arguments at '%s' (at most %d)", t.val, pos->max);
                rc = KP_ECONFIG;
            }
            else {
                pos->args[pos->n++] = (char *) t.val;
            }
        }
        if (rc != 0) {
            if (first_err == 0) {
                first_err = rc;
            }
            continue;
        }
        bi->help |= t.kind == TOK_HELP;
        bi->dry_run |= t.kind == TOK_DRY_RUN;
        bi->print |= t.kind == TOK_PRINT;
        if (t.kind == TOK_CONFIG) {
            bi->config_path = t.val;
        }
    }
    return first_err;
}

/* Pass 2: applies the --key=value flags (pass 1 checked their syntax). Returns 0 or an error. */
static int apply_args(const struct kp_config_def *defs, size_t n, void *cfg, int argc, char **argv,
                      char *errbuf, size_t errlen)
{
    char origin[NAME_MAX_LEN + SHOWN_MAX + 16], tmp[SHOWN_MAX + 4];
    bool flags_done = false;
    struct tok t;
    int rc;

    for (int i = 1; i < argc;) {
        rc = next_tok(defs, n, argc, argv, &i, &flags_done, &t, errbuf, errlen);
        if (rc == 0 && t.kind == TOK_KEY) {
            snprintf(origin, sizeof(origin), "--%s=%s", t.d->name,
                     shown(t.d, t.val, tmp, sizeof(tmp)));
            rc = apply(t.d, cfg, t.val, origin, false, errbuf, errlen);
        }
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

int kp_config_load_args(const struct kp_config_def *defs, size_t n, void *cfg, const char *prog,
                        int argc, char **argv, struct kp_config_pos *pos, char *errbuf,
                        size_t errlen, int *action)
{
    char path[512];
    struct builtins bi;
    int rc;

    *action = KP_CONFIG_RUN;
    if (pos != NULL) {
        pos->n = 0;
    }
    rc = check_table(defs, n, errbuf, errlen);
    if (rc == 0) {
        rc = load_defaults(defs, n, cfg, errbuf, errlen);
    }
    if (rc != 0) {
        goto fail;
    }
    rc = scan_args(defs, n, prog, argc, argv, pos, &bi, errbuf, errlen);
    if (bi.help) {
        if (errbuf != NULL && errlen > 0) {
            errbuf[0] = '\0';
        }
        kp_config_usage(defs, n, prog, stdout);
        fflush(stdout);
        *action = KP_CONFIG_EXIT_OK;
        return 0;
    }
    if (rc != 0) {
        goto fail;
    }
    if (bi.config_path != NULL) {
        rc = load_file(defs, n, cfg, bi.config_path, true, errbuf, errlen);
    }
    else if (prog != NULL) {
        snprintf(path, sizeof(path), "%s/%s.conf", KP_CONFIG_DIR, prog);
        rc = load_file(defs, n, cfg, path, false, errbuf, errlen);
    }
    if (rc == 0) {
        rc = load_env(defs, n, cfg, errbuf, errlen);
    }
    if (rc == 0) {
        rc = apply_args(defs, n, cfg, argc, argv, errbuf, errlen);
    }
    if (rc == 0) {
        rc = check_required(defs, n, cfg, errbuf, errlen);
    }
    if (rc != 0) {
        goto fail;
    }
    if (bi.print) {
        kp_config_print(defs, n, cfg, stdout);
        fflush(stdout);
    }
    if (bi.print || bi.dry_run) {
        *action = KP_CONFIG_EXIT_OK;
    }
    return 0;
fail:
    kp_config_fini(defs, n, cfg);
    if (pos != NULL) {
        pos->n = 0;
    }
    return rc;
}

int kp_config_load(const struct kp_config_def *defs, size_t n, void *cfg, const char *prog,
                   int argc, char **argv, char *errbuf, size_t errlen, int *action)
{
    return kp_config_load_args(defs, n, cfg, prog, argc, argv, NULL, errbuf, errlen, action);
}

/* ---- output ---- */

static const char *value_text(const struct kp_config_def *d, const void *cfg, char *buf, size_t len)
{
    const char *s;
    int e;

    switch (d->type) {
    case KP_CONFIG_BOOL:
        return *(const bool *) cfield(cfg, d) ? "true" : "false";
    case KP_CONFIG_INT:
    case KP_CONFIG_SIZE:
    case KP_CONFIG_DURATION:
        return fmt_number(d, *(const long long *) cfield(cfg, d), buf, len);
    case KP_CONFIG_STRING:
        s = *(char *const *) cfield(cfg, d);
        return s != NULL ? s : "";
    case KP_CONFIG_ENUM:
        e = *(const int *) cfield(cfg, d);
        for (int i = 0; d->enum_values[i] != NULL; i++) {
            if (i == e) {
                return d->enum_values[i];
            }
        }
        return "?";
    }
    return "?";
}

void kp_config_print(const struct kp_config_def *defs, size_t n, const void *cfg, FILE *out)
{
    const char *v;
    char buf[64];
    size_t len;
    bool quote;

    for (size_t i = 0; i < n; i++) {
        v = value_text(&defs[i], cfg, buf, sizeof(buf));
        if (defs[i].secret && v[0] != '\0') {
            v = "***";
        }
        len = strlen(v);
        /* Quote what the file parser would otherwise trim or unquote. */
        quote =
            defs[i].type == KP_CONFIG_STRING && len > 0 &&
            (isspace((unsigned char) v[0]) || isspace((unsigned char) v[len - 1]) || v[0] == '"');
        fprintf(out, quote ? "%s = \"%s\"\n" : "%s = %s\n", defs[i].name, v);
    }
}

void kp_config_usage(const struct kp_config_def *defs, size_t n, const char *prog, FILE *out)
{
    const struct kp_config_def *d;
    char env[NAME_MAX_LEN + 8], bounds[128], vals[512], flag[NAME_MAX_LEN + 600];
    const char *p = prog != NULL ? prog : "kprof";

    fprintf(out, "Usage: %s [--key=value ...]\n\n", p);
    fprintf(out,
            "Each key can also be set in %s/%s.conf (\"key = value\" lines) or in the\n"
            "environment as KPROF_<KEY>. Precedence: default < file < environment < flag.\n\n",
            KP_CONFIG_DIR, p);
    fprintf(out, "  --config=PATH\n      read PATH instead of %s/%s.conf\n", KP_CONFIG_DIR, p);
    fprintf(out, "  --help, -h\n      print this help and exit\n");
    fprintf(out, "  --dry-run\n      check the configuration and exit\n");
    fprintf(out, "  --print-config\n      print the configuration (secrets masked) and exit\n\n");
    for (size_t i = 0; i < n; i++) {
        d = &defs[i];
        env_name(d->name, env, sizeof(env));
        bounds[0] = '\0';
        switch (d->type) {
        case KP_CONFIG_BOOL:
            snprintf(flag, sizeof(flag), "--[no-]%s", d->name);
            break;
        case KP_CONFIG_ENUM:
            fmt_enum_values(d, "|", vals, sizeof(vals));
            snprintf(flag, sizeof(flag), "--%s={%s}", d->name, vals);
            break;
        case KP_CONFIG_STRING:
            snprintf(flag, sizeof(flag), "--%s=STRING", d->name);
            if (d->min > 0 && d->max > 0) {
                snprintf(bounds, sizeof(bounds), ", %lld..%lld bytes", d->min, d->max);
            }
            else if (d->min > 0) {
                snprintf(bounds, sizeof(bounds), ", required");
            }
            else if (d->max > 0) {
                snprintf(bounds, sizeof(bounds), ", at most %lld bytes", d->max);
            }
            break;
        default:
            snprintf(flag, sizeof(flag), "--%s=%s", d->name, type_names[d->type]);
            if (d->min != 0 || d->max != 0) {
                bounds[0] = ',';
                bounds[1] = ' ';
                fmt_bounds(d, bounds + 2, sizeof(bounds) - 2);
            }
            break;
        }
        if (d->secret) {
            fprintf(out, "  %s  (secret%s; env %s)\n", flag, bounds, env);
        }
        else {
            fprintf(out, "  %s  (default \"%s\"%s; env %s)\n", flag, default_of(d), bounds, env);
        }
        fprintf(out, "      %s\n", d->help != NULL ? d->help : "");
    }
}

int kp_config_main(const struct kp_config_def *defs, size_t n, void *cfg, const char *prog,
                   int argc, char **argv)
{
    char err[1024];
    int action;

    if (kp_config_load(defs, n, cfg, prog, argc, argv, err, sizeof(err), &action) != 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
        kp_config_fini(defs, n, cfg);
        return 2;
    }
    if (action == KP_CONFIG_EXIT_OK) {
        kp_config_fini(defs, n, cfg);
        return 0;
    }
    return -1;
}
