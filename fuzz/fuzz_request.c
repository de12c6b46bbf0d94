/*
 * fuzz_request.c - libFuzzer target for bb_parse_request.
 *
 * For each input, under two limit profiles (defaults, and small limits that
 * put every limit in reach):
 *   - invariants: result is > 0, -1 or -2; consumed <= len; on -1 the status is
 *     400/414/431/501/505; on success every returned pointer lies inside the
 *     consumed head and num_headers <= capacity; no '#' in target, path or
 *     query; the authority is there when Host or an absolute-form target is,
 *     holds only authority bytes, and splits at host_len into host and ":port";
 *   - differential: scalar and SSE4.2 give identical results (when available);
 *   - incremental: a split chosen from the input (prefix, then the whole with
 *     last_len) and byte-at-a-time feeding give the one-shot result.
 * Any difference calls abort().
 */
#include "bb_http.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP 100

struct outcome {
    int ret, status;
    long method, target, path, query;
    size_t method_len, target_len, path_len, query_len;
    int minor;
    size_t nh;
    long long cl;
    int host;
    unsigned flags;
    long auth;
    size_t auth_len, host_len;
    long h[4 * CAP];
};

static long off(const char *p, const char *base) { return p ? (long)(p - base) : -1; }

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_request: %s\n", what);
    abort();
}

static void in_head(const char *p, size_t n, const char *base, int ret)
{
    if (p == NULL) return;
    if (p < base || p + n > base + ret) fail("pointer outside the consumed head");
}

/* A byte an authority (uri-host [":" port]) may hold at all. */
static int authority_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != 0 && strchr("-._~!$&'()*+,;=%:[]", c) != NULL);
}

static void check_authority(const struct bb_request *req, const char *buf, int ret)
{
    int absolute = (req->flags & BB_F_ABSOLUTE_FORM) != 0;
    if ((req->host_index >= 0 || absolute) != (req->authority != NULL)) fail("authority presence");
    if (req->authority == NULL) return;
    in_head(req->authority, req->authority_len, buf, ret);
    if (absolute && (req->authority < req->target || req->authority >= req->target + req->target_len))
        fail("absolute-form authority outside the target");
    if (req->host_len > req->authority_len) fail("host_len");
    if (req->host_len == 0 && req->authority_len != 0) fail("empty host with a port");
    for (size_t i = 0; i < req->authority_len; i++)
        if (!authority_byte((unsigned char)req->authority[i])) fail("byte outside an authority");
    if (req->host_len < req->authority_len) {
        const char *port = req->authority + req->host_len + 1;
        size_t n = req->authority_len - req->host_len - 1;
        unsigned long v = 0;
        if (req->authority[req->host_len] != ':' || n == 0) fail("port separator");
        for (size_t i = 0; i < n; i++) {
            if (port[i] < '0' || port[i] > '9') fail("port digit");
            v = v * 10 + (unsigned long)(port[i] - '0');
            if (v > 65535) fail("port over 65535");
        }
    }
}

