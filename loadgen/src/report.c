/* report.c - wrk's text report, byte for byte (column widths and unit
 * rules are wrk's), followed by extras that only appear when asked for. */
#include "report.h"

#include <ctype.h>
#include <inttypes.h>
#include <string.h>

#include "units.h"

typedef char *(*formatter)(char *, size_t, long double);

/* wrk's print_units: right-align in `width`, with the unit suffix hanging
 * into a two-character gutter so numbers line up. */
static void print_units(FILE *out, long double n, formatter fmt, int width)
{
    char msg[UNITS_BUF];
    fmt(msg, sizeof msg, n);
    int len = (int)strlen(msg), pad = 2;
    if (len > 0 && isalpha((unsigned char)msg[len - 1])) pad--;
    if (len > 1 && isalpha((unsigned char)msg[len - 2])) pad--;
    width -= pad;
    fprintf(out, "%*.*s%.*s", width, width, msg, pad, "  ");
}

static void print_stats(FILE *out, const char *name, const struct hist *h, formatter fmt)
{
    long double mean = hist_mean(h), stdev = hist_stdev(h, mean);
    fprintf(out, "    %-10s", name);
    print_units(out, mean, fmt, 8);
    print_units(out, stdev, fmt, 10);
    print_units(out, (long double)h->max, fmt, 9);
    fprintf(out, "%8.2Lf%%\n", hist_within_stdev(h, mean, stdev));
}

static void print_distribution(FILE *out, const char *title, const struct hist *h)
{
    static const long double wrk_p[] = { 50, 75, 90, 99 };
    fprintf(out, "  %s Distribution\n", title);
    for (size_t i = 0; i < sizeof wrk_p / sizeof wrk_p[0]; i++) {
        fprintf(out, "%7.0Lf%%", wrk_p[i]);
        print_units(out, (long double)hist_percentile(h, wrk_p[i]), units_time_us, 10);
        fprintf(out, "\n");
    }
    fprintf(out, "%7.1Lf%%", 99.9L);
    print_units(out, (long double)hist_percentile(h, 99.9L), units_time_us, 10);
    fprintf(out, "\n%7.2Lf%%", 99.99L);
    print_units(out, (long double)hist_percentile(h, 99.99L), units_time_us, 10);
    fprintf(out, "\n");
}

/* --target: one line per target after wrk's report (README.md, "Output"). The
 * first column is as wide as the longest "METHOD PATH"; numbers are right-
 * aligned, latencies in wrk's units with the unit in a gutter as above. */
static void print_targets(FILE *out, const struct results *r, const struct mix *m)
{
    int width = (int)strlen("Per target");
    for (size_t k = 0; k < m->n; k++) {
        int len = (int)(strlen(m->targets[k].method) + 1 + strlen(m->targets[k].path));
        if (len > width) width = len;
    }
    fprintf(out, "  %-*s %10s %7s%10s%10s%10s%10s%10s %9s %9s\n", width, "Per target", "Requests", "Share", "Avg", "p50",
            "p90", "p99", "Max", "Non-2xx", "Errors");
    uint64_t total = 0;
    for (size_t k = 0; k < r->ntargets; k++) total += r->targets[k].complete;
    for (size_t k = 0; k < m->n && k < r->ntargets; k++) {
        const struct mix_target *t = &m->targets[k];
        const struct target_stats *ts = &r->targets[k];
        const struct errors *e = &ts->errors;
        int len = (int)(strlen(t->method) + 1 + strlen(t->path));
        fprintf(out, "  %s %s%*s %10" PRIu64 " %6.1Lf%%", t->method, t->path, width - len, "", ts->complete,
                total ? ts->complete * 100.0L / total : 0.0L);
        print_units(out, hist_mean(ts->latency), units_time_us, 10);
        print_units(out, (long double)hist_percentile(ts->latency, 50), units_time_us, 10);
        print_units(out, (long double)hist_percentile(ts->latency, 90), units_time_us, 10);
        print_units(out, (long double)hist_percentile(ts->latency, 99), units_time_us, 10);
        print_units(out, (long double)ts->latency->max, units_time_us, 10);
        fprintf(out, " %9" PRIu64 " %9" PRIu64 "\n", e->status, e->connect + e->read + e->write + e->timeout);
    }
}

void report_banner(FILE *out, const struct config *cfg)
{
    char d[UNITS_BUF];
    if (cfg->duration_us % 1000000 == 0) units_time_s(d, sizeof d, (long double)(cfg->duration_us / 1000000));
    else units_time_us(d, sizeof d, (long double)cfg->duration_us);
    fprintf(out, "Running %s test @ %s\n", d, cfg->url);
    fprintf(out, "  %" PRIu64 " threads and %" PRIu64 " connections\n", cfg->threads, cfg->connections);
}

void report_text(FILE *out, const struct config *cfg, const struct results *r)
{
    char a[UNITS_BUF], b[UNITS_BUF];
    long double runtime_s = r->runtime_us / 1000000.0L;
    if (runtime_s <= 0) runtime_s = 1e-6L;

    fprintf(out, "  Thread Stats%6s%11s%8s%12s\n", "Avg", "Stdev", "Max", "+/- Stdev");
    print_stats(out, "Latency", r->latency, units_time_us);
    print_stats(out, "Req/Sec", r->rps, units_metric);
    if (cfg->latency) {
        print_distribution(out, "Latency", r->latency);
        if (!cfg->keepalive) print_distribution(out, "Connect", r->connect);
    }
    fprintf(out, "  %" PRIu64 " requests in %s, %sB read\n", r->complete,
            units_time_us(a, sizeof a, (long double)r->runtime_us), units_binary(b, sizeof b, (long double)r->bytes));
    const struct errors *e = &r->errors;
    if (e->connect || e->read || e->write || e->timeout)
        fprintf(out, "  Socket errors: connect %" PRIu64 ", read %" PRIu64 ", write %" PRIu64 ", timeout %" PRIu64 "\n",
                e->connect, e->read, e->write, e->timeout);
    if (e->connect_retry) /* not a wrk line: only when a UNIX listen backlog overflowed */
        fprintf(out, "  Connect retries (listen backlog full): %" PRIu64 "\n", e->connect_retry);
    if (e->status) fprintf(out, "  Non-2xx or 3xx responses: %" PRIu64 "\n", e->status);
    if (cfg->rate)
        fprintf(out, "  Rate: target %" PRIu64 "/s, sent %" PRIu64 ", late %" PRIu64 ", dropped %" PRIu64 "\n",
                cfg->rate, r->sent, r->late, r->dropped);
    fprintf(out, "Requests/sec: %9.2Lf\n", r->complete / runtime_s);
    fprintf(out, "Transfer/sec: %10sB\n", units_binary(a, sizeof a, r->bytes / runtime_s));
    if (cfg->mix.given) print_targets(out, r, &cfg->mix);
}
