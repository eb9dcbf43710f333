/*
 * kprof-kafka-mock: hosts librdkafka's built-in mock Kafka cluster (rdkafka_mock.h) as a
 * process of its own, so that the tests can point collectord and the sink consumers at a real
 * Kafka-protocol peer with several brokers and inject failures. Test-only: not installed.
 *
 * Kafka is not packaged by Debian; the mock cluster speaks the protocol (produce, fetch,
 * consumer groups, idempotence) on loopback ports of its own choosing. Once it is up the
 * process writes "bootstrap=HOST:PORT,..." to --ready-file and reads commands on stdin, one a
 * line, answering "ok" or "error: ..." on stdout:
 *   down BROKER                      the broker closes its connections and refuses new ones
 *   up BROKER                        it serves again
 *   leader TOPIC PARTITION BROKER    moves the partition's leader
 *   rtt BROKER MS                    adds MS milliseconds to each of the broker's responses
 * It exits 0 on SIGTERM, SIGINT or end of stdin.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "kp_ready.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void) sig;
    stop_flag = 1;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: kprof-kafka-mock [--brokers N] [--partitions P] [--topic T] "
                 "[--ready-file F]\n"
                 "Hosts librdkafka's mock Kafka cluster on 127.0.0.1 (test-only).\n"
                 "  --brokers N       brokers in the cluster (default 3)\n"
                 "  --partitions P    partitions of --topic (default 4)\n"
                 "  --topic T         topic created at start (default kprof.batches; repeatable)\n"
                 "  --ready-file F    written with bootstrap=HOST:PORT,... once the cluster is up\n"
                 "Commands on stdin, answered ok or error: ... on stdout:\n"
                 "  down BROKER | up BROKER | leader TOPIC PARTITION BROKER | rtt BROKER MS\n"
                 "It exits on SIGTERM or end of stdin.\n");
}

/* Parses a decimal integer in [lo, hi]; returns 0 or -1. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return -1;
    }
    *out = v;
    return 0;
}

/* Runs one command line; writes the answer to stdout. */
static void run_command(rd_kafka_mock_cluster_t *mc, int brokers, char *line)
{
    char *argv[5] = { 0 };
    int argc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(line, " \t\r\n", &save); tok != NULL && argc < 5;
         tok = strtok_r(NULL, " \t\r\n", &save)) {
        argv[argc++] = tok;
    }
    if (argc == 0) {
        return;
    }
    long b = 0, p = 0, ms = 0;
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    if ((strcmp(argv[0], "down") == 0 || strcmp(argv[0], "up") == 0) && argc == 2) {
        if (parse_int(argv[1], 1, brokers, &b) != 0) {
            printf("error: broker must be 1..%d\n", brokers);
            return;
        }
        err = argv[0][0] == 'd' ? rd_kafka_mock_broker_set_down(mc, (int32_t) b)
                                : rd_kafka_mock_broker_set_up(mc, (int32_t) b);
    }
    else if (strcmp(argv[0], "leader") == 0 && argc == 4) {
        if (parse_int(argv[2], 0, INT32_MAX, &p) != 0 || parse_int(argv[3], 1, brokers, &b) != 0) {
            printf("error: usage: leader TOPIC PARTITION BROKER (broker 1..%d)\n", brokers);
            return;
        }
        err = rd_kafka_mock_partition_set_leader(mc, argv[1], (int32_t) p, (int32_t) b);
    }
    else if (strcmp(argv[0], "rtt") == 0 && argc == 3) {
        if (parse_int(argv[1], 1, brokers, &b) != 0 || parse_int(argv[2], 0, 600000, &ms) != 0) {
            printf("error: usage: rtt BROKER MS (broker 1..%d, MS 0..600000)\n", brokers);
            return;
        }
        err = rd_kafka_mock_broker_set_rtt(mc, (int32_t) b, (int) ms);
    }
    else {
        printf("error: unknown command (down BROKER, up BROKER, leader TOPIC PARTITION BROKER, "
               "rtt BROKER MS)\n");
        return;
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        printf("error: %s\n", rd_kafka_err2str(err));
    }
    else {
        printf("ok\n");
    }
}

