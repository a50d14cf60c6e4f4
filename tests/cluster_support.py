"""A one-member cluster of real processes for tests: media driver, archive,
consensus module and service container, each started with ``cluster-node``,
all reaped and their directories removed."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from driver_support import (
    DriverProcess,
    free_udp_port,
    kill_process,
    new_driver_dir,
    remove_driver_dir,
    stop_process,
    wait_for,
)

from archive_support import ArchiveProcess
from fulmar.aeron import Aeron


class NodeProcess:
    """A ``cluster-node`` subcommand; ready once it printed ``ready_text``."""

    def __init__(self, args: list[str], ready_text: str, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "a")
        self._start = log_path.stat().st_size  # a restart appends: only what it prints counts
        self.process = subprocess.Popen([sys.executable, "-m", "fulmar.cli.cluster_node", *args],
                                        stdout=self._log, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: self._ready(ready_text), 30, f"{args[0]} to start (log {log_path})")

    def _ready(self, text: str) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.process.args[3]} exited with {self.process.returncode}: {self.output()}")
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
    def __init__(self, service: str, *, extra_consensus_args: tuple[str, ...] = ()) -> None:
        self.service_name = service
        self.extra_consensus_args = extra_consensus_args
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

    def start(self) -> "SingleNodeCluster":
        """Start whatever is not running (after a crash: the dead ones)."""
        if self.driver is None or self.driver.process.poll() is not None:
            self.driver = DriverProcess(self.driver_dir)
        if self.archive is None or self.archive.process.poll() is not None:
            self.archive = ArchiveProcess(self.base / "archive", self.driver_dir)
        self.start_consensus()
        self.start_service()
        return self

    def start_consensus(self) -> NodeProcess:
        self.consensus = NodeProcess(
            ["consensus", "--cluster-dir", str(self.cluster_dir), "--driver-dir", str(self.driver_dir),
             "--ingress-channel", self.ingress_channel, *self.extra_consensus_args],
            "consensus module pid", self.base / "consensus.log")
        return self.consensus

    def start_service(self) -> NodeProcess:
        self.service = NodeProcess(
            ["service", "--cluster-dir", str(self.cluster_dir), "--driver-dir", str(self.driver_dir),
             "--service", self.service_name],
            "service 0 (", self.base / "service.log")
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
        """An orderly stop of the cluster processes (a snapshot is taken), archive and driver kept."""
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


__all__ = ["SingleNodeCluster", "NodeProcess", "free_udp_port"]
