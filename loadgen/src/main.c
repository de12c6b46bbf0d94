/* main.c - blackbuck-load: command line, request serialisation, threads,
 * merge, report. A wrk-compatible HTTP/1.1 load generator that also speaks
 * to UNIX sockets.
 *
 * Every command-line mistake ends in one line on stderr and exit status 1, and so does a run in which
 * every request failed (run_failed). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "config.h"
#include "poller.h"
#include "report.h"
#include "units.h"
#include "worker.h"

#define VERSION "0.1.0"
#define MAX_URL_PART 1024
#define MAX_THREADS 1024
#define SPARE_FDS 32 /* descriptors kept free beyond one per connection */

#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 1, 2)))
#endif
static void die(const char *fmt, ...)
{
    va_list ap;
    fputs("blackbuck-load: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void usage(void)
{
    printf("Usage: blackbuck-load <options> <url>\n"
           "  Options:\n"
           "    -c, --connections <N>  Connections to keep open\n"
           "    -d, --duration    <T>  Duration of test\n"
           "    -t, --threads     <N>  Number of threads to use\n"
           "\n"
           "    -H, --header      <H>  Add header to request (repeatable)\n"
           "        --latency          Print latency statistics\n"
           "        --timeout     <T>  Socket/request timeout\n"
           "    -v, --version          Print version details\n"
           "\n"
           "    -P, --unix-socket <P>  Connect to a UNIX socket (@name: abstract)\n"
           "        --no-keepalive     New connection per request\n"
           "    -m, --method      <M>  Request method (default GET)\n"
           "        --body        <S>  Request body\n"
           "        --body-file   <F>  Request body from a file\n"
           "        --json        <F>  Write machine-readable results to F\n"
           "    -R, --rate        <N>  Requests/s over all threads (open model)\n"
           "        --pipeline    <N>  Requests in flight per connection\n"
           "\n"
           "        --target  <R> <W>  Request R ('METHOD /path') with weight W (repeatable)\n"
           "        --targets     <F>  Targets from F, lines of METHOD /path WEIGHT\n"
           "        --target-per-connection\n"
           "                           Each connection keeps one target, split by weight\n"
           "        --seed        <N>  Seed for picking targets (default %d)\n"
           "\n"
           "  Numeric arguments may include a SI unit (1k, 1M, 1G)\n"
           "  Time arguments may include a time unit (500ms, 2s, 2m, 2h)\n"
           "\n"
           "  Exit status: 0 when the run got at least one 2xx or 3xx response; 1 when none did\n"
           "  (said on stderr after the report), for a mistake in the arguments or URL, and when\n"
           "  the server (TCP or UNIX socket) refuses the connection tried before the run\n",
           DEFAULT_SEED);
}

enum {
    OPT_LATENCY = 256, OPT_BODY, OPT_BODY_FILE, OPT_JSON, OPT_PIPELINE, OPT_NO_KEEPALIVE,
    OPT_TARGET, OPT_TARGETS, OPT_TARGET_PER_CONNECTION, OPT_SEED,
};

static const struct option longopts[] = {
    { "connections", required_argument, NULL, 'c' },
    { "duration", required_argument, NULL, 'd' },
    { "threads", required_argument, NULL, 't' },
    { "header", required_argument, NULL, 'H' },
    { "latency", no_argument, NULL, OPT_LATENCY },
    { "timeout", required_argument, NULL, 'T' },
    { "version", no_argument, NULL, 'v' },
    { "help", no_argument, NULL, 'h' },
    { "unix-socket", required_argument, NULL, 'P' },
    { "no-keepalive", no_argument, NULL, OPT_NO_KEEPALIVE },
    { "method", required_argument, NULL, 'm' },
    { "body", required_argument, NULL, OPT_BODY },
    { "body-file", required_argument, NULL, OPT_BODY_FILE },
    { "json", required_argument, NULL, OPT_JSON },
    { "rate", required_argument, NULL, 'R' },
    { "pipeline", required_argument, NULL, OPT_PIPELINE },
    { "script", required_argument, NULL, 's' },
    { "target", required_argument, NULL, OPT_TARGET }, /* and its weight, the next argument */
    { "targets", required_argument, NULL, OPT_TARGETS },
    { "target-per-connection", no_argument, NULL, OPT_TARGET_PER_CONNECTION },
    { "seed", required_argument, NULL, OPT_SEED },
    { NULL, 0, NULL, 0 },
};

static uint64_t metric_arg(const char *name, const char *s, uint64_t min)
{
    uint64_t v;
    if (units_parse_metric(s, &v)) die("invalid %s: '%s' (expected a number such as 10 or 1k)", name, s);
    if (v < min) die("invalid %s: '%s' (must be at least %" PRIu64 ")", name, s, min);
    return v;
}

static uint64_t time_arg(const char *name, const char *s)
{
    uint64_t v;
    if (units_parse_time_us(s, &v)) die("invalid %s: '%s' (expected a time such as 10s, 500ms, 2m)", name, s);
    if (v == 0) die("invalid %s: '%s' (must be greater than zero)", name, s);
    return v;
}

static uint64_t seed_arg(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *s < '0' || *s > '9' || *end || errno == ERANGE)
        die("invalid seed: '%s' (expected an integer from 0 to %llu)", s, (unsigned long long)UINT64_MAX);
    return (uint64_t)v;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot read body file %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) die("out of memory reading %s", path);
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    if (ferror(f)) die("cannot read body file %s: %s", path, strerror(errno));
    fclose(f);
    *len = n;
    return buf;
}

