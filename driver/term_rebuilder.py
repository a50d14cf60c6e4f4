"""Rebuilding an image's log from DATA datagrams (Aeron's ``TermRebuilder``
and ``TermGapScanner``), over the native ``rebuild.c``.

``insert_packet`` writes one datagram, as received, at its term offset; a
datagram may carry several aligned frames, and its last frame may be a
padding frame sent as its header alone.  Frames whose slot is already filled
are skipped, so duplicates and overlapping resends are harmless.  A datagram
that is not a well-formed run of frames for that place in the term is
rejected whole with an :class:`InsertRejected` code (the receiver counts it
as an invalid packet) and nothing is written.

Which partition a term id lands in is the caller's decision: the image knows
its window of acceptable term ids, this module only checks the index.

``scan_term`` (and its two views ``contiguous_end`` and ``scan_for_gap``)
walks the received frames of a term in one native call: how far from an
offset the frames are contiguous, and how long the gap after them is.
"""

from __future__ import annotations

from enum import IntEnum

from fulmar._native import ffi, lib
from fulmar.logbuffer import LogBuffers

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


class InsertRejected(IntEnum):
    """Why a datagram was not inserted (nothing of it was written)."""

    BAD_PARTITION = lib.FULMAR_REBUILD_BAD_PARTITION
    BAD_TERM_OFFSET = lib.FULMAR_REBUILD_BAD_TERM_OFFSET  # negative, past the term, or not frame aligned
    BAD_LENGTH = lib.FULMAR_REBUILD_BAD_LENGTH  # frame lengths disagree with the datagram's length
    OVERRUNS_TERM = lib.FULMAR_REBUILD_OVERRUNS_TERM  # a frame would end past the end of the term
    BAD_FRAME = lib.FULMAR_REBUILD_BAD_FRAME  # not DATA/PAD, or a header naming another place/stream


def _is_int32(value: int) -> bool:
    return _INT32_MIN <= value <= _INT32_MAX


def insert_packet(
    log: LogBuffers, partition_index: int, term_offset: int, datagram: bytes | bytearray | memoryview
) -> int | InsertRejected:
    """Insert a DATA datagram into ``log`` at ``term_offset`` of a partition.

    Returns how many frames were newly written (0: every frame was already
    there), or an :class:`InsertRejected` code (negative) for a datagram that
    was refused.  Heartbeats (a bare header with frame length 0) are not
    inserted; they are refused as ``BAD_LENGTH``.
    """
    if not _is_int32(partition_index):
        return InsertRejected.BAD_PARTITION
    if not _is_int32(term_offset):
        return InsertRejected.BAD_TERM_OFFSET
    if isinstance(datagram, bytes):
        source: object = datagram  # cffi passes a bytes object's own storage
        length = len(datagram)
    else:
        view = memoryview(datagram)
        length = view.nbytes
        source = ffi.from_buffer(view)
    if length > _INT32_MAX:
        return InsertRejected.BAD_LENGTH
    result = int(lib.fulmar_term_insert(log.address, log.term_length, partition_index, term_offset, source, length))
    return result if result >= 0 else InsertRejected(result)


# One native out-parameter for every scan: native calls keep the GIL, so no
# two scans can use it at once.
_gap_length = ffi.new("int32_t *")


def _check_scan(log: LogBuffers, partition_index: int, term_offset: int, limit_offset: int) -> int:
    """Validate a scan's arguments; returns the limit clamped to the term."""
    if not (0 <= partition_index < 3):
        raise ValueError(f"partition index {partition_index} is not 0, 1 or 2")
    if not (0 <= term_offset <= log.term_length) or term_offset % 32:
        raise ValueError(f"term offset {term_offset} is not a frame-aligned offset in a {log.term_length}-byte term")
    return max(term_offset, min(limit_offset, log.term_length))


def scan_term(log: LogBuffers, partition_index: int, term_offset: int, limit_offset: int) -> tuple[int, int]:
    """``(rebuild_offset, gap_length)`` for the term of a partition, from
    ``term_offset`` (frame aligned) to ``limit_offset``.

    ``rebuild_offset`` is where the complete frames starting at
    ``term_offset`` stop; it may pass ``limit_offset`` when the last frame
    ends beyond it.  When it is below ``limit_offset`` a gap starts there and
    ``gap_length`` (> 0) runs to the next received frame or to the limit;
    otherwise ``gap_length`` is 0.
    """
    limit_offset = _check_scan(log, partition_index, term_offset, limit_offset)
    offset = lib.fulmar_term_scan_for_gap(
        log.address, log.term_length, partition_index, term_offset, limit_offset, _gap_length
    )
    return int(offset), int(_gap_length[0])


def contiguous_end(log: LogBuffers, partition_index: int, term_offset: int, limit_offset: int) -> int:
    """How far from ``term_offset`` the term holds complete frames (see :func:`scan_term`)."""
    limit_offset = _check_scan(log, partition_index, term_offset, limit_offset)
    return int(lib.fulmar_term_contiguous_end(log.address, log.term_length, partition_index, term_offset, limit_offset))


def scan_for_gap(log: LogBuffers, partition_index: int, term_offset: int, limit_offset: int) -> tuple[int, int] | None:
    """``(gap_offset, gap_length)`` of the first gap before ``limit_offset``, or None."""
    offset, gap_length = scan_term(log, partition_index, term_offset, limit_offset)
    return (offset, gap_length) if gap_length > 0 else None
