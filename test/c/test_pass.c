/*
 * test_pass.c - bb_pass_send / bb_pass_recv (ext/blackbuck/bb_pass.c) under ASan/UBSan:
 * a connection's socket and record cross a SEQPACKET pair intact, its unread request bytes
 * travel with it, bytes already read travel in the message, a full queue says EAGAIN, malformed messages are refused with every fd they
 * carried closed, a receiver out of descriptors is told before it takes one (bb_pass_room) and told
 * when the kernel dropped one, wake-ups are told apart and skipped, and no descriptor leaks (counted in /proc/self/fd before and after).
 */
#define _GNU_SOURCE
#include "bb_pass.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static char carried[256]; /* request bytes a message carries */
static size_t carried_len;

static void pair(int type, int sv[2])
{
    if (socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        exit(2);
    }
}

static void test_round_trip(int chan[2])
{
    int conn[2], got, flags;
    char buf[64];
    ssize_t n;
    struct bb_pass p, q;

    pair(SOCK_STREAM, conn);
    memset(&p, 0, sizeof(p));
    p.listener = 3;
    p.flags = BB_PASS_TCP;
    p.requests = 41;
    p.ready_at = 12345.5;
    strcpy(p.addr, "2001:db8::ffff:192.0.2.128");
    /* the client's next request is waiting, unread, when the socket moves */
    CHECK(write(conn[1], "GET /next HTTP/1.1\r\n\r\n", 22) == 22, "client write");
    CHECK(bb_pass_send(chan[0], conn[0], &p, NULL, 0) == 0, "send: %s", strerror(errno));
    close(conn[0]); /* the sender lets go; the socket lives on in the message */
    memset(&q, 0xAA, sizeof(q));
    got = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len);
    CHECK(got >= 0, "recv: %s", strerror(errno));
    if (got < 0) return;
    CHECK(carried_len == 0, "no bytes carried (%zu)", carried_len);
    CHECK(q.listener == 3 && q.flags == BB_PASS_TCP && q.requests == 41 && q.ready_at == 12345.5,
          "record fields differ");
    CHECK(strcmp(q.addr, p.addr) == 0, "addr %s", q.addr);
    flags = fcntl(got, F_GETFD);
    CHECK(flags >= 0 && (flags & FD_CLOEXEC), "received fd is close-on-exec");
    n = read(got, buf, sizeof(buf));
    CHECK(n == 22 && memcmp(buf, "GET /next", 9) == 0, "the request bytes travel with the socket (%zd)", n);
    CHECK(write(got, "HTTP/1.1 200 OK\r\n\r\n", 19) == 19, "answer on the moved socket");
    n = read(conn[1], buf, sizeof(buf));
    CHECK(n == 19, "client reads the answer (%zd)", n);
    close(got);
    n = read(conn[1], buf, sizeof(buf));
    CHECK(n == 0, "client sees the close once the last holder closes (%zd)", n);
    close(conn[1]);
}

/* A request the sender already read (queued for its busy app threads) travels in the message; what
 * the client sends after it stays in the socket, behind it. */
