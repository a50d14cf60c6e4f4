"""How long an idle driver sleeps.  Its data plane (the native thread that
sends, receives and moves publishers' limits) wakes every timer interval
while a reader is behind (a publication's subscriber, an image's: their
progress rings nobody, and limits and status messages must follow it), and
sleeps until its next deadline, at most the idle wait, once every reader has
caught up.  The conductor sleeps its own idle wait unless a closed
publication is draining, an image at its end of stream waits to be read, or
something lingers.

The driver runs in this process, its conductor's duty cycle on a thread of
the test's, so that ``idle_wait_ns`` can be read between cycles (under the
lock the cycles take); the client is an ordinary Aeron client on the same
directory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fulmar.aeron import Aeron
from fulmar.cnc import CncLayout
from fulmar.driver.context import DriverContext
from fulmar.driver.ipc_publication import PublicationState
from fulmar.driver.media_driver import MediaDriver
from support.driver import free_udp_port, new_driver_dir, remove_driver_dir, wait_for

TIMER_INTERVAL_NS = 1_000_000
IDLE_MAX_WAIT_NS = 25_000_000
CONDUCTOR_IDLE_MAX_WAIT_NS = 60_000_000


class DrivenDriver:
    """A MediaDriver whose duty cycle a thread runs, pausable to look inside."""

    def __init__(self, directory: Path) -> None:
        context = DriverContext(
            directory=directory,
            timer_interval_ns=TIMER_INTERVAL_NS,
            idle_max_wait_ns=IDLE_MAX_WAIT_NS,
            conductor_idle_max_wait_ns=CONDUCTOR_IDLE_MAX_WAIT_NS,
            cnc_layout=CncLayout.sized(256 * 1024, 256 * 1024, 256 * 1024, 64 * 1024),
        )
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
        """The conductor's ``idle_wait_ns`` once a few more duty cycles have seen the current state."""
        target = self.cycles + cycles
        wait_for(lambda: self.cycles >= target, 10, f"{cycles} more duty cycles")
        with self.lock:
            return self.driver.conductor.idle_wait_ns()

    def data_plane_wait_ns(self) -> int:
        """How long the data plane meant to sleep, once it has been to sleep twice more
        (so that the answer comes from a cycle that saw the current state)."""
        data_plane = self.driver.conductor.data_plane
        target = data_plane.stats().sleeps + 2
        wait_for(lambda: data_plane.stats().sleeps >= target, 10, "two more data plane sleeps")
        return data_plane.stats().planned_wait_ns

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

    wait_for(lambda: subscription.poll(on_fragment, 100) >= 0 and got[0] >= expected, 10, f"{expected} messages read")


def test_the_data_plane_keeps_its_timer_pace_while_an_ipc_reader_is_behind(driven: DrivenDriver) -> None:
    with Aeron.connect(driven.driver.directory) as aeron:
        publication = aeron.add_publication("aeron:ipc?term-length=64k", 7)
        subscription = aeron.add_subscription("aeron:ipc?term-length=64k", 7)
        wait_for(lambda: publication.is_connected, 10, "the IPC publication connected")
        wait_for(lambda: driven.data_plane_wait_ns() > TIMER_INTERVAL_NS, 10, "a long sleep with nothing in flight")
        assert driven.idle_wait_ns_after_cycles() == CONDUCTOR_IDLE_MAX_WAIT_NS

        wait_for(lambda: publication.offer(b"x" * 100) > 0, 10, "an offer accepted")
        # Unread: the publisher limit will have to move, so the data plane keeps its timer pace.
        assert 0 < driven.data_plane_wait_ns() <= TIMER_INTERVAL_NS
        assert driven.idle_wait_ns_after_cycles() == CONDUCTOR_IDLE_MAX_WAIT_NS  # not the conductor's business

        _drain(subscription, 1)
        wait_for(lambda: driven.data_plane_wait_ns() > TIMER_INTERVAL_NS, 10, "a long sleep once read")
        assert driven.data_plane_wait_ns() <= IDLE_MAX_WAIT_NS


