/* Runs every unit test case; the last line is "N passed, M failed". */
#include <stdio.h>
#include <string.h>

#include "check.h"

int check_failures;

#define CASES(X)                            \
    X(test_format_time)                     \
    X(test_format_binary_metric)            \
    X(test_parse_time)                      \
    X(test_parse_metric)                    \
    X(test_hist_index_roundtrip)            \
    X(test_hist_percentiles_exact_range)    \
    X(test_hist_percentiles_large_values)   \
    X(test_hist_empty_and_clamp)            \
    X(test_hist_merge)                      \
    X(test_parser_table_all_splits)         \
    X(test_parser_consumes_exactly_one_response) \
    X(test_parser_header_limit)             \
    X(test_parser_large_body_skipped)      \
    X(test_parser_garbage)                 \
    X(test_parser_head_then_get_pipelined) \
    X(test_mix_target_option)              \
    X(test_mix_targets_file)               \
    X(test_mix_pick_distribution)          \
    X(test_mix_split_largest_remainder)    \
    X(test_report_plain)                   \
    X(test_report_latency_and_errors)      \
    X(test_report_targets)

#define DECLARE(name) void name(void);
CASES(DECLARE)
#define ENTRY(name) { #name, name },
static const struct test_case all[] = { CASES(ENTRY) };

int main(int argc, char **argv)
{
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (argc > 1 && !strstr(all[i].name, argv[1])) continue;
        check_failures = 0;
        all[i].fn();
        if (check_failures) {
            failed++;
            printf("FAIL %s\n", all[i].name);
        } else {
            passed++;
            printf("ok   %s\n", all[i].name);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
