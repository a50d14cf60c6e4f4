"""The C retransmit handler (retransmit.c): unicast and multicast
suppression, delay and linger (fields of the handler, read at each NAK), the
concurrency limit, validation and clamps, the publication's resend window,
bad arguments, the next deadline, and properties on random NAKs: the
handler's invariants, and timeouts against a plain model (an action expires
strictly after its expiry; a delayed one is resent and lingers).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar._native import ffi, lib
from fulmar.logbuffer import compute_max_message_length, compute_position

TERM_LENGTH = 64 * 1024
MTU = 1408
TERM_ID = 3
LINGER = lib.FULMAR_RETRANSMIT_LINGER_DEFAULT_NS
MAX_RESEND_DEFAULT = lib.FULMAR_RETRANSMIT_MAX_RESEND_DEFAULT
MAX_RESEND_MAX = lib.FULMAR_RETRANSMIT_MAX_RESEND_MAX
MS = 1_000_000
INT64_MAX = (1 << 63) - 1

INACTIVE = lib.FULMAR_RETRANSMIT_INACTIVE
DELAYED = lib.FULMAR_RETRANSMIT_DELAYED
LINGERING = lib.FULMAR_RETRANSMIT_LINGERING


class Resends:
    """Records resend(term_id, term_offset, length) calls made from C."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

        @ffi.callback("fulmar_resend_fn")
        def resend(context: Any, term_id: int, term_offset: int, length: int) -> None:
            assert context == ffi.NULL
            self.calls.append((term_id, term_offset, length))

        self.callback = resend

    def take(self) -> list[tuple[int, int, int]]:
        calls, self.calls = self.calls, []
        return calls


class NativeHandler:
    """A fulmar_retransmit_handler_t driven through lib."""

    def __init__(
        self,
        *,
        has_group_semantics: bool,
        max_retransmits: int = MAX_RESEND_DEFAULT,
        delay_ns: int = lib.FULMAR_RETRANSMIT_DELAY_DEFAULT_NS,
        linger_ns: int = lib.FULMAR_RETRANSMIT_LINGER_DEFAULT_NS,
        fc: Any = ffi.NULL,
    ) -> None:
        self.ptr = ffi.new("fulmar_retransmit_handler_t *")
        assert lib.fulmar_retransmit_init(self.ptr, has_group_semantics, max_retransmits, delay_ns, linger_ns) == 0
        self.fc = fc
        self.stats = self.ptr.stats

    @property
    def active_count(self) -> int:
        return int(self.ptr.active_count)

    def active(self) -> list[tuple[int, int, int, int, int]]:
        """(state, term id, term offset, length, expiry) of the scheduled and lingering actions, in pool order."""
        return [
            (a.state, a.term_id, a.term_offset, a.length, a.expiry_ns)
            for a in (self.ptr.actions[i] for i in range(self.ptr.pool_size))
            if a.state != INACTIVE
        ]

    def on_nak(
        self, term_id: int, term_offset: int, length: int, term_length: int, now_ns: int, resends: Resends
    ) -> None:
        lib.fulmar_retransmit_on_nak(
            self.ptr, self.fc, term_id, term_offset, length, term_length, now_ns, resends.callback, ffi.NULL
        )

    def process_timeouts(self, now_ns: int, resends: Resends) -> int:
        return int(lib.fulmar_retransmit_process_timeouts(self.ptr, now_ns, resends.callback, ffi.NULL))

    def next_deadline_ns(self) -> int:
        return int(lib.fulmar_retransmit_next_deadline_ns(self.ptr))


def nak(
    handler: NativeHandler, resends: Resends, term_offset: int, length: int, now_ns: int, term_id: int = TERM_ID
) -> None:
    handler.on_nak(term_id, term_offset, length, TERM_LENGTH, now_ns, resends)


def test_constants_are_aerons() -> None:
    assert lib.FULMAR_RETRANSMIT_DELAY_DEFAULT_NS == 0
    assert LINGER == 10 * MS
    assert MAX_RESEND_DEFAULT == 16
    assert MAX_RESEND_MAX == 256
    assert len(ffi.new("fulmar_retransmit_handler_t *").actions) == MAX_RESEND_MAX


# --- unicast --------------------------------------------------------------------


