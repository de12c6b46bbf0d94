/* parser.c - see parser.h. */
#include "parser.h"

#include <string.h>
#include <strings.h>

enum {
    S_STATUS,     /* status line */
    S_HEADER,     /* header lines up to the empty line */
    S_BODY_LEN,   /* Content-Length body */
    S_BODY_EOF,   /* body runs until the connection closes */
    S_CHUNK_SIZE, /* chunk-size line */
    S_CHUNK_DATA,
    S_CHUNK_END,  /* CRLF after chunk data */
    S_TRAILER,    /* trailer lines after the last chunk */
    S_DONE,
};

#define RPF_CHUNKED 1u
#define RPF_HAS_LEN 2u
#define RPF_CLOSE 4u      /* Connection: close */
#define RPF_KEEPALIVE 8u  /* Connection: keep-alive */
#define RPF_EOF_BODY 16u  /* framed by EOF: never reusable */

static void reset(struct resp_parser *p)
{
    int head = p->head_request;
    memset(p, 0, offsetof(struct resp_parser, line));
    p->head_request = head;
    p->state = S_STATUS;
}

void resp_init(struct resp_parser *p, int head_request)
{
    p->head_request = head_request;
    reset(p);
}

void resp_set_head(struct resp_parser *p, int head_request) { p->head_request = head_request; }

int resp_keep_alive(const struct resp_parser *p)
{
    if (p->flags & (RPF_EOF_BODY | RPF_CLOSE) || p->status == 101) return 0;
    return p->minor >= 1 || (p->flags & RPF_KEEPALIVE);
}

static int is_space(char c) { return c == ' ' || c == '\t'; }

static void trim(const char **s, const char **e)
{
    while (*s < *e && is_space(**s)) (*s)++;
    while (*e > *s && is_space((*e)[-1])) (*e)--;
}

static int token_eq(const char *s, const char *e, const char *tok)
{
    size_t n = strlen(tok);
    return (size_t)(e - s) == n && !strncasecmp(s, tok, n);
}

/* "HTTP/1.x NNN[ reason]" */
static int parse_status(struct resp_parser *p, const char *s, const char *e)
{
    if (e - s < 12 || memcmp(s, "HTTP/1.", 7) != 0) return -1;
    if (s[7] < '0' || s[7] > '9' || s[8] != ' ') return -1;
    int status = 0;
    for (int i = 9; i < 12; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        status = status * 10 + (s[i] - '0');
    }
    if (status < 100 || (e - s > 12 && s[12] != ' ')) return -1;
    p->minor = s[7] - '0';
    p->status = status;
    return 0;
}

static int parse_header(struct resp_parser *p, const char *s, const char *e, int truncated)
{
    if (is_space(*s)) return 0; /* obsolete line folding: continuation of an ignored value */
    const char *colon = memchr(s, ':', (size_t)(e - s));
    if (!colon || colon == s) return truncated ? 0 : -1;
    const char *name_end = colon, *v = colon + 1, *ve = e;
    trim(&v, &ve);
    if (token_eq(s, name_end, "content-length")) {
        uint64_t n = 0;
        if (truncated || v == ve) return -1;
        for (const char *q = v; q < ve; q++) {
            if (*q < '0' || *q > '9' || n > (UINT64_MAX - 9) / 10) return -1;
            n = n * 10 + (uint64_t)(*q - '0');
        }
        if ((p->flags & RPF_HAS_LEN) && p->content_length != n) return -1;
        p->flags |= RPF_HAS_LEN;
        p->content_length = n;
    } else if (token_eq(s, name_end, "transfer-encoding")) {
        if (truncated) return -1;
        /* chunked must be the final coding; anything else is read to EOF */
        const char *last = ve;
        while (last > v && last[-1] != ',') last--;
        const char *le = ve;
        trim(&last, &le);
        if (token_eq(last, le, "chunked")) p->flags |= RPF_CHUNKED;
        else p->flags &= ~RPF_CHUNKED;
        if (!token_eq(last, le, "chunked")) p->flags |= RPF_EOF_BODY;
    } else if (token_eq(s, name_end, "connection")) {
        const char *t = v;
        while (t < ve) {
            const char *te = memchr(t, ',', (size_t)(ve - t));
            if (!te) te = ve;
            const char *a = t, *b = te;
            trim(&a, &b);
            if (token_eq(a, b, "close")) p->flags |= RPF_CLOSE;
            else if (token_eq(a, b, "keep-alive")) p->flags |= RPF_KEEPALIVE;
            t = te + 1;
        }
    }
    return 0;
}

/* Decide the body framing once the header block has ended. Returns RP_DONE
 * for a body-less response, RP_MORE otherwise. */
