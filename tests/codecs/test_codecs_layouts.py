"""Byte layouts pinned to hand-computed bytes (PROTOCOL.md and Aeron's flyweights / XML)."""

from __future__ import annotations

import struct

import pytest

from fulmar.codecs import CodecError
from fulmar.codecs.generated import archive, cluster, driver
from support import codec_strategies as testing


def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts).replace(" ", ""))


# --------------------------------------------------------------------------- cluster


def test_session_message_header_is_32_bytes_on_the_wire() -> None:
    buf = bytearray(64)
    n = cluster.SessionMessageHeaderEncoder.encode(
        buf, 0, leadership_term_id=7, cluster_session_id=-2, timestamp=0x0102030405060708
    )
    assert n == 32  # AeronCluster.SESSION_HEADER_LENGTH
    assert bytes(buf[:n]) == h(
        "1800 0100 6f00 0c00",  # blockLength 24, templateId 1, schemaId 111, version 12
        "0700000000000000",  # leadershipTermId @0
        "feffffffffffffff",  # clusterSessionId @8
        "0807060504030201",  # timestamp @16
    )
    d = cluster.SessionMessageHeaderDecoder().wrap_and_apply_header(buf, 0, n)
    assert (d.leadership_term_id, d.cluster_session_id, d.timestamp) == (7, -2, 0x0102030405060708)
    assert d.sbe_encoded_length == 24


def test_append_position_block_is_21_bytes() -> None:
    buf = bytearray(64)
    n = cluster.AppendPositionEncoder.encode(
        buf, 0, leadership_term_id=5, log_position=0x1000, follower_member_id=2, flags=1
    )
    assert n == 29
    assert bytes(buf[:n]) == h(
        "1500 3600 6f00 0c00",  # blockLength 21, templateId 54
        "0500000000000000",  # leadershipTermId @0
        "0010000000000000",  # logPosition @8
        "02000000",  # followerMemberId @16
        "01",  # flags (uint8) @20
    )


def test_commit_position_and_new_leadership_term() -> None:
    buf = bytearray(128)
    n = cluster.CommitPositionEncoder.encode(buf, 0, leadership_term_id=1, log_position=2, leader_member_id=3)
    assert bytes(buf[:n]) == h("1400 3700 6f00 0c00", "0100000000000000", "0200000000000000", "03000000")
    fields = dict(
        log_leadership_term_id=1,
        next_leadership_term_id=2,
        next_term_base_log_position=3,
        next_log_position=4,
        leadership_term_id=5,
        term_base_log_position=6,
        log_position=7,
        leader_recording_id=8,
        timestamp=9,
        leader_member_id=10,
        log_session_id=11,
        app_version=12,
        is_startup=cluster.BooleanType.TRUE,
    )
    n = cluster.NewLeadershipTermEncoder.encode(buf, 0, **fields)
    assert n == 8 + 88
    body = bytes(buf[8:n])
    assert struct.unpack("<9q4i", body) == tuple(range(1, 14)[:9]) + (10, 11, 12, 1)


def test_snapshot_marker_block_is_40_bytes() -> None:
    buf = bytearray(64)
    n = cluster.SnapshotMarkerEncoder.encode_headerless(
        buf,
        0,
        type_id=2,
        log_position=3,
        leadership_term_id=4,
        index=0,
        mark=cluster.SnapshotMark.END,
        time_unit=cluster.ClusterTimeUnit.NANOS,
        app_version=0x010203,
    )
    assert n == 40
    assert bytes(buf[:n]) == h(
        "0200000000000000 0300000000000000 0400000000000000",
        "00000000",  # index @24
        "02000000",  # mark END @28
        "02000000",  # timeUnit NANOS @32
        "03020100",  # appVersion @36
    )


# Root block lengths from PROTOCOL.md section 1 (70-74 computed the same way from the XML).
CLUSTER_BLOCK_LENGTHS = {
    1: 24, 2: 36, 3: 16, 4: 16, 5: 16, 6: 20, 7: 16, 8: 16,
    20: 24, 21: 36, 22: 28, 23: 32, 24: 48, 25: 40, 26: 28, 27: 24,
    30: 8, 31: 16, 32: 8, 33: 36, 34: 12, 35: 8,
    40: 36, 41: 12, 42: 8, 43: 24, 108: 8,
    50: 32, 51: 32, 52: 36, 53: 88, 54: 21, 55: 20, 56: 20, 57: 12,
    70: 8, 71: 12, 72: 12, 73: 8, 74: 12, 75: 16, 76: 20, 77: 16, 78: 60, 79: 12, 80: 8, 81: 16,
    100: 40, 102: 12, 103: 40, 104: 16, 105: 28, 106: 8, 107: 24,
}  # fmt: skip

