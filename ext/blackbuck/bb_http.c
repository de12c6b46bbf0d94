/*
 * bb_http.c - HTTP/1.x request-head parser and chunked decoder (contract in bb_http.h).
 *
 * How bb_parse_request works
 *
 *   The head is read strictly left to right. Every check is tied to a byte
 *   position, and the first failing position decides the answer, so a prefix
 *   of the input gives either -2 or the very answer the whole input would give:
 *   feeding a request in any number of pieces cannot change the result.
 *
 *   - Limits are positions too: "byte number max_header_bytes is needed and the
 *     head has not ended" is 431, whether or not that byte has arrived yet. That
 *     is how limits are detected on incomplete input without scanning past them.
 *   - The request line is validated byte by byte (method, target, version).
 *   - A field line is first scanned to its CRLF with only byte-local checks
 *     (control characters, bare CR/LF); its syntax (name, colon, semantics) is
 *     checked once the line is complete. A partial field line is thus never
 *     rejected for its syntax, only for bad bytes, for starting with SP/HTAB
 *     (obs-fold) or for the byte limit.
 *   - Framing decisions that need the whole head (CL with TE, TE in HTTP/1.0,
 *     501 for an unknown coding, missing Host) are made after the final CRLF;
 *     duplicates (Host, CL, TE) and bad CL/TE values fail at their line.
 *
 *   last_len: because of the rule above, when the bytes seen before were a
 *   valid prefix (the earlier call returned -2), the call only needs a full
 *   parse if a new line may have completed or a limit may have been reached.
 *   quick_incomplete() checks that on the new bytes alone; a full parse runs
 *   only when new bytes hold a CR, LF or other control byte (about twice per
 *   field line, and at most max_headers + 1 lines get that far), when a line
 *   has just started, when max_header_bytes is reached, or while the request
 *   line is still incomplete (a cost bounded by max_request_line). So a client
 *   trickling a head byte by byte costs O(len) per call only at those points.
 *
 * Scanners: the two hot loops (request-target bytes, field-line bytes) have a
 * scalar (8 bytes at a time, word tricks) and an SSE4.2 (PCMPESTRI with byte
 * ranges) version; both return the first position in [i, end) whose byte is
 * in the class, so they are interchangeable. Neither reads at or past `end`:
 * the SSE4.2 one only loads 16 bytes when 16 bytes remain.
 *
 * bb_decode_chunked is a byte-at-a-time state machine (chunk data is copied in
 * blocks) whose whole state lives in the caller's struct, so the input may be
 * split anywhere without changing the result.
 */
#include "bb_http.h"

#include <limits.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define BB_SSE42_PATH 1
#include <nmmintrin.h>
#endif

#define INCOMPLETE (-2) /* internal: parse step needs more bytes */
#define MAX_PORT   65535 /* largest TCP port number: a Host or authority port above it -> 400 */

/* ---------------------------------------------------------------- chars */

#define C_TCHAR   1 /* token character (RFC 9110 5.6.2) */
#define C_REGNAME 2 /* reg-name byte other than pct-encoded: unreserved / sub-delims (RFC 3986 3.2.2) */

