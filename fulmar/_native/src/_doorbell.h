/* For native threads that never hold the GIL (the archive's recorder, the
 * consensus module's AppendPosition thread): the doorbell wait itself,
 * without fulmar_doorbell_wait's release of the GIL, and the start and stop
 * such a thread shares with the others (a thread doorbell to sleep on, an
 * agent's doorbell to ring, a lock over what the agent hands it), and the
 * loop of the threads that relay rings while not armed. */
#ifndef FULMAR_DOORBELL_PRIVATE_H
#define FULMAR_DOORBELL_PRIVATE_H

#include <pthread.h>
#include <stdint.h>

int32_t fulmar_doorbell_wait_without_gil(char *base, int64_t offset, int32_t token, int64_t timeout_ns);
/* The offset of counter_id's doorbell in counters values of values_length
 * bytes, or -1 when the id names no counter there. */
int64_t fulmar_doorbell_offset(int32_t counter_id, int64_t values_length);
/* Makes the lock and starts run(argument): 0, or the error (with nothing left made). */
int fulmar_doorbell_thread_start(pthread_t *thread, pthread_mutex_t *lock, void *(*run)(void *), void *argument);
/* Sets *stop under the lock, rings the thread's doorbell, joins the thread
 * and destroys the lock. */
void fulmar_doorbell_thread_stop(
    pthread_t thread, pthread_mutex_t *lock, int32_t *stop, char *values, int64_t doorbell_offset);

/* The loop of a thread an agent arms and halts, whose stream's doorbell is
 * the thread's own (the leader's commit and ingress threads): while armed
 * (running) it works whenever rung; when its work turns it from running to
 * not, it rings the agent; while not armed it passes each ring on to the
 * agent, which reads the stream itself. */
typedef struct
{
    void *thread;
    pthread_mutex_t *lock;
    char *values;
    int64_t doorbell_offset;
    int64_t agent_doorbell_offset;
    const int32_t *stop;                     /* read under the lock */
    int64_t *relayed;                        /* rings passed on, counted under the lock */
    int64_t running_wait_ns;                 /* the sleep armed: only bounds a lost ring */
    int64_t relay_wait_ns;                   /* the sleep not armed */
    /* With the lock held: one look (the work done; > 0 looks again at once),
     * and whether the thread is armed. */
    int32_t (*work)(void *thread);
    int32_t (*is_running)(void *thread);
} fulmar_relay_loop_t;

void fulmar_relay_loop_run(const fulmar_relay_loop_t *loop);

#endif
