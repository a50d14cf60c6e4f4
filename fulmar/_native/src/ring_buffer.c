#include "_common.h"
#include "ring_buffer.h"

/* Record layout: length i32 @0, msg_type_id i32 @4, body @8, records aligned to 8.
 * A positive length means "committed"; a negative length means "claimed, being
 * written"; zero means "nothing here yet" (the reader zeroes what it consumes). */
#define RB_LENGTH_OFFSET(index) (index)
#define RB_TYPE_OFFSET(index) ((index) + 4)
#define RB_BODY_OFFSET(index) ((index) + FULMAR_RB_RECORD_HEADER_LENGTH)

#define RB_BENCH_MAX_LENGTH 1024
#define RB_BENCH_MAX_BATCH 256

static inline char *rb_trailer(char *buffer, int32_t capacity)
{
    return buffer + capacity;
}

static inline void rb_put_type(char *buffer, int32_t index, int32_t msg_type_id)
{
    /* Plain store: the release store of the length that follows publishes it. */
    memcpy(buffer + RB_TYPE_OFFSET(index), &msg_type_id, sizeof(msg_type_id));
}

static inline int32_t rb_get_type(const char *buffer, int32_t index)
{
    int32_t msg_type_id;
    memcpy(&msg_type_id, buffer + RB_TYPE_OFFSET(index), sizeof(msg_type_id));
    return msg_type_id;
}

int32_t fulmar_rb_max_message_length(int32_t capacity)
{
    if (capacity <= FULMAR_RB_RECORD_HEADER_LENGTH)
    {
        return 0;
    }
    int32_t max_length = capacity >> 3;
    return max_length > FULMAR_RB_RECORD_HEADER_LENGTH ? max_length : FULMAR_RB_RECORD_HEADER_LENGTH;
}

static bool rb_capacity_ok(int32_t capacity)
{
    return capacity >= FULMAR_RB_RECORD_HEADER_LENGTH && (capacity & (capacity - 1)) == 0;
}

/* Reserve `required` (aligned) bytes for one record by CAS on the tail, the only
 * point where producers contend.  Returns the record's index, or FULMAR_RB_FULL.
 *
 * Follows Agrona's ManyToOneRingBuffer.claimCapacity: the head is first taken
 * from the head cache (a producer-side copy that spares the consumer's cache
 * line) and only re-read when the cached value says "no room".  A record never
 * straddles the end of the ring: the remainder is claimed as padding in the same
 * CAS.  When the record does not fit at the start either, the padding is still
 * claimed on its own, so that the next attempt starts at index 0. */
static int32_t rb_claim_capacity(char *buffer, int32_t capacity, int32_t required)
{
    char *trailer = rb_trailer(buffer, capacity);
    const int32_t mask = capacity - 1;
    int64_t head = fa_load_i64(trailer + FULMAR_RB_HEAD_CACHE_POSITION_OFFSET);
    int64_t tail;
    int64_t new_tail;
    int32_t tail_index;
    int32_t padding;
    int32_t write_index;

    do
    {
        tail = fa_load_i64(trailer + FULMAR_RB_TAIL_POSITION_OFFSET);

        if (required > capacity - (int32_t)(tail - head))
        {
            head = fa_load_i64(trailer + FULMAR_RB_HEAD_POSITION_OFFSET);
            if (required > capacity - (int32_t)(tail - head))
            {
                return FULMAR_RB_FULL;
            }
            fa_store_i64(trailer + FULMAR_RB_HEAD_CACHE_POSITION_OFFSET, head);
        }

        new_tail = tail + required;
        padding = 0;
        tail_index = (int32_t)(tail & mask);
        write_index = tail_index;
        const int32_t to_buffer_end = capacity - tail_index;

        if (required > to_buffer_end)
        {
            /* Wrapping: the record goes to index 0, which must already be consumed. */
            int32_t head_index = (int32_t)(head & mask);
            write_index = 0;

            if (required > head_index)
            {
                head = fa_load_i64(trailer + FULMAR_RB_HEAD_POSITION_OFFSET);
                head_index = (int32_t)(head & mask);
                if (required > head_index)
                {
                    /* Claim only the padding to the end; report full. */
                    write_index = FULMAR_RB_FULL;
                    new_tail = tail;
                }
                fa_store_i64(trailer + FULMAR_RB_HEAD_CACHE_POSITION_OFFSET, head);
            }

            padding = to_buffer_end;
            new_tail += padding;
        }
    }
    while (!fa_cas_i64(trailer + FULMAR_RB_TAIL_POSITION_OFFSET, tail, new_tail));

    if (0 != padding)
    {
        /* Same three steps as a message, so unblock() and the reader never see a
         * half-written padding record as committed. */
        fa_store_i32(buffer + RB_LENGTH_OFFSET(tail_index), -padding);
        fa_release_fence();
        rb_put_type(buffer, tail_index, FULMAR_RB_PADDING_MSG_TYPE_ID);
        fa_store_i32(buffer + RB_LENGTH_OFFSET(tail_index), padding);
    }

    return write_index;
}

