"""Sender flow control: how far a network publication may send, given its receivers' status messages.

Every receiver of a UDP stream reports, in its STATUS MESSAGEs, how far it has
consumed (``consumption_term_id`` / ``consumption_term_offset``) and how much
more it can take (``receiver_window``).  A strategy turns those reports into
the *sender limit*: the stream position the sender may not send beyond.  The
strategies, their defaults and their corner cases follow Aeron's driver
(``UnicastFlowControl``, ``MaxMulticastFlowControl``,
``AbstractMinMulticastFlowControl`` / ``MinMulticastFlowControl`` /
``TaggedMulticastFlowControl`` in Java, ``aeron_flow_control.c`` and
``aeron_min_flow_control.c`` in C):

- :class:`UnicastFlowControl` (unicast channels) and :class:`MaxFlowControl`
  (``fc=max``, the default for multicast and multi-destination channels): the
  limit is the furthest right edge (position + window) any status message has
  reported; it never moves back.
- :class:`MinFlowControl` (``fc=min[,g:/min-size][,t:timeout]``): the slowest
  receiver's right edge.  Receivers are tracked by ``receiver_id`` while their
  status messages keep coming; one that is silent for the receiver timeout, or
  says end of stream, is dropped.  Until ``min-size`` receivers are tracked the
  limit does not move and :meth:`FlowControl.has_required_receivers` is false,
  so the publication does not count as connected.
- :class:`TaggedFlowControl` (``fc=tagged[,g:tag[/min-size]][,t:timeout]``): the
  same over only the receivers whose status messages carry the group tag.

The objects own no clock and no socket: every call takes ``now_ns``.  Positions
are Python ints (Aeron's are int64; nothing here comes near that range).
"""

from __future__ import annotations

import ipaddress
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

from fulmar.channel_uri import (
    CONTROL_MODE_DYNAMIC,
    CONTROL_MODE_MANUAL,
    CONTROL_PARAM,
    FLOW_CONTROL_MAX,
    FLOW_CONTROL_MIN,
    FLOW_CONTROL_PARAM,
    FLOW_CONTROL_TAGGED,
    ChannelUri,
    InvalidChannelError,
)
from fulmar.logbuffer import compute_position

# Defaults (Aeron's Configuration.java / aeron_driver_context.c).
# FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS / AERON_FLOW_CONTROL_RECEIVER_TIMEOUT_NS_DEFAULT.
FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS = 5_000_000_000
# aeron.flow.control.group.tag / AERON_FLOW_CONTROL_GROUP_TAG_DEFAULT.
FLOW_CONTROL_GROUP_TAG_DEFAULT = -1
# aeron.flow.control.group.min.size / AERON_FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT.
FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT = 0
# INITIAL_WINDOW_LENGTH_DEFAULT / AERON_RCV_INITIAL_WINDOW_LENGTH_DEFAULT: the
# receiver window a retransmission estimate is based on.
INITIAL_WINDOW_LENGTH_DEFAULT = 128 * 1024

# How many receiver windows one retransmission may cover (aeron_flow_control.h:
# AERON_UNICAST_/MAX_/MIN_FLOW_CONTROL_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE).
UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE = 16
MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE = 4
MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE = 16

# "No limit" in a minimum, as Aeron's INT64_MAX.
_NO_LIMIT = (1 << 63) - 1


def receiver_window_length(term_length: int, initial_window_length: int = INITIAL_WINDOW_LENGTH_DEFAULT) -> int:
    """The window a receiver advertises: the initial window, at most half a term (``Configuration.receiverWindowLength``)."""
    return min(initial_window_length, term_length >> 1)


def calculate_retransmission_length(
    resend_length: int, term_length: int, term_offset: int, retransmit_receiver_window_multiple: int
) -> int:
    """How much of a NAKed range one retransmission covers (``FlowControl.calculateRetransmissionLength``).

    The least of what was asked, what is left of the term, and a number of
    receiver windows: a retransmission is never larger than receivers can take.
    """
    estimated_retransmit_length = receiver_window_length(term_length) * retransmit_receiver_window_multiple
    return min(resend_length, term_length - term_offset, estimated_retransmit_length)


