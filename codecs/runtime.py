"""Support code shared by the generated codecs in ``fulmar.codecs.generated``.

The generated modules keep the hot paths inline (one ``Struct.pack_into`` /
``Struct.unpack_from`` per root block); everything that only runs for variable
length data, repeating groups, old acting versions or errors lives here.

Buffers are anything supporting the buffer protocol with byte items: ``bytes``,
``bytearray``, ``mmap.mmap`` or a ``memoryview`` of format ``B``.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

from .errors import CodecError

ReadableBuffer = bytes | bytearray | memoryview | mmap.mmap
WritableBuffer = bytearray | memoryview | mmap.mmap

# Little-endian codecs for the primitive types.
I8 = struct.Struct("<b")
U8 = struct.Struct("<B")
I16 = struct.Struct("<h")
U16 = struct.Struct("<H")
I32 = struct.Struct("<i")
U32 = struct.Struct("<I")
I64 = struct.Struct("<q")
U64 = struct.Struct("<Q")

HEADER = struct.Struct("<HHHH")
"""SBE message header: blockLength, templateId, schemaId, version."""
HEADER_LENGTH = HEADER.size

GROUP_HEADER = struct.Struct("<HH")
"""SBE group dimension (groupSizeEncoding): blockLength, numInGroup."""
GROUP_HEADER_LENGTH = GROUP_HEADER.size

MAX_GROUP_COUNT = 0xFFFF


class Template(NamedTuple):
    """Names a message (or a group inside one) in error messages."""

    schema: str
    name: str
    id: int
    group: str = ""

    @property
    def label(self) -> str:
        label = f"{self.name}({self.id})"
        return f"{label}.{self.group}" if self.group else label

    def error(self, field: str | None, reason: str) -> CodecError:
        return CodecError(self.schema, self.label, field, reason)


class FieldLayout(NamedTuple):
    """One fixed-size field of a root block or group entry."""

    name: str
    codec: struct.Struct
    offset: int
    since_version: int
    null: Any


class MessageHeader(NamedTuple):
    block_length: int
    template_id: int
    schema_id: int
    version: int


# ---------------------------------------------------------------- enums

E = TypeVar("E", bound=IntEnum)


def unknown_enum_member(cls: type[E], value: object) -> E | None:
    """Build a pseudo member for a value the schema does not list.

    Used by the generated enums' ``_missing_`` so that decoding an unknown value
    yields e.g. ``<EventCode.UNKNOWN_9: 9>`` (still equal to 9) instead of raising.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    member = int.__new__(cls, value)
    member._name_ = f"UNKNOWN_{value}"
    member._value_ = value
    return member


# ---------------------------------------------------------------- base classes


class GroupEntry:
    """One decoded entry of a repeating group."""

    __slots__ = ()
    FIELD_NAMES: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in self.FIELD_NAMES}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


class MessageDecoder:
    """A reusable decoder: ``wrap`` decodes a message into the slots of ``self``.

    The whole message (root block, groups, var data) is bounds-checked and read
    by ``wrap``; afterwards the fields are plain attributes. Enum fields are
    properties returning the IntEnum; ``<name>_raw`` holds the wire value.
    """

    __slots__ = ("sbe_acting_block_length", "sbe_acting_version", "sbe_encoded_length")

    SCHEMA_NAME: ClassVar[str] = ""
    SCHEMA_ID: ClassVar[int] = 0
    SCHEMA_VERSION: ClassVar[int] = 0
    TEMPLATE_ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    BLOCK_LENGTH: ClassVar[int] = 0
    SINCE_VERSION: ClassVar[int] = 0
    FIELD_NAMES: ClassVar[tuple[str, ...]] = ()

    sbe_acting_block_length: int
    sbe_acting_version: int
    sbe_encoded_length: int
    """Bytes of the body read by the last wrap (root block, groups, var data; no header)."""

    def __init__(self) -> None:
        self.sbe_acting_block_length = self.BLOCK_LENGTH
        self.sbe_acting_version = self.SCHEMA_VERSION
        self.sbe_encoded_length = 0

    def wrap(
        self,
        buf: ReadableBuffer,
        offset: int,
        acting_block_length: int,
        acting_version: int,
        length: int | None = None,
    ) -> Self:
        raise NotImplementedError

    def wrap_headerless(self, buf: ReadableBuffer, offset: int, length: int | None = None) -> Self:
        """Decode a body written without a message header (this schema's own block length and version)."""
        return self.wrap(buf, offset, self.BLOCK_LENGTH, self.SCHEMA_VERSION, length)

    def to_dict(self) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in self.FIELD_NAMES}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


