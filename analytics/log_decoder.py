"""The cluster log recordings of archive directories, decoded into columns.

A node's archive records its Raft log (stream ``LOG_STREAM_ID``, 100) as one
recording that is extended term after term, cut into segment files
``<recordingId>-<segmentBase>.rec``.  A fragmented message never crosses a
term, and a segment holds whole terms, so every segment file decodes on its
own: it is the unit of work (:class:`LogSegment`, one Spark partition).

:func:`decode_segment` walks a segment in C (``fulmar_log_decode``), which
reassembles fragments and decodes the SBE header and the fields of the six
log messages into column arrays; :func:`to_record_batch` turns those into an
Arrow batch of :data:`COLUMNS`.  :func:`read_log` is the same read, segment
after segment, in one process: no Spark.

Corrupt data (a frame with an impossible length, a fragment out of order, a
message too short for its template, a hole or a missing or short file below
where the recording stops) raises :class:`LogCorruptError` naming the file
and position, or, with ``permissive=True``, is skipped and reported as a row
whose ``corrupt_record`` says what was skipped (Spark's PERMISSIVE mode).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fulmar._native import ffi, lib
from fulmar.archive.catalog import NULL_POSITION, Catalog, RecordingDescriptor
from fulmar.archive.segment import (
    list_segment_files,
    segment_base_of_file,
    segment_file_base_position,
    segment_file_name,
)
from fulmar.codecs.generated import cluster as cluster_codecs
from fulmar.consensus.protocol import LOG_STREAM_ID
from fulmar.errors import FulmarError
from fulmar.frames import FRAME_ALIGNMENT, align
from fulmar.logbuffer import check_term_length

BATCH_ROWS = 65536
PAYLOAD_CAPACITY = 4 * 1024 * 1024
# A message is at most 16 MiB (Aeron's maxMessageLength); the payload area
# grows to hold one, never beyond this.
PAYLOAD_CAPACITY_MAX = 32 * 1024 * 1024

# The message types the issue of the log asks for, by template id; any other
# template of the cluster schema is named after its codec, any other schema
# is "Unknown".
LOG_MESSAGE_TYPES: dict[int, str] = {
    decoder.TEMPLATE_ID: decoder.NAME
    for decoder in (
        cluster_codecs.SessionMessageHeaderDecoder,
        cluster_codecs.SessionOpenEventDecoder,
        cluster_codecs.SessionCloseEventDecoder,
        cluster_codecs.TimerEventDecoder,
        cluster_codecs.ClusterActionRequestDecoder,
        cluster_codecs.NewLeadershipTermEventDecoder,
    )
}
_CLUSTER_TEMPLATE_NAMES: dict[int, str] = {template_id: d.NAME for template_id, d in cluster_codecs.DECODERS.items()}
UNKNOWN_TYPE = "Unknown"
CORRUPT_TYPE = "Corrupt"

# (name, Spark SQL type) of each column, in order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("archive_dir", "string"),
    ("recording_id", "bigint"),
    ("leadership_term_id", "bigint"),
    ("log_position", "bigint"),  # where the message's first frame starts
    ("next_position", "bigint"),  # after its last frame: what a service's Header.position() says
    ("message_type", "string"),
    ("template_id", "int"),
    ("cluster_session_id", "bigint"),
    ("correlation_id", "bigint"),
    ("timestamp", "bigint"),  # cluster time, in the cluster's time unit (see time_unit)
    ("leader_member_id", "int"),
    ("time_unit", "string"),
    ("cluster_action", "string"),
    ("close_reason", "string"),
    ("payload", "binary"),  # a session message: the application's bytes; others: the whole SBE message
    ("payload_length", "int"),
    ("fragments", "int"),
    ("corrupt_record", "string"),
)
SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)


class LogCorruptError(FulmarError):
    """A log segment holds something no cluster writes; the message names the file and position."""

    def __init__(self, path: str, position: int, file_offset: int, reason: str) -> None:
        super().__init__(f"{path}: {reason} at log position {position} (file offset {file_offset})")
        self.path = path
        self.position = position
        self.file_offset = file_offset
        self.reason = reason


_REASONS = {
    lib.FULMAR_LOG_BAD_FRAME: "a frame length that is below the header, or runs past the data or its term",
    lib.FULMAR_LOG_BAD_FRAME_TYPE: "a frame that is neither DATA nor PAD",
    lib.FULMAR_LOG_BAD_FRAGMENT: "a fragment out of order (a middle or end without a begin, or a begin "
    "inside an unfinished message)",
    lib.FULMAR_LOG_SHORT_MESSAGE: "a cluster message shorter than its template's fields",
    lib.FULMAR_LOG_UNFINISHED: "a fragmented message cut off before its end fragment",
}


# --------------------------------------------------------------------------- finding the segments


@dataclass(frozen=True)
class LogSegment:
    """One segment file of a log recording, and which of its bytes to decode."""

    archive_dir: str
    recording_id: int
    file_name: str
    segment_base: int  # log position of the file's first byte
    start_offset: int  # file offsets: [start_offset, end_offset)
    end_offset: int
    term_length: int
    # The recording's stop (or recorded) position lies at end_offset: a hole
    # before it is corruption.  False: the recording was active and nothing
    # said how far it got, so a hole is where its data ends.
    end_known: bool
    last: bool  # the recording's last segment

    @property
    def path(self) -> str:
        return os.path.join(self.archive_dir, self.file_name)

    def position(self, file_offset: int) -> int:
        return self.segment_base + file_offset


def _parse_ids(value: str | Iterable[int] | None) -> set[int] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            return {int(part) for part in value.replace(";", ",").split(",") if part.strip()}
        except ValueError:
            raise ValueError(f"recording ids must be integers separated by commas, not {value!r}") from None
    return {int(v) for v in value}


def find_log_segments(
    archive_dirs: Sequence[str | os.PathLike[str]],
    *,
    recording_ids: str | Iterable[int] | None = None,
    from_position: int | None = None,
    to_position: int | None = None,
    stream_id: int = LOG_STREAM_ID,
) -> list[LogSegment]:
    """The segments to decode, in archive, recording and position order.

    By default every valid recording of the log stream; ``recording_ids``
    picks recordings whatever their stream.  Segments wholly outside
    ``[from_position, to_position)`` are left out.
    """
    wanted = _parse_ids(recording_ids)
    segments: list[LogSegment] = []
    for archive in archive_dirs:
        archive_dir = os.path.abspath(os.fspath(archive))
        catalog = Catalog.open_read_only(archive_dir)
        try:
            descriptors = [
                (d, catalog.recorded_position(d.recording_id))
                for d in catalog.recordings()
                if (d.recording_id in wanted if wanted is not None else d.stream_id == stream_id)
            ]
        finally:
            catalog.close()
        if wanted is not None:
            missing = wanted - {d.recording_id for d, _ in descriptors}
            if missing:
                raise ValueError(f"{archive_dir}: no valid recording with id {', '.join(map(str, sorted(missing)))}")
        for descriptor, recorded in descriptors:
            segments.extend(recording_segments(archive_dir, descriptor, recorded, from_position, to_position))
    return segments


def recording_segments(
    archive_dir: str,
    descriptor: RecordingDescriptor,
    recorded_position: int,
    from_position: int | None,
    to_position: int | None,
) -> list[LogSegment]:
    """One recording's segments: up to its stop position, or while it is open
    up to ``recorded_position`` (where its writes are known to have got to;
    below its start: every file there is, a hole ending the data)."""
    start = descriptor.start_position
    term_length = descriptor.term_buffer_length
    segment_length = descriptor.segment_file_length
    if descriptor.stop_position != NULL_POSITION:
        stop, end_known = descriptor.stop_position, True
    elif recorded_position >= start:
        stop, end_known = recorded_position, True
    else:
        stop, end_known = None, False  # active, nothing reported: read every file there is
    if stop is None:
        names = list_segment_files(archive_dir, descriptor.recording_id)
        last_base = (
            segment_base_of_file(names[-1])
            if names
            else segment_file_base_position(start, start, term_length, segment_length)
        )
        limit = last_base + segment_length
    else:
        limit = stop
    segments = []
    base = segment_file_base_position(start, start, term_length, segment_length)
    while base < limit:
        low = max(start, base)
        high = min(limit, base + segment_length)
        outside = (to_position is not None and low >= to_position) or (
            from_position is not None and high <= from_position
        )
        if not outside and high > low:
            segments.append(
                LogSegment(
                    archive_dir=archive_dir,
                    recording_id=descriptor.recording_id,
                    file_name=segment_file_name(descriptor.recording_id, base),
                    segment_base=base,
                    start_offset=low - base,
                    end_offset=high - base,
                    term_length=term_length,
                    end_known=end_known,
                    last=base + segment_length >= limit,
                )
            )
        base += segment_length
    return segments


# --------------------------------------------------------------------------- decoding


@dataclass
class DecodedBatch:
    """Up to BATCH_ROWS decoded messages of one segment (numpy columns)."""

    segment: LogSegment
    columns: dict[str, np.ndarray]
    payload_offsets: np.ndarray  # int32, rows + 1
    payload: bytes

    def __len__(self) -> int:
        return len(self.columns["template_id"])


@dataclass
class CorruptRegion:
    """What PERMISSIVE mode skipped: file offsets [file_offset, resume) of the segment."""

    segment: LogSegment
    file_offset: int
    resume: int
    what: str  # the error and how much was skipped


@dataclass
class DecodeStats:
    messages: int = 0
    padding_frames: int = 0
    corrupt_regions: int = 0
    incomplete_tail: int = 0  # fragmented messages cut off at the end of a recording
    problems: list[str] = field(default_factory=list)


_I64_COLUMNS = ("offset", "next_offset", "leadership_term_id", "cluster_session_id", "correlation_id", "timestamp")
_I32_COLUMNS = ("template_id", "schema_id", "fragments", "code", "time_unit")


class _ColumnBuffers:
    """The numpy arrays and the cffi struct that points at them."""

    def __init__(self, rows: int, payload_capacity: int) -> None:
        self.rows = rows
        self.arrays: dict[str, np.ndarray] = {name: np.empty(rows, np.int64) for name in _I64_COLUMNS}
        self.arrays.update({name: np.empty(rows, np.int32) for name in _I32_COLUMNS})
        self.payload_offsets = np.zeros(rows + 1, np.int32)
        self.struct = ffi.new("fulmar_log_columns *")
        self.struct.capacity = rows
        for name, array in self.arrays.items():
            ctype = "int64_t *" if array.dtype == np.int64 else "int32_t *"
            setattr(self.struct, name, ffi.cast(ctype, array.ctypes.data))
        self.struct.payload_offsets = ffi.cast("int32_t *", self.payload_offsets.ctypes.data)
        self.payload = bytearray()
        self.set_payload_capacity(payload_capacity)

    def set_payload_capacity(self, capacity: int) -> None:
        self.payload = bytearray(capacity)
        self._payload_pointer = ffi.from_buffer(self.payload)  # kept alive with the buffer
        self.struct.payload = self._payload_pointer
        self.struct.payload_capacity = capacity

    def take(self, count: int) -> tuple[dict[str, np.ndarray], np.ndarray, bytes]:
        columns = {name: array[:count].copy() for name, array in self.arrays.items()}
        offsets = self.payload_offsets[: count + 1].copy()
        return columns, offsets, bytes(self.payload[: int(offsets[-1])])


def _open_segment(segment: LogSegment) -> tuple[mmap.mmap | None, int]:
    """The mapped file and its size (None when empty)."""
    try:
        fd = os.open(segment.path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(segment.path) from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None, 0
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ), size
    finally:
        os.close(fd)


def decode_segment(
    segment: LogSegment,
    *,
    permissive: bool = False,
    stats: DecodeStats | None = None,
    batch_rows: int = BATCH_ROWS,
    payload_capacity: int = PAYLOAD_CAPACITY,
) -> Iterator[DecodedBatch | CorruptRegion]:
    """The segment's messages, in batches, in log order (see the module doc for errors)."""
    stats = stats if stats is not None else DecodeStats()

    def corrupt(file_offset: int, reason: str, resume: int) -> CorruptRegion:
        error = LogCorruptError(segment.path, segment.position(file_offset), file_offset, reason)
        if not permissive:
            raise error
        stats.corrupt_regions += 1
        what = f"{error}; skipped {resume - file_offset} bytes"
        if len(stats.problems) < 100:
            stats.problems.append(what)
        return CorruptRegion(segment, file_offset, resume, what)

    try:
        check_term_length(segment.term_length)
    except ValueError as error:
        # A catalog that passed its own checks should never say so; skip the
        # file rather than walk it with an impossible term length.
        yield corrupt(segment.start_offset, f"the catalog's term length is impossible ({error})", segment.end_offset)
        return
    try:
        memory, size = _open_segment(segment)
    except FileNotFoundError:
        yield corrupt(segment.start_offset, "the segment file is missing", segment.end_offset)
        return
    end = segment.end_offset
    if size < end:
        if segment.end_known or size < segment.start_offset:
            # Decode what is there, then report the rest as missing.
            end = max(min(size, end), segment.start_offset)
        else:
            end = size
    buffers = _ColumnBuffers(batch_rows, payload_capacity)
    cursor = ffi.new("fulmar_log_cursor *")
    cursor.offset = segment.start_offset
    pointer = ffi.from_buffer(memory) if memory is not None else ffi.NULL
    try:
        while cursor.offset < end:
            buffers.payload_offsets[0] = 0
            lib.fulmar_log_decode(pointer, end, segment.term_length, buffers.struct, cursor)
            stats.padding_frames += cursor.skipped_pad
            if cursor.count:
                stats.messages += cursor.count
                columns, offsets, payload = buffers.take(cursor.count)
                yield DecodedBatch(segment, columns, offsets, payload)
            status = cursor.status
            at = int(cursor.offset)
            if status == lib.FULMAR_LOG_DONE:
                break
            if status == lib.FULMAR_LOG_FULL:
                if cursor.count == 0:  # one message larger than the payload area
                    capacity = len(buffers.payload) * 2
                    if capacity > PAYLOAD_CAPACITY_MAX:
                        yield corrupt(
                            at, f"a message longer than {PAYLOAD_CAPACITY_MAX} bytes", _next_term(segment, at, end)
                        )
                        cursor.offset = _next_term(segment, at, end)
                        continue
                    buffers.set_payload_capacity(capacity)
                continue
            if status == lib.FULMAR_LOG_HOLE or status == lib.FULMAR_LOG_UNFINISHED:
                # Where an active recording's data ends, or (a message cut off
                # by the stop position) where the recording stopped while the
                # message was being recorded: it cannot have been committed.
                tail = not segment.end_known or (
                    status == lib.FULMAR_LOG_UNFINISHED and segment.last and _frames_reach(memory, at, end)
                )
                if tail:
                    stats.incomplete_tail += status == lib.FULMAR_LOG_UNFINISHED
                    break
                reason = (
                    "a hole (zero frame length) below where the recording stops"
                    if status == lib.FULMAR_LOG_HOLE
                    else _REASONS[status]
                )
                yield corrupt(at, reason, _next_term(segment, at, end))
                cursor.offset = _next_term(segment, at, end)
                continue
            # A malformed frame: skip it when its length can be trusted, else
            # the rest of its term (no frame crosses a term boundary).
            resume = _next_term(segment, at, end)
            if status != lib.FULMAR_LOG_BAD_FRAME and memory is not None:
                frame_length = int.from_bytes(memory[at : at + 4], "little", signed=True)
                if frame_length >= 32:
                    resume = min(at + align(frame_length, FRAME_ALIGNMENT), resume)
            yield corrupt(at, _REASONS.get(status, f"decoder status {status}"), resume)
            cursor.offset = resume
    finally:
        if memory is not None:
            ffi.release(pointer)
            memory.close()
    if end < segment.end_offset and segment.end_known:
        yield corrupt(
            end,
            f"the segment file is short ({size} bytes; the recording goes on to file offset {segment.end_offset})",
            segment.end_offset,
        )


