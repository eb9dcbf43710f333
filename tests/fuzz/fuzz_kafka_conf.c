/*
 * fuzz_kafka_conf: the text of a --kafka-properties-file (kafka_conf.h), which collectord
 * parses into librdkafka settings. Any input must be applied or refused cleanly, without a
 * crash, a leak or a sanitizer report; a refusal must say why.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kafka_conf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant);

size_t kp_fuzz_seed(uint8_t *buf, size_t cap, int variant)
{
    static const char *const seeds[] = {
        "# SASL over TLS\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username = kprof\nsasl.password = s3cret\n\n",
        "message.timeout.ms=600000\r\n  linger.ms = 5 \nssl.endpoint.identification.algorithm=\n",
        "acks=maybe\nno equals sign here\n=value\n",
    };
    size_t n = strlen(seeds[variant % 3]);

    n = n < cap ? n : cap;
    memcpy(buf, seeds[variant % 3], n);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd_kafka_conf_t *conf;
    char *text, err[512] = "";

    if (size > KP_KAFKA_CONF_FILE_MAX || (text = malloc(size + 1)) == NULL) {
        return 0;
    }
    memcpy(text, data, size);
    text[size] = '\0';
    conf = rd_kafka_conf_new();
    if (kp_kafka_conf_text(conf, text, "fuzz", err, sizeof(err)) != 0 && err[0] == '\0') {
        abort(); /* a refusal must say why */
    }
    rd_kafka_conf_destroy(conf);
    free(text);
    return 0;
}
