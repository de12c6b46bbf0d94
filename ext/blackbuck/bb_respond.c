/*
 * bb_respond.c - writing a response: its head (status line, the app's fields validated, the
 * server's Connection and Date), its body from an Array, in parts, or from a file (sendfile), 103
 * Early Hints, 100 Continue, canned error answers; the connection's output queue (bb_out.c) for
 * what the client does not take at once; and handing the socket to the app once its output is out
 * (detach, rack.hijack). Keep-alive is decided here (keepalive_allowed).
 */
#include "bb_conn_int.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif
/* iovecs kept on the stack for a response; larger Array bodies use a Ruby-owned buffer. */
#define BB_IOV_STACK 64
/* Bytes write_file may still add to a head once the file is open (Content-Length, Connection and
 * Date fields, the empty line): reserved before the open, so no allocation can fail while it is. */
#define BB_HEAD_TAIL_MAX 160
/* An error answer waits at most this long for a client that is not reading (it is then closed anyway). */
#define BB_ERROR_WRITE_WAIT_MS 100
/* The response head under construction. A worker builds one response at a time and copies
 * whatever the client does not take at once into that connection's own out buffer, so one
 * buffer per process serves every connection (no malloc per connection). */
static struct {
    char *buf;
    size_t cap, len;
} head;

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

/* The spill file could not be made or written (op, errno err): from now on until the next request
 * this connection's output is held in memory instead (BB_OUT_HELD_MAX for the worker). One warning
 * line says why. */
static void spill_warn(const char *op, int err)
{
    bb_warn(rb_sprintf("cannot spill a response to %s (%s: %s): it is held in memory instead (%d MiB at most "
                       "for the worker's responses)",
                       bb_out_spill_dir(), op, strerror(err), BB_OUT_HELD_MAX / (1024 * 1024)));
}

/* 1 once a response fitted nowhere and was cut, until the worker holds nothing again: one line. */
static int cut_logged;

/* A response's rest fits in no queue: the memory queue, spill files and held memory are all full. The
 * worker does not wait for the client (that would hold every other connection up to write_timeout):
 * the response is cut and its connection closes. Logged once until the worker holds nothing again. */
static void cut_warn(struct conn *c, size_t left)
{
    if (cut_logged) return;
    cut_logged = 1;
    bb_warn(rb_sprintf("a response to a client that does not take it fits in no queue (%zu bytes left; the "
                       "worker holds %lld bytes in spill files and %lld in memory behind them, at most %lld and "
                       "%d MiB): the response is cut and its connection closed, rather than the worker waiting "
                       "for the client; logged again after the worker has held nothing",
                       left, (long long)bb_spill_pool.total, (long long)bb_spill_pool.held,
                       (long long)bb_settings.out.pool_max, BB_OUT_HELD_MAX / (1024 * 1024)));
    (void)c;
}

/* Conn.spill_probe -> nil | "DIR: reason": makes and drops one spill file, so a $TMPDIR that
 * cannot take them is reported at boot rather than at the first slow reader. */
static VALUE conn_s_spill_probe(VALUE klass)
{
    const char *dir = bb_out_spill_dir();
    int fd = bb_out_spill_open(dir);
    if (fd < 0) return rb_sprintf("%s: %s", dir, strerror(errno));
    close(fd);
    return Qnil;
}

/* Queues iov[*i, cnt) behind what is queued (bb_out_queue); what is left fits nowhere. */
static void queue_iov(struct conn *c, struct iovec *iov, int *i, int cnt)
{
    const char *op;
    if (bb_spill_pool.held == 0) cut_logged = 0;
    if (bb_out_queue(&c->out, &bb_spill_pool, &bb_settings.out, iov, i, cnt, &op) == 0) return;
    if (!op) rb_raise(rb_eNoMemError, "response buffer");
    spill_warn(op, errno);
}

/* Sends queued output without waiting (bb_out_flush); a file body that ends before the length
 * promised for it fails the connection, which must then close. WRITE_DONE, WRITE_PENDING or WRITE_FAILED. */
static int flush_nb(struct conn *c)
{
    int r = bb_out_flush(&c->out, c->fd, &bb_spill_pool);
    if (r == BB_OUT_SHORT) {
        int64_t at = c->out.file_off, end = c->out.file_end;
        bb_out_file_close(&c->out);
        bb_warn(rb_sprintf("a file body ended at byte %lld of the %lld promised (the file shrank while it "
                           "was sent): connection closed",
                           (long long)at, (long long)end));
        return WRITE_FAILED;
    }
    return r;
}

/*
 * Sends iov[0, cnt) behind whatever is queued, never reordering. What the socket does not take
 * is queued (queue_iov), and the event loop sends it when the client takes it; it never waits for
 * the client. What fits in no queue (cut_warn) fails the write: the connection closes.
 * Returns WRITE_DONE (all sent), WRITE_PENDING (some queued for flush) or WRITE_FAILED.
 */
