/*
 * test_http.c - table-driven tests for bb_http.c (request parser + chunked decoder).
 *
 * Every row runs under each scanner (scalar, and SSE4.2 when the CPU has it):
 *   - one shot, with the input placed right before a PROT_NONE page;
 *   - every split into two calls (prefix, then the whole with last_len);
 *   - byte at a time (last_len growing by one);
 * and the final answer must equal the row's expectation every time. Inputs of
 * more than SPLIT_ALL bytes are split at a subset of points (see splits_for).
 *
 * Build and run: make -C test/c test
 */
#define _DEFAULT_SOURCE
#include "bb_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALL (-100) /* expected return: the whole input was consumed */
#define SPLIT_ALL 4096

/* The limits a row runs with unless it names its own (.lim). The parser has no defaults for them
 * (they are the server's settings); these are the tests' own, the sizes the "test limits" rows
 * below are written for: request line and target 8 KiB, 100 fields, a head of 64 KiB. */
static const struct bb_limits TEST_LIMITS = { 8 * 1024, 8 * 1024, 100, 64 * 1024 };

static int passed, failed;

/* ------------------------------------------------------------ guard page */

static size_t page;
static char *guard_base;   /* mapping start */
static size_t guard_cap;   /* bytes usable before the guard page */

/* Returns a pointer p such that p[0..n) ends right at a PROT_NONE page. */
static char *guarded(const void *data, size_t n)
{
    if (n > guard_cap) {
        if (guard_base) munmap(guard_base, guard_cap + page);
        guard_cap = (n + page - 1) / page * page;
        if (guard_cap == 0) guard_cap = page;
        guard_base = mmap(NULL, guard_cap + page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (guard_base == MAP_FAILED || mprotect(guard_base + guard_cap, page, PROT_NONE)) {
            perror("mmap");
            exit(2);
        }
    }
    char *p = guard_base + guard_cap - n;
    memcpy(p, data, n);
    return p;
}

/* ------------------------------------------------------ request table */

struct limits_row { size_t rl, uri, nh, hb; };

struct row {
    const char *comment;
    const char *in;
    size_t len;
    int ret;            /* ALL, a byte count, -1 or -2 */
    int status;         /* on -1 */
    const struct limits_row *lim; /* NULL: defaults */
    size_t cap;         /* header array capacity (0: 100) */
    /* expectations on success */
    const char *method, *target, *path, *query; /* query NULL: expect NULL */
    int minor, nh;
    long long cl;
    unsigned flags;
    int host;
    const char *h[8];   /* name, value pairs to check (in order from index 0) */
    const char *auth;   /* authority expected (NULL: not checked; NO_AUTH: must be NULL) */
    const char *hname;  /* with auth: its uri-host part (authority[0..host_len)) */
};

static const char no_auth_mark[] = "(none)";
#define NO_AUTH no_auth_mark

#define IN(s) .in = s, .len = sizeof(s) - 1
#define OK(c, s, m, t, p, q, mi, n, cl_, fl, ho, ...) \
    { .comment = c, IN(s), .ret = ALL, .method = m, .target = t, .path = p, .query = q, \
      .minor = mi, .nh = n, .cl = cl_, .flags = fl, .host = ho, .h = { __VA_ARGS__ } }
#define ERR(c, s, st) { .comment = c, IN(s), .ret = -1, .status = st }
#define ERRL(c, s, st, l) { .comment = c, IN(s), .ret = -1, .status = st, .lim = l }
#define MORE(c, s) { .comment = c, IN(s), .ret = -2 }
#define MOREL(c, s, l) { .comment = c, IN(s), .ret = -2, .lim = l }
/* A GET with one field line (Host) whose authority is checked. */
#define GET1(c, s, t, p, q, mi, fl, a, hn) \
    { .comment = c, IN(s), .ret = ALL, .method = "GET", .target = t, .path = p, .query = q, \
      .minor = mi, .nh = 1, .cl = -1, .flags = fl, .host = 0, .auth = a, .hname = hn }

#define H11 " HTTP/1.1\r\nHost: a\r\n"
#define CH BB_F_CHUNKED
#define AF BB_F_ABSOLUTE_FORM

static const struct limits_row L_URI8 = { 8192, 8, 100, 65536 };
static const struct limits_row L_RL17 = { 17, 8192, 100, 65536 };
static const struct limits_row L_RL16 = { 16, 8192, 100, 65536 };
static const struct limits_row L_NH2 = { 8192, 8192, 2, 65536 };
static const struct limits_row L_HB27 = { 8192, 8192, 100, 27 };
static const struct limits_row L_HB26 = { 8192, 8192, 100, 26 };
static const struct limits_row L_HB20 = { 8192, 8192, 100, 20 };
static const struct limits_row L_ALL0 = { 0, 0, 0, 0 };
static const struct limits_row L_RL0 = { 0, 8192, 100, 65536 };

static const struct row rows[] = {
    /* --- valid requests --- */
    OK("simple GET", "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
       "GET", "/", "/", NULL, 1, 1, -1, 0, 0, "Host", "example.com"),
    OK("path and query", "GET /a/b?x=1&y=2 HTTP/1.1\r\nHost: h\r\n\r\n",
       "GET", "/a/b?x=1&y=2", "/a/b", "x=1&y=2", 1, 1, -1, 0, 0),
    OK("empty query is not NULL", "GET /a? HTTP/1.1\r\nHost: h\r\n\r\n",
       "GET", "/a?", "/a", "", 1, 1, -1, 0, 0),
    OK("second ? stays in the query", "GET /a?b?c HTTP/1.1\r\nHost: h\r\n\r\n",
       "GET", "/a?b?c", "/a", "b?c", 1, 1, -1, 0, 0),
    OK("HTTP/1.0 without Host", "GET /index.html HTTP/1.0\r\n\r\n",
       "GET", "/index.html", "/index.html", NULL, 0, 0, -1, 0, -1),
    { .comment = "POST with body: body bytes are not consumed",
      IN("POST /submit HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"), .ret = 53,
      .method = "POST", .target = "/submit", .path = "/submit", .minor = 1, .nh = 2, .cl = 5,
      .host = 0, .h = { "Host", "h", "Content-Length", "5" } },
    OK("HEAD", "HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n", "HEAD", "/x", "/x", NULL, 1, 1, -1, 0, 0),
    OK("OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", "OPTIONS", "*", "*", NULL, 1, 1, -1, 0, 0),
    OK("absolute-form", "GET http://example.com:8080/p?q=1 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
       "GET", "http://example.com:8080/p?q=1", "/p", "q=1", 1, 1, -1, AF, 0),
    OK("absolute-form without path -> /", "GET http://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n",
       "GET", "http://example.com", "/", NULL, 1, 1, -1, AF, 0),
    OK("absolute-form https, query, no path", "GET https://example.com?x HTTP/1.1\r\nHost: e\r\n\r\n",
       "GET", "https://example.com?x", "/", "x", 1, 1, -1, AF, 0),
    OK("absolute-form scheme is case-insensitive", "GET HTTP://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
       "GET", "HTTP://a/", "/", NULL, 1, 1, -1, AF, 0),
    OK("any token is a method", "M-SEARCH /x HTTP/1.1\r\nHost: h\r\n\r\n",
       "M-SEARCH", "/x", "/x", NULL, 1, 1, -1, 0, 0),
    OK("chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
       "POST", "/", "/", NULL, 1, 2, -1, CH, 0),
    OK("chunked: case and OWS", "POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: \t ChUnKeD \t\r\n\r\n",
       "POST", "/", "/", NULL, 1, 2, -1, CH, 0, "Host", "a", "transfer-encoding", "ChUnKeD"),
    OK("chunked after HTAB (HTAB is OWS)", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n",
       "POST", "/", "/", NULL, 1, 2, -1, CH, 0),
    OK("Transfer_Encoding is another header", "POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\n\r\n",
       "POST", "/", "/", NULL, 1, 2, -1, 0, 0),
    OK("Connection list", "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\n\r\n",
       "GET", "/", "/", NULL, 1, 2, -1, BB_F_CONN_KEEPALIVE | BB_F_UPGRADE, 0),
    OK("Connection over two headers", "GET / HTTP/1.1\r\nConnection: CLOSE\r\nHost: a\r\nconnection: ,upgrade,\r\n\r\n",
       "GET", "/", "/", NULL, 1, 3, -1, BB_F_CONN_CLOSE | BB_F_UPGRADE, 1),
    OK("Connection: unknown tokens ignored", "GET / HTTP/1.1\r\nHost: a\r\nConnection: closed, keep\r\n\r\n",
       "GET", "/", "/", NULL, 1, 2, -1, 0, 0),
    OK("Expect: 100-continue", "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 0\r\n\r\n",
       "PUT", "/", "/", NULL, 1, 3, 0, BB_F_EXPECT_CONTINUE, 0),
    OK("Expect: 100-continue ignored in HTTP/1.0", "PUT / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n",
       "PUT", "/", "/", NULL, 0, 1, -1, 0, -1),
    OK("other Expect ignored", "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n",
       "PUT", "/", "/", NULL, 1, 2, -1, 0, 0),
    OK("leading empty lines are skipped", "\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
       "GET", "/", "/", NULL, 1, 1, -1, 0, 0),
    OK("obs-text and HTAB in a value", "GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\tok\r\n\r\n",
       "GET", "/", "/", NULL, 1, 2, -1, 0, 0, "Host", "a", "X", "caf\xc3\xa9\tok"),
    OK("empty and blank values", "GET / HTTP/1.1\r\nHost: a\r\nX:\r\nY:  \t \r\n\r\n",
       "GET", "/", "/", NULL, 1, 3, -1, 0, 0, "Host", "a", "X", "", "Y", ""),
    OK("OWS trimmed, inner SP kept", "GET / HTTP/1.1\r\nHost: a\r\nX:  a  b \r\n\r\n",
       "GET", "/", "/", NULL, 1, 2, -1, 0, 0, "Host", "a", "X", "a  b"),
    OK("Content-Length with leading zeros and OWS", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:  007 \r\n\r\n",
       "POST", "/", "/", NULL, 1, 2, 7, 0, 0),
    OK("Content-Length 18 digits", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 999999999999999999\r\n\r\n",
       "POST", "/", "/", NULL, 1, 2, 999999999999999999LL, 0, 0),
    OK("Host with IPv6 literal and port", "GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
       "GET", "/", "/", NULL, 1, 1, -1, 0, 0, "Host", "[::1]:8080"),
    OK("empty Host is valid", "GET / HTTP/1.1\r\nHost:\r\n\r\n", "GET", "/", "/", NULL, 1, 1, -1, 0, 0),
    OK("TE in 1.1 with Host after", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: a\r\n\r\n",
       "POST", "/", "/", NULL, 1, 2, -1, CH, 1),
    { .comment = "pipelined: only the first head is consumed",
      IN("GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n"), .ret = 28,
      .method = "GET", .target = "/1", .path = "/1", .minor = 1, .nh = 1, .cl = -1, .host = 0 },
    OK("browser request", "GET /wp-content/uploads/2010/03/hello-kitty-darth-vader-pink.jpg HTTP/1.1\r\n"
       "Host: www.kittyhell.com\r\n"
       "User-Agent: Mozilla/5.0 (Macintosh; U; Intel Mac OS X 10.6; ja-JP-mac; rv:1.9.2.3) Gecko/20100401 Firefox/3.6.3 Pathtraq/0.9\r\n"
       "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
       "Accept-Language: ja,en-us;q=0.7,en;q=0.3\r\n"
       "Accept-Encoding: gzip,deflate\r\n"
       "Accept-Charset: Shift_JIS,utf-8;q=0.7,*;q=0.7\r\n"
       "Keep-Alive: 115\r\n"
       "Connection: keep-alive\r\n"
       "Cookie: wp_ozh_wsa_visits=2; wp_ozh_wsa_visit_lasttime=xxxxxxxxxx; "
       "__utma=xxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.xxxxxxxxxx.x; "
       "__utmz=xxxxxxxxx.xxxxxxxxxx.x.x.utmccn=(referral)|utmcsr=reader.livedoor.com|utmcct=/reader/|utmcmd=referral\r\n"
       "\r\n",
       "GET", "/wp-content/uploads/2010/03/hello-kitty-darth-vader-pink.jpg",
       "/wp-content/uploads/2010/03/hello-kitty-darth-vader-pink.jpg", NULL, 1, 9, -1,
       BB_F_CONN_KEEPALIVE, 0, "Host", "www.kittyhell.com"),

    /* --- RFC 9110 2.5: a higher HTTP/1.x minor is read as HTTP/1.1 --- */
    GET1("HTTP/1.2 is HTTP/1.1", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", "/", "/", NULL, 1, 0, "a", "a"),
    GET1("HTTP/1.9 is HTTP/1.1", "GET / HTTP/1.9\r\nHost: a\r\n\r\n", "/", "/", NULL, 1, 0, "a", "a"),
    OK("HTTP/1.0 stays 1.0", "GET / HTTP/1.0\r\n\r\n", "GET", "/", "/", NULL, 0, 0, -1, 0, -1),
    { .comment = "HTTP/1.0 without Host has no authority", IN("GET / HTTP/1.0\r\n\r\n"), .ret = ALL,
      .method = "GET", .target = "/", .path = "/", .minor = 0, .nh = 0, .cl = -1, .host = -1, .auth = NO_AUTH },

    /* --- fragments are dropped from target, path and query --- */
    GET1("fragment after the path", "GET /a#frag HTTP/1.1\r\nHost: h\r\n\r\n", "/a", "/a", NULL, 1, 0, "h", "h"),
    GET1("fragment after the query", "GET /a?x=1#f HTTP/1.1\r\nHost: h\r\n\r\n", "/a?x=1", "/a", "x=1", 1, 0, "h", "h"),
    GET1("'#' right after '?': empty query", "GET /a?#f HTTP/1.1\r\nHost: h\r\n\r\n", "/a?", "/a", "", 1, 0, "h", "h"),
    GET1("'?' inside the fragment is not a query", "GET /a#f?x=1 HTTP/1.1\r\nHost: h\r\n\r\n", "/a", "/a", NULL, 1, 0, "h", "h"),
    GET1("empty fragment", "GET /# HTTP/1.1\r\nHost: h\r\n\r\n", "/", "/", NULL, 1, 0, "h", "h"),
    GET1("two '#'", "GET /a#b#c HTTP/1.1\r\nHost: h\r\n\r\n", "/a", "/a", NULL, 1, 0, "h", "h"),
    OK("OPTIONS * with a fragment", "OPTIONS *#x HTTP/1.1\r\nHost: h\r\n\r\n",
       "OPTIONS", "*", "*", NULL, 1, 1, -1, 0, 0),
    GET1("absolute-form: fragment right after the authority", "GET http://a.example#f HTTP/1.1\r\nHost: h\r\n\r\n",
         "http://a.example", "/", NULL, 1, AF, "a.example", "a.example"),
    GET1("absolute-form: query then fragment", "GET http://a.example?q#f?g HTTP/1.1\r\nHost: h\r\n\r\n",
         "http://a.example?q", "/", "q", 1, AF, "a.example", "a.example"),
    GET1("absolute-form: path, '?' in the fragment", "GET http://a.example/p#f?g HTTP/1.1\r\nHost: h\r\n\r\n",
         "http://a.example/p", "/p", NULL, 1, AF, "a.example", "a.example"),

    /* --- absolute-form: the target's authority, not Host (RFC 9112 3.2.2) --- */
    GET1("absolute-form authority wins over Host", "GET http://a.example/x HTTP/1.1\r\nHost: b.example\r\n\r\n",
         "http://a.example/x", "/x", NULL, 1, AF, "a.example", "a.example"),
    GET1("absolute-form authority with port", "GET http://a.example:8443/x HTTP/1.1\r\nHost: b.example:80\r\n\r\n",
         "http://a.example:8443/x", "/x", NULL, 1, AF, "a.example:8443", "a.example"),
    GET1("absolute-form with an empty Host", "GET http://a.example/ HTTP/1.1\r\nHost:\r\n\r\n",
         "http://a.example/", "/", NULL, 1, AF, "a.example", "a.example"),
    GET1("absolute-form IPv6 authority", "GET http://[::1]:8080?x HTTP/1.1\r\nHost: h\r\n\r\n",
         "http://[::1]:8080?x", "/", "x", 1, AF, "[::1]:8080", "[::1]"),
    { .comment = "absolute-form in HTTP/1.0 without Host", IN("GET http://a.example/x HTTP/1.0\r\n\r\n"),
      .ret = ALL, .method = "GET", .target = "http://a.example/x", .path = "/x", .minor = 0, .nh = 0, .cl = -1,
      .flags = AF, .host = -1, .auth = "a.example", .hname = "a.example" },
    GET1("Host is the authority of an origin-form request", "GET / HTTP/1.1\r\nHost: b.example:8080\r\n\r\n",
         "/", "/", NULL, 1, 0, "b.example:8080", "b.example"),
    GET1("empty Host: an empty authority", "GET / HTTP/1.1\r\nHost: \r\n\r\n", "/", "/", NULL, 1, 0, "", ""),

    /* --- incomplete --- */
    MORE("empty input", ""),
    MORE("method only", "GET"),
    MORE("request line without CRLF", "GET / HTTP/1.1"),
    MORE("CR of the request line", "GET / HTTP/1.1\r"),
    MORE("leading CR only", "\r"),
    MORE("leading empty line only", "\r\n"),
    MORE("no final empty line", "GET / HTTP/1.1\r\nHost: a\r\n"),
    MORE("final CR without LF", "GET / HTTP/1.1\r\nHost: a\r\n\r"),
    MORE("partial field line", "GET / HTTP/1.1\r\nHost: a\r\nX-Partial: abc"),
    MORE("partial field line, bad syntax not yet visible", "GET / HTTP/1.1\r\nHo st: a"),
    MORE("partial version", "GET / HTTP/2.0"),

    /* --- request line: 400 --- */
    ERR("empty method", " / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("two SPs after method", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("two SPs before version", "GET /  HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("HTAB as separator", "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("non-tchar in method", "GE(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("high byte in method", "G\xc3\x89T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("SP inside target", "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("CTL in target", "GET /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("NUL in target", "GET /a\0b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("DEL in target", "GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("high byte in target", "GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("HTAB in target", "GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("target not starting with /", "GET index.html HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("* with GET", "GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("*x with OPTIONS", "OPTIONS *x HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("authority-form (CONNECT) is not served", "CONNECT example.com:443 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("absolute-form with userinfo", "GET http://u@h/ HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ERR("absolute-form with empty host", "GET http:///x HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ERR("absolute-form with other scheme", "GET ftp://h/ HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ERR("lower-case HTTP", "GET / http/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("version without minor", "GET / HTTP/1\r\nHost: a\r\n\r\n", 400),
    ERR("version with 2-digit minor", "GET / HTTP/1.10\r\nHost: a\r\n\r\n", 400),
    ERR("version with 2-digit major", "GET / HTTP/11.1\r\nHost: a\r\n\r\n", 400),
    ERR("version with a leading zero in the major", "GET / HTTP/01.1\r\nHost: a\r\n\r\n", 400),
    ERR("version with a leading zero in the minor", "GET / HTTP/1.01\r\nHost: a\r\n\r\n", 400),
    ERR("version 1.2 with 2-digit minor", "GET / HTTP/1.20\r\nHost: a\r\n\r\n", 400),
    ERR("fragment only", "GET #/a HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("OPTIONS *? is not asterisk-form", "OPTIONS *?x HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("absolute-form with only a fragment as authority", "GET http://#a HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    ERR("SP after version", "GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400),
    ERR("HTTP/0.9 style request", "GET /\r\n\r\n", 400),
    ERR("bare LF after request line", "GET / HTTP/1.1\nHost: a\r\n\r\n", 400),
    ERR("bare CR after request line", "GET / HTTP/1.1\rHost: a\r\n\r\n", 400),
    ERR("bare LF as leading line", "\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("bare CR as leading line", "\r\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ERR("NUL first", "\0GET / HTTP/1.1\r\n\r\n", 400),
    /* --- version: 505 --- */
    ERR("HTTP/2.0", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    ERR("HTTP/1.2 without Host, like 1.1", "GET / HTTP/1.2\r\n\r\n", 400),
    ERR("HTTP/9.9", "GET / HTTP/9.9\r\nHost: a\r\n\r\n", 505),
    ERR("HTTP/0.0", "GET / HTTP/0.0\r\n\r\n", 505),
    ERR("HTTP/0.9", "GET / HTTP/0.9\r\n\r\n", 505),
    ERR("505 is decided before the field lines", "GET / HTTP/3.0\r\nbad line\r\n\r\n", 505),
    ERR("400 in the target wins over 505", "GET /\x01 HTTP/2.0\r\n\r\n", 400),

    /* --- field lines: 400 --- */
    ERR("bare LF ending a field line", "GET / HTTP/1.1\r\nHost: a\n\r\n", 400),
    ERR("bare LF as the final line", "GET / HTTP/1.1\r\nHost: a\r\n\n", 400),
    ERR("bare CR in a value", "GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", 400),
    ERR("CR then junk as the final line", "GET / HTTP/1.1\r\nHost: a\r\n\rX\r\n", 400),
    ERR("SP before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
    ERR("HTAB before colon", "GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", 400),
    ERR("empty field name", "GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n", 400),
    ERR("no colon", "GET / HTTP/1.1\r\nHost: a\r\nJunk\r\n\r\n", 400),
    ERR("non-tchar in name", "GET / HTTP/1.1\r\nHost: a\r\nX(y): b\r\n\r\n", 400),
    ERR("high byte in name", "GET / HTTP/1.1\r\nHost: a\r\nX\xc3\xa9: b\r\n\r\n", 400),
    ERR("obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", 400),
    ERR("obs-fold with HTAB", "GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n\tb\r\n\r\n", 400),
    ERR("whitespace before the first field", "GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400),
    ERR("NUL in value", "GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n", 400),
    ERR("DEL in value", "GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n", 400),
    ERR("VT in value", "GET / HTTP/1.1\r\nHost: a\r\nX: a\x0b\r\n\r\n", 400),
    ERR("ESC in name", "GET / HTTP/1.1\r\nHost: a\r\nX\x1b: a\r\n\r\n", 400),
    ERR("CTL in a partial line is rejected at once", "GET / HTTP/1.1\r\nHost: a\r\nX: \x01", 400),
    ERR("bare CR in a partial line is rejected at once", "GET / HTTP/1.1\r\nHost: a\r\nX: \rb", 400),
    ERR("obs-fold in a partial line is rejected at once", "GET / HTTP/1.1\r\nHost: a\r\n x", 400),
    /* --- Content-Length --- */
    ERR("CL with sign -", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n", 400),
    ERR("CL with sign +", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", 400),
    ERR("CL hex", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n", 400),
    ERR("CL list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", 400),
    ERR("CL with inner SP", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 5\r\n\r\n", 400),
    ERR("CL empty", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", 400),
    ERR("CL trailing junk", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5a\r\n\r\n", 400),
    ERR("CL 19 digits", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000000000000000\r\n\r\n", 400),
    ERR("CL repeated, identical", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 400),
    ERR("CL repeated, different", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 7\r\n\r\n", 400),
    /* --- Transfer-Encoding --- */
    ERR("TE empty", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", 400),
    ERR("TE chunked twice in a list", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400),
    ERR("TE header repeated", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    ERR("TE chunked not last", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
    ERR("TE empty list element first", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,chunked\r\n\r\n", 400),
    ERR("TE empty list element last", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked,\r\n\r\n", 400),
    ERR("CL.TE: both present", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    ERR("TE.CL: both present", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400),
    ERR("TE with unknown coding and CL: 400 wins", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\n", 400),
    ERR("TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    ERR("TE.TE: space before colon", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n", 400),
    ERR("TE.TE: obs-fold", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n", 400),
    ERR("TE.TE: VT before value", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\x0b" "chunked\r\n\r\n", 400),
    ERR("TE gzip", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    ERR("TE gzip, chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    ERR("TE.TE: xchunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n", 501),
    ERR("TE chunked with parameter", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", 501),
    ERR("TE identity", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", 501),
    /* --- Host --- */
    ERR("HTTP/1.1 without Host", "GET / HTTP/1.1\r\n\r\n", 400),
    ERR("two Host headers", "GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", 400),
    ERR("Host with SP", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
    ERR("Host with /", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
    ERR("Host with userinfo", "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400),
    ERR("invalid Host with an absolute-form target is still 400",
        "GET http://a.example/ HTTP/1.1\r\nHost: b:x\r\n\r\n", 400),
    ERR("valid target authority, second Host", "GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400),
    /* (every Host / authority shape: host_cases below) */

    /* --- limits at and over each boundary (small custom limits) --- */
    { .comment = "target of exactly max_uri (8)", IN("GET /2345678 HTTP/1.1\r\nHost: a\r\n\r\n"),
      .ret = ALL, .lim = &L_URI8, .method = "GET", .target = "/2345678", .path = "/2345678",
      .minor = 1, .nh = 1, .cl = -1, .host = 0 },
    ERRL("target of max_uri + 1", "GET /23456789 HTTP/1.1\r\nHost: a\r\n\r\n", 414, &L_URI8),
    ERRL("target over max_uri while incomplete", "GET /23456789", 414, &L_URI8),
    MOREL("target of max_uri while incomplete", "GET /2345678", &L_URI8),
    ERRL("414 wins over a bad byte after the limit", "GET /23456789\x01", 414, &L_URI8),
    ERRL("a bad byte before the limit wins", "GET /2\x01" "3456789", 400, &L_URI8),
    { .comment = "request line of exactly max_request_line (17)", IN("GET /a HTTP/1.1\r\nHost: a\r\n\r\n"),
      .ret = ALL, .lim = &L_RL17, .method = "GET", .target = "/a", .path = "/a",
      .minor = 1, .nh = 1, .cl = -1, .host = 0 },
    ERRL("request line of max_request_line + 1", "GET /ab HTTP/1.1\r\nHost: a\r\n\r\n", 414, &L_RL17),
    ERRL("request line over the limit by its LF", "GET /a HTTP/1.1\r\nHost: a\r\n\r\n", 414, &L_RL16),
    ERRL("request line over the limit while incomplete", "GET /abcdefghijk", 414, &L_RL16),
    ERRL("long method hits the request-line limit", "ABCDEFGHIJKLMNOPQRST", 414, &L_RL16),
    MOREL("request line of the limit while incomplete", "GET /a HTTP/1.1\r", &L_RL17),
    { .comment = "leading empty lines do not count toward the request line",
      IN("\r\n\r\nGET /a HTTP/1.1\r\nHost: a\r\n\r\n"),
      .ret = ALL, .lim = &L_RL17, .method = "GET", .target = "/a", .path = "/a",
      .minor = 1, .nh = 1, .cl = -1, .host = 0 },
    { .comment = "max_headers (2) fields", IN("GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n"),
      .ret = ALL, .lim = &L_NH2, .method = "GET", .target = "/", .path = "/",
      .minor = 1, .nh = 2, .cl = -1, .host = 0 },
    ERRL("max_headers + 1 fields", "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n", 431, &L_NH2),
    ERRL("max_headers + 1 fields, incomplete", "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n", 431, &L_NH2),
    { .comment = "header array capacity 2 is enough for 2", IN("GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n"),
      .ret = ALL, .cap = 2, .method = "GET", .target = "/", .path = "/",
      .minor = 1, .nh = 2, .cl = -1, .host = 0 },
    { .comment = "header array capacity 2 < 3 fields", IN("GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nY: 2\r\n\r\n"),
      .ret = -1, .status = 431, .cap = 2 },
    { .comment = "head of exactly max_header_bytes (27)", IN("GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
      .ret = ALL, .lim = &L_HB27, .method = "GET", .target = "/", .path = "/",
      .minor = 1, .nh = 1, .cl = -1, .host = 0 },
    ERRL("head of max_header_bytes + 1", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 431, &L_HB26),
    ERRL("head over the limit while incomplete", "GET / HTTP/1.1\r\nHost: a\r\n\r", 431, &L_HB26),
    ERRL("leading empty lines count toward max_header_bytes", "\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 431, &L_HB27),
    ERRL("syntax error in a line that crosses the limit: 431", "GET / HTTP/1.1\r\nHo st: a\r\n\r\n", 431, &L_HB20),
    ERRL("CTL before the byte limit: 400", "GET / HTTP/1.1\r\nH\x01st: a\r\n\r\n", 400, &L_HB20),
    ERRL("all limits 0: byte 0 is already over max_header_bytes", "GET / HTTP/1.1\r\n\r\n", 431, &L_ALL0),
    ERRL("all limits 0, empty line", "\r\n", 431, &L_ALL0),
    ERRL("all limits 0, no input: still over the limit", "", 431, &L_ALL0),
    ERRL("max_request_line 0", "G", 414, &L_RL0),
};

/* Rows built at run time (TEST_LIMITS, large inputs). */
static struct row big_rows[8];
static size_t n_big;

/* ----------------------------------------------------- running a request */

struct result {
    int ret, status;
    long method, target, path, query; /* offsets, -1 for NULL */
    size_t method_len, target_len, path_len, query_len;
    int minor;
    size_t nh;
    long long cl;
    unsigned flags;
    int host;
    long auth;
    size_t auth_len, host_len;
    long hoff[2 * 100];
    size_t hlen[2 * 100];
};

static long off(const char *p, const char *base) { return p ? (long)(p - base) : -1; }

static void run_parse(const struct row *r, const char *buf, size_t len, size_t last_len,
                      struct result *out)
{
    struct bb_header hdrs[100];
    struct bb_request req;
    struct bb_limits lim = TEST_LIMITS;
    if (r->lim) {
        lim.max_request_line = r->lim->rl;
        lim.max_uri = r->lim->uri;
        lim.max_headers = r->lim->nh;
        lim.max_header_bytes = r->lim->hb;
    }
    memset(&req, 0, sizeof(req));
    req.headers = hdrs;
    req.num_headers = r->cap ? r->cap : 100;
    size_t cap_in = req.num_headers;
    memset(out, 0, sizeof(*out));
    out->ret = bb_parse_request(buf, len, last_len, &req, &lim);
    if (out->ret == -2 && req.num_headers != cap_in) out->ret = -999; /* must not touch num_headers */
    if (out->ret == -1) out->status = req.status;
    if (out->ret < 0) return;
    out->method = off(req.method, buf);
    out->target = off(req.target, buf);
    out->path = off(req.path, buf);
    out->query = off(req.query, buf);
    out->method_len = req.method_len;
    out->target_len = req.target_len;
    out->path_len = req.path_len;
    out->query_len = req.query_len;
    out->minor = req.minor_version;
    out->nh = req.num_headers;
    out->cl = req.content_length;
    out->flags = req.flags;
    out->host = req.host_index;
    out->auth = off(req.authority, buf);
    out->auth_len = req.authority_len;
    out->host_len = req.host_len;
    for (size_t i = 0; i < req.num_headers && i < 100; i++) {
        out->hoff[2 * i] = off(hdrs[i].name, buf);
        out->hlen[2 * i] = hdrs[i].name_len;
        out->hoff[2 * i + 1] = off(hdrs[i].value, buf);
        out->hlen[2 * i + 1] = hdrs[i].value_len;
    }
}

static int same_result(const struct result *a, const struct result *b)
{
    return memcmp(a, b, sizeof(*a)) == 0;
}

static int str_eq(const char *base, long o, size_t n, const char *want)
{
    if (!want) return o == -1;
    return o >= 0 && strlen(want) == n && memcmp(base + o, want, n) == 0;
}

/* Checks a one-shot result against the row; returns NULL or what differs. */
static const char *check_row(const struct row *r, const char *buf, const struct result *g)
{
    int want = r->ret == ALL ? (int)r->len : r->ret;
    if (g->ret != want) return "return value";
    if (g->ret == -1 && g->status != r->status) return "status";
    if (g->ret < 0) return NULL;
    if (!str_eq(buf, g->method, g->method_len, r->method)) return "method";
    if (!str_eq(buf, g->target, g->target_len, r->target)) return "target";
    if (!str_eq(buf, g->path, g->path_len, r->path)) return "path";
    if (!str_eq(buf, g->query, g->query_len, r->query)) return "query";
    if (g->minor != r->minor) return "minor_version";
    if ((int)g->nh != r->nh) return "num_headers";
    if (g->cl != r->cl) return "content_length";
    if (g->flags != r->flags) return "flags";
    if (g->host != r->host) return "host_index";
    if (r->auth == NO_AUTH && g->auth != -1) return "authority (expected none)";
    if (r->auth && r->auth != NO_AUTH) {
        if (!str_eq(buf, g->auth, g->auth_len, r->auth)) return "authority";
        if (!str_eq(buf, g->auth, g->host_len, r->hname)) return "authority: host part";
        if (g->host_len < g->auth_len && buf[g->auth + (long)g->host_len] != ':') return "authority: ':' after host";
    }
    for (int i = 0; i < 8 && r->h[i]; i++)
        if (!str_eq(buf, g->hoff[i], g->hlen[i], r->h[i])) return "header name/value";
    /* every pointer lies inside the head */
    long lim = g->ret;
    if (g->method + (long)g->method_len > lim || g->target + (long)g->target_len > lim ||
        g->path + (long)g->path_len > lim || g->query + (long)g->query_len > lim ||
        g->auth + (long)g->auth_len > lim) return "pointer bounds";
    return NULL;
}

static void report(int ok, const char *impl, const char *what, const char *comment, const char *why)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL [%s] %s: %s (%s)\n", impl, what, comment, why ? why : "");
}

static void describe(const struct result *g)
{
    printf("      got ret=%d status=%d\n", g->ret, g->status);
}

static void splits_for(size_t len, size_t k, int *use)
{
    *use = len <= SPLIT_ALL || k < 300 || len - k < 300 || k % 61 == 0 ||
           (k > 8180 && k < 8200) || (k > 65520 && k < 65545);
}

static void test_row(const struct row *r, const char *impl)
{
    struct result one, got;
    char *buf = guarded(r->in, r->len);
    run_parse(r, buf, r->len, 0, &one);
    const char *why = check_row(r, buf, &one);
    report(why == NULL, impl, "one-shot", r->comment, why);
    if (why) describe(&one);

    /* every split into two calls */
    int ok = 1;
    for (size_t k = 1; k < r->len && ok; k++) {
        int use;
        splits_for(r->len, k, &use);
        if (!use) continue;
        char *p = guarded(r->in, k);
        run_parse(r, p, k, 0, &got);
        if (got.ret == -2) {
            p = guarded(r->in, r->len);
            run_parse(r, p, r->len, k, &got);
        } else if (got.ret >= 0) {
            /* complete within the prefix: offsets are relative to p, same as one-shot */
        }
        if (!same_result(&got, &one)) {
            printf("      split at %zu: ", k);
            describe(&got);
            ok = 0;
        }
    }
    report(ok, impl, "every split", r->comment, NULL);

    /* byte at a time */
    ok = 1;
    size_t last = 0;
    got.ret = -2;
    for (size_t k = 1; k <= r->len; k++) {
        char *p = guarded(r->in, k);
        run_parse(r, p, k, last, &got);
        if (got.ret != -2) break;
        last = k;
    }
    if (r->len == 0) run_parse(r, guarded(r->in, 0), 0, 0, &got);
    if (!same_result(&got, &one)) {
        printf("      byte at a time: ");
        describe(&got);
        ok = 0;
    }
    report(ok, impl, "byte at a time", r->comment, NULL);
}

static char *repeat_into(char *p, int c, size_t n)
{
    memset(p, c, n);
    return p + n;
}

static void build_big_rows(void)
{
    static char a[9000], b[9000], c[70000], d[70000], e[4000], long_target[8178];
    char *p;
    struct row *r;

    /* target of 8177 bytes: the request line is exactly 8192 */
    p = a;
    p += sprintf(p, "GET /");
    p = repeat_into(p, 'a', 8176);
    p += sprintf(p, " HTTP/1.1\r\nHost: a\r\n\r\n");
    memcpy(long_target, a + 4, 8177);
    r = &big_rows[n_big++];
    *r = (struct row){ .comment = "test limits: request line of exactly 8192", .in = a,
                       .len = (size_t)(p - a), .ret = ALL, .method = "GET", .target = long_target,
                       .path = long_target, .minor = 1, .nh = 1, .cl = -1, .host = 0 };

    p = b;
    p += sprintf(p, "GET /");
    p = repeat_into(p, 'a', 8192);
    p += sprintf(p, " HTTP/1.1\r\nHost: a\r\n\r\n");
    r = &big_rows[n_big++];
    *r = (struct row){ .comment = "test limits: target of 8193", .in = b,
                       .len = (size_t)(p - b), .ret = -1, .status = 414 };

    p = c;
    p += sprintf(p, "GET / HTTP/1.1\r\nHost: a\r\nX: ");
    p = repeat_into(p, 'v', 65536 - 28 - 4 + 1); /* total 65537 */
    p += sprintf(p, "\r\n\r\n");
    r = &big_rows[n_big++];
    *r = (struct row){ .comment = "test limits: head over 64 KiB", .in = c,
                       .len = (size_t)(p - c), .ret = -1, .status = 431 };

    p = d;
    p += sprintf(p, "GET / HTTP/1.1\r\nHost: a\r\nX: ");
    p = repeat_into(p, 'v', 65536 - 28 - 4); /* total exactly 65536 */
    p += sprintf(p, "\r\n\r\n");
    r = &big_rows[n_big++];
    *r = (struct row){ .comment = "test limits: head of exactly 64 KiB", .in = d,
                       .len = (size_t)(p - d), .ret = ALL, .method = "GET", .target = "/",
                       .path = "/", .minor = 1, .nh = 2, .cl = -1, .host = 0 };

    p = e;
    p += sprintf(p, "GET / HTTP/1.1\r\nHost: a\r\n");
    for (int i = 0; i < 100; i++) p += sprintf(p, "X%d: v\r\n", i);
    p += sprintf(p, "\r\n");
    r = &big_rows[n_big++];
    *r = (struct row){ .comment = "test limits: 101 fields", .in = e,
                       .len = (size_t)(p - e), .ret = -1, .status = 431 };
}

/* ------------------------------------------------- Host and authority */

/*
 * Each value is tried as a Host field ("GET / ... Host: V") and as the authority
 * of an absolute-form target ("GET http://V/p ... Host: x"); both must agree
 * (same rules), except where noted. host: the expected uri-host when accepted.
 */
struct hcase {
    const char *value;
    int field_ok;  /* 1: accepted as Host, 0: 400 */
    int target_ok; /* 1: accepted in the target, 0: 400, -1: not tried (the value holds '/', '?' or '#') */
    const char *host;
};

static const struct hcase host_cases[] = {
    /* valid */
    { "example.com", 1, 1, "example.com" },
    { "example.com:8080", 1, 1, "example.com" },
    { "EXAMPLE.com.:443", 1, 1, "EXAMPLE.com." },
    { "127.0.0.1:80", 1, 1, "127.0.0.1" },
    { "1.2.3.999", 1, 1, "1.2.3.999" }, /* not an IPv4address, but a valid reg-name */
    { "a-b_c.~!$&'()*+,;=", 1, 1, "a-b_c.~!$&'()*+,;=" },
    { "%41%7e.example", 1, 1, "%41%7e.example" },
    { "h:0", 1, 1, "h" },
    { "h:65535", 1, 1, "h" },
    { "h:000080", 1, 1, "h" },
    { "[::1]", 1, 1, "[::1]" },
    { "[::1]:8080", 1, 1, "[::1]" },
    { "[::]", 1, 1, "[::]" },
    { "[2001:DB8::a:1]:443", 1, 1, "[2001:DB8::a:1]" },
    { "[1:2:3:4:5:6:7:8]", 1, 1, "[1:2:3:4:5:6:7:8]" },
    { "[1:2:3:4:5:6:7::]", 1, 1, "[1:2:3:4:5:6:7::]" },
    { "[::2:3:4:5:6:7:8]", 1, 1, "[::2:3:4:5:6:7:8]" },
    { "[1::8]", 1, 1, "[1::8]" },
    { "[::ffff:192.0.2.1]", 1, 1, "[::ffff:192.0.2.1]" },
    { "[1:2:3:4:5:6:255.255.255.255]", 1, 1, "[1:2:3:4:5:6:255.255.255.255]" },
    { "[::1.2.3.4]:1", 1, 1, "[::1.2.3.4]" },
    { "", 1, 0, "" }, /* an empty Host is valid; an empty host in a URI is not */
    /* invalid: port */
    { "foo:abc", 0, 0, NULL },
    { "a:1:2", 0, 0, NULL },
    { "h:", 0, 0, NULL },
    { "h:65536", 0, 0, NULL },
    { "h:99999999999", 0, 0, NULL },
    { "h:99999999999999999999999", 0, 0, NULL },
    { "h:-1", 0, 0, NULL },
    { "h:+80", 0, 0, NULL },
    { "h:8a", 0, 0, NULL },
    { "h: 80", 0, 0, NULL },
    { ":80", 0, 0, NULL }, /* empty host */
    { ":", 0, 0, NULL },
    /* invalid: reg-name bytes */
    { "a b", 0, 0, NULL },
    { "a\tb", 0, 0, NULL },
    { "u@h", 0, 0, NULL },
    { "@h", 0, 0, NULL },
    { "a/b", 0, -1, NULL },
    { "a?b", 0, -1, NULL },
    { "a#b", 0, -1, NULL },
    { "a\"b", 0, 0, NULL },
    { "a<b>", 0, 0, NULL },
    { "a\\b", 0, 0, NULL },
    { "a^b", 0, 0, NULL },
    { "a{b}", 0, 0, NULL },
    { "a|b", 0, 0, NULL },
    { "a`b", 0, 0, NULL },
    { "caf\xc3\xa9", 0, 0, NULL }, /* obs-text: allowed in field values, not in a host */
    { "%", 0, 0, NULL },
    { "a%4", 0, 0, NULL },
    { "a%zz", 0, 0, NULL },
    { "a%4:80", 0, 0, NULL },
    { "]", 0, 0, NULL },
    { "a[b]", 0, 0, NULL },
    /* invalid: IP-literal */
    { "[::1", 0, 0, NULL },
    { "[::1]x", 0, 0, NULL },
    { "[::1]:", 0, 0, NULL },
    { "[::1]:99999", 0, 0, NULL },
    { "[::1]]", 0, 0, NULL },
    { "[[::1]]", 0, 0, NULL },
    { "[]", 0, 0, NULL },
    { "[:]", 0, 0, NULL },
    { "[:::]", 0, 0, NULL },
    { "[:::1]", 0, 0, NULL },
    { "[:1]", 0, 0, NULL },
    { "[1:]", 0, 0, NULL },
    { "[1::2::3]", 0, 0, NULL },
    { "[12345::]", 0, 0, NULL },
    { "[::g]", 0, 0, NULL },
    { "[1:2:3:4:5:6:7]", 0, 0, NULL },
    { "[1:2:3:4:5:6:7:8:9]", 0, 0, NULL },
    { "[1:2:3:4:5:6:7:8::]", 0, 0, NULL },
    { "[::1:2:3:4:5:6:7:8]", 0, 0, NULL },
    { "[1:2:3:4:5:6:7:1.2.3.4]", 0, 0, NULL },
    { "[::1.2.3.256]", 0, 0, NULL },
    { "[::1.2.3]", 0, 0, NULL },
    { "[::1.2.3.4.5]", 0, 0, NULL },
    { "[::01.2.3.4]", 0, 0, NULL },
    { "[::1.2.3.4:1]", 0, 0, NULL },
    { "[::a.2.3.4]", 0, 0, NULL },
    { "[1.2.3.4]", 0, 0, NULL },
    { "[fe80::1%25eth0]", 0, 0, NULL }, /* zone ID (RFC 6874): not in HTTP's Host */
    { "[fe80::1%eth0]", 0, 0, NULL },
    { "[v1.x]", 0, 0, NULL },           /* IPvFuture: no such address can reach us */
    { "[example.com]", 0, 0, NULL },
};

#define N_HOST_CASES (sizeof(host_cases) / sizeof(host_cases[0]))
static struct row host_rows[2 * N_HOST_CASES];
static size_t n_host_rows;

static void build_host_rows(void)
{
    static char bufs[2 * N_HOST_CASES][256], targets[N_HOST_CASES][128], comments[2 * N_HOST_CASES][128];
    for (size_t i = 0; i < N_HOST_CASES; i++) {
        const struct hcase *c = &host_cases[i];
        struct row *r = &host_rows[n_host_rows];
        char *in = bufs[n_host_rows];
        int n = snprintf(in, sizeof(bufs[0]), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", c->value);
        snprintf(comments[n_host_rows], sizeof(comments[0]), "Host: \"%s\"", c->value);
        if (c->field_ok)
            *r = (struct row){ .in = in, .len = (size_t)n, .ret = ALL, .method = "GET", .target = "/",
                               .path = "/", .minor = 1, .nh = 1, .cl = -1, .host = 0, .auth = c->value,
                               .hname = c->host };
        else
            *r = (struct row){ .in = in, .len = (size_t)n, .ret = -1, .status = 400 };
        r->comment = comments[n_host_rows++];
        if (c->target_ok < 0) continue;

        r = &host_rows[n_host_rows];
        in = bufs[n_host_rows];
        n = snprintf(in, sizeof(bufs[0]), "GET http://%s/p HTTP/1.1\r\nHost: x\r\n\r\n", c->value);
        snprintf(targets[i], sizeof(targets[0]), "http://%s/p", c->value);
        snprintf(comments[n_host_rows], sizeof(comments[0]), "target \"http://%s/p\"", c->value);
        if (c->target_ok)
            *r = (struct row){ .in = in, .len = (size_t)n, .ret = ALL, .method = "GET", .target = targets[i],
                               .path = "/p", .minor = 1, .nh = 1, .cl = -1, .flags = BB_F_ABSOLUTE_FORM,
                               .host = 0, .auth = c->value, .hname = c->host };
        else
            *r = (struct row){ .in = in, .len = (size_t)n, .ret = -1, .status = 400 };
        r->comment = comments[n_host_rows++];
    }
}

/* ------------------------------------------------------------- chunked */

struct crow {
    const char *comment;
    const char *in;
    size_t len;
    long ret;             /* >= 0 trailing bytes, -1, -2 */
    int status;
    const char *out;      /* decoded body */
    size_t out_len;
    size_t max_ext, max_tr;
};

#define CIN(s) .in = s, .len = sizeof(s) - 1
#define COUT(s) .out = s, .out_len = sizeof(s) - 1
#define COK(c, s, o, tr) { .comment = c, CIN(s), COUT(o), .ret = tr }
#define CERR(c, s, st) { .comment = c, CIN(s), .ret = -1, .status = st }
#define CMORE(c, s, o) { .comment = c, CIN(s), COUT(o), .ret = -2 }

#define X50 "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"
#define X200 X50 X50 X50 X50
#define X300 X200 X50 X50

static const struct crow crows[] = {
    COK("one chunk", "5\r\nhello\r\n0\r\n\r\n", "hello", 0),
    COK("empty body", "0\r\n\r\n", "", 0),
    COK("several chunks, hex in both cases", "3\r\nabc\r\na\r\n0123456789\r\nA\r\nABCDEFGHIJ\r\n0\r\n\r\n",
        "abc0123456789ABCDEFGHIJ", 0),
    COK("leading zeros, 16 digits", "0000000000000003\r\nabc\r\n0\r\n\r\n", "abc", 0),
    COK("extension", "5;foo=bar\r\nhello\r\n0;last\r\n\r\n", "hello", 0),
    COK("extensions with BWS and quoted string",
        "5 ; a = \"x\\\"y; z\" ;b;c=d \t;e\r\nhello\r\n0\r\n\r\n", "hello", 0),
    COK("trailers", "5\r\nhello\r\n0\r\nX-Sum: abc\r\nY:\r\nZ: caf\xc3\xa9\t!\r\n\r\n", "hello", 0),
    COK("pipelined bytes after the body", "2\r\nhi\r\n0\r\n\r\nGET / HTTP/1.1\r\n", "hi", 16),
    COK("CRLF inside the data is data", "4\r\n\r\n\r\n\r\n0\r\n\r\n", "\r\n\r\n", 0),
    COK("chunks larger than a read", "12c\r\n" X300 "\r\n" "c8;x=1\r\n" X200 "\r\n0\r\n\r\n", X300 X200, 0),
    CMORE("nothing", "", ""),
    CMORE("partial data", "5\r\nhel", "hel"),
    CMORE("missing final CRLF", "5\r\nhello\r\n0\r\n", "hello"),
    CMORE("in a trailer", "0\r\nX: y", ""),
    CMORE("largest chunk size", "7fffffffffffffff\r\nabc", "abc"),
    CERR("empty size line", "\r\n", 400),
    CERR("non-hex size", "g\r\n", 400),
    CERR("negative size", "-5\r\nhello\r\n0\r\n\r\n", 400),
    CERR("0x prefix", "0x5\r\nhello\r\n0\r\n\r\n", 400),
    CERR("leading SP", " 5\r\nhello\r\n0\r\n\r\n", 400),
    CERR("trailing BWS without extension", "5 \r\nhello\r\n0\r\n\r\n", 400),
    CERR("17 hex digits", "00000000000000005\r\nhello\r\n0\r\n\r\n", 400),
    CERR("size over INT64_MAX", "8000000000000000\r\n", 400),
    CERR("size 2^64 - 1", "ffffffffffffffff\r\n", 400),
    CERR("bare LF after size", "5\nhello\r\n0\r\n\r\n", 400),
    CERR("bare CR after size", "5\rhello\r\n0\r\n\r\n", 400),
    CERR("data longer than the size", "5\r\nhelloX\r\n0\r\n\r\n", 400),
    CERR("bare LF after data", "5\r\nhello\n0\r\n\r\n", 400),
    CERR("CR junk after data", "5\r\nhello\rX0\r\n\r\n", 400),
    CERR("empty extension", "5;\r\nhello\r\n0\r\n\r\n", 400),
    CERR("extension without name", "5;=x\r\nhello\r\n0\r\n\r\n", 400),
    CERR("extension value missing", "5;a=\r\nhello\r\n0\r\n\r\n", 400),
    CERR("extension with CTL", "5;a\x01\r\nhello\r\n0\r\n\r\n", 400),
    CERR("extension with bare LF", "5;a\nhello\r\n0\r\n\r\n", 400),
    CERR("unterminated quoted string", "5;a=\"x\r\nhello\r\n0\r\n\r\n", 400),
    CERR("BWS at the end of an extension", "5;a \r\nhello\r\n0\r\n\r\n", 400),
    CERR("trailer obs-fold", "0\r\nX: a\r\n b\r\n\r\n", 400),
    CERR("trailer without colon", "0\r\nX\r\n\r\n", 400),
    CERR("trailer SP before colon", "0\r\nX : a\r\n\r\n", 400),
    CERR("trailer empty name", "0\r\n: a\r\n\r\n", 400),
    CERR("trailer NUL in value", "0\r\nX: a\0\r\n\r\n", 400),
    CERR("trailer bare LF", "0\r\nX: a\n\r\n", 400),
    CERR("final line bare LF", "0\r\n\n", 400),
    CERR("final line CR junk", "0\r\n\rX", 400),
    { .comment = "extension of exactly max_chunk_ext (8)", CIN("1;abcdefg\r\nx\r\n0\r\n\r\n"),
      COUT("x"), .ret = 0, .max_ext = 8 },
    { .comment = "extension of max_chunk_ext + 1", CIN("1;abcdefgh\r\nx\r\n0\r\n\r\n"),
      .ret = -1, .status = 400, .max_ext = 8 },
    { .comment = "extension limit applies to each size line", CIN("1;abcdefg\r\nx\r\n1;abcdefg\r\ny\r\n0\r\n\r\n"),
      COUT("xy"), .ret = 0, .max_ext = 8 },
    { .comment = "trailers of exactly max_trailer_bytes (10)", CIN("0\r\nX: abc\r\n\r\n"),
      COUT(""), .ret = 0, .max_tr = 10 },
    { .comment = "trailers of max_trailer_bytes + 1", CIN("0\r\nX: abcd\r\n\r\n"),
      .ret = -1, .status = 431, .max_tr = 10 },
    { .comment = "trailers over the limit while incomplete", CIN("0\r\nX: abcdefghijk"),
      .ret = -1, .status = 431, .max_tr = 10 },
};

struct cresult {
    long ret;
    int status;
    char out[1024];
    size_t out_len;
    char rest[1024];
    size_t rest_len;
};

static void cr_append(char *dst, size_t *dlen, const char *src, size_t n)
{
    if (*dlen + n > 1024) n = 1024 - *dlen;
    memcpy(dst + *dlen, src, n);
    *dlen += n;
}

/* Feeds r->in in pieces ending at each cut[i]; records the final answer. */
static void run_chunked(const struct crow *r, const size_t *cuts, size_t ncuts, struct cresult *res)
{
    struct bb_chunked_decoder d;
    bb_chunked_init(&d);
    d.max_chunk_ext = r->max_ext;
    d.max_trailer_bytes = r->max_tr;
    memset(res, 0, sizeof(*res));
    size_t start = 0;
    res->ret = -2;
    for (size_t i = 0; i < ncuts; i++) {
        size_t n = cuts[i] - start;
        char *p = guarded(r->in + start, n);
        size_t sz = n;
        long ret = bb_decode_chunked(&d, p, &sz);
        if (sz > n) {
            res->ret = -999;
            return;
        }
        cr_append(res->out, &res->out_len, p, sz);
        res->ret = ret;
        if (ret == -1) {
            res->status = d.status;
            return;
        }
        if (ret >= 0) {
            /* the rest of this piece, then every later byte, follows the body */
            cr_append(res->rest, &res->rest_len, p + sz, (size_t)ret);
            cr_append(res->rest, &res->rest_len, r->in + cuts[i], r->len - cuts[i]);
            res->ret = (long)res->rest_len;
            return;
        }
        start = cuts[i];
    }
}

static int cresult_eq(const struct cresult *a, const struct cresult *b)
{
    return a->ret == b->ret && a->status == b->status && a->out_len == b->out_len &&
           memcmp(a->out, b->out, a->out_len) == 0 && a->rest_len == b->rest_len &&
           memcmp(a->rest, b->rest, a->rest_len) == 0;
}

static void test_crow(const struct crow *r)
{
    struct cresult one, got;
    size_t cuts[2];
    size_t *bytes = malloc((r->len + 1) * sizeof(size_t));
    const char *why = NULL;

    cuts[0] = r->len;
    run_chunked(r, cuts, 1, &one);
    if (one.ret != r->ret) why = "return value";
    else if (one.ret == -1 && one.status != r->status) why = "status";
    else if (one.ret != -1 && (one.out_len != r->out_len || memcmp(one.out, r->out, r->out_len)))
        why = "decoded body";
    else if (one.ret >= 0 && memcmp(one.rest, r->in + r->len - one.ret, (size_t)one.ret)) why = "rest";
    if (why) printf("      got ret=%ld status=%d out_len=%zu\n", one.ret, one.status, one.out_len);
    report(why == NULL, "chunked", "one-shot", r->comment, why);

    int ok = 1;
    for (size_t k = 1; k < r->len; k++) {
        cuts[0] = k;
        cuts[1] = r->len;
        run_chunked(r, cuts, 2, &got);
        if (!cresult_eq(&got, &one)) {
            printf("      split at %zu: ret=%ld\n", k, got.ret);
            ok = 0;
            break;
        }
    }
    report(ok, "chunked", "every split", r->comment, NULL);

    for (size_t k = 0; k < r->len; k++) bytes[k] = k + 1;
    run_chunked(r, bytes, r->len, &got);
    if (r->len == 0) got = one;
    report(cresult_eq(&got, &one), "chunked", "byte at a time", r->comment, NULL);
    free(bytes);
}

/* ------------------------------------------------------------ misc tests */

static void check(int ok, const char *what)
{
    report(ok, "misc", what, "", NULL);
}

static void misc_tests(void)
{
    struct bb_limits lim = TEST_LIMITS;

    /* fields of a failed parse do not matter, but num_headers must survive -1 too */
    struct bb_header h[4];
    struct bb_request req = { .headers = h, .num_headers = 4 };
    const char *bad = "GET / HTTP/1.1\r\nHost : a\r\n\r\n";
    check(bb_parse_request(bad, strlen(bad), 0, &req, &lim) == -1 && req.status == 400 &&
          req.num_headers == 4, "num_headers untouched on error");

    /* decoder: calling again after completion returns everything as trailing */
    struct bb_chunked_decoder d;
    bb_chunked_init(&d);
    char buf[32] = "0\r\n\r\nabc";
    size_t sz = 8;
    long r1 = bb_decode_chunked(&d, buf, &sz);
    check(r1 == 3 && sz == 0 && memcmp(buf, "abc", 3) == 0, "decoder keeps pipelined bytes");
    sz = 3;
    check(bb_decode_chunked(&d, buf, &sz) == 3 && sz == 0, "decoder after completion");
    /* decoder stays failed */
    bb_chunked_init(&d);
    memcpy(buf, "x", 1);
    sz = 1;
    check(bb_decode_chunked(&d, buf, &sz) == -1 && d.status == 400, "decoder error");
    memcpy(buf, "0\r\n\r\n", 5);
    sz = 5;
    check(bb_decode_chunked(&d, buf, &sz) == -1, "decoder stays in error");
}

/* A bad byte at every offset of a long target / value: exercises each lane of the 16-byte scanners. */
static void scanner_offsets(const char *impl)
{
    static const unsigned char bad_target[] = { 0x00, 0x01, 0x09, 0x20, 0x7f, 0x80, 0xff };
    static const unsigned char bad_value[] = { 0x00, 0x01, 0x0a, 0x0d, 0x1f, 0x7f };
    char in[256];
    struct bb_header h[8];
    struct bb_request req;
    struct bb_limits lim = TEST_LIMITS;
    int ok = 1;
    for (size_t off = 0; off < 48; off++) {
        for (size_t j = 0; j < sizeof(bad_target); j++) {
            int n = snprintf(in, sizeof(in), "GET /%.*s", (int)off, "0123456789abcdef0123456789abcdef0123456789abcdef");
            in[n++] = (char)bad_target[j];
            n += snprintf(in + n, sizeof(in) - (size_t)n, "x HTTP/1.1\r\nHost: a\r\n\r\n");
            req.headers = h;
            req.num_headers = 8;
            char *p = guarded(in, (size_t)n);
            int r = bb_parse_request(p, (size_t)n, 0, &req, &lim);
            if (r != -1 || req.status != 400) ok = 0;
        }
        for (size_t j = 0; j < sizeof(bad_value); j++) {
            int n = snprintf(in, sizeof(in), "GET / HTTP/1.1\r\nHost: a\r\nX: %.*s", (int)off,
                             "0123456789abcdef0123456789abcdef0123456789abcdef");
            in[n++] = (char)bad_value[j];
            n += snprintf(in + n, sizeof(in) - (size_t)n, "yz\r\n\r\n");
            req.headers = h;
            req.num_headers = 8;
            char *p = guarded(in, (size_t)n);
            int r = bb_parse_request(p, (size_t)n, 0, &req, &lim);
            if (r != -1 || req.status != 400) ok = 0;
        }
        /* and a clean value of every length up to 48 */
        int n = snprintf(in, sizeof(in), "GET /%.*s HTTP/1.1\r\nHost: a\r\nX: \t%.*s\xc3\r\n\r\n", (int)off,
                         "0123456789abcdef0123456789abcdef0123456789abcdef", (int)off,
                         "0123456789abcdef0123456789abcdef0123456789abcdef");
        req.headers = h;
        req.num_headers = 8;
        char *p = guarded(in, (size_t)n);
        if (bb_parse_request(p, (size_t)n, 0, &req, &lim) != n || req.headers[1].value_len != off + 1 ||
            req.target_len != off + 1) ok = 0;
    }
    report(ok, impl, "scanner lanes", "bad byte at every offset 0..47", NULL);
}

/* bb_field_value_end, the rule a response's field value is checked by (bb_respond.c): every byte at
 * every offset 0..47 (each lane of the 16-byte scanner); only 0x00-0x08, 0x0A-0x1F and 0x7F stop it. */
static void field_value_rule(const char *impl)
{
    char in[64];
    int ok = 1;
    for (size_t off = 0; off < 48; off++) {
        for (unsigned b = 0; b < 256; b++) {
            memset(in, 'v', sizeof(in));
            in[off] = (char)b;
            int bad = (b < 0x20 && b != '\t') || b == 0x7f;
            char *p = guarded(in, 49);
            size_t end = bb_field_value_end(p, 49);
            if (end != (bad ? off : 49)) ok = 0;
        }
    }
    report(ok, impl, "field value rule", "CTL but HTAB, and DEL, at every offset 0..47", NULL);
    char *p = guarded("", 0);
    report(bb_field_value_end(p, 0) == 0, impl, "field value rule", "an empty value", NULL);
}

int main(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    build_big_rows();
    build_host_rows();
    misc_tests();

    int impls[2] = { 0, 1 };
    for (int ii = 0; ii < 2; ii++) {
        if (bb_http_force_impl(impls[ii]) != 0) {
            printf("note: SSE4.2 not available, the SIMD pass is skipped\n");
            continue;
        }
        const char *impl = bb_http_impl();
        check(strcmp(impl, impls[ii] ? "sse4.2" : "scalar") == 0, "bb_http_impl");
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) test_row(&rows[i], impl);
        for (size_t i = 0; i < n_big; i++) test_row(&big_rows[i], impl);
        for (size_t i = 0; i < n_host_rows; i++) test_row(&host_rows[i], impl);
        scanner_offsets(impl);
        field_value_rule(impl);
    }
    for (size_t i = 0; i < sizeof(crows) / sizeof(crows[0]); i++) test_crow(&crows[i]);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
