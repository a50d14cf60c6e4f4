/* A follower consensus module's AppendPosition thread; see append_position.h
 * for what it does and what it leaves to the agent. */
#define _GNU_SOURCE
#include "_common.h"
#include "_doorbell.h"
#include "counters.h"
#include "doorbell.h"
#include "term.h"
#include "member_auth.h"
#include "append_position.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* Where Aeron keeps a counter's registration id in its value record. */
#define REGISTRATION_ID_OFFSET 8
/* The thread's sleep when nothing is pending: it is woken by its doorbell
 * for everything it does; the timeout only bounds a lost ring. */
#define IDLE_WAIT_NS (100 * 1000 * 1000LL)

struct fulmar_append_position_sender_stct
{
    pthread_t thread;
    pthread_mutex_t lock;
    fulmar_doorbell_loop_t loop;     /* what the thread runs: step below */
    char *values;
    int64_t values_length;
    int64_t doorbell_offset;
    int64_t agent_doorbell_offset;
    int64_t retry_wait_ns;
    int32_t stop;
    int32_t send_now;                /* a heartbeat asked for */
    int64_t send_now_since_ns;       /* unless one was sent at or after this time */
    int32_t refused_pending;         /* the last offer was refused: try again after retry_wait_ns */
    fulmar_append_position_arm_t arm;
    fulmar_append_position_state_t state;
};

static int64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* With the lock held: one AppendPosition if rec-pos passed what was sent or
 * a heartbeat is due.  Returns 1 when it sent; sets *need_agent when the
 * sender cannot go on alone. */
static int32_t report(fulmar_append_position_sender_t *sender, int32_t *need_agent)
{
    if (FULMAR_APPEND_POSITION_RUNNING != sender->state.status)
    {
        return 0;
    }
    fulmar_append_position_arm_t *arm = &sender->arm;
    const char *record = sender->values + (int64_t)arm->recording_position_id * FULMAR_COUNTER_LENGTH;
    const int64_t position = fa_load_i64(record);
    /* Read after the value: a counter freed and reused between the two reads
     * shows a new registration id, and its value is not used. */
    if (fa_load_i64(record + REGISTRATION_ID_OFFSET) != arm->recording_position_registration_id)
    {
        sender->state.status = FULMAR_APPEND_POSITION_NEEDS_AGENT;
        *need_agent = 1;
        return 0;
    }
    if (sender->send_now && sender->state.sent_time_ns >= sender->send_now_since_ns)
    {
        sender->send_now = 0;  /* sent since it was asked for: that was the heartbeat */
    }
    if (position <= sender->state.sent_position && !sender->send_now)
    {
        return 0;
    }
    memcpy(arm->message + arm->position_offset, &position, sizeof(position));
    int32_t length = arm->message_length;
    if (NULL != arm->auth)
    {
        /* A fresh counter for each offer: the leader takes each counter once. */
        length = fulmar_member_auth_sign(
            arm->auth, arm->message, arm->message_length, arm->leader_member_id, fulmar_member_auth_now_ms());
    }
    int64_t result = fulmar_concurrent_offer(&arm->writer, arm->message, length, 0);
    if (FULMAR_ADMIN_ACTION == result)
    {
        /* The term rotated under this offer (nothing was appended, so the
         * same signed bytes go): the next takes the new term. */
        result = fulmar_concurrent_offer(&arm->writer, arm->message, length, 0);
    }
    if (result > 0)
    {
        sender->state.sent_position = position;
        sender->state.sent_time_ns = monotonic_ns();
        sender->state.sent++;
        sender->state.last_failure = 0;
        sender->send_now = 0;
        sender->refused_pending = 0;
        return 1;
    }
    sender->state.refused++;
    sender->state.last_failure = (int32_t)result;
    if (FULMAR_CLOSED == result || FULMAR_MAX_POSITION_EXCEEDED == result || result <= FULMAR_MESSAGE_TOO_LONG)
    {
        sender->state.status = FULMAR_APPEND_POSITION_NEEDS_AGENT;
        *need_agent = 1;
    }
    else
    {
        sender->refused_pending = 1;
    }
    return 0;
}

/* One step of the thread (with the lock held): a refused offer is tried
 * again after retry_wait_ns, else the sleep only bounds a lost ring. */
static int32_t step(void *argument, fulmar_doorbell_step_t *out)
{
    fulmar_append_position_sender_t *sender = argument;
    const int32_t work = report(sender, &out->ring_agent);
    out->wait_ns = sender->refused_pending ? sender->retry_wait_ns : IDLE_WAIT_NS;
    return work;
}

