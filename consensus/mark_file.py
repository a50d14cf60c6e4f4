"""Cluster mark files: ``cluster-mark.dat`` and ``cluster-mark-service-<id>.dat``.

Each cluster component guards its directory with one of these files, laid out as
Aeron Cluster's ``ClusterMarkFile`` (SBE ``MarkFileHeader``, schema 110 version 2):

* offset 0: the 8-byte SBE message header (block 128, template 200, schema 110,
  version 2), then the 128-byte ``MarkFileHeader`` block and six var-ASCII
  strings. Offsets in the file: version i32 @8 (written last, as the ready
  signal), componentType @12, activityTimestamp i64 @16 (proof of life),
  startTimestamp @24, pid @32, candidateTermId @40, archiveStreamId @48,
  serviceStreamId @52, consensusModuleStreamId @56, ingressStreamId @60,
  memberId @64, serviceId @68, headerLength @72, errorBufferLength @76,
  clusterId @80. Files of Aeron versions before the message header was added
  have the body at offset 0; they are read (and reclaimed) too.
* offset ``HEADER_LENGTH`` (8 KiB): the error buffer, a distinct error log
  (``fulmar.error_log``) of ``error_buffer_length`` bytes (at least 1 MiB).

The consensus module (and a cluster backup or standby) owns ``cluster-mark.dat``;
clustered service ``n`` owns ``cluster-mark-service-n.dat`` in the same directory.

A new component refuses to start while the file says a live one owns it: a fresh
activity timestamp (within ``liveness_timeout_ms``) *and* a pid that exists. A
stale, dead, truncated or corrupt file is reclaimed. A well-formed file left by a
component of another type, or by a different major file version, is refused as
Aeron refuses it. A clean close writes activity timestamp 0 so the next start
need not wait out the liveness timeout.

The candidate term id (the term this member last voted in) survives restarts:
:meth:`ClusterMarkFile.create` carries it over from a well-formed previous file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple

import psutil

from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.codecs.generated.cluster_mark import (
    SCHEMA_ID,
    ClusterComponentType,
    MarkFileHeaderDecoder,
    MarkFileHeaderEncoder,
)
from fulmar.error_log import CorruptErrorLogError, DistinctErrorLog, EpochClock, ErrorObservation, read_error_log
from fulmar.errors import CodecError, FulmarError
from fulmar.semantic_version import compose_version, major_version

__all__ = [
    "FILENAME",
    "SERVICE_FILENAME_PREFIX",
    "FILE_EXTENSION",
    "HEADER_LENGTH",
    "MESSAGE_HEADER_LENGTH",
    "ERROR_BUFFER_MIN_LENGTH",
    "ERROR_BUFFER_MAX_LENGTH",
    "LIVENESS_TIMEOUT_MS_DEFAULT",
    "SEMANTIC_VERSION",
    "VERSION_FAILED",
    "NULL_VALUE",
    "ClusterComponentType",
    "ClusterMarkFile",
    "ClusterMarkFileContents",
    "ClusterMarkFileError",
    "ClusterMarkFileActiveError",
    "CorruptClusterMarkFileError",
    "mark_file_name",
    "service_mark_file_name",
    "read_cluster_mark_file",
    "live_owner_pid",
    "read_liveness",
    "MarkFileLiveness",
]

FILE_EXTENSION: Final = ".dat"
FILENAME: Final = "cluster-mark" + FILE_EXTENSION
SERVICE_FILENAME_PREFIX: Final = "cluster-mark-service-"
HEADER_LENGTH: Final = 8 * 1024
MESSAGE_HEADER_LENGTH: Final = 8  # the SBE message header in front of the body
ERROR_BUFFER_MIN_LENGTH: Final = 1024 * 1024
ERROR_BUFFER_MAX_LENGTH: Final = 2**31 - 1 - HEADER_LENGTH
LIVENESS_TIMEOUT_MS_DEFAULT: Final = 10_000
NULL_VALUE: Final = -1  # Aeron's NULL_VALUE: "no candidate term", "no member id", the consensus module's service id


MAJOR_VERSION: Final = 0
SEMANTIC_VERSION: Final = compose_version(MAJOR_VERSION, 3, 0)  # 0.3.0, Aeron's current cluster mark file
VERSION_FAILED: Final = -1  # written instead of the version when the component failed to start

# Offsets of the words other processes read or write while the file is in use, relative to the body.
_VERSION_OFFSET: Final = 0
_ACTIVITY_TIMESTAMP_OFFSET: Final = 8
_CANDIDATE_TERM_ID_OFFSET: Final = 32
_MEMBER_ID_OFFSET: Final = 56
_CLUSTER_ID_OFFSET: Final = 72
_MESSAGE_HEADER = struct.Struct("<HHHH")
_LIVENESS = struct.Struct("<iiqqq")  # version, componentType, activityTimestamp, startTimestamp, pid

_VALID_COMPONENT_TYPES: Final = frozenset(
    int(t) for t in ClusterComponentType if t is not ClusterComponentType.NULL_VAL
)


# ------------------------------------------------------------------------- errors


class ClusterMarkFileError(FulmarError):
    """A cluster mark file cannot be created, claimed or read."""


class ClusterMarkFileActiveError(ClusterMarkFileError):
    """Another live process owns the mark file (its activity timestamp is fresh and its pid exists)."""

    def __init__(self, path: str, pid: int, activity_age_ms: int) -> None:
        super().__init__(
            f"cluster directory is in use: {path} belongs to live pid {pid} (last activity {activity_age_ms} ms ago)"
        )
        self.path = path
        self.pid = pid
        self.activity_age_ms = activity_age_ms


class CorruptClusterMarkFileError(ClusterMarkFileError, CodecError):
    """The file is truncated or holds bytes no cluster component writes; the message says what is wrong."""


# -------------------------------------------------------------------------- names


def service_mark_file_name(service_id: int) -> str:
    """``cluster-mark-service-<id>.dat``, the mark file of clustered service ``service_id``."""
    if service_id < 0:
        raise ValueError(f"service id {service_id} must not be negative")
    return f"{SERVICE_FILENAME_PREFIX}{service_id}{FILE_EXTENSION}"


def mark_file_name(component_type: ClusterComponentType, service_id: int | None = None) -> str:
    """The file a component owns: services have one each, every other component owns ``cluster-mark.dat``."""
    if component_type == ClusterComponentType.CONTAINER:
        if service_id is None:
            raise ValueError("a clustered service (CONTAINER) mark file needs a service id")
        return service_mark_file_name(service_id)
    if int(component_type) not in _VALID_COMPONENT_TYPES or component_type == ClusterComponentType.UNKNOWN:
        raise ValueError(f"{component_type!r} is not a component type that owns a mark file")
    if service_id is not None:
        raise ValueError(f"only a clustered service (CONTAINER) has a service id, not {component_type.name}")
    return FILENAME


# --------------------------------------------------------------------- decoding


def _body_offset(prefix: bytes | bytearray | memoryview) -> int:
    """Where the MarkFileHeader body starts: after the message header if one is there."""
    if len(prefix) >= MESSAGE_HEADER_LENGTH:
        _block, template_id, schema_id, _version = _MESSAGE_HEADER.unpack_from(prefix, 0)
        if template_id == MarkFileHeaderDecoder.TEMPLATE_ID and schema_id == SCHEMA_ID:
            return MESSAGE_HEADER_LENGTH
    return 0


def _decode_header(path: Path, header: bytes, file_length: int) -> MarkFileHeaderDecoder:
    """Decode and sanity-check a mark file's header region; CorruptClusterMarkFileError says what is wrong."""
    if file_length < HEADER_LENGTH:
        raise CorruptClusterMarkFileError(
            f"{path}: truncated mark file: {file_length} bytes, shorter than the {HEADER_LENGTH}-byte header"
        )
    try:
        if _body_offset(header):
            decoder = MarkFileHeaderDecoder().wrap_and_apply_header(header, 0, HEADER_LENGTH)
        else:
            # No message header: the layout of older Aeron versions, body at 0, read at the current version.
            decoder = MarkFileHeaderDecoder().wrap(header, 0, length=HEADER_LENGTH)
    except CodecError as ex:
        raise CorruptClusterMarkFileError(f"{path}: mark file header does not decode: {ex}") from ex
    if decoder.component_type_raw not in _VALID_COMPONENT_TYPES:
        raise CorruptClusterMarkFileError(
            f"{path}: corrupt mark file: component type {decoder.component_type_raw} is not a ClusterComponentType"
        )
    if decoder.header_length != HEADER_LENGTH:
        raise CorruptClusterMarkFileError(
            f"{path}: corrupt mark file: headerLength {decoder.header_length}, expected {HEADER_LENGTH}"
        )
    expected_length = HEADER_LENGTH + decoder.error_buffer_length
    if decoder.error_buffer_length < 0 or expected_length != file_length:
        raise CorruptClusterMarkFileError(
            f"{path}: corrupt or truncated mark file: {file_length} bytes, but headerLength {decoder.header_length}"
            f" + errorBufferLength {decoder.error_buffer_length} = {expected_length}"
        )
    return decoder


