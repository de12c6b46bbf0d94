/*
 * bb_env.c - a request's Rack env: Conn#parse runs the parser (bb_http.c) over the connection's
 * buffer and, for a complete head, builds the env from the listener's template (or from the
 * connection's env_base, the entries its keep-alive requests share) with interned keys; and
 * Conn#start_app, which says how long the request waited (blackbuck.queue_time).
 */
#include "bb_conn_int.h"

static VALUE k_request_method, k_path_info, k_query_string, k_request_uri, k_server_protocol, k_http_version,
    k_remote_addr, k_server_name, k_server_port, k_http_host, k_content_length, k_content_type,
    k_early_hints, k_queue_time, v_http10, v_http11, v_port80, v_port443, v_empty, k_url_scheme, v_https;

/* SERVER_NAME and SERVER_PORT from an authority the parser validated ("name", "name:port",
 * "[v6]:port"; host_len bytes of host). A port's leading zeros are dropped ("0080" is 80: Rack 2's
 * Lint reads "0080" as a bad octal number); no port means the scheme's default (default_port). An
 * empty authority (an empty Host) leaves the listener's name and port from the template. */
static void set_host(VALUE env, const char *v, size_t n, size_t host_len, VALUE default_port)
{
    if (n == 0) return;
    rb_hash_aset(env, k_server_name, rb_str_new(v, (long)host_len));
    if (host_len + 1 < n) {
        const char *port = v + host_len + 1, *end = v + n;
        while (port + 1 < end && *port == '0') port++;
        rb_hash_aset(env, k_server_port, rb_str_new(port, (long)(end - port)));
    } else {
        rb_hash_aset(env, k_server_port, default_port);
    }
}

/* Bounds of a plausible X-Request-Start, in seconds before now (a clock a little ahead of ours is 0). */
#define BB_REQUEST_START_MAX_AGE 3600.0
#define BB_REQUEST_START_MAX_AHEAD 5.0

/* X-Request-Start, as a proxy in front stamps it: "t=1700000000.123" (nginx ${msec}: seconds),
 * "t=1700000000123" (milliseconds, Heroku), "t=1700000000123456" (microseconds, Apache %t), the "t="
 * optional. The unit is told by the size of the number. -> wall-clock seconds, or 0 when the value
 * is malformed or implausible (more than an hour old, or from the future). */
static double parse_request_start(const char *v, size_t n, double now)
{
    double x = 0, frac = 0, scale = 1;
    size_t i = 0;
    int digits = 0, dot = 0;
    if (n >= 2 && v[0] == 't' && v[1] == '=') i = 2;
    for (; i < n; i++) {
        char ch = v[i];
        if (ch >= '0' && ch <= '9') {
            if (dot) frac += (ch - '0') * (scale /= 10);
            else if (++digits > 19) return 0;
            else x = x * 10 + (ch - '0');
        } else if (ch == '.' && !dot) {
            dot = 1;
        } else {
            return 0;
        }
    }
    if (!digits) return 0;
    x += frac;
    while (x > now * 100) x /= 1000; /* ns -> us -> ms -> s: each step is three orders */
    if (x > now + BB_REQUEST_START_MAX_AHEAD || x < now - BB_REQUEST_START_MAX_AGE) return 0;
    return x;
}

/* X-Forwarded-Proto: https (its first value), X-Forwarded-Scheme: https or X-Forwarded-Ssl: on, as
 * a TLS-terminating proxy in front (nginx, a load balancer) sends them and Puma and Unicorn read
 * them: the request came in over https. Only when trust_forwarded_proto is on. */
static int forwarded_https(const struct bb_header *h)
{
    const char *n = h->name, *v = h->value;
    size_t nl = h->name_len, vl = h->value_len;
    if (nl < 15 || nl > 18 || (n[0] | 0x20) != 'x' || n[1] != '-') return 0; /* most fields stop here */
    if (ieq(n, nl, "x-forwarded-proto") || ieq(n, nl, "x-forwarded-scheme"))
        return vl >= 5 && ieq(v, 5, "https") && (vl == 5 || v[5] == ',' || v[5] == ' ');
    if (ieq(n, nl, "x-forwarded-ssl")) return ieq(v, vl, "on");
    return 0;
}

/* The env keys of the fields most requests carry, and the common methods, interned once at
 * load: a request finds them by comparing bytes instead of building and interning a string
 * (a lookup in Ruby's global fstring table) per field. Names compare case-insensitively,
 * methods exactly (they are case-sensitive). */
