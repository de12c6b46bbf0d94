/* worker.c - the per-thread event loop and the connection state machine.
 *
 * Keep-alive hot path: one read() carrying a response, one write() of the
 * next pre-serialised request straight from the read handler, no poller
 * call at all (the fd stays registered for input only). The poller is
 * touched only when a write would block or a connection is replaced.
 *
 *   CONNECTING --writable--> (connected) --> WRITING --all sent--> READING
 *   READING --response, keep-alive--> WRITING (closed model) or IDLE (-R)
 *   READING --response, server closes--> DRAINING --EOF--> (reconnect)
 *   any --error or --timeout--> count it, reconnect (BACKOFF first if connect failed)
 */
#include "worker.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "poller.h"

#ifdef __linux__
#include <sys/timerfd.h>
#define HAVE_TIMERFD 1 /* -R: sub-millisecond wake-ups for send slots */
#endif

#ifdef IOV_MAX
#define WRITE_IOV_MAX IOV_MAX /* iovecs per sendmsg() */
#else
#define WRITE_IOV_MAX 16      /* _XOPEN_IOV_MAX, the least POSIX allows */
#endif

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* SIGPIPE is ignored process-wide as well */
#endif

#define NS_PER_MS 1000000ULL
#define MAX_WAIT_MS 100 /* upper bound on a poller wait, so SIGINT is noticed */

enum { ST_CLOSED, ST_BACKOFF, ST_CONNECTING, ST_IDLE, ST_WRITING, ST_READING, ST_DRAINING };

struct conn {
    struct worker *w;
    int fd, state;
    unsigned events;         /* registered with the poller; 0 = not registered */
    uint64_t gen;            /* bumped on every new socket */
    int reused;              /* a response already completed on this socket */
    int in_idle;             /* on w->idle */
    int resend;              /* lost a request to an idle close: send it again */
    uint64_t resend_origin;
    size_t written;          /* bytes of the batch written */
    unsigned char *classes;  /* cfg->pipeline target indexes: the batch in flight, or the next one */
    int drawn;               /* classes[] already hold the next batch (chosen at connect, or a resend) */
    struct iovec *iov;       /* the batch; iov[iov_pos..niov) is still to be written */
    int niov, iov_pos;
    struct iovec one;        /* iov when the batch is one buffer (one target per batch) */
    uint64_t inflight;       /* responses still expected */
    uint64_t origin_ns;      /* latency origin: send time, or the -R slot */
    uint64_t connect_ns;
    uint64_t deadline_ns;    /* --timeout; 0 = none */
    uint64_t retry_ns;       /* BACKOFF until then */
    struct resp_parser parser;
};

static volatile sig_atomic_t stop_requested;

void worker_request_stop(void) { stop_requested = 1; }

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void conn_open(struct conn *c, uint64_t now);
static void conn_send(struct conn *c, uint64_t now, uint64_t origin);

/* With more than one target and no pinning: choose the next batch's targets,
 * unless they are already chosen. No formatting: each target's request was
 * serialised before the run. */
static void draw(struct conn *c)
{
    struct worker *w = c->w;
    if (!w->pick || c->drawn) return;
    for (uint64_t k = 0; k < w->cfg->pipeline; k++) c->classes[k] = (unsigned char)mix_pick(&w->cfg->mix, &w->rng);
    c->drawn = 1;
}

/* The target whose counters the connection's news belongs to: the response
 * being read, or else the batch about to be sent. */
static struct target_stats *conn_stats(const struct conn *c)
{
    uint64_t k = c->inflight ? c->w->cfg->pipeline - c->inflight : 0;
    return &c->w->stats[c->classes[k]];
}

static struct errors *conn_errors(const struct conn *c) { return &conn_stats(c)->errors; }

static void set_events(struct conn *c, unsigned events)
{
    if (c->events == events) return;
    poller_mod(c->w->poller, c->fd, c->events, events, c);
    c->events = events;
}

static void conn_close(struct conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->events = 0;
    c->deadline_ns = 0;
    c->inflight = 0;
}

/* Drop the socket and open a new one (unless the run is over). */
static void conn_replace(struct conn *c, uint64_t now)
{
    conn_close(c);
    if (now >= c->w->stop_ns) {
        c->state = ST_CLOSED;
        return;
    }
    conn_open(c, now);
}

static void conn_fail(struct conn *c, uint64_t *counter)
{
    (*counter)++;
    conn_replace(c, now_ns());
}

