"""A media driver of a client's own: a child process in a directory of its own.

``EmbeddedDriver.start()`` runs ``python -m fulmar.driver.embedded`` (this
module) as a child of the calling thread, in a new directory under /dev/shm
(or the temporary directory), and returns once the driver serves.  ``close()``
stops it with SIGTERM (the driver's orderly stop) and removes the directory.

The driver never outlives its parent: it asks the kernel for SIGTERM when the
thread that started it ends (Linux's parent-death signal), which covers the
client process dying by SIGKILL; where there is no such signal it watches its
parent's pid instead.  On SIGTERM it stops in order and removes its
directory, its log included.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fulmar.cnc import CncError, CncFile, CncLayout
from fulmar.errors import FulmarError

# A client's driver serves a session or two: cnc.dat buffers of 256 KiB (as
# the tests' drivers), and 16 MiB terms (Aeron's default for network
# publications: calls of up to 2 MiB, an eighth of a term).
EMBEDDED_OPTIONS: dict[str, Any] = {
    "layout": {
        "to_driver_capacity": 256 * 1024,
        "to_clients_capacity": 256 * 1024,
        "counters_values_length": 256 * 1024,
        "error_log_length": 256 * 1024,
    },
    "ipc_term_length": 16 * 1024 * 1024,
}
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_PARENT_CHECK_INTERVAL_S = 0.5
_LOG_TAIL_CHARACTERS = 2000


class EmbeddedDriverError(FulmarError):
    """The client's own media driver could not start, or died."""


def _shm_or_temp() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


class EmbeddedDriver:
    """A media driver child process owned by this process (by the thread that starts it)."""

    def __init__(self, base: Path, process: subprocess.Popen[bytes]) -> None:
        self.base = base  # holds the driver's directory and its log; removed by close()
        self.process = process

    @property
    def directory(self) -> Path:
        return self.base / "driver"

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, timeout_s: float = START_TIMEOUT_S) -> EmbeddedDriver:
        """Start a driver and wait (at most ``timeout_s``) until it serves."""
        base = Path(tempfile.mkdtemp(prefix="fulmar-client-", dir=_shm_or_temp()))
        options = {**EMBEDDED_OPTIONS, "base": str(base), "parent_pid": os.getpid()}
        try:
            with open(base / "driver.log", "wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "fulmar.driver.embedded", json.dumps(options)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    close_fds=True,
                    # Not in the terminal's foreground group: a Ctrl-C meant for
                    # the client (which it may catch) does not stop its driver.
                    process_group=0,
                )
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        driver = cls(base, process)
        try:
            driver._await_ready(timeout_s)
        except BaseException:
            driver.close()
            raise
        return driver

    def _await_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise EmbeddedDriverError(
                    f"the client's media driver exited with {self.process.returncode} before it served: {self.log_tail()}"
                )
            try:
                with CncFile.open(self.directory) as cnc:
                    if cnc.pid == self.process.pid:  # ours, and past its version 0
                        return
            except CncError:
                pass
            if time.monotonic() > deadline:
                raise EmbeddedDriverError(
                    f"the client's media driver did not serve within {timeout_s:g} s: {self.log_tail()}"
                )
            time.sleep(0.005)

    def log_tail(self) -> str:
        try:
            text = (self.base / "driver.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text[-_LOG_TAIL_CHARACTERS:].strip() or "(its log is empty)"

    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, wait ``timeout_s`` for its orderly stop, else SIGKILL; reaped;
        the directory removed either way."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout_s)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


# ---------------------------------------------------------------------------- the child


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM to this process once its parent is gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGTERM)) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent_pid:  # the parent died before the prctl
                    os.kill(os.getpid(), signal.SIGTERM)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_CHECK_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _main(argv: list[str]) -> int:
    from fulmar.driver.context import DriverContext
    from fulmar.driver.media_driver import run_driver

    options = json.loads(argv[0])
    base = Path(options.pop("base"))
    parent_pid = options.pop("parent_pid")
    layout = CncLayout.sized(**options.pop("layout"))
    try:
        # Asked for once run_driver's SIGTERM handler is in (its orderly stop
        # removes the directory); a parent already gone by then is seen there.
        run_driver(
            DriverContext(directory=base / "driver", cnc_layout=layout, **options),
            on_ready=lambda driver: _die_with_parent(parent_pid),
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)  # the log too: the directory was made for this driver alone
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
