"""archive.catalog: Aeron's layout, round trips, growth, queries, corruption and a model test."""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar.archive.catalog import (
    CATALOG_FILE_NAME,
    CATALOG_VERSION,
    NULL_POSITION,
    NULL_RECORDING_ID,
    NULL_TIMESTAMP,
    RECORDED_POSITION_OFFSET,
    Catalog,
    RecordingDescriptor,
)
from fulmar.archive.errors import CatalogError, RecordingUnknownError
from fulmar.codecs.generated.archive import (
    CatalogHeaderDecoder,
    RecordingDescriptorDecoder,
    RecordingDescriptorHeaderDecoder,
    RecordingState,
)

SEG = 128 * 1024 * 1024
TERM = 64 * 1024


def add(catalog: Catalog, n: int = 0, *, stream_id: int = 1001, session_id: int = 5, channel: str | None = None) -> int:
    original = channel if channel is not None else f"aeron:udp?endpoint=localhost:{20000 + n}|tag={n}"
    return catalog.add_recording(
        start_position=n * 64,
        start_timestamp=1000 + n,
        initial_term_id=n - 3,
        segment_file_length=SEG,
        term_buffer_length=TERM,
        mtu_length=1408,
        session_id=session_id,
        stream_id=stream_id,
        stripped_channel=original.split("|")[0],
        original_channel=original,
        source_identity=f"127.0.0.1:{30000 + n}",
        control_session_id=40 + n,
        correlation_id=50 + n,
    )


# --------------------------------------------------------------------------- layout and round trips


