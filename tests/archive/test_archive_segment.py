"""Segment files: writing, reading back, checksums, I/O errors, truncation and crash recovery."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from fulmar.archive import segment
from fulmar.archive.catalog import NULL_POSITION, Catalog, recover
from fulmar.archive.errors import CatalogError, SegmentError
from fulmar.archive.segment import (
    ALLOCATION_CHUNK,
    SegmentReader,
    SegmentWriter,
    check_segment_length,
    delete_segments,
    list_segment_files,
    segment_file_base_position,
    segment_file_name,
    truncate_segments,
)
from fulmar.frames import DATA_HEADER, FrameType, align
from fulmar.logbuffer import to_int32

TERM = 64 * 1024
SEG = 256 * 1024
SESSION = 77
STREAM = 1001
INITIAL_TERM_ID = 0x7FFFFFFE  # term ids wrap past int32 max after two terms
SHIFT = TERM.bit_length() - 1


# --------------------------------------------------------------------------- deterministic frames


def term_id_at(position: int) -> int:
    return to_int32(INITIAL_TERM_ID + (position >> SHIFT))


def header(position: int, frame_length: int, frame_type: int = FrameType.DATA, **override: int) -> bytes:
    fields = dict(
        frame_length=frame_length,
        version=0,
        flags=0xC0,
        type=int(frame_type),
        term_offset=position & (TERM - 1),
        session_id=SESSION,
        stream_id=STREAM,
        term_id=term_id_at(position),
        reserved=0,
    )
    fields.update(override)
    return DATA_HEADER.pack(*fields.values())


def payload(position: int, length: int) -> bytes:
    digest = hashlib.blake2b(position.to_bytes(8, "little")).digest()
    return (digest * (length // len(digest) + 1))[:length]


def frame_length_at(position: int) -> int:
    return 33 + (position * 2654435761) % 1500


def frame_at(position: int) -> bytes:
    """The frame the test stream holds at ``position``: DATA, or a PAD filling the term's end."""
    remaining = TERM - (position & (TERM - 1))
    length = frame_length_at(position)
    if align(length, 32) > remaining:
        return header(position, remaining, FrameType.PAD) + bytes(remaining - 32)
    frame = header(position, length) + payload(position, length - 32)
    return frame + bytes(align(length, 32) - length)


def iter_blocks(start: int, max_block: int = 16 * 1024) -> Iterator[tuple[int, bytes]]:
    """Blocks of whole frames, never crossing a term boundary, forever."""
    position = start
    while True:
        block_position, block = position, bytearray()
        while len(block) < max_block:
            frame = frame_at(position)
            block += frame
            position += len(frame)
            if position & (TERM - 1) == 0:
                break
        yield block_position, bytes(block)


def blocks_until(start: int, end: int) -> list[tuple[int, bytes]]:
    out = []
    for position, block in iter_blocks(start):
        if position >= end:
            break
        out.append((position, block))
    return out


def with_crc(block: bytes) -> bytes:
    """What a checksum=True writer stores for ``block``: as Aeron's RecordingWriter, the
    CRC-32 of each DATA frame's bytes after its header up to its aligned end, in its session id."""
    out = bytearray(block)
    offset = 0
    while offset < len(out):
        length, frame_type = struct.unpack_from("<i2xH", out, offset)
        if frame_type == FrameType.DATA:
            struct.pack_into("<I", out, offset + 12, zlib.crc32(out[offset + 32 : offset + align(length, 32)]))
        offset += align(length, 32)
    return bytes(out)


def add_recording(catalog: Catalog, start: int = 0) -> int:
    return catalog.add_recording(
        start, 1000, INITIAL_TERM_ID, SEG, TERM, 1408, SESSION, STREAM, "aeron:ipc", "aeron:ipc?alias=t", "src"
    )


def read_all(archive_dir: Path, descriptor: object, start: int, stop: int, max_length: int = 8192) -> bytes:
    out = bytearray()
    with SegmentReader(archive_dir, descriptor, start) as reader:  # type: ignore[arg-type]
        while True:
            block = reader.read(stop, max_length)
            if not len(block):
                break
            assert len(block) <= max_length
            out += block
            block.release()
        assert reader.position == stop
    return bytes(out)