static bool rb_message_ok(int32_t capacity, int32_t msg_type_id, int32_t length)
{
    /* Type ids below 1 are reserved (-1 is padding). */
    return rb_capacity_ok(capacity) && msg_type_id >= 1 && length >= 0 &&
        length <= fulmar_rb_max_message_length(capacity);
}

/* Mark a freshly claimed record as "being written": the negative length goes
 * out before any body byte (the release fence orders the stores), so that
 * unblock() never mistakes body bytes of a live record for a record header. */
static inline void rb_begin_record(char *buffer, int32_t index, int32_t record_length)
{
    fa_store_i32(buffer + RB_LENGTH_OFFSET(index), -record_length);
    fa_release_fence();
}

int32_t fulmar_rb_write(char *buffer, int32_t capacity, int32_t msg_type_id, const char *msg, int32_t length)
{
    if (!rb_message_ok(capacity, msg_type_id, length))
    {
        return FULMAR_RB_INVALID_ARGUMENT;
    }

    const int32_t record_length = length + FULMAR_RB_RECORD_HEADER_LENGTH;
    const int32_t index = rb_claim_capacity(
        buffer, capacity, (int32_t)FULMAR_ALIGN(record_length, FULMAR_RB_ALIGNMENT));
    if (index < 0)
    {
        return FULMAR_RB_FULL;
    }

    rb_begin_record(buffer, index, record_length);
    memcpy(buffer + RB_BODY_OFFSET(index), msg, (size_t)length);
    rb_put_type(buffer, index, msg_type_id);
    /* Release: the reader's acquire load of a positive length sees the body. */
    fa_store_i32(buffer + RB_LENGTH_OFFSET(index), record_length);

    return FULMAR_RB_OK;
}

int32_t fulmar_rb_try_claim(char *buffer, int32_t capacity, int32_t msg_type_id, int32_t length)
{
    if (!rb_message_ok(capacity, msg_type_id, length))
    {
        return FULMAR_RB_INVALID_ARGUMENT;
    }

    const int32_t record_length = length + FULMAR_RB_RECORD_HEADER_LENGTH;
    const int32_t index = rb_claim_capacity(
        buffer, capacity, (int32_t)FULMAR_ALIGN(record_length, FULMAR_RB_ALIGNMENT));
    if (index < 0)
    {
        return FULMAR_RB_FULL;
    }

    rb_begin_record(buffer, index, record_length);
    rb_put_type(buffer, index, msg_type_id);

    return RB_BODY_OFFSET(index);
}

/* Map a body offset from try_claim back to its record, checking that it still
 * holds an unreleased claim.  Returns the record index or a negative result. */
static int32_t rb_claimed_record(char *buffer, int32_t capacity, int32_t index, int32_t *record_length)
{
    const int32_t record_index = index - FULMAR_RB_RECORD_HEADER_LENGTH;
    if (!rb_capacity_ok(capacity) || record_index < 0 || record_index > capacity - FULMAR_RB_RECORD_HEADER_LENGTH ||
        (record_index & (FULMAR_RB_ALIGNMENT - 1)) != 0)
    {
        return FULMAR_RB_INVALID_ARGUMENT;
    }

    *record_length = fa_load_i32(buffer + RB_LENGTH_OFFSET(record_index));
    if (*record_length >= 0)
    {
        return FULMAR_RB_ALREADY_RELEASED;
    }

    return record_index;
}

