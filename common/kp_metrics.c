#include "kp_metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kp_strbuf.h"

struct kp_metrics {
    pthread_mutex_t lock; /* guards n and the slots' non-atomic fields */
    size_t n;             /* slots in use */
    size_t capacity;
    struct kp_metric *slots; /* capacity entries, allocated once */
};

int kp_metrics_create(size_t capacity, struct kp_metrics **out)
{
    struct kp_metrics *r = NULL;
    int rc;

    if (capacity == 0 || capacity > SIZE_MAX / sizeof(struct kp_metric)) {
        rc = -EINVAL;
        goto fail;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    r->slots = calloc(capacity, sizeof(*r->slots));
    if (r->slots == NULL) {
        rc = -ENOMEM;
        goto fail;
    }
    rc = -pthread_mutex_init(&r->lock, NULL);
    if (rc != 0) {
        goto fail;
    }
    r->capacity = capacity;
    *out = r;
    return 0;
fail:
    if (r != NULL) {
        free(r->slots);
        free(r);
    }
    return rc;
}

void kp_metrics_destroy(struct kp_metrics *r)
{
    if (r == NULL) {
        return;
    }
    pthread_mutex_destroy(&r->lock);
    free(r->slots);
    free(r);
}

static bool valid_name(const char *s, bool colon_ok)
{
    if (s == NULL || *s == '\0' || strlen(s) > KP_METRIC_NAME_MAX) {
        return false;
    }
    for (size_t i = 0; s[i] != '\0'; i++) {
        char c = s[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';

        if (alpha || (colon_ok && c == ':') || (i > 0 && c >= '0' && c <= '9')) {
            continue;
        }
        return false;
    }
    return true;
}

int kp_metrics_register(struct kp_metrics *r, const char *name, const char *help,
                        enum kp_metric_type type, const char *label_key, const char *label_value,
                        struct kp_metric **out)
{
    struct kp_metric *m;
    int rc;

    if (!valid_name(name, true) || help == NULL || strlen(help) > KP_METRIC_HELP_MAX ||
        (type != KP_METRIC_COUNTER && type != KP_METRIC_GAUGE) ||
        ((label_key == NULL) != (label_value == NULL))) {
        return -EINVAL;
    }
    if (label_key != NULL && (!valid_name(label_key, false) || strncmp(label_key, "__", 2) == 0 ||
                              strlen(label_value) > KP_METRIC_LABEL_MAX)) {
        return -EINVAL;
    }
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n; i++) {
        m = &r->slots[i];
        if (strcmp(m->name, name) != 0) {
            continue;
        }
        if (m->type != type || strcmp(m->help, help) != 0) {
            rc = -EINVAL;
            goto out;
        }
        if (strcmp(m->label_key, label_key != NULL ? label_key : "") == 0 &&
            strcmp(m->label_value, label_value != NULL ? label_value : "") == 0) {
            rc = -EEXIST;
            goto out;
        }
    }
    if (r->n == r->capacity) {
        rc = -ENOSPC;
        goto out;
    }
    m = &r->slots[r->n];
    atomic_init(&m->value, 0);
    m->type = type;
    strcpy(m->name, name);
    strcpy(m->help, help);
    strcpy(m->label_key, label_key != NULL ? label_key : "");
    strcpy(m->label_value, label_value != NULL ? label_value : "");
    r->n++;
    *out = m;
    rc = 0;
out:
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* Appends s with the exposition format's escapes: backslash and newline always, the double
 * quote only inside label values. */
static int append_escaped(struct kp_strbuf *out, const char *s, bool quote)
{
    int rc = 0;

    for (; *s != '\0' && rc == 0; s++) {
        if (*s == '\\') {
            rc = kp_strbuf_append(out, "\\\\", 2);
        }
        else if (*s == '\n') {
            rc = kp_strbuf_append(out, "\\n", 2);
        }
        else if (quote && *s == '"') {
            rc = kp_strbuf_append(out, "\\\"", 2);
        }
        else {
            rc = kp_strbuf_putc(out, *s);
        }
    }
    return rc;
}

static int render_sample(struct kp_strbuf *out, const struct kp_metric *m)
{
    int rc;

    rc = kp_strbuf_append_str(out, m->name);
    if (rc == 0 && m->label_key[0] != '\0') {
        rc = kp_strbuf_appendf(out, "{%s=\"", m->label_key);
        if (rc == 0) {
            rc = append_escaped(out, m->label_value, true);
        }
        if (rc == 0) {
            rc = kp_strbuf_append(out, "\"}", 2);
        }
    }
    if (rc == 0) {
        rc = kp_strbuf_appendf(out, " %" PRId64 "\n", kp_metric_get(m));
    }
    return rc;
}

int kp_metrics_render(struct kp_metrics *r, struct kp_strbuf *out)
{
    const struct kp_metric *m;
    bool seen;
    int rc = 0;

    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n && rc == 0; i++) {
        m = &r->slots[i];
        seen = false;
        for (size_t j = 0; j < i && !seen; j++) {
            seen = strcmp(r->slots[j].name, m->name) == 0;
        }
        if (seen) {
            continue; /* rendered with its family's first member */
        }
        rc = kp_strbuf_appendf(out, "# HELP %s ", m->name);
        if (rc == 0) {
            rc = append_escaped(out, m->help, false);
        }
        if (rc == 0) {
            rc = kp_strbuf_appendf(out, "\n# TYPE %s %s\n", m->name,
                                   m->type == KP_METRIC_COUNTER ? "counter" : "gauge");
        }
        for (size_t k = i; k < r->n && rc == 0; k++) {
            if (strcmp(r->slots[k].name, m->name) == 0) {
                rc = render_sample(out, &r->slots[k]);
            }
        }
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}
