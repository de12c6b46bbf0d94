/* hist.h - log-linear histogram (HdrHistogram-style), fixed memory.
 *
 * Values 0..2*HIST_SUB-1 are stored exactly; above that each power-of-two
 * range is split into HIST_SUB buckets, so any value is kept to within
 * 1/HIST_SUB (~0.1%) of itself. Memory is HIST_BUCKETS counters whatever
 * the run length. Each thread owns its histograms (no atomics); the main
 * thread merges them after join. */
#ifndef BL_HIST_H
#define BL_HIST_H

#include <stddef.h>
#include <stdint.h>

#define HIST_SUB_BITS 10
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_MAX_BITS 40 /* values are clamped to 2^40-1 (~12.7 days in us) */
#define HIST_BUCKETS ((HIST_MAX_BITS - HIST_SUB_BITS + 1) * HIST_SUB)
#define HIST_MAX_VALUE ((1ULL << HIST_MAX_BITS) - 1)

struct hist {
    uint64_t count;
    uint64_t min, max;
    long double sum, sumsq; /* exact mean and stdev, independent of bucket width */
    uint64_t counts[HIST_BUCKETS];
};

struct hist *hist_new(void); /* zeroed; NULL when out of memory */
void hist_free(struct hist *h);
void hist_record(struct hist *h, uint64_t v);
void hist_merge(struct hist *dst, const struct hist *src);

size_t hist_index(uint64_t v);
uint64_t hist_lowest(size_t idx);  /* smallest value that maps to idx */
uint64_t hist_highest(size_t idx); /* largest value that maps to idx */

long double hist_mean(const struct hist *h);
long double hist_stdev(const struct hist *h, long double mean); /* sample stdev, as wrk */
/* Percentage of samples within mean +/- stdev (wrk's "+/- Stdev" column). */
long double hist_within_stdev(const struct hist *h, long double mean, long double stdev);
/* Smallest recorded value v such that at least p% of samples are <= v
 * (to bucket precision, never above max). 0 when empty. */
uint64_t hist_percentile(const struct hist *h, long double p);

#endif
