"""``archive.catalog``: the archive's list of recordings, in Aeron's file layout.

Layout (Aeron's ``Catalog.java``, catalog format 3.x; all little-endian):

* offset 0: ``CatalogHeader``, a headerless SBE block of 32 bytes: version i32 @0
  (``ArchiveMarkFile.SEMANTIC_VERSION``, 3.1.0; only the major version is checked),
  length i32 @4 (= 32, the header's own length), nextRecordingId i64 @8,
  alignment i32 @16 (Aeron writes ``CACHE_LINE_LENGTH`` = 64 in new catalogs;
  0 marks the legacy fixed 1 KiB-record format), reserved i8 @31.
* from offset 32, one entry per recording in id order, each
  ``RecordingDescriptorHeader`` (32 bytes: length i32 @0, state i32 @4
  {0 INVALID, 1 VALID, 2 DELETED}, checksum i32 @8, reserved i8 @31) followed by
  the headerless ``RecordingDescriptor`` (80-byte block + strippedChannel,
  originalChannel, sourceIdentity as u32-length ASCII).
  The entry's frame length is ``align(32 + descriptor length, alignment)`` and the
  header's ``length`` is that frame length minus the 32-byte header, i.e. it
  includes the zero padding. A zero length ends the list.
* ``checksum`` is 0 when the archive runs without a checksum; otherwise it is the
  checksum of the ``length`` bytes after the header, rewritten on every update.

fulmar extension: the recorded position. Aeron reads and writes only length,
state and checksum of the descriptor header (bytes 0..11) and leaves bytes
12..31 as zeros it never looks at (the codec's reserved byte sits at 31). fulmar
keeps an int64 at header offset 16: the position up to which the recorder's
segment writes have fully returned. After a crash everything below it is known
to be in the page cache, so recovery scans only what lies beyond it.

The file is mmap'd shared; every update is a store into the mapping, so it
survives a SIGKILL of the process. ``file_sync_level`` >= 1 also msyncs after each
update (and 2 fsyncs, for metadata), as Aeron's ``catalogFileSyncLevel`` does.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fulmar.buffers import AtomicBuffer
from fulmar.codecs.generated.archive import (
    CatalogHeaderDecoder,
    CatalogHeaderEncoder,
    RecordingDescriptorDecoder,
    RecordingDescriptorEncoder,
    RecordingState,
)
from fulmar.errors import CodecError
from fulmar.frames import FRAME_ALIGNMENT, align
from fulmar.permissions import open_new_file
from fulmar.semantic_version import major_version, version_text

from . import segment as _segment
from .errors import CatalogError, RecordingUnknownError, describe_os_error

CATALOG_FILE_NAME = "archive.catalog"

MAJOR_VERSION = 3
MINOR_VERSION = 1
PATCH_VERSION = 0
# SemanticVersion.compose(major, minor, patch) as Agrona packs it.
CATALOG_VERSION = (MAJOR_VERSION << 16) | (MINOR_VERSION << 8) | PATCH_VERSION

CATALOG_HEADER_LENGTH = CatalogHeaderEncoder.BLOCK_LENGTH  # 32
DESCRIPTOR_HEADER_LENGTH = 32  # RecordingDescriptorHeader block length
DEFAULT_ALIGNMENT = 64  # what Aeron writes in a new catalog (CACHE_LINE_LENGTH)
LEGACY_ALIGNMENT = 1024  # Aeron's pre-3.0 fixed record length (header alignment 0)
# fulmar's lower bound: keeps the descriptor's 8-byte fields naturally aligned
# (atomic stores of stopPosition) and entries on frame boundaries.
MIN_ALIGNMENT = FRAME_ALIGNMENT
DEFAULT_CAPACITY = 1024 * 1024
MIN_CAPACITY = CATALOG_HEADER_LENGTH
MAX_CATALOG_LENGTH = 2**31 - 1  # Integer.MAX_VALUE

NULL_POSITION = -1
NULL_TIMESTAMP = -1
NULL_RECORDING_ID = -1
NULL_VALUE = -1

# Offsets inside a catalog entry (from the entry's start).
_LENGTH_OFFSET = 0
_STATE_OFFSET = 4
_CHECKSUM_OFFSET = 8
RECORDED_POSITION_OFFSET = 16  # fulmar extension, see the module docstring
_D = DESCRIPTOR_HEADER_LENGTH
_CONTROL_SESSION_ID_OFFSET = _D + 0
_CORRELATION_ID_OFFSET = _D + 8
_STOP_TIMESTAMP_OFFSET = _D + 32
_START_POSITION_OFFSET = _D + 40
_STOP_POSITION_OFFSET = _D + 48
_SESSION_ID_OFFSET = _D + 72
# Fixed block plus the three u32 string lengths (Aeron's recordingDescriptorFrameLength).
_DESCRIPTOR_FIXED_LENGTH = RecordingDescriptorEncoder.BLOCK_LENGTH + 3 * 4

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")

Checksum = Callable[[memoryview], int]
"""Checksum of a descriptor's bytes, e.g. ``zlib.crc32``; stored as a signed int32."""


