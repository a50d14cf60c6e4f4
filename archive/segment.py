"""Segment files: the raw term bytes of a recording, ``<recordingId>-<segmentBasePosition>.rec``.

A recording's stream is cut into segments of ``segment_length`` bytes (a power of
two, at least one term). Segment boundaries are counted from the base of the term
that holds the recording's start position, as Aeron does
(``AeronArchive.segmentFileBasePosition``), so a segment always holds whole terms and
the file offset of a position is ``position - segment_base``. The first segment of a
recording that starts mid-term therefore begins with ``start & (term_length - 1)``
bytes that are never written (zeros).

A segment file has its whole length from the start (a reader maps all of it) and its
blocks are allocated with ``posix_fallocate`` a chunk (1 MiB) ahead of the writes, so
running out of disk is an error before a write, never a short write (or a SIGBUS in a
reader that maps the file) later, and a recording takes the disk it holds (a small
snapshot one chunk, not a whole segment). Writes go through ``os.pwrite`` on a raw fd.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fulmar._native import ffi, lib
from fulmar.frames import (
    FRAME_ALIGNMENT,
    HEADER_LENGTH,
    FrameType,
    align,
)
from fulmar.logbuffer import TERM_MAX_LENGTH, TERM_MIN_LENGTH, check_term_length, to_int32
from fulmar.permissions import open_new_file

from .errors import SegmentError, describe_os_error

if TYPE_CHECKING:
    from .catalog import RecordingDescriptor

SEGMENT_SUFFIX = ".rec"
# Aeron's limits for the segment file length: a power of two in the term length's range.
SEGMENT_LENGTH_MIN = TERM_MIN_LENGTH
SEGMENT_LENGTH_MAX = TERM_MAX_LENGTH
SEGMENT_LENGTH_DEFAULT = 128 * 1024 * 1024  # Archive.Configuration.SEGMENT_FILE_LENGTH_DEFAULT

# frame_length i32 @0, version u8 @4, flags u8 @5, type u16 @6, term_offset @8,
# session_id @12, stream_id @16, term_id @20 (reserved_value @24 read separately).
_FRAME_HEADER = struct.Struct("<iBBHiiii")
_FRAME_HEADER_START = struct.Struct("<iBBH")
_I32 = struct.Struct("<i")
_ZERO_CHUNK = bytes(1024 * 1024)

_PAD = int(FrameType.PAD)
_DATA = int(FrameType.DATA)

# Aeron's record checksum (Archive.Context recordChecksum, "aeron.archive.record.checksum"):
# RecordingWriter.computeChecksum stores the CRC-32 of the bytes after a frame's
# 32-byte header, up to its aligned end, in the frame's session id field of the
# recorded copy. A replay rewrites the session id anyway, so nothing downstream
# sees it; ReplaySession.verifyChecksum and ArchiveTool verify -checksum check it.
SESSION_ID_OFFSET = 12


def frame_checksum(buffer: memoryview | bytes | bytearray | mmap.mmap, offset: int, aligned_length: int) -> int:
    """CRC-32 (zlib's, i.e. java.util.zip.CRC32's) of a frame's bytes after its header, as an int32."""
    if type(buffer) is memoryview:  # the replay's blocks: no new view per frame
        return to_int32(zlib.crc32(buffer[offset + HEADER_LENGTH : offset + aligned_length]))
    with memoryview(buffer) as view:
        return to_int32(zlib.crc32(view[offset + HEADER_LENGTH : offset + aligned_length]))


def checksum_mismatch(buffer: memoryview | bytes | bytearray | mmap.mmap, offset: int) -> tuple[int, int] | None:
    """(recorded, computed) when the DATA frame at ``offset`` fails its checksum, else None.

    PAD frames carry no checksum (Aeron records only the header of a padding frame).
    """
    frame_length, _version, _flags, frame_type = _FRAME_HEADER_START.unpack_from(buffer, offset)
    if frame_type != _DATA:
        return None
    recorded = _I32.unpack_from(buffer, offset + SESSION_ID_OFFSET)[0]
    computed = frame_checksum(buffer, offset, align(frame_length, FRAME_ALIGNMENT))
    return None if recorded == computed else (recorded, computed)


