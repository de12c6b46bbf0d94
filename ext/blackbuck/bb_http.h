/*
 * bb_http.h - Blackbuck's HTTP/1.x request parser and chunked decoder.
 *
 * Pure C99: no Ruby, no allocation, no global mutable state except the
 * one-time CPU feature probe. Every output is a pointer into the caller's
 * buffer. Contract of every parse function:
 *
 *     > 0   bytes consumed (the request head, including the final CRLF CRLF)
 *      -1   error: the HTTP status to answer with is in the output's `status`
 *      -2   incomplete: call again with more bytes
 *
 * Limits on the head are passed in by the caller (struct bb_limits): they are
 * settings of the server (Native.configure, from lib/blackbuck/config.rb), and
 * the parser has no defaults of its own for them. The chunked decoder's two
 * limits are the parser's own (below). Incomplete input that already exceeds a
 * limit is an error, not "incomplete", so a client cannot make the server
 * buffer without bound.
 */
#ifndef BB_HTTP_H
#define BB_HTTP_H

#include <stddef.h>
#include <stdint.h>

/* The chunked decoder's limits (no setting changes them; a decoder may pass its own, for tests). */
#define BB_DEFAULT_MAX_CHUNK_EXT     1024         /* chunk-ext bytes on one chunk-size line -> 400 */
#define BB_DEFAULT_MAX_TRAILER_BYTES (16 * 1024)  /* trailer section of a chunked body -> 431 */

/* Limits on a request head; the caller's (the server's settings of the same names). */
struct bb_limits {
    size_t max_request_line;  /* bytes: method SP target SP version CRLF -> 414 */
    size_t max_uri;           /* bytes: request-target alone -> 414 */
    size_t max_headers;       /* count of header fields -> 431; must be <= the caller's header array capacity */
    size_t max_header_bytes;  /* bytes: whole head incl. request line -> 431 */
};

struct bb_header {
    const char *name;   /* not NUL-terminated */
    size_t name_len;
    const char *value;  /* leading/trailing OWS stripped */
    size_t value_len;
};

/* Framing flags set by bb_parse_request (bitwise OR into req->flags). */
#define BB_F_CHUNKED         0x01u /* chunked Transfer-Encoding, the only one accepted */
#define BB_F_CONN_CLOSE      0x02u /* Connection header contains token "close" */
#define BB_F_CONN_KEEPALIVE  0x04u /* Connection header contains token "keep-alive" */
#define BB_F_EXPECT_CONTINUE 0x08u /* Expect: 100-continue (case-insensitive) */
#define BB_F_UPGRADE         0x10u /* Connection contains "upgrade" */
#define BB_F_ABSOLUTE_FORM   0x20u /* absolute-form target: `authority` is the target's, not Host's */

struct bb_request {
    const char *method;
    size_t method_len;
    const char *target;        /* request-target as sent (origin-form, absolute-form, '*'), up to a '#' */
    size_t target_len;
    const char *path;          /* target up to '?' or end (for absolute-form: the path part, "/" if empty) */
    size_t path_len;
    const char *query;         /* after '?', excluding '?'; NULL if no '?' */
    size_t query_len;
    int minor_version;         /* 0 for HTTP/1.0; 1 for HTTP/1.1 and any higher HTTP/1.x (RFC 9110 2.5) */
    struct bb_header *headers; /* in: caller's array; out: filled */
    size_t num_headers;        /* in: capacity of headers; out: count */
    int64_t content_length;    /* -1 when absent */
    int host_index;            /* index into headers of Host, -1 when absent */
    const char *authority;     /* uri-host [":" port] the request is for: an absolute-form target's
                                  authority (BB_F_ABSOLUTE_FORM), else Host's value; NULL if neither.
                                  Always valid (see bb_parse_request); empty only for an empty Host */
    size_t authority_len;
    size_t host_len;           /* authority[0..host_len) is the uri-host ("[v6]" with brackets); when
                                  host_len < authority_len, authority[host_len] is ':' and the port
                                  follows: 1*DIGIT (leading zeros allowed) of value <= 65535 */
    unsigned flags;            /* BB_F_* */
    int status;                /* on -1: 400, 414, 431, 501 or 505 */
};

