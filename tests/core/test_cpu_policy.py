"""The node's processes run under SCHED_BATCH by default (``fulmar.cpu_policy``):
every thread of every process, the media driver's data-plane thread included;
``--cpu-policy normal`` (or ``[node] cpu_policy``) keeps Linux's default."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from fulmar.cnc import CncError, CncFile
from fulmar.cpu_policy import BATCH, CPU_POLICY_ENV, NORMAL, apply_cpu_policy, cpu_policy_of
from support.driver import new_driver_dir, remove_driver_dir, stop_process, wait_for
from support.node_start import STOP_S, Node, start_node  # noqa: F401 - start_node: a fixture

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

KV = "fulmar.service.samples:KeyValueService"


def thread_policies(process: psutil.Process) -> dict[int, str]:
    return {thread.id: cpu_policy_of(thread.id) for thread in process.threads()}


def test_every_thread_of_the_process_takes_the_policy_and_back() -> None:
    """In a child process (this one stays as it is): threads that exist already
    are moved too, and a thread started afterwards inherits the policy."""
    code = """
import os, threading
from fulmar.cpu_policy import apply_cpu_policy, cpu_policy_of
gate = threading.Event()
early = threading.Thread(target=gate.wait); early.start()
def policies():
    return sorted({cpu_policy_of(int(tid)) for tid in os.listdir("/proc/self/task")})
print(policies())
apply_cpu_policy("batch")
late = threading.Thread(target=gate.wait); late.start()
print(len(os.listdir("/proc/self/task")), policies())
apply_cpu_policy("normal")
print(policies())
gate.set(); early.join(); late.join()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['normal']", "3 ['batch']", "['normal']"], result.stdout


def test_a_policy_an_operator_chose_is_left_alone() -> None:
    """A process started under SCHED_IDLE (a background node, say by systemd's
    CPUSchedulingPolicy=idle) stays there: batch and normal choose only between
    Linux's default and SCHED_BATCH."""
    code = """
import os
from fulmar.cpu_policy import apply_cpu_policy
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
apply_cpu_policy("batch")
print(os.sched_getscheduler(0) == os.SCHED_IDLE)
apply_cpu_policy("normal")
print(os.sched_getscheduler(0) == os.SCHED_IDLE)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"], result.stdout


def test_an_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="CPU policy 'fifo': one of batch, normal"):
        apply_cpu_policy("fifo")


def run_driver(driver_dir: Path, *group_args: str) -> subprocess.Popen[bytes]:
    """``cluster-node [group_args] driver``, once it serves (its conductor and its
    data-plane thread both exist by then)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "fulmar.cli.cluster_node", *group_args, "driver", "--dir", str(driver_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def serving() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"cluster-node driver exited with {process.returncode}")
        try:
            with CncFile.open(driver_dir) as cnc:
                return cnc.pid == process.pid
        except CncError:
            return False

    try:
        wait_for(serving, 30, f"the media driver in {driver_dir} to serve")
    except BaseException:
        stop_process(process, 10)
        remove_driver_dir(driver_dir)
        raise
    return process


@pytest.mark.parametrize(
    ("group_args", "env", "expected"),
    [((), None, BATCH), (("--cpu-policy", "normal"), None, NORMAL), ((), NORMAL, NORMAL)],
)
def test_a_media_driver_runs_every_thread_under_the_policy(
    group_args: tuple[str, ...], env: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default, by the group option, and by the environment."""
    if env is None:
        monkeypatch.delenv(CPU_POLICY_ENV, raising=False)
    else:
        monkeypatch.setenv(CPU_POLICY_ENV, env)
    driver_dir = new_driver_dir()
    process = run_driver(driver_dir, *group_args)
    try:
        policies = thread_policies(psutil.Process(process.pid))
        assert len(policies) >= 2 and set(policies.values()) == {expected}, policies
    finally:
        stop_process(process, 10)
        remove_driver_dir(driver_dir)


@pytest.mark.parametrize(("start_args", "expected"), [((), BATCH), (("--cpu-policy", "normal"), NORMAL)])
def test_every_process_of_a_started_node_runs_under_the_policy(
    start_node: Callable[..., Node],
    tmp_path: Path,
    start_args: tuple[str, ...],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CPU_POLICY_ENV, raising=False)
    base = tmp_path / f"policy-{uuid.uuid4().hex[:6]}"
    node = start_node("--local", "1", "--dir", str(base), "--service", KV, *start_args)
    try:
        node.wait_ready()
        assert sorted(node.children) == ["archive", "consensus", "driver", "service0"], node.children
        for name, child in node.children.items():
            policies = thread_policies(child)
            assert set(policies.values()) == {expected}, (name, policies)
        config = (base / "node0" / "node.toml").read_text()
        assert ('cpu_policy = "normal"' in config) == (expected == NORMAL), config
        node.process.send_signal(signal.SIGTERM)
        assert node.wait(STOP_S) == 0, node.stdout + node.stderr
    finally:
        if node.driver_dir != Path() and node.driver_dir.exists():
            shutil.rmtree(node.driver_dir, ignore_errors=True)
