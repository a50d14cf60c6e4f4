"""ClusterBackup against a running three-member cluster: it retrieves the
snapshots, follows the live log through a leader failover, and ends with the
same log as the members (bytes compared) and a recording log a member could
start from.

The backup runs as a node would: its own media driver, its own archive, and
``cluster-node cluster-backup``, each its own process, on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID
from fulmar.cli import cluster_commands, cluster_node
from fulmar.consensus import protocol
from fulmar.consensus.backup import (
    CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID,
    CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID,
    ClusterBackupState,
)
from fulmar.consensus.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM, RecordingLog
from support.backup import Backup, backup_log
from support.cluster import LocalCluster
from support.driver import wait_for
from support.multi_node import CounterWorkload, log_frames, member_view, read_counter, wait_for_commit, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

COUNTER_SERVICE = "fulmar.service.samples:CounterService"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, COUNTER_SERVICE) as local:
        local.start()
        wait_for_leader(local, 30)
        yield local


def test_the_backup_follows_the_log_through_a_failover_and_holds_the_members_log(cluster: LocalCluster) -> None:
    workload = CounterWorkload(cluster).start()
    backup: Backup | None = None
    try:
        workload.wait_for_acks(200, 30)
        print(cluster_commands.cluster_operate(cluster.base, "snapshot", 30))
        workload.wait_for_acks(100, 30)
        backup = Backup(cluster)
        wait_for(
            lambda: backup.counter(protocol.CLUSTER_BACKUP_STATE_TYPE_ID) == ClusterBackupState.BACKING_UP,
            30,
            f"the backup to be BACKING_UP: {backup.output()[-2000:]}",
        )
        assert backup.counter(CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID) == 1
        # A failover under load: the backup finds the new leader and goes on.
        leader = wait_for_leader(cluster, 30).member
        cluster.kill_member(leader)
        wait_for_leader(cluster, 30, not_member=leader)
        workload.wait_for_acks(200, 60)
        cluster.start_member(leader)
        workload.wait_for_acks(100, 30)
    finally:
        workload.stop()
    try:
        assert backup is not None
        client = cluster.connect_client()
        final = read_counter(client)
        workload.check(final)
        new_leader = wait_for_leader(cluster, 30).member
        position = member_view(cluster, new_leader).commit_position
        assert position is not None
        wait_for_commit(cluster, list(range(cluster.size)), position, 30)
        wait_for(
            lambda: backup.counter(CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID) >= position,
            30,
            f"the backup's live log to reach {position}: {backup.output()[-3000:]}",
        )
        assert backup_log(backup, position) == log_frames(cluster, new_leader, position)
        # Its recording log: the snapshots it retrieved and the terms a member recovers from.
        log = RecordingLog.open(backup.cluster_dir, create=False)
        try:
            entries = list(log.entries)
        finally:
            log.close()
        assert sorted(e.service_id for e in entries if e.entry_type == ENTRY_TYPE_SNAPSHOT) == [-1, 0]
        terms = [e for e in entries if e.entry_type == ENTRY_TYPE_TERM]
        assert terms and terms[-1].leadership_term_id == member_view(cluster, new_leader).leadership_term_id
        # It followed the new leader's log after the failover (and the old one's before).
        assert f"member {new_leader} replays its log recording" in backup.output(), backup.output()
    finally:
        if backup is not None:
            backup.close()


def test_the_backup_follows_the_log_again_when_the_cluster_comes_back_with_the_same_leader(
    cluster: LocalCluster,
) -> None:
    """The whole cluster goes down while the backup follows the leader's log.
    Its next query goes unanswered (BACKUP_QUERY), and while it waits there
    its live log recording ends (the replay's image times out in the backup's
    driver).  The cluster comes back with the same member leading: its answer
    must not be taken for the log the backup no longer records.  The backup
    starts over and follows the log again (it waited in LIVE_LOG_REPLAY for
    the stopped recording for good: chaos seed 1961992242, restart-all)."""
    workload = CounterWorkload(cluster).start()
    backup: Backup | None = None
    try:
        workload.wait_for_acks(100, 30)
        backup = Backup(cluster)
        wait_for(
            lambda: backup.counter(protocol.CLUSTER_BACKUP_STATE_TYPE_ID) == ClusterBackupState.BACKING_UP,
            30,
            f"the backup to be BACKING_UP: {backup.output()[-2000:]}",
        )
        leader = wait_for_leader(cluster, 30).member
        behind, other = [m for m in range(cluster.size) if m != leader]
        # This follower's log ends here: beside it, only the leader can lead
        # again when the cluster comes back.
        cluster.kill_member(behind)
        workload.wait_for_acks(100, 30)
    finally:
        workload.stop()
    try:
        assert backup is not None
        for member in (leader, other):
            cluster.kill_member(member)
        # The backup queries (unanswered) while it still records the live
        # log, then the recording ends: the image of the replay times out.
        wait_for(
            lambda: (
                backup.counter(protocol.CLUSTER_BACKUP_STATE_TYPE_ID) == ClusterBackupState.BACKUP_QUERY
                and len(backup.counters(RECORDING_POSITION_TYPE_ID)) == 1
            ),
            10,
            f"the backup to query while it records the live log: {backup.output()[-2000:]}",
        )
        wait_for(
            lambda: not backup.counters(RECORDING_POSITION_TYPE_ID),
            30,
            f"the backup's live log recording to stop: {backup.output()[-2000:]}",
        )
        cluster.start([leader, behind])
        assert wait_for_leader(cluster, 30).member == leader
        cluster.start([other])
        workload = CounterWorkload(cluster).start()
        try:
            workload.wait_for_acks(100, 60)
        finally:
            workload.stop()
        position = member_view(cluster, leader).commit_position
        assert position is not None
        wait_for_commit(cluster, list(range(cluster.size)), position, 30)
        wait_for(
            lambda: backup.counter(CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID) >= position,
            30,
            f"the backup's live log to reach {position}: {backup.output()[-3000:]}",
        )
        assert backup_log(backup, position) == log_frames(cluster, leader, position)
    finally:
        if backup is not None:
            backup.close()


def test_a_cluster_restored_from_the_backup_holds_every_acknowledged_write(cluster: LocalCluster) -> None:
    """The restore procedure of docs/backup-and-restore.md: the backup is stopped, every member
    is killed and its archive and cluster directories deleted; each member gets
    a copy of the backup's archive and cluster directories and starts: it
    loads the snapshot, replays the log after it, and the cluster elects a
    leader and serves the counter every acknowledged write made."""
    workload = CounterWorkload(cluster).start()
    backup: Backup | None = None
    try:
        workload.wait_for_acks(150, 30)
        print(cluster_commands.cluster_operate(cluster.base, "snapshot", 30))
        backup = Backup(cluster)
        workload.wait_for_acks(150, 30)
        wait_for(
            lambda: backup.counter(protocol.CLUSTER_BACKUP_STATE_TYPE_ID) == ClusterBackupState.BACKING_UP,
            30,
            f"the backup to be BACKING_UP: {backup.output()[-2000:]}",
        )
    finally:
        workload.stop()
    try:
        assert backup is not None
        final = read_counter(cluster.connect_client())
        workload.check(final)
        leader = wait_for_leader(cluster, 30).member
        position = member_view(cluster, leader).commit_position
        assert position is not None
        wait_for(
            lambda: backup.counter(CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID) >= position,
            30,
            f"the backup's live log to reach {position}: {backup.output()[-3000:]}",
        )
        for process in reversed(backup.processes):
            assert process.stop(15) == 0, process.output()[-2000:]
        backup.processes.clear()
        for client in list(cluster.clients):
            client.close()
            cluster.clients.remove(client)
        for member in range(cluster.size):
            cluster.kill_member(member)
            shutil.rmtree(cluster.archive_dir(member))
            shutil.rmtree(cluster.cluster_dir(member))
            shutil.copytree(backup.archive_dir, cluster.archive_dir(member))
            shutil.copytree(backup.cluster_dir, cluster.cluster_dir(member))
        cluster.start()
        wait_for_leader(cluster, 30)
        assert read_counter(cluster.connect_client()) == final
    finally:
        if backup is not None:
            backup.close()


def _wait_line(path: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> str:
    def seen() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}: {path.read_text()[-3000:]}")
        return text in path.read_text()

    wait_for(seen, timeout_s, f"{text!r} in {path}")
    return path.read_text()


def test_cluster_node_backup_local_runs_beside_a_local_cluster_and_cluster_tool_shows_it() -> None:
    """``cluster-node start --local 3 --dir BASE`` and ``cluster-node backup
    --local BASE``: the backup's three processes start in order, list-members
    shows it beside the members with its state and live log position,
    describe shows its counters, and SIGTERM stops it cleanly."""
    base = Path(tempfile.mkdtemp(prefix="fulmar-backup-local-"))
    command = [sys.executable, "-m", "fulmar.cli.cluster_node"]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        cluster_out = base / "cluster.out"
        with open(cluster_out, "wb") as out:
            processes.append(
                subprocess.Popen(
                    [
                        *command,
                        "start",
                        "--local",
                        "3",
                        "--dir",
                        str(base),
                        "--consensus-startup-canvass-timeout",
                        "2s",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    process_group=0,
                )
            )
        _wait_line(cluster_out, "local cluster ready", processes[0], 60)
        backup_out = base / "backup.out"
        with open(backup_out, "wb") as out:
            processes.append(
                subprocess.Popen(
                    [*command, "backup", "--local", str(base)], stdout=out, stderr=subprocess.STDOUT, process_group=0
                )
            )
        _wait_line(backup_out, "cluster backup ready", processes[1], 60)
        assert (base / "backup" / "backup.toml").exists()

        def listed() -> str:
            result = subprocess.run(
                [sys.executable, "-m", "fulmar.cli.cluster_tool", "list-members", "--dir", str(base)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            return result.stdout

        wait_for(lambda: "BACKUP BACKING_UP" in listed(), 30, "list-members to show the backup BACKING_UP")
        row = next(line for line in listed().splitlines() if line.startswith("backup"))
        assert "(a backup: live log position)" in row
        described = subprocess.run(
            [sys.executable, "-m", "fulmar.cli.cluster_tool", "describe", "--dir", str(base / "backup")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert described.returncode == 0, described.stdout + described.stderr
        assert "cluster backup in" in described.stdout and "state BACKING_UP" in described.stdout
        processes[1].send_signal(signal.SIGTERM)
        assert processes[1].wait(60) == 0, backup_out.read_text()[-3000:]
        assert "cluster backup stopped cleanly" in backup_out.read_text()
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)
        for directory in Path("/dev/shm").glob(f"fulmar-*-{base.name}-*"):
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def test_cluster_node_backup_names_what_its_configuration_lacks(tmp_path: Path) -> None:
    config = tmp_path / "backup.toml"
    config.write_text('[backup]\ndir = "b"\ncatchup_endpoint = "127.0.0.1:9999"\n')
    result = CliRunner().invoke(cluster_node.backup, ["--config", str(config)])
    assert result.exit_code == 2
    assert "[backup] cluster_consensus_endpoints is required" in result.output
    result = CliRunner().invoke(cluster_node.backup, [])
    assert result.exit_code == 2 and "give --config FILE or --local BASE" in result.output
    result = CliRunner().invoke(cluster_node.backup, ["--local", str(tmp_path)])
    assert result.exit_code == 2 and "no local cluster's configuration" in result.output


def test_a_backup_of_a_cluster_of_one_retrieves_its_snapshot_and_follows_its_log() -> None:
    """A cluster of one named in a members string has a consensus endpoint
    too: its BackupQuery is answered there (it opened no consensus stream,
    so the backup waited forever), and the backup then holds its log."""
    with LocalCluster(1, COUNTER_SERVICE) as single:
        single.start()
        wait_for_leader(single, 30)
        workload = CounterWorkload(single).start()
        backup: Backup | None = None
        try:
            workload.wait_for_acks(100, 30)
            print(cluster_commands.cluster_operate(single.base, "snapshot", 30))
            workload.wait_for_acks(50, 30)
            backup = Backup(single)
            wait_for(
                lambda: backup.counter(protocol.CLUSTER_BACKUP_STATE_TYPE_ID) == ClusterBackupState.BACKING_UP,
                30,
                f"the backup to be BACKING_UP: {backup.output()[-2000:]}",
            )
            assert backup.counter(CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID) == 1
            workload.wait_for_acks(50, 30)
            workload.stop()
            position = member_view(single, 0).commit_position
            assert position is not None
            wait_for(
                lambda: backup.counter(CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID) >= position,
                30,
                f"the backup's live log to reach {position}: {backup.output()[-3000:]}",
            )
            assert backup_log(backup, position) == log_frames(single, 0, position)
        finally:
            workload.stop()
            if backup is not None:
                backup.close()
