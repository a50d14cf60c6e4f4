"""Several members: the consensus command's membership and election options,
``cluster-node start --local 3`` (generated configuration, supervision of
several nodes from one command) and the ``LocalCluster`` test harness.

Nothing here needs an election to work: the configuration is checked without
starting it, the supervision of several nodes runs nodes of one member each,
and the harness test starts drivers and archives only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from fulmar.aeron import Aeron
from fulmar.cli import cluster_node, cluster_tool, supervisor
from fulmar.consensus.cluster_member import parse_cluster_members
from support.cluster import LocalCluster
from support.driver import main_thread_wakes_per_second, wait_for
from support.node_start import all_gone, run_start, write_config

READY = re.compile(r"node (\d+) ready: ingress (\S+); driver directory (\S+); pids (.*?);")
MEMBERS = (
    "0,127.0.0.1:20110,127.0.0.1:20220,127.0.0.1:20330,127.0.0.1:20440,127.0.0.1:8010|"
    "1,127.0.0.1:21110,127.0.0.1:21220,127.0.0.1:21330,127.0.0.1:21440,127.0.0.1:8011|"
    "2,127.0.0.1:22110,127.0.0.1:22220,127.0.0.1:22330,127.0.0.1:22440,127.0.0.1:8012"
)


@pytest.fixture
def driver_dir() -> Iterator[Path]:
    path = (
        Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")
    ) / f"fulmar-test-local-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------- cluster-node consensus


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--cluster-members", "0,a"],
            "Invalid value for '--cluster-members': cluster member entry 0 ('0,a') has 2 fields",
        ),
        (["--cluster-members", MEMBERS.replace(":20220", ":0")], "consensus endpoint '127.0.0.1:0' needs a port"),
        (
            ["--cluster-members", MEMBERS, "--member-id", "3"],
            "Invalid value for '--member-id': 3 is not among the cluster members (ids 0, 1, 2)",
        ),
        (
            ["--cluster-members", MEMBERS, "--appointed-leader-id", "5"],
            "Invalid value for '--appointed-leader-id': 5 is not among the cluster members (ids 0, 1, 2)",
        ),
        (["--appointed-leader-id", "2"], "2 is not a member: without cluster members"),
        (["--appointed-leader-id", "-2"], "-2 is not in the range x>=-1"),
        (
            ["--leader-heartbeat-interval", "10s"],
            "Invalid value for '--leader-heartbeat-interval': 10s is not below the leader heartbeat timeout (10s)",
        ),
        (
            ["--election-status-interval", "1s"],
            "Invalid value for '--election-status-interval': 1s is not below the election timeout (1s)",
        ),
        (["--election-timeout", "10"], "a unit is required"),
        (["--startup-canvass-timeout", "0s"], "below the minimum of 1ms"),
    ],
)
def test_consensus_refuses_membership_and_timing_that_cannot_work(
    tmp_path: Path, args: list[str], message: str
) -> None:
    # Refused before the module touches the cluster directory or the driver.
    result = CliRunner().invoke(cluster_node.consensus, ["--cluster-dir", str(tmp_path / "cluster"), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not (tmp_path / "cluster").exists()


def test_the_new_consensus_options_are_mirrored_by_start(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "node.toml",
        tmp_path / "driver",
        free_port(),
        consensus={
            "cluster_members": MEMBERS,
            "election_timeout": "2s",
            "leader_heartbeat_timeout": "5s",
            "consensus_channel": "aeron:udp?term-length=128k",
        },
    )
    flags = {
        "consensus_appointed_leader_id": 1,
        "consensus_leader_heartbeat_interval": 250_000_000,
        "consensus_replication_channel": "aeron:udp?endpoint=127.0.0.1:0|mtu=8k",
    }
    resolved = supervisor.resolve_config(cluster_node._START_OPTIONS, flags, config)
    args = next(spec.args for spec in resolved.child_specs() if spec.log_name == "consensus")
    expected = {
        "--cluster-members": MEMBERS,
        "--election-timeout": "2s",
        "--leader-heartbeat-timeout": "5s",
        "--consensus-channel": "aeron:udp?term-length=128k",
        "--appointed-leader-id": "1",
        "--leader-heartbeat-interval": "250ms",
        "--replication-channel": "aeron:udp?endpoint=127.0.0.1:0|mtu=8k",
    }
    for flag, value in expected.items():
        assert args[args.index(flag) + 1] == value, flag
    # What the process gets, it accepts (its own parser, no module started).
    command = cluster_node.consensus
    context = command.make_context("consensus", list(args[1:]))
    assert context.params["cluster_members"] == MEMBERS and context.params["leader_heartbeat_interval"] == 250_000_000


@pytest.mark.parametrize(
    "consensus, node, message",
    [
        ({"cluster_members": "0,x"}, {}, "[consensus] cluster_members: cluster member entry 0 ('0,x') has 2 fields"),
        ({"cluster_members": MEMBERS}, {"member_id": 4}, "[node] member_id: 4 is not among the cluster members"),
        (
            {"cluster_members": MEMBERS, "appointed_leader_id": 9},
            {},
            "[consensus] appointed_leader_id: 9 is not among the cluster members",
        ),
        ({"leader_heartbeat_interval": "11s"}, {}, "[consensus] leader_heartbeat_interval: 11s is not below"),
    ],
)
def test_start_refuses_a_membership_that_cannot_work(
    tmp_path: Path, driver_dir: Path, consensus: dict[str, Any], node: dict[str, Any], message: str
) -> None:
    config = write_config(tmp_path / "node.toml", driver_dir, free_port(), consensus=consensus, node=node)
    result = run_start("--config", str(config))
    assert result.exit_code == supervisor.EXIT_CONFIG, result.output
    assert message in result.output, result.output


def test_start_refuses_a_member_whose_own_port_is_taken(tmp_path: Path, driver_dir: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        members = MEMBERS.replace("127.0.0.1:21220", f"127.0.0.1:{port}")  # member 1's consensus endpoint
        config = write_config(
            tmp_path / "node.toml",
            driver_dir,
            free_port(),
            consensus={"cluster_members": members},
            node={"member_id": 1},
        )
        result = run_start("--config", str(config))
    assert result.exit_code == supervisor.EXIT_CONFIG, result.output
    assert (
        f"{config}: [consensus] cluster_members (member 1's consensus endpoint): UDP port {port} on 127.0.0.1 is in use"
        in " ".join(result.output.split())
    ), result.output


# ---------------------------------------------------------------------- --local 3: the generated configuration


def free_port() -> int:
    return supervisor.free_udp_port()


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive free UDP ports."""
    for _ in range(100):
        first = free_port()
        if first + count - 1 > 65535:
            continue
        probes = []
        try:
            for port in range(first, first + count):
                probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError(f"no {count} consecutive free UDP ports")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[supervisor.NodeConfig], str]]:
    """``start --local N`` configures and validates, but runs nothing."""
    runs: list[tuple[list[supervisor.NodeConfig], str]] = []

    def run_local_cluster(configs: list[supervisor.NodeConfig], endpoints: str) -> int:
        runs.append((configs, endpoints))
        return 0

    monkeypatch.setattr(supervisor, "run_local_cluster", run_local_cluster)
    return runs


