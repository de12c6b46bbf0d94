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

/* Takes one connection off sock without blocking (wake-ups before it are taken and skipped): its fd
 * (close-on-exec), *p, and the bytes it carries into bytes (room for cap), their count into *len.
 * -1 with errno: EAGAIN when nothing is queued; EBADMSG for a message that is not a whole
 * bb_pass with exactly one fd, or carries more than cap bytes (every fd it carried is closed);
 * ECONNABORTED when the message was whole but the kernel could not give this process a descriptor
 * for its socket (MSG_CTRUNC: the table was full) and dropped it, *p filled (the connection is
 * lost: take only after bb_pass_room); else the failure. */
int bb_pass_recv(int sock, struct bb_pass *p, char *bytes, size_t cap, size_t *len);

/* Whether this process may take a connection now and keep `reserve` descriptors free besides: 1
 * when its lowest free descriptor number is more than `reserve` below its soft RLIMIT_NOFILE (the
 * kernel hands out the lowest free number, so in a table without holes that number is the count of
 * open descriptors); 0 with errno EMFILE when it is not, or with the errno of the failure when no
 * descriptor can be made at all (EMFILE, ENFILE). Costs a dup, a close and a getrlimit: no /proc.
 * fd: any open descriptor (duplicated once to find the lowest free number). */
int bb_pass_room(int fd, int reserve);

/* A receiver that leaves a connection queued (no room) took the one wake-up the kernel gives for it
 * (receivers poll with EPOLLEXCLUSIVE): once it has stopped polling, it passes the wake-up on to the
 * others with this message of no connection, which bb_pass_recv skips. Sent on the send end, without
 * blocking. 0 sent; -1 with errno (EAGAIN: the queue is full, and its receivers have plenty to wake for). */
int bb_pass_wake(int sock);

/* What is next on sock, without taking it (and without making a descriptor): */
#define BB_PASS_NEXT_NONE 0 /* nothing is queued */
#define BB_PASS_NEXT_CONN 1 /* a connection (or a malformed message: bb_pass_recv says which) */
#define BB_PASS_NEXT_WAKE 2 /* a wake-up (bb_pass_wake) */
/* -1 with errno on failure. */
int bb_pass_next(int sock);

/* Why a move between workers did not happen (Scoreboard::HANDOFF_FAILURES names them, in this order). */
enum bb_handoff_failure {
    BB_HANDOFF_REFUSED = 0,   /* the receiver had too few descriptors free: it left the connection queued */
    BB_HANDOFF_SEND_FAILED,   /* the send failed (not a full queue): the connection stayed with its worker */
    BB_HANDOFF_LOST,          /* the kernel dropped the socket at the receiver (no descriptor free): reset */
    BB_HANDOFF_FAILURE_KINDS
};
/* Where this process counts them: counters[why] (BB_HANDOFF_FAILURE_KINDS of them; the worker's own
 * scoreboard slot, set at its reset), or NULL: not counted (the master; set back when the slot goes). */
void bb_pass_count_into(uint64_t *counters);
/* Counts one move that did not happen (why: enum bb_handoff_failure). Any thread: atomic adds. */
void bb_pass_failed(int why);

#endif
