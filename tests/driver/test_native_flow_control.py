"""The C flow control strategies (flow_control.c): unicast, max, min and
tagged, the retransmission length, bad arguments, and properties against
small models written here (the limit, the tracked receivers) on random
sequences of calls.

Which strategy a channel gets is tests/driver/test_driver_flow_control_settings.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar._native import ffi, lib
from fulmar.channel_uri import ChannelUri
from fulmar.driver.data_plane import FlowControlSettings, flow_control_settings
from fulmar.logbuffer import compute_position, compute_term_id_from_position, compute_term_offset_from_position

TERM_LENGTH = 64 * 1024
BITS = 16
INITIAL_TERM_ID = 7
WINDOW = 32 * 1024
TIMEOUT = lib.FULMAR_FC_RECEIVER_TIMEOUT_DEFAULT_NS
GROUP_TAG_DEFAULT = lib.FULMAR_FC_GROUP_TAG_DEFAULT
GROUP_MIN_SIZE_DEFAULT = lib.FULMAR_FC_GROUP_MIN_SIZE_DEFAULT
MS = 1_000_000
INT64_MAX = (1 << 63) - 1

UNICAST = lib.FULMAR_FC_UNICAST
MAX = lib.FULMAR_FC_MAX
MIN = lib.FULMAR_FC_MIN
TAGGED = lib.FULMAR_FC_TAGGED


class NativeFc:
    """A fulmar_fc_t driven through lib."""

    def __init__(
        self,
        strategy: int,
        receiver_timeout_ns: int = TIMEOUT,
        group_min_size: int = GROUP_MIN_SIZE_DEFAULT,
        group_tag: int = GROUP_TAG_DEFAULT,
    ) -> None:
        self.ptr = ffi.new("fulmar_fc_t *")
        assert lib.fulmar_fc_init(self.ptr, strategy, receiver_timeout_ns, group_min_size, group_tag) == 0

    @classmethod
    def of(cls, settings: FlowControlSettings) -> NativeFc:
        """The C strategy a publication gets for these settings (as network_publication passes them)."""
        return cls(settings.strategy, settings.receiver_timeout_ns, settings.group_min_size, settings.group_tag)

    def close(self) -> None:
        lib.fulmar_fc_close(self.ptr)

    @property
    def receiver_count(self) -> int:
        return int(self.ptr.receiver_count)

    def receivers(self) -> list[tuple[int, int, int, int, bool]]:
        """(id, position, position + window, time of last SM, eos), ordered by receiver id."""
        fc = self.ptr
        rows = [
            (
                r.receiver_id,
                r.position,
                r.position_plus_window,
                r.time_of_last_status_message_ns,
                bool(r.eos_flagged),
            )
            for r in (fc.receivers[i] for i in range(fc.receiver_count))
        ]
        return sorted(rows)

    def receiver_ids(self) -> list[int]:
        return [r[0] for r in self.receivers()]

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
        return int(
            lib.fulmar_fc_on_status_message(
                self.ptr,
                consumption_term_id,
                consumption_term_offset,
                receiver_window,
                receiver_id,
                group_tag is not None,
                group_tag or 0,
                sender_limit,
                initial_term_id,
                position_bits_to_shift,
                now_ns,
                is_eos,
            )
        )

    def on_idle(self, now_ns: int, sender_limit: int, sender_position: int, is_eos: bool) -> int:
        return int(lib.fulmar_fc_on_idle(self.ptr, now_ns, sender_limit, sender_position, is_eos))

    def on_trigger_send_setup(self, receiver_id: int, group_tag: int | None, now_ns: int) -> None:
        lib.fulmar_fc_on_trigger_send_setup(self.ptr, receiver_id, group_tag is not None, group_tag or 0, now_ns)

    def on_setup(self, sender_limit: int, sender_position: int, position_bits_to_shift: int, now_ns: int) -> int:
        return int(lib.fulmar_fc_on_setup(self.ptr, sender_limit, sender_position, position_bits_to_shift, now_ns))

    def on_error(self, receiver_id: int, group_tag: int | None, now_ns: int) -> None:
        lib.fulmar_fc_on_error(self.ptr, receiver_id, group_tag is not None, group_tag or 0, now_ns)

    def has_required_receivers(self) -> bool:
        result = lib.fulmar_fc_has_required_receivers(self.ptr)
        assert result in (0, 1)
        return bool(result)

    def max_retransmission_length(self, term_offset: int, resend_length: int, term_length: int) -> int:
        return int(lib.fulmar_fc_max_retransmission_length(self.ptr, term_offset, resend_length, term_length))


@pytest.fixture
def native() -> Iterator[Any]:
    """new(strategy, ...) or new.of(channel): strategies closed at teardown."""
    made: list[NativeFc] = []

    class Factory:
        def __call__(self, *args: Any, **kwargs: Any) -> NativeFc:
            made.append(NativeFc(*args, **kwargs))
            return made[-1]

        def of(self, channel: str, **defaults: Any) -> NativeFc:
            """The C strategy for a channel, as flow_control_settings chooses it."""
            made.append(NativeFc.of(flow_control_settings(ChannelUri.parse(channel), **defaults)))
            return made[-1]

    yield Factory()
    for fc in made:
        fc.close()


def sm(
    fc: NativeFc,
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


@pytest.mark.parametrize("strategy", [UNICAST, MAX])
def test_right_edge_of_status_message_and_never_backwards(native: Any, strategy: int) -> None:
    fc = native(strategy)
    limit = sm(fc, 0, receiver_id=1, sender_limit=0, now_ns=0)
    assert limit == WINDOW
    limit = sm(fc, 1000, receiver_id=1, sender_limit=limit, now_ns=1)
    assert limit == 1000 + WINDOW
    # A late (reordered) status message with an older position cannot shrink the limit.
    assert sm(fc, 500, receiver_id=1, sender_limit=limit, now_ns=2) == 1000 + WINDOW
    assert fc.on_idle(10 * TIMEOUT, limit, 0, False) == limit
    assert fc.has_required_receivers()


def test_position_spans_terms_from_the_initial_term_id(native: Any) -> None:
    fc = native(UNICAST)
    position = 3 * TERM_LENGTH + 4096
    assert sm(fc, position, receiver_id=1, sender_limit=0, now_ns=0) == position + WINDOW
    # Term ids wrap as int32: a stream starting just below 2**31 keeps counting forwards.
    initial = 2**31 - 2
    limit = sm(fc, position, receiver_id=1, sender_limit=0, now_ns=0, initial_term_id=initial)
    assert limit == position + WINDOW


def test_term_id_wrap_at_both_ends_and_far_positions(native: Any) -> None:
    # The consumption term id has wrapped past INT32_MAX to negative values.
    fc = native(MAX)
    initial = 2**31 - 1
    position = 5 * TERM_LENGTH + 64
    assert compute_term_id_from_position(position, BITS, initial) < 0
    assert sm(fc, position, receiver_id=1, sender_limit=0, now_ns=0, initial_term_id=initial) == position + WINDOW
    # A term id behind the initial one is a negative position, as compute_position says.
    fc = native(MAX)
    limit = fc.on_status_message(INITIAL_TERM_ID - 1, 0, WINDOW, 1, None, -(1 << 40), INITIAL_TERM_ID, BITS, 0)
    assert limit == -TERM_LENGTH + WINDOW
    # The furthest positions of 2**31-byte terms, either side of the initial term: no overflow.
    for term_id in (2**31 - 1, -(2**31)):
        fc = native(MAX)
        args = (term_id, 2**31 - 1, 2**31 - 1, 1, None, -(1 << 63), 0, 31, 0)
        limit = fc.on_status_message(*args)
        assert limit == compute_position(term_id, 2**31 - 1, 31, 0) + 2**31 - 1
        assert limit == (term_id << 31) + 2 * (2**31 - 1)


def test_max_follows_the_fastest_receiver_and_ignores_slow_ones(native: Any) -> None:
    fc = native(MAX)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 2_000, receiver_id=2, sender_limit=limit, now_ns=1)
    assert limit == 10_000 + WINDOW
    limit = sm(fc, 50_000, receiver_id=3, sender_limit=limit, now_ns=2)
    assert limit == 50_000 + WINDOW
    assert fc.on_idle(3, limit, 40_000, False) == limit


def test_max_tracks_receivers_for_observability_only(native: Any) -> None:
    fc = native(MAX)
    limit = sm(fc, 1_000, receiver_id=9, sender_limit=0, now_ns=0)
    limit = sm(fc, 3_000, receiver_id=4, sender_limit=limit, now_ns=5)
    limit = sm(fc, 2_000, receiver_id=9, sender_limit=limit, now_ns=6)
    assert fc.receiver_count == 2
    assert [(r[0], r[1], r[2]) for r in fc.receivers()] == [
        (4, 3_000, 3_000 + WINDOW),
        (9, 2_000, 2_000 + WINDOW),
    ]
    # Receiver 4 goes quiet and is forgotten after the receiver timeout; the limit stays.
    assert fc.on_idle(5 + TIMEOUT + 1, limit, 0, False) == limit
    assert fc.receiver_ids() == [9]
    # End of stream from receiver 9 forgets it at once.
    sm(fc, 2_000, receiver_id=9, sender_limit=limit, now_ns=7, eos=True)
    assert fc.receiver_count == 0


# --- min ---------------------------------------------------------------------------


def test_min_joins_receivers_and_idles_down_to_the_slowest(native: Any) -> None:
    fc = native(MIN)
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
    assert [(r[0], r[1]) for r in fc.receivers()] == [(1, 25_000), (2, 30_000)]


def test_min_receiver_timeout_drops_a_silent_receiver(native: Any) -> None:
    fc = native(MIN, receiver_timeout_ns=100 * MS)
    limit = sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 8_000, receiver_id=2, sender_limit=limit, now_ns=0)
    # Receiver 2 keeps talking; receiver 1 goes silent at time 0.
    limit = sm(fc, 9_000, receiver_id=2, sender_limit=limit, now_ns=60 * MS)
    # At exactly the timeout it is still tracked (Aeron drops it strictly after).
    assert fc.on_idle(100 * MS, limit, 0, False) == 1_000 + WINDOW
    assert fc.receiver_count == 2
    assert fc.on_idle(100 * MS + 1, limit, 0, False) == 9_000 + WINDOW
    assert fc.receiver_ids() == [2]
    # When all are gone the limit is left where it is.
    assert fc.on_idle(200 * MS, 12_345, 0, False) == 12_345
    assert fc.receiver_count == 0


def test_t_option_sets_the_receiver_timeout(native: Any) -> None:
    fc = native.of("aeron:udp?endpoint=224.0.1.1:40456|fc=min,t:20ms")
    assert fc.ptr.strategy == MIN and fc.ptr.receiver_timeout_ns == 20 * MS
    sm(fc, 0, receiver_id=1, sender_limit=0, now_ns=0)
    fc.on_idle(20 * MS, 0, 0, False)
    assert fc.receiver_count == 1
    fc.on_idle(20 * MS + 1, 0, 0, False)
    assert fc.receiver_count == 0


def test_min_does_not_admit_a_receiver_far_behind(native: Any) -> None:
    fc = native(MIN)
    limit = sm(fc, 200_000, receiver_id=1, sender_limit=0, now_ns=0)
    # Its right edge is more than one window below the minimum: not tracked.
    stale = 200_000 - WINDOW - 1
    assert sm(fc, stale, receiver_id=2, sender_limit=limit, now_ns=1) == limit
    assert fc.receiver_count == 1
    # Exactly one window below is admitted.
    sm(fc, 200_000 - WINDOW, receiver_id=3, sender_limit=limit, now_ns=2)
    assert fc.receiver_ids() == [1, 3]


def test_min_end_of_stream_removes_at_idle_and_never_admits(native: Any) -> None:
    fc = native(MIN)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 4_000, receiver_id=2, sender_limit=limit, now_ns=0)
    # An unknown receiver saying end of stream is not added.
    sm(fc, 4_000, receiver_id=3, sender_limit=limit, now_ns=0, eos=True)
    assert fc.receiver_count == 2
    # Receiver 2 leaves: still counted until the next idle, then dropped.
    sm(fc, 4_000, receiver_id=2, sender_limit=limit, now_ns=1, eos=True)
    assert [r[4] for r in fc.receivers()] == [False, True]
    assert fc.on_idle(2, limit, 0, False) == 10_000 + WINDOW
    assert fc.receiver_ids() == [1]


def test_min_error_frame_drops_the_receiver_at_idle(native: Any) -> None:
    fc = native(MIN)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    limit = sm(fc, 4_000, receiver_id=2, sender_limit=limit, now_ns=0)
    fc.on_error(2, None, now_ns=1)
    assert fc.on_idle(2, limit, 0, False) == 10_000 + WINDOW
    assert fc.receiver_count == 1


def test_min_group_size_holds_the_limit_until_enough_receivers(native: Any) -> None:
    fc = native.of("aeron:udp?endpoint=224.0.1.1:40456|fc=min,g:/2")
    assert fc.ptr.strategy == MIN and fc.ptr.group_min_size == 2
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


def test_min_without_group_size_has_required_receivers_even_with_none(native: Any) -> None:
    fc = native(MIN)
    assert fc.has_required_receivers()
    assert fc.on_idle(0, 777, 0, False) == 777


def test_elicited_setup_caps_the_limit_until_the_new_receiver_joins(native: Any) -> None:
    fc = native(MIN, receiver_timeout_ns=100 * MS)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    # A new receiver asks for a SETUP; the limit when it goes out is the cap.
    fc.on_trigger_send_setup(receiver_id=2, group_tag=None, now_ns=1)
    assert fc.on_setup(limit, 0, BITS, now_ns=2) == limit
    assert fc.ptr.has_last_setup_sender_limit and fc.ptr.last_setup_sender_limit == limit
    # The tracked receiver races ahead, but the sender may not outrun the newcomer.
    assert sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=3) == limit
    assert fc.on_idle(4, limit, 0, False) == limit
    # The newcomer joins: the cap is lifted, the slowest receiver bounds again.
    limit = sm(fc, 20_000, receiver_id=2, sender_limit=limit, now_ns=5)
    assert not fc.ptr.has_last_setup_sender_limit
    assert fc.on_idle(6, limit, 0, False) == 20_000 + WINDOW


def test_setup_cap_expires_after_the_receiver_timeout(native: Any) -> None:
    fc = native(MIN, receiver_timeout_ns=100 * MS)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    fc.on_trigger_send_setup(receiver_id=2, group_tag=None, now_ns=1)
    fc.on_setup(limit, 0, BITS, now_ns=2)
    sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=50 * MS)
    assert fc.on_idle(100 * MS + 2, limit, 0, False) == limit
    assert fc.on_idle(100 * MS + 3, limit, 0, False) == 50_000 + WINDOW


def test_setup_without_a_trigger_sets_no_cap(native: Any) -> None:
    fc = native(MIN)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    fc.on_setup(limit, 0, BITS, now_ns=1)
    assert sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=2) == 50_000 + WINDOW


def test_setup_trigger_with_no_receiver_tracked_sets_no_cap(native: Any) -> None:
    fc = native(MIN)
    fc.on_trigger_send_setup(receiver_id=1, group_tag=None, now_ns=0)
    assert fc.on_setup(100, 0, BITS, now_ns=1) == 100
    assert not fc.ptr.has_last_setup_sender_limit and not fc.ptr.has_tagged_status_message_triggered_setup


@pytest.mark.parametrize("strategy", [UNICAST, MAX])
def test_setup_and_error_do_nothing_for_unicast_and_max(native: Any, strategy: int) -> None:
    fc = native(strategy)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0)
    fc.on_trigger_send_setup(receiver_id=2, group_tag=None, now_ns=1)
    assert fc.on_setup(limit, 0, BITS, now_ns=2) == limit
    fc.on_error(1, None, now_ns=3)
    assert sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=4) == 50_000 + WINDOW
    assert fc.on_idle(5, 50_000 + WINDOW, 0, False) == 50_000 + WINDOW
    assert fc.receiver_ids() == [1]


# --- tagged ------------------------------------------------------------------------


def test_tagged_tracks_only_receivers_with_the_group_tag(native: Any) -> None:
    fc = native(TAGGED, group_tag=42)
    # No tagged receiver yet: an untagged status message still moves the limit (as Aeron).
    limit = sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0)
    assert limit == 1_000 + WINDOW and fc.receiver_count == 0
    limit = sm(fc, 20_000, receiver_id=2, sender_limit=limit, now_ns=1, tag=42)
    assert limit == 20_000 + WINDOW
    limit = sm(fc, 15_000, receiver_id=3, sender_limit=limit, now_ns=2, tag=42)
    # Untagged and wrongly tagged receivers, however slow or fast, change nothing now.
    assert sm(fc, 100_000, receiver_id=4, sender_limit=limit, now_ns=3, tag=7) == limit
    assert sm(fc, 0, receiver_id=1, sender_limit=limit, now_ns=4) == limit
    assert fc.receiver_ids() == [2, 3]
    assert fc.on_idle(5, limit, 0, False) == 15_000 + WINDOW


def test_tagged_group_min_size_counts_tagged_receivers_only(native: Any) -> None:
    fc = native.of("aeron:udp?endpoint=224.0.1.1:40456|fc=tagged,g:99/2")
    assert (fc.ptr.strategy, fc.ptr.group_tag, fc.ptr.group_min_size) == (TAGGED, 99, 2)
    assert sm(fc, 5_000, receiver_id=1, sender_limit=0, now_ns=0, tag=99) == 0
    assert sm(fc, 5_000, receiver_id=2, sender_limit=0, now_ns=1) == 0
    assert sm(fc, 5_000, receiver_id=3, sender_limit=0, now_ns=2, tag=98) == 0
    assert not fc.has_required_receivers()
    assert sm(fc, 3_000, receiver_id=4, sender_limit=0, now_ns=3, tag=99) == 3_000 + WINDOW
    assert fc.has_required_receivers()


def test_tagged_setup_trigger_counts_only_from_tagged_receivers(native: Any) -> None:
    fc = native(TAGGED, group_tag=42)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0, tag=42)
    fc.on_trigger_send_setup(receiver_id=2, group_tag=None, now_ns=1)
    fc.on_setup(limit, 0, BITS, now_ns=2)
    assert sm(fc, 50_000, receiver_id=1, sender_limit=limit, now_ns=3, tag=42) == 50_000 + WINDOW
    fc.on_trigger_send_setup(receiver_id=2, group_tag=42, now_ns=4)
    fc.on_setup(50_000 + WINDOW, 0, BITS, now_ns=5)
    assert sm(fc, 90_000, receiver_id=1, sender_limit=50_000 + WINDOW, now_ns=6, tag=42) == 50_000 + WINDOW


def test_tagged_error_frame_needs_the_tag(native: Any) -> None:
    fc = native(TAGGED, group_tag=42)
    limit = sm(fc, 10_000, receiver_id=1, sender_limit=0, now_ns=0, tag=42)
    fc.on_error(1, None, now_ns=1)
    fc.on_idle(2, limit, 0, False)
    assert fc.receiver_count == 1
    fc.on_error(1, 42, now_ns=3)
    fc.on_idle(4, limit, 0, False)
    assert fc.receiver_count == 0


def test_tagged_tag_zero_is_a_tag(native: Any) -> None:
    # has_group_tag, not the value, says whether a frame carries a tag.
    fc = native(TAGGED, group_tag=0)
    sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0)
    assert fc.receiver_count == 0
    sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0, tag=0)
    assert fc.receiver_ids() == [1]


# --- retransmission length ---------------------------------------------------------------


def receiver_window_length_model(term_length: int, initial_window_length: int) -> int:
    """Aeron's Configuration.receiverWindowLength: the initial window, at most half a term."""
    return min(initial_window_length, term_length >> 1)


