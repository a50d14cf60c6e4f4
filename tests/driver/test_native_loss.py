"""Loss injection's decisions (``driver/native/loss.h``): rates in parts per
million, frame-type masks, seeded determinism, knobs switched while in use.
The driver applies them to every datagram it sends and receives
(test_driver_udp.py's lossy streams, test_cli.py's partition and heal)."""

from __future__ import annotations

import pytest

from fulmar._native import ffi, lib
from fulmar.driver.loss_injection import PARTS_PER_MILLION, frame_type_mask
from fulmar.frames import FrameType, encode_heartbeat, encode_nak, encode_setup, encode_status_message

Datagram = bytes


def frame(frame_type: int | None) -> Datagram:
    """A datagram whose first frame has this type (None: not an Aeron frame)."""
    if frame_type is None:
        return b"not a frame"
    if frame_type == FrameType.DATA:
        buffer = bytearray(32)
        encode_heartbeat(buffer, 0, session_id=1, stream_id=2, term_id=3, term_offset=0)
        return bytes(buffer)
    if frame_type == FrameType.SM:
        buffer = bytearray(36)
        encode_status_message(buffer, 0, session_id=1, stream_id=2, consumption_term_id=3, consumption_term_offset=0,
                              receiver_window=65536, receiver_id=9)  # fmt: skip
        return bytes(buffer)
    if frame_type == FrameType.NAK:
        buffer = bytearray(28)
        encode_nak(buffer, 0, session_id=1, stream_id=2, term_id=3, term_offset=0, length=1408)
        return bytes(buffer)
    if frame_type == FrameType.SETUP:
        buffer = bytearray(40)
        encode_setup(buffer, 0, term_offset=0, session_id=1, stream_id=2, initial_term_id=3, active_term_id=3,
                     term_length=65536, mtu_length=1408)  # fmt: skip
        return bytes(buffer)
    header = bytearray(32)  # PAD, EXT, ...: a header of that type
    header[6:8] = int(frame_type).to_bytes(2, "little", signed=True)
    return bytes(header)


TYPES = [FrameType.DATA, FrameType.SM, FrameType.NAK, FrameType.SETUP, FrameType.PAD, FrameType.EXT, None]


class Direction:
    """One direction's generator and its knobs, as the driver's counters hold them."""

    def __init__(self, seed: int, rate: int = 0, mask: int = 0) -> None:
        self.loss = ffi.new("fulmar_loss_t *")
        lib.fulmar_loss_init(self.loss, seed & (2**64 - 1))
        self.rate = rate
        self.mask = mask

    def drop(self, frame_type: int | None) -> bool:
        datagram = frame(frame_type)
        return bool(lib.fulmar_loss_drop(self.loss, self.rate, self.mask, datagram, len(datagram)))

    @property
    def dropped(self) -> int:
        return int(self.loss.dropped)


def decisions(direction: Direction, count: int = 500) -> list[bool]:
    return [direction.drop(FrameType.DATA) for _ in range(count)]


def test_rate_zero_drops_nothing() -> None:
    quiet = Direction(42, rate=0, mask=frame_type_mask(FrameType.DATA))
    assert not any(quiet.drop(t) for t in TYPES)
    assert quiet.dropped == 0


def test_full_rate_is_a_partition() -> None:
    everything = Direction(42, rate=PARTS_PER_MILLION)
    assert all(everything.drop(t) for t in TYPES * 10)
    assert everything.dropped == len(TYPES) * 10
    # Rates above a million are a partition too, negative rates no loss.
    assert Direction(42, rate=2 * PARTS_PER_MILLION).drop(FrameType.DATA)
    assert not Direction(42, rate=-5).drop(FrameType.DATA)


@pytest.mark.parametrize("rate", [10_000, 250_000, 900_000])
def test_rate_is_the_fraction_dropped(rate: int) -> None:
    direction = Direction(rate, rate=rate)
    trials = 20_000
    dropped = sum(direction.drop(FrameType.DATA) for _ in range(trials))
    # 20k trials: the standard deviation is at most 0.0036; allow 5 of them.
    assert abs(dropped / trials - rate / PARTS_PER_MILLION) < 0.018
    assert direction.dropped == dropped


def test_mask_selects_frame_types() -> None:
    mask = frame_type_mask(FrameType.DATA, FrameType.NAK)
    assert mask == (1 << 1) | (1 << 2)
    direction = Direction(42, rate=PARTS_PER_MILLION, mask=mask)
    assert [direction.drop(t) for t in TYPES] == [True, False, True, False, False, False, False]
    assert direction.dropped == 2


def test_mask_zero_selects_everything_even_non_frames() -> None:
    direction = Direction(42, rate=PARTS_PER_MILLION)
    assert direction.drop(None) and direction.drop(FrameType.EXT) and direction.drop(FrameType.RSP_SETUP)


def test_a_datagram_of_another_version_is_not_a_frame() -> None:
    datagram = bytearray(frame(FrameType.DATA))
    datagram[4] = 1
    loss = ffi.new("fulmar_loss_t *")
    lib.fulmar_loss_init(loss, 1)
    assert not lib.fulmar_loss_drop(loss, PARTS_PER_MILLION, frame_type_mask(FrameType.DATA), bytes(datagram), 32)
    assert lib.fulmar_loss_drop(loss, PARTS_PER_MILLION, 0, bytes(datagram), 32)
    assert not lib.fulmar_loss_drop(loss, PARTS_PER_MILLION, frame_type_mask(FrameType.PAD), b"short", 5)


def test_frame_type_mask_refuses_types_without_a_bit() -> None:
    with pytest.raises(ValueError, match="frame type -1"):
        frame_type_mask(FrameType.EXT)
    with pytest.raises(ValueError, match="frame type 63"):
        frame_type_mask(63)


def test_same_seed_same_drops_other_seed_other_drops() -> None:
    first = decisions(Direction(7, rate=300_000))
    assert first == decisions(Direction(7, rate=300_000))
    assert first != decisions(Direction(8, rate=300_000))
    assert 100 < sum(first) < 200


def test_unselected_frames_do_not_use_up_randomness() -> None:
    plain = decisions(Direction(3, rate=300_000, mask=frame_type_mask(FrameType.DATA)))
    mixed = Direction(3, rate=300_000, mask=frame_type_mask(FrameType.DATA))
    got = []
    for _ in range(500):
        assert not mixed.drop(FrameType.SM)
        got.append(mixed.drop(FrameType.DATA))
    assert got == plain


def test_switching_rates_and_mask_while_in_use() -> None:
    direction = Direction(5)
    assert not any(decisions(direction, 100))
    direction.rate = PARTS_PER_MILLION
    assert all(decisions(direction, 100))
    direction.mask = frame_type_mask(FrameType.SM)
    assert not any(decisions(direction, 100))
    assert direction.drop(FrameType.SM)
    direction.rate = 0
    assert not direction.drop(FrameType.SM)
    assert direction.dropped == 101
