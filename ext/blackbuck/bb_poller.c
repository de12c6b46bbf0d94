/*
 * bb_poller.c - Blackbuck::Native::Poller, a thin epoll wrapper sized once at creation.
 *
 *   poller.add(fd, mask)      mask: IN | OUT | EXCLUSIVE (listeners shared by workers)
 *   poller.modify(fd, mask)
 *   poller.delete(fd)
 *   poller.wait(timeout_ms, out) -> n; out is cleared and filled with fd, events pairs
 *                                   (events: IN | OUT | ERR); no allocation per call
 * The wait runs without the GVL and is interrupted by signals, so traps run promptly.
 */
#include "bb_ext.h"

#include <errno.h>
#include <unistd.h>
#ifdef HAVE_SYS_EPOLL_H
#include <sys/epoll.h>
#else
#include <poll.h>
#endif

#define POLL_IN 1
#define POLL_OUT 2
#define POLL_EXCLUSIVE 4
#define POLL_ERR 8

#ifdef HAVE_SYS_EPOLL_H
struct poller {
    int epfd;
    int max_events;
    struct epoll_event *events;
};

static void poller_free(void *p)
{
    struct poller *pl = p;
    if (pl->epfd >= 0) close(pl->epfd);
    xfree(pl->events);
    xfree(pl);
}

static size_t poller_size(const void *p)
{
    const struct poller *pl = p;
    return sizeof(*pl) + (size_t)pl->max_events * sizeof(struct epoll_event);
}

static const rb_data_type_t poller_type = {
    .wrap_struct_name = "Blackbuck::Native::Poller",
    .function = {.dmark = NULL, .dfree = poller_free, .dsize = poller_size},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE poller_alloc(VALUE klass)
{
    struct poller *pl;
    VALUE obj = TypedData_Make_Struct(klass, struct poller, &poller_type, pl);
    pl->epfd = -1;
    return obj;
}

static struct poller *get_poller(VALUE self)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    if (pl->epfd < 0) rb_raise(rb_eIOError, "poller is closed");
    return pl;
}

static VALUE poller_init(VALUE self, VALUE size)
{
    struct poller *pl;
    int n = NUM2INT(size);
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    if (n < 1) rb_raise(rb_eArgError, "size must be positive");
    pl->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (pl->epfd < 0) rb_sys_fail("epoll_create1");
    pl->max_events = n;
    pl->events = ALLOC_N(struct epoll_event, n);
    return self;
}

static uint32_t to_epoll(int mask)
{
    uint32_t ev = 0;
    if (mask & POLL_IN) ev |= EPOLLIN | EPOLLRDHUP;
    if (mask & POLL_OUT) ev |= EPOLLOUT;
#ifdef HAVE_CONST_EPOLLEXCLUSIVE
    if (mask & POLL_EXCLUSIVE) ev = EPOLLIN | EPOLLEXCLUSIVE;
#endif
    return ev;
}

static VALUE poller_ctl(VALUE self, int op, VALUE fd, VALUE mask)
{
    struct poller *pl = get_poller(self);
    struct epoll_event ev;
    ev.events = NIL_P(mask) ? 0 : to_epoll(NUM2INT(mask));
    ev.data.u64 = 0;
    ev.data.fd = NUM2INT(fd);
    if (epoll_ctl(pl->epfd, op, ev.data.fd, &ev) < 0) {
        if (op == EPOLL_CTL_DEL && (errno == ENOENT || errno == EBADF)) return Qfalse;
        rb_sys_fail("epoll_ctl");
    }
    return Qtrue;
}

static VALUE poller_add(VALUE self, VALUE fd, VALUE mask) { return poller_ctl(self, EPOLL_CTL_ADD, fd, mask); }
static VALUE poller_modify(VALUE self, VALUE fd, VALUE mask) { return poller_ctl(self, EPOLL_CTL_MOD, fd, mask); }
static VALUE poller_delete(VALUE self, VALUE fd) { return poller_ctl(self, EPOLL_CTL_DEL, fd, Qnil); }

