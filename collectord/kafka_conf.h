/*
 * What collectord's two Kafka clients share: the producer of --sink kafka (sink_kafka.c) and
 * the consumer of --role sink (consumer.c) take their settings and route librdkafka's log the
 * same way.
 */
#ifndef KP_KAFKA_CONF_H
#define KP_KAFKA_CONF_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

/* Sets one librdkafka property on conf. Returns 0, or KP_ECONFIG with "--kafka-property KEY:
 * why" in errbuf (librdkafka names what it refused). */
int kp_kafka_conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, char *errbuf,
                      size_t errlen);

/* Applies --kafka-property's "KEY=VALUE" pairs, separated by ',' or ';' (list may be NULL or
 * empty), after kprof's own settings, so that the user's win. Returns 0, KP_ECONFIG naming the
 * pair that is not KEY=VALUE or that librdkafka refused, or -ENOMEM. */
int kp_kafka_conf_properties(rd_kafka_conf_t *conf, const char *list, char *errbuf, size_t errlen);

/* KP_KAFKA_CONF_FILE_MAX: the largest properties file */
#define KP_KAFKA_CONF_FILE_MAX (64 * 1024)

/* Applies the properties of --kafka-properties-file path (NULL or "": none): KEY=VALUE a line,
 * blank lines and lines starting with '#' skipped, spaces around KEY and VALUE trimmed. The
 * file holds secrets: kp_secret_file_read refuses it unless only its owner (and group) may
 * read it. Returns 0, KP_ECONFIG naming the file and line (never a value), or what
 * kp_secret_file_read returns. */
int kp_kafka_conf_file(rd_kafka_conf_t *conf, const char *path, char *errbuf, size_t errlen);

/* The parser of kp_kafka_conf_file over text (NUL-terminated, modified in place); what names
 * it in messages. For the fuzz target. */
int kp_kafka_conf_text(rd_kafka_conf_t *conf, char *text, const char *what, char *errbuf,
                       size_t errlen);

/* librdkafka's log callback (rd_kafka_conf_set_log_cb): its lines in kprof's log, syslog
 * levels 0-3 as errors, 4-5 as warnings, the rest debug. */
void kp_kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf);

#endif
