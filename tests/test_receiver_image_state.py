"""The receive state of a network image: window checks, status message
scheduling, NAKs, end of stream and liveness, then a whole stream over a
lossy, reordering link with an injected clock."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.driver.image_state import (
    SM_END_OF_STREAM_FLAG,
    ImageReceiveState,
    NakToSend,
    PacketVerdict,
    StatusMessageToSend,
)
from fulmar.driver.loss_detector import StaticDelayGenerator
from fulmar.frames import DATA_HEADER, EOS_FLAG, FrameType
from fulmar.logbuffer import LogBuffers, compute_position, to_int32
from test_receiver_rebuild import Collector, datagram_span, frames_of, payload_for, publish_terms, sender_datagrams

TERM = 64 * 1024
WINDOW = TERM // 2  # min(term length / 2, 128 KiB)
INITIAL_TERM_ID = 7  # what the rebuild tests' publisher uses
SESSION_ID = 11
STREAM_ID = 22
DELAY_NS = 1_000
RETRY_NS = 5_000
SM_TIMEOUT_NS = 200_000_000
LIVENESS_NS = 10_000_000_000


def data(position: int, length: int = 64, flags: int = 0xC0) -> tuple[int, int, bytes]:
    """(term id, term offset, datagram) of one DATA frame at a stream position."""
    term_count, term_offset = divmod(position, TERM)
    term_id = to_int32(INITIAL_TERM_ID + term_count)
    header = DATA_HEADER.pack(length, 0, flags, FrameType.DATA, term_offset, SESSION_ID, STREAM_ID, term_id, 0)
    return term_id, term_offset, header + bytes(length - 32)


def heartbeat(position: int, eos: bool = False) -> tuple[int, int, bytes]:
    term_count, term_offset = divmod(position, TERM)
    term_id = to_int32(INITIAL_TERM_ID + term_count)
    flags = 0xC0 | (EOS_FLAG if eos else 0)
    return term_id, term_offset, DATA_HEADER.pack(0, 0, flags, FrameType.DATA, term_offset, SESSION_ID, STREAM_ID, term_id, 0)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogBuffers]:
    with LogBuffers.create(
        tmp_path / "image.logbuffer", TERM, initial_term_id=INITIAL_TERM_ID, session_id=SESSION_ID, stream_id=STREAM_ID
    ) as buffers:
        yield buffers


@pytest.fixture
def image(log: LogBuffers) -> ImageReceiveState:
    return ImageReceiveState(log, INITIAL_TERM_ID, 0, 0, delay_generator=StaticDelayGenerator(DELAY_NS, RETRY_NS))


def test_the_first_status_message_is_due_at_once_then_every_timeout(image: ImageReceiveState) -> None:
    assert image.poll_status_message(0) == StatusMessageToSend(SESSION_ID, STREAM_ID, INITIAL_TERM_ID, 0, WINDOW, 0)
    assert image.poll_status_message(0) is None
    assert image.poll_status_message(SM_TIMEOUT_NS) is None
    assert image.poll_status_message(SM_TIMEOUT_NS + 1) is not None
    assert image.poll_status_message(2 * SM_TIMEOUT_NS + 1) is None
    image.request_status_message()
    assert image.poll_status_message(2 * SM_TIMEOUT_NS + 2) is not None
    assert image.status_messages_sent == 3


def test_joining_mid_stream(log: LogBuffers) -> None:
    image = ImageReceiveState(log, INITIAL_TERM_ID + 2, 4096, 50)
    assert image.hwm_position == image.rebuild_position == 2 * TERM + 4096
    assert image.poll_status_message(50) == StatusMessageToSend(SESSION_ID, STREAM_ID, INITIAL_TERM_ID + 2, 4096, WINDOW, 0)
    for term_id, offset in [(INITIAL_TERM_ID, 16), (INITIAL_TERM_ID, TERM), (INITIAL_TERM_ID - 1, 0)]:
        with pytest.raises(ValueError):
            ImageReceiveState(log, term_id, offset, 0)


def test_receiver_window_is_half_a_term_at_most(tmp_path: Path) -> None:
    with LogBuffers.create(tmp_path / "big.logbuffer", 1024 * 1024) as big:
        assert ImageReceiveState(big, 0, 0, 0).receiver_window_length == 128 * 1024
        assert ImageReceiveState(big, 0, 0, 0, initial_window_length=16 * 1024).receiver_window_length == 16 * 1024
    with LogBuffers.create(tmp_path / "small.logbuffer", TERM) as small:
        assert ImageReceiveState(small, 0, 0, 0).receiver_window_length == WINDOW


def test_a_status_message_follows_a_quarter_window_of_consumption(image: ImageReceiveState) -> None:
    image.poll_status_message(0)
    quarter = WINDOW // 4
    assert image.rebuild(1, [quarter]) == 1  # the rebuild position follows the subscriber
    assert image.poll_status_message(2) is None  # not more than a quarter yet
    image.rebuild(3, [quarter + 32])
    sm = image.poll_status_message(4)
    assert sm is not None and (sm.consumption_term_id, sm.consumption_term_offset) == (INITIAL_TERM_ID, quarter + 32)
    # The slowest subscriber sets the position; the timeout repeats it.
    image.rebuild(5, [quarter + 64, 3 * quarter])
    assert image.poll_status_message(6) is None
    sm = image.poll_status_message(6 + SM_TIMEOUT_NS)
    assert sm is not None and sm.consumption_term_offset == quarter + 32
    image.rebuild(7 + SM_TIMEOUT_NS, [2 * quarter + 64, 3 * quarter])
    sm = image.poll_status_message(8 + SM_TIMEOUT_NS)
    assert sm is not None and sm.consumption_term_offset == 2 * quarter + 64


def test_data_is_inserted_and_read(image: ImageReceiveState, log: LogBuffers) -> None:
    collector = Collector(log)
    assert image.insert_packet(*data(64), 10) is PacketVerdict.DATA
    assert image.insert_packet(*data(0), 11) is PacketVerdict.DATA
    assert image.hwm_position == 128
    image.rebuild(12, [collector.reader.position])
    assert image.rebuild_position == 128
    assert len(collector.read()) == 2
    assert image.insert_packet(*data(0), 13) is PacketVerdict.DATA  # a duplicate, already complete


def test_packets_beyond_the_window_are_dropped(image: ImageReceiveState, log: LogBuffers) -> None:
    image.poll_status_message(0)
    threshold = TERM // 2  # half a term past the last status message
    assert image.insert_packet(*data(threshold - 64), 1) is PacketVerdict.DATA
    before = bytes(log.view)
    assert image.insert_packet(*data(threshold), 2) is PacketVerdict.OVER_RUN
    assert image.insert_packet(*data(5 * TERM), 3) is PacketVerdict.OVER_RUN
    assert image.insert_packet(*heartbeat(threshold + 32), 4) is PacketVerdict.OVER_RUN
    assert bytes(log.view) == before
    assert image.hwm_position == threshold and image.flow_control_over_runs == 3
    # Once subscribers consume and a status message says so, the window moves.
    image.rebuild(5, [WINDOW // 4 + 32])
    assert image.poll_status_message(6) is not None
    assert image.insert_packet(*data(threshold), 7) is PacketVerdict.DATA
    assert image.hwm_position == threshold + 64


def test_packets_behind_the_consumed_position_are_dropped(image: ImageReceiveState) -> None:
    image.poll_status_message(0)
    consumed = TERM + 4096
    image.rebuild(1, [consumed])
    sm = image.poll_status_message(2)
    assert sm is not None and sm.consumption_term_id == INITIAL_TERM_ID + 1
    assert image.insert_packet(*data(consumed - 64), 3) is PacketVerdict.UNDER_RUN
    assert image.insert_packet(*data(consumed), 3) is PacketVerdict.DATA
    # A heartbeat is accepted from up to a term behind: it writes nothing.
    assert image.insert_packet(*heartbeat(4096), 4) is PacketVerdict.HEARTBEAT
    assert image.insert_packet(*heartbeat(4064), 4) is PacketVerdict.UNDER_RUN
    assert image.flow_control_under_runs == 2 and image.heartbeats_received == 1


def test_malformed_packets_are_invalid_and_change_nothing(image: ImageReceiveState, log: LogBuffers) -> None:
    before = bytes(log.view)
    term_id, offset, datagram = data(128)
    assert image.insert_packet(term_id, offset, datagram[:40], 1) is PacketVerdict.INVALID  # truncated
    assert image.insert_packet(term_id, offset, datagram[:20], 1) is PacketVerdict.INVALID
    assert image.insert_packet(term_id, offset + 32, datagram, 1) is PacketVerdict.INVALID  # header disagrees
    assert image.insert_packet(term_id, -64, datagram, 1) is PacketVerdict.INVALID
    assert image.insert_packet(term_id, TERM, datagram, 1) is PacketVerdict.INVALID
    assert image.on_data(term_id, 2**40, 64, 1) is PacketVerdict.INVALID
    assert image.invalid_packets == 6
    assert bytes(log.view) == before
    assert image.hwm_position == 0
    assert image.is_timed_out(LIVENESS_NS + 1)  # none of them counted as a sign of life


def test_a_heartbeat_reveals_tail_loss_and_the_gap_is_naked(image: ImageReceiveState) -> None:
    image.insert_packet(*data(0), 0)
    assert image.insert_packet(*heartbeat(256), 0) is PacketVerdict.HEARTBEAT
    assert image.hwm_position == 256
    assert image.rebuild(0, [0]) >= 1
    assert image.rebuild_position == 64
    assert image.poll_nak() is None
    image.rebuild(DELAY_NS, [0])
    assert image.poll_nak() == NakToSend(SESSION_ID, STREAM_ID, INITIAL_TERM_ID, 64, 192)
    assert image.poll_nak() is None
    image.rebuild(DELAY_NS + RETRY_NS, [0])
    assert image.poll_nak() is not None
    for position in (64, 128, 192):
        image.insert_packet(*data(position), DELAY_NS + RETRY_NS)
    image.rebuild(DELAY_NS + 3 * RETRY_NS, [0])
    assert image.poll_nak() is None
    assert image.rebuild_position == 256 and image.naks_sent == 2


def test_on_data_is_the_bookkeeping_without_the_bytes(image: ImageReceiveState) -> None:
    assert image.on_data(INITIAL_TERM_ID, 0, 1024, 5) is PacketVerdict.DATA
    assert image.hwm_position == 1024
    assert image.on_data(INITIAL_TERM_ID, 2048, 0, 6, is_heartbeat=True, is_eos=True) is PacketVerdict.HEARTBEAT
    assert image.hwm_position == 2048 and image.end_of_stream_position == 2048
    assert not image.is_timed_out(6 + LIVENESS_NS)


def test_end_of_stream_once_everything_before_it_is_rebuilt(image: ImageReceiveState, log: LogBuffers) -> None:
    image.poll_status_message(0)
    image.insert_packet(*data(64), 1)
    image.insert_packet(*heartbeat(128, eos=True), 2)
    assert image.end_of_stream_position == 128 == log.end_of_stream_position
    image.rebuild(3, [0])
    assert not image.is_end_of_stream
    assert image.poll_status_message(4) is None
    image.insert_packet(*data(0), 5)
    image.rebuild(6, [0])
    assert image.is_end_of_stream
    # The sender hears at once, and from now on every status message says so.
    sm = image.poll_status_message(7)
    assert sm is not None and sm.flags == SM_END_OF_STREAM_FLAG
    sm = image.poll_status_message(8 + SM_TIMEOUT_NS)
    assert sm is not None and sm.flags == SM_END_OF_STREAM_FLAG


def test_an_eos_flagged_data_frame_ends_the_stream_after_it(image: ImageReceiveState) -> None:
    image.insert_packet(*data(0, 96, flags=0xC0 | EOS_FLAG), 1)
    assert image.end_of_stream_position == 96
    image.rebuild(2, [0])
    assert image.is_end_of_stream


def test_liveness(image: ImageReceiveState) -> None:
    assert not image.is_timed_out(LIVENESS_NS)
    assert image.is_timed_out(LIVENESS_NS + 1)
    image.insert_packet(*heartbeat(0), 5_000_000_000)
    assert not image.is_timed_out(5_000_000_000 + LIVENESS_NS)
    assert image.is_timed_out(5_000_000_000 + LIVENESS_NS + 1)
    image.insert_packet(*data(TERM), 6_000_000_000)  # over-run: dropped, no sign of life
    assert image.is_timed_out(5_000_000_000 + LIVENESS_NS + 1)


class Link:
    """One direction of a network: loses, duplicates and reorders, by seed."""

    def __init__(self, rng: random.Random, loss: float, duplication: float, max_delay_ns: int) -> None:
        self._rng = rng
        self._loss = loss
        self._duplication = duplication
        self._max_delay_ns = max_delay_ns
        self._in_flight: list[tuple[int, int, Any]] = []
        self._sequence = 0

    def send(self, now_ns: int, item: Any) -> None:
        copies = 0 if self._rng.random() < self._loss else 1
        copies += self._rng.random() < self._duplication
        for _ in range(copies):
            self._sequence += 1
            self._in_flight.append((now_ns + self._rng.randrange(self._max_delay_ns), self._sequence, item))

    def receive(self, now_ns: int) -> list[Any]:
        due = sorted(entry for entry in self._in_flight if entry[0] <= now_ns)
        self._in_flight = [entry for entry in self._in_flight if entry[0] > now_ns]
        return [item for _, _, item in due]


def test_a_lossy_reordering_link_delivers_the_whole_stream(tmp_path: Path, log: LogBuffers) -> None:
    rng = random.Random(2024)
    sizes = [rng.choice([0, 10, 200, 1000, 1400, 2000, 5000]) for _ in range(400)]
    terms = publish_terms(tmp_path, sizes)
    assert len(terms) >= 5  # the image's partitions are each used at least twice
    last = frames_of(terms[-1])[-1]
    stream_end = (len(terms) - 1) * TERM + last[0] + last[1]

    image = ImageReceiveState(log, INITIAL_TERM_ID, 0, 0, delay_generator=StaticDelayGenerator(20_000, 200_000))
    collector = Collector(log)
    to_receiver = Link(rng, loss=0.1, duplication=0.05, max_delay_ns=60_000)
    to_sender = Link(rng, loss=0.1, duplication=0.0, max_delay_ns=60_000)

    # The sender: sends within the window the last status message granted,
    # heartbeats when it has nothing to send, resends what NAKs ask for.
    sender_position = 0
    sender_limit = -1
    last_send_ns = 0
    eos_seen = False
    delivered = 0
    now_ns = 0
    while now_ns < 2_000_000_000 and not eos_seen:
        now_ns += 10_000
        for message in to_sender.receive(now_ns):
            if isinstance(message, StatusMessageToSend):
                position = compute_position(
                    message.consumption_term_id, message.consumption_term_offset, 16, INITIAL_TERM_ID
                )
                sender_limit = max(sender_limit, position + message.receiver_window)
                eos_seen = eos_seen or bool(message.flags & SM_END_OF_STREAM_FLAG)
            elif isinstance(message, NakToSend):
                term = terms[to_int32(message.term_id - INITIAL_TERM_ID)]
                for offset, datagram in sender_datagrams(term, message.term_offset, message.term_offset + message.length):
                    to_receiver.send(now_ns, (message.term_id, offset, datagram))
        for _ in range(4):
            term_count, offset = divmod(sender_position, TERM)
            if sender_position >= stream_end:
                break
            sliced = sender_datagrams(terms[term_count], offset, max_count=1)
            if not sliced or sender_position + len(sliced[0][1]) > sender_limit:
                break
            to_receiver.send(now_ns, (to_int32(INITIAL_TERM_ID + term_count), offset, sliced[0][1]))
            sender_position += datagram_span(sliced[0][1])
            last_send_ns = now_ns
        if sender_limit >= 0 and now_ns - last_send_ns >= 100_000:
            to_receiver.send(now_ns, heartbeat(sender_position, eos=sender_position >= stream_end))
            last_send_ns = now_ns

        # The receiver, with one subscriber reading as data arrives.
        for packet in to_receiver.receive(now_ns):
            term_id, term_offset, datagram = packet
            assert image.insert_packet(term_id, term_offset, datagram, now_ns) is not PacketVerdict.INVALID
        # Checked as it arrives, so a corrupt log fails here, briefly.
        for index in range(delivered, len(collector.read())):
            if index >= len(sizes) or collector.messages[index] != payload_for(index, sizes[index]):
                pytest.fail(f"message {index} delivered wrong at {now_ns} ns")
        delivered = len(collector.messages)
        image.rebuild(now_ns, [collector.reader.position])
        status_message = image.poll_status_message(now_ns)
        if status_message is not None:
            to_sender.send(now_ns, status_message)
        nak = image.poll_nak()
        if nak is not None:
            to_sender.send(now_ns, nak)

    assert eos_seen and image.is_end_of_stream
    assert delivered == len(sizes)
    assert image.hwm_position == image.rebuild_position == stream_end
    assert image.naks_sent > 0
