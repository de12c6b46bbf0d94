/* parser.h - incremental HTTP/1.x response parser.
 *
 * No allocation; the caller owns the state and the input. Input may be split
 * at any byte: header lines are matched through a small line buffer, bodies are
 * skipped by counting. Framing: Content-Length, chunked, or EOF (a response
 * with neither ends when the server closes - a success). HEAD, 1xx, 204 and
 * 304 have no body; interim 1xx responses are skipped. */
#ifndef BL_PARSER_H
#define BL_PARSER_H

#include <stddef.h>
#include <stdint.h>

enum { RP_ERROR = -1, RP_MORE = 0, RP_DONE = 1 };

#define RP_LINE_CAP 128         /* bytes of a header line kept; the rest is skipped */
#define RP_MAX_HEAD (64 * 1024) /* status line + headers (or trailers) of one response */

struct resp_parser {
    int state;
    int status;        /* valid once the status line is parsed */
    int minor;         /* HTTP/1.<minor> */
    unsigned flags;    /* RPF_* */
    int head_request;  /* responses to HEAD have no body */
    uint64_t remaining;      /* body or chunk bytes still to skip */
    uint64_t content_length;
    uint64_t head_bytes;     /* header bytes so far, checked against RP_MAX_HEAD */
    uint64_t seen;           /* bytes of this response consumed so far */
    size_t line_len;         /* bytes held in line[] */
    int line_truncated;
    char line[RP_LINE_CAP];
};

void resp_init(struct resp_parser *p, int head_request);
/* Between two responses: is the next one the answer to a HEAD request?
 * (Pipelined requests may mix methods.) */
void resp_set_head(struct resp_parser *p, int head_request);

/* Consume buf[0..len). Returns the bytes consumed and sets *ev:
 * RP_DONE  - a response ended exactly at the returned offset (feed the rest
 *            later: the next call starts a new response);
 * RP_MORE  - all of len consumed, response incomplete;
 * RP_ERROR - malformed response (return value meaningless). */
size_t resp_feed(struct resp_parser *p, const char *buf, size_t len, int *ev);

/* The peer closed the connection. RP_DONE: that ended an EOF-delimited body.
 * RP_MORE: no byte of a response had arrived (an idle close, not an error).
 * RP_ERROR: the response was cut short. */
int resp_eof(struct resp_parser *p);

/* After RP_DONE: may the connection carry another request? */
int resp_keep_alive(const struct resp_parser *p);

#endif