static void test_carried_bytes(int chan[2])
{
    static const char first[] = "GET /queued HTTP/1.1\r\nHost: x\r\n\r\n";
    int conn[2], got;
    char buf[64];
    ssize_t n;
    struct bb_pass p, q;

    pair(SOCK_STREAM, conn);
    memset(&p, 0, sizeof(p));
    p.requests = 7;
    CHECK(write(conn[1], "GET /after HTTP/1.1\r\n\r\n", 23) == 23, "client write");
    CHECK(bb_pass_send(chan[0], conn[0], &p, first, sizeof(first) - 1) == 0, "send with bytes: %s", strerror(errno));
    close(conn[0]);
    got = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len);
    CHECK(got >= 0, "recv with bytes: %s", strerror(errno));
    if (got < 0) return;
    CHECK(q.requests == 7, "the record comes before the bytes");
    CHECK(carried_len == sizeof(first) - 1 && memcmp(carried, first, carried_len) == 0, "the bytes arrive whole (%zu)",
          carried_len);
    n = read(got, buf, sizeof(buf));
    CHECK(n == 23 && memcmp(buf, "GET /after", 10) == 0, "the socket's own bytes follow (%zd)", n);
    close(got);
    close(conn[1]);

    /* more than the receiver has room for: refused, its fd closed */
    pair(SOCK_STREAM, conn);
    CHECK(bb_pass_send(chan[0], conn[0], &p, first, sizeof(first) - 1) == 0, "send");
    got = bb_pass_recv(chan[1], &q, carried, 8, &carried_len);
    CHECK(got == -1 && errno == EBADMSG, "bytes over the receiver's room: EBADMSG");
    if (got >= 0) close(got);
    CHECK(bb_pass_send(chan[0], conn[0], &p, first, BB_PASS_BYTES_MAX + 1) == -1 && errno == EMSGSIZE,
          "over BB_PASS_BYTES_MAX: EMSGSIZE, nothing sent");
    close(conn[0]);
    close(conn[1]);
}

static void test_empty_queue(int chan[2])
{
    struct bb_pass q;
    errno = 0;
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EAGAIN, "empty queue: EAGAIN (%s)", strerror(errno));
}

static void test_long_addr_cut(int chan[2])
{
    int conn[2], got;
    struct bb_pass p, q;
    pair(SOCK_STREAM, conn);
    memset(&p, 0, sizeof(p));
    memset(p.addr, 'x', sizeof(p.addr)); /* no NUL: the sender terminates it */
    CHECK(bb_pass_send(chan[0], conn[0], &p, NULL, 0) == 0, "send");
    got = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len);
    CHECK(got >= 0 && strlen(q.addr) == BB_PASS_ADDR_MAX, "addr cut to BB_PASS_ADDR_MAX");
    if (got >= 0) close(got);
    close(conn[0]);
    close(conn[1]);
}

