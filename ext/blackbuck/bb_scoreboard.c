/*
 * bb_scoreboard.c - Blackbuck::Native::Scoreboard: one fixed-size slot per worker in
 * anonymous shared memory, mapped by the master before forking. A worker writes only its
 * own slot; the master reads all of them (timeouts, status). Plain stores: a reader may
 * see a slot mid-update, which costs at most one stale sample. The request count is the
 * exception: it feeds a counter that must never go backwards (RequestCounts adds a reaped
 * worker's final count; /metrics), so it is stored and loaded whole (atomically, also where a
 * 64-bit access takes two instructions). The slot outlives its worker: the master reads the
 * final count after reaping it, before the next worker's reset. The queue-time and duration
 * histograms follow the same rules (each bucket only grows, stored whole): they are Prometheus
 * histograms that the master sums over workers, live and exited.
 */
#include "bb_scoreboard.h"
#include "bb_conn.h"
#include "bb_pass.h"

#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>

/* A slot's state, named here only: Ruby reads them as Native::Scoreboard::IDLE, BUSY, STOPPING. */
enum sb_state { SB_IDLE = 0, SB_BUSY = 2, SB_STOPPING = 4 };

#define SB_METHOD_MAX 16
#define SB_PATH_MAX 240
/* Histogram buckets: upper bounds in microseconds (Prometheus' le="2.5e-05" ... le="10", then +Inf).
 * They start at 25 us: a hello-world request takes tens of microseconds, and a first bucket of 1 ms
 * made every percentile of such requests read as most of a millisecond. */
static const int64_t sb_bounds_us[] = {25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
                                       250000, 500000, 1000000, 2500000, 5000000, 10000000};
#define SB_BOUNDS ((int)(sizeof(sb_bounds_us) / sizeof(sb_bounds_us[0])))
#define SB_BUCKETS (SB_BOUNDS + 1) /* the last one is +Inf */

/* One histogram: counts per bucket (not cumulative), the sum of the samples and the largest one (a
 * quantile read from the buckets is never reported above it: RequestCounts::Hist#quantile). */
struct sb_hist {
    uint64_t buckets[SB_BUCKETS];
    uint64_t sum_us;
    uint64_t max_us;
};

struct sb_slot {
    int32_t pid;
    int32_t state;        /* enum sb_state (Native::Scoreboard::IDLE/BUSY/STOPPING) */
    uint64_t requests;    /* requests served by this worker; atomic loads and stores only */
    int64_t started_ms;   /* CLOCK_MONOTONIC ms when the current request started; 0 when idle */
    int64_t heartbeat_ms; /* CLOCK_MONOTONIC ms of the worker's last loop turn */
    int32_t connections;  /* open client connections */
    int32_t streams;      /* of them, responses whose stream body waits on a fiber (Streams) */
    int64_t spill_bytes;  /* bytes in the worker's response spill files (max_worker_spill) */
    int64_t started_us;   /* CLOCK_MONOTONIC us when the current request started (its duration) */
    uint64_t shed;        /* requests answered 503 by max_queue_time instead of the app */
    uint64_t moved_out;   /* connections the hand-off watcher moved to another worker (Native::Handoff) */
    uint64_t moved_in;    /* connections taken off the hand-off socket */
    /* Moves that did not happen, by why (enum bb_handoff_failure); counted by the worker's threads
     * with atomic adds (bb_scoreboard_handoff_failed), read with atomic loads */
    uint64_t handoff_failures[BB_HANDOFF_FAILURE_KINDS];
    int32_t free_threads; /* app threads with no request (--threads): siblings move waiting requests here */
    int32_t exit_reason;  /* why the worker stops, as it says (WorkerExits::SAID index; 0: nothing said);
                           * the master reads it once it has reaped the worker */
    struct sb_hist queue;    /* seconds from ready to the app's start (Conn#queue_time) */
    struct sb_hist duration; /* seconds in the app and writing its answer */
    char method[SB_METHOD_MAX];
    char path[SB_PATH_MAX];
};

struct scoreboard {
    struct sb_slot *slots;
    long n;
};