def write_blocks(writer: SegmentWriter, blocks: list[tuple[int, bytes]]) -> None:
    for position, block in blocks:
        writer.write(memoryview(block), position)


# --------------------------------------------------------------------------- arithmetic


def test_segment_file_name_and_base_position() -> None:
    assert segment_file_name(7, 262144) == "7-262144.rec"
    # Start mid-term: segments count from the start term's base.
    start = 3 * TERM + 4096
    assert segment_file_base_position(start, start, TERM, SEG) == 3 * TERM
    assert segment_file_base_position(start, 3 * TERM + SEG - 32, TERM, SEG) == 3 * TERM
    assert segment_file_base_position(start, 3 * TERM + SEG, TERM, SEG) == 3 * TERM + SEG
    assert segment_file_base_position(0, 5 * SEG + 1, TERM, SEG) == 5 * SEG


@pytest.mark.parametrize(
    "segment_length, term_length",
    [(3 * 64 * 1024, 64 * 1024), (32 * 1024, 64 * 1024), (2**31, 64 * 1024), (64 * 1024, 128 * 1024), (SEG, 1000)],
)
def test_invalid_segment_lengths_are_refused(segment_length: int, term_length: int) -> None:
    with pytest.raises(ValueError):
        check_segment_length(segment_length, term_length)


# --------------------------------------------------------------------------- write and read


