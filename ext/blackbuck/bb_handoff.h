/* bb_handoff.h - Native::Handoff (bb_handoff.c): the worker's watcher thread. */
#ifndef BB_HANDOFF_H
#define BB_HANDOFF_H

void bb_init_handoff(void);

#endif
