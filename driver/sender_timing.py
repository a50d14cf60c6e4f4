"""The sender's clockwork for one network publication, and what it may send now.

Timing, as Aeron's ``NetworkPublication`` (Java) and ``aeron_network_publication.c``:

- SETUP frames go out every ``PUBLICATION_SETUP_TIMEOUT_NS`` until the first
  status message arrives, and again whenever a receiver asks for one (a status
  message with the SEND_SETUP flag), until receivers are live again.
- After the first status message, a heartbeat (a DATA header with
  ``frame_length`` 0) goes out when no data or heartbeat has been sent for
  ``PUBLICATION_HEARTBEAT_TIMEOUT_NS``, so receivers know the stream is alive
  and where its tail is.
- A receiver is live while its status messages arrive within the connection
  timeout (``PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS``); the publication is
  connected while some receiver is live and the flow control has its required
  group.

Sending, as Aeron's ``TermScanner.scanForAvailability``: the sender may send the
committed frames in ``[sender_position, min(producer_position, sender_limit))``,
each datagram at most an MTU of whole frames.  A padding frame (the filler at a
term's end) is sent as its header alone and ends the term.  :func:`pack_datagrams`
does the packing over a frame lookup, so it is a pure function.

Nothing here reads a clock or touches a socket: time is ``now_ns``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import IntEnum
from typing import NamedTuple

from fulmar.errors import CorruptFrameError
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH, align

# Aeron's Configuration.java / aeron_driver_context.c.
PUBLICATION_SETUP_TIMEOUT_NS = 100_000_000  # PUBLICATION_SETUP_TIMEOUT_NS
PUBLICATION_HEARTBEAT_TIMEOUT_NS = 100_000_000  # PUBLICATION_HEARTBEAT_TIMEOUT_NS
PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS = 5_000_000_000  # PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS


class ReceiverLivenessTracker:
    """The receivers that sent a status message within the connection timeout (``ReceiverLivenessTracker``)."""

    def __init__(self) -> None:
        self._last_status_message_ns: dict[int, int] = {}

    def has_receivers(self) -> bool:
        return bool(self._last_status_message_ns)

    @property
    def receiver_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._last_status_message_ns))

    def on_status_message(self, receiver_id: int, now_ns: int) -> None:
        self._last_status_message_ns[receiver_id] = now_ns

    def on_remote_close(self, receiver_id: int) -> bool:
        """The receiver said end of stream or sent an error; True if it was live."""
        return self._last_status_message_ns.pop(receiver_id, None) is not None

    def on_idle(self, now_ns: int, timeout_ns: int) -> None:
        """Forget receivers silent for ``timeout_ns`` or more."""
        threshold_ns = now_ns - timeout_ns
        for receiver_id, last_ns in list(self._last_status_message_ns.items()):
            if last_ns <= threshold_ns:
                del self._last_status_message_ns[receiver_id]


class SetupDue(IntEnum):
    """Whether a SETUP frame is due; ``ELICITED`` means a receiver asked for it, so the
    flow control's ``on_setup`` must see it before it is sent.  ``NO`` is falsy."""

    NO = 0
    INITIAL = 1
    ELICITED = 2


