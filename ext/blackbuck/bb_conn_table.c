/*
 * bb_conn_table.c - the thread-shared part of Native::Conn: the table of open connections by fd,
 * which the hand-off watcher thread (bb_handoff.c) reads without the GVL, its one lock, and moving a
 * connection to another worker (bb_pass.c): by the watcher (bb_conn_pass), by the loop thread
 * (Conn#pass, Conn#pass_request), and taking one in (Conn.receive).
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
#include <sys/syscall.h>
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
 * bb_conn_pass(fd, pidfd, sock, now, owner): called by the hand-off watcher thread while the worker's
 * Ruby thread runs the app (never touches Ruby; owner 0: only a connection in the poller), or by the
 * loop thread that owns the connection (owner 1: Conn#pass, with app threads). When fd is a connection waiting between requests
 * (IDLE, nothing of it read into user space, no output queued, no PROXY header due), sends it over
 * sock (bb_pass_send) and marks it moved: 1. Not such a connection (or no byte of a request is
 * there: the client closed): 0. The send failed: -1 with
 * errno (EAGAIN: the queue is full). pidfd >= 0: fd is a number in the worker's fd table, not the
 * caller's (bb_handoff.c's private table); the socket is taken with pidfd_getfd to be sent.
 */
/* Readable is not enough: a client that closed is readable too (end of input), and the worker
 * drops it itself rather than another worker taking it to read nothing. At least one byte waits. */
