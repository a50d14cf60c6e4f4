/* Socket watcher: a native thread that waits for datagrams on a set of UDP
 * sockets and rings a doorbell, so a driver that sleeps on its futex
 * doorbell also wakes for the network.  Sockets are watched one-shot: after
 * a wake the driver drains the socket and re-arms it before sleeping again,
 * so a busy socket costs no wake-ups while the driver is working. */

#define FULMAR_WATCHER_MAX_FDS 256

typedef struct fulmar_watcher_stct fulmar_watcher_t;

fulmar_watcher_t *fulmar_watcher_start(char *doorbell_base, int64_t doorbell_offset);
int32_t fulmar_watcher_add(fulmar_watcher_t *watcher, int32_t fd);
int32_t fulmar_watcher_remove(fulmar_watcher_t *watcher, int32_t fd);
int32_t fulmar_watcher_rearm(fulmar_watcher_t *watcher, int32_t fd);
void fulmar_watcher_stop(fulmar_watcher_t *watcher);