def _read_header_region(path: Path) -> tuple[bytes, int]:
    try:
        with open(path, "rb") as f:
            file_length = os.fstat(f.fileno()).st_size
            return f.read(HEADER_LENGTH), file_length
    except OSError as ex:
        raise ClusterMarkFileError(f"{path}: cannot read the mark file: {ex}") from ex


def _read_errors(path: Path, decoder: MarkFileHeaderDecoder) -> list[ErrorObservation]:
    """The error log of a decoded file; CorruptErrorLogError if a record is impossible.

    Read, not mapped: a new owner recreates the file (truncated, then
    zero-filled) while others may be reading it, and a mapping of a file cut
    short under it faults the reader (SIGBUS) where a read returns short."""
    length = decoder.error_buffer_length
    if length <= 0:
        return []
    with open(path, "rb") as f:
        f.seek(decoder.header_length)
        data = bytearray(f.read(length))
    if len(data) < length:  # cut short since it was measured (a new owner is recreating it)
        raise CorruptErrorLogError(f"error buffer is {len(data)} bytes, the header says {length}")
    buffer = AtomicBuffer(data, 0, length)
    try:
        return list(read_error_log(buffer))
    finally:
        buffer.release()


class MarkFileLiveness(NamedTuple):
    """The words at the head of a mark file that say whether its owner is up:
    read alone, without the header's strings or the error log, so a process
    can ask often and a file being recreated reads as not there."""

    version: int
    component_type: int
    activity_timestamp: int  # epoch ms; 0 after a clean close
    start_timestamp: int
    pid: int

    @property
    def is_ready(self) -> bool:
        """The owner signalled that it started (see :attr:`ClusterMarkFileContents.is_ready`)."""
        return self.version not in (0, VERSION_FAILED)

    def is_active(self, now_ms: int, liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS_DEFAULT) -> bool:
        """A live process owns the file (its pid exists, its timestamp is fresh)."""
        return _is_live(self.activity_timestamp, self.pid, now_ms, liveness_timeout_ms)


