"""Channel tags on UDP subscriptions (``tags=N``): subscriptions of several
clients share one receive channel endpoint, a multi-destination one included;
and spies on a manual multi-destination-cast publication."""

from __future__ import annotations

import multiprocessing
import os
import socket
import struct
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from fulmar.aeron import Aeron, RegistrationError
from fulmar.codecs.generated import driver as protocol
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from support.driver import DriverProcess, free_udp_port, new_driver_dir, remove_driver_dir, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SPAWN = multiprocessing.get_context("spawn")
STREAM = 4001


def tagged_subscriber_main(directory: str, channel: str, control: Connection) -> None:
    """Another client process: subscribe to ``channel``, record (session id, value)
    of every message, report them on request."""
    with Aeron.connect(directory) as aeron:
        subscription = aeron.add_subscription(channel, STREAM)
        got: list[tuple[int, int]] = []
        handler = lambda b, o, n, h: got.append((h.session_id, struct.unpack_from("<q", b, o)[0]))
        control.send("subscribed")
        while True:
            if control.poll():
                command = control.recv()
                if command == "report":
                    control.send((list(got), subscription.image_count))
                elif command == "stop":
                    return
            if subscription.poll(handler, 256) == 0:
                time.sleep(0.0005)


@pytest.fixture
def two_drivers(start_driver) -> Iterator[tuple[DriverProcess, DriverProcess]]:
    """A sending driver and a receiving driver."""
    other_dir = new_driver_dir()
    try:
        yield start_driver(), start_driver(other_dir)
    finally:
        remove_driver_dir(other_dir)


@pytest.fixture
def other_process() -> Iterator[list[tuple[multiprocessing.process.BaseProcess, Connection]]]:
    """Client processes a test starts; stopped (killed if need be) afterwards."""
    started: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    yield started
    for process, end in started:
        if process.is_alive():
            try:
                end.send("stop")
            except OSError:
                pass
            process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)


def offer(publication, seq: int, read=lambda: None) -> None:
    """Offer one message, calling ``read`` while back pressured (a subscriber must consume to make room)."""

    def once() -> bool:
        read()
        result = publication.offer(struct.pack("<q", seq))
        assert result > 0 or result in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION), result
        return result > 0

    wait_for(once, 10, f"offer of message {seq}")


def report(end: Connection) -> tuple[list[tuple[int, int]], int]:
    end.send("report")
    assert end.poll(30)
    got, image_count = end.recv()
    return got, image_count


def test_a_tagged_subscription_of_another_process_shares_a_multi_destination_endpoint(
    two_drivers, other_process
) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    with receiver.connect() as owner_client, sender.connect() as remote:
        owner = owner_client.add_subscription("aeron:udp?control-mode=manual|tags=1001", STREAM)
        owner.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
        # The other client knows the endpoint only by its tag, and wants one session of the stream.
        end, control = SPAWN.Pipe()
        process = SPAWN.Process(
            target=tagged_subscriber_main,
            args=(str(receiver.directory), "aeron:udp?tags=1001|session-id=555", control),
        )
        process.start()
        other_process.append((process, end))
        assert end.poll(30) and end.recv() == "subscribed"
        wanted = remote.add_exclusive_publication(
            f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k|session-id=555", STREAM
        )
        unwanted = remote.add_exclusive_publication(
            f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k|session-id=556", STREAM
        )
        wait_for(lambda: owner.image_count == 2 and report(end)[1] == 1, 20, "the images of both subscribers")
        got: list[tuple[int, int]] = []
        handler = lambda b, o, n, h: got.append((h.session_id, struct.unpack_from("<q", b, o)[0]))
        for seq in range(500):
            offer(wanted, seq, lambda: owner.poll(handler, 256))
            offer(unwanted, 10_000 + seq, lambda: owner.poll(handler, 256))
        wait_for(lambda: owner.poll(handler, 256) >= 0 and len(got) == 1_000, 20, "the owner's 1,000 messages")
        assert sorted(v for s, v in got if s == 555) == list(range(500))
        assert sorted(v for s, v in got if s == 556) == list(range(10_000, 10_500))
        wait_for(lambda: len(report(end)[0]) >= 500, 20, "the tagged subscriber's 500 messages")
        other_got, image_count = report(end)
        assert other_got == [(555, seq) for seq in range(500)], "the session-id filter or the order is wrong"
        assert image_count == 1


