/* json.c - report_json(): the --json file. Schema in README.md. Written
 * with fprintf: every value is a number, a fixed key, or a string escaped
 * by put_string. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "report.h"

#define JSON_VERSION 1

static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void put_hist(FILE *f, const char *name, const struct hist *h)
{
    static const struct { const char *key; long double p; } pct[] = {
        { "50", 50 }, { "75", 75 }, { "90", 90 }, { "99", 99 }, { "99.9", 99.9L }, { "99.99", 99.99L }, { "100", 100 },
    };
    long double mean = hist_mean(h);
    fprintf(f, "  \"%s\": {\"count\": %" PRIu64 ", \"min\": %" PRIu64 ", \"mean\": %.2Lf, \"stdev\": %.2Lf, \"max\": %" PRIu64 ",\n",
            name, h->count, h->count ? h->min : 0, mean, hist_stdev(h, mean), h->max);
    fprintf(f, "    \"percentiles\": {");
    for (size_t i = 0; i < sizeof pct / sizeof pct[0]; i++)
        fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", pct[i].key, hist_percentile(h, pct[i].p));
    fprintf(f, "},\n    \"histogram\": [");
    /* [upper bound of bucket, count], non-empty buckets only; bounded by HIST_BUCKETS */
    int first = 1;
    if (h->count)
        for (size_t i = hist_index(h->min); i <= hist_index(h->max); i++) {
            if (!h->counts[i]) continue;
            fprintf(f, "%s[%" PRIu64 ", %" PRIu64 "]", first ? "" : ", ", hist_highest(i), h->counts[i]);
            first = 0;
        }
    fprintf(f, "]}");
}

static void put_errors(FILE *f, const struct errors *e)
{
    fprintf(f, "{\"connect\": %" PRIu64 ", \"read\": %" PRIu64 ", \"write\": %" PRIu64 ", \"timeout\": %" PRIu64
               ", \"status\": %" PRIu64 ", \"connect_retry\": %" PRIu64 "}",
            e->connect, e->read, e->write, e->timeout, e->status, e->connect_retry);
}

/* --target: one object per target, in the order given; latency_us has the
 * shape of the run's own. */
static void put_targets(FILE *f, const struct config *cfg, const struct results *r)
{
    fprintf(f, "  \"targets\": [");
    for (size_t k = 0; cfg->mix.given && k < cfg->mix.n && k < r->ntargets; k++) {
        const struct mix_target *t = &cfg->mix.targets[k];
        const struct target_stats *ts = &r->targets[k];
        fprintf(f, "%s\n    {\"method\": ", k ? "," : "");
        put_string(f, t->method);
        fprintf(f, ", \"path\": ");
        put_string(f, t->path);
        fprintf(f, ", \"weight\": %" PRIu64 ", \"connections\": ", t->weight);
        if (cfg->per_connection) fprintf(f, "%" PRIu64, t->connections);
        else fputs("null", f);
        fprintf(f, ", \"requests\": %" PRIu64 ",\n    \"errors\": ", ts->complete);
        put_errors(f, &ts->errors);
        fprintf(f, ", \"non_2xx_3xx\": %" PRIu64 ",\n  ", ts->errors.status);
        put_hist(f, "latency_us", ts->latency);
        fputs("}", f);
    }
    fprintf(f, "%s],\n", cfg->mix.given ? "\n  " : "");
}

