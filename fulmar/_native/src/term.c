#include "_common.h"
#include "term.h"
#include "doorbell.h"

#include <zlib.h>

/* Log buffer metadata offsets (Aeron's LogBufferDescriptor). */
#define TERM_TAIL_COUNTERS_OFFSET 0
#define ACTIVE_TERM_COUNT_OFFSET 24
#define IS_CONNECTED_OFFSET 136

#define TYPE_OFFSET 6
#define TERM_OFFSET_OFFSET 8
#define SESSION_ID_OFFSET 12
#define STREAM_ID_OFFSET 16
#define TERM_ID_OFFSET 20
#define RESERVED_VALUE_OFFSET 24
#define MAX_MESSAGE_LENGTH_CAP (16 * 1024 * 1024)

/* Term ids are 32-bit and wrap; the difference of two of them (a term count)
 * is computed modulo 2^32 so that a wrapped id still counts forwards. */
static inline int32_t term_count_of(int32_t term_id, int32_t initial_term_id)
{
    return (int32_t)((uint32_t)term_id - (uint32_t)initial_term_id);
}

/* Term counts come from shared memory: taken as unsigned, a corrupt value
 * still names one of the three partitions. */
static inline int32_t partition_index(int32_t term_count)
{
    return (int32_t)((uint32_t)term_count % FULMAR_PARTITION_COUNT);
}

static inline int32_t next_term_id_of(int32_t term_id)
{
    return (int32_t)((uint32_t)term_id + 1u);
}

static inline int64_t pack_tail(int32_t term_id, int32_t term_offset)
{
    return (int64_t)(((uint64_t)(uint32_t)term_id << 32) | (uint32_t)term_offset);
}

static inline int32_t tail_term_id(int64_t raw_tail)
{
    return (int32_t)((uint64_t)raw_tail >> 32);
}

static inline int64_t tail_term_offset(int64_t raw_tail)
{
    return (int64_t)((uint64_t)raw_tail & 0xFFFFFFFFu);
}

static inline int64_t term_begin_position(const fulmar_log_writer_t *w, int32_t term_id)
{
    return (int64_t)((uint64_t)(uint32_t)term_count_of(term_id, w->initial_term_id) << w->position_bits_to_shift);
}

static inline int32_t fragmented_length(int32_t length, int32_t max_payload_length)
{
    int32_t full_frames = length / max_payload_length;
    int32_t remaining = length % max_payload_length;
    int32_t last_frame = remaining > 0 ? FULMAR_ALIGN(remaining + FULMAR_HEADER_LENGTH, FULMAR_FRAME_ALIGNMENT) : 0;
    return full_frames * (max_payload_length + FULMAR_HEADER_LENGTH) + last_frame;
}

static inline int32_t required_length(const fulmar_log_writer_t *w, int32_t length)
{
    if (length <= w->max_payload_length)
    {
        return FULMAR_ALIGN(length + FULMAR_HEADER_LENGTH, FULMAR_FRAME_ALIGNMENT);
    }
    return fragmented_length(length, w->max_payload_length);
}

/* Writes a frame header with a negative length: a reader stops at a frame
 * whose length is not yet positive, so it never sees a half-written frame.
 * The first word (length, version, flags, type) goes out as one release
 * store so the negative length is never seen with stale flags or type. */
static inline void write_header(
    char *frame, int32_t frame_length, uint8_t flags, int16_t type, int32_t term_offset,
    int32_t session_id, int32_t stream_id, int32_t term_id)
{
    uint64_t first_word = (uint64_t)(uint32_t)(-frame_length)
        | ((uint64_t)flags << 40)
        | ((uint64_t)(uint16_t)type << 48);
    fa_store_i64(frame, (int64_t)first_word);
    int32_t *fields = (int32_t *)frame;
    fields[2] = term_offset;
    fields[3] = session_id;
    fields[4] = stream_id;
    fields[5] = term_id;
}

static inline void write_padding(char *term, int32_t offset, int32_t length, const fulmar_log_writer_t *w, int32_t term_id)
{
    write_header(term + offset, length, FULMAR_FLAG_UNFRAGMENTED, FULMAR_FRAME_TYPE_PAD, offset, w->session_id, w->stream_id, term_id);
    fa_store_i32(term + offset, length);
}

/* The claim went past the end of the term: fill what is left of the term
 * with one padding frame so readers skip to the next term. */
static inline void pad_end_of_term(char *term, int64_t term_offset, const fulmar_log_writer_t *w, int32_t term_id)
{
    if (term_offset < w->term_length)
    {
        write_padding(term, (int32_t)term_offset, w->term_length - (int32_t)term_offset, w, term_id);
    }
}

