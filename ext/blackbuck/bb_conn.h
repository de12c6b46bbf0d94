/*
 * bb_conn.h - Native::Conn (bb_conn.c and the files of its concerns) as the other glue files see it:
 * the connection states, the hand-off watcher's entry (bb_conn_pass), what the scoreboard reads, and
 * the process-wide settings of connections (Native.configure).
 */
#ifndef BB_CONN_H
#define BB_CONN_H

#include "bb_glue.h"
#include "bb_http.h"
#include "bb_out.h"

/* Ceiling for the configurable header-count limit: the parser's header array lives on the stack. */
#define BB_HEADERS_CAP 1000
/* A connection's read buffer starts this big and doubles up to max_header_bytes + BB_READ_CHUNK. */
#define BB_BUF_INITIAL (8 * 1024)
/* Bytes asked of read() at most in one call. */
#define BB_READ_CHUNK (64 * 1024)

/* Process-wide settings of connections, from the server's Config (Native.configure): C has no
 * defaults of its own for them (lib/blackbuck/config.rb's DEFAULTS are the only ones). Until
 * Native.configure has run, `configured` is 0 and no connection can be made (Conn.accept and
 * Conn.receive raise), so nothing reads the others before they are set. */
struct bb_settings {
    int configured;
    struct bb_limits limits;
    int write_timeout_ms; /* a blocking write waits at most this long for the client to read */
    /* response_buffer: bytes of output a connection may queue in memory, past it spill;
     * max_response_spill: bytes a connection's spill file may hold, past it wait (0 = never spill);
     * max_worker_spill: bytes all spill files of this process may hold together, past it wait */
    struct bb_out_limits out;
    int trust_forwarded_proto;  /* X-Forwarded-Proto/-Ssl/-Scheme from a proxy set rack.url_scheme */
};
extern struct bb_settings bb_settings;

/* Bytes in this process's response spill files now (the scoreboard publishes it). */
int64_t bb_spill_total(void);

/* Conn#state: where a connection is in its life (Native::Conn::IDLE..., Worker's names for them).
 * Only the worker's loop thread changes it; the hand-off watcher reads it (an IDLE one may move). */
enum bb_conn_state {
    BB_CONN_IDLE = 0, /* keep-alive (or new), no byte of the next request yet: only these may move */
    BB_CONN_HEAD,     /* part of a request head received */
    BB_CONN_BODY,     /* reading the request body */
    BB_CONN_WRITE,    /* response bytes waiting for the client */
    BB_CONN_BUSY,     /* its request is in the app */
    BB_CONN_LINGER,   /* closing in stages: write side shut, input discarded until the client closes */
    BB_CONN_STREAM    /* its response is a stream whose body waits on a fiber (Streams): never moved, and
                       * its deadline is write_timeout only while the fiber waits for the client to read */
};
/* Hand-off (bb_conn_table.c, for bb_handoff.c): moves fd to another worker over sock when it is a
 * connection waiting between requests. owner: the caller is the thread that owns the connection (it
 * need not be in the poller). 1 moved, 0 not such a connection, -1 with errno. Called without the
 * GVL by the watcher. */
#define BB_PASS_WATCHER 0 /* bb_conn_pass's owner: the hand-off watcher thread */
#define BB_PASS_OWNER 1   /* ... the loop thread that owns the connection, a request waiting on it */
#define BB_PASS_IDLE 2    /* ... the loop thread of a retiring worker: a request waiting, or none yet */
int bb_conn_pass(int fd, int sock, double now, int owner);
/* With the GVL: logs a run of failed hand-off sends once, when one began since the last move that
 * went through (bb_conn_pass may fail on the watcher thread, which cannot log). */
void bb_conn_pass_report(void);
/* REQUEST_METHOD and PATH_INFO of the request a Conn parsed last (nil before its first). */
void bb_conn_request_line(VALUE conn, VALUE *method, VALUE *path);

/* The poller's view of a Conn (Poller#watch, #unwatch): its fd (-1 once closed or detached), and in
 * *watched the event mask it is registered with (0: none), which only the poller changes. */
int bb_conn_watch_slot(VALUE conn, int **watched);
/* Native::Conn, and Native.configure and Native.http_impl (bb_conn.c); first of the three. */
void bb_init_conn(void);
/* Native::Conn's methods of parsing (bb_env.c) and of responding (bb_respond.c). */
void bb_init_env(void);
void bb_init_respond(void);

#endif
