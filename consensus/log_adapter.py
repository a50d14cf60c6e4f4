"""The log adapter (Aeron's LogAdapter): decodes the log this member applies
(a follower's live log, or a replay of its own recording) and calls the
listener (the agent) for each entry: a session's message (a client's or a
service's), a session opened or closed, a timer that fired, a new leadership
term, a cluster action.  It decides nothing: what an entry means for the
module is the listener's.  Runs of session messages, the hot path, come
from the image as one batch (``on_session_messages``): of each the module
needs only its session id."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.protocol import (
    CLUSTER_SCHEMA_ID,
    SESSION_MESSAGE_BLOCK_LENGTH,
    SESSION_MESSAGE_FRAME,
    SESSION_MESSAGE_TEMPLATE_ID,
    cluster_action_flags,
)
from fulmar.consensus.publishers import SESSION_HEADER_LENGTH
from fulmar.fragment_assembler import FragmentAssembler

if TYPE_CHECKING:
    from fulmar.log_reader import Header, SessionMessages
    from fulmar.subscription import Image


class LogListener(Protocol):
    """What the adapter calls, an entry of the log at a time."""

    def on_replay_session_message(self, cluster_session_id: int) -> None: ...

    def on_replay_session_open(
        self,
        log_position: int,
        correlation_id: int,
        cluster_session_id: int,
        response_stream_id: int,
        response_channel: str,
        encoded_principal: bytes,
    ) -> None: ...

    def on_replay_session_close(self, cluster_session_id: int, close_reason_raw: int) -> None: ...

    def on_replay_timer_event(self, correlation_id: int) -> None: ...

    def on_replay_new_leadership_term_event(self, leadership_term_id: int) -> None: ...

    def on_replay_cluster_action(self, log_position: int, action: int, flags: int) -> None: ...


class LogAdapter:
    def __init__(self, listener: LogListener, *, error: Callable[[str], None]) -> None:
        self._listener = listener
        self._error = error
        self.assembler = FragmentAssembler(self.on_message)
        # One flyweight for every session message of the log: no decoder per message.
        self._session_header = codecs.SessionMessageHeaderDecoder()

    def poll(self, image: Image, limit_position: int) -> int:
        """The image's entries up to ``limit_position`` (at most 64 fragments or runs); the work done."""
        return image.bounded_poll_session_runs(self.assembler.on_fragment, self.on_session_messages, limit_position, 64)

    def on_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        listener = self._listener
        if length >= SESSION_HEADER_LENGTH:
            block_length, template, schema, _version, _term_id, session_id, _timestamp = (
                SESSION_MESSAGE_FRAME.unpack_from(buffer, offset)
            )
            if (
                template == SESSION_MESSAGE_TEMPLATE_ID
                and schema == CLUSTER_SCHEMA_ID
                and block_length == SESSION_MESSAGE_BLOCK_LENGTH
            ):
                listener.on_replay_session_message(session_id)
                return
        try:
            message_header = codecs.read_header(buffer, offset, length)
            if message_header.template_id == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
                session_header = self._session_header.wrap_and_apply_header(buffer, offset, length)
                listener.on_replay_session_message(session_header.cluster_session_id)
                return
            message = codecs.decode(buffer, offset, length)
        except CodecError as error:
            self._error(f"malformed log message at position {header.position}: {error}")
            return
        if isinstance(message, codecs.SessionOpenEventDecoder):
            listener.on_replay_session_open(
                header.position,
                message.correlation_id,
                message.cluster_session_id,
                message.response_stream_id,
                message.response_channel,
                bytes(message.encoded_principal),
            )
        elif isinstance(message, codecs.SessionCloseEventDecoder):
            listener.on_replay_session_close(message.cluster_session_id, message.close_reason_raw)
        elif isinstance(message, codecs.TimerEventDecoder):
            listener.on_replay_timer_event(message.correlation_id)
        elif isinstance(message, codecs.NewLeadershipTermEventDecoder):
            listener.on_replay_new_leadership_term_event(message.leadership_term_id)
        elif isinstance(message, codecs.ClusterActionRequestDecoder):
            listener.on_replay_cluster_action(message.log_position, message.action_raw, cluster_action_flags(message))

    def on_session_messages(self, messages: SessionMessages) -> None:
        """A run of client (and service) messages in the log, found without a
        call per message: of each the module needs only its session id."""
        listener = self._listener
        for session_id in set(messages.session_ids):
            listener.on_replay_session_message(session_id)