def test_blocks_across_segments_read_back_identically(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        blocks = blocks_until(0, 4 * SEG + 3 * TERM + 100)
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG, catalog=catalog) as writer:
            write_blocks(writer, blocks)
            stop = writer.position
        assert catalog.recorded_position(rid) == stop
        catalog.update_stop(rid, stop, 2000)
        descriptor = catalog.descriptor(rid)
        assert descriptor is not None

    assert list_segment_files(tmp_path, rid) == [f"{rid}-{i * SEG}.rec" for i in range(5)]
    assert all((tmp_path / n).stat().st_size == SEG for n in list_segment_files(tmp_path, rid))
    expected = b"".join(block for _, block in blocks)
    assert read_all(tmp_path, descriptor, 0, stop) == expected

    # From frame boundaries in the middle of later segments, with a block size
    # smaller than some frames' runs.
    frame_starts = []
    position = 0
    while position < stop:
        frame_starts.append(position)
        position += len(frame_at(position))
    for start in (frame_starts[len(frame_starts) // 3], frame_starts[-7], SEG, 2 * SEG + TERM):
        assert start in frame_starts
        assert read_all(tmp_path, descriptor, start, stop, max_length=4096) == expected[start:]


def test_recording_starting_mid_term(tmp_path: Path) -> None:
    start = 5 * TERM + 4096
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog, start)
        blocks = blocks_until(start, start + SEG + 5000)
        with SegmentWriter(tmp_path, rid, start, TERM, SEG) as writer:
            write_blocks(writer, blocks)
            stop = writer.position
        catalog.update_stop(rid, stop, 0)
        descriptor = catalog.descriptor(rid)
    # The first segment is based at the start's term base, the start lands at offset 4096.
    assert list_segment_files(tmp_path, rid)[0] == f"{rid}-{5 * TERM}.rec"
    first = (tmp_path / f"{rid}-{5 * TERM}.rec").read_bytes()
    assert first[:4096] == bytes(4096)
    assert first[4096 : 4096 + len(blocks[0][1])] == blocks[0][1]
    assert read_all(tmp_path, descriptor, start, stop) == b"".join(b for _, b in blocks)


def test_reads_stop_at_term_boundaries_and_limit(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        blocks = blocks_until(0, 2 * TERM)
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG) as writer:
            write_blocks(writer, blocks)
        descriptor = catalog.descriptor(rid)
    first_term_end = max(p + len(b) for p, b in blocks if p < TERM)
    assert first_term_end == TERM
    # A generous max_length still stops at the term's end.
    last_in_first_term = max(p for p, _ in blocks if p < TERM)
    with SegmentReader(tmp_path, descriptor, last_in_first_term) as reader:  # type: ignore[arg-type]
        block = reader.read(2 * TERM, 1 << 20)
        assert reader.position == TERM == last_in_first_term + len(block)
        block.release()
        block = reader.read(2 * TERM, 1 << 20)
        assert reader.position == 2 * TERM and len(block) == TERM
        block.release()
    limit = blocks[2][0]
    with SegmentReader(tmp_path, descriptor, 0) as reader:  # type: ignore[arg-type]
        total = 0
        while len(block := reader.read(limit, 1 << 20)):
            total += len(block)
            block.release()
        assert total == limit == reader.position


def test_writer_checksums_frames_without_touching_the_callers_buffer(tmp_path: Path) -> None:
    blocks = blocks_until(0, SEG + 1000)
    with SegmentWriter(tmp_path, 3, 0, TERM, SEG, checksum=True) as writer:
        for position, block in blocks:
            buffer = bytearray(block)
            writer.write(memoryview(buffer), position)
            assert buffer == block
        stop = writer.position
    data = b"".join((tmp_path / n).read_bytes() for n in list_segment_files(tmp_path, 3))[:stop]
    assert data == b"".join(with_crc(b) for _, b in blocks)
    # And every DATA frame verifies.
    offset = checked = 0
    while offset < stop:
        length, frame_type, stored = struct.unpack_from("<i2xH4xi", data, offset)
        if frame_type == FrameType.DATA:
            assert stored == to_int32(zlib.crc32(data[offset + 32 : offset + align(length, 32)]))
            checked += 1
        offset += align(length, 32)
    assert checked > 100


def test_checksumming_writer_names_a_frame_shorter_than_its_header(tmp_path: Path) -> None:
    (position, block), _ = blocks_until(0, 3 * 16 * 1024)[:2]
    frames = bytearray(block)
    second = align(struct.unpack_from("<i", frames, 0)[0], 32)
    struct.pack_into("<i", frames, second, 8)  # the second frame says 8 bytes
    with SegmentWriter(tmp_path, 5, 0, TERM, SEG, checksum=True) as writer:
        with pytest.raises(ValueError, match=f"frame at block offset {second} has length 8"):
            writer.write(memoryview(frames), position)
        assert writer.position == 0


def test_writer_refuses_wrong_position_and_bad_blocks(tmp_path: Path) -> None:
    blocks = blocks_until(0, 3 * 16 * 1024)
    with SegmentWriter(tmp_path, 0, 0, TERM, SEG) as writer:
        with pytest.raises(ValueError, match="writer is at 0"):
            writer.write(memoryview(blocks[1][1]), blocks[1][0])
        writer.write(memoryview(blocks[0][1]), 0)
        with pytest.raises(ValueError, match=f"writer is at {blocks[1][0]}"):
            writer.write(memoryview(blocks[0][1]), 0)
        with pytest.raises(ValueError, match="whole aligned frames"):
            writer.write(memoryview(bytes(40)), writer.position)
        with pytest.raises(ValueError, match="whole aligned frames"):
            writer.write(memoryview(bytes(TERM)), writer.position)
        assert writer.position == blocks[1][0]


def test_enospc_while_preallocating_is_a_segment_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    writer = SegmentWriter(tmp_path, 4, 0, TERM, SEG)
    position, block = blocks_until(0, 100)[0]
    with pytest.raises(SegmentError) as info:
        writer.write(memoryview(block), position)
    message = str(info.value)
    assert "no space left on device" in message
    assert str(tmp_path / "4-0.rec") in message
    assert f"({SEG} bytes)" in message
    assert writer.position == 0
    assert list_segment_files(tmp_path, 4) == []  # no half-allocated file left behind


def test_write_error_is_a_segment_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = SegmentWriter(tmp_path, 4, 0, TERM, SEG)

    def failing_pwrite(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    position, block = blocks_until(0, 100)[0]
    with pytest.raises(SegmentError, match=r"input/output error \(EIO\) while writing .*4-0\.rec at offset 0"):
        writer.write(memoryview(block), position)
    writer.close()


@pytest.mark.parametrize("level, call", [(1, "fdatasync"), (2, "fsync")])
def test_file_sync_level_syncs_each_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, level: int, call: str
) -> None:
    calls: list[int] = []
    real = getattr(os, call)

    def counting_sync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, call, counting_sync)
    blocks = blocks_until(0, 5 * 16 * 1024)
    with SegmentWriter(tmp_path, 0, 0, TERM, SEG, file_sync_level=level) as writer:
        write_blocks(writer, blocks)
    assert len(calls) >= len(blocks)


