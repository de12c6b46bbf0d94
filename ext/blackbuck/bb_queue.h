/* bb_queue.h - Native.listen_queue (bb_queue.c): a listener's accept-queue length and backlog. */
#ifndef BB_QUEUE_H
#define BB_QUEUE_H

void bb_init_queue(void);

#endif
