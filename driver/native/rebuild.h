/* The receiving side of a network image: inserting DATA datagrams into a
 * term in whatever order they arrive (Aeron's TermRebuilder), and finding
 * how far the term is contiguous and where the first gap is (Aeron's
 * TermGapScanner).  Each call handles a whole datagram or a whole term scan. */

/* fulmar_term_insert rejects a datagram with one of these (nothing written);
 * otherwise it returns how many frames it wrote (0: all were already there). */
#define FULMAR_REBUILD_BAD_PARTITION -1
#define FULMAR_REBUILD_BAD_TERM_OFFSET -2
#define FULMAR_REBUILD_BAD_LENGTH -3
#define FULMAR_REBUILD_OVERRUNS_TERM -4
#define FULMAR_REBUILD_BAD_FRAME -5

/* Inserts the frames of one datagram at term_offset of the partition.  Each
 * frame whose slot is still empty is copied, all but its first 8 bytes, and
 * then published by a release store of that first word (length, version,
 * flags, type), so a reader never sees a partial frame.  Slots already
 * filled are left alone: duplicates and overlapping resends are no-ops. */
int32_t fulmar_term_insert(
    char *log, int32_t term_length, int32_t partition_index, int32_t term_offset,
    const char *datagram, int32_t length);

/* The offset where the run of complete frames starting at term_offset ends,
 * scanning no frame that starts at or after limit_offset.  It can pass
 * limit_offset: the last frame may end beyond it (a padding frame received
 * as its header only covers the rest of the term).  Negative: bad argument. */
int32_t fulmar_term_contiguous_end(
    const char *log, int32_t term_length, int32_t partition_index, int32_t term_offset, int32_t limit_offset);

/* As fulmar_term_contiguous_end; when the result is below limit_offset it is
 * the start of a gap, and *gap_length is set to the gap's length: up to the
 * next received frame or to limit_offset (else *gap_length is 0). */
int32_t fulmar_term_scan_for_gap(
    const char *log, int32_t term_length, int32_t partition_index, int32_t term_offset, int32_t limit_offset,
    int32_t *gap_length);
