"""A log that does not grow forever: each member keeps its newest snapshot
sets and lets go of the log and snapshots before them, recovers from what it
kept, and a blank member joins from the leader's snapshot once position 0 is
gone.

Three members on 127.0.0.1 with 64 KiB terms and 64 KiB archive segments, so
that a few thousand counter increments span several segment files.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from fulmar.analytics.replay import ReplayError, audit_snapshot, replay_state, snapshot_records
from fulmar.analytics.session import spark_session, stop_spark
from fulmar.archive.catalog import Catalog
from fulmar.archive.segment import list_segment_files, segment_base_of_file
from fulmar.cli import cluster_commands, cluster_tool
from fulmar.consensus.log_retention import snapshot_sets
from fulmar.consensus.recording_log import Entry, RecordingLog
from fulmar.service import samples
from support.cluster import FAST_ELECTION_ARGS, LocalCluster
from support.driver import wait_for
from support.multi_node import (
    CounterWorkload,
    log_frames,
    member_log_path,
    member_view,
    read_counter,
    wait_for_commit,
    wait_for_leader,
)

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

COUNTER_SERVICE = "fulmar.service.samples:CounterService"
SEGMENT = 64 * 1024
SMALL_LOG_ARGS = ("--log-channel", f"aeron:udp?term-length={SEGMENT // 1024}k")
COUNTER_REPLAY_ARGS = (
    "--apply",
    "fulmar.service.samples:counter_apply",
    "--initial",
    "fulmar.service.samples:counter_initial",
    "--load-snapshot",
    "fulmar.service.samples:counter_snapshot_state",
    "--resume",
    "fulmar.service.samples:counter_resume",
    "--view",
    "fulmar.service.samples:counter_view",
)


def small_log_cluster(*extra_consensus_args: str) -> LocalCluster:
    return LocalCluster(
        3,
        COUNTER_SERVICE,
        extra_consensus_args=(*FAST_ELECTION_ARGS, *SMALL_LOG_ARGS, *extra_consensus_args),
        extra_archive_args=("--segment-length", f"{SEGMENT // 1024}k"),
    )


def entries(cluster: LocalCluster, member: int) -> list[Entry]:
    log = RecordingLog.open(cluster.cluster_dir(member), create=False)
    try:
        return list(log.entries)
    finally:
        log.close()


def log_recording(cluster: LocalCluster, member: int) -> tuple[int, int]:
    """(recording id, start position) of the member's log recording, from its catalog."""
    recording_id = max((e.recording_id for e in entries(cluster, member) if e.is_valid_term), default=-1)
    catalog = Catalog.open_read_only(cluster.archive_dir(member))
    try:
        descriptor = catalog.descriptor(recording_id)
    finally:
        catalog.close()
    assert descriptor is not None, f"member {member}: no log recording {recording_id}"
    return recording_id, descriptor.start_position


def catalog_ids(cluster: LocalCluster, member: int) -> set[int]:
    catalog = Catalog.open_read_only(cluster.archive_dir(member))
    try:
        return {d.recording_id for d in catalog.recordings()}
    finally:
        catalog.close()


def take_snapshot(cluster: LocalCluster) -> int:
    """A snapshot on every member; its log position once each has recorded it."""
    print(cluster_commands.cluster_operate(cluster.base, "snapshot", 30))
    leader = wait_for_leader(cluster, 30).member
    position = max(s.log_position for s in snapshot_sets(entries(cluster, leader), 1))

    def everywhere() -> bool:
        return all(
            cluster.is_running(m, "consensus") is False
            or any(s.log_position == position for s in snapshot_sets(entries(cluster, m), 1))
            for m in range(cluster.size)
        )

    wait_for(everywhere, 30, f"every member to record the snapshot at {position}")
    return position


def grow(workload: CounterWorkload, cluster: LocalCluster, snapshots: int, acks: int) -> list[int]:
    """``acks`` increments before each of ``snapshots`` snapshots; their positions."""
    positions = []
    for _ in range(snapshots):
        workload.wait_for_acks(acks, 60)
        positions.append(take_snapshot(cluster))
    return positions


def purge(cluster: LocalCluster, keep: int) -> str:
    result = CliRunner().invoke(
        cluster_tool.main, ["purge-log", "--dir", str(cluster.base), "--keep-snapshots", str(keep)]
    )
    assert result.exit_code == 0, result.output
    return result.output


def snapshot_state(cluster: LocalCluster, member: int, position: int) -> list[bytes]:
    """The counter service's snapshot records at ``position`` on ``member``."""
    found = [s for s in snapshot_sets(entries(cluster, member), 1) if s.log_position == position]
    assert found, f"member {member} has no snapshot at {position}"
    service_entry = found[0].entries[1]
    return snapshot_records(cluster.archive_dir(member), service_entry.recording_id)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with small_log_cluster() as local:
        local.start()
        wait_for_leader(local, 30)
        yield local