/* A worker's own slot, from its reset on: its handoff_failures are where C code that holds no Ruby
 * object (the hand-off watcher thread, the pass glue) counts hand-off failures (bb_pass_failed).
 * NULL in the master. */
static struct sb_slot *own_slot;

static void sb_free(void *p)
{
    struct scoreboard *sb = p;
    struct sb_slot *own = __atomic_load_n(&own_slot, __ATOMIC_ACQUIRE);
    if (own >= sb->slots && own < sb->slots + sb->n) {
        __atomic_store_n(&own_slot, NULL, __ATOMIC_RELEASE);
        bb_pass_count_into(NULL);
    }
    if (sb->slots) munmap(sb->slots, sizeof(struct sb_slot) * (size_t)sb->n);
    xfree(sb);
}

/* The slots are one shared mapping (every process of the server sees it): counted here, once per
 * process that holds the object, as ObjectSpace.memsize_of does for any mapped buffer. */
static size_t sb_memsize(const void *p)
{
    const struct scoreboard *sb = p;
    return sizeof(*sb) + sizeof(struct sb_slot) * (size_t)sb->n;
}

static const rb_data_type_t sb_type = {
    .wrap_struct_name = "Blackbuck::Native::Scoreboard",
    .function = {.dmark = NULL, .dfree = sb_free, .dsize = sb_memsize},
    .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE sb_alloc(VALUE klass)
{
    struct scoreboard *sb;
    return TypedData_Make_Struct(klass, struct scoreboard, &sb_type, sb);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Only the slot's worker writes: load + store is an increment no reader sees torn. */
static void bump(uint64_t *p, uint64_t by)
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + by, __ATOMIC_RELAXED);
}

static void observe(struct sb_hist *h, int64_t us)
{
    int i = 0;
    if (us < 0) us = 0;
    while (i < SB_BOUNDS && us > sb_bounds_us[i]) i++;
    bump(&h->buckets[i], 1);
    bump(&h->sum_us, (uint64_t)us);
    if ((uint64_t)us > __atomic_load_n(&h->max_us, __ATOMIC_RELAXED))
        __atomic_store_n(&h->max_us, (uint64_t)us, __ATOMIC_RELAXED);
}

static VALUE hist_value(const struct sb_hist *h)
{
    VALUE counts = rb_ary_new_capa(SB_BUCKETS);
    int i;
    for (i = 0; i < SB_BUCKETS; i++) rb_ary_push(counts, ULL2NUM(__atomic_load_n(&h->buckets[i], __ATOMIC_RELAXED)));
    return rb_ary_new_from_args(3, counts, ULL2NUM(__atomic_load_n(&h->sum_us, __ATOMIC_RELAXED)),
                                ULL2NUM(__atomic_load_n(&h->max_us, __ATOMIC_RELAXED)));
}

static struct sb_slot *slot(VALUE self, VALUE idx)
{
    struct scoreboard *sb;
    long i = NUM2LONG(idx);
    TypedData_Get_Struct(self, struct scoreboard, &sb_type, sb);
    if (i < 0 || i >= sb->n) rb_raise(rb_eIndexError, "scoreboard slot %ld out of 0...%ld", i, sb->n);
    return &sb->slots[i];
}

static VALUE sb_init(VALUE self, VALUE n)
{
    struct scoreboard *sb;
    void *m;
    TypedData_Get_Struct(self, struct scoreboard, &sb_type, sb);
    sb->n = NUM2LONG(n);
    if (sb->n < 1 || sb->n > 4096) rb_raise(rb_eArgError, "scoreboard size must be 1..4096");
    m = mmap(NULL, sizeof(struct sb_slot) * (size_t)sb->n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) rb_sys_fail("mmap");
    sb->slots = m;
    return self;
}

static VALUE sb_size(VALUE self)
{
    struct scoreboard *sb;
    TypedData_Get_Struct(self, struct scoreboard, &sb_type, sb);
    return LONG2NUM(sb->n);
}

