/* mix.c - see mix.h. */
#include "mix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n' || ch == '\v' || ch == '\f'; }

/* RFC 9110 tchar: what a method may be made of. */
static int is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Split s into at most `max` whitespace-separated tokens; a token that starts
 * with '#' ends the line when `comments` is set. Returns the number of
 * tokens found, max + 1 when there are more. */
static size_t tokens(const char *s, int comments, const char **tok, size_t *len, size_t max)
{
    size_t n = 0;
    for (;;) {
        while (is_space(*s)) s++;
        if (!*s || (comments && *s == '#')) return n;
        if (n == max) return max + 1;
        tok[n] = s;
        while (*s && !is_space(*s)) s++;
        len[n] = (size_t)(s - tok[n]);
        n++;
    }
}

static int parse_weight(const char *s, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    if (len == 0 || len > 7) return -1; /* MAX_TARGET_WEIGHT has 7 digits */
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v < 1 || v > MAX_TARGET_WEIGHT) return -1;
    *out = v;
    return 0;
}

static int push(struct mix *m, const char *method, size_t mlen, const char *path, size_t plen, uint64_t weight,
                char *err, size_t errlen)
{
    for (size_t i = 0; i < m->n; i++) {
        const struct mix_target *t = &m->targets[i];
        if (strlen(t->method) == mlen && !memcmp(t->method, method, mlen) && strlen(t->path) == plen &&
            !memcmp(t->path, path, plen)) {
            snprintf(err, errlen, "target '%.*s %.*s' is given twice", (int)mlen, method, (int)plen, path);
            return -1;
        }
    }
    if (m->n == MAX_TARGETS) {
        snprintf(err, errlen, "too many targets: '%.*s %.*s' would be number %d (at most %d)", (int)mlen, method,
                 (int)plen, path, MAX_TARGETS + 1, MAX_TARGETS);
        return -1;
    }
    struct mix_target *t = &m->targets[m->n];
    memset(t, 0, sizeof *t);
    t->method = malloc(mlen + 1);
    t->path = malloc(plen + 1);
    if (!t->method || !t->path) {
        free(t->method);
        free(t->path);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(t->method, method, mlen);
    t->method[mlen] = '\0';
    memcpy(t->path, path, plen);
    t->path[plen] = '\0';
    t->weight = weight;
    t->head = !strcasecmp(t->method, "HEAD");
    m->total_weight += weight;
    m->cumulative[m->n] = m->total_weight;
    m->n++;
    return 0;
}

/* Validate one target's three parts; the messages quote "METHOD PATH". */
static int add(struct mix *m, const char *method, size_t mlen, const char *path, size_t plen, const char *weight,
               size_t wlen, char *err, size_t errlen)
{
    for (size_t i = 0; i < mlen; i++)
        if (!is_tchar((unsigned char)method[i])) {
            snprintf(err, errlen, "invalid method '%.*s' in target '%.*s %.*s' (expected a token such as GET or POST)",
                     (int)mlen, method, (int)mlen, method, (int)plen, path);
            return -1;
        }
    int bad_path = plen == 0 || path[0] != '/';
    for (size_t i = 0; i < plen && !bad_path; i++)
        bad_path = (unsigned char)path[i] <= 0x20 || (unsigned char)path[i] >= 0x7f || path[i] == '#';
    if (bad_path) {
        snprintf(err, errlen, "invalid path '%.*s' in target '%.*s %.*s' (expected /path or /path?query: visible ASCII, no '#')",
                 (int)plen, path, (int)mlen, method, (int)plen, path);
        return -1;
    }
    uint64_t w;
    if (parse_weight(weight, wlen, &w)) {
        snprintf(err, errlen, "invalid weight '%.*s' for target '%.*s %.*s' (expected an integer from 1 to %d)", (int)wlen,
                 weight, (int)mlen, method, (int)plen, path, MAX_TARGET_WEIGHT);
        return -1;
    }
    return push(m, method, mlen, path, plen, w, err, errlen);
}

int mix_add(struct mix *m, const char *spec, const char *weight, char *err, size_t errlen)
{
    const char *tok[2];
    size_t len[2];
    size_t slen = strlen(spec);
    if (slen > MAX_TARGET_LINE) {
        snprintf(err, errlen, "invalid target: %zu bytes long (at most %d)", slen, MAX_TARGET_LINE);
        return -1;
    }
    if (strpbrk(spec, "\r\n\v\f")) {
        snprintf(err, errlen, "invalid target: contains a line break");
        return -1;
    }
    if (tokens(spec, 0, tok, len, 2) != 2) {
        snprintf(err, errlen, "invalid target '%s' (expected 'METHOD PATH' and a weight, e.g. --target 'GET /fast' 95)", spec);
        return -1;
    }
    if (add(m, tok[0], len[0], tok[1], len[1], weight, strlen(weight), err, errlen)) return -1;
    m->given = 1;
    return 0;
}

int mix_load_file(struct mix *m, const char *path, char *err, size_t errlen)
{
    char line[MAX_TARGET_LINE + 2]; /* the line, its newline, the NUL */
    char why[512];
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot read targets file %s: %s", path, strerror(errno));
        return -1;
    }
    size_t before = m->n;
    unsigned long lineno = 0;
    int rc = -1;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t n = strlen(line);
        if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
        else if (!feof(f)) {
            snprintf(err, errlen, "%s:%lu: line longer than %d bytes", path, lineno, MAX_TARGET_LINE);
            goto out;
        }
        const char *tok[3];
        size_t len[3];
        size_t k = tokens(line, 1, tok, len, 3);
        if (k == 0) continue; /* blank or comment */
        if (k != 3) {
            const char *s = line;
            while (is_space(*s)) s++;
            while (n > 0 && is_space(line[n - 1])) line[--n] = '\0';
            snprintf(err, errlen, "%s:%lu: expected METHOD PATH WEIGHT, got '%s'", path, lineno, s);
            goto out;
        }
        if (add(m, tok[0], len[0], tok[1], len[1], tok[2], len[2], why, sizeof why)) {
            snprintf(err, errlen, "%s:%lu: %s", path, lineno, why);
            goto out;
        }
    }
    if (ferror(f)) {
        snprintf(err, errlen, "cannot read targets file %s: %s", path, strerror(errno));
        goto out;
    }
    if (m->n == before) {
        snprintf(err, errlen, "%s: no targets (expected lines of METHOD PATH WEIGHT)", path);
        goto out;
    }
    m->given = 1;
    rc = 0;
