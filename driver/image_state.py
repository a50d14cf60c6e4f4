"""What a network image tracks between the network and its log (the
receive-side state of Aeron's ``PublicationImage``), as a plain object.

It owns no socket, clock or thread: the receiver agent feeds it datagrams
and the time, runs its duty-cycle work, and sends whatever status messages
and NAKs it hands back.  It writes only to the image's own log buffer.

Interface
---------
``ImageReceiveState(log, active_term_id, term_offset, now_ns, *, delay_generator=None,
initial_window_length=128 KiB, status_message_timeout_ns=200 ms, image_liveness_timeout_ns=10 s)``
    ``log`` is the image's log buffer (its initial term id, session and
    stream id are the SETUP's); ``active_term_id``/``term_offset`` is the
    SETUP's position, where the image joins the stream.  ``delay_generator``
    times NAKs: ``StaticDelayGenerator()`` (unicast, the default) or
    ``OptimalMulticastDelayGenerator()`` (multicast).

From the network (the receiver, for each DATA or PAD datagram of this session and stream):

``insert_packet(term_id, term_offset, datagram, now_ns, record_eos=True) -> PacketVerdict``
    Everything Aeron's ``insertPacket`` does: a heartbeat (a 32-byte frame
    of length 0) or an EOS flag is read from the first header; a packet
    outside the receiver's window is dropped (``OVER_RUN``/``UNDER_RUN``);
    data is inserted into the log (``INVALID`` if the datagram is malformed:
    count it, nothing was written); then ``on_data`` records it.  An accepted
    packet's EOS position is left in ``packet_eos_position`` (None without
    the flag); with ``record_eos=False`` it does not end the stream: an image
    fed by several sources ends only once every one has (the caller decides,
    then calls ``end_stream``).
``on_data(term_id, term_offset, length, now_ns, is_heartbeat=False, is_eos=False) -> PacketVerdict``
    The bookkeeping alone, for a packet whose bytes the caller handles: the
    window check, then the high-water mark (HWM: the highest position any
    accepted packet reached), the liveness time and the end-of-stream
    position.  ``insert_packet`` is this plus the insertion.
``request_status_message()``
    Makes a status message (SM) due at once, e.g. when the sender's SETUPs
    show it has not heard ours.
``end_stream(position)``
    The stream ends at ``position`` (the first such call counts).

Duty cycle (each returns a work count or what to send):

``rebuild(now_ns, subscriber_positions) -> int``
    Advances ``rebuild_position`` over contiguous frames, runs the loss
    detector (which may queue a NAK), schedules an SM once the slowest
    subscriber has moved more than a quarter of the receiver window since
    the last one (cleaning the log a term behind it so partitions can be
    reused), and notices the end of the stream.  ``subscriber_positions``
    are the positions of this image's subscribers; with none, nothing is
    rebuilt (Aeron stops rebuilding an image nobody reads).
``poll_status_message(now_ns) -> StatusMessageToSend | None``
    The SM to send now: one that was scheduled or requested, the first one
    (due as soon as the image exists), or a repeat every
    ``status_message_timeout_ns``.  It carries the consumption position and
    the receiver window; after the end of the stream, the EOS flag.  Taking
    it moves the receiver's window.
``poll_nak() -> NakToSend | None``
    The latest gap the loss detector asked to NAK, once.

Queries: ``hwm_position``, ``rebuild_position``, ``receiver_window_length``,
``end_of_stream_position`` (None until an EOS frame arrived),
``is_end_of_stream`` (EOS received and everything before it rebuilt),
``is_timed_out(now_ns)`` (no accepted packet for the liveness timeout).
Counts for the agent's counters: ``heartbeats_received``,
``flow_control_under_runs``, ``flow_control_over_runs``, ``invalid_packets``,
``status_messages_sent``, ``naks_sent``.

Not here (the receiver's or conductor's business): images fed by several
transports (multi-destination: which sources have ended), unreliable streams that pad over gaps
instead of NAKing, RTT measurement, congestion control beyond Aeron's static
window, image state transitions after draining.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from fulmar.driver.loss_detector import FeedbackDelayGenerator, LossDetector, StaticDelayGenerator
from fulmar.driver.term_rebuilder import insert_packet
from fulmar.frames import EOS_FLAG, FRAME_ALIGNMENT, HEADER_LENGTH, SM_EOS_FLAG
from fulmar.logbuffer import LogBuffers, compute_position, compute_term_id_from_position, index_by_position

# Aeron's defaults (Configuration.INITIAL_WINDOW_LENGTH_DEFAULT,
# STATUS_MESSAGE_TIMEOUT_DEFAULT_NS, IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS).
INITIAL_WINDOW_LENGTH_DEFAULT = 128 * 1024
STATUS_MESSAGE_TIMEOUT_DEFAULT_NS = 200_000_000
IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS = 10_000_000_000

# The status message flag telling the sender the image has seen its end of stream.
SM_END_OF_STREAM_FLAG = SM_EOS_FLAG

_FIRST_WORD = struct.Struct("<iBBh")  # frame length, version, flags, type


class PacketVerdict(Enum):
    DATA = "data"  # accepted (inserted, or already there)
    HEARTBEAT = "heartbeat"  # accepted, nothing to insert
    OVER_RUN = "over-run"  # beyond the window the last SM granted: dropped
    UNDER_RUN = "under-run"  # behind what the subscribers consumed: dropped
    INVALID = "invalid"  # malformed: dropped, nothing written


class StatusMessageToSend(NamedTuple):
    """An SM for the receiver to send; the field names are
    ``frames.encode_status_message``'s (which adds the receiver id)."""

    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    flags: int


