#include "_common.h"
#include "broadcast.h"

/* Record layout: length i32 @0 (header included), msg_type_id i32 @4, body @8,
 * records aligned to 8.  Positions (tail, latest, cursors) only grow; a record
 * at position p lives at index p & (capacity - 1). */

static inline bool bc_capacity_ok(int32_t capacity)
{
    return capacity >= FULMAR_BROADCAST_RECORD_HEADER_LENGTH && (capacity & (capacity - 1)) == 0;
}

static inline char *bc_trailer(char *buffer, int32_t capacity)
{
    return buffer + capacity;
}

/* Header fields are plain: the transmitter publishes them with the release
 * store of the tail, and receivers detect overwrites through tail intent. */
static inline void bc_put_header(char *buffer, int32_t offset, int32_t length, int32_t msg_type_id)
{
    memcpy(buffer + offset, &length, sizeof(length));
    memcpy(buffer + offset + 4, &msg_type_id, sizeof(msg_type_id));
}

static inline int32_t bc_get_length(const char *buffer, int32_t offset)
{
    int32_t length;
    memcpy(&length, buffer + offset, sizeof(length));
    return length;
}

static inline int32_t bc_get_type(const char *buffer, int32_t offset)
{
    int32_t msg_type_id;
    memcpy(&msg_type_id, buffer + offset + 4, sizeof(msg_type_id));
    return msg_type_id;
}

int32_t fulmar_broadcast_max_message_length(int32_t capacity)
{
    return capacity / 8;
}

/* Announce the tail this transmission will reach *before* touching any record
 * byte: a receiver that re-reads the intent after copying a record knows
 * whether the transmitter may have been writing over it meanwhile.  The
 * release fence keeps the record stores that follow behind this store. */
static inline void bc_signal_tail_intent(char *trailer, int64_t new_tail)
{
    fa_store_i64(trailer + FULMAR_BROADCAST_TAIL_INTENT_COUNTER_OFFSET, new_tail);
    fa_release_fence();
}

int32_t fulmar_broadcast_transmit(char *buffer, int32_t capacity, int32_t msg_type_id, const char *msg, int32_t length)
{
    if (!bc_capacity_ok(capacity) || msg_type_id < 1 || length < 0 ||
        length > fulmar_broadcast_max_message_length(capacity))
    {
        return FULMAR_BROADCAST_INVALID_ARGUMENT;
    }

    char *trailer = bc_trailer(buffer, capacity);
    /* Single writer: nobody else moves the tail. */
    int64_t current_tail = fa_load_i64(trailer + FULMAR_BROADCAST_TAIL_COUNTER_OFFSET);
    int32_t record_offset = (int32_t)(current_tail & (capacity - 1));
    const int32_t record_length = length + FULMAR_BROADCAST_RECORD_HEADER_LENGTH;
    const int32_t aligned_length = (int32_t)FULMAR_ALIGN(record_length, FULMAR_BROADCAST_RECORD_ALIGNMENT);
    const int64_t new_tail = current_tail + aligned_length;
    const int32_t to_end_of_buffer = capacity - record_offset;

    if (to_end_of_buffer < aligned_length)
    {
        /* Records never straddle the end: pad the remainder, start at 0. */
        bc_signal_tail_intent(trailer, new_tail + to_end_of_buffer);
        bc_put_header(buffer, record_offset, to_end_of_buffer, FULMAR_BROADCAST_PADDING_MSG_TYPE_ID);
        current_tail += to_end_of_buffer;
        record_offset = 0;
    }
    else
    {
        bc_signal_tail_intent(trailer, new_tail);
    }

    bc_put_header(buffer, record_offset, record_length, msg_type_id);
    memcpy(buffer + record_offset + FULMAR_BROADCAST_RECORD_HEADER_LENGTH, msg, (size_t)length);

    fa_store_i64(trailer + FULMAR_BROADCAST_LATEST_COUNTER_OFFSET, current_tail);
    /* Release: a receiver that sees the new tail (acquire) sees the record. */
    fa_store_i64(trailer + FULMAR_BROADCAST_TAIL_COUNTER_OFFSET, current_tail + aligned_length);

    return FULMAR_BROADCAST_OK;
}

