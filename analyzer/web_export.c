#define KP_LOG_MODULE "web"
/* GET /api/v1/runs/{run}/export: a rank's trace streamed from a thread of its own through a
 * pipe (web.h "Threads"). */
#include "web_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "export.h"
#include "kp_err.h"
#include "kp_log.h"
#include "kp_pg.h"
#include "service.h"

/* ---- export ------------------------------------------------------------------------------ */

struct export_job {
    struct kp_web *w;
    PGconn *pg;
    struct kp_export *x;
    int32_t rank;
    int gzip_level;
    int fd; /* the pipe's write end */
};

static int export_sink(void *ud, const void *data, size_t len)
{
    struct export_job *e = ud;
    const char *p = data;

    while (len > 0) {
        ssize_t n = write(e->fd, p, len);

        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -errno; /* the client went away (EPIPE): stop */
        }
        p += n;
        len -= (size_t) n;
    }
    return 0;
}

static void *export_main(void *arg)
{
    struct export_job *e = arg;
    struct kp_export_stats st;
    char err[512];
    int rc = kp_export_rank(e->x, e->rank, e->gzip_level, export_sink, e, &st, err, sizeof(err));

    if (rc != 0 && rc != -EPIPE) {
        kp_log_warn("export failed rank=%d err=\"%s\": the client gets a short file", e->rank, err);
    }
    close(e->fd);
    kp_export_close(e->x);
    PQfinish(e->pg);
    pthread_mutex_lock(&e->w->mu);
    e->w->exports--;
    pthread_cond_broadcast(&e->w->exports_done);
    pthread_mutex_unlock(&e->w->mu);
    free(e);
    return NULL;
}

enum MHD_Result kp_web_serve_export(struct kp_web *w, struct MHD_Connection *c, uint64_t run,
                                    const char *q)
{
    const char *format = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "format");
    const char *rank_s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "rank");
    struct export_job *e;
    char err[700], name[128];
    const int32_t *ranks;
    size_t n = 0;
    bool gz, found = false;
    long rank = -1;
    int pfd[2], rc;
    pthread_t t;
    struct MHD_Response *r;
    enum MHD_Result ok;

    for (const char *p = q; p != NULL && *p != '\0';) {
        if (strncmp(p, "rank=", 5) != 0 && strncmp(p, "format=", 7) != 0 && *p != '&') {
            return kp_web_send_error(c, 400, "unknown parameter: an export takes rank and format");
        }
        p = strchr(p, '&');
        p = p != NULL ? p + 1 : NULL;
    }
    if (format == NULL || strcmp(format, "json") == 0) {
        gz = false;
    }
    else if (strcmp(format, "json.gz") == 0) {
        gz = true;
    }
    else {
        return kp_web_send_error(c, 400, "format must be json or json.gz");
    }
    if (rank_s != NULL) {
        char *end;

        errno = 0;
        rank = strtol(rank_s, &end, 10);
        if (rank_s[0] < '0' || rank_s[0] > '9' || *end != '\0' || errno != 0 || rank > INT32_MAX) {
            return kp_web_send_error(c, 400, "rank must be a rank of the run (0..2147483647)");
        }
    }
    if ((e = calloc(1, sizeof(*e))) == NULL) {
        return kp_web_send_error(c, 503, "kprof-analyzer is out of memory; retry later");
    }
    e->w = w;
    e->gzip_level = gz ? 6 : 0;
    e->fd = -1;
    pthread_mutex_lock(&w->mu);
    if (w->exports >= w->max_exports) {
        pthread_mutex_unlock(&w->mu);
        free(e);
        return kp_web_send_error(c, 429, "too many exports at once; retry later");
    }
    w->exports++;
    pthread_mutex_unlock(&w->mu);
    rc = kp_pg_connect(kp_analyzer_config(w->a)->base.pg_conninfo, "kprof-analyzer", &e->pg, err,
                       sizeof(err));
    if (rc == 0) {
        rc = kp_export_open(e->pg, (int64_t) run, 0, &e->x, err, sizeof(err));
    }
    if (rc == 0) {
        ranks = kp_export_ranks(e->x, &n);
        for (size_t i = 0; i < n; i++) {
            found = found || ranks[i] == rank;
        }
        if (rank < 0 && n == 1) {
            rank = ranks[0];
            found = true;
        }
        if (!found && rank < 0) {
            snprintf(err, sizeof(err), "run %" PRIu64 " has %zu ranks: pick one with rank=N", run,
                     n);
        }
        else if (!found) {
            snprintf(err, sizeof(err), "run %" PRIu64 " has no rank %ld (%zu ranks)", run, rank, n);
        }
        if (!found) {
            rc = rank < 0 ? -EINVAL : KP_ENOTFOUND;
        }
    }
    if (rc == 0 && (pipe(pfd) != 0 || fcntl(pfd[0], F_SETFD, FD_CLOEXEC) != 0 ||
                    fcntl(pfd[1], F_SETFD, FD_CLOEXEC) != 0)) {
        snprintf(err, sizeof(err), "cannot make a pipe: %s", strerror(errno));
        rc = -errno;
    }
    if (rc != 0) {
        kp_export_close(e->x);
        PQfinish(e->pg);
        pthread_mutex_lock(&w->mu);
        w->exports--;
        pthread_cond_broadcast(&w->exports_done);
        pthread_mutex_unlock(&w->mu);
        free(e);
        return kp_web_send_error(c, rc == KP_ENOTFOUND ? 404 : rc == -EINVAL ? 400 : 503, err);
    }
    e->rank = (int32_t) rank;
    e->fd = pfd[1];
    if ((r = MHD_create_response_from_pipe(pfd[0])) == NULL ||
        pthread_create(&t, NULL, export_main, e) != 0) {
        if (r != NULL) {
            MHD_destroy_response(r); /* closes pfd[0] */
        }
        else {
            close(pfd[0]);
        }
        close(pfd[1]);
        kp_export_close(e->x);
        PQfinish(e->pg);
        pthread_mutex_lock(&w->mu);
        w->exports--;
        pthread_cond_broadcast(&w->exports_done);
        pthread_mutex_unlock(&w->mu);
        free(e);
        return kp_web_send_error(c, 503, "cannot start the export; retry later");
    }
    pthread_detach(t);
    snprintf(name, sizeof(name), "attachment; filename=\"kprof-run%" PRIu64 "-rank%ld.json%s\"",
             run, rank, gz ? ".gz" : "");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, gz ? "application/gzip" : JSON_TYPE);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, name);
    kp_web_add_security_headers(r);
    ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}
