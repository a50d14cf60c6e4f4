"""``cluster-node start``: one node's four processes from a TOML file (or
``--local 1``), supervised, stopped in order.

Real processes on loopback.  Every wait is bounded; every process the
supervisor started is found with psutil and reaped (killed if need be) even
when a test fails; every directory is removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from fulmar.aeron import Aeron
from fulmar.cli import cluster_node, cluster_tool, supervisor
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog
from support.driver import free_udp_port, wait_for
from support.node_start import (  # noqa: F401 - fixtures
    KV,
    READY,
    SHM,
    START_S,
    STOP_S,
    Node,
    all_gone,
    driver_dir,
    run_start,
    start_node,
    write_config,
)


def talk(node: Node) -> None:
    """A put and a get through a real client session."""
    with Aeron.connect(node.driver_dir) as aeron:
        client = ClusterClient.connect(
            aeron, node.ingress, egress_channel="aeron:udp?endpoint=127.0.0.1:0", message_timeout_ns=20_000_000_000
        )
        try:
            reply = json.loads(client.request(b'{"op":"put","key":"a","value":41,"id":1}', 20))
            assert reply == {"id": 1, "ok": True, "previous": None}
            reply = json.loads(client.request(b'{"op":"get","key":"a","id":2}', 20))
            assert reply == {"id": 2, "ok": True, "value": 41}
        finally:
            client.close()


# ---------------------------------------------------------------------- a node from a file


@pytest.mark.system
@pytest.mark.system
def test_config_file_starts_four_processes_serves_clients_and_stops_in_order(
    start_node: Callable[..., Node], tmp_path: Path, driver_dir: Path
) -> None:
    config = write_config(tmp_path / "node.toml", driver_dir, free_udp_port())
    node = start_node("--config", str(config)).wait_ready()
    children = psutil.Process(node.process.pid).children()
    commands = sorted(child.cmdline()[3] for child in children)
    assert commands == ["archive", "consensus", "driver", "service"], [c.cmdline() for c in children]
    assert {child.pid for child in children} == {p.pid for p in node.children.values()}
    # The file's values reached the processes; the relative dir is relative to the file.
    archive_cmd = node.children["archive"].cmdline()
    assert "--record-checksum" in archive_cmd and str(tmp_path / "node0" / "archive") in archive_cmd
    driver_cmd = node.children["driver"].cmdline()
    assert driver_cmd[driver_cmd.index("--ipc-term-length") + 1] == "1m"
    talk(node)

    node.process.send_signal(signal.SIGTERM)
    assert node.wait() == 0, node.stderr
    out = node.stdout
    order = [
        out.index(f"{name} (pid {node.children[key].pid}) exited with code 0")
        for name, key in (("consensus module", "consensus"), ("archive", "archive"), ("media driver", "driver"))
    ]
    assert order == sorted(order), out
    assert "service 0 (pid" in out and "node 0 stopped cleanly" in out
    consensus_log = (tmp_path / "node0" / "logs" / "consensus.log").read_text()
    assert "consensus module stopped: SHUTDOWN" in consensus_log  # a snapshot was taken
    assert all_gone(list(node.children.values()))
    assert not driver_dir.exists()


@pytest.mark.parametrize("victim, name", [("service0", "service 0"), ("consensus", "consensus module")])
@pytest.mark.system
@pytest.mark.system
def test_a_process_that_dies_is_named_and_the_rest_is_stopped(
    start_node: Callable[..., Node], tmp_path: Path, driver_dir: Path, victim: str, name: str
) -> None:
    config = write_config(tmp_path / "node.toml", driver_dir, free_udp_port())
    node = start_node("--config", str(config)).wait_ready()
    target = node.children[victim]
    target.send_signal(signal.SIGKILL)
    assert node.wait() == supervisor.EXIT_FAILURE
    err = node.stderr
    assert f"{name} (pid {target.pid}) died: killed by SIGKILL" in err, err
    assert f"last lines of {tmp_path / 'node0' / 'logs'}" in err
    out = node.stdout
    assert "stopping the rest of node 0 in order" in out
    assert out.index("archive (pid") < out.index("media driver (pid"), out
    assert all_gone(list(node.children.values()))


@pytest.mark.system
@pytest.mark.system
def test_a_killed_drivers_directory_is_removed_once_the_rest_of_the_node_stopped(
    start_node: Callable[..., Node], tmp_path: Path, driver_dir: Path
) -> None:
    """A SIGKILLed driver cannot remove its directory: the supervisor does,
    once no process of the node is left, and says so."""
    config = write_config(tmp_path / "node.toml", driver_dir, free_udp_port())
    node = start_node("--config", str(config)).wait_ready()
    assert node.driver_dir == driver_dir and (driver_dir / "cnc.dat").exists()
    driver = node.children["driver"]
    driver.send_signal(signal.SIGKILL)
    assert node.wait() == supervisor.EXIT_FAILURE
    assert f"media driver (pid {driver.pid}) died: killed by SIGKILL" in node.stderr, node.stderr
    assert all_gone(list(node.children.values()))
    assert not driver_dir.exists()
    assert (
        f"removed the driver directory {driver_dir}, which the media driver (pid {driver.pid}, killed by SIGKILL) "
        "left behind" in node.stdout
    ), node.stdout


# ---------------------------------------------------------------------- --local


@pytest.mark.system
@pytest.mark.system
def test_local_one_runs_a_cluster_under_the_given_dir(start_node: Callable[..., Node], tmp_path: Path) -> None:
    base = tmp_path / f"local-{uuid.uuid4().hex[:6]}"
    port = free_udp_port()
    node = start_node("--local", "1", "--dir", str(base), "--ingress-port", str(port), "--service", KV)
    node.wait_ready()
    assert node.ingress == f"aeron:udp?endpoint=127.0.0.1:{port}"
    assert f"local cluster of 1 member under {base} (ingress 127.0.0.1:{port})" in node.stdout
    expected_driver = node.driver_dir
    if SHM:
        assert expected_driver.parent == SHM
        assert re.fullmatch(
            rf"fulmar-{re.escape(supervisor.user_name())}-{base.name}-[0-9a-f]{{8}}-node0", expected_driver.name
        )
    else:
        assert expected_driver == base / "node0" / "driver"
    for sub in ("archive", "cluster", "logs/consensus.log", "logs/service0.log", "node.toml"):
        assert (base / "node0" / sub).exists(), sub
    talk(node)
    node.process.send_signal(signal.SIGINT)
    assert node.wait() == 0, node.stderr
    assert "SIGINT: stopping node 0 in order" in node.stdout
    assert all_gone(list(node.children.values()))
    assert not expected_driver.exists()
    # The configuration it wrote starts the same node again.
    written = supervisor.read_toml(base / "node0" / "node.toml")
    assert written["service"]["service"] == KV and written["node"]["driver_dir"] == str(expected_driver)


# ---------------------------------------------------------------------- the user's own service

USER_SERVICE = """
from fulmar.service.samples import KeyValueService


