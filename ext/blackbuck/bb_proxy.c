/*
 * bb_proxy.c - PROXY protocol v1/v2 header parser (contract in bb_proxy.h).
 *
 * Written from the specification (haproxy's doc/proxy-protocol.txt), as bb_http.c is from RFC 9112:
 * the header is read left to right and every check is tied to a byte position, so a prefix of the
 * input gives -2 or the very answer the whole input gives.
 *
 * v1 is one text line. Its end (the first CR) is found first; a LF before it, a CR not followed by
 * LF, or no CR within BB_PROXY_V1_MAX_BYTES is -1. The fields are then checked in order. While the
 * line is incomplete, a field that has not ended yet is only checked for bytes it can never hold
 * and for its greatest length, so a partial field is never rejected for what more bytes could fix.
 *
 * v2 is binary: the signature, version and command, family and length are checked as soon as they
 * arrive; the addresses and TLVs once all 16 + length bytes are there.
 */
#include "bb_proxy.h"

#include <string.h>

#define OK    0
#define BAD   (-1)
#define MORE  (-2)

/* v1 */
#define V1_TAG          "PROXY "  /* "PROXY" and its one SP */
#define V1_TAG_LEN      6
#define IPV4_MAX_CHARS  15  /* "255.255.255.255" */
#define IPV6_MAX_CHARS  45  /* "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255" */
#define PORT_MAX_CHARS  5   /* "65535" */
#define MAX_PORT        65535

/* v2 */
#define V2_SIG_LEN      12
#define V2_FIXED_LEN    16  /* signature, version/command, family/transport, 16-bit length */
#define V2_TLV_HEAD_LEN 3   /* type, 16-bit length */
#define V2_INET_LEN     12  /* two IPv4 addresses, two ports */
#define V2_INET6_LEN    36  /* two IPv6 addresses, two ports */
#define V2_UNIX_LEN     216 /* two 108-byte socket paths */
#define V2_VERSION      0x2
#define V2_CMD_LOCAL    0x0
#define V2_CMD_PROXY    0x1

