"""The archive's recorder thread (archive/recorder.py, archive/native/recorder.h):
data to record rings the thread's own doorbell (the subscription's
doorbell-id) and the thread writes it, without the archive's agent; the
agent opens each segment, and takes over errors and the end of the image.

The sessions here run against a real media driver, in this process, with an
agent loop the test drives (``do_work``), so what the thread does alone is
what happens between two calls."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fulmar.aeron import Aeron, RegistrationError
from fulmar.archive.recorder import NativeRecorder, RecordingSession
from fulmar.archive.segment import SegmentWriter, segment_file_name
from fulmar.counters import counter_offset
from fulmar.publication import ExclusivePublication
from fulmar.reader_doorbells import THREAD_DOORBELL_TYPE_ID, client_doorbell
from fulmar.subscription import Image, Subscription
from support.doorbells import doorbell_of, free_udp_port, offer, wait_for_table
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TERM_LENGTH = 64 * 1024
SEGMENT_LENGTH = 64 * 1024  # one term per segment: the agent's turn comes often
CHANNEL = f"aeron:ipc?term-length={TERM_LENGTH}"
REC_POS_TYPE_ID = 100  # the archive's RecordingPos type; any type would do here


def with_doorbell(channel: str, doorbell_id: int) -> str:
    return f"{channel}{'|' if '?' in channel else '?'}doorbell-id={doorbell_id}"


# ------------------------------------------------------------------ the driver


def test_data_rings_the_thread_doorbell_a_subscription_names_not_its_clients(start_driver) -> None:
    driver = start_driver()
    udp = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with Aeron.connect(driver.directory) as reader, Aeron.connect(driver.directory) as writer:
        thread_bell = reader.add_counter(THREAD_DOORBELL_TYPE_ID, "a reader thread's doorbell")
        for channel, stream_id in (("aeron:ipc", 51), (udp, 52)):
            # The client rings its own doorbell once more when it has added an
            # image (fulmar.aeron: _on_available_image), on its conductor
            # thread, after the image is visible and before the image handler
            # is called: the test takes its tokens after the handler, or that
            # ring (not the data's) lands between them.
            available = threading.Event()
            subscription = reader.add_subscription(
                with_doorbell(channel, thread_bell.id), stream_id, on_available_image=lambda image: available.set()
            )
            publication = writer.add_publication(channel, stream_id)
            wait_for(lambda: available.is_set() and publication.is_connected, 10, f"the image of {channel} announced")
            wait_for_table(subscription.images[0].log, [thread_bell.id])
            ours = client_doorbell(reader.conductor.cnc.counters_values, thread_bell.id)
            clients = reader.conductor.data_doorbell
            our_token, client_token = ours.prepare(), clients.prepare()
            try:
                offer(publication, b"ping")
                wait_for(lambda: ours.sequence != our_token, 10, f"the thread's doorbell to ring for {channel}")
                assert clients.sequence == client_token, f"{channel}: the client's doorbell rang too"
            finally:
                ours.cancel()
                clients.cancel()
            publication.close()


def test_when_the_thread_doorbell_goes_the_clients_own_is_rung_again(start_driver) -> None:
    driver = start_driver()
    with Aeron.connect(driver.directory) as reader, Aeron.connect(driver.directory) as writer:
        thread_bell = reader.add_counter(THREAD_DOORBELL_TYPE_ID, "a reader thread's doorbell")
        subscription = reader.add_subscription(with_doorbell("aeron:ipc", thread_bell.id), 53)
        writer.add_publication("aeron:ipc", 53)
        wait_for(lambda: subscription.images, 10, "the IPC image")
        log = subscription.images[0].log
        wait_for_table(log, [thread_bell.id])
        thread_bell.close()
        wait_for_table(log, [doorbell_of(reader)])


def test_a_doorbell_id_that_is_no_thread_doorbell_of_the_client_is_refused(start_driver) -> None:
    driver = start_driver()
    with Aeron.connect(driver.directory) as reader, Aeron.connect(driver.directory) as other:
        others_bell = other.add_counter(THREAD_DOORBELL_TYPE_ID, "another client's thread doorbell")
        plain = reader.add_counter(REC_POS_TYPE_ID, "a counter that is no doorbell")
        own_bell = reader.conductor.doorbell_id
        assert own_bell is not None
        for counter_id in (others_bell.id, plain.id, own_bell):
            with pytest.raises(RegistrationError, match=f"doorbell-id={counter_id} is not a thread doorbell"):
                reader.add_subscription(with_doorbell("aeron:ipc", counter_id), 54)
        with pytest.raises(RegistrationError, match="doorbell-id"):
            reader.add_subscription("aeron:ipc?doorbell-id=-3", 54)


# ------------------------------------------------------------------ the thread


class Catalog:
    """The writer's sink for the recorded position (the catalog's hint)."""

    def __init__(self) -> None:
        self.recorded: dict[int, int] = {}

    def update_recorded_position(self, recording_id: int, position: int) -> None:
        self.recorded[recording_id] = position


class Rig:
    """A publisher, an archive-like client with the recorder thread, and the
    recording sessions the test makes; all closed at the end."""

    def __init__(self, directory: Path, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.writer_client = Aeron.connect(directory)
        self.archive = Aeron.connect(directory)
        agent_doorbell_id = self.archive.conductor.doorbell_id
        assert agent_doorbell_id is not None
        self.recorder = NativeRecorder(self.archive, agent_doorbell_id, 1_000_000_000)
        self.agent_doorbell = self.archive.conductor.data_doorbell
        self.publication: ExclusivePublication = self.writer_client.add_exclusive_publication(CHANNEL, 61)
        self.sessions: list[RecordingSession] = []
        self.catalog = Catalog()

    def record(self, name: str, native: bool, checksum: bool = False) -> RecordingSession:
        """A session recording the publication into ``tmp_path/name``."""
        channel = self.recorder.doorbell_channel(CHANNEL) if native else CHANNEL
        subscription: Subscription = self.archive.add_subscription(channel, 61)
        image: Image = wait_for(lambda: subscription.images and subscription.images[0], 10, "the image")
        directory = self.tmp_path / name
        directory.mkdir()
        writer = SegmentWriter(
            directory,
            len(self.sessions) + 1,
            image.join_position,
            TERM_LENGTH,
            SEGMENT_LENGTH,
            checksum=checksum,
            catalog=self.catalog,
        )
        counter = self.archive.add_counter(REC_POS_TYPE_ID, f"rec-pos: {name}")
        session = RecordingSession(
            len(self.sessions) + 1,
            0,
            None,
            image,
            writer,
            counter,
            TERM_LENGTH,
            native=self.recorder if native else None,
        )
        assert session.is_native == native
        self.sessions.append(session)
        return session

    def offer_and_expect_the_agent_rung(self, payload: bytes, what: str) -> None:
        """Offer ``payload`` with the agent registered as a sleeper; the thread must ring it."""
        token = self.agent_doorbell.prepare()
        try:
            offer(self.publication, payload)
            wait_for(lambda: self.agent_doorbell.sequence != token, 10, what)
        finally:
            self.agent_doorbell.cancel()

    def drive(self, *sessions: RecordingSession, until: int) -> None:
        """Run the agent's passes until every session recorded to ``until``."""

        def done() -> bool:
            for session in sessions:
                session.do_work(0)
                assert session.error is None, session.error
            return all(session.recorded_position >= until for session in sessions)

        wait_for(done, 20, f"the recordings to reach {until}")

    def close(self) -> None:
        for session in self.sessions:
            session.abort()
            session.close()
        self.recorder.close()
        self.archive.close()
        self.writer_client.close()


