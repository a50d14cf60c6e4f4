"""System tests of the archive: a real media driver, a real ``cluster-node
archive`` process and this process as the client, all on 127.0.0.1.

Every message carries its sequence number, its body length and the CRC32 of
its body, and message ``seq``'s bytes are a pure function of ``seq``: a
receiver checks each message on its own (intact, in order, none missing)
and the stream as a whole (count and a running SHA-256) without keeping
the messages.  Every wait is bounded; every process is reaped and every
directory removed, whatever happens.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.archive import protocol as archive_protocol
from fulmar.archive.client import (
    NULL_LENGTH,
    NULL_POSITION,
    NULL_VALUE,
    AeronArchive,
    ArchiveProxy,
    ArchiveResponseError,
    RecordingSignal,
    RecordingSignalEvent,
    SourceLocation,
)
from fulmar.archive.mark_file import SEMANTIC_VERSION, read_mark_file
from fulmar.archive.protocol import ArchiveErrorCode
from fulmar.archive.segment import list_segment_files
from fulmar.channel_uri import ChannelUri
from fulmar.cli import archive_tool
from fulmar.cnc import CncFile
from fulmar.counters import CountersReader
from fulmar.driver.counters import PUBLISHER_POSITION_TYPE_ID, SystemCounter
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.frames import FRAME_ALIGNMENT
from fulmar.log_reader import Header
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from fulmar.logbuffer import compute_term_id_from_position, position_bits_to_shift, to_int32
from fulmar.publication import ExclusivePublication
from fulmar.subscription import Subscription
from support.archive import ArchiveProcess
from support.driver import (
    DriverProcess,
    free_udp_port,
    main_thread_wakes_per_second,
    new_driver_dir,
    remove_driver_dir,
    wait_for,
)

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

MB = 1024 * 1024
STREAM_ID = 1001
TERM_LENGTH = 4 * MB
SEGMENT_LENGTH = 8 * MB
IPC_CHANNEL = f"aeron:ipc?term-length={TERM_LENGTH}"
REPLAY_CHANNEL = "aeron:ipc"
MTU_PAYLOAD = 1408 - 32  # a message longer than this is fragmented

# --------------------------------------------------------------------------- messages

HEADER = struct.Struct("<qII")  # sequence number, body length, crc32(body)
_POOL = bytes((i * 131 + (i >> 7) * 17 + (i >> 13)) & 0xFF for i in range(96 * 1024))
_POOL_SPAN = 64 * 1024
BIG_EVERY = 50


def body_length(seq: int) -> int:
    """Mixed sizes: mostly up to ~1.8 KB (a quarter of them longer than the
    MTU payload), and every 50th message 4-12 KB (several fragments)."""
    r = (seq * 2654435761 + 12345) & 0xFFFF_FFFF
    if seq % BIG_EVERY == BIG_EVERY - 1:
        return 4000 + r % 8000
    return r % 1800


def message(seq: int) -> bytes:
    length = body_length(seq)
    start = (seq * 7919) % _POOL_SPAN
    body = _POOL[start : start + length]
    return HEADER.pack(seq, length, zlib.crc32(body)) + body


def digest_of(first_seq: int, end_seq: int) -> str:
    """SHA-256 over the messages [first_seq, end_seq), as a receiver computes it."""
    digest = hashlib.sha256()
    for seq in range(first_seq, end_seq):
        digest.update(message(seq))
    return digest.hexdigest()


class Publisher:
    """Offers messages first_seq, first_seq + 1, ... in batches.

    ``starts[seq]``, for the first message of every batch, is the
    publication's position after the previous batch: the frame boundary where
    message ``seq`` begins (or the padding before it, at the end of a term),
    a position a replay may start or stop at.
    """

    BATCH = 48

    def __init__(self, publication: ExclusivePublication, first_seq: int = 0) -> None:
        self.publication = publication
        self.first_seq = first_seq
        self.next_seq = first_seq
        self.digest = hashlib.sha256()
        self.starts: dict[int, int] = {first_seq: publication.position}
        self._pending: list[bytes] = []
        self.position = publication.position

    @property
    def count(self) -> int:
        return self.next_seq - self.first_seq

    def step(self) -> int:
        """Offer one batch; returns how many messages were appended (0: back pressure)."""
        if not self._pending:
            base = self.next_seq
            self._pending = [message(seq) for seq in range(base, base + self.BATCH)]
        appended, result = self.publication.offer_batch(self._pending)
        if appended == 0:
            if result in (NOT_CONNECTED, BACK_PRESSURED, ADMIN_ACTION):  # try again
                return 0
            raise AssertionError(f"offer_batch failed with {result} at seq {self.next_seq}")
        for payload in self._pending[:appended]:
            self.digest.update(payload)
        del self._pending[:appended]
        self.next_seq += appended
        self.position = result
        self.starts[self.next_seq] = result
        return appended

    def publish(self, total_bytes: int, timeout_s: float, on_idle: Callable[[], object] | None = None) -> None:
        """Offer until the stream has grown by ``total_bytes``; ``on_idle`` runs while back pressured."""
        target = self.position + total_bytes
        stall_deadline = time.monotonic() + timeout_s
        while self.position < target:
            if self.step():
                stall_deadline = time.monotonic() + timeout_s
                continue
            if on_idle is not None:
                on_idle()
            if time.monotonic() > stall_deadline:
                raise AssertionError(
                    f"the publication made no progress for {timeout_s} s at position {self.position} "
                    f"(seq {self.next_seq})"
                )
            time.sleep(0.0002)


class PublisherThread(threading.Thread):
    """Runs a Publisher without pause until ``finish``."""

    def __init__(self, publisher: Publisher) -> None:
        super().__init__(name="publisher", daemon=True)
        self.publisher = publisher
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                if not self.publisher.step():
                    time.sleep(0.0002)
        except BaseException as error:  # noqa: BLE001 - reported by finish()
            self.error = error

    def finish(self) -> None:
        self.stopping.set()
        self.join(10)
        assert not self.is_alive(), "the publisher thread did not stop"
        if self.error is not None:
            raise self.error


class Receiver:
    """Checks whole messages as they come: each intact, in sequence from
    ``first_seq``; optionally that a message ends where the publisher's next
    batch started (``starts``)."""

    def __init__(self, first_seq: int = 0, starts: dict[int, int] | None = None) -> None:
        self.first_seq = first_seq
        self.next_seq = first_seq
        self.digest = hashlib.sha256()
        self.starts = starts or {}
        self.last_position = NULL_POSITION
        self.checked_positions = 0
        self.assembler = FragmentAssembler(self.on_message)

    @property
    def count(self) -> int:
        return self.next_seq - self.first_seq

    def on_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        if length < HEADER.size:
            raise AssertionError(f"a message of {length} bytes after seq {self.next_seq - 1}")
        seq, body, crc = HEADER.unpack_from(buffer, offset)
        if seq != self.next_seq:
            raise AssertionError(f"expected message {self.next_seq}, got {seq} (ending at {header.position})")
        if body != length - HEADER.size or zlib.crc32(buffer[offset + HEADER.size : offset + length]) != crc:
            raise AssertionError(f"message {seq} ending at {header.position} is corrupt")
        self.digest.update(buffer[offset : offset + length])
        self.next_seq = seq + 1
        position = header.position
        self.last_position = position
        expected = self.starts.get(seq + 1)
        if expected is not None:
            # The next message starts right after this one, or at the next
            # term if it did not fit in what was left of this one (padding).
            padded = expected % TERM_LENGTH == 0 and expected - TERM_LENGTH < position < expected
            if expected != position and not padded:
                raise AssertionError(f"message {seq} ends at {position}, the publisher's next one starts at {expected}")
            self.checked_positions += 1


class ReplayDrain:
    """Polls a replay subscription; ``done`` once its image reached end of stream (or went away)."""

    def __init__(self, subscription: Subscription, receiver: Receiver) -> None:
        self.subscription = subscription
        self.receiver = receiver
        self.saw_image = False
        self.end_position = NULL_POSITION

    def poll(self) -> int:
        return self.subscription.poll(self.receiver.assembler.on_fragment, 512)

    @property
    def done(self) -> bool:
        images = self.subscription.images
        if images:
            self.saw_image = True
            image = images[0]
            self.end_position = image.position
            return image.is_end_of_stream
        return self.saw_image

    def run(self, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            work = self.poll()
            if not work and self.done:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s} s waiting for {what}: {self.receiver.count} messages, "
                    f"next seq {self.receiver.next_seq}, last position {self.receiver.last_position}, "
                    f"images {[(i.position, i.is_end_of_stream) for i in self.subscription.images]}"
                )
            if not work:
                time.sleep(0.0002)


# --------------------------------------------------------------------------- processes


class _TrackedDriver(DriverProcess):
    """Registered before it starts: reaped even if it never becomes ready."""

    def __init__(self, registry: list[Any], directory: Path, **options: Any) -> None:
        registry.append(self)
        super().__init__(directory, **options)


class _TrackedArchive(ArchiveProcess):
    def __init__(self, registry: list[Any], archive_dir: Path, driver_dir: Path, *extra: str) -> None:
        registry.append(self)
        super().__init__(archive_dir, driver_dir, *extra)


class System:
    """One media driver, archive processes on it, and clients in this process;
    ``close`` takes everything down in order, whatever state it is in."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.driver_dir = new_driver_dir()
        self.drivers: list[DriverProcess] = []
        self.archives: list[ArchiveProcess] = []
        self.archive_dirs: list[Path] = []
        self.aerons: list[Aeron] = []
        self.clients: list[AeronArchive] = []
        self.publications: list[Any] = []

    @property
    def driver(self) -> DriverProcess:
        assert self.drivers, "no driver started"
        return self.drivers[-1]

    def start_driver(self, **options: Any) -> DriverProcess:
        return _TrackedDriver(self.drivers, self.driver_dir, **options)

    def archive_dir(self, name: str = "archive") -> Path:
        directory = self.tmp_path / name
        if directory not in self.archive_dirs:
            self.archive_dirs.append(directory)
        return directory

    def start_archive(self, name: str = "archive", *extra: str) -> ArchiveProcess:
        args = ("--segment-length", f"{SEGMENT_LENGTH // MB}m", *extra)
        return _TrackedArchive(self.archives, self.archive_dir(name), self.driver_dir, *args)

    def connect(self) -> tuple[Aeron, AeronArchive]:
        aeron = self.driver.connect()
        self.aerons.append(aeron)
        client = AeronArchive.connect(aeron)
        self.clients.append(client)
        return aeron, client

    def publication(self, aeron: Aeron, channel: str, stream_id: int = STREAM_ID) -> ExclusivePublication:
        publication = aeron.add_exclusive_publication(channel, stream_id)
        self.publications.append(publication)
        return publication

    def close(self) -> None:
        # Clients first (their archive or driver may be gone: errors here do not matter).
        for closeable in [*self.clients, *self.publications, *self.aerons]:
            try:
                closeable.close()
            except Exception:  # noqa: BLE001
                pass
        problems = []
        processes: list[ArchiveProcess | DriverProcess] = [*self.archives, *self.drivers]
        for process in processes:
            if not hasattr(process, "process"):
                continue  # Popen itself failed: nothing to reap
            try:
                process.stop()
            except Exception as error:  # noqa: BLE001
                problems.append(f"stopping pid {process.process.pid}: {error!r}")
                try:
                    process.process.kill()
                    process.process.wait(10)
                except Exception as again:  # noqa: BLE001
                    problems.append(f"killing pid {process.process.pid}: {again!r}")
        remove_driver_dir(self.driver_dir)
        for directory in self.archive_dirs:
            shutil.rmtree(directory, ignore_errors=True)
        problems += [
            f"pid {p.process.pid} was not reaped"
            for p in processes
            if hasattr(p, "process") and p.process.returncode is None
        ]
        assert not problems, problems


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    running = System(tmp_path)
    try:
        yield running
    finally:
        running.close()


