"""Aeron's data frame: the 32-byte header every fragment in a log buffer and
every DATA datagram carries, its flags and types, and frame alignment."""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from fulmar.errors import CodecError

HEADER_LENGTH = 32
FRAME_ALIGNMENT = 32
CURRENT_VERSION = 0

FRAME_LENGTH_OFFSET = 0
VERSION_OFFSET = 4
FLAGS_OFFSET = 5
TYPE_OFFSET = 6
TERM_OFFSET_OFFSET = 8
SESSION_ID_OFFSET = 12
STREAM_ID_OFFSET = 16
TERM_ID_OFFSET = 20
RESERVED_VALUE_OFFSET = 24

BEGIN_FLAG = 0x80
END_FLAG = 0x40
UNFRAGMENTED = BEGIN_FLAG | END_FLAG
EOS_FLAG = 0x20


class FrameType(IntEnum):
    """The ``type`` field of the common frame header."""

    PAD = 0x00
    DATA = 0x01
    NAK = 0x02
    SM = 0x03
    ERR = 0x04
    SETUP = 0x05
    RTTM = 0x06
    RES = 0x07
    ATS_DATA = 0x08
    RSP_SETUP = 0x0B
    EXT = -1


DATA_HEADER = struct.Struct("<iBBhiiiiq")


class DataHeader(NamedTuple):
    frame_length: int
    version: int
    flags: int
    type: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int = 0

    def encode(self) -> bytes:
        return DATA_HEADER.pack(*self)


def decode_data_header(buffer: bytes | bytearray | memoryview, offset: int = 0) -> DataHeader:
    """Decode the 32-byte data header at ``offset``; ``CodecError`` when short."""
    if offset < 0 or len(buffer) - offset < HEADER_LENGTH:
        raise CodecError(
            f"data frame header: need {HEADER_LENGTH} bytes at offset {offset}, "
            f"buffer has {max(0, len(buffer) - offset)}"
        )
    return DataHeader(*DATA_HEADER.unpack_from(buffer, offset))


def align(value: int, alignment: int) -> int:
    """Round ``value`` up to a multiple of ``alignment`` (a power of two)."""
    return (value + alignment - 1) & ~(alignment - 1)


# ---------------------------------------------------------------------------
# UDP frames: the control frames a media driver exchanges with its peers and
# the DATA/PAD frames packed into one datagram.  Layouts are Aeron's
# (aeron_udp_protocol.h), little-endian, packed.  Every frame starts with the
# 8-byte common header: frame_length i32 @0, version @4, flags u8 @5, type i16 @6.
#
# Each decoder takes the datagram (or a region of it: ``offset``, ``length``)
# and raises CorruptFrameError for anything a well-behaved Aeron peer never
# sends: a datagram shorter than the frame, the wrong type, an unknown
# version, a frame_length below the frame's size or beyond the datagram, a
# negative offset or length.  Range checks that depend on configuration (a
# term length that is a power of two, an MTU within limits) belong to the
# receiver that acts on the frame, not to the codec.
# ---------------------------------------------------------------------------

from fulmar.errors import CorruptFrameError  # noqa: E402  (imported with the code that raises it)

# What the codecs accept: any contiguous bytes (an mmap'd term, a receive
# slot's memoryview, bytes); encoders need them writable.
Buffer = bytes | bytearray | memoryview

FRAME_HEADER_LENGTH = 8
MAX_UDP_PAYLOAD_LENGTH = 65504

FRAME_HEADER = struct.Struct("<iBBh")

SETUP_LENGTH = 40
SETUP_SEND_RESPONSE_FLAG = 0x80
SETUP_GROUP_FLAG = 0x40
SETUP_HEADER = struct.Struct("<iBBhiiiiiiii")

STATUS_MESSAGE_LENGTH = 36
# An SM carries a group tag (for tagged flow control) exactly when its
# frame_length is 44: that is the test Aeron's C driver applies.
STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH = 44
SM_SEND_SETUP_FLAG = 0x80
SM_EOS_FLAG = 0x40
STATUS_MESSAGE_HEADER = struct.Struct("<iBBhiiiiiq")
GROUP_TAG = struct.Struct("<q")

NAK_LENGTH = 28
NAK_HEADER = struct.Struct("<iBBhiiiii")

RTTM_LENGTH = 40
RTTM_REPLY_FLAG = 0x80
RTTM_HEADER = struct.Struct("<iBBhiiqqq")

ERROR_HEADER_LENGTH = 40
ERROR_MAX_MESSAGE_LENGTH = 1023
ERROR_HAS_GROUP_TAG_FLAG = 0x08
ERROR_HEADER = struct.Struct("<iBBhiiqqii")

