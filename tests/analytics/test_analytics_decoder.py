"""The C decoder of recorded cluster logs (fulmar.analytics.log_decoder)
against a plain-Python reference, on synthetic segments, and what it does
with corrupt ones (FAILFAST: an error naming the file and position;
PERMISSIVE: skipped, counted, a Corrupt row)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar.analytics import log_decoder
from fulmar.analytics.log_decoder import (
    CORRUPT_TYPE,
    DecodeStats,
    LogCorruptError,
    LogSegment,
    ReadOptions,
    decode_segment,
    to_record_batch,
)
from fulmar.codecs.generated import cluster as codecs
from support.log_reference import BEGIN, END, FRAME, PAD, reference_rows, write_messages

TERM = 64 * 1024
COMPARED = (
    "log_position",
    "next_position",
    "message_type",
    "template_id",
    "leadership_term_id",
    "cluster_session_id",
    "correlation_id",
    "timestamp",
    "leader_member_id",
    "time_unit",
    "cluster_action",
    "close_reason",
    "payload",
    "payload_length",
    "fragments",
)


def encode(encoder: Any, tail: bytes = b"", **fields: Any) -> bytes:
    buf = bytearray(4096)
    length = encoder.encode(buf, 0, **fields)
    return bytes(buf[:length]) + tail


def session_message(session: int, payload: bytes, term: int = 3, timestamp: int = 1000) -> bytes:
    return encode(
        codecs.SessionMessageHeaderEncoder,
        payload,
        leadership_term_id=term,
        cluster_session_id=session,
        timestamp=timestamp,
    )


i64 = st.integers(-(2**63), 2**63 - 1)
messages = st.one_of(
    st.builds(session_message, st.integers(-(2**63), 2**63 - 1), st.binary(max_size=3000), i64, i64),
    st.builds(
        lambda t, c, ts: encode(codecs.TimerEventEncoder, leadership_term_id=t, correlation_id=c, timestamp=ts),
        i64,
        i64,
        i64,
    ),
    st.builds(
        lambda t, s, ts, channel: encode(
            codecs.SessionOpenEventEncoder,
            leadership_term_id=t,
            correlation_id=9,
            cluster_session_id=s,
            timestamp=ts,
            response_stream_id=102,
            response_channel=channel,
        ),
        i64,
        i64,
        i64,
        st.text(alphabet="aeron:udp?=.0123456789", max_size=60),
    ),
    st.builds(
        lambda s, r: encode(
            codecs.SessionCloseEventEncoder, leadership_term_id=1, cluster_session_id=s, timestamp=5, close_reason=r
        ),
        i64,
        st.integers(0, 3),
    ),
    st.builds(
        lambda a: encode(
            codecs.ClusterActionRequestEncoder, leadership_term_id=2, log_position=4096, timestamp=7, action=a, flags=0
        ),
        st.integers(0, 4),
    ),
    st.builds(
        lambda t, m, u: encode(
            codecs.NewLeadershipTermEventEncoder,
            leadership_term_id=t,
            log_position=0,
            timestamp=1,
            term_base_log_position=0,
            leader_member_id=m,
            log_session_id=5,
            time_unit=u,
        ),
        i64,
        st.integers(0, 4),
        st.integers(0, 3),
    ),
    st.binary(max_size=40),  # anything: a service's snapshot record, another schema
)


def segment_file(
    tmp_path: Path,
    data: bytes,
    *,
    name: str = "0-0.rec",
    end: int | None = None,
    end_known: bool = True,
    last: bool = True,
) -> LogSegment:
    (tmp_path / name).write_bytes(data)
    return LogSegment(
        archive_dir=str(tmp_path),
        recording_id=0,
        file_name=name,
        segment_base=0,
        start_offset=0,
        end_offset=len(data) if end is None else end,
        term_length=TERM,
        end_known=end_known,
        last=last,
    )


def decoded_rows(segment: LogSegment, **kwargs: Any) -> list[dict[str, Any]]:
    batches = [to_record_batch(b) for b in decode_segment(segment, **kwargs)]
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def used_length(data: bytes) -> int:
    """Where the frames end (a recording's stop position)."""
    offset = 0
    while offset < len(data):
        length = struct.unpack_from("<i", data, offset)[0]
        if length == 0:
            break
        offset += (length + 31) & ~31
    return offset


@settings(max_examples=60, deadline=None)
@given(
    batch=st.lists(messages, max_size=40),
    max_payload=st.sampled_from([32, 96, 1376]),
    batch_rows=st.sampled_from([1, 3, 65536]),
    payload_capacity=st.sampled_from([64, 4096, 1 << 20]),
)
def test_the_c_decoder_agrees_with_the_python_reference(
    tmp_path_factory: pytest.TempPathFactory,
    batch: list[bytes],
    max_payload: int,
    batch_rows: int,
    payload_capacity: int,
) -> None:
    tmp_path = tmp_path_factory.mktemp("segment")
    data = write_messages(batch, TERM, max_payload, terms=2)
    end = used_length(data)
    segment = segment_file(tmp_path, data, end=end)
    stats = DecodeStats()
    rows = decoded_rows(segment, batch_rows=batch_rows, payload_capacity=payload_capacity, stats=stats)
    expected = reference_rows(data, 0, 0, end)
    assert [{k: r[k] for k in COMPARED} for r in rows] == [{k: r[k] for k in COMPARED} for r in expected]
    assert stats.messages == len(batch) and stats.corrupt_regions == 0
    assert all(r["archive_dir"] == str(tmp_path) and r["recording_id"] == 0 for r in rows)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_garbage_never_crashes_the_decoder(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    """Random bytes, real frames with random bytes flipped, cut at any length:
    FAILFAST raises LogCorruptError only, PERMISSIVE never raises."""
    tmp_path = tmp_path_factory.mktemp("garbage")
    real = write_messages(
        data.draw(st.lists(messages, max_size=12)), TERM, data.draw(st.sampled_from([32, 1376])), terms=1
    )
    raw = bytearray(real if data.draw(st.booleans()) else data.draw(st.binary(min_size=1, max_size=4096)))
    for _ in range(data.draw(st.integers(0, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(1, len(raw)))]
    end = data.draw(st.integers(1, TERM))
    segment = segment_file(tmp_path, bytes(raw), end=end, end_known=data.draw(st.booleans()))
    try:
        decoded_rows(segment)
    except LogCorruptError as error:
        assert error.path == segment.path and 0 <= error.position <= max(end, len(raw))
    rows = decoded_rows(segment, permissive=True)
    assert all(r["log_position"] < r["next_position"] <= end for r in rows)


def test_an_impossible_term_length_is_named(tmp_path: Path) -> None:
    data = write_messages([session_message(1, b"a")], TERM, 1376, terms=1)
    segment = segment_file(tmp_path, data, end=used_length(data))
    broken = LogSegment(**{**segment.__dict__, "term_length": 0})
    with pytest.raises(LogCorruptError, match="the catalog's term length is impossible"):
        decoded_rows(broken)


def corrupt_at(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value) :]


def frame_offsets(data: bytes) -> list[int]:
    offsets, offset = [], 0
    while offset < len(data) and struct.unpack_from("<i", data, offset)[0] != 0:
        offsets.append(offset)
        offset += (struct.unpack_from("<i", data, offset)[0] + 31) & ~31
    return offsets


def test_a_bad_frame_length_fails_naming_the_file_and_position_or_is_skipped_to_the_next_term(tmp_path: Path) -> None:
    good = [session_message(1, bytes([i]) * 40) for i in range(10)]
    # Term 0 holds the first ten; a PAD and the next ten go to term 1.
    data = bytearray(write_messages(good, TERM, 1376, terms=2))
    pad_at = used_length(bytes(data))
    data[pad_at : pad_at + 32] = FRAME.pack(TERM - pad_at, 0, BEGIN | END, PAD, pad_at, 7, 100, 0, 0)
    second = write_messages(good, TERM, 1376, terms=1)
    data[TERM : 2 * TERM] = second
    bad = frame_offsets(bytes(data))[3]
    data[bad : bad + 4] = struct.pack("<i", 7)  # shorter than a frame header
    segment = segment_file(tmp_path, bytes(data), end=TERM + used_length(second))
    with pytest.raises(LogCorruptError) as error:
        decoded_rows(segment)
    assert str(error.value).startswith(f"{tmp_path / '0-0.rec'}: a frame length")
    assert f"at log position {bad} (file offset {bad})" in str(error.value)
    stats = DecodeStats()
    rows = decoded_rows(segment, permissive=True, stats=stats)
    kinds = [r["message_type"] for r in rows]
    assert kinds == ["SessionMessageHeader"] * 3 + [CORRUPT_TYPE] + ["SessionMessageHeader"] * 10
    corrupt = rows[3]
    assert (corrupt["log_position"], corrupt["next_position"]) == (bad, TERM)
    assert "skipped" in corrupt["corrupt_record"] and str(tmp_path / "0-0.rec") in corrupt["corrupt_record"]
    assert stats.corrupt_regions == 1 and len(stats.problems) == 1


@pytest.mark.parametrize("case", ["orphan-middle", "begin-inside", "short-message", "frame-type"])
def test_malformed_frames_are_errors_or_skipped_one_frame_at_a_time(tmp_path: Path, case: str) -> None:
    sent = [session_message(1, b"a" * 40), session_message(1, b"b" * 3000), session_message(1, b"c" * 40)]
    data = bytearray(write_messages(sent, TERM, 1376, terms=1))
    offsets = frame_offsets(bytes(data))  # 1 frame, 3 fragments, 1 frame
    if case == "orphan-middle":
        del_at = offsets[1]
        data[del_at + 5] = 0  # the begin fragment loses its BEGIN flag: every fragment is an orphan
        expected = ["SessionMessageHeader", CORRUPT_TYPE, CORRUPT_TYPE, CORRUPT_TYPE, "SessionMessageHeader"]
        at = offsets[1]
    elif case == "begin-inside":
        data[offsets[2] + 5] = BEGIN  # a middle fragment claims to begin a message
        expected = ["SessionMessageHeader", CORRUPT_TYPE, CORRUPT_TYPE, "SessionMessageHeader"]
        at = offsets[2]
    elif case == "short-message":
        data[offsets[0] + 32 : offsets[0] + 34] = struct.pack("<H", 8)  # block length 8 < 24
        expected = [CORRUPT_TYPE, "SessionMessageHeader", "SessionMessageHeader"]
        at = offsets[0]
    else:
        data[offsets[4] + 6 : offsets[4] + 8] = struct.pack("<H", 5)  # neither DATA nor PAD
        expected = ["SessionMessageHeader", "SessionMessageHeader", CORRUPT_TYPE]
        at = offsets[4]
    segment = segment_file(tmp_path, bytes(data), end=used_length(bytes(data)))
    with pytest.raises(LogCorruptError) as error:
        decoded_rows(segment)
    assert error.value.position == at and error.value.path == str(tmp_path / "0-0.rec")
    rows = decoded_rows(segment, permissive=True)
    assert [r["message_type"] for r in rows] == expected


def test_where_the_recorded_data_ends(tmp_path: Path) -> None:
    sent = [session_message(1, b"a" * 40), session_message(1, b"b" * 3000)]
    data = write_messages(sent, TERM, 1376, terms=1)
    offsets = frame_offsets(data)
    end = used_length(data)
    # A stop position inside the fragmented message (recorded while it was
    # being appended): the whole message before it, the rest is a tail.
    stats = DecodeStats()
    rows = decoded_rows(segment_file(tmp_path, data, end=offsets[2]), stats=stats)
    assert [len(r["payload"]) for r in rows] == [40] and stats.incomplete_tail == 1
    # A hole below the stop position is corruption...
    with pytest.raises(LogCorruptError, match="a hole"):
        decoded_rows(segment_file(tmp_path, data, end=end + 1024))
    # ...but where an active recording (no stop position) simply ends.
    rows = decoded_rows(segment_file(tmp_path, data, end=TERM, end_known=False))
    assert [len(r["payload"]) for r in rows] == [40, 3000]
    # A segment that is not the recording's last may not end inside a message.
    with pytest.raises(LogCorruptError, match="cut off"):
        decoded_rows(segment_file(tmp_path, data, end=offsets[2], last=False))


def test_a_short_or_missing_segment_file(tmp_path: Path) -> None:
    sent = [session_message(1, bytes([i]) * 100) for i in range(8)]
    data = write_messages(sent, TERM, 1376, terms=1)
    end = used_length(data)
    cut = frame_offsets(data)[5]
    segment = segment_file(tmp_path, data[:cut], end=end)
    with pytest.raises(LogCorruptError, match=rf"the segment file is short \({cut} bytes"):
        decoded_rows(segment)
    rows = decoded_rows(segment, permissive=True)
    assert [r["message_type"] for r in rows] == ["SessionMessageHeader"] * 5 + [CORRUPT_TYPE]
    assert (rows[-1]["log_position"], rows[-1]["next_position"]) == (cut, end)
    (tmp_path / "0-0.rec").unlink()
    with pytest.raises(LogCorruptError, match="the segment file is missing"):
        decoded_rows(segment)
    assert [r["message_type"] for r in decoded_rows(segment, permissive=True)] == [CORRUPT_TYPE]


def test_pad_frames_are_passed_over_and_a_message_needs_no_more_than_one_term(tmp_path: Path) -> None:
    big = [session_message(1, bytes([i]) * 20_000) for i in range(5)]  # three per 64 KiB term, then a pad
    data = write_messages(big, TERM, 1376, terms=3)
    stats = DecodeStats()
    rows = decoded_rows(segment_file(tmp_path, data, end=used_length(data)), stats=stats)
    assert [r["payload"] for r in rows] == [m[32:] for m in big]
    assert stats.padding_frames == 1 and all(r["fragments"] == 15 for r in rows)


def test_the_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown option"):
        ReadOptions.parse({"messagetype": "TimerEvent"})
    with pytest.raises(
        ValueError, match="unknown message type.s. TimerEvents; the log.s types are SessionMessageHeader"
    ):
        ReadOptions.parse({"messageTypes": "TimerEvents"})
    with pytest.raises(ValueError, match="mode must be FAILFAST"):
        ReadOptions.parse({"mode": "lenient"})
    with pytest.raises(ValueError, match="fromPosition must be an integer"):
        ReadOptions.parse({"fromPosition": "ten"})
    with pytest.raises(ValueError, match="recording ids must be integers"):
        ReadOptions.parse({"recordingIds": "1,x"})
    with pytest.raises(ValueError, match="is not a directory"):
        list(log_decoder.read_log(str(tmp_path / "nowhere")))
    assert ReadOptions.parse({"MODE": "permissive", "messageTypes": "TimerEvent, Corrupt"}).message_types == frozenset(
        {"TimerEvent", "Corrupt"}
    )
