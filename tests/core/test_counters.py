"""Counters: layout, allocation, free and reuse after the deadline, readers,
AtomicCounter, and a reader in one process watching a manager in another."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import struct
import time
from pathlib import Path

import pytest

from fulmar._native import lib
from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.counters import (
    COUNTER_LENGTH,
    FREE_FOR_REUSE_DEADLINE_OFFSET,
    KEY_OFFSET,
    LABEL_LENGTH_OFFSET,
    LABEL_OFFSET,
    MAX_KEY_LENGTH,
    MAX_LABEL_LENGTH,
    METADATA_LENGTH,
    NOT_FREE_TO_REUSE,
    NULL_COUNTER_ID,
    OWNER_ID_OFFSET,
    RECORD_ALLOCATED,
    RECORD_RECLAIMED,
    RECORD_UNUSED,
    REFERENCE_ID_OFFSET,
    REGISTRATION_ID_OFFSET,
    TYPE_ID_OFFSET,
    AtomicCounter,
    CounterKeyTooLongError,
    CounterMetadata,
    CountersFullError,
    CountersManager,
    CountersReader,
    CounterStateError,
)


class FakeClock:
    def __init__(self, now_ms: int = 1_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def make_manager(
    counters: int = 8, reuse_timeout_ms: int = 1_000, clock: FakeClock | None = None
) -> tuple[CountersManager, FakeClock]:
    clock = clock or FakeClock()
    metadata = AtomicBuffer(bytearray(counters * METADATA_LENGTH))
    values = AtomicBuffer(bytearray(counters * COUNTER_LENGTH))
    return CountersManager(metadata, values, reuse_timeout_ms, clock), clock


def test_layout_constants_match_aeron() -> None:
    assert (METADATA_LENGTH, COUNTER_LENGTH) == (512, 128)
    assert (TYPE_ID_OFFSET, FREE_FOR_REUSE_DEADLINE_OFFSET, KEY_OFFSET) == (4, 8, 16)
    assert (LABEL_LENGTH_OFFSET, LABEL_OFFSET, MAX_KEY_LENGTH, MAX_LABEL_LENGTH) == (128, 132, 112, 380)
    assert (REGISTRATION_ID_OFFSET, OWNER_ID_OFFSET, REFERENCE_ID_OFFSET) == (8, 16, 24)
    assert (RECORD_UNUSED, RECORD_ALLOCATED, RECORD_RECLAIMED) == (0, 1, -1)
    # The native code's copy of the layout (counters.h) is the same.
    assert (lib.FULMAR_COUNTER_LENGTH, lib.FULMAR_COUNTER_METADATA_LENGTH) == (COUNTER_LENGTH, METADATA_LENGTH)
    assert (lib.FULMAR_COUNTER_TYPE_ID_OFFSET, lib.FULMAR_COUNTER_REGISTRATION_ID_OFFSET) == (
        TYPE_ID_OFFSET,
        REGISTRATION_ID_OFFSET,
    )
    assert lib.FULMAR_COUNTER_RECORD_UNUSED == RECORD_UNUSED


def test_allocate_writes_aeron_records() -> None:
    manager, _ = make_manager()
    counter_id = manager.allocate("sender pos", type_id=2, key=b"\x01\x02", registration_id=77, owner_id=5)
    assert counter_id == 0
    metadata, values = manager.metadata_buffer, manager.values_buffer
    assert metadata.get_int32(0) == RECORD_ALLOCATED
    assert metadata.get_int32(4) == 2
    assert metadata.get_int64(8) == NOT_FREE_TO_REUSE
    assert metadata.get_bytes(16, 3) == b"\x01\x02\x00"
    assert metadata.get_int32(128) == len("sender pos")
    assert metadata.get_bytes(132, 10) == b"sender pos"
    assert values.get_int64(0) == 0
    assert values.get_int64(8) == 77
    assert values.get_int64(16) == 5
    assert values.get_int64(24) == 0
    assert manager.allocate("second") == 1


def test_reader_iterates_allocated_counters_only() -> None:
    manager, _ = make_manager()
    ids = [manager.allocate(f"c{i}", type_id=10 + i, key=bytes([i])) for i in range(4)]
    manager.free(ids[1])
    reader = CountersReader(manager.metadata_buffer, manager.values_buffer)
    listed = list(reader)
    assert [c.counter_id for c in listed] == [0, 2, 3]
    assert listed[1] == CounterMetadata(2, 12, bytes([2]) + bytes(MAX_KEY_LENGTH - 1), "c2")
    assert reader.counter_state(1) == RECORD_RECLAIMED
    assert reader.counter_state(5) == RECORD_UNUSED
    assert reader.max_counter_id == 7


def test_a_snapshot_holds_every_id_up_to_the_first_unused_as_the_word_readers_see_it() -> None:
    manager, _ = make_manager()
    ids = [manager.allocate(f"c{i}", type_id=20 + i, registration_id=100 + i) for i in range(4)]
    for counter_id in ids:
        manager.set_counter_value(counter_id, (counter_id + 1) * 1_000_000_007)  # past 32 bits
    manager.set_counter_value(ids[3], -5)
    manager.free(ids[2])
    reader = CountersReader(manager.metadata_buffer, manager.values_buffer)
    snapshot = reader.snapshot()
    assert snapshot.states == [RECORD_ALLOCATED, RECORD_ALLOCATED, RECORD_RECLAIMED, RECORD_ALLOCATED]
    assert snapshot.type_ids == [reader.counter_type_id(i) for i in range(4)] == [20, 21, 22, 23]
    assert snapshot.registration_ids == [reader.counter_registration_id(i) for i in range(4)]
    assert snapshot.registration_ids[:2] == [100, 101]
    assert snapshot.values == [reader.counter_value(i) for i in range(4)]
    assert snapshot.values[:2] == [1_000_000_007, 2_000_000_014] and snapshot.values[3] == -5

    full, _ = make_manager(counters=3)
    for i in range(3):
        full.allocate(f"f{i}")
    assert len(CountersReader(full.metadata_buffer, full.values_buffer).snapshot().states) == 3  # no unused one
    empty, _ = make_manager()
    assert CountersReader(empty.metadata_buffer, empty.values_buffer).snapshot().states == []


def test_free_then_reuse_only_after_the_deadline() -> None:
    manager, clock = make_manager(counters=4, reuse_timeout_ms=500)
    first = manager.allocate("a", key=b"key", registration_id=1)
    manager.set_counter_value(first, 99)
    manager.free(first)
    assert manager.free_for_reuse_deadline_ms(first) == 1_500
    assert manager.counter_key(first) == bytes(MAX_KEY_LENGTH)

    clock.now_ms = 1_499
    assert manager.allocate("b") == 1  # still cooling down: a fresh id
    clock.now_ms = 1_500
    reused = manager.allocate("c", registration_id=2)
    assert reused == first
    assert manager.counter_value(reused) == 0
    assert manager.counter_registration_id(reused) == 2
    assert manager.counter_label(reused) == "c"
    assert manager.free_for_reuse_deadline_ms(reused) == NOT_FREE_TO_REUSE


def test_full_and_available() -> None:
    manager, clock = make_manager(counters=2, reuse_timeout_ms=10)
    assert manager.capacity == 2 and manager.available() == 2
    manager.allocate("a")
    last = manager.allocate("b")
    assert manager.available() == 0
    with pytest.raises(CountersFullError):
        manager.allocate("c")
    manager.free(last)
    assert manager.available() == 0
    with pytest.raises(CountersFullError):
        manager.allocate("c")
    clock.now_ms += 10
    assert manager.available() == 1
    assert manager.allocate("c") == last


def test_label_is_truncated_like_aeron_and_key_length_is_checked() -> None:
    manager, _ = make_manager()
    long_label = "é" * 300  # 600 bytes of UTF-8
    counter_id = manager.allocate(long_label)
    label = manager.counter_label(counter_id)
    assert label == "é" * 190  # 380 bytes, cut on a character boundary
    assert manager.allocate("x" * 1000) == counter_id + 1
    assert manager.counter_label(counter_id + 1) == "x" * MAX_LABEL_LENGTH

    with pytest.raises(CounterKeyTooLongError):
        manager.allocate("k", key=bytes(MAX_KEY_LENGTH + 1))
    key_id = manager.allocate("k", key=bytes(range(MAX_KEY_LENGTH)))
    assert manager.counter_key(key_id) == bytes(range(MAX_KEY_LENGTH))


def test_label_and_key_updates() -> None:
    manager, _ = make_manager()
    counter_id = manager.allocate("base")
    manager.append_to_label(counter_id, " suffix")
    assert manager.counter_label(counter_id) == "base suffix"
    manager.set_counter_label(counter_id, "new")
    assert manager.counter_label(counter_id) == "new"
    manager.append_to_label(counter_id, "y" * 1000)
    assert manager.counter_label(counter_id) == "new" + "y" * (MAX_LABEL_LENGTH - 3)
    manager.set_counter_key(counter_id, b"abc")
    assert manager.counter_key(counter_id)[:4] == b"abc\x00"
    manager.set_counter_owner_id(counter_id, 3)
    manager.set_counter_reference_id(counter_id, 4)
    manager.set_counter_registration_id(counter_id, 5)
    assert (manager.counter_owner_id(counter_id), manager.counter_reference_id(counter_id)) == (3, 4)
    assert manager.counter_registration_id(counter_id) == 5


def test_find_by_registration() -> None:
    manager, _ = make_manager()
    manager.allocate("a", type_id=1, registration_id=10)
    b = manager.allocate("b", type_id=2, registration_id=10)
    c = manager.allocate("c", type_id=2, registration_id=11)
    assert manager.find_by_registration_id(10) == 0
    assert manager.find_by_type_and_registration(2, 10) == b
    assert manager.find_by_type_and_registration(2, 11) == c
    assert manager.find_by_type_and_registration(3, 10) == NULL_COUNTER_ID
    manager.free(b)
    assert manager.find_by_type_and_registration(2, 10) == NULL_COUNTER_ID


def test_find_by_type_and_registration_anywhere_and_every_id_of_a_type() -> None:
    """The native lookups: a publication's counters need not sit together (ids
    are reused as they were freed), freed ones are not found, and ``ids_of_type``
    walks every allocated counter of a type in id order."""
    manager, _ = make_manager(counters=32)
    limit = manager.allocate("pub-lmt", type_id=1, registration_id=7)
    for _ in range(10):
        manager.allocate("filler", type_id=99)
    far = manager.allocate("pub-msgs", type_id=90, registration_id=7)
    bpe = manager.allocate("snd-bpe", type_id=13, registration_id=7)
    other_bpe = manager.allocate("snd-bpe", type_id=13, registration_id=8)
    assert manager.find_by_type_and_registration(1, 7) == limit
    assert manager.find_by_type_and_registration(90, 7) == far
    assert manager.find_by_type_and_registration(13, 8) == other_bpe
    assert list(manager.ids_of_type(13)) == [bpe, other_bpe]
    assert list(manager.ids_of_type(99)) == list(range(limit + 1, limit + 11))
    manager.free(bpe)
    assert manager.find_by_type_and_registration(13, 7) == NULL_COUNTER_ID
    assert list(manager.ids_of_type(13)) == [other_bpe]
    assert list(manager.ids_of_type(12345)) == []


def test_errors() -> None:
    manager, _ = make_manager(counters=2)
    with pytest.raises(CounterStateError):
        manager.free(0)
    with pytest.raises(IndexError):
        manager.free(2)
    with pytest.raises(IndexError):
        manager.counter_value(-1)
    counter_id = manager.allocate("a")
    manager.free(counter_id)
    with pytest.raises(CounterStateError):
        manager.free(counter_id)
    with pytest.raises(CounterStateError):
        manager.set_counter_label(counter_id, "x")
    with pytest.raises(ValueError):
        CountersManager(AtomicBuffer(bytearray(512)), AtomicBuffer(bytearray(256)), 0, FakeClock())


def test_atomic_counter_operations_and_close() -> None:
    manager, _ = make_manager()
    counter = manager.new_counter("ops", type_id=3)
    assert counter.get() == 0
    counter.set(10)
    assert counter.increment() == 10
    assert counter.get_and_add(5) == 11
    assert counter.get() == 16
    assert counter.compare_and_set(16, 20)
    assert not counter.compare_and_set(16, 30)
    assert counter.propose_max(25) and not counter.propose_max(3)
    assert manager.counter_value(counter.id) == 25
    with counter:
        pass
    assert counter.is_closed
    assert manager.counter_state(counter.id) == RECORD_RECLAIMED
    counter.close()  # idempotent

    unowned = AtomicCounter(manager.values_buffer, 7)
    unowned.close()  # no manager: nothing to free
    with pytest.raises(IndexError):
        AtomicCounter(manager.values_buffer, 8)


# Across processes.

CROSS_COUNTERS = 300
CROSS_VALUES_LENGTH = 512 * COUNTER_LENGTH
CROSS_METADATA_LENGTH = 4 * CROSS_VALUES_LENGTH
KEY = struct.Struct("<q")


def expected_label(number: int) -> str:
    return f"counter {number} " + "x" * (number % 300)


def _manager_main(path: str, reader_started: multiprocessing.synchronize.Event) -> None:
    """Runs in a spawned process: allocate, update and free counters."""
    with MappedFile.open(path) as mapped:
        metadata = mapped.buffer(0, CROSS_METADATA_LENGTH)
        values = mapped.buffer(CROSS_METADATA_LENGTH, CROSS_VALUES_LENGTH)
        manager = CountersManager(metadata, values, 60_000, lambda: int(time.time() * 1000))
        counters = []
        for number in range(CROSS_COUNTERS):
            counter = manager.new_counter(
                expected_label(number), type_id=100 + number % 3, key=KEY.pack(number), registration_id=number
            )
            for _ in range(number):
                counter.increment()
            counters.append(counter)
            if number == CROSS_COUNTERS // 3:
                # Make sure the rest overlaps with a reader that is running.
                if not reader_started.wait(30):
                    raise TimeoutError("the reader never saw the first counters")
        for counter in counters[::2]:
            counter.close()


@pytest.mark.system
@pytest.mark.system
def test_cross_process_reader_sees_whole_records(tmp_path: Path) -> None:
    path = tmp_path / "counters.dat"
    mapped = MappedFile.create(path, CROSS_METADATA_LENGTH + CROSS_VALUES_LENGTH)
    context = multiprocessing.get_context("spawn")
    reader_started = context.Event()
    process = context.Process(target=_manager_main, args=(str(path), reader_started))
    try:
        reader = CountersReader(
            mapped.buffer(0, CROSS_METADATA_LENGTH), mapped.buffer(CROSS_METADATA_LENGTH, CROSS_VALUES_LENGTH)
        )
        process.start()
        deadline = time.monotonic() + 60
        observations = 0
        # While the other process allocates: every counter a reader sees is
        # complete (label, key, type and registration id agree).
        while process.exitcode is None:
            assert time.monotonic() < deadline, "manager process did not finish"
            for counter in reader:
                number = KEY.unpack_from(counter.key)[0]
                assert counter.label == expected_label(number), counter
                assert counter.type_id == 100 + number % 3, counter
                assert reader.counter_registration_id(counter.counter_id) == number, counter
                observations += 1
            if observations:
                reader_started.set()
        assert process.exitcode == 0, f"manager process exit code {process.exitcode}"
        assert observations > 0

        final = list(reader)
        assert [KEY.unpack_from(c.key)[0] for c in final] == list(range(1, CROSS_COUNTERS, 2))
        for counter in final:
            assert reader.counter_value(counter.counter_id) == KEY.unpack_from(counter.key)[0]
        assert reader.counter_state(0) == RECORD_RECLAIMED
    finally:
        if process.is_alive():
            process.terminate()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
        mapped.close()
        path.unlink(missing_ok=True)