def read_liveness(path: str | os.PathLike[str]) -> MarkFileLiveness | None:
    """The liveness words of the mark file at ``path``, reading only its first
    bytes; None if there is no readable mark file (missing, or shorter than
    those words, as while its owner recreates it)."""
    try:
        with open(path, "rb") as f:
            prefix = f.read(MESSAGE_HEADER_LENGTH + _LIVENESS.size)
    except OSError:
        return None
    offset = _body_offset(prefix)
    if len(prefix) < offset + _LIVENESS.size:
        return None
    return MarkFileLiveness(*_LIVENESS.unpack_from(prefix, offset))


def read_activity_timestamp(path: str | os.PathLike[str]) -> int | None:
    """The activity timestamp (epoch ms) in the mark file at ``path``: 0 after
    a clean close, None if there is no readable mark file.  Reads the first
    bytes only, so a consensus module can ask every second."""
    liveness = read_liveness(path)
    return None if liveness is None else liveness.activity_timestamp


def live_owner_pid(
    path: str | os.PathLike[str], now_ms: int, liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS_DEFAULT
) -> int | None:
    """The pid of the live process that owns the mark file at ``path`` (the
    test :meth:`ClusterMarkFile.create` refuses on), or None: no file, a
    clean close, a dead pid or a stale timestamp.  Reads the first bytes only."""
    liveness = read_liveness(path)
    return liveness.pid if liveness is not None and liveness.is_active(now_ms, liveness_timeout_ms) else None


