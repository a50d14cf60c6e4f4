/* Record checksums over a block of frames; see record_checksum.h. */
#include "_common.h"
#include "record_checksum.h"

#include <zlib.h>

#define HEADER_LENGTH 32
#define FRAME_ALIGNMENT 32
#define TYPE_OFFSET 6
#define SESSION_ID_OFFSET 12

int32_t fulmar_record_checksums(char *block, int32_t length)
{
    int32_t offset = 0;
    while (offset < length)
    {
        int32_t frame_length;
        int16_t frame_type;
        memcpy(&frame_length, block + offset, sizeof(frame_length));
        memcpy(&frame_type, block + offset + TYPE_OFFSET, sizeof(frame_type));
        if (frame_length < HEADER_LENGTH)
        {
            return FULMAR_CHECKSUM_BAD_FRAME - offset;
        }
        const int64_t aligned = FULMAR_ALIGN((int64_t)frame_length, FRAME_ALIGNMENT);
        if (aligned > length - offset)
        {
            break;
        }
        if (FULMAR_FRAME_TYPE_DATA == frame_type)
        {
            const uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)(block + offset + HEADER_LENGTH),
                                                 (uInt)(aligned - HEADER_LENGTH));
            memcpy(block + offset + SESSION_ID_OFFSET, &crc, sizeof(crc));
        }
        offset += (int32_t)aligned;
    }
    return offset;
}
