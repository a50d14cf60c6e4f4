"""Two processes over aeron:ipc through a media driver, 32-byte messages:
throughput with the message-at-a-time API and with the batch API, and
ping-pong round-trip percentiles (HdrHistogram) with the default idle
strategy (sleep on the data doorbell) and with busy-spin."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from array import array
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from fulmar.aeron import Aeron
from fulmar.cnc import CncLayout
from fulmar.driver.context import DriverContext
from fulmar.driver.media_driver import MediaDriver
from fulmar.idle import BusySpinIdleStrategy, DoorbellIdleStrategy
from fulmar.log_reader import Header
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED, ExclusivePublication

SPAWN = multiprocessing.get_context("spawn")
MESSAGE = b"m" * 32
CHANNEL = "aeron:ipc"
BATCH = 1024


def _driver_main(
    directory: str, spin_ns: int, member_secret: bytes | None, ready: Connection, stop: Connection
) -> None:
    context = DriverContext(
        directory=Path(directory),
        cnc_layout=CncLayout.sized(to_driver_capacity=256 * 1024),
        data_plane_spin_ns=spin_ns,
        member_secret=member_secret,
    )
    driver = MediaDriver.launch(context)
    import threading

    thread = threading.Thread(target=driver.run, daemon=True)
    thread.start()
    ready.send("up")
    stop.recv()
    driver.request_stop()
    thread.join(5)
    driver.close()


def _wait_connected(publication: Any) -> None:
    deadline = time.monotonic() + 30
    while not publication.is_connected:
        if time.monotonic() > deadline:
            raise TimeoutError("no subscriber connected")
        time.sleep(0.001)


def _publisher_main(directory: str, channel: str, count: int, batch: bool, done: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        publication = aeron.add_exclusive_publication(channel, 10) if batch else aeron.add_publication(channel, 10)
        _wait_connected(publication)
        done.recv()  # the subscriber is ready: go
        sent = 0
        if batch:
            data = MESSAGE * BATCH
            lengths = array("i", [len(MESSAGE)] * BATCH)
            assert isinstance(publication, ExclusivePublication)  # batches are an exclusive publication's
            while sent < count:
                appended, _ = publication.offer_block(data, lengths)
                if appended:
                    sent += appended
                else:
                    os.sched_yield()
        else:
            offer = publication.offer
            while sent < count:
                result = offer(MESSAGE)
                if result > 0:
                    sent += 1
                elif result in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION):
                    if result != ADMIN_ACTION:
                        os.sched_yield()
        done.recv()


def _subscriber_main(directory: str, channel: str, count: int, batch: bool, result: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        subscription = aeron.add_subscription(channel, 10)
        deadline = time.monotonic() + 30
        while not subscription.images:
            if time.monotonic() > deadline:
                raise TimeoutError("no image")
            time.sleep(0.001)
        image = subscription.images[0]
        result.send("ready")
        received = 0
        start = 0.0
        counter = [0]

        def on_fragment(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            counter[0] += 1

        while received < count:
            if batch:
                n = image.scan().count
                received += n
            else:
                n = image.poll(on_fragment, 4096)
                received = counter[0]
            if n and not start:
                start = time.perf_counter()
            elif not n:
                os.sched_yield()
        result.send((received, time.perf_counter() - start))


def throughput(pub_dir: str, sub_dir: str, channel: str, count: int, batch: bool) -> float:
    """Messages per second from a publisher on one driver to a subscriber on another (or the same)."""
    sub_end, sub_result = SPAWN.Pipe()
    pub_end, pub_control = SPAWN.Pipe()
    subscriber = SPAWN.Process(target=_subscriber_main, args=(sub_dir, channel, count, batch, sub_result))
    publisher = SPAWN.Process(target=_publisher_main, args=(pub_dir, channel, count, batch, pub_control))
    try:
        subscriber.start()
        publisher.start()
        if not sub_end.poll(60) or sub_end.recv() != "ready":
            raise TimeoutError("subscriber not ready")
        pub_end.send("go")
        if not sub_end.poll(300):
            raise TimeoutError("subscriber did not finish")
        received, elapsed = sub_end.recv()
        pub_end.send("stop")
        return float(received / elapsed)
    finally:
        for process in (publisher, subscriber):
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


def _pong_main(directory: str, ping_channel: str, pong_channel: str, spin: bool, ready: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        ping = aeron.add_subscription(ping_channel, 20)
        pong = aeron.add_exclusive_publication(pong_channel, 21)
        _wait_connected(pong)
        idle = (
            BusySpinIdleStrategy()
            if spin
            else DoorbellIdleStrategy(aeron.conductor.data_doorbell, 100_000_000, has_work=ping.is_data_available)
        )

        def echo(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            message = bytes(buffer[offset : offset + length])
            while pong.offer(message) < 0:
                pass

        ready.send("ready")
        while not ready.poll():
            idle.idle(ping.poll(echo, 10))


def ping_pong(
    ping_dir: str, pong_dir: str, ping_channel: str, pong_channel: str, samples: int, spin: bool
) -> HdrHistogram:
    """Round trips: this process pings through one driver, a pong process echoes through another."""
    end, pong_control = SPAWN.Pipe()
    ponger = SPAWN.Process(target=_pong_main, args=(pong_dir, ping_channel, pong_channel, spin, pong_control))
    histogram = HdrHistogram(1, 10_000_000_000, 3)
    try:
        ponger.start()
        with Aeron.connect(ping_dir) as aeron:
            ping = aeron.add_exclusive_publication(ping_channel, 20)
            pong = aeron.add_subscription(pong_channel, 21)
            _wait_connected(ping)
            if not end.poll(60):
                raise TimeoutError("pong process not ready")
            end.recv()
            idle = (
                BusySpinIdleStrategy()
                if spin
                else DoorbellIdleStrategy(aeron.conductor.data_doorbell, 100_000_000, has_work=pong.is_data_available)
            )
            replies = [0]

            def on_pong(buffer: memoryview, offset: int, length: int, header: Header) -> None:
                replies[0] += 1

            for i in range(samples + samples // 10):  # the first tenth warms up
                sent_at = time.perf_counter_ns()
                while ping.offer(MESSAGE) < 0:
                    pass
                before = replies[0]
                while replies[0] == before:
                    idle.idle(pong.poll(on_pong, 1))
                if i >= samples // 10:
                    histogram.record_value(max(1, time.perf_counter_ns() - sent_at))
        end.send("stop")
    finally:
        ponger.join(10)
        if ponger.is_alive():
            ponger.kill()
            ponger.join(5)
    return histogram


class Driver:
    """A media driver process for a benchmark, stopped and removed on close."""

    def __init__(self, spin_ns: int = 0, member_secret: bytes | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="fulmar-bench-", dir="/dev/shm")) / "driver"
        ready_end, ready = SPAWN.Pipe()
        self._stop_end, stop = SPAWN.Pipe()
        self.process = SPAWN.Process(
            target=_driver_main, args=(str(self.directory), spin_ns, member_secret, ready, stop)
        )
        self.process.start()
        if not ready_end.poll(30):
            self.close()
            raise TimeoutError("driver did not start")
        ready_end.recv()

    def close(self) -> None:
        if self.process.is_alive():
            self._stop_end.send("stop")
            self.process.join(15)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        shutil.rmtree(self.directory.parent, ignore_errors=True)


def run(quick: bool) -> list[dict[str, Any]]:
    count = 1_000_000 if quick else 5_000_000
    samples = 2_000 if quick else 20_000
    driver = Driver()
    directory = driver.directory
    results: list[dict[str, Any]] = []
    try:
        for batch in (False, True):
            rate = throughput(str(directory), str(directory), CHANNEL, count * (5 if batch else 1), batch)
            api = "batch API" if batch else "message API"
            results.append({"name": f"ipc 2 processes 32 B, {api}", "value": rate, "unit": "msgs/s", "reference": None})
            results.append(
                {
                    "name": f"ipc 2 processes 32 B, {api}",
                    "value": rate * 32 / 1e6,
                    "unit": "MB/s",
                    "reference": None,
                    "key": f"ipc MB/s {api}",
                }
            )
        for spin in (False, True):
            histogram = ping_pong(str(directory), str(directory), CHANNEL, CHANNEL, samples, spin)
            mode = "busy-spin" if spin else "doorbell (default)"
            for percentile in (50, 90, 99, 99.9):
                results.append(
                    {
                        "name": f"ipc ping-pong RTT {mode} p{percentile}",
                        "value": histogram.get_value_at_percentile(percentile) / 1000,
                        "unit": "us",
                        "reference": None,
                    }
                )
            results.append(
                {
                    "name": f"ipc ping-pong RTT {mode} max",
                    "value": histogram.get_max_value() / 1000,
                    "unit": "us",
                    "reference": None,
                }
            )
    finally:
        driver.close()
    # MB/s rows share a name with msgs/s rows; keep them distinct for the table.
    for row in results:
        if "key" in row:
            row["name"] = row.pop("key")
    return results