class Bank(KeyValueService):
    pass
"""


def user_module(directory: Path) -> str:
    """A module of a user's own service in ``directory``: its (unique) name."""
    name = f"bank_{uuid.uuid4().hex[:8]}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(USER_SERVICE)
    return name


@pytest.mark.system
@pytest.mark.system
def test_the_users_service_is_found_where_start_runs_and_its_node_toml_remembers_it(
    start_node: Callable[..., Node], tmp_path: Path
) -> None:
    """``--service bank:Bank`` run from the folder that holds bank.py finds it
    (the supervisor's check and the service container alike); the generated
    node.toml keeps that folder as [service] path, so --config starts the
    same node from anywhere."""
    project = tmp_path / "project"
    module = user_module(project)
    base = tmp_path / "base"
    node = start_node("--local", "1", "--dir", str(base), "--service", f"{module}:Bank", cwd=project, script=True)
    node.wait_ready()
    talk(node)
    node.process.send_signal(signal.SIGINT)
    assert node.wait() == 0, node.stderr
    written = supervisor.read_toml(base / "node0" / "node.toml")
    assert written["service"]["path"] == str(project)

    again = start_node("--config", str(base / "node0" / "node.toml"), cwd=tmp_path, script=True)
    again.wait_ready()
    again.process.send_signal(signal.SIGINT)
    assert again.wait() == 0, again.stderr
    assert all_gone([*node.children.values(), *again.children.values()])


def test_the_service_path_defaults_to_the_config_files_directory_and_can_be_set(
    tmp_path: Path, driver_dir: Path
) -> None:
    project = tmp_path / "project"
    module = user_module(project)
    config = write_config(project / "node.toml", driver_dir, 9999, service={"service": f"{module}:Bank"})
    resolved = supervisor.resolve_config(cluster_node._START_OPTIONS, {}, config)
    assert resolved.service_path == project
    service_env = next(spec.env for spec in resolved.child_specs() if spec.log_name == "service0")
    assert service_env["PYTHONPATH"].split(os.pathsep)[0] == str(project)
    supervisor.check_service_spec(resolved.service, resolved.service_path)  # found there

    elsewhere = tmp_path / "lib"
    other = user_module(elsewhere)
    config.write_text(config.read_text().replace(f"{module}:Bank", f"{other}:Bank") + 'path = "../lib"\n')
    resolved = supervisor.resolve_config(cluster_node._START_OPTIONS, {}, config)
    assert resolved.service_path == project / ".." / "lib"  # relative to the file
    supervisor.check_service_spec(resolved.service, resolved.service_path)
    flagged = supervisor.resolve_config(cluster_node._START_OPTIONS, {"service_path": str(project)}, config)
    assert flagged.service_path == project


def test_a_service_module_not_found_says_where_it_looked_and_how_to_add_a_place(tmp_path: Path) -> None:
    result = run_start("--local", "1", "--dir", str(tmp_path / "base"), "--service", "nowhere_to_be_found:Bank")
    assert result.exit_code == supervisor.EXIT_CONFIG, result.output
    text = " ".join(result.output.split())
    assert "cannot import nowhere_to_be_found: no module named 'nowhere_to_be_found' in any of" in text, text
    assert f"{Path.cwd()}," in text, text  # the directory start ran in, first
    assert "--service-path DIR" in text and '[service] path = "DIR"' in text, text
    missing = run_start(
        "--local", "1", "--dir", str(tmp_path / "base"), "--service-path", str(tmp_path / "absent"), "--service", KV
    )
    assert missing.exit_code == supervisor.EXIT_CONFIG, missing.output
    assert f"[service] path = '{tmp_path / 'absent'}': no such directory" in missing.output


# ---------------------------------------------------------------------- a Ctrl-C while it starts

STARTED = re.compile(r"node 0 of cluster 0: directory \S+, driver directory (\S+), logs in")


