"""Facts of the archive control protocol shared by the archive and its clients.

The messages themselves are the generated SBE codecs of schema 101
(``fulmar.codecs.generated.archive``); this module holds the values that go
in them: null values, the protocol version a client announces, the error
codes an ERROR response carries in its ``relevantId``, default channels and
stream ids, and the layout of the recording position counter.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from fulmar.codecs.generated import archive as codecs
from fulmar.semantic_version import compose_version

NULL_VALUE = -1
NULL_POSITION = -1  # a position that is not known (an active recording's stop position)
NULL_LENGTH = -1  # replay to the end, or follow a live recording
NULL_TIMESTAMP = -1
NULL_COUNTER_ID = -1

# The protocol version a client sends in ConnectRequest and the archive in its
# connect response (Agrona's SemanticVersion: major << 16 | minor << 8 | patch).
# Only the major version has to match.
PROTOCOL_MAJOR_VERSION = 1
PROTOCOL_MINOR_VERSION = 10
PROTOCOL_PATCH_VERSION = 0


PROTOCOL_SEMANTIC_VERSION = compose_version(PROTOCOL_MAJOR_VERSION, PROTOCOL_MINOR_VERSION, PROTOCOL_PATCH_VERSION)

ControlResponseCode = codecs.ControlResponseCode
RecordingSignal = codecs.RecordingSignal
SourceLocation = codecs.SourceLocation


class ArchiveErrorCode(IntEnum):
    """Aeron's ``ArchiveException`` error codes: an ERROR response's ``relevantId``."""

    GENERIC = 0
    ACTIVE_LISTING = 1
    ACTIVE_RECORDING = 2
    ACTIVE_SUBSCRIPTION = 3
    UNKNOWN_SUBSCRIPTION = 4
    UNKNOWN_RECORDING = 5
    UNKNOWN_REPLAY = 6
    MAX_REPLAYS = 7
    MAX_RECORDINGS = 8
    INVALID_EXTENSION = 9
    AUTHENTICATION_REJECTED = 10
    STORAGE_SPACE = 11
    UNKNOWN_REPLICATION = 12
    UNAUTHORISED_ACTION = 13
    REPLICATION_CONNECTION_FAILURE = 14


# Defaults (Aeron's AeronArchive.Configuration and Archive.Configuration).
CONTROL_STREAM_ID = 10
LOCAL_CONTROL_CHANNEL = "aeron:ipc?term-length=64k"
CONTROL_CHANNEL = "aeron:udp?endpoint=localhost:8010"
CONTROL_RESPONSE_STREAM_ID = 20
CONTROL_RESPONSE_CHANNEL = "aeron:ipc?term-length=64k"
RECORDING_EVENTS_CHANNEL = "aeron:udp?control-mode=dynamic|control=localhost:8030"
RECORDING_EVENTS_STREAM_ID = 30
REPLICATION_CHANNEL = "aeron:udp?endpoint=localhost:0"

# Counter type ids (Aeron's AeronCounters).
RECORDING_POSITION_TYPE_ID = 100
ARCHIVE_ERROR_COUNT_TYPE_ID = 101
ARCHIVE_CONTROL_SESSIONS_TYPE_ID = 102
# fulmar's own: control sessions the archive refused (rejected by its
# authenticator, or not authenticated within the connect timeout).
ARCHIVE_REFUSED_CONTROL_SESSIONS_TYPE_ID = 1300

# The recording position counter's key: recording id, session id, then the
# image's source identity as an int32 length and ASCII, then the archive id.
_RECORDING_POS_HEAD = struct.Struct("<qi")
MAX_COUNTER_KEY_LENGTH = 112


def archive_id_key(archive_id: int) -> bytes:
    """The key of the archive's own counters (errors, sessions): its archive id."""
    return struct.pack("<q", archive_id)


def recording_position_key(recording_id: int, session_id: int, source_identity: str, archive_id: int) -> bytes:
    room = MAX_COUNTER_KEY_LENGTH - _RECORDING_POS_HEAD.size - 4 - 8
    identity = source_identity.encode("ascii", "replace")[:room]
    return (
        _RECORDING_POS_HEAD.pack(recording_id, session_id)
        + struct.pack("<i", len(identity))
        + identity
        + struct.pack("<q", archive_id)
    )


def recording_position_label(recording_id: int, session_id: int, stream_id: int, channel: str, archive_id: int) -> str:
    return f"rec-pos: {recording_id} {session_id} {stream_id} {channel} - archiveId={archive_id}"


def parse_recording_position_key(key: bytes) -> tuple[int, int, str]:
    """(recording id, session id, source identity) of a recording position counter's key."""
    recording_id, session_id = _RECORDING_POS_HEAD.unpack_from(key, 0)
    (length,) = struct.unpack_from("<i", key, _RECORDING_POS_HEAD.size)
    start = _RECORDING_POS_HEAD.size + 4
    return recording_id, session_id, key[start : start + max(0, length)].decode("ascii", "replace")


def recording_position_ids(key: bytes) -> tuple[int, int, int]:
    """(recording id, session id, archive id) of a recording position counter's
    key; the archive id follows the source identity (NULL_VALUE if the key is too
    short to hold one)."""
    recording_id, session_id = _RECORDING_POS_HEAD.unpack_from(key, 0)
    (length,) = struct.unpack_from("<i", key, _RECORDING_POS_HEAD.size)
    start = _RECORDING_POS_HEAD.size + 4 + max(0, length)
    if start + 8 > min(len(key), MAX_COUNTER_KEY_LENGTH):
        return recording_id, session_id, -1
    (archive_id,) = struct.unpack_from("<q", key, start)
    return recording_id, session_id, archive_id


def replay_session_id(replay_id: int, publication_session_id: int) -> int:
    """Aeron's replay session id: the archive's replay counter in the high 32
    bits, the replay publication's session id in the low 32 (the client
    subscribes with ``session-id`` = the low half)."""
    value = (replay_id << 32) | (publication_session_id & 0xFFFF_FFFF)
    return value - (1 << 64) if value >= 1 << 63 else value


def replay_image_session_id(replay_session_id: int) -> int:
    low = replay_session_id & 0xFFFF_FFFF
    return low - (1 << 32) if low >= 1 << 31 else low