def test_local_three_generates_each_members_configuration(tmp_path: Path, captured: Any) -> None:
    base = tmp_path / "three"
    result = run_start("--local", "3", "--dir", str(base), "--consensus-session-timeout", "7s")
    assert result.exit_code == 0, result.output
    [(configs, endpoints)] = captured
    assert [config.member_id for config in configs] == [0, 1, 2]

    members_text = configs[0].values[("consensus", "cluster_members")]
    members = parse_cluster_members(members_text)
    assert [member.id for member in members] == [0, 1, 2]
    everything = [endpoint for member in members for endpoint in member.encode().split(",")[1:]]
    assert all(endpoint.startswith("127.0.0.1:") for endpoint in everything)
    assert len(set(everything)) == 15  # five distinct ports per member
    assert endpoints == ",".join(f"{m.id}={m.ingress_endpoint}" for m in members)

    shm = Path("/dev/shm") if os.path.isdir("/dev/shm") else None
    for config, member in zip(configs, members):
        i = member.id
        values = config.values
        assert config.node_dir == base / f"node{i}" and config.cluster_dir == base / f"node{i}" / "cluster"
        if shm:
            assert config.driver_dir.parent == shm
            assert re.fullmatch(
                rf"fulmar-{re.escape(supervisor.user_name())}-three-[0-9a-f]{{8}}-node{i}", config.driver_dir.name
            )
        else:
            assert config.driver_dir == base / f"node{i}" / "driver"
        assert values[("consensus", "cluster_members")] == members_text
        assert config.ingress_channel == f"aeron:udp?endpoint={member.ingress_endpoint}"
        assert values[("consensus", "log_channel")] == "aeron:udp?term-length=4m"
        assert values[("archive", "control_channel")] == f"aeron:udp?endpoint={member.archive_endpoint}"
        assert values[("archive", "replication_channel")] == "aeron:udp?endpoint=127.0.0.1:0"
        assert values[("consensus", "session_timeout")] == 7_000_000_000  # a flag applies to every member
        assert f"member {i}: ingress {member.ingress_endpoint}, node directory {base / f'node{i}'}" in result.output

        # node.toml starts the same member on its own.
        written = base / f"node{i}" / "node.toml"
        again = supervisor.resolve_config(cluster_node._START_OPTIONS, {}, written)
        assert again.member_id == i and again.driver_dir == config.driver_dir
        assert again.values == config.values
        args = {spec.log_name: spec.args for spec in again.child_specs()}
        assert args["consensus"][args["consensus"].index("--cluster-members") + 1] == members_text
        assert args["consensus"][args["consensus"].index("--member-id") + 1] == str(i)
        assert (
            args["archive"][args["archive"].index("--control-channel") + 1]
            == f"aeron:udp?endpoint={member.archive_endpoint}"
        )
    assert f"ingress endpoints: {endpoints}" in result.output


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="driver directories under /dev/shm")
def test_local_driver_directories_are_unique_per_base_directory(tmp_path: Path, captured: Any) -> None:
    """Two bases of the same name (/tmp/a/c3, /tmp/b/c3) get driver
    directories of their own, which keep the base's name, are the same for
    the same base however it is spelled, and stay within NAME_MAX."""
    for base in (
        tmp_path / "a" / "c3",
        tmp_path / "b" / "c3",
        tmp_path / "a" / ".." / "a" / "c3",
        tmp_path / ("x" * 200),
    ):
        result = run_start("--local", "3", "--dir", str(base))
        assert result.exit_code == 0, result.output
    a, b, a_again, long = ([config.driver_dir for config in configs] for configs, _ in captured)
    assert not set(a) & set(b), (a, b)
    assert a == a_again
    assert all("-c3-" in path.name for path in a + b)
    assert all(len(path.name) <= 255 and len(str(path)) < 4096 for path in long)


