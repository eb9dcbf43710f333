#include "kafka_conf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_err.h"
#include "kp_log.h"

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
