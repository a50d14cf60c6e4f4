/* A follower consensus module's AppendPosition thread: tells the leader how
 * far this member's archive has recorded the log, without waking the
 * module's Python agent.
 *
 * On a follower the commit path runs: the leader's log reaches this
 * member's driver, its archive records it (a C thread, recorder.h), and the
 * module reports the recorded position to the leader in an AppendPosition.
 * Done by the agent, that report is a wake-up of a Python process in the
 * middle of every round trip.  This thread sleeps on a doorbell of its own
 * that watches the log recording's rec-pos counter (the archive rings its
 * watchers), and when rec-pos passes what it last sent it appends one
 * AppendPosition to the publication to the leader and the driver sends it.
 *
 * The agent arms it once its election closed as a follower, with what it
 * needs: a concurrent writer of its publication to the leader (the agent
 * sends its other messages on the same publication), the rec-pos counter and
 * its registration id, and the message with every field filled but the
 * position (message and position_offset: the thread knows nothing of the
 * schema).  The agent keeps the rest: elections, catch-up, and the
 * heartbeat, an AppendPosition a heartbeat interval after the last, which it
 * asks of this thread (send_now) so that one sender keeps the positions in
 * order.  The agent halts it before anything else may take over the
 * reports (an election, a step down, the close): after halt returns the
 * thread touches neither the writer nor the counter again.
 *
 * In a cluster with a secret the arm names the members' auth context
 * (member_auth.h) and the leader's member id: each AppendPosition leaves
 * with a fresh trailer (the next counter of the process, CLOCK_REALTIME's
 * epoch milliseconds, the MAC); without one (auth NULL) it leaves as the
 * agent encoded it, unsigned.
 *
 * A RUNNING sender turns NEEDS_AGENT, and rings the agent's doorbell, when
 * it cannot go on alone: the rec-pos counter is no longer the one armed (its
 * registration id changed: the recording stopped), or the publication is
 * closed or full for good (CLOSED, MAX_POSITION_EXCEEDED).  An offer refused
 * for a while (NOT_CONNECTED, BACK_PRESSURED) is tried again after
 * retry_wait_ns, or sooner when rec-pos moves. */

#define FULMAR_APPEND_POSITION_IDLE 0
#define FULMAR_APPEND_POSITION_RUNNING 1
#define FULMAR_APPEND_POSITION_NEEDS_AGENT 2
/* An AppendPosition (29 bytes today, more in a later version) and its trailer (56). */
#define FULMAR_APPEND_POSITION_MESSAGE_CAPACITY 128

typedef struct fulmar_append_position_sender_stct fulmar_append_position_sender_t;

typedef struct
{
    fulmar_log_writer_t writer;              /* a copy of a concurrent writer of the publication to the leader */
    int32_t recording_position_id;           /* the log recording's rec-pos counter */
    int64_t recording_position_registration_id;
    int64_t sent_position;                   /* what the leader was told last (sent again only when passed) */
    int64_t sent_time_ns;                    /* and when (CLOCK_MONOTONIC, as time.monotonic_ns) */
    int32_t message_length;                  /* the encoded AppendPosition, position aside */
    int32_t position_offset;                 /* where its int64 log position goes */
    char message[FULMAR_APPEND_POSITION_MESSAGE_CAPACITY];
    fulmar_member_auth_t *auth;              /* signs each message for the leader; NULL: unsigned */
    int32_t leader_member_id;                /* the trailer's receiver (with auth) */
} fulmar_append_position_arm_t;

typedef struct
{
    int32_t status;                          /* FULMAR_APPEND_POSITION_* */
    int32_t last_failure;                    /* the code of the last refused offer, 0 for none */
    int64_t sent_position;
    int64_t sent_time_ns;
    int64_t sent;                            /* AppendPositions this thread appended, all in all */
    int64_t refused;                         /* offers refused, all in all */
} fulmar_append_position_state_t;

/* Starts the thread (NULL and errno when it cannot).  The doorbells are
 * counter ids in counters_values: its own, and the agent's. */
fulmar_append_position_sender_t *fulmar_append_position_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id,
    int64_t retry_wait_ns);
/* Stops and joins the thread and frees it. */
void fulmar_append_position_stop(fulmar_append_position_sender_t *sender);
/* RUNNING from now, with what arm holds; -1 (and nothing changes) for a
 * message that does not fit (with its trailer, when signed), a position offset outside it, or a counter id
 * outside the counters.  The caller watches rec-pos with this thread's
 * doorbell first. */
int32_t fulmar_append_position_arm(fulmar_append_position_sender_t *sender, const fulmar_append_position_arm_t *arm);
/* IDLE from now; the thread is done with the writer and the counter when
 * this returns. */
void fulmar_append_position_halt(fulmar_append_position_sender_t *sender);
/* Send the recorded position once more, even if it was sent (a heartbeat),
 * unless the thread sent one at or after since_ns (CLOCK_MONOTONIC: the
 * agent's look at the state that found the heartbeat due); -1 unless RUNNING. */
int32_t fulmar_append_position_send_now(fulmar_append_position_sender_t *sender, int64_t since_ns);
void fulmar_append_position_state(fulmar_append_position_sender_t *sender, fulmar_append_position_state_t *state);
/* The status alone: the agent's look before it sleeps (a hand-back's ring
 * that came while it was awake is not lost). */
int32_t fulmar_append_position_status(fulmar_append_position_sender_t *sender);
