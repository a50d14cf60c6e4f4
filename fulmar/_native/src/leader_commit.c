/* A leader consensus module's commit thread; see leader_commit.h for what it
 * does and what it leaves to the agent. */
#define _GNU_SOURCE
#include "_common.h"
#include "_doorbell.h"
#include "counters.h"
#include "doorbell.h"
#include "term.h"
#include "leader_commit.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* Where Aeron keeps a counter's registration id in its value record. */
#define REGISTRATION_ID_OFFSET 8
/* An SBE message header: blockLength, templateId, schemaId, version (u16 each). */
#define SBE_TEMPLATE_ID_OFFSET 2
#define SBE_SCHEMA_ID_OFFSET 4
/* The thread is woken by its doorbell for everything it does; the timeout
 * only bounds a lost ring. */
#define IDLE_WAIT_NS (100 * 1000 * 1000LL)
/* Not armed, it only passes rings on (and each wake-up is passed on, since a
 * ring just after a timeout cannot be told from it): a long sleep, so the
 * agent is not woken for nothing more than once in a while. */
#define RELAY_WAIT_NS (10 * 1000 * 1000 * 1000LL)

struct fulmar_leader_commit_stct
{
    pthread_t thread;
    pthread_mutex_t lock;
    char *values;
    int64_t values_length;
    int32_t doorbell_id;
    int64_t doorbell_offset;
    int64_t agent_doorbell_offset;
    int32_t stop;
    int32_t send_now;                /* a heartbeat asked for */
    int64_t send_now_since_ns;       /* unless one was sent at or after this time */
    int32_t recording_watched;       /* this thread's doorbell is among rec-pos's watchers */
    fulmar_leader_commit_arm_t arm;
    fulmar_leader_commit_state_t state;
};

static int64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static void needs_agent(fulmar_leader_commit_t *thread, int32_t reason)
{
    thread->state.status = FULMAR_LEADER_COMMIT_NEEDS_AGENT;
    thread->state.reason = reason;
}

static void watch_recording(fulmar_leader_commit_t *thread, int32_t wanted)
{
    if (wanted == thread->recording_watched)
    {
        return;
    }
    const int32_t counter_id = thread->arm.recording_position_id;
    if (wanted)
    {
        if (fulmar_counter_watch(thread->values, thread->values_length, counter_id, thread->doorbell_id) < 0)
        {
            return;  /* no free slot: the followers' next report, or the idle timeout, looks again */
        }
    }
    else
    {
        fulmar_counter_unwatch(thread->values, thread->values_length, counter_id, thread->doorbell_id);
    }
    thread->recording_watched = wanted;
}

static int32_t is_append_position(const fulmar_leader_commit_arm_t *arm, const char *message, int32_t length)
{
    return length >= arm->append_position_length &&
        fa_read_u16(message + SBE_TEMPLATE_ID_OFFSET) == (uint16_t)arm->append_position_template_id &&
        fa_read_u16(message + SBE_SCHEMA_ID_OFFSET) == (uint16_t)arm->schema_id;
}

static void on_append_position(fulmar_leader_commit_t *thread, const char *message, int64_t now_ns)
{
    const fulmar_leader_commit_arm_t *arm = &thread->arm;
    thread->state.append_positions++;
    if (fa_read_i64(message + arm->leadership_term_id_offset) != arm->leadership_term_id)
    {
        return;  /* another term's: the agent, as a steady leader, passes it over too */
    }
    const int32_t member_id = fa_read_i32(message + arm->follower_member_id_offset);
    const int64_t position = fa_read_i64(message + arm->log_position_offset);
    for (int32_t i = 0; i < arm->follower_count; i++)
    {
        if (arm->followers[i].member_id == member_id)
        {
            if (position > thread->state.follower_positions[i])
            {
                thread->state.follower_positions[i] = position;
            }
            thread->state.follower_times_ns[i] = now_ns;
            return;
        }
    }
}

/* With the lock held: reads image i's AppendPositions from where it was
 * left.  Returns the messages read; stops (NEEDS_AGENT) before anything else. */
