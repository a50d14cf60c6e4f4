"""Whole-frame blocks: the recorder's block scan and the replayer's
``offer_frames`` (Aeron's blockPoll and offerBlock), at the log buffer level."""

from __future__ import annotations

import random
import struct

import pytest

from fulmar._native import lib
from fulmar.errors import InvalidFrameBlockError
from fulmar.frames import FRAME_ALIGNMENT
from fulmar.log_reader import LogReader
from fulmar.log_writer import ADMIN_ACTION, ExclusiveLogWriter
from fulmar.logbuffer import LogBuffers

TERM = 64 * 1024


def drain(reader: LogReader) -> list[tuple[bytes, int, int]]:
    out: list[tuple[bytes, int, int]] = []

    def handler(view: memoryview, offset: int, length: int, header: object) -> None:
        out.append((bytes(view[offset : offset + length]), header.session_id, header.stream_id))  # type: ignore[attr-defined]

    while reader.poll(handler, 100):
        pass
    return out


def blocks_of(log: LogBuffers, start: int, end: int, block_limit: int) -> list[tuple[int, bytes]]:
    """The source log cut into blocks the way a recorder takes them."""
    blocks = []
    position = start
    bits = log.position_bits_to_shift
    while position < end:
        term_offset = position & (TERM - 1)
        partition = (position >> bits) % 3 * TERM
        limit = min(TERM, term_offset + block_limit, term_offset + end - position)
        stop = lib.fulmar_term_block_scan(log.address + partition, term_offset, limit)
        assert stop > term_offset, f"no progress at {position}"
        blocks.append((position, bytes(log.view[partition + term_offset : partition + stop])))
        position += stop - term_offset
    return blocks


@pytest.mark.parametrize("block_limit", [4096, TERM])
def test_frames_copied_block_by_block_read_back_identically(tmp_path, block_limit):
    rng = random.Random(block_limit)
    source = LogBuffers.create(tmp_path / "src", TERM, session_id=7, stream_id=1001, initial_term_id=40)
    writer = ExclusiveLogWriter(source)
    messages = [rng.randbytes(rng.choice([1, 31, 200, 1000, 1376])) for _ in range(300)]
    for message in messages:
        while writer.offer(message) == ADMIN_ACTION:
            pass
    end = writer.position
    assert end > 2 * TERM  # the copy crosses term boundaries, padding included

    target = LogBuffers.create(tmp_path / "dst", TERM, session_id=99, stream_id=5, initial_term_id=40)
    copier = ExclusiveLogWriter(target)
    reader = LogReader(target)
    copied = []
    for position, block in blocks_of(source, 0, end, block_limit):
        assert copier.position == position
        result = copier.offer_frames(block)
        if result == ADMIN_ACTION:  # the previous block ended the term exactly
            result = copier.offer_frames(block)
        assert result == position + len(block)
        copied += drain(reader)  # the reader keeps within the three-term window
    assert [m for m, _, _ in copied] == messages
    # the copy carries the target's session and stream ids
    assert {(s, t) for _, s, t in copied} == {(99, 5)}


def test_offer_frames_refuses_blocks_that_do_not_fit(tmp_path):
    source = LogBuffers.create(tmp_path / "src", TERM, initial_term_id=3)
    writer = ExclusiveLogWriter(source)
    writer.offer(b"x" * 100)
    writer.offer(b"y" * 10)
    block = bytes(source.view[0 : writer.position])

    target = LogBuffers.create(tmp_path / "dst", TERM, initial_term_id=3)
    copier = ExclusiveLogWriter(target)
    with pytest.raises(InvalidFrameBlockError, match="not whole frames"):
        copier.offer_frames(block[:-FRAME_ALIGNMENT])  # the last frame cut short
    with pytest.raises(InvalidFrameBlockError):
        copier.offer_frames(block[160:])  # term offsets say it belongs further on
    wrong_term = bytearray(block)
    struct.pack_into("<i", wrong_term, 20, 4)
    with pytest.raises(InvalidFrameBlockError):
        copier.offer_frames(wrong_term)
    with pytest.raises(InvalidFrameBlockError):
        copier.offer_frames(b"\0" * 64)  # zero length: a hole, not a frame
    # none of the refusals touched the log
    assert copier.position == 0 and drain(LogReader(target)) == []
    assert copier.offer_frames(block) == len(block)
    assert [len(m) for m, _, _ in drain(LogReader(target))] == [100, 10]
