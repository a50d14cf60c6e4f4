/* A consensus module's commit thread.  On a leader it reads the followers'
 * AppendPositions, moves commit-pos once a quorum has recorded, and tells
 * the followers the new commit position; on a follower it reads the leader's
 * CommitPositions and the log, and moves commit-pos; both without waking the
 * module's Python agent.  (The follower's side is described after the
 * leader's.)
 *
 * On a leader the commit path runs: a follower's AppendPosition lands in the
 * module's consensus subscription, the module takes the quorum position of
 * what the members have recorded, sets commit-pos (its services apply up to
 * it) and sends CommitPosition to every follower.  Done by the agent, that is
 * a wake-up of a Python process in the middle of every round trip, and a
 * second one when the other follower's report lands.
 *
 * The consensus subscription names this thread's doorbell (doorbell-id), so
 * the driver rings it, not the agent, when a consensus message lands.  While
 * the thread is not RUNNING (on a follower, a candidate, a leader the agent
 * has not armed) each ring is passed on to the agent's doorbell: the agent
 * reads the stream as before, one relay later.
 *
 * The agent arms it once it is a steady leader with what it needs: the
 * subscription's images (their logs, positions and subscriber-position
 * counters), the followers (their member ids, recorded positions, and a
 * concurrent writer of the publication to each), the term, the commit rule's
 * floor (the term's base position: a commit must include an entry of this
 * term), the leader's own rec-pos counter, the commit-pos counter, where the
 * AppendPosition's fields are, and the encoded CommitPosition with every
 * field filled but the position.  The thread holds no schema facts.
 *
 * RUNNING, it walks each image from where it was handed it.  An
 * AppendPosition (an unfragmented message of the armed schema and template)
 * of this term from an armed follower raises that follower's position and
 * time; one of another term or member is passed over, as the agent does.
 * Anything else stops the walk before it: the thread turns NEEDS_AGENT and
 * rings the agent, which halts it, takes the images back at the positions
 * the thread reached, and reads on itself.  After each walk the commit
 * position is min(quorum of the members' positions, the leader's own
 * recording), as Aeron's updateLeaderPosition; when it passes the armed
 * floor and the last commit it is stored in commit-pos, whose watchers are
 * rung, and a CommitPosition goes to every follower.  The leader's rec-pos is
 * watched by this thread's doorbell only while the followers alone would
 * commit past it (then it is what holds the commit).
 *
 * The agent keeps the rest: elections, catch-up, the liveness of the
 * followers (from the times here), the sweep of uncommitted state, and the
 * heartbeat, a CommitPosition a heartbeat interval after the last, which it
 * asks of this thread (send_now).  After halt returns the thread touches
 * none of the images, writers or counters again.
 *
 * On a follower the same subscription brings the leader's CommitPositions,
 * one after each commit and one a heartbeat interval after the last.  The
 * agent reads each, raises the commit position it was notified of, reads
 * the log up to min(notified, its own recording) and moves commit-pos to
 * what it has read, so that its services, which read the log up to
 * commit-pos, never apply an entry before their module has.  That is two
 * wake-ups per commit (the relay and the Python agent) on each follower, on
 * two shared cores, while the leader's service and driver answer the
 * client.  Armed by arm_follower (a steady, ACTIVE follower), the thread
 * does it:
 *  - a CommitPosition of the armed term and leader raises the notified
 *    position and the time the leader was last heard from; one of an older
 *    term or of another member is passed over, as the agent does; one of a
 *    newer term, or any other message, is handed back (NEEDS_AGENT,
 *    OTHER_MESSAGE): the agent starts an election or reads it;
 *  - the log is read up to min(notified, rec-pos) across client session
 *    messages (unfragmented, the session message header's schema, template
 *    and block length, a session id that is not negative) and padding.  The
 *    agent does nothing with those but note the session's activity, which
 *    only a leader's session timeouts read, and which a new leader resets
 *    for every session.  Any other entry (a session opened or closed, a
 *    timer, a service's message, a cluster action, a new term, a fragment)
 *    stops the read before it and is handed back (LOG_MESSAGE): the agent
 *    applies it itself;
 *  - commit-pos moves to what was read, and its watchers are rung;
 *  - rec-pos is watched only while the notified position is past it.
 * The agent takes the notified position, the leader's time, the log's
 * position and the commit from the state at the start of each cycle, and
 * halts the thread for anything else (an election, a hand-back, a new or
 * lost image).
 *
 * In a cluster with a secret both arms name the members' auth context
 * (member_auth.h).  A leader's thread checks each AppendPosition's trailer
 * before it takes it (its followerMemberId must be the trailer's sender)
 * and signs each CommitPosition for the follower it goes to; a follower's
 * checks each CommitPosition (its leaderMemberId must be the sender).  A
 * message that fails the check is handed back unread (NEEDS_AGENT,
 * OTHER_MESSAGE, and state.unauthenticated counts it): the agent's guard
 * checks it again, and since a failed check changes no replay state, it
 * finds the same fault, counts the refusal and logs it.  Anyone who can
 * reach the consensus endpoint can thus make the thread hand the stream back
 * (and the agent arm it again); that costs the agent a wake-up, not
 * correctness: nothing unauthenticated is ever taken. */