# Field offsets listed in PROTOCOL.md section 1.
CLUSTER_OFFSETS = {
    "SessionEvent": dict(clusterSessionId=0, correlationId=8, leadershipTermId=16, leaderMemberId=24, code=28, version=32),
    "SessionConnectRequest": dict(correlationId=0, responseStreamId=8, version=12),
    "NewLeaderEvent": dict(leadershipTermId=0, clusterSessionId=8, leaderMemberId=16),
    "TimerEvent": dict(leadershipTermId=0, correlationId=8, timestamp=16),
    "SessionOpenEvent": dict(leadershipTermId=0, correlationId=8, clusterSessionId=16, timestamp=24, responseStreamId=32),
    "SessionCloseEvent": dict(closeReason=24),
    "ClusterActionRequest": dict(leadershipTermId=0, logPosition=8, timestamp=16, action=24, flags=28),
    "NewLeadershipTermEvent": dict(
        leadershipTermId=0, logPosition=8, timestamp=16, termBaseLogPosition=24,
        leaderMemberId=32, logSessionId=36, timeUnit=40, appVersion=44,
    ),
    "CanvassPosition": dict(logLeadershipTermId=0, logPosition=8, leadershipTermId=16, followerMemberId=24, protocolVersion=28),
    "RequestVote": dict(logLeadershipTermId=0, logPosition=8, candidateTermId=16, candidateMemberId=24, protocolVersion=28),
    "Vote": dict(candidateTermId=0, logLeadershipTermId=8, logPosition=16, candidateMemberId=24, followerMemberId=28, vote=32),
    "NewLeadershipTerm": dict(
        logLeadershipTermId=0, nextLeadershipTermId=8, nextTermBaseLogPosition=16, nextLogPosition=24,
        leadershipTermId=32, termBaseLogPosition=40, logPosition=48, leaderRecordingId=56, timestamp=64,
        leaderMemberId=72, logSessionId=76, appVersion=80, isStartup=84,
    ),
    "AppendPosition": dict(leadershipTermId=0, logPosition=8, followerMemberId=16, flags=20),
    "CommitPosition": dict(leadershipTermId=0, logPosition=8, leaderMemberId=16),
    "StopCatchup": dict(leadershipTermId=0, followerMemberId=8),
    "SnapshotMarker": dict(typeId=0, logPosition=8, leadershipTermId=16, index=24, mark=28, timeUnit=32, appVersion=36),
}  # fmt: skip


def test_cluster_block_lengths_and_offsets_match_protocol_md() -> None:
    assert {tid: cls.BLOCK_LENGTH for tid, cls in cluster.DECODERS.items()} == CLUSTER_BLOCK_LENGTHS
    model = next(s for s in testing.schemas() if s.module == "cluster")
    for name, offsets in CLUSTER_OFFSETS.items():
        fields = {f.name: f.offset for f in model.message(name).fields}
        assert {k: fields[k] for k in offsets} == offsets, name


def test_cluster_enums() -> None:
    assert [(e.name, e.value) for e in cluster.ClusterAction if e.name != "NULL_VAL"] == [
        ("SUSPEND", 0), ("RESUME", 1), ("SNAPSHOT", 2), ("APPOINT_LEADER", 3),
    ]  # fmt: skip
    assert cluster.BooleanType.NULL_VAL == -(2**31)
    assert cluster.EventCode(3) is cluster.EventCode.AUTHENTICATION_REJECTED


# --------------------------------------------------------------------------- versions


