/* A consensus module's commit thread, a leader's or a follower's; see
 * leader_commit.h for what it does and what it leaves to the agent. */
#define _GNU_SOURCE
#include "_common.h"
#include "_doorbell.h"
#include "counters.h"
#include "doorbell.h"
#include "term.h"
#include "member_auth.h"
#include "leader_commit.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* Where Aeron keeps a counter's registration id in its value record. */
#define REGISTRATION_ID_OFFSET 8
/* An SBE message header: blockLength, templateId, schemaId, version (u16 each). */
#define SBE_BLOCK_LENGTH_OFFSET 0
#define SBE_TEMPLATE_ID_OFFSET 2
#define SBE_SCHEMA_ID_OFFSET 4
#define SBE_HEADER_LENGTH 8
/* The thread is woken by its doorbell for everything it does; the timeout
 * only bounds a lost ring. */
#define IDLE_WAIT_NS (100 * 1000 * 1000LL)
/* Not armed, it only passes rings on (and each wake-up is passed on, since a
 * ring just after a timeout cannot be told from it): a long sleep, so the
 * agent is not woken for nothing more than once in a while. */
#define RELAY_WAIT_NS (10 * 1000 * 1000 * 1000LL)
/* Whose thread it is while RUNNING. */
#define MODE_LEADER 0
#define MODE_FOLLOWER 1

struct fulmar_leader_commit_stct
{
    pthread_t thread;
    pthread_mutex_t lock;
    fulmar_doorbell_loop_t loop;             /* what the thread runs: step below */
    char *values;
    int64_t values_length;
    int32_t doorbell_id;
    int64_t doorbell_offset;
    int64_t agent_doorbell_offset;
    int32_t stop;
    int32_t send_now;                /* a heartbeat asked for */
    int64_t send_now_since_ns;       /* unless one was sent at or after this time */
    int32_t recording_watched;       /* this thread's doorbell is among rec-pos's watchers */
    int32_t mode;                    /* MODE_LEADER (arm) or MODE_FOLLOWER (follower_arm) */
    int32_t recording_position_id;   /* the rec-pos the arming named, either mode */
    fulmar_leader_commit_arm_t arm;
    fulmar_follower_commit_arm_t follower_arm;
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
    const int32_t counter_id = thread->recording_position_id;
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

/* Whether the thread may read the message itself.  Its header must give the
 * schema's own block length, within the message: one whose block length runs
 * past its end, or stops short of a field, is malformed to the agent's decoder,
 * which counts and logs it; one of another version is the decoder's to read.
 * Read here, either would pass for a report and never reach the agent. */
static int32_t is_message(
    const char *message, int32_t length, int32_t min_length, int32_t block_length, int32_t schema_id,
    int32_t template_id)
{
    return length >= min_length && length >= SBE_HEADER_LENGTH + block_length &&
        fa_read_u16(message + SBE_BLOCK_LENGTH_OFFSET) == (uint16_t)block_length &&
        fa_read_u16(message + SBE_TEMPLATE_ID_OFFSET) == (uint16_t)template_id &&
        fa_read_u16(message + SBE_SCHEMA_ID_OFFSET) == (uint16_t)schema_id;
}

/* With a member auth context: whether the signed message (length bytes,
 * its trailer included) is a member's, its member id field at
 * member_id_offset naming the sender.  One that is not is counted and left
 * for the agent, whose guard finds the same fault (the failed check took no
 * counter) and counts and logs the refusal. */
static int32_t is_authentic(
    fulmar_leader_commit_t *thread, fulmar_member_auth_t *auth, const char *message, int32_t length,
    int32_t member_id_offset)
{
    if (fulmar_member_auth_check(auth, message, length, fulmar_member_auth_now_ms(), member_id_offset,
            FULMAR_MEMBER_AUTH_FIELD_NAMES_SENDER, NULL) < 0)
    {
        thread->state.unauthenticated++;
        return 0;
    }
    return 1;
}

/* With a member auth context, whether the message (of the template looked
 * for, by its header) holds the whole body and a trailer after it: an
 * unsigned one does not, and is counted and left for the agent. */
static int32_t has_room_for_trailer(
    fulmar_leader_commit_t *thread, const char *message, int32_t length, int32_t min_length, int32_t block_length,
    int32_t schema_id, int32_t template_id)
{
    if (!is_message(message, length - FULMAR_MEMBER_AUTH_TRAILER_LENGTH, min_length, block_length, schema_id,
            template_id))
    {
        thread->state.unauthenticated++;
        return 0;
    }
    return 1;
}

/* A leader's: an AppendPosition is read (1), anything else is not (0). */
static int32_t take_append_position(fulmar_leader_commit_t *thread, const char *message, int32_t length, int64_t now_ns)
{
    const fulmar_leader_commit_arm_t *arm = &thread->arm;
    /* The header is looked at before the trailer is checked: a check that
     * passes takes the sender's counter, so only a message this thread
     * reads may be checked here (the agent checks the rest). */
    if (!is_message(
            message, length, arm->append_position_length, arm->append_position_block_length, arm->schema_id,
            arm->append_position_template_id))
    {
        return 0;
    }
    if (NULL != arm->auth &&
        (!has_room_for_trailer(thread, message, length, arm->append_position_length, arm->append_position_block_length,
             arm->schema_id, arm->append_position_template_id) ||
            !is_authentic(thread, arm->auth, message, length, arm->follower_member_id_offset)))
    {
        return 0;  /* not counted toward the commit: the agent refuses it */
    }
    thread->state.append_positions++;
    if (fa_read_i64(message + arm->leadership_term_id_offset) != arm->leadership_term_id)
    {
        return 1;  /* another term's: the agent, as a steady leader, passes it over too */
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
            return 1;
        }
    }
    return 1;
}