int report_json(const char *path, const struct config *cfg, const struct results *r)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    long double runtime_s = r->runtime_us > 0 ? r->runtime_us / 1000000.0L : 1e-6L;

    fprintf(f, "{\n  \"schema_version\": %d,\n  \"config\": {\"url\": ", JSON_VERSION);
    put_string(f, cfg->url);
    fprintf(f, ", \"transport\": ");
    put_string(f, cfg->target.transport->name);
    fprintf(f, ", \"address\": ");
    put_string(f, cfg->target.display);
    fprintf(f, ", \"method\": ");
    put_string(f, cfg->method);
    fprintf(f, ",\n    \"threads\": %" PRIu64 ", \"connections\": %" PRIu64 ", \"duration_s\": %.3f, \"timeout_s\": %.3f,"
               " \"keepalive\": %s, \"pipeline\": %" PRIu64 ", \"rate\": %" PRIu64 ", \"body_bytes\": %zu,"
               " \"seed\": %" PRIu64 ", \"target_per_connection\": %s,\n    \"headers\": [",
            cfg->threads, cfg->connections, cfg->duration_us / 1e6, cfg->timeout_us / 1e6, cfg->keepalive ? "true" : "false",
            cfg->pipeline, cfg->rate, cfg->body_len, cfg->seed, cfg->per_connection ? "true" : "false");
    for (size_t i = 0; i < cfg->nheaders; i++) {
        if (i) fputs(", ", f);
        put_string(f, cfg->headers[i]);
    }
    fprintf(f, "]},\n");
    fprintf(f, "  \"runtime_s\": %.6Lf, \"requests\": %" PRIu64 ", \"bytes\": %" PRIu64 ",\n", runtime_s, r->complete, r->bytes);
    fprintf(f, "  \"requests_per_sec\": %.2Lf, \"bytes_per_sec\": %.2Lf, \"reconnects\": %" PRIu64 ",\n",
            r->complete / runtime_s, r->bytes / runtime_s, r->reconnects);
    fprintf(f, "  \"errors\": ");
    put_errors(f, &r->errors);
    fprintf(f, ",\n");
    fprintf(f, "  \"status_codes\": {");
    int first = 1;
    for (int s = 0; s < 600; s++) {
        if (!r->status_counts[s]) continue;
        if (s) fprintf(f, "%s\"%d\": %" PRIu64, first ? "" : ", ", s, r->status_counts[s]);
        else fprintf(f, "\"other\": %" PRIu64, r->status_counts[s]); /* index 0 comes first */
        first = 0;
    }
    fprintf(f, "},\n");
    put_hist(f, "latency_us", r->latency);
    fprintf(f, ",\n");
    put_hist(f, "connect_us", r->connect);
    fprintf(f, ",\n");
    long double rmean = hist_mean(r->rps);
    fprintf(f, "  \"req_per_sec_samples\": {\"count\": %" PRIu64 ", \"mean\": %.2Lf, \"stdev\": %.2Lf, \"max\": %" PRIu64 "},\n",
            r->rps->count, rmean, hist_stdev(r->rps, rmean), r->rps->max);
    fprintf(f, "  \"threads\": [");
    for (uint64_t i = 0; i < r->nworkers; i++) {
        const struct worker *w = &r->workers[i];
        fprintf(f, "%s\n    {\"connections\": %" PRIu64 ", \"requests\": %" PRIu64 ", \"bytes\": %" PRIu64
                   ", \"requests_per_sec\": %.2Lf}",
                i ? "," : "", w->nconns, w->complete, w->bytes, w->complete / runtime_s);
    }
    fprintf(f, "\n  ],\n");
    put_targets(f, cfg, r);
    fprintf(f, "  \"rate\": {\"target\": %" PRIu64 ", \"sent\": %" PRIu64 ", \"late\": %" PRIu64 ", \"dropped\": %" PRIu64
               ", \"late_threshold_us\": %d},\n",
            cfg->rate, r->sent, r->late, r->dropped, LATE_THRESHOLD_US);
    double cpu = r->cpu_user_s + r->cpu_system_s;
    fprintf(f, "  \"cpu\": {\"user_s\": %.6f, \"system_s\": %.6f, \"us_per_request\": %.4f}\n}\n", r->cpu_user_s,
            r->cpu_system_s, r->complete ? cpu * 1e6 / (double)r->complete : 0.0);
    if (fclose(f) != 0) return -1;
    return 0;
}