static struct known {
    const char *name;
    size_t len;
    VALUE value;
} known_headers[] = {
    {"host", 4, Qnil}, {"connection", 10, Qnil}, {"user-agent", 10, Qnil}, {"accept", 6, Qnil},
    {"accept-encoding", 15, Qnil}, {"accept-language", 15, Qnil}, {"cookie", 6, Qnil}, {"referer", 7, Qnil},
    {"origin", 6, Qnil}, {"authorization", 13, Qnil}, {"cache-control", 13, Qnil}, {"x-forwarded-for", 15, Qnil},
    {"x-forwarded-proto", 17, Qnil}, {"x-forwarded-host", 16, Qnil}, {"x-real-ip", 9, Qnil}, {"x-request-id", 12, Qnil},
    {"if-none-match", 13, Qnil}, {"if-modified-since", 17, Qnil}, {"upgrade-insecure-requests", 25, Qnil},
    {"pragma", 6, Qnil}, {"upgrade", 7, Qnil}, {"keep-alive", 10, Qnil}, {"expect", 6, Qnil}, {"range", 5, Qnil},
}, known_methods[] = {
    {"GET", 3, Qnil}, {"POST", 4, Qnil}, {"HEAD", 4, Qnil}, {"PUT", 3, Qnil},
    {"DELETE", 6, Qnil}, {"PATCH", 5, Qnil}, {"OPTIONS", 7, Qnil},
};
#define KNOWN_N(a) (sizeof(a) / sizeof((a)[0]))