@pytest.mark.system
@pytest.mark.system
def test_a_taken_driver_directory_names_the_node_that_has_it(tmp_path: Path, driver_dir: Path) -> None:
    """The error names the node whose driver holds the directory: this one
    (already running) or another (whose cluster directory it gives)."""
    other = tmp_path / "other" / "node0" / "cluster"
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fulmar.cli.cluster_node",
            "driver",
            "--dir",
            str(driver_dir),
            "--stop-after",
            str(other),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert driver.stdout is not None
        wait_for(lambda: "media driver pid" in driver.stdout.readline(), 30, "the driver to be ready")
        config = write_config(tmp_path / "node.toml", driver_dir, free_port())
        result = run_start("--config", str(config))
        assert result.exit_code == supervisor.EXIT_CONFIG, result.output
        text = " ".join(result.output.split())
        assert f"in use by a live media driver (pid {driver.pid})" in text, text
        assert f"the node of {other.parent} (cluster directory {other})" in text, text
        assert "another --driver-dir" in text, text

        same = write_config(tmp_path / "same.toml", driver_dir, free_port(), node={"cluster_dir": str(other)})
        result = run_start("--config", str(same))
        assert result.exit_code == supervisor.EXIT_CONFIG, result.output
        assert f"this node (cluster directory {other}) is already running" in " ".join(result.output.split())
    finally:
        driver.terminate()
        try:
            driver.wait(30)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait(10)
        if driver.stdout is not None:
            driver.stdout.close()