/* A follower's: a CommitPosition is read (1) unless it is of a newer term,
 * which the agent's election answers; anything else is not (0). */
static int32_t take_commit_position(fulmar_leader_commit_t *thread, const char *message, int32_t length, int64_t now_ns)
{
    const fulmar_follower_commit_arm_t *arm = &thread->follower_arm;
    if (!is_message(
            message, length, arm->commit_position_length, arm->commit_position_block_length, arm->schema_id,
            arm->commit_position_template_id))
    {
        return 0;
    }
    if (NULL != arm->auth &&
        !has_room_for_trailer(thread, message, length, arm->commit_position_length, arm->commit_position_block_length,
            arm->schema_id, arm->commit_position_template_id))
    {
        return 0;
    }
    const int64_t term = fa_read_i64(message + arm->leadership_term_id_offset);
    if (term > arm->leadership_term_id)
    {
        return 0;  /* (not checked here: the agent's check must find its counter untaken) */
    }
    if (NULL != arm->auth && !is_authentic(thread, arm->auth, message, length, arm->leader_member_id_offset))
    {
        return 0;
    }
    thread->state.commit_positions_read++;
    if (term == arm->leadership_term_id && fa_read_i32(message + arm->leader_member_id_offset) == arm->leader_member_id)
    {
        const int64_t position = fa_read_i64(message + arm->log_position_offset);
        if (position > thread->state.notified_commit_position)
        {
            thread->state.notified_commit_position = position;
        }
        thread->state.leader_time_ns = now_ns;
    }
    return 1;  /* (an older term's, or another member's: passed over, as the agent does) */
}

typedef int32_t (*take_message_t)(fulmar_leader_commit_t *thread, const char *message, int32_t length, int64_t now_ns);

/* With the lock held: reads the messages of consensus image i (one of
 * images) that take accepts, from where it was left.  Returns the messages
 * read; stops (NEEDS_AGENT) before anything else. */
