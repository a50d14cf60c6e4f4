"""The media driver's data plane (driver/data_plane.py over
driver/native/dataplane.h), driven directly: its calls refuse what they must,
the FIFO doorbell wakes its thread once per sleep, a SETUP becomes an event,
datagrams for nobody are counted, and it stops cleanly with everything still
registered.  The driver's own tests (test_driver_*.py) run it end to end."""

from __future__ import annotations

import mmap
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fulmar._native import lib
from fulmar.buffers import AtomicBuffer
from fulmar.counters import COUNTER_LENGTH
from fulmar.driver.counters import SystemCounter
from fulmar.driver.data_plane import (
    CONTROL_MANUAL,
    CONTROL_UNICAST,
    MAX_TRANSPORTS,
    DataPlane,
    DataPlaneError,
    SetupEvent,
)
from fulmar.driver.udp_transport import UdpAddress, UdpTransport
from fulmar.frames import encode_setup
from fulmar.idle import Doorbell
from fulmar.logbuffer import LogBuffers
from support.driver import wait_for

COUNTERS = 64
CONDUCTOR_DOORBELL = 0
DATA_DOORBELL = 8


class Harness:
    """A data plane over a private counters buffer and doorbells, with its FIFO."""

    def __init__(self, directory: Path, spin_ns: int = 0, idle_max_wait_ns: int = 20_000_000) -> None:
        self.values = AtomicBuffer(mmap.mmap(-1, COUNTERS * COUNTER_LENGTH))
        self.bells = AtomicBuffer(mmap.mmap(-1, 64))
        self.conductor_doorbell = Doorbell(self.bells, CONDUCTOR_DOORBELL)
        fifo = directory / "data-doorbell"
        os.mkfifo(fifo, 0o600)
        self.fifo_read = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        self.fifo_write = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        self.data_doorbell = Doorbell(self.bells, DATA_DOORBELL, self.fifo_write)
        self.plane = DataPlane(
            self.values,
            self.conductor_doorbell,
            Doorbell(self.bells, DATA_DOORBELL),
            self.fifo_read,
            idle_max_wait_ns,
            1_000_000,
            7,
            spin_ns,
        )

    def counter(self, counter_id: int) -> int:
        return self.values.get_int64_volatile(counter_id * COUNTER_LENGTH)

    def close(self) -> None:
        self.plane.close()
        os.close(self.fifo_write)
        os.close(self.fifo_read)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def sockets() -> Iterator[list[UdpTransport]]:
    opened: list[UdpTransport] = []
    try:
        yield opened
    finally:
        for transport in opened:
            transport.close()


def open_socket(sockets: list[UdpTransport]) -> UdpTransport:
    transport = UdpTransport.open(("127.0.0.1", 0), receive_batch=1)
    sockets.append(transport)
    return transport


def test_calls_refuse_unknown_ids_taken_ids_and_bad_arguments(harness: Harness, sockets: list[UdpTransport]) -> None:
    plane = harness.plane
    transport = open_socket(sockets)
    here = UdpAddress.resolve("127.0.0.1", transport.local_address[1])
    with pytest.raises(DataPlaneError, match="invalid argument"):
        plane.add_send_endpoint(1, transport.fileno(), CONTROL_UNICAST, None, "unicast needs a destination")
    plane.add_send_endpoint(1, transport.fileno(), CONTROL_UNICAST, here, "one")
    with pytest.raises(DataPlaneError, match="already in use"):
        plane.add_send_endpoint(1, transport.fileno(), CONTROL_UNICAST, here, "again")
    with pytest.raises(DataPlaneError, match="invalid argument"):
        plane.add_destination(1, here)  # not a manual endpoint
    for unknown in (
        plane.remove,
        plane.close_publication,
        plane.trigger_setup,
        plane.publication_status,
        plane.image_status,
        plane.remove_endpoint,
    ):
        with pytest.raises(DataPlaneError, match="unknown id"):
            unknown(99)
    with pytest.raises(DataPlaneError, match="unknown id"):
        plane.set_readers(99, [1], [])
    with pytest.raises(DataPlaneError, match="table full"):
        plane.set_transport(5, MAX_TRANSPORTS, transport.fileno())
    plane.remove_endpoint(1)
    with pytest.raises(DataPlaneError, match="unknown id"):
        plane.remove_endpoint(1)


def test_manual_destinations_come_and_go(harness: Harness, sockets: list[UdpTransport]) -> None:
    plane = harness.plane
    transport = open_socket(sockets)
    a = UdpAddress.resolve("127.0.0.1", 40001)
    b = UdpAddress.resolve("127.0.0.1", 40002)
    plane.add_send_endpoint(3, transport.fileno(), CONTROL_MANUAL, None, "manual")
    plane.add_destination(3, a)
    plane.add_destination(3, a)  # already there: still one
    plane.add_destination(3, b)
    assert plane.remove_destination(3, a)
    assert not plane.remove_destination(3, a)
    assert plane.remove_destination(3, b)