# --------------------------------------------------------------------------- archive steps


def signal_of(
    client: AeronArchive, kind: RecordingSignal, recording_id: int | None = None, timeout_s: float = 10
) -> RecordingSignalEvent:
    return client.wait_for_signal(
        lambda event: event.signal == kind and (recording_id is None or event.recording_id == recording_id),
        int(timeout_s * 1e9),
    )


def poll_value(query: Callable[[], int], accept: Callable[[int], bool], timeout_s: float, what: str) -> int:
    """Ask ``query()`` until ``accept`` takes its answer; returns that answer."""
    answers: list[int] = []

    def accepted() -> bool:
        answers.append(query())
        return accept(answers[-1])

    wait_for(accepted, timeout_s, what, poll_s=0.005)
    return answers[-1]


# The functional tests below follow recordings through the archive's state
# (catalog, positions) rather than recording signals: signals are checked on
# their own in test_recording_signals_reach_a_busy_client.


def start_recorded_publication(
    system: System,
    aeron: Aeron,
    client: AeronArchive,
    channel: str,
    source: SourceLocation = SourceLocation.LOCAL,
) -> tuple[ExclusivePublication, int]:
    """Start recording ``channel``, add its publication; returns it and the
    recording id, once the recording is active."""
    client.start_recording(channel, STREAM_ID, source)
    publication = system.publication(aeron, channel)
    wait_for(lambda: publication.is_connected, 10, "the recording to connect to the publication")
    recording_id = poll_value(
        lambda: client.find_last_matching_recording(0, "", STREAM_ID, publication.session_id),
        lambda found: found != NULL_VALUE,
        10,
        f"a recording of session {publication.session_id}",
    )
    poll_value(
        lambda: client.get_recording_position(recording_id),
        lambda position: position != NULL_POSITION,
        10,
        f"recording {recording_id} to be active",
    )
    return publication, recording_id


