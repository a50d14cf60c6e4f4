"""Distinct error log: record layout, distinct counting, space limits, the
reader, and concurrent recording from threads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.error_log import (
    ENCODED_ERROR_OFFSET,
    FIRST_OBSERVATION_TIMESTAMP_OFFSET,
    LAST_OBSERVATION_TIMESTAMP_OFFSET,
    OBSERVATION_COUNT_OFFSET,
    CorruptErrorLogError,
    DistinctErrorLog,
    ErrorObservation,
    error_log_exists,
    read_error_log,
)


class FakeClock:
    def __init__(self, now_ms: int = 1_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_layout_matches_aeron() -> None:
    assert (OBSERVATION_COUNT_OFFSET, LAST_OBSERVATION_TIMESTAMP_OFFSET) == (4, 8)
    assert (FIRST_OBSERVATION_TIMESTAMP_OFFSET, ENCODED_ERROR_OFFSET) == (16, 24)


def test_first_observation_record() -> None:
    buffer = AtomicBuffer(bytearray(1024))
    log = DistinctErrorLog(buffer, FakeClock(1_234))
    assert not error_log_exists(buffer)
    assert log.record("boom: bad frame")
    assert error_log_exists(buffer)
    assert buffer.get_int32(0) == 24 + len("boom: bad frame")
    assert buffer.get_int32(4) == 1
    assert buffer.get_int64(8) == 1_234
    assert buffer.get_int64(16) == 1_234
    assert buffer.get_bytes(24, 15) == b"boom: bad frame"


def test_same_text_counts_and_updates_last_timestamp_only() -> None:
    buffer = AtomicBuffer(bytearray(1024))
    clock = FakeClock(100)
    log = DistinctErrorLog(buffer, clock)
    log.record("a")
    clock.now_ms = 200
    log.record("b")
    clock.now_ms = 300
    log.record("a")
    log.record("a")
    assert list(read_error_log(buffer)) == [
        ErrorObservation(3, 100, 300, "a"),
        ErrorObservation(1, 200, 200, "b"),
    ]
    # The second record starts on the next 8-byte boundary after 25 bytes.
    assert buffer.get_int32(32) == 25


def test_since_timestamp_filters_on_last_observation() -> None:
    buffer = AtomicBuffer(bytearray(1024))
    clock = FakeClock(100)
    log = DistinctErrorLog(buffer, clock)
    log.record("old")
    clock.now_ms = 500
    log.record("new")
    assert [o.text for o in read_error_log(buffer, since_timestamp=300)] == ["new"]
    log.record("old")
    assert [o.text for o in read_error_log(buffer, since_timestamp=300)] == ["old", "new"]


def test_full_log_refuses_new_errors_but_still_counts_known_ones() -> None:
    buffer = AtomicBuffer(bytearray(64))
    log = DistinctErrorLog(buffer, FakeClock())
    assert log.record("x" * 16)  # 40 bytes, next record at 40
    assert not log.record("y" * 16)  # would need 40 more
    assert log.record("x" * 16)
    assert list(read_error_log(buffer)) == [ErrorObservation(2, 1_000, 1_000, "x" * 16)]
    assert not log.record("z" * 100)


def test_utf8_text_round_trips() -> None:
    buffer = AtomicBuffer(bytearray(1024))
    log = DistinctErrorLog(buffer, FakeClock())
    log.record("échec: ✗")
    assert [o.text for o in read_error_log(buffer)] == ["échec: ✗"]


def test_corrupt_length_raises() -> None:
    buffer = AtomicBuffer(bytearray(256))
    buffer.put_int32(0, 12)  # shorter than a header
    with pytest.raises(CorruptErrorLogError):
        list(read_error_log(buffer))
    buffer.put_int32(0, 4000)  # longer than the buffer
    with pytest.raises(CorruptErrorLogError):
        list(read_error_log(buffer))


def test_concurrent_recording_from_threads_loses_no_observation() -> None:
    buffer = AtomicBuffer(bytearray(4096))
    log = DistinctErrorLog(buffer, FakeClock())
    texts = [f"error {i}" for i in range(5)]
    per_thread = 2_000

    def work(offset: int) -> None:
        for i in range(per_thread):
            assert log.record(texts[(i + offset) % len(texts)])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    observations = list(read_error_log(buffer))
    assert sorted(o.text for o in observations) == texts  # one record per distinct text
    assert sum(o.observation_count for o in observations) == 4 * per_thread


def test_readable_through_another_mapping(tmp_path: Path) -> None:
    path = tmp_path / "errors.dat"
    try:
        with MappedFile.create(path, 4096) as writer_file:
            DistinctErrorLog(writer_file.buffer(), FakeClock(42)).record("written elsewhere")
            with MappedFile.open(path) as reader_file:
                assert list(read_error_log(reader_file.buffer())) == [ErrorObservation(1, 42, 42, "written elsewhere")]
    finally:
        path.unlink(missing_ok=True)
