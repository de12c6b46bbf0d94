/*
 * bb_scoreboard.h - Native::Scoreboard (bb_scoreboard.c): one slot per worker in shared memory.
 */
#ifndef BB_SCOREBOARD_H
#define BB_SCOREBOARD_H

#include "bb_glue.h"

/* Scoreboard#request_start and #request_done, for Handoff's (which wrap them). */
VALUE bb_scoreboard_request_start(VALUE sb, VALUE idx, VALUE conn, VALUE queue);
VALUE bb_scoreboard_request_done(VALUE sb, VALUE idx, VALUE state);

void bb_init_scoreboard(void);

#endif
