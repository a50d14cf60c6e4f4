/* The archive's recorder thread; see recorder.h for what it does and what it
 * leaves to the agent. */
#define _GNU_SOURCE
#include "_common.h"
#include "_doorbell.h"
#include "counters.h"
#include "doorbell.h"
#include "recorder.h"
#include "term.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* Blocks one pass takes from a session before the next session's turn. */
#define RECORDER_BLOCKS_PER_PASS 16

typedef struct
{
    int64_t id;                      /* 0: free */
    fulmar_recorder_session_t session;
    fulmar_recorder_state_t state;
} recorder_slot_t;

struct fulmar_recorder_stct
{
    pthread_t thread;
    pthread_mutex_t lock;
    char *values;
    int64_t values_length;
    int64_t doorbell_offset;
    int64_t agent_doorbell_offset;
    int64_t max_wait_ns;
    int32_t stop;
    char *scratch;                   /* a block's copy, for the checksums */
    int32_t scratch_length;
    int64_t last_id;
    recorder_slot_t slots[FULMAR_RECORDER_CAPACITY];
};

static void fail(recorder_slot_t *slot, int32_t stage, int error)
{
    slot->state.status = FULMAR_RECORDER_FAILED;
    slot->state.stage = stage;
    slot->state.error = error;
}

/* posix_fallocate returns the error; a signal may interrupt a long one. */
static int allocate(int fd, int64_t offset, int64_t length)
{
    int error;
    do
    {
        error = posix_fallocate(fd, offset, length);
    } while (EINTR == error);
    return error;
}

static int write_all(int fd, const char *bytes, int32_t length, int64_t offset)
{
    while (length > 0)
    {
        const ssize_t written = pwrite(fd, bytes, (size_t)length, offset);
        if (written < 0)
        {
            if (EINTR == errno)
            {
                continue;
            }
            return errno;
        }
        bytes += written;
        offset += written;
        length -= (int32_t)written;
    }
    return 0;
}

/* Writes the next block of the session's image, if there is one and it fits
 * the open segment.  Returns 1 when it wrote; 0 when there was nothing, or
 * when the session now waits for the agent (*need_agent set). */
static int32_t record_block(fulmar_recorder_t *recorder, recorder_slot_t *slot, int32_t *need_agent)
{
    fulmar_recorder_session_t *session = &slot->session;
    const int64_t position = session->position;
    const int32_t term_length = session->term_length;
    const int32_t term_offset = (int32_t)(position & (term_length - 1));
    const int64_t partition = (position >> session->position_bits_to_shift) % 3;
    const char *term = session->term_buffers + partition * term_length;
    int32_t limit = term_offset + session->block_length;
    if (limit > term_length)
    {
        limit = term_length;
    }
    const int32_t length = fulmar_term_block_scan(term, term_offset, limit) - term_offset;
    if (length <= 0)
    {
        return 0;
    }
    const int64_t end = position + length;
    if (end > session->segment_end || session->fd < 0)
    {
        /* A block never spans segments (they are whole terms): this one is
         * the first of the next segment, which the agent opens. */
        slot->state.status = FULMAR_RECORDER_NEEDS_AGENT;
        *need_agent = 1;
        return 0;
    }
    const char *block = term + term_offset;
    if (session->checksum)
    {
        /* The recorded copy differs from the term (the CRC-32 replaces the
         * session id): the term stays as the driver wrote it. */
        memcpy(recorder->scratch, block, (size_t)length);
        const int32_t checked = fulmar_record_checksums(recorder->scratch, length);
        if (checked != length)
        {
            fail(slot, FULMAR_RECORDER_STAGE_CHECKSUM, checked);
            *need_agent = 1;
            return 0;
        }
        block = recorder->scratch;
    }
    int error;
    if (end > session->allocated_end)
    {
        /* A chunk at a time ahead of the writes, as the agent's writer does:
         * a full disk fails here, before the write. */
        const int64_t chunk = session->allocation_chunk;
        const int64_t relative_end = end - session->segment_base;
        int64_t new_end = session->segment_base + (relative_end + chunk - 1) / chunk * chunk;
        if (new_end > session->segment_end)
        {
            new_end = session->segment_end;
        }
        const int64_t from = session->allocated_end - session->segment_base;
        if (0 != (error = allocate(session->fd, from, new_end - session->allocated_end)))
        {
            fail(slot, FULMAR_RECORDER_STAGE_ALLOCATE, error);
            *need_agent = 1;
            return 0;
        }
        session->allocated_end = new_end;
        slot->state.allocated_end = new_end;
    }
    if (0 != (error = write_all(session->fd, block, length, position - session->segment_base)))
    {
        fail(slot, FULMAR_RECORDER_STAGE_WRITE, error);
        *need_agent = 1;
        return 0;
    }
    if (session->file_sync_level > 0 &&
        0 != (session->file_sync_level >= 2 ? fsync(session->fd) : fdatasync(session->fd)))
    {
        fail(slot, FULMAR_RECORDER_STAGE_SYNC, errno);
        *need_agent = 1;
        return 0;
    }
    /* Only now is the block in the page cache: the positions may say so. */
    session->position = end;
    slot->state.position = end;
    slot->state.blocks++;
    char *values = recorder->values;
    fa_store_i64(values + (int64_t)session->subscriber_position_id * FULMAR_COUNTER_LENGTH, end);
    fa_store_i64(values + (int64_t)session->recording_position_id * FULMAR_COUNTER_LENGTH, end);
    fulmar_counter_ring_watchers(values, recorder->values_length, session->recording_position_id);
    return 1;
}