static void conn_backoff(struct conn *c, uint64_t now)
{
    conn_close(c);
    c->state = ST_BACKOFF;
    c->retry_ns = now + BACKOFF_MS * NS_PER_MS;
    c->w->nbackoff++;
}

static void conn_idle(struct conn *c)
{
    struct worker *w = c->w;
    c->state = ST_IDLE;
    c->deadline_ns = 0;
    set_events(c, PL_IN); /* to notice a server closing the idle connection */
    if (!c->in_idle && w->rate_interval_ns) {
        c->in_idle = 1;
        w->idle[w->nidle++] = c;
    }
}

static void next_request(struct conn *c, uint64_t now)
{
    if (now >= c->w->stop_ns || c->w->rate_interval_ns) conn_idle(c);
    else conn_send(c, now, now);
}

static void conn_connected(struct conn *c, uint64_t now)
{
    struct worker *w = c->w;
    hist_record(w->connect, (now - c->connect_ns) / 1000);
    if (c->resend) {
        c->resend = 0;
        conn_send(c, now, w->rate_interval_ns ? c->resend_origin : now);
    } else {
        next_request(c, now);
    }
}

static void conn_open(struct conn *c, uint64_t now)
{
    struct worker *w = c->w;
    const struct target *t = &w->cfg->target;
    int fd = -1;
    c->gen++;
    c->reused = 0;
    c->written = 0;
    c->inflight = 0;
    c->connect_ns = now;
    draw(c); /* now, so that a failed connect counts against the request it was for */
    resp_init(&c->parser, 0); /* conn_send says whether HEAD */
    int r = t->transport->open(t, &fd);
    c->fd = fd;
    if (r == NET_RETRY || r == NET_ERROR) {
        if (r == NET_RETRY) conn_errors(c)->connect_retry++;
        else conn_errors(c)->connect++;
        conn_backoff(c, now);
        return;
    }
    unsigned events = r == NET_PENDING ? PL_OUT : PL_IN;
    if (poller_add(w->poller, fd, events, c) < 0) {
        conn_errors(c)->connect++;
        conn_backoff(c, now);
        return;
    }
    c->events = events;
    if (r == NET_PENDING) {
        c->state = ST_CONNECTING;
        c->deadline_ns = now + w->cfg->timeout_us * 1000;
        return;
    }
    conn_connected(c, now);
}

/* Write what is left of the batch: one send() when it is one buffer (the
 * common case), sendmsg() over the chosen requests when pipelined requests
 * each chose their own target. */
static void conn_write(struct conn *c)
{
    for (;;) {
        struct iovec *v = c->iov + c->iov_pos;
        int given = c->niov - c->iov_pos;
        ssize_t n;
        if (given == 1) {
            n = send(c->fd, v->iov_base, v->iov_len, MSG_NOSIGNAL);
        } else {
            struct msghdr mh;
            memset(&mh, 0, sizeof mh);
            if (given > WRITE_IOV_MAX) given = WRITE_IOV_MAX;
            mh.msg_iov = v;
            mh.msg_iovlen = (size_t)given;
            n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                set_events(c, PL_IN | PL_OUT);
                return;
            }
            /* A reused connection the server already closed: the keep-alive race,
             * not a failure. Resend the same requests on a fresh connection. */
            if (c->reused && c->written == 0 && (errno == EPIPE || errno == ECONNRESET)) {
                c->resend = 1;
                c->drawn = 1;
                c->resend_origin = c->origin_ns;
                c->w->reconnects++;
                conn_replace(c, now_ns());
                return;
            }
            conn_fail(c, &conn_errors(c)->write);
            return;
        }
        c->written += (size_t)n;
        int end = c->iov_pos + given;
        for (size_t left = (size_t)n; left > 0;) {
            struct iovec *x = &c->iov[c->iov_pos];
            if (left >= x->iov_len) {
                left -= x->iov_len;
                c->iov_pos++;
            } else {
                x->iov_base = (char *)x->iov_base + left;
                x->iov_len -= left;
                left = 0;
            }
        }
        if (c->iov_pos == c->niov) {
            c->state = ST_READING;
            set_events(c, PL_IN);
            return;
        }
        if (c->iov_pos < end) { /* a short write: the socket buffer is full */
            set_events(c, PL_IN | PL_OUT);
            return;
        }
    }
}

