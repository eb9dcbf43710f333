#include "kafka_conf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_log.h"
#include "kp_secret.h"

int kp_kafka_conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, char *errbuf,
                      size_t errlen)
{
    char why[256];

    if (rd_kafka_conf_set(conf, key, value, why, sizeof(why)) != RD_KAFKA_CONF_OK) {
        snprintf(errbuf, errlen, "--kafka-property %s: %s", key, why);
        return KP_ECONFIG;
    }
    return 0;
}

int kp_kafka_conf_properties(rd_kafka_conf_t *conf, const char *list, char *errbuf, size_t errlen)
{
    char *copy, *save = NULL;
    int rc = 0;

    if (list == NULL || list[0] == '\0') {
        return 0;
    }
    if ((copy = strdup(list)) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    for (char *kv = strtok_r(copy, ",;", &save); kv != NULL && rc == 0;
         kv = strtok_r(NULL, ",;", &save)) {
        char *eq;

        while (*kv == ' ') {
            kv++;
        }
        if (*kv == '\0') {
            continue;
        }
        if ((eq = strchr(kv, '=')) == NULL || eq == kv) {
            snprintf(errbuf, errlen, "--kafka-property: '%.64s' is not KEY=VALUE", kv);
            rc = KP_ECONFIG;
            break;
        }
        *eq = '\0';
        rc = kp_kafka_conf_set(conf, kv, eq + 1, errbuf, errlen);
    }
    free(copy);
    return rc;
}

static char *trim(char *s)
{
    char *e;

    while (*s == ' ' || *s == '\t') {
        s++;
    }
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) {
        *--e = '\0';
    }
    return s;
}

int kp_kafka_conf_text(rd_kafka_conf_t *conf, char *text, const char *what, char *errbuf,
                       size_t errlen)
{
    int line = 0;

    /* strtok_r would skip empty lines and lose the count: split by hand */
    for (char *l = text, *next; l != NULL; l = next) {
        char *kv, *eq, why[256];

        next = strchr(l, '\n');
        if (next != NULL) {
            *next++ = '\0';
        }
        line++;
        kv = trim(l);
        if (*kv == '\0' || *kv == '#') {
            continue;
        }
        if ((eq = strchr(kv, '=')) == NULL || eq == kv) {
            snprintf(errbuf, errlen, "%s line %d: not KEY=VALUE", what, line);
            return KP_ECONFIG;
        }
        *eq = '\0';
        if (rd_kafka_conf_set(conf, trim(kv), trim(eq + 1), why, sizeof(why)) != RD_KAFKA_CONF_OK) {
            /* librdkafka names the property (and an invalid value only of an enumerated
             * one, which is no secret) */
            snprintf(errbuf, errlen, "%s line %d: %s", what, line, why);
            return KP_ECONFIG;
        }
    }
    return 0;
}

int kp_kafka_conf_file(rd_kafka_conf_t *conf, const char *path, char *errbuf, size_t errlen)
{
    char *buf;
    long n;
    int rc;

    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    if ((buf = malloc(KP_KAFKA_CONF_FILE_MAX + 1)) == NULL) {
        snprintf(errbuf, errlen, "out of memory");
        return -ENOMEM;
    }
    if ((n = kp_secret_file_read(path, "the Kafka properties file", true, buf,
                                 KP_KAFKA_CONF_FILE_MAX + 1, errbuf, errlen)) < 0) {
        free(buf);
        return (int) n;
    }
    rc = kp_kafka_conf_text(conf, buf, path, errbuf, errlen);
    explicit_bzero(buf, KP_KAFKA_CONF_FILE_MAX + 1);
    free(buf);
    return rc;
}

void kp_kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void) rk;
    if (level <= 3) {
        kp_log_error("kafka %s: %s", fac, buf);
    }
    else if (level <= 5) {
        kp_log_warn("kafka %s: %s", fac, buf);
    }
    else {
        kp_log_debug("kafka %s: %s", fac, buf);
    }
}
