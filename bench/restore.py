"""How long a three-member cluster takes to come back from a cluster backup,
from its snapshot and from its whole log.

A local three-member cluster (``cluster-node start --local 3``) runs
``CounterService``; a cluster backup (``cluster-node backup --local``)
follows it.  A client sends N increments (1000 in flight), the cluster takes
a snapshot, and 10,000 more increments follow it.  Once the backup holds the
whole committed log, the backup and the cluster stop, and the cluster is
restored twice by the procedure of docs/backup-and-restore.md (every member's ``archive/`` and
``cluster/`` replaced by copies of the backup's, then ``cluster-node start
--config`` on each):

- from its snapshot: each member loads the snapshot and replays the 10,000
  messages after it;
- from its whole log: the same copies with the snapshot entries of
  ``recording.log`` marked invalid, so each member replays all N + 10,000.

Each time is from the first start command to the first read that returns the
counter's final value (a leader elected, its service recovered, a client
session opened).  The reference of the snapshot row is the whole-log row
(ratio = snapshot / whole log).
"""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path
from typing import Any

from bench.cluster import _wait_doorbell
from bench.cluster3 import SHM_PARENT, LocalCluster, Supervised, _wait
from fulmar.aeron import Aeron
from fulmar.cli.cluster_commands import ClusterNode, ClusterReadError, cluster_member_node, cluster_operate
from fulmar.clock import epoch_ms
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog
from fulmar.errors import FulmarError

SERVICE = "fulmar.service.samples:CounterService"
MESSAGES = 1_000_000
QUICK_MESSAGES = 100_000
AFTER_SNAPSHOT = 10_000
WINDOW = 1000
MEMBERS = 3
EGRESS_CHANNEL = "aeron:udp?endpoint=127.0.0.1:0"
STEP_TIMEOUT_S = 300
_VALUE = struct.Struct("<q")


def _connect(
    aeron: Aeron, cluster: LocalCluster, on_message: Any = None, timeout_ns: int = 30_000_000_000
) -> ClusterClient:
    assert cluster.ingress_endpoints is not None
    return ClusterClient.connect(
        aeron,
        cluster.ingress_channel,
        cluster.ingress_endpoints,
        egress_channel=EGRESS_CHANNEL,
        message_timeout_ns=timeout_ns,
        on_message=on_message,
    )


def increment(aeron: Aeron, cluster: LocalCluster, count: int) -> int:
    """``count`` increments with WINDOW in flight; the counter's value after the last."""
    replies = [0]
    last = [0]

    def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
        replies[0] += 1
        last[0] = _VALUE.unpack_from(payload, 0)[0]

    client = _connect(aeron, cluster, on_message)
    try:
        sent = 0
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while replies[0] < count:
            progress = 0
            while sent < count and sent - replies[0] < WINDOW:
                if client.offer(b"+") > 0:
                    sent += 1
                    progress += 1
                else:
                    break
            progress += client.poll_egress(256)
            if not progress:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{replies[0]} of {count} increments answered after {STEP_TIMEOUT_S} s")
                _wait_doorbell(aeron, client, 1_000_000)
    finally:
        client.close()
    return last[0]


def read_value(aeron: Aeron, cluster: LocalCluster) -> int | None:
    """The counter's value, or None while the cluster cannot answer."""
    try:
        client = _connect(aeron, cluster, timeout_ns=2_000_000_000)  # short: the time to answer is measured
    except FulmarError:
        return None
    try:
        return int(_VALUE.unpack_from(client.request(b"?", timeout_s=5), 0)[0])
    except FulmarError:
        return None
    finally:
        client.close()


def _stop_all(cluster: LocalCluster) -> None:
    """Every node stopped (SIGTERM, in order), its files kept."""
    for supervised in cluster.supervisors:
        if supervised.alive:
            supervised.stop(120)
    cluster.supervisors = [s for s in cluster.supervisors if s.alive]
    cluster.restarted.clear()


def _restore(cluster: LocalCluster, backup_dir: Path, whole_log: bool) -> None:
    """The restore procedure (docs/backup-and-restore.md): each member's archive/ and cluster/ become copies of the backup's."""
    for member in range(MEMBERS):
        node = cluster.base / f"node{member}"
        for name in ("archive", "cluster"):
            shutil.rmtree(node / name, ignore_errors=True)
            shutil.copytree(backup_dir / name, node / name)
        if whole_log:
            log = RecordingLog.open(node / "cluster", create=False)
            try:
                for entry in list(log.entries):
                    if entry.is_valid_snapshot:
                        log.invalidate_entry(entry.entry_index)
            finally:
                log.close()