static inline void write_message(
    char *term, int32_t offset, int32_t term_id, const fulmar_log_writer_t *w,
    const char *payload, int32_t length, int64_t reserved_value)
{
    if (length <= w->max_payload_length)
    {
        char *frame = term + offset;
        int32_t frame_length = length + FULMAR_HEADER_LENGTH;
        write_header(frame, frame_length, FULMAR_FLAG_UNFRAGMENTED, FULMAR_FRAME_TYPE_DATA, offset, w->session_id, w->stream_id, term_id);
        memcpy(frame + FULMAR_HEADER_LENGTH, payload, (size_t)length);
        *(int64_t *)(frame + RESERVED_VALUE_OFFSET) = reserved_value;
        fa_store_i32(frame, frame_length);
        return;
    }

    /* Fragments of one message occupy one contiguous claim, so a reader
     * always finds BEGIN ... END next to each other. */
    uint8_t flags = FULMAR_FLAG_BEGIN;
    int32_t remaining = length;
    do
    {
        int32_t chunk = remaining < w->max_payload_length ? remaining : w->max_payload_length;
        int32_t frame_length = chunk + FULMAR_HEADER_LENGTH;
        if (remaining <= w->max_payload_length)
        {
            flags |= FULMAR_FLAG_END;
        }
        char *frame = term + offset;
        write_header(frame, frame_length, flags, FULMAR_FRAME_TYPE_DATA, offset, w->session_id, w->stream_id, term_id);
        memcpy(frame + FULMAR_HEADER_LENGTH, payload + (length - remaining), (size_t)chunk);
        *(int64_t *)(frame + RESERVED_VALUE_OFFSET) = reserved_value;
        fa_store_i32(frame, frame_length);
        flags = 0;
        offset += FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
        remaining -= chunk;
    }
    while (remaining > 0);
}

/* Wakes what sleeps on the writer's doorbell (a media driver's sender) and
 * the log's readers; each costs a fence and a load when nobody sleeps. */
static inline void ring(char *doorbell, int32_t fd)
{
    if (fd >= 0)
    {
        fulmar_doorbell_ring_fifo(doorbell, 0, fd);
    }
    else
    {
        fulmar_doorbell_ring(doorbell, 0);
    }
}

static inline void ring_now(const fulmar_log_writer_t *w)
{
    if (NULL != w->doorbell)
    {
        ring(w->doorbell, w->doorbell_fd);
    }
    if (NULL != w->counters_values &&
        fulmar_log_ring_readers(w->metadata, w->counters_values, w->counters_values_length) &&
        NULL != w->relay_doorbell)
    {
        ring(w->relay_doorbell, w->relay_doorbell_fd);
    }
}

/* A writer that defers its rings (an agent appending a batch in one duty
 * cycle) only marks them pending: ringing after each append would wake the
 * reader for each message, and on two cores the woken reader takes the core
 * from the writer before the batch is done. */
static inline void ring_doorbell(fulmar_log_writer_t *w)
{
    if (w->defer_rings)
    {
        __atomic_store_n(&w->rings_pending, 1, __ATOMIC_RELEASE);
        return;
    }
    ring_now(w);
}

int32_t fulmar_log_writer_ring(fulmar_log_writer_t *w)
{
    /* An exchange, not a load and a store: an append that marks the ring
     * pending between the two would otherwise lose its ring. */
    if (!__atomic_exchange_n(&w->rings_pending, 0, __ATOMIC_ACQ_REL))
    {
        return 0;
    }
    ring_now(w);
    return 1;
}

static inline void count_messages(const fulmar_log_writer_t *w, int64_t count)
{
    if (NULL != w->messages_counter)
    {
        fa_get_and_add_i64(w->messages_counter, count);
    }
}

static inline int64_t position_limit_of(const fulmar_log_writer_t *w)
{
    return NULL == w->position_limit ? INT64_MAX : fa_load_i64(w->position_limit);
}

static inline int64_t back_pressure_status(const fulmar_log_writer_t *w, int64_t position, int32_t length)
{
    if (position + length >= w->max_possible_position)
    {
        return FULMAR_MAX_POSITION_EXCEEDED;
    }
    return fa_load_i32(w->metadata + IS_CONNECTED_OFFSET) ? FULMAR_BACK_PRESSURED : FULMAR_NOT_CONNECTED;
}

static inline int64_t check_length(const fulmar_log_writer_t *w, int32_t length)
{
    if (FULMAR_UNLIKELY(length < 0))
    {
        return FULMAR_INVALID_LENGTH;
    }
    if (FULMAR_UNLIKELY(length > w->max_message_length))
    {
        return FULMAR_MESSAGE_TOO_LONG;
    }
    return 0;
}

