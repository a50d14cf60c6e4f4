"""``cluster-node start`` from a TOML file: the config writer, a started node and its fixtures (``start_node``, a ``driver_dir`` under /dev/shm)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from fulmar.cli import cluster_node
from support.driver import wait_for

KV = "fulmar.service.samples:KeyValueService"


SHM = Path("/dev/shm") if os.path.isdir("/dev/shm") else None


READY = re.compile(r"node (\d+) ready: ingress (\S+); driver directory (\S+); pids (.*?);")


START_S = 60


STOP_S = 45


class Node:
    """``cluster-node start`` as a subprocess, its stdout and stderr in files."""

    def __init__(
        self,
        args: list[str],
        workdir: Path,
        *,
        new_session: bool = False,
        cwd: Path | None = None,
        script: bool = False,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:6]
        self.stdout_path = workdir / f"start-{tag}.out"
        self.stderr_path = workdir / f"start-{tag}.err"
        # new_session: as a terminal's foreground job, a process group of its
        # own (a Ctrl-C signals the whole group).
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.process = subprocess.Popen(
                # script: the installed cluster-node command, as a user runs it (python -m puts the
                # current directory on sys.path; the script puts its own directory there).
                [
                    str(Path(sys.executable).with_name("cluster-node")) if script else sys.executable,
                    *([] if script else ["-m", "fulmar.cli.cluster_node"]),
                    "start",
                    *args,
                ],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=new_session,
                cwd=cwd,
            )
        self.children: dict[str, psutil.Process] = {}
        self.ingress = ""
        self.driver_dir = Path()

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_ready(self) -> Node:
        def ready() -> Any:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"cluster-node start exited with {self.process.returncode}:\n{self.stdout}\n{self.stderr}"
                )
            return READY.search(self.stdout)

        match = wait_for(ready, START_S, "the node to be ready")
        self.ingress, self.driver_dir = match.group(2), Path(match.group(3))
        for entry in match.group(4).split(", "):
            name, pid = entry.split()
            self.children[name] = psutil.Process(int(pid))
        return self

    def wait(self, timeout_s: float = STOP_S) -> int:
        return self.process.wait(timeout_s)

    def reap(self) -> None:
        """Whatever happened: the supervisor and every child gone."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for child in self.children.values():
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(list(self.children.values()), timeout=10)


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def start(*args: str, new_session: bool = False, cwd: Path | None = None, script: bool = False) -> Node:
        node = Node(list(args), tmp_path / "supervisor", new_session=new_session, cwd=cwd, script=script)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.reap()
    for node in nodes:
        if node.driver_dir != Path() and node.driver_dir.exists():
            shutil.rmtree(node.driver_dir, ignore_errors=True)


@pytest.fixture
def driver_dir() -> Iterator[Path]:
    path = (SHM or Path("/tmp")) / f"fulmar-test-start-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_config(path: Path, driver_dir: Path, port: int, **sections: dict[str, Any]) -> Path:
    tables: dict[str, dict[str, Any]] = {
        "node": {"member_id": 0, "cluster_id": 0, "dir": "node0", "driver_dir": str(driver_dir)},
        "driver": {
            "to_driver_buffer": "64k",
            "to_clients_buffer": "64k",
            "counters_buffer": "64k",
            "error_buffer": "64k",
            "ipc_term_length": "1m",
        },
        "archive": {
            "control_channel": "none",
            "replication_channel": "aeron:udp?endpoint=127.0.0.1:0",
            "file_sync_level": 0,
            "record_checksum": True,
        },
        "consensus": {"ingress_channel": f"aeron:udp?endpoint=127.0.0.1:{port}", "session_timeout": "10s"},
        "service": {"service": KV, "count": 1},
    }
    for name, table in sections.items():
        tables.setdefault(name, {}).update(table)
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        for key, value in table.items():
            lines.append(f"{key} = {json.dumps(value)}")  # JSON scalars are TOML scalars
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def all_gone(processes: list[psutil.Process]) -> bool:
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def run_start(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cluster_node.start, list(args), env=env, catch_exceptions=False)
