"""Broadcast buffer: layout, joining, padding, laps, validation, and a C-speed
transmitter in another process racing a receiver that lags on purpose."""

from __future__ import annotations

import multiprocessing
import random
import struct
import time
from pathlib import Path

import pytest

from fulmar._native import lib
from fulmar.broadcast import (
    LATEST_COUNTER_OFFSET,
    PADDING_MSG_TYPE_ID,
    TAIL_COUNTER_OFFSET,
    TAIL_INTENT_COUNTER_OFFSET,
    TRAILER_LENGTH,
    BroadcastReceiver,
    BroadcastTransmitter,
    CopyBroadcastReceiver,
    ScratchBufferTooSmallError,
    UnableToKeepUpError,
)
from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.ring_buffer import InvalidCapacityError, InvalidMessageTypeError, MessageTooLongError

I32 = struct.Struct("<i")


def make_buffer(capacity: int = 1024) -> AtomicBuffer:
    return AtomicBuffer(bytearray(capacity + TRAILER_LENGTH))


def receive_all(receiver: CopyBroadcastReceiver, limit: int = 64) -> list[tuple[int, bytes]]:
    received: list[tuple[int, bytes]] = []
    while receiver.receive(lambda msg_type_id, body: received.append((msg_type_id, bytes(body))), limit):
        pass
    return received


def test_trailer_offsets_match_aeron() -> None:
    assert (TRAILER_LENGTH, TAIL_INTENT_COUNTER_OFFSET, TAIL_COUNTER_OFFSET, LATEST_COUNTER_OFFSET) == (
        128,
        0,
        8,
        16,
    )


def test_capacity_and_message_checks() -> None:
    with pytest.raises(InvalidCapacityError):
        BroadcastTransmitter(AtomicBuffer(bytearray(1000 + TRAILER_LENGTH)))
    with pytest.raises(InvalidCapacityError):
        BroadcastReceiver(AtomicBuffer(bytearray(1000 + TRAILER_LENGTH)))
    transmitter = BroadcastTransmitter(make_buffer(1024))
    assert transmitter.max_message_length == 128
    transmitter.transmit(1, bytes(128))
    with pytest.raises(MessageTooLongError):
        transmitter.transmit(1, bytes(129))
    with pytest.raises(InvalidMessageTypeError):
        transmitter.transmit(0, b"x")


def test_record_layout_and_counters() -> None:
    buffer = make_buffer(1024)
    transmitter = BroadcastTransmitter(buffer)
    transmitter.transmit(7, b"hello")
    transmitter.transmit(8, b"")
    view = buffer.view
    assert I32.unpack_from(view, 0)[0] == 13 and I32.unpack_from(view, 4)[0] == 7
    assert bytes(view[8:13]) == b"hello"
    assert I32.unpack_from(view, 16)[0] == 8 and I32.unpack_from(view, 20)[0] == 8
    assert buffer.get_int64(1024 + TAIL_INTENT_COUNTER_OFFSET) == 24
    assert buffer.get_int64(1024 + TAIL_COUNTER_OFFSET) == 24
    assert buffer.get_int64(1024 + LATEST_COUNTER_OFFSET) == 16


def test_receivers_follow_independently() -> None:
    buffer = make_buffer()
    transmitter = BroadcastTransmitter(buffer)
    first = CopyBroadcastReceiver(BroadcastReceiver(buffer))
    second = CopyBroadcastReceiver(BroadcastReceiver(buffer))
    sent = [(i + 1, bytes([i]) * i) for i in range(10)]
    for msg_type_id, body in sent:
        transmitter.transmit(msg_type_id, body)
    assert receive_all(first, limit=1) == sent
    assert receive_all(second, limit=4) == sent
    assert receive_all(first) == []


def test_new_receiver_joins_at_the_latest_record() -> None:
    buffer = make_buffer()
    transmitter = BroadcastTransmitter(buffer)
    for i in range(5):
        transmitter.transmit(1, bytes([i]))
    receiver = CopyBroadcastReceiver(BroadcastReceiver(buffer))
    transmitter.transmit(1, b"\x05")
    assert receive_all(receiver) == [(1, b"\x04"), (1, b"\x05")]


