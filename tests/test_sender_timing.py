"""Sender timing (SETUP, heartbeat, connection) and datagram packing of the send window."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar.driver.sender_timing import (
    PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS,
    PUBLICATION_HEARTBEAT_TIMEOUT_NS,
    PUBLICATION_SETUP_TIMEOUT_NS,
    Datagram,
    SenderTiming,
    SetupDue,
    TermFrame,
    frame_reader,
    pack_datagrams,
    plan_send,
    scan_for_availability,
    sendable_length,
)
from fulmar.errors import CorruptFrameError
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH, align

SETUP = PUBLICATION_SETUP_TIMEOUT_NS
HEARTBEAT = PUBLICATION_HEARTBEAT_TIMEOUT_NS
CONNECTION = PUBLICATION_CONNECTION_TIMEOUT_DEFAULT_NS
T0 = 1_000_000_000_000
TERM_LENGTH = 64 * 1024
MTU = 1408


# --- SETUP ------------------------------------------------------------------------


def test_setup_is_resent_every_setup_timeout_until_a_status_message() -> None:
    assert SETUP == HEARTBEAT == 100_000_000 and CONNECTION == 5_000_000_000
    timing = SenderTiming(T0)
    assert timing.setup_due(T0) is SetupDue.INITIAL
    assert timing.setup_due(T0 + 1) is SetupDue.NO
    assert timing.setup_due(T0 + SETUP) is SetupDue.NO  # strictly after the timeout
    assert timing.setup_due(T0 + SETUP + 1) is SetupDue.INITIAL
    assert timing.setup_due(T0 + 2 * SETUP + 1) is SetupDue.NO
    assert timing.setup_due(T0 + 2 * SETUP + 2) is SetupDue.INITIAL
    assert timing.on_status_message(receiver_id=7, is_eos=False, now_ns=T0 + 2 * SETUP + 3)
    assert timing.setup_due(T0 + 10 * SETUP) is SetupDue.NO
    assert not SetupDue.NO and SetupDue.INITIAL and SetupDue.ELICITED


def test_setup_elicited_by_a_receiver_is_sent_once_receivers_are_live() -> None:
    timing = SenderTiming(T0)
    timing.setup_due(T0)
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0 + 1)
    timing.on_trigger_send_setup(T0 + 2)
    assert timing.is_setup_elicited
    assert timing.setup_due(T0 + 3) is SetupDue.NO  # still within the setup timeout of the last SETUP
    assert timing.setup_due(T0 + SETUP + 1) is SetupDue.ELICITED
    assert not timing.is_setup_elicited
    assert timing.setup_due(T0 + 5 * SETUP) is SetupDue.NO


def test_elicited_setup_repeats_while_no_receiver_is_live() -> None:
    timing = SenderTiming(T0)
    timing.on_status_message(receiver_id=1, is_eos=True, now_ns=T0)  # a connection, but no live receiver
    assert not timing.has_receivers
    timing.on_trigger_send_setup(T0)
    assert timing.setup_due(T0 + 1) is SetupDue.ELICITED
    assert timing.setup_due(T0 + SETUP + 2) is SetupDue.ELICITED
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0 + SETUP + 3)
    assert timing.setup_due(T0 + 2 * SETUP + 3) is SetupDue.ELICITED
    assert timing.setup_due(T0 + 4 * SETUP) is SetupDue.NO


def test_setup_trigger_is_ignored_at_end_of_stream() -> None:
    timing = SenderTiming(T0)
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0)
    timing.on_trigger_send_setup(T0 + 1, is_end_of_stream=True)
    assert not timing.is_setup_elicited
    assert timing.setup_due(T0 + SETUP * 3) is SetupDue.NO


# --- heartbeat -------------------------------------------------------------------------


def test_heartbeat_only_after_the_first_status_message_and_after_100ms_without_data() -> None:
    timing = SenderTiming(T0)
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


def test_connected_while_status_messages_arrive_within_the_connection_timeout() -> None:
    timing = SenderTiming(T0)
    assert not timing.is_connected()
    assert timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0)
    assert not timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0 + 1_000)
    assert timing.is_connected()
    assert not timing.is_connected(has_required_receivers=False)
    timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0 + CONNECTION - 1)
    timing.on_idle(T0 + CONNECTION)  # receiver 1 silent for the whole timeout: gone
    assert timing.liveness.receiver_ids == (2,)
    assert timing.is_connected()
    timing.on_idle(T0 + 2 * CONNECTION - 2)
    assert timing.is_connected()
    timing.on_idle(T0 + 2 * CONNECTION - 1)
    assert not timing.is_connected()
    # A later status message reconnects, without a new SETUP phase.
    assert timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0 + 3 * CONNECTION)
    assert timing.is_connected() and timing.setup_due(T0 + 4 * CONNECTION) is SetupDue.NO


def test_end_of_stream_and_error_remove_a_receiver_at_once() -> None:
    timing = SenderTiming(T0, connection_timeout_ns=1_000)
    timing.on_status_message(receiver_id=1, is_eos=False, now_ns=T0)
    timing.on_status_message(receiver_id=2, is_eos=False, now_ns=T0)
    timing.on_status_message(receiver_id=1, is_eos=True, now_ns=T0 + 1)
    assert timing.liveness.receiver_ids == (2,) and timing.is_connected()
    assert timing.on_error(2) and not timing.on_error(2)
    assert not timing.is_connected()
    assert timing.time_of_last_status_message_ns == T0 + 1


# --- scanning and packing ------------------------------------------------------------------


def frames_of(lengths: list[int], start: int = 0) -> list[TermFrame]:
    frames, offset = [], start
    for length in lengths:
        frames.append(TermFrame(offset, length))
        offset += align(length, FRAME_ALIGNMENT)
    return frames


def test_scan_packs_whole_frames_up_to_the_limit() -> None:
    frame_at = frame_reader(frames_of([100, 200, 64, 1000]))  # aligned 128, 224, 64, 1024
    assert scan_for_availability(frame_at, 0, MTU, TERM_LENGTH) == (128 + 224 + 64, 0)
    assert scan_for_availability(frame_at, 0, 128 + 224, TERM_LENGTH) == (352, 0)
    assert scan_for_availability(frame_at, 0, 351, TERM_LENGTH) == (128, 0)
    # A first frame that does not fit reports its size, negated.
    assert scan_for_availability(frame_at, 0, 100, TERM_LENGTH) == (-128, 0)
    # Nothing committed yet.
    assert scan_for_availability(frame_at, 416 + 1024, MTU, TERM_LENGTH) == (0, 0)


def test_padding_frame_sends_its_header_and_skips_the_rest() -> None:
    frames = [*frames_of([96]), TermFrame(96, TERM_LENGTH - 96, is_padding=True)]
    frame_at = frame_reader(frames)
    assert scan_for_availability(frame_at, 0, MTU, TERM_LENGTH) == (96 + HEADER_LENGTH, TERM_LENGTH - 96 - HEADER_LENGTH)
    datagrams = pack_datagrams(frame_at, 0, TERM_LENGTH, MTU, TERM_LENGTH)
    assert datagrams == [Datagram(0, 128, TERM_LENGTH - 128)]
    assert datagrams[0].advance == TERM_LENGTH
    # The scan stops at the padding frame, whatever its body holds.
    garbage = frame_reader([*frames, TermFrame(128, 64), TermFrame(192, 64)])
    assert scan_for_availability(garbage, 0, MTU, TERM_LENGTH) == (128, TERM_LENGTH - 128)
    # The padding counts as its header against the window, so a small window still crosses the term end.
    assert pack_datagrams(frame_at, 96, 32, MTU, TERM_LENGTH) == [Datagram(96, 32, TERM_LENGTH - 128)]


def test_pack_splits_at_frame_boundaries_within_the_mtu() -> None:
    frame_at = frame_reader(frames_of([1000, 1000, 300, 300, 300, 300]))  # 1024 x2, 320 x4
    assert pack_datagrams(frame_at, 0, TERM_LENGTH, MTU, TERM_LENGTH) == [
        Datagram(0, 1024),
        Datagram(1024, 1024 + 320),
        Datagram(2368, 960),
    ]
    assert pack_datagrams(frame_at, 0, TERM_LENGTH, MTU, TERM_LENGTH, max_datagrams=2) == [
        Datagram(0, 1024),
        Datagram(1024, 1024 + 320),
    ]
    # The window cuts before a frame that does not fit.
    assert pack_datagrams(frame_at, 0, 2368 + 319, MTU, TERM_LENGTH) == [Datagram(0, 1024), Datagram(1024, 1344)]


def test_frame_longer_than_the_mtu_is_corrupt() -> None:
    frame_at = frame_reader(frames_of([64, MTU + 1]))
    assert pack_datagrams(frame_at, 0, TERM_LENGTH, MTU, TERM_LENGTH) == [Datagram(0, 64)]
    with pytest.raises(CorruptFrameError, match="longer than the MTU"):
        pack_datagrams(frame_at, 64, TERM_LENGTH, MTU, TERM_LENGTH)


def test_send_window_is_bounded_by_the_limit_and_the_producer() -> None:
    assert sendable_length(1000, 5000, 3000) == 2000
    assert sendable_length(1000, 2000, 3000) == 1000
    assert sendable_length(1000, 900, 3000) == 0
    assert sendable_length(1000, 5000, 1000) == 0


def test_plan_send_in_a_later_term_and_flow_control_limits() -> None:
    sender_position = 5 * TERM_LENGTH + 1024
    frame_at = frame_reader(frames_of([500, 500, 500], start=1024))  # 512 each
    plan = plan_send(frame_at, sender_position, sender_position + 1024, sender_position + 1536, MTU, TERM_LENGTH)
    assert plan.datagrams == [Datagram(1024, 1024)]
    assert plan.advance == 1024 and plan.is_flow_control_limited  # the third frame waits for the window
    plan = plan_send(frame_at, sender_position, sender_position + 4096, sender_position + 1536, MTU, TERM_LENGTH)
    assert plan.datagrams == [Datagram(1024, 1024), Datagram(2048, 512)] and not plan.is_flow_control_limited
    # No window at all.
    assert plan_send(frame_at, sender_position, sender_position, sender_position + 1536, MTU, TERM_LENGTH) == ([], True)
    # Window smaller than the first frame.
    plan = plan_send(frame_at, sender_position, sender_position + 100, sender_position + 1536, MTU, TERM_LENGTH)
    assert plan.datagrams == [] and plan.is_flow_control_limited
    # Nothing committed: not limited by the window.
    plan = plan_send(frame_reader([]), sender_position, sender_position + 4096, sender_position, MTU, TERM_LENGTH)
    assert plan == ([], False)


@st.composite
def terms(draw: st.DrawFn) -> tuple[list[TermFrame], int, int]:
    """A term of committed frames (each at most the MTU), maybe padded to its end; the MTU; the term length."""
    mtu = draw(st.sampled_from([64, 96, 1408, 4096]))
    term_length = draw(st.sampled_from([1024, 4096]))
    frames: list[TermFrame] = []
    offset = 0
    for length in draw(st.lists(st.integers(HEADER_LENGTH, mtu), max_size=60)):
        if offset + align(length, FRAME_ALIGNMENT) > term_length:
            break
        frames.append(TermFrame(offset, length))
        offset += align(length, FRAME_ALIGNMENT)
    if offset < term_length and draw(st.booleans()):
        frames.append(TermFrame(offset, term_length - offset, is_padding=True))
    return frames, mtu, term_length


@settings(max_examples=300, deadline=None)
@given(term=terms(), start_index=st.integers(0, 60), window=st.integers(0, 5000), max_datagrams=st.none() | st.integers(1, 4))
def test_packing_never_splits_a_frame_nor_exceeds_the_mtu(
    term: tuple[list[TermFrame], int, int], start_index: int, window: int, max_datagrams: int | None
) -> None:
    frames, mtu, term_length = term
    starts = [f.term_offset for f in frames] or [0]
    start = starts[min(start_index, len(starts) - 1)]
    by_offset = {f.term_offset: f for f in frames}
    datagrams = pack_datagrams(frame_reader(frames), start, window, mtu, term_length, max_datagrams)
    if max_datagrams is not None:
        assert len(datagrams) <= max_datagrams

    offset = start
    budget = window
    for index, datagram in enumerate(datagrams):
        assert datagram.term_offset == offset  # contiguous
        assert 0 < datagram.length <= mtu
        assert datagram.length <= budget  # within the window (a padding frame counts as its header)
        # It holds whole frames: walk them.
        end = offset + datagram.length
        while offset < end:
            frame = by_offset[offset]
            offset += HEADER_LENGTH if frame.is_padding else align(frame.frame_length, FRAME_ALIGNMENT)
            if frame.is_padding:
                assert offset == end and datagram.padding == frame.frame_length - HEADER_LENGTH
        assert offset == end
        offset += datagram.padding
        budget -= datagram.advance
        # Greedy: the next frame would not have fitted in this datagram.
        following = by_offset.get(offset)
        if following is not None and index + 1 < len(datagrams):
            assert datagram.length + align(following.frame_length, FRAME_ALIGNMENT) > mtu
    # Maximal: what follows is absent, past the term end, or does not fit in what is left.
    following = by_offset.get(offset)
    if following is not None and (max_datagrams is None or len(datagrams) < max_datagrams):
        needed = HEADER_LENGTH if following.is_padding else align(following.frame_length, FRAME_ALIGNMENT)
        assert needed > min(mtu, budget)


def test_an_initial_setup_interval_backs_off_to_the_setup_timeout_until_a_status_message() -> None:
    initial = 5_000_000
    timing = SenderTiming(T0, initial_setup_interval_ns=initial)
    sent = [t for t in range(T0, T0 + 400_000_000, 1_000_000) if timing.setup_due(t) is SetupDue.INITIAL]
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    # 5, 10, 20, 40, 80 ms (each strictly after its interval, on a 1 ms clock), then Aeron's 100 ms.
    assert gaps[:5] == [6_000_000, 11_000_000, 21_000_000, 41_000_000, 81_000_000]
    assert set(gaps[5:]) == {SETUP + 1_000_000}
    # Once a receiver has answered, SETUP is sent only when elicited, at the setup timeout's pace.
    timing.on_status_message(1, False, T0 + 400_000_000)
    assert timing.setup_due(T0 + 500_000_000) is SetupDue.NO
    timing.on_trigger_send_setup(T0 + 500_000_000)
    assert timing.setup_due(T0 + 500_000_001) is SetupDue.ELICITED
    assert timing.setup_due(T0 + 500_000_001 + initial + 1) is SetupDue.NO


def test_setup_backing_off_only_until_the_setup_timeout_pace_or_a_receiver() -> None:
    timing = SenderTiming(T0, initial_setup_interval_ns=10_000_000)
    assert timing.setup_backing_off
    t = T0
    while timing.setup_backing_off:
        timing.setup_due(t)
        t += 1_000_000
    assert t - T0 < SETUP * 3  # the fast SETUPs are over within a few hundred ms
    assert not SenderTiming(T0).setup_backing_off  # Aeron's pace from the start
    answered = SenderTiming(T0, initial_setup_interval_ns=10_000_000)
    answered.on_status_message(1, False, T0)
    assert not answered.setup_backing_off
