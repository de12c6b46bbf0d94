/*
 * bb_ext.c - the extension's entry point: Init_blackbuck_ext defines Blackbuck::Native and each
 * file's classes, in order. Nothing else calls into this file, and it is the only one that knows
 * every other: the glue's include and call graph has no cycle (docs/ARCHITECTURE.md).
 */
#include "bb_glue.h"
#include "bb_conn.h"
#include "bb_handoff.h"
#include "bb_poller.h"
#include "bb_queue.h"
#include "bb_scoreboard.h"

RUBY_FUNC_EXPORTED void Init_blackbuck_ext(void)
{
    bb_init_glue();
    bb_init_conn(); /* Native::Conn, then its methods from the files of its concerns */
    bb_init_env();
    bb_init_respond();
    bb_init_poller();
    bb_init_handoff();
    bb_init_scoreboard();
    bb_init_queue();
}