class FramedMessageDecoder(MessageDecoder):
    """Decoder of a schema whose messages carry the 8-byte SBE message header."""

    __slots__ = ()

    def wrap_and_apply_header(self, buf: ReadableBuffer, offset: int, length: int | None = None) -> Self:
        """Read the message header at ``offset``, check schema and template id, decode the body.

        ``length`` bounds the message (header included); by default it runs to the
        end of ``buf``.
        """
        size = len(buf)
        end = size if length is None else offset + length
        if offset >= 0 and end <= size and end - offset >= HEADER_LENGTH:
            block_length, template_id, schema_id, version = HEADER.unpack_from(buf, offset)
            if schema_id == self.SCHEMA_ID and template_id == self.TEMPLATE_ID:
                body = offset + HEADER_LENGTH
                return self.wrap(buf, body, block_length, version, end - body)
        raise self._header_error(buf, offset, length)

    def _header_error(self, buf: ReadableBuffer, offset: int, length: int | None) -> CodecError:
        template = Template(self.SCHEMA_NAME, self.NAME, self.TEMPLATE_ID)
        header, _ = read_header(self.SCHEMA_NAME, self.SCHEMA_ID, buf, offset, length, template)
        return template.error("messageHeader", f"header carries template id {header.template_id}")


class MessageEncoder:
    """Namespace of a message's encoders; subclasses define ``encode`` (and ``encode_headerless``)."""

    SCHEMA_NAME: ClassVar[str] = ""
    SCHEMA_ID: ClassVar[int] = 0
    SCHEMA_VERSION: ClassVar[int] = 0
    TEMPLATE_ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    BLOCK_LENGTH: ClassVar[int] = 0

    @classmethod
    def encode_fields(cls, buf: WritableBuffer, offset: int, fields: Mapping[str, Any]) -> int:
        """``encode`` with the fields given as a mapping (for generic code and tests)."""
        encode = getattr(cls, "encode")
        result: int = encode(buf, offset, **fields)
        return result


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, GroupEntry):
        return value.to_dict()
    return value


# ---------------------------------------------------------------- header


def read_header(
    schema: str,
    schema_id: int,
    buf: ReadableBuffer,
    offset: int,
    length: int | None,
    template: Template | None = None,
) -> tuple[MessageHeader, int]:
    """Decode and check a message header; return it and the end of the message."""
    size = len(buf)
    end = size if length is None else offset + length
    label = template.label if template is not None else None
    if offset < 0 or offset > size:
        raise CodecError(schema, label, None, f"offset {offset} outside buffer of {size} bytes")
    if length is not None and length < 0:
        raise CodecError(schema, label, None, f"negative length {length}")
    if end > size:
        raise CodecError(schema, label, None, f"length {length} at offset {offset} runs past the buffer end ({size})")
    if end - offset < HEADER_LENGTH:
        raise CodecError(
            schema, label, "messageHeader", f"truncated message header: {end - offset} of {HEADER_LENGTH} bytes"
        )
    header = MessageHeader(*HEADER.unpack_from(buf, offset))
    if header.schema_id != schema_id:
        raise CodecError(
            schema, label, "messageHeader", f"schema id {header.schema_id} in header, expected {schema_id}"
        )
    return header, end


def write_header(
    schema: str, buf: WritableBuffer, offset: int, block_length: int, template_id: int, schema_id: int, version: int
) -> int:
    try:
        if offset < 0:
            raise struct.error("negative offset")
        HEADER.pack_into(buf, offset, block_length, template_id, schema_id, version)
    except struct.error as ex:
        raise CodecError(schema, None, "messageHeader", f"cannot encode header: {ex}") from None
    return HEADER_LENGTH


def decode_framed(
    schema: str,
    schema_id: int,
    decoders: Mapping[int, type[FramedMessageDecoder]],
    buf: ReadableBuffer,
    offset: int,
    length: int | None,
) -> FramedMessageDecoder:
    header, end = read_header(schema, schema_id, buf, offset, length)
    cls = decoders.get(header.template_id)
    if cls is None:
        raise CodecError(schema, None, None, f"unknown template id {header.template_id}")
    decoder = cls()
    body = offset + HEADER_LENGTH
    decoder.wrap(buf, body, header.block_length, header.version, end - body)
    return decoder


# ---------------------------------------------------------------- root blocks