static int out_write(struct conn *c, struct iovec *iov, int cnt)
{
    int i = 0;
    if (c->out.file_fd >= 0) rb_raise(rb_eRuntimeError, "[BUG] output written behind a queued file body");
    bb_iov_skip(iov, &i, cnt, 0);
    while (i < cnt) {
        if (queued(c) && flush_nb(c) == WRITE_FAILED) return WRITE_FAILED;
        if (!queued(c)) {
            ssize_t w = writev(c->fd, iov + i, cnt - i > IOV_MAX ? IOV_MAX : cnt - i);
            if (w >= 0) {
                bb_iov_skip(iov, &i, cnt, (size_t)w);
                continue;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return WRITE_FAILED;
        }
        queue_iov(c, iov, &i, cnt);
        if (i < cnt) {
            size_t left = 0;
            int k;
            for (k = i; k < cnt; k++) left += iov[k].iov_len;
            cut_warn(c, left);
            return WRITE_FAILED;
        }
    }
    return queued(c) ? WRITE_PENDING : WRITE_DONE;
}

/* Sends everything queued, waiting up to wait_ms each time the client takes nothing:
 * WRITE_DONE or WRITE_FAILED. */
static int drain(struct conn *c, int wait_ms)
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
    if (drain(c, wait_ms) != WRITE_DONE) return WRITE_FAILED;
    bb_iov_skip(iov, &i, cnt, 0);
    while (i < cnt) {
        ssize_t w = writev(c->fd, iov + i, cnt - i > IOV_MAX ? IOV_MAX : cnt - i);
        if (w >= 0) {
            bb_iov_skip(iov, &i, cnt, (size_t)w);
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

/* One value of field key: p, n is a line of `value` (Rack 2 joins several with "\n"). A control byte
 * other than HTAB, or DEL, is refused (RFC 9110 5.5: CR, LF and NUL could end the field and start
 * another, and proxies pass the others on; bb_field_value_end). Raises ArgumentError naming the field
 * and showing the whole value the app gave, escaped. */
static void check_value(VALUE key, const char *p, size_t n, VALUE value, const char *what)
{
    if (bb_field_value_end(p, n) != n)
        rb_raise(rb_eArgError, "invalid value of %s %" PRIsVALUE ": %" PRIsVALUE
                 " (control bytes other than HTAB are not allowed)", what, field_shown(key), field_shown(value));
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
           (bb_keepalive_max <= 0 || c->requests + 1 < bb_keepalive_max);
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
    bb_out_file(&c->out, f->fd, f->size);
    f->fd = -1;
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

/* write_part(str, chunked) -> true | false (client gone, or the part fits in no queue) */
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
    if (r == WRITE_DONE) bb_out_trim(&c->out); /* no big buffer kept for an idle connection */
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

/* detach -> fd: hands the socket over (rack.hijack); the Conn no longer closes it. Output still
 * queued (a 103, the head of a partial hijack) goes first, since the app writes to the socket
 * itself: this waits for the client, at most write_timeout while it takes nothing, and shuts the
 * socket down if it does not, so the app's bytes cannot follow a truncated head. */
static VALUE conn_detach(VALUE self)
{
    struct conn *c = get_conn(self);
    int fd = c->fd;
    if (fd >= 0 && queued(c) && drain(c, bb_settings.write_timeout_ms) != WRITE_DONE) shutdown(fd, SHUT_RDWR);
    out_discard(c);
    table_drop(c);
    c->fd = -1;
    return INT2NUM(fd);
}

/* Conn.stopping!: this worker is stopping; every response from now on says "Connection: close". */
static VALUE conn_s_stopping(VALUE klass)
{
    (void)klass;
    __atomic_store_n(&stopping, 1, __ATOMIC_RELAXED);
    return Qnil;
}

/* Conn.serving!: this process serves (a worker forked from the mold, which inherited the flag set
 * when the worker that forked the mold stopped serving): responses keep connections alive again. */
static VALUE conn_s_serving(VALUE klass)
{
    (void)klass;
    __atomic_store_n(&stopping, 0, __ATOMIC_RELAXED);
    return Qnil;
}

void bb_init_respond(void)
{
    VALUE cConn = bb_cConn;
    rb_define_singleton_method(cConn, "spill_probe", conn_s_spill_probe, 0);
    rb_define_method(cConn, "write_response", conn_write_response, 4);
    rb_define_method(cConn, "write_file", conn_write_file, 3);
    rb_define_method(cConn, "write_part", conn_write_part, 2);
    rb_define_method(cConn, "finish_body", conn_finish_body, 1);
    rb_define_method(cConn, "flush", conn_flush, 0);
    rb_define_method(cConn, "write_error", conn_write_error, 1);
    rb_define_method(cConn, "write_continue", conn_write_continue, 0);
    rb_define_method(cConn, "write_hints", conn_write_hints, 1);
    rb_define_method(cConn, "detach", conn_detach, 0);
    rb_define_singleton_method(cConn, "stopping!", conn_s_stopping, 0);
    rb_define_singleton_method(cConn, "serving!", conn_s_serving, 0);
}
