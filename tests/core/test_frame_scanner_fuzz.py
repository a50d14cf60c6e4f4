"""Garbage in a log buffer: the scanner reports CorruptFrameError (a
CodecError), never reads out of bounds, never loops forever."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fulmar.errors import CodecError
from fulmar.frames import HEADER_LENGTH, decode_data_header
from fulmar.log_reader import Header, LogReader
from fulmar.log_writer import ExclusiveLogWriter
from fulmar.logbuffer import LogBuffers

TERM = 64 * 1024
LOG_BYTES = 3 * TERM


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory):
    buffers = LogBuffers.create(tmp_path_factory.mktemp("fuzz") / "fuzz.logbuffer", TERM, session_id=1, stream_id=2)
    yield buffers
    buffers.close()


def read_position(buffer: memoryview, offset: int, length: int, header: Header) -> None:
    """A handler that reads what a header computes from the frame."""
    _ = header.position


def scan_everything(log: LogBuffers) -> None:
    """Read the whole log from position 0 with both APIs until no progress."""
    for use_scan in (False, True):
        reader = LogReader(log)
        for _ in range(LOG_BYTES // 32 + 3):
            before = reader.position
            try:
                if use_scan:
                    batch = reader.scan()
                    for offset, length in zip(batch.frame_offsets, batch.frame_lengths):
                        assert 0 <= offset and offset + length <= LOG_BYTES
                else:
                    reader.poll(read_position, 4096)
            except CodecError:
                return
            assert before <= reader.position <= before + TERM
            if reader.position == before:
                break


def fill(log: LogBuffers, data: bytes) -> None:
    view = log.view
    view[:LOG_BYTES] = bytes(LOG_BYTES)
    view[: len(data)] = data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=0, max_size=4096))
def test_random_bytes(log: LogBuffers, data: bytes) -> None:
    fill(log, data)
    scan_everything(log)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from([0, 1, 31, 32, 33, 64, TERM - 32, TERM, TERM + 1, 2**31 - 1, -1, -(2**31)]),
            # DATA and PAD are the types the scanner follows; others are corrupt.
            st.one_of(st.sampled_from([0, 1]), st.integers(-(2**15), 2**15 - 1)),
        ),
        min_size=1,
        max_size=8,
    ),
    gap=st.sampled_from([0, 32, 96]),
)
def test_hostile_frame_lengths_and_types(log: LogBuffers, frames: list[tuple[int, int]], gap: int) -> None:
    data = bytearray()
    for frame_length, frame_type in frames:
        data += struct.pack("<iBBhiiiiq", frame_length, 0, 0xC0, frame_type, 0, 1, 2, 0, 0) + bytes(gap)
    fill(log, bytes(data))
    scan_everything(log)


HOSTILE_LENGTHS = [2**31 - 1, 2**31 - 31, 2**31 - 32, TERM + 1, TERM - 31, -1, -(2**31), 31]


@pytest.mark.parametrize("frame_type", [0, 1])
@pytest.mark.parametrize("frame_length", HOSTILE_LENGTHS)
@pytest.mark.parametrize("at", [0, 32, TERM - 32])
def test_lengths_that_overflow_or_overrun(log: LogBuffers, frame_type: int, frame_length: int, at: int) -> None:
    fill(log, b"")
    for offset in range(0, at, 32):  # valid padding frames up to the hostile one
        log.view[offset : offset + 32] = struct.pack("<iBBhiiiiq", 32, 0, 0xC0, 0, offset, 1, 2, 0, 0)
    log.view[at : at + 32] = struct.pack("<iBBhiiiiq", frame_length, 0, 0xC0, frame_type, at, 1, 2, 0, 0)
    scan_everything(log)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 8 * 1024 - 1), st.integers(0, 7)), min_size=1, max_size=16))
def test_bit_flips_in_a_valid_log(log: LogBuffers, flips: list[tuple[int, int]]) -> None:
    fill(log, b"")
    log.metadata.put_int64_ordered(0, 0)  # partition 0 tail back to the start
    log.metadata.put_int32_ordered(24, 0)
    writer = ExclusiveLogWriter(log)
    for i in range(100):
        writer.offer(bytes([i]) * (i * 7 % 200))
    view = log.view
    for byte, bit in flips:
        view[byte] ^= 1 << bit
    scan_everything(log)


@given(data=st.binary(max_size=64), offset=st.integers(-4, 64))
def test_decode_data_header_only_raises_codec_error(data: bytes, offset: int) -> None:
    try:
        header = decode_data_header(data, offset)
    except CodecError:
        assert offset < 0 or len(data) - offset < HEADER_LENGTH
    else:
        assert len(header) == 9
