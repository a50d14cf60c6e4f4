"""A node's metrics for Prometheus, /health and /leader: ``cluster-tool metrics
serve`` over a running three-member cluster, ``cluster-node start
--metrics-port``, and the collector over a driver whose counters the test
allocates itself.  Every scrape goes over HTTP on 127.0.0.1 and is parsed
with ``prometheus_client``'s own parser."""

from __future__ import annotations

import http.client
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fulmar.cli import cluster_node, cluster_tool, node_metrics, supervisor
from fulmar.cli.metrics_server import MetricsServer
from fulmar.cli.node_metrics import MetricsNode, NodeCollector, _Families, _recording_labels, _stream_labels
from fulmar.consensus import protocol
from fulmar.consensus.agent import ClusterRole
from support.cluster import LocalCluster
from support.driver import DriverProcess, new_driver_dir, remove_driver_dir, wait_for
from support.multi_node import wait_for_leader
from support.node_start import READY, START_S, Node, start_node  # noqa: F401 - start_node: a fixture

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

DEADLINE_S = 60
_URL = "http://127.0.0.1:{port}"


def http_get(url: str) -> tuple[int, str]:
    """Status and body (http.client, not urllib: no proxy from the environment on the way)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        connection.request("GET", parts.path or "/")
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def scrape(url: str) -> dict[str, list[Sample]]:
    """Every sample of ``url``/metrics, by family name (parsed by prometheus_client)."""
    status, text = http_get(url + "/metrics")
    assert status == 200, text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def sample_value(families: dict[str, list[Sample]], name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels`` (None if none)."""
    found = [
        sample.value
        for sample in families.get(name, [])
        if all(sample.labels.get(key) == value for key, value in labels.items())
    ]
    assert len(found) <= 1, f"{len(found)} samples of {name} with {labels}"
    return found[0] if found else None


class MetricsServe:
    """``cluster-tool metrics serve`` as a process; the URL of each node it serves."""

    LINE = "/metrics (and /health, /leader) from "

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fulmar.cli.cluster_tool", "metrics", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.urls: dict[str, str] = {}

    def wait_ready(self, count: int) -> dict[str, str]:
        """Read its output (select with a deadline, never a blocking read) until ``count`` nodes are served."""
        assert self.process.stdout is not None and self.process.stderr is not None
        fd = self.process.stdout.fileno()
        pending = b""
        deadline = time.monotonic() + DEADLINE_S
        while len(self.urls) < count:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"metrics serve printed {self.urls} only"
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            assert chunk, f"metrics serve exited with {self.process.wait(10)}: {self.process.stderr.read()}"
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in (raw.decode() for raw in lines):
                if self.LINE in line:
                    name, url = line.split(self.LINE)[0].split(": ", 1)
                    self.urls[name] = url.removesuffix("/metrics")
        return self.urls

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode


def list_members(base: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cluster_tool.main, ["list-members", "--dir", str(base), "--json"])
    return dict(json.loads(result.stdout))


def answers(urls: list[str], path: str) -> list[tuple[int, str]]:
    return [http_get(url + path) for url in urls]


# ---------------------------------------------------------------------- a running three-member cluster