/* Moves the log on to the next term.  Any writer that trips the end of a
 * term may call this; the CASes make it happen exactly once. */
static void rotate_log(char *metadata, int32_t term_count, int32_t term_id)
{
    int32_t next_term_id = next_term_id_of(term_id);
    int32_t next_term_count = term_count + 1;
    int32_t next_index = partition_index(next_term_count);
    int32_t expected_term_id = (int32_t)((uint32_t)next_term_id - FULMAR_PARTITION_COUNT);
    char *tail_address = metadata + TERM_TAIL_COUNTERS_OFFSET + next_index * 8;
    int64_t raw_tail;
    do
    {
        raw_tail = fa_load_i64(tail_address);
        if (tail_term_id(raw_tail) != expected_term_id)
        {
            break;
        }
    }
    while (!fa_cas_i64(tail_address, raw_tail, pack_tail(next_term_id, 0)));
    fa_cas_i32(metadata + ACTIVE_TERM_COUNT_OFFSET, term_count, next_term_count);
}

int64_t fulmar_log_producer_position(
    const char *metadata, int32_t term_length, int32_t position_bits_to_shift, int32_t initial_term_id)
{
    int32_t term_count = fa_load_i32(metadata + ACTIVE_TERM_COUNT_OFFSET);
    int64_t raw_tail = fa_load_i64(metadata + TERM_TAIL_COUNTERS_OFFSET + partition_index(term_count) * 8);
    int64_t term_offset = tail_term_offset(raw_tail);
    if (term_offset > term_length)
    {
        term_offset = term_length; /* a tail past the end: the term is full */
    }
    uint32_t tail_term_count = (uint32_t)term_count_of(tail_term_id(raw_tail), initial_term_id);
    return (int64_t)((uint64_t)tail_term_count << position_bits_to_shift) + term_offset;
}

void fulmar_log_writer_init(
    fulmar_log_writer_t *w, char *log, int32_t term_length, int32_t mtu, int32_t initial_term_id,
    char *position_limit, int32_t session_id, int32_t stream_id)
{
    memset(w, 0, sizeof(*w));
    w->log = log;
    w->metadata = log + (int64_t)term_length * FULMAR_PARTITION_COUNT;
    w->position_limit = position_limit;
    w->term_length = term_length;
    w->position_bits_to_shift = __builtin_ctz((unsigned)term_length);
    /* Validated by the caller: not re-read from memory other processes can write. */
    w->initial_term_id = initial_term_id;
    w->max_payload_length = mtu - FULMAR_HEADER_LENGTH;
    w->max_message_length = term_length / 8 < MAX_MESSAGE_LENGTH_CAP ? term_length / 8 : MAX_MESSAGE_LENGTH_CAP;
    w->session_id = session_id;
    w->stream_id = stream_id;
    w->doorbell_fd = -1;
    w->relay_doorbell_fd = -1;
    w->max_possible_position = (int64_t)term_length * ((int64_t)1 << 31);

    /* The exclusive writer resumes wherever the log's active tail stands. */
    int32_t term_count = fa_load_i32(w->metadata + ACTIVE_TERM_COUNT_OFFSET);
    int32_t index = partition_index(term_count);
    int64_t raw_tail = fa_load_i64(w->metadata + TERM_TAIL_COUNTERS_OFFSET + index * 8);
    int64_t offset = tail_term_offset(raw_tail);
    w->term_id = tail_term_id(raw_tail);
    w->term_offset = (int32_t)(offset < term_length ? offset : term_length);
    w->active_partition_index = index;
    w->term_begin_position = term_begin_position(w, w->term_id);
}

/* Claims `required` bytes of the active term for a concurrent writer.  On
 * success returns the claimed term offset (>= 0) with *term_id_out and
 * *term_out set; otherwise a publication result code. */
