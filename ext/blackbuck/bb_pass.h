/*
 * bb_pass.h - moving an accepted connection to another worker process: its socket travels as
 * SCM_RIGHTS over a SOCK_SEQPACKET UNIX socket shared by a generation's workers, with what the
 * receiver needs to go on serving it. Pure C (no Ruby), tested alone under ASan (test/c/test_pass.c).
 *
 * The bytes of the connection's next request are usually still in the kernel's socket buffer, so
 * they travel with the socket. A request a worker has already read (and queued for its app threads,
 * which are all busy) travels as bytes in the message, after the record: the receiver reads them
 * before the socket's.
 */
#ifndef BB_PASS_H
#define BB_PASS_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of a REMOTE_ADDR text at most (INET6_ADDRSTRLEN - 1: an IPv6 address with an IPv4 tail). */
#define BB_PASS_ADDR_MAX 45

/* The listener accepted a TCP connection (not a UNIX socket one). */
#define BB_PASS_TCP 1u

struct bb_pass {
    uint32_t listener; /* index of the listener that accepted it (the same order in every worker) */
    uint32_t flags;    /* BB_PASS_TCP */
    int64_t requests;  /* requests already served on it (max_keepalive_requests goes on counting) */
    double ready_at;   /* CLOCK_MONOTONIC seconds when its next request was seen waiting (queue time) */
    char addr[BB_PASS_ADDR_MAX + 1]; /* REMOTE_ADDR, NUL-terminated; "" when it has none */
};

/* Bytes of an already-read request a message carries at most (a larger one stays where it is). */
#define BB_PASS_BYTES_MAX (64 * 1024)

/* Sends fd, *p and the len bytes at bytes (already read from fd; len 0: none) over sock without
 * blocking. The sender keeps its own fd (close it once the receiver may have it: the socket stays
 * open while either holds it).
 * 0 sent; -1 with errno: EAGAIN when the queue is full (nothing was sent), EMSGSIZE for len over
 * BB_PASS_BYTES_MAX, else the failure. */
int bb_pass_send(int sock, int fd, const struct bb_pass *p, const char *bytes, size_t len);

/* Takes one connection off sock without blocking: its fd (close-on-exec), *p, and the bytes it
 * carries into bytes (room for cap), their count into *len.
 * -1 with errno: EAGAIN when nothing is queued; EBADMSG for a message that is not a whole
 * bb_pass with exactly one fd, or carries more than cap bytes (every fd it carried is closed);
 * else the failure. */
int bb_pass_recv(int sock, struct bb_pass *p, char *bytes, size_t cap, size_t *len);

#endif