def test_an_unread_network_image_keeps_the_data_plane_on_its_timer_interval(driven: DrivenDriver) -> None:
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    with Aeron.connect(driven.driver.directory) as aeron:
        subscription = aeron.add_subscription(channel, 9)
        publication = aeron.add_publication(channel, 9)
        wait_for(lambda: publication.is_connected and subscription.is_connected, 10, "the UDP stream connected")
        # Setup, heartbeats and status messages settle; then nothing is in flight.
        wait_for(lambda: driven.data_plane_wait_ns() > TIMER_INTERVAL_NS, 10, "an idle data plane")

        wait_for(lambda: publication.offer(b"y" * 200) > 0, 10, "an offer accepted")
        # Sent and received, but the image's subscriber has not read it.
        wait_for(
            lambda: 0 < driven.data_plane_wait_ns() <= TIMER_INTERVAL_NS,
            10,
            "the timer interval while the image is unread",
        )

        _drain(subscription, 1)
        wait_for(lambda: driven.data_plane_wait_ns() > TIMER_INTERVAL_NS, 10, "a long sleep once read")


def test_a_draining_publication_keeps_the_conductor_on_its_timer_interval(driven: DrivenDriver) -> None:
    with Aeron.connect(driven.driver.directory) as aeron:
        publication = aeron.add_publication("aeron:ipc?term-length=64k", 11)
        subscription = aeron.add_subscription("aeron:ipc?term-length=64k", 11)
        wait_for(lambda: publication.is_connected, 10, "the IPC publication connected")
        wait_for(lambda: publication.offer(b"z" * 100) > 0, 10, "an offer accepted")
        assert driven.idle_wait_ns_after_cycles() == CONDUCTOR_IDLE_MAX_WAIT_NS
        publication.close()
        # Its subscriber has yet to read to the end: it hears promptly once it has.
        wait_for(lambda: driven.idle_wait_ns_after_cycles() == TIMER_INTERVAL_NS, 10, "the timer pace while draining")
        _drain(subscription, 1)
        # Then it lingers: the conductor sleeps until the linger ends, at most the idle wait.
        wait_for(lambda: driven.idle_wait_ns_after_cycles() > TIMER_INTERVAL_NS, 10, "a long sleep once drained")


def test_an_image_at_its_end_of_stream_keeps_the_conductor_on_the_data_planes_idle_wait_until_read(
    driven: DrivenDriver,
) -> None:
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    conductor = driven.driver.conductor
    with Aeron.connect(driven.driver.directory) as aeron:
        subscription = aeron.add_subscription(channel, 13)
        publication = aeron.add_publication(channel, 13)
        wait_for(lambda: publication.is_connected and subscription.is_connected, 10, "the UDP stream connected")
        wait_for(lambda: publication.offer(b"w" * 100) > 0, 10, "an offer accepted")
        publication.close()

        def lingering_publication_and_ended_image() -> bool:
            with driven.lock:
                return all(p.state is PublicationState.LINGER for p in conductor.publications) and all(
                    image.receive_status().is_end_of_stream for image in conductor.images
                )

        # The closed publication has sent all it had and its end of stream: it
        # lingers (up to 5 s: that alone would allow a long sleep).  The image
        # holds the end of stream, unread.
        wait_for(lingering_publication_and_ended_image, 10, "the publication drained and its image ended")
        # (The pace the conductor kept before it had an idle wait of its own:
        # a subscriber that never reads costs no more than it did then.)
        assert driven.idle_wait_ns_after_cycles() == IDLE_MAX_WAIT_NS
        # Read to its end, the image becomes unavailable at the next timer, then lingers.
        _drain(subscription, 1)
        wait_for(lambda: not subscription.is_connected, 10, "the image unavailable once read")
        assert driven.idle_wait_ns_after_cycles() == CONDUCTOR_IDLE_MAX_WAIT_NS


def test_the_idle_wait_is_never_shorter_than_the_timer_interval() -> None:
    directory = new_driver_dir()
    context = DriverContext(
        directory=directory,
        timer_interval_ns=5_000_000,
        idle_max_wait_ns=1_000_000,
        conductor_idle_max_wait_ns=1_000_000,
        cnc_layout=CncLayout.sized(64 * 1024, 64 * 1024, 64 * 1024, 64 * 1024),
    )
    driver = MediaDriver.launch(context)
    try:
        driver.conductor.do_work(time.monotonic_ns())
        assert driver.conductor.idle_wait_ns() == 5_000_000
    finally:
        driver.close()
        remove_driver_dir(directory)
