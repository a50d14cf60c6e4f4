"""``consensus.recording_log``: the cluster's ``recording.log``, in Aeron's file layout.

The recording log is the durable history of a node's Raft log: one TERM entry per
leadership term (which archive recording holds the log, where the term starts and,
once known, where it ends) and SNAPSHOT entries (which archive recording holds a
snapshot of the consensus module or of a service, and at which log position it was
taken). On start-up it answers "what must be loaded and replayed to get back to where
this node was?" (:meth:`RecordingLog.create_recovery_plan`); elections ask it for the
last term and its positions.

File layout (Aeron's ``io.aeron.cluster.RecordingLog``, the 2024 source of the 1.4x
series that knows ``ENTRY_TYPE_STANDBY_SNAPSHOT``; all little-endian):

====== ====== ==========================================================
offset type   field
====== ====== ==========================================================
0      i64    recordingId (archive recording of the log or snapshot)
8      i64    leadershipTermId
16     i64    termBaseLogPosition (log position where the term began)
24     i64    logPosition (end of a term, -1 while still open; position
              of a snapshot)
32     i64    timestamp (cluster clock)
40     i32    serviceId (-1 for a TERM and for the consensus module's
              own snapshot; 0.. for the services' snapshots)
44     i32    entryType: 0 TERM, 1 SNAPSHOT, 2 STANDBY_SNAPSHOT; bit 31
              set marks the entry invalid; the whole word -1 marks an
              entry Aeron removed (skipped on read, still counted)
48     i32+   archive endpoint (length then US-ASCII bytes), written only
              for STANDBY_SNAPSHOT entries
====== ====== ==========================================================

Records are variable-size: each takes ``align(length, 64)`` bytes, i.e. 64 bytes for a
TERM or SNAPSHOT and ``align(52 + len(endpoint), 64)`` for a STANDBY_SNAPSHOT, at most
4096 bytes.  A record's index (``entry_index``) is its ordinal in the file.  Bytes
48..63 of a TERM or SNAPSHOT record carry nothing (Aeron may leave stale bytes there;
fulmar writes zeros and never reads them).

Updates are in place: committing a term's end rewrites the 8 bytes at offset 24,
invalidating an entry rewrites the 4-byte type at offset 44. New records go at the end
of the file. Every write is an ``os.pwrite`` followed by ``os.fsync``.

Crash repair: an append that was cut short leaves a partial or garbage record at the
end of the file. :meth:`RecordingLog.open` finds it (a record running past the end of
the file, or a record whose fields are impossible with nothing plausible after it),
truncates the file back to the last whole record and reports it in
:attr:`RecordingLog.repaired`. An impossible record followed by plausible ones is not
a torn write but corruption: :class:`CorruptRecordingLogError`, naming the index.

Queries follow Aeron's in-memory order (:attr:`RecordingLog.sorted_entries`): by
leadership term id, then entry type, then TERMs by index and snapshots by log
position with service ids descending, so a snapshot set ends with the consensus
module's entry (service id -1), which Aeron appends last, after the services'.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from fulmar.errors import FulmarError
from fulmar.permissions import open_new_file

__all__ = [
    "CONSENSUS_MODULE_SERVICE_ID",
    "ENTRY_TYPE_INVALID_FLAG",
    "ENTRY_TYPE_SNAPSHOT",
    "ENTRY_TYPE_STANDBY_SNAPSHOT",
    "ENTRY_TYPE_TERM",
    "MAX_ENDPOINT_LENGTH",
    "MAX_ENTRY_LENGTH",
    "NULL_POSITION",
    "NULL_VALUE",
    "RECORD_ALIGNMENT",
    "RECORDING_LOG_FILE_NAME",
    "CorruptRecordingLogError",
    "DecodeResult",
    "Entry",
    "RecordingExtent",
    "RecordingExtentLookup",
    "RecordingLog",
    "RecordingLogError",
    "RecoveryPlan",
    "ReplayLog",
    "Snapshot",
    "decode_entries",
    "invalidate_entry_in_place",
    "record_length",
    "encode_entry",
]

_log = logging.getLogger(__name__)

RECORDING_LOG_FILE_NAME = "recording.log"

ENTRY_TYPE_TERM = 0
ENTRY_TYPE_SNAPSHOT = 1
ENTRY_TYPE_STANDBY_SNAPSHOT = 2
ENTRY_TYPE_INVALID_FLAG = 1 << 31  # as an unsigned mask; the stored int32 is negative
_REMOVED_ENTRY_TYPE = -1  # Aeron's removeEntry() writes NULL_VALUE over the type word
_KNOWN_TYPES = (ENTRY_TYPE_TERM, ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_STANDBY_SNAPSHOT)
_TYPE_NAMES = {
    ENTRY_TYPE_TERM: "TERM",
    ENTRY_TYPE_SNAPSHOT: "SNAPSHOT",
    ENTRY_TYPE_STANDBY_SNAPSHOT: "STANDBY_SNAPSHOT",
}

NULL_VALUE = -1
NULL_POSITION = -1
CONSENSUS_MODULE_SERVICE_ID = -1  # ConsensusModule.Configuration.SERVICE_ID

RECORDING_ID_OFFSET = 0
LEADERSHIP_TERM_ID_OFFSET = 8
TERM_BASE_LOG_POSITION_OFFSET = 16
LOG_POSITION_OFFSET = 24
TIMESTAMP_OFFSET = 32
SERVICE_ID_OFFSET = 40
ENTRY_TYPE_OFFSET = 44
ENDPOINT_OFFSET = 48

RECORD_ALIGNMENT = 64
MAX_ENTRY_LENGTH = 4096
MAX_ENDPOINT_LENGTH = MAX_ENTRY_LENGTH - ENDPOINT_OFFSET - 4  # 4044

_FIXED = struct.Struct("<qqqqqii")  # the 48 bytes before the endpoint
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
assert _FIXED.size == ENDPOINT_OFFSET

_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) & ~(alignment - 1)


def record_length(entry_type: int, archive_endpoint: str | None = None) -> int:
    """Bytes a record of this type (and endpoint) takes in the file, alignment included."""
    if entry_type == ENTRY_TYPE_STANDBY_SNAPSHOT:
        return _align(ENDPOINT_OFFSET + 4 + len(archive_endpoint or ""), RECORD_ALIGNMENT)
    return _align(ENDPOINT_OFFSET, RECORD_ALIGNMENT)


class RecordingLogError(FulmarError):
    """The recording log refused an operation or cannot be read.

    Raised for unknown terms or entries, out-of-range arguments, an unknown recording
    in a recovery plan and failed writes; the message says what and where.
    """


class CorruptRecordingLogError(RecordingLogError):
    """A whole record inside ``recording.log`` (not a torn tail) has impossible fields."""

    def __init__(self, path: str, entry_index: int, file_offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt entry at index {entry_index} (file offset {file_offset}): {reason}")
        self.path = path
        self.entry_index = entry_index
        self.file_offset = file_offset
        self.reason = reason


@dataclass(frozen=True)
class Entry:
    """One record of the recording log, as decoded from the file."""

    entry_index: int
    recording_id: int
    leadership_term_id: int
    term_base_log_position: int
    log_position: int
    timestamp: int
    service_id: int
    entry_type: int  # without the invalid flag
    is_valid: bool = True
    archive_endpoint: str | None = None
    file_offset: int = field(default=-1, compare=False)

    @property
    def length(self) -> int:
        """Bytes the record takes in the file."""
        return record_length(self.entry_type, self.archive_endpoint)

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(self.entry_type, "UNKNOWN")

    @property
    def is_valid_term(self) -> bool:
        return self.is_valid and self.entry_type == ENTRY_TYPE_TERM

    @property
    def is_valid_snapshot(self) -> bool:
        """A valid local SNAPSHOT (standby snapshots live in another node's archive)."""
        return self.is_valid and self.entry_type == ENTRY_TYPE_SNAPSHOT


@dataclass(frozen=True)
class Snapshot:
    """A snapshot to load during recovery."""

    recording_id: int
    leadership_term_id: int
    term_base_log_position: int
    log_position: int
    timestamp: int
    service_id: int

    @classmethod
    def of(cls, entry: Entry) -> Snapshot:
        return cls(
            entry.recording_id,
            entry.leadership_term_id,
            entry.term_base_log_position,
            entry.log_position,
            entry.timestamp,
            entry.service_id,
        )


@dataclass(frozen=True)
class RecordingExtent:
    """What the archive knows of a recording (the part of ``listRecording`` recovery needs)."""

    start_position: int
    stop_position: int
    initial_term_id: int = NULL_VALUE
    term_buffer_length: int = 0
    mtu_length: int = 0
    session_id: int = NULL_VALUE


RecordingExtentLookup = Callable[[int], RecordingExtent | None]
"""Asks the archive about a recording id; ``None`` when it has no such recording."""


@dataclass(frozen=True)
class ReplayLog:
    """The local log to replay during recovery (Aeron's ``RecordingLog.Log``)."""

    recording_id: int
    leadership_term_id: int
    term_base_log_position: int
    log_position: int  # the term's committed end, NULL_POSITION while open
    start_position: int  # snapshot position, else where the recording starts
    stop_position: int  # where the recording stops: the appended log position
    initial_term_id: int = NULL_VALUE
    term_buffer_length: int = 0
    mtu_length: int = 0
    session_id: int = NULL_VALUE


@dataclass(frozen=True)
class RecoveryPlan:
    """Snapshots to load and log to replay to bring a node back to its last state."""

    last_leadership_term_id: int
    last_term_base_log_position: int
    appended_log_position: int
    committed_log_position: int
    snapshots: tuple[Snapshot, ...]  # [consensus module, service 0, service 1, ...] or empty
    log: ReplayLog | None
    skipped_snapshot_sets: tuple[str, ...] = ()  # newer sets passed over, and why

    @property
    def has_replay(self) -> bool:
        return self.log is not None and self.log.stop_position > self.log.start_position


def _sort_key(entry: Entry) -> tuple[int, int, int, int]:
    if entry.entry_type == ENTRY_TYPE_TERM:
        return (entry.leadership_term_id, entry.entry_type, entry.entry_index, 0)
    return (entry.leadership_term_id, entry.entry_type, entry.log_position, -entry.service_id)


# --------------------------------------------------------------------------- codec


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordingLogError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise RecordingLogError(f"{name}={value} is out of range [{low}, {high}]")


def _impossible_fields(
    recording_id: int,
    leadership_term_id: int,
    term_base_log_position: int,
    log_position: int,
    service_id: int,
    entry_type: int | None,
) -> str | None:
    """Why these field values cannot have been written by a recording log, or None.

    ``entry_type`` None means a removed entry, whose type word was overwritten.
    """
    if recording_id < 0:
        return f"recordingId={recording_id} is negative"
    if leadership_term_id < 0:
        return f"leadershipTermId={leadership_term_id} is negative"
    if term_base_log_position < 0:
        return f"termBaseLogPosition={term_base_log_position} is negative"
    if log_position < NULL_POSITION:
        return f"logPosition={log_position} is below NULL_POSITION"
    if log_position != NULL_POSITION and log_position < term_base_log_position:
        return f"logPosition={log_position} is before termBaseLogPosition={term_base_log_position}"
    if service_id < CONSENSUS_MODULE_SERVICE_ID:
        return f"serviceId={service_id} is below -1"
    if entry_type == ENTRY_TYPE_TERM and service_id != NULL_VALUE:
        return f"TERM entry has serviceId={service_id}, expected -1"
    if entry_type in (ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_STANDBY_SNAPSHOT) and log_position < 0:
        return "snapshot entry has no logPosition"
    return None


@dataclass(frozen=True)
class _Decoded:
    entry: Entry | None  # None for a removed entry
    length: int


@dataclass(frozen=True)
class _Problem:
    partial: bool  # the record runs past the end of the data
    reason: str


def _decode_at(data: bytes | memoryview, offset: int, entry_index: int) -> _Decoded | _Problem:
    remaining = len(data) - offset
    base_length = record_length(ENTRY_TYPE_TERM)
    if remaining < base_length:
        return _Problem(True, f"only {remaining} of a record's {base_length} bytes are present")
    (recording_id, term_id, term_base, log_position, timestamp, service_id, raw_type) = _FIXED.unpack_from(data, offset)
    if raw_type == _REMOVED_ENTRY_TYPE:
        why = _impossible_fields(recording_id, term_id, term_base, log_position, service_id, None)
        if why is not None:
            return _Problem(False, why)
        return _Decoded(None, base_length)

    is_valid = raw_type >= 0
    entry_type = raw_type & ~ENTRY_TYPE_INVALID_FLAG & 0xFFFFFFFF
    if entry_type not in _KNOWN_TYPES:
        return _Problem(False, f"unknown entry type 0x{raw_type & 0xFFFFFFFF:08x}")
    why = _impossible_fields(recording_id, term_id, term_base, log_position, service_id, entry_type)
    if why is not None:
        return _Problem(False, why)

    endpoint: str | None = None
    length = base_length
    if entry_type == ENTRY_TYPE_STANDBY_SNAPSHOT:
        (endpoint_length,) = _I32.unpack_from(data, offset + ENDPOINT_OFFSET)
        if not 0 < endpoint_length <= MAX_ENDPOINT_LENGTH:
            return _Problem(False, f"archive endpoint length {endpoint_length} is out of range")
        length = _align(ENDPOINT_OFFSET + 4 + endpoint_length, RECORD_ALIGNMENT)
        if length > remaining:
            return _Problem(True, f"only {remaining} of a record's {length} bytes are present")
        start = offset + ENDPOINT_OFFSET + 4
        raw_endpoint = bytes(data[start : start + endpoint_length])
        if not raw_endpoint.isascii() or b"\x00" in raw_endpoint:
            return _Problem(False, "archive endpoint is not US-ASCII text")
        endpoint = raw_endpoint.decode("ascii")

    entry = Entry(
        entry_index=entry_index,
        recording_id=recording_id,
        leadership_term_id=term_id,
        term_base_log_position=term_base,
        log_position=log_position,
        timestamp=timestamp,
        service_id=service_id,
        entry_type=entry_type,
        is_valid=is_valid,
        archive_endpoint=endpoint,
        file_offset=offset,
    )
    return _Decoded(entry, length)


@dataclass(frozen=True)
class DecodeResult:
    """Entries decoded from a recording log image, and where the good data ends."""

    entries: list[Entry]
    next_entry_index: int
    end_offset: int  # bytes of whole, plausible records; the rest is a torn tail
    torn_tail: str | None  # why the bytes from end_offset on were dropped


def invalidate_entry_in_place(path: str | os.PathLike[str], entry: Entry) -> None:
    """Mark one entry of a recording log invalid without opening it as its
    owner does (no repair of a torn tail, which may be an append under way):
    the 4-byte type word at the entry's offset is rewritten and synced, after
    checking that the record there is still ``entry``.  For tools working
    beside a running consensus module, which only appends and rewrites other
    fields; its own copy of the entry still says valid until it restarts."""
    fd = os.open(path, os.O_RDWR)
    try:
        record = os.pread(fd, RECORD_ALIGNMENT, entry.file_offset)
        found = _decode_at(record, 0, entry.entry_index)
        if not isinstance(found, _Decoded) or found.entry is None or found.entry != entry:
            raise RecordingLogError(
                f"{path}: entry {entry.entry_index} at offset {entry.file_offset} changed; read the recording log again"
            )
        raw_type = (entry.entry_type | ENTRY_TYPE_INVALID_FLAG) - (1 << 32)
        os.pwrite(fd, _I32.pack(raw_type), entry.file_offset + ENTRY_TYPE_OFFSET)
        os.fsync(fd)
    finally:
        os.close(fd)


def decode_entries(data: bytes | memoryview, path: str = RECORDING_LOG_FILE_NAME) -> DecodeResult:
    """Decode a whole ``recording.log`` image.

    A partial or garbage record at the end is reported in ``torn_tail`` (not raised);
    a bad record followed by a plausible one raises :class:`CorruptRecordingLogError`.
    """
    entries: list[Entry] = []
    offset = 0
    index = 0
    size = len(data)
    while offset < size:
        decoded = _decode_at(data, offset, index)
        if isinstance(decoded, _Problem):
            if not decoded.partial:
                _raise_if_anything_follows(data, path, offset, index, decoded.reason)
            torn = (
                f"dropped {size - offset} trailing bytes at file offset {offset} "
                f"(entry index {index}): {decoded.reason}"
            )
            # The entries kept must be a valid log on their own: a torn tail is
            # repaired only if what remains would load again (found by fuzzing:
            # the check used to run on untorn logs only).
            _check_term_recording_ids(entries, path)
            return DecodeResult(entries, index, offset, torn)
        if decoded.entry is not None:
            entries.append(decoded.entry)
        offset += decoded.length
        index += 1
    _check_term_recording_ids(entries, path)
    return DecodeResult(entries, index, offset, None)


def _raise_if_anything_follows(data: bytes | memoryview, path: str, offset: int, index: int, reason: str) -> None:
    """A bad record is a torn tail only if no plausible whole record comes after it."""
    probe = offset + RECORD_ALIGNMENT
    while probe + RECORD_ALIGNMENT <= len(data):
        if isinstance(_decode_at(data, probe, -1), _Decoded):
            raise CorruptRecordingLogError(
                path, index, offset, f"{reason} (a plausible record follows at offset {probe})"
            )
        probe += RECORD_ALIGNMENT


def _check_term_recording_ids(entries: list[Entry], path: str) -> None:
    """Aeron keeps every leadership term of a node in one log recording."""
    first: Entry | None = None
    for entry in entries:
        if entry.entry_type != ENTRY_TYPE_TERM:
            continue
        if first is None:
            first = entry
        elif entry.recording_id != first.recording_id:
            raise CorruptRecordingLogError(
                path,
                entry.entry_index,
                entry.file_offset,
                f"TERM recordingId={entry.recording_id} differs from recordingId="
                f"{first.recording_id} of the TERM at index {first.entry_index}",
            )


def encode_entry(entry: Entry) -> bytes:
    """The record bytes of ``entry``, zero-padded to its aligned length."""
    raw_type = entry.entry_type
    if not entry.is_valid:
        raw_type = (raw_type | ENTRY_TYPE_INVALID_FLAG) - (1 << 32)
    out = bytearray(entry.length)
    try:
        _FIXED.pack_into(
            out,
            0,
            entry.recording_id,
            entry.leadership_term_id,
            entry.term_base_log_position,
            entry.log_position,
            entry.timestamp,
            entry.service_id,
            raw_type,
        )
    except struct.error as error:
        raise RecordingLogError(f"entry {entry} does not fit the record layout: {error}") from error
    if entry.entry_type == ENTRY_TYPE_STANDBY_SNAPSHOT:
        try:
            endpoint = (entry.archive_endpoint or "").encode("ascii")
        except UnicodeEncodeError as error:
            raise RecordingLogError(f"archive endpoint of {entry} is not US-ASCII") from error
        _I32.pack_into(out, ENDPOINT_OFFSET, len(endpoint))
        out[ENDPOINT_OFFSET + 4 : ENDPOINT_OFFSET + 4 + len(endpoint)] = endpoint
    return bytes(out)


# --------------------------------------------------------------------------- the log


class RecordingLog:
    """An open ``recording.log``. Use :meth:`open`; close it (or use ``with``) when done."""

    def __init__(self, path: Path, fd: int, fsync: bool) -> None:
        self._path = path
        self._fd = fd
        self._fsync = fsync
        self._entries: list[Entry] = []
        self._sorted: list[Entry] = []
        self._term_index: dict[int, int] = {}  # leadership term id -> index in _sorted
        self._next_entry_index = 0
        self._end = 0
        self._term_recording_id = NULL_VALUE
        self.repaired: str | None = None
        """Set by :meth:`open` when a torn trailing record was cut away: what and where."""

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, cluster_dir: str | os.PathLike[str], create: bool = True, *, fsync: bool = True) -> RecordingLog:
        """Open ``<cluster_dir>/recording.log``, creating it if ``create``.

        Raises ``FileNotFoundError`` if it is absent and ``create`` is false, and
        :class:`CorruptRecordingLogError` if a record before the last is impossible.
        ``fsync=False`` skips the fsyncs (for tests and throw-away logs only).
        """
        directory = Path(cluster_dir)
        path = directory / RECORDING_LOG_FILE_NAME
        is_new = not path.exists()
        if is_new and not create:
            raise FileNotFoundError(f"no recording log at {path}")
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = open_new_file(path, flags)
        log = cls(path, fd, fsync)
        try:
            if is_new:
                log._sync_directory(directory)
            log._load()
        except BaseException:
            os.close(fd)
            raise
        return log

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordingLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def path(self) -> Path:
        return self._path

    def reload(self) -> None:
        """Read the file again (repairing a torn tail as :meth:`open` does)."""
        self._load()

    def _load(self) -> None:
        data = self._read_all()
        result = decode_entries(data, str(self._path))
        if result.torn_tail is not None:
            self.repaired = f"{self._path}: {result.torn_tail}"
            _log.warning("recording log repaired: %s", self.repaired)
            self._checked(os.ftruncate, self._fd, result.end_offset)
            self._sync()
        self._entries = result.entries
        self._next_entry_index = result.next_entry_index
        self._end = result.end_offset
        self._term_recording_id = next(
            (e.recording_id for e in self._entries if e.entry_type == ENTRY_TYPE_TERM), NULL_VALUE
        )
        self._reindex()

    def _read_all(self) -> bytes:
        size = os.fstat(self._fd).st_size
        chunks: list[bytes] = []
        offset = 0
        while offset < size:
            chunk = os.pread(self._fd, size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def _reindex(self) -> None:
        self._sorted = sorted(self._entries, key=_sort_key)
        self._term_index = {}
        for i, entry in enumerate(self._sorted):
            if entry.is_valid_term:
                self._term_index[entry.leadership_term_id] = i

    # ------------------------------------------------------------------ views

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every entry (valid or not, removed ones excepted) in file order."""
        return tuple(self._entries)

    @property
    def sorted_entries(self) -> tuple[Entry, ...]:
        """Every entry in Aeron's order: by term, type, then index or position."""
        return tuple(self._sorted)

    @property
    def next_entry_index(self) -> int:
        return self._next_entry_index

    def entry(self, entry_index: int) -> Entry:
        for entry in self._entries:
            if entry.entry_index == entry_index:
                return entry
        raise RecordingLogError(f"unknown entry index {entry_index}")

    # ------------------------------------------------------------------ term queries

    def find_last_term(self) -> Entry | None:
        """The valid TERM entry with the highest leadership term id, if any."""
        for entry in reversed(self._sorted):
            if entry.is_valid_term:
                return entry
        return None

    def find_last_term_recording_id(self) -> int:
        last = self.find_last_term()
        return last.recording_id if last is not None else NULL_VALUE

    def find_term_entry(self, leadership_term_id: int) -> Entry | None:
        index = self._term_index.get(leadership_term_id)
        return None if index is None else self._sorted[index]

    def get_term_entry(self, leadership_term_id: int) -> Entry:
        entry = self.find_term_entry(leadership_term_id)
        if entry is None:
            raise RecordingLogError(f"unknown leadershipTermId={leadership_term_id}")
        return entry

    def get_term_timestamp(self, leadership_term_id: int) -> int:
        """The term's timestamp, or ``NULL_VALUE`` if the term is unknown."""
        entry = self.find_term_entry(leadership_term_id)
        return NULL_VALUE if entry is None else entry.timestamp

    def is_unknown(self, leadership_term_id: int) -> bool:
        return leadership_term_id not in self._term_index

    # ------------------------------------------------------------------ snapshot queries

    def get_latest_snapshot(self, service_id: int) -> Entry | None:
        """The service's snapshot in the newest set the consensus module completed.

        As Aeron: a set is anchored by a valid consensus-module snapshot (service id
        -1); service ``s``'s entry sits ``s + 1`` places before it in sorted order. fulmar
        also requires it to match the anchor's term and log position.
        """
        for i in range(len(self._sorted) - 1, -1, -1):
            anchor = self._sorted[i]
            if not (anchor.is_valid_snapshot and anchor.service_id == CONSENSUS_MODULE_SERVICE_ID):
                continue
            if service_id == CONSENSUS_MODULE_SERVICE_ID:
                return anchor
            j = i - (service_id + 1)
            if j >= 0:
                candidate = self._sorted[j]
                if (
                    candidate.is_valid_snapshot
                    and candidate.service_id == service_id
                    and candidate.leadership_term_id == anchor.leadership_term_id
                    and candidate.log_position == anchor.log_position
                ):
                    return candidate
        return None

    # ------------------------------------------------------------------ recovery

    def create_recovery_plan(
        self,
        service_count: int,
        recording_extent: RecordingExtentLookup,
        replicated_recording_id: int = NULL_VALUE,
    ) -> RecoveryPlan:
        """What to load and replay to recover this node (Aeron's ``createRecoveryPlan``).

        Snapshots: the newest valid consensus-module snapshot for which every service
        ``0..service_count-1`` has a valid snapshot at the same term and log position;
        newer incomplete sets are passed over (listed in ``skipped_snapshot_sets``).
        Log: the last valid TERM; its recording is replayed from the snapshot position
        (or, without a snapshot, from where the recording starts) to where it stops.
        """
        _check_int("service_count", service_count, 0, _INT32_MAX)
        snapshots, skipped = self._latest_consistent_snapshots(service_count)
        log = self._plan_log(snapshots, recording_extent, replicated_recording_id)

        last_term_id = NULL_VALUE
        last_term_base = 0
        appended = 0
        committed = 0
        if snapshots:
            anchor = snapshots[0]
            last_term_id = anchor.leadership_term_id
            last_term_base = anchor.term_base_log_position
            appended = anchor.log_position
            committed = anchor.log_position
        if log is not None:
            last_term_id = log.leadership_term_id
            last_term_base = log.term_base_log_position
            appended = log.stop_position
            if log.log_position != NULL_POSITION:
                committed = log.log_position
        return RecoveryPlan(
            last_leadership_term_id=last_term_id,
            last_term_base_log_position=last_term_base,
            appended_log_position=appended,
            committed_log_position=committed,
            snapshots=tuple(snapshots),
            log=log,
            skipped_snapshot_sets=tuple(skipped),
        )

    def latest_snapshot_set(self, service_count: int) -> list[Snapshot]:
        """The newest complete set of snapshots, as a recovery plan would load
        it ([consensus module, service 0, ...]; empty if there is none)."""
        _check_int("service_count", service_count, 0, _INT32_MAX)
        return self._latest_consistent_snapshots(service_count)[0]

    def _latest_consistent_snapshots(self, service_count: int) -> tuple[list[Snapshot], list[str]]:
        skipped: list[str] = []
        for i in range(len(self._sorted) - 1, -1, -1):
            anchor = self._sorted[i]
            if not (anchor.is_valid_snapshot and anchor.service_id == CONSENSUS_MODULE_SERVICE_ID):
                continue
            by_service: dict[int, Entry] = {}
            for entry in self._sorted[:i]:
                if (
                    entry.is_valid_snapshot
                    and 0 <= entry.service_id < service_count
                    and entry.leadership_term_id == anchor.leadership_term_id
                    and entry.log_position == anchor.log_position
                ):
                    by_service[entry.service_id] = entry  # the latest wins
            missing = [s for s in range(service_count) if s not in by_service]
            if not missing:
                ordered = [Snapshot.of(anchor)]
                ordered.extend(Snapshot.of(by_service[s]) for s in range(service_count))
                return ordered, skipped
            skipped.append(
                f"consensus module snapshot at index {anchor.entry_index} "
                f"(term {anchor.leadership_term_id}, log position {anchor.log_position}) "
                f"lacks valid snapshots for service(s) {missing}"
            )
        return [], skipped

    def _plan_log(
        self,
        snapshots: list[Snapshot],
        recording_extent: RecordingExtentLookup,
        replicated_recording_id: int,
    ) -> ReplayLog | None:
        if not self._sorted:
            if replicated_recording_id == NULL_VALUE:
                return None
            extent = self._extent(recording_extent, replicated_recording_id)
            return ReplayLog(
                recording_id=replicated_recording_id,
                leadership_term_id=NULL_VALUE,
                term_base_log_position=0,
                log_position=0,
                start_position=extent.start_position,
                stop_position=extent.stop_position,
                initial_term_id=extent.initial_term_id,
                term_buffer_length=extent.term_buffer_length,
                mtu_length=extent.mtu_length,
                session_id=extent.session_id,
            )
        term = self.find_last_term()
        if term is None:
            return None
        extent = self._extent(recording_extent, term.recording_id)
        start = snapshots[0].log_position if snapshots else extent.start_position
        return ReplayLog(
            recording_id=term.recording_id,
            leadership_term_id=term.leadership_term_id,
            term_base_log_position=term.term_base_log_position,
            log_position=term.log_position,
            start_position=start,
            stop_position=extent.stop_position,
            initial_term_id=extent.initial_term_id,
            term_buffer_length=extent.term_buffer_length,
            mtu_length=extent.mtu_length,
            session_id=extent.session_id,
        )

    @staticmethod
    def _extent(lookup: RecordingExtentLookup, recording_id: int) -> RecordingExtent:
        extent = lookup(recording_id)
        if extent is None:
            raise RecordingLogError(f"unknown recording id: {recording_id}")
        return extent

    # ------------------------------------------------------------------ appends

    def append_term(
        self, recording_id: int, leadership_term_id: int, term_base_log_position: int, timestamp: int
    ) -> Entry:
        """Append the TERM entry of a new leadership term (its end still open).

        As Aeron: all terms share one log recording; a term id already present (and
        valid) is refused; the previous term, if present, is committed at this term's
        base; if the next term is already present, this one ends where that begins.
        """
        _check_int("recording_id", recording_id, 0, _INT64_MAX)
        _check_int("leadership_term_id", leadership_term_id, 0, _INT64_MAX)
        _check_int("term_base_log_position", term_base_log_position, 0, _INT64_MAX)
        _check_int("timestamp", timestamp, -_INT64_MAX - 1, _INT64_MAX)
        if self._term_recording_id not in (NULL_VALUE, recording_id):
            raise RecordingLogError(
                f"invalid TERM recordingId={recording_id}, expected recordingId={self._term_recording_id}"
            )
        if leadership_term_id in self._term_index:
            raise RecordingLogError(f"duplicate TERM entry for leadershipTermId={leadership_term_id}")
        previous = self.find_term_entry(leadership_term_id - 1)
        if previous is not None and term_base_log_position < previous.term_base_log_position:
            raise RecordingLogError(
                f"termBaseLogPosition={term_base_log_position} is before the base "
                f"{previous.term_base_log_position} of leadershipTermId={leadership_term_id - 1}"
            )
        log_position = NULL_POSITION
        following = self.find_term_entry(leadership_term_id + 1)
        if following is not None:
            if following.term_base_log_position < term_base_log_position:
                raise RecordingLogError(
                    f"termBaseLogPosition={term_base_log_position} is after the base "
                    f"{following.term_base_log_position} of leadershipTermId={leadership_term_id + 1}"
                )
            log_position = following.term_base_log_position
        if previous is not None:
            self.commit_log_position(leadership_term_id - 1, term_base_log_position)

        entry = self._append(
            Entry(
                entry_index=self._next_entry_index,
                recording_id=recording_id,
                leadership_term_id=leadership_term_id,
                term_base_log_position=term_base_log_position,
                log_position=log_position,
                timestamp=timestamp,
                service_id=NULL_VALUE,
                entry_type=ENTRY_TYPE_TERM,
            )
        )
        self._term_recording_id = recording_id
        return entry

    def append_snapshot(
        self,
        recording_id: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        timestamp: int,
        service_id: int,
    ) -> Entry:
        """Append a SNAPSHOT entry (service id -1 for the consensus module's own).

        As Aeron, an invalidated snapshot with the same term, base, position and
        service is made valid again in place (with the new recording id and
        timestamp) instead of appending a duplicate.
        """
        self._check_snapshot_args(
            recording_id, leadership_term_id, term_base_log_position, log_position, timestamp, service_id
        )
        for entry in sorted(self._entries, key=lambda e: e.entry_index, reverse=True):
            if (
                not entry.is_valid
                and entry.entry_type == ENTRY_TYPE_SNAPSHOT
                and entry.leadership_term_id == leadership_term_id
                and entry.term_base_log_position == term_base_log_position
                and entry.log_position == log_position
                and entry.service_id == service_id
            ):
                restored = replace(entry, recording_id=recording_id, timestamp=timestamp, is_valid=True)
                self._write(entry.file_offset, encode_entry(restored))
                self._replace(restored)
                return restored
        return self._append(
            Entry(
                entry_index=self._next_entry_index,
                recording_id=recording_id,
                leadership_term_id=leadership_term_id,
                term_base_log_position=term_base_log_position,
                log_position=log_position,
                timestamp=timestamp,
                service_id=service_id,
                entry_type=ENTRY_TYPE_SNAPSHOT,
            )
        )

    def append_standby_snapshot(
        self,
        recording_id: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        timestamp: int,
        service_id: int,
        archive_endpoint: str,
    ) -> Entry:
        """Append a STANDBY_SNAPSHOT entry: a snapshot held by the archive at ``archive_endpoint``."""
        self._check_snapshot_args(
            recording_id, leadership_term_id, term_base_log_position, log_position, timestamp, service_id
        )
        if not archive_endpoint:
            raise RecordingLogError("a standby snapshot needs an archive endpoint")
        if not archive_endpoint.isascii() or "\x00" in archive_endpoint:
            raise RecordingLogError(f"archive endpoint {archive_endpoint!r} is not US-ASCII text")
        if len(archive_endpoint) > MAX_ENDPOINT_LENGTH:
            raise RecordingLogError(f"archive endpoint is too long: {len(archive_endpoint)} > {MAX_ENDPOINT_LENGTH}")
        return self._append(
            Entry(
                entry_index=self._next_entry_index,
                recording_id=recording_id,
                leadership_term_id=leadership_term_id,
                term_base_log_position=term_base_log_position,
                log_position=log_position,
                timestamp=timestamp,
                service_id=service_id,
                entry_type=ENTRY_TYPE_STANDBY_SNAPSHOT,
                archive_endpoint=archive_endpoint,
            )
        )

    @staticmethod
    def _check_snapshot_args(
        recording_id: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        timestamp: int,
        service_id: int,
    ) -> None:
        _check_int("recording_id", recording_id, 0, _INT64_MAX)
        _check_int("leadership_term_id", leadership_term_id, 0, _INT64_MAX)
        _check_int("term_base_log_position", term_base_log_position, 0, _INT64_MAX)
        _check_int("log_position", log_position, term_base_log_position, _INT64_MAX)
        _check_int("timestamp", timestamp, -_INT64_MAX - 1, _INT64_MAX)
        _check_int("service_id", service_id, CONSENSUS_MODULE_SERVICE_ID, _INT32_MAX)

    # ------------------------------------------------------------------ updates

    def commit_log_position(self, leadership_term_id: int, log_position: int) -> None:
        """Record where a term ends (rewrites its logPosition in place)."""
        entry = self.get_term_entry(leadership_term_id)
        _check_int("log_position", log_position, entry.term_base_log_position, _INT64_MAX)
        if entry.log_position == log_position:
            return
        self._write(entry.file_offset + LOG_POSITION_OFFSET, _I64.pack(log_position))
        self._replace(replace(entry, log_position=log_position))

    def truncate_terms_to(self, position: int) -> list[Entry]:
        """The log is cut back to ``position`` (a follower drops uncommitted entries
        its new leader does not have): terms starting after it are invalidated, as
        are snapshots beyond it, and the term holding ``position`` is open again
        (no end).  Returns the entries invalidated."""
        _check_int("position", position, 0, _INT64_MAX)
        dropped = []
        for entry in list(self._entries):
            if not entry.is_valid:
                continue
            beyond = (
                entry.term_base_log_position > position
                if entry.entry_type == ENTRY_TYPE_TERM
                else entry.log_position > position
            )
            if beyond:
                dropped.append(self.invalidate_entry(entry.entry_index))
        last = self.find_last_term()
        if last is not None and last.log_position != NULL_POSITION:
            self._write(last.file_offset + LOG_POSITION_OFFSET, _I64.pack(NULL_POSITION))
            self._replace(replace(last, log_position=NULL_POSITION))
        return dropped

    def drop_last_term(self, leadership_term_id: int) -> bool:
        """Forget the last term if it is ``leadership_term_id`` and holds no entry
        beyond its base (its new leader never had it); the term before it is open
        again.  False if there was nothing to drop."""
        last = self.find_last_term()
        if last is None or last.leadership_term_id != leadership_term_id:
            return False
        self.invalidate_entry(last.entry_index, leadership_term_id)
        previous = self.find_last_term()
        if previous is not None and previous.log_position != NULL_POSITION:
            self._write(previous.file_offset + LOG_POSITION_OFFSET, _I64.pack(NULL_POSITION))
            self._replace(replace(previous, log_position=NULL_POSITION))
        return True

    def invalidate_entry(self, entry_index: int, leadership_term_id: int | None = None) -> Entry:
        """Mark an entry invalid (sets bit 31 of its type word); returns the updated entry.

        ``leadership_term_id``, when given, must match the entry's (Aeron's cross-check).
        Invalidating a TERM forgets the term; take care to leave a log that still recovers.
        """
        entry = self.entry(entry_index)
        if leadership_term_id is not None and entry.leadership_term_id != leadership_term_id:
            raise RecordingLogError(
                f"entry index {entry_index} belongs to leadershipTermId={entry.leadership_term_id}, "
                f"not {leadership_term_id}"
            )
        invalid = replace(entry, is_valid=False)
        raw_type = (entry.entry_type | ENTRY_TYPE_INVALID_FLAG) - (1 << 32)
        self._write(entry.file_offset + ENTRY_TYPE_OFFSET, _I32.pack(raw_type))
        self._replace(invalid)
        return invalid

    def invalidate_latest_snapshot(self) -> bool:
        """Invalidate the newest snapshot set, so that recovery uses the one before it.

        The set is the newest valid consensus-module snapshot and the valid service
        snapshots 0, 1, ... right before it (same term and position). Returns False
        when there is no valid snapshot.
        """
        anchor_at = -1
        for i in range(len(self._sorted) - 1, -1, -1):
            entry = self._sorted[i]
            if entry.is_valid_snapshot and entry.service_id == CONSENSUS_MODULE_SERVICE_ID:
                anchor_at = i
                break
        if anchor_at < 0:
            return False
        anchor = self._sorted[anchor_at]
        if anchor.leadership_term_id not in self._term_index:
            raise RecordingLogError(f"no matching term for snapshot: leadershipTermId={anchor.leadership_term_id}")
        to_invalidate: list[int] = []
        expected_service = CONSENSUS_MODULE_SERVICE_ID
        for i in range(anchor_at, -1, -1):
            entry = self._sorted[i]
            if not (
                entry.is_valid_snapshot
                and entry.service_id == expected_service
                and entry.leadership_term_id == anchor.leadership_term_id
                and entry.log_position == anchor.log_position
            ):
                break
            to_invalidate.append(entry.entry_index)
            expected_service += 1
        for entry_index in to_invalidate:
            self.invalidate_entry(entry_index)
        return True

    # ------------------------------------------------------------------ I/O

    def _append(self, entry: Entry) -> Entry:
        placed = replace(entry, file_offset=self._end)
        data = encode_entry(placed)
        self._write(self._end, data)
        self._end += len(data)
        self._next_entry_index += 1
        self._entries.append(placed)
        self._reindex()
        return placed

    def _replace(self, updated: Entry) -> None:
        for i, entry in enumerate(self._entries):
            if entry.entry_index == updated.entry_index:
                self._entries[i] = updated
                break
        self._reindex()

    def _write(self, offset: int, data: bytes) -> None:
        if self._fd < 0:
            raise RecordingLogError(f"{self._path} is closed")
        written = self._checked(os.pwrite, self._fd, data, offset)
        if written != len(data):
            raise RecordingLogError(f"{self._path}: short write at offset {offset}: {written} of {len(data)} bytes")
        self._sync()

    def _sync(self) -> None:
        if self._fsync:
            self._checked(os.fsync, self._fd)

    def _checked(self, call: Callable[..., int | None], *args: object) -> int:
        try:
            result = call(*args)
        except OSError as error:
            raise RecordingLogError(f"{self._path}: {call.__name__} failed: {error}") from error
        return result if isinstance(result, int) else 0

    def _sync_directory(self, directory: Path) -> None:
        if not self._fsync:
            return
        try:
            dir_fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)