def _timed_start(aeron: Aeron, cluster: LocalCluster, expected: int) -> float:
    started = time.monotonic()
    for member in range(MEMBERS):
        config = cluster.base / f"node{member}" / "node.toml"
        cluster.restarted[member] = cluster._supervise(["--config", str(config)], f"restore-node{member}.log")

    def answered() -> bool:
        value = read_value(aeron, cluster)
        if value is not None and value != expected:
            raise AssertionError(f"the restored cluster's counter is {value}, not {expected}")
        return value == expected

    _wait("the restored cluster to answer", STEP_TIMEOUT_S, answered, 0.05, cluster.describe)
    return time.monotonic() - started


def _backup_logs(cluster: LocalCluster, lines: int = 30) -> str:
    tails = [f"backup at {_backup_position(cluster)}"]
    for log in sorted((cluster.base / "backup" / "logs").glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        tails.append(f"--- backup/logs/{log.name}:\n" + "\n".join(text))
    return "\n".join(tails) + "\n" + cluster.describe()


def _backup_position(cluster: LocalCluster) -> int:
    try:
        state = cluster_member_node(ClusterNode("backup", cluster.base / "backup" / "cluster"), epoch_ms())
    except ClusterReadError:
        return -1
    backup = state["backup"]
    return -1 if backup is None or backup["live_log_position"] is None else int(backup["live_log_position"])


def run(quick: bool) -> list[dict[str, Any]]:
    messages = QUICK_MESSAGES if quick else MESSAGES
    cluster = LocalCluster(service=SERVICE)
    backup: Supervised | None = None
    try:
        assert cluster.client_driver is not None
        with Aeron.connect(cluster.client_driver_dir) as aeron:
            backup = Supervised(["--local", str(cluster.base)], cluster.base / "backup-command.log", command="backup")
            _wait(
                "the cluster backup to start", 60, lambda: "cluster backup ready" in backup.output(), 0.05, backup.tail
            )
            began = time.monotonic()
            value = increment(aeron, cluster, messages)
            written_s = time.monotonic() - began
            print(
                f"bench.restore: {messages:,} increments in {written_s:.1f} s; "
                f"{cluster_operate(cluster.base, 'snapshot', 120)}",
                flush=True,
            )
            expected = increment(aeron, cluster, AFTER_SNAPSHOT)
            assert expected == value + AFTER_SNAPSHOT, (value, expected)
            leader = cluster.wait_for_leader()
            commit = int(leader["commit_position"])
            _wait(
                f"the backup to hold the log to {commit}",
                STEP_TIMEOUT_S,
                lambda: _backup_position(cluster) >= commit,
                0.1,
                lambda: _backup_logs(cluster),
            )
            backup.stop(60)
            backup_dir = cluster.base / "backup"
            _stop_all(cluster)
            _restore(cluster, backup_dir, whole_log=False)
            from_snapshot_s = _timed_start(aeron, cluster, expected)
            _stop_all(cluster)
            _restore(cluster, backup_dir, whole_log=True)
            whole_log_s = _timed_start(aeron, cluster, expected)
        print(
            f"bench.restore: log of {commit:,} bytes; restored from the snapshot in {from_snapshot_s:.1f} s, "
            f"from the whole log in {whole_log_s:.1f} s",
            flush=True,
        )
    finally:
        if backup is not None and backup.alive:
            backup.stop(60)
        backup_driver_dirs = list(Path(SHM_PARENT).glob(f"fulmar-*-{cluster.base.name}-*-backup"))
        cluster.close()
        for directory in backup_driver_dirs:
            shutil.rmtree(directory, ignore_errors=True)
    name = f"restore 3 nodes from a backup of {messages:,} messages"
    return [
        {
            "name": f"{name}: from its snapshot",
            "value": from_snapshot_s,
            "unit": "s",
            "reference": whole_log_s,
            "reference_kind": "whole_log",
        },
        {"name": f"{name}: replaying the whole log", "value": whole_log_s, "unit": "s", "reference": None},
    ]
