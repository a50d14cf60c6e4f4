"""Tests of ``fulmar.consensus.recording_log``: layout, queries, recovery plans, repair."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fulmar.consensus.recording_log import (
    CONSENSUS_MODULE_SERVICE_ID,
    ENTRY_TYPE_SNAPSHOT,
    ENTRY_TYPE_STANDBY_SNAPSHOT,
    ENTRY_TYPE_TERM,
    NULL_POSITION,
    NULL_VALUE,
    RECORDING_LOG_FILE_NAME,
    CorruptRecordingLogError,
    Entry,
    RecordingExtent,
    RecordingLog,
    RecordingLogError,
    decode_entries,
)

CM = CONSENSUS_MODULE_SERVICE_ID
LOG_RECORDING_ID = 3


def log_file(directory: Path) -> Path:
    return directory / RECORDING_LOG_FILE_NAME


class FakeArchive:
    """Answers ``listRecording`` for the recovery plan from a dict."""

    def __init__(self, extents: dict[int, RecordingExtent]) -> None:
        self.extents = extents
        self.asked: list[int] = []

    def __call__(self, recording_id: int) -> RecordingExtent | None:
        self.asked.append(recording_id)
        return self.extents.get(recording_id)


def snapshot_set(log: RecordingLog, term_id: int, base: int, position: int, service_count: int, first_id: int) -> None:
    """Append a snapshot set in the order Aeron's consensus module does: services last to first, then CM."""
    for service_id in range(service_count - 1, -1, -1):
        log.append_snapshot(first_id + 1 + service_id, term_id, base, position, 1000 + position, service_id)
    log.append_snapshot(first_id, term_id, base, position, 1000 + position, CM)


# --------------------------------------------------------------------------- layout


def test_byte_layout_matches_aeron(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 111)
        log.append_snapshot(9, 0, 0, 4096, 222, 5)
        log.append_standby_snapshot(10, 0, 0, 4096, 333, CM, "host:8010")
        log.commit_log_position(0, 8192)
        log.invalidate_entry(1)

    data = log_file(tmp_path).read_bytes()
    assert len(data) == 64 + 64 + 64  # 48 + 4 + 9 aligns to 64
    q = lambda off: struct.unpack_from("<q", data, off)[0]  # noqa: E731
    i = lambda off: struct.unpack_from("<i", data, off)[0]  # noqa: E731

    # TERM at 0
    assert q(0) == LOG_RECORDING_ID  # recordingId @0
    assert q(8) == 0  # leadershipTermId @8
    assert q(16) == 0  # termBaseLogPosition @16
    assert q(24) == 8192  # logPosition @24 (committed in place)
    assert q(32) == 111  # timestamp @32
    assert i(40) == -1  # serviceId @40
    assert i(44) == ENTRY_TYPE_TERM  # entryType @44
    assert data[48:64] == bytes(16)

    # SNAPSHOT at 64, invalidated: bit 31 of the type word
    assert q(64) == 9
    assert q(64 + 24) == 4096
    assert q(64 + 32) == 222
    assert i(64 + 40) == 5
    assert struct.unpack_from("<I", data, 64 + 44)[0] == 0x8000_0000 | ENTRY_TYPE_SNAPSHOT

    # STANDBY_SNAPSHOT at 128 with its endpoint @48 as i32 length + ASCII
    assert q(128) == 10
    assert i(128 + 40) == CM
    assert i(128 + 44) == ENTRY_TYPE_STANDBY_SNAPSHOT
    assert i(128 + 48) == len("host:8010")
    assert data[128 + 52 : 128 + 61] == b"host:8010"
    assert data[128 + 61 : 192] == bytes(3)


