"""archive-mark.dat: Aeron's layout, liveness refusal, reclaiming stale or dead owners, error log."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fulmar.archive.errors import ArchiveAlreadyActiveError
from fulmar.archive.mark_file import (
    HEADER_LENGTH,
    MARK_FILE_NAME,
    SEMANTIC_VERSION,
    ArchiveMarkFile,
    read_mark_file,
)
from fulmar.codecs.generated.archive_mark import MarkFileHeaderEncoder

ERRORS = 64 * 1024
NOW = 1_700_000_000_000


def create(archive_dir: Path, **overrides: Any) -> ArchiveMarkFile:
    args: dict[str, Any] = dict(
        pid=os.getpid(),
        archive_id=42,
        control_channel="aeron:udp?endpoint=localhost:8010",
        control_stream_id=10,
        local_control_channel="aeron:ipc",
        local_control_stream_id=11,
        events_channel="aeron:udp?endpoint=localhost:8030",
        events_stream_id=30,
        aeron_directory="/dev/shm/fulmar-test",
        now_ms=NOW,
        error_buffer_length=ERRORS,
    )
    args.update(overrides)
    return ArchiveMarkFile.create(archive_dir, **args)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_layout_matches_aeron(tmp_path: Path) -> None:
    mark = create(tmp_path)
    try:
        data = (tmp_path / MARK_FILE_NAME).read_bytes()
        assert len(data) == HEADER_LENGTH + ERRORS == 8192 + ERRORS
        # SBE message header: block 128, template 200, schema 100, version 2.
        assert struct.unpack_from("<HHHH", data, 0) == (128, 200, 100, 2)
        version, activity, start, pid = struct.unpack_from("<i4xqqq", data, 8)
        assert (version, activity, start, pid) == (0, NOW, NOW, os.getpid())
        header_length, error_length = struct.unpack_from("<ii", data, 8 + 44)
        assert (header_length, error_length) == (HEADER_LENGTH, ERRORS)
        assert struct.unpack_from("<q", data, 8 + 56)[0] == 42  # archiveId

        decoder = read_mark_file(tmp_path)
        assert decoder.control_channel == "aeron:udp?endpoint=localhost:8010"
        assert decoder.local_control_channel == "aeron:ipc"
        assert decoder.events_channel == "aeron:udp?endpoint=localhost:8030"
        assert decoder.aeron_directory == "/dev/shm/fulmar-test"
        assert (decoder.control_stream_id, decoder.local_control_stream_id, decoder.events_stream_id) == (10, 11, 30)

        mark.signal_ready()
        mark.update_activity_timestamp(NOW + 500)
        decoder = read_mark_file(tmp_path)
        assert decoder.version == SEMANTIC_VERSION == 0x030100
        assert decoder.activity_timestamp == NOW + 500 == mark.activity_timestamp()
        assert mark.decoder().archive_id == 42
        # An archive with the default id names itself once its driver client exists.
        mark.set_archive_id(7)
        assert struct.unpack_from("<q", (tmp_path / MARK_FILE_NAME).read_bytes(), 8 + 56)[0] == 7
        assert read_mark_file(tmp_path).aeron_directory == "/dev/shm/fulmar-test"  # the tail is untouched
        mark.force()
    finally:
        mark.close()
    assert read_mark_file(tmp_path).activity_timestamp == 0  # clean close
    assert (tmp_path / MARK_FILE_NAME).exists()


def test_a_live_archive_is_not_displaced(tmp_path: Path) -> None:
    first = create(tmp_path)
    try:
        first.signal_ready()
        with pytest.raises(ArchiveAlreadyActiveError, match=f"live pid {os.getpid()}") as info:
            create(tmp_path, now_ms=NOW + 9_999)
        assert info.value.pid == os.getpid()
        # The refused attempt left the owner's file alone.
        assert read_mark_file(tmp_path).version == SEMANTIC_VERSION
    finally:
        first.close()


def test_stale_timestamp_is_reclaimed(tmp_path: Path) -> None:
    first = create(tmp_path)
    # Simulate a crash: the mapping goes away without the clean-close marker.
    first._mapped.close()
    second = create(tmp_path, now_ms=NOW + 10_000, archive_id=43)
    try:
        assert read_mark_file(tmp_path).archive_id == 43
    finally:
        second.close()


@pytest.mark.system
@pytest.mark.system
def test_dead_pid_is_reclaimed_even_with_a_fresh_timestamp(tmp_path: Path) -> None:
    first = create(tmp_path, pid=dead_pid())
    first._mapped.close()
    create(tmp_path, now_ms=NOW + 1).close()


def test_clean_close_allows_an_immediate_restart(tmp_path: Path) -> None:
    create(tmp_path).close()
    create(tmp_path, now_ms=NOW + 1).close()


def test_legacy_layout_without_message_header_is_understood(tmp_path: Path) -> None:
    # An Aeron < 1.47 mark file: the body at offset 0, fresh and owned by a live pid.
    buffer = bytearray(HEADER_LENGTH + ERRORS)
    MarkFileHeaderEncoder.encode_headerless(
        buffer,
        0,
        version=SEMANTIC_VERSION,
        codec_schema_version=0,
        codec_block_length=0,
        activity_timestamp=NOW,
        start_timestamp=NOW,
        pid=os.getpid(),
        control_stream_id=10,
        local_control_stream_id=11,
        events_stream_id=30,
        header_length=HEADER_LENGTH,
        error_buffer_length=ERRORS,
        control_channel="c",
        aeron_directory="/dev/shm/x",
    )
    (tmp_path / MARK_FILE_NAME).write_bytes(bytes(buffer))
    assert read_mark_file(tmp_path).aeron_directory == "/dev/shm/x"
    with pytest.raises(ArchiveAlreadyActiveError):
        create(tmp_path, now_ms=NOW + 5)
    create(tmp_path, now_ms=NOW + 10_000).close()


def test_error_log_lives_in_the_file_and_survives_a_restart(tmp_path: Path) -> None:
    clock = iter(range(NOW, NOW + 100)).__next__
    first = create(tmp_path)
    log = first.error_log(clock)
    assert log.record("segment write failed: no space left on device")
    assert log.record("segment write failed: no space left on device")
    assert log.record("catalog corrupt")
    first.close()

    second = create(tmp_path, now_ms=NOW + 1)
    try:
        previous = {e.text: e.observation_count for e in second.previous_errors}
        assert previous == {"segment write failed: no space left on device": 2, "catalog corrupt": 1}
        assert second.error_buffer.get_int32(0) == 0  # a fresh log
        assert second.error_buffer.capacity == ERRORS
    finally:
        second.close()


def test_channels_too_long_for_the_header_are_refused(tmp_path: Path) -> None:
    from fulmar.archive.errors import ArchiveError

    with pytest.raises(ArchiveError, match="do not fit"):
        create(tmp_path, control_channel="aeron:udp?endpoint=" + "x" * HEADER_LENGTH)


def test_a_garbage_pid_in_a_fresh_looking_file_is_nobody(tmp_path: Path) -> None:
    """A torn mark file can decode to a pid beyond what the OS takes (psutil
    raises OverflowError for it): the archive must still start."""
    import time

    from fulmar.archive.mark_file import ArchiveMarkFile

    now_ms = int(time.time() * 1000)
    options: dict[str, Any] = dict(
        archive_id=1,
        control_channel="",
        control_stream_id=10,
        local_control_channel="aeron:ipc",
        local_control_stream_id=10,
        events_channel="",
        events_stream_id=30,
        aeron_directory="",
    )
    first = ArchiveMarkFile.create(tmp_path, pid=os.getpid(), now_ms=now_ms, **options)
    try:
        first.update_activity_timestamp(now_ms)
        path = tmp_path / "archive-mark.dat"
        data = bytearray(path.read_bytes()[:64])
        body = 8 if struct.unpack_from("<H", data, 2)[0] == 200 else 0  # Aeron 1.47 puts a message header first
        assert struct.unpack_from("<q", data, body + 24)[0] == os.getpid()  # the pid field
        with open(path, "r+b") as file:
            file.seek(body + 24)
            file.write(struct.pack("<q", 1200567528039895737))
        second = ArchiveMarkFile.create(tmp_path, pid=os.getpid(), now_ms=now_ms, **options)
        second.close()
    finally:
        first.close()
