/* A leader consensus module's ingress thread: appends the clients' session
 * messages to the log while the module's Python agent sleeps.
 *
 * On a leader every request starts with the module: the client's message
 * lands in the ingress, the module checks that its session is open and its
 * term is this one, and appends it to the log behind a SessionMessageHeader
 * that carries the term, the session and the cluster time.  Done by the
 * agent, that is a wake-up of a Python process at the head of every round
 * trip.
 *
 * The ingress subscription names this thread's doorbell (doorbell-id), so
 * the driver rings it, not the agent, when a client's message lands.  While
 * the thread is not RUNNING each ring is passed on to the agent's doorbell,
 * and the agent reads the ingress as before.
 *
 * The agent arms the thread when it goes to sleep as a steady, active leader
 * with nothing of the ingress left over, and halts it as the first thing of
 * its next cycle: the thread owns the ingress images and the log's exclusive
 * writer only while the agent sleeps, so the writer is never used by two at
 * once (an exclusive publication has one writer at a time).  It is armed
 * with the images (their logs, positions and subscriber-position counters),
 * the log's writer, the term, the open sessions (their ids, ascending), the
 * invalid-requests counter, and where the SessionMessageHeader's and the
 * SessionKeepAlive's fields are: the thread holds no schema facts.
 *
 * RUNNING, it walks each image from where it was handed it.  A whole
 * SessionMessageHeader message of an open session and this term is appended
 * to the log with the cluster time (milliseconds since the epoch, as the
 * agent's clock) in its timestamp field, and the session's last activity is
 * noted; a SessionKeepAlive of an open session notes its activity.  Either
 * of another term, or a session message of a session not open, is counted
 * in invalid-requests and passed over, as the agent does.  Anything else (a
 * connect or close request, a fragment, a keep-alive of a session not open,
 * a malformed frame) stops the walk before it, as does a log that refuses
 * the append (back pressure): the thread turns NEEDS_AGENT and rings the
 * agent, which halts it and reads on itself from where the thread stopped.
 *
 * Halt hands back the positions the thread reached in each image and each
 * armed session's last activity (CLOCK_MONOTONIC ns, 0 for none since the
 * arming); after it returns the thread touches none of the images, the
 * writer or the counters again. */

#define FULMAR_LEADER_INGRESS_IDLE 0
#define FULMAR_LEADER_INGRESS_RUNNING 1
#define FULMAR_LEADER_INGRESS_NEEDS_AGENT 2
/* Why a RUNNING thread turned NEEDS_AGENT (state.reason). */
#define FULMAR_LEADER_INGRESS_OTHER_MESSAGE 1  /* a message the thread does not take */
#define FULMAR_LEADER_INGRESS_BAD_FRAME 2      /* a frame length or type no reader accepts */
#define FULMAR_LEADER_INGRESS_BACK_PRESSURE 3  /* the log refused an append for now */
#define FULMAR_LEADER_INGRESS_PUBLICATION 4    /* the log was CLOSED or past its maximum position */

typedef struct fulmar_leader_ingress_stct fulmar_leader_ingress_t;

typedef struct
{
    char *log;                               /* the image's mapped log (three terms first) */
    int32_t term_length;
    int32_t subscriber_position_id;          /* its sub-pos counter */
    int64_t position;                        /* where the walk starts */
} fulmar_leader_ingress_image_t;

typedef struct
{
    fulmar_log_writer_t *log_writer;         /* the log publication's exclusive writer, the agent's own */
    int64_t leadership_term_id;
    int32_t invalid_requests_id;             /* a counter id */
    int32_t schema_id;
    /* SessionMessageHeader: template and block length in its SBE header, the
     * length of header and block (where the payload starts), and the
     * offsets of its fields from the message's first byte.  A
     * SessionKeepAlive's term and session fields are at the same offsets. */
    int32_t session_message_template_id;
    int32_t session_message_block_length;
    int32_t session_header_length;
    int32_t leadership_term_id_offset;
    int32_t cluster_session_id_offset;
    int32_t timestamp_offset;
    int32_t keep_alive_template_id;
    int32_t keep_alive_block_length;
    int32_t keep_alive_length;               /* its SBE header and block */
} fulmar_leader_ingress_arm_t;

typedef struct
{
    int32_t status;                          /* FULMAR_LEADER_INGRESS_* */
    int32_t reason;                          /* NEEDS_AGENT: why */
    int32_t last_failure;                    /* the code of the last refused append, 0 for none */
    int32_t image_count;
    int32_t session_count;
    int64_t messages;                        /* session messages appended, all in all */
    int64_t keep_alives;                     /* keep-alives taken, all in all */
    int64_t invalid;                         /* messages counted in invalid-requests, all in all */
    int64_t refused;                         /* appends the log refused, all in all */
    int64_t relayed;                         /* rings passed on to the agent, all in all */
    int64_t armings;                         /* all in all */
} fulmar_leader_ingress_state_t;

/* Starts the thread, IDLE (NULL and errno when it cannot).  The doorbells
 * are counter ids in counters_values: its own, and the agent's. */
fulmar_leader_ingress_t *fulmar_leader_ingress_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id);
/* Stops and joins the thread and frees it. */
void fulmar_leader_ingress_stop(fulmar_leader_ingress_t *thread);
/* RUNNING from now with what arm, the images and the session ids (strictly
 * ascending) hold; -1 (and nothing changes) for a counter id outside the
 * counters, a field that does not fit its message, an image or writer with
 * no log, session ids out of order, or no memory for the copies. */
int32_t fulmar_leader_ingress_arm(
    fulmar_leader_ingress_t *thread, const fulmar_leader_ingress_arm_t *arm,
    const fulmar_leader_ingress_image_t *images, int32_t image_count,
    const int64_t *session_ids, int32_t session_count);
/* IDLE from now.  Fills state, and where given (up to their capacities) the
 * positions reached in the armed images and each armed session's last
 * activity; the thread is done with images, writer and counters when this
 * returns. */
void fulmar_leader_ingress_halt(
    fulmar_leader_ingress_t *thread, fulmar_leader_ingress_state_t *state,
    int64_t *image_positions, int32_t image_capacity, int64_t *activity_ns, int32_t session_capacity);
void fulmar_leader_ingress_state(fulmar_leader_ingress_t *thread, fulmar_leader_ingress_state_t *state);
/* The status alone: the agent's look before it sleeps (a hand-back's ring
 * that came while it was awake is not lost). */
int32_t fulmar_leader_ingress_status(fulmar_leader_ingress_t *thread);