@pytest.mark.parametrize(
    "moment",
    [
        "node 0 of cluster 0",  # the driver launched, still starting up
        "archive pid",  # the consensus module launched
        "consensus module pid",  # the service launched, waiting for its module
    ],
)
@pytest.mark.system
@pytest.mark.system
def test_a_ctrl_c_while_the_node_starts_is_an_orderly_stop(
    start_node: Callable[..., Node], tmp_path: Path, moment: str
) -> None:
    """A Ctrl-C in the first moments of a start, as a process is still
    starting up, stops the node in order: every process stops by itself
    (none killed by the signal or the supervisor), exit 0, nothing left."""
    node = start_node("--local", "1", "--dir", str(tmp_path / "base"))
    wait_for(lambda: moment in node.stdout or node.process.poll() is not None, START_S, moment)
    assert node.process.poll() is None, node.stdout + node.stderr
    children = psutil.Process(node.process.pid).children()
    node.process.send_signal(signal.SIGINT)
    code = node.wait()
    match = STARTED.search(node.stdout)
    assert match is not None, node.stdout
    node.driver_dir = Path(match.group(1))
    assert code == 0, node.stdout + node.stderr
    assert "node 0 stopped cleanly" in node.stdout, node.stdout
    assert "killed" not in node.stdout + node.stderr, node.stdout + node.stderr
    assert all_gone(children)
    assert not node.driver_dir.exists()


@pytest.mark.system
@pytest.mark.system
def test_a_stop_that_needs_a_kill_still_exits_3(start_node: Callable[..., Node], tmp_path: Path) -> None:
    node = start_node("--local", "1", "--dir", str(tmp_path / "base"), "--stop-timeout", "2s").wait_ready()
    node.children["archive"].suspend()  # SIGSTOP: it cannot stop by itself
    node.process.send_signal(signal.SIGINT)
    assert node.wait() == supervisor.EXIT_UNCLEAN_STOP, node.stdout + node.stderr
    assert "still running 2 s after SIGTERM" in node.stderr and "killing it (SIGKILL)" in node.stderr, node.stderr
    assert "node 0 stopped, but not cleanly (see above)" in node.stderr
    assert all_gone(list(node.children.values()))


# ---------------------------------------------------------------------- a signal to the whole node


def read_value(node: Node, key: str) -> Any:
    with Aeron.connect(node.driver_dir) as aeron:
        client = ClusterClient.connect(
            aeron, node.ingress, egress_channel="aeron:udp?endpoint=127.0.0.1:0", message_timeout_ns=20_000_000_000
        )
        try:
            reply = json.loads(client.request(json.dumps({"op": "get", "key": key, "id": 7}).encode(), 20))
        finally:
            client.close()
    assert reply["ok"], reply
    return reply["value"]


def signal_whole_node(node: Node, how: str) -> None:
    if how == "ctrl-c":
        # The terminal's Ctrl-C: SIGINT to its foreground process group.
        os.killpg(os.getpgid(node.process.pid), signal.SIGINT)
    elif how == "service manager":
        # systemd's default KillMode=control-group: SIGTERM to every process
        # of the unit at the same moment.
        for process in [psutil.Process(node.process.pid), *node.children.values()]:
            process.send_signal(signal.SIGTERM)
    elif how == "ctrl-c and sigterm":
        # A Ctrl-C and a wrapper that forwards SIGTERM on top of it: one request.
        node.process.send_signal(signal.SIGINT)
        node.process.send_signal(signal.SIGTERM)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["ctrl-c", "service manager", "ctrl-c and sigterm"])
@pytest.mark.system
@pytest.mark.system
def test_a_signal_to_the_whole_node_still_takes_the_snapshot_and_stops_in_order(
    start_node: Callable[..., Node], tmp_path: Path, driver_dir: Path, how: str
) -> None:
    config = write_config(tmp_path / "node.toml", driver_dir, free_udp_port())
    node = start_node("--config", str(config), new_session=True).wait_ready()
    talk(node)  # a = 41
    processes = [psutil.Process(node.process.pid), *node.children.values()]
    signal_whole_node(node, how)
    assert node.wait() == 0, node.stdout + node.stderr
    logs = tmp_path / "node0" / "logs"
    consensus_log = (logs / "consensus.log").read_text()
    assert "consensus module stopped: SHUTDOWN at log position" in consensus_log, (
        f"{consensus_log[-2000:]}\nsupervisor: {node.stdout}{node.stderr}"
    )
    with RecordingLog.open(tmp_path / "node0" / "cluster", create=False) as recording_log:
        assert recording_log.get_latest_snapshot(-1) is not None  # the module's
        assert recording_log.get_latest_snapshot(0) is not None  # the service's
    assert all_gone(processes)
    assert not driver_dir.exists()
    if how == "service manager":
        # The archive and the driver got the signal with the module: each
        # waited for what must stop before it (the module, then the archive).
        archive_log = (logs / "archive.log").read_text()
        driver_log = (logs / "driver.log").read_text()
        assert "waiting for the consensus module" in archive_log, archive_log[-2000:]
        assert "waiting for the" in driver_log, driver_log[-2000:]

    restarted = start_node("--config", str(config)).wait_ready()
    assert read_value(restarted, "a") == 41
    restarted.process.send_signal(signal.SIGTERM)
    assert restarted.wait() == 0, restarted.stderr


