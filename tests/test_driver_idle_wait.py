"""How long an idle driver may sleep: its timer interval while anything is in
flight (a reader behind a publication, an image its subscriber has not read),
its idle wait once every reader has caught up.

The driver runs in this process, its duty cycle on a thread of the test's,
so that ``idle_wait_ns`` can be read between cycles (under the lock the
cycles take); the client is an ordinary Aeron client on the same directory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from driver_support import free_udp_port, new_driver_dir, remove_driver_dir, wait_for

from fulmar.aeron import Aeron
from fulmar.cnc import CncLayout
from fulmar.driver.context import DriverContext
from fulmar.driver.media_driver import MediaDriver

TIMER_INTERVAL_NS = 1_000_000
IDLE_MAX_WAIT_NS = 25_000_000


class DrivenDriver:
    """A MediaDriver whose duty cycle a thread runs, pausable to look inside."""

    def __init__(self, directory: Path) -> None:
        context = DriverContext(directory=directory, timer_interval_ns=TIMER_INTERVAL_NS,
                                idle_max_wait_ns=IDLE_MAX_WAIT_NS,
                                cnc_layout=CncLayout.sized(256 * 1024, 256 * 1024, 256 * 1024, 64 * 1024))
        self.driver = MediaDriver.launch(context)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.cycles = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conductor = self.driver.conductor
        while not self._stop.is_set():
            with self.lock:
                conductor.do_work(time.monotonic_ns())
                self.cycles += 1
            time.sleep(0.0002)

    def idle_wait_ns_after_cycles(self, cycles: int = 3) -> int:
        """``idle_wait_ns`` once a few more duty cycles have seen the current state."""
        target = self.cycles + cycles
        wait_for(lambda: self.cycles >= target, 10, f"{cycles} more duty cycles")
        with self.lock:
            return self.driver.conductor.idle_wait_ns()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.driver.close()


@pytest.fixture
def driven() -> Iterator[DrivenDriver]:
    directory = new_driver_dir()
    driver = DrivenDriver(directory)
    try:
        yield driver
    finally:
        driver.close()
        remove_driver_dir(directory)


def _drain(subscription, expected: int) -> None:
    got = [0]

    def on_fragment(buffer, offset, length, header) -> None:
        got[0] += 1

    wait_for(lambda: subscription.poll(on_fragment, 100) >= 0 and got[0] >= expected, 10,
             f"{expected} messages read")


def test_an_idle_driver_sleeps_long_until_a_reader_falls_behind(driven: DrivenDriver) -> None:
    with Aeron.connect(driven.driver.directory) as aeron:
        publication = aeron.add_publication("aeron:ipc?term-length=64k", 7)
        subscription = aeron.add_subscription("aeron:ipc?term-length=64k", 7)
        wait_for(lambda: publication.is_connected, 10, "the IPC publication connected")
        assert driven.idle_wait_ns_after_cycles() == IDLE_MAX_WAIT_NS  # nothing in flight

        wait_for(lambda: publication.offer(b"x" * 100) > 0, 10, "an offer accepted")
        # Unread: the publisher limit will have to move, so the driver keeps its timer pace.
        assert driven.idle_wait_ns_after_cycles() == TIMER_INTERVAL_NS

        _drain(subscription, 1)
        assert driven.idle_wait_ns_after_cycles() == IDLE_MAX_WAIT_NS


def test_an_unread_network_image_keeps_the_driver_on_its_timer_interval(driven: DrivenDriver) -> None:
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    with Aeron.connect(driven.driver.directory) as aeron:
        subscription = aeron.add_subscription(channel, 9)
        publication = aeron.add_publication(channel, 9)
        wait_for(lambda: publication.is_connected and subscription.is_connected, 10, "the UDP stream connected")
        # Setup, heartbeats and status messages settle; then nothing is in flight.
        wait_for(lambda: driven.idle_wait_ns_after_cycles() == IDLE_MAX_WAIT_NS, 10, "an idle driver")

        wait_for(lambda: publication.offer(b"y" * 200) > 0, 10, "an offer accepted")
        # Sent and received, but the image's subscriber has not read it.
        wait_for(lambda: driven.idle_wait_ns_after_cycles() == TIMER_INTERVAL_NS, 10,
                 "the timer interval while the image is unread")

        _drain(subscription, 1)
        wait_for(lambda: driven.idle_wait_ns_after_cycles() == IDLE_MAX_WAIT_NS, 10, "the idle wait once read")


def test_the_idle_wait_is_never_shorter_than_the_timer_interval() -> None:
    directory = new_driver_dir()
    context = DriverContext(directory=directory, timer_interval_ns=5_000_000, idle_max_wait_ns=1_000_000,
                            cnc_layout=CncLayout.sized(64 * 1024, 64 * 1024, 64 * 1024, 64 * 1024))
    driver = MediaDriver.launch(context)
    try:
        driver.conductor.do_work(time.monotonic_ns())
        assert driver.conductor.idle_wait_ns() == 5_000_000
    finally:
        driver.close()
        remove_driver_dir(directory)
