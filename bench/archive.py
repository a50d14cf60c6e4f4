"""The archive recording and replaying an IPC stream, against ``dd`` on the
same disk in the same run (the physical reference).

A media driver (its directory on /dev/shm) and a ``cluster-node archive``
process (its directory on the real disk, under /var/tmp) run as separate
processes; this process is the archive client and the publisher.

Recording: ``start_recording`` on ``aeron:ipc`` then messages of 32 B and of
1 KiB offered in batches (``offer_block``) on an exclusive
``aeron:ipc?term-length=64m`` publication; timed from the first offer until
``get_recording_position`` equals the publication's final position.  MB/s
counts the recorded bytes (frames with their 32-byte headers, as written to
the segment files: the recorded position), 10^6 bytes per MB.

Its reference is ``dd if=/dev/zero of=<archive dir>/dd.bin bs=1M
iflag=count_bytes count=<recorded bytes>``: exactly those bytes, without a
sync: the archive's default file sync level is 0, so it leaves its writes in
the page cache too (it writes blocks of up to 1 MiB, as dd does with bs=1M,
into segment files it preallocated).  The same dd with
``conv=fdatasync`` (the bytes on the device) is a second reference line, for
context.  dd's own byte count and seconds (its stderr) give its MB/s; each
dd figure is the median of three dd runs, each to a new file.

Replay: ``replay`` of the whole recording over ``aeron:ipc?term-length=64m``
into this process, consumed with ``Image.scan``; timed from the replay
request until the image's position is at the end.  Its reference is ``dd
if=<archive dir>/dd.bin of=/dev/null bs=1M``: both read files that were just
written, so both read the page cache (the cache is not dropped).

Everything written is synced (``sync``) before each timed step, outside the
timing, so one step's writeback does not land in the next one's figure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from bench.ipc import Driver
from fulmar.aeron import Aeron
from fulmar.archive.client import AeronArchive
from fulmar.codecs.generated.archive import RecordingSignal

CHANNEL = "aeron:ipc?term-length=64m"
RECORD_CHANNEL = "aeron:ipc"
SIZES = (32, 1024)
BATCH_BYTES = 32 * 1024  # bytes of messages per offer_block call
HEADER = 32
DISK_PARENT = "/var/tmp"
DD_RUNS = 3  # each dd figure is the median of this many runs (each one is short)
_DD = re.compile(r"(\d+) bytes .* copied, ([0-9.eE+-]+) s")
_announced = False


def _frame_length(size: int) -> int:
    return (size + HEADER + 31) & ~31


def _filesystem(path: Path) -> str:
    """``fstype device`` of the mount holding ``path``."""
    best = ("", "?", "?")
    resolved = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            device, mount_point, fstype = line.split()[:3]
            inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[0]):
                best = (mount_point, fstype, device)
    return f"{best[1]} {best[2]} mounted on {best[0]}"


class ArchiveProcess:
    """``cluster-node archive`` with local control only, stopped on close."""

    def __init__(self, archive_dir: Path, driver_dir: Path, log_path: Path) -> None:
        self.log = open(log_path, "w+")
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
            "none",
            "--replication-channel",
            "aeron:udp?endpoint=127.0.0.1:0",
            "--segment-length",
            "64m",
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        try:
            assert self.process.stdout is not None
            os.set_blocking(self.process.stdout.fileno(), False)
            banner = ""
            deadline = time.monotonic() + 30
            while "serving" not in banner:
                banner += self.process.stdout.readline() or ""
                if self.process.poll() is not None:
                    raise RuntimeError(f"archive exited with {self.process.returncode}: {self.stderr()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"archive did not start: {banner!r} {self.stderr()}")
                time.sleep(0.01)
        except BaseException:
            self.close()
            raise

    def stderr(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-2000:]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


def _dd(*operands: str) -> float:
    """Run dd; its MB/s from its own byte count and seconds."""
    completed = subprocess.run(
        ["dd", *operands], capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"}
    )
    match = _DD.search(completed.stderr)
    if match is None:
        raise RuntimeError(f"cannot read dd's figures: {completed.stderr!r}")
    return int(match.group(1)) / float(match.group(2)) / 1e6


def _dd_write(path: Path, length: int, sync: bool) -> float:
    """Median of DD_RUNS writes of ``length`` bytes to a new file."""
    conv = ["conv=fdatasync"] if sync else []
    rates = []
    for _ in range(DD_RUNS):
        path.unlink(missing_ok=True)
        os.sync()
        rates.append(_dd("if=/dev/zero", f"of={path}", "bs=1M", f"count={length}", "iflag=count_bytes", *conv))
    return statistics.median(rates)


def _dd_read(path: Path) -> float:
    """Median of DD_RUNS reads of the file."""
    os.sync()
    return statistics.median(_dd(f"if={path}", "of=/dev/null", "bs=1M") for _ in range(DD_RUNS))


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.0005)


def _record(aeron: Aeron, archive: AeronArchive, size: int, total: int, stream_id: int) -> tuple[int, int, float, int]:
    """Record ``total`` bytes of frames of ``size``-byte messages: (recording id, messages, seconds, recorded bytes)."""
    batch = max(1, BATCH_BYTES // size)
    count = max(batch, total // _frame_length(size) // batch * batch)
    data = b"r" * (size * batch)
    lengths = array("i", [size] * batch)
    archive.start_recording(RECORD_CHANNEL, stream_id)
    publication = aeron.add_exclusive_publication(CHANNEL, stream_id)
    try:
        _wait(lambda: publication.is_connected, 30, "the archive did not subscribe")
        recording_id = archive.wait_for_signal(lambda s: s.signal == RecordingSignal.START).recording_id
        start_position = publication.position
        os.sync()
        sent = 0
        offer_block = publication.offer_block
        start = time.perf_counter()
        while sent < count:
            appended, _ = offer_block(data, lengths)
            if appended:
                sent += appended
            else:
                os.sched_yield()
        final = publication.position
        deadline = time.monotonic() + 120
        while archive.get_recording_position(recording_id) < final:
            if time.monotonic() > deadline:
                raise TimeoutError(f"recording {recording_id} stuck before {final}")
            time.sleep(0.0005)
        elapsed = time.perf_counter() - start
        archive.stop_recording(RECORD_CHANNEL, stream_id)
        # The stop position is in the catalog once the STOP signal came.
        archive.wait_for_signal(lambda s: s.signal == RecordingSignal.STOP and s.recording_id == recording_id)
    finally:
        publication.close()
    return recording_id, count, elapsed, final - start_position


def _replay(aeron: Aeron, archive: AeronArchive, recording_id: int, stream_id: int) -> tuple[float, int]:
    """Replay a whole stopped recording: (seconds, bytes)."""
    start_position = archive.get_start_position(recording_id)
    stop_position = archive.get_stop_position(recording_id)
    length = stop_position - start_position
    os.sync()
    start = time.perf_counter()
    subscription = archive.replay(recording_id, CHANNEL, stream_id, start_position, length)
    try:
        _wait(lambda: subscription.images, 30, "no replay image")
        image = subscription.images[0]
        deadline = time.monotonic() + 120
        while image.position < stop_position:
            if not image.scan().count:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"replay stuck at {image.position} before {stop_position}")
                os.sched_yield()
        elapsed = time.perf_counter() - start
    finally:
        subscription.close()
    return elapsed, length


def run(quick: bool) -> list[dict[str, Any]]:
    global _announced
    total = 30_000_000 if quick else 200_000_000
    root = Path(tempfile.mkdtemp(prefix="fulmar-bench-archive-", dir=DISK_PARENT))
    archive_dir = root / "archive"
    archive_dir.mkdir()
    if not _announced:
        _announced = True
        print(
            f"bench.archive: archive and dd files in {root} ({_filesystem(root)}); driver on /dev/shm "
            f"({_filesystem(Path('/dev/shm'))}); {total / 1e6:.0f} MB per case",
            flush=True,
        )
    results: list[dict[str, Any]] = []
    driver = None
    process = None
    try:
        driver = Driver()
        process = ArchiveProcess(archive_dir, driver.directory, root / "archive.log")
        with Aeron.connect(driver.directory) as aeron, AeronArchive.connect(aeron) as archive:
            for index, size in enumerate(SIZES):
                recording_id, count, seconds, recorded = _record(aeron, archive, size, total, 1001 + index)
                record_rate = recorded / seconds / 1e6
                dd_file = archive_dir / "dd.bin"
                dd_cache = _dd_write(dd_file, recorded, sync=False)
                dd_sync = _dd_write(dd_file, recorded, sync=True)
                replay_seconds, replayed = _replay(aeron, archive, recording_id, 2001 + index)
                dd_read = _dd_read(dd_file)
                dd_file.unlink()
                label = f"archive {size} B msgs"
                results += [
                    {
                        "name": f"{label}, record vs dd (page cache)",
                        "value": record_rate,
                        "unit": "MB/s",
                        "reference": dd_cache,
                    },
                    {
                        "name": f"{label}, record vs dd conv=fdatasync",
                        "value": record_rate,
                        "unit": "MB/s",
                        "reference": dd_sync,
                    },
                    {"name": f"{label}, record", "value": count / seconds, "unit": "msgs/s", "reference": None},
                    {
                        "name": f"{label}, replay vs dd read (page cache)",
                        "value": replayed / replay_seconds / 1e6,
                        "unit": "MB/s",
                        "reference": dd_read,
                    },
                ]
    finally:
        if process is not None:
            process.close()
        if driver is not None:
            driver.close()
        shutil.rmtree(root, ignore_errors=True)
    return results


if __name__ == "__main__":
    for row in run("--quick" in sys.argv):
        reference = (
            f" = {row['value'] / row['reference']:.3f}x dd {row['reference']:,.1f} MB/s" if row["reference"] else ""
        )
        print(f"{row['name']}: {row['value']:,.1f} {row['unit']}{reference}")