def test_long_endpoint_takes_several_alignment_units(tmp_path: Path) -> None:
    endpoint = "a" * 100  # 48 + 4 + 100 = 152 -> 192
    with RecordingLog.open(tmp_path) as log:
        log.append_standby_snapshot(1, 0, 0, 64, 5, 0, endpoint)
        log.append_term(LOG_RECORDING_ID, 0, 0, 6)
    assert log_file(tmp_path).stat().st_size == 192 + 64
    with RecordingLog.open(tmp_path) as log:
        assert [e.entry_index for e in log.entries] == [0, 1]
        assert [e.file_offset for e in log.entries] == [0, 192]
        assert log.entries[0].archive_endpoint == endpoint
        assert log.repaired is None
    with RecordingLog.open(tmp_path) as log:
        with pytest.raises(RecordingLogError, match="too long"):
            log.append_standby_snapshot(1, 0, 0, 64, 5, 0, "x" * 4045)
        with pytest.raises(RecordingLogError, match="endpoint"):
            log.append_standby_snapshot(1, 0, 0, 64, 5, 0, "")


def aeron_record(
    recording_id: int,
    term_id: int,
    base: int,
    position: int,
    timestamp: int,
    service_id: int,
    raw_type: int,
    filler: bytes = bytes(16),
) -> bytes:
    return struct.pack("<qqqqqii", recording_id, term_id, base, position, timestamp, service_id, raw_type) + filler


def test_reads_a_hand_built_aeron_file(tmp_path: Path) -> None:
    # Aeron reuses its write buffer, so bytes 48..63 of a TERM may hold stale data;
    # a removed entry (type word -1) is skipped but still takes an index.
    data = (
        aeron_record(LOG_RECORDING_ID, 0, 0, 640, 1, -1, 0, filler=b"\x09\x00\x00\x00stale-bytes!")
        + aeron_record(4, 0, 0, 320, 2, -1, -1)
        + aeron_record(5, 0, 0, 320, 3, -1, 1)
        + aeron_record(LOG_RECORDING_ID, 1, 640, -1, 4, -1, 0)
    )
    log_file(tmp_path).write_bytes(data)
    with RecordingLog.open(tmp_path) as log:
        assert log.repaired is None
        assert [e.entry_index for e in log.entries] == [0, 2, 3]
        assert log.next_entry_index == 4
        last = log.find_last_term()
        assert last is not None and last.leadership_term_id == 1 and last.log_position == NULL_POSITION
        snap = log.get_latest_snapshot(CM)
        assert snap is not None and snap.recording_id == 5
        entry = log.append_term(LOG_RECORDING_ID, 2, 1280, 5)
        assert entry.entry_index == 4 and entry.file_offset == 256
    # appending term 2 committed term 1 (record 3, at 192) in place: only logPosition changed
    assert log_file(tmp_path).read_bytes()[:256] == data[:216] + struct.pack("<q", 1280) + data[224:256]


# --------------------------------------------------------------------------- round trips and queries


