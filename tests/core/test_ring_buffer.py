"""Many-to-one ring buffer: layout, wrap/padding, full, limits, claims,
recovery, a model-based property test and a cross-process stress test."""

from __future__ import annotations

import multiprocessing
import os
import random
import struct
import time
import zlib
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar._native import lib
from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.ring_buffer import (
    CONSUMER_HEARTBEAT_OFFSET,
    CORRELATION_COUNTER_OFFSET,
    HEAD_CACHE_POSITION_OFFSET,
    HEAD_POSITION_OFFSET,
    PADDING_MSG_TYPE_ID,
    TAIL_POSITION_OFFSET,
    TRAILER_LENGTH,
    ClaimStateError,
    CorruptBufferError,
    InvalidCapacityError,
    InvalidMessageTypeError,
    ManyToOneRingBuffer,
    MessageTooLongError,
)

I32 = struct.Struct("<i")


def make_ring(capacity: int = 1024) -> ManyToOneRingBuffer:
    return ManyToOneRingBuffer(AtomicBuffer(bytearray(capacity + TRAILER_LENGTH)))


def drain(ring: ManyToOneRingBuffer, limit: int = 1 << 30) -> list[tuple[int, bytes]]:
    received: list[tuple[int, bytes]] = []
    ring.read(lambda msg_type_id, body: received.append((msg_type_id, bytes(body))), limit)
    return received


def aligned(length: int) -> int:
    return (length + 7) & ~7


# Layout and validation.


def test_trailer_offsets_match_aeron() -> None:
    assert (TRAILER_LENGTH, TAIL_POSITION_OFFSET, HEAD_CACHE_POSITION_OFFSET, HEAD_POSITION_OFFSET) == (
        768,
        128,
        256,
        384,
    )
    assert (CORRELATION_COUNTER_OFFSET, CONSUMER_HEARTBEAT_OFFSET) == (512, 640)


@pytest.mark.parametrize("capacity", [0, 4, 1000, 1024 + 8, 3 * 1024])
def test_capacity_must_be_a_power_of_two_plus_trailer(capacity: int) -> None:
    with pytest.raises(InvalidCapacityError):
        ManyToOneRingBuffer(AtomicBuffer(bytearray(capacity + TRAILER_LENGTH)))


def test_misaligned_buffer_is_refused() -> None:
    memory = bytearray(1024 + TRAILER_LENGTH + 8)
    with pytest.raises(InvalidCapacityError):
        ManyToOneRingBuffer(AtomicBuffer(memory, 4, 1024 + TRAILER_LENGTH))


def test_record_layout_and_positions() -> None:
    ring = make_ring()
    assert ring.write(7, b"hello")
    view = ring.buffer.view
    # length includes the 8-byte header; type id follows; body at 8.
    assert I32.unpack_from(view, 0)[0] == 13
    assert I32.unpack_from(view, 4)[0] == 7
    assert bytes(view[8:13]) == b"hello"
    assert ring.producer_position == 16
    assert ring.size() == 16
    assert drain(ring) == [(7, b"hello")]
    assert ring.consumer_position == 16
    assert ring.size() == 0


def test_messages_are_delivered_in_order_with_types_and_empty_bodies() -> None:
    ring = make_ring()
    sent = [(i + 1, bytes([i]) * i) for i in range(20)]
    for msg_type_id, body in sent:
        assert ring.write(msg_type_id, body)
    assert drain(ring) == sent


def test_accepts_bytearray_and_memoryview_payloads() -> None:
    ring = make_ring()
    assert ring.write(1, bytearray(b"abc"))
    assert ring.write(2, memoryview(b"xyzw")[1:3])
    assert drain(ring) == [(1, b"abc"), (2, b"yz")]


def test_read_limit_counts_messages() -> None:
    ring = make_ring()
    for i in range(10):
        ring.write(1, bytes([i]))
    assert [body for _, body in drain(ring, 3)] == [b"\x00", b"\x01", b"\x02"]
    assert len(drain(ring)) == 7
    assert drain(ring) == []


def test_max_message_length_and_errors() -> None:
    ring = make_ring(1024)
    assert ring.max_message_length == 128
    assert ring.write(1, bytes(128))
    with pytest.raises(MessageTooLongError):
        ring.write(1, bytes(129))
    with pytest.raises(MessageTooLongError):
        ring.try_claim(1, 129)
    for bad_type in (0, -1, -5):
        with pytest.raises(InvalidMessageTypeError):
            ring.write(bad_type, b"x")
    assert drain(ring) == [(1, bytes(128))]