def test_purge_keeps_the_newest_snapshots_and_every_member_recovers_from_them(cluster: LocalCluster) -> None:
    workload = CounterWorkload(cluster).start()
    try:
        first, second, third = grow(workload, cluster, 3, 700)
        assert second >= 2 * SEGMENT, "the log must span the segments the test purges"
        kept_base = second - second % SEGMENT
        dry = CliRunner().invoke(
            cluster_tool.main, ["purge-log", "--dir", str(cluster.base), "--keep-snapshots", "2", "--dry-run"]
        )
        assert dry.exit_code == 0 and "would keep" in dry.output, dry.output
        assert all(log_recording(cluster, m)[1] == 0 for m in range(cluster.size)), "a dry run purged"
        before = {
            m: [e for e in entries(cluster, m) if e.is_valid_snapshot and e.log_position == first]
            for m in range(cluster.size)
        }
        output = purge(cluster, 2)  # under load: the members go on writing
        for member in range(cluster.size):
            assert f"node{member}: kept 2 snapshot set(s)" in output, output
            recording_id, start = log_recording(cluster, member)
            assert start == kept_base, f"member {member}'s log starts at {start}, not {kept_base}: {output}"
            assert all(
                segment_base_of_file(name) >= kept_base
                for name in list_segment_files(cluster.archive_dir(member), recording_id)
            )
            old = {e.entry_index for e in before[member]}
            assert len(old) == 2, before[member]
            assert all(not e.is_valid for e in entries(cluster, member) if e.entry_index in old)
            assert not {e.recording_id for e in before[member]} & catalog_ids(cluster, member)
            assert [s.log_position for s in snapshot_sets(entries(cluster, member), 1)] == [third, second]
        # A second purge has nothing left to do.
        assert "nothing to purge" in purge(cluster, 2)

        # A follower killed and restarted recovers from its snapshot and the log after it.
        leader = wait_for_leader(cluster, 30).member
        follower = (leader + 1) % cluster.size
        cluster.kill_member(follower)
        workload.wait_for_acks(200, 30)
        cluster.start_member(follower)
        workload.wait_for_acks(200, 30)
        position = member_view(cluster, leader).commit_position
        assert position is not None
        wait_for_commit(cluster, list(range(cluster.size)), position, 30)
        assert log_frames(cluster, follower, position, kept_base) == log_frames(cluster, leader, position, kept_base)
    finally:
        workload.stop()
    # The whole cluster killed and started again: every acknowledged write is there.
    for member in range(cluster.size):
        cluster.kill_member(member)
    cluster.start()
    wait_for_leader(cluster, 30)
    final = read_counter(cluster.connect_client())
    workload.check(final)

    # Spark over a purged log: the replay starts from the member's snapshot; the
    # newest snapshot is audited from the one before it; from 0 it is refused.
    archive_dir, cluster_dir = cluster.archive_dir(0), cluster.cluster_dir(0)
    spark = spark_session("local[1]", "fulmar retention test")
    try:
        # cluster-tool in this process: its job runs on this session (one JVM start for the test).
        done = CliRunner().invoke(
            cluster_tool.main,
            [
                "replay",
                "--archive-dir",
                str(archive_dir),
                "--cluster-dir",
                str(cluster_dir),
                "--from-snapshot",
                *COUNTER_REPLAY_ARGS,
                "--json",
            ],
        )
        assert done.exit_code == 0, done.output[-3000:]
        assert json.loads(done.stdout)["state"]["value"] == final, done.stdout
        audit = audit_snapshot(
            spark,
            archive_dir,
            cluster_dir,
            samples.counter_apply,
            samples.counter_initial(),
            samples.counter_snapshot_state,
            view=samples.counter_view,
            resume=samples.counter_resume,
        )
        assert audit.matches and audit.snapshot.log_position == third and audit.messages > 0, audit.describe()
        with pytest.raises(ReplayError, match=f"starts at position {kept_base}"):
            replay_state(spark, archive_dir, samples.counter_apply, samples.counter_initial())
    finally:
        stop_spark(spark)


def test_a_blank_member_joins_from_the_leaders_snapshot_once_the_log_is_purged() -> None:
    """The members purge on their own after each snapshot (keeping one set);
    a follower loses its disks and starts blank: it copies the leader's
    snapshot and the log after it, loads the snapshot, and then holds what the
    others hold (the same log from the purge point, the same state at the next
    snapshot)."""
    with small_log_cluster("--log-retention-snapshots", "1") as cluster:
        cluster.start()
        wait_for_leader(cluster, 30)
        workload = CounterWorkload(cluster).start()
        try:
            grow(workload, cluster, 2, 700)
            starts = [log_recording(cluster, m)[1] for m in range(cluster.size)]
            assert all(start > 0 for start in starts), f"the members did not purge after their snapshots: {starts}"
            # A member invalidates the older set after it has recorded the new one, once
            # its archive has answered for the log recording's extent: the new set is in
            # its recording log first.
            wait_for(
                lambda: all(len(snapshot_sets(entries(cluster, m), 1)) == 1 for m in range(cluster.size)),
                30,
                "every member to keep one snapshot set once it has recorded the second",
            )
            leader = wait_for_leader(cluster, 30).member
            blank = (leader + 2) % cluster.size
            cluster.kill_member(blank)
            shutil.rmtree(cluster.archive_dir(blank))
            shutil.rmtree(cluster.cluster_dir(blank))
            workload.wait_for_acks(200, 30)
            cluster.start_member(blank)
            log = member_log_path(cluster, blank).read_text()
            assert "the cluster's log was purged" in log and "snapshot join: copied the snapshot" in log, log[-3000:]
            workload.wait_for_acks(200, 30)
            position = member_view(cluster, leader).commit_position
            assert position is not None
            wait_for_commit(cluster, list(range(cluster.size)), position, 30)
            _, start = log_recording(cluster, blank)
            assert start > 0
            assert log_frames(cluster, blank, position, start) == log_frames(cluster, leader, position, start)
            # The same state everywhere at the next snapshot (the blank member's service began from the copy).
            snapshot = take_snapshot(cluster)
            states = {m: snapshot_state(cluster, m, snapshot) for m in range(cluster.size)}
            assert states[blank] == states[leader] and states[blank], states
        finally:
            workload.stop()
        workload.check(read_counter(cluster.connect_client()))
