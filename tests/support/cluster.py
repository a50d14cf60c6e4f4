"""Clusters of real processes for tests: the media driver, archive,
consensus module and service container of each member, each started with
``cluster-node``, all reaped and their directories removed.

``SingleNodeCluster`` is one member; ``LocalCluster`` is N members on
127.0.0.1 with the ports and members string ``cluster-node start --local N``
would generate, each process started (and killed) on its own."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fulmar.aeron import Aeron
from fulmar.cli import supervisor
from fulmar.consensus.client import ClusterClient
from support.archive import ArchiveProcess
from support.driver import (
    DriverProcess,
    free_udp_port,
    kill_process,
    new_driver_dir,
    remove_driver_dir,
    stop_process,
    wait_for,
)


class NodeProcess:
    """A ``cluster-node`` subcommand; ready once it printed ``ready_text``.

    With ``wait=False`` the constructor returns at once (call ``wait_ready``):
    the caller holds the object, so it can reap the process whatever happens.
    """

    def __init__(
        self,
        args: list[str],
        ready_text: str,
        log_path: Path,
        *,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = args
        self.ready_text = ready_text
        self.log_path = log_path
        self._log = open(log_path, "a")
        self._start = log_path.stat().st_size  # a restart appends: only what it prints counts
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fulmar.cli.cluster_node", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        if wait:
            self.wait_ready(30)

    def wait_ready(self, timeout_s: float) -> NodeProcess:
        wait_for(lambda: self._ready(self.ready_text), timeout_s, f"{self.args[0]} to start (log {self.log_path})")
        return self

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _ready(self, text: str) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.args[0]} exited with {self.process.returncode}: {self.output()}")
        return text in self.output()

    def output(self) -> str:
        return self.log_path.read_text()[self._start :]

    def stop(self, timeout_s: float = 30) -> int:
        code = stop_process(self.process, timeout_s)
        self._log.close()
        return code

    def kill(self) -> None:
        kill_process(self.process)
        self._log.close()


class SingleNodeCluster:
    def __init__(
        self,
        service: str,
        *,
        extra_consensus_args: tuple[str, ...] = (),
        extra_service_args: tuple[str, ...] = (),
        driver_options: dict[str, Any] | None = None,
    ) -> None:
        self.service_name = service
        self.extra_consensus_args = extra_consensus_args
        self.extra_service_args = extra_service_args
        self.driver_options = driver_options or {}  # DriverProcess options (e.g. a bigger cnc layout)
        self.base = Path(tempfile.mkdtemp(prefix="fulmar-cluster-"))
        self.driver_dir = new_driver_dir()
        self.ingress_channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        self.driver: DriverProcess | None = None
        self.archive: ArchiveProcess | None = None
        self.consensus: NodeProcess | None = None
        self.service: NodeProcess | None = None
        self.clients: list[Aeron] = []

    @property
    def cluster_dir(self) -> Path:
        return self.base / "cluster"

    def start(self) -> SingleNodeCluster:
        """Start whatever is not running (after a crash: the dead ones)."""
        if self.driver is None or self.driver.process.poll() is not None:
            self.driver = DriverProcess(self.driver_dir, **self.driver_options)
        if self.archive is None or self.archive.process.poll() is not None:
            self.archive = ArchiveProcess(self.base / "archive", self.driver_dir)
        self.start_consensus()
        self.start_service()
        return self

    def start_consensus(self) -> NodeProcess:
        self.consensus = NodeProcess(
            [
                "consensus",
                "--cluster-dir",
                str(self.cluster_dir),
                "--driver-dir",
                str(self.driver_dir),
                "--ingress-channel",
                self.ingress_channel,
                *self.extra_consensus_args,
            ],
            "consensus module pid",
            self.base / "consensus.log",
        )
        return self.consensus

    def start_service(self) -> NodeProcess:
        self.service = NodeProcess(
            [
                "service",
                "--cluster-dir",
                str(self.cluster_dir),
                "--driver-dir",
                str(self.driver_dir),
                "--service",
                self.service_name,
                *self.extra_service_args,
            ],
            "service 0 (",
            self.base / "service.log",
        )
        return self.service

    def kill_all(self) -> None:
        """SIGKILL every process of the node (what a crash of the machine's
        processes looks like; the files stay)."""
        for aeron in self.clients:
            aeron.close()
        self.clients.clear()
        for process in (self.service, self.consensus):
            if process is not None:
                process.kill()
        if self.archive is not None:
            self.archive.kill()
        if self.driver is not None:
            self.driver.kill()

    def connect(self) -> Aeron:
        assert self.driver is not None
        aeron = self.driver.connect()
        self.clients.append(aeron)
        return aeron

    def stop_node(self) -> None:
        """An orderly stop of the cluster processes (a snapshot is taken), archive and driver kept.

        Each gets SIGTERM twice on purpose, as when a service manager and a
        supervisor both send one: a repeated SIGTERM is the same request."""
        for _ in range(2):
            for process in (self.consensus, self.service):
                if process is not None and process.process.poll() is None:
                    process.process.send_signal(signal.SIGTERM)
        for process in (self.consensus, self.service):
            if process is not None:
                process.stop()

    def close(self) -> None:
        for aeron in self.clients:
            aeron.close()
        self.clients.clear()
        try:
            self.stop_node()
        finally:
            if self.archive is not None:
                self.archive.stop()
            if self.driver is not None:
                self.driver.stop()
            remove_driver_dir(self.driver_dir)
            shutil.rmtree(self.base, ignore_errors=True)


KEY_VALUE_SERVICE = supervisor.DEFAULT_LOCAL_SERVICE
KINDS = ("driver", "archive", "consensus", "service")
_READY = {
    "driver": "media driver pid",
    "archive": "archive pid",
    "consensus": "consensus module pid",
    "service": "service 0 (",
}
# Small cnc.dat buffers (as DriverProcess uses): N drivers share one /dev/shm.
_DRIVER_ARGS = (
    "--to-driver-buffer",
    "256k",
    "--to-clients-buffer",
    "256k",
    "--counters-buffer",
    "256k",
    "--error-buffer",
    "256k",
)
# Election timing for tests: an election within seconds, not the minute of
# the start-up canvass default.  Flags a test appends win (click keeps the last).
FAST_ELECTION_ARGS = (
    "--startup-canvass-timeout",
    "2s",
    "--election-timeout",
    "500ms",
    "--election-status-interval",
    "50ms",
    "--leader-heartbeat-timeout",
    "3s",
    "--leader-heartbeat-interval",
    "100ms",
)


class LocalCluster:
    """N members on 127.0.0.1, each member's four processes started on its own.

    The ports, members string and channels are those ``cluster-node start
    --local N`` generates (``supervisor.allocate_local_ports`` and friends).
    Member i lives in ``base/node<i>/`` (archive/, cluster/, logs/<kind>.log),
    its driver in a directory of its own (under /dev/shm when there is one).
    Clients get a driver of their own (``connect()``), as a client machine
    would.  ``close`` reaps every process and removes every directory,
    whatever state the cluster is in.
    """

    def __init__(
        self,
        members: int = 3,
        service: str = KEY_VALUE_SERVICE,
        *,
        extra_consensus_args: Sequence[str] = FAST_ELECTION_ARGS,
        extra_archive_args: Sequence[str] = (),
        extra_driver_args: Sequence[str] = (),
        extra_service_args: Sequence[str] = (),
        ready_timeout_s: float = 60,
        secret: str | None = None,
        member_secret: str | None = None,
    ) -> None:
        self.size = members
        # The node's secret, as cluster-node start hands it out: the consensus
        # module and the archive authenticate with it, the driver MACs the
        # channels between members with it; clients present it.  A members'
        # secret apart (``member_secret``) is what the members sign and MAC
        # with instead.
        self.secret = secret
        self.member_secret = member_secret
        self.service_name = service
        # Lists, so that a test may change them before (re)starting a process.
        self.extra_consensus_args = list(extra_consensus_args)
        self.extra_archive_args = list(extra_archive_args)
        self.extra_driver_args = list(extra_driver_args)
        self.extra_service_args = list(extra_service_args)
        self.ready_timeout_s = ready_timeout_s
        self.ports = supervisor.allocate_local_ports(members)
        self.cluster_members = supervisor.local_members_string(self.ports)
        self.ingress_endpoints = supervisor.local_ingress_endpoints(self.ports)
        self.base = Path(tempfile.mkdtemp(prefix="fulmar-local-"))
        self.driver_dirs = [new_driver_dir() for _ in range(members)]
        self.client_driver_dir = new_driver_dir()
        self.processes: list[dict[str, NodeProcess]] = [{} for _ in range(members)]
        self.client_driver: NodeProcess | None = None
        self.aerons: list[Aeron] = []
        self.clients: list[ClusterClient] = []
        self._client_driver_lock = threading.Lock()
        for member in range(members):
            (self.member_dir(member) / "logs").mkdir(parents=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- where things are

    def member_dir(self, member: int) -> Path:
        return self.base / f"node{member}"

    def cluster_dir(self, member: int) -> Path:
        return self.member_dir(member) / "cluster"

    def archive_dir(self, member: int) -> Path:
        return self.member_dir(member) / "archive"

    def driver_dir(self, member: int) -> Path:
        return self.driver_dirs[member]

    def log_path(self, member: int, kind: str) -> Path:
        return self.member_dir(member) / "logs" / f"{kind}.log"

    def ingress_channel(self, member: int) -> str:
        return f"aeron:udp?endpoint={self.ports[member].endpoint('ingress')}"

    def archive_control_channel(self, member: int) -> str:
        return f"aeron:udp?endpoint={self.ports[member].endpoint('archive')}"

    def command(self, member: int, kind: str) -> list[str]:
        """The ``cluster-node`` arguments of one process of ``member``."""
        driver_dir = str(self.driver_dir(member))
        if kind == "driver":
            return ["driver", "--dir", driver_dir, *_DRIVER_ARGS, *self.extra_driver_args]
        if kind == "archive":
            return [
                "archive",
                "--dir",
                str(self.archive_dir(member)),
                "--driver-dir",
                driver_dir,
                "--control-channel",
                self.archive_control_channel(member),
                "--replication-channel",
                "aeron:udp?endpoint=127.0.0.1:0",
                *self.extra_archive_args,
            ]
        if kind == "consensus":
            return [
                "consensus",
                "--cluster-dir",
                str(self.cluster_dir(member)),
                "--driver-dir",
                driver_dir,
                "--member-id",
                str(member),
                "--ingress-channel",
                self.ingress_channel(member),
                "--log-channel",
                supervisor.LOCAL_LOG_CHANNEL,
                "--cluster-members",
                self.cluster_members,
                *self.extra_consensus_args,
            ]
        if kind == "service":
            return [
                "service",
                "--cluster-dir",
                str(self.cluster_dir(member)),
                "--driver-dir",
                driver_dir,
                "--service",
                self.service_name,
                "--member-id",
                str(member),
                *self.extra_service_args,
            ]
        raise ValueError(f"no process kind {kind!r} (kinds: {', '.join(KINDS)})")

    def environment(self, kind: str) -> dict[str, str] | None:
        """A process's environment: with a secret, what ``cluster-node start``
        would hand that kind of process (None: this one's own)."""
        if self.secret is None:
            return None
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("FULMAR_CLUSTER_SECRET", "FULMAR_MEMBER_SECRET", "FULMAR_ARCHIVE_SECRET")
        }
        if kind == "driver":
            env["FULMAR_MEMBER_SECRET"] = self.member_secret or self.secret
        elif kind in ("consensus", "archive"):
            env["FULMAR_CLUSTER_SECRET"] = self.secret
        if kind == "consensus" and self.member_secret is not None:
            env["FULMAR_MEMBER_SECRET"] = self.member_secret
        return env

    # -- processes

    def process(self, member: int, kind: str) -> NodeProcess | None:
        return self.processes[member].get(kind)

    def is_running(self, member: int, kind: str) -> bool:
        process = self.process(member, kind)
        return process is not None and process.alive

    def launch(self, member: int, kind: str, extra_args: Sequence[str] = ()) -> NodeProcess:
        """Start one process of ``member`` without waiting for it to be ready."""
        previous = self.process(member, kind)
        if previous is not None:
            if previous.alive:
                raise AssertionError(f"member {member}'s {kind} (pid {previous.process.pid}) is still running")
            previous.kill()  # reaped already; this closes its log file
        process = NodeProcess(
            [*self.command(member, kind), *extra_args],
            _READY[kind],
            self.log_path(member, kind),
            wait=False,
            env=self.environment(kind),
        )
        self.processes[member][kind] = process  # held before waiting: close() reaps it whatever happens
        return process

    def start_process(self, member: int, kind: str, extra_args: Sequence[str] = ()) -> NodeProcess:
        """(Re)start one process of ``member`` and wait until it is ready."""
        return self.launch(member, kind, extra_args).wait_ready(self.ready_timeout_s)

    def start(self, members: Sequence[int] | None = None) -> LocalCluster:
        """Start every process that is not running (of ``members``, or of every
        member), one kind at a time across the members (every driver, then
        every archive, ...): a consensus module may wait for the other members
        before it says it is ready, so no member's is awaited before the
        others are launched."""
        chosen = range(self.size) if members is None else members
        for kind in KINDS:
            launched = [self.launch(member, kind) for member in chosen if not self.is_running(member, kind)]
            for process in launched:
                process.wait_ready(self.ready_timeout_s)
        return self

    def start_member(self, member: int) -> None:
        """Start whatever of ``member`` is not running, in order, each once ready."""
        for kind in KINDS:
            if not self.is_running(member, kind):
                self.start_process(member, kind)

    def kill_process(self, member: int, kind: str) -> None:
        """SIGKILL one process of ``member`` and reap it."""
        process = self.process(member, kind)
        if process is not None:
            process.kill()

    def kill_member(self, member: int) -> None:
        """SIGKILL all four processes of ``member`` at once (a crashed machine;
        its files stay), then reap them."""
        running = [process for process in self.processes[member].values() if process.alive]
        for process in running:
            process.process.send_signal(signal.SIGKILL)
        for process in running:
            process.kill()

    def stop_process(self, member: int, kind: str, timeout_s: float = 30) -> int:
        """SIGTERM one process (a consensus module: its orderly stop), SIGKILL
        after ``timeout_s``; the exit code."""
        process = self.process(member, kind)
        if process is None:
            raise AssertionError(f"member {member}'s {kind} was never started")
        return process.stop(timeout_s)

    # -- clients

    def connect(self, member: int | None = None) -> Aeron:
        """An Aeron client on ``member``'s driver, or (None) on the clients' own
        driver, started on first use."""
        if member is None:
            with self._client_driver_lock:  # clients on several threads start one driver
                self._start_client_driver()
            directory = self.client_driver_dir
        else:
            directory = self.driver_dir(member)
        aeron = Aeron.connect(directory)
        self.aerons.append(aeron)
        return aeron

    def _start_client_driver(self) -> None:
        if self.client_driver is None or not self.client_driver.alive:
            if self.client_driver is not None:
                self.client_driver.kill()  # reaped already; closes its log file
            self.client_driver = NodeProcess(
                ["driver", "--dir", str(self.client_driver_dir), *_DRIVER_ARGS],
                _READY["driver"],
                self.base / "client-driver.log",
                wait=False,
            )
            self.client_driver.wait_ready(self.ready_timeout_s)

    def connect_client(self, member: int | None = None, **options: Any) -> ClusterClient:
        """A client session given every member's ingress endpoint (the client
        finds the leader), through ``connect(member)``."""
        options.setdefault("egress_channel", "aeron:udp?endpoint=127.0.0.1:0")
        options.setdefault("message_timeout_ns", 20_000_000_000)
        if self.secret is not None:
            options.setdefault("credentials", self.secret.encode())
        client = ClusterClient.connect(self.connect(member), "aeron:udp", self.ingress_endpoints, **options)
        self.clients.append(client)
        return client

    # -- the end

    def close(self, timeout_s: float = 5, *, copy_to: Path | None = None) -> None:
        """Close the clients, reap every process (SIGTERM, then SIGKILL after
        ``timeout_s``) and remove every directory, even when a step fails.
        ``copy_to``: first copy the members' directories there, once every
        process has stopped (what they wrote, as they left it)."""
        try:
            closeables: list[ClusterClient | Aeron] = [*self.clients, *self.aerons]
            for closeable in closeables:
                try:
                    closeable.close()
                except Exception:  # noqa: BLE001 - a client of a dead cluster may fail to close; reap anyway
                    pass
            self.clients.clear()
            self.aerons.clear()
        finally:
            try:
                # The cluster's processes first (a module stopping in order
                # still needs its archive and driver), then the rest.
                cluster = [
                    p for member in self.processes for kind, p in member.items() if kind in ("consensus", "service")
                ]
                rest = [p for member in self.processes for kind, p in member.items() if kind in ("archive", "driver")]
                try:
                    self._terminate(cluster, timeout_s)
                finally:
                    self._terminate([*rest, *([self.client_driver] if self.client_driver else [])], timeout_s)
            finally:
                try:
                    if copy_to is not None:
                        shutil.copytree(self.base, copy_to, dirs_exist_ok=True, copy_function=copy_sparse)
                finally:
                    for directory in [*self.driver_dirs, self.client_driver_dir]:
                        remove_driver_dir(directory)
                    shutil.rmtree(self.base, ignore_errors=True)

    @staticmethod
    def _terminate(processes: list[NodeProcess], timeout_s: float) -> None:
        """SIGTERM to all at once, then each is waited for until one shared
        deadline and killed if still there; all reaped."""
        for process in processes:
            if process.alive:
                process.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in processes:
            try:
                process.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            process.kill()  # SIGKILL if it is still there; reaps; closes its log file


