/*
 * test_out.c - a connection's output queue (ext/blackbuck/bb_out.c) under ASan/UBSan: what the
 * socket does not take goes to memory up to mem_max, then to a spill file up to spill_max and the
 * process's pool_max, and what fits nowhere is left to the caller; flush sends memory, spill file and
 * file body in that order, byte for byte, with sendfile(2) and with the pread + write copy; a spill
 * file that cannot be made says so and stops spilling until the next response; what no spill file can
 * take is held in memory behind it, within the process's held_max; the bytes queued are counted in all
 * four places at every step of a flush (bb_out_queued_bytes); a file body that
 * shrinks is reported; releasing a queue closes its files and gives its bytes back to the pool; no
 * descriptor leaks (counted in /proc/self/fd before and after).
 */
#define _GNU_SOURCE
#include "bb_out.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

#define KIB 1024
#define MIB (1024 * 1024)

/* A non-blocking socket pair with small buffers, so the sender fills at once: sv[0] sends, sv[1] reads. */
static void small_pair(int sv[2])
{
    int small = 4 * KIB;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("socketpair");
        exit(2);
    }
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
}

/* Bytes i of a test stream: a pattern whose every offset is told apart from its neighbours'. */
static char pattern(size_t i) { return (char)('a' + (i * 7 + i / 251) % 26); }

static void fill(char *p, size_t n, size_t from)
{
    size_t i;
    for (i = 0; i < n; i++) p[i] = pattern(from + i);
}

/* Reads what is in the socket into got (room: cap), from *len on. */
static void drain(int fd, char *got, size_t cap, size_t *len)
{
    for (;;) {
        ssize_t r = read(fd, got + *len, cap - *len);
        if (r <= 0) return;
        *len += (size_t)r;
    }
}

/* Flushes o to sv[0] while reading sv[1], until all is sent: the bytes read, in got. The last flush result in *last. */
static size_t flush_all(struct bb_out *o, struct bb_spill_pool *pool, int sv[2], char *got, size_t cap, int *last)
{
    size_t len = 0;
    int turns = 0;
    do {
        *last = bb_out_flush(o, sv[0], pool);
        drain(sv[1], got, cap, &len);
    } while (*last == BB_OUT_PENDING && ++turns < 1000000);
    drain(sv[1], got, cap, &len);
    return len;
}

static int matches(const char *got, size_t n, size_t from)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (got[i] != pattern(from + i)) return 0;
    return 1;
}

static void test_iov_skip(void)
{
    char a[4], b[4];
    struct iovec iov[4] = {{a, 0}, {a, 4}, {b, 0}, {b, 4}};
    int i = 0;
    bb_iov_skip(iov, &i, 4, 0);
    CHECK(i == 1, "leading empty entry skipped: %d", i);
    bb_iov_skip(iov, &i, 4, 4);
    CHECK(i == 3, "a whole entry and the empty one after it: %d", i);
    bb_iov_skip(iov, &i, 4, 1);
    CHECK(i == 3 && iov[3].iov_base == b + 1 && iov[3].iov_len == 3, "a part of an entry");
    bb_iov_skip(iov, &i, 4, 3);
    CHECK(i == 4, "all consumed: %d", i);
}

/* Memory up to mem_max, then the spill file, then nothing (left to the caller); flushed in order. */
static void test_memory_then_spill_then_left(void)
{
    struct bb_out_limits lim = {64 * KIB, 256 * KIB, 1 * MIB, 0};
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out o;
    size_t total = 400 * KIB, part = 100 * KIB, got_len;
    char *src = malloc(total), *got = malloc(total);
    struct iovec iov[4];
    const char *op = "unset";
    int sv[2], i = 0, k, last, before = open_fds();
    fill(src, total, 0);
    small_pair(sv);
    bb_out_init(&o);
    CHECK(!bb_out_queued(&o), "a new queue is empty");
    for (k = 0; k < 4; k++) {
        iov[k].iov_base = src + (size_t)k * part;
        iov[k].iov_len = part;
    }
    CHECK(bb_out_queue(&o, &pool, &lim, iov, &i, 4, &op) == 0, "queued");
    CHECK(o.len - o.off == 64 * KIB, "memory holds mem_max: %zu", o.len - o.off);
    CHECK(o.cap <= 64 * KIB, "memory never grows past mem_max: %zu", o.cap);
    CHECK(o.spill_fd >= 0 && o.spill_len == 256 * KIB, "the spill file holds spill_max: %lld", (long long)o.spill_len);
    CHECK(pool.total == 256 * KIB, "the pool counts it: %lld", (long long)pool.total);
    CHECK(i == 3 && iov[3].iov_base == src + 320 * KIB && iov[3].iov_len == 80 * KIB,
          "what fits nowhere is left: entry %d, %zu bytes", i, iov[i < 4 ? i : 3].iov_len);
    CHECK(bb_out_queued(&o), "queued");

    got_len = flush_all(&o, &pool, sv, got, total, &last);
    CHECK(last == BB_OUT_DONE, "all sent: %d", last);
    CHECK(got_len == 320 * KIB && matches(got, got_len, 0), "memory then spill file, in order: %zu bytes", got_len);
    CHECK(o.spill_fd == -1 && pool.total == 0, "the spill file is closed once sent, its bytes back in the pool");
    CHECK(!bb_out_queued(&o), "empty once sent");
    CHECK(o.buf != NULL, "the memory queue is kept (mem_max is below BB_OUT_KEEP_MAX)");
    bb_out_trim(&o);
    CHECK(o.buf != NULL, "trim keeps a small buffer");
    bb_out_discard(&o, &pool);
    CHECK(o.buf == NULL && o.cap == 0, "discard frees it");
    close(sv[0]);
    close(sv[1]);
    CHECK(open_fds() == before, "no descriptor leaks: %d -> %d", before, open_fds());
    free(src);
    free(got);
}