def test_an_existing_local_cluster_starts_again_on_its_own_configuration(tmp_path: Path, captured: Any) -> None:
    """A second ``start --local 3 --dir BASE`` keeps every member's ports
    (its clients' endpoints) and settings; flags that contradict them, a
    different member count among them, are refused, naming the file."""
    base = tmp_path / "base"
    first = run_start("--local", "3", "--dir", str(base), "--consensus-session-timeout", "7s")
    assert first.exit_code == 0, first.output
    files = [base / f"node{i}" / "node.toml" for i in range(3)]
    written = [file.read_text() for file in files]
    again = run_start("--local", "3", "--dir", str(base))
    assert again.exit_code == 0, again.output
    (before, endpoints), (after, endpoints_again) = captured
    assert endpoints_again == endpoints
    assert "again, on its configuration in node<i>/node.toml" in again.output
    assert f"ingress endpoints: {endpoints}" in again.output
    for old, new in zip(before, after):
        assert new.values == old.values  # the members string, the archive endpoints, the 7s timeout
        assert (new.ingress_channel, new.driver_dir, new.node_dir) == (
            old.ingress_channel,
            old.driver_dir,
            old.node_dir,
        )
    assert [file.read_text() for file in files] == written

    same = run_start("--local", "3", "--dir", str(base), "--consensus-session-timeout", "7s")
    assert same.exit_code == 0, same.output  # a flag that agrees is no contradiction
    port = before[0].ingress_channel.rsplit(":", 1)[1]
    refused = [
        (["--local", "5"], "--local 5: " + f"{base} holds a local cluster of 3 members (node0..node2/node.toml)"),
        (["--local", "3", "--consensus-session-timeout", "9s"], "--consensus-session-timeout 9s: the local cluster"),
        (
            ["--local", "3", "--service", "fulmar.service.samples:EchoService"],
            "[service] service = fulmar.service.samples:KeyValueService",
        ),
        (
            ["--local", "3", "--ingress-port", str(int(port) + 1)],
            f"--ingress-port: member 0 of the local cluster under {base} runs with aeron:udp?endpoint=127.0.0.1:{port}",
        ),
    ]
    for args, message in refused:
        result = run_start(*args, "--dir", str(base))
        assert result.exit_code == supervisor.EXIT_CONFIG, result.output
        text = " ".join(result.output.split())
        assert message in text, text
        assert "choose another --dir for a new cluster" in text, text
    assert f"runs with [consensus] session_timeout = 7s ({files[0]})" in " ".join(
        run_start("--local", "3", "--dir", str(base), "--consensus-session-timeout", "9s").output.split()
    )
    assert len(captured) == 3  # nothing else started

    files[1].unlink()
    result = run_start("--local", "3", "--dir", str(base))
    assert result.exit_code == supervisor.EXIT_CONFIG and "node1 has no node.toml" in result.output, result.output


def test_local_ingress_port_is_member_zeros_and_counts_up(tmp_path: Path, captured: Any) -> None:
    first = consecutive_free_ports(5)
    result = run_start("--local", "5", "--dir", str(tmp_path / "five"), "--ingress-port", str(first))
    assert result.exit_code == 0, result.output
    [(configs, endpoints)] = captured
    assert endpoints == ",".join(f"{i}=127.0.0.1:{first + i}" for i in range(5))
    assert [config.ingress_channel for config in configs] == [
        f"aeron:udp?endpoint=127.0.0.1:{first + i}" for i in range(5)
    ]