/* reset(i, pid): a fresh worker takes slot i. */
static VALUE sb_reset(VALUE self, VALUE idx, VALUE pid)
{
    struct sb_slot *s = slot(self, idx);
    int32_t p = NUM2INT(pid);
    memset(s, 0, sizeof(*s));
    s->heartbeat_ms = now_ms();
    /* release: a reader that sees the new pid sees the zeroed count, not the predecessor's */
    __atomic_store_n(&s->pid, p, __ATOMIC_RELEASE);
    if (p == (int32_t)getpid()) {
        __atomic_store_n(&own_slot, s, __ATOMIC_RELEASE);
        bb_pass_count_into(s->handoff_failures);
    }
    return Qnil;
}

/* The slot shows `method path` running since started_us (state BUSY); both cut to fit. */
static void show_running(struct sb_slot *s, VALUE method, VALUE path, int64_t started_us)
{
    size_t ml, pl;
    StringValue(method);
    StringValue(path);
    ml = (size_t)RSTRING_LEN(method);
    pl = (size_t)RSTRING_LEN(path);
    if (ml >= SB_METHOD_MAX) ml = SB_METHOD_MAX - 1;
    if (pl >= SB_PATH_MAX) pl = SB_PATH_MAX - 1;
    memcpy(s->method, RSTRING_PTR(method), ml);
    s->method[ml] = 0;
    memcpy(s->path, RSTRING_PTR(path), pl);
    s->path[pl] = 0;
    s->started_us = started_us;
    s->started_ms = started_us / 1000;
    s->state = SB_BUSY;
}

/* request_start(i, conn, queue_seconds): state := BUSY, start clock, remember what runs (the
 * method and path of the request conn parsed last), count how long the request waited (the queue
 * histogram). */
VALUE bb_scoreboard_request_start(VALUE self, VALUE idx, VALUE conn, VALUE queue)
{
    struct sb_slot *s = slot(self, idx);
    VALUE method, path;
    bb_conn_request_line(conn, &method, &path);
    if (NIL_P(method)) method = path = rb_str_new(0, 0); /* (it parsed no request: never, in a worker) */
    show_running(s, method, path, now_us());
    observe(&s->queue, (int64_t)(NUM2DBL(queue) * 1e6));
    return Qnil;
}

/* request_done(i, state): one more request served; back to `state`. */
VALUE bb_scoreboard_request_done(VALUE self, VALUE idx, VALUE state)
{
    struct sb_slot *s = slot(self, idx);
    bump(&s->requests, 1);
    if (s->started_us) observe(&s->duration, now_us() - s->started_us);
    s->started_ms = 0;
    s->started_us = 0;
    s->state = NUM2INT(state);
    return Qnil;
}

/* With app threads (Worker's --threads) requests overlap, so the slot's "current request" is the
 * oldest one running, set by the worker's loop thread as requests start and end:
 * running(i, state, age_seconds, method, path) shows that request (started age_seconds ago);
 * age_seconds nil: none runs, the slot shows `state`. */
static VALUE sb_running(VALUE self, VALUE idx, VALUE state, VALUE age, VALUE method, VALUE path)
{
    struct sb_slot *s = slot(self, idx);
    if (NIL_P(age)) {
        s->started_ms = 0;
        s->started_us = 0;
        s->state = NUM2INT(state);
        return Qnil;
    }
    show_running(s, method, path, now_us() - (int64_t)(NUM2DBL(age) * 1e6));
    return Qnil;
}

/* request_observed(i, queue_seconds, duration_seconds): one more request served, with its queue time
 * and its time in the app (app threads: the slot's started time is not this request's). */
static VALUE sb_request_observed(VALUE self, VALUE idx, VALUE queue, VALUE duration)
{
    struct sb_slot *s = slot(self, idx);
    observe(&s->queue, (int64_t)(NUM2DBL(queue) * 1e6));
    observe(&s->duration, (int64_t)(NUM2DBL(duration) * 1e6));
    bump(&s->requests, 1);
    return Qnil;
}

/* request_shed(i): one request answered 503 by max_queue_time (it waited longer) instead of the app. */
static VALUE sb_request_shed(VALUE self, VALUE idx)
{
    bump(&slot(self, idx)->shed, 1);
    return Qnil;
}