def test_padding_at_the_end_is_skipped() -> None:
    buffer = make_buffer(1024)
    transmitter = BroadcastTransmitter(buffer)
    receiver = CopyBroadcastReceiver(BroadcastReceiver(buffer))
    received: list[tuple[int, bytes]] = []
    for i in range(30):  # 48-byte records: the 22nd needs padding (1024 % 48 = 16)
        transmitter.transmit(2, bytes([i]) * 40)
        received += receive_all(receiver)
    assert received == [(2, bytes([i]) * 40) for i in range(30)]
    assert I32.unpack_from(buffer.view, 1008 + 4)[0] == PADDING_MSG_TYPE_ID
    assert I32.unpack_from(buffer.view, 1008)[0] == 16


def test_slow_receiver_is_lapped_counts_it_and_moves_to_the_latest() -> None:
    buffer = make_buffer(1024)
    transmitter = BroadcastTransmitter(buffer)
    low_level = BroadcastReceiver(buffer)
    receiver = CopyBroadcastReceiver(low_level)
    transmitter.transmit(1, b"first")
    assert receive_all(receiver) == [(1, b"first")]

    for i in range(100):  # far more than one ring of 64-byte records
        transmitter.transmit(1, struct.pack("<q", i) + bytes(48))
    with pytest.raises(UnableToKeepUpError):
        receive_all(receiver)
    assert low_level.lapped_count == 1

    # The receiver resumes at the latest record, then follows.
    transmitter.transmit(3, b"after the lap")
    assert receive_all(receiver) == [(1, struct.pack("<q", 99) + bytes(48)), (3, b"after the lap")]
    assert low_level.lapped_count == 1


def test_validate_detects_a_record_overwritten_while_it_was_read() -> None:
    buffer = make_buffer(1024)
    transmitter = BroadcastTransmitter(buffer)
    receiver = BroadcastReceiver(buffer)
    transmitter.transmit(4, b"original")
    assert receiver.receive_next()
    assert (receiver.type_id, receiver.length) == (4, 8)
    assert bytes(buffer.view[receiver.offset : receiver.offset + 8]) == b"original"
    assert receiver.validate()
    for _ in range(17):  # 64 * 17 > 1024: the record is overwritten
        transmitter.transmit(1, bytes(56))
    assert not receiver.validate()


def test_handler_exception_redelivers_the_rest_of_the_batch() -> None:
    buffer = make_buffer()
    transmitter = BroadcastTransmitter(buffer)
    receiver = CopyBroadcastReceiver(BroadcastReceiver(buffer))
    for i in range(5):
        transmitter.transmit(1, bytes([i]))

    def failing(msg_type_id: int, body: memoryview) -> None:
        if body[0] == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        receiver.receive(failing, limit=10)
    assert receive_all(receiver) == [(1, bytes([i])) for i in range(2, 5)]


def test_message_longer_than_scratch_buffer() -> None:
    buffer = make_buffer(4096)
    transmitter = BroadcastTransmitter(buffer)
    receiver = CopyBroadcastReceiver(BroadcastReceiver(buffer), scratch_length=64)
    transmitter.transmit(1, bytes(32))
    transmitter.transmit(1, bytes(100))
    transmitter.transmit(1, bytes(40))
    assert receiver.receive(lambda t, b: None, limit=10) == 1  # stops before the long one
    with pytest.raises(ScratchBufferTooSmallError):
        receiver.receive(lambda t, b: None, limit=10)
    assert receive_all(receiver) == [(1, bytes(40))]


def test_pattern_load_generator() -> None:
    buffer = make_buffer(64 * 1024)
    receiver = CopyBroadcastReceiver(BroadcastReceiver(buffer), scratch_length=8192)
    assert lib.fulmar_broadcast_transmit_pattern(buffer.address, 64 * 1024, 1, 10, 5, 256) == 15
    received = receive_all(receiver)
    assert [struct.unpack_from("<q", body)[0] for _, body in received] == list(range(10, 15))
    for _, body in received:
        sequence = struct.unpack_from("<q", body)[0]
        assert len(body) == lib.fulmar_broadcast_pattern_length(sequence, 256)
        assert body[8:] == bytes((sequence & 0xFF,)) * (len(body) - 8)
    assert lib.fulmar_broadcast_transmit_pattern(buffer.address, 64 * 1024, 1, 0, 1, 64 * 1024) == -1


# Across processes.

