"""The native receive state of a network image (image_state.c), driven
through cffi: status messages, the window, inserting and rebuilding, loss
and NAKs, end of stream, liveness, the deadline the driver thread sleeps to,
hostile datagrams, the state's invariants on random packet sequences, and a
whole stream over a lossy, reordering link."""

from __future__ import annotations

import random
import struct
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fulmar._native import ffi, lib
from fulmar.frames import DATA_HEADER, EOS_FLAG, FrameType
from fulmar.logbuffer import END_OF_STREAM_POSITION_OFFSET, LogBuffers, compute_position, to_int32
from support.receiver import Collector, datagram_span, frames_of, payload_for, publish_terms, sender_datagrams

TERM = 64 * 1024
WINDOW = TERM // 2  # min(term length / 2, 128 KiB)
INITIAL_TERM_ID = 7  # what the rebuild tests' publisher uses
SESSION_ID = 11
STREAM_ID = 22
DELAY_NS = 1_000
RETRY_NS = 5_000
SM_TIMEOUT_NS = 200_000_000
LIVENESS_NS = 10_000_000_000
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INITIAL_WINDOW_LENGTH_DEFAULT = lib.FULMAR_INITIAL_WINDOW_LENGTH_DEFAULT
STATUS_MESSAGE_TIMEOUT_DEFAULT_NS = lib.FULMAR_STATUS_MESSAGE_TIMEOUT_DEFAULT_NS
IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS = lib.FULMAR_IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS
SM_END_OF_STREAM_FLAG = lib.FULMAR_SM_EOS_FLAG


class PacketVerdict(Enum):
    """What became of a received datagram (FULMAR_VERDICT_*)."""

    DATA = "data"  # accepted (inserted, or already there)
    HEARTBEAT = "heartbeat"  # accepted, nothing to insert
    OVER_RUN = "over-run"  # beyond the window the last SM granted: dropped
    UNDER_RUN = "under-run"  # behind what the subscribers consumed: dropped
    INVALID = "invalid"  # malformed: dropped, nothing written


class StatusMessageToSend(NamedTuple):
    """A fulmar_sm_t: an SM for the receiver to send."""

    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    flags: int