def test_full_buffer_refuses_then_accepts_after_read() -> None:
    ring = make_ring(1024)
    body = bytes(56)  # 64-byte records: exactly 16 fit
    written = 0
    while ring.write(1, body):
        written += 1
    assert written == 16
    assert ring.size() == 1024
    assert not ring.write(1, b"")
    assert len(drain(ring, 1)) == 1
    assert ring.write(1, body)
    assert not ring.write(1, b"")
    assert len(drain(ring)) == 16


def test_wrap_inserts_padding_and_reader_skips_it() -> None:
    ring = make_ring(1024)
    view = ring.buffer.view
    # Move the head and tail to 1000 so only 24 bytes remain before the end.
    for _ in range(7):
        assert ring.write(1, bytes(120))  # 128-byte records
        drain(ring)
    assert ring.write(1, bytes(96))  # a 104-byte record
    drain(ring)
    tail = ring.producer_position
    tail_index = tail & 1023
    to_end = 1024 - tail_index
    assert (tail, to_end) == (1000, 24)

    assert ring.write(9, bytes(range(40)))  # 48-byte record does not fit before the end
    assert I32.unpack_from(view, tail_index)[0] == to_end
    assert I32.unpack_from(view, tail_index + 4)[0] == PADDING_MSG_TYPE_ID
    assert I32.unpack_from(view, 0)[0] == 48
    assert ring.producer_position == tail + to_end + 48
    assert drain(ring) == [(9, bytes(range(40)))]
    assert ring.consumer_position == ring.producer_position


def test_wrap_when_start_is_still_occupied_pads_and_reports_full() -> None:
    ring = make_ring(1024)
    # 15 records of 64 bytes (960 bytes); consume the first one only.
    for i in range(15):
        assert ring.write(1, bytes([i]) * 56)
    assert len(drain(ring, 1)) == 1  # head at 64, tail at 960
    # An 80-byte record does not fit in the 64 bytes before the end, nor in the
    # 64 bytes freed at the start: Agrona pads the end and reports full.
    assert not ring.write(2, bytes(72))
    assert ring.producer_position == 1024
    assert I32.unpack_from(ring.buffer.view, 960 + 4)[0] == PADDING_MSG_TYPE_ID
    assert len(drain(ring)) == 14
    assert ring.write(2, bytes(72))
    assert drain(ring) == [(2, bytes(72))]


def test_consumed_bytes_are_zeroed() -> None:
    ring = make_ring(1024)
    for i in range(5):
        ring.write(3, bytes([0xAB]) * (i * 7))
    assert bytes(ring.buffer.view[:8]) != bytes(8)
    drain(ring)
    assert bytes(ring.buffer.view[:1024]) == bytes(1024)


def test_correlation_ids_are_shared_by_every_view_of_the_buffer() -> None:
    memory = bytearray(1024 + TRAILER_LENGTH)
    first = ManyToOneRingBuffer(AtomicBuffer(memory))
    second = ManyToOneRingBuffer(AtomicBuffer(memory))
    ids = [first.next_correlation_id(), second.next_correlation_id(), first.next_correlation_id()]
    assert ids == [0, 1, 2]
    assert first.buffer.get_int64(1024 + CORRELATION_COUNTER_OFFSET) == 3


def test_consumer_heartbeat_time() -> None:
    ring = make_ring()
    assert ring.consumer_heartbeat_time == 0
    ring.consumer_heartbeat_time = 1_700_000_000_123
    assert ring.consumer_heartbeat_time == 1_700_000_000_123
    assert ring.buffer.get_int64(1024 + CONSUMER_HEARTBEAT_OFFSET) == 1_700_000_000_123


# Claims.


def test_claim_is_invisible_until_committed() -> None:
    ring = make_ring()
    index = ring.try_claim(5, 4)
    assert index is not None
    assert ring.write(6, b"after")
    assert drain(ring) == []  # the reader waits at the open claim
    ring.buffer.put_bytes(index, b"body")
    ring.commit(index)
    assert drain(ring) == [(5, b"body"), (6, b"after")]


def test_aborted_claim_is_skipped() -> None:
    ring = make_ring()
    index = ring.try_claim(5, 16)
    assert index is not None
    ring.write(6, b"x")
    ring.abort(index)
    assert drain(ring) == [(6, b"x")]


def test_claim_errors() -> None:
    ring = make_ring()
    index = ring.try_claim(5, 4)
    assert index is not None
    ring.commit(index)
    with pytest.raises(ClaimStateError):
        ring.commit(index)
    with pytest.raises(ClaimStateError):
        ring.abort(index)
    for bad in (0, 3, 4096):
        with pytest.raises(IndexError):
            ring.commit(bad)


