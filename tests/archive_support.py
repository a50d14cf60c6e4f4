"""Archive processes for tests: started with ``cluster-node archive``, reaped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from driver_support import kill_process, stop_process, wait_for


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