class NakToSend(NamedTuple):
    """A fulmar_nak_t: a NAK for the receiver to send."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int


VERDICTS = {
    lib.FULMAR_VERDICT_DATA: PacketVerdict.DATA,
    lib.FULMAR_VERDICT_HEARTBEAT: PacketVerdict.HEARTBEAT,
    lib.FULMAR_VERDICT_OVER_RUN: PacketVerdict.OVER_RUN,
    lib.FULMAR_VERDICT_UNDER_RUN: PacketVerdict.UNDER_RUN,
    lib.FULMAR_VERDICT_INVALID: PacketVerdict.INVALID,
}


class NativeImage:
    """The C state: each method is one native call, its results turned into
    the Python types above."""

    def __init__(
        self,
        log: LogBuffers,
        active_term_id: int,
        term_offset: int,
        now_ns: int,
        *,
        delays: tuple[int, int] | None = None,
        initial_window_length: int = INITIAL_WINDOW_LENGTH_DEFAULT,
        status_message_timeout_ns: int = STATUS_MESSAGE_TIMEOUT_DEFAULT_NS,
        image_liveness_timeout_ns: int = IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS,
    ) -> None:
        self.log = log  # the mapping must outlive the state, which points into it
        self.s = ffi.new("fulmar_image_state_t *")
        result = lib.fulmar_image_state_init(
            self.s,
            log.address,
            log.term_length,
            log.initial_term_id,
            log.session_id,
            log.stream_id,
            active_term_id,
            term_offset,
            now_ns,
            initial_window_length,
            status_message_timeout_ns,
            image_liveness_timeout_ns,
        )
        if result != 0:
            raise ValueError(result)
        if delays is not None:
            assert lib.fulmar_image_state_use_static_delays(self.s, *delays) == 0
        self._sm = ffi.new("fulmar_sm_t *")
        self._nak = ffi.new("fulmar_nak_t *")

    def clone(self) -> NativeImage:
        """A copy of the state (over the same log), to try a call on."""
        other = object.__new__(NativeImage)
        other.log = self.log
        other.s = ffi.new("fulmar_image_state_t *")
        other.s[0] = self.s[0]
        other._sm = ffi.new("fulmar_sm_t *")
        other._nak = ffi.new("fulmar_nak_t *")
        return other

    def insert_packet(
        self, term_id: int, term_offset: int, datagram: bytes, now_ns: int, record_eos: bool = True
    ) -> PacketVerdict:
        return VERDICTS[
            lib.fulmar_image_state_insert_packet(
                self.s, term_id, term_offset, datagram, len(datagram), now_ns, int(record_eos)
            )
        ]

    def on_data(
        self,
        term_id: int,
        term_offset: int,
        length: int,
        now_ns: int,
        is_heartbeat: bool = False,
        is_eos: bool = False,
    ) -> PacketVerdict:
        return VERDICTS[
            lib.fulmar_image_state_on_data(self.s, term_id, term_offset, length, now_ns, int(is_heartbeat), int(is_eos))
        ]

    def request_status_message(self) -> None:
        lib.fulmar_image_state_request_status_message(self.s)

    def end_stream(self, position: int) -> None:
        lib.fulmar_image_state_end_stream(self.s, position)

    def rebuild(self, now_ns: int, subscriber_positions: Sequence[int]) -> int:
        positions = ffi.new("int64_t[]", list(subscriber_positions)) if subscriber_positions else ffi.NULL
        return int(lib.fulmar_image_state_rebuild(self.s, now_ns, positions, len(subscriber_positions)))

    def poll_status_message(self, now_ns: int) -> StatusMessageToSend | None:
        if not lib.fulmar_image_state_poll_status_message(self.s, now_ns, self._sm):
            return None
        sm = self._sm
        return StatusMessageToSend(
            sm.session_id,
            sm.stream_id,
            sm.consumption_term_id,
            sm.consumption_term_offset,
            sm.receiver_window,
            sm.flags,
        )

    def poll_nak(self) -> NakToSend | None:
        if not lib.fulmar_image_state_poll_nak(self.s, self._nak):
            return None
        nak = self._nak
        return NakToSend(nak.session_id, nak.stream_id, nak.term_id, nak.term_offset, nak.length)

    def is_timed_out(self, now_ns: int) -> bool:
        return bool(lib.fulmar_image_state_is_timed_out(self.s, now_ns))

    @property
    def next_deadline_ns(self) -> int:
        return int(lib.fulmar_image_state_next_deadline_ns(self.s))

    @property
    def is_end_of_stream(self) -> bool:
        return bool(lib.fulmar_image_state_is_end_of_stream(self.s))

    @property
    def has_gap(self) -> bool:
        return bool(lib.fulmar_image_state_has_gap(self.s))

    @property
    def end_of_stream_position(self) -> int | None:
        position = self.s.end_of_stream_position
        return None if position == -1 else position

    @property
    def packet_eos_position(self) -> int | None:
        position = self.s.packet_eos_position
        return None if position == -1 else position

    def __getattr__(self, name: str) -> Any:
        # Positions, the window and the counts are the struct's fields.
        return getattr(self.s, name)


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
    return (
        term_id,
        term_offset,
        DATA_HEADER.pack(0, 0, flags, FrameType.DATA, term_offset, SESSION_ID, STREAM_ID, term_id, 0),
    )


def create_log(path: Path, term_length: int = TERM) -> LogBuffers:
    return LogBuffers.create(
        path, term_length, initial_term_id=INITIAL_TERM_ID, session_id=SESSION_ID, stream_id=STREAM_ID
    )


@contextmanager
def fresh_logs(parent: Path, count: int = 1) -> Iterator[list[LogBuffers]]:
    """New logs for one hypothesis example, removed after it."""
    with tempfile.TemporaryDirectory(dir=parent) as directory, ExitStack() as stack:
        yield [stack.enter_context(create_log(Path(directory) / f"{i}.logbuffer")) for i in range(count)]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogBuffers]:
    with create_log(tmp_path / "image.logbuffer") as buffers:
        yield buffers


@pytest.fixture
def image(log: LogBuffers) -> NativeImage:
    return NativeImage(log, INITIAL_TERM_ID, 0, 0, delays=(DELAY_NS, RETRY_NS))


def test_constants_are_aerons() -> None:
    assert {
        lib.FULMAR_VERDICT_DATA,
        lib.FULMAR_VERDICT_HEARTBEAT,
        lib.FULMAR_VERDICT_OVER_RUN,
        lib.FULMAR_VERDICT_UNDER_RUN,
        lib.FULMAR_VERDICT_INVALID,
    } == {0, 1, 2, 3, 4}
    assert INITIAL_WINDOW_LENGTH_DEFAULT == 128 * 1024
    assert STATUS_MESSAGE_TIMEOUT_DEFAULT_NS == 200_000_000
    assert IMAGE_LIVENESS_TIMEOUT_DEFAULT_NS == 10_000_000_000
    # Aeron's STATUS_MESSAGE END_OF_STREAM flag, and the DATA header's.
    assert SM_END_OF_STREAM_FLAG == 0x40 and lib.FULMAR_DATA_EOS_FLAG == EOS_FLAG == 0x20


def test_the_first_status_message_is_due_at_once_then_every_timeout(image: NativeImage) -> None:
    assert image.poll_status_message(0) == StatusMessageToSend(SESSION_ID, STREAM_ID, INITIAL_TERM_ID, 0, WINDOW, 0)
    assert image.poll_status_message(0) is None
    assert image.poll_status_message(SM_TIMEOUT_NS) is None
    assert image.poll_status_message(SM_TIMEOUT_NS + 1) is not None
    assert image.poll_status_message(2 * SM_TIMEOUT_NS + 1) is None
    image.request_status_message()
    assert image.poll_status_message(2 * SM_TIMEOUT_NS + 2) is not None
    assert image.status_messages_sent == 3


def test_joining_mid_stream(log: LogBuffers) -> None:
    image = NativeImage(log, INITIAL_TERM_ID + 2, 4096, 50)
    assert image.hwm_position == image.rebuild_position == 2 * TERM + 4096
    assert image.poll_status_message(50) == StatusMessageToSend(
        SESSION_ID, STREAM_ID, INITIAL_TERM_ID + 2, 4096, WINDOW, 0
    )
    state = ffi.new("fulmar_image_state_t *")
    for term_id, offset, code in [
        (INITIAL_TERM_ID, 16, lib.FULMAR_IMAGE_BAD_TERM_OFFSET),
        (INITIAL_TERM_ID, TERM, lib.FULMAR_IMAGE_BAD_TERM_OFFSET),
        (INITIAL_TERM_ID, -32, lib.FULMAR_IMAGE_BAD_TERM_OFFSET),
        (INITIAL_TERM_ID - 1, 0, lib.FULMAR_IMAGE_BAD_TERM_ID),
    ]:
        assert (
            lib.fulmar_image_state_init(
                state,
                log.address,
                TERM,
                INITIAL_TERM_ID,
                SESSION_ID,
                STREAM_ID,
                term_id,
                offset,
                0,
                INITIAL_WINDOW_LENGTH_DEFAULT,
                SM_TIMEOUT_NS,
                LIVENESS_NS,
            )
            == code
        )
    for term_length in (0, -TERM, TERM + 32, 32 * 1024, 2**31 - 1):
        assert (
            lib.fulmar_image_state_init(
                state,
                log.address,
                term_length,
                INITIAL_TERM_ID,
                SESSION_ID,
                STREAM_ID,
                INITIAL_TERM_ID,
                0,
                0,
                INITIAL_WINDOW_LENGTH_DEFAULT,
                SM_TIMEOUT_NS,
                LIVENESS_NS,
            )
            == lib.FULMAR_IMAGE_BAD_TERM_LENGTH
        )


def test_receiver_window_is_half_a_term_at_most(tmp_path: Path) -> None:
    with LogBuffers.create(tmp_path / "big.logbuffer", 1024 * 1024) as big:
        assert NativeImage(big, 0, 0, 0).receiver_window_length == 128 * 1024
        assert NativeImage(big, 0, 0, 0, initial_window_length=16 * 1024).receiver_window_length == 16 * 1024
    with LogBuffers.create(tmp_path / "small.logbuffer", TERM) as small:
        assert NativeImage(small, 0, 0, 0).receiver_window_length == WINDOW


def test_a_status_message_follows_a_quarter_window_of_consumption(image: NativeImage) -> None:
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


def test_consumption_cleans_the_log_a_term_behind_the_slowest_subscriber(image: NativeImage, log: LogBuffers) -> None:
    log.view[0 : 2 * TERM] = b"\x01" * (2 * TERM)  # stands for received data
    image.rebuild(2, [TERM + 1024])
    assert image.clean_position == 1024
    assert bytes(log.view[0:1024]) == bytes(1024) and log.view[1024] == 1
    # A subscriber far ahead: every partition is cleaned, once, in bounded time.
    log.view[0 : 3 * TERM] = b"\x01" * (3 * TERM)
    image.rebuild(3, [2**40])
    assert image.clean_position == 2**40 - TERM
    assert bytes(log.view[0 : 3 * TERM]) == bytes(3 * TERM)


def test_data_is_inserted_and_read(image: NativeImage, log: LogBuffers) -> None:
    collector = Collector(log)
    assert image.insert_packet(*data(64), 10) is PacketVerdict.DATA
    assert image.insert_packet(*data(0), 11) is PacketVerdict.DATA
    assert image.hwm_position == 128
    image.rebuild(12, [collector.reader.position])
    assert image.rebuild_position == 128
    assert len(collector.read()) == 2
    assert image.insert_packet(*data(0), 13) is PacketVerdict.DATA  # a duplicate, already complete


def test_packets_beyond_the_window_are_dropped(image: NativeImage, log: LogBuffers) -> None:
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


def test_packets_behind_the_consumed_position_are_dropped(image: NativeImage) -> None:
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


def test_malformed_packets_are_invalid_and_change_nothing(image: NativeImage, log: LogBuffers) -> None:
    before = bytes(log.view)
    term_id, offset, datagram = data(128)
    assert image.insert_packet(term_id, offset, datagram[:40], 1) is PacketVerdict.INVALID  # truncated
    assert image.insert_packet(term_id, offset, datagram[:20], 1) is PacketVerdict.INVALID
    assert image.insert_packet(term_id, offset + 32, datagram, 1) is PacketVerdict.INVALID  # header disagrees
    assert image.insert_packet(term_id, -64, datagram, 1) is PacketVerdict.INVALID
    assert image.insert_packet(term_id, TERM, datagram, 1) is PacketVerdict.INVALID
    # The largest term offset an int32 holds is far outside the term.
    assert image.on_data(term_id, 2**31 - 1, 64, 1) is PacketVerdict.INVALID
    assert image.invalid_packets == 6
    assert bytes(log.view) == before
    assert image.hwm_position == 0
    assert image.is_timed_out(LIVENESS_NS + 1)  # none of them counted as a sign of life


def test_a_heartbeat_reveals_tail_loss_and_the_gap_is_naked(image: NativeImage) -> None:
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


def test_on_data_is_the_bookkeeping_without_the_bytes(image: NativeImage) -> None:
    assert image.on_data(INITIAL_TERM_ID, 0, 1024, 5) is PacketVerdict.DATA
    assert image.hwm_position == 1024
    assert image.on_data(INITIAL_TERM_ID, 2048, 0, 6, is_heartbeat=True, is_eos=True) is PacketVerdict.HEARTBEAT
    assert image.hwm_position == 2048 and image.end_of_stream_position == 2048
    assert not image.is_timed_out(6 + LIVENESS_NS)
    assert image.on_data(INITIAL_TERM_ID, 0, -1, 7) is PacketVerdict.INVALID
    assert image.invalid_packets == 1


def test_end_of_stream_once_everything_before_it_is_rebuilt(image: NativeImage, log: LogBuffers) -> None:
    image.poll_status_message(0)
    image.insert_packet(*data(64), 1)
    image.insert_packet(*heartbeat(128, eos=True), 2)
    assert image.end_of_stream_position == 128 == log.end_of_stream_position
    assert image.packet_eos_position == 128
    image.rebuild(3, [0])
    assert not image.is_end_of_stream
    assert image.poll_status_message(4) is None
    image.insert_packet(*data(0), 5)
    assert image.packet_eos_position is None
    image.rebuild(6, [0])
    assert image.is_end_of_stream
    # The sender hears at once, and from now on every status message says so.
    sm = image.poll_status_message(7)
    assert sm is not None and sm.flags == SM_END_OF_STREAM_FLAG
    sm = image.poll_status_message(8 + SM_TIMEOUT_NS)
    assert sm is not None and sm.flags == SM_END_OF_STREAM_FLAG


def test_an_eos_flagged_data_frame_ends_the_stream_after_it(image: NativeImage) -> None:
    image.insert_packet(*data(0, 96, flags=0xC0 | EOS_FLAG), 1)
    assert image.end_of_stream_position == 96
    image.rebuild(2, [0])
    assert image.is_end_of_stream


def test_an_eos_not_recorded_is_left_to_the_caller(image: NativeImage, log: LogBuffers) -> None:
    # The multi-destination rule: each source's EOS is reported, the image
    # ends when the caller says so, and only the first end counts.
    assert image.insert_packet(*heartbeat(128, eos=True), 1, record_eos=False) is PacketVerdict.HEARTBEAT
    assert image.packet_eos_position == 128 and image.end_of_stream_position is None
    assert log.end_of_stream_position == INT64_MAX
    assert image.insert_packet(*data(0, 96, flags=0xC0 | EOS_FLAG), 2, record_eos=False) is PacketVerdict.DATA
    assert image.packet_eos_position == 96 and image.end_of_stream_position is None
    assert image.insert_packet(*data(5 * TERM, flags=0xC0 | EOS_FLAG), 3, record_eos=False) is PacketVerdict.OVER_RUN
    assert image.packet_eos_position is None  # a dropped packet reports nothing
    image.end_stream(-1)  # not a position
    assert image.end_of_stream_position is None
    image.end_stream(128)
    image.end_stream(96)
    assert image.end_of_stream_position == 128 == log.end_of_stream_position
    assert log.metadata.get_int64(END_OF_STREAM_POSITION_OFFSET) == 128


def test_liveness(image: NativeImage) -> None:
    assert not image.is_timed_out(LIVENESS_NS)
    assert image.is_timed_out(LIVENESS_NS + 1)
    image.insert_packet(*heartbeat(0), 5_000_000_000)
    assert not image.is_timed_out(5_000_000_000 + LIVENESS_NS)
    assert image.is_timed_out(5_000_000_000 + LIVENESS_NS + 1)
    image.insert_packet(*data(TERM), 6_000_000_000)  # over-run: dropped, no sign of life
    assert image.is_timed_out(5_000_000_000 + LIVENESS_NS + 1)


# The deadline the driver thread sleeps to.


def test_the_deadline_of_the_periodic_status_message(image: NativeImage) -> None:
    assert image.next_deadline_ns == INT64_MIN  # the first SM is due at once
    image.poll_status_message(0)
    assert image.next_deadline_ns == SM_TIMEOUT_NS + 1
    assert image.poll_status_message(SM_TIMEOUT_NS) is None
    assert image.poll_status_message(SM_TIMEOUT_NS + 1) is not None
    assert image.next_deadline_ns == 2 * SM_TIMEOUT_NS + 2
    image.request_status_message()
    assert image.next_deadline_ns == INT64_MIN
    image.poll_status_message(SM_TIMEOUT_NS + 5)
    assert image.next_deadline_ns == 2 * SM_TIMEOUT_NS + 6


def test_the_deadline_of_liveness(log: LogBuffers) -> None:
    image = NativeImage(log, INITIAL_TERM_ID, 0, 0, status_message_timeout_ns=INT64_MAX, image_liveness_timeout_ns=1000)
    image.poll_status_message(0)
    assert image.next_deadline_ns == 1001
    assert not image.is_timed_out(1000) and image.is_timed_out(1001)
    image.insert_packet(*heartbeat(0), 500)
    assert image.next_deadline_ns == 1501
    assert not image.is_timed_out(1500) and image.is_timed_out(1501)
    # Neither due ever: never.
    image = NativeImage(
        log, INITIAL_TERM_ID, 0, 0, status_message_timeout_ns=INT64_MAX, image_liveness_timeout_ns=INT64_MAX
    )
    image.poll_status_message(0)
    assert image.next_deadline_ns == INT64_MAX
    assert image.poll_status_message(INT64_MAX) is None and not image.is_timed_out(INT64_MAX)


def test_the_deadline_of_a_gaps_nak(image: NativeImage) -> None:
    image.poll_status_message(0)
    image.insert_packet(*data(0), 0)
    image.insert_packet(*heartbeat(256), 0)
    image.rebuild(0, [0])
    assert image.has_gap and image.next_deadline_ns == DELAY_NS
    image.rebuild(DELAY_NS - 1, [0])
    assert image.poll_nak() is None and image.next_deadline_ns == DELAY_NS
    image.rebuild(DELAY_NS, [0])
    assert image.next_deadline_ns == INT64_MIN  # a NAK waits to be taken
    assert image.poll_nak() is not None
    assert image.next_deadline_ns == DELAY_NS + RETRY_NS
    image.rebuild(DELAY_NS + RETRY_NS - 1, [0])
    assert image.poll_nak() is None
    image.rebuild(DELAY_NS + RETRY_NS, [0])
    assert image.poll_nak() is not None
    # The gap filled: only the periodic deadlines are left.
    for position in (64, 128, 192):
        image.insert_packet(*data(position), 2 * DELAY_NS + RETRY_NS)
    image.rebuild(2 * DELAY_NS + RETRY_NS, [0])
    assert not image.has_gap and image.next_deadline_ns == SM_TIMEOUT_NS + 1


def test_no_nak_deadline_once_the_stream_has_ended(image: NativeImage) -> None:
    image.poll_status_message(0)
    image.insert_packet(*data(0), 0)
    image.insert_packet(*heartbeat(256), 0)
    image.rebuild(0, [0])
    assert image.next_deadline_ns == DELAY_NS
    image.end_stream(64)  # what is there is all there will be
    image.rebuild(1, [0])
    assert image.is_end_of_stream
    image.poll_status_message(1)
    assert image.next_deadline_ns == SM_TIMEOUT_NS + 2  # the gap's timer no longer runs
    image.rebuild(DELAY_NS, [0])
    assert image.poll_nak() is None


def settle(image: NativeImage, now_ns: int, positions: list[int]) -> None:
    """The end of a duty cycle: everything due at now_ns taken."""
    for _ in range(3):
        image.rebuild(now_ns, positions)
        image.poll_status_message(now_ns)
        image.poll_nak()


def due_at(image: NativeImage, now_ns: int, positions: list[int]) -> bool:
    """Whether a duty cycle at now_ns (on a copy) has something to do."""
    trial = image.clone()
    trial.rebuild(now_ns, positions)
    sm = trial.poll_status_message(now_ns)
    nak = trial.poll_nak()
    return sm is not None or nak is not None or trial.is_timed_out(now_ns)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["data", "heartbeat", "consume", "wait"]),
            st.integers(0, WINDOW // 64 - 1),
            st.integers(0, 3 * RETRY_NS),
        ),
        max_size=30,
    ),
    liveness_ns=st.sampled_from([LIVENESS_NS, 40_000, 3_000]),
    sm_timeout_ns=st.sampled_from([SM_TIMEOUT_NS, 20_000, 2_500]),
)
def test_nothing_is_due_before_the_deadline_and_something_is_at_it(
    tmp_path: Path, steps: list[tuple[str, int, int]], liveness_ns: int, sm_timeout_ns: int
) -> None:
    with fresh_logs(tmp_path) as [log]:
        image = NativeImage(
            log,
            INITIAL_TERM_ID,
            0,
            0,
            delays=(DELAY_NS, RETRY_NS),
            status_message_timeout_ns=sm_timeout_ns,
            image_liveness_timeout_ns=liveness_ns,
        )
        now_ns = 0
        positions = [0]
        for kind, slot, dt in steps:
            now_ns += dt
            if kind == "data":
                image.insert_packet(*data(slot * 64), now_ns)
            elif kind == "heartbeat":
                image.insert_packet(*heartbeat(slot * 64), now_ns)
            elif kind == "consume":
                positions = [min(slot * 64, image.rebuild_position)]
            settle(image, now_ns, positions)
            deadline = image.next_deadline_ns
            if image.is_timed_out(now_ns):
                # Liveness lapsed: its deadline has passed, the rest is the caller's.
                assert deadline <= now_ns
                continue
            assert deadline > now_ns
            d = image.s.loss_detector
            event("nak deadline" if d.gap_active and d.deadline_ns == deadline else "sm or liveness deadline")
            assert due_at(image, deadline, positions)
            assert not due_at(image, deadline - 1, positions)


# Hostile input.


def frame(
    term_id: int,
    term_offset: int,
    length: int,
    flags: int = 0xC0,
    frame_type: int = FrameType.DATA,
    on_wire: int | None = None,
    session_id: int = SESSION_ID,
    stream_id: int = STREAM_ID,
) -> bytes:
    header = DATA_HEADER.pack(length, 0, flags, frame_type, term_offset, session_id, stream_id, term_id, 0)
    # A frame claiming to be huge is sent cut short (the datagram stays small).
    size = min(max(32, (length + 31) & ~31), 1024) if on_wire is None else on_wire
    return header + bytes(max(0, size - 32))


int32 = st.integers(-(2**31), 2**31 - 1)
near_term_ids = st.integers(INITIAL_TERM_ID - 2, INITIAL_TERM_ID + 3)


@st.composite
def hostile_packets(draw: st.DrawFn, window_start: int) -> tuple[int, int, bytes, bool]:
    if draw(st.booleans()):
        # Somewhere about the window, so that the frame checks are reached.
        position = max(0, window_start + 32 * draw(st.integers(-64, TERM // 64 + 64)))
        term_id, term_offset = to_int32(INITIAL_TERM_ID + position // TERM), position % TERM
    else:
        term_id = draw(st.one_of(near_term_ids, int32))
        aligned = st.integers(0, TERM // 32 - 1).map(lambda k: k * 32)
        term_offset = draw(st.one_of(aligned, int32, st.integers(-64, TERM + 64)))
    shape = draw(st.sampled_from(["random", "frames", "long", "header", "heartbeat", "valid", "valid", "valid"]))
    if shape == "heartbeat":
        datagram = frame(term_id, term_offset, 0, draw(st.sampled_from([0xC0, 0xC0 | EOS_FLAG])))
    elif shape == "valid":
        # Well formed where it claims to be (the window decides), or one byte of it changed.
        datagram = b""
        offset = term_offset
        flags = draw(st.sampled_from([0xC0, 0xC0 | EOS_FLAG]))
        for length in draw(st.lists(st.integers(32, 400), min_size=1, max_size=3)):
            datagram += frame(term_id, to_int32(offset), length, flags)
            offset += (length + 31) & ~31
        if draw(st.booleans()) and 0 <= offset < TERM:
            # A padding frame to the term's end, sent as its header alone.
            datagram += frame(term_id, offset, TERM - offset, flags, FrameType.PAD, on_wire=32)
        if draw(st.booleans()):
            changed = bytearray(datagram)
            changed[draw(st.integers(0, len(changed) - 1))] = draw(st.integers(0, 255))
            datagram = bytes(changed)
    elif shape == "random":
        datagram = draw(st.binary(max_size=300))
    elif shape == "long":
        # Longer than the whole term, with a header that would pass.
        datagram = frame(term_id, term_offset, TERM + 64, on_wire=TERM + draw(st.sampled_from([32, 64, 4096])))
    elif shape == "header":
        datagram = DATA_HEADER.pack(
            draw(int32),
            0,
            draw(st.integers(0, 255)),
            draw(st.integers(-(2**15), 2**15 - 1)),
            draw(st.one_of(st.just(term_offset), int32)),
            draw(st.sampled_from([SESSION_ID, 0])),
            STREAM_ID,
            draw(st.one_of(st.just(term_id), int32)),
            0,
        ) + draw(st.binary(max_size=64))
    else:
        datagram = b""
        offset = term_offset
        for _ in range(draw(st.integers(1, 4))):
            length = draw(st.one_of(st.integers(0, 300), int32))
            frame_type = draw(st.sampled_from([FrameType.DATA, FrameType.PAD, 5]))
            flags = draw(st.sampled_from([0xC0, 0xC0 | EOS_FLAG, 0x80, 0]))
            on_wire = draw(st.one_of(st.none(), st.integers(0, 320)))
            datagram += frame(term_id, to_int32(offset), length, flags, frame_type, on_wire)
            offset += max(32, (length + 31) & ~31) if 0 <= length < 2**30 else 32
        cut = draw(st.integers(0, 40))
        datagram = datagram[: len(datagram) - cut] if draw(st.booleans()) else datagram
    return term_id, term_offset, datagram, draw(st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(consumed=st.integers(0, 3 * TERM // 32), draw_from=st.data())
def test_hostile_packets_never_write_outside_their_place(
    tmp_path: Path, consumed: int, draw_from: st.DataObject
) -> None:
    packets = draw_from.draw(st.lists(hostile_packets(consumed * 32), min_size=1, max_size=6))
    with fresh_logs(tmp_path) as [log]:
        image = NativeImage(log, INITIAL_TERM_ID, 0, 0)
        # A moved window makes over-runs, under-runs and stale heartbeats reachable.
        image.rebuild(0, [consumed * 32])
        image.poll_status_message(0)
        view = log.view
        meta_start = 3 * TERM
        for term_id, term_offset, datagram, record_eos in packets:
            before = bytes(view)
            verdict = image.insert_packet(term_id, term_offset, datagram, 1, record_eos)
            event(f"verdict {verdict.name}")
            after = bytes(view)
            changed = [i for i in range(0, len(before), 4096) if before[i : i + 4096] != after[i : i + 4096]]
            # Only the end of stream position of the metadata may change (an EOS flag).
            meta_before, meta_after = bytearray(before[meta_start:]), bytearray(after[meta_start:])
            eos = slice(END_OF_STREAM_POSITION_OFFSET, END_OF_STREAM_POSITION_OFFSET + 8)
            meta_before[eos] = meta_after[eos] = bytes(8)
            assert meta_before == meta_after
            terms_before, terms_after = before[:meta_start], after[:meta_start]
            if verdict is not PacketVerdict.DATA:
                assert terms_before == terms_after, verdict
            elif terms_before != terms_after:
                position = compute_position(term_id, term_offset, 16, INITIAL_TERM_ID)
                start = (position // TERM) % 3 * TERM + term_offset
                end = start + len(datagram)
                assert 0 <= term_offset and term_offset + len(datagram) <= TERM
                assert terms_before[:start] == terms_after[:start] and terms_before[end:] == terms_after[end:]
                assert changed
                event("written")
        assert image.invalid_packets + image.flow_control_over_runs + image.flow_control_under_runs <= len(packets)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    term_id=int32,
    term_offset=int32,
    length=int32,
    is_heartbeat=st.booleans(),
    is_eos=st.booleans(),
    positions=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
)
def test_absurd_values_neither_crash_nor_overflow(
    tmp_path: Path,
    term_id: int,
    term_offset: int,
    length: int,
    is_heartbeat: bool,
    is_eos: bool,
    positions: list[int],
) -> None:
    with fresh_logs(tmp_path) as [log]:
        image = NativeImage(log, INITIAL_TERM_ID, 0, 0)
        verdict = image.on_data(term_id, term_offset, length, 1, is_heartbeat, is_eos)
        if not (0 <= term_offset < TERM and length >= 0):
            assert verdict is PacketVerdict.INVALID
        image.rebuild(2, positions)
        sm = image.poll_status_message(3)
        assert sm is not None and 0 <= sm.consumption_term_offset < TERM
        # Positions stay where int64 arithmetic on them cannot overflow.
        for value in (image.hwm_position, image.rebuild_position, image.s.next_sm_position):
            assert 0 <= value <= TERM << 31
        assert image.next_deadline_ns > 3 or image.next_deadline_ns == INT64_MIN
        assert image.is_timed_out(INT64_MAX) and not image.is_timed_out(INT64_MIN)


# The C state on random packet sequences: its rules hold after every call.


@st.composite
def operations(draw: st.DrawFn) -> tuple[Any, ...]:
    kind = draw(
        st.sampled_from(
            [
                "data",
                "data",
                "data",
                "heartbeat",
                "corrupt",
                "on_data",
                "rebuild",
                "cycle",
                "cycle",
                "sm",
                "nak",
                "request",
                "end_stream",
                "tick",
            ]
        )
    )
    # Mostly within the first window (the join is in it), sometimes anywhere in three terms.
    slots = st.one_of(st.integers(0, TERM // 2 // 32), st.integers(0, TERM // 2 // 32), st.integers(0, 3 * TERM // 32))
    position = draw(slots.map(lambda k: k * 32))
    if kind == "data":
        count = draw(st.integers(1, 3))
        lengths = [draw(st.integers(32, 400)) for _ in range(count)]
        pad_last = draw(st.booleans()) and draw(st.booleans())
        flags = draw(st.sampled_from([0xC0, 0xC0, 0x80, 0x40, 0xC0 | EOS_FLAG]))
        return kind, position, lengths, pad_last, flags, draw(st.booleans())
    if kind == "heartbeat":
        return kind, position, draw(st.booleans()), draw(st.booleans())
    if kind == "corrupt":
        return kind, position, draw(st.sampled_from(["offset", "truncated", "type", "session", "term_offset"]))
    if kind == "on_data":
        return kind, position, draw(st.integers(-1, 2000)), draw(st.booleans()), draw(st.booleans())
    if kind == "rebuild":
        return kind, draw(st.lists(st.one_of(st.just(-1), slots.map(lambda k: k * 32)), max_size=3))
    if kind == "cycle":
        return kind, draw(st.sampled_from([1, DELAY_NS, RETRY_NS, SM_TIMEOUT_NS + 1]))
    if kind == "end_stream":
        return kind, position
    if kind == "tick":
        return kind, draw(st.sampled_from([1, DELAY_NS - 1, DELAY_NS, RETRY_NS, SM_TIMEOUT_NS + 1, 10**10]))
    return (kind,)


def build_datagram(position: int, lengths: list[int], pad_last: bool, flags: int) -> tuple[int, int, bytes]:
    term_count, term_offset = divmod(position, TERM)
    term_id = to_int32(INITIAL_TERM_ID + term_count)
    datagram = b""
    offset = term_offset
    for index, length in enumerate(lengths):
        if pad_last and index == len(lengths) - 1:
            # A padding frame to the term's end, sent as its header alone.
            datagram += frame(term_id, offset, TERM - offset, flags, FrameType.PAD, on_wire=32)
            break
        datagram += frame(term_id, offset, length, flags)
        offset += (length + 31) & ~31
    return term_id, term_offset, datagram


def corrupt(position: int, how: str) -> tuple[int, int, bytes]:
    term_id, term_offset, datagram = build_datagram(position, [128], False, 0xC0)
    if how == "offset":
        return term_id, term_offset + 16, datagram
    if how == "truncated":
        return term_id, term_offset, datagram[:100]
    if how == "type":
        return term_id, term_offset, datagram[:6] + struct.pack("<h", 3) + datagram[8:]
    if how == "session":
        return term_id, term_offset, datagram[:12] + struct.pack("<i", 99) + datagram[16:]
    return term_id, term_offset, datagram[:8] + struct.pack("<i", term_offset + 32) + datagram[12:]


COUNTER_OF_VERDICT = {
    PacketVerdict.HEARTBEAT: "heartbeats_received",
    PacketVerdict.OVER_RUN: "flow_control_over_runs",
    PacketVerdict.UNDER_RUN: "flow_control_under_runs",
    PacketVerdict.INVALID: "invalid_packets",
}
COUNTERS = (
    "heartbeats_received",
    "flow_control_over_runs",
    "flow_control_under_runs",
    "invalid_packets",
    "status_messages_sent",
    "naks_sent",
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(operations(), min_size=5, max_size=60),
    join_slot=st.integers(0, 4),
    window=st.sampled_from([4096, 2**17]),
)
def test_the_state_keeps_its_rules_on_any_sequence(
    tmp_path: Path, ops: list[tuple[Any, ...]], join_slot: int, window: int
) -> None:
    """After every call: the verdict counted once in its own counter, each SM
    and NAK taken counted, counters and positions never moving back, the
    window fixed, NAKs inside a term, the end of stream fixed once set (and in
    the log's metadata), and SMs saying end of stream only once the image has
    ended, and from then on always."""
    with fresh_logs(tmp_path) as [log]:
        join = join_slot * 4096
        image = NativeImage(log, INITIAL_TERM_ID, join, 0, delays=(DELAY_NS, RETRY_NS), initial_window_length=window)
        assert image.hwm_position == image.rebuild_position == join
        now_ns = 0
        eos_said = False
        for op in ops:
            kind = op[0]
            counts = {name: getattr(image, name) for name in COUNTERS}
            positions = (image.hwm_position, image.rebuild_position)
            end_of_stream = (image.is_end_of_stream, image.end_of_stream_position)
            expected = dict(counts)
            sm: StatusMessageToSend | None = None
            nak: NakToSend | None = None
            if kind in ("data", "heartbeat", "corrupt", "on_data"):
                if kind == "on_data":
                    term_count, term_offset = divmod(op[1], TERM)
                    verdict = image.on_data(
                        to_int32(INITIAL_TERM_ID + term_count), term_offset, op[2], now_ns, op[3], op[4]
                    )
                else:
                    if kind == "data":
                        packet, record_eos = build_datagram(*op[1:5]), op[5]
                    elif kind == "heartbeat":
                        packet, record_eos = heartbeat(op[1], op[2]), op[3]
                    else:
                        packet, record_eos = corrupt(op[1], op[2]), True
                    verdict = image.insert_packet(*packet, now_ns, record_eos)
                event(f"{kind}: {verdict.name}")
                if verdict in COUNTER_OF_VERDICT:
                    expected[COUNTER_OF_VERDICT[verdict]] += 1
            elif kind == "rebuild":
                image.rebuild(now_ns, op[1])
            elif kind == "cycle":
                # The driver's duty cycle, with a subscriber that reads all there is.
                now_ns += op[1]
                image.rebuild(now_ns, [image.rebuild_position])
                counts_after_rebuild = {name: getattr(image, name) for name in COUNTERS}
                assert counts_after_rebuild == counts
                sm, nak = image.poll_status_message(now_ns), image.poll_nak()
                event(f"cycle: sm {sm is not None}, nak {nak is not None}")
            elif kind == "sm":
                sm = image.poll_status_message(now_ns)
            elif kind == "nak":
                nak = image.poll_nak()
            elif kind == "request":
                image.request_status_message()
            elif kind == "end_stream":
                image.end_stream(op[1])
            else:
                now_ns += op[1]
                image.is_timed_out(now_ns)
            if sm is not None:
                expected["status_messages_sent"] += 1
                assert (sm.session_id, sm.stream_id, sm.receiver_window) == (
                    SESSION_ID,
                    STREAM_ID,
                    min(window, TERM // 2),
                )
                assert 0 <= sm.consumption_term_offset < TERM
                # End of stream only once the image has ended, and from the first such SM on, every one.
                assert sm.flags in (0, SM_END_OF_STREAM_FLAG)
                assert sm.flags == 0 or image.is_end_of_stream
                assert sm.flags == SM_END_OF_STREAM_FLAG or not eos_said
                eos_said = eos_said or sm.flags == SM_END_OF_STREAM_FLAG
                event("sm sent")
            if nak is not None:
                expected["naks_sent"] += 1
                assert (nak.session_id, nak.stream_id) == (SESSION_ID, STREAM_ID)
                assert 0 <= nak.term_offset and 0 < nak.length and nak.term_offset + nak.length <= TERM
                event("nak sent")
            assert {name: getattr(image, name) for name in COUNTERS} == expected, op
            assert image.hwm_position >= positions[0] and image.rebuild_position >= positions[1], op
            assert image.receiver_window_length == min(window, TERM // 2)
            if end_of_stream[1] is not None:
                assert image.end_of_stream_position == end_of_stream[1], op  # only the first end counts
            if end_of_stream[0]:
                assert image.is_end_of_stream
            eos_position = image.end_of_stream_position
            assert log.end_of_stream_position == (INT64_MAX if eos_position is None else eos_position)
        event(f"rebuilt past the join: {image.rebuild_position > join}; end of stream: {image.is_end_of_stream}")


# A whole stream.


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

    image = NativeImage(log, INITIAL_TERM_ID, 0, 0, delays=(20_000, 200_000))
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
                for offset, datagram in sender_datagrams(
                    term, message.term_offset, message.term_offset + message.length
                ):
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
