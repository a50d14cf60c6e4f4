"""The media driver with real client processes over aeron:ipc."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import struct
import time
import zlib
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from fulmar.aeron import Aeron, DriverTimeoutError, RegistrationError
from fulmar.broadcast import BroadcastReceiver, CopyBroadcastReceiver
from fulmar.cnc import CncFile
from fulmar.codecs.generated import driver as protocol
from fulmar.counters import CountersReader
from fulmar.driver.counters import CLIENT_HEARTBEAT_TYPE_ID, PUBLISHER_LIMIT_TYPE_ID, SUBSCRIBER_POSITION_TYPE_ID
from fulmar.error_log import read_error_log
from fulmar.errors import MessageTooLongError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.publication import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from fulmar.ring_buffer import ManyToOneRingBuffer
from support.driver import DriverProcess, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SPAWN = multiprocessing.get_context("spawn")
MTU = 1408
POOL = random.Random(5).randbytes(1 << 20)
CHANNEL = "aeron:ipc?term-length=4m"
STREAM = 1001


def payload(seq: int, rnd: random.Random) -> bytes:
    size = rnd.randint(1, MTU - 32) if rnd.random() < 0.75 else rnd.randint(1, 4 * MTU)
    start = (seq * 7919) % (len(POOL) - 4 * MTU)
    return POOL[start : start + size]


def offer(publication, data: bytes, reserved: int, deadline: float) -> int:
    while True:
        result = publication.offer(data, reserved_value=reserved)
        if result > 0:
            return result
        if result not in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION):
            raise AssertionError(f"offer failed with {result}")
        if time.monotonic() > deadline:
            raise AssertionError("publisher stuck")
        os.sched_yield()


def publisher_main(directory: str, count: int, result: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        publication = aeron.add_publication(CHANNEL, STREAM)
        deadline = time.monotonic() + 60
        while not publication.is_connected:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        rnd = random.Random(1)
        crc = 0
        back_pressured_before = publication.position
        for seq in range(count):
            data = payload(seq, rnd)
            offer(publication, data, seq, deadline + 120)
            crc = zlib.crc32(data, crc)
        result.send(("done", crc, back_pressured_before))
        # Stay until the subscriber has everything (closing ends the stream).
        result.poll(120)


def slow_subscriber_main(directory: str, count: int, result: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        subscription = aeron.add_subscription(CHANNEL, STREAM)
        rnd = random.Random(1)
        state: dict[str, Any] = {"seq": 0, "crc": 0, "error": None}

        def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            seq = state["seq"]
            expected = payload(seq, rnd)
            if header.reserved_value != seq or buffer[offset : offset + length] != expected:
                state["error"] = state["error"] or f"message {seq} wrong (reserved {header.reserved_value})"
            state["crc"] = zlib.crc32(expected, state["crc"])
            state["seq"] = seq + 1

        assembler = FragmentAssembler(on_message)
        deadline = time.monotonic() + 180
        while state["seq"] < count and state["error"] is None and time.monotonic() < deadline:
            if subscription.poll(assembler, 256) == 0:
                os.sched_yield()
            if state["seq"] % 100_000 < 50 and state["seq"] % 1000 == 0:
                time.sleep(0.02)  # be slow now and then: the publisher must wait
        result.send((state["seq"], state["crc"], state["error"]))


def test_one_million_messages_between_processes_with_back_pressure(start_driver) -> None:
    driver = start_driver()
    count = 1_000_000
    processes = []
    try:
        sub_end, sub_result = SPAWN.Pipe()
        pub_end, pub_result = SPAWN.Pipe()
        subscriber = SPAWN.Process(target=slow_subscriber_main, args=(str(driver.directory), count, sub_result))
        publisher = SPAWN.Process(target=publisher_main, args=(str(driver.directory), count, pub_result))
        processes += [subscriber, publisher]
        subscriber.start()
        publisher.start()
        assert sub_end.poll(240), "subscriber did not finish"
        received, sub_crc, error = sub_end.recv()
        assert error is None
        assert received == count
        assert pub_end.poll(30)
        status, pub_crc, _ = pub_end.recv()
        assert status == "done" and pub_crc == sub_crc
        # Back-pressure happened: the driver counted it on the publication.
        with CncFile.open(driver.directory) as cnc:
            counters = CountersReader(cnc.counters_metadata, cnc.counters_values)
            bpe = [counters.counter_value(c.counter_id) for c in counters if c.label.startswith("snd-bpe:")]
        assert bpe and max(bpe) > 0
        pub_end.send("bye")
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(10)


def fan_out_subscriber_main(directory: str, result: Connection) -> None:
    with Aeron.connect(directory) as aeron:
        subscription = aeron.add_subscription(CHANNEL, STREAM)
        image = wait_for(lambda: subscription.images and subscription.images[0], 30, "an image")
        result.send(("ready", image.join_position))
        seqs: list[int] = []
        assembler = FragmentAssembler(lambda b, o, n, h: seqs.append(h.reserved_value))
        deadline = time.monotonic() + 60
        while not image.is_end_of_stream and time.monotonic() < deadline:
            if subscription.poll(assembler, 256) == 0:
                os.sched_yield()
        first = seqs[0] if seqs else -1
        result.send((len(seqs), first, seqs == list(range(first, first + len(seqs)))))


def test_two_subscribers_get_everything_and_a_late_one_gets_from_its_join(start_driver) -> None:
    driver = start_driver(publication_linger_timeout_ns=200_000_000)
    processes = []
    aeron = driver.connect()
    try:
        ends = []
        for _ in range(2):
            end, result = SPAWN.Pipe()
            process = SPAWN.Process(target=fan_out_subscriber_main, args=(str(driver.directory), result))
            processes.append(process)
            process.start()
            ends.append(end)
        publication = aeron.add_publication(CHANNEL, STREAM)
        for end in ends:
            assert end.poll(30) and end.recv()[0] == "ready"
        rnd = random.Random(3)
        deadline = time.monotonic() + 120
        positions = [0]
        for seq in range(20_000):
            positions.append(offer(publication, payload(seq, rnd), seq, deadline))
        end, result = SPAWN.Pipe()
        late = SPAWN.Process(target=fan_out_subscriber_main, args=(str(driver.directory), result))
        processes.append(late)
        late.start()
        assert end.poll(30)
        status, join_position = end.recv()
        assert status == "ready"
        ends.append(end)
        for seq in range(20_000, 40_000):
            positions.append(offer(publication, payload(seq, rnd), seq, deadline))
        publication.close()
        outcomes = [end.recv() if end.poll(60) else None for end in ends]
        assert outcomes[0] == (40_000, 0, True)
        assert outcomes[1] == (40_000, 0, True)
        # The late subscriber starts with the first message at or after its join position.
        first_after_join = next(seq for seq, start in enumerate(positions[:-1]) if start >= join_position)
        assert join_position == positions[20_000]
        assert outcomes[2] == (40_000 - first_after_join, first_after_join, True)
    finally:
        aeron.close()
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(10)


def endless_publisher_main(directory: str, ready: Connection) -> None:
    aeron = Aeron.connect(directory)
    publication = aeron.add_publication(CHANNEL, STREAM)
    ready.send(publication.registration_id)
    seq = 0
    while True:
        if publication.offer(struct.pack("<q", seq) * 8) > 0:
            seq += 1
        else:
            time.sleep(0.0005)


def test_sigkilled_publisher_is_timed_out_and_its_resources_freed(start_driver) -> None:
    driver = start_driver(
        client_liveness_timeout_ns=1_000_000_000,
        publication_linger_timeout_ns=100_000_000,
        publication_unblock_timeout_ns=2_000_000_000,
    )
    unavailable: list[int] = []
    aeron = driver.connect()
    end, ready = SPAWN.Pipe()
    publisher = SPAWN.Process(target=endless_publisher_main, args=(str(driver.directory), ready))
    try:
        subscription = aeron.add_subscription(
            CHANNEL, STREAM, on_unavailable_image=lambda i: unavailable.append(i.session_id)
        )
        publisher.start()
        assert end.poll(30)
        registration_id = end.recv()
        wait_for(lambda: subscription.poll(lambda *a: None, 100) > 0, 30, "messages from the publisher")
        publisher.kill()
        publisher.join(10)

        def drained() -> bool:
            subscription.poll(lambda *a: None, 1000)
            return bool(unavailable)

        wait_for(drained, 10, "the image to go unavailable")
        with CncFile.open(driver.directory) as cnc:
            counters = CountersReader(cnc.counters_metadata, cnc.counters_values)

            def freed() -> bool:
                labels = [c for c in counters if c.type_id in (PUBLISHER_LIMIT_TYPE_ID, SUBSCRIBER_POSITION_TYPE_ID)]
                heartbeats = [c for c in counters if c.type_id == CLIENT_HEARTBEAT_TYPE_ID]
                logs = list((driver.directory / "publications").glob("*.logbuffer"))
                return not labels and len(heartbeats) == 1 and not logs  # only our own client remains

            wait_for(freed, 10, "the publication's counters and log buffer to be freed")
            errors = [e.text for e in read_error_log(cnc.error_log)]
        assert any("timed out" in text for text in errors)
        assert registration_id > 0
    finally:
        aeron.close()
        if publisher.is_alive():
            publisher.kill()
        publisher.join(10)


def test_sigkilled_driver_makes_clients_raise_driver_timeout(start_driver) -> None:
    driver = start_driver()
    errors: list[BaseException] = []
    aeron = driver.connect(driver_timeout_ms=1000, error_handler=errors.append)
    try:
        publication = aeron.add_publication(CHANNEL, STREAM)
        driver.kill()
        killed_at = time.monotonic()
        wait_for(lambda: any(isinstance(e, DriverTimeoutError) for e in errors), 5, "DriverTimeoutError")
        assert time.monotonic() - killed_at < 1.0 + 1.0  # the timeout plus one keepalive interval
        with pytest.raises(DriverTimeoutError):
            aeron.add_subscription(CHANNEL, STREAM)
        assert publication.is_closed
        # The client itself is closed, saying why and where: what its users
        # (a ClusterClient, an agent's duty cycle) check, without a syscall.
        assert aeron.is_closed and aeron.terminal_error is errors[0]
        assert str(driver.directory) in str(aeron.terminal_error)
    finally:
        aeron.close()
    # A new driver reclaims the dead one's directory.
    replacement = DriverProcess(driver.directory)
    try:
        with replacement.connect() as client:
            assert client.add_subscription(CHANNEL, STREAM).registration_id > 0
    finally:
        replacement.stop()


def test_second_driver_on_a_live_directory_is_refused(start_driver) -> None:
    driver = start_driver()
    with pytest.raises(AssertionError, match=f"pid {driver.process.pid}"):
        DriverProcess(driver.directory)
    with driver.connect() as aeron:  # the first one still serves
        assert aeron.add_publication(CHANNEL, STREAM).session_id is not None


def test_bad_requests_get_documented_errors_and_the_driver_keeps_serving(start_driver) -> None:
    driver = start_driver()
    with driver.connect() as aeron:
        for channel, fragment in [
            ("aeron:bogus", "unknown media"),
            ("ipc", "aeron:"),
            ("aeron:ipc?term-length=3000", "term-length"),
            ("aeron:ipc?mtu=33", "mtu"),
            ("aeron:ipc?session-id=abc", "session-id"),
            ("aeron:ipc?a=1|a=2", "duplicate"),
        ]:
            with pytest.raises(RegistrationError, match=fragment) as caught:
                aeron.add_publication(channel, STREAM)
            assert caught.value.code == protocol.ErrorCode.INVALID_CHANNEL
        with pytest.raises(RegistrationError, match="unknown publication"):
            aeron.conductor._request("remove", protocol.RemovePublicationEncoder, registration_id=987654)

        publication = aeron.add_publication("aeron:ipc?term-length=64k", STREAM)
        with pytest.raises(MessageTooLongError):
            publication.offer(bytes(64 * 1024 // 8 + 1))

        # Raw records on the to-driver buffer: an unknown command and a truncated one.
        with CncFile.open(driver.directory) as cnc:
            ring = ManyToOneRingBuffer(cnc.to_driver)
            receiver = CopyBroadcastReceiver(BroadcastReceiver(cnc.to_clients))
            answers: list[tuple[int, int, str]] = []

            def on_answer(msg_type_id: int, body: memoryview) -> None:
                if msg_type_id == protocol.TemplateId.ON_ERROR:
                    error = protocol.decode(msg_type_id, body, 0, len(body))
                    assert isinstance(error, protocol.OnErrorDecoder)
                    answers.append((error.offending_command_correlation_id, int(error.error_code), error.error_message))

            assert ring.write(0x99, struct.pack("<qq", aeron.client_id, 424242))
            assert ring.write(protocol.TemplateId.ADD_PUBLICATION, struct.pack("<qqi", aeron.client_id, 434343, 5))
            cnc.driver_doorbell().ring()
            wait_for(lambda: receiver.receive(on_answer, 10) >= 0 and len(answers) >= 2, 10, "two ON_ERROR answers")
            codes = {correlation: code for correlation, code, _ in answers}
            assert codes[424242] == protocol.ErrorCode.UNKNOWN_COMMAND_TYPE_ID
            assert codes[434343] == protocol.ErrorCode.MALFORMED_COMMAND
            texts = [e.text for e in read_error_log(cnc.error_log)]
        assert any("unknown command type id 0x99" in text for text in texts)
        assert any("malformed command" in text for text in texts)
        # Still serving.
        assert aeron.add_subscription(CHANNEL, STREAM).registration_id > 0


def test_terminate_driver_needs_the_right_token(start_driver) -> None:
    driver = start_driver(terminate_token="let-me-stop")
    with driver.connect() as aeron:
        conductor = aeron.conductor
        with conductor.lock:
            conductor._send(
                protocol.TerminateDriverEncoder, client_id=aeron.client_id, correlation_id=1, token=b"wrong"
            )
        # Commands are handled in order: once this answers, the refusal is done.
        assert aeron.add_publication(CHANNEL, STREAM).session_id is not None
        with CncFile.open(driver.directory) as cnc:
            assert any("refused: invalid token" in e.text for e in read_error_log(cnc.error_log))
        assert driver.process.poll() is None
        with conductor.lock:
            conductor._send(
                protocol.TerminateDriverEncoder, client_id=aeron.client_id, correlation_id=2, token=b"let-me-stop"
            )
    wait_for(lambda: driver.process.poll() is not None, 10, "the driver to terminate")
    assert driver.process.returncode == 0
    assert not driver.directory.exists()


def dies_mid_append_main(directory: str, ready: Connection) -> None:
    from fulmar.publication import BufferClaim

    aeron = Aeron.connect(directory)
    publication = aeron.add_publication(CHANNEL, STREAM)
    wait_for(lambda: publication.is_connected, 30, "a subscriber")
    for seq in range(100):
        offer(publication, struct.pack("<q", seq), seq, time.monotonic() + 30)
    claim = BufferClaim(publication.log)
    assert publication.try_claim(200, claim) > 0
    ready.send("claimed")
    os.kill(os.getpid(), signal.SIGKILL)  # dies before committing the claim


def test_publisher_dying_between_claim_and_commit_is_unblocked(start_driver) -> None:
    driver = start_driver(
        client_liveness_timeout_ns=500_000_000,
        publication_linger_timeout_ns=100_000_000,
        publication_unblock_timeout_ns=1_000_000_000,
    )
    aeron = driver.connect()
    end, ready = SPAWN.Pipe()
    publisher = SPAWN.Process(target=dies_mid_append_main, args=(str(driver.directory), ready))
    try:
        unavailable: list[object] = []
        subscription = aeron.add_subscription(CHANNEL, STREAM, on_unavailable_image=unavailable.append)
        publisher.start()
        assert end.poll(30) and end.recv() == "claimed"
        publisher.join(10)
        received: list[int] = []
        handler = lambda b, o, n, h: received.append(h.reserved_value)

        def past_the_dead_claim() -> bool:
            subscription.poll(handler, 100)
            return bool(unavailable)

        wait_for(past_the_dead_claim, 10, "the stuck image to be unblocked and go unavailable")
        assert received == list(range(100))
        with CncFile.open(driver.directory) as cnc:
            assert any("unblocked publication" in e.text for e in read_error_log(cnc.error_log))
    finally:
        aeron.close()
        if publisher.is_alive():
            publisher.kill()
        publisher.join(10)


def test_launch_refuses_a_directory_with_foreign_files_and_stop_after_close_is_safe(driver_dir: Path) -> None:
    from fulmar.cnc import CncLayout
    from fulmar.driver.context import DriverContext
    from fulmar.driver.media_driver import DriverDirectoryError, MediaDriver

    driver_dir.mkdir(parents=True)
    precious = driver_dir / "precious.txt"
    precious.write_text("not the driver's")
    context = DriverContext(
        directory=driver_dir, cnc_layout=CncLayout.sized(64 * 1024, 64 * 1024, 64 * 1024, 64 * 1024)
    )
    with pytest.raises(DriverDirectoryError, match="precious.txt"):
        MediaDriver.launch(context)
    assert precious.read_text() == "not the driver's"
    precious.unlink()
    driver = MediaDriver.launch(context)
    driver.close()
    driver.request_stop()  # after close: must not touch the unmapped cnc.dat
    assert not driver_dir.exists()


def test_connect_reports_a_missing_or_dead_driver_clearly(start_driver, tmp_path: Path) -> None:
    with pytest.raises(DriverTimeoutError, match="does not exist"):
        Aeron.connect(tmp_path / "nothing-here")
    driver = start_driver()
    driver.kill()  # its files stay, its heartbeat stops
    with CncFile.open(driver.directory) as cnc:
        ring = ManyToOneRingBuffer(cnc.to_driver)
        wait_for(lambda: time.time_ns() // 1_000_000 - ring.consumer_heartbeat_time > 250, 5, "a stale heartbeat")
    with pytest.raises(DriverTimeoutError, match="not alive: no heartbeat"):
        Aeron.connect(driver.directory, driver_timeout_ms=200)


def test_an_ipc_publication_reaches_ipc_subscriptions_only(start_driver) -> None:
    """A UDP subscription or a spy on the same stream id is not an IPC subscriber
    (an archive listens for control requests on IPC and UDP with one stream id:
    each request must arrive once)."""
    driver = start_driver()
    with driver.connect() as aeron:
        udp = aeron.add_subscription("aeron:udp?endpoint=127.0.0.1:0", 1234)
        spy = aeron.add_subscription("aeron-spy:aeron:udp?endpoint=127.0.0.1:40123", 1234)
        ipc_before = aeron.add_subscription("aeron:ipc", 1234)
        publication = aeron.add_publication("aeron:ipc?term-length=64k", 1234)
        ipc_after = aeron.add_subscription("aeron:ipc", 1234)
        wait_for(lambda: ipc_before.is_connected and ipc_after.is_connected, 10, "the IPC subscriptions to connect")
        wait_for(lambda: publication.offer(b"once") > 0, 10, "the offer")
        received: list[bytes] = []

        def collect(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            received.append(bytes(buffer[offset : offset + length]))

        wait_for(
            lambda: (ipc_before.poll(collect, 10), ipc_after.poll(collect, 10), len(received) == 2)[2],
            10,
            "both IPC subscriptions to receive",
        )
        assert udp.image_count == 0 and spy.image_count == 0
        assert udp.poll(collect, 10) == 0 and spy.poll(collect, 10) == 0
        assert received == [b"once", b"once"]


def test_a_session_id_clashes_only_on_the_same_send_endpoint(start_driver) -> None:
    """As in Aeron: an archive replays under a live stream's session id to
    another endpoint (replay merge)."""
    driver = start_driver()
    with driver.connect() as aeron:
        live = aeron.add_exclusive_publication("aeron:udp?endpoint=127.0.0.1:40201|session-id=77", 5)
        replay = aeron.add_exclusive_publication("aeron:udp?endpoint=127.0.0.1:40202|session-id=77", 5)
        assert live.session_id == replay.session_id == 77
        with pytest.raises(RegistrationError, match="session-id 77 is already in use"):
            aeron.add_exclusive_publication("aeron:udp?endpoint=127.0.0.1:40201|session-id=77", 5)
        ipc = aeron.add_exclusive_publication("aeron:ipc?session-id=77|term-length=64k", 5)
        assert ipc.session_id == 77
        with pytest.raises(RegistrationError, match="session-id 77 is already in use"):
            aeron.add_exclusive_publication("aeron:ipc?session-id=77|term-length=64k", 5)


def test_a_closed_udp_publication_keeps_its_session_id_until_its_channels_linger_ends(start_driver) -> None:
    """As in Aeron: a closed UDP publication holds its session id on its send
    endpoint while it drains and lingers (the receivers' status messages for
    that session still go to it), for the channel's ``linger`` if it names
    one, else the driver's.  (A leader's next catchup replay to a follower
    reuses the log's session id on the same endpoint.)"""
    driver = start_driver(publication_linger_timeout_ns=60_000_000_000)
    with driver.connect() as aeron:
        lingering = aeron.add_exclusive_publication("aeron:udp?endpoint=127.0.0.1:40203|session-id=78", 5)
        lingering.close()
        # No receiver ever heard it: nothing to drain; it lingers for the driver's minute,
        # and its session id stays taken all along.
        held_until = time.monotonic() + 0.5
        while time.monotonic() < held_until:
            with pytest.raises(RegistrationError, match="session-id 78 is already in use"):
                aeron.add_exclusive_publication("aeron:udp?endpoint=127.0.0.1:40203|session-id=78", 5)
        channel = "aeron:udp?endpoint=127.0.0.1:40204|session-id=79|linger=0"
        aeron.add_exclusive_publication(channel, 5).close()

        def added_again() -> bool:
            try:
                aeron.add_exclusive_publication(channel, 5).close()
            except RegistrationError as error:
                assert "session-id 79 is already in use" in str(error)
                return False
            return True

        wait_for(added_again, 10, "the publication without linger to be freed and its session id taken again")