def test_local_one_stays_a_single_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[supervisor.NodeConfig] = []

    def run_node(config: supervisor.NodeConfig) -> int:
        runs.append(config)
        return 0

    monkeypatch.setattr(supervisor, "run_node", run_node)
    result = run_start("--local", "1", "--dir", str(tmp_path / "one"))
    assert result.exit_code == 0, result.output
    [config] = runs
    assert ("consensus", "cluster_members") not in config.values
    assert config.values[("archive", "control_channel")] == "none"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--local", "4"], "--local 4: a local cluster has 1, 3 or 5 members"),
        (["--local", "0"], "--local 0: a local cluster has 1, 3 or 5 members"),
        (["--local", "3", "--member-id", "1"], "--member-id cannot be used with --local 3"),
        (["--local", "3", "--driver-dir", "/dev/shm/x"], "--driver-dir cannot be used with --local 3"),
        (
            ["--local", "5", "--consensus-ingress-channel", "aeron:udp?endpoint=127.0.0.1:9"],
            "--consensus-ingress-channel cannot be used with --local 5",
        ),
        (["--local", "3", "--consensus-cluster-members", MEMBERS], "--consensus-cluster-members cannot be used"),
        (["--local", "3", "--archive-control-channel", "none"], "--archive-control-channel cannot be used"),
        (["--local", "3", "--ingress-port", "65534"], "members 0..2 take ports 65534..65536, beyond 65535"),
        (
            ["--local", "3", "--consensus-appointed-leader-id", "3"],
            "member 0: [consensus] appointed_leader_id: 3 is not among the cluster members (ids 0, 1, 2)",
        ),
        (
            ["--local", "3", "--consensus-election-status-interval", "5s"],
            "member 0: [consensus] election_status_interval: 5s is not below the election timeout (1s)",
        ),
    ],
)
def test_local_cluster_configuration_errors(tmp_path: Path, captured: Any, args: list[str], message: str) -> None:
    result = run_start(*args, "--dir", str(tmp_path / "base"))
    assert result.exit_code == supervisor.EXIT_CONFIG, result.output
    assert message in result.output, result.output
    assert not captured


def test_local_cluster_names_the_member_whose_port_is_taken(tmp_path: Path, captured: Any) -> None:
    first = consecutive_free_ports(3)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", first + 2))
        result = run_start("--local", "3", "--dir", str(tmp_path / "base"), "--ingress-port", str(first))
    assert result.exit_code == supervisor.EXIT_CONFIG, result.output
    assert f"member 2: [consensus] ingress_channel: UDP port {first + 2} on 127.0.0.1 is in use" in result.output
    assert not captured