def test_unicast_resends_at_once_then_suppresses_while_lingering() -> None:
    handler = NativeHandler(has_group_semantics=False)
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
    handler = NativeHandler(has_group_semantics=False)
    resends = Resends()
    nak(handler, resends, 0, 512, now_ns=0)
    nak(handler, resends, 512, 512, now_ns=1)  # just past the first range
    nak(handler, resends, 0, 64, now_ns=2)  # the first range is no longer remembered
    assert resends.take() == [(TERM_ID, 0, 512), (TERM_ID, 512, 512), (TERM_ID, 0, 64)]
    assert handler.active_count == 1
    assert handler.stats.retransmit_overflows == 0


def test_same_offset_in_another_term_is_not_suppressed() -> None:
    handler = NativeHandler(has_group_semantics=True)
    resends = Resends()
    nak(handler, resends, 0, 512, now_ns=0, term_id=TERM_ID)
    nak(handler, resends, 0, 512, now_ns=0, term_id=TERM_ID + 1)
    assert resends.take() == [(TERM_ID, 0, 512), (TERM_ID + 1, 0, 512)]


def test_term_ids_at_the_int32_ends() -> None:
    handler = NativeHandler(has_group_semantics=True)
    resends = Resends()
    nak(handler, resends, 0, 512, now_ns=0, term_id=2**31 - 1)
    nak(handler, resends, 0, 512, now_ns=0, term_id=-(2**31))
    nak(handler, resends, 64, 32, now_ns=0, term_id=2**31 - 1)
    assert resends.take() == [(2**31 - 1, 0, 512), (-(2**31), 0, 512)]
    assert handler.stats.naks_suppressed == 1


# --- delay -------------------------------------------------------------------------


def test_delayed_retransmit_fires_after_the_delay_then_lingers() -> None:
    handler = NativeHandler(has_group_semantics=True, delay_ns=5 * MS)
    resends = Resends()
    nak(handler, resends, 2048, 1000, now_ns=0)
    assert resends.take() == []
    assert [a[0] for a in handler.active()] == [DELAYED]
    # A NAK for the scheduled range is suppressed.
    nak(handler, resends, 2048, 1000, now_ns=1 * MS)
    assert handler.process_timeouts(5 * MS, resends) == 0
    assert resends.take() == []
    assert handler.process_timeouts(5 * MS + 1, resends) == 1
    assert resends.take() == [(TERM_ID, 2048, 1000)]
    assert [(a[0], a[4]) for a in handler.active()] == [(LINGERING, 5 * MS + 1 + LINGER)]
    # Still suppressed while lingering; free after.
    nak(handler, resends, 2048, 1000, now_ns=5 * MS + 2)
    assert handler.process_timeouts(5 * MS + 2 + LINGER, resends) == 1
    assert handler.active_count == 0
    assert handler.stats.naks_suppressed == 2
    assert resends.take() == []


def test_delay_is_read_per_nak_and_linger_is_configurable() -> None:
    """The delay field is read per NAK: changing it changes the next NAK's delay only."""
    handler = NativeHandler(has_group_semantics=True, delay_ns=0, linger_ns=1 * MS)
    resends = Resends()
    nak(handler, resends, 0, 100, now_ns=0)
    handler.ptr.delay_ns = 3 * MS
    nak(handler, resends, 4096, 100, now_ns=0)
    assert resends.take() == [(TERM_ID, 0, 100)]
    assert handler.process_timeouts(1 * MS + 1, resends) == 1  # the first stops lingering
    assert handler.process_timeouts(3 * MS + 1, resends) == 1  # the second is sent
    assert resends.take() == [(TERM_ID, 4096, 100)]


def test_unicast_replacing_a_delayed_retransmit_drops_it() -> None:
    # Aeron's unicast rule: a new NAK outside the single action takes its place,
    # even before the earlier retransmit went out.
    handler = NativeHandler(has_group_semantics=False, delay_ns=5 * MS)
    resends = Resends()
    nak(handler, resends, 0, 512, now_ns=0)
    nak(handler, resends, 8192, 512, now_ns=1)
    handler.process_timeouts(10 * MS, resends)
    assert resends.take() == [(TERM_ID, 8192, 512)]


# --- concurrency limit ---------------------------------------------------------------


