/* A leader consensus module's ingress thread; see leader_ingress.h for what
 * it does and what it leaves to the agent. */
#define _GNU_SOURCE
#include "_common.h"
#include "_doorbell.h"
#include "counters.h"
#include "doorbell.h"
#include "term.h"
#include "leader_ingress.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* An SBE message header: blockLength, templateId, schemaId, version (u16 each). */
#define SBE_BLOCK_LENGTH_OFFSET 0
#define SBE_TEMPLATE_ID_OFFSET 2
#define SBE_SCHEMA_ID_OFFSET 4
#define SBE_HEADER_LENGTH 8
/* Woken by its doorbell for everything it does; the timeout only bounds a lost ring. */
#define IDLE_WAIT_NS (100 * 1000 * 1000LL)
/* Not armed, it only passes rings on: a long sleep (see fulmar_doorbell_armed_step). */
#define RELAY_WAIT_NS (10 * 1000 * 1000 * 1000LL)

struct fulmar_leader_ingress_stct
{
    pthread_t thread;
    pthread_mutex_t lock;
    fulmar_doorbell_loop_t loop;             /* what the thread runs: step below */
    char *values;
    int64_t values_length;
    int64_t doorbell_offset;
    int64_t agent_doorbell_offset;
    int32_t stop;
    fulmar_leader_ingress_arm_t arm;
    fulmar_leader_ingress_state_t state;
    /* Copies of what the arming handed over, grown as needed. */
    fulmar_leader_ingress_image_t *images;
    int64_t *image_positions;
    int32_t image_capacity;
    int64_t *session_ids;
    int64_t *activity_ns;
    int32_t session_capacity;
    /* One message with its new timestamp, on its way to the log. */
    char *message;
    int32_t message_capacity;
};