void fulmar_broadcast_receiver_init(fulmar_broadcast_receiver_t *receiver, char *buffer, int32_t capacity)
{
    const int64_t latest = fa_load_i64(bc_trailer(buffer, capacity) + FULMAR_BROADCAST_LATEST_COUNTER_OFFSET);
    receiver->cursor = latest;
    receiver->next_record = latest;
    receiver->read_position = latest;
    receiver->lapped_count = 0;
    receiver->record_offset = (int32_t)(latest & (capacity - 1));
    receiver->reserved = 0;
}

/* A record at `cursor` is intact as long as the transmitter has not announced a
 * tail a whole buffer beyond it. */
static inline bool bc_validate_at(char *buffer, int32_t capacity, int64_t cursor)
{
    const int64_t tail_intent = fa_load_i64(bc_trailer(buffer, capacity) + FULMAR_BROADCAST_TAIL_INTENT_COUNTER_OFFSET);
    return (cursor + capacity) > tail_intent;
}

bool fulmar_broadcast_receive_next(fulmar_broadcast_receiver_t *receiver, char *buffer, int32_t capacity)
{
    char *trailer = bc_trailer(buffer, capacity);
    const int32_t mask = capacity - 1;
    const int64_t tail = fa_load_i64(trailer + FULMAR_BROADCAST_TAIL_COUNTER_OFFSET);
    int64_t cursor = receiver->next_record;

    if (tail <= cursor)
    {
        return false;
    }

    int32_t record_offset = (int32_t)(cursor & mask);
    if (!bc_validate_at(buffer, capacity, cursor))
    {
        /* Lapped: what we were about to read is gone; skip to the newest record. */
        receiver->lapped_count++;
        cursor = fa_load_i64(trailer + FULMAR_BROADCAST_LATEST_COUNTER_OFFSET);
        record_offset = (int32_t)(cursor & mask);
    }

    receiver->read_position = cursor;
    receiver->cursor = cursor;
    receiver->next_record =
        cursor + (int64_t)FULMAR_ALIGN(bc_get_length(buffer, record_offset), FULMAR_BROADCAST_RECORD_ALIGNMENT);

    if (FULMAR_BROADCAST_PADDING_MSG_TYPE_ID == bc_get_type(buffer, record_offset))
    {
        /* The transmitter always writes a real record at 0 right after padding.
         * The new cursor comes from the padding's length, which may itself be
         * torn, so validation stays anchored at read_position (the padding). */
        record_offset = 0;
        receiver->cursor = receiver->next_record;
        receiver->next_record +=
            (int64_t)FULMAR_ALIGN(bc_get_length(buffer, record_offset), FULMAR_BROADCAST_RECORD_ALIGNMENT);
    }

    receiver->record_offset = record_offset;
    return true;
}

bool fulmar_broadcast_validate(fulmar_broadcast_receiver_t *receiver, char *buffer, int32_t capacity)
{
    /* Keep the reads of the record from drifting past the intent check
     * (the seqlock pattern; Agrona uses a load fence here). */
    fa_acquire_fence();
    return bc_validate_at(buffer, capacity, receiver->read_position);
}

/* After a torn read: count it as a lap and resume at the newest record. */
static void bc_resync(fulmar_broadcast_receiver_t *receiver, char *buffer, int32_t capacity)
{
    const int64_t latest = fa_load_i64(bc_trailer(buffer, capacity) + FULMAR_BROADCAST_LATEST_COUNTER_OFFSET);
    receiver->lapped_count++;
    receiver->cursor = latest;
    receiver->next_record = latest;
    receiver->read_position = latest;
    receiver->record_offset = (int32_t)(latest & (capacity - 1));
}

