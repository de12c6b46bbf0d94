/*
 * bb_poller.c - Blackbuck::Native::Poller, a thin readiness wrapper sized once at creation.
 *
 *   poller.add(fd, mask)      mask: IN | OUT | EXCLUSIVE (listeners shared by workers; pipes)
 *   poller.delete(fd)
 *   poller.watch(conn, mask)  a Native::Conn: registered for mask (the Conn keeps what it is
 *   poller.unwatch(conn)      registered with, so an unchanged mask costs no system call)
 *   poller.wait(timeout_ms, out) -> n; out is cleared and filled with fd, events pairs
 *                                   (events: IN | OUT | ERR); no allocation per call
 *
 * Backend chosen at build time: epoll on Linux; poll(2) over a registry of fds elsewhere
 * (macOS, BSD; O(n) per wait, correct everywhere; BLACKBUCK_FORCE_POLL=1 builds it on Linux).
 * The wait runs without the GVL and is interrupted by signals, so traps run promptly.
 *
 * The hand-off watcher thread (bb_handoff.c) also looks at the poller while the worker's Ruby
 * thread runs the app: bb_poller_peek and bb_poller_forget. epoll is safe to share between
 * threads; the poll(2) registry is guarded by a mutex.
 */
#include "bb_poller.h"
#include "bb_conn.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
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

struct poller {
    int open;
    int max_events;
#ifdef HAVE_SYS_EPOLL_H
    int epfd;
    struct epoll_event *events;
#else
    struct pollfd *fds; /* the registry */
    int nfds, cap;
    int next; /* round-robin start, so no fd starves the others */
    pthread_mutex_t lock; /* registry changes against the hand-off watcher's peek */
#endif
};

/* ---- backend: epoll ---- */
#ifdef HAVE_SYS_EPOLL_H

static void backend_open(struct poller *pl)
{
    pl->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (pl->epfd < 0) rb_sys_fail("epoll_create1");
    pl->events = ALLOC_N(struct epoll_event, pl->max_events);
}

static void backend_close(struct poller *pl)
{
    if (pl->open) close(pl->epfd);
    xfree(pl->events);
    pl->events = NULL;
}

static size_t backend_size(const struct poller *pl) { return (size_t)pl->max_events * sizeof(struct epoll_event); }

static uint32_t to_epoll(int mask)
{
    uint32_t ev = 0;
    if (mask & POLL_IN) ev |= EPOLLIN | EPOLLRDHUP;
    if (mask & POLL_OUT) ev |= EPOLLOUT;
#ifdef HAVE_CONST_EPOLLEXCLUSIVE
    if (mask & POLL_EXCLUSIVE) ev = EPOLLIN | EPOLLEXCLUSIVE;
#else
    if (mask & POLL_EXCLUSIVE) ev = EPOLLIN;
#endif
    return ev;
}

enum { OP_ADD = EPOLL_CTL_ADD, OP_MOD = EPOLL_CTL_MOD, OP_DEL = EPOLL_CTL_DEL };

/* 0 ok, -1 with errno */
static int backend_ctl(struct poller *pl, int op, int fd, int mask)
{
    struct epoll_event ev;
    ev.events = op == OP_DEL ? 0 : to_epoll(mask);
    ev.data.u64 = 0;
    ev.data.fd = fd;
    return epoll_ctl(pl->epfd, op, fd, &ev);
}

static int backend_wait(struct poller *pl, int timeout_ms)
{
    return epoll_wait(pl->epfd, pl->events, pl->max_events, timeout_ms);
}

static int backend_collect(struct poller *pl, int n, VALUE out)
{
    int i;
    for (i = 0; i < n; i++) {
        uint32_t e = pl->events[i].events;
        int m = 0;
        if (e & EPOLLIN) m |= POLL_IN;
        if (e & EPOLLOUT) m |= POLL_OUT;
        if (e & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) m |= POLL_ERR;
        rb_ary_push(out, INT2FIX(pl->events[i].data.fd));
        rb_ary_push(out, INT2FIX(m));
    }
    return n;
}

/* Its own event array: the Ruby thread's may be in use. */
#define PEEK_MAX 256
int bb_poller_peek(struct poller *pl, int *fds, int max)
{
    struct epoll_event ev[PEEK_MAX];
    int n, i, got = 0;
    if (max > PEEK_MAX) max = PEEK_MAX;
    n = epoll_wait(pl->epfd, ev, max, 0);
    for (i = 0; i < n; i++)
        if ((ev[i].events & EPOLLIN) && !(ev[i].events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP))) fds[got++] = ev[i].data.fd;
    return got;
}

int bb_poller_forget(struct poller *pl, int fd)
{
    struct epoll_event ev = {0};
    return epoll_ctl(pl->epfd, EPOLL_CTL_DEL, fd, &ev);
}

/* ---- backend: poll(2) ---- */
#else

static void backend_open(struct poller *pl) { pthread_mutex_init(&pl->lock, NULL); }

