/*
 * bb_out.c - see bb_out.h: a connection's unsent response bytes, in memory, then in a spill file,
 * then a file body; sent with write(2), then sendfile(2) (pread + write where it cannot).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* O_TMPFILE */
#endif
#include "bb_out.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef HAVE_SYS_SENDFILE_H
#include <sys/sendfile.h>
#endif

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

static void spill_close(struct bb_out *o, struct bb_spill_pool *pool)
{
    pool->total -= o->spill_len;
    if (o->spill_fd >= 0) close(o->spill_fd);
    o->spill_fd = -1;
    o->spill_off = o->spill_len = 0;
}

void bb_out_file_close(struct bb_out *o)
{
    if (o->file_fd >= 0) close(o->file_fd);
    o->file_fd = -1;
    o->file_off = o->file_end = 0;
}

static void held_free(struct bb_out *o, struct bb_spill_pool *pool)
{
    pool->held -= (int64_t)o->held_len;
    free(o->held);
    o->held = NULL;
    o->held_cap = o->held_off = o->held_len = 0;
}

void bb_out_release(struct bb_out *o, struct bb_spill_pool *pool)
{
    spill_close(o, pool);
    held_free(o, pool);
    bb_out_file_close(o);
    free(o->buf);
    o->buf = NULL;
    o->cap = o->off = o->len = 0;
}

void bb_out_trim(struct bb_out *o)
{
    if (o->off < o->len || o->cap <= BB_OUT_KEEP_MAX) return;
    free(o->buf);
    o->buf = NULL;
    o->cap = o->off = o->len = 0;
}

/* Appends up to n bytes to the memory queue, which holds at most mem_max bytes and takes nothing
 * while a spill file is open (its bytes come first). The bytes taken, or -1 (ENOMEM). */