int32_t fulmar_broadcast_copy_receive(
    fulmar_broadcast_receiver_t *receiver,
    char *buffer,
    int32_t capacity,
    char *scratch,
    int32_t scratch_capacity,
    int32_t limit,
    int32_t *records,
    int64_t *next_positions,
    int32_t *count)
{
    *count = 0;
    if (!bc_capacity_ok(capacity) || scratch_capacity < 0 || limit < 0)
    {
        return FULMAR_BROADCAST_INVALID_ARGUMENT;
    }

    const int64_t lapped_before = receiver->lapped_count;
    int64_t first_position = 0;
    int32_t used = 0;
    int32_t n = 0;
    int32_t result = FULMAR_BROADCAST_RECEIVE_OK;

    while (n < limit)
    {
        const fulmar_broadcast_receiver_t before = *receiver;
        if (!fulmar_broadcast_receive_next(receiver, buffer, capacity))
        {
            break;
        }

        if (receiver->lapped_count != lapped_before)
        {
            /* Report the loss.  receive_next jumped to the latest record and
             * read its header unvalidated (it can be overwritten meanwhile, or
             * the process descheduled in between), so trust nothing derived
             * from it: resume at the latest record itself (read_position), to
             * be read and validated by the next call.  (Aeron's copy receiver
             * skips that record instead.) */
            receiver->next_record = receiver->read_position;
            result = FULMAR_BROADCAST_RECEIVE_LAPPED;
            break;
        }

        const int32_t offset = receiver->record_offset;
        const int32_t record_length = bc_get_length(buffer, offset);
        const int32_t msg_type_id = bc_get_type(buffer, offset);

        if (record_length < FULMAR_BROADCAST_RECORD_HEADER_LENGTH || record_length > capacity - offset)
        {
            /* A header no transmitter writes.  Never copy by it: resume at the
             * newest record, as after a lap.  It is reported as a lap, not as
             * corruption, even when the intent check passes: a stress test saw
             * such headers only while the receiver was being lapped under CPU
             * contention, and telling the two apart is not reliable here. */
            result = FULMAR_BROADCAST_RECEIVE_LAPPED;
            bc_resync(receiver, buffer, capacity);
            break;
        }

        const int32_t length = record_length - FULMAR_BROADCAST_RECORD_HEADER_LENGTH;
        if (length > scratch_capacity - used)
        {
            if (n > 0)
            {
                /* Deliver what we have; this record is the first of the next call. */
                *receiver = before;
                break;
            }
            if (bc_validate_at(buffer, capacity, receiver->read_position))
            {
                result = FULMAR_BROADCAST_RECEIVE_TOO_LONG;
            }
            else
            {
                result = FULMAR_BROADCAST_RECEIVE_LAPPED;
                bc_resync(receiver, buffer, capacity);
            }
            break;
        }

        memcpy(scratch + used, buffer + offset + FULMAR_BROADCAST_RECORD_HEADER_LENGTH, (size_t)length);
        if (0 == n)
        {
            first_position = receiver->read_position;
        }
        records[3 * n] = msg_type_id;
        records[3 * n + 1] = used;
        records[3 * n + 2] = length;
        next_positions[n] = receiver->next_record;
        n++;

        used += (int32_t)FULMAR_ALIGN(length, FULMAR_BROADCAST_RECORD_ALIGNMENT);
        if (used > scratch_capacity)
        {
            used = scratch_capacity;
        }
    }

    if (n > 0)
    {
        /* One check covers the batch: positions only grow, so if nothing from
         * the first position read on was overwritten by now, every copy is whole. */
        fa_acquire_fence();
        if (!bc_validate_at(buffer, capacity, first_position))
        {
            n = 0;
            if (FULMAR_BROADCAST_RECEIVE_OK == result)
            {
                /* Not yet repositioned by one of the paths above. */
                result = FULMAR_BROADCAST_RECEIVE_LAPPED;
                bc_resync(receiver, buffer, capacity);
            }
        }
    }

    *count = n;
    return result;
}

#define BC_PATTERN_MAX_LENGTH 4096

int32_t fulmar_broadcast_pattern_length(int64_t sequence, int32_t max_length)
{
    if (max_length <= 8)
    {
        return 8;
    }
    /* A multiplicative step spreads consecutive lengths over the whole range. */
    return 8 + (int32_t)((uint64_t)sequence * 7919u % (uint64_t)(max_length - 7));
}

int64_t fulmar_broadcast_transmit_pattern(
    char *buffer, int32_t capacity, int32_t msg_type_id, int64_t first_sequence, int64_t count, int32_t max_length)
{
    if (!bc_capacity_ok(capacity) || max_length < 8 || max_length > BC_PATTERN_MAX_LENGTH ||
        max_length > fulmar_broadcast_max_message_length(capacity) || msg_type_id < 1 || count < 0)
    {
        return -1;
    }

    char message[BC_PATTERN_MAX_LENGTH];
    const int64_t end = first_sequence + count;
    for (int64_t sequence = first_sequence; sequence < end; sequence++)
    {
        const int32_t length = fulmar_broadcast_pattern_length(sequence, max_length);
        memcpy(message, &sequence, sizeof(sequence));
        memset(message + 8, (int)(sequence & 0xff), (size_t)(length - 8));
        fulmar_broadcast_transmit(buffer, capacity, msg_type_id, message, length);
    }

    return end;
}