def test_new_catalog_has_aerons_layout(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        assert catalog.capacity == 1024 * 1024
        first = add(catalog, 0)
        second = add(catalog, 1, channel="aeron:ipc")
        assert (first, second) == (0, 1)
    data = (tmp_path / CATALOG_FILE_NAME).read_bytes()
    assert len(data) == 1024 * 1024

    header = CatalogHeaderDecoder().wrap_headerless(data, 0)
    assert header.version == CATALOG_VERSION == 0x030100
    assert (header.length, header.next_recording_id, header.alignment) == (32, 2, 64)

    entry = RecordingDescriptorHeaderDecoder().wrap_headerless(data, 32)
    assert entry.state == RecordingState.VALID
    assert entry.checksum == 0  # no checksum configured, as Aeron
    strings = (
        len("aeron:udp?endpoint=localhost:20000")
        + len("aeron:udp?endpoint=localhost:20000|tag=0")
        + len("127.0.0.1:30000")
    )
    frame_length = (32 + 80 + 12 + strings + 63) // 64 * 64
    assert entry.length == frame_length - 32  # padding included
    descriptor = RecordingDescriptorDecoder().wrap_headerless(data, 64, entry.length)
    assert (descriptor.recording_id, descriptor.stop_position, descriptor.stop_timestamp) == (0, -1, -1)
    assert descriptor.original_channel == "aeron:udp?endpoint=localhost:20000|tag=0"
    # The second entry starts right after the first's padded frame.
    second_entry = RecordingDescriptorHeaderDecoder().wrap_headerless(data, 32 + frame_length)
    assert second_entry.length > 0
    assert RecordingDescriptorDecoder().wrap_headerless(data, 64 + frame_length).recording_id == 1
    # The recorded position lives in header bytes Aeron leaves alone.
    assert struct.unpack_from("<q", data, 32 + RECORDED_POSITION_OFFSET)[0] == NULL_POSITION


def test_round_trip_updates_across_reopen(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        ids = [add(catalog, n) for n in range(3)]
        catalog.update_stop(ids[0], 4096, 7777)
        catalog.update_start_position(ids[1], 1024)
        catalog.update_recorded_position(ids[2], 8192)
        catalog.extend(ids[0], control_session_id=99, correlation_id=98, session_id=97)
        catalog.update_stop(ids[0], 8192, 8888)
    with Catalog.open(tmp_path) as catalog:
        assert catalog.next_recording_id == 3
        d0 = catalog.descriptor(ids[0])
        assert d0 == RecordingDescriptor(
            recording_id=0,
            control_session_id=99,
            correlation_id=98,
            start_timestamp=1000,
            stop_timestamp=8888,
            start_position=0,
            stop_position=8192,
            initial_term_id=-3,
            segment_file_length=SEG,
            term_buffer_length=TERM,
            mtu_length=1408,
            session_id=97,
            stream_id=1001,
            stripped_channel="aeron:udp?endpoint=localhost:20000",
            original_channel="aeron:udp?endpoint=localhost:20000|tag=0",
            source_identity="127.0.0.1:30000",
            state=RecordingState.VALID,
        )
        d1 = catalog.descriptor(ids[1])
        assert d1 is not None and d1.start_position == 1024 and d1.stop_position == NULL_POSITION
        assert catalog.recorded_position(ids[2]) == 8192
        assert catalog.recorded_position(ids[0]) == 8192  # a stop is also the recorded position


def test_stop_position_null_reactivates_and_truncate_lowers_recorded_position(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        rid = add(catalog)
        catalog.update_stop(rid, 10_000, 5)
        catalog.update_stop_position(rid, 4096)  # truncate
        assert catalog.recorded_position(rid) == 4096
        d = catalog.descriptor(rid)
        assert d is not None and (d.stop_position, d.stop_timestamp) == (4096, 5)
        catalog.update_stop_position(rid, NULL_POSITION)  # extend
        d = catalog.descriptor(rid)
        assert d is not None and (d.stop_position, d.stop_timestamp) == (NULL_POSITION, NULL_TIMESTAMP)


def test_invalidate_hides_the_recording_for_good(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        ids = [add(catalog, n) for n in range(4)]
        catalog.invalidate(ids[1])
        catalog.mark_deleted(ids[2])
        assert catalog.descriptor(ids[1]) is None and not catalog.has_recording(ids[1])
        assert catalog.descriptor(ids[2]) is None
        with pytest.raises(RecordingUnknownError, match="unknown recording id 1"):
            catalog.update_stop(ids[1], 0, 0)
        with pytest.raises(RecordingUnknownError):
            catalog.invalidate(ids[1])
    with Catalog.open(tmp_path) as catalog:
        assert [d.recording_id for d in catalog.recordings()] == [0, 3]
        assert add(catalog, 9) == 4  # ids are never reused
        data = (tmp_path / CATALOG_FILE_NAME).read_bytes()
    states = []
    offset = 32
    while (length := struct.unpack_from("<i", data, offset)[0]) > 0:
        states.append(struct.unpack_from("<i", data, offset + 4)[0])
        offset += 32 + length
    assert states == [1, 0, 2, 1, 1]


def test_many_recordings_grow_the_file(tmp_path: Path) -> None:
    with Catalog.open(tmp_path, capacity_bytes=4096) as catalog:
        assert (tmp_path / CATALOG_FILE_NAME).stat().st_size == 4096
        for n in range(300):
            assert add(catalog, n) == n
            catalog.update_stop(n, n * 64 + 32, n)
        grown = catalog.capacity
        assert grown > 4096 * 10
    assert (tmp_path / CATALOG_FILE_NAME).stat().st_size == grown
    with Catalog.open(tmp_path, capacity_bytes=4096) as catalog:
        assert catalog.capacity == grown
        assert len(catalog) == 300
        assert all(d.stop_position == d.recording_id * 64 + 32 for d in catalog.recordings())


def test_open_without_create(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        Catalog.open(tmp_path, create=False)


def test_non_ascii_strings_are_refused(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        with pytest.raises(ValueError, match="ASCII"):
            add(catalog, channel="aeron:udp?endpoint=héllo")
        assert add(catalog) == 0


def test_file_sync_level_forces_after_updates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real = os.fsync

    def counting_fsync(fd: int) -> None:
        syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    with Catalog.open(tmp_path, file_sync_level=2) as catalog:
        before = len(syncs)
        rid = add(catalog)
        catalog.update_stop(rid, 64, 1)
        assert len(syncs) == before + 2
        catalog.update_recorded_position(rid, 64)  # a hint: not synced
        assert len(syncs) == before + 2


# --------------------------------------------------------------------------- queries


def test_recordings_from_and_count(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        for n in range(10):
            add(catalog, n)
        catalog.invalidate(4)
        assert [d.recording_id for d in catalog.recordings(3, 3)] == [3, 5, 6]
        assert [d.recording_id for d in catalog.recordings(8)] == [8, 9]
        assert catalog.recordings(20) == []
        assert catalog.descriptor(99) is None and not catalog.has_recording(-1)


def test_find_by_uri_and_last_matching(tmp_path: Path) -> None:
    with Catalog.open(tmp_path) as catalog:
        add(catalog, 0, stream_id=1, session_id=10, channel="aeron:udp?endpoint=localhost:1|alias=a")
        add(catalog, 1, stream_id=2, session_id=10, channel="aeron:udp?endpoint=localhost:1|alias=b")
        add(catalog, 2, stream_id=1, session_id=11, channel="aeron:ipc|alias=c")
        add(catalog, 3, stream_id=1, session_id=10, channel="aeron:udp?endpoint=localhost:2|alias=d")
        add(catalog, 4, stream_id=1, session_id=10, channel="aeron:udp?endpoint=localhost:1|alias=e")
        catalog.invalidate(4)

        ids = lambda ds: [d.recording_id for d in ds]  # noqa: E731
        assert ids(catalog.find_by_uri(0, 10, "localhost", 1)) == [0, 3]
        assert ids(catalog.find_by_uri(1, 10, "localhost", 1)) == [3]
        assert ids(catalog.find_by_uri(0, 1, "localhost", 1)) == [0]
        assert ids(catalog.find_by_uri(0, 10, "", 1)) == [0, 2, 3]
        # Aeron matches the fragment against the original channel (tags/aliases included).
        assert ids(catalog.find_by_uri(0, 10, "alias=c", 1)) == [2]
        assert ids(catalog.find_by_uri(0, 10, "localhost", 3)) == []

        assert catalog.find_last_matching(0, "localhost", 1, 10) == 3
        assert catalog.find_last_matching(0, "localhost:1", 1, 10) == 0
        assert catalog.find_last_matching(1, "localhost:1", 1, 10) == NULL_RECORDING_ID
        assert catalog.find_last_matching(0, "", 1, 11) == 2
        assert catalog.find_last_matching(-1, "", 1, 11) == NULL_RECORDING_ID


# --------------------------------------------------------------------------- corruption


def _catalog_with_entries(tmp_path: Path, checksum: bool = False) -> bytes:
    with Catalog.open(tmp_path, capacity_bytes=4096, checksum=zlib.crc32 if checksum else None) as catalog:
        for n in range(3):
            add(catalog, n)
    return (tmp_path / CATALOG_FILE_NAME).read_bytes()


def _entry_offsets(data: bytes) -> list[int]:
    offsets, offset = [], 32
    while (length := struct.unpack_from("<i", data, offset)[0]) > 0:
        offsets.append(offset)
        offset += 32 + length
    return offsets


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_bad_version(tmp_path: Path) -> None:
    _catalog_with_entries(tmp_path)
    _patch(tmp_path / CATALOG_FILE_NAME, 0, struct.pack("<i", 0x020500))
    with pytest.raises(
        CatalogError, match=r"archive.catalog: corrupt catalog at offset 0: incompatible catalog version 2\.5\.0"
    ):
        Catalog.open(tmp_path)


@pytest.mark.parametrize(
    "offset, value, message",
    [
        (4, struct.pack("<i", 64), "offset 4: header length 64, expected 32"),
        (16, struct.pack("<i", 0), "offset 16: alignment 0: legacy"),
        (16, struct.pack("<i", 48), "offset 16: alignment 48 is not a power of two"),
        (8, struct.pack("<q", 2), r"offset 8: nextRecordingId 2 is below the last recording id \+ 1 \(3\)"),
    ],
)
def test_bad_header_fields(tmp_path: Path, offset: int, value: bytes, message: str) -> None:
    _catalog_with_entries(tmp_path)
    _patch(tmp_path / CATALOG_FILE_NAME, offset, value)
    with pytest.raises(CatalogError, match=message):
        Catalog.open(tmp_path)


def test_truncated_file(tmp_path: Path) -> None:
    data = _catalog_with_entries(tmp_path)
    second = _entry_offsets(data)[1]
    frame_length = 32 + struct.unpack_from("<i", data, second)[0]
    (tmp_path / CATALOG_FILE_NAME).write_bytes(data[: second + 50])
    with pytest.raises(
        CatalogError, match=f"offset {second}: truncated entry: needs {frame_length} bytes, the file ends after 50"
    ):
        Catalog.open(tmp_path)
    (tmp_path / CATALOG_FILE_NAME).write_bytes(data[:20])
    with pytest.raises(CatalogError, match="offset 0: file is 20 bytes, shorter than the 32-byte header"):
        Catalog.open(tmp_path)


def test_garbage_entries(tmp_path: Path) -> None:
    data = _catalog_with_entries(tmp_path)
    path = tmp_path / CATALOG_FILE_NAME
    first, second, third = _entry_offsets(data)

    _patch(path, second, struct.pack("<i", 100))
    with pytest.raises(
        CatalogError, match=f"offset {second}: entry length 100 \\+ 32 is not a multiple of the alignment 64"
    ):
        Catalog.open(tmp_path)
    path.write_bytes(data)

    _patch(path, second, struct.pack("<i", -5))
    with pytest.raises(CatalogError, match=f"offset {second}: entry length -5 is negative"):
        Catalog.open(tmp_path)
    path.write_bytes(data)

    _patch(path, third + 4, struct.pack("<i", 7))
    with pytest.raises(CatalogError, match=f"offset {third + 4}: entry state 7"):
        Catalog.open(tmp_path)
    path.write_bytes(data)

    # strippedChannel length (u32 after the 80-byte block) far beyond the entry.
    _patch(path, first + 32 + 80, struct.pack("<I", 5000))
    with pytest.raises(CatalogError, match=f"offset {first + 32}: recording descriptor does not decode"):
        Catalog.open(tmp_path)
    path.write_bytes(data)

    _patch(path, third + 32 + 16, struct.pack("<q", 0))  # recordingId 0 again
    with pytest.raises(CatalogError, match=f"offset {third}: recording id 0 does not follow the previous id 1"):
        Catalog.open(tmp_path)


def test_checksums_are_written_and_verified(tmp_path: Path) -> None:
    data = _catalog_with_entries(tmp_path, checksum=True)
    offsets = _entry_offsets(data)
    for offset in offsets:
        length, _state, stored = struct.unpack_from("<iii", data, offset)
        assert stored == struct.unpack("<i", struct.pack("<I", zlib.crc32(data[offset + 32 : offset + 32 + length])))[0]
    # Updates keep the checksum right.
    with Catalog.open(tmp_path, checksum=zlib.crc32) as catalog:
        catalog.update_stop(1, 640, 3)
    with Catalog.open(tmp_path, checksum=zlib.crc32) as catalog:
        assert catalog.stop_position(1) == 640
    # A flipped byte in recording 1's descriptor is reported by id.
    _patch(tmp_path / CATALOG_FILE_NAME, offsets[1] + 32 + 24, b"\x55")
    with pytest.raises(CatalogError, match=f"offset {offsets[1] + 8}: checksum mismatch for recording 1"):
        Catalog.open(tmp_path, checksum=zlib.crc32)
    # Without a checksum configured it is not checked (as Aeron).
    Catalog.open(tmp_path).close()


# --------------------------------------------------------------------------- model test

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 1000), st.text("abc:/?=", max_size=40)),
        st.tuples(st.just("stop"), st.integers(0, 30), st.integers(0, 2**40)),
        st.tuples(st.just("start"), st.integers(0, 30), st.integers(0, 2**40)),
        st.tuples(st.just("stop_position"), st.integers(0, 30), st.sampled_from([NULL_POSITION, 0, 4096, 2**33])),
        st.tuples(st.just("invalidate"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, checksum=st.booleans())
def test_random_updates_match_a_model_across_reopen(ops: list[tuple[str, int, object]], checksum: bool) -> None:
    crc = zlib.crc32 if checksum else None
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        model: dict[int, dict[str, object]] = {}
        next_id = 0
        catalog = Catalog.open(directory, capacity_bytes=512, checksum=crc)
        try:
            for op, a, b in ops:
                if op == "add":
                    assert isinstance(b, str)
                    rid = catalog.add_recording(a, a + 1, 3, SEG, TERM, 1408, 6, 7, b, b + "|x", "s")
                    assert rid == next_id
                    next_id += 1
                    model[rid] = dict(
                        start_position=a, stop_position=NULL_POSITION, stop_timestamp=NULL_TIMESTAMP, stripped_channel=b
                    )
                elif op == "reopen":
                    catalog.close()
                    catalog = Catalog.open(directory, capacity_bytes=512, checksum=crc)
                elif a not in model:
                    with pytest.raises(RecordingUnknownError):
                        catalog.invalidate(a)
                elif op == "stop":
                    assert isinstance(b, int)
                    catalog.update_stop(a, b, b + 1)
                    model[a].update(stop_position=b, stop_timestamp=b + 1)
                elif op == "start":
                    assert isinstance(b, int)
                    catalog.update_start_position(a, b)
                    model[a]["start_position"] = b
                elif op == "stop_position":
                    assert isinstance(b, int)
                    catalog.update_stop_position(a, b)
                    model[a]["stop_position"] = b
                    if b == NULL_POSITION:
                        model[a]["stop_timestamp"] = NULL_TIMESTAMP
                else:
                    catalog.invalidate(a)
                    del model[a]
            catalog.close()
            catalog = Catalog.open(directory, capacity_bytes=512, checksum=crc)
            assert catalog.next_recording_id == next_id
            seen = {
                d.recording_id: dict(
                    start_position=d.start_position,
                    stop_position=d.stop_position,
                    stop_timestamp=d.stop_timestamp,
                    stripped_channel=d.stripped_channel,
                )
                for d in catalog.recordings()
            }
            assert seen == model
        finally:
            catalog.close()


def test_read_only_opening_lists_every_entry_and_writes_nothing(tmp_path: Path) -> None:
    """For tools: the same validation as ``open``, every entry (invalidated
    ones too) with its recorded position, and the file left byte for byte."""
    with Catalog.open(tmp_path) as catalog:
        for n in range(3):
            add(catalog, n)
        catalog.update_recorded_position(1, 4096)
        catalog.invalidate(2)
    path = tmp_path / CATALOG_FILE_NAME
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    with Catalog.open_read_only(tmp_path) as catalog:
        assert catalog.version == CATALOG_VERSION
        entries = catalog.entries()
        assert [(d.recording_id, d.state) for d, _ in entries] == [
            (0, RecordingState.VALID),
            (1, RecordingState.VALID),
            (2, RecordingState.INVALID),
        ]
        assert entries[1][1] == 4096
        assert catalog.descriptor(2) is None and catalog.descriptor(1) is not None
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    with pytest.raises(CatalogError, match="no catalog"):
        Catalog.open_read_only(tmp_path / "elsewhere")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / CATALOG_FILE_NAME).write_bytes(b"")
    with pytest.raises(CatalogError, match="the catalog is empty"):
        Catalog.open_read_only(tmp_path / "empty")
    path.write_bytes(b"\x01" * 40)
    with pytest.raises(CatalogError, match="corrupt catalog"):
        Catalog.open_read_only(tmp_path)