class RecordedPositionSink(Protocol):
    """What a SegmentWriter tells after each write (the catalog, in the archive)."""

    def update_recorded_position(self, recording_id: int, position: int) -> None: ...


# --------------------------------------------------------------------------- naming and arithmetic


ALLOCATION_CHUNK = 1024 * 1024


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) & ~(alignment - 1)


def segment_file_name(recording_id: int, segment_base_position: int) -> str:
    return f"{recording_id}-{segment_base_position}{SEGMENT_SUFFIX}"


def segment_file_base_position(start_position: int, position: int, term_length: int, segment_length: int) -> int:
    """Base position of the segment that holds ``position`` (Aeron's AeronArchive.segmentFileBasePosition)."""
    start_term_base = start_position - (start_position & (term_length - 1))
    return start_term_base + ((position - start_term_base) // segment_length) * segment_length


def check_segment_length(segment_length: int, term_length: int) -> None:
    """A segment length must be a power of two from 64 KiB to 1 GiB and hold at least one term.

    Aeron validates the configured length the same way and then records
    ``max(segment_length, term_length)``; both being powers of two, a segment then
    holds a power-of-two number of whole terms.
    """
    check_term_length(term_length)
    if not (SEGMENT_LENGTH_MIN <= segment_length <= SEGMENT_LENGTH_MAX) or segment_length & (segment_length - 1) != 0:
        raise ValueError(
            f"segment length {segment_length} must be a power of two from {SEGMENT_LENGTH_MIN} (64 KiB) "
            f"to {SEGMENT_LENGTH_MAX} (1 GiB)"
        )
    if segment_length < term_length:
        raise ValueError(f"segment length {segment_length} is shorter than the term length {term_length}")


_SEGMENT_NAME = re.compile(r"^(\d+)-(\d+)\.rec$")


def list_segment_files(archive_dir: str | os.PathLike[str], recording_id: int) -> list[str]:
    """Names of the recording's segment files, in segment base position order."""
    found: list[tuple[int, str]] = []
    for name in os.listdir(archive_dir):
        match = _SEGMENT_NAME.match(name)
        if match and int(match.group(1)) == recording_id:
            found.append((int(match.group(2)), name))
    return [name for _, name in sorted(found)]


def segment_base_of_file(name: str) -> int:
    match = _SEGMENT_NAME.match(name)
    if match is None:
        raise ValueError(f"not a segment file name: {name!r}")
    return int(match.group(2))


def delete_segments(archive_dir: str | os.PathLike[str], recording_id: int) -> list[str]:
    """Delete every segment file of the recording; returns the names deleted."""
    deleted = []
    for name in list_segment_files(archive_dir, recording_id):
        path = Path(archive_dir) / name
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as ex:
            raise SegmentError(f"{describe_os_error(ex)} while deleting {path}") from ex
        deleted.append(name)
    return deleted


def detached_segment_files(archive_dir: str | os.PathLike[str], descriptor: RecordingDescriptor) -> list[str]:
    """The recording's segment files that lie wholly before the segment of its
    start position: detached (or purged) from it, no longer part of it."""
    first_base = segment_file_base_position(
        descriptor.start_position,
        descriptor.start_position,
        descriptor.term_buffer_length,
        descriptor.segment_file_length,
    )
    return [
        name
        for name in list_segment_files(archive_dir, descriptor.recording_id)
        if segment_base_of_file(name) < first_base
    ]


_FIRST_FRAME = struct.Struct("<i12xii")  # frame length; stream id and term id at offsets 16 and 20


def find_start_in_segment(path: Path, descriptor: RecordingDescriptor, segment_base: int) -> int:
    """Where the recording's first frame lies in a detached segment file (the
    offset in its first term: 0 unless the recording began inside it), checked
    to be a frame of this recording's stream and of the term that position is in."""
    term_length = descriptor.term_buffer_length
    try:
        with open(path, "rb") as file:
            first_term = file.read(term_length)
    except OSError as ex:
        raise SegmentError(f"{describe_os_error(ex)} while reading {path}") from ex
    offset = 0
    while offset + _FIRST_FRAME.size <= len(first_term):
        frame_length, stream_id, term_id = _FIRST_FRAME.unpack_from(first_term, offset)
        if frame_length > 0:
            break
        offset += FRAME_ALIGNMENT
    else:
        raise SegmentError(f"{path}: no frame found in the first term of the segment")
    bits = (term_length - 1).bit_length()
    expected_term_id = to_int32(descriptor.initial_term_id + ((segment_base + offset) >> bits))
    if term_id != expected_term_id:
        raise SegmentError(f"{path}: term id does not match: actual={term_id} expected={expected_term_id}")
    if stream_id != descriptor.stream_id:
        raise SegmentError(f"{path}: stream id does not match: actual={stream_id} expected={descriptor.stream_id}")
    return offset


def _zero_from(path: Path, offset: int) -> None:
    """Zero the file from ``offset`` to its end, keeping its length.

    Chunks that are already zero are not rewritten, so zeroing the mostly empty
    tail of a preallocated segment dirties no pages.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as ex:
        raise SegmentError(f"{describe_os_error(ex)} while opening {path} to zero its tail") from ex
    try:
        end = os.fstat(fd).st_size
        while offset < end:
            n = min(len(_ZERO_CHUNK), end - offset)
            if os.pread(fd, n, offset) != _ZERO_CHUNK[:n]:
                _pwrite_all(fd, memoryview(_ZERO_CHUNK)[:n], offset, path)
            offset += n
    except OSError as ex:
        raise SegmentError(f"{describe_os_error(ex)} while zeroing {path} from offset {offset}") from ex
    finally:
        os.close(fd)


def truncate_segments(archive_dir: str | os.PathLike[str], descriptor: RecordingDescriptor, position: int) -> list[str]:
    """Cut the recording's files at ``position`` (Aeron's truncate): returns the files deleted.

    Segment files that lie wholly at or after ``position`` are deleted (including
    the one starting exactly at ``position``); the segment that contains
    ``position`` keeps its length and is zeroed from ``position`` on, so nothing
    past the new end can be replayed or mistaken for data by an extend or a
    recovery scan. The catalog is the caller's to update.
    """
    if position < descriptor.start_position or position & (FRAME_ALIGNMENT - 1):
        raise ValueError(
            f"truncate position {position} must be frame aligned and at or after the start "
            f"{descriptor.start_position} of recording {descriptor.recording_id}"
        )
    term_length, segment_length = descriptor.term_buffer_length, descriptor.segment_file_length
    base = segment_file_base_position(descriptor.start_position, position, term_length, segment_length)
    deleted = []
    for name in list_segment_files(archive_dir, descriptor.recording_id):
        file_base = segment_base_of_file(name)
        path = Path(archive_dir) / name
        if file_base >= position:
            try:
                os.unlink(path)
            except OSError as ex:
                raise SegmentError(f"{describe_os_error(ex)} while deleting {path}") from ex
            deleted.append(name)
        elif file_base == base:
            _zero_from(path, position - base)
    return deleted


def _pwrite_all(fd: int, data: memoryview, offset: int, path: Path) -> None:
    # pwrite may write less than asked (signals, quotas); loop until done.
    while len(data):
        written = os.pwrite(fd, data, offset)
        if written <= 0:  # pragma: no cover - the kernel reports an error instead
            raise SegmentError(f"pwrite wrote nothing to {path} at offset {offset}")
        data = data[written:]
        offset += written


def _fsync_dir(archive_dir: Path) -> None:
    # Makes a new file's directory entry durable (Aeron forces the archive dir channel).
    fd = os.open(archive_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- writer


class SegmentWriter:
    """Appends blocks of whole frames to a recording's segment files.

    ``position`` (keyword) is where writing starts: the recording's start for a new
    recording, its stop position for an extend (the existing segment is reopened).
    """

    def __init__(
        self,
        archive_dir: str | os.PathLike[str],
        recording_id: int,
        start_position: int,
        term_length: int,
        segment_length: int,
        *,
        position: int | None = None,
        file_sync_level: int = 0,
        checksum: bool = False,
        catalog: RecordedPositionSink | None = None,
    ) -> None:
        check_segment_length(segment_length, term_length)
        if start_position < 0 or start_position & (FRAME_ALIGNMENT - 1):
            raise ValueError(f"start position {start_position} must be non-negative and frame aligned")
        position = start_position if position is None else position
        if position < start_position or position & (FRAME_ALIGNMENT - 1):
            raise ValueError(f"write position {position} must be frame aligned and >= start {start_position}")
        self.archive_dir = Path(archive_dir)
        self.recording_id = recording_id
        self.start_position = start_position
        self.term_length = term_length
        self.segment_length = segment_length
        self.file_sync_level = file_sync_level
        self.checksum = checksum
        self._catalog = catalog
        self._position = position
        self._fd: int | None = None
        self._path: Path | None = None
        self._segment_base = -1
        self._allocated_end = 0  # file offset up to which the open segment's blocks are allocated
        self._scratch = bytearray()

    @property
    def position(self) -> int:
        return self._position

    def _open_segment(self) -> None:
        base = segment_file_base_position(self.start_position, self._position, self.term_length, self.segment_length)
        path = self.archive_dir / segment_file_name(self.recording_id, base)
        try:
            fd = open_new_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            created = True
        except FileExistsError:
            created = False
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as ex:
                raise SegmentError(f"{describe_os_error(ex)} while opening {path}") from ex
        except OSError as ex:
            raise SegmentError(f"{describe_os_error(ex)} while creating {path}") from ex
        first = self._position - base
        allocate_start = first - first % ALLOCATION_CHUNK  # (a recording may begin inside a segment)
        allocate_end = min(self.segment_length, _align_up(first + 1, ALLOCATION_CHUNK))
        try:
            # The file has its whole length at once (readers map the whole
            # segment; the rest is a hole that reads as zeros) and the blocks of
            # the first chunk to be written (existing data is kept), so a full
            # disk fails here rather than mid-write.
            os.ftruncate(fd, max(self.segment_length, os.fstat(fd).st_size))
            os.posix_fallocate(fd, allocate_start, allocate_end - allocate_start)
            if created and self.file_sync_level > 0:
                _fsync_dir(self.archive_dir)
        except OSError as ex:
            os.close(fd)
            if created:
                # Leave no half-allocated file behind for a recovery scan to find.
                try:
                    os.unlink(path)
                except OSError:
                    pass
            raise SegmentError(
                f"{describe_os_error(ex)} while preallocating {path} ({self.segment_length} bytes)"
            ) from ex
        self._fd, self._path, self._segment_base = fd, path, base
        self._allocated_end = allocate_end

    def _allocate_to(self, end: int) -> None:
        """The blocks up to file offset ``end``, a chunk at a time ahead of the
        writes (a snapshot of a few hundred bytes takes one chunk of disk, not
        a whole segment); a full disk is an error before the write."""
        new_end = min(self.segment_length, _align_up(end, ALLOCATION_CHUNK))
        assert self._fd is not None
        try:
            os.posix_fallocate(self._fd, self._allocated_end, new_end - self._allocated_end)
        except OSError as ex:
            raise SegmentError(
                f"{describe_os_error(ex)} while allocating {self._path} to {new_end} of {self.segment_length} bytes"
            ) from ex
        self._allocated_end = new_end

    def write(self, block: memoryview | bytes | bytearray, position: int) -> None:
        """Append ``block`` (whole frames within one term) at ``position``, which must be the current position."""
        if position != self._position:
            raise ValueError(
                f"recording {self.recording_id}: write at position {position}, writer is at {self._position}"
            )
        view = memoryview(block).cast("B")
        length = len(view)
        term_offset = position & (self.term_length - 1)
        if length == 0:
            return
        if length & (FRAME_ALIGNMENT - 1) or term_offset + length > self.term_length:
            raise ValueError(
                f"recording {self.recording_id}: block of {length} bytes at term offset {term_offset} is not "
                f"whole aligned frames within a term of {self.term_length}"
            )
        if self._fd is None:
            self._open_segment()
        assert self._fd is not None and self._path is not None
        if self.checksum:
            view = self._with_checksums(view)
        file_offset = position - self._segment_base
        if file_offset + length > self._allocated_end:
            self._allocate_to(file_offset + length)
        try:
            _pwrite_all(self._fd, view, file_offset, self._path)
            if self.file_sync_level >= 2:
                os.fsync(self._fd)
            elif self.file_sync_level == 1:
                os.fdatasync(self._fd)
        except OSError as ex:
            raise SegmentError(
                f"{describe_os_error(ex)} while writing {length} bytes to {self._path} at offset {file_offset}"
            ) from ex
        self._position = position + length
        if self._position - self._segment_base >= self.segment_length:
            # Segment full: the next write opens (and preallocates) the next one.
            self._close_fd()
        if self._catalog is not None:
            # Only now is every byte below the new position in the page cache: a
            # SIGKILL from here on cannot lose it, so recovery may trust it.
            self._catalog.update_recorded_position(self.recording_id, self._position)

    @property
    def segment_path(self) -> Path | None:
        """The open segment's file."""
        return self._path

    def open_extent(self) -> tuple[int, int, int, int]:
        """The open segment as the native recorder takes it: (file descriptor,
        stream position of its first byte, of its end, of the end of its
        allocated blocks).  No segment open: (-1, position, position,
        position), a segment nothing may be written to."""
        if self._fd is None:
            return -1, self._position, self._position, self._position
        base = self._segment_base
        return self._fd, base, base + self.segment_length, base + self._allocated_end

    def adopt(self, position: int, allocated_end: int) -> None:
        """The native recorder wrote this segment up to stream position
        ``position`` and allocated it up to ``allocated_end``: take both as
        ours (the catalog's recorded position too); a full segment is closed,
        as ``write`` closes it."""
        if position == self._position and allocated_end - self._segment_base <= self._allocated_end:
            return
        if self._fd is None or not self._segment_base <= self._position <= position:
            raise ValueError(
                f"recording {self.recording_id}: native recorder at {position}, writer at {self._position} "
                f"with segment {self._segment_base if self._fd is not None else None}"
            )
        self._position = position
        self._allocated_end = max(self._allocated_end, allocated_end - self._segment_base)
        if self._position - self._segment_base >= self.segment_length:
            self._close_fd()
        if self._catalog is not None:
            self._catalog.update_recorded_position(self.recording_id, self._position)

    def _with_checksums(self, view: memoryview) -> memoryview:
        """A copy of the block with each DATA frame's checksum in its session id (see :func:`frame_checksum`)."""
        scratch = self._scratch
        if len(scratch) < len(view):
            scratch.extend(bytes(len(view) - len(scratch)))
        out = memoryview(scratch)[: len(view)]
        out[:] = view
        # In C: this runs for every frame recorded.
        end = lib.fulmar_record_checksums(ffi.from_buffer(out), len(out))
        if end < 0:
            offset = lib.FULMAR_CHECKSUM_BAD_FRAME - end
            frame_length = _I32.unpack_from(out, offset)[0]
            raise ValueError(f"recording {self.recording_id}: frame at block offset {offset} has length {frame_length}")
        if end != len(out):
            raise ValueError(f"recording {self.recording_id}: last frame runs past the end of the block")
        return out

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._path = None
            self._segment_base = -1

    def close(self) -> None:
        self._close_fd()

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- reader