#define FULMAR_LEADER_COMMIT_IDLE 0
#define FULMAR_LEADER_COMMIT_RUNNING 1
#define FULMAR_LEADER_COMMIT_NEEDS_AGENT 2
#define FULMAR_LEADER_COMMIT_MAX_IMAGES 16
#define FULMAR_LEADER_COMMIT_MAX_FOLLOWERS 8
/* A CommitPosition (28 bytes) and its trailer (56). */
#define FULMAR_LEADER_COMMIT_MESSAGE_CAPACITY 128
/* Why a RUNNING thread turned NEEDS_AGENT (state.reason). */
#define FULMAR_LEADER_COMMIT_OTHER_MESSAGE 1   /* a message that is not a whole AppendPosition */
#define FULMAR_LEADER_COMMIT_BAD_FRAME 2       /* a frame length or type no reader accepts */
#define FULMAR_LEADER_COMMIT_RECORDING_GONE 3  /* rec-pos's registration id changed */
#define FULMAR_LEADER_COMMIT_PUBLICATION 4     /* a writer was CLOSED or past its maximum position */
#define FULMAR_LEADER_COMMIT_LOG_MESSAGE 5     /* a follower's log holds an entry other than a client's message */

typedef struct fulmar_leader_commit_stct fulmar_leader_commit_t;

typedef struct
{
    char *log;                               /* the image's mapped log (three terms first) */
    int32_t term_length;
    int32_t subscriber_position_id;          /* its sub-pos counter */
    int64_t position;                        /* where the walk starts */
} fulmar_leader_commit_image_t;

typedef struct
{
    fulmar_log_writer_t writer;              /* a copy of a concurrent writer of the publication to it */
    int32_t member_id;
    int64_t log_position;                    /* what it has reported recording */
    int64_t time_ns;                         /* when it last reported (CLOCK_MONOTONIC, as time.monotonic_ns) */
} fulmar_leader_commit_follower_t;

typedef struct
{
    int32_t image_count;
    int32_t follower_count;
    fulmar_leader_commit_image_t images[FULMAR_LEADER_COMMIT_MAX_IMAGES];
    fulmar_leader_commit_follower_t followers[FULMAR_LEADER_COMMIT_MAX_FOLLOWERS];
    int64_t leadership_term_id;
    int64_t term_base_log_position;          /* a commit must pass it */
    int64_t commit_position;                 /* the commit so far */
    int64_t sent_position;                   /* what the followers were told last */
    int64_t sent_time_ns;
    int32_t recording_position_id;           /* the leader's own rec-pos */
    int64_t recording_position_registration_id;
    int32_t commit_position_id;              /* commit-pos: stored, its watchers rung */
    /* The AppendPosition: schema and template in its SBE header, and its
     * fields' offsets from the message's first byte. */
    int32_t schema_id;
    int32_t append_position_template_id;
    int32_t append_position_length;          /* the shortest message holding every field below */
    int32_t append_position_block_length;    /* its SBE block length: a message with any other goes to the agent */
    int32_t leadership_term_id_offset;
    int32_t log_position_offset;
    int32_t follower_member_id_offset;
    /* The CommitPosition, position aside. */
    int32_t message_length;
    int32_t position_offset;
    char message[FULMAR_LEADER_COMMIT_MESSAGE_CAPACITY];
    fulmar_member_auth_t *auth;              /* checks the AppendPositions, signs the CommitPositions; NULL: neither */
} fulmar_leader_commit_arm_t;

