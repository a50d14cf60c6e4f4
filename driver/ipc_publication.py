"""An IPC publication in the driver: its log buffer, its subscribers'
positions, and the flow-control limit it gives its publishers."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from fulmar.counters import AtomicCounter
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH, UNFRAGMENTED, FrameType
from fulmar.reader_doorbells import LogReaders
from fulmar.logbuffer import (
    LogBuffers,
    compute_term_id_from_position,
    index_by_position,
)


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
    # The doorbells of the log's readers, named in its table (set by the conductor).
    readers: LogReaders
    # With more readers than the table holds: the producer position the driver last relayed a ring for.
    relayed_position = 0
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
        messages: AtomicCounter,
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
        self.messages = messages
        self.term_window_length = term_window_length
        # Recompute the limit only once the window has moved this far: the
        # publishers need not see every small advance.
        self.trip_gain = term_window_length // 8
        self.trip_limit = 0
        # A publication may start mid-stream (an initial position): nothing before it is ours.
        self.consumer_position = log.clean_position
        self.subscribers: list[SubscriberLink] = []
        # Each add of a shared (non-exclusive) publication counts once.
        self.client_refs: list[int] = [client_id]
        self.state = PublicationState.ACTIVE
        self.linger_deadline_ns = 0
        # Set each duty cycle: a subscriber has yet to read what was
        # published, so the limit will move (the driver must not doze).
        self.readers_behind = False
        # For spotting a publisher that died mid-append: the slowest
        # subscriber's position and when it last moved.
        self._last_consumer_position = -1
        self._time_of_last_consumer_change_ns = 0

    @property
    def log_file_name(self) -> str:
        return str(self.log.path)

    @property
    def path(self) -> Path:
        return self.log.path

    def producer_position(self) -> int:
        return self.log.producer_position()

    def join_position(self) -> int:
        """A late subscriber starts where the slowest subscriber is (Aeron's
        consumer position): what the others have yet to read, it reads too.
        An archive replay relies on it: the second subscriber of a replay may
        come after the replay has been written (seed 002)."""
        if self.subscribers:
            return min(link.position.get() for link in self.subscribers)
        return self.producer_position()

    def is_accepting_subscriptions(self) -> bool:
        """Active, or closed but not yet read to the end by its subscribers."""
        return self.state is PublicationState.ACTIVE or (
            self.state is PublicationState.DRAINING and bool(self.subscribers) and not self.is_drained()
        )

    def update_publisher_limit(self) -> int:
        """Advance the publishers' limit to a window beyond the slowest
        subscriber, cleaning what every subscriber has passed.  Without
        subscribers the limit stops where the consumers were."""
        work = 0
        producer_position = self.producer_position()
        self.publisher_position.set(producer_position)
        self.readers_behind = False
        if self.subscribers:
            positions = [link.position.get() for link in self.subscribers]
            min_position = min(positions)
            self.readers_behind = min_position < producer_position
            self.consumer_position = max(self.consumer_position, max(positions))
            proposed = min_position + self.term_window_length
            if proposed > self.trip_limit:
                # Keep the term behind the slowest reader intact; clean older bytes.
                self.log.clean_to(min_position - self.log.term_length)
                self.publisher_limit.set(proposed)
                self.trip_limit = proposed + self.trip_gain
                work = 1
        elif self.publisher_limit.get() > self.consumer_position:
            self.publisher_limit.set(self.consumer_position)
            self.trip_limit = 0
            work = 1
        return work

    def set_connected(self) -> None:
        self.log.is_connected = bool(self.subscribers)

    def close_for_draining(self) -> None:
        """The last publisher left: mark the end of the stream where it is."""
        self.log.end_of_stream_position = self.producer_position()
        self.state = PublicationState.DRAINING

    def check_for_blocked_publisher(self, now_ns: int, unblock_timeout_ns: int) -> bool:
        """Pad over a frame a dead publisher claimed but never committed.

        A publisher killed between claiming space and committing it leaves a
        frame whose length is zero or negative; readers stop there for ever.
        When the slowest subscriber has not moved for the timeout while the
        tail is beyond it, turn the stuck region into padding so readers
        pass.  Returns True if it did.
        """
        if not self.subscribers:
            return False
        position = min(link.position.get() for link in self.subscribers)
        if position != self._last_consumer_position or position >= self.producer_position():
            self._last_consumer_position = position
            self._time_of_last_consumer_change_ns = now_ns
            return False
        if now_ns - self._time_of_last_consumer_change_ns < unblock_timeout_ns:
            return False
        self._time_of_last_consumer_change_ns = now_ns
        return self._unblock(position)

    def _unblock(self, position: int) -> bool:
        log = self.log
        term_length = log.term_length
        bits = log.position_bits_to_shift
        term_offset = position & (term_length - 1)
        frame_at = index_by_position(position, bits) * term_length + term_offset
        buffer = log.log
        frame_length = buffer.get_int32_volatile(frame_at)
        if frame_length > 0:
            return False  # readers can move: not blocked here
        if frame_length < 0:
            pad_length = -frame_length  # the header was written: its length is known
        else:
            # Nothing written at all: pad up to the next frame that was, or to
            # the tail, or to the end of the term.
            end = min(self.producer_position(), position - term_offset + term_length)
            scan = position + FRAME_ALIGNMENT
            while scan < end and buffer.get_int32_volatile(frame_at + (scan - position)) == 0:
                scan += FRAME_ALIGNMENT
            pad_length = scan - position
        pad_length = (pad_length + FRAME_ALIGNMENT - 1) & ~(FRAME_ALIGNMENT - 1)
        if pad_length < HEADER_LENGTH or term_offset + pad_length > term_length:
            return False
        term_id = compute_term_id_from_position(position, bits, log.initial_term_id)
        buffer.put_int32_ordered(frame_at, -pad_length)
        header = struct.pack("<BBhiiii", 0, UNFRAGMENTED, FrameType.PAD, term_offset, self.session_id, self.stream_id, term_id)
        buffer.put_bytes(frame_at + 4, header)
        buffer.put_int32_ordered(frame_at, pad_length)
        return True

    def is_drained(self) -> bool:
        end = self.producer_position()
        return all(link.position.get() >= end for link in self.subscribers)