def test_a_udp_publication_that_starts_mid_stream_shows_its_sender_position_there(start_driver) -> None:
    """The sender position counter of a publication with a start position (an
    archive replay) reads that position before anything is sent, not 0."""
    driver = start_driver()
    with driver.connect() as aeron:
        channel = "aeron:udp?endpoint=127.0.0.1:40205|term-length=64k|init-term-id=7|term-id=10|term-offset=33504"
        publication = aeron.add_exclusive_publication(channel, 5)
        assert publication.position == 3 * 65536 + 33504
        reader = aeron.counters_reader
        label = f"snd-pos: {publication.registration_id} "
        found = [c for c in reader if c.label.startswith(label)]
        assert len(found) == 1, [c.label for c in reader]
        assert reader.counter_value(found[0].counter_id) == 3 * 65536 + 33504


def test_a_late_subscriber_joins_where_the_slowest_subscriber_is(start_driver) -> None:
    """Aeron's IPC join position is the consumer position: a second subscriber
    of a stream the first has not read yet sees everything the first will
    (an archive replay has two subscribers that come one after the other), and
    it may still join after the publication closed, until it is drained."""
    driver = start_driver()
    with driver.connect() as aeron:
        first = aeron.add_subscription("aeron:ipc", 4321)
        publication = aeron.add_exclusive_publication("aeron:ipc?term-length=64k", 4321)
        wait_for(lambda: publication.is_connected, 10, "the publication to connect")
        for seq in range(5):
            # (back pressure until the driver has set the new publication's limit)
            wait_for(lambda: publication.offer(bytes([seq]) * 10) > 0, 10, f"offer {seq}")
        second = aeron.add_subscription("aeron:ipc", 4321)  # nobody has read anything yet
        wait_for(lambda: second.image_count == 1, 10, "the second subscriber's image")
        publication.close()  # closed: subscribers drain it to the end of stream
        third = aeron.add_subscription("aeron:ipc", 4321)
        wait_for(lambda: third.image_count == 1, 10, "the third subscriber's image (publication draining)")
        for subscription in (first, second, third):
            received: list[bytes] = []

            def collect(buffer: memoryview, offset: int, length: int, header: Header) -> None:
                received.append(bytes(buffer[offset : offset + length]))

            wait_for(lambda: (subscription.poll(collect, 10), len(received) == 5)[1], 10, "five messages")
            assert received == [bytes([seq]) * 10 for seq in range(5)]
        late = aeron.add_subscription("aeron:ipc", 4321)  # everyone has read to the end: drained
        # A round trip through the driver after it: an image would have been announced first.
        aeron.add_counter(1001, "round trip").close()
        assert late.image_count == 0


def test_closing_after_the_driver_died_is_prompt_and_quiet(start_driver) -> None:
    """Closing is cleanup: with the driver's process gone there is nothing to
    release there, so close neither waits out the driver timeout nor raises."""
    driver = start_driver()
    aeron = driver.connect(error_handler=lambda error: None)
    try:
        publication = aeron.add_publication("aeron:ipc?term-length=64k", 77)
        subscription = aeron.add_subscription("aeron:ipc", 77)
        driver.kill()
        started = time.monotonic()
        publication.close()
        subscription.close()
        assert time.monotonic() - started < 3  # not the 10 s driver timeout
        assert publication.is_closed and subscription.is_closed
        with pytest.raises(DriverTimeoutError):
            aeron.add_publication("aeron:ipc", 78)  # the client is failed now, and says why
    finally:
        aeron.close()