def test_missing_segment_and_holes_are_segment_errors(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        blocks = blocks_until(0, 2 * SEG + 100)
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG) as writer:
            write_blocks(writer, blocks)
            stop = writer.position
        catalog.update_stop(rid, stop, 0)
        descriptor = catalog.descriptor(rid)
    os.unlink(tmp_path / f"{rid}-{SEG}.rec")
    with pytest.raises(SegmentError, match=f"segment file .*{rid}-{SEG}.rec is missing"):
        read_all(tmp_path, descriptor, 0, stop)
    # A limit beyond what was written: the reader meets zeros (a hole), never returns them.
    with pytest.raises(SegmentError, match="hole"):
        read_all(tmp_path, descriptor, 2 * SEG, 2 * SEG + TERM)


def test_short_segment_file_is_a_segment_error(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        descriptor = catalog.descriptor(rid)
    (tmp_path / f"{rid}-0.rec").write_bytes(frame_at(0))
    with pytest.raises(SegmentError, match="is short"):
        read_all(tmp_path, descriptor, 0, 32)


def test_truncate_and_delete_segments(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        blocks = blocks_until(0, 3 * SEG + 100)
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG) as writer:
            write_blocks(writer, blocks)
        descriptor = catalog.descriptor(rid)
    assert descriptor is not None
    cut = next(p for p, _ in blocks if p > SEG + TERM)
    assert 0 < cut - SEG < SEG  # inside the second segment
    deleted = truncate_segments(tmp_path, descriptor, cut)
    assert deleted == [f"{rid}-{2 * SEG}.rec", f"{rid}-{3 * SEG}.rec"]
    second = (tmp_path / f"{rid}-{SEG}.rec").read_bytes()
    assert len(second) == SEG and second[cut - SEG :] == bytes(2 * SEG - cut)
    assert read_all(tmp_path, descriptor, 0, cut) == b"".join(b for _, b in blocks)[:cut]
    # A cut on a segment boundary deletes the segment starting there.
    assert truncate_segments(tmp_path, descriptor, SEG) == [f"{rid}-{SEG}.rec"]
    with pytest.raises(ValueError):
        truncate_segments(tmp_path, descriptor, 100)
    assert delete_segments(tmp_path, rid) == [f"{rid}-0.rec"]
    assert list_segment_files(tmp_path, rid) == []


# --------------------------------------------------------------------------- recovery


def _crash_with_tail(
    tmp_path: Path, tail: bytes | None, *, lag_blocks: int = 4, checksum: bool = True
) -> tuple[int, int, list[tuple[int, bytes]]]:
    """Write a recording, the last ``lag_blocks`` blocks without telling the catalog,
    then put ``tail`` right after the data (a torn write) and leave the catalog as a
    SIGKILL would: active, stop NULL. Returns (recording id, good end, blocks)."""
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        blocks = blocks_until(0, SEG + 2 * TERM + 700)
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG, checksum=checksum, catalog=catalog) as writer:
            write_blocks(writer, blocks[:-lag_blocks])
            reported = writer.position
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG, checksum=checksum, position=reported) as writer:
            write_blocks(writer, blocks[-lag_blocks:])
            end = writer.position
        assert catalog.recorded_position(rid) == reported < end
    if tail is not None:
        base = segment_file_base_position(0, end, TERM, SEG)
        fd = os.open(tmp_path / segment_file_name(rid, base), os.O_RDWR)
        os.pwrite(fd, tail, end - base)
        os.close(fd)
    return rid, end, blocks


def _torn_tails(end: int) -> dict[str, bytes]:
    good = header(end, 600)
    return {
        "half_header": good[:8],
        "garbage": hashlib.sha512(b"x").digest() * 4,
        "wrong_session": header(end, 600, session_id=SESSION + 1) + payload(end, 568),
        "wrong_term_offset": header(end, 600, term_offset=(end & (TERM - 1)) + 32) + payload(end, 568),
        "wrong_term_id": header(end, 600, term_id=term_id_at(end) - 3) + payload(end, 568),
        "past_term_end": header(end, TERM) + payload(end, 568),
        "bad_type": header(end, 600, type=5) + payload(end, 568),
        "negative_length": header(end, -600) + payload(end, 568),
    }


