"""Log buffer layout, position arithmetic, append edge cases, and reading."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fulmar.buffers import MappedFile
from fulmar.errors import InvalidLogBufferError, MessageTooLongError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.frames import BEGIN_FLAG, END_FLAG, UNFRAGMENTED, FrameType, decode_data_header
from fulmar.log_reader import Header, LogReader, SessionMessages
from fulmar.log_writer import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    BufferClaim,
    ConcurrentLogWriter,
    ExclusiveLogWriter,
)
from fulmar.logbuffer import (
    ACTIVE_TERM_COUNT_OFFSET,
    LogBuffers,
    check_term_length,
    compute_log_length,
    compute_position,
    compute_term_id_from_position,
    compute_term_offset_from_position,
    index_by_position,
    index_by_term,
    pack_tail,
    position_bits_to_shift,
    to_int32,
)

TERM = 64 * 1024
INT32_MAX = 2**31 - 1
WRITERS = [ExclusiveLogWriter, ConcurrentLogWriter]


def offer(writer: ExclusiveLogWriter | ConcurrentLogWriter, payload: bytes, reserved: int = 0) -> int:
    """Offer, retrying the one ADMIN_ACTION that a term rotation returns."""
    result = writer.offer(payload, reserved)
    if result == ADMIN_ACTION:
        result = writer.offer(payload, reserved)
    return result


def drain(reader: LogReader) -> list[tuple[bytes, int, int]]:
    """All whole messages available, with each one's flags and reserved value."""
    messages: list[tuple[bytes, int, int]] = []

    def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        messages.append((bytes(buffer[offset : offset + length]), header.flags, header.reserved_value))

    assembler = FragmentAssembler(on_message)
    while reader.poll(assembler, 100):
        pass
    return messages


@pytest.fixture
def log(tmp_path: Path):
    buffers = LogBuffers.create(tmp_path / "test.logbuffer", TERM, session_id=0x1234, stream_id=77, initial_term_id=5)
    buffers.is_connected = True
    yield buffers
    buffers.close()


@pytest.mark.parametrize("bad", [0, 1000, 32 * 1024, 3 * 64 * 1024, 2 * 1024**3, -65536])
def test_term_length_must_be_power_of_two_in_range(bad: int) -> None:
    with pytest.raises(InvalidLogBufferError, match="power of two"):
        check_term_length(bad)


def test_term_length_bounds_accepted() -> None:
    check_term_length(64 * 1024)
    check_term_length(1024**3)


def test_file_layout_matches_aeron(log: LogBuffers) -> None:
    raw = bytes(log.view)
    assert len(raw) == compute_log_length(TERM) == 3 * TERM + 4096
    meta = 3 * TERM
    initial_term_id, header_length, mtu, term_length, page_size = struct.unpack_from("<iiiii", raw, meta + 264)
    assert (initial_term_id, header_length, mtu, term_length, page_size) == (5, 32, 1408, TERM, 4096)
    # Tail counters: partition 0 at the initial term, the others "three terms before".
    tails = struct.unpack_from("<qqq", raw, meta)
    assert tails == (pack_tail(5, 0), pack_tail(3, 0), pack_tail(4, 0))
    assert struct.unpack_from("<i", raw, meta + 24)[0] == 0
    # The default frame header: DATA, unfragmented, our session and stream.
    header = decode_data_header(raw, meta + 320)
    assert (header.flags, header.type, header.session_id, header.stream_id) == (UNFRAGMENTED, 1, 0x1234, 77)


def test_frame_bytes_match_aeron_layout(log: LogBuffers) -> None:
    writer = ExclusiveLogWriter(log)
    assert writer.offer(b"hello", reserved_value=-2) == 64
    raw = bytes(log.view[0:64])
    assert raw[:32] == struct.pack("<iBBhiiiiq", 37, 0, 0xC0, 1, 0, 0x1234, 77, 5, -2)
    assert raw[32:37] == b"hello" and raw[37:64] == bytes(27)


def test_open_rejects_wrong_length_and_garbage(tmp_path: Path, log: LogBuffers) -> None:
    truncated = tmp_path / "truncated.logbuffer"
    truncated.write_bytes(bytes(log.view)[: 3 * TERM + 1000])
    with pytest.raises(InvalidLogBufferError):
        LogBuffers.open(truncated)
    garbage = tmp_path / "garbage.logbuffer"
    garbage.write_bytes(b"\xff" * (3 * TERM + 4096))
    with pytest.raises(InvalidLogBufferError, match="no valid term length"):
        LogBuffers.open(garbage)
    reopened = LogBuffers.open(log.path)
    assert (reopened.term_length, reopened.initial_term_id, reopened.mtu) == (TERM, 5, 1408)
    reopened.close()