static inline int64_t concurrent_claim_space(
    fulmar_log_writer_t *w, int32_t length, int32_t required, int32_t *term_id_out, char **term_out,
    int64_t *term_begin_out)
{
    int64_t limit = position_limit_of(w);
    int32_t term_count = fa_load_i32(w->metadata + ACTIVE_TERM_COUNT_OFFSET);
    int32_t index = partition_index(term_count);
    char *tail_address = w->metadata + TERM_TAIL_COUNTERS_OFFSET + index * 8;
    int64_t raw_tail = fa_load_i64(tail_address);
    int32_t term_id = tail_term_id(raw_tail);

    if (term_count != term_count_of(term_id, w->initial_term_id))
    {
        return FULMAR_ADMIN_ACTION; /* a rotation is under way */
    }

    int64_t term_begin = term_begin_position(w, term_id);
    int64_t position = term_begin + tail_term_offset(raw_tail);
    if (position >= limit)
    {
        return back_pressure_status(w, position, length);
    }

    char *term = w->log + (int64_t)index * w->term_length;
    int64_t claimed = fa_get_and_add_i64(tail_address, required);
    int32_t claimed_term_id = tail_term_id(claimed);
    int64_t claimed_offset = tail_term_offset(claimed);
    int64_t resulting_offset = claimed_offset + required;

    if (FULMAR_UNLIKELY(claimed_term_id != term_id))
    {
        /* This writer stalled across two rotations and claimed space in a
         * newer term than it looked at: cover the claim with padding so the
         * term has no hole, and let the caller retry. */
        if (resulting_offset <= w->term_length)
        {
            write_padding(term, (int32_t)claimed_offset, required, w, claimed_term_id);
        }
        else
        {
            pad_end_of_term(term, claimed_offset, w, claimed_term_id);
        }
        return FULMAR_ADMIN_ACTION;
    }

    if (resulting_offset > w->term_length)
    {
        pad_end_of_term(term, claimed_offset, w, term_id);
        if (term_begin + w->term_length >= w->max_possible_position)
        {
            return FULMAR_MAX_POSITION_EXCEEDED;
        }
        rotate_log(w->metadata, term_count, term_id);
        return FULMAR_ADMIN_ACTION;
    }

    *term_id_out = term_id;
    *term_out = term;
    *term_begin_out = term_begin;
    return claimed_offset;
}

int64_t fulmar_concurrent_offer(
    fulmar_log_writer_t *w, const char *payload, int32_t length, int64_t reserved_value)
{
    int64_t invalid = check_length(w, length);
    if (invalid)
    {
        return invalid;
    }
    int32_t required = required_length(w, length);
    int32_t term_id;
    char *term;
    int64_t term_begin;
    int64_t offset = concurrent_claim_space(w, length, required, &term_id, &term, &term_begin);
    if (offset < 0)
    {
        return offset;
    }
    write_message(term, (int32_t)offset, term_id, w, payload, length, reserved_value);
    count_messages(w, 1);
    ring_doorbell(w);
    return term_begin + offset + required;
}

int64_t fulmar_concurrent_claim(fulmar_log_writer_t *w, int32_t length, fulmar_claim_t *claim)
{
    if (length < 0 || length > w->max_payload_length)
    {
        return length < 0 ? FULMAR_INVALID_LENGTH : FULMAR_MESSAGE_TOO_LONG;
    }
    int32_t frame_length = length + FULMAR_HEADER_LENGTH;
    int32_t required = FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
    int32_t term_id;
    char *term;
    int64_t term_begin;
    int64_t offset = concurrent_claim_space(w, length, required, &term_id, &term, &term_begin);
    if (offset < 0)
    {
        return offset;
    }
    write_header(term + offset, frame_length, FULMAR_FLAG_UNFRAGMENTED, FULMAR_FRAME_TYPE_DATA, (int32_t)offset,
        w->session_id, w->stream_id, term_id);
    *(int64_t *)(term + offset + RESERVED_VALUE_OFFSET) = 0;
    claim->position = term_begin + offset;
    claim->frame_offset = (int32_t)((term - w->log) + offset);
    claim->frame_length = frame_length;
    count_messages(w, 1);
    return term_begin + offset + required;
}

/* The exclusive writer moves to the next term itself: nobody else writes. */
static int64_t exclusive_rotate(fulmar_log_writer_t *w)
{
    if (w->term_begin_position + w->term_length >= w->max_possible_position)
    {
        return FULMAR_MAX_POSITION_EXCEEDED;
    }
    int32_t next_index = (w->active_partition_index + 1) % FULMAR_PARTITION_COUNT;
    int32_t next_term_id = next_term_id_of(w->term_id);
    w->active_partition_index = next_index;
    w->term_offset = 0;
    w->term_id = next_term_id;
    w->term_begin_position += w->term_length;
    fa_store_i64(w->metadata + TERM_TAIL_COUNTERS_OFFSET + next_index * 8, pack_tail(next_term_id, 0));
    fa_store_i32(w->metadata + ACTIVE_TERM_COUNT_OFFSET, term_count_of(next_term_id, w->initial_term_id));
    return FULMAR_ADMIN_ACTION;
}

/* Reserves `required` bytes for the exclusive writer; returns the term
 * offset or a result code.  The tail is published before the frame so that
 * a concurrent observer of the tail (the driver) sees the space as taken. */
