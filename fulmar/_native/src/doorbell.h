/* Doorbell: a futex word in shared memory that lets an idle reader sleep
 * until a writer has something for it, without the writer paying a system
 * call when nobody sleeps.
 *
 * Layout, 8 bytes at an 8-aligned offset:
 *   sequence i32 @0   bumped by every ring that finds a waiter (the futex word)
 *   waiters  i32 @4   readers between prepare and the end of wait/cancel
 *
 * Waiter: token = prepare(); re-check for work; then wait(token, timeout)
 * or cancel().  Ringer: publish the data, then ring().  The full fences on
 * both sides make the pair "waiter registers, then looks for work" and
 * "writer publishes, then looks for waiters" safe: at least one of them sees
 * the other. */

#define FULMAR_DOORBELL_LENGTH 8
#define FULMAR_DOORBELL_SEQUENCE_OFFSET 0
#define FULMAR_DOORBELL_WAITERS_OFFSET 4

/* Results of fulmar_doorbell_wait (failures are a negated errno). */
#define FULMAR_DOORBELL_TIMED_OUT 0
#define FULMAR_DOORBELL_RUNG 1
#define FULMAR_DOORBELL_INTERRUPTED 2

int32_t fulmar_doorbell_prepare(char *base, int64_t offset);
void fulmar_doorbell_cancel(char *base, int64_t offset);
int32_t fulmar_doorbell_wait(char *base, int64_t offset, int32_t token, int64_t timeout_ns);
int32_t fulmar_doorbell_ring(char *base, int64_t offset);

/* A doorbell whose sleeper waits in epoll rather than on the futex: the media
 * driver's data thread, which must wake for its sockets as well.  The layout
 * is the same; a ringer that finds a waiter writes one byte to the sleeper's
 * FIFO.  The sequence word says "a byte is on its way", so a burst of rings
 * while the sleeper wakes writes one byte, not one each.
 *
 * Sleeper: fulmar_doorbell_fifo_prepare(); re-check for work; epoll_wait on
 * the FIFO's read end (among others); fulmar_doorbell_fifo_done(), which
 * drains the FIFO.  Ringer: publish, then fulmar_doorbell_ring_fifo().
 * Returns 1 when it wrote, 0 when nobody sleeps or a byte is on its way,
 * -errno when the write failed (a full FIFO is no failure: it wakes). */
int32_t fulmar_doorbell_ring_fifo(char *base, int64_t offset, int32_t fd);
void fulmar_doorbell_fifo_prepare(char *base, int64_t offset);
void fulmar_doorbell_fifo_done(char *base, int64_t offset, int32_t fd);

/* Reader doorbells.  Every fulmar client sleeps on a doorbell of its own: the
 * value slot of a counter of type FULMAR_CLIENT_DOORBELL_TYPE_ID in cnc.dat,
 * so a writer can wake just the processes that read what it wrote, instead of
 * every process of the node.  A doorbell is named by its counter id; its words
 * are at counters_values + id * FULMAR_COUNTER_LENGTH (counters.h).
 *
 * A log's readers: the media driver keeps, in the log's metadata (past every
 * field Aeron defines there), the doorbells of the clients that read the log:
 *   count i32 @0, relay i32 @4, doorbell ids i32[FULMAR_LOG_READERS_CAPACITY] @8
 * A writer rings them after each append.  relay = 1: the log has more reader
 * doorbells than fit, and a writer rings the media driver as well, which rings
 * the rest.
 *
 * A counter's watchers: a process that sleeps until some counter moves (a
 * consensus module on the archive's rec-pos, a service on commit-pos) names
 * its doorbell in the counter's value record, past Aeron's fields; the writer
 * of the counter rings them after it moves it.  Each slot holds a doorbell
 * id + 1 (0: free), claimed and released by the watchers with compare-and-set.
 *
 * Ids outside the counters buffer are skipped: the tables live in memory
 * other processes write. */
#define FULMAR_CLIENT_DOORBELL_TYPE_ID 1100
/* A doorbell one thread of a client sleeps on (the archive's recorder): a
 * subscription names it with the channel's doorbell-id, and data landing in
 * that subscription's images rings it instead of the client's doorbell. */
#define FULMAR_THREAD_DOORBELL_TYPE_ID 1101
#define FULMAR_LOG_READERS_OFFSET 1024
#define FULMAR_LOG_READERS_COUNT_OFFSET 0
#define FULMAR_LOG_READERS_RELAY_OFFSET 4
#define FULMAR_LOG_READERS_IDS_OFFSET 8
#define FULMAR_LOG_READERS_CAPACITY 30
#define FULMAR_COUNTER_WATCHERS_OFFSET 64
#define FULMAR_COUNTER_WATCHERS_CAPACITY 16

/* Rings each doorbell named in ids (one fence for all); returns how many had waiters. */
int32_t fulmar_doorbell_ring_ids(char *counters_values, int64_t values_length, const int32_t *ids, int32_t count);
/* Rings the readers of the log whose metadata starts at `metadata`; returns the relay flag. */
int32_t fulmar_log_ring_readers(char *metadata, char *counters_values, int64_t values_length);
/* Adds a watcher to a counter: 0, or -1 when its slots are full.  Idempotent. */
int32_t fulmar_counter_watch(char *counters_values, int64_t values_length, int32_t counter_id, int32_t doorbell_id);
/* Removes a watcher (every slot naming it); returns how many slots it held. */
int32_t fulmar_counter_unwatch(char *counters_values, int64_t values_length, int32_t counter_id, int32_t doorbell_id);
/* Rings a counter's watchers; returns how many had waiters. */
int32_t fulmar_counter_ring_watchers(char *counters_values, int64_t values_length, int32_t counter_id);
