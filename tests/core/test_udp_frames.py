"""UDP frame codecs: Aeron's byte layouts (checked against bytes written out
by hand from aeron_udp_protocol.h), round trips, and garbage that must raise
CorruptFrameError and nothing else."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fulmar.errors import CorruptFrameError
from fulmar.frames import (
    BEGIN_FLAG,
    END_FLAG,
    ERROR_HAS_GROUP_TAG_FLAG,
    ERROR_MAX_MESSAGE_LENGTH,
    RTTM_REPLY_FLAG,
    SETUP_GROUP_FLAG,
    SETUP_SEND_RESPONSE_FLAG,
    SM_EOS_FLAG,
    SM_SEND_SETUP_FLAG,
    UNFRAGMENTED,
    DataHeader,
    ErrorFrame,
    FrameType,
    Heartbeat,
    NakFrame,
    ResponseSetupFrame,
    RttmFrame,
    SetupFrame,
    StatusMessage,
    data_frames,
    decode_error,
    decode_heartbeat,
    decode_nak,
    decode_response_setup,
    decode_rttm,
    decode_setup,
    decode_status_message,
    encode_error,
    encode_heartbeat,
    encode_nak,
    encode_response_setup,
    encode_rttm,
    encode_setup,
    encode_status_message,
    frame_type_of,
    is_heartbeat,
)


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(text.replace("|", " "))


def encoded(encoder: Callable[..., int], **fields: Any) -> bytes:
    buffer = bytearray(2048)
    length = encoder(buffer, 0, **fields)
    return bytes(buffer[:length])


# Bytes written out by hand from the C structs (little-endian, packed).
SETUP_BYTES = hexbytes(
    "28000000 | 00 | 80 | 0500 | 00010000 | feffffff | e9030000 | 07000000 | 09000000 | 00000100 | 80050000 | 04000000"
)
SM_BYTES = hexbytes(
    "24000000 | 00 | 80 | 0300 | 05000000 | 0a000000 | 03000000 | 40000000 | 00000200 | 0807060504030201"
)
SM_TAGGED_BYTES = hexbytes(
    "2c000000 | 00 | 40 | 0300 | 05000000 | 0a000000 | 03000000 | 40000000 | 00000200 | 0807060504030201"
    "| ffffffffffffffff"
)
NAK_BYTES = hexbytes("1c000000 | 00 | 00 | 0200 | 05000000 | 0a000000 | f9ffffff | 00100000 | 80050000")
RTTM_BYTES = hexbytes(
    "28000000 | 00 | 80 | 0600 | 05000000 | 0a000000 | 8877665544332211 | e803000000000000 | 0200000000000000"
)
ERR_BYTES = hexbytes(
    "2b000000 | 00 | 08 | 0400 | 05000000 | 0a000000 | 0300000000000000 | 0900000000000000 | 01000000 | 03000000"
    "| 626164"
)
RSP_SETUP_BYTES = hexbytes("14000000 | 00 | 00 | 0b00 | 05000000 | 0a000000 | 9cffffff")
HEARTBEAT_BYTES = hexbytes("00000000 | 00 | e0 | 0100 | 00200000 | 05000000 | 0a000000 | 03000000 | 0000000000000000")


def test_setup_layout() -> None:
    fields = dict(
        term_offset=0x100,
        session_id=-2,
        stream_id=1001,
        initial_term_id=7,
        active_term_id=9,
        term_length=65536,
        mtu_length=1408,
        ttl=4,
        flags=SETUP_SEND_RESPONSE_FLAG,
    )
    assert encoded(encode_setup, **fields) == SETUP_BYTES
    assert decode_setup(SETUP_BYTES) == SetupFrame(frame_length=40, **fields)
    assert (SETUP_SEND_RESPONSE_FLAG, SETUP_GROUP_FLAG) == (0x80, 0x40)


def test_status_message_layout_with_and_without_group_tag() -> None:
    fields = dict(
        session_id=5,
        stream_id=10,
        consumption_term_id=3,
        consumption_term_offset=0x40,
        receiver_window=128 * 1024,
        receiver_id=0x0102030405060708,
    )
    assert encoded(encode_status_message, **fields, flags=SM_SEND_SETUP_FLAG) == SM_BYTES
    assert decode_status_message(SM_BYTES) == StatusMessage(
        frame_length=36, flags=SM_SEND_SETUP_FLAG, **fields, group_tag=None
    )
    assert encoded(encode_status_message, **fields, group_tag=-1, flags=SM_EOS_FLAG) == SM_TAGGED_BYTES
    assert decode_status_message(SM_TAGGED_BYTES) == StatusMessage(
        frame_length=44, flags=SM_EOS_FLAG, **fields, group_tag=-1
    )
    # Only a frame_length of exactly 44 carries a tag (Aeron's C test): a
    # longer SM (application-specific feedback, older peers) has none.
    longer = bytearray(SM_TAGGED_BYTES + bytes(4))
    struct.pack_into("<i", longer, 0, 48)
    assert decode_status_message(longer).group_tag is None


def test_nak_layout() -> None:
    fields = dict(session_id=5, stream_id=10, term_id=-7, term_offset=0x1000, length=1408)
    assert encoded(encode_nak, **fields) == NAK_BYTES
    assert decode_nak(NAK_BYTES) == NakFrame(28, 0, **fields)


def test_rttm_layout() -> None:
    fields = dict(
        session_id=5, stream_id=10, echo_timestamp_ns=0x1122334455667788, reception_delta_ns=1000, receiver_id=2
    )
    assert encoded(encode_rttm, **fields, flags=RTTM_REPLY_FLAG) == RTTM_BYTES
    assert decode_rttm(RTTM_BYTES) == RttmFrame(40, RTTM_REPLY_FLAG, **fields)


def test_error_layout_and_group_tag_flag() -> None:
    fields = dict(session_id=5, stream_id=10, receiver_id=3, error_code=1, error_message="bad")
    assert encoded(encode_error, **fields, group_tag=9) == ERR_BYTES
    assert decode_error(ERR_BYTES) == ErrorFrame(43, ERROR_HAS_GROUP_TAG_FLAG, 5, 10, 3, 9, 1, "bad")

    untagged = encoded(encode_error, **fields, flags=ERROR_HAS_GROUP_TAG_FLAG)
    assert untagged[5] == 0  # no tag: the flag is cleared and the field zero
    assert untagged[24:32] == bytes(8)
    assert decode_error(untagged).group_tag is None


def test_error_message_is_cut_to_aerons_limit() -> None:
    frame = encoded(encode_error, session_id=1, stream_id=2, receiver_id=3, error_code=4, error_message="x" * 5000)
    assert len(frame) == 40 + ERROR_MAX_MESSAGE_LENGTH
    assert decode_error(frame).error_message == "x" * ERROR_MAX_MESSAGE_LENGTH


def test_response_setup_layout() -> None:
    fields = dict(session_id=5, stream_id=10, response_session_id=-100)
    assert encoded(encode_response_setup, **fields) == RSP_SETUP_BYTES
    assert decode_response_setup(RSP_SETUP_BYTES) == ResponseSetupFrame(20, 0, **fields)


def test_heartbeat_layout() -> None:
    fields = dict(session_id=5, stream_id=10, term_id=3, term_offset=0x2000)
    assert encoded(encode_heartbeat, **fields, end_of_stream=True) == HEARTBEAT_BYTES
    assert decode_heartbeat(HEARTBEAT_BYTES) == Heartbeat(0xE0, 0x2000, 5, 10, 3)
    plain = encoded(encode_heartbeat, **fields)
    assert plain[5] == UNFRAGMENTED
    assert is_heartbeat(plain) and is_heartbeat(HEARTBEAT_BYTES)
    # A heartbeat is alone in a 32-byte datagram.
    assert not is_heartbeat(plain + bytes(32))
    with pytest.raises(CorruptFrameError, match="heartbeat"):
        decode_heartbeat(plain + bytes(32))
    assert not is_heartbeat(NAK_BYTES + bytes(4))


def test_encoders_write_at_an_offset_and_leave_the_rest() -> None:
    buffer = bytearray(b"\xaa" * 100)
    assert encode_nak(buffer, 8, session_id=5, stream_id=10, term_id=-7, term_offset=0x1000, length=1408) == 28
    assert buffer[:8] == b"\xaa" * 8 and buffer[36:] == b"\xaa" * 64
    assert decode_nak(buffer, 8, 28) == decode_nak(NAK_BYTES)


def test_encoder_errors_name_the_frame() -> None:
    with pytest.raises(ValueError, match="SETUP"):
        encode_setup(
            bytearray(39), 0, term_offset=0, session_id=0, stream_id=0, initial_term_id=0,
            active_term_id=0, term_length=0, mtu_length=0,
        )  # fmt: skip
    with pytest.raises(ValueError, match="NAK"):
        encode_nak(bytearray(64), 0, session_id=1 << 31, stream_id=0, term_id=0, term_offset=0, length=0)
    with pytest.raises(ValueError, match="ERR"):
        encode_error(bytearray(41), 0, session_id=0, stream_id=0, receiver_id=0, error_code=0, error_message="ab")


def test_frame_type_of() -> None:
    assert frame_type_of(SETUP_BYTES) == FrameType.SETUP
    assert frame_type_of(SM_BYTES) == FrameType.SM
    assert frame_type_of(HEARTBEAT_BYTES) == FrameType.DATA
    assert frame_type_of(hexbytes("08000000 00 00 ffff")) == FrameType.EXT == -1
    assert frame_type_of(SETUP_BYTES[:7]) is None
    assert frame_type_of(SETUP_BYTES, 7) is None
    assert frame_type_of(b"") is None
    assert frame_type_of(hexbytes("28000000 01 00 0500")) is None  # version 1: not a frame we speak


# Every decoder rejects what a well-behaved peer never sends --------------

DECODERS: list[tuple[str, Callable[..., Any], bytes]] = [
    ("SETUP", decode_setup, SETUP_BYTES),
    ("SM", decode_status_message, SM_BYTES),
    ("SM", decode_status_message, SM_TAGGED_BYTES),
    ("NAK", decode_nak, NAK_BYTES),
    ("RTTM", decode_rttm, RTTM_BYTES),
    ("ERR", decode_error, ERR_BYTES),
    ("RSP_SETUP", decode_response_setup, RSP_SETUP_BYTES),
    ("heartbeat", decode_heartbeat, HEARTBEAT_BYTES),
]
IDS = [f"{name}-{len(frame)}" for name, _, frame in DECODERS]


@pytest.mark.parametrize(("name", "decode", "frame"), DECODERS, ids=IDS)
def test_short_datagrams_are_corrupt(name: str, decode: Callable[..., Any], frame: bytes) -> None:
    minimum = len(frame) if name != "ERR" else 40
    for length in range(minimum):
        with pytest.raises(CorruptFrameError, match=name):
            decode(frame[:length])
        with pytest.raises(CorruptFrameError, match=name):
            decode(frame, 0, length)


@pytest.mark.parametrize(("name", "decode", "frame"), DECODERS, ids=IDS)
def test_wrong_type_and_version_are_corrupt(name: str, decode: Callable[..., Any], frame: bytes) -> None:
    wrong_type = bytearray(frame)
    struct.pack_into("<h", wrong_type, 6, FrameType.PAD if frame[6] != FrameType.PAD else FrameType.DATA)
    with pytest.raises(CorruptFrameError, match=f"{name}: frame type"):
        decode(wrong_type)
    wrong_version = bytearray(frame)
    wrong_version[4] = 1
    with pytest.raises(CorruptFrameError, match=f"{name}: unsupported version 1"):
        decode(wrong_version)


@pytest.mark.parametrize(("name", "decode", "frame"), DECODERS[:-1], ids=IDS[:-1])
def test_frame_length_must_fit_frame_and_datagram(name: str, decode: Callable[..., Any], frame: bytes) -> None:
    for bad_length in (-1, 0, 8, 35 if name == "SM" else 19, len(frame) + 1, 1 << 30):
        corrupt = bytearray(frame)
        struct.pack_into("<i", corrupt, 0, bad_length)
        with pytest.raises(CorruptFrameError, match=name):
            decode(corrupt)
    # A datagram longer than its frame is fine (frames are checked against
    # the datagram, not for filling it).
    assert decode(frame + bytes(8)) == decode(frame)


def test_offset_and_length_outside_the_buffer_are_corrupt() -> None:
    with pytest.raises(CorruptFrameError, match="offset -1"):
        decode_nak(NAK_BYTES, -1)
    with pytest.raises(CorruptFrameError, match="offset 29"):
        decode_nak(NAK_BYTES, 29)
    with pytest.raises(CorruptFrameError, match="length 29"):
        decode_nak(NAK_BYTES, 0, 29)
    with pytest.raises(CorruptFrameError, match="length -3"):
        decode_nak(NAK_BYTES, 0, -3)


@pytest.mark.parametrize(
    ("decode", "frame", "offset", "field"),
    [
        (decode_setup, SETUP_BYTES, 8, "term_offset"),
        (decode_setup, SETUP_BYTES, 28, "term_length"),
        (decode_setup, SETUP_BYTES, 32, "mtu_length"),
        (decode_status_message, SM_BYTES, 20, "consumption_term_offset"),
        (decode_status_message, SM_BYTES, 24, "receiver_window"),
        (decode_nak, NAK_BYTES, 20, "term_offset"),
        (decode_nak, NAK_BYTES, 24, "length"),
        (decode_heartbeat, HEARTBEAT_BYTES, 8, "term_offset"),
    ],
)
def test_negative_offsets_and_lengths_are_corrupt(
    decode: Callable[..., Any], frame: bytes, offset: int, field: str
) -> None:
    corrupt = bytearray(frame)
    struct.pack_into("<i", corrupt, offset, -32)
    with pytest.raises(CorruptFrameError, match=f"negative {field} -32"):
        decode(corrupt)


def test_error_text_length_must_fit_the_frame() -> None:
    for text_length in (-1, 4, 1 << 30):
        corrupt = bytearray(ERR_BYTES)
        struct.pack_into("<i", corrupt, 36, text_length)
        with pytest.raises(CorruptFrameError, match="ERR: error_length"):
            decode_error(corrupt)


def test_heartbeat_needs_frame_length_zero() -> None:
    corrupt = bytearray(HEARTBEAT_BYTES)
    struct.pack_into("<i", corrupt, 0, 32)
    with pytest.raises(CorruptFrameError, match="heartbeat: frame_length 32"):
        decode_heartbeat(corrupt)
    assert not is_heartbeat(corrupt)


# DATA/PAD frames packed in one datagram ----------------------------------


def data_frame(term_offset: int, payload: bytes, *, frame_type: int = FrameType.DATA, frame_length: int | None = None,
               session_id: int = 5, stream_id: int = 10, term_id: int = 3, flags: int = UNFRAGMENTED) -> bytes:  # fmt: skip
    length = 32 + len(payload) if frame_length is None else frame_length
    header = DataHeader(length, 0, flags, frame_type, term_offset, session_id, stream_id, term_id, 0).encode()
    raw = header + payload
    return raw + bytes(-len(raw) % 32)


def test_several_frames_share_a_datagram() -> None:
    datagram = (
        data_frame(1024, b"a" * 8, flags=BEGIN_FLAG)  # 40 bytes, aligned to 64
        + data_frame(1088, b"", flags=0)  # 32
        + data_frame(1120, b"b" * 40, flags=END_FLAG)  # 72, aligned to 96
    )
    frames = data_frames(datagram)
    assert [(f.offset, f.header.frame_length, f.header.term_offset, f.header.flags) for f in frames] == [
        (0, 40, 1024, BEGIN_FLAG),
        (64, 32, 1088, 0),
        (96, 72, 1120, END_FLAG),
    ]
    # The last frame's alignment padding may be missing from the datagram.
    assert len(data_frames(datagram[: 96 + 72])) == 3


def test_padding_frame_travels_as_its_header_alone() -> None:
    # A pad that fills the rest of a 64 KiB term: only its header is sent.
    datagram = data_frame(65536 - 256, b"x" * 8) + data_frame(65536 - 192, b"", frame_type=FrameType.PAD,
                                                              frame_length=192)  # fmt: skip
    frames = data_frames(datagram)
    assert [(f.offset, f.header.type, f.header.frame_length) for f in frames] == [
        (0, FrameType.DATA, 40),
        (64, FrameType.PAD, 192),
    ]
    with pytest.raises(CorruptFrameError, match="frames after a padding frame"):
        data_frames(datagram + data_frame(65536 - 160, b""))
    # A pad of its header alone pads nothing beyond it: frames may follow.
    short_pad = data_frame(0, b"", frame_type=FrameType.PAD) + data_frame(32, b"y")
    assert [f.offset for f in data_frames(short_pad)] == [0, 32]


def test_heartbeat_datagram_lists_itself() -> None:
    frames = data_frames(HEARTBEAT_BYTES)
    assert len(frames) == 1 and frames[0].header.frame_length == 0 and frames[0].offset == 0


@pytest.mark.parametrize(
    ("datagram", "complaint"),
    [
        (b"", "shorter than"),
        (data_frame(0, b"")[:31], "shorter than"),
        (data_frame(0, b"") + bytes(8), "trailing bytes"),
        (data_frame(0, b"", frame_type=FrameType.SM), "neither DATA nor PAD"),
        (data_frame(0, b"") + data_frame(32, b"", frame_type=FrameType.NAK), "neither DATA nor PAD"),
        (data_frame(16, b""), "not a frame boundary"),
        (data_frame(-32, b""), "not a frame boundary"),
        (data_frame(0, b"") + data_frame(64, b""), "does not continue"),
        (data_frame(0, b"") + data_frame(32, b"", session_id=6), "does not continue"),
        (data_frame(0, b"") + data_frame(32, b"", stream_id=11), "does not continue"),
        (data_frame(0, b"") + data_frame(32, b"", term_id=4), "does not continue"),
        (data_frame(0, b"", frame_length=12), "below the header"),
        (data_frame(0, b"", frame_length=-5), "below the header"),
        (data_frame(0, b"", frame_length=65), "exceeds the datagram"),
        (data_frame(0, b"", frame_length=0) + bytes(32), "outside a heartbeat"),
        (data_frame(0, b"") + data_frame(32, b"", frame_length=0), "outside a heartbeat"),
    ],
)
def test_corrupt_packed_frames(datagram: bytes, complaint: str) -> None:
    with pytest.raises(CorruptFrameError, match=complaint):
        data_frames(datagram)


def test_packed_frames_with_a_wrong_version() -> None:
    datagram = bytearray(data_frame(0, b"") + data_frame(32, b""))
    datagram[32 + 4] = 2
    with pytest.raises(CorruptFrameError, match="unsupported version 2 at offset 32"):
        data_frames(datagram)


# Round trips -------------------------------------------------------------

i32 = st.integers(-(2**31), 2**31 - 1)
u31 = st.integers(0, 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
flags = st.integers(0, 255)


@given(i32, i32, i32, i32, u31, u31, u31, i32, flags, st.integers(0, 64))
def test_setup_round_trip(session, stream, initial, active, term_offset, term_length, mtu, ttl, flag, at) -> None:
    buffer = bytearray(at + 40)
    encode_setup(
        buffer, at, term_offset=term_offset, session_id=session, stream_id=stream, initial_term_id=initial,
        active_term_id=active, term_length=term_length, mtu_length=mtu, ttl=ttl, flags=flag,
    )  # fmt: skip
    assert decode_setup(buffer, at) == SetupFrame(40, flag, term_offset, session, stream, initial, active,
                                                  term_length, mtu, ttl)  # fmt: skip


@given(i32, i32, i32, u31, u31, i64, st.none() | i64, flags)
def test_status_message_round_trip(session, stream, term_id, term_offset, window, receiver, tag, flag) -> None:
    buffer = bytearray(44)
    length = encode_status_message(
        buffer, 0, session_id=session, stream_id=stream, consumption_term_id=term_id,
        consumption_term_offset=term_offset, receiver_window=window, receiver_id=receiver, group_tag=tag, flags=flag,
    )  # fmt: skip
    assert length == (36 if tag is None else 44)
    assert decode_status_message(buffer, 0, length) == StatusMessage(
        length, flag, session, stream, term_id, term_offset, window, receiver, tag
    )


@given(i32, i32, i32, u31, u31)
def test_nak_round_trip(session, stream, term_id, term_offset, length) -> None:
    buffer = bytearray(28)
    encode_nak(buffer, 0, session_id=session, stream_id=stream, term_id=term_id, term_offset=term_offset, length=length)
    assert decode_nak(buffer) == NakFrame(28, 0, session, stream, term_id, term_offset, length)


@given(i32, i32, i64, i64, i64, flags)
def test_rttm_round_trip(session, stream, echo, delta, receiver, flag) -> None:
    buffer = bytearray(40)
    encode_rttm(buffer, 0, session_id=session, stream_id=stream, echo_timestamp_ns=echo, reception_delta_ns=delta,
                receiver_id=receiver, flags=flag)  # fmt: skip
    assert decode_rttm(buffer) == RttmFrame(40, flag, session, stream, echo, delta, receiver)


@given(i32, i32, i64, i32, st.text(max_size=300), st.none() | i64, flags)
def test_error_round_trip(session, stream, receiver, code, message, tag, flag) -> None:
    buffer = bytearray(40 + ERROR_MAX_MESSAGE_LENGTH)
    length = encode_error(buffer, 0, session_id=session, stream_id=stream, receiver_id=receiver, error_code=code,
                          error_message=message, group_tag=tag, flags=flag)  # fmt: skip
    frame = decode_error(buffer, 0, length)
    expected_flags = flag | ERROR_HAS_GROUP_TAG_FLAG if tag is not None else flag & ~ERROR_HAS_GROUP_TAG_FLAG
    assert frame == ErrorFrame(length, expected_flags, session, stream, receiver, tag, code, message)


@given(i32, i32, i32)
def test_response_setup_round_trip(session, stream, response_session) -> None:
    buffer = bytearray(20)
    encode_response_setup(buffer, 0, session_id=session, stream_id=stream, response_session_id=response_session)
    assert decode_response_setup(buffer) == ResponseSetupFrame(20, 0, session, stream, response_session)


@given(i32, i32, i32, u31.map(lambda v: v & ~31), st.booleans())
def test_heartbeat_round_trip(session, stream, term_id, term_offset, eos) -> None:
    buffer = bytearray(32)
    encode_heartbeat(buffer, 0, session_id=session, stream_id=stream, term_id=term_id, term_offset=term_offset,
                     end_of_stream=eos)  # fmt: skip
    assert decode_heartbeat(buffer) == Heartbeat(0xE0 if eos else 0xC0, term_offset, session, stream, term_id)
    assert data_frames(buffer)[0].header == DataHeader(0, 0, 0xE0 if eos else 0xC0, 1, term_offset, session,
                                                       stream, term_id, 0)  # fmt: skip


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=8), st.integers(0, 2**30).map(lambda v: v & ~31))
def test_packed_frames_round_trip(payloads: list[bytes], start: int) -> None:
    datagram = b""
    for payload in payloads:
        datagram += data_frame(start + len(datagram), payload)
    frames = data_frames(datagram)
    assert [f.header.frame_length for f in frames] == [32 + len(p) for p in payloads]
    for frame, payload in zip(frames, payloads):
        assert datagram[frame.offset + 32 : frame.offset + frame.header.frame_length] == payload


# Fuzz: garbage raises CorruptFrameError or decodes; nothing else ----------

ALL_DECODERS: list[Callable[[bytes], object]] = [
    decode_setup, decode_status_message, decode_nak, decode_rttm, decode_error, decode_response_setup,
    decode_heartbeat, data_frames,
]  # fmt: skip
VALID = [SETUP_BYTES, SM_BYTES, SM_TAGGED_BYTES, NAK_BYTES, RTTM_BYTES, ERR_BYTES, RSP_SETUP_BYTES, HEARTBEAT_BYTES,
         data_frame(64, b"p" * 50) + data_frame(160, b"", frame_type=FrameType.PAD, frame_length=4000)]  # fmt: skip


def decode_everything(datagram: bytes) -> None:
    for decode in ALL_DECODERS:
        try:
            decode(datagram)
        except CorruptFrameError:
            pass
    frame_type_of(datagram)
    is_heartbeat(datagram)


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_corrupt_frame(datagram: bytes) -> None:
    decode_everything(datagram)


@settings(max_examples=300)
@given(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6),
       st.integers(0, 400))  # fmt: skip
def test_mutated_frames_only_raise_corrupt_frame(frame: bytes, mutations: list[tuple[int, int]], cut: int) -> None:
    datagram = bytearray(frame)
    for position, value in mutations:
        if datagram:
            datagram[position % len(datagram)] = value
    decode_everything(bytes(datagram[: max(cut, 8)]))
    decode_everything(bytes(datagram))


@settings(max_examples=200)
@given(st.sampled_from(VALID), st.integers(0, 3), st.sampled_from([-(2**31), -1, 0, 1, 31, 33, 2**31 - 1]))
def test_mutated_lengths_only_raise_corrupt_frame(frame: bytes, field: int, value: int) -> None:
    # Length-like fields (frame_length, an ERR text length, a NAK length) are
    # where a decoder could read out of bounds: set them to extremes.
    datagram = bytearray(frame)
    position = [0, 24, 36, len(frame) - 4][field]
    struct.pack_into("<i", datagram, min(position, len(frame) - 4), value)
    decode_everything(bytes(datagram))