@pytest.mark.parametrize("kind", sorted(_torn_tails(0)))
def test_recover_stops_before_a_torn_frame_and_zeroes_it(tmp_path: Path, kind: str) -> None:
    probe = blocks_until(0, SEG + 2 * TERM + 700)
    end_guess = probe[-1][0] + len(probe[-1][1])
    rid, end, blocks = _crash_with_tail(tmp_path, _torn_tails(end_guess)[kind])
    assert end == end_guess

    with Catalog.open(tmp_path) as catalog:
        assert recover(catalog, tmp_path, now_ms=5555) == [rid]
        descriptor = catalog.descriptor(rid)
        assert descriptor is not None
        assert descriptor.stop_position == end
        assert descriptor.stop_timestamp == 5555
        assert catalog.recorded_position(rid) == end
        # Nothing left to recover the second time.
        assert recover(catalog, tmp_path, now_ms=6666) == []

    base = segment_file_base_position(0, end, TERM, SEG)
    data = (tmp_path / segment_file_name(rid, base)).read_bytes()
    assert data[end - base :] == bytes(SEG - (end - base))
    expected = b"".join(with_crc(b) for _, b in blocks)
    assert read_all(tmp_path, descriptor, 0, end) == expected

    # Extend from the recovered stop: the new frames follow seamlessly.
    more = blocks_until(end, end + 3 * TERM)
    with SegmentWriter(tmp_path, rid, 0, TERM, SEG, checksum=True, position=end) as writer:
        write_blocks(writer, more)
        new_stop = writer.position
    assert read_all(tmp_path, descriptor, 0, new_stop) == expected + b"".join(with_crc(b) for _, b in more)


def test_zeroed_payload_is_caught_only_by_the_crc(tmp_path: Path) -> None:
    probe = blocks_until(0, SEG + 2 * TERM + 700)
    end = probe[-1][0] + len(probe[-1][1])
    torn = header(end, 600) + bytes(568)  # header landed, payload did not
    rid, _, _ = _crash_with_tail(tmp_path, torn)
    with Catalog.open(tmp_path) as catalog:
        recover(catalog, tmp_path, now_ms=1, verify_crc=True)
        assert catalog.stop_position(rid) == end

    rid2_dir = tmp_path / "plain"
    rid2_dir.mkdir()
    rid2, _, _ = _crash_with_tail(rid2_dir, torn)
    with Catalog.open(rid2_dir) as catalog:
        recover(catalog, rid2_dir, now_ms=1, verify_crc=False)
        assert catalog.stop_position(rid2) == end + 608  # the header alone looks plausible


def test_recover_scans_past_a_lagging_recorded_position_across_segments(tmp_path: Path) -> None:
    # The unreported blocks reach back into the first segment: the scan crosses into the second.
    probe = blocks_until(0, SEG + 2 * TERM + 700)
    lag = sum(1 for position, _ in probe if position >= SEG - 20_000)
    rid, end, _ = _crash_with_tail(tmp_path, None, lag_blocks=lag)
    with Catalog.open(tmp_path) as catalog:
        assert catalog.recorded_position(rid) < SEG < end
        assert recover(catalog, tmp_path, now_ms=1) == [rid]
        assert catalog.stop_position(rid) == end


def test_recover_at_a_segment_boundary_deletes_the_torn_next_segment(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG, catalog=catalog) as writer:
            write_blocks(writer, blocks_until(0, SEG))
            assert writer.position == SEG
    (tmp_path / segment_file_name(rid, SEG)).write_bytes(b"\xff" * 100 + bytes(SEG - 100))
    with Catalog.open(tmp_path) as catalog:
        recover(catalog, tmp_path, now_ms=1)
        assert catalog.stop_position(rid) == SEG
    assert list_segment_files(tmp_path, rid) == [segment_file_name(rid, 0)]


def test_recover_of_a_recording_without_segments_stops_at_its_start(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog, start=TERM + 64)
        assert recover(catalog, tmp_path, now_ms=9) == [rid]
        assert catalog.stop_position(rid) == TERM + 64