def test_a_three_member_cluster_scraped_over_http_through_a_leader_failover() -> None:
    """cluster-tool metrics serve --dir BASE: member i on its own port; the
    commit position scraped is the one list-members shows; one /leader 200,
    /health 200 everywhere; the leader's consensus module killed, its node's
    /health is 503 naming it, and another member's /leader answers 200."""
    cluster = LocalCluster(3)
    server: MetricsServe | None = None
    try:
        cluster.start()
        server = MetricsServe("--dir", str(cluster.base), "--port", "0")
        urls = server.wait_ready(3)
        assert sorted(urls) == ["node0", "node1", "node2"]
        leader = wait_for_leader(cluster, DEADLINE_S)
        client = cluster.connect_client()
        for index in range(5):
            request = {"op": "put", "key": f"k{index}", "value": index, "id": index}
            assert json.loads(client.request(json.dumps(request).encode(), timeout_s=10))["ok"]

        member_urls = [urls[f"node{member}"] for member in range(3)]
        wait_for(
            lambda: all(status == 200 for status, _ in answers(member_urls, "/health")),
            DEADLINE_S,
            f"/health 200 on every member: {answers(member_urls, '/health')}",
            0.1,
        )
        leading = [member for member, (status, _) in enumerate(answers(member_urls, "/leader")) if status == 200]
        assert leading == [leader.member], answers(member_urls, "/leader")
        for member, (status, text) in enumerate(answers(member_urls, "/leader")):
            if member != leader.member:
                assert status == 503 and text.startswith(f"not the leader: member {member} FOLLOWER"), text

        def commit_positions_agree() -> bool:
            listed = {node["member_id"]: node["commit_position"] for node in list_members(cluster.base)["nodes"]}
            scraped = {
                member: sample_value(
                    scrape(member_urls[member]), "fulmar_cluster_commit_position_bytes", member_id=str(member)
                )
                for member in range(3)
            }
            return listed == scraped and all(position is not None and position > 0 for position in scraped.values())

        wait_for(commit_positions_agree, DEADLINE_S, "the scraped commit positions to be list-members' ones", 0.1)

        families = scrape(member_urls[leader.member])
        for process in ("media driver", "archive", "consensus module", "service 0"):
            assert sample_value(families, "fulmar_process_up", process=process) == 1, process
        assert sample_value(families, "fulmar_cluster_role", member_id=str(leader.member)) == ClusterRole.LEADER
        assert sample_value(families, "fulmar_cluster_module_state", member_id=str(leader.member)) == 1  # ACTIVE
        commit = sample_value(families, "fulmar_cluster_commit_position_bytes")
        recorded = sample_value(families, "fulmar_cluster_log_recorded_position_bytes")
        assert commit is not None and recorded is not None and recorded >= commit > 0
        followers = sorted({member for member in range(3) if member != leader.member})
        appended = [
            sample_value(families, "fulmar_cluster_member_append_position_bytes", follower_member_id=str(member))
            for member in followers
        ]
        lags = [
            sample_value(families, "fulmar_cluster_member_lag_bytes", follower_member_id=str(member))
            for member in followers
        ]
        assert all(position is not None and position > 0 for position in appended), appended
        assert all(lag is not None and 0 <= lag <= recorded for lag in lags), lags
        # Counters are families without their _total, as the parser names them.
        assert (sample_value(families, "fulmar_cluster_elections", member_id=str(leader.member)) or 0) >= 1
        assert all(
            value == 0
            for value in (
                sample_value(families, "fulmar_distinct_errors", process="archive"),
                sample_value(families, "fulmar_cluster_errors", member_id=str(leader.member)),
            )
        )
        # A follower has no append positions of others.
        assert "fulmar_cluster_member_lag_bytes" not in scrape(member_urls[followers[0]])

        module = cluster.process(leader.member, "consensus")
        assert module is not None
        pid = module.process.pid
        cluster.kill_process(leader.member, "consensus")
        old_leader_url = member_urls[leader.member]
        wait_for(
            lambda: http_get(old_leader_url + "/health")[0] == 503,
            DEADLINE_S,
            "the killed leader's node to answer /health 503",
            0.05,
        )
        status, text = http_get(old_leader_url + "/health")
        assert status == 503 and f"consensus module: not running (pid {pid} is gone)" in text, text
        assert sample_value(scrape(old_leader_url), "fulmar_process_up", process="consensus module") == 0
        assert http_get(old_leader_url + "/leader")[0] == 503

        others = [member_urls[member] for member in followers]
        wait_for(
            lambda: sum(status == 200 for status, _ in answers(others, "/leader")) == 1,
            DEADLINE_S,
            f"one of members {followers} to answer /leader 200",
            0.1,
        )
        new_leader = wait_for_leader(cluster, DEADLINE_S, not_member=leader.member)
        status, text = http_get(member_urls[new_leader.member] + "/leader")
        assert status == 200 and text.startswith(f"leader: member {new_leader.member} LEADER"), text
    finally:
        try:
            if server is not None:
                assert server.stop() == 0
        finally:
            cluster.close()