static ptrdiff_t mem_append(struct bb_out *o, size_t mem_max, const char *p, size_t n)
{
    size_t pending = o->len - o->off;
    if (o->spill_fd >= 0 || o->held_len > 0 || pending >= mem_max) return 0;
    if (n > mem_max - pending) n = mem_max - pending;
    if (n == 0) return 0;
    if (o->len + n > o->cap && o->off > 0) { /* compact before growing */
        memmove(o->buf, o->buf + o->off, pending);
        o->off = 0;
        o->len = pending;
    }
    if (o->len + n > o->cap) {
        size_t ncap = o->cap ? o->cap : BB_OUT_INITIAL;
        char *nb;
        while (ncap < o->len + n) ncap *= 2;
        if (ncap > mem_max) ncap = mem_max; /* >= len + n, since off is 0 here */
        nb = realloc(o->buf, ncap);
        if (!nb) {
            errno = ENOMEM;
            return -1;
        }
        o->buf = nb;
        o->cap = ncap;
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
    return (ptrdiff_t)n;
}

const char *bb_out_spill_dir(void)
{
    const char *dir = getenv("TMPDIR");
    return dir && *dir ? dir : "/tmp";
}

int bb_out_spill_open(const char *dir)
{
    char path[PATH_MAX];
    int fd;
#ifdef O_TMPFILE
    fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
#endif
    if (snprintf(path, sizeof(path), "%s/blackbuck-spill-XXXXXX", dir) >= (int)sizeof(path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = mkstemp(path);
    if (fd < 0) return -1;
    unlink(path);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

/* The spill file failed (op, errno err): no more spilling until bb_out_next. -1 with errno err. */
static int spill_fail(struct bb_out *o, struct bb_spill_pool *pool, const char *what, int err, const char **op)
{
    o->spill_failed = 1;
    if (o->spill_fd >= 0 && o->spill_off == o->spill_len) spill_close(o, pool); /* nothing in it */
    *op = what;
    errno = err;
    return -1;
}

/* Appends what it can of iov[*i, cnt) to the held memory, while the process's held bytes stay
 * within held_max. 0, or -1 (ENOMEM). */
static int held_append(struct bb_out *o, struct bb_spill_pool *pool, int64_t held_max, struct iovec *iov, int *i,
                       int cnt)
{
    while (*i < cnt && pool->held < held_max) {
        size_t n = iov[*i].iov_len, room = (size_t)(held_max - pool->held);
        if (n > room) n = room;
        if (o->held_len + n > o->held_cap) {
            size_t ncap = o->held_cap ? o->held_cap : BB_OUT_INITIAL;
            char *nb;
            while (ncap < o->held_len + n) ncap *= 2;
            nb = realloc(o->held, ncap);
            if (!nb) {
                errno = ENOMEM;
                return -1;
            }
            o->held = nb;
            o->held_cap = ncap;
        }
        memcpy(o->held + o->held_len, iov[*i].iov_base, n);
        o->held_len += n;
        pool->held += (int64_t)n;
        bb_iov_skip(iov, i, cnt, n);
    }
    return 0;
}

int bb_out_queue(struct bb_out *o, struct bb_spill_pool *pool, const struct bb_out_limits *lim, struct iovec *iov,
                 int *i, int cnt, const char **op)
{
    int r = 0, err = 0;
    while (*i < cnt && o->spill_fd < 0 && o->held_len == 0) {
        size_t n = iov[*i].iov_len;
        ptrdiff_t took = mem_append(o, lim->mem_max, iov[*i].iov_base, n);
        if (took < 0) {
            *op = NULL;
            return -1;
        }
        bb_iov_skip(iov, i, cnt, (size_t)took);
        if ((size_t)took < n) break;
    }
    while (*i < cnt && !o->spill_failed && o->held_len == 0 && o->spill_len < lim->spill_max &&
           pool->total < lim->pool_max) {
        /* at most IOV_MAX entries and the room left under both caps (the last entry cut to fit) */
        int64_t left = lim->spill_max - o->spill_len, pool_left = lim->pool_max - pool->total;
        size_t room = (size_t)(left < pool_left ? left : pool_left), sum = 0, cut_len = 0;
        int k, batch = cnt - *i > IOV_MAX ? IOV_MAX : cnt - *i, cut = -1;
        ssize_t w;
        if (o->spill_fd < 0 && (o->spill_fd = bb_out_spill_open(bb_out_spill_dir())) < 0) {
            r = spill_fail(o, pool, "open", errno, op);
            break;
        }
        for (k = 0; k < batch; k++) {
            if (iov[*i + k].iov_len > room - sum) {
                cut = *i + k;
                cut_len = iov[cut].iov_len;
                iov[cut].iov_len = room - sum;
                k++;
                break;
            }
            sum += iov[*i + k].iov_len;
        }
        w = writev(o->spill_fd, iov + *i, k);
        if (cut >= 0) iov[cut].iov_len = cut_len;
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            r = spill_fail(o, pool, "write", w < 0 ? errno : EIO, op);
            break;
        }
        o->spill_len += w;
        pool->total += w;
        bb_iov_skip(iov, i, cnt, (size_t)w);
    }
    err = errno;
    if (*i < cnt && held_append(o, pool, lim->held_max, iov, i, cnt) < 0 && r == 0) {
        *op = NULL;
        return -1; /* ENOMEM */
    }
    errno = err;
    return r;
}

/* Sends up to n bytes of file fd from offset off to socket sock: sendfile(2), or where it is not
 * available or this file cannot do it (*copy is then set for the next calls) pread + write of at
 * most BB_SPILL_COPY_CHUNK bytes. Returns the bytes sent, 0 when the file ends before off, or -1
 * with errno. */
static ssize_t file_send(int sock, int fd, int64_t off, size_t n, int *copy)
{
    char buf[BB_SPILL_COPY_CHUNK];
    ssize_t r;
#ifdef HAVE_SYS_SENDFILE_H
    if (!*copy) {
        off_t o = (off_t)off;
        ssize_t w = sendfile(sock, fd, &o, n);
        if (w >= 0 || (errno != EINVAL && errno != ENOSYS)) return w;
        *copy = 1;
    }
#else
    *copy = 1;
#endif
    if (n > sizeof(buf)) n = sizeof(buf);
    do r = pread(fd, buf, n, (off_t)off);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return r;
    return write(sock, buf, (size_t)r);
}

int bb_out_flush(struct bb_out *o, int sock, struct bb_spill_pool *pool)
{
    size_t budget = BB_SPILL_FLUSH_MAX;
    while (o->off < o->len) {
        ssize_t w = write(sock, o->buf + o->off, o->len - o->off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return BB_OUT_PENDING;
            return BB_OUT_FAILED;
        }
        o->off += (size_t)w;
    }
    o->off = o->len = 0;
    while (o->spill_off < o->spill_len) {
        size_t n = (size_t)(o->spill_len - o->spill_off);
        ssize_t w;
        if (budget == 0) return BB_OUT_PENDING;
        w = file_send(sock, o->spill_fd, o->spill_off, n < budget ? n : budget, &pool->copy);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return BB_OUT_PENDING;
            return BB_OUT_FAILED;
        }
        if (w == 0) return BB_OUT_FAILED; /* the file is shorter than what was written to it */
        o->spill_off += w;
        budget -= (size_t)w;
    }
    spill_close(o, pool);
    while (o->held_off < o->held_len) {
        ssize_t w = write(sock, o->held + o->held_off, o->held_len - o->held_off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return BB_OUT_PENDING;
            return BB_OUT_FAILED;
        }
        o->held_off += (size_t)w;
    }
    if (o->held) held_free(o, pool);
    budget = BB_FILE_FLUSH_MAX;
    while (o->file_off < o->file_end) {
        size_t n = (size_t)(o->file_end - o->file_off);
        ssize_t w;
        if (budget == 0) return BB_OUT_PENDING;
        w = file_send(sock, o->file_fd, o->file_off, n < budget ? n : budget, &o->file_copy);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return BB_OUT_PENDING;
            return BB_OUT_FAILED;
        }
        if (w == 0) return BB_OUT_SHORT; /* truncated under us: the promised length cannot be met */
        o->file_off += w;
        budget -= (size_t)w;
    }
    bb_out_file_close(o);
    return BB_OUT_DONE;
}
