"""``cluster-node driver`` as a subprocess: start it, wait for its cnc.dat, stop it and read what it printed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fulmar.cnc import CncError, CncFile

DEADLINE_S = 15.0


# Small cnc.dat sections: a few hundred KiB instead of 8 MiB per driver.
SMALL_CNC = ["--to-driver-buffer", "64k", "--to-clients-buffer", "64k", "--counters-buffer", "64k",
             "--error-buffer", "64k"]  # fmt: skip


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


def reap(process: subprocess.Popen[str]) -> None:
    """Stop a process if it still runs: SIGTERM, a bounded wait, then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def start_driver(directory: Path, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fulmar.cli.cluster_node", "driver", "--dir", str(directory), *SMALL_CNC, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cnc_ready_for(directory: Path, process: subprocess.Popen[str]) -> bool:
    """True once ``process`` has published cnc.dat in ``directory``."""
    if process.poll() is not None:
        raise AssertionError(
            f"driver exited with {process.returncode}: {process.stderr.read() if process.stderr else ''}"
        )
    try:
        cnc = CncFile.open(directory)
    except CncError:
        return False
    try:
        return cnc.pid == process.pid
    finally:
        cnc.close()


@contextmanager
def running_driver(directory: Path, *options: str) -> Iterator[subprocess.Popen[str]]:
    process = start_driver(directory, *options)
    try:
        wait_for(lambda: cnc_ready_for(directory, process), f"the driver's cnc.dat in {directory}")
        yield process
    finally:
        reap(process)


def stop(process: subprocess.Popen[str], signum: int = signal.SIGTERM) -> tuple[int, str, str]:
    """Signal the driver and collect its exit code and output."""
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=DEADLINE_S)
    return process.returncode, stdout, stderr