/* Bytes queued behind a spill file go to the spill file (memory takes nothing while one is open),
 * and the pool's cap counts every queue's spill file. */
static void test_pool_cap_and_order_behind_spill(void)
{
    struct bb_out_limits lim = {16 * KIB, 1 * MIB, 48 * KIB, 0};
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out a, b;
    char *src = malloc(128 * KIB);
    struct iovec iov;
    const char *op;
    int i;
    fill(src, 128 * KIB, 0);
    bb_out_init(&a);
    bb_out_init(&b);
    iov.iov_base = src;
    iov.iov_len = 48 * KIB;
    i = 0;
    CHECK(bb_out_queue(&a, &pool, &lim, &iov, &i, 1, &op) == 0 && i == 1, "a: 16 KiB memory, 32 KiB spilled");
    CHECK(a.spill_len == 32 * KIB && pool.total == 32 * KIB, "a spilled %lld", (long long)a.spill_len);
    a.off = a.len = 0; /* as if its memory had been sent: memory still takes nothing behind the spill file */
    iov.iov_base = src;
    iov.iov_len = 4 * KIB;
    i = 0;
    CHECK(bb_out_queue(&a, &pool, &lim, &iov, &i, 1, &op) == 0 && i == 1 && a.len == 0 && a.spill_len == 36 * KIB,
          "behind a spill file, bytes go to the spill file: memory %zu, spill %lld", a.len, (long long)a.spill_len);
    iov.iov_base = src;
    iov.iov_len = 64 * KIB;
    i = 0;
    CHECK(bb_out_queue(&b, &pool, &lim, &iov, &i, 1, &op) == 0, "b queued");
    CHECK(b.spill_len == 12 * KIB && pool.total == 48 * KIB, "b spills only what the pool has left: %lld",
          (long long)b.spill_len);
    CHECK(i == 0 && iov.iov_len == 36 * KIB, "the rest fits nowhere: %zu", iov.iov_len);
    bb_out_discard(&a, &pool);
    CHECK(pool.total == 12 * KIB, "releasing a gives its bytes back: %lld", (long long)pool.total);
    bb_out_discard(&b, &pool);
    CHECK(pool.total == 0 && b.spill_fd == -1, "and b's");
    free(src);
}

/* What no spill file can take is held in memory behind it, within held_max for every queue together;
 * once anything is held, later bytes go behind it too (never to memory ahead of it); flushed in order:
 * memory, spill file, held; the held bytes go back to the pool once sent or released. */