def _is_live(activity_ms: int, pid: int, now_ms: int, liveness_timeout_ms: int) -> bool:
    # A garbage pid (a torn file) can exceed what the OS takes: such a pid is nobody.
    return activity_ms > 0 and now_ms - activity_ms < liveness_timeout_ms and 0 < pid < 2**31 and psutil.pid_exists(pid)


@dataclass
class ClusterMarkFileContents:
    """A mark file as a tool sees it: the decoded header and the distinct errors recorded in it."""

    path: Path
    header: MarkFileHeaderDecoder
    errors: list[ErrorObservation] = field(default_factory=list)
    has_message_header: bool = True

    @property
    def component_type(self) -> ClusterComponentType:
        return self.header.component_type

    @property
    def is_ready(self) -> bool:
        """The component signalled that it started (a version other than 0 and the failed-start marker)."""
        return self.header.version not in (0, VERSION_FAILED)

    @property
    def failed_start(self) -> bool:
        return self.header.version == VERSION_FAILED

    def is_active(self, now_ms: int, liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS_DEFAULT) -> bool:
        """True if a live process owns the file: the test :meth:`ClusterMarkFile.create` refuses on."""
        return _is_live(self.header.activity_timestamp, self.header.pid, now_ms, liveness_timeout_ms)


def read_cluster_mark_file(path: str | os.PathLike[str]) -> ClusterMarkFileContents:
    """Read a cluster mark file without claiming it (for tools).

    ``path`` is the file, or a directory holding ``cluster-mark.dat``. A truncated
    or corrupt file raises :class:`CorruptClusterMarkFileError` naming the problem.
    """
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    header, file_length = _read_header_region(path)
    decoder = _decode_header(path, header, file_length)
    try:
        errors = _read_errors(path, decoder)
    except CorruptErrorLogError as ex:
        raise CorruptClusterMarkFileError(f"{path}: corrupt error log in the mark file: {ex}") from ex
    except OSError as ex:
        raise ClusterMarkFileError(f"{path}: cannot read the mark file's error log: {ex}") from ex
    return ClusterMarkFileContents(path, decoder, errors, bool(_body_offset(header)))


# ------------------------------------------------------------------ the owner


@dataclass
class _Previous:
    """What a new owner keeps from the file it replaces."""

    candidate_term_id: int = NULL_VALUE
    errors: list[ErrorObservation] = field(default_factory=list)
    reclaimed_reason: str | None = None


def _check_previous(
    path: Path, component_type: ClusterComponentType, now_ms: int, liveness_timeout_ms: int
) -> _Previous:
    """Raise if a live or incompatible component owns ``path``; else say what to carry over."""
    header, file_length = _read_header_region(path)
    offset = _body_offset(header)
    if len(header) >= offset + _LIVENESS.size:
        _version, _type, activity_ms, _start_ms, pid = _LIVENESS.unpack_from(header, offset)
        if _is_live(activity_ms, pid, now_ms, liveness_timeout_ms):
            raise ClusterMarkFileActiveError(str(path), pid, now_ms - activity_ms)

    try:
        decoder = _decode_header(path, header, file_length)
    except CorruptClusterMarkFileError as ex:
        # Nothing to protect: whoever wrote it is gone, and nothing in it can be trusted.
        return _Previous(reclaimed_reason=str(ex))

    existing_type = decoder.component_type_raw
    if (
        existing_type != ClusterComponentType.UNKNOWN
        and existing_type != component_type
        and not (
            existing_type == ClusterComponentType.BACKUP and component_type == ClusterComponentType.CONSENSUS_MODULE
        )
    ):
        raise ClusterMarkFileError(
            f"{path}: the mark file belongs to a {ClusterComponentType(existing_type).name}, "
            f"not a {component_type.name}"
        )
    version = decoder.version
    if version not in (0, VERSION_FAILED) and major_version(version) != MAJOR_VERSION:
        raise ClusterMarkFileError(
            f"{path}: mark file major version {major_version(version)} does not match this software's {MAJOR_VERSION}"
        )
    try:
        errors = _read_errors(path, decoder)
    except (CorruptErrorLogError, OSError):
        errors = []
    return _Previous(candidate_term_id=decoder.candidate_term_id, errors=errors)


