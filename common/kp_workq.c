#include "kp_workq.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_clock.h"

struct node {
    void *item;
    struct node *next;
};

struct worker {
    struct kp_workq *q;
    size_t index;
    pthread_t thread;
    bool started;
};

struct kp_workq {
    struct kp_workq_opts opts;
    struct kp_workq_ops ops;
    void *ud;
    struct worker *workers;
    size_t n_started;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cond;
    struct node *head, *tail;
    size_t queued;
    size_t in_flight; /* accepted and not finished: queued + running */
    size_t n_inited;  /* workers whose init returned */
    int init_rc;      /* the first failed init's code */
    char init_err[256];
    bool open; /* every init worked: serve */
    bool stopping;
};

/* Pops the head item. mu held, head not NULL. */
static void *pop(struct kp_workq *q)
{
    struct node *n = q->head;
    void *item = n->item;

    q->head = n->next;
    if (q->head == NULL) {
        q->tail = NULL;
    }
    q->queued--;
    free(n);
    return item;
}

/* Waits for an item; returns it, or NULL once stopping with nothing queued. Ticks on the way
 * when idle for tick_ms. mu held (dropped around tick). */
static void *wait_item(struct kp_workq *q, void *state)
{
    while (q->head == NULL && !q->stopping) {
        if (q->ops.tick != NULL && q->opts.tick_ms > 0) {
            struct timespec ts = kp_real_deadline(q->opts.tick_ms);

            if (pthread_cond_timedwait(&q->cond, &q->mu, &ts) == ETIMEDOUT && q->head == NULL &&
                !q->stopping) {
                pthread_mutex_unlock(&q->mu);
                q->ops.tick(q->ud, state);
                pthread_mutex_lock(&q->mu);
            }
        }
        else {
            pthread_cond_wait(&q->cond, &q->mu);
        }
    }
    return q->head != NULL ? pop(q) : NULL;
}

static void serve(struct kp_workq *q, void *state)
{
    void *item;

    if (q->ops.tick != NULL) {
        q->ops.tick(q->ud, state);
    }
    pthread_mutex_lock(&q->mu);
    while ((item = wait_item(q, state)) != NULL) {
        bool stop = q->stopping;

        pthread_mutex_unlock(&q->mu);
        if (stop) {
            q->ops.cancel(q->ud, item);
        }
        else {
            q->ops.run(q->ud, state, item);
            if (q->ops.tick != NULL && q->opts.tick_ms > 0) {
                q->ops.tick(q->ud, state); /* a busy queue must not starve the periodic work */
            }
        }
        pthread_mutex_lock(&q->mu);
        q->in_flight--;
    }
    pthread_mutex_unlock(&q->mu);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kp_workq *q = w->q;
    void *state = NULL;
    char err[sizeof(q->init_err)] = "";
    int rc = q->ops.init != NULL ? q->ops.init(q->ud, w->index, &state, err, sizeof(err)) : 0;
    bool open;

    pthread_mutex_lock(&q->mu);
    if (rc != 0 && q->init_rc == 0) {
        q->init_rc = rc;
        snprintf(q->init_err, sizeof(q->init_err), "%s", err);
    }
    q->n_inited++;
    pthread_cond_broadcast(&q->cond);
    while (!q->open && !q->stopping) {
        pthread_cond_wait(&q->cond, &q->mu);
    }
    open = q->open && rc == 0;
    pthread_mutex_unlock(&q->mu);
    if (open) {
        serve(q, state);
    }
    if (q->ops.fini != NULL) {
        q->ops.fini(q->ud, state);
    }
    return NULL;
}

int kp_workq_create(const struct kp_workq_opts *opts, const struct kp_workq_ops *ops, void *ud,
                    struct kp_workq **out, char *err, size_t len)
{
    struct kp_workq *q;
    int rc = 0;

    if (opts->workers < 1 || opts->workers > KP_WORKQ_MAX_WORKERS || opts->tick_ms < 0 ||
        ops->run == NULL || ops->cancel == NULL) {
        snprintf(err, len, "a work queue needs 1..%d workers, a run and a cancel callback",
                 KP_WORKQ_MAX_WORKERS);
        return -EINVAL;
    }
    if ((q = calloc(1, sizeof(*q))) == NULL ||
        (q->workers = calloc(opts->workers, sizeof(*q->workers))) == NULL) {
        free(q);
        snprintf(err, len, "out of memory");
        return -ENOMEM;
    }
    q->opts = *opts;
    q->ops = *ops;
    q->ud = ud;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cond, NULL);
    for (size_t i = 0; i < opts->workers; i++) {
        struct worker *w = &q->workers[i];

        w->q = q;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            snprintf(err, len, "cannot start work queue thread %zu of %zu", i + 1, opts->workers);
            rc = -EAGAIN;
            break;
        }
        w->started = true;
        q->n_started++;
    }
    pthread_mutex_lock(&q->mu);
    while (q->n_inited < q->n_started) {
        pthread_cond_wait(&q->cond, &q->mu);
    }
    if (rc == 0 && q->init_rc != 0) {
        rc = q->init_rc;
        snprintf(err, len, "%s", q->init_err);
    }
    q->open = rc == 0;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->mu);
    if (rc != 0) {
        kp_workq_destroy(q);
        return rc;
    }
    *out = q;
    return 0;
}

int kp_workq_submit(struct kp_workq *q, void *item)
{
    struct node *n = malloc(sizeof(*n));
    int rc = 0;

    if (n == NULL) {
        return -ENOMEM;
    }
    n->item = item;
    n->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        rc = -ESHUTDOWN;
    }
    else if (q->in_flight >= q->opts.workers + q->opts.queue_max) {
        rc = -EBUSY;
    }
    else {
        if (q->tail != NULL) {
            q->tail->next = n;
        }
        else {
            q->head = n;
        }
        q->tail = n;
        q->queued++;
        q->in_flight++;
        n = NULL;
        pthread_cond_signal(&q->cond);
    }
    pthread_mutex_unlock(&q->mu);
    free(n);
    return rc;
}

size_t kp_workq_queued(struct kp_workq *q)
{
    size_t n;

    pthread_mutex_lock(&q->mu);
    n = q->queued;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void kp_workq_destroy(struct kp_workq *q)
{
    if (q == NULL) {
        return;
    }
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->mu);
    for (size_t i = 0; i < q->opts.workers; i++) {
        if (q->workers[i].started) {
            pthread_join(q->workers[i].thread, NULL);
        }
    }
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->mu);
    free(q->workers);
    free(q);
}