@pytest.mark.system
@pytest.mark.system
def test_a_signal_to_every_process_of_a_three_member_cluster_stops_each_member_in_order(
    start_node: Callable[..., Node], tmp_path: Path
) -> None:
    """A member of several stops at once on a stop signal (no cluster-wide
    snapshot), but still before its archive and its driver: with every
    process signalled together, no process sees its driver or archive go
    away under it, and every one stops by itself with code 0."""
    base = tmp_path / f"local-{uuid.uuid4().hex[:6]}"
    node = start_node(
        "--local",
        "3",
        "--dir",
        str(base),
        "--service",
        KV,
        "--stop-timeout",
        "20s",
        "--consensus-startup-canvass-timeout",
        "2s",
        "--consensus-election-timeout",
        "500ms",
        "--consensus-election-status-interval",
        "50ms",
        new_session=True,
    )
    driver_dirs: list[Path] = []
    try:

        def ready() -> bool:
            if node.process.poll() is not None:
                raise AssertionError(f"exited with {node.process.returncode}:\n{node.stdout}\n{node.stderr}")
            return "local cluster ready" in node.stdout

        wait_for(ready, START_S, "every member to be ready")
        driver_dirs = [Path(match.group(3)) for match in READY.finditer(node.stdout)]
        children = psutil.Process(node.process.pid).children()
        assert len(children) == 12, [child.cmdline() for child in children]
        node.children.update({f"child {child.pid}": child for child in children})  # reaped whatever happens
        for process in [psutil.Process(node.process.pid), *children]:
            process.send_signal(signal.SIGTERM)
        assert node.wait() == 0, node.stdout + node.stderr
        assert all_gone(children)
        for member_id in range(3):
            logs = base / f"node{member_id}" / "logs"
            consensus_log = (logs / "consensus.log").read_text()
            assert "consensus module stopped: stopped as" in consensus_log, consensus_log[-2000:]
            for name in ("consensus", "service0", "archive", "driver"):
                text = (logs / f"{name}.log").read_text()
                for trouble in ("is gone", "went away", "Traceback", "Error"):
                    assert trouble not in text, f"{name}.log of member {member_id}:\n{text[-2000:]}"
        assert not any(directory.exists() for directory in driver_dirs)
    finally:
        for directory in driver_dirs:
            shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------- a stop by the cluster

# The one line a supervisor says when the cluster stopped its node (not a signal to the supervisor).
STOPPED_BY = re.compile(r"^(?:\[node \d+\] )?node (\d+) stopped by (.+) at log position (\d+)$", re.M)


def tool(*args: str) -> Any:
    return CliRunner().invoke(cluster_tool.main, ["cluster", *args])


def latest_snapshot_position(cluster_dir: Path, service_id: int) -> int | None:
    with RecordingLog.open(cluster_dir, create=False) as recording_log:
        snapshot = recording_log.get_latest_snapshot(service_id)
    return None if snapshot is None else snapshot.log_position


@pytest.mark.parametrize(
    "how, cause",
    [
        ("shutdown", "cluster shutdown"),
        ("abort", "cluster abort"),
        ("sigterm to the module", "a stop signal to its consensus module"),
    ],
)
@pytest.mark.system
@pytest.mark.system
def test_a_stop_by_the_cluster_or_its_module_is_an_orderly_stop(
    start_node: Callable[..., Node], tmp_path: Path, driver_dir: Path, how: str, cause: str
) -> None:
    """cluster-tool shutdown or abort, or a SIGTERM to the consensus module
    alone: the module and the service stop by themselves, in order.  The
    supervisor says so once, with the position, stops the archive and the
    driver, and exits 0: exit 1 ("a process died") would make a service
    manager's Restart=on-failure start the node its operator stopped."""
    config = write_config(tmp_path / "node.toml", driver_dir, free_udp_port())
    node = start_node("--config", str(config)).wait_ready()
    talk(node)
    if how == "sigterm to the module":
        node.children["consensus"].send_signal(signal.SIGTERM)
    else:
        result = tool(how, "--dir", str(tmp_path / "node0"), "--timeout", str(STOP_S))
        assert result.exit_code == 0, result.output
    assert node.wait() == supervisor.EXIT_OK, node.stdout + node.stderr
    out, err = node.stdout, node.stderr
    lines = STOPPED_BY.findall(out)
    assert len(lines) == 1 and lines[0][:2] == ("0", cause), out  # said once, with the cause
    position = int(lines[0][2])
    assert "died" not in err and "not cleanly" not in err, err
    # The position is the module's own: where it stopped the service.
    logs = tmp_path / "node0" / "logs"
    assert f"at log position {position}" in (logs / "consensus.log").read_text()
    assert f"service 0 stopped: terminated at log position {position}" in (logs / "service0.log").read_text()
    # A SHUTDOWN (the signal's too) stops where it snapshotted; an ABORT takes no snapshot.
    cluster_dir = tmp_path / "node0" / "cluster"
    expected_snapshot = None if how == "abort" else position
    assert latest_snapshot_position(cluster_dir, -1) == expected_snapshot
    assert latest_snapshot_position(cluster_dir, 0) == expected_snapshot
    # The archive and the driver were stopped after the module, in order, and the line said last.
    order = [
        out.index(f"{name} (pid {node.children[key].pid}) exited with code 0")
        for name, key in (("consensus module", "consensus"), ("archive", "archive"), ("media driver", "driver"))
    ]
    assert order == sorted(order) and order[-1] < out.index(f"node 0 stopped by {cause}"), out
    assert all_gone(list(node.children.values()))
    assert not driver_dir.exists()


