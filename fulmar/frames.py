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
