"""Facts of the cluster protocol shared by the consensus module, the
clustered service container and cluster clients: stream ids, default
channels, the protocol version, counter type ids and null values.

The messages are the generated SBE codecs of schema 111
(``fulmar.codecs.generated.cluster``).  Stream ids and defaults follow the
seeds and Aeron's ``ConsensusModule.Configuration`` /
``AeronCluster.Configuration``.
"""

from __future__ import annotations

import struct
from typing import Any

from fulmar.codecs.generated import cluster as codecs
from fulmar.semantic_version import compose_version

NULL_VALUE = -1
_INT32_NULL = -(2**31)  # SBE's null value of an optional int32

# A client message's frame on ingress, in the log and on egress: the SBE
# message header (block length, template id, schema id, version) and the
# SessionMessageHeader body (leadership term id, cluster session id,
# timestamp), 32 bytes before the payload.  The per-message hot paths pack
# and unpack it whole instead of going through the generic codec.
SESSION_MESSAGE_FRAME = struct.Struct("<HHHHqqq")
SESSION_MESSAGE_TEMPLATE_ID = codecs.SessionMessageHeaderEncoder.TEMPLATE_ID
SESSION_MESSAGE_BLOCK_LENGTH = codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH
CLUSTER_SCHEMA_ID = codecs.SCHEMA_ID
CLUSTER_SCHEMA_VERSION = codecs.SCHEMA_VERSION


def field_offset(layout: Any, name: str) -> int:
    """A field's offset from a message's first byte (its SBE header first),
    from the generated codec's layout: what the native threads are armed
    with, so that the C code holds no schema facts."""
    return codecs.HEADER_LENGTH + next(field.offset for field in layout if field.name == name)


def session_message_frame(leadership_term_id: int, cluster_session_id: int, timestamp: int) -> bytes:
    """The 32 bytes that precede a client message's payload."""
    return SESSION_MESSAGE_FRAME.pack(
        SESSION_MESSAGE_BLOCK_LENGTH,
        SESSION_MESSAGE_TEMPLATE_ID,
        CLUSTER_SCHEMA_ID,
        CLUSTER_SCHEMA_VERSION,
        leadership_term_id,
        cluster_session_id,
        timestamp,
    )


NULL_POSITION = -1
NULL_SESSION_ID = -1
NULL_MEMBER_ID = -1

# Agrona SemanticVersion of the client protocol a client announces in
# SessionConnectRequest; only the major version has to match.
PROTOCOL_MAJOR_VERSION = 0
PROTOCOL_MINOR_VERSION = 3
PROTOCOL_PATCH_VERSION = 0


PROTOCOL_SEMANTIC_VERSION = compose_version(PROTOCOL_MAJOR_VERSION, PROTOCOL_MINOR_VERSION, PROTOCOL_PATCH_VERSION)

# Streams of a node (seed 004).
LOG_STREAM_ID = 100
INGRESS_STREAM_ID = 101
EGRESS_STREAM_ID = 102
REPLAY_STREAM_ID = 103
SERVICE_STREAM_ID = 104  # consensus module -> services
CONSENSUS_MODULE_STREAM_ID = 105  # services -> consensus module
SNAPSHOT_STREAM_ID = 107
CONSENSUS_STREAM_ID = 108

CONTROL_CHANNEL = "aeron:ipc?term-length=128k"  # service control, both directions
REPLAY_CHANNEL = "aeron:ipc"
SNAPSHOT_CHANNEL = "aeron:ipc?alias=snapshot"
INGRESS_CHANNEL = "aeron:udp?endpoint=localhost:9010"
EGRESS_CHANNEL = "aeron:udp?endpoint=localhost:0"

# Timeouts (ns).
SESSION_TIMEOUT_NS = 10_000_000_000
LEADER_HEARTBEAT_TIMEOUT_NS = 10_000_000_000
LEADER_HEARTBEAT_INTERVAL_NS = 200_000_000
MESSAGE_TIMEOUT_NS = 5_000_000_000

# Counter type ids (Aeron's AeronCounters, cluster range).
CONSENSUS_MODULE_STATE_TYPE_ID = 200
CLUSTER_NODE_ROLE_TYPE_ID = 201
CLUSTER_CONTROL_TOGGLE_TYPE_ID = 202
COMMIT_POSITION_TYPE_ID = 203
RECOVERY_STATE_TYPE_ID = 204
SNAPSHOT_COUNTER_TYPE_ID = 205
ELECTION_STATE_TYPE_ID = 207
CLUSTER_BACKUP_STATE_TYPE_ID = 208
CLUSTERED_SERVICE_ERROR_COUNT_TYPE_ID = 215  # (211 is the cluster backup's error count)
CLUSTER_ERROR_COUNT_TYPE_ID = 212
CLUSTER_MAX_CYCLE_TIME_TYPE_ID = 216
# fulmar's own cluster counters: Aeron defines no type for these, and keeps
# ids below 1000 for its own, so they sit above.
CLUSTER_SESSIONS_TYPE_ID = 1200
CLUSTER_TIMERS_TYPE_ID = 1201
CLUSTER_INVALID_REQUESTS_TYPE_ID = 1202
# Per follower, on the leader: the position the follower last reported it has
# appended (AppendPosition); NULL_POSITION while this member does not lead.
# Keyed by the cluster id and the follower's member id (two int32s).
CLUSTER_MEMBER_APPEND_POSITION_TYPE_ID = 1203
# Consensus-stream messages dropped because no member sent them (a missing
# or wrong member trailer, a replay, a host that is not a member's).
CLUSTER_CONSENSUS_REFUSED_TYPE_ID = 1204
CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID = 217
CLUSTER_NODE_CONTROL_TOGGLE_TYPE_ID = 233
CLUSTER_ELECTION_COUNT_TYPE_ID = 238
CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID = 239
CLUSTER_STANDBY_SNAPSHOT_COUNTER_TYPE_ID = 232

# ClusterActionRequest flags (Aeron's ConsensusModule.CLUSTER_ACTION_FLAGS_*):
# a SNAPSHOT with the standby flag is for standby members only; members and
# their services go on without one.
CLUSTER_ACTION_FLAGS_DEFAULT = 0
CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT = 1


def cluster_action_flags(request: Any) -> int:
    """A decoded ClusterActionRequest's flags; a log written before the field
    existed (schema version < 11) decodes it as its null value: the default."""
    flags: int = request.flags
    return CLUSTER_ACTION_FLAGS_DEFAULT if flags == _INT32_NULL else flags


EventCode = codecs.EventCode
CloseReason = codecs.CloseReason
ClusterAction = codecs.ClusterAction
ClusterTimeUnit = codecs.ClusterTimeUnit
