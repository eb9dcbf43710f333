/* kp_secret: secrets read from files only their owner may read (see kp_secret.h). */
#include "kp_secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kp_err.h"

long kp_secret_file_read(const char *path, const char *what, bool allow_group, char *buf,
                         size_t cap, char *errbuf, size_t errlen)
{
    mode_t forbidden = allow_group ? (S_IWGRP | S_IXGRP | S_IRWXO) : (S_IRWXG | S_IRWXO);
    struct stat st;
    ssize_t got;
    size_t len = 0;
    int fd, rc;

    /* O_NONBLOCK: a FIFO in the file's place must not hang the daemon before fstat refuses it */
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "cannot read %s %s: %s", what, path, strerror(-rc));
        return rc;
    }
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        snprintf(errbuf, errlen, "cannot read %s %s: %s", what, path, strerror(-rc));
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(errbuf, errlen, "%s %s is not a regular file", what, path);
        close(fd);
        return KP_ECONFIG;
    }
    if ((st.st_mode & forbidden) != 0) {
        snprintf(errbuf, errlen, "%s %s is readable by others (mode %04o): run chmod %s %s", what,
                 path, (unsigned) (st.st_mode & 07777), allow_group ? "640" : "600", path);
        close(fd);
        return KP_ECONFIG;
    }
    for (;;) {
        if (len == cap - 1) {
            char probe;

            /* One byte more tells "exactly full" from "too big". */
            got = read(fd, &probe, 1);
            if (got > 0) {
                snprintf(errbuf, errlen, "%s %s is over %zu bytes", what, path, cap - 1);
                close(fd);
                explicit_bzero(buf, cap);
                return KP_ETOOBIG;
            }
            if (got == 0) {
                break;
            }
        }
        else {
            got = read(fd, buf + len, cap - 1 - len);
        }
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            rc = -errno;
            snprintf(errbuf, errlen, "cannot read %s %s: %s", what, path, strerror(-rc));
            close(fd);
            explicit_bzero(buf, cap);
            return rc;
        }
        if (got == 0) {
            break;
        }
        len += (size_t) got;
    }
    close(fd);
    buf[len] = '\0';
    if (len == 0) {
        snprintf(errbuf, errlen, "%s %s is empty", what, path);
        return KP_ECONFIG;
    }
    return (long) len;
}

long kp_secret_file_line(const char *path, const char *what, bool allow_group, char *buf,
                         size_t cap, char *errbuf, size_t errlen)
{
    long n = kp_secret_file_read(path, what, allow_group, buf, cap, errbuf, errlen);
    size_t len;

    if (n < 0) {
        return n;
    }
    len = strcspn(buf, "\r\n");
    explicit_bzero(buf + len, (size_t) n - len);
    if (len == 0) {
        snprintf(errbuf, errlen, "%s %s is empty", what, path);
        return KP_ECONFIG;
    }
    return (long) len;
}
