/* One-to-many broadcast buffer with Aeron's layout (Agrona BroadcastTransmitter /
 * BroadcastReceiver / CopyBroadcastReceiver, aeron_broadcast_*.c): the
 * to-clients buffer of cnc.dat.
 *
 * `buffer` points at the ring; the 128-byte trailer starts at buffer + capacity.
 * One transmitter writes without waiting for anyone; each receiver keeps its
 * own cursor and detects, via the tail-intent counter, when the transmitter
 * has overwritten what it was reading. */

#define FULMAR_BROADCAST_TRAILER_LENGTH 128
#define FULMAR_BROADCAST_TAIL_INTENT_COUNTER_OFFSET 0
#define FULMAR_BROADCAST_TAIL_COUNTER_OFFSET 8
#define FULMAR_BROADCAST_LATEST_COUNTER_OFFSET 16
#define FULMAR_BROADCAST_RECORD_HEADER_LENGTH 8
#define FULMAR_BROADCAST_RECORD_ALIGNMENT 8
#define FULMAR_BROADCAST_PADDING_MSG_TYPE_ID -1

#define FULMAR_BROADCAST_OK 0
#define FULMAR_BROADCAST_INVALID_ARGUMENT -2

/* Results of fulmar_broadcast_copy_receive. */
#define FULMAR_BROADCAST_RECEIVE_OK 0
#define FULMAR_BROADCAST_RECEIVE_LAPPED 1
#define FULMAR_BROADCAST_RECEIVE_TOO_LONG 2
#define FULMAR_BROADCAST_RECEIVE_CORRUPT 3

/* A receiver's private position; lives in the receiver's own memory.
 * cursor: position of the current record; next_record: where the next one
 * starts; read_position: the earliest position whose bytes were read to reach
 * the current record (before the cursor when padding was skipped), which is
 * what validation has to cover. */
typedef struct
{
    int64_t cursor;
    int64_t next_record;
    int64_t read_position;
    int64_t lapped_count;
    int32_t record_offset;
    int32_t reserved;
} fulmar_broadcast_receiver_t;

int32_t fulmar_broadcast_max_message_length(int32_t capacity);

/* Single transmitter.  FULMAR_BROADCAST_OK or FULMAR_BROADCAST_INVALID_ARGUMENT. */
int32_t fulmar_broadcast_transmit(char *buffer, int32_t capacity, int32_t msg_type_id, const char *msg, int32_t length);

/* Start at the latest record, as Aeron's receivers do (join at the present). */
void fulmar_broadcast_receiver_init(fulmar_broadcast_receiver_t *receiver, char *buffer, int32_t capacity);

/* Move to the next record if the transmitter has published one; counts a lap and
 * jumps to the latest record when the next one has already been overwritten.
 * The record is then at receiver->record_offset; it can still be overwritten
 * while it is read, which fulmar_broadcast_validate reports afterwards. */
bool fulmar_broadcast_receive_next(fulmar_broadcast_receiver_t *receiver, char *buffer, int32_t capacity);

/* True if the current record had not been overwritten when this was called. */
bool fulmar_broadcast_validate(fulmar_broadcast_receiver_t *receiver, char *buffer, int32_t capacity);

/* Copy up to `limit` records into `scratch` (bodies at 8-byte aligned offsets)
 * and validate them after copying, so the caller only sees intact records.
 * For record i: records[3i] = msg_type_id, records[3i+1] = offset in scratch,
 * records[3i+2] = length, next_positions[i] = the receiver's next_record just
 * after it (to resume from there if the caller stops early).  *count = records
 * delivered.  Returns a FULMAR_BROADCAST_RECEIVE_* result; records counted in
 * *count are valid whatever the result. */
int32_t fulmar_broadcast_copy_receive(
    fulmar_broadcast_receiver_t *receiver,
    char *buffer,
    int32_t capacity,
    char *scratch,
    int32_t scratch_capacity,
    int32_t limit,
    int32_t *records,
    int64_t *next_positions,
    int32_t *count);

/* Load generator for tests and benchmarks: transmit `count` messages as fast as
 * C can, numbered from `first_sequence`.  Message i is
 * fulmar_broadcast_pattern_length(i, max) bytes long (8..max, so records of
 * many sizes and padding occur) and holds i (int64) in its first 8 bytes and
 * the byte (i & 0xff) in every other byte, so a receiver can tell a whole
 * record from a torn one.  Returns the next sequence, or -1 for bad arguments. */
int32_t fulmar_broadcast_pattern_length(int64_t sequence, int32_t max_length);
int64_t fulmar_broadcast_transmit_pattern(
    char *buffer, int32_t capacity, int32_t msg_type_id, int64_t first_sequence, int64_t count, int32_t max_length);