def test_the_fifo_doorbell_writes_only_to_a_sleeper_and_once_per_sleep(harness: Harness) -> None:
    bells = harness.bells
    scratch = Doorbell(bells, 16, harness.fifo_write)  # a word the data plane does not sleep on
    assert not scratch.ring()  # nobody sleeps: no byte written
    lib.fulmar_doorbell_fifo_prepare(bells.address + 16, 0)
    assert scratch.ring() and not scratch.ring() and not scratch.ring()  # one byte for a burst
    lib.fulmar_doorbell_fifo_done(bells.address + 16, 0, harness.fifo_read)
    assert scratch.ring() is False  # awake again: nothing to write


def test_a_ring_wakes_the_sleeping_thread(harness: Harness) -> None:
    plane = harness.plane
    wait_for(lambda: plane.stats().sleeps >= 1, 5, "the data plane asleep")
    before = plane.stats().duty_cycles
    wait_for(lambda: harness.data_doorbell.ring(), 5, "a ring that finds the thread asleep")
    wait_for(lambda: plane.stats().duty_cycles > before, 5, "a duty cycle after the ring")


def test_a_spinning_data_plane_polls_on_after_work_and_then_sleeps(tmp_path: Path, sockets: list[UdpTransport]) -> None:
    # Idle, it sleeps 10 s between cycles: any run of cycles with no sleep in
    # between is the spin (each poll yields its core, so a loaded machine
    # slows the polls, not what they prove).
    harness = Harness(tmp_path, spin_ns=2_000_000_000, idle_max_wait_ns=10_000_000_000)
    try:
        plane = harness.plane
        wait_for(lambda: plane.stats().sleeps >= 1, 5, "the data plane asleep: no spinning before any work")
        receiving = open_socket(sockets)
        plane.add_receive_endpoint(8, 1234, None, None, False, "receive")
        plane.set_transport(8, 0, receiving.fileno())
        invalid = harness.counter(SystemCounter.INVALID_PACKETS)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"\x00" * 5, ("127.0.0.1", receiving.local_address[1]))  # work: a datagram read
        wait_for(lambda: harness.counter(SystemCounter.INVALID_PACKETS) == invalid + 1, 5, "the datagram read")
        after_work = plane.stats()

        def polled_without_sleeping() -> bool:
            stats = plane.stats()  # one snapshot: both fields from the same moment
            return stats.sleeps == after_work.sleeps and stats.duty_cycles >= after_work.duty_cycles + 20

        wait_for(polled_without_sleeping, 5, "20 polls after the work with no sleep between them")
        wait_for(lambda: plane.stats().sleeps > after_work.sleeps, 5, "asleep again once the window passed")
    finally:
        harness.close()


def setup_frame(session_id: int, stream_id: int, term_length: int = 64 * 1024, term_offset: int = 0) -> bytes:
    buffer = bytearray(40)
    encode_setup(buffer, 0, term_offset=term_offset, session_id=session_id, stream_id=stream_id,
                 initial_term_id=5, active_term_id=5, term_length=term_length, mtu_length=1408)  # fmt: skip
    return bytes(buffer)


def test_a_setup_for_a_subscribed_stream_is_an_event_and_others_are_counted(
    harness: Harness, sockets: list[UdpTransport]
) -> None:
    plane = harness.plane
    receiving = open_socket(sockets)
    plane.add_receive_endpoint(8, 1234, None, None, False, "receive")
    plane.set_transport(8, 0, receiving.fileno())
    plane.set_streams(8, [10])
    token = harness.conductor_doorbell.prepare()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.sendto(setup_frame(77, 10), ("127.0.0.1", receiving.local_address[1]))
        events: list[object] = []

        def polled() -> bool:
            events.extend(plane.poll_events())
            return bool(events)

        wait_for(polled, 5, "the SETUP event")
        assert harness.conductor_doorbell.sequence != token  # the conductor was rung
        harness.conductor_doorbell.cancel()
        (event,) = events
        assert isinstance(event, SetupEvent)
        assert (event.endpoint_id, event.transport_index, event.session_id, event.stream_id) == (8, 0, 77, 10)
        assert (event.term_length, event.mtu_length, event.initial_term_id) == (64 * 1024, 1408, 5)
        assert event.source.port == sender.getsockname()[1]

        invalid = harness.counter(SystemCounter.INVALID_PACKETS)
        sender.sendto(setup_frame(77, 11), ("127.0.0.1", receiving.local_address[1]))  # nobody subscribes to 11
        sender.sendto(b"\x00" * 5, ("127.0.0.1", receiving.local_address[1]))  # not a frame
        wait_for(lambda: harness.counter(SystemCounter.INVALID_PACKETS) == invalid + 2, 5, "two invalid packets")
        assert plane.poll_events() == []


