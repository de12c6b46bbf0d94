/* hist.c - see hist.h. */
#include "hist.h"

#include <math.h>
#include <stdlib.h>

struct hist *hist_new(void) { return calloc(1, sizeof(struct hist)); }
void hist_free(struct hist *h) { free(h); }

static int msb(uint64_t v) /* v > 0 */
{
#if defined(__GNUC__) || defined(__clang__)
    return 63 - __builtin_clzll(v);
#else
    int b = 0;
    while (v >>= 1) b++;
    return b;
#endif
}

size_t hist_index(uint64_t v)
{
    if (v > HIST_MAX_VALUE) v = HIST_MAX_VALUE;
    if (v < 2 * HIST_SUB) return (size_t)v;
    int shift = msb(v) - HIST_SUB_BITS;
    return (size_t)(shift + 1) * HIST_SUB + (size_t)((v >> shift) - HIST_SUB);
}

uint64_t hist_lowest(size_t idx)
{
    if (idx < 2 * HIST_SUB) return idx;
    unsigned shift = (unsigned)(idx / HIST_SUB) - 1;
    return (uint64_t)(idx % HIST_SUB + HIST_SUB) << shift;
}

uint64_t hist_highest(size_t idx)
{
    if (idx < 2 * HIST_SUB) return idx;
    unsigned shift = (unsigned)(idx / HIST_SUB) - 1;
    return hist_lowest(idx) + ((uint64_t)1 << shift) - 1;
}

void hist_record(struct hist *h, uint64_t v)
{
    if (v > HIST_MAX_VALUE) v = HIST_MAX_VALUE;
    h->counts[hist_index(v)]++;
    if (h->count == 0 || v < h->min) h->min = v;
    if (v > h->max) h->max = v;
    h->count++;
    h->sum += v;
    h->sumsq += (long double)v * v;
}

void hist_merge(struct hist *dst, const struct hist *src)
{
    if (src->count == 0) return;
    if (dst->count == 0 || src->min < dst->min) dst->min = src->min;
    if (src->max > dst->max) dst->max = src->max;
    dst->count += src->count;
    dst->sum += src->sum;
    dst->sumsq += src->sumsq;
    for (size_t i = hist_index(src->min); i <= hist_index(src->max); i++) dst->counts[i] += src->counts[i];
}

long double hist_mean(const struct hist *h) { return h->count ? h->sum / h->count : 0.0L; }

long double hist_stdev(const struct hist *h, long double mean)
{
    if (h->count < 2) return 0.0L;
    long double var = (h->sumsq - h->count * mean * mean) / (h->count - 1);
    return var > 0 ? sqrtl(var) : 0.0L;
}

long double hist_within_stdev(const struct hist *h, long double mean, long double stdev)
{
    if (h->count == 0) return 0.0L;
    long double lo = mean - stdev, hi = mean + stdev;
    uint64_t in = 0;
    for (size_t i = hist_index(h->min); i <= hist_index(h->max); i++) {
        if (!h->counts[i]) continue;
        /* a bucket stands for its midpoint, kept within the recorded min..max */
        long double mid = (hist_lowest(i) + (long double)hist_highest(i)) / 2;
        if (mid > h->max) mid = h->max;
        if (mid < h->min) mid = h->min;
        if (mid >= lo && mid <= hi) in += h->counts[i];
    }
    return in * 100.0L / h->count;
}

uint64_t hist_percentile(const struct hist *h, long double p)
{
    if (h->count == 0) return 0;
    if (p <= 0) return h->min;
    long double want = ceill(p / 100.0L * h->count);
    uint64_t rank = want < 1 ? 1 : want > h->count ? h->count : (uint64_t)want;
    uint64_t seen = 0;
    for (size_t i = hist_index(h->min); i <= hist_index(h->max); i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t v = hist_highest(i);
            if (v > h->max) v = h->max;
            if (v < h->min) v = h->min;
            return v;
        }
    }
    return h->max;
}
