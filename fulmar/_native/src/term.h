/* Log buffer append and scan: Aeron's term appenders (concurrent and
 * exclusive), rotation, and a scanner that returns fragments in batches. */

#define FULMAR_HEADER_LENGTH 32
#define FULMAR_FRAME_ALIGNMENT 32
#define FULMAR_PARTITION_COUNT 3
#define FULMAR_LOG_META_DATA_LENGTH 4096
#define FULMAR_BATCH_CAPACITY 4096

/* Publication results: the positive values are new stream positions. */
#define FULMAR_NOT_CONNECTED -1
#define FULMAR_BACK_PRESSURED -2
#define FULMAR_ADMIN_ACTION -3
#define FULMAR_CLOSED -4
#define FULMAR_MAX_POSITION_EXCEEDED -5
#define FULMAR_MESSAGE_TOO_LONG -6
#define FULMAR_INVALID_LENGTH -7
#define FULMAR_INVALID_BLOCK -8

/* Scan results. */
#define FULMAR_SCAN_CORRUPT_FRAME -1

typedef struct
{
    char *log;                      /* first byte of the mapped log buffer file */
    char *metadata;                 /* log + 3 * term_length */
    char *position_limit;           /* int64 publisher limit, NULL for none */
    char *doorbell;                 /* rung after each append when it has waiters; NULL for none */
    char *counters_values;          /* cnc.dat's counters values: ring the log's readers (doorbell.h); NULL: don't */
    int64_t counters_values_length;
    char *relay_doorbell;           /* rung too when the log's reader table says relay; NULL for none */
    int32_t doorbell_fd;            /* >= 0: doorbell is a FIFO doorbell (doorbell.h), rung through this FIFO */
    int32_t relay_doorbell_fd;      /* the same for relay_doorbell */
    char *messages_counter;         /* int64 count of messages appended; NULL for none */
    int32_t term_length;
    int32_t position_bits_to_shift;
    int32_t initial_term_id;
    int32_t max_payload_length;     /* mtu - header */
    int32_t max_message_length;     /* min(term_length / 8, 16 MiB) */
    int32_t session_id;
    int32_t stream_id;
    int64_t max_possible_position;
    /* The exclusive writer's own copy of where it is; unused when concurrent. */
    int32_t term_id;
    int32_t term_offset;
    int32_t active_partition_index;
    int64_t term_begin_position;
    /* Non-zero: an append marks rings_pending instead of ringing; the owner
     * rings once with fulmar_log_writer_ring() at the end of its duty cycle. */
    int32_t defer_rings;
    int32_t rings_pending;
} fulmar_log_writer_t;

typedef struct
{
    int64_t position;               /* where the claimed frame starts */
    int32_t frame_offset;           /* offset of the frame header from the log's first byte */
    int32_t frame_length;
} fulmar_claim_t;

typedef struct
{
    int32_t count;                  /* data fragments in the batch (padding excluded) */
    int32_t reserved;
    int64_t next_position;          /* position after the last frame consumed, padding included */
    int32_t frame_offsets[4096];    /* header offset of each fragment from the log's first byte */
    int32_t frame_lengths[4096];    /* frame length including the header */
    uint8_t flags[4096];
} fulmar_fragment_batch_t;

void fulmar_log_writer_init(
    fulmar_log_writer_t *writer, char *log, int32_t term_length, int32_t mtu, int32_t initial_term_id,
    char *position_limit, int32_t session_id, int32_t stream_id);

/* Many writers, in any processes: claims space with get-and-add on the tail. */
int64_t fulmar_concurrent_offer(
    fulmar_log_writer_t *writer, const char *payload, int32_t length, int64_t reserved_value);
int64_t fulmar_concurrent_claim(fulmar_log_writer_t *writer, int32_t length, fulmar_claim_t *claim);

/* One writer: tracks its own tail and publishes it with release stores. */
int64_t fulmar_exclusive_offer(
    fulmar_log_writer_t *writer, const char *payload, int32_t length, int64_t reserved_value);
int64_t fulmar_exclusive_claim(fulmar_log_writer_t *writer, int32_t length, fulmar_claim_t *claim);
int64_t fulmar_exclusive_offer_batch(
    fulmar_log_writer_t *writer, const char *data, const int32_t *lengths, int32_t count,
    int64_t reserved_value, int32_t *appended);

/* Appends frames already laid out as in a term (an archive replay): the
 * block must start at the writer's tail, hold whole frames whose term offset
 * and term id match where they land, and end within the term.  Session and
 * stream ids are rewritten to the writer's; the first frame's length is
 * stored last, so readers see the block all at once.  Returns the new
 * position, a back-pressure code, ADMIN_ACTION after moving to the next
 * term, or FULMAR_INVALID_BLOCK. */
int64_t fulmar_exclusive_append_block(fulmar_log_writer_t *writer, const char *block, int32_t length);

/* A claim is published by its commit, or turned into padding by its abort. */
void fulmar_claim_commit(fulmar_log_writer_t *w, const fulmar_claim_t *claim);
void fulmar_claim_abort(char *log, const fulmar_claim_t *claim);