def test_older_acting_version_reads_null_for_newer_fields() -> None:
    # A SessionEvent from a version-5 peer: 32-byte block without `version`, then the detail.
    body = struct.pack("<qqqii", 1, 2, 3, 4, 2) + struct.pack("<I", 3) + b"x,y"
    msg = struct.pack("<HHHH", 32, 2, 111, 5) + body
    d = cluster.decode(msg)
    assert isinstance(d, cluster.SessionEventDecoder)
    assert (d.code, d.version, d.detail) == (cluster.EventCode.REDIRECT, 0, "x,y")
    assert d.sbe_acting_version == 5 and d.sbe_encoded_length == len(body)

    # AppendPosition from a version-7 peer (block 20, no flags): flags reads as the uint8 null value.
    msg = struct.pack("<HHHH", 20, 54, 111, 7) + struct.pack("<qqi", 1, 2, 3)
    a = cluster.AppendPositionDecoder().wrap_and_apply_header(msg, 0)
    assert (a.leadership_term_id, a.log_position, a.follower_member_id, a.flags) == (1, 2, 3, 255)

    # ...but a block too short for the fields its version promises is an error.
    msg = struct.pack("<HHHH", 20, 54, 111, 8) + struct.pack("<qqi", 1, 2, 3)
    with pytest.raises(CodecError, match=r"AppendPosition\(54\)\.flags: block length 20 too short for version 8"):
        cluster.decode(msg)

    # ClusterActionRequest before version 11 has no flags.
    msg = struct.pack("<HHHH", 28, 23, 111, 10) + struct.pack("<qqqi", 1, 2, 3, 2)
    c = cluster.decode(msg)
    assert isinstance(c, cluster.ClusterActionRequestDecoder)
    assert c.action is cluster.ClusterAction.SNAPSHOT and c.flags == -(2**31)


def test_unknown_trailing_block_fields_are_skipped() -> None:
    # A CatchupPosition from a newer peer whose block grew by 8 bytes; var data follows the longer block.
    body = struct.pack("<qqi", 4, 5, 6) + b"\xaa" * 8 + struct.pack("<I", 9) + b"host:1234"
    msg = struct.pack("<HHHH", 28, 56, 111, 13) + body
    d = cluster.decode(msg)
    assert isinstance(d, cluster.CatchupPositionDecoder)
    assert (d.leadership_term_id, d.log_position, d.follower_member_id, d.catchup_endpoint) == (4, 5, 6, "host:1234")
    assert d.sbe_acting_block_length == 28 and d.sbe_encoded_length == len(body)


def test_var_data_since_version_is_absent_in_older_messages() -> None:
    # archive ReplicateRequest2 at version 7: no replicationSessionId, encodedCredentials or srcResponseChannel.
    block = struct.pack("<7qii", 1, 2, 3, 4, 5, 6, 7, 8, 4096)
    assert len(block) == 64
    var = b"".join(struct.pack("<I", len(s)) + s for s in (b"aeron:udp?endpoint=a:1", b"", b"aeron:udp"))
    msg = struct.pack("<HHHH", 64, 66, 101, 7) + block + var
    d = archive.decode(msg)
    assert isinstance(d, archive.ReplicateRequest2Decoder)
    assert d.file_io_max_length == 4096 and d.replication_session_id == -(2**31)
    assert (d.src_control_channel, d.live_destination, d.replication_channel) == (
        "aeron:udp?endpoint=a:1",
        "",
        "aeron:udp",
    )
    assert (d.encoded_credentials, d.src_response_channel) == (b"", "")
    assert d.sbe_encoded_length == 64 + len(var)


def test_unknown_enum_value_decodes() -> None:
    buf = bytearray(64)
    n = cluster.SessionEventEncoder.encode(
        buf, 0, cluster_session_id=1, correlation_id=2, leadership_term_id=3, leader_member_id=4, code=99
    )
    d = cluster.SessionEventDecoder().wrap_and_apply_header(buf, 0, n)
    assert d.code_raw == 99 and d.code == 99 and d.code.name == "UNKNOWN_99"
    assert isinstance(d.code, cluster.EventCode)


# --------------------------------------------------------------------------- archive


def test_catalog_entries_are_headerless_32_byte_blocks() -> None:
    buf = bytearray(64)
    n = archive.CatalogHeaderEncoder.encode_headerless(
        buf, 0, version=0x030000, length=32, next_recording_id=5, alignment=1024, reserved=0
    )
    assert n == 32
    assert bytes(buf[:n]) == h("00000300 20000000 0500000000000000 00040000", "00" * 11, "00")
    n = archive.RecordingDescriptorHeaderEncoder.encode_headerless(
        buf, 0, length=200, state=archive.RecordingState.DELETED, checksum=-1, reserved=7
    )
    assert bytes(buf[:n]) == h("c8000000 02000000 ffffffff", "00" * 19, "07")
    d = archive.RecordingDescriptorHeaderDecoder().wrap_headerless(buf, 0, 32)
    assert (d.length, d.state, d.checksum, d.reserved) == (200, archive.RecordingState.DELETED, -1, 7)


