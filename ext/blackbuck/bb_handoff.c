/*
 * bb_handoff.c - Blackbuck::Native::Handoff: no request waits behind a slow one while another
 * worker is free.
 *
 * A worker runs the app on its one Ruby thread. While the app runs, the worker's other keep-alive
 * connections are not read: a request arriving on one of them would wait for the app to finish,
 * however long that takes and however idle the other workers are. So each worker has a watcher
 * thread (a pthread that never touches Ruby and needs no GVL). Once the app has run for
 * handoff_after, the watcher looks at the worker's poller (timeout 0) and moves every connection
 * whose next request is waiting, and that has nothing read into user space, to the generation's
 * hand-off socket (bb_conn_pass, bb_pass.c: SCM_RIGHTS over SOCK_SEQPACKET). Every worker polls
 * that socket like a listener, so the first free one takes the connection and reads the request,
 * which travelled with the socket in the kernel's buffer. Nothing is read twice, so nothing is
 * served twice; requests on one connection stay in order, since only a connection with no request
 * in progress moves.
 *
 * Who touches what:
 *   loop_lock   held by the Ruby thread at all times except while the app runs (request_start ..
 *               request_done). The watcher only moves connections while it holds it (trylock), so it
 *               never races the event loop, and app_end waits for a move in progress to finish.
 *   lock, cond  the watcher's sleep: timed waits until the app has run handoff_after, then every
 *               handoff_after while it runs or while the worker is busy; parked once no app has
 *               run for BB_HANDOFF_PARK_NS (request_start wakes it).
 *   moved       fds moved out during the current app call, handed to the Ruby thread by
 *               request_done, which drops its Conns for them (close: the socket lives on in the receiver).
 *
 * The app's start and end are the scoreboard's request_start and request_done, so the worker says
 * both in one call each: Handoff's request_start and request_done do the scoreboard's too.
 *
 *   Handoff.new(poller, sock_fd, after_seconds, scoreboard); start;
 *   request_start(i, conn, queue_seconds); request_done(i, state) -> nil | [fd, ...];
 *   moved_out -> Integer; stop
 */
#include "bb_handoff.h"
#include "bb_conn.h"
#include "bb_poller.h"
#include "bb_scoreboard.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

/* Fds one app call can move out at most (the rest wait for this worker, as before). */
#define BB_HANDOFF_MOVED_MAX 1024
/* Connections moved per watcher turn (every handoff_after while the app runs) at most: a slow
 * request lets its neighbours go one by one, not all at once to siblings as busy as this worker. */
#define BB_HANDOFF_MOVES_PER_TURN 1
/* Ready fds looked at per watcher turn at most. */
#define BB_HANDOFF_PEEK_MAX 256
/* Nanoseconds without an app call after which the watcher parks instead of ticking every
 * handoff_after (an idle worker costs no wake-ups; a busy one no wake-up call per request). */
#define BB_HANDOFF_PARK_NS (100 * 1000000LL)