def test_claim_when_full_returns_none() -> None:
    ring = make_ring(1024)
    while ring.write(1, bytes(56)):
        pass
    assert ring.try_claim(1, 8) is None


# Consumer behaviour on errors.


def test_handler_exception_consumes_through_the_failing_message() -> None:
    ring = make_ring()
    for i in range(5):
        ring.write(1, bytes([i]))
    seen: list[bytes] = []

    def handler(msg_type_id: int, body: memoryview) -> None:
        seen.append(bytes(body))
        if body[0] == 2:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        ring.read(handler)
    assert seen == [b"\x00", b"\x01", b"\x02"]
    assert drain(ring) == [(1, b"\x03"), (1, b"\x04")]


def test_corrupt_length_raises_instead_of_reading_past_the_ring() -> None:
    ring = make_ring(1024)
    ring.write(1, b"ok")
    ring.buffer.put_int32_ordered(16, 5000)  # a record longer than the ring
    ring.buffer.put_int32(20, 1)
    received: list[bytes] = []
    with pytest.raises(CorruptBufferError):
        ring.read(lambda t, body: received.append(bytes(body)))
    assert received == [b"ok"]


def test_unblock_a_producer_that_died_after_writing_its_header() -> None:
    ring = make_ring()
    index = ring.try_claim(5, 20)  # claimed, never committed
    assert index is not None
    ring.write(6, b"next")
    assert drain(ring) == []
    assert ring.unblock()
    assert drain(ring) == [(6, b"next")]
    assert not ring.unblock()


def test_unblock_a_producer_that_died_before_writing_its_header() -> None:
    ring = make_ring()
    # A producer that won the CAS on the tail for 32 bytes and died at once.
    tail_offset = ring.capacity + TAIL_POSITION_OFFSET
    assert ring.buffer.compare_and_set_int64(tail_offset, 0, 32)
    ring.write(6, b"next")
    assert drain(ring) == []
    assert ring.unblock()
    assert drain(ring) == [(6, b"next")]
    assert ring.consumer_position == ring.producer_position


def test_unblock_leaves_a_slow_producer_alone() -> None:
    ring = make_ring()
    tail_offset = ring.capacity + TAIL_POSITION_OFFSET
    assert ring.buffer.compare_and_set_int64(tail_offset, 0, 32)  # claimed, header not yet written
    assert not ring.unblock()  # nothing committed after it: nothing to skip to
    assert drain(ring) == []


# Model-based property test.