static int32_t walk_image(fulmar_leader_commit_t *thread, int32_t i, int64_t now_ns)
{
    const fulmar_leader_commit_image_t *image = &thread->arm.images[i];
    const int32_t term_length = image->term_length;
    const int32_t bits = __builtin_ctz((unsigned)term_length);
    const int64_t start = thread->state.image_positions[i];
    int64_t position = start;
    int32_t read = 0;
    for (;;)
    {
        const int32_t term_offset = (int32_t)(position & (term_length - 1));
        const char *frame = image->log + (position >> bits) % FULMAR_PARTITION_COUNT * term_length + term_offset;
        const int32_t frame_length = fa_load_i32(frame);
        if (frame_length <= 0)
        {
            break;  /* nothing here yet */
        }
        const int16_t type = fa_read_i16(frame + 6);
        if (frame_length < FULMAR_HEADER_LENGTH || frame_length > term_length - term_offset ||
            (FULMAR_FRAME_TYPE_DATA != type && FULMAR_FRAME_TYPE_PAD != type))
        {
            needs_agent(thread, FULMAR_LEADER_COMMIT_BAD_FRAME);
            break;
        }
        if (FULMAR_FRAME_TYPE_DATA == type)
        {
            const char *message = frame + FULMAR_HEADER_LENGTH;
            if ((uint8_t)frame[5] != FULMAR_FLAG_UNFRAGMENTED ||
                !is_append_position(&thread->arm, message, frame_length - FULMAR_HEADER_LENGTH))
            {
                needs_agent(thread, FULMAR_LEADER_COMMIT_OTHER_MESSAGE);
                break;  /* left for the agent, unread */
            }
            on_append_position(thread, message, now_ns);
            read++;
        }
        position += FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
    }
    if (position != start)
    {
        thread->state.image_positions[i] = position;
        fa_store_i64(thread->values + (int64_t)image->subscriber_position_id * FULMAR_COUNTER_LENGTH, position);
    }
    return read;
}

/* The position a quorum of the members holds: of n positions, the
 * (n / 2 + 1)-th highest (cluster_member.quorum_position). */
static int64_t quorum_position(int64_t *positions, int32_t count)
{
    for (int32_t i = 1; i < count; i++)  /* descending insertion sort: a handful of members */
    {
        const int64_t value = positions[i];
        int32_t j = i;
        while (j > 0 && positions[j - 1] < value)
        {
            positions[j] = positions[j - 1];
            j--;
        }
        positions[j] = value;
    }
    return positions[count / 2];
}

static void send_commit_position(fulmar_leader_commit_t *thread, int64_t now_ns)
{
    fulmar_leader_commit_arm_t *arm = &thread->arm;
    const int64_t position = thread->state.commit_position;
    memcpy(arm->message + arm->position_offset, &position, sizeof(position));
    for (int32_t i = 0; i < arm->follower_count; i++)
    {
        fulmar_log_writer_t *writer = &arm->followers[i].writer;
        int64_t result = fulmar_concurrent_offer(writer, arm->message, arm->message_length, 0);
        if (FULMAR_ADMIN_ACTION == result)
        {
            /* The term rotated under this offer: the next takes the new term. */
            result = fulmar_concurrent_offer(writer, arm->message, arm->message_length, 0);
        }
        if (result > 0)
        {
            thread->state.commit_positions_sent++;
            continue;
        }
        /* Not connected or back pressured: as the agent, the next commit or
         * heartbeat tells this follower. */
        thread->state.refused++;
        thread->state.last_failure = (int32_t)result;
        if (FULMAR_CLOSED == result || FULMAR_MAX_POSITION_EXCEEDED == result || result <= FULMAR_MESSAGE_TOO_LONG)
        {
            needs_agent(thread, FULMAR_LEADER_COMMIT_PUBLICATION);
        }
    }
    thread->state.sent_position = position;
    thread->state.sent_time_ns = now_ns;
    thread->send_now = 0;
}

/* With the lock held: the followers' reports, the commit they allow, and the
 * CommitPositions.  Returns the work done. */