static const unsigned char char_class[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 3, 0, 1, 3, 1, 3, 3, 2, 2, 3, 3, 2, 3, 3, 0,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 2, 0, 2, 0, 0,
    0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 1, 3,
    1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 1, 0, 3, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

static int is_tchar(unsigned char c) { return char_class[c] & C_TCHAR; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_hexdig(unsigned char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }
static int is_ows(unsigned char c) { return c == ' ' || c == '\t'; }
static unsigned char lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c; }

/* A field-line byte that ends or breaks the line: CTL other than HTAB, or DEL.
 * (obs-text 0x80-0xFF is allowed in field values.) */
static int is_line_special(unsigned char c) { return (c < 0x20 && c != '\t') || c == 0x7f; }

/* A byte that is not part of a request-target: anything but 0x21-0x7E. */
static int is_not_target(unsigned char c) { return c <= 0x20 || c >= 0x7f; }

/* Case-insensitive compare of b[0..n) with a lower-case literal of length n. */
static int eq_lower(const unsigned char *b, size_t n, const char *lit, size_t lit_len)
{
    if (n != lit_len) return 0;
    for (size_t i = 0; i < n; i++)
        if (lower(b[i]) != (unsigned char)lit[i]) return 0;
    return 1;
}
#define EQ_LIT(b, n, lit) eq_lower((b), (n), lit, sizeof(lit) - 1)

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t add_sat(size_t a, size_t b) { return a + b < a ? (size_t)-1 : a + b; }

/* ------------------------------------------------------------- scanners */

/*
 * Scalar scanners: 8 bytes at a time with word tricks to skip clean words,
 * then byte by byte through a word that may hold a match.
 */
#define ONES  0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

static uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Non-zero if some byte of v is < n (n <= 128). */
static uint64_t has_less(uint64_t v, unsigned n) { return (v - ONES * n) & ~v & HIGHS; }
/* Non-zero if some byte of v is 0x7F or more. */
static uint64_t has_7f_or_more(uint64_t v) { return (v | (v + ONES)) & HIGHS; }
/* Non-zero if some byte of v is 0x7F. */
static uint64_t has_del(uint64_t v) { return has_less(v ^ (ONES * 0x7f), 1); }

static size_t find_line_special_scalar(const unsigned char *b, size_t i, size_t end)
{
    while (end - i >= 8) {
        uint64_t v = load64(b + i);
        if (has_less(v, 0x20) | has_del(v)) { /* may be only HTAB */
            for (size_t k = i; k < i + 8; k++)
                if (is_line_special(b[k])) return k;
        }
        i += 8;
    }
    while (i < end && !is_line_special(b[i])) i++;
    return i;
}

static size_t find_not_target_scalar(const unsigned char *b, size_t i, size_t end)
{
    while (end - i >= 8) {
        uint64_t v = load64(b + i);
        if (has_less(v, 0x21) | has_7f_or_more(v)) break;
        i += 8;
    }
    while (i < end && !is_not_target(b[i])) i++;
    return i;
}

#ifdef BB_SSE42_PATH
#define BB_RANGE_MODE (_SIDD_UBYTE_OPS | _SIDD_CMP_RANGES | _SIDD_LEAST_SIGNIFICANT)

__attribute__((target("sse4.2")))
static size_t find_line_special_sse42(const unsigned char *b, size_t i, size_t end)
{
    /* ranges: 0x00-0x08, 0x0A-0x1F, 0x7F-0x7F */
    const __m128i ranges = _mm_setr_epi8(0x00, 0x08, 0x0a, 0x1f, 0x7f, 0x7f,
                                         0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    while (end - i >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + i));
        int r = _mm_cmpestri(ranges, 6, v, 16, BB_RANGE_MODE);
        if (r != 16) return i + (size_t)r;
        i += 16;
    }
    return find_line_special_scalar(b, i, end);
}

__attribute__((target("sse4.2")))
static size_t find_not_target_sse42(const unsigned char *b, size_t i, size_t end)
{
    /* ranges: 0x00-0x20, 0x7F-0xFF */
    const __m128i ranges = _mm_setr_epi8(0x00, 0x20, 0x7f, (char)0xff,
                                         0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    while (end - i >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(b + i));
        int r = _mm_cmpestri(ranges, 4, v, 16, BB_RANGE_MODE);
        if (r != 16) return i + (size_t)r;
        i += 16;
    }
    return find_not_target_scalar(b, i, end);
}
#endif

/* The one global: -1 = not probed yet, 0 = scalar, 1 = SSE4.2. */
static int bb_simd = -1;

static int simd_available(void)
{
#ifdef BB_SSE42_PATH
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    return 0;
#endif
}

static int use_simd(void)
{
    int s = __atomic_load_n(&bb_simd, __ATOMIC_RELAXED);
    if (s < 0) {
        s = simd_available();
        __atomic_store_n(&bb_simd, s, __ATOMIC_RELAXED);
    }
    return s;
}

const char *bb_http_impl(void) { return use_simd() ? "sse4.2" : "scalar"; }

int bb_http_force_impl(int simd)
{
    if (simd && !simd_available()) return -1;
    __atomic_store_n(&bb_simd, simd ? 1 : 0, __ATOMIC_RELAXED);
    return 0;
}

static size_t find_line_special(const unsigned char *b, size_t i, size_t end, int simd)
{
#ifdef BB_SSE42_PATH
    if (simd) return find_line_special_sse42(b, i, end);
#endif
    (void)simd;
    return find_line_special_scalar(b, i, end);
}

size_t bb_field_value_end(const char *p, size_t n)
{
    return find_line_special((const unsigned char *)p, 0, n, use_simd());
}

static size_t find_not_target(const unsigned char *b, size_t i, size_t end, int simd)
{
#ifdef BB_SSE42_PATH
    if (simd) return find_not_target_sse42(b, i, end);
#endif
    (void)simd;
    return find_not_target_scalar(b, i, end);
}

