"""Loss injection: rates in parts per million, frame-type masks, seeded
determinism, knobs switched while in use (from another process, through
shared counters), and the transport applying it to real datagrams."""

from __future__ import annotations

import mmap
import multiprocessing.process
from multiprocessing.synchronize import Event
import select
import time
from collections.abc import Iterator

import pytest

from fulmar.buffers import AtomicBuffer
from fulmar.counters import COUNTER_LENGTH, AtomicCounter
from fulmar.driver.loss_injection import PARTS_PER_MILLION, LossInjector, frame_type_mask
from fulmar.driver.udp_transport import UdpTransport
from fulmar.frames import (
    FrameType,
    encode_heartbeat,
    encode_nak,
    decode_nak,
    encode_status_message,
    frame_type_of,
)

from conftest import FORK

TYPES = [FrameType.DATA, FrameType.SM, FrameType.NAK, FrameType.SETUP, FrameType.PAD, FrameType.EXT, None]


class Knob:
    """A stand-in for a driver counter that counts its reads."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
        self.reads = 0

    def get(self) -> int:
        self.reads += 1
        return self.value

    def set(self, value: int) -> None:
        self.value = value


def injector(receive: int = 0, send: int = 0, mask: int = 0, seed: int = 42) -> tuple[LossInjector, Knob, Knob, Knob]:
    knobs = Knob(receive), Knob(send), Knob(mask)
    return LossInjector(*knobs, seed=seed), *knobs


def test_rate_zero_drops_nothing_for_one_counter_read() -> None:
    loss, receive, send, mask = injector(mask=frame_type_mask(FrameType.DATA))
    for frame_type in TYPES:
        assert not loss.drop_incoming(frame_type)
        assert not loss.drop_outgoing(frame_type)
    assert (receive.reads, send.reads, mask.reads) == (len(TYPES), len(TYPES), 0)
    assert (loss.dropped_incoming, loss.dropped_outgoing) == (0, 0)
    assert not loss.dropping_incoming() and not loss.dropping_outgoing()


def test_full_rate_is_a_partition() -> None:
    loss, *_ = injector(receive=PARTS_PER_MILLION, send=PARTS_PER_MILLION)
    assert all(loss.drop_incoming(t) for t in TYPES * 10)
    assert all(loss.drop_outgoing(t) for t in TYPES * 10)
    assert loss.dropped_incoming == loss.dropped_outgoing == len(TYPES) * 10
    # Rates above a million are a partition too, negative rates no loss.
    over, *_ = injector(receive=2 * PARTS_PER_MILLION, send=-5)
    assert over.drop_incoming(FrameType.DATA) and not over.drop_outgoing(FrameType.DATA)


@pytest.mark.parametrize("rate", [10_000, 250_000, 900_000])
def test_rate_is_the_fraction_dropped(rate: int) -> None:
    loss, *_ = injector(receive=rate, send=rate, seed=rate)
    trials = 20_000
    incoming = sum(loss.drop_incoming(FrameType.DATA) for _ in range(trials))
    outgoing = sum(loss.drop_outgoing(FrameType.SM) for _ in range(trials))
    expected = rate / PARTS_PER_MILLION
    # 20k trials: the standard deviation is at most 0.0036; allow 5 of them.
    assert abs(incoming / trials - expected) < 0.018
    assert abs(outgoing / trials - expected) < 0.018
    assert (loss.dropped_incoming, loss.dropped_outgoing) == (incoming, outgoing)


def test_mask_selects_frame_types() -> None:
    mask = frame_type_mask(FrameType.DATA, FrameType.NAK)
    assert mask == (1 << 1) | (1 << 2)
    loss, *_ = injector(receive=PARTS_PER_MILLION, send=PARTS_PER_MILLION, mask=mask)
    assert [loss.drop_incoming(t) for t in TYPES] == [True, False, True, False, False, False, False]
    assert [loss.drop_outgoing(t) for t in TYPES] == [True, False, True, False, False, False, False]
    assert loss.dropped_incoming == loss.dropped_outgoing == 2


def test_mask_zero_selects_everything_even_non_frames() -> None:
    loss, *_ = injector(receive=PARTS_PER_MILLION)
    assert loss.drop_incoming(None) and loss.drop_incoming(FrameType.EXT) and loss.drop_incoming(FrameType.RSP_SETUP)


def test_frame_type_mask_refuses_types_without_a_bit() -> None:
    with pytest.raises(ValueError, match="frame type -1"):
        frame_type_mask(FrameType.EXT)
    with pytest.raises(ValueError, match="frame type 63"):
        frame_type_mask(63)


def decisions(loss: LossInjector, count: int = 500) -> list[bool]:
    return [loss.drop_incoming(FrameType.DATA) for _ in range(count)]


def test_same_seed_same_drops_other_seed_other_drops() -> None:
    first = decisions(injector(receive=300_000, seed=7)[0])
    assert first == decisions(injector(receive=300_000, seed=7)[0])
    assert first != decisions(injector(receive=300_000, seed=8)[0])
    assert 100 < sum(first) < 200


def test_directions_do_not_perturb_each_other() -> None:
    quiet = decisions(injector(receive=300_000, seed=7)[0])
    busy, *_ = injector(receive=300_000, send=500_000, seed=7)
    interleaved = []
    for _ in range(500):
        busy.drop_outgoing(FrameType.DATA)
        busy.drop_outgoing(FrameType.DATA)
        interleaved.append(busy.drop_incoming(FrameType.DATA))
    assert interleaved == quiet


def test_unselected_frames_do_not_use_up_randomness() -> None:
    plain = decisions(injector(receive=300_000, mask=frame_type_mask(FrameType.DATA), seed=3)[0])
    mixed, *_ = injector(receive=300_000, mask=frame_type_mask(FrameType.DATA), seed=3)
    got = []
    for _ in range(500):
        assert not mixed.drop_incoming(FrameType.SM)
        got.append(mixed.drop_incoming(FrameType.DATA))
    assert got == plain


def test_switching_rates_and_mask_while_in_use() -> None:
    loss, receive, send, mask = injector()
    assert not any(decisions(loss, 100))
    receive.set(PARTS_PER_MILLION)
    assert all(decisions(loss, 100))
    mask.set(frame_type_mask(FrameType.SM))
    assert not any(decisions(loss, 100))
    assert loss.drop_incoming(FrameType.SM)
    receive.set(0)
    assert not loss.drop_incoming(FrameType.SM)
    send.set(PARTS_PER_MILLION)
    assert loss.drop_outgoing(FrameType.SM) and not loss.drop_outgoing(FrameType.DATA)
    assert (loss.dropped_incoming, loss.dropped_outgoing) == (101, 1)


# Counters in shared memory, written by another process ------------------


@pytest.fixture
def shared_counters() -> Iterator[tuple[AtomicBuffer, list[AtomicCounter]]]:
    memory = mmap.mmap(-1, 3 * COUNTER_LENGTH)  # MAP_SHARED: a forked child writes the same pages
    values = AtomicBuffer(memory)
    yield values, [AtomicCounter(values, counter_id) for counter_id in range(3)]
    values.release()
    memory.close()


def _partition_then_heal(values: AtomicBuffer, heal: Event, partitioned: Event) -> None:
    """A tool in another process: partition the node, wait, heal it."""
    receive_rate = AtomicCounter(values, 0)
    receive_rate.set(PARTS_PER_MILLION)
    partitioned.set()
    heal.wait(10)
    receive_rate.set(0)


def test_another_process_partitions_and_heals_through_counters(
    shared_counters: tuple[AtomicBuffer, list[AtomicCounter]],
    child_processes: list[multiprocessing.process.BaseProcess],
) -> None:
    values, (receive_rate, send_rate, mask) = shared_counters
    loss = LossInjector(receive_rate, send_rate, mask, seed=1)
    assert not loss.drop_incoming(FrameType.DATA)

    partitioned, heal = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_partition_then_heal, args=(values, heal, partitioned))
    child_processes.append(child)
    child.start()
    assert partitioned.wait(10)
    assert loss.drop_incoming(FrameType.DATA) and loss.dropping_incoming()
    heal.set()
    child.join(10)
    assert child.exitcode == 0
    assert not loss.drop_incoming(FrameType.DATA)
    assert loss.dropped_incoming == 1


# The transport applies it ------------------------------------------------


def control_frames() -> list[bytes]:
    sm, nak, heartbeat = bytearray(36), bytearray(28), bytearray(32)
    encode_status_message(sm, 0, session_id=1, stream_id=2, consumption_term_id=3, consumption_term_offset=0,
                          receiver_window=65536, receiver_id=9)  # fmt: skip
    encode_nak(nak, 0, session_id=1, stream_id=2, term_id=3, term_offset=0, length=1408)
    encode_heartbeat(heartbeat, 0, session_id=1, stream_id=2, term_id=3, term_offset=0)
    return [bytes(sm), bytes(nak), bytes(heartbeat), b"not a frame"]


def received_types(transport: UdpTransport, expected: int) -> list[int | None]:
    types: list[int | None] = []
    deadline = time.monotonic() + 5
    while len(types) < expected:
        batch = transport.receive()
        types.extend(frame_type_of(datagram) for datagram in batch)
        if not batch:
            assert time.monotonic() < deadline, f"received {types}, expected {expected} datagrams"
            select.select([transport], [], [], 0.05)
    return types


@pytest.fixture
def pair() -> Iterator[tuple[UdpTransport, UdpTransport]]:
    receiver = UdpTransport.open(("127.0.0.1", 0))
    try:
        sender = UdpTransport.open(("127.0.0.1", 0))
        try:
            yield receiver, sender
        finally:
            sender.close()
    finally:
        receiver.close()


def test_transport_drops_selected_incoming_datagrams(pair: tuple[UdpTransport, UdpTransport]) -> None:
    receiver, sender = pair
    loss, receive_rate, _, mask = injector(receive=PARTS_PER_MILLION, mask=frame_type_mask(FrameType.SM))
    receiver.loss_injector = loss
    frames = control_frames()
    assert sender.send_datagrams(frames, receiver.local_address) == 4
    assert received_types(receiver, 3) == [FrameType.NAK, FrameType.DATA, None]
    assert loss.dropped_incoming == 1

    # Switched to drop every type: nothing gets through, even non-frames.
    mask.set(0)
    sender.send_datagrams(frames, receiver.local_address)
    deadline = time.monotonic() + 5
    while loss.dropped_incoming < 5:
        assert len(receiver.receive()) == 0 and time.monotonic() < deadline
        select.select([receiver], [], [], 0.05)
    receive_rate.set(0)
    sender.send_datagrams(frames, receiver.local_address)
    assert received_types(receiver, 4) == [FrameType.SM, FrameType.NAK, FrameType.DATA, None]


def test_transport_drops_selected_outgoing_datagrams(pair: tuple[UdpTransport, UdpTransport]) -> None:
    receiver, sender = pair
    loss, _, send_rate, _ = injector(send=PARTS_PER_MILLION, mask=frame_type_mask(FrameType.SM, FrameType.DATA))
    sender.loss_injector = loss
    # Dropped datagrams count as sent: the network lost them, not the socket.
    assert sender.send_datagrams(control_frames(), receiver.local_address) == 4
    assert received_types(receiver, 2) == [FrameType.NAK, None]
    assert loss.dropped_outgoing == 2
    send_rate.set(0)
    assert sender.send_datagrams(control_frames(), receiver.local_address) == 4
    assert received_types(receiver, 4) == [FrameType.SM, FrameType.NAK, FrameType.DATA, None]


def test_multi_destination_copies_are_lost_independently(pair: tuple[UdpTransport, UdpTransport]) -> None:
    first, sender = pair
    with UdpTransport.open(("127.0.0.1", 0)) as second:
        loss, *_ = injector(send=500_000, seed=11)
        sender.loss_injector = loss
        # 32 NAKs told apart by their term offset.
        buffer = bytearray(32 * 28)
        for index in range(32):
            encode_nak(buffer, 28 * index, session_id=1, stream_id=2, term_id=3, term_offset=32 * index, length=32)
        regions = [(28 * index, 28) for index in range(32)]
        assert sender.send_to_many(buffer, regions, [first.local_address, second.local_address]) == [32, 32]
        assert 16 < loss.dropped_outgoing < 48
        delivered = 64 - loss.dropped_outgoing

        got: dict[UdpTransport, list[int]] = {first: [], second: []}
        deadline = time.monotonic() + 5
        while len(got[first]) + len(got[second]) < delivered:
            for receiver in (first, second):
                got[receiver].extend(decode_nak(datagram).term_offset // 32 for datagram in receiver.receive())
            assert time.monotonic() < deadline, f"{got} of {delivered}"
            select.select([first, second], [], [], 0.05)
        assert len(got[first]) + len(got[second]) == delivered
        assert got[first] != got[second]  # each copy had its own fate