# ---------------------------------------------------------------------- cluster-node start --metrics-port


def consecutive_free_tcp_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 now."""
    for _ in range(100):
        first = supervisor.free_udp_port()
        probes: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError(f"no {count} consecutive free TCP ports")


def test_cluster_node_start_serves_each_members_metrics_on_port_plus_member_id(
    start_node: Callable[..., Node], tmp_path: Path
) -> None:
    base = tmp_path / f"local-{uuid.uuid4().hex[:6]}"
    first = consecutive_free_tcp_ports(3)
    node = start_node(
        "--local",
        "3",
        "--dir",
        str(base),
        "--metrics-port",
        str(first),
        "--stop-timeout",
        "20s",
        "--consensus-startup-canvass-timeout",
        "2s",
        "--consensus-election-timeout",
        "500ms",
        "--consensus-election-status-interval",
        "50ms",
    )
    driver_dirs: list[Path] = []
    try:

        def ready() -> bool:
            if node.process.poll() is not None:
                raise AssertionError(f"exited with {node.process.returncode}:\n{node.stdout}\n{node.stderr}")
            return "local cluster ready" in node.stdout

        wait_for(ready, START_S, "every member to be ready", 0.05)
        driver_dirs = [Path(match.group(3)) for match in READY.finditer(node.stdout)]
        node.children.update({f"child {child.pid}": child for child in psutil.Process(node.process.pid).children()})
        urls = [_URL.format(port=first + member) for member in range(3)]
        for member, url in enumerate(urls):
            assert (
                f"[node {member}] metrics of node {member}: {url}/metrics, {url}/health, {url}/leader" in node.stdout
            ), node.stdout
            assert f"metrics_port = {first + member}" in (base / f"node{member}" / "node.toml").read_text()

        def settled() -> bool:
            healthy = all(status == 200 for status, _ in answers(urls, "/health"))
            return healthy and sum(status == 200 for status, _ in answers(urls, "/leader")) == 1

        wait_for(settled, DEADLINE_S, f"/health 200 everywhere and one leader: {answers(urls, '/leader')}", 0.1)
        leader = next(member for member, (status, _) in enumerate(answers(urls, "/leader")) if status == 200)
        families = scrape(urls[leader])
        assert sample_value(families, "fulmar_cluster_role", member_id=str(leader)) == ClusterRole.LEADER
        assert all(
            sample_value(families, "fulmar_process_up", process=name) == 1
            for name in ("media driver", "archive", "consensus module", "service 0")
        )
        assert (sample_value(families, "fulmar_driver_active_clients") or 0) >= 3

        # A member whose process dies is stopped with its metrics: their port is free for its restart.
        follower = next(member for member in range(3) if member != leader)
        module_pid = int(CliRunner().invoke(cluster_tool.main, ["pid", "--dir", str(base / f"node{follower}")]).stdout)
        os.kill(module_pid, signal.SIGKILL)

        def refused(url: str) -> bool:
            try:
                http_get(url + "/health")
            except ConnectionRefusedError:
                return True
            except ConnectionResetError:
                return False  # closed while it answered: not released yet
            return False

        wait_for(lambda: refused(urls[follower]), DEADLINE_S, f"node {follower}'s metrics port to be released", 0.05)
        assert http_get(urls[leader] + "/leader")[0] == 200

        node.process.send_signal(signal.SIGTERM)
        assert node.wait() == supervisor.EXIT_FAILURE, node.stdout + node.stderr  # a node had failed
        for url in urls:
            assert refused(url), url
    finally:
        for directory in driver_dirs:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[list[supervisor.NodeConfig]]:
    """``start --local N`` configures and validates, but runs nothing."""
    runs: list[list[supervisor.NodeConfig]] = []

    def run_local_cluster(configs: list[supervisor.NodeConfig], endpoints: str) -> int:
        runs.append(configs)
        return 0

    def run_node(config: supervisor.NodeConfig) -> int:
        runs.append([config])
        return 0

    monkeypatch.setattr(supervisor, "run_local_cluster", run_local_cluster)
    monkeypatch.setattr(supervisor, "run_node", run_node)
    return runs


def test_metrics_port_is_a_node_key_and_counts_up_with_local(tmp_path: Path, captured: Any) -> None:
    first = consecutive_free_tcp_ports(3)
    result = CliRunner().invoke(
        cluster_node.start,
        ["--local", "3", "--dir", str(tmp_path / "c"), "--metrics-port", str(first), "--metrics-host", "127.0.0.1"],
    )
    assert result.exit_code == 0, result.output
    assert [config.metrics_port for config in captured[0]] == [first, first + 1, first + 2]
    toml = (tmp_path / "c" / "node2" / "node.toml").read_text()
    assert f"metrics_port = {first + 2}" in toml and 'metrics_host = "127.0.0.1"' in toml
    # The file it wrote starts that member again with the same port.
    config = supervisor.resolve_config(cluster_node._START_OPTIONS, {}, tmp_path / "c" / "node2" / "node.toml")
    assert (config.metrics_port, config.metrics_host) == (first + 2, "127.0.0.1")

    any_port = CliRunner().invoke(
        cluster_node.start, ["--local", "3", "--dir", str(tmp_path / "d"), "--metrics-port", "0"]
    )
    assert any_port.exit_code == 0, any_port.output
    assert [config.metrics_port for config in captured[1]] == [0, 0, 0]
    none = CliRunner().invoke(cluster_node.start, ["--local", "3", "--dir", str(tmp_path / "e")])
    assert none.exit_code == 0 and [config.metrics_port for config in captured[2]] == [None, None, None]
    assert "metrics_port =" not in (tmp_path / "e" / "node0" / "node.toml").read_text()

    high = CliRunner().invoke(
        cluster_node.start, ["--local", "3", "--dir", str(tmp_path / "f"), "--metrics-port", "65534"]
    )
    assert high.exit_code == supervisor.EXIT_CONFIG and "beyond 65535" in high.output, high.output
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = CliRunner().invoke(
            cluster_node.start, ["--local", "1", "--dir", str(tmp_path / "g"), "--metrics-port", str(port)]
        )
    assert busy.exit_code == supervisor.EXIT_CONFIG, busy.output
    assert f"[node] metrics_port: TCP port {port} on 127.0.0.1 is in use" in busy.output, busy.output


# ---------------------------------------------------------------------- the collector over a driver of its own


@pytest.fixture
def driver() -> Iterator[DriverProcess]:
    directory = new_driver_dir()
    process = DriverProcess(directory)
    try:
        yield process
    finally:
        process.stop()
        remove_driver_dir(directory)


def test_every_counter_appears_newest_registration_wins_and_health_names_what_is_missing(
    driver: DriverProcess, tmp_path: Path
) -> None:
    """A node of which only the driver runs: its counters are served (an
    unknown type as fulmar_counter with its type id and label, a cluster
    counter by its name with the ids of its key), two counters of one
    series give the newer one's value, and /health is 503 naming the
    processes that do not run."""
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    node = MetricsNode("node0", cluster_dir, tmp_path / "archive", driver.directory)
    server = MetricsServer(node, "127.0.0.1", 0).start()
    aeron = driver.connect()
    try:
        unknown = aeron.add_counter(4242, "a counter of its own")
        unknown.set(17)
        key = struct.pack("<i", 7)
        older = aeron.add_counter(protocol.CLUSTER_SESSIONS_TYPE_ID, "Cluster sessions - clusterId=7", key)
        older.set(1)
        newer = aeron.add_counter(protocol.CLUSTER_SESSIONS_TYPE_ID, "Cluster sessions - clusterId=7", key)
        newer.set(2)
        # Keyed by cluster and service id, as each service container allocates it.
        service_errors = aeron.add_counter(
            protocol.CLUSTERED_SERVICE_ERROR_COUNT_TYPE_ID,
            "Cluster Container Errors - clusterId=7 serviceId=2",
            struct.pack("<ii", 7, 2),
        )
        service_errors.set(3)
        # The client names its process in its heartbeat counter's label on its
        # conductor's next keep-alive tick after the driver allocated the
        # counter (fulmar.aeron: _declare_process): scraped before that, the
        # age has no pid label yet.
        wait_for(lambda: aeron.conductor._process_declared, 10, "the client to declare its process")
        families = scrape(server.url)
        assert sample_value(families, "fulmar_cluster_service_errors", cluster_id="7", service_id="2") == 3
        assert sample_value(families, "fulmar_counter", type_id="4242", label="a counter of its own") == 17
        assert sample_value(families, "fulmar_cluster_sessions", cluster_id="7") == 2
        assert sample_value(families, "fulmar_process_up", process="media driver") == 1
        assert sample_value(families, "fulmar_process_up", process="consensus module") == 0
        assert sample_value(families, "fulmar_driver_active_clients") == 1
        assert (
            sample_value(
                families, "fulmar_client_heartbeat_age_seconds", client_id=str(aeron.client_id), pid=str(os.getpid())
            )
            is not None
        )
        newer.close()  # the older one is the series' value again once the newer is freed
        wait_for(
            lambda: sample_value(scrape(server.url), "fulmar_cluster_sessions", cluster_id="7") == 1,
            10,
            "the older counter's value",
            0.05,
        )

        status, text = http_get(server.url + "/health")
        assert status == 503, text
        assert text.startswith("unhealthy: archive: not running (") and "consensus module: " in text, text
        assert "media driver" not in text  # it runs
        assert http_get(server.url + "/leader")[0] == 503
        assert http_get(server.url + "/nowhere")[0] == 404

        # As Prometheus scrapes: one kept connection serves request after request.
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            for path in ("/metrics", "/health", "/metrics"):
                connection.request("GET", path)
                response = connection.getresponse()
                body = response.read()
                assert response.version == 11 and response.getheader("Connection") != "close"
                assert response.status == (200 if path == "/metrics" else 503) and body
            assert connection.sock is not None  # never closed by the server in between
        finally:
            connection.close()
    finally:
        aeron.close()
        server.close()


def test_the_commit_position_unchanged_time_counts_from_the_last_change_seen(
    driver: DriverProcess, tmp_path: Path
) -> None:
    now = [100.0]
    node = MetricsNode("node0", tmp_path, None, driver.directory)
    collector = NodeCollector(node, monotonic_s=lambda: now[0])
    aeron = driver.connect()
    try:
        commit = aeron.add_counter(
            protocol.COMMIT_POSITION_TYPE_ID, "Cluster commit-pos: - clusterId=0", struct.pack("<i", 0)
        )

        def unchanged() -> float:
            found = [
                sample.value
                for family in collector.collect()
                for sample in family.samples
                if sample.name == "fulmar_cluster_commit_position_unchanged_seconds"
            ]
            assert len(found) == 1
            return found[0]

        assert unchanged() == 0
        now[0] += 5
        assert unchanged() == 5
        commit.set(1024)
        now[0] += 1
        assert unchanged() == 0
        now[0] += 2.5
        assert unchanged() == 2.5
    finally:
        aeron.close()
        collector.close()


def test_counters_are_read_on_every_scrape_and_the_node_files_once_per_interval(
    driver: DriverProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape reads every counter afresh; the mark files, error logs and
    recording log (a process's liveness, its errors, the log's recording) at
    most once every FILES_READ_INTERVAL_S of the collector's clock, and
    /health's reading (read_files) counts as one."""
    reads: list[Path] = []
    read_node_files = node_metrics.read_node_files

    def counted(node: MetricsNode, *args: Any) -> Any:
        reads.append(node.cluster_dir)
        return read_node_files(node, *args)

    monkeypatch.setattr(node_metrics, "read_node_files", counted)
    now = [50.0]
    node = MetricsNode("node0", tmp_path, None, driver.directory)
    collector = NodeCollector(node, monotonic_s=lambda: now[0])
    aeron = driver.connect()
    try:
        sessions = aeron.add_counter(protocol.CLUSTER_SESSIONS_TYPE_ID, "Cluster sessions", struct.pack("<i", 3))

        def scrape() -> dict[str, float]:
            return {
                f"{sample.name}{sorted(sample.labels.items())}": sample.value
                for family in collector.collect()
                for sample in family.samples
            }

        first = scrape()
        assert first["fulmar_cluster_sessions[('cluster_id', '3'), ('member_id', '')]"] == 0
        assert first["fulmar_process_up[('process', 'media driver')]"] == 1
        interval = NodeCollector.FILES_READ_INTERVAL_S
        for value in (1, 2, 3):
            sessions.set(value)
            now[0] += interval / 4
            assert scrape()["fulmar_cluster_sessions[('cluster_id', '3'), ('member_id', '')]"] == value
        assert len(reads) == 1  # within the interval: the files as read at first
        now[0] += interval / 4
        assert scrape()["fulmar_process_up[('process', 'media driver')]"] == 1
        assert len(reads) == 2
        now[0] -= 10 * interval  # a clock that went back does not hold the old reading
        scrape()
        assert len(reads) == 3
        # /health's fresh reading is the one the scrapes after it use.
        now[0] += interval / 2
        assert collector.read_files().processes[0].running
        assert len(reads) == 4
        now[0] += interval * 0.75  # past the scrape's reading, within /health's
        scrape()
        assert len(reads) == 4
    finally:
        aeron.close()
        collector.close()