static void test_held_behind_spill(void)
{
    struct bb_out_limits lim = {16 * KIB, 32 * KIB, 1 * MIB, 64 * KIB};
    struct bb_out_limits nospill = {16 * KIB, 0, 1 * MIB, 64 * KIB};
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out a, b;
    size_t total = 200 * KIB, got_len;
    char *src = malloc(total), *got = malloc(total);
    struct iovec iov;
    const char *op = "unset";
    int sv[2], i = 0, last, before = open_fds();
    fill(src, total, 0);
    small_pair(sv);
    bb_out_init(&a);
    bb_out_init(&b);
    iov.iov_base = src;
    iov.iov_len = total;
    CHECK(bb_out_queue(&a, &pool, &lim, &iov, &i, 1, &op) == 0, "queued");
    CHECK(a.len - a.off == 16 * KIB && a.spill_len == 32 * KIB && a.held_len == 64 * KIB,
          "memory, spill file, then held: %zu %lld %zu", a.len - a.off, (long long)a.spill_len, a.held_len);
    CHECK(pool.held == 64 * KIB && i == 0 && iov.iov_len == 88 * KIB, "held_max reached, the rest left: %zu",
          iov.iov_len);
    i = 0;
    iov.iov_base = src;
    iov.iov_len = 40 * KIB;
    CHECK(bb_out_queue(&b, &pool, &nospill, &iov, &i, 1, &op) == 0, "b queued");
    CHECK(b.len == 16 * KIB && b.held_len == 0 && iov.iov_len == 24 * KIB, "held_max is the process's: b holds %zu",
          b.held_len);

    got_len = flush_all(&a, &pool, sv, got, total, &last);
    CHECK(last == BB_OUT_DONE && got_len == 112 * KIB && matches(got, got_len, 0),
          "memory, spill file, held, in order: %zu bytes", got_len);
    CHECK(pool.held == 0 && a.held == NULL && !bb_out_queued(&a), "held bytes back in the pool once sent");

    /* b: no spill at all; the rest is held now, and what comes later goes behind it */
    CHECK(bb_out_queue(&b, &pool, &nospill, &iov, &i, 1, &op) == 0 && i == 1 && b.held_len == 24 * KIB,
          "without spilling, held: %zu", b.held_len);
    b.off = b.len = 0; /* as if its memory had been sent: memory still takes nothing ahead of held bytes */
    iov.iov_base = src + 40 * KIB;
    iov.iov_len = 8 * KIB;
    i = 0;
    CHECK(bb_out_queue(&b, &pool, &nospill, &iov, &i, 1, &op) == 0 && b.len == 0 && b.held_len == 32 * KIB,
          "behind held bytes, bytes are held: memory %zu, held %zu", b.len, b.held_len);
    got_len = flush_all(&b, &pool, sv, got, total, &last);
    CHECK(last == BB_OUT_DONE && got_len == 32 * KIB && matches(got, got_len, 16 * KIB), "held bytes in order: %zu",
          got_len);
    iov.iov_base = src;
    iov.iov_len = 100 * KIB;
    i = 0;
    CHECK(bb_out_queue(&b, &pool, &nospill, &iov, &i, 1, &op) == 0 && pool.held == 64 * KIB, "held again");
    bb_out_discard(&b, &pool);
    CHECK(pool.held == 0 && b.held == NULL, "release gives held bytes back");
    bb_out_discard(&a, &pool);
    close(sv[0]);
    close(sv[1]);
    CHECK(open_fds() == before, "no descriptor leaks: %d -> %d", before, open_fds());
    free(src);
    free(got);
}

/* A spill file that cannot be made: -1, "open", errno; no more spilling until bb_out_next. */
static void test_spill_failure(void)
{
    struct bb_out_limits lim = {8 * KIB, 1 * MIB, 1 * MIB, 0};
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out o;
    char src[32 * KIB];
    struct iovec iov;
    const char *op = NULL;
    const char *old = getenv("TMPDIR");
    char *saved = old ? strdup(old) : NULL;
    int i = 0, r;
    fill(src, sizeof(src), 0);
    bb_out_init(&o);
    setenv("TMPDIR", "/nonexistent-bb-out-test", 1);
    CHECK(strcmp(bb_out_spill_dir(), "/nonexistent-bb-out-test") == 0, "spill dir from TMPDIR");
    iov.iov_base = src;
    iov.iov_len = sizeof(src);
    errno = 0;
    r = bb_out_queue(&o, &pool, &lim, &iov, &i, 1, &op);
    CHECK(r == -1 && op && strcmp(op, "open") == 0 && errno == ENOENT, "open failed: %d %s %d", r, op ? op : "-", errno);
    CHECK(o.spill_failed && o.spill_fd == -1 && o.len == 8 * KIB && i == 0 && iov.iov_len == 24 * KIB,
          "memory took its share, the rest is left");
    o.off = o.len = 0;
    op = "unset";
    r = bb_out_queue(&o, &pool, &lim, &iov, &i, 1, &op);
    CHECK(r == 0 && o.spill_fd == -1 && o.len == 8 * KIB, "no spill attempt until the next response");
    bb_out_next(&o);
    setenv("TMPDIR", "", 1);
    CHECK(strcmp(bb_out_spill_dir(), "/tmp") == 0, "an empty TMPDIR means /tmp");
    if (saved) setenv("TMPDIR", saved, 1);
    else unsetenv("TMPDIR");
    o.off = o.len = 0;
    r = bb_out_queue(&o, &pool, &lim, &iov, &i, 1, &op);
    CHECK(r == 0 && o.spill_fd >= 0 && o.spill_len == 8 * KIB && i == 1, "spills again after bb_out_next");
    bb_out_discard(&o, &pool);
    CHECK(pool.total == 0, "pool back to 0");
    free(saved);
}

