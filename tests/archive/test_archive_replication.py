"""Replication between two nodes on loopback: two media drivers, two archive
processes.  A recording on node A is copied into node B's archive up to a
stop position, extended term by term (seed 001's exchange), and, while A's
stream is still live, replicated with a live destination that merges into
the live stream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar.archive.client import AeronArchive, ArchiveResponseError, RecordingSignal, SourceLocation
from fulmar.archive.protocol import ArchiveErrorCode
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from support.archive import ArchiveNode as Node
from support.driver import free_udp_port, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

STREAM_ID = 100


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    a, b = Node("a"), Node("b")
    try:
        yield a.start(), b.start()
    finally:
        a.close()
        b.close()


def offer(publication: Any, message: bytes, on_idle: Any = None) -> int:
    deadline = time.monotonic() + 10
    while True:
        result = publication.offer(message)
        if result > 0:
            return int(result)
        assert result in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION), result
        if on_idle is not None:
            on_idle()
        assert time.monotonic() < deadline, f"offer stayed at {result}"


def message(seq: int) -> bytes:
    return seq.to_bytes(8, "little") * (1 + seq % 40)


def replayed_sequence(client: AeronArchive, recording_id: int, end: int, count: int, stream_id: int) -> list[int]:
    subscription = client.replay(recording_id, "aeron:ipc", stream_id, 0, end)
    seen: list[int] = []

    def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
        seq = int.from_bytes(buffer[offset : offset + 8], "little")
        assert bytes(buffer[offset : offset + length]) == message(seq)
        seen.append(seq)

    try:
        wait_for(lambda: (subscription.poll(on_fragment, 256), len(seen) >= count)[1], 20, f"{count} replayed messages")
    finally:
        subscription.close()
    return seen


def record(
    node: Node, channel: str, count: int, source: SourceLocation = SourceLocation.LOCAL
) -> tuple[int, list[int], Any]:
    """Record ``count`` messages of a new publication on ``channel``: the
    recording id, the position after each message, and the publication."""
    client, aeron = node.client, node.aeron
    assert client is not None and aeron is not None
    client.start_recording(channel, STREAM_ID, source)
    publication = aeron.add_exclusive_publication(channel, STREAM_ID)
    recording_id = client.wait_for_signal(lambda s: s.signal == RecordingSignal.START).recording_id
    positions = [offer(publication, message(seq)) for seq in range(count)]
    wait_for(lambda: client.get_recording_position(recording_id) == positions[-1], 20, "the recording to catch up")
    return recording_id, positions, publication


def test_replicate_to_a_stop_position_then_extend_term_by_term(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    assert a.client is not None and b.client is not None and a.archive is not None
    channel = "aeron:ipc?term-length=64k"
    recording_id, positions, publication = record(a, channel, 3000)
    end = positions[-1]
    assert end > 4 * 64 * 1024  # several terms, so the replicated pieces cross term boundaries
    a.client.stop_recording(channel, STREAM_ID)
    a.client.wait_for_signal(lambda s: s.signal == RecordingSignal.STOP)
    publication.close()

    # Seed 001: member 0 first back-fills to B, then B to C, each a ReplicateRequest2.
    b_position, c_position = positions[999], positions[1999]
    b.client.replicate(recording_id, a.archive.control_channel, stop_position=b_position)
    created = b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE)
    dst_id = created.recording_id
    signals = [b.client.wait_for_signal(lambda s: s.signal in (RecordingSignal.SYNC, RecordingSignal.REPLICATE_END))]
    if signals[0].signal is RecordingSignal.SYNC:
        assert signals[0].position == b_position
        b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END)
    assert b.client.get_stop_position(dst_id) == b_position

    b.client.replicate(recording_id, a.archive.control_channel, dst_recording_id=dst_id, stop_position=c_position)
    extend = b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.EXTEND)
    assert (extend.recording_id, extend.position) == (dst_id, b_position)
    b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END)
    assert b.client.get_stop_position(dst_id) == c_position

    # The rest, with no stop position: up to where the source ends.
    b.client.replicate(recording_id, a.archive.control_channel, dst_recording_id=dst_id)
    b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END)
    assert b.client.get_stop_position(dst_id) == end

    source = a.client.list_recording(recording_id)
    copy = b.client.list_recording(dst_id)
    assert source is not None and copy is not None
    # (not the session id: as in Aeron, an extension records the session id of
    # the image that extended it, here the last replay's)
    for field in (
        "start_position",
        "stop_position",
        "initial_term_id",
        "term_buffer_length",
        "mtu_length",
        "stream_id",
        "original_channel",
    ):
        assert getattr(copy, field) == getattr(source, field), field
    assert replayed_sequence(b.client, dst_id, end, 3000, 7) == list(range(3000))


def test_replication_errors_are_reported(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    assert b.client is not None and a.archive is not None
    with pytest.raises(ArchiveResponseError) as unknown_dst:
        b.client.replicate(0, a.archive.control_channel, dst_recording_id=42)
    assert unknown_dst.value.error_code == ArchiveErrorCode.UNKNOWN_RECORDING
    # An unknown source recording fails asynchronously: the requester gets an
    # ERROR naming it, then REPLICATE_END.
    b.client.replicate(99, a.archive.control_channel)
    with pytest.raises(ArchiveResponseError, match="unknown source recording 99"):
        b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END)
    # A source archive that is not there: the connect times out, clearly.
    # The failed replication's REPLICATE_END follows its error (it may have
    # been read with it): take it before waiting for the next one's.
    b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END)
    with pytest.raises(ArchiveResponseError, match="timed out connecting to the source archive"):
        b.client.replicate(0, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}")
        b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END, 20_000_000_000)


def test_replicate_with_a_live_destination_merges_into_the_live_stream(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    assert a.client is not None and b.client is not None and a.aeron is not None and a.archive is not None
    # A's stream goes to its own receiver and to the endpoint B will join live on.
    local_port, live_port = free_udp_port(), free_udp_port()
    receiver = a.aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{local_port}", STREAM_ID)
    channel = "aeron:udp?control-mode=manual|term-length=256k"
    a.client.start_recording(channel, STREAM_ID, SourceLocation.LOCAL)
    publication = a.aeron.add_exclusive_publication(channel, STREAM_ID)
    publication.add_destination(f"aeron:udp?endpoint=127.0.0.1:{local_port}")
    publication.add_destination(f"aeron:udp?endpoint=127.0.0.1:{live_port}")
    recording_id = a.client.wait_for_signal(lambda s: s.signal == RecordingSignal.START).recording_id

    def drain() -> None:
        receiver.poll(lambda *args: None, 1000)

    sent = 0

    def publish(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            offer(publication, message(sent), drain)
            sent += 1
            drain()

    publish(2000)  # history B must replay before it can join
    b.client.replicate(recording_id, a.archive.control_channel, live_destination=f"127.0.0.1:{live_port}")
    seen: list[RecordingSignal] = []
    deadline = time.monotonic() + 30
    while RecordingSignal.MERGE not in seen:
        # The live stream keeps moving while B catches up, at a pace the replay
        # can overtake (a merge needs that): ~20 messages per millisecond.
        publish(20)
        time.sleep(0.001)
        b.client.poll_for_signals()
        while b.client.signals:
            seen.append(b.client.signals.popleft().signal)
        assert RecordingSignal.REPLICATE_END not in seen or RecordingSignal.MERGE in seen, seen
        assert time.monotonic() < deadline, f"no merge; signals so far {seen}"
    assert seen[:3] == [RecordingSignal.REPLICATE, RecordingSignal.EXTEND, RecordingSignal.MERGE]
    dst = b.client.list_recordings()[0]
    assert b.client.get_stop_position(dst.recording_id) == -1  # still recording, now from the live stream
    publish(1000)
    end = publication.position
    wait_for(lambda: b.client.get_recording_position(dst.recording_id) == end, 20, "B to record the live stream")
    assert replayed_sequence(b.client, dst.recording_id, end, sent, 7) == list(range(sent))
    receiver.close()
    publication.close()


def test_a_replication_the_driver_refuses_ends_with_an_error(nodes: tuple[Node, Node]) -> None:
    """A replication channel the destination's driver cannot use: the
    replication ends with an ERROR and REPLICATE_END, the archive serves on."""
    a, b = nodes
    assert a.client is not None and b.client is not None and a.archive is not None
    recording_id, positions, publication = record(a, "aeron:ipc?term-length=64k", 10)
    b.client.replicate(recording_id, a.archive.control_channel, replication_channel="aeron:udp?endpoint=bad host:0")
    with pytest.raises(ArchiveResponseError, match="replication"):
        b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END)
    assert b.client.list_recordings() == []
    publication.close()


class OneBatchUntilTheEnd:
    """A client's response poller as seen by a client busy elsewhere until the
    archive has sent everything (a loaded machine does this for real): the
    replicate request's OK, the replication's asynchronous ERROR and its
    REPLICATE_END come in one batch.  Then it reads as it comes."""

    def __init__(self, poller: Any) -> None:
        self.poller = poller
        self.held: list[tuple[str, Any]] = []
        self.released = False

    def poll(self) -> list[tuple[str, Any]]:
        if self.released:
            return list(self.poller.poll())
        self.held += self.poller.poll()
        if not any(
            kind == "signal" and message.signal_raw == RecordingSignal.REPLICATE_END for kind, message in self.held
        ):
            return []
        self.released = True
        return self.held


def test_a_replication_error_read_with_the_requests_answer_is_raised_by_the_next_poll(
    nodes: tuple[Node, Node],
) -> None:
    """The ERROR came in the same batch as the OK the client was waiting for:
    it was dropped with the rest of the batch, and the caller saw only the
    REPLICATE_END, as if the replication had succeeded."""
    a, b = nodes
    assert a.client is not None and b.client is not None and a.archive is not None
    recording_id, _, publication = record(a, "aeron:ipc?term-length=64k", 10)
    b.client.poller = OneBatchUntilTheEnd(b.client.poller)  # type: ignore[assignment]
    b.client.replicate(recording_id, a.archive.control_channel, replication_channel="aeron:udp?endpoint=bad host:0")
    with pytest.raises(ArchiveResponseError, match="replication"):
        b.client.poll_for_signals()
    # The signal read with it is kept.
    assert b.client.wait_for_signal(lambda s: s.signal == RecordingSignal.REPLICATE_END).recording_id is not None
    assert b.client.list_recordings() == []
    publication.close()
