/* Decoding a recorded cluster log into columns, for the analytics pipeline
 * (fulmar.analytics.log_decoder).  A segment file is walked frame by frame;
 * fragments are reassembled into whole messages; each message's SBE header
 * and the fields of the six log messages are written to one row of
 * caller-owned column arrays, the message bytes to a payload area laid out
 * as an Arrow binary column (offsets[count + 1] into data). */

/* Status after a call (fulmar_log_cursor.status). */
#define FULMAR_LOG_DONE 0            /* reached end_offset */
#define FULMAR_LOG_FULL 1            /* the columns or the payload area are full: call again */
#define FULMAR_LOG_HOLE 2            /* a zero frame length: nothing recorded from here on */
#define FULMAR_LOG_BAD_FRAME -1      /* frame length below the header, or past the end or the term */
#define FULMAR_LOG_BAD_FRAME_TYPE -2 /* neither DATA nor PAD */
#define FULMAR_LOG_BAD_FRAGMENT -3   /* a middle or end fragment with no begin, or a begin inside a message */
#define FULMAR_LOG_SHORT_MESSAGE -4  /* a cluster message shorter than the fields its template has */
#define FULMAR_LOG_UNFINISHED -5     /* the data ends (end_offset or a hole) inside a fragmented message */

/* The cluster schema's id and the templates whose fields are decoded. */
#define FULMAR_LOG_SCHEMA_ID 111
#define FULMAR_LOG_SESSION_MESSAGE 1
#define FULMAR_LOG_TIMER_EVENT 20
#define FULMAR_LOG_SESSION_OPEN 21
#define FULMAR_LOG_SESSION_CLOSE 22
#define FULMAR_LOG_CLUSTER_ACTION 23
#define FULMAR_LOG_NEW_LEADERSHIP_TERM 24
/* The application's bytes follow the session message header (SBE header 8 +
 * block 24: AeronCluster.SESSION_HEADER_LENGTH). */
#define FULMAR_LOG_SESSION_HEADER_LENGTH 32

typedef struct
{
    int32_t capacity;                  /* rows each column array holds */
    int64_t payload_capacity;          /* bytes the payload area holds */
    int64_t *offset;                   /* file offset of the message's first frame */
    int64_t *next_offset;              /* file offset after its last frame (aligned) */
    int32_t *template_id;              /* as in the SBE header, whatever the schema; -1: under 8 bytes */
    int32_t *schema_id;
    int32_t *fragments;                /* frames the message was reassembled from */
    int64_t *leadership_term_id;       /* every template decoded carries one */
    int64_t *cluster_session_id;       /* session message, session open and close */
    int64_t *correlation_id;           /* timer, session open */
    int64_t *timestamp;                /* cluster time, in the cluster's time unit */
    int32_t *code;                     /* leader member id / action / close reason / response stream */
    int32_t *time_unit;                /* new leadership term event */
    int32_t *payload_offsets;          /* capacity + 1 entries, Arrow layout */
    char *payload;                     /* session message: the application's bytes; others: the whole message */
} fulmar_log_columns;

typedef struct
{
    int64_t offset;      /* in: where to decode from; out: where the next call starts (an error: the bad frame) */
    int32_t count;       /* out: rows written by this call */
    int32_t status;      /* out: FULMAR_LOG_* */
    int64_t skipped_pad; /* out: padding frames passed over */
} fulmar_log_cursor;

/* Decodes whole messages from cursor->offset up to end_offset of a segment
 * mapped at `segment` (offsets are file offsets; terms are term_length long
 * and start at multiples of it).  Stops early, before the message that does
 * not fit, when the columns or the payload area are full; at a hole; or at a
 * malformed frame, leaving cursor->offset at it. */
void fulmar_log_decode(
    const char *segment, int64_t end_offset, int32_t term_length, fulmar_log_columns *columns,
    fulmar_log_cursor *cursor);