def test_labels_come_from_each_counters_key_and_label() -> None:
    key = struct.pack("<qii", 46, 971673697, 100)
    assert _stream_labels(key, "sub-pos: 46 971673697 100 aeron-spy:aeron:udp?control-mode=manual @4096") == {
        "registration_id": "46",
        "session_id": "971673697",
        "stream_id": "100",
        "channel": "aeron-spy:aeron:udp?control-mode=manual",
    }
    assert (
        _stream_labels(key, "pub-pos: 46 971673697 100 aeron:ipc?term-length=64k")["channel"]
        == "aeron:ipc?term-length=64k"
    )
    from fulmar.archive.protocol import recording_position_key, recording_position_label

    labels = _recording_labels(
        recording_position_key(3, 55, "127.0.0.1:4000", 9),
        recording_position_label(3, 55, 100, "aeron:udp?endpoint=x:1", 9),
    )
    assert labels == {
        "recording_id": "3",
        "session_id": "55",
        "stream_id": "100",
        "channel": "aeron:udp?endpoint=x:1",
        "archive_id": "9",
    }
    families = _Families("fulmar_")
    families.add("g", "gauge", "help", {"a": "1"}, 5.0, registration_id=2)
    families.add("g", "gauge", "help", {"a": "1"}, 7.0, registration_id=1)  # older: hidden
    families.add("g", "gauge", "help", {"a": "2"}, 3.0, registration_id=1)
    families.add("g", "gauge", "help", {"a": "2"}, None, registration_id=4)  # newer with no value: hides it
    (family,) = list(families.families())
    assert [(sample.labels, sample.value) for sample in family.samples] == [({"a": "1"}, 5.0)]


def test_metrics_serve_refuses_a_directory_without_cluster_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(cluster_tool.main, ["metrics", "serve", "--dir", str(tmp_path), "--port", "0"])
    assert result.exit_code == 4  # unreadable: no cluster files
    assert f"cluster-tool: {tmp_path}: no cluster files" in result.stderr
