"""Corrupted files on restart: recording.log, log segments, the archive catalog.

Each test writes committed state through a client, stops or kills the node,
damages one file, restarts, and then checks one of two outcomes:

- the process refuses to start with a specific error (file, recording or
  entry, position or offset) and a non-zero exit, and after the documented
  repair every committed entry is back; or
- a documented automatic repair happens and every committed entry is back.

Never: a node that starts and serves a state missing committed entries or
holding altered values.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.archive.catalog import Catalog
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog
from support.archive import ArchiveProcess
from support.cluster import LocalCluster, NodeProcess, SingleNodeCluster
from support.driver import DriverProcess, wait_for
from support.multi_node import assert_same_logs, member_view, wait_for_commit, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

KEY_VALUE = "fulmar.service.samples:KeyValueService"
ENTRY_LENGTH = 64  # a TERM or SNAPSHOT record of recording.log


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def single_node() -> Iterator[Any]:
    clusters: list[SingleNodeCluster] = []

    def create(*archive_args: str) -> SingleNodeCluster:
        cluster = SingleNodeCluster(KEY_VALUE)
        clusters.append(cluster)
        start_node(cluster, *archive_args)
        return cluster

    yield create
    for cluster in clusters:
        cluster.close()


def start_node(cluster: SingleNodeCluster, *archive_args: str) -> None:
    """Driver and archive (with ``archive_args``), then consensus module and service."""
    if cluster.driver is None or cluster.driver.process.poll() is not None:
        cluster.driver = DriverProcess(cluster.driver_dir)
    if cluster.archive is None or cluster.archive.process.poll() is not None:
        cluster.archive = ArchiveProcess(cluster.base / "archive", cluster.driver_dir, *archive_args)
    cluster.start()


def connect(cluster: SingleNodeCluster) -> ClusterClient:
    return ClusterClient.connect(
        cluster.connect(),
        cluster.ingress_channel,
        egress_channel="aeron:udp?endpoint=127.0.0.1:0",
        message_timeout_ns=20_000_000_000,
    )


def call(client: ClusterClient, **request: Any) -> dict[str, Any]:
    reply = json.loads(client.request(json.dumps(request).encode(), 20))
    assert isinstance(reply, dict)
    return reply


def put_keys(cluster: SingleNodeCluster, keys: range) -> dict[str, str]:
    """Put ``key<i>`` = ``value<i>`` for each i; each put is acknowledged, so committed."""
    client = connect(cluster)
    written = {}
    for i in keys:
        reply = call(client, op="put", key=f"key{i}", value=f"value{i}", id=i)
        assert reply["ok"] and reply["id"] == i
        written[f"key{i}"] = f"value{i}"
    client.close()
    return written


def read_back(cluster: SingleNodeCluster, expected: dict[str, str]) -> None:
    """Every committed key holds exactly its committed value."""
    client = connect(cluster)
    found = {key: call(client, op="get", key=key, id=0)["value"] for key in expected}
    client.close()
    assert found == expected


def recording_log_path(cluster: SingleNodeCluster) -> Path:
    return cluster.cluster_dir / "recording.log"


def archive_dir(cluster: SingleNodeCluster) -> Path:
    return cluster.base / "archive"


def start_consensus_expecting_exit(cluster: SingleNodeCluster, timeout_s: float = 60) -> tuple[int, str]:
    """Start the consensus module (and the service, which it may need to get as
    far as the failure) and wait for the module to exit on its own: its exit
    code and everything it printed."""
    cluster.consensus = NodeProcess(
        [
            "consensus",
            "--cluster-dir",
            str(cluster.cluster_dir),
            "--driver-dir",
            str(cluster.driver_dir),
            "--ingress-channel",
            cluster.ingress_channel,
        ],
        "consensus module pid",
        cluster.base / "consensus.log",
        wait=False,
    )
    process = cluster.consensus.process
    if cluster.service is None or not cluster.service.alive:
        cluster.service = NodeProcess(
            [
                "service",
                "--cluster-dir",
                str(cluster.cluster_dir),
                "--driver-dir",
                str(cluster.driver_dir),
                "--service",
                KEY_VALUE,
            ],
            "service 0 (",
            cluster.base / "service.log",
            wait=False,
        )
    wait_for(lambda: process.poll() is not None, timeout_s, "the consensus module to refuse to start")
    return process.returncode, cluster.consensus.output()


def stop_cluster_processes(cluster: SingleNodeCluster) -> None:
    """Reap the consensus module and service (whatever state they are in); archive and driver keep running."""
    for process in (cluster.service, cluster.consensus):
        if process is not None:
            process.kill()


def cluster_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fulmar.cli.cluster_tool", *args], capture_output=True, text=True, timeout=60
    )


def rebuild_recording_log(cluster: SingleNodeCluster) -> str:
    result = cluster_tool(
        "cluster",
        "rebuild-recording-log",
        "--dir",
        str(cluster.cluster_dir),
        "--archive-dir",
        str(archive_dir(cluster)),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def restart(cluster: SingleNodeCluster) -> None:
    stop_cluster_processes(cluster)
    cluster.start_consensus()
    cluster.start_service()


# --------------------------------------------------------------------------- recording.log


def _cut_torn_tail(data: bytes) -> bytes:
    return data[: len(data) - 20]  # the last entry loses its last 20 bytes


def _drop_last_entry(data: bytes) -> bytes:
    return data[: len(data) - ENTRY_LENGTH]


def _garbage_in_last_entry(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(data) - ENTRY_LENGTH + 8 : len(data) - ENTRY_LENGTH + 16] = b"\xff" * 8  # leadershipTermId = -1
    return bytes(damaged)


@pytest.mark.parametrize(
    "damage",
    [_cut_torn_tail, _drop_last_entry, _garbage_in_last_entry],
    ids=["torn_tail", "last_entry_lost", "garbage_in_last_entry"],
)
def test_a_recording_log_that_lost_its_only_term_is_refused_then_rebuilt(single_node: Any, damage: Any) -> None:
    """One TERM entry: whatever takes it away (a torn tail cut at open, a lost
    entry, garbage read as a torn tail) leaves a log that names no recording,
    beside an archive that holds one.  The module refuses to start instead of
    beginning an empty log; the documented repair rebuilds recording.log from
    the log recording, and the restarted node has every committed entry."""
    cluster = single_node()
    written = put_keys(cluster, range(25))
    cluster.kill_all()
    path = recording_log_path(cluster)
    assert len(path.read_bytes()) == ENTRY_LENGTH
    path.write_bytes(damage(path.read_bytes()))

    start_node_without_cluster(cluster)
    code, output = start_consensus_expecting_exit(cluster)
    assert code == 1, output
    assert f"{path} has no leadership term entry" in output
    assert "the archive holds log recording 0 (stream 100, positions 0.." in output
    assert "cluster-tool cluster rebuild-recording-log" in output
    if damage is not _drop_last_entry:
        assert "dropped" in output and "at file offset 0 (entry index 0)" in output

    stop_cluster_processes(cluster)
    report = rebuild_recording_log(cluster)
    assert "1 TERM entries (term@base: 0@0)" in report
    assert list(cluster.cluster_dir.glob("recording.log.damaged-*"))
    restart(cluster)
    read_back(cluster, written)
    written.update(put_keys(cluster, range(25, 30)))  # and it goes on
    read_back(cluster, written)


def start_node_without_cluster(cluster: SingleNodeCluster) -> None:
    cluster.driver = DriverProcess(cluster.driver_dir)
    cluster.archive = ArchiveProcess(archive_dir(cluster), cluster.driver_dir)


def two_terms(cluster: SingleNodeCluster) -> dict[str, str]:
    """Committed entries in two leadership terms (a restart in between)."""
    written = put_keys(cluster, range(15))
    cluster.kill_all()
    start_node(cluster)
    written.update(put_keys(cluster, range(15, 30)))
    cluster.kill_all()
    return written


@pytest.mark.parametrize("damage", [_cut_torn_tail, _drop_last_entry], ids=["torn_tail", "last_entry_lost"])
def test_losing_the_last_term_entry_of_several_is_repaired_by_the_replay(single_node: Any, damage: Any) -> None:
    """With an earlier TERM left, the recovery replays the whole log recording
    (every term shares it), including the term whose entry was lost: nothing
    committed is missing and the node goes on in a new term."""
    cluster = single_node()
    written = two_terms(cluster)
    path = recording_log_path(cluster)
    assert len(path.read_bytes()) == 2 * ENTRY_LENGTH
    path.write_bytes(damage(path.read_bytes()))
    start_node(cluster)
    assert cluster.consensus is not None
    if damage is _cut_torn_tail:  # the repair is reported
        assert (
            f"recording log repaired: {path}: dropped 44 trailing bytes at file offset 64 (entry index 1)"
            in cluster.consensus.output()
        )
    read_back(cluster, written)
    written.update(put_keys(cluster, range(30, 35)))
    read_back(cluster, written)


def test_garbage_in_an_entry_before_the_last_is_refused_then_rebuilt(single_node: Any) -> None:
    cluster = single_node()
    written = two_terms(cluster)
    path = recording_log_path(cluster)
    damaged = bytearray(path.read_bytes())
    damaged[16:24] = struct.pack("<q", -5)  # entry 0's termBaseLogPosition
    path.write_bytes(bytes(damaged))

    start_node_without_cluster(cluster)
    code, output = start_consensus_expecting_exit(cluster)
    assert code == 1, output
    assert (
        f"CorruptRecordingLogError: {path}: corrupt entry at index 0 (file offset 0): "
        f"termBaseLogPosition=-5 is negative"
    ) in output

    stop_cluster_processes(cluster)
    report = rebuild_recording_log(cluster)
    assert "2 TERM entries" in report
    restart(cluster)
    read_back(cluster, written)


# --------------------------------------------------------------------------- log segments


def log_segment(archive: Path, cluster_dir: Path) -> Path:
    """The first segment file of the node's log recording."""
    with RecordingLog.open(cluster_dir, create=False) as recording_log:
        recording_id = recording_log.find_last_term_recording_id()
    return archive / f"{recording_id}-0.rec"


