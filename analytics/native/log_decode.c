/* See log_decode.h.  Little-endian hosts only, as the rest of the native code:
 * the wire is little-endian (fields are read with _common.h's fa_read_*). */

#include "_common.h"
#include "log_decode.h"
#include "term.h" /* FULMAR_HEADER_LENGTH, FULMAR_FRAME_ALIGNMENT */

#define SBE_HEADER_LENGTH 8

/* The block length each decoded template needs; 0 for templates not decoded. */
static int32_t required_block_length(int32_t template_id)
{
    switch (template_id)
    {
        case FULMAR_LOG_SESSION_MESSAGE: return 24;
        case FULMAR_LOG_TIMER_EVENT: return 24;
        case FULMAR_LOG_SESSION_OPEN: return 36;
        case FULMAR_LOG_SESSION_CLOSE: return 28;
        case FULMAR_LOG_CLUSTER_ACTION: return 32;
        case FULMAR_LOG_NEW_LEADERSHIP_TERM: return 48;
        default: return 0;
    }
}

/* Fills row `row` from the whole message at `message` (which may be the
 * payload area itself, for a reassembled one).  Returns the number of
 * payload bytes the row keeps, or -1 when a cluster message is too short for
 * its template's fields. */
static int64_t decode_row(const char *message, int64_t length, fulmar_log_columns *c, int32_t row)
{
    c->template_id[row] = -1;
    c->schema_id[row] = -1;
    c->leadership_term_id[row] = 0;
    c->cluster_session_id[row] = 0;
    c->correlation_id[row] = 0;
    c->timestamp[row] = 0;
    c->code[row] = 0;
    c->time_unit[row] = 0;
    if (length < SBE_HEADER_LENGTH)
    {
        return length; /* not an SBE message (a service's own snapshot record can be anything) */
    }
    int32_t block_length = fa_read_u16(message);
    int32_t template_id = fa_read_u16(message + 2);
    int32_t schema_id = fa_read_u16(message + 4);
    const char *body = message + SBE_HEADER_LENGTH;

    c->template_id[row] = template_id;
    c->schema_id[row] = schema_id;
    if (schema_id != FULMAR_LOG_SCHEMA_ID)
    {
        return length;
    }
    int32_t required = required_block_length(template_id);
    if (required > 0 && (block_length < required || length < SBE_HEADER_LENGTH + required))
    {
        return -1;
    }
    switch (template_id)
    {
        case FULMAR_LOG_SESSION_MESSAGE:
            c->leadership_term_id[row] = fa_read_i64(body);
            c->cluster_session_id[row] = fa_read_i64(body + 8);
            c->timestamp[row] = fa_read_i64(body + 16);
            return length - FULMAR_LOG_SESSION_HEADER_LENGTH;
        case FULMAR_LOG_TIMER_EVENT:
            c->leadership_term_id[row] = fa_read_i64(body);
            c->correlation_id[row] = fa_read_i64(body + 8);
            c->timestamp[row] = fa_read_i64(body + 16);
            break;
        case FULMAR_LOG_SESSION_OPEN:
            c->leadership_term_id[row] = fa_read_i64(body);
            c->correlation_id[row] = fa_read_i64(body + 8);
            c->cluster_session_id[row] = fa_read_i64(body + 16);
            c->timestamp[row] = fa_read_i64(body + 24);
            c->code[row] = fa_read_i32(body + 32);
            break;
        case FULMAR_LOG_SESSION_CLOSE:
            c->leadership_term_id[row] = fa_read_i64(body);
            c->cluster_session_id[row] = fa_read_i64(body + 8);
            c->timestamp[row] = fa_read_i64(body + 16);
            c->code[row] = fa_read_i32(body + 24);
            break;
        case FULMAR_LOG_CLUSTER_ACTION:
            c->leadership_term_id[row] = fa_read_i64(body);
            c->timestamp[row] = fa_read_i64(body + 16);
            c->code[row] = fa_read_i32(body + 24);
            break;
        case FULMAR_LOG_NEW_LEADERSHIP_TERM:
            c->leadership_term_id[row] = fa_read_i64(body);
            c->timestamp[row] = fa_read_i64(body + 16);
            c->code[row] = fa_read_i32(body + 32);
            c->time_unit[row] = fa_read_i32(body + 40);
            break;
        default:
            break;
    }
    return length;
}

