"""A network publication's sender packs committed frames into datagrams
(``fulmar_term_pack_datagrams`` over Aeron's TermScanner): whole frames up to
an MTU each, within the window and the term, a padding frame sent as its
header and the rest of the term skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fulmar._native import ffi, lib
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH, FrameType, align
from fulmar.logbuffer import LogBuffers

TERM_LENGTH = 64 * 1024
MTU = 1408


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogBuffers]:
    buffers = LogBuffers.create(tmp_path / "1.logbuffer", TERM_LENGTH, session_id=1, stream_id=2)
    try:
        yield buffers
    finally:
        buffers.close()


def commit(log: LogBuffers, position: int, lengths: list[int], padding_to_term_end: bool = False) -> None:
    """Frames of these lengths from position, one after another (and a padding frame to the term's end)."""
    partition = (position // TERM_LENGTH) % 3
    offset = position % TERM_LENGTH
    for length in lengths:
        at = partition * TERM_LENGTH + offset
        log.log.put_bytes(at + 6, int(FrameType.DATA).to_bytes(2, "little"))
        log.log.put_int32_ordered(at, length)
        offset += align(length, FRAME_ALIGNMENT)
    if padding_to_term_end:
        at = partition * TERM_LENGTH + offset
        log.log.put_bytes(at + 6, int(FrameType.PAD).to_bytes(2, "little"))
        log.log.put_int32_ordered(at, TERM_LENGTH - offset)


def pack(log: LogBuffers, position: int, max_length: int, max_datagrams: int = 64) -> tuple[list[tuple[int, int]], int]:
    """(offset in the term, length) of each datagram, and the advance."""
    regions = ffi.new("int32_t[]", 2 * max_datagrams)
    advance = ffi.new("int64_t *")
    count = lib.fulmar_term_pack_datagrams(log.address, TERM_LENGTH, position, max_length, MTU, max_datagrams,
                                           regions, advance)  # fmt: skip
    partition_base = (position // TERM_LENGTH) % 3 * TERM_LENGTH
    return [(regions[2 * i] - partition_base, regions[2 * i + 1]) for i in range(count)], advance[0]


def test_whole_frames_up_to_the_mtu_and_the_window(log: LogBuffers) -> None:
    commit(log, 0, [100, 200, 64, 1000])  # aligned 128, 224, 64, 1024
    assert pack(log, 0, MTU) == ([(0, 416)], 416)  # the next frame does not fit what is left of the window
    assert pack(log, 0, TERM_LENGTH) == ([(0, 416), (416, 1024)], 416 + 1024)
    assert pack(log, 0, 128 + 224) == ([(0, 352)], 352)
    assert pack(log, 0, 351) == ([(0, 128)], 128)
    # A first frame larger than the window: nothing goes.
    assert pack(log, 0, 100) == ([], 0)
    # Nothing committed yet.
    assert pack(log, 416 + 1024, MTU) == ([], 0)


def test_a_padding_frame_sends_its_header_and_skips_the_rest_of_the_term(log: LogBuffers) -> None:
    commit(log, 0, [96], padding_to_term_end=True)
    assert pack(log, 0, TERM_LENGTH) == ([(0, 96 + HEADER_LENGTH)], TERM_LENGTH)
    # The padding counts as its header against the window, so a small window still crosses the term end.
    assert pack(log, 96, 32) == ([(96, 32)], TERM_LENGTH - 96)
    # A window smaller than the padding's header: nothing goes, nothing is skipped.
    assert pack(log, 96, 31) == ([], 0)


def test_datagrams_split_at_frame_boundaries_within_the_mtu(log: LogBuffers) -> None:
    commit(log, 0, [1000, 1000, 300, 300, 300, 300])  # 1024 x2, 320 x4
    assert pack(log, 0, TERM_LENGTH) == ([(0, 1024), (1024, 1344), (2368, 960)], 1024 + 1344 + 960)
    assert pack(log, 0, TERM_LENGTH, max_datagrams=2) == ([(0, 1024), (1024, 1344)], 2368)
    # The window cuts before a frame that does not fit.
    assert pack(log, 0, 2368 + 319) == ([(0, 1024), (1024, 1344)], 2368)


def test_a_frame_longer_than_the_mtu_is_never_sent(log: LogBuffers) -> None:
    # Publications fragment at the MTU: a longer frame is a corrupt log, and sending stops before it.
    commit(log, 0, [64, MTU + 1])
    assert pack(log, 0, TERM_LENGTH) == ([(0, 64)], 64)
    assert pack(log, 64, TERM_LENGTH) == ([], 0)


def test_a_later_term_packs_from_its_own_partition(log: LogBuffers) -> None:
    position = 5 * TERM_LENGTH + 1024
    commit(log, position, [500, 500, 500])  # 512 each
    assert pack(log, position, 1024) == ([(1024, 1024)], 1024)  # the third frame waits for the window
    assert pack(log, position, 4096) == ([(1024, 1024), (2048, 512)], 1536)
    assert pack(log, position, 0) == ([], 0)
    # Never past the term's end, whatever the window.
    assert pack(log, 6 * TERM_LENGTH - 32, 4096) == ([], 0)