def test_recording_descriptor_layout() -> None:
    buf = bytearray(256)
    n = archive.RecordingDescriptorEncoder.encode_headerless(
        buf, 0, control_session_id=1, correlation_id=2, recording_id=3, start_timestamp=4, stop_timestamp=5,
        start_position=6, stop_position=7, initial_term_id=8, segment_file_length=9, term_buffer_length=10,
        mtu_length=11, session_id=12, stream_id=13,
        stripped_channel="aeron:ipc", original_channel="aeron:ipc?alias=x", source_identity="aeron:ipc",
    )  # fmt: skip
    assert struct.unpack_from("<7q6i", buf, 0) == tuple(range(1, 14))
    assert struct.unpack_from("<I9s", buf, 80) == (9, b"aeron:ipc")
    assert n == 80 + 4 + 9 + 4 + 17 + 4 + 9


# --------------------------------------------------------------------------- driver


def test_add_publication_matches_publication_message_flyweight() -> None:
    buf = bytearray(64)
    n = driver.AddPublicationEncoder.encode(
        buf, 0, client_id=0x11, correlation_id=0x22, stream_id=1001, channel="aeron:ipc"
    )
    assert (
        bytes(buf[:n])
        == h(
            "1100000000000000",  # clientId @0
            "2200000000000000",  # correlationId @8
            "e9030000",  # streamId @16
            "09000000",  # channel length @20
        )
        + b"aeron:ipc"
    )  # channel @24
    assert driver.TemplateId.ADD_PUBLICATION == 0x01 and driver.TemplateId.ADD_EXCLUSIVE_PUBLICATION == 0x03
    d = driver.decode(driver.TemplateId.ADD_PUBLICATION, buf, 0, n)
    assert isinstance(d, driver.AddPublicationDecoder) and d.channel == "aeron:ipc"


def test_add_subscription_matches_subscription_message_flyweight() -> None:
    buf = bytearray(64)
    n = driver.AddSubscriptionEncoder.encode(
        buf, 0, client_id=1, correlation_id=2, registration_correlation_id=-1, stream_id=10, channel="aeron:udp"
    )
    assert bytes(buf[:n]) == h("0100000000000000 0200000000000000 ffffffffffffffff 0a000000 09000000") + b"aeron:udp"


def test_image_buffers_ready_aligns_source_identity() -> None:
    buf = bytearray(128)
    n = driver.OnAvailableImageEncoder.encode(
        buf, 0, correlation_id=1, session_id=-5, stream_id=10, subscription_registration_id=3,
        subscriber_position_id=7, log_file_name="a.log", source_identity="127.0.0.1:40123",
    )  # fmt: skip
    assert (
        bytes(buf[:n])
        == h(
            "0100000000000000",  # correlationId @0
            "fbffffff",  # sessionId @8
            "0a000000",  # streamId @12
            "0300000000000000",  # subscriptionRegistrationId @16
            "07000000",  # subscriberPositionId @24
            "05000000",  # logFileName length @28
            "612e6c6f67 000000",  # "a.log" @32, padded to 4
            "0f000000",  # sourceIdentity length @40 = 32 + align(5, 4)
        )
        + b"127.0.0.1:40123"
    )
    assert n == 59
    assert driver.TemplateId.ON_AVAILABLE_IMAGE == 0x0F02
    d = driver.decode(0x0F02, buf, 0, n)
    assert isinstance(d, driver.OnAvailableImageDecoder)
    assert (d.log_file_name, d.source_identity, d.sbe_encoded_length) == ("a.log", "127.0.0.1:40123", 59)
    # already aligned: no padding
    n = driver.OnAvailableImageEncoder.encode(
        buf, 0, correlation_id=1, session_id=2, stream_id=3, subscription_registration_id=4,
        subscriber_position_id=5, log_file_name="abcd", source_identity="",
    )  # fmt: skip
    assert struct.unpack_from("<i4si", buf, 28) == (4, b"abcd", 0) and n == 40


def test_counter_message_aligns_the_label() -> None:
    buf = bytearray(64)
    n = driver.AddCounterEncoder.encode(
        buf, 0, client_id=1, correlation_id=2, type_id=1001, key=b"\x01\x02\x03", label="lbl"
    )
    assert (
        bytes(buf[:n])
        == h(
            "0100000000000000 0200000000000000",
            "e9030000",  # typeId @16
            "03000000 010203 00",  # key length @20, key @24, padded to 4
            "03000000",  # label length @28 = 24 + align(3, 4)
        )
        + b"lbl"
    )
    # The Java client claims computeLength() = 4 bytes more than this; trailing bytes are ignored.
    d = driver.decode(driver.TemplateId.ADD_COUNTER, bytes(buf[:n]) + bytes(4), 0, n + 4)
    assert isinstance(d, driver.AddCounterDecoder)
    assert (d.type_id, d.key, d.label) == (1001, b"\x01\x02\x03", "lbl")


