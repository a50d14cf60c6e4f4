"""A client's session as the consensus module sees it (seed 003).

The leader holds the session's egress publication (a concurrent publication
on the client's response channel, which the leader's service shares);
followers keep the same sessions, from the log, without connecting them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

from fulmar.consensus.protocol import NULL_POSITION, NULL_VALUE, CloseReason
from fulmar.errors import FulmarError

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
        # What a non-client session's request carried until it is answered (a
        # StandbySnapshot's entries; Aeron's requestInput).
        self.request_input: list[Any] = []
        self._publication: Publication | None = None
        # The egress publication the driver is adding (Aeron's responsePublicationId).
        self.response_publication_id = NULL_VALUE
        self._aeron: Aeron | None = None
        self._on_error: Callable[[str], object] | None = None

    # ------------------------------------------------------------- egress

    def async_connect(self, aeron: Aeron, on_error: Callable[[str], object] | None = None) -> None:
        """Ask the driver for the egress publication and return at once (Aeron's
        ``asyncConnect``; the leader does this, followers never): a driver round
        trip per session on the module's duty cycle would stall its heartbeats
        when a thousand clients connect, or an election reconnects them all.
        ``publication`` stays None until the driver has added it; if the
        driver refuses, ``on_error`` hears why and a session still connecting
        becomes INVALID."""
        if self._publication is None and self.response_publication_id == NULL_VALUE:
            self.response_publication_id = aeron.async_add_publication(self.response_channel, self.response_stream_id)
            self._aeron = aeron
            self._on_error = on_error
            if self.state is ClusterSessionState.INIT:
                self.state = ClusterSessionState.CONNECTING

    @property
    def publication(self) -> Publication | None:
        """The egress publication, once the driver has added it (read from the
        client's conductor when first asked for after that; never waits)."""
        if self._publication is None and self.response_publication_id != NULL_VALUE:
            self._collect_publication()
        return self._publication

    def _collect_publication(self) -> None:
        assert self._aeron is not None
        try:
            publication = self._aeron.get_publication(self.response_publication_id)
        except FulmarError as error:
            self.response_publication_id = NULL_VALUE
            if self.state in (ClusterSessionState.INIT, ClusterSessionState.CONNECTING):
                self.state = ClusterSessionState.INVALID  # its owner drops it
            if self._on_error is not None:
                # Without the session id: the distinct error log counts repeats.
                self._on_error(
                    f"cannot add a session's egress publication ({self.response_channel} "
                    f"stream {self.response_stream_id}): {error}"
                )
            return
        if publication is not None:
            self._publication = publication
            self.response_publication_id = NULL_VALUE

    @property
    def is_response_publication_connected(self) -> bool:
        publication = self.publication
        return publication is not None and publication.is_connected

    def disconnect(self) -> None:
        """Let the egress publication go (added yet or not) without waiting for the driver."""
        if self._publication is not None:
            registration_id = self._publication.registration_id
        else:
            registration_id = self.response_publication_id
        self._publication = None
        self.response_publication_id = NULL_VALUE
        if registration_id != NULL_VALUE and self._aeron is not None:
            self._aeron.async_remove_publication(registration_id)

    def close(self, reason: CloseReason = CloseReason.NULL_VAL) -> None:
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
