"""Rebuilding ``recording.log`` from the log recording in the node's archive.

The recording log says which archive recording holds the cluster's log and
where each leadership term begins.  If it is lost or damaged (truncated to
nothing, a garbage entry cut away as a torn tail), the consensus module
refuses to start rather than begin an empty log beside the recorded one
(:func:`unknown_log_recordings`).  The log recording itself still says where
every term began: each term starts with a NewLeadershipTermEvent carrying its
leadership term id, base log position and timestamp.
:func:`rebuild_recording_log` reads those events from the segment files and
writes a recording log with one TERM entry per term; the damaged file is kept
beside it.  The rebuilt log names no snapshots, so the next start replays the
whole recording, which must therefore begin at position 0.

Offline only: the consensus module must be stopped (the archive may run; its
files are only read).
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from fulmar.archive.catalog import Catalog, RecordingDescriptor
from fulmar.archive.errors import ArchiveError
from fulmar.archive.protocol import NULL_POSITION
from fulmar.archive.segment import SegmentReader
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.recording_log import RECORDING_LOG_FILE_NAME, RecordingLog
from fulmar.errors import CodecError, FulmarError
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH, FrameType, align

_LENGTH_FLAGS_TYPE = struct.Struct("<ixBH")
_UNFRAGMENTED = 0xC0  # BEGIN | END
_DATA = int(FrameType.DATA)
_READ_LENGTH = 1024 * 1024


class RecordingLogRebuildError(FulmarError):
    """The recording log cannot be rebuilt; the message says why and what to do instead."""


@dataclass(frozen=True)
class RebuiltTerm:
    leadership_term_id: int
    term_base_log_position: int
    timestamp: int


@dataclass(frozen=True)
class RebuildResult:
    recording_id: int
    stop_position: int
    terms: list[RebuiltTerm]
    kept_damaged_file: Path | None  # where the old recording.log was moved, if there was one


def log_recordings(descriptors: list[RecordingDescriptor], log_stream_id: int) -> list[RecordingDescriptor]:
    """The valid recordings of the log stream that hold any of it."""
    return [
        d
        for d in descriptors
        if d.stream_id == log_stream_id and (d.stop_position == NULL_POSITION or d.stop_position > d.start_position)
    ]


def unknown_log_recording_message(
    recording_log_path: Path, recording: RecordingDescriptor, stop_position: int, repaired: str | None
) -> str:
    """Why a consensus module with no TERM entry refuses to start beside a recorded log, and the repair."""
    note = f" ({repaired})" if repaired else ""
    return (
        f"{recording_log_path} has no leadership term entry{note}, but the archive holds log recording "
        f"{recording.recording_id} (stream {recording.stream_id}, positions {recording.start_position}.."
        f"{stop_position}): the recording log was truncated or damaged, and starting would begin an empty log "
        f"without the committed entries of that recording.  Repair, with this consensus module stopped: "
        f"cluster-tool cluster rebuild-recording-log --dir {recording_log_path.parent} --archive-dir <archive dir>"
        f" (or, in a cluster of several members, wipe this member's archive and cluster directories so it "
        f"catches up from the leader)"
    )


def read_term_starts(archive_dir: Path, descriptor: RecordingDescriptor) -> list[RebuiltTerm]:
    """Every NewLeadershipTermEvent in the recording, in log order."""
    terms: list[RebuiltTerm] = []
    with SegmentReader(archive_dir, descriptor, descriptor.start_position) as reader:
        while reader.position < descriptor.stop_position:
            block_position = reader.position
            block = bytes(reader.read(descriptor.stop_position, _READ_LENGTH))
            if not block:
                break
            offset = 0
            while offset < len(block):
                frame_length, flags, frame_type = _LENGTH_FLAGS_TYPE.unpack_from(block, offset)
                if frame_type == _DATA and flags & _UNFRAGMENTED == _UNFRAGMENTED:
                    term = _term_start(block, offset, frame_length, block_position + offset)
                    if term is not None:
                        terms.append(term)
                offset += align(frame_length, FRAME_ALIGNMENT)
    return terms


def _term_start(block: bytes, offset: int, frame_length: int, position: int) -> RebuiltTerm | None:
    start, length = offset + HEADER_LENGTH, frame_length - HEADER_LENGTH
    if length < 8:
        return None
    try:
        header = codecs.read_header(block, start, length)
        if header.template_id != codecs.NewLeadershipTermEventEncoder.TEMPLATE_ID:
            return None
        message = codecs.decode(block, start, length)
    except CodecError as error:
        raise RecordingLogRebuildError(f"the log message at position {position} does not decode: {error}") from None
    assert isinstance(message, codecs.NewLeadershipTermEventDecoder)
    return RebuiltTerm(message.leadership_term_id, message.term_base_log_position, message.timestamp)


def rebuild_recording_log(
    cluster_dir: Path, archive_dir: Path, log_stream_id: int, recording_id: int | None = None
) -> RebuildResult:
    """Write ``cluster_dir/recording.log`` anew from the archive's log recording (see the module doc)."""
    try:
        catalog = Catalog.open_read_only(archive_dir)
    except (ArchiveError, OSError) as error:
        raise RecordingLogRebuildError(f"cannot read the archive catalog in {archive_dir}: {error}") from None
    try:
        found = log_recordings(catalog.recordings(), log_stream_id)
    finally:
        catalog.close()
    if recording_id is not None:
        found = [d for d in found if d.recording_id == recording_id]
    if len(found) != 1:
        names = ", ".join(str(d.recording_id) for d in found) or "none"
        raise RecordingLogRebuildError(
            f"{archive_dir}: expected one recording of log stream {log_stream_id}, found {names}"
            + (" (choose one with --recording-id)" if len(found) > 1 else "")
        )
    descriptor = found[0]
    if descriptor.stop_position == NULL_POSITION:
        raise RecordingLogRebuildError(
            f"log recording {descriptor.recording_id} in {archive_dir} is still open: start the archive once "
            f"(it recovers the recording's end) and stop the consensus module, then rebuild"
        )
    if descriptor.start_position != 0:
        raise RecordingLogRebuildError(
            f"log recording {descriptor.recording_id} starts at position {descriptor.start_position}, not 0: "
            f"the state before it is in a snapshot a rebuilt recording log cannot name; restore recording.log "
            f"from a backup, or wipe this member so it catches up from the cluster"
        )
    try:
        terms = read_term_starts(archive_dir, descriptor)
    except ArchiveError as error:
        raise RecordingLogRebuildError(
            f"cannot read log recording {descriptor.recording_id}: {error}; the log itself is damaged"
        ) from None
    if not terms or terms[0].term_base_log_position != descriptor.start_position:
        raise RecordingLogRebuildError(
            f"log recording {descriptor.recording_id} does not begin with a NewLeadershipTermEvent at position "
            f"{descriptor.start_position}: it is not a cluster log"
        )
    path = cluster_dir / RECORDING_LOG_FILE_NAME
    kept: Path | None = None
    if path.exists():
        kept = path.with_name(f"{RECORDING_LOG_FILE_NAME}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        os.rename(path, kept)
    with RecordingLog.open(cluster_dir) as recording_log:
        for term in terms:
            recording_log.append_term(
                descriptor.recording_id, term.leadership_term_id, term.term_base_log_position, term.timestamp
            )
    return RebuildResult(descriptor.recording_id, descriptor.stop_position, terms, kept)