@given(
    initial_term_id=st.integers(-(2**31), INT32_MAX),
    term_count=st.integers(0, 2**31 - 1),
    bits=st.integers(16, 30),
    offset_fraction=st.floats(0, 1, exclude_max=True),
)
def test_position_arithmetic_round_trips_with_term_id_wrap(
    initial_term_id: int, term_count: int, bits: int, offset_fraction: float
) -> None:
    term_length = 1 << bits
    term_offset = int(offset_fraction * term_length) & ~31
    term_id = to_int32(initial_term_id + term_count)
    position = compute_position(term_id, term_offset, bits, initial_term_id)
    assert position == (term_count << bits) + term_offset
    assert compute_term_id_from_position(position, bits, initial_term_id) == term_id
    assert compute_term_offset_from_position(position, bits) == term_offset
    assert index_by_position(position, bits) == index_by_term(initial_term_id, term_id) == term_count % 3


def test_term_id_wrap_keeps_positions_increasing() -> None:
    bits = position_bits_to_shift(TERM)
    assert compute_position(-(2**31), 0, bits, INT32_MAX) == TERM
    assert compute_position(-(2**31) + 1, 32, bits, INT32_MAX) == 2 * TERM + 32


@pytest.mark.parametrize("writer_class", WRITERS)
def test_padding_fills_term_end_and_next_term_starts_at_zero(log: LogBuffers, writer_class: type) -> None:
    writer = writer_class(log)
    reader = LogReader(log)
    payload = bytes(range(256)) * 4  # 1 KiB + 32 header = 1056 bytes a frame
    positions = []
    while True:
        result = writer.offer(payload)
        if result == ADMIN_ACTION:
            break
        positions.append(result)
    frames = len(positions)
    tail = frames * 1056
    assert tail <= TERM < tail + 1056
    padding = decode_data_header(log.view, tail)
    assert padding.type == FrameType.PAD and padding.frame_length == TERM - tail
    assert log.active_term_count() == 1
    # The retried message lands at offset 0 of partition 1, with the next term id.
    assert writer.offer(payload) == TERM + 1056
    first = decode_data_header(log.view, TERM)
    assert (first.term_offset, first.term_id, first.frame_length) == (0, 6, 1056)
    assert [m[0] for m in drain(reader)] == [payload] * (frames + 1)
    assert reader.position == TERM + 1056


@pytest.mark.parametrize("writer_class", WRITERS)
def test_fragmentation_and_reassembly(log: LogBuffers, writer_class: type) -> None:
    writer = writer_class(log)
    message = bytes(i % 251 for i in range(int(3.5 * log.max_payload_length)))
    assert offer(writer, message, reserved=99) > 0
    headers = []
    offset = 0
    for _ in range(4):
        header = decode_data_header(log.view, offset)
        headers.append(header)
        offset += (header.frame_length + 31) & ~31
    assert decode_data_header(log.view, offset).frame_length == 0  # nothing after the END fragment
    assert [h.flags for h in headers] == [BEGIN_FLAG, 0, 0, END_FLAG]
    assert [h.frame_length for h in headers] == [1408, 1408, 1408, 32 + len(message) - 3 * 1376]
    assert [h.term_offset for h in headers] == [0, 1408, 2816, 4224]
    assert all(h.reserved_value == 99 for h in headers)
    assert drain(LogReader(log)) == [(message, END_FLAG, 99)]


