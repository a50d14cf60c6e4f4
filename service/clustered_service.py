"""What a user implements, and what the container hands it.

A ``ClusteredService`` is the replicated state machine.  The container calls
it with the committed log, in log order, on every member: sessions opening and
closing, their messages, timers firing, snapshots to take.  It must be
deterministic: the same log gives the same state and the same replies, so use
``cluster.time`` (the log's timestamps), never the wall clock.

A callback that raises costs its message, on every member alike (by default:
see ``fulmar.service.errors``): raise before changing anything, so the
members' states stay equal.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Iterator
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    pass


class Role(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


class CloseReason(IntEnum):
    CLIENT_ACTION = 0
    SERVICE_ACTION = 1
    TIMEOUT = 2


class ClientSession(Protocol):
    """A client connected to the cluster, as the service sees it."""

    @property
    def id(self) -> int: ...

    @property
    def response_stream_id(self) -> int: ...

    @property
    def response_channel(self) -> str: ...

    @property
    def encoded_principal(self) -> bytes: ...

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        """Send to the client's egress (only the leader sends; on followers
        this does nothing and reports success, so the service's code is the
        same on every member).  Returns a position or a back-pressure code."""
        ...

    def close(self) -> bool:
        """Ask the cluster to close this session (it closes at a log position)."""
        ...


class Cluster(Protocol):
    """The service's handle on the cluster."""

    @property
    def member_id(self) -> int: ...

    @property
    def role(self) -> Role: ...

    @property
    def time(self) -> int:
        """Cluster time (ms since the epoch) of the message being processed."""
        ...

    @property
    def log_position(self) -> int: ...

    @property
    def service_id(self) -> int: ...

    def client_sessions(self) -> list[ClientSession]: ...

    def get_client_session(self, cluster_session_id: int) -> ClientSession | None: ...

    def close_client_session(self, cluster_session_id: int) -> bool: ...

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        """Fire ``on_timer_event(correlation_id, ...)`` at cluster time
        ``deadline`` (ms); scheduling an existing id moves it."""
        ...

    def cancel_timer(self, correlation_id: int) -> bool: ...

    def offer(self, payload: bytes | bytearray | memoryview) -> bool:
        """Send a message into the cluster's log (it comes back through
        ``on_session_message`` with ``session`` None, on every member)."""
        ...

    def idle(self, work_count: int = 0) -> None:
        """For a service that waits inside a callback (e.g. retrying an egress
        offer under back pressure): idle the container's way, not by spinning."""
        ...


class SnapshotImage(Protocol):
    """The user's part of a snapshot being loaded: its messages, in order."""

    def messages(self) -> Iterator[bytes]: ...


class SnapshotPublication(Protocol):
    """Where ``on_take_snapshot`` writes its messages."""

    @property
    def max_message_length(self) -> int:
        """The longest message ``offer`` takes: split a larger state across messages."""
        ...

    def offer(self, message: bytes | bytearray | memoryview) -> None: ...


class ClusteredService(ABC):
    """Override what you need; every method has a do-nothing default."""

    def on_start(self, cluster: Cluster, snapshot: SnapshotImage | None) -> None:
        """Started; ``snapshot`` holds the state to load when recovering."""

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        pass

    def on_session_close(self, session: ClientSession, timestamp: int, reason: CloseReason) -> None:
        pass

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        """A committed message: from a client session, or (``session`` None)
        one the service offered to the cluster.  The message is
        ``buffer[offset : offset + length]``, a view of the log valid only
        during the call.  The default hands a copy of it to ``on_message``."""
        self.on_message(session, timestamp, bytes(buffer[offset : offset + length]))

    def on_message(self, session: ClientSession | None, timestamp: int, payload: bytes) -> None:
        """The plain form of ``on_session_message``: a service that does not
        override that one gets each committed message here, as bytes of its own."""

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        pass

    def on_take_snapshot(self, publication: SnapshotPublication) -> None:
        """Write everything needed to rebuild the state, as messages."""

    def on_role_change(self, new_role: Role) -> None:
        pass

    def on_terminate(self, cluster: Cluster) -> None:
        pass

    def on_new_leadership_term_event(
        self,
        leadership_term_id: int,
        log_position: int,
        timestamp: int,
        term_base_log_position: int,
        leader_member_id: int,
        log_session_id: int,
        app_version: int,
    ) -> None:
        pass

    def do_background_work(self, now_ns: int) -> int:
        """Called every duty cycle (not from the log: must not change replicated state)."""
        return 0