struct wait_args {
    struct poller *pl;
    int timeout_ms;
    int n;
    int err;
};

static void *wait_nogvl(void *p)
{
    struct wait_args *a = p;
    a->n = epoll_wait(a->pl->epfd, a->pl->events, a->pl->max_events, a->timeout_ms);
    a->err = errno;
    return NULL;
}

static VALUE poller_wait(VALUE self, VALUE timeout, VALUE out)
{
    struct wait_args a;
    int i;
    a.pl = get_poller(self);
    a.timeout_ms = NUM2INT(timeout);
    Check_Type(out, T_ARRAY);
    rb_ary_clear(out);
    if (a.timeout_ms == 0) {
        wait_nogvl(&a);
    } else {
        rb_thread_call_without_gvl(wait_nogvl, &a, RUBY_UBF_IO, NULL);
    }
    if (a.n < 0) {
        if (a.err == EINTR) {
            rb_thread_check_ints();
            return INT2FIX(0);
        }
        errno = a.err;
        rb_sys_fail("epoll_wait");
    }
    for (i = 0; i < a.n; i++) {
        uint32_t e = a.pl->events[i].events;
        int m = 0;
        if (e & EPOLLIN) m |= POLL_IN;
        if (e & EPOLLOUT) m |= POLL_OUT;
        if (e & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) m |= POLL_ERR;
        rb_ary_push(out, INT2FIX(a.pl->events[i].data.fd));
        rb_ary_push(out, INT2FIX(m));
    }
    return INT2FIX(a.n);
}

static VALUE poller_close(VALUE self)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    if (pl->epfd >= 0) close(pl->epfd);
    pl->epfd = -1;
    return Qnil;
}

#else /* no epoll (macOS, BSD): poll(2) over a registry of fds; O(n) per wait, correct everywhere */

struct poller {
    int epfd;             /* 0 while open, -1 closed (same meaning as the epoll version) */
    int max_events;
    struct pollfd *fds;   /* registered fds; events == 0 means a free slot */
    int nfds, cap;
    int next;             /* round-robin start, so no fd starves the others */
};

static void poller_free(void *p)
{
    struct poller *pl = p;
    xfree(pl->fds);
    xfree(pl);
}

static size_t poller_size(const void *p)
{
    const struct poller *pl = p;
    return sizeof(*pl) + (size_t)pl->cap * sizeof(struct pollfd);
}

static const rb_data_type_t poller_type = {
    .wrap_struct_name = "Blackbuck::Native::Poller",
    .function = {.dmark = NULL, .dfree = poller_free, .dsize = poller_size},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE poller_alloc(VALUE klass)
{
    struct poller *pl;
    VALUE obj = TypedData_Make_Struct(klass, struct poller, &poller_type, pl);
    pl->epfd = -1;
    return obj;
}

static struct poller *get_poller(VALUE self)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    if (pl->epfd < 0) rb_raise(rb_eIOError, "poller is closed");
    return pl;
}

static VALUE poller_init(VALUE self, VALUE size)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    pl->max_events = NUM2INT(size);
    if (pl->max_events < 1) rb_raise(rb_eArgError, "size must be positive");
    pl->epfd = 0;
    return self;
}

static short to_poll(int mask)
{
    short ev = 0;
    if (mask & (POLL_IN | POLL_EXCLUSIVE)) ev |= POLLIN;
    if (mask & POLL_OUT) ev |= POLLOUT;
    return ev;
}

static int find_fd(struct poller *pl, int fd)
{
    int i;
    for (i = 0; i < pl->nfds; i++)
        if (pl->fds[i].fd == fd) return i;
    return -1;
}