/* A URL is visible ASCII: a space, a control byte or a byte past ASCII would go into the request
 * line as is (a space splits it; a line break ends it), so it is refused, not sent. The message
 * shows the URL up to the byte and the byte in hex (never the raw byte: the error is one line). */
static void check_url_bytes(const char *url)
{
    for (size_t i = 0; url[i]; i++) {
        unsigned char b = (unsigned char)url[i];
        if (b > 0x20 && b < 0x7f) continue;
        die("invalid URL: %s 0x%02x after '%.*s' (percent-encode it, e.g. %%20 for a space)",
            b == ' ' ? "a space," : b < 0x20 || b == 0x7f ? "a control byte," : "a byte past ASCII,", b, (int)i, url);
    }
}

/* "http://host[:port][/path]" -> host, port (default 80), authority, path. */
static void parse_url(const char *url, char *host, char *port, char *authority, const char **path)
{
    check_url_bytes(url);
    if (strncasecmp(url, "http://", 7) != 0) {
        if (strncasecmp(url, "https://", 8) == 0) die("https is not supported: %s", url);
        die("invalid URL (expected http://host[:port]/path): %s", url);
    }
    const char *a = url + 7, *ae = a + strcspn(a, "/?#");
    if (ae == a || (size_t)(ae - a) >= MAX_URL_PART) die("invalid URL (no host): %s", url);
    memcpy(authority, a, (size_t)(ae - a));
    authority[ae - a] = '\0';
    if (strchr(authority, '@')) die("invalid URL (user info is not supported): %s", url);
    const char *colon;
    if (authority[0] == '[') {
        char *close = strchr(authority, ']');
        if (!close) die("invalid URL (unterminated IPv6 address): %s", url);
        memcpy(host, authority + 1, (size_t)(close - authority - 1));
        host[close - authority - 1] = '\0';
        colon = close[1] == ':' ? close + 1 : NULL;
        if (!colon && close[1]) die("invalid URL: %s", url);
    } else {
        colon = strchr(authority, ':');
        size_t hl = colon ? (size_t)(colon - authority) : strlen(authority);
        memcpy(host, authority, hl);
        host[hl] = '\0';
    }
    if (!host[0]) die("invalid URL (no host): %s", url);
    if (colon) {
        const char *p = colon + 1;
        if (!*p || strspn(p, "0123456789") != strlen(p) || atol(p) < 1 || atol(p) > 65535) die("invalid URL (bad port): %s", url);
        strcpy(port, p);
    } else {
        strcpy(port, "80");
    }
    *path = *ae == '/' ? ae : NULL; /* NULL: "/" followed by any query */
    if (!*path && *ae == '#') *path = "/";
}

static int header_named(const char *h, const char *name)
{
    size_t n = strlen(name);
    return !strncasecmp(h, name, n) && (h[n] == ':' || h[n] == ' ' || h[n] == '\t');
}

static int header_has_token(const char *h, const char *tok)
{
    const char *v = strchr(h, ':');
    size_t n = strlen(tok);
    for (v = v ? v + 1 : h; *v; v++)
        if (!strncasecmp(v, tok, n)) return 1;
    return 0;
}

struct buf {
    char *p;
    size_t len, cap;
};

static void buf_add(struct buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) die("out of memory");
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* -H values: well-formed, and which of our own headers they replace. */
struct user_headers {
    int host, length, connection;
};

