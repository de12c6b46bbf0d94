/* config.h - one struct for everything the command line decides. */
#ifndef BL_CONFIG_H
#define BL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "mix.h"
#include "net.h"

#define DEFAULT_THREADS 2
#define DEFAULT_CONNECTIONS 10
#define DEFAULT_DURATION_US 10000000ULL /* 10s, as wrk */
#define DEFAULT_TIMEOUT_US 2000000ULL   /* 2s, as wrk */
#define MAX_PIPELINE 1024

struct config {
    uint64_t threads, connections, duration_us, timeout_us;
    uint64_t rate;     /* -R: requests/s over all threads; 0 = closed model */
    uint64_t pipeline; /* requests in flight per connection (>= 1) */
    int latency;       /* --latency */
    int keepalive;     /* 0 with --no-keepalive or -H 'Connection: close' */
    int per_connection; /* --target-per-connection: a target per connection, not per request */
    uint64_t seed;     /* --seed: the per-thread PRNGs that pick targets */
    const char *url, *method, *json_path, *socket_path;
    const char **headers; /* -H values, in order */
    size_t nheaders;
    size_t body_len;
    struct mix mix;    /* what to request: --target/--targets, or the URL's path alone */
    struct target target; /* where to connect (net.h) */
};

#endif
