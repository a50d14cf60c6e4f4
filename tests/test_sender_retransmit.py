"""Retransmit handler: delays, suppression, linger, concurrency limits, length clamps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar.driver.flow_control import MinFlowControl
from fulmar.driver.network_publication import in_resend_window
from fulmar.driver.retransmit_handler import (
    MAX_RESEND_DEFAULT,
    RETRANSMIT_UNICAST_LINGER_DEFAULT_NS,
    RetransmitHandler,
    RetransmitState,
    RetransmitStats,
    resend_window_length,
    static_delay,
)
from fulmar.logbuffer import compute_max_message_length

TERM_LENGTH = 64 * 1024
MTU = 1408
TERM_ID = 3
LINGER = RETRANSMIT_UNICAST_LINGER_DEFAULT_NS
MS = 1_000_000


class Resends:
    """Records resend(term_id, term_offset, length) calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, term_id: int, term_offset: int, length: int) -> None:
        self.calls.append((term_id, term_offset, length))

    def take(self) -> list[tuple[int, int, int]]:
        calls, self.calls = self.calls, []
        return calls


def nak(handler: RetransmitHandler, resends: Resends, term_offset: int, length: int, now_ns: int, term_id: int = TERM_ID) -> None:
    handler.on_nak(term_id, term_offset, length, TERM_LENGTH, MTU, now_ns, resends)


# --- unicast --------------------------------------------------------------------


def test_unicast_resends_at_once_then_suppresses_while_lingering() -> None:
    handler = RetransmitHandler(has_group_semantics=False)
    resends = Resends()
    nak(handler, resends, 1024, 512, now_ns=0)
    assert resends.take() == [(TERM_ID, 1024, 512)]
    # The same NAK again, or one starting inside the range, is suppressed while lingering.
    nak(handler, resends, 1024, 512, now_ns=1)
    nak(handler, resends, 1024 + 480, 64, now_ns=2)
    assert resends.take() == []
    assert handler.stats.naks_suppressed == 2
    # Linger ends strictly after its deadline.
    assert handler.process_timeouts(LINGER, resends) == 0
    nak(handler, resends, 1024, 512, now_ns=LINGER)
    assert resends.take() == []
    assert handler.process_timeouts(LINGER + 1, resends) == 1
    assert handler.active_count == 0
    nak(handler, resends, 1024, 512, now_ns=LINGER + 2)
    assert resends.take() == [(TERM_ID, 1024, 512)]
    assert handler.stats.retransmits_sent == 2
    assert handler.stats.naks_received == 5


def test_unicast_nak_outside_the_range_replaces_it() -> None:
    handler = RetransmitHandler(has_group_semantics=False)
    resends = Resends()
    nak(handler, resends, 0, 512, now_ns=0)
    nak(handler, resends, 512, 512, now_ns=1)  # just past the first range
    nak(handler, resends, 0, 64, now_ns=2)  # the first range is no longer remembered
    assert resends.take() == [(TERM_ID, 0, 512), (TERM_ID, 512, 512), (TERM_ID, 0, 64)]
    assert handler.active_count == 1
    assert handler.stats.retransmit_overflows == 0


def test_same_offset_in_another_term_is_not_suppressed() -> None:
    handler = RetransmitHandler(has_group_semantics=True)
    resends = Resends()
    nak(handler, resends, 0, 512, now_ns=0, term_id=TERM_ID)
    nak(handler, resends, 0, 512, now_ns=0, term_id=TERM_ID + 1)
    assert resends.take() == [(TERM_ID, 0, 512), (TERM_ID + 1, 0, 512)]


# --- delay -------------------------------------------------------------------------


def test_delayed_retransmit_fires_after_the_delay_then_lingers() -> None:
    handler = RetransmitHandler(has_group_semantics=True, delay_generator=static_delay(5 * MS))
    resends = Resends()
    nak(handler, resends, 2048, 1000, now_ns=0)
    assert resends.take() == []
    assert [a.state for a in handler.active()] == [RetransmitState.DELAYED]
    # A NAK for the scheduled range is suppressed.
    nak(handler, resends, 2048, 1000, now_ns=1 * MS)
    assert handler.process_timeouts(5 * MS, resends) == 0
    assert resends.take() == []
    assert handler.process_timeouts(5 * MS + 1, resends) == 1
    assert resends.take() == [(TERM_ID, 2048, 1000)]
    assert [(a.state, a.expiry_ns) for a in handler.active()] == [(RetransmitState.LINGERING, 5 * MS + 1 + LINGER)]
    # Still suppressed while lingering; free after.
    nak(handler, resends, 2048, 1000, now_ns=5 * MS + 2)
    assert handler.process_timeouts(5 * MS + 2 + LINGER, resends) == 1
    assert handler.active_count == 0
    assert handler.stats.naks_suppressed == 2
    assert resends.take() == []