@pytest.fixture
def rig(start_driver, tmp_path: Path) -> Iterator[Rig]:
    driver = start_driver()
    rig = Rig(driver.directory, tmp_path)
    try:
        yield rig
    finally:
        rig.close()


def test_the_thread_records_what_arrives_without_waking_the_agent(rig: Rig) -> None:
    session = rig.record("native", native=True)
    # The first block opens the segment: the thread hands it to the agent and rings it.
    rig.offer_and_expect_the_agent_rung(b"first", "the thread to ring the agent")
    assert session.has_work()
    rig.drive(session, until=rig.publication.position)
    assert session.writer.position == rig.publication.position

    # From here the segment is open: the thread writes alone.
    token = rig.agent_doorbell.prepare()
    try:
        for number in range(50):
            offer(rig.publication, f"message {number}".encode() * 4)
        target = rig.publication.position
        wait_for(lambda: session.position_counter.get() == target, 10, "rec-pos to reach the publication")
        values = rig.archive.conductor.cnc.counters_values
        assert values.get_int64_volatile(counter_offset(session.image.subscriber_position_id)) == target
        assert rig.agent_doorbell.sequence == token, "the data woke the agent"
        assert not session.has_work()
    finally:
        rig.agent_doorbell.cancel()
    assert session.recorded_position == target
    assert session.native_blocks >= 1
    assert session.writer.position < target  # the agent has not looked yet
    assert session.do_work(0) == 1
    assert not session.wrote  # the thread wrote (and rang the watchers), not the agent
    assert session.writer.position == target
    assert session.image.position == target
    assert rig.catalog.recorded[session.recording_id] == target