/* Rings what the deferred appends since the last call would have rung; 1 if any. */
int32_t fulmar_log_writer_ring(fulmar_log_writer_t *w);

/* The archive's record checksum (fulmar.archive.segment): before a block of
 * frames is written to a segment, each DATA frame's CRC-32 (zlib's, i.e.
 * java.util.zip.CRC32's) over its bytes after the header, padding to the
 * frame alignment included, replaces the frame's session id; PAD frames keep
 * theirs (Aeron records only a padding frame's header).  Returns the offset
 * after the last whole frame (the block's length when it ends on a frame), or
 * FULMAR_CHECKSUM_BAD_FRAME - offset when the frame at offset has a length
 * below the header's. */
#define FULMAR_CHECKSUM_BAD_FRAME -1
int32_t fulmar_record_checksums(char *block, int32_t length);

/* Reads frames from position up to limit_position or the end of the term,
 * at most fragment_limit data fragments (capped at FULMAR_BATCH_CAPACITY). */
int32_t fulmar_log_scan(
    const char *log, int32_t term_length, int32_t initial_term_id, int64_t position,
    int64_t limit_position, int32_t fragment_limit, fulmar_fragment_batch_t *batch);

/* A cluster log's SessionMessageHeader as its frames carry it (the SBE
 * message header, then the block: leadershipTermId, clusterSessionId,
 * timestamp), PROTOCOL.md and Aeron's cluster schema. */
#define FULMAR_CLUSTER_SCHEMA_ID 111
#define FULMAR_SESSION_MESSAGE_TEMPLATE_ID 1
#define FULMAR_SESSION_MESSAGE_BLOCK_LENGTH 24
#define FULMAR_SESSION_HEADER_LENGTH 32

typedef struct
{
    int64_t leadership_term_ids[4096];
    int64_t session_ids[4096];      /* clusterSessionId: a client's, or a service's (negative) */
    int64_t timestamps[4096];       /* in a log, the leader's cluster time when it appended the message */
    int64_t end_positions[4096];    /* the stream position after the message's frame */
    int32_t message_offsets[4096];  /* where the message (its session header first) starts in the log */
    int32_t message_lengths[4096];  /* session header included */
} fulmar_session_messages_t;

/* How many fragments of a batch that fulmar_log_scan read from `position`,
 * from index `first` on, are whole client messages of a cluster log in a
 * row: unfragmented frames whose payload starts with a SessionMessageHeader
 * (block length 24, template 1, schema 111) and holds all of it.  Fills
 * out's entries 0.. for them.  The consensus module and the services read
 * such a run without a Python call per frame. */
int32_t fulmar_batch_session_messages(
    const char *log, const fulmar_fragment_batch_t *batch, int32_t first, int64_t position, int32_t term_length,
    fulmar_session_messages_t *out);

/* The physical reference for the benchmark: the same append + scan loop as
 * the Python API performs, all in C. Returns messages scanned. */
int64_t fulmar_bench_exclusive_append_scan(
    fulmar_log_writer_t *writer, int32_t message_length, int64_t message_count,
    fulmar_fragment_batch_t *batch);

/* The position just after the last claimed byte of the active term: the
 * producer position the driver reads for every publication on every duty
 * cycle, in one call (two atomic loads and the arithmetic). */
int64_t fulmar_log_producer_position(
    const char *metadata, int32_t term_length, int32_t position_bits_to_shift, int32_t initial_term_id);

/* Zeroes the log between two positions (already consumed by every reader)
 * so the space can be written again when the partitions come round. */
void fulmar_log_clean(char *log, int32_t term_length, int64_t from_position, int64_t to_position);

/* Aeron's TermScanner: how many bytes of whole committed frames from
 * term_offset fit in max_length (at most an MTU).  Returns the length
 * available; *padding receives the length of a padding frame that ends the
 * run (sent as its header only, then skipped).  0 when nothing is ready. */
int32_t fulmar_term_scan_for_availability(
    const char *term, int32_t term_length, int32_t term_offset, int32_t max_length, int32_t *padding);

/* A network publication's sender: the datagrams to send from position, at
 * most max_length bytes of whole committed frames, each datagram at most an
 * MTU, within position's term, at most max_datagrams of them (each
 * fulmar_term_scan_for_availability).  A padding frame ends the run: its
 * header is sent, the rest of the term skipped.  Fills regions with
 * (offset from the log's first byte, length) pairs, returns how many, and
 * sets *advance to how far the position moves (sent bytes and skipped padding). */
int32_t fulmar_term_pack_datagrams(
    const char *log, int32_t term_length, int64_t position, int64_t max_length, int32_t mtu,
    int32_t max_datagrams, int32_t *regions, int64_t *advance);

/* Aeron's TermBlockScanner: the offset after the last whole committed frame
 * (data or padding) from term_offset before limit_offset (a length below a
 * header's ends the run), so a recorder can
 * take [term_offset, result) as one block.  limit_offset is at most the
 * term length and should leave room for an MTU, or a long frame never fits. */
int32_t fulmar_term_block_scan(const char *term, int32_t term_offset, int32_t limit_offset);
