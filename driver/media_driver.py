"""The media driver process: owns a directory, cnc.dat and the conductor.

``MediaDriver.launch(context)`` claims the directory (refusing it while a
live driver uses it, reclaiming it from a dead one), creates cnc.dat, and
then ``run()`` drives the conductor until a signal or an authorised
TERMINATE_DRIVER arrives.  ``close()`` removes the directory unless asked to
keep it.  Given a ``StopGate`` (``cluster-node start`` gives one: its node's
cluster and archive directories), a stop signal first lets the processes that
use the driver stop (bounded); see ``fulmar.stop_signals``.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from fulmar.clock import epoch_ms
from fulmar.cnc import DRIVER_DATA_FIFO, CncError, CncFile
from fulmar.counters import CountersManager
from fulmar.driver.conductor import DriverConductor
from fulmar.driver.context import DriverContext
from fulmar.driver.data_plane import DataPlane
from fulmar.driver.udp_transport import OsBufferLengths
from fulmar.error_log import DistinctErrorLog
from fulmar.errors import FulmarError
from fulmar.idle import Doorbell, DoorbellIdleStrategy, idle_strategy_from_name
from fulmar.permissions import apply_file_group, file_mode, make_directory
from fulmar.ring_buffer import ManyToOneRingBuffer
from fulmar.stop_signals import StopGate, StopKind, StopSignalHandlers, StopSignals


class DriverAlreadyActiveError(FulmarError):
    """Another media driver is alive in the directory."""


class DriverDirectoryError(FulmarError):
    """The directory cannot be a driver's: not a directory, or it holds other files."""


class DriverConfigurationError(FulmarError):
    """Settings the driver cannot run with (a window its sockets cannot hold)."""


def check_socket_buffers(context: DriverContext) -> OsBufferLengths:
    """What the OS gives the driver's sockets (as Aeron's driver checks at
    start): a warning on stderr when it grants less than asked, and an error
    when the receiver window or the MTU would not fit what it grants."""
    buffers = OsBufferLengths.probe(context.socket_rcvbuf, context.socket_sndbuf)
    for name, wanted, granted, limit in (
        ("SO_RCVBUF", context.socket_rcvbuf, buffers.max_rcvbuf, "net.core.rmem_max"),
        ("SO_SNDBUF", context.socket_sndbuf, buffers.max_sndbuf, "net.core.wmem_max"),
    ):
        if wanted > granted:
            print(
                f"fulmar driver: WARNING: {name} {wanted} asked for, the OS granted {granted}; raise {limit}",
                file=sys.stderr,
                flush=True,
            )
    if context.initial_window_length > buffers.max_rcvbuf:
        raise DriverConfigurationError(
            f"the receiver window {context.initial_window_length} is larger than the {buffers.max_rcvbuf} bytes "
            "of SO_RCVBUF the OS grants: lower the window or raise the socket buffer (and net.core.rmem_max)"
        )
    if context.ipc_mtu > buffers.max_sndbuf:
        raise DriverConfigurationError(
            f"the MTU {context.ipc_mtu} is larger than the {buffers.max_sndbuf} bytes of SO_SNDBUF the OS grants"
        )
    return buffers


# What a driver directory holds; a directory with anything else is not reclaimed.
DRIVER_DIR_ENTRIES = frozenset({"cnc.dat", DRIVER_DATA_FIFO, "publications", "images"})


