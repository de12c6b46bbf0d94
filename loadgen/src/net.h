/* net.h - where to connect, and how: a transport table per socket family.
 *
 * The worker never branches on TCP vs UNIX; it calls through target->transport.
 * Return convention of open/finish: NET_OK, NET_PENDING (connect in progress:
 * wait for writability, then call finish), NET_RETRY (transient: the UNIX
 * listen backlog is full), NET_ERROR (errno set). */
#ifndef BL_NET_H
#define BL_NET_H

#include <stddef.h>
#include <sys/socket.h>

enum { NET_OK = 0, NET_PENDING = 1, NET_RETRY = 2, NET_ERROR = -1 };

struct target;

struct transport {
    const char *name; /* "tcp" or "unix" */
    int (*open)(const struct target *t, int *fd);
    int (*finish)(int fd);
};

struct target {
    const struct transport *transport;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char display[160]; /* "127.0.0.1:8080", "/tmp/app.sock", "@name" */
};

extern const struct transport net_tcp, net_unix;

/* Fill *t. On failure return -1 with a one-line reason in err. */
int net_target_tcp(struct target *t, const char *host, const char *port, char *err, size_t errlen);
/* path: a filesystem path (must exist and be a socket) or "@name" (abstract); either must accept a
 * test connection (someone listens). */
int net_target_unix(struct target *t, const char *path, char *err, size_t errlen);

#endif