def wait_recorded(client: AeronArchive, recording_id: int, position: int, timeout_s: float = 60) -> None:
    poll_value(
        lambda: client.get_recording_position(recording_id),
        lambda recorded: recorded >= position,
        timeout_s,
        f"recording {recording_id} to reach {position}",
    )


def wait_stopped(client: AeronArchive, recording_id: int, timeout_s: float = 30) -> int:
    return poll_value(
        lambda: client.get_stop_position(recording_id),
        lambda stop: stop != NULL_POSITION,
        timeout_s,
        f"recording {recording_id} to stop",
    )


def stop_recording(client: AeronArchive, channel: str, recording_id: int, expected_stop: int) -> None:
    client.stop_recording(channel, STREAM_ID)
    assert wait_stopped(client, recording_id) == expected_stop


def replay_and_check(
    client: AeronArchive,
    recording_id: int,
    stream_id: int,
    first_seq: int,
    end_seq: int,
    end_position: int,
    position: int = NULL_POSITION,
    length: int = NULL_LENGTH,
    starts: dict[int, int] | None = None,
    channel: str = REPLAY_CHANNEL,
    timeout_s: float = 60,
) -> Receiver:
    """Replay and check that exactly messages [first_seq, end_seq) come, ending at ``end_position``."""
    subscription = client.replay(recording_id, channel, stream_id, position, length)
    try:
        receiver = Receiver(first_seq, starts)
        drain = ReplayDrain(subscription, receiver)
        drain.run(timeout_s, f"the replay of recording {recording_id} to end")
    finally:
        subscription.close()
    assert drain.end_position == end_position
    assert receiver.next_seq == end_seq, f"replay delivered up to seq {receiver.next_seq - 1}, expected {end_seq - 1}"
    assert receiver.last_position == end_position
    assert receiver.digest.hexdigest() == digest_of(first_seq, end_seq)
    return receiver


def continuation_channel(descriptor: Any, base_channel: str) -> str:
    """A publication channel that starts exactly at the recording's stop
    position, with its initial term id, term length and MTU."""
    term_length = descriptor.term_buffer_length
    stop = descriptor.stop_position
    term_id = compute_term_id_from_position(stop, position_bits_to_shift(term_length), descriptor.initial_term_id)
    uri = ChannelUri.parse(base_channel).with_param("term-length", term_length).with_param("mtu", descriptor.mtu_length)
    return str(uri.with_initial_position(descriptor.initial_term_id, term_id, stop & (term_length - 1)))


def extend_and_publish(
    system: System,
    aeron: Aeron,
    client: AeronArchive,
    recording_id: int,
    first_seq: int,
    total_bytes: int,
) -> Publisher:
    """Extend a stopped recording with a new publication from its stop
    position, publish ``total_bytes`` of messages from ``first_seq``, close
    it and wait until the recording stopped at the publication's end."""
    descriptor = client.list_recording(recording_id)
    assert descriptor is not None and descriptor.stop_position != NULL_POSITION
    channel = continuation_channel(descriptor, "aeron:ipc")
    client.extend_recording(recording_id, channel, STREAM_ID)
    publication = system.publication(aeron, channel)
    assert publication.position == descriptor.stop_position
    extended_at = poll_value(
        lambda: client.get_recording_position(recording_id),
        lambda position: position != NULL_POSITION,
        10,
        f"recording {recording_id} to extend",
    )
    assert extended_at == descriptor.stop_position
    assert client.get_stop_position(recording_id) == NULL_POSITION
    publisher = Publisher(publication, first_seq)
    publisher.publish(total_bytes, 30)
    wait_recorded(client, recording_id, publisher.position)
    stop_recording(client, channel, recording_id, publisher.position)
    publication.close()
    return publisher


def boundary_in_segment(starts: dict[int, int], low: int, segment_length: int) -> tuple[int, int]:
    """The first (seq, position) of the publisher's message starts at or
    after ``low`` that lies in the middle half of a segment."""
    for seq in sorted(starts):
        position = starts[seq]
        if position >= low and segment_length // 4 <= position % segment_length <= 3 * segment_length // 4:
            return seq, position
    raise AssertionError(f"no message start in the middle of a segment after {low}")


def first_start_after(starts: dict[int, int], low: int) -> tuple[int, int]:
    for seq in sorted(starts):
        if starts[seq] >= low:
            return seq, starts[seq]
    raise AssertionError(f"no message start after {low}")


# --------------------------------------------------------------------------- tests


