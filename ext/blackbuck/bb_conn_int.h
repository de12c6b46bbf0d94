/*
 * bb_conn_int.h - Native::Conn's own header, for the files that hold its concerns (nothing else
 * includes it): the struct, and what more than one of them uses, inline where a call was a static
 * function's before the split (the request path makes no more calls than it did).
 *
 *   bb_conn_table.c  the fd table the hand-off watcher thread shares, its locking, moving a Conn
 *                    (calls no other of these files)
 *   bb_conn.c        the connection's life: accept, read buffer, body framing, close and linger, the
 *                    settings, the Ruby methods of moving it (calls bb_conn_table.c only)
 *   bb_env.c         a parsed request's Rack env (and the env cache of a keep-alive connection)
 *   bb_respond.c     response heads, writing and queueing output (bb_out.c), file bodies, hints,
 *                    handing the socket to the app (detach)
 * bb_env.c and bb_respond.c use bb_conn.c's type and settings and call neither each other nor back;
 * bb_ext.c calls each file's init.
 */
#ifndef BB_CONN_INT_H
#define BB_CONN_INT_H

#include "bb_conn.h"
#include "bb_out.h"
#include "bb_pass.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

/* Bytes of a Host value a connection's env_base keeps the Host entries for (a longer one: they are
 * set for every request, as for a connection whose Host changes). */
#define BB_BASE_HOST_MAX 128
enum { BODY_NONE = 0, BODY_LENGTH = 1, BODY_CHUNKED = 2 };
enum { WRITE_DONE = BB_OUT_DONE, WRITE_PENDING = BB_OUT_PENDING, STREAM_CHUNKED = 2, STREAM_RAW = 3, WRITE_FAILED = BB_OUT_FAILED };

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
    /* response bytes the client has not taken yet (memory, spill file, file body: bb_out.h) */
    struct bb_out out;
    /* Ruby-side state */
    long requests;
    int state;
    double deadline;
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
    VALUE remote_addr, template;
};

extern VALUE bb_cConn;
extern const rb_data_type_t bb_conn_type;

static inline struct conn *get_conn(VALUE self)
{
    struct conn *c;
    TypedData_Get_Struct(self, struct conn, &bb_conn_type, c);
    return c;
}

/* requests per connection, then Connection: close; 0 = no cap (Conn.keepalive_policy) */
extern long bb_keepalive_max;

/* This process's spill files (a worker is one process), against max_worker_spill. */
extern struct bb_spill_pool bb_spill_pool;

static inline int queued(const struct conn *c) { return bb_out_queued(&c->out); }

/* Forgets all queued output (the connection is closing or handed over). */
static inline void out_discard(struct conn *c) { bb_out_discard(&c->out, &bb_spill_pool); }

/* Bytes a connection's read buffer may grow to. */
static inline size_t buf_limit(void) { return bb_settings.limits.max_header_bytes + BB_READ_CHUNK; }

static inline int ieq(const char *a, size_t alen, const char *lower)
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

static inline double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Open connections by fd (bb_conn_table.c), for the hand-off watcher thread (bb_handoff.c), which
 * finds the connections with a request waiting by fd and may not touch Ruby objects. Written by the
 * worker's Ruby thread on setup and close, read by the watcher (bb_conn_pass) and written by
 * pass_request's mark: all under lock. */
struct bb_conn_table {
    struct conn **by_fd;
    int cap;
    pthread_mutex_t lock;
};
extern struct bb_conn_table bb_conn_table;
/* Makes the table hold fd (under lock). 0, or -1 when it cannot grow. */
int bb_conn_table_grow(int fd);

static inline void table_put(struct conn *c)
{
    pthread_mutex_lock(&bb_conn_table.lock);
    if (c->fd < bb_conn_table.cap || bb_conn_table_grow(c->fd) == 0) bb_conn_table.by_fd[c->fd] = c;
    /* else: not movable, nothing else changes */
    pthread_mutex_unlock(&bb_conn_table.lock);
}

static inline void table_drop(struct conn *c)
{
    if (c->fd < 0) return;
    pthread_mutex_lock(&bb_conn_table.lock);
    if (c->fd < bb_conn_table.cap && bb_conn_table.by_fd[c->fd] == c) bb_conn_table.by_fd[c->fd] = NULL;
    pthread_mutex_unlock(&bb_conn_table.lock);
}

/* Takes a moved connection off the hand-off socket (Conn.receive): its fd, or one of these. */
#define BB_TAKE_NONE (-1)     /* nothing is queued */
#define BB_TAKE_UNUSABLE (-2) /* a message that could not be used (its socket is closed) */
int bb_conn_take(int sock, int wake, int last, struct bb_pass *p, char *bytes, size_t cap, size_t *len);
/* Moves c with the request it read (Conn#pass_request): 1 moved, 0 it may not (or the send failed), -1 the queue is full. */
int bb_conn_pass_request(struct conn *c, int sock);

#endif