class SegmentReader:
    """Reads a recording's frames back, block by block, from ``start_position``."""

    def __init__(
        self, archive_dir: str | os.PathLike[str], descriptor: RecordingDescriptor, start_position: int
    ) -> None:
        if start_position < descriptor.start_position or start_position & (FRAME_ALIGNMENT - 1):
            raise ValueError(
                f"read position {start_position} must be frame aligned and >= start "
                f"{descriptor.start_position} of recording {descriptor.recording_id}"
            )
        self.archive_dir = Path(archive_dir)
        self.recording_id = descriptor.recording_id
        self.start_position = descriptor.start_position
        self.term_length = descriptor.term_buffer_length
        self.segment_length = descriptor.segment_file_length
        self._position = start_position
        self._map: mmap.mmap | None = None
        self._segment_base = -1
        self._path: Path | None = None

    @property
    def position(self) -> int:
        return self._position

    def describe(self, position: int) -> str:
        """Where ``position`` is on disk: segment file and offset in it (for error messages)."""
        base = segment_file_base_position(self.start_position, position, self.term_length, self.segment_length)
        return f"{self.archive_dir / segment_file_name(self.recording_id, base)} offset {position - base}"

    def _map_segment(self, base: int) -> mmap.mmap:
        self._release_map()
        path = self.archive_dir / segment_file_name(self.recording_id, base)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SegmentError(
                f"recording {self.recording_id}: segment file {path} is missing (position {self._position})"
            ) from None
        except OSError as ex:
            raise SegmentError(f"{describe_os_error(ex)} while opening {path}") from ex
        try:
            size = os.fstat(fd).st_size
            if size < self.segment_length:
                raise SegmentError(
                    f"recording {self.recording_id}: segment file {path} is short: {size} bytes, "
                    f"expected {self.segment_length}"
                )
            memory = mmap.mmap(fd, self.segment_length, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as ex:
            raise SegmentError(f"{describe_os_error(ex)} while mapping {path}") from ex
        finally:
            os.close(fd)
        self._map, self._segment_base, self._path = memory, base, path
        return memory

    def read(self, limit_position: int, max_length: int) -> memoryview:
        """The next block of whole frames below ``limit_position`` (empty at the limit).

        A block never crosses a term boundary and holds at most ``max_length``
        bytes. The view is into the mapped segment; it stays valid while held.
        """
        position = self._position
        if position >= limit_position:
            return memoryview(b"")
        base = segment_file_base_position(self.start_position, position, self.term_length, self.segment_length)
        memory = self._map if base == self._segment_base and self._map is not None else self._map_segment(base)
        term_offset = position & (self.term_length - 1)
        available = min(limit_position - position, max_length, self.term_length - term_offset)
        start = position - base
        end = start + available
        # The frames are walked in C (Aeron's block scan): a Python loop over
        # every 64-byte frame header would cap small-message replay.
        pointer = ffi.from_buffer(memory)
        try:
            offset = int(lib.fulmar_term_block_scan(pointer, start, end))
        finally:
            ffi.release(pointer)
        if offset == start:
            frame_length = _I32.unpack_from(memory, offset)[0]
            if frame_length < HEADER_LENGTH:
                what = "a hole (zero length)" if frame_length == 0 else f"an invalid frame length {frame_length}"
                raise SegmentError(
                    f"recording {self.recording_id}: {what} at position {base + offset} in {self._path}, "
                    f"below the limit {limit_position}"
                )
            frame_end = base + start + align(_I32.unpack_from(memory, start)[0], FRAME_ALIGNMENT)
            if frame_end > limit_position:
                raise SegmentError(
                    f"recording {self.recording_id}: frame at position {position} ends at {frame_end}, "
                    f"past the limit {limit_position} (the limit is not on a frame boundary)"
                )
            raise ValueError(f"max_length {max_length} is smaller than the frame at position {position}")
        self._position = base + offset
        return memoryview(memory)[start:offset]

    def _release_map(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                # The caller still holds a block of it: the mapping goes away when
                # the last view is released and the object is collected.
                pass
            self._map = None
            self._segment_base = -1

    def close(self) -> None:
        self._release_map()

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- recovery scan


def _frame_problem(
    memory: mmap.mmap, offset: int, size: int, position: int, descriptor: RecordingDescriptor, verify_crc: bool
) -> str | None:
    """Why the frame at ``offset`` of a mapped segment (``position`` in the
    recording) is not one the recording holds there, or None if it is."""
    term_length = descriptor.term_buffer_length
    frame_length, _version, _flags, frame_type, term_offset, session_id, stream_id, term_id = _FRAME_HEADER.unpack_from(
        memory, offset
    )
    expected_term_offset = position & (term_length - 1)
    expected_term_id = to_int32(descriptor.initial_term_id + (position >> (term_length.bit_length() - 1)))
    if frame_length < HEADER_LENGTH:
        return "a hole (zero length)" if frame_length == 0 else f"an invalid frame length {frame_length}"
    aligned = align(frame_length, FRAME_ALIGNMENT)
    if expected_term_offset + aligned > term_length or offset + aligned > size:
        return f"a frame length {frame_length} that runs past the end of its term"
    if frame_type not in (_DATA, _PAD):
        return f"a frame type {frame_type}, neither DATA nor PAD"
    if term_offset != expected_term_offset or term_id != expected_term_id:
        return (
            f"term id {term_id} and term offset {term_offset} in the header, "
            f"not {expected_term_id} and {expected_term_offset}"
        )
    if stream_id != descriptor.stream_id:
        return f"stream id {stream_id}, not the recording's {descriptor.stream_id}"
    if verify_crc or session_id != descriptor.session_id:
        # With checksums the session id field holds the frame's checksum.
        # Checked even without verify_crc, so an archive restarted with the
        # option off still recovers such frames.
        mismatch = checksum_mismatch(memory, offset)
        if mismatch is not None:
            recorded, computed = mismatch
            if not verify_crc:
                return f"session id {session_id}, neither the recording's {descriptor.session_id} nor a checksum"
            return f"a CRC checksum mismatch: recorded checksum={recorded}, computed checksum={computed}"
    return None


def _walk_frames(
    archive_dir: Path,
    descriptor: RecordingDescriptor,
    from_position: int,
    stop_position: int | None,
    verify_crc: bool,
) -> tuple[int, str | None]:
    """Walk the frames from ``from_position``: (end of the good run, why it ended;
    None at ``stop_position`` or, without one, at a missing or short segment)."""
    start, term_length = descriptor.start_position, descriptor.term_buffer_length
    segment_length = descriptor.segment_file_length
    position = from_position
    while stop_position is None or position < stop_position:
        base = segment_file_base_position(start, position, term_length, segment_length)
        path = archive_dir / segment_file_name(descriptor.recording_id, base)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return position, None if stop_position is None else f"segment file {path} is missing"
        except OSError as ex:
            raise SegmentError(f"{describe_os_error(ex)} while opening {path}") from ex
        try:
            size = min(os.fstat(fd).st_size, segment_length)
            if size <= position - base:
                return position, None if stop_position is None else f"segment file {path} is short ({size} bytes)"
            memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        except OSError as ex:
            raise SegmentError(f"{describe_os_error(ex)} while mapping {path}") from ex
        finally:
            os.close(fd)
        try:
            offset = position - base
            while offset + HEADER_LENGTH <= size and (stop_position is None or position < stop_position):
                problem = _frame_problem(memory, offset, size, position, descriptor, verify_crc)
                if problem is not None:
                    return position, f"{path} offset {offset}: {problem}"
                aligned = align(_I32.unpack_from(memory, offset)[0], FRAME_ALIGNMENT)
                offset += aligned
                position += aligned
            if offset < segment_length and (stop_position is None or position < stop_position):
                return position, None if stop_position is None else f"segment file {path} ends at offset {offset}"
        finally:
            memory.close()
    return position, None


def scan_complete_frames(
    archive_dir: str | os.PathLike[str],
    descriptor: RecordingDescriptor,
    from_position: int,
    *,
    verify_crc: bool = False,
) -> int:
    """End position of the run of entirely plausible frames starting at ``from_position``.

    A frame is accepted only if its length is at least a header and fits in the
    rest of the term, its type is DATA or PAD, its term offset and term id are
    those of its position, its stream id is the recording's, and
    its session id field holds the frame's checksum (:func:`frame_checksum`)
    or (only without ``verify_crc``) the recording's session id.
    The scan crosses terms and segments and stops at the first frame that fails,
    or where a segment file is missing.
    """
    return _walk_frames(Path(archive_dir), descriptor, from_position, None, verify_crc)[0]


def first_bad_frame(
    archive_dir: str | os.PathLike[str], descriptor: RecordingDescriptor, *, verify_crc: bool
) -> tuple[int, str] | None:
    """(position, what is wrong and where) of the first frame between the
    recording's start and stop that is not what was recorded, or None.  Frames
    are checked as :func:`scan_complete_frames` does (``verify_crc``: every
    DATA frame's checksum too)."""
    position, problem = _walk_frames(
        Path(archive_dir), descriptor, descriptor.start_position, descriptor.stop_position, verify_crc
    )
    return None if problem is None else (position, problem)
