/* Unit tests for common/kp_workq: the bound (busy when full, queue_max 0), order, stop while
 * busy (running items finish, queued ones are cancelled), worker state (init, fini, a failed
 * init failing create) and the tick. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kp_workq.h"

/* A test's shared record of what the callbacks saw. Items are ints (their order number). */
struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool gate_open; /* run blocks until set */
    int running;    /* items inside run now */
    int ran[64];    /* items run, in order */
    int n_ran;
    int cancelled[64];
    int n_cancelled;
    int inits, finis, ticks;
    size_t fail_index; /* init of this worker fails (SIZE_MAX: none) */
    int state_of[8];   /* the state (its int) each run saw, by item */
};

static void rec_init(struct rec *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cond, NULL);
    r->gate_open = true;
    r->fail_index = SIZE_MAX;
}

static void rec_fini(struct rec *r)
{
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mu);
}

static void open_gate(struct rec *r)
{
    pthread_mutex_lock(&r->mu);
    r->gate_open = true;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

/* Waits until n items are inside run. */
static void wait_running(struct rec *r, int n)
{
    pthread_mutex_lock(&r->mu);
    while (r->running < n) {
        pthread_cond_wait(&r->cond, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Waits until n items have run. */
static void wait_ran(struct rec *r, int n)
{
    pthread_mutex_lock(&r->mu);
    while (r->n_ran < n) {
        pthread_mutex_unlock(&r->mu);
        usleep(1000);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
}

static int *item(int v)
{
    int *p = malloc(sizeof(*p));

    assert_non_null(p);
    *p = v;
    return p;
}

static int init_cb(void *ud, size_t index, void **state, char *err, size_t len)
{
    struct rec *r = ud;

    pthread_mutex_lock(&r->mu);
    r->inits++;
    pthread_mutex_unlock(&r->mu);
    *state = item((int) index + 100); /* what a connection would be */
    if (index == r->fail_index) {
        snprintf(err, len, "worker %zu cannot connect", index);
        return -ECONNREFUSED;
    }
    return 0;
}

static void fini_cb(void *ud, void *state)
{
    struct rec *r = ud;

    pthread_mutex_lock(&r->mu);
    r->finis++;
    pthread_mutex_unlock(&r->mu);
    free(state);
}

static void run_cb(void *ud, void *state, void *it)
{
    struct rec *r = ud;
    int v = *(int *) it;

    pthread_mutex_lock(&r->mu);
    r->running++;
    pthread_cond_broadcast(&r->cond);
    while (!r->gate_open) {
        pthread_cond_wait(&r->cond, &r->mu);
    }
    r->running--;
    if (v >= 0 && v < 8) {
        r->state_of[v] = state != NULL ? *(int *) state : -1;
    }
    r->ran[r->n_ran++] = v;
    pthread_mutex_unlock(&r->mu);
    free(it);
}

static void cancel_cb(void *ud, void *it)
{
    struct rec *r = ud;

    pthread_mutex_lock(&r->mu);
    r->cancelled[r->n_cancelled++] = *(int *) it;
    pthread_mutex_unlock(&r->mu);
    free(it);
}

static void tick_cb(void *ud, void *state)
{
    struct rec *r = ud;

    pthread_mutex_lock(&r->mu);
    r->ticks++;
    pthread_mutex_unlock(&r->mu);
}

static const struct kp_workq_ops ops = { .init = init_cb,
                                         .fini = fini_cb,
                                         .run = run_cb,
                                         .cancel = cancel_cb };

/* One worker, queue_max 2: one runs, two wait, the fourth is refused busy (and stays the
 * caller's); once the gate opens the three run in order, each with the worker's state. */
static void test_full_queue_busy(void **unused)
{
    struct kp_workq_opts o = { .workers = 1, .queue_max = 2 };
    struct kp_workq *q = NULL;
    struct rec r;
    char err[256] = "";
    int *extra = item(3);

    (void) unused;
    rec_init(&r);
    r.gate_open = false;
    assert_int_equal(kp_workq_create(&o, &ops, &r, &q, err, sizeof(err)), 0);
    assert_int_equal(r.inits, 1);
    assert_int_equal(kp_workq_submit(q, item(0)), 0);
    wait_running(&r, 1);
    assert_int_equal(kp_workq_submit(q, item(1)), 0);
    assert_int_equal(kp_workq_submit(q, item(2)), 0);
    assert_int_equal(kp_workq_queued(q), 2);
    assert_int_equal(kp_workq_submit(q, extra), -EBUSY);
    open_gate(&r);
    wait_ran(&r, 3);
    kp_workq_destroy(q);
    assert_int_equal(r.n_ran, 3);
    assert_int_equal(r.ran[0], 0);
    assert_int_equal(r.ran[1], 1);
    assert_int_equal(r.ran[2], 2);
    assert_int_equal(r.state_of[0], 100);
    assert_int_equal(r.state_of[2], 100);
    assert_int_equal(r.n_cancelled, 0);
    assert_int_equal(r.finis, 1);
    free(extra);
    rec_fini(&r);
}

/* queue_max 0: as many items as workers, then busy until one finishes. */
static void test_no_queue(void **unused)
{
    struct kp_workq_opts o = { .workers = 2, .queue_max = 0 };
    struct kp_workq *q = NULL;
    struct rec r;
    char err[256] = "";
    int *extra = item(2);

    (void) unused;
    rec_init(&r);
    r.gate_open = false;
    assert_int_equal(kp_workq_create(&o, &ops, &r, &q, err, sizeof(err)), 0);
    assert_int_equal(kp_workq_submit(q, item(0)), 0);
    assert_int_equal(kp_workq_submit(q, item(1)), 0);
    wait_running(&r, 2); /* both at once: two workers */
    assert_int_equal(kp_workq_submit(q, extra), -EBUSY);
    open_gate(&r);
    while (kp_workq_submit(q, extra) == -EBUSY) {
        usleep(1000);
    }
    wait_ran(&r, 3);
    kp_workq_destroy(q);
    assert_int_equal(r.n_ran, 3);
    assert_int_equal(r.finis, 2);
    rec_fini(&r);
}

/* Stop while busy: the running item finishes, the queued ones are cancelled (not run), a submit
 * during the stop is refused, and every worker's fini runs. */
struct stopper {
    struct kp_workq *q;
};

static void *destroy_main(void *arg)
{
    kp_workq_destroy(((struct stopper *) arg)->q);
    return NULL;
}

static void test_stop_while_busy(void **unused)
{
    struct kp_workq_opts o = { .workers = 1, .queue_max = 3 };
    struct kp_workq *q = NULL;
    struct stopper s;
    struct rec r;
    pthread_t th;
    char err[256] = "";
    int *late = item(9);
    int rc;

    (void) unused;
    rec_init(&r);
    r.gate_open = false;
    assert_int_equal(kp_workq_create(&o, &ops, &r, &q, err, sizeof(err)), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(kp_workq_submit(q, item(i)), 0);
    }
    wait_running(&r, 1);
    s.q = q;
    assert_int_equal(pthread_create(&th, NULL, destroy_main, &s), 0);
    /* Full, so busy until the destroy begins; then shutting down (the queue is still there:
     * item 0 runs). */
    while ((rc = kp_workq_submit(q, late)) == 0 || rc == -EBUSY) {
        if (rc == 0) {
            fail_msg("a submit after the stop began was accepted");
        }
        usleep(1000);
    }
    assert_int_equal(rc, -ESHUTDOWN);
    open_gate(&r);
    pthread_join(th, NULL);
    assert_int_equal(r.n_ran, 1);
    assert_int_equal(r.ran[0], 0);
    assert_int_equal(r.n_cancelled, 3);
    assert_int_equal(r.cancelled[0], 1);
    assert_int_equal(r.cancelled[2], 3);
    assert_int_equal(r.finis, 1);
    free(late);
    rec_fini(&r);
}

/* A worker whose init fails makes create fail with its code and message; every worker's fini
 * runs (the failed one's too, with what it set) and no thread is left behind. */
static void test_init_failure(void **unused)
{
    struct kp_workq_opts o = { .workers = 4, .queue_max = 1 };
    struct kp_workq *q = NULL;
    struct rec r;
    char err[256] = "";

    (void) unused;
    rec_init(&r);
    r.fail_index = 2;
    assert_int_equal(kp_workq_create(&o, &ops, &r, &q, err, sizeof(err)), -ECONNREFUSED);
    assert_null(q);
    assert_string_equal(err, "worker 2 cannot connect");
    assert_int_equal(r.inits, 4);
    assert_int_equal(r.finis, 4);
    assert_int_equal(r.n_ran, 0);
    rec_fini(&r);
}

/* Bad options are refused with a message. */
static void test_bad_opts(void **unused)
{
    struct kp_workq_opts o = { .workers = 0, .queue_max = 1 };
    struct kp_workq_ops no_cancel = { .run = run_cb };
    struct kp_workq *q = NULL;
    char err[256] = "";

    (void) unused;
    assert_int_equal(kp_workq_create(&o, &ops, NULL, &q, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "workers"));
    o.workers = 1;
    assert_int_equal(kp_workq_create(&o, &no_cancel, NULL, &q, err, sizeof(err)), -EINVAL);
    assert_null(q);
    kp_workq_destroy(NULL);
}

/* The tick: once after init, then while idle every tick_ms (and after each item). */
static void test_tick(void **unused)
{
    struct kp_workq_opts o = { .workers = 1, .queue_max = 1, .tick_ms = 5 };
    struct kp_workq_ops t = { .run = run_cb, .cancel = cancel_cb, .tick = tick_cb };
    struct kp_workq *q = NULL;
    struct rec r;
    char err[256] = "";
    int ticks;

    (void) unused;
    rec_init(&r);
    assert_int_equal(kp_workq_create(&o, &t, &r, &q, err, sizeof(err)), 0);
    for (int i = 0; i < 2000; i++) {
        pthread_mutex_lock(&r.mu);
        ticks = r.ticks;
        pthread_mutex_unlock(&r.mu);
        if (ticks >= 3) {
            break;
        }
        usleep(1000);
    }
    assert_true(ticks >= 3);
    kp_workq_destroy(q);
    rec_fini(&r);
    /* tick_ms 0: one tick after init, none after the item nor while idle. */
    rec_init(&r);
    o.tick_ms = 0;
    assert_int_equal(kp_workq_create(&o, &t, &r, &q, err, sizeof(err)), 0);
    assert_int_equal(kp_workq_submit(q, item(0)), 0);
    for (int i = 0; i < 2000; i++) {
        pthread_mutex_lock(&r.mu);
        ticks = r.n_ran;
        pthread_mutex_unlock(&r.mu);
        if (ticks == 1) {
            break;
        }
        usleep(1000);
    }
    usleep(20 * 1000); /* time for a wrong extra tick */
    kp_workq_destroy(q);
    assert_int_equal(r.n_ran, 1);
    assert_int_equal(r.ticks, 1);
    rec_fini(&r);
}

/* One worker, queue_max 7 (capacity 8): client "a" floods. Alone it gets half the capacity
 * (4 in flight), then busy; "b" and "c" still get in, and a free worker takes the clients in
 * turn: b's and c's items run right after the one running, before a's other three. */
static void test_fair_keys(void **unused)
{
    struct kp_workq_opts o = { .workers = 1, .queue_max = 7 };
    struct kp_workq *q = NULL;
    struct rec r;
    char err[256] = "";
    int *extra = item(60);
    int accepted_a = 0;

    (void) unused;
    rec_init(&r);
    r.gate_open = false;
    assert_int_equal(kp_workq_create(&o, &ops, &r, &q, err, sizeof(err)), 0);
    assert_int_equal(kp_workq_submit_keyed(q, item(10), "a"), 0);
    wait_running(&r, 1);
    accepted_a = 1;
    for (int i = 1; i < 8; i++) {
        int *it = item(10 + i);

        if (kp_workq_submit_keyed(q, it, "a") == 0) {
            accepted_a++;
        }
        else {
            free(it);
        }
    }
    assert_int_equal(accepted_a, 4);
    assert_int_equal(kp_workq_submit_keyed(q, item(20), "b"), 0);
    assert_int_equal(kp_workq_submit_keyed(q, item(30), "c"), 0);
    /* With b and c in, a's share is 8 / 4 = 2: a stays refused. */
    assert_int_equal(kp_workq_submit_keyed(q, extra, "a"), -EBUSY);
    open_gate(&r);
    wait_ran(&r, 6);
    kp_workq_destroy(q);
    assert_int_equal(r.n_ran, 6);
    assert_int_equal(r.ran[0], 10);
    /* The ring was a (3 queued), b, c when the first item ended: a, then b, then c. */
    assert_int_equal(r.ran[1], 11);
    assert_int_equal(r.ran[2], 20);
    assert_int_equal(r.ran[3], 30);
    assert_int_equal(r.ran[4], 12);
    assert_int_equal(r.ran[5], 13);
    free(extra);
    rec_fini(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_queue_busy), cmocka_unit_test(test_no_queue),
        cmocka_unit_test(test_stop_while_busy), cmocka_unit_test(test_init_failure),
        cmocka_unit_test(test_bad_opts),        cmocka_unit_test(test_tick),
        cmocka_unit_test(test_fair_keys),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
