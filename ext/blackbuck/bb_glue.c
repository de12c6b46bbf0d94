/*
 * bb_glue.c - see bb_glue.h: Blackbuck::Native's process-wide helpers: the cached Date header,
 * status lines, accept4, peer addresses, the logger, waiting for a socket without the GVL.
 */
#include "bb_glue.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

VALUE bb_mBlackbuck, bb_mNative;
static VALUE logger = Qnil;

static char *status_lines[600];
static size_t status_line_lens[600];

const char *bb_status_line(int status, size_t *len)
{
    static char fallback[32];
    if (status >= 100 && status < 600 && status_lines[status]) {
        *len = status_line_lens[status];
        return status_lines[status];
    }
    *len = (size_t)snprintf(fallback, sizeof(fallback), "HTTP/1.1 %03d \r\n", status % 1000);
    return fallback;
}

/* The reason phrase of every status code in IANA's HTTP Status Code Registry, so each one goes out
 * with its phrase whichever Rack the app runs on: Rack 3's table lacks 418, 306 and 510, Rack 2.2's
 * lacks 418. Rack's table is applied over this one at boot (Native.set_reason), so an app sees its
 * Rack's wording where the two differ (Rack 2.2: 413 Payload Too Large). Left out: 306 and 418,
 * which the registry lists as "(Unused)", except that 418 is sent as "I'm a teapot": RFC 9110
 * 15.5.19 reserves it because deployed code answers it (RFC 2324's phrase, as Go and Python send
 * it); 104 and other temporary registrations. A code without a phrase still goes out, with an
 * empty one ("HTTP/1.1 299 "), as RFC 9112 4 allows. */
