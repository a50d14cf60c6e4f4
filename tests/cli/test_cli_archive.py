"""``cluster-tool archive``: describe, recordings, verify and errors on an archive directory.

Offline cases build catalogs and mark files directly with the archive's own
classes; the live case runs a real ``cluster-node archive`` on a real media
driver, with one stopped and one active recording, then kills it and reads
its leftover files.  Every command must leave the files exactly as it found
them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fulmar.archive.catalog import CATALOG_FILE_NAME, Catalog
from fulmar.archive.client import NULL_VALUE, AeronArchive, SourceLocation
from fulmar.archive.mark_file import MARK_FILE_NAME, ArchiveMarkFile
from fulmar.archive.segment import list_segment_files, segment_file_name
from fulmar.cli import archive_tool, cluster_tool
from support.archive import ArchiveProcess
from support.driver import DriverProcess, new_driver_dir, remove_driver_dir, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

KB = 1024
TERM_LENGTH = 64 * KB
SEGMENT_LENGTH = 128 * KB
CHANNEL = f"aeron:ipc?term-length={TERM_LENGTH // KB}k"


def tool(*args: str) -> Result:
    return CliRunner().invoke(cluster_tool.main, ["archive", *args])


def tool_json(*args: str) -> tuple[int, Any]:
    result = tool(*args, "--json")
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(result.stdout)


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file's SHA-256 and mtime (ns): what a read-only tool must not change."""
    return {
        path.name: (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
        for path in sorted(directory.iterdir())
    }


def one_line_error(result: Result, *fragments: str, code: int = 4) -> None:
    """Exit ``code`` (4: unreadable files) with a single ``cluster-tool: ...`` line on stderr naming the problem."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cluster-tool: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# ---------------------------------------------------------------------- offline archives


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def build_archive(directory: Path, *, segments_of_stopped: int = 3) -> tuple[int, int]:
    """A catalog with a stopped recording (whole segment files) and an unstopped one.

    Returns their ids.
    """
    directory.mkdir(parents=True, exist_ok=True)
    started = now_ms() - 60_000
    with Catalog.open(directory) as catalog:
        stopped = catalog.add_recording(
            0, started, 7, SEGMENT_LENGTH, TERM_LENGTH, 1408, 11, 1001, "aeron:ipc", CHANNEL, "aeron:ipc"
        )
        catalog.update_stop(stopped, (segments_of_stopped - 1) * SEGMENT_LENGTH + 4 * KB, started + 5_000)
        unstopped = catalog.add_recording(
            0, started + 10_000, 9, SEGMENT_LENGTH, TERM_LENGTH, 1408, 12, 1002, "aeron:ipc", CHANNEL, "aeron:ipc"
        )
    for segment in range(segments_of_stopped):
        with open(directory / segment_file_name(stopped, segment * SEGMENT_LENGTH), "wb") as file:
            file.truncate(SEGMENT_LENGTH)
    with open(directory / segment_file_name(unstopped, 0), "wb") as file:
        file.truncate(SEGMENT_LENGTH)
    return stopped, unstopped


def create_mark_file(directory: Path, pid: int, errors: tuple[str, ...] = ()) -> ArchiveMarkFile:
    mark = ArchiveMarkFile.create(
        directory,
        pid=pid,
        archive_id=42,
        control_channel="aeron:udp?endpoint=127.0.0.1:8010",
        control_stream_id=10,
        local_control_channel="aeron:ipc",
        local_control_stream_id=10,
        events_channel="",
        events_stream_id=30,
        aeron_directory="/dev/shm/fulmar-test",
        now_ms=now_ms(),
        error_buffer_length=64 * KB,
    )
    mark.signal_ready()
    log = mark.error_log(now_ms)
    for text in errors:
        log.record(text)
    return mark


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(10)
    return process.pid


@pytest.fixture
def stopped_archive(tmp_path: Path) -> Iterator[tuple[Path, int, int]]:
    """The files of an archive that closed cleanly, leaving an unstopped recording and errors."""
    directory = tmp_path / "archive"
    stopped, unstopped = build_archive(directory)
    create_mark_file(directory, dead_pid(), ("disk full\n  at segment 3", "disk full\n  at segment 3", "other")).close()
    yield directory, stopped, unstopped


def test_describe_a_stopped_archive(stopped_archive: tuple[Path, int, int]) -> None:
    directory, _, _ = stopped_archive
    before = snapshot(directory)
    result = tool("describe", "--archive-dir", str(directory))
    assert result.exit_code == 3, result.output
    assert result.stdout.splitlines()[0] == f"archive in {directory}: not running (closed cleanly)"
    assert "archive id     42" in result.stdout
    assert "activity       0 (closed cleanly)" in result.stdout
    assert "control        aeron:udp?endpoint=127.0.0.1:8010 stream 10" in result.stdout
    assert "error log      2 distinct errors" in result.stdout
    assert "next recording id 2, 2 entries" in result.stdout
    assert "2 valid (1 stopped, 1 open), 0 invalid, 0 deleted" in result.stdout
    assert f"4 files, {4 * SEGMENT_LENGTH} bytes" in result.stdout

    code, document = tool_json("describe", "--archive-dir", str(directory))
    assert code == 3
    assert document["running"] is False
    assert document["mark_file"]["archive_id"] == 42
    assert document["mark_file"]["activity_timestamp_ms"] == 0
    assert document["mark_file"]["error_count"] == 2
    assert document["catalog"]["version"] == "3.1.0"
    assert document["catalog"]["alignment"] == 64
    assert document["catalog"]["next_recording_id"] == 2
    assert document["counts"]["open"] == 1 and document["counts"]["active"] == 0
    assert snapshot(directory) == before


def test_recordings_of_a_stopped_archive(stopped_archive: tuple[Path, int, int]) -> None:
    directory, stopped, unstopped = stopped_archive
    before = snapshot(directory)
    result = tool("recordings", "--archive-dir", str(directory))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"2 recordings in {directory} (archive not running)"
    assert lines[1].split() == [
        "id",
        "state",
        "start",
        "stop",
        "started",
        "stopped",
        "stream",
        "session",
        "segments",
        "bytes",
        "channel",
    ]
    first, second = lines[2].split(), lines[3].split()
    assert first[:4] == [str(stopped), "valid", "0", str(2 * SEGMENT_LENGTH + 4 * KB)]
    assert first[-5:] == ["1001", "11", "3", str(3 * SEGMENT_LENGTH), CHANNEL]
    assert "open (archive not running)" in lines[3]
    assert second[-5:] == ["1002", "12", "1", str(SEGMENT_LENGTH), CHANNEL]

    code, document = tool_json("recordings", "--archive-dir", str(directory))
    assert code == 0 and document["archive_running"] is False
    by_id = {r["recording_id"]: r for r in document["recordings"]}
    assert by_id[stopped]["stop_position"] == 2 * SEGMENT_LENGTH + 4 * KB
    assert by_id[stopped]["stop_time"] is not None and by_id[stopped]["segment_files"] == 3
    assert by_id[unstopped]["stop_position"] is None and by_id[unstopped]["stop"] == "open (archive not running)"
    assert by_id[unstopped]["stop_time"] is None
    assert by_id[unstopped]["session_id"] == 12 and by_id[unstopped]["stream_id"] == 1002

    code, document = tool_json("recordings", "--archive-dir", str(directory), "--id", str(unstopped))
    assert code == 0 and [r["recording_id"] for r in document["recordings"]] == [unstopped]
    one_line_error(tool("recordings", "--archive-dir", str(directory), "--id", "77"), "no recording 77", code=1)
    assert snapshot(directory) == before


def test_purged_recordings_show_with_all(tmp_path: Path) -> None:
    directory = tmp_path / "archive"
    stopped, unstopped = build_archive(directory)
    with Catalog.open(directory) as catalog:
        catalog.invalidate(stopped)
    code, document = tool_json("recordings", "--archive-dir", str(directory))
    assert [r["recording_id"] for r in document["recordings"]] == [unstopped]
    code, document = tool_json("recordings", "--archive-dir", str(directory), "--all")
    assert [(r["recording_id"], r["state"], r["stop"]) for r in document["recordings"]] == [
        (stopped, "invalid", "-"),
        (unstopped, "valid", "open (archive not running)"),
    ]
    code, document = tool_json("recordings", "--archive-dir", str(directory), "--id", str(stopped))
    assert code == 0 and document["recordings"][0]["state"] == "invalid"
    # No mark file at all: nothing can be running there.
    result = tool("describe", "--archive-dir", str(directory))
    assert result.exit_code == 3 and "not running (no mark file)" in result.stdout
    assert "1 valid (0 stopped, 1 open), 1 invalid, 0 deleted" in result.stdout
    assert "(3 of no valid recording)" in result.stdout
    result = tool("verify", "--archive-dir", str(directory))
    assert result.exit_code == 0 and "3 segment files of no valid recording" in result.stdout


def test_verify_reports_a_deleted_segment_file(stopped_archive: tuple[Path, int, int]) -> None:
    directory, stopped, _ = stopped_archive
    result = tool("verify", "--archive-dir", str(directory))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == f"verified 2 recordings in {directory}: ok"
    assert "recording 1 is open (archive not running)" in result.stdout

    missing = directory / segment_file_name(stopped, SEGMENT_LENGTH)
    missing.unlink()
    before = snapshot(directory)
    result = tool("verify", "--archive-dir", str(directory))
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[:2] == [
        f"verified 2 recordings in {directory}: 1 problem",
        f"  recording {stopped}: missing segment file {missing}",
    ]
    code, document = tool_json("verify", "--archive-dir", str(directory))
    assert code == 1 and document["ok"] is False
    assert document["problems"] == [{"recording_id": stopped, "problem": "missing segment file", "path": str(missing)}]
    assert snapshot(directory) == before


def test_errors_of_a_stopped_archive(stopped_archive: tuple[Path, int, int]) -> None:
    directory, _, _ = stopped_archive
    result = tool("errors", "--archive-dir", str(directory))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"2 distinct errors in {directory} (archive pid ")
    assert lines[1].startswith("2 observations from ") and lines[2:4] == ["    disk full", "      at segment 3"]
    assert lines[4].startswith("1 observation from ") and lines[5] == "    other"
    code, document = tool_json("errors", "--archive-dir", str(directory))
    assert code == 0
    assert [(e["observation_count"], e["text"]) for e in document["errors"]] == [
        (2, "disk full\n  at segment 3"),
        (1, "other"),
    ]


def test_a_live_owner_in_the_mark_file(tmp_path: Path) -> None:
    """A fresh activity timestamp and a live pid (this process): the archive counts as running."""
    directory = tmp_path / "archive"
    _, unstopped = build_archive(directory)
    mark = create_mark_file(directory, os.getpid())
    try:
        code, document = tool_json("describe", "--archive-dir", str(directory))
        assert code == 0 and document["running"] is True
        assert document["mark_file"]["state"] == "running" and document["mark_file"]["pid"] == os.getpid()
        assert 0 <= document["mark_file"]["activity_age_ms"] < 10_000
        assert document["counts"]["active"] == 1 and document["counts"]["open"] == 0
        code, document = tool_json("recordings", "--archive-dir", str(directory), "--id", str(unstopped))
        assert document["archive_running"] is True and document["recordings"][0]["stop"] == "active"
        result = tool("verify", "--archive-dir", str(directory))
        assert result.exit_code == 0
        assert f"note: a live archive (pid {os.getpid()}) owns the directory" in result.stdout
        assert f"recording {unstopped} is active" in result.stdout
        assert tool("errors", "--archive-dir", str(directory)).stdout.strip() == f"no errors in {directory}"
    finally:
        mark.close()


def test_a_crashed_owner_is_not_running(tmp_path: Path) -> None:
    """A fresh timestamp but a gone pid (SIGKILL: no clean close): not running, recordings open."""
    directory = tmp_path / "archive"
    _, unstopped = build_archive(directory)
    pid = dead_pid()
    mark = create_mark_file(directory, pid)
    mark._mapped.close()  # unmapped without the clean close's activity 0, as after a SIGKILL
    code, document = tool_json("describe", "--archive-dir", str(directory))
    assert code == 3 and document["mark_file"]["state"] == f"not running (pid {pid} is gone)"
    code, document = tool_json("recordings", "--archive-dir", str(directory), "--id", str(unstopped))
    assert document["recordings"][0]["stop"] == "open (archive not running)"


# ---------------------------------------------------------------------- broken files


def test_corrupt_catalog_is_one_line_and_exit_4(stopped_archive: tuple[Path, int, int]) -> None:
    directory, _, _ = stopped_archive
    catalog = directory / CATALOG_FILE_NAME
    data = bytearray(catalog.read_bytes())
    data[0:4] = (99 << 16).to_bytes(4, "little")  # major version 99
    catalog.write_bytes(bytes(data))
    before = snapshot(directory)
    for command in ("describe", "recordings", "verify"):
        for extra in ((), ("--json",)):
            one_line_error(
                tool(command, "--archive-dir", str(directory), *extra),
                str(catalog),
                "corrupt catalog at offset 0",
                "incompatible catalog version 99.0.0",
            )
    assert snapshot(directory) == before

    # An entry whose length runs past the end of the file.
    fresh = directory.parent / "truncated"
    build_archive(fresh)
    path = fresh / CATALOG_FILE_NAME
    data = bytearray(path.read_bytes())
    data[32:36] = (len(data) * 2 - 32).to_bytes(4, "little")  # aligned, but past the end
    path.write_bytes(bytes(data))
    one_line_error(tool("recordings", "--archive-dir", str(fresh)), "corrupt catalog at offset 32", "truncated entry")

    path.write_bytes(b"")
    one_line_error(tool("describe", "--archive-dir", str(fresh)), "the catalog is empty")
    assert path.read_bytes() == b""
    path.write_bytes(b"\x00" * 10)
    one_line_error(tool("verify", "--archive-dir", str(fresh)), "shorter than the 32-byte header")
    assert path.read_bytes() == b"\x00" * 10


def test_missing_files_are_one_line_and_exit_4(tmp_path: Path) -> None:
    one_line_error(tool("describe", "--archive-dir", str(tmp_path / "nowhere")), "no such directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in ("describe", "recordings", "verify"):
        one_line_error(tool(command, "--archive-dir", str(empty)), "no catalog")
    one_line_error(tool("errors", "--archive-dir", str(empty)), "no mark file")
    assert list(empty.iterdir()) == []  # nothing was created


def test_a_mark_file_recreated_between_its_header_and_its_errors_is_a_clear_error(tmp_path: Path) -> None:
    """An archive starting now recreates its mark file (truncated, then
    zero-filled): a tool that read the header before that and the error log
    after gets a one-line error (mapping the empty file raised ValueError)."""
    create_mark_file(tmp_path, dead_pid(), ("one",)).close()
    decoder, _ = archive_tool.mark_file_decoder(tmp_path)
    assert [e["text"] for e in archive_tool.read_archive_errors(tmp_path, decoder)] == ["one"]
    os.truncate(tmp_path / MARK_FILE_NAME, 0)
    with pytest.raises(archive_tool.ArchiveReadError, match="the error buffer runs past the end of the file"):
        archive_tool.read_archive_errors(tmp_path, decoder)


def test_corrupt_mark_file_is_one_line_and_exit_4(stopped_archive: tuple[Path, int, int]) -> None:
    directory, _, _ = stopped_archive
    mark = directory / MARK_FILE_NAME
    mark.write_bytes(bytes(range(100)))  # shorter than the header's block
    for command in ("describe", "errors"):
        one_line_error(tool(command, "--archive-dir", str(directory)), str(mark), "does not decode")
    # The recordings are still readable; the archive is taken as not running.
    result = tool("recordings", "--archive-dir", str(directory))
    assert result.exit_code == 0
    assert "warning" in result.stderr and "open (archive not running)" in result.stdout

    # A header that decodes but claims an error buffer longer than the file.
    mark.unlink()  # (ArchiveMarkFile.create would read the garbage's "pid")
    create_mark_file(directory, dead_pid()).close()
    data = bytearray(mark.read_bytes())
    os.truncate(mark, len(data) // 2)
    one_line_error(tool("errors", "--archive-dir", str(directory)), "do not fit")

    # A corrupt error log: a record length no writer produces.
    create_mark_file(directory, dead_pid(), ("one",)).close()
    data = bytearray(mark.read_bytes())
    data[8 * KB : 8 * KB + 4] = (1 << 30).to_bytes(4, "little")
    mark.write_bytes(bytes(data))
    one_line_error(tool("errors", "--archive-dir", str(directory)), "the error log is corrupt")
    result = tool("describe", "--archive-dir", str(directory))
    assert result.exit_code == 3 and "error log      corrupt" in result.stdout

    # A pid no process can have (garbage where the pid goes): just not running.
    data = bytearray(mark.read_bytes())
    data[8 + 24 : 8 + 32] = (2**62 + 12345).to_bytes(8, "little")  # message header + pid offset
    data[8 + 8 : 8 + 16] = now_ms().to_bytes(8, "little")  # a fresh activity timestamp
    mark.write_bytes(bytes(data))
    code, document = tool_json("describe", "--archive-dir", str(directory))
    assert code == 3 and document["mark_file"]["state"] == f"not running (pid {2**62 + 12345} is gone)"


def test_help_documents_the_exit_codes() -> None:
    result = tool("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "Exit codes (as for every cluster-tool command): 0 ok; 1 an unknown --id" in text
    assert "3 (describe, which says who owns the directory)" in text and "4 no usable archive files" in text
    for command in ("describe", "recordings", "verify", "errors"):
        assert command in result.stdout
        assert tool(command, "--help").exit_code == 0
    assert tool("recordings").exit_code == 2  # --archive-dir is required


# ---------------------------------------------------------------------- a live archive


class Live:
    """A media driver and an archive process on it, and a client; torn down in order."""

    def __init__(self, tmp_path: Path) -> None:
        self.archive_dir = tmp_path / "archive"
        self.driver_dir = new_driver_dir()
        self.driver: DriverProcess | None = None
        self.archives: list[ArchiveProcess] = []
        self.closeables: list[Any] = []

    def start_archive(self) -> ArchiveProcess:
        archive = ArchiveProcess(self.archive_dir, self.driver_dir, "--segment-length", f"{SEGMENT_LENGTH // KB}k")
        self.archives.append(archive)
        return archive

    def close(self) -> None:
        for closeable in reversed(self.closeables):
            try:
                closeable.close()
            except Exception:  # noqa: BLE001 - the archive or driver may be gone already
                pass
        for archive in self.archives:
            archive.stop()
        if self.driver is not None:
            self.driver.stop()
        remove_driver_dir(self.driver_dir)
        shutil.rmtree(self.archive_dir, ignore_errors=True)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    running = Live(tmp_path)
    try:
        yield running
    finally:
        running.close()


def record(client: AeronArchive, publication: Any, stream_id: int, total: int) -> tuple[int, int]:
    """Publish ``total`` bytes of 1 KiB messages; returns the recording id and the position reached."""
    recording_id = NULL_VALUE

    def found() -> bool:
        nonlocal recording_id
        recording_id = client.find_last_matching_recording(0, "", stream_id, publication.session_id)
        return recording_id != NULL_VALUE

    wait_for(lambda: publication.is_connected, 10, "the recording to connect")
    wait_for(found, 10, f"the recording of stream {stream_id}")
    payload = bytes(range(256)) * 4
    deadline = time.monotonic() + 30
    while publication.position < total:
        if publication.offer(payload) < 0:
            assert time.monotonic() < deadline, "publication stalled"
            time.sleep(0.001)
    position = publication.position
    wait_for(lambda: client.get_recording_position(recording_id) >= position, 30, "the recording to catch up")
    return recording_id, position


def test_live_archive_then_killed_then_restarted(live: Live) -> None:
    live.driver = DriverProcess(live.driver_dir)
    archive = live.start_archive()
    aeron = live.driver.connect()
    live.closeables.append(aeron)
    client = AeronArchive.connect(aeron)
    live.closeables.append(client)
    directory = str(live.archive_dir)

    channel_a, channel_b = f"{CHANNEL}|alias=a", f"{CHANNEL}|alias=b"
    client.start_recording(channel_a, 1001, SourceLocation.LOCAL)
    publication_a = aeron.add_exclusive_publication(channel_a, 1001)
    live.closeables.append(publication_a)
    stopped, stop = record(client, publication_a, 1001, 2 * SEGMENT_LENGTH + 8 * KB)
    client.stop_recording(channel_a, 1001)
    wait_for(lambda: client.get_stop_position(stopped) == stop, 10, "recording a to stop")
    client.start_recording(channel_b, 1002, SourceLocation.LOCAL)
    publication_b = aeron.add_exclusive_publication(channel_b, 1002)
    live.closeables.append(publication_b)
    active, active_position = record(client, publication_b, 1002, 20 * KB)

    # The archive runs: describe exits 0, recording b is active.
    code, document = tool_json("describe", "--archive-dir", directory)
    assert code == 0, document
    assert document["running"] is True and document["mark_file"]["pid"] == archive.process.pid
    assert document["mark_file"]["state"] == "running"
    assert document["mark_file"]["aeron_directory"] == str(live.driver_dir)
    assert document["counts"] | {"segment_bytes": 0} == {
        "valid": 2,
        "invalid": 0,
        "deleted": 0,
        "stopped": 1,
        "active": 1,
        "open": 0,
        "segment_files": 4,
        "segment_bytes": 0,
        "orphan_segment_files": 0,
    }
    result = tool("describe", "--archive-dir", directory)
    assert result.stdout.splitlines()[0] == f"archive in {directory}: running"
    assert f"pid            {archive.process.pid} (running)" in result.stdout

    code, document = tool_json("recordings", "--archive-dir", directory)
    by_id = {r["recording_id"]: r for r in document["recordings"]}
    assert by_id[stopped]["stop_position"] == stop and by_id[stopped]["segment_files"] == 3
    assert by_id[stopped]["channel"] == channel_a and by_id[stopped]["stream_id"] == 1001
    assert by_id[stopped]["session_id"] == publication_a.session_id
    assert by_id[active]["stop"] == "active" and by_id[active]["stop_position"] is None
    assert by_id[active]["session_id"] == publication_b.session_id
    result = tool("recordings", "--archive-dir", directory)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == f"2 recordings in {directory} (archive running)"
    assert " active " in result.stdout.splitlines()[3]

    result = tool("verify", "--archive-dir", directory)
    assert result.exit_code == 0, result.output
    assert f"note: a live archive (pid {archive.process.pid}) owns the directory" in result.stdout
    result = tool("errors", "--archive-dir", directory)
    assert result.exit_code == 0 and result.stdout.strip() == f"no errors in {directory}"

    # SIGKILL: the mark file still holds a fresh timestamp, the recording stays unstopped.
    archive.kill()
    before = snapshot(live.archive_dir)
    code, document = tool_json("describe", "--archive-dir", directory)
    assert code == 3 and document["running"] is False
    assert document["mark_file"]["state"] == f"not running (pid {archive.process.pid} is gone)"
    code, document = tool_json("recordings", "--archive-dir", directory, "--id", str(active))
    assert code == 0 and document["recordings"][0]["stop"] == "open (archive not running)"
    assert document["recordings"][0]["recorded_position"] == active_position
    result = tool("verify", "--archive-dir", directory)
    assert result.exit_code == 0 and f"recording {active} is open (archive not running)" in result.stdout
    assert tool("errors", "--archive-dir", directory).exit_code == 0
    assert snapshot(live.archive_dir) == before  # nothing was written

    # The files are as the archive left them: a new archive recovers the open recording.
    for closeable in (client, publication_a, publication_b):
        live.closeables.remove(closeable)
    publication_a.close()
    publication_b.close()
    restarted = live.start_archive()
    assert f"recovered recordings [{active}]" in restarted.banner
    assert restarted.stop() == 0
    code, document = tool_json("recordings", "--archive-dir", directory, "--id", str(active))
    assert document["recordings"][0]["stop_position"] == active_position
    result = tool("describe", "--archive-dir", directory)
    assert result.exit_code == 3
    assert result.stdout.splitlines()[0] == f"archive in {directory}: not running (closed cleanly)"

    # A segment file of the stopped recording goes missing.
    segments = list_segment_files(live.archive_dir, stopped)
    assert len(segments) == 3
    (live.archive_dir / segments[1]).unlink()
    code, document = tool_json("verify", "--archive-dir", directory)
    assert code == 1
    assert document["problems"] == [
        {"recording_id": stopped, "problem": "missing segment file", "path": str(live.archive_dir / segments[1])}
    ]
