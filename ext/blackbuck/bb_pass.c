/*
 * bb_pass.c - see bb_pass.h. One message per connection: a versioned fixed-size record, then the
 * request bytes it carries (if any), and one SCM_RIGHTS fd. Both ends run the same build (a generation's workers fork from one master), so
 * the record is sent as laid out in memory; the magic only catches a stray writer.
 */
#define _GNU_SOURCE /* MSG_CMSG_CLOEXEC */
#include "bb_pass.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define BB_PASS_MAGIC 0x42425031u /* "BBP1" */
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
    if ((size_t)n < sizeof(w) || w.magic != BB_PASS_MAGIC || nfds != 1 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (i = 0; i < nfds; i++) close(fds[i]);
        return errno = EBADMSG, -1;
    }
    *p = w.pass;
    *len = (size_t)n - sizeof(w);
    p->addr[BB_PASS_ADDR_MAX] = '\0';
    return fds[0];
}