/* A temporary file holding pattern bytes [from, from + n). */
static int pattern_file(size_t n, size_t from)
{
    char *p = malloc(n);
    int fd = bb_out_spill_open(bb_out_spill_dir());
    fill(p, n, from);
    if (fd < 0 || write(fd, p, n) != (ssize_t)n) {
        perror("pattern file");
        exit(2);
    }
    free(p);
    return fd;
}

/* Memory, spill file, file body: in that order, with sendfile and with the copy. */
static void test_file_body_last(int copy)
{
    struct bb_out_limits lim = {16 * KIB, 1 * MIB, 1 * MIB, 0};
    struct bb_spill_pool pool = {0, copy, 0};
    struct bb_out o;
    size_t head = 40 * KIB, body = 300 * KIB, got_len;
    char *src = malloc(head), *got = malloc(head + body + 1);
    struct iovec iov;
    const char *op;
    int sv[2], i = 0, last, before = open_fds();
    fill(src, head, 0);
    small_pair(sv);
    bb_out_init(&o);
    iov.iov_base = src;
    iov.iov_len = head;
    CHECK(bb_out_queue(&o, &pool, &lim, &iov, &i, 1, &op) == 0 && i == 1 && o.spill_len == 24 * KIB, "head queued");
    bb_out_file(&o, pattern_file(body, head), (int64_t)body);
    o.file_copy = copy;
    got_len = flush_all(&o, &pool, sv, got, head + body + 1, &last);
    CHECK(last == BB_OUT_DONE, "sent (copy %d): %d", copy, last);
    CHECK(got_len == head + body && matches(got, got_len, 0), "memory, spill file, file body in order (copy %d): %zu",
          copy, got_len);
    CHECK(o.file_fd == -1 && o.spill_fd == -1 && !bb_out_queued(&o), "all closed once sent");
    bb_out_discard(&o, &pool);
    close(sv[0]);
    close(sv[1]);
    CHECK(open_fds() == before, "no descriptor leaks: %d -> %d", before, open_fds());
    free(src);
    free(got);
}

/* A file body shorter than promised: BB_OUT_SHORT, the file still open at where it ended. */
static void test_file_body_short(void)
{
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out o;
    char got[64 * KIB];
    int sv[2], last, before = open_fds();
    size_t got_len;
    small_pair(sv);
    bb_out_init(&o);
    bb_out_file(&o, pattern_file(10 * KIB, 0), 20 * KIB);
    got_len = flush_all(&o, &pool, sv, got, sizeof(got), &last);
    CHECK(last == BB_OUT_SHORT && o.file_fd >= 0 && o.file_off == 10 * KIB, "short at %lld: %d", (long long)o.file_off,
          last);
    CHECK(got_len == 10 * KIB && matches(got, got_len, 0), "what the file had was sent: %zu", got_len);
    bb_out_file_close(&o);
    CHECK(!bb_out_queued(&o), "closed");
    close(sv[0]);
    close(sv[1]);
    CHECK(open_fds() == before, "no descriptor leaks: %d -> %d", before, open_fds());
}

/* A broken connection: BB_OUT_FAILED; release closes everything. */
static void test_failed_and_release(void)
{
    struct bb_out_limits lim = {8 * KIB, 1 * MIB, 1 * MIB, 0};
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out o;
    char src[32 * KIB];
    struct iovec iov = {src, sizeof(src)};
    const char *op;
    int sv[2], i = 0, before = open_fds();
    fill(src, sizeof(src), 0);
    small_pair(sv);
    bb_out_init(&o);
    CHECK(bb_out_queue(&o, &pool, &lim, &iov, &i, 1, &op) == 0 && o.spill_fd >= 0, "spilled");
    bb_out_file(&o, pattern_file(KIB, 0), KIB);
    close(sv[1]);
    signal(SIGPIPE, SIG_IGN);
    CHECK(bb_out_flush(&o, sv[0], &pool) == BB_OUT_FAILED, "the peer is gone");
    bb_out_discard(&o, &pool);
    CHECK(!bb_out_queued(&o) && o.buf == NULL && pool.total == 0, "released");
    close(sv[0]);
    CHECK(open_fds() == before, "no descriptor leaks: %d -> %d", before, open_fds());
}