def test_an_image_the_setup_position_cannot_fit_is_refused(
    harness: Harness, sockets: list[UdpTransport], tmp_path: Path
) -> None:
    plane = harness.plane
    receiving = open_socket(sockets)
    plane.add_receive_endpoint(8, 1234, None, None, False, "receive")
    plane.set_transport(8, 0, receiving.fileno())
    log = LogBuffers.create(tmp_path / "image.logbuffer", 64 * 1024, initial_term_id=5, session_id=1, stream_id=2)
    try:
        source = UdpAddress.resolve("127.0.0.1", 40003)
        fields = dict(correlation_id=21, endpoint_id=8, log=log.address, term_length=log.term_length,
                      initial_term_id=5, session_id=1, stream_id=2, active_term_id=5, transport_index=0,
                      receiver_hwm_id=40, receiver_position_id=41, initial_window_length=128 * 1024,
                      status_message_timeout_ns=200_000_000, image_liveness_timeout_ns=10_000_000_000)  # fmt: skip
        with pytest.raises(DataPlaneError, match="invalid argument"):
            plane.add_image(source, **fields, term_offset=33)  # not frame aligned
        with pytest.raises(DataPlaneError, match="invalid argument"):
            plane.add_image(source, **{**fields, "active_term_id": 4}, term_offset=0)  # before the initial term
        plane.add_image(source, **fields, term_offset=64)
        status = plane.image_status(21)
        assert (status.rebuild_position, status.hwm_position, status.is_end_of_stream) == (64, 64, False)
        with pytest.raises(DataPlaneError, match="already in use"):
            plane.add_image(source, **fields, term_offset=0)
        with pytest.raises(DataPlaneError, match="invalid argument"):
            plane.remove_endpoint(8)  # it still has an image
        plane.remove(21)
        plane.remove_endpoint(8)
    finally:
        log.close()


def test_stopping_with_everything_registered_frees_it(tmp_path: Path, sockets: list[UdpTransport]) -> None:
    h = Harness(tmp_path)
    publication_log = LogBuffers.create(tmp_path / "pub.logbuffer", 64 * 1024, session_id=3, stream_id=10)
    ipc_log = LogBuffers.create(tmp_path / "ipc.logbuffer", 64 * 1024, session_id=4, stream_id=12)
    try:
        plane = h.plane
        sending, receiving = open_socket(sockets), open_socket(sockets)
        here = UdpAddress.resolve("127.0.0.1", receiving.local_address[1])
        plane.add_send_endpoint(1, sending.fileno(), CONTROL_UNICAST, here, "send")
        plane.add_receive_endpoint(2, 99, 5, None, False, "receive")
        plane.set_transport(2, 0, receiving.fileno())
        plane.set_streams(2, [10])
        plane.add_network_publication(
            registration_id=100, endpoint_id=1, log=publication_log.address, term_length=64 * 1024, mtu=1408,
            initial_term_id=publication_log.initial_term_id, session_id=3, stream_id=10, ttl=0, start_position=0,
            term_window_length=32 * 1024, publisher_limit_id=40, publisher_position_id=41, sender_position_id=42,
            flow_control=lib.FULMAR_FC_UNICAST, fc_receiver_timeout_ns=5_000_000_000, fc_group_tag=-1,
            fc_group_min_size=0, has_group_semantics=False, spies_simulate_connection=False,
            initial_setup_interval_ns=5_000_000,
        )  # fmt: skip
        plane.add_ipc_publication(101, ipc_log.address, 64 * 1024, ipc_log.initial_term_id, 0, 32 * 1024, 43, 44)
        plane.set_readers(101, [45, 46], [47])
        # The publication's SETUPs reach the receive endpoint: an image is wanted.
        wait_for(lambda: any(isinstance(e, SetupEvent) for e in plane.poll_events()), 5, "a SETUP event")
        status = plane.publication_status(100)
        assert (status.sender_position, status.is_connected) == (0, False)
    finally:
        h.close()  # stops the thread with everything still registered
        publication_log.close()
        ipc_log.close()


def test_an_ipc_publications_limit_is_raised_before_set_readers_returns(harness: Harness, tmp_path: Path) -> None:
    """The conductor names a subscriber's position, then marks the IPC
    publication connected and tells the clients.  A publisher that sees it
    connected must find room to append at once: the limit is raised in the
    same call, not left to the data plane thread's next cycle (before, a
    publisher on a loaded machine saw its first try_claim back pressured)."""
    log = LogBuffers.create(tmp_path / "ipc.logbuffer", 64 * 1024, session_id=4, stream_id=12)
    try:
        plane = harness.plane
        limit_id, position_id, subscriber_id = 43, 44, 45
        plane.add_ipc_publication(101, log.address, 64 * 1024, log.initial_term_id, 0, 32 * 1024, limit_id, position_id)
        try:
            for round_ in range(20):  # each read follows the call within microseconds
                subscriber_position = round_ * 1024
                harness.values.put_int64_ordered(subscriber_id * COUNTER_LENGTH, subscriber_position)
                plane.set_readers(101, [subscriber_id], [])
                assert harness.counter(limit_id) == subscriber_position + 32 * 1024
                plane.set_readers(101, [], [])  # no subscriber: the limit falls back to what was consumed
                assert harness.counter(limit_id) == subscriber_position
        finally:
            plane.remove(101)  # out of the thread's hands before its log is unmapped
    finally:
        log.close()