RESPONSE_SETUP_LENGTH = 20
RESPONSE_SETUP_HEADER = struct.Struct("<iBBhiii")

# A heartbeat is a bare DATA header whose frame_length is 0, alone in a
# datagram of exactly 32 bytes (Aeron's receivers test both).
HEARTBEAT_LENGTH = HEADER_LENGTH

_DATA_HEADER_SIGNED_TYPE = struct.Struct("<iBBhiiiiq")


class SetupFrame(NamedTuple):
    frame_length: int
    flags: int
    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu_length: int
    ttl: int


class StatusMessage(NamedTuple):
    frame_length: int
    flags: int
    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window: int
    receiver_id: int
    group_tag: int | None


class NakFrame(NamedTuple):
    frame_length: int
    flags: int
    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int


class RttmFrame(NamedTuple):
    frame_length: int
    flags: int
    session_id: int
    stream_id: int
    echo_timestamp_ns: int
    reception_delta_ns: int
    receiver_id: int


class ErrorFrame(NamedTuple):
    frame_length: int
    flags: int
    session_id: int
    stream_id: int
    receiver_id: int
    group_tag: int | None
    error_code: int
    error_message: str


class ResponseSetupFrame(NamedTuple):
    frame_length: int
    flags: int
    session_id: int
    stream_id: int
    response_session_id: int


class Heartbeat(NamedTuple):
    flags: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int


class DataFrame(NamedTuple):
    """One DATA or PAD frame inside a datagram: where it starts and its header."""

    offset: int
    header: DataHeader


def _pack(layout: struct.Struct, name: str, buffer: Buffer, offset: int, *values: int) -> None:
    try:
        layout.pack_into(buffer, offset, *values)
    except struct.error as exc:
        # A field out of range or a buffer too small is the caller's bug:
        # say which frame, rather than struct's anonymous message.
        raise ValueError(f"{name}: cannot encode at offset {offset}: {exc}") from None


def _available(name: str, buffer: Buffer, offset: int, length: int | None, minimum: int) -> int:
    """The datagram length to decode against; CorruptFrameError when short."""
    size = memoryview(buffer).nbytes
    if offset < 0 or offset > size:
        raise CorruptFrameError(f"{name}: offset {offset} outside a buffer of {size} bytes")
    if length is None:
        length = size - offset
    elif length < 0 or length > size - offset:
        raise CorruptFrameError(f"{name}: length {length} at offset {offset} outside a buffer of {size} bytes")
    if length < minimum:
        raise CorruptFrameError(f"{name}: datagram of {length} bytes is shorter than the {minimum}-byte frame")
    return length


def _check_header(name: str, fields: tuple[int, ...], frame_type: int, minimum: int, available: int) -> None:
    frame_length, version, _flags, actual_type = fields[0], fields[1], fields[2], fields[3]
    if actual_type != frame_type:
        raise CorruptFrameError(f"{name}: frame type {actual_type:#x}, expected {frame_type:#x}")
    if version != CURRENT_VERSION:
        raise CorruptFrameError(f"{name}: unsupported version {version}")
    if frame_length < minimum:
        raise CorruptFrameError(f"{name}: frame_length {frame_length} is below the frame's {minimum} bytes")
    if frame_length > available:
        raise CorruptFrameError(f"{name}: frame_length {frame_length} exceeds the datagram's {available} bytes")


def _non_negative(name: str, **fields: int) -> None:
    for field, value in fields.items():
        if value < 0:
            raise CorruptFrameError(f"{name}: negative {field} {value}")


def frame_type_of(datagram: Buffer, length: int | None = None) -> int | None:
    """The type of the first frame in ``datagram`` (EXT is -1), or None when it
    has no complete common header or an unknown version (not an Aeron frame)."""
    view = memoryview(datagram)
    size = view.nbytes if length is None else min(length, view.nbytes)
    if size < FRAME_HEADER_LENGTH:
        return None
    _frame_length, version, _flags, frame_type = FRAME_HEADER.unpack_from(view, 0)
    return None if version != CURRENT_VERSION else int(frame_type)


# SETUP ----------------------------------------------------------------------


def encode_setup(
    buffer: Buffer,
    offset: int,
    *,
    term_offset: int,
    session_id: int,
    stream_id: int,
    initial_term_id: int,
    active_term_id: int,
    term_length: int,
    mtu_length: int,
    ttl: int = 0,
    flags: int = 0,
) -> int:
    _pack(
        SETUP_HEADER, "SETUP", buffer, offset,
        SETUP_LENGTH, CURRENT_VERSION, flags, FrameType.SETUP,
        term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu_length, ttl,
    )  # fmt: skip
    return SETUP_LENGTH


