/*
 * bb_out.h - a connection's output queue: the response bytes its client has not taken yet, in
 * order: in memory (up to a limit), then in an anonymous spill file (up to a limit per connection
 * and one for all of the process's spill files together), then held in memory (what no spill file
 * could take; a limit for the process), then a response's file body, which is always the last
 * thing queued. Pure C (no Ruby), tested alone under ASan (test/c/test_out.c).
 *
 * The caller owns the queue (struct bb_out, one per connection), the process's spill account
 * (struct bb_spill_pool, one per process) and the limits, and decides what to do when bytes fit
 * nowhere (the glue ends that response). Nothing here blocks: the socket is non-blocking.
 *
 * Return contract of bb_out_flush: BB_OUT_DONE (nothing left), BB_OUT_PENDING (the socket would
 * block, or a turn's byte budget is spent: call again when it is writable), BB_OUT_FAILED (errno:
 * the connection is broken), BB_OUT_SHORT (the file body ended before the bytes promised for it).
 */
#ifndef BB_OUT_H
#define BB_OUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

/* The memory queue starts at this many bytes and doubles up to bb_out_limits.mem_max. */
#define BB_OUT_INITIAL (16 * 1024)
/* Bytes of memory queue a connection keeps once its output is all sent (bb_out_trim); a larger
 * buffer is freed, so an idle connection holds no big one. */
#define BB_OUT_KEEP_MAX (256 * 1024)
/* Bytes one flush sends from a spill file at most, so a fast reader of a large spilled response
 * does not keep the worker from its other connections (the event loop comes back to it). */
#define BB_SPILL_FLUSH_MAX (4 * 1024 * 1024)
/* Bytes copied per pread/write where sendfile(2) is not available. */
#define BB_SPILL_COPY_CHUNK (64 * 1024)
/* Bytes one flush sends from a response's file body at most (a download served with sendfile), for
 * the same reason as BB_SPILL_FLUSH_MAX: a fast reader of a large file gets its next turn later. */
#define BB_FILE_FLUSH_MAX (4 * 1024 * 1024)
/* Bytes of response that neither the memory queue nor a spill file could take (the spill directory is
 * full or unwritable, max_response_spill or max_worker_spill reached), held in memory behind them for
 * all of a process's connections together (bb_out_limits.held_max in Blackbuck): a slow reader's
 * answer then waits in the event loop like any other output, and the worker never waits for it. */
#define BB_OUT_HELD_MAX (64 * 1024 * 1024)

/* Results of bb_out_flush (the first three are also Native::Conn's WRITE_DONE, WRITE_PENDING, WRITE_FAILED). */
#define BB_OUT_DONE 0
#define BB_OUT_PENDING 1
#define BB_OUT_FAILED (-1)
#define BB_OUT_SHORT (-2)

struct bb_out_limits {
    size_t mem_max;    /* bytes queued in memory per connection (response_buffer); past it, spill */
    int64_t spill_max; /* bytes of spill file per connection (max_response_spill); 0 = never spill */
    int64_t pool_max;  /* bytes of all the process's spill files together (max_worker_spill) */
    int64_t held_max;  /* bytes of all the process's queues held in memory behind a spill that could take
                        * no more (BB_OUT_HELD_MAX); 0 = none */
};

/* What every connection of a process shares: disk use stays bounded however many connections stop
 * reading at once. */
struct bb_spill_pool {
    int64_t total; /* bytes in all spill files now */
    int copy;      /* the spill directory's filesystem cannot sendfile(2): spill files are copied */
    int64_t held;  /* bytes in all queues' held memory now (bb_out_limits.held_max) */
};

struct bb_out {
    /* in memory: buf[off, len) */
    char *buf;
    size_t cap, off, len;
    /* then [spill_off, spill_len) of the spill file (spill_fd; -1 when not spilling) */
    int spill_fd;
    int spill_failed; /* the spill file could not be made or written: no more spilling until bb_out_next */
    int64_t spill_off, spill_len;
    /* then held[held_off, held_len): what the spill file could not take, in memory (held_max); once
     * anything is here, everything queued after it comes here too, so the order stays */
    char *held;
    size_t held_cap, held_off, held_len;
    /* then a response's file body: [file_off, file_end) of file_fd; -1 when none. Nothing is ever
     * queued behind it: the next response starts once it is sent. */
    int file_fd;
    int file_copy; /* this file cannot be sendfile(2)d: pread + write instead */
    int64_t file_off, file_end;
};

