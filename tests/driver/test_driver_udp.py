"""Two media drivers exchanging streams over UDP on loopback."""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import struct
import time
import zlib
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.cnc import CncFile
from fulmar.counters import CountersReader
from fulmar.driver.counters import SystemCounter
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from support.driver import DriverProcess, free_udp_port, new_driver_dir, remove_driver_dir, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SPAWN = multiprocessing.get_context("spawn")
MTU = 1408
POOL = random.Random(11).randbytes(1 << 20)
STREAM = 2001


def set_loss(directory: Path, receive_ppm: int, send_ppm: int) -> None:
    """Set a running driver's loss injection through its counters."""
    with CncFile.open(directory) as cnc:
        values = cnc.counters_values
        values.put_int64_ordered(SystemCounter.LOSS_RECEIVE_RATE_PPM * 128, receive_ppm)
        values.put_int64_ordered(SystemCounter.LOSS_SEND_RATE_PPM * 128, send_ppm)


def system_counter(directory: Path, counter: SystemCounter) -> int:
    with CncFile.open(directory) as cnc:
        return CountersReader(cnc.counters_metadata, cnc.counters_values).counter_value(int(counter))


@pytest.fixture
def two_drivers(start_driver):
    other_dir = new_driver_dir()
    try:
        sender = start_driver()
        receiver = start_driver(other_dir, image_liveness_timeout_ns=1_000_000_000)
        yield sender, receiver
    finally:
        remove_driver_dir(other_dir)


def payload(seq: int, rnd: random.Random) -> bytes:
    size = rnd.randint(1, MTU - 32) if rnd.random() < 0.8 else rnd.randint(1, 4 * MTU)
    start = (seq * 7919) % (len(POOL) - 4 * MTU)
    return POOL[start : start + size]


def udp_publisher_main(directory: str, channel: str, count: int, result: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        publication = aeron.add_publication(channel, STREAM)
        rnd = random.Random(2)
        crc = 0
        deadline = time.monotonic() + max(240, count / 1000)
        for seq in range(count):
            data = payload(seq, rnd)
            while True:
                outcome = publication.offer(data, reserved_value=seq)
                if outcome > 0:
                    break
                assert outcome in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION), outcome
                assert time.monotonic() < deadline, "publisher stuck"
                if outcome != ADMIN_ACTION:  # a rotation is retried at once
                    os.sched_yield()
            crc = zlib.crc32(data, crc)
        result.send(crc)
        result.poll(240)  # keep the stream open until the subscriber is done


def test_a_stream_over_udp_with_loss_in_both_directions_arrives_exactly_once_in_order(two_drivers) -> None:
    # 30,000 messages: about 1,500 datagrams lost each way, every one recovered (NAK, retransmit);
    # the million-message run is marked slow.
    lossy_stream(two_drivers, 30_000)


@pytest.mark.slow
def test_one_million_messages_over_udp_with_loss_in_both_directions(two_drivers) -> None:
    lossy_stream(two_drivers, 1_000_000)


def lossy_stream(two_drivers: tuple[DriverProcess, DriverProcess], count: int) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=1m"
    set_loss(sender.directory, 50_000, 50_000)  # 5% of datagrams dropped each way, on each driver
    set_loss(receiver.directory, 50_000, 50_000)
    end, result = SPAWN.Pipe()
    publisher = SPAWN.Process(target=udp_publisher_main, args=(str(sender.directory), channel, count, result))
    aeron = receiver.connect()
    try:
        subscription = aeron.add_subscription(channel, STREAM)
        publisher.start()
        rnd = random.Random(2)
        state: dict[str, Any] = {"seq": 0, "crc": 0, "error": None}

        def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            seq = state["seq"]
            expected = payload(seq, rnd)
            if header.reserved_value != seq or buffer[offset : offset + length] != expected:
                state["error"] = state["error"] or f"message {seq}: got reserved {header.reserved_value}"
            state["crc"] = zlib.crc32(expected, state["crc"])
            state["seq"] = seq + 1

        assembler = FragmentAssembler(on_message)
        deadline = time.monotonic() + max(240, count / 1000)
        while state["seq"] < count and state["error"] is None:
            assert time.monotonic() < deadline, f"only {state['seq']} of {count} messages arrived"
            if subscription.poll(assembler, 256) == 0:
                os.sched_yield()
        assert state["error"] is None
        assert end.poll(30)
        assert end.recv() == state["crc"]
        # The loss really happened and was repaired.
        assert system_counter(receiver.directory, SystemCounter.NAK_MESSAGES_SENT) > 0
        assert system_counter(sender.directory, SystemCounter.RETRANSMITS_SENT) > 0
        end.send("done")
    finally:
        aeron.close()
        publisher.join(30)
        if publisher.is_alive():
            publisher.kill()
            publisher.join(10)


