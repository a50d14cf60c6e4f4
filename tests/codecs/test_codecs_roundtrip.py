"""Round trips of every message of every schema, with strategies derived from the parsed schemas."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fulmar.codecs import CodecError, generate
from fulmar.codecs.generate import MessageDef, SchemaDef
from support import codec_strategies as testing

SCHEMAS = testing.schemas()
CASES = [(schema, message) for schema in SCHEMAS for message in schema.messages]
IDS = [f"{schema.module}.{message.name}" for schema, message in CASES]

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def module_of(schema: SchemaDef) -> Any:
    return importlib.import_module(f"fulmar.codecs.generated.{schema.module}")


def test_every_message_is_generated_and_tested() -> None:
    for schema in SCHEMAS:
        module = module_of(schema)
        ids = {m.id for m in schema.messages}
        assert set(module.DECODERS) == ids
        assert set(module.ENCODERS) == ids
    assert len(CASES) == sum(len(module_of(s).DECODERS) for s in SCHEMAS)
    # the schemas fulmar must speak, by size
    assert {s.module: (s.id, s.version, len(s.messages)) for s in SCHEMAS} == {
        "cluster": (111, 12, 54),
        "archive": (101, 10, 48),
        "archive_mark": (100, 2, 1),
        "cluster_mark": (110, 2, 1),
        "driver": (900, 1, 29),
    }


@pytest.mark.parametrize(("schema", "message"), CASES, ids=IDS)
@FAST
@given(data=st.data())
def test_round_trip(schema: SchemaDef, message: MessageDef, data: st.DataObject) -> None:
    module = module_of(schema)
    fields = data.draw(testing.message_fields(message))
    encoder = module.ENCODERS[message.id]
    decoder_cls = module.DECODERS[message.id]
    buf = bytearray(testing.encoded_length_bound(message))

    if schema.headerless:
        length = encoder.encode_fields(buf, 0, fields)
        decoder = module.decode(message.id, buf, 0, length)
        assert decoder.sbe_encoded_length == length
    else:
        length = encoder.encode_fields(buf, 0, fields)
        decoder = module.decode(buf, 0, length)
        assert decoder.sbe_encoded_length == length - module.HEADER_LENGTH
        assert decoder.sbe_acting_version == schema.version
        # the same body without a header
        body = bytearray(len(buf))
        body_length = encoder.encode_headerless(body, 0, **fields)
        assert body_length == length - module.HEADER_LENGTH
        assert body[:body_length] == buf[module.HEADER_LENGTH : length]
        again = decoder_cls().wrap_headerless(body, 0, body_length)
        assert again.to_dict() == fields

    assert type(decoder) is decoder_cls
    assert decoder.to_dict() == fields

    # decoding at an offset inside a larger buffer (e.g. a term) reads only the message
    shifted = bytearray(7) + buf[:length] + bytes(range(50))
    if schema.headerless:
        assert decoder_cls().wrap_headerless(shifted, 7, length).to_dict() == fields
    else:
        assert decoder_cls().wrap_and_apply_header(shifted, 7, length).to_dict() == fields
        # re-encoding the decoded message reproduces the bytes
        copy = bytearray(len(buf))
        assert encoder.encode_fields(copy, 0, decoder.to_dict()) == length
        assert copy[:length] == buf[:length]


def _sbe_can_encode(message: MessageDef) -> bool:
    """sbe 0.4.3 cannot encode var data or groups, and ignores arrays and explicit offsets."""
    if message.groups or message.var_data or any(f.is_array for f in message.fields):
        return False
    return all(f.offset == sum(g.size for g in message.fields[:i]) for i, f in enumerate(message.fields))


ORACLE_CASES = [(schema, message) for schema, message in CASES if _sbe_can_encode(message)]


@pytest.mark.parametrize(("schema", "message"), ORACLE_CASES, ids=[f"{s.module}.{m.name}" for s, m in ORACLE_CASES])
def test_block_layout_matches_the_sbe_package(schema: SchemaDef, message: MessageDef) -> None:
    """sbe 0.4.3 encodes fixed-size messages by itself: an independent check of offsets and types."""
    parsed, _ = generate.parse_with_sbe((generate.SCHEMA_DIR / schema.filename).read_bytes())
    values: dict[str, Any] = {}
    sbe_values: dict[str, Any] = {}
    for i, f in enumerate(message.fields):
        if f.enum:
            name, value = f.enum.values[i % len(f.enum.values)]
            values[f.py], sbe_values[f.name] = value, name
        else:
            value = (i + 1) * 0x0102030405 % (f.primitive.hi + 1)
            values[f.py], sbe_values[f.name] = value, value
    reference = parsed.encode(parsed.messages[message.id], sbe_values)[8:]
    buf = bytearray(message.block_length)
    encoder = module_of(schema).ENCODERS[message.id]
    method = encoder.encode if schema.headerless else encoder.encode_headerless
    assert method(buf, 0, **values) == message.block_length
    assert bytes(buf[: len(reference)]) == reference
    assert not any(buf[len(reference) :]), "bytes after the last field must be zero padding"


def test_encode_rejects_bad_values_naming_the_field() -> None:
    from fulmar.codecs.generated import cluster, driver

    buf = bytearray(64)
    with pytest.raises(CodecError, match=r"cluster\.AppendPosition\(54\)\.flags"):
        cluster.AppendPositionEncoder.encode(
            buf, 0, leadership_term_id=1, log_position=2, follower_member_id=3, flags=256
        )
    with pytest.raises(CodecError, match=r"AppendPosition\(54\): buffer of 20 bytes too small"):
        cluster.AppendPositionEncoder.encode(
            bytearray(20), 0, leadership_term_id=1, log_position=2, follower_member_id=3, flags=1
        )
    with pytest.raises(CodecError, match=r"negative offset"):
        cluster.AppendPositionEncoder.encode(
            buf, -1, leadership_term_id=1, log_position=2, follower_member_id=3, flags=1
        )
    with pytest.raises(CodecError, match=r"SessionEvent\(2\)\.detail: text is not US-ASCII"):
        cluster.SessionEventEncoder.encode(
            buf, 0, cluster_session_id=1, correlation_id=2, leadership_term_id=3, leader_member_id=0, code=0, detail="é"
        )
    with pytest.raises(CodecError, match=r"AddPublication\(1\)\.channel: buffer of 64 bytes too small"):
        driver.AddPublicationEncoder.encode(buf, 0, client_id=1, correlation_id=2, stream_id=3, channel="x" * 100)
    with pytest.raises(CodecError, match=r"activeMembers: group entry lacks 'member_id'"):
        cluster.ClusterMembersExtendedResponseEncoder.encode(
            bytearray(256),
            0,
            correlation_id=1,
            current_time_ns=2,
            leader_member_id=0,
            member_id=0,
            active_members=[dict(leadership_term_id=1, log_position=2, time_of_last_append_ns=3)],
        )
    with pytest.raises(CodecError, match=r"unknown group entry member"):
        cluster.BackupResponseEncoder.encode(
            bytearray(256),
            0,
            correlation_id=1,
            log_recording_id=2,
            log_leadership_term_id=3,
            log_term_base_log_position=4,
            last_leadership_term_id=5,
            last_term_base_log_position=6,
            commit_position_counter_id=7,
            leader_member_id=8,
            member_id=9,
            snapshots=[
                dict(
                    recording_id=1,
                    leadership_term_id=2,
                    term_base_log_position=3,
                    log_position=4,
                    timestamp=5,
                    service_id=6,
                    typo=7,
                )
            ],
        )
    # nothing may grow a bytearray past its size
    small = bytearray(30)
    with pytest.raises(CodecError):
        cluster.SessionEventEncoder.encode(
            small,
            0,
            cluster_session_id=1,
            correlation_id=2,
            leadership_term_id=3,
            leader_member_id=0,
            code=0,
            detail="abc",
        )
    assert len(small) == 30
