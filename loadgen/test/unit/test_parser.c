/* Response parser: a table of (input, expected outcome); every input is also
 * fed split at every byte boundary and one byte at a time, and must give the
 * same outcome each way. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "parser.h"

#define MAX_RESP 8
enum { EOF_NONE, EOF_CLOSE }; /* whether the peer closes after the input */

struct outcome {
    int ndone;
    int status[MAX_RESP];
    int keep_alive[MAX_RESP];
    int error;
    int eof; /* resp_eof() result when the input is followed by EOF */
};

struct parser_case {
    const char *comment;
    const char *input;
    int head;
    struct outcome want;
};

#define OK_KA(s) { 1, { s }, { 1 }, 0, RP_MORE }

static const struct parser_case cases[] = {
    { "content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 0, OK_KA(200) },
    { "nginx-like", "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sun, 22 Nov 2026 00:00:00 GMT\r\n"
      "Content-Type: text/plain\r\nContent-Length: 6\r\nConnection: keep-alive\r\n\r\nhello\n", 0, OK_KA(200) },
    { "zero length", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0, OK_KA(200) },
    { "two pipelined: length then chunked",
      "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
      0, { 2, { 200, 404 }, { 1, 1 }, 0, RP_MORE } },
    { "chunked with extension, trailers, upper-case hex",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: a\r\n\r\n",
      0, OK_KA(200) },
    { "chunked, case-insensitive names and values",
      "HTTP/1.1 200 OK\r\ntransfer-ENCODING: Chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", 0, OK_KA(200) },
    { "chunked wins over content-length",
      "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", 0, OK_KA(200) },
    { "gzip, chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", 0, OK_KA(200) },
    { "EOF-delimited body (Unicorn)", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nbody bytes",
      0, { 0, { 0 }, { 0 }, 0, RP_DONE } },
    { "EOF-delimited, empty body", "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", 0, { 0, { 0 }, { 0 }, 0, RP_DONE } },
    { "connection: close with length", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
      0, { 1, { 200 }, { 0 }, 0, RP_MORE } },
    { "connection: token list", "HTTP/1.1 200 OK\r\nConnection: Upgrade, CLOSE\r\nContent-Length: 0\r\n\r\n",
      0, { 1, { 200 }, { 0 }, 0, RP_MORE } },
    { "HTTP/1.0 closes by default", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 0, { 1, { 200 }, { 0 }, 0, RP_MORE } },
    { "HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx", 0, OK_KA(200) },
    { "HEAD: length but no body, then next", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
      1, { 2, { 200, 200 }, { 1, 1 }, 0, RP_MORE } },
    { "HEAD without length is not EOF-delimited", "HTTP/1.1 200 OK\r\n\r\n", 1, OK_KA(200) },
    { "204 and 304 have no body",
      "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
      0, { 3, { 204, 304, 200 }, { 1, 1, 1 }, 0, RP_MORE } },
    { "100 Continue is skipped", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
      "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", 0, OK_KA(201) },
    { "101 ends the HTTP conversation", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", 0, { 1, { 101 }, { 0 }, 0, RP_MORE } },
    { "bare LF line endings", "HTTP/1.1 500 Oops\nContent-Length: 3\n\nabc", 0, OK_KA(500) },
    { "status line without reason", "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 0, OK_KA(200) },
    { "long header line is skipped",
      "HTTP/1.1 200 OK\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"
      "Content-Length: 1\r\n\r\nz", 0, OK_KA(200) },
    { "obs-fold continuation ignored", "HTTP/1.1 200 OK\r\nX-A: a\r\n  folded\r\nContent-Length: 0\r\n\r\n", 0, OK_KA(200) },
    { "same content-length twice", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 0, OK_KA(200) },
    /* errors */
    { "not HTTP", "garbage\r\n\r\n", 0, { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    { "HTTP/2 status line", "HTTP/2 200 OK\r\n\r\n", 0, { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    { "bad status code", "HTTP/1.1 2x0 OK\r\n\r\n", 0, { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    { "bad content-length", "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", 0, { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    { "conflicting content-length", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx", 0,
      { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    { "bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0, { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    { "chunk data not followed by CRLF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n", 0,
      { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    { "header without colon", "HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", 0, { 0, { 0 }, { 0 }, 1, RP_ERROR } },
    /* truncation at EOF */
    { "EOF before any byte: an idle close", "", 0, { 0, { 0 }, { 0 }, 0, RP_MORE } },
    { "EOF in the status line", "HTTP/1.1 20", 0, { 0, { 0 }, { 0 }, 0, RP_ERROR } },
    { "EOF in headers", "HTTP/1.1 200 OK\r\nContent-Le", 0, { 0, { 0 }, { 0 }, 0, RP_ERROR } },
    { "EOF in a length body", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel", 0, { 0, { 0 }, { 0 }, 0, RP_ERROR } },
    { "EOF in a chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe", 0, { 0, { 0 }, { 0 }, 0, RP_ERROR } },
    { "EOF after a complete response", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0, OK_KA(200) },
    { "EOF after an interim response", "HTTP/1.1 100 Continue\r\n\r\n", 0, { 0, { 0 }, { 0 }, 0, RP_ERROR } },
};

/* Feed input in pieces ending at the offsets in cuts[] (the last is len). */
static void run(const char *input, int head, const size_t *cuts, size_t ncuts, struct outcome *out)
{
    struct resp_parser p;
    memset(out, 0, sizeof *out);
    resp_init(&p, head);
    size_t from = 0;
    for (size_t i = 0; i < ncuts && !out->error; i++) {
        size_t to = cuts[i], off = from;
        while (off < to) {
            int ev;
            off += resp_feed(&p, input + off, to - off, &ev);
            if (ev == RP_ERROR) {
                out->error = 1;
                break;
            }
            if (ev == RP_DONE && out->ndone < MAX_RESP) {
                out->status[out->ndone] = p.status;
                out->keep_alive[out->ndone] = resp_keep_alive(&p);
                out->ndone++;
            }
        }
        from = to;
    }
    out->eof = out->error ? RP_ERROR : resp_eof(&p);
    if (out->eof == RP_DONE && out->ndone == 0) out->status[0] = p.status; /* EOF-delimited */
}

static int same(const struct outcome *a, const struct outcome *b)
{
    if (a->ndone != b->ndone || a->error != b->error || a->eof != b->eof) return 0;
    for (int i = 0; i < a->ndone; i++)
        if (a->status[i] != b->status[i] || a->keep_alive[i] != b->keep_alive[i]) return 0;
    return 1;
}

static void report(const char *comment, const char *how, const struct outcome *got, const struct outcome *want)
{
    fprintf(stderr, "  parser case \"%s\" (%s): got done=%d status0=%d ka0=%d error=%d eof=%d; want done=%d status0=%d ka0=%d error=%d eof=%d\n",
            comment, how, got->ndone, got->status[0], got->keep_alive[0], got->error, got->eof, want->ndone,
            want->status[0], want->keep_alive[0], want->error, want->eof);
}

void test_parser_table_all_splits(void)
{
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct parser_case *pc = &cases[c];
        size_t len = strlen(pc->input);
        struct outcome got, want = pc->want;
        if (want.eof == RP_DONE && want.ndone == 0) want.status[0] = 200;
        size_t whole[1] = { len };
        run(pc->input, pc->head, whole, 1, &got);
        if (!same(&got, &want)) {
            check_failures++;
            report(pc->comment, "whole", &got, &want);
            continue;
        }
        for (size_t cut = 0; cut <= len; cut++) { /* every two-piece split */
            size_t cuts[2] = { cut, len };
            run(pc->input, pc->head, cuts, 2, &got);
            if (!same(&got, &want)) {
                check_failures++;
                char how[32];
                snprintf(how, sizeof how, "split at %zu", cut);
                report(pc->comment, how, &got, &want);
                break;
            }
        }
        size_t *bytes = malloc((len + 1) * sizeof *bytes); /* one byte at a time */
        for (size_t i = 0; i < len; i++) bytes[i] = i + 1;
        run(pc->input, pc->head, bytes, len, &got);
        free(bytes);
        if (!same(&got, &want)) {
            check_failures++;
            report(pc->comment, "byte by byte", &got, &want);
        }
    }
}

void test_parser_consumes_exactly_one_response(void)
{
    const char *two = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    struct resp_parser p;
    int ev;
    resp_init(&p, 0);
    size_t n = resp_feed(&p, two, strlen(two), &ev);
    CHECK(ev == RP_DONE);
    CHECK(n == strlen("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"));
    size_t m = resp_feed(&p, two + n, strlen(two) - n, &ev);
    CHECK(ev == RP_DONE && n + m == strlen(two));
}

/* Pipelined requests may mix methods (--target 'HEAD /x' and 'GET /x'):
 * resp_set_head between responses says whether the next one has a body. */
void test_parser_head_then_get_pipelined(void)
{
    const char *in = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"      /* answers HEAD: no body */
                     "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" /* answers GET */
                     "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";     /* answers HEAD */
    const int head[] = { 1, 0, 1 };
    size_t len = strlen(in);
    for (size_t split = 0; split <= len; split++) { /* and every split of the input */
        struct resp_parser p;
        int ev, done = 0;
        resp_init(&p, head[0]);
        size_t off = 0;
        while (off < len && done < 3) {
            size_t end = off < split ? split : len;
            size_t n = resp_feed(&p, in + off, end - off, &ev);
            off += n;
            CHECK(ev != RP_ERROR);
            if (ev == RP_ERROR) return;
            if (ev == RP_DONE && ++done < 3) resp_set_head(&p, head[done]);
        }
        CHECK(done == 3 && off == len);
        if (check_failures) return;
    }
}

void test_parser_header_limit(void)
{
    size_t len = RP_MAX_HEAD + 100;
    char *big = malloc(len);
    memcpy(big, "HTTP/1.1 200 OK\r\n", 17);
    for (size_t i = 17; i < len; i++) big[i] = (i % 64 == 63) ? '\n' : 'a';
    for (size_t i = 17; i < len; i++) if (big[i] == 'a' && (i % 64) == 20) big[i] = ':';
    struct resp_parser p;
    int ev = 0;
    resp_init(&p, 0);
    resp_feed(&p, big, len, &ev);
    CHECK(ev == RP_ERROR);
    free(big);
}

void test_parser_large_body_skipped(void)
{
    const char *h = "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n";
    char chunk[4096];
    memset(chunk, 'b', sizeof chunk);
    struct resp_parser p;
    int ev;
    resp_init(&p, 0);
    resp_feed(&p, h, strlen(h), &ev);
    CHECK(ev == RP_MORE);
    size_t left = 1000000;
    while (left > sizeof chunk) {
        CHECK(resp_feed(&p, chunk, sizeof chunk, &ev) == sizeof chunk && ev == RP_MORE);
        left -= sizeof chunk;
    }
    CHECK(resp_feed(&p, chunk, sizeof chunk, &ev) == left && ev == RP_DONE);
}

/* Random and mutated input: never a crash or an over-read (the suite runs
 * under ASan), and the consumed count never exceeds the input. */
void test_parser_garbage(void)
{
    static const char *seeds[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\nhello\r\n0\r\nT: 1\r\n\r\n",
        "HTTP/1.0 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
    };
    char buf[256];
    unsigned seed = 12345;
    for (int iter = 0; iter < 20000; iter++) {
        const char *s = seeds[iter % 3];
        size_t len = strlen(s);
        memcpy(buf, s, len);
        for (int m = 0; m < 1 + iter % 4; m++) { /* flip a few bytes */
            seed = seed * 1103515245u + 12345u;
            buf[(seed >> 8) % len] = (char)(seed >> 20);
        }
        if (iter % 5 == 0)
            for (size_t i = 0; i < len; i++) {
                seed = seed * 1103515245u + 12345u;
                buf[i] = (char)(seed >> 16);
            }
        char *exact = malloc(len); /* exact-size copy: ASan catches any over-read */
        memcpy(exact, buf, len);
        struct resp_parser p;
        resp_init(&p, iter % 7 == 0);
        size_t off = 0;
        while (off < len) {
            int ev;
            size_t n = resp_feed(&p, exact + off, len - off, &ev);
            if (ev == RP_ERROR) break;
            CHECK(n <= len - off);
            if (ev == RP_MORE) CHECK(n == len - off);
            off += n;
        }
        (void)resp_eof(&p);
        free(exact);
        if (check_failures) return;
    }
}
