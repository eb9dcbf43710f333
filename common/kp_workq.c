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
    struct client *client;
    struct node *next;
};

/* The items of one key (kp_workq_submit_keyed; kp_workq_submit's items share the key ""). */
struct client {
    char key[KP_WORKQ_KEY_MAX];
    struct node *head, *tail; /* queued */
    size_t in_flight;         /* queued + running */
    bool in_ring;             /* has queued items: in the round-robin ring */
    struct client *ring_next; /* the ring of clients with queued items */
    struct client *next;      /* every client with items in flight */
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
    struct client *clients;               /* with items in flight */
    struct client *ring_head, *ring_tail; /* with queued items, served in turn */
    size_t n_clients;
    size_t queued;
    size_t in_flight; /* accepted and not finished: queued + running */
    size_t n_inited;  /* workers whose init returned */
    int init_rc;      /* the first failed init's code */
    char init_err[256];
    bool open; /* every init worked: serve */
    bool stopping;
};

static void ring_push(struct kp_workq *q, struct client *c)
{
    c->in_ring = true;
    c->ring_next = NULL;
    if (q->ring_tail != NULL) {
        q->ring_tail->ring_next = c;
    }
    else {
        q->ring_head = c;
    }
    q->ring_tail = c;
}

/* Pops the oldest item of the client whose turn it is; that client goes to the back of the
 * ring if it has more. mu held, ring not empty. */
static struct node *pop(struct kp_workq *q)
{
    struct client *c = q->ring_head;
    struct node *n = c->head;

    q->ring_head = c->ring_next;
    if (q->ring_head == NULL) {
        q->ring_tail = NULL;
    }
    c->in_ring = false;
    c->head = n->next;
    if (c->head == NULL) {
        c->tail = NULL;
    }
    else {
        ring_push(q, c);
    }
    q->queued--;
    return n;
}

/* One item of c finished (ran or cancelled): frees c once it has none. mu held. */
static void client_done(struct kp_workq *q, struct client *c)
{
    struct client **pp;

    q->in_flight--;
    if (--c->in_flight > 0) {
        return;
    }
    for (pp = &q->clients; *pp != c; pp = &(*pp)->next) {
    }
    *pp = c->next;
    q->n_clients--;
    free(c);
}

/* Waits for an item; returns it, or NULL once stopping with nothing queued. Ticks on the way
 * when idle for tick_ms. mu held (dropped around tick). */
static struct node *wait_item(struct kp_workq *q, void *state)
{
    while (q->ring_head == NULL && !q->stopping) {
        if (q->ops.tick != NULL && q->opts.tick_ms > 0) {
            struct timespec ts = kp_real_deadline(q->opts.tick_ms);

            if (pthread_cond_timedwait(&q->cond, &q->mu, &ts) == ETIMEDOUT &&
                q->ring_head == NULL && !q->stopping) {
                pthread_mutex_unlock(&q->mu);
                q->ops.tick(q->ud, state);
                pthread_mutex_lock(&q->mu);
            }
        }
        else {
            pthread_cond_wait(&q->cond, &q->mu);
        }
    }
    return q->ring_head != NULL ? pop(q) : NULL;
}

static void serve(struct kp_workq *q, void *state)
{
    struct node *n;

    if (q->ops.tick != NULL) {
        q->ops.tick(q->ud, state);
    }
    pthread_mutex_lock(&q->mu);
    while ((n = wait_item(q, state)) != NULL) {
        bool stop = q->stopping;
        void *item = n->item;
        struct client *c = n->client;

        free(n);
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
        client_done(q, c);
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

static int submit(struct kp_workq *q, void *item, const char *key, bool fair);

int kp_workq_submit(struct kp_workq *q, void *item)
{
    return submit(q, item, "", false);
}

int kp_workq_submit_keyed(struct kp_workq *q, void *item, const char *key)
{
    return submit(q, item, key, true);
}

/* The most items one key may have in flight while others keys have some (see Fairness). */
static size_t fair_share(const struct kp_workq *q, const struct client *c)
{
    size_t others = q->n_clients - (c != NULL ? 1 : 0);
    size_t share = (q->opts.workers + q->opts.queue_max) / (others + 2);

    return share > 0 ? share : 1;
}

static int submit(struct kp_workq *q, void *item, const char *key, bool fair)
{
    struct node *n = malloc(sizeof(*n));
    struct client *c;
    int rc = 0;

    if (n == NULL) {
        return -ENOMEM;
    }
    n->item = item;
    n->next = NULL;
    pthread_mutex_lock(&q->mu);
    for (c = q->clients; c != NULL && strncmp(c->key, key, sizeof(c->key) - 1) != 0; c = c->next) {
    }
    if (q->stopping) {
        rc = -ESHUTDOWN;
    }
    else if (q->in_flight >= q->opts.workers + q->opts.queue_max ||
             (fair && c != NULL && c->in_flight >= fair_share(q, c))) {
        rc = -EBUSY;
    }
    else if (c == NULL && (c = calloc(1, sizeof(*c))) == NULL) {
        rc = -ENOMEM;
    }
    else {
        if (c->in_flight == 0) {
            snprintf(c->key, sizeof(c->key), "%s", key);
            c->next = q->clients;
            q->clients = c;
            q->n_clients++;
        }
        n->client = c;
        if (c->tail != NULL) {
            c->tail->next = n;
        }
        else {
            c->head = n;
        }
        c->tail = n;
        if (!c->in_ring) {
            ring_push(q, c);
        }
        c->in_flight++;
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
