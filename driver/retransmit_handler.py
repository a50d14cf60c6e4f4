"""Retransmission on NAKs: which NAKed ranges a publication resends, and when.

A receiver that sees a gap sends a NAK for ``(term_id, term_offset, length)``.
The sender answers as Aeron's ``RetransmitHandler`` (Java) and
``aeron_retransmit_handler.c`` (C) do:

- A NAK whose offset is outside the term is invalid: counted and ignored.
- The length is clamped by the flow control strategy
  (:meth:`~fulmar.driver.flow_control.FlowControl.max_retransmission_length`:
  at most the rest of the term and a few receiver windows).
- A NAK whose offset falls inside a range already scheduled (DELAYED) or
  recently resent (LINGERING) is suppressed: many receivers of a multicast
  stream NAK the same loss, and a receiver NAKs again before the resend lands.
- Otherwise the retransmit is scheduled after a delay from the delay generator
  (0 by default: resent at once), then lingers for the linger timeout, during
  which NAKs for it are suppressed.
- Multicast and multi-destination streams (*group semantics*) keep up to
  ``max_retransmits`` actions (``MAX_RESEND_DEFAULT`` = 16); a NAK that finds
  them all busy is dropped and counted as an overflow.  Unicast streams keep
  one: a NAK outside it replaces it (the earlier loss is taken as repaired).

The handler owns no clock and no log buffer: time comes in as ``now_ns`` and
resends go out through the ``resend(term_id, term_offset, length)`` callable.
:func:`resend_window_length` is the publication's half of the job: how much of
a range can actually be resent given the sender position.  The publication then
sends it in MTU-sized datagrams on frame boundaries
(:func:`fulmar.driver.sender_timing.pack_datagrams`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from fulmar.driver.flow_control import (
    MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE,
    UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE,
    calculate_retransmission_length,
)
from fulmar.frames import HEADER_LENGTH
from fulmar.logbuffer import compute_max_message_length, compute_position

# Aeron's Configuration.java / aeron_driver_context.c defaults.
# RETRANSMIT_UNICAST_DELAY_DEFAULT_NS / AERON_RETRANSMIT_UNICAST_DELAY_NS_DEFAULT (used for
# multicast too: "source uses same for unicast and multicast").
RETRANSMIT_UNICAST_DELAY_DEFAULT_NS = 0
# RETRANSMIT_UNICAST_LINGER_DEFAULT_NS / AERON_RETRANSMIT_UNICAST_LINGER_NS_DEFAULT (10 ms
# since Aeron 1.44; 60 ms before).
RETRANSMIT_UNICAST_LINGER_DEFAULT_NS = 10_000_000
# MAX_RESEND_DEFAULT (active retransmits per stream with group semantics) and MAX_RESEND_MAX.
MAX_RESEND_DEFAULT = 16
MAX_RESEND_MAX = 256

DelayGenerator = Callable[[], int]
"""Aeron's ``FeedbackDelayGenerator``: the next delay in nanoseconds."""

ResendFunc = Callable[[int, int, int], None]
"""``resend(term_id, term_offset, length)``: send that range of the log again."""

MaxRetransmissionLength = Callable[[int, int, int, int], int]
"""``(term_offset, resend_length, term_length, mtu) -> length``, as ``FlowControl.max_retransmission_length``."""


def static_delay(delay_ns: int) -> DelayGenerator:
    """A generator that always answers ``delay_ns`` (``StaticDelayGenerator``)."""
    if delay_ns < 0:
        raise ValueError(f"a delay cannot be negative: {delay_ns} ns")
    return lambda: delay_ns


@dataclass
class RetransmitStats:
    """What a handler has done, for counters.  Share one between handlers to aggregate."""

    naks_received: int = 0  # every NAK handed to on_nak (Aeron's snd-naks-received)
    invalid_naks: int = 0  # offset outside the term, or no length (INVALID_PACKETS)
    naks_suppressed: int = 0  # inside a range already scheduled or lingering
    retransmit_overflows: int = 0  # dropped: all actions busy (RETRANSMIT_OVERFLOW)
    retransmits_sent: int = 0  # resend() calls made


class RetransmitState(Enum):
    INACTIVE = 0
    DELAYED = 1
    LINGERING = 2


@dataclass(slots=True)
class RetransmitAction:
    state: RetransmitState = RetransmitState.INACTIVE
    term_id: int = 0
    term_offset: int = 0
    length: int = 0
    expiry_ns: int = 0

    def covers(self, term_id: int, term_offset: int) -> bool:
        return self.term_id == term_id and self.term_offset <= term_offset < self.term_offset + self.length