static struct user_headers check_headers(struct config *cfg)
{
    struct user_headers u = { 0, 0, 0 };
    for (size_t i = 0; i < cfg->nheaders; i++) {
        const char *h = cfg->headers[i];
        if (!strchr(h, ':') || h[0] == ':') die("invalid header (expected 'Name: value'): %s", h);
        if (strpbrk(h, "\r\n")) die("invalid header (contains a line break): %s", h);
        if (header_named(h, "host")) u.host = 1;
        if (header_named(h, "content-length")) u.length = 1;
        if (header_named(h, "connection")) {
            u.connection = 1;
            if (header_has_token(h, "close")) cfg->keepalive = 0;
        }
    }
    return u;
}

/* Serialise a target's request once; with --pipeline N, N copies back to back. */
static void render_request(const struct config *cfg, struct user_headers u, struct mix_target *t, const char *authority,
                           const char *body, size_t body_len, int has_body)
{
    struct buf r = { 0 };
    buf_str(&r, t->method);
    buf_str(&r, " ");
    buf_str(&r, t->path);
    buf_str(&r, " HTTP/1.1\r\n");
    if (!u.host) {
        buf_str(&r, "Host: ");
        buf_str(&r, authority);
        buf_str(&r, "\r\n");
    }
    for (size_t i = 0; i < cfg->nheaders; i++) {
        buf_str(&r, cfg->headers[i]);
        buf_str(&r, "\r\n");
    }
    if (has_body && !u.length) {
        char cl[48];
        snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", body_len);
        buf_str(&r, cl);
    }
    if (!cfg->keepalive && !u.connection) buf_str(&r, "Connection: close\r\n");
    buf_str(&r, "\r\n");
    if (body_len) buf_add(&r, body, body_len);
    t->request = r.p;
    t->request_len = r.len;

    struct buf batch = { 0 };
    for (uint64_t i = 0; i < cfg->pipeline; i++) buf_add(&batch, r.p, r.len);
    t->batch = batch.p;
    t->batch_len = batch.len;
}

/* Without --target: the URL's path (or "/" and its query), fragment dropped. */
static void add_url_target(struct config *cfg, const char *path, const char *query)
{
    struct buf p = { 0 };
    if (!path) buf_str(&p, "/");
    const char *target = path ? path : query;
    buf_add(&p, target, strcspn(target, "#")); /* the fragment is not sent */
    p.p[p.len] = '\0';
    char err[64];
    if (mix_add_raw(&cfg->mix, cfg->method, p.p, err, sizeof err)) die("%s", err);
    free(p.p);
}