def test_the_endpoint_outlives_its_owner_while_a_tagged_subscription_uses_it(two_drivers) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    remote = sender.connect()
    other_client = receiver.connect()
    try:
        owner_client = receiver.connect()
        owner = owner_client.add_subscription("aeron:udp?control-mode=manual|tags=2002", STREAM)
        owner.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
        other = other_client.add_subscription("aeron:udp?tags=2002", STREAM)
        assert other.channel_status_id == owner.channel_status_id  # one endpoint
        publication = remote.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k", STREAM)
        wait_for(lambda: publication.is_connected and other.image_count == 1, 20, "the tagged subscriber's image")
        got: list[int] = []
        handler = lambda b, o, n, h: got.append(struct.unpack_from("<q", b, o)[0])
        offer(publication, 0)
        wait_for(lambda: other.poll(handler, 10) >= 0 and got == [0], 10, "the first message")
        # The owner (who opened the endpoint and added its destination) goes away.
        owner_client.close()
        for seq in range(1, 2_000):
            offer(publication, seq, lambda: other.poll(handler, 256))
        wait_for(lambda: other.poll(handler, 256) >= 0 and len(got) >= 2_000, 20, "the rest after the owner left")
        assert got == list(range(2_000))
        assert other.image_count == 1
        # The last subscription goes: the endpoint closes, its destination's port is free again.
        other.close()

        def port_is_free() -> bool:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    return False
                return True

        wait_for(port_is_free, 10, "the endpoint to close")
        with pytest.raises(RegistrationError, match="no receive channel endpoint has tag 2002"):
            other_client.add_subscription("aeron:udp?tags=2002", STREAM)
    finally:
        other_client.close()
        remote.close()


def test_unknown_and_contradicting_tags_are_clear_errors(start_driver) -> None:
    driver = start_driver()
    with driver.connect() as aeron:
        with pytest.raises(RegistrationError, match="no receive channel endpoint has tag 4242") as error:
            aeron.add_subscription("aeron:udp?tags=4242|session-id=123", STREAM)
        assert error.value.code == protocol.ErrorCode.INVALID_CHANNEL
        aeron.add_subscription("aeron:udp?control-mode=manual|tags=4243", STREAM)
        # Naming the tag with an address of its own contradicts the endpoint.
        with pytest.raises(RegistrationError, match="whose endpoint or control differs") as error:
            aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|tags=4243", STREAM)
        assert error.value.code == protocol.ErrorCode.INVALID_CHANNEL
        # The same tag and control mode is the same endpoint.
        again = aeron.add_subscription("aeron:udp?control-mode=manual|tags=4243", STREAM + 1)
        assert again.channel_status_id == aeron.add_subscription("aeron:udp?tags=4243", STREAM).channel_status_id
        # Tags do not make publications or spies find anything: they still need an address.
        with pytest.raises(RegistrationError, match="UDP needs an endpoint"):
            aeron.add_publication("aeron:udp?tags=4243", STREAM)


def test_a_tagged_endpoint_channel_is_shared_by_its_tag(two_drivers) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    with receiver.connect() as first_client, receiver.connect() as second_client, sender.connect() as remote:
        first = first_client.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}|tags=7", STREAM)
        second = second_client.add_subscription("aeron:udp?tags=7", STREAM)
        assert first.channel_status_id == second.channel_status_id
        publication = remote.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k", STREAM)
        wait_for(lambda: first.image_count == 1 and second.image_count == 1, 20, "an image for each")
        firsts: list[int] = []
        seconds: list[int] = []
        for seq in range(200):  # 200 small messages fit in the window: no need to read meanwhile
            offer(publication, seq)
        wait_for(
            lambda: (
                first.poll(lambda b, o, n, h: firsts.append(struct.unpack_from("<q", b, o)[0]), 256) >= 0
                and second.poll(lambda b, o, n, h: seconds.append(struct.unpack_from("<q", b, o)[0]), 256) >= 0
                and len(firsts) == len(seconds) == 200
            ),
            20,
            "both to get 200",
        )
        assert firsts == seconds == list(range(200))