static int request_waiting(int fd)
{
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
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

/* After a hand-off send: r and err are what bb_pass_send (or pidfd_getfd) returned and set. */
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

int bb_conn_pass(int fd, int pidfd, int sock, double now, int owner)
{
    struct conn *c;
    struct bb_pass p;
    int r = 0, send_fd = fd, err = 0;
    pthread_mutex_lock(&bb_conn_table.lock);
    c = fd >= 0 && fd < bb_conn_table.cap ? bb_conn_table.by_fd[fd] : NULL;
    if (c && c->fd == fd && !c->moved && __atomic_load_n(&c->state, __ATOMIC_RELAXED) == BB_CONN_IDLE &&
        c->off == c->len && !queued(c) && !c->proxy && (c->watched || owner)) {
        pass_record(c, &p, now);
#ifdef SYS_pidfd_getfd
        if (pidfd >= 0) send_fd = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
#endif
        if (send_fd < 0) { /* the socket could not be taken to send (EMFILE in the watcher's table...) */
            err = errno;
            r = -1;
            pass_sent(r, err);
        } else if (request_waiting(send_fd)) {
            r = bb_pass_send(sock, send_fd, &p, NULL, 0);
            err = errno;
            pass_sent(r, err);
            if (r == 0) {
                c->moved = 1;
                r = 1;
            }
        }
        if (send_fd != fd && send_fd >= 0) close(send_fd); /* the message holds the socket now */
    }
    pthread_mutex_unlock(&bb_conn_table.lock);
    if (owner && r < 0) bb_conn_pass_report(); /* the loop thread: it may log */
    if (r < 0) errno = err;
    return r;
}

/* Descriptors a worker keeps free when it takes a moved connection (for what the app and the
 * responses open: files, spill files, file bodies). With fewer it leaves the connection queued for a
 * worker with room (Conn.receive). */
#define BB_RECEIVE_FD_RESERVE 32

/*
 * Conn.receive(sock_fd, listeners, wake_fd = nil) -> a connection another worker moved here, nil
 * when none is queued, or false for a message that could not be used (its socket is closed).
 * listeners: for each listener index, [env_template, tcp]. wake_fd: the hand-off socket's send end.
 * Raises Errno::EMFILE (or ENFILE) when this worker has fewer than BB_RECEIVE_FD_RESERVE descriptors
 * free (bb_pass_room) and something is queued: nothing is taken, a connection stays queued for
 * another worker, and the wake-up this worker took for it goes to the others (bb_pass_wake; the
 * caller stops polling the socket). Raises Errno::ECONNABORTED when the kernel dropped the socket
 * anyway (the table filled up in between): that connection is lost. Both are counted in the
 * worker's scoreboard slot.
 */
static VALUE conn_s_receive(int argc, VALUE *argv, VALUE klass)
{
    static char carried[BB_PASS_BYTES_MAX]; /* the loop thread's alone */
    size_t carried_len = 0;
    struct bb_pass p;
    VALUE sock, listeners, wake, entry, addr, obj;
    struct conn *c;
    int fd, next;
    rb_scan_args(argc, argv, "21", &sock, &listeners, &wake);
    /* A look first (one syscall, as the receive it replaces when nothing is queued: callers try
     * often), then the room check (a dup, a close, a getrlimit) only for a message. */
    next = bb_pass_next(NUM2INT(sock));
    if (next == BB_PASS_NEXT_NONE) return Qnil;
    if (!bb_pass_room(NUM2INT(sock), BB_RECEIVE_FD_RESERVE)) {
        int err = errno;
        if (next == BB_PASS_NEXT_CONN) {
            bb_pass_failed(BB_HANDOFF_REFUSED);
            if (!NIL_P(wake)) bb_pass_wake(NUM2INT(wake)); /* (a full queue wakes them anyway) */
        }
        errno = err;
        rb_sys_fail("no descriptor free to take a moved connection");
    }
    fd = bb_pass_recv(NUM2INT(sock), &p, carried, sizeof(carried), &carried_len);
    if (fd < 0) {
        if (errno == EAGAIN) return Qnil;
        if (errno == EBADMSG) return Qfalse;
        if (errno == ECONNABORTED) {
            VALUE what = rb_sprintf("the kernel dropped a moved connection (from %s): no descriptor free",
                                    p.addr[0] ? p.addr : "a UNIX socket");
            bb_pass_failed(BB_HANDOFF_LOST);
            errno = ECONNABORTED;
            rb_sys_fail_str(what);
        }
        rb_sys_fail("receiving a moved connection");
    }
    Check_Type(listeners, T_ARRAY);
    entry = p.listener < (uint32_t)RARRAY_LEN(listeners) ? RARRAY_AREF(listeners, p.listener) : Qnil;
    if (!RB_TYPE_P(entry, T_ARRAY) || RARRAY_LEN(entry) < 2) {
        close(fd);
        return Qfalse;
    }
    addr = p.addr[0] ? bb_fstring(p.addr, (long)strlen(p.addr)) : Qnil;
    obj = bb_conn_alloc(klass);
    c = get_conn(obj);
    bb_conn_setup(c, fd, addr, RARRAY_AREF(entry, 0), RTEST(RARRAY_AREF(entry, 1)), 0, (int)p.listener);
    c->requests = (long)p.requests;
    c->moved_ready = p.ready_at;
    if (carried_len > 0) { /* a request the sender had read: parse it first (Conn#buffered says so) */
        if (carried_len > c->cap) {
            char *nb = carried_len <= buf_limit() ? realloc(c->buf, carried_len) : NULL;
            if (!nb) { /* cannot hold it: the client sees a close and may retry */
                bb_conn_close(obj);
                return Qfalse;
            }
            c->buf = nb;
            c->cap = carried_len;
        }
        memcpy(c->buf, carried, carried_len);
        c->len = carried_len;
        c->woke_at = p.ready_at;
        c->moved_ready = 0;
    }
    return obj;
}

/* pass(sock_fd) -> true when the connection went to another worker over sock_fd (the hand-off
 * socket; then close it here and forget it), false when it is not one that may move (see
 * bb_conn_pass) or the queue is full. The worker's loop thread moves its own connections this way
 * when all its app threads are busy (Worker's --threads). */
static VALUE conn_pass(VALUE self, VALUE sock)
{
    struct conn *c = get_conn(self);
    struct timespec ts;
    if (c->fd < 0) return Qfalse;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return bb_conn_pass(c->fd, -1, NUM2INT(sock), (double)ts.tv_sec + ts.tv_nsec / 1e9, 1) == 1 ? Qtrue : Qfalse;
}

/* pass_request(sock_fd) -> true when the connection went to another worker over sock_fd with the
 * request parse returned last, not yet started (its bytes travel in the message and the receiver
 * parses them again; close it here and forget it). False when that request cannot move: it has a
 * body, more bytes came behind it, a response has started, or it is larger than a message carries.
 * Nil when the queue is full. The loop thread takes back this way a request it had queued for its
 * app threads while they are all busy, when another worker has a free one. */
static VALUE conn_pass_request(VALUE self, VALUE sock)
{
    struct conn *c = get_conn(self);
    struct bb_pass p;
    int r, err;
    if (c->fd < 0 || c->moved || c->replay_len == 0 || c->replay_len > BB_PASS_BYTES_MAX || c->len != 0 ||
        queued(c) || c->out.file_fd >= 0 || c->proxy)
        return Qfalse;
    pass_record(c, &p, c->woke_at > 0 ? c->woke_at : mono_now());
    pthread_mutex_lock(&bb_conn_table.lock); /* the watcher thread reads moved under it */
    r = bb_pass_send(NUM2INT(sock), c->fd, &p, c->buf + c->replay_off, c->replay_len);
    err = errno;
    pass_sent(r, err);
    if (r == 0) c->moved = 1;
    pthread_mutex_unlock(&bb_conn_table.lock);
    if (r == 0) return Qtrue;
    if (err == EAGAIN) return Qnil;
    bb_conn_pass_report(); /* a failed send (counted): the request stays queued here */
    return Qfalse;
}

void bb_init_conn_table(VALUE cConn)
{
    rb_define_singleton_method(cConn, "receive", conn_s_receive, -1);
    rb_define_method(cConn, "pass", conn_pass, 1);
    rb_define_method(cConn, "pass_request", conn_pass_request, 1);
}
