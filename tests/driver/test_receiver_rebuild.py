"""Rebuilding an image's log from datagrams: in order, out of order,
duplicated, overlapping; gap scanning; hostile datagrams never crash and
never write outside their place in the term."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FORK
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fulmar.driver.term_rebuilder import InsertRejected, contiguous_end, insert_packet, scan_for_gap, scan_term
from fulmar.frames import DATA_HEADER, HEADER_LENGTH, FrameType, align
from fulmar.log_reader import Header, LogReader
from fulmar.logbuffer import LogBuffers
from support.receiver import (
    FIRST_WORD,
    INITIAL_TERM_ID,
    SESSION_ID,
    STREAM_ID,
    TERM,
    Collector,
    datagram_frame_offsets,
    frames_of,
    payload_for,
    publish_terms,
    sender_datagrams,
)


def expected_contiguous_end(frames: list[tuple[int, int, int]], received: set[int]) -> int:
    end = 0
    for offset, aligned, _ in frames:
        if offset not in received:
            break
        end = offset + aligned
    return end


@pytest.fixture(scope="module")
def source_terms(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    rng = random.Random(5)
    # Small and fragmented messages, enough to fill the first term (its end
    # is padding) and go on into the second.
    sizes = [rng.choice([0, 1, 100, 500, 1400, 3000]) for _ in range(120)]
    return publish_terms(tmp_path_factory.mktemp("source"), sizes)


@pytest.fixture
def image_log(tmp_path: Path) -> Iterator[LogBuffers]:
    with LogBuffers.create(
        tmp_path / "image.logbuffer", TERM, initial_term_id=INITIAL_TERM_ID, session_id=SESSION_ID, stream_id=STREAM_ID
    ) as log:
        yield log


def test_sender_model_produces_padding_and_two_terms(source_terms: list[bytes]) -> None:
    # The fixtures below rely on this shape of stream.
    assert len(source_terms) == 2
    last = frames_of(source_terms[0])[-1]
    assert last[2] == FrameType.PAD and last[0] + last[1] == TERM
    # The last datagram ends with the padding frame's header alone.
    offset, datagram = sender_datagrams(source_terms[0])[-1]
    pad_length, _, _, pad_type = FIRST_WORD.unpack_from(datagram, len(datagram) - HEADER_LENGTH)
    assert (pad_type, offset + len(datagram) - HEADER_LENGTH + pad_length) == (FrameType.PAD, TERM)


def test_in_order_insertion_rebuilds_the_publisher_log(image_log: LogBuffers, source_terms: list[bytes]) -> None:
    collector = Collector(image_log)
    for term_count, term in enumerate(source_terms):
        partition = term_count % 3
        for offset, datagram in sender_datagrams(term):
            assert insert_packet(image_log, partition, offset, datagram) >= 1
        base = partition * TERM
        # Byte for byte what the publisher wrote, except the body of the
        # padding frame, which the sender never transmits.
        frames = frames_of(term)
        data_end = frames[-1][0] + (HEADER_LENGTH if frames[-1][2] == FrameType.PAD else frames[-1][1])
        assert bytes(image_log.view[base : base + data_end]) == term[:data_end]
    assert contiguous_end(image_log, 0, 0, TERM) == TERM  # the padding covers the term's end
    assert len(collector.read()) == 120 and collector.in_order()


def test_out_of_order_is_invisible_until_the_gap_fills(image_log: LogBuffers, source_terms: list[bytes]) -> None:
    datagrams = sender_datagrams(source_terms[0])
    collector = Collector(image_log)
    for offset, datagram in reversed(datagrams[1:]):
        insert_packet(image_log, 0, offset, datagram)
    assert collector.read() == [] and collector.reader.position == 0
    assert contiguous_end(image_log, 0, 0, TERM) == 0
    assert scan_for_gap(image_log, 0, 0, TERM) == (0, datagrams[1][0])

    insert_packet(image_log, 0, *datagrams[0])
    assert contiguous_end(image_log, 0, 0, TERM) == TERM
    assert collector.read() and collector.in_order()
    assert collector.reader.position == TERM


def test_duplicates_and_overlapping_resends_write_nothing_twice(
    image_log: LogBuffers, source_terms: list[bytes]
) -> None:
    term = source_terms[0]
    big = sender_datagrams(term, mtu=8192)
    small = sender_datagrams(term, mtu=256)
    assert len(small) > len(big) > 2
    offset, datagram = big[1]
    assert insert_packet(image_log, 0, offset, datagram) == len(datagram_frame_offsets(datagram)) > 1
    assert insert_packet(image_log, 0, offset, datagram) == 0  # a duplicate
    before = bytes(image_log.view[:TERM])
    # Resent with other boundaries: frames inside big[1] are already there;
    # only the ones outside it are new.
    new_frames = 0
    for small_offset, small_datagram in small:
        new_frames += insert_packet(image_log, 0, small_offset, small_datagram)
    inside = [f for f in frames_of(term) if offset <= f[0] < offset + len(datagram)]
    assert new_frames == len(frames_of(term)) - len(inside)
    after = bytes(image_log.view[:TERM])
    assert after[offset : offset + len(datagram)] == before[offset : offset + len(datagram)]
    assert contiguous_end(image_log, 0, 0, TERM) == TERM


def test_a_datagram_overlapping_received_frames_fills_only_the_missing_ones(
    image_log: LogBuffers, source_terms: list[bytes]
) -> None:
    term = source_terms[0]
    frames = frames_of(term)
    # Receive frames 0 and 2; then one datagram covering frames 0..3.
    for index in (0, 2):
        offset, aligned, _ = frames[index]
        assert insert_packet(image_log, 0, offset, term[offset : offset + aligned]) == 1
    end = frames[3][0] + frames[3][1]
    assert insert_packet(image_log, 0, 0, term[:end]) == 2
    assert bytes(image_log.view[:end]) == term[:end]
    assert contiguous_end(image_log, 0, 0, TERM) == end


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_order_with_duplicates_rebuilds_the_same_bytes(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    sizes = data.draw(st.lists(st.integers(0, 2500), min_size=1, max_size=30), label="sizes")
    directory = tmp_path_factory.mktemp("perm")
    (term,) = publish_terms(directory, sizes)
    frames = frames_of(term)
    mtus = data.draw(st.lists(st.sampled_from([64, 256, 1408, 4096]), min_size=1, max_size=3), label="mtus")
    datagrams = [d for mtu in mtus for d in sender_datagrams(term, mtu=mtu)]
    extra = data.draw(st.lists(st.sampled_from(datagrams), max_size=10), label="duplicates")
    order = data.draw(st.permutations(datagrams + extra), label="order")

    with LogBuffers.create(
        directory / "image.logbuffer", TERM, initial_term_id=INITIAL_TERM_ID, session_id=SESSION_ID, stream_id=STREAM_ID
    ) as log:
        received: set[int] = set()
        collector = Collector(log)
        for offset, datagram in order:
            assert insert_packet(log, 0, offset, datagram) >= 0
            received.update(offset + frame_offset for frame_offset in datagram_frame_offsets(datagram))
            # The rebuild position moves exactly to the first missing frame,
            # and a reader sees a prefix of the stream, in order.
            assert contiguous_end(log, 0, 0, TERM) == expected_contiguous_end(frames, received)
            collector.read()
            assert collector.in_order()
        assert bytes(log.view[:TERM]) == term
        assert collector.messages == [payload_for(i, size) for i, size in enumerate(sizes)]


def test_gap_scanner_reports_the_first_gap_up_to_the_next_frame(
    image_log: LogBuffers, source_terms: list[bytes]
) -> None:
    term = source_terms[0]
    frames = frames_of(term)
    insert = (
        lambda index: insert_packet(  # noqa: E731
            image_log, 0, frames[index][0], term[frames[index][0] : frames[index][0] + frames[index][1]]
        )
    )
    assert scan_for_gap(image_log, 0, 0, 4096) == (0, 4096)  # nothing yet: all gap up to the limit
    # The smallest gap: one 32-byte frame (an empty message) missing.
    insert_packet(image_log, 1, 0, frame(32, 0))
    insert_packet(image_log, 1, 64, frame(32, 64))
    assert scan_term(image_log, 1, 0, TERM) == (32, 32)
    insert(0)
    insert(3)
    insert(5)
    gap_start = frames[1][0]
    assert scan_term(image_log, 0, 0, TERM) == (gap_start, frames[3][0] - gap_start)
    assert contiguous_end(image_log, 0, 0, TERM) == gap_start
    # A limit inside the gap bounds it; a limit at the gap means no gap.
    assert scan_for_gap(image_log, 0, 0, gap_start + 64) == (gap_start, 64)
    assert scan_for_gap(image_log, 0, 0, gap_start) is None
    # Scanning from a frame after the gap finds the second gap.
    assert scan_for_gap(image_log, 0, frames[3][0], TERM) == (frames[4][0], frames[5][0] - frames[4][0])
    insert(1)
    insert(2)
    assert contiguous_end(image_log, 0, 0, TERM) == frames[4][0]


def test_scan_arguments_are_checked(image_log: LogBuffers) -> None:
    for partition, offset in [(3, 0), (-1, 0), (0, 16), (0, -32), (0, TERM + 32)]:
        with pytest.raises(ValueError):
            scan_term(image_log, partition, offset, TERM)
    assert scan_term(image_log, 1, TERM, TERM) == (TERM, 0)  # the end of a term is a valid place to stand


def frame(
    frame_length: int,
    term_offset: int,
    frame_type: int = FrameType.DATA,
    term_id: int = INITIAL_TERM_ID,
    session_id: int = SESSION_ID,
    stream_id: int = STREAM_ID,
    body: int | None = None,
) -> bytes:
    """A frame as sent: header plus the aligned body (or ``body`` bytes)."""
    header = DATA_HEADER.pack(frame_length, 0, 0xC0, frame_type, term_offset, session_id, stream_id, term_id, 0)
    size = align(frame_length, 32) - HEADER_LENGTH if body is None else body
    return header + b"\xab" * max(0, size)


@pytest.mark.parametrize(
    ("partition", "term_offset", "datagram", "code"),
    [
        (3, 0, frame(64, 0), InsertRejected.BAD_PARTITION),
        (-1, 0, frame(64, 0), InsertRejected.BAD_PARTITION),
        (0, 16, frame(64, 16), InsertRejected.BAD_TERM_OFFSET),
        (0, -32, frame(64, -32), InsertRejected.BAD_TERM_OFFSET),
        (0, TERM, frame(64, TERM), InsertRejected.BAD_TERM_OFFSET),
        (0, 0, frame(64, 0)[:31], InsertRejected.BAD_LENGTH),  # shorter than a header
        (0, 0, frame(0, 0, body=0), InsertRejected.BAD_LENGTH),  # a heartbeat
        (0, 0, frame(100, 0, body=40), InsertRejected.BAD_LENGTH),  # truncated frame
        (0, 0, frame(64, 0) + b"\0" * 8, InsertRejected.BAD_LENGTH),  # trailing bytes
        (0, 0, frame(16, 0, body=0), InsertRejected.BAD_LENGTH),  # length shorter than its header
        (0, TERM - 64, frame(96, TERM - 64), InsertRejected.OVERRUNS_TERM),
        (0, TERM - 32, frame(32, TERM - 32) + frame(32, TERM), InsertRejected.OVERRUNS_TERM),
        (0, TERM - 64, frame(4096, TERM - 64, FrameType.PAD, body=0), InsertRejected.OVERRUNS_TERM),
        (0, 0, frame(2**31 - 1, 0, body=0), InsertRejected.OVERRUNS_TERM),
        (0, 0, frame(64, 0, frame_type=FrameType.SM), InsertRejected.BAD_FRAME),
        (0, 0, frame(64, 32), InsertRejected.BAD_FRAME),  # header names another offset
        (0, 0, frame(64, 0) + frame(64, 64, term_id=8), InsertRejected.BAD_FRAME),
        (0, 0, frame(64, 0) + frame(64, 64, session_id=1), InsertRejected.BAD_FRAME),
        (0, 0, frame(64, 0) + frame(64, 64, stream_id=1), InsertRejected.BAD_FRAME),
        # Padding sent as its header alone must end the datagram.
        (0, 0, frame(4096, 0, FrameType.PAD, body=0) + frame(64, 32), InsertRejected.BAD_LENGTH),
    ],
)
def test_malformed_datagrams_are_rejected_and_write_nothing(
    image_log: LogBuffers, partition: int, term_offset: int, datagram: bytes, code: InsertRejected
) -> None:
    before = bytes(image_log.view)
    assert insert_packet(image_log, partition, term_offset, datagram) == code
    assert bytes(image_log.view) == before


def test_padding_sent_as_its_header_completes_the_term(image_log: LogBuffers) -> None:
    pad_length = TERM - 1024
    assert insert_packet(image_log, 1, 1024, frame(pad_length, 1024, FrameType.PAD, body=0)) == 1
    assert insert_packet(image_log, 1, 0, frame(1024, 0)) == 1
    assert contiguous_end(image_log, 1, 0, 1024 + 32) == TERM  # past the limit: to the end of the term
    assert scan_for_gap(image_log, 1, 0, TERM) is None
    # A whole padding frame is accepted too.
    assert insert_packet(image_log, 2, TERM - 128, frame(128, TERM - 128, FrameType.PAD)) == 1


def test_unaligned_datagram_buffers_and_memoryviews(image_log: LogBuffers) -> None:
    datagram = frame(37, 0) + frame(64, 64)
    buffer = bytearray(3) + bytearray(datagram)
    assert insert_packet(image_log, 0, 0, memoryview(buffer)[3:]) == 2
    assert bytes(image_log.view[: len(datagram)]) == datagram


ABSURD_INTS = [-(2**63), -(2**31), -1, 0, 1, 31, 32, 2**31 - 1, 2**31, 2**40, TERM - 32, TERM, 3 * TERM]


@st.composite
def hostile_datagram(draw: st.DrawFn, term_offset: int) -> bytes:
    """Frames that are mostly plausible for their place (so some are
    inserted) with lengths, types, ids and bodies that are sometimes wrong."""

    def mostly(right: int, wrong: st.SearchStrategy[int]) -> int:
        return right if draw(st.integers(0, 4)) else draw(wrong)

    any_int32 = st.integers(-(2**31), 2**31 - 1)
    datagram = b""
    for _ in range(draw(st.integers(1, 4))):
        frame_length = mostly(
            draw(st.sampled_from([32, 33, 64, 100, 1408])),
            st.one_of(st.sampled_from([0, 31, TERM, -32, 2**31 - 1]), any_int32),
        )
        field_offset = mostly(term_offset + len(datagram) if -(2**31) <= term_offset < 2**31 - TERM else 0, any_int32)
        frame_type = mostly(1, st.sampled_from([0, 3, -1]))
        term_id = mostly(INITIAL_TERM_ID, any_int32)
        body = mostly(align(max(frame_length, 32), 32) - 32, st.sampled_from([0, 5, 32, 1376]))
        header = DATA_HEADER.pack(frame_length, 0, 0xC0, frame_type, field_offset, SESSION_ID, STREAM_ID, term_id, 0)
        datagram += header + b"\xcd" * min(body, 4096)
    return datagram


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    partition=st.sampled_from([0, 1, 2] * 10 + ABSURD_INTS),
    term_offset=st.sampled_from([0, 32, 64, 4096, TERM - 64, TERM - 32] * 4 + ABSURD_INTS),
    data=st.data(),
)
def test_garbage_never_crashes_nor_writes_outside_its_place(
    image_log: LogBuffers, partition: int, term_offset: int, data: st.DataObject
) -> None:
    datagram = data.draw(st.one_of(st.binary(max_size=2048), hostile_datagram(term_offset)), label="datagram")
    view = image_log.view
    # Poison everything so any stray write shows, but leave the target slot
    # region empty so an insert is possible.
    view[:] = b"\x5a" * len(view)
    if 0 <= partition < 3 and 0 <= term_offset < TERM:
        start = partition * TERM + term_offset
        view[start : (partition + 1) * TERM] = bytes((partition + 1) * TERM - start)
    before = bytes(view)
    result = insert_packet(image_log, partition, term_offset, datagram)
    after = bytes(view)
    event(InsertRejected(result).name if result < 0 else "inserted")
    if result < 0:
        assert isinstance(result, InsertRejected)
        assert after == before
        return
    assert result >= 1
    start = partition * TERM + term_offset
    assert after[:start] == before[:start]
    assert after[start + len(datagram) :] == before[start + len(datagram) :]
    assert start + len(datagram) <= (partition + 1) * TERM


def _insert_in_order(path: str, term: bytes) -> None:
    """Child process: insert one term's datagrams in order, so every frame is
    published right where the reader is waiting."""
    log = LogBuffers.open(path)
    for offset, datagram in sender_datagrams(term, mtu=512):
        insert_packet(log, 0, offset, datagram)
        time.sleep(0.0001)
    log.close()


@pytest.mark.system
@pytest.mark.system
def test_a_concurrent_reader_only_ever_sees_whole_frames(
    image_log: LogBuffers, source_terms: list[bytes], child_processes: list
) -> None:
    term = source_terms[0]
    expected = len([f for f in frames_of(term) if f[2] == FrameType.DATA])
    writer = FORK.Process(target=_insert_in_order, args=(str(image_log.path), term))
    child_processes.append(writer)
    reader = LogReader(image_log)
    writer.start()
    fragments = 0
    torn: list[int] = []
    deadline = time.monotonic() + 20

    def check(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        nonlocal fragments
        frame_start = offset - HEADER_LENGTH
        term_offset = frame_start  # partition 0: log offsets are term offsets
        if bytes(buffer[frame_start : offset + length]) != term[term_offset : term_offset + HEADER_LENGTH + length]:
            torn.append(term_offset)
        fragments += 1

    while fragments < expected and not torn and time.monotonic() < deadline:
        reader.poll(check, 100)
    writer.join(timeout=20)
    assert torn == []
    assert fragments == expected