static void conn_send(struct conn *c, uint64_t now, uint64_t origin)
{
    const struct config *cfg = c->w->cfg;
    const struct mix_target *t = cfg->mix.targets;
    draw(c);
    c->drawn = 0;
    if (c->niov == 1) {
        c->one.iov_base = t[c->classes[0]].batch;
        c->one.iov_len = t[c->classes[0]].batch_len;
    } else {
        for (int k = 0; k < c->niov; k++) {
            c->iov[k].iov_base = t[c->classes[k]].request;
            c->iov[k].iov_len = t[c->classes[k]].request_len;
        }
    }
    c->iov_pos = 0;
    resp_set_head(&c->parser, t[c->classes[0]].head);
    c->origin_ns = origin;
    c->written = 0;
    c->inflight = cfg->pipeline;
    c->deadline_ns = now + cfg->timeout_us * 1000;
    c->state = ST_WRITING;
    conn_write(c);
}

/* A complete response. Returns 1 when the same socket goes on reading. */
static int on_response(struct conn *c, uint64_t now, int at_eof)
{
    struct worker *w = c->w;
    struct target_stats *ts = conn_stats(c);
    int status = c->parser.status;
    uint64_t gen = c->gen;
    w->complete++;
    w->interval_requests++;
    w->status_counts[status >= 100 && status < 600 ? status : 0]++;
    ts->complete++;
    if (status < 200 || status > 399) ts->errors.status++;
    hist_record(ts->latency, (now - c->origin_ns) / 1000);
    c->reused = 1;
    c->inflight--;
    if (c->inflight) /* the next pipelined response answers classes[pipeline - inflight] */
        resp_set_head(&c->parser, w->cfg->mix.targets[c->classes[w->cfg->pipeline - c->inflight]].head);
    int server_keeps = resp_keep_alive(&c->parser);
    if (at_eof) return 0;
    if (!server_keeps || !w->cfg->keepalive) {
        if (server_keeps) { /* we asked for close but the server keeps it: close ourselves */
            conn_replace(c, now);
            return 0;
        }
        /* Let the server close first, so TIME_WAIT stays on its side. */
        c->inflight = 0;
        c->state = ST_DRAINING;
        c->deadline_ns = now + w->cfg->timeout_us * 1000;
        set_events(c, PL_IN);
        return 0;
    }
    if (c->inflight) return 1;
    next_request(c, now);
    return c->gen == gen && c->fd >= 0;
}

static void on_eof(struct conn *c)
{
    struct worker *w = c->w;
    uint64_t now = now_ns();
    if (c->state == ST_DRAINING || c->state == ST_IDLE) {
        w->reconnects++;
        conn_replace(c, now);
        return;
    }
    int r = resp_eof(&c->parser);
    if (r == RP_DONE) {
        on_response(c, now, 1); /* EOF-delimited body (Unicorn): a success */
        conn_replace(c, now);
    } else if (r == RP_MORE && (c->inflight == 0 || c->reused)) {
        /* Server closed a keep-alive connection before answering: resend. */
        if (c->inflight) {
            c->resend = 1;
            c->drawn = 1; /* the same requests again */
            c->resend_origin = c->origin_ns;
        }
        w->reconnects++;
        conn_replace(c, now);
    } else {
        conn_fail(c, &conn_errors(c)->read);
    }
}

static void on_readable(struct conn *c)
{
    struct worker *w = c->w;
    char *buf = w->rbuf;
    ssize_t n = read(c->fd, buf, RECVBUF);
    if (n == 0) {
        on_eof(c);
        return;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        if (c->state == ST_DRAINING || (c->state == ST_IDLE && errno == ECONNRESET)) {
            w->reconnects++;
            conn_replace(c, now_ns());
            return;
        }
        /* A server that closes a keep-alive connection with our next request
         * unread resets it: the same race as a clean close, not an error. */
        if (errno == ECONNRESET && c->reused) {
            on_eof(c);
            return;
        }
        conn_fail(c, &conn_errors(c)->read);
        return;
    }
    w->bytes += (uint64_t)n;
    if (c->state == ST_DRAINING) return; /* whatever follows a close-delimited response */
    size_t off = 0;
    while (off < (size_t)n) {
        int ev;
        if (c->inflight == 0) { /* bytes nobody asked for */
            conn_fail(c, &conn_errors(c)->read);
            return;
        }
        off += resp_feed(&c->parser, buf + off, (size_t)n - off, &ev);
        if (ev == RP_ERROR) {
            conn_fail(c, &conn_errors(c)->read);
            return;
        }
        if (ev == RP_DONE && !on_response(c, now_ns(), 0)) return;
    }
}

