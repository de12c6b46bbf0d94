#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hist.h"

void test_hist_index_roundtrip(void)
{
    /* every value lies inside the bucket it maps to, within 1/HIST_SUB */
    uint64_t v = 0;
    for (int i = 0; i < 200000; i++) {
        size_t idx = hist_index(v);
        CHECK(idx < HIST_BUCKETS);
        CHECK(hist_lowest(idx) <= v && v <= hist_highest(idx));
        CHECK((hist_highest(idx) - hist_lowest(idx)) * (uint64_t)HIST_SUB <= v + HIST_SUB);
        if (check_failures) return;
        v = v < 5000 ? v + 1 : v + v / 997 + 1;
        if (v > HIST_MAX_VALUE) break;
    }
    CHECK(hist_index(HIST_MAX_VALUE) == HIST_BUCKETS - 1);
    CHECK(hist_index(UINT64_MAX) == HIST_BUCKETS - 1);
    /* indexes are monotonic and contiguous */
    for (size_t i = 1; i < HIST_BUCKETS; i++) CHECK(hist_lowest(i) == hist_highest(i - 1) + 1);
}

void test_hist_percentiles_exact_range(void)
{
    struct hist *h = hist_new();
    for (uint64_t v = 1; v <= 100; v++) hist_record(h, v);
    CHECK(h->count == 100 && h->min == 1 && h->max == 100);
    CHECK(hist_percentile(h, 50) == 50);
    CHECK(hist_percentile(h, 75) == 75);
    CHECK(hist_percentile(h, 90) == 90);
    CHECK(hist_percentile(h, 99) == 99);
    CHECK(hist_percentile(h, 99.9L) == 100);
    CHECK(hist_percentile(h, 100) == 100);
    CHECK(hist_percentile(h, 0) == 1);
    CHECK(fabsl(hist_mean(h) - 50.5L) < 1e-9L);
    /* sample stdev of 1..100 = 29.0115 */
    CHECK(fabsl(hist_stdev(h, hist_mean(h)) - 29.011491975882L) < 1e-6L);
    CHECK(fabsl(hist_within_stdev(h, hist_mean(h), hist_stdev(h, hist_mean(h))) - 58.0L) < 1e-9L);
    hist_free(h);
}

void test_hist_percentiles_large_values(void)
{
    struct hist *h = hist_new();
    /* 10k samples: 9900 at ~1ms, 90 at ~50ms, 10 at ~2s */
    for (int i = 0; i < 9900; i++) hist_record(h, 1000 + (uint64_t)(i % 7));
    for (int i = 0; i < 90; i++) hist_record(h, 50000 + (uint64_t)i);
    for (int i = 0; i < 10; i++) hist_record(h, 2000000 + (uint64_t)i * 1000);
    uint64_t p50 = hist_percentile(h, 50), p99 = hist_percentile(h, 99), p999 = hist_percentile(h, 99.9L);
    CHECK(p50 >= 1000 && p50 <= 1006);
    CHECK(p99 >= 1000 && p99 <= 1006);
    CHECK(p999 >= 50000 && p999 <= 50089 + 50089 / HIST_SUB);
    CHECK(hist_percentile(h, 99.95L) >= 2000000);
    CHECK(hist_percentile(h, 100) == 2009000);
    CHECK(h->max == 2009000);
    hist_free(h);
}

void test_hist_empty_and_clamp(void)
{
    struct hist *h = hist_new();
    CHECK(hist_percentile(h, 50) == 0);
    CHECK(hist_mean(h) == 0 && hist_stdev(h, 0) == 0 && hist_within_stdev(h, 0, 0) == 0);
    hist_record(h, UINT64_MAX);
    CHECK(h->max == HIST_MAX_VALUE);
    CHECK(hist_percentile(h, 50) == HIST_MAX_VALUE);
    hist_free(h);
}

void test_hist_merge(void)
{
    struct hist *a = hist_new(), *b = hist_new(), *all = hist_new(), *m = hist_new();
    srand(42);
    for (int i = 0; i < 50000; i++) {
        uint64_t v = (uint64_t)(rand() % 100000);
        hist_record(i % 3 ? a : b, v);
        hist_record(all, v);
    }
    hist_merge(m, a);
    hist_merge(m, b);
    CHECK(m->count == all->count && m->min == all->min && m->max == all->max);
    CHECK(memcmp(m->counts, all->counts, sizeof m->counts) == 0);
    static const long double ps[] = { 50, 75, 90, 99, 99.9L, 99.99L };
    for (size_t i = 0; i < 6; i++) CHECK(hist_percentile(m, ps[i]) == hist_percentile(all, ps[i]));
    /* bucket precision: p50 of uniform 0..99999 is ~50000 */
    uint64_t p50 = hist_percentile(m, 50);
    CHECK(p50 > 49000 && p50 < 51000);
    hist_free(a);
    hist_free(b);
    hist_free(all);
    hist_free(m);
}