def span_error(
    t: Template,
    layout: Sequence[FieldLayout],
    size: int,
    offset: int,
    length: int | None,
    acting_block_length: int,
) -> CodecError:
    """Explain why a wrap's bounds check failed."""
    if offset < 0 or offset > size:
        return t.error(None, f"offset {offset} outside buffer of {size} bytes")
    if length is not None and length < 0:
        return t.error(None, f"negative length {length}")
    end = size if length is None else offset + length
    if end > size:
        return t.error(None, f"length {length} at offset {offset} runs past the buffer end ({size})")
    if acting_block_length < 0:
        return t.error(None, f"negative block length {acting_block_length}")
    available = end - offset
    cut = next((f for f in layout if f.offset + f.codec.size > available), None)
    return t.error(
        cut.name if cut is not None else None,
        f"truncated root block: block length {acting_block_length}, {available} bytes available",
    )


def required_block_length(layout: Sequence[FieldLayout], acting_version: int) -> int:
    """Smallest block holding every field that exists at ``acting_version``."""
    required = 0
    for f in layout:
        if f.since_version <= acting_version:
            required = max(required, f.offset + f.codec.size)
    return required


def unpack_versioned(
    t: Template,
    layout: Sequence[FieldLayout],
    buf: ReadableBuffer,
    offset: int,
    acting_block_length: int,
    acting_version: int,
) -> tuple[Any, ...]:
    """Read a root block written at an older version, or with a shorter block.

    Fields newer than ``acting_version`` read as their null value. A block too
    short for the fields its version promises is an error.
    """
    required = required_block_length(layout, acting_version)
    if acting_block_length < required:
        cut = next(
            f for f in layout if f.since_version <= acting_version and f.offset + f.codec.size > acting_block_length
        )
        raise t.error(
            cut.name,
            f"block length {acting_block_length} too short for version {acting_version} (needs {required})",
        )
    return tuple(
        f.codec.unpack_from(buf, offset + f.offset)[0] if f.since_version <= acting_version else f.null for f in layout
    )


def pack_error(
    t: Template,
    layout: Sequence[FieldLayout],
    values: Sequence[Any],
    buf: WritableBuffer,
    block_offset: int,
    block_length: int,
    ex: Exception,
) -> CodecError:
    """Explain why packing a root block failed: a bad value, or a buffer too small."""
    for f, value in zip(layout, values):
        try:
            f.codec.pack(value)
        except struct.error as field_ex:
            return t.error(f.name, f"cannot encode {value!r}: {field_ex}")
    return t.error(
        None,
        f"buffer of {len(buf)} bytes too small for a {block_length}-byte block at offset {block_offset} ({ex})",
    )


def negative_offset(t: Template, offset: int) -> CodecError:
    return t.error(None, f"negative offset {offset}")


# ---------------------------------------------------------------- var data


def _read_var_span(
    t: Template, field: str, buf: ReadableBuffer, pos: int, end: int, length_codec: struct.Struct
) -> tuple[int, int]:
    prefix = length_codec.size
    if end - pos < prefix:
        raise t.error(field, f"truncated length prefix at offset {pos}: {max(end - pos, 0)} of {prefix} bytes")
    (n,) = length_codec.unpack_from(buf, pos)
    pos += prefix
    if n < 0:
        raise t.error(field, f"negative length {n}")
    if n > end - pos:
        raise t.error(field, f"length {n} exceeds the {end - pos} bytes left")
    return pos, n


def _skip_padding(t: Template, field: str, pos: int, end: int, n: int, align: int) -> int:
    pad = -n % align
    if pad > end - pos:
        raise t.error(field, f"truncated alignment padding: {end - pos} of {pad} bytes")
    return pos + pad


def read_ascii(
    t: Template, field: str, buf: ReadableBuffer, pos: int, end: int, length_codec: struct.Struct, align: int
) -> tuple[str, int]:
    """Read length-prefixed US-ASCII text; return it and the position after it (and its padding)."""
    pos, n = _read_var_span(t, field, buf, pos, end, length_codec)
    try:
        value = str(buf[pos : pos + n], "ascii")
    except UnicodeDecodeError as ex:
        raise t.error(field, f"text is not US-ASCII (byte {ex.start})") from None
    pos += n
    if align:
        pos = _skip_padding(t, field, pos, end, n, align)
    return value, pos


def read_bytes(
    t: Template, field: str, buf: ReadableBuffer, pos: int, end: int, length_codec: struct.Struct, align: int
) -> tuple[bytes, int]:
    """Read length-prefixed raw bytes; return a copy and the position after it (and its padding)."""
    pos, n = _read_var_span(t, field, buf, pos, end, length_codec)
    value = bytes(buf[pos : pos + n])
    pos += n
    if align:
        pos = _skip_padding(t, field, pos, end, n, align)
    return value, pos


