"""The C sender timing (sender_timing.c): SETUP, heartbeats, receiver
liveness and connection, the SETUP back-off, bad arguments, the next
deadline, and a property on random calls: the live receivers against a plain
model, and the next deadline exact (nothing due before it, something at it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar._native import ffi, lib

SETUP = lib.FULMAR_PUBLICATION_SETUP_TIMEOUT_NS
HEARTBEAT = lib.FULMAR_PUBLICATION_HEARTBEAT_TIMEOUT_NS
CONNECTION = lib.FULMAR_PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS
T0 = 1_000_000_000_000
INT64_MAX = (1 << 63) - 1

NO = lib.FULMAR_SETUP_NO
INITIAL = lib.FULMAR_SETUP_INITIAL
ELICITED = lib.FULMAR_SETUP_ELICITED


class NativeTiming:
    """A fulmar_sender_timing_t driven through lib."""

    def __init__(
        self,
        now_ns: int,
        *,
        connection_timeout_ns: int = CONNECTION,
        setup_timeout_ns: int = SETUP,
        heartbeat_timeout_ns: int = HEARTBEAT,
        initial_setup_interval_ns: int | None = None,
    ) -> None:
        self.ptr = ffi.new("fulmar_sender_timing_t *")
        rc = lib.fulmar_sender_timing_init(
            self.ptr,
            now_ns,
            connection_timeout_ns,
            setup_timeout_ns,
            heartbeat_timeout_ns,
            initial_setup_interval_ns or 0,
        )
        assert rc == 0

    def close(self) -> None:
        lib.fulmar_sender_timing_close(self.ptr)

    def on_status_message(self, receiver_id: int, is_eos: bool, now_ns: int) -> bool:
        return bool(lib.fulmar_sender_timing_on_status_message(self.ptr, receiver_id, is_eos, now_ns))

    def on_trigger_send_setup(self, now_ns: int, is_end_of_stream: bool = False) -> None:
        lib.fulmar_sender_timing_on_trigger_send_setup(self.ptr, now_ns, is_end_of_stream)

    def on_error(self, receiver_id: int) -> bool:
        return bool(lib.fulmar_sender_timing_on_error(self.ptr, receiver_id))

    def setup_due(self, now_ns: int) -> int:
        return int(lib.fulmar_sender_timing_setup_due(self.ptr, now_ns))

    @property
    def setup_backing_off(self) -> bool:
        return bool(lib.fulmar_sender_timing_setup_backing_off(self.ptr))

    def heartbeat_due(self, now_ns: int) -> bool:
        return bool(lib.fulmar_sender_timing_heartbeat_due(self.ptr, now_ns))

    def on_data_sent(self, now_ns: int) -> None:
        lib.fulmar_sender_timing_on_data_sent(self.ptr, now_ns)

    def on_idle(self, now_ns: int) -> None:
        lib.fulmar_sender_timing_on_idle(self.ptr, now_ns)

    def is_connected(self, has_required_receivers: bool = True) -> bool:
        return bool(lib.fulmar_sender_timing_is_connected(self.ptr, has_required_receivers))

    def next_deadline_ns(self) -> int:
        return int(lib.fulmar_sender_timing_next_deadline_ns(self.ptr))

    @property
    def is_setup_elicited(self) -> bool:
        return bool(self.ptr.is_setup_elicited)

    @property
    def has_receivers(self) -> bool:
        return bool(self.ptr.has_receivers)

    @property
    def time_of_last_status_message_ns(self) -> int | None:
        return int(self.ptr.time_of_last_status_message_ns) if self.ptr.has_status_message_time else None

    @property
    def receiver_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.ptr.receivers[i].receiver_id for i in range(self.ptr.receiver_count)))

    def state(self) -> tuple[Any, ...]:
        """Everything the timing holds, to see whether a call changed it."""
        t = self.ptr
        return (
            t.time_of_last_setup_ns,
            t.time_of_last_data_or_heartbeat_ns,
            self.time_of_last_status_message_ns,
            bool(t.has_initial_connection),
            bool(t.is_setup_elicited),
            bool(t.has_receivers),
            t.setup_interval_ns,
            self.receiver_ids,
            self.setup_backing_off,
        )


@pytest.fixture
def new() -> Iterator[Any]:
    """new(now_ns, **options): a NativeTiming closed at teardown."""
    made: list[NativeTiming] = []

    def make(*args: Any, **kwargs: Any) -> NativeTiming:
        made.append(NativeTiming(*args, **kwargs))
        return made[-1]

    yield make
    for timing in made:
        timing.close()


def test_constants_are_aerons() -> None:
    assert SETUP == 100_000_000
    assert HEARTBEAT == 100_000_000
    assert CONNECTION == 5_000_000_000
    assert (NO, INITIAL, ELICITED) == (0, 1, 2)


# --- SETUP ------------------------------------------------------------------------


def test_setup_is_resent_every_setup_timeout_until_a_status_message(new: Any) -> None:
    timing = new(T0)
    assert timing.setup_due(T0) == INITIAL
    assert timing.setup_due(T0 + 1) == NO
    assert timing.setup_due(T0 + SETUP) == NO  # strictly after the timeout
    assert timing.setup_due(T0 + SETUP + 1) == INITIAL
    assert timing.setup_due(T0 + 2 * SETUP + 1) == NO
    assert timing.setup_due(T0 + 2 * SETUP + 2) == INITIAL
    assert timing.on_status_message(receiver_id=7, is_eos=False, now_ns=T0 + 2 * SETUP + 3)
    assert timing.setup_due(T0 + 10 * SETUP) == NO
    assert not NO and INITIAL and ELICITED


def test_setup_elicited_by_a_receiver_is_sent_once_receivers_are_live(new: Any) -> None:
    timing = new(T0)
    timing.setup_due(T0)
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0 + 1)
    timing.on_trigger_send_setup(T0 + 2)
    assert timing.is_setup_elicited
    assert timing.setup_due(T0 + 3) == NO  # still within the setup timeout of the last SETUP
    assert timing.setup_due(T0 + SETUP + 1) == ELICITED
    assert not timing.is_setup_elicited
    assert timing.setup_due(T0 + 5 * SETUP) == NO


def test_elicited_setup_repeats_while_no_receiver_is_live(new: Any) -> None:
    timing = new(T0)
    timing.on_status_message(receiver_id=1, is_eos=True, now_ns=T0)  # a connection, but no live receiver
    assert not timing.has_receivers
    timing.on_trigger_send_setup(T0)
    assert timing.setup_due(T0 + 1) == ELICITED
    assert timing.setup_due(T0 + SETUP + 2) == ELICITED
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0 + SETUP + 3)
    assert timing.setup_due(T0 + 2 * SETUP + 3) == ELICITED
    assert timing.setup_due(T0 + 4 * SETUP) == NO


def test_setup_trigger_is_ignored_at_end_of_stream(new: Any) -> None:
    timing = new(T0)
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0)
    timing.on_trigger_send_setup(T0 + 1, is_end_of_stream=True)
    assert not timing.is_setup_elicited
    assert timing.setup_due(T0 + SETUP * 3) == NO


# --- heartbeat -------------------------------------------------------------------------


def test_heartbeat_only_after_the_first_status_message_and_after_100ms_without_data(new: Any) -> None:
    timing = new(T0)
    assert not timing.heartbeat_due(T0 + 10 * HEARTBEAT)
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0 + 10 * HEARTBEAT)
    now = T0 + 10 * HEARTBEAT + 1
    assert timing.heartbeat_due(now)  # nothing was ever sent
    assert not timing.heartbeat_due(now + HEARTBEAT)
    assert timing.heartbeat_due(now + HEARTBEAT + 1)
    now += HEARTBEAT + 1
    timing.on_data_sent(now + 50_000_000)
    assert not timing.heartbeat_due(now + 50_000_000 + HEARTBEAT)
    assert timing.heartbeat_due(now + 50_000_000 + HEARTBEAT + 1)


# --- connection ----------------------------------------------------------------------------


def test_connected_while_status_messages_arrive_within_the_connection_timeout(new: Any) -> None:
    timing = new(T0)
    assert not timing.is_connected()
    assert timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0)
    assert not timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0 + 1_000)
    assert timing.is_connected()
    assert not timing.is_connected(has_required_receivers=False)
    timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0 + CONNECTION - 1)
    timing.on_idle(T0 + CONNECTION)  # receiver 1 silent for the whole timeout: gone
    assert timing.receiver_ids == (2,)
    assert timing.is_connected()
    timing.on_idle(T0 + 2 * CONNECTION - 2)
    assert timing.is_connected()
    timing.on_idle(T0 + 2 * CONNECTION - 1)
    assert not timing.is_connected()
    # A later status message reconnects, without a new SETUP phase.
    assert timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0 + 3 * CONNECTION)
    assert timing.is_connected() and timing.setup_due(T0 + 4 * CONNECTION) == NO


def test_end_of_stream_and_error_remove_a_receiver_at_once(new: Any) -> None:
    timing = new(T0, connection_timeout_ns=1_000)
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0)
    timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0)
    timing.on_status_message(receiver_id=1, is_eos=True, now_ns=T0 + 1)
    assert timing.receiver_ids == (2,) and timing.is_connected()
    assert timing.on_error(2) and not timing.on_error(2)
    assert not timing.is_connected()
    assert timing.time_of_last_status_message_ns == T0 + 1


def test_nothing_heard_has_no_status_message_time(new: Any) -> None:
    timing = new(T0)
    assert timing.time_of_last_status_message_ns is None
    timing.on_trigger_send_setup(T0 + 5)
    assert timing.time_of_last_status_message_ns == T0 + 5


def test_many_receivers_grow_the_tracker(new: Any) -> None:
    timing = new(T0, connection_timeout_ns=1_000)
    assert timing.on_status_message(receiver_id=0, is_eos=False, now_ns=T0)
    for receiver_id in range(1, 300):
        assert not timing.on_status_message(receiver_id=receiver_id, is_eos=False, now_ns=T0 + receiver_id)
    assert timing.receiver_ids == tuple(range(300)) and timing.ptr.receiver_capacity >= 300
    timing.on_idle(T0 + 1_000 + 149)  # 0..149 silent for the whole timeout
    assert timing.receiver_ids == tuple(range(150, 300))
    for receiver_id in range(150, 300, 3):
        assert timing.on_error(receiver_id)
    assert timing.receiver_ids == tuple(r for r in range(150, 300) if (r - 150) % 3)


# --- SETUP back-off -----------------------------------------------------------------------


def test_an_initial_setup_interval_backs_off_to_the_setup_timeout_until_a_status_message(new: Any) -> None:
    initial = 5_000_000
    timing = new(T0, initial_setup_interval_ns=initial)
    sent = [t for t in range(T0, T0 + 400_000_000, 1_000_000) if timing.setup_due(t) == INITIAL]
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    # 5, 10, 20, 40, 80 ms (each strictly after its interval, on a 1 ms clock), then Aeron's 100 ms.
    assert gaps[:5] == [6_000_000, 11_000_000, 21_000_000, 41_000_000, 81_000_000]
    assert set(gaps[5:]) == {SETUP + 1_000_000}
    # Once a receiver has answered, SETUP is sent only when elicited, at the setup timeout's pace.
    timing.on_status_message(1, False, T0 + 400_000_000)
    assert timing.setup_due(T0 + 500_000_000) == NO
    timing.on_trigger_send_setup(T0 + 500_000_000)
    assert timing.setup_due(T0 + 500_000_001) == ELICITED
    assert timing.setup_due(T0 + 500_000_001 + initial + 1) == NO


def test_setup_backing_off_only_until_the_setup_timeout_pace_or_a_receiver(new: Any) -> None:
    timing = new(T0, initial_setup_interval_ns=10_000_000)
    assert timing.setup_backing_off
    t = T0
    while timing.setup_backing_off:
        timing.setup_due(t)
        t += 1_000_000
    assert t - T0 < SETUP * 3  # the fast SETUPs are over within a few hundred ms
    assert not new(T0).setup_backing_off  # Aeron's pace from the start
    answered = new(T0, initial_setup_interval_ns=10_000_000)
    answered.on_status_message(1, False, T0)
    assert not answered.setup_backing_off


def test_an_initial_interval_longer_than_the_setup_timeout_is_cut_to_it(new: Any) -> None:
    timing = new(T0, initial_setup_interval_ns=10 * SETUP)
    assert timing.ptr.setup_interval_ns == SETUP and not timing.setup_backing_off


# --- bad arguments and edges -----------------------------------------------------------------


def test_init_refuses_negative_timeouts_and_null() -> None:
    timing = ffi.new("fulmar_sender_timing_t *")
    for bad in (
        (-1, SETUP, HEARTBEAT, 0),
        (CONNECTION, -1, HEARTBEAT, 0),
        (CONNECTION, SETUP, -1, 0),
        (CONNECTION, SETUP, HEARTBEAT, -1),
    ):
        assert lib.fulmar_sender_timing_init(timing, T0, *bad) == lib.FULMAR_SENDER_TIMING_INVALID_TIMEOUT
        assert timing.receivers == ffi.NULL
        lib.fulmar_sender_timing_close(timing)
    assert lib.fulmar_sender_timing_init(ffi.NULL, T0, CONNECTION, SETUP, HEARTBEAT, 0) == lib.FULMAR_SENDER_TIMING_NULL
    # Zero timeouts are allowed: everything is due whenever time moves.
    assert lib.fulmar_sender_timing_init(timing, T0, 0, 0, 0, 0) == 0
    assert lib.fulmar_sender_timing_setup_due(timing, T0) == INITIAL
    assert lib.fulmar_sender_timing_setup_due(timing, T0) == NO
    assert lib.fulmar_sender_timing_setup_due(timing, T0 + 1) == INITIAL
    lib.fulmar_sender_timing_close(timing)
    lib.fulmar_sender_timing_close(timing)
    lib.fulmar_sender_timing_close(ffi.NULL)


def test_times_near_the_int64_ends_do_not_wrap(new: Any) -> None:
    """The C's sums near INT64_MAX stay exact: a time past INT64_MAX never comes.

    (The initial "due at once" times saturate for a now_ns within a timeout of
    INT64_MIN, which no monotonic clock gives: the earliest case here is the
    first that does not.)"""
    # now, is the next SETUP due by INT64_MAX, is the receiver still live at INT64_MAX
    for now, setup_again, still_live in (
        (INT64_MAX - 5, False, True),  # the setup and connection timeouts would end past INT64_MAX
        (INT64_MAX - CONNECTION, True, False),  # silent for exactly the connection timeout: gone
        (-(1 << 63) + SETUP + 1, True, False),
        (0, True, False),
    ):
        timing = new(now)
        assert timing.setup_due(now) == INITIAL
        assert timing.setup_due(INT64_MAX) == (INITIAL if setup_again else NO)
        assert timing.on_status_message(1, False, now)
        timing.on_idle(INT64_MAX)
        assert timing.receiver_ids == ((1,) if still_live else ())
        assert timing.heartbeat_due(INT64_MAX)  # nothing was ever sent


# --- the next deadline ------------------------------------------------------------------------


def _nothing_due_before(timing: NativeTiming, deadline: int, probes: list[int]) -> None:
    """At each probe before the deadline, setup_due, heartbeat_due and on_idle change nothing."""
    before = timing.state()
    for probe in probes:
        if probe >= deadline:
            continue
        assert timing.setup_due(probe) == NO
        assert not timing.heartbeat_due(probe)
        timing.on_idle(probe)
        assert timing.state() == before
        assert timing.next_deadline_ns() == deadline


def _something_due_at(timing: NativeTiming, deadline: int) -> None:
    before = timing.state()
    due = timing.setup_due(deadline) != NO
    due |= timing.heartbeat_due(deadline)
    timing.on_idle(deadline)
    assert due or timing.state() != before


def test_next_deadline_of_the_setup_phase(new: Any) -> None:
    timing = new(T0)
    assert timing.next_deadline_ns() <= T0  # the first SETUP is due at once
    assert timing.setup_due(T0) == INITIAL
    assert timing.next_deadline_ns() == T0 + SETUP + 1
    _nothing_due_before(timing, T0 + SETUP + 1, [T0, T0 + 1, T0 + SETUP])
    assert timing.setup_due(T0 + SETUP + 1) == INITIAL
    # Backing off: the deadline follows the growing interval.
    fast = new(T0, initial_setup_interval_ns=5_000_000)
    assert fast.setup_due(T0) == INITIAL
    for interval in (5_000_000, 10_000_000, 20_000_000, 40_000_000, 80_000_000, SETUP, SETUP):
        deadline = fast.next_deadline_ns()
        assert deadline == int(fast.ptr.time_of_last_setup_ns) + interval + 1
        _nothing_due_before(fast, deadline, [deadline - 1])
        assert fast.setup_due(deadline) == INITIAL


def test_next_deadline_when_connected_is_the_heartbeat_or_a_receiver_timeout(new: Any) -> None:
    timing = new(T0, connection_timeout_ns=250_000_000)
    timing.setup_due(T0)
    timing.on_status_message(1, False, T0 + 10)
    # Never sent anything: the heartbeat is overdue, the deadline is in the past.
    assert timing.next_deadline_ns() <= T0 + 10
    assert timing.heartbeat_due(T0 + 10)
    assert timing.next_deadline_ns() == T0 + 10 + HEARTBEAT + 1
    timing.on_data_sent(T0 + 200_000_000)
    # The heartbeat moved past the receiver's timeout: that is next.
    assert timing.next_deadline_ns() == T0 + 10 + 250_000_000
    _nothing_due_before(timing, T0 + 10 + 250_000_000, [T0 + 11, T0 + 250_000_009])
    timing.on_idle(T0 + 10 + 250_000_000)
    assert not timing.is_connected()
    # No SETUP wanted once connected, unless elicited.
    assert timing.next_deadline_ns() == T0 + 200_000_000 + HEARTBEAT + 1
    timing.on_trigger_send_setup(T0 + 260_000_000)
    assert timing.next_deadline_ns() == T0 + SETUP + 1  # overdue at once: the last SETUP was at T0
    assert timing.setup_due(T0 + 260_000_000) == ELICITED


def test_next_deadline_with_nothing_to_wait_for_is_int64_max(new: Any) -> None:
    timing = new(T0, setup_timeout_ns=INT64_MAX)
    timing.setup_due(T0)
    assert timing.next_deadline_ns() == INT64_MAX
    timing.on_status_message(1, True, T0)  # connected once, but no live receiver, nothing elicited
    timing.ptr.heartbeat_timeout_ns = INT64_MAX
    assert timing.next_deadline_ns() == INT64_MAX
    assert timing.setup_due(INT64_MAX) == NO and not timing.heartbeat_due(INT64_MAX)


_timing_calls = st.lists(
    st.tuples(
        st.sampled_from(
            ["sm", "eos", "trigger", "trigger_eos", "error", "setup", "heartbeat", "data", "idle", "deadline"]
        ),
        st.integers(0, 3),
        st.integers(0, 3 * SETUP),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(
    calls=_timing_calls,
    connection_timeout_ns=st.sampled_from([0, 1, SETUP, CONNECTION]),
    initial_setup_interval_ns=st.sampled_from([None, 1, 5_000_000, SETUP, 3 * SETUP]),
)
def test_live_receivers_follow_a_model_and_the_deadline_holds(
    calls: list[tuple[str, int, int]], connection_timeout_ns: int, initial_setup_interval_ns: int | None
) -> None:
    """The live receivers, connection and the answers of on_status_message and
    on_error, after each call, against a plain model (a receiver is live from
    its status message until it says end of stream, sends an error or is silent
    for the connection timeout); and the next deadline is exact: nothing
    happens before it, something at it."""
    timing = NativeTiming(
        T0, connection_timeout_ns=connection_timeout_ns, initial_setup_interval_ns=initial_setup_interval_ns
    )
    live: dict[int, int] = {}  # receiver id -> time of its last status message

    def idle(now_ns: int) -> None:
        for receiver_id in [r for r, heard in live.items() if now_ns - heard >= connection_timeout_ns]:
            del live[receiver_id]

    try:
        now = T0
        for kind, receiver_id, advance in calls:
            now += advance
            if kind == "sm" or kind == "eos":
                eos = kind == "eos"
                was_live = bool(live)
                if eos:
                    live.pop(receiver_id, None)
                else:
                    live[receiver_id] = now
                assert timing.on_status_message(receiver_id, eos, now) == (not was_live and bool(live))
            elif kind.startswith("trigger"):
                timing.on_trigger_send_setup(now, kind == "trigger_eos")
            elif kind == "error":
                assert timing.on_error(receiver_id) == (live.pop(receiver_id, None) is not None)
            elif kind == "setup":
                timing.setup_due(now)
            elif kind == "heartbeat":
                timing.heartbeat_due(now)
            elif kind == "data":
                timing.on_data_sent(now)
            elif kind == "idle":
                timing.on_idle(now)
                idle(now)
            else:
                # Jump to the deadline, checking the nanosecond before it is quiet.
                deadline = timing.next_deadline_ns()
                if deadline == INT64_MAX:
                    continue
                if deadline > now:
                    _nothing_due_before(timing, deadline, [now, deadline - 1])
                    now = deadline
                _something_due_at(timing, now)
                idle(now)
            assert timing.receiver_ids == tuple(sorted(live))
            assert timing.is_connected() == bool(live)
            assert not timing.is_connected(False)
    finally:
        timing.close()
