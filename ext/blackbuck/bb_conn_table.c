/*
 * bb_conn_table.c - the thread-shared part of Native::Conn: the table of open connections by fd,
 * which the hand-off watcher thread (bb_handoff.c) reads without the GVL, its one lock, and moving a
 * connection to another worker (bb_pass.c): sending one (bb_conn_pass: the watcher, and the loop
 * thread's Conn#pass; bb_conn_pass_request: Conn#pass_request) and taking one in (bb_conn_take:
 * Conn.receive). The Ruby methods are bb_conn.c's; this file calls no other file of Native::Conn
 * (the call graph in docs/ARCHITECTURE.md).
 *
 * Locking rules, all here: the table (bb_conn_table: by_fd, cap) and a Conn's `moved` are written
 * and read under bb_conn_table.lock; the worker's Ruby thread puts and drops a Conn (table_put,
 * table_drop in bb_conn_int.h) on setup and close; the watcher reads a Conn's state, buffer and queue
 * only under the lock and only while the loop is held off (loop_lock, bb_handoff.c).
 */
#include "bb_conn_int.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

struct bb_conn_table bb_conn_table = {NULL, 0, PTHREAD_MUTEX_INITIALIZER};

int bb_conn_table_grow(int fd)
{
    int ncap = bb_conn_table.cap ? bb_conn_table.cap : 256;
    struct conn **nt;
    while (ncap <= fd) ncap *= 2;
    nt = realloc(bb_conn_table.by_fd, sizeof(*nt) * (size_t)ncap);
    if (!nt) return -1;
    memset(nt + bb_conn_table.cap, 0, sizeof(*nt) * (size_t)(ncap - bb_conn_table.cap));
    bb_conn_table.by_fd = nt;
    bb_conn_table.cap = ncap;
    return 0;
}

/*
 * bb_conn_pass(fd, sock, now, owner): called by the hand-off watcher thread while the worker's
 * Ruby thread runs the app (never touches Ruby; owner BB_PASS_WATCHER: only a connection in the
 * poller), or by the loop thread that owns the connection (BB_PASS_OWNER: Conn#pass, with app
 * threads; BB_PASS_IDLE: Conn#pass_idle, a retiring worker's idle connections, whose next request
 * has not begun). When fd is a connection waiting between requests (IDLE, nothing of it read into
 * user space, no output queued, no PROXY header due) with a request waiting (BB_PASS_IDLE: or none
 * yet), sends it over sock (bb_pass_send) and marks it moved: 1. Not such a connection (or the
 * client closed): 0. The send failed: -1 with errno (EAGAIN: the queue is full).
 */
/* Readable is not enough: a client that closed is readable too (end of input), and the worker
 * drops it itself rather than another worker taking it to read nothing. At least one byte waits. */