out:
    fclose(f);
    return rc;
}

int mix_add_raw(struct mix *m, const char *method, const char *path, char *err, size_t errlen)
{
    return push(m, method, strlen(method), path, strlen(path), 1, err, errlen);
}

void mix_free(struct mix *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->targets[i].method);
        free(m->targets[i].path);
        free(m->targets[i].request);
        free(m->targets[i].batch);
    }
    m->n = 0;
}

int mix_split(struct mix *m, uint64_t connections, char *err, size_t errlen)
{
    uint64_t rem[MAX_TARGETS], assigned = 0;
    int taken[MAX_TARGETS];
    if (m->n == 0 || connections > UINT64_MAX / MAX_TARGET_WEIGHT) {
        snprintf(err, errlen, "cannot split %llu connections between %zu targets", (unsigned long long)connections, m->n);
        return -1;
    }
    for (size_t i = 0; i < m->n; i++) {
        uint64_t q = connections * m->targets[i].weight; /* exact quota is q / total_weight */
        m->targets[i].connections = q / m->total_weight;
        rem[i] = q % m->total_weight;
        taken[i] = 0;
        assigned += m->targets[i].connections;
    }
    /* the connections the floors left over go to the largest remainders; there
     * are fewer of them than targets with a non-zero remainder */
    for (uint64_t left = connections - assigned; left > 0; left--) {
        size_t best = m->n;
        for (size_t i = 0; i < m->n; i++)
            if (!taken[i] && rem[i] > 0 && (best == m->n || rem[i] > rem[best])) best = i;
        if (best == m->n) break; /* cannot happen: the remainders sum to left * total_weight */
        taken[best] = 1;
        m->targets[best].connections++;
    }
    for (size_t i = 0; i < m->n; i++) {
        const struct mix_target *t = &m->targets[i];
        if (t->connections == 0) {
            snprintf(err, errlen,
                     "--target-per-connection: target '%s %s' (weight %llu of %llu) gets 0 of %llu connections "
                     "(each target needs one: raise -c or its weight)",
                     t->method, t->path, (unsigned long long)t->weight, (unsigned long long)m->total_weight,
                     (unsigned long long)connections);
            return -1;
        }
    }
    return 0;
}

size_t mix_connection_target(const struct mix *m, uint64_t g)
{
    for (size_t i = 0; i < m->n; i++) {
        if (g < m->targets[i].connections) return i;
        g -= m->targets[i].connections;
    }
    return m->n - 1; /* g beyond the split: only if the caller miscounted */
}

/* splitmix64: spreads any seed (0 included) over the state space. */
static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

uint64_t mix_rng_seed(uint64_t seed, uint64_t stream)
{
    uint64_t s = splitmix64(splitmix64(seed) + stream);
    return s ? s : 0x9E3779B97F4A7C15ULL; /* xorshift's state must not be zero */
}