def test_delay_generator_is_asked_per_nak_and_linger_is_configurable() -> None:
    delays = iter([0, 3 * MS])
    handler = RetransmitHandler(
        has_group_semantics=True, delay_generator=lambda: next(delays), linger_generator=static_delay(1 * MS)
    )
    resends = Resends()
    nak(handler, resends, 0, 100, now_ns=0)
    nak(handler, resends, 4096, 100, now_ns=0)
    assert resends.take() == [(TERM_ID, 0, 100)]
    assert handler.process_timeouts(1 * MS + 1, resends) == 1  # the first stops lingering
    assert handler.process_timeouts(3 * MS + 1, resends) == 1  # the second is sent
    assert resends.take() == [(TERM_ID, 4096, 100)]


def test_unicast_replacing_a_delayed_retransmit_drops_it() -> None:
    # Aeron's unicast rule: a new NAK outside the single action takes its place,
    # even before the earlier retransmit went out.
    handler = RetransmitHandler(has_group_semantics=False, delay_generator=static_delay(5 * MS))
    resends = Resends()
    nak(handler, resends, 0, 512, now_ns=0)
    nak(handler, resends, 8192, 512, now_ns=1)
    handler.process_timeouts(10 * MS, resends)
    assert resends.take() == [(TERM_ID, 8192, 512)]


# --- concurrency limit ---------------------------------------------------------------


def test_group_semantics_allows_max_resend_concurrent_retransmits() -> None:
    stats = RetransmitStats()
    handler = RetransmitHandler(has_group_semantics=True, stats=stats)
    resends = Resends()
    for i in range(MAX_RESEND_DEFAULT + 1):
        nak(handler, resends, i * 1024, 512, now_ns=0)
    assert len(resends.take()) == MAX_RESEND_DEFAULT == 16
    assert handler.active_count == 16
    assert stats.retransmit_overflows == 1
    # A NAK for an active range is suppressed, not an overflow.
    nak(handler, resends, 0, 512, now_ns=0)
    assert stats.retransmit_overflows == 1 and stats.naks_suppressed == 1
    # Once they stop lingering there is room again.
    handler.process_timeouts(LINGER + 1, resends)
    assert handler.active_count == 0
    nak(handler, resends, 16 * 1024, 512, now_ns=LINGER + 2)
    assert resends.take() == [(TERM_ID, 16 * 1024, 512)]


def test_max_retransmits_is_configurable_and_bounded() -> None:
    handler = RetransmitHandler(has_group_semantics=True, max_retransmits=2)
    resends = Resends()
    for i in range(3):
        nak(handler, resends, i * 1024, 512, now_ns=0)
    assert [call[1] for call in resends.take()] == [0, 1024]
    assert handler.stats.retransmit_overflows == 1
    for bad in (0, 257):
        with pytest.raises(ValueError, match="max retransmits"):
            RetransmitHandler(has_group_semantics=True, max_retransmits=bad)
    RetransmitHandler(has_group_semantics=True, max_retransmits=256)


# --- validation and clamps ----------------------------------------------------------------


@pytest.mark.parametrize(("term_offset", "length"), [(-32, 64), (TERM_LENGTH - 31, 32), (TERM_LENGTH, 32), (0, 0), (0, -5)])
def test_invalid_naks_are_counted_and_ignored(term_offset: int, length: int) -> None:
    handler = RetransmitHandler(has_group_semantics=True)
    resends = Resends()
    nak(handler, resends, term_offset, length, now_ns=0)
    assert resends.take() == []
    assert handler.stats.invalid_naks == 1 and handler.stats.naks_received == 1
    assert handler.active_count == 0


def test_length_is_clamped_to_the_term_end() -> None:
    handler = RetransmitHandler(has_group_semantics=False)
    resends = Resends()
    nak(handler, resends, TERM_LENGTH - 32, 4096, now_ns=0)  # the last frame's slot is valid
    assert resends.take() == [(TERM_ID, TERM_LENGTH - 32, 32)]


def test_length_is_clamped_to_a_multiple_of_the_receiver_window() -> None:
    big = 16 * 1024 * 1024
    resends = Resends()
    for group, multiple in ((False, 16), (True, 4)):
        handler = RetransmitHandler(has_group_semantics=group)
        handler.on_nak(TERM_ID, 0, big, big, MTU, 0, resends)
        assert resends.take() == [(TERM_ID, 0, multiple * 128 * 1024)]
    # The strategy's own rule when given (min: 16 windows, even with group semantics).
    handler = RetransmitHandler(has_group_semantics=True, max_retransmission_length=MinFlowControl().max_retransmission_length)
    handler.on_nak(TERM_ID, 0, big, big, MTU, 0, resends)
    assert resends.take() == [(TERM_ID, 0, 16 * 128 * 1024)]


