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
 *   pass(sock), pass_request(sock) -> moved to another worker (bb_conn_table.c)
 *
 * Output the client does not take at once is queued, in order: in memory up to response_buffer
 * bytes, then in an anonymous spill file in $TMPDIR up to max_response_spill bytes; flush sends
 * memory first, then the spill file, then a response's file body (write_file), which is always
 * the last thing queued; what no spill file can take (past the caps, or the file could not be
 * written) is held in memory behind it (BB_OUT_HELD_MAX for the worker). A write never waits for the
 * client: output that fits in none of them ends the response (its connection closes).
 *
 * This file holds the connection's life (accept, read buffer, body framing, close and linger, the
 * settings); parse is bb_env.c's, the writes and the output queue bb_respond.c's (bb_out.c), the
 * fd table and moves bb_conn_table.c's (bb_conn_int.h lists them).
 */
#include "bb_conn_int.h"
#include "bb_proxy.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#ifdef __linux__
#include <linux/sockios.h> /* SIOCOUTQ */
#endif

/* Bytes a lingering connection's input is read in (and discarded) per read(2). */
#define BB_LINGER_READ_CHUNK (64 * 1024)
/* Bytes discarded per discard_input call at most, so one flooding client cannot keep the worker
 * reading: the event loop comes back to it. */
#define BB_LINGER_READ_MAX (1024 * 1024)

struct bb_settings bb_settings;
VALUE bb_cConn;
long bb_keepalive_max;
struct bb_spill_pool bb_spill_pool;

/* Read buffers of BB_BUF_INITIAL bytes kept for reuse: a connection-per-request load would
 * otherwise malloc and free one per connection. */
#define BB_BUF_POOL 64
static char *buf_pool[BB_BUF_POOL];
static int buf_pool_n;

/* A connection is made only once Native.configure has given the settings (bb_settings): checked
 * here, once per connection (accept, receive), so no method of a Conn checks again. */
static void require_settings(void)
{
    if (!bb_settings.configured)
        rb_raise(rb_eRuntimeError, "Blackbuck::Native.configure must be called first (with Blackbuck::Config#values)");
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
static void conn_mark(void *p)
{
    struct conn *c = p;
    rb_gc_mark(c->remote_addr);
    rb_gc_mark(c->template);
    rb_gc_mark(c->env_base);
    rb_gc_mark(c->req_method);
    rb_gc_mark(c->req_path);
}

int64_t bb_spill_total(void) { return bb_spill_pool.total; }

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
    return sizeof(*c) + c->cap + c->out.cap;
}

