/* The archive's recorder thread: records images to their segment files
 * without waking the archive's Python agent.
 *
 * A recording is a hop on the cluster's commit path (a follower's archive
 * records the log before its consensus module may report the position), and
 * a wake-up of the Python agent costs tens of microseconds of CPU before it
 * writes a byte.  This thread sleeps on a doorbell of its own, which the
 * media driver names for the recording subscriptions instead of the
 * archive's (the subscription's doorbell-id), and per block of frames it
 * does what the Python recorder does: one pwrite (of a copy with each DATA
 * frame's CRC-32 in its session id, with the record checksum; plus the
 * allocation of the next chunk of the segment, and the sync of the file at
 * sync levels 1 and 2), then the subscriber position, the rec-pos counter
 * and a ring of the rec-pos watchers.
 *
 * The agent keeps everything else: opening segments, the catalog, events,
 * errors, stopping.  A session is RUNNING until the thread finds it cannot go
 * on alone; then it marks the session and rings the agent's doorbell:
 *   NEEDS_AGENT  the next block starts past the open segment (the agent
 *                writes it through its own path, then resumes the session
 *                with the next segment's file);
 *   FAILED       an allocation, a write or a sync failed (error: the errno,
 *                stage: which call), or the checksum found a frame that is
 *                not whole (stage CHECKSUM, error: what
 *                fulmar_record_checksums returned).
 * HALTED sessions are never touched again (their image or file may go);
 * their state stays readable until the agent releases the slot.  Every call
 * is thread-safe: the agent halts a session from the client conductor's
 * thread when its image goes away. */

#define FULMAR_RECORDER_CAPACITY 64
#define FULMAR_RECORDER_RUNNING 0
#define FULMAR_RECORDER_NEEDS_AGENT 1
#define FULMAR_RECORDER_FAILED 2
#define FULMAR_RECORDER_HALTED 3
#define FULMAR_RECORDER_STAGE_ALLOCATE 1
#define FULMAR_RECORDER_STAGE_WRITE 2
#define FULMAR_RECORDER_STAGE_SYNC 3
#define FULMAR_RECORDER_STAGE_CHECKSUM 4

typedef struct fulmar_recorder_stct fulmar_recorder_t;

typedef struct
{
    char *term_buffers;              /* the image's three terms */
    int32_t term_length;
    int32_t position_bits_to_shift;
    int32_t block_length;            /* the most one write takes */
    int32_t subscriber_position_id;  /* the image's position counter */
    int32_t recording_position_id;   /* the rec-pos counter, whose watchers are rung */
    int32_t fd;                      /* the open segment (borrowed from the agent's writer) */
    int32_t file_sync_level;         /* 0 none, 1 fdatasync, 2 fsync after each write */
    int32_t checksum;                /* 1: the record checksum (fulmar_record_checksums) */
    int32_t allocation_chunk;
    int64_t position;                /* where the next block starts */
    int64_t segment_base;            /* the stream position at the segment's file offset 0 */
    int64_t segment_end;             /* segment_base + segment length */
    int64_t allocated_end;           /* the stream position up to which the file has blocks */
} fulmar_recorder_session_t;

typedef struct
{
    int32_t status;
    int32_t error;                   /* FAILED: the errno */
    int32_t stage;                   /* FAILED: FULMAR_RECORDER_STAGE_* */
    int64_t position;                /* recorded up to here */
    int64_t allocated_end;
    int64_t blocks;                  /* blocks this thread wrote, all in all */
} fulmar_recorder_state_t;

/* Starts the thread (NULL and errno when it cannot).  The doorbells are
 * counter ids in counters_values: its own, and the agent's. */
fulmar_recorder_t *fulmar_recorder_start(
    char *counters_values, int64_t values_length, int32_t doorbell_id, int32_t agent_doorbell_id, int64_t max_wait_ns);
/* Stops and joins the thread, frees the recorder (sessions are only memory). */
void fulmar_recorder_stop(fulmar_recorder_t *recorder);
/* The session's id (never used again once released), or -1 when every slot
 * is taken (or the checksum's scratch block cannot be had).  The calls below
 * take that id; they return -1 for one that is not (or no longer) attached,
 * so a late halt from another thread cannot hit a newer session. */
int64_t fulmar_recorder_attach(fulmar_recorder_t *recorder, const fulmar_recorder_session_t *session);
int32_t fulmar_recorder_state(fulmar_recorder_t *recorder, int64_t session_id, fulmar_recorder_state_t *state);
/* After NEEDS_AGENT: go on from position in the segment the agent opened. */
int32_t fulmar_recorder_resume(
    fulmar_recorder_t *recorder, int64_t session_id, int32_t fd, int64_t position, int64_t segment_base,
    int64_t segment_end, int64_t allocated_end);
int32_t fulmar_recorder_halt(fulmar_recorder_t *recorder, int64_t session_id);
int32_t fulmar_recorder_release(fulmar_recorder_t *recorder, int64_t session_id);
