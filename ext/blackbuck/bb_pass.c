/*
 * bb_pass.c - see bb_pass.h. One message per connection: a versioned fixed-size record, then the
 * request bytes it carries (if any), and one SCM_RIGHTS fd. Both ends run the same build (a generation's workers fork from one master), so
 * the record is sent as laid out in memory; the magic only catches a stray writer. A wake-up
 * (bb_pass_wake) is a message of its own magic alone.
 */
#define _GNU_SOURCE /* MSG_CMSG_CLOEXEC */
#include "bb_pass.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define BB_PASS_MAGIC 0x42425031u /* "BBP1" */
#define BB_PASS_WAKE_MAGIC 0x42425731u /* "BBW1": a wake-up, the whole message (bb_pass_wake) */
/* Descriptors accepted per message at most: more than one is malformed, but each must be closed. */
#define BB_PASS_FDS_MAX 4

struct wire {
    uint32_t magic;
    struct bb_pass pass;
};

int bb_pass_send(int sock, int fd, const struct bb_pass *p, const char *bytes, size_t len)
{
    struct wire w;
    struct iovec iov[2];
    struct msghdr msg;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct cmsghdr *cm;
    ssize_t n;

    if (len > BB_PASS_BYTES_MAX) return errno = EMSGSIZE, -1;
    memset(&w, 0, sizeof(w)); /* no stack bytes in the padding */
    w.magic = BB_PASS_MAGIC;
    w.pass = *p;
    w.pass.addr[BB_PASS_ADDR_MAX] = '\0';
    iov[0].iov_base = &w;
    iov[0].iov_len = sizeof(w);
    iov[1].iov_base = (void *)bytes;
    iov[1].iov_len = len;
    memset(&msg, 0, sizeof(msg));
    memset(&ctl, 0, sizeof(ctl));
    msg.msg_iov = iov;
    msg.msg_iovlen = len ? 2 : 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    do {
        n = sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EWOULDBLOCK) errno = EAGAIN;
        return -1;
    }
    if ((size_t)n != sizeof(w) + len) return errno = EMSGSIZE, -1; /* SEQPACKET sends whole records */
    return 0;
}

int bb_pass_recv(int sock, struct bb_pass *p, char *bytes, size_t cap, size_t *len)
{
    struct wire w;
    struct iovec iov[2];
    struct msghdr msg;
    union {
        char buf[CMSG_SPACE(sizeof(int) * BB_PASS_FDS_MAX)];
        struct cmsghdr align;
    } ctl;
    struct cmsghdr *cm;
    int fds[BB_PASS_FDS_MAX], nfds = 0, i;
    ssize_t n;

    for (;;) {
        iov[0].iov_base = &w;
        iov[0].iov_len = sizeof(w);
        iov[1].iov_base = bytes;
        iov[1].iov_len = cap;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = cap ? 2 : 1;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        do {
            n = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        } while (n < 0 && errno == EINTR);
        if (n < 0) {
            if (errno == EWOULDBLOCK) errno = EAGAIN;
            return -1;
        }
        for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            size_t k, count;
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
            count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (k = 0; k < count && nfds < BB_PASS_FDS_MAX; k++) memcpy(&fds[nfds++], CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
        }
        /* A wake-up (bb_pass_wake) carries no connection: the next message, if any. */
        if ((size_t)n != sizeof(w.magic) || w.magic != BB_PASS_WAKE_MAGIC || nfds ||
            (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
            break;
    }
    if ((size_t)n >= sizeof(w) && w.magic == BB_PASS_MAGIC && nfds == 0 &&
        (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == MSG_CTRUNC) {
        /* A whole message whose socket the kernel could not install here (no descriptor free): it
         * dropped it. Nothing to close; the caller learns whose it was. */
        *p = w.pass;
        p->addr[BB_PASS_ADDR_MAX] = '\0';
        *len = 0;
        return errno = ECONNABORTED, -1;
    }
    if ((size_t)n < sizeof(w) || w.magic != BB_PASS_MAGIC || nfds != 1 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (i = 0; i < nfds; i++) close(fds[i]);
        return errno = EBADMSG, -1;
    }
    *p = w.pass;
    *len = (size_t)n - sizeof(w);
    p->addr[BB_PASS_ADDR_MAX] = '\0';
    return fds[0];
}

int bb_pass_room(int fd, int reserve)
{
    struct rlimit rl;
    int lowest = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (lowest < 0) return 0; /* EMFILE: not one free (or ENFILE, ENOMEM: none can be made) */
    close(lowest);
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1; /* (never: a valid resource) the dup went through */
    if (rl.rlim_cur == RLIM_INFINITY || (rlim_t)lowest + (rlim_t)(reserve > 0 ? reserve : 0) < rl.rlim_cur) return 1;
    return errno = EMFILE, 0;
}

int bb_pass_wake(int sock)
{
    uint32_t magic = BB_PASS_WAKE_MAGIC;
    ssize_t n;
    do {
        n = send(sock, &magic, sizeof(magic), MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EWOULDBLOCK) errno = EAGAIN;
    return n == (ssize_t)sizeof(magic) ? 0 : -1;
}

int bb_pass_next(int sock)
{
    uint32_t magic;
    ssize_t n;
    do { /* the first bytes only, the message left queued; without room for descriptors none is made */
        n = recv(sock, &magic, sizeof(magic), MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? BB_PASS_NEXT_NONE : -1;
    return n == (ssize_t)sizeof(magic) && magic == BB_PASS_WAKE_MAGIC ? BB_PASS_NEXT_WAKE : BB_PASS_NEXT_CONN;
}

/* The counters bb_pass_failed adds to (bb_pass_count_into); NULL: none. */
static uint64_t *failure_counters;

void bb_pass_count_into(uint64_t *counters) { __atomic_store_n(&failure_counters, counters, __ATOMIC_RELEASE); }

void bb_pass_failed(int why)
{
    uint64_t *c = __atomic_load_n(&failure_counters, __ATOMIC_ACQUIRE);
    if (c && why >= 0 && why < BB_HANDOFF_FAILURE_KINDS) __atomic_fetch_add(&c[why], 1, __ATOMIC_RELAXED);
}