struct handoff {
    VALUE poller;
    VALUE scoreboard; /* Native::Scoreboard: request_start/request_done are its too */
    struct poller *pl;
    int sock;         /* the generation's hand-off socket (send end) */
    int64_t after_ns; /* handoff_after */
    int started, stopped;
    pthread_t thread;
    pthread_mutex_t loop_lock;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int quit;               /* under lock */
    int in_app;             /* atomic: the Ruby thread is between app_begin and app_end */
    int parked;             /* atomic: the watcher waits for app_begin to wake it */
    int64_t app_started_ns; /* atomic: CLOCK_MONOTONIC of the last app_begin */
    int moved[BB_HANDOFF_MOVED_MAX]; /* under loop_lock */
    int nmoved;                      /* under loop_lock */
    uint64_t moved_out;              /* under loop_lock */
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void wait_until(struct handoff *h, int64_t ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(&h->cond, &h->lock, &ts);
}

/* With loop_lock, while the app still runs: move every connection whose request is waiting. */
static void move_waiting(struct handoff *h, int64_t t)
{
    int fds[BB_HANDOFF_PEEK_MAX], n, i, turn = 0;
    if (pthread_mutex_trylock(&h->loop_lock) != 0) return; /* the app is over: the loop serves them */
    if (__atomic_load_n(&h->in_app, __ATOMIC_SEQ_CST)) {
        n = bb_poller_peek(h->pl, fds, BB_HANDOFF_PEEK_MAX);
        for (i = 0; i < n && h->nmoved < BB_HANDOFF_MOVED_MAX && turn < BB_HANDOFF_MOVES_PER_TURN; i++) {
            int r = bb_conn_pass(fds[i], h->sock, (double)t / 1e9, BB_PASS_WATCHER);
            /* The queue is full, or the send failed (counted, and logged at request_done): it and
             * the rest stay here. */
            if (r < 0) break;
            if (r == 0) continue; /* a listener, the control pipe, a connection mid-request */
            /* Unregistered now, so the next look does not see it again. */
            bb_poller_forget(h->pl, fds[i]);
            h->moved[h->nmoved++] = fds[i];
            h->moved_out++;
            turn++;
        }
    }
    pthread_mutex_unlock(&h->loop_lock);
}

static void *watch(void *arg)
{
    struct handoff *h = arg;
    pthread_mutex_lock(&h->lock);
    while (!h->quit) {
        int64_t t = mono_ns();
        int64_t started = __atomic_load_n(&h->app_started_ns, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->in_app, __ATOMIC_SEQ_CST)) {
            if (t < started + h->after_ns) {
                wait_until(h, started + h->after_ns);
                continue;
            }
            pthread_mutex_unlock(&h->lock);
            move_waiting(h, t);
            pthread_mutex_lock(&h->lock);
            if (!h->quit) wait_until(h, t + h->after_ns);
        } else if (t - started < BB_HANDOFF_PARK_NS) {
            /* Between requests of a busy worker: look again in handoff_after. Parking here would
             * cost the Ruby thread a wake-up call on nearly every request. */
            wait_until(h, t + h->after_ns);
        } else {
            /* Idle: parked until app_begin wakes it. app_begin stores in_app, then looks at
             * parked; here the reverse. One of the two sees the other's store, so a wake-up is
             * never lost. */
            __atomic_store_n(&h->parked, 1, __ATOMIC_SEQ_CST);
            if (!__atomic_load_n(&h->in_app, __ATOMIC_SEQ_CST) && !h->quit) pthread_cond_wait(&h->cond, &h->lock);
            __atomic_store_n(&h->parked, 0, __ATOMIC_SEQ_CST);
        }
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static void handoff_stop_thread(struct handoff *h)
{
    if (!h->started || h->stopped) return;
    pthread_mutex_lock(&h->lock);
    h->quit = 1;
    pthread_cond_signal(&h->cond);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->thread, NULL);
    h->stopped = 1;
}

static void handoff_mark(void *p)
{
    rb_gc_mark(((struct handoff *)p)->poller);
    rb_gc_mark(((struct handoff *)p)->scoreboard);
}

static void handoff_free(void *p)
{
    struct handoff *h = p;
    handoff_stop_thread(h);
    xfree(h);
}

static size_t handoff_size(const void *p)
{
    return sizeof(struct handoff); /* the watcher thread's stack is the OS's, not the heap's */
}

static const rb_data_type_t handoff_type = {
    .wrap_struct_name = "Blackbuck::Native::Handoff",
    .function = {.dmark = handoff_mark, .dfree = handoff_free, .dsize = handoff_size},
    .flags = 0,
};

static VALUE handoff_alloc(VALUE klass)
{
    struct handoff *h;
    VALUE obj = TypedData_Make_Struct(klass, struct handoff, &handoff_type, h);
    h->poller = Qnil;
    h->scoreboard = Qnil;
    h->sock = -1;
    return obj;
}

static struct handoff *get_handoff(VALUE self)
{
    struct handoff *h;
    TypedData_Get_Struct(self, struct handoff, &handoff_type, h);
    return h;
}

/* Handoff.new(poller, sock_fd, after_seconds, scoreboard): after_seconds 0 = never move (start does nothing). */
static VALUE handoff_init(VALUE self, VALUE poller, VALUE sock, VALUE after, VALUE scoreboard)
{
    struct handoff *h = get_handoff(self);
    double secs = NUM2DBL(after);
    pthread_condattr_t ca;
    if (secs < 0) rb_raise(rb_eArgError, "handoff_after must not be negative");
    h->pl = bb_poller_get(poller);
    h->poller = poller;
    h->scoreboard = scoreboard;
    h->sock = NUM2INT(sock);
    h->after_ns = (int64_t)(secs * 1e9);
    pthread_mutex_init(&h->loop_lock, NULL);
    pthread_mutex_init(&h->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cond, &ca);
    pthread_condattr_destroy(&ca);
    return self;
}

/* start: the Ruby thread takes loop_lock and the watcher starts (with every signal blocked, so
 * they all reach the Ruby thread). Nothing when handoff_after is 0. */
static VALUE handoff_start(VALUE self)
{
    struct handoff *h = get_handoff(self);
    sigset_t all, old;
    int err;
    if (h->started || h->after_ns <= 0) return Qfalse;
    pthread_mutex_lock(&h->loop_lock);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&h->thread, NULL, watch, h);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        pthread_mutex_unlock(&h->loop_lock);
        errno = err;
        rb_sys_fail("starting the hand-off watcher thread");
    }
    h->started = 1;
    return Qtrue;
}

