"""A client's own media driver (fulmar.driver.embedded): it serves, close()
stops it and removes its directory, and it never outlives its parent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from fulmar.aeron import Aeron
from fulmar.cnc import CncFile
from fulmar.driver.embedded import EmbeddedDriver
from support.driver import kill_process, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

# The parent-death signal arrives at once; the orderly stop takes the driver's
# close (its data plane thread, its files): well within this.
GONE_WITHIN_S = 10


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_driver_serves_and_close_stops_it_and_removes_its_directory() -> None:
    driver = EmbeddedDriver.start()
    try:
        assert driver.directory.parent == driver.base and driver.base.name.startswith("fulmar-client-")
        with CncFile.open(driver.directory) as cnc:
            assert cnc.pid == driver.pid
        with Aeron.connect(driver.directory) as aeron:
            subscription = aeron.add_subscription("aeron:ipc", 5)  # it answers commands
            assert subscription.registration_id > 0
    finally:
        driver.close()
    assert driver.process.returncode == 0, "the driver did not stop in order on SIGTERM"
    assert not driver.base.exists()


def test_a_parent_killed_with_sigkill_leaves_no_driver_behind(tmp_path: Path) -> None:
    # The parent starts its driver from a thread other than its main one, as
    # the Client does, and is then killed while that thread still runs.
    script = textwrap.dedent(
        """
        import json, sys, threading
        from fulmar.driver.embedded import EmbeddedDriver
        started = []
        thread = threading.Thread(target=lambda: (started.append(EmbeddedDriver.start()), threading.Event().wait()), daemon=True)
        thread.start()
        while not started:
            thread.join(0.01)
        print(json.dumps({"pid": started[0].pid, "base": str(started[0].base)}), flush=True)
        threading.Event().wait()
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    driver_pid, base = None, None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, f"the parent exited with {parent.wait(10)} before its driver served"
        started = json.loads(line)
        driver_pid, base = started["pid"], Path(started["base"])
        assert psutil.Process(driver_pid).ppid() == parent.pid and base.exists()
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: gone(driver_pid), GONE_WITHIN_S, f"driver {driver_pid} to stop after its parent died")
        # It stopped in order: its directory, log included, is gone too.
        wait_for(lambda: not base.exists(), GONE_WITHIN_S, f"{base} to be removed")
    finally:
        kill_process(parent)
        if driver_pid is not None and not gone(driver_pid):
            os.kill(driver_pid, signal.SIGKILL)
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