def test_group_semantics_allows_max_resend_concurrent_retransmits() -> None:
    handler = NativeHandler(has_group_semantics=True)
    stats = handler.stats
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
    handler = NativeHandler(has_group_semantics=True, max_retransmits=2)
    resends = Resends()
    for i in range(3):
        nak(handler, resends, i * 1024, 512, now_ns=0)
    assert [call[1] for call in resends.take()] == [0, 1024]
    assert handler.stats.retransmit_overflows == 1
    raw = ffi.new("fulmar_retransmit_handler_t *")
    for group in (True, False):
        for bad in (0, -1, 257):
            assert (
                lib.fulmar_retransmit_init(raw, group, bad, 0, LINGER) == lib.FULMAR_RETRANSMIT_INVALID_MAX_RETRANSMITS
            )
    # The whole pool of 256 works.
    handler = NativeHandler(has_group_semantics=True, max_retransmits=256)
    for i in range(257):
        nak(handler, resends, (i % 2) * 32768 + (i // 2) * 64, 32, now_ns=0)
    assert len(resends.take()) == 256 and handler.active_count == 256
    assert handler.stats.retransmit_overflows == 1


# --- validation and clamps ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("term_offset", "length"),
    [
        (-32, 64),
        (TERM_LENGTH - 31, 32),
        (TERM_LENGTH, 32),
        (0, 0),
        (0, -5),
        (-(2**31), 64),
        (2**31 - 1, 64),
        (0, -(2**31)),
    ],
)
def test_invalid_naks_are_counted_and_ignored(term_offset: int, length: int) -> None:
    handler = NativeHandler(has_group_semantics=True)
    resends = Resends()
    nak(handler, resends, term_offset, length, now_ns=0)
    assert resends.take() == []
    assert handler.stats.invalid_naks == 1 and handler.stats.naks_received == 1
    assert handler.active_count == 0


@pytest.mark.parametrize("term_length", [0, 31, -(2**31), -TERM_LENGTH])
def test_a_term_too_short_for_a_frame_makes_every_nak_invalid(term_length: int) -> None:
    handler = NativeHandler(has_group_semantics=False)
    resends = Resends()
    handler.on_nak(TERM_ID, 0, 32, term_length, 0, resends)
    assert resends.take() == [] and handler.stats.invalid_naks == 1


def test_length_is_clamped_to_the_term_end() -> None:
    handler = NativeHandler(has_group_semantics=False)
    resends = Resends()
    nak(handler, resends, TERM_LENGTH - 32, 4096, now_ns=0)  # the last frame's slot is valid
    assert resends.take() == [(TERM_ID, TERM_LENGTH - 32, 32)]


def test_length_is_clamped_to_a_multiple_of_the_receiver_window() -> None:
    big = 16 * 1024 * 1024
    resends = Resends()
    for group, multiple in ((False, 16), (True, 4)):
        handler = NativeHandler(has_group_semantics=group)
        handler.on_nak(TERM_ID, 0, big, big, 0, resends)
        assert resends.take() == [(TERM_ID, 0, multiple * 128 * 1024)]
    # The strategy's own rule when given (min: 16 windows, even with group semantics).
    fc = ffi.new("fulmar_fc_t *")
    assert lib.fulmar_fc_init(fc, lib.FULMAR_FC_MIN, lib.FULMAR_FC_RECEIVER_TIMEOUT_DEFAULT_NS, 0, -1) == 0
    try:
        assert fc.retransmit_receiver_window_multiple == lib.FULMAR_FC_MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE == 16
        handler = NativeHandler(has_group_semantics=True, fc=fc)
        handler.on_nak(TERM_ID, 0, big, big, 0, resends)
        assert resends.take() == [(TERM_ID, 0, 16 * 128 * 1024)]
    finally:
        lib.fulmar_fc_close(fc)


def test_suppression_uses_the_clamped_length() -> None:
    # A strategy whose window multiple allows 256 bytes of a 512-byte term
    # (window 256, multiple 1) clamps every NAK to 256 bytes.
    fc = ffi.new("fulmar_fc_t *")
    assert lib.fulmar_fc_init(fc, lib.FULMAR_FC_MAX, lib.FULMAR_FC_RECEIVER_TIMEOUT_DEFAULT_NS, 0, -1) == 0
    fc.retransmit_receiver_window_multiple = 1
    try:
        handler = NativeHandler(has_group_semantics=True, fc=fc)
        resends = Resends()
        for term_offset, length in ((0, 4096), (224, 64), (256, 64)):
            handler.on_nak(TERM_ID, term_offset, length, 512, 0, resends)
        assert resends.take() == [(TERM_ID, 0, 256), (TERM_ID, 256, 64)]  # 224 is inside the 256 bytes resent
    finally:
        lib.fulmar_fc_close(fc)


# --- the publication's resend window ----------------------------------------------------------


def test_resend_window_length() -> None:
    bits = 16
    initial = 5
    sender_position = 2 * TERM_LENGTH + 4096  # in term initial + 2
    term_id = initial + 2
    length = lib.fulmar_retransmit_resend_window_length
    # Inside what was sent: as asked, or cut at the sender position.
    assert length(term_id, 1024, 512, sender_position, initial, bits) == 512
    assert length(term_id, 1024, 8192, sender_position, initial, bits) == 4096 - 1024
    # At or beyond the sender position: nothing.
    assert length(term_id, 4096, 512, sender_position, initial, bits) == 0
    assert length(term_id + 1, 0, 512, sender_position, initial, bits) == 0
    # The previous term is still resendable back to half a term plus a max message.
    bottom = sender_position - TERM_LENGTH // 2 - compute_max_message_length(TERM_LENGTH)
    bottom_offset = bottom - TERM_LENGTH
    assert length(term_id - 1, bottom_offset, 64, sender_position, initial, bits) == 64
    assert length(term_id - 1, bottom_offset - 32, 64, sender_position, initial, bits) == 0


def test_resend_window_is_below_the_sender_position_and_at_most_half_a_term_and_a_message_behind() -> None:
    """A NAK for data older than that (stale, or forged) resends nothing: its
    slot in the log may hold a later term by now."""
    term = 64 * 1024
    bits = 16
    initial = 0
    sender = 10 * term + 4096
    bottom = sender - term // 2 - term // 8

    def resendable(position: int) -> bool:
        term_id = position >> bits
        assert -(2**31) <= term_id < 2**31  # keep within what a NAK can name
        answer = (
            lib.fulmar_retransmit_resend_window_length(term_id, position & (term - 1), 32, sender, initial, bits) > 0
        )
        assert answer == (bottom <= position < sender)
        return bool(answer)

    assert resendable(sender - 32)
    assert resendable(bottom)
    assert not resendable(bottom - 32)
    assert not resendable(sender)  # not sent yet
    assert not resendable(sender + term)
    assert not resendable(-(1 << 40))  # a NAK naming a term long gone


def test_resend_window_bad_arguments_resend_nothing() -> None:
    length = lib.fulmar_retransmit_resend_window_length
    sender = 10 * TERM_LENGTH
    for bits in (-1, 32, 64):
        assert length(9, 0, 64, sender, 0, bits) == 0
    assert length(9, 0, -64, sender, 0, 16) == 0
    assert length(9, 0, 0, sender, 0, 16) == 0
    # Sender positions at the int64 ends.
    assert length(0, 0, 64, INT64_MAX, 0, 16) == 0
    assert length(0, 0, 64, -(1 << 63), 0, 16) == 0


def resend_window_length_model(
    term_id: int, term_offset: int, length: int, sender_position: int, initial_term_id: int, bits: int
) -> int:
    """Aeron's NetworkPublication.resend bound: only what was sent and is still in
    the log (from half a term and a max message behind the sender position, up
    to it), cut at the sender position."""
    term_length = 1 << bits
    position = compute_position(term_id, term_offset, bits, initial_term_id)
    bottom = sender_position - (term_length >> 1) - compute_max_message_length(term_length)
    if not bottom <= position < sender_position:
        return 0
    return max(0, min(length, sender_position - position))


@settings(max_examples=300, deadline=None)
@given(
    bits=st.integers(16, 30),
    initial_term_id=st.integers(-(2**31), 2**31 - 1),
    term_count=st.integers(-3, 40),
    term_offset=st.integers(0, 2**30 - 1),
    length=st.integers(-10, 2**31 - 1),
    sender_delta=st.integers(-(2**32), 2**32),
)
def test_resend_window_length_matches_the_model(
    bits: int, initial_term_id: int, term_count: int, term_offset: int, length: int, sender_delta: int
) -> None:
    term_offset &= (1 << bits) - 1
    term_id = (initial_term_id + term_count + 2**31) % 2**32 - 2**31
    position = compute_position(term_id, term_offset, bits, initial_term_id)
    sender = position + sender_delta
    assert lib.fulmar_retransmit_resend_window_length(
        term_id, term_offset, length, sender, initial_term_id, bits
    ) == resend_window_length_model(term_id, term_offset, length, sender, initial_term_id, bits)


# --- bad arguments, deadlines -----------------------------------------------------------------


def test_init_refuses_bad_arguments() -> None:
    raw = ffi.new("fulmar_retransmit_handler_t *")
    assert lib.fulmar_retransmit_init(raw, True, 16, -1, LINGER) == lib.FULMAR_RETRANSMIT_INVALID_DELAY
    assert lib.fulmar_retransmit_init(raw, True, 16, 0, -1) == lib.FULMAR_RETRANSMIT_INVALID_DELAY
    assert raw.pool_size == 0 and raw.active_count == 0
    assert lib.fulmar_retransmit_init(ffi.NULL, True, 16, 0, LINGER) == lib.FULMAR_RETRANSMIT_NULL
    assert lib.fulmar_retransmit_init(raw, False, 16, 0, LINGER) == 0
    assert raw.pool_size == 1 and not raw.has_group_semantics


def test_a_null_resend_runs_the_actions_as_if_sent() -> None:
    handler = NativeHandler(has_group_semantics=True, delay_ns=1 * MS)
    lib.fulmar_retransmit_on_nak(handler.ptr, ffi.NULL, TERM_ID, 0, 64, TERM_LENGTH, 0, ffi.NULL, ffi.NULL)
    assert lib.fulmar_retransmit_process_timeouts(handler.ptr, 1 * MS + 1, ffi.NULL, ffi.NULL) == 1
    assert handler.stats.retransmits_sent == 1 and [a[0] for a in handler.active()] == [LINGERING]


def test_the_context_reaches_the_callback() -> None:
    seen: list[Any] = []

    @ffi.callback("fulmar_resend_fn")
    def resend(context: Any, term_id: int, term_offset: int, length: int) -> None:
        seen.append((ffi.from_handle(context), term_id, term_offset, length))

    handler = NativeHandler(has_group_semantics=False)
    token = object()
    handle = ffi.new_handle(token)
    lib.fulmar_retransmit_on_nak(handler.ptr, ffi.NULL, TERM_ID, 64, 64, TERM_LENGTH, 0, resend, handle)
    assert seen == [(token, TERM_ID, 64, 64)]


def test_next_deadline_is_just_after_the_earliest_expiry() -> None:
    handler = NativeHandler(has_group_semantics=True, delay_ns=5 * MS, linger_ns=2 * MS)
    resends = Resends()
    assert handler.next_deadline_ns() == INT64_MAX
    nak(handler, resends, 0, 64, now_ns=0)
    nak(handler, resends, 1024, 64, now_ns=1 * MS)
    assert handler.next_deadline_ns() == 5 * MS + 1
    # Before it nothing happens; at it, the first delayed resend goes.
    assert handler.process_timeouts(5 * MS, resends) == 0
    assert handler.process_timeouts(5 * MS + 1, resends) == 1
    assert resends.take() == [(TERM_ID, 0, 64)]
    # Now the second's delay (6 ms) comes before the first's linger (7 ms + 1).
    assert handler.next_deadline_ns() == 6 * MS + 1
    assert handler.process_timeouts(6 * MS + 1, resends) == 1
    assert handler.next_deadline_ns() == 7 * MS + 2
    assert handler.process_timeouts(7 * MS + 2, resends) == 1
    assert handler.next_deadline_ns() == 8 * MS + 2
    assert handler.process_timeouts(8 * MS + 2, resends) == 1
    assert handler.active_count == 0 and handler.next_deadline_ns() == INT64_MAX


def test_expiries_past_int64_max_never_come() -> None:
    handler = NativeHandler(has_group_semantics=True, delay_ns=INT64_MAX)
    resends = Resends()
    nak(handler, resends, 0, 64, now_ns=10)
    assert handler.active()[0][4] == INT64_MAX
    assert handler.next_deadline_ns() == INT64_MAX
    assert handler.process_timeouts(INT64_MAX, resends) == 0 and resends.take() == []


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    group=st.booleans(),
    delay_ns=st.sampled_from([0, 2 * MS]),
    events=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.integers(-64, TERM_LENGTH // 32).map(lambda n: n * 32),
            st.integers(-1, 4096),
            st.integers(0, 6 * MS),
        ),
        max_size=80,
    ),
)
def test_handler_invariants(group: bool, delay_ns: int, events: list[tuple[int, int, int, int]]) -> None:
    handler = NativeHandler(has_group_semantics=group, max_retransmits=4, delay_ns=delay_ns)
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
        covered = any(a[1] == TERM_ID + term_delta and a[2] <= term_offset < a[2] + a[3] for a in before)
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