/*
 * A scan window: bytes before `end` may be examined; reaching `end` means
 * `status` (a limit was hit) if end is a limit, or INCOMPLETE if it is len.
 */
struct window {
    size_t end;
    int status;
};

static struct window window_of(size_t len, size_t lim_pos, int lim_status)
{
    struct window w;
    if (lim_pos <= len) {
        w.end = lim_pos;
        w.status = lim_status;
    } else {
        w.end = len;
        w.status = INCOMPLETE;
    }
    return w;
}

/* The answer when a scan reaches w.end: more bytes needed, or the limit's status. */
static long stop(struct window w)
{
    return w.status == INCOMPLETE ? INCOMPLETE : -(long)w.status;
}

/* ----------------------------------------------------- request semantics */

struct head_state {
    int cl_seen, te_seen, host_seen;
    int te_status; /* 0 = "chunked" alone, or 501 */
};

/* Content-Length: 1*DIGIT, at most 18 digits (fits int64 without overflow). */
static int parse_content_length(const unsigned char *v, size_t n, int64_t *out)
{
    if (n == 0 || n > 18) return 400;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return 400;
        x = x * 10 + (v[i] - '0');
    }
    *out = x;
    return 0;
}

/*
 * Transfer-Encoding list. 400: empty value or empty element, "chunked" twice,
 * "chunked" not last (RFC 9112 6.3). 0: exactly one element, "chunked".
 * 501: anything else (an unsupported coding, also "gzip, chunked").
 */
static int parse_transfer_encoding(const unsigned char *v, size_t n)
{
    size_t elems = 0, chunked = 0;
    int chunked_last = 0;
    size_t i = 0;
    if (n == 0) return 400;
    for (;;) {
        size_t s = i;
        while (i < n && v[i] != ',') i++;
        size_t e = i;
        while (s < e && is_ows(v[s])) s++;
        while (e > s && is_ows(v[e - 1])) e--;
        if (s == e) return 400;
        elems++;
        chunked_last = EQ_LIT(v + s, e - s, "chunked");
        if (chunked_last) chunked++;
        else if (chunked) return 400; /* chunked followed by another coding */
        if (i == n) break;
        i++; /* skip ',' */
    }
    if (chunked > 1) return 400;
    if (elems == 1 && chunked_last) return 0;
    return 501;
}

/* Connection: comma-separated tokens; unknown ones are ignored. */
static unsigned parse_connection(const unsigned char *v, size_t n)
{
    unsigned flags = 0;
    size_t i = 0;
    while (i <= n) {
        size_t s = i;
        while (i < n && v[i] != ',') i++;
        size_t e = i;
        while (s < e && is_ows(v[s])) s++;
        while (e > s && is_ows(v[e - 1])) e--;
        if (EQ_LIT(v + s, e - s, "close")) flags |= BB_F_CONN_CLOSE;
        else if (EQ_LIT(v + s, e - s, "keep-alive")) flags |= BB_F_CONN_KEEPALIVE;
        else if (EQ_LIT(v + s, e - s, "upgrade")) flags |= BB_F_UPGRADE;
        i++;
    }
    return flags;
}

/* IPv4address (RFC 3986 3.2.2): four dec-octets 0-255 without leading zeros. */
static int valid_ipv4(const unsigned char *s, size_t n)
{
    size_t i = 0;
    for (int octet = 0; octet < 4; octet++) {
        if (octet > 0) {
            if (i == n || s[i] != '.') return 0;
            i++;
        }
        size_t d = i;
        unsigned v = 0;
        while (i < n && i - d < 3 && is_digit(s[i])) v = v * 10 + (unsigned)(s[i++] - '0');
        if (i == d || v > 255 || (i - d > 1 && s[d] == '0')) return 0;
    }
    return i == n;
}

/*
 * IPv6address (RFC 3986 3.2.2): eight h16 groups (1-4 hex digits) separated by
 * ':', or at most seven with one "::" standing for the rest; the last two
 * groups may be written as an IPv4address. No zone ID (RFC 6874 is not part of
 * HTTP's Host).
 */