@pytest.mark.parametrize("writer_class", WRITERS)
def test_max_message_length_is_enforced(log: LogBuffers, writer_class: type) -> None:
    writer = writer_class(log)
    assert log.max_message_length == TERM // 8
    assert offer(writer, bytes(TERM // 8)) > 0
    with pytest.raises(MessageTooLongError, match="8193 bytes exceeds"):
        writer.offer(bytes(TERM // 8 + 1))
    with pytest.raises(MessageTooLongError):
        writer.try_claim(log.max_payload_length + 1, BufferClaim(log))
    assert [len(m[0]) for m in drain(LogReader(log))] == [TERM // 8]


@pytest.mark.parametrize("writer_class", WRITERS)
def test_claim_commit_and_abort(log: LogBuffers, writer_class: type) -> None:
    writer = writer_class(log)
    claim = BufferClaim(log)
    assert writer.try_claim(5, claim) == 64
    claim.buffer[:] = b"first"
    reader = LogReader(log)
    assert drain(reader) == []  # not committed yet: invisible
    claim.commit()
    assert writer.try_claim(6, claim) == 128
    claim.buffer[:] = b"junked"
    claim.abort()
    assert offer(writer, b"third") == 192
    assert [m[0] for m in drain(reader)] == [b"first", b"third"]


@pytest.mark.parametrize("writer_class", WRITERS)
def test_back_pressure_and_not_connected(tmp_path: Path, log: LogBuffers, writer_class: type) -> None:
    limit = MappedFile.create(tmp_path / "limit", 4096)
    counter = limit.buffer()
    counter.put_int64_ordered(0, 128)
    writer = writer_class(log, counter, 0)
    assert writer.offer(bytes(32)) == 64
    assert writer.offer(bytes(32)) == 128
    assert writer.offer(bytes(32)) == BACK_PRESSURED
    log.is_connected = False
    assert writer.offer(bytes(32)) == NOT_CONNECTED
    counter.put_int64_ordered(0, 1024)
    assert writer.offer(bytes(32)) == 192
    limit.close()


@pytest.mark.parametrize("writer_class", WRITERS)
def test_max_position_exceeded_in_the_last_term(log: LogBuffers, writer_class: type) -> None:
    # Put the log at its last possible term: term count 2**31 - 1.
    last_count = 2**31 - 1
    partition = last_count % 3
    log.metadata.put_int64_ordered(8 * partition, pack_tail(to_int32(5 + last_count), 0))
    log.metadata.put_int32_ordered(ACTIVE_TERM_COUNT_OFFSET, last_count)
    writer = writer_class(log)
    results = [writer.offer(bytes(4000)) for _ in range(TERM // 4032 + 2)]
    assert results[-1] == MAX_POSITION_EXCEEDED
    assert all(r > 0 for r in results[: TERM // 4032])


def test_batch_append_crosses_terms_and_stops_at_limit(tmp_path: Path, log: LogBuffers) -> None:
    limit = MappedFile.create(tmp_path / "limit", 4096)
    counter = limit.buffer()
    counter.put_int64_ordered(0, TERM + 10_000)
    writer = ExclusiveLogWriter(log, counter, 0)
    payloads = [bytes([i % 256]) * (i % 700) for i in range(400)]
    appended, position = writer.offer_batch(payloads)
    assert 0 < appended < 400 and position >= TERM + 10_000
    reader = LogReader(log)
    assert [m[0] for m in drain(reader)] == payloads[:appended]
    counter.put_int64_ordered(0, 10 * TERM)
    rest, _ = writer.offer_batch(payloads[appended:])
    assert rest == 400 - appended
    assert [m[0] for m in drain(reader)] == payloads[appended:]
    limit.close()


def test_bounded_poll_stops_at_limit_and_scan_returns_batches(log: LogBuffers) -> None:
    writer = ExclusiveLogWriter(log)
    for i in range(10):
        writer.offer(bytes([i]) * 10)  # 64-byte frames
    reader = LogReader(log)
    seen: list[int] = []
    reader.bounded_poll(lambda b, o, n, h: seen.append(b[o]), limit_position=6 * 64, fragment_limit=100)
    assert seen == [0, 1, 2, 3, 4, 5] and reader.position == 384
    batch = reader.scan()
    assert batch.count == 4 and batch.next_position == 640
    assert [log.view[o + 32] for o in batch.frame_offsets] == [6, 7, 8, 9]
    assert batch.frame_lengths == [42] * 4 and batch.flags == [UNFRAGMENTED] * 4


def test_handler_exception_consumes_the_failing_fragment_only(log: LogBuffers) -> None:
    writer = ExclusiveLogWriter(log)
    for i in range(3):
        writer.offer(bytes([i]))
    reader = LogReader(log)

    def fail_on_second(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        if buffer[offset] == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        reader.poll(fail_on_second, 10)
    assert reader.position == 128
    assert [m[0] for m in drain(reader)] == [b"\x02"]


@given(
    term_count=st.integers(0, 2**31 - 1),
    tail_offset=st.integers(0, TERM + 4096),
    initial_term_id=st.integers(-(2**31), 2**31 - 1),
)
def test_producer_position_is_aeron_formula_from_the_active_tail(
    tmp_path_factory, term_count: int, tail_offset: int, initial_term_id: int
) -> None:
    """The native producer position (read by the driver every duty cycle) is the
    active partition's tail: its term's begin position plus its offset, capped
    at the term length (a tail that overshot the end means a full term)."""
    from fulmar.logbuffer import TERM_TAIL_COUNTERS_OFFSET

    path = tmp_path_factory.mktemp("producer") / "p.logbuffer"
    buffers = LogBuffers.create(path, TERM, session_id=1, stream_id=2, initial_term_id=initial_term_id)
    try:
        term_id = to_int32(initial_term_id + term_count)
        buffers.metadata.put_int32_ordered(ACTIVE_TERM_COUNT_OFFSET, term_count)
        buffers.metadata.put_int64_ordered(
            TERM_TAIL_COUNTERS_OFFSET + 8 * (term_count % 3), pack_tail(term_id, tail_offset)
        )
        expected = compute_position(term_id, min(tail_offset, TERM), position_bits_to_shift(TERM), initial_term_id)
        assert buffers.producer_position() == expected
    finally:
        buffers.close()


SESSION_MESSAGE = struct.Struct("<HHHHqqq")  # SBE header, then leadershipTermId, clusterSessionId, timestamp


def session_message(session_id: int, payload: bytes = b"p", *, schema: int = 111, template: int = 1) -> bytes:
    return SESSION_MESSAGE.pack(24, template, schema, 1, 7, session_id, 1_000 + session_id) + payload


def test_bounded_poll_session_runs_hands_whole_client_messages_over_as_runs_in_log_order(log: LogBuffers) -> None:
    writer = ExclusiveLogWriter(log)
    fragmented = session_message(9, b"f" * 3000)  # over the max payload of a 64 KiB term's frame
    messages = [
        session_message(1),
        session_message(-3),  # a service's message: negative session ids are runs too
        session_message(1),
        b"\x00" * 31,  # shorter than a session header
        session_message(2),
        session_message(2, schema=112),  # another schema
        session_message(4, template=21),  # another template of the cluster's
        fragmented,
        session_message(5),
        session_message(6),
    ]
    writer.max_payload_length = 1024
    for message in messages:
        assert offer(writer, message) > 0
    reader = LogReader(log)
    events: list[tuple[str, object]] = []

    def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        events.append(("message", bytes(buffer[offset : offset + length])))

    ends: dict[int, list[int]] = {}

    def on_run(run: SessionMessages) -> None:
        ids = run.session_ids
        events.append(("run", ids))
        assert run.count == len(ids) and run.leadership_term_ids == [7] * len(ids)
        assert run.timestamps == [1_000 + session_id for session_id in ids]
        whole = [bytes(run.view[o : o + n]) for o, n in zip(run.message_offsets, run.message_lengths)]
        assert whole == [session_message(session_id) for session_id in ids]
        ends.setdefault(ids[0], run.end_positions)

    assembler = FragmentAssembler(on_message)
    end = writer.position
    limit = end - 96  # the last message (a 96-byte frame: 32 + 33 bytes, aligned) is past the limit
    while reader.bounded_poll_session_runs(assembler, on_run, limit, 3):
        pass
    assert events == [
        ("run", [1, -3, 1]),
        ("message", b"\x00" * 31),
        ("run", [2]),
        ("message", messages[5]),
        ("message", messages[6]),
        ("message", fragmented),
        ("run", [5]),
    ]
    assert reader.position == limit
    # Each message's end position: the first run's three frames, then the fourth's (a 64-byte frame) and one more.
    assert ends[1] == [96, 192, 288] and ends[2] == [288 + 64 + 96]
    assert reader.bounded_poll_session_runs(assembler, on_run, end, 10) == 1
    assert events[-1] == ("run", [6]) and ends[6] == [end] and reader.position == end


def test_bounded_poll_session_runs_consumes_a_failed_run_and_nothing_after_it(log: LogBuffers) -> None:
    writer = ExclusiveLogWriter(log)
    for message in (session_message(1), session_message(2), b"plain", session_message(3)):
        assert offer(writer, message) > 0
    reader = LogReader(log)

    def fail(run: SessionMessages) -> None:
        raise RuntimeError(f"boom {run.session_ids}")

    with pytest.raises(RuntimeError, match=r"boom \[1, 2\]"):
        reader.bounded_poll_session_runs(lambda *a: None, fail, writer.position, 10)
    assert reader.position == 2 * 96  # the run's two 96-byte frames, not the plain message after them
    seen: list[bytes] = []
    reader.bounded_poll_session_runs(lambda b, o, n, h: seen.append(bytes(b[o : o + n])), fail, writer.position, 1)
    assert seen == [b"plain"] and reader.position == 2 * 96 + 64


def test_bounded_poll_session_runs_gives_stream_positions_in_a_later_term(log: LogBuffers) -> None:
    writer = ExclusiveLogWriter(log)
    while writer.position < TERM + 1000:
        assert offer(writer, b"x" * 1000) > 0
    start = writer.position
    for session_id in (11, 12):
        assert offer(writer, session_message(session_id)) > 0
    reader = LogReader(log, position=start)
    seen: list[list[int]] = []
    reader.bounded_poll_session_runs(lambda *a: None, lambda run: seen.append(run.end_positions), writer.position, 10)
    assert seen == [[start + 96, start + 192]] and reader.position == writer.position
