"""``cluster-tool cluster``: describe, pid, list-members, is-leader,
recording-log, errors, mark-file, counters and the operations (snapshot,
suspend, resume, shutdown, abort) of Aeron's ClusterTool.

The live cases run a one-member cluster of real processes (driver, archive,
consensus module, service container) on loopback and operate it through the
tool; then they read the stopped node's files.  The offline cases build
cluster directories with the consensus module's own classes.  Every wait is
bounded; every process is reaped by ``SingleNodeCluster.close``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fulmar.cli import cluster_commands, cluster_tool
from fulmar.cnc import CncFile
from fulmar.codecs.generated.cluster_mark import ClusterComponentType
from fulmar.consensus.agent import ControlToggle
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.mark_file import ClusterMarkFile
from fulmar.consensus.protocol import CLUSTER_CONTROL_TOGGLE_TYPE_ID as CONTROL_TOGGLE
from fulmar.consensus.recording_log import RecordingLog
from support.cluster import SingleNodeCluster
from support.driver import wait_for

COUNTER_SERVICE = "fulmar.service.samples:CounterService"
TIMEOUT_S = 30.0


def tool(*args: str) -> Result:
    return CliRunner().invoke(cluster_tool.main, ["cluster", *args])


def tool_json(*args: str) -> tuple[int, Any]:
    result = tool(*args, "--json")
    assert "Traceback" not in result.output, result.output
    return result.exit_code, json.loads(result.stdout)


def one_line_error(result: Result, *fragments: str, code: int = 1) -> None:
    """Exit ``code`` with a single ``cluster-tool: ...`` line on stderr naming the problem."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cluster-tool: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def digest(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file's SHA-256 and mtime: what a read command must not change."""
    return {
        path.name: (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
        for path in sorted(directory.iterdir())
        if path.is_file()
    }


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_until_leader(directory: Path) -> None:
    """The processes print "ready" before the election ends: wait for LEADER and ACTIVE."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        code, document = tool_json("list-members", "--dir", str(directory))
        member = document["nodes"][0]
        if code == 0 and member["leader"] and member["module_state_name"] == "ACTIVE":
            return
        assert time.monotonic() < deadline, f"no ACTIVE leader within {TIMEOUT_S} s: {member}"
        time.sleep(0.02)


@pytest.fixture
def cluster_of() -> Iterator[Any]:
    clusters: list[SingleNodeCluster] = []

    def start(service: str = COUNTER_SERVICE) -> SingleNodeCluster:
        cluster = SingleNodeCluster(service)
        clusters.append(cluster)
        cluster.start()
        wait_until_leader(cluster.base)
        return cluster

    yield start
    for cluster in clusters:
        cluster.close()


class Replies:
    """A client whose replies are collected, so that "no reply" can be checked for a while."""

    def __init__(self, cluster: SingleNodeCluster) -> None:
        self.values: list[int] = []
        self.client = ClusterClient.connect(
            cluster.connect(),
            cluster.ingress_channel,
            egress_channel="aeron:udp?endpoint=127.0.0.1:0",
            message_timeout_ns=20_000_000_000,
            on_message=lambda session_id, timestamp, payload: self.values.append(struct.unpack_from("<q", payload)[0]),
        )

    def send(self, payload: bytes) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while self.client.offer(payload) <= 0:
            self.client.poll_egress()
            assert time.monotonic() < deadline, "ingress back pressured for 30 s"
            time.sleep(0.001)

    def poll_for(self, seconds: float, until: int | None = None) -> None:
        """Poll the egress for ``seconds``, or until ``until`` replies arrived."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (until is None or len(self.values) < until):
            if not self.client.poll_egress():
                time.sleep(0.002)

    def close(self) -> None:
        self.client.close()


# ---------------------------------------------------------------------- a running node


@pytest.mark.system
@pytest.mark.system
def test_read_commands_on_a_running_node(cluster_of: Any, tmp_path: Path) -> None:
    cluster = cluster_of()
    assert cluster.consensus is not None and cluster.service is not None
    pid = cluster.consensus.process.pid
    node_dir = str(cluster.base)

    def described_after_first_commit() -> Any:
        # The module is ready before its archive has recorded (and so committed)
        # the term's first event: wait for that, bounded, rather than race it.
        code, document = tool_json("describe", "--dir", node_dir)
        assert code == 0, document
        counters = document["nodes"][0].get("counters") or {}
        return document if (counters.get("commit_position") or 0) > 0 else None

    document = wait_for(described_after_first_commit, 10, "the node's first committed position", poll_s=0.05)
    assert document["layout"] == "node-dir"
    [node] = document["nodes"]
    assert node["running"] is True
    mark = node["mark_file"]
    assert (mark["pid"], mark["member_id"], mark["cluster_id"], mark["component_type"]) == (
        pid,
        0,
        0,
        "CONSENSUS_MODULE",
    )
    assert mark["activity_age_ms"] < 10_000 and mark["ingress_channel"] == cluster.ingress_channel
    counters = node["counters"]
    assert counters["module_state_name"] == "ACTIVE"
    assert counters["role_name"] == "LEADER"
    assert counters["election_state_name"] == "CLOSED"
    assert counters["control_toggle_name"] == "NEUTRAL"
    assert counters["leadership_term_id"] == 0 and counters["commit_position"] > 0
    assert counters["snapshot_count"] == 0 and counters["errors"] == 0
    assert node["recording_log"]["terms"] == 1 and node["recording_log"]["latest_snapshot"] is None
    [service] = node["services"]
    assert service["running"] and service["pid"] == cluster.service.process.pid
    assert service["service_name"] == COUNTER_SERVICE

    text = tool("describe", "--dir", node_dir)
    assert text.exit_code == 0, text.output
    assert "ACTIVE, role LEADER, election CLOSED, control toggle NEUTRAL" in text.stdout

    # The same verbs at the top level, as in Aeron's ClusterTool; errors and
    # counters given a node's directory answer for the node, not a driver.
    top = CliRunner().invoke(cluster_tool.main, ["describe", "--dir", node_dir])
    assert top.exit_code == 0 and "ACTIVE, role LEADER, election CLOSED" in top.stdout, top.output
    top = CliRunner().invoke(cluster_tool.main, ["counters", "--dir", node_dir, "--json"])
    assert top.exit_code == 0, top.output
    assert {c["type_id"] for c in json.loads(top.stdout)["nodes"][0]["counters"]} >= {200, 201, 203}
    top = CliRunner().invoke(cluster_tool.main, ["errors", "--dir", node_dir, "--json"])
    assert top.exit_code == 0 and "nodes" in json.loads(top.stdout), top.output
    top = CliRunner().invoke(cluster_tool.main, ["pid", "--dir", node_dir])
    assert top.exit_code == 0 and top.stdout.strip() == str(pid)
    assert f"pid             {pid} (running)" in text.stdout

    # The cluster directory itself names the same node.
    code, document = tool_json("describe", "--dir", str(cluster.cluster_dir))
    assert code == 0 and document["layout"] == "cluster-dir"
    assert document["nodes"][0]["mark_file"]["pid"] == pid

    result = tool("pid", "--dir", node_dir)
    assert (result.exit_code, result.stdout) == (0, f"{pid}\n")
    code, document = tool_json("pid", "--dir", node_dir)
    assert (code, document["nodes"][0]["pid"]) == (0, pid)

    code, document = tool_json("list-members", "--dir", node_dir)
    assert code == 0
    [member] = document["nodes"]
    assert (member["member_id"], member["role_name"], member["leader"]) == (0, "LEADER", True)
    assert member["ingress_channel"] == cluster.ingress_channel and member["commit_position"] > 0
    assert document["leader"] == member["node"]
    result = tool("list-members", "--dir", node_dir)
    assert result.exit_code == 0 and "LEADER" in result.stdout and cluster.ingress_channel in result.stdout

    result = tool("is-leader", "--dir", node_dir)
    assert result.exit_code == 0 and "leader (member 0, term 0)" in result.stdout
    code, document = tool_json("is-leader", "--dir", node_dir)
    assert code == 0 and document["nodes"][0]["leader"] is True

    code, document = tool_json("counters", "--dir", node_dir)
    assert code == 0
    by_type = {counter["type_id"]: counter for counter in document["nodes"][0]["counters"]}
    assert by_type[201]["value"] == 2 and by_type[202]["value"] == 1 and by_type[200]["value"] == 1
    # Aeron's cluster range, and fulmar's own cluster counters (sessions, timers, invalid
    # requests, consensus messages refused; no follower's append position on a member alone)
    assert all(200 <= type_id < 250 or type_id in (1200, 1201, 1202, 1204) for type_id in by_type)
    assert {1200, 1201, 1202} <= set(by_type)

    code, document = tool_json("errors", "--dir", node_dir)
    assert code == 0
    files = document["nodes"][0]["files"]
    assert [file["component"] for file in files] == ["consensus module", "service 0"]
    assert all(file["errors"] == [] for file in files)

    code, document = tool_json("mark-file", "--dir", node_dir)
    assert code == 0
    module, service_mark = document["nodes"][0]["files"]
    assert (module["component_type"], module["pid"], module["running"]) == ("CONSENSUS_MODULE", pid, True)
    assert (service_mark["component_type"], service_mark["service_id"]) == ("CONTAINER", 0)
    assert module["aeron_directory"] == str(cluster.driver_dir)

    # The base of a local cluster: node0 is this node.
    base = tmp_path / "base"
    base.mkdir()
    (base / "node0").symlink_to(cluster.base, target_is_directory=True)
    code, document = tool_json("list-members", "--dir", str(base))
    assert code == 0 and document["layout"] == "base" and document["leader"] == "node0"
    result = tool("describe", "--dir", str(base))
    assert result.exit_code == 0 and result.stdout.startswith("node0 (")


@pytest.mark.system
@pytest.mark.system
def test_snapshot_then_shutdown(cluster_of: Any, tmp_path: Path) -> None:
    cluster = cluster_of()
    assert cluster.consensus is not None
    replies = Replies(cluster)
    try:
        replies.send(b"+")
        replies.poll_for(TIMEOUT_S, until=1)
        assert replies.values == [1]

        # Through the base of a local cluster: the tool finds the leader itself.
        base = tmp_path / "base"
        base.mkdir()
        (base / "node0").symlink_to(cluster.base, target_is_directory=True)
        result = tool("snapshot", "--dir", str(base))
        assert result.exit_code == 0, result.output
        assert "snapshot taken by node0" in result.stdout and "snapshot count 0 -> 1" in result.stdout

        code, document = tool_json("recording-log", "--dir", str(cluster.base))
        assert code == 0
        entries = document["nodes"][0]["entries"]
        assert [entry["type"] for entry in entries] == ["TERM", "SNAPSHOT", "SNAPSHOT"]
        service_snapshot, module_snapshot = entries[1:]
        assert (service_snapshot["service_id"], module_snapshot["service_id"]) == (0, -1)
        assert service_snapshot["log_position"] == module_snapshot["log_position"] > 0
        assert all(entry["valid"] for entry in entries)
        code, document = tool_json("describe", "--dir", str(cluster.base))
        counters = document["nodes"][0]["counters"]
        assert (counters["snapshot_count"], counters["control_toggle_name"]) == (1, "NEUTRAL")
        assert document["nodes"][0]["recording_log"]["latest_snapshot"]["index"] == 2
        result = tool("resume", "--dir", str(cluster.base))
        one_line_error(result, "ACTIVE", "not SUSPENDED")  # refused: the toggle is left alone

        # The service still answers after the snapshot.
        replies.send(b"+")
        replies.poll_for(TIMEOUT_S, until=2)
        assert replies.values == [1, 2]
    finally:
        replies.close()

    result = tool("shutdown", "--dir", str(cluster.base), "--timeout", str(TIMEOUT_S))
    assert result.exit_code == 0, result.output
    assert "exited" in result.stdout
    assert cluster.consensus.process.wait(TIMEOUT_S) == 0
    assert "consensus module stopped: SHUTDOWN at log position" in cluster.consensus.output()
    assert cluster.service is not None and cluster.service.process.wait(TIMEOUT_S) == 0

    # The stopped node's files.
    before = digest(cluster.cluster_dir)
    # Stopped: every read command still shows the files whole, and exits 3 (not running).
    code, document = tool_json("recording-log", "--dir", str(cluster.base))
    assert code == 3
    entries = document["nodes"][0]["entries"]
    assert [entry["type"] for entry in entries] == ["TERM"] + ["SNAPSHOT"] * 4
    assert entries[0]["log_position"] == entries[-1]["log_position"] > 0  # the term ends at the last snapshot
    result = tool("recording-log", "--dir", str(cluster.base))
    assert result.exit_code == 3 and "5 entries in" in result.stdout

    code, document = tool_json("mark-file", "--dir", str(cluster.base))
    assert code == 3
    module = document["nodes"][0]["files"][0]
    assert module["running"] is False and module["state"] == "not running (closed cleanly)"

    code, document = tool_json("describe", "--dir", str(cluster.base))
    assert code == 3
    node = document["nodes"][0]
    assert node["running"] is False and node["counters"] is None
    assert node["recording_log"]["snapshots"] == 4
    result = tool("describe", "--dir", str(cluster.base))
    assert result.exit_code == 3 and "not running (closed cleanly)" in result.stdout

    code, document = tool_json("errors", "--dir", str(cluster.base))
    assert code == 3 and all(file["errors"] == [] for file in document["nodes"][0]["files"])
    assert tool("pid", "--dir", str(cluster.base)).exit_code == 3
    assert tool("is-leader", "--dir", str(cluster.base)).exit_code == 3
    assert tool("list-members", "--dir", str(cluster.base)).exit_code == 3
    one_line_error(tool("snapshot", "--dir", str(cluster.base)), "not running", code=3)
    assert digest(cluster.cluster_dir) == before  # read commands write nothing


@pytest.mark.system
@pytest.mark.system
def test_suspend_holds_requests_until_resume(cluster_of: Any) -> None:
    cluster = cluster_of()
    replies = Replies(cluster)
    try:
        replies.send(b"+")
        replies.poll_for(TIMEOUT_S, until=1)
        assert replies.values == [1]

        result = tool("suspend", "--dir", str(cluster.base))
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("suspended ")
        code, document = tool_json("describe", "--dir", str(cluster.base))
        counters = document["nodes"][0]["counters"]
        assert (counters["module_state_name"], counters["control_toggle_name"]) == ("SUSPENDED", "NEUTRAL")
        # Suspended: the request waits in the ingress, unanswered.
        replies.send(b"+")
        replies.poll_for(1.5)
        assert replies.values == [1]
        # Refused, saying why, and the toggle is left alone.
        one_line_error(tool("suspend", "--dir", str(cluster.base)), "SUSPENDED", "not ACTIVE")
        one_line_error(tool("snapshot", "--dir", str(cluster.base)), "SUSPENDED", "not ACTIVE")
        one_line_error(tool("shutdown", "--dir", str(cluster.base)), "SUSPENDED", "not ACTIVE")
        # The toggle is not NEUTRAL (a SNAPSHOT request the suspended module leaves pending): the
        # compare-and-set fails and the tool says what the toggle holds.
        with CncFile.open(cluster.driver_dir) as cnc:
            counters_in_cnc = cluster_commands.ModuleCounters(cnc, 0)
            # INACTIVE: a value the module leaves alone, so the refusal is the tool's, deterministically.
            assert counters_in_cnc.compare_and_set(CONTROL_TOGGLE, ControlToggle.NEUTRAL, ControlToggle.INACTIVE)
            one_line_error(tool("resume", "--dir", str(cluster.base)), "control toggle is INACTIVE, not NEUTRAL")
            assert counters_in_cnc.compare_and_set(CONTROL_TOGGLE, ControlToggle.INACTIVE, ControlToggle.NEUTRAL)

        result = tool("resume", "--dir", str(cluster.base))
        assert result.exit_code == 0, result.output
        code, document = tool_json("describe", "--dir", str(cluster.base))
        counters = document["nodes"][0]["counters"]
        assert (counters["module_state_name"], counters["control_toggle_name"]) == ("ACTIVE", "NEUTRAL")
        replies.poll_for(10, until=2)
        assert replies.values == [1, 2]  # the held request is answered
        replies.send(b"+")
        replies.poll_for(TIMEOUT_S, until=3)
        assert replies.values == [1, 2, 3]
    finally:
        replies.close()


@pytest.mark.system
@pytest.mark.system
def test_abort_stops_without_a_snapshot(cluster_of: Any) -> None:
    cluster = cluster_of()
    assert cluster.consensus is not None
    result = tool("abort", "--dir", str(cluster.cluster_dir), "--timeout", str(TIMEOUT_S))
    assert result.exit_code == 0, result.output
    assert cluster.consensus.process.wait(TIMEOUT_S) == 0
    assert "consensus module stopped: ABORT at log position" in cluster.consensus.output()
    code, document = tool_json("recording-log", "--dir", str(cluster.cluster_dir))
    assert code == 3  # stopped
    assert [entry["type"] for entry in document["nodes"][0]["entries"]] == ["TERM"]


# ---------------------------------------------------------------------- offline files


def write_node(cluster_dir: Path, *, errors: tuple[str, ...] = (), service_errors: tuple[str, ...] = ()) -> None:
    """A stopped node's cluster directory: mark files (closed cleanly) and a recording log."""
    cluster_dir.mkdir(parents=True)
    with ClusterMarkFile.create(
        cluster_dir,
        ClusterComponentType.CONSENSUS_MODULE,
        pid=os.getpid(),
        member_id=0,
        cluster_id=7,
        now_ms=now_ms(),
        aeron_directory="/nonexistent/driver",
        ingress_channel="aeron:udp?endpoint=127.0.0.1:9010",
    ) as mark_file:
        log = mark_file.error_log(now_ms)
        for text in errors:
            log.record(text)
        mark_file.signal_ready()
    with ClusterMarkFile.create(
        cluster_dir,
        ClusterComponentType.CONTAINER,
        service_id=0,
        pid=os.getpid(),
        member_id=0,
        cluster_id=7,
        now_ms=now_ms(),
        service_name="Svc",
    ) as mark_file:
        log = mark_file.error_log(now_ms)
        for text in service_errors:
            log.record(text)
        mark_file.signal_ready()
    with RecordingLog.open(cluster_dir, fsync=False) as recording_log:
        recording_log.append_term(0, 0, 0, 1000)
        recording_log.append_snapshot(5, 0, 0, 4096, 2000, 0)
        recording_log.append_snapshot(6, 0, 0, 4096, 2000, -1)
        recording_log.append_term(0, 1, 8192, 3000)


def test_offline_node_files(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "node" / "cluster"
    write_node(
        cluster_dir,
        errors=("consensus module: boom", "consensus module: boom", "consensus module: bang"),
        service_errors=("service: oops",),
    )
    before = digest(cluster_dir)

    code, document = tool_json("recording-log", "--dir", str(tmp_path / "node"))
    assert code == 3  # read whole; no module runs
    entries = document["nodes"][0]["entries"]
    assert [
        (
            e["index"],
            e["type"],
            e["recording_id"],
            e["leadership_term_id"],
            e["term_base_log_position"],
            e["log_position"],
            e["timestamp"],
            e["service_id"],
            e["valid"],
        )
        for e in entries
    ] == [
        (0, "TERM", 0, 0, 0, 8192, 1000, -1, True),
        (1, "SNAPSHOT", 5, 0, 0, 4096, 2000, 0, True),
        (2, "SNAPSHOT", 6, 0, 0, 4096, 2000, -1, True),
        (3, "TERM", 0, 1, 8192, -1, 3000, -1, True),
    ]

    code, document = tool_json("describe", "--dir", str(cluster_dir))
    assert code == 3
    node = document["nodes"][0]
    assert node["node"] == "node"  # BASE/node/cluster is named after the node directory
    assert node["running"] is False and node["mark_file"]["cluster_id"] == 7
    assert node["recording_log"]["latest_term"]["leadership_term_id"] == 1
    assert node["recording_log"]["latest_snapshot"]["recording_id"] == 6
    assert node["mark_file"]["error_count"] == 2
    text = tool("describe", "--dir", str(cluster_dir))
    assert "latest snapshot term 0 recording 6 log position 4096" in text.stdout

    code, document = tool_json("errors", "--dir", str(cluster_dir))
    assert code == 3  # not running
    module, service = document["nodes"][0]["files"]
    assert [(e["observation_count"], e["text"]) for e in module["errors"]] == [
        (2, "consensus module: boom"),
        (1, "consensus module: bang"),
    ]
    assert [e["text"] for e in service["errors"]] == ["service: oops"]
    result = tool("errors", "--dir", str(cluster_dir))
    assert "consensus module: 2 distinct errors" in result.stdout and "service 0: 1 distinct error " in result.stdout

    result = tool("mark-file", "--dir", str(cluster_dir))
    assert result.exit_code == 3 and "CONSENSUS_MODULE" in result.stdout and "closed cleanly" in result.stdout

    # No driver any more: no counters to read (the node is stopped, exit 3), and nobody to operate.
    result = tool("counters", "--dir", str(cluster_dir))
    assert result.exit_code == 3 and "no counters: the consensus module is not running" in result.stdout
    assert "/nonexistent/driver" in result.stdout
    one_line_error(tool("snapshot", "--dir", str(cluster_dir)), "not running", code=3)
    assert tool("is-leader", "--dir", str(cluster_dir)).exit_code == 3
    assert digest(cluster_dir) == before


def test_base_of_a_local_cluster_lists_every_node(tmp_path: Path) -> None:
    for index in (0, 1, 10):
        write_node(tmp_path / f"node{index}" / "cluster")
    (tmp_path / "archive").mkdir()  # not a node
    code, document = tool_json("recording-log", "--dir", str(tmp_path))
    assert code == 3 and document["layout"] == "base"  # none runs
    assert [node["node"] for node in document["nodes"]] == ["node0", "node1", "node10"]
    # One node's recording log is corrupt: the others are still listed, exit 4 (before 3).
    log = tmp_path / "node1" / "cluster" / "recording.log"
    data = bytearray(log.read_bytes())
    data[44:48] = struct.pack("<i", 77)  # an unknown entry type, with whole records after it
    log.write_bytes(bytes(data))
    result = tool("recording-log", "--dir", str(tmp_path))
    assert result.exit_code == 4
    assert "node0 (" in result.stdout and "node10 (" in result.stdout and "corrupt entry at index 0" in result.stdout
    code, document = tool_json("pid", "--dir", str(tmp_path))
    assert code == 3 and [node["pid"] for node in document["nodes"]] == [os.getpid()] * 3


def test_bad_dir_exits_4(tmp_path: Path) -> None:
    for command in (
        "describe",
        "pid",
        "list-members",
        "is-leader",
        "recording-log",
        "errors",
        "mark-file",
        "counters",
        "snapshot",
        "suspend",
        "resume",
        "shutdown",
        "abort",
    ):
        one_line_error(tool(command, "--dir", str(tmp_path / "missing")), "no such directory", code=4)
        one_line_error(tool(command, "--dir", str(tmp_path)), "no cluster files", code=4)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    one_line_error(tool("describe", "--dir", str(a_file)), "not a directory", code=4)

    # A corrupt mark file, a corrupt recording log: exit 4 naming the file.
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    (cluster_dir / "cluster-mark.dat").write_bytes(b"\x07" * 100)
    one_line_error(tool("mark-file", "--dir", str(cluster_dir)), "cluster-mark.dat", "truncated", code=4)
    one_line_error(tool("describe", "--dir", str(cluster_dir)), "cluster-mark.dat", code=4)
    one_line_error(tool("snapshot", "--dir", str(cluster_dir)), "cluster-mark.dat", code=4)
    one_line_error(tool("recording-log", "--dir", str(cluster_dir)), "recording.log", "no recording log", code=4)
    write_node(tmp_path / "other")
    data = bytearray((tmp_path / "other" / "recording.log").read_bytes())
    data[0:8] = struct.pack("<q", -5)  # an impossible recording id, with whole records after it
    (cluster_dir / "recording.log").write_bytes(bytes(data))
    one_line_error(
        tool("recording-log", "--dir", str(cluster_dir)), "recording.log", "corrupt entry at index 0", code=4
    )


def test_a_torn_recording_log_tail_is_reported_not_repaired(tmp_path: Path) -> None:
    cluster_dir = tmp_path / "cluster"
    write_node(cluster_dir)
    log = cluster_dir / "recording.log"
    with open(log, "ab") as file:
        file.write(b"\x01" * 20)  # an append cut short
    before = log.read_bytes()
    code, document = tool_json("recording-log", "--dir", str(cluster_dir))
    assert code == 3 and len(document["nodes"][0]["entries"]) == 4  # read whole; no module runs
    assert "dropped 20 trailing bytes" in document["nodes"][0]["torn_tail"]
    assert log.read_bytes() == before


def test_help_documents_the_exit_codes() -> None:
    result = CliRunner().invoke(cluster_tool.main, ["cluster", "--help"])
    assert result.exit_code == 0
    for fragment in ("node0/", "Exit codes:", "is-leader", "not the leader", "cluster-mark.dat"):
        assert fragment in result.output
    result = CliRunner().invoke(cluster_tool.main, ["cluster", "snapshot", "--help"])
    assert "--timeout" in result.output and "NEUTRAL" in result.output