def test_help_documents_local_clusters() -> None:
    result = CliRunner().invoke(cluster_node.start, ["--local", "3", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--local 3 [--dir BASE] [--ingress-port P]" in text and "1, 3 or 5 members" in text
    for flag in (
        "--consensus-cluster-members",
        "--consensus-appointed-leader-id",
        "--consensus-election-timeout",
        "--consensus-election-status-interval",
        "--consensus-startup-canvass-timeout",
        "--consensus-leader-heartbeat-timeout",
        "--consensus-leader-heartbeat-interval",
        "--consensus-consensus-channel",
        "--consensus-replication-channel",
    ):
        assert flag in text, flag


def test_free_udp_ports_are_distinct_and_skip_the_excluded() -> None:
    excluded = [free_port()]
    ports = supervisor.free_udp_ports(25, exclude=excluded)
    assert len(set(ports)) == 25 and excluded[0] not in ports
    local = supervisor.allocate_local_ports(5)
    every = [
        port
        for member in local
        for port in (member.ingress, member.consensus, member.log, member.catchup, member.archive)
    ]
    assert len(set(every)) == 25


def test_chosen_ports_are_outside_the_kernels_ephemeral_range() -> None:
    # A port in that range can be taken by any port-0 bind (a driver's send
    # endpoint) between the choice and the node's own bind.
    low, high = supervisor.ephemeral_port_range()
    assert low - 10_000 >= 100, "this machine's ephemeral range leaves no room below it"
    for port in supervisor.free_udp_ports(100) + [supervisor.free_udp_port()]:
        assert 10_000 <= port < low or port > high, port


# ---------------------------------------------------------------------- several nodes from one command

# LocalClusterSupervisor over nodes of one member each (no members string):
# what is tested is the supervision of several nodes, not the cluster.
_RUN_NODES = """
import sys
from pathlib import Path
from fulmar.cli import cluster_node, cluster_tool, supervisor
base, ports = Path(sys.argv[1]), [int(port) for port in sys.argv[2:]]
configs = []
for member_id, port in enumerate(ports):
    layer = supervisor.local_layer(base, member_id, port)
    layer[("service", "service")] = supervisor.DEFAULT_LOCAL_SERVICE
    layer[("node", "stop_timeout")] = "20s"
    config = supervisor.resolve_config(cluster_node._START_OPTIONS, {}, None, layer)
    supervisor.validate(config)
    configs.append(config)
sys.exit(supervisor.run_local_cluster(configs, ",".join(f"{i}=127.0.0.1:{p}" for i, p in enumerate(ports))))
"""


class Nodes:
    """``LocalClusterSupervisor`` in a subprocess; its output in files."""

    def __init__(self, base: Path, count: int) -> None:
        base.mkdir(parents=True)
        self.base = base
        self.out_path, self.err_path = base / "run.out", base / "run.err"
        self.ports = supervisor.free_udp_ports(count)
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _RUN_NODES, str(base), *map(str, self.ports)],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        self.pids: dict[int, dict[str, psutil.Process]] = {}
        self.driver_dirs: list[Path] = []

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return self.err_path.read_text()

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"exited with {self.process.returncode}:\n{self.out}\n{self.err}")
            return "local cluster ready" in self.out

        wait_for(ready, 120, "every node to be ready")
        for match in READY.finditer(self.out):
            self.driver_dirs.append(Path(match.group(3)))
            self.pids[int(match.group(1))] = {
                name: psutil.Process(int(pid)) for name, pid in (entry.split() for entry in match.group(4).split(", "))
            }

    def wait_text(self, text: str, stream: str = "err") -> None:
        wait_for(lambda: text in getattr(self, stream), 60, f"{text!r} in {stream}:\n{self.out}\n{self.err}", 0.05)

    def reap(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        children = [process for node in self.pids.values() for process in node.values()]
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=10)
        for directory in self.driver_dirs:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def run_nodes(tmp_path: Path) -> Iterator[Any]:
    started: list[Nodes] = []

    def run(count: int) -> Nodes:
        nodes = Nodes(tmp_path / f"l{uuid.uuid4().hex[:6]}", count)
        started.append(nodes)
        return nodes

    yield run
    for nodes in started:
        nodes.reap()


@pytest.mark.system
@pytest.mark.system
def test_a_dead_node_is_stopped_and_the_others_keep_running(run_nodes: Any) -> None:
    nodes = run_nodes(2)
    nodes.wait_ready()
    victim = nodes.pids[1]["consensus"]
    victim.send_signal(signal.SIGKILL)
    nodes.wait_text("node 1 stopped; nodes still running: 0")
    err = nodes.err
    assert f"[node 1] consensus module (pid {victim.pid}) died: killed by SIGKILL" in err, err
    assert f"last lines of {nodes.base / 'node1' / 'logs'}" in err
    assert "[node 1] stopping the rest of node 1 in order" in nodes.out
    assert all_gone(list(nodes.pids[1].values()))
    assert all(process.is_running() for process in nodes.pids[0].values())
    assert nodes.process.poll() is None  # the command keeps supervising node 0

    nodes.pids[0]["service0"].send_signal(signal.SIGKILL)
    assert nodes.process.wait(60) == supervisor.EXIT_FAILURE
    assert "every node has stopped" in nodes.out
    assert all_gone(list(nodes.pids[0].values()))


@pytest.mark.system
@pytest.mark.system
def test_cluster_tool_says_3_for_a_base_with_one_node_down(run_nodes: Any) -> None:
    """One meaning per exit code: with every node running, describe,
    list-members, counters and errors exit 0; with one node down, each of
    them exits 3 (not running) and still shows every node."""
    nodes = run_nodes(2)
    nodes.wait_ready()
    commands = ("describe", "list-members", "counters", "errors")

    def tool(command: str) -> Any:
        return CliRunner().invoke(cluster_tool.main, [command, "--dir", str(nodes.base), "--json"])

    for command in commands:
        result = tool(command)
        assert result.exit_code == 0, (command, result.output)
    victim = nodes.pids[1]["consensus"]
    victim.send_signal(signal.SIGKILL)
    nodes.wait_text("node 1 stopped; nodes still running: 0")
    assert all_gone(list(nodes.pids[1].values()))
    for command in commands:
        result = tool(command)
        assert result.exit_code == 3, (command, result.output)
        document = json.loads(result.stdout)
        assert [node["node"] for node in document["nodes"]] == ["node0", "node1"], document
        assert [node["running"] for node in document["nodes"]] == [True, False], (command, document)
        assert "error" not in document["nodes"][1], (command, document)


