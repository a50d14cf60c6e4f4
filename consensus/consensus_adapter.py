"""Decoder of the consensus stream (stream 108): turns each fragment into a
call of an ``on_<message>`` method of a listener (the consensus module agent,
which passes election messages on to its election).  Besides the members'
own messages, the stream carries the requests of tools that are not members:
a cluster backup's BackupQuery, a HeartbeatRequest and a StandbySnapshot,
and a tool's ChallengeResponse when its session was challenged.

The adapter only decodes.  A fragment that is not a consensus message (an
unknown template id, another schema, a truncated or corrupt body) is counted
in ``errors`` and reported to the optional ``error_handler``; it never raises
out of ``on_fragment``.

An optional ``guard`` (``fulmar.consensus.member_auth.ConsensusGuard``) is
asked about each fragment before it is decoded: it drops what a member did
not send (a member trailer missing or wrong, a host that is not a member's)
and gives the length of the message without its trailer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.codecs.runtime import HEADER, HEADER_LENGTH


class ConsensusListener(Protocol):
    """What a consensus stream listener handles; arguments follow the codecs' field order."""

    def on_canvass_position(
        self,
        log_leadership_term_id: int,
        log_position: int,
        leadership_term_id: int,
        follower_member_id: int,
        protocol_version: int,
    ) -> None: ...

    def on_request_vote(
        self,
        log_leadership_term_id: int,
        log_position: int,
        candidate_term_id: int,
        candidate_member_id: int,
        protocol_version: int,
    ) -> None: ...

    def on_vote(
        self,
        candidate_term_id: int,
        log_leadership_term_id: int,
        log_position: int,
        candidate_member_id: int,
        follower_member_id: int,
        vote: bool,
    ) -> None: ...

    def on_new_leadership_term(
        self,
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
    ) -> None: ...

    def on_append_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, flags: int
    ) -> None: ...

    def on_commit_position(self, leadership_term_id: int, log_position: int, leader_member_id: int) -> None: ...

    def on_catchup_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, catchup_endpoint: str
    ) -> None: ...

    def on_stop_catchup(self, leadership_term_id: int, follower_member_id: int) -> None: ...

    def on_termination_position(self, leadership_term_id: int, log_position: int) -> None: ...

    def on_termination_ack(self, leadership_term_id: int, log_position: int, member_id: int) -> None: ...

    def on_backup_query(
        self,
        correlation_id: int,
        response_stream_id: int,
        version: int,
        response_channel: str,
        encoded_credentials: bytes,
    ) -> None: ...

    def on_heartbeat_request(
        self, correlation_id: int, response_stream_id: int, response_channel: str, encoded_credentials: bytes
    ) -> None: ...

    def on_standby_snapshot(
        self,
        correlation_id: int,
        version: int,
        response_stream_id: int,
        snapshots: list[Any],
        response_channel: str,
        encoded_credentials: bytes,
    ) -> None: ...

    def on_consensus_challenge_response(
        self, correlation_id: int, cluster_session_id: int, encoded_credentials: bytes
    ) -> None: ...


class Pollable(Protocol):
    def poll(self, handler: Callable[..., None], fragment_limit: int) -> int: ...