static void parse(const char *buf, size_t len, size_t last_len, const struct bb_limits *lim,
                  size_t cap, struct outcome *o)
{
    struct bb_header h[CAP];
    struct bb_request req;
    memset(&req, 0, sizeof(req));
    memset(o, 0, sizeof(*o));
    req.headers = h;
    req.num_headers = cap;
    o->ret = bb_parse_request(buf, len, last_len, &req, lim);
    if (o->ret == -2) {
        if (req.num_headers != cap) fail("num_headers changed on -2");
        return;
    }
    if (o->ret == -1) {
        o->status = req.status;
        if (req.num_headers != cap) fail("num_headers changed on -1");
        if (!(o->status == 400 || o->status == 414 || o->status == 431 || o->status == 501 ||
              o->status == 505)) fail("unexpected status");
        return;
    }
    if (o->ret <= 0 || (size_t)o->ret > len) fail("bad return value");
    if (req.num_headers > cap || req.num_headers > lim->max_headers) fail("too many headers");
    if ((size_t)o->ret > lim->max_header_bytes) fail("head over max_header_bytes");
    if (req.target_len > lim->max_uri) fail("target over max_uri");
    if (req.minor_version != 0 && req.minor_version != 1) fail("minor_version");
    if (req.host_index >= (int)req.num_headers) fail("host_index");
    if ((req.flags & BB_F_CHUNKED) && req.content_length != -1) fail("chunked with content_length");
    in_head(req.method, req.method_len, buf, o->ret);
    in_head(req.target, req.target_len, buf, o->ret);
    in_head(req.path, req.path_len, buf, o->ret);
    in_head(req.query, req.query_len, buf, o->ret);
    if (!req.method || !req.target || !req.path) fail("NULL method/target/path");
    if (memchr(req.target, '#', req.target_len)) fail("fragment in the target");
    if (req.query && memchr(req.query, '#', req.query_len)) fail("fragment in the query");
    if (memchr(req.path, '#', req.path_len)) fail("fragment in the path");
    check_authority(&req, buf, o->ret);
    o->method = off(req.method, buf);
    o->target = off(req.target, buf);
    o->path = off(req.path, buf);
    o->query = off(req.query, buf);
    o->method_len = req.method_len;
    o->target_len = req.target_len;
    o->path_len = req.path_len;
    o->query_len = req.query_len;
    o->minor = req.minor_version;
    o->nh = req.num_headers;
    o->cl = req.content_length;
    o->host = req.host_index;
    o->flags = req.flags;
    o->auth = off(req.authority, buf);
    o->auth_len = req.authority_len;
    o->host_len = req.host_len;
    for (size_t i = 0; i < req.num_headers; i++) {
        in_head(h[i].name, h[i].name_len, buf, o->ret);
        in_head(h[i].value, h[i].value_len, buf, o->ret);
        o->h[4 * i] = off(h[i].name, buf);
        o->h[4 * i + 1] = (long)h[i].name_len;
        o->h[4 * i + 2] = off(h[i].value, buf);
        o->h[4 * i + 3] = (long)h[i].value_len;
    }
}

static void check_profile(const char *buf, size_t len, const struct bb_limits *lim, size_t cap,
                          int have_simd)
{
    struct outcome one, other;

    bb_http_force_impl(0);
    parse(buf, len, 0, lim, cap, &one);
    if (have_simd) {
        bb_http_force_impl(1);
        parse(buf, len, 0, lim, cap, &other);
        if (memcmp(&one, &other, sizeof(one)) != 0) fail("scalar and SSE4.2 differ");
    }

    /* one split, chosen from the input */
    if (len > 1) {
        uint32_t hsh = 2166136261u;
        for (size_t i = 0; i < len; i++) hsh = (hsh ^ (unsigned char)buf[i]) * 16777619u;
        size_t k = 1 + hsh % (len - 1);
        parse(buf, k, 0, lim, cap, &other);
        if (other.ret == -2) parse(buf, len, k, lim, cap, &other);
        if (memcmp(&one, &other, sizeof(one)) != 0) fail("split result differs from one-shot");
    }

    /* byte at a time (bounded: the cost is quadratic in the worst case) */
    if (len <= 2048) {
        size_t last = 0;
        other.ret = -2;
        for (size_t k = 1; k <= len; k++) {
            parse(buf, k, last, lim, cap, &other);
            if (other.ret != -2) break;
            last = k;
        }
        if (len == 0) parse(buf, 0, 0, lim, cap, &other);
        if (memcmp(&one, &other, sizeof(one)) != 0) fail("byte-at-a-time result differs from one-shot");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int have_simd = -1;
    if (have_simd < 0) have_simd = bb_http_force_impl(1) == 0;

    /* an exact-size heap copy, so ASan sees any over-read */
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);

    /* a server with default settings (lib/blackbuck/config.rb; the parser has no defaults of its own) */
    struct bb_limits lim = { .max_request_line = 8 * 1024, .max_uri = 8 * 1024, .max_headers = CAP,
                             .max_header_bytes = 64 * 1024 };
    check_profile(buf, size, &lim, CAP, have_simd);

    struct bb_limits small = { .max_request_line = 64, .max_uri = 32, .max_headers = 8,
                               .max_header_bytes = 256 };
    check_profile(buf, size, &small, 6, have_simd);

    free(buf);
    return 0;
}
