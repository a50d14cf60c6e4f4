/* Loss injection; see loss.h. */
#include "_common.h"
#include "loss.h"

/* splitmix64: small, fast, and good enough to pick which datagrams a test loses. */
static uint64_t next(fulmar_loss_t *loss)
{
    uint64_t z = (loss->state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void fulmar_loss_init(fulmar_loss_t *loss, uint64_t seed)
{
    loss->state = seed;
    loss->dropped = 0;
}

/* The type of a datagram's first frame, or -1 when it is not an Aeron frame
 * (shorter than the common header, or another version). */
static int32_t frame_type_of(const char *datagram, int32_t length)
{
    if (length < 8 || 0 != (uint8_t)datagram[4])
    {
        return -1;
    }
    return fa_read_i16(datagram + 6);
}

int32_t fulmar_loss_drop(fulmar_loss_t *loss, int64_t rate_ppm, int64_t frame_type_mask, const char *datagram,
                         int32_t length)
{
    if (rate_ppm <= 0)
    {
        return 0;
    }
    if (0 != frame_type_mask)
    {
        const int32_t type = frame_type_of(datagram, length);
        if (type < 0 || type > 62 || 0 == (frame_type_mask & (INT64_C(1) << type)))
        {
            return 0;
        }
    }
    if (rate_ppm < FULMAR_LOSS_PARTS_PER_MILLION &&
        (int64_t)(next(loss) % FULMAR_LOSS_PARTS_PER_MILLION) >= rate_ppm)
    {
        return 0;
    }
    loss->dropped++;
    return 1;
}
