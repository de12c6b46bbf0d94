/* check.h - a dozen lines of test harness: TEST() cases, CHECK() asserts. */
#ifndef BL_CHECK_H
#define BL_CHECK_H

#include <stdio.h>

extern int check_failures; /* failures in the current case */

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            check_failures++;                                                       \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                           \
    } while (0)

#define CHECK_STR(got, want)                                                              \
    do {                                                                                  \
        const char *g_ = (got), *w_ = (want);                                             \
        if (strcmp(g_, w_)) {                                                             \
            check_failures++;                                                             \
            fprintf(stderr, "  %s:%d: got \"%s\", want \"%s\"\n", __FILE__, __LINE__, g_, w_); \
        }                                                                                 \
    } while (0)

typedef void (*test_fn)(void);
struct test_case {
    const char *name;
    test_fn fn;
};

#endif