static void backend_close(struct poller *pl)
{
    free(pl->fds);
    pl->fds = NULL;
    pl->nfds = pl->cap = 0;
}

static size_t backend_size(const struct poller *pl) { return (size_t)pl->cap * sizeof(struct pollfd); }

enum { OP_ADD, OP_MOD, OP_DEL };

/* Caller holds pl->lock. */
static int registry_ctl(struct poller *pl, int op, int fd, int mask)
{
    int i;
    for (i = 0; i < pl->nfds && pl->fds[i].fd != fd; i++)
        ;
    if (op == OP_ADD && i == pl->nfds) {
        /* An fd number already registered was closed and reused: closing does not unregister
         * it here (unlike epoll), so the new socket just takes the entry over below. */
        if (pl->nfds == pl->cap) {
            int ncap = pl->cap ? pl->cap * 2 : 64;
            struct pollfd *nf = realloc(pl->fds, sizeof(*nf) * (size_t)ncap);
            if (!nf) return errno = ENOMEM, -1;
            pl->fds = nf;
            pl->cap = ncap;
        }
        pl->fds[pl->nfds].fd = fd;
        pl->nfds++;
    } else if (i == pl->nfds) {
        return errno = ENOENT, -1;
    }
    if (op == OP_DEL) {
        pl->fds[i] = pl->fds[--pl->nfds];
        return 0;
    }
    pl->fds[i].events = (short)(((mask & (POLL_IN | POLL_EXCLUSIVE)) ? POLLIN : 0) | ((mask & POLL_OUT) ? POLLOUT : 0));
    pl->fds[i].revents = 0;
    return 0;
}

static int backend_ctl(struct poller *pl, int op, int fd, int mask)
{
    int r;
    pthread_mutex_lock(&pl->lock);
    r = registry_ctl(pl, op, fd, mask);
    pthread_mutex_unlock(&pl->lock);
    return r;
}

/* A copy of the registry is polled, so the Ruby thread may change it meanwhile. */
int bb_poller_peek(struct poller *pl, int *fds, int max)
{
    struct pollfd *copy;
    int n, i, got = 0;
    pthread_mutex_lock(&pl->lock);
    n = pl->nfds;
    copy = malloc(sizeof(*copy) * (size_t)(n ? n : 1));
    if (copy) memcpy(copy, pl->fds, sizeof(*copy) * (size_t)n);
    pthread_mutex_unlock(&pl->lock);
    if (!copy) return 0;
    for (i = 0; i < n; i++) copy[i].events &= POLLIN; /* a request waiting, not room to write */
    if (poll(copy, (nfds_t)n, 0) > 0)
        for (i = 0; i < n && got < max; i++)
            if ((copy[i].revents & POLLIN) && !(copy[i].revents & (POLLERR | POLLHUP | POLLNVAL))) fds[got++] = copy[i].fd;
    free(copy);
    return got;
}

int bb_poller_forget(struct poller *pl, int fd) { return backend_ctl(pl, OP_DEL, fd, 0); }

static int backend_wait(struct poller *pl, int timeout_ms)
{
    return poll(pl->fds, (nfds_t)pl->nfds, timeout_ms);
}

static int backend_collect(struct poller *pl, int n, VALUE out)
{
    int i, j, k, got = 0;
    /* Closed fds are never deleted from here (epoll forgets them by itself): poll flags them
     * POLLNVAL, and they are dropped before anything is reported. */
    pthread_mutex_lock(&pl->lock);
    for (i = 0, j = 0; i < pl->nfds; i++)
        if (!(pl->fds[i].revents & POLLNVAL)) pl->fds[j++] = pl->fds[i];
    pl->nfds = j;
    if (pl->next >= pl->nfds) pl->next = 0;
    for (k = 0; k < pl->nfds && got < n && got < pl->max_events; k++) {
        struct pollfd *f = &pl->fds[(pl->next + k) % pl->nfds];
        int m = 0;
        if (!f->revents) continue;
        if (f->revents & POLLIN) m |= POLL_IN;
        if (f->revents & POLLOUT) m |= POLL_OUT;
        if (f->revents & (POLLERR | POLLHUP)) m |= POLL_ERR;
        rb_ary_push(out, INT2FIX(f->fd));
        rb_ary_push(out, INT2FIX(m));
        got++;
    }
    if (pl->nfds) pl->next = (pl->next + 1) % pl->nfds;
    pthread_mutex_unlock(&pl->lock);
    return got;
}

#endif

/* ---- the Ruby class, shared by both backends ---- */

static void poller_free(void *p)
{
    struct poller *pl = p;
    backend_close(pl);
    xfree(pl);
}

static size_t poller_size(const void *p)
{
    return sizeof(struct poller) + backend_size(p);
}

static const rb_data_type_t poller_type = {
    .wrap_struct_name = "Blackbuck::Native::Poller",
    .function = {.dmark = NULL, .dfree = poller_free, .dsize = poller_size},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE poller_alloc(VALUE klass)
{
    struct poller *pl;
    return TypedData_Make_Struct(klass, struct poller, &poller_type, pl);
}

static struct poller *get_poller(VALUE self)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    if (!pl->open) rb_raise(rb_eIOError, "poller is closed");
    return pl;
}

