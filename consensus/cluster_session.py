"""A client's session as the consensus module sees it (seed 003).

The leader holds the session's egress publication (a concurrent publication
on the client's response channel, which the leader's service shares);
followers keep the same sessions, from the log, without connecting them.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import TYPE_CHECKING

from fulmar.consensus.protocol import NULL_POSITION, CloseReason

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.publication import Publication


class ClusterSessionState(Enum):
    INIT = "INIT"
    CONNECTING = "CONNECTING"
    CONNECTED = "CONNECTED"
    CHALLENGED = "CHALLENGED"
    AUTHENTICATED = "AUTHENTICATED"
    REJECTED = "REJECTED"
    OPEN = "OPEN"
    CLOSING = "CLOSING"
    INVALID = "INVALID"
    CLOSED = "CLOSED"


class ClusterSessionAction(IntEnum):
    CLIENT = 0
    BACKUP = 1
    HEARTBEAT = 2
    STANDBY_SNAPSHOT = 3


class ClusterSession:
    def __init__(
        self,
        session_id: int,
        response_stream_id: int,
        response_channel: str,
        correlation_id: int = -1,
        now_ns: int = 0,
        action: ClusterSessionAction = ClusterSessionAction.CLIENT,
    ) -> None:
        self.id = session_id
        self.correlation_id = correlation_id
        self.response_stream_id = response_stream_id
        self.response_channel = response_channel
        self.action = action
        self.state = ClusterSessionState.INIT
        self.time_of_last_activity_ns = now_ns
        self.opened_log_position = NULL_POSITION
        self.close_reason: CloseReason | None = None
        self.encoded_principal = b""
        self.encoded_challenge: bytes | None = None  # a challenge waiting to be sent
        self.detail = ""  # why it is rejected or redirected
        self.has_new_leader_event_pending = False
        self.has_open_event_pending = False  # SessionEvent OK not yet delivered
        self.publication: "Publication | None" = None

    # ------------------------------------------------------------- egress

    def connect(self, aeron: "Aeron") -> None:
        """Add the egress publication (the leader does; followers never)."""
        if self.publication is None:
            self.publication = aeron.add_publication(self.response_channel, self.response_stream_id)
            if self.state is ClusterSessionState.INIT:
                self.state = ClusterSessionState.CONNECTING

    @property
    def is_response_publication_connected(self) -> bool:
        return self.publication is not None and self.publication.is_connected

    def disconnect(self) -> None:
        if self.publication is not None:
            self.publication.close()
            self.publication = None

    def close(self, reason: CloseReason) -> None:
        self.close_reason = reason
        self.state = ClusterSessionState.CLOSED
        self.disconnect()

    def time_of_last_activity(self, now_ns: int) -> None:
        self.time_of_last_activity_ns = now_ns

    def __repr__(self) -> str:
        return f"ClusterSession(id={self.id}, state={self.state.name}, action={self.action.name})"


class SessionProxy:
    """What an Authenticator may do to a session being connected."""

    def __init__(self, session: ClusterSession) -> None:
        self._session = session

    @property
    def session_id(self) -> int:
        return self._session.id

    def challenge(self, encoded_challenge: bytes) -> bool:
        self._session.encoded_challenge = bytes(encoded_challenge)
        self._session.state = ClusterSessionState.CHALLENGED
        return True

    def authenticate(self, encoded_principal: bytes = b"") -> bool:
        self._session.encoded_principal = bytes(encoded_principal)
        self._session.state = ClusterSessionState.AUTHENTICATED
        return True

    def reject(self) -> None:
        self._session.state = ClusterSessionState.REJECTED