def decode_setup(buffer: Buffer, offset: int = 0, length: int | None = None) -> SetupFrame:
    available = _available("SETUP", buffer, offset, length, SETUP_LENGTH)
    fields = SETUP_HEADER.unpack_from(buffer, offset)
    _check_header("SETUP", fields, FrameType.SETUP, SETUP_LENGTH, available)
    frame = SetupFrame(fields[0], fields[2], *fields[4:])
    _non_negative("SETUP", term_offset=frame.term_offset, term_length=frame.term_length, mtu_length=frame.mtu_length)
    return frame


# STATUS MESSAGE -------------------------------------------------------------


def encode_status_message(
    buffer: Buffer,
    offset: int,
    *,
    session_id: int,
    stream_id: int,
    consumption_term_id: int,
    consumption_term_offset: int,
    receiver_window: int,
    receiver_id: int,
    group_tag: int | None = None,
    flags: int = 0,
) -> int:
    frame_length = STATUS_MESSAGE_LENGTH if group_tag is None else STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH
    _pack(
        STATUS_MESSAGE_HEADER, "SM", buffer, offset,
        frame_length, CURRENT_VERSION, flags, FrameType.SM,
        session_id, stream_id, consumption_term_id, consumption_term_offset, receiver_window, receiver_id,
    )  # fmt: skip
    if group_tag is not None:
        _pack(GROUP_TAG, "SM group tag", buffer, offset + STATUS_MESSAGE_LENGTH, group_tag)
    return frame_length


def decode_status_message(buffer: Buffer, offset: int = 0, length: int | None = None) -> StatusMessage:
    available = _available("SM", buffer, offset, length, STATUS_MESSAGE_LENGTH)
    fields = STATUS_MESSAGE_HEADER.unpack_from(buffer, offset)
    _check_header("SM", fields, FrameType.SM, STATUS_MESSAGE_LENGTH, available)
    frame_length, _version, flags, _type, session_id, stream_id, term_id, term_offset, window, receiver_id = fields
    group_tag = None
    if frame_length == STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH:
        (group_tag,) = GROUP_TAG.unpack_from(buffer, offset + STATUS_MESSAGE_LENGTH)
    message = StatusMessage(
        frame_length, flags, session_id, stream_id, term_id, term_offset, window, receiver_id, group_tag
    )
    _non_negative(
        "SM", consumption_term_offset=message.consumption_term_offset, receiver_window=message.receiver_window
    )
    return message


# NAK ------------------------------------------------------------------------


def encode_nak(
    buffer: Buffer, offset: int, *, session_id: int, stream_id: int, term_id: int, term_offset: int, length: int
) -> int:
    _pack(
        NAK_HEADER, "NAK", buffer, offset,
        NAK_LENGTH, CURRENT_VERSION, 0, FrameType.NAK, session_id, stream_id, term_id, term_offset, length,
    )  # fmt: skip
    return NAK_LENGTH


def decode_nak(buffer: Buffer, offset: int = 0, length: int | None = None) -> NakFrame:
    available = _available("NAK", buffer, offset, length, NAK_LENGTH)
    fields = NAK_HEADER.unpack_from(buffer, offset)
    _check_header("NAK", fields, FrameType.NAK, NAK_LENGTH, available)
    frame = NakFrame(fields[0], fields[2], *fields[4:])
    _non_negative("NAK", term_offset=frame.term_offset, length=frame.length)
    return frame


# RTTM -----------------------------------------------------------------------


def encode_rttm(
    buffer: Buffer,
    offset: int,
    *,
    session_id: int,
    stream_id: int,
    echo_timestamp_ns: int,
    reception_delta_ns: int,
    receiver_id: int,
    flags: int = 0,
) -> int:
    _pack(
        RTTM_HEADER, "RTTM", buffer, offset,
        RTTM_LENGTH, CURRENT_VERSION, flags, FrameType.RTTM,
        session_id, stream_id, echo_timestamp_ns, reception_delta_ns, receiver_id,
    )  # fmt: skip
    return RTTM_LENGTH


def decode_rttm(buffer: Buffer, offset: int = 0, length: int | None = None) -> RttmFrame:
    available = _available("RTTM", buffer, offset, length, RTTM_LENGTH)
    fields = RTTM_HEADER.unpack_from(buffer, offset)
    _check_header("RTTM", fields, FrameType.RTTM, RTTM_LENGTH, available)
    return RttmFrame(fields[0], fields[2], *fields[4:])


# ERR ------------------------------------------------------------------------