def copy_sparse(source: str, destination: str) -> str:
    """``shutil.copy2`` that keeps a file's holes: only its data extents are
    copied.  A segment file is mostly hole (128 MiB long, a few KiB of it
    written): a plain copy of a cluster's archives writes gigabytes of zeros."""
    with open(source, "rb") as src, open(destination, "wb") as dst:
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                data = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError as error:
                if error.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            hole = os.lseek(src.fileno(), data, os.SEEK_HOLE)
            src.seek(data)
            dst.seek(data)
            while data < hole:
                chunk = src.read(min(hole - data, 1 << 20))
                if not chunk:  # the file shrank meanwhile
                    break
                dst.write(chunk)
                data += len(chunk)
            offset = hole
        dst.truncate(size)
    shutil.copystat(source, destination)
    return destination


__all__ = [
    "FAST_ELECTION_ARGS",
    "KINDS",
    "LocalCluster",
    "NodeProcess",
    "SingleNodeCluster",
    "copy_sparse",
    "free_udp_port",
]


def bare_member_agent(aeron: Any, cluster_dir: Path, **context_fields: Any) -> Any:
    """A ``ConsensusModuleAgent`` of member 1 of three, on ``aeron``'s driver,
    with no archive, recording log or election: a test drives its positions
    and messages itself (the other two members never run).  ``context_fields``
    set more of its context."""
    from fulmar.consensus.agent import ConsensusModuleAgent
    from fulmar.consensus.context import ConsensusModuleContext

    ports = supervisor.allocate_local_ports(3)
    context = ConsensusModuleContext(
        cluster_dir=cluster_dir,
        member_id=1,
        cluster_members=supervisor.local_members_string(ports),
        ingress_channel=f"aeron:udp?endpoint={ports[1].endpoint('ingress')}",
        **context_fields,
    )
    agent = ConsensusModuleAgent(context, aeron, archive=None, recording_log=None)  # type: ignore[arg-type]
    agent.election = None
    return agent
