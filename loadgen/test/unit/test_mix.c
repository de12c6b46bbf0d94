/* The request mix: --target and --targets parsing with every error, the
 * weighted choice over a fixed seed, and the largest-remainder split of
 * connections (expected counts worked out by hand). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "mix.h"

static char err[1024];

/* The error is one line and contains `want`. */
#define CHECK_ERR(call, want)                                                                      \
    do {                                                                                           \
        err[0] = '\0';                                                                             \
        CHECK((call) == -1);                                                                       \
        CHECK(strchr(err, '\n') == NULL);                                                          \
        if (!strstr(err, (want))) {                                                                \
            check_failures++;                                                                      \
            fprintf(stderr, "  %s:%d: error \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, err, (want)); \
        }                                                                                          \
    } while (0)

static void reset(struct mix *m)
{
    mix_free(m);
    memset(m, 0, sizeof *m);
}

void test_mix_target_option(void)
{
    struct mix m;
    memset(&m, 0, sizeof m);
    CHECK(mix_add(&m, "GET /fast", "95", err, sizeof err) == 0);
    CHECK(mix_add(&m, "  POST\t/api/items?x=1&y=%20  ", "1000000", err, sizeof err) == 0);
    CHECK(mix_add(&m, "HEAD /fast", "1", err, sizeof err) == 0); /* same path, another method */
    CHECK(m.n == 3 && m.given);
    CHECK_STR(m.targets[0].method, "GET");
    CHECK_STR(m.targets[0].path, "/fast");
    CHECK(m.targets[0].weight == 95 && !m.targets[0].head);
    CHECK_STR(m.targets[1].method, "POST");
    CHECK_STR(m.targets[1].path, "/api/items?x=1&y=%20");
    CHECK(m.targets[1].weight == 1000000);
    CHECK(m.targets[2].head);
    CHECK(m.total_weight == 1000096);
    CHECK(m.cumulative[0] == 95 && m.cumulative[1] == 1000095 && m.cumulative[2] == 1000096);

    CHECK_ERR(mix_add(&m, "GET", "1", err, sizeof err), "invalid target 'GET' (expected 'METHOD PATH'");
    CHECK_ERR(mix_add(&m, "", "1", err, sizeof err), "invalid target ''");
    CHECK_ERR(mix_add(&m, "GET /a /b", "1", err, sizeof err), "invalid target 'GET /a /b'");
    CHECK_ERR(mix_add(&m, "GET\n/a", "1", err, sizeof err), "contains a line break");
    CHECK_ERR(mix_add(&m, "G(T /a", "1", err, sizeof err), "invalid method 'G(T' in target 'G(T /a'");
    CHECK_ERR(mix_add(&m, "GET a", "1", err, sizeof err), "invalid path 'a' in target 'GET a'");
    CHECK_ERR(mix_add(&m, "GET /a#frag", "1", err, sizeof err), "invalid path '/a#frag'");
    CHECK_ERR(mix_add(&m, "GET /caf\xc3\xa9", "1", err, sizeof err), "invalid path '/caf");
    CHECK_ERR(mix_add(&m, "GET /a", "0", err, sizeof err), "invalid weight '0' for target 'GET /a' (expected an integer from 1 to 1000000)");
    CHECK_ERR(mix_add(&m, "GET /a", "1000001", err, sizeof err), "invalid weight '1000001'");
    CHECK_ERR(mix_add(&m, "GET /a", "12345678", err, sizeof err), "invalid weight '12345678'");
    CHECK_ERR(mix_add(&m, "GET /a", "abc", err, sizeof err), "invalid weight 'abc'");
    CHECK_ERR(mix_add(&m, "GET /a", "", err, sizeof err), "invalid weight ''");
    CHECK_ERR(mix_add(&m, "GET /a", "-1", err, sizeof err), "invalid weight '-1'");
    CHECK_ERR(mix_add(&m, "GET /a", "1k", err, sizeof err), "invalid weight '1k'");
    CHECK_ERR(mix_add(&m, "GET /a", "2.5", err, sizeof err), "invalid weight '2.5'");
    CHECK_ERR(mix_add(&m, "GET /fast", "3", err, sizeof err), "target 'GET /fast' is given twice");

    static char long_spec[MAX_TARGET_LINE + 16];
    memset(long_spec, 'a', sizeof long_spec - 1);
    memcpy(long_spec, "GET /", 5);
    CHECK_ERR(mix_add(&m, long_spec, "1", err, sizeof err), "bytes long (at most 8192)");
    CHECK(m.n == 3); /* nothing was added by the failures */

    reset(&m);
    char spec[32];
    for (int i = 0; i < MAX_TARGETS; i++) {
        snprintf(spec, sizeof spec, "GET /%d", i);
        CHECK(mix_add(&m, spec, "1", err, sizeof err) == 0);
    }
    CHECK_ERR(mix_add(&m, "GET /one-more", "1", err, sizeof err), "too many targets: 'GET /one-more' would be number 65 (at most 64)");
    reset(&m);
}

static const char *write_file(const char *text)
{
    static char path[64];
    strcpy(path, "/tmp/bl-mix-XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return "/nonexistent";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void check_file_error(const char *text, const char *want_after_path)
{
    struct mix m;
    char want[256];
    memset(&m, 0, sizeof m);
    const char *path = write_file(text);
    snprintf(want, sizeof want, "%s%s", path, want_after_path);
    CHECK_ERR(mix_load_file(&m, path, err, sizeof err), want);
    unlink(path);
    mix_free(&m);
}

void test_mix_targets_file(void)
{
    struct mix m;
    memset(&m, 0, sizeof m);
    const char *path = write_file("# the harness's mix\n"
                                  "\n"
                                  "GET /fast 95\n"
                                  "   \t\n"
                                  "  POST  /slow?x=1\t5   # a trailing comment\r\n"
                                  "HEAD / 1"); /* no final newline */
    CHECK(mix_load_file(&m, path, err, sizeof err) == 0);
    unlink(path);
    CHECK(m.n == 3 && m.given);
    CHECK_STR(m.targets[0].method, "GET");
    CHECK_STR(m.targets[0].path, "/fast");
    CHECK(m.targets[0].weight == 95);
    CHECK_STR(m.targets[1].method, "POST");
    CHECK_STR(m.targets[1].path, "/slow?x=1");
    CHECK(m.targets[1].weight == 5);
    CHECK_STR(m.targets[2].path, "/");
    CHECK(m.targets[2].head && m.total_weight == 101);
    /* --target and --targets add to one list, in command-line order */
    CHECK(mix_add(&m, "GET /more", "2", err, sizeof err) == 0 && m.n == 4);
    mix_free(&m);

    check_file_error("GET /a 1\nGET /b\n", ":2: expected METHOD PATH WEIGHT, got 'GET /b'");
    check_file_error("GET /a 1 extra\n", ":1: expected METHOD PATH WEIGHT, got 'GET /a 1 extra'");
    check_file_error("GET /a 1\n\n# x\nGET /b 0\n", ":4: invalid weight '0' for target 'GET /b'");
    check_file_error("GET b 1\n", ":1: invalid path 'b'");
    check_file_error("G@T /b 1\n", ":1: invalid method 'G@T'");
    check_file_error("GET /a 1\nGET /a 2\n", ":2: target 'GET /a' is given twice");
    check_file_error("# nothing but comments\n\n", ": no targets (expected lines of METHOD PATH WEIGHT)");
    check_file_error("", ": no targets");

    static char big[MAX_TARGET_LINE + 64];
    memset(big, ' ', sizeof big - 1);
    memcpy(big, "GET /a 1\nGET /", 14);
    check_file_error(big, ":2: line longer than 8192 bytes");

    static char many[MAX_TARGETS * 16 + 32];
    size_t len = 0;
    for (int i = 0; i <= MAX_TARGETS; i++) len += (size_t)sprintf(many + len, "GET /%d 1\n", i);
    check_file_error(many, ":65: too many targets");

    memset(&m, 0, sizeof m);
    CHECK_ERR(mix_load_file(&m, "/nonexistent/targets.txt", err, sizeof err),
              "cannot read targets file /nonexistent/targets.txt: No such file or directory");
    CHECK_ERR(mix_load_file(&m, "/tmp", err, sizeof err), "cannot read targets file /tmp: Is a directory");
}

/* 100k draws land within one percentage point of each weight's share. */
static void check_distribution(const uint64_t *weights, size_t n, uint64_t seed)
{
    struct mix m;
    memset(&m, 0, sizeof m);
    char spec[32], w[16];
    for (size_t i = 0; i < n; i++) {
        snprintf(spec, sizeof spec, "GET /%zu", i);
        snprintf(w, sizeof w, "%llu", (unsigned long long)weights[i]);
        CHECK(mix_add(&m, spec, w, err, sizeof err) == 0);
    }
    uint64_t count[MAX_TARGETS] = { 0 };
    uint64_t rng = mix_rng_seed(seed, 0);
    const int draws = 100000;
    for (int i = 0; i < draws; i++) {
        size_t k = mix_pick(&m, &rng);
        CHECK(k < n);
        if (k < n) count[k]++;
    }
    for (size_t i = 0; i < n; i++) {
        double got = (double)count[i] / draws, want = (double)weights[i] / (double)m.total_weight;
        if (got < want - 0.01 || got > want + 0.01) {
            check_failures++;
            fprintf(stderr, "  target %zu: share %.4f, weight says %.4f\n", i, got, want);
        }
    }
    mix_free(&m);
}

void test_mix_pick_distribution(void)
{
    static const uint64_t w1[] = { 95, 5 };
    static const uint64_t w2[] = { 1, 2, 3, 4 };
    static const uint64_t w3[] = { 1000000, 1000000, 1 };
    static const uint64_t w4[] = { 7 };
    check_distribution(w1, 2, DEFAULT_SEED);
    check_distribution(w1, 2, 0);
    check_distribution(w2, 4, 12345);
    check_distribution(w3, 3, DEFAULT_SEED);
    check_distribution(w4, 1, DEFAULT_SEED);
    uint64_t w64[MAX_TARGETS];
    for (int i = 0; i < MAX_TARGETS; i++) w64[i] = MAX_TARGET_WEIGHT; /* the largest total: no overflow */
    check_distribution(w64, MAX_TARGETS, 99);

    /* reproducible: a seed and a thread number give one sequence; another
     * seed or thread number gives another */
    uint64_t a = mix_rng_seed(42, 0), b = mix_rng_seed(42, 0), c = mix_rng_seed(42, 1), d = mix_rng_seed(43, 0);
    int same_ab = 1, same_ac = 1, same_ad = 1;
    for (int i = 0; i < 100; i++) {
        uint64_t va = mix_rng_next(&a);
        same_ab &= va == mix_rng_next(&b);
        same_ac &= va == mix_rng_next(&c);
        same_ad &= va == mix_rng_next(&d);
    }
    CHECK(same_ab && !same_ac && !same_ad);
    CHECK(mix_rng_seed(0, 0) != 0);
}

/* Split `connections` over weights; compare with the expected counts. */
static void check_split(const uint64_t *weights, size_t n, uint64_t connections, const uint64_t *want)
{
    struct mix m;
    memset(&m, 0, sizeof m);
    char spec[32], w[16];
    for (size_t i = 0; i < n; i++) {
        snprintf(spec, sizeof spec, "GET /%zu", i);
        snprintf(w, sizeof w, "%llu", (unsigned long long)weights[i]);
        CHECK(mix_add(&m, spec, w, err, sizeof err) == 0);
    }
    CHECK(mix_split(&m, connections, err, sizeof err) == 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += m.targets[i].connections;
        if (m.targets[i].connections != want[i]) {
            check_failures++;
            fprintf(stderr, "  %llu connections, target %zu: got %llu, want %llu\n", (unsigned long long)connections, i,
                    (unsigned long long)m.targets[i].connections, (unsigned long long)want[i]);
        }
    }
    CHECK(sum == connections);
    /* connection numbers map to targets in blocks, in order */
    uint64_t g = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t k = 0; k < want[i]; k++, g++) CHECK(mix_connection_target(&m, g) == i);
    mix_free(&m);
}

void test_mix_split_largest_remainder(void)
{
    static const uint64_t w16_2[] = { 16, 2 }, w95_5[] = { 95, 5 }, w1_1_1[] = { 1, 1, 1 }, w1_1[] = { 1, 1 };
    static const uint64_t w2_1[] = { 2, 1 }, w5_3_2[] = { 5, 3, 2 }, w1_2_3[] = { 1, 2, 3 };
    check_split(w16_2, 2, 18, (const uint64_t[]){ 16, 2 });     /* exact */
    check_split(w16_2, 2, 36, (const uint64_t[]){ 32, 4 });     /* scaled */
    check_split(w95_5, 2, 20, (const uint64_t[]){ 19, 1 });
    check_split(w95_5, 2, 18, (const uint64_t[]){ 17, 1 });     /* 17.1 and 0.9: the remainder lifts the second */
    check_split(w1_1_1, 3, 3, (const uint64_t[]){ 1, 1, 1 });
    check_split(w1_1, 2, 3, (const uint64_t[]){ 2, 1 });        /* a tie goes to the earlier target */
    check_split(w2_1, 2, 4, (const uint64_t[]){ 3, 1 });        /* 2.67 and 1.33 */
    check_split(w5_3_2, 3, 4, (const uint64_t[]){ 2, 1, 1 });   /* weights sum above connections: 2, 1.2, 0.8 */
    check_split(w1_2_3, 3, 7, (const uint64_t[]){ 1, 2, 4 });   /* 1.17, 2.33, 3.5 */
    check_split(w1_2_3, 3, 1000001, (const uint64_t[]){ 166667, 333334, 500000 });

    /* a target that would get no connection is an error naming it */
    struct mix m;
    memset(&m, 0, sizeof m);
    CHECK(mix_add(&m, "GET /fast", "16", err, sizeof err) == 0);
    CHECK(mix_add(&m, "GET /slow", "2", err, sizeof err) == 0);
    CHECK_ERR(mix_split(&m, 4, err, sizeof err), "target 'GET /slow' (weight 2 of 18) gets 0 of 4 connections");
    reset(&m);
    CHECK(mix_add(&m, "GET /a", "1", err, sizeof err) == 0);
    CHECK(mix_add(&m, "GET /b", "1", err, sizeof err) == 0);
    CHECK(mix_add(&m, "GET /c", "1", err, sizeof err) == 0);
    CHECK_ERR(mix_split(&m, 2, err, sizeof err), "target 'GET /c' (weight 1 of 3) gets 0 of 2 connections");
    reset(&m);
    CHECK(mix_add(&m, "GET /a", "1000000", err, sizeof err) == 0);
    CHECK(mix_add(&m, "GET /b", "1", err, sizeof err) == 0);
    CHECK_ERR(mix_split(&m, 1000, err, sizeof err), "target 'GET /b' (weight 1 of 1000001) gets 0 of 1000 connections");
    reset(&m);
}
