/* worker.h - one thread, one event loop, its own connections and statistics.
 * Nothing on the request path is shared between threads. */
#ifndef BL_WORKER_H
#define BL_WORKER_H

#include <pthread.h>
#include <stdint.h>
#include <sys/uio.h>

#include "config.h"
#include "hist.h"
#include "parser.h"

#define RECVBUF 16384           /* bytes read per read() */
#define RECORD_INTERVAL_MS 100  /* Req/Sec sampling period, as wrk */
#define TIMEOUT_SCAN_MAX_MS 10  /* --timeout is enforced to within this */
#define BACKOFF_MS 1            /* wait before retrying a failed connect */
#define LATE_THRESHOLD_US 1000  /* -R: a send this much after its slot is "late" */

struct errors {
    uint64_t connect, read, write, timeout, status;
    uint64_t connect_retry; /* EAGAIN from a UNIX connect (backlog full), retried */
};

/* What happened to one target's requests (per thread; merged by main). Every
 * request, response and error belongs to exactly one target, so the sums over
 * targets are the run's totals. */
struct target_stats {
    uint64_t complete;
    struct errors errors;  /* errors.status: final responses outside 200..399 */
    struct hist *latency;  /* microseconds */
};

struct conn;

struct worker {
    pthread_t tid;
    int id;
    const struct config *cfg;
    uint64_t nconns;
    struct conn *conns;
    struct poller *poller;
    char *rbuf;

    uint64_t start_ns, stop_ns;
    uint64_t complete, bytes;
    uint64_t interval_requests, interval_start_ns; /* for Req/Sec samples */
    uint64_t reconnects;  /* connections replaced after a clean close */
    uint64_t status_counts[600]; /* [0] = anything outside 100..599 */
    struct target_stats *stats;  /* one per cfg->mix target: requests, errors, latency */
    struct hist *connect;  /* microseconds, connect() to writable */
    struct hist *rps;      /* Req/Sec samples */

    /* -R: open model. Sends are slots interval_ns apart; an idle connection
     * takes the oldest due slot. */
    uint64_t rate_interval_ns, next_slot_ns;
    struct conn **idle;
    uint64_t nidle;
    uint64_t sent, late, dropped;

    /* Which target each request goes to: drawn per request when `pick` (more
     * than one target, not --target-per-connection), else fixed per connection. */
    int pick;
    uint64_t rng;          /* xorshift64* state, seeded from --seed and the thread number */
    unsigned char *classes; /* cfg->pipeline target indexes per connection */
    struct iovec *iovs;    /* cfg->pipeline per connection: only when pick && pipeline > 1 */

    uint64_t nbackoff; /* connections waiting to reconnect */
    int failed;        /* setup failed: message in fail_msg */
    char fail_msg[128];
};

uint64_t now_ns(void);
void worker_request_stop(void); /* async-signal-safe */
int worker_init(struct worker *w, const struct config *cfg, int id, uint64_t nconns, uint64_t rate,
                uint64_t start_ns, uint64_t stop_ns);
void *worker_main(void *arg);
void worker_free(struct worker *w);

#endif
