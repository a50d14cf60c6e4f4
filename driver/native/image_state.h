/* The receive side of a network image as plain state (Aeron's
 * PublicationImage and LossDetector): window checks, inserting datagrams
 * into the image's log, the high-water mark, loss detection and NAK timing,
 * status message scheduling, end of stream and liveness.  It owns no socket,
 * clock or thread: the caller passes the time in and sends what it hands
 * back.  Positions are int64 stream positions; a term id is int32 and wraps. */

/* What insert_packet / on_data made of a packet. */
#define FULMAR_VERDICT_DATA 0       /* accepted (inserted, or already there) */
#define FULMAR_VERDICT_HEARTBEAT 1  /* accepted, nothing to insert */
#define FULMAR_VERDICT_OVER_RUN 2   /* beyond the window the last SM granted: dropped */
#define FULMAR_VERDICT_UNDER_RUN 3  /* behind what the subscribers consumed: dropped */
#define FULMAR_VERDICT_INVALID 4    /* malformed: dropped, nothing written */

/* Aeron's defaults (Configuration and the C driver's context). */
#define FULMAR_INITIAL_WINDOW_LENGTH_DEFAULT 131072
#define FULMAR_STATUS_MESSAGE_TIMEOUT_DEFAULT_NS 200000000
#define FULMAR_IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS 10000000000
#define FULMAR_NAK_UNICAST_DELAY_DEFAULT_NS 100000
#define FULMAR_NAK_UNICAST_RETRY_DELAY_RATIO_DEFAULT 100
#define FULMAR_NAK_MULTICAST_GROUP_SIZE_DEFAULT 10
#define FULMAR_NAK_MULTICAST_MAX_BACKOFF_DEFAULT_NS 10000000

/* Frame flags the image reads or writes. */
#define FULMAR_DATA_EOS_FLAG 0x20
#define FULMAR_SM_EOS_FLAG 0x40

/* Initialisation failures. */
#define FULMAR_IMAGE_BAD_TERM_OFFSET -1     /* not a frame-aligned offset inside the term */
#define FULMAR_IMAGE_BAD_TERM_ID -2         /* the joining term id is before the initial term id */
#define FULMAR_IMAGE_BAD_TERM_LENGTH -3     /* not a power of two from 64 KiB to 1 GiB */
#define FULMAR_IMAGE_BAD_DELAY -4           /* negative NAK delays, or a multicast backoff or group below 1 */

/* Delay generators of a loss detector. */
#define FULMAR_DELAY_STATIC 0
#define FULMAR_DELAY_MULTICAST 1

/* fulmar_loss_detector_scan's result: negative, a bad rebuild position (not
 * frame aligned: nothing scanned, nothing changed); otherwise these bits. */
#define FULMAR_LOSS_GAP_FOUND 1     /* a new gap became the active one: its timer started */
#define FULMAR_LOSS_NAK_DUE 2       /* the active gap's timer expired: *nak_out holds it */

typedef struct
{
    int32_t session_id;
    int32_t stream_id;
    int32_t consumption_term_id;
    int32_t consumption_term_offset;
    int32_t receiver_window;
    int32_t flags;                  /* FULMAR_SM_EOS_FLAG once the image has its whole stream */
} fulmar_sm_t;

typedef struct
{
    int32_t session_id;
    int32_t stream_id;
    int32_t term_id;
    int32_t term_offset;
    int32_t length;
} fulmar_nak_t;

typedef struct
{
    /* The gap being chased: the first one the last scan found. */
    int32_t gap_active;             /* 0: none, the fields below mean nothing */
    int32_t gap_term_id;
    int32_t gap_term_offset;
    int32_t gap_length;
    int64_t deadline_ns;            /* when the active gap is NAKed (again) */

    int32_t kind;                   /* FULMAR_DELAY_STATIC or FULMAR_DELAY_MULTICAST */
    int32_t group_size;             /* multicast */
    int64_t delay_ns;               /* static: the first NAK's delay */
    int64_t retry_delay_ns;         /* static: between NAKs of one gap */
    int64_t max_backoff_ns;         /* multicast: delays are in [0, max_backoff_ns) */
    /* The multicast distribution's constants (see generate_delay_ns). */
    double rand_max;
    double base_x;
    double constant_t;
    double factor_t;
    uint64_t rng_state;             /* splitmix64 */
} fulmar_loss_detector_t;