static const unsigned char v2_signature[V2_SIG_LEN] = {
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
};

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int hex_value(unsigned char c)
{
    if (is_digit(c)) return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* ------------------------------------------------------------------ v1 fields */

/* Four decimal numbers 0-255 separated by single dots, no leading zeros, nothing else. */
static int parse_ipv4(const unsigned char *s, size_t n, uint8_t out[4])
{
    size_t i = 0;
    int part;
    for (part = 0; part < 4; part++) {
        unsigned v = 0;
        size_t digits = 0;
        if (part > 0) {
            if (i >= n || s[i] != '.') return 0;
            i++;
        }
        while (i < n && is_digit(s[i]) && digits < 4) {
            v = v * 10 + (unsigned)(s[i] - '0');
            i++;
            digits++;
        }
        if (digits == 0 || digits > 3 || v > 255 || (digits > 1 && s[i - digits] == '0')) return 0;
        out[part] = (uint8_t)v;
    }
    return i == n;
}

/* Eight groups of 1-4 hex digits separated by ':', or fewer with one "::" standing for at least one
 * zero group; the last 32 bits may be written as a dotted IPv4 address (::ffff:192.0.2.1). */
static int parse_ipv6(const unsigned char *s, size_t n, uint8_t out[16])
{
    uint16_t words[8];
    int nw = 0, gap = -1, k;
    size_t i = 0;

    if (n >= 2 && s[0] == ':' && s[1] == ':') {
        gap = 0;
        i = 2;
    } else if (n == 0 || s[0] == ':') {
        return 0;
    }
    while (i < n) {
        size_t j = i;
        unsigned v = 0;
        while (j < n && hex_value(s[j]) >= 0 && j - i < 5) v = (v << 4) | (unsigned)hex_value(s[j++]);
        if (j < n && s[j] == '.') { /* a dotted IPv4 address: the last 32 bits, up to the end */
            uint8_t v4[4];
            if (nw > 6 || !parse_ipv4(s + i, n - i, v4)) return 0;
            words[nw++] = (uint16_t)(v4[0] << 8 | v4[1]);
            words[nw++] = (uint16_t)(v4[2] << 8 | v4[3]);
            i = n;
            break;
        }
        if (j == i || j - i > 4 || nw == 8) return 0;
        words[nw++] = (uint16_t)v;
        i = j;
        if (i == n) break;
        if (s[i] != ':') return 0;
        i++;
        if (i < n && s[i] == ':') {
            if (gap >= 0) return 0;
            gap = nw;
            i++;
        } else if (i == n) {
            return 0; /* a single trailing ':' */
        }
    }
    if (gap < 0 ? nw != 8 : nw > 7) return 0;
    memset(out, 0, 16);
    for (k = 0; k < nw; k++) {
        int at = (gap >= 0 && k >= gap) ? k + (8 - nw) : k; /* groups after "::" go to the end */
        out[2 * at] = (uint8_t)(words[k] >> 8);
        out[2 * at + 1] = (uint8_t)(words[k] & 0xFF);
    }
    return 1;
}

/* 0-65535 in decimal, without leading zeros. */
static int parse_port(const unsigned char *s, size_t n, uint16_t *out)
{
    unsigned v = 0;
    size_t i;
    if (n == 0 || n > PORT_MAX_CHARS || (n > 1 && s[0] == '0')) return 0;
    for (i = 0; i < n; i++) {
        if (!is_digit(s[i])) return 0;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > MAX_PORT) return 0;
    *out = (uint16_t)v;
    return 1;
}

enum field_kind { F_IPV4, F_IPV6, F_PORT };

/* Can a field of this kind hold byte c at all? (Checked on fields that have not ended yet.) */
static int field_byte(enum field_kind kind, unsigned char c)
{
    switch (kind) {
    case F_IPV4: return is_digit(c) || c == '.';
    case F_IPV6: return hex_value(c) >= 0 || c == ':' || c == '.';
    default: return is_digit(c);
    }
}

/* The line (or the part of it received so far) after "PROXY ": [p, end). */
struct line {
    const unsigned char *p, *end;
    int complete; /* end is the CR of the CRLF; else more bytes may follow */
};

/* One SP-separated field of the line. The last one must end the line; the others end at a SP. */
static int field(struct line *l, enum field_kind kind, int last, uint8_t *addr, uint16_t *port)
{
    const unsigned char *s = l->p, *q = s;
    size_t n, i, max = kind == F_IPV4 ? IPV4_MAX_CHARS : kind == F_IPV6 ? IPV6_MAX_CHARS : PORT_MAX_CHARS;
    int ok;

    while (q < l->end && *q != ' ') q++;
    n = (size_t)(q - s);
    if (q == l->end && !l->complete) { /* the field may go on */
        if (n > max) return BAD;
        for (i = 0; i < n; i++)
            if (!field_byte(kind, s[i])) return BAD;
        return MORE;
    }
    if (q < l->end ? last : !last) return BAD; /* a SP after the last field, or a field missing */
    switch (kind) {
    case F_IPV4: ok = parse_ipv4(s, n, addr); break;
    case F_IPV6: ok = parse_ipv6(s, n, addr); break;
    default: ok = parse_port(s, n, port); break;
    }
    if (!ok) return BAD;
    l->p = q < l->end ? q + 1 : q;
    return OK;
}

static int parse_v1_line(struct line *l, struct bb_proxy *px)
{
    static const char *const protocols[] = {"TCP4", "TCP6", "UNKNOWN"};
    const unsigned char *s = l->p, *q;
    size_t have = (size_t)(l->end - s), n, k;
    enum field_kind kind;
    int r;

    n = have < V1_TAG_LEN ? have : V1_TAG_LEN;
    if (memcmp(s, V1_TAG, n) != 0) return BAD;
    if (n < V1_TAG_LEN) return l->complete ? BAD : MORE;
    s += V1_TAG_LEN;

    for (q = s; q < l->end && *q != ' '; q++) {}
    n = (size_t)(q - s);
    if (q == l->end && !l->complete) { /* the protocol may go on: is it the start of one? */
        for (k = 0; k < sizeof(protocols) / sizeof(protocols[0]); k++)
            if (n <= strlen(protocols[k]) && memcmp(s, protocols[k], n) == 0) return MORE;
        return BAD;
    }
    if (n == 7 && memcmp(s, "UNKNOWN", 7) == 0) {
        /* The rest of the line, if any, follows a SP and is ignored (the spec); it holds no CR or
         * LF, since the line ends at its first CR. */
        px->family = BB_PROXY_UNSPEC;
        px->transport = 0;
        return l->complete ? OK : MORE;
    }
    if (n != 4 || memcmp(s, "TCP", 3) != 0 || (s[3] != '4' && s[3] != '6') || q == l->end) return BAD;
    px->family = s[3] == '4' ? BB_PROXY_INET : BB_PROXY_INET6;
    px->transport = BB_PROXY_STREAM;
    kind = s[3] == '4' ? F_IPV4 : F_IPV6;
    l->p = q + 1;
    if ((r = field(l, kind, 0, px->src_addr, NULL)) != OK) return r;
    if ((r = field(l, kind, 0, px->dst_addr, NULL)) != OK) return r;
    if ((r = field(l, F_PORT, 0, NULL, &px->src_port)) != OK) return r;
    return field(l, F_PORT, 1, NULL, &px->dst_port);
}

static int parse_v1(const unsigned char *b, size_t len, struct bb_proxy *out)
{
    size_t scan = len < BB_PROXY_V1_MAX_BYTES ? len : BB_PROXY_V1_MAX_BYTES, i;
    struct line l;
    struct bb_proxy px;
    int r;

    for (i = 0; i < scan; i++) {
        if (b[i] == '\n') return BAD; /* a LF without its CR */
        if (b[i] == '\r') break;
    }
    l.p = b;
    l.end = b + i;
    l.complete = 0;
    if (i < scan) { /* the CR at i */
        if (i + 2 > BB_PROXY_V1_MAX_BYTES) return BAD; /* its LF would be byte 108 */
        if (i + 1 < len) {
            if (b[i + 1] != '\n') return BAD; /* a CR without its LF */
            l.complete = 1;
        }
    } else if (len >= BB_PROXY_V1_MAX_BYTES) {
        return BAD; /* no CRLF in the first BB_PROXY_V1_MAX_BYTES bytes */
    }
    memset(&px, 0, sizeof(px));
    px.version = 1;
    r = parse_v1_line(&l, &px);
    if (r != OK) return r;
    *out = px;
    return (int)(i + 2);
}

/* ------------------------------------------------------------------ v2 */

static uint16_t be16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static int parse_v2(const unsigned char *b, size_t len, struct bb_proxy *out)
{
    size_t n = len < V2_SIG_LEN ? len : V2_SIG_LEN, total, addr_len = 0, i;
    unsigned cmd, fam = 0;
    struct bb_proxy px;

    if (memcmp(b, v2_signature, n) != 0) return BAD;
    if (len <= V2_SIG_LEN) return MORE;
    cmd = b[12] & 0x0F;
    if ((b[12] >> 4) != V2_VERSION || (cmd != V2_CMD_LOCAL && cmd != V2_CMD_PROXY)) return BAD;
    if (cmd == V2_CMD_PROXY) { /* LOCAL: the family is ignored (the spec) */
        if (len <= 13) return MORE;
        fam = b[13];
        switch (fam) {
        case 0x00: addr_len = 0; break;                       /* AF_UNSPEC */
        case 0x11: case 0x12: addr_len = V2_INET_LEN; break;  /* TCP, UDP over IPv4 */
        case 0x21: case 0x22: addr_len = V2_INET6_LEN; break; /* TCP, UDP over IPv6 */
        case 0x31: case 0x32: addr_len = V2_UNIX_LEN; break;  /* UNIX stream, datagram */
        default: return BAD;
        }
    }
    if (len < V2_FIXED_LEN) return MORE;
    total = V2_FIXED_LEN + be16(b + 14);
    if (total > BB_PROXY_V2_MAX_BYTES || total - V2_FIXED_LEN < addr_len) return BAD;
    if (len < total) return MORE;

    memset(&px, 0, sizeof(px));
    px.version = 2;
    if (cmd == V2_CMD_LOCAL) {
        px.local = 1;
        *out = px;
        return (int)total;
    }
    px.family = (int)(fam >> 4);
    px.transport = (int)(fam & 0x0F);
    if (px.family == BB_PROXY_INET) {
        memcpy(px.src_addr, b + 16, 4);
        memcpy(px.dst_addr, b + 20, 4);
        px.src_port = be16(b + 24);
        px.dst_port = be16(b + 26);
    } else if (px.family == BB_PROXY_INET6) {
        memcpy(px.src_addr, b + 16, 16);
        memcpy(px.dst_addr, b + 32, 16);
        px.src_port = be16(b + 48);
        px.dst_port = be16(b + 50);
    }
    if (fam != 0x00) { /* after known addresses: whole TLVs up to the end, skipped */
        i = V2_FIXED_LEN + addr_len;
        while (total - i >= V2_TLV_HEAD_LEN) {
            size_t value_len = be16(b + i + 1);
            if (value_len > total - i - V2_TLV_HEAD_LEN) return BAD;
            i += V2_TLV_HEAD_LEN + value_len;
        }
        if (i != total) return BAD; /* 1 or 2 bytes left: not a TLV */
    }
    *out = px;
    return (int)total;
}

int bb_parse_proxy(const char *buf, size_t len, struct bb_proxy *out)
{
    const unsigned char *b = (const unsigned char *)buf;
    if (len == 0) return MORE;
    if (b[0] == V1_TAG[0]) return parse_v1(b, len, out);
    if (b[0] == v2_signature[0]) return parse_v2(b, len, out);
    return BAD;
}