static int valid_ipv6(const unsigned char *s, size_t n)
{
    size_t i = 0, groups = 0;
    int elided = 0;
    if (n >= 2 && s[0] == ':' && s[1] == ':') {
        elided = 1;
        i = 2;
    }
    while (i < n) {
        size_t g = i;
        while (i < n && i - g < 4 && is_hexdig(s[i])) i++;
        if (i == g) return 0; /* an empty group: ":::", a lone leading ':', another byte */
        if (i < n && s[i] == '.') { /* ls32 as an IPv4address: the last piece, two groups */
            if (!valid_ipv4(s + g, n - g)) return 0;
            groups += 2;
            break;
        }
        groups++;
        if (i == n) break;
        if (s[i] != ':') return 0; /* a fifth hex digit, '%' of a zone ID, ... */
        i++;
        if (i < n && s[i] == ':') {
            if (elided) return 0; /* a second "::" */
            elided = 1;
            i++;
        } else if (i == n) {
            return 0; /* a trailing single ':' */
        }
    }
    return elided ? groups <= 7 : groups == 8;
}

/*
 * authority as HTTP uses it, uri-host [ ":" port ] (RFC 9110 4.2.1, 7.2;
 * RFC 3986 3.2.2, 3.2.3), in v[0..n): the uri-host is a non-empty reg-name
 * (unreserved, sub-delims, "%" HEXDIG HEXDIG; an IPv4address is one too) or
 * "[" IPv6address "]"; the port is 1*DIGIT of value <= MAX_PORT. Stricter than
 * RFC 3986, and the same as Rack::Lint's HTTP_HOST check or stricter: no userinfo
 * (RFC 9110 4.2.4), no empty port after ':', no IPvFuture ("[v1.x]"), no zone ID.
 * One pass, no allocation. Returns 0 and sets *host_len (bytes of the uri-host),
 * or 400.
 */
static int parse_authority(const unsigned char *v, size_t n, size_t *host_len)
{
    size_t i = 0;
    if (n > 0 && v[0] == '[') {
        const unsigned char *close = memchr(v, ']', n);
        if (close == NULL || !valid_ipv6(v + 1, (size_t)(close - v) - 1)) return 400;
        i = (size_t)(close - v) + 1;
    } else {
        while (i < n) {
            if (char_class[v[i]] & C_REGNAME) i++;
            else if (v[i] == '%' && n - i > 2 && is_hexdig(v[i + 1]) && is_hexdig(v[i + 2])) i += 3;
            else break;
        }
        if (i == 0) return 400; /* an empty host (":80"), or a byte no host has ('@', '/', SP, ...) */
    }
    *host_len = i;
    if (i == n) return 0;
    if (v[i] != ':' || i + 1 == n) return 400; /* junk after the host ("[::1]x"), an empty port */
    unsigned port = 0;
    for (i++; i < n; i++) {
        if (!is_digit(v[i])) return 400;
        port = port * 10 + (unsigned)(v[i] - '0');
        if (port > MAX_PORT) return 400;
    }
    return 0;
}

/* Applies one complete field to req; returns 0 or an HTTP status. */
static int apply_field(struct bb_request *req, struct head_state *st, int index,
                       const unsigned char *name, size_t name_len,
                       const unsigned char *val, size_t val_len)
{
    switch (name_len) {
    case 4:
        if (EQ_LIT(name, name_len, "host")) {
            /* RFC 9112 3.2: more than one Host, or an invalid one -> 400, even when an
             * absolute-form target makes its value irrelevant (3.2.2). An empty Host is
             * valid: the target URI has no authority, the server's own name stands in. */
            size_t host_len = 0;
            if (st->host_seen || (val_len > 0 && parse_authority(val, val_len, &host_len))) return 400;
            st->host_seen = 1;
            req->host_index = index;
            if (!(req->flags & BB_F_ABSOLUTE_FORM)) {
                req->authority = (const char *)val;
                req->authority_len = val_len;
                req->host_len = host_len;
            }
        }
        break;
    case 6:
        /* RFC 9110 10.1.1: a 100-continue expectation in HTTP/1.0 is ignored */
        if (EQ_LIT(name, name_len, "expect") && EQ_LIT(val, val_len, "100-continue") &&
            req->minor_version == 1)
            req->flags |= BB_F_EXPECT_CONTINUE;
        break;
    case 10:
        if (EQ_LIT(name, name_len, "connection"))
            req->flags |= parse_connection(val, val_len);
        break;
    case 14:
        if (EQ_LIT(name, name_len, "content-length")) {
            if (st->cl_seen) return 400;
            st->cl_seen = 1;
            return parse_content_length(val, val_len, &req->content_length);
        }
        break;
    case 17:
        if (EQ_LIT(name, name_len, "transfer-encoding")) {
            if (st->te_seen) return 400;
            st->te_seen = 1;
            int r = parse_transfer_encoding(val, val_len);
            if (r == 400) return 400;
            st->te_status = r;
            if (r == 0) req->flags |= BB_F_CHUNKED;
        }
        break;
    default:
        break;
    }
    return 0;
}

