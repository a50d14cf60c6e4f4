/* Many-to-one ring buffer with Aeron's layout (Agrona ManyToOneRingBuffer,
 * aeron_mpsc_rb.c): the to-driver buffer of cnc.dat.
 *
 * `buffer` points at the first byte of the ring; the 768-byte trailer starts
 * at buffer + capacity.  `capacity` is a power of two.  The Python layer
 * validates capacity and alignment once, at construction; every function here
 * still refuses arguments that would take it outside the buffer. */

#define FULMAR_RB_TRAILER_LENGTH 768
#define FULMAR_RB_TAIL_POSITION_OFFSET 128
#define FULMAR_RB_HEAD_CACHE_POSITION_OFFSET 256
#define FULMAR_RB_HEAD_POSITION_OFFSET 384
#define FULMAR_RB_CORRELATION_COUNTER_OFFSET 512
#define FULMAR_RB_CONSUMER_HEARTBEAT_OFFSET 640
#define FULMAR_RB_RECORD_HEADER_LENGTH 8
#define FULMAR_RB_ALIGNMENT 8
#define FULMAR_RB_PADDING_MSG_TYPE_ID -1

/* Results of write/try_claim/commit/abort. */
#define FULMAR_RB_OK 0
#define FULMAR_RB_FULL -1
#define FULMAR_RB_INVALID_ARGUMENT -2
#define FULMAR_RB_ALREADY_RELEASED -3

/* Status written to scan's out[1]. */
#define FULMAR_RB_SCAN_OK 0
#define FULMAR_RB_SCAN_CORRUPT 1

/* Largest message a ring of `capacity` accepts (Agrona: capacity / 8, at least
 * one header, 0 for the degenerate 8-byte ring). */
int32_t fulmar_rb_max_message_length(int32_t capacity);

/* Copy one message in; FULMAR_RB_OK, FULMAR_RB_FULL or FULMAR_RB_INVALID_ARGUMENT. */
int32_t fulmar_rb_write(char *buffer, int32_t capacity, int32_t msg_type_id, const char *msg, int32_t length);

/* Claim space for a message of `length` bytes that the caller fills in place.
 * Returns the offset of the message body (>= 8), FULMAR_RB_FULL or
 * FULMAR_RB_INVALID_ARGUMENT.  The record stays invisible to the reader until
 * fulmar_rb_commit (or turns into padding with fulmar_rb_abort). */
int32_t fulmar_rb_try_claim(char *buffer, int32_t capacity, int32_t msg_type_id, int32_t length);
int32_t fulmar_rb_commit(char *buffer, int32_t capacity, int32_t index);
int32_t fulmar_rb_abort(char *buffer, int32_t capacity, int32_t index);

/* Single consumer, step 1: scan committed records from the head up to the end
 * of the contiguous block, at most `limit` messages.  For message i it writes
 * records[3i] = msg_type_id, records[3i+1] = body offset, records[3i+2] = body
 * length.  out[0] = bytes scanned (messages and padding), out[1] = scan status.
 * Returns the number of messages.  Nothing is consumed yet. */
int32_t fulmar_rb_scan(char *buffer, int32_t capacity, int32_t limit, int32_t *records, int32_t *out);

/* Single consumer, step 2: zero `length` bytes from the head and advance the
 * head past them.  Returns FULMAR_RB_OK or FULMAR_RB_INVALID_ARGUMENT. */
int32_t fulmar_rb_consume(char *buffer, int32_t capacity, int32_t length);

/* Consumer-side recovery from a producer that died between claiming space and
 * committing it.  Returns true when the blocking record was turned into padding. */
bool fulmar_rb_unblock(char *buffer, int32_t capacity);

/* Benchmark reference: write `message_count` messages of `length` bytes, reading
 * them back every `batch` writes (or when full) through scan + consume, all in C.
 * Returns the number of messages read, or -1 for bad arguments. */
int64_t fulmar_rb_bench(char *buffer, int32_t capacity, int64_t message_count, int32_t length, int32_t batch);
