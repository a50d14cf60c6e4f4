"""The media driver process: owns a directory, cnc.dat and the conductor.

``MediaDriver.launch(context)`` claims the directory (refusing it while a
live driver uses it, reclaiming it from a dead one), creates cnc.dat, and
then ``run()`` drives the conductor until a signal or an authorised
TERMINATE_DRIVER arrives.  ``close()`` removes the directory unless asked to
keep it.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path
from types import FrameType

import psutil

from fulmar.cnc import CncError, CncFile
from fulmar.counters import CountersManager
from fulmar.error_log import DistinctErrorLog
from fulmar.errors import FulmarError
from fulmar.idle import Doorbell, idle_strategy_from_name
from fulmar.ring_buffer import ManyToOneRingBuffer

from fulmar.driver.conductor import DriverConductor
from fulmar.driver.context import DriverContext


class DriverAlreadyActiveError(FulmarError):
    """Another media driver is alive in the directory."""


def epoch_ms() -> int:
    return int(time.time() * 1000)


def active_driver_pid(directory: Path, timeout_ms: int) -> int | None:
    """The pid of a live driver using ``directory``, or None if it is free to reclaim.

    A driver counts as live while its process exists and it has updated its
    heartbeat (the to-driver buffer's consumer heartbeat) within the timeout,
    or it is still creating cnc.dat.
    """
    try:
        cnc = CncFile.open(directory)
    except CncError:
        return None
    try:
        pid = cnc.pid
        heartbeat_ms = ManyToOneRingBuffer(cnc.to_driver).consumer_heartbeat_time
    finally:
        cnc.close()
    if pid <= 0 or not psutil.pid_exists(pid):
        return None
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.NoSuchProcess:
        return None
    return pid if epoch_ms() - heartbeat_ms <= timeout_ms else None


class MediaDriver:
    def __init__(self, context: DriverContext, cnc: CncFile, conductor: DriverConductor, doorbell: Doorbell) -> None:
        self.context = context
        self.cnc = cnc
        self.conductor = conductor
        self.doorbell = doorbell
        self._stop = threading.Event()
        self._closed = False

    @classmethod
    def launch(cls, context: DriverContext) -> "MediaDriver":
        directory = Path(context.directory)
        timeout_ms = context.client_liveness_timeout_ns // 1_000_000
        pid = active_driver_pid(directory, timeout_ms)
        if pid is not None:
            raise DriverAlreadyActiveError(f"a media driver (pid {pid}) is already active in {directory}")
        if directory.exists():
            shutil.rmtree(directory)  # a dead driver's leftovers
        directory.mkdir(parents=True, mode=0o700)
        cnc = CncFile.create(directory, context.cnc_layout, context.client_liveness_timeout_ns, epoch_ms())
        doorbell = cnc.driver_doorbell()
        counters = CountersManager(
            cnc.counters_metadata, cnc.counters_values, context.counter_free_to_reuse_timeout_ms, epoch_ms
        )
        error_log = DistinctErrorLog(cnc.error_log, epoch_ms)
        conductor = DriverConductor(context, cnc, counters, error_log, epoch_ms, cnc.clients_doorbell().ring)
        conductor.on_start()
        cnc.signal_ready()
        return cls(context, cnc, conductor, doorbell)

    @property
    def directory(self) -> Path:
        return Path(self.context.directory)

    def request_stop(self) -> None:
        self._stop.set()
        self.doorbell.ring()

    def run(self, install_signal_handlers: bool = False) -> None:
        """Drive the conductor until stopped; the caller's thread does the work."""
        if install_signal_handlers:
            def on_signal(signum: int, frame: FrameType | None) -> None:
                self.request_stop()

            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGTERM, on_signal)
        to_driver = self.conductor.to_driver
        idle = idle_strategy_from_name(
            self.context.idle_strategy,
            doorbell=self.doorbell,
            max_wait_ns=self.context.timer_interval_ns,
            has_work=lambda: to_driver.producer_position > to_driver.consumer_position,
        )
        conductor = self.conductor
        clock = time.monotonic_ns
        while not self._stop.is_set() and not conductor.termination_requested:
            try:
                work = conductor.do_work(clock())
            except Exception as error:  # the conductor answers command errors itself; this is a bug
                conductor.record_error(f"driver conductor: {type(error).__name__}: {error}")
                work = 0
            idle.idle(work)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.conductor.on_close()
        self.cnc.close()
        if self.context.delete_dir_on_shutdown:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "MediaDriver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_driver(context: DriverContext) -> None:
    """Launch, serve until SIGINT/SIGTERM or an authorised terminate, close."""
    driver = MediaDriver.launch(context)
    try:
        print(f"media driver pid {os.getpid()} serving {context.directory}", flush=True)
        driver.run(install_signal_handlers=True)
    finally:
        driver.close()