class RetransmitHandler:
    """NAK handling for one network publication."""

    def __init__(
        self,
        *,
        has_group_semantics: bool,
        max_retransmits: int = MAX_RESEND_DEFAULT,
        delay_generator: DelayGenerator | None = None,
        linger_generator: DelayGenerator | None = None,
        max_retransmission_length: MaxRetransmissionLength | None = None,
        stats: RetransmitStats | None = None,
    ) -> None:
        """``max_retransmission_length`` is normally the publication's flow control
        ``max_retransmission_length``; by default the one of the default strategy
        (max for group semantics, unicast otherwise)."""
        if not 1 <= max_retransmits <= MAX_RESEND_MAX:
            raise ValueError(f"max retransmits must be from 1 to {MAX_RESEND_MAX}, not {max_retransmits}")
        self.has_group_semantics = has_group_semantics
        self._delay_generator = delay_generator or static_delay(RETRANSMIT_UNICAST_DELAY_DEFAULT_NS)
        self._linger_generator = linger_generator or static_delay(RETRANSMIT_UNICAST_LINGER_DEFAULT_NS)
        if max_retransmission_length is None:
            multiple = (
                MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE
                if has_group_semantics
                else UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE
            )

            def default_length(term_offset: int, resend_length: int, term_length: int, mtu: int) -> int:
                return calculate_retransmission_length(resend_length, term_length, term_offset, multiple)

            max_retransmission_length = default_length
        self._max_retransmission_length = max_retransmission_length
        self.stats = stats if stats is not None else RetransmitStats()
        # Unicast keeps a single action (Aeron: "a single outstanding retransmit is permitted").
        pool_size = max_retransmits if has_group_semantics else 1
        self._actions = [RetransmitAction() for _ in range(pool_size)]
        self._active_count = 0

    @property
    def active_count(self) -> int:
        """Retransmits scheduled or lingering."""
        return self._active_count

    def active(self) -> list[RetransmitAction]:
        """The scheduled and lingering actions (copies, for observability and tests)."""
        return [
            RetransmitAction(a.state, a.term_id, a.term_offset, a.length, a.expiry_ns)
            for a in self._actions
            if a.state is not RetransmitState.INACTIVE
        ]

    def on_nak(
        self,
        term_id: int,
        term_offset: int,
        length: int,
        term_length: int,
        mtu: int,
        now_ns: int,
        resend: ResendFunc,
    ) -> None:
        """A NAK arrived: schedule, resend at once, or ignore it."""
        self.stats.naks_received += 1
        # Aeron rejects only the offset; a NAK without length would occupy an
        # action and resend nothing, so it is rejected here too.
        if term_offset < 0 or term_offset > term_length - HEADER_LENGTH or length <= 0:
            self.stats.invalid_naks += 1
            return

        retransmit_length = self._max_retransmission_length(term_offset, length, term_length, mtu)
        action = self._claim_action(term_id, term_offset)
        if action is None:
            return
        action.term_id = term_id
        action.term_offset = term_offset
        action.length = retransmit_length

        delay_ns = self._delay_generator()
        if delay_ns == 0:
            self._resend(action, resend)
            self._linger(action, now_ns)
        else:
            action.state = RetransmitState.DELAYED
            action.expiry_ns = now_ns + delay_ns

    def process_timeouts(self, now_ns: int, resend: ResendFunc) -> int:
        """Send the retransmits whose delay has passed; free those whose linger has. Returns how many changed."""
        work_count = 0
        if self._active_count == 0:
            return work_count
        for action in self._actions:
            # Expired strictly after the deadline, as Aeron's ``expiryNs - nowNs < 0``.
            if action.state is RetransmitState.INACTIVE or action.expiry_ns - now_ns >= 0:
                continue
            if action.state is RetransmitState.DELAYED:
                self._resend(action, resend)
                self._linger(action, now_ns)
            else:
                self._release(action)
            work_count += 1
        return work_count

    def _claim_action(self, term_id: int, term_offset: int) -> RetransmitAction | None:
        """The action a NAK may use, or None when it is suppressed or there is no room (``scanForAvailableRetransmit``)."""
        if self._active_count == 0:
            self._active_count += 1
            return self._actions[0]

        available = None
        for action in self._actions:
            if action.state is RetransmitState.INACTIVE:
                if available is None:
                    available = action
            elif action.covers(term_id, term_offset):
                self.stats.naks_suppressed += 1
                return None
            elif not self.has_group_semantics:
                # Unicast, and the NAK is outside the one action: take its place.
                available = action

        if not self.has_group_semantics:
            return available
        if available is None:
            self.stats.retransmit_overflows += 1
            return None
        self._active_count += 1
        return available

    def _resend(self, action: RetransmitAction, resend: ResendFunc) -> None:
        self.stats.retransmits_sent += 1
        resend(action.term_id, action.term_offset, action.length)

    def _linger(self, action: RetransmitAction, now_ns: int) -> None:
        action.state = RetransmitState.LINGERING
        action.expiry_ns = now_ns + self._linger_generator()

    def _release(self, action: RetransmitAction) -> None:
        action.state = RetransmitState.INACTIVE
        self._active_count -= 1


def resend_window_length(
    term_id: int,
    term_offset: int,
    length: int,
    sender_position: int,
    initial_term_id: int,
    position_bits_to_shift: int,
) -> int:
    """How much of a retransmit range the publication can resend now (0: none).

    Only data the sender has already sent is resent, and only while it is still
    in the log: the range must start at or after ``sender_position - term/2 -
    max message length`` (older data may be cleaned for reuse; Java's
    ``NetworkPublication.resend`` bound) and before the sender position.  The
    length is cut at the sender position.
    """
    term_length = 1 << position_bits_to_shift
    resend_position = compute_position(term_id, term_offset, position_bits_to_shift, initial_term_id)
    bottom_resend_window = sender_position - (term_length >> 1) - compute_max_message_length(term_length)
    if not bottom_resend_window <= resend_position < sender_position:
        return 0
    return max(0, min(length, sender_position - resend_position))