def test_suppression_uses_the_clamped_length() -> None:
    handler = RetransmitHandler(has_group_semantics=True, max_retransmission_length=lambda o, n, t, m: min(n, 256))
    resends = Resends()
    nak(handler, resends, 0, 4096, now_ns=0)
    nak(handler, resends, 224, 64, now_ns=0)  # inside the 256 bytes resent
    nak(handler, resends, 256, 64, now_ns=0)  # beyond them
    assert resends.take() == [(TERM_ID, 0, 256), (TERM_ID, 256, 64)]


# --- the publication's resend window ----------------------------------------------------------


def test_resend_window_length() -> None:
    bits = 16
    initial = 5
    sender_position = 2 * TERM_LENGTH + 4096  # in term initial + 2
    term_id = initial + 2
    # Inside what was sent: as asked, or cut at the sender position.
    assert resend_window_length(term_id, 1024, 512, sender_position, initial, bits) == 512
    assert resend_window_length(term_id, 1024, 8192, sender_position, initial, bits) == 4096 - 1024
    # At or beyond the sender position: nothing.
    assert resend_window_length(term_id, 4096, 512, sender_position, initial, bits) == 0
    assert resend_window_length(term_id + 1, 0, 512, sender_position, initial, bits) == 0
    # The previous term is still resendable back to half a term plus a max message.
    bottom = sender_position - TERM_LENGTH // 2 - compute_max_message_length(TERM_LENGTH)
    bottom_offset = bottom - TERM_LENGTH
    assert resend_window_length(term_id - 1, bottom_offset, 64, sender_position, initial, bits) == 64
    assert resend_window_length(term_id - 1, bottom_offset - 32, 64, sender_position, initial, bits) == 0


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    group=st.booleans(),
    delay_ns=st.sampled_from([0, 2 * MS]),
    events=st.lists(
        st.tuples(st.integers(0, 1), st.integers(-64, TERM_LENGTH // 32).map(lambda n: n * 32), st.integers(-1, 4096), st.integers(0, 6 * MS)),
        max_size=80,
    ),
)
def test_handler_invariants(group: bool, delay_ns: int, events: list[tuple[int, int, int, int]]) -> None:
    handler = RetransmitHandler(has_group_semantics=group, max_retransmits=4, delay_generator=static_delay(delay_ns))
    pool = 4 if group else 1
    resends = Resends()
    now = 0
    accepted = 0
    for term_delta, term_offset, length, advance in events:
        now += advance
        handler.process_timeouts(now, resends)
        before = handler.active()
        suppressed = handler.stats.naks_suppressed
        overflows = handler.stats.retransmit_overflows
        invalid = handler.stats.invalid_naks
        resends.take()
        nak(handler, resends, term_offset, length, now, term_id=TERM_ID + term_delta)
        calls = resends.take()
        covered = any(a.term_id == TERM_ID + term_delta and a.term_offset <= term_offset < a.term_offset + a.length for a in before)
        is_invalid = handler.stats.invalid_naks > invalid
        if is_invalid:
            assert term_offset < 0 or term_offset > TERM_LENGTH - 32 or length <= 0
        elif covered:
            # A NAK inside an active range is never resent again.
            assert handler.stats.naks_suppressed == suppressed + 1 and calls == []
        elif handler.stats.retransmit_overflows == overflows:
            accepted += 1
            if delay_ns == 0:
                assert calls == [(TERM_ID + term_delta, term_offset, min(length, TERM_LENGTH - term_offset))]
        for _, offset, resent in calls:
            assert 0 < resent <= TERM_LENGTH - offset
        assert handler.active_count == len(handler.active()) <= pool
        if not group:
            assert handler.stats.retransmit_overflows == 0
    stats = handler.stats
    assert stats.naks_received == len(events)
    assert stats.naks_received == stats.invalid_naks + stats.naks_suppressed + stats.retransmit_overflows + accepted


def test_resend_window_is_below_the_sender_position_and_at_most_half_a_term_and_a_message_behind() -> None:
    """A NAK for data older than that (stale, or forged) resends nothing: its
    slot in the log may hold a later term by now."""
    term = 64 * 1024
    sender = 10 * term + 4096
    bottom = sender - term // 2 - term // 8
    assert in_resend_window(sender - 32, sender, term)
    assert in_resend_window(bottom, sender, term)
    assert not in_resend_window(bottom - 32, sender, term)
    assert not in_resend_window(sender, sender, term)  # not sent yet
    assert not in_resend_window(sender + term, sender, term)
    assert not in_resend_window(-(1 << 40), sender, term)  # a NAK naming a term long gone