fulmar_append_position_sender_t *fulmar_append_position_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id,
    int64_t retry_wait_ns)
{
    const int64_t doorbell_offset = fulmar_doorbell_offset(doorbell_id, values_length);
    const int64_t agent_doorbell_offset = fulmar_doorbell_offset(agent_doorbell_id, values_length);
    if (doorbell_offset < 0 || agent_doorbell_offset < 0 || retry_wait_ns <= 0)
    {
        errno = EINVAL;
        return NULL;
    }
    fulmar_append_position_sender_t *sender = calloc(1, sizeof(*sender));
    if (NULL == sender)
    {
        return NULL;
    }
    sender->values = counters_values;
    sender->values_length = values_length;
    sender->doorbell_offset = doorbell_offset;
    sender->agent_doorbell_offset = agent_doorbell_offset;
    sender->retry_wait_ns = retry_wait_ns;
    sender->state.status = FULMAR_APPEND_POSITION_IDLE;
    sender->loop = (fulmar_doorbell_loop_t){
        .owner = sender,
        .lock = &sender->lock,
        .stop = &sender->stop,
        .values = sender->values,
        .doorbell_offset = sender->doorbell_offset,
        .agent_doorbell_offset = sender->agent_doorbell_offset,
        .step = step,  /* never relays: no rings for the agent to take */
    };
    const int error = fulmar_doorbell_loop_start(&sender->thread, &sender->loop);
    if (0 != error)
    {
        free(sender);
        errno = error;
        return NULL;
    }
    return sender;
}

void fulmar_append_position_stop(fulmar_append_position_sender_t *sender)
{
    if (NULL == sender)
    {
        return;
    }
    fulmar_doorbell_thread_stop(sender->thread, &sender->lock, &sender->stop, sender->values, sender->doorbell_offset);
    free(sender);
}

int32_t fulmar_append_position_arm(fulmar_append_position_sender_t *sender, const fulmar_append_position_arm_t *arm)
{
    const int64_t counters = sender->values_length / FULMAR_COUNTER_LENGTH;
    const int32_t trailer_length = NULL != arm->auth ? FULMAR_MEMBER_AUTH_TRAILER_LENGTH : 0;
    if (arm->message_length <= 0 || arm->message_length + trailer_length > FULMAR_APPEND_POSITION_MESSAGE_CAPACITY ||
        arm->position_offset < 0 || arm->position_offset + (int32_t)sizeof(int64_t) > arm->message_length ||
        arm->recording_position_id < 0 || arm->recording_position_id >= counters || NULL == arm->writer.log)
    {
        return -1;
    }
    pthread_mutex_lock(&sender->lock);
    sender->arm = *arm;
    /* Its appends ring the driver at once: nobody rings deferred rings for it. */
    sender->arm.writer.defer_rings = 0;
    sender->arm.writer.rings_pending = 0;
    sender->state.status = FULMAR_APPEND_POSITION_RUNNING;
    sender->state.last_failure = 0;
    sender->state.sent_position = arm->sent_position;
    sender->state.sent_time_ns = arm->sent_time_ns;
    sender->send_now = 0;
    sender->refused_pending = 0;
    pthread_mutex_unlock(&sender->lock);
    /* The archive may have recorded more already: the thread looks at once. */
    fulmar_doorbell_ring(sender->values, sender->doorbell_offset);
    return 0;
}

void fulmar_append_position_halt(fulmar_append_position_sender_t *sender)
{
    pthread_mutex_lock(&sender->lock);
    sender->state.status = FULMAR_APPEND_POSITION_IDLE;
    sender->send_now = 0;
    sender->refused_pending = 0;
    pthread_mutex_unlock(&sender->lock);
}

int32_t fulmar_append_position_send_now(fulmar_append_position_sender_t *sender, int64_t since_ns)
{
    pthread_mutex_lock(&sender->lock);
    const int32_t running = FULMAR_APPEND_POSITION_RUNNING == sender->state.status;
    if (running)
    {
        sender->send_now = 1;
        sender->send_now_since_ns = since_ns;
    }
    pthread_mutex_unlock(&sender->lock);
    if (!running)
    {
        return -1;
    }
    fulmar_doorbell_ring(sender->values, sender->doorbell_offset);
    return 0;
}

void fulmar_append_position_state(fulmar_append_position_sender_t *sender, fulmar_append_position_state_t *state)
{
    pthread_mutex_lock(&sender->lock);
    *state = sender->state;
    pthread_mutex_unlock(&sender->lock);
}

int32_t fulmar_append_position_status(fulmar_append_position_sender_t *sender)
{
    pthread_mutex_lock(&sender->lock);
    const int32_t status = sender->state.status;
    pthread_mutex_unlock(&sender->lock);
    return status;
}