static inline int64_t exclusive_claim_space(fulmar_log_writer_t *w, int32_t length, int32_t required, int64_t limit)
{
    int64_t position = w->term_begin_position + w->term_offset;
    if (position >= limit)
    {
        return back_pressure_status(w, position, length);
    }
    int32_t offset = w->term_offset;
    int64_t resulting_offset = (int64_t)offset + required;
    char *tail_address = w->metadata + TERM_TAIL_COUNTERS_OFFSET + w->active_partition_index * 8;
    fa_store_i64(tail_address, pack_tail(w->term_id, (int32_t)resulting_offset));
    if (resulting_offset > w->term_length)
    {
        pad_end_of_term(w->log + (int64_t)w->active_partition_index * w->term_length, offset, w, w->term_id);
        return exclusive_rotate(w);
    }
    w->term_offset = (int32_t)resulting_offset;
    return offset;
}

int64_t fulmar_exclusive_offer(
    fulmar_log_writer_t *w, const char *payload, int32_t length, int64_t reserved_value)
{
    int64_t invalid = check_length(w, length);
    if (invalid)
    {
        return invalid;
    }
    int32_t required = required_length(w, length);
    int64_t offset = exclusive_claim_space(w, length, required, position_limit_of(w));
    if (offset < 0)
    {
        return offset;
    }
    char *term = w->log + (int64_t)w->active_partition_index * w->term_length;
    write_message(term, (int32_t)offset, w->term_id, w, payload, length, reserved_value);
    count_messages(w, 1);
    ring_doorbell(w);
    return w->term_begin_position + w->term_offset;
}

int64_t fulmar_exclusive_claim(fulmar_log_writer_t *w, int32_t length, fulmar_claim_t *claim)
{
    if (length < 0 || length > w->max_payload_length)
    {
        return length < 0 ? FULMAR_INVALID_LENGTH : FULMAR_MESSAGE_TOO_LONG;
    }
    int32_t frame_length = length + FULMAR_HEADER_LENGTH;
    int32_t required = FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
    int64_t offset = exclusive_claim_space(w, length, required, position_limit_of(w));
    if (offset < 0)
    {
        return offset;
    }
    char *term = w->log + (int64_t)w->active_partition_index * w->term_length;
    write_header(term + offset, frame_length, FULMAR_FLAG_UNFRAGMENTED, FULMAR_FRAME_TYPE_DATA, (int32_t)offset,
        w->session_id, w->stream_id, w->term_id);
    *(int64_t *)(term + offset + RESERVED_VALUE_OFFSET) = 0;
    claim->position = w->term_begin_position + offset;
    claim->frame_offset = (int32_t)((term - w->log) + offset);
    claim->frame_length = frame_length;
    count_messages(w, 1);
    return w->term_begin_position + w->term_offset;
}

int64_t fulmar_exclusive_offer_batch(
    fulmar_log_writer_t *w, const char *data, const int32_t *lengths, int32_t count,
    int64_t reserved_value, int32_t *appended)
{
    int64_t limit = position_limit_of(w);
    int64_t result = 0;
    int32_t i = 0;
    const char *payload = data;
    while (i < count)
    {
        int32_t length = lengths[i];
        result = check_length(w, length);
        if (result)
        {
            break;
        }
        int32_t required = required_length(w, length);
        int64_t offset = exclusive_claim_space(w, length, required, limit);
        if (FULMAR_ADMIN_ACTION == offset)
        {
            continue; /* rotated to a fresh term: the same message fits there */
        }
        if (offset < 0)
        {
            result = offset;
            break;
        }
        char *term = w->log + (int64_t)w->active_partition_index * w->term_length;
        write_message(term, (int32_t)offset, w->term_id, w, payload, length, reserved_value);
        payload += length;
        result = w->term_begin_position + w->term_offset;
        i++;
    }
    *appended = i;
    if (i > 0)
    {
        count_messages(w, i);
        ring_doorbell(w);
    }
    return i > 0 ? w->term_begin_position + w->term_offset : result;
}