def segment_bytes(directory: Path, recording_id: int, start: int, end: int) -> bytes:
    data = bytearray()
    base = start
    while base < end:
        data += (directory / segment_file_name(recording_id, base)).read_bytes()[: min(SEGMENT_LENGTH, end - base)]
        base += SEGMENT_LENGTH
    return bytes(data)


@pytest.mark.parametrize("checksum", [False, True], ids=["plain", "checksum"])
def test_segments_the_thread_writes_are_the_bytes_the_agent_writes(rig: Rig, checksum: bool) -> None:
    """Across several segments (each opened by the agent), with padding at
    the end of each term: the native recording's files are byte for byte the
    Python recorder's, checksums included."""
    native = rig.record("native", native=True, checksum=checksum)
    python = rig.record("python", native=False, checksum=checksum)
    start = native.image.join_position
    rng = random.Random(7)
    while rig.publication.position < start + 3 * SEGMENT_LENGTH + SEGMENT_LENGTH // 3:
        payload = rng.randbytes(rng.randrange(1, 3000))
        # The publication waits for the slower recorder (a window of half a term).
        wait_for(
            lambda: rig.publication.offer(payload) >= 0 or native.do_work(0) + python.do_work(0) < 0,
            10,
            "the offer to be taken",
            poll_s=0,
        )
    end = rig.publication.position
    rig.drive(native, python, until=end)
    assert native.is_native and native.error is None and python.error is None
    assert native.native_blocks > 10, "the thread wrote too little of it to compare"
    ours = segment_bytes(rig.tmp_path / "native", native.recording_id, start, end)
    theirs = segment_bytes(rig.tmp_path / "python", python.recording_id, start, end)
    assert len(ours) == end - start
    assert ours == theirs


def test_a_failed_write_stops_the_recording_with_the_reason(rig: Rig) -> None:
    session = rig.record("native", native=True)
    offer(rig.publication, b"first")
    rig.drive(session, until=rig.publication.position)
    stopped_at = rig.publication.position
    # The segment's descriptor now names a device that is always full.
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        assert session.writer._fd is not None
        os.dup2(full, session.writer._fd)
    finally:
        os.close(full)
    rig.offer_and_expect_the_agent_rung(b"lost to a full disk", "the thread to hand the failure to the agent")
    wait_for(lambda: session.do_work(0) and session.is_done, 10, "the session to stop")
    assert session.error is not None
    assert f"stopped at {stopped_at}" in session.error
    assert "while writing" in session.error and str(session.writer.segment_path or "") in session.error
    assert session.position_counter.get() == stopped_at


def test_the_end_of_the_stream_ends_the_recording_with_everything_recorded(rig: Rig) -> None:
    session = rig.record("native", native=True)
    for number in range(20):
        offer(rig.publication, b"x" * (100 + number))
    end = rig.publication.position
    rig.drive(session, until=end)
    rig.publication.close()
    wait_for(lambda: session.do_work(0) and session.is_done, 10, "the recording to see the end of its stream")
    assert session.error is None
    assert not session.is_native  # its slot went back
    assert session.recorded_position == end