def _next_term(segment: LogSegment, file_offset: int, end: int) -> int:
    return min(end, (file_offset // segment.term_length + 1) * segment.term_length)


def _frames_reach(memory: mmap.mmap | None, at: int, end: int) -> bool:
    """Whether the frames from ``at`` run on to ``end`` with no hole (a few fragments: rare, so in Python)."""
    while memory is not None and at < end:
        frame_length = int.from_bytes(memory[at : at + 4], "little", signed=True)
        if frame_length < 32:
            return False
        at += align(frame_length, FRAME_ALIGNMENT)
    return at == end


# --------------------------------------------------------------------------- to Arrow


def to_record_batch(
    batch: DecodedBatch | CorruptRegion, message_types: frozenset[str] | set[str] | None = None
) -> pa.RecordBatch:
    """The batch (or one Corrupt row) as an Arrow RecordBatch of :data:`COLUMNS`, optionally only some message types."""
    segment = batch.segment
    if isinstance(batch, CorruptRegion):
        if message_types is not None and CORRUPT_TYPE not in message_types:
            return _assemble({}, 0)
        return _assemble(
            {
                "archive_dir": pa.array([segment.archive_dir]),
                "recording_id": pa.array([segment.recording_id], pa.int64()),
                "log_position": pa.array([segment.position(batch.file_offset)], pa.int64()),
                "next_position": pa.array([segment.position(batch.resume)], pa.int64()),
                "message_type": pa.array([CORRUPT_TYPE]),
                "corrupt_record": pa.array([batch.what]),
            },
            1,
        )
    n = len(batch)

    c = batch.columns
    template = c["template_id"]
    in_schema = c["schema_id"] == cluster_codecs.SCHEMA_ID
    type_codes = np.where(in_schema, template, -1)
    names_by_code = {code: _CLUSTER_TEMPLATE_NAMES.get(code, UNKNOWN_TYPE) for code in np.unique(type_codes).tolist()}
    names_by_code[-1] = UNKNOWN_TYPE
    unique = sorted(names_by_code)
    dictionary = pa.array([names_by_code[code] for code in unique])
    message_type = pc.take(dictionary, pa.array(np.searchsorted(unique, type_codes)))

    def where(codes: tuple[int, ...]) -> np.ndarray:
        return in_schema & np.isin(template, codes)

    session_message = cluster_codecs.SessionMessageHeaderDecoder.TEMPLATE_ID
    timer = cluster_codecs.TimerEventDecoder.TEMPLATE_ID
    opened = cluster_codecs.SessionOpenEventDecoder.TEMPLATE_ID
    closed = cluster_codecs.SessionCloseEventDecoder.TEMPLATE_ID
    has_term = where(tuple(LOG_MESSAGE_TYPES))
    session = where((session_message, opened, closed))
    correlated = where((timer, opened))
    new_term = where((cluster_codecs.NewLeadershipTermEventDecoder.TEMPLATE_ID,))
    action = where((cluster_codecs.ClusterActionRequestDecoder.TEMPLATE_ID,))
    close = where((closed,))

    def masked(values: np.ndarray, present: np.ndarray) -> Any:
        return pa.array(values, mask=~present)

    def enum_names(codes: np.ndarray, present: np.ndarray, enum: Any) -> Any:
        # Few rows carry one (a term's first message, a snapshot, a close): a loop is fine.
        if not present.any():
            return pa.nulls(n, pa.string())
        table = {int(member): member.name for member in enum}
        return pa.array(
            [
                table.get(int(code), f"UNKNOWN_{int(code)}") if p else None
                for code, p in zip(codes.tolist(), present.tolist())
            ],
            pa.string(),
        )

    offsets = batch.payload_offsets
    payload = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(batch.payload)])
    base = segment.segment_base
    values = {
        "archive_dir": pc.take(pa.array([segment.archive_dir]), pa.array(np.zeros(n, np.int32))),
        "recording_id": pa.array(np.full(n, segment.recording_id, np.int64)),
        "leadership_term_id": masked(c["leadership_term_id"], has_term),
        "log_position": pa.array(c["offset"] + base),
        "next_position": pa.array(c["next_offset"] + base),
        "message_type": message_type,
        "template_id": pa.array(template),
        "cluster_session_id": masked(c["cluster_session_id"], session),
        "correlation_id": masked(c["correlation_id"], correlated),
        "timestamp": masked(c["timestamp"], has_term),
        "leader_member_id": masked(c["code"], new_term),
        "time_unit": enum_names(c["time_unit"], new_term, cluster_codecs.ClusterTimeUnit),
        "cluster_action": enum_names(c["code"], action, cluster_codecs.ClusterAction),
        "close_reason": enum_names(c["code"], close, cluster_codecs.CloseReason),
        "payload": payload,
        "payload_length": pa.array(np.diff(offsets).astype(np.int32)),
        "fragments": pa.array(c["fragments"]),
        "corrupt_record": pa.nulls(n, pa.string()),
    }
    record_batch = _assemble(values, n)
    if message_types is not None:
        record_batch = record_batch.filter(
            pc.is_in(record_batch.column("message_type"), pa.array(sorted(message_types)))
        )
    return record_batch