static const struct {
    int code;
    const char *phrase;
} registered_reasons[] = {
    {100, "Continue"}, {101, "Switching Protocols"}, {102, "Processing"}, {103, "Early Hints"},
    {200, "OK"}, {201, "Created"}, {202, "Accepted"}, {203, "Non-Authoritative Information"},
    {204, "No Content"}, {205, "Reset Content"}, {206, "Partial Content"}, {207, "Multi-Status"},
    {208, "Already Reported"}, {226, "IM Used"},
    {300, "Multiple Choices"}, {301, "Moved Permanently"}, {302, "Found"}, {303, "See Other"},
    {304, "Not Modified"}, {305, "Use Proxy"}, {307, "Temporary Redirect"}, {308, "Permanent Redirect"},
    {400, "Bad Request"}, {401, "Unauthorized"}, {402, "Payment Required"}, {403, "Forbidden"},
    {404, "Not Found"}, {405, "Method Not Allowed"}, {406, "Not Acceptable"},
    {407, "Proxy Authentication Required"}, {408, "Request Timeout"}, {409, "Conflict"}, {410, "Gone"},
    {411, "Length Required"}, {412, "Precondition Failed"}, {413, "Content Too Large"},
    {414, "URI Too Long"}, {415, "Unsupported Media Type"}, {416, "Range Not Satisfiable"},
    {417, "Expectation Failed"}, {418, "I'm a teapot"}, {421, "Misdirected Request"},
    {422, "Unprocessable Content"}, {423, "Locked"}, {424, "Failed Dependency"}, {425, "Too Early"},
    {426, "Upgrade Required"}, {428, "Precondition Required"}, {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"}, {451, "Unavailable For Legal Reasons"},
    {500, "Internal Server Error"}, {501, "Not Implemented"}, {502, "Bad Gateway"},
    {503, "Service Unavailable"}, {504, "Gateway Timeout"}, {505, "HTTP Version Not Supported"},
    {506, "Variant Also Negotiates"}, {507, "Insufficient Storage"}, {508, "Loop Detected"},
    {510, "Not Extended"}, {511, "Network Authentication Required"},
};

#define REASON_MAX 80 /* bytes of a reason phrase kept */

/* Makes "HTTP/1.1 NNN phrase\r\n" the status line of code c (100..599). */
static void set_status_line(int c, const char *phrase, size_t len)
{
    char buf[128];
    int n = snprintf(buf, sizeof(buf), "HTTP/1.1 %d %.*s\r\n", c, (int)(len > REASON_MAX ? REASON_MAX : len), phrase);
    char *line = malloc((size_t)n + 1);
    if (!line) rb_raise(rb_eNoMemError, "status line");
    memcpy(line, buf, (size_t)n + 1);
    free(status_lines[c]);
    status_lines[c] = line;
    status_line_lens[c] = (size_t)n;
}

/* Native.set_reason(code, phrase): called once per entry of Rack::Utils::HTTP_STATUS_CODES at boot,
 * over registered_reasons. A phrase is reason-phrase text (RFC 9112 4: HTAB, SP, VCHAR, obs-text). */
static VALUE native_set_reason(VALUE self, VALUE code, VALUE phrase)
{
    int c = NUM2INT(code);
    long i;
    if (c < 100 || c >= 600) rb_raise(rb_eArgError, "status out of range: %d", c);
    StringValue(phrase);
    for (i = 0; i < RSTRING_LEN(phrase); i++) {
        unsigned char ch = (unsigned char)RSTRING_PTR(phrase)[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
            rb_raise(rb_eArgError, "invalid reason phrase for %d: %" PRIsVALUE, c, rb_str_inspect(phrase));
    }
    set_status_line(c, RSTRING_PTR(phrase), (size_t)RSTRING_LEN(phrase));
    return Qnil;
}

const char *bb_date_header(size_t *len)
{
    static char buf[64];
    static size_t buf_len;
    static time_t cached = -1;
    time_t now = time(NULL);
    if (now != cached) {
        struct tm tm;
        gmtime_r(&now, &tm);
        buf_len = strftime(buf, sizeof(buf), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        cached = now;
    }
    *len = buf_len;
    return buf;
}

VALUE bb_fstring(const char *ptr, long len)
{
#ifdef HAVE_RB_ENC_INTERNED_STR
    return rb_enc_interned_str(ptr, len, rb_ascii8bit_encoding());
#else
    VALUE s = rb_str_new(ptr, len);
    return rb_str_freeze(s);
#endif
}

struct poll_args {
    struct pollfd pfd;
    int timeout_ms;
    int ret;
    int err;
};

static void *poll_nogvl(void *p)
{
    struct poll_args *a = p;
    a->ret = poll(&a->pfd, 1, a->timeout_ms);
    a->err = errno;
    return NULL;
}

int bb_wait_writable(int fd, int timeout_ms)
{
    struct poll_args a;
    a.pfd.fd = fd;
    a.pfd.events = POLLOUT;
    a.pfd.revents = 0;
    a.timeout_ms = timeout_ms;
    for (;;) {
        rb_thread_call_without_gvl(poll_nogvl, &a, RUBY_UBF_IO, NULL);
        if (a.ret >= 0 || a.err != EINTR) break;
        rb_thread_check_ints();
    }
    if (a.ret < 0) return -1;
    if (a.ret == 0) return 0;
    return (a.pfd.revents & (POLLERR | POLLNVAL)) ? -1 : 1;
}

/* The text form of an IPv4 (af AF_INET, 4 bytes) or IPv6 (AF_INET6, 16 bytes) address, interned; an
 * IPv4-mapped IPv6 address is given as the IPv4 address ("::ffff:192.0.2.1" -> "192.0.2.1"). */
VALUE bb_ip_string(int af, const void *addr)
{
    char host[INET6_ADDRSTRLEN];
    const char *h = inet_ntop(af, addr, host, sizeof(host));
    if (!h) return Qnil;
    if (af == AF_INET6 && strncmp(h, "::ffff:", 7) == 0 && strchr(h + 7, '.')) h += 7; /* v4-mapped */
    return bb_fstring(h, (long)strlen(h));
}

/*
 * Accepts one connection from listener lfd: non-blocking, close-on-exec, TCP_NODELAY on TCP.
 * Returns the fd and sets *addr to the peer's address (an interned string), or -1 when nothing
 * is pending. Raises SystemCallError for errors that are not "try again" (EMFILE, ENFILE, ...).
 */
int bb_accept(int lfd, int tcp, VALUE *addr)
{
    static VALUE unix_addr = Qnil;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd;
    VALUE ip = Qnil;

    for (;;) {
#ifdef HAVE_ACCEPT4
        fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
#else
        fd = accept(lfd, (struct sockaddr *)&ss, &sl);
        if (fd >= 0) {
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
#endif
        if (fd >= 0) break;
        switch (errno) {
        case EINTR: continue;
        case EAGAIN:
#if EAGAIN != EWOULDBLOCK
        case EWOULDBLOCK:
#endif
        case ECONNABORTED:
        case EPROTO:
            return -1;
        default:
            rb_sys_fail("accept4");
        }
    }
    if (ss.ss_family == AF_INET)
        ip = bb_ip_string(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr);
    else if (ss.ss_family == AF_INET6)
        ip = bb_ip_string(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr);
    if (tcp && ss.ss_family != AF_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    if (NIL_P(ip)) {
        /* UNIX sockets have no peer address; like Unicorn, say loopback */
        if (NIL_P(unix_addr)) {
            unix_addr = rb_obj_freeze(rb_str_new_cstr("127.0.0.1"));
            rb_gc_register_mark_object(unix_addr);
        }
        *addr = unix_addr;
    } else {
        *addr = ip;
    }
    return fd;
}

/* Native.defer_accept(fd, seconds): TCP_DEFER_ACCEPT on a Linux TCP listener; false where unsupported. */
static VALUE native_defer_accept(VALUE self, VALUE fd, VALUE secs)
{
#ifdef HAVE_CONST_TCP_DEFER_ACCEPT
    int s = NUM2INT(secs);
    return setsockopt(NUM2INT(fd), IPPROTO_TCP, TCP_DEFER_ACCEPT, &s, sizeof(s)) == 0 ? Qtrue : Qfalse;
#else
    return Qfalse;
#endif
}

/*
 * Native.sched_batch -> true | nil: puts the calling thread (a worker's main thread, before
 * the app starts any) under SCHED_BATCH. A woken batch task does not preempt the task running on
 * its CPU, so a worker woken by a new connection lets the load balancer, nginx or a load generator
 * on that CPU finish its turn and then finds several connections queued instead of one: fewer
 * context switches per request. Fairness and priority (nice) are unchanged. nil where the system
 * has no SCHED_BATCH; SystemCallError when the kernel refuses (the caller logs it and goes on).
 */
static VALUE native_sched_batch(VALUE self)
{
#ifdef HAVE_CONST_SCHED_BATCH
    struct sched_param sp;
    memset(&sp, 0, sizeof(sp));
    if (sched_setscheduler(0, SCHED_BATCH, &sp) == 0) return Qtrue;
    rb_sys_fail("sched_setscheduler(SCHED_BATCH)");
#else
    return Qnil;
#endif
}

/*
 * Native.malloc_trim -> true | false: gives the C heap's free pages back to the kernel
 * (glibc's malloc_trim(0)); false when nothing was released or the allocator is not glibc's
 * (jemalloc returns memory itself). Before a fork, so workers do not inherit dirty free pages.
 */
static VALUE native_malloc_trim(VALUE self)
{
#ifdef __GLIBC__
    return malloc_trim(0) ? Qtrue : Qfalse;
#else
    return Qfalse;
#endif
}

/*
 * Native.malloc_arena_max(n) -> true | false: caps glibc's malloc arenas (mallopt M_ARENA_MAX),
 * as MALLOC_ARENA_MAX=n in the environment would; each app thread otherwise may get an arena of
 * its own (8 per core), and their free pages add up. false where glibc is not the allocator.
 */
static VALUE native_malloc_arena_max(VALUE self, VALUE n)
{
#if defined(__GLIBC__) && defined(M_ARENA_MAX)
    return mallopt(M_ARENA_MAX, NUM2INT(n)) == 1 ? Qtrue : Qfalse;
#else
    return Qfalse;
#endif
}

/*
 * Native.child_subreaper -> true | false: makes the calling process (the master) the parent of
 * every orphaned descendant (PR_SET_CHILD_SUBREAPER), so a worker the mold forks becomes the
 * master's child once the mold's short-lived middle process exits, and the master reaps it.
 * false where the kernel has no such flag (before Linux 3.4): then reforking is off.
 */
static VALUE native_child_subreaper(VALUE self)
{
#ifdef PR_SET_CHILD_SUBREAPER
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 ? Qtrue : Qfalse;
#else
    return Qfalse;
#endif
}

/* Native.logger = logger: the object (#warn(String)) the C side reports trouble to. */
static VALUE native_set_logger(VALUE self, VALUE l)
{
    logger = l;
    return l;
}

void bb_warn(VALUE msg)
{
    if (!NIL_P(logger)) rb_funcall(logger, rb_intern("warn"), 1, msg);
}

void bb_init_glue(void)
{
    bb_mBlackbuck = rb_define_module("Blackbuck");
    bb_mNative = rb_define_module_under(bb_mBlackbuck, "Native");
    rb_gc_register_address(&logger);
    {
        size_t i;
        for (i = 0; i < sizeof(registered_reasons) / sizeof(registered_reasons[0]); i++)
            set_status_line(registered_reasons[i].code, registered_reasons[i].phrase, strlen(registered_reasons[i].phrase));
    }

    rb_define_module_function(bb_mNative, "set_reason", native_set_reason, 2);
    rb_define_module_function(bb_mNative, "defer_accept", native_defer_accept, 2);
    rb_define_module_function(bb_mNative, "sched_batch", native_sched_batch, 0);
    rb_define_module_function(bb_mNative, "logger=", native_set_logger, 1);
    rb_define_module_function(bb_mNative, "malloc_trim", native_malloc_trim, 0);
    rb_define_module_function(bb_mNative, "malloc_arena_max", native_malloc_arena_max, 1);
    rb_define_module_function(bb_mNative, "child_subreaper", native_child_subreaper, 0);
}