def test_round_trip_across_reopen(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        assert log.entries == ()
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        snapshot_set(log, 0, 0, 1024, 2, first_id=20)
        log.append_term(LOG_RECORDING_ID, 1, 2048, 30)
        log.append_standby_snapshot(40, 1, 2048, 3072, 40, CM, "node2:8010")
        before: tuple[Entry, ...] = log.entries
    with RecordingLog.open(tmp_path, create=False) as log:
        assert log.entries == before
        assert [e.file_offset for e in log.entries] == [e.file_offset for e in before]
        assert log.get_term_entry(0).log_position == 2048  # committed by the next term's append
        assert log.get_term_entry(1).log_position == NULL_POSITION
        assert log.entries[-1].archive_endpoint == "node2:8010"


def test_open_without_create_requires_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        RecordingLog.open(tmp_path, create=False)
    assert not log_file(tmp_path).exists()


def test_term_queries(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        assert log.find_last_term() is None
        assert log.find_last_term_recording_id() == NULL_VALUE
        assert log.get_term_timestamp(0) == NULL_VALUE
        assert log.find_term_entry(0) is None
        assert log.is_unknown(0)

        log.append_term(LOG_RECORDING_ID, 0, 0, 100)
        log.append_term(LOG_RECORDING_ID, 1, 500, 200)
        log.append_term(LOG_RECORDING_ID, 3, 900, 300)  # term 2 skipped: term 1 stays open
        last = log.find_last_term()
        assert last is not None and last.leadership_term_id == 3
        assert log.find_last_term_recording_id() == LOG_RECORDING_ID
        assert log.get_term_timestamp(1) == 200
        assert log.get_term_entry(0).log_position == 500
        assert log.get_term_entry(1).log_position == NULL_POSITION
        assert log.is_unknown(2) and not log.is_unknown(3)

        log.commit_log_position(3, 1500)
        assert log.get_term_entry(3).log_position == 1500

        # term 2 arrives late: it closes term 1 and ends where term 3 begins
        log.append_term(LOG_RECORDING_ID, 2, 700, 250)
        assert log.get_term_entry(1).log_position == 700
        assert log.get_term_entry(2).log_position == 900
        assert [e.leadership_term_id for e in log.sorted_entries] == [0, 1, 2, 3]
        assert [e.leadership_term_id for e in log.entries] == [0, 1, 3, 2]

        with pytest.raises(RecordingLogError, match="duplicate TERM"):
            log.append_term(LOG_RECORDING_ID, 2, 700, 250)
        with pytest.raises(RecordingLogError, match="recordingId"):
            log.append_term(LOG_RECORDING_ID + 1, 4, 1500, 400)
        with pytest.raises(RecordingLogError, match="unknown leadershipTermId"):
            log.commit_log_position(7, 10)
        with pytest.raises(RecordingLogError, match="unknown leadershipTermId"):
            log.get_term_entry(7)
        with pytest.raises(RecordingLogError, match="out of range"):
            log.commit_log_position(3, 10)  # before the term's base
        with pytest.raises(RecordingLogError, match="out of range"):
            log.append_term(-1, 9, 0, 0)

        # an invalidated term is forgotten by the queries but stays in the file
        log.invalidate_entry(log.get_term_entry(3).entry_index, leadership_term_id=3)
        last = log.find_last_term()
        assert last is not None and last.leadership_term_id == 2
        assert log.is_unknown(3)
    with RecordingLog.open(tmp_path) as log:
        last = log.find_last_term()
        assert last is not None and last.leadership_term_id == 2
        assert len(log.entries) == 4 and not log.entries[2].is_valid


def test_snapshot_queries_and_sorted_order(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 1)
        snapshot_set(log, 0, 0, 1024, 2, first_id=10)
        log.append_term(LOG_RECORDING_ID, 1, 2048, 2)
        # a late snapshot of term 0 sorts before term 1
        log.append_snapshot(30, 0, 0, 1536, 3, CM)
        order = [(e.leadership_term_id, e.entry_type, e.log_position, e.service_id) for e in log.sorted_entries]
        assert order == [
            (0, ENTRY_TYPE_TERM, 2048, -1),
            (0, ENTRY_TYPE_SNAPSHOT, 1024, 1),
            (0, ENTRY_TYPE_SNAPSHOT, 1024, 0),
            (0, ENTRY_TYPE_SNAPSHOT, 1024, CM),
            (0, ENTRY_TYPE_SNAPSHOT, 1536, CM),
            (1, ENTRY_TYPE_TERM, NULL_POSITION, -1),
        ]
        latest_cm = log.get_latest_snapshot(CM)
        assert latest_cm is not None and latest_cm.recording_id == 30
        # the newest CM snapshot has no service snapshots: services come from the newest complete set
        service_0 = log.get_latest_snapshot(0)
        service_1 = log.get_latest_snapshot(1)
        assert service_0 is not None and service_0.recording_id == 11 and service_0.log_position == 1024
        assert service_1 is not None and service_1.recording_id == 12
        assert log.get_latest_snapshot(2) is None


def test_invalid_snapshot_is_restored_in_place_when_appended_again(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 1)
        snapshot_set(log, 0, 0, 1024, 1, first_id=10)
        assert log.invalidate_latest_snapshot() is True
        assert [e.is_valid for e in log.entries] == [True, False, False]
        assert log.get_latest_snapshot(CM) is None
        restored = log.append_snapshot(50, 0, 0, 1024, 77, CM)
        assert restored.entry_index == 2 and restored.is_valid and restored.recording_id == 50
        assert log.next_entry_index == 3
    with RecordingLog.open(tmp_path) as log:
        assert [(e.recording_id, e.is_valid) for e in log.entries] == [(3, True), (11, False), (50, True)]
        assert log.invalidate_latest_snapshot() is True
        assert log.invalidate_latest_snapshot() is False


# --------------------------------------------------------------------------- recovery plans


def test_recovery_plan_of_an_empty_log(tmp_path: Path) -> None:
    fake = FakeArchive({})
    with RecordingLog.open(tmp_path) as log:
        plan = log.create_recovery_plan(2, fake)
    assert plan.last_leadership_term_id == NULL_VALUE
    assert plan.last_term_base_log_position == 0
    assert plan.appended_log_position == 0
    assert plan.committed_log_position == 0
    assert plan.snapshots == () and plan.log is None and not plan.has_replay
    assert fake.asked == []


def test_recovery_plan_of_an_empty_log_with_a_replicated_recording(tmp_path: Path) -> None:
    fake = FakeArchive({8: RecordingExtent(0, 4096)})
    with RecordingLog.open(tmp_path) as log:
        plan = log.create_recovery_plan(1, fake, replicated_recording_id=8)
    assert plan.log is not None and plan.log.recording_id == 8 and plan.log.leadership_term_id == NULL_VALUE
    assert plan.appended_log_position == 4096 and plan.has_replay


def test_recovery_plan_with_one_open_term(tmp_path: Path) -> None:
    fake = FakeArchive({LOG_RECORDING_ID: RecordingExtent(0, 4000, initial_term_id=7, term_buffer_length=65536)})
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        plan = log.create_recovery_plan(1, fake)
    assert plan.last_leadership_term_id == 0
    assert plan.last_term_base_log_position == 0
    assert plan.appended_log_position == 4000
    assert plan.committed_log_position == 0  # the term is still open: nothing known committed
    assert plan.snapshots == ()
    assert plan.log is not None
    assert (plan.log.start_position, plan.log.stop_position, plan.log.log_position) == (0, 4000, NULL_POSITION)
    assert plan.log.initial_term_id == 7 and plan.log.term_buffer_length == 65536
    assert plan.has_replay
    assert fake.asked == [LOG_RECORDING_ID]


def test_recovery_plan_with_committed_term_and_snapshot(tmp_path: Path) -> None:
    fake = FakeArchive({LOG_RECORDING_ID: RecordingExtent(0, 6000)})
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        snapshot_set(log, 0, 0, 2048, 2, first_id=20)
        log.append_term(LOG_RECORDING_ID, 1, 4096, 30)
        log.commit_log_position(1, 6000)
        plan = log.create_recovery_plan(2, fake)
    assert [(s.service_id, s.recording_id, s.log_position) for s in plan.snapshots] == [
        (CM, 20, 2048),
        (0, 21, 2048),
        (1, 22, 2048),
    ]
    assert plan.last_leadership_term_id == 1
    assert plan.last_term_base_log_position == 4096
    assert plan.committed_log_position == 6000
    assert plan.appended_log_position == 6000
    assert plan.log is not None
    assert (plan.log.start_position, plan.log.stop_position) == (2048, 6000)
    assert plan.has_replay
    assert plan.skipped_snapshot_sets == ()


def test_recovery_plan_snapshot_only_nothing_to_replay(tmp_path: Path) -> None:
    fake = FakeArchive({LOG_RECORDING_ID: RecordingExtent(0, 2048)})
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        snapshot_set(log, 0, 0, 2048, 1, first_id=20)
        plan = log.create_recovery_plan(1, fake)
    assert plan.committed_log_position == 2048  # from the snapshot: the term is open
    assert plan.appended_log_position == 2048
    assert not plan.has_replay


def test_recovery_plan_falls_back_past_an_incomplete_snapshot_set(tmp_path: Path) -> None:
    fake = FakeArchive({LOG_RECORDING_ID: RecordingExtent(0, 9000)})
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        snapshot_set(log, 0, 0, 1024, 2, first_id=20)
        snapshot_set(log, 0, 0, 3072, 2, first_id=30)
        # newest: the CM snapshot was written but service 1's entry is missing
        log.append_snapshot(41, 0, 0, 5120, 5, 0)
        log.append_snapshot(40, 0, 0, 5120, 5, CM)
        # and a crash between service entries and the CM entry of a later set
        log.append_snapshot(52, 0, 0, 7168, 6, 1)
        plan = log.create_recovery_plan(2, fake)
    assert [(s.service_id, s.recording_id) for s in plan.snapshots] == [(CM, 30), (0, 31), (1, 32)]
    assert plan.snapshots[0].log_position == 3072
    assert plan.log is not None and plan.log.start_position == 3072
    assert len(plan.skipped_snapshot_sets) == 1 and "service(s) [1]" in plan.skipped_snapshot_sets[0]
    # with one service the newest set is complete
    with RecordingLog.open(tmp_path) as log:
        plan1 = log.create_recovery_plan(1, fake)
    assert [(s.service_id, s.recording_id) for s in plan1.snapshots] == [(CM, 40), (0, 41)]


def test_recovery_plan_skips_an_invalidated_snapshot_set(tmp_path: Path) -> None:
    fake = FakeArchive({LOG_RECORDING_ID: RecordingExtent(0, 9000)})
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        snapshot_set(log, 0, 0, 1024, 1, first_id=20)
        snapshot_set(log, 0, 0, 4096, 1, first_id=30)
        assert log.invalidate_latest_snapshot()
        assert [e.is_valid for e in log.entries] == [True, True, True, False, False]
    with RecordingLog.open(tmp_path) as log:
        plan = log.create_recovery_plan(1, fake)
        assert [(s.service_id, s.recording_id) for s in plan.snapshots] == [(CM, 20), (0, 21)]
        assert plan.log is not None and plan.log.start_position == 1024
        # invalidating a single service snapshot also makes its set unusable
        log.invalidate_entry(1)
        plan = log.create_recovery_plan(1, fake)
        assert plan.snapshots == ()
        assert plan.log is not None and plan.log.start_position == 0
        assert len(plan.skipped_snapshot_sets) == 1


def test_recovery_plan_needs_the_log_recording(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        with pytest.raises(RecordingLogError, match="unknown recording id: 3"):
            log.create_recovery_plan(0, FakeArchive({}))


def test_invalidate_latest_snapshot_needs_its_term(tmp_path: Path) -> None:
    with RecordingLog.open(tmp_path) as log:
        log.append_snapshot(5, 0, 0, 64, 1, CM)
        with pytest.raises(RecordingLogError, match="no matching term"):
            log.invalidate_latest_snapshot()
        with pytest.raises(RecordingLogError, match="unknown entry index"):
            log.invalidate_entry(9)


# --------------------------------------------------------------------------- torn tails and corruption


def three_entries(directory: Path) -> bytes:
    with RecordingLog.open(directory) as log:
        log.append_term(LOG_RECORDING_ID, 0, 0, 10)
        log.append_snapshot(20, 0, 0, 1024, 11, 0)
        log.append_snapshot(21, 0, 0, 1024, 11, CM)
    return log_file(directory).read_bytes()


def next_term_record() -> bytes:
    return aeron_record(LOG_RECORDING_ID, 1, 2048, -1, 12, -1, ENTRY_TYPE_TERM)


TORN_TAILS = {
    "half_record": lambda: next_term_record()[:32],
    "all_but_one_byte": lambda: next_term_record()[:63],
    "zero_filled_record": lambda: bytes(64),
    "zero_filled_blocks": lambda: bytes(4096),
    "garbage_bytes": lambda: b"\xde\xad\xbe\xef" * 25,
    "ff_bytes": lambda: b"\xff" * 128,
    "unknown_type": lambda: aeron_record(LOG_RECORDING_ID, 1, 2048, -1, 12, -1, 5),
    "torn_standby_snapshot": lambda: (
        aeron_record(22, 0, 0, 1024, 13, CM, ENTRY_TYPE_STANDBY_SNAPSHOT, filler=b"")
        + struct.pack("<i", 300)
        + b"host-name-that-was-cut"
    ).ljust(128, b"\x00"),
}


@pytest.mark.parametrize("shape", sorted(TORN_TAILS))
def test_torn_trailing_record_is_repaired(tmp_path: Path, shape: str) -> None:
    good = three_entries(tmp_path)
    tail = TORN_TAILS[shape]()
    log_file(tmp_path).write_bytes(good + tail)

    with RecordingLog.open(tmp_path) as log:
        assert log.repaired is not None
        assert f"dropped {len(tail)} trailing bytes at file offset {len(good)}" in log.repaired
        assert "entry index 3" in log.repaired
        assert len(log.entries) == 3
        assert log_file(tmp_path).read_bytes() == good
        log.append_term(LOG_RECORDING_ID, 1, 2048, 12)
    with RecordingLog.open(tmp_path) as log:
        assert log.repaired is None
        assert [e.entry_index for e in log.entries] == [0, 1, 2, 3]
        assert log.get_term_entry(0).log_position == 2048


def test_repair_warning_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = three_entries(tmp_path)
    log_file(tmp_path).write_bytes(good + b"\x01" * 10)
    with caplog.at_level("WARNING", logger="fulmar.consensus.recording_log"):
        with RecordingLog.open(tmp_path) as log:
            assert log.repaired is not None
    assert any("recording log repaired" in r.getMessage() for r in caplog.records)


@dataclass(frozen=True)
class Damage:
    offset: int  # inside the record at index 1
    data: bytes
    reason: str


MIDDLE_DAMAGE = [
    Damage(44, struct.pack("<i", 9), "unknown entry type"),
    Damage(0, struct.pack("<q", -5), "recordingId=-5 is negative"),
    Damage(8, struct.pack("<q", -2), "leadershipTermId=-2"),
    Damage(24, struct.pack("<q", -7), "logPosition=-7"),
    Damage(40, struct.pack("<i", -9), "serviceId=-9"),
    Damage(0, b"\xee" * 64, "unknown entry type"),
]


@pytest.mark.parametrize("damage", MIDDLE_DAMAGE, ids=lambda d: d.reason)
def test_corrupt_middle_entry_raises(tmp_path: Path, damage: Damage) -> None:
    good = bytearray(three_entries(tmp_path))
    good[64 + damage.offset : 64 + damage.offset + len(damage.data)] = damage.data
    log_file(tmp_path).write_bytes(bytes(good))
    with pytest.raises(CorruptRecordingLogError) as info:
        RecordingLog.open(tmp_path)
    assert info.value.entry_index == 1
    assert info.value.file_offset == 64
    assert damage.reason in str(info.value)
    assert "index 1" in str(info.value)
    assert log_file(tmp_path).read_bytes() == bytes(good)  # nothing truncated


def test_term_with_another_recording_id_is_corruption(tmp_path: Path) -> None:
    data = aeron_record(3, 0, 0, 64, 1, -1, 0) + aeron_record(4, 1, 64, -1, 2, -1, 0)
    log_file(tmp_path).write_bytes(data)
    with pytest.raises(CorruptRecordingLogError, match="index 1.*recordingId=4"):
        RecordingLog.open(tmp_path)


def test_decode_never_raises_low_level_errors() -> None:
    for length in range(0, 200):
        for fill in (b"\x00", b"\xff", b"\x7f", b"\x02"):
            try:
                result = decode_entries(fill * length)
            except CorruptRecordingLogError:
                continue
            assert result.end_offset <= length


# --------------------------------------------------------------------------- model-based


@dataclass
class ModelEntry:
    entry_index: int
    recording_id: int
    leadership_term_id: int
    term_base_log_position: int
    log_position: int
    timestamp: int
    service_id: int
    entry_type: int
    is_valid: bool = True

    def as_entry(self) -> Entry:
        return Entry(
            self.entry_index,
            self.recording_id,
            self.leadership_term_id,
            self.term_base_log_position,
            self.log_position,
            self.timestamp,
            self.service_id,
            self.entry_type,
            self.is_valid,
        )


class Model:
    """A plain list of records with the rules of the recording log spelled out naively."""

    def __init__(self) -> None:
        self.entries: list[ModelEntry] = []
        self.next_term_id = 0
        self.max_base = 0

    def valid_term(self, term_id: int) -> ModelEntry | None:
        found = [
            e
            for e in self.entries
            if e.entry_type == ENTRY_TYPE_TERM and e.is_valid and e.leadership_term_id == term_id
        ]
        return found[-1] if found else None

    def last_valid_term(self) -> ModelEntry | None:
        terms = [e for e in self.entries if e.entry_type == ENTRY_TYPE_TERM and e.is_valid]
        return max(terms, key=lambda e: (e.leadership_term_id, e.entry_index)) if terms else None

    def sorted(self) -> list[ModelEntry]:
        def key(e: ModelEntry) -> tuple[int, int, int, int]:
            if e.entry_type == ENTRY_TYPE_TERM:
                return (e.leadership_term_id, 0, e.entry_index, 0)
            return (e.leadership_term_id, e.entry_type, e.log_position, -e.service_id)

        return sorted(self.entries, key=key)

    def append_term(self, term_id: int, base: int, timestamp: int) -> None:
        previous = self.valid_term(term_id - 1)
        if previous is not None:
            previous.log_position = base
        self.entries.append(
            ModelEntry(
                len(self.entries), LOG_RECORDING_ID, term_id, base, NULL_POSITION, timestamp, -1, ENTRY_TYPE_TERM
            )
        )

    def append_snapshot(self, recording_id: int, term_id: int, base: int, position: int, ts: int, service: int) -> None:
        for e in reversed(self.entries):
            if (
                not e.is_valid
                and e.entry_type == ENTRY_TYPE_SNAPSHOT
                and (e.leadership_term_id, e.term_base_log_position, e.log_position, e.service_id)
                == (term_id, base, position, service)
            ):
                e.recording_id, e.timestamp, e.is_valid = recording_id, ts, True
                return
        self.entries.append(
            ModelEntry(len(self.entries), recording_id, term_id, base, position, ts, service, ENTRY_TYPE_SNAPSHOT)
        )

    def invalidate_latest_snapshot(self) -> bool | None:
        """True/False as the log returns, None when the log must raise."""
        ordered = self.sorted()
        anchors = [
            i
            for i, e in enumerate(ordered)
            if e.is_valid and e.entry_type == ENTRY_TYPE_SNAPSHOT and e.service_id == CM
        ]
        if not anchors:
            return False
        at = anchors[-1]
        anchor = ordered[at]
        if self.valid_term(anchor.leadership_term_id) is None:
            return None
        expected = CM
        while at >= 0:
            e = ordered[at]
            if not (
                e.is_valid
                and e.entry_type == ENTRY_TYPE_SNAPSHOT
                and e.service_id == expected
                and e.leadership_term_id == anchor.leadership_term_id
                and e.log_position == anchor.log_position
            ):
                break
            e.is_valid = False
            expected += 1
            at -= 1
        return True


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("term"), st.integers(1, 2), st.integers(0, 3)),
        st.tuples(st.just("commit"), st.integers(0, 4)),
        st.tuples(st.just("snapshots"), st.integers(0, 2), st.integers(0, 1), st.booleans()),
        st.tuples(st.just("invalidate"), st.integers(0, 1000)),
        st.tuples(st.just("invalidate_latest")),
        st.tuples(st.just("reopen")),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_operations_match_the_model_across_reopen(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[Any, ...]]
) -> None:
    directory = tmp_path_factory.mktemp("rlog")
    model = Model()
    fake = FakeArchive({LOG_RECORDING_ID: RecordingExtent(0, 1 << 20)})
    log = RecordingLog.open(directory)
    try:
        for step, op in enumerate(ops):
            kind = op[0]
            if kind == "term":
                term_id = model.next_term_id + op[1] - 1
                model.next_term_id = term_id + 1
                model.max_base += 64 * op[2]
                log.append_term(LOG_RECORDING_ID, term_id, model.max_base, step)
                model.append_term(term_id, model.max_base, step)
            elif kind == "commit":
                term = model.last_valid_term()
                if term is None:
                    continue
                position = term.term_base_log_position + 64 * op[1]
                log.commit_log_position(term.leadership_term_id, position)
                term.log_position = position
            elif kind == "snapshots":
                term = model.last_valid_term()
                if term is None:
                    continue
                _, services, delta, complete = op
                position = term.term_base_log_position + 64 * delta
                ids = list(range(services - 1, -1, -1)) + ([CM] if complete else [])
                for service in ids:
                    recording_id = 100 + step * 4 + service + 1
                    args = (recording_id, term.leadership_term_id, term.term_base_log_position, position, step, service)
                    log.append_snapshot(*args)
                    model.append_snapshot(*args)
            elif kind == "invalidate":
                if not model.entries:
                    continue
                target = model.entries[op[1] % len(model.entries)]
                log.invalidate_entry(target.entry_index, leadership_term_id=target.leadership_term_id)
                target.is_valid = False
            elif kind == "invalidate_latest":
                expected = model.invalidate_latest_snapshot()
                if expected is None:
                    with pytest.raises(RecordingLogError):
                        log.invalidate_latest_snapshot()
                else:
                    assert log.invalidate_latest_snapshot() is expected
            else:
                plan_before = log.create_recovery_plan(1, fake)
                log.close()
                log = RecordingLog.open(directory, create=False)
                assert log.repaired is None
                assert log.create_recovery_plan(1, fake) == plan_before

            assert list(log.entries) == [e.as_entry() for e in model.entries]
            assert [e.entry_index for e in log.sorted_entries] == [e.entry_index for e in model.sorted()]
            last = model.last_valid_term()
            found = log.find_last_term()
            assert (found.entry_index if found else None) == (last.entry_index if last else None)
    finally:
        log.close()

    with RecordingLog.open(directory, create=False) as reopened:
        assert list(reopened.entries) == [e.as_entry() for e in model.entries]
        assert reopened.next_entry_index == len(model.entries)
        assert os.path.getsize(log_file(directory)) == 64 * len(model.entries)


def test_encode_entry_refuses_out_of_range_fields() -> None:
    from fulmar.consensus.recording_log import encode_entry

    with pytest.raises(RecordingLogError, match="does not fit"):
        encode_entry(Entry(0, 1 << 63, 0, 0, 0, 0, -1, ENTRY_TYPE_TERM))