static void parse_args(struct config *cfg, int argc, char **argv)
{
    const char *body = NULL, *body_file = NULL;
    size_t body_len = 0;
    int c, no_keepalive = 0, method_given = 0;
    char err[1024];

    memset(cfg, 0, sizeof *cfg);
    cfg->threads = DEFAULT_THREADS;
    cfg->connections = DEFAULT_CONNECTIONS;
    cfg->duration_us = DEFAULT_DURATION_US;
    cfg->timeout_us = DEFAULT_TIMEOUT_US;
    cfg->pipeline = 1;
    cfg->keepalive = 1;
    cfg->method = "GET";
    cfg->seed = DEFAULT_SEED;
    cfg->headers = calloc((size_t)argc + 1, sizeof *cfg->headers);
    if (!cfg->headers) die("out of memory");

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":t:c:d:H:T:P:m:R:s:Lvh", longopts, NULL)) != -1) {
        switch (c) {
        case 't': cfg->threads = metric_arg("thread count", optarg, 1); break;
        case 'c': cfg->connections = metric_arg("connection count", optarg, 1); break;
        case 'd': cfg->duration_us = time_arg("duration", optarg); break;
        case 'T': cfg->timeout_us = time_arg("timeout", optarg); break;
        case 'H': cfg->headers[cfg->nheaders++] = optarg; break;
        case 'L':
        case OPT_LATENCY: cfg->latency = 1; break;
        case 'P': cfg->socket_path = optarg; break;
        case 'm':
            cfg->method = optarg;
            method_given = 1;
            break;
        case 'R': cfg->rate = metric_arg("rate", optarg, 1); break;
        case OPT_PIPELINE: cfg->pipeline = metric_arg("pipeline depth", optarg, 1); break;
        case OPT_NO_KEEPALIVE: no_keepalive = 1; break;
        case OPT_BODY: body = optarg; body_file = NULL; break;
        case OPT_BODY_FILE: body_file = optarg; body = NULL; break;
        case OPT_JSON: cfg->json_path = optarg; break;
        case OPT_TARGET: /* two values: 'METHOD PATH' in optarg, the weight next */
            if (optind >= argc) die("--target needs two values: 'METHOD PATH' and a weight, e.g. --target 'GET /fast' 95");
            if (mix_add(&cfg->mix, optarg, argv[optind++], err, sizeof err)) die("%s", err);
            break;
        case OPT_TARGETS:
            if (mix_load_file(&cfg->mix, optarg, err, sizeof err)) die("%s", err);
            break;
        case OPT_TARGET_PER_CONNECTION: cfg->per_connection = 1; break;
        case OPT_SEED: cfg->seed = seed_arg(optarg); break;
        case 's': die("Lua scripts (-s/--script) are not supported; see --help for --method, --body, -H");
        case 'v':
            printf("blackbuck-load %s [%s] HTTP/1.1 load generator (wrk-compatible)\n", VERSION, poller_name());
            exit(0);
        case 'h':
            usage();
            exit(0);
        case ':': die("option %s requires a value", argv[optind - 1]);
        default:
            if (optopt) die("unknown option: -%c (see --help)", optopt);
            die("unknown option: %s (see --help)", argv[optind - 1]);
        }
    }
    if (optind == argc) die("missing URL (usage: blackbuck-load [options] http://host[:port]/path)");
    if (optind + 1 < argc) die("unexpected argument after the URL: %s", argv[optind + 1]);
    cfg->url = argv[optind];
    if (cfg->connections < cfg->threads) die("number of connections must be >= threads");
    if (cfg->threads > MAX_THREADS) die("at most %d threads", MAX_THREADS);
    if (cfg->pipeline > MAX_PIPELINE) die("pipeline depth must be at most %d", MAX_PIPELINE);
    if (cfg->rate && cfg->pipeline > 1) die("--rate and --pipeline cannot be combined");
    if (cfg->rate && cfg->rate < cfg->threads) die("rate must be >= threads");
    if (!cfg->method[0] || strpbrk(cfg->method, " \t\r\n")) die("invalid method: '%s'", cfg->method);
    if (no_keepalive) cfg->keepalive = 0;
    if (cfg->mix.given && method_given)
        die("-m/--method cannot be combined with --target/--targets (each target names its method)");
    if (!cfg->mix.given && cfg->per_connection) die("--target-per-connection needs --target or --targets");
    if (cfg->per_connection && mix_split(&cfg->mix, cfg->connections, err, sizeof err)) die("%s", err);

    char host[MAX_URL_PART], port[16], authority[MAX_URL_PART];
    const char *path;
    parse_url(cfg->url, host, port, authority, &path);
    const char *query = cfg->url + 7 + strlen(authority);
    if (*query == '#') query = "";

    char *body_buf = NULL;
    if (body_file) body = body_buf = read_file(body_file, &body_len);
    else if (body) body_len = strlen(body);
    if (!cfg->mix.given) add_url_target(cfg, path, query);
    struct user_headers u = check_headers(cfg);
    for (size_t i = 0; i < cfg->mix.n; i++) render_request(cfg, u, &cfg->mix.targets[i], authority, body, body_len, body != NULL);
    cfg->body_len = body_len;
    free(body_buf);
    if (!cfg->keepalive && cfg->pipeline > 1) die("--pipeline needs keep-alive connections");

    if (cfg->socket_path) {
        if (net_target_unix(&cfg->target, cfg->socket_path, err, sizeof err)) die("%s", err);
    } else if (net_target_tcp(&cfg->target, host, port, err, sizeof err)) {
        die("%s", err);
    }
}

/* One descriptor per connection: raise the soft limit as far as allowed, and
 * refuse up front rather than fail every connect with EMFILE. */
static void check_fd_limit(uint64_t connections)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < connections + SPARE_FDS) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > connections + SPARE_FDS ? (rlim_t)(connections + SPARE_FDS)
                                                                                            : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < connections + SPARE_FDS)
        die("%" PRIu64 " connections need %" PRIu64 " file descriptors; the limit is %llu (ulimit -n)", connections,
            connections + SPARE_FDS, (unsigned long long)rl.rlim_cur);
}

static void on_sigint(int sig)
{
    (void)sig;
    worker_request_stop();
}

static void errors_add(struct errors *sum, const struct errors *e)
{
    sum->connect += e->connect;
    sum->read += e->read;
    sum->write += e->write;
    sum->timeout += e->timeout;
    sum->status += e->status;
    sum->connect_retry += e->connect_retry;
}