def encode_error(
    buffer: Buffer,
    offset: int,
    *,
    session_id: int,
    stream_id: int,
    receiver_id: int,
    error_code: int,
    error_message: str,
    group_tag: int | None = None,
    flags: int = 0,
) -> int:
    """Encode an ERR frame; the message is cut to Aeron's 1023-byte limit (as
    Aeron does: the frame must fit one datagram).  Returns the frame length."""
    text = error_message.encode("utf-8")[:ERROR_MAX_MESSAGE_LENGTH]
    frame_length = ERROR_HEADER_LENGTH + len(text)
    if group_tag is None:
        flags &= ~ERROR_HAS_GROUP_TAG_FLAG
        group_tag = 0
    else:
        flags |= ERROR_HAS_GROUP_TAG_FLAG
    _pack(
        ERROR_HEADER, "ERR", buffer, offset,
        frame_length, CURRENT_VERSION, flags, FrameType.ERR,
        session_id, stream_id, receiver_id, group_tag, error_code, len(text),
    )  # fmt: skip
    view = memoryview(buffer).cast("B")
    start = offset + ERROR_HEADER_LENGTH
    if start + len(text) > view.nbytes:
        raise ValueError(f"ERR: {frame_length}-byte frame does not fit at offset {offset} of {view.nbytes} bytes")
    view[start : start + len(text)] = text
    return frame_length


def decode_error(buffer: Buffer, offset: int = 0, length: int | None = None) -> ErrorFrame:
    available = _available("ERR", buffer, offset, length, ERROR_HEADER_LENGTH)
    fields = ERROR_HEADER.unpack_from(buffer, offset)
    _check_header("ERR", fields, FrameType.ERR, ERROR_HEADER_LENGTH, available)
    frame_length, _version, flags, _type, session_id, stream_id, receiver_id, group_tag, error_code, text_length = (
        fields
    )
    if text_length < 0 or ERROR_HEADER_LENGTH + text_length > frame_length:
        raise CorruptFrameError(f"ERR: error_length {text_length} does not fit frame_length {frame_length}")
    start = offset + ERROR_HEADER_LENGTH
    # Aeron writes ASCII; anything else is shown, not refused.
    text = bytes(memoryview(buffer).cast("B")[start : start + text_length]).decode("utf-8", errors="replace")
    tag = group_tag if flags & ERROR_HAS_GROUP_TAG_FLAG else None
    return ErrorFrame(frame_length, flags, session_id, stream_id, receiver_id, tag, error_code, text)


# RSP_SETUP ------------------------------------------------------------------


def encode_response_setup(
    buffer: Buffer, offset: int, *, session_id: int, stream_id: int, response_session_id: int
) -> int:
    _pack(
        RESPONSE_SETUP_HEADER, "RSP_SETUP", buffer, offset,
        RESPONSE_SETUP_LENGTH, CURRENT_VERSION, 0, FrameType.RSP_SETUP, session_id, stream_id, response_session_id,
    )  # fmt: skip
    return RESPONSE_SETUP_LENGTH


def decode_response_setup(buffer: Buffer, offset: int = 0, length: int | None = None) -> ResponseSetupFrame:
    available = _available("RSP_SETUP", buffer, offset, length, RESPONSE_SETUP_LENGTH)
    fields = RESPONSE_SETUP_HEADER.unpack_from(buffer, offset)
    _check_header("RSP_SETUP", fields, FrameType.RSP_SETUP, RESPONSE_SETUP_LENGTH, available)
    return ResponseSetupFrame(fields[0], fields[2], *fields[4:])


# Heartbeat (DATA with frame_length 0) ---------------------------------------


def encode_heartbeat(
    buffer: Buffer,
    offset: int,
    *,
    session_id: int,
    stream_id: int,
    term_id: int,
    term_offset: int,
    end_of_stream: bool = False,
) -> int:
    """A heartbeat at the publication's current position: BEGIN|END, plus EOS
    once the publication is closed and drained (Aeron's flags)."""
    flags = UNFRAGMENTED | (EOS_FLAG if end_of_stream else 0)
    _pack(
        _DATA_HEADER_SIGNED_TYPE, "heartbeat", buffer, offset,
        0, CURRENT_VERSION, flags, FrameType.DATA, term_offset, session_id, stream_id, term_id, 0,
    )  # fmt: skip
    return HEARTBEAT_LENGTH


def is_heartbeat(datagram: Buffer, length: int | None = None) -> bool:
    view = memoryview(datagram)
    size = view.nbytes if length is None else length
    if size != HEARTBEAT_LENGTH or view.nbytes < HEARTBEAT_LENGTH:
        return False
    frame_length, version, _flags, frame_type = FRAME_HEADER.unpack_from(view, 0)
    return frame_length == 0 and version == CURRENT_VERSION and frame_type == FrameType.DATA