/* histograms(i) -> [[queue bucket counts, queue sum us, queue max us], [duration counts, sum us, max us], shed,
 * moved_out, moved_in, [hand-off failures by HANDOFF_FAILURES]] (counts per bucket, not cumulative;
 * bounds: BUCKET_BOUNDS_US then +Inf). */
static VALUE sb_histograms(VALUE self, VALUE idx)
{
    struct sb_slot *s = slot(self, idx);
    VALUE failures = rb_ary_new_capa(BB_HANDOFF_FAILURE_KINDS);
    int i;
    for (i = 0; i < BB_HANDOFF_FAILURE_KINDS; i++)
        rb_ary_push(failures, ULL2NUM(__atomic_load_n(&s->handoff_failures[i], __ATOMIC_RELAXED)));
    return rb_ary_new_from_args(6, hist_value(&s->queue), hist_value(&s->duration),
                                ULL2NUM(__atomic_load_n(&s->shed, __ATOMIC_RELAXED)),
                                ULL2NUM(__atomic_load_n(&s->moved_out, __ATOMIC_RELAXED)),
                                ULL2NUM(__atomic_load_n(&s->moved_in, __ATOMIC_RELAXED)), failures);
}

/* moves(i, out, in): the worker's own totals of connections moved out and taken in (they only grow). */
static VALUE sb_moves(VALUE self, VALUE idx, VALUE out, VALUE in)
{
    struct sb_slot *s = slot(self, idx);
    __atomic_store_n(&s->moved_out, NUM2ULL(out), __ATOMIC_RELAXED);
    __atomic_store_n(&s->moved_in, NUM2ULL(in), __ATOMIC_RELAXED);
    return Qnil;
}

/* set_exit_reason(i, n): worker i says why it stops (a Ruby-side index, WorkerExits::SAID; 0: nothing said). */
static VALUE sb_set_exit_reason(VALUE self, VALUE idx, VALUE n)
{
    __atomic_store_n(&slot(self, idx)->exit_reason, NUM2INT(n), __ATOMIC_RELAXED);
    return Qnil;
}

/* exit_reason(i) -> what worker i said with set_exit_reason (0: nothing). */
static VALUE sb_exit_reason(VALUE self, VALUE idx)
{
    return INT2NUM(__atomic_load_n(&slot(self, idx)->exit_reason, __ATOMIC_RELAXED));
}

/* free_threads(i, n): worker i has n app threads with nothing to run (--threads). */
static VALUE sb_free_threads(VALUE self, VALUE idx, VALUE n)
{
    __atomic_store_n(&slot(self, idx)->free_threads, NUM2INT(n), __ATOMIC_RELAXED);
    return Qnil;
}

/* free_elsewhere?(i) -> whether a worker other than i, not stopping, has an app thread with nothing
 * to run: a request waiting in worker i's queue would start sooner there. */
static VALUE sb_free_elsewhere(VALUE self, VALUE idx)
{
    struct scoreboard *sb;
    long i, me = NUM2LONG(idx);
    TypedData_Get_Struct(self, struct scoreboard, &sb_type, sb);
    for (i = 0; i < sb->n; i++) {
        const struct sb_slot *s = &sb->slots[i];
        if (i != me && __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != 0 && s->state != SB_STOPPING &&
            __atomic_load_n(&s->free_threads, __ATOMIC_RELAXED) > 0)
            return Qtrue;
    }
    return Qfalse;
}

/* streams(i, n): worker i has n open streams (responses whose body waits on a fiber), written when
 * the count changes. */
static VALUE sb_streams(VALUE self, VALUE idx, VALUE n)
{
    __atomic_store_n(&slot(self, idx)->streams, NUM2INT(n), __ATOMIC_RELAXED);
    return Qnil;
}

/* tick(i, state, connections): the worker's loop is alive; also publishes its spill bytes. */
static VALUE sb_tick(VALUE self, VALUE idx, VALUE state, VALUE conns)
{
    struct sb_slot *s = slot(self, idx);
    s->heartbeat_ms = now_ms();
    s->state = NUM2INT(state);
    s->connections = NUM2INT(conns);
    s->spill_bytes = bb_spill_total();
    return Qnil;
}

