/* Futex-backed doorbell; see doorbell.h for the protocol.
 *
 * The word lives in a MAP_SHARED file mapping used by several processes, so
 * the futex calls use the shared (non-_PRIVATE) operations: the kernel keys a
 * shared futex by the backing page, not by the process's address space. */
/* Python.h first: it sets the feature macros (_GNU_SOURCE among them).  The
 * wait releases the GIL itself, because the module's calls do not (see
 * build.py): it is the one native call that blocks. */
#include <Python.h>
#include "_common.h"
#include "counters.h"
#include "doorbell.h"
#include "_doorbell.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline int32_t *doorbell_sequence(char *base, int64_t offset)
{
    return (int32_t *)(base + offset + FULMAR_DOORBELL_SEQUENCE_OFFSET);
}

static inline int32_t *doorbell_waiters(char *base, int64_t offset)
{
    return (int32_t *)(base + offset + FULMAR_DOORBELL_WAITERS_OFFSET);
}

static int64_t monotonic_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int32_t fulmar_doorbell_prepare(char *base, int64_t offset)
{
    fa_get_and_add_i32(doorbell_waiters(base, offset), 1);
    /* The caller re-checks for work after this returns: the fence orders the
     * registration before those loads, pairing with the fence in ring(). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return fa_load_i32(doorbell_sequence(base, offset));
}

void fulmar_doorbell_cancel(char *base, int64_t offset)
{
    fa_get_and_add_i32(doorbell_waiters(base, offset), -1);
}

int32_t fulmar_doorbell_wait(char *base, int64_t offset, int32_t token, int64_t timeout_ns)
{
    int32_t result;
    Py_BEGIN_ALLOW_THREADS
    result = fulmar_doorbell_wait_without_gil(base, offset, token, timeout_ns);
    Py_END_ALLOW_THREADS
    return result;
}

int32_t fulmar_doorbell_wait_without_gil(char *base, int64_t offset, int32_t token, int64_t timeout_ns)
{
    int32_t *sequence = doorbell_sequence(base, offset);
    int32_t result = FULMAR_DOORBELL_TIMED_OUT;
    int64_t now_ns = monotonic_now_ns();
    int64_t deadline_ns = timeout_ns > INT64_MAX - now_ns ? INT64_MAX : now_ns + timeout_ns;

    for (;;)
    {
        /* Checked before the deadline so a ring that lands at the very end
         * still counts as rung. */
        if (fa_load_i32(sequence) != token)
        {
            result = FULMAR_DOORBELL_RUNG;
            break;
        }

        int64_t remaining_ns = deadline_ns - now_ns;
        if (remaining_ns <= 0)
        {
            break;
        }

        /* FUTEX_WAIT takes a relative CLOCK_MONOTONIC timeout and returns at
         * once (EAGAIN) if the word no longer holds the token, which closes
         * the gap between the load above and going to sleep. */
        struct timespec timeout = {
            .tv_sec = (time_t)(remaining_ns / 1000000000LL),
            .tv_nsec = (long)(remaining_ns % 1000000000LL),
        };
        long rc = syscall(SYS_futex, sequence, FUTEX_WAIT, token, &timeout, NULL, 0);
        if (rc != 0)
        {
            int error = errno;
            if (EINTR == error)
            {
                /* Hand control back so the Python caller can run its signal
                 * handlers (Ctrl-C) instead of sleeping through them. */
                result = FULMAR_DOORBELL_INTERRUPTED;
                break;
            }
            if (EAGAIN != error && ETIMEDOUT != error)
            {
                result = -error;
                break;
            }
        }
        /* Woken, timed out or raced with a ring: the loop head decides. */
        now_ns = monotonic_now_ns();
    }

    fa_get_and_add_i32(doorbell_waiters(base, offset), -1);
    return result;
}

int32_t fulmar_doorbell_ring(char *base, int64_t offset)
{
    /* Orders the caller's publication before the waiter check (pairs with
     * the fence in prepare()). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(doorbell_waiters(base, offset), __ATOMIC_RELAXED) <= 0)
    {
        return 0;
    }

    int32_t *sequence = doorbell_sequence(base, offset);
    fa_get_and_add_i32(sequence, 1);
    if (syscall(SYS_futex, sequence, FUTEX_WAKE, INT_MAX, NULL, NULL, 0) < 0)
    {
        return -errno;
    }
    return 1;
}

/* ---------------------------------------------------------------- FIFO doorbells */

int32_t fulmar_doorbell_ring_fifo(char *base, int64_t offset, int32_t fd)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(doorbell_waiters(base, offset), __ATOMIC_RELAXED) <= 0 ||
        !fa_cas_i32(doorbell_sequence(base, offset), 0, 1))
    {
        return 0;
    }
    const char byte = 1;
    ssize_t written;
    do
    {
        written = write(fd, &byte, 1);
    }
    while (written < 0 && EINTR == errno);
    if (written < 0 && EAGAIN != errno)
    {
        return -errno;
    }
    return 1;
}