int64_t fulmar_exclusive_append_block(fulmar_log_writer_t *w, const char *block, int32_t length)
{
    if (w->term_offset >= w->term_length)
    {
        /* The previous block filled the term exactly: move on first. */
        return exclusive_rotate(w);
    }
    int32_t offset = w->term_offset;
    if (length <= 0 || (length & (FULMAR_FRAME_ALIGNMENT - 1)) || length > w->term_length - offset)
    {
        return FULMAR_INVALID_BLOCK;
    }
    int64_t position = w->term_begin_position + offset;
    if (position + length > position_limit_of(w))
    {
        return back_pressure_status(w, position, length);
    }
    /* Check the frames before touching the log: a corrupt block must not
     * leave a half-published term behind. */
    int64_t data_frames = 0;
    for (int32_t at = 0; at < length;)
    {
        int32_t frame_length = *(const int32_t *)(block + at);
        int32_t aligned = FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
        if (frame_length < FULMAR_HEADER_LENGTH || aligned > length - at ||
            *(const int32_t *)(block + at + TERM_OFFSET_OFFSET) != offset + at ||
            *(const int32_t *)(block + at + TERM_ID_OFFSET) != w->term_id)
        {
            return FULMAR_INVALID_BLOCK;
        }
        data_frames += FULMAR_FRAME_TYPE_DATA == *(const uint16_t *)(block + at + TYPE_OFFSET);
        at += aligned;
    }
    char *term = w->log + (int64_t)w->active_partition_index * w->term_length;
    char *dst = term + offset;
    fa_store_i64(w->metadata + TERM_TAIL_COUNTERS_OFFSET + w->active_partition_index * 8,
        pack_tail(w->term_id, offset + length));
    memcpy(dst + 4, block + 4, (size_t)length - 4);
    for (int32_t at = 0; at < length;)
    {
        *(int32_t *)(dst + at + SESSION_ID_OFFSET) = w->session_id;
        *(int32_t *)(dst + at + STREAM_ID_OFFSET) = w->stream_id;
        at += FULMAR_ALIGN(*(const int32_t *)(block + at), FULMAR_FRAME_ALIGNMENT);
    }
    fa_store_i32(dst, *(const int32_t *)block);
    w->term_offset = offset + length;
    count_messages(w, data_frames);
    ring_doorbell(w);
    return w->term_begin_position + w->term_offset;
}

void fulmar_claim_commit(fulmar_log_writer_t *w, const fulmar_claim_t *claim)
{
    fa_store_i32(w->log + claim->frame_offset, claim->frame_length);
    ring_doorbell(w);
}

void fulmar_claim_abort(char *log, const fulmar_claim_t *claim)
{
    char *frame = log + claim->frame_offset;
    *(int16_t *)(frame + 6) = FULMAR_FRAME_TYPE_PAD;
    fa_store_i32(frame, claim->frame_length);
}

int32_t fulmar_log_scan(
    const char *log, int32_t term_length, int32_t initial_term_id, int64_t position,
    int64_t limit_position, int32_t fragment_limit, fulmar_fragment_batch_t *batch)
{
    int32_t bits = __builtin_ctz((unsigned)term_length);
    int32_t index = (int32_t)((position >> bits) % FULMAR_PARTITION_COUNT);
    int32_t term_offset = (int32_t)(position & (term_length - 1));
    int64_t term_base = (int64_t)index * term_length;
    const char *term = log + term_base;
    int64_t limit_offset = (int64_t)term_offset + (limit_position - position);
    if (limit_offset > term_length)
    {
        limit_offset = term_length;
    }
    if (fragment_limit > FULMAR_BATCH_CAPACITY)
    {
        fragment_limit = FULMAR_BATCH_CAPACITY;
    }

    int32_t count = 0;
    int32_t offset = term_offset;
    int32_t result = 0;
    while (count < fragment_limit && offset < limit_offset)
    {
        int32_t frame_length = fa_load_i32(term + offset);
        if (frame_length <= 0)
        {
            break; /* nothing here yet, or a frame still being written */
        }
        int16_t type = *(const int16_t *)(term + offset + 6);
        /* Bound the raw length before aligning it: aligning a garbage length
         * near INT32_MAX would overflow.  The space left in the term is a
         * multiple of the alignment, so the aligned length fits too. */
        if (frame_length < FULMAR_HEADER_LENGTH || frame_length > term_length - offset ||
            (FULMAR_FRAME_TYPE_DATA != type && FULMAR_FRAME_TYPE_PAD != type))
        {
            result = FULMAR_SCAN_CORRUPT_FRAME;
            break;
        }
        int32_t aligned_length = FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
        if (offset + aligned_length > limit_offset)
        {
            break; /* the frame ends beyond what the caller may read */
        }
        if (FULMAR_FRAME_TYPE_DATA == type)
        {
            batch->frame_offsets[count] = (int32_t)(term_base + offset);
            batch->frame_lengths[count] = frame_length;
            batch->flags[count] = (uint8_t)term[offset + 5];
            count++;
        }
        offset += aligned_length;
    }

    batch->count = count;
    batch->next_position = position + (offset - term_offset);
    /* Deliver what was good; the corruption is reported once nothing precedes it. */
    return count > 0 ? count : result;
}