/* An empty queue (all of *o written; nothing to release). */
static inline void bb_out_init(struct bb_out *o)
{
    memset(o, 0, sizeof(*o));
    o->spill_fd = -1;
    o->file_fd = -1;
}

/* 1 when anything is queued (memory, spill file or file body). */
static inline int bb_out_queued(const struct bb_out *o)
{
    return o->off < o->len || o->spill_fd >= 0 || o->held_len > 0 || o->file_fd >= 0;
}

/* Bytes queued (memory, spill file, held memory, the rest of a file body): what a stream's
 * back-pressure weighs against its high-water mark. */
static inline int64_t bb_out_queued_bytes(const struct bb_out *o)
{
    int64_t n = (int64_t)(o->len - o->off) + (int64_t)(o->held_len - o->held_off);
    if (o->spill_fd >= 0) n += o->spill_len - o->spill_off;
    if (o->file_fd >= 0) n += o->file_end - o->file_off;
    return n;
}

/* Consumes w bytes from iov[*i, cnt), then skips empty entries. */
static inline void bb_iov_skip(struct iovec *iov, int *i, int cnt, size_t w)
{
    while (*i < cnt && w >= iov[*i].iov_len) {
        w -= iov[*i].iov_len;
        (*i)++;
    }
    if (*i < cnt && w > 0) {
        iov[*i].iov_base = (char *)iov[*i].iov_base + w;
        iov[*i].iov_len -= w;
    }
    while (*i < cnt && iov[*i].iov_len == 0) (*i)++;
}

/* Queues iov[*i, cnt) behind what is queued: in memory while no spill file is open and mem_max
 * allows, then appended to the spill file while spill_max and pool_max allow, then held in memory
 * behind the spill file while held_max allows (the process's total). Advances *i (and the iov) past
 * what it took; what is left fits nowhere (the caller ends the response: it never waits).
 * 0, or -1 with errno: *op NULL when memory could not grow (ENOMEM), else "open" or "write" when
 * the spill file could not be made or written (spill_failed is then set until bb_out_next; a spill
 * file with nothing left in it is closed; what it did not take was held as far as held_max allows). */
int bb_out_queue(struct bb_out *o, struct bb_spill_pool *pool, const struct bb_out_limits *lim, struct iovec *iov,
                 int *i, int cnt, const char **op);

/* Sends what is queued to socket sock without waiting: memory first, then the spill file (closed
 * once sent), then the file body (closed once sent). See the contract above; on BB_OUT_SHORT the file
 * body is still open at file_off (close it with bb_out_file_close). */
int bb_out_flush(struct bb_out *o, int sock, struct bb_spill_pool *pool);

/* Queues file fd, bytes [0, size), behind everything else; the queue owns (and closes) fd now.
 * Only on a queue with no file body. */
static inline void bb_out_file(struct bb_out *o, int fd, int64_t size)
{
    o->file_fd = fd;
    o->file_copy = 0;
    o->file_off = 0;
    o->file_end = size;
}

/* Closes the file body (queued or not) and forgets it. */
void bb_out_file_close(struct bb_out *o);

/* Forgets all queued output and frees the memory queue (the connection is closing or handed over). */
void bb_out_release(struct bb_out *o, struct bb_spill_pool *pool);
static inline void bb_out_discard(struct bb_out *o, struct bb_spill_pool *pool)
{
    if (o->buf || o->spill_fd >= 0 || o->file_fd >= 0) bb_out_release(o, pool); /* else nothing to do */
}

/* Frees a memory queue of more than BB_OUT_KEEP_MAX bytes once nothing is queued in it. */
void bb_out_trim(struct bb_out *o);

/* The next response may spill again (a spill failure lasts until then). */
static inline void bb_out_next(struct bb_out *o) { o->spill_failed = 0; }

/* Where spill files go: $TMPDIR, or /tmp when it is unset or empty. */
const char *bb_out_spill_dir(void);

/* An anonymous file in dir, nothing left on disk: O_TMPFILE where the kernel and the filesystem have
 * it, else mkstemp + unlink. The fd (close-on-exec), or -1 with errno. */
int bb_out_spill_open(const char *dir);

#endif
