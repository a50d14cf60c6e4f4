#include "_common.h"
#include "rebuild.h"
#include "term.h"

#define TERM_OFFSET_FIELD 8
#define SESSION_ID_FIELD 12
#define STREAM_ID_FIELD 16
#define TERM_ID_FIELD 20

static inline bool is_frame_aligned(int32_t offset)
{
    return 0 == (offset & (FULMAR_FRAME_ALIGNMENT - 1));
}

/* Walks the frames of a datagram exactly as the insert will, and says why
 * it must not be written, or 0.  Every check happens before the first byte
 * is written, so a rejected datagram leaves the term untouched. */
static int32_t check_datagram(int32_t term_length, int32_t term_offset, const char *datagram, int32_t length)
{
    if (length < FULMAR_HEADER_LENGTH)
    {
        return FULMAR_REBUILD_BAD_LENGTH;
    }
    if (length > term_length - term_offset)
    {
        return FULMAR_REBUILD_OVERRUNS_TERM;
    }

    /* Every frame of a datagram comes from one term of one stream: a frame
     * that names another place would be delivered to readers with a header
     * that lies about its position. */
    int32_t session_id = fa_read_i32(datagram + SESSION_ID_FIELD);
    int32_t stream_id = fa_read_i32(datagram + STREAM_ID_FIELD);
    int32_t term_id = fa_read_i32(datagram + TERM_ID_FIELD);

    int32_t offset = 0;
    while (offset < length)
    {
        int32_t remaining = length - offset;
        if (remaining < FULMAR_HEADER_LENGTH)
        {
            return FULMAR_REBUILD_BAD_LENGTH; /* trailing bytes that are not a frame */
        }
        const char *frame = datagram + offset;
        int32_t frame_length = fa_read_i32(frame);
        int16_t type = fa_read_i16(frame + 6);
        if (FULMAR_FRAME_TYPE_DATA != type && FULMAR_FRAME_TYPE_PAD != type)
        {
            return FULMAR_REBUILD_BAD_FRAME;
        }
        if (frame_length < FULMAR_HEADER_LENGTH)
        {
            return FULMAR_REBUILD_BAD_LENGTH; /* a heartbeat (length 0) is not inserted either */
        }
        /* Compared before aligning, so a garbage length cannot overflow; the
         * space left in the term is a multiple of the alignment, so the
         * aligned frame fits as well. */
        if (frame_length > term_length - (term_offset + offset))
        {
            return FULMAR_REBUILD_OVERRUNS_TERM;
        }
        /* A sender transmits a padding frame as its header alone (the rest
         * is nothing but the end of the term), so only padding may be
         * shorter in the datagram than its frame length says, and only as
         * the datagram's last 32 bytes. */
        if (frame_length > remaining && !(FULMAR_FRAME_TYPE_PAD == type && FULMAR_HEADER_LENGTH == remaining))
        {
            return FULMAR_REBUILD_BAD_LENGTH;
        }
        if (fa_read_i32(frame + TERM_OFFSET_FIELD) != term_offset + offset ||
            fa_read_i32(frame + TERM_ID_FIELD) != term_id ||
            fa_read_i32(frame + SESSION_ID_FIELD) != session_id ||
            fa_read_i32(frame + STREAM_ID_FIELD) != stream_id)
        {
            return FULMAR_REBUILD_BAD_FRAME;
        }
        offset += FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
    }
    return 0;
}

int32_t fulmar_term_insert(
    char *log, int32_t term_length, int32_t partition_index, int32_t term_offset,
    const char *datagram, int32_t length)
{
    if (partition_index < 0 || partition_index >= FULMAR_PARTITION_COUNT)
    {
        return FULMAR_REBUILD_BAD_PARTITION;
    }
    if (term_offset < 0 || term_offset >= term_length || !is_frame_aligned(term_offset))
    {
        return FULMAR_REBUILD_BAD_TERM_OFFSET;
    }
    int32_t invalid = check_datagram(term_length, term_offset, datagram, length);
    if (invalid)
    {
        return invalid;
    }

    /* Frame by frame, as Aeron's C driver does now (its Java driver and older
     * C check only the first frame): a resend that overlaps frames already
     * received still fills the ones that are missing. */
    char *term = log + (int64_t)partition_index * term_length;
    int32_t written = 0;
    int32_t offset = 0;
    while (offset < length)
    {
        const char *frame = datagram + offset;
        int32_t aligned_length = FULMAR_ALIGN(fa_read_i32(frame), FULMAR_FRAME_ALIGNMENT);
        char *slot = term + term_offset + offset;
        /* A non-zero first word means the frame is there already (the log is
         * zeroed before reuse): rewriting it could change bytes under a
         * reader. */
        if (0 == fa_load_i32(slot))
        {
            int32_t present = length - offset < aligned_length ? length - offset : aligned_length;
            memcpy(slot + 8, frame + 8, (size_t)(present - 8));
            int64_t first_word;
            memcpy(&first_word, frame, sizeof(first_word));
            fa_store_i64(slot, first_word);
            written++;
        }
        offset += aligned_length;
    }
    return written;
}

static int32_t check_scan(int32_t term_length, int32_t partition_index, int32_t term_offset)
{
    if (partition_index < 0 || partition_index >= FULMAR_PARTITION_COUNT)
    {
        return FULMAR_REBUILD_BAD_PARTITION;
    }
    if (term_offset < 0 || term_offset > term_length || !is_frame_aligned(term_offset))
    {
        return FULMAR_REBUILD_BAD_TERM_OFFSET;
    }
    return 0;
}

static int32_t contiguous_end(const char *term, int32_t term_length, int32_t offset, int32_t limit_offset)
{
    while (offset < limit_offset)
    {
        int32_t frame_length = fa_load_i32(term + offset);
        /* Zero: not received yet.  Out of range: not a frame this driver
         * wrote, so nothing past it can be trusted as contiguous. */
        if (frame_length <= 0 || frame_length > term_length - offset)
        {
            break;
        }
        offset += FULMAR_ALIGN(frame_length, FULMAR_FRAME_ALIGNMENT);
    }
    return offset;
}

int32_t fulmar_term_contiguous_end(
    const char *log, int32_t term_length, int32_t partition_index, int32_t term_offset, int32_t limit_offset)
{
    int32_t invalid = check_scan(term_length, partition_index, term_offset);
    if (invalid)
    {
        return invalid;
    }
    const char *term = log + (int64_t)partition_index * term_length;
    return contiguous_end(term, term_length, term_offset, limit_offset < term_length ? limit_offset : term_length);
}

int32_t fulmar_term_scan_for_gap(
    const char *log, int32_t term_length, int32_t partition_index, int32_t term_offset, int32_t limit_offset,
    int32_t *gap_length)
{
    *gap_length = 0;
    int32_t invalid = check_scan(term_length, partition_index, term_offset);
    if (invalid)
    {
        return invalid;
    }
    const char *term = log + (int64_t)partition_index * term_length;
    if (limit_offset > term_length)
    {
        limit_offset = term_length;
    }
    int32_t gap_begin = contiguous_end(term, term_length, term_offset, limit_offset);
    if (gap_begin < limit_offset)
    {
        /* The gap runs until a frame that has arrived.  Frames start on the
         * alignment, so looking at every 32nd word finds the first one; the
         * gap is at least one frame slot long. */
        int32_t offset = gap_begin + FULMAR_FRAME_ALIGNMENT;
        while (offset < limit_offset && 0 == fa_load_i32(term + offset))
        {
            offset += FULMAR_FRAME_ALIGNMENT;
        }
        *gap_length = offset - gap_begin;
    }
    return gap_begin;
}
