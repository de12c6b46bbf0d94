/* report.h - merged results, and the two ways of printing them. */
#ifndef BL_REPORT_H
#define BL_REPORT_H

#include <stdio.h>

#include "config.h"
#include "worker.h"

struct results {
    uint64_t runtime_us, complete, bytes, reconnects;
    struct errors errors;
    uint64_t status_counts[600];
    struct hist *latency, *connect, *rps;
    uint64_t sent, late, dropped;
    double cpu_user_s, cpu_system_s;
    const struct worker *workers;
    uint64_t nworkers;
    struct target_stats *targets; /* one per cfg->mix target, merged over threads */
    size_t ntargets;
};

/* "Running 10s test @ URL" and "  N threads and M connections", as wrk. */
void report_banner(FILE *out, const struct config *cfg);
/* The rest of wrk's report, plus our --latency, -R and --target extras. */
void report_text(FILE *out, const struct config *cfg, const struct results *r);
/* Machine-readable results; returns -1 (errno set) when the file can't be written. */
int report_json(const char *path, const struct config *cfg, const struct results *r);

#endif
