"""Snapshots as archive recordings, shared by the consensus module and the
service container (protocol plumbing, not either one's state).

A snapshot is a stream of messages on the snapshot channel (``aeron:ipc?alias=
snapshot``, stream 107) between two SnapshotMarker messages (BEGIN, END),
recorded by the node's archive; the recording id goes into the recording
log.  Loading replays the recording and hands back its messages.

The consensus module's snapshot (type id 1) holds a ConsensusModule record,
a ClusterActionRequest SUSPEND if the module was suspended, then a
ClusterSession per open session and a Timer per timer; a service's
(type id 2) holds a ClientSession per session, then the user's messages.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fulmar.archive.client import AeronArchive, RecordingSignal, SourceLocation
from fulmar.channel_uri import ChannelUri
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.errors import FulmarError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED

if TYPE_CHECKING:
    from fulmar.aeron import Aeron

CONSENSUS_MODULE_SNAPSHOT_TYPE_ID = 1
SERVICE_SNAPSHOT_TYPE_ID = 2
SNAPSHOT_TIMEOUT_S = 30.0


class SnapshotError(FulmarError):
    """A snapshot could not be written, or the one to load is missing or malformed."""


class SnapshotWriter:
    """Publishes one snapshot, recorded by the archive; ``close`` returns the recording id."""

    def __init__(
        self,
        aeron: Aeron,
        archive: AeronArchive,
        channel: str = protocol.SNAPSHOT_CHANNEL,
        stream_id: int = protocol.SNAPSHOT_STREAM_ID,
    ) -> None:
        self.aeron = aeron
        self.archive = archive
        self.publication = aeron.add_exclusive_publication(channel, stream_id)
        recorded = ChannelUri.parse(channel).with_param("session-id", self.publication.session_id)
        self._subscription_id = archive.start_recording(str(recorded), stream_id, SourceLocation.LOCAL, auto_stop=True)
        signal = archive.wait_for_signal(
            lambda s: s.signal == RecordingSignal.START and s.subscription_id == self._subscription_id,
            int(SNAPSHOT_TIMEOUT_S * 1e9),
        )
        self.recording_id = signal.recording_id
        self._buffer = bytearray(64 * 1024)

    @property
    def max_message_length(self) -> int:
        return self.publication.max_message_length

    def offer(self, message: bytes | bytearray | memoryview) -> None:
        """Append one message, waiting out back pressure (bounded)."""
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
        while True:
            result = self.publication.offer(message)
            if result > 0:
                return
            if result not in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION):
                raise SnapshotError(f"the snapshot publication refused a message ({result})")
            if time.monotonic() > deadline:
                raise SnapshotError("the snapshot made no progress for 30 s")
            if result != ADMIN_ACTION:
                self.aeron.do_work()

    def encode(self, encoder: Any, **fields: Any) -> None:
        length = encoder.encode(self._buffer, 0, **fields)
        self.offer(bytes(self._buffer[:length]))

    def marker(
        self, type_id: int, log_position: int, leadership_term_id: int, mark: codecs.SnapshotMark, app_version: int = 0
    ) -> None:
        self.encode(
            codecs.SnapshotMarkerEncoder,
            type_id=type_id,
            log_position=log_position,
            leadership_term_id=leadership_term_id,
            index=0,
            mark=int(mark),
            time_unit=int(protocol.ClusterTimeUnit.MILLIS),
            app_version=app_version,
        )

    def close(self) -> int:
        """Wait until the archive has it all, stop the recording; the recording id."""
        end = self.publication.position
        deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
        while self.archive.get_recording_position(self.recording_id) < end:
            if time.monotonic() > deadline:
                raise SnapshotError(f"the archive did not record the snapshot to {end} in time")
            time.sleep(0.0005)
        self.archive.stop_recording_subscription(self._subscription_id)
        self.publication.close()
        return self.recording_id


def read_snapshot(
    aeron: Aeron,
    archive: AeronArchive,
    recording_id: int,
    replay_channel: str = protocol.REPLAY_CHANNEL,
    replay_stream_id: int = protocol.REPLAY_STREAM_ID,
) -> list[bytes]:
    """Every message of a snapshot recording, in order (markers included)."""
    stop = archive.get_stop_position(recording_id)
    if stop < 0:
        raise SnapshotError(f"snapshot recording {recording_id} is not complete (it is still being recorded)")
    start = archive.get_start_position(recording_id)
    subscription = archive.replay(recording_id, replay_channel, replay_stream_id, start, stop - start)
    messages: list[bytes] = []
    assembler = FragmentAssembler(
        lambda buffer, offset, length, header: messages.append(bytes(buffer[offset : offset + length]))
    )
    deadline = time.monotonic() + SNAPSHOT_TIMEOUT_S
    invoker = not aeron.context.use_conductor_thread
    # The image is held once it comes: the archive closes the replay when it
    # has sent the last message, and once that is read the driver may take the
    # image out of the subscription before this loop looks at it again, so
    # completion is its position, not its presence.
    image = None
    try:
        while True:
            if invoker:
                aeron.do_work()  # the replay's image arrives through the client conductor
            if image is None and subscription.images:
                image = subscription.images[0]
            if image is not None and image.position >= stop:
                break
            if image is not None and image.is_closed:
                raise SnapshotError(
                    f"the replay of snapshot recording {recording_id} ended at position {image.position}, "
                    f"before its stop position {stop}"
                )
            if not subscription.poll(assembler.on_fragment, 256):
                if time.monotonic() > deadline:
                    raise SnapshotError(
                        f"the replay of snapshot recording {recording_id} did not complete in "
                        f"{SNAPSHOT_TIMEOUT_S:.0f} s (at position "
                        f"{'none: no image came' if image is None else image.position} of {stop})"
                    )
                time.sleep(0.0002)
    finally:
        subscription.close()
    return messages


def decode_snapshot(messages: list[bytes], type_id: int) -> Iterator[Any]:
    """The decoded records between the BEGIN and END markers of ``type_id``
    (undecodable messages come out as raw bytes: a service's own data)."""
    if not messages:
        raise SnapshotError("the snapshot is empty")
    begin = _marker(messages[0])
    if begin is None or begin.mark_raw != codecs.SnapshotMark.BEGIN or begin.type_id != type_id:
        raise SnapshotError(f"the snapshot does not start with a BEGIN marker of type {type_id}")
    end = _marker(messages[-1])
    if end is None or end.mark_raw != codecs.SnapshotMark.END:
        raise SnapshotError("the snapshot does not end with an END marker: it is incomplete")
    yield begin
    for message in messages[1:-1]:
        try:
            yield codecs.decode(message)
        except CodecError:
            yield message


def _marker(message: bytes) -> Any:
    try:
        decoded = codecs.decode(message)
    except CodecError:
        return None
    return decoded if isinstance(decoded, codecs.SnapshotMarkerDecoder) else None


def take_consensus_module_snapshot(agent: Any, log_position: int) -> int:
    """Write the consensus module's state at ``log_position``; the recording id."""
    from fulmar.consensus.states import ConsensusModuleState

    writer = SnapshotWriter(
        agent.aeron, agent.archive, agent.context.snapshot_channel, agent.context.snapshot_stream_id
    )
    try:
        writer.marker(
            CONSENSUS_MODULE_SNAPSHOT_TYPE_ID,
            log_position,
            agent.leadership_term_id,
            codecs.SnapshotMark.BEGIN,
            agent.context.app_version,
        )
        writer.encode(
            codecs.ConsensusModuleEncoder,
            next_session_id=agent.next_session_id,
            next_service_session_id=agent.next_service_session_id,
            log_service_session_id=agent.log_service_session_id,
            pending_message_capacity=0,
        )
        if agent.running_state is ConsensusModuleState.SUSPENDED:
            # Aeron snapshots only an ACTIVE module, so its ConsensusModule record
            # has no state; fulmar also snapshots a suspended one (a SIGTERM).  The
            # suspension is kept as the log keeps it, a ClusterActionRequest
            # SUSPEND (at the snapshot's position): a message Aeron's snapshot
            # loader skips, and one whose absence means ACTIVE (older snapshots).
            writer.encode(
                codecs.ClusterActionRequestEncoder,
                leadership_term_id=agent.leadership_term_id,
                log_position=log_position,
                timestamp=agent.cluster_time(),
                action=int(codecs.ClusterAction.SUSPEND),
                flags=0,
            )
        for session in sorted(agent.sessions.values(), key=lambda s: s.id):
            writer.encode(
                codecs.ClusterSessionEncoder,
                cluster_session_id=session.id,
                correlation_id=session.correlation_id,
                opened_log_position=session.opened_log_position,
                time_of_last_activity=agent.cluster_time(),
                close_reason=0,
                response_stream_id=session.response_stream_id,
                response_channel=session.response_channel,
            )
        for correlation_id, deadline in agent.timers.timers():
            writer.encode(codecs.TimerEncoder, correlation_id=correlation_id, deadline=deadline)
        writer.marker(
            CONSENSUS_MODULE_SNAPSHOT_TYPE_ID,
            log_position,
            agent.leadership_term_id,
            codecs.SnapshotMark.END,
            agent.context.app_version,
        )
        return writer.close()
    except BaseException:
        writer.publication.close()
        raise