class NakToSend(NamedTuple):
    """A NAK for the receiver to send (``frames.encode_nak``'s fields)."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int


class ImageReceiveState:
    """The receive side of one image; see the module docstring."""

    def __init__(
        self,
        log: LogBuffers,
        active_term_id: int,
        term_offset: int,
        now_ns: int,
        *,
        delay_generator: FeedbackDelayGenerator | None = None,
        initial_window_length: int = INITIAL_WINDOW_LENGTH_DEFAULT,
        status_message_timeout_ns: int = STATUS_MESSAGE_TIMEOUT_DEFAULT_NS,
        image_liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS,
    ) -> None:
        term_length = log.term_length
        if not (0 <= term_offset < term_length) or term_offset % FRAME_ALIGNMENT:
            raise ValueError(f"term offset {term_offset} is not a frame-aligned offset in a {term_length}-byte term")
        self.log = log
        self.session_id = log.session_id
        self.stream_id = log.stream_id
        self._term_length = term_length
        self._bits = log.position_bits_to_shift
        self._initial_term_id = log.initial_term_id
        join_position = compute_position(active_term_id, term_offset, self._bits, self._initial_term_id)
        if join_position < 0:
            raise ValueError(f"term id {active_term_id} is before the initial term id {self._initial_term_id}")

        # Aeron's static window: what the receiver lets the sender have in
        # flight, never more than half a term so a sender can never write
        # into the partition subscribers are still reading.
        self.receiver_window_length = min(term_length // 2, initial_window_length)
        self._status_message_timeout_ns = status_message_timeout_ns
        self._image_liveness_timeout_ns = image_liveness_timeout_ns
        self._loss_detector = LossDetector(
            log, delay_generator if delay_generator is not None else StaticDelayGenerator(), self._on_gap_detected
        )

        self.hwm_position = join_position
        self.rebuild_position = join_position
        self.end_of_stream_position: int | None = None
        self.packet_eos_position: int | None = None
        self._time_of_last_packet_ns = now_ns
        self._is_rebuilding = True
        self._sending_eos_sm = False
        log.clean_position = join_position

        # The SM last scheduled, and the one last sent: the window the sender
        # may use runs from the last sent position, so packets are checked
        # against that.  The first SM is due at once: it is what tells the
        # sender the image exists.
        self._next_sm_position = join_position
        self._sm_pending = True
        self._sm_deadline_ns = now_ns
        self._last_sm_position = join_position
        self._last_overrun_threshold = join_position + term_length // 2
        self._pending_nak: NakToSend | None = None

        self.heartbeats_received = 0
        self.flow_control_under_runs = 0
        self.flow_control_over_runs = 0
        self.invalid_packets = 0
        self.status_messages_sent = 0
        self.naks_sent = 0

    # From the network.

    def insert_packet(
        self, term_id: int, term_offset: int, datagram: bytes | bytearray | memoryview, now_ns: int,
        record_eos: bool = True,
    ) -> PacketVerdict:
        self.packet_eos_position = None
        length = len(datagram) if isinstance(datagram, bytes) else memoryview(datagram).nbytes
        if length < HEADER_LENGTH or not (0 <= term_offset < self._term_length):
            self.invalid_packets += 1
            return PacketVerdict.INVALID
        frame_length, _version, flags, _type = _FIRST_WORD.unpack_from(datagram, 0)
        is_heartbeat = length == HEADER_LENGTH and frame_length == 0
        position = compute_position(term_id, term_offset, self._bits, self._initial_term_id)
        verdict = self._window_verdict(position, length, is_heartbeat)
        # A packet wholly behind the rebuild position is a duplicate of data
        # already complete there: nothing to write (and nothing a forged
        # frame boundary could overwrite).
        if verdict is PacketVerdict.DATA and position + length > self.rebuild_position:
            result = insert_packet(self.log, index_by_position(position, self._bits), term_offset, datagram)
            if result < 0:
                self.invalid_packets += 1
                return PacketVerdict.INVALID
        if verdict is PacketVerdict.DATA or verdict is PacketVerdict.HEARTBEAT:
            is_eos = bool(flags & EOS_FLAG)
            if is_eos:
                self.packet_eos_position = position if is_heartbeat else position + length
            self._record(position, length, now_ns, is_heartbeat, is_eos and record_eos)
        return verdict

    def on_data(
        self,
        term_id: int,
        term_offset: int,
        length: int,
        now_ns: int,
        is_heartbeat: bool = False,
        is_eos: bool = False,
    ) -> PacketVerdict:
        if length < 0 or not (0 <= term_offset < self._term_length):
            self.invalid_packets += 1
            return PacketVerdict.INVALID
        position = compute_position(term_id, term_offset, self._bits, self._initial_term_id)
        verdict = self._window_verdict(position, length, is_heartbeat)
        if verdict is PacketVerdict.DATA or verdict is PacketVerdict.HEARTBEAT:
            self._record(position, length, now_ns, is_heartbeat, is_eos)
        return verdict

    def _window_verdict(self, position: int, length: int, is_heartbeat: bool) -> PacketVerdict:
        # Over-run: past half a term beyond the last SM, the packet's
        # partition could still be in use by subscribers (a sender that
        # honours our window never gets there).
        proposed_position = position if is_heartbeat else position + length
        if proposed_position > self._last_overrun_threshold:
            self.flow_control_over_runs += 1
            return PacketVerdict.OVER_RUN
        if is_heartbeat:
            # A heartbeat writes nothing, so one from up to a term behind
            # still counts as a sign of life.
            if position >= max(0, self._last_sm_position - self._term_length):
                return PacketVerdict.HEARTBEAT
        elif position >= self._last_sm_position:
            return PacketVerdict.DATA
        # Under-run: data subscribers have already consumed (its partition
        # may be cleaned or reused), or a stale heartbeat.
        self.flow_control_under_runs += 1
        return PacketVerdict.UNDER_RUN

    def _record(self, position: int, length: int, now_ns: int, is_heartbeat: bool, is_eos: bool) -> None:
        self._time_of_last_packet_ns = now_ns
        # A heartbeat says how far the sender has sent, so loss at the tail
        # of a burst shows up as a gap below the high-water mark.
        end_position = position if is_heartbeat else position + length
        if end_position > self.hwm_position:
            self.hwm_position = end_position
        if is_heartbeat:
            self.heartbeats_received += 1
        if is_eos:
            self.end_stream(end_position)

    def end_stream(self, position: int) -> None:
        if self.end_of_stream_position is None:
            self.end_of_stream_position = position
            # Subscribers' images see the end of the stream through the log.
            self.log.end_of_stream_position = position

    @property
    def has_gap(self) -> bool:
        """Loss is being NAKed (its timer runs)."""
        return self._loss_detector.active_gap is not None

    def request_status_message(self) -> None:
        self._sm_pending = True

    # Duty cycle.

    def rebuild(self, now_ns: int, subscriber_positions: Sequence[int]) -> int:
        work_count = 0
        if self._is_rebuilding and subscriber_positions:
            min_position = min(subscriber_positions)
            # A subscriber can be ahead of the rebuild position only if it
            # joined there; everything below it is not ours to rebuild.
            position = max(self.rebuild_position, max(subscriber_positions))
            # One term at most per call, as in Aeron: a scan that reaches the
            # end of a term leaves the position at the next term's start.
            found, position = self._loss_detector.scan(position, self.hwm_position, now_ns)
            work_count += found
            if position > self.rebuild_position:
                self.rebuild_position = position
                work_count += 1

            if min_position > self._next_sm_position + self.receiver_window_length // 4:
                # Subscribers have consumed a quarter window: tell the sender,
                # and zero the log a term behind them so that the partition
                # is clean when the stream comes round to it again.
                self.log.clean_to(min_position - self._term_length)
                self._next_sm_position = min_position
                self._sm_pending = True
                work_count += 1

        if not self._sending_eos_sm and self.is_end_of_stream:
            # Everything up to the end of the stream is here: the sender
            # hears so at once, and nothing more will arrive to rebuild.
            self._sending_eos_sm = True
            self._is_rebuilding = False
            self._sm_pending = True
            work_count += 1
        return work_count

    def poll_status_message(self, now_ns: int) -> StatusMessageToSend | None:
        if not self._sm_pending and now_ns - self._sm_deadline_ns <= 0:
            return None
        position = self._next_sm_position
        self._sm_pending = False
        self._sm_deadline_ns = now_ns + self._status_message_timeout_ns
        self._last_sm_position = position
        self._last_overrun_threshold = position + self._term_length // 2
        self.status_messages_sent += 1
        return StatusMessageToSend(
            self.session_id,
            self.stream_id,
            compute_term_id_from_position(position, self._bits, self._initial_term_id),
            position & (self._term_length - 1),
            self.receiver_window_length,
            SM_END_OF_STREAM_FLAG if self._sending_eos_sm else 0,
        )

    def _on_gap_detected(self, term_id: int, term_offset: int, length: int) -> None:
        # Only the latest gap matters: an older one not yet sent has either
        # been filled or is this one.
        self._pending_nak = NakToSend(self.session_id, self.stream_id, term_id, term_offset, length)

    def poll_nak(self) -> NakToSend | None:
        nak, self._pending_nak = self._pending_nak, None
        if nak is not None:
            self.naks_sent += 1
        return nak

    # Queries.

    @property
    def is_end_of_stream(self) -> bool:
        return self.end_of_stream_position is not None and self.rebuild_position >= self.end_of_stream_position

    def is_timed_out(self, now_ns: int) -> bool:
        return now_ns - self._time_of_last_packet_ns > self._image_liveness_timeout_ns
