/*
 * kprof-kafka-cat: the tests' librdkafka client for the Kafka path (test-only: not installed).
 *   kprof-kafka-cat --brokers LIST --topic T produce KEY VALUE
 *       produces one record (acks=all, idempotent) and exits 0 once Kafka acknowledged it.
 *   kprof-kafka-cat --brokers LIST --topic T consume
 *       reads every partition from its beginning up to its high watermark at start and prints
 *       one line per record: "PARTITION OFFSET KEY HEXVALUE" (KEY "-" when absent).
 * --timeout-ms bounds either (default 30000); exit 1 on failure or timeout, 2 on bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

static int delivered = 0; /* 1 ok, -1 failed */

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void) rk;
    (void) opaque;
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kprof-kafka-cat: delivery failed: %s\n", rd_kafka_err2str(m->err));
        delivered = -1;
    }
    else {
        delivered = 1;
    }
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static rd_kafka_t *make_client(rd_kafka_type_t type, const char *brokers, int timeout_ms)
{
    char errstr[512];
    char tmo[32];
    snprintf(tmo, sizeof tmo, "%d", timeout_ms);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *kv[][2] = {
        { "bootstrap.servers", brokers },
        { "log_level", "3" },
        { type == RD_KAFKA_PRODUCER ? "enable.idempotence" : "enable.auto.commit",
          type == RD_KAFKA_PRODUCER ? "true" : "false" },
        { type == RD_KAFKA_PRODUCER ? "message.timeout.ms" : "group.id",
          type == RD_KAFKA_PRODUCER ? tmo : "kprof-kafka-cat" },
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        if (rd_kafka_conf_set(conf, kv[i][0], kv[i][1], errstr, sizeof errstr) !=
            RD_KAFKA_CONF_OK) {
            fprintf(stderr, "kprof-kafka-cat: %s\n", errstr);
            rd_kafka_conf_destroy(conf);
            return NULL;
        }
    }
    if (type == RD_KAFKA_PRODUCER) {
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    }
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof errstr);
    if (rk == NULL) {
        fprintf(stderr, "kprof-kafka-cat: %s\n", errstr);
    }
    return rk;
}

static int do_produce(const char *brokers, const char *topic, const char *key, const char *value,
                      int timeout_ms)
{
    rd_kafka_t *rk = make_client(RD_KAFKA_PRODUCER, brokers, timeout_ms);
    if (rk == NULL) {
        return 1;
    }
    rd_kafka_resp_err_t err =
        rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
                          RD_KAFKA_V_VALUE((void *) value, strlen(value)),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kprof-kafka-cat: produce: %s\n", rd_kafka_err2str(err));
        rd_kafka_destroy(rk);
        return 1;
    }
    int64_t deadline = now_ms() + timeout_ms + 1000;
    while (delivered == 0 && now_ms() < deadline) {
        rd_kafka_poll(rk, 100);
    }
    rd_kafka_destroy(rk);
    return delivered == 1 ? 0 : 1;
}

static int do_consume(const char *brokers, const char *topic, int timeout_ms)
{
    rd_kafka_t *rk = make_client(RD_KAFKA_CONSUMER, brokers, timeout_ms);
    if (rk == NULL) {
        return 1;
    }
    int rc = 1;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms);
    rd_kafka_topic_destroy(rkt);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt != 1 || md->topics[0].err) {
        fprintf(stderr, "kprof-kafka-cat: no metadata for topic %s: %s\n", topic,
                rd_kafka_err2str(err ? err : md->topics[0].err));
        goto out;
    }
    int np = md->topics[0].partition_cnt;
    int64_t *high = calloc((size_t) np, sizeof *high);
    int64_t *next = calloc((size_t) np, sizeof *next);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(np);
    int left = 0;
    for (int p = 0; p < np; p++) {
        int64_t lo = 0;
        err = rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &high[p], timeout_ms);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "kprof-kafka-cat: watermarks of partition %d: %s\n", p,
                    rd_kafka_err2str(err));
            goto free_out;
        }
        next[p] = lo;
        if (lo < high[p]) {
            left++;
        }
        rd_kafka_topic_partition_list_add(parts, topic, p)->offset = lo;
    }
    rd_kafka_assign(rk, parts);
    int64_t deadline = now_ms() + timeout_ms;
    while (left > 0 && now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (m == NULL) {
            continue;
        }
        if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR && m->partition >= 0 && m->partition < np &&
            m->offset < high[m->partition]) {
            printf("%" PRId32 " %" PRId64 " ", m->partition, m->offset);
            if (m->key == NULL) {
                printf("-");
            }
            else {
                fwrite(m->key, 1, m->key_len, stdout);
            }
            printf(" ");
            for (size_t i = 0; i < m->len; i++) {
                printf("%02x", ((const unsigned char *) m->payload)[i]);
            }
            printf("\n");
            if (m->offset + 1 >= high[m->partition]) {
                left--;
            }
        }
        else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF &&
                 m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "kprof-kafka-cat: consume: %s\n", rd_kafka_message_errstr(m));
        }
        rd_kafka_message_destroy(m);
    }
    if (left > 0) {
        fprintf(stderr, "kprof-kafka-cat: timed out with %d partitions not read to the end\n",
                left);
    }
    else {
        rc = 0;
    }
free_out:
    rd_kafka_topic_partition_list_destroy(parts);
    free(high);
    free(next);
out:
    if (md != NULL) {
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    fflush(stdout);
    return rc;
}

int main(int argc, char **argv)
{
    const char *brokers = NULL, *topic = "kprof.batches";
    long timeout_ms = 30000;
    static const struct option opts[] = {
        { "brokers", required_argument, NULL, 'b' },
        { "topic", required_argument, NULL, 't' },
        { "timeout-ms", required_argument, NULL, 'T' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'b') {
            brokers = optarg;
        }
        else if (c == 't') {
            topic = optarg;
        }
        else if (c == 'T') {
            char *end = NULL;
            timeout_ms = strtol(optarg, &end, 10);
            if (*end != '\0' || timeout_ms < 1 || timeout_ms > 3600000) {
                fprintf(stderr, "kprof-kafka-cat: --timeout-ms must be 1..3600000\n");
                return 2;
            }
        }
        else {
            return 2;
        }
    }
    const char *usage = "usage: kprof-kafka-cat --brokers LIST [--topic T] [--timeout-ms N] "
                        "(produce KEY VALUE | consume)\n";
    if (brokers == NULL || optind >= argc) {
        fputs(usage, stderr);
        return 2;
    }
    if (strcmp(argv[optind], "produce") == 0 && argc - optind == 3) {
        return do_produce(brokers, topic, argv[optind + 1], argv[optind + 2], (int) timeout_ms);
    }
    if (strcmp(argv[optind], "consume") == 0 && argc - optind == 1) {
        return do_consume(brokers, topic, (int) timeout_ms);
    }
    fputs(usage, stderr);
    return 2;
}