void fulmar_log_decode(
    const char *segment, int64_t end_offset, int32_t term_length, fulmar_log_columns *c, fulmar_log_cursor *cursor)
{
    int64_t offset = cursor->offset;
    int32_t count = 0;
    int64_t used = c->payload_offsets[0];
    /* The message being reassembled: where its first frame is, where its
     * bytes start in the payload area, and how many frames it has so far. */
    int64_t message_offset = -1;
    int64_t message_start = 0;
    int32_t message_fragments = 0;
    int32_t status = FULMAR_LOG_DONE;

    cursor->skipped_pad = 0;
    if (term_length <= 0)
    {
        cursor->count = 0;
        cursor->status = FULMAR_LOG_BAD_FRAME;
        return;
    }
    while (offset < end_offset)
    {
        if (end_offset - offset < FULMAR_HEADER_LENGTH)
        {
            /* Not even a frame header's worth of bytes left (a file cut short). */
            status = FULMAR_LOG_BAD_FRAME;
            break;
        }
        int32_t frame_length = fa_read_i32(segment + offset);
        if (frame_length == 0)
        {
            status = FULMAR_LOG_HOLE;
            break;
        }
        int64_t aligned = FULMAR_ALIGN((int64_t)frame_length, FULMAR_FRAME_ALIGNMENT);
        if (frame_length < FULMAR_HEADER_LENGTH || offset + aligned > end_offset ||
            (offset % term_length) + aligned > term_length)
        {
            status = FULMAR_LOG_BAD_FRAME;
            break;
        }
        uint8_t flags = (uint8_t)segment[offset + 5];
        uint16_t type = fa_read_u16(segment + offset + 6);
        if (type == FULMAR_FRAME_TYPE_PAD)
        {
            if (message_offset >= 0)
            {
                status = FULMAR_LOG_BAD_FRAGMENT;
                break;
            }
            cursor->skipped_pad++;
            offset += aligned;
            continue;
        }
        if (type != FULMAR_FRAME_TYPE_DATA)
        {
            status = FULMAR_LOG_BAD_FRAME_TYPE;
            break;
        }
        const char *data = segment + offset + FULMAR_HEADER_LENGTH;
        int64_t data_length = frame_length - FULMAR_HEADER_LENGTH;
        bool begin = (flags & FULMAR_FLAG_BEGIN) != 0;
        bool end = (flags & FULMAR_FLAG_END) != 0;

        /* Every message, whole or fragmented, is gathered in the payload
         * area and decoded there; a session message's header is then cut
         * off its bytes. */
        if (begin)
        {
            if (message_offset >= 0)
            {
                status = FULMAR_LOG_BAD_FRAGMENT;
                break;
            }
            if (count == c->capacity)
            {
                status = FULMAR_LOG_FULL;
                break;
            }
            message_offset = offset;
            message_start = used;
            message_fragments = 0;
        }
        else if (message_offset < 0)
        {
            status = FULMAR_LOG_BAD_FRAGMENT;
            break;
        }
        if (used + data_length > c->payload_capacity)
        {
            /* Restart from the message's first frame next time (with room). */
            offset = message_offset;
            used = message_start;
            message_offset = -1;
            status = FULMAR_LOG_FULL;
            break;
        }
        memcpy(c->payload + used, data, (size_t)data_length);
        used += data_length;
        message_fragments++;
        offset += aligned;
        if (end)
        {
            int64_t length = used - message_start;
            int64_t kept = decode_row(c->payload + message_start, length, c, count);
            if (kept < 0)
            {
                offset = message_offset;
                used = message_start;
                message_offset = -1;
                status = FULMAR_LOG_SHORT_MESSAGE;
                break;
            }
            if (kept < length)
            {
                memmove(c->payload + message_start, c->payload + message_start + (length - kept), (size_t)kept);
            }
            used = message_start + kept;
            c->offset[count] = message_offset;
            c->next_offset[count] = offset;
            c->fragments[count] = message_fragments;
            c->payload_offsets[count + 1] = (int32_t)used;
            count++;
            message_offset = -1;
        }
    }
    if (message_offset >= 0 && (status == FULMAR_LOG_DONE || status == FULMAR_LOG_HOLE))
    {
        /* The recorded bytes end inside a fragmented message: it is reported
         * from its first frame, and none of its bytes are kept.  (An error
         * inside one is reported at the bad frame itself.) */
        status = FULMAR_LOG_UNFINISHED;
        offset = message_offset;
    }
    cursor->offset = offset;
    cursor->count = count;
    cursor->status = status;
}
