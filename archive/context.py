"""Configuration of an archive process (Aeron's ``Archive.Context``, trimmed to
what fulmar's archive uses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fulmar.archive import protocol
from fulmar.security import Authenticator, NullAuthenticator

DEFAULT_SEGMENT_FILE_LENGTH = 128 * 1024 * 1024


@dataclass
class ArchiveContext:
    archive_dir: Path = Path("archive")
    driver_dir: Path | None = None  # default: fulmar.driver.context.default_driver_dir()
    # Control requests: a UDP channel for remote clients and an IPC one for
    # local clients (both on the same stream id, as in Aeron).
    control_channel: str | None = protocol.CONTROL_CHANNEL  # None: local control only
    control_stream_id: int = protocol.CONTROL_STREAM_ID
    local_control_channel: str = protocol.LOCAL_CONTROL_CHANNEL
    local_control_stream_id: int = protocol.CONTROL_STREAM_ID
    # Recording events (RecordingStarted/Progress/Stopped) for observers; None disables them.
    recording_events_channel: str | None = None
    recording_events_stream_id: int = protocol.RECORDING_EVENTS_STREAM_ID
    # Where this archive receives replicated streams (the port is chosen by the OS).
    replication_channel: str = protocol.REPLICATION_CHANNEL
    archive_id: int = -1  # -1: derived from the Aeron client id at start
    segment_file_length: int = DEFAULT_SEGMENT_FILE_LENGTH
    # 0: leave it to the OS; 1: fdatasync segments after each write; 2: fsync
    # (data and metadata).  The catalog follows catalog_file_sync_level.
    file_sync_level: int = 0
    catalog_file_sync_level: int = 0
    # Aeron's record/replay checksum: the CRC-32 of each recorded DATA frame's
    # payload goes into the frame's session id field of the recorded copy and
    # is verified on crash recovery (record_checksum) and before each replayed
    # frame is sent (replay_checksum).  Off here as in Aeron's Archive.Context;
    # ``cluster-node archive`` turns both on.
    record_checksum: bool = False
    replay_checksum: bool = False
    max_concurrent_recordings: int = 20
    max_concurrent_replays: int = 20
    connect_timeout_ns: int = 5_000_000_000
    replay_linger_timeout_ns: int = 5_000_000_000
    mark_file_update_interval_ms: int = 1_000
    mark_file_liveness_timeout_ms: int = 10_000
    # The most bytes one recording or replay moves per duty cycle.
    block_length: int = 1024 * 1024
    # Longest sleep between duty cycles (woken sooner by data, commands and
    # the recorder thread; its periodic work, the mark file and the driver's
    # keepalive, is in seconds); shorter while replays or replications wait on
    # back pressure or files, and while a control session connects or is held
    # back, none of which rings a doorbell.
    idle_max_wait_ns: int = 100_000_000
    busy_idle_max_wait_ns: int = 200_000
    pending_idle_max_wait_ns: int = 10_000_000
    # Blocks of live recordings are written by a native thread that the
    # recorded stream wakes, not by the agent (archive/recorder.py).  Off: the
    # agent writes them, woken by the stream like by any other.
    native_recorder: bool = True
    delete_archive_dir: bool = False
    # Who may open a control session (Aeron's authenticatorSupplier): the
    # default lets everyone in; ``cluster-node archive --authenticator-secret``
    # sets a fulmar.security.CredentialsAuthenticator.  Sessions that come over
    # the local control channel, when it is IPC, are not asked unless
    # ``authenticate_local_control``: only a process that can map the node's
    # driver files (owner-only shared memory) can reach that channel at all,
    # and the node's own processes use it.
    authenticator: Authenticator = field(default_factory=NullAuthenticator)
    authenticate_local_control: bool = False
    # What this archive presents to a source archive when it replicates from
    # it and the ReplicateRequest carried no credentials of its own (Aeron's
    # archiveClientContext credentials); the members of a cluster share one
    # secret, so ``cluster-node archive`` presents its own.
    replication_credentials: bytes = b""

    def validate(self) -> None:
        if self.file_sync_level not in (0, 1, 2) or self.catalog_file_sync_level not in (0, 1, 2):
            raise ValueError("file sync levels are 0 (none), 1 (data) or 2 (data and metadata)")
        if self.catalog_file_sync_level < self.file_sync_level:
            raise ValueError("the catalog's file sync level must be at least the segments' level")
        length = self.segment_file_length
        if length <= 0 or length & (length - 1):
            raise ValueError(f"segment file length {length} must be a power of two")
        if self.block_length < 64 * 1024:
            raise ValueError(f"block length {self.block_length} must be at least 64 KiB (an MTU and then some)")