void fulmar_doorbell_fifo_prepare(char *base, int64_t offset)
{
    fa_get_and_add_i32(doorbell_waiters(base, offset), 1);
    /* Orders the registration before the sleeper's re-check for work (pairs
     * with the fence in ring_fifo()). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void fulmar_doorbell_fifo_done(char *base, int64_t offset, int32_t fd)
{
    fa_get_and_add_i32(doorbell_waiters(base, offset), -1);
    /* Drained before the "on its way" mark is cleared: a ringer that sets the
     * mark again writes a byte that is still to come, so a set mark always
     * has a byte in the FIFO or on its way, and no sleep misses a ring.  (A
     * byte that lands after the drain costs one spurious wake.) */
    char scratch[64];
    ssize_t got;
    do
    {
        got = read(fd, scratch, sizeof(scratch));
    }
    while (got > 0 || (got < 0 && EINTR == errno));
    fa_store_i32(doorbell_sequence(base, offset), 0);
}

/* ---------------------------------------------------------------- reader doorbells */

static inline char *doorbell_of(char *counters_values, int64_t values_length, int32_t id)
{
    if (id < 0 || (int64_t)id * FULMAR_COUNTER_LENGTH + FULMAR_DOORBELL_LENGTH > values_length)
    {
        return NULL;
    }
    return counters_values + (int64_t)id * FULMAR_COUNTER_LENGTH;
}

/* ring() for a doorbell known to be past the caller's fence. */
static inline int32_t ring_fenced(char *doorbell)
{
    if (__atomic_load_n(doorbell_waiters(doorbell, 0), __ATOMIC_RELAXED) <= 0)
    {
        return 0;
    }
    int32_t *sequence = doorbell_sequence(doorbell, 0);
    fa_get_and_add_i32(sequence, 1);
    syscall(SYS_futex, sequence, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return 1;
}

int32_t fulmar_doorbell_ring_ids(char *counters_values, int64_t values_length, const int32_t *ids, int32_t count)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int32_t woken = 0;
    for (int32_t i = 0; i < count; i++)
    {
        char *doorbell = doorbell_of(counters_values, values_length, ids[i]);
        if (NULL != doorbell)
        {
            woken += ring_fenced(doorbell);
        }
    }
    return woken;
}

