/*
 * fuzz_chunked.c - libFuzzer target for bb_decode_chunked.
 *
 * Decodes the input one-shot and byte at a time (and in two pieces at a split
 * chosen from the input), with default and with small limits, and checks:
 * the return value is >= 0, -1 or -2; *bufsz never grows; on -1 the status is
 * 400 or 431; decoded bytes, trailing bytes and the final answer are the
 * same whichever way the input was fed. Any difference calls abort().
 */
#include "bb_http.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct outcome {
    long ret;
    int status;
    char *out;
    size_t out_len;
    char *rest;
    size_t rest_len;
};

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_chunked: %s\n", what);
    abort();
}

/* Feeds data in pieces of `step` bytes (0: one piece, else the first piece is `first`). */
static void decode(const uint8_t *data, size_t size, size_t first, size_t step,
                   size_t max_ext, size_t max_tr, struct outcome *o)
{
    struct bb_chunked_decoder d;
    bb_chunked_init(&d);
    d.max_chunk_ext = max_ext;
    d.max_trailer_bytes = max_tr;
    o->ret = -2;
    o->status = 0;
    o->out = malloc(size + 1);
    o->rest = malloc(size + 1);
    o->out_len = o->rest_len = 0;
    size_t pos = 0;
    while (pos < size || (size == 0 && pos == 0)) {
        size_t n = pos == 0 ? (first ? first : size) : (step ? step : size - pos);
        if (n > size - pos) n = size - pos;
        char *piece = malloc(n ? n : 1); /* exact size: ASan catches over-reads */
        memcpy(piece, data + pos, n);
        size_t sz = n;
        long r = bb_decode_chunked(&d, piece, &sz);
        if (sz > n) fail("bufsz grew");
        if (r < -2) fail("bad return value");
        memcpy(o->out + o->out_len, piece, sz);
        o->out_len += sz;
        o->ret = r;
        if (r == -1) {
            if (d.status != 400 && d.status != 431) fail("unexpected status");
            o->status = d.status;
            free(piece);
            return;
        }
        if (r >= 0) {
            if ((size_t)r > n - sz) fail("trailing count too large");
            memcpy(o->rest, piece + sz, (size_t)r);
            memcpy(o->rest + r, data + pos + n, size - pos - n);
            o->rest_len = (size_t)r + size - pos - n;
            o->ret = (long)o->rest_len;
            free(piece);
            return;
        }
        free(piece);
        pos += n;
        if (size == 0) break;
    }
}

static void same(const struct outcome *a, const struct outcome *b, const char *what)
{
    if (a->ret != b->ret || a->status != b->status || a->out_len != b->out_len ||
        memcmp(a->out, b->out, a->out_len) || a->rest_len != b->rest_len ||
        memcmp(a->rest, b->rest, a->rest_len))
        fail(what);
}

static void release(struct outcome *o)
{
    free(o->out);
    free(o->rest);
}

static void check_profile(const uint8_t *data, size_t size, size_t max_ext, size_t max_tr)
{
    struct outcome one, other;
    decode(data, size, 0, 0, max_ext, max_tr, &one);

    decode(data, size, 1, 1, max_ext, max_tr, &other);
    same(&one, &other, "byte-at-a-time result differs from one-shot");
    release(&other);

    if (size > 1) {
        uint32_t h = 2166136261u;
        for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 16777619u;
        decode(data, size, 1 + h % (size - 1), 0, max_ext, max_tr, &other);
        same(&one, &other, "split result differs from one-shot");
        release(&other);
    }
    release(&one);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_profile(data, size, 0, 0);
    check_profile(data, size, 6, 24);
    return 0;
}