def frame_holding(segment: Path, text: bytes) -> tuple[int, int]:
    """(file offset, length) of the frame whose payload holds ``text``."""
    data = segment.read_bytes()
    offset = 0
    while True:
        length = struct.unpack_from("<i", data, offset)[0]
        assert length > 0, f"no frame with {text!r} in {segment}"
        if text in data[offset + 32 : offset + length]:
            return offset, length
        offset += (length + 31) & ~31


def wait_until_recorded_in_catalog(archive: Path, segment: Path, text: bytes) -> None:
    """Wait until the archive's catalog holds the frame with ``text`` as
    recorded.  Its agent writes the recorded position there on its passes (up
    to an idle wait behind the segment file); after a crash the archive
    trusts what lies below that position and scans only the rest, for a
    frame torn by the crash, ending the recording before it.  A frame damaged
    in that unconfirmed tail is taken for a torn one (as Aeron's archive
    does): these tests damage one the catalog already holds."""
    offset, length = frame_holding(segment, text)
    recording_id = int(segment.name.split("-")[0])

    def recorded() -> bool:
        catalog = Catalog.open_read_only(archive)
        try:
            return catalog.recorded_position(recording_id) >= offset + length
        finally:
            catalog.close()

    wait_for(recorded, 10, f"the catalog of {archive} to hold position {offset + length} of recording {recording_id}")