@pytest.mark.system
@pytest.mark.system
def test_a_signal_stops_every_node_in_order(run_nodes: Any) -> None:
    nodes = run_nodes(3)
    nodes.wait_ready()
    # Idle, the supervisor sleeps on its twelve children's pidfds at once: it
    # wakes once per duty cycle (waiting on them one at a time, through
    # psutil, it woke twice as often, for three times the CPU).
    wakes = main_thread_wakes_per_second({"supervisor": nodes.process.pid}, 2.0)["supervisor"]
    assert wakes <= 1.5 / supervisor.DUTY_CYCLE_S, wakes
    nodes.process.send_signal(signal.SIGINT)
    assert nodes.process.wait(90) == supervisor.EXIT_OK, nodes.out + nodes.err
    out = nodes.out
    for i in (0, 1, 2):
        assert f"[node {i}] node {i} stopped cleanly" in out, out
        pids = nodes.pids[i]
        order = [
            out.index(f"[node {i}] {name} (pid {pids[key].pid}) exited with code 0")
            for name, key in (("consensus module", "consensus"), ("archive", "archive"), ("media driver", "driver"))
        ]
        assert order == sorted(order), out
    assert "local cluster stopped cleanly" in out
    assert all_gone([process for node in nodes.pids.values() for process in node.values()])
    assert not any(directory.exists() for directory in nodes.driver_dirs)


# ---------------------------------------------------------------------- the LocalCluster harness


@pytest.mark.system
@pytest.mark.system
def test_harness_starts_kills_and_restarts_pieces_and_leaves_nothing() -> None:
    cluster = LocalCluster(3)
    try:
        assert cluster.ingress_endpoints == supervisor.local_ingress_endpoints(cluster.ports)
        assert [m.id for m in parse_cluster_members(cluster.cluster_members)] == [0, 1, 2]
        consensus = cluster.command(1, "consensus")
        assert consensus[consensus.index("--cluster-members") + 1] == cluster.cluster_members
        assert consensus[consensus.index("--member-id") + 1] == "1"
        assert "--startup-canvass-timeout" in consensus  # short election timing by default
        # The consensus module's own parser accepts what the harness passes.
        assert cluster_node.consensus.make_context("consensus", consensus[1:]).params["member_id"] == 1

        for member in range(3):  # drivers and archives: no election needed
            cluster.start_process(member, "driver")
        for member in range(3):
            cluster.start_process(member, "archive")
        first = cluster.process(2, "archive")
        assert first is not None and cluster.archive_control_channel(2) in str(first.process.args)
        cluster.kill_process(2, "archive")
        assert not cluster.is_running(2, "archive") and first.process.returncode == -signal.SIGKILL
        with pytest.raises(AssertionError, match="still running"):
            cluster.launch(1, "archive")
        again = cluster.start_process(2, "archive")
        assert again is not first and again.alive
        cluster.kill_member(0)
        assert not cluster.is_running(0, "driver") and not cluster.is_running(0, "archive")

        with cluster.connect(1) as aeron:  # a member's driver
            assert isinstance(aeron, Aeron)
        cluster.connect()  # the clients' own driver (closed by close())
        assert cluster.client_driver is not None and cluster.client_driver.alive
        processes = [p.process for member in cluster.processes for p in member.values()]
        processes.append(cluster.client_driver.process)
        directories = [cluster.base, *(d.parent for d in cluster.driver_dirs), cluster.client_driver_dir.parent]
    finally:
        cluster.close()
    assert all(process.poll() is not None for process in processes)
    assert not any(directory.exists() for directory in directories)