/* wrk exits 0 whatever became of the requests (only a failed first connect exits 1), so a script
 * or CI job that runs it cannot tell a run that measured a server from one that measured nothing.
 * Here a run in which no request got a 2xx or 3xx response (every one a socket error, a timeout or
 * a 4xx/5xx; or none finished at all) says so on stderr after the report and exits 1. */
static int run_failed(const struct results *r)
{
    if (r->complete > r->errors.status) return 0;
    const struct errors *e = &r->errors;
    fprintf(stderr,
            "blackbuck-load: every request failed: %" PRIu64 " responses, none 2xx or 3xx; socket errors: connect %" PRIu64
            ", read %" PRIu64 ", write %" PRIu64 ", timeout %" PRIu64 "\n",
            r->complete, e->connect, e->read, e->write, e->timeout);
    return 1;
}

static double tv_s(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

int main(int argc, char **argv)
{
    struct config cfg;
    parse_args(&cfg, argc, argv);
    check_fd_limit(cfg.connections);

    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);

    struct worker *workers = calloc(cfg.threads, sizeof *workers);
    if (!workers) die("out of memory");
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);

    report_banner(stdout, &cfg);
    fflush(stdout);

    uint64_t start = now_ns(), stop = start + cfg.duration_us * 1000;
    for (uint64_t i = 0; i < cfg.threads; i++) {
        uint64_t conns = cfg.connections / cfg.threads + (i < cfg.connections % cfg.threads);
        uint64_t rate = cfg.rate ? cfg.rate / cfg.threads + (i < cfg.rate % cfg.threads) : 0;
        if (worker_init(&workers[i], &cfg, (int)i, conns, rate, start, stop)) die("out of memory");
        if (pthread_create(&workers[i].tid, NULL, worker_main, &workers[i]))
            die("unable to create thread %" PRIu64 ": %s", i, strerror(errno));
    }

    struct results r;
    memset(&r, 0, sizeof r);
    r.latency = hist_new();
    r.connect = hist_new();
    r.rps = hist_new();
    r.ntargets = cfg.mix.n;
    r.targets = calloc(r.ntargets, sizeof *r.targets);
    if (!r.latency || !r.connect || !r.rps || !r.targets) die("out of memory");
    for (size_t k = 0; k < r.ntargets; k++)
        if (!(r.targets[k].latency = hist_new())) die("out of memory");
    for (uint64_t i = 0; i < cfg.threads; i++) {
        struct worker *w = &workers[i];
        pthread_join(w->tid, NULL);
        r.complete += w->complete;
        r.bytes += w->bytes;
        r.reconnects += w->reconnects;
        for (int s = 0; s < 600; s++) r.status_counts[s] += w->status_counts[s];
        for (size_t k = 0; k < r.ntargets; k++) {
            r.targets[k].complete += w->stats[k].complete;
            errors_add(&r.targets[k].errors, &w->stats[k].errors);
            hist_merge(r.targets[k].latency, w->stats[k].latency);
        }
        hist_merge(r.connect, w->connect);
        hist_merge(r.rps, w->rps);
        r.sent += w->sent;
        r.late += w->late;
        r.dropped += w->dropped;
    }
    /* the run's errors and latency are its targets' together */
    for (size_t k = 0; k < r.ntargets; k++) {
        errors_add(&r.errors, &r.targets[k].errors);
        hist_merge(r.latency, r.targets[k].latency);
    }
    r.runtime_us = (now_ns() - start) / 1000;
    getrusage(RUSAGE_SELF, &ru1);
    r.cpu_user_s = tv_s(ru1.ru_utime) - tv_s(ru0.ru_utime);
    r.cpu_system_s = tv_s(ru1.ru_stime) - tv_s(ru0.ru_stime);
    r.workers = workers;
    r.nworkers = cfg.threads;

    report_text(stdout, &cfg, &r);
    fflush(stdout);
    int rc = run_failed(&r);
    if (cfg.json_path && report_json(cfg.json_path, &cfg, &r)) {
        fprintf(stderr, "blackbuck-load: cannot write %s: %s\n", cfg.json_path, strerror(errno));
        rc = 1;
    }
    for (uint64_t i = 0; i < cfg.threads; i++) worker_free(&workers[i]);
    free(workers);
    hist_free(r.latency);
    hist_free(r.connect);
    hist_free(r.rps);
    for (size_t k = 0; k < r.ntargets; k++) hist_free(r.targets[k].latency);
    free(r.targets);
    mix_free(&cfg.mix);
    free(cfg.headers);
    return rc;
}
