/* Sender flow control: how far a network publication may send, given its
 * receivers' status messages.  Aeron's strategies (UnicastFlowControl,
 * MaxMulticast-, MinMulticast- and TaggedMulticastFlowControl) with their
 * corner cases, pure state (every call takes now_ns; no clock, socket or
 * thread).  Which strategy a channel gets is chosen in Python
 * (driver/data_plane.py flow_control_settings).
 *
 * A frame's group tag is optional, so it arrives as has_group_tag (0: the
 * frame carries none) and group_tag.  Positions and times are int64; term ids
 * wrap as int32 (positions are computed as logbuffer.compute_position). */

#define FULMAR_FC_UNICAST 0
#define FULMAR_FC_MAX 1
#define FULMAR_FC_MIN 2
#define FULMAR_FC_TAGGED 3

/* Aeron's defaults (Configuration.java / aeron_driver_context.c); the caller
 * passes them explicitly, as flow_control_settings does. */
#define FULMAR_FC_RECEIVER_TIMEOUT_DEFAULT_NS 5000000000
#define FULMAR_FC_GROUP_TAG_DEFAULT -1
#define FULMAR_FC_GROUP_MIN_SIZE_DEFAULT 0
#define FULMAR_FC_INITIAL_WINDOW_LENGTH_DEFAULT 131072
/* How many receiver windows one retransmission may cover, by strategy
 * (tagged uses min's). */
#define FULMAR_FC_UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE 16
#define FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE 4
#define FULMAR_FC_MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE 16

/* fulmar_fc_init's refusals (the struct is left zeroed, safe to close). */
#define FULMAR_FC_INVALID_STRATEGY -1
#define FULMAR_FC_INVALID_TIMEOUT -2        /* a negative receiver timeout */
#define FULMAR_FC_INVALID_GROUP_MIN_SIZE -3 /* negative, for min or tagged */
#define FULMAR_FC_NULL -4                   /* no struct to initialise */

/* One receiver, by the receiver id of its status messages. */
typedef struct fulmar_fc_receiver_stct
{
    int64_t receiver_id;
    int64_t position;                       /* the furthest consumption position it reported */
    int64_t position_plus_window;           /* its right edge in its latest status message */
    int64_t time_of_last_status_message_ns;
    int32_t eos_flagged;                    /* said end of stream (or sent an error): dropped at the next idle */
}
fulmar_fc_receiver_t;

typedef struct fulmar_fc_stct
{
    int32_t strategy;                       /* FULMAR_FC_* */
    int32_t group_min_size;                 /* min and tagged only */
    int64_t receiver_timeout_ns;
    int64_t group_tag;                      /* tagged only */
    int32_t retransmit_receiver_window_multiple;

    /* Min and tagged: a receiver asked for a SETUP; the sender limit when the
     * elicited SETUP went out caps the minimum until a receiver joins or the
     * receiver timeout passes (last_setup_sender_limit, none when
     * has_last_setup_sender_limit is 0). */
    int32_t has_tagged_status_message_triggered_setup;
    int32_t has_last_setup_sender_limit;
    int64_t last_setup_sender_limit;
    int64_t time_of_last_setup_ns;

    /* Tracked receivers, in the order they joined (a malloc'd array that
     * grows; a stream has a handful, so lookups scan it). */
    fulmar_fc_receiver_t *receivers;
    int32_t receiver_count;
    int32_t receiver_capacity;
}
fulmar_fc_t;

/* Sets up a strategy with no receivers.  group_min_size applies to min and
 * tagged, group_tag to tagged; the retransmit window multiple is the
 * strategy's (the field may be changed after).  0, or FULMAR_FC_INVALID_*.
 * Receivers are allocated on first use, so init itself cannot fail for
 * memory.  Initialise a zeroed or closed struct only (an open one leaks). */
int32_t fulmar_fc_init(
    fulmar_fc_t *fc, int32_t strategy, int64_t receiver_timeout_ns, int32_t group_min_size, int64_t group_tag);

/* Frees the receivers; the struct is left as after a failed init. */
void fulmar_fc_close(fulmar_fc_t *fc);

/* A status message arrived (is_eos: its END_OF_STREAM flag); returns the new
 * sender limit.  A position_bits_to_shift outside 0..31 cannot name a
 * position: the message is ignored (sender_limit comes back unchanged).
 * A receiver that cannot be tracked because memory ran out is handled as one
 * the strategy declined to add: max forgets it (it never bounds the limit),
 * min and tagged leave it out of the minimum, as a receiver too far behind. */
int64_t fulmar_fc_on_status_message(
    fulmar_fc_t *fc,
    int32_t consumption_term_id,
    int32_t consumption_term_offset,
    int32_t receiver_window,
    int64_t receiver_id,
    int32_t has_group_tag,
    int64_t group_tag,
    int64_t sender_limit,
    int32_t initial_term_id,
    int32_t position_bits_to_shift,
    int64_t now_ns,
    int32_t is_eos);

/* Periodic upkeep when the sender has nothing to send: drops receivers silent
 * for longer than the receiver timeout (and, for min and tagged, those
 * flagged end of stream); returns the new sender limit. */
int64_t fulmar_fc_on_idle(fulmar_fc_t *fc, int64_t now_ns, int64_t sender_limit, int64_t sender_position, int32_t is_eos);

/* A status message with the SEND_SETUP flag arrived. */
void fulmar_fc_on_trigger_send_setup(
    fulmar_fc_t *fc, int64_t receiver_id, int32_t has_group_tag, int64_t group_tag, int64_t now_ns);

/* An elicited SETUP is about to be sent; returns the sender limit. */
int64_t fulmar_fc_on_setup(
    fulmar_fc_t *fc, int64_t sender_limit, int64_t sender_position, int32_t position_bits_to_shift, int64_t now_ns);

/* An ERR frame arrived from a receiver. */
void fulmar_fc_on_error(fulmar_fc_t *fc, int64_t receiver_id, int32_t has_group_tag, int64_t group_tag, int64_t now_ns);

/* 1 when enough receivers are tracked for the publication to count as
 * connected (min and tagged: at least group_min_size), else 0. */
int32_t fulmar_fc_has_required_receivers(const fulmar_fc_t *fc);

/* The most one NAK may have retransmitted: the least of resend_length, the
 * rest of the term and the strategy's multiple of receiver windows.  fc NULL
 * is not allowed here.  Arguments naming nothing to resend (term_length <= 0,
 * term_offset outside [0, term_length], resend_length <= 0) give 0, where a
 * plain minimum of the three would be negative. */
int32_t fulmar_fc_max_retransmission_length(
    const fulmar_fc_t *fc, int32_t term_offset, int32_t resend_length, int32_t term_length);

/* As fulmar_fc_max_retransmission_length with an explicit window multiple
 * (Aeron's FlowControl.calculateRetransmissionLength); the retransmit
 * handler's default. */
int32_t fulmar_fc_calculate_retransmission_length(
    int32_t resend_length, int32_t term_length, int32_t term_offset, int32_t retransmit_receiver_window_multiple);

/* The window a receiver advertises: the initial window, at most half a term. */
int32_t fulmar_fc_receiver_window_length(int32_t term_length, int32_t initial_window_length);