static void on_event(struct conn *c, unsigned events)
{
    struct worker *w = c->w;
    uint64_t gen = c->gen;
    switch (c->state) {
    case ST_CONNECTING: {
        uint64_t now = now_ns();
        int r = w->cfg->target.transport->finish(c->fd);
        if (r == NET_OK) {
            set_events(c, PL_IN);
            conn_connected(c, now);
        } else {
            if (r == NET_RETRY) conn_errors(c)->connect_retry++;
            else conn_errors(c)->connect++;
            conn_backoff(c, now);
        }
        return;
    }
    case ST_WRITING:
        if (events & (PL_OUT | PL_ERR)) conn_write(c);
        if (c->gen == gen && c->fd >= 0 && (events & PL_IN)) on_readable(c);
        return;
    case ST_READING:
    case ST_DRAINING:
    case ST_IDLE:
        if (events & (PL_IN | PL_ERR)) on_readable(c);
        return;
    default: /* CLOSED, BACKOFF: a stale event */
        return;
    }
}

static void rate_dispatch(struct worker *w, uint64_t now)
{
    while (w->nidle && w->next_slot_ns <= now && now < w->stop_ns) {
        struct conn *c = w->idle[--w->nidle];
        c->in_idle = 0;
        if (c->state != ST_IDLE) continue; /* replaced since it was queued */
        uint64_t slot = w->next_slot_ns;
        w->next_slot_ns += w->rate_interval_ns;
        w->sent++;
        if (now - slot > LATE_THRESHOLD_US * 1000ULL) w->late++;
        conn_send(c, now, slot);
    }
}

static void scan_timers(struct worker *w, uint64_t now)
{
    for (uint64_t i = 0; i < w->nconns; i++) {
        struct conn *c = &w->conns[i];
        if (c->state == ST_BACKOFF) {
            if (now >= c->retry_ns) {
                w->nbackoff--;
                conn_open(c, now);
            }
        } else if (c->deadline_ns && now >= c->deadline_ns) {
            if (c->state == ST_DRAINING) {
                w->reconnects++;
            } else {
                conn_errors(c)->timeout++;
            }
            conn_replace(c, now);
        }
    }
}

static void record_rate(struct worker *w, uint64_t now)
{
    /* As wrk: a sample per RECORD_INTERVAL_MS with at least one response. */
    if (w->interval_requests == 0) return;
    uint64_t elapsed_ms = (now - w->interval_start_ns) / NS_PER_MS;
    if (elapsed_ms == 0) elapsed_ms = 1;
    hist_record(w->rps, w->interval_requests * 1000 / elapsed_ms);
    w->interval_requests = 0;
    w->interval_start_ns = now;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct poller_event events[256];
    uint64_t scan_ns = min_u64(TIMEOUT_SCAN_MAX_MS * NS_PER_MS, w->cfg->timeout_us * 1000 / 10);
    if (scan_ns < NS_PER_MS) scan_ns = NS_PER_MS;
    uint64_t now = now_ns();
    for (uint64_t i = 0; i < w->nconns; i++) conn_open(&w->conns[i], now);
    w->interval_start_ns = now;
    uint64_t next_scan = now + scan_ns;
    int timer_fd = -1;
    static char timer_tag; /* poller event pointer that means "the slot timer fired" */
#ifdef HAVE_TIMERFD
    uint64_t timer_armed = 0;
    if (w->rate_interval_ns) {
        timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (timer_fd >= 0 && poller_add(w->poller, timer_fd, PL_IN, &timer_tag) < 0) {
            close(timer_fd);
            timer_fd = -1;
        }
    }
#endif

    for (;;) {
        now = now_ns();
        if (now >= w->stop_ns || stop_requested) break;
        uint64_t wake = min_u64(w->stop_ns, w->interval_start_ns + RECORD_INTERVAL_MS * NS_PER_MS);
        wake = min_u64(wake, next_scan);
        if (w->nbackoff) wake = min_u64(wake, now + BACKOFF_MS * NS_PER_MS);
        if (w->nidle && w->rate_interval_ns) {
            wake = min_u64(wake, w->next_slot_ns);
#ifdef HAVE_TIMERFD
            if (timer_fd >= 0 && w->next_slot_ns > now && timer_armed != w->next_slot_ns) {
                struct itimerspec its;
                memset(&its, 0, sizeof its);
                its.it_value.tv_sec = (time_t)(w->next_slot_ns / 1000000000ULL);
                its.it_value.tv_nsec = (long)(w->next_slot_ns % 1000000000ULL);
                if (timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &its, NULL) == 0) {
                    timer_armed = w->next_slot_ns;
                    wake = min_u64(wake, w->next_slot_ns + NS_PER_MS); /* the timer fires first */
                }
            }
#endif
        }
        int timeout_ms = wake <= now ? 0 : (int)min_u64((wake - now + NS_PER_MS - 1) / NS_PER_MS, MAX_WAIT_MS);
        int n = poller_wait(w->poller, events, (int)(sizeof events / sizeof events[0]), timeout_ms);
        for (int i = 0; i < n; i++) {
            if (events[i].ptr == &timer_tag) {
                uint64_t expirations;
                if (read(timer_fd, &expirations, sizeof expirations) < 0) { /* EAGAIN: nothing to clear */
                }
                continue;
            }
            on_event(events[i].ptr, events[i].events);
        }
        now = now_ns();
        if (now >= w->interval_start_ns + RECORD_INTERVAL_MS * NS_PER_MS) record_rate(w, now);
        if (now >= next_scan || w->nbackoff) {
            scan_timers(w, now);
            next_scan = now + scan_ns;
        }
        if (w->rate_interval_ns) rate_dispatch(w, now);
    }

    if (w->rate_interval_ns && w->next_slot_ns < w->stop_ns)
        w->dropped = (w->stop_ns - w->next_slot_ns - 1) / w->rate_interval_ns + 1;
    for (uint64_t i = 0; i < w->nconns; i++) conn_close(&w->conns[i]);
    if (timer_fd >= 0) close(timer_fd);
    return NULL;
}