def damage_frame(segment: Path, part: str) -> int:
    """Damage the frame that put key7 and return its file offset (= its position in segment 0)."""
    offset, length = frame_holding(segment, b'"value7"')
    with open(segment, "r+b") as file:
        data = bytearray(file.read())
        if part == "payload":
            data[data.index(b'"value7"', offset) + 6] ^= 0x01  # "value7" becomes "value6": a silently altered value
        elif part == "length":
            struct.pack_into("<i", data, offset, 0x7FE0)
        elif part == "type":
            struct.pack_into("<H", data, offset + 6, 0x55)
        file.seek(0)
        file.write(data)
    return offset


_SEGMENT_DAMAGE = {
    "payload": "CRC checksum mismatch in the frame at position {position} ({segment} offset {position}): "
    "recorded checksum=",
    "length": "frame at position {position} ends at",
    "type": "the frame at position {position} ({segment} offset {position}) has type 85, neither DATA nor PAD",
}


@pytest.mark.parametrize("part", sorted(_SEGMENT_DAMAGE))
def test_a_damaged_log_frame_stops_the_node_with_the_recording_and_position(single_node: Any, part: str) -> None:
    """A flipped byte in a frame of the log recording (in the header, or in the
    payload, found by the CRC-32 the cluster's archive records by default)
    ends the recovery replay: the module exits naming the recording, the
    position and the segment file, instead of applying an altered log.
    ``cluster-tool archive verify --checksum`` finds the same frame offline.
    One member alone holds no other copy of the log: no repair can bring the
    entries back (restore the node's directories from a backup)."""
    cluster = single_node()
    put_keys(cluster, range(20))
    segment = log_segment(archive_dir(cluster), cluster.cluster_dir)
    wait_until_recorded_in_catalog(archive_dir(cluster), segment, b'"value7"')
    cluster.kill_all()
    position = damage_frame(segment, part)

    start_node_without_cluster(cluster)
    code, output = start_consensus_expecting_exit(cluster)
    assert code == 1, output
    assert "the replay of log recording 0 failed, so this member cannot recover its committed state" in output
    assert _SEGMENT_DAMAGE[part].format(position=position, segment=segment) in output

    verify = cluster_tool("archive", "verify", "--checksum", "--archive-dir", str(archive_dir(cluster)))
    assert verify.returncode == 1, verify.stdout
    assert f"recording 0: bad frame at position {position}: {segment} offset {position}: " in verify.stdout
    clean = cluster_tool("archive", "verify", "--archive-dir", str(archive_dir(cluster)))
    assert clean.returncode == 0, clean.stdout  # without --checksum only the files are checked