static int64_t clock_ns(clockid_t clock)
{
    struct timespec now;
    clock_gettime(clock, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static void needs_agent(fulmar_leader_ingress_t *thread, int32_t reason)
{
    thread->state.status = FULMAR_LEADER_INGRESS_NEEDS_AGENT;
    thread->state.reason = reason;
}

/* The armed session's index, or -1 for a session that is not open. */
static int32_t find_session(const fulmar_leader_ingress_t *thread, int64_t session_id)
{
    int32_t low = 0, high = thread->state.session_count - 1;
    while (low <= high)
    {
        const int32_t middle = low + (high - low) / 2;
        const int64_t id = thread->session_ids[middle];
        if (id == session_id)
        {
            return middle;
        }
        if (id < session_id)
        {
            low = middle + 1;
        }
        else
        {
            high = middle - 1;
        }
    }
    return -1;
}

static void count_invalid(fulmar_leader_ingress_t *thread)
{
    thread->state.invalid++;
    fa_get_and_add_i64(thread->values + (int64_t)thread->arm.invalid_requests_id * FULMAR_COUNTER_LENGTH, 1);
}

/* Appends a session message with the cluster time in it; 1 when appended,
 * 0 when the log refused it (the thread is then NEEDS_AGENT). */
static int32_t append(fulmar_leader_ingress_t *thread, const char *message, int32_t length, int64_t timestamp)
{
    const fulmar_leader_ingress_arm_t *arm = &thread->arm;
    memcpy(thread->message, message, (size_t)length);
    memcpy(thread->message + arm->timestamp_offset, &timestamp, sizeof(timestamp));
    int64_t result = fulmar_exclusive_offer(arm->log_writer, thread->message, length, 0);
    if (FULMAR_ADMIN_ACTION == result)
    {
        /* The term rotated under this append: the next takes the new term. */
        result = fulmar_exclusive_offer(arm->log_writer, thread->message, length, 0);
    }
    if (result > 0)
    {
        return 1;
    }
    thread->state.refused++;
    thread->state.last_failure = (int32_t)result;
    needs_agent(
        thread,
        FULMAR_BACK_PRESSURED == result || FULMAR_NOT_CONNECTED == result || FULMAR_ADMIN_ACTION == result
            ? FULMAR_LEADER_INGRESS_BACK_PRESSURE
            : FULMAR_LEADER_INGRESS_PUBLICATION);
    return 0;
}

/* One whole message: 1 when taken (appended, noted or counted invalid), 0
 * when it stays for the agent (the thread is then NEEDS_AGENT). */
static int32_t on_message(
    fulmar_leader_ingress_t *thread, const char *message, int32_t length, int64_t now_ns, int64_t timestamp)
{
    const fulmar_leader_ingress_arm_t *arm = &thread->arm;
    if (length < SBE_HEADER_LENGTH || fa_read_u16(message + SBE_SCHEMA_ID_OFFSET) != (uint16_t)arm->schema_id)
    {
        needs_agent(thread, FULMAR_LEADER_INGRESS_OTHER_MESSAGE);
        return 0;
    }
    const uint16_t template_id = fa_read_u16(message + SBE_TEMPLATE_ID_OFFSET);
    const uint16_t block_length = fa_read_u16(message + SBE_BLOCK_LENGTH_OFFSET);
    const int32_t is_session_message = template_id == (uint16_t)arm->session_message_template_id &&
        block_length == (uint16_t)arm->session_message_block_length && length >= arm->session_header_length &&
        length <= thread->message_capacity;
    const int32_t is_keep_alive = template_id == (uint16_t)arm->keep_alive_template_id &&
        block_length == (uint16_t)arm->keep_alive_block_length && length >= arm->keep_alive_length;
    if (!is_session_message && !is_keep_alive)
    {
        needs_agent(thread, FULMAR_LEADER_INGRESS_OTHER_MESSAGE);
        return 0;
    }
    const int64_t term_id = fa_read_i64(message + arm->leadership_term_id_offset);
    const int32_t session = find_session(thread, fa_read_i64(message + arm->cluster_session_id_offset));
    if (is_keep_alive)
    {
        if (session < 0)
        {
            /* A session not open may be closing: the agent knows which. */
            needs_agent(thread, FULMAR_LEADER_INGRESS_OTHER_MESSAGE);
            return 0;
        }
        if (term_id != arm->leadership_term_id)
        {
            count_invalid(thread);
            return 1;
        }
        thread->activity_ns[session] = now_ns;
        thread->state.keep_alives++;
        return 1;
    }
    if (session < 0 || term_id != arm->leadership_term_id)
    {
        count_invalid(thread);
        return 1;
    }
    if (!append(thread, message, length, timestamp))
    {
        return 0;
    }
    thread->activity_ns[session] = now_ns;
    thread->state.messages++;
    return 1;
}

/* The frame at position in an image's log. */
static const char *frame_at(const fulmar_leader_ingress_image_t *image, int64_t position)
{
    const int32_t term_length = image->term_length;
    const int32_t term_offset = (int32_t)(position & (term_length - 1));
    return image->log + (position >> __builtin_ctz((unsigned)term_length)) % FULMAR_PARTITION_COUNT * term_length +
        term_offset;
}

/* With the lock held: takes image i's messages from where it was left.
 * Returns the messages taken; stops (NEEDS_AGENT) before one it cannot take. */
static int32_t walk_image(fulmar_leader_ingress_t *thread, int32_t i, int64_t now_ns, int64_t timestamp)
{
    const fulmar_leader_ingress_image_t *image = &thread->images[i];
    const int32_t term_length = image->term_length;
    const int64_t start = thread->image_positions[i];
    int64_t position = start;
    int32_t taken = 0;
    for (;;)
    {
        const int32_t term_offset = (int32_t)(position & (term_length - 1));
        const char *frame = frame_at(image, position);
        const int32_t frame_length = fa_load_i32(frame);
        if (frame_length <= 0)
        {
            break;  /* nothing here yet */
        }
        const int16_t type = fa_read_i16(frame + 6);
        if (frame_length < FULMAR_HEADER_LENGTH || frame_length > term_length - term_offset ||
            (FULMAR_FRAME_TYPE_DATA != type && FULMAR_FRAME_TYPE_PAD != type))
        {
            needs_agent(thread, FULMAR_LEADER_INGRESS_BAD_FRAME);
            break;
        }
        if (FULMAR_FRAME_TYPE_DATA == type)
        {
            if ((uint8_t)frame[5] != FULMAR_FLAG_UNFRAGMENTED)
            {
                needs_agent(thread, FULMAR_LEADER_INGRESS_OTHER_MESSAGE);
                break;  /* a fragment: the agent's assembler takes it */
            }
            if (!on_message(thread, frame + FULMAR_HEADER_LENGTH, frame_length - FULMAR_HEADER_LENGTH, now_ns, timestamp))
            {
                break;  /* left for the agent, unread */
            }
            taken++;
        }
        position += FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
    }
    if (position != start)
    {
        thread->image_positions[i] = position;
        fa_store_i64(thread->values + (int64_t)image->subscriber_position_id * FULMAR_COUNTER_LENGTH, position);
    }
    return taken;
}

/* With the lock held: every image once.  Returns the messages taken. */
static int32_t ingress_work(fulmar_leader_ingress_t *thread)
{
    if (FULMAR_LEADER_INGRESS_RUNNING != thread->state.status)
    {
        return 0;
    }
    const int64_t now_ns = clock_ns(CLOCK_MONOTONIC);
    /* The cluster clock: milliseconds since the epoch, as the agent's. */
    const int64_t timestamp = clock_ns(CLOCK_REALTIME) / 1000000LL;
    const int64_t appended_before = thread->state.messages;
    int32_t work = 0;
    for (int32_t i = 0; i < thread->state.image_count && FULMAR_LEADER_INGRESS_RUNNING == thread->state.status; i++)
    {
        work += walk_image(thread, i, now_ns, timestamp);
    }
    if (thread->state.messages != appended_before)
    {
        /* The agent defers the log's rings to its cycle's end; this thread
         * rings once for its walk. */
        fulmar_log_writer_ring(thread->arm.log_writer);
    }
    return work;
}

static int32_t is_running(void *argument)
{
    return FULMAR_LEADER_INGRESS_RUNNING == ((fulmar_leader_ingress_t *)argument)->state.status;
}

/* One step of the thread (with the lock held). */
static int32_t step(void *argument, fulmar_doorbell_step_t *out)
{
    fulmar_leader_ingress_t *thread = argument;
    const int32_t was_running = is_running(thread);
    const int32_t work = ingress_work(thread);
    fulmar_doorbell_armed_step(out, was_running, is_running(thread), IDLE_WAIT_NS, RELAY_WAIT_NS);
    return work;
}

fulmar_leader_ingress_t *fulmar_leader_ingress_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id)
{
    const int64_t doorbell_offset = fulmar_doorbell_offset(doorbell_id, values_length);
    const int64_t agent_doorbell_offset = fulmar_doorbell_offset(agent_doorbell_id, values_length);
    if (doorbell_offset < 0 || agent_doorbell_offset < 0)
    {
        errno = EINVAL;
        return NULL;
    }
    fulmar_leader_ingress_t *thread = calloc(1, sizeof(*thread));
    if (NULL == thread)
    {
        return NULL;
    }
    thread->values = counters_values;
    thread->values_length = values_length;
    thread->doorbell_offset = doorbell_offset;
    thread->agent_doorbell_offset = agent_doorbell_offset;
    thread->state.status = FULMAR_LEADER_INGRESS_IDLE;
    thread->loop = (fulmar_doorbell_loop_t){
        .owner = thread,
        .lock = &thread->lock,
        .stop = &thread->stop,
        .values = thread->values,
        .doorbell_offset = thread->doorbell_offset,
        .agent_doorbell_offset = thread->agent_doorbell_offset,
        .relayed = &thread->state.relayed,
        .step = step,
    };
    const int error = fulmar_doorbell_loop_start(&thread->thread, &thread->loop);
    if (0 != error)
    {
        free(thread);
        errno = error;
        return NULL;
    }
    return thread;
}

void fulmar_leader_ingress_stop(fulmar_leader_ingress_t *thread)
{
    if (NULL == thread)
    {
        return;
    }
    fulmar_leader_ingress_halt(thread, NULL, NULL, 0, NULL, 0);
    fulmar_doorbell_thread_stop(thread->thread, &thread->lock, &thread->stop, thread->values, thread->doorbell_offset);
    free(thread->images);
    free(thread->image_positions);
    free(thread->session_ids);
    free(thread->activity_ns);
    free(thread->message);
    free(thread);
}

static int32_t fits(int32_t offset, int32_t width, int32_t length)
{
    return offset >= 0 && offset + width <= length;
}

/* Grows *array to hold count items of size bytes. */
static int32_t reserve(void **array, int32_t count, size_t size)
{
    void *grown = realloc(*array, (size_t)(count > 0 ? count : 1) * size);
    if (NULL == grown)
    {
        return -1;
    }
    *array = grown;
    return 0;
}

/* With the lock held: room for the copies of an arming. */
static int32_t reserve_copies(fulmar_leader_ingress_t *thread, int32_t image_count, int32_t session_count, int32_t max_message)
{
    if (image_count > thread->image_capacity)
    {
        if (reserve((void **)&thread->images, image_count, sizeof(*thread->images)) < 0 ||
            reserve((void **)&thread->image_positions, image_count, sizeof(int64_t)) < 0)
        {
            return -1;
        }
        thread->image_capacity = image_count;
    }
    if (session_count > thread->session_capacity)
    {
        if (reserve((void **)&thread->session_ids, session_count, sizeof(int64_t)) < 0 ||
            reserve((void **)&thread->activity_ns, session_count, sizeof(int64_t)) < 0)
        {
            return -1;
        }
        thread->session_capacity = session_count;
    }
    if (max_message > thread->message_capacity)
    {
        if (reserve((void **)&thread->message, max_message, 1) < 0)
        {
            return -1;
        }
        thread->message_capacity = max_message;
    }
    return 0;
}

int32_t fulmar_leader_ingress_arm(
    fulmar_leader_ingress_t *thread, const fulmar_leader_ingress_arm_t *arm,
    const fulmar_leader_ingress_image_t *images, int32_t image_count,
    const int64_t *session_ids, int32_t session_count)
{
    const int64_t counters = thread->values_length / FULMAR_COUNTER_LENGTH;
    const int32_t header = arm->session_header_length;
    if (NULL == arm->log_writer || NULL == arm->log_writer->log || image_count < 0 || session_count < 0 ||
        arm->invalid_requests_id < 0 || arm->invalid_requests_id >= counters || header < SBE_HEADER_LENGTH ||
        !fits(arm->leadership_term_id_offset, 8, header) || !fits(arm->cluster_session_id_offset, 8, header) ||
        !fits(arm->timestamp_offset, 8, header) || arm->keep_alive_length < SBE_HEADER_LENGTH ||
        !fits(arm->leadership_term_id_offset, 8, arm->keep_alive_length) ||
        !fits(arm->cluster_session_id_offset, 8, arm->keep_alive_length))
    {
        return -1;
    }
    for (int32_t i = 0; i < image_count; i++)
    {
        const fulmar_leader_ingress_image_t *image = &images[i];
        if (NULL == image->log || image->term_length <= 0 || (image->term_length & (image->term_length - 1)) ||
            image->subscriber_position_id < 0 || image->subscriber_position_id >= counters ||
            image->position < 0 || (image->position & (FULMAR_FRAME_ALIGNMENT - 1)))
        {
            return -1;
        }
    }
    for (int32_t i = 1; i < session_count; i++)
    {
        if (session_ids[i - 1] >= session_ids[i])
        {
            return -1;
        }
    }
    pthread_mutex_lock(&thread->lock);
    if (reserve_copies(thread, image_count, session_count, arm->log_writer->max_message_length) < 0)
    {
        pthread_mutex_unlock(&thread->lock);
        return -1;
    }
    thread->arm = *arm;
    fulmar_leader_ingress_state_t *state = &thread->state;
    memcpy(thread->images, images, sizeof(*images) * (size_t)image_count);
    for (int32_t i = 0; i < image_count; i++)
    {
        thread->image_positions[i] = images[i].position;
    }
    memcpy(thread->session_ids, session_ids, sizeof(int64_t) * (size_t)session_count);
    memset(thread->activity_ns, 0, sizeof(int64_t) * (size_t)session_count);
    state->status = FULMAR_LEADER_INGRESS_RUNNING;
    state->reason = 0;
    state->last_failure = 0;
    state->image_count = image_count;
    state->session_count = session_count;
    state->armings++;
    int32_t waiting = 0;
    for (int32_t i = 0; i < image_count && !waiting; i++)
    {
        waiting = fa_load_i32(frame_at(&thread->images[i], thread->image_positions[i])) != 0;
    }
    pthread_mutex_unlock(&thread->lock);
    if (waiting)
    {
        /* Landed while the agent was awake (its ring went to the agent): the
         * thread looks at once.  What lands from now on rings the thread. */
        fulmar_doorbell_ring(thread->values, thread->doorbell_offset);
    }
    return 0;
}

void fulmar_leader_ingress_halt(
    fulmar_leader_ingress_t *thread, fulmar_leader_ingress_state_t *state,
    int64_t *image_positions, int32_t image_capacity, int64_t *activity_ns, int32_t session_capacity)
{
    pthread_mutex_lock(&thread->lock);
    if (FULMAR_LEADER_INGRESS_IDLE != thread->state.status)
    {
        const int32_t images = thread->state.image_count < image_capacity ? thread->state.image_count : image_capacity;
        if (NULL != image_positions && images > 0)
        {
            memcpy(image_positions, thread->image_positions, sizeof(int64_t) * (size_t)images);
        }
        const int32_t sessions =
            thread->state.session_count < session_capacity ? thread->state.session_count : session_capacity;
        if (NULL != activity_ns && sessions > 0)
        {
            memcpy(activity_ns, thread->activity_ns, sizeof(int64_t) * (size_t)sessions);
        }
    }
    if (NULL != state)
    {
        *state = thread->state;  /* the status it had: RUNNING, or NEEDS_AGENT and why */
    }
    thread->state.status = FULMAR_LEADER_INGRESS_IDLE;
    pthread_mutex_unlock(&thread->lock);
}

void fulmar_leader_ingress_state(fulmar_leader_ingress_t *thread, fulmar_leader_ingress_state_t *state)
{
    pthread_mutex_lock(&thread->lock);
    *state = thread->state;
    pthread_mutex_unlock(&thread->lock);
}

int32_t fulmar_leader_ingress_status(fulmar_leader_ingress_t *thread)
{
    pthread_mutex_lock(&thread->lock);
    const int32_t status = thread->state.status;
    pthread_mutex_unlock(&thread->lock);
    return status;
}