/* The app is about to run: the watcher may move connections until app_end. */
static void app_begin(struct handoff *h)
{
    if (!h->started || h->stopped || h->in_app) return; /* in_app: only this thread writes it */
    __atomic_store_n(&h->app_started_ns, mono_ns(), __ATOMIC_SEQ_CST);
    __atomic_store_n(&h->in_app, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->parked, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&h->lock);
        pthread_cond_signal(&h->cond);
        pthread_mutex_unlock(&h->lock);
    }
    pthread_mutex_unlock(&h->loop_lock);
}

/* The app is done: nil, or the fds moved out meanwhile (their Conns are to be closed and forgotten). */
static VALUE app_end(struct handoff *h)
{
    VALUE fds;
    int i;
    /* Not after app_begin (an exception, e.g. the request timeout, came between the two): the
     * lock is still this thread's. */
    if (!h->started || h->stopped || !h->in_app) return Qnil;
    pthread_mutex_lock(&h->loop_lock); /* waits out a move in progress (one batch, microseconds) */
    __atomic_store_n(&h->in_app, 0, __ATOMIC_SEQ_CST);
    if (!h->nmoved) return Qnil;
    fds = rb_ary_new_capa(h->nmoved);
    for (i = 0; i < h->nmoved; i++) rb_ary_push(fds, INT2FIX(h->moved[i]));
    h->nmoved = 0;
    return fds;
}

/* request_start(i, conn, queue_seconds): the scoreboard's, then the app may run. */
static VALUE handoff_request_start(VALUE self, VALUE idx, VALUE conn, VALUE queue)
{
    struct handoff *h = get_handoff(self);
    bb_scoreboard_request_start(h->scoreboard, idx, conn, queue);
    app_begin(h);
    return Qnil;
}

/* request_done(i, state) -> nil | [fd, ...]: the app is done (app_end), then the scoreboard's; a run
 * of sends the watcher could not make meanwhile is logged (once: bb_conn_pass_report). */
static VALUE handoff_request_done(VALUE self, VALUE idx, VALUE state)
{
    struct handoff *h = get_handoff(self);
    VALUE moved = app_end(h);
    bb_scoreboard_request_done(h->scoreboard, idx, state);
    bb_conn_pass_report();
    return moved;
}

static VALUE handoff_moved_out(VALUE self) { return ULL2NUM(get_handoff(self)->moved_out); }

/* stop: the watcher exits (the worker is exiting, or a stop must not move connections any more). */
static VALUE handoff_stop(VALUE self)
{
    struct handoff *h = get_handoff(self);
    if (h->started && !h->stopped) {
        handoff_stop_thread(h);
        pthread_mutex_unlock(&h->loop_lock);
    }
    return Qnil;
}

void bb_init_handoff(void)
{
    VALUE c = rb_define_class_under(bb_mNative, "Handoff", rb_cObject);
    rb_define_alloc_func(c, handoff_alloc);
    rb_define_method(c, "initialize", handoff_init, 4);
    rb_define_method(c, "start", handoff_start, 0);
    rb_define_method(c, "request_start", handoff_request_start, 3);
    rb_define_method(c, "request_done", handoff_request_done, 2);
    rb_define_method(c, "moved_out", handoff_moved_out, 0);
    rb_define_method(c, "stop", handoff_stop, 0);
}