@dataclass(frozen=True)
class RecordingDescriptor:
    """Everything the catalog holds about one recording."""

    recording_id: int
    control_session_id: int
    correlation_id: int
    start_timestamp: int
    stop_timestamp: int
    start_position: int
    stop_position: int
    initial_term_id: int
    segment_file_length: int
    term_buffer_length: int
    mtu_length: int
    session_id: int
    stream_id: int
    stripped_channel: str
    original_channel: str
    source_identity: str
    state: RecordingState = RecordingState.VALID


def _to_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


class Catalog:
    """The open catalog of one archive directory. Use :meth:`open`."""

    def __init__(self, path: Path, fd: int, file_sync_level: int, checksum: Checksum | None) -> None:
        self.path = path
        self.file_sync_level = file_sync_level
        self._fd = fd
        self._checksum = checksum
        self._mmap: mmap.mmap | None = None
        self._atomic: AtomicBuffer | None = None
        self._capacity = 0
        self._alignment = DEFAULT_ALIGNMENT
        self._next_recording_id = 0
        self._next_offset = CATALOG_HEADER_LENGTH
        # recording id -> entry offset, VALID entries only (Aeron's CatalogIndex);
        # ids only grow, so insertion order is id order.
        self._index: dict[int, int] = {}
        self._decoder = RecordingDescriptorDecoder()

    # ----------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        archive_dir: str | os.PathLike[str],
        *,
        file_sync_level: int = 0,
        create: bool = True,
        capacity_bytes: int = DEFAULT_CAPACITY,
        checksum: Checksum | None = None,
    ) -> Catalog:
        """Open ``<archive_dir>/archive.catalog``, creating it if missing (and ``create``).

        An existing file is validated entry by entry; anything Aeron or fulmar would
        never have written raises :class:`CatalogError` naming the offset.
        """
        if not MIN_CAPACITY <= capacity_bytes <= MAX_CATALOG_LENGTH:
            raise ValueError(f"catalog capacity {capacity_bytes} must be from {MIN_CAPACITY} to {MAX_CATALOG_LENGTH}")
        archive_dir = Path(archive_dir)
        path = archive_dir / CATALOG_FILE_NAME
        exists = path.exists()
        if not exists and not create:
            raise CatalogError(f"{path}: catalog does not exist")
        try:
            fd = open_new_file(path, os.O_RDWR | os.O_CREAT)
        except OSError as ex:
            raise CatalogError(f"{path}: cannot open catalog: {describe_os_error(ex)}") from ex
        catalog = cls(path, fd, file_sync_level, checksum)
        try:
            size = os.fstat(fd).st_size
            if exists and size > 0:
                catalog._map(size)
                catalog._load(size)
                if capacity_bytes > size:
                    catalog._remap(capacity_bytes)
            else:
                catalog._remap(capacity_bytes)
                catalog._alignment = DEFAULT_ALIGNMENT
                catalog._write_header()
                if file_sync_level > 0:
                    catalog.force()
                    _fsync_dir(archive_dir)
        except BaseException:
            catalog.close()
            raise
        return catalog

    @classmethod
    def open_read_only(cls, archive_dir: str | os.PathLike[str]) -> Catalog:
        """Open an existing catalog for reading only (tools, a stopped archive's
        files): the file is opened read-only and mapped copy-on-write, so
        nothing can reach it, and it is validated by the same loader as
        ``open``.  Raises :class:`CatalogError` for a missing, empty or
        corrupt catalog."""
        path = Path(archive_dir) / CATALOG_FILE_NAME
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CatalogError(f"{path}: no catalog (not an archive directory?)") from None
        except OSError as ex:
            raise CatalogError(f"{path}: cannot open catalog: {describe_os_error(ex)}") from ex
        catalog = cls(path, fd, 0, None)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise CatalogError(f"{path}: the catalog is empty (0 bytes; an archive died creating it?)")
            memory = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
            catalog._mmap, catalog._atomic, catalog._capacity = memory, AtomicBuffer(memory), size
            catalog._load(size)
        except OSError as ex:
            catalog.close()
            raise CatalogError(f"{path}: cannot read catalog: {describe_os_error(ex)}") from ex
        except BaseException:
            catalog.close()
            raise
        return catalog

    @property
    def version(self) -> int:
        memory, _ = self._memory()
        return int(_I32.unpack_from(memory, 0)[0])

    def entries(self) -> list[tuple[RecordingDescriptor, int]]:
        """Every entry (VALID, INVALID and DELETED) in id order, with its recorded position."""
        memory, _ = self._memory()
        entries = []
        offset = CATALOG_HEADER_LENGTH
        while offset < self._next_offset:  # every entry below it was validated on opening
            length = _I32.unpack_from(memory, offset)[0]
            recorded = _I64.unpack_from(memory, offset + RECORDED_POSITION_OFFSET)[0]
            entries.append((self._decode(offset), recorded))
            offset += DESCRIPTOR_HEADER_LENGTH + length
        return entries

    def _write_header(self) -> None:
        assert self._mmap is not None
        CatalogHeaderEncoder.encode_headerless(
            self._mmap,
            0,
            version=CATALOG_VERSION,
            length=CATALOG_HEADER_LENGTH,
            next_recording_id=self._next_recording_id,
            alignment=self._alignment,
            reserved=0,
        )

    def _map(self, length: int) -> None:
        self._mmap = mmap.mmap(self._fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._atomic = AtomicBuffer(self._mmap)
        self._capacity = length

    def _unmap(self) -> None:
        if self._atomic is not None:
            self._atomic.release()
            self._atomic = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def _remap(self, capacity: int) -> None:
        self._unmap()
        try:
            # Allocated, not sparse: a store into a hole on a full disk would be a SIGBUS.
            os.posix_fallocate(self._fd, 0, capacity)
        except OSError as ex:
            raise CatalogError(
                f"{self.path}: cannot grow the catalog to {capacity} bytes: {describe_os_error(ex)}"
            ) from ex
        self._map(capacity)

    def _fail(self, offset: int, what: str) -> CatalogError:
        return CatalogError(f"{self.path}: corrupt catalog at offset {offset}: {what}")

    def _load(self, size: int) -> None:
        """Validate the header and every entry of an existing file and build the index."""
        memory = self._mmap
        assert memory is not None
        if size < CATALOG_HEADER_LENGTH:
            raise self._fail(0, f"file is {size} bytes, shorter than the {CATALOG_HEADER_LENGTH}-byte header")
        header = CatalogHeaderDecoder().wrap_headerless(memory, 0, CATALOG_HEADER_LENGTH)
        if major_version(header.version) != MAJOR_VERSION:
            raise self._fail(
                0,
                f"incompatible catalog version {version_text(header.version)} (0x{header.version & 0xFFFFFFFF:x}), "
                f"this archive reads major version {MAJOR_VERSION}",
            )
        if header.length != CATALOG_HEADER_LENGTH:
            raise self._fail(4, f"header length {header.length}, expected {CATALOG_HEADER_LENGTH}")
        if header.alignment == 0:
            raise self._fail(16, "alignment 0: legacy fixed-record catalog format, not supported (migrate it first)")
        if not _is_power_of_two(header.alignment) or header.alignment < MIN_ALIGNMENT:
            raise self._fail(16, f"alignment {header.alignment} is not a power of two >= {MIN_ALIGNMENT}")
        self._alignment = header.alignment

        offset = CATALOG_HEADER_LENGTH
        last_id = NULL_RECORDING_ID
        while offset + DESCRIPTOR_HEADER_LENGTH <= size:
            length, state = struct.unpack_from("<ii", memory, offset)
            if length == 0:
                break
            if length < 0:
                raise self._fail(offset, f"entry length {length} is negative")
            frame_length = DESCRIPTOR_HEADER_LENGTH + length
            if frame_length % self._alignment:
                raise self._fail(
                    offset,
                    f"entry length {length} + {DESCRIPTOR_HEADER_LENGTH} is not a multiple of the alignment {self._alignment}",
                )
            if offset + frame_length > size:
                raise self._fail(
                    offset, f"truncated entry: needs {frame_length} bytes, the file ends after {size - offset}"
                )
            if state not in (RecordingState.INVALID, RecordingState.VALID, RecordingState.DELETED):
                raise self._fail(
                    offset + _STATE_OFFSET, f"entry state {state} is not INVALID(0), VALID(1) or DELETED(2)"
                )
            try:
                descriptor = self._decoder.wrap_headerless(memory, offset + DESCRIPTOR_HEADER_LENGTH, length)
            except CodecError as ex:
                raise self._fail(
                    offset + DESCRIPTOR_HEADER_LENGTH, f"recording descriptor does not decode: {ex}"
                ) from None
            recording_id = descriptor.recording_id
            if recording_id <= last_id:
                raise self._fail(offset, f"recording id {recording_id} does not follow the previous id {last_id}")
            if self._checksum is not None:
                stored = _I32.unpack_from(memory, offset + _CHECKSUM_OFFSET)[0]
                computed = self._compute_checksum(offset, length)
                if stored != computed:
                    raise self._fail(
                        offset + _CHECKSUM_OFFSET,
                        f"checksum mismatch for recording {recording_id}: stored {stored}, computed {computed}",
                    )
            if state == RecordingState.VALID:
                self._index[recording_id] = offset
            last_id = recording_id
            offset += frame_length
        self._next_offset = offset

        next_id = header.next_recording_id
        if next_id < last_id + 1:
            if next_id == 0:
                # Written by an older catalog that kept no counter: derive it (as Aeron does).
                next_id = last_id + 1
            else:
                raise self._fail(8, f"nextRecordingId {next_id} is below the last recording id + 1 ({last_id + 1})")
        self._next_recording_id = next_id

    # ----------------------------------------------------------------- properties

    @property
    def next_recording_id(self) -> int:
        return self._next_recording_id

    @property
    def alignment(self) -> int:
        return self._alignment

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        """Number of VALID recordings."""
        return len(self._index)

    # ----------------------------------------------------------------- adding

    def add_recording(
        self,
        start_position: int,
        start_timestamp: int,
        initial_term_id: int,
        segment_file_length: int,
        term_buffer_length: int,
        mtu_length: int,
        session_id: int,
        stream_id: int,
        stripped_channel: str,
        original_channel: str,
        source_identity: str,
        control_session_id: int = NULL_VALUE,
        correlation_id: int = NULL_VALUE,
    ) -> int:
        """Append a VALID, active recording (stop position and timestamp NULL); returns its id."""
        try:
            strings = [s.encode("ascii") for s in (stripped_channel, original_channel, source_identity)]
        except UnicodeEncodeError as ex:
            raise ValueError(f"catalog strings must be ASCII: {ex}") from None
        descriptor_length = _DESCRIPTOR_FIXED_LENGTH + sum(len(s) for s in strings)
        frame_length = align(DESCRIPTOR_HEADER_LENGTH + descriptor_length, self._alignment)
        offset = self._next_offset
        if offset + frame_length > self._capacity:
            self._grow(offset + frame_length)
        memory, atomic = self._memory()

        recording_id = self._next_recording_id
        # The counter is advanced before the entry is written: a crash between the
        # two leaves an unused id, never an entry whose id the header would reuse.
        self._next_recording_id = recording_id + 1
        _I64.pack_into(memory, 8, self._next_recording_id)

        memory[offset : offset + frame_length] = bytes(frame_length)
        RecordingDescriptorEncoder.encode_headerless(
            memory,
            offset + DESCRIPTOR_HEADER_LENGTH,
            control_session_id=control_session_id,
            correlation_id=correlation_id,
            recording_id=recording_id,
            start_timestamp=start_timestamp,
            stop_timestamp=NULL_TIMESTAMP,
            start_position=start_position,
            stop_position=NULL_POSITION,
            initial_term_id=initial_term_id,
            segment_file_length=segment_file_length,
            term_buffer_length=term_buffer_length,
            mtu_length=mtu_length,
            session_id=session_id,
            stream_id=stream_id,
            stripped_channel=strings[0],
            original_channel=strings[1],
            source_identity=strings[2],
        )
        length = frame_length - DESCRIPTOR_HEADER_LENGTH
        _I64.pack_into(memory, offset + RECORDED_POSITION_OFFSET, NULL_POSITION)
        _I32.pack_into(memory, offset + _STATE_OFFSET, int(RecordingState.VALID))
        _I32.pack_into(memory, offset + _CHECKSUM_OFFSET, self._compute_checksum(offset, length))
        # The length goes last: it is what makes the entry part of the list.
        atomic.put_int32_ordered(offset + _LENGTH_OFFSET, length)

        self._next_offset = offset + frame_length
        self._index[recording_id] = offset
        self._synced()
        return recording_id

    def _grow(self, required: int) -> None:
        if required > MAX_CATALOG_LENGTH:
            raise CatalogError(
                f"{self.path}: catalog is full: {required} bytes needed, the maximum is {MAX_CATALOG_LENGTH}"
            )
        capacity = self._capacity
        while capacity < required:
            capacity = min(capacity + (capacity >> 1), MAX_CATALOG_LENGTH)  # Aeron grows by half
        self._remap(capacity)

    # ----------------------------------------------------------------- reading

    def _memory(self) -> tuple[mmap.mmap, AtomicBuffer]:
        if self._mmap is None or self._atomic is None:
            raise CatalogError(f"{self.path}: catalog is closed")
        return self._mmap, self._atomic

    def _offset(self, recording_id: int) -> int:
        offset = self._index.get(recording_id)
        if offset is None:
            raise RecordingUnknownError(recording_id)
        return offset

    def _decode(self, offset: int) -> RecordingDescriptor:
        memory, _ = self._memory()
        length, state = struct.unpack_from("<ii", memory, offset)
        d = self._decoder.wrap_headerless(memory, offset + DESCRIPTOR_HEADER_LENGTH, length)
        return RecordingDescriptor(
            recording_id=d.recording_id,
            control_session_id=d.control_session_id,
            correlation_id=d.correlation_id,
            start_timestamp=d.start_timestamp,
            stop_timestamp=d.stop_timestamp,
            start_position=d.start_position,
            stop_position=d.stop_position,
            initial_term_id=d.initial_term_id,
            segment_file_length=d.segment_file_length,
            term_buffer_length=d.term_buffer_length,
            mtu_length=d.mtu_length,
            session_id=d.session_id,
            stream_id=d.stream_id,
            stripped_channel=d.stripped_channel,
            original_channel=d.original_channel,
            source_identity=d.source_identity,
            state=RecordingState(state),
        )

    def descriptor(self, recording_id: int) -> RecordingDescriptor | None:
        """The recording's descriptor; None if unknown, INVALID or DELETED."""
        offset = self._index.get(recording_id)
        return None if offset is None else self._decode(offset)

    def has_recording(self, recording_id: int) -> bool:
        return recording_id in self._index

    def recordings(self, from_recording_id: int = 0, count: int | None = None) -> list[RecordingDescriptor]:
        """VALID recordings with id >= ``from_recording_id``, in id order, at most ``count``."""
        found: list[RecordingDescriptor] = []
        for recording_id, offset in self._index.items():
            if count is not None and len(found) >= count:
                break
            if recording_id >= from_recording_id:
                found.append(self._decode(offset))
        return found

    def _descending(self, min_recording_id: int) -> Iterator[RecordingDescriptor]:
        for recording_id in reversed(self._index):
            if recording_id < min_recording_id:
                return
            yield self._decode(self._index[recording_id])

    def find_by_uri(
        self, from_recording_id: int, count: int, channel_fragment: str, stream_id: int
    ) -> list[RecordingDescriptor]:
        """Aeron's ListRecordingsForUri: VALID recordings from ``from_recording_id`` on whose
        stream id matches and whose original channel contains ``channel_fragment``
        (an empty fragment matches every channel); at most ``count`` of them.

        Current Aeron (``ListRecordingsForUriSession`` / ``Catalog.originalChannelContains``)
        matches the *original* channel; releases before 1.30 matched the stripped one.
        """
        found: list[RecordingDescriptor] = []
        for recording_id, offset in self._index.items():
            if len(found) >= count:
                break
            if recording_id < from_recording_id:
                continue
            descriptor = self._decode(offset)
            if descriptor.stream_id == stream_id and channel_fragment in descriptor.original_channel:
                found.append(descriptor)
        return found

    def find_last_matching(self, min_recording_id: int, channel_fragment: str, stream_id: int, session_id: int) -> int:
        """Aeron's findLastMatchingRecording: the highest VALID id >= ``min_recording_id``
        with that session and stream id whose original channel contains the fragment;
        ``NULL_RECORDING_ID`` if none."""
        if min_recording_id < 0:
            return NULL_RECORDING_ID
        for descriptor in self._descending(min_recording_id):
            if (
                descriptor.session_id == session_id
                and descriptor.stream_id == stream_id
                and channel_fragment in descriptor.original_channel
            ):
                return descriptor.recording_id
        return NULL_RECORDING_ID

    def stop_position(self, recording_id: int) -> int:
        memory, atomic = self._memory()
        return atomic.get_int64_volatile(self._offset(recording_id) + _STOP_POSITION_OFFSET)

    def recorded_position(self, recording_id: int) -> int:
        """The fulmar recorded position (NULL_POSITION until the recorder first reports one)."""
        _, atomic = self._memory()
        return atomic.get_int64_volatile(self._offset(recording_id) + RECORDED_POSITION_OFFSET)

    # ----------------------------------------------------------------- updates

    def update_stop(self, recording_id: int, stop_position: int, stop_timestamp: int) -> None:
        """The recording stopped (Aeron's recordingStopped)."""
        offset = self._offset(recording_id)
        memory, atomic = self._memory()
        _I64.pack_into(memory, offset + _STOP_TIMESTAMP_OFFSET, stop_timestamp)
        atomic.put_int64_ordered(offset + _STOP_POSITION_OFFSET, stop_position)
        atomic.put_int64_ordered(offset + RECORDED_POSITION_OFFSET, stop_position)
        self._updated(offset)

    def update_start_position(self, recording_id: int, position: int) -> None:
        """Move the start (Aeron's startPosition, used when purging segments from the front)."""
        offset = self._offset(recording_id)
        memory, _ = self._memory()
        _I64.pack_into(memory, offset + _START_POSITION_OFFSET, position)
        self._updated(offset)

    def update_stop_position(self, recording_id: int, position: int) -> None:
        """Set the stop position (truncate), or NULL_POSITION to make the recording active again.

        Reactivating also clears the stop timestamp. A concrete position also becomes
        the recorded position, so a later recovery never trusts bytes a truncate removed.
        """
        offset = self._offset(recording_id)
        memory, atomic = self._memory()
        if position == NULL_POSITION:
            _I64.pack_into(memory, offset + _STOP_TIMESTAMP_OFFSET, NULL_TIMESTAMP)
        else:
            atomic.put_int64_ordered(offset + RECORDED_POSITION_OFFSET, position)
        atomic.put_int64_ordered(offset + _STOP_POSITION_OFFSET, position)
        self._updated(offset)

    def extend(self, recording_id: int, control_session_id: int, correlation_id: int, session_id: int) -> None:
        """Reactivate for an extend (Aeron's extendRecording): new session ids, stop NULL."""
        offset = self._offset(recording_id)
        memory, atomic = self._memory()
        _I64.pack_into(memory, offset + _CONTROL_SESSION_ID_OFFSET, control_session_id)
        _I64.pack_into(memory, offset + _CORRELATION_ID_OFFSET, correlation_id)
        _I64.pack_into(memory, offset + _STOP_TIMESTAMP_OFFSET, NULL_TIMESTAMP)
        _I32.pack_into(memory, offset + _SESSION_ID_OFFSET, session_id)
        atomic.put_int64_ordered(offset + _STOP_POSITION_OFFSET, NULL_POSITION)
        self._updated(offset)

    def invalidate(self, recording_id: int) -> None:
        """Mark the recording INVALID (purge); it disappears from every query."""
        self._change_state(recording_id, RecordingState.INVALID)

    def mark_deleted(self, recording_id: int) -> None:
        """Mark the recording DELETED (its segments are being removed)."""
        self._change_state(recording_id, RecordingState.DELETED)

    def _change_state(self, recording_id: int, state: RecordingState) -> None:
        offset = self._offset(recording_id)
        _, atomic = self._memory()
        # The state lives in the header, outside the checksummed bytes (as in Aeron).
        atomic.put_int32_ordered(offset + _STATE_OFFSET, int(state))
        del self._index[recording_id]
        self._synced()

    def update_recorded_position(self, recording_id: int, position: int) -> None:
        """Record that every segment write below ``position`` has returned.

        Not msync'd even at sync level >= 1: it is a hint that shortens the recovery
        scan. Losing it (power failure) costs a longer scan, not data; the segment
        writes themselves are synced by the writer at that level.
        """
        _, atomic = self._memory()
        atomic.put_int64_ordered(self._offset(recording_id) + RECORDED_POSITION_OFFSET, position)

    def _compute_checksum(self, offset: int, length: int) -> int:
        if self._checksum is None:
            return 0
        memory, _ = self._memory()
        start = offset + DESCRIPTOR_HEADER_LENGTH
        with memoryview(memory) as view:
            return _to_int32(self._checksum(view[start : start + length]))

    def _updated(self, offset: int) -> None:
        if self._checksum is not None:
            memory, _ = self._memory()
            length = _I32.unpack_from(memory, offset)[0]
            _I32.pack_into(memory, offset + _CHECKSUM_OFFSET, self._compute_checksum(offset, length))
        self._synced()

    def _synced(self) -> None:
        if self.file_sync_level >= 1:
            self.force()

    def force(self) -> None:
        """msync the mapping (and fsync the file at sync level 2)."""
        memory, _ = self._memory()
        memory.flush()
        if self.file_sync_level >= 2:
            os.fsync(self._fd)

    # ----------------------------------------------------------------- closing

    def close(self) -> None:
        self._unmap()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- recovery


def recover(
    catalog: Catalog, archive_dir: str | os.PathLike[str], now_ms: int, *, verify_crc: bool = False
) -> list[int]:
    """Close the recordings that were active when the archive died; returns their ids.

    For each VALID recording with a NULL stop position the stop becomes the end of
    the last complete frame: the scan starts at ``max(start, recorded position)``
    (bytes below the recorded position were fully written) and accepts frames only
    while they are entirely plausible (see :func:`segment.scan_complete_frames`;
    ``verify_crc`` also checks the payload crc the writer stored with
    ``checksum=True``). The segment holding the new stop is zeroed after it and
    later segment files are deleted, so a torn frame can never be replayed or
    extended over. Stop position and timestamp (``now_ms``) are then written.

    Afterwards every VALID recording is checked for missing segment files between
    its start and stop; if any are missing a :class:`CatalogError` listing all of
    them is raised (the recoveries above are already done and saved).
    """
    archive_dir = Path(archive_dir)
    recovered: list[int] = []
    for descriptor in catalog.recordings():
        if descriptor.stop_position != NULL_POSITION:
            continue
        start = descriptor.start_position
        recorded = catalog.recorded_position(descriptor.recording_id)
        if recorded < start or recorded & (FRAME_ALIGNMENT - 1):
            recorded = start  # NULL, or a value fulmar never writes: trust nothing
        stop = _segment.scan_complete_frames(archive_dir, descriptor, recorded, verify_crc=verify_crc)
        _segment.truncate_segments(archive_dir, descriptor, stop)
        catalog.update_stop(descriptor.recording_id, stop, now_ms)
        recovered.append(descriptor.recording_id)

    missing = []
    for descriptor in catalog.recordings():
        missing.extend(missing_segment_files(archive_dir, descriptor))
    if missing:
        raise CatalogError(f"{catalog.path}: segment files of valid recordings are missing: {', '.join(missing)}")
    return recovered


def missing_segment_files(archive_dir: str | os.PathLike[str], descriptor: RecordingDescriptor) -> list[str]:
    """Paths of the segment files that must hold the recording's bytes but do not exist."""
    stop = descriptor.stop_position
    if stop == NULL_POSITION or stop <= descriptor.start_position:
        return []
    term_length, segment_length = descriptor.term_buffer_length, descriptor.segment_file_length
    first = _segment.segment_file_base_position(
        descriptor.start_position, descriptor.start_position, term_length, segment_length
    )
    last = _segment.segment_file_base_position(descriptor.start_position, stop - 1, term_length, segment_length)
    missing = []
    for base in range(first, last + 1, segment_length):
        path = Path(archive_dir) / _segment.segment_file_name(descriptor.recording_id, base)
        if not path.exists():
            missing.append(str(path))
    return missing