/* Fixed delays; the gap is cleared.  FULMAR_IMAGE_BAD_DELAY if negative. */
int32_t fulmar_loss_detector_init_static(fulmar_loss_detector_t *d, int64_t delay_ns, int64_t retry_delay_ns);

/* Random delays in [0, max_backoff_ns) weighted towards long waits, drawn
 * from a PRNG seeded with seed (one seed, one sequence); the gap is cleared.
 * FULMAR_IMAGE_BAD_DELAY unless max_backoff_ns > 0 and group_size >= 1. */
int32_t fulmar_loss_detector_init_multicast(
    fulmar_loss_detector_t *d, int64_t max_backoff_ns, int32_t group_size, uint64_t seed);

/* The delay before a new gap's first NAK, and before each repeat. */
int64_t fulmar_loss_detector_generate_delay_ns(fulmar_loss_detector_t *d);
int64_t fulmar_loss_detector_retry_delay_ns(fulmar_loss_detector_t *d);

/* The multicast delay for one uniform draw in [0, 1): the formula alone. */
int64_t fulmar_loss_detector_multicast_delay_ns(const fulmar_loss_detector_t *d, double uniform);

/* Scans the log from rebuild_position towards hwm_position, the rest of one
 * term at most, and sets *new_rebuild_position to where the contiguous data
 * now ends (a position at a term's end is the next term's start).  The first
 * gap found becomes the active gap when it differs from it (its timer starts
 * with the initial delay); when the active gap's deadline has come, its
 * NAK's term_id, term_offset and length go to *nak_out (session and stream
 * ids are left to the caller) and the timer re-arms with the retry delay.
 * No gap: the active gap is forgotten.  Returns FULMAR_LOSS_* bits (0: no
 * work) or a negative FULMAR_REBUILD_* code. */
int32_t fulmar_loss_detector_scan(
    fulmar_loss_detector_t *d, const char *log, int32_t term_length, int32_t position_bits_to_shift,
    int32_t initial_term_id, int64_t rebuild_position, int64_t hwm_position, int64_t now_ns,
    int64_t *new_rebuild_position, fulmar_nak_t *nak_out);

typedef struct
{
    char *log;                      /* the mapped log buffer's first byte; metadata at 3 * term_length */
    int32_t term_length;
    int32_t position_bits_to_shift;
    int32_t initial_term_id;
    int32_t session_id;
    int32_t stream_id;
    int32_t receiver_window_length;
    int64_t status_message_timeout_ns;
    int64_t image_liveness_timeout_ns;

    int64_t hwm_position;
    int64_t rebuild_position;
    int64_t end_of_stream_position; /* -1 until the stream's end is known */
    int64_t packet_eos_position;    /* the last insert_packet's EOS position, -1 without the flag */
    int64_t clean_position;         /* the log is zeroed up to here (a term behind the subscribers) */
    int64_t time_of_last_packet_ns;
    int32_t is_rebuilding;
    int32_t sending_eos_sm;

    /* The SM last scheduled and the one last sent: the sender's window runs
     * from the last sent, so packets are checked against that. */
    int64_t next_sm_position;
    int64_t sm_deadline_ns;
    int64_t last_sm_position;
    int64_t last_overrun_threshold;
    int32_t sm_pending;
    int32_t nak_pending;
    fulmar_nak_t pending_nak;

    int64_t heartbeats_received;
    int64_t flow_control_under_runs;
    int64_t flow_control_over_runs;
    int64_t invalid_packets;
    int64_t status_messages_sent;
    int64_t naks_sent;

    fulmar_loss_detector_t loss_detector;
} fulmar_image_state_t;

