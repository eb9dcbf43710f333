/* Unit tests of agent/spool.c: append/read/ack, rollover and deletion, restart replay, torn
 * tails, the size limit. Each test works in its own directory under KPROF_TEST_DIR or /tmp. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "spool.h"

static void fresh_dir(const char *name, char *buf, size_t len)
{
    const char *base = getenv("KPROF_TEST_DIR");
    char cmd[1200];

    snprintf(buf, len, "%s/spool-%s-%d", base && *base ? base : "/tmp", name, (int) getpid());
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", buf);
    assert_int_equal(system(cmd), 0);
}

static int count_segments(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        n += strncmp(e->d_name, "seg-", 4) == 0;
    }
    closedir(d);
    return n;
}

/* Payload i: 100 + i%50 bytes of a pattern, so lengths and contents differ. */
static size_t payload(int i, uint8_t *buf)
{
    size_t n = 100 + (size_t) (i % 50);

    for (size_t k = 0; k < n; k++) {
        buf[k] = (uint8_t) (i * 31 + (int) k);
    }
    return n;
}

static void expect_record(struct kp_spool *sp, uint64_t want_seq, int i)
{
    uint8_t exp[256], *buf = NULL;
    size_t len = 0, n = payload(i, exp);
    uint64_t seq = 0;

    assert_int_equal(kp_spool_read(sp, &seq, &buf, &len), 1);
    assert_int_equal(seq, want_seq);
    assert_int_equal(len, n);
    assert_memory_equal(buf, exp, n);
    free(buf);
}

static void append_n(struct kp_spool *sp, int from, int n, uint64_t first_seq)
{
    uint8_t buf[256];

    for (int i = from; i < from + n; i++) {
        uint64_t seq = 0;

        assert_int_equal(kp_spool_append(sp, buf, payload(i, buf), &seq), 0);
        assert_int_equal(seq, first_seq + (uint64_t) (i - from));
    }
}

static void test_append_read_ack(void **state)
{
    char dir[1024], err[256];
    struct kp_spool *sp;
    struct kp_spool_stats st;
    uint64_t seq;
    uint8_t *buf;
    size_t len;

    (void) state;
    fresh_dir("basic", dir, sizeof(dir));
    assert_int_equal(kp_spool_open(dir, 0, 0, &sp, err, sizeof(err)), 0);
    assert_true(kp_spool_stream_id(sp) > 0);
    assert_int_equal(kp_spool_read(sp, &seq, &buf, &len), 0);
    assert_int_equal(kp_spool_first_unacked(sp), 1);
    append_n(sp, 0, 10, 1);
    for (int i = 0; i < 10; i++) {
        expect_record(sp, (uint64_t) i + 1, i);
    }
    assert_int_equal(kp_spool_read(sp, &seq, &buf, &len), 0);
    /* rewind replays from the first unacknowledged */
    assert_int_equal(kp_spool_ack_through(sp, 4), 0);
    assert_int_equal(kp_spool_first_unacked(sp), 5);
    kp_spool_rewind(sp);
    expect_record(sp, 5, 4);
    /* acking again below the cursor is a no-op */
    assert_int_equal(kp_spool_ack_through(sp, 2), 0);
    kp_spool_get_stats(sp, &st);
    assert_int_equal(st.acked, 4);
    assert_int_equal(st.next_seq, 11);
    assert_int_equal(st.appended, 10);
    kp_spool_close(sp);
}

static void test_rollover_and_delete(void **state)
{
    char dir[1024], err[256];
    struct kp_spool *sp;
    struct kp_spool_stats st;

    (void) state;
    fresh_dir("roll", dir, sizeof(dir));
    /* 1000-byte segments hold about 6 records of ~150 bytes */
    assert_int_equal(kp_spool_open(dir, 1 << 20, 1000, &sp, err, sizeof(err)), 0);
    append_n(sp, 0, 60, 1);
    kp_spool_get_stats(sp, &st);
    assert_true(st.segments >= 8);
    assert_int_equal(count_segments(dir), (int) st.segments);
    for (int i = 0; i < 60; i++) {
        expect_record(sp, (uint64_t) i + 1, i);
    }
    /* acknowledging half deletes the segments wholly below the cursor, no more */
    assert_int_equal(kp_spool_ack_through(sp, 30), 0);
    kp_spool_get_stats(sp, &st);
    assert_true(st.segments_gone > 0);
    assert_int_equal(count_segments(dir), (int) st.segments);
    kp_spool_rewind(sp);
    expect_record(sp, 31, 30);
    assert_int_equal(kp_spool_ack_through(sp, 60), 0);
    assert_int_equal(count_segments(dir), 0);
    /* appends go on with the next seq in a new segment */
    append_n(sp, 60, 1, 61);
    expect_record(sp, 61, 60);
    kp_spool_close(sp);
}

