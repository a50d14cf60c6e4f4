/* The sender's clockwork for one network publication: when SETUP frames and
 * heartbeats are due, and which receivers are live (timing as Aeron's
 * NetworkPublication), pure state: every call takes now_ns.
 *
 * One duty cycle:
 *
 *     due = setup_due(now); if due: (ELICITED: flow control on_setup) send SETUP
 *     send data; if any: on_data_sent(now)
 *     else: if heartbeat_due(now): send heartbeat; flow control on_idle; on_idle(now)
 *
 * and, new in C, a driver thread that sleeps wakes no later than
 * fulmar_sender_timing_next_deadline_ns. */

/* Aeron's Configuration.java / aeron_driver_context.c. */
#define FULMAR_PUBLICATION_SETUP_TIMEOUT_NS 100000000
#define FULMAR_PUBLICATION_HEARTBEAT_TIMEOUT_NS 100000000
#define FULMAR_PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS 5000000000

/* fulmar_sender_timing_setup_due's answer: ELICITED means a receiver asked,
 * so the flow control's on_setup must see it before the SETUP is sent. */
#define FULMAR_SETUP_NO 0
#define FULMAR_SETUP_INITIAL 1
#define FULMAR_SETUP_ELICITED 2

/* fulmar_sender_timing_init's refusals. */
#define FULMAR_SENDER_TIMING_INVALID_TIMEOUT -1 /* a negative timeout or interval */
#define FULMAR_SENDER_TIMING_NULL -2

/* A live receiver: one whose status messages keep arriving. */
typedef struct fulmar_sender_liveness_stct
{
    int64_t receiver_id;
    int64_t last_status_message_ns;
}
fulmar_sender_liveness_t;

typedef struct fulmar_sender_timing_stct
{
    int64_t connection_timeout_ns;
    int64_t setup_timeout_ns;
    int64_t heartbeat_timeout_ns;
    /* Until a first status message SETUP goes again after this interval,
     * doubling up to the setup timeout, so a receiver that subscribes just
     * after the first SETUP connects in milliseconds. */
    int64_t setup_interval_ns;
    int64_t initial_setups_sent;
    int64_t time_of_last_setup_ns;
    int64_t time_of_last_data_or_heartbeat_ns;
    int64_t time_of_last_status_message_ns;  /* meaningful when has_status_message_time */
    int32_t has_status_message_time;         /* 0: nothing heard yet */
    int32_t has_initial_connection;
    int32_t is_setup_elicited;
    int32_t has_receivers;

    /* The liveness tracker: a malloc'd array that grows, in no particular order. */
    fulmar_sender_liveness_t *receivers;
    int32_t receiver_count;
    int32_t receiver_capacity;
}
fulmar_sender_timing_t;

/* Sets up a publication's timing at now_ns: SETUP and heartbeat are both due
 * at the first check.  initial_setup_interval_ns 0 means the setup timeout
 * (Aeron's pace from the start); a longer one is cut to it.  0, or
 * FULMAR_SENDER_TIMING_INVALID_TIMEOUT / _NULL (the struct is left zeroed).
 * Initialise a zeroed or closed struct only (an open one leaks). */
int32_t fulmar_sender_timing_init(
    fulmar_sender_timing_t *t,
    int64_t now_ns,
    int64_t connection_timeout_ns,
    int64_t setup_timeout_ns,
    int64_t heartbeat_timeout_ns,
    int64_t initial_setup_interval_ns);

/* Frees the liveness tracker; the struct is left zeroed. */
void fulmar_sender_timing_close(fulmar_sender_timing_t *t);

/* A status message arrived (is_eos: its END_OF_STREAM flag).  1 when it made
 * receivers live (none were before).  A receiver that cannot be tracked
 * because memory ran out is not live, as if its message had not come. */
int32_t fulmar_sender_timing_on_status_message(fulmar_sender_timing_t *t, int64_t receiver_id, int32_t is_eos, int64_t now_ns);

/* A status message with SEND_SETUP arrived; ignored once the publication is
 * at end of stream. */
void fulmar_sender_timing_on_trigger_send_setup(fulmar_sender_timing_t *t, int64_t now_ns, int32_t is_end_of_stream);

/* An ERR frame arrived from a receiver: it is gone.  1 if it was live. */
int32_t fulmar_sender_timing_on_error(fulmar_sender_timing_t *t, int64_t receiver_id);

/* Is a SETUP due now (FULMAR_SETUP_*)?  If so the caller sends one: the send
 * is recorded here. */
int32_t fulmar_sender_timing_setup_due(fulmar_sender_timing_t *t, int64_t now_ns);

/* 1 while SETUPs still go faster than the setup timeout (no receiver has
 * answered yet). */
int32_t fulmar_sender_timing_setup_backing_off(const fulmar_sender_timing_t *t);

/* Is a heartbeat due (asked only when no data went out)?  If so the caller
 * sends one: recorded here. */
int32_t fulmar_sender_timing_heartbeat_due(fulmar_sender_timing_t *t, int64_t now_ns);

void fulmar_sender_timing_on_data_sent(fulmar_sender_timing_t *t, int64_t now_ns);

/* Forgets receivers silent for the connection timeout or more. */
void fulmar_sender_timing_on_idle(fulmar_sender_timing_t *t, int64_t now_ns);

/* 1 when a receiver is live and the flow control has its required group. */
int32_t fulmar_sender_timing_is_connected(const fulmar_sender_timing_t *t, int32_t has_required_receivers);

/* The earliest now_ns at which setup_due or heartbeat_due would next say
 * "due", or on_idle would forget a live receiver, given no other call in
 * between; INT64_MAX when none can.  Before it, all three are no-ops. */
int64_t fulmar_sender_timing_next_deadline_ns(const fulmar_sender_timing_t *t);