/*
 * Classifies the request-target [t, t+n) and sets target_len, path and query.
 * origin-form "/...", asterisk-form "*" (OPTIONS only), absolute-form
 * "http://authority[/path][?query]" or https (scheme case-insensitive; the
 * authority goes to req->authority). authority-form (CONNECT) and every other
 * shape -> 400. A fragment "#..." is cut off first (RFC 9112 has none in a
 * request-target; clients strip it): "/a?#b" has the empty query.
 */
static int set_target(struct bb_request *req, const unsigned char *t, size_t n)
{
    const unsigned char *hash = memchr(t, '#', n);
    if (hash) n = (size_t)(hash - t);
    if (n == 0) return 400;
    req->target_len = n;

    size_t path_start = 0;
    if (t[0] == '*') {
        if (n != 1 || !(req->method_len == 7 && memcmp(req->method, "OPTIONS", 7) == 0)) return 400;
    } else if (t[0] != '/') {
        size_t scheme_len;
        if (n >= 7 && EQ_LIT(t, 7, "http://")) scheme_len = 7;
        else if (n >= 8 && EQ_LIT(t, 8, "https://")) scheme_len = 8;
        else return 400;
        size_t a = scheme_len, e = a, host_len;
        while (e < n && t[e] != '/' && t[e] != '?') e++;
        if (e == a || parse_authority(t + a, e - a, &host_len)) return 400; /* empty host, userinfo '@', ... */
        req->authority = (const char *)t + a;
        req->authority_len = e - a;
        req->host_len = host_len;
        req->flags |= BB_F_ABSOLUTE_FORM;
        if (e == n || t[e] == '?') {
            /* No path: the path is "/". Point at the second slash of "//" so
             * every returned pointer stays inside the caller's buffer. */
            req->path = (const char *)t + scheme_len - 1;
            req->path_len = 1;
            if (e < n) {
                req->query = (const char *)t + e + 1;
                req->query_len = n - e - 1;
            }
            return 0;
        }
        path_start = e;
    }
    const unsigned char *q = memchr(t + path_start, '?', n - path_start);
    size_t path_end = q ? (size_t)(q - t) : n;
    req->path = (const char *)t + path_start;
    req->path_len = path_end - path_start;
    if (q) {
        req->query = (const char *)q + 1;
        req->query_len = n - path_end - 1;
    }
    return 0;
}

/* ------------------------------------------------------------ the parse */

/*
 * Full parse of b[0..len). Returns bytes consumed, INCOMPLETE, or -status.
 * Does not write req->num_headers (the caller does, on success only).
 */