const rb_data_type_t bb_conn_type = {
    .wrap_struct_name = "Blackbuck::Native::Conn",
    .function = {.dmark = conn_mark, .dfree = conn_free, .dsize = conn_memsize},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE conn_alloc(VALUE klass)
{
    struct conn *c;
    VALUE obj = TypedData_Make_Struct(klass, struct conn, &bb_conn_type, c);
    c->fd = -1;
    bb_out_init(&c->out);
    c->remote_addr = c->template = c->env_base = c->req_method = c->req_path = Qnil;
    return obj;
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
    require_settings();
    fd = bb_accept(NUM2INT(lfd), RTEST(tcp), &addr);
    if (fd < 0) return Qnil;
    obj = conn_alloc(klass);
    conn_setup(get_conn(obj), fd, addr, tmpl, RTEST(tcp), RTEST(proxy), NIL_P(index) ? 0 : NUM2INT(index));
    return obj;
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
        n = recv(c->fd, c->buf + c->len, room, 0); /* (a socket: recv skips read's VFS layers) */
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

/*
 * Conn.receive(sock_fd, listeners, wake_fd = nil, last = false) -> a connection another worker moved
 * here, nil when none is queued, or false for a message that could not be used (its socket is
 * closed). listeners: for each listener index, [env_template, tcp]. wake_fd: the hand-off socket's
 * send end. last: take it with the smaller reserve of descriptors (no worker with room took it).
 * Raises as bb_conn_take says (bb_conn_table.c) when this worker has no descriptor to spare or the
 * kernel dropped the connection.
 */
static VALUE conn_s_receive(int argc, VALUE *argv, VALUE klass)
{
    static char carried[BB_PASS_BYTES_MAX]; /* the loop thread's alone */
    size_t carried_len;
    struct bb_pass p;
    VALUE sock, listeners, wake, last, entry, addr, obj;
    struct conn *c;
    int fd;
    rb_scan_args(argc, argv, "22", &sock, &listeners, &wake, &last);
    require_settings();
    fd = bb_conn_take(NUM2INT(sock), NIL_P(wake) ? -1 : NUM2INT(wake), RTEST(last), &p, carried, sizeof(carried),
                      &carried_len);
    if (fd == BB_TAKE_NONE) return Qnil;
    if (fd == BB_TAKE_UNUSABLE) return Qfalse;
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

/* pass(sock_fd) -> true when the connection went to another worker over sock_fd (the hand-off
 * socket; then close it here and forget it), false when it is not one that may move (see
 * bb_conn_pass) or the queue is full. The worker's loop thread moves its own connections this way
 * when all its app threads are busy (Worker's --threads). */
static VALUE conn_pass(VALUE self, VALUE sock)
{
    struct conn *c = get_conn(self);
    if (c->fd < 0) return Qfalse;
    return bb_conn_pass(c->fd, NUM2INT(sock), mono_now(), BB_PASS_OWNER) == 1 ? Qtrue : Qfalse;
}

/* Conn.pass_wake(sock_fd) -> true when a wake-up went to the hand-off socket (bb_pass_wake): a worker
 * that could not accept (EMFILE) had the listener's one wake-up (EPOLLEXCLUSIVE), so the worker this
 * wakes looks at its listeners (Balancer#adopt_one) and the queued connection is not stranded. */
static VALUE conn_s_pass_wake(VALUE klass, VALUE sock)
{
    (void)klass;
    return bb_pass_wake(NUM2INT(sock)) == 0 ? Qtrue : Qfalse;
}

/* pass_idle(sock_fd) -> as #pass, for a connection whose next request has not begun too: a worker
 * that retires while its siblings serve on moves its idle keep-alive connections to them
 * (Balancer#move_idle) rather than close them under a client that may be sending. */
static VALUE conn_pass_idle(VALUE self, VALUE sock)
{
    struct conn *c = get_conn(self);
    if (c->fd < 0) return Qfalse;
    return bb_conn_pass(c->fd, NUM2INT(sock), mono_now(), BB_PASS_IDLE) == 1 ? Qtrue : Qfalse;
}

/* pass_request(sock_fd) -> true when the connection went to another worker over sock_fd with the
 * request parse returned last, not yet started (its bytes travel in the message and the receiver
 * parses them again; close it here and forget it). False when that request cannot move: it has a
 * body, more bytes came behind it, a response has started, or it is larger than a message carries.
 * Nil when the queue is full. The loop thread takes back this way a request it had queued for its
 * app threads while they are all busy, when another worker has a free one (bb_conn_pass_request). */
static VALUE conn_pass_request(VALUE self, VALUE sock)
{
    int r = bb_conn_pass_request(get_conn(self), NUM2INT(sock));
    return r > 0 ? Qtrue : r < 0 ? Qnil : Qfalse;
}

/* Prepares for the next request on this connection. */
static void conn_next(struct conn *c)
{
    c->requests++;
    c->body_mode = BODY_NONE;
    c->body_done = 1;
    c->expect_continue = 0;
    c->head_only = 0; /* client_close stays: finish_response asks shutdown_write after this */
    bb_out_next(&c->out);
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
    bb_keepalive_max = NUM2LONG(max);
    return Qnil;
}

#define ATTR_INT(name, field)                                                                                         \
    static VALUE conn_get_##name(VALUE self) { return LONG2NUM((long)get_conn(self)->field); }
#define ATTR_BOOL(name, field)                                                                                        \
    static VALUE conn_get_##name(VALUE self) { return get_conn(self)->field ? Qtrue : Qfalse; }

ATTR_INT(fd, fd)
ATTR_INT(requests, requests)
ATTR_INT(content_length, content_length)
ATTR_BOOL(body_done, body_done)
ATTR_BOOL(expect_continue, expect_continue)
ATTR_BOOL(chunked, body_mode == BODY_CHUNKED)
static VALUE conn_get_pending_output(VALUE self) { return queued(get_conn(self)) ? Qtrue : Qfalse; }
/* queued_bytes -> bytes of response output the client has not taken yet (a stream's back-pressure). */
static VALUE conn_get_queued_bytes(VALUE self) { return LL2NUM((long long)bb_out_queued_bytes(&get_conn(self)->out)); }
ATTR_BOOL(closed, fd < 0)
ATTR_BOOL(tcp, tcp)
ATTR_BOOL(moved, moved)

static VALUE conn_get_buffered(VALUE self)
{
    struct conn *c = get_conn(self);
    return LONG2NUM((long)(c->len - c->off));
}
static VALUE conn_get_state(VALUE self) { return INT2FIX(get_conn(self)->state); }
static VALUE conn_get_deadline(VALUE self) { return DBL2NUM(get_conn(self)->deadline); }

/*
 * enter(state, seconds) -> nil: the connection is in `state` from now on, and its deadline is `seconds`
 * from now (CLOCK_MONOTONIC, the clock Connections#expire compares with). Every change of state and
 * deadline the worker makes is this one call (next_request makes its own), so a deadline is never
 * set apart from the state it belongs to.
 */
static VALUE conn_enter(VALUE self, VALUE state, VALUE seconds)
{
    struct conn *c = get_conn(self);
    c->state = FIX2INT(state);
    c->deadline = mono_now() + NUM2DBL(seconds);
    return Qnil;
}

/* extend(seconds) -> nil: the same state, a deadline `seconds` from now (a slow reader took some bytes). */
static VALUE conn_extend(VALUE self, VALUE seconds)
{
    get_conn(self)->deadline = mono_now() + NUM2DBL(seconds);
    return Qnil;
}

/* shorten(deadline) -> nil: the deadline becomes `deadline` if that is sooner (a stopping worker's
 * idle connections drain until then). */
static VALUE conn_shorten(VALUE self, VALUE deadline)
{
    struct conn *c = get_conn(self);
    double d = NUM2DBL(deadline);
    if (d < c->deadline) c->deadline = d;
    return Qnil;
}

/* unsent -> bytes of output the kernel still holds for the client: not sent yet or, on TCP, not
 * acknowledged; on a UNIX socket, not read by the client yet. 0 where the kernel cannot say. A
 * stopping worker keeps an idle connection whose client has not taken its last answer yet. */
static VALUE conn_get_unsent(VALUE self)
{
    int n = 0;
#ifdef SIOCOUTQ
    struct conn *c = get_conn(self);
    if (c->fd < 0 || ioctl(c->fd, SIOCOUTQ, &n) != 0) n = 0;
#else
    (void)self;
#endif
    return INT2NUM(n);
}

static VALUE conn_get_polled(VALUE self) { return get_conn(self)->watched ? Qtrue : Qfalse; }

int bb_conn_watch_slot(VALUE self, int **watched)
{
    struct conn *c = get_conn(self);
    *watched = &c->watched;
    return c->fd;
}

/* The value of setting `name` in the settings Hash; KeyError when it is missing. */
static VALUE setting(VALUE h, const char *name) { return rb_hash_fetch(h, ID2SYM(rb_intern(name))); }

/*
 * Native.configure(settings) -- once at boot, from the server's Config (a Hash with at least the
 * keys read here; Server.configure_native passes Config#values), before any connection is made:
 * the settings have no values in C until then. A missing key raises KeyError, an invalid value
 * ArgumentError, and either leaves the settings as they were.
 */
static VALUE native_configure(VALUE self, VALUE h)
{
    struct bb_settings s; /* all read and checked first: a raise leaves bb_settings as it was */
    long headers;
    long long spill, worker_spill;
    Check_Type(h, T_HASH);
    headers = NUM2LONG(setting(h, "max_headers"));
    if (headers < 1 || headers > BB_HEADERS_CAP) rb_raise(rb_eArgError, "max_headers must be 1..%d", BB_HEADERS_CAP);
    spill = NUM2LL(setting(h, "max_response_spill"));
    if (spill < 0) rb_raise(rb_eArgError, "max_response_spill must be >= 0");
    worker_spill = NUM2LL(setting(h, "max_worker_spill"));
    if (worker_spill < 0) rb_raise(rb_eArgError, "max_worker_spill must be >= 0");
    memset(&s, 0, sizeof(s));
    s.limits.max_request_line = NUM2SIZET(setting(h, "max_request_line"));
    s.limits.max_uri = NUM2SIZET(setting(h, "max_uri"));
    s.limits.max_headers = (size_t)headers;
    s.limits.max_header_bytes = NUM2SIZET(setting(h, "max_header_bytes"));
    s.write_timeout_ms = (int)(NUM2DBL(setting(h, "write_timeout")) * 1000);
    s.out.mem_max = NUM2SIZET(setting(h, "response_buffer"));
    s.out.spill_max = (int64_t)spill;
    s.out.pool_max = (int64_t)worker_spill;
    s.out.held_max = BB_OUT_HELD_MAX;
    s.trust_forwarded_proto = RTEST(setting(h, "trust_forwarded_proto"));
    s.configured = 1;
    bb_settings = s;
    return Qnil;
}

static VALUE native_http_impl(VALUE self)
{
    return rb_str_new_cstr(bb_http_impl());
}

void bb_init_conn(void)
{
    VALUE cConn;
    rb_define_module_function(bb_mNative, "configure", native_configure, 1);
    rb_define_module_function(bb_mNative, "http_impl", native_http_impl, 0);

    cConn = rb_define_class_under(bb_mNative, "Conn", rb_cObject);
    rb_undef_alloc_func(cConn); /* a Conn comes from accept or receive, once configured */
    bb_cConn = cConn;
    rb_define_singleton_method(cConn, "accept", conn_s_accept, -1);
    rb_define_singleton_method(cConn, "receive", conn_s_receive, -1);
    rb_define_method(cConn, "pass", conn_pass, 1);
    rb_define_method(cConn, "pass_idle", conn_pass_idle, 1);
    rb_define_singleton_method(cConn, "pass_wake", conn_s_pass_wake, 1);
    rb_define_method(cConn, "pass_request", conn_pass_request, 1);
    rb_define_method(cConn, "moved?", conn_get_moved, 0);
    rb_define_method(cConn, "fill", conn_fill, 1);
    rb_define_method(cConn, "parse_proxy", conn_parse_proxy, 0);
    rb_define_method(cConn, "body_take", conn_body_take, 0);
    rb_define_method(cConn, "polled?", conn_get_polled, 0);
    rb_define_method(cConn, "close", conn_close, 0);
    rb_define_method(cConn, "shutdown_write", conn_shutdown_write, 0);
    rb_define_method(cConn, "discard_input", conn_discard_input, 0);
    rb_define_method(cConn, "next_request", conn_next_request, 1);
    rb_define_singleton_method(cConn, "keepalive_policy", conn_s_keepalive_policy, 1);
    rb_define_method(cConn, "fd", conn_get_fd, 0);
    rb_define_method(cConn, "requests", conn_get_requests, 0);
    rb_define_method(cConn, "content_length", conn_get_content_length, 0);
    rb_define_method(cConn, "body_done?", conn_get_body_done, 0);
    rb_define_method(cConn, "expect_continue?", conn_get_expect_continue, 0);
    rb_define_method(cConn, "chunked?", conn_get_chunked, 0);
    rb_define_method(cConn, "pending_output?", conn_get_pending_output, 0);
    rb_define_method(cConn, "queued_bytes", conn_get_queued_bytes, 0);
    rb_define_method(cConn, "unsent", conn_get_unsent, 0);
    rb_define_method(cConn, "closed?", conn_get_closed, 0);
    rb_define_method(cConn, "tcp?", conn_get_tcp, 0);
    rb_define_method(cConn, "buffered", conn_get_buffered, 0);
    rb_define_method(cConn, "state", conn_get_state, 0);
    rb_define_method(cConn, "enter", conn_enter, 2);
    rb_define_method(cConn, "extend_deadline", conn_extend, 1);
    rb_define_method(cConn, "shorten_deadline", conn_shorten, 1);
    rb_define_method(cConn, "deadline", conn_get_deadline, 0);
    rb_define_const(cConn, "IDLE", INT2FIX(BB_CONN_IDLE));
    rb_define_const(cConn, "HEAD", INT2FIX(BB_CONN_HEAD));
    rb_define_const(cConn, "BODY", INT2FIX(BB_CONN_BODY));
    rb_define_const(cConn, "WRITE", INT2FIX(BB_CONN_WRITE));
    rb_define_const(cConn, "BUSY", INT2FIX(BB_CONN_BUSY));
    rb_define_const(cConn, "LINGER", INT2FIX(BB_CONN_LINGER));
    rb_define_const(cConn, "STREAM", INT2FIX(BB_CONN_STREAM));
    rb_define_const(cConn, "WRITE_DONE", INT2FIX(WRITE_DONE));
    rb_define_const(cConn, "WRITE_PENDING", INT2FIX(WRITE_PENDING));
    rb_define_const(cConn, "STREAM_CHUNKED", INT2FIX(STREAM_CHUNKED));
    rb_define_const(cConn, "STREAM_RAW", INT2FIX(STREAM_RAW));
    rb_define_const(cConn, "WRITE_FAILED", INT2FIX(WRITE_FAILED));
}