int32_t fulmar_rb_commit(char *buffer, int32_t capacity, int32_t index)
{
    int32_t record_length = 0;
    const int32_t record_index = rb_claimed_record(buffer, capacity, index, &record_length);
    if (record_index < 0)
    {
        return record_index;
    }

    fa_store_i32(buffer + RB_LENGTH_OFFSET(record_index), -record_length);
    return FULMAR_RB_OK;
}

int32_t fulmar_rb_abort(char *buffer, int32_t capacity, int32_t index)
{
    int32_t record_length = 0;
    const int32_t record_index = rb_claimed_record(buffer, capacity, index, &record_length);
    if (record_index < 0)
    {
        return record_index;
    }

    rb_put_type(buffer, record_index, FULMAR_RB_PADDING_MSG_TYPE_ID);
    fa_store_i32(buffer + RB_LENGTH_OFFSET(record_index), -record_length);
    return FULMAR_RB_OK;
}

int32_t fulmar_rb_scan(char *buffer, int32_t capacity, int32_t limit, int32_t *records, int32_t *out)
{
    out[0] = 0;
    out[1] = FULMAR_RB_SCAN_OK;
    if (!rb_capacity_ok(capacity))
    {
        out[1] = FULMAR_RB_SCAN_CORRUPT;
        return 0;
    }

    /* Only this consumer moves the head; the acquire is for a consumer that
     * changed process or thread since the previous call. */
    const int64_t head = fa_load_i64(rb_trailer(buffer, capacity) + FULMAR_RB_HEAD_POSITION_OFFSET);
    const int32_t head_index = (int32_t)(head & (capacity - 1));
    /* One call never wraps: the batch is one contiguous block, like Aeron's read. */
    const int32_t block_length = capacity - head_index;
    int32_t bytes = 0;
    int32_t count = 0;

    while (bytes < block_length && count < limit)
    {
        const int32_t index = head_index + bytes;
        /* Acquire pairs with the producer's release of a positive length. */
        const int32_t record_length = fa_load_i32(buffer + RB_LENGTH_OFFSET(index));
        if (record_length <= 0)
        {
            break;
        }

        const int32_t aligned_length = (int32_t)FULMAR_ALIGN(record_length, FULMAR_RB_ALIGNMENT);
        if (record_length < FULMAR_RB_RECORD_HEADER_LENGTH || aligned_length > block_length - bytes)
        {
            /* No producer writes such a record: stop before it, loudly. */
            out[1] = FULMAR_RB_SCAN_CORRUPT;
            break;
        }

        bytes += aligned_length;
        const int32_t msg_type_id = rb_get_type(buffer, index);
        if (FULMAR_RB_PADDING_MSG_TYPE_ID == msg_type_id)
        {
            continue;
        }

        records[3 * count] = msg_type_id;
        records[3 * count + 1] = RB_BODY_OFFSET(index);
        records[3 * count + 2] = record_length - FULMAR_RB_RECORD_HEADER_LENGTH;
        count++;
    }

    out[0] = bytes;
    return count;
}

int32_t fulmar_rb_consume(char *buffer, int32_t capacity, int32_t length)
{
    if (!rb_capacity_ok(capacity))
    {
        return FULMAR_RB_INVALID_ARGUMENT;
    }

    char *trailer = rb_trailer(buffer, capacity);
    const int64_t head = fa_load_i64(trailer + FULMAR_RB_HEAD_POSITION_OFFSET);
    const int32_t head_index = (int32_t)(head & (capacity - 1));
    if (length <= 0 || length > capacity - head_index || (length & (FULMAR_RB_ALIGNMENT - 1)) != 0)
    {
        return FULMAR_RB_INVALID_ARGUMENT;
    }

    /* Zero before publishing the new head: a producer that sees the new head
     * (acquire) finds zeroed space, which the reader relies on to stop at a
     * record that has been claimed but whose header is not yet written. */
    memset(buffer + head_index, 0, (size_t)length);
    fa_store_i64(trailer + FULMAR_RB_HEAD_POSITION_OFFSET, head + length);

    return FULMAR_RB_OK;
}