def test_without_checksums_a_flipped_payload_byte_goes_unnoticed(single_node: Any) -> None:
    """Why the cluster's archive records checksums by default: with them off,
    the same flip is replayed into the service and the value is altered."""
    cluster = single_node("--no-record-checksum", "--no-replay-checksum")
    written = put_keys(cluster, range(20))
    cluster.kill_all()
    damage_frame(log_segment(archive_dir(cluster), cluster.cluster_dir), "payload")
    start_node(cluster, "--no-record-checksum", "--no-replay-checksum")
    client = connect(cluster)
    assert call(client, op="get", key="key7", id=0)["value"] == "value6" != written["key7"]
    client.close()


# --------------------------------------------------------------------------- archive.catalog

CATALOG_HEADER_LENGTH = 32
DESCRIPTOR_HEADER_LENGTH = 32
STOP_POSITION_OFFSET = 48  # in the RecordingDescriptor block


def catalog_entries(catalog: bytes) -> list[tuple[int, int]]:
    """(file offset, frame length) of each catalog entry."""
    entries = []
    offset = CATALOG_HEADER_LENGTH
    while offset + DESCRIPTOR_HEADER_LENGTH <= len(catalog):
        length = struct.unpack_from("<i", catalog, offset)[0]
        if length == 0:
            break
        entries.append((offset, DESCRIPTOR_HEADER_LENGTH + length))
        offset += DESCRIPTOR_HEADER_LENGTH + length
    return entries


def _torn_last_descriptor(catalog: bytearray, offset: int, length: int) -> tuple[int, str]:
    # The last descriptor was being written when the machine died: its second half never arrived.
    half = offset + DESCRIPTOR_HEADER_LENGTH + (length - DESCRIPTOR_HEADER_LENGTH) // 2
    catalog[half : offset + length] = bytes(offset + length - half)
    return offset + 8, "checksum mismatch for recording 0: stored"


def _garbage_in_a_field(catalog: bytearray, offset: int, length: int) -> tuple[int, str]:
    # The stop position of the recording shrinks: trusted, it would cut committed entries off the replay.
    field = offset + DESCRIPTOR_HEADER_LENGTH + STOP_POSITION_OFFSET
    catalog[field : field + 8] = struct.pack("<q", 64)
    return offset + 8, "checksum mismatch for recording 0: stored"