@pytest.mark.system
@pytest.mark.system
def test_a_service_that_exits_with_code_0_unasked_has_died(
    start_node: Callable[..., Node], tmp_path: Path, driver_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit code 0 is not an orderly stop by itself: a service whose own
    code called sys.exit(0) was told to stop by nobody, and the node cannot
    serve without it.  (What an orderly stop adds, the process's own report,
    is what tells the two apart.)"""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))  # failing_service, for every process
    config = write_config(
        tmp_path / "node.toml",
        driver_dir,
        free_udp_port(),
        service={"service": "support.failing_service:FailingService"},
    )
    node = start_node("--config", str(config)).wait_ready()
    service = node.children["service0"]
    with Aeron.connect(node.driver_dir) as aeron:
        client = ClusterClient.connect(
            aeron, node.ingress, egress_channel="aeron:udp?endpoint=127.0.0.1:0", message_timeout_ns=20_000_000_000
        )
        try:
            wait_for(lambda: client.offer(b"exit") > 0, 20, "the ingress to take the message")
            assert node.wait() == supervisor.EXIT_FAILURE, node.stdout + node.stderr
        finally:
            client.close()
    err = node.stderr
    assert f"service 0 (pid {service.pid}) died: exited with code 0" in err, err
    assert not STOPPED_BY.search(node.stdout), node.stdout
    assert "stopping the rest of node 0 in order" in node.stdout
    assert all_gone(list(node.children.values()))


def cluster_members(base: Path) -> list[dict[str, Any]] | None:
    """cluster-tool list-members of the nodes under ``base`` (None unless every one runs)."""
    result = tool("list-members", "--dir", str(base), "--json")
    return json.loads(result.stdout)["nodes"] if result.exit_code == 0 else None


def steady_three_member_cluster(base: Path) -> bool:
    """One leader, every member's module ACTIVE in the same term at the same
    commit position: each follower is out of its election and answers the
    leader's termination."""
    nodes = cluster_members(base)
    return (
        nodes is not None
        and len(nodes) == 3
        and sum(1 for n in nodes if n["leader"]) == 1
        and all(n["module_state_name"] == "ACTIVE" for n in nodes)
        and len({(n["leadership_term_id"], n["commit_position"]) for n in nodes}) == 1
    )


def shutdown_and_check(base: Path, supervisors: list[Node], stdout: Callable[[], str], member_ids: list[int]) -> int:
    """cluster-tool shutdown through the base; every supervisor exits 0 and
    each member still running is said to have stopped once, by the cluster
    shutdown, all at one log position (where each of them snapshotted): that
    position."""
    result = tool("shutdown", "--dir", str(base), "--timeout", str(STOP_S))
    assert result.exit_code == 0, result.output
    for node in supervisors:
        assert node.wait() == supervisor.EXIT_OK, node.stdout + node.stderr
        assert "died" not in node.stderr and "not cleanly" not in node.stderr, node.stderr
    lines = STOPPED_BY.findall(stdout())
    assert sorted(int(member) for member, _, _ in lines) == member_ids, stdout()  # each once
    assert {cause for _, cause, _ in lines} == {"cluster shutdown"}, lines
    positions = {int(position) for _, _, position in lines}
    assert len(positions) == 1, lines  # the cluster stops at one position
    position = positions.pop()
    for member in member_ids:
        cluster_dir = base / f"node{member}" / "cluster"
        assert latest_snapshot_position(cluster_dir, -1) == position, member
        assert latest_snapshot_position(cluster_dir, 0) == position, member
    return position


@pytest.mark.system
@pytest.mark.system
def test_a_cluster_shutdown_stops_every_member_and_every_supervisor_exits_0(
    start_node: Callable[..., Node], tmp_path: Path
) -> None:
    """cluster-tool shutdown of a three-member cluster, run first by one
    ``start --local 3`` and then by a ``start --config`` per member (each
    from the node.toml the first run wrote): both kinds of supervisor exit 0,
    each member said once to have stopped by the cluster shutdown at the log
    position where every member took its snapshot.  In between, a SIGTERM to
    one follower's consensus module alone stops that member in order (its
    service leaves once it sees its module gone): its supervisor exits 0 too."""
    base = tmp_path / f"local-{uuid.uuid4().hex[:6]}"
    local = start_node(
        "--local",
        "3",
        "--dir",
        str(base),
        "--service",
        KV,
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
            if local.process.poll() is not None:
                raise AssertionError(f"exited with {local.process.returncode}:\n{local.stdout}\n{local.stderr}")
            return "local cluster ready" in local.stdout

        wait_for(ready, START_S, "every member to be ready")
        driver_dirs = [Path(match.group(3)) for match in READY.finditer(local.stdout)]
        children = psutil.Process(local.process.pid).children()
        local.children.update({f"child {child.pid}": child for child in children})  # reaped whatever happens
        wait_for(lambda: steady_three_member_cluster(base), START_S, "a steady leader and two followers")
        first = shutdown_and_check(base, [local], lambda: local.stdout, [0, 1, 2])
        assert "local cluster stopped: every node stopped in order by the cluster" in local.stdout, local.stdout
        assert all_gone(children)
        assert not any(directory.exists() for directory in driver_dirs)

        members = [start_node("--config", str(base / f"node{i}" / "node.toml")) for i in range(3)]
        for member in members:
            member.wait_ready()
        wait_for(lambda: steady_three_member_cluster(base), START_S, "a steady leader and two followers again")
        nodes = cluster_members(base)
        assert nodes is not None
        follower = next(node["member_id"] for node in nodes if not node["leader"])
        signalled = members[follower]
        signalled.children["consensus"].send_signal(signal.SIGTERM)
        assert signalled.wait() == supervisor.EXIT_OK, signalled.stdout + signalled.stderr
        lines = STOPPED_BY.findall(signalled.stdout)
        assert [line[:2] for line in lines] == [(str(follower), "a stop signal to its consensus module")], lines
        assert "died" not in signalled.stderr, signalled.stderr
        assert f"service 0 (pid {signalled.children['service0'].pid}) exited with code 0" in signalled.stdout

        others = [member for i, member in enumerate(members) if i != follower]
        second = shutdown_and_check(
            base,
            others,
            lambda: "".join(member.stdout for member in others),
            [i for i in range(3) if i != follower],
        )
        assert second > first  # each member went on from its snapshot: the log continued
        for member in members:
            assert all_gone(list(member.children.values()))
        assert not any(directory.exists() for directory in driver_dirs)
    finally:
        for directory in driver_dirs:
            shutil.rmtree(directory, ignore_errors=True)


def test_local_sizes_other_than_one_three_five_are_refused() -> None:
    result = run_start("--local", "2")
    assert result.exit_code == 2
    assert "--local 2: a local cluster has 1, 3 or 5 members" in result.output


# ---------------------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"driver": {"ipc_term_lenght": "1m"}},
            "unknown key 'ipc_term_lenght' in [driver]; did you mean 'ipc_term_length'? (known: ",
        ),
        (
            {"consensus": {"ingres_channel": "x"}},
            "unknown key 'ingres_channel' in [consensus]; did you mean 'ingress_channel'",
        ),
        ({"consensus": {"zzz": "x"}}, "unknown key 'zzz' in [consensus] (known: "),  # nothing close
        ({"node": {"count": 2}}, "unknown key 'count' in [node]; it is a key of [service]"),
        ({"extra": {"a": 1}}, "unknown table [extra]"),
        ({"sevice": {"a": 1}}, "unknown table [sevice]; did you mean [service]?"),
        ({"driver": {"ipc_term_length": "3k"}}, "[driver] ipc_term_length = '3k': '3k' must be a power of two"),
        ({"consensus": {"session_timeout": "10"}}, "[consensus] session_timeout = '10'"),
        ({"archive": {"record_checksum": "yes"}}, "[archive] record_checksum must be true or false"),
        ({"archive": {"file_sync_level": 5}}, "[archive] file_sync_level = 5"),
        ({"service": {"service": "no_colon"}}, "service 'no_colon': expected module:Class"),
        ({"service": {"service": "fulmar.service.samples:Nope"}}, "module fulmar.service.samples has no Nope"),
        ({"service": {"service": "fulmar.nowhere:X"}}, "cannot import fulmar.nowhere"),
        ({"service": {"service": "fulmar.aeron:Aeron"}}, "Aeron is not a ClusteredService subclass"),
        (
            {"service": {"on_service_error": "ignore"}},
            "[service] on_service_error = 'ignore': 'ignore' is not one of 'continue', 'stop'",
        ),
        ({"consensus": {"ingress_channel": "aeron:udp?endpoint=127.0.0.1:0"}}, "clients need a fixed one"),
        (
            {"consensus": {"ingress_channel": "aeron:bogus"}},
            "[consensus] ingress_channel: 'aeron:bogus' is not a valid channel",
        ),
    ],
)
def test_config_errors_name_the_file_and_key(
    tmp_path: Path, driver_dir: Path, change: dict[str, Any], message: str
) -> None:
    config = write_config(tmp_path / "node.toml", driver_dir, free_udp_port(), **change)
    result = run_start("--config", str(config))
    assert result.exit_code == supervisor.EXIT_CONFIG, result.output
    assert message in result.output, result.output
    if "unknown" in message:
        assert str(config) in result.output
    assert not driver_dir.exists()