def retransmission_length_model(resend_length: int, term_length: int, term_offset: int, multiple: int) -> int:
    """Aeron's FlowControl.calculateRetransmissionLength: the least of what was asked,
    what is left of the term, and ``multiple`` default receiver windows."""
    window = receiver_window_length_model(term_length, lib.FULMAR_FC_INITIAL_WINDOW_LENGTH_DEFAULT)
    return min(resend_length, term_length - term_offset, window * multiple)


def test_retransmission_length_clamps(native: Any) -> None:
    # Aeron's FlowControlTest cases.
    assert lib.fulmar_fc_calculate_retransmission_length(1024, 64 * 1024, 0, 16) == 1024
    assert lib.fulmar_fc_calculate_retransmission_length(1024, 64 * 1024, 64 * 1024 - 512, 16) == 512
    # Window multiple: 16 MiB term, window min(128 KiB, 8 MiB) = 128 KiB.
    big = 16 * 1024 * 1024
    initial = lib.FULMAR_FC_INITIAL_WINDOW_LENGTH_DEFAULT
    assert initial == 128 * 1024
    assert lib.fulmar_fc_receiver_window_length(big, initial) == 128 * 1024
    assert lib.fulmar_fc_receiver_window_length(64 * 1024, initial) == 32 * 1024
    assert native(UNICAST).max_retransmission_length(0, big, big) == 16 * 128 * 1024
    assert native(MAX).max_retransmission_length(0, big, big) == 4 * 128 * 1024
    assert native(MIN).max_retransmission_length(0, big, big) == 16 * 128 * 1024
    assert native(TAGGED).max_retransmission_length(0, big, big) == 16 * 128 * 1024