class ReceiverStatus(NamedTuple):
    """What a strategy knows about one receiver (a snapshot, for observability)."""

    receiver_id: int
    position: int  # the furthest consumption position it has reported
    position_plus_window: int  # its right edge in its latest status message
    time_of_last_status_message_ns: int
    eos_flagged: bool


@dataclass(slots=True)
class _Receiver:
    receiver_id: int
    position: int
    position_plus_window: int
    time_of_last_status_message_ns: int
    eos_flagged: bool = False

    def status(self) -> ReceiverStatus:
        return ReceiverStatus(
            self.receiver_id,
            self.position,
            self.position_plus_window,
            self.time_of_last_status_message_ns,
            self.eos_flagged,
        )


class FlowControl(ABC):
    """A sender flow control strategy (Aeron's ``FlowControl`` interface).

    ``group_tag`` arguments are the optional 8-byte group tag of the frame
    (``None`` when the frame has none).  Every method returning a limit takes
    the current ``sender_limit`` and returns the new one.
    """

    retransmit_receiver_window_multiple: int
    receiver_timeout_ns: int

    def __init__(self, receiver_timeout_ns: int, retransmit_receiver_window_multiple: int) -> None:
        if receiver_timeout_ns < 0:
            raise ValueError(f"receiver timeout must not be negative, not {receiver_timeout_ns} ns")
        if retransmit_receiver_window_multiple <= 0:
            raise ValueError(
                f"retransmit receiver window multiple must be positive, not {retransmit_receiver_window_multiple}"
            )
        self.receiver_timeout_ns = receiver_timeout_ns
        self.retransmit_receiver_window_multiple = retransmit_receiver_window_multiple
        self._receivers: dict[int, _Receiver] = {}

    @abstractmethod
    def on_status_message(
        self,
        consumption_term_id: int,
        consumption_term_offset: int,
        receiver_window: int,
        receiver_id: int,
        group_tag: int | None,
        sender_limit: int,
        initial_term_id: int,
        position_bits_to_shift: int,
        now_ns: int,
        is_eos: bool = False,
    ) -> int:
        """A status message arrived; ``is_eos`` is its END_OF_STREAM flag (the receiver is going away)."""

    @abstractmethod
    def on_idle(self, now_ns: int, sender_limit: int, sender_position: int, is_eos: bool) -> int:
        """Periodic upkeep (receiver timeouts) when the sender has nothing to send."""

    def on_trigger_send_setup(self, receiver_id: int, group_tag: int | None, now_ns: int) -> None:
        """A status message with the SEND_SETUP flag arrived: a receiver asks for a SETUP frame."""

    def on_setup(self, sender_limit: int, sender_position: int, position_bits_to_shift: int, now_ns: int) -> int:
        """An elicited SETUP frame is about to be sent."""
        return sender_limit

    def on_error(self, receiver_id: int, group_tag: int | None, now_ns: int) -> None:
        """An ERR frame arrived from a receiver."""

    def has_required_receivers(self) -> bool:
        """Are enough receivers present for the publication to count as connected?"""
        return True

    def max_retransmission_length(self, term_offset: int, resend_length: int, term_length: int, mtu: int) -> int:
        """The most one NAK may have retransmitted (``FlowControl.maxRetransmissionLength``; ``mtu`` is unused, as in Aeron)."""
        return calculate_retransmission_length(
            resend_length, term_length, term_offset, self.retransmit_receiver_window_multiple
        )

    # --- observability ---
    @property
    def receiver_count(self) -> int:
        return len(self._receivers)

    def receivers(self) -> tuple[ReceiverStatus, ...]:
        """The receivers currently known, ordered by receiver id."""
        return tuple(self._receivers[key].status() for key in sorted(self._receivers))