int32_t fulmar_log_ring_readers(char *metadata, char *counters_values, int64_t values_length)
{
    char *table = metadata + FULMAR_LOG_READERS_OFFSET;
    /* Orders the append before the loads of the table and of the waiter
     * counts (pairs with the fence in prepare()). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int32_t count = fa_load_i32(table + FULMAR_LOG_READERS_COUNT_OFFSET);
    if (count > FULMAR_LOG_READERS_CAPACITY)
    {
        count = FULMAR_LOG_READERS_CAPACITY;
    }
    const int32_t *ids = (const int32_t *)(table + FULMAR_LOG_READERS_IDS_OFFSET);
    for (int32_t i = 0; i < count; i++)
    {
        char *doorbell = doorbell_of(counters_values, values_length, fa_load_i32(ids + i));
        if (NULL != doorbell)
        {
            ring_fenced(doorbell);
        }
    }
    return fa_load_i32(table + FULMAR_LOG_READERS_RELAY_OFFSET);
}

static inline int32_t *watcher_slots(char *counters_values, int64_t values_length, int32_t counter_id)
{
    if (counter_id < 0 || ((int64_t)counter_id + 1) * FULMAR_COUNTER_LENGTH > values_length)
    {
        return NULL;
    }
    return (int32_t *)(counters_values + (int64_t)counter_id * FULMAR_COUNTER_LENGTH + FULMAR_COUNTER_WATCHERS_OFFSET);
}

int32_t fulmar_counter_watch(char *counters_values, int64_t values_length, int32_t counter_id, int32_t doorbell_id)
{
    int32_t *slots = watcher_slots(counters_values, values_length, counter_id);
    if (NULL == slots || doorbell_id < 0)
    {
        return -1;
    }
    for (int32_t i = 0; i < FULMAR_COUNTER_WATCHERS_CAPACITY; i++)
    {
        if (fa_load_i32(slots + i) == doorbell_id + 1)
        {
            return 0;
        }
    }
    for (int32_t i = 0; i < FULMAR_COUNTER_WATCHERS_CAPACITY; i++)
    {
        if (fa_cas_i32(slots + i, 0, doorbell_id + 1))
        {
            return 0;
        }
    }
    return -1;
}

int32_t fulmar_counter_unwatch(char *counters_values, int64_t values_length, int32_t counter_id, int32_t doorbell_id)
{
    int32_t *slots = watcher_slots(counters_values, values_length, counter_id);
    int32_t removed = 0;
    if (NULL == slots)
    {
        return 0;
    }
    for (int32_t i = 0; i < FULMAR_COUNTER_WATCHERS_CAPACITY; i++)
    {
        if (fa_cas_i32(slots + i, doorbell_id + 1, 0))
        {
            removed++;
        }
    }
    return removed;
}

int32_t fulmar_counter_ring_watchers(char *counters_values, int64_t values_length, int32_t counter_id)
{
    int32_t *slots = watcher_slots(counters_values, values_length, counter_id);
    int32_t woken = 0;
    if (NULL == slots)
    {
        return 0;
    }
    /* Orders the counter's new value before the loads (pairs with prepare()). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (int32_t i = 0; i < FULMAR_COUNTER_WATCHERS_CAPACITY; i++)
    {
        int32_t slot = fa_load_i32(slots + i);
        if (slot > 0)
        {
            char *doorbell = doorbell_of(counters_values, values_length, slot - 1);
            if (NULL != doorbell)
            {
                woken += ring_fenced(doorbell);
            }
        }
    }
    return woken;
}

int64_t fulmar_doorbell_offset(int32_t counter_id, int64_t values_length)
{
    const int64_t offset = (int64_t)counter_id * FULMAR_COUNTER_LENGTH;
    return counter_id < 0 || offset + FULMAR_COUNTER_LENGTH > values_length ? -1 : offset;
}

int fulmar_doorbell_thread_start(pthread_t *thread, pthread_mutex_t *lock, void *(*run)(void *), void *argument)
{
    int error = pthread_mutex_init(lock, NULL);
    if (0 != error)
    {
        return error;
    }
    if (0 != (error = pthread_create(thread, NULL, run, argument)))
    {
        pthread_mutex_destroy(lock);
    }
    return error;
}

void fulmar_doorbell_thread_stop(
    pthread_t thread, pthread_mutex_t *lock, int32_t *stop, char *values, int64_t doorbell_offset)
{
    pthread_mutex_lock(lock);
    *stop = 1;
    pthread_mutex_unlock(lock);
    fulmar_doorbell_ring(values, doorbell_offset);
    pthread_join(thread, NULL);
    pthread_mutex_destroy(lock);
}

/* One look under the lock; rings the agent when the step asked for it. */
static int32_t loop_look(const fulmar_doorbell_loop_t *loop, int32_t *stop, fulmar_doorbell_step_t *step)
{
    *step = (fulmar_doorbell_step_t){0};
    pthread_mutex_lock(loop->lock);
    *stop = *loop->stop;
    const int32_t work = *stop ? 0 : loop->step(loop->owner, step);
    pthread_mutex_unlock(loop->lock);
    if (step->ring_agent)
    {
        fulmar_doorbell_ring(loop->values, loop->agent_doorbell_offset);
    }
    return work;
}

static void *loop_run(void *argument)
{
    const fulmar_doorbell_loop_t *loop = argument;
    char *values = loop->values;
    for (;;)
    {
        int32_t stop;
        fulmar_doorbell_step_t step;
        if (loop_look(loop, &stop, &step) > 0)
        {
            continue;  /* more may have landed meanwhile */
        }
        if (stop)
        {
            break;
        }
        /* Register as a sleeper, then look once more: a ring after the
         * registration wakes the wait below at once, so none is lost between
         * the look and the sleep. */
        const int32_t token = fulmar_doorbell_prepare(values, loop->doorbell_offset);
        const int32_t again = loop_look(loop, &stop, &step) > 0;
        if (again || stop)
        {
            fulmar_doorbell_cancel(values, loop->doorbell_offset);
            if (stop)
            {
                break;
            }
            continue;
        }
        if (step.relay)
        {
            /* Not armed: whatever landed is the agent's to read.  The ring is
             * passed on after the registration above, so one that came while
             * this thread was awake (it can tell no ring from its timeout
             * then) reaches the agent too; at worst the agent wakes for
             * nothing once per wait. */
            pthread_mutex_lock(loop->lock);
            (*loop->relayed)++;
            pthread_mutex_unlock(loop->lock);
            fulmar_doorbell_ring(values, loop->agent_doorbell_offset);
        }
        fulmar_doorbell_wait_without_gil(values, loop->doorbell_offset, token, step.wait_ns);
    }
    return NULL;
}

int fulmar_doorbell_loop_start(pthread_t *thread, const fulmar_doorbell_loop_t *loop)
{
    /* the thread only reads *loop; the cast is pthread_create's void * */
    return fulmar_doorbell_thread_start(thread, loop->lock, loop_run, (void *)loop);
}