def decode_heartbeat(buffer: Buffer, offset: int = 0, length: int | None = None) -> Heartbeat:
    available = _available("heartbeat", buffer, offset, length, HEARTBEAT_LENGTH)
    if available != HEARTBEAT_LENGTH:
        raise CorruptFrameError(f"heartbeat: datagram of {available} bytes, a heartbeat is {HEARTBEAT_LENGTH}")
    fields = _DATA_HEADER_SIGNED_TYPE.unpack_from(buffer, offset)
    frame_length, version, flags, frame_type, term_offset, session_id, stream_id, term_id, _reserved = fields
    if frame_type != FrameType.DATA:
        raise CorruptFrameError(f"heartbeat: frame type {frame_type:#x}, expected {int(FrameType.DATA):#x}")
    if version != CURRENT_VERSION:
        raise CorruptFrameError(f"heartbeat: unsupported version {version}")
    if frame_length != 0:
        raise CorruptFrameError(f"heartbeat: frame_length {frame_length}, a heartbeat has 0")
    _non_negative("heartbeat", term_offset=term_offset)
    return Heartbeat(flags, term_offset, session_id, stream_id, term_id)


# DATA/PAD frames in a datagram ----------------------------------------------


def data_frames(datagram: Buffer, length: int | None = None) -> list[DataFrame]:
    """Validate and list the DATA/PAD frames a sender packed into one datagram.

    A sender sends a contiguous run of its term: aligned frames, one after
    another, all of one session, stream and term, each frame's term_offset the
    first one's plus its place in the datagram.  A padding frame travels as its
    header alone (its frame_length covers the rest of the term), so when it
    pads beyond its header it must be the datagram's last frame.  A heartbeat
    (frame_length 0, a datagram of exactly 32 bytes) is listed as itself.

    Returns a list, not a lazy iterator, so that a corrupt frame late in the
    datagram is found before the caller acts on the first ones.
    """
    end = _available("DATA", datagram, 0, length, HEADER_LENGTH)
    frames: list[DataFrame] = []
    offset = 0
    first: DataHeader | None = None
    while offset < end:
        if end - offset < HEADER_LENGTH:
            raise CorruptFrameError(f"DATA: {end - offset} trailing bytes at offset {offset}, short of a header")
        header = DataHeader(*_DATA_HEADER_SIGNED_TYPE.unpack_from(datagram, offset))
        frame_length = header.frame_length
        if header.version != CURRENT_VERSION:
            raise CorruptFrameError(f"DATA: unsupported version {header.version} at offset {offset}")
        if header.type != FrameType.DATA and header.type != FrameType.PAD:
            raise CorruptFrameError(f"DATA: frame type {header.type:#x} at offset {offset} is neither DATA nor PAD")
        if first is None:
            if header.term_offset < 0 or header.term_offset & (FRAME_ALIGNMENT - 1):
                raise CorruptFrameError(f"DATA: term_offset {header.term_offset} is not a frame boundary")
            first = header
        elif (
            header.session_id != first.session_id
            or header.stream_id != first.stream_id
            or header.term_id != first.term_id
            or header.term_offset != first.term_offset + offset
        ):
            raise CorruptFrameError(
                f"DATA: frame at offset {offset} (session {header.session_id}, stream {header.stream_id}, "
                f"term {header.term_id}, term_offset {header.term_offset}) does not continue the first frame's run"
            )
        if frame_length == 0:
            if offset != 0 or end != HEARTBEAT_LENGTH or header.type != FrameType.DATA:
                raise CorruptFrameError(f"DATA: frame_length 0 at offset {offset} outside a heartbeat datagram")
            frames.append(DataFrame(offset, header))
            break
        if frame_length < HEADER_LENGTH:
            raise CorruptFrameError(f"DATA: frame_length {frame_length} at offset {offset} is below the header")
        if header.type == FrameType.PAD:
            frames.append(DataFrame(offset, header))
            offset += HEADER_LENGTH
            if align(frame_length, FRAME_ALIGNMENT) > HEADER_LENGTH and offset < end:
                raise CorruptFrameError(f"DATA: frames after a padding frame at offset {offset - HEADER_LENGTH}")
            continue
        if frame_length > end - offset:
            raise CorruptFrameError(
                f"DATA: frame_length {frame_length} at offset {offset} exceeds the datagram's {end - offset} bytes left"
            )
        frames.append(DataFrame(offset, header))
        offset += align(frame_length, FRAME_ALIGNMENT)
    return frames