class MaxFlowControl(FlowControl):
    """The furthest right edge any receiver reported (``MaxMulticastFlowControl``).

    Receivers do not affect one another: the limit only ever grows, and a slow
    receiver is left to recover what it misses by NAKs or drop out.  Receivers
    are remembered only for observability (forgotten after the receiver timeout
    or an end-of-stream status message); they never change the limit.
    """

    def __init__(
        self,
        receiver_timeout_ns: int = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS,
        retransmit_receiver_window_multiple: int = MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE,
    ) -> None:
        super().__init__(receiver_timeout_ns, retransmit_receiver_window_multiple)

    def on_status_message(
        self,
        consumption_term_id: int,
        consumption_term_offset: int,
        receiver_window: int,
        receiver_id: int,
        group_tag: int | None,
        sender_limit: int,
        initial_term_id: int,
        position_bits_to_shift: int,
        now_ns: int,
        is_eos: bool = False,
    ) -> int:
        position = compute_position(
            consumption_term_id, consumption_term_offset, position_bits_to_shift, initial_term_id
        )
        position_plus_window = position + receiver_window
        self._observe(receiver_id, position, position_plus_window, now_ns, is_eos)
        return max(sender_limit, position_plus_window)

    def on_idle(self, now_ns: int, sender_limit: int, sender_position: int, is_eos: bool) -> int:
        for receiver_id, receiver in list(self._receivers.items()):
            if receiver.time_of_last_status_message_ns + self.receiver_timeout_ns - now_ns < 0:
                del self._receivers[receiver_id]
        return sender_limit

    def _observe(self, receiver_id: int, position: int, position_plus_window: int, now_ns: int, is_eos: bool) -> None:
        if is_eos:
            self._receivers.pop(receiver_id, None)
            return
        receiver = self._receivers.get(receiver_id)
        if receiver is None:
            self._receivers[receiver_id] = _Receiver(receiver_id, position, position_plus_window, now_ns)
        else:
            receiver.position = max(receiver.position, position)
            receiver.position_plus_window = position_plus_window
            receiver.time_of_last_status_message_ns = now_ns


class UnicastFlowControl(MaxFlowControl):
    """The one receiver of a unicast channel: its right edge (``UnicastFlowControl``).

    The same rule as :class:`MaxFlowControl` (the limit never moves back, so a
    late, reordered status message cannot shrink it); only the retransmission
    allowance differs.
    """

    def __init__(
        self,
        receiver_timeout_ns: int = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS,
        retransmit_receiver_window_multiple: int = UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE,
    ) -> None:
        super().__init__(receiver_timeout_ns, retransmit_receiver_window_multiple)