class ClusterMarkFile:
    """An open, owned cluster mark file. Create it with :meth:`create`."""

    def __init__(
        self,
        mapped: MappedFile,
        component_type: ClusterComponentType,
        error_buffer_length: int,
        previous: _Previous,
    ) -> None:
        self.path = mapped.path
        self.component_type = component_type
        self._mapped = mapped
        self._header = mapped.buffer(0, HEADER_LENGTH)
        self._error_buffer = mapped.buffer(HEADER_LENGTH, error_buffer_length)
        self._error_log: DistinctErrorLog | None = None
        self.previous_errors = previous.errors
        """Errors the previous owner left in the file (read before it was rewritten)."""
        self.reclaimed_reason = previous.reclaimed_reason
        """Why the previous file was unreadable and replaced wholesale (None if it was fine or absent)."""

    @classmethod
    def create(
        cls,
        cluster_dir: str | os.PathLike[str],
        component_type: ClusterComponentType,
        *,
        service_id: int | None = None,
        pid: int,
        member_id: int,
        cluster_id: int = 0,
        archive_stream_id: int = 10,
        service_stream_id: int = 104,
        consensus_module_stream_id: int = 105,
        ingress_stream_id: int = NULL_VALUE,
        aeron_directory: str = "",
        control_channel: str = "",
        ingress_channel: str = "",
        service_name: str = "",
        authenticator: str = "",
        services_cluster_dir: str = "",
        now_ms: int,
        liveness_timeout_ms: int = LIVENESS_TIMEOUT_MS_DEFAULT,
        error_buffer_length: int = ERROR_BUFFER_MIN_LENGTH,
    ) -> ClusterMarkFile:
        """Claim the component's mark file in ``cluster_dir``: refuse if a live process owns it, else (re)write it.

        ``service_id`` is given for a clustered service (CONTAINER) only; the file is then
        ``cluster-mark-service-<id>.dat``, otherwise ``cluster-mark.dat`` with service id -1.
        The file is not ready until :meth:`signal_ready` writes the version.
        """
        component_type = ClusterComponentType(component_type)
        name = mark_file_name(component_type, service_id)
        if not ERROR_BUFFER_MIN_LENGTH <= error_buffer_length <= ERROR_BUFFER_MAX_LENGTH:
            raise ValueError(
                f"error buffer length {error_buffer_length} outside [{ERROR_BUFFER_MIN_LENGTH}, {ERROR_BUFFER_MAX_LENGTH}]"
            )
        path = Path(cluster_dir) / name
        strings = (aeron_directory, control_channel, ingress_channel, service_name, authenticator, services_cluster_dir)
        needed = MESSAGE_HEADER_LENGTH + MarkFileHeaderEncoder.BLOCK_LENGTH + sum(4 + len(s) for s in strings)
        if needed > HEADER_LENGTH:
            # Checked before the file is touched, so a refused start leaves it as it was.
            raise ClusterMarkFileError(
                f"{path}: the channels and names do not fit the {HEADER_LENGTH}-byte header ({needed} bytes)"
            )
        for s in strings:
            if not s.isascii():
                raise ClusterMarkFileError(f"{path}: {s!r} is not US-ASCII, which the mark file header requires")

        previous = _Previous()
        if path.exists():
            previous = _check_previous(path, component_type, now_ms, liveness_timeout_ms)

        mapped = MappedFile.create(path, HEADER_LENGTH + error_buffer_length)
        try:
            header = mapped.buffer(0, HEADER_LENGTH)
            MarkFileHeaderEncoder.encode(
                header.view,
                0,
                version=0,  # not ready yet: signal_ready() writes it last
                component_type=component_type,
                activity_timestamp=now_ms,
                start_timestamp=now_ms,
                pid=pid,
                candidate_term_id=previous.candidate_term_id,
                archive_stream_id=archive_stream_id,
                service_stream_id=service_stream_id,
                consensus_module_stream_id=consensus_module_stream_id,
                ingress_stream_id=ingress_stream_id,
                member_id=member_id,
                service_id=NULL_VALUE if service_id is None else service_id,
                header_length=HEADER_LENGTH,
                error_buffer_length=error_buffer_length,
                cluster_id=cluster_id,
                aeron_directory=aeron_directory,
                control_channel=control_channel,
                ingress_channel=ingress_channel,
                service_name=service_name,
                authenticator=authenticator,
                services_cluster_dir=services_cluster_dir,
            )
            return cls(mapped, component_type, error_buffer_length, previous)
        except BaseException:
            mapped.close()
            raise

    # ----------------------------------------------------------------- running

    @property
    def closed(self) -> bool:
        return self._mapped.closed

    def signal_ready(self) -> None:
        """Publish the version, which readers take as "the component is up" (Aeron's signalReady)."""
        if not self.closed:
            self._header.put_int32_ordered(MESSAGE_HEADER_LENGTH + _VERSION_OFFSET, SEMANTIC_VERSION)

    def signal_failed_start(self) -> None:
        """Mark the file as left by a component that could not start (version -1)."""
        if not self.closed:
            self._header.put_int32_ordered(MESSAGE_HEADER_LENGTH + _VERSION_OFFSET, VERSION_FAILED)

    def update_activity_timestamp(self, now_ms: int) -> None:
        """Proof of life; call well within the liveness timeout (Aeron: about every second)."""
        if not self.closed:
            self._header.put_int64_ordered(MESSAGE_HEADER_LENGTH + _ACTIVITY_TIMESTAMP_OFFSET, now_ms)

    def activity_timestamp(self) -> int:
        if self.closed:
            return NULL_VALUE
        return self._header.get_int64_volatile(MESSAGE_HEADER_LENGTH + _ACTIVITY_TIMESTAMP_OFFSET)

    @property
    def candidate_term_id(self) -> int:
        """The term this member last voted in during an election, or -1 if it has not voted."""
        if self.closed:
            return NULL_VALUE
        return self._header.get_int64_volatile(MESSAGE_HEADER_LENGTH + _CANDIDATE_TERM_ID_OFFSET)

    @candidate_term_id.setter
    def candidate_term_id(self, candidate_term_id: int) -> None:
        """Record a vote durably (the file is synced) so it survives a crash and restart."""
        if self.closed:
            raise ClusterMarkFileError(f"{self.path}: cannot record candidate term {candidate_term_id}: file is closed")
        self._header.put_int64_ordered(MESSAGE_HEADER_LENGTH + _CANDIDATE_TERM_ID_OFFSET, candidate_term_id)
        self.force()

    @property
    def member_id(self) -> int:
        if self.closed:
            return NULL_VALUE
        return self._header.get_int32_volatile(MESSAGE_HEADER_LENGTH + _MEMBER_ID_OFFSET)

    @member_id.setter
    def member_id(self, member_id: int) -> None:
        """Set once a member id is known (Aeron: after a dynamic join)."""
        if not self.closed:
            self._header.put_int32_ordered(MESSAGE_HEADER_LENGTH + _MEMBER_ID_OFFSET, member_id)

    @property
    def cluster_id(self) -> int:
        if self.closed:
            return NULL_VALUE
        return self._header.get_int32_volatile(MESSAGE_HEADER_LENGTH + _CLUSTER_ID_OFFSET)

    def decoder(self) -> MarkFileHeaderDecoder:
        """The header as it is now (a snapshot)."""
        if self.closed:
            raise ClusterMarkFileError(f"{self.path}: the mark file is closed")
        return MarkFileHeaderDecoder().wrap_and_apply_header(bytes(self._header.view), 0)

    @property
    def error_buffer(self) -> AtomicBuffer:
        return self._error_buffer

    def error_log(self, clock: EpochClock) -> DistinctErrorLog:
        """The component's distinct error log in the file's error buffer (one writer per file)."""
        if self._error_log is None:
            self._error_log = DistinctErrorLog(self._error_buffer, clock)
        return self._error_log

    def force(self) -> None:
        """Write the file's dirty pages to disk; on Linux fsync covers stores made through the mapping."""
        if self.closed:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap, leaving the file; activity 0 tells the next owner nobody holds the directory."""
        if self.closed:
            return
        self._header.put_int64_ordered(MESSAGE_HEADER_LENGTH + _ACTIVITY_TIMESTAMP_OFFSET, 0)
        self._error_log = None
        self._mapped.close()

    def __enter__(self) -> ClusterMarkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterMarkFile({str(self.path)!r}, {self.component_type.name}, closed={self.closed})"
