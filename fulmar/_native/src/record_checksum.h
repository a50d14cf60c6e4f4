/* The archive's record checksum (fulmar.archive.segment): before a block of
 * frames is written to a segment, each DATA frame's CRC-32 (zlib's, i.e.
 * java.util.zip.CRC32's) over its bytes after the header, padding to the
 * frame alignment included, replaces the frame's session id.  PAD frames
 * keep theirs (Aeron records only a padding frame's header).
 *
 * Returns the offset after the last whole frame (the block's length when it
 * ends on a frame), or FULMAR_CHECKSUM_BAD_FRAME - offset when the frame at
 * offset has a length below the header's. */
#define FULMAR_CHECKSUM_BAD_FRAME -1

int32_t fulmar_record_checksums(char *block, int32_t length);