class MinFlowControl(FlowControl):
    """The slowest tracked receiver's right edge (``AbstractMinMulticastFlowControl`` / ``MinMulticastFlowControl``).

    Rules, as Aeron's:

    - A status message from a tracked receiver updates its right edge (which
      may move back: a receiver may shrink its window) and its last-seen time.
    - An unknown receiver joins unless its message says end of stream, or it is
      so far behind that its right edge is below the current minimum by more
      than its own window (a receiver that stale would stall everyone; it must
      catch up first).
    - On a status message the limit is ``max(sender_limit, min of right
      edges)``: it never moves back there.  :meth:`on_idle` drops receivers
      silent for the receiver timeout or flagged end of stream, and returns
      the minimum itself, so the limit does fall back to the slowest receiver.
    - With fewer than ``group_min_size`` receivers the limit is left as it is;
      with none (and no minimum size) the message's own right edge is used.
    - When a receiver asks for a SETUP (it is joining), the limit at the time
      the elicited SETUP goes out caps the minimum until a receiver joins or the
      receiver timeout passes, so the sender does not run ahead of the newcomer.
    """

    def __init__(
        self,
        receiver_timeout_ns: int = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS,
        group_min_size: int = FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT,
        retransmit_receiver_window_multiple: int = MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE,
    ) -> None:
        super().__init__(receiver_timeout_ns, retransmit_receiver_window_multiple)
        if group_min_size < 0:
            raise ValueError(f"group min size must not be negative, not {group_min_size}")
        self.group_min_size = group_min_size
        self._time_of_last_setup_ns = 0
        self._last_setup_sender_limit: int | None = None
        self._has_tagged_status_message_triggered_setup = False

    def _matches_tag(self, group_tag: int | None) -> bool:
        """Does a frame with this group tag come from a member of the group?  Every receiver is, for min."""
        return True

    def has_required_receivers(self) -> bool:
        return len(self._receivers) >= self.group_min_size

    def on_status_message(
        self,
        consumption_term_id: int,
        consumption_term_offset: int,
        receiver_window: int,
        receiver_id: int,
        group_tag: int | None,
        sender_limit: int,
        initial_term_id: int,
        position_bits_to_shift: int,
        now_ns: int,
        is_eos: bool = False,
    ) -> int:
        position = compute_position(
            consumption_term_id, consumption_term_offset, position_bits_to_shift, initial_term_id
        )
        position_plus_window = position + receiver_window
        matches_tag = self._matches_tag(group_tag)
        min_position = self._setup_limit(now_ns)

        receiver = self._receivers.get(receiver_id) if matches_tag else None
        if receiver is not None:
            receiver.eos_flagged = is_eos
            receiver.position = max(receiver.position, position)
            receiver.position_plus_window = position_plus_window
            receiver.time_of_last_status_message_ns = now_ns
        for tracked in self._receivers.values():
            min_position = min(min_position, tracked.position_plus_window)

        if (
            receiver is None
            and matches_tag
            and not is_eos
            and (not self._receivers or position_plus_window >= min_position - receiver_window)
        ):
            self._receivers[receiver_id] = _Receiver(receiver_id, position, position_plus_window, now_ns)
            min_position = min(min_position, position_plus_window)
            self._last_setup_sender_limit = None

        if len(self._receivers) < self.group_min_size:
            return sender_limit
        if not self._receivers:
            return max(sender_limit, position_plus_window)
        return max(sender_limit, min_position)

    def on_idle(self, now_ns: int, sender_limit: int, sender_position: int, is_eos: bool) -> int:
        min_limit_position = self._setup_limit(now_ns)
        for receiver_id, receiver in list(self._receivers.items()):
            if receiver.time_of_last_status_message_ns + self.receiver_timeout_ns - now_ns < 0 or receiver.eos_flagged:
                del self._receivers[receiver_id]
            else:
                min_limit_position = min(min_limit_position, receiver.position_plus_window)

        if not self._receivers or len(self._receivers) < self.group_min_size:
            return sender_limit
        return min_limit_position

    def on_trigger_send_setup(self, receiver_id: int, group_tag: int | None, now_ns: int) -> None:
        if not self._has_tagged_status_message_triggered_setup:
            self._has_tagged_status_message_triggered_setup = self._matches_tag(group_tag)

    def on_setup(self, sender_limit: int, sender_position: int, position_bits_to_shift: int, now_ns: int) -> int:
        if self._has_tagged_status_message_triggered_setup and self._receivers:
            self._time_of_last_setup_ns = now_ns
            self._last_setup_sender_limit = sender_limit
        self._has_tagged_status_message_triggered_setup = False
        return sender_limit

    def on_error(self, receiver_id: int, group_tag: int | None, now_ns: int) -> None:
        # The receiver is gone (it rejected the stream): drop it at the next idle.
        receiver = self._receivers.get(receiver_id)
        if receiver is not None and self._matches_tag(group_tag):
            receiver.eos_flagged = True

    def _setup_limit(self, now_ns: int) -> int:
        """The limit at the last elicited SETUP, while it still applies; otherwise no limit."""
        if self._last_setup_sender_limit is not None:
            if self._time_of_last_setup_ns + self.receiver_timeout_ns - now_ns < 0:
                self._last_setup_sender_limit = None
            else:
                return self._last_setup_sender_limit
        return _NO_LIMIT