static int32_t walk_image(
    fulmar_leader_commit_t *thread, const fulmar_leader_commit_image_t *images, int32_t i, int64_t now_ns,
    take_message_t take)
{
    const fulmar_leader_commit_image_t *image = &images[i];
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
            if ((uint8_t)frame[5] != FULMAR_FLAG_UNFRAGMENTED ||
                !take(thread, frame + FULMAR_HEADER_LENGTH, frame_length - FULMAR_HEADER_LENGTH, now_ns))
            {
                needs_agent(thread, FULMAR_LEADER_COMMIT_OTHER_MESSAGE);
                break;  /* left for the agent, unread */
            }
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
    const int64_t now_ms = NULL != arm->auth ? fulmar_member_auth_now_ms() : 0;
    for (int32_t i = 0; i < arm->follower_count; i++)
    {
        fulmar_log_writer_t *writer = &arm->followers[i].writer;
        int32_t length = arm->message_length;
        if (NULL != arm->auth)
        {
            /* Each follower's own trailer (its receiver, a fresh counter),
             * written over the last one's. */
            length = fulmar_member_auth_sign(arm->auth, arm->message, arm->message_length, arm->followers[i].member_id,
                now_ms);
        }
        int64_t result = fulmar_concurrent_offer(writer, arm->message, length, 0);
        if (FULMAR_ADMIN_ACTION == result)
        {
            /* The term rotated under this offer (nothing was appended, so the
             * same signed bytes go): the next takes the new term. */
            result = fulmar_concurrent_offer(writer, arm->message, length, 0);
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

/* This member's rec-pos into recorded; 0 (and NEEDS_AGENT) when the counter
 * is no longer the armed one. */
static int32_t read_recorded(fulmar_leader_commit_t *thread, int32_t counter_id, int64_t registration_id, int64_t *recorded)
{
    const char *record = thread->values + (int64_t)counter_id * FULMAR_COUNTER_LENGTH;
    *recorded = fa_load_i64(record);
    /* Read after the value: a counter freed and reused between the two reads
     * shows a new registration id, and its value is not used. */
    if (fa_load_i64(record + REGISTRATION_ID_OFFSET) != registration_id)
    {
        needs_agent(thread, FULMAR_LEADER_COMMIT_RECORDING_GONE);
        return 0;
    }
    return 1;
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
        work += walk_image(thread, arm->images, i, now_ns, take_append_position);
    }
    int64_t recorded;
    if (!read_recorded(thread, arm->recording_position_id, arm->recording_position_registration_id, &recorded))
    {
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

/* With the lock held: a follower's log, read up to limit across client
 * messages and padding.  Returns the messages read; stops (NEEDS_AGENT)
 * before any other entry. */
static int32_t walk_log(fulmar_leader_commit_t *thread, int64_t limit)
{
    const fulmar_follower_commit_arm_t *arm = &thread->follower_arm;
    const fulmar_leader_commit_image_t *image = &arm->log;
    const int32_t term_length = image->term_length;
    const int32_t bits = __builtin_ctz((unsigned)term_length);
    const int32_t session_message_length = SBE_HEADER_LENGTH + arm->session_message_block_length;
    const int64_t start = thread->state.log_position;
    int64_t position = start;
    int32_t read = 0;
    while (position < limit)
    {
        const int32_t term_offset = (int32_t)(position & (term_length - 1));
        const char *frame = image->log + (position >> bits) % FULMAR_PARTITION_COUNT * term_length + term_offset;
        const int32_t frame_length = fa_load_i32(frame);
        if (frame_length <= 0)
        {
            break;  /* not in the image yet */
        }
        const int16_t type = fa_read_i16(frame + 6);
        if (frame_length < FULMAR_HEADER_LENGTH || frame_length > term_length - term_offset ||
            (FULMAR_FRAME_TYPE_DATA != type && FULMAR_FRAME_TYPE_PAD != type))
        {
            needs_agent(thread, FULMAR_LEADER_COMMIT_BAD_FRAME);
            break;
        }
        const int64_t next = position + FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
        if (next > limit)
        {
            break;  /* (the commit is a frame's end: never seen, but never read past either) */
        }
        if (FULMAR_FRAME_TYPE_DATA == type)
        {
            const char *message = frame + FULMAR_HEADER_LENGTH;
            if ((uint8_t)frame[5] != FULMAR_FLAG_UNFRAGMENTED ||
                !is_message(message, frame_length - FULMAR_HEADER_LENGTH, session_message_length,
                    arm->session_message_block_length, arm->schema_id, arm->session_message_template_id) ||
                fa_read_i64(message + arm->cluster_session_id_offset) < 0)
            {
                needs_agent(thread, FULMAR_LEADER_COMMIT_LOG_MESSAGE);
                break;  /* the agent applies it */
            }
            read++;
        }
        position = next;
    }
    if (position != start)
    {
        thread->state.log_position = position;
        thread->state.log_messages += read;
        fa_store_i64(thread->values + (int64_t)image->subscriber_position_id * FULMAR_COUNTER_LENGTH, position);
    }
    return read;
}

/* With the lock held: the leader's CommitPositions, the log up to what they
 * and this member's recording allow, and commit-pos.  Returns the work done. */
static int32_t follower_work(fulmar_leader_commit_t *thread)
{
    if (FULMAR_LEADER_COMMIT_RUNNING != thread->state.status)
    {
        return 0;
    }
    const fulmar_follower_commit_arm_t *arm = &thread->follower_arm;
    const int64_t now_ns = monotonic_ns();
    int32_t work = 0;
    for (int32_t i = 0; i < arm->image_count && FULMAR_LEADER_COMMIT_RUNNING == thread->state.status; i++)
    {
        work += walk_image(thread, arm->images, i, now_ns, take_commit_position);
    }
    int64_t recorded;
    if (FULMAR_LEADER_COMMIT_RUNNING != thread->state.status ||
        !read_recorded(thread, arm->recording_position_id, arm->recording_position_registration_id, &recorded))
    {
        return work;
    }
    const int64_t notified = thread->state.notified_commit_position;
    /* Past this member's recording only the archive's next ring lets the log on. */
    watch_recording(thread, notified > recorded);
    work += walk_log(thread, notified < recorded ? notified : recorded);
    if (thread->state.log_position > thread->state.commit_position)
    {
        thread->state.commit_position = thread->state.log_position;
        thread->state.commits++;
        fa_store_i64(thread->values + (int64_t)arm->commit_position_id * FULMAR_COUNTER_LENGTH,
            thread->state.commit_position);
        fulmar_counter_ring_watchers(thread->values, thread->values_length, arm->commit_position_id);
        work++;
    }
    return work;
}

static int32_t is_running(void *argument)
{
    return FULMAR_LEADER_COMMIT_RUNNING == ((fulmar_leader_commit_t *)argument)->state.status;
}

/* One step of the thread (with the lock held). */
static int32_t step(void *argument, fulmar_doorbell_step_t *out)
{
    fulmar_leader_commit_t *thread = argument;
    const int32_t was_running = is_running(thread);
    const int32_t work = MODE_FOLLOWER == thread->mode ? follower_work(thread) : commit_work(thread);
    fulmar_doorbell_armed_step(out, was_running, is_running(thread), IDLE_WAIT_NS, RELAY_WAIT_NS);
    return work;
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

static int32_t is_usable_image(const fulmar_leader_commit_image_t *image, int64_t counters)
{
    return NULL != image->log && image->term_length > 0 && 0 == (image->term_length & (image->term_length - 1)) &&
        image->subscriber_position_id >= 0 && image->subscriber_position_id < counters && image->position >= 0 &&
        0 == (image->position & (FULMAR_FRAME_ALIGNMENT - 1));
}

int32_t fulmar_leader_commit_arm(fulmar_leader_commit_t *thread, const fulmar_leader_commit_arm_t *arm)
{
    const int64_t counters = thread->values_length / FULMAR_COUNTER_LENGTH;
    if (arm->image_count < 0 || arm->image_count > FULMAR_LEADER_COMMIT_MAX_IMAGES || arm->follower_count < 0 ||
        arm->follower_count > FULMAR_LEADER_COMMIT_MAX_FOLLOWERS || arm->message_length <= 0 ||
        arm->message_length + (NULL != arm->auth ? FULMAR_MEMBER_AUTH_TRAILER_LENGTH : 0) >
            FULMAR_LEADER_COMMIT_MESSAGE_CAPACITY ||
        !fits(arm->position_offset, 8, arm->message_length) ||
        !fits(arm->leadership_term_id_offset, 8, arm->append_position_length) ||
        !fits(arm->log_position_offset, 8, arm->append_position_length) ||
        !fits(arm->follower_member_id_offset, 4, arm->append_position_length) ||
        arm->append_position_length < SBE_SCHEMA_ID_OFFSET + 2 ||
        SBE_HEADER_LENGTH + arm->append_position_block_length < arm->append_position_length ||
        arm->append_position_block_length > UINT16_MAX || arm->recording_position_id < 0 ||
        arm->recording_position_id >= counters || arm->commit_position_id < 0 || arm->commit_position_id >= counters)
    {
        return -1;
    }
    for (int32_t i = 0; i < arm->image_count; i++)
    {
        if (!is_usable_image(&arm->images[i], counters))
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
    thread->mode = MODE_LEADER;
    thread->recording_position_id = arm->recording_position_id;
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

int32_t fulmar_leader_commit_arm_follower(fulmar_leader_commit_t *thread, const fulmar_follower_commit_arm_t *arm)
{
    const int64_t counters = thread->values_length / FULMAR_COUNTER_LENGTH;
    if (arm->image_count < 0 || arm->image_count > FULMAR_LEADER_COMMIT_MAX_IMAGES ||
        arm->commit_position_length < SBE_SCHEMA_ID_OFFSET + 2 ||
        SBE_HEADER_LENGTH + arm->commit_position_block_length < arm->commit_position_length ||
        arm->commit_position_block_length > UINT16_MAX ||
        !fits(arm->leadership_term_id_offset, 8, arm->commit_position_length) ||
        !fits(arm->log_position_offset, 8, arm->commit_position_length) ||
        !fits(arm->leader_member_id_offset, 4, arm->commit_position_length) ||
        arm->session_message_block_length < 0 ||
        !fits(arm->cluster_session_id_offset, 8, SBE_HEADER_LENGTH + arm->session_message_block_length) ||
        !is_usable_image(&arm->log, counters) || arm->recording_position_id < 0 ||
        arm->recording_position_id >= counters || arm->commit_position_id < 0 || arm->commit_position_id >= counters)
    {
        return -1;
    }
    for (int32_t i = 0; i < arm->image_count; i++)
    {
        if (!is_usable_image(&arm->images[i], counters))
        {
            return -1;
        }
    }
    pthread_mutex_lock(&thread->lock);
    thread->mode = MODE_FOLLOWER;
    thread->recording_position_id = arm->recording_position_id;
    thread->follower_arm = *arm;
    fulmar_leader_commit_state_t *state = &thread->state;
    for (int32_t i = 0; i < arm->image_count; i++)
    {
        state->image_positions[i] = arm->images[i].position;
    }
    state->status = FULMAR_LEADER_COMMIT_RUNNING;
    state->reason = 0;
    state->last_failure = 0;
    state->follower_count = 0;
    state->image_count = arm->image_count;
    state->notified_commit_position = arm->notified_commit_position;
    state->commit_position = arm->commit_position;
    state->leader_time_ns = arm->leader_time_ns;
    state->log_position = arm->log.position;
    thread->send_now = 0;
    thread->recording_watched = 0;
    pthread_mutex_unlock(&thread->lock);
    /* A CommitPosition may have landed already: the thread looks at once. */
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
    const int32_t running = FULMAR_LEADER_COMMIT_RUNNING == thread->state.status && MODE_LEADER == thread->mode;
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
