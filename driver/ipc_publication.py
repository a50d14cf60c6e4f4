"""An IPC publication in the driver: its log buffer, its subscribers'
positions and its life cycle.  The flow-control limit it gives its
publishers (a window beyond the slowest subscriber) is moved by the data
plane (``data_plane.py``), which sees the subscribers' progress promptly."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from fulmar.counters import AtomicCounter
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH, UNFRAGMENTED, FrameType
from fulmar.logbuffer import (
    LogBuffers,
    compute_term_id_from_position,
    index_by_position,
)
from fulmar.reader_doorbells import LogReaders

if TYPE_CHECKING:
    from fulmar.driver.data_plane import DataPlane


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
    wake_on_data: bool = True  # the channel's wake-on-data: is its doorbell in the log's reader table
    doorbell_id: int | None = None  # the channel's doorbell-id: a thread doorbell rung instead of the client's


class IpcPublication:
    # The doorbells of the log's readers, named in its table (set by the conductor).
    readers: LogReaders
    # How long it lingers once drained: its channel's ``linger``, else the driver's (set by the conductor).
    linger_timeout_ns: int

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
        data_plane: DataPlane,
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
        self.subscribers: list[SubscriberLink] = []
        # Each add of a shared (non-exclusive) publication counts once.
        self.client_refs: list[int] = [client_id]
        self.state = PublicationState.ACTIVE
        self.linger_deadline_ns = 0
        self._data_plane = data_plane
        # A publication may start mid-stream (an initial position): nothing before it is ours.
        data_plane.add_ipc_publication(
            registration_id, log.address, log.term_length, log.initial_term_id, log.clean_position,
            term_window_length, publisher_limit.id, publisher_position.id,
        )  # fmt: skip
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

    def set_connected(self) -> None:
        self.log.is_connected = bool(self.subscribers)

    def close_for_draining(self) -> None:
        """The last publisher left: mark the end of the stream where it is."""
        self._data_plane.close_publication(self.registration_id)
        self.state = PublicationState.DRAINING

    def close(self) -> None:
        """Out of the data plane: its log may be unmapped after this."""
        self._data_plane.remove(self.registration_id)

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
        header = struct.pack(
            "<BBhiiii", 0, UNFRAGMENTED, FrameType.PAD, term_offset, self.session_id, self.stream_id, term_id
        )
        buffer.put_bytes(frame_at + 4, header)
        buffer.put_int32_ordered(frame_at, pad_length)
        return True

    def is_drained(self) -> bool:
        end = self.producer_position()
        return all(link.position.get() >= end for link in self.subscribers)