class TaggedFlowControl(MinFlowControl):
    """The slowest right edge among receivers whose status messages carry ``group_tag`` (``TaggedMulticastFlowControl``).

    Receivers without the tag are never tracked.  While no tagged receiver is
    tracked and no minimum group size is set, an untagged status message still
    moves the limit to its right edge (as Aeron does), so a stream with only
    untagged receivers is not stuck.
    """

    def __init__(
        self,
        group_tag: int = FLOW_CONTROL_GROUP_TAG_DEFAULT,
        receiver_timeout_ns: int = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS,
        group_min_size: int = FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT,
        retransmit_receiver_window_multiple: int = MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE,
    ) -> None:
        super().__init__(receiver_timeout_ns, group_min_size, retransmit_receiver_window_multiple)
        self.group_tag = group_tag

    def _matches_tag(self, group_tag: int | None) -> bool:
        return group_tag is not None and group_tag == self.group_tag


# --- choosing a strategy ------------------------------------------------------------


def has_group_semantics(uri: ChannelUri) -> bool:
    """Multicast or multi-destination (MDC): many receivers may answer one publication.

    As ``aeron_default_multicast_flow_control_strategy_supplier``: a multicast
    endpoint, an explicit ``control`` address, or ``control-mode`` manual or
    dynamic.  A host name endpoint counts as unicast (it is not resolved here).
    """
    if CONTROL_PARAM in uri or uri.control_mode() in (CONTROL_MODE_MANUAL, CONTROL_MODE_DYNAMIC):
        return True
    endpoint = uri.endpoint()
    if endpoint is None:
        return False
    try:
        return ipaddress.ip_address(endpoint.host.split("%", 1)[0]).is_multicast
    except ValueError:
        return False


def new_flow_control(
    uri: ChannelUri,
    *,
    receiver_timeout_ns: int = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS,
    group_tag: int = FLOW_CONTROL_GROUP_TAG_DEFAULT,
    group_min_size: int = FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT,
    multicast_default: str = FLOW_CONTROL_MAX,
) -> FlowControl:
    """The strategy for a publication's channel, with the driver's defaults for what the channel leaves out.

    Unicast channels get :class:`UnicastFlowControl`; an ``fc`` parameter on one
    is an error (as Aeron's Java driver; the C driver ignores it).  Multicast
    and MDC channels get the ``fc`` strategy, or ``multicast_default`` (Aeron's
    ``MULTICAST_FLOW_CONTROL_STRATEGY_DEFAULT``: max).  The ``g:`` and ``t:``
    options override the driver-wide group tag, minimum group size and
    receiver timeout; ``min`` ignores a group tag (only ``tagged`` uses it).
    """
    fc = uri.flow_control()
    if not has_group_semantics(uri):
        if fc is not None:
            raise InvalidChannelError(
                str(uri), f"'{FLOW_CONTROL_PARAM}' applies to multicast and multi-destination channels, not unicast"
            )
        return UnicastFlowControl(receiver_timeout_ns)

    strategy = multicast_default if fc is None else fc.strategy
    if fc is not None:
        if fc.timeout_ns is not None:
            receiver_timeout_ns = fc.timeout_ns
        if fc.group_tag is not None:
            group_tag = fc.group_tag
        if fc.group_min_size is not None:
            group_min_size = fc.group_min_size
    if strategy == FLOW_CONTROL_MAX:
        return MaxFlowControl(receiver_timeout_ns)
    if strategy == FLOW_CONTROL_MIN:
        return MinFlowControl(receiver_timeout_ns, group_min_size)
    if strategy == FLOW_CONTROL_TAGGED:
        return TaggedFlowControl(group_tag, receiver_timeout_ns, group_min_size)
    raise ValueError(f"unknown flow control strategy {strategy!r} (expected max, min or tagged)")