int32_t fulmar_batch_session_messages(
    const char *log, const fulmar_fragment_batch_t *batch, int32_t first, int64_t position, int32_t term_length,
    fulmar_session_messages_t *out)
{
    /* The scan's first byte, as an offset from the log's start like frame_offsets. */
    int32_t bits = __builtin_ctz((unsigned)term_length);
    int64_t scan_start = (int64_t)((position >> bits) % FULMAR_PARTITION_COUNT) * term_length +
                         (position & (term_length - 1));
    int32_t run = 0;
    for (int32_t i = first; i < batch->count; i++)
    {
        if (FULMAR_FLAG_UNFRAGMENTED != (batch->flags[i] & FULMAR_FLAG_UNFRAGMENTED) ||
            batch->frame_lengths[i] < FULMAR_HEADER_LENGTH + FULMAR_SESSION_HEADER_LENGTH)
        {
            break;
        }
        const char *message = log + batch->frame_offsets[i] + FULMAR_HEADER_LENGTH;
        uint16_t block_length, template_id, schema_id;
        memcpy(&block_length, message, sizeof(block_length));
        memcpy(&template_id, message + 2, sizeof(template_id));
        memcpy(&schema_id, message + 4, sizeof(schema_id));
        if (FULMAR_SESSION_MESSAGE_BLOCK_LENGTH != block_length ||
            FULMAR_SESSION_MESSAGE_TEMPLATE_ID != template_id || FULMAR_CLUSTER_SCHEMA_ID != schema_id)
        {
            break;
        }
        /* The block follows the 8-byte SBE header: leadershipTermId, clusterSessionId, timestamp. */
        memcpy(&out->leadership_term_ids[run], message + 8, sizeof(int64_t));
        memcpy(&out->session_ids[run], message + 8 + 8, sizeof(int64_t));
        memcpy(&out->timestamps[run], message + 8 + 16, sizeof(int64_t));
        int64_t frame_end = batch->frame_offsets[i] + FULMAR_ALIGN(batch->frame_lengths[i], FULMAR_FRAME_ALIGNMENT);
        out->end_positions[run] = position + (frame_end - scan_start);
        out->message_offsets[run] = batch->frame_offsets[i] + FULMAR_HEADER_LENGTH;
        out->message_lengths[run] = batch->frame_lengths[i] - FULMAR_HEADER_LENGTH;
        run++;
    }
    return run;
}

int64_t fulmar_bench_exclusive_append_scan(
    fulmar_log_writer_t *w, int32_t message_length, int64_t message_count, fulmar_fragment_batch_t *batch)
{
    char payload[4096];
    memset(payload, 'x', sizeof(payload));
    if (message_length > (int32_t)sizeof(payload))
    {
        return -1;
    }
    int64_t limit_word = 0;
    char *saved_limit = w->position_limit;
    w->position_limit = (char *)&limit_word;
    int64_t window = w->term_length / 2;
    int64_t read_position = w->term_begin_position + w->term_offset;
    limit_word = read_position + window;
    int64_t sent = 0, received = 0;
    int64_t checksum = 0;

    while (received < message_count)
    {
        while (sent < message_count)
        {
            int64_t result = fulmar_exclusive_offer(w, payload, message_length, 0);
            if (result > 0)
            {
                sent++;
            }
            else if (FULMAR_ADMIN_ACTION != result)
            {
                break;
            }
        }
        int32_t n;
        do
        {
            n = fulmar_log_scan(w->log, w->term_length, w->initial_term_id, read_position,
                INT64_MAX, FULMAR_BATCH_CAPACITY, batch);
            for (int32_t i = 0; i < n; i++)
            {
                checksum += w->log[batch->frame_offsets[i] + FULMAR_HEADER_LENGTH];
            }
            if (n > 0)
            {
                received += n;
            }
            if (batch->next_position > read_position)
            {
                fulmar_log_clean(w->log, w->term_length, read_position, batch->next_position);
                read_position = batch->next_position;
            }
        }
        while (n > 0 || batch->next_position < w->term_begin_position + w->term_offset);
        limit_word = read_position + window;
    }
    w->position_limit = saved_limit;
    return checksum > 0 ? received : -1;
}

