/* poller.h - the smallest event-loop backend a load generator needs:
 * epoll on Linux, kqueue on the BSDs and macOS, chosen at build time.
 * Level-triggered. Closing an fd removes it; there is no "delete". */
#ifndef BL_POLLER_H
#define BL_POLLER_H

#define PL_IN 1u
#define PL_OUT 2u
#define PL_ERR 4u /* error or hang-up; the next read/write reports which */

struct poller;

struct poller_event {
    void *ptr;
    unsigned events;
};

struct poller *poller_new(int size_hint);
void poller_free(struct poller *p);
int poller_add(struct poller *p, int fd, unsigned events, void *ptr);
int poller_mod(struct poller *p, int fd, unsigned old_events, unsigned events, void *ptr);
/* Returns the number of events stored (0 on timeout or EINTR), -1 on error. */
int poller_wait(struct poller *p, struct poller_event *out, int max, int timeout_ms);
const char *poller_name(void);

#endif
