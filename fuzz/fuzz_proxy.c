/*
 * fuzz_proxy.c - libFuzzer target for bb_parse_proxy (ext/blackbuck/bb_proxy.c).
 *
 * Parses the input one shot and checks, calling abort() on any failure:
 *   - the return value is -1, -2, or 1..min(len, the version's limit); *out is untouched unless it
 *     is > 0;
 *   - fed byte at a time (each prefix, until one is not -2), and cut at a split chosen from the
 *     input, the answer is -2 until it is the one-shot answer (a prefix never says -1 for input
 *     that is valid, nor a length for input that is not);
 *   - a v1 header ends in its first CRLF, within 107 bytes; a v2 header is 16 + its length field
 *     bytes and the addresses and ports are the bytes at their places;
 *   - v1 TCP4/TCP6 lines of six single-SP-separated fields are accepted exactly when libc's
 *     inet_pton accepts both addresses and both ports are 0-65535 without leading zeros, with the
 *     same address bytes (an independent reading of the addresses).
 */
#define _DEFAULT_SOURCE
#include "bb_proxy.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_proxy: %s\n", what);
    abort();
}

static const unsigned char pattern_byte = 0xA5;

/* Parses a copy of data[0..len) in a buffer of exactly len bytes (ASan catches over-reads). */
static int parse(const uint8_t *data, size_t len, struct bb_proxy *out)
{
    struct bb_proxy pattern;
    char *copy = malloc(len ? len : 1);
    int r;
    memcpy(copy, data, len);
    memset(&pattern, pattern_byte, sizeof(pattern));
    *out = pattern;
    r = bb_parse_proxy(copy, len, out);
    free(copy);
    if (r != -1 && r != -2 && (r <= 0 || (size_t)r > len)) fail("return value out of range");
    if (r <= 0 && memcmp(out, &pattern, sizeof(pattern)) != 0) fail("out written on -1/-2");
    return r;
}

static void same(int r, const struct bb_proxy *a, int want, const struct bb_proxy *b, const char *what)
{
    if (r != want || (r > 0 && memcmp(a, b, sizeof(*a)) != 0)) fail(what);
}

/* A prefix of the input answers -2 or the whole input's answer. */
static void check_prefix(const uint8_t *data, size_t k, int want, const struct bb_proxy *one)
{
    struct bb_proxy out;
    int r = parse(data, k, &out);
    if (r == -2) return;
    if (want == -1 && r == -1) return;
    if (want > 0 && (size_t)want <= k) {
        same(r, &out, want, one, "prefix holding the header answered differently");
        return;
    }
    fail("a prefix answered what the whole input does not");
}

static uint16_t be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static int port_ok(const char *s, size_t n, uint16_t *v)
{
    unsigned x = 0;
    if (n == 0 || n > 5 || (n > 1 && s[0] == '0')) return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        x = x * 10 + (unsigned)(s[i] - '0');
    }
    *v = (uint16_t)x;
    return x <= 65535;
}

