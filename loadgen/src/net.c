/* net.c - see net.h. */
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int nonblocking_socket(int family)
{
#ifdef SOCK_NONBLOCK
    return socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
#else
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd >= 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    return fd;
#endif
}

static int start_connect(const struct target *t, int fd)
{
    if (connect(fd, (const struct sockaddr *)&t->addr, t->addrlen) == 0) return NET_OK;
    if (errno == EINPROGRESS) return NET_PENDING;
    if (errno == EAGAIN) return NET_RETRY; /* AF_UNIX: listen backlog full */
    return NET_ERROR;
}

static int tcp_open(const struct target *t, int *fd)
{
    int one = 1;
    *fd = nonblocking_socket(t->addr.ss_family);
    if (*fd < 0) return NET_ERROR;
    setsockopt(*fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return start_connect(t, *fd);
}

static int unix_open(const struct target *t, int *fd)
{
    *fd = nonblocking_socket(AF_UNIX);
    if (*fd < 0) return NET_ERROR;
    return start_connect(t, *fd);
}

static int finish_connect(int fd)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return NET_ERROR;
    if (err == 0) return NET_OK;
    errno = err;
    return err == EAGAIN ? NET_RETRY : NET_ERROR;
}

const struct transport net_tcp = { "tcp", tcp_open, finish_connect };
const struct transport net_unix = { "unix", unix_open, finish_connect };

/* Pick the first address that accepts a blocking test connection (as wrk
 * does), so "localhost" works whether the server listens on ::1 or 127.0.0.1. */
int net_target_tcp(struct target *t, const char *host, const char *port, char *err, size_t errlen)
{
    struct addrinfo hints, *res, *ai;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "unable to resolve %s:%s: %s", host, port, gai_strerror(rc));
        return -1;
    }
    int saved = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        saved = errno;
        close(fd);
        if (rc == 0) break;
    }
    if (!ai) {
        snprintf(err, errlen, "unable to connect to %s:%s: %s", host, port, strerror(saved));
        freeaddrinfo(res);
        return -1;
    }
    memset(t, 0, sizeof *t);
    memcpy(&t->addr, ai->ai_addr, ai->ai_addrlen);
    t->addrlen = ai->ai_addrlen;
    t->transport = &net_tcp;
    char h[INET6_ADDRSTRLEN + 2];
    if (getnameinfo(ai->ai_addr, ai->ai_addrlen, h, sizeof h, NULL, 0, NI_NUMERICHOST)) snprintf(h, sizeof h, "%s", host);
    snprintf(t->display, sizeof t->display, ai->ai_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, port);
    freeaddrinfo(res);
    return 0;
}

/* A socket file left by a server that has gone (or an abstract name nobody holds) refuses every
 * connect: try one before the run, as net_target_tcp does, so the run does not count a whole
 * duration of connect errors. Non-blocking: a full listen backlog (EAGAIN) means someone listens. */
static int probe_unix(struct target *t, const char *path, char *err, size_t errlen)
{
    int fd = nonblocking_socket(AF_UNIX);
    if (fd < 0) {
        snprintf(err, errlen, "unable to create a UNIX socket: %s", strerror(errno));
        return -1;
    }
    int rc = start_connect(t, fd), saved = errno;
    close(fd);
    if (rc != NET_ERROR) return 0;
    snprintf(err, errlen, "unable to connect to UNIX socket %s: %s (is the server listening?)", path, strerror(saved));
    return -1;
}

int net_target_unix(struct target *t, const char *path, char *err, size_t errlen)
{
    struct sockaddr_un *sun = (struct sockaddr_un *)&t->addr;
    size_t len = strlen(path), max = sizeof sun->sun_path - 1;
    memset(t, 0, sizeof *t);
    sun->sun_family = AF_UNIX;
    t->transport = &net_unix;
    snprintf(t->display, sizeof t->display, "%s", path);
    if (len == 0) {
        snprintf(err, errlen, "empty UNIX socket path");
        return -1;
    }
    if (path[0] == '@') { /* Linux abstract namespace: leading NUL, no terminator */
#ifdef __linux__
        if (len - 1 > max) {
            snprintf(err, errlen, "abstract socket name too long: %zu bytes (max %zu)", len - 1, max);
            return -1;
        }
        memcpy(sun->sun_path + 1, path + 1, len - 1);
        t->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
        return probe_unix(t, path, err, errlen);
#else
        snprintf(err, errlen, "abstract UNIX sockets are Linux-only: %s", path);
        return -1;
#endif
    }
    if (len > max) {
        snprintf(err, errlen, "UNIX socket path too long: %zu bytes (max %zu): %s", len, max, path);
        return -1;
    }
    struct stat st;
    if (stat(path, &st) < 0) {
        snprintf(err, errlen, "UNIX socket %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "not a UNIX socket: %s", path);
        return -1;
    }
    memcpy(sun->sun_path, path, len + 1);
    t->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
    return probe_unix(t, path, err, errlen);
}