def test_retransmission_length_of_a_gigabyte_term_does_not_overflow(native: Any) -> None:
    # Half a 1 GiB term is 512 MiB; 16 windows of the initial 128 KiB are 2 MiB,
    # but the product of the half-term window and the multiple is computed wide.
    gib = 1 << 30
    assert native(UNICAST).max_retransmission_length(0, 2**31 - 1, gib) == 16 * 128 * 1024
    assert lib.fulmar_fc_calculate_retransmission_length(2**31 - 1, gib, 0, 2**31 - 1) == gib
    assert lib.fulmar_fc_calculate_retransmission_length(2**31 - 1, gib, 0, 2**31 - 1) == retransmission_length_model(
        2**31 - 1, gib, 0, 2**31 - 1
    )


@settings(max_examples=300, deadline=None)
@given(
    bits=st.integers(5, 30),
    offset_fraction=st.floats(0, 1),
    resend_length=st.integers(1, 2**31 - 1),
    multiple=st.sampled_from([1, 4, 16]),
    initial_window=st.integers(0, 2**20),
)
def test_retransmission_length_matches_the_model(
    bits: int, offset_fraction: float, resend_length: int, multiple: int, initial_window: int
) -> None:
    term_length = 1 << bits
    term_offset = int(term_length * offset_fraction)
    assert lib.fulmar_fc_calculate_retransmission_length(
        resend_length, term_length, term_offset, multiple
    ) == retransmission_length_model(resend_length, term_length, term_offset, multiple)
    assert lib.fulmar_fc_receiver_window_length(term_length, initial_window) == receiver_window_length_model(
        term_length, initial_window
    )


