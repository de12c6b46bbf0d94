/*
 * bb_proxy.h - the PROXY protocol header (versions 1 and 2) a load balancer puts in front of
 * the first byte of a connection to say which client it relays (haproxy's doc/proxy-protocol.txt).
 *
 * Pure C99, like bb_http.[ch]: no Ruby, no allocation, no state between calls. Contract:
 *
 *     > 0   bytes consumed (the whole header; what follows is the proxied protocol's)
 *      -1   not a valid header: close the connection without answering
 *      -2   incomplete: call again with more bytes (from the same start)
 *
 * A prefix of the input gives -2 or the answer the whole input would give, so the bytes may
 * arrive in any number of pieces. Input that can no longer become a valid header (a first byte
 * that is neither 'P' nor CR, a v1 line without CRLF in its first 107 bytes, a v2 length above
 * BB_PROXY_V2_MAX_BYTES) is -1 at once, without waiting for more.
 */
#ifndef BB_PROXY_H
#define BB_PROXY_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of a v1 line at most, CRLF included: the spec's worst case,
 * "PROXY UNKNOWN <IPv6> <IPv6> 65535 65535\r\n". No CRLF by then -> -1. */
#define BB_PROXY_V1_MAX_BYTES 107
/* Bytes of a v2 header at most: 16 fixed, then the addresses (at most 216, AF_UNIX) and TLVs. The
 * spec keeps a header without TLVs within 536 bytes; TLVs (authority up to 255 bytes, a unique ID
 * up to 128, TLS details, a cloud balancer's IDs) can pass that, so allow 4 KiB, which still fits
 * a connection's first read buffer. A larger announced length -> -1 as soon as it is read. */
#define BB_PROXY_V2_MAX_BYTES 4096

/* Address family of struct bb_proxy. Only INET and INET6 carry an address to use; for the others
 * the connection's real peer stays the client's address. */
#define BB_PROXY_UNSPEC 0 /* v1 UNKNOWN, v2 LOCAL (a health check of the balancer), v2 AF_UNSPEC */
#define BB_PROXY_INET   1 /* v1 TCP4, v2 AF_INET */
#define BB_PROXY_INET6  2 /* v1 TCP6, v2 AF_INET6 */
#define BB_PROXY_UNIX   3 /* v2 AF_UNIX: the client's socket has no IP address */

/* Transport of struct bb_proxy. */
#define BB_PROXY_STREAM 1 /* TCP (every v1 address), or v2 SOCK_STREAM */
#define BB_PROXY_DGRAM  2 /* v2 SOCK_DGRAM (UDP, e.g. QUIC in front) */

struct bb_proxy {
    int version;         /* 1 (text) or 2 (binary) */
    int local;           /* v2 LOCAL command: the balancer's own connection; family is UNSPEC */
    int family;          /* BB_PROXY_* family above */
    int transport;       /* BB_PROXY_STREAM, BB_PROXY_DGRAM, or 0 (unspecified) */
    uint8_t src_addr[16]; /* INET/INET6: the client's address, network byte order (INET: 4 bytes) */
    uint8_t dst_addr[16]; /* INET/INET6: the address the client connected to */
    uint16_t src_port;   /* INET/INET6: the client's port */
    uint16_t dst_port;   /* INET/INET6: the port the client connected to */
};

/*
 * Parses the PROXY protocol header at the start of buf[0..len). *out is written only when the
 * return value is > 0.
 *
 * v1: "PROXY" SP ("TCP4" | "TCP6") SP src SP dst SP srcport SP dstport CRLF, or "PROXY UNKNOWN"
 * followed by CRLF or by SP and anything but CR and LF up to CRLF (ignored). Exactly one SP
 * between fields. IPv4: four decimal numbers 0-255 without leading zeros; IPv6: 1-4 hex digits a
 * group, at most one "::" (standing for at least one zero group), optionally ending in a dotted
 * IPv4 address (::ffff:192.0.2.1); TCP4 takes IPv4 addresses only, TCP6 IPv6 ones only. Ports:
 * 0-65535 without leading zeros. A bare CR or LF, a line over BB_PROXY_V1_MAX_BYTES -> -1.
 *
 * v2: the 12-byte signature, version 2, command LOCAL (0: family and addresses ignored) or PROXY
 * (1), then a family/transport byte the spec lists (0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32),
 * a 16-bit length that covers at least that family's addresses (12, 36, 216 bytes) and keeps the
 * header within BB_PROXY_V2_MAX_BYTES. After INET, INET6 and UNIX addresses, the rest must be
 * whole TLVs (type, 16-bit length, value), which are skipped; after LOCAL or AF_UNSPEC the rest is
 * skipped as it is. Anything else -> -1.
 */
int bb_parse_proxy(const char *buf, size_t len, struct bb_proxy *out);

#endif
