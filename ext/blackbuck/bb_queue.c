/*
 * bb_queue.c - Native.listen_queue(fd): how many connections wait in a listening socket's
 * accept queue, and the queue's limit (the backlog).
 *
 * Returns [queued, backlog], or nil when the kernel cannot tell us (not Linux, not a
 * listening socket, sock_diag unavailable). Never raises for an unsupported case: the
 * status page shows "unknown" instead.
 *
 *   TCP:  getsockopt(TCP_INFO) on a socket in LISTEN state reports the accept-queue length
 *         in tcpi_unacked and the backlog in tcpi_sacked.
 *   UNIX: TCP_INFO does not exist; ask sock_diag over netlink (NETLINK_SOCK_DIAG) for the
 *         socket with our inode, with UDIAG_SHOW_RQLEN: for a listener UNIX_DIAG_RQLEN
 *         carries the queue length (udiag_rqueue) and the backlog (udiag_wqueue).
 */
#include "bb_queue.h"
#include "bb_glue.h"

#ifdef __linux__
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/inet_diag.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>

/* State number of a listening socket in TCP_INFO and in sock_diag's udiag_state (TCP_LISTEN). */
#define BB_STATE_LISTEN 10
/* A sock_diag answer waits at most this long: the master calls this from its loop. */
#define BB_DIAG_TIMEOUT_USEC 100000
/* One unix_diag_msg plus a few attributes; the answer for one socket is far smaller. */
#define BB_DIAG_BUF 8192

/* 0 and *queued and *backlog set, or -1 when this is not a TCP listener. */
static int tcp_queue(int fd, unsigned *queued, unsigned *backlog)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return -1;
    if (ti.tcpi_state != BB_STATE_LISTEN) return -1;
    *queued = ti.tcpi_unacked;
    *backlog = ti.tcpi_sacked;
    return 0;
}

/* 0 and *queued and *backlog set, or -1 when sock_diag does not answer for this inode. */
static int unix_queue(ino_t ino, unsigned *queued, unsigned *backlog)
{
    struct {
        struct nlmsghdr nlh;
        struct unix_diag_req req;
    } msg;
    struct sockaddr_nl nladdr;
    struct timeval tv = { 0, BB_DIAG_TIMEOUT_USEC };
    char buf[BB_DIAG_BUF];
    int found = -1;
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0) return -1;
    setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

    memset(&msg, 0, sizeof(msg));
    msg.nlh.nlmsg_len = sizeof(msg);
    msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nlh.nlmsg_flags = NLM_F_REQUEST; /* one socket, looked up by inode: no dump */
    msg.nlh.nlmsg_seq = 1;
    msg.req.sdiag_family = AF_UNIX;
    msg.req.udiag_states = 1u << BB_STATE_LISTEN;
    msg.req.udiag_ino = (__u32)ino;
    msg.req.udiag_show = UDIAG_SHOW_RQLEN;
    msg.req.udiag_cookie[0] = INET_DIAG_NOCOOKIE;
    msg.req.udiag_cookie[1] = INET_DIAG_NOCOOKIE;

    memset(&nladdr, 0, sizeof(nladdr));
    nladdr.nl_family = AF_NETLINK;
    if (sendto(nl, &msg, sizeof(msg), 0, (struct sockaddr *)&nladdr, sizeof(nladdr)) != (ssize_t)sizeof(msg))
        goto out;

    ssize_t n = recv(nl, buf, sizeof(buf), 0);
    if (n <= 0) goto out;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_ERROR || h->nlmsg_type == NLMSG_DONE) break;
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
        struct unix_diag_msg *m = NLMSG_DATA(h);
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*m)) || m->udiag_ino != (__u32)ino) continue;
        /* A lookup by inode ignores udiag_states; for other sockets RQLEN means bytes, not connections. */
        if (m->udiag_state != BB_STATE_LISTEN) break;
        int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
        for (struct rtattr *a = (struct rtattr *)(m + 1); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
            if (a->rta_type == UNIX_DIAG_RQLEN && RTA_PAYLOAD(a) >= sizeof(struct unix_diag_rqlen)) {
                struct unix_diag_rqlen *rq = RTA_DATA(a);
                *queued = rq->udiag_rqueue;
                *backlog = rq->udiag_wqueue;
                found = 0;
            }
        }
    }
out:
    close(nl);
    return found;
}

static VALUE native_listen_queue(VALUE self, VALUE vfd)
{
    int fd = NUM2INT(vfd);
    int domain = 0;
    socklen_t dlen = sizeof(domain);
    unsigned queued = 0, backlog = 0;
    struct stat st;

    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) != 0) return Qnil;
    if (domain == AF_INET || domain == AF_INET6) {
        if (tcp_queue(fd, &queued, &backlog) != 0) return Qnil;
    } else if (domain == AF_UNIX) {
        if (fstat(fd, &st) != 0 || unix_queue(st.st_ino, &queued, &backlog) != 0) return Qnil;
    } else {
        return Qnil;
    }
    return rb_assoc_new(UINT2NUM(queued), UINT2NUM(backlog));
}

#else /* not Linux: the kernel does not tell us */

static VALUE native_listen_queue(VALUE self, VALUE vfd)
{
    return Qnil;
}

#endif

void bb_init_queue(void)
{
    rb_define_module_function(bb_mNative, "listen_queue", native_listen_queue, 1);
}
