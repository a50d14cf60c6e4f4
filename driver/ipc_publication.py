"""An IPC publication in the driver: its log buffer, its subscribers'
positions, and the flow-control limit it gives its publishers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from fulmar.counters import AtomicCounter
from fulmar.logbuffer import LogBuffers


class PublicationState(Enum):
    ACTIVE = "active"  # publishers may append
    DRAINING = "draining"  # closed: subscribers are reading to the end of stream
    LINGER = "linger"  # images gone; the log stays a while for stragglers
    DONE = "done"


@dataclass
class SubscriberLink:
    subscription_registration_id: int
    client_id: int
    position: AtomicCounter


class IpcPublication:
    def __init__(
        self,
        registration_id: int,
        client_id: int,
        session_id: int,
        stream_id: int,
        channel: str,
        is_exclusive: bool,
        log: LogBuffers,
        publisher_limit: AtomicCounter,
        publisher_position: AtomicCounter,
        back_pressure_events: AtomicCounter,
        term_window_length: int,
    ) -> None:
        self.registration_id = registration_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.channel = channel
        self.is_exclusive = is_exclusive
        self.log = log
        self.publisher_limit = publisher_limit
        self.publisher_position = publisher_position
        self.back_pressure_events = back_pressure_events
        self.term_window_length = term_window_length
        # Recompute the limit only once the window has moved this far: the
        # publishers need not see every small advance.
        self.trip_gain = term_window_length // 8
        self.trip_limit = 0
        self.clean_position = 0
        self.consumer_position = 0
        self.subscribers: list[SubscriberLink] = []
        # Each add of a shared (non-exclusive) publication counts once.
        self.client_refs: list[int] = [client_id]
        self.state = PublicationState.ACTIVE
        self.linger_deadline_ns = 0

    @property
    def log_file_name(self) -> str:
        return str(self.log.path)

    @property
    def path(self) -> Path:
        return self.log.path

    def producer_position(self) -> int:
        return self.log.producer_position()

    def join_position(self) -> int:
        """Late subscribers start at the current end of the stream."""
        return self.producer_position()

    def update_publisher_limit(self) -> int:
        """Advance the publishers' limit to a window beyond the slowest
        subscriber, cleaning what every subscriber has passed.  Without
        subscribers the limit stops where the consumers were."""
        work = 0
        self.publisher_position.set(self.producer_position())
        if self.subscribers:
            positions = [link.position.get() for link in self.subscribers]
            min_position = min(positions)
            self.consumer_position = max(self.consumer_position, max(positions))
            proposed = min_position + self.term_window_length
            if proposed > self.trip_limit:
                # Keep the term behind the slowest reader intact; clean older bytes.
                self._clean_to(min_position - self.log.term_length)
                self.publisher_limit.set(proposed)
                self.trip_limit = proposed + self.trip_gain
                work = 1
        elif self.publisher_limit.get() > self.consumer_position:
            self.publisher_limit.set(self.consumer_position)
            self.trip_limit = 0
            work = 1
        return work

    def _clean_to(self, position: int) -> None:
        position &= ~31
        if position > self.clean_position:
            self.log.clean(self.clean_position, position)
            self.clean_position = position

    def set_connected(self) -> None:
        self.log.is_connected = bool(self.subscribers)

    def close_for_draining(self) -> None:
        """The last publisher left: mark the end of the stream where it is."""
        self.log.end_of_stream_position = self.producer_position()
        self.state = PublicationState.DRAINING

    def is_drained(self) -> bool:
        end = self.producer_position()
        return all(link.position.get() >= end for link in self.subscribers)