def _write_var(
    t: Template,
    field: str,
    buf: WritableBuffer,
    pos: int,
    data: bytes | bytearray | memoryview,
    length_codec: struct.Struct,
    max_length: int,
    align: int,
) -> int:
    n = len(data)
    if n > max_length:
        raise t.error(field, f"length {n} exceeds the maximum {max_length}")
    pad = -n % align if align else 0
    start = pos + length_codec.size
    end = start + n + pad
    if end > len(buf):
        raise t.error(field, f"buffer of {len(buf)} bytes too small: needs {end} for this field")
    length_codec.pack_into(buf, pos, n)
    buf[start : start + n] = data
    if pad:
        buf[start + n : end] = bytes(pad)
    return end


def write_ascii(
    t: Template,
    field: str,
    buf: WritableBuffer,
    pos: int,
    value: str | bytes,
    length_codec: struct.Struct,
    max_length: int,
    align: int,
) -> int:
    """Write length-prefixed US-ASCII text (a str, or bytes already encoded); return the end position."""
    if isinstance(value, str):
        try:
            data = value.encode("ascii")
        except UnicodeEncodeError as ex:
            raise t.error(field, f"text is not US-ASCII (character {ex.start})") from None
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if not data.isascii():
            raise t.error(field, "text is not US-ASCII")
    else:
        raise t.error(field, f"expected str, got {type(value).__name__}")
    return _write_var(t, field, buf, pos, data, length_codec, max_length, align)


def write_bytes(
    t: Template,
    field: str,
    buf: WritableBuffer,
    pos: int,
    value: bytes | bytearray | memoryview,
    length_codec: struct.Struct,
    max_length: int,
    align: int,
) -> int:
    """Write length-prefixed raw bytes; return the end position."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise t.error(field, f"expected bytes, got {type(value).__name__}")
    return _write_var(t, field, buf, pos, value, length_codec, max_length, align)


# ---------------------------------------------------------------- groups


def read_group_header(
    t: Template,
    field: str | None,
    buf: ReadableBuffer,
    pos: int,
    end: int,
    layout: Sequence[FieldLayout],
    acting_version: int,
) -> tuple[int, int, int]:
    """Read and check a group dimension; return (block_length, count, position of the first entry)."""
    if end - pos < GROUP_HEADER_LENGTH:
        raise t.error(field, f"truncated group header at offset {pos}: {max(end - pos, 0)} of 4 bytes")
    block_length, count = GROUP_HEADER.unpack_from(buf, pos)
    pos += GROUP_HEADER_LENGTH
    required = required_block_length(layout, acting_version)
    if block_length < required:
        raise t.error(field, f"group block length {block_length} too short (needs {required})")
    if count * block_length > end - pos:
        raise t.error(field, f"{count} entries of {block_length} bytes exceed the {end - pos} bytes left")
    return block_length, count, pos


def unpack_entry(layout: Sequence[FieldLayout], buf: ReadableBuffer, pos: int, acting_version: int) -> tuple[Any, ...]:
    """Read one group entry block whose length was checked by ``read_group_header``."""
    return tuple(
        f.codec.unpack_from(buf, pos + f.offset)[0] if f.since_version <= acting_version else f.null for f in layout
    )


def write_group_header(
    t: Template, field: str | None, buf: WritableBuffer, pos: int, block_length: int, count: int
) -> int:
    if count > MAX_GROUP_COUNT:
        raise t.error(field, f"{count} entries exceed the group maximum {MAX_GROUP_COUNT}")
    if pos + GROUP_HEADER_LENGTH > len(buf):
        raise t.error(field, f"buffer of {len(buf)} bytes too small for the group header at {pos}")
    GROUP_HEADER.pack_into(buf, pos, block_length, count)
    return pos + GROUP_HEADER_LENGTH


REQUIRED: Any = object()
"""Marks a group entry member that has no default."""


def entry_values(
    t: Template,
    entry: Mapping[str, Any] | GroupEntry,
    names: Sequence[str],
    defaults: Sequence[Any],
) -> list[Any]:
    """Members of one group entry to encode, from a mapping of snake_case names or a decoded entry."""
    if isinstance(entry, GroupEntry):
        return [getattr(entry, name) for name in names]
    if not isinstance(entry, Mapping):
        raise t.error(None, f"group entry must be a mapping, got {type(entry).__name__}")
    unknown = [key for key in entry if key not in names]
    if unknown:
        raise t.error(None, f"unknown group entry member(s) {unknown}")
    values = []
    for name, default in zip(names, defaults):
        value = entry.get(name, default)
        if value is REQUIRED:
            raise t.error(None, f"group entry lacks {name!r}")
        values.append(value)
    return values
