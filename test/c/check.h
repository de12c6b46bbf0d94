/* What the descriptor-handling C tests (test_pass.c, test_out.c) share: a CHECK that counts and
 * reports without stopping, and the number of descriptors this process has open (a test that
 * leaks one fails). Included once per test program. */
#ifndef BB_TEST_CHECK_H
#define BB_TEST_CHECK_H

#include <dirent.h>
#include <stdio.h>

static int failures, checks;

#define CHECK(cond, ...)                                                                                              \
    do {                                                                                                              \
        checks++;                                                                                                     \
        if (!(cond)) {                                                                                                \
            failures++;                                                                                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                      \
            fprintf(stderr, __VA_ARGS__);                                                                             \
            fputc('\n', stderr);                                                                                      \
        }                                                                                                             \
    } while (0)

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own fd */
}

#endif
