/*
 * bb_conn.c - Blackbuck::Native::Conn: one client connection of a worker.
 *
 * It owns the socket (a raw non-blocking fd), the read buffer, the request-body
 * framing state and any response bytes the client has not accepted yet. The worker
 * (Ruby) drives it:
 *
 *   fill          -> n > 0 bytes read | 0 EOF or error | nil would block
 *   parse_proxy   -> true (PROXY protocol header taken) | false (not one: close, answer nothing)
 *                    | nil incomplete; only on a proxy_protocol listener, before the first parse
 *   parse         -> env Hash | nil incomplete | Integer HTTP status (bad request)
 *   body_take     -> String of body bytes now available | Integer status (bad body)
 *   write_response(status, headers, body_array_or_nil)
 *                 -> WRITE_DONE | WRITE_PENDING (rest queued, wait for OUT)
 *                    | STREAM_CHUNKED / STREAM_RAW (head sent or queued, caller writes the body)
 *                    | WRITE_FAILED
 *   write_file(status, headers, path)
 *                 -> WRITE_DONE | WRITE_PENDING | WRITE_FAILED | nil (not sendable from the file)
 *   write_part / finish_body (streaming), write_continue, write_hints, flush,
 *   write_error(status)
 *   shutdown_write -> true (linger: discard_input until EOF) | false (close now); close; detach (hijack)
 *   Conn.receive(sock, listeners) -> a connection another worker moved here (bb_handoff.c), or nil
 *
 * Output the client does not take at once is queued, in order: in memory up to response_buffer
 * bytes, then in an anonymous spill file in $TMPDIR up to max_response_spill bytes; flush sends
 * memory first, then the spill file, then a response's file body (write_file), which is always
 * the last thing queued. Only output that fits in neither (past the cap, or the file could not be
 * written) makes a write wait for the client, at most write_timeout_ms while it takes nothing.
 */
#include "bb_ext.h"
#include "bb_pass.h"
#include "bb_proxy.h"

#include <pthread.h>
#include <sys/syscall.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#ifdef HAVE_SYS_SENDFILE_H
#include <sys/sendfile.h>
#endif

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif
/* iovecs kept on the stack for a response; larger Array bodies use a Ruby-owned buffer. */
#define BB_IOV_STACK 64
/* A connection's memory queue starts at this many bytes and doubles up to response_buffer. */
#define BB_OUT_INITIAL (16 * 1024)
/* Bytes one flush sends from a spill file at most, so a fast reader of a large spilled response
 * does not keep the worker from its other connections (the event loop comes back to it). */
#define BB_SPILL_FLUSH_MAX (4 * 1024 * 1024)
/* Bytes copied per pread/write where sendfile(2) is not available. */
#define BB_SPILL_COPY_CHUNK (64 * 1024)
/* Bytes one flush sends from a response's file body at most (a download served with sendfile), for
 * the same reason as BB_SPILL_FLUSH_MAX: a fast reader of a large file gets its next turn later. */
#define BB_FILE_FLUSH_MAX (4 * 1024 * 1024)
/* Bytes write_file may still add to a head once the file is open (Content-Length, Connection and
 * Date fields, the empty line): reserved before the open, so no allocation can fail while it is. */
#define BB_HEAD_TAIL_MAX 160
/* An error answer waits at most this long for a client that is not reading (it is then closed anyway). */
#define BB_ERROR_WRITE_WAIT_MS 100
/* Bytes of a Host value a connection's env_base keeps the Host entries for (a longer one: they are
 * set for every request, as for a connection whose Host changes). */
#define BB_BASE_HOST_MAX 128
/* Bytes a lingering connection's input is read in (and discarded) per read(2). */
#define BB_LINGER_READ_CHUNK (64 * 1024)
/* Bytes discarded per discard_input call at most, so one flooding client cannot keep the worker
 * reading: the event loop comes back to it. */
#define BB_LINGER_READ_MAX (1024 * 1024)

enum { BODY_NONE = 0, BODY_LENGTH = 1, BODY_CHUNKED = 2 };
enum { WRITE_DONE = 0, WRITE_PENDING = 1, STREAM_CHUNKED = 2, STREAM_RAW = 3, WRITE_FAILED = -1 };

struct conn {
    int fd;
    int tcp;
    int listener; /* index of the listener that accepted it (a moved connection keeps it) */
    int proxy; /* a PROXY protocol header is expected before the first request (proxy_protocol listener) */
    /* read buffer: unconsumed bytes are buf[off, len) */
    char *buf;
    size_t cap, off, len;
    size_t last_len; /* bytes of an incomplete head already scanned */
    /* the request being read / answered */
    int minor;
    int keepalive;
    int head_only;
    int expect_continue;
    int body_mode;
    int body_done;
    int client_close;  /* the request asked to close after its response (HTTP/1.1 close, HTTP/1.0 without keep-alive) */
    int must_linger;   /* an error was answered: the client may still be sending (see shutdown_write) */
    int drained;       /* the last read took less than it asked for: the socket had nothing more then */
    int watched;   /* the event mask it is registered with in the worker's poller; 0 = not registered */
    int64_t content_length;
    int64_t body_left;
    struct bb_chunked_decoder dec;
    /* response bytes the client has not taken yet, in this order: out[out_off, out_len) in
     * memory, then [spill_off, spill_len) of the spill file (spill_fd; -1 when not spilling) */
    char *out;
    size_t out_cap, out_off, out_len;
    int spill_fd;
    int spill_failed; /* the spill file could not be made or written: wait instead, until the next request */
    int64_t spill_off, spill_len;
    /* then a response's file body (write_file): [file_off, file_end) of file_fd; -1 when none.
     * Nothing is ever queued behind it: the next response starts once it is sent. */
    int file_fd;
    int file_copy; /* this file cannot be sendfile(2)d: pread + write instead */
    int64_t file_off, file_end;
    /* Ruby-side state */
    long requests;
    int state;
    double deadline;
    double body_started; /* monotonic seconds when the request body began (min_body_rate) */
    double woke_at;      /* monotonic seconds: the worker's wake-up whose read last brought bytes (queue time) */
    double request_start; /* wall-clock seconds of the request's X-Request-Start; 0 = none or implausible */
    double moved_ready;   /* monotonic seconds its waiting request was seen by the worker that moved it here; 0 = none */
    int moved;            /* sent to another worker (bb_conn_pass): the worker only closes its fd now */
    /* The request parse returned last, still whole in buf[replay_off, replay_off + replay_len) with no
     * body and nothing after it: until its response starts it may move with its bytes
     * (Conn#pass_request). 0 = it may not. */
    size_t replay_off, replay_len;
    char peer[BB_PASS_ADDR_MAX + 1]; /* remote_addr as C text, for bb_conn_pass (which may not touch Ruby) */
    /* The env entries that stay the same from one request of this connection to the next (the
     * template's, REMOTE_ADDR, SERVER_PROTOCOL, HTTP_VERSION, ...), made at its first keep-alive
     * request: its next requests' envs are copies of it (conn_parse). Qnil until then. */
    VALUE env_base;
    int env_base_minor; /* the HTTP minor version env_base was made for */
    size_t base_host_len; /* env_base has the Host entries of this Host value (0: it has none) */
    char base_host[BB_BASE_HOST_MAX];
    /* REQUEST_METHOD and PATH_INFO of the request parse returned last (the scoreboard shows them) */
    VALUE req_method, req_path;
    VALUE remote_addr, template, env, sink;
};

static VALUE cConn;
static long keepalive_max; /* requests per connection, then Connection: close; 0 = no cap */
static int queued(const struct conn *c);
static VALUE conn_close(VALUE self);
static size_t buf_limit(void);

/* The response head under construction. A worker builds one response at a time and copies
 * whatever the client does not take at once into that connection's own out buffer, so one
 * buffer per process serves every connection (no malloc per connection). */
static struct {
    char *buf;
    size_t cap, len;
} head;

/* Read buffers of BB_BUF_INITIAL bytes kept for reuse: a connection-per-request load would
 * otherwise malloc and free one per connection. */
#define BB_BUF_POOL 64
static char *buf_pool[BB_BUF_POOL];
static int buf_pool_n;

/* Open connections by fd, for the hand-off watcher thread (bb_handoff.c), which finds the
 * connections with a request waiting by fd and may not touch Ruby objects. Written by the worker's
 * Ruby thread on setup and close, read by the watcher: both under table_lock. */
static struct conn **by_fd;
static int by_fd_cap;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static void table_put(struct conn *c)
{
    pthread_mutex_lock(&table_lock);
    if (c->fd >= by_fd_cap) {
        int ncap = by_fd_cap ? by_fd_cap : 256;
        struct conn **nt;
        while (ncap <= c->fd) ncap *= 2;
        nt = realloc(by_fd, sizeof(*nt) * (size_t)ncap);
        if (!nt) {
            pthread_mutex_unlock(&table_lock);
            return; /* not movable, nothing else changes */
        }
        memset(nt + by_fd_cap, 0, sizeof(*nt) * (size_t)(ncap - by_fd_cap));
        by_fd = nt;
        by_fd_cap = ncap;
    }
    by_fd[c->fd] = c;
    pthread_mutex_unlock(&table_lock);
}

static void table_drop(struct conn *c)
{
    if (c->fd < 0) return;
    pthread_mutex_lock(&table_lock);
    if (c->fd < by_fd_cap && by_fd[c->fd] == c) by_fd[c->fd] = NULL;
    pthread_mutex_unlock(&table_lock);
}

static void set_peer(struct conn *c, VALUE addr)
{
    c->remote_addr = addr;
    c->peer[0] = '\0';
    if (RB_TYPE_P(addr, T_STRING) && RSTRING_LEN(addr) <= BB_PASS_ADDR_MAX) {
        memcpy(c->peer, RSTRING_PTR(addr), (size_t)RSTRING_LEN(addr));
        c->peer[RSTRING_LEN(addr)] = '\0';
    }
}

static char *buf_get(size_t *cap)
{
    *cap = BB_BUF_INITIAL;
    if (buf_pool_n > 0) return buf_pool[--buf_pool_n];
    return malloc(BB_BUF_INITIAL);
}

