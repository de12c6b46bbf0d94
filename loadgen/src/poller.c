/* poller.c - see poller.h. */
#include "poller.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#define POLLER_MAX_BATCH 512 /* events fetched per wait */

#if defined(__linux__)
#include <sys/epoll.h>

struct poller {
    int fd;
    struct epoll_event ev[POLLER_MAX_BATCH];
};

const char *poller_name(void) { return "epoll"; }

struct poller *poller_new(int size_hint)
{
    struct poller *p = malloc(sizeof *p);
    if (!p) return NULL;
    (void)size_hint;
    p->fd = epoll_create1(EPOLL_CLOEXEC);
    if (p->fd < 0) {
        free(p);
        return NULL;
    }
    return p;
}

void poller_free(struct poller *p)
{
    if (!p) return;
    close(p->fd);
    free(p);
}

static int ctl(struct poller *p, int op, int fd, unsigned events, void *ptr)
{
    struct epoll_event e = { 0 };
    e.events = (events & PL_IN ? EPOLLIN : 0) | (events & PL_OUT ? EPOLLOUT : 0);
    e.data.ptr = ptr;
    return epoll_ctl(p->fd, op, fd, &e);
}

int poller_add(struct poller *p, int fd, unsigned events, void *ptr) { return ctl(p, EPOLL_CTL_ADD, fd, events, ptr); }

int poller_mod(struct poller *p, int fd, unsigned old_events, unsigned events, void *ptr)
{
    (void)old_events;
    return ctl(p, EPOLL_CTL_MOD, fd, events, ptr);
}

int poller_wait(struct poller *p, struct poller_event *out, int max, int timeout_ms)
{
    if (max > POLLER_MAX_BATCH) max = POLLER_MAX_BATCH;
    int n = epoll_wait(p->fd, p->ev, max, timeout_ms);
    if (n < 0) return errno == EINTR ? 0 : -1;
    for (int i = 0; i < n; i++) {
        unsigned e = p->ev[i].events;
        out[i].ptr = p->ev[i].data.ptr;
        out[i].events = (e & EPOLLIN ? PL_IN : 0) | (e & EPOLLOUT ? PL_OUT : 0) |
                        (e & (EPOLLERR | EPOLLHUP) ? PL_ERR : 0);
    }
    return n;
}

#else /* kqueue */
#include <sys/types.h>
#include <sys/event.h>
#include <sys/time.h>

struct poller {
    int fd;
    struct kevent ev[POLLER_MAX_BATCH];
};

const char *poller_name(void) { return "kqueue"; }

struct poller *poller_new(int size_hint)
{
    struct poller *p = malloc(sizeof *p);
    if (!p) return NULL;
    (void)size_hint;
    p->fd = kqueue();
    if (p->fd < 0) {
        free(p);
        return NULL;
    }
    return p;
}

void poller_free(struct poller *p)
{
    if (!p) return;
    close(p->fd);
    free(p);
}

int poller_mod(struct poller *p, int fd, unsigned old_events, unsigned events, void *ptr)
{
    struct kevent ch[2];
    int n = 0;
    if ((old_events ^ events) & PL_IN)
        EV_SET(&ch[n++], fd, EVFILT_READ, events & PL_IN ? EV_ADD : EV_DELETE, 0, 0, ptr);
    if ((old_events ^ events) & PL_OUT)
        EV_SET(&ch[n++], fd, EVFILT_WRITE, events & PL_OUT ? EV_ADD : EV_DELETE, 0, 0, ptr);
    return n ? kevent(p->fd, ch, n, NULL, 0, NULL) : 0;
}

int poller_add(struct poller *p, int fd, unsigned events, void *ptr) { return poller_mod(p, fd, 0, events, ptr); }

int poller_wait(struct poller *p, struct poller_event *out, int max, int timeout_ms)
{
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
    if (max > POLLER_MAX_BATCH) max = POLLER_MAX_BATCH;
    int n = kevent(p->fd, NULL, 0, p->ev, max, timeout_ms < 0 ? NULL : &ts);
    if (n < 0) return errno == EINTR ? 0 : -1;
    for (int i = 0; i < n; i++) {
        out[i].ptr = p->ev[i].udata;
        out[i].events = (p->ev[i].filter == EVFILT_READ ? PL_IN : PL_OUT) |
                        (p->ev[i].flags & (EV_EOF | EV_ERROR) ? PL_ERR : 0);
    }
    return n;
}
#endif
