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