static long parse_head(const unsigned char *b, size_t len, struct bb_request *req,
                       const struct bb_limits *lim, size_t *nheaders, int simd)
{
    const size_t hb = lim->max_header_bytes; /* byte index hb must never be needed */
    size_t p = 0;
    struct window w;

    /* Leading empty lines (RFC 9112 2.2): skipped, but counted in the head. */
    for (;;) {
        w = window_of(len, hb, 431);
        if (p >= w.end) return stop(w);
        if (b[p] == '\n') return -400;
        if (b[p] != '\r') break;
        if (p + 1 >= w.end) return stop(w);
        if (b[p + 1] != '\n') return -400;
        p += 2;
    }

    const size_t rl_end = add_sat(p, lim->max_request_line);
    size_t rl_lim = rl_end;
    int rl_status = 414;
    if (hb < rl_lim) {
        rl_lim = hb;
        rl_status = 431;
    }

    /* method = 1*tchar, then SP */
    const size_t m = p;
    w = window_of(len, rl_lim, rl_status);
    while (p < w.end && is_tchar(b[p])) p++;
    if (p == w.end) return stop(w);
    if (b[p] != ' ' || p == m) return -400;
    req->method = (const char *)b + m;
    req->method_len = p - m;
    p++;

    /* request-target = 1*(0x21-0x7E), then SP; at most max_uri bytes */
    const size_t t = p;
    size_t t_lim = add_sat(add_sat(t, lim->max_uri), 1); /* byte t+max_uri may only be the SP */
    int t_status = 414;
    if (rl_lim < t_lim) {
        t_lim = rl_lim;
        t_status = rl_status;
    }
    w = window_of(len, t_lim, t_status);
    p = find_not_target(b, p, w.end, simd);
    if (p == w.end) return stop(w);
    if (b[p] != ' ' || p == t) return -400;
    req->target = (const char *)b + t;
    const size_t t_end = p;
    p++;

    /* HTTP-version CRLF: "HTTP/" DIGIT "." DIGIT CR LF */
    static const char pattern[] = "HTTP/d.d\r\n";
    w = window_of(len, rl_lim, rl_status);
    for (size_t k = 0; k < 10; k++, p++) {
        if (p >= w.end) return stop(w);
        unsigned char c = b[p];
        if (pattern[k] == 'd' ? (c < '0' || c > '9') : c != (unsigned char)pattern[k]) return -400;
    }
    /* RFC 9110 2.5: a higher minor of a major we implement is answered as the highest
     * minor we implement (HTTP/1.2 -> 1.1); another major -> 505 */
    if (b[p - 5] != '1') return -505;
    req->minor_version = b[p - 3] == '0' ? 0 : 1;

    int r = set_target(req, b + t, t_end - t);
    if (r) return -r;

    /* field lines */
    struct head_state st = {0, 0, 0, 0};
    const size_t cap = min_sz(lim->max_headers, req->num_headers);
    size_t n = 0;
    for (;;) {
        w = window_of(len, hb, 431);
        if (p >= w.end) return stop(w);
        unsigned char c = b[p];
        if (c == '\r') {
            if (p + 1 >= w.end) return stop(w);
            if (b[p + 1] != '\n') return -400;
            p += 2;
            break;
        }
        if (c == '\n' || is_ows(c)) return -400; /* bare LF; obs-fold or WS before the first field */

        size_t e = find_line_special(b, p, w.end, simd);
        if (e == w.end) return stop(w);
        if (b[e] != '\r') return -400; /* bare LF or a control character */
        if (e + 1 >= w.end) return stop(w);
        if (b[e + 1] != '\n') return -400; /* bare CR */

        /* field-name ":" OWS field-value OWS; the bytes are already checked */
        size_t colon = p;
        while (colon < e && is_tchar(b[colon])) colon++;
        if (colon == p || colon == e || b[colon] != ':') return -400;
        size_t vs = colon + 1, ve = e;
        while (vs < ve && is_ows(b[vs])) vs++;
        while (ve > vs && is_ows(b[ve - 1])) ve--;

        if (n >= cap) return -431;
        struct bb_header *h = &req->headers[n];
        h->name = (const char *)b + p;
        h->name_len = colon - p;
        h->value = (const char *)b + vs;
        h->value_len = ve - vs;
        r = apply_field(req, &st, (int)n, b + p, colon - p, b + vs, ve - vs);
        if (r) return -r;
        n++;
        p = e + 2;
    }

    /* framing decisions that need the whole head */
    if (st.te_seen && st.cl_seen) return -400;
    if (st.te_seen && req->minor_version == 0) return -400;
    if (st.te_seen && st.te_status) return -st.te_status;
    if (req->minor_version == 1 && !st.host_seen) return -400;

    *nheaders = n;
    return (long)p;
}

/*
 * Given that b[0..last_len) was a valid incomplete prefix, returns 1 if
 * b[0..len) is certainly still incomplete, looking only at the new bytes:
 * the request line is complete, the new bytes continue the current field
 * line (no line start, no CR/LF/CTL among them) and no limit is in reach.
 */
static int quick_incomplete(const unsigned char *b, size_t len, size_t last_len,
                            const struct bb_limits *lim, int simd)
{
    if (last_len == 0 || last_len >= len || len >= lim->max_header_bytes) return 0;
    unsigned char prev = b[last_len - 1];
    if (prev == '\r' || prev == '\n') return 0;
    size_t p = 0;
    while (p + 1 < last_len && b[p] == '\r' && b[p + 1] == '\n') p += 2;
    if (memchr(b + p, '\n', last_len - p) == NULL) return 0; /* still in the request line */
    return find_line_special(b, last_len, len, simd) == len;
}

int bb_parse_request(const char *buf, size_t len, size_t last_len,
                     struct bb_request *req, const struct bb_limits *lim)
{
    const unsigned char *b = (const unsigned char *)buf;
    int simd = use_simd();

    req->method = req->target = req->path = req->query = req->authority = NULL;
    req->method_len = req->target_len = req->path_len = req->query_len = 0;
    req->authority_len = req->host_len = 0;
    req->minor_version = -1;
    req->content_length = -1;
    req->host_index = -1;
    req->flags = 0;
    req->status = 0;

    if (quick_incomplete(b, len, last_len, lim, simd)) return -2;