/*
 * Parses one request head from buf[0..len).
 * last_len: how many bytes of buf were already seen by an earlier call that
 * returned -2 (0 on the first call); only the new bytes are rescanned for the
 * end of the head.
 *
 * A fragment ("#..." in the target, which RFC 9112 does not allow there) is
 * dropped: it is in none of target, path and query. An HTTP/1.x version with
 * a minor above 1 is parsed as HTTP/1.1 (minor_version 1).
 *
 * Rejects (status): malformed request line or field syntax, whitespace before
 * a colon, obs-fold, control characters (NUL, bare CR, ...) in fields, invalid
 * method/target characters, HTTP/1.1 without Host or with two Hosts, an
 * invalid Host value or absolute-form authority (parse_authority in bb_http.c:
 * a non-empty reg-name or "[" IPv6address "]", then optionally ":" and a port
 * of 1*DIGIT with a value of at most 65535; an empty Host is valid),
 * Content-Length with sign/hex/list/overflow or repeated, Content-Length with
 * Transfer-Encoding, repeated Transfer-Encoding -> 400; request line or URI
 * over the limit -> 414; too many / too large header fields -> 431;
 * Transfer-Encoding other than exactly "chunked" -> 501; a major version
 * other than 1 (HTTP/0.9, HTTP/2.0, ...) -> 505 (a version that is not
 * "HTTP/" DIGIT "." DIGIT -> 400).
 */
int bb_parse_request(const char *buf, size_t len, size_t last_len,
                     struct bb_request *req, const struct bb_limits *lim);

/*
 * Chunked transfer-coding decoder, decoding in place.
 * Zero-initialise the struct (or call bb_chunked_init) before the first call.
 * On each call, buf[0..*bufsz) holds new bytes; decoded data is moved to the
 * front of buf and *bufsz is set to the number of decoded bytes.
 * Returns:
 *   >= 0  the body is complete (last chunk and trailers consumed); the value is
 *         how many undecoded bytes follow it at buf[*bufsz .. *bufsz + ret)
 *         (the next pipelined request);
 *    -1   error: d->status holds 400 (syntax, overflow, over-long extension)
 *         or 431 (trailers too large);
 *    -2   incomplete: call again with more bytes.
 */
struct bb_chunked_decoder {
    uint64_t bytes_left_in_chunk; /* data bytes still expected in the current chunk */
    size_t ext_len;               /* bytes of chunk-ext seen on the current size line */
    size_t trailer_len;           /* bytes of trailer section seen */
    int state;                    /* internal */
    int hex_digits;               /* internal */
    int status;                   /* on -1 */
    size_t max_chunk_ext;         /* 0 -> BB_DEFAULT_MAX_CHUNK_EXT */
    size_t max_trailer_bytes;     /* 0 -> BB_DEFAULT_MAX_TRAILER_BYTES */
};

void bb_chunked_init(struct bb_chunked_decoder *d);
long bb_decode_chunked(struct bb_chunked_decoder *d, char *buf, size_t *bufsz);

/* The offset of the first byte of p[0..n) that a field value may not hold (RFC 9110 5.5: a control
 * byte other than HTAB, i.e. 0x00-0x08, 0x0A-0x1F, or DEL 0x7F; obs-text 0x80-0xFF is allowed), or n
 * when every byte may stand. The rule the parser applies to request fields, for a response's. */
size_t bb_field_value_end(const char *p, size_t n);

/* Which scanner bb_parse_request uses: "sse4.2" or "scalar" (chosen once, at first use, by CPUID). */
const char *bb_http_impl(void);
/* Forces the scalar (0) or SIMD (1) scanner; returns -1 if SIMD is unavailable. For tests. */
int bb_http_force_impl(int simd);

#endif
