/* units.h - wrk-compatible number formatting and option parsing.
 *
 * Formatting writes into a caller-owned buffer and returns it, so callers can
 * use the result inline in printf. Parsing returns 0 on success, -1 on error
 * (empty string, trailing garbage, unknown unit, overflow). */
#ifndef BL_UNITS_H
#define BL_UNITS_H

#include <stddef.h>
#include <stdint.h>

#define UNITS_BUF 32 /* big enough for any formatted value */

/* 1024-based: "12.50K", "1.28G" (no trailing "B": callers add it, as wrk does). */
char *units_binary(char *buf, size_t size, long double n);
/* 1000-based: "57.64k". */
char *units_metric(char *buf, size_t size, long double n);
/* n microseconds: "244.96us", "1.73ms", "2.00s", "1.50m". */
char *units_time_us(char *buf, size_t size, long double n);
/* n seconds, no decimals: "30s", "2m". */
char *units_time_s(char *buf, size_t size, long double n);

/* "10" (seconds), "500ms", "10s", "2m", "1h" -> microseconds. */
int units_parse_time_us(const char *s, uint64_t *out);
/* "100", "1k", "2M", "1G" -> integer. */
int units_parse_metric(const char *s, uint64_t *out);

#endif