    size_t n = 0;
    long r = parse_head(b, len, req, lim, &n, simd);
    if (r == INCOMPLETE) return -2;
    if (r > INT_MAX) r = -431; /* only with max_header_bytes > INT_MAX */
    if (r < 0) {
        req->status = (int)-r;
        return -1;
    }
    req->num_headers = n;
    return (int)r;
}

/* ----------------------------------------------------- chunked decoding */

enum {
    CH_SIZE0,       /* first hex digit of chunk-size */
    CH_SIZE,        /* more hex digits, or BWS / ';' / CR */
    CH_SIZE_BWS,    /* BWS after the size: more BWS or ';' */
    CH_EXT_NAME0,   /* after ';': BWS or the first tchar of chunk-ext-name */
    CH_EXT_NAME,    /* name tchars, then BWS / '=' / ';' / CR */
    CH_EXT_NAME_BWS,/* BWS after the name: more BWS, '=' or ';' */
    CH_EXT_VAL0,    /* after '=': BWS, tchar or DQUOTE */
    CH_EXT_VAL,     /* token value, then BWS / ';' / CR */
    CH_EXT_QSTR,    /* inside a quoted-string value */
    CH_EXT_QPAIR,   /* after a backslash in a quoted-string */
    CH_EXT_QEND,    /* after the closing DQUOTE: BWS / ';' / CR */
    CH_EXT_VAL_BWS, /* BWS after a value: more BWS or ';' */
    CH_SIZE_LF,     /* CR of the chunk-size line seen */
    CH_DATA,        /* chunk data */
    CH_DATA_CR,     /* CR after chunk data */
    CH_DATA_LF,     /* LF after chunk data */
    CH_TR_START,    /* start of a trailer line: field name or the final CR */
    CH_TR_NAME,     /* field-name tchars, then ':' */
    CH_TR_VALUE,    /* field value bytes, then CR */
    CH_TR_LF,       /* LF ending a trailer field line */
    CH_END_LF,      /* LF of the final empty line */
    CH_DONE,
    CH_ERROR
};

void bb_chunked_init(struct bb_chunked_decoder *d)
{
    memset(d, 0, sizeof(*d));
}

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c = lower(c);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static int is_vchar_or_obs(unsigned char c) { return (c >= 0x21 && c != 0x7f); }

/* One byte of the chunk-size line after the digits; returns the next state or CH_ERROR. */
static int ext_step(int state, unsigned char c)
{
    switch (state) {
    case CH_SIZE_BWS:
    case CH_EXT_NAME_BWS:
    case CH_EXT_VAL_BWS:
        if (is_ows(c)) return state;
        if (c == ';') return CH_EXT_NAME0;
        if (c == '=' && state == CH_EXT_NAME_BWS) return CH_EXT_VAL0;
        return CH_ERROR;
    case CH_EXT_NAME0:
        if (is_ows(c)) return state;
        return is_tchar(c) ? CH_EXT_NAME : CH_ERROR;
    case CH_EXT_NAME:
        if (is_tchar(c)) return state;
        if (c == '=') return CH_EXT_VAL0;
        if (c == ';') return CH_EXT_NAME0;
        if (is_ows(c)) return CH_EXT_NAME_BWS;
        return c == '\r' ? CH_SIZE_LF : CH_ERROR;
    case CH_EXT_VAL0:
        if (is_ows(c)) return state;
        if (c == '"') return CH_EXT_QSTR;
        return is_tchar(c) ? CH_EXT_VAL : CH_ERROR;
    case CH_EXT_VAL:
    case CH_EXT_QEND:
        if (state == CH_EXT_VAL && is_tchar(c)) return state;
        if (c == ';') return CH_EXT_NAME0;
        if (is_ows(c)) return CH_EXT_VAL_BWS;
        return c == '\r' ? CH_SIZE_LF : CH_ERROR;
    case CH_EXT_QSTR:
        if (c == '"') return CH_EXT_QEND;
        if (c == '\\') return CH_EXT_QPAIR;
        return (is_ows(c) || is_vchar_or_obs(c)) ? state : CH_ERROR;
    case CH_EXT_QPAIR:
        return (is_ows(c) || is_vchar_or_obs(c)) ? CH_EXT_QSTR : CH_ERROR;
    default:
        return CH_ERROR;
    }
}