int main(int argc, char **argv)
{
    long brokers = 3, partitions = 4;
    const char *ready_file = NULL;
    const char *topics[16];
    int ntopics = 0;
    static const struct option opts[] = {
        { "brokers", required_argument, NULL, 'b' }, { "partitions", required_argument, NULL, 'p' },
        { "topic", required_argument, NULL, 't' },   { "ready-file", required_argument, NULL, 'r' },
        { "help", no_argument, NULL, 'h' },          { NULL, 0, NULL, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (parse_int(optarg, 1, 64, &brokers) != 0) {
                fprintf(stderr, "kprof-kafka-mock: --brokers must be 1..64, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'p':
            if (parse_int(optarg, 1, 1024, &partitions) != 0) {
                fprintf(stderr, "kprof-kafka-mock: --partitions must be 1..1024, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 't':
            if (ntopics == 16 || optarg[0] == '\0') {
                fprintf(stderr, "kprof-kafka-mock: --topic: at most 16 non-empty topics\n");
                return 2;
            }
            topics[ntopics++] = optarg;
            break;
        case 'r':
            ready_file = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "kprof-kafka-mock: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (ntopics == 0) {
        topics[ntopics++] = "kprof.batches";
    }

    /* The mock cluster lives inside a client handle; a producer that produces nothing. */
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "kprof-kafka-mock: %s\n", errstr);
        return 1;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (rk == NULL) {
        fprintf(stderr, "kprof-kafka-mock: cannot create the host client: %s\n", errstr);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, (int) brokers);
    if (mc == NULL) {
        fprintf(stderr, "kprof-kafka-mock: cannot start the mock cluster\n");
        rd_kafka_destroy(rk);
        return 1;
    }
    for (int i = 0; i < ntopics; i++) {
        /* Replication factor = every broker, so that a broker down keeps a replica. */
        rd_kafka_resp_err_t err =
            rd_kafka_mock_topic_create(mc, topics[i], (int) partitions, (int) brokers);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "kprof-kafka-mock: cannot create topic %s: %s\n", topics[i],
                    rd_kafka_err2str(err));
            rd_kafka_mock_cluster_destroy(mc);
            rd_kafka_destroy(rk);
            return 1;
        }
    }

    struct sigaction sa = { .sa_handler = on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 0;
    const char *bootstraps = rd_kafka_mock_cluster_bootstraps(mc);
    struct kp_ready_entry entry = { "bootstrap", bootstraps };
    if (kp_ready_file_write(ready_file, &entry, 1, errstr, sizeof errstr) != 0) {
        fprintf(stderr, "kprof-kafka-mock: %s\n", errstr);
        rc = 1;
        stop_flag = 1;
    }
    fprintf(stderr, "kprof-kafka-mock: %ld brokers at %s\n", brokers, bootstraps);

    setvbuf(stdout, NULL, _IOLBF, 0);
    char line[1024];
    size_t len = 0;
    while (!stop_flag) {
        struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
        int n = poll(&pfd, 1, 200);
        if (n < 0 && errno != EINTR) {
            break;
        }
        if (n <= 0) {
            continue;
        }
        ssize_t got = read(STDIN_FILENO, line + len, sizeof line - 1 - len);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            break; /* end of stdin */
        }
        len += (size_t) got;
        char *nl;
        while ((nl = memchr(line, '\n', len)) != NULL) {
            *nl = '\0';
            size_t used = (size_t) (nl - line) + 1;
            run_command(mc, (int) brokers, line);
            memmove(line, line + used, len - used);
            len -= used;
        }
        if (len == sizeof line - 1) {
            printf("error: command line too long\n");
            len = 0;
        }
    }
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return rc;
}
