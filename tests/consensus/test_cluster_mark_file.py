"""cluster-mark.dat and cluster-mark-service-<id>.dat: Aeron's layout, liveness refusal, reclaiming, error log."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster_mark
from fulmar.codecs.generated.cluster_mark import ClusterComponentType, MarkFileHeaderDecoder, MarkFileHeaderEncoder
from fulmar.consensus import mark_file
from fulmar.consensus.mark_file import (
    ERROR_BUFFER_MIN_LENGTH,
    FILENAME,
    HEADER_LENGTH,
    NULL_VALUE,
    SEMANTIC_VERSION,
    VERSION_FAILED,
    ClusterMarkFile,
    ClusterMarkFileActiveError,
    ClusterMarkFileError,
    CorruptClusterMarkFileError,
    mark_file_name,
    read_cluster_mark_file,
    read_liveness,
    service_mark_file_name,
)
from fulmar.service.container import _consensus_module_alive as container_module_alive

NOW = 1_700_000_000_000
ERRORS = ERROR_BUFFER_MIN_LENGTH
FILE_LENGTH = HEADER_LENGTH + ERRORS
CM = ClusterComponentType.CONSENSUS_MODULE
CONTAINER = ClusterComponentType.CONTAINER


def create(cluster_dir: Path, component_type: ClusterComponentType = CM, **overrides: Any) -> ClusterMarkFile:
    args: dict[str, Any] = dict(
        pid=os.getpid(),
        member_id=2,
        cluster_id=7,
        archive_stream_id=10,
        service_stream_id=104,
        consensus_module_stream_id=105,
        ingress_stream_id=101,
        aeron_directory="/dev/shm/fulmar-test-node2",
        control_channel="aeron:ipc?term-length=128k",
        ingress_channel="aeron:udp?endpoint=localhost:9002",
        authenticator="fulmar.auth.Null",
        services_cluster_dir="/var/fulmar/node2",
        now_ms=NOW,
    )
    args.update(overrides)
    return ClusterMarkFile.create(cluster_dir, component_type, **args)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def crash(mark: ClusterMarkFile) -> None:
    """The owner dies: the mapping goes away without the clean-close marker."""
    mark._mapped.close()


# ------------------------------------------------------------------------ layout


def test_schema_facts() -> None:
    assert (cluster_mark.SCHEMA_ID, cluster_mark.SCHEMA_VERSION, cluster_mark.SEMANTIC_VERSION) == (110, 2, "5.4")
    assert (MarkFileHeaderDecoder.TEMPLATE_ID, MarkFileHeaderDecoder.BLOCK_LENGTH) == (200, 128)
    assert {t.name: int(t) for t in ClusterComponentType if t.name != "NULL_VAL"} == {
        "UNKNOWN": 0,
        "CONSENSUS_MODULE": 1,
        "CONTAINER": 2,
        "BACKUP": 3,
        "STANDBY": 4,
    }
    assert SEMANTIC_VERSION == 0x000300  # 0.3.0
    assert (HEADER_LENGTH, ERROR_BUFFER_MIN_LENGTH) == (8192, 1024 * 1024)


def test_layout_matches_aeron(tmp_path: Path) -> None:
    mark = create(tmp_path)
    try:
        data = (tmp_path / FILENAME).read_bytes()
        assert len(data) == FILE_LENGTH
        # Message header: block 128, template 200, schema 110, version 2; the body follows at 8.
        assert struct.unpack_from("<HHHH", data, 0) == (128, 200, 110, 2)
        body = 8
        version, component, activity, start, pid, candidate = struct.unpack_from("<iiqqqq", data, body)
        assert (version, component, activity, start, pid, candidate) == (0, 1, NOW, NOW, os.getpid(), NULL_VALUE)
        ints = struct.unpack_from("<9i", data, body + 40)
        # archiveStreamId, serviceStreamId, consensusModuleStreamId, ingressStreamId, memberId, serviceId,
        # headerLength, errorBufferLength, clusterId
        assert ints == (10, 104, 105, 101, 2, -1, HEADER_LENGTH, ERRORS, 7)
        assert data[body + 76 : body + 128] == bytes(52)  # the rest of the 128-byte block is padding
        # The var-ASCII strings follow the block, each a u32 length and its text.
        pos = body + 128
        strings = []
        for _ in range(6):
            (length,) = struct.unpack_from("<I", data, pos)
            strings.append(data[pos + 4 : pos + 4 + length].decode("ascii"))
            pos += 4 + length
        assert strings == [
            "/dev/shm/fulmar-test-node2",
            "aeron:ipc?term-length=128k",
            "aeron:udp?endpoint=localhost:9002",
            "",
            "fulmar.auth.Null",
            "/var/fulmar/node2",
        ]

        # The generated decoder agrees with the hand-computed offsets.
        decoder = MarkFileHeaderDecoder().wrap_and_apply_header(data, 0, HEADER_LENGTH)
        assert decoder.component_type is CM
        assert (decoder.member_id, decoder.service_id, decoder.cluster_id) == (2, -1, 7)
        assert decoder.header_length == HEADER_LENGTH and decoder.error_buffer_length == ERRORS
        assert decoder.services_cluster_dir == "/var/fulmar/node2"

        mark.signal_ready()
        mark.update_activity_timestamp(NOW + 500)
        contents = read_cluster_mark_file(tmp_path / FILENAME)
        assert contents.header.version == SEMANTIC_VERSION and contents.is_ready
        assert contents.header.activity_timestamp == NOW + 500 == mark.activity_timestamp()
        assert contents.has_message_header and contents.errors == []
        assert contents.component_type is CM
        assert contents.is_active(NOW + 1000)
        assert not contents.is_active(NOW + 500 + 10_000)
        assert mark.decoder().ingress_channel == "aeron:udp?endpoint=localhost:9002"
        assert (mark.member_id, mark.cluster_id) == (2, 7)
        mark.force()
    finally:
        mark.close()
    assert read_cluster_mark_file(tmp_path).header.activity_timestamp == 0  # clean close; a directory works too
    assert (tmp_path / FILENAME).exists()
    mark.update_activity_timestamp(NOW)  # harmless after close
    assert mark.activity_timestamp() == NULL_VALUE and mark.candidate_term_id == NULL_VALUE


def test_service_mark_file_naming_and_fields(tmp_path: Path) -> None:
    assert service_mark_file_name(0) == "cluster-mark-service-0.dat"
    assert mark_file_name(CONTAINER, 3) == "cluster-mark-service-3.dat"
    for component in (CM, ClusterComponentType.BACKUP, ClusterComponentType.STANDBY):
        assert mark_file_name(component) == "cluster-mark.dat"
    with pytest.raises(ValueError, match="needs a service id"):
        mark_file_name(CONTAINER)
    with pytest.raises(ValueError, match="only a clustered service"):
        mark_file_name(CM, 0)
    with pytest.raises(ValueError):
        mark_file_name(ClusterComponentType.UNKNOWN)

    cm = create(tmp_path)
    services = [
        create(tmp_path, CONTAINER, service_id=i, service_name=f"svc-{i}", ingress_stream_id=NULL_VALUE)
        for i in range(2)
    ]
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "cluster-mark-service-0.dat",
            "cluster-mark-service-1.dat",
            "cluster-mark.dat",
        ]
        for i, service in enumerate(services):
            contents = read_cluster_mark_file(tmp_path / f"cluster-mark-service-{i}.dat")
            assert contents.component_type is CONTAINER
            assert (contents.header.service_id, contents.header.service_name) == (i, f"svc-{i}")
            assert contents.header.ingress_stream_id == NULL_VALUE
            assert service.path.name == f"cluster-mark-service-{i}.dat"
        # Each service's file is guarded on its own: service 0 is live, so a second service 0 is refused.
        with pytest.raises(ClusterMarkFileActiveError):
            create(tmp_path, CONTAINER, service_id=0, now_ms=NOW + 1)
    finally:
        cm.close()
        for service in services:
            service.close()


# ------------------------------------------------------- refuse / reclaim


def test_a_live_owner_is_not_displaced(tmp_path: Path) -> None:
    first = create(tmp_path)
    try:
        first.signal_ready()
        with pytest.raises(ClusterMarkFileActiveError, match=f"live pid {os.getpid()}") as info:
            create(tmp_path, now_ms=NOW + 9_999, member_id=5)
        assert info.value.pid == os.getpid()
        assert info.value.activity_age_ms == 9_999
        assert isinstance(info.value, ClusterMarkFileError)
        # The refused attempt left the owner's file alone.
        header = read_cluster_mark_file(tmp_path).header
        assert (header.version, header.member_id) == (SEMANTIC_VERSION, 2)
    finally:
        first.close()


def test_stale_timestamp_is_reclaimed(tmp_path: Path) -> None:
    first = create(tmp_path)
    crash(first)
    second = create(tmp_path, now_ms=NOW + 10_000, cluster_id=8)
    try:
        assert read_cluster_mark_file(tmp_path).header.cluster_id == 8
        assert second.reclaimed_reason is None
    finally:
        second.close()


@pytest.mark.system
@pytest.mark.system
def test_dead_pid_is_reclaimed_even_with_a_fresh_timestamp(tmp_path: Path) -> None:
    first = create(tmp_path, pid=dead_pid())
    crash(first)
    create(tmp_path, now_ms=NOW + 1).close()


def test_clean_close_allows_an_immediate_restart(tmp_path: Path) -> None:
    create(tmp_path).close()
    with create(tmp_path, now_ms=NOW + 1) as again:
        assert again.activity_timestamp() == NOW + 1


def test_backup_file_may_be_taken_over_by_the_consensus_module_but_not_by_a_service(tmp_path: Path) -> None:
    create(tmp_path, ClusterComponentType.BACKUP).close()
    create(tmp_path, CM, now_ms=NOW + 1).close()
    # A consensus module's file is never taken by another kind of component, even when it is dead.
    (tmp_path / "cluster-mark-service-0.dat").write_bytes((tmp_path / FILENAME).read_bytes())
    with pytest.raises(ClusterMarkFileError, match="belongs to a CONSENSUS_MODULE, not a CONTAINER"):
        create(tmp_path, CONTAINER, service_id=0, now_ms=NOW + 2)
    with pytest.raises(ClusterMarkFileError, match="not a BACKUP"):
        create(tmp_path, ClusterComponentType.BACKUP, now_ms=NOW + 2)


def test_another_major_version_is_refused(tmp_path: Path) -> None:
    mark = create(tmp_path)
    mark._header.put_int32_ordered(8, 1 << 16)  # a 1.0.0 file
    mark.close()
    with pytest.raises(ClusterMarkFileError, match="major version 1"):
        create(tmp_path, now_ms=NOW + 1)


def test_failed_start_is_recorded_and_does_not_block_a_restart(tmp_path: Path) -> None:
    mark = create(tmp_path)
    mark.signal_failed_start()
    mark.close()
    contents = read_cluster_mark_file(tmp_path)
    assert contents.header.version == VERSION_FAILED and contents.failed_start and not contents.is_ready
    create(tmp_path, now_ms=NOW + 1).close()


def test_candidate_term_id_is_durable_and_survives_a_restart(tmp_path: Path) -> None:
    first = create(tmp_path)
    assert first.candidate_term_id == NULL_VALUE
    first.candidate_term_id = 12
    assert first.candidate_term_id == 12
    assert read_cluster_mark_file(tmp_path).header.candidate_term_id == 12
    crash(first)
    second = create(tmp_path, now_ms=NOW + 10_000)
    try:
        assert second.candidate_term_id == 12
        second.candidate_term_id = 13
    finally:
        second.close()
    with pytest.raises(ClusterMarkFileError, match="closed"):
        second.candidate_term_id = 14
    third = create(tmp_path, now_ms=NOW + 10_001)
    try:
        assert third.candidate_term_id == 13
    finally:
        third.close()


def test_legacy_layout_without_message_header_is_understood(tmp_path: Path) -> None:
    # A file of an Aeron version before the message header: the body at offset 0, fresh and live.
    buffer = bytearray(FILE_LENGTH)
    MarkFileHeaderEncoder.encode_headerless(
        buffer,
        0,
        version=1,
        component_type=CM,
        activity_timestamp=NOW,
        start_timestamp=NOW,
        pid=os.getpid(),
        candidate_term_id=4,
        archive_stream_id=10,
        service_stream_id=104,
        consensus_module_stream_id=105,
        ingress_stream_id=101,
        member_id=1,
        service_id=-1,
        header_length=HEADER_LENGTH,
        error_buffer_length=ERRORS,
        cluster_id=0,
        aeron_directory="/dev/shm/x",
    )
    (tmp_path / FILENAME).write_bytes(bytes(buffer))
    contents = read_cluster_mark_file(tmp_path)
    assert not contents.has_message_header
    assert (contents.header.aeron_directory, contents.header.candidate_term_id) == ("/dev/shm/x", 4)
    with pytest.raises(ClusterMarkFileActiveError):
        create(tmp_path, now_ms=NOW + 5)
    with create(tmp_path, now_ms=NOW + 10_000) as mark:
        assert mark.candidate_term_id == 4  # the vote carries over into the new layout
        assert struct.unpack_from("<HHHH", (tmp_path / FILENAME).read_bytes(), 0) == (128, 200, 110, 2)


# ----------------------------------------------------------- corrupt / truncated


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: b"", "truncated mark file: 0 bytes"),
        (lambda data: data[:100], "truncated mark file: 100 bytes"),
        (lambda data: data[: HEADER_LENGTH + 4096], "corrupt or truncated mark file"),
        (lambda data: bytes(len(data)), "headerLength 0"),
        (lambda data: data[:8] + b"\xff" * 120 + data[128:], "component type -1"),
        (lambda data: data[: 8 + 128] + b"\xff\xff\xff\x7f" + data[8 + 132 :], "does not decode"),
    ],
    ids=["empty", "short", "short-error-buffer", "zeroed", "garbage-block", "bad-var-length"],
)
@pytest.mark.system
@pytest.mark.system
def test_corrupt_or_truncated_file_is_reported_and_reclaimed(tmp_path: Path, damage: Any, message: str) -> None:
    mark = create(tmp_path, pid=dead_pid())  # the owner crashed, then the file was damaged
    mark.candidate_term_id = 9
    mark.error_log(lambda: NOW).record("an error that must not be read from a damaged file")
    crash(mark)
    path = tmp_path / FILENAME
    path.write_bytes(damage(path.read_bytes()))

    with pytest.raises(CorruptClusterMarkFileError, match=message) as info:
        read_cluster_mark_file(path)
    assert str(path) in str(info.value)

    reclaimed = create(tmp_path, now_ms=NOW + 1)
    try:
        assert reclaimed.reclaimed_reason is not None and message in reclaimed.reclaimed_reason
        assert reclaimed.candidate_term_id == NULL_VALUE  # nothing in a damaged file is trusted
        assert reclaimed.previous_errors == []
        assert read_cluster_mark_file(path).header.member_id == 2
    finally:
        reclaimed.close()


def test_damaged_file_whose_liveness_words_name_a_live_owner_is_still_refused(tmp_path: Path) -> None:
    mark = create(tmp_path)
    try:
        path = tmp_path / FILENAME
        (tmp_path / "copy.dat").write_bytes(path.read_bytes()[: HEADER_LENGTH + 16])
        with pytest.raises(CorruptClusterMarkFileError, match="corrupt or truncated"):
            read_cluster_mark_file(tmp_path / "copy.dat")
        (tmp_path / "copy.dat").rename(path)  # a live owner's file, cut short under it
        with pytest.raises(ClusterMarkFileActiveError):
            create(tmp_path, now_ms=NOW + 1)
    finally:
        mark.close()


def test_corrupt_error_log_is_a_clear_error_for_tools_but_does_not_block_create(tmp_path: Path) -> None:
    mark = create(tmp_path)
    mark.error_buffer.put_int32(0, 7)  # a record length no writer produces
    mark.close()
    with pytest.raises(CorruptClusterMarkFileError, match="corrupt error log"):
        read_cluster_mark_file(tmp_path)
    with create(tmp_path, now_ms=NOW + 1) as again:
        assert again.previous_errors == []
        assert again.reclaimed_reason is None


def test_missing_file_is_a_clear_error_for_tools(tmp_path: Path) -> None:
    with pytest.raises(ClusterMarkFileError, match="cannot read"):
        read_cluster_mark_file(tmp_path / FILENAME)


# ------------------------------------------------- a file its new owner is recreating
#
# A restarting module recreates its file in place: truncated to nothing, then
# zero-filled to its length, then the header.  Services, the module (about its
# services) and tools read it meanwhile.


@pytest.mark.system
@pytest.mark.system
def test_a_file_cut_short_after_its_header_was_read_is_a_clear_error(tmp_path: Path, monkeypatch: Any) -> None:
    """The header comes from the old file and the error log from the new,
    still empty one: CorruptClusterMarkFileError, which a waiting service
    takes as "not there yet" (a ValueError from mapping an empty file ended
    the service before)."""
    mark = create(tmp_path, pid=dead_pid())
    mark.error_log(lambda: NOW).record("an error of the previous owner")
    crash(mark)
    path = tmp_path / FILENAME
    read_header = mark_file._read_header_region

    def read_header_then_recreate(at: Path) -> tuple[bytes, int]:
        header = read_header(at)
        os.truncate(at, 0)  # the new owner's O_TRUNC, before it sets the length
        return header

    monkeypatch.setattr(mark_file, "_read_header_region", read_header_then_recreate)
    with pytest.raises(CorruptClusterMarkFileError, match="error buffer is 0 bytes, the header says 1048576"):
        read_cluster_mark_file(path)


@pytest.mark.system
@pytest.mark.system
def test_liveness_reads_the_head_only_and_a_file_being_recreated_has_no_owner(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    assert read_liveness(path) is None  # no file
    mark = create(tmp_path)
    try:
        starting = read_liveness(path)
        assert starting is not None
        assert (starting.pid, starting.activity_timestamp, starting.component_type) == (os.getpid(), NOW, int(CM))
        assert not starting.is_ready and starting.is_active(NOW + 1)
        mark.signal_ready()
        ready = read_liveness(path)
        assert ready is not None and ready.is_ready and ready.version == SEMANTIC_VERSION
        assert not ready.is_active(NOW + 10_000)  # a stale timestamp
        assert not container_module_alive(tmp_path)  # the service's check: NOW is long past

        mark.update_activity_timestamp(epoch_ms())
        assert container_module_alive(tmp_path)
        assert container_module_alive(tmp_path, os.getpid())
        assert not container_module_alive(tmp_path, dead_pid())  # another module than the one it follows

        os.truncate(path, 0)  # recreated: empty...
        assert read_liveness(path) is None
        assert not container_module_alive(tmp_path)
        os.truncate(path, FILE_LENGTH)  # ...then zero-filled, before its header
        zeroed = read_liveness(path)
        assert zeroed is not None and not zeroed.is_ready and not zeroed.is_active(epoch_ms())
        assert not container_module_alive(tmp_path)
    finally:
        mark.close()


# ------------------------------------------------------------------- error log


def test_error_log_round_trip_and_survives_a_restart(tmp_path: Path) -> None:
    clock = iter(range(NOW, NOW + 100)).__next__
    first = create(tmp_path)
    log = first.error_log(clock)
    assert first.error_log(clock) is log
    assert log.record("election timed out in CANVASS")
    assert log.record("election timed out in CANVASS")
    assert log.record("archive connection lost")

    # A tool reads the errors while the owner is alive...
    seen = {e.text: e.observation_count for e in read_cluster_mark_file(tmp_path).errors}
    assert seen == {"election timed out in CANVASS": 2, "archive connection lost": 1}
    first.close()
    # ...and after it is gone.
    errors = read_cluster_mark_file(tmp_path).errors
    assert [(e.text, e.first_observation_timestamp, e.last_observation_timestamp) for e in errors] == [
        ("election timed out in CANVASS", NOW, NOW + 1),
        ("archive connection lost", NOW + 2, NOW + 2),
    ]

    second = create(tmp_path, now_ms=NOW + 1)
    try:
        previous = {e.text: e.observation_count for e in second.previous_errors}
        assert previous == {"election timed out in CANVASS": 2, "archive connection lost": 1}
        assert second.error_buffer.get_int32(0) == 0  # a fresh log
        assert second.error_buffer.capacity == ERRORS
        assert read_cluster_mark_file(tmp_path).errors == []
    finally:
        second.close()


# ------------------------------------------------------------------ arguments


def test_bad_arguments_are_refused_before_the_file_is_touched(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="error buffer length"):
        create(tmp_path, error_buffer_length=64 * 1024)
    with pytest.raises(ClusterMarkFileError, match="do not fit"):
        create(tmp_path, control_channel="aeron:udp?endpoint=" + "x" * HEADER_LENGTH)
    with pytest.raises(ClusterMarkFileError, match="US-ASCII"):
        create(tmp_path, service_name="sérvice")
    with pytest.raises(ValueError, match="needs a service id"):
        create(tmp_path, CONTAINER)
    assert list(tmp_path.iterdir()) == []