/* One pass over the running sessions, with the lock held. */
static int32_t record(fulmar_recorder_t *recorder, int32_t *need_agent)
{
    int32_t work = 0;
    for (int32_t i = 0; i < FULMAR_RECORDER_CAPACITY; i++)
    {
        recorder_slot_t *slot = &recorder->slots[i];
        for (int32_t blocks = 0;
             blocks < RECORDER_BLOCKS_PER_PASS && 0 != slot->id && FULMAR_RECORDER_RUNNING == slot->state.status;
             blocks++)
        {
            if (0 == record_block(recorder, slot, need_agent))
            {
                break;
            }
            work++;
        }
    }
    return work;
}

static void *run(void *argument)
{
    fulmar_recorder_t *recorder = argument;
    char *values = recorder->values;
    for (;;)
    {
        int32_t need_agent = 0;
        pthread_mutex_lock(&recorder->lock);
        const int32_t stop = recorder->stop;
        const int32_t work = stop ? 0 : record(recorder, &need_agent);
        pthread_mutex_unlock(&recorder->lock);
        if (need_agent)
        {
            fulmar_doorbell_ring(values, recorder->agent_doorbell_offset);
        }
        if (stop)
        {
            break;
        }
        if (work > 0)
        {
            continue;
        }
        /* Register as a sleeper, then look once more: a ring between the
         * pass above and the registration is not lost. */
        const int32_t token = fulmar_doorbell_prepare(values, recorder->doorbell_offset);
        pthread_mutex_lock(&recorder->lock);
        const int32_t again = recorder->stop || record(recorder, &need_agent) > 0;
        pthread_mutex_unlock(&recorder->lock);
        if (need_agent)
        {
            fulmar_doorbell_ring(values, recorder->agent_doorbell_offset);
        }
        if (again)
        {
            fulmar_doorbell_cancel(values, recorder->doorbell_offset);
            continue;
        }
        fulmar_doorbell_wait_without_gil(values, recorder->doorbell_offset, token, recorder->max_wait_ns);
    }
    return NULL;
}

fulmar_recorder_t *fulmar_recorder_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id, int64_t max_wait_ns)
{
    const int64_t doorbell_offset = fulmar_doorbell_offset(doorbell_id, values_length);
    const int64_t agent_doorbell_offset = fulmar_doorbell_offset(agent_doorbell_id, values_length);
    if (doorbell_offset < 0 || agent_doorbell_offset < 0 || max_wait_ns <= 0)
    {
        errno = EINVAL;
        return NULL;
    }
    fulmar_recorder_t *recorder = calloc(1, sizeof(*recorder));
    if (NULL == recorder)
    {
        return NULL;
    }
    recorder->values = counters_values;
    recorder->values_length = values_length;
    recorder->doorbell_offset = doorbell_offset;
    recorder->agent_doorbell_offset = agent_doorbell_offset;
    recorder->max_wait_ns = max_wait_ns;
    const int error = fulmar_doorbell_thread_start(&recorder->thread, &recorder->lock, run, recorder);
    if (0 != error)
    {
        free(recorder);
        errno = error;
        return NULL;
    }
    return recorder;
}

void fulmar_recorder_stop(fulmar_recorder_t *recorder)
{
    if (NULL == recorder)
    {
        return;
    }
    fulmar_doorbell_thread_stop(recorder->thread, &recorder->lock, &recorder->stop, recorder->values, recorder->doorbell_offset);
    free(recorder->scratch);
    free(recorder);
}

