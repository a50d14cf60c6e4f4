"""The archive process: a client of its node's media driver that owns an
archive directory (catalog, segment files, mark file) and serves the control
protocol.

``Archive.launch`` takes the directory (refusing one a live archive owns),
repairs recordings a crash left open, connects to the driver and starts the
conductor; ``run`` drives the conductor until stopped; ``run_archive`` does
both with SIGINT/SIGTERM handling, for ``cluster-node archive``.  Given a
``StopGate`` (``cluster-node start`` gives one: the node's cluster directory),
a stop signal first lets the node's consensus module and services, which
record their snapshots here, stop (bounded); see ``fulmar.stop_signals``.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from fulmar import log_lines
from fulmar.aeron import Aeron
from fulmar.archive.catalog import Catalog, recover
from fulmar.archive.conductor import ArchiveConductor
from fulmar.archive.context import ArchiveContext
from fulmar.archive.mark_file import ArchiveMarkFile
from fulmar.clock import epoch_ms
from fulmar.driver.context import default_driver_dir
from fulmar.idle import DoorbellIdleStrategy
from fulmar.permissions import make_directory
from fulmar.stop_signals import StopGate, StopKind, StopSignalHandlers, StopSignals


def log_line(text: str) -> None:
    """A line of the archive's output (its node's archive.log)."""
    log_lines.stamped("archive", text)


class Archive:
    def __init__(
        self,
        context: ArchiveContext,
        aeron: Aeron,
        catalog: Catalog,
        mark_file: ArchiveMarkFile,
        conductor: ArchiveConductor,
        recovered: list[int],
    ) -> None:
        self.context = context
        self.aeron = aeron
        self.catalog = catalog
        self.mark_file = mark_file
        self.conductor = conductor
        self.recovered = recovered
        self._stop = threading.Event()
        self._closed = False
        self.stop_gate: StopGate | None = None  # an orderly stop waits for what it names

    @classmethod
    def launch(cls, context: ArchiveContext) -> Archive:
        context.validate()
        archive_dir = Path(context.archive_dir)
        make_directory(archive_dir)
        # The directory is claimed and the catalog verified (and what a crash
        # left open repaired) before the driver is asked for anything: a
        # damaged catalog is reported as such even when the driver is gone.
        driver_dir = Path(context.driver_dir) if context.driver_dir is not None else default_driver_dir()
        mark_file = catalog = aeron = None
        try:
            mark_file = ArchiveMarkFile.create(
                archive_dir,
                pid=os.getpid(),
                archive_id=context.archive_id,
                control_channel=context.control_channel or "",
                control_stream_id=context.control_stream_id,
                local_control_channel=context.local_control_channel,
                local_control_stream_id=context.local_control_stream_id,
                events_channel=context.recording_events_channel or "",
                events_stream_id=context.recording_events_stream_id,
                aeron_directory=str(driver_dir),
                liveness_timeout_ms=context.mark_file_liveness_timeout_ms,
                now_ms=epoch_ms(),
            )
            # With the record checksum each catalog descriptor carries a CRC-32
            # too, so garbage in a descriptor (a stop position, a length) is
            # refused at start rather than trusted.
            catalog = Catalog.open(
                archive_dir,
                file_sync_level=context.catalog_file_sync_level,
                checksum=zlib.crc32 if context.record_checksum else None,
            )
            recovered = recover(catalog, archive_dir, epoch_ms(), verify_crc=context.record_checksum)
            aeron = Aeron.connect(driver_dir)
            if context.archive_id == -1:
                # Aeron's default: the archive is known by its client id (the conductor does the same).
                mark_file.set_archive_id(aeron.client_id)
            error_log = mark_file.error_log(epoch_ms)
            data_doorbell = aeron.conductor.data_doorbell
            conductor = ArchiveConductor(
                context, aeron, catalog, epoch_ms, error_log.record, data_doorbell.ring, log_event=log_line
            )
            mark_file.signal_ready()
        except BaseException:
            if catalog is not None:
                catalog.close()
            if mark_file is not None:
                mark_file.close()
            if aeron is not None:
                aeron.close()
            raise
        return cls(context, aeron, catalog, mark_file, conductor, recovered)

    def request_stop(self, orderly: bool = False) -> None:
        """Ask ``run`` to return (safe from a signal handler): at once, or if
        ``orderly`` once ``stop_gate`` (if any) lets it."""
        if self.stop_gate is not None:
            self.stop_gate.request(immediate=not orderly)  # the gate says what it waits for, or skips
        else:
            self._stop.set()
        if not self._closed:
            self.aeron.conductor.data_doorbell.ring()

    def run(self) -> None:
        context = self.context
        conductor = self.conductor
        idle = DoorbellIdleStrategy(
            self.aeron.conductor.data_doorbell, context.idle_max_wait_ns, has_work=conductor.has_work
        )
        next_mark_ms = 0
        clock = time.monotonic_ns
        gate = self.stop_gate
        while not self._stop.is_set():
            now_ns = clock()
            if gate is not None and gate.may_stop(now_ns):
                break
            try:
                work = conductor.do_work(now_ns)
            except Exception as error:  # a bug: record it and keep serving the other sessions
                conductor.record_error(f"archive conductor: {type(error).__name__}: {error}")
                work = 0
            now_ms = epoch_ms()
            if now_ms >= next_mark_ms:
                self.mark_file.update_activity_timestamp(now_ms)
                next_mark_ms = now_ms + context.mark_file_update_interval_ms
            if self.aeron.is_closed:
                break  # the driver went away: nothing more can be recorded or replayed
            if conductor.is_busy:
                idle.max_wait_ns = context.busy_idle_max_wait_ns
            elif conductor.has_pending_control_sessions:
                idle.max_wait_ns = context.pending_idle_max_wait_ns
            else:
                idle.max_wait_ns = context.idle_max_wait_ns
            idle.idle(work)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.conductor.close()
        finally:
            self.catalog.close()
            self.mark_file.close()
            self.aeron.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_archive(
    context: ArchiveContext, on_ready: Callable[[Archive], None] | None = None, stop_gate: StopGate | None = None
) -> None:
    """Launch, serve until SIGINT/SIGTERM, close (see ``run_driver``: the
    handlers go in first so an early signal is not lost).  With ``stop_gate``
    a signal stops the archive once the gate lets it (a second Ctrl-C: at
    once); without, at once."""
    running: list[Archive] = []

    def on_stop(kind: StopKind | None, signum: int) -> None:
        if kind is not None:
            for archive in running:
                archive.request_stop(orderly=kind is StopKind.ORDERLY)

    rule = StopSignals()
    with StopSignalHandlers(rule, on_stop, time.monotonic_ns):
        archive = Archive.launch(context)
        try:
            archive.stop_gate = stop_gate
            running.append(archive)
            if rule.requested is not None:
                archive.request_stop(orderly=rule.requested is StopKind.ORDERLY)
            if on_ready is not None:
                on_ready(archive)
            archive.run()
        finally:
            running.clear()
            archive.close()