def _assemble(values: dict[str, Any], n: int) -> pa.RecordBatch:
    """A RecordBatch of every column (nulls for those not in ``values``)."""
    arrays = []
    for name, kind in COLUMNS:
        arrow_type = _ARROW_TYPES[kind]
        array = values.get(name)
        if array is None:
            array = pa.nulls(n, arrow_type)
        elif array.type != arrow_type:
            array = array.cast(arrow_type)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in COLUMNS])


_ARROW_TYPES = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "binary": pa.binary()}


# --------------------------------------------------------------------------- reading in one process


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, parsed (shared by Spark and :func:`read_log`)."""

    recording_ids: frozenset[int] | None = None  # these recordings instead of the log stream's
    from_position: int | None = None
    to_position: int | None = None
    message_types: frozenset[str] | None = None
    permissive: bool = False

    @classmethod
    def parse(cls, options: dict[str, str]) -> ReadOptions:
        lowered = {key.lower(): value for key, value in options.items()}
        known = {"path", "paths", "recordingids", "fromposition", "toposition", "messagetypes", "mode"}
        unknown = sorted(set(lowered) - known)
        if unknown:
            raise ValueError(
                f"fulmar-log: unknown option(s) {', '.join(unknown)}; known: recordingIds, "
                "fromPosition, toPosition, messageTypes, mode"
            )
        ids = _parse_ids(lowered.get("recordingids"))

        def position(name: str) -> int | None:
            value = lowered.get(name.lower())
            if value is None or value == "":
                return None
            try:
                result = int(value)
            except ValueError:
                raise ValueError(f"fulmar-log: {name} must be an integer log position, not {value!r}") from None
            if result < 0:
                raise ValueError(f"fulmar-log: {name} must not be negative ({result})")
            return result

        types = None
        if lowered.get("messagetypes"):
            types = frozenset(t.strip() for t in lowered["messagetypes"].split(",") if t.strip())
            known_types = set(_CLUSTER_TEMPLATE_NAMES.values()) | {UNKNOWN_TYPE, CORRUPT_TYPE}
            bad = sorted(types - known_types)
            if bad:
                raise ValueError(
                    f"fulmar-log: unknown message type(s) {', '.join(bad)}; the log's types are "
                    + ", ".join(LOG_MESSAGE_TYPES.values())
                )
        mode = lowered.get("mode", "FAILFAST").upper()
        if mode not in ("FAILFAST", "PERMISSIVE"):
            raise ValueError(
                f"fulmar-log: mode must be FAILFAST (an error names the corrupt file and position) "
                f"or PERMISSIVE (corrupt regions are skipped, one corrupt_record row each), not {mode!r}"
            )
        return cls(
            recording_ids=frozenset(ids) if ids is not None else None,
            from_position=position("fromPosition"),
            to_position=position("toPosition"),
            message_types=types,
            permissive=mode == "PERMISSIVE",
        )

    def segments(self, archive_dirs: Sequence[str | os.PathLike[str]]) -> list[LogSegment]:
        return find_log_segments(
            archive_dirs,
            recording_ids=self.recording_ids,
            from_position=self.from_position,
            to_position=self.to_position,
        )

    def record_batches(self, segment: LogSegment, stats: DecodeStats | None = None) -> Iterator[Any]:
        """The segment's Arrow batches after every option is applied (to Corrupt rows too)."""
        for batch in decode_segment(segment, permissive=self.permissive, stats=stats):
            record_batch = to_record_batch(batch, self.message_types)
            if self.from_position is not None or self.to_position is not None:
                positions = record_batch.column("log_position")
                keep = None
                if self.from_position is not None:
                    keep = pc.greater_equal(positions, self.from_position)
                if self.to_position is not None:
                    below = pc.less(positions, self.to_position)
                    keep = below if keep is None else pc.and_(keep, below)
                record_batch = record_batch.filter(keep)
            if record_batch.num_rows:
                yield record_batch


def split_paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Archive directories from a path, a comma-separated list or a sequence."""
    if isinstance(paths, (str, os.PathLike)):
        text = os.fspath(paths)
        items = [p.strip() for p in text.split(",")] if "," in text else [text]
    else:
        items = [os.fspath(p) for p in paths]
    items = [p for p in items if p]
    if not items:
        raise ValueError("fulmar-log: no archive directory given (load(ARCHIVE_DIR))")
    for item in items:
        if not Path(item).is_dir():
            raise ValueError(f"fulmar-log: {item} is not a directory")
    return items


def read_log(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    options: dict[str, str] | None = None,
    stats: DecodeStats | None = None,
) -> Iterator[Any]:
    """Every Arrow batch the data source would give, read sequentially in this process."""
    parsed = ReadOptions.parse(options or {})
    for segment in parsed.segments(split_paths(paths)):
        yield from parsed.record_batches(segment, stats)
