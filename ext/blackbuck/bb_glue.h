/*
 * bb_glue.h - what every file of the Ruby glue uses (everything here knows Ruby; the pure C files,
 * bb_http, bb_proxy, bb_pass and bb_out, do not): the Native module, interned strings, the server's
 * logger, waiting for a socket without the GVL, peer addresses, accept4, status lines and the Date
 * header. It includes no other bb_ header, so the files above it form no cycle (docs/ARCHITECTURE.md).
 */
#ifndef BB_GLUE_H
#define BB_GLUE_H

#include <ruby.h>
#include <ruby/encoding.h>
#include <ruby/thread.h>

extern VALUE bb_mBlackbuck, bb_mNative;

/* Interned (deduplicated, frozen) string; no allocation when it already exists. */
VALUE bb_fstring(const char *ptr, long len);

/* Logs one warning line through the server's logger (Native.logger=); nothing when none is set. */
void bb_warn(VALUE msg);

/* Waits until fd is writable or timeout_ms passes, without holding the GVL. 1 ready, 0 timeout, -1 error. */
int bb_wait_writable(int fd, int timeout_ms);

/* accept4 with peer address; -1 when nothing is pending (see bb_glue.c). */
int bb_accept(int lfd, int tcp, VALUE *addr);
/* An IPv4 (AF_INET) or IPv6 (AF_INET6) address as REMOTE_ADDR shows it (interned); nil if af is neither. */
VALUE bb_ip_string(int af, const void *addr);

/* Status lines ("HTTP/1.1 200 OK\r\n") built once at boot from Rack's table. */
const char *bb_status_line(int status, size_t *len);
/* "Date: Sun, 22 Nov 2026 00:00:00 GMT\r\n", refreshed at most once a second. */
const char *bb_date_header(size_t *len);

/* Defines Blackbuck::Native and its process-wide functions (set_reason, defer_accept, sched_batch,
 * logger=); first of the extension's init calls. */
void bb_init_glue(void);

#endif
