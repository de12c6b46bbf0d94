/*
 * bench_http.c - parses one realistic browser request (about 500 bytes) many
 * times with each scanner and prints the mean ns/request.
 * Method: ITERATIONS back-to-back bb_parse_request calls on a warm buffer
 * (one-shot, last_len 0), timed with CLOCK_MONOTONIC (wall) and
 * CLOCK_THREAD_CPUTIME_ID (this thread's CPU time, which is less disturbed
 * when the machine is shared); the best of ROUNDS rounds is printed for each.
 *
 * Build and run: make -C test/c bench
 */
#define _POSIX_C_SOURCE 200112L
#include "bb_http.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define ITERATIONS 1000000
#define ROUNDS 5

static const char REQ[] =
    "GET /wp-content/uploads/2010/03/hello-kitty-darth-vader-pink.jpg HTTP/1.1\r\n"
    "Host: www.kittyhell.com\r\n"
    "User-Agent: Mozilla/5.0 (Macintosh; U; Intel Mac OS X 10.6; ja-JP-mac; rv:1.9.2.3) "
    "Gecko/20100401 Firefox/3.6.3 Pathtraq/0.9\r\n"
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
    "Accept-Encoding: gzip,deflate\r\n"
    "Connection: keep-alive\r\n"
    "Cookie: wp_ozh_wsa_visits=2; wp_ozh_wsa_visit_lasttime=xxxxxxxxxx; "
    "__utma=xxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.x; "
    "__utmz=xxxxxxxxx.xxxxxxxxxx.x.x.utmccn=(referral)\r\n"
    "\r\n";

static double now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int bench(const char *label)
{
    /* the server's default settings (lib/blackbuck/config.rb): the parser has none of its own */
    struct bb_limits lim = { .max_request_line = 8 * 1024, .max_uri = 8 * 1024, .max_headers = 100,
                             .max_header_bytes = 64 * 1024 };
    struct bb_header headers[100];
    struct bb_request req;
    double best = 0, best_cpu = 0;
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < ITERATIONS; i++) {
            req.headers = headers;
            req.num_headers = 100;
            int r = bb_parse_request(REQ, sizeof(REQ) - 1, 0, &req, &lim);
            if (r != (int)sizeof(REQ) - 1) {
                fprintf(stderr, "%s: unexpected result %d (status %d)\n", label, r, req.status);
                return 1;
            }
            __asm__ volatile("" : : "g"(&req) : "memory");
        }
        double cpu = (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / ITERATIONS;
        double ns = (now_ns(CLOCK_MONOTONIC) - t0) / ITERATIONS;
        if (round == 0 || ns < best) best = ns;
        if (round == 0 || cpu < best_cpu) best_cpu = cpu;
    }
    printf("%-7s %zu-byte request: %6.1f ns/request CPU (%.0f MB/s), %6.1f ns wall; best of %d x %d\n",
           label, sizeof(REQ) - 1, best_cpu, (sizeof(REQ) - 1) / best_cpu * 1e3, best, ROUNDS, ITERATIONS);
    return 0;
}

int main(void)
{
    int rc = 0;
    bb_http_force_impl(0);
    rc |= bench("scalar");
    if (bb_http_force_impl(1) == 0) rc |= bench("sse4.2");
    else printf("sse4.2  not available on this CPU\n");
    return rc;
}
