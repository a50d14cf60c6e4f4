"""Encoders of what the consensus module sends: log messages (seed 004),
service control messages to the services, and egress events to clients.
Each method returns what the publication returned: a position on success,
a negative code (back pressure, not connected) to retry later."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.protocol import session_message_frame
from fulmar.frames import FRAME_ALIGNMENT, align
from fulmar.frames import HEADER_LENGTH as DATA_HEADER_LENGTH
from fulmar.log_writer import ADMIN_ACTION

if TYPE_CHECKING:
    from fulmar.publication import ExclusivePublication, Publication

SESSION_HEADER_LENGTH = codecs.HEADER_LENGTH + codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH
# A NewLeadershipTermEvent's frame in the log: the data header, the message, aligned.
_NEW_LEADERSHIP_TERM_EVENT_FRAME_LENGTH = align(
    DATA_HEADER_LENGTH + codecs.HEADER_LENGTH + codecs.NewLeadershipTermEventEncoder.BLOCK_LENGTH, FRAME_ALIGNMENT
)


class _Encoding:
    def __init__(self) -> None:
        self._buffer = bytearray(64 * 1024)

    def encode(self, encoder: Any, **fields: Any) -> bytes:
        length = encoder.encode(self._buffer, 0, **fields)
        return bytes(self._buffer[:length])


def _offer(publication: Publication, message: bytes) -> int:
    result = publication.offer(message)
    if result == ADMIN_ACTION:
        result = publication.offer(message)
    return int(result)


class LogPublisher(_Encoding):
    """Appends to the log publication (leader only): an exclusive one, as the leader is its only writer."""

    def __init__(self) -> None:
        super().__init__()
        self.publication: ExclusivePublication | None = None

    @property
    def position(self) -> int:
        assert self.publication is not None
        return self.publication.position

    def append_message(
        self, leadership_term_id: int, cluster_session_id: int, timestamp: int, payload: memoryview | bytes
    ) -> int:
        assert self.publication is not None
        # One bytes object: the publication's native fast path takes it whole.
        message = session_message_frame(leadership_term_id, cluster_session_id, timestamp) + payload
        result = self.publication.offer(message)
        if result == ADMIN_ACTION:
            result = self.publication.offer(message)
        return int(result)

    def append_block(self, block: bytes, lengths: array[int]) -> int:
        """Append messages laid end to end in ``block`` (their lengths in
        ``lengths``), each its own frame, in one native call (which moves to
        the next term itself when one fills); how many were appended, in
        order: the rest met back pressure."""
        assert self.publication is not None
        appended, _result = self.publication.offer_block(block, lengths)
        return appended

    def append(self, encoder: Any, **fields: Any) -> int:
        assert self.publication is not None
        return _offer(self.publication, self.encode(encoder, **fields))

    def append_session_open(self, leadership_term_id: int, session: Any, timestamp: int) -> int:
        return self.append(
            codecs.SessionOpenEventEncoder,
            leadership_term_id=leadership_term_id,
            correlation_id=session.correlation_id,
            cluster_session_id=session.id,
            timestamp=timestamp,
            response_stream_id=session.response_stream_id,
            response_channel=session.response_channel,
            encoded_principal=session.encoded_principal,
        )

    def append_session_close(self, leadership_term_id: int, session_id: int, reason: int, timestamp: int) -> int:
        return self.append(
            codecs.SessionCloseEventEncoder,
            leadership_term_id=leadership_term_id,
            cluster_session_id=session_id,
            timestamp=timestamp,
            close_reason=reason,
        )

    def append_timer(self, leadership_term_id: int, correlation_id: int, timestamp: int) -> int:
        return self.append(
            codecs.TimerEventEncoder,
            leadership_term_id=leadership_term_id,
            correlation_id=correlation_id,
            timestamp=timestamp,
        )

    def append_cluster_action(
        self, leadership_term_id: int, timestamp: int, action: int, flags: int = 0
    ) -> tuple[int, int]:
        """Append a ClusterActionRequest whose logPosition is the end of its own
        frame (where a snapshot is taken); returns (result, that position).
        ``flags`` is CLUSTER_ACTION_FLAGS_DEFAULT, or for a SNAPSHOT that only
        standby members take, CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT."""
        assert self.publication is not None
        frame_length = (32 + codecs.HEADER_LENGTH + codecs.ClusterActionRequestEncoder.BLOCK_LENGTH + 31) & ~31
        position = self.publication.position
        term_length = self.publication.term_buffer_length
        if (position & (term_length - 1)) + frame_length > term_length:
            position = (position | (term_length - 1)) + 1  # the frame goes to the next term
        log_position = position + frame_length
        result = self.append(
            codecs.ClusterActionRequestEncoder,
            leadership_term_id=leadership_term_id,
            log_position=log_position,
            timestamp=timestamp,
            action=action,
            flags=flags,
        )
        return result, log_position

    def append_new_leadership_term(
        self,
        leadership_term_id: int,
        timestamp: int,
        term_base_log_position: int,
        leader_member_id: int,
        log_session_id: int,
        app_version: int,
    ) -> int:
        """The event that opens a term.  Its ``logPosition`` is where the log
        stands once the event is in it, as Aeron's LogPublisher writes it (the
        publication's position plus the event's aligned frame)."""
        return self.append(
            codecs.NewLeadershipTermEventEncoder,
            leadership_term_id=leadership_term_id,
            log_position=self.position + _NEW_LEADERSHIP_TERM_EVENT_FRAME_LENGTH,
            timestamp=timestamp,
            term_base_log_position=term_base_log_position,
            leader_member_id=leader_member_id,
            log_session_id=log_session_id,
            time_unit=int(protocol.ClusterTimeUnit.MILLIS),
            app_version=app_version,
        )


class ServiceProxy(_Encoding):
    """Consensus module -> services (stream 104)."""

    def __init__(self, publication: Publication) -> None:
        super().__init__()
        self.publication = publication

    def join_log(
        self,
        log_position: int,
        max_log_position: int,
        member_id: int,
        log_session_id: int,
        log_stream_id: int,
        is_startup: bool,
        role: int,
        channel: str,
    ) -> int:
        return _offer(
            self.publication,
            self.encode(
                codecs.JoinLogEncoder,
                log_position=log_position,
                max_log_position=max_log_position,
                member_id=member_id,
                log_session_id=log_session_id,
                log_stream_id=log_stream_id,
                is_startup=1 if is_startup else 0,
                role=role,
                log_channel=channel,
            ),
        )

    def termination_position(self, log_position: int) -> int:
        return _offer(
            self.publication, self.encode(codecs.ServiceTerminationPositionEncoder, log_position=log_position)
        )


class EgressPublisher(_Encoding):
    """Consensus module -> a client (its egress)."""

    def session_event(
        self,
        publication: Publication,
        cluster_session_id: int,
        correlation_id: int,
        leadership_term_id: int,
        leader_member_id: int,
        code: int,
        detail: str,
    ) -> bool:
        return (
            _offer(
                publication,
                self.encode(
                    codecs.SessionEventEncoder,
                    cluster_session_id=cluster_session_id,
                    correlation_id=correlation_id,
                    leadership_term_id=leadership_term_id,
                    leader_member_id=leader_member_id,
                    code=code,
                    version=protocol.PROTOCOL_SEMANTIC_VERSION,
                    detail=detail[:1000],
                ),
            )
            > 0
        )

    def challenge(
        self, publication: Publication, correlation_id: int, cluster_session_id: int, encoded_challenge: bytes
    ) -> bool:
        return (
            _offer(
                publication,
                self.encode(
                    codecs.ChallengeEncoder,
                    correlation_id=correlation_id,
                    cluster_session_id=cluster_session_id,
                    encoded_challenge=encoded_challenge,
                ),
            )
            > 0
        )

    def admin_response(
        self,
        publication: Publication,
        cluster_session_id: int,
        correlation_id: int,
        request_type: int,
        response_code: int,
        message: str,
    ) -> bool:
        return (
            _offer(
                publication,
                self.encode(
                    codecs.AdminResponseEncoder,
                    cluster_session_id=cluster_session_id,
                    correlation_id=correlation_id,
                    request_type=request_type,
                    response_code=response_code,
                    message=message,
                    payload=b"",
                ),
            )
            > 0
        )

    # The answers to the tools that are not members (a backup's BackupQuery, a
    # HeartbeatRequest) go back on the session's response publication too, as
    # Aeron's ConsensusPublisher sends them on the session's.

    def backup_response(
        self,
        publication: Publication,
        correlation_id: int,
        log_recording_id: int,
        log_leadership_term_id: int,
        log_term_base_log_position: int,
        last_leadership_term_id: int,
        last_term_base_log_position: int,
        commit_position_counter_id: int,
        leader_member_id: int,
        member_id: int,
        snapshots: Sequence[Mapping[str, int]],
        cluster_members: str,
    ) -> bool:
        return (
            _offer(
                publication,
                self.encode(
                    codecs.BackupResponseEncoder,
                    correlation_id=correlation_id,
                    log_recording_id=log_recording_id,
                    log_leadership_term_id=log_leadership_term_id,
                    log_term_base_log_position=log_term_base_log_position,
                    last_leadership_term_id=last_leadership_term_id,
                    last_term_base_log_position=last_term_base_log_position,
                    commit_position_counter_id=commit_position_counter_id,
                    leader_member_id=leader_member_id,
                    member_id=member_id,
                    snapshots=snapshots,
                    cluster_members=cluster_members,
                ),
            )
            > 0
        )

    def heartbeat_response(self, publication: Publication, correlation_id: int) -> bool:
        return _offer(publication, self.encode(codecs.HeartbeatResponseEncoder, correlation_id=correlation_id)) > 0