@pytest.mark.parametrize(
    ("term_offset", "resend_length", "term_length"),
    [
        (-1, 1024, TERM_LENGTH),
        (TERM_LENGTH + 1, 1024, TERM_LENGTH),
        (0, -5, TERM_LENGTH),
        (0, 0, TERM_LENGTH),
        (0, 64, 0),
        (0, 64, -TERM_LENGTH),
    ],
)
def test_retransmission_length_of_nothing_is_zero(
    native: Any, term_offset: int, resend_length: int, term_length: int
) -> None:
    """Where a plain min() of the three bounds would give a negative length, the C says 0: nothing to resend."""
    assert native(MAX).max_retransmission_length(term_offset, resend_length, term_length) == 0
    assert lib.fulmar_fc_calculate_retransmission_length(resend_length, term_length, term_offset, 16) == 0
    # The end of the term is a valid offset with nothing left.
    assert native(MAX).max_retransmission_length(TERM_LENGTH, 1024, TERM_LENGTH) == 0


# --- choosing a strategy ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("channel", "expected", "multiple"),
    [
        ("aeron:udp?endpoint=localhost:40456", UNICAST, lib.FULMAR_FC_UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
        ("aeron:udp?endpoint=10.0.0.1:40456", UNICAST, lib.FULMAR_FC_UNICAST_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
        ("aeron:udp?endpoint=224.0.1.1:40456", MAX, lib.FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
        ("aeron:udp?endpoint=[ff02::1]:40456", MAX, lib.FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
        (
            "aeron:udp?control=10.0.0.1:40457|control-mode=dynamic",
            MAX,
            lib.FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE,
        ),
        ("aeron:udp?control-mode=manual", MAX, lib.FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
        ("aeron:udp?endpoint=224.0.1.1:40456|fc=max", MAX, lib.FULMAR_FC_MAX_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
        ("aeron:udp?control-mode=manual|fc=min", MIN, lib.FULMAR_FC_MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
        ("aeron:udp?endpoint=224.0.1.1:40456|fc=tagged", TAGGED, lib.FULMAR_FC_MIN_RETRANSMIT_RECEIVER_WINDOW_MULTIPLE),
    ],
)
def test_strategy_chosen_for_a_channel_has_aeron_defaults(
    native: Any, channel: str, expected: int, multiple: int
) -> None:
    """The channel is parsed in Python (flow_control_settings); the C strategy built from its choice has Aeron's defaults."""
    fc = native.of(channel)
    assert fc.ptr.strategy == expected
    assert fc.ptr.receiver_timeout_ns == TIMEOUT == 5_000_000_000
    assert fc.ptr.retransmit_receiver_window_multiple == multiple


def test_driver_defaults_and_uri_overrides_carry_over(native: Any) -> None:
    # Aeron's defaults, and the data plane's Python defaults agree with the C's.
    assert (GROUP_TAG_DEFAULT, GROUP_MIN_SIZE_DEFAULT) == (-1, 0)
    assert FlowControlSettings(TAGGED) == FlowControlSettings(
        TAGGED, TIMEOUT, GROUP_TAG_DEFAULT, GROUP_MIN_SIZE_DEFAULT
    )
    mdc = "aeron:udp?control=10.0.0.1:40457|control-mode=dynamic"
    fc = native.of(mdc + "|fc=tagged")
    assert fc.ptr.group_tag == GROUP_TAG_DEFAULT
    fc = native.of(mdc + "|fc=tagged", group_tag=5, group_min_size=3, receiver_timeout_ns=7)
    assert (fc.ptr.group_tag, fc.ptr.group_min_size, fc.ptr.receiver_timeout_ns) == (5, 3, 7)
    fc = native.of(mdc + "|fc=tagged,g:11/1,t:3s", group_tag=5, group_min_size=3)
    assert (fc.ptr.group_tag, fc.ptr.group_min_size, fc.ptr.receiver_timeout_ns) == (11, 1, 3_000_000_000)
    assert native.of(mdc, multicast_default="min").ptr.strategy == MIN


def test_min_ignores_a_group_tag(native: Any) -> None:
    fc = native.of("aeron:udp?endpoint=224.0.1.1:40456|fc=min,g:5/0")
    assert fc.ptr.strategy == MIN
    sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=0, tag=None)
    sm(fc, 1_000, receiver_id=2, sender_limit=0, now_ns=0, tag=6)
    assert fc.receiver_count == 2


# --- bad arguments and edges ---------------------------------------------------------------


def test_init_refuses_bad_arguments() -> None:
    fc = ffi.new("fulmar_fc_t *")
    for strategy in (-1, 4, 1000):
        assert lib.fulmar_fc_init(fc, strategy, TIMEOUT, 0, -1) == lib.FULMAR_FC_INVALID_STRATEGY
    for strategy in (UNICAST, MAX, MIN, TAGGED):
        assert lib.fulmar_fc_init(fc, strategy, -1, 0, -1) == lib.FULMAR_FC_INVALID_TIMEOUT
    for strategy in (MIN, TAGGED):
        assert lib.fulmar_fc_init(fc, strategy, TIMEOUT, -1, -1) == lib.FULMAR_FC_INVALID_GROUP_MIN_SIZE
    # Unicast and max take no group size: it is ignored.
    for strategy in (UNICAST, MAX):
        assert lib.fulmar_fc_init(fc, strategy, TIMEOUT, -1, -1) == 0
        assert fc.group_min_size == 0 and lib.fulmar_fc_has_required_receivers(fc) == 1
        lib.fulmar_fc_close(fc)
    assert lib.fulmar_fc_init(ffi.NULL, MIN, TIMEOUT, 0, -1) == lib.FULMAR_FC_NULL
    # A zero timeout is allowed; a refused init leaves a struct that closes safely.
    assert lib.fulmar_fc_init(fc, MIN, 0, 0, -1) == 0
    lib.fulmar_fc_close(fc)
    assert lib.fulmar_fc_init(fc, 9, TIMEOUT, 0, -1) == lib.FULMAR_FC_INVALID_STRATEGY
    assert fc.receivers == ffi.NULL and fc.receiver_count == 0
    lib.fulmar_fc_close(fc)
    lib.fulmar_fc_close(fc)
    lib.fulmar_fc_close(ffi.NULL)


@pytest.mark.parametrize("bits", [-1, 32, 63, 64, 1000])
@pytest.mark.parametrize("strategy", [UNICAST, MAX, MIN, TAGGED])
def test_status_message_with_impossible_position_bits_is_ignored(native: Any, strategy: int, bits: int) -> None:
    fc = native(strategy, group_tag=42)
    assert fc.on_status_message(INITIAL_TERM_ID, 0, WINDOW, 1, 42, 1234, INITIAL_TERM_ID, bits, 0) == 1234
    assert fc.receiver_count == 0


def test_many_receivers_grow_the_array_and_keep_their_order(native: Any) -> None:
    fc = native(MIN)
    limit = 0
    for receiver_id in range(200):
        limit = sm(fc, 10_000 + receiver_id, receiver_id=1000 - receiver_id, sender_limit=limit, now_ns=receiver_id)
    assert fc.receiver_count == 200 and fc.ptr.receiver_capacity >= 200
    assert [fc.ptr.receivers[i].receiver_id for i in range(200)] == [1000 - i for i in range(200)]
    # Every other one times out; the rest keep the order they joined in.
    for receiver_id in range(0, 200, 2):
        limit = sm(fc, 20_000, receiver_id=1000 - receiver_id, sender_limit=limit, now_ns=TIMEOUT + 1000)
    assert fc.on_idle(TIMEOUT + 500, limit, 0, False) == 20_000 + WINDOW
    assert [fc.ptr.receivers[i].receiver_id for i in range(fc.receiver_count)] == [1000 - i for i in range(0, 200, 2)]


def test_times_near_the_int64_ends_do_not_wrap(native: Any) -> None:
    """A deadline past INT64_MAX is never reached: a receiver heard just before
    INT64_MAX is still tracked at INT64_MAX (its timeout would end past it)."""
    late = INT64_MAX - 10
    # min idles down to the receiver's right edge; max leaves the limit as it is.
    for fc, idle_limit in ((native(MIN), 1_000 + WINDOW), (native(MAX), 5)):
        assert sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=late) == 1_000 + WINDOW
        assert fc.on_idle(INT64_MAX, 5, 0, False) == idle_limit
        assert fc.receiver_count == 1
    # A receiver heard at the earliest time is long gone by time 0.
    fc = native(MIN)
    sm(fc, 1_000, receiver_id=1, sender_limit=0, now_ns=-(1 << 63))
    assert fc.on_idle(0, 5, 0, False) == 5 and fc.receiver_count == 0


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
    fc = NativeFc(TAGGED if tagged else MIN, TIMEOUT, group_min_size, 42)
    try:
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
            assert sorted(tracked) == fc.receiver_ids()
    finally:
        fc.close()


@settings(max_examples=150, deadline=None)
@given(
    reports=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 10 * TERM_LENGTH), st.integers(0, WINDOW)), max_size=40
    ),
    unicast=st.booleans(),
)
def test_max_limit_is_the_furthest_right_edge_reported(reports: list[tuple[int, int, int]], unicast: bool) -> None:
    fc = NativeFc(UNICAST if unicast else MAX)
    try:
        limit = 0
        for now, (receiver_id, position, window) in enumerate(reports):
            limit = sm(fc, position, receiver_id, limit, now, window=window)
            assert limit == max(p + w for _, p, w in reports[: now + 1])
            assert fc.on_idle(now, limit, 0, False) == limit
    finally:
        fc.close()


# Mostly small steps, so that a receiver timeout or a SETUP cap is sometimes reached and sometimes not.
_advances = st.one_of(st.just(0), st.integers(1, 1000), st.integers(0, TIMEOUT // 3))

_calls = st.lists(
    st.one_of(
        # status message: receiver id, position, window, tag, eos, initial term id
        st.tuples(
            st.just("sm"),
            st.integers(0, 5),
            st.one_of(st.integers(0, 3 * WINDOW), st.integers(0, 8 * TERM_LENGTH)),
            st.one_of(st.just(WINDOW), st.integers(-64, 2 * WINDOW)),
            st.sampled_from([None, 0, 42, 43]),
            st.booleans(),
        ),
        st.tuples(st.just("idle")),
        st.tuples(st.just("trigger"), st.integers(0, 5), st.sampled_from([None, 42, 43])),
        st.tuples(st.just("setup")),
        st.tuples(st.just("error"), st.integers(0, 5), st.sampled_from([None, 42, 43])),
        st.tuples(st.just("limit"), st.integers(0, 10 * TERM_LENGTH)),
    ).flatmap(lambda call: st.tuples(st.just(call), _advances)),
    min_size=10,
    max_size=80,
)


@settings(max_examples=500, deadline=None)
@given(
    calls=_calls,
    strategy=st.sampled_from([UNICAST, MAX, MIN, TAGGED]),
    group_min_size=st.integers(0, 3),
    receiver_timeout_ns=st.sampled_from([0, 1, 500, TIMEOUT // 4, TIMEOUT]),
    initial_term_id=st.sampled_from([0, INITIAL_TERM_ID, 2**31 - 3, -(2**31)]),
)
def test_any_sequence_of_calls_keeps_the_rules(
    calls: list[tuple[tuple[Any, ...], int]],
    strategy: int,
    group_min_size: int,
    receiver_timeout_ns: int,
    initial_term_id: int,
) -> None:
    """Unicast and max against a plain model (the limit is the furthest right
    edge reported since it was last set; receivers are remembered until the
    timeout passes or they say end of stream).  Min and tagged against their
    rules: a status message never moves the limit back, idle never leaves it
    above the slowest live receiver, the group size decides whether receivers
    suffice, and only tagged receivers are tracked by tagged."""
    fc = NativeFc(strategy, receiver_timeout_ns, group_min_size, 42)
    is_min = strategy in (MIN, TAGGED)
    # The unicast/max model: id -> (furthest position, right edge, time of the last status message).
    known: dict[int, tuple[int, int, int]] = {}
    tagged_ids: set[int] = set()  # receivers that ever sent a status message with the group tag
    try:
        limit = 0
        now = 0
        for call, advance in calls:
            now += advance
            kind = call[0]
            before = {r[0]: r for r in fc.receivers()}
            if kind == "sm":
                _, receiver_id, position, window, tag, eos = call
                args = dict(window=window, tag=tag, eos=eos, initial_term_id=initial_term_id)
                new_limit = sm(fc, position, receiver_id, limit, now, **args)
                right_edge = position + window
                assert new_limit >= limit  # a status message never moves the limit back
                if not is_min:
                    assert new_limit == max(limit, right_edge)
                    if eos:
                        known.pop(receiver_id, None)
                    else:
                        furthest = max(known[receiver_id][0], position) if receiver_id in known else position
                        known[receiver_id] = (furthest, right_edge, now)
                if tag == 42:
                    tagged_ids.add(receiver_id)
                limit = new_limit
            elif kind == "idle":
                new_limit = fc.on_idle(now, limit, 0, False)
                live = fc.receivers()
                # Nobody silent for longer than the timeout, nor (min, tagged) flagged end of stream, is left.
                assert all(r[3] + receiver_timeout_ns >= now and not r[4] for r in live)
                if not is_min:
                    known = {k: r for k, r in known.items() if r[2] + receiver_timeout_ns >= now}
                    assert new_limit == limit
                elif live and len(live) >= group_min_size:
                    assert new_limit <= min(r[2] for r in live)
                else:
                    assert new_limit == limit
                limit = new_limit
            elif kind == "trigger":
                fc.on_trigger_send_setup(call[1], call[2], now)
            elif kind == "setup":
                assert fc.on_setup(limit, 0, BITS, now) == limit
            elif kind == "error":
                fc.on_error(call[1], call[2], now)
            else:
                limit = call[1]
            receivers = fc.receivers()
            if is_min:
                assert fc.has_required_receivers() == (len(receivers) >= group_min_size)
            else:
                assert fc.has_required_receivers()
                assert receivers == [(k, p, w, t, False) for k, (p, w, t) in sorted(known.items())]
            if strategy == TAGGED:
                assert {r[0] for r in receivers} <= tagged_ids
            for r in receivers:
                assert r[3] <= now
                if r[0] in before:
                    assert r[1] >= before[r[0]][1]  # the furthest position reported never moves back
    finally:
        fc.close()