def record_and_replay_100mb(system: System, channel: str, source: SourceLocation, total: int) -> None:
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, channel, source)
    publisher = Publisher(publication)
    began = time.monotonic()
    publisher.publish(total, 60)
    wait_recorded(client, recording_id, publisher.position, 120)
    recorded_s = time.monotonic() - began
    stop_recording(client, channel, recording_id, publisher.position)
    descriptor = client.list_recording(recording_id)
    assert descriptor is not None
    assert (descriptor.start_position, descriptor.stop_position) == (0, publisher.position)
    segments = list_segment_files(system.archive_dir(), recording_id)
    assert len(segments) == -(-publisher.position // SEGMENT_LENGTH), segments

    # Everything, from the start: byte for byte, and each message where the publisher put it.
    began = time.monotonic()
    receiver = replay_and_check(
        client, recording_id, 2002, 0, publisher.next_seq, publisher.position, starts=publisher.starts, timeout_s=120
    )
    replayed_s = time.monotonic() - began
    assert receiver.digest.hexdigest() == publisher.digest.hexdigest()
    assert receiver.checked_positions >= len(publisher.starts) - 2

    # A range: from a message start in the middle of a segment, across the next segment boundary.
    first_seq, start = boundary_in_segment(publisher.starts, publisher.position // 3, SEGMENT_LENGTH)
    next_segment = (start // SEGMENT_LENGTH + 1) * SEGMENT_LENGTH
    end_seq, end = first_start_after(publisher.starts, next_segment + MB)
    assert end < publisher.position
    replay_and_check(client, recording_id, 2003, first_seq, end_seq, end, position=start, length=end - start)
    print(
        f"\n{channel}: {publisher.count} messages, {publisher.position / MB:.1f} MB recorded in {recorded_s:.1f} s, "
        f"replayed in {replayed_s:.1f} s"
    )


def test_100mb_ipc_recording_replays_identically_whole_and_from_mid_segment(system: System) -> None:
    system.start_driver()
    record_and_replay_100mb(system, IPC_CHANNEL, SourceLocation.LOCAL, 100 * MB)


def test_100mb_udp_recording_replays_identically(system: System) -> None:
    system.start_driver()
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length={TERM_LENGTH}"
    record_and_replay_100mb(system, channel, SourceLocation.REMOTE, 100 * MB)


def test_replay_follows_a_live_recording_to_its_end(system: System) -> None:
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(6 * MB, 30)
    wait_recorded(client, recording_id, 4 * MB)

    # Replay from the start with no length while the recording is live.
    subscription = client.replay(recording_id, REPLAY_CHANNEL, 2002, 0, NULL_LENGTH)
    try:
        receiver = Receiver(0, publisher.starts)
        drain = ReplayDrain(subscription, receiver)
        target = publisher.position + 24 * MB
        deadline = time.monotonic() + 60
        while publisher.position < target:
            work = publisher.step() + drain.poll()
            assert not drain.done, "the replay ended while the recording was live"
            assert time.monotonic() < deadline, f"publishing stalled at {publisher.position}"
            if not work:
                time.sleep(0.0002)
        # The replay catches up with the live recording and stays open, waiting for more.
        deadline = time.monotonic() + 30
        while receiver.next_seq < publisher.next_seq:
            if not drain.poll():
                assert time.monotonic() < deadline, f"the replay did not catch up: {receiver.next_seq}"
                time.sleep(0.0002)
        assert receiver.last_position == publisher.position
        assert client.get_stop_position(recording_id) == NULL_POSITION
        assert drain.poll() == 0 and not drain.done, "the replay ended while the recording was live"
        # The publication goes away: the recording stops at its end, and so does the replay.
        publication.close()
        assert wait_stopped(client, recording_id) == publisher.position
        drain.run(60, "the live replay to end after the recording stopped")
    finally:
        subscription.close()
    assert receiver.next_seq == publisher.next_seq
    assert receiver.last_position == publisher.position
    assert drain.end_position == publisher.position
    assert receiver.digest.hexdigest() == publisher.digest.hexdigest()


def test_a_bounded_replay_stops_at_its_limit_counter_and_ends_when_the_counter_is_freed(system: System) -> None:
    """BoundedReplayRequest (what a cluster backup asks of a member's archive,
    bounded by its commit position): nothing past the limit counter's value
    is replayed; raising it lets the replay go on; once the counter's owner
    frees it, the replay ends (its id may be given to another counter, whose
    value would mean nothing), and the archive says why in its error."""
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(2 * MB, 30)
    seqs = sorted(publisher.starts)
    middle_seq = seqs[len(seqs) // 2]
    middle = publisher.starts[middle_seq]
    wait_recorded(client, recording_id, publisher.position)
    limit = aeron.add_counter(1500, "a test's commit position")
    limit.set(middle)
    subscription = client.replay(recording_id, REPLAY_CHANNEL, 2003, 0, NULL_LENGTH, limit_counter_id=limit.id)
    try:
        receiver = Receiver(0, publisher.starts)
        drain = ReplayDrain(subscription, receiver)
        wait_for(
            lambda: drain.poll() >= 0 and receiver.last_position == middle,
            30,
            f"the replay to reach the limit {middle}",
        )
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            drain.poll()
        assert receiver.last_position == middle and receiver.next_seq == middle_seq, "replayed past the limit"
        limit.set(publisher.position)
        wait_for(
            lambda: drain.poll() >= 0 and receiver.last_position == publisher.position,
            30,
            "the replay to follow the raised limit",
        )
        assert not drain.done
        limit.close()
        drain.run(30, "the bounded replay to end once its limit counter is freed")
    finally:
        subscription.close()
    assert receiver.digest.hexdigest() == publisher.digest.hexdigest()
    errors = [error["text"] for error in archive_tool.archive_errors_document(system.archive_dir())["errors"]]
    assert any("the limit counter" in text and "of the bounded replay was freed" in text for text in errors), errors


def test_a_replay_waiting_at_its_limit_ends_when_its_subscriber_goes(system: System) -> None:
    """A bounded replay that has sent all its limit allows, and follows a live
    recording, offers nothing: it still ends once its subscriber is gone
    (Aeron's replay checks its publication's connection), so it does not hold
    its recording against a truncate or a purge for good (a deposed leader
    whose archive served a cluster backup could not truncate its log)."""
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(64 * 1024, 30)
    wait_recorded(client, recording_id, publisher.position)
    limit = aeron.add_counter(1500, "a test's commit position")
    limit.set(publisher.position)
    subscription = aeron.add_subscription(REPLAY_CHANNEL, 2010)
    replay_session_id = client.start_replay(
        recording_id, REPLAY_CHANNEL, 2010, 0, NULL_LENGTH, limit_counter_id=limit.id
    )
    receiver = Receiver(0, publisher.starts)
    drain = ReplayDrain(subscription, receiver)
    wait_for(
        lambda: drain.poll() >= 0 and receiver.last_position == publisher.position, 30, "the replay to reach its limit"
    )
    session_id = to_int32(replay_session_id)

    def replay_publication_open() -> bool:
        """The replay's publication (its pub-pos counter, keyed by its session id) is still there."""
        reader = aeron.counters_reader
        return any(
            counter.type_id == PUBLISHER_POSITION_TYPE_ID and struct.unpack_from("<qi", counter.key)[1] == session_id
            for counter in reader
        )

    assert replay_publication_open()
    subscription.close()
    wait_for(lambda: not replay_publication_open(), 20, "the replay to end without its subscriber", poll_s=0.1)
    with pytest.raises(ArchiveResponseError) as raised:
        client.stop_replay(replay_session_id)
    assert raised.value.error_code == ArchiveErrorCode.UNKNOWN_REPLAY
    limit.close()


def test_sigkill_while_recording_then_recover_replay_and_extend(system: System) -> None:
    # A short client liveness timeout: the killed archive's subscription goes soon.
    system.start_driver(client_liveness_timeout_ns=2_000_000_000)
    archive = system.start_archive("archive", "--record-checksum")
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    # The publisher offers on its own thread, without pause, while the archive is killed.
    offering = PublisherThread(publisher)
    offering.start()
    try:
        recorded_at_kill = poll_value(
            lambda: client.get_recording_position(recording_id),
            lambda recorded: recorded > 12 * MB,
            60,
            "the recording to pass 12 MB",
        )
        # The publisher can only be a term window (half a term) ahead of what
        # the archive consumed, i.e. wrote: once it is further, the archive has
        # written at least another 512 KB that this test did not ask about.
        beyond = recorded_at_kill + TERM_LENGTH // 2 + MB // 2
        wait_for(lambda: publisher.position > beyond, 30, "the recording to go on")
        archive.kill()
        killed_at = publisher.position
        assert archive.process.returncode == -9
        # The driver drops the dead archive's subscription after the client liveness timeout.
        wait_for(lambda: not publication.is_connected, 20, "the driver to drop the killed archive's subscription")
    finally:
        offering.finish()
    written = publisher.position
    assert killed_at > recorded_at_kill
    publication.close()
    system.clients.remove(client)  # its archive is dead: nothing to close there
    client.close()

    restarted = system.start_archive("archive", "--record-checksum")
    assert f"recovered recordings [{recording_id}]" in restarted.banner
    client = AeronArchive.connect(aeron)
    system.clients.append(client)
    descriptor = client.list_recording(recording_id)
    assert descriptor is not None
    stop = descriptor.stop_position
    assert stop % FRAME_ALIGNMENT == 0
    assert recorded_at_kill + MB // 2 <= stop <= written
    assert client.get_stop_position(recording_id) == stop
    assert client.get_recording_position(recording_id) == NULL_POSITION

    # Everything up to the recovered stop replays intact; the replay image reaches it.
    subscription = client.replay(recording_id, REPLAY_CHANNEL, 2002, 0, NULL_LENGTH)
    try:
        receiver = Receiver(0, publisher.starts)
        drain = ReplayDrain(subscription, receiver)
        drain.run(60, "the replay of the recovered recording to end")
    finally:
        subscription.close()
    assert drain.end_position == stop
    complete = receiver.next_seq
    assert complete > 0 and receiver.last_position <= stop
    # Nothing whole is missing: at most the message the stop cuts through is lost.
    assert stop - receiver.last_position < len(message(complete)) + 32 * (len(message(complete)) // MTU_PAYLOAD + 2)
    assert receiver.digest.hexdigest() == digest_of(0, complete)
    print(
        f"\nkilled at publisher position {killed_at} (recorded {recorded_at_kill} just before), publisher "
        f"stopped at {written}, recovered stop {stop}, "
        f"last whole message (seq {complete - 1}) ends at {receiver.last_position}"
    )

    # Extend from the stop position with the messages the archive lost, and more.
    extension = extend_and_publish(system, aeron, client, recording_id, complete, 6 * MB)
    descriptor = client.list_recording(recording_id)
    assert descriptor is not None and descriptor.stop_position == extension.position
    replay_and_check(client, recording_id, 2003, 0, extension.next_seq, extension.position)


def test_truncate_a_stopped_recording_then_extend_it(system: System) -> None:
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(30 * MB, 30)
    wait_recorded(client, recording_id, publisher.position)
    stop_recording(client, IPC_CHANNEL, recording_id, publisher.position)
    publication.close()
    archive_dir = system.archive_dir()
    assert len(list_segment_files(archive_dir, recording_id)) == 4

    cut_seq, cut = boundary_in_segment(publisher.starts, 10 * MB, SEGMENT_LENGTH)
    assert cut < 2 * SEGMENT_LENGTH
    client.truncate_recording(recording_id, cut)
    assert client.get_stop_position(recording_id) == cut
    descriptor = client.list_recording(recording_id)
    assert descriptor is not None and descriptor.stop_position == cut
    assert len(list_segment_files(archive_dir, recording_id)) == 2
    replay_and_check(client, recording_id, 2002, 0, cut_seq, cut, starts=publisher.starts)
    with pytest.raises(ArchiveResponseError) as raised:
        client.start_replay(recording_id, REPLAY_CHANNEL, 2003, cut + 4096, NULL_LENGTH)
    assert str(cut) in raised.value.archive_message

    # Extend from the truncation point: the stream goes on from message cut_seq.
    extension = extend_and_publish(system, aeron, client, recording_id, cut_seq, 12 * MB)
    assert client.get_stop_position(recording_id) == extension.position
    replay_and_check(client, recording_id, 2004, 0, extension.next_seq, extension.position)
    # The extension's own message starts are where a replay finds them.
    seq, start = boundary_in_segment(extension.starts, cut + MB, SEGMENT_LENGTH)
    replay_and_check(client, recording_id, 2005, seq, extension.next_seq, extension.position, position=start)


def test_purge_detach_delete_and_attach_segments_of_a_live_recording(system: System) -> None:
    """Aeron's segment operations, on a recording still being written: the
    start moves only to a later segment's first byte, never past the segment
    being written or one a replay reads; purge deletes the files before it,
    detach keeps them until deleted, attach takes them back; a replay from the
    new start gives the same messages, and the start survives a restart."""
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(30 * MB, 30)  # segments at 0, 8, 16 and 24 MB
    wait_recorded(client, recording_id, publisher.position)
    archive_dir = system.archive_dir()
    assert len(list_segment_files(archive_dir, recording_id)) == 4

    def refused(action: Callable[[], Any], *words: str) -> None:
        with pytest.raises(ArchiveResponseError) as raised:
            action()
        assert all(word in raised.value.archive_message for word in words), raised.value.archive_message

    refused(lambda: client.purge_segments(recording_id, SEGMENT_LENGTH + FRAME_ALIGNMENT), "invalid segment start")
    refused(lambda: client.purge_segments(recording_id, 0), "lowerBound")
    refused(lambda: client.purge_segments(recording_id, 4 * SEGMENT_LENGTH), "in use", "upperBound")
    refused(lambda: client.purge_segments(recording_id + 100, SEGMENT_LENGTH), "unknown recording")

    # A replay reading the first segment holds the start back.
    held = client.replay(recording_id, REPLAY_CHANNEL, 2006, 0, NULL_LENGTH)
    try:
        # The image appears when the subscriber links, which may be before
        # the archive's replay has seen its publication connected; a close in
        # that window leaves the replay waiting out its connect timeout and
        # reporting that no connection came (as Aeron's ReplaySession does).
        # A first fragment shows the replay is under way.
        wait_for(lambda: held.poll(lambda *fragment: None, 1) > 0, 10, "the replay to send")
        refused(lambda: client.detach_segments(recording_id, SEGMENT_LENGTH), "replay in progress")
    finally:
        held.close()
    wait_for(lambda: _detached(client, recording_id, SEGMENT_LENGTH), 10, "the start to move once the replay ended")
    assert client.get_start_position(recording_id) == SEGMENT_LENGTH
    assert len(list_segment_files(archive_dir, recording_id)) == 4  # detached, still there
    assert client.attach_segments(recording_id) == 1
    assert client.get_start_position(recording_id) == 0
    client.detach_segments(recording_id, SEGMENT_LENGTH)
    assert client.delete_detached_segments(recording_id) == 1
    assert signal_of(client, RecordingSignal.DELETE, recording_id).recording_id == recording_id
    assert client.attach_segments(recording_id) == 0  # nothing left to take back

    assert client.purge_segments(recording_id, 2 * SEGMENT_LENGTH) == 1
    assert [name for name in list_segment_files(archive_dir, recording_id)] == [
        f"{recording_id}-{2 * SEGMENT_LENGTH}.rec",
        f"{recording_id}-{3 * SEGMENT_LENGTH}.rec",
    ]
    refused(
        lambda: client.start_replay(recording_id, REPLAY_CHANNEL, 2007, SEGMENT_LENGTH, NULL_LENGTH),
        "less than recording start",
    )

    # The recording goes on; a replay from a message in the new first segment gives the rest.
    publisher.publish(4 * MB, 30)
    wait_recorded(client, recording_id, publisher.position)
    stop_recording(client, IPC_CHANNEL, recording_id, publisher.position)
    seq, start = boundary_in_segment(publisher.starts, 2 * SEGMENT_LENGTH, SEGMENT_LENGTH)
    replay_and_check(client, recording_id, 2008, seq, publisher.next_seq, publisher.position, position=start)

    # The new start is in the catalog: a restarted archive keeps it.
    system.archives[-1].stop()
    system.start_archive()
    aeron, client = system.connect()
    assert client.get_start_position(recording_id) == 2 * SEGMENT_LENGTH
    replay_and_check(client, recording_id, 2009, seq, publisher.next_seq, publisher.position, position=start)
    verified = archive_tool.archive_verify_document(archive_dir, int(time.time() * 1000))
    assert verified["ok"], verified


def _detached(client: AeronArchive, recording_id: int, new_start: int) -> bool:
    try:
        client.detach_segments(recording_id, new_start)
    except ArchiveResponseError as error:
        if "replay in progress" in error.archive_message:
            return False
        raise
    return True


def test_concurrent_replays_to_two_clients(system: System) -> None:
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(20 * MB, 30)
    wait_recorded(client, recording_id, publisher.position)
    stop_recording(client, IPC_CHANNEL, recording_id, publisher.position)

    # A second client (its own driver connection and control session); one
    # replay over IPC, the other over UDP, both at once.
    _, other = system.connect()
    assert other.control_session_id != client.control_session_id
    udp_channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    drains = []
    overlapped = False
    try:
        for archive_client, channel, stream_id in ((client, REPLAY_CHANNEL, 2002), (other, udp_channel, 2003)):
            subscription = archive_client.replay(recording_id, channel, stream_id, 0, NULL_LENGTH)
            drains.append(ReplayDrain(subscription, Receiver(0, publisher.starts)))
        deadline = time.monotonic() + 90
        while not all(drain.done for drain in drains):
            # The IPC replay is read only once the UDP one has delivered: it
            # cannot get further than its term window before that, so both are
            # under way at once by construction rather than by timing.
            udp_started = drains[1].receiver.count > 0
            work = drains[1].poll() + (drains[0].poll() if udp_started else 0)
            # Both under way at once (20 MB is many times the replays' term windows).
            overlapped = overlapped or all(0 < d.receiver.count < publisher.count for d in drains)
            assert time.monotonic() < deadline, [(d.receiver.count, d.receiver.last_position) for d in drains]
            if not work:
                time.sleep(0.0002)
    finally:
        for drain in drains:
            drain.subscription.close()
    assert overlapped
    for drain in drains:
        assert drain.receiver.next_seq == publisher.next_seq
        assert drain.receiver.last_position == publisher.position
        assert drain.end_position == publisher.position
        assert drain.receiver.digest.hexdigest() == publisher.digest.hexdigest()


def test_the_mark_file_names_the_running_archive(system: System) -> None:
    """By default the archive's id is its driver client id, which exists only
    after the catalog is verified: the mark file is filled in then, and
    agrees with what the control protocol answers."""
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    mark = read_mark_file(system.archive_dir())
    assert mark.archive_id == client.archive_id() != -1
    assert mark.aeron_directory == str(system.driver_dir)
    assert mark.version == SEMANTIC_VERSION


def test_errors_are_clear(system: System) -> None:
    system.start_driver()
    archive = system.start_archive()
    aeron, client = system.connect()

    with pytest.raises(ArchiveResponseError) as raised:
        client.replay(999, REPLAY_CHANNEL, 2002)
    assert raised.value.error_code == ArchiveErrorCode.UNKNOWN_RECORDING
    assert "999" in str(raised.value)

    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(10 * MB, 30)
    wait_recorded(client, recording_id, publisher.position)
    for action in (
        lambda: client.truncate_recording(recording_id, 0),
        lambda: client.purge_recording(recording_id),
        lambda: client.extend_recording(recording_id, IPC_CHANNEL, STREAM_ID),
    ):
        with pytest.raises(ArchiveResponseError) as raised:
            action()
        assert raised.value.error_code == ArchiveErrorCode.ACTIVE_RECORDING
        assert "active recording" in str(raised.value)
    stop_recording(client, IPC_CHANNEL, recording_id, publisher.position)
    stop = publisher.position

    with pytest.raises(ArchiveResponseError) as raised:
        client.start_replay(recording_id, REPLAY_CHANNEL, 2002, stop + 1024, NULL_LENGTH)
    assert f"position={stop}" in raised.value.archive_message
    with pytest.raises(ArchiveResponseError) as raised:
        client.start_replay(recording_id, REPLAY_CHANNEL, 2002, 0, stop + 1024)
    assert f"position={stop}" in raised.value.archive_message
    for bad in (stop + 1024, 1000):  # past the end; not frame aligned
        with pytest.raises(ArchiveResponseError) as raised:
            client.truncate_recording(recording_id, bad)
        assert str(bad) in raised.value.archive_message and f"stop={stop}" in raised.value.archive_message
    assert client.get_stop_position(recording_id) == stop

    # A second archive on the same directory while the first is alive.
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "fulmar.cli.cluster_node",
            "archive",
            "--dir",
            str(archive.archive_dir),
            "--driver-dir",
            str(system.driver_dir),
            "--control-channel",
            "none",
            "--replication-channel",
            "aeron:udp?endpoint=127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2, second
    assert f"pid {archive.process.pid}" in second.stderr
    assert "in use" in second.stderr
    # The first one still serves.
    assert client.get_stop_position(recording_id) == stop

    segments = list_segment_files(archive.archive_dir, recording_id)
    assert len(segments) == 2
    client.purge_recording(recording_id)
    assert client.list_recording(recording_id) is None
    assert all(d.recording_id != recording_id for d in client.list_recordings())
    assert list_segment_files(archive.archive_dir, recording_id) == []
    assert not [name for name in segments if (archive.archive_dir / name).exists()]
    with pytest.raises(ArchiveResponseError) as raised:
        client.replay(recording_id, REPLAY_CHANNEL, 2002)
    assert raised.value.error_code == ArchiveErrorCode.UNKNOWN_RECORDING


class BusyPoller:
    """A client's response poller as seen by a client whose thread is busy
    elsewhere for a moment before each read (a loaded machine does this for
    real): whatever the archive sent meanwhile is read in one batch."""

    def __init__(self, poller: Any) -> None:
        self.poller = poller

    def poll(self) -> list[tuple[str, Any]]:
        time.sleep(0.02)
        return self.poller.poll()


def test_recording_signals_reach_a_busy_client(system: System) -> None:
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    client.poller = BusyPoller(client.poller)  # type: ignore[assignment]
    client.start_recording(IPC_CHANNEL, STREAM_ID)
    publication = system.publication(aeron, IPC_CHANNEL)
    started = signal_of(client, RecordingSignal.START)
    recording_id = started.recording_id
    assert started.position == 0
    publisher = Publisher(publication)
    publisher.publish(2 * MB, 30)
    wait_recorded(client, recording_id, publisher.position)

    # Each of these answers OK and then signals: the signal must not be lost
    # when it is read in the same batch as the answer.
    client.stop_recording(IPC_CHANNEL, STREAM_ID)
    stopped = signal_of(client, RecordingSignal.STOP, recording_id)
    assert stopped.position == publisher.position
    _, cut = first_start_after(publisher.starts, MB)
    client.truncate_recording(recording_id, cut)
    truncated = signal_of(client, RecordingSignal.DELETE, recording_id)
    assert truncated.position == cut
    client.purge_recording(recording_id)
    purged = signal_of(client, RecordingSignal.DELETE, recording_id)
    assert purged.position == NULL_POSITION


def test_recording_events_reach_an_observer(system: System) -> None:
    """With a recording events channel, observers see RecordingStarted, then
    RecordingProgress up to the end, then RecordingStopped (no control session needed)."""
    from fulmar.archive.protocol import RECORDING_EVENTS_STREAM_ID
    from fulmar.codecs.generated import archive as codecs

    events_channel = "aeron:ipc?term-length=64k"
    system.start_driver()
    system.start_archive("archive", "--recording-events-channel", events_channel)
    aeron, client = system.connect()
    observer = aeron.add_subscription(events_channel, RECORDING_EVENTS_STREAM_ID)
    wait_for(lambda: observer.is_connected, 10, "the observer to see the events publication")
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(2 * MB, 30)
    wait_recorded(client, recording_id, publisher.position)
    stop_recording(client, IPC_CHANNEL, recording_id, publisher.position)

    events: list[Any] = []

    def on_event(buffer: memoryview, offset: int, length: int, header: Any) -> None:
        events.append(codecs.decode(buffer, offset, length))

    wait_for(
        lambda: (observer.poll(on_event, 100), any(isinstance(e, codecs.RecordingStoppedDecoder) for e in events))[1],
        10,
        "RecordingStopped",
    )
    started, *progress, stopped = events
    assert isinstance(started, codecs.RecordingStartedDecoder)
    assert (started.recording_id, started.start_position, started.stream_id) == (recording_id, 0, STREAM_ID)
    assert started.session_id == publication.session_id and started.channel == IPC_CHANNEL
    assert progress and all(isinstance(e, codecs.RecordingProgressDecoder) for e in progress)
    positions = [e.position for e in progress]
    assert positions == sorted(positions) and positions[-1] == publisher.position
    assert isinstance(stopped, codecs.RecordingStoppedDecoder)
    assert (stopped.recording_id, stopped.start_position, stopped.stop_position) == (
        recording_id,
        0,
        publisher.position,
    )


def test_a_corrupt_segment_ends_a_replay_with_a_clear_error(system: System) -> None:
    """A frame in a segment file whose term id is not the one its position
    says: the replay stops there with an error naming the problem, and the
    archive keeps serving."""
    system.start_driver()
    system.start_archive()
    aeron, client = system.connect()
    publication, recording_id = start_recorded_publication(system, aeron, client, IPC_CHANNEL)
    publisher = Publisher(publication)
    publisher.publish(1 * MB, 30)
    wait_recorded(client, recording_id, publisher.position)
    stop_recording(client, IPC_CHANNEL, recording_id, publisher.position)
    segment = system.archive_dir() / f"{recording_id}-0.rec"
    with open(segment, "r+b") as file:
        # Walk the frames from the start of the segment to one at or after 512 KiB.
        offset = 0
        while offset < 512 * 1024:
            file.seek(offset)
            length = int.from_bytes(file.read(4), "little", signed=True)
            assert length > 0
            offset += (length + 31) & ~31
        file.seek(offset + 20)  # the frame's term id
        term_id = int.from_bytes(file.read(4), "little", signed=True)
        file.seek(offset + 20)
        file.write((term_id + 5).to_bytes(4, "little", signed=True))
    subscription = client.replay(recording_id, REPLAY_CHANNEL, 2002, 0, publisher.position)
    deadline = time.monotonic() + 20
    with pytest.raises(ArchiveResponseError, match="not whole frames"):
        while time.monotonic() < deadline:
            subscription.poll(lambda *args: None, 100)
            client.poll_for_signals()
            time.sleep(0.001)
    subscription.close()
    # The archive still serves.
    assert client.get_stop_position(recording_id) == publisher.position


def test_an_idle_archive_sleeps_long_and_keeps_a_short_pace_while_a_control_session_connects(system: System) -> None:
    """Idle, the archive sleeps until a request, a recording or its recorder
    thread rings it, or its idle wait (100 ms) ends.  A control session whose
    response publication has yet to connect rings nothing when it does, so
    while one waits the archive keeps a 10 ms pace, and answers the connect
    within that."""
    system.start_driver()
    archive = system.start_archive()
    aeron = system.driver.connect()
    system.aerons.append(aeron)
    requests = system.publication(aeron, archive_protocol.LOCAL_CONTROL_CHANNEL, archive_protocol.CONTROL_STREAM_ID)
    wait_for(lambda: requests.is_connected, 10, "the archive's control request subscription")
    pid = {"archive": archive.process.pid}
    idle = main_thread_wakes_per_second(pid, 1.0)["archive"]
    assert idle < 30, idle

    # Nobody subscribes to this response stream: the session waits for its
    # publication to connect, up to the archive's connect timeout (5 s).
    assert ArchiveProxy(requests).connect("aeron:ipc?term-length=64k", 4321, correlation_id=1)
    connecting = main_thread_wakes_per_second(pid, 1.0)["archive"]
    assert connecting > 50, (idle, connecting)


def test_a_recording_and_its_replay_over_datagram_mac_channels(system: System) -> None:
    """datagram-mac=true on a recorded publication's channel (recorded
    locally: the archive's spy reads the log, not the datagrams) and on the
    replay channel: the archive's replay keeps the parameter, and its
    datagrams are authenticated (a stranger's, sent into the replay, is
    refused)."""
    system.start_driver(member_secret="the archive's member secret")
    system.start_archive()
    aeron, client = system.connect()
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length={TERM_LENGTH}|datagram-mac=true|ssc=true"
    publication, recording_id = start_recorded_publication(system, aeron, client, channel, SourceLocation.LOCAL)
    publisher = Publisher(publication)
    publisher.publish(8 * MB, 60)
    wait_recorded(client, recording_id, publisher.position)
    stop_recording(client, channel, recording_id, publisher.position)

    def refused() -> int:
        with CncFile.open(system.driver.directory) as cnc:
            return CountersReader(cnc.counters_metadata, cnc.counters_values).counter_value(
                int(SystemCounter.DATAGRAMS_REFUSED_NO_MAC)
            )

    assert refused() == 0
    replay_port = free_udp_port()
    subscription = client.replay(
        recording_id, f"aeron:udp?endpoint=127.0.0.1:{replay_port}|datagram-mac=true", 2004, 0, NULL_LENGTH
    )
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            stranger.sendto(
                struct.pack("<iBBhiiiiq", 64, 0, 0xC0, 1, 0, 1, 2004, 0, 0) + bytes(32), ("127.0.0.1", replay_port)
            )
        receiver = Receiver(0, publisher.starts)
        drain = ReplayDrain(subscription, receiver)
        drain.run(60, "the replay over a datagram-mac channel to end")
    finally:
        subscription.close()
    assert receiver.digest.hexdigest() == publisher.digest.hexdigest()
    assert drain.end_position == publisher.position
    assert refused() == 1
