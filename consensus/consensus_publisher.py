"""Encoders of the consensus stream (stream 108): what one member sends to
another during elections and while the cluster runs (seed 001, seed 000).

``ConsensusPublisher`` only encodes.  It is given, per member id, a
publication-like object with ``offer(bytes) -> int`` (the real
``Publication`` to that member's consensus endpoint, or a simulated link in
tests).  Each method returns True when the message was offered and False on
back pressure or when the destination is not connected: the caller decides
whether to retry on its next duty cycle.

With a ``signer`` (``fulmar.consensus.member_auth.MemberSigner``: the
cluster has a secret) each message leaves with the member trailer that
proves a member sent it, appended here once for every message type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol

# AppendPosition.flags bit set while a follower catches up (seed 001).
APPEND_POSITION_FLAG_NONE = 0
APPEND_POSITION_FLAG_CATCHUP = 1

# The consensus protocol version carried by CanvassPosition/RequestVote (Aeron's 1.0.0).
CONSENSUS_PROTOCOL_VERSION = protocol.compose_version(1, 0, 0)

_ADMIN_ACTION = -3  # the publication asks for a retry of the same offer


class Offerable(Protocol):
    """The part of a publication the publisher uses."""

    def offer(self, buffer: bytes) -> int: ...


class ConsensusPublisher:
    """Encodes consensus messages onto the publication of the destination member."""

    def __init__(self, publications: Mapping[int, Offerable], signer: Any = None) -> None:
        self.publications = publications
        self.signer = signer
        self._buffer = bytearray(4096)

    def _send(self, to_member_id: int, encoder: Any, **fields: Any) -> bool:
        publication = self.publications.get(to_member_id)
        if publication is None:
            return False
        length = encoder.encode(self._buffer, 0, **fields)
        message = bytes(self._buffer[:length])
        if self.signer is not None:
            message = self.signer.sign(message, to_member_id)
        result = publication.offer(message)
        if result == _ADMIN_ACTION:
            result = publication.offer(message)
        return result > 0

    def canvass_position(
        self,
        to_member_id: int,
        *,
        log_leadership_term_id: int,
        log_position: int,
        leadership_term_id: int,
        follower_member_id: int,
    ) -> bool:
        return self._send(
            to_member_id,
            codecs.CanvassPositionEncoder,
            log_leadership_term_id=log_leadership_term_id,
            log_position=log_position,
            leadership_term_id=leadership_term_id,
            follower_member_id=follower_member_id,
            protocol_version=CONSENSUS_PROTOCOL_VERSION,
        )

    def request_vote(
        self,
        to_member_id: int,
        *,
        log_leadership_term_id: int,
        log_position: int,
        candidate_term_id: int,
        candidate_member_id: int,
    ) -> bool:
        return self._send(
            to_member_id,
            codecs.RequestVoteEncoder,
            log_leadership_term_id=log_leadership_term_id,
            log_position=log_position,
            candidate_term_id=candidate_term_id,
            candidate_member_id=candidate_member_id,
            protocol_version=CONSENSUS_PROTOCOL_VERSION,
        )

    def place_vote(
        self,
        to_member_id: int,
        *,
        candidate_term_id: int,
        log_leadership_term_id: int,
        log_position: int,
        candidate_member_id: int,
        follower_member_id: int,
        vote: bool,
    ) -> bool:
        return self._send(
            to_member_id,
            codecs.VoteEncoder,
            candidate_term_id=candidate_term_id,
            log_leadership_term_id=log_leadership_term_id,
            log_position=log_position,
            candidate_member_id=candidate_member_id,
            follower_member_id=follower_member_id,
            vote=int(codecs.BooleanType.TRUE if vote else codecs.BooleanType.FALSE),
        )

    def new_leadership_term(
        self,
        to_member_id: int,
        *,
        log_leadership_term_id: int,
        next_leadership_term_id: int,
        next_term_base_log_position: int,
        next_log_position: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        leader_recording_id: int,
        timestamp: int,
        leader_member_id: int,
        log_session_id: int,
        app_version: int,
        is_startup: bool,
    ) -> bool:
        return self._send(
            to_member_id,
            codecs.NewLeadershipTermEncoder,
            log_leadership_term_id=log_leadership_term_id,
            next_leadership_term_id=next_leadership_term_id,
            next_term_base_log_position=next_term_base_log_position,
            next_log_position=next_log_position,
            leadership_term_id=leadership_term_id,
            term_base_log_position=term_base_log_position,
            log_position=log_position,
            leader_recording_id=leader_recording_id,
            timestamp=timestamp,
            leader_member_id=leader_member_id,
            log_session_id=log_session_id,
            app_version=app_version,
            is_startup=int(codecs.BooleanType.TRUE if is_startup else codecs.BooleanType.FALSE),
        )

    def append_position(
        self,
        to_member_id: int,
        *,
        leadership_term_id: int,
        log_position: int,
        follower_member_id: int,
        flags: int = APPEND_POSITION_FLAG_NONE,
    ) -> bool:
        return self._send(
            to_member_id,
            codecs.AppendPositionEncoder,
            leadership_term_id=leadership_term_id,
            log_position=log_position,
            follower_member_id=follower_member_id,
            flags=flags,
        )

    def commit_position(
        self, to_member_id: int, *, leadership_term_id: int, log_position: int, leader_member_id: int
    ) -> bool:
        return self._send(
            to_member_id,
            codecs.CommitPositionEncoder,
            leadership_term_id=leadership_term_id,
            log_position=log_position,
            leader_member_id=leader_member_id,
        )

    def catchup_position(
        self,
        to_member_id: int,
        *,
        leadership_term_id: int,
        log_position: int,
        follower_member_id: int,
        catchup_endpoint: str,
    ) -> bool:
        return self._send(
            to_member_id,
            codecs.CatchupPositionEncoder,
            leadership_term_id=leadership_term_id,
            log_position=log_position,
            follower_member_id=follower_member_id,
            catchup_endpoint=catchup_endpoint,
        )

    def stop_catchup(self, to_member_id: int, *, leadership_term_id: int, follower_member_id: int) -> bool:
        return self._send(
            to_member_id,
            codecs.StopCatchupEncoder,
            leadership_term_id=leadership_term_id,
            follower_member_id=follower_member_id,
        )

    def termination_position(self, to_member_id: int, *, leadership_term_id: int, log_position: int) -> bool:
        return self._send(
            to_member_id,
            codecs.TerminationPositionEncoder,
            leadership_term_id=leadership_term_id,
            log_position=log_position,
        )

    def termination_ack(self, to_member_id: int, *, leadership_term_id: int, log_position: int, member_id: int) -> bool:
        return self._send(
            to_member_id,
            codecs.TerminationAckEncoder,
            leadership_term_id=leadership_term_id,
            log_position=log_position,
            member_id=member_id,
        )