static void buf_put(char *b, size_t cap)
{
    if (!b) return;
    if (cap == BB_BUF_INITIAL && buf_pool_n < BB_BUF_POOL) buf_pool[buf_pool_n++] = b;
    else free(b);
}
static VALUE k_request_method, k_path_info, k_query_string, k_request_uri, k_server_protocol, k_http_version,
    k_remote_addr, k_server_name, k_server_port, k_http_host, k_content_length, k_content_type, k_connection,
    k_early_hints, k_queue_time, v_http10, v_http11, v_port80, v_port443, v_empty, k_url_scheme, v_https;

static void conn_mark(void *p)
{
    struct conn *c = p;
    rb_gc_mark(c->remote_addr);
    rb_gc_mark(c->template);
    rb_gc_mark(c->env_base);
    rb_gc_mark(c->req_method);
    rb_gc_mark(c->req_path);
    rb_gc_mark(c->env);
    rb_gc_mark(c->sink);
}

/* Bytes in all of this process's spill files (a worker is one process), against max_worker_spill:
 * disk use stays bounded however many connections stop reading at once. */
static int64_t spill_total;

int64_t bb_spill_total(void) { return spill_total; }

static void spill_close(struct conn *c)
{
    spill_total -= c->spill_len;
    if (c->spill_fd >= 0) close(c->spill_fd);
    c->spill_fd = -1;
    c->spill_off = c->spill_len = 0;
}

static void file_close(struct conn *c)
{
    if (c->file_fd >= 0) close(c->file_fd);
    c->file_fd = -1;
    c->file_off = c->file_end = 0;
}

/* Forgets all queued output (the connection is closing or handed over). */
static void out_discard(struct conn *c)
{
    spill_close(c);
    file_close(c);
    free(c->out);
    c->out = NULL;
    c->out_cap = c->out_off = c->out_len = 0;
}

static void conn_free(void *p)
{
    struct conn *c = p;
    table_drop(c);
    if (c->fd >= 0) close(c->fd);
    out_discard(c);
    buf_put(c->buf, c->cap);
    xfree(c);
}

static size_t conn_memsize(const void *p)
{
    const struct conn *c = p;
    return sizeof(*c) + c->cap + c->out_cap;
}