/* True when every 8-byte slot in [limit, from) still has a zero length word. */
static bool rb_scan_back_still_zeroed(char *buffer, int32_t from, int32_t limit)
{
    for (int32_t i = from - FULMAR_RB_ALIGNMENT; i >= limit; i -= FULMAR_RB_ALIGNMENT)
    {
        if (0 != fa_load_i32(buffer + i))
        {
            return false;
        }
    }
    return true;
}

bool fulmar_rb_unblock(char *buffer, int32_t capacity)
{
    if (!rb_capacity_ok(capacity))
    {
        return false;
    }

    char *trailer = rb_trailer(buffer, capacity);
    const int64_t head = fa_load_i64(trailer + FULMAR_RB_HEAD_POSITION_OFFSET);
    const int64_t tail = fa_load_i64(trailer + FULMAR_RB_TAIL_POSITION_OFFSET);
    if (head == tail)
    {
        return false;
    }

    const int32_t mask = capacity - 1;
    const int32_t consumer_index = (int32_t)(head & mask);
    const int32_t producer_index = (int32_t)(tail & mask);
    int32_t length = fa_load_i32(buffer + RB_LENGTH_OFFSET(consumer_index));

    if (length < 0)
    {
        /* The producer wrote its header and died before committing: skip the
         * record as padding of the length it claimed. */
        rb_put_type(buffer, consumer_index, FULMAR_RB_PADDING_MSG_TYPE_ID);
        fa_store_i32(buffer + RB_LENGTH_OFFSET(consumer_index), -length);
        return true;
    }

    if (0 == length)
    {
        /* The producer died between its CAS and writing the header.  Its
         * region is still zero (the reader zeroed it); the first non-zero
         * length word after it is the next record.  Pad up to there, but only
         * if the gap is still all zero, i.e. the producer is not merely slow. */
        const int32_t limit = producer_index > consumer_index ? producer_index : capacity;
        for (int32_t i = consumer_index + FULMAR_RB_ALIGNMENT; i < limit; i += FULMAR_RB_ALIGNMENT)
        {
            if (0 != fa_load_i32(buffer + i))
            {
                if (rb_scan_back_still_zeroed(buffer, i, consumer_index))
                {
                    rb_put_type(buffer, consumer_index, FULMAR_RB_PADDING_MSG_TYPE_ID);
                    fa_store_i32(buffer + RB_LENGTH_OFFSET(consumer_index), i - consumer_index);
                    return true;
                }
                return false;
            }
        }
    }

    return false;
}

int64_t fulmar_rb_bench(char *buffer, int32_t capacity, int64_t message_count, int32_t length, int32_t batch)
{
    if (!rb_capacity_ok(capacity) || length < 0 || length > RB_BENCH_MAX_LENGTH ||
        length > fulmar_rb_max_message_length(capacity) || batch < 1 || batch > RB_BENCH_MAX_BATCH ||
        message_count < 0)
    {
        return -1;
    }

    char payload[RB_BENCH_MAX_LENGTH];
    int32_t records[3 * RB_BENCH_MAX_BATCH];
    int32_t out[2];
    memset(payload, 0x5a, sizeof(payload));

    int64_t written = 0;
    int64_t read = 0;
    /* Touch every delivered message like a handler would, so the read side does
     * the same work as the Python loop it is compared with. */
    volatile int64_t checksum = 0;

    while (read < message_count)
    {
        for (int32_t i = 0; i < batch && written < message_count; i++)
        {
            if (FULMAR_RB_OK != fulmar_rb_write(buffer, capacity, 1, payload, length))
            {
                break;
            }
            written++;
        }

        for (;;)
        {
            const int32_t count = fulmar_rb_scan(buffer, capacity, RB_BENCH_MAX_BATCH, records, out);
            for (int32_t i = 0; i < count; i++)
            {
                checksum += records[3 * i] + records[3 * i + 2];
            }
            if (out[0] == 0)
            {
                break;
            }
            fulmar_rb_consume(buffer, capacity, out[0]);
            read += count;
        }
    }

    (void)checksum;
    return read;
}