def check_reclaimable(directory: Path) -> None:
    """Refuse to delete a directory that is not a media driver's.

    Launching removes a dead driver's leftovers, so a mistyped ``--dir``
    pointing at someone's files must fail instead of deleting them.
    """
    if directory.exists() and not directory.is_dir():
        raise DriverDirectoryError(f"{directory} exists and is not a directory")
    if directory.is_dir():
        foreign = sorted(entry.name for entry in directory.iterdir() if entry.name not in DRIVER_DIR_ENTRIES)
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise DriverDirectoryError(
                f"{directory} holds files that are not a media driver's ({shown}); choose an empty or new directory"
            )


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
    def __init__(
        self, context: DriverContext, cnc: CncFile, conductor: DriverConductor, doorbell: Doorbell, fifo_fd: int
    ) -> None:
        self.context = context
        self.cnc = cnc
        self.conductor = conductor
        self.doorbell = doorbell
        self._fifo_fd = fifo_fd
        self._stop = threading.Event()
        self._closed = False
        self.stop_gate: StopGate | None = None  # an orderly stop waits for what it names

    @classmethod
    def launch(cls, context: DriverContext) -> MediaDriver:
        directory = Path(context.directory)
        timeout_ms = context.client_liveness_timeout_ns // 1_000_000
        pid = active_driver_pid(directory, timeout_ms)
        if pid is not None:
            raise DriverAlreadyActiveError(f"a media driver (pid {pid}) is already active in {directory}")
        check_reclaimable(directory)
        os_buffers = check_socket_buffers(context)
        if directory.exists():
            shutil.rmtree(directory)  # a dead driver's leftovers
        make_directory(directory)  # owner-only, or the file group's (fulmar.permissions)
        cnc = CncFile.create(directory, context.cnc_layout, context.client_liveness_timeout_ns, epoch_ms())
        doorbell = cnc.driver_doorbell()
        counters = CountersManager(
            cnc.counters_metadata, cnc.counters_values, context.counter_free_to_reuse_timeout_ms, epoch_ms
        )
        error_log = DistinctErrorLog(cnc.error_log, epoch_ms)
        # The data plane sleeps in epoll with its sockets: UDP publishers ring
        # it through this FIFO (read and write end here, so it never sees EOF).
        fifo = directory / DRIVER_DATA_FIFO
        os.mkfifo(fifo, file_mode())
        fifo_fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            apply_file_group(fifo_fd)  # the file group's clients ring it too
        except BaseException:
            os.close(fifo_fd)
            raise
        try:
            data_plane = DataPlane(
                cnc.counters_values, doorbell, cnc.driver_data_doorbell(), fifo_fd,
                context.idle_max_wait_ns, context.timer_interval_ns, context.loss_seed, context.data_plane_spin_ns,
                datagram_key=context.datagram_key(),
            )  # fmt: skip
        except BaseException:
            os.close(fifo_fd)
            cnc.close()
            raise
        conductor = DriverConductor(
            context, cnc, counters, error_log, data_plane, os_buffers, epoch_ms, cnc.clients_doorbell().ring
        )
        conductor.on_start()
        cnc.signal_ready()
        return cls(context, cnc, conductor, doorbell, fifo_fd)

    @property
    def directory(self) -> Path:
        return Path(self.context.directory)

    def request_stop(self, orderly: bool = False) -> None:
        """Ask ``run`` to return (safe from a signal handler, and after close):
        at once, or if ``orderly`` once ``stop_gate`` (if any) lets it."""
        if self.stop_gate is not None:
            self.stop_gate.request(immediate=not orderly)  # the gate says what it waits for, or skips
        else:
            self._stop.set()
        if not self._closed:
            self.doorbell.ring()  # the doorbell lives in cnc.dat: not after close

    def run(self) -> None:
        """Drive the conductor until stopped; the caller's thread does the work."""
        to_driver = self.conductor.to_driver
        has_events = self.conductor.has_events

        def has_work() -> bool:
            # Registered as a waiter now: a command or a data plane event that
            # came meanwhile (its ring found nobody) is seen here.
            return to_driver.producer_position > to_driver.consumer_position or has_events()

        idle = idle_strategy_from_name(
            self.context.idle_strategy,
            doorbell=self.doorbell,
            max_wait_ns=self.context.timer_interval_ns,
            has_work=has_work,
            on_wait=self.conductor.duty_cycle_tracker.on_idle_wait,  # intended idles are no stalls
        )
        conductor = self.conductor
        clock = time.monotonic_ns
        doze = idle if isinstance(idle, DoorbellIdleStrategy) else None
        gate = self.stop_gate
        while not self._stop.is_set() and not conductor.termination_requested:
            now_ns = clock()
            if gate is not None and gate.may_stop(now_ns):
                break
            try:
                work = conductor.do_work(now_ns)
                if doze is not None and not work:
                    doze.max_wait_ns = conductor.idle_wait_ns()
            except Exception as error:  # the conductor answers command errors itself; this is a bug
                conductor.record_error(f"driver conductor: {type(error).__name__}: {error}")
                work = 0
            idle.idle(work)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.conductor.on_close()
        self.conductor.data_plane.close()  # its thread writes into cnc.dat: stopped before the unmap
        os.close(self._fifo_fd)
        self.cnc.close()
        if self.context.delete_dir_on_shutdown:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> MediaDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_driver(
    context: DriverContext, on_ready: Callable[[MediaDriver], None] | None = None, stop_gate: StopGate | None = None
) -> None:
    """Launch, serve until SIGINT/SIGTERM or an authorised terminate, close.

    The signal handlers go in before the launch: a supervisor may send
    SIGTERM as soon as it sees cnc.dat, and a signal that arrived before
    them would kill the process and leave the directory behind.  A signal
    during the launch is remembered; the previous handlers are restored at
    the end (see ``StopSignalHandlers``).  With ``stop_gate`` a signal stops
    the driver once the gate lets it (a second Ctrl-C: at once); without, at
    once.  Raises DriverAlreadyActiveError / DriverDirectoryError.
    """
    running: list[MediaDriver] = []

    def on_stop(kind: StopKind | None, signum: int) -> None:
        if kind is not None:
            for driver in running:
                driver.request_stop(orderly=kind is StopKind.ORDERLY)

    rule = StopSignals()
    with StopSignalHandlers(rule, on_stop, time.monotonic_ns):
        driver = MediaDriver.launch(context)
        try:
            driver.stop_gate = stop_gate
            running.append(driver)
            if rule.requested is not None:
                driver.request_stop(orderly=rule.requested is StopKind.ORDERLY)
            if on_ready is not None:
                on_ready(driver)
            driver.run()
        finally:
            running.clear()
            driver.close()
