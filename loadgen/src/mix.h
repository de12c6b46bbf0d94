/* mix.h - the request mix: targets ("METHOD PATH" with a weight), their
 * parsing from the command line and from a targets file, the weighted random
 * choice, and the largest-remainder split of connections between targets.
 *
 * Pure: no I/O except mix_load_file reading its file, no global state.
 * Functions that can fail return 0, or -1 with a one-line reason in err. */
#ifndef BL_MIX_H
#define BL_MIX_H

#include <stddef.h>
#include <stdint.h>

#define MAX_TARGETS 64           /* targets per run (a class index fits in a byte) */
#define MAX_TARGET_WEIGHT 1000000 /* weights are integers 1..MAX_TARGET_WEIGHT */
#define MAX_TARGET_LINE 8192     /* bytes of one --target spec or one targets-file line */
#define DEFAULT_SEED 1           /* --seed: runs are reproducible unless told otherwise */

struct mix_target {
    char *method, *path; /* owned; path starts with '/' and may carry a query */
    uint64_t weight;
    int head;            /* method is HEAD: its responses carry no body */
    uint64_t connections; /* --target-per-connection: its share of -c (mix_split); else 0 */
    /* filled by the caller (main.c) once, before the run: */
    char *request;       /* the serialised request */
    size_t request_len;
    char *batch;         /* `pipeline` copies of it back to back */
    size_t batch_len;
};

struct mix {
    struct mix_target targets[MAX_TARGETS];
    size_t n;
    int given;                        /* from --target/--targets (else one implicit target: the URL) */
    uint64_t total_weight;            /* <= MAX_TARGETS * MAX_TARGET_WEIGHT < 2^32 */
    uint64_t cumulative[MAX_TARGETS]; /* cumulative[i] = sum of weights 0..i */
};

/* --target SPEC WEIGHT: SPEC is "METHOD PATH". */
int mix_add(struct mix *m, const char *spec, const char *weight, char *err, size_t errlen);
/* --targets FILE: one "METHOD PATH WEIGHT" per line; '#' starts a comment,
 * blank lines are skipped. Errors name FILE:LINE. */
int mix_load_file(struct mix *m, const char *path, char *err, size_t errlen);
/* A target that is not validated as a token (the URL's path with -m's method). */
int mix_add_raw(struct mix *m, const char *method, const char *path, char *err, size_t errlen);
void mix_free(struct mix *m);

/* Largest-remainder split of `connections` by weight into targets[i].connections
 * (ties go to the earlier target); -1 when a target would get none. */
int mix_split(struct mix *m, uint64_t connections, char *err, size_t errlen);
/* The target of connection number g (0-based, in the order targets were
 * given: the first targets[0].connections numbers are target 0's, ...). */
size_t mix_connection_target(const struct mix *m, uint64_t g);

/* Per-thread PRNG (xorshift64*): seeded from --seed and the thread number. */
uint64_t mix_rng_seed(uint64_t seed, uint64_t stream);

static inline uint64_t mix_rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* A target index drawn with probability weight / total_weight. */
static inline size_t mix_pick(const struct mix *m, uint64_t *rng)
{
    /* top 32 random bits scaled to [0, total_weight): total_weight < 2^32, so no overflow */
    uint64_t x = ((mix_rng_next(rng) >> 32) * m->total_weight) >> 32;
    size_t lo = 0, hi = m->n - 1; /* first i with cumulative[i] > x */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->cumulative[mid] > x) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

#endif
