"""Garbage in, CodecError out: no decoder may raise anything else, read out of bounds or hang."""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fulmar.codecs import CodecError
from fulmar.codecs.generate import GroupDef, MessageDef, SchemaDef
from support import codec_strategies as testing

SCHEMAS = testing.schemas()
CASES = [(schema, message) for schema in SCHEMAS for message in schema.messages]
IDS = [f"{schema.module}.{message.name}" for schema, message in CASES]

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HUGE_U32 = (0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x40000001)


def module_of(schema: SchemaDef) -> Any:
    return importlib.import_module(f"fulmar.codecs.generated.{schema.module}")


def only_codec_error(action: Callable[[], Any], what: str) -> bool:
    """Run a decode; True if it succeeded, False if it raised CodecError; fail on anything else."""
    try:
        action()
    except CodecError:
        return False
    except Exception as ex:  # pragma: no cover - the failure path
        pytest.fail(f"{what}: {type(ex).__name__}: {ex}")
    return True


def decode_all_ways(schema: SchemaDef, message: MessageDef, data: bytes, what: str) -> bool:
    """Decode ``data`` through every entry point; return True if the generic decode accepted it."""
    module = module_of(schema)
    cls = module.DECODERS[message.id]
    buf = memoryview(data)
    if schema.headerless:
        ok = only_codec_error(lambda: module.decode(message.id, buf, 0, len(data)), what)
        only_codec_error(lambda: cls().wrap_headerless(buf, 0), what)
        return ok
    ok = only_codec_error(lambda: module.decode(buf, 0, len(data)), what)
    only_codec_error(lambda: cls().wrap_and_apply_header(buf, 0, len(data)), what)
    only_codec_error(lambda: cls().wrap_headerless(buf, 0), what)
    return ok


def rich_fields(owner: MessageDef | GroupDef, depth: int = 0) -> dict[str, Any]:
    """A deterministic value with every member present and non-empty."""
    fields: dict[str, Any] = {}
    for i, f in enumerate(owner.fields):
        if f.is_array:
            fields[f.py] = bytes(range(1, f.size + 1))
        elif f.enum:
            fields[f.py] = f.enum.values[-1][1]
        else:
            fields[f.py] = min(f.primitive.hi, 1000 + i)
    for g in owner.groups:
        fields[g.py] = [rich_fields(g, depth + 1), rich_fields(g, depth + 1)]
    for j, v in enumerate(owner.var_data):
        fields[v.py] = "abcde"[: 1 + (j + depth) % 5] if v.ascii else bytes(range(1 + (j + depth) % 7))
    return fields


def rich_encoding(schema: SchemaDef, message: MessageDef) -> bytes:
    module = module_of(schema)
    buf = bytearray(4096)
    length = module.ENCODERS[message.id].encode_fields(buf, 0, rich_fields(message))
    return bytes(buf[:length])


@pytest.mark.parametrize(("schema", "message"), CASES, ids=IDS)
def test_every_truncation_and_huge_value(schema: SchemaDef, message: MessageDef) -> None:
    valid = rich_encoding(schema, message)
    assert decode_all_ways(schema, message, valid, "valid encoding")
    # Every strict prefix is missing something the decoder must read.
    for cut in range(len(valid)):
        accepted = decode_all_ways(schema, message, valid[:cut], f"prefix of {cut} bytes")
        assert not accepted, f"{message.name}: a {cut}-byte prefix of a {len(valid)}-byte message decoded"
    # Huge or negative 32-bit values (lengths!) and 0xFFFF (group counts) at every position.
    for pos in range(len(valid) - 1):
        for huge in HUGE_U32:
            if pos + 4 <= len(valid):
                mutated = bytearray(valid)
                struct.pack_into("<I", mutated, pos, huge)
                decode_all_ways(schema, message, bytes(mutated), f"u32 {huge:#x} at {pos}")
        mutated = bytearray(valid)
        struct.pack_into("<H", mutated, pos, 0xFFFF)
        decode_all_ways(schema, message, bytes(mutated), f"u16 0xffff at {pos}")