/* A new image joining the stream at active_term_id/term_offset (the SETUP's);
 * the first SM is due at once.  NAKs use Aeron's static unicast delays until
 * one of the use_*_delays functions says otherwise.  0 or FULMAR_IMAGE_BAD_*. */
int32_t fulmar_image_state_init(
    fulmar_image_state_t *s, char *log, int32_t term_length, int32_t initial_term_id, int32_t session_id,
    int32_t stream_id, int32_t active_term_id, int32_t term_offset, int64_t now_ns,
    int32_t initial_window_length, int64_t status_message_timeout_ns, int64_t image_liveness_timeout_ns);
int32_t fulmar_image_state_use_static_delays(fulmar_image_state_t *s, int64_t delay_ns, int64_t retry_delay_ns);
int32_t fulmar_image_state_use_multicast_delays(
    fulmar_image_state_t *s, int64_t max_backoff_ns, int32_t group_size, uint64_t seed);

/* One DATA or PAD datagram of this image's session and stream, as received.
 * Returns a FULMAR_VERDICT_*.  An accepted packet's EOS position is left in
 * packet_eos_position; with record_eos 0 it does not end the stream (an image
 * fed by several sources: the caller decides, then calls end_stream). */
int32_t fulmar_image_state_insert_packet(
    fulmar_image_state_t *s, int32_t term_id, int32_t term_offset, const char *datagram, int32_t length,
    int64_t now_ns, int32_t record_eos);

/* insert_packet's bookkeeping alone (window, high-water mark, liveness, end
 * of stream) for a packet whose bytes the caller handles. */
int32_t fulmar_image_state_on_data(
    fulmar_image_state_t *s, int32_t term_id, int32_t term_offset, int32_t length, int64_t now_ns,
    int32_t is_heartbeat, int32_t is_eos);

/* Makes an SM due at once. */
void fulmar_image_state_request_status_message(fulmar_image_state_t *s);

/* The stream ends at position (the first call counts; a negative position
 * is no position and is ignored); written to the log's metadata too. */
void fulmar_image_state_end_stream(fulmar_image_state_t *s, int64_t position);

/* The duty cycle's rebuild: advances rebuild_position, runs the loss
 * detector, schedules an SM (and cleans the log a term behind the slowest
 * subscriber) after a quarter window of consumption, notices the end of the
 * stream.  With no subscribers (count 0) nothing is rebuilt.  Returns the
 * work count. */
int32_t fulmar_image_state_rebuild(
    fulmar_image_state_t *s, int64_t now_ns, const int64_t *subscriber_positions, int32_t count);

/* 1 with *out filled when an SM is due (scheduled, requested, or the periodic
 * one), else 0.  Taking it moves the receiver's window. */
int32_t fulmar_image_state_poll_status_message(fulmar_image_state_t *s, int64_t now_ns, fulmar_sm_t *out);

/* 1 with *out filled when the loss detector asked for a NAK since the last
 * poll (the latest gap only), else 0. */
int32_t fulmar_image_state_poll_nak(fulmar_image_state_t *s, fulmar_nak_t *out);

int32_t fulmar_image_state_is_end_of_stream(const fulmar_image_state_t *s);
int32_t fulmar_image_state_is_timed_out(const fulmar_image_state_t *s, int64_t now_ns);
int32_t fulmar_image_state_has_gap(const fulmar_image_state_t *s);

/* The earliest time at which something falls due without new input: the
 * periodic SM (poll_status_message returns it from then on), the active
 * gap's NAK (a rebuild from then on queues it), the liveness timeout
 * (is_timed_out from then on).  INT64_MIN when an SM or NAK is due already
 * (compare it with the time, do not subtract); INT64_MAX for never. */
int64_t fulmar_image_state_next_deadline_ns(const fulmar_image_state_t *s);
