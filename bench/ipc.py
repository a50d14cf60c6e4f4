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
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED

SPAWN = multiprocessing.get_context("spawn")
MESSAGE = b"m" * 32
CHANNEL = "aeron:ipc"
BATCH = 1024


def _driver_main(directory: str, ready: Connection, stop: Connection) -> None:
    context = DriverContext(directory=Path(directory), cnc_layout=CncLayout.sized(to_driver_capacity=256 * 1024))
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


def _publisher_main(directory: str, count: int, batch: bool, done: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        publication = aeron.add_exclusive_publication(CHANNEL, 10) if batch else aeron.add_publication(CHANNEL, 10)
        _wait_connected(publication)
        done.recv()  # the subscriber is ready: go
        sent = 0
        if batch:
            data = MESSAGE * BATCH
            lengths = array("i", [len(MESSAGE)] * BATCH)
            writer = publication._writer  # the batch API of an exclusive publication
            while sent < count:
                appended, _ = writer.offer_block(data, lengths)
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


def _subscriber_main(directory: str, count: int, batch: bool, result: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        subscription = aeron.add_subscription(CHANNEL, 10)
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


def _throughput(directory: str, count: int, batch: bool) -> float:
    sub_end, sub_result = SPAWN.Pipe()
    pub_end, pub_control = SPAWN.Pipe()
    subscriber = SPAWN.Process(target=_subscriber_main, args=(directory, count, batch, sub_result))
    publisher = SPAWN.Process(target=_publisher_main, args=(directory, count, batch, pub_control))
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


def _pong_main(directory: str, spin: bool, ready: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        ping = aeron.add_subscription(CHANNEL, 20)
        pong = aeron.add_exclusive_publication(CHANNEL, 21)
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


def _ping_pong(directory: str, samples: int, spin: bool) -> HdrHistogram:
    end, pong_control = SPAWN.Pipe()
    ponger = SPAWN.Process(target=_pong_main, args=(directory, spin, pong_control))
    histogram = HdrHistogram(1, 10_000_000_000, 3)
    try:
        ponger.start()
        with Aeron.connect(directory) as aeron:
            ping = aeron.add_exclusive_publication(CHANNEL, 20)
            pong = aeron.add_subscription(CHANNEL, 21)
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


def run(quick: bool) -> list[dict[str, Any]]:
    count = 1_000_000 if quick else 5_000_000
    samples = 2_000 if quick else 20_000
    directory = Path(tempfile.mkdtemp(prefix="fulmar-bench-ipc-", dir="/dev/shm")) / "driver"
    ready_end, ready = SPAWN.Pipe()
    stop_end, stop = SPAWN.Pipe()
    driver = SPAWN.Process(target=_driver_main, args=(str(directory), ready, stop))
    driver.start()
    results: list[dict[str, Any]] = []
    try:
        if not ready_end.poll(30):
            raise TimeoutError("driver did not start")
        ready_end.recv()
        for batch in (False, True):
            rate = _throughput(str(directory), count * (5 if batch else 1), batch)
            api = "batch API" if batch else "message API"
            results.append({"name": f"ipc 2 processes 32 B, {api}", "value": rate, "unit": "msgs/s", "reference": None})
            results.append({"name": f"ipc 2 processes 32 B, {api}", "value": rate * 32 / 1e6, "unit": "MB/s", "reference": None, "key": f"ipc MB/s {api}"})
        for spin in (False, True):
            histogram = _ping_pong(str(directory), samples, spin)
            mode = "busy-spin" if spin else "doorbell (default)"
            for percentile in (50, 90, 99, 99.9):
                results.append({
                    "name": f"ipc ping-pong RTT {mode} p{percentile}",
                    "value": histogram.get_value_at_percentile(percentile) / 1000,
                    "unit": "us",
                    "reference": None,
                })
            results.append({"name": f"ipc ping-pong RTT {mode} max", "value": histogram.get_max_value() / 1000, "unit": "us", "reference": None})
    finally:
        stop_end.send("stop")
        driver.join(15)
        if driver.is_alive():
            driver.kill()
            driver.join(5)
        shutil.rmtree(directory.parent, ignore_errors=True)
    # MB/s rows share a name with msgs/s rows; keep them distinct for the table.
    for row in results:
        if "key" in row:
            row["name"] = row.pop("key")
    return results