static int32_t commit_work(fulmar_leader_commit_t *thread)
{
    if (FULMAR_LEADER_COMMIT_RUNNING != thread->state.status)
    {
        return 0;
    }
    fulmar_leader_commit_arm_t *arm = &thread->arm;
    const int64_t now_ns = monotonic_ns();
    int32_t work = 0;
    for (int32_t i = 0; i < arm->image_count && FULMAR_LEADER_COMMIT_RUNNING == thread->state.status; i++)
    {
        work += walk_image(thread, i, now_ns);
    }
    const char *record = thread->values + (int64_t)arm->recording_position_id * FULMAR_COUNTER_LENGTH;
    const int64_t recorded = fa_load_i64(record);
    /* Read after the value: a counter freed and reused between the two reads
     * shows a new registration id, and its value is not used. */
    if (fa_load_i64(record + REGISTRATION_ID_OFFSET) != arm->recording_position_registration_id)
    {
        needs_agent(thread, FULMAR_LEADER_COMMIT_RECORDING_GONE);
        return work;
    }
    int64_t positions[FULMAR_LEADER_COMMIT_MAX_FOLLOWERS + 1];
    const int32_t count = arm->follower_count + 1;
    /* How far the followers alone take the commit: past the leader's own
     * recording, only that recording holds it, and a ring of rec-pos is
     * then worth a wake-up (most of the time it is not: the leader's archive
     * records long before a follower's report comes back). */
    positions[0] = INT64_MAX;
    memcpy(positions + 1, thread->state.follower_positions, sizeof(int64_t) * arm->follower_count);
    watch_recording(thread, quorum_position(positions, count) > recorded);
    positions[0] = recorded;
    memcpy(positions + 1, thread->state.follower_positions, sizeof(int64_t) * arm->follower_count);
    int64_t commit = quorum_position(positions, count);
    if (commit > recorded)
    {
        commit = recorded;  /* a member holds on disk what its services apply */
    }
    if (commit > arm->term_base_log_position && commit > thread->state.commit_position)
    {
        thread->state.commit_position = commit;
        thread->state.commits++;
        fa_store_i64(thread->values + (int64_t)arm->commit_position_id * FULMAR_COUNTER_LENGTH, commit);
        fulmar_counter_ring_watchers(thread->values, thread->values_length, arm->commit_position_id);
        work++;
    }
    if (thread->send_now && thread->state.sent_time_ns >= thread->send_now_since_ns)
    {
        thread->send_now = 0;  /* sent since it was asked for: that was the heartbeat */
    }
    if (thread->state.commit_position != thread->state.sent_position || thread->send_now)
    {
        send_commit_position(thread, now_ns);
        work++;
    }
    return work;
}

static int32_t is_running(void *argument)
{
    return FULMAR_LEADER_COMMIT_RUNNING == ((fulmar_leader_commit_t *)argument)->state.status;
}

static int32_t look(void *argument)
{
    return commit_work((fulmar_leader_commit_t *)argument);
}

static void *run(void *argument)
{
    fulmar_leader_commit_t *thread = argument;
    const fulmar_relay_loop_t loop = {
        .thread = thread,
        .lock = &thread->lock,
        .values = thread->values,
        .doorbell_offset = thread->doorbell_offset,
        .agent_doorbell_offset = thread->agent_doorbell_offset,
        .stop = &thread->stop,
        .relayed = &thread->state.relayed,
        .running_wait_ns = IDLE_WAIT_NS,
        .relay_wait_ns = RELAY_WAIT_NS,
        .work = look,
        .is_running = is_running,
    };
    fulmar_relay_loop_run(&loop);
    return NULL;
}

fulmar_leader_commit_t *fulmar_leader_commit_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id)
{
    const int64_t doorbell_offset = fulmar_doorbell_offset(doorbell_id, values_length);
    const int64_t agent_doorbell_offset = fulmar_doorbell_offset(agent_doorbell_id, values_length);
    if (doorbell_offset < 0 || agent_doorbell_offset < 0)
    {
        errno = EINVAL;
        return NULL;
    }
    fulmar_leader_commit_t *thread = calloc(1, sizeof(*thread));
    if (NULL == thread)
    {
        return NULL;
    }
    thread->values = counters_values;
    thread->values_length = values_length;
    thread->doorbell_id = doorbell_id;
    thread->doorbell_offset = doorbell_offset;
    thread->agent_doorbell_offset = agent_doorbell_offset;
    thread->state.status = FULMAR_LEADER_COMMIT_IDLE;
    const int error = fulmar_doorbell_thread_start(&thread->thread, &thread->lock, run, thread);
    if (0 != error)
    {
        free(thread);
        errno = error;
        return NULL;
    }
    return thread;
}

void fulmar_leader_commit_stop(fulmar_leader_commit_t *thread)
{
    if (NULL == thread)
    {
        return;
    }
    fulmar_leader_commit_halt(thread);
    fulmar_doorbell_thread_stop(thread->thread, &thread->lock, &thread->stop, thread->values, thread->doorbell_offset);
    free(thread);
}

static int32_t fits(int32_t offset, int32_t width, int32_t length)
{
    return offset >= 0 && offset + width <= length;
}

