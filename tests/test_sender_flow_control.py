"""Sender flow control strategies: unicast, max, min, tagged, and choosing one from a channel."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar.channel_uri import ChannelUri, InvalidChannelError
from fulmar.driver.flow_control import (
    FLOW_CONTROL_GROUP_TAG_DEFAULT,
    FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS,
    FlowControl,
    MaxFlowControl,
    MinFlowControl,
    TaggedFlowControl,
    UnicastFlowControl,
    calculate_retransmission_length,
    new_flow_control,
    receiver_window_length,
)
from fulmar.logbuffer import compute_term_id_from_position, compute_term_offset_from_position

TERM_LENGTH = 64 * 1024
BITS = 16
INITIAL_TERM_ID = 7
WINDOW = 32 * 1024
TIMEOUT = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS
MS = 1_000_000


def sm(
    fc: FlowControl,
    position: int,
    receiver_id: int,
    sender_limit: int,
    now_ns: int,
    *,
    window: int = WINDOW,
    tag: int | None = None,
    eos: bool = False,
    initial_term_id: int = INITIAL_TERM_ID,
) -> int:
    """Feed a status message reporting ``position`` and return the new sender limit."""
    return fc.on_status_message(
        compute_term_id_from_position(position, BITS, initial_term_id),
        compute_term_offset_from_position(position, BITS),
        window,
        receiver_id,
        tag,
        sender_limit,
        initial_term_id,
        BITS,
        now_ns,
        is_eos=eos,
    )


# --- unicast and max ---------------------------------------------------------------


@pytest.mark.parametrize("strategy", [UnicastFlowControl, MaxFlowControl])
def test_right_edge_of_status_message_and_never_backwards(strategy: type[MaxFlowControl]) -> None:
    fc = strategy()
    limit = sm(fc, 0, receiver_id=1, sender_limit=0, now_ns=0)
    assert limit == WINDOW
    limit = sm(fc, 1000, receiver_id=1, sender_limit=limit, now_ns=1)
    assert limit == 1000 + WINDOW
    # A late (reordered) status message with an older position cannot shrink the limit.
    assert sm(fc, 500, receiver_id=1, sender_limit=limit, now_ns=2) == 1000 + WINDOW
    assert fc.on_idle(10 * TIMEOUT, limit, 0, False) == limit
    assert fc.has_required_receivers()


def test_position_spans_terms_from_the_initial_term_id() -> None:
    fc = UnicastFlowControl()
    position = 3 * TERM_LENGTH + 4096
    assert sm(fc, position, receiver_id=1, sender_limit=0, now_ns=0) == position + WINDOW
    # Term ids wrap as int32: a stream starting just below 2**31 keeps counting forwards.
    initial = 2**31 - 2
    limit = sm(fc, position, receiver_id=1, sender_limit=0, now_ns=0, initial_term_id=initial)
    assert limit == position + WINDOW


def test_max_follows_the_fastest_receiver_and_ignores_slow_ones() -> None:
    fc = MaxFlowControl()
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 2_000, receiver_id=2, sender_limit=limit, now_ns=1)
    assert limit == 10_000 + WINDOW
    limit = sm(fc, 50_000, receiver_id=3, sender_limit=limit, now_ns=2)
    assert limit == 50_000 + WINDOW
    assert fc.on_idle(3, limit, 40_000, False) == limit


def test_max_tracks_receivers_for_observability_only() -> None:
    fc = MaxFlowControl()
    limit = sm(fc, 1_000, receiver_id=9, sender_limit=0, now_ns=0)
    limit = sm(fc, 3_000, receiver_id=4, sender_limit=limit, now_ns=5)
    limit = sm(fc, 2_000, receiver_id=9, sender_limit=limit, now_ns=6)
    assert fc.receiver_count == 2
    assert [(r.receiver_id, r.position, r.position_plus_window) for r in fc.receivers()] == [
        (4, 3_000, 3_000 + WINDOW),
        (9, 2_000, 2_000 + WINDOW),
    ]
    # Receiver 4 goes quiet and is forgotten after the receiver timeout; the limit stays.
    assert fc.on_idle(5 + TIMEOUT + 1, limit, 0, False) == limit
    assert [r.receiver_id for r in fc.receivers()] == [9]
    # End of stream from receiver 9 forgets it at once.
    sm(fc, 2_000, receiver_id=9, sender_limit=limit, now_ns=7, eos=True)
    assert fc.receiver_count == 0


# --- min ---------------------------------------------------------------------------


def test_min_joins_receivers_and_idles_down_to_the_slowest() -> None:
    fc = MinFlowControl()
    limit = sm(fc, 20_000, receiver_id=1, sender_limit=0, now_ns=0)
    assert limit == 20_000 + WINDOW
    # A slower receiver joins: a status message never moves the limit back ...
    limit = sm(fc, 5_000, receiver_id=2, sender_limit=limit, now_ns=1)
    assert limit == 20_000 + WINDOW
    assert fc.receiver_count == 2
    # ... but idle upkeep does: the limit becomes the slowest right edge.
    limit = fc.on_idle(2, limit, 0, False)
    assert limit == 5_000 + WINDOW
    # The slow receiver catches up past the fast one: the fast one now bounds.
    limit = sm(fc, 30_000, receiver_id=2, sender_limit=limit, now_ns=3)
    assert limit == 20_000 + WINDOW
    limit = sm(fc, 25_000, receiver_id=1, sender_limit=limit, now_ns=4)
    assert limit == 25_000 + WINDOW
    assert [(r.receiver_id, r.position) for r in fc.receivers()] == [(1, 25_000), (2, 30_000)]


def test_min_receiver_timeout_drops_a_silent_receiver() -> None:
    fc = MinFlowControl(receiver_timeout_ns=100 * MS)
    limit = sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 8_000, receiver_id=2, sender_limit=limit, now_ns=0)
    # Receiver 2 keeps talking; receiver 1 goes silent at time 0.
    limit = sm(fc, 9_000, receiver_id=2, sender_limit=limit, now_ns=60 * MS)
    # At exactly the timeout it is still tracked (Aeron drops it strictly after).
    assert fc.on_idle(100 * MS, limit, 0, False) == 1_000 + WINDOW
    assert fc.receiver_count == 2
    assert fc.on_idle(100 * MS + 1, limit, 0, False) == 9_000 + WINDOW
    assert [r.receiver_id for r in fc.receivers()] == [2]
    # When all are gone the limit is left where it is.
    assert fc.on_idle(200 * MS, 12_345, 0, False) == 12_345
    assert fc.receiver_count == 0


def test_t_option_sets_the_receiver_timeout() -> None:
    fc = new_flow_control(ChannelUri.parse("aeron:udp?endpoint=224.0.1.1:40456|fc=min,t:20ms"))
    assert isinstance(fc, MinFlowControl)
    sm(fc, 0, receiver_id=1, sender_limit=0, now_ns=0)
    fc.on_idle(20 * MS, 0, 0, False)
    assert fc.receiver_count == 1
    fc.on_idle(20 * MS + 1, 0, 0, False)
    assert fc.receiver_count == 0


def test_min_does_not_admit_a_receiver_far_behind() -> None:
    fc = MinFlowControl()
    limit = sm(fc, 200_000, receiver_id=1, sender_limit=0, now_ns=0)
    # Its right edge is more than one window below the minimum: not tracked.
    stale = 200_000 - WINDOW - 1
    assert sm(fc, stale, receiver_id=2, sender_limit=limit, now_ns=1) == limit
    assert fc.receiver_count == 1
    # Exactly one window below is admitted.
    sm(fc, 200_000 - WINDOW, receiver_id=3, sender_limit=limit, now_ns=2)
    assert [r.receiver_id for r in fc.receivers()] == [1, 3]


def test_min_end_of_stream_removes_at_idle_and_never_admits() -> None:
    fc = MinFlowControl()
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 4_000, receiver_id=2, sender_limit=limit, now_ns=0)
    # An unknown receiver saying end of stream is not added.
    sm(fc, 4_000, receiver_id=3, sender_limit=limit, now_ns=0, eos=True)
    assert fc.receiver_count == 2
    # Receiver 2 leaves: still counted until the next idle, then dropped.
    sm(fc, 4_000, receiver_id=2, sender_limit=limit, now_ns=1, eos=True)
    assert [r.eos_flagged for r in fc.receivers()] == [False, True]
    assert fc.on_idle(2, limit, 0, False) == 10_000 + WINDOW
    assert [r.receiver_id for r in fc.receivers()] == [1]


def test_min_error_frame_drops_the_receiver_at_idle() -> None:
    fc = MinFlowControl()
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 4_000, receiver_id=2, sender_limit=limit, now_ns=0)
    fc.on_error(2, None, now_ns=1)
    assert fc.on_idle(2, limit, 0, False) == 10_000 + WINDOW
    assert fc.receiver_count == 1


def test_min_group_size_holds_the_limit_until_enough_receivers() -> None:
    fc = new_flow_control(ChannelUri.parse("aeron:udp?endpoint=224.0.1.1:40456|fc=min,g:/2"))
    assert isinstance(fc, MinFlowControl) and fc.group_min_size == 2
    assert not fc.has_required_receivers()
    assert sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0) == 0
    assert fc.on_idle(1, 0, 0, False) == 0
    assert not fc.has_required_receivers()
    limit = sm(fc, 6_000, receiver_id=2, sender_limit=0, now_ns=2)
    assert limit == 6_000 + WINDOW
    assert fc.has_required_receivers()
    # One leaves by timeout: back below the group size, the limit is held.
    sm(fc, 12_000, receiver_id=1, sender_limit=limit, now_ns=TIMEOUT)
    assert fc.on_idle(TIMEOUT + 3, limit, 0, False) == limit
    assert not fc.has_required_receivers()


def test_min_without_group_size_has_required_receivers_even_with_none() -> None:
    fc = MinFlowControl()
    assert fc.has_required_receivers()
    assert fc.on_idle(0, 777, 0, False) == 777


def test_elicited_setup_caps_the_limit_until_the_new_receiver_joins() -> None:
    fc = MinFlowControl(receiver_timeout_ns=100 * MS)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    # A new receiver asks for a SETUP; the limit when it goes out is the cap.
    fc.on_trigger_send_setup(receiver_id=2, group_tag=None, now_ns=1)
    assert fc.on_setup(limit, 0, BITS, now_ns=2) == limit
    # The tracked receiver races ahead, but the sender may not outrun the newcomer.
    assert sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=3) == limit
    assert fc.on_idle(4, limit, 0, False) == limit
    # The newcomer joins: the cap is lifted, the slowest receiver bounds again.
    limit = sm(fc, 20_000, receiver_id=2, sender_limit=limit, now_ns=5)
    assert fc.on_idle(6, limit, 0, False) == 20_000 + WINDOW


def test_setup_cap_expires_after_the_receiver_timeout() -> None:
    fc = MinFlowControl(receiver_timeout_ns=100 * MS)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    fc.on_trigger_send_setup(receiver_id=2, group_tag=None, now_ns=1)
    fc.on_setup(limit, 0, BITS, now_ns=2)
    sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=50 * MS)
    assert fc.on_idle(100 * MS + 2, limit, 0, False) == limit
    assert fc.on_idle(100 * MS + 3, limit, 0, False) == 50_000 + WINDOW


def test_setup_without_a_trigger_sets_no_cap() -> None:
    fc = MinFlowControl()
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    fc.on_setup(limit, 0, BITS, now_ns=1)
    assert sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=2) == 50_000 + WINDOW


# --- tagged ------------------------------------------------------------------------


def test_tagged_tracks_only_receivers_with_the_group_tag() -> None:
    fc = TaggedFlowControl(group_tag=42)
    # No tagged receiver yet: an untagged status message still moves the limit (as Aeron).
    limit = sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0)
    assert limit == 1_000 + WINDOW and fc.receiver_count == 0
    limit = sm(fc, 20_000, receiver_id=2, sender_limit=limit, now_ns=1, tag=42)
    assert limit == 20_000 + WINDOW
    limit = sm(fc, 15_000, receiver_id=3, sender_limit=limit, now_ns=2, tag=42)
    # Untagged and wrongly tagged receivers, however slow or fast, change nothing now.
    assert sm(fc, 100_000, receiver_id=4, sender_limit=limit, now_ns=3, tag=7) == limit
    assert sm(fc, 0, receiver_id=1, sender_limit=limit, now_ns=4) == limit
    assert [r.receiver_id for r in fc.receivers()] == [2, 3]
    assert fc.on_idle(5, limit, 0, False) == 15_000 + WINDOW


def test_tagged_group_min_size_counts_tagged_receivers_only() -> None:
    fc = new_flow_control(ChannelUri.parse("aeron:udp?endpoint=224.0.1.1:40456|fc=tagged,g:99/2"))
    assert isinstance(fc, TaggedFlowControl) and fc.group_tag == 99 and fc.group_min_size == 2
    assert sm(fc, 5_000, receiver_id=1, sender_limit=0, now_ns=0, tag=99) == 0
    assert sm(fc, 5_000, receiver_id=2, sender_limit=0, now_ns=1) == 0
    assert sm(fc, 5_000, receiver_id=3, sender_limit=0, now_ns=2, tag=98) == 0
    assert not fc.has_required_receivers()
    assert sm(fc, 3_000, receiver_id=4, sender_limit=0, now_ns=3, tag=99) == 3_000 + WINDOW
    assert fc.has_required_receivers()


def test_tagged_setup_trigger_counts_only_from_tagged_receivers() -> None:
    fc = TaggedFlowControl(group_tag=42)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0, tag=42)
    fc.on_trigger_send_setup(receiver_id=2, group_tag=None, now_ns=1)
    fc.on_setup(limit, 0, BITS, now_ns=2)
    assert sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=3, tag=42) == 50_000 + WINDOW
    fc.on_trigger_send_setup(receiver_id=2, group_tag=42, now_ns=4)
    fc.on_setup(50_000 + WINDOW, 0, BITS, now_ns=5)
    assert sm(fc, 90_000, receiver_id=1, sender_limit=50_000 + WINDOW, now_ns=6, tag=42) == 50_000 + WINDOW


def test_tagged_error_frame_needs_the_tag() -> None:
    fc = TaggedFlowControl(group_tag=42)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0, tag=42)
    fc.on_error(1, None, now_ns=1)
    fc.on_idle(2, limit, 0, False)
    assert fc.receiver_count == 1
    fc.on_error(1, 42, now_ns=3)
    fc.on_idle(4, limit, 0, False)
    assert fc.receiver_count == 0


# --- retransmission length ---------------------------------------------------------------


def test_retransmission_length_clamps() -> None:
    # Aeron's FlowControlTest cases.
    assert calculate_retransmission_length(1024, 64 * 1024, 0, 16) == 1024
    assert calculate_retransmission_length(1024, 64 * 1024, 64 * 1024 - 512, 16) == 512
    # Window multiple: 16 MiB term, window min(128 KiB, 8 MiB) = 128 KiB.
    big = 16 * 1024 * 1024
    assert receiver_window_length(big) == 128 * 1024
    assert receiver_window_length(64 * 1024) == 32 * 1024
    assert UnicastFlowControl().max_retransmission_length(0, big, big, 1408) == 16 * 128 * 1024
    assert MaxFlowControl().max_retransmission_length(0, big, big, 1408) == 4 * 128 * 1024
    assert MinFlowControl().max_retransmission_length(0, big, big, 1408) == 16 * 128 * 1024
    assert TaggedFlowControl().max_retransmission_length(0, big, big, 1408) == 16 * 128 * 1024


# --- choosing a strategy ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("channel", "expected"),
    [
        ("aeron:udp?endpoint=localhost:40456", UnicastFlowControl),
        ("aeron:udp?endpoint=10.0.0.1:40456", UnicastFlowControl),
        ("aeron:udp?endpoint=224.0.1.1:40456", MaxFlowControl),
        ("aeron:udp?endpoint=[ff02::1]:40456", MaxFlowControl),
        ("aeron:udp?control=10.0.0.1:40457|control-mode=dynamic", MaxFlowControl),
        ("aeron:udp?control-mode=manual", MaxFlowControl),
        ("aeron:udp?endpoint=224.0.1.1:40456|fc=max", MaxFlowControl),
        ("aeron:udp?control-mode=manual|fc=min", MinFlowControl),
        ("aeron:udp?endpoint=224.0.1.1:40456|fc=tagged", TaggedFlowControl),
    ],
)
def test_factory_picks_aeron_defaults(channel: str, expected: type[FlowControl]) -> None:
    fc = new_flow_control(ChannelUri.parse(channel))
    assert type(fc) is expected
    assert fc.receiver_timeout_ns == TIMEOUT


def test_factory_applies_driver_defaults_and_uri_overrides() -> None:
    mdc = "aeron:udp?control=10.0.0.1:40457|control-mode=dynamic"
    fc = new_flow_control(ChannelUri.parse(mdc + "|fc=tagged"))
    assert isinstance(fc, TaggedFlowControl) and fc.group_tag == FLOW_CONTROL_GROUP_TAG_DEFAULT
    fc = new_flow_control(ChannelUri.parse(mdc + "|fc=tagged"), group_tag=5, group_min_size=3, receiver_timeout_ns=7)
    assert isinstance(fc, TaggedFlowControl)
    assert (fc.group_tag, fc.group_min_size, fc.receiver_timeout_ns) == (5, 3, 7)
    fc = new_flow_control(ChannelUri.parse(mdc + "|fc=tagged,g:11/1,t:3s"), group_tag=5, group_min_size=3)
    assert isinstance(fc, TaggedFlowControl)
    assert (fc.group_tag, fc.group_min_size, fc.receiver_timeout_ns) == (11, 1, 3_000_000_000)
    # The driver may choose min as the multicast default.
    assert type(new_flow_control(ChannelUri.parse(mdc), multicast_default="min")) is MinFlowControl


def test_min_ignores_a_group_tag() -> None:
    fc = new_flow_control(ChannelUri.parse("aeron:udp?endpoint=224.0.1.1:40456|fc=min,g:5/0"))
    assert isinstance(fc, MinFlowControl) and not isinstance(fc, TaggedFlowControl)
    sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0, tag=None)
    sm(fc, 1_000, receiver_id=2, sender_limit=0, now_ns=0, tag=6)
    assert fc.receiver_count == 2


def test_fc_on_a_unicast_channel_is_rejected() -> None:
    with pytest.raises(InvalidChannelError, match="fc"):
        new_flow_control(ChannelUri.parse("aeron:udp?endpoint=10.0.0.1:40456|fc=min"))


# --- properties ----------------------------------------------------------------------

# One step: (receiver id, position, tag, eos, then idle?, time advance)
_steps = st.lists(
    st.tuples(
        st.integers(0, 4),
        st.integers(0, WINDOW),
        st.sampled_from([None, 42, 43]),
        st.booleans(),
        st.booleans(),
        st.integers(0, TIMEOUT // 2),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(steps=_steps, group_min_size=st.integers(0, 3), tagged=st.booleans())
def test_min_and_tagged_match_a_model(
    steps: list[tuple[int, int, int | None, bool, bool, int]], group_min_size: int, tagged: bool
) -> None:
    """Against a plain model: which receivers are tracked, the limit after each message and each idle.

    Positions stay within one window of each other, so every receiver is admissible.
    """
    fc: MinFlowControl = TaggedFlowControl(42, TIMEOUT, group_min_size) if tagged else MinFlowControl(TIMEOUT, group_min_size)
    tracked: dict[int, list[int]] = {}  # id -> [right edge, time, eos]
    limit = 0
    now = 0
    for receiver_id, position, tag, eos, idle, advance in steps:
        now += advance
        right_edge = position + WINDOW
        matches = not tagged or tag == 42
        if matches and receiver_id in tracked:
            tracked[receiver_id] = [right_edge, now, int(eos)]
        minimum = min((r[0] for r in tracked.values()), default=None)
        if matches and receiver_id not in tracked and not eos:
            tracked[receiver_id] = [right_edge, now, 0]
            minimum = right_edge if minimum is None else min(minimum, right_edge)
        if len(tracked) < group_min_size:
            expected = limit
        elif not tracked:
            expected = max(limit, right_edge)
        else:
            assert minimum is not None
            expected = max(limit, minimum)
        limit = sm(fc, position, receiver_id, limit, now, tag=tag, eos=eos)
        assert limit == expected
        assert fc.has_required_receivers() == (len(tracked) >= group_min_size)

        if idle:
            tracked = {k: r for k, r in tracked.items() if r[1] + TIMEOUT - now >= 0 and not r[2]}
            new_limit = fc.on_idle(now, limit, 0, False)
            if tracked and len(tracked) >= group_min_size:
                # Never beyond the slowest live receiver's right edge.
                assert new_limit == min(r[0] for r in tracked.values())
            else:
                assert new_limit == limit
            limit = new_limit
        assert sorted(tracked) == [r.receiver_id for r in fc.receivers()]


@settings(max_examples=150, deadline=None)
@given(
    reports=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10 * TERM_LENGTH), st.integers(0, WINDOW)), max_size=40),
    unicast=st.booleans(),
)
def test_max_limit_is_the_furthest_right_edge_reported(reports: list[tuple[int, int, int]], unicast: bool) -> None:
    fc: MaxFlowControl = UnicastFlowControl() if unicast else MaxFlowControl()
    limit = 0
    for now, (receiver_id, position, window) in enumerate(reports):
        limit = sm(fc, position, receiver_id, limit, now, window=window)
        assert limit == max(p + w for _, p, w in reports[: now + 1])
        assert fc.on_idle(now, limit, 0, False) == limit