struct poller *bb_poller_get(VALUE self) { return get_poller(self); }

static VALUE poller_init(VALUE self, VALUE size)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    pl->max_events = NUM2INT(size);
    if (pl->max_events < 1) rb_raise(rb_eArgError, "size must be positive");
    backend_open(pl);
    pl->open = 1;
    return self;
}

static VALUE poller_ctl(VALUE self, int op, VALUE fd, VALUE mask)
{
    struct poller *pl = get_poller(self);
    if (backend_ctl(pl, op, NUM2INT(fd), NIL_P(mask) ? 0 : NUM2INT(mask)) < 0) {
        if (op == OP_DEL && (errno == ENOENT || errno == EBADF)) return Qfalse;
        rb_sys_fail("poller");
    }
    return Qtrue;
}

/*
 * watch(conn, mask) -> nil: the connection is registered for mask (added, modified, or left as it is:
 * no system call when it already is). unwatch(conn) -> nil: it is not registered (a detached or closed
 * one never was as far as this poller knows). The Conn keeps the mask it is registered with; each is
 * one call with the GVL held, so a worker's app thread (unwatching a connection its app hijacks) and
 * its loop thread (unwatching a busy connection that became readable) never both act on it.
 */
static VALUE poller_watch(VALUE self, VALUE conn, VALUE mask)
{
    struct poller *pl = get_poller(self);
    int *watched, fd = bb_conn_watch_slot(conn, &watched), m = NUM2INT(mask);
    if (fd < 0 || *watched == m) return Qnil;
    if (backend_ctl(pl, *watched ? OP_MOD : OP_ADD, fd, m) < 0) rb_sys_fail("poller");
    *watched = m;
    return Qnil;
}

static VALUE poller_unwatch(VALUE self, VALUE conn)
{
    struct poller *pl = get_poller(self);
    int *watched, fd = bb_conn_watch_slot(conn, &watched);
    if (!*watched) return Qnil;
    *watched = 0;
    if (fd >= 0 && backend_ctl(pl, OP_DEL, fd, 0) < 0 && errno != ENOENT && errno != EBADF) rb_sys_fail("poller");
    return Qnil;
}

static VALUE poller_add(VALUE self, VALUE fd, VALUE mask) { return poller_ctl(self, OP_ADD, fd, mask); }
static VALUE poller_delete(VALUE self, VALUE fd) { return poller_ctl(self, OP_DEL, fd, Qnil); }

struct wait_args {
    struct poller *pl;
    int timeout_ms;
    int n;
    int err;
};

static void *wait_nogvl(void *p)
{
    struct wait_args *a = p;
    a->n = backend_wait(a->pl, a->timeout_ms);
    a->err = errno;
    return NULL;
}

static VALUE poller_wait(VALUE self, VALUE timeout, VALUE out)
{
    struct wait_args a;
    a.pl = get_poller(self);
    a.timeout_ms = NUM2INT(timeout);
    Check_Type(out, T_ARRAY);
    rb_ary_clear(out);
    if (a.timeout_ms == 0) wait_nogvl(&a); /* will not block: keep the GVL */
    else rb_thread_call_without_gvl(wait_nogvl, &a, RUBY_UBF_IO, NULL);
    if (a.n < 0) {
        if (a.err == EINTR) {
            rb_thread_check_ints();
            return INT2FIX(0);
        }
        errno = a.err;
        rb_sys_fail("poller wait");
    }
    return INT2FIX(backend_collect(a.pl, a.n, out));
}

static VALUE poller_close(VALUE self)
{
    struct poller *pl;
    TypedData_Get_Struct(self, struct poller, &poller_type, pl);
    backend_close(pl);
    pl->open = 0;
    return Qnil;
}

void bb_init_poller(void)
{
    VALUE c = rb_define_class_under(bb_mNative, "Poller", rb_cObject);
    rb_define_alloc_func(c, poller_alloc);
    rb_define_method(c, "initialize", poller_init, 1);
    rb_define_method(c, "add", poller_add, 2);
    rb_define_method(c, "delete", poller_delete, 1);
    rb_define_method(c, "watch", poller_watch, 2);
    rb_define_method(c, "unwatch", poller_unwatch, 1);
    rb_define_method(c, "wait", poller_wait, 2);
    rb_define_method(c, "close", poller_close, 0);
    rb_define_const(c, "IN", INT2FIX(POLL_IN));
    rb_define_const(c, "OUT", INT2FIX(POLL_OUT));
    rb_define_const(c, "EXCLUSIVE", INT2FIX(POLL_EXCLUSIVE));
    rb_define_const(c, "ERR", INT2FIX(POLL_ERR));
#ifdef HAVE_SYS_EPOLL_H
    rb_define_const(c, "EPOLL", Qtrue); /* the backend: epoll, else poll(2) */
#else
    rb_define_const(c, "EPOLL", Qfalse);
#endif
}