BROADCAST_CAPACITY = 64 * 1024
PATTERN_MAX_LENGTH = 2048
SEQUENCE = struct.Struct("<q")
# After the broadcast buffer: a word the receiver sets once it has seen enough
# (messages delivered and laps), telling the transmitter to stop.
STOP_FLAG_OFFSET = BROADCAST_CAPACITY + TRAILER_LENGTH
FILE_LENGTH = STOP_FLAG_OFFSET + 64
ENOUGH_MESSAGES = 2_000
ENOUGH_LAPS = 20


def _transmitter_main(path: str, deadline_s: float) -> None:
    """Runs in a spawned process: transmit numbered, self-checking messages
    from C, as fast as it goes, until the receiver raises the stop flag."""
    deadline = time.monotonic() + deadline_s
    with MappedFile.open(path) as mapped:
        buffer = mapped.buffer(0, STOP_FLAG_OFFSET)
        control = mapped.buffer(STOP_FLAG_OFFSET, 64)
        sequence = 0
        while control.get_int64_volatile(0) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError("receiver never raised the stop flag")
            sequence = lib.fulmar_broadcast_transmit_pattern(
                buffer.address, BROADCAST_CAPACITY, 1, sequence, 256, PATTERN_MAX_LENGTH
            )
            if sequence < 0:
                raise ValueError("fulmar_broadcast_transmit_pattern refused its arguments")


@pytest.mark.system
@pytest.mark.system
def test_cross_process_lagging_receiver_never_sees_a_torn_record(tmp_path: Path) -> None:
    path = tmp_path / "broadcast.dat"
    mapped = MappedFile.create(path, FILE_LENGTH)
    context = multiprocessing.get_context("spawn")
    transmitter = context.Process(target=_transmitter_main, args=(str(path), 60.0))
    try:
        buffer = mapped.buffer(0, STOP_FLAG_OFFSET)
        low_level = BroadcastReceiver(buffer)
        receiver = CopyBroadcastReceiver(low_level)
        control = mapped.buffer(STOP_FLAG_OFFSET, 64)
        tail_offset = BROADCAST_CAPACITY + TAIL_COUNTER_OFFSET
        rng = random.Random(11)
        sequences: list[int] = []
        torn: list[int] = []
        lap_errors = 0

        def handler(msg_type_id: int, body: memoryview) -> None:
            sequence = SEQUENCE.unpack_from(body)[0]
            length = len(body)
            if length != lib.fulmar_broadcast_pattern_length(sequence, PATTERN_MAX_LENGTH) or (
                body[8:].tobytes() != bytes((sequence & 0xFF,)) * (length - 8)
            ):
                torn.append(sequence)
            sequences.append(sequence)

        transmitter.start()
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "receiver did not finish before the deadline"
            done = transmitter.exitcode is not None
            try:
                received = receiver.receive(handler, limit=8)
            except UnableToKeepUpError:
                lap_errors += 1
                continue
            if len(sequences) >= ENOUGH_MESSAGES and lap_errors >= ENOUGH_LAPS:
                control.put_int64_ordered(0, 1)
            if done:
                if received == 0:
                    break  # transmitter gone and we are at its tail
                continue
            # Fall behind on purpose until the transmitter is nearly a whole
            # ring ahead, so the next copy races with the transmitter writing
            # over the very records being copied: what validation is for.
            lag = BROADCAST_CAPACITY - rng.randrange(BROADCAST_CAPACITY // 4)
            target = buffer.get_int64_volatile(tail_offset) + lag
            while buffer.get_int64_volatile(tail_offset) < target and transmitter.exitcode is None:
                assert time.monotonic() < deadline, "transmitter stalled"

        transmitter.join(10)
        assert transmitter.exitcode == 0
        assert not torn, f"torn records delivered: {torn[:10]}"
        assert all(a < b for a, b in zip(sequences, sequences[1:])), "order broken"
        assert low_level.lapped_count >= ENOUGH_LAPS
        # Laps really lost messages: far fewer delivered than transmitted.
        assert sequences[-1] + 1 > 2 * len(sequences)
    finally:
        if transmitter.is_alive():
            transmitter.terminate()
        transmitter.join(5)
        if transmitter.is_alive():
            transmitter.kill()
            transmitter.join(5)
        mapped.close()
        path.unlink(missing_ok=True)
