"""Configuration of a consensus module process (Aeron's
``ConsensusModule.Context``, trimmed to what fulmar's module uses)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fulmar.archive import protocol as archive_protocol
from fulmar.channel_uri import DATAGRAM_MAC_PARAM, ChannelUri
from fulmar.consensus import protocol
from fulmar.consensus.authenticator import AllowAllAuthenticator, Authenticator
from fulmar.consensus.member_auth import derive_key
from fulmar.security import secret_of

# cluster-node consensus --native-append-position/--agent-append-position by
# the environment, which reaches the modules a node's supervisor starts.
NATIVE_APPEND_POSITION_ENV = "FULMAR_NATIVE_APPEND_POSITION"
# And --native-commit/--agent-commit, and --native-ingress/--agent-ingress.
NATIVE_COMMIT_ENV = "FULMAR_NATIVE_COMMIT"
NATIVE_INGRESS_ENV = "FULMAR_NATIVE_INGRESS"
NATIVE_FOLLOWER_COMMIT_ENV = "FULMAR_NATIVE_FOLLOWER_COMMIT"


@dataclass
class ConsensusModuleContext:
    cluster_dir: Path = Path("cluster")
    driver_dir: Path | None = None  # default: the driver's default directory
    member_id: int = 0
    cluster_id: int = 0
    # Clients' requests arrive here; the log is what the services apply.  On
    # one node the log is IPC: the archive and the service share the driver.
    ingress_channel: str = protocol.INGRESS_CHANNEL
    ingress_stream_id: int = protocol.INGRESS_STREAM_ID
    log_channel: str = "aeron:ipc?term-length=16m"
    log_stream_id: int = protocol.LOG_STREAM_ID
    control_channel: str = protocol.CONTROL_CHANNEL
    service_stream_id: int = protocol.SERVICE_STREAM_ID
    consensus_module_stream_id: int = protocol.CONSENSUS_MODULE_STREAM_ID
    replay_channel: str = protocol.REPLAY_CHANNEL
    replay_stream_id: int = protocol.REPLAY_STREAM_ID
    snapshot_channel: str = protocol.SNAPSHOT_CHANNEL
    snapshot_stream_id: int = protocol.SNAPSHOT_STREAM_ID
    archive_control_channel: str = archive_protocol.LOCAL_CONTROL_CHANNEL
    archive_control_stream_id: int = archive_protocol.CONTROL_STREAM_ID
    archive_response_stream_id: int = 120  # the module's own response stream from its archive
    # What the module presents to archives (Aeron's archive context's
    # credentials): its own, and the other members' it replicates the log
    # from or asks where their logs start (their UDP control channels
    # authenticate when the node has a secret).  Empty: the secret of the
    # module's own CredentialsAuthenticator, if it has one (one secret per
    # node); see ``archive_client_credentials``.
    archive_credentials: bytes = b""
    service_count: int = 1
    max_concurrent_sessions: int = 1000
    session_timeout_ns: int = protocol.SESSION_TIMEOUT_NS
    leader_heartbeat_interval_ns: int = protocol.LEADER_HEARTBEAT_INTERVAL_NS
    # How long to wait for the services to acknowledge a step (start-up, a
    # log to join, a snapshot) before the module gives up with an error.
    service_ack_timeout_ns: int = 30_000_000_000
    slow_tick_interval_ns: int = 10_000_000
    # A service whose mark file shows no sign of life for this long is taken
    # for dead: the module stops, so that its node fails over instead of
    # leading without answering (Aeron's service heartbeat timeout, 10 s).
    service_heartbeat_timeout_ns: int = 10_000_000_000
    cycle_threshold_ns: int = 1_000_000_000
    # Longest idle sleep of a steady module: the data doorbell wakes it for
    # ingress, consensus messages and recording progress, and its own duties
    # (heartbeats, the leader's timeout, cluster timers) shorten it; while
    # anything no ring announces is under way (an election, a session being
    # opened) it keeps the slow tick's pace (ConsensusModuleAgent.idle_wait_ns).
    # Its other periodic work (session timeouts, the mark file, the driver's
    # keepalive, a CLI's control toggle) is in seconds, or waits this long.
    idle_max_wait_ns: int = 100_000_000
    # A steady follower reports its archive's recording to the leader from a
    # native thread that the recording wakes, not from the module's duty
    # cycle (consensus/append_position_sender.py).  Off: the module reports.
    native_append_position: bool = True
    # A steady leader reads its followers' AppendPositions, moves commit-pos
    # and sends CommitPosition from a native thread that their arrival wakes,
    # not from the module's duty cycle (consensus/leader_commit.py).  Off:
    # the module commits.
    native_commit: bool = True
    # A steady follower reads the leader's CommitPositions and the log's
    # client messages, and moves commit-pos, from the same thread, which their
    # arrival and the archive's recording wake, not from the module's duty
    # cycle.  Off: the module applies the log.
    native_follower_commit: bool = True
    # A steady leader's clients' session messages are appended to the log by
    # a native thread that their arrival wakes, while the module sleeps
    # (consensus/leader_ingress.py).  Off: the module appends them.
    native_ingress: bool = True
    app_version: int = 0
    authenticator: Authenticator = field(default_factory=AllowAllAuthenticator)
    mark_file_liveness_timeout_ms: int = 10_000
    # Take another node's snapshots into the recording log when it says it
    # has some (a StandbySnapshot on the consensus stream); off by default,
    # as in Aeron (its CLUSTER_ACCEPT_STANDBY_SNAPSHOTS).
    accept_standby_snapshots: bool = False
    # After each snapshot, keep the newest N snapshot sets and purge the older
    # ones and the log before them (fulmar.consensus.log_retention); 0 keeps
    # everything, as Aeron does.
    log_retention_snapshots: int = 0
    # -- a cluster of several members (seed 001) ----------------------------------
    # Aeron's cluster members string (``id,ingress,consensus,log,catchup,archive|...``);
    # empty: this member alone (the single-node path).  With members, the
    # ingress subscription binds this member's ingress endpoint, the log is
    # ``log_channel``'s parameters on UDP (a multi-destination publication from
    # the leader to each follower's log endpoint), and the member talks to the
    # others on the consensus stream at their consensus endpoints.
    cluster_members: str = ""
    appointed_leader_id: int = protocol.NULL_VALUE
    consensus_channel: str = "aeron:udp?term-length=64k"
    consensus_stream_id: int = protocol.CONSENSUS_STREAM_ID
    # With a secret (the authenticator's), every message a member sends on the
    # consensus stream carries proof that a member sent it, and a member drops
    # a member message without it (fulmar.consensus.member_auth).  Aeron's
    # members send no such proof: a cluster with Aeron members turns this off,
    # and its members then take consensus messages from the members' hosts
    # only, as a cluster without a secret does.  The native consensus threads
    # (native_append_position, native_commit, native_follower_commit) sign
    # and check as the agent does, through the same native context (one send
    # counter per process), so they stay on with it.
    authenticate_members: bool = True
    # Without member authentication, take member messages only from images
    # whose source address is one of the members' hosts (resolved at start).
    # Off: from anyone (what fulmar did before; for hosts that send from an
    # address their members string does not name).
    check_consensus_sources: bool = True
    # Where each election's randomness (its nomination delay) comes from: a
    # fresh ``random.Random()`` in production; the simulator gives seeded ones.
    election_random: Callable[[], random.Random] = random.Random
    election_timeout_ns: int = 1_000_000_000
    election_status_interval_ns: int = 100_000_000
    startup_canvass_timeout_ns: int = 60_000_000_000
    leader_heartbeat_timeout_ns: int = protocol.LEADER_HEARTBEAT_TIMEOUT_NS
    # How long a leader stopping the cluster waits for the followers' TerminationAck.
    termination_timeout_ns: int = 10_000_000_000
    # The leader's archive (a follower replicates and catches up from it):
    # the control channel's endpoint comes from the member's archive endpoint.
    archive_remote_control_channel: str = "aeron:udp"
    # Where this member's archive receives a replication's replay (port 0: any).
    replication_channel: str = "aeron:udp?endpoint=127.0.0.1:0"

    # The members' own secret (the same on every member): what the member key
    # derives from.  Empty: the authenticator's secret, which the clients
    # hold too (a client could then sign as a member).
    member_secret: bytes = b""

    def member_secret_in_use(self) -> bytes:
        """What the member key derives from: ``member_secret``, else the
        authenticator's secret (b"" without either)."""
        return self.member_secret or secret_of(self.authenticator)

    def member_key(self) -> bytes | None:
        """The key the members sign their consensus messages with, or None
        when they do not (no secret, ``authenticate_members`` off, or a
        cluster of one)."""
        secret = self.member_secret_in_use()
        if not secret or not self.authenticate_members or not self.cluster_members:
            return None
        return derive_key(secret)

    def between_members(self, channel: str) -> str:
        """A UDP channel that carries the log between members (the log, a
        catchup replay, a replication's replay), with the driver's datagram
        MACs (``datagram-mac=true``) when the members authenticate: a stranger
        who can reach a member's log endpoint cannot inject frames into it.
        The drivers MAC with the members' secret (``cluster-node start`` hands
        it to them); other channels are as given."""
        if self.member_key() is None:
            return channel
        uri = ChannelUri.parse(channel)
        if uri.media != "udp":
            return channel
        return str(uri.with_param(DATAGRAM_MAC_PARAM, "true"))

    def archive_client_credentials(self) -> bytes:
        """What the module presents to archives: ``archive_credentials``, else
        its authenticator's secret (b"" without one)."""
        return self.archive_credentials or secret_of(self.authenticator)
