#include <string.h>

#include "check.h"
#include "units.h"

static char b[UNITS_BUF];

void test_format_time(void)
{
    CHECK_STR(units_time_us(b, sizeof b, 244.96L), "244.96us");
    CHECK_STR(units_time_us(b, sizeof b, 1730), "1.73ms");
    CHECK_STR(units_time_us(b, sizeof b, 6620), "6.62ms");
    CHECK_STR(units_time_us(b, sizeof b, 849), "849.00us");
    CHECK_STR(units_time_us(b, sizeof b, 850), "0.85ms"); /* wrk switches at 0.85 of the next unit */
    CHECK_STR(units_time_us(b, sizeof b, 2000000), "2.00s");
    CHECK_STR(units_time_us(b, sizeof b, 30000000), "30.00s");
    CHECK_STR(units_time_us(b, sizeof b, 90000000), "1.50m");
    CHECK_STR(units_time_us(b, sizeof b, 0), "0.00us");
    CHECK_STR(units_time_s(b, sizeof b, 30), "30s");
    CHECK_STR(units_time_s(b, sizeof b, 120), "2m");
    CHECK_STR(units_time_s(b, sizeof b, 7200), "120m"); /* wrk never reaches its last unit */
}

void test_format_binary_metric(void)
{
    CHECK_STR(units_binary(b, sizeof b, 1.28L * 1024 * 1024 * 1024), "1.28G");
    CHECK_STR(units_binary(b, sizeof b, 43.76L * 1024 * 1024), "43.76M");
    CHECK_STR(units_binary(b, sizeof b, 500), "500.00");
    CHECK_STR(units_binary(b, sizeof b, 1000), "0.98K");
    CHECK_STR(units_binary(b, sizeof b, 5.0L * 1024 * 1024 * 1024 * 1024 * 1024), "5120.00T"); /* never P, as wrk */
    CHECK_STR(units_metric(b, sizeof b, 57640), "57.64k");
    CHECK_STR(units_metric(b, sizeof b, 4040), "4.04k");
    CHECK_STR(units_metric(b, sizeof b, 849), "849.00");
    CHECK_STR(units_metric(b, sizeof b, 1500000), "1.50M");
}

void test_parse_time(void)
{
    uint64_t v = 0;
    CHECK(units_parse_time_us("10", &v) == 0 && v == 10000000ULL);
    CHECK(units_parse_time_us("10s", &v) == 0 && v == 10000000ULL);
    CHECK(units_parse_time_us("2m", &v) == 0 && v == 120000000ULL);
    CHECK(units_parse_time_us("1h", &v) == 0 && v == 3600000000ULL);
    CHECK(units_parse_time_us("500ms", &v) == 0 && v == 500000ULL);
    CHECK(units_parse_time_us("250us", &v) == 0 && v == 250ULL);
    CHECK(units_parse_time_us("2S", &v) == 0 && v == 2000000ULL);
    CHECK(units_parse_time_us("", &v) == -1);
    CHECK(units_parse_time_us("s", &v) == -1);
    CHECK(units_parse_time_us("abc", &v) == -1);
    CHECK(units_parse_time_us("10x", &v) == -1);
    CHECK(units_parse_time_us("10s5", &v) == -1);
    CHECK(units_parse_time_us("-1", &v) == -1);
    CHECK(units_parse_time_us(" 1s", &v) == -1);
    CHECK(units_parse_time_us("1.5s", &v) == -1);
    CHECK(units_parse_time_us("99999999999999999999", &v) == -1);
    CHECK(units_parse_time_us("9999999999999h", &v) == -1); /* overflow */
    CHECK(units_parse_time_us(NULL, &v) == -1);
}

void test_parse_metric(void)
{
    uint64_t v = 0;
    CHECK(units_parse_metric("10", &v) == 0 && v == 10);
    CHECK(units_parse_metric("1k", &v) == 0 && v == 1000);
    CHECK(units_parse_metric("2M", &v) == 0 && v == 2000000);
    CHECK(units_parse_metric("1G", &v) == 0 && v == 1000000000ULL);
    CHECK(units_parse_metric("k", &v) == -1);
    CHECK(units_parse_metric("1kk", &v) == -1);
    CHECK(units_parse_metric("ten", &v) == -1);
    CHECK(units_parse_metric("", &v) == -1);
}