long bb_decode_chunked(struct bb_chunked_decoder *d, char *buf, size_t *bufsz)
{
    const size_t n = *bufsz;
    const size_t max_ext = d->max_chunk_ext ? d->max_chunk_ext : BB_DEFAULT_MAX_CHUNK_EXT;
    const size_t max_tr = d->max_trailer_bytes ? d->max_trailer_bytes : BB_DEFAULT_MAX_TRAILER_BYTES;
    size_t src = 0, dst = 0;
    int status = 0;

    if (d->state == CH_ERROR) {
        *bufsz = 0;
        return -1;
    }
    while (d->state != CH_DONE) {
        if (d->state == CH_DATA) {
            size_t avail = n - src;
            if (avail == 0) break;
            size_t take = d->bytes_left_in_chunk < avail ? (size_t)d->bytes_left_in_chunk : avail;
            if (dst != src) memmove(buf + dst, buf + src, take);
            dst += take;
            src += take;
            d->bytes_left_in_chunk -= take;
            if (d->bytes_left_in_chunk == 0) d->state = CH_DATA_CR;
            continue;
        }
        if (src == n) break;
        unsigned char c = (unsigned char)buf[src++];
        switch (d->state) {
        case CH_SIZE0:
        case CH_SIZE: {
            int h = hex_value(c);
            if (h >= 0) {
                /* 1*HEXDIG, at most 16 digits and at most INT64_MAX */
                if (++d->hex_digits > 16 || d->bytes_left_in_chunk > (uint64_t)INT64_MAX >> 4) {
                    status = 400;
                    goto error;
                }
                d->bytes_left_in_chunk = (d->bytes_left_in_chunk << 4) | (uint64_t)h;
                d->state = CH_SIZE;
                break;
            }
            if (d->state == CH_SIZE0) {
                status = 400;
                goto error;
            }
            if (c == '\r') {
                d->state = CH_SIZE_LF;
                break;
            }
            d->ext_len = 0;
            if (c == ';') d->state = CH_EXT_NAME0;
            else if (is_ows(c)) d->state = CH_SIZE_BWS;
            else {
                status = 400;
                goto error;
            }
            if (++d->ext_len > max_ext) {
                status = 400;
                goto error;
            }
            break;
        }
        case CH_SIZE_LF:
            if (c != '\n') {
                status = 400;
                goto error;
            }
            d->hex_digits = 0;
            d->ext_len = 0;
            if (d->bytes_left_in_chunk == 0) {
                d->trailer_len = 0;
                d->state = CH_TR_START;
            } else {
                d->state = CH_DATA;
            }
            break;
        case CH_DATA_CR:
            if (c != '\r') {
                status = 400;
                goto error;
            }
            d->state = CH_DATA_LF;
            break;
        case CH_DATA_LF:
            if (c != '\n') {
                status = 400;
                goto error;
            }
            d->state = CH_SIZE0;
            break;
        case CH_TR_START:
        case CH_TR_NAME:
        case CH_TR_VALUE:
        case CH_TR_LF:
        case CH_END_LF:
            if (++d->trailer_len > max_tr) {
                status = 431;
                goto error;
            }
            switch (d->state) {
            case CH_TR_START:
                if (c == '\r') d->state = CH_END_LF;
                else if (is_tchar(c)) d->state = CH_TR_NAME;
                else status = 400; /* obs-fold, empty name, bare LF, ... */
                break;
            case CH_TR_NAME:
                if (c == ':') d->state = CH_TR_VALUE;
                else if (!is_tchar(c)) status = 400;
                break;
            case CH_TR_VALUE:
                if (c == '\r') d->state = CH_TR_LF;
                else if (is_line_special(c)) status = 400;
                break;
            case CH_TR_LF:
                if (c == '\n') d->state = CH_TR_START;
                else status = 400;
                break;
            default: /* CH_END_LF */
                if (c == '\n') d->state = CH_DONE;
                else status = 400;
                break;
            }
            if (status) goto error;
            break;
        default: { /* chunk-ext states */
            int next = ext_step(d->state, c);
            if (next == CH_ERROR) {
                status = 400;
                goto error;
            }
            if (next != CH_SIZE_LF && ++d->ext_len > max_ext) {
                status = 400;
                goto error;
            }
            d->state = next;
            break;
        }
        }
    }

    if (d->state != CH_DONE) {
        *bufsz = dst;
        return -2;
    }
    /* Done: keep the bytes after the body right behind the decoded data. */
    if (dst != src) memmove(buf + dst, buf + src, n - src);
    *bufsz = dst;
    return (long)(n - src);

error:
    d->state = CH_ERROR;
    d->status = status;
    *bufsz = dst;
    return -1;
}