class ConsensusAdapter:
    """Decodes consensus messages and calls the listener's ``on_*`` methods."""

    def __init__(
        self,
        listener: ConsensusListener,
        subscription: Pollable | None = None,
        fragment_limit: int = 10,
        error_handler: Callable[[str], None] | None = None,
        guard: Any = None,
    ) -> None:
        self.listener = listener
        self.guard = guard
        self.subscription = subscription
        self.fragment_limit = fragment_limit
        self.error_handler = error_handler
        self.errors = 0
        self._canvass = codecs.CanvassPositionDecoder()
        self._request_vote = codecs.RequestVoteDecoder()
        self._vote = codecs.VoteDecoder()
        self._new_leadership_term = codecs.NewLeadershipTermDecoder()
        self._append_position = codecs.AppendPositionDecoder()
        self._commit_position = codecs.CommitPositionDecoder()
        self._catchup_position = codecs.CatchupPositionDecoder()
        self._stop_catchup = codecs.StopCatchupDecoder()
        self._termination_position = codecs.TerminationPositionDecoder()
        self._termination_ack = codecs.TerminationAckDecoder()
        self._backup_query = codecs.BackupQueryDecoder()
        self._heartbeat_request = codecs.HeartbeatRequestDecoder()
        self._standby_snapshot = codecs.StandbySnapshotDecoder()
        self._challenge_response = codecs.ChallengeResponseDecoder()

    def poll(self) -> int:
        """Poll the subscription; returns the number of fragments read."""
        if self.subscription is None:
            return 0
        return self.subscription.poll(self.on_fragment, self.fragment_limit)

    def _error(self, text: str) -> None:
        self.errors += 1
        if self.error_handler is not None:
            self.error_handler(text)

    def on_fragment(self, buffer: Any, offset: int, length: int, header: Any = None) -> None:
        """Decode one whole message of ``length`` bytes at ``offset`` and dispatch it."""
        if length < HEADER_LENGTH or offset < 0 or offset + length > len(buffer):
            self._error(f"consensus fragment of {length} bytes is shorter than a message header")
            return
        _, template_id, schema_id, _ = HEADER.unpack_from(buffer, offset)
        if schema_id != codecs.SCHEMA_ID:
            self._error(f"consensus fragment of schema {schema_id}, expected {codecs.SCHEMA_ID}")
            return
        guard = self.guard
        if guard is not None:
            length = guard.admit(template_id, buffer, offset, length, header)
            if length < 0:
                return
        try:
            self._dispatch(template_id, buffer, offset, length)
        except CodecError as ex:
            self._error(f"corrupt consensus message (template {template_id}): {ex}")

    def _dispatch(self, template_id: int, buffer: Any, offset: int, length: int) -> None:
        listener = self.listener
        if template_id == codecs.CanvassPositionDecoder.TEMPLATE_ID:
            c = self._canvass.wrap_and_apply_header(buffer, offset, length)
            listener.on_canvass_position(
                c.log_leadership_term_id, c.log_position, c.leadership_term_id, c.follower_member_id, c.protocol_version
            )
        elif template_id == codecs.RequestVoteDecoder.TEMPLATE_ID:
            r = self._request_vote.wrap_and_apply_header(buffer, offset, length)
            listener.on_request_vote(
                r.log_leadership_term_id, r.log_position, r.candidate_term_id, r.candidate_member_id, r.protocol_version
            )
        elif template_id == codecs.VoteDecoder.TEMPLATE_ID:
            v = self._vote.wrap_and_apply_header(buffer, offset, length)
            listener.on_vote(
                v.candidate_term_id,
                v.log_leadership_term_id,
                v.log_position,
                v.candidate_member_id,
                v.follower_member_id,
                v.vote_raw == int(codecs.BooleanType.TRUE),
            )
        elif template_id == codecs.NewLeadershipTermDecoder.TEMPLATE_ID:
            n = self._new_leadership_term.wrap_and_apply_header(buffer, offset, length)
            listener.on_new_leadership_term(
                n.log_leadership_term_id,
                n.next_leadership_term_id,
                n.next_term_base_log_position,
                n.next_log_position,
                n.leadership_term_id,
                n.term_base_log_position,
                n.log_position,
                n.leader_recording_id,
                n.timestamp,
                n.leader_member_id,
                n.log_session_id,
                n.app_version,
                n.is_startup_raw == int(codecs.BooleanType.TRUE),
            )
        elif template_id == codecs.AppendPositionDecoder.TEMPLATE_ID:
            a = self._append_position.wrap_and_apply_header(buffer, offset, length)
            listener.on_append_position(a.leadership_term_id, a.log_position, a.follower_member_id, a.flags)
        elif template_id == codecs.CommitPositionDecoder.TEMPLATE_ID:
            p = self._commit_position.wrap_and_apply_header(buffer, offset, length)
            listener.on_commit_position(p.leadership_term_id, p.log_position, p.leader_member_id)
        elif template_id == codecs.CatchupPositionDecoder.TEMPLATE_ID:
            q = self._catchup_position.wrap_and_apply_header(buffer, offset, length)
            listener.on_catchup_position(q.leadership_term_id, q.log_position, q.follower_member_id, q.catchup_endpoint)
        elif template_id == codecs.StopCatchupDecoder.TEMPLATE_ID:
            s = self._stop_catchup.wrap_and_apply_header(buffer, offset, length)
            listener.on_stop_catchup(s.leadership_term_id, s.follower_member_id)
        elif template_id == codecs.TerminationPositionDecoder.TEMPLATE_ID:
            t = self._termination_position.wrap_and_apply_header(buffer, offset, length)
            listener.on_termination_position(t.leadership_term_id, t.log_position)
        elif template_id == codecs.TerminationAckDecoder.TEMPLATE_ID:
            k = self._termination_ack.wrap_and_apply_header(buffer, offset, length)
            listener.on_termination_ack(k.leadership_term_id, k.log_position, k.member_id)
        elif template_id == codecs.BackupQueryDecoder.TEMPLATE_ID:
            b = self._backup_query.wrap_and_apply_header(buffer, offset, length)
            listener.on_backup_query(
                b.correlation_id, b.response_stream_id, b.version, b.response_channel, bytes(b.encoded_credentials)
            )
        elif template_id == codecs.HeartbeatRequestDecoder.TEMPLATE_ID:
            h = self._heartbeat_request.wrap_and_apply_header(buffer, offset, length)
            listener.on_heartbeat_request(
                h.correlation_id, h.response_stream_id, h.response_channel, bytes(h.encoded_credentials)
            )
        elif template_id == codecs.StandbySnapshotDecoder.TEMPLATE_ID:
            y = self._standby_snapshot.wrap_and_apply_header(buffer, offset, length)
            listener.on_standby_snapshot(
                y.correlation_id,
                y.version,
                y.response_stream_id,
                list(y.snapshots),
                y.response_channel,
                bytes(y.encoded_credentials),
            )
        elif template_id == codecs.ChallengeResponseDecoder.TEMPLATE_ID:
            # A tool's answer to the challenge its session was sent (Aeron's
            # onConsensusChallengeResponse): the tools talk on this stream.
            answer = self._challenge_response.wrap_and_apply_header(buffer, offset, length)
            listener.on_consensus_challenge_response(
                answer.correlation_id, answer.cluster_session_id, bytes(answer.encoded_credentials)
            )
        else:
            self._error(f"unknown consensus template id {template_id}")
