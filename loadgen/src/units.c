/* units.c - see units.h. The formatting rules reproduce wrk's text report:
 * divide while the value is at least 0.85 of the next scale, never reaching
 * the last unit of a table (wrk's loop stops one short of it). */
#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct unit_table {
    int scale;
    const char *base;
    const char *units[6];
};

static const struct unit_table time_us_table = { 1000, "us", { "ms", "s", NULL } };
static const struct unit_table time_s_table = { 60, "s", { "m", "h", NULL } };
static const struct unit_table binary_table = { 1024, "", { "K", "M", "G", "T", "P", NULL } };
static const struct unit_table metric_table = { 1000, "", { "k", "M", "G", "T", "P", NULL } };

static char *format(char *buf, size_t size, long double n, const struct unit_table *t, int prec)
{
    long double threshold = t->scale * 0.85L;
    const char *unit = t->base;
    for (int i = 0; t->units[i + 1] && n >= threshold; i++) {
        n /= t->scale;
        unit = t->units[i];
    }
    snprintf(buf, size, "%.*Lf%s", prec, n, unit);
    return buf;
}

char *units_binary(char *buf, size_t size, long double n) { return format(buf, size, n, &binary_table, 2); }
char *units_metric(char *buf, size_t size, long double n) { return format(buf, size, n, &metric_table, 2); }
char *units_time_s(char *buf, size_t size, long double n) { return format(buf, size, n, &time_s_table, 0); }

char *units_time_us(char *buf, size_t size, long double n)
{
    if (n >= 1000000.0L) return format(buf, size, n / 1000000.0L, &time_s_table, 2);
    return format(buf, size, n, &time_us_table, 2);
}

/* Leading unsigned decimal integer; sets *end past it. -1 if none or overflow. */
static int scan_u64(const char *s, uint64_t *out, const char **end)
{
    uint64_t v = 0;
    const char *p = s;
    if (!isdigit((unsigned char)*p)) return -1;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    *end = p;
    return 0;
}

static int mul_checked(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b != 0 && a > UINT64_MAX / b) return -1;
    *out = a * b;
    return 0;
}

int units_parse_time_us(const char *s, uint64_t *out)
{
    static const struct { const char *name; uint64_t us; } table[] = {
        { "", 1000000ULL }, { "us", 1ULL }, { "ms", 1000ULL }, { "s", 1000000ULL },
        { "m", 60000000ULL }, { "h", 3600000000ULL },
    };
    uint64_t v;
    const char *unit;
    if (!s || scan_u64(s, &v, &unit)) return -1;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (!strcasecmp(unit, table[i].name)) return mul_checked(v, table[i].us, out);
    return -1;
}

int units_parse_metric(const char *s, uint64_t *out)
{
    static const struct { const char *name; uint64_t mult; } table[] = {
        { "", 1ULL }, { "k", 1000ULL }, { "m", 1000000ULL }, { "g", 1000000000ULL },
    };
    uint64_t v;
    const char *unit;
    if (!s || scan_u64(s, &v, &unit)) return -1;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (!strcasecmp(unit, table[i].name)) return mul_checked(v, table[i].mult, out);
    return -1;
}