static int headers_done(struct resp_parser *p)
{
    if (p->status < 200 && p->status != 101) { /* interim response: the real one follows */
        uint64_t seen = p->seen;
        reset(p);
        p->seen = seen;
        return RP_MORE;
    }
    if (p->head_request || p->status < 200 || p->status == 204 || p->status == 304) {
        p->flags &= ~RPF_EOF_BODY;
        return RP_DONE;
    }
    if (p->flags & RPF_CHUNKED) {
        p->flags &= ~RPF_EOF_BODY;
        p->state = S_CHUNK_SIZE;
        return RP_MORE;
    }
    if ((p->flags & RPF_HAS_LEN) && !(p->flags & RPF_EOF_BODY)) {
        if (p->content_length == 0) return RP_DONE;
        p->remaining = p->content_length;
        p->state = S_BODY_LEN;
        return RP_MORE;
    }
    p->flags |= RPF_EOF_BODY;
    p->state = S_BODY_EOF;
    return RP_MORE;
}

static int parse_chunk_size(struct resp_parser *p, const char *s, const char *e)
{
    uint64_t n = 0;
    const char *q = s;
    while (q < e && is_space(*q)) q++;
    const char *digits = q;
    for (; q < e; q++) {
        int d;
        if (*q >= '0' && *q <= '9') d = *q - '0';
        else if ((*q | 0x20) >= 'a' && (*q | 0x20) <= 'f') d = (*q | 0x20) - 'a' + 10;
        else break;
        if (n >> 60) return -1;
        n = n * 16 + (uint64_t)d;
    }
    if (q == digits) return -1;
    while (q < e && is_space(*q)) q++;
    if (q < e && *q != ';') return -1; /* chunk extensions are ignored */
    p->remaining = n;
    p->state = n ? S_CHUNK_DATA : S_TRAILER;
    return 0;
}

/* One complete line [s, e) without its line terminator. */
static int line_done(struct resp_parser *p, const char *s, const char *e, int truncated)
{
    if (e > s && e[-1] == '\r') e--;
    switch (p->state) {
    case S_STATUS:
        if (truncated || parse_status(p, s, e)) return RP_ERROR;
        p->state = S_HEADER;
        return RP_MORE;
    case S_HEADER:
        if (s == e) return headers_done(p);
        return parse_header(p, s, e, truncated) ? RP_ERROR : RP_MORE;
    case S_CHUNK_SIZE:
        return truncated || parse_chunk_size(p, s, e) ? RP_ERROR : RP_MORE;
    case S_CHUNK_END:
        if (s != e) return RP_ERROR;
        p->state = S_CHUNK_SIZE;
        return RP_MORE;
    case S_TRAILER:
        return s == e ? RP_DONE : RP_MORE;
    }
    return RP_ERROR;
}

size_t resp_feed(struct resp_parser *p, const char *buf, size_t len, int *ev)
{
    size_t off = 0;
    if (p->state == S_DONE) reset(p);
    while (off < len) {
        const char *at = buf + off;
        size_t avail = len - off;
        int r = RP_MORE;
        switch (p->state) {
        case S_BODY_EOF:
            off = len;
            break;
        case S_BODY_LEN:
        case S_CHUNK_DATA: {
            size_t take = avail < p->remaining ? avail : (size_t)p->remaining;
            p->remaining -= take;
            off += take;
            if (p->remaining == 0) {
                if (p->state == S_BODY_LEN) r = RP_DONE;
                else p->state = S_CHUNK_END;
            }
            break;
        }
        default: { /* line-oriented states */
            const char *nl = memchr(at, '\n', avail);
            size_t n = nl ? (size_t)(nl - at) : avail;
            if (p->state == S_STATUS || p->state == S_HEADER || p->state == S_TRAILER) {
                p->head_bytes += n + (nl != NULL);
                if (p->head_bytes > RP_MAX_HEAD) { *ev = RP_ERROR; return off; }
            } else if (p->line_len + n > RP_LINE_CAP) {
                *ev = RP_ERROR; /* a chunk-size line never needs this much */
                return off;
            }
            if (!nl || p->line_len) { /* line split across reads: keep its head */
                size_t room = RP_LINE_CAP - p->line_len, keep = n < room ? n : room;
                memcpy(p->line + p->line_len, at, keep);
                p->line_len += keep;
                if (keep < n) p->line_truncated = 1;
            }
            off += n + (nl != NULL);
            if (!nl) break;
            if (p->line_len) {
                /* a '\r' cut off by truncation must not hide the line's real end */
                r = line_done(p, p->line, p->line + p->line_len, p->line_truncated);
                p->line_len = 0;
                p->line_truncated = 0;
            } else {
                r = line_done(p, at, at + n, 0);
            }
            break;
        }
        }
        if (r == RP_ERROR) { *ev = RP_ERROR; return off; }
        if (r == RP_DONE) {
            p->seen += off;
            p->state = S_DONE;
            *ev = RP_DONE;
            return off;
        }
    }
    p->seen += off;
    *ev = RP_MORE;
    return off;
}

int resp_eof(struct resp_parser *p)
{
    if (p->state == S_BODY_EOF) {
        p->state = S_DONE;
        return RP_DONE;
    }
    if (p->state == S_DONE || (p->state == S_STATUS && p->seen == 0 && p->line_len == 0)) return RP_MORE;
    return RP_ERROR;
}