int32_t fulmar_leader_commit_arm(fulmar_leader_commit_t *thread, const fulmar_leader_commit_arm_t *arm)
{
    const int64_t counters = thread->values_length / FULMAR_COUNTER_LENGTH;
    if (arm->image_count < 0 || arm->image_count > FULMAR_LEADER_COMMIT_MAX_IMAGES || arm->follower_count < 1 ||
        arm->follower_count > FULMAR_LEADER_COMMIT_MAX_FOLLOWERS || arm->message_length <= 0 ||
        arm->message_length > FULMAR_LEADER_COMMIT_MESSAGE_CAPACITY ||
        !fits(arm->position_offset, 8, arm->message_length) ||
        !fits(arm->leadership_term_id_offset, 8, arm->append_position_length) ||
        !fits(arm->log_position_offset, 8, arm->append_position_length) ||
        !fits(arm->follower_member_id_offset, 4, arm->append_position_length) ||
        arm->append_position_length < SBE_SCHEMA_ID_OFFSET + 2 || arm->recording_position_id < 0 ||
        arm->recording_position_id >= counters || arm->commit_position_id < 0 || arm->commit_position_id >= counters)
    {
        return -1;
    }
    for (int32_t i = 0; i < arm->image_count; i++)
    {
        const fulmar_leader_commit_image_t *image = &arm->images[i];
        if (NULL == image->log || image->term_length <= 0 || (image->term_length & (image->term_length - 1)) ||
            image->subscriber_position_id < 0 || image->subscriber_position_id >= counters ||
            image->position < 0 || (image->position & (FULMAR_FRAME_ALIGNMENT - 1)))
        {
            return -1;
        }
    }
    for (int32_t i = 0; i < arm->follower_count; i++)
    {
        if (NULL == arm->followers[i].writer.log)
        {
            return -1;
        }
    }
    pthread_mutex_lock(&thread->lock);
    thread->arm = *arm;
    fulmar_leader_commit_state_t *state = &thread->state;
    for (int32_t i = 0; i < arm->follower_count; i++)
    {
        /* Its appends ring the driver at once: nobody rings deferred rings for it. */
        thread->arm.followers[i].writer.defer_rings = 0;
        thread->arm.followers[i].writer.rings_pending = 0;
        state->follower_positions[i] = arm->followers[i].log_position;
        state->follower_times_ns[i] = arm->followers[i].time_ns;
    }
    for (int32_t i = 0; i < arm->image_count; i++)
    {
        state->image_positions[i] = arm->images[i].position;
    }
    state->status = FULMAR_LEADER_COMMIT_RUNNING;
    state->reason = 0;
    state->last_failure = 0;
    state->follower_count = arm->follower_count;
    state->image_count = arm->image_count;
    state->commit_position = arm->commit_position;
    state->sent_position = arm->sent_position;
    state->sent_time_ns = arm->sent_time_ns;
    thread->send_now = 0;
    thread->recording_watched = 0;
    pthread_mutex_unlock(&thread->lock);
    /* Reports may have landed already: the thread looks at once. */
    fulmar_doorbell_ring(thread->values, thread->doorbell_offset);
    return 0;
}

void fulmar_leader_commit_halt(fulmar_leader_commit_t *thread)
{
    pthread_mutex_lock(&thread->lock);
    if (FULMAR_LEADER_COMMIT_IDLE != thread->state.status)
    {
        watch_recording(thread, 0);
    }
    thread->state.status = FULMAR_LEADER_COMMIT_IDLE;
    thread->send_now = 0;
    pthread_mutex_unlock(&thread->lock);
}

int32_t fulmar_leader_commit_send_now(fulmar_leader_commit_t *thread, int64_t since_ns)
{
    pthread_mutex_lock(&thread->lock);
    const int32_t running = FULMAR_LEADER_COMMIT_RUNNING == thread->state.status;
    if (running)
    {
        thread->send_now = 1;
        thread->send_now_since_ns = since_ns;
    }
    pthread_mutex_unlock(&thread->lock);
    if (!running)
    {
        return -1;
    }
    fulmar_doorbell_ring(thread->values, thread->doorbell_offset);
    return 0;
}

void fulmar_leader_commit_state(fulmar_leader_commit_t *thread, fulmar_leader_commit_state_t *state)
{
    pthread_mutex_lock(&thread->lock);
    *state = thread->state;
    pthread_mutex_unlock(&thread->lock);
}

int32_t fulmar_leader_commit_status(fulmar_leader_commit_t *thread)
{
    pthread_mutex_lock(&thread->lock);
    const int32_t status = thread->state.status;
    pthread_mutex_unlock(&thread->lock);
    return status;
}