class RingModel:
    """Positions and records as Agrona's algorithm should leave them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.head = 0
        self.tail = 0
        self.records: deque[tuple[int, int, bytes]] = deque()  # (aligned length, type, body)

    def write(self, msg_type_id: int, body: bytes) -> bool:
        required = aligned(len(body) + 8)
        if required > self.capacity - (self.tail - self.head):
            return False
        tail_index = self.tail & (self.capacity - 1)
        to_end = self.capacity - tail_index
        if required > to_end:
            self.records.append((to_end, PADDING_MSG_TYPE_ID, b""))
            self.tail += to_end
            if required > self.head & (self.capacity - 1):
                return False
        self.records.append((required, msg_type_id, body))
        self.tail += required
        return True

    def read(self, limit: int) -> list[tuple[int, bytes]]:
        delivered: list[tuple[int, bytes]] = []
        while self.records and len(delivered) < limit:
            length, msg_type_id, body = self.records.popleft()
            self.head += length
            if msg_type_id != PADDING_MSG_TYPE_ID:
                delivered.append((msg_type_id, body))
        return delivered


operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 5), st.integers(0, 128)),
        st.tuples(st.just("read"), st.integers(0, 40), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_ring_buffer_matches_model(ops: list[tuple[str, int, int]]) -> None:
    capacity = 1024
    ring = make_ring(capacity)
    model = RingModel(capacity)
    sequence = 0
    for op, a, b in ops:
        if op == "write":
            body = bytes((sequence + i) & 0xFF for i in range(b))
            sequence += 1
            assert ring.write(a, body) == model.write(a, body)
        else:
            assert drain(ring, a) == model.read(a)
        assert ring.producer_position == model.tail
        assert ring.consumer_position == model.head
        # Everything outside the unread records is zero: reads zero what they
        # consume, so writers always find clean space.
        view = ring.buffer.view
        free_start = model.tail & (capacity - 1)
        free_length = capacity - (model.tail - model.head)
        free = bytes(view[free_start : free_start + free_length])
        if free_start + free_length > capacity:
            free = bytes(view[free_start:capacity]) + bytes(view[: free_start + free_length - capacity])
        assert free == bytes(free_length)
    assert drain(ring) == model.read(1 << 30)


# Cross-process stress.

STRESS_WRITERS = 4
STRESS_RECORDS_PER_WRITER = 250_000
STRESS_CAPACITY = 64 * 1024
STRESS_HEADER = struct.Struct("<iqI")  # writer id, sequence, crc32 of the rest
STRESS_DEADLINE_S = 120.0


def _stress_writer(path: str, writer_id: int, count: int, seed: int) -> None:
    """Runs in a spawned process: write `count` checksummed records."""
    rng = random.Random(seed)
    filler = rng.randbytes(8192)
    header = STRESS_HEADER
    with MappedFile.open(path) as mapped:
        ring = ManyToOneRingBuffer(mapped.buffer())
        for sequence in range(count):
            # Mostly small records, some large ones so padding happens often.
            size = rng.randrange(0, 256) if rng.random() < 0.9 else rng.randrange(256, 4000)
            start = sequence % 4096
            body = filler[start : start + size]
            payload = header.pack(writer_id, sequence, zlib.crc32(body)) + body
            attempts = 0
            while not ring.write(writer_id + 1, payload):
                # Full: let the reader run (2 cores, 5 processes).
                attempts += 1
                if attempts < 50:
                    os.sched_yield()
                else:
                    time.sleep(0.0002)


def _reap(processes: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)


@pytest.mark.system
@pytest.mark.system
def test_cross_process_many_writers_one_reader(tmp_path: Path) -> None:
    path = tmp_path / "stress-ring.dat"
    mapped = MappedFile.create(path, STRESS_CAPACITY + TRAILER_LENGTH)
    context = multiprocessing.get_context("spawn")
    writers = [
        context.Process(
            target=_stress_writer,
            args=(str(path), writer_id, STRESS_RECORDS_PER_WRITER, 1000 + writer_id),
            name=f"ring-writer-{writer_id}",
        )
        for writer_id in range(STRESS_WRITERS)
    ]
    try:
        ring = ManyToOneRingBuffer(mapped.buffer())
        expected = [0] * STRESS_WRITERS
        errors: list[str] = []
        switches = 0
        last_writer = -1

        def handler(msg_type_id: int, body: memoryview) -> None:
            nonlocal switches, last_writer
            writer_id, sequence, crc = STRESS_HEADER.unpack_from(body)
            if not 0 <= writer_id < STRESS_WRITERS or msg_type_id != writer_id + 1:
                errors.append(f"bad writer id {writer_id} / type {msg_type_id}")
                return
            if sequence != expected[writer_id]:
                errors.append(f"writer {writer_id}: got {sequence}, expected {expected[writer_id]}")
            if zlib.crc32(body[STRESS_HEADER.size :]) != crc:
                errors.append(f"writer {writer_id} record {sequence}: checksum mismatch")
            expected[writer_id] = sequence + 1
            if writer_id != last_writer:
                switches += 1
                last_writer = writer_id

        for writer in writers:
            writer.start()

        total = STRESS_WRITERS * STRESS_RECORDS_PER_WRITER
        received = 0
        idle = 0
        deadline = time.monotonic() + STRESS_DEADLINE_S
        while received < total and not errors:
            count = ring.read(handler)
            received += count
            if count:
                idle = 0
                continue
            idle += 1
            if idle % 1000 == 0:
                assert time.monotonic() < deadline, f"timed out with {received}/{total} records, at {expected}"
                failed = [w.name for w in writers if w.exitcode not in (None, 0)]
                assert not failed, f"writer processes failed: {failed}"
            if idle < 100:
                os.sched_yield()
            else:
                time.sleep(0.0002)

        assert not errors, errors[:10]
        assert expected == [STRESS_RECORDS_PER_WRITER] * STRESS_WRITERS
        for writer in writers:
            writer.join(max(0.0, deadline - time.monotonic()))
            assert writer.exitcode == 0, f"{writer.name} exit code {writer.exitcode}"
        assert drain(ring) == []  # exactly once: nothing extra behind the last record
        assert ring.size() == 0
        # The writers really ran concurrently: their records interleave.
        assert switches > 100, f"only {switches} writer switches: the writers did not overlap"
        wraps = ring.producer_position // STRESS_CAPACITY
        assert wraps > 1000
    finally:
        _reap(writers)
        mapped.close()
        path.unlink(missing_ok=True)


# The bench's C reference loop.


def test_native_bench_loop_reads_every_message() -> None:
    ring = make_ring(64 * 1024)
    assert lib.fulmar_rb_bench(ring.buffer.address, ring.capacity, 10_000, 32, 64) == 10_000
    assert ring.size() == 0
    assert lib.fulmar_rb_bench(ring.buffer.address, ring.capacity, 1, 10_000, 64) == -1
