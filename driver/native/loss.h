/* Loss injection: whether to drop a datagram the media driver sends or
 * receives, at a rate in parts per million, for the frame types a mask
 * selects (bit 1 << type; 0 selects every datagram, even bytes that are not
 * an Aeron frame).  The driver keeps rate and mask in counters, so a tool or
 * a test partitions a running node by writing them; each direction has its
 * own generator, seeded, so the same seed and the same traffic drop the same
 * datagrams and one direction never perturbs the other's sequence. */

#define FULMAR_LOSS_PARTS_PER_MILLION 1000000

typedef struct fulmar_loss_stct
{
    uint64_t state;                 /* splitmix64 */
    int64_t dropped;
}
fulmar_loss_t;

void fulmar_loss_init(fulmar_loss_t *loss, uint64_t seed);
/* 1 to drop the datagram, 0 to let it through.  A datagram the mask does not
 * select draws nothing from the generator. */
int32_t fulmar_loss_drop(fulmar_loss_t *loss, int64_t rate_ppm, int64_t frame_type_mask, const char *datagram,
                         int32_t length);
