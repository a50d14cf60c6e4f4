"""The ingress adapter (Aeron's IngressAdapter): decodes what clients send
the consensus module on the ingress and calls the listener (the agent) for
each: a session connect, close, keep-alive, challenge response or admin
request, or a session message for the log.  It decides nothing: whether a
follower acts on a message is the listener's rule except where the message is
not for a follower at all (a session message, a close: only a connect is
answered, with a redirect).  Each ``dispatch`` returns False when the message
is to be offered again (the log was back pressured)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.protocol import (
    CLUSTER_SCHEMA_ID,
    SESSION_MESSAGE_BLOCK_LENGTH,
    SESSION_MESSAGE_FRAME,
    SESSION_MESSAGE_TEMPLATE_ID,
)
from fulmar.consensus.publishers import SESSION_HEADER_LENGTH

if TYPE_CHECKING:
    from fulmar.aeron import Counter


class IngressListener(Protocol):
    """What the adapter calls; each returns False to have the message offered again."""

    def on_session_connect(self, message: Any) -> bool: ...

    def on_session_close_request(self, message: Any) -> bool: ...

    def on_session_keep_alive(self, message: Any) -> bool: ...

    def on_challenge_response(self, message: Any) -> bool: ...

    def on_admin_request(self, message: Any) -> bool: ...

    def on_ingress_session_message(
        self, leadership_term_id: int, cluster_session_id: int, buffer: memoryview, offset: int, length: int
    ) -> bool: ...


# The listener's method for each template a client sends (other than a session message).
_HANDLER_NAMES: dict[int, str] = {
    codecs.SessionConnectRequestEncoder.TEMPLATE_ID: "on_session_connect",
    codecs.SessionCloseRequestEncoder.TEMPLATE_ID: "on_session_close_request",
    codecs.SessionKeepAliveEncoder.TEMPLATE_ID: "on_session_keep_alive",
    codecs.ChallengeResponseEncoder.TEMPLATE_ID: "on_challenge_response",
    codecs.AdminRequestEncoder.TEMPLATE_ID: "on_admin_request",
}


class IngressAdapter:
    def __init__(
        self,
        listener: IngressListener,
        *,
        is_leader: Callable[[], bool],
        invalid_requests: Counter,
        error: Callable[[str], None],
    ) -> None:
        self._listener = listener
        self._is_leader = is_leader
        self._invalid_requests = invalid_requests
        self._error = error
        # One flyweight for every session message header: no decoder per message.
        self._session_header = codecs.SessionMessageHeaderDecoder()

    def on_dropped(self, publication_session_id: int, length: int, max_length: int) -> None:
        self._invalid_requests.increment()
        # The same text for every message of one publisher: the distinct error
        # log counts repeats instead of filling up.
        self._error(
            f"ingress: dropped a message from publication session {publication_session_id} "
            f"longer than its max message length {max_length}"
        )

    def dispatch(self, buffer: memoryview, offset: int, length: int) -> bool:
        """Act on one ingress message; False to be retried (log back pressure)."""
        if length >= SESSION_HEADER_LENGTH:
            # The hot path, a client's message: its frame unpacked in one go.
            block_length, template, schema, _version, term_id, session_id, _timestamp = (
                SESSION_MESSAGE_FRAME.unpack_from(buffer, offset)
            )
            if (
                template == SESSION_MESSAGE_TEMPLATE_ID
                and schema == CLUSTER_SCHEMA_ID
                and block_length == SESSION_MESSAGE_BLOCK_LENGTH
            ):
                if not self._is_leader():
                    return True  # not for a follower
                return self._listener.on_ingress_session_message(term_id, session_id, buffer, offset, length)
        try:
            header = codecs.read_header(buffer, offset, length)
        except CodecError:
            self._invalid_requests.increment()
            return True
        template = header.template_id
        if not self._is_leader() and template != codecs.SessionConnectRequestEncoder.TEMPLATE_ID:
            # Not the leader: a connect is redirected, a client's request is
            # not for this member; a template no client sends is counted, as
            # the leader counts it, rather than ignored unseen.
            if template != codecs.SessionMessageHeaderEncoder.TEMPLATE_ID and template not in _HANDLER_NAMES:
                self._invalid_requests.increment()
            return True
        if template == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
            try:
                session_header = self._session_header.wrap_and_apply_header(buffer, offset, length)
            except CodecError:
                self._invalid_requests.increment()
                return True
            return self._listener.on_ingress_session_message(
                session_header.leadership_term_id, session_header.cluster_session_id, buffer, offset, length
            )
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError:
            self._invalid_requests.increment()
            return True
        name = _HANDLER_NAMES.get(template)
        if name is None:
            self._invalid_requests.increment()
            return True
        return bool(getattr(self._listener, name)(message))