def test_config_file_problems(tmp_path: Path, driver_dir: Path) -> None:
    missing = run_start("--config", str(tmp_path / "absent.toml"))
    assert missing.exit_code == 2 and "absent.toml: no such file" in missing.output
    broken = tmp_path / "broken.toml"
    broken.write_text("[node\nmember_id = 0\n")
    result = run_start("--config", str(broken))
    assert result.exit_code == 2 and "broken.toml: not valid TOML" in result.output
    no_service = write_config(tmp_path / "ns.toml", driver_dir, free_udp_port())
    no_service.write_text(no_service.read_text().replace(f'service = "{KV}"', ""))
    result = run_start("--config", str(no_service))
    assert result.exit_code == 2 and "no service to run" in result.output
    both = run_start("--config", str(no_service), "--local", "1")
    assert both.exit_code == 2 and "give --config or --local, not both" in both.output


def test_a_port_in_use_names_the_file_and_the_key_that_set_it(tmp_path: Path, driver_dir: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        config = write_config(tmp_path / "node.toml", driver_dir, port)
        result = run_start("--config", str(config))
        assert result.exit_code == supervisor.EXIT_CONFIG, result.output
        text = " ".join(result.output.split())
        assert f"{config}: [consensus] ingress_channel: UDP port {port} on 127.0.0.1 is in use" in text, text

        config = write_config(tmp_path / "flag.toml", driver_dir, free_udp_port(), archive={"control_channel": "none"})
        channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
        result = run_start("--config", str(config), "--archive-control-channel", channel)
        text = " ".join(result.output.split())
        assert result.exit_code == supervisor.EXIT_CONFIG, result.output
        assert f"[archive] control_channel (from --archive-control-channel): UDP port {port}" in text, text


def test_port_in_use_and_unusable_directories(tmp_path: Path, driver_dir: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        config = write_config(tmp_path / "node.toml", driver_dir, port)
        result = run_start("--config", str(config))
    assert result.exit_code == 2
    assert f"[consensus] ingress_channel: UDP port {port} on 127.0.0.1 is in use" in result.output
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = write_config(tmp_path / "node2.toml", driver_dir, free_udp_port(), node={"dir": str(blocker)})
    result = run_start("--config", str(config))
    assert result.exit_code == 2 and f"[node] dir = '{blocker}'" in result.output and "is a file" in result.output
    config = write_config(tmp_path / "node2.toml", driver_dir, free_udp_port(), node={"dir": str(blocker / "sub")})
    result = run_start("--config", str(config))
    assert result.exit_code == 2 and f"node directory {blocker / 'sub'}: cannot create it" in result.output
    foreign = tmp_path / "not-a-driver-dir"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    config = write_config(tmp_path / "node3.toml", driver_dir, free_udp_port(), node={"driver_dir": str(foreign)})
    result = run_start("--config", str(config))
    assert result.exit_code == 2 and "holds files that are not a media driver's" in result.output
    assert (foreign / "precious.txt").exists()


# ---------------------------------------------------------------------- precedence, help


def test_flags_override_the_file_and_the_environment_overrides_defaults(tmp_path: Path, driver_dir: Path) -> None:
    options = supervisor.build_options(
        {name: getattr(cluster_node, name) for name in ("driver", "archive", "consensus", "service")}
    )
    config = write_config(tmp_path / "node.toml", driver_dir, 9999, driver={"ipc_term_length": "2m"})
    env = {"FULMAR_DRIVER_DIR": "/dev/shm/from-env", "FULMAR_CLUSTER_SECRET": "s3cret"}
    resolved = supervisor.resolve_config(options, {"driver_ipc_term_length": 4 << 20}, config, env=env)
    assert resolved.values[("driver", "ipc_term_length")] == 4 << 20  # the flag beats the file
    assert resolved.driver_dir == driver_dir  # the file beats the environment
    assert resolved.node_dir == tmp_path / "node0"  # relative to the file
    assert resolved.values[("consensus", "authenticator_secret")] == "s3cret"  # the environment beats the default
    specs = {spec.log_name: spec for spec in resolved.child_specs()}
    assert "s3cret" not in " ".join(specs["consensus"].args)  # never on a command line
    assert specs["consensus"].env["FULMAR_CLUSTER_SECRET"] == "s3cret"
    assert "FULMAR_CLUSTER_SECRET" not in specs["service0"].env
    assert specs["driver"].args[specs["driver"].args.index("--ipc-term-length") + 1] == "4m"
    bare = write_config(tmp_path / "bare.toml", driver_dir, 9999)
    bare.write_text(bare.read_text().replace(f'driver_dir = "{driver_dir}"', ""))
    assert supervisor.resolve_config(options, {}, bare, env=env).driver_dir == Path("/dev/shm/from-env")


def test_the_archive_takes_the_nodes_secret_and_whoever_talks_to_it_is_handed_it(
    tmp_path: Path, driver_dir: Path
) -> None:
    """One secret per node: the archive authenticates with the cluster's
    secret unless given its own, the consensus module presents the archive's,
    a service only when it reaches the archive over UDP; always through the
    environment, never a command line or the node.toml."""
    options = supervisor.build_options(
        {name: getattr(cluster_node, name) for name in ("driver", "archive", "consensus", "service")}
    )
    config = write_config(tmp_path / "node.toml", driver_dir, 9999, consensus={"authenticator_secret": "s3cret-one"})
    resolved = supervisor.resolve_config(options, {}, config, env={"FULMAR_ARCHIVE_SECRET": "stray"})
    specs = {spec.log_name: spec for spec in resolved.child_specs()}
    assert specs["archive"].env["FULMAR_CLUSTER_SECRET"] == "s3cret-one"
    assert specs["consensus"].env["FULMAR_ARCHIVE_SECRET"] == "s3cret-one"
    assert "FULMAR_ARCHIVE_SECRET" not in specs["service0"].env  # IPC to its archive: not needed
    assert "FULMAR_CLUSTER_SECRET" not in specs["driver"].env
    assert all("s3cret-one" not in spec.args for spec in specs.values())
    assert "s3cret-one" not in resolved.to_toml()
    apart = write_config(
        tmp_path / "apart.toml",
        driver_dir,
        9999,
        archive={"authenticator_secret": "s3cret-two"},
        consensus={
            "authenticator_secret": "s3cret-one",
            "archive_control_channel": "aeron:udp?endpoint=127.0.0.1:8010",
        },
    )
    specs = {spec.log_name: spec for spec in supervisor.resolve_config(options, {}, apart, env={}).child_specs()}
    assert specs["archive"].env["FULMAR_CLUSTER_SECRET"] == "s3cret-two"
    assert specs["consensus"].env["FULMAR_CLUSTER_SECRET"] == "s3cret-one"
    assert specs["consensus"].env["FULMAR_ARCHIVE_SECRET"] == "s3cret-two"
    assert specs["service0"].env["FULMAR_ARCHIVE_SECRET"] == "s3cret-two"  # UDP to its archive
    assert "FULMAR_CLUSTER_SECRET" not in specs["service0"].env
    # From the environment alone, the archive's option takes the same secret.
    resolved = supervisor.resolve_config(
        options,
        {},
        write_config(tmp_path / "env.toml", driver_dir, 9999),
        env={"FULMAR_CLUSTER_SECRET": "s3cret-three"},
    )
    assert resolved.values[("archive", "authenticator_secret")] == "s3cret-three"
    assert {spec.log_name: spec for spec in resolved.child_specs()}["archive"].env[
        "FULMAR_CLUSTER_SECRET"
    ] == "s3cret-three"


def test_the_members_secret_reaches_the_consensus_module_and_the_driver_only(tmp_path: Path, driver_dir: Path) -> None:
    """The members sign with ``[consensus] member_secret``, else with the
    cluster's secret: the consensus module is handed the first (it falls back
    itself), the driver whichever is in use (it MACs the datagrams of the
    channels between members); no one else gets it, never on a command line;
    with member authentication off the driver gets none."""
    options = supervisor.build_options(
        {name: getattr(cluster_node, name) for name in ("driver", "archive", "consensus", "service")}
    )
    config = write_config(
        tmp_path / "node.toml",
        driver_dir,
        9999,
        consensus={"authenticator_secret": "clients-one", "member_secret": "members-one"},
    )
    specs = {spec.log_name: spec for spec in supervisor.resolve_config(options, {}, config, env={}).child_specs()}
    assert specs["consensus"].env["FULMAR_MEMBER_SECRET"] == "members-one"
    assert specs["driver"].env["FULMAR_MEMBER_SECRET"] == "members-one"
    assert "FULMAR_CLUSTER_SECRET" not in specs["driver"].env
    assert "FULMAR_MEMBER_SECRET" not in specs["archive"].env
    assert "FULMAR_MEMBER_SECRET" not in specs["service0"].env
    assert all("members-one" not in " ".join(spec.args) for spec in specs.values())
    # The cluster's secret alone: the driver signs with it, the module derives its key from it.
    config = write_config(tmp_path / "one.toml", driver_dir, 9999, consensus={"authenticator_secret": "clients-two"})
    specs = {spec.log_name: spec for spec in supervisor.resolve_config(options, {}, config, env={}).child_specs()}
    assert specs["driver"].env["FULMAR_MEMBER_SECRET"] == "clients-two"
    assert "FULMAR_MEMBER_SECRET" not in specs["consensus"].env
    # From the environment; a stray one in the supervisor's own environment reaches no one else.
    config = write_config(tmp_path / "env.toml", driver_dir, 9999)
    specs = {
        spec.log_name: spec
        for spec in supervisor.resolve_config(
            options, {}, config, env={"FULMAR_MEMBER_SECRET": "members-three"}
        ).child_specs()
    }
    assert specs["consensus"].env["FULMAR_MEMBER_SECRET"] == "members-three"
    assert specs["driver"].env["FULMAR_MEMBER_SECRET"] == "members-three"
    # Member authentication off: the driver MACs nothing.
    config = write_config(
        tmp_path / "off.toml",
        driver_dir,
        9999,
        consensus={"authenticator_secret": "clients-four", "authenticate_members": False},
    )
    specs = {spec.log_name: spec for spec in supervisor.resolve_config(options, {}, config, env={}).child_specs()}
    assert "FULMAR_MEMBER_SECRET" not in specs["driver"].env


def test_the_service_error_setting_reaches_the_service(tmp_path: Path, driver_dir: Path) -> None:
    """``[service] on_service_error`` (and ``--service-on-service-error``,
    which beats it) is passed to each service container as its own
    ``--on-service-error``; unset, the container's default holds."""
    options = supervisor.build_options(
        {name: getattr(cluster_node, name) for name in ("driver", "archive", "consensus", "service")}
    )
    config = write_config(
        tmp_path / "node.toml", driver_dir, 9999, service={"service": KV, "count": 2, "on_service_error": "stop"}
    )

    def service_args(flags: dict[str, Any]) -> list[list[str]]:
        specs = supervisor.resolve_config(options, flags, config, env={}).child_specs()
        return [spec.args for spec in specs if spec.log_name.startswith("service")]

    for args in service_args({}):
        assert args[args.index("--on-service-error") + 1] == "stop", args
    for args in service_args({"service_on_service_error": "continue"}):
        assert args[args.index("--on-service-error") + 1] == "continue", args
    config.write_text(config.read_text().replace('on_service_error = "stop"\n', ""))
    assert all("--on-service-error" not in args for args in service_args({}))


def test_a_flag_from_the_environment_reads_as_the_process_reads_it(tmp_path: Path, driver_dir: Path) -> None:
    """A boolean option's environment variable holds text (true/false, 1/0,
    ...), read as the process's own option would read it; anything else is
    refused naming the variable."""
    options = supervisor.build_options(
        {name: getattr(cluster_node, name) for name in ("driver", "archive", "consensus", "service")}
    )
    config = write_config(tmp_path / "node.toml", driver_dir, 9999)
    place = ("consensus", "native_append_position")
    for text, value in (("false", False), ("0", False), ("no", False), ("true", True), ("1", True)):
        resolved = supervisor.resolve_config(options, {}, config, env={"FULMAR_NATIVE_APPEND_POSITION": text})
        assert resolved.values[place] is value, text
        args = {spec.log_name: spec for spec in resolved.child_specs()}["consensus"].args
        assert ("--native-append-position" if value else "--agent-append-position") in args
    with pytest.raises(supervisor.ConfigError, match=r"\$FULMAR_NATIVE_APPEND_POSITION: .* not 'maybe'"):
        supervisor.resolve_config(options, {}, config, env={"FULMAR_NATIVE_APPEND_POSITION": "maybe"})


def test_help_documents_every_option() -> None:
    result = CliRunner().invoke(cluster_node.start, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # help lines wrap
    options = supervisor.build_options(
        {name: getattr(cluster_node, name) for name in ("driver", "archive", "consensus", "service")}
    )
    for option in options:
        assert option.flag in text, option.flag
        assert f"[config: [{option.section}] {option.key}]" in text, option.key
    for section in ("driver", "archive", "consensus"):
        command = getattr(cluster_node, section)
        mirrored = {o.key for o in options if o.section == section}
        expected = {p.name for p in command.params if p.name not in supervisor._DERIVED[section]}
        assert mirrored == expected, section
    assert "[env: FULMAR_DRIVER_DIR]" in text and "[env: FULMAR_CLUSTER_SECRET]" in text