def test_garbage_datagrams_are_counted_and_dropped(two_drivers) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    with receiver.connect() as sub_client, sender.connect() as pub_client:
        subscription = sub_client.add_subscription(channel, STREAM)
        before = system_counter(receiver.directory, SystemCounter.INVALID_PACKETS)
        rnd = random.Random(7)
        hostile = [
            b"",
            b"\x00",
            rnd.randbytes(7),
            rnd.randbytes(1000),
            struct.pack("<iBBh", 40, 0, 0, 5) + bytes(4),  # a SETUP cut short
            struct.pack("<iBBhiiiiq", 64, 0, 0xC0, 1, 2**30, 1, STREAM, 7, 0),  # DATA for an unknown session
            struct.pack("<iBBhiiiiq", -5, 0, 0xC0, 1, 0, 1, STREAM, 7, 0),  # negative frame length
            struct.pack("<iBBh", 8, 0, 0, 0x7FFF),  # unknown frame type
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
            for datagram in hostile * 20:
                attacker.sendto(datagram, ("127.0.0.1", port))
        wait_for(
            lambda: system_counter(receiver.directory, SystemCounter.INVALID_PACKETS) > before,
            10,
            "invalid packets counted",
        )
        # The driver still serves the stream.
        publication = pub_client.add_publication(channel, STREAM)
        wait_for(lambda: publication.is_connected and subscription.image_count, 10, "the UDP connection")
        wait_for(lambda: publication.offer(b"still here") > 0, 10, "an offer")
        got: list[bytes] = []
        wait_for(
            lambda: subscription.poll(lambda b, o, n, h: got.append(bytes(b[o : o + n])), 10) >= 0 and got,
            10,
            "the message",
        )
        assert got == [b"still here"]


def endless_udp_publisher_main(directory: str, channel: str, ready: Connection) -> None:
    aeron = Aeron.connect(directory)
    publication = aeron.add_publication(channel, STREAM)
    ready.send("up")
    while True:
        if publication.offer(b"tick" * 8) < 0:
            time.sleep(0.001)


def test_a_killed_publishers_driver_makes_the_image_unavailable(two_drivers) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    unavailable: list[object] = []
    with receiver.connect() as aeron:
        subscription = aeron.add_subscription(channel, STREAM, on_unavailable_image=unavailable.append)
        end, ready = SPAWN.Pipe()
        publisher = SPAWN.Process(target=endless_udp_publisher_main, args=(str(sender.directory), channel, ready))
        publisher.start()
        try:
            assert end.poll(30)
            wait_for(lambda: subscription.poll(lambda *a: None, 100) > 0, 10, "data over UDP")
            sender.kill()  # the whole sending side goes silent
            killed_at = time.monotonic()
            wait_for(lambda: subscription.poll(lambda *a: None, 100) >= 0 and unavailable, 10, "the image to go")
            assert time.monotonic() - killed_at < 1.0 + 2.0  # liveness timeout plus the driver's timer slack
        finally:
            publisher.kill()
            publisher.join(10)


def test_a_spy_reads_a_udp_publication_in_its_own_driver(two_drivers) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    with sender.connect() as aeron, receiver.connect() as remote:
        spy = aeron.add_subscription("aeron-spy:" + channel, STREAM)
        publication = aeron.add_publication(channel, STREAM)
        wait_for(lambda: spy.image_count == 1, 10, "the spy's image")
        assert spy.images[0].source_identity == "aeron-spy"
        # No receiver yet: a spy alone does not connect the publication (no ssc).
        assert not publication.is_connected
        subscription = remote.add_subscription(channel, STREAM)
        wait_for(lambda: publication.is_connected and subscription.image_count, 10, "the remote receiver")
        spied: list[int] = []
        received: list[int] = []

        def read_both() -> bool:
            spy.poll(lambda b, o, n, h: spied.append(struct.unpack_from("<q", b, o)[0]), 500)
            subscription.poll(lambda b, o, n, h: received.append(struct.unpack_from("<q", b, o)[0]), 500)
            return True

        # The spy holds the publisher back like a receiver does, so read while offering.
        for seq in range(2_000):
            wait_for(lambda: read_both() and publication.offer(struct.pack("<q", seq)) > 0, 10, "an offer")
        wait_for(lambda: read_both() and len(spied) == len(received) == 2_000, 20, "both to see everything")
        assert spied == received == list(range(2_000))


def test_spies_simulate_connection(start_driver) -> None:
    driver = start_driver()
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k|ssc=true"
    with driver.connect() as aeron:
        spy = aeron.add_subscription("aeron-spy:" + channel, STREAM)
        publication = aeron.add_publication(channel, STREAM)
        wait_for(lambda: publication.is_connected and spy.image_count, 10, "a connection made by the spy alone")
        wait_for(lambda: publication.offer(b"spied") > 0, 10, "an offer")
        got: list[bytes] = []
        wait_for(
            lambda: spy.poll(lambda b, o, n, h: got.append(bytes(b[o : o + n])), 10) >= 0 and got, 10, "the message"
        )
        assert got == [b"spied"]


def test_a_multi_destination_subscription_merges_two_sources_of_one_stream(two_drivers) -> None:
    """The replay-merge pattern: one image fed by an offset copy (as a replay
    would be) and by the live stream; same session, same positions."""
    live_driver, receiving_driver = two_drivers
    copy_port, live_port = free_udp_port(), free_udp_port()
    start = "|session-id=777|init-term-id=5|term-id=5|term-offset=0|term-length=64k"
    with receiving_driver.connect() as local, live_driver.connect() as remote:
        subscription = local.add_subscription("aeron:udp?control-mode=manual", STREAM)
        subscription.add_destination(f"aeron:udp?endpoint=127.0.0.1:{copy_port}")
        subscription.add_destination(f"aeron:udp?endpoint=127.0.0.1:{live_port}")
        copy = local.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{copy_port}{start}", STREAM)
        live = remote.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{live_port}{start}", STREAM)
        wait_for(lambda: copy.is_connected and live.is_connected and subscription.image_count == 1, 10, "one image")
        received: list[int] = []

        def read() -> bool:
            subscription.poll(lambda b, o, n, h: received.append(struct.unpack_from("<q", b, o)[0]), 500)
            return True

        # The copy is first with the older half; the live stream then carries everything.
        for seq in range(1_000):
            wait_for(lambda: read() and copy.offer(struct.pack("<q", seq) * 4) > 0, 10, "a copy offer")
        for seq in range(2_000):
            wait_for(lambda: read() and live.offer(struct.pack("<q", seq) * 4) > 0, 10, "a live offer")
        wait_for(lambda: read() and len(received) >= 2_000, 20, "the merged stream")
        assert received == list(range(2_000)), "gaps or duplicates in the merged stream"
        assert subscription.image_count == 1 and subscription.images[0].session_id == 777
        subscription.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{copy_port}")  # the replay is done
        wait_for(lambda: read() and live.offer(struct.pack("<q", 2_000) * 4) > 0, 10, "a live offer")
        wait_for(lambda: read() and len(received) == 2_001, 10, "the live stream alone")
        assert received[-1] == 2_000


def test_the_end_of_one_merged_source_does_not_end_the_image(two_drivers) -> None:
    """Replay merge as a catching-up cluster follower does it (issue 18): the
    copy (a catchup replay) closes while both destinations are bound, its EOS
    arrives, and the image goes on with the live stream; the image ends only
    when every destination's source has ended (Aeron's image connections)."""
    live_driver, receiving_driver = two_drivers
    copy_port, live_port = free_udp_port(), free_udp_port()
    start = "|session-id=778|init-term-id=5|term-id=5|term-offset=0|term-length=64k"
    unavailable: list[object] = []
    with receiving_driver.connect() as local, live_driver.connect() as remote:
        subscription = local.add_subscription(
            "aeron:udp?control-mode=manual", STREAM, on_unavailable_image=unavailable.append
        )
        subscription.add_destination(f"aeron:udp?endpoint=127.0.0.1:{copy_port}")
        subscription.add_destination(f"aeron:udp?endpoint=127.0.0.1:{live_port}")
        copy = local.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{copy_port}{start}", STREAM)
        live = remote.add_exclusive_publication(f"aeron:udp?endpoint=127.0.0.1:{live_port}{start}", STREAM)
        wait_for(lambda: copy.is_connected and live.is_connected and subscription.image_count == 1, 10, "one image")
        image = subscription.images[0]
        received: list[int] = []

        def read() -> bool:
            subscription.poll(lambda b, o, n, h: received.append(struct.unpack_from("<q", b, o)[0]), 500)
            return True

        for seq in range(100):  # both carry the same stream, position for position
            wait_for(lambda: read() and copy.offer(struct.pack("<q", seq) * 4) > 0, 10, "a copy offer")
            wait_for(lambda: read() and live.offer(struct.pack("<q", seq) * 4) > 0, 10, "a live offer")
        wait_for(lambda: read() and len(received) >= 100, 10, "the merged stream")
        copy.close()  # the replay ends: its EOS heartbeats reach the copy destination
        # A bounded look, the live stream going on: a second holds about ten of
        # the closed copy's EOS heartbeats (100 ms apart), each of which used to
        # end the image (and the archive's recording of it with it).
        seq = 100
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            wait_for(lambda: read() and live.offer(struct.pack("<q", seq) * 4) > 0, 10, "a live offer")
            seq += 1
            time.sleep(0.01)
            assert not image.is_end_of_stream, f"the image ended with the copy, at {image.position}"
        first = seq
        for seq in range(first, first + 200):
            wait_for(lambda: read() and live.offer(struct.pack("<q", seq) * 4) > 0, 10, "a live offer")
        wait_for(lambda: read() and len(received) >= seq + 1, 10, "the live stream after the copy ended")
        assert received == list(range(seq + 1))
        assert not image.is_end_of_stream and not unavailable
        assert subscription.image_count == 1 and subscription.images[0] is image
        live.close()  # now every source has ended: so has the image
        wait_for(lambda: read() and image.is_end_of_stream, 10, "the end of the stream")
        wait_for(lambda: read() and unavailable, 10, "the image to go")


def test_a_restarted_receiver_gets_a_new_image(two_drivers) -> None:
    sender, receiver = two_drivers
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=64k"
    end, ready = SPAWN.Pipe()
    publisher = SPAWN.Process(target=endless_udp_publisher_main, args=(str(sender.directory), channel, ready))
    publisher.start()
    try:
        assert end.poll(30)
        with receiver.connect() as first:
            subscription = first.add_subscription(channel, STREAM)
            wait_for(lambda: subscription.poll(lambda *a: None, 100) > 0, 10, "data over UDP")
            receiver.kill()  # the receiving node dies, its client with it
        restarted = DriverProcess(receiver.directory)
        try:
            with restarted.connect() as second:
                subscription = second.add_subscription(channel, STREAM)
                wait_for(lambda: subscription.poll(lambda *a: None, 100) > 0, 10, "data on the restarted receiver")
                # A new image, joined where the running stream had got to.
                assert subscription.images[0].join_position > 0
        finally:
            restarted.stop()
    finally:
        publisher.kill()
        publisher.join(10)


def test_closing_a_udp_publication_ends_the_stream_at_the_receiver(two_drivers) -> None:
    sender, receiver = two_drivers
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
    unavailable: list[object] = []
    with receiver.connect() as local, sender.connect() as remote:
        subscription = local.add_subscription(channel, STREAM, on_unavailable_image=unavailable.append)
        publication = remote.add_publication(channel, STREAM)
        wait_for(lambda: publication.is_connected and subscription.image_count, 10, "the connection")
        got: list[bytes] = []
        for i in range(10):
            wait_for(lambda: publication.offer(bytes([i]) * 8) > 0, 10, "an offer")
        image = subscription.images[0]
        publication.close()
        wait_for(
            lambda: (
                subscription.poll(lambda b, o, n, h: got.append(bytes(b[o : o + n])), 100) >= 0
                and image.is_end_of_stream
            ),
            10,
            "the end of the stream",
        )
        assert got == [bytes([i]) * 8 for i in range(10)]
        wait_for(lambda: subscription.poll(lambda *a: None, 1) >= 0 and unavailable, 10, "the image to go")


def test_an_ephemeral_endpoint_is_resolvable_after_bind(two_drivers) -> None:
    sender, receiver = two_drivers
    with receiver.connect() as local, sender.connect() as remote:
        subscription = local.add_subscription("aeron:udp?endpoint=127.0.0.1:0", STREAM)
        resolved = subscription.resolved_endpoint
        assert resolved is not None and resolved.startswith("127.0.0.1:") and not resolved.endswith(":0")
        publication = remote.add_publication(f"aeron:udp?endpoint={resolved}", STREAM)
        wait_for(lambda: publication.is_connected and subscription.image_count, 10, "a connection to the resolved port")
        multi = local.add_subscription("aeron:udp?control-mode=manual", STREAM)
        assert multi.resolved_endpoints == []
        multi.add_destination("aeron:udp?endpoint=127.0.0.1:0")
        multi.add_destination("aeron:udp?endpoint=127.0.0.1:0")
        assert len(set(multi.resolved_endpoints)) == 2


def test_an_unusable_endpoint_is_a_clear_error(two_drivers) -> None:
    from fulmar.aeron import RegistrationError
    from fulmar.codecs.generated import driver as protocol

    first, second = two_drivers
    port = free_udp_port()
    with first.connect() as one, second.connect() as two:
        one.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
        with pytest.raises(RegistrationError, match=f"127.0.0.1:{port}") as caught:
            two.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)  # the port is taken
        assert caught.value.code == protocol.ErrorCode.CHANNEL_ENDPOINT_ERROR
        with pytest.raises(RegistrationError, match="endpoint"):
            two.add_publication("aeron:udp?term-length=64k", STREAM)
        # The driver still serves.
        assert two.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", STREAM).registration_id > 0