int worker_init(struct worker *w, const struct config *cfg, int id, uint64_t nconns, uint64_t rate,
                uint64_t start_ns, uint64_t stop_ns)
{
    memset(w, 0, sizeof *w);
    w->id = id;
    w->cfg = cfg;
    w->nconns = nconns;
    w->start_ns = start_ns;
    w->stop_ns = stop_ns;
    w->conns = calloc(nconns, sizeof *w->conns);
    w->idle = calloc(nconns, sizeof *w->idle);
    w->rbuf = malloc(RECVBUF);
    w->connect = hist_new();
    w->rps = hist_new();
    w->poller = poller_new((int)nconns);
    w->stats = calloc(cfg->mix.n, sizeof *w->stats);
    w->pick = cfg->mix.n > 1 && !cfg->per_connection;
    w->rng = mix_rng_seed(cfg->seed, (uint64_t)id);
    w->classes = calloc(nconns * cfg->pipeline, 1);
    if (w->pick && cfg->pipeline > 1) w->iovs = calloc(nconns * cfg->pipeline, sizeof *w->iovs);
    if (!w->conns || !w->idle || !w->rbuf || !w->connect || !w->rps || !w->poller || !w->stats || !w->classes ||
        (w->pick && cfg->pipeline > 1 && !w->iovs))
        return -1;
    for (size_t k = 0; k < cfg->mix.n; k++)
        if (!(w->stats[k].latency = hist_new())) return -1;
    for (uint64_t i = 0; i < nconns; i++) {
        struct conn *c = &w->conns[i];
        c->w = w;
        c->fd = -1;
        c->classes = w->classes + i * cfg->pipeline;
        c->iov = w->iovs ? w->iovs + i * cfg->pipeline : &c->one;
        c->niov = w->iovs ? (int)cfg->pipeline : 1;
        if (cfg->per_connection) {
            /* main deals connections to threads round robin: this is number i * threads + id */
            size_t t = mix_connection_target(&cfg->mix, i * cfg->threads + (uint64_t)id);
            memset(c->classes, (int)t, cfg->pipeline);
        }
    }
    if (rate) {
        w->rate_interval_ns = 1000000000ULL / rate;
        if (w->rate_interval_ns == 0) w->rate_interval_ns = 1;
        /* stagger threads so their slots interleave */
        w->next_slot_ns = start_ns + w->rate_interval_ns * (uint64_t)id / cfg->threads;
    }
    return 0;
}

void worker_free(struct worker *w)
{
    free(w->conns);
    free(w->idle);
    free(w->rbuf);
    if (w->stats)
        for (size_t k = 0; k < w->cfg->mix.n; k++) hist_free(w->stats[k].latency);
    free(w->stats);
    free(w->classes);
    free(w->iovs);
    hist_free(w->connect);
    hist_free(w->rps);
    poller_free(w->poller);
}