typedef struct
{
    int32_t image_count;
    fulmar_leader_commit_image_t images[FULMAR_LEADER_COMMIT_MAX_IMAGES];  /* the consensus subscription's */
    fulmar_leader_commit_image_t log;        /* the log's image, read up to the commit */
    int64_t leadership_term_id;
    int32_t leader_member_id;
    int64_t notified_commit_position;        /* what the leader said so far */
    int64_t commit_position;                 /* commit-pos so far (the log's position: all read is committed) */
    int64_t leader_time_ns;                  /* when the leader was last heard from (CLOCK_MONOTONIC) */
    int32_t recording_position_id;           /* this member's rec-pos of the log */
    int64_t recording_position_registration_id;
    int32_t commit_position_id;
    int32_t schema_id;                       /* the cluster's: consensus and log messages alike */
    /* The CommitPosition: its template, the shortest message holding the
     * fields below, and their offsets from the message's first byte. */
    int32_t commit_position_template_id;
    int32_t commit_position_length;
    int32_t commit_position_block_length;    /* a message with any other goes to the agent */
    int32_t leadership_term_id_offset;
    int32_t log_position_offset;
    int32_t leader_member_id_offset;
    /* The SessionMessageHeader that heads a client's message in the log. */
    int32_t session_message_template_id;
    int32_t session_message_block_length;
    int32_t cluster_session_id_offset;       /* from the message's first byte */
    fulmar_member_auth_t *auth;              /* checks the CommitPositions; NULL: no check */
} fulmar_follower_commit_arm_t;

typedef struct
{
    int32_t status;                          /* FULMAR_LEADER_COMMIT_* */
    int32_t reason;                          /* NEEDS_AGENT: why */
    int32_t last_failure;                    /* the code of the last refused offer, 0 for none */
    int32_t follower_count;
    int32_t image_count;
    int64_t commit_position;
    int64_t sent_position;
    int64_t sent_time_ns;
    int64_t follower_positions[FULMAR_LEADER_COMMIT_MAX_FOLLOWERS];
    int64_t follower_times_ns[FULMAR_LEADER_COMMIT_MAX_FOLLOWERS];
    int64_t image_positions[FULMAR_LEADER_COMMIT_MAX_IMAGES];
    int64_t append_positions;                /* AppendPositions read, all in all */
    int64_t commits;                         /* commit-pos moves, all in all */
    int64_t commit_positions_sent;           /* CommitPositions appended, all in all */
    int64_t refused;                         /* offers refused, all in all */
    int64_t relayed;                         /* rings passed on to the agent, all in all */
    /* A follower's (arm_follower). */
    int64_t notified_commit_position;
    int64_t leader_time_ns;
    int64_t log_position;
    int64_t commit_positions_read;           /* CommitPositions read, all in all */
    int64_t log_messages;                    /* client messages of the log read, all in all */
    int64_t unauthenticated;                 /* messages handed back for their trailer, all in all */
} fulmar_leader_commit_state_t;

/* Starts the thread, IDLE (NULL and errno when it cannot).  The doorbells
 * are counter ids in counters_values: its own, and the agent's. */
fulmar_leader_commit_t *fulmar_leader_commit_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id);
/* Stops and joins the thread and frees it. */
void fulmar_leader_commit_stop(fulmar_leader_commit_t *thread);
/* RUNNING from now, with what arm holds (no followers: a single member, whose
 * own recording is its quorum: rec-pos is then always watched, and no
 * CommitPosition goes anywhere); -1 (and nothing changes) for counts
 * outside the capacities, a message or field offsets that do not fit, a
 * counter id outside the counters, or an image or writer with no log. */
int32_t fulmar_leader_commit_arm(fulmar_leader_commit_t *thread, const fulmar_leader_commit_arm_t *arm);
/* RUNNING from now as a follower's thread; -1 (and nothing changes) as arm. */
int32_t fulmar_leader_commit_arm_follower(fulmar_leader_commit_t *thread, const fulmar_follower_commit_arm_t *arm);
/* IDLE from now (the state keeps the positions reached); the thread is done
 * with the images, writers and counters when this returns. */
void fulmar_leader_commit_halt(fulmar_leader_commit_t *thread);
/* Send the commit position once more to every follower (a heartbeat),
 * unless the thread sent it at or after since_ns (CLOCK_MONOTONIC: the
 * agent's look that found the heartbeat due); -1 unless RUNNING as a leader's. */
int32_t fulmar_leader_commit_send_now(fulmar_leader_commit_t *thread, int64_t since_ns);
void fulmar_leader_commit_state(fulmar_leader_commit_t *thread, fulmar_leader_commit_state_t *state);
/* The status alone: the agent's look before it sleeps (a hand-back's ring
 * that came while it was awake is not lost). */
int32_t fulmar_leader_commit_status(fulmar_leader_commit_t *thread);