def test_publication_buffers_ready_and_error_responses() -> None:
    buf = bytearray(128)
    n = driver.OnPublicationReadyEncoder.encode(
        buf, 0, correlation_id=1, registration_id=2, session_id=3, stream_id=4,
        publication_limit_counter_id=5, channel_status_indicator_id=6, log_file_name="7.logbuffer",
    )  # fmt: skip
    assert struct.unpack_from("<qqiiiii", buf, 0) == (1, 2, 3, 4, 5, 6, 11) and n == 32 + 4 + 11
    n = driver.OnErrorEncoder.encode(
        buf, 0, offending_command_correlation_id=9, error_code=driver.ErrorCode.INVALID_CHANNEL, error_message="bad"
    )
    assert bytes(buf[:n]) == h("0900000000000000 01000000 03000000") + b"bad"
    n = driver.OnPublicationErrorEncoder.encode(
        buf, 0, registration_id=1, destination_registration_id=-1, session_id=2, stream_id=3, receiver_id=4,
        group_tag=5, address_type=1, udp_port=40456, address=bytes([127, 0, 0, 1]) + bytes(12),
        error_code=driver.ErrorCode.GENERIC_ERROR, error_message="x",
    )  # fmt: skip
    assert struct.unpack_from("<qqiiqqhH16sii", buf, 0) == (
        1, -1, 2, 3, 4, 5, 1, 40456, bytes([127, 0, 0, 1]) + bytes(12), 11, 1,
    )  # fmt: skip
    assert n == 64 + 4 + 1


def test_fixed_size_driver_messages() -> None:
    expected = {
        driver.TemplateId.REMOVE_PUBLICATION: 24, driver.TemplateId.REMOVE_SUBSCRIPTION: 24,
        driver.TemplateId.REMOVE_COUNTER: 24, driver.TemplateId.CLIENT_KEEPALIVE: 16, driver.TemplateId.CLIENT_CLOSE: 16,
        driver.TemplateId.REMOVE_DESTINATION_BY_ID: 32, driver.TemplateId.ON_OPERATION_SUCCESS: 8,
        driver.TemplateId.ON_SUBSCRIPTION_READY: 12, driver.TemplateId.ON_COUNTER_READY: 12,
        driver.TemplateId.ON_UNAVAILABLE_COUNTER: 12, driver.TemplateId.ON_CLIENT_TIMEOUT: 8,
        driver.TemplateId.ON_STATIC_COUNTER: 12,
    }  # fmt: skip
    for tid, length in expected.items():
        assert driver.DECODERS[tid].BLOCK_LENGTH == length, tid.name
    # var-length ones: block before the first length prefix
    assert driver.DECODERS[driver.TemplateId.ADD_STATIC_COUNTER].BLOCK_LENGTH == 28
    assert driver.DECODERS[driver.TemplateId.REJECT_IMAGE].BLOCK_LENGTH == 32
    assert driver.DECODERS[driver.TemplateId.TERMINATE_DRIVER].BLOCK_LENGTH == 16
    assert driver.DECODERS[driver.TemplateId.ON_UNAVAILABLE_IMAGE].BLOCK_LENGTH == 20
    # a newer client's 32-byte REMOVE_PUBLICATION (with trailing flags) still decodes
    record = struct.pack("<qqqq", 1, 2, 3, 1)
    d = driver.decode(driver.TemplateId.REMOVE_PUBLICATION, record, 0, len(record))
    assert isinstance(d, driver.RemovePublicationDecoder) and d.registration_id == 3


def test_driver_negative_length_prefix_is_an_error() -> None:
    record = struct.pack("<qqii", 1, 2, 3, -1)
    with pytest.raises(CodecError, match=r"driver\.AddPublication\(1\)\.channel: negative length -1"):
        driver.decode(1, record, 0, len(record))
    # the length prefix may not run past the record even when the buffer continues
    record = struct.pack("<qqii", 1, 2, 3, 5) + b"abcde"
    with pytest.raises(CodecError, match=r"length 5 exceeds the 0 bytes left"):
        driver.decode(1, record, 0, 24)