/* read_values(i) -> [pid, state, requests, running_ms (0 when idle), heartbeat_age_ms, connections, method,
 *                   path, spill_bytes, streams]: private; #read (scoreboard.rb) names them (Scoreboard::Slot, this order). */
static VALUE sb_read_values(VALUE self, VALUE idx)
{
    struct sb_slot *s = slot(self, idx);
    struct sb_slot c;
    int64_t now = now_ms();
    VALUE a;
    int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    memcpy(&c, s, sizeof(c));
    c.pid = pid;
    c.requests = __atomic_load_n(&s->requests, __ATOMIC_RELAXED);
    c.method[SB_METHOD_MAX - 1] = 0;
    c.path[SB_PATH_MAX - 1] = 0;
    a = rb_ary_new_capa(10);
    rb_ary_push(a, INT2NUM(c.pid));
    rb_ary_push(a, INT2NUM(c.state));
    rb_ary_push(a, ULL2NUM(c.requests));
    rb_ary_push(a, LL2NUM(c.started_ms ? now - c.started_ms : 0));
    rb_ary_push(a, LL2NUM(now - c.heartbeat_ms));
    rb_ary_push(a, INT2NUM(c.connections));
    rb_ary_push(a, rb_str_new_cstr(c.method));
    rb_ary_push(a, rb_str_new_cstr(c.path));
    rb_ary_push(a, LL2NUM(c.spill_bytes));
    rb_ary_push(a, INT2NUM(__atomic_load_n(&s->streams, __ATOMIC_RELAXED)));
    return a;
}

void bb_init_scoreboard(void)
{
    VALUE c = rb_define_class_under(bb_mNative, "Scoreboard", rb_cObject);
    rb_define_alloc_func(c, sb_alloc);
    rb_define_method(c, "initialize", sb_init, 1);
    rb_define_method(c, "size", sb_size, 0);
    rb_define_method(c, "reset", sb_reset, 2);
    rb_define_method(c, "request_start", bb_scoreboard_request_start, 3);
    rb_define_method(c, "request_shed", sb_request_shed, 1);
    rb_define_method(c, "histograms", sb_histograms, 1);
    rb_define_method(c, "request_done", bb_scoreboard_request_done, 2);
    rb_define_method(c, "running", sb_running, 5);
    rb_define_const(c, "IDLE", INT2FIX(SB_IDLE));
    rb_define_const(c, "BUSY", INT2FIX(SB_BUSY));
    rb_define_const(c, "STOPPING", INT2FIX(SB_STOPPING));
    rb_define_method(c, "request_observed", sb_request_observed, 3);
    rb_define_method(c, "tick", sb_tick, 3);
    rb_define_method(c, "moves", sb_moves, 3);
    rb_define_method(c, "free_threads", sb_free_threads, 2);
    rb_define_method(c, "streams", sb_streams, 2);
    rb_define_method(c, "free_elsewhere?", sb_free_elsewhere, 1);
    rb_define_private_method(c, "read_values", sb_read_values, 1);
    rb_define_method(c, "set_exit_reason", sb_set_exit_reason, 2);
    rb_define_method(c, "exit_reason", sb_exit_reason, 1);
    {
        VALUE bounds = rb_ary_new_capa(SB_BOUNDS);
        int i;
        for (i = 0; i < SB_BOUNDS; i++) rb_ary_push(bounds, LL2NUM(sb_bounds_us[i]));
        rb_define_const(c, "BUCKET_BOUNDS_US", rb_ary_freeze(bounds));
    }
    {
        /* The reasons a move did not happen, in the order histograms(i) counts them (enum bb_handoff_failure). */
        VALUE kinds = rb_ary_new_capa(BB_HANDOFF_FAILURE_KINDS);
        rb_ary_push(kinds, ID2SYM(rb_intern("refused")));
        rb_ary_push(kinds, ID2SYM(rb_intern("send")));
        rb_ary_push(kinds, ID2SYM(rb_intern("lost")));
        rb_define_const(c, "HANDOFF_FAILURES", rb_ary_freeze(kinds));
    }
}