/* The interned CGI name of header field `name` (n bytes, n <= 256): "HTTP_" + upper case, '-' -> '_'. */
static VALUE env_key(const char *name, size_t n)
{
    char key[5 + 256];
    size_t i;
    memcpy(key, "HTTP_", 5);
    for (i = 0; i < n; i++) {
        char ch = name[i];
        key[5 + i] = ch == '-' ? '_' : (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
    }
    return bb_fstring(key, (long)(5 + n));
}

static VALUE known_header_key(const char *name, size_t n)
{
    size_t i;
    for (i = 0; i < KNOWN_N(known_headers); i++)
        if (known_headers[i].len == n && ieq(name, n, known_headers[i].name)) return known_headers[i].value;
    return Qundef;
}

static VALUE method_value(const char *m, size_t n)
{
    size_t i;
    for (i = 0; i < KNOWN_N(known_methods); i++)
        if (known_methods[i].len == n && memcmp(m, known_methods[i].name, n) == 0) return known_methods[i].value;
    return bb_fstring(m, (long)n);
}

static void add_header(VALUE env, const struct bb_header *h)
{
    VALUE k, val, old;
    const char *name = h->name;
    size_t nl = h->name_len;

    if (ieq(name, nl, "content-length")) {
        k = k_content_length;
    } else if (ieq(name, nl, "content-type")) {
        k = k_content_type;
    } else if ((k = known_header_key(name, nl)) != Qundef) {
        /* interned at load */
    } else {
        if (nl > 256 || memchr(name, '_', nl)) return; /* X_Forwarded_For must not shadow X-Forwarded-For */
        k = env_key(name, nl);
    }
    old = rb_hash_lookup2(env, k, Qundef);
    if (old == Qundef) {
        val = rb_str_new(h->value, (long)h->value_len);
        rb_hash_aset(env, k, val);
    } else {
        int cookie = nl == 6 && ieq(name, nl, "cookie");
        old = rb_str_dup(old);
        rb_str_cat(old, cookie ? "; " : ", ", 2);
        rb_str_cat(old, h->value, (long)h->value_len);
        rb_hash_aset(env, k, old);
    }
}

/* The start of a request's env, and whether it has the request's Host entries already (then
 * HTTP_HOST, SERVER_NAME and SERVER_PORT are in it). A keep-alive connection's requests start from
 * a copy of its env_base, made at its first request with the entries that stay the same: the
 * listener's template, the protocol, REMOTE_ADDR and, when they can only be what they were (the same
 * Host bytes, no absolute-form target), the Host entries, made for http (request_env sets
 * SERVER_PORT for an https request whose Host has no port). */
static VALUE env_start(struct conn *c, const struct bb_request *req, int *has_host)
{
    const struct bb_header *host = req->host_index >= 0 ? &req->headers[req->host_index] : NULL;
    int minor = req->minor_version;
    /* its Host may live in env_base */
    int host_fixed = host && host->value_len > 0 && host->value_len <= BB_BASE_HOST_MAX && !(req->flags & BB_F_ABSOLUTE_FORM);
    VALUE env;

    if (c->env_base != Qnil && c->env_base_minor == minor &&
        (!c->base_host_len || (host_fixed && host->value_len == c->base_host_len &&
                               memcmp(host->value, c->base_host, c->base_host_len) == 0))) {
        *has_host = c->base_host_len > 0;
        return rb_hash_dup(c->env_base);
    }
    env = rb_hash_dup(c->template);
    /* 103 Early Hints is HTTP/1.1's: an HTTP/1.0 request gets no rack.early_hints, even when the
     * worker's template offers it (Worker#env_templates) */
    if (!minor) rb_hash_delete(env, k_early_hints);
    rb_hash_aset(env, k_server_protocol, minor ? v_http11 : v_http10);
    rb_hash_aset(env, k_http_version, minor ? v_http11 : v_http10);
    rb_hash_aset(env, k_remote_addr, c->remote_addr);
    *has_host = 0;
    /* A connection that will see another request keeps these for it: one copy now instead of about
     * seven hash sets for every request after this one. Made once (again only for another protocol
     * version): a client that changes its Host has its Host entries set per request. */
    if (c->keepalive && bb_keepalive_max != 1 && (c->env_base == Qnil || c->env_base_minor != minor)) {
        c->base_host_len = 0;
        if (host_fixed) {
            /* frozen: every request of the connection shares them */
            set_host(env, req->authority, req->authority_len, req->host_len, v_port80);
            rb_obj_freeze(rb_hash_aref(env, k_server_name));
            rb_obj_freeze(rb_hash_aref(env, k_server_port));
            rb_hash_aset(env, k_http_host, rb_obj_freeze(rb_str_new(host->value, (long)host->value_len)));
            memcpy(c->base_host, host->value, host->value_len);
            c->base_host_len = host->value_len;
            *has_host = 1;
        }
        c->env_base = rb_obj_freeze(rb_hash_dup(env));
        c->env_base_minor = minor;
    }
    return env;
}

/* The Rack env of a request the parser read (req). */
static VALUE request_env(struct conn *c, const struct bb_request *req)
{
    int has_host, https = 0;
    double now = 0;
    size_t i;
    VALUE env = env_start(c, req, &has_host);

    c->req_method = method_value(req->method, req->method_len);
    c->req_path = rb_str_new(req->path, (long)req->path_len);
    rb_hash_aset(env, k_request_method, c->req_method);
    rb_hash_aset(env, k_request_uri, rb_str_new(req->target, (long)req->target_len));
    rb_hash_aset(env, k_path_info, c->req_path);
    rb_hash_aset(env, k_query_string, req->query ? rb_str_new(req->query, (long)req->query_len) : v_empty);
    c->request_start = 0;
    for (i = 0; i < req->num_headers; i++) {
        const struct bb_header *h = &req->headers[i];
        if (!(has_host && (int)i == req->host_index)) add_header(env, h);
        if (bb_settings.trust_forwarded_proto && !https) https = forwarded_https(h);
        if (h->name_len == 15 && ieq(h->name, 15, "x-request-start")) {
            if (now == 0) now = wall_now();
            c->request_start = parse_request_start(h->value, h->value_len, now);
        }
    }
    if (https) rb_hash_aset(env, k_url_scheme, v_https);
    if (req->authority && !has_host)
        set_host(env, req->authority, req->authority_len, req->host_len, https ? v_port443 : v_port80);
    else if (https && has_host && req->host_len == req->authority_len)
        rb_hash_aset(env, k_server_port, v_port443); /* env_base's Host entries are http's */
    /* absolute-form: RFC 9112 3.2.2, the target's authority wins over Host. HTTP_HOST says the
     * same as SERVER_NAME (as in Unicorn), since Rack and Rails take the host from HTTP_HOST. */
    if (req->flags & BB_F_ABSOLUTE_FORM)
        rb_hash_aset(env, k_http_host, rb_str_new(req->authority, (long)req->authority_len));
    return env;
}

/* parse -> env Hash | nil (need more bytes) | Integer status (reject and close) */
static VALUE conn_parse(VALUE self)
{
    struct conn *c = get_conn(self);
    struct bb_header headers[BB_HEADERS_CAP];
    struct bb_request req;
    VALUE env;
    int r;

    if (c->proxy) return Qfalse; /* the PROXY protocol header comes first: parse_proxy */
    if (c->off == c->len) return Qnil;
    memset(&req, 0, sizeof(req));
    req.headers = headers;
    req.num_headers = bb_settings.limits.max_headers;
    r = bb_parse_request(c->buf + c->off, c->len - c->off, c->last_len, &req, &bb_settings.limits);
    if (r == -2) {
        c->last_len = c->len - c->off;
        return Qnil;
    }
    if (r < 0) {
        c->last_len = 0;
        return INT2FIX(req.status ? req.status : 400);
    }
    c->last_len = 0;
    c->keepalive = req.minor_version ? !(req.flags & BB_F_CONN_CLOSE)
                                     : ((req.flags & BB_F_CONN_KEEPALIVE) && !(req.flags & BB_F_CONN_CLOSE));

    env = request_env(c, &req);
    c->minor = req.minor_version;
    c->client_close = !c->keepalive;
    c->head_only = req.method_len == 4 && memcmp(req.method, "HEAD", 4) == 0;
    c->expect_continue = (req.flags & BB_F_EXPECT_CONTINUE) && req.minor_version == 1;
    c->content_length = req.content_length;
    if (req.flags & BB_F_CHUNKED) {
        c->body_mode = BODY_CHUNKED;
        c->body_done = 0;
        bb_chunked_init(&c->dec);
    } else if (req.content_length > 0) {
        c->body_mode = BODY_LENGTH;
        c->body_left = req.content_length;
        c->body_done = 0;
    } else {
        c->body_mode = BODY_NONE;
        c->body_done = 1;
    }
    c->replay_off = c->off;
    c->replay_len = c->body_mode == BODY_NONE && c->off + (size_t)r == c->len ? (size_t)r : 0;
    c->off += (size_t)r;
    if (c->off == c->len) c->off = c->len = 0;
    return env;
}

/* Seconds the request has waited for the app: since the worker woke up to the read
 * that completed it (its bytes were there then), or since the proxy's X-Request-Start when that is
 * earlier (it also counts what waited in front of the worker: the listen queue, unread socket bytes). */
static double queue_seconds(const struct conn *c)
{
    double q = c->woke_at > 0 ? mono_now() - c->woke_at : 0;
    if (c->request_start > 0) {
        double proxy = wall_now() - c->request_start;
        if (proxy > q) q = proxy;
    }
    return q < 0 ? 0 : q;
}

/* start_app(env) -> Float queue time: the whole request is in and goes to the app. The connection
 * is BUSY, and env["blackbuck.queue_time"] says how long it waited (queue_time). */
static VALUE conn_start_app(VALUE self, VALUE env)
{
    struct conn *c = get_conn(self);
    VALUE q = DBL2NUM(queue_seconds(c));
    __atomic_store_n(&c->state, BB_CONN_BUSY, __ATOMIC_RELAXED);
    rb_hash_aset(env, k_queue_time, q);
    return q;
}

void bb_conn_request_line(VALUE conn, VALUE *method, VALUE *path)
{
    struct conn *c = get_conn(conn);
    *method = c->req_method;
    *path = c->req_path;
}

static VALUE reg(VALUE v)
{
    rb_gc_register_mark_object(v);
    return v;
}

void bb_init_env(void)
{
    VALUE cConn = bb_cConn;
    rb_define_method(cConn, "start_app", conn_start_app, 1);
    rb_define_method(cConn, "parse", conn_parse, 0);
    k_request_method = reg(bb_fstring("REQUEST_METHOD", 14));
    k_path_info = reg(bb_fstring("PATH_INFO", 9));
    k_query_string = reg(bb_fstring("QUERY_STRING", 12));
    k_request_uri = reg(bb_fstring("REQUEST_URI", 11));
    k_server_protocol = reg(bb_fstring("SERVER_PROTOCOL", 15));
    k_http_version = reg(bb_fstring("HTTP_VERSION", 12));
    k_remote_addr = reg(bb_fstring("REMOTE_ADDR", 11));
    k_server_name = reg(bb_fstring("SERVER_NAME", 11));
    k_server_port = reg(bb_fstring("SERVER_PORT", 11));
    k_http_host = reg(bb_fstring("HTTP_HOST", 9));
    k_content_length = reg(bb_fstring("CONTENT_LENGTH", 14));
    k_content_type = reg(bb_fstring("CONTENT_TYPE", 12));
    k_early_hints = reg(bb_fstring("rack.early_hints", 16));
    k_queue_time = reg(bb_fstring("blackbuck.queue_time", 20));
    v_http10 = reg(bb_fstring("HTTP/1.0", 8));
    v_http11 = reg(bb_fstring("HTTP/1.1", 8));
    v_port80 = reg(bb_fstring("80", 2));
    v_port443 = reg(bb_fstring("443", 3));
    k_url_scheme = reg(bb_fstring("rack.url_scheme", 15));
    v_https = reg(bb_fstring("https", 5));
    v_empty = reg(bb_fstring("", 0)); /* QUERY_STRING when there is none: shared and frozen */
    {
        size_t i;
        for (i = 0; i < KNOWN_N(known_headers); i++)
            known_headers[i].value = reg(env_key(known_headers[i].name, known_headers[i].len));
        for (i = 0; i < KNOWN_N(known_methods); i++)
            known_methods[i].value = reg(bb_fstring(known_methods[i].name, (long)known_methods[i].len));
    }
}
