/*
 * test_proxy.c - table-driven tests for bb_proxy.c (PROXY protocol v1 and v2 headers).
 *
 * Every row runs:
 *   - one shot, with the input placed right before a PROT_NONE page;
 *   - on every prefix (also right before the guard page): the parser keeps no state between calls,
 *     so "every split" and "byte at a time" both come down to the answer for each prefix, which must
 *     be -2 or the whole input's answer (-1 for a row that is -1; for a valid header, its length once
 *     the prefix holds it all). A row's `early` is the shortest prefix already answered -1: bad input
 *     is refused as soon as it is bad, not after a timeout;
 *   - *out must be untouched unless the return value is > 0.
 *
 * Build and run: make -C test/c test
 */
#define _DEFAULT_SOURCE
#include "bb_proxy.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ALL (-100) /* expected return: the whole input was consumed */

static int passed, failed;

/* ------------------------------------------------------------ guard page */

static size_t page;
static char *guard_base;
static size_t guard_cap;

/* Returns a pointer p such that p[0..n) ends right at a PROT_NONE page. */
static char *guarded(const void *data, size_t n)
{
    if (n > guard_cap || !guard_base) {
        if (guard_base) munmap(guard_base, guard_cap + page);
        guard_cap = (n + page - 1) / page * page;
        if (guard_cap == 0) guard_cap = page;
        guard_base = mmap(NULL, guard_cap + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (guard_base == MAP_FAILED || mprotect(guard_base + guard_cap, page, PROT_NONE)) {
            perror("mmap");
            exit(2);
        }
    }
    char *p = guard_base + guard_cap - n;
    memcpy(p, data, n);
    return p;
}

/* ------------------------------------------------------------ table */

struct prow {
    const char *comment;
    const char *in;
    size_t len;
    int ret;           /* ALL, a byte count, -1 or -2 */
    size_t early;      /* ret -1: the shortest prefix answered -1 (0: the whole input) */
    /* on success */
    int version, local, family, transport;
    const char *src, *dst; /* text of the addresses (INET/INET6 rows); NULL: all zero */
    int sport, dport;
};

#define IN(s) .in = s, .len = sizeof(s) - 1
#define V1(c, s, fam, sa, da, sp, dp) \
    { .comment = c, IN(s), .ret = ALL, .version = 1, .family = fam, .transport = BB_PROXY_STREAM, \
      .src = sa, .dst = da, .sport = sp, .dport = dp }
#define V1_UNKNOWN(c, s) { .comment = c, IN(s), .ret = ALL, .version = 1, .family = BB_PROXY_UNSPEC }
#define V2(c, s, fam, tr, sa, da, sp, dp) \
    { .comment = c, IN(s), .ret = ALL, .version = 2, .family = fam, .transport = tr, \
      .src = sa, .dst = da, .sport = sp, .dport = dp }
#define BAD(c, s, e) { .comment = c, IN(s), .ret = -1, .early = e }
#define MORE(c, s) { .comment = c, IN(s), .ret = -2 }

#define T4 BB_PROXY_INET
#define T6 BB_PROXY_INET6
#define ST BB_PROXY_STREAM
#define DG BB_PROXY_DGRAM

/* The v2 signature; then version/command, family/transport and the length follow. */
#define SIG "\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A"
/* 192.0.2.1 -> 198.51.100.2, 56324 -> 443 */
#define A4 "\xc0\x00\x02\x01" "\xc6\x33\x64\x02" "\xdc\x04" "\x01\xbb"
/* 2001:db8::1 -> 2001:db8::2, 56324 -> 443 */
#define A6 "\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01" \
           "\x20\x01\x0d\xb8\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02" "\xdc\x04" "\x01\xbb"
#define HTTP "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
#define F39 "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"

static const struct prow rows[] = {
    /* --- v1, valid --- */
    V1("v1 TCP4", "PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n", T4, "192.0.2.1", "198.51.100.2", 56324, 443),
    { .comment = "v1 TCP4, then the request: only the header is consumed",
      IN("PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n" HTTP), .ret = 45, .version = 1, .family = T4,
      .transport = ST, .src = "192.0.2.1", .dst = "198.51.100.2", .sport = 56324, .dport = 443 },
    V1("v1 TCP4 largest values (56 bytes)", "PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n",
       T4, "255.255.255.255", "255.255.255.255", 65535, 65535),
    V1("v1 TCP4 zeros", "PROXY TCP4 0.0.0.0 0.0.0.0 0 0\r\n", T4, "0.0.0.0", "0.0.0.0", 0, 0),
    V1("v1 TCP4 one-digit and two-digit octets", "PROXY TCP4 1.22.3.44 10.0.0.9 1 22\r\n",
       T4, "1.22.3.44", "10.0.0.9", 1, 22),
    V1("v1 TCP6", "PROXY TCP6 2001:db8::1 2001:db8::2 56324 443\r\n", T6, "2001:db8::1", "2001:db8::2", 56324, 443),
    V1("v1 TCP6 longest (104 bytes), upper and lower case",
       "PROXY TCP6 FFFF:ffff:FFFF:ffff:FFFF:ffff:FFFF:ffff " F39 " 65535 65535\r\n", T6, F39, F39, 65535, 65535),
    V1("v1 TCP6 :: and ::1", "PROXY TCP6 :: ::1 1 2\r\n", T6, "::", "::1", 1, 2),
    V1("v1 TCP6 leading zeros in groups", "PROXY TCP6 0001:0db8::0001 fe80:0:0:0:0:0:0:1 3 4\r\n",
       T6, "1:db8::1", "fe80::1", 3, 4),
    V1("v1 TCP6 :: at the end, and standing for one group", "PROXY TCP6 1:: 1:2:3:4:5:6:7:: 3 4\r\n",
       T6, "1::", "1:2:3:4:5:6:7:0", 3, 4),
    V1("v1 TCP6 IPv4-mapped and dotted tail", "PROXY TCP6 ::ffff:192.0.2.1 1:2:3:4:5:6:10.0.0.1 3 4\r\n",
       T6, "::ffff:192.0.2.1", "1:2:3:4:5:6:a00:1", 3, 4),
    V1("v1 TCP6 dotted tail after ::", "PROXY TCP6 ::1.2.3.4 1:2:3:4:5::1.2.3.4 3 4\r\n",
       T6, "::102:304", "1:2:3:4:5:0:102:304", 3, 4),
    V1_UNKNOWN("v1 UNKNOWN, short form", "PROXY UNKNOWN\r\n"),
    V1_UNKNOWN("v1 UNKNOWN, anything after it is ignored", "PROXY UNKNOWN whatever \x01\x7f\xff\x00 x\r\n"),
    V1_UNKNOWN("v1 UNKNOWN, worst case of the spec (107 bytes)",
               "PROXY UNKNOWN " F39 " " F39 " 65535 65535\r\n"),
    { .comment = "v1 UNKNOWN then the request", IN("PROXY UNKNOWN\r\n" HTTP), .ret = 15, .version = 1 },

    /* --- v1, incomplete --- */
    MORE("nothing yet", ""),
    MORE("v1: P", "P"),
    MORE("v1: PROXY", "PROXY"),
    MORE("v1: PROXY SP", "PROXY "),
    MORE("v1: protocol so far", "PROXY TC"),
    MORE("v1: UNKNOWN so far", "PROXY UNKNO"),
    MORE("v1: in the source address", "PROXY TCP4 192.0.2.1 198.51"),
    MORE("v1: TCP6 in the destination", "PROXY TCP6 2001:db8::1 2001:"),
    MORE("v1: UNKNOWN without its CRLF", "PROXY UNKNOWN some text"),
    MORE("v1: all fields, no CRLF", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2"),
    MORE("v1: CR without its LF yet", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r"),

    /* --- v1, invalid --- */
    BAD("HTTP on a PROXY listener", HTTP, 1),
    BAD("TLS ClientHello byte", "\x16\x03\x01\x02\x00", 1),
    BAD("lower-case proxy", "proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n", 1),
    BAD("PROXY without SP", "PROXY\r\n", 0),
    BAD("PROXYX", "PROXYX TCP4 1.2.3.4 5.6.7.8 1 2\r\n", 6),
    BAD("two SP after PROXY", "PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n", 7),
    BAD("unknown protocol TCP5", "PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", 10),
    BAD("protocol UDP4", "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", 8),
    BAD("lower-case tcp4", "PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n", 7),
    BAD("TCP4 then CRLF", "PROXY TCP4\r\n", 0),
    BAD("UNKNOWNX", "PROXY UNKNOWNX\r\n", 14),
    BAD("TCP4 without addresses", "PROXY TCP4 \r\n", 0),
    BAD("bare LF ends the line", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", 31),
    BAD("bare LF early", "PROXY\n", 6),
    BAD("CR not followed by LF", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rX", 32),
    BAD("CR CR LF", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\r\n", 32),
    BAD("bare LF after UNKNOWN", "PROXY UNKNOWN x\ny\r\n", 16),
    BAD("SP before CRLF", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", 31),
    BAD("two SP between fields", "PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", 20),
    BAD("tab between fields", "PROXY TCP4 1.2.3.4\t5.6.7.8 1 2\r\n", 19),
    BAD("destination port missing", "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", 0),
    BAD("a field too many", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", 31),
    BAD("octet with a leading zero", "PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", 20),
    BAD("last octet with a leading zero", "PROXY TCP4 1.2.3.4 5.6.7.08 1 2\r\n", 28),
    BAD("00 octet", "PROXY TCP4 1.2.3.4 0.0.0.00 1 2\r\n", 28),
    BAD("octet 256", "PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n", 21),
    BAD("octet 1000", "PROXY TCP4 1.2.3.1000 5.6.7.8 1 2\r\n", 22),
    BAD("three octets", "PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n", 17),
    BAD("five octets", "PROXY TCP4 1.2.3.4.5 5.6.7.8 1 2\r\n", 21),
    BAD("empty octet", "PROXY TCP4 1..3.4 5.6.7.8 1 2\r\n", 18),
    BAD("trailing dot", "PROXY TCP4 1.2.3.4. 5.6.7.8 1 2\r\n", 20),
    BAD("IPv4 as hex", "PROXY TCP4 0x1.2.3.4 5.6.7.8 1 2\r\n", 13),
    BAD("IPv4 longer than 15 bytes", "PROXY TCP4 1.2.3.4 1111.2222.3333.44", 35),
    BAD("IPv6 address with TCP4", "PROXY TCP4 ::1 ::1 1 2\r\n", 12),
    BAD("IPv4 address with TCP6", "PROXY TCP6 1.2.3.4 ::1 1 2\r\n", 19),
    BAD("port with a leading zero", "PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n", 31),
    BAD("port 00", "PROXY TCP4 1.2.3.4 5.6.7.8 1 00\r\n", 33),
    BAD("port 65536", "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", 33),
    BAD("port of six digits", "PROXY TCP4 1.2.3.4 5.6.7.8 1 100000", 35),
    BAD("port with a sign", "PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", 28),
    BAD("port empty", "PROXY TCP4 1.2.3.4 5.6.7.8  2\r\n", 28),
    BAD("IPv6 :::", "PROXY TCP6 ::: ::1 1 2\r\n", 15),
    BAD("IPv6 two ::", "PROXY TCP6 1::2::3 ::1 1 2\r\n", 19),
    BAD("IPv6 1:::2", "PROXY TCP6 1:::2 ::1 1 2\r\n", 17),
    BAD("IPv6 five hex digits", "PROXY TCP6 12345:: ::1 1 2\r\n", 19),
    BAD("IPv6 nine groups", "PROXY TCP6 1:2:3:4:5:6:7:8:9 ::1 1 2\r\n", 29),
    BAD("IPv6 seven groups", "PROXY TCP6 1:2:3:4:5:6:7 ::1 1 2\r\n", 25),
    BAD("IPv6 eight groups and ::", "PROXY TCP6 1:2:3:4:5:6:7:8:: ::1 1 2\r\n", 29),
    BAD("IPv6 single leading colon", "PROXY TCP6 :1:2:3:4:5:6:7 ::1 1 2\r\n", 26),
    BAD("IPv6 single trailing colon", "PROXY TCP6 1:2:3:4:5:6:7: ::1 1 2\r\n", 26),
    BAD("IPv6 non-hex digit", "PROXY TCP6 g::1 ::1 1 2\r\n", 12),
    BAD("IPv6 zone id", "PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", 19),
    BAD("IPv6 brackets", "PROXY TCP6 [::1] ::1 1 2\r\n", 12),
    BAD("IPv6 dotted tail of three octets", "PROXY TCP6 ::ffff:1.2.3 ::1 1 2\r\n", 24),
    BAD("IPv6 dotted tail with octet 256", "PROXY TCP6 ::ffff:256.1.1.1 ::1 1 2\r\n", 28),
    BAD("IPv6 dotted tail after seven groups", "PROXY TCP6 1:2:3:4:5:6:7:1.2.3.4 ::1 1 2\r\n", 33),
    BAD("IPv6 dotted tail not at the end", "PROXY TCP6 ::1.2.3.4:5 ::1 1 2\r\n", 23),
    BAD("IPv6 dotted tail after six groups and ::", "PROXY TCP6 1:2:3:4:5:6::1.2.3.4 ::1 1 2\r\n", 32),
    BAD("IPv6 longer than 45 bytes", "PROXY TCP6 0000:0000:0000:0000:0000:0000:0000:0000:0000:0000", 57),
    BAD("no CRLF in the first 107 bytes",
        "PROXY UNKNOWN " F39 " " F39 " 65535 655355\r\n", 107),
    BAD("CRLF ending at byte 108", "PROXY UNKNOWN " F39 " " F39 " 65535 65535 \r\n", 107),

    /* --- v2, valid --- */
    V2("v2 PROXY TCP4", SIG "\x21\x11\x00\x0c" A4, T4, ST, "192.0.2.1", "198.51.100.2", 56324, 443),
    { .comment = "v2 PROXY TCP4, then the request: only the header is consumed", IN(SIG "\x21\x11\x00\x0c" A4 HTTP),
      .ret = 28, .version = 2, .family = T4, .transport = ST, .src = "192.0.2.1", .dst = "198.51.100.2",
      .sport = 56324, .dport = 443 },
    V2("v2 PROXY UDP4", SIG "\x21\x12\x00\x0c" A4, T4, DG, "192.0.2.1", "198.51.100.2", 56324, 443),
    V2("v2 PROXY TCP6", SIG "\x21\x21\x00\x24" A6, T6, ST, "2001:db8::1", "2001:db8::2", 56324, 443),
    V2("v2 PROXY UDP6", SIG "\x21\x22\x00\x24" A6, T6, DG, "2001:db8::1", "2001:db8::2", 56324, 443),
    V2("v2 PROXY TCP6 IPv4-mapped",
       SIG "\x21\x21\x00\x24" "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xc0\x00\x02\x01"
           "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01" "\x00\x50" "\x00\x51",
       T6, ST, "::ffff:192.0.2.1", "::1", 80, 81),
    V2("v2 PROXY TCP4 with TLVs (NOOP, AUTHORITY, UNIQUE_ID, empty custom)",
       SIG "\x21\x11\x00\x27" A4 "\x04\x00\x00" "\x02\x00\x0b" "example.com" "\x05\x00\x04" "abcd" "\xe0\x00\x00",
       T4, ST, "192.0.2.1", "198.51.100.2", 56324, 443),
    V2("v2 PROXY TCP4 with a CRC32C TLV (skipped, not verified)",
       SIG "\x21\x11\x00\x13" A4 "\x03\x00\x04" "\x01\x02\x03\x04", T4, ST, "192.0.2.1", "198.51.100.2", 56324, 443),
    V2("v2 PROXY TCP4, ports 0 and 65535", SIG "\x21\x11\x00\x0c" "\x7f\x00\x00\x02" "\x7f\x00\x00\x01" "\x00\x00"
       "\xff\xff", T4, ST, "127.0.0.2", "127.0.0.1", 0, 65535),
    { .comment = "v2 LOCAL (a health check): the real peer stays", IN(SIG "\x20\x00\x00\x00"), .ret = ALL,
      .version = 2, .local = 1 },
    { .comment = "v2 LOCAL with an address block: skipped, family ignored", IN(SIG "\x20\x11\x00\x0c" A4),
      .ret = ALL, .version = 2, .local = 1 },
    { .comment = "v2 LOCAL with an undefined family and odd bytes: ignored", IN(SIG "\x20\xff\x00\x05" "abcde"),
      .ret = ALL, .version = 2, .local = 1 },
    { .comment = "v2 LOCAL then the request", IN(SIG "\x20\x00\x00\x00" HTTP), .ret = 16, .version = 2, .local = 1 },
    { .comment = "v2 PROXY AF_UNSPEC: the real peer stays", IN(SIG "\x21\x00\x00\x00"), .ret = ALL, .version = 2 },
    { .comment = "v2 PROXY AF_UNSPEC with bytes of its own: skipped", IN(SIG "\x21\x00\x00\x07" "1234567"),
      .ret = ALL, .version = 2 },

    /* --- v2, incomplete --- */
    MORE("v2: CR", "\r"),
    MORE("v2: half the signature", "\r\n\r\n\0\r"),
    MORE("v2: signature", SIG),
    MORE("v2: signature, version", SIG "\x21"),
    MORE("v2: no length yet", SIG "\x21\x11\x00"),
    MORE("v2: addresses partly there", SIG "\x21\x11\x00\x0c" "\xc0\x00\x02\x01\xc6"),
    MORE("v2: TLV partly there", SIG "\x21\x11\x00\x27" A4 "\x04\x00\x00" "\x02\x00\x0b" "exam"),

    /* --- v2, invalid --- */
    BAD("v2 signature: byte 3", "\r\n\n", 3),
    BAD("HTTP's leading CRLF then a request", "\r\n" HTTP, 3),
    BAD("v2 signature: byte 5 not NUL", "\r\n\r\n\x01", 5),
    BAD("v2 signature: QUIT lower case", "\x0D\x0A\x0D\x0A\x00\x0D\x0A\x71", 8),
    BAD("v2 version 1", SIG "\x11\x11\x00\x0c" A4, 13),
    BAD("v2 version 3", SIG "\x31\x11\x00\x0c" A4, 13),
    BAD("v2 command 2", SIG "\x22\x11\x00\x0c" A4, 13),
    BAD("v2 command 15", SIG "\x2f\x11\x00\x0c" A4, 13),
    BAD("v2 family 4", SIG "\x21\x41\x00\x0c" A4, 14),
    BAD("v2 transport 3", SIG "\x21\x13\x00\x0c" A4, 14),
    BAD("v2 AF_UNSPEC with STREAM (0x01)", SIG "\x21\x01\x00\x00", 14),
    BAD("v2 AF_INET with UNSPEC transport (0x10)", SIG "\x21\x10\x00\x0c" A4, 14),
    BAD("v2 TCP4 length 11", SIG "\x21\x11\x00\x0b" "\xc0\x00\x02\x01\xc6\x33\x64\x02\xdc\x04\x01", 16),
    BAD("v2 TCP4 length 0", SIG "\x21\x11\x00\x00", 16),
    BAD("v2 TCP6 length 12", SIG "\x21\x21\x00\x0c" A4, 16),
    BAD("v2 UNIX length 215", SIG "\x21\x31\x00\xd7", 16),
    BAD("v2 length over BB_PROXY_V2_MAX_BYTES (4081)", SIG "\x21\x11\x0f\xf1", 16),
    BAD("v2 length 65535", SIG "\x20\x00\xff\xff", 16),
    BAD("v2 TCP4, one byte after the addresses", SIG "\x21\x11\x00\x0d" A4 "\x04", 0),
    BAD("v2 TCP4, two bytes after the addresses", SIG "\x21\x11\x00\x0e" A4 "\x04\x00", 0),
    BAD("v2 TLV longer than the header", SIG "\x21\x11\x00\x10" A4 "\x04\x00\x02" "x", 0),
    BAD("v2 second TLV longer than the header", SIG "\x21\x11\x00\x13" A4 "\x04\x00\x01" "x" "\x04\x00\x01", 0),
};

/* ------------------------------------------------------------ rows built at run time */

#define N_BIG 8
static struct prow big_rows[N_BIG];
static size_t n_big;
static char big_buf[N_BIG][BB_PROXY_V2_MAX_BYTES + 64];

/* A v2 header: fam byte, addresses of addr_len bytes (pattern), then tlv_bytes bytes of TLVs. */
static size_t build_v2(char *p, unsigned char ver_cmd, unsigned char fam, size_t addr_len, size_t tlv_value_len)
{
    size_t len = addr_len + (tlv_value_len ? 3 + tlv_value_len : 0), n = 0;
    memcpy(p, SIG, 12);
    n = 12;
    p[n++] = (char)ver_cmd;
    p[n++] = (char)fam;
    p[n++] = (char)(len >> 8);
    p[n++] = (char)(len & 0xff);
    for (size_t i = 0; i < addr_len; i++) p[n++] = (char)('/' + i % 64);
    if (tlv_value_len) {
        p[n++] = (char)0xe1;
        p[n++] = (char)(tlv_value_len >> 8);
        p[n++] = (char)(tlv_value_len & 0xff);
        memset(p + n, 'v', tlv_value_len);
        n += tlv_value_len;
    }
    return n;
}

static void add_big(struct prow r, const char *buf, size_t len)
{
    r.in = buf;
    r.len = len;
    big_rows[n_big++] = r;
}

static void build_big_rows(void)
{
    size_t n;
    n = build_v2(big_buf[0], 0x21, 0x31, 216, 0);
    add_big((struct prow){ .comment = "v2 PROXY UNIX stream (216 address bytes): the real peer stays", .ret = ALL,
                           .version = 2, .family = BB_PROXY_UNIX, .transport = ST }, big_buf[0], n);
    n = build_v2(big_buf[1], 0x21, 0x32, 216, 40);
    add_big((struct prow){ .comment = "v2 PROXY UNIX datagram with a TLV", .ret = ALL, .version = 2,
                           .family = BB_PROXY_UNIX, .transport = DG }, big_buf[1], n);
    /* 16 + 12 + 3 + 4065 = 4096: the largest header accepted */
    n = build_v2(big_buf[2], 0x21, 0x11, 12, BB_PROXY_V2_MAX_BYTES - 16 - 12 - 3);
    add_big((struct prow){ .comment = "v2 header of exactly BB_PROXY_V2_MAX_BYTES", .ret = ALL, .version = 2,
                           .family = T4, .transport = ST, .src = "47.48.49.50", .dst = "51.52.53.54",
                           .sport = (('7' << 8) | '8'), .dport = (('9' << 8) | ':') }, big_buf[2], n);
    n = build_v2(big_buf[3], 0x21, 0x11, 12, BB_PROXY_V2_MAX_BYTES - 16 - 12 - 3 + 1);
    add_big((struct prow){ .comment = "v2 header of BB_PROXY_V2_MAX_BYTES + 1", .ret = -1, .early = 16 },
            big_buf[3], n);
    n = build_v2(big_buf[4], 0x20, 0x00, 0, BB_PROXY_V2_MAX_BYTES - 16 - 3);
    add_big((struct prow){ .comment = "v2 LOCAL of exactly BB_PROXY_V2_MAX_BYTES", .ret = ALL, .version = 2,
                           .local = 1 }, big_buf[4], n);
}

/* ------------------------------------------------------------ running a row */

static void report(int ok, const char *what, const char *comment, const char *why)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL %s: %s (%s)\n", what, comment, why ? why : "");
}

static const unsigned char untouched = 0xA5;

/* Parses buf[0..len); *out is pre-filled with a pattern. Sets *touched when it changed on ret <= 0. */
static int run(const char *buf, size_t len, struct bb_proxy *out, int *touched)
{
    struct bb_proxy pattern;
    memset(&pattern, untouched, sizeof(pattern));
    *out = pattern;
    int r = bb_parse_proxy(buf, len, out);
    *touched = r <= 0 && memcmp(out, &pattern, sizeof(pattern)) != 0;
    return r;
}

static int addr_is(const uint8_t *got, int family, const char *want)
{
    uint8_t bytes[16];
    memset(bytes, 0, sizeof(bytes));
    if (want && inet_pton(family == T4 ? AF_INET : AF_INET6, want, bytes) != 1) return 0;
    return memcmp(got, bytes, family == T4 ? 4 : 16) == 0;
}

static const char *check_out(const struct prow *r, const struct bb_proxy *px)
{
    if (px->version != r->version) return "version";
    if (px->local != r->local) return "local";
    if (px->family != r->family) return "family";
    if (px->transport != r->transport) return "transport";
    if (r->family == T4 || r->family == T6) {
        if (!addr_is(px->src_addr, r->family, r->src)) return "source address";
        if (!addr_is(px->dst_addr, r->family, r->dst)) return "destination address";
        if (px->src_port != r->sport) return "source port";
        if (px->dst_port != r->dport) return "destination port";
    }
    return NULL;
}

static void test_row(const struct prow *r)
{
    struct bb_proxy out;
    int touched, want = r->ret == ALL ? (int)r->len : r->ret;
    char why[96];

    int got = run(guarded(r->in, r->len), r->len, &out, &touched);
    const char *bad = got != want ? "return value" : touched ? "out written on -1/-2" : NULL;
    if (!bad && got > 0) bad = check_out(r, &out);
    if (bad && got != want) {
        snprintf(why, sizeof(why), "return value %d, want %d", got, want);
        bad = why;
    }
    report(bad == NULL, "one-shot", r->comment, bad);

    /* every prefix: -2 or the whole input's answer; the first -1 where the row says */
    size_t first_bad = 0;
    bad = NULL;
    for (size_t k = 0; k < r->len && !bad; k++) {
        got = run(guarded(r->in, k), k, &out, &touched);
        if (touched) bad = "out written on -1/-2";
        else if (got == -2) continue;
        else if (got == -1 && want == -1) {
            if (!first_bad) first_bad = k;
        } else if (got > 0 && got == want && (size_t)want <= k) {
            if (check_out(r, &out)) bad = "fields differ from one-shot";
        } else {
            snprintf(why, sizeof(why), "prefix of %zu bytes answered %d", k, got);
            bad = why;
        }
    }
    if (!bad && want == -1) {
        size_t expect = r->early ? r->early : r->len;
        if ((first_bad ? first_bad : r->len) != expect) {
            snprintf(why, sizeof(why), "first -1 at a prefix of %zu bytes, want %zu", first_bad ? first_bad : r->len,
                     expect);
            bad = why;
        }
    }
    report(bad == NULL, "every prefix", r->comment, bad);
}

/* A header, then the HTTP bytes that follow it, through every split of the two. */
static void misc_tests(void)
{
    static const char v1[] = "PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n" HTTP;
    struct bb_proxy out;
    int touched;
    report(run(v1, sizeof(v1) - 1, &out, &touched) == 45 && memcmp(v1 + 45, "GET ", 4) == 0, "misc",
           "v1: the HTTP bytes start right after the header", NULL);
    report(BB_PROXY_V1_MAX_BYTES == 107, "misc", "BB_PROXY_V1_MAX_BYTES is the spec's 107", NULL);
}

int main(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    build_big_rows();
    misc_tests();
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) test_row(&rows[i]);
    for (size_t i = 0; i < n_big; i++) test_row(&big_rows[i]);
    printf("test_proxy: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