static int32_t valid_session(const fulmar_recorder_t *recorder, const fulmar_recorder_session_t *session)
{
    const int64_t last_id = recorder->values_length / FULMAR_COUNTER_LENGTH - 1;
    return NULL != session->term_buffers && session->term_length > 0 &&
        0 == (session->term_length & (session->term_length - 1)) && session->block_length > 0 &&
        session->allocation_chunk > 0 && session->subscriber_position_id >= 0 &&
        session->subscriber_position_id <= last_id && session->recording_position_id >= 0 &&
        session->recording_position_id <= last_id && session->segment_base <= session->position &&
        session->position <= session->segment_end && session->segment_base <= session->allocated_end &&
        session->allocated_end <= session->segment_end;
}

int64_t fulmar_recorder_attach(fulmar_recorder_t *recorder, const fulmar_recorder_session_t *session)
{
    if (!valid_session(recorder, session))
    {
        return -1;
    }
    int64_t found = -1;
    pthread_mutex_lock(&recorder->lock);
    if (session->checksum && session->block_length > recorder->scratch_length)
    {
        char *scratch = realloc(recorder->scratch, (size_t)session->block_length);
        if (NULL == scratch)
        {
            pthread_mutex_unlock(&recorder->lock);
            return -1;
        }
        recorder->scratch = scratch;
        recorder->scratch_length = session->block_length;
    }
    for (int32_t i = 0; i < FULMAR_RECORDER_CAPACITY; i++)
    {
        recorder_slot_t *slot = &recorder->slots[i];
        if (0 == slot->id)
        {
            memset(slot, 0, sizeof(*slot));
            slot->id = ++recorder->last_id;
            slot->session = *session;
            slot->state.status = FULMAR_RECORDER_RUNNING;
            slot->state.position = session->position;
            slot->state.allocated_end = session->allocated_end;
            found = slot->id;
            break;
        }
    }
    pthread_mutex_unlock(&recorder->lock);
    if (found >= 0)
    {
        /* Data may be waiting already: the thread looks at once. */
        fulmar_doorbell_ring(recorder->values, recorder->doorbell_offset);
    }
    return found;
}

static recorder_slot_t *slot_of(fulmar_recorder_t *recorder, int64_t session_id)
{
    for (int32_t i = 0; session_id > 0 && i < FULMAR_RECORDER_CAPACITY; i++)
    {
        if (recorder->slots[i].id == session_id)
        {
            return &recorder->slots[i];
        }
    }
    return NULL;
}

int32_t fulmar_recorder_state(fulmar_recorder_t *recorder, int64_t session_id, fulmar_recorder_state_t *state)
{
    pthread_mutex_lock(&recorder->lock);
    recorder_slot_t *found = slot_of(recorder, session_id);
    if (NULL != found)
    {
        *state = found->state;
    }
    pthread_mutex_unlock(&recorder->lock);
    return NULL == found ? -1 : 0;
}

int32_t fulmar_recorder_resume(
    fulmar_recorder_t *recorder, int64_t session_id, int32_t fd, int64_t position, int64_t segment_base,
    int64_t segment_end, int64_t allocated_end)
{
    int32_t result = -1;
    pthread_mutex_lock(&recorder->lock);
    recorder_slot_t *found = slot_of(recorder, session_id);
    if (NULL != found && FULMAR_RECORDER_NEEDS_AGENT == found->state.status && segment_base <= position &&
        position <= segment_end && segment_base <= allocated_end && allocated_end <= segment_end)
    {
        fulmar_recorder_session_t *session = &found->session;
        session->fd = fd;
        session->position = position;
        session->segment_base = segment_base;
        session->segment_end = segment_end;
        session->allocated_end = allocated_end;
        found->state.position = position;
        found->state.allocated_end = allocated_end;
        found->state.status = FULMAR_RECORDER_RUNNING;
        result = 0;
    }
    pthread_mutex_unlock(&recorder->lock);
    if (0 == result)
    {
        fulmar_doorbell_ring(recorder->values, recorder->doorbell_offset);
    }
    return result;
}

int32_t fulmar_recorder_halt(fulmar_recorder_t *recorder, int64_t session_id)
{
    pthread_mutex_lock(&recorder->lock);
    recorder_slot_t *found = slot_of(recorder, session_id);
    if (NULL != found && FULMAR_RECORDER_FAILED != found->state.status)
    {
        found->state.status = FULMAR_RECORDER_HALTED;
    }
    pthread_mutex_unlock(&recorder->lock);
    return NULL == found ? -1 : 0;
}

int32_t fulmar_recorder_release(fulmar_recorder_t *recorder, int64_t session_id)
{
    pthread_mutex_lock(&recorder->lock);
    recorder_slot_t *found = slot_of(recorder, session_id);
    if (NULL != found)
    {
        found->id = 0;
    }
    pthread_mutex_unlock(&recorder->lock);
    return NULL == found ? -1 : 0;
}