static void test_restart_replay(void **state)
{
    char dir[1024], err[256];
    struct kp_spool *sp;
    struct kp_spool_stats st;
    uint64_t sid;

    (void) state;
    fresh_dir("replay", dir, sizeof(dir));
    assert_int_equal(kp_spool_open(dir, 1 << 20, 2000, &sp, err, sizeof(err)), 0);
    sid = kp_spool_stream_id(sp);
    append_n(sp, 0, 40, 1);
    assert_int_equal(kp_spool_ack_through(sp, 25), 0);
    kp_spool_close(sp);

    assert_int_equal(kp_spool_open(dir, 1 << 20, 2000, &sp, err, sizeof(err)), 0);
    assert_int_equal(kp_spool_stream_id(sp), sid);
    kp_spool_get_stats(sp, &st);
    assert_int_equal(st.replayed, 15);
    assert_int_equal(kp_spool_first_unacked(sp), 26);
    for (int i = 25; i < 40; i++) {
        expect_record(sp, (uint64_t) i + 1, i);
    }
    append_n(sp, 40, 2, 41);
    assert_int_equal(kp_spool_ack_through(sp, 42), 0);
    kp_spool_close(sp);

    /* everything acknowledged and deleted: the seq still goes on */
    assert_int_equal(kp_spool_open(dir, 1 << 20, 2000, &sp, err, sizeof(err)), 0);
    assert_int_equal(count_segments(dir), 0);
    append_n(sp, 42, 1, 43);
    kp_spool_close(sp);
}

static void test_torn_tail(void **state)
{
    char dir[1024], err[256], path[1200];
    struct kp_spool *sp;
    struct kp_spool_stats st;
    struct stat sb;
    uint64_t seq;
    uint8_t *buf;
    size_t len;
    int fd;

    (void) state;
    fresh_dir("torn", dir, sizeof(dir));
    assert_int_equal(kp_spool_open(dir, 0, 0, &sp, err, sizeof(err)), 0);
    append_n(sp, 0, 5, 1);
    kp_spool_close(sp);
    snprintf(path, sizeof(path), "%s/seg-%020d.kps", dir, 1);
    assert_int_equal(stat(path, &sb), 0);
    /* a crash mid-write: half a record at the end, then flip a byte of record 5 */
    fd = open(path, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    {
        struct kp_spool_rec_hdr h = { KP_SPOOL_MAGIC, 500, 0, 0, 6 };
        assert_int_equal(write(fd, &h, sizeof(h)), (int) sizeof(h));
        assert_int_equal(write(fd, "partial", 7), 7);
    }
    close(fd);
    fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "X", 1, sb.st_size - 3), 1);
    close(fd);

    assert_int_equal(kp_spool_open(dir, 0, 0, &sp, err, sizeof(err)), 0);
    kp_spool_get_stats(sp, &st);
    assert_true(st.torn_bytes > sizeof(struct kp_spool_rec_hdr) + 7);
    assert_int_equal(st.next_seq, 5); /* record 5 failed its CRC: cut with the tail */
    for (int i = 0; i < 4; i++) {
        expect_record(sp, (uint64_t) i + 1, i);
    }
    assert_int_equal(kp_spool_read(sp, &seq, &buf, &len), 0);
    append_n(sp, 4, 1, 5);
    expect_record(sp, 5, 4);
    kp_spool_close(sp);
}

static void test_full_drops(void **state)
{
    char dir[1024], err[256];
    struct kp_spool *sp;
    struct kp_spool_stats st;
    uint8_t buf[256];
    uint64_t seq;
    int ok = 0, full = 0;

    (void) state;
    fresh_dir("full", dir, sizeof(dir));
    assert_int_equal(kp_spool_open(dir, 1000, 400, &sp, err, sizeof(err)), 0);
    for (int i = 0; i < 20; i++) {
        int rc = kp_spool_append(sp, buf, payload(0, buf), &seq);

        if (rc == 0) {
            ok++;
        }
        else {
            assert_int_equal(rc, -ENOSPC);
            full++;
        }
    }
    /* data appends stop short of the tail reserve (1/16 of max_bytes) */
    assert_int_equal(ok, (1000 - 1000 / 16) / (100 + (int) sizeof(struct kp_spool_rec_hdr)));
    kp_spool_get_stats(sp, &st);
    assert_int_equal(st.dropped_full, (uint64_t) full);
    assert_true(st.bytes <= 1000 - 1000 / 16);
    /* a closing record still gets in from the reserve, until that is used up too; never past
     * max_bytes, and never a large one */
    assert_int_equal(kp_spool_append_tail(sp, buf, KP_SPOOL_TAIL_MAX + 1, &seq), -EMSGSIZE);
    assert_int_equal(kp_spool_append_tail(sp, buf, 10, &seq), 0);
    assert_int_equal(seq, (uint64_t) ok + 1);
    ok++;
    full = 0;
    while (kp_spool_append_tail(sp, buf, 10, &seq) == 0) {
        ok++;
        assert_true(++full < 100);
    }
    kp_spool_get_stats(sp, &st);
    assert_true(st.bytes <= 1000 && st.bytes + 10 + sizeof(struct kp_spool_rec_hdr) > 1000);
    /* acknowledging frees room */
    assert_int_equal(kp_spool_ack_through(sp, (uint64_t) ok), 0);
    assert_int_equal(kp_spool_append(sp, buf, payload(0, buf), &seq), 0);
    assert_int_equal(seq, (uint64_t) ok + 1);
    kp_spool_close(sp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_read_ack), cmocka_unit_test(test_rollover_and_delete),
        cmocka_unit_test(test_restart_replay),  cmocka_unit_test(test_torn_tail),
        cmocka_unit_test(test_full_drops),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