@settings(max_examples=300, deadline=None)
@given(
    group=st.booleans(),
    max_retransmits=st.integers(1, 5),
    delay_ns=st.sampled_from([0, 1, 2 * MS]),
    linger_ns=st.sampled_from([0, 1 * MS, LINGER]),
    events=st.lists(
        st.one_of(
            st.tuples(
                st.just("nak"),
                st.integers(0, 2),
                st.integers(-2, TERM_LENGTH // 32).map(lambda n: n * 32),
                st.integers(-1, 3 * 4096),
            ),
            st.tuples(st.just("timeouts")),
            st.tuples(st.just("deadline")),
        ).flatmap(lambda event: st.tuples(st.just(event), st.integers(0, 4 * MS))),
        max_size=80,
    ),
)
def test_timeouts_follow_a_model_and_the_deadline_is_exact(
    group: bool, max_retransmits: int, delay_ns: int, linger_ns: int, events: list[tuple[tuple[Any, ...], int]]
) -> None:
    """On any sequence of NAKs: process_timeouts against a plain model (an
    action expires strictly after its expiry; a delayed one is then resent and
    lingers for the linger; a lingering one is freed), next_deadline_ns just
    after the earliest expiry and exact, a NAK resends at most once and only
    with no delay, and the pool never holds more than it may."""
    handler = NativeHandler(
        has_group_semantics=group, max_retransmits=max_retransmits, delay_ns=delay_ns, linger_ns=linger_ns
    )
    pool = max_retransmits if group else 1
    resends = Resends()

    def timeouts(now_ns: int) -> int:
        before = handler.active()
        sent = handler.stats.retransmits_sent
        expired = [a for a in before if a[4] < now_ns]
        expected_active = [
            (LINGERING, a[1], a[2], a[3], now_ns + linger_ns) if a[0] == DELAYED else None for a in expired
        ]
        count = handler.process_timeouts(now_ns, resends)
        assert count == len(expired)
        assert resends.take() == [(a[1], a[2], a[3]) for a in expired if a[0] == DELAYED]
        assert handler.stats.retransmits_sent == sent + sum(a[0] == DELAYED for a in expired)
        after = [a if a[4] >= now_ns else expected_active[expired.index(a)] for a in before]
        assert handler.active() == [a for a in after if a is not None]
        return count

    now = 0
    for event, advance in events:
        now += advance
        if event[0] == "nak":
            _, term_delta, term_offset, length = event
            received = handler.stats.naks_received
            nak(handler, resends, term_offset, length, now, term_id=TERM_ID + term_delta)
            calls = resends.take()
            assert handler.stats.naks_received == received + 1
            assert len(calls) <= 1 and (delay_ns == 0 or calls == [])
            for term_id, offset, resent in calls:
                assert (term_id, offset) == (TERM_ID + term_delta, term_offset) and 0 < resent <= length
        elif event[0] == "timeouts":
            timeouts(now)
        else:
            deadline = handler.next_deadline_ns()
            if deadline == INT64_MAX:
                assert handler.active_count == 0
                continue
            if deadline > now:
                assert timeouts(deadline - 1) == 0
                now = deadline
            assert timeouts(now) > 0
        active = handler.active()
        assert handler.active_count == len(active) <= pool
        expected_deadline = min((a[4] for a in active), default=INT64_MAX)
        assert handler.next_deadline_ns() == (INT64_MAX if expected_deadline == INT64_MAX else expected_deadline + 1)