void fulmar_log_clean(char *log, int32_t term_length, int64_t from_position, int64_t to_position)
{
    int32_t bits = __builtin_ctz((unsigned)term_length);
    int64_t position = from_position;
    while (position < to_position)
    {
        int32_t index = (int32_t)((position >> bits) % FULMAR_PARTITION_COUNT);
        int32_t term_offset = (int32_t)(position & (term_length - 1));
        int64_t length = to_position - position;
        if (length > term_length - term_offset)
        {
            length = term_length - term_offset;
        }
        char *start = log + (int64_t)index * term_length + term_offset;
        /* Clear the first word last so the region never looks like a frame
         * header in front of stale bytes. */
        if (length > 8)
        {
            memset(start + 8, 0, (size_t)(length - 8));
        }
        fa_store_i64(start, 0);
        position += length;
    }
}

int32_t fulmar_term_scan_for_availability(
    const char *term, int32_t term_length, int32_t term_offset, int32_t max_length, int32_t *padding)
{
    int32_t available = 0;
    *padding = 0;
    int32_t limit = term_length - term_offset < max_length ? term_length - term_offset : max_length;
    while (available < limit)
    {
        int32_t offset = term_offset + available;
        int32_t frame_length = fa_load_i32(term + offset);
        if (frame_length <= 0 || frame_length > term_length - offset)
        {
            break;
        }
        int32_t aligned_length = FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
        if (FULMAR_FRAME_TYPE_PAD == *(const int16_t *)(term + offset + 6))
        {
            /* Send the padding's header so the receiver learns of it; skip its body. */
            *padding = aligned_length - FULMAR_HEADER_LENGTH;
            aligned_length = FULMAR_HEADER_LENGTH;
            if (available + aligned_length <= limit)
            {
                available += aligned_length;
            }
            else
            {
                *padding = 0;
            }
            break;
        }
        if (available + aligned_length > limit)
        {
            break;
        }
        available += aligned_length;
    }
    return available;
}

int32_t fulmar_term_pack_datagrams(
    const char *log, int32_t term_length, int64_t position, int64_t max_length, int32_t mtu,
    int32_t max_datagrams, int32_t *regions, int64_t *advance)
{
    const int32_t bits = __builtin_ctz((unsigned)term_length);
    const int64_t partition_base = (int64_t)((position >> bits) % FULMAR_PARTITION_COUNT) * term_length;
    const char *term = log + partition_base;
    int32_t offset = (int32_t)(position & (term_length - 1));
    int32_t count = 0;
    int64_t advanced = 0;
    while (max_length > advanced && count < max_datagrams && offset < term_length)
    {
        int32_t padding = 0;
        const int64_t room = max_length - advanced;
        const int32_t length = room < mtu ? (int32_t)room : mtu;
        const int32_t available = fulmar_term_scan_for_availability(term, term_length, offset, length, &padding);
        if (available <= 0)
        {
            break;
        }
        regions[2 * count] = (int32_t)(partition_base + offset);
        regions[2 * count + 1] = available;
        count++;
        offset += available + padding;
        advanced += available + padding;
        if (0 != padding)
        {
            break;  /* a term ends with its padding */
        }
    }
    *advance = advanced;
    return count;
}

int32_t fulmar_term_block_scan(const char *term, int32_t term_offset, int32_t limit_offset)
{
    int32_t offset = term_offset;
    while (offset < limit_offset)
    {
        int32_t frame_length = fa_load_i32(term + offset);
        if (frame_length < FULMAR_HEADER_LENGTH)
        {
            break; /* not committed yet (0 or negative), or not a frame at all */
        }
        int32_t aligned_length = FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
        if (aligned_length > limit_offset - offset)
        {
            break; /* a block is whole frames: this one waits for the next */
        }
        offset += aligned_length;
    }
    return offset;
}

int32_t fulmar_record_checksums(char *block, int32_t length)
{
    int32_t offset = 0;
    while (offset < length)
    {
        int32_t frame_length;
        int16_t frame_type;
        memcpy(&frame_length, block + offset, sizeof(frame_length));
        memcpy(&frame_type, block + offset + TYPE_OFFSET, sizeof(frame_type));
        if (frame_length < FULMAR_HEADER_LENGTH)
        {
            return FULMAR_CHECKSUM_BAD_FRAME - offset;
        }
        const int64_t aligned = FULMAR_ALIGN((int64_t)frame_length, FULMAR_FRAME_ALIGNMENT);
        if (aligned > length - offset)
        {
            break;
        }
        if (FULMAR_FRAME_TYPE_DATA == frame_type)
        {
            const uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)(block + offset + FULMAR_HEADER_LENGTH),
                                                 (uInt)(aligned - FULMAR_HEADER_LENGTH));
            memcpy(block + offset + SESSION_ID_OFFSET, &crc, sizeof(crc));
        }
        offset += (int32_t)aligned;
    }
    return offset;
}
