"""``archive-mark.dat``: marks a directory as owned by a running archive.

Layout (Aeron's ``ArchiveMarkFile``, schema id 100 version 2, since Aeron 1.47):

* offset 0: the 8-byte SBE message header (template 200, schema 100), then the
  ``MarkFileHeader`` body, a 128-byte block plus four var-ASCII channels:
  version i32 @8 (written last, as the ready signal), activityTimestamp i64 @16
  (proof of life, refreshed by the running archive), startTimestamp @24, pid @32,
  stream ids, headerLength @52 (= 8 KiB), errorBufferLength @56, archiveId @64.
  Files written before 1.47 have no message header: the body starts at 0.
* offset ``HEADER_LENGTH`` (8 KiB): the error buffer, a distinct error log
  (``fulmar.error_log``), ``error_buffer_length`` bytes (Aeron default 1 MiB).

A new archive refuses to start while the file says another archive is alive: a
fresh activity timestamp (within ``liveness_timeout_ms``) *and* a pid that exists.
A clean close writes activity timestamp 0, so the next start need not wait out the
timeout (Aeron just leaves the last timestamp, which is stale after 10 s).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import psutil

from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.codecs.generated.archive_mark import (
    SCHEMA_ID,
    SCHEMA_VERSION,
    MarkFileHeaderDecoder,
    MarkFileHeaderEncoder,
)
from fulmar.error_log import CorruptErrorLogError, DistinctErrorLog, EpochClock, ErrorObservation, read_error_log
from fulmar.errors import CodecError

from .catalog import CATALOG_VERSION
from .errors import ArchiveAlreadyActiveError, ArchiveError

MARK_FILE_NAME = "archive-mark.dat"
HEADER_LENGTH = 8 * 1024
MESSAGE_HEADER_LENGTH = 8  # the SBE message header in front of the body (Aeron >= 1.47)
ERROR_BUFFER_LENGTH_DEFAULT = 1024 * 1024
LIVENESS_TIMEOUT_MS_DEFAULT = 10_000
# The archive's semantic version (ArchiveMarkFile.SEMANTIC_VERSION = 3.1.0), shared with the catalog.
SEMANTIC_VERSION = CATALOG_VERSION

# Offsets of the words other processes read, relative to the body.
_VERSION_OFFSET = 0
_ACTIVITY_TIMESTAMP_OFFSET = 8
_PID_OFFSET = 24
_ARCHIVE_ID_OFFSET = 56
_MESSAGE_HEADER = struct.Struct("<HHHH")
_LIVENESS = struct.Struct("<i4xqqq")  # version, activityTimestamp, startTimestamp, pid


def _body_offset(prefix: bytes) -> int:
    """Where the MarkFileHeader body starts: after a message header if one is there."""
    if len(prefix) >= MESSAGE_HEADER_LENGTH:
        _block, template_id, schema_id, _version = _MESSAGE_HEADER.unpack_from(prefix, 0)
        if template_id == MarkFileHeaderDecoder.TEMPLATE_ID and schema_id == SCHEMA_ID:
            return MESSAGE_HEADER_LENGTH
    return 0


class ArchiveMarkFile:
    """An open, owned mark file. Create it with :meth:`create`."""

    def __init__(self, mapped: MappedFile, error_buffer_length: int, previous_errors: list[ErrorObservation]) -> None:
        self.path = mapped.path
        self._mapped = mapped
        self._header = mapped.buffer(0, HEADER_LENGTH)
        self._error_buffer = mapped.buffer(HEADER_LENGTH, error_buffer_length)
        self._error_log: DistinctErrorLog | None = None
        self.previous_errors = previous_errors
        """Errors the previous archive left in the file (read before it was rewritten)."""

    @classmethod
    def create(
        cls,
        archive_dir: str | os.PathLike[str],
        *,
        pid: int,
        archive_id: int,
        control_channel: str,
        control_stream_id: int,
        local_control_channel: str,
        local_control_stream_id: int,
        events_channel: str,
        events_stream_id: int,
        aeron_directory: str,
        now_ms: int,
        liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS_DEFAULT,
        error_buffer_length: int = ERROR_BUFFER_LENGTH_DEFAULT,
    ) -> ArchiveMarkFile:
        """Claim the directory: refuse if a live archive owns it, else (re)write the mark file.

        The file is not ready until :meth:`signal_ready` writes the version.
        """
        if error_buffer_length <= 0 or error_buffer_length % 8:
            raise ValueError(f"error buffer length {error_buffer_length} must be a positive multiple of 8")
        path = Path(archive_dir) / MARK_FILE_NAME
        channels = (control_channel, local_control_channel, events_channel, aeron_directory)
        needed = MESSAGE_HEADER_LENGTH + MarkFileHeaderEncoder.BLOCK_LENGTH + sum(4 + len(c) for c in channels)
        if needed > HEADER_LENGTH:
            # Checked before the file is touched, so a refused start leaves it as it was.
            raise ArchiveError(f"{path}: the channels do not fit the {HEADER_LENGTH}-byte header ({needed} bytes)")
        previous_errors: list[ErrorObservation] = []
        if path.exists():
            previous_errors = _check_not_active(path, now_ms, liveness_timeout_ms)

        mapped = MappedFile.create(path, HEADER_LENGTH + error_buffer_length)
        try:
            header = mapped.buffer(0, HEADER_LENGTH)
            try:
                MarkFileHeaderEncoder.encode(
                    header.view,
                    0,
                    version=0,  # not ready yet: signal_ready() writes it last
                    codec_schema_version=SCHEMA_VERSION,
                    codec_block_length=MarkFileHeaderEncoder.BLOCK_LENGTH,
                    activity_timestamp=now_ms,
                    start_timestamp=now_ms,
                    pid=pid,
                    control_stream_id=control_stream_id,
                    local_control_stream_id=local_control_stream_id,
                    events_stream_id=events_stream_id,
                    header_length=HEADER_LENGTH,
                    error_buffer_length=error_buffer_length,
                    archive_id=archive_id,
                    control_channel=control_channel,
                    local_control_channel=local_control_channel,
                    events_channel=events_channel,
                    aeron_directory=aeron_directory,
                )
            except CodecError as ex:
                raise ArchiveError(f"{path}: the channels do not fit the {HEADER_LENGTH}-byte header: {ex}") from ex
            return cls(mapped, error_buffer_length, previous_errors)
        except BaseException:
            mapped.close()
            raise

    # ----------------------------------------------------------------- running

    def signal_ready(self) -> None:
        """Publish the version, which readers take as "the archive is up" (Aeron's signalReady)."""
        self._header.put_int32_ordered(MESSAGE_HEADER_LENGTH + _VERSION_OFFSET, SEMANTIC_VERSION)

    def set_archive_id(self, archive_id: int) -> None:
        """Name the archive once it is known (by default its driver client id,
        which exists only after the catalog was verified and the driver joined)."""
        self._header.put_int64_ordered(MESSAGE_HEADER_LENGTH + _ARCHIVE_ID_OFFSET, archive_id)

    def update_activity_timestamp(self, now_ms: int) -> None:
        """Proof of life; call at least every second or so (well within the liveness timeout)."""
        if not self._mapped.closed:
            self._header.put_int64_ordered(MESSAGE_HEADER_LENGTH + _ACTIVITY_TIMESTAMP_OFFSET, now_ms)

    def activity_timestamp(self) -> int:
        return self._header.get_int64_volatile(MESSAGE_HEADER_LENGTH + _ACTIVITY_TIMESTAMP_OFFSET)

    def decoder(self) -> MarkFileHeaderDecoder:
        """The header as it is now (a snapshot)."""
        return MarkFileHeaderDecoder().wrap_and_apply_header(self._header.view, 0)

    @property
    def error_buffer(self) -> AtomicBuffer:
        return self._error_buffer

    def error_log(self, clock: EpochClock) -> DistinctErrorLog:
        """The archive's distinct error log, in the file's error buffer (one writer per file)."""
        if self._error_log is None:
            self._error_log = DistinctErrorLog(self._error_buffer, clock)
        return self._error_log

    def force(self) -> None:
        """Write the file's dirty pages to disk (Aeron's ArchiveMarkFile.force); fsync covers mmap'd stores."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap, leaving the file; activity 0 tells the next archive nobody owns the directory."""
        if self._mapped.closed:
            return
        self._header.put_int64_ordered(MESSAGE_HEADER_LENGTH + _ACTIVITY_TIMESTAMP_OFFSET, 0)
        self._mapped.close()

    def __enter__(self) -> ArchiveMarkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_mark_file(archive_dir: str | os.PathLike[str]) -> MarkFileHeaderDecoder:
    """Decode an existing mark file's header (for tools), with or without Aeron's message header."""
    path = Path(archive_dir) / MARK_FILE_NAME
    with open(path, "rb") as file:  # the header only, not the error buffer behind it
        data = file.read(HEADER_LENGTH)
    try:
        if _body_offset(data):
            return MarkFileHeaderDecoder().wrap_and_apply_header(data, 0)
        # Pre-1.47 layout: no message header, version 1 block (Aeron reads it so too).
        return MarkFileHeaderDecoder().wrap(data, 0, MarkFileHeaderDecoder.BLOCK_LENGTH, 1)
    except CodecError as ex:
        raise ArchiveError(f"{path}: mark file header does not decode: {ex}") from ex


def live_owner_pid(
    archive_dir: str | os.PathLike[str], now_ms: int, liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS_DEFAULT
) -> int | None:
    """The pid of the live archive that owns ``archive_dir``'s mark file (the
    test a new archive refuses to start on), or None.  Reads the first bytes only."""
    try:
        with open(Path(archive_dir) / MARK_FILE_NAME, "rb") as f:
            prefix = f.read(MESSAGE_HEADER_LENGTH + MarkFileHeaderDecoder.BLOCK_LENGTH)
    except OSError:
        return None
    offset = _body_offset(prefix)
    if len(prefix) < offset + _LIVENESS.size:
        return None
    _version, activity_ms, _start_ms, pid = _LIVENESS.unpack_from(prefix, offset)
    return int(pid) if _is_live(activity_ms, pid, now_ms, liveness_timeout_ms) else None


def _is_live(activity_ms: int, pid: int, now_ms: int, liveness_timeout_ms: int) -> bool:
    # A garbage pid (a torn file) can exceed what the OS takes: such a pid is nobody.
    return activity_ms > 0 and now_ms - activity_ms < liveness_timeout_ms and 0 < pid < 2**31 and psutil.pid_exists(pid)


def _check_not_active(path: Path, now_ms: int, liveness_timeout_ms: int) -> list[ErrorObservation]:
    """Raise if the mark file belongs to a live archive; else return the errors it holds."""
    with open(path, "rb") as f:
        prefix = f.read(MESSAGE_HEADER_LENGTH + MarkFileHeaderDecoder.BLOCK_LENGTH)
    offset = _body_offset(prefix)
    if len(prefix) < offset + _LIVENESS.size:
        return []  # too short to have been written by an archive: nothing to protect
    _version, activity_ms, _start_ms, pid = _LIVENESS.unpack_from(prefix, offset)
    if _is_live(activity_ms, pid, now_ms, liveness_timeout_ms):
        raise ArchiveAlreadyActiveError(str(path), pid, now_ms - activity_ms)
    # A dead archive of another major version is not refused here: the mark file is
    # simply replaced, and the catalog's own version check reports a needed migration.
    return _read_previous_errors(path)


def _read_previous_errors(path: Path) -> list[ErrorObservation]:
    try:
        decoder = read_mark_file(path.parent)
    except ArchiveError:
        return []
    length = decoder.error_buffer_length
    start = decoder.header_length
    if length <= 0 or start <= 0:
        return []
    try:
        mapped = MappedFile.open(path)
    except (OSError, ValueError):
        return []
    try:
        if start + length > mapped.length:
            return []
        return list(read_error_log(mapped.buffer(start, length)))
    except CorruptErrorLogError:
        return []
    finally:
        mapped.close()