class SenderTiming:
    """SETUP, heartbeat and connection state of one network publication.

    The sender's duty cycle for a publication, as Aeron's ``send(nowNs)``::

        due = timing.setup_due(now_ns)
        if due:
            if due is SetupDue.ELICITED:
                sender_limit = flow_control.on_setup(...)
            send SETUP
        send data; if any: timing.on_data_sent(now_ns)
        else:
            if timing.heartbeat_due(now_ns): send heartbeat
            sender_limit = flow_control.on_idle(...)
            timing.on_idle(now_ns)
    """

    def __init__(
        self,
        now_ns: int,
        *,
        connection_timeout_ns: int = PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS,
        setup_timeout_ns: int = PUBLICATION_SETUP_TIMEOUT_NS,
        heartbeat_timeout_ns: int = PUBLICATION_HEARTBEAT_TIMEOUT_NS,
        initial_setup_interval_ns: int | None = None,
    ) -> None:
        self.connection_timeout_ns = connection_timeout_ns
        self.setup_timeout_ns = setup_timeout_ns
        # Until a first status message, SETUP goes again after this interval,
        # doubling up to the setup timeout (None: the setup timeout, Aeron's
        # pace).  A receiver that subscribes just after the first SETUP (a
        # follower joining a new leader's log) then connects in milliseconds
        # rather than a setup timeout later; the extra SETUPs are harmless.
        self._setup_interval_ns = min(initial_setup_interval_ns or setup_timeout_ns, setup_timeout_ns)
        self._initial_setups_sent = 0
        self.heartbeat_timeout_ns = heartbeat_timeout_ns
        # Both are due at once on the first check.
        self.time_of_last_setup_ns = now_ns - setup_timeout_ns - 1
        self.time_of_last_data_or_heartbeat_ns = now_ns - heartbeat_timeout_ns - 1
        self.time_of_last_status_message_ns: int | None = None
        self.has_initial_connection = False
        self.is_setup_elicited = False
        self.has_receivers = False
        self.liveness = ReceiverLivenessTracker()

    # --- what receivers tell us ---
    def on_status_message(self, receiver_id: int, is_eos: bool, now_ns: int) -> bool:
        """A status message arrived (``is_eos``: its END_OF_STREAM flag).  True when it made receivers live."""
        if is_eos:
            self.liveness.on_remote_close(receiver_id)
        else:
            self.liveness.on_status_message(receiver_id, now_ns)
        had_receivers = self.has_receivers
        self.has_receivers = self.liveness.has_receivers()
        self.has_initial_connection = True
        self.time_of_last_status_message_ns = now_ns
        return self.has_receivers and not had_receivers

    def on_trigger_send_setup(self, now_ns: int, is_end_of_stream: bool = False) -> None:
        """A status message with SEND_SETUP arrived; ignored once the publication is at end of stream."""
        if not is_end_of_stream:
            self.time_of_last_status_message_ns = now_ns
            self.is_setup_elicited = True

    def on_error(self, receiver_id: int) -> bool:
        """An ERR frame arrived from a receiver: it is gone.  True if it was live."""
        was_live = self.liveness.on_remote_close(receiver_id)
        self.has_receivers = self.liveness.has_receivers()
        return was_live

    # --- what to send ---
    def setup_due(self, now_ns: int) -> SetupDue:
        """Is a SETUP frame due now?  If so the caller sends one; the send is recorded here."""
        if self.has_initial_connection and not self.is_setup_elicited:
            return SetupDue.NO
        # (A destination added to a manual MDC publication elicits SETUP too:
        # the fast pace holds whatever asked, until a first status message.)
        backing_off = not self.has_initial_connection
        interval = self._setup_interval_ns if backing_off else self.setup_timeout_ns
        if self.time_of_last_setup_ns + interval - now_ns >= 0:
            return SetupDue.NO
        self.time_of_last_setup_ns = now_ns
        due = SetupDue.ELICITED if self.is_setup_elicited else SetupDue.INITIAL
        if backing_off:
            if self._initial_setups_sent:
                self._setup_interval_ns = min(2 * self._setup_interval_ns, self.setup_timeout_ns)
            self._initial_setups_sent += 1
        if self.is_setup_elicited and self.has_receivers:
            self.is_setup_elicited = False
        return due

    @property
    def setup_backing_off(self) -> bool:
        """SETUPs still go faster than the setup timeout (no receiver has answered yet)."""
        return not self.has_initial_connection and self._setup_interval_ns < self.setup_timeout_ns

    def heartbeat_due(self, now_ns: int) -> bool:
        """Is a heartbeat due (asked only when no data went out)?  If so the caller sends one; recorded here."""
        if not self.has_initial_connection:
            return False
        if self.time_of_last_data_or_heartbeat_ns + self.heartbeat_timeout_ns - now_ns >= 0:
            return False
        self.time_of_last_data_or_heartbeat_ns = now_ns
        return True

    def on_data_sent(self, now_ns: int) -> None:
        self.time_of_last_data_or_heartbeat_ns = now_ns

    def on_idle(self, now_ns: int) -> None:
        """Forget receivers whose status messages stopped (``updateHasReceivers``)."""
        self.liveness.on_idle(now_ns, self.connection_timeout_ns)
        self.has_receivers = self.liveness.has_receivers()

    def is_connected(self, has_required_receivers: bool = True) -> bool:
        """Connected: a receiver is live and the flow control has its required group."""
        return self.has_receivers and has_required_receivers


# --- the send window and datagram packing ---------------------------------------------

FrameAt = Callable[[int], tuple[int, bool]]
"""``frame_at(term_offset) -> (frame_length, is_padding)`` of the frame starting there;
a ``frame_length`` of 0 or less means nothing committed there yet."""


class TermFrame(NamedTuple):
    term_offset: int
    frame_length: int  # as in the header (not aligned)
    is_padding: bool = False


def frame_reader(frames: Iterable[TermFrame | tuple[int, int] | tuple[int, int, bool]]) -> FrameAt:
    """A :data:`FrameAt` over known frames: ``(term_offset, frame_length[, is_padding])``."""
    table: dict[int, tuple[int, bool]] = {}
    for frame in frames:
        term_offset, frame_length = frame[0], frame[1]
        table[term_offset] = (frame_length, bool(frame[2]) if len(frame) > 2 else False)
    return lambda term_offset: table.get(term_offset, (0, False))