def _garbage_in_the_header(catalog: bytearray, offset: int, length: int) -> tuple[int, str]:
    catalog[offset : offset + 4] = struct.pack("<i", 1000)
    return offset, "entry length 1000 + 32 is not a multiple of the alignment"


@pytest.mark.parametrize(
    "damage",
    [_torn_last_descriptor, _garbage_in_a_field, _garbage_in_the_header],
    ids=["torn_last_descriptor", "garbage_in_a_field", "garbage_in_the_header"],
)
def test_a_damaged_catalog_entry_stops_the_archive_with_the_offset(single_node: Any, damage: Any) -> None:
    """The archive refuses a catalog whose last entry is torn or holds garbage,
    naming the file and the offset (and, for a checksum, the recording); the
    node never starts on a catalog that could hide or misplace the log.  With
    one member there is no other copy to repair from (restore a backup); a
    member of a cluster is wiped and catches up (see the three-member test)."""
    cluster = single_node()
    put_keys(cluster, range(10))
    cluster.kill_all()
    path = archive_dir(cluster) / "archive.catalog"
    catalog = bytearray(path.read_bytes())
    offset, length = catalog_entries(bytes(catalog))[-1]  # the log recording's: the only one
    where, reason = damage(catalog, offset, length)
    path.write_bytes(bytes(catalog))

    archive = subprocess.run(
        [
            sys.executable,
            "-m",
            "fulmar.cli.cluster_node",
            "archive",
            "--dir",
            str(archive_dir(cluster)),
            "--driver-dir",
            str(cluster.driver_dir),
            "--control-channel",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert archive.returncode == 1, archive.stdout
    assert f"cannot start an archive in {archive_dir(cluster)}: {path}" in archive.stderr
    assert f"offset {where}" in archive.stderr and reason in archive.stderr


# --------------------------------------------------------------------------- a member of three


def test_a_member_with_a_damaged_log_refuses_then_is_wiped_and_catches_up() -> None:
    """A follower's own log segment has a flipped payload byte.  It refuses to
    start (the recovery replay fails its checksum).  The documented repair:
    stop the member, delete its archive and cluster directories, start it
    again: it replicates the log from the leader and holds every committed
    entry, frame for frame as the leader does."""
    with LocalCluster(3, KEY_VALUE) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 60)
        client = cluster.connect_client()
        written = {}
        for i in range(30):
            assert call(client, op="put", key=f"key{i}", value=f"value{i}", id=i)["ok"]
            written[f"key{i}"] = f"value{i}"
        position = member_view(cluster, leader.member).commit_position
        assert position is not None
        wait_for_commit(cluster, [0, 1, 2], position, 60)
        member = next(m for m in range(3) if m != leader.member)
        segment = log_segment(cluster.archive_dir(member), cluster.cluster_dir(member))
        wait_until_recorded_in_catalog(cluster.archive_dir(member), segment, b'"value7"')
        cluster.kill_member(member)
        frame_position = damage_frame(segment, "payload")

        for kind in ("driver", "archive"):
            cluster.start_process(member, kind)
        consensus = cluster.launch(member, "consensus")
        cluster.launch(member, "service")
        wait_for(lambda: consensus.process.poll() is not None, 60, f"member {member}'s consensus module to refuse")
        assert consensus.process.returncode == 1, consensus.output()
        assert (
            f"CRC checksum mismatch in the frame at position {frame_position} ({segment} offset {frame_position})"
        ) in consensus.output()

        # The repair: wipe the member, start it, let it catch up from the leader.
        cluster.kill_member(member)
        shutil.rmtree(cluster.archive_dir(member))
        shutil.rmtree(cluster.cluster_dir(member))
        cluster.start_member(member)
        for i in range(30, 35):  # the cluster goes on meanwhile
            assert call(client, op="put", key=f"key{i}", value=f"value{i}", id=i)["ok"]
            written[f"key{i}"] = f"value{i}"
        position = member_view(cluster, wait_for_leader(cluster, 30).member).commit_position
        assert position is not None
        wait_for_commit(cluster, [0, 1, 2], position, 90)
        assert_same_logs(cluster, [leader.member, member], position)
        found = {key: call(client, op="get", key=key, id=0)["value"] for key in written}
        assert found == written