static int request_waiting(int fd)
{
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* 1: a byte waits; 0: nothing yet (the client is quiet); -1: the client closed, or the socket failed. */
static int peer_state(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return 1;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
}

/* What travels with c's socket: where it came from, how many requests it has had, since when its
 * request waits. */
static void pass_record(const struct conn *c, struct bb_pass *p, double ready_at)
{
    memset(p, 0, sizeof(*p));
    p->listener = (uint32_t)c->listener;
    p->flags = c->tcp ? BB_PASS_TCP : 0;
    p->requests = c->requests;
    p->ready_at = ready_at;
    memcpy(p->addr, c->peer, sizeof(p->addr));
}

/* Hand-off sends that failed other than for a full queue (the connection stays with its worker either
 * way: nothing was sent). Each is counted in the worker's scoreboard slot at once; a run of them, until
 * a send goes through, is logged once by bb_conn_pass_report, from a thread that may call Ruby. */
static int pass_failing;        /* atomic: errno of the current run's first failure; 0: moves go through */
static int pass_failing_logged; /* atomic: the current run is logged */

/* After a hand-off send: r and err are what bb_pass_send returned and set. */
static void pass_sent(int r, int err)
{
    int none = 0;
    if (r == 0) {
        if (__atomic_load_n(&pass_failing, __ATOMIC_RELAXED)) {
            __atomic_store_n(&pass_failing, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&pass_failing_logged, 0, __ATOMIC_RELAXED);
        }
        return;
    }
    if (err == EAGAIN) return; /* a full queue: the connection waits here for this worker, by design */
    bb_pass_failed(BB_HANDOFF_SEND_FAILED);
    __atomic_compare_exchange_n(&pass_failing, &none, err ? err : EIO, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

void bb_conn_pass_report(void)
{
    int err = __atomic_load_n(&pass_failing, __ATOMIC_RELAXED);
    if (!err || __atomic_exchange_n(&pass_failing_logged, 1, __ATOMIC_RELAXED)) return;
    bb_warn(rb_sprintf("hand-off: a connection could not move to another worker (%s); it stays with this one "
                       "(counted in blackbuck_handoff_failures_total{reason=\"send\"}; logged once until a move "
                       "goes through)", strerror(err)));
}

int bb_conn_pass(int fd, int sock, double now, int owner)
{
    struct conn *c;
    struct bb_pass p;
    int r = 0, err = 0, waiting = 0;
    pthread_mutex_lock(&bb_conn_table.lock);
    c = fd >= 0 && fd < bb_conn_table.cap ? bb_conn_table.by_fd[fd] : NULL;
    if (c && c->fd == fd && !c->moved && __atomic_load_n(&c->state, __ATOMIC_RELAXED) == BB_CONN_IDLE &&
        c->off == c->len && !queued(c) && !c->proxy && (c->watched || owner != BB_PASS_WATCHER) &&
        (owner == BB_PASS_IDLE ? (waiting = peer_state(fd)) >= 0 : (waiting = request_waiting(fd)))) {
        pass_record(c, &p, waiting ? now : 0); /* 0: no request waits yet (its queue time starts when one comes) */
        r = bb_pass_send(sock, fd, &p, NULL, 0);
        err = errno;
        pass_sent(r, err);
        if (r == 0) {
            c->moved = 1;
            r = 1;
        }
    }
    pthread_mutex_unlock(&bb_conn_table.lock);
    if (owner && r < 0) bb_conn_pass_report(); /* the loop thread: it may log */
    if (r < 0) errno = err;
    return r;
}

/* Descriptors a worker keeps free when it takes a moved connection (for what the app and the
 * responses open: files, spill files, file bodies). With fewer it leaves the connection queued for a
 * worker with room (bb_conn_take). */
#define BB_RECEIVE_FD_RESERVE 32
/* Descriptors a worker keeps free when it takes a moved connection that no worker with
 * BB_RECEIVE_FD_RESERVE to spare took (Balancer#adopt, after BB_RECEIVE_STRANDED_SECONDS): the
 * connection's own, and a few for what its request opens. */
#define BB_RECEIVE_FD_RESERVE_LAST 4

/*
 * bb_conn_take(sock, wake, last, p, bytes, cap, len) -> the fd of a connection another worker moved here,
 * with its record in *p and the bytes of a request the sender had read in bytes[0, *len);
 * BB_TAKE_NONE when none is queued, BB_TAKE_UNUSABLE for a message that could not be used (its
 * socket is closed). wake: the hand-off socket's send end, or -1. Raises Errno::EMFILE (or ENFILE)
 * when this worker has fewer than BB_RECEIVE_FD_RESERVE descriptors free (BB_RECEIVE_FD_RESERVE_LAST
 * when last is set: no worker with room took it, and it must not be stranded) (bb_pass_room) and
 * something is queued: nothing is taken, a connection stays queued for another worker, and the
 * wake-up this worker took for it goes to the others (bb_pass_wake; the caller stops polling the
 * socket). Raises Errno::ECONNABORTED when the kernel dropped the socket anyway (the table filled up
 * in between): that connection is lost. Both are counted in the worker's scoreboard slot.
 */
int bb_conn_take(int sock, int wake, int last, struct bb_pass *p, char *bytes, size_t cap, size_t *len)
{
    int fd, next;
    *len = 0;
    /* A look first (one syscall, as the receive it replaces when nothing is queued: callers try
     * often), then the room check (a dup, a close, a getrlimit) only for a message. */
    next = bb_pass_next(sock);
    if (next == BB_PASS_NEXT_NONE) return BB_TAKE_NONE;
    if (!bb_pass_room(sock, last ? BB_RECEIVE_FD_RESERVE_LAST : BB_RECEIVE_FD_RESERVE)) {
        int err = errno;
        if (next == BB_PASS_NEXT_CONN) {
            bb_pass_failed(BB_HANDOFF_REFUSED);
            if (wake >= 0) bb_pass_wake(wake); /* (a full queue wakes them anyway) */
        }
        errno = err;
        rb_sys_fail("no descriptor free to take a moved connection");
    }
    fd = bb_pass_recv(sock, p, bytes, cap, len);
    if (fd >= 0) return fd;
    if (errno == EAGAIN) return BB_TAKE_NONE;
    if (errno == EBADMSG) return BB_TAKE_UNUSABLE;
    if (errno == ECONNABORTED) {
        VALUE what = rb_sprintf("the kernel dropped a moved connection (from %s): no descriptor free",
                                p->addr[0] ? p->addr : "a UNIX socket");
        bb_pass_failed(BB_HANDOFF_LOST);
        errno = ECONNABORTED;
        rb_sys_fail_str(what);
    }
    rb_sys_fail("receiving a moved connection");
    return BB_TAKE_NONE; /* not reached */
}

/*
 * bb_conn_pass_request(c, sock) -> 1 when c went to another worker over sock with the request parse
 * returned last, not yet started (its bytes travel in the message and the receiver parses them
 * again); 0 when that request cannot move (it has a body, more bytes came behind it, a response has
 * started, it is larger than a message carries) or the send failed (counted and logged: it stays
 * here); -1 when the queue is full. The loop thread's (Conn#pass_request).
 */
int bb_conn_pass_request(struct conn *c, int sock)
{
    struct bb_pass p;
    int r, err;
    if (c->fd < 0 || c->moved || c->replay_len == 0 || c->replay_len > BB_PASS_BYTES_MAX || c->len != 0 ||
        queued(c) || c->out.file_fd >= 0 || c->proxy)
        return 0;
    pass_record(c, &p, c->woke_at > 0 ? c->woke_at : mono_now());
    pthread_mutex_lock(&bb_conn_table.lock); /* the watcher thread reads moved under it */
    r = bb_pass_send(sock, c->fd, &p, c->buf + c->replay_off, c->replay_len);
    err = errno;
    pass_sent(r, err);
    if (r == 0) c->moved = 1;
    pthread_mutex_unlock(&bb_conn_table.lock);
    if (r == 0) return 1;
    if (err == EAGAIN) return -1;
    bb_conn_pass_report(); /* a failed send (counted): the request stays queued here */
    return 0;
}
