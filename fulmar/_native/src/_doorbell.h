/* For native threads that never hold the GIL (the archive's recorder, the
 * consensus module's threads): the doorbell wait itself, without
 * fulmar_doorbell_wait's release of the GIL, and the start and stop such a
 * thread shares with the others (a thread doorbell to sleep on, an agent's
 * doorbell to ring, a lock over what the agent hands it), and the loop the
 * consensus threads share (each of them only a step function). */
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

/* The skeleton of the consensus module's threads: each is a step function
 * and its state; this runs the step whenever the thread's doorbell rings (or
 * its wait times out), under the lock the agent takes to hand the thread
 * work, until the stop flag is set.  What one step reports: */
typedef struct
{
    int32_t ring_agent;                      /* ring the agent (after the lock is released) */
    int32_t relay;                           /* when it sleeps, pass each ring on to the agent */
    int64_t wait_ns;                         /* the sleep when the step found nothing */
} fulmar_doorbell_step_t;

typedef struct
{
    void *owner;                             /* the thread's state, given to step */
    pthread_mutex_t *lock;                   /* the owner's: held for each step */
    const int32_t *stop;                     /* the owner's: read under the lock */
    char *values;
    int64_t doorbell_offset;                 /* the thread sleeps on this one */
    int64_t agent_doorbell_offset;
    int64_t *relayed;                        /* rings passed on, counted under the lock */
    /* With the lock held and no stop asked: one look, the work done (> 0
     * looks again at once).  *step arrives zeroed. */
    int32_t (*step)(void *owner, fulmar_doorbell_step_t *step);
} fulmar_doorbell_loop_t;

/* The step report of a thread an agent arms and halts, whose stream's
 * doorbell is the thread's own (the leader's commit and ingress threads):
 * while armed (running) it works whenever rung; when its work turns it from
 * running to not, it rings the agent; while not armed it passes each ring on
 * to the agent, which reads the stream itself. */
static inline void fulmar_doorbell_armed_step(
    fulmar_doorbell_step_t *step, int32_t was_running, int32_t running, int64_t running_wait_ns,
    int64_t relay_wait_ns)
{
    step->ring_agent = was_running && !running;
    step->relay = !running;
    step->wait_ns = running ? running_wait_ns : relay_wait_ns;  /* armed, the sleep only bounds a lost ring */
}

/* Makes *loop->lock and starts a thread running the loop: 0, or the error
 * (with nothing left made).  *loop must outlive the thread (it sits in the
 * owner's state). */
int fulmar_doorbell_loop_start(pthread_t *thread, const fulmar_doorbell_loop_t *loop);

#endif
