/* The text report, byte for byte: widths and units worked out by hand from
 * wrk's print_stats / print_units rules, not from our own output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "report.h"

static char *render(const struct config *cfg, const struct results *r)
{
    static char out[4096];
    memset(out, 0, sizeof out);
    FILE *f = fmemopen(out, sizeof out - 1, "w");
    report_banner(f, cfg);
    report_text(f, cfg, r);
    fclose(f);
    return out;
}

static void fill(struct config *cfg, struct results *r)
{
    memset(cfg, 0, sizeof *cfg);
    memset(r, 0, sizeof *r);
    cfg->threads = 1;
    cfg->connections = 2;
    cfg->duration_us = 10000000;
    cfg->keepalive = 1;
    cfg->url = "http://127.0.0.1:8080/";
    r->latency = hist_new();
    r->connect = hist_new();
    r->rps = hist_new();
    hist_record(r->latency, 1000);
    hist_record(r->latency, 2000);
    hist_record(r->latency, 3000);
    hist_record(r->rps, 53600);
    hist_record(r->rps, 57640);
    hist_record(r->rps, 61680);
    r->runtime_us = 1000000;
    r->complete = 300;
    r->bytes = 45000;
}

static void release(struct results *r)
{
    hist_free(r->latency);
    hist_free(r->connect);
    hist_free(r->rps);
}

void test_report_plain(void)
{
    struct config cfg;
    struct results r;
    fill(&cfg, &r);
    CHECK_STR(render(&cfg, &r),
              "Running 10s test @ http://127.0.0.1:8080/\n"
              "  1 threads and 2 connections\n"
              "  Thread Stats   Avg      Stdev     Max   +/- Stdev\n"
              "    Latency     2.00ms    1.00ms   3.00ms  100.00%\n"
              "    Req/Sec    57.64k     4.04k   61.68k   100.00%\n"
              "  300 requests in 1.00s, 43.95KB read\n"
              "Requests/sec:    300.00\n"
              "Transfer/sec:     43.95KB\n");
    release(&r);
}

void test_report_latency_and_errors(void)
{
    struct config cfg;
    struct results r;
    fill(&cfg, &r);
    cfg.latency = 1;
    cfg.duration_us = 120000000;
    r.errors.connect = 1;
    r.errors.read = 2;
    r.errors.write = 3;
    r.errors.timeout = 4;
    r.errors.status = 5;
    CHECK_STR(render(&cfg, &r),
              "Running 2m test @ http://127.0.0.1:8080/\n"
              "  1 threads and 2 connections\n"
              "  Thread Stats   Avg      Stdev     Max   +/- Stdev\n"
              "    Latency     2.00ms    1.00ms   3.00ms  100.00%\n"
              "    Req/Sec    57.64k     4.04k   61.68k   100.00%\n"
              "  Latency Distribution\n"
              "     50%    2.00ms\n"
              "     75%    3.00ms\n"
              "     90%    3.00ms\n"
              "     99%    3.00ms\n"
              "   99.9%    3.00ms\n"
              "  99.99%    3.00ms\n"
              "  300 requests in 1.00s, 43.95KB read\n"
              "  Socket errors: connect 1, read 2, write 3, timeout 4\n"
              "  Non-2xx or 3xx responses: 5\n"
              "Requests/sec:    300.00\n"
              "Transfer/sec:     43.95KB\n");
    release(&r);
}

/* --target: wrk's report unchanged, then one line per target. Widths by hand:
 * the first column is as wide as the longest "METHOD PATH" (14 here), then
 * " %10s" requests, " %6.1f%%" share, five 10-wide latencies (wrk's
 * print_units) and " %9s" twice. */
void test_report_targets(void)
{
    struct config cfg;
    struct results r;
    fill(&cfg, &r);
    char err[256];
    CHECK(mix_add(&cfg.mix, "GET /fast", "95", err, sizeof err) == 0);
    CHECK(mix_add(&cfg.mix, "POST /slow?x=1", "5", err, sizeof err) == 0);
    struct target_stats ts[2];
    memset(ts, 0, sizeof ts);
    ts[0].latency = hist_new();
    ts[1].latency = hist_new();
    hist_record(ts[0].latency, 1000);
    hist_record(ts[0].latency, 2000);
    hist_record(ts[0].latency, 3000);
    ts[0].complete = 3;
    hist_record(ts[1].latency, 300000);
    ts[1].complete = 1;
    ts[1].errors.status = 1;
    ts[1].errors.connect = 1;
    ts[1].errors.timeout = 2;
    ts[1].errors.connect_retry = 7; /* not a socket error: not in the Errors column */
    r.targets = ts;
    r.ntargets = 2;
    CHECK_STR(render(&cfg, &r),
              "Running 10s test @ http://127.0.0.1:8080/\n"
              "  1 threads and 2 connections\n"
              "  Thread Stats   Avg      Stdev     Max   +/- Stdev\n"
              "    Latency     2.00ms    1.00ms   3.00ms  100.00%\n"
              "    Req/Sec    57.64k     4.04k   61.68k   100.00%\n"
              "  300 requests in 1.00s, 43.95KB read\n"
              "Requests/sec:    300.00\n"
              "Transfer/sec:     43.95KB\n"
              "  Per target" "    " " " "  Requests" " " "  Share" "       Avg" "       p50" "       p90" "       p99"
              "       Max" " " "  Non-2xx" " " "   Errors" "\n"
              "  GET /fast" "     " " " "         3" " " "  75.0%" "    2.00ms" "    2.00ms" "    3.00ms" "    3.00ms"
              "    3.00ms" " " "        0" " " "        0" "\n"
              "  POST /slow?x=1" " " "         1" " " "  25.0%" "  300.00ms" "  300.00ms" "  300.00ms" "  300.00ms"
              "  300.00ms" " " "        1" " " "        3" "\n");
    /* the same results without --target: not a byte more than wrk's report */
    cfg.mix.given = 0;
    CHECK(strstr(render(&cfg, &r), "Per target") == NULL);
    hist_free(ts[0].latency);
    hist_free(ts[1].latency);
    mix_free(&cfg.mix);
    release(&r);
}
