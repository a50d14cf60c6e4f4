"""Archive processes for tests: started with ``cluster-node archive``, reaped."""

from __future__ import annotations

import os
import shutil
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

from fulmar.aeron import Aeron
from fulmar.archive.client import AeronArchive


class ArchiveProcess:
    """``cluster-node archive`` in a child process; ready once it printed its banner."""

    def __init__(self, archive_dir: Path, driver_dir: Path, *extra: str, control_port: int | None = None) -> None:
        self.archive_dir = archive_dir
        self.driver_dir = driver_dir
        self.control_port = control_port
        control = f"aeron:udp?endpoint=127.0.0.1:{control_port}" if control_port else "none"
        args = [
            sys.executable,
            "-m",
            "fulmar.cli.cluster_node",
            "archive",
            "--dir",
            str(archive_dir),
            "--driver-dir",
            str(driver_dir),
            "--control-channel",
            control,
            "--replication-channel",
            "aeron:udp?endpoint=127.0.0.1:0",
            *extra,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        self.banner = ""
        wait_for(self._ready, 30, f"the archive in {archive_dir} to start")

    def _ready(self) -> bool:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line:
            self.banner += line
        if self.process.poll() is not None:
            raise AssertionError(f"archive exited with {self.process.returncode}: {self.stderr()}")
        return "serving" in self.banner

    def stderr(self) -> str:
        assert self.process.stderr is not None
        try:
            return self.process.stderr.read() or ""
        except (OSError, ValueError):
            return ""

    @property
    def control_channel(self) -> str:
        assert self.control_port is not None
        return f"aeron:udp?endpoint=127.0.0.1:{self.control_port}"

    def kill(self) -> None:
        kill_process(self.process)

    def stop(self) -> int:
        return stop_process(self.process, 15)


class ArchiveNode:
    """A media driver and an archive in child processes, with this process's
    client of both; ``close`` reaps them and removes their directories."""

    def __init__(self, name: str) -> None:
        self.driver_dir = new_driver_dir()
        self.archive_dir = Path(tempfile.mkdtemp(prefix=f"fulmar-archive-{name}-"))
        self.driver: DriverProcess | None = None
        self.archive: ArchiveProcess | None = None
        self.aeron: Aeron | None = None
        self.client: AeronArchive | None = None

    def start(self) -> ArchiveNode:
        self.driver = DriverProcess(self.driver_dir)
        self.archive = ArchiveProcess(
            self.archive_dir, self.driver_dir, "--segment-length", "1m", control_port=free_udp_port()
        )
        self.aeron = self.driver.connect()
        self.client = AeronArchive.connect(self.aeron)
        return self

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.close()
            if self.aeron is not None:
                self.aeron.close()
        finally:
            if self.archive is not None:
                self.archive.stop()
            if self.driver is not None:
                self.driver.stop()
            remove_driver_dir(self.driver_dir)
            shutil.rmtree(self.archive_dir, ignore_errors=True)