/* A big memory queue is freed once sent (bb_out_trim), not while bytes wait in it. */
static void test_trim(void)
{
    struct bb_out_limits lim = {1 * MIB, 0, 0, 0};
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out o;
    char *src = malloc(BB_OUT_KEEP_MAX + KIB);
    struct iovec iov = {src, BB_OUT_KEEP_MAX + KIB};
    const char *op;
    int i = 0;
    memset(src, 'x', BB_OUT_KEEP_MAX + KIB);
    bb_out_init(&o);
    CHECK(bb_out_queue(&o, &pool, &lim, &iov, &i, 1, &op) == 0 && i == 1 && o.spill_fd == -1, "all in memory");
    CHECK(o.cap > BB_OUT_KEEP_MAX, "a big buffer: %zu", o.cap);
    bb_out_trim(&o);
    CHECK(o.buf != NULL, "kept while bytes wait in it");
    o.off = o.len;
    bb_out_trim(&o);
    CHECK(o.buf == NULL && o.cap == 0 && o.len == 0, "freed once sent");
    bb_out_discard(&o, &pool);
    free(src);
}

/* bb_out_queued_bytes (a stream's back-pressure weighs it against its high-water mark): the bytes not
 * sent yet in all four places (memory, spill file, held memory, file body), at every step of a flush
 * that the client takes a little at a time: what was queued less what the client has read. */
static void test_queued_bytes(void)
{
    struct bb_out_limits lim = {16 * KIB, 32 * KIB, 1 * MIB, 64 * KIB};
    struct bb_spill_pool pool = {0, 0, 0};
    struct bb_out o;
    size_t head = 100 * KIB, body = 10 * KIB, total = head + body, got_len = 0;
    char *src = malloc(head), *got = malloc(total + 1);
    struct iovec iov;
    const char *op;
    int sv[2], i = 0, last, turns = 0, before = open_fds();
    fill(src, head, 0);
    small_pair(sv);
    bb_out_init(&o);
    CHECK(bb_out_queued_bytes(&o) == 0, "an empty queue: %lld", (long long)bb_out_queued_bytes(&o));
    iov.iov_base = src;
    iov.iov_len = head;
    CHECK(bb_out_queue(&o, &pool, &lim, &iov, &i, 1, &op) == 0 && i == 1, "queued");
    CHECK(o.len - o.off == 16 * KIB && o.spill_len == 32 * KIB && o.held_len == 52 * KIB,
          "in all three: memory %zu, spill %lld, held %zu", o.len - o.off, (long long)o.spill_len, o.held_len);
    CHECK(bb_out_queued_bytes(&o) == (int64_t)head, "memory + spill + held: %lld", (long long)bb_out_queued_bytes(&o));
    bb_out_file(&o, pattern_file(body, head), (int64_t)body);
    CHECK(bb_out_queued_bytes(&o) == (int64_t)total, "and the file body: %lld", (long long)bb_out_queued_bytes(&o));
    do {
        last = bb_out_flush(&o, sv[0], &pool);
        drain(sv[1], got, total + 1, &got_len); /* (the socket is empty again: all the flush sent is in got) */
        CHECK(bb_out_queued_bytes(&o) == (int64_t)(total - got_len), "turn %d: %lld queued, %zu of %zu read", turns,
              (long long)bb_out_queued_bytes(&o), got_len, total);
    } while (last == BB_OUT_PENDING && ++turns < 1000000);
    CHECK(last == BB_OUT_DONE && got_len == total && matches(got, got_len, 0), "all sent in order: %zu", got_len);
    CHECK(turns > 4, "the client took it a little at a time: %d turns", turns);
    CHECK(bb_out_queued_bytes(&o) == 0 && !bb_out_queued(&o), "nothing queued once sent");
    bb_out_discard(&o, &pool);
    close(sv[0]);
    close(sv[1]);
    CHECK(open_fds() == before, "no descriptor leaks: %d -> %d", before, open_fds());
    free(src);
    free(got);
}

int main(void)
{
    int before = open_fds();
    test_iov_skip();
    test_memory_then_spill_then_left();
    test_pool_cap_and_order_behind_spill();
    test_spill_failure();
    test_held_behind_spill();
    test_file_body_last(0);
    test_file_body_last(1);
    test_file_body_short();
    test_failed_and_release();
    test_trim();
    test_queued_bytes();
    CHECK(open_fds() == before, "no descriptor leaks overall: %d -> %d", before, open_fds());
    printf("test_out: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
