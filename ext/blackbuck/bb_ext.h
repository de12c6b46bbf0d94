/*
 * bb_ext.h - shared declarations of the Ruby glue (everything here knows Ruby;
 * bb_http.[ch] does not).
 */
#ifndef BB_EXT_H
#define BB_EXT_H

#include <ruby.h>
#include <ruby/encoding.h>
#include <ruby/thread.h>
#include "bb_http.h"

/* Ceiling for the configurable header-count limit: the parser's header array lives on the stack. */
#define BB_HEADERS_CAP 1000
/* A connection's read buffer starts this big and doubles up to max_header_bytes + BB_READ_CHUNK. */
#define BB_BUF_INITIAL (8 * 1024)
/* Bytes asked of read() at most in one call. */
#define BB_READ_CHUNK (64 * 1024)
/* Defaults of the response_buffer and max_response_spill settings (Config has the same). */
#define BB_DEFAULT_RESPONSE_BUFFER (1024 * 1024)                 /* bytes queued in memory per connection */
#define BB_DEFAULT_MAX_RESPONSE_SPILL (1024LL * 1024 * 1024)    /* bytes of spill file per connection */
#define BB_DEFAULT_MAX_WORKER_SPILL (4LL * 1024 * 1024 * 1024)  /* bytes of all a worker's spill files */

extern VALUE bb_mBlackbuck, bb_mNative;

/* Process-wide settings, written once at boot from Ruby (Native.configure). */
struct bb_settings {
    struct bb_limits limits;
    int write_timeout_ms; /* a blocking write waits at most this long for the client to read */
    size_t response_buffer;     /* bytes of output a connection may queue in memory; past it, spill */
    int64_t max_response_spill; /* bytes a connection's spill file may hold; past it, wait; 0 = never spill */
    int64_t max_worker_spill;   /* bytes all spill files of this process may hold together; past it, wait */
    int trust_forwarded_proto;  /* X-Forwarded-Proto/-Ssl/-Scheme from a proxy set rack.url_scheme */
};
extern struct bb_settings bb_settings;

/* Bytes in this process's response spill files now (bb_conn.c; the scoreboard publishes it). */
int64_t bb_spill_total(void);

/* Status lines ("HTTP/1.1 200 OK\r\n") built once at boot from Rack's table. */
const char *bb_status_line(int status, size_t *len);
/* "Date: Sun, 22 Nov 2026 00:00:00 GMT\r\n", refreshed at most once a second. */
const char *bb_date_header(size_t *len);
/* Interned (deduplicated, frozen) string; no allocation when it already exists. */
VALUE bb_fstring(const char *ptr, long len);

/* accept4 with peer address; -1 when nothing is pending (see bb_ext.c). */
int bb_accept(int lfd, int tcp, VALUE *addr);
/* An IPv4 (AF_INET) or IPv6 (AF_INET6) address as REMOTE_ADDR shows it (interned); nil if af is neither. */
VALUE bb_ip_string(int af, const void *addr);

/* Logs one warning line through the server's logger (Native.logger=); nothing when none is set. */
void bb_warn(VALUE msg);

/* Waits until fd is writable or timeout_ms passes, without holding the GVL. 1 ready, 0 timeout, -1 error. */
int bb_wait_writable(int fd, int timeout_ms);

/* Conn#state: where a connection is in its life (Native::Conn::IDLE..., Worker's names for them).
 * Only the worker's loop thread changes it; the hand-off watcher reads it (an IDLE one may move). */
enum bb_conn_state {
    BB_CONN_IDLE = 0, /* keep-alive (or new), no byte of the next request yet: only these may move */
    BB_CONN_HEAD,     /* part of a request head received */
    BB_CONN_BODY,     /* reading the request body */
    BB_CONN_WRITE,    /* response bytes waiting for the client */
    BB_CONN_BUSY,     /* its request is in the app */
    BB_CONN_LINGER    /* closing in stages: write side shut, input discarded until the client closes */
};
/* Hand-off (bb_handoff.c): moves fd to another worker over sock when it is a connection waiting
 * between requests. pidfd >= 0: the caller has its own fd table and takes the socket from the
 * worker's with pidfd_getfd. owner: the caller is the thread that owns the connection (it need not be
 * in the poller). 1 moved, 0 not such a connection, -1 with errno. Called without the GVL by the watcher. */
int bb_conn_pass(int fd, int pidfd, int sock, double now, int owner);
/* REQUEST_METHOD and PATH_INFO of the request a Conn parsed last (nil before its first). */
void bb_conn_request_line(VALUE conn, VALUE *method, VALUE *path);

/* The worker's poller, for the hand-off watcher thread (no Ruby calls, no GVL needed): */
struct poller;
struct poller *bb_poller_get(VALUE poller);
/* fds readable now (timeout 0), at most max of them, connections with an error or hang-up left out. */
int bb_poller_peek(struct poller *pl, int *fds, int max);
/* Unregisters fd; 0 or -1 with errno. */
int bb_poller_forget(struct poller *pl, int fd);
/* The epoll fd, or -1 for the poll(2) poller. */
int bb_poller_epoll_fd(struct poller *pl);

void bb_init_conn(void);
void bb_init_handoff(void);
void bb_init_poller(void);
void bb_init_scoreboard(void);
/* Scoreboard#request_start and #request_done, for Handoff's (which wrap them). */
VALUE bb_scoreboard_request_start(VALUE sb, VALUE idx, VALUE conn, VALUE queue);
VALUE bb_scoreboard_request_done(VALUE sb, VALUE idx, VALUE state);
/* Why a move between workers did not happen (Scoreboard::HANDOFF_FAILURES names them, in this order). */
enum bb_handoff_failure {
    BB_HANDOFF_REFUSED = 0,   /* the receiver had too few descriptors free: it left the connection queued */
    BB_HANDOFF_SEND_FAILED,   /* the send failed (not a full queue): the connection stayed with its worker */
    BB_HANDOFF_LOST,          /* the kernel dropped the socket at the receiver (no descriptor free): reset */
    BB_HANDOFF_FAILURE_KINDS
};
/* Counts one in this worker's own scoreboard slot (none before Scoreboard#reset). Any thread, no GVL. */
void bb_scoreboard_handoff_failed(int why);
/* With the GVL: logs a run of failed hand-off sends once, when one began since the last move that
 * went through (bb_conn_pass may fail on the watcher thread, which cannot log). */
void bb_conn_pass_report(void);
void bb_init_queue(void);

#endif
