"""Starting a real media driver process for tests, and reaping it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fulmar.aeron import Aeron
from fulmar.cli.supervisor import free_udp_port  # noqa: F401  (for the tests: a free loopback UDP port)
from fulmar.cnc import CncError, CncFile

_DRIVER_CODE = """
import sys, json
from pathlib import Path
from fulmar.cnc import CncLayout
from fulmar.driver.context import DriverContext
from fulmar.driver.media_driver import run_driver
options = json.loads(sys.argv[1])
layout = CncLayout.sized(**options.pop("layout", {}))
token = options.pop("terminate_token", None)
if "member_secret" in options:  # text (JSON has no bytes); "" for none whatever the environment says
    secret = options.pop("member_secret")
    options["member_secret"] = secret.encode() if secret else None
run_driver(DriverContext(directory=Path(options.pop("directory")), cnc_layout=layout,
                         terminate_token=token.encode() if token else None, **options))
"""


def wait_for(condition: Any, timeout_s: float, message: str, poll_s: float = 0.002) -> Any:
    """Poll ``condition()`` until it returns something truthy, or fail after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
        time.sleep(poll_s)


class DriverProcess:
    def __init__(self, directory: Path, **options: Any) -> None:
        import json

        self.directory = directory
        options["directory"] = str(directory)
        options.setdefault(
            "layout",
            {
                "to_driver_capacity": 256 * 1024,
                "to_clients_capacity": 256 * 1024,
                "counters_values_length": 256 * 1024,
                "error_log_length": 256 * 1024,
            },
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", _DRIVER_CODE, json.dumps(options)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(self._ready, 20, f"the media driver in {directory} to start")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"driver exited with {self.process.returncode}: {self.process.stderr.read() if self.process.stderr else ''}"
            )
        try:
            with CncFile.open(self.directory) as cnc:
                # A dead driver's leftover file does not count: it must be ours.
                return cnc.pid == self.process.pid
        except CncError:
            return False

    def connect(self, **options: Any) -> Aeron:
        return Aeron.connect(self.directory, **options)

    def kill(self) -> None:
        kill_process(self.process)

    def stop(self) -> int:
        return stop_process(self.process, 10)


def main_thread_wakes(pid: int) -> int:
    """How often the process's main thread (where each fulmar agent runs its
    duty cycle) has gone to sleep and woken so far: its voluntary context
    switches, one per sleep that ended (on a doorbell, a timer, a socket)."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def main_thread_wakes_per_second(pids: dict[str, int], window_s: float) -> dict[str, float]:
    """Each process's main-thread wake-ups per second over a window of ``window_s``
    (a rate needs a window: the one fixed sleep a test may take)."""
    before = {name: main_thread_wakes(pid) for name, pid in pids.items()}
    time.sleep(window_s)
    return {name: (main_thread_wakes(pid) - before[name]) / window_s for name, pid in pids.items()}


def kill_process(process: subprocess.Popen[Any]) -> None:
    """SIGKILL, and reap."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(10)


def stop_process(process: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; reaped either way.  The exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.returncode


def new_driver_dir() -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return Path(tempfile.mkdtemp(prefix="fulmar-test-", dir=base)) / "driver"


def remove_driver_dir(directory: Path) -> None:
    shutil.rmtree(directory.parent, ignore_errors=True)