/* A full queue refuses without blocking or losing a socket; draining gives back every one. */
static void test_full_queue(void)
{
    int chan[2], sent = 0, got = 0, i, fd, sz = 4096;
    int conn[2];
    struct bb_pass p, q;
    pair(SOCK_SEQPACKET, chan);
    setsockopt(chan[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    pair(SOCK_STREAM, conn);
    memset(&p, 0, sizeof(p));
    for (i = 0; i < 100000; i++) {
        p.requests = i;
        if (bb_pass_send(chan[0], conn[0], &p, NULL, 0) != 0) break;
        sent++;
    }
    CHECK(i < 100000 && errno == EAGAIN, "a full queue says EAGAIN (after %d, %s)", sent, strerror(errno));
    CHECK(sent > 0, "some were sent before it filled");
    while ((fd = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len)) >= 0) {
        CHECK(q.requests == got, "in order: %ld vs %d", (long)q.requests, got);
        got++;
        close(fd);
    }
    CHECK(got == sent, "every queued socket comes back (%d of %d)", got, sent);
    close(conn[0]);
    close(conn[1]);
    close(chan[0]);
    close(chan[1]);
}

static void send_raw(int sock, const void *data, size_t len, const int *fds, int nfds)
{
    struct iovec iov = {(void *)data, len};
    struct msghdr msg;
    union {
        char buf[CMSG_SPACE(sizeof(int) * 8)];
        struct cmsghdr align;
    } ctl;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds) {
        struct cmsghdr *cm;
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    if (sendmsg(sock, &msg, 0) < 0) {
        perror("sendmsg");
        exit(2);
    }
}

/* Stray or broken messages: refused with EBADMSG, every fd they carried closed. */
static void test_malformed(int chan[2])
{
    int conn[2], fds[3], before;
    struct bb_pass q;
    char junk[256];
    uint32_t magic = 0x42425031u;

    pair(SOCK_STREAM, conn);
    before = open_fds();
    memset(junk, 0, sizeof(junk));
    memcpy(junk, &magic, sizeof(magic));

    send_raw(chan[0], "x", 1, NULL, 0); /* short, no fd */
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EBADMSG, "short message: EBADMSG");

    fds[0] = dup(conn[0]);
    send_raw(chan[0], "short", 5, fds, 1); /* short, with an fd */
    close(fds[0]);
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EBADMSG, "short message with an fd: EBADMSG");
    CHECK(open_fds() == before, "its fd was closed (%d vs %d)", open_fds(), before);

    /* a record of the right size and magic but no fd */
    send_raw(chan[0], junk, sizeof(uint32_t) + sizeof(struct bb_pass), NULL, 0);
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EBADMSG, "no fd: EBADMSG");

    /* ... with three fds */
    fds[0] = dup(conn[0]), fds[1] = dup(conn[0]), fds[2] = dup(conn[1]);
    send_raw(chan[0], junk, sizeof(uint32_t) + sizeof(struct bb_pass), fds, 3);
    close(fds[0]), close(fds[1]), close(fds[2]);
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EBADMSG, "three fds: EBADMSG");
    CHECK(open_fds() == before, "all three closed (%d vs %d)", open_fds(), before);

    /* wrong magic, right size, one fd */
    memset(junk, 0x5A, sizeof(junk));
    fds[0] = dup(conn[0]);
    send_raw(chan[0], junk, sizeof(uint32_t) + sizeof(struct bb_pass), fds, 1);
    close(fds[0]);
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EBADMSG, "wrong magic: EBADMSG");
    CHECK(open_fds() == before, "its fd was closed (%d vs %d)", open_fds(), before);

    /* too long: truncated by the kernel */
    fds[0] = dup(conn[0]);
    send_raw(chan[0], junk, sizeof(junk), fds, 1);
    close(fds[0]);
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EBADMSG, "too long: EBADMSG");
    CHECK(open_fds() == before, "its fd was closed (%d vs %d)", open_fds(), before);

    test_empty_queue(chan); /* nothing left behind */
    close(conn[0]);
    close(conn[1]);
}

/* A receiver out of descriptors: bb_pass_room says so before anything is taken, so the message stays
 * queued whole for a receiver with room; one received anyway reports its dropped socket
 * (ECONNABORTED, with its record) rather than a malformed message. RLIMIT_NOFILE is lowered around
 * each call only. */
static void test_no_room(int chan[2])
{
    struct rlimit saved, rl;
    int conn[2], got, lowest;
    char b;
    struct bb_pass p, q;

    pair(SOCK_STREAM, conn);
    memset(&p, 0, sizeof(p));
    p.requests = 5;
    strcpy(p.addr, "192.0.2.7");
    CHECK(bb_pass_room(chan[1], 16) == 1, "room with many descriptors free");
    CHECK(bb_pass_send(chan[0], conn[0], &p, NULL, 0) == 0, "send: %s", strerror(errno));
    lowest = dup(chan[1]);
    close(lowest);
    CHECK(getrlimit(RLIMIT_NOFILE, &saved) == 0, "getrlimit");
    rl = saved;
    rl.rlim_cur = (rlim_t)lowest + 4; /* 4 free */
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit: %s", strerror(errno));
    CHECK(bb_pass_room(chan[1], 0) == 1, "4 free, no reserve: room");
    CHECK(bb_pass_room(chan[1], 3) == 1, "4 free, a reserve of 3: room");
    errno = 0;
    CHECK(bb_pass_room(chan[1], 4) == 0 && errno == EMFILE, "4 free, a reserve of 4: none (%s)", strerror(errno));
    rl.rlim_cur = (rlim_t)lowest; /* none free */
    setrlimit(RLIMIT_NOFILE, &rl);
    errno = 0;
    CHECK(bb_pass_room(chan[1], 0) == 0 && errno == EMFILE, "none free: no room (%s)", strerror(errno));
    setrlimit(RLIMIT_NOFILE, &saved);
    got = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len);
    CHECK(got >= 0 && q.requests == 5, "the message stayed queued whole (%s)", strerror(errno));
    if (got >= 0) close(got);

    CHECK(bb_pass_send(chan[0], conn[0], &p, NULL, 0) == 0, "send");
    rl.rlim_cur = (rlim_t)lowest;
    setrlimit(RLIMIT_NOFILE, &rl);
    memset(&q, 0, sizeof(q));
    got = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len);
    setrlimit(RLIMIT_NOFILE, &saved);
    CHECK(got == -1 && errno == ECONNABORTED, "received with none free: ECONNABORTED (%d, %s)", got, strerror(errno));
    if (got >= 0) close(got);
    CHECK(q.requests == 5 && strcmp(q.addr, "192.0.2.7") == 0, "with its record");
    test_empty_queue(chan); /* it was taken off the queue */
    close(conn[0]);
    CHECK(read(conn[1], &b, 1) == 0, "the dropped socket is gone with the sender's copy: the client sees the end");
    close(conn[1]);
}

