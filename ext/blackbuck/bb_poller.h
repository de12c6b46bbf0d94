/*
 * bb_poller.h - Native::Poller (bb_poller.c), and what the hand-off watcher thread may do with a
 * worker's poller (no Ruby calls, no GVL needed).
 */
#ifndef BB_POLLER_H
#define BB_POLLER_H

#include "bb_glue.h"

struct poller;
struct poller *bb_poller_get(VALUE poller);
/* fds readable now (timeout 0), at most max of them, connections with an error or hang-up left out. */
int bb_poller_peek(struct poller *pl, int *fds, int max);
/* Unregisters fd; 0 or -1 with errno. */
int bb_poller_forget(struct poller *pl, int fd);

void bb_init_poller(void);

#endif