@st.composite
def mutations(draw: st.DrawFn, valid: bytes) -> bytes:
    data = bytearray(valid)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "byte", "u32", "truncate", "extend", "splice"]))
        if kind == "flip" and data:
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif kind == "byte" and data:
            i = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[i] = draw(st.integers(min_value=0, max_value=255))
        elif kind == "u32" and len(data) >= 4:
            i = draw(st.integers(min_value=0, max_value=len(data) - 4))
            value = draw(st.one_of(st.sampled_from(HUGE_U32), st.integers(min_value=0, max_value=0xFFFFFFFF)))
            struct.pack_into("<I", data, i, value)
        elif kind == "truncate":
            del data[draw(st.integers(min_value=0, max_value=len(data))) :]
        elif kind == "extend":
            data += draw(st.binary(max_size=16))
        elif kind == "splice" and data:
            i = draw(st.integers(min_value=0, max_value=len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@pytest.mark.parametrize(("schema", "message"), CASES, ids=IDS)
@FUZZ
@given(data=st.data())
def test_mutated_encodings(schema: SchemaDef, message: MessageDef, data: st.DataObject) -> None:
    module = module_of(schema)
    fields = data.draw(testing.message_fields(message))
    buf = bytearray(testing.encoded_length_bound(message))
    length = module.ENCODERS[message.id].encode_fields(buf, 0, fields)
    mutated = data.draw(mutations(bytes(buf[:length])))
    decode_all_ways(schema, message, mutated, "mutated encoding")
    if not schema.headerless:
        # arbitrary acting block length / version handed to wrap directly
        block_length = data.draw(st.integers(min_value=-2, max_value=0xFFFF))
        version = data.draw(st.integers(min_value=0, max_value=0xFFFF))
        cls = module.DECODERS[message.id]
        only_codec_error(
            lambda: cls().wrap(mutated, module.HEADER_LENGTH, block_length, version, len(mutated) - 8),
            f"wrap(block_length={block_length}, version={version})",
        )


@pytest.mark.parametrize("schema", SCHEMAS, ids=[s.module for s in SCHEMAS])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_bytes(schema: SchemaDef, data: st.DataObject) -> None:
    module = module_of(schema)
    ids = sorted(module.DECODERS)
    template_id = data.draw(st.sampled_from(ids))
    body = data.draw(st.binary(max_size=200))
    if schema.headerless:
        only_codec_error(lambda: module.decode(template_id, body, 0, len(body)), "random body")
        return
    # random bytes, and random bodies behind a plausible header of this schema
    only_codec_error(lambda: module.decode(body, 0, len(body)), "random bytes")
    block_length = data.draw(st.one_of(st.integers(min_value=0, max_value=0xFFFF), st.sampled_from([0, 8, 16, 24])))
    version = data.draw(st.integers(min_value=0, max_value=0xFFFF))
    framed = struct.pack("<HHHH", block_length, template_id, schema.id, version) + body
    only_codec_error(lambda: module.decode(framed, 0, len(framed)), "random body behind a header")


@pytest.mark.parametrize("schema", [s for s in SCHEMAS if not s.headerless], ids=lambda s: s.module)
def test_bad_arguments_and_headers(schema: SchemaDef) -> None:
    module = module_of(schema)
    message = schema.messages[0]
    valid = rich_encoding(schema, message)
    cls = module.DECODERS[message.id]
    for offset, length in ((-1, None), (len(valid) + 1, None), (0, -1), (0, len(valid) + 1), (3, len(valid))):
        with pytest.raises(CodecError):
            cls().wrap_and_apply_header(valid, offset, length)
        with pytest.raises(CodecError):
            module.decode(valid, offset, length)
    with pytest.raises(CodecError, match="negative block length"):
        cls().wrap(valid, 8, -1, schema.version)
    with pytest.raises(CodecError, match=f"schema id 7 in header, expected {schema.id}"):
        module.decode(struct.pack("<HHHH", 0, message.id, 7, 1) + valid[8:])
    unknown = max(module.DECODERS) + 1
    with pytest.raises(CodecError, match=f"unknown template id {unknown}"):
        module.decode(struct.pack("<HHHH", 0, unknown, schema.id, 1) + valid[8:])
    others = [m for m in schema.messages if m.id != message.id]
    if others:  # a schema of one message (the archive mark file) has no other template to mistake
        other = others[0]
        with pytest.raises(CodecError, match=f"header carries template id {other.id}"):
            cls().wrap_and_apply_header(rich_encoding(schema, other), 0)
    with pytest.raises(CodecError, match="truncated message header"):
        module.read_header(valid[:7])


def test_driver_unknown_msg_type_id() -> None:
    from fulmar.codecs.generated import driver

    with pytest.raises(CodecError, match="unknown msg_type_id 0x12"):
        driver.decode(0x12, bytes(64), 0, 64)