/* A wake-up (bb_pass_wake) is no connection: bb_pass_next tells it from one without taking either,
 * and bb_pass_recv skips it, so the connection behind it is received and nothing after. */
static void test_wake(int chan[2])
{
    int conn[2], got;
    struct bb_pass p, q;

    pair(SOCK_STREAM, conn);
    memset(&p, 0, sizeof(p));
    p.requests = 9;
    CHECK(bb_pass_next(chan[1]) == BB_PASS_NEXT_NONE, "nothing queued: NONE");
    CHECK(bb_pass_wake(chan[0]) == 0, "wake: %s", strerror(errno));
    CHECK(bb_pass_next(chan[1]) == BB_PASS_NEXT_WAKE, "a wake-up first: WAKE");
    CHECK(bb_pass_next(chan[1]) == BB_PASS_NEXT_WAKE, "a look takes nothing");
    CHECK(bb_pass_send(chan[0], conn[0], &p, NULL, 0) == 0, "send");
    CHECK(bb_pass_wake(chan[0]) == 0, "wake");
    got = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len);
    CHECK(got >= 0 && q.requests == 9, "the connection behind a wake-up is received (%s)", strerror(errno));
    if (got >= 0) close(got);
    CHECK(bb_pass_next(chan[1]) == BB_PASS_NEXT_WAKE, "the wake-up behind it stays");
    CHECK(bb_pass_send(chan[0], conn[0], &p, NULL, 0) == 0, "send");
    CHECK(bb_pass_next(chan[1]) == BB_PASS_NEXT_WAKE, "still a wake-up first");
    got = bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len);
    CHECK(got >= 0, "recv skips it: %s", strerror(errno));
    if (got >= 0) close(got);
    CHECK(bb_pass_wake(chan[0]) == 0, "wake");
    CHECK(bb_pass_recv(chan[1], &q, carried, sizeof(carried), &carried_len) == -1 && errno == EAGAIN,
          "wake-ups alone: EAGAIN, and they are gone");
    CHECK(bb_pass_next(chan[1]) == BB_PASS_NEXT_NONE, "nothing left");
    close(conn[0]);
    close(conn[1]);
}

int main(void)
{
    int chan[2], before = open_fds();
    pair(SOCK_SEQPACKET, chan);
    test_empty_queue(chan);
    test_round_trip(chan);
    test_carried_bytes(chan);
    test_long_addr_cut(chan);
    test_malformed(chan);
    test_no_room(chan);
    test_wake(chan);
    close(chan[0]);
    close(chan[1]);
    test_full_queue();
    CHECK(open_fds() == before, "no fd leaked (%d vs %d)", open_fds(), before);
    printf("test_pass: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