def test_recover_reports_missing_segments(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        with SegmentWriter(tmp_path, rid, 0, TERM, SEG) as writer:
            write_blocks(writer, blocks_until(0, 2 * SEG + 10))
            catalog.update_stop(rid, writer.position, 1)
        active = add_recording(catalog)
        os.unlink(tmp_path / segment_file_name(rid, SEG))
        with pytest.raises(CatalogError, match=f"missing: .*{rid}-{SEG}.rec"):
            recover(catalog, tmp_path, now_ms=3)
        # The active recording was still recovered before the report.
        assert catalog.stop_position(active) == 0


# --------------------------------------------------------------------------- SIGKILL mid-write


def _record_forever(archive_dir: Path, recording_id: int) -> None:  # pragma: no cover - runs in the child
    catalog = Catalog.open(archive_dir, create=False)
    writer = SegmentWriter(archive_dir, recording_id, 0, TERM, SEG, checksum=True, catalog=catalog)
    for position, block in iter_blocks(0, max_block=4096):
        writer.write(memoryview(block), position)


@pytest.mark.system
@pytest.mark.system
def test_sigkill_mid_write_then_recover(tmp_path: Path, child_processes: list) -> None:
    from conftest import FORK

    with Catalog.open(tmp_path) as catalog:
        rid = add_recording(catalog)
        child = FORK.Process(target=_record_forever, args=(tmp_path, rid))
        child.start()
        child_processes.append(child)
        target = 2 * SEG + TERM // 2
        deadline = time.monotonic() + 60
        while catalog.recorded_position(rid) < target:
            assert child.is_alive(), f"recorder died with exit code {child.exitcode}"
            assert time.monotonic() < deadline, "recorder made no progress"
            time.sleep(0.001)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(timeout=10)
        assert child.exitcode == -signal.SIGKILL
        reported = catalog.recorded_position(rid)
        assert catalog.stop_position(rid) == NULL_POSITION

        assert recover(catalog, tmp_path, now_ms=1, verify_crc=True) == [rid]
        descriptor = catalog.descriptor(rid)
        assert descriptor is not None
        stop = descriptor.stop_position
        assert stop >= reported >= target

    # Every recovered frame is exactly the frame the recorder was given (plus its crc).
    data = read_all(tmp_path, descriptor, 0, stop)
    position = 0
    while position < stop:
        frame = with_crc(frame_at(position))
        assert data[position : position + len(frame)] == frame, f"frame at {position} differs"
        position += len(frame)
    assert position == stop
    base = segment_file_base_position(0, stop, TERM, SEG)
    if stop > base:
        tail = (tmp_path / segment_file_name(rid, base)).read_bytes()[stop - base :]
        assert tail == bytes(len(tail))


def test_module_exports() -> None:
    assert segment.SEGMENT_SUFFIX == ".rec"


def test_a_segment_takes_the_disk_it_holds_allocated_a_chunk_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file has the segment's whole length (readers map all of it), but
    only the chunks written (and the one ahead) have blocks: a snapshot of a
    few frames does not take a whole segment of disk; a full disk met when the
    next chunk is allocated is a SegmentError before the write."""
    segment_length = 8 * 1024 * 1024
    writer = SegmentWriter(tmp_path, 5, 0, TERM, segment_length)
    written = bytearray()
    blocks = iter_blocks(0)
    position, block = next(blocks)
    writer.write(memoryview(block), position)
    written += block
    path = tmp_path / "5-0.rec"
    assert path.stat().st_size == segment_length
    assert path.stat().st_blocks * 512 <= ALLOCATION_CHUNK + 64 * 1024
    while True:
        position, block = next(blocks)
        if position + len(block) > ALLOCATION_CHUNK:
            break
        writer.write(memoryview(block), position)
        written += block

    def full_disk(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    with pytest.raises(
        SegmentError,
        match=f"no space left on device \\(ENOSPC\\) while allocating {path} to "
        f"{2 * ALLOCATION_CHUNK} of {segment_length}",
    ):
        writer.write(memoryview(block), position)
    assert writer.position == position
    monkeypatch.undo()
    writer.write(memoryview(block), position)  # room again: the write goes on where it stopped
    written += block
    writer.close()
    descriptor = SimpleNamespace(
        recording_id=5, start_position=0, term_buffer_length=TERM, segment_file_length=segment_length
    )
    assert read_all(tmp_path, descriptor, 0, len(written)) == bytes(written)