/* The oracle for v1 TCP4/TCP6 lines: split on single spaces and ask inet_pton. */
static void check_v1_oracle(const uint8_t *data, size_t size, int r, const struct bb_proxy *px)
{
    char line[BB_PROXY_V1_MAX_BYTES + 1];
    const char *f[6];
    size_t fl[6], n = 0, i, start = 0, nf = 0;
    int fam;
    uint8_t a[16], b[16];
    uint16_t sp, dp;

    if (size < 11 || (memcmp(data, "PROXY TCP4 ", 11) != 0 && memcmp(data, "PROXY TCP6 ", 11) != 0)) return;
    while (n < size && n < BB_PROXY_V1_MAX_BYTES && data[n] != '\r' && data[n] != '\n') n++;
    if (n + 2 > BB_PROXY_V1_MAX_BYTES || n + 1 >= size || data[n] != '\r' || data[n + 1] != '\n') return;
    memcpy(line, data, n);
    line[n] = '\0';
    for (i = 0; i <= n; i++) {
        if (i == n || line[i] == ' ') {
            if (nf == 6) { /* a seventh field */
                if (r > 0) fail("v1 accepted a line of more than six fields");
                return;
            }
            f[nf] = line + start;
            fl[nf++] = i - start;
            line[i] = '\0';
            start = i + 1;
        } else if (line[i] == '\0') {
            if (r > 0) fail("v1 accepted a NUL in an address line");
            return;
        }
    }
    if (nf != 6) {
        if (r > 0) fail("v1 accepted a line without six fields");
        return;
    }
    fam = data[9] == '4' ? AF_INET : AF_INET6;
    int valid = inet_pton(fam, f[2], a) == 1 && inet_pton(fam, f[3], b) == 1 && port_ok(f[4], fl[4], &sp) &&
                port_ok(f[5], fl[5], &dp);
    if (valid != (r > 0)) fail(valid ? "v1 refused a line inet_pton accepts" : "v1 accepted a line inet_pton refuses");
    if (!valid) return;
    if ((size_t)r != n + 2) fail("v1 length is not up to the first CRLF");
    if (px->family != (fam == AF_INET ? BB_PROXY_INET : BB_PROXY_INET6) || px->transport != BB_PROXY_STREAM)
        fail("v1 family");
    if (memcmp(px->src_addr, a, fam == AF_INET ? 4 : 16) || memcmp(px->dst_addr, b, fam == AF_INET ? 4 : 16))
        fail("v1 address bytes differ from inet_pton's");
    if (px->src_port != sp || px->dst_port != dp) fail("v1 ports");
}

static void check_fields(const uint8_t *data, size_t size, int r, const struct bb_proxy *px)
{
    if (r <= 0) return;
    if (px->version == 1) {
        if ((size_t)r > BB_PROXY_V1_MAX_BYTES || data[r - 2] != '\r' || data[r - 1] != '\n') fail("v1 end");
        if (memchr(data, '\r', (size_t)r - 2) || memchr(data, '\n', (size_t)r - 2)) fail("v1 CR or LF inside");
        if (px->local) fail("v1 local");
    } else if (px->version == 2) {
        if (size < 16 || (size_t)r != 16u + be16(data + 14) || r > BB_PROXY_V2_MAX_BYTES) fail("v2 length");
        if (px->local != ((data[12] & 0x0F) == 0)) fail("v2 command");
        if (px->family == BB_PROXY_INET &&
            (memcmp(px->src_addr, data + 16, 4) || memcmp(px->dst_addr, data + 20, 4) ||
             px->src_port != be16(data + 24) || px->dst_port != be16(data + 26)))
            fail("v2 INET fields");
        if (px->family == BB_PROXY_INET6 &&
            (memcmp(px->src_addr, data + 16, 16) || memcmp(px->dst_addr, data + 32, 16) ||
             px->src_port != be16(data + 48) || px->dst_port != be16(data + 50)))
            fail("v2 INET6 fields");
    } else {
        fail("version");
    }
    if (px->family < BB_PROXY_UNSPEC || px->family > BB_PROXY_UNIX) fail("family");
    if (px->transport < 0 || px->transport > BB_PROXY_DGRAM) fail("transport");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct bb_proxy one, out;
    int want = parse(data, size, &one);
    size_t k;

    check_fields(data, size, want, &one);
    check_v1_oracle(data, size, want, &one);

    /* byte at a time: -2 until the answer */
    for (k = 0; k <= size; k++) {
        int r = parse(data, k, &out);
        if (r == -2) continue;
        if (want == -1 ? r != -1 : (k != (size_t)want || r != want)) fail("byte-at-a-time answer differs");
        same(r, &out, want, &one, "byte-at-a-time fields differ");
        break;
    }
    if (k > size && want != -2) fail("byte at a time never answered");

    /* a split chosen from the input */
    if (size > 1) {
        uint32_t h = 2166136261u;
        for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 16777619u;
        check_prefix(data, 1 + h % (size - 1), want, &one);
    }
    return 0;
}