static const rb_data_type_t conn_type = {
    .wrap_struct_name = "Blackbuck::Native::Conn",
    .function = {.dmark = conn_mark, .dfree = conn_free, .dsize = conn_memsize},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE conn_alloc(VALUE klass)
{
    struct conn *c;
    VALUE obj = TypedData_Make_Struct(klass, struct conn, &conn_type, c);
    c->fd = -1;
    c->spill_fd = -1;
    c->file_fd = -1;
    c->remote_addr = c->template = c->env_base = c->env = c->sink = c->req_method = c->req_path = Qnil;
    return obj;
}

static struct conn *get_conn(VALUE self)
{
    struct conn *c;
    TypedData_Get_Struct(self, struct conn, &conn_type, c);
    return c;
}

static void conn_setup(struct conn *c, int fd, VALUE addr, VALUE tmpl, int tcp, int proxy, int listener)
{
    Check_Type(tmpl, T_HASH);
    c->buf = buf_get(&c->cap);
    if (!c->buf) {
        close(fd);
        rb_raise(rb_eNoMemError, "connection buffer");
    }
    c->fd = fd;
    c->tcp = tcp;
    c->proxy = proxy;
    c->listener = listener;
    set_peer(c, addr);
    c->template = tmpl;
    c->keepalive = 1;
    table_put(c);
}

/* Conn.accept(listen_fd, env_template, tcp, proxy_protocol = false, listener_index = 0) -> a new Conn,
 * or nil when nothing is pending. proxy_protocol: the connection starts with a PROXY protocol header
 * (parse_proxy). listener_index: where Conn.receive finds its template after a move. */
static VALUE conn_s_accept(int argc, VALUE *argv, VALUE klass)
{
    VALUE lfd, tmpl, tcp, proxy, index, addr = Qnil, obj;
    int fd;
    rb_scan_args(argc, argv, "32", &lfd, &tmpl, &tcp, &proxy, &index);
    fd = bb_accept(NUM2INT(lfd), RTEST(tcp), &addr);
    if (fd < 0) return Qnil;
    obj = conn_alloc(klass);
    conn_setup(get_conn(obj), fd, addr, tmpl, RTEST(tcp), RTEST(proxy), NIL_P(index) ? 0 : NUM2INT(index));
    return obj;
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
    bb_scoreboard_handoff_failed(BB_HANDOFF_SEND_FAILED);
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
    pthread_mutex_lock(&table_lock);
    c = fd >= 0 && fd < by_fd_cap ? by_fd[fd] : NULL;
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
    pthread_mutex_unlock(&table_lock);
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
            bb_scoreboard_handoff_failed(BB_HANDOFF_REFUSED);
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
            bb_scoreboard_handoff_failed(BB_HANDOFF_LOST);
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
    obj = conn_alloc(klass);
    c = get_conn(obj);
    conn_setup(c, fd, addr, RARRAY_AREF(entry, 0), RTEST(RARRAY_AREF(entry, 1)), 0, (int)p.listener);
    c->requests = (long)p.requests;
    c->moved_ready = p.ready_at;
    if (carried_len > 0) { /* a request the sender had read: parse it first (Conn#buffered says so) */
        if (carried_len > c->cap) {
            char *nb = carried_len <= buf_limit() ? realloc(c->buf, carried_len) : NULL;
            if (!nb) { /* cannot hold it: the client sees a close and may retry */
                conn_close(obj);
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

static size_t buf_limit(void)
{
    return bb_settings.limits.max_header_bytes + BB_READ_CHUNK;
}

/* fill(woke_at) -> Integer bytes read (> 0), 0 on EOF or a connection error, nil when it would block.
 * woke_at: the monotonic time the worker's event loop woke up to this read; the bytes were there by then. */
static VALUE conn_fill(VALUE self, VALUE woke_at)
{
    struct conn *c = get_conn(self);
    ssize_t n;
    size_t room;
    if (c->fd < 0) return INT2FIX(0);
    c->replay_len = 0; /* the buffer may move */
    if (c->off == c->len) c->off = c->len = 0;
    if (c->cap - c->len < 1024 && c->off > 0) {
        memmove(c->buf, c->buf + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->cap - c->len < 1024 && c->cap < buf_limit()) {
        size_t ncap = c->cap * 2;
        char *nb;
        if (ncap > buf_limit()) ncap = buf_limit();
        nb = realloc(c->buf, ncap);
        if (!nb) rb_raise(rb_eNoMemError, "connection buffer");
        c->buf = nb;
        c->cap = ncap;
    }
    room = c->cap - c->len;
    if (room == 0) rb_raise(rb_eRuntimeError, "[BUG] connection buffer full: take the body before filling");
    if (room > BB_READ_CHUNK) room = BB_READ_CHUNK;
    for (;;) {
        n = read(c->fd, c->buf + c->len, room);
        if (n >= 0) break;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Qnil;
        return INT2FIX(0); /* ECONNRESET and friends: the client is gone */
    }
    c->len += (size_t)n;
    c->drained = (size_t)n < room;
    c->woke_at = NUM2DBL(woke_at);
    if (c->moved_ready > 0) { /* its request waited in the worker that moved it here: since then */
        if (c->moved_ready < c->woke_at) c->woke_at = c->moved_ready;
        c->moved_ready = 0;
    }
    return LONG2FIX((long)n);
}

static int ieq(const char *a, size_t alen, const char *lower)
{
    size_t i, n = strlen(lower);
    if (alen != n) return 0;
    for (i = 0; i < n; i++) {
        char ch = a[i];
        if (ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
        if (ch != lower[i]) return 0;
    }
    return 1;
}

/* SERVER_NAME and SERVER_PORT from an authority the parser validated ("name", "name:port",
 * "[v6]:port"; host_len bytes of host). A port's leading zeros are dropped ("0080" is 80: Rack 2's
 * Lint reads "0080" as a bad octal number); no port means the scheme's default (default_port). An
 * empty authority (an empty Host) leaves the listener's name and port from the template. */
static void set_host(VALUE env, const char *v, size_t n, size_t host_len, VALUE default_port)
{
    if (n == 0) return;
    rb_hash_aset(env, k_server_name, rb_str_new(v, (long)host_len));
    if (host_len + 1 < n) {
        const char *port = v + host_len + 1, *end = v + n;
        while (port + 1 < end && *port == '0') port++;
        rb_hash_aset(env, k_server_port, rb_str_new(port, (long)(end - port)));
    } else {
        rb_hash_aset(env, k_server_port, default_port);
    }
}

/* Bounds of a plausible X-Request-Start, in seconds before now (a clock a little ahead of ours is 0). */
#define BB_REQUEST_START_MAX_AGE 3600.0
#define BB_REQUEST_START_MAX_AHEAD 5.0

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* X-Request-Start, as a proxy in front stamps it: "t=1700000000.123" (nginx ${msec}: seconds),
 * "t=1700000000123" (milliseconds, Heroku), "t=1700000000123456" (microseconds, Apache %t), the "t="
 * optional. The unit is told by the size of the number. -> wall-clock seconds, or 0 when the value
 * is malformed or implausible (more than an hour old, or from the future). */
static double parse_request_start(const char *v, size_t n, double now)
{
    double x = 0, frac = 0, scale = 1;
    size_t i = 0;
    int digits = 0, dot = 0;
    if (n >= 2 && v[0] == 't' && v[1] == '=') i = 2;
    for (; i < n; i++) {
        char ch = v[i];
        if (ch >= '0' && ch <= '9') {
            if (dot) frac += (ch - '0') * (scale /= 10);
            else if (++digits > 19) return 0;
            else x = x * 10 + (ch - '0');
        } else if (ch == '.' && !dot) {
            dot = 1;
        } else {
            return 0;
        }
    }
    if (!digits) return 0;
    x += frac;
    while (x > now * 100) x /= 1000; /* ns -> us -> ms -> s: each step is three orders */
    if (x > now + BB_REQUEST_START_MAX_AHEAD || x < now - BB_REQUEST_START_MAX_AGE) return 0;
    return x;
}

/* X-Forwarded-Proto: https (its first value), X-Forwarded-Scheme: https or X-Forwarded-Ssl: on, as
 * a TLS-terminating proxy in front (nginx, a load balancer) sends them and Puma and Unicorn read
 * them: the request came in over https. Only when trust_forwarded_proto is on. */
static int forwarded_https(const struct bb_header *h)
{
    const char *n = h->name, *v = h->value;
    size_t nl = h->name_len, vl = h->value_len;
    if (nl < 15 || nl > 18 || (n[0] | 0x20) != 'x' || n[1] != '-') return 0; /* most fields stop here */
    if (ieq(n, nl, "x-forwarded-proto") || ieq(n, nl, "x-forwarded-scheme"))
        return vl >= 5 && ieq(v, 5, "https") && (vl == 5 || v[5] == ',' || v[5] == ' ');
    if (ieq(n, nl, "x-forwarded-ssl")) return ieq(v, vl, "on");
    return 0;
}

/* The env keys of the fields most requests carry, and the common methods, interned once at
 * load: a request finds them by comparing bytes instead of building and interning a string
 * (a lookup in Ruby's global fstring table) per field. Names compare case-insensitively,
 * methods exactly (they are case-sensitive). */
static struct known {
    const char *name;
    size_t len;
    VALUE value;
} known_headers[] = {
    {"host", 4, Qnil}, {"connection", 10, Qnil}, {"user-agent", 10, Qnil}, {"accept", 6, Qnil},
    {"accept-encoding", 15, Qnil}, {"accept-language", 15, Qnil}, {"cookie", 6, Qnil}, {"referer", 7, Qnil},
    {"origin", 6, Qnil}, {"authorization", 13, Qnil}, {"cache-control", 13, Qnil}, {"x-forwarded-for", 15, Qnil},
    {"x-forwarded-proto", 17, Qnil}, {"x-forwarded-host", 16, Qnil}, {"x-real-ip", 9, Qnil}, {"x-request-id", 12, Qnil},
    {"if-none-match", 13, Qnil}, {"if-modified-since", 17, Qnil}, {"upgrade-insecure-requests", 25, Qnil},
    {"pragma", 6, Qnil}, {"upgrade", 7, Qnil}, {"keep-alive", 10, Qnil}, {"expect", 6, Qnil}, {"range", 5, Qnil},
}, known_methods[] = {
    {"GET", 3, Qnil}, {"POST", 4, Qnil}, {"HEAD", 4, Qnil}, {"PUT", 3, Qnil},
    {"DELETE", 6, Qnil}, {"PATCH", 5, Qnil}, {"OPTIONS", 7, Qnil},
};
#define KNOWN_N(a) (sizeof(a) / sizeof((a)[0]))

/* The interned CGI name of header field `name` (n bytes, n <= 256): "HTTP_" + upper case, '-' -> '_'. */
static VALUE env_key(const char *name, size_t n)
{
    char key[5 + 256];
    size_t i;
    memcpy(key, "HTTP_", 5);
    for (i = 0; i < n; i++) {
        char ch = name[i];
        key[5 + i] = ch == '-' ? '_' : (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
    }
    return bb_fstring(key, (long)(5 + n));
}

static VALUE known_header_key(const char *name, size_t n)
{
    size_t i;
    for (i = 0; i < KNOWN_N(known_headers); i++)
        if (known_headers[i].len == n && ieq(name, n, known_headers[i].name)) return known_headers[i].value;
    return Qundef;
}

static VALUE method_value(const char *m, size_t n)
{
    size_t i;
    for (i = 0; i < KNOWN_N(known_methods); i++)
        if (known_methods[i].len == n && memcmp(m, known_methods[i].name, n) == 0) return known_methods[i].value;
    return bb_fstring(m, (long)n);
}

static void add_header(VALUE env, const struct bb_header *h)
{
    VALUE k, val, old;
    const char *name = h->name;
    size_t nl = h->name_len;

    if (ieq(name, nl, "content-length")) {
        k = k_content_length;
    } else if (ieq(name, nl, "content-type")) {
        k = k_content_type;
    } else if ((k = known_header_key(name, nl)) != Qundef) {
        /* interned at load */
    } else {
        if (nl > 256 || memchr(name, '_', nl)) return; /* X_Forwarded_For must not shadow X-Forwarded-For */
        k = env_key(name, nl);
    }
    old = rb_hash_lookup2(env, k, Qundef);
    if (old == Qundef) {
        val = rb_str_new(h->value, (long)h->value_len);
        rb_hash_aset(env, k, val);
    } else {
        int cookie = nl == 6 && ieq(name, nl, "cookie");
        old = rb_str_dup(old);
        rb_str_cat(old, cookie ? "; " : ", ", 2);
        rb_str_cat(old, h->value, (long)h->value_len);
        rb_hash_aset(env, k, old);
    }
}

/*
 * parse_proxy -> true | false | nil: the PROXY protocol header a balancer sends first on a
 * proxy_protocol listener (bb_parse_proxy). true: it is taken off the buffer (what follows is HTTP)
 * and, when it names an IPv4 or IPv6 client, that address is REMOTE_ADDR for every request of the
 * connection; v1 UNKNOWN, v2 LOCAL (the balancer's health check) and v2 AF_UNSPEC or AF_UNIX keep
 * the real peer's. false: not a valid header; the connection is to be closed without an answer (the
 * spec). nil: incomplete. true at once when no header is expected.
 */
static VALUE conn_parse_proxy(VALUE self)
{
    struct conn *c = get_conn(self);
    struct bb_proxy px;
    int r;

    if (!c->proxy) return Qtrue;
    r = bb_parse_proxy(c->buf + c->off, c->len - c->off, &px);
    if (r == -2) return Qnil;
    if (r < 0) return Qfalse;
    if (px.family == BB_PROXY_INET || px.family == BB_PROXY_INET6) {
        VALUE ip = bb_ip_string(px.family == BB_PROXY_INET ? AF_INET : AF_INET6, px.src_addr);
        if (!NIL_P(ip)) set_peer(c, ip);
    }
    c->proxy = 0;
    c->off += (size_t)r;
    if (c->off == c->len) c->off = c->len = 0;
    return Qtrue;
}

/* The start of a request's env, and whether it has the request's Host entries already (then
 * HTTP_HOST, SERVER_NAME and SERVER_PORT are in it). A keep-alive connection's requests start from
 * a copy of its env_base, made at its first request with the entries that stay the same: the
 * listener's template, the protocol, REMOTE_ADDR and, when they can only be what they were (the same
 * Host bytes, no absolute-form target), the Host entries, made for http (request_env sets
 * SERVER_PORT for an https request whose Host has no port). */
static VALUE env_start(VALUE self, struct conn *c, const struct bb_request *req, int *has_host)
{
    const struct bb_header *host = req->host_index >= 0 ? &req->headers[req->host_index] : NULL;
    int minor = req->minor_version;
    /* its Host may live in env_base */
    int host_fixed = host && host->value_len > 0 && host->value_len <= BB_BASE_HOST_MAX && !(req->flags & BB_F_ABSOLUTE_FORM);
    VALUE env;

    if (c->env_base != Qnil && c->env_base_minor == minor &&
        (!c->base_host_len || (host_fixed && host->value_len == c->base_host_len &&
                               memcmp(host->value, c->base_host, c->base_host_len) == 0))) {
        *has_host = c->base_host_len > 0;
        return rb_hash_dup(c->env_base);
    }
    env = rb_hash_dup(c->template);
    /* 103 Early Hints is HTTP/1.1's: an HTTP/1.0 request gets no rack.early_hints, even when the
     * worker's template offers it (Worker#env_templates) */
    if (!minor) rb_hash_delete(env, k_early_hints);
    rb_hash_aset(env, k_server_protocol, minor ? v_http11 : v_http10);
    rb_hash_aset(env, k_http_version, minor ? v_http11 : v_http10);
    rb_hash_aset(env, k_remote_addr, c->remote_addr);
    rb_hash_aset(env, k_connection, self);
    *has_host = 0;
    /* A connection that will see another request keeps these for it: one copy now instead of about
     * seven hash sets for every request after this one. Made once (again only for another protocol
     * version): a client that changes its Host has its Host entries set per request. */
    if (c->keepalive && keepalive_max != 1 && (c->env_base == Qnil || c->env_base_minor != minor)) {
        c->base_host_len = 0;
        if (host_fixed) {
            /* frozen: every request of the connection shares them */
            set_host(env, req->authority, req->authority_len, req->host_len, v_port80);
            rb_obj_freeze(rb_hash_aref(env, k_server_name));
            rb_obj_freeze(rb_hash_aref(env, k_server_port));
            rb_hash_aset(env, k_http_host, rb_obj_freeze(rb_str_new(host->value, (long)host->value_len)));
            memcpy(c->base_host, host->value, host->value_len);
            c->base_host_len = host->value_len;
            *has_host = 1;
        }
        c->env_base = rb_obj_freeze(rb_hash_dup(env));
        c->env_base_minor = minor;
    }
    return env;
}

/* The Rack env of a request the parser read (req). */
static VALUE request_env(VALUE self, struct conn *c, const struct bb_request *req)
{
    int has_host, https = 0;
    double now = 0;
    size_t i;
    VALUE env = env_start(self, c, req, &has_host);

    c->req_method = method_value(req->method, req->method_len);
    c->req_path = rb_str_new(req->path, (long)req->path_len);
    rb_hash_aset(env, k_request_method, c->req_method);
    rb_hash_aset(env, k_request_uri, rb_str_new(req->target, (long)req->target_len));
    rb_hash_aset(env, k_path_info, c->req_path);
    rb_hash_aset(env, k_query_string, req->query ? rb_str_new(req->query, (long)req->query_len) : v_empty);
    c->request_start = 0;
    for (i = 0; i < req->num_headers; i++) {
        const struct bb_header *h = &req->headers[i];
        if (!(has_host && (int)i == req->host_index)) add_header(env, h);
        if (bb_settings.trust_forwarded_proto && !https) https = forwarded_https(h);
        if (h->name_len == 15 && ieq(h->name, 15, "x-request-start")) {
            if (now == 0) now = wall_now();
            c->request_start = parse_request_start(h->value, h->value_len, now);
        }
    }
    if (https) rb_hash_aset(env, k_url_scheme, v_https);
    if (req->authority && !has_host)
        set_host(env, req->authority, req->authority_len, req->host_len, https ? v_port443 : v_port80);
    else if (https && has_host && req->host_len == req->authority_len)
        rb_hash_aset(env, k_server_port, v_port443); /* env_base's Host entries are http's */
    /* absolute-form: RFC 9112 3.2.2, the target's authority wins over Host. HTTP_HOST says the
     * same as SERVER_NAME (as in Unicorn), since Rack and Rails take the host from HTTP_HOST. */
    if (req->flags & BB_F_ABSOLUTE_FORM)
        rb_hash_aset(env, k_http_host, rb_str_new(req->authority, (long)req->authority_len));
    return env;
}

/* parse -> env Hash | nil (need more bytes) | Integer status (reject and close) */
static VALUE conn_parse(VALUE self)
{
    struct conn *c = get_conn(self);
    struct bb_header headers[BB_HEADERS_CAP];
    struct bb_request req;
    VALUE env;
    int r;

    if (c->proxy) return Qfalse; /* the PROXY protocol header comes first: parse_proxy */
    if (c->off == c->len) return Qnil;
    memset(&req, 0, sizeof(req));
    req.headers = headers;
    req.num_headers = bb_settings.limits.max_headers;
    r = bb_parse_request(c->buf + c->off, c->len - c->off, c->last_len, &req, &bb_settings.limits);
    if (r == -2) {
        c->last_len = c->len - c->off;
        return Qnil;
    }
    if (r < 0) {
        c->last_len = 0;
        return INT2FIX(req.status ? req.status : 400);
    }
    c->last_len = 0;
    c->keepalive = req.minor_version ? !(req.flags & BB_F_CONN_CLOSE)
                                     : ((req.flags & BB_F_CONN_KEEPALIVE) && !(req.flags & BB_F_CONN_CLOSE));

    env = request_env(self, c, &req);
    c->minor = req.minor_version;
    c->client_close = !c->keepalive;
    c->head_only = req.method_len == 4 && memcmp(req.method, "HEAD", 4) == 0;
    c->expect_continue = (req.flags & BB_F_EXPECT_CONTINUE) && req.minor_version == 1;
    c->content_length = req.content_length;
    if (req.flags & BB_F_CHUNKED) {
        c->body_mode = BODY_CHUNKED;
        c->body_done = 0;
        bb_chunked_init(&c->dec);
    } else if (req.content_length > 0) {
        c->body_mode = BODY_LENGTH;
        c->body_left = req.content_length;
        c->body_done = 0;
    } else {
        c->body_mode = BODY_NONE;
        c->body_done = 1;
    }
    c->replay_off = c->off;
    c->replay_len = c->body_mode == BODY_NONE && c->off + (size_t)r == c->len ? (size_t)r : 0;
    c->off += (size_t)r;
    if (c->off == c->len) c->off = c->len = 0;
    return env;
}

/* Seconds the request has waited for the app: since the worker woke up to the read
 * that completed it (its bytes were there then), or since the proxy's X-Request-Start when that is
 * earlier (it also counts what waited in front of the worker: the listen queue, unread socket bytes). */
static double queue_seconds(const struct conn *c)
{
    double q = c->woke_at > 0 ? mono_now() - c->woke_at : 0;
    if (c->request_start > 0) {
        double proxy = wall_now() - c->request_start;
        if (proxy > q) q = proxy;
    }
    return q < 0 ? 0 : q;
}

/* start_app(env) -> Float queue time: the whole request is in and goes to the app. The connection
 * is BUSY, and env["blackbuck.queue_time"] says how long it waited (queue_time). */
static VALUE conn_start_app(VALUE self, VALUE env)
{
    struct conn *c = get_conn(self);
    VALUE q = DBL2NUM(queue_seconds(c));
    __atomic_store_n(&c->state, BB_CONN_BUSY, __ATOMIC_RELAXED);
    rb_hash_aset(env, k_queue_time, q);
    return q;
}

void bb_conn_request_line(VALUE conn, VALUE *method, VALUE *path)
{
    struct conn *c = get_conn(conn);
    *method = c->req_method;
    *path = c->req_path;
}

/* body_take -> String with the body bytes buffered now (possibly empty) | Integer status */
static VALUE conn_body_take(VALUE self)
{
    struct conn *c = get_conn(self);
    size_t avail = c->len - c->off;
    VALUE s;

    if (c->body_done || avail == 0) return rb_str_new(0, 0);
    if (c->body_mode == BODY_LENGTH) {
        size_t n = (int64_t)avail < c->body_left ? avail : (size_t)c->body_left;
        s = rb_str_new(c->buf + c->off, (long)n);
        c->off += n;
        c->body_left -= (int64_t)n;
        if (c->body_left == 0) c->body_done = 1;
    } else {
        size_t sz = avail;
        long r = bb_decode_chunked(&c->dec, c->buf + c->off, &sz);
        if (r == -1) return INT2FIX(c->dec.status ? c->dec.status : 400);
        s = rb_str_new(c->buf + c->off, (long)sz);
        if (r >= 0) {
            c->body_done = 1;
            c->off += sz;
            c->len = c->off + (size_t)r;
        } else {
            c->off = c->len = 0;
        }
    }
    if (c->off == c->len) c->off = c->len = 0;
    return s;
}

/* ---- output ---- */

static void hreserve(size_t more)
{
    if (head.len + more > head.cap) {
        size_t ncap = head.cap ? head.cap : 4096;
        char *nb;
        while (ncap < head.len + more) ncap *= 2;
        nb = realloc(head.buf, ncap);
        if (!nb) rb_raise(rb_eNoMemError, "response head");
        head.buf = nb;
        head.cap = ncap;
    }
}

static void hcat(const char *p, size_t n)
{
    hreserve(n);
    memcpy(head.buf + head.len, p, n);
    head.len += n;
}

/* Consumes w bytes from iov[*i, cnt), then skips empty entries. */
static void iov_skip(struct iovec *iov, int *i, int cnt, size_t w)
{
    while (*i < cnt && w >= iov[*i].iov_len) {
        w -= iov[*i].iov_len;
        (*i)++;
    }
    if (*i < cnt && w > 0) {
        iov[*i].iov_base = (char *)iov[*i].iov_base + w;
        iov[*i].iov_len -= w;
    }
    while (*i < cnt && iov[*i].iov_len == 0) (*i)++;
}

static int queued(const struct conn *c) { return c->out_off < c->out_len || c->spill_fd >= 0 || c->file_fd >= 0; }

/* Appends up to n bytes to the memory queue, which holds at most response_buffer bytes and takes
 * nothing while a spill file is open (its bytes come first). Returns the bytes taken. */
static size_t out_append(struct conn *c, const char *p, size_t n)
{
    size_t limit = bb_settings.response_buffer, pending = c->out_len - c->out_off;
    if (c->spill_fd >= 0 || pending >= limit) return 0;
    if (n > limit - pending) n = limit - pending;
    if (n == 0) return 0;
    if (c->out_len + n > c->out_cap && c->out_off > 0) { /* compact before growing */
        memmove(c->out, c->out + c->out_off, pending);
        c->out_off = 0;
        c->out_len = pending;
    }
    if (c->out_len + n > c->out_cap) {
        size_t ncap = c->out_cap ? c->out_cap : BB_OUT_INITIAL;
        char *nb;
        while (ncap < c->out_len + n) ncap *= 2;
        if (ncap > limit) ncap = limit; /* >= out_len + n, since out_off is 0 here */
        nb = realloc(c->out, ncap);
        if (!nb) rb_raise(rb_eNoMemError, "response buffer");
        c->out = nb;
        c->out_cap = ncap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return n;
}

/* An anonymous file in $TMPDIR (or /tmp), nothing left on disk: O_TMPFILE where the kernel and
 * the filesystem have it, else mkstemp + unlink. Returns the fd, or -1 with errno. */
static int spill_open(const char *dir)
{
    char path[PATH_MAX];
    int fd;
#ifdef O_TMPFILE
    fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
#endif
    if (snprintf(path, sizeof(path), "%s/blackbuck-spill-XXXXXX", dir) >= (int)sizeof(path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = mkstemp(path);
    if (fd < 0) return -1;
    unlink(path);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

static const char *spill_dir(void)
{
    const char *dir = getenv("TMPDIR");
    return dir && *dir ? dir : "/tmp";
}

/* Conn.spill_probe -> nil | "DIR: reason": makes and drops one spill file, so a $TMPDIR that
 * cannot take them is reported at boot rather than at the first slow reader. */
static VALUE conn_s_spill_probe(VALUE klass)
{
    const char *dir = spill_dir();
    int fd = spill_open(dir);
    if (fd < 0) return rb_sprintf("%s: %s", dir, strerror(errno));
    close(fd);
    return Qnil;
}

/* The spill file could not be made or written: from now on until the next request this
 * connection's output waits for the client instead. One warning line says why. */
static void spill_fail(struct conn *c, const char *op, int err)
{
    c->spill_failed = 1;
    if (c->spill_fd >= 0 && c->spill_off == c->spill_len) spill_close(c); /* nothing in it */
    bb_warn(rb_sprintf("cannot spill a response to %s (%s: %s): the worker waits for this client instead "
                       "(at most write_timeout)",
                       spill_dir(), op, strerror(err)));
}

/* Queues iov[*i, cnt) behind what is queued: in memory while no spill file is open and
 * response_buffer allows, then appended to the spill file while max_response_spill allows.
 * Advances *i (and the iov) past what it took; what is left fits nowhere. */
static void queue_iov(struct conn *c, struct iovec *iov, int *i, int cnt)
{
    while (*i < cnt && c->spill_fd < 0) {
        size_t n = iov[*i].iov_len, took = out_append(c, iov[*i].iov_base, n);
        iov_skip(iov, i, cnt, took);
        if (took < n) break;
    }
    while (*i < cnt && !c->spill_failed && c->spill_len < bb_settings.max_response_spill &&
           spill_total < bb_settings.max_worker_spill) {
        /* at most IOV_MAX entries and the room left under both caps (the last entry cut to fit) */
        int64_t left = bb_settings.max_response_spill - c->spill_len, worker_left = bb_settings.max_worker_spill - spill_total;
        size_t room = (size_t)(left < worker_left ? left : worker_left), sum = 0, cut_len = 0;
        int k, batch = cnt - *i > IOV_MAX ? IOV_MAX : cnt - *i, cut = -1;
        ssize_t w;
        if (c->spill_fd < 0 && (c->spill_fd = spill_open(spill_dir())) < 0) {
            spill_fail(c, "open", errno);
            break;
        }
        for (k = 0; k < batch; k++) {
            if (iov[*i + k].iov_len > room - sum) {
                cut = *i + k;
                cut_len = iov[cut].iov_len;
                iov[cut].iov_len = room - sum;
                k++;
                break;
            }
            sum += iov[*i + k].iov_len;
        }
        w = writev(c->spill_fd, iov + *i, k);
        if (cut >= 0) iov[cut].iov_len = cut_len;
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            spill_fail(c, "write", w < 0 ? errno : EIO);
            break;
        }
        c->spill_len += w;
        spill_total += w;
        iov_skip(iov, i, cnt, (size_t)w);
    }
}

/* Sends up to n bytes of file fd from offset off to socket sock: sendfile(2), or where it is not
 * available or this file cannot do it (*copy is then set for the next calls) pread + write of at
 * most BB_SPILL_COPY_CHUNK bytes. Returns the bytes sent, 0 when the file ends before off, or -1
 * with errno. */
static ssize_t file_send(int sock, int fd, int64_t off, size_t n, int *copy)
{
    char buf[BB_SPILL_COPY_CHUNK];
    ssize_t r;
#ifdef HAVE_SYS_SENDFILE_H
    if (!*copy) {
        off_t o = (off_t)off;
        ssize_t w = sendfile(sock, fd, &o, n);
        if (w >= 0 || (errno != EINVAL && errno != ENOSYS)) return w;
        *copy = 1;
    }
#else
    *copy = 1;
#endif
    if (n > sizeof(buf)) n = sizeof(buf);
    do r = pread(fd, buf, n, (off_t)off);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return r;
    return write(sock, buf, (size_t)r);
}

/* The filesystem of $TMPDIR cannot sendfile: spill files are copied instead. */
static int spill_copy;

/* Sends queued output without waiting: memory first, then the spill file (closed once sent), then
 * the file body (closed once sent; one that ends before the length promised for it fails the
 * connection, which must then close). WRITE_DONE, WRITE_PENDING or WRITE_FAILED. */
static int flush_nb(struct conn *c)
{
    size_t budget = BB_SPILL_FLUSH_MAX;
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return WRITE_PENDING;
            return WRITE_FAILED;
        }
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
    while (c->spill_off < c->spill_len) {
        size_t n = (size_t)(c->spill_len - c->spill_off);
        ssize_t w;
        if (budget == 0) return WRITE_PENDING;
        w = file_send(c->fd, c->spill_fd, c->spill_off, n < budget ? n : budget, &spill_copy);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return WRITE_PENDING;
            return WRITE_FAILED;
        }
        if (w == 0) return WRITE_FAILED; /* the file is shorter than what was written to it */
        c->spill_off += w;
        budget -= (size_t)w;
    }
    spill_close(c);
    budget = BB_FILE_FLUSH_MAX;
    while (c->file_off < c->file_end) {
        size_t n = (size_t)(c->file_end - c->file_off);
        ssize_t w;
        if (budget == 0) return WRITE_PENDING;
        w = file_send(c->fd, c->file_fd, c->file_off, n < budget ? n : budget, &c->file_copy);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return WRITE_PENDING;
            return WRITE_FAILED;
        }
        if (w == 0) { /* truncated under us: the promised Content-Length cannot be met */
            int64_t at = c->file_off, end = c->file_end;
            file_close(c);
            bb_warn(rb_sprintf("a file body ended at byte %lld of the %lld promised (the file shrank while it "
                               "was sent): connection closed",
                               (long long)at, (long long)end));
            return WRITE_FAILED;
        }
        c->file_off += w;
        budget -= (size_t)w;
    }
    file_close(c);
    return WRITE_DONE;
}

/*
 * Sends iov[0, cnt) behind whatever is queued, never reordering. What the socket does not take
 * is queued (queue_iov); only what fits nowhere makes it wait for the client, up to
 * write_timeout_ms each time the client takes nothing.
 * Returns WRITE_DONE (all sent), WRITE_PENDING (some queued for flush) or WRITE_FAILED.
 */
static int out_write(struct conn *c, struct iovec *iov, int cnt)
{
    int i = 0;
    if (c->file_fd >= 0) rb_raise(rb_eRuntimeError, "[BUG] output written behind a queued file body");
    iov_skip(iov, &i, cnt, 0);
    while (i < cnt) {
        if (queued(c) && flush_nb(c) == WRITE_FAILED) return WRITE_FAILED;
        if (!queued(c)) {
            ssize_t w = writev(c->fd, iov + i, cnt - i > IOV_MAX ? IOV_MAX : cnt - i);
            if (w >= 0) {
                iov_skip(iov, &i, cnt, (size_t)w);
                continue;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return WRITE_FAILED;
        }
        queue_iov(c, iov, &i, cnt);
        if (i < cnt && bb_wait_writable(c->fd, bb_settings.write_timeout_ms) != 1) return WRITE_FAILED;
    }
    return queued(c) ? WRITE_PENDING : WRITE_DONE;
}

/* Sends everything queued, waiting up to wait_ms each time the client takes nothing:
 * WRITE_DONE or WRITE_FAILED. */
static int out_drain(struct conn *c, int wait_ms)
{
    for (;;) {
        int r = flush_nb(c);
        if (r != WRITE_PENDING) return r;
        if (bb_wait_writable(c->fd, wait_ms) != 1) return WRITE_FAILED;
    }
}

/* Writes iov[0, cnt) after what is queued, waiting up to wait_ms each time the client takes
 * nothing; nothing is left queued. For an error answer, right before the connection closes. */
static int write_wait(struct conn *c, struct iovec *iov, int cnt, int wait_ms)
{
    int i = 0;
    if (out_drain(c, wait_ms) != WRITE_DONE) return WRITE_FAILED;
    iov_skip(iov, &i, cnt, 0);
    while (i < cnt) {
        ssize_t w = writev(c->fd, iov + i, cnt - i > IOV_MAX ? IOV_MAX : cnt - i);
        if (w >= 0) {
            iov_skip(iov, &i, cnt, (size_t)w);
            continue;
        }
        if (errno == EINTR) continue;
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || bb_wait_writable(c->fd, wait_ms) != 1) return WRITE_FAILED;
    }
    return WRITE_DONE;
}

struct head_state {
    struct conn *c;
    int raw; /* 101 Switching Protocols or a partial hijack: the app owns framing and Connection */
    int have_length, have_te, have_date;
    int64_t length;
};

#define FIELD_SHOWN_MAX 200 /* bytes of a refused field name or value quoted in the error message */

/* s as Ruby's inspect shows it (CR, LF, NUL and other bytes escaped, so a message quoting what an
 * app sent stays one line), cut to FIELD_SHOWN_MAX bytes with "..." after the quote. */
static VALUE field_shown(VALUE s)
{
    long n = RSTRING_LEN(s);
    VALUE shown = rb_str_inspect(rb_str_subseq(s, 0, n > FIELD_SHOWN_MAX ? FIELD_SHOWN_MAX : n));
    if (n > FIELD_SHOWN_MAX) rb_str_cat_cstr(shown, "...");
    return shown;
}

/* A field name (`what`: "response header", "early hint"): a token (RFC 9110 5.1), so no byte
 * <= SP, ':' or >= DEL. Raises ArgumentError showing the name, escaped. */
static void check_name(VALUE key, const char *what)
{
    const char *p = RSTRING_PTR(key);
    long i, n = RSTRING_LEN(key);
    if (n == 0) rb_raise(rb_eArgError, "empty %s name", what);
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch <= 0x20 || ch == ':' || ch >= 0x7f)
            rb_raise(rb_eArgError, "invalid %s name %" PRIsVALUE " (a name is letters, digits and !#$%%&'*+-.^_`|~)",
                     what, field_shown(key));
    }
}

/* One value of field key: p, n is a line of `value` (Rack 2 joins several with "\n"). CR, LF and
 * NUL are refused (RFC 9110 5.5: they could end the field and start another). Raises
 * ArgumentError naming the field and showing the whole value the app gave, escaped. */
static void check_value(VALUE key, const char *p, size_t n, VALUE value, const char *what)
{
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\r' || ch == '\n' || ch == 0)
            rb_raise(rb_eArgError, "invalid value of %s %" PRIsVALUE ": %" PRIsVALUE " (CR, LF and NUL are not allowed)",
                     what, field_shown(key), field_shown(value));
    }
}

/* v, vn: one line of value (the app's String or an element of its Array). */
static void emit_field(struct head_state *st, VALUE key, const char *v, size_t vn, VALUE value)
{
    struct conn *c = st->c;
    const char *k = RSTRING_PTR(key);
    size_t kn = (size_t)RSTRING_LEN(key);
    check_value(key, v, vn, value, "response header");
    if (ieq(k, kn, "content-length")) {
        int64_t n = 0;
        size_t i;
        if (vn == 0 || vn > 18) rb_raise(rb_eArgError, "invalid content-length: %.*s", (int)(vn > 32 ? 32 : vn), v);
        for (i = 0; i < vn; i++) {
            if (v[i] < '0' || v[i] > '9') rb_raise(rb_eArgError, "invalid content-length: %.*s", (int)vn, v);
            n = n * 10 + (v[i] - '0');
        }
        if (st->have_length && st->length != n) rb_raise(rb_eArgError, "conflicting content-length values");
        st->have_length = 1;
        st->length = n;
    } else if (ieq(k, kn, "transfer-encoding")) {
        st->have_te = 1;
    } else if (ieq(k, kn, "connection") && !st->raw) {
        /* the server owns the connection; an app asking for close gets it */
        size_t i;
        for (i = 0; i + 5 <= vn; i++)
            if (ieq(v + i, 5, "close")) c->keepalive = 0;
        return;
    } else if (ieq(k, kn, "date")) {
        st->have_date = 1;
    }
    hreserve(kn + vn + 4);
    memcpy(head.buf + head.len, k, kn);
    head.len += kn;
    head.buf[head.len++] = ':';
    head.buf[head.len++] = ' ';
    memcpy(head.buf + head.len, v, vn);
    head.len += vn;
    head.buf[head.len++] = '\r';
    head.buf[head.len++] = '\n';
}

static int head_i(VALUE key, VALUE val, VALUE arg)
{
    struct head_state *st = (struct head_state *)arg;
    if (!RB_TYPE_P(key, T_STRING)) rb_raise(rb_eTypeError, "response header name must be a String");
    if (RSTRING_LEN(key) >= 5 && memcmp(RSTRING_PTR(key), "rack.", 5) == 0) return ST_CONTINUE;
    check_name(key, "response header");
    if (RB_TYPE_P(val, T_ARRAY)) {
        long i;
        for (i = 0; i < RARRAY_LEN(val); i++) {
            VALUE v = RARRAY_AREF(val, i);
            if (!RB_TYPE_P(v, T_STRING)) rb_raise(rb_eTypeError, "response header value must be a String");
            emit_field(st, key, RSTRING_PTR(v), (size_t)RSTRING_LEN(v), v);
        }
    } else if (RB_TYPE_P(val, T_STRING)) {
        /* Rack 2: several values joined by "\n" */
        const char *p = RSTRING_PTR(val), *end = p + RSTRING_LEN(val), *nl;
        do {
            nl = memchr(p, '\n', (size_t)(end - p));
            emit_field(st, key, p, (size_t)((nl ? nl : end) - p), val);
            p = nl ? nl + 1 : end;
        } while (nl);
    } else if (!NIL_P(val)) {
        rb_raise(rb_eTypeError, "response header value must be a String or an Array of Strings");
    }
    return ST_CONTINUE;
}

/* Starts a response head in `head` for a status in 100-999: the status line and the app's fields,
 * each validated (this raises before anything is written). */
static void head_start(struct conn *c, struct head_state *st, int status, VALUE headers, int raw)
{
    size_t len;
    const char *p;
    memset(st, 0, sizeof(*st));
    st->c = c;
    st->raw = raw || status == 101;
    head.len = 0;
    p = bb_status_line(status, &len);
    hcat(p, len);
    if (!NIL_P(headers)) {
        Check_Type(headers, T_HASH);
        rb_hash_foreach(headers, head_i, (VALUE)st);
    }
}

/*
 * Keep-alive is decided here, for the whole process (a worker): the client's wish (parse), the
 * response's framing (write_response), and these two, set from Ruby: max_keepalive_requests
 * (Conn.keepalive_policy; 1 = keepalive off) and the worker's stop (Conn.stopping!). A response
 * head says "Connection: close" when one of them ends the connection, and next_request ends it.
 */
static int stopping;       /* atomic: app threads write heads too */

static int keepalive_allowed(const struct conn *c)
{
    return c->keepalive && !__atomic_load_n(&stopping, __ATOMIC_RELAXED) &&
           (keepalive_max <= 0 || c->requests + 1 < keepalive_max);
}

/* Ends the head: Connection (the server's, unless raw), Date unless the app gave one, the empty line. */
static void head_finish(struct conn *c, const struct head_state *st)
{
    size_t len;
    const char *p;
    c->replay_len = 0; /* its response has started: the request stays here */
    if (st->raw) {
        /* nothing: the app's Connection header stands */
    } else if (!keepalive_allowed(c)) {
        c->keepalive = 0;
        hcat("Connection: close\r\n", 19);
    } else if (c->minor == 0) hcat("Connection: keep-alive\r\n", 24);
    if (!st->have_date) {
        p = bb_date_header(&len);
        hcat(p, len);
    }
    hcat("\r\n", 2);
}

/*
 * write_response(status, headers, body_array_or_nil, raw) -> see the WRITE_ / STREAM_ constants
 * raw: a partial hijack; the head is sent as the app gave it and the app then owns the socket.
 */
static VALUE conn_write_response(VALUE self, VALUE vstatus, VALUE headers, VALUE body, VALUE raw)
{
    struct conn *c = get_conn(self);
    struct head_state st;
    struct iovec stack_iov[BB_IOV_STACK], *iov = stack_iov;
    VALUE iov_buf = 0;
    int status = NUM2INT(vstatus), no_body, mode, ret;
    long nparts = 0, i;
    char num[48];

    if (status < 100 || status > 999) rb_raise(rb_eArgError, "invalid status: %d", status);
    if (c->fd < 0) return INT2FIX(WRITE_FAILED);
    head_start(c, &st, status, headers, RTEST(raw));
    no_body = c->head_only || status < 200 || status == 204 || status == 304;
    if (!NIL_P(body)) {
        Check_Type(body, T_ARRAY);
        nparts = RARRAY_LEN(body);
        for (i = 0; i < nparts; i++)
            if (!RB_TYPE_P(RARRAY_AREF(body, i), T_STRING)) rb_raise(rb_eTypeError, "body parts must be Strings");
    }

    if (st.raw) {
        c->keepalive = 0;
        mode = STREAM_RAW;
    } else if (no_body) {
        /* HEAD of an Array body: the length its GET would have (RFC 9110 9.3.2), unless the app gave
         * one. An empty Array says nothing (Rack::Head has already dropped a body we cannot measure). */
        if (c->head_only && status >= 200 && status != 204 && status != 304 && !st.have_length && !st.have_te) {
            int64_t total = 0;
            for (i = 0; i < nparts; i++) total += RSTRING_LEN(RARRAY_AREF(body, i));
            if (total > 0) hcat(num, (size_t)snprintf(num, sizeof(num), "Content-Length: %lld\r\n", (long long)total));
        }
        mode = WRITE_DONE;
        nparts = 0;
    } else if (!NIL_P(body)) {
        int64_t total = 0;
        for (i = 0; i < nparts; i++) total += RSTRING_LEN(RARRAY_AREF(body, i));
        if (st.have_length) {
            if (total != st.length) c->keepalive = 0; /* framing would break: end it with the connection */
        } else if (!st.have_te) {
            hcat(num, (size_t)snprintf(num, sizeof(num), "Content-Length: %lld\r\n", (long long)total));
        } else {
            c->keepalive = 0;
        }
        mode = WRITE_DONE;
    } else if (st.have_length) {
        mode = STREAM_RAW;
    } else if (st.have_te) {
        mode = STREAM_RAW;
        c->keepalive = 0;
    } else if (c->minor == 1) {
        hcat("Transfer-Encoding: chunked\r\n", 28);
        mode = STREAM_CHUNKED;
    } else {
        c->keepalive = 0; /* HTTP/1.0 without a length: the body ends when the connection does */
        mode = STREAM_RAW;
    }
    head_finish(c, &st);

    if (mode != WRITE_DONE) {
        struct iovec one;
        one.iov_base = head.buf;
        one.iov_len = head.len;
        if (out_write(c, &one, 1) == WRITE_FAILED) return INT2FIX(WRITE_FAILED);
        return INT2FIX(no_body && !st.raw ? WRITE_DONE : mode);
    }
    /* a Ruby-owned buffer, freed by the GC should a wait below raise (RequestTimeout) */
    if (nparts + 1 > BB_IOV_STACK) iov = ALLOCV_N(struct iovec, iov_buf, nparts + 1);
    iov[0].iov_base = head.buf;
    iov[0].iov_len = head.len;
    for (i = 0; i < nparts; i++) {
        VALUE s = RARRAY_AREF(body, i);
        iov[i + 1].iov_base = RSTRING_PTR(s);
        iov[i + 1].iov_len = (size_t)RSTRING_LEN(s);
    }
    ret = out_write(c, iov, (int)nparts + 1);
    if (iov_buf) ALLOCV_END(iov_buf);
    RB_GC_GUARD(body);
    return INT2FIX(ret);
}

/* A file body between its open and its place in the queue; fd is closed unless it got there. */
struct file_body {
    struct conn *c;
    int fd;
    int64_t size;
};

/* Sends or queues the head in `head`, then queues the file behind it and starts sending it. */
static VALUE file_body_queue(VALUE arg)
{
    struct file_body *f = (struct file_body *)arg;
    struct conn *c = f->c;
    struct iovec one;
    int r;
    one.iov_base = head.buf;
    one.iov_len = head.len;
    r = out_write(c, &one, 1); /* may wait for the client (nowhere to queue) and raise */
    if (r == WRITE_FAILED || c->head_only || f->size == 0) return INT2FIX(r);
    c->file_fd = f->fd;
    f->fd = -1;
    c->file_copy = 0;
    c->file_off = 0;
    c->file_end = f->size;
    return INT2FIX(flush_nb(c));
}

static VALUE file_body_release(VALUE arg)
{
    struct file_body *f = (struct file_body *)arg;
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    return Qnil;
}

/*
 * write_file(status, headers, path) -> WRITE_DONE | WRITE_PENDING | WRITE_FAILED, or nil when this
 * response cannot be sent from the file (nothing is written then; the caller streams the body):
 * the status is not 200, the app gave a Transfer-Encoding or a Content-Length other than the
 * file's size, or path does not open as a regular file. The file is opened now (so an app that
 * deletes it when its body is closed does not matter) and its size then is the Content-Length; its
 * bytes are queued behind the head and sent by flush with sendfile(2), never through Ruby. After
 * HEAD only the head is sent.
 */
static VALUE conn_write_file(VALUE self, VALUE vstatus, VALUE headers, VALUE path)
{
    struct conn *c = get_conn(self);
    struct head_state st;
    struct file_body f;
    struct stat sb;
    char num[48];

    if (NUM2INT(vstatus) != 200) return Qnil;
    FilePathValue(path);
    if (c->fd < 0) return INT2FIX(WRITE_FAILED);
    head_start(c, &st, 200, headers, 0);
    if (st.have_te) return Qnil;
    hreserve(BB_HEAD_TAIL_MAX);
    /* O_NONBLOCK: a FIFO must not block the open; a regular file ignores it */
    f.fd = open(RSTRING_PTR(path), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (f.fd < 0) return Qnil;
    if (fstat(f.fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (st.have_length && st.length != (int64_t)sb.st_size)) {
        close(f.fd);
        return Qnil;
    }
    f.c = c;
    f.size = (int64_t)sb.st_size;
    if (!st.have_length) hcat(num, (size_t)snprintf(num, sizeof(num), "Content-Length: %lld\r\n", (long long)f.size));
    head_finish(c, &st);
    RB_GC_GUARD(path);
    return rb_ensure(file_body_queue, (VALUE)&f, file_body_release, (VALUE)&f);
}

static int hint_i(VALUE key, VALUE val, VALUE arg)
{
    const char *p, *end, *nl;
    long i, n;
    VALUE v;
    (void)arg;
    if (!RB_TYPE_P(key, T_STRING)) rb_raise(rb_eTypeError, "early hint name must be a String");
    check_name(key, "early hint");
    n = RB_TYPE_P(val, T_ARRAY) ? RARRAY_LEN(val) : 1;
    for (i = 0; i < n; i++) {
        v = RB_TYPE_P(val, T_ARRAY) ? RARRAY_AREF(val, i) : val;
        if (!RB_TYPE_P(v, T_STRING)) rb_raise(rb_eTypeError, "early hint value must be a String");
        p = RSTRING_PTR(v);
        end = p + RSTRING_LEN(v);
        do { /* Rack 2 style: several values joined by "\n" */
            nl = memchr(p, '\n', (size_t)(end - p));
            check_value(key, p, (size_t)((nl ? nl : end) - p), v, "early hint");
            hcat(RSTRING_PTR(key), (size_t)RSTRING_LEN(key));
            hcat(": ", 2);
            hcat(p, (size_t)((nl ? nl : end) - p));
            hcat("\r\n", 2);
            p = nl ? nl + 1 : end;
        } while (nl);
    }
    return ST_CONTINUE;
}

/* write_hints(headers) -> true | false: a 103 Early Hints response, every field validated. */
static VALUE conn_write_hints(VALUE self, VALUE headers)
{
    struct conn *c = get_conn(self);
    struct iovec iov;
    Check_Type(headers, T_HASH);
    c->replay_len = 0;
    head.len = 0;
    hcat("HTTP/1.1 103 Early Hints\r\n", 26);
    rb_hash_foreach(headers, hint_i, Qnil);
    hcat("\r\n", 2);
    if (c->fd < 0) return Qfalse;
    iov.iov_base = head.buf;
    iov.iov_len = head.len;
    return out_write(c, &iov, 1) != WRITE_FAILED ? Qtrue : Qfalse;
}

/* write_part(str, chunked) -> true | false (client gone, or not reading for write_timeout) */
static VALUE conn_write_part(VALUE self, VALUE str, VALUE chunked)
{
    struct conn *c = get_conn(self);
    struct iovec iov[3];
    char size[24];
    int cnt = 0, r;
    StringValue(str);
    if (RSTRING_LEN(str) == 0) return Qtrue; /* an empty chunk would end a chunked body */
    if (c->fd < 0) return Qfalse;
    if (RTEST(chunked)) {
        iov[cnt].iov_base = size;
        iov[cnt++].iov_len = (size_t)snprintf(size, sizeof(size), "%lx\r\n", (unsigned long)RSTRING_LEN(str));
    }
    iov[cnt].iov_base = RSTRING_PTR(str);
    iov[cnt++].iov_len = (size_t)RSTRING_LEN(str);
    if (RTEST(chunked)) {
        iov[cnt].iov_base = (char *)"\r\n";
        iov[cnt++].iov_len = 2;
    }
    r = out_write(c, iov, cnt);
    RB_GC_GUARD(str);
    return r != WRITE_FAILED ? Qtrue : Qfalse;
}

/* finish_body(chunked) -> true | false; queued bytes are left for the event loop to flush. */
static VALUE conn_finish_body(VALUE self, VALUE chunked)
{
    struct conn *c = get_conn(self);
    struct iovec iov;
    if (!RTEST(chunked)) return Qtrue;
    if (c->fd < 0) return Qfalse;
    iov.iov_base = (char *)"0\r\n\r\n";
    iov.iov_len = 5;
    return out_write(c, &iov, 1) != WRITE_FAILED ? Qtrue : Qfalse;
}

/* flush -> WRITE_DONE | WRITE_PENDING | WRITE_FAILED: sends what the client had not taken. */
static VALUE conn_flush(VALUE self)
{
    struct conn *c = get_conn(self);
    int r = flush_nb(c);
    if (r == WRITE_DONE && c->out_cap > 256 * 1024) { /* no big buffer kept for an idle connection */
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return INT2FIX(r);
}

/* write_error(status): a complete canned response with Connection: close; best effort, never blocks long. */
static VALUE conn_write_error(VALUE self, VALUE vstatus)
{
    struct conn *c = get_conn(self);
    int status = NUM2INT(vstatus);
    size_t sl, dl, rl;
    const char *s = bb_status_line(status, &sl), *d = bb_date_header(&dl);
    char hdr[160];
    struct iovec iov[4];
    int n;
    c->replay_len = 0;
    c->keepalive = 0;
    c->must_linger = 1;
    if (c->fd < 0) return Qfalse;
    /* reason phrase: the status line after "HTTP/1.1 NNN " without CRLF */
    rl = sl > 15 ? sl - 15 : 0;
    n = snprintf(hdr, sizeof(hdr), "Content-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n",
                 c->head_only ? 0 : rl + 1);
    iov[0].iov_base = (char *)s;
    iov[0].iov_len = sl;
    iov[1].iov_base = hdr;
    iov[1].iov_len = (size_t)n;
    iov[2].iov_base = (char *)d;
    iov[2].iov_len = dl;
    {
        /* "\r\n" + "Reason\n" */
        char tail[128];
        size_t tl = 0;
        tail[tl++] = '\r';
        tail[tl++] = '\n';
        if (!c->head_only && rl < sizeof(tail) - 3) {
            memcpy(tail + tl, s + 13, rl);
            tl += rl;
            tail[tl++] = '\n';
        }
        iov[3].iov_base = tail;
        iov[3].iov_len = tl;
        return write_wait(c, iov, 4, BB_ERROR_WRITE_WAIT_MS) == WRITE_DONE ? Qtrue : Qfalse;
    }
}

/* write_continue: "100 Continue" for a client that waits before sending its body. */
static VALUE conn_write_continue(VALUE self)
{
    struct conn *c = get_conn(self);
    struct iovec iov;
    iov.iov_base = (char *)"HTTP/1.1 100 Continue\r\n\r\n";
    iov.iov_len = 25;
    c->expect_continue = 0;
    if (c->fd < 0) return Qfalse;
    return out_write(c, &iov, 1) != WRITE_FAILED ? Qtrue : Qfalse;
}

/*
 * shutdown_write -> true | false: the first stage of closing a connection whose output is all sent
 * (RFC 9112 9.6). Closing a socket that has unread input, or that receives input afterwards, makes
 * the kernel answer with a reset, and a reset can destroy responses the client has not read yet
 * (a pipelined burst cut by max_keepalive_requests, a body the server refused). So the write side is
 * shut (the client sees the end of the responses) and, when the client may still be sending, the
 * caller keeps the connection and discards its input (discard_input) until the client closes too or
 * a deadline passes: true. False when the client asked to close and nothing of it is unread: the
 * caller may close at once. Queued output is dropped (only failure paths close with output queued).
 */
static VALUE conn_shutdown_write(VALUE self)
{
    struct conn *c = get_conn(self);
    int unread = 0;
    if (c->fd < 0) return Qfalse;
    out_discard(c);
    /* nothing unread: not in our buffer, and the socket was drained by the last read (no syscall on
     * the connection-per-request path) or says it holds nothing now. A client that asked to close
     * must not send more (RFC 9112 9.6), so bytes arriving later are its own loss. */
    if (c->client_close && !c->must_linger && c->len == c->off &&
        (c->drained || (ioctl(c->fd, FIONREAD, &unread) == 0 && unread == 0)))
        return Qfalse;
    shutdown(c->fd, SHUT_WR);
    c->off = c->len = 0;
    return Qtrue;
}

/* discard_input -> true when the client has closed (EOF) or failed, false while it may send more:
 * reads and drops what has arrived, at most BB_LINGER_READ_MAX bytes per call. */
static VALUE conn_discard_input(VALUE self)
{
    struct conn *c = get_conn(self);
    static char junk[BB_LINGER_READ_CHUNK];
    size_t total = 0;
    if (c->fd < 0) return Qtrue;
    while (total < BB_LINGER_READ_MAX) {
        ssize_t n = read(c->fd, junk, sizeof(junk));
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Qfalse;
        return Qtrue; /* EOF, or a reset */
    }
    return Qfalse;
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
        queued(c) || c->file_fd >= 0 || c->proxy)
        return Qfalse;
    pass_record(c, &p, c->woke_at > 0 ? c->woke_at : mono_now());
    pthread_mutex_lock(&table_lock); /* the watcher thread reads moved under it */
    r = bb_pass_send(NUM2INT(sock), c->fd, &p, c->buf + c->replay_off, c->replay_len);
    err = errno;
    pass_sent(r, err);
    if (r == 0) c->moved = 1;
    pthread_mutex_unlock(&table_lock);
    if (r == 0) return Qtrue;
    if (err == EAGAIN) return Qnil;
    bb_conn_pass_report(); /* a failed send (counted): the request stays queued here */
    return Qfalse;
}

/* close: at once (the client is gone, or a staged close is over). */
static VALUE conn_close(VALUE self)
{
    struct conn *c = get_conn(self);
    if (c->fd < 0) return Qnil;
    table_drop(c);
    close(c->fd);
    c->fd = -1;
    out_discard(c);
    buf_put(c->buf, c->cap);
    c->buf = NULL;
    c->cap = c->off = c->len = 0;
    c->env_base = Qnil;
    return Qnil;
}

/* detach -> fd: hands the socket over (rack.hijack); the Conn no longer closes it. Output still
 * queued (a 103, the head of a partial hijack) goes first, since the app writes to the socket
 * itself: this waits for the client, at most write_timeout while it takes nothing, and shuts the
 * socket down if it does not, so the app's bytes cannot follow a truncated head. */
static VALUE conn_detach(VALUE self)
{
    struct conn *c = get_conn(self);
    int fd = c->fd;
    if (fd >= 0 && queued(c) && out_drain(c, bb_settings.write_timeout_ms) != WRITE_DONE) shutdown(fd, SHUT_RDWR);
    out_discard(c);
    table_drop(c);
    c->fd = -1;
    return INT2NUM(fd);
}

/* Prepares for the next request on this connection. */
static void conn_next(struct conn *c)
{
    c->requests++;
    c->env = Qnil;
    c->sink = Qnil;
    c->body_mode = BODY_NONE;
    c->body_done = 1;
    c->expect_continue = 0;
    c->head_only = 0; /* client_close stays: finish_response asks shutdown_write after this */
    c->spill_failed = 0;
}

/*
 * next_request(keepalive_seconds) -> the bytes of the next request already read (Integer), or nil
 * when the connection ends with this response (its head said "Connection: close"). Otherwise the
 * connection is IDLE for keepalive_seconds from now (its deadline, on the clock of
 * Process.clock_gettime(Process::CLOCK_MONOTONIC)). A head that promised keep-alive is kept to
 * even when the worker began to stop after it was written: the client may send its next request
 * at once, and a stopping worker answers it (with "Connection: close").
 */
static VALUE conn_next_request(VALUE self, VALUE keepalive_seconds)
{
    struct conn *c = get_conn(self);
    struct timespec ts;
    conn_next(c);
    if (!c->keepalive) return Qnil;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    __atomic_store_n(&c->state, BB_CONN_IDLE, __ATOMIC_RELAXED);
    c->deadline = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + NUM2DBL(keepalive_seconds);
    return LONG2NUM((long)(c->len - c->off));
}

/* Conn.keepalive_policy(max_requests): requests per connection, then "Connection: close" (0 = no
 * cap, 1 = keep-alive off). Once per worker, before it serves. */
static VALUE conn_s_keepalive_policy(VALUE klass, VALUE max)
{
    (void)klass;
    keepalive_max = NUM2LONG(max);
    return Qnil;
}

/* Conn.stopping!: this worker is stopping; every response from now on says "Connection: close". */
static VALUE conn_s_stopping(VALUE klass)
{
    (void)klass;
    __atomic_store_n(&stopping, 1, __ATOMIC_RELAXED);
    return Qnil;
}

#define ATTR_INT(name, field)                                                                                         \
    static VALUE conn_get_##name(VALUE self) { return LONG2NUM((long)get_conn(self)->field); }
#define ATTR_BOOL(name, field)                                                                                        \
    static VALUE conn_get_##name(VALUE self) { return get_conn(self)->field ? Qtrue : Qfalse; }
#define ATTR_VALUE(name)                                                                                              \
    static VALUE conn_get_##name(VALUE self) { return get_conn(self)->name; }                                         \
    static VALUE conn_set_##name(VALUE self, VALUE v) { return get_conn(self)->name = v; }

ATTR_INT(fd, fd)
ATTR_INT(requests, requests)
ATTR_INT(content_length, content_length)
ATTR_BOOL(body_done, body_done)
ATTR_BOOL(expect_continue, expect_continue)
ATTR_BOOL(chunked, body_mode == BODY_CHUNKED)
static VALUE conn_get_pending_output(VALUE self) { return queued(get_conn(self)) ? Qtrue : Qfalse; }
ATTR_BOOL(closed, fd < 0)
ATTR_BOOL(tcp, tcp)
ATTR_BOOL(moved, moved)
ATTR_VALUE(env)
ATTR_VALUE(sink)

static VALUE conn_get_buffered(VALUE self)
{
    struct conn *c = get_conn(self);
    return LONG2NUM((long)(c->len - c->off));
}
static VALUE conn_get_state(VALUE self) { return INT2FIX(get_conn(self)->state); }
static VALUE conn_set_state(VALUE self, VALUE v)
{
    get_conn(self)->state = FIX2INT(v);
    return v;
}
static VALUE conn_get_deadline(VALUE self) { return DBL2NUM(get_conn(self)->deadline); }
static VALUE conn_set_deadline(VALUE self, VALUE v)
{
    get_conn(self)->deadline = NUM2DBL(v);
    return v;
}
static VALUE conn_get_polled(VALUE self) { return get_conn(self)->watched ? Qtrue : Qfalse; }
static VALUE conn_get_watched(VALUE self) { return INT2FIX(get_conn(self)->watched); }
static VALUE conn_set_watched(VALUE self, VALUE v)
{
    get_conn(self)->watched = NUM2INT(v);
    return v;
}
static VALUE conn_get_body_started(VALUE self) { return DBL2NUM(get_conn(self)->body_started); }
static VALUE conn_set_body_started(VALUE self, VALUE v)
{
    get_conn(self)->body_started = NUM2DBL(v);
    return v;
}

static VALUE reg(VALUE v)
{
    rb_gc_register_mark_object(v);
    return v;
}

void bb_init_conn(void)
{
    cConn = rb_define_class_under(bb_mNative, "Conn", rb_cObject);
    rb_define_alloc_func(cConn, conn_alloc);
    rb_define_singleton_method(cConn, "accept", conn_s_accept, -1);
    rb_define_singleton_method(cConn, "spill_probe", conn_s_spill_probe, 0);
    rb_define_singleton_method(cConn, "receive", conn_s_receive, -1);
    rb_define_method(cConn, "moved?", conn_get_moved, 0);
    rb_define_method(cConn, "fill", conn_fill, 1);
    rb_define_method(cConn, "start_app", conn_start_app, 1);
    rb_define_method(cConn, "parse_proxy", conn_parse_proxy, 0);
    rb_define_method(cConn, "parse", conn_parse, 0);
    rb_define_method(cConn, "body_take", conn_body_take, 0);
    rb_define_method(cConn, "write_response", conn_write_response, 4);
    rb_define_method(cConn, "write_file", conn_write_file, 3);
    rb_define_method(cConn, "polled?", conn_get_polled, 0);
    rb_define_method(cConn, "watched", conn_get_watched, 0);
    rb_define_method(cConn, "watched=", conn_set_watched, 1);
    rb_define_method(cConn, "write_part", conn_write_part, 2);
    rb_define_method(cConn, "finish_body", conn_finish_body, 1);
    rb_define_method(cConn, "flush", conn_flush, 0);
    rb_define_method(cConn, "write_error", conn_write_error, 1);
    rb_define_method(cConn, "write_continue", conn_write_continue, 0);
    rb_define_method(cConn, "write_hints", conn_write_hints, 1);
    rb_define_method(cConn, "close", conn_close, 0);
    rb_define_method(cConn, "pass", conn_pass, 1);
    rb_define_method(cConn, "pass_request", conn_pass_request, 1);
    rb_define_method(cConn, "shutdown_write", conn_shutdown_write, 0);
    rb_define_method(cConn, "discard_input", conn_discard_input, 0);
    rb_define_method(cConn, "detach", conn_detach, 0);
    rb_define_method(cConn, "next_request", conn_next_request, 1);
    rb_define_singleton_method(cConn, "keepalive_policy", conn_s_keepalive_policy, 1);
    rb_define_singleton_method(cConn, "stopping!", conn_s_stopping, 0);
    rb_define_method(cConn, "fd", conn_get_fd, 0);
    rb_define_method(cConn, "requests", conn_get_requests, 0);
    rb_define_method(cConn, "content_length", conn_get_content_length, 0);
    rb_define_method(cConn, "body_done?", conn_get_body_done, 0);
    rb_define_method(cConn, "expect_continue?", conn_get_expect_continue, 0);
    rb_define_method(cConn, "chunked?", conn_get_chunked, 0);
    rb_define_method(cConn, "pending_output?", conn_get_pending_output, 0);
    rb_define_method(cConn, "closed?", conn_get_closed, 0);
    rb_define_method(cConn, "tcp?", conn_get_tcp, 0);
    rb_define_method(cConn, "buffered", conn_get_buffered, 0);
    rb_define_method(cConn, "state", conn_get_state, 0);
    rb_define_method(cConn, "state=", conn_set_state, 1);
    rb_define_method(cConn, "deadline", conn_get_deadline, 0);
    rb_define_method(cConn, "deadline=", conn_set_deadline, 1);
    rb_define_method(cConn, "env", conn_get_env, 0);
    rb_define_method(cConn, "env=", conn_set_env, 1);
    rb_define_method(cConn, "sink", conn_get_sink, 0);
    rb_define_method(cConn, "sink=", conn_set_sink, 1);
    rb_define_method(cConn, "body_started", conn_get_body_started, 0);
    rb_define_method(cConn, "body_started=", conn_set_body_started, 1);
    rb_define_const(cConn, "IDLE", INT2FIX(BB_CONN_IDLE));
    rb_define_const(cConn, "HEAD", INT2FIX(BB_CONN_HEAD));
    rb_define_const(cConn, "BODY", INT2FIX(BB_CONN_BODY));
    rb_define_const(cConn, "WRITE", INT2FIX(BB_CONN_WRITE));
    rb_define_const(cConn, "BUSY", INT2FIX(BB_CONN_BUSY));
    rb_define_const(cConn, "LINGER", INT2FIX(BB_CONN_LINGER));
    rb_define_const(cConn, "WRITE_DONE", INT2FIX(WRITE_DONE));
    rb_define_const(cConn, "WRITE_PENDING", INT2FIX(WRITE_PENDING));
    rb_define_const(cConn, "STREAM_CHUNKED", INT2FIX(STREAM_CHUNKED));
    rb_define_const(cConn, "STREAM_RAW", INT2FIX(STREAM_RAW));
    rb_define_const(cConn, "WRITE_FAILED", INT2FIX(WRITE_FAILED));

    k_request_method = reg(bb_fstring("REQUEST_METHOD", 14));
    k_path_info = reg(bb_fstring("PATH_INFO", 9));
    k_query_string = reg(bb_fstring("QUERY_STRING", 12));
    k_request_uri = reg(bb_fstring("REQUEST_URI", 11));
    k_server_protocol = reg(bb_fstring("SERVER_PROTOCOL", 15));
    k_http_version = reg(bb_fstring("HTTP_VERSION", 12));
    k_remote_addr = reg(bb_fstring("REMOTE_ADDR", 11));
    k_server_name = reg(bb_fstring("SERVER_NAME", 11));
    k_server_port = reg(bb_fstring("SERVER_PORT", 11));
    k_http_host = reg(bb_fstring("HTTP_HOST", 9));
    k_content_length = reg(bb_fstring("CONTENT_LENGTH", 14));
    k_content_type = reg(bb_fstring("CONTENT_TYPE", 12));
    k_connection = reg(bb_fstring("blackbuck.connection", 20));
    k_early_hints = reg(bb_fstring("rack.early_hints", 16));
    k_queue_time = reg(bb_fstring("blackbuck.queue_time", 20));
    v_http10 = reg(bb_fstring("HTTP/1.0", 8));
    v_http11 = reg(bb_fstring("HTTP/1.1", 8));
    v_port80 = reg(bb_fstring("80", 2));
    v_port443 = reg(bb_fstring("443", 3));
    k_url_scheme = reg(bb_fstring("rack.url_scheme", 15));
    v_https = reg(bb_fstring("https", 5));
    v_empty = reg(bb_fstring("", 0)); /* QUERY_STRING when there is none: shared and frozen */
    {
        size_t i;
        for (i = 0; i < KNOWN_N(known_headers); i++)
            known_headers[i].value = reg(env_key(known_headers[i].name, known_headers[i].len));
        for (i = 0; i < KNOWN_N(known_methods); i++)
            known_methods[i].value = reg(bb_fstring(known_methods[i].name, (long)known_methods[i].len));
    }
}