static VALUE poller_add(VALUE self, VALUE vfd, VALUE mask)
{
    struct poller *pl = get_poller(self);
    int fd = NUM2INT(vfd), i = find_fd(pl, fd);
    if (i >= 0) {
        errno = EEXIST;
        rb_sys_fail("poller add");
    }
    if (pl->nfds == pl->cap) {
        pl->cap = pl->cap ? pl->cap * 2 : 64;
        REALLOC_N(pl->fds, struct pollfd, pl->cap);
    }
    pl->fds[pl->nfds].fd = fd;
    pl->fds[pl->nfds].events = to_poll(NUM2INT(mask));
    pl->fds[pl->nfds].revents = 0;
    pl->nfds++;
    return Qtrue;
}

static VALUE poller_modify(VALUE self, VALUE vfd, VALUE mask)
{
    struct poller *pl = get_poller(self);
    int i = find_fd(pl, NUM2INT(vfd));
    if (i < 0) {
        errno = ENOENT;
        rb_sys_fail("poller modify");
    }
    pl->fds[i].events = to_poll(NUM2INT(mask));
    return Qtrue;
}

static VALUE poller_delete(VALUE self, VALUE vfd)
{
    struct poller *pl = get_poller(self);
    int i = find_fd(pl, NUM2INT(vfd));
    if (i < 0) return Qfalse;
    pl->fds[i] = pl->fds[--pl->nfds];
    return Qtrue;
}

struct wait_args {
    struct poller *pl;
    int timeout_ms;
    int n;
    int err;
};

static void *wait_nogvl(void *p)
{
    struct wait_args *a = p;
    a->n = poll(a->pl->fds, (nfds_t)a->pl->nfds, a->timeout_ms);
    a->err = errno;
    return NULL;
}

static VALUE poller_wait(VALUE self, VALUE timeout, VALUE out)
{
    struct wait_args a;
    int i, k, got = 0;
    a.pl = get_poller(self);
    a.timeout_ms = NUM2INT(timeout);
    Check_Type(out, T_ARRAY);
    rb_ary_clear(out);
    rb_thread_call_without_gvl(wait_nogvl, &a, RUBY_UBF_IO, NULL);
    if (a.n < 0) {
        if (a.err == EINTR) {
            rb_thread_check_ints();
            return INT2FIX(0);
        }
        errno = a.err;
        rb_sys_fail("poll");
    }
    for (k = 0; k < a.pl->nfds && got < a.n && got < a.pl->max_events; k++) {
        struct pollfd *f;
        int m = 0;
        i = (a.pl->next + k) % a.pl->nfds;
        f = &a.pl->fds[i];
        if (!f->revents) continue;
        if (f->revents & POLLIN) m |= POLL_IN;
        if (f->revents & POLLOUT) m |= POLL_OUT;
        if (f->revents & (POLLERR | POLLHUP | POLLNVAL)) m |= POLL_ERR;
        rb_ary_push(out, INT2FIX(f->fd));
        rb_ary_push(out, INT2FIX(m));
        got++;
    }
    if (a.pl->nfds) a.pl->next = (a.pl->next + 1) % a.pl->nfds;
    return INT2FIX(got);
}

static VALUE poller_close(VALUE self)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    pl->epfd = -1;
    pl->nfds = 0;
    return Qnil;
}
#endif

void bb_init_poller(void)
{
    VALUE c = rb_define_class_under(bb_mNative, "Poller", rb_cObject);
    rb_define_alloc_func(c, poller_alloc);
    rb_define_method(c, "initialize", poller_init, 1);
    rb_define_method(c, "add", poller_add, 2);
    rb_define_method(c, "modify", poller_modify, 2);
    rb_define_method(c, "delete", poller_delete, 1);
    rb_define_method(c, "wait", poller_wait, 2);
    rb_define_method(c, "close", poller_close, 0);
    rb_define_const(c, "IN", INT2FIX(POLL_IN));
    rb_define_const(c, "OUT", INT2FIX(POLL_OUT));
    rb_define_const(c, "EXCLUSIVE", INT2FIX(POLL_EXCLUSIVE));
    rb_define_const(c, "ERR", INT2FIX(POLL_ERR));
}