class Availability(NamedTuple):
    """Result of a scan: ``available`` bytes to send, then ``padding`` bytes to skip.

    A negative ``available`` means the first frame (``-available`` bytes
    aligned) does not fit in the scan's length.
    """

    available: int
    padding: int


def scan_for_availability(frame_at: FrameAt, term_offset: int, max_length: int, term_length: int) -> Availability:
    """Whole committed frames from ``term_offset``, at most ``max_length`` bytes and not past the term (``TermScanner``)."""
    limit = min(max_length, term_length - term_offset)
    available = 0
    padding = 0
    while True:
        frame_length, is_padding = frame_at(term_offset + available)
        if frame_length <= 0:
            break
        aligned_frame_length = align(frame_length, FRAME_ALIGNMENT)
        if is_padding:
            # Only the padding frame's header travels; the rest is skipped.
            padding = aligned_frame_length - HEADER_LENGTH
            aligned_frame_length = HEADER_LENGTH
        available += aligned_frame_length
        if available > limit:
            available = -available if aligned_frame_length == available else available - aligned_frame_length
            padding = 0
            break
        if padding != 0 or available >= limit:
            break
    return Availability(available, padding)


class Datagram(NamedTuple):
    """``length`` bytes of the term from ``term_offset``, one datagram of whole frames.

    ``padding`` is the rest of a padding frame that ends it: skipped, not sent.
    The sender position advances by ``length + padding``.
    """

    term_offset: int
    length: int
    padding: int = 0

    @property
    def advance(self) -> int:
        return self.length + self.padding


def sendable_length(sender_position: int, sender_limit: int, producer_position: int) -> int:
    """Bytes the sender may send now: ``[sender_position, min(producer_position, sender_limit))``."""
    return max(0, min(producer_position, sender_limit) - sender_position)


def pack_datagrams(
    frame_at: FrameAt,
    term_offset: int,
    max_length: int,
    mtu: int,
    term_length: int,
    max_datagrams: int | None = None,
) -> list[Datagram]:
    """Split up to ``max_length`` bytes of committed frames from ``term_offset`` into datagrams.

    Every datagram holds whole frames, at most ``mtu`` bytes; the datagrams are
    contiguous and stop at the first uncommitted frame, at the first frame that
    does not fit in what is left of ``max_length``, at the term's end, or after
    ``max_datagrams``.  Raises :class:`CorruptFrameError` if the first frame is
    longer than the MTU (publications fragment messages to fit it, so such a
    frame can never be sent).
    """
    datagrams: list[Datagram] = []
    offset = term_offset
    remaining = min(max_length, term_length - term_offset)
    while remaining > 0 and (max_datagrams is None or len(datagrams) < max_datagrams):
        available, padding = scan_for_availability(frame_at, offset, min(mtu, remaining), term_length)
        if available <= 0:
            if -available > mtu and not datagrams:
                raise CorruptFrameError(
                    f"frame at term offset {offset} is {-available} bytes aligned, longer than the MTU {mtu}"
                )
            break
        datagrams.append(Datagram(offset, available, padding))
        offset += available + padding
        remaining -= available + padding
    return datagrams


class SendPlan(NamedTuple):
    datagrams: list[Datagram]
    # The window held data back (Aeron counts these as sender flow control limits).
    is_flow_control_limited: bool

    @property
    def advance(self) -> int:
        """How far the sender position moves once every datagram is sent."""
        return sum(datagram.advance for datagram in self.datagrams)


def plan_send(
    frame_at: FrameAt,
    sender_position: int,
    sender_limit: int,
    producer_position: int,
    mtu: int,
    term_length: int,
    max_datagrams: int | None = None,
) -> SendPlan:
    """The datagrams to send now from ``sender_position`` within the flow control window.

    Stops at the end of the sender position's term; the next call starts the
    next term.  ``frame_at`` reads the term that ``sender_position`` is in.
    """
    window = sender_limit - sender_position
    if window <= 0:
        return SendPlan([], True)
    term_offset = sender_position & (term_length - 1)
    length = sendable_length(sender_position, sender_limit, producer_position)
    datagrams = pack_datagrams(frame_at, term_offset, length, mtu, term_length, max_datagrams)
    sent = sum(datagram.advance for datagram in datagrams)
    # Limited when a committed frame is next but does not fit in the window.
    next_offset = term_offset + sent
    limited = False
    if next_offset < term_length and (max_datagrams is None or len(datagrams) < max_datagrams):
        frame_length, is_padding = frame_at(next_offset)
        needed = HEADER_LENGTH if is_padding else align(frame_length, FRAME_ALIGNMENT)
        limited = frame_length > 0 and needed > window - sent
    return SendPlan(datagrams, limited)