def test_a_spy_reads_a_manual_multi_destination_publication(two_drivers) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    with sender.connect() as aeron, receiver.connect() as remote:
        subscription = remote.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
        publication = aeron.add_publication("aeron:udp?control-mode=manual|term-length=64k", STREAM)
        publication.add_destination(f"aeron:udp?endpoint=127.0.0.1:{port}")
        spy = aeron.add_subscription(
            f"aeron-spy:aeron:udp?control-mode=manual|session-id={publication.session_id}", STREAM
        )
        wait_for(lambda: publication.is_connected and spy.image_count == 1, 20, "the receiver and the spy")
        assert spy.images[0].source_identity == "aeron-spy"
        spied: list[int] = []
        received: list[int] = []

        def read_both() -> bool:
            spy.poll(lambda b, o, n, h: spied.append(struct.unpack_from("<q", b, o)[0]), 256)
            subscription.poll(lambda b, o, n, h: received.append(struct.unpack_from("<q", b, o)[0]), 256)
            return True

        # 8 bytes a message (a 64-byte frame): 3,000 of them go round the 64k terms more than once.
        for seq in range(3_000):
            wait_for(lambda: read_both() and publication.offer(struct.pack("<q", seq)) > 0, 10, f"offer {seq}")
        wait_for(lambda: read_both() and len(spied) == len(received) == 3_000, 20, "both to see everything")
        assert spied == received == list(range(3_000))


def test_spies_alone_connect_a_manual_publication_and_a_slow_spy_holds_it_back(start_driver) -> None:
    driver = start_driver()
    with driver.connect() as aeron:
        # No destination at all: with ssc=true the spy is the only consumer.
        publication = aeron.add_exclusive_publication("aeron:udp?control-mode=manual|term-length=64k|ssc=true", STREAM)
        assert not publication.is_connected
        spy = aeron.add_subscription(
            f"aeron-spy:aeron:udp?control-mode=manual|session-id={publication.session_id}", STREAM
        )
        wait_for(lambda: publication.is_connected and spy.image_count == 1, 10, "a connection made by the spy alone")
        # The driver sets the publisher's window from the spy's position in a
        # duty cycle of its own, maybe after the connection shows (as Aeron's).
        wait_for(lambda: publication.position_limit > 0, 10, "the publisher's window")
        # The spy does not read: the publisher stops a term window (half a 64k term) ahead of it.
        start = spy.images[0].position
        deadline = time.monotonic() + 10
        seq = 0
        while True:
            result = publication.offer(struct.pack("<q", seq))
            if result > 0:
                seq += 1
            elif result == BACK_PRESSURED:
                break
            assert time.monotonic() < deadline, "the publisher was never held back"
        assert publication.position - start <= 32 * 1024
        assert publication.position_limit == start + 32 * 1024
        # Reading lets it go on, far past the first window and the first term:
        # the sender follows the spy although no receiver sends status messages.
        spied: list[int] = []
        read = lambda: spy.poll(lambda b, o, n, h: spied.append(struct.unpack_from("<q", b, o)[0]), 256) >= 0
        for more in range(seq, seq + 5_000):
            wait_for(lambda: read() and publication.offer(struct.pack("<q", more)) > 0, 10, f"offer {more}")
            os.sched_yield()
        wait_for(lambda: read() and len(spied) == seq + 5_000, 10, "the spy to read everything")
        assert spied == list(range(seq + 5_000))
